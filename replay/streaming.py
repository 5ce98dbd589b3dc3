"""Streaming output writers shared by the replay and the analyses.

- **Chrome trace JSON, a chunk at a time.** :func:`format_events` turns columns (numpy arrays) into one
  JSON object per row with Arrow compute kernels (integer-to-string casts, ``take`` from small tables,
  element-wise joins), never a Python object per event; :class:`TraceWriter` writes each chunk's bytes as
  it comes (the events are never all in memory) into the JSON object format that ui.perfetto.dev and
  ``chrome://tracing`` load: ``{"displayTimeUnit": ..., "otherData": {...}, "traceEvents": [...]}``.
- **A cap on what a viewer is given.** :func:`cap_events` picks, for a run too large to look at, the
  first whole steps on all ranks that fit ``max_events`` (else every rank's first stretch of time), and
  says in one line what it left out and which option writes everything.
- **Waits drawn inside communication nodes** (:func:`wait_events`): a ``wait for peers`` slice over the
  part of a collective / send / recv spent waiting for late peers, so a viewer tells it from the transfer.
- **One set of event categories** (:data:`CATEGORIES`: compute, collective, send, recv, untraced host
  time, wait, communication) for both timelines, compute exactly where the analyses count compute.
- Formatting or building the next chunk overlaps writing this one on threads
  (:func:`skewlens.profiler.threads.ordered_map`: Arrow's kernels and Parquet encoding release the GIL).

Times inside are integer ns; the JSON edge writes them as exact decimals (µs with three digits: ``12.345``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.store.model import RankTrace
from skewlens.profiler.threads import default_workers, ordered_map
from skewlens.profiler.vocab import NodeType
from skewlens.replay.execution import GPU_IDLE_PARTS, IdleStretches, RankModel, comm_rows, comp_kinds

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
T = TypeVar("T")

#: Default cap on the events of a Perfetto/Chrome trace file: about 130 MB of JSON (130 bytes a node of short
#: op names; up to 450 MB with long CUDA kernel names and the wait and GPU idle slices drawn beside), which
#: ui.perfetto.dev and chrome://tracing open; a 10-million-node run is 1.3-4.5 GB, which browsers fail on.
DEFAULT_MAX_EVENTS = 1_000_000
#: Rows formatted per chunk (about 7 MB of JSON each).
CHUNK_EVENTS = 1 << 16
#: Ranks of fewer rows share a chunk until it has this many (see :func:`rank_chunks`).
PACK_EVENTS = 1 << 12
#: An integer column whose values span at most this many (and no more than it has rows) is written from
#: a table of their strings (a ``take``) instead of a cast per row.
_SMALL_RANGE = 4096
#: Two neighbouring lookups whose tables have at most this many pairs of entries are written as one (a
#: table of the pairs): one ``take`` and one joined column fewer a row.
_MERGED_TABLE = 1024
_EVENT_SEP = ",\n"
#: ``displayTimeUnit`` of every trace file written (``ts`` / ``dur`` are µs whatever it says): "ms", the
#: format's default and what torch.profiler's Kineto JSON says. chrome://tracing only displays times in it
#: ("ns": a 200 ms step as 200,000,000 ns); older Perfetto JSON importers took it for the unit of ``ts``
#: itself (trace_processor's ``JsonTracker::SetTimeUnit``: "ns" drawn 1000 times too short), today's
#: ignore it.
DISPLAY_TIME_UNIT = "ms"


#: Perfetto ``cat`` of each node type (index: the type; ``other`` for the rest), then, last, the COMP rows
#: the analyses do not count as compute (:func:`~skewlens.replay.execution.compute_rows`): untraced host
#: time (:func:`~skewlens.replay.execution.untraced_rows`), idle; a wait node of the execution model
#: (:attr:`~skewlens.replay.execution.RankModel.is_wait`: ``wait_tensor``, a host op blocked on a GPU
#: synchronise such as ``aten::to``), waiting; an NCCL kernel kept as COMP
#: (:func:`~skewlens.replay.execution.nccl_kernel_rows`), communication. The replay's and the analyses'
#: timelines both use them.
CATEGORIES: tuple[str, ...] = (
    *(
        {
            int(NodeType.COMP): "compute",
            int(NodeType.COMM_COLL): "collective",
            int(NodeType.COMM_SEND): "send",
            int(NodeType.COMM_RECV): "recv",
        }.get(t, "other")
        for t in range(max(NodeType) + 1)
    ),
    "untraced",
    "wait",
    "communication",
)
#: :data:`CATEGORIES` as JSON strings, for :class:`Lookup` columns.
CATEGORY_JSON = tuple(json.dumps(c) for c in CATEGORIES)


def rank_categories(rt: RankTrace, m: RankModel) -> npt.NDArray[np.int8]:
    """Per row of the rank: its index into :data:`CATEGORIES`, ``m`` the rank's execution model (once per
    rank; a timeline's chunks take their rows of it). A COMP row is ``compute`` where the analyses count it
    so (:func:`~skewlens.replay.execution.compute_rows`), else ``untraced``, ``wait`` or ``communication``
    as :func:`~skewlens.replay.execution.comp_kinds` sorts it (one rule for the timelines, the analyses'
    index and the numbers)."""
    idx = rt.node_type.astype(np.int8)
    k = comp_kinds(rt, m)
    shown = (idx == int(NodeType.COMP)) & ~m.host_work  # a host_work node is compute (compute_rows)
    idx[k.wait & shown] = CATEGORIES.index("wait")
    idx[k.comm & shown] = CATEGORIES.index("communication")
    idx[k.untraced] = CATEGORIES.index("untraced")
    return idx


def stream_labels(
    rt: RankTrace, written: npt.NDArray[np.bool_], pg_names: Sequence[str] = ()
) -> dict[int, str]:
    """A track name for each stream of ``rt`` that has a ``written`` row (a stream that holds only
    METADATA nodes gets no empty track): the store's label where it has one, else what runs on it, so
    that a host thread, a GPU stream and a communication stream are told apart: ``host thread 0``,
    ``GPU stream 7``, ``GPU stream 84 (communication)``, ``communication stream 1000 (group 0)``. The
    number is the store's ``stream`` value (the ``stream`` column of the Parquet tables)."""
    rows = np.flatnonzero(written)
    streams, inverse = np.unique(rt.stream[rows], return_inverse=True)
    comm = comm_rows(rt)[rows]
    out: dict[int, str] = {}
    for k, s in enumerate(streams.tolist()):
        on = inverse == k
        if int(s) in rt.streams:
            out[int(s)] = rt.streams[int(s)]
            continue
        only_comm = bool(comm[on].all())
        if not rt.is_cpu[rows[on]].any():
            out[int(s)] = f"GPU stream {s}" + (" (communication)" if only_comm else "")
        elif only_comm:
            groups = np.unique(rt.pg[rows[on]]).tolist()
            group = (
                f" (group {pg_names[groups[0]]})"
                if len(groups) == 1 and 0 <= groups[0] < len(pg_names)
                else ""
            )
            out[int(s)] = f"communication stream {s}{group}"
        else:
            out[int(s)] = f"host thread {s}"
    return out


def _lanes_of(start: list[int], end: list[int], inner: list[int], order: list[int]) -> list[int]:
    """Lanes of one stream's slices, sorted by start (longest first at one start): a slice joins the
    first lane where it starts after everything open there ended or nests inside what is open. ``inner``:
    per slice, the end of the slice drawn inside it from its start on its track (its ``wait for peers``;
    its start where none), which what nests in the slice must not partly overlap either. ``order``: per
    slice, its place in the file: a slice does not nest in one of its own start written after it (a
    viewer nests it there by its sort, longest first, though the slice came first: a replayed wait of
    zero length that ends where the next op starts was drawn inside that op), nor in a ``wait for peers``
    of its start (written after all the nodes)."""
    stacks: list[list[tuple[int, int, float]]] = []  # per lane, the (end, start, place) of what is open
    out = []
    for x, y, w, k in zip(start, end, inner, order, strict=True):
        for stack in stacks:
            while stack and stack[-1][0] <= x:
                stack.pop()
        for lane, stack in enumerate(stacks):
            if not stack or (y <= stack[-1][0] and not (stack[-1][1] == x and stack[-1][2] > k)):
                stack.append((y, x, k))
                out.append(lane)
                break
        else:
            stacks.append([(y, x, k)])
            out.append(len(stacks) - 1)
        if x < w < y:  # its wait is open inside it on its lane until w
            stacks[out[-1]].append((w, x, math.inf))
    return out


def track_lanes(
    stream: I64,
    start: I64,
    end: I64,
    rows: npt.NDArray[np.integer[Any]],
    wait_ns: I64 | None = None,
) -> I64:
    """Per row of ``rows``: its lane on its stream's track, 0 unless it partly overlaps a slice before it
    on that stream (asynchronous collectives in flight at once on a communication stream: DDP's buckets),
    or a ``wait for peers`` slice drawn inside one (``wait_ns``: per row of the rank, the wait drawn from
    its start; None: none), or it starts where a longer row after it starts (a replayed wait of zero length
    right before the next op: a viewer sorts the slices of one start longest first). A viewer nests X
    slices of one track by time, so such a slice drawn there would show as a part of the one it overlaps;
    a lane of its own keeps each whole. Slices nested inside another (and inside or after its wait) stay on
    its lane."""
    lane = np.zeros(len(rows), dtype=np.int64)
    if len(rows) < 2:
        return lane
    st, en, sm = start[rows], end[rows], stream[rows]
    inner = st + np.minimum(wait_ns[rows], en - st) if wait_ns is not None else st
    order = np.argsort(sm, kind="stable")
    bounds = np.flatnonzero(np.r_[True, sm[order][1:] != sm[order][:-1], True])
    for a, b in itertools.pairwise(bounds.tolist()):
        part = order[a:b]
        if b - a < 2 or (_in_order(st[part], en[part]) and not _zero_before(st[part], en[part])):
            continue  # in order and none overlaps: the usual stream
        part = part[np.lexsort((-en[part], st[part]))]
        if _in_order(st[part], en[part]):
            continue
        lane[part] = _lanes_of(st[part].tolist(), en[part].tolist(), inner[part].tolist(), part.tolist())
    return lane


def _in_order(st: I64, en: I64) -> bool:
    """Whether each slice starts after all before it ended (none overlaps another)."""
    return bool((st[1:] >= np.maximum.accumulate(en)[:-1]).all())


def _zero_before(st: I64, en: I64) -> bool:
    """Whether a slice of zero length is followed by a longer one of its start (a viewer draws it inside)."""
    return bool(((en[:-1] == st[:-1]) & (st[1:] == st[:-1]) & (en[1:] > st[1:])).any())


@dataclass(frozen=True, slots=True)
class Tracks:
    """Where one rank's rows are drawn (:func:`rank_tracks`): the track (``tid``) of each row, and the
    name of each track."""

    names: dict[int, str]
    """Track name of each ``tid`` used (:func:`stream_labels`; ``(lane k)`` added to the extra lanes)."""
    stream_keys: I64
    """The rank's streams, ascending ..."""
    stream_tids: I64
    """... and the track of each."""
    moved_rows: I64
    """Rows drawn on an extra lane's track, ascending ..."""
    moved_tids: I64
    """... and that track."""

    def tids(self, stream: I64, rows: npt.NDArray[np.integer[Any]]) -> I64:
        """The track of each of ``rows`` (``stream``: the rank's stream column)."""
        tid = self.stream_tids[np.searchsorted(self.stream_keys, stream[rows])]
        if self.moved_rows.size and len(rows):
            k = np.minimum(np.searchsorted(self.moved_rows, rows), self.moved_rows.size - 1)
            hit = self.moved_rows[k] == rows
            tid[hit] = self.moved_tids[k[hit]]
        return tid

    def used_names(self, stream: I64, keep: B) -> dict[int, str]:
        """:attr:`names` of the tracks that hold one of the rows ``keep`` marks (``stream``: the rank's
        stream column): a capped file names no track it leaves empty (chrome://tracing draws an empty row)."""
        used = set(np.unique(self.tids(stream, np.flatnonzero(keep))).tolist())
        return {t: n for t, n in self.names.items() if t in used}


def rank_tracks(
    rt: RankTrace,
    written: B,
    *,
    start_ns: I64,
    end_ns: I64,
    stream_tid: Mapping[int, int],
    pg_names: Sequence[str] = (),
    wait_ns: I64 | None = None,
) -> Tracks:
    """The tracks of one rank: a stream's rows on its ``stream_tid`` track, except those that partly
    overlap others there, or the ``wait for peers`` slice (``wait_ns``, per row) drawn inside one
    (:func:`track_lanes`), which get further tracks, numbered after the largest ``stream_tid``, named after
    the stream with ``(lane 2)``, ``(lane 3)``, ... added."""
    rows = np.flatnonzero(written)
    lanes = track_lanes(rt.stream, start_ns, end_ns, rows, wait_ns)
    labels = stream_labels(rt, written, pg_names)
    names = {stream_tid[s]: label for s, label in labels.items()}
    extra = np.flatnonzero(lanes > 0)
    moved = np.zeros(extra.size, dtype=np.int64)
    if extra.size:
        pairs = list(zip(rt.stream[rows[extra]].tolist(), lanes[extra].tolist(), strict=True))
        first = max(stream_tid.values()) + 1
        new = {pair: first + k for k, pair in enumerate(sorted(set(pairs)))}
        for (s, lane), t in new.items():
            names[t] = f"{labels[s]} (lane {lane + 1})"
        moved[:] = [new[p] for p in pairs]
    keys = np.array(sorted(stream_tid), dtype=np.int64)
    return Tracks(
        names=names,
        stream_keys=keys,
        stream_tids=np.array([stream_tid[k] for k in keys.tolist()], dtype=np.int64),
        moved_rows=rows[extra].astype(np.int64),
        moved_tids=moved,
    )


@dataclass(frozen=True, slots=True)
class Lookup:
    """A column given as indices into a small table of JSON texts (written by ``take``)."""

    table: tuple[str, ...]
    """JSON text of each distinct value."""
    idx: npt.NDArray[np.integer[Any]]
    """Per row: index into ``table``."""
    prefix: str = ""
    """Literal text written before each entry (folded in from the neighbouring piece)."""
    suffix: str = ""
    """Literal text written after each entry."""


@lru_cache(maxsize=64)
def _table_array(table: tuple[str, ...], prefix: str, suffix: str) -> pa.Array:
    """A lookup table as an Arrow array, its literals folded in: built once for all chunks that use it
    (the fractions of every timestamp, a rank's names for each of its chunks)."""
    return pa.array([prefix + t + suffix for t in table], type=pa.string())


@lru_cache(maxsize=256)
def _int_table(lo: int, hi: int) -> tuple[str, ...]:
    return tuple(str(v) for v in range(lo, hi + 1))


_FRACTIONS = {d: tuple(f".{v:0{d}d}" for v in range(10**d)) for d in (1, 2, 3)}


#: One piece of a formatted row: literal JSON text, a column of indices into a table, or a string column.
Piece: TypeAlias = "str | Lookup | pa.Array"
#: A field value: one piece, several pieces written back to back, or a nested object's fields.
Value: TypeAlias = "Piece | list[Piece] | list[tuple[str, Any]]"


def json_int(values: npt.NDArray[np.integer[Any]]) -> Piece:
    """JSON integers: from a table when the values span a small range (steps, streams), else cast."""
    a = np.asarray(values, dtype=np.int64)
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if hi - lo < min(_SMALL_RANGE, a.size):
            return Lookup(_int_table(lo, hi), a - lo)
    return pc.cast(pa.array(a), pa.string())


def json_fixed(values: npt.NDArray[np.integer[Any]], digits: int) -> list[Piece]:
    """JSON numbers ``values / 10**digits``, exact (``12345, 3 -> 12.345``): ns as µs (3) or ms (6)."""
    scale = 10**digits
    a = np.asarray(values, dtype=np.int64)
    neg = a < 0
    mag = np.abs(a)
    whole: Piece = json_int(mag // scale)
    if neg.any():
        sign = pc.if_else(pa.array(neg), "-", "")
        whole = pc.binary_join_element_wise(sign, _materialise(whole), "")
    frac = mag % scale
    if digits in _FRACTIONS:
        return [whole, Lookup(_FRACTIONS[digits], frac)]
    return [whole, ".", pc.ascii_lpad(pc.cast(pa.array(frac), pa.string()), digits, "0")]


def json_strings(values: Sequence[str], idx: npt.NDArray[np.integer[Any]]) -> Lookup:
    """JSON strings ``values[idx]`` (each distinct value escaped once)."""
    return Lookup(tuple(json.dumps(v) for v in values), idx)


def _pieces(fields: Sequence[tuple[str, Value]]) -> list[Piece]:
    out: list[Piece] = ["{"]
    for i, (key, value) in enumerate(fields):
        out.append(("," if i else "") + json.dumps(key) + ":")
        if isinstance(value, list):
            if value and isinstance(value[0], tuple):
                out += _pieces(value)  # a nested object
            else:
                out += value
        else:
            out.append(value)
    out.append("}")
    return out


def _materialise(p: Piece) -> pa.Array | str:
    if isinstance(p, Lookup):
        return _table_array(p.table, p.prefix, p.suffix).take(pa.array(p.idx))
    return p


def _pair(a: Lookup, b: Lookup) -> Lookup:
    """``a`` then ``b`` as one lookup: a table of every pair of their entries (``a``'s suffix and ``b``'s
    prefix between them), indexed by ``a``'s index times ``b``'s table size plus ``b``'s."""
    mid = a.suffix + b.prefix
    table = tuple(x + mid + y for x in a.table for y in b.table)
    idx = np.asarray(a.idx, dtype=np.int64) * len(b.table) + b.idx
    return Lookup(table, idx, a.prefix, b.suffix)


def _fold(pieces: Iterable[Piece]) -> list[Piece]:
    """Merge adjacent literals, and fold each literal into a neighbouring lookup's table (the table is
    small; every piece fewer saves one element-wise join per row): a lookup of one entry (a chunk of one
    rank's ``pid``, one stream's ``tid``) is a literal, and neighbouring lookups of small tables become one
    (:data:`_MERGED_TABLE`). The 64 x 10,000-node replay's events join 6 columns and ``take`` 3 a row."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, Lookup) and len(p.table) == 1:
            p = p.prefix + p.table[0] + p.suffix
        last = out[-1] if out else None
        if isinstance(p, str):
            if isinstance(last, str):
                out[-1] = last + p
            elif isinstance(last, Lookup):
                out[-1] = Lookup(last.table, last.idx, last.prefix, last.suffix + p)
            else:
                out.append(p)
        elif isinstance(p, Lookup) and isinstance(last, str):
            out[-1] = Lookup(p.table, p.idx, last + p.prefix, p.suffix)
        elif (
            isinstance(p, Lookup)
            and isinstance(last, Lookup)
            and len(last.table) * len(p.table) <= _MERGED_TABLE
        ):
            out[-1] = _pair(last, p)
        else:
            out.append(p)
    return out


def format_events(fields: Sequence[tuple[str, Value]], n: int) -> pa.Array:
    """One JSON object per row (``n`` rows), each preceded by the event separator (for
    :meth:`TraceWriter.write_formatted`). ``fields``: ``(key, value)`` in order; a value is literal JSON
    text, a :class:`Lookup`, a string column, a list of those written back to back, or a nested object's
    ``(key, value)`` list."""
    parts = [_materialise(p) for p in _fold([_EVENT_SEP, *_pieces(fields)])]
    if not any(isinstance(p, pa.Array) for p in parts):
        return pa.array(["".join(str(p) for p in parts)] * n, type=pa.string())
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, "")


class TraceWriter:
    """Writes ``traceEvents`` into an open binary file: a few events as dicts, the many as formatted
    chunks. Made by :func:`trace_json`."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._first = True
        self.events = 0
        """Events written so far."""

    def _write(self, data: bytes | memoryview) -> None:
        if self._first and data:
            data = data[len(_EVENT_SEP) :]
            self._first = False
        self._fh.write(data)

    def write_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Write a few events given as dicts (process and thread names, markers)."""
        for ev in events:
            self._write((_EVENT_SEP + json.dumps(ev, separators=(",", ":"))).encode())
            self.events += 1

    def write_formatted(self, rows: pa.Array | pa.ChunkedArray) -> None:
        """Write the rows of :func:`format_events` (their bytes, back to back, as they lie in the array)."""
        for arr in rows.chunks if isinstance(rows, pa.ChunkedArray) else [rows]:
            if len(arr) == 0:
                continue
            offsets = np.frombuffer(
                arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset
            )
            self._write(memoryview(arr.buffers()[2])[int(offsets[0]) : int(offsets[-1])])
            self.events += len(arr)


@contextmanager
def trace_json(path: str | Path, *, other_data: Mapping[str, Any]) -> Iterator[TraceWriter]:
    """Open a Chrome trace JSON file for streaming (atomically: it appears under ``path`` only complete),
    with ``displayTimeUnit`` :data:`DISPLAY_TIME_UNIT`."""
    with atomic_file(path) as tmp, tmp.open("wb", buffering=1 << 20) as fh:
        head = {"displayTimeUnit": DISPLAY_TIME_UNIT, "otherData": other_data}
        fh.write(json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"traceEvents":[\n')
        yield TraceWriter(fh)
        fh.write(b"\n]}\n")


def chunks(
    rows: npt.NDArray[np.integer[Any]], size: int = CHUNK_EVENTS
) -> Iterator[npt.NDArray[np.integer[Any]]]:
    """``rows`` in consecutive pieces of at most ``size``."""
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


@dataclass(frozen=True, kw_only=True, slots=True)
class EventCap:
    """Which rows of each rank a trace file gets (see :func:`cap_events`)."""

    keep: dict[int, B]
    """Per rank: rows written."""
    max_events: int
    """The cap (0: none)."""
    written: int
    """Rows written."""
    total: int
    """Rows there were."""
    steps: tuple[int, int] | None = None
    """First and last step written, when whole steps were kept."""
    until_ns: int | None = None
    """When the cap fell inside the first step: rows that start before this time were kept."""
    note: str | None = None
    """What was left out and how to write it all (None: nothing was)."""

    def meta(self) -> dict[str, Any]:
        """For the file's ``otherData``."""
        return {
            "events_total": self.total,
            "events_written": self.written,
            "max_events": self.max_events,
            "steps_written": list(self.steps) if self.steps else None,
            "until_ns": self.until_ns,
            "left_out": self.note,
        }


def _ms(ns: int) -> str:
    return f"{ms_text(ns)} ms"


#: The ``steps`` track's ``tid`` in a trace file (past any stream's).
STEPS_TID = 1 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSpans:
    """Each rank's steps as a trace file draws them on its ``steps`` track, one row per (rank, step)."""

    rank: npt.NDArray[np.int64]
    step: npt.NDArray[np.int64]
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]

    @staticmethod
    def of(spans: Iterable[tuple[int, int, int, int]]) -> StepSpans:
        """From ``(rank, step, start_ns, end_ns)`` rows; steps below 0 (a rank that marked none) left out. A
        step's slice begins where its rank's steps before it ended, where that is later, so that a track's
        slices never partly overlap (a replay's step spans its nodes, and an asynchronous collective of one
        step may run into the next; the analysis's steps are windows that tile already)."""
        a = np.array(sorted(row for row in spans if row[1] >= 0), dtype=np.int64).reshape(-1, 4)
        rank, start, end = a[:, 0], a[:, 2], a[:, 3]
        if a.shape[0]:
            before = np.empty_like(end)  # the latest end of the rank's earlier steps
            bounds = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True]).tolist()
            for lo, hi in itertools.pairwise(bounds):
                before[lo] = np.iinfo(np.int64).min
                before[lo + 1 : hi] = np.maximum.accumulate(end[lo : hi - 1])
            start = np.maximum(start, before)
            end = np.maximum(end, start)
        return StepSpans(rank=rank, step=a[:, 1], start_ns=start, end_ns=end)

    def kept(self, cap: EventCap) -> npt.NDArray[np.bool_]:
        """The steps ``cap`` kept: those written whole, or those begun before the cap fell in the first."""
        if cap.steps is not None:
            return np.asarray((self.step >= cap.steps[0]) & (self.step <= cap.steps[1]))
        if cap.until_ns is not None:
            return np.asarray(self.start_ns < cap.until_ns)
        return np.ones(self.step.size, dtype=np.bool_)

    def events(self, kept: npt.NDArray[np.bool_], origin_ns: int) -> Iterator[pa.Array]:
        """A slice ``step N`` (``cat`` ``step``) per step ``kept``, on its rank's ``steps`` track. Before, the
        trace files had no step boundaries: a serving loop's 200 decode steps of 11 nodes each were told apart
        only by each slice's ``args.step``."""
        rows = np.flatnonzero(kept)
        if not rows.size:
            return
        step, start = self.step[rows], self.start_ns[rows]
        labels = np.unique(step)
        yield format_events(
            [
                ("ph", '"X"'),
                ("name", json_strings([f"step {s}" for s in labels.tolist()], np.searchsorted(labels, step))),
                ("cat", '"step"'),
                ("pid", json_int(self.rank[rows])),
                ("tid", str(STEPS_TID)),
                ("ts", json_fixed(start - origin_ns, 3)),
                ("dur", json_fixed(self.end_ns[rows] - start, 3)),
                ("args", [("step", json_int(step))]),
            ],
            rows.size,
        )


def process_metadata(r: int, name: str) -> list[dict[str, Any]]:
    """The name of rank ``r``'s process (``pid`` = rank) and its place among the processes, by rank: without
    a ``process_sort_index`` a viewer orders the processes by its own rule (chrome://tracing by name,
    ``rank 10`` before ``rank 2``). Both traces, the replay's timeline and the analysis trace, write it."""
    return [
        {"ph": "M", "name": "process_name", "pid": r, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}},
    ]


def steps_track_metadata(r: int) -> list[dict[str, Any]]:
    """The name of rank ``r``'s ``steps`` track."""
    return [{"ph": "M", "name": "thread_name", "pid": r, "tid": STEPS_TID, "args": {"name": "steps"}}]


def cap_events(
    candidates: Mapping[int, B],
    start_ns: Mapping[int, I64],
    step: Mapping[int, npt.NDArray[np.integer[Any]]],
    *,
    max_events: int,
    file: str,
    option: str,
) -> EventCap:
    """Choose the rows to write: all when they fit ``max_events`` (0: no cap); else the first whole steps
    on every rank that fit (rows of no step left out), which keeps the ranks side by side for comparison;
    else, when not even the first step fits, every rank's rows that start in the run's first stretch of
    time. ``file`` and ``option`` (the setting that writes everything) go into the note."""
    total = sum(int(m.sum()) for m in candidates.values())
    keep = {r: np.asarray(m, dtype=np.bool_) for r, m in candidates.items()}
    if max_events <= 0 or total <= max_events:
        return EventCap(keep=keep, max_events=max_events, written=total, total=total)
    counts: dict[int, int] = {}
    for r, m in keep.items():
        s = np.asarray(step[r], dtype=np.int64)[m]
        if s.size == 0:
            continue
        lo = int(s.min())
        if int(s.max()) - lo < 1 << 20:  # steps are small numbers: count them without sorting
            c = np.bincount(s - lo)
            values, n = np.flatnonzero(c) + lo, c[c > 0]
        else:
            values, n = np.unique(s, return_counts=True)
        for k, cnt in zip(values.tolist(), n.tolist(), strict=True):
            counts[k] = counts.get(k, 0) + cnt
    steps = sorted(k for k in counts if k >= 0)
    fits = np.flatnonzero(np.cumsum([counts[k] for k in steps]) <= max_events) if steps else np.array([])
    ranks = f"all {len(keep)} ranks" if len(keep) > 1 else "rank " + ", ".join(map(str, keep))
    if fits.size:
        first, last = steps[0], steps[int(fits[-1])]
        for r, m in keep.items():
            s = np.asarray(step[r])
            keep[r] = m & (s >= first) & (s <= last)
        written = sum(int(m.sum()) for m in keep.values())
        later = len(steps) - int(fits[-1]) - 1
        no_step = counts.get(-1, 0)
        left = [f"{later} later step(s)"] if later else []
        left += [f"{no_step:,} events of no step"] if no_step else []
        shown = f"step {first}" if first == last else f"steps {first}-{last}"
        note = (
            f"{file}: {written:,} of {total:,} events written (cap {max_events:,}): {shown} on {ranks}; left "
            f"out {total - written:,} events ({', '.join(left)}); {option} writes all"
        )
        return EventCap(
            keep=keep, max_events=max_events, written=written, total=total, steps=(first, last), note=note
        )
    starts = np.concatenate([np.asarray(start_ns[r])[m] for r, m in keep.items()])
    origin = int(starts.min())
    starts.partition(max_events)  # in place: the concatenation is already a copy
    until = int(starts[max_events])
    for r, m in keep.items():
        keep[r] = m & (np.asarray(start_ns[r]) < until)
    written = sum(int(m.sum()) for m in keep.values())
    why = f"step {steps[0]} alone has {counts[steps[0]]:,}" if steps else "the run has no steps"
    note = (
        f"{file}: {written:,} of {total:,} events written (cap {max_events:,}; {why}): the first "
        f"{_ms(until - origin)} on {ranks}; left out {total - written:,} later events; {option} writes all"
    )
    return EventCap(keep=keep, max_events=max_events, written=written, total=total, until_ns=until, note=note)


#: Name and ``cat`` of the slice that marks, inside a communication node, its wait for late peers.
WAIT_NAME = "wait for peers"
WAIT_CATEGORY = "wait_for_peers"


def wait_events(
    keep: Mapping[int, B],
    start_ns: Mapping[int, I64],
    wait_ns: Mapping[int, I64],
    *,
    tid: Callable[[int, npt.NDArray[np.int64]], npt.NDArray[np.int64]],
    origin_ns: int,
    traces: Mapping[int, RankTrace],
) -> Iterator[pa.Array]:
    """Per rank, a ``wait for peers`` slice inside each kept row that waited (``wait_ns`` > 0): from the
    row's start (its arrival) over its wait, on the row's track (``tid(rank, rows)``), so that a viewer
    draws the wait under the communication node's slice and the rest of that slice is the transfer (``args``:
    the wait in ms, and the node's ``node_id`` and ``step`` from ``traces``). Written after the nodes: a
    viewer that meets two slices of one start in file order nests the second."""
    pid, tids, st, wt, nid, step = [], [], [], [], [], []
    for r in sorted(keep):
        rows = np.flatnonzero(keep[r] & (wait_ns[r] > 0))
        if rows.size:
            pid.append(np.full(rows.size, r, dtype=np.int64))
            tids.append(tid(r, rows))
            st.append(start_ns[r][rows])
            wt.append(wait_ns[r][rows])
            nid.append(traces[r].node_id[rows])
            step.append(traces[r].step[rows])
    if not pid:
        return
    pids, tid_all = np.concatenate(pid), np.concatenate(tids)
    start, wait = np.concatenate(st), np.concatenate(wt)
    node_id, steps = np.concatenate(nid), np.concatenate(step)
    for part in chunks(np.arange(start.size), CHUNK_EVENTS):
        yield format_events(
            [
                ("ph", '"X"'),
                ("name", json.dumps(WAIT_NAME)),
                ("cat", json.dumps(WAIT_CATEGORY)),
                ("pid", json_int(pids[part])),
                ("tid", json_int(tid_all[part])),
                ("ts", json_fixed(start[part] - origin_ns, 3)),
                ("dur", json_fixed(wait[part], 3)),
                (
                    "args",
                    [
                        ("wait_ms", json_fixed(wait[part], 6)),
                        ("node_id", json_int(node_id[part])),
                        ("step", json_int(steps[part])),
                    ],
                ),
            ],
            part.size,
        )


#: ``cat`` of the slices that say what a GPU stream idled for, and their names, by
#: :data:`~skewlens.replay.execution.GPU_IDLE_PARTS`.
IDLE_CATEGORY = "gpu_idle"
IDLE_NAMES = tuple(json.dumps("idle: " + p.replace("_", " ")) for p in GPU_IDLE_PARTS)


def idle_track_name(stream: int) -> str:
    """Name of the track that draws GPU stream ``stream``'s idle time."""
    return f"GPU stream {stream}: idle, by what it waited for"


def gpu_idle_events(
    pieces: Mapping[int, IdleStretches],
    keep: Mapping[int, B],
    *,
    tid: Mapping[int, int],
    origin_ns: int,
    traces: Mapping[int, RankTrace],
) -> Iterator[pa.Array]:
    """Per rank, a slice for each piece of its GPU stream's idle time (``pieces``, by rank:
    :func:`~skewlens.replay.execution.idle_stretches`) before a kept row (``keep``), on the track
    ``tid[rank]``: named after what the stream waited for (``idle: launch wait``, ``idle: comm wait``,
    ``idle: stream wait``, ``idle: other``), ``cat`` :data:`IDLE_CATEGORY`, ``args``: the ``node_id`` and
    ``step`` of the op it came before."""
    pid, tids, lo, hi, part, nid, step = [], [], [], [], [], [], []
    for r in sorted(pieces):
        p = pieces[r]
        mine = keep[r][p.before]
        if mine.any():
            before = p.before[mine]
            pid.append(np.full(before.size, r, dtype=np.int64))
            tids.append(np.full(before.size, tid[r], dtype=np.int64))
            lo.append(p.lo[mine])
            hi.append(p.hi[mine])
            part.append(p.part[mine])
            nid.append(traces[r].node_id[before])
            step.append(traces[r].step[before])
    if not pid:
        return
    pids, tid_all, los, his = (
        np.concatenate(pid),
        np.concatenate(tids),
        np.concatenate(lo),
        np.concatenate(hi),
    )
    parts, node_id, steps = np.concatenate(part), np.concatenate(nid), np.concatenate(step)
    for c in chunks(np.arange(los.size), CHUNK_EVENTS):
        yield format_events(
            [
                ("ph", '"X"'),
                ("name", Lookup(IDLE_NAMES, parts[c])),
                ("cat", json.dumps(IDLE_CATEGORY)),
                ("pid", json_int(pids[c])),
                ("tid", json_int(tid_all[c])),
                ("ts", json_fixed(los[c] - origin_ns, 3)),
                ("dur", json_fixed(his[c] - los[c], 3)),
                ("args", [("node_id", json_int(node_id[c])), ("step", json_int(steps[c]))]),
            ],
            c.size,
        )


def cut_marker(note: str, ts_us: float, *, pid: int = 0) -> dict[str, Any]:
    """A global instant event at ``ts_us`` carrying ``note`` (what the cap left out): the viewers draw it
    as a line across the tracks where the written trace stops."""
    return {
        "name": "skewlens: trace cut here (see args.note)",
        "ph": "i",
        "s": "g",
        "pid": pid,
        "tid": 0,
        "ts": ts_us,
        "args": {"note": note},
    }


def write_trace(
    path: Path,
    cap: EventCap,
    *,
    other_data: Mapping[str, Any],
    metadata: Iterable[Mapping[str, Any]],
    jobs: Iterable[T],
    fmt: Callable[[T], pa.Array],
    extra: Callable[[], Iterable[pa.Array]] = lambda: (),
    end_ns: Mapping[int, I64],
    origin_ns: int = 0,
    workers: int | None = None,
    on_note: Callable[[str], object] | None = None,
) -> Path:
    """Stream a capped trace file: the ``metadata`` events (process / thread names), then ``fmt(job)`` of
    each job, formatted on ``workers`` threads (default: the usable CPUs) and written in order, then the
    chunks of ``extra``. ``otherData`` gets ``other_data`` and what the cap kept; when it left something
    out, a marker and ``on_note`` say so: the marker (µs from ``origin_ns``) at the last kept end (``end_ns``
    per rank) of whole steps, or at the cap's time when it cut inside the first step (later nodes of a rank
    drawn before it would look like idle time)."""
    with trace_json(path, other_data={**other_data, **cap.meta()}) as w:
        w.write_events(metadata)
        formatted = ordered_map(fmt, jobs, workers=default_workers() if workers is None else workers)
        with contextlib.closing(formatted):  # closed here if the writer raises (see ordered_map)
            for rows in formatted:
                w.write_formatted(rows)
        for rows in extra():
            w.write_formatted(rows)
        if cap.note is not None:
            if cap.until_ns is not None:  # every node that starts before it is written, none after
                cut = cap.until_ns
            else:  # whole steps: where the last of them ends
                ends = [int(np.asarray(end_ns[r])[m].max()) for r, m in cap.keep.items() if m.any()]
                cut = max(ends, default=origin_ns)
            w.write_events([cut_marker(cap.note, (cut - origin_ns) / 1e3)])
    if cap.note is not None and on_note is not None:
        on_note(cap.note)
    return path


RankRows: TypeAlias = "list[tuple[int, npt.NDArray[np.integer[Any]]]]"


def rank_chunks(cap: EventCap) -> Iterator[RankRows]:
    """What ``cap`` keeps, rank by rank, in chunks of at most :data:`CHUNK_EVENTS` rows: each chunk a list of
    ``(rank, rows)``, a rank's rows split over chunks where it has more, ranks of few rows packed into one
    until it has :data:`PACK_EVENTS` (a chunk has a fixed cost of ~0.4 ms to format: 0.4 s for 1,024 ranks
    of a few nodes; larger ranks keep a chunk of their own, as many rows in memory as before)."""
    batch: RankRows = []
    n = 0
    for r in sorted(cap.keep):
        for rows in chunks(np.flatnonzero(cap.keep[r]), CHUNK_EVENTS):
            if batch and (n >= PACK_EVENTS or n + len(rows) > CHUNK_EVENTS):
                yield batch
                batch, n = [], 0
            batch.append((r, rows))
            n += len(rows)
    if batch:
        yield batch
