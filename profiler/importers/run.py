"""``import_traces``: Kineto (+ host execution) traces of a real run -> a skewlens run directory.

The run directory is assembled in a temporary sibling directory and renamed into place only when every
rank converted and the manifest is written, so a failed import leaves nothing behind (and an existing
run directory is untouched unless ``overwrite`` is set).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from skewlens.profiler.chakra_io import pg_init_node, write_et
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers.comm import DEFAULT_PG
from skewlens.profiler.importers.convert import RankConversion, convert_rank
from skewlens.profiler.importers.host_et import HostTrace, parse_host_et
from skewlens.profiler.importers.kineto import KinetoTrace, parse_kineto
from skewlens.profiler.importers.pairing import pair_host_traces
from skewlens.profiler.importers.sources import expand_inputs, read_json
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, StepWindow, rank_file, write_manifest
from skewlens.profiler.vocab import Attr
from skewlens.progress import NO_PROGRESS, Progress


def _skewlens_version() -> str:
    try:
        return version("skewlens")
    except PackageNotFoundError:
        return ""


def _check_ranks(kinetos: Sequence[KinetoTrace], world_size: int | None) -> int:
    seen: dict[int, Path] = {}
    for kt in kinetos:
        if kt.rank in seen:
            raise TraceImportError(f"duplicate rank {kt.rank}: {seen[kt.rank]} and {kt.path}")
        seen[kt.rank] = kt.path
    sizes = {kt.world_size for kt in kinetos if kt.world_size is not None}
    if len(sizes) > 1:
        detail = ", ".join(f"{kt.path.name}: {kt.world_size}" for kt in kinetos)
        raise TraceImportError(f"Kineto traces disagree on the world size ({detail})")
    ws = world_size if world_size is not None else (sizes.pop() if sizes else max(seen) + 1)
    too_big = [r for r in seen if r >= ws]
    if too_big:
        raise TraceImportError(f"rank {too_big[0]} ({seen[too_big[0]]}) is outside world size {ws}")
    return ws


def _groups(
    kinetos: Sequence[KinetoTrace], convs: Sequence[RankConversion], hosts: Sequence[HostTrace], ws: int
) -> tuple[ProcessGroupInfo, ...]:
    groups: dict[str, ProcessGroupInfo] = {}
    for kt in kinetos:
        for g in kt.pg_config:
            groups.setdefault(g.name, g)
    for c in convs:
        for g in c.groups.values():
            groups.setdefault(g.name, g)
    if not groups:
        for h in hosts:
            for g in _host_pg_init(h):
                groups.setdefault(g.name, g)
    backend = next((kt.backend for kt in kinetos if kt.backend), "")
    used = {str(n.attrs[Attr.PG_NAME]) for c in convs for n in c.nodes if Attr.PG_NAME in n.attrs}
    if DEFAULT_PG not in groups and (not groups or DEFAULT_PG in used):
        groups[DEFAULT_PG] = ProcessGroupInfo(
            name=DEFAULT_PG, ranks=tuple(range(ws)), desc="default_pg", backend=backend
        )
    for name, g in groups.items():
        if not g.ranks:  # PyTorch lists no ranks for a group spanning the whole world
            groups[name] = dataclasses.replace(g, ranks=tuple(range(ws)))
    unknown = sorted(used - set(groups))
    if unknown:
        raise TraceImportError(
            f"communication on process group(s) {unknown} that neither pg_config nor the events describe"
        )
    return tuple(groups.values())


def _host_pg_init(h: HostTrace) -> list[ProcessGroupInfo]:
    if not h.pg_init:
        return []
    try:
        data = json.loads(h.pg_init)
        return [
            ProcessGroupInfo(
                name=str(g["pg_name"]),
                ranks=tuple(int(r) for r in g["ranks"]),
                desc=str(g.get("pg_desc", "")),
                backend=str(g.get("backend_config", "")),
            )
            for g in data
        ]
    except (ValueError, KeyError, TypeError) as e:
        raise TraceImportError(f"{h.path}: malformed process-group init node ({type(e).__name__})") from None


def import_traces(
    kineto: Sequence[Path],
    host_et: Sequence[Path] | None,
    out: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    overwrite: bool = False,
    progress: Progress = NO_PROGRESS,
) -> Manifest:
    """Convert per-rank Kineto traces (files, directories or tar archives) into the run directory ``out``.

    ``host_et`` optionally names the matching host execution traces (paired by pid or file-name number,
    see :mod:`skewlens.profiler.importers.pairing`). ``rank`` / ``world_size`` stand in for
    ``distributedInfo``
    of a single trace without it. Returns the manifest written.
    """
    out = Path(out)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise TraceImportError(
            f"{out}: exists and is not empty (choose another --out, or --force to replace it)"
        )
    if not kineto:
        raise TraceImportError("no Kineto trace given")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceImportError(f"{out.parent}: cannot create ({e})") from None
    with tempfile.TemporaryDirectory(prefix="skewlens-import-") as scratch:
        k_files = expand_inputs(kineto, Path(scratch) / "kineto")
        h_files = expand_inputs(host_et, Path(scratch) / "host") if host_et else []
        if rank is not None and len(k_files) != 1:
            raise TraceImportError(f"--rank applies to a single Kineto trace, {len(k_files)} given")
        total = len(k_files) + len(h_files) + len(k_files) + 1
        with progress.task("importing", total) as advance:
            kinetos = []
            for f in k_files:
                kinetos.append(parse_kineto(read_json(f.path, label=f.label), f.label, rank=rank))
                advance(description=f"read {f.label.name}")
            ws = _check_ranks(kinetos, world_size)
            hosts = []
            for f in h_files:
                hosts.append(parse_host_et(read_json(f.path, label=f.label), f.label))
                advance(description=f"read {f.label.name}")
            pairs, rule = pair_host_traces(kinetos, hosts) if hosts else ({}, "")
            convs = []
            for kt in sorted(kinetos, key=lambda k: k.rank):
                convs.append(convert_rank(kt, pairs.get(kt.rank)))
                advance(description=f"converted rank {kt.rank}")
            manifest = _write_run(
                out, kinetos=kinetos, convs=convs, hosts=hosts, ws=ws, rule=rule, overwrite=overwrite
            )
            advance(description="written")
    return manifest


def _write_run(
    out: Path,
    *,
    kinetos: Sequence[KinetoTrace],
    convs: Sequence[RankConversion],
    hosts: Sequence[HostTrace],
    ws: int,
    rule: str,
    overwrite: bool,
) -> Manifest:
    groups = _groups(kinetos, convs, hosts, ws)
    meta_node = pg_init_node(groups)
    ranks = tuple(c.rank for c in convs)
    notes = {
        "import": f"{len(kinetos)} Kineto trace(s)"
        + (f", {len(hosts)} host execution trace(s) paired by {rule}" if hosts else ""),
        "clock": "Kineto clocks are not aligned across hosts by the files; clock_offsets_ns are 0",
    }
    for kt in kinetos:
        notes[f"rank {kt.rank} source"] = str(kt.path.name)
    for r in range(ws):
        if r not in ranks:
            notes[f"rank {r}"] = "no Kineto trace given for this rank"
    for c in convs:
        if c.notes:
            notes[f"rank {c.rank} import"] = "; ".join(c.notes)
    steps = tuple(s for c in convs for s in c.steps)
    n_steps = max((len(c.steps) for c in convs), default=0)
    manifest = Manifest(
        world_size=ws,
        ranks=ranks,
        missing_ranks=tuple(r for r in range(ws) if r not in ranks),
        process_groups=groups,
        backend=next((kt.backend for kt in kinetos if kt.backend), ""),
        level="ops",
        source="import",
        devices={c.rank: c.device for c in convs},
        clock_offsets_ns=dict.fromkeys(ranks, 0),
        step_window=StepWindow(wait=0, warmup=0, active=n_steps),
        steps=steps,
        skewlens_version=_skewlens_version(),
        notes=notes,
    )
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    except OSError as e:
        raise TraceImportError(f"{out.parent}: cannot create the run directory there ({e})") from None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a run directory is an ordinary one
        for c in convs:
            write_et(rank_file(tmp, c.rank), [meta_node, *c.nodes], {"rank": c.rank, "world_size": ws})
        write_manifest(tmp, manifest)
        old = None
        if out.exists():
            if not overwrite and (not out.is_dir() or any(out.iterdir())):
                raise TraceImportError(f"{out}: appeared while importing; not overwritten")
            old = out.with_name(f".{out.name}.old-{tmp.name}")
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)  # put the previous run back
            raise
        if old is not None:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TraceImportError(f"{out}: cannot write the run directory ({e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
