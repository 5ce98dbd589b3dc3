"""Chrome / Perfetto trace JSON of a run with its critical path marked.

One process per rank (``pid`` = rank), one track per stream/thread, a ``steps`` track with a slice per
recorded step (the step breakdown's span of it), plus a ``critical path`` track on each rank the path
passes through holding copies of the path's nodes, and flow arrows (``ph: s/f``)
wherever the path jumps from one rank to another (to a collective's last arriver or a late send). Times
are µs at this edge, relative to the run's first node or step drawn (``otherData.t0_ns`` keeps the origin).

The file is streamed a chunk of nodes at a time (:mod:`skewlens.replay.streaming`: formatted by Arrow
kernels, never a dict per event) and atomically. At most ``max_events`` nodes are written (default
:data:`~skewlens.replay.streaming.DEFAULT_MAX_EVENTS`, 0: all): beyond that the first whole steps on all
ranks that fit, with the critical path of those steps; ``otherData`` and an instant event where the trace
stops say what was left out.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.index import RankIndex
from skewlens.analysis.records import CriticalPathRecord
from skewlens.replay.execution import execution_model
from skewlens.replay.streaming import (
    CATEGORY_JSON,
    DEFAULT_MAX_EVENTS,
    EventCap,
    Lookup,
    StepSpans,
    Tracks,
    Value,
    cap_events,
    format_events,
    json_fixed,
    json_int,
    json_strings,
    process_metadata,
    rank_categories,
    rank_chunks,
    rank_tracks,
    steps_track_metadata,
    wait_events,
    write_trace,
)

PERFETTO_FILE = "trace_critical_path.json"
#: The ``skewlens analyze`` option that sets the cap (named in the note of what was left out).
MAX_EVENTS_OPTION = "--perfetto-max-events"
_CP_TID = 0
#: ``cat`` of each node type and of untraced host time, as JSON text.


def _tracks(ri: RankIndex, written: np.ndarray, pg_names: list[str]) -> Tracks:
    """Track 0 is the critical path; the streams' tracks are numbered from 1 in stream order, then
    extra lanes of partly overlapping slices, or of slices that partly overlap a communication node's
    ``wait for peers`` (:func:`~skewlens.replay.streaming.rank_tracks`)."""
    streams = np.unique(ri.trace.stream).tolist()
    return rank_tracks(
        ri.trace,
        written,
        start_ns=ri.trace.start_ns,
        end_ns=ri.trace.end_ns,
        stream_tid={s: k for k, s in enumerate(streams, start=1)},
        pg_names=pg_names,
        wait_ns=_drawn_waits(ri),
    )


def _drawn_waits(ri: RankIndex) -> npt.NDArray[np.int64]:
    """Per row of the rank, the ``wait for peers`` drawn inside it (0 where none): communication rows'."""
    return np.where(ri.is_comm, ri.wait_ns, 0)


def _metadata(r: int, names: dict[int, str], *, on_path: bool, steps: bool) -> list[dict[str, Any]]:
    """Names of rank ``r``'s process and tracks (``names``: the tracks drawn, by ``tid``); a ``critical path``
    track only where the path drawn (``on_path``) passes through the rank, a ``steps`` track where ``steps``
    of it are drawn."""
    meta = process_metadata(r, f"rank {r}")
    if steps:
        meta += steps_track_metadata(r)
    if on_path:
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": r, "tid": _CP_TID, "args": {"name": "critical path"}}
        )
    for tid, label in sorted(names.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": label}})
    return meta


def _node_events(
    r: int,
    ri: RankIndex,
    cats: npt.NDArray[np.int8],
    rows: np.ndarray,
    *,
    t0: int,
    names: tuple[str, ...],
    comm: bool,
    tracks: Tracks,
    groups: tuple[str, ...] = ("null",),
) -> pa.Array:
    """Rows of one rank as X events on their stream's track; communication rows (``comm``) also carry
    their wait, size, group and sequence number (``groups``: the run's group names as JSON text, then
    ``null`` for a row of none), which the report's collectives are named by (``all_gather 0#42``: group
    ``0``, seq 42). Before, a PPO loop's critic all_reduce on a group of its own could be told from the
    actor's on the default group only by its track, and a blocking one on the host thread not at all."""
    rt = ri.trace
    args: list[tuple[str, Value]] = [
        ("node_id", json_int(rt.node_id[rows])),
        ("step", json_int(rt.step[rows])),
    ]
    if comm:
        args += [
            ("wait_ms", json_fixed(ri.wait_ns[rows], 6)),
            ("bytes", json_int(rt.comm_bytes[rows])),
            ("group", Lookup(groups, np.where(rt.pg[rows] >= 0, rt.pg[rows], len(groups) - 1))),
            ("seq", json_int(rt.seq[rows])),
        ]
    fields: list[tuple[str, Value]] = [
        ("ph", '"X"'),
        ("name", Lookup(names, rt.name_idx[rows])),
        ("cat", Lookup(CATEGORY_JSON, cats[rows])),
        ("pid", str(r)),
        ("tid", json_int(tracks.tids(rt.stream, rows))),
        ("ts", json_fixed(rt.start_ns[rows] - t0, 3)),
        ("dur", json_fixed(rt.dur_ns[rows], 3)),
        ("args", args),
    ]
    return format_events(fields, len(rows))


def _path_col(path: list[CriticalPathRecord], attr: str) -> np.ndarray:
    """One integer field of every piece of the path."""
    return np.fromiter((getattr(p, attr) for p in path), dtype=np.int64, count=len(path))


def _path_kept(path: list[CriticalPathRecord], cap: EventCap) -> tuple[np.ndarray, np.ndarray]:
    """Where each piece of the path is drawn (ns: from where the later piece after it began, less the gap
    between them, over its contribution) and whether ``cap`` kept it."""
    n = len(path)

    def col(attr: str) -> np.ndarray:
        return _path_col(path, attr)

    step, end, contrib, gap = col("step"), col("end_ns"), col("contribution_ns"), col("gap_before_ns")
    # a node is on the path only until what waited for it needed it (a host op until the launch inside it):
    # its piece ends where the later piece after it began, less the gap between them, not at the node's end;
    # each step's pieces tile its path back from its last node's end (records: by step, then position)
    back = contrib + gap
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    head = np.repeat(first, np.diff(np.r_[first, n]))
    done = np.cumsum(back) - back  # what the path covered after each piece, from the run's last step back
    ts = end[head] - (done - done[head]) - contrib
    if cap.steps is not None:
        kept = (step >= cap.steps[0]) & (step <= cap.steps[1])
    elif cap.until_ns is not None:
        kept = ts < cap.until_ns
    else:
        kept = np.ones(n, dtype=np.bool_)
    return ts, kept


def _path_events(
    path: list[CriticalPathRecord], ts: np.ndarray, kept: np.ndarray, t0: int
) -> Iterator[pa.Array]:
    """The critical path's nodes on each rank's ``critical path`` track, and a flow arrow wherever the
    path moves to another rank within a step; only the pieces ``kept``, each drawn at ``ts``
    (:func:`_path_kept`)."""
    n = len(path)
    if n == 0:
        return

    def col(attr: str) -> np.ndarray:
        return _path_col(path, attr)

    rank, step, start, contrib = col("rank"), col("step"), col("start_ns"), col("contribution_ns")
    name_of: dict[str, int] = {}
    via_of: dict[str, int] = {}
    name_idx = np.fromiter((name_of.setdefault(p.name, len(name_of)) for p in path), dtype=np.int64, count=n)
    via_idx = np.fromiter((via_of.setdefault(p.via, len(via_of)) for p in path), dtype=np.int64, count=n)
    rows = np.flatnonzero(kept)
    if rows.size:
        yield format_events(
            [
                ("ph", '"X"'),
                ("name", json_strings(list(name_of), name_idx[rows])),
                ("cat", '"critical_path"'),
                ("pid", json_int(rank[rows])),
                ("tid", str(_CP_TID)),
                ("ts", json_fixed(ts[rows] - t0, 3)),
                ("dur", json_fixed(contrib[rows], 3)),
                (
                    "args",
                    [
                        ("step", json_int(step[rows])),
                        ("position", json_int(col("position")[rows])),
                        ("node_id", json_int(col("node_id")[rows])),
                        ("via", json_strings(list(via_of), via_idx[rows])),
                    ],
                ),
            ],
            len(rows),
        )
    # record k + 1 precedes record k in time: an arrow from where the path picks up on k + 1's rank back
    # to k's node (ids count the jumps of the whole path, so they do not change with the cap)
    jump = (step[1:] == step[:-1]) & (rank[1:] != rank[:-1])
    ids = np.cumsum(jump)
    pairs = np.flatnonzero(jump & kept[1:] & kept[:-1])
    if pairs.size:
        common: list[tuple[str, Value]] = [
            ("name", '"critical path"'),
            ("cat", '"critical_path"'),
            ("id", json_int(ids[pairs])),
            ("tid", str(_CP_TID)),
        ]
        cur, prev = pairs + 1, pairs
        yield format_events(
            [*common, ("ph", '"s"'), ("pid", json_int(rank[cur])), ("ts", json_fixed(start[cur] - t0, 3))],
            pairs.size,
        )
        yield format_events(
            [
                *common,
                ("ph", '"f"'),
                ("bp", '"e"'),
                ("pid", json_int(rank[prev])),
                ("ts", json_fixed(ts[prev] - t0, 3)),
            ],
            pairs.size,
        )


def write_perfetto(
    result: AnalysisResult,
    path: str | Path,
    *,
    max_events: int = DEFAULT_MAX_EVENTS,
    on_note: Callable[[str], object] | None = None,
    workers: int | None = None,
    write_all: str = f"{MAX_EVENTS_OPTION} 0",
) -> Path:
    """Write the trace JSON (streamed, atomically). At most ``max_events`` nodes (0: all); when some
    were left out, ``on_note`` is given the line that says what, and that ``write_all`` (the caller's way
    to write them all: ``skewlens analyze``'s option by default) writes all."""
    p = Path(path)
    ix = result.index
    ranks = sorted(ix.ranks)
    written = {
        r: ix.ranks[r].is_comp
        | ix.ranks[r].is_comm
        | ix.ranks[r].is_comm_comp
        | ix.ranks[r].is_untraced
        | ix.ranks[r].is_wait
        for r in ranks
    }
    cap = cap_events(
        written,
        {r: ix.ranks[r].trace.start_ns for r in ranks},
        {r: ix.ranks[r].trace.step for r in ranks},
        max_events=max_events,
        file=p.name,
        option=write_all,
    )
    names = {r: tuple(json.dumps(n) for n in ix.ranks[r].trace.names) for r in ranks}
    groups = (*(json.dumps(n) for n in ix.run.pg_names), "null")
    # a critical path track only on the ranks the path drawn passes through (the others had an empty one)
    cp = result.critical_path
    cp_ts, cp_kept = _path_kept(cp, cap)
    path_ranks = {c.rank for c, k in zip(cp, cp_kept.tolist(), strict=True) if k}
    tracks = {r: _tracks(ix.ranks[r], written[r], ix.run.pg_names) for r in ranks}
    spans = StepSpans.of((b.rank, b.step, b.start_ns, b.end_ns) for b in result.breakdown)
    steps_kept = spans.kept(cap)
    step_ranks = set(spans.rank[steps_kept].tolist())
    # the origin: the first start of a node written (not a METADATA node, which may be recorded at 0) or of a
    # step drawn, which may begin before its first node (an imported Kineto trace's ProfilerStep: the
    # 128-GPU trace's step 551 began 2.3 ms before it, at ts -2305.0, which Perfetto drops)
    t0 = min(
        (
            *(int(ix.ranks[r].trace.start_ns[k].min()) for r, k in written.items() if k.any()),
            *spans.start_ns[steps_kept].tolist(),
        ),
        default=0,
    )

    def jobs() -> Iterator[tuple[int, np.ndarray, bool]]:
        for batch in rank_chunks(cap):
            for r, rows in batch:
                comm = ix.ranks[r].is_comm[rows]
                for part, is_comm in ((rows[~comm], False), (rows[comm], True)):
                    if part.size:
                        yield r, part, is_comm

    em = execution_model(ix.run)
    cats = {r: rank_categories(ix.ranks[r].trace, em.ranks[r]) for r in ranks}

    def fmt(job: tuple[int, np.ndarray, bool]) -> pa.Array:
        r, rows, comm = job
        return _node_events(
            r, ix.ranks[r], cats[r], rows, t0=t0, names=names[r], comm=comm, tracks=tracks[r], groups=groups
        )

    return write_trace(
        p,
        cap,
        other_data={"t0_ns": t0, "run_dir": str(Path(ix.run.run_dir).resolve())},  # absolute, as the replay's
        metadata=(
            m
            for r in ranks
            for m in _metadata(
                r,
                tracks[r].used_names(ix.ranks[r].trace.stream, cap.keep[r]),
                on_path=r in path_ranks,
                steps=r in step_ranks,
            )
        ),
        jobs=jobs(),
        fmt=fmt,
        extra=lambda: itertools.chain(
            spans.events(steps_kept, t0),
            _path_events(cp, cp_ts, cp_kept, t0),
            wait_events(
                cap.keep,
                {r: ix.ranks[r].trace.start_ns for r in ranks},
                {r: _drawn_waits(ix.ranks[r]) for r in ranks},
                tid=lambda r, rows: tracks[r].tids(ix.ranks[r].trace.stream, rows),
                origin_ns=t0,
                traces={r: ix.ranks[r].trace for r in ranks},
            ),
        ),
        end_ns={r: ri.end_ns for r, ri in ix.ranks.items()},
        origin_ns=t0,
        workers=workers,
        on_note=on_note,
    )
