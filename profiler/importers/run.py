"""``import_traces``: Kineto (+ host execution) traces of a real run -> a skewlens run directory.

Ranks are converted in parallel, each by a worker process that reads its trace, converts it and writes
its encoded nodes to a scratch file, returning only a summary (steps, groups, notes); at most
:func:`plan_workers` workers run, as many as the cores and the memory budget allow (each worker's peak
memory is estimated from its trace's size), and with one worker the ranks are converted in this process,
one after the other. No process ever holds more than one rank's trace.

The run directory is assembled in a temporary sibling directory and renamed into place only when every
rank converted and the manifest is written, so a failed import leaves nothing behind (and an existing
run directory is untouched unless ``overwrite`` is set).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from skewlens.profiler.atomic import (
    dangling_link,
    no_temp_dir,
    replace_dir,
    staging_dir,
    why_not_created,
)
from skewlens.profiler.chakra_io import EtWriter, pg_init_node
from skewlens.profiler.errors import SkewlensError, TraceImportError, address_space_limit
from skewlens.profiler.importers.comm import DEFAULT_PG
from skewlens.profiler.importers.convert import RankConversion, convert_rank
from skewlens.profiler.importers.host_et import HostTrace, parse_host_et
from skewlens.profiler.importers.kineto import KinetoTrace, load_kineto, require_work
from skewlens.profiler.importers.pairing import pair_host_traces
from skewlens.profiler.importers.sources import (
    MAX_JSON_BYTES,
    TraceFile,
    expand_inputs,
    read_json,
    read_trace_bytes,
    scratch_error,
    text_size_estimate,
)
from skewlens.profiler.manifest import (
    MANIFEST_NAME,
    MAX_WORLD_SIZE,
    PG_INIT_ERRORS,
    Manifest,
    ProcessGroupInfo,
    RankNote,
    StepWindow,
    pg_init_group,
    pg_init_problem,
    rank_file,
    rank_note_key,
    with_world_ranks,
    write_manifest,
)
from skewlens.profiler.threads import POOL_DIED, process_pool, usable_cores
from skewlens.progress import NO_PROGRESS, Progress, given


def _not_replaceable(out: Path, overwrite: bool) -> str | None:
    """Why the import may not write ``out``, or None: it may where nothing is there or an empty directory,
    and with ``overwrite`` where a run directory is (one with a manifest), never over anything else, and
    never the directory this process is in (the run is renamed into place: the shell would be left in a
    deleted directory)."""
    if (why := dangling_link(out)) is not None:
        return f"{out}: {why}; give --out another path or remove the link"
    if not out.exists():
        return None
    here = Path.cwd()
    if out.resolve() == here or out.resolve() in here.parents:
        return f"{out}: the current directory (or one that holds it); give --out another directory"
    if out.is_dir() and not any(out.iterdir()):
        return None
    if not overwrite:
        return f"{out}: exists and is not empty (choose another --out, or --force to replace it)"
    if not (out.is_dir() and (out / MANIFEST_NAME).is_file()):
        return f"{out}: not a run directory (no {MANIFEST_NAME}); --force replaces only a run directory"
    return None


def _skewlens_version() -> str:
    try:
        return version("skewlens")
    except PackageNotFoundError:
        return ""


def _check_ranks(kinetos: Sequence[KinetoTrace], world_size: int | None) -> int:
    seen: dict[int, Path] = {}
    for kt in kinetos:
        if kt.rank in seen:
            raise TraceImportError(
                f"duplicate rank {kt.rank}: {seen[kt.rank]} and {kt.path} (one trace per rank: a "
                "torch.profiler schedule with repeat writes one per cycle; import one cycle's traces)"
            )
        seen[kt.rank] = kt.path
    sizes = {kt.world_size for kt in kinetos if kt.world_size is not None}
    if len(sizes) > 1:
        detail = ", ".join(f"{kt.path.name}: {kt.world_size}" for kt in kinetos)
        raise TraceImportError(f"Kineto traces disagree on the world size ({detail})")
    if world_size is not None and sizes and sizes != {world_size}:
        raise TraceImportError(
            f"--world-size {world_size} disagrees with the traces' distributedInfo.world_size {sizes.pop()}"
        )
    ws = world_size if world_size is not None else (sizes.pop() if sizes else max(seen) + 1)
    if not 1 <= ws <= MAX_WORLD_SIZE:
        raise TraceImportError(f"world size {ws} is outside 1..{MAX_WORLD_SIZE}")
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
    used = {name for c in convs for name in c.pg_names}
    if DEFAULT_PG not in groups and (not groups or DEFAULT_PG in used):
        groups[DEFAULT_PG] = ProcessGroupInfo(
            name=DEFAULT_PG, ranks=tuple(range(ws)), desc="default_pg", backend=backend
        )
    groups = with_world_ranks(groups, ws)
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
        return [pg_init_group(g) for g in data]
    except PG_INIT_ERRORS as e:
        raise TraceImportError(
            f"{h.path}: malformed process-group init node ({pg_init_problem(e)})"
        ) from None


#: The note of a rank some of whose communication ops the trace gives no size for.
UNSIZED_NOTE = (
    "communication op(s) whose size the trace does not give, imported as 0 bytes: newer torch writes it in "
    "record_param_comms' 'In msg nelems' ('In msg size' before pytorch#114735, Dec 2023), older torch only "
    "in the 'Input Dims' that record_shapes=True records"
)

#: The note of a rank some of whose collectives run on a group the trace does not name.
UNNAMED_GROUP_NOTE = (
    "collective(s) on a group smaller than the world that the trace does not name ('Group size' without "
    "'Process Group Name': older torch) kept as compute: their group and peers are unknown, so their time "
    "reads as compute and nobody waits at them"
)

#: Memory an import may use, all processes together, unless told otherwise.
DEFAULT_MEMORY_BUDGET_BYTES = 1 << 30
#: A worker's memory before it reads a trace (interpreter, protobuf, msgspec): 27 MiB measured; rounded up.
WORKER_BASE_BYTES = 40 << 20
#: A worker's peak memory per byte of trace text it converts (the text, the decoded events while they are
#: reduced, the kept events, the nodes): measured 4.1 on the synthetic 200,000-event rank (37 MiB of text;
#: 179 MiB peak), 3.3 on the 16-GPU and 2-GPU real traces; rounded up.
WORKER_BYTES_PER_TEXT_BYTE = 4.5
#: The same for a host execution trace (parsed into Python objects whole, as the standard library does).
HOST_BYTES_PER_TEXT_BYTE = 10
#: Below this much trace text in all, ranks are converted in this process (starting workers costs more).
PARALLEL_MIN_TEXT_BYTES = 32 << 20
_CHUNK = 1 << 20


def worker_estimate(text_bytes: int, host_text_bytes: int = 0) -> int:
    """Estimated peak memory of one worker converting a Kineto trace of ``text_bytes`` of JSON text (and a
    host execution trace of ``host_text_bytes``)."""
    return (
        WORKER_BASE_BYTES
        + int(text_bytes * WORKER_BYTES_PER_TEXT_BYTE)
        + host_text_bytes * HOST_BYTES_PER_TEXT_BYTE
    )


def plan_workers(estimates: Sequence[int], budget_bytes: int, cores: int) -> int:
    """Worker processes for jobs of these estimated peaks (:func:`worker_estimate`): at most one per core
    and per job, and no more than the budget holds when every worker runs the largest job (at least one:
    a job larger than the budget still runs, alone)."""
    if not estimates:
        return 1
    fits = budget_bytes // max(*estimates, 1)
    return max(1, min(cores, len(estimates), fits))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Job:
    """One rank to read (and, unless ``scan``, convert), as a worker receives it."""

    kineto: TraceFile
    """The rank's Kineto trace."""
    host: TraceFile | None
    """Its host execution trace, if paired."""
    rank: int | None
    """``--rank`` (single trace without distributedInfo)."""
    nodes_path: Path
    """Where the worker writes the rank's encoded nodes."""
    scan: bool = False
    """Only read the trace's header and cpu pids (host-trace pairing needs them before converting)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Done:
    """What a worker returns: the trace's header (no events) and the conversion (nodes on disk)."""

    header: KinetoTrace
    """The trace without its events (rank, world size, groups, cpu pids)."""
    conv: RankConversion | None
    """The conversion without its body (which is at the job's ``nodes_path``); None for a scan."""


def _read_kineto(f: TraceFile, rank: int | None) -> KinetoTrace:
    data = read_trace_bytes(f.path, label=f.label)
    return load_kineto(data, f.label, rank=rank, max_bytes=MAX_JSON_BYTES)


def _read_host(f: TraceFile) -> HostTrace:
    return parse_host_et(read_json(f.path, label=f.label), f.label)


def _header(kt: KinetoTrace) -> KinetoTrace:
    return dataclasses.replace(kt, cpu_ops=[], annotations=[], gpu=[], launches={}, syncs=[])


@contextlib.contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: a rank's records hold no reference cycles (refcounting frees
    them), but the collector's full passes over the millions of them grow with the rank (measured on the
    synthetic rank at 1x and 2x its events: conversion 2.6x the time with it, 2.0x without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_job(job: _Job) -> _Done:
    """Read one rank's trace and convert it, writing its encoded nodes to ``job.nodes_path``."""
    with _cycle_collection_paused():
        return _convert_job(job)


def _convert_job(job: _Job) -> _Done:
    kt = _read_kineto(job.kineto, job.rank)
    require_work(kt)
    if job.scan:
        return _Done(header=_header(kt), conv=None)
    host = _read_host(job.host) if job.host is not None else None
    conv = convert_rank(kt, host)
    try:
        job.nodes_path.write_bytes(conv.body)
    except OSError as e:
        raise scratch_error(f"{job.kineto.label}: cannot write its converted nodes", e) from None
    return _Done(header=_header(kt), conv=dataclasses.replace(conv, body=b""))


def _scan_host(f: TraceFile) -> HostTrace:
    """A host trace reduced to what pairing and the process groups read (its ops are read again later)."""
    h = _read_host(f)
    return dataclasses.replace(h, comms=(), ops=())


def _run_all(
    fn: Callable[[_Job], _Done], jobs: Sequence[_Job], workers: int, advance: Callable[[str], None]
) -> list[_Done]:
    """``fn`` over ``jobs``, in this process (one worker) or in a pool; results in job order."""
    if workers <= 1:
        out = []
        for job in jobs:
            out.append(fn(job))
            advance(job.kineto.label.name)
        return out
    results: dict[int, _Done] = {}
    with process_pool(workers, __name__) as pool:
        futures: dict[Future[_Done], int] = {pool.submit(fn, job): k for k, job in enumerate(jobs)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in sorted(done, key=lambda f: futures[f]):
                    k = futures[fut]
                    results[k] = _result(fut, jobs[k])
                    advance(jobs[k].kineto.label.name)
        except BaseException:  # a failed trace, or Ctrl-C: the jobs running end, no other starts
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[k] for k in range(len(jobs))]


def _result(fut: Future[_Done], job: _Job) -> _Done:
    """A worker's result; its failure as a one-line error naming the trace."""
    try:
        return fut.result()
    except TraceImportError as e:
        raise TraceImportError(str(e)) from None  # the worker's traceback would only confuse
    except MemoryError:  # the limit that explains it, as the in-process conversion's error says it
        cap = address_space_limit()
        limit = f" ({cap})" if cap else ""
        raise TraceImportError(
            f"{job.kineto.label}: out of memory while converting this trace{limit}"
        ) from None
    except BrokenProcessPool:
        raise TraceImportError(
            f"{job.kineto.label}: the worker converting this trace (or another one) died: {POOL_DIED} "
            "(out of memory: give a smaller memory budget to run fewer at once)"
        ) from None


def import_traces(
    kineto: Sequence[Path],
    host_et: Sequence[Path] | None,
    out: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = NO_PROGRESS,
    workers: int | None = None,
    memory_budget_bytes: int | None = None,
) -> Manifest:
    """Convert per-rank Kineto traces (files, directories or tar archives) into the run directory ``out``.

    ``host_et`` optionally names the matching host execution traces (paired by pid or file-name number,
    see :mod:`skewlens.profiler.importers.pairing`). ``rank`` / ``world_size`` stand in for
    ``distributedInfo`` of a single trace without it. ``workers`` caps the worker processes (default: the
    cores, and none for less than :data:`PARALLEL_MIN_TEXT_BYTES` of traces) and ``memory_budget_bytes``
    the memory they may use together (default :data:`DEFAULT_MEMORY_BUDGET_BYTES`; see
    :func:`plan_workers`). Workers are started by multiprocessing's forkserver, which imports the
    caller's main module: a script that calls this needs the ``if __name__ == "__main__":`` guard.
    Returns the manifest written.
    """
    progress = given(progress)
    out = Path(out).absolute()  # ``.`` has no name to make the temporary sibling from
    if (why := _not_replaceable(out, overwrite)) is not None:
        raise TraceImportError(why)
    if not kineto:
        raise TraceImportError("no Kineto trace given")
    if rank is not None and not 0 <= rank < MAX_WORLD_SIZE:
        raise TraceImportError(f"--rank {rank}: expected a rank in 0..{MAX_WORLD_SIZE - 1}")
    if world_size is not None and not 1 <= world_size <= MAX_WORLD_SIZE:
        raise TraceImportError(f"--world-size {world_size}: expected 1..{MAX_WORLD_SIZE}")
    if workers is not None and workers < 1:
        raise TraceImportError(f"workers must be >= 1, got {workers}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceImportError(f"{out.parent}: cannot create ({why_not_created(out, e)})") from None
    budget = DEFAULT_MEMORY_BUDGET_BYTES if memory_budget_bytes is None else memory_budget_bytes
    if (why := no_temp_dir()) is not None:  # a FileNotFoundError traceback
        raise TraceImportError(f"the import's scratch files need a temporary directory: {why}")
    with tempfile.TemporaryDirectory(prefix="skewlens-import-") as scratch:
        k_files = expand_inputs(kineto, Path(scratch) / "kineto")
        h_files = expand_inputs(host_et, Path(scratch) / "host") if host_et else []
        if rank is not None and len(k_files) != 1:
            raise TraceImportError(f"--rank applies to a single Kineto trace, {len(k_files)} given")
        sizes = [text_size_estimate(f.path) for f in k_files]
        host = max((text_size_estimate(f.path) for f in h_files), default=0)  # a worker holds one too
        if workers is None and sum(sizes) + host * len(h_files) < PARALLEL_MIN_TEXT_BYTES:
            n_workers = 1
        else:
            estimates = [worker_estimate(s, host) for s in sizes]
            n_workers = plan_workers(estimates, budget, min(usable_cores(), workers or usable_cores()))
        parts = Path(scratch) / "nodes"
        parts.mkdir()
        jobs = [
            _Job(kineto=f, host=None, rank=rank, nodes_path=parts / f"{k}.nodes")
            for k, f in enumerate(k_files)
        ]
        total = len(k_files) * (2 if h_files else 1) + len(h_files) + 1
        with progress.task("importing", total) as advance:
            rule = ""
            hosts: list[HostTrace] = []
            if h_files:
                scans = _run_all(_run_job, [dataclasses.replace(j, scan=True) for j in jobs], n_workers,
                                 lambda name: advance(description=f"read {name}"))  # fmt: skip
                _check_ranks([d.header for d in scans], world_size)
                for f in h_files:
                    hosts.append(_scan_host(f))
                    advance(description=f"read {f.label.name}")
                pairs, rule = pair_host_traces([d.header for d in scans], hosts)
                hosts = [pairs[r] for r in sorted(pairs)]  # rank order, whatever the arguments' order
                by_label = {f.label: f for f in h_files}
                jobs = [
                    dataclasses.replace(j, host=by_label[pairs[d.header.rank].path])
                    for j, d in zip(jobs, scans, strict=True)
                ]
            done = _run_all(_run_job, jobs, n_workers, lambda name: advance(description=f"converted {name}"))
            kinetos = [d.header for d in done]
            ws = _check_ranks(kinetos, world_size)
            order = sorted(range(len(done)), key=lambda k: kinetos[k].rank)
            convs = [c for k in order if (c := done[k].conv) is not None]
            manifest = _write_run(
                out,
                kinetos=[kinetos[k] for k in order],  # rank order: the same run whatever the files' order
                convs=convs,
                nodes=[jobs[k].nodes_path for k in order],
                hosts=hosts,
                ws=ws,
                rule=rule,
                overwrite=overwrite,
            )
            advance(description="written")
    return manifest


def _write_run(
    out: Path,
    *,
    kinetos: Sequence[KinetoTrace],
    convs: Sequence[RankConversion],
    nodes: Sequence[Path],
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
        notes[rank_note_key(kt.rank, RankNote.SOURCE)] = str(kt.path.name)
    for r in range(ws):
        if r not in ranks:
            notes[rank_note_key(r)] = "no Kineto trace given for this rank"
    for c in convs:
        if c.notes:
            notes[rank_note_key(c.rank, RankNote.IMPORT)] = "; ".join(c.notes)
        if c.unsized:  # a size the trace does not give is no 0-byte message: said, not left to look like one
            notes[rank_note_key(c.rank, RankNote.COMM_SIZES)] = UNSIZED_NOTE
        if c.unnamed:  # a collective turned into compute: said where check, analyze and replay say notes
            notes[rank_note_key(c.rank, RankNote.COMM_GROUPS)] = UNNAMED_GROUP_NOTE
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
        gpus={c.rank: c.gpu for c in convs if c.gpu},
        clock_offsets_ns=dict.fromkeys(ranks, 0),
        step_window=StepWindow(wait=0, warmup=0, active=n_steps),
        steps=steps,
        skewlens_version=_skewlens_version(),
        notes=notes,
    )
    # staged as every output is (locked while it is written, a killed import's removed by the next command
    # that stages beside it): its own unlocked .RUN.import-<random> was never removed
    try:
        with staging_dir(out) as tmp:
            try:
                for c, part in zip(convs, nodes, strict=True):
                    with (
                        EtWriter(rank_file(tmp, c.rank), {"rank": c.rank, "world_size": ws}) as w,
                        part.open("rb") as fh,
                    ):
                        w.write(meta_node)
                        while chunk := fh.read(_CHUNK):
                            w.write_raw(chunk)
                write_manifest(tmp, manifest)
                if out.exists() and _not_replaceable(out, overwrite) is not None:
                    raise TraceImportError(f"{out}: appeared while importing; not overwritten")
                replace_dir(tmp, out)  # another import's between its renames: they take turns
            except OSError as e:
                # the OSError's own words named the staging directory, removed by now, and its errno
                raise TraceImportError(f"{out}: cannot write the run directory ({e.strerror or e})") from None
    except SkewlensError as e:
        if type(e) is not SkewlensError:  # the import's own, or a kind of its own
            raise
        raise TraceImportError(str(e)) from None  # the staging directory's: "cannot write RUN: ..."
    return manifest
