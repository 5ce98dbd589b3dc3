"""Lower the trace store's :class:`RunTrace` to the core's :class:`~skewlens.replay.core.Graph`, and lift
results back.

**Dependencies.** On every rank, node ``i`` depends on (see :func:`_edges`): its recorded ctrl/data
dependencies; its predecessor on its *timeline* (its stream, with host streams that never run concurrently
merged into one thread): the earlier-starting node with the latest end, unless ``i`` is nested inside it;
and, inferred, the communication node whose completion a blocked host thread was waiting for.

**Start dependencies vs queue order.** An edge ``d -> i`` with ``recorded end_d <= recorded start_i`` (or
overlapping by no more than ``SKEW_NS`` of clock skew) constrains ``i``'s start. If ``d`` was still running
when ``i`` started and ``i`` is communication, ``i`` was queued behind ``d`` (an async collective issued
while the previous one on its stream was in flight): ``i``'s arrival does not wait, its transfer does. Other
overlapping edges (nested operators, kernels launched inside their CPU op) do not constrain the replay.

**Host gaps.** With ``deps_i`` the start dependencies,

    gap_i = recorded start_i - max(recorded end of deps_i)   (clamped >= 0)

and for a node without them ``gap_i = recorded start_i - t0_rank`` (the rank's first recorded start). In
replay ``start_i = max(replayed ends of deps_i, t0_rank) + gap_i + delay_i``, ``delay_i`` from
:meth:`Effects.delay_before_ns` (plus :meth:`Effects.stall_ns` on the first node of a step). Replaying an
unmodified trace therefore reproduces its recorded times (up to skew clamping). METADATA nodes keep their
recorded times and constrain nothing.

**Durations.** Compute nodes last ``recorded dur (or dur_override) x Effects.compute_factor``.
Communication nodes of a matched collective instance or send/recv pair become members of a sync group
(``skewlens.replay.core``), timed by a :class:`CommTiming`; unmatched ones replay like compute.

**Segments.** Chains of compute nodes with one dependency and one dependent each are collapsed into one
segment (their relative timing is fixed), which is what lets the core replay long compute chains quickly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from skewlens.profiler.store.model import CollectiveInstance, P2PPair, RankTrace, RunTrace
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.core import SYNC, Flow, Graph
from skewlens.replay.effects import Effects, NoEffects
from skewlens.replay.errors import ConfigError

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

KIND_COMPUTE = 0
KIND_SYNC = 1
KIND_FIXED = 2  # METADATA / INVALID: recorded times, no dependencies

_MIN = np.iinfo(np.int64).min

#: A node that starts at most this long before its dependency ends (and ends after it) still follows it:
#: the overlap is clock skew between trace sources, not concurrency.
SKEW_NS = 20_000
#: Host streams whose busy times overlap by at most this fraction are replayed as one thread.
MERGE_OVERLAP = 0.01
#: A host node starting at most this long after a communication node completed, on a thread that had
#: been idle ``WAIT_RATIO`` times longer before the completion, is taken to have waited for it.
WAIT_SLACK_NS = 1_000_000
WAIT_RATIO = 10


class CommTiming(Protocol):
    """Transfer times of sync groups (ns after the last member's arrival, per member)."""

    def collective(
        self, comm_type: CommType, nbytes: int, ranks: Sequence[int], step: int, recorded: list[int]
    ) -> list[int]:
        """Per-member transfer of a collective; ``recorded`` is the as-recorded transfer per member."""
        ...

    def p2p(self, src: int, dst: int, nbytes: int, step: int, recorded: list[int]) -> list[int]:
        """Transfer of a send/recv pair for ``[sender, receiver]``."""
        ...

    def flow(self, ranks: Sequence[int], alone_ns: int) -> Flow | None:
        """Contention-mode flow of a group over ``ranks`` (None: no contention modelling)."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncInfo:
    """Where each sync group of the graph came from."""

    is_p2p: bool
    """True for a send/recv pair, False for a collective instance."""
    index: int
    """Index into ``run.collectives`` or ``run.p2p``."""
    rows: tuple[int, ...]
    """Global rows of the members."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Lowered:
    """The core graph plus what is needed to map segment times back to trace rows."""

    graph: Graph
    """The core's input."""
    ranks: tuple[int, ...]
    """Global ranks, in the order their rows are concatenated."""
    row_offset: I64
    """First global row of each rank in ``ranks`` (length ``len(ranks) + 1``)."""
    seg_of_row: I64
    """Segment of each global row."""
    off_start: I64
    """Start of each row relative to its segment head's start."""
    dur: I64
    """Replayed duration of each compute / fixed row (0 for sync rows)."""
    kind: npt.NDArray[np.int8]
    """KIND_* of each row."""
    syncs: tuple[SyncInfo, ...]
    """Origin of each sync group, aligned with ``graph.groups``."""


def union_intervals(starts: I64, ends: I64) -> tuple[I64, I64]:
    """Merge intervals ``[start, end)`` into disjoint ones, sorted."""
    if starts.size == 0:
        return starts, ends
    o = np.argsort(starts, kind="stable")
    st, en = starts[o], ends[o]
    reach = np.maximum.accumulate(en)
    new = np.ones(st.size, dtype=np.bool_)
    new[1:] = st[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return st[idx], np.maximum.reduceat(en, idx)


def _timelines(rt: RankTrace, valid: B, end: I64) -> I64:
    """Timeline of each row: its stream, with host streams that never run concurrently merged into one.

    Tracers may give one host thread several stream ids (communication calls and operators recorded by
    different sources); streams whose busy times overlap by at most ``MERGE_OVERLAP`` of the less busy one
    are taken as one thread, so program order holds across them.
    """
    tl = rt.stream.astype(np.int64, copy=True)
    rows = np.flatnonzero(valid)
    streams = np.unique(rt.stream[rows])
    if streams.size < 2:
        return tl
    info = []
    for sid in streams.tolist():
        m = rows[rt.stream[rows] == sid]
        a, b = union_intervals(rt.start_ns[m], end[m])
        info.append((int(rt.start_ns[m].min()), int(sid), bool(rt.is_cpu[m].all()), a, b))
    info.sort(key=lambda x: (x[0], x[1]))
    groups: list[tuple[int, I64, I64]] = []  # host groups: (representative stream, union starts, ends)
    for _first, sid, host, a, b in info:
        if not host:
            continue
        busy = int((b - a).sum())
        for k, (rep, ga, gb) in enumerate(groups):
            ua, ub = union_intervals(np.concatenate([ga, a]), np.concatenate([gb, b]))
            g_busy = int((gb - ga).sum())
            inter = g_busy + busy - int((ub - ua).sum())
            if inter <= MERGE_OVERLAP * min(g_busy, busy):
                groups[k] = (rep, ua, ub)
                tl[rt.stream == sid] = rep
                break
        else:
            groups.append((sid, a, b))
    return tl


def _edges(rt: RankTrace, valid: B, end: I64, sync: B) -> tuple[I64, I64]:
    """Dependency edges ``(src, dst)`` of one rank: recorded deps, timeline order, and inferred waits.

    - the predecessor on the node's timeline is the earlier-starting node with the latest end; a node
      nested inside it (ending no later) gets no edge;
    - *inferred waits*: a host node that starts at most ``WAIT_SLACK_NS`` after a communication node on
      another timeline completed, on a thread that had been idle ``WAIT_RATIO`` times longer before that,
      waited for it (a blocking ``wait()`` on asynchronous work leaves exactly this gap): it gets an edge.

    Whether an edge constrains the start or only the transfer is decided by :func:`lower` from the
    recorded times. Every edge added here holds in the recorded run, so replaying it unmodified is exact.
    """
    n = len(rt)
    counts = np.diff(rt.dep_ptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), counts)
    src = rt.dep_idx.astype(np.int64, copy=False)
    keep = (src != dst) & valid[src] & valid[dst] if n else np.zeros(0, dtype=np.bool_)
    srcs, dsts = [src[keep]], [dst[keep]]
    rows = np.flatnonzero(valid)
    if rows.size:
        timeline = _timelines(rt, valid, end)
        order = rows[np.lexsort((rows, rt.start_ns[rows], timeline[rows]))]
        cuts = np.flatnonzero(np.diff(timeline[order])) + 1
        comm_rows = rows[sync[rows]]
        for part in np.split(order, cuts):
            e = end[part]
            runmax = np.maximum.accumulate(e)
            if part.size >= 2:
                holder = np.maximum.accumulate(np.where(e == runmax, np.arange(part.size), 0))
                free = runmax[:-1]
                ok = (free <= rt.start_ns[part[1:]]) | (e[1:] > free)  # follows it, or overlaps partially
                srcs.append(part[holder[:-1][ok]])
                dsts.append(part[1:][ok])
            cs = comm_rows[timeline[comm_rows] != timeline[part[0]]]
            if cs.size and rt.is_cpu[part].all():
                starts = rt.start_ns[part]
                done = end[cs]
                k = np.searchsorted(starts, done, side="left")
                inside = k < part.size
                cs, done, k = cs[inside], done[inside], k[inside]
                prev_end = np.where(k > 0, runmax[np.maximum(k - 1, 0)], _MIN)
                delta, idle = starts[k] - done, done - prev_end
                waited = (delta <= WAIT_SLACK_NS) & (delta * WAIT_RATIO <= idle)
                srcs.append(cs[waited])
                dsts.append(part[k[waited]])
    s = np.concatenate(srcs)
    d = np.concatenate(dsts)
    key = np.sort(d * max(n, 1) + s)  # dedupe (sort-based: cheaper than np.unique's hashing here)
    if key.size:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    return key % max(n, 1), key // max(n, 1)


def _rank_structure(rt: RankTrace, valid: B, sync: B) -> tuple[I64, I64, I64, I64, I64, int]:
    """Start edges ``(src, dst)``, queue-order edges, recorded host gaps and ``t0`` of one rank."""
    end = rt.start_ns + rt.dur_ns
    src, dst = _edges(rt, valid, end, sync)
    ov = end[src] - rt.start_ns[dst]  # > 0: the dependency was still running when the node started
    # a compute node that starts before its dependency ends but is not nested in it (ends later and
    # started later) follows it: the overlap is timestamp skew between trace sources, whatever its size
    later = (end[dst] >= end[src]) & (rt.start_ns[dst] > rt.start_ns[src])
    follows = (ov <= 0) | ((ov <= SKEW_NS) & (end[dst] >= end[src])) | (later & ~sync[dst])
    queued = ~follows & sync[dst]
    qs, qd = src[queued], dst[queued]
    src, dst = src[follows], dst[follows]
    depmax = np.full(len(rt), _MIN, dtype=np.int64)
    np.maximum.at(depmax, dst, end[src])
    t0 = int(rt.start_ns[valid].min()) if valid.any() else 0
    gap = np.maximum(np.where(depmax > _MIN, rt.start_ns - depmax, rt.start_ns - t0), 0)
    gap[~valid] = 0
    return src, dst, qs, qd, gap, t0


def _sync_rows(run: RunTrace) -> dict[int, list[int]]:
    """Rows of each rank that are members of a matched collective instance or send/recv pair."""
    out: dict[int, list[int]] = {r: [] for r in run.ranks}
    for c in run.collectives:
        for r, row in zip(c.ranks, c.rows, strict=True):
            if r in out:
                out[r].append(row)
    for p in run.p2p:
        if p.src_rank in out and p.dst_rank in out:
            out[p.src_rank].append(p.src_row)
            out[p.dst_rank].append(p.dst_row)
    return out


def recorded_gaps(run: RunTrace) -> dict[int, I64]:
    """Per rank, the recorded host gap before each row exactly as :func:`simulate` derives it.

    Use these (scaled, replaced) as ``gap_override`` values: the simulator's dependency rules (timelines,
    skew, queue order, inferred waits; see the module docstring) decide what a gap is measured from.
    """
    rows_of = _sync_rows(run)
    out: dict[int, I64] = {}
    for r, rt in run.ranks.items():
        valid = (rt.node_type != NodeType.METADATA) & (rt.node_type != NodeType.INVALID)
        sync = np.zeros(len(rt), dtype=np.bool_)
        sync[rows_of[r]] = True
        out[r] = _rank_structure(rt, valid, sync)[4]
    return out


def lower(
    run: RunTrace,
    *,
    effects: Effects,
    timing: CommTiming,
    dur_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    gap_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
) -> Lowered:
    """Build the core graph of ``run`` (see the module docstring for the timing rules)."""
    ranks = tuple(sorted(run.ranks))
    sizes = [len(run.ranks[r]) for r in ranks]
    row_offset = np.zeros(len(ranks) + 1, dtype=np.int64)
    np.cumsum(sizes, out=row_offset[1:])
    pos = {r: i for i, r in enumerate(ranks)}
    total = int(row_offset[-1])
    kind = np.zeros(total, dtype=np.int8)
    # sync membership first (it decides which comm rows are compute-like)
    sync_rows: list[tuple[int, ...]] = []
    syncs: list[SyncInfo] = []
    for ci, c in enumerate(run.collectives):
        # members on ranks that were not loaded (missing traces) cannot hold the others back
        members = tuple(
            int(row_offset[pos[r]]) + row for r, row in zip(c.ranks, c.rows, strict=True) if r in pos
        )
        if not members:
            continue
        sync_rows.append(members)
        syncs.append(SyncInfo(is_p2p=False, index=ci, rows=members))
    for pi, pp in enumerate(run.p2p):
        if pp.src_rank not in pos or pp.dst_rank not in pos:
            continue
        members = (
            int(row_offset[pos[pp.src_rank]]) + pp.src_row,
            int(row_offset[pos[pp.dst_rank]]) + pp.dst_row,
        )
        sync_rows.append(members)
        syncs.append(SyncInfo(is_p2p=True, index=pi, rows=members))
    for members in sync_rows:
        kind[list(members)] = KIND_SYNC

    start = np.empty(total, dtype=np.int64)
    rec_end = np.empty(total, dtype=np.int64)
    dur = np.zeros(total, dtype=np.int64)
    gap = np.zeros(total, dtype=np.int64)
    ready0 = np.zeros(total, dtype=np.int64)
    step_all = np.empty(total, dtype=np.int64)
    e_src: list[I64] = []
    e_dst: list[I64] = []
    x_src: list[I64] = []
    x_dst: list[I64] = []
    identity = isinstance(effects, NoEffects)
    for i, r in enumerate(ranks):
        rt = run.ranks[r]
        lo, hi = int(row_offset[i]), int(row_offset[i + 1])
        n = hi - lo
        if n == 0:
            continue
        ntype = rt.node_type
        valid = (ntype != NodeType.METADATA) & (ntype != NodeType.INVALID)
        kind[lo:hi][~valid] = KIND_FIXED
        end = rt.start_ns + rt.dur_ns
        start[lo:hi] = rt.start_ns
        rec_end[lo:hi] = end
        step_all[lo:hi] = rt.step
        src, dst, qs, qd, g, t0 = _rank_structure(rt, valid, kind[lo:hi] == KIND_SYNC)
        x_src.append(qs + lo)
        x_dst.append(qd + lo)
        if gap_override is not None and r in gap_override:
            ov = _checked_override(gap_override[r], n, r, "gap_override")
            g = np.where(ov >= 0, ov, g)
        d = rt.dur_ns.copy()
        if dur_override is not None and r in dur_override:
            ov = _checked_override(dur_override[r], n, r, "dur_override")
            d = np.where(ov >= 0, ov, d)
        comp = ntype == NodeType.COMP
        if not identity:
            d = _apply_factors(effects, rt, r, d, comp)
            g = g + _delays(effects, rt, r, valid)
        rk = kind[lo:hi]
        d[rk == KIND_SYNC] = 0
        fixed = rk == KIND_FIXED
        g[fixed] = 0
        dur[lo:hi] = d
        gap[lo:hi] = g
        ready0[lo:hi] = np.where(fixed, rt.start_ns, t0)
        e_src.append(src + lo)
        e_dst.append(dst + lo)
    src_all = np.concatenate(e_src) if e_src else np.zeros(0, dtype=np.int64)
    dst_all = np.concatenate(e_dst) if e_dst else np.zeros(0, dtype=np.int64)

    xs_all = np.concatenate(x_src) if x_src else np.zeros(0, dtype=np.int64)
    xd_all = np.concatenate(x_dst) if x_dst else np.zeros(0, dtype=np.int64)
    # rows with a queue-order successor must end a segment: count those edges as successors too
    graph_parts = _segments(
        kind=kind,
        dur=dur,
        gap=gap,
        ready0=ready0,
        src=src_all,
        dst=dst_all,
        extra_succ=np.bincount(xs_all, minlength=total),
    )
    seg_of_row, off_start, g_ready0, g_gap, g_len, ndeps, succ_ptr, succ_idx, head_rows = graph_parts
    nseg_all = len(head_rows)
    xs_seg, xd_seg = seg_of_row[xs_all], seg_of_row[xd_all]
    order = np.argsort(xs_seg, kind="stable")
    xsucc_idx = xd_seg[order]
    xsucc_ptr = np.zeros(nseg_all + 1, dtype=np.int64)
    np.cumsum(np.bincount(xs_seg, minlength=nseg_all), out=xsucc_ptr[1:])
    # latest recorded end of each sync row's queue-order dependencies
    xdep_end = np.full(total, _MIN, dtype=np.int64)
    np.maximum.at(xdep_end, xd_all, rec_end[xs_all])
    xdep_count = np.bincount(xd_all, minlength=total)
    nseg = len(head_rows)
    sync_of = np.full(nseg, -1, dtype=np.int64)
    groups: list[list[int]] = []
    transfer: list[list[int]] = []
    flows: list[Flow] = []
    group_xdeps: list[int] = []
    use_flows = True
    for gi, info in enumerate(syncs):
        rows = np.asarray(info.rows, dtype=np.int64)
        segs = seg_of_row[rows]
        sync_of[segs] = gi
        groups.append(segs.tolist())
        launch = max(int(start[rows].max()), int(xdep_end[rows].max()))
        recorded = np.maximum(rec_end[rows] - launch, 0).tolist()
        group_xdeps.append(int(xdep_count[rows].sum()))
        step = int(step_all[rows[0]])
        if info.is_p2p:
            pair: P2PPair = run.p2p[info.index]
            tr = timing.p2p(pair.src_rank, pair.dst_rank, pair.comm_bytes, step, recorded)
            member_ranks: Sequence[int] = (pair.src_rank, pair.dst_rank)
        else:
            inst: CollectiveInstance = run.collectives[info.index]
            nbytes = max(inst.comm_bytes, default=0)
            tr = timing.collective(inst.comm_type, nbytes, inst.ranks, step, recorded)
            member_ranks = inst.ranks
        transfer.append(tr)
        if use_flows:
            fl = timing.flow(member_ranks, max(tr, default=0))
            if fl is None:
                use_flows = False
            else:
                flows.append(fl)
    graph = Graph(
        ready0=g_ready0.tolist(),
        gap=g_gap.tolist(),
        length=g_len.tolist(),
        ndeps=ndeps.tolist(),
        succ_ptr=succ_ptr.tolist(),
        succ_idx=succ_idx.tolist(),
        sync_of=sync_of.tolist(),
        groups=groups,
        transfer=transfer,
        flows=flows if use_flows and syncs else None,
        xsucc_ptr=xsucc_ptr.tolist(),
        xsucc_idx=xsucc_idx.tolist(),
        group_xdeps=group_xdeps,
    )
    return Lowered(
        graph=graph,
        ranks=ranks,
        row_offset=row_offset,
        seg_of_row=seg_of_row,
        off_start=off_start,
        dur=dur,
        kind=kind,
        syncs=tuple(syncs),
    )


def _checked_override(ov: npt.ArrayLike, n: int, rank: int, what: str) -> I64:
    a = np.asarray(ov, dtype=np.int64)
    if a.shape != (n,):
        raise ConfigError(f"{what}[{rank}]: expected {n} values (one per node of rank {rank}), got {a.shape}")
    return a


def _apply_factors(effects: Effects, rt: RankTrace, rank: int, d: I64, comp: B) -> I64:
    """Multiply compute durations by ``effects.compute_factor``, evaluated once per (step, name)."""
    rows = np.flatnonzero(comp)
    if rows.size == 0:
        return d
    nn = max(len(rt.names), 1)
    key = (rt.step[rows].astype(np.int64) + 1) * nn + rt.name_idx[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    fac = np.array(
        [effects.compute_factor(rank, int(k // nn) - 1, rt.names[int(k % nn)]) for k in uniq.tolist()],
        dtype=np.float64,
    )
    if (fac <= 0).any() or not np.isfinite(fac).all():
        raise ConfigError(f"rank {rank}: compute factor must be a positive number, got {fac.min()}")
    if (fac == 1.0).all():
        return d
    out = d.copy()
    out[rows] = np.rint(d[rows] * fac[inv]).astype(np.int64)
    return out


def _delays(effects: Effects, rt: RankTrace, rank: int, valid: B) -> I64:
    """``effects.delay_before_ns`` per node (once per (step, type, name)) plus per-step stalls."""
    n = len(rt)
    out = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(valid)
    if rows.size == 0:
        return out
    nn = max(len(rt.names), 1)
    key = ((rt.step[rows].astype(np.int64) + 1) * 16 + rt.node_type[rows]) * nn + rt.name_idx[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    vals = []
    for k in uniq.tolist():
        step, rest = divmod(k, 16 * nn)
        ntype, name = divmod(rest, nn)
        vals.append(int(effects.delay_before_ns(rank, step - 1, NodeType(ntype), rt.names[name])))
    delay = np.asarray(vals, dtype=np.int64)
    if (delay < 0).any():
        raise ConfigError(f"rank {rank}: delay before a node must be >= 0 ns, got {int(delay.min())}")
    out[rows] = delay[inv]
    order = rows[np.lexsort((rows, rt.start_ns[rows]))]
    steps, first = np.unique(rt.step[order], return_index=True)
    for st, fi in zip(steps.tolist(), first.tolist(), strict=True):
        if st < 0:
            continue
        stall = int(effects.stall_ns(rank, st))
        if stall < 0:
            raise ConfigError(f"rank {rank}: stall at step {st} must be >= 0 ns, got {stall}")
        out[order[fi]] += stall
    return out


def _segments(
    *,
    kind: npt.NDArray[np.int8],
    dur: I64,
    gap: I64,
    ready0: I64,
    src: I64,
    dst: I64,
    extra_succ: npt.NDArray[np.intp],
) -> tuple[I64, I64, I64, I64, I64, I64, I64, I64, I64]:
    """Collapse single-dependency compute chains into segments (pointer jumping, O(n log chain))."""
    n = kind.shape[0]
    ndeps_row = np.bincount(dst, minlength=n)
    nsucc_row = np.bincount(src, minlength=n) + extra_succ
    pred = np.arange(n, dtype=np.int64)
    one = ndeps_row[dst] == 1
    pred[dst[one]] = src[one]
    compute = kind == KIND_COMPUTE
    internal = compute & (ndeps_row == 1) & compute[pred] & (nsucc_row[pred] == 1) & (pred != np.arange(n))
    rows = np.arange(n, dtype=np.int64)
    for _attempt in range(2):
        is_head = ~internal
        w = np.where(internal, dur[pred] + gap, 0).astype(np.int64)
        ptr = np.where(internal, pred, rows)
        acc = w.copy()
        # runs of chain rows that follow their predecessor row by row (the common case) are summed with
        # one cumsum: each such row points straight at the row before its run
        contiguous = internal & (pred == rows - 1)
        if contiguous.any():
            anchor = np.maximum.accumulate(np.where(contiguous, 0, rows))
            csum = np.cumsum(np.where(contiguous, w, 0))
            ptr = np.where(contiguous, anchor, ptr)
            acc = np.where(contiguous, csum - csum[anchor], acc)
        for _ in range(n.bit_length() + 1):
            if is_head[ptr].all():
                break
            acc = acc + acc[ptr]
            ptr = ptr[ptr]
        else:
            # a dependency cycle among chain rows: make them heads so the core reports the deadlock
            internal &= is_head[ptr]
            continue
        break
    heads = np.flatnonzero(is_head)
    seg_index = np.full(n, -1, dtype=np.int64)
    seg_index[heads] = np.arange(heads.size, dtype=np.int64)
    seg_of_row = seg_index[ptr]
    nseg = heads.size
    length = np.zeros(nseg, dtype=np.int64)
    np.maximum.at(length, seg_of_row, acc + dur)
    length[kind[heads] == KIND_SYNC] = SYNC
    cross = is_head[dst]
    s_src = seg_of_row[src[cross]]
    s_dst = seg_of_row[dst[cross]]
    ndeps = np.bincount(s_dst, minlength=nseg).astype(np.int64)
    order = np.argsort(s_src, kind="stable")
    succ_idx = s_dst[order]
    succ_ptr = np.zeros(nseg + 1, dtype=np.int64)
    np.cumsum(np.bincount(s_src, minlength=nseg), out=succ_ptr[1:])
    return seg_of_row, acc, ready0[heads], gap[heads], length, ndeps, succ_ptr, succ_idx, heads
