"""Load a run into a :class:`RunTrace` and match its communication across ranks.

A run is one of:

- a skewlens run directory: ``manifest.json`` + ``rank-<r>.et``;
- a directory of Chakra traces from another producer, ``<prefix>.<r>.et`` (as Chakra's converter and
  generator name them), with no manifest: the world size is inferred from the files, process groups
  from the ``## process_group:init ##`` metadata node, and collectives without a group are world-wide;
- a prefix ``DIR/<prefix>`` naming such files.

Kineto traces (torch.profiler JSON) given in place of a run, a file or a directory of them, are refused
naming the ``skewlens import --kineto`` command that makes a run of them.

Files are decoded by the vectorised decoder in :mod:`skewlens.profiler.store.fast` (falling back to the
per-node reference decoder here for anything it refuses, so errors name the exact byte offset). Problems
go to an :class:`~skewlens.profiler.store.issues.IssueLog`: strict by default (the first error raises
:class:`~skewlens.profiler.errors.ValidationError`), collecting everything when ``validate_run`` passes
its own.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import math
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from google.protobuf.message import DecodeError

from skewlens.paths import doc
from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.atomic import export_marker
from skewlens.profiler.bounded import open_archive, open_regular
from skewlens.profiler.chakra_io import attr_value, iter_messages, iter_nodes, read_metadata, read_trace_bytes
from skewlens.profiler.errors import ManifestError, TraceFormatError, ValidationError
from skewlens.profiler.manifest import (
    CAPTURE_PARTS_ADVICE,
    CAPTURE_PARTS_NOTE,
    MANIFEST_NAME,
    OTHER_HOST_NOTE,
    OWN_TIMELINE,
    PARTS_DIR,
    PG_INIT_ERRORS,
    Manifest,
    ProcessGroupInfo,
    own_timeline_hint,
    pg_init_group,
    pg_init_problem,
    rank_file,
    read_manifest,
    with_world_ranks,
)
from skewlens.profiler.store import colcache
from skewlens.profiler.store.fast import (
    FLOAT_INT_BOUND,
    INT_ATTRS,
    LIST_ATTRS,
    MIN_NODES,
    STRING_ATTRS,
    FastDecodeError,
    RawColumns,
    TraceBytes,
    decode_file,
)
from skewlens.profiler.store.issues import (
    NO_START_TIMES,
    DroppedSplits,
    IssueLog,
    Severity,
    capture_note_issues,
    first_named,
    no_trace_line,
    path_word,
    rank_ranges,
    ranks_label,
)
from skewlens.profiler.store.match import (
    MAX_REPORTED,
    STEP_MISMATCH,
    CommRows,
    match_instances,
    match_pairs,
    matchable,
    step_mark_stream,
)
from skewlens.profiler.store.model import (
    DEP_CTRL,
    DEP_DATA,
    I8,
    I64,
    CollectiveInstance,
    P2PPair,
    RankTrace,
    RunTrace,
    group_rank_order,
)
from skewlens.profiler.threads import default_workers, ordered_map, release_free_memory
from skewlens.profiler.vocab import (
    ARCHIVE_SUFFIXES,
    PG_INIT_NODE_NAME,
    TRACE_SUFFIXES,
    Attr,
    CommType,
    NodeType,
)
from skewlens.progress import NO_PROGRESS, Advance, Progress, given

#: Name given to the world-wide group assumed for collectives that name no group.
WORLD_PG = "0"
#: ``format`` of the ``run.json`` that ``skewlens export`` writes beside its copy of the run's manifest.
PARQUET_EXPORT_FORMAT = "skewlens-parquet"
PARQUET_EXPORT_FILE = "run.json"
_FOREIGN_RE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et(?:\.gz)?$")
_OURS_RE = re.compile(r"^rank-(?P<rank>\d+)\.et$")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunFiles:
    """Where a run's traces are: its manifest (read or inferred) and one file per rank."""

    root: Path
    """The directory (or prefix) given."""
    manifest: Manifest
    """The manifest, synthesised for runs without one (``source="foreign"``)."""
    files: dict[int, Path]
    """Trace file of each rank the manifest lists."""
    has_manifest: bool
    """Whether ``manifest.json`` was read."""


#: The note of a manifest the loader made up for traces without one (``skewlens check`` reports it as info).
SYNTH_NOTE = "inferred"


def _synth_manifest(ranks: list[int], folder: Path) -> Manifest:
    """The manifest of traces without one; where ``folder`` holds a capture's part files, a note saying that a
    capture may still be writing it (:data:`CAPTURE_PARTS_NOTE`): only what is on disk, no liveness check."""
    world = max(ranks) + 1
    notes = {SYNTH_NOTE: "no manifest: world size inferred from the trace file names"}
    if (folder / PARTS_DIR).is_dir():
        notes[CAPTURE_PARTS_NOTE] = (
            f"{folder}: no manifest.json, and {folder / PARTS_DIR} holds a capture's part files: a skewlens "
            "profile may still be writing this run, or was killed before it finished"
        )
    return Manifest(
        world_size=world,
        ranks=tuple(ranks),
        missing_ranks=tuple(sorted(set(range(world)) - set(ranks))),
        source="foreign",
        notes=notes,
    )


def _refuse_parquet_export(p: Path) -> None:
    """A Parquet export holds a copy of its run's manifest but no traces: say so, rather than that every
    rank's trace file is missing."""
    prov = export_marker(p, PARQUET_EXPORT_FILE, PARQUET_EXPORT_FORMAT)
    if prov is not None:
        source = prov.get("source")
        where = f" ({source})" if isinstance(source, str) else ""
        raise ManifestError(
            f"{p}: a Parquet export (skewlens export), not a run directory: pass the run it was exported from"
            f"{where}; the tables are read with DuckDB, pyarrow or Spark ({doc('docs/parquet.md')})"
        )


#: How much of a file's (gunzipped) text :func:`_sniff` reads: a Kineto trace's ``traceEvents`` key follows
#: a few KB of device properties and distributed info.
_SNIFF_BYTES = 1 << 16
#: Most entries of a directory (and members of an archive) looked at for Kineto traces.
_SNIFF_ENTRIES = 1000
#: Most bytes of an archive's decompressed stream read past on the way to its first trace member (and at
#: most :data:`~skewlens.profiler.bounded.JSON_GZIP_RATIO` times the archive's size): a tar skips a member
#: by inflating it.
_SNIFF_ARCHIVE_BYTES = 1 << 30
_IMPORT = "skewlens import --kineto"
_TIMELINE = "skewlens_timeline"


def _sniff(f: Path) -> str | None:
    """``kineto`` for a file that looks like a Kineto trace (torch.profiler's JSON: ``traceEvents`` in its
    first :data:`_SNIFF_BYTES`, or a ``*kineto*`` / ``*.pt.trace.json*`` name), ``host_et`` for a PyTorch
    host execution trace, else None; a ``.tar`` / ``.tar.gz`` archive by the first trace member it holds.
    Reads no more than a few KB (an archive: up to its first trace member); unreadable files (and archives
    that inflate past their bound) are None."""
    name = f.name.lower()
    try:
        if name.endswith(ARCHIVE_SUFFIXES):
            with (
                open_archive(f, _SNIFF_ARCHIVE_BYTES, error=ManifestError) as (stream, _),
                tarfile.open(fileobj=stream, mode="r:") as tf,
            ):
                for count, member in enumerate(tf):
                    if count >= _SNIFF_ENTRIES:
                        return None
                    if member.isreg() and member.name.lower().endswith(TRACE_SUFFIXES):
                        src = tf.extractfile(member)
                        if src is None:
                            return None
                        with src:
                            head = src.read(_SNIFF_BYTES)
                        if member.name.lower().endswith(".gz"):
                            head = _gunzip_head(head)
                        return _sniff_text(member.name.lower(), head)
            return None
        if not name.endswith(TRACE_SUFFIXES):
            return None
        with open_regular(f) as fh:  # a FIFO's open blocked
            head = fh.read(_SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = _gunzip_head(head)
    except (OSError, EOFError, tarfile.TarError, zlib.error, ManifestError):
        return None
    return _sniff_text(name, head)


def _gunzip_head(head: bytes) -> bytes:
    """The first :data:`_SNIFF_BYTES` of the gzip stream that ``head`` begins (it may be cut short)."""
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _SNIFF_BYTES)


def _sniff_text(name: str, head: bytes) -> str | None:
    if OWN_TIMELINE.match(head):
        return _TIMELINE
    if b'"traceEvents"' in head or "kineto" in name or ".pt.trace.json" in name:
        return "kineto"
    if b'"nodes"' in head and b'"schema"' in head:
        return "host_et"
    return None


def _timeline_hint(f: Path) -> str:
    """What to say where ``f`` is a Perfetto timeline skewlens wrote: :func:`~skewlens.profiler.manifest.
    own_timeline_hint` of its first bytes."""
    head = b""
    with contextlib.suppress(OSError, ManifestError), open_regular(f) as fh:
        head = fh.read(_SNIFF_BYTES)
    return own_timeline_hint(f.name, head, not_a="a run") or f"{f.name} is a Perfetto timeline, not a run"


def _import_hint(p: Path) -> str | None:
    """What to say where ``p`` (a file, or a directory without a run) holds Kineto traces rather than a run:
    that it does, and the ``skewlens import`` command that makes a run of them; None where it does not."""
    q = path_word(p)  # a command the user copies
    if p.is_file():
        kind = _sniff(p)
        if kind == _TIMELINE:
            return _timeline_hint(p)
        if kind == "kineto":
            what = (
                "an archive of Kineto traces"
                if p.name.lower().endswith(ARCHIVE_SUFFIXES)
                else "a Kineto trace"
            )
            return f"{what} (torch.profiler JSON), not a run: import it first: {_IMPORT} {q} --out RUN"
        if kind == "host_et":
            return (
                "a PyTorch host execution trace, not a run: import it with its Kineto traces: "
                f"{_IMPORT} KINETO --host-et {q} --out RUN"
            )
        return None
    found = []
    own = []
    for count, f in enumerate(sorted(p.iterdir())):
        if count >= _SNIFF_ENTRIES:
            break
        kind = _sniff(f) if f.is_file() else None
        if kind == "kineto":
            found.append(f.name)
        elif kind == _TIMELINE:
            own.append(f)
    if not found:
        return _timeline_hint(own[0]) if own else None
    names = first_named(found)
    return f"it holds Kineto traces ({names}), not a run: import them first: {_IMPORT} {q} --out RUN"


def locate_run(path: str | Path) -> RunFiles:
    """Find a run's manifest and rank files (see the module docstring for the accepted layouts)."""
    p = Path(path)
    if p.is_dir() and (p / MANIFEST_NAME).exists():
        _refuse_parquet_export(p)
        m = read_manifest(p)
        return RunFiles(root=p, manifest=m, files={r: rank_file(p, r) for r in m.ranks}, has_manifest=True)
    if p.is_dir():
        folder, want = p, None
    elif p.parent.is_dir():
        folder, want = p.parent, p.name
    else:
        raise ManifestError(f"{p}: no such run directory or trace prefix")
    by_prefix: dict[str, dict[int, Path]] = {}
    for f in sorted(folder.iterdir()):
        m1 = _FOREIGN_RE.match(f.name)
        m2 = _OURS_RE.match(f.name)
        if m2 is not None:
            by_prefix.setdefault("rank-", {})[int(m2["rank"])] = f
        elif m1 is not None:
            by_prefix.setdefault(m1["prefix"], {})[int(m1["rank"])] = f
    prefixes = len(by_prefix)
    if want is not None:
        by_prefix = {k: v for k, v in by_prefix.items() if k == want}
    if not by_prefix and p.exists() and (hint := _import_hint(p)) is not None:
        raise ManifestError(f"{p}: {hint}")
    if not by_prefix and p.is_file():
        if prefixes > 1 and (named := _FOREIGN_RE.match(p.name)) is not None:  # the folder is ambiguous
            prefix = folder / named["prefix"]
            raise ManifestError(f"{p}: a file, not a run: give its traces' prefix ({prefix})")
        raise ManifestError(f"{p}: a file, not a run: give the run directory that holds it ({folder})")
    if not by_prefix and not p.exists():
        raise ManifestError(f"{p}: no such run directory (nor traces {p.name}.<rank>.et in {folder})")
    if not by_prefix and (p / PARTS_DIR).is_dir():  # made when skewlens profile begins (prepare_run_dir)
        raise ManifestError(
            f"{p}: no rank has saved its trace yet: {p / PARTS_DIR} is a skewlens profile's, which may still "
            "be capturing into it (a rank saves when its window ends, or at exit) or was killed before any "
            "did; wait for `skewlens profile` to finish"
        )
    if not by_prefix:
        raise ManifestError(
            f"{p}: no manifest.json and no Chakra traces named <prefix>.<rank>.et (is this a run directory?)"
        )
    if len(by_prefix) > 1:
        raise ManifestError(
            f"{p}: traces of several runs found (prefixes {sorted(by_prefix)}); pass DIR/<prefix> to pick one"
        )
    files = next(iter(by_prefix.values()))
    return RunFiles(root=p, manifest=_synth_manifest(sorted(files), folder), files=files, has_manifest=False)


# --------------------------------------------------------------------------------------------- decode


def int64_of(v: int | float) -> int:
    """An integer attribute's value as the vectorised decoder reads it: a uint64 past int64's range wraps
    (as its view of the varint does), a float is truncated, NaN reads 0, and past ±9.2e18 the bound
    (:func:`~skewlens.profiler.store.fast.float_ints`); ``int(nan)`` was a traceback."""
    if isinstance(v, float):
        return 0 if math.isnan(v) else int(max(-FLOAT_INT_BOUND, min(FLOAT_INT_BOUND, v)))
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def decode_reference(path: str | Path, data: bytes | memoryview | None = None) -> RawColumns:
    """The per-node protobuf decoder: slow, but its errors name the exact byte offset of a bad message
    (``data``: the file's bytes where the caller has read them already)."""
    p = Path(path)
    if data is None:
        data = read_trace_bytes(p)
    first = next(iter_messages(p, data), None)
    if first is None:
        raise TraceFormatError(f"{p}: empty file, expected a Chakra GlobalMetadata message")
    read_metadata(first[1], p, first[0])
    ints = list(INT_ATTRS)
    vals: dict[str, list[int]] = {a: [] for a in ints}
    has: dict[str, list[bool]] = {a: [] for a in [*ints, *STRING_ATTRS]}
    node_id, node_type, start_us, dur_us, offsets = [], [], [], [], []
    names: list[str] = []
    strings: dict[str, list[str | None]] = {a: [] for a in STRING_ATTRS}
    dep_node: list[int] = []
    dep_id: list[int] = []
    dep_kind: list[int] = []
    meta: list[tuple[int, bytes]] = []
    lists: dict[str, tuple[list[int], list[int]]] = {a: ([], []) for a in LIST_ATTRS}
    for row, (offset, node) in enumerate(iter_nodes(p, data)):
        attrs: dict[str, Any] = {a.name: attr_value(a) for a in node.attr}
        last = {a.name: a for a in node.attr}  # the last of a repeated attribute, as ``attrs`` holds
        for a, (l_rows, l_vals) in lists.items():
            if a in last and last[a].WhichOneof("value") == "int64_list":
                got = last[a].int64_list.values
                l_rows.extend([row] * len(got))
                l_vals.extend(got)
        node_id.append(node.id)
        node_type.append(node.type)
        start_us.append(node.start_time_micros)
        dur_us.append(node.duration_micros)
        offsets.append(offset)
        names.append(node.name)
        for a in ints:
            v = attrs.get(a)
            ok = isinstance(v, int | float) and not isinstance(v, str)
            vals[a].append(int64_of(v) if ok else 0)  # type: ignore[arg-type]
            has[a].append(ok)
        for a, col in strings.items():
            v = attrs.get(a)
            col.append(v if isinstance(v, str) else None)
            has[a].append(isinstance(v, str))
        for kind, deps in ((DEP_CTRL, node.ctrl_deps), (DEP_DATA, node.data_deps)):
            dep_node.extend([row] * len(deps))
            dep_id.extend(deps)
            dep_kind.extend([kind] * len(deps))
        if node.type == NodeType.METADATA:
            meta.append((row, node.SerializeToString()))
    return RawColumns(
        node_id=np.asarray(node_id, dtype=np.uint64),
        node_type=np.asarray(node_type, dtype=np.int64),
        start_us=np.asarray(start_us, dtype=np.uint64).view(np.int64),
        dur_us=np.asarray(dur_us, dtype=np.uint64).view(np.int64),
        names=pa.array(names, type=pa.string()).dictionary_encode(),
        msg_offset=np.asarray(offsets, dtype=np.int64),
        attr_val={a: np.asarray(v, dtype=np.int64) for a, v in vals.items()},
        attr_has={a: np.asarray(v, dtype=np.bool_) for a, v in has.items()},
        pg_name=pa.array(strings["pg_name"], type=pa.string()).dictionary_encode(),
        dtype=pa.array(strings["skl_dtype"], type=pa.string()).dictionary_encode(),
        dep_node=np.asarray(dep_node, dtype=np.int64),
        dep_id=np.asarray(dep_id, dtype=np.uint64),
        dep_kind=np.asarray(dep_kind, dtype=np.int8),
        metadata_msgs=meta,
        global_metadata=bytes(first[1]),
        attr_lists={
            a: (np.asarray(l_rows, dtype=np.int64), np.asarray(l_vals, dtype=np.int64))
            for a, (l_rows, l_vals) in lists.items()
            if l_rows
        },
    )


def _host_op(raw: RawColumns) -> np.ndarray:
    """Whether each node ran on a host thread: ``skl_host_op`` where written (communication nodes, whose
    ``is_cpu_op`` is false by Chakra's convention), else ``is_cpu_op`` (older traces), else true."""
    cpu = np.where(raw.attr_has["is_cpu_op"], raw.attr_val["is_cpu_op"] != 0, True)
    return np.where(raw.attr_has["skl_host_op"], raw.attr_val["skl_host_op"] != 0, cpu)


#: Which decoder reads a file: ``auto`` the vectorised one except for small files (``fast.MIN_NODES``),
#: ``vectorised`` it whatever the size, ``reference`` the per-node one; the first two fall back to the
#: reference decoder for a file the vectorised one refuses.
Decoder = Literal["auto", "vectorised", "reference"]


def decode(
    path: str | Path, *, decoder: Decoder = "auto", on_nodes: Callable[[int], None] | None = None
) -> RawColumns:
    """Decode a file with the vectorised decoder, falling back to the reference one where it refuses.

    With ``auto``, the columns come from the file's column cache where it holds this file's current bytes
    (:mod:`~skewlens.profiler.store.colcache`), and a file of ``MIN_NODES`` nodes or more that had to be
    decoded is cached for the next load. The explicit decoders always decode. ``on_nodes`` is told how many
    nodes are read as they are (a batch at a time by the vectorised decoder, all at once otherwise), each
    node once.
    """
    p = Path(path)
    told = [0]

    def tell(k: int) -> None:
        told[0] += k
        if on_nodes is not None:
            on_nodes(k)

    # taken before reading the file: a file that changes meanwhile is decoded again by the next load
    key = colcache.fingerprint(p) if decoder == "auto" and colcache.enabled() else None
    if key is not None and (raw := colcache.read(p, key)) is not None:
        tell(raw.node_id.shape[0])
        return raw
    data = read_trace_bytes(p)  # once, for whichever decoder reads it
    if decoder == "reference":
        raw = decode_reference(p, data)
        tell(raw.node_id.shape[0])
    else:
        # the vectorised decoder's padded copy, kept for the reference one: the bytes read are let go, not
        # held beside it (a 58 MiB rank was held twice while it was decoded)
        buf = TraceBytes(data)
        del data
        try:
            raw = decode_file(p, min_nodes=MIN_NODES if decoder == "auto" else 0, data=buf, on_batch=tell)
        except FastDecodeError:
            raw = decode_reference(p, buf.view)
            tell(max(raw.node_id.shape[0] - told[0], 0))  # the vectorised decoder's batches were counted
    if key is not None and raw.node_id.shape[0] >= MIN_NODES:
        colcache.write(p, key, raw)
    return raw


# ------------------------------------------------------------------------------------------ one rank


def _pick(raw: RawColumns, name: str, default: int) -> np.ndarray:
    return np.where(raw.attr_has[name], raw.attr_val[name], default)


#: Longest node and latest start we take, ns (2**50 ns: 13 days; 2**62 ns: the year 2116 as a Unix time):
#: past them a value is corrupt, and sums of such values overflow the simulator's int64 clock.
MAX_DUR_NS = 1 << 50
MAX_START_NS = 1 << 62


def _in_range(
    values: np.ndarray,
    lo: int,
    hi: int,
    what: str,
    *,
    default: int,
    sink: IssueLog,
    path: Path,
    rank: int,
    node_id: np.ndarray,
) -> np.ndarray:
    """``values`` with those outside ``[lo, hi]`` reported (``bad-attribute``, an error naming each node)
    and set to ``default``: a value a narrower column would wrap (``comm_src`` 2**32 read as rank 0, a
    ``comm_type`` of 260 as 4) or that no trace can mean (a negative duration)."""
    bad = np.flatnonzero((values < lo) | (values > hi))
    if not bad.size:
        return values

    def describe(k: int) -> tuple[int, str]:
        node = int(node_id[k])
        return node, f"{path}: rank {rank}: node {node}: {what} {int(values[k])} is out of range ({lo}..{hi})"

    _report(sink, "bad-attribute", bad, describe, path=path, rank=rank)
    out = values.copy()
    out[bad] = default
    return out


#: The most distinct ``skl_dtype`` names a trace may hold (torch has about 30 dtypes): their index per row
#: is an int8 (an int32 cost 8 MB of 32 GPU ranks' 2 M rows, kept through an ``analyze`` that reads none).
MAX_DTYPES = 127


def _dtype_codes(col: pa.Array, where: str) -> tuple[I8 | None, list[str]]:
    """The decoder's ``skl_dtype`` column as (index per row, -1 where null; the names), (None, []) where no
    row has one; more than :data:`MAX_DTYPES` names is a :class:`TraceFormatError` naming ``where``."""
    if col.null_count == len(col):
        return None, []
    words = [str(d) for d in col.dictionary.to_pylist()]
    if len(words) > MAX_DTYPES:
        raise TraceFormatError(
            f"{where}: {len(words):,} different skl_dtype names (a trace holds at most {MAX_DTYPES})"
        )
    return col.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int8), words


def _optional(raw: RawColumns, name: str) -> npt.NDArray[np.int64] | None:
    """An optional int64 column: the attribute's values (-1 where a row lacks it), None where none has it."""
    return _pick(raw, name, -1).astype(np.int64) if raw.attr_has[name].any() else None


#: Dependencies a node may list before its list is checked for repeats: a node of a real trace lists a
#: few (the op before it on its thread, its tensors' producers); one of a hostile file listed 50 M copies
#: of one id, which the deadlock check's lowering held as some 1.2 GB of edges.
REPEATS_CHECKED_ABOVE = 64


def _repeated_deps(
    dep_node: I64, dep_idx: I64, dep_kind: np.ndarray, n: int, counts: I64
) -> tuple[I64, I64, np.ndarray, I64, I64] | None:
    """The dependency columns with each node of more than :data:`REPEATS_CHECKED_ABOVE` dependencies
    listing each (of each kind) once, the rows of the nodes that listed one again, and how many entries each
    row so lost; None where none did (a normal trace: one count of the entries per row). A list is read in
    place (its entries are one slice, ctrl before data, from either decoder); its distinct ids are found by
    sorting it where it is shorter than a sixteenth of the rank's rows, else by marking the rows it names
    (memory: the smaller of the two, never a copy of 50 M entries). ``counts``: each row's entries."""
    heavy = np.flatnonzero(counts > REPEATS_CHECKED_ABOVE)
    if heavy.size == 0:
        return None
    ends = np.cumsum(counts)  # the entries are by row, ctrl (0) before data (1): a row's are one slice
    pieces: list[tuple[I64, I64, np.ndarray]] = []
    dropped = np.zeros(n, dtype=np.int64)
    at = 0
    for r in heavy.tolist():
        lo, hi = int(ends[r] - counts[r]), int(ends[r])
        pieces.append((dep_node[at:lo], dep_idx[at:lo], dep_kind[at:lo]))
        mid = lo + int(np.searchsorted(dep_kind[lo:hi], DEP_DATA))
        for a, b, kind in ((lo, mid, DEP_CTRL), (mid, hi, DEP_DATA)):
            if a == b:
                continue
            if 16 * (b - a) < n:
                distinct = np.unique(dep_idx[a:b])
            else:
                seen = np.zeros(n, dtype=np.bool_)
                seen[dep_idx[a:b]] = True
                distinct = np.flatnonzero(seen)
                del seen
            size = distinct.size
            pieces.append((np.full(size, r, np.int64), distinct, np.full(size, kind, dep_kind.dtype)))
            dropped[r] += (b - a) - size
        at = hi
    if not dropped.any():
        return None
    pieces.append((dep_node[at:], dep_idx[at:], dep_kind[at:]))
    nodes, idxs, kinds = zip(*pieces, strict=True)
    rows = np.flatnonzero(dropped)
    return np.concatenate(nodes), np.concatenate(idxs), np.concatenate(kinds), rows, dropped


#: The most members an all_to_all's split list may name (a larger one is corrupt).
MAX_SPLITS = 1 << 17
#: The issue kind of an all_to_all node whose splits are inconsistent (a lenient load drops them).
SPLITS_KIND = "corrupt-splits"


def _splits(
    raw: RawColumns,
    path: Path,
    rank: int,
    node_id: np.ndarray,
    node_name: Callable[[int], str],
    *,
    sink: IssueLog,
    lenient: bool,
) -> tuple[I64 | None, I64 | None, I64 | None, I64]:
    """``RankTrace``'s split columns (``split_ptr``, ``split_send_bytes``, ``split_recv_bytes``; all None
    where no node carries splits), and the rows whose splits were dropped.

    A node whose lists disagree in length, hold a negative value, name more than ``MAX_SPLITS`` members, or
    whose sums do not hold its ``skl_send_bytes`` / ``skl_recv_bytes`` plus one chunk of its own is
    inconsistent. A strict load refuses the rank (:class:`TraceFormatError` naming the first such node); a
    lenient one drops that node's splits (a warning and a :class:`DroppedSplits` each), a collecting one
    (``skewlens check``) likewise but with an error each."""
    send = raw.attr_lists.get(Attr.SEND_SPLITS)
    recv = raw.attr_lists.get(Attr.RECV_SPLITS)
    none = np.empty(0, np.int64)
    if send is None and recv is None:
        return None, None, None, none
    n = raw.node_id.shape[0]
    (s_row, s_val), (r_row, r_val) = send or (none, none), recv or (none, none)
    s_count = np.bincount(s_row, minlength=n)
    r_count = np.bincount(r_row, minlength=n)
    negative = np.zeros(n, dtype=np.bool_)
    negative[s_row[s_val < 0]] = True
    negative[r_row[r_val < 0]] = True
    unsummed: list[np.ndarray] = []
    for row, val, total in ((s_row, s_val, Attr.SEND_BYTES), (r_row, r_val, Attr.RECV_BYTES)):
        # the chunk a node keeps (its list's sum less the total to the others) must be one of its entries
        own = np.bincount(row, weights=val, minlength=n).astype(np.int64) - raw.attr_val[total]
        listed = np.zeros(n, dtype=np.bool_)
        listed[row[val == own[row]]] = True
        unsummed.append((np.maximum(s_count, r_count) > 0) & (~raw.attr_has[total] | ~listed))
    bad = (s_count != r_count) | (s_count > MAX_SPLITS) | negative | unsummed[0] | unsummed[1]
    where = np.flatnonzero(bad)
    if where.size == 0:
        return (*_without_splits(n, (s_row, s_val), (r_row, r_val), none), none)

    def reason(i: int) -> str:
        if s_count[i] != r_count[i]:
            return f"lengths differ ({s_count[i]} and {r_count[i]} entries)"
        if s_count[i] > MAX_SPLITS:
            return f"{s_count[i]} entries, more than {MAX_SPLITS}"
        if negative[i]:
            return "a negative size"
        lists, totals = (Attr.SEND_SPLITS, Attr.RECV_SPLITS), (Attr.SEND_BYTES, Attr.RECV_BYTES)
        k = 0 if unsummed[0][i] else 1
        rows, vals = (s_row, s_val) if k == 0 else (r_row, r_val)
        total = (
            f"{totals[k]} {raw.attr_val[totals[k]][i]}" if raw.attr_has[totals[k]][i] else f"no {totals[k]}"
        )
        return f"{lists[k]} sums to {int(vals[rows == i].sum())} B, not {total} plus one of its entries"

    def message(i: int) -> str:
        return (
            f"{path}: rank {rank}: node {node_id[i]} ({node_name(i)}) at byte offset {raw.msg_offset[i]} has "
            f"corrupt all_to_all splits: {reason(i)} (each list holds at most {MAX_SPLITS} entries, of equal "
            f"lengths, no negative bytes, and sums to {Attr.SEND_BYTES} / {Attr.RECV_BYTES} plus its own "
            "chunk)"
        )

    _refuse_or_drop(sink, where, node_id, reason, message, path=str(path), rank=rank, lenient=lenient)
    return (*_without_splits(n, (s_row, s_val), (r_row, r_val), where), where)


def _refuse_or_drop(
    sink: IssueLog,
    rows: I64,
    node_id: np.ndarray,
    reason: Callable[[int], str],
    message: Callable[[int], str],
    *,
    path: str,
    rank: int,
    lenient: bool,
) -> None:
    """All_to_all nodes ``rows`` of one rank whose splits are inconsistent: a strict load refuses the rank
    (:class:`TraceFormatError` with the first node's ``message``); otherwise each is a
    :class:`DroppedSplits` and an issue (a warning when ``lenient``, an error for ``skewlens check``); the
    caller drops the splits (:func:`_without_splits`)."""
    if sink.strict and not lenient:
        more = f", and {rows.size - 1} other node(s)" if rows.size > 1 else ""
        raise TraceFormatError(message(int(rows[0])) + more)
    for i in rows.tolist():
        sink.drop_splits(DroppedSplits(file=path, rank=rank, node_id=int(node_id[i]), reason=reason(i)))
    _report(
        sink,
        SPLITS_KIND,
        rows,
        lambda i: (int(node_id[i]), message(i) + ("; its splits dropped (lenient)" if lenient else "")),
        path=Path(path),
        rank=rank,
        severity=Severity.WARNING if lenient else Severity.ERROR,
    )


def _without_splits(
    n: int, send: tuple[I64, I64], recv: tuple[I64, I64], rows: I64
) -> tuple[I64 | None, I64 | None, I64 | None]:
    """The split columns (``split_ptr``, ``split_send_bytes``, ``split_recv_bytes``) of ``n`` rows from the
    send and recv values ``(row of each value, value)``, by row, with rows ``rows`` emptied; all None where
    no row keeps any."""
    (s_row, s_val), (r_row, r_val) = send, recv
    dropped = np.zeros(n, dtype=np.bool_)
    dropped[rows] = True
    s_keep = ~dropped[s_row]
    if not s_keep.any():
        return None, None, None
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(s_row[s_keep], minlength=n), out=ptr[1:])
    return ptr, s_val[s_keep].astype(np.int64), r_val[~dropped[r_row]].astype(np.int64)


def _report(
    sink: IssueLog,
    kind: str,
    idx: np.ndarray,
    describe: Callable[[int], tuple[int, str]],
    *,
    path: Path,
    rank: int,
    severity: Severity = Severity.ERROR,
) -> None:
    """One issue per index (the first ``MAX_REPORTED``), then one that counts the rest."""
    for i in idx[:MAX_REPORTED].tolist():
        node, msg = describe(i)
        sink.add(severity, kind, msg, file=str(path), rank=rank, node=node)
    if idx.shape[0] > MAX_REPORTED:
        rest = idx.shape[0] - MAX_REPORTED
        sink.add(severity, kind, f"{path}: rank {rank}: ... and {rest} more {kind} problem(s)", rank=rank)


def _interpret(
    raw: RawColumns,
    path: Path,
    rank: int,
    *,
    pg_names: list[str],
    pg_found: dict[str, ProcessGroupInfo] | None,
    sink: IssueLog,
    lenient: bool = False,
) -> RankTrace:
    written_for = read_metadata(raw.global_metadata, path).get("rank")
    if isinstance(written_for, int) and written_for != rank:  # traces of other tools carry no rank
        raise TraceFormatError(
            f"{path}: holds rank {written_for}'s trace (its GlobalMetadata says so), not rank {rank}'s: "
            "a file copied or renamed?"
        )
    n = raw.node_id.shape[0]
    node_id = raw.node_id.view(np.int64)
    names: list[str] = raw.names.dictionary.to_pylist()
    name_idx = raw.names.indices.to_numpy(zero_copy_only=False).astype(np.int32)

    def node_at(i: int) -> str:
        """``RUN/rank-0.et: rank 0: node 7 (aten::mm) at byte offset 120``: row ``i``, as issues name it."""
        where = f"at byte offset {raw.msg_offset[i]}"
        return f"{path}: rank {rank}: node {node_id[i]} ({names[name_idx[i]]}) {where}"

    bad_type = np.flatnonzero((raw.node_type < NodeType.METADATA) | (raw.node_type > NodeType.COMM_COLL))
    _report(
        sink,
        "unknown-node-type",
        bad_type,
        lambda i: (int(node_id[i]), f"{node_at(i)} has unknown node type {raw.node_type[i]}"),
        path=path,
        rank=rank,
    )
    node_type = np.where(
        (raw.node_type >= 0) & (raw.node_type <= NodeType.COMM_COLL), raw.node_type, NodeType.INVALID
    ).astype(np.int8)

    if pg_found is not None:
        bad_meta: dict[int, str] = {}  # row: why its process-group node is malformed
        for row, msg in raw.metadata_msgs:
            node = pb.Node()
            try:
                node.ParseFromString(msg)
            except DecodeError as e:  # the vectorised decoder keeps metadata nodes whole, unparsed
                raise TraceFormatError(
                    f"{path}: rank {rank}: metadata node {node_id[row]} at byte offset {raw.msg_offset[row]} "
                    f"cannot be parsed ({e})"
                ) from None
            if node.name == PG_INIT_NODE_NAME:
                try:
                    pg_found.update(parse_pg_init(node.inputs.values, path))
                except ValidationError as e:
                    bad_meta[row] = str(e)
        rows = np.fromiter(bad_meta, dtype=np.int64, count=len(bad_meta))
        _report(sink, "bad-metadata", rows, lambda i: (int(node_id[i]), bad_meta[i]), path=path, rank=rank)

    # rows by node id: duplicates and dangling dependencies
    ascending = n < 2 or bool((node_id[1:] > node_id[:-1]).all())  # the usual case: no sort needed
    order = np.arange(n) if ascending else np.argsort(node_id, kind="stable")
    sorted_ids = node_id[order]
    dup_pos = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    _report(
        sink,
        "duplicate-node-id",
        dup_pos,
        lambda k: (
            int(sorted_ids[k]),
            (
                f"{path}: rank {rank}: duplicate node id {sorted_ids[k]} "
                f"(rows {order[k]} and {order[k + 1]}, "
                f"byte offsets {raw.msg_offset[order[k]]} and {raw.msg_offset[order[k + 1]]})"
            ),
        ),
        path=path,
        rank=rank,
    )
    dep_id = raw.dep_id.view(np.int64)
    # a file's dependency lists can be most of its bytes, a value in a byte: these columns work in place
    pos = np.searchsorted(sorted_ids, dep_id)
    found = pos < n
    np.minimum(pos, max(n - 1, 0), out=pos)
    if n:
        found &= sorted_ids[pos] == dep_id
    missing = np.flatnonzero(~found)
    _report(
        sink,
        "dangling-dependency",
        missing,
        lambda k: (
            int(node_id[raw.dep_node[k]]),
            (
                f"{path}: rank {rank}: node {node_id[raw.dep_node[k]]} ({names[name_idx[raw.dep_node[k]]]}) "
                f"depends on node {dep_id[k]}, which does not exist (dangling dependency)"
            ),
        ),
        path=path,
        rank=rank,
    )
    launched_in: npt.NDArray[np.int32] | None = None
    inside_id = _optional(raw, "skl_launched_in")
    if inside_id is not None:  # a node id: the row of that node, -1 where it names none
        named = np.flatnonzero(inside_id >= 0)
        lpos = np.minimum(np.searchsorted(sorted_ids, inside_id[named]), max(n - 1, 0))
        ok = sorted_ids[lpos] == inside_id[named]

        def launched_in_nothing(k: int) -> tuple[int, str]:
            inside = raw.attr_val["skl_launched_in"][k]
            what = f"node {node_id[k]} ({names[name_idx[k]]}) was launched inside node {inside}"
            return int(node_id[k]), f"{path}: rank {rank}: {what} (skl_launched_in), which does not exist"

        _report(sink, "dangling-dependency", named[~ok], launched_in_nothing, path=path, rank=rank)
        launched_in = np.full(n, -1, dtype=np.int32)  # rows of a rank: < 2**31
        launched_in[named[ok]] = order[lpos[ok]]
    dep_node = raw.dep_node
    dep_idx = (pos if ascending else order[pos]).astype(np.int64, copy=False)
    del pos
    dep_kind = raw.dep_kind.astype(np.int8, copy=False)
    if missing.size:  # dangling dependencies are dropped
        dep_node, dep_idx, dep_kind = dep_node[found], dep_idx[found], dep_kind[found]
    del found
    counts = np.bincount(dep_node, minlength=n)  # each row's entries (also its slice of them, below)
    repeats = _repeated_deps(dep_node, dep_idx, dep_kind, n, counts)
    if repeats is not None:
        dep_node, dep_idx, dep_kind, rows, dropped = repeats
        counts = np.bincount(dep_node, minlength=n)
        _report(
            sink,
            "repeated-dependency",
            rows,
            lambda k: (
                int(node_id[k]),
                f"{node_at(k)} lists {dropped[k]:,} dependencies again (read once each)",
            ),
            path=path,
            rank=rank,
            severity=Severity.WARNING,
        )
    dep_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=dep_ptr[1:])
    del counts

    # process groups: map this file's dictionary onto the run's
    pg_ix = {g: i for i, g in enumerate(pg_names)}
    mapping = []
    for g in raw.pg_name.dictionary.to_pylist():
        if g not in pg_ix:
            pg_ix[g] = len(pg_names)
            pg_names.append(g)
        mapping.append(pg_ix[g])
    pg_codes = raw.pg_name.indices.to_numpy(zero_copy_only=False)
    pg_valid = ~np.asarray(raw.pg_name.indices.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    pg = np.full(n, -1, dtype=np.int32)
    if mapping:
        pg[pg_valid] = np.asarray(mapping, dtype=np.int32)[pg_codes[pg_valid].astype(np.int64)]

    is_coll = node_type == NodeType.COMM_COLL
    is_p2p = (node_type == NodeType.COMM_SEND) | (node_type == NodeType.COMM_RECV)
    comm_bytes = np.where(
        raw.attr_has["comm_size"],
        raw.attr_val["comm_size"],
        np.where(is_p2p & raw.attr_has["tensor_size"], raw.attr_val["tensor_size"], 0),
    )
    notes: list[str] = []
    has_ns = raw.attr_has["skl_start_ns"]
    untimed = bool(n and not has_ns.any() and not raw.start_us.any())
    split_ptr, split_send, split_recv, dropped = _splits(
        raw, path, rank, node_id, lambda i: names[name_idx[i]], sink=sink, lenient=lenient
    )
    send_bytes, recv_bytes = _optional(raw, "skl_send_bytes"), _optional(raw, "skl_recv_bytes")
    for col in (send_bytes, recv_bytes):
        if col is not None:
            col[dropped] = -1  # as a node that recorded no splits: an even all_to_all
    checked = functools.partial(_in_range, sink=sink, path=path, rank=rank, node_id=node_id)
    i32 = np.iinfo(np.int32)
    start_ns = checked(
        np.where(has_ns, raw.attr_val["skl_start_ns"], raw.start_us * 1000), 0, MAX_START_NS, "start (ns)",
        default=0,
    )  # fmt: skip
    dur_ns = checked(
        np.where(raw.attr_has["skl_dur_ns"], raw.attr_val["skl_dur_ns"], raw.dur_us * 1000), 0, MAX_DUR_NS,
        "duration (ns)", default=0,
    )  # fmt: skip
    if untimed:
        start_ns = _end_to_end(dur_ns, notes)
    coll_type = np.where(is_coll & raw.attr_has["comm_type"], raw.attr_val["comm_type"], -1)
    dtype_idx, dtypes = _dtype_codes(raw.dtype, f"{path}: rank {rank}")
    return RankTrace(
        rank=rank,
        path=str(path),
        node_id=node_id.copy(),
        node_type=node_type,
        name_idx=name_idx,
        names=names,
        start_ns=start_ns,
        dur_ns=dur_ns,
        stream=_pick(raw, "stream", 0).astype(np.int64),
        step=checked(_pick(raw, "skl_step", -1), -1, int(i32.max), "skl_step", default=-1).astype(np.int32),
        comm_type=checked(coll_type, -1, 127, "comm_type", default=-1).astype(np.int8),
        comm_bytes=comm_bytes.astype(np.int64),
        pg=pg,
        seq=_pick(raw, "skl_seq", -1).astype(np.int64),
        src=checked(_pick(raw, "comm_src", -1), -1, int(i32.max), "comm_src", default=-1).astype(np.int32),
        dst=checked(_pick(raw, "comm_dst", -1), -1, int(i32.max), "comm_dst", default=-1).astype(np.int32),
        tag=_pick(raw, "comm_tag", 0).astype(np.int64),
        batch=_optional(raw, "skl_batch"),
        send_bytes=send_bytes,
        recv_bytes=recv_bytes,
        launch_ns=_optional(raw, "skl_launch_ns"),
        launched_in=launched_in,
        return_ns=None if untimed else _optional(raw, "skl_return_ns"),  # laid end to end: no call times
        dtype_idx=dtype_idx,
        dtypes=dtypes,
        split_ptr=split_ptr,
        split_send_bytes=split_send,
        split_recv_bytes=split_recv,
        is_cpu=_host_op(raw),
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        dep_kind=dep_kind,
        notes=notes,
        untimed=untimed,
    )


def _end_to_end(dur_ns: npt.NDArray[np.int64], notes: list[str]) -> npt.NDArray[np.int64]:
    """Start times for a trace that records none: its nodes one after the other in file order, each
    starting where the one before it ended (at 0 they would all start together, every node nested inside
    the first and its dependencies dropped); notes what was done."""
    total = float(np.sum(dur_ns, dtype=np.float64))
    if total > MAX_START_NS:
        notes.append(f"{NO_START_TIMES} (start_ns kept at 0: its durations sum past 2^62 ns)")
        return np.zeros_like(dur_ns)
    notes.append(f"{NO_START_TIMES}: its nodes laid end to end in file order, from their durations")
    start = np.zeros_like(dur_ns)
    np.cumsum(dur_ns[:-1], out=start[1:])
    return start


def load_rank(
    path: str | Path,
    rank: int,
    pg_names: list[str],
    pg_found: dict[str, ProcessGroupInfo] | None = None,
    *,
    sink: IssueLog | None = None,
    decoder: Decoder = "auto",
    raw: RawColumns | None = None,
    lenient: bool = False,
    steps: Mapping[int, tuple[int, int]] | None = None,
) -> RankTrace:
    """Decode one rank's ``.et`` into columns. ``pg_names`` is extended with groups first seen here.

    Without ``sink`` the first problem raises :class:`ValidationError` (:class:`TraceFormatError` for an
    all_to_all's inconsistent splits); with one, problems are collected there and the trace is returned
    with dangling dependencies and inconsistent splits dropped. ``lenient``: inconsistent splits are
    dropped with a warning (``sink.dropped_splits`` names each node), strict sink or not. ``raw``: the
    file's columns, already decoded. ``steps``: the rank's steps as its run's manifest records them
    (:func:`captured_steps`): a trace none of whose nodes of those steps ran in them is another run's, a
    :class:`TraceFormatError`.
    """
    p = Path(path)
    raw = decode(p, decoder=decoder) if raw is None else raw
    rt = _interpret(
        raw,
        p,
        rank,
        pg_names=pg_names,
        pg_found=pg_found,
        sink=sink or IssueLog(strict=True),
        lenient=lenient,
    )
    _refuse_another_runs(rt, steps or {})
    return rt


def captured_steps(manifest: Manifest) -> dict[int, dict[int, tuple[int, int]]]:
    """Rank -> its steps in ``manifest`` -> their (start, end) ns, of the steps that have a span, where the
    run's ranks marked them as they ran (none of an import: its steps are read from the same files, and a
    step's GPU work may lie wholly outside the span it is given, the step before the profiler started)."""
    spans: dict[int, dict[int, tuple[int, int]]] = {}
    if manifest.source == "import":
        return spans
    for span in manifest.steps:
        if span.end_ns > span.start_ns:
            spans.setdefault(span.rank, {})[span.step] = (span.start_ns, span.end_ns)
    return spans


def parse_pg_init(values: str, path: Path) -> dict[str, ProcessGroupInfo]:
    """Process groups from a ``## process_group:init ##`` metadata node (PyTorch's JSON list form, bare, in a
    JSON list or in the Python-printed list Chakra's converter writes)."""
    try:
        return dict(_parse_pg_init(values))
    except PG_INIT_ERRORS as e:
        raise ValidationError(
            f"{path}: malformed process-group metadata node ({pg_init_problem(e)})"
        ) from None


def _python_printed(values: str) -> Any:
    """The list Chakra's converter writes as Python prints it (``str(["[{...}]"])``), read back as Python
    wrote it: ASTRA-sim drops the two characters at each end instead, which keeps the escapes the printing
    added (a ``\\'`` in a group's description, the doubled backslash of a ``\\u00e9``)."""
    try:
        return ast.literal_eval(values)
    except SyntaxError as e:  # (a ValueError passes through: the caller names both)
        raise ValueError(f"not a Python-printed list: {e.msg}") from None


@functools.lru_cache(maxsize=8)
def _parse_pg_init(values: str) -> tuple[tuple[str, ProcessGroupInfo], ...]:
    # every rank of a run carries the same node: parsed once per load, not once per rank (a world group of
    # 1,024 ranks in each of 1,024 files is a million integers); failures are not cached
    if values.startswith("['") and values.endswith("']"):
        data = _python_printed(values)
    else:
        data = json.loads(values) if values else []
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], str):
        data = json.loads(data[0])  # PyTorch host ETs wrap the JSON string in a list
    out: dict[str, ProcessGroupInfo] = {}
    for g in data:
        info = pg_init_group(g)
        out[info.name] = info
    return tuple(out.items())


# ------------------------------------------------------------------------------------------ the run


def assign_defaults(
    rt: RankTrace, pg_names: list[str], groups: dict[str, ProcessGroupInfo], world: tuple[int, ...]
) -> None:
    """World group for collectives naming none; file-order sequence numbers where ``skl_seq`` is absent."""
    coll = rt.node_type == NodeType.COMM_COLL
    no_pg = coll & (rt.pg < 0)
    if no_pg.any():
        if WORLD_PG not in pg_names:
            pg_names.append(WORLD_PG)
        if WORLD_PG not in groups:
            groups[WORLD_PG] = ProcessGroupInfo(name=WORLD_PG, ranks=world, desc="world (assumed)")
        rt.pg[no_pg] = pg_names.index(WORLD_PG)
        rt.notes.append(f"{int(no_pg.sum())} collective(s) name no process group: assumed world-wide")
    no_seq = coll & (rt.seq < 0)
    if no_seq.any():
        rows = np.flatnonzero(coll)
        g = rt.pg[rows].astype(np.int64)
        order = np.argsort(g, kind="stable")
        gs = g[order]
        first = np.searchsorted(gs, gs, side="left")
        within = np.empty_like(order)
        within[order] = np.arange(order.shape[0]) - first
        fill = no_seq[rows]
        rt.seq[rows[fill]] = within[fill]
        rt.notes.append(
            f"{int(no_seq.sum())} collective(s) carry no {Attr.SEQ}: numbered per group in file order"
        )


def iter_ranks(
    files: RunFiles,
    pg_names: list[str],
    pg_found: dict[str, ProcessGroupInfo],
    sink: IssueLog,
    *,
    progress: Progress | None = NO_PROGRESS,
    left_out: dict[int, str] | None = None,
    decoder: Decoder = "auto",
) -> Iterator[RankTrace]:
    """Load ranks one at a time (missing and unreadable files go to ``sink``; where ``left_out`` is given,
    as warnings, and the rank with why into ``left_out``: a lenient load goes on without it; it also drops
    an all_to_all's inconsistent splits, into ``sink.dropped_splits``, rather than the rank).

    The next files are decoded (or read from the column cache) on other threads meanwhile, at most a few
    ahead: the decoder works in numpy with the GIL released. Each rank is interpreted here, in rank order,
    so issues and group names come in the same order as from a load on one thread.
    """
    progress = given(progress)
    items = sorted(files.files.items())
    # two bars: ranks as they are interpreted here, and nodes as the threads decode them (a batch at a
    # time: a run of two 60 MB ranks spent 20 s at 0/2 ranks)
    with (
        progress.task("loading ranks", len(items)) as advance,
        progress.task("decoding nodes", None) as nodes,
    ):
        decoded = ordered_map(
            functools.partial(_decoded, decoder=decoder, on_nodes=nodes),
            [f for _, f in items],
            workers=default_workers(),
        )
        # closed here when a rank raises: left suspended, its thread pool was shut down by whichever thread
        # the garbage collector ran on, which could deadlock starting a thread
        with contextlib.closing(decoded):
            yield from _interpret_ranks(
                items,
                decoded,
                advance,
                pg_names=pg_names,
                pg_found=pg_found,
                sink=sink,
                left_out=left_out,
                spans=captured_steps(files.manifest),
            )
    release_free_memory()  # what the decoding threads freed, before the analyses allocate their own


def _interpret_ranks(
    items: list[tuple[int, Path]],
    decoded: Iterator[RawColumns | TraceFormatError | None],
    advance: Advance,
    *,
    pg_names: list[str],
    pg_found: dict[str, ProcessGroupInfo],
    sink: IssueLog,
    left_out: dict[int, str] | None,
    spans: Mapping[int, Mapping[int, tuple[int, int]]],
) -> Iterator[RankTrace]:
    """:func:`iter_ranks`' ranks, interpreted in rank order from their decoded columns."""
    for (r, f), raw in zip(items, decoded, strict=True):
        advance(0, description=f"loading {f.name}")
        if raw is None:
            _unreadable(
                sink,
                left_out,
                "missing-rank",
                f"{f}: rank {r} is listed but its trace file is missing",
                f=f,
                r=r,
            )
        else:
            try:
                if isinstance(raw, TraceFormatError):
                    raise raw
                yield load_rank(
                    f,
                    r,
                    pg_names,
                    pg_found,
                    sink=sink,
                    raw=raw,
                    lenient=left_out is not None,
                    steps=spans.get(r),
                )
            except TraceFormatError as e:
                if sink.strict and left_out is None:
                    raise
                _unreadable(sink, left_out, "corrupt-trace", str(e), f=f, r=r)
        advance()


#: What the refusal of a rank file of another run says of it (:func:`_refuse_another_runs`), by which the
#: lenient remedy tells such a rank from an unreadable one.
ANOTHER_RUNS = "trace is not this run's"
#: How far from the manifest's steps (and at least their whole span) a rank's nodes ran for its file to be
#: refused as another run's: closer, the steps' marks may just disagree with the nodes' times.
_ANOTHER_RUN_APART_NS = 1_000_000_000


def _refuse_another_runs(rt: RankTrace, spans: Mapping[int, tuple[int, int]]) -> None:
    """Refuse (:class:`TraceFormatError`) a rank trace that is not the one its run's manifest was written
    from: none of its nodes of the steps the manifest records for the rank ran inside those steps' spans (a
    rank file of another capture or run copied in, whose steps ran at other times). ``spans``: the rank's
    steps in the manifest, step -> (start, end) ns. A trace without start times, or without nodes of those
    steps, says nothing either way."""
    if not spans or rt.untimed or len(rt) == 0:
        return
    steps = np.fromiter(spans, dtype=np.int64, count=len(spans))
    tagged = np.flatnonzero(np.isin(rt.step, steps))
    if tagged.size == 0:
        return
    lo = np.array([spans[int(s)][0] for s in rt.step[tagged]], dtype=np.int64)
    hi = np.array([spans[int(s)][1] for s in rt.step[tagged]], dtype=np.int64)
    start, end = rt.start_ns[tagged], rt.end_ns[tagged]
    if ((start < hi) & (end > lo)).any():
        return
    first, last = min(a for a, _ in spans.values()), max(b for _, b in spans.values())
    ran_from, ran_to = int(start.min()), int(end.max())
    # apart from the steps by more than a second and more than their whole span: a mark that ends before
    # its op does (a profiler's step annotation), or a node of one step run in the next, is this run's
    apart_ns = max(_ANOTHER_RUN_APART_NS, last - first)
    if ran_from - last >= apart_ns:
        away = f"they ran {(ran_from - last) / 1e9:.3f} s after them"
    elif first - ran_to >= apart_ns:
        away = f"they ran {(first - ran_to) / 1e9:.3f} s before them"
    else:
        return
    raise TraceFormatError(
        f"{rt.path}: rank {rt.rank}'s {ANOTHER_RUNS}: none of its {tagged.size} node(s) of steps "
        f"{int(steps.min())}-{int(steps.max())} ran in those steps as the manifest records them for rank "
        f"{rt.rank}; {away}: a trace of another run or capture copied in?"
    )


def _decoded(
    f: Path, *, decoder: Decoder = "auto", on_nodes: Callable[[int], None] | None = None
) -> RawColumns | TraceFormatError | None:
    """``f``'s columns, or why it cannot be decoded (None: there is no such file)."""
    if not f.exists():
        return None
    try:
        return decode(f, decoder=decoder, on_nodes=on_nodes)
    except TraceFormatError as e:
        return e


def _unreadable(
    sink: IssueLog, left_out: dict[int, str] | None, kind: str, why: str, *, f: Path, r: int
) -> None:
    """A rank whose trace is missing or unreadable: an error, or (lenient) a warning and the rank left out."""
    if left_out is None:
        sink.error(kind, why, file=str(f), rank=r)
    else:
        left_out[r] = why
        sink.warning(kind, f"{why}; rank {r} left out (lenient)", file=str(f), rank=r)


def missing_rank_issues(files: RunFiles, sink: IssueLog) -> None:
    """One issue for all ranks without a trace (``126 of 128 ranks have no trace: 2-127``), one for the ranks
    missing from the manifest: a warning where the manifest says so, an error for a gap in the numbering;
    and a warning for a capture's ``rank-*.et`` without its manifest."""
    m = files.manifest
    if CAPTURE_PARTS_NOTE in m.notes:
        sink.warning(
            "no-manifest",
            f"{m.notes[CAPTURE_PARTS_NOTE]}; {CAPTURE_PARTS_ADVICE}: until then clock offsets, step marks, "
            "process groups and the capture's notes are not known, and the world size is guessed from the "
            "file names",
        )
    elif not files.has_manifest and any(_OURS_RE.match(f.name) for f in files.files.values()):
        sink.warning(
            "no-manifest",
            f"{files.root}: rank-*.et without manifest.json, which skewlens profile writes once its command "
            "ends (a capture interrupted before that?): clock offsets, step marks, process groups and the "
            "capture's notes are not known; the world size is guessed from the file names",
        )
    capture_note_issues(m, sink)
    copied = _other_hosts_traces_here(files)
    if copied:
        one = copied[0] if len(copied) == 1 else None
        sink.warning("missing-rank", _copied_here(files, copied), rank=one)
    if rest := tuple(r for r in m.missing_ranks if r not in copied):
        why = _why_missing(dataclasses.replace(m, missing_ranks=rest))
        source = "the manifest says so" if files.has_manifest else "gap in the rank numbering"
        sink.add(
            Severity.WARNING if files.has_manifest else Severity.ERROR,
            "missing-rank",
            _no_trace(files, rest, why, source),
            rank=rest[0] if len(rest) == 1 else None,
        )
    unlisted = sorted(set(range(m.world_size)) - set(m.ranks) - set(m.missing_ranks))
    if unlisted:
        if len(unlisted) == 1:
            text, one = f"rank {unlisted[0]} of {m.world_size} is", unlisted[0]
        else:
            text, one = f"ranks {rank_ranges(unlisted)} of {m.world_size} are", None
        sink.error("missing-rank", f"{files.root}: {text} not in the manifest", rank=one)


def _other_hosts_traces_here(files: RunFiles) -> list[int]:
    """The ranks that the manifest, a host's of a multi-host job, lists as another host's
    (:data:`OTHER_HOST_NOTE`) whose traces are in the directory all the same: the hosts' directories
    copied into one, the manifest the last one copied (their ranks were read as missing: 'no trace here')."""
    m = files.manifest
    if not files.has_manifest:
        return []
    return [
        r
        for r in m.missing_ranks
        if m.notes.get(f"rank {r}", "").startswith(OTHER_HOST_NOTE) and rank_file(files.root, r).is_file()
    ]


def _copied_here(files: RunFiles, copied: list[int]) -> str:
    """``RUN: rank 0 left out although RUN/rank-0.et is here: ...``: the ranks of
    :func:`_other_hosts_traces_here`, and the merge that makes one run of them."""
    traces = first_named(rank_file(files.root, r) for r in copied)
    return (
        f"{files.root}: {ranks_label(copied)} left out although {traces} "
        f"{'is' if len(copied) == 1 else 'are'} here: {files.root / MANIFEST_NAME} is that of a host which "
        f"saved none of them ('{OTHER_HOST_NOTE}'): the hosts' directories copied into one? "
        f"`skewlens merge --out NEW_RUN {path_word(files.root)}` makes one run of them"
    )


def _why_missing(m: Manifest) -> str:
    """The manifest's notes on missing ranks, each once with the ranks it applies to (less the ``no trace:``
    a capture's note starts with: the line it ends says so)."""
    by_note = {note.removeprefix("no trace: "): rs for note, rs in m.missing_by_note().items() if note}
    if len(by_note) == 1 and len(next(iter(by_note.values()))) == len(m.missing_ranks):
        return next(iter(by_note))
    return "; ".join(f"{rank_ranges(rs)}: {note}" for note, rs in by_note.items())


def _no_trace(files: RunFiles, ranks: tuple[int, ...], why: str, source: str) -> str:
    """``RUN: rank 1 of 2 has no trace (the manifest says so): the process crashed or was killed before saving
    (the command exited with code 1)``: the manifest's notes after the line, not nested in its brackets."""
    text = f"{files.root}: {no_trace_line(ranks, files.manifest.world_size)} ({source})"
    return f"{text}: {why}" if why else text


def load_run(
    run_dir: str | Path,
    *,
    match: bool = True,
    progress: Progress | None = NO_PROGRESS,
    sink: IssueLog | None = None,
    lenient: bool = False,
    decoder: Decoder = "auto",
) -> RunTrace:
    """Load a run (see the module docstring for the layouts) and match its communication.

    ``progress`` is told of each rank loaded. Without ``sink`` the first inconsistency raises
    :class:`ValidationError`; :func:`skewlens.profiler.store.validate.validate_run` passes a collecting sink
    instead. ``lenient``: communication whose members disagree across ranks is a warning, not an error, and
    is left unmatched (``RunTrace.skipped_comm`` says what and why); its nodes synchronise with no one; a
    rank whose trace is missing or unreadable is left out (``RunTrace.left_out_ranks``); an all_to_all
    node whose splits are inconsistent keeps its rank and loses its splits (``RunTrace.dropped_splits``).
    ``decoder``: see :func:`decode` (an explicit one decodes every file, column cache or not).
    """
    files = locate_run(run_dir)
    sink = sink if sink is not None else IssueLog(strict=True)
    manifest = files.manifest
    pg_names: list[str] = [g.name for g in manifest.process_groups]
    pg_found: dict[str, ProcessGroupInfo] = {}
    left_out: dict[int, str] | None = {} if lenient else None
    ranks = {
        rt.rank: rt
        for rt in iter_ranks(
            files, pg_names, pg_found, sink, progress=progress, left_out=left_out, decoder=decoder
        )
    }
    # a group PyTorch lists with no ranks spans the world
    groups = with_world_ranks(
        {**pg_found, **{g.name: g for g in manifest.process_groups}}, manifest.world_size
    )
    world = tuple(range(manifest.world_size))
    for rt in ranks.values():
        assign_defaults(rt, pg_names, groups, world)
    if not files.has_manifest:
        manifest = dataclasses.replace(manifest, process_groups=tuple(groups.values()))
    if left_out:  # from here on, ranks without a trace
        manifest = dataclasses.replace(
            manifest,
            ranks=tuple(r for r in manifest.ranks if r not in left_out),
            missing_ranks=tuple(sorted({*manifest.missing_ranks, *left_out})),
        )
    run = RunTrace(
        run_dir=str(files.root),
        manifest=manifest,
        ranks=ranks,
        pg_names=pg_names,
        process_groups=groups,
        left_out_ranks=tuple(sorted((left_out or {}).items())),
        dropped_splits=tuple(sink.dropped_splits),
    )
    missing_rank_issues(files, sink)
    if match:
        comm = {r: CommRows.of(rt, step_mark_stream(manifest)) for r, rt in ranks.items()}
        comm, run.incomplete_steps = matchable(comm, manifest, groups, pg_names, sink)
        missing = frozenset(manifest.missing_ranks) | (frozenset(manifest.ranks) - frozenset(ranks))
        run.collectives = match_instances(
            comm, pg_names, groups, sink, missing_ranks=missing, lenient=lenient
        )
        run.steps_differ = next((i.message for i in sink.issues if i.kind == STEP_MISMATCH), "")
        run.p2p = match_pairs(comm, pg_names, sink, lenient=lenient)
        if lenient:
            run.skipped_comm = tuple(sink.skipped)
        _check_split_members(run, sink, lenient=lenient)
    for rt in ranks.values():
        rt.seal()
    return run


def _check_split_members(run: RunTrace, sink: IssueLog, *, lenient: bool) -> None:
    """An all_to_all member's split lists name each member of its group once, in group-rank order, its own
    chunk at its own place. Lists of another length, or whose chunk at the node's place is not the one its
    totals leave (both known only once the collective is matched), are inconsistent like the ones
    :func:`_splits` finds in one file, and handled alike: a strict load refuses the run naming file, rank
    and node (before, the simulator costed such a collective by its busiest member and only the real
    replay refused it); a lenient or collecting one drops that node's splits."""
    bad: dict[int, dict[int, str]] = {}
    for inst in run.collectives:
        if inst.comm_type != CommType.ALL_TO_ALL:
            continue
        members = group_rank_order(run, inst)
        for r, row in zip(inst.ranks, inst.rows, strict=True):
            rt = run.ranks[r]
            if rt.split_ptr is None or rt.split_send_bytes is None or rt.split_recv_bytes is None:
                continue
            a, b = int(rt.split_ptr[row]), int(rt.split_ptr[row + 1])
            if a == b:
                continue
            where = f"group {inst.pg_name or 'default'} #{inst.seq}"
            if b - a != len(members):
                bad.setdefault(r, {})[row] = f"{b - a} entries for a group of {len(members)} ({where})"
                continue
            # the node's own chunk is the one at its place in the group: the rest is what it sends/receives
            me = members.index(r)
            send, recv = rt.split_send_bytes[a:b], rt.split_recv_bytes[a:b]
            lists = (int(send.sum() - send[me]), int(recv.sum() - recv[me]))
            totals = tuple(-1 if col is None else int(col[row]) for col in (rt.send_bytes, rt.recv_bytes))
            if lists != totals:
                bad.setdefault(r, {})[row] = (
                    f"{lists[0]} B to the others and {lists[1]} B from them at its place {me} in the group "
                    f"({where}), not its {Attr.SEND_BYTES} {totals[0]} and {Attr.RECV_BYTES} {totals[1]}"
                )
    for r, rows in sorted(bad.items()):
        rt = run.ranks[r]
        assert (
            rt.split_ptr is not None and rt.split_send_bytes is not None and rt.split_recv_bytes is not None
        )
        dropped = np.fromiter(rows, dtype=np.int64)

        def message(row: int, rt: RankTrace = rt, rows: dict[int, str] = rows) -> str:
            return (
                f"{rt.path}: rank {rt.rank}: node {rt.node_id[row]} ({rt.name(row)}) has corrupt all_to_all "
                f"splits: {rows[row]} (a list names each member of the group once)"
            )

        _refuse_or_drop(
            sink, dropped, rt.node_id, rows.__getitem__, message, path=rt.path, rank=r, lenient=lenient
        )
        of_row = np.repeat(np.arange(len(rt), dtype=np.int64), np.diff(rt.split_ptr))
        rt.split_ptr, rt.split_send_bytes, rt.split_recv_bytes = _without_splits(
            len(rt), (of_row, rt.split_send_bytes), (of_row, rt.split_recv_bytes), dropped
        )
        for name in ("send_bytes", "recv_bytes"):  # as a node that recorded no splits: an even all_to_all
            col = getattr(rt, name)
            if col is not None:
                col = col.copy()  # a loaded rank's may be the column cache's, read-only
                col[dropped] = -1
                setattr(rt, name, col)
    if bad:
        run.dropped_splits = tuple(sink.dropped_splits)


def _matchable_rows(run: RunTrace) -> dict[int, CommRows]:
    """Each rank's communication rows of a loaded run, as :func:`load_run` matches them (lost and window-edge
    collectives left out)."""
    comm = {r: CommRows.of(rt, step_mark_stream(run.manifest)) for r, rt in run.ranks.items()}
    return matchable(comm, run.manifest, run.process_groups, run.pg_names, IssueLog())[0]


def match_collectives(run: RunTrace) -> list[CollectiveInstance]:
    """Collective instances of a loaded run (raises :class:`ValidationError` on the first mismatch)."""
    comm = _matchable_rows(run)
    missing = frozenset(run.manifest.missing_ranks)
    return match_instances(
        comm, run.pg_names, run.process_groups, IssueLog(strict=True), missing_ranks=missing
    )


def match_p2p(run: RunTrace) -> list[P2PPair]:
    """Send/recv pairs of a loaded run (raises :class:`ValidationError` on the first unmatched one)."""
    comm = _matchable_rows(run)
    return match_pairs(comm, run.pg_names, IssueLog(strict=True))
