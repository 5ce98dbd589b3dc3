"""Match communication across ranks: collective instances by (group, sequence number), sends with recvs.

Matching works on :class:`CommRows`, the communication rows of each rank only, so that the Parquet
export can match a run whose nodes never sit in memory all at once.

What "size differs" means per collective type (``comm_size`` is the bytes of each member's own call):

- ALL_REDUCE, REDUCE, BROADCAST, BARRIER: every member's call moves the same tensor, sizes must be equal.
- ALL_GATHER, REDUCE_SCATTER, REDUCE_SCATTER_BLOCK: compared as what each member *sends* (its input
  shard for all-gather, its full input for reduce-scatter); these must be equal across members.
- ALL_TO_ALL, GATHER, SCATTER: members legitimately differ (uneven splits, the root's larger buffer), so
  sizes are not compared.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from skewlens.profiler.manifest import (
    THREAD_STREAM_SOURCES,
    LostCollectives,
    Manifest,
    ProcessGroupInfo,
    StepSpan,
    partial_traces,
)
from skewlens.profiler.store.issues import (
    IssueLog,
    Severity,
    SkippedComm,
    counted,
    per_rank,
    rank_ranges,
    ranks_label,
    sizes_per_rank,
    steps_label,
)
from skewlens.profiler.store.model import (
    DEP_CTRL,
    I8,
    I32,
    I64,
    CollectiveInstance,
    P2PPair,
    RankTrace,
    type_mask,
)
from skewlens.profiler.vocab import SIZE_MUST_MATCH, CommType, NodeType

#: At most this many issues of one kind are reported individually; the rest are summarised.
MAX_REPORTED = 20
#: Issue kinds of communication whose members disagree across ranks: errors in a strict load, warnings
#: in a lenient one, which leaves that communication unmatched (``IssueLog.skipped`` says what and why).
MISMATCH_KINDS = frozenset(
    {
        "collective-without-id",
        "collective-duplicate",
        "collective-count",
        "collective-type",
        "collective-size",
        "collective-unknown-type",
        "p2p-no-peer",
        "p2p-unmatched",
        "p2p-size",
    }
)

#: Issue kind of collectives whose members issued them in different steps (the ranks marked steps
#: differently): a warning, the collectives stay matched.
STEP_MISMATCH = "step-mismatch"
#: Issue kind (info) of collectives that threads other than the one that marks steps issued in
#: different steps on different members: such a thread runs beside the steps, its collectives land on
#: either side of a step boundary, and no step mark is at fault.
SIDE_THREAD_STEPS = "side-thread-steps"


def comm_type_name(value: int) -> str:
    try:
        return CommType(value).name
    except ValueError:
        return f"unknown comm_type {value}"


@dataclass(eq=False, kw_only=True, slots=True)
class CommRows:
    """The communication rows (collectives, sends, recvs) of one rank, as columns."""

    rank: int
    """Global rank."""
    path: str
    """The rank's trace file."""
    row: I64
    """Row of each node in the rank's full RankTrace."""
    node_id: I64
    """Chakra node id."""
    node_type: I8
    """Chakra node type."""
    name: list[str]
    """Node name of each row."""
    pg: I32
    """Index into the run's ``pg_names`` (-1 none)."""
    seq: I64
    """Per-group sequence number (-1 none)."""
    comm_type: I8
    """Collective type (-1 for send/recv)."""
    comm_bytes: I64
    """Bytes of the call."""
    src: I32
    """Sender (send/recv)."""
    dst: I32
    """Receiver (send/recv)."""
    tag: I64
    """p2p tag."""
    start_ns: I64
    """Start, aligned ns."""
    dur_ns: I64
    """Duration, ns."""
    step: I32
    """Training step (-1 unknown)."""
    dtype: list[str] = field(default_factory=list)
    """The dtype each row's tensor was recorded in (``skl_dtype``), ``""`` where none; empty where the trace
    records none."""
    side: np.ndarray | None = None
    """Per row, whether a thread beside the steps issued it: one that no control dependency ties to the
    thread that marks steps (a metrics or prefetch thread of its own; that thread's asynchronous
    communication, autograd's device threads and its GPU streams are tied to it). None: the thread that
    marks steps is not known (:func:`step_mark_stream`)."""

    @staticmethod
    def empty(rank: int, path: str) -> CommRows:
        """No communication rows (a rank whose file could not be read)."""
        i64, i32, i8 = np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int8)
        return CommRows(
            rank=rank, path=path, row=i64, node_id=i64, node_type=i8, name=[], pg=i32, seq=i64,
            comm_type=i8, comm_bytes=i64, src=i32, dst=i32, tag=i64, start_ns=i64, dur_ns=i64, step=i32,
        )  # fmt: skip

    def subset(self, keep: np.ndarray) -> CommRows:
        """The rows where ``keep`` is true."""
        names = [n for n, k in zip(self.name, keep.tolist(), strict=True) if k]
        dtypes = [d for d, k in zip(self.dtype, keep.tolist(), strict=True) if k] if self.dtype else []
        return CommRows(
            rank=self.rank, path=self.path, row=self.row[keep], node_id=self.node_id[keep],
            node_type=self.node_type[keep], name=names,
            pg=self.pg[keep], seq=self.seq[keep], comm_type=self.comm_type[keep],
            comm_bytes=self.comm_bytes[keep], src=self.src[keep], dst=self.dst[keep], tag=self.tag[keep],
            start_ns=self.start_ns[keep], dur_ns=self.dur_ns[keep], step=self.step[keep], dtype=dtypes,
            side=None if self.side is None else self.side[keep],
        )  # fmt: skip

    @staticmethod
    def of(rt: RankTrace, mark_stream: int | None = None) -> CommRows:
        """The communication rows of ``rt``; ``mark_stream``: the stream of the thread that marks steps
        (:func:`step_mark_stream`), None where not known."""
        rows = rt.rows_of_type(NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV)
        side = None if mark_stream is None else _beside_steps(rt, mark_stream)
        return CommRows(
            rank=rt.rank,
            path=rt.path,
            row=rows,
            node_id=rt.node_id[rows],
            node_type=rt.node_type[rows],
            name=[rt.names[i] for i in rt.name_idx[rows].tolist()],
            pg=rt.pg[rows],
            seq=rt.seq[rows],
            comm_type=rt.comm_type[rows],
            comm_bytes=rt.comm_bytes[rows],
            src=rt.src[rows],
            dst=rt.dst[rows],
            tag=rt.tag[rows],
            start_ns=rt.start_ns[rows],
            dur_ns=rt.dur_ns[rows],
            step=rt.step[rows],
            dtype=[]
            if rt.dtype_idx is None
            else [rt.dtypes[i] if i >= 0 else "" for i in rt.dtype_idx[rows].tolist()],
            side=None if side is None else side[rows],
        )


def step_mark_stream(manifest: Manifest) -> int | None:
    """The stream of the thread that marks steps in every rank's trace of a run, where its source says
    (:data:`~skewlens.profiler.manifest.THREAD_STREAM_SOURCES`: stream 0); None elsewhere (an imported
    profile numbers threads as Kineto did)."""
    return 0 if manifest.source in THREAD_STREAM_SOURCES else None


def _beside_steps(rt: RankTrace, mark_stream: int) -> np.ndarray | None:
    """Per row of ``rt``, whether its stream is one that no chain of control dependencies between streams
    ties to ``mark_stream`` (None where that stream holds no row: not known)."""
    if not (rt.stream == mark_stream).any():
        return None
    dst = np.repeat(np.arange(len(rt), dtype=np.int64), np.diff(rt.dep_ptr))
    src = rt.dep_idx.astype(np.int64, copy=False)
    cross = (rt.dep_kind == DEP_CTRL) & (rt.stream[src] != rt.stream[dst])
    pairs = set(zip(rt.stream[src[cross]].tolist(), rt.stream[dst[cross]].tolist(), strict=True))
    tied = {mark_stream}
    grew = True
    while grew:  # a handful of streams
        grew = False
        for a, b in pairs:
            if (a in tied) != (b in tied):
                tied |= {a, b}
                grew = True
    return ~np.isin(rt.stream, list(tied))


def without_lost(
    comm: dict[int, CommRows], lost: Sequence[LostCollectives], pg_names: list[str], sink: IssueLog
) -> tuple[dict[int, CommRows], tuple[int, ...]]:
    """``comm`` without the collectives the manifest declares lost (on every member alike), and the steps
    they make incomplete (each range reported as info)."""
    if not lost:
        return comm, ()
    steps: set[int] = set()
    drop = {r: np.zeros(c.row.shape[0], dtype=np.bool_) for r, c in comm.items()}
    for x in lost:
        steps.update(x.steps)
        last = "end" if x.last_seq < 0 else str(x.last_seq)  # as the rank's note says it (flight.Loss)
        recorders, buffers = (
            ("flight recorder", "its ring buffer wrapped; TORCH_FR_BUFFER_SIZE sizes it")
            if len(x.ranks) == 1
            else ("flight recorders", "their ring buffers wrapped; TORCH_FR_BUFFER_SIZE sizes them")
        )
        sink.info(
            "lost-collectives",
            f"{steps_label(x.steps)} incomplete: the {recorders} of {ranks_label(x.ranks)} lost "
            f"group {x.pg_name!r} seq {x.first_seq}..{last} ({buffers}); those collectives are left out of "
            "matching on every member",
        )
        if x.pg_name not in pg_names:
            continue
        gi = pg_names.index(x.pg_name)
        for r, c in comm.items():
            hit = (c.node_type == NodeType.COMM_COLL) & (c.pg == gi) & (c.seq >= x.first_seq)
            if x.last_seq >= 0:
                hit &= c.seq <= x.last_seq
            drop[r] |= hit
    return {r: c.subset(~drop[r]) for r, c in comm.items()}, tuple(sorted(steps))


def _last_steps(steps: Sequence[StepSpan], comm: Collection[int]) -> dict[int, int]:
    """Rank (of ``comm``) -> its last recorded step (``steps``: the manifest's step marks)."""
    last: dict[int, int] = {}
    for s in steps:
        if s.rank in comm:
            last[s.rank] = max(last.get(s.rank, s.step), s.step)
    return last


def without_truncated(
    comm: dict[int, CommRows],
    pg_names: list[str],
    sink: IssueLog,
    *,
    steps: Sequence[StepSpan],
    partial: Collection[int],
    groups: dict[str, ProcessGroupInfo],
) -> tuple[dict[int, CommRows], tuple[int, ...]]:
    """``comm`` without the communication that a rank whose trace ends early can no longer have: a rank
    the manifest says saved a partial trace (``partial``: it crashed, or was stopped, inside a step, and
    saved the steps it completed) whose last recorded step (``steps``: the manifest's step marks) is
    before the others'. Left out: on each group, the collectives of the steps after its earliest-ending
    such member's last, and the sends and receives with such a rank after its last. Each such rank is a
    warning; returns the steps this leaves incomplete. A rank whose steps end early without such a note
    (traces that did not record the same steps) is left to the matcher."""
    last = _last_steps(steps, comm)
    end = max(last.values(), default=-1)
    early = {r: s for r, s in last.items() if r in partial and s < end}
    if not early:
        return comm, ()
    cut = {r: np.zeros(c.row.shape[0], dtype=np.bool_) for r, c in comm.items()}
    for gi, name in enumerate(pg_names):
        members = groups[name].ranks if name in groups else ()
        ends = [early[m] for m in members if m in early]
        if not ends:
            continue
        cutoff = min(ends)
        for m in members:
            if (c := comm.get(m)) is not None:
                cut[m] |= (c.node_type == NodeType.COMM_COLL) & (c.pg == gi) & (c.step > cutoff)
    early_of = np.full(max(comm) + 1, end, dtype=np.int64)  # rank -> its last step where early, else end
    early_of[list(early)] = list(early.values())
    for r, c in comm.items():
        p2p = type_mask(c.node_type, (NodeType.COMM_SEND, NodeType.COMM_RECV))
        if not p2p.any():
            continue
        peer = np.where(c.node_type == NodeType.COMM_SEND, c.dst, c.src).astype(np.int64)
        known = (peer >= 0) & (peer < early_of.size)
        peer_last = np.where(known, early_of[np.where(known, peer, 0)], end)
        cut[r] |= p2p & (c.step > np.minimum(peer_last, early.get(r, end)))
    dropped = sum(int(x.sum()) for x in cut.values())
    for r, at in sorted(early.items()):
        sink.warning(
            "truncated-rank",
            f"rank {r}'s trace ends at step {at}, the others' at step {end} (it stopped inside a step and "
            f"saved the steps it completed): communication with it after step {at} is left out of matching "
            f"on every rank ({dropped} node(s) in all), and "
            + (f"step {end} is" if at + 1 == end else f"steps {at + 1}..{end} are")
            + " incomplete",
            rank=r,
        )
    gone = {int(st) for r, c in comm.items() for st in np.unique(c.step[cut[r]]).tolist()}
    return {r: c.subset(~cut[r]) for r, c in comm.items()}, tuple(sorted(gone))


def _step_windows(steps: Sequence[StepSpan], comm: Collection[int]) -> dict[int, tuple[int, int]]:
    """Rank (of ``comm``) -> its first and last recorded step (``steps``: the manifest's step marks)."""
    span: dict[int, tuple[int, int]] = {}
    for s in steps:
        if s.rank in comm:
            lo, hi = span.get(s.rank, (s.step, s.step))
            span[s.rank] = (min(lo, s.step), max(hi, s.step))
    return span


def _seqs_label(lo: int, hi: int) -> tuple[str, str, str]:
    """``seq`` text, pronoun phrase and object pronoun for the sequence numbers ``lo..hi``."""
    return (str(hi), "it is", "it") if lo == hi else (f"{lo}..{hi}", "they are", "them")


def _on_step_thread(c: CommRows, rows: np.ndarray) -> bool:
    """Whether any of ``rows`` (a mask of ``c``) is known to be issued by, or tied to, the thread that marks
    steps (such a thread's collectives lie inside the steps on every rank alike: one missing is a
    mismatch, not a window's edge)."""
    return c.side is not None and bool((rows & ~c.side.astype(np.bool_)).any())


def without_window_edges(
    comm: dict[int, CommRows],
    pg_names: list[str],
    sink: IssueLog,
    *,
    steps: Sequence[StepSpan],
    groups: dict[str, ProcessGroupInfo],
) -> tuple[dict[int, CommRows], tuple[int, ...]]:
    """``comm`` without the collectives that some members issued inside their recording window and others
    outside theirs, as a thread beside the steps does (a metrics, checkpoint or prefetch thread of its own,
    ``dcp.async_save``'s save): it can be inside a collective when the window begins, or run on past its
    last step. On each group:

    - head: the collectives numbered before the first one some member recorded (that member's sequence
      numbers say it issued them before its window began), where the members' step windows agree (same
      first and last recorded step) and none of them is tied to the thread that marks steps;
    - tail: those numbered past the last one some member recorded, where the members' windows ended in the
      same step and either every one of them is in that last step, or the windows agree and none of them
      is tied to the thread that marks steps.

    Each cut is a warning (``window-head``, ``window-tail``); returns the steps they leave incomplete. A
    collective some member lacks between ones it has, or one the thread that marks steps issued outside the
    last step, is left to the matcher (a mismatch)."""
    span = _step_windows(steps, comm)
    cut = {r: np.zeros(c.row.shape[0], dtype=np.bool_) for r, c in comm.items()}
    gone: set[int] = set()
    for gi, name in enumerate(pg_names):
        members = [m for m in (groups[name].ranks if name in groups else ()) if m in comm and m in span]
        if len(members) < 2:
            continue
        on = {
            m: (comm[m].node_type == NodeType.COMM_COLL) & (comm[m].pg == gi) & (comm[m].seq >= 0)
            for m in members
        }
        agree = len({span[m] for m in members}) == 1
        same_end = len({span[m][1] for m in members}) == 1
        # head: every member recorded some, and some first recorded a later one than others
        first = {m: int(comm[m].seq[on[m]].min()) for m in members if on[m].any()}
        if agree and len(first) == len(members) and len(set(first.values())) > 1:
            begin = max(first.values())
            head = {m: on[m] & (comm[m].seq < begin) for m in members}
            if not any(_on_step_thread(comm[m], head[m]) for m in members):
                for m in members:
                    cut[m] |= head[m]
                    on[m] &= ~head[m]
                at = sorted(
                    {int(s) for m in members for s in np.unique(comm[m].step[head[m]]).tolist() if s >= 0}
                )
                gone.update(at)
                seqs, they, them = _seqs_label(min(first.values()), begin - 1)
                early = ranks_label([m for m in members if first[m] < begin])
                late = ranks_label([m for m in members if first[m] == begin])
                sink.warning(
                    "window-head",
                    f"group {name!r} seq {seqs}: {early} recorded {them}, {late} issued {them} "
                    "before the recording window began (a thread beside the steps that was inside a "
                    f"collective when the window began): {they} left out of matching on every rank"
                    + (f", leaving {steps_label(at)} incomplete" if at else ""),
                )
        top = {m: int(comm[m].seq[on[m]].max()) if on[m].any() else -1 for m in members}
        # the members' windows ended in the same step (a rank that recorded a step the others did not is
        # not a window's tail but a mismatch: ranks 0 and 1 ending at step 3, rank 2 at 4 with one more)
        if len(set(top.values())) < 2 or not same_end:
            continue
        cutoff = min(top.values())
        tail = {m: on[m] & (comm[m].seq > cutoff) for m in members}
        in_last = not any((comm[m].step[tail[m]] != span[m][1]).any() for m in members)
        if not in_last and (not agree or any(_on_step_thread(comm[m], tail[m]) for m in members)):
            continue
        for m in members:
            cut[m] |= tail[m]
        at = sorted({int(s) for m in members for s in np.unique(comm[m].step[tail[m]]).tolist() if s >= 0})
        gone.update(at)
        ahead = [m for m in members if top[m] > cutoff]
        behind = [m for m in members if top[m] == cutoff]
        seqs, they, them = _seqs_label(cutoff + 1, max(top.values()))
        sink.warning(
            "window-tail",
            f"group {name!r} seq {seqs}: {ranks_label(ahead)} issued {them} before the recording window "
            f"closed, {ranks_label(behind)} only after (a thread that runs on past the window's end, such "
            f"as an asynchronous checkpoint's save): {they} left out of matching on every rank, leaving "
            f"{steps_label(at)} incomplete; to keep {them}, wait for "
            "that work (an async_save's future) within the window's last step",
        )
    if not cut or not any(x.any() for x in cut.values()):
        return comm, ()
    return {r: c.subset(~cut[r]) for r, c in comm.items()}, tuple(sorted(gone))


def matchable(
    comm: dict[int, CommRows],
    manifest: Manifest,
    groups: dict[str, ProcessGroupInfo],
    pg_names: list[str],
    sink: IssueLog,
) -> tuple[dict[int, CommRows], tuple[int, ...]]:
    """``comm`` without what the run says no rank can match (:func:`without_lost`,
    :func:`without_truncated`, :func:`without_window_edges`), and the steps that leaves incomplete: every
    matcher of a run starts here."""
    comm, lost = without_lost(comm, manifest.lost_collectives, pg_names, sink)
    partial = partial_traces(manifest.notes)
    comm, cut = without_truncated(comm, pg_names, sink, steps=manifest.steps, partial=partial, groups=groups)
    comm, edges = without_window_edges(comm, pg_names, sink, steps=manifest.steps, groups=groups)
    return comm, tuple(sorted({*lost, *cut, *edges}))


@dataclass(eq=False, kw_only=True, slots=True)
class _Mismatches:
    """Reports disagreements across ranks: errors (warnings in a lenient load, which skips what disagrees),
    the first :data:`MAX_REPORTED` of each kind one by one, then one that counts the rest."""

    sink: IssueLog
    lenient: bool
    counter: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def wants(self, kind: str) -> bool:
        """Count one problem of ``kind``; whether it is still to be reported individually."""
        self.counter[kind] += 1
        return self.counter[kind] <= MAX_REPORTED

    def add(
        self, kind: str, message: str, *, file: str = "", rank: int | None = None, node: int | None = None
    ) -> None:
        severity = Severity.WARNING if self.lenient else Severity.ERROR
        self.sink.add(severity, kind, message, file=file, rank=rank, node=node)

    def summarise(self) -> None:
        for kind, count in self.counter.items():
            if count > MAX_REPORTED:
                self.add(kind, f"... and {count - MAX_REPORTED} more {kind} problem(s) of this kind")


def match_instances(
    comm: dict[int, CommRows],
    pg_names: list[str],
    groups: dict[str, ProcessGroupInfo],
    sink: IssueLog,
    *,
    missing_ranks: frozenset[int] = frozenset(),
    lenient: bool = False,
) -> list[CollectiveInstance]:
    """Collective instances ordered by (group, seq); mismatches (type, size, count) go to ``sink``.

    Every instance whose members disagree is recorded with ``sink.skip`` as well. Strict (the default),
    its problems are errors and it is kept, with its first member's type; ``lenient``, they are warnings and
    it is left out (its members synchronise with no one).

    Vectorised: members of all ranks are sorted by (group, seq, rank) once; only instances whose
    member count, types or sizes look wrong are examined one by one.
    """
    report = _Mismatches(sink=sink, lenient=lenient)
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for rank, c in sorted(comm.items()):
        coll = np.flatnonzero(c.node_type == NodeType.COMM_COLL)
        ok = coll[(c.pg[coll] >= 0) & (c.seq[coll] >= 0)]
        no_id = np.setdiff1d(coll, ok)
        for i in no_id.tolist():
            report.add(
                "collective-without-id",
                f"{c.path}: rank {rank}: collective node {c.node_id[i]} ({c.name[i]}) has no process group "
                "/ sequence number (pg_name, skl_seq)",
                file=c.path,
                rank=rank,
                node=int(c.node_id[i]),
            )
        for g in np.unique(c.pg[no_id]).tolist():
            rows = no_id[c.pg[no_id] == g]
            sink.skip(
                SkippedComm(
                    pg_name=pg_names[g] if g >= 0 else "",
                    p2p=False,
                    reason="no process group / sequence number",
                    detail=f"rank {rank}",
                    nodes=tuple((rank, int(w)) for w in c.row[rows].tolist()),
                )
            )
        parts["rank"].append(np.full(ok.shape[0], rank, dtype=np.int64))
        parts["idx"].append(ok)
        parts["pg"].append(c.pg[ok].astype(np.int64))
        parts["seq"].append(c.seq[ok])
        parts["type"].append(c.comm_type[ok].astype(np.int64))
        parts["bytes"].append(c.comm_bytes[ok])
        parts["row"].append(c.row[ok])
        parts["step"].append(c.step[ok].astype(np.int64))
        # beside the steps: 1, tied to the thread that marks them: 0, not known: -1
        parts["side"].append(
            np.full(ok.shape[0], -1, np.int64) if c.side is None else c.side[ok].astype(np.int64)
        )
    if not parts:
        return []
    col = {k: np.concatenate(v) for k, v in parts.items()}
    if col["rank"].size == 0:
        return []
    order = np.lexsort((col["rank"], col["seq"], col["pg"]))
    col = {k: v[order] for k, v in col.items()}
    rk, pg, seq, ctype, nbytes = col["rank"], col["pg"], col["seq"], col["type"], col["bytes"]
    brk = np.flatnonzero((np.diff(pg) != 0) | (np.diff(seq) != 0)) + 1
    starts = np.concatenate([[0], brk]).astype(np.int64)
    ends = np.concatenate([brk, [rk.shape[0]]]).astype(np.int64)
    count = ends - starts
    # expected member count per instance: the group's size where known, else the ranks seen in it
    seen = {int(g): set(rk[pg == g].tolist()) for g in np.unique(pg).tolist()}
    expected_of = {
        g: set(groups[pg_names[g]].ranks) if pg_names[g] in groups else ranks for g, ranks in seen.items()
    }
    inst_pg = pg[starts]
    expect_n = np.asarray([len(expected_of[g]) for g in inst_pg.tolist()], dtype=np.int64)
    dup = np.zeros(starts.shape[0], dtype=np.bool_)
    same_rank = np.flatnonzero(np.diff(rk) == 0) + 1  # consecutive equal ranks inside one instance
    same_rank = same_rank[np.isin(same_rank, starts, invert=True)]
    dup[np.searchsorted(starts, same_rank, side="right") - 1] = True
    type_diff = np.minimum.reduceat(ctype, starts) != np.maximum.reduceat(ctype, starts)
    size_diff = np.minimum.reduceat(nbytes, starts) != np.maximum.reduceat(nbytes, starts)
    size_rule = np.isin(ctype[starts], [int(t) for t in SIZE_MUST_MATCH])
    known_type = np.isin(ctype[starts], [int(t) for t in CommType])
    odd = (count != expect_n) | dup | type_diff | (size_diff & size_rule) | ~known_type
    bad: dict[int, _Disagreement] = {}
    for k in np.flatnonzero(odd).tolist():
        a, b = int(starts[k]), int(ends[k])
        found = _explain(
            comm,
            report,
            name=pg_names[int(inst_pg[k])],
            gi=int(inst_pg[k]),
            seq=int(seq[a]),
            members=rk[a:b].tolist(),
            rows_in=col["idx"][a:b].tolist(),
            expected=expected_of[int(inst_pg[k])],
            missing_ranks=missing_ranks,
        )
        if found is not None:
            bad[k] = found
    report.summarise()
    _steps_differ(comm, sink, col, bounds=(starts, ends), agreed=~odd, pg_names=pg_names)
    for item in _skips(bad, comm, pg_names):
        sink.skip(item)
    rk_l, row_l, bytes_l = rk.tolist(), col["row"].tolist(), nbytes.tolist()
    out: list[CollectiveInstance] = []
    for k, (a, b, g, s, t) in enumerate(
        zip(
            starts.tolist(),
            ends.tolist(),
            inst_pg.tolist(),
            seq[starts].tolist(),
            ctype[starts].tolist(),
            strict=True,
        )
    ):
        if not known_type[k] or (lenient and k in bad):
            continue
        out.append(
            CollectiveInstance(
                pg_name=pg_names[g],
                seq=s,
                comm_type=CommType(t),
                ranks=tuple(rk_l[a:b]),
                rows=tuple(row_l[a:b]),
                comm_bytes=tuple(bytes_l[a:b]),
            )
        )
    return out


def _steps_differ(
    comm: dict[int, CommRows],
    sink: IssueLog,
    col: dict[str, np.ndarray],
    *,
    bounds: tuple[np.ndarray, np.ndarray],
    agreed: np.ndarray,
    pg_names: list[str],
) -> None:
    """One :data:`STEP_MISMATCH` warning where instances whose members agree (``agreed``) were issued in
    different steps on different members: the ranks marked steps differently (a ``step()`` some ranks
    called and others did not), so a step number names different work on different ranks. In no step
    (-1) on one member and in a step on another is such a difference too: that step holds the instance on
    one rank and not on the other (a set-up collective before every rank's first step is in no step on
    each, and no mismatch).

    An instance that threads beside the steps issued on every member (:attr:`CommRows.side`: a metrics,
    checkpoint or prefetch thread of its own) says nothing of the step marks: such a thread's call lands on
    either side of the main thread's step boundary, earlier on one rank than on another. Those are one
    :data:`SIDE_THREAD_STEPS` info line instead, which says so."""
    starts, ends = bounds
    step = col["step"]
    differ = agreed & (np.minimum.reduceat(step, starts) != np.maximum.reduceat(step, starts))
    beside = np.minimum.reduceat(col["side"], starts) == 1
    _side_steps(
        comm, sink, col, starts=starts[differ & beside], ends=ends[differ & beside], pg_names=pg_names
    )
    found = np.flatnonzero(differ & ~beside)
    if found.size == 0:
        return
    a, b = int(starts[found[0]]), int(ends[found[0]])
    where = _in_step(comm, col["rank"][a:b].tolist(), col["idx"][a:b].tolist())
    sink.warning(
        STEP_MISMATCH,
        f"ranks mark steps differently: {counted(int(found.size), 'collective instance')} "
        f"{'was' if found.size == 1 else 'were'} issued in different steps on different members (the first: "
        f"group '{pg_names[int(col['pg'][a])]}' seq {int(col['seq'][a])}{where}): a step mark "
        "(optimizer.step() under skewlens profile, session.step() of the Python API) that some ranks made "
        "and others did not, such as one after an evaluation pass that only some ranks mark; a step "
        "number then names different work on different ranks, and the step breakdown, the blame and the "
        "replayed step times compare unlike work; mark the same steps on every rank",
    )


def _side_steps(
    comm: dict[int, CommRows],
    sink: IssueLog,
    col: dict[str, np.ndarray],
    *,
    starts: np.ndarray,
    ends: np.ndarray,
    pg_names: list[str],
) -> None:
    """The :data:`SIDE_THREAD_STEPS` info line of the instances ``starts``/``ends`` (issued in different
    steps on different members, by threads beside the steps on every member)."""
    if starts.size == 0:
        return
    a, b = int(starts[0]), int(ends[0])
    where = _in_step(comm, col["rank"][a:b].tolist(), col["idx"][a:b].tolist())
    n = int(starts.size)
    sink.info(
        SIDE_THREAD_STEPS,
        f"{counted(n, 'collective instance')} that threads beside the steps issued (a thread with no "
        f"control dependency on the one that marks steps, such as a metrics or checkpoint thread) "
        f"{'was' if n == 1 else 'were'} issued in different steps on different members (the first: group "
        f"'{pg_names[int(col['pg'][a])]}' seq {int(col['seq'][a])}{where}): such a thread's call lands on "
        "either side of the main thread's step boundary, earlier on one rank than on another; the step "
        "marks are not at fault, and each rank's step holds the call where it made it",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Disagreement:
    """Why one collective instance's members disagree (the first that applies of unknown type, duplicate,
    count, type, size)."""

    gi: int
    seq: int
    reason: str
    detail: str
    members: tuple[tuple[int, int], ...]
    """(rank, index into that rank's CommRows) of each member."""


def _in_step(comm: dict[int, CommRows], members: list[int], rows_in: list[int]) -> str:
    """``, in step 3`` (the training step the members issued an instance in: where to look in the
    script), ``, in steps 3 (rank 0), 4 (rank 1)`` where they differ (``, in no step (rank 0), step 0 (rank
    1)`` where some member's is in none), or '' where no member's is known."""
    steps = {r: int(comm[r].step[i]) for r, i in zip(members, rows_in, strict=True)}
    if max(steps.values(), default=-1) < 0:
        return ""
    if len(set(steps.values())) == 1:
        return f", in step {next(iter(steps.values()))}"
    if min(steps.values()) < 0:
        return ", in " + ", ".join(
            f"step {st} (rank {r})" if st >= 0 else f"no step (rank {r})" for r, st in steps.items()
        )
    return ", in steps " + ", ".join(f"{st} (rank {r})" for r, st in steps.items())


def _explain(
    comm: dict[int, CommRows],
    report: _Mismatches,
    *,
    name: str,
    gi: int,
    seq: int,
    members: list[int],
    rows_in: list[int],
    expected: set[int],
    missing_ranks: frozenset[int],
) -> _Disagreement | None:
    """Issues for one instance whose members may disagree (count, duplicates, type, size, unknown type),
    and why they do (None: they agree; only ranks without a trace are absent)."""
    s = seq
    at = _in_step(comm, members, rows_in)
    types = [int(comm[r].comm_type[i]) for r, i in zip(members, rows_in, strict=True)]
    sizes = [int(comm[r].comm_bytes[i]) for r, i in zip(members, rows_in, strict=True)]
    why: list[tuple[str, str]] = []
    if types[0] not in set(CommType):
        r0, i0 = members[0], rows_in[0]
        why.append(("unknown type", f"rank {r0}: {comm_type_name(types[0])}"))
        if report.wants("collective-unknown-type"):
            report.add(
                "collective-unknown-type",
                f"{comm[r0].path}: rank {r0}: collective node {comm[r0].node_id[i0]} in group {name!r} "
                f"seq {s} has {comm_type_name(types[0])}",
                file=comm[r0].path,
                rank=r0,
                node=int(comm[r0].node_id[i0]),
            )
    if len(set(members)) != len(members):
        dup = sorted({r for r in members if members.count(r) > 1})
        why.append(("issued more than once", f"rank(s) {rank_ranges(dup)}"))
        if report.wants("collective-duplicate"):
            report.add(
                "collective-duplicate",
                f"collective mismatch in group {name!r} seq {s}: rank(s) {dup} issue this instance "
                "more than once",
                rank=dup[0] if len(dup) == 1 else None,
            )
    absent = [r for r in sorted(expected - set(members)) if r not in missing_ranks and r in comm]
    if absent:
        why.append(("count differs", f"absent on rank(s) {rank_ranges(absent)}"))
    for r in absent:
        if report.wants("collective-count"):
            n_r = int(np.count_nonzero((comm[r].pg == gi) & (comm[r].node_type == NodeType.COMM_COLL)))
            report.add(
                "collective-count",
                f"collective mismatch in group {name!r} seq {s}: rank {r} has no such collective "
                f"(count differs: rank {r} issued {n_r} collective(s) on this group; present on "
                f"rank(s) {members}){at}",
                rank=r,
            )
    if len(set(types)) > 1:
        why.append(("types differ", per_rank(dict(zip(members, map(comm_type_name, types), strict=True)))))
        if report.wants("collective-type"):
            detail = ", ".join(
                f"rank {r}: {comm_type_name(t)} (node {comm[r].node_id[i]})"
                for r, t, i in zip(members, types, rows_in, strict=True)
            )
            k = _odd_member(types)
            report.add(
                "collective-type",
                f"collective mismatch in group {name!r} seq {s}: type differs ({detail}){at}",
                rank=members[k],
                node=int(comm[members[k]].node_id[rows_in[k]]),
            )
    elif types[0] in SIZE_MUST_MATCH and len(set(sizes)) > 1:
        why.append(("sizes differ", sizes_per_rank(dict(zip(members, sizes, strict=True)))))
        if report.wants("collective-size"):
            detail = ", ".join(f"rank {r}: {z} B" for r, z in zip(members, sizes, strict=True))
            k = _odd_member(sizes)
            report.add(
                "collective-size",
                f"collective mismatch in group {name!r} seq {s} ({comm_type_name(types[0])}): size "
                f"differs ({detail}){at}",
                rank=members[k],
                node=int(comm[members[k]].node_id[rows_in[k]]),
            )
    if not why:
        return None
    reason, detail = why[0]
    return _Disagreement(
        gi=gi, seq=seq, reason=reason, detail=detail, members=tuple(zip(members, rows_in, strict=True))
    )


def _odd_member(values: list[int]) -> int:
    """Index of the member that disagrees (``values`` differ): the first whose value is not the one most
    members share, or where none is shared by most, the first whose value is not the first member's (the
    instance is kept with the first member's type)."""
    common, n = Counter(values).most_common(1)[0]
    ref = common if 2 * n > len(values) else values[0]
    return next(k for k, v in enumerate(values) if v != ref)


#: An ``order differs`` run longer than this shows its first types only.
SHOWN_ORDER = 4


def _skips(
    bad: dict[int, _Disagreement], comm: dict[int, CommRows], pg_names: list[str]
) -> list[SkippedComm]:
    """What a lenient load skips, one item per disagreeing instance; consecutive instances of a group whose
    types differ, where every rank issues the same types in another order, are one ``order differs``."""
    out: list[SkippedComm] = []
    items = sorted(bad.values(), key=lambda d: (d.gi, d.seq))
    k = 0
    while k < len(items):
        d = items[k]
        j = k + 1
        if d.reason == "types differ":
            while (
                j < len(items)
                and items[j].reason == "types differ"
                and items[j].gi == d.gi
                and items[j].seq == items[j - 1].seq + 1
            ):
                j += 1
        run = items[k:j]
        order = _order_differs(run, comm) if len(run) > 1 else None
        if order is not None:
            out.append(
                SkippedComm(
                    pg_name=pg_names[d.gi],
                    p2p=False,
                    reason="order differs",
                    detail=order,
                    seqs=tuple(x.seq for x in run),
                    nodes=tuple((r, int(comm[r].row[i])) for x in run for r, i in x.members),
                )
            )
        else:
            out.extend(
                SkippedComm(
                    pg_name=pg_names[x.gi],
                    p2p=False,
                    reason=x.reason,
                    detail=x.detail,
                    seqs=(x.seq,),
                    nodes=tuple((r, int(comm[r].row[i])) for r, i in x.members),
                )
                for x in run
            )
        k = j
    return out


def _order_differs(run: list[_Disagreement], comm: dict[int, CommRows]) -> str | None:
    """For consecutive instances whose types differ: each rank's types in seq order, when every rank issues
    the same types (in another order) over them, else None."""
    ranks = {r for r, _ in run[0].members}
    if any({r for r, _ in x.members} != ranks or len(x.members) != len(ranks) for x in run):
        return None
    seqs: dict[int, list[str]] = {r: [] for r in ranks}
    for x in run:
        for r, i in x.members:
            seqs[r].append(comm_type_name(int(comm[r].comm_type[i])))
    if len({tuple(sorted(v)) for v in seqs.values()}) != 1:
        return None
    more = f" ({len(run)} in all)" if len(run) > SHOWN_ORDER else ""
    return per_rank({r: " then ".join(v[:SHOWN_ORDER]) + more for r, v in seqs.items()})


def match_pairs(
    comm: dict[int, CommRows], pg_names: list[str], sink: IssueLog, *, lenient: bool = False
) -> list[P2PPair]:
    """Pair the k-th send a->b (per group and tag) with the k-th recv on b from a.

    Ops without a peer or a partner are never paired; a send and recv of different sizes are paired unless
    ``lenient`` (then their problems are warnings, not errors). Each is recorded with ``sink.skip``.
    """
    report = _Mismatches(sink=sink, lenient=lenient)

    def skip(gi: int, reason: str, detail: str, nodes: list[tuple[int, int]]) -> None:
        sink.skip(
            SkippedComm(
                pg_name=pg_names[gi] if gi >= 0 else "",
                p2p=True,
                reason=reason,
                detail=detail,
                nodes=tuple((r, int(comm[r].row[i])) for r, i in nodes),
            )
        )

    sends: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    for rank, c in sorted(comm.items()):
        for ntype, what, peer_of, attr in (
            (NodeType.COMM_SEND, "send", c.dst, "destination rank (comm_dst)"),
            (NodeType.COMM_RECV, "recv", c.src, "source rank (comm_src)"),
        ):
            for i in np.flatnonzero(c.node_type == ntype).tolist():
                peer = int(peer_of[i])
                if peer >= 0:
                    is_send = ntype == NodeType.COMM_SEND
                    src_dst = (rank, peer) if is_send else (peer, rank)
                    (sends if is_send else recvs)[(*src_dst, int(c.pg[i]), int(c.tag[i]))].append(i)
                    continue
                skip(int(c.pg[i]), f"{what} without a peer", f"rank {rank} node {c.node_id[i]}", [(rank, i)])
                if report.wants("p2p-no-peer"):
                    report.add(
                        "p2p-no-peer",
                        f"{c.path}: rank {rank}: {what} node {c.node_id[i]} ({c.name[i]}) has no {attr}",
                        file=c.path,
                        rank=rank,
                        node=int(c.node_id[i]),
                    )
    pairs: list[P2PPair] = []
    for key in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(key, []), recvs.get(key, [])
        src, dst, gi, tag = key
        counts = f"rank {src} -> {dst}, tag {tag}: {len(s)} send(s), {len(rv)} recv(s)"
        absent = dst if dst not in comm else src if src not in comm else None
        gone = f"rank {absent} has no trace" if absent is not None else ""
        if len(rv) > len(s):
            skip(gi, gone or "no matching send", counts, [(dst, i) for i in rv[len(s) :]])
        if len(s) > len(rv):
            skip(gi, gone or "no matching recv", counts, [(src, i) for i in s[len(rv) :]])
        if absent is not None:  # one error for the lot: each op's own would repeat the missing rank's
            if report.wants("p2p-unmatched"):
                r, ops = (src, s) if absent == dst else (dst, rv)
                what = f"{len(ops)} send(s) to" if absent == dst else f"{len(ops)} recv(s) from"
                ids = rank_ranges(int(comm[r].node_id[i]) for i in ops)
                nodes = f"nodes {ids} have" if len(ops) > 1 else f"node {ids} has"
                report.add(
                    "p2p-unmatched",
                    f"p2p mismatch: rank {r} posts {what} rank {absent} (tag {tag}), which has no trace: "
                    f"{nodes} no partner",
                    rank=r,
                    node=int(comm[r].node_id[ops[0]]),
                )
            continue
        for k in range(len(s), len(rv)):
            if report.wants("p2p-unmatched"):
                node = int(comm[dst].node_id[rv[k]])
                report.add(
                    "p2p-unmatched",
                    f"p2p mismatch: recv node {node} on rank {dst} (from rank {src}, tag {tag}) has no "
                    f"matching send: rank {src} sends {len(s)} message(s) to rank {dst}, rank {dst} posts "
                    f"{len(rv)} recv(s)",
                    rank=dst,
                    node=node,
                )
        for k in range(len(rv), len(s)):
            if report.wants("p2p-unmatched"):
                node = int(comm[src].node_id[s[k]])
                report.add(
                    "p2p-unmatched",
                    f"p2p mismatch: send node {node} on rank {src} (to rank {dst}, tag {tag}) has no "
                    f"matching recv: rank {src} sends {len(s)} message(s) to rank {dst}, "
                    f"rank {dst} posts {len(rv)} recv(s)",
                    rank=src,
                    node=node,
                )
        for a, b in zip(s, rv, strict=False):
            sb, rb = int(comm[src].comm_bytes[a]), int(comm[dst].comm_bytes[b])
            if sb != rb:
                skip(
                    gi,
                    "sizes differ",
                    f"send {sizes_per_rank({src: sb})}, recv {sizes_per_rank({dst: rb})}",
                    [(src, a), (dst, b)],
                )
                if report.wants("p2p-size"):
                    report.add(
                        "p2p-size",
                        f"p2p mismatch: send node {comm[src].node_id[a]} on rank {src} sends {sb} B but recv "
                        f"node {comm[dst].node_id[b]} on rank {dst} expects {rb} B (tag {tag})",
                        rank=src,
                    )
                if lenient:
                    continue
            pairs.append(
                P2PPair(
                    src_rank=src,
                    src_row=int(comm[src].row[a]),
                    dst_rank=dst,
                    dst_row=int(comm[dst].row[b]),
                    comm_bytes=sb,
                    tag=tag,
                    pg_name=pg_names[gi] if gi >= 0 else "",
                )
            )
    report.summarise()
    return pairs
