"""Lower the execution model (``skewlens.replay.execution``) of a run to the core's
:class:`~skewlens.replay.core.Graph`, and lift results back.

What each node waits for (start, queue and wait edges, host gaps, nesting, sync groups and eager sends)
is the execution model's; see its module docstring. This module only turns it into segments and adds what
a what-if changes:

- ``start_i = max(replayed ends of i's start edges, t0) + gap_i + delay_i`` (``t0`` the run's first start;
  ``gap_i`` of a node without start edges counts from it: ``execution.replay_gaps``), ``delay_i`` from
  :meth:`Effects.delay_before_ns` (plus :meth:`Effects.stall_ns` on the first node of a step:
  ``execution.effect_delays``, which the real replay's plan reads too); an
  asynchronous op's delay holds the thread that issued it too (its first node from the op on);
- compute nodes last ``work (or dur_override) x Effects.compute_factor``; a wait node's work begins no
  earlier than the completions it waits for;
- communication nodes of a sync group are timed by a :class:`CommTiming` (an eager send keeps its recorded
  duration); unmatched ones replay like compute;
- nested nodes follow their enclosing node, their offsets into it and their durations scaled with its
  work (``execution.nested_times``); METADATA nodes keep their recorded times.

**Segments.** Chains of compute nodes with one dependency and one dependent each are collapsed into one
segment (their relative timing is fixed), which is what lets the core replay long compute chains quickly.
"""

from __future__ import annotations

import contextlib
import itertools
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from skewlens.profiler.store.issues import rank_ranges
from skewlens.profiler.store.model import (
    CollectiveInstance,
    P2PPair,
    RankTrace,
    RunTrace,
    group_members,
    group_rank_order,
)
from skewlens.profiler.vocab import CommType, collective_message_bytes
from skewlens.replay.core import SYNC, Flow, Graph
from skewlens.replay.effects import Effects, NoEffects
from skewlens.replay.errors import ConfigError
from skewlens.replay.execution import (
    ExecutionModel,
    RankModel,
    SyncGroup,
    awaited_arrivals,
    effect_delays,
    execution_model,
    host_idle_scaled,
    issue_anchors,
    issuer_delays,
    launch_offsets,
    nested_times,
    replay_gaps,
    scaled_work,
)
from skewlens.replay.network.algorithms import even_split_bytes

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
#: Row or segment numbers: 4 bytes where the run's rows fit (``_rows``), else 8.
Rows = npt.NDArray[np.int32] | npt.NDArray[np.int64]

KIND_COMPUTE = 0
KIND_SYNC = 1
KIND_FIXED = 2  # METADATA / INVALID: recorded times, no dependencies
KIND_NESTED = 3  # inside another node on its timeline: follows it

_MIN = np.iinfo(np.int64).min


def collective_bytes(run: RunTrace, inst: CollectiveInstance) -> int:
    """The ``comm_bytes`` a collective's cost is computed from (before
    ``skewlens.replay.comm.message_bytes``): :func:`skewlens.profiler.vocab.collective_message_bytes` of its
    members' ``comm_size`` and, for an all_to_all, the uneven splits they recorded
    (``RankTrace.send_bytes`` / ``recv_bytes``): the largest ``comm_size``, ``p`` pieces for a scatter whose
    members each recorded theirs, and the size whose ``(p − 1)/p`` is the busiest port's bytes for an uneven
    all_to_all. The ASTRA-sim export writes the same size (``skewlens.replay.export_astra``)."""
    p = len(group_members(run, inst))
    a2a = inst.comm_type == CommType.ALL_TO_ALL
    members: list[tuple[int, int, int]] = []
    for r, row, b in zip(inst.ranks, inst.rows, inst.comm_bytes, strict=True):
        rt = run.ranks.get(r) if a2a else None  # only an all_to_all's splits count
        sent = got = -1
        if rt is not None and rt.send_bytes is not None and rt.recv_bytes is not None:
            sent, got = int(rt.send_bytes[row]), int(rt.recv_bytes[row])
        members.append((int(b), sent, got))
    return collective_message_bytes(inst.comm_type, p, members)


def collective_pairs(run: RunTrace, inst: CollectiveInstance) -> tuple[tuple[int, int, int], ...] | None:
    """An uneven all_to_all's traffic per pair, ``(sender, receiver, bytes)`` in global ranks (own chunks
    and empty pairs left out), from the members' recorded splits (``RankTrace.split_send_bytes``): what
    lets a network model see which pairs cross which links. A member that recorded none sent an equal
    ``1/p`` of its ``comm_size`` to each. None where no member recorded splits, or the lists do not name
    the group's members (another group order than the store knows)."""
    if inst.comm_type != CommType.ALL_TO_ALL:
        return None
    members = group_rank_order(run, inst)
    p = len(members)
    sent: dict[int, list[int]] = {}
    for r, row in zip(inst.ranks, inst.rows, strict=True):
        rt = run.ranks.get(r)
        if rt is None or rt.split_ptr is None or rt.split_send_bytes is None:
            continue
        a, b = int(rt.split_ptr[row]), int(rt.split_ptr[row + 1])
        if b > a:
            if b - a != p:
                return None
            sent[r] = rt.split_send_bytes[a:b].tolist()
    if not sent:
        return None
    for r, b in zip(inst.ranks, inst.comm_bytes, strict=True):
        sent.setdefault(r, [even_split_bytes(b, p)] * p)
    return tuple(
        (src, dst, n)
        for src, row in sorted(sent.items())
        for dst, n in zip(members, row, strict=True)
        if dst != src and n > 0
    )


class CommTiming(Protocol):
    """Transfer times of sync groups (ns after the last member's arrival, per member)."""

    def collective(
        self,
        comm_type: CommType,
        nbytes: int,
        ranks: Sequence[int],
        step: int,
        recorded: list[int],
        *,
        pairs: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[int]:
        """Per-member transfer of a collective; ``recorded`` is the as-recorded transfer per member;
        ``pairs``: an uneven all_to_all's traffic per pair where known (:func:`collective_pairs`)."""
        ...

    def p2p(self, src: int, dst: int, nbytes: int, step: int, recorded: list[int]) -> list[int]:
        """Transfer of a send/recv pair for ``[sender, receiver]``."""
        ...

    def flow(self, ranks: Sequence[int], alone_ns: int) -> Flow | None:
        """Contention-mode flow of a group over ``ranks`` (None: no contention modelling)."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Lowered:
    """The core graph plus what is needed to map segment times back to trace rows."""

    graph: Graph
    """The core's input."""
    ranks: tuple[int, ...]
    """Global ranks, in the order their rows are concatenated."""
    row_offset: I64
    """First global row of each rank in ``ranks`` (length ``len(ranks) + 1``)."""
    seg_of_row: Rows
    """Segment of each global row."""
    off_start: I64
    """Start of each row relative to its segment head's start."""
    dur: I64
    """Replayed duration of each compute / fixed row (0 for sync rows)."""
    kind: npt.NDArray[np.int8]
    """KIND_* of each row."""
    syncs: tuple[SyncGroup, ...]
    """The execution model's sync groups, aligned with ``graph.groups``."""
    sync_rows: tuple[Sequence[int], ...]
    """Global rows of each sync group's members, aligned with ``syncs`` (8-byte integer arrays, as the
    graph's ``groups`` and ``transfer``: a list of int objects is 40 bytes a member, 7 MiB each on the 32-rank
    GPU run's 194,560 members)."""
    nested: I64
    """Global rows that run inside an enclosing row (ascending): they start a set time after it starts."""
    nested_parent: I64
    """The enclosing (outermost) row of each of ``nested``."""
    nested_off_ns: I64
    """Start of each of ``nested`` after its enclosing row's start: its recorded offset scaled with the
    enclosing row's work (``execution.nested_times``)."""
    waits: npt.NDArray[np.bool_]
    """Rows that wait for a completion (wait nodes): their replayed start is their arrival."""
    start_ns: int
    """The replay's start: the run's first recorded start (``ExecutionModel.start_ns``), from which each
    rank's nodes without start edges are replayed (a rank that began later holds that as their gap)."""
    steps_start_ns: int | None
    """The recorded start of the first step's earliest timed row (not ``KIND_FIXED``) over ranks, the start
    the replay's step spans give that step unmodified (:attr:`SimResult.steps_start_ns`); None without
    step marks. Of the run and :attr:`kind`, which a what-if's retiming leaves as they are: found once."""

    def anchor_segments(self, rows: I64) -> Rows:
        """The segment whose times decide each row's: its enclosing row's segment for a nested row, else
        its own."""
        anchor = np.array(rows, dtype=np.int64)
        k, inside = sorted_lookup(self.nested, anchor)
        anchor[inside] = self.nested_parent[k[inside]]
        return self.seg_of_row[anchor]


def recorded_gaps(run: RunTrace) -> dict[int, I64]:
    """Per rank, the recorded host gap before each row as the simulator replays it
    (:func:`~skewlens.replay.execution.replay_gaps`: the execution model's, where a node without start
    edges counts from the run's first start).

    Use these (scaled, replaced) as ``gap_override`` values.
    """
    em = execution_model(run)
    return {r: replay_gaps(em, r) for r in em.ranks}


def lower(
    run: RunTrace,
    *,
    effects: Effects,
    timing: CommTiming,
    dur_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    gap_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    model: ExecutionModel | None = None,
) -> Lowered:
    """Build the core graph of ``run`` from its execution model (see the module docstring)."""
    return prepare(
        run, effects=effects, timing=timing, dur_override=dur_override, gap_override=gap_override, model=model
    ).lowered


@dataclass(frozen=True, kw_only=True, slots=True)
class Lowering:
    """A run lowered once, for what-ifs that change only some ranks' durations and host gaps.

    The segments, edges, sync groups and their transfers do not depend on durations or gaps (a chain of
    compute nodes is one segment whatever its nodes last; transfers are timed from recorded times), and
    no segment spans two ranks. So :meth:`retimed` re-runs only the rules of :func:`lower` that depend on
    durations and gaps (:func:`_rank_times`, :func:`_chain_offsets`, :func:`_segment_times`), and only on
    the ranks given new overrides; every other part of :attr:`lowered` is shared, not copied.
    """

    lowered: Lowered
    """The lowering with the overrides it was prepared with."""
    run: RunTrace
    model: ExecutionModel
    effects: Effects
    pred: npt.NDArray[np.int32]
    """Per global row: the row it is chained behind, as a row of its own rank (itself for heads)."""
    is_head: B
    """Per global row: whether it begins a segment."""
    launch_rows: Rows
    """Global row of the launching node of each launch edge, in ``graph.lsucc_idx`` order."""
    launch_k: Rows
    """Per launch edge (same order): its index among its rank's edges as :func:`_rank_launch_offsets` gives
    their offsets (launch edges, then those met after an earlier wait, then issue edges), whose offsets
    follow their row's work: re-read for the replayed work by :meth:`rank_retimed`."""
    launch_at_end: B
    """Per launch edge (same order): met ``launch_off_ns`` after its launching row *ends*: a row the host
    row that made the call had waited for before it (``RankModel.part_wait_src``)."""
    seg_offset: I64
    """First segment of each rank in ``lowered.ranks`` (length ``len(ranks) + 1``): a rank's segments
    follow the earlier ranks'."""

    @contextlib.contextmanager
    def retimed(
        self,
        *,
        dur_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
        gap_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    ) -> Iterator[Lowered]:
        """:func:`lower` of the run with these ranks' overrides instead of those it was prepared with
        (ranks not named keep theirs), for the ``with`` block: the same values, without lowering the other
        ranks again. The named ranks' values are written over :attr:`lowered`'s own columns and the
        earlier ones written back when the block ends, however it ends (copies of the whole-run columns
        would take 66 MiB more on the 32-rank GPU run): one what-if at a time."""
        check_override_ranks(self.run, dur_override, gap_override)
        low = self.lowered
        changed = [
            i for i, r in enumerate(low.ranks) if r in (dur_override or {}) or r in (gap_override or {})
        ]
        saved: list[tuple[int, int, RankRetimed]] = []  # the values written over, to write back
        try:
            for i in changed:
                rr = self.rank_retimed(i, dur_override=dur_override, gap_override=gap_override)
                if rr is None:
                    continue
                lo, hi = int(low.row_offset[i]), int(low.row_offset[i + 1])
                saved.append((lo, hi, self._write(lo, hi, rr)))
            yield low
        finally:
            for lo, hi, rr in reversed(saved):
                self._write(lo, hi, rr)

    def _write(self, lo: int, hi: int, rr: RankRetimed) -> RankRetimed:
        """Write ``rr``'s values over the rows ``[lo, hi)`` of one rank and its segments and launch edges in
        :attr:`lowered`; returns the values they had."""
        low, g = self.lowered, self.lowered.graph
        # (prepare() made these arrays; the graph is frozen, its columns are not)
        seg_gap, seg_len = cast("array[int]", g.gap), cast("array[int]", g.length)
        launch = cast("array[int] | None", g.lsucc_off)
        s_lo, s_hi = rr.seg_lo, rr.seg_lo + rr.gap.size
        a, b = rr.launch_lo, rr.launch_lo + (rr.launch_off.size if rr.launch_off is not None else 0)
        n_lo, n_hi = np.searchsorted(low.nested, [lo, hi]).tolist()
        had = RankRetimed(
            dur=low.dur[lo:hi].copy(),
            off_start=low.off_start[lo:hi].copy(),
            seg_lo=s_lo,
            gap=np.asarray(seg_gap[s_lo:s_hi], dtype=np.int64),
            length=np.asarray(seg_len[s_lo:s_hi], dtype=np.int64),
            launch_lo=a,
            launch_off=np.asarray(launch[a:b], dtype=np.int64) if launch is not None else None,
            nested_off=low.nested_off_ns[n_lo:n_hi].copy(),
        )
        low.dur[lo:hi] = rr.dur
        low.nested_off_ns[n_lo:n_hi] = rr.nested_off
        low.off_start[lo:hi] = rr.off_start
        seg_gap[s_lo:s_hi] = _ints(rr.gap)
        seg_len[s_lo:s_hi] = _ints(rr.length)
        if launch is not None and rr.launch_off is not None:
            launch[a:b] = _ints(rr.launch_off)
        return had

    def rank_retimed(
        self,
        i: int,
        *,
        dur_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
        gap_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    ) -> RankRetimed | None:
        """What :meth:`retimed` gives the ``i``-th rank of ``lowered.ranks`` (None: it has no rows)."""
        low = self.lowered
        r = low.ranks[i]
        lo, hi = int(low.row_offset[i]), int(low.row_offset[i + 1])
        if hi == lo:
            return None
        rk = low.kind[lo:hi]
        d, g, nested_off = _rank_times(
            self.run.ranks[r],
            self.model.ranks[r],
            r,
            rk,
            gap=replay_gaps(self.model, r),
            effects=self.effects,
            dur_override=dur_override.get(r) if dur_override is not None else None,
            gap_override=gap_override.get(r) if gap_override is not None else None,
        )
        is_head = self.is_head[lo:hi]
        # (where prepare() found a cycle of chain rows the core deadlocks whatever the offsets)
        _ptr, acc, _done = _chain_offsets(self.pred[lo:hi].astype(np.int64), is_head, d, g)
        heads = np.flatnonzero(is_head)
        s_lo = int(self.seg_offset[i])  # the rank's segments follow the earlier ranks'
        length, head_gap = _segment_times(low.seg_of_row[lo:hi] - s_lo, heads, kind=rk, acc=acc, dur=d, gap=g)
        l_ptr = low.graph.lsucc_ptr
        launch_off: I64 | None = None
        a = 0
        if (
            l_ptr is not None and low.graph.lsucc_off is not None
        ):  # the launch edges out of the rank's segments
            a, b = l_ptr[s_lo], l_ptr[s_lo + heads.size]
            # their offsets follow their row's replayed work
            off_ns = _rank_launch_offsets(self.run.ranks[r], self.model.ranks[r], d)[self.launch_k[a:b]]
            launch_off = _launch_offsets(acc, self.launch_rows[a:b] - lo, off_ns, self.launch_at_end[a:b], d)
        return RankRetimed(
            dur=d,
            off_start=acc,
            seg_lo=s_lo,
            gap=head_gap,
            length=length,
            launch_lo=a,
            launch_off=launch_off,
            nested_off=nested_off,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRetimed:
    """One rank's values of a :meth:`Lowering.retimed` lowering."""

    dur: I64
    """Per row of the rank: replayed duration."""
    off_start: I64
    """Per row of the rank: start relative to its segment head's start."""
    seg_lo: int
    """The rank's first segment."""
    gap: I64
    """Per segment of the rank: the head's gap."""
    length: I64
    """Per segment of the rank: head start to tail end (``SYNC`` for sync segments)."""
    launch_lo: int
    """The first launch edge out of the rank's segments."""
    launch_off: I64 | None
    """Per launch edge out of the rank's segments: its offset (None: the run has no launch edges)."""
    nested_off: I64
    """Per nested row of the rank (``Lowered.nested``): its offset into its enclosing row."""


def prepare(
    run: RunTrace,
    *,
    effects: Effects,
    timing: CommTiming,
    dur_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    gap_override: Mapping[int, npt.NDArray[np.int64]] | None = None,
    model: ExecutionModel | None = None,
) -> Lowering:
    """:func:`lower`, keeping what :meth:`Lowering.retimed` needs to re-time some ranks."""
    check_override_ranks(run, dur_override, gap_override)
    em = model if model is not None else execution_model(run)
    ranks = tuple(sorted(run.ranks))
    sizes = [len(run.ranks[r]) for r in ranks]
    row_offset = np.zeros(len(ranks) + 1, dtype=np.int64)
    np.cumsum(sizes, out=row_offset[1:])
    pos = {r: i for i, r in enumerate(ranks)}
    total = int(row_offset[-1])
    kind = np.zeros(total, dtype=np.int8)
    sync_rows: list[tuple[int, ...]] = []
    for sg in em.syncs:
        members = tuple(int(row_offset[pos[r]]) + row for r, row in zip(sg.ranks, sg.rows, strict=True))
        sync_rows.append(members)
        kind[list(members)] = KIND_SYNC

    dur = np.zeros(total, dtype=np.int64)
    gap = np.zeros(total, dtype=np.int64)
    t0_rank = np.zeros(len(ranks), dtype=np.int64)  # the ready0 of each rank's heads: the run's start
    run_t0 = em.start_ns
    # start edges go straight into whole-run arrays (no per-rank copies to concatenate)
    n_start = sum(em.ranks[r].start_src.size for r in ranks)
    src_all = np.empty(n_start, dtype=np.int64)
    dst_all = np.empty(n_start, dtype=np.int64)
    e_lo = 0
    x_src: list[I64] = []
    x_dst: list[I64] = []
    w_src: list[I64] = []
    w_dst: list[I64] = []
    l_src: list[I64] = []
    l_dst: list[I64] = []
    l_off: list[I64] = []
    l_early: list[npt.NDArray[np.bool_]] = []
    l_end: list[npt.NDArray[np.bool_]] = []
    l_k: list[I64] = []  # per launch edge: its index among its rank's (_rank_launch_offsets)
    nested_rows: list[I64] = []
    nested_parent: list[I64] = []
    nested_off: list[I64] = []
    for i, r in enumerate(ranks):
        rt = run.ranks[r]
        m = em.ranks[r]
        lo, hi = int(row_offset[i]), int(row_offset[i + 1])
        n = hi - lo
        if n == 0:
            continue
        valid = m.valid
        nested = m.parent >= 0
        rk = kind[lo:hi]
        rk[~valid] = KIND_FIXED
        rk[nested & (rk != KIND_SYNC)] = KIND_NESTED
        # (the model's rows are int32: global rows in 8 bytes)
        x_src.append(np.add(m.queue_src, lo, dtype=np.int64))
        x_dst.append(np.add(m.queue_dst, lo, dtype=np.int64))
        w_src.append(np.add(m.wait_src, lo, dtype=np.int64))
        w_dst.append(np.add(m.wait_dst, lo, dtype=np.int64))
        # a call after its row's wait: met after the wait (from the work's start); one after part of it: after
        # the row's arrival, and after each earlier wait's end (its row's launch edge, met after it ends:
        # RankModel.part_wait_src); issue edges (communication issued from inside a host row): after the start
        # of the row they are timed from (issue_anchors); each as long after as the model says for the
        # replayed work (_rank_launch_offsets)
        pw = m.part_wait_edge
        i_out = issue_anchors(rt, m, m.work_ns)[0]
        l_src.append(np.add(np.concatenate([m.launch_src, m.part_wait_src, i_out]), lo, dtype=np.int64))
        l_dst.append(
            np.add(np.concatenate([m.launch_dst, m.launch_dst[pw], m.issue_dst]), lo, dtype=np.int64)
        )
        l_early.append(np.concatenate([m.launch_at_arrival, np.zeros(pw.size + i_out.size, dtype=np.bool_)]))
        l_end.append(
            np.concatenate(
                [
                    np.zeros(m.launch_src.size, dtype=np.bool_),
                    np.ones(pw.size, dtype=np.bool_),
                    np.zeros(i_out.size, dtype=np.bool_),
                ]
            )
        )
        d, g, n_off = _rank_times(
            rt,
            m,
            r,
            rk,
            gap=replay_gaps(em, r),
            effects=effects,
            dur_override=dur_override.get(r) if dur_override is not None else None,
            gap_override=gap_override.get(r) if gap_override is not None else None,
        )
        dur[lo:hi] = d
        gap[lo:hi] = g
        l_off.append(_rank_launch_offsets(rt, m, d))
        l_k.append(np.arange(l_off[-1].size, dtype=np.int64))
        inner = np.flatnonzero(m.parent >= 0)
        nested_rows.append(inner + lo)
        nested_parent.append(np.add(m.parent[inner], lo, dtype=np.int64))
        nested_off.append(n_off)
        t0_rank[i] = run_t0  # a rank that began later holds that as the gap of its first nodes
        e_hi = e_lo + m.start_src.size
        np.add(m.start_src, lo, out=src_all[e_lo:e_hi], dtype=np.int64)
        np.add(m.start_dst, lo, out=dst_all[e_lo:e_hi], dtype=np.int64)
        e_lo = e_hi
    z = np.zeros(0, dtype=np.int64)
    xs_all = np.concatenate(x_src) if x_src else z
    xd_all = np.concatenate(x_dst) if x_dst else z
    ws_all = np.concatenate(w_src) if w_src else z
    wd_all = np.concatenate(w_dst) if w_dst else z
    ls_all = np.concatenate(l_src) if l_src else z
    ld_all = np.concatenate(l_dst) if l_dst else z
    lo_all = np.concatenate(l_off) if l_off else z
    early_all = np.concatenate(l_early) if l_early else z.astype(np.bool_)
    end_all = np.concatenate(l_end) if l_end else z.astype(np.bool_)
    k_all = np.concatenate(l_k) if l_k else z
    del x_src, x_dst, w_src, w_dst, l_src, l_dst, l_off, l_early, l_end, l_k  # the per-rank copies
    # rows with a queue-order, wait or launch successor end a segment; rows with a wait or launch
    # dependency begin one
    start_edges = [src_all, dst_all]
    del src_all, dst_all  # _segments takes them over, to free them before its peak
    graph_parts = _segments(
        kind=kind,
        dur=dur,
        gap=gap,
        start_edges=start_edges,
        extra_src=(xs_all, ws_all, ls_all),
        extra_dst=(wd_all, ld_all),
    )
    del gap  # a whole-run temporary: the segments hold what is needed of it
    seg_of_row, off_start, g_gap, g_len, ndeps, succ_ptr, succ_idx, head_rows, pred, is_head = graph_parts
    del graph_parts
    # the core's index columns are made compact as each is final (the numpy source freed then): held
    # together in 8 bytes they were the lowering's peak (on the 32-rank GPU run, 374 MiB traced)
    c_succ_ptr, c_succ_idx = _indices(succ_ptr), _indices(succ_idx)
    del succ_ptr, succ_idx
    # chain predecessors as rows of their rank (chains never leave a rank: start edges do not)
    for i in range(len(ranks)):  # in place, rank by rank: pred is this function's own
        pred[row_offset[i] : row_offset[i + 1]] -= row_offset[i]
    pred_local = pred.astype(np.int32)
    del pred
    # a head's earliest start: its recorded start where it keeps its recorded times, else its rank's start
    head_kind = kind[head_rows]
    g_ready0 = t0_rank[rank_index(row_offset, head_rows)]
    keeps = np.flatnonzero((head_kind == KIND_FIXED) | (head_kind == KIND_NESTED))
    g_ready0[keeps] = _recorded(run, em, ranks, row_offset, head_rows[keeps])[0]
    nseg = len(head_rows)
    del head_kind, keeps, head_rows
    c_xsucc_ptr, c_xsucc_idx = (_indices(c) for c in csr(seg_of_row[xs_all], seg_of_row[xd_all], nseg))
    ws_seg, wd_seg = seg_of_row[ws_all], seg_of_row[wd_all]
    c_wsucc_ptr, c_wsucc_idx = (
        (_indices(c) for c in csr(ws_seg, wd_seg, nseg)) if ws_all.size else (None, None)
    )
    ndeps += np.bincount(wd_seg, minlength=nseg)  # (in place: ndeps is _segments' own)
    # a launch met at its row's arrival (RankModel.launch_at_arrival): that row is a segment of its own (a
    # wait dependency begins one, a launch successor ends one), so at the segment's arrival
    # launch edges: met at the launching segment's start plus the launch call's place inside it
    ls_seg, ld_seg = seg_of_row[ls_all], seg_of_row[ld_all]
    lorder = np.argsort(ls_seg, kind="stable")
    lsucc_ptr = np.zeros(nseg + 1, dtype=np.int64)
    np.cumsum(np.bincount(ls_seg, minlength=nseg), out=lsucc_ptr[1:])
    has_launches = bool(ls_all.size)
    c_lsucc_ptr = _indices(lsucc_ptr) if has_launches else None
    del lsucc_ptr
    c_lsucc_idx = _indices(ld_seg[lorder]) if has_launches else None
    launch_rows, launch_off, at_end = ls_all[lorder], lo_all[lorder], end_all[lorder]
    launch_k = k_all[lorder]
    lsucc_off = _launch_offsets(off_start, launch_rows, launch_off, at_end, dur)
    lsucc_at_arrival = bytes(early_all[lorder].astype(np.uint8)) if early_all.any() else None
    ndeps += np.bincount(ld_seg, minlength=nseg)
    del (
        ls_all,
        ld_all,
        lo_all,
        early_all,
        end_all,
        k_all,
        ls_seg,
        ld_seg,
        lorder,
    )  # the launch edges: in the columns above now
    c_ndeps = _indices(ndeps)
    del ndeps
    # per sync row (all groups' members, one after the other): its recorded start and end, and the latest
    # recorded end and the number of its queue-order dependencies
    flat = np.fromiter(itertools.chain.from_iterable(sync_rows), dtype=np.int64)
    first = np.cumsum([0, *(len(m) for m in sync_rows)]).tolist()
    s_start, s_end = _recorded(run, em, ranks, row_offset, flat)
    x_rows, x_of = np.unique(xd_all, return_inverse=True)
    x_end = np.full(x_rows.size, _MIN, dtype=np.int64)
    np.maximum.at(x_end, x_of, _recorded(run, em, ranks, row_offset, xs_all)[1])
    x_count = np.bincount(x_of, minlength=x_rows.size)
    k, has_x = sorted_lookup(x_rows, flat)
    s_xend = np.full(flat.size, _MIN, dtype=np.int64)
    s_xend[has_x] = x_end[k[has_x]]
    s_xcount = np.zeros(flat.size, dtype=np.int64)
    s_xcount[has_x] = x_count[k[has_x]]
    s_start_l, s_end_l = s_start.tolist(), s_end.tolist()
    s_xend_l, s_xcount_l = s_xend.tolist(), s_xcount.tolist()
    del flat, s_start, s_end, s_xend, s_xcount, x_rows, x_of, x_end, x_count, k, has_x
    sync_of = np.full(nseg, -1, dtype=np.int64)
    groups: list[array[int]] = []
    transfer: list[array[int]] = []
    flows: list[Flow] = []
    group_xdeps: list[int] = []
    use_flows = True
    for gi, info in enumerate(em.syncs):
        a, b = first[gi], first[gi + 1]
        segs = seg_of_row[np.asarray(sync_rows[gi], dtype=np.int64)]
        sync_of[segs] = gi
        groups.append(_ints(segs))
        ends = s_end_l[a:b]
        if any(w >= 0 for w in info.waits_for):  # a rooted collective: from the arrival each waits for
            began = [
                max(t, x)
                for t, x in zip(awaited_arrivals(info.waits_for, s_start_l[a:b]), s_xend_l[a:b], strict=True)
            ]
            recorded = [max(e - t, 0) for e, t in zip(ends, began, strict=True)]
        else:
            launch = max(*s_start_l[a:b], *s_xend_l[a:b])
            recorded = [max(e - launch, 0) for e in ends]
        group_xdeps.append(sum(s_xcount_l[a:b]))
        step = int(run.ranks[info.ranks[0]].step[info.rows[0]])
        if info.is_p2p:
            pair: P2PPair = run.p2p[info.index]
            tr = list(timing.p2p(pair.src_rank, pair.dst_rank, pair.comm_bytes, step, recorded))
            member_ranks: Sequence[int] = (pair.src_rank, pair.dst_rank)
        else:
            inst: CollectiveInstance = run.collectives[info.index]
            nbytes = collective_bytes(run, inst)
            member_ranks = group_members(run, inst)
            pairs = collective_pairs(run, inst)
            tr = list(timing.collective(inst.comm_type, nbytes, member_ranks, step, recorded, pairs=pairs))
        alone = max(tr, default=0)  # the transfer's time with no other flow on its links
        for j, det in enumerate(info.detached):
            if det:  # an eager send lasts what it lasted: it did not wait for the transfer
                tr[j] = ends[j] - s_start_l[a + j]
        transfer.append(array("q", tr))
        if use_flows:
            fl = timing.flow(member_ranks, alone)
            if fl is None:
                use_flows = False
            else:
                flows.append(fl)
    waits_head = np.zeros(total, dtype=np.bool_)
    waits_head[wd_all] = True
    # the core's time columns, each numpy source freed as its compact copy is made
    c_sync_of = _indices(sync_of)
    ready0 = _shared_ints(g_ready0)
    del sync_of, g_ready0
    c_gap = _ints(g_gap)
    del g_gap
    c_len = _ints(g_len)
    del g_len
    c_lsucc_off = _ints(lsucc_off) if has_launches else None
    del lsucc_off
    del xs_all, xd_all, ws_all, wd_all, ws_seg, wd_seg
    graph = Graph(
        ready0=ready0,
        gap=c_gap,
        length=c_len,
        lsucc_off=c_lsucc_off,
        ndeps=c_ndeps,
        succ_ptr=c_succ_ptr,
        succ_idx=c_succ_idx,
        sync_of=c_sync_of,
        xsucc_ptr=c_xsucc_ptr,
        xsucc_idx=c_xsucc_idx,
        wsucc_ptr=c_wsucc_ptr,
        wsucc_idx=c_wsucc_idx,
        lsucc_ptr=c_lsucc_ptr,
        lsucc_idx=c_lsucc_idx,
        groups=groups,
        transfer=transfer,
        flows=flows if use_flows and em.syncs else None,
        group_xdeps=group_xdeps,
        detached=[list(g.detached) for g in em.syncs] if any(any(g.detached) for g in em.syncs) else None,
        waits_for=_member_rules(em),
        lsucc_at_arrival=lsucc_at_arrival,
    )
    lowered = Lowered(
        graph=graph,
        ranks=ranks,
        row_offset=row_offset,
        seg_of_row=_rows(seg_of_row),
        off_start=off_start,
        dur=dur,
        kind=kind,
        syncs=em.syncs,
        sync_rows=tuple(array("q", m) for m in sync_rows),
        nested=np.concatenate(nested_rows) if nested_rows else z,
        nested_parent=np.concatenate(nested_parent) if nested_parent else z,
        nested_off_ns=np.concatenate(nested_off) if nested_off else z,
        waits=waits_head,
        start_ns=run_t0,
        steps_start_ns=_steps_start(run, ranks, row_offset, kind),
    )
    return Lowering(
        lowered=lowered,
        run=run,
        model=em,
        effects=effects,
        pred=pred_local,
        is_head=is_head,
        launch_rows=_rows(launch_rows),
        launch_k=_rows(launch_k),
        launch_at_end=at_end,
        seg_offset=np.concatenate([[0], np.cumsum(is_head, dtype=np.int64)])[row_offset],
    )


def _steps_start(
    run: RunTrace, ranks: Sequence[int], row_offset: I64, kind: npt.NDArray[np.int8]
) -> int | None:
    """:attr:`Lowered.steps_start_ns` of the lowered ``ranks`` (rows from ``row_offset``) and ``kind``."""
    first: tuple[int, int] | None = None  # (step, start)
    for i, r in enumerate(ranks):
        rt = run.ranks[r]
        sel = (kind[int(row_offset[i]) : int(row_offset[i + 1])] != KIND_FIXED) & (rt.step >= 0)
        if not sel.any():
            continue
        k = int(rt.step[sel].min())
        a = int(rt.start_ns[sel & (rt.step == k)].min())
        first = (k, a) if first is None or (k, a) < first else first
    return None if first is None else first[1]


def _member_rules(em: ExecutionModel) -> list[list[int] | None] | None:
    """The core's ``waits_for``: each rooted collective's rule (the execution model's), None for the other
    groups; None where there is no such group."""
    rules = [list(g.waits_for) if any(w >= 0 for w in g.waits_for) else None for g in em.syncs]
    return rules if any(r is not None for r in rules) else None


def rank_index(row_offset: I64, rows: I64) -> I64:
    """Index into the lowered ranks of the rank each global row belongs to (``row_offset``: first row of
    each rank, then the total)."""
    return np.searchsorted(row_offset, rows, side="right") - 1


def sorted_lookup(keys: I64, query: I64) -> tuple[I64, B]:
    """For each of ``query``: its position in the ascending unique ``keys`` (any valid position where it is
    absent) and whether it is there."""
    if keys.size == 0:
        return np.zeros(query.shape, dtype=np.int64), np.zeros(query.shape, dtype=np.bool_)
    k = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    return k, keys[k] == query


#: The core's columns that hold times (ns); the others hold counts, offsets and segment or group ids.
#: The array typecode of 4-byte signed integers (``i`` where C's int is 4 bytes, as on every platform
#: CPython supports; else ``l``).
_INT32 = next(c for c in "il" if array(c).itemsize == 4)
_INT32_MIN, _INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def _ints(a: npt.ArrayLike) -> array[int]:
    """A per-segment column of times for the core: a compact int64 sequence (8 bytes an item, where a list
    holds a pointer and an int object of 32 bytes for each)."""
    return _compact("q", np.ascontiguousarray(a, dtype=np.int64))


def _rows(a: I64) -> Rows:
    """Row or segment numbers in 4 bytes where the run's rows fit (they do below 2**31 rows), as the
    execution model's and the core's are: half the memory of the whole-run columns the lowering keeps."""
    return a.astype(np.int32) if a.size == 0 or int(a.max()) <= _INT32_MAX else a


def _shared_ints(a: I64) -> list[int]:
    """``ready0`` for the core: a list in which each run of equal times is one int object (a rank's heads
    mostly share its start), so that the core's copy of it holds a pointer a segment, not an int object
    of 32 bytes more (on the 32-rank GPU run's 2 M segments: 64 runs, 33 distinct times)."""
    if not a.size:
        return []
    first = np.flatnonzero(np.diff(a)) + 1
    lengths = np.diff(first, prepend=0, append=a.size)
    one: dict[int, int] = {}  # one object per distinct time, however many runs it has (the run's start)
    values = [one.setdefault(v, v) for v in a[np.r_[0, first]].tolist()]
    return list(itertools.chain.from_iterable(map(itertools.repeat, values, lengths.tolist())))


def _compact(typecode: str, v: npt.NDArray[np.integer]) -> array[int]:
    """``v`` (contiguous, of ``typecode``'s width) as an array, copied once (no ``bytes`` in between)."""
    out = array(typecode)
    out.frombytes(memoryview(v.data).cast("B"))
    return out


def _indices(a: npt.ArrayLike) -> array[int]:
    """A column of counts, offsets or ids for the core: 4 bytes an item where every value fits (a run of
    fewer than 2**31 segments and edges), else as :func:`_ints`. On the 32-rank GPU run's 2 M segments all
    the core's columns together take 116 MiB instead of 177 (tracemalloc), and the core reads either width
    as fast (``docs/benchmarks.md``, stop 29)."""
    v = np.ascontiguousarray(a, dtype=np.int64)
    if v.size and (int(v.max()) > _INT32_MAX or int(v.min()) < _INT32_MIN):
        return _compact("q", v)
    return _compact(_INT32, v.astype(np.int32))


def _recorded(
    run: RunTrace, em: ExecutionModel, ranks: Sequence[int], row_offset: I64, rows: I64
) -> tuple[I64, I64]:
    """Recorded start and end of global ``rows`` (gathered rank by rank: no whole-run columns), the ends as
    the execution model takes them (a hidden wait's lagged completion at the wait's end:
    ``end_clamp_rows``)."""
    start = np.empty(rows.size, dtype=np.int64)
    end = np.empty(rows.size, dtype=np.int64)
    which = rank_index(row_offset, rows)
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(ranks) + 1))
    for i in np.flatnonzero(np.diff(bounds)).tolist():
        sel = order[bounds[i] : bounds[i + 1]]
        rt = run.ranks[ranks[i]]
        local = rows[sel] - row_offset[i]
        start[sel] = rt.start_ns[local]
        end[sel] = start[sel] + rt.dur_ns[local]
        m = em.ranks[ranks[i]]
        if m.end_clamp_rows.size:
            k, hit = sorted_lookup(m.end_clamp_rows, local)
            end[sel[hit]] = m.end_clamp_ns[k[hit]]
    return start, end


def _launch_offsets(off_start: I64, launch_rows: Rows, launch_off_ns: I64, at_end: B, dur: I64) -> I64:
    """Per launch edge: ns after its launching segment's start (the launch call's place inside it; for a
    call after its row's wait, after the work's start; ``Graph.lsucc_at_arrival``: after its arrival; where
    ``at_end``, after the launching row ends: an earlier wait of the row that made the call; an issue edge's
    place in the row it is timed from)."""
    return off_start[launch_rows] + launch_off_ns + np.where(at_end, dur[launch_rows], 0)


def _rank_launch_offsets(rt: RankTrace, m: RankModel, work: I64) -> I64:
    """Per launch edge the lowering makes of one rank, given its rows' replayed ``work``: how long after its
    launching row's start (its work's start, arrival or end: see :func:`_launch_offsets`) it is met, as the
    model says (``execution.launch_offsets``, ``issue_anchors``): its launch edges, then those met after an
    earlier wait of their row (``RankModel.part_wait_edge``), then its issue edges."""
    after = launch_offsets(m, work)
    return np.concatenate([after, after[m.part_wait_edge], issue_anchors(rt, m, work)[1]]).astype(np.int64)


def _rank_times(
    rt: RankTrace,
    m: RankModel,
    rank: int,
    rk: npt.NDArray[np.int8],
    *,
    gap: I64,
    effects: Effects,
    dur_override: npt.ArrayLike | None,
    gap_override: npt.ArrayLike | None,
) -> tuple[I64, I64, I64]:
    """Replayed duration and host gap of each row of ``rank`` (``rk``: the rows' KIND_*), and each nested
    row's offset into its enclosing row: the execution model's work and ``gap``
    (:func:`~skewlens.replay.execution.replay_gaps`), overridden where the override is >= 0, then the
    effects' factors (of untraced host time too: ``host_idle_scaled``) and delays; a nested row's offset
    and duration as its enclosing row's work scales them (``execution.nested_times``)."""
    n = len(rt)
    g = gap
    if gap_override is not None:
        ov = _checked_override(gap_override, n, rank, "gap_override")
        g = np.where(ov >= 0, ov, g)
    d = m.work_ns.copy()
    if dur_override is not None:
        ov = _checked_override(dur_override, n, rank, "dur_override")
        d = np.where(ov >= 0, ov, d)
    # the identity only: a subclass of NoEffects overriding a question (a stall) is asked, as the plan asks
    if type(effects) is not NoEffects:
        d = scaled_work(effects, rt, m, d)
        d, g = host_idle_scaled(effects, rt, m, d, g)
        delay = effect_delays(effects, rt, m)
        g = g + delay + issuer_delays(rt, m, delay)
    inner, nested_off, nested_dur = nested_times(rt, m, d)
    d[inner] = nested_dur  # (``d`` is this function's own)
    d[rk == KIND_SYNC] = 0
    if g is not gap:  # ``gap`` may be the execution model's own column (read-only): 0 on those rows already
        g[(rk == KIND_FIXED) | (rk == KIND_NESTED)] = 0
    return d, g, nested_off


def csr(s_src: I64, s_dst: I64, nseg: int) -> tuple[I64, I64]:
    """Edges ``s_src[k] -> s_dst[k]`` over ``nseg`` segments by source: offsets (``nseg + 1``) and the
    destinations, each source's in edge order."""
    order = np.argsort(s_src, kind="stable")
    ptr = np.zeros(nseg + 1, dtype=np.int64)
    np.cumsum(np.bincount(s_src, minlength=nseg), out=ptr[1:])
    return ptr, s_dst[order]


def check_override_ranks(
    run: RunTrace,
    dur_override: Mapping[int, npt.ArrayLike] | None,
    gap_override: Mapping[int, npt.ArrayLike] | None,
) -> None:
    """A :class:`ConfigError` naming ``dur_override`` / ``gap_override`` where one names a rank with no trace
    in ``run``: its values were never read, and the replay came back as if it had not been given."""
    for what, ov in (("dur_override", dur_override), ("gap_override", gap_override)):
        for r in ov or ():
            if r not in run.ranks:
                raise ConfigError(
                    f"{what}: rank {r!r} has no trace in the run (traced: {rank_ranges(sorted(run.ranks))})"
                )


def _checked_override(ov: npt.ArrayLike, n: int, rank: int, what: str) -> I64:
    a = np.asarray(ov, dtype=np.int64)
    if a.shape != (n,):
        raise ConfigError(f"{what}[{rank}]: expected {n} values (one per node of rank {rank}), got {a.shape}")
    return a


def _segments(
    *,
    kind: npt.NDArray[np.int8],
    dur: I64,
    gap: I64,
    start_edges: list[I64],
    extra_src: Sequence[I64],
    extra_dst: Sequence[I64],
) -> tuple[I64, I64, I64, I64, I64, I64, I64, I64, I64, B]:
    """Collapse single-dependency compute chains into segments (pointer jumping, O(n log chain)).

    ``start_edges`` is ``[src, dst]``, taken over (emptied): the edges are freed once the edges between
    segments are picked out, before the chain offsets (the lowering's peak of memory). ``extra_src`` and
    ``extra_dst``: the rows of the other edges' ends (queue-order, wait and launch edges): a row with one
    of those ends a chain (as a source) or begins one (as a dependant).

    Which rows are chained (``pred``, ``is_head``) depends on the graph only; the offsets and lengths on
    ``dur`` and ``gap`` (:func:`_chain_offsets`, :func:`_segment_times`)."""
    src, dst = start_edges
    start_edges.clear()
    n = kind.shape[0]
    count = np.bincount(dst, minlength=n)
    for rows in extra_dst:
        np.add.at(count, rows, 1)
    single_dep = count == 1
    count = np.bincount(src, minlength=n)
    for rows in extra_src:
        np.add.at(count, rows, 1)
    single_succ = count == 1
    del count
    # a row with a single dependency, a start edge, is chained behind its source
    pred, has_pred = _single_preds(src, dst, single_dep)
    compute = kind == KIND_COMPUTE
    internal = compute & single_dep & has_pred
    internal &= compute[pred]
    internal &= single_succ[pred]
    del single_dep, single_succ, compute, has_pred  # whole-run temporaries: not held longer than needed
    # edges between segments: those into heads (a chain row's one edge is from its predecessor)
    cross = ~internal[dst]
    c_src, c_dst = src[cross], dst[cross]
    del src, dst, cross
    for _attempt in range(2):
        is_head = ~internal
        ptr, acc, done = _chain_offsets(pred, is_head, dur, gap)
        if done:
            break
        # a dependency cycle among chain rows: make them heads so the core reports the deadlock; the edge
        # into each new head (from its predecessor) is now between segments
        internal &= is_head[ptr]
        new_heads = np.flatnonzero(~internal & ~is_head)
        c_src, c_dst = np.concatenate([c_src, pred[new_heads]]), np.concatenate([c_dst, new_heads])
    heads = np.flatnonzero(is_head)
    seg_index = np.full(n, -1, dtype=np.int64)
    seg_index[heads] = np.arange(heads.size, dtype=np.int64)
    # each row's segment, written over its head row (take reads each index before writing it; "raise"
    # would buffer a copy, and the head rows are rows)
    seg_of_row = np.take(seg_index, ptr, out=ptr, mode="clip")
    del seg_index, ptr
    nseg = heads.size
    length, head_gap = _segment_times(seg_of_row, heads, kind=kind, acc=acc, dur=dur, gap=gap)
    s_src = seg_of_row[c_src]
    s_dst = seg_of_row[c_dst]
    ndeps = np.bincount(s_dst, minlength=nseg).astype(np.int64)
    order = np.argsort(s_src, kind="stable")
    succ_idx = s_dst[order]
    succ_ptr = np.zeros(nseg + 1, dtype=np.int64)
    np.cumsum(np.bincount(s_src, minlength=nseg), out=succ_ptr[1:])
    return seg_of_row, acc, head_gap, length, ndeps, succ_ptr, succ_idx, heads, pred, is_head


#: Edges per slice where a whole-run pass over the edges would otherwise copy them whole.
_CHUNK = 1 << 20


def _single_preds(src: I64, dst: I64, single_dep: B) -> tuple[I64, B]:
    """Per row, the source of its start edge where that is its single dependency (else the row itself), and
    whether it has one (a self-loop does not count)."""
    n = single_dep.shape[0]
    pred = np.arange(n, dtype=np.int64)
    has_pred = np.zeros(n, dtype=np.bool_)
    for a in range(0, dst.size, _CHUNK):  # in slices: the selected edges are not copied whole
        d, sr = dst[a : a + _CHUNK], src[a : a + _CHUNK]
        one = single_dep[d] & (sr != d)
        pred[d[one]] = sr[one]
        has_pred[d[one]] = True
    return pred, has_pred


def _chain_offsets(pred: I64, is_head: B, dur: I64, gap: I64) -> tuple[I64, I64, bool]:
    """Head row of each row's chain and the row's start after the head's start; False where the pointer
    jumping did not reach a head from every row (a cycle)."""
    n = pred.shape[0]
    acc = dur[pred]  # (in place from here: a GPU run has about as many rows as segments, 8 bytes a row each)
    acc += gap
    acc[is_head] = 0
    ptr = np.arange(n, dtype=np.int64)
    # runs of chain rows that follow their predecessor row by row (the common case) are summed with
    # one cumsum: each such row points straight at the row before its run
    contiguous = ~is_head
    if n:
        contiguous[0] = False
        contiguous[1:] &= pred[1:] == ptr[:-1]
    others = ~is_head & ~contiguous  # the other chain rows: they point at their predecessor
    if contiguous.any():
        ptr[contiguous] = 0  # ptr becomes each row's anchor: the row before its run, else itself
        np.maximum.accumulate(ptr, out=ptr)
        csum = np.where(contiguous, acc, 0)
        np.cumsum(csum, out=csum)
        # acc = csum - csum[anchor] on contiguous rows (0 on heads), written over acc: no third array
        keep = np.flatnonzero(others)
        kept = acc[keep]
        np.take(csum, ptr, out=acc, mode="clip")  # (anchors are rows; "raise" would buffer a copy)
        np.subtract(csum, acc, out=acc)
        del csum
        acc[keep] = kept
        del keep, kept
    np.copyto(ptr, pred, where=others)
    del others, contiguous
    for _ in range(n.bit_length() + 1):
        if is_head[ptr].all():
            return ptr, acc, True
        acc += acc[ptr]
        ptr = ptr[ptr]
    return ptr, acc, False


def _segment_times(
    seg_of_row: Rows, heads: I64, *, kind: npt.NDArray[np.int8], acc: I64, dur: I64, gap: I64
) -> tuple[I64, I64]:
    """Length and head gap of each segment (segments numbered from 0 in ``seg_of_row``)."""
    length = np.zeros(heads.size, dtype=np.int64)
    np.maximum.at(length, seg_of_row, acc + dur)
    length[kind[heads] == KIND_SYNC] = SYNC
    return length, gap[heads]
