"""Per-rank, per-step summary of a simulated replay (pure: store + SimResult in, records out).

For rank ``r`` and step ``k`` (nodes with that step on that rank):

- ``step_time_ns``: the replayed step, measured as the recorded one is: from the rank's step mark before
  the step to the one after it (the optimizer step; see :func:`replayed_step_marks`); for a run without
  step marks, the span of the rank's nodes of the step (last end − first start);
- ``recorded_step_ns``: the same, recorded;
- ``compute_ns``: time of the replayed step (mark to mark) covered by compute nodes of any step (union of
  their intervals over all streams), other than wait nodes (``wait_tensor``, a host op blocked in a CUDA
  synchronise: the execution model's ``is_wait``), which count as waiting on communication (but a
  host-time node's work after the wait it hid, ``host_work``, is compute), and the
  capture's untraced host time (``UNTRACED_NAMES``), which is idle: as ``skewlens analyze``'s breakdown
  counts it, so an unmodified replay gives the breakdown's compute;
- ``comm_ns``: time covered by its communication nodes (arrival to completion; a union, as the other
  two: concurrent ones, DDP's buckets or a 1F1B batch, count once), and by NCCL kernels the importer kept
  as compute (``nccl_kernel_rows``: communication nothing matches), which ``compute_ns`` leaves out;
- ``wait_ns``: time covered by waits for peers: for every sync member, own arrival to the group's latest
  (a rooted collective's member: to the arrival the execution model's ``waits_for`` names), up to its own
  end, none for a send the model makes eager, as ``skewlens analyze`` counts them;
- every column of a step covers its window (mark to mark): a node of one step that runs into the next
  step's window counts there for the time it does (so ``exposed_wait_ns`` <= ``wait_ns`` in every row);
- ``exposed_wait_ns`` and ``exposed_transfer_ns``: the replayed step's (mark to mark) communication not
  under compute, waiting for peers and the rest, by the rule of ``skewlens analyze``'s breakdown
  (:func:`~skewlens.replay.execution.exposed_parts`, from the same compute, communication and busy
  intervals): an unmodified replay gives the breakdown's ``exposed_wait_ns`` and ``exposed_transfer_ns``.
  ``wait_ns`` counts waits under compute too (DDP's bucket all_reduces waiting during backward), so it can
  exceed ``exposed_wait_ns``;
- ``gpu_*`` (a rank with GPU streams): its compute stream (the most compute kernels' time over the replayed
  steps) in the replayed step, busy, idle and the idle by what the stream waited for, by the rule of
  ``skewlens analyze``'s GPU idle table (:func:`~skewlens.replay.execution.gpu_idle`, on the replayed
  times): an unmodified replay gives that table's figures for its steps.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from skewlens.profiler.store.model import RunTrace
from skewlens.replay.execution import (
    GPU_IDLE_PARTS,
    Coverage,
    StreamIdle,
    busy_intervals,
    comm_rows,
    compute_intervals,
    compute_stream,
    eager_send_rows,
    execution_model,
    exposed_parts,
    gpu_idle,
    model_ends,
)
from skewlens.replay.simulate import SimResult, check_replays, rooted_awaited

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class SummaryRecord:
    """One row of ``summary.parquet``: one rank in one step of the replay."""

    rank: int
    """Global rank."""
    source_rank: int
    """The captured rank whose trace this rank replays: the rank itself, but in an extrapolated run
    (``scale.dp``) the captured rank it is a copy of."""
    step: int
    """Training step."""
    step_time_ns: int
    """Replayed step time (step mark to step mark; without marks: span of the step's nodes), ns."""
    recorded_step_ns: int
    """Recorded step time, measured the same way, ns (under ``scale.dp``, that of the captured rank
    ``source_rank``, at the captured size)."""
    compute_ns: int
    """Time covered by compute nodes, ns."""
    comm_ns: int
    """Time covered by communication nodes in the replayed step (arrival to completion; concurrent ones
    count once), ns."""
    wait_ns: int
    """Time covered by waits for late peers at sync points in the replayed step (concurrent ones count
    once; under compute too, so never less than ``exposed_wait_ns``), ns."""
    exposed_wait_ns: int
    """Waiting for peers not under compute, in the replayed step, ns (the breakdown's rule)."""
    exposed_transfer_ns: int
    """Communication not under compute nor waiting for peers, in the replayed step, ns (the breakdown's
    rule)."""
    gpu_stream: int = -1
    """The rank's GPU compute stream (the most compute kernels' time over the replayed steps), -1 on a rank
    without GPU streams (the ``gpu_*`` columns are 0 there)."""
    gpu_busy_ns: int = 0
    """Time that stream ran ops in the replayed step, ns."""
    gpu_idle_ns: int = 0
    """The replayed step less ``gpu_busy_ns``: the four parts below."""
    gpu_launch_wait_ns: int = 0
    """Idle until the host launched its next op (``skewlens analyze``'s GPU idle rule), ns."""
    gpu_comm_wait_ns: int = 0
    """Idle until communication its next op waited for completed, ns."""
    gpu_stream_wait_ns: int = 0
    """Idle until work on another stream its next op waited for ended, ns."""
    gpu_other_ns: int = 0
    """The rest of its idle time (after what was waited for, nothing known, after its last op), ns."""


#: The :class:`SummaryRecord` fields of the idle parts, in ``GPU_IDLE_PARTS``' order.
GPU_PART_FIELDS = tuple(f"gpu_{p}_ns" for p in GPU_IDLE_PARTS)


def replayed_step_marks(run: RunTrace, res: SimResult) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """``(rank, step) -> (recorded start, recorded end, replayed start, replayed end)`` of each step mark
    pair of the manifest (the optimizer step to the next one), for a simulated replay: see
    :func:`moved_step_marks`."""
    return moved_step_marks(run, res.start_ns, res.end_ns, res.timed)


def moved_step_marks(
    run: RunTrace,
    start_ns: Mapping[int, I64],
    end_ns: Mapping[int, I64],
    timed: Mapping[int, npt.NDArray[np.bool_]],
) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """``(rank, step) -> (recorded start, recorded end, replayed start, replayed end)`` of each step mark
    pair of the manifest, given the replayed times of every row (simulated, or re-executed).

    A mark moves with the node it follows:

    - the end mark with the rank's latest-ending node that ended by it, and never before the replayed end
      of any GPU node of its step that ended by it (on a GPU trace the step ends with its last device node,
      and another stream's kernels may slide past the node that ended last as recorded), nor before the
      step's replayed start mark (which may move with the step before it past the node this mark follows);
      but a mark recorded after every node that ended by it, the last of them a GPU node, moves with the
      rank's latest host node that ended by it: the time after that kernel is the step annotation's own,
      on the host, which a kernel that runs late does not carry along (DLRM at 0.1 GB/s: its step read
      58.323 ms, 0.117 ms after its last kernel, the host's step long over; it ends with that kernel,
      58.206);
    - the start mark of a step that begins where the previous one ended (steps measured end to end, as on
      GPUs) with that end;
    - any other start mark with the rank's latest-ending node of an earlier step of the window (from the
      rank's first marked step on) that ended by it, and no later than the previous step's end mark moved,
      so that the time between two steps, which is in neither, never grows at a step's expense. Where no
      such node ended by it, the mark stays: nothing before it can delay it, and a stall of the step's first
      node is in the step (on a GPU trace the host runs ahead, and the step's own first host ops may end by
      its device-timed start mark: they do not move it).

    The window's first step therefore starts where it was recorded in every replay, as the replay itself
    does (:attr:`SimResult.origin_ns`): work before the window (kernels launched before the profiler
    started) is in no step, and a what-if that delays that work does not move the mark, so the delay counts
    in the first step where the step waits for it, never shortening it. So a slowdown never makes a rank's
    steps up to any step shorter, and an unmodified replay gives the recorded step times exactly.
    """
    out: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    marks: dict[int, list[tuple[int, int, int]]] = {}
    for sp in run.manifest.steps:
        if sp.rank in run.ranks and sp.rank in start_ns and sp.end_ns > sp.start_ns:
            marks.setdefault(sp.rank, []).append((sp.step, sp.start_ns, sp.end_ns))
    for r, spans in marks.items():
        rt = run.ranks[r]
        rows = np.flatnonzero(timed[r])
        if rows.size == 0:
            continue
        end_of = model_ends(run, r)
        rec_end = end_of[rows]
        by_end = rows[np.argsort(rec_end, kind="stable")]
        ends_sorted = end_of[by_end]
        shift_end = end_ns[r][by_end] - ends_sorted
        step_sorted = rt.step[by_end]
        first = int(rows[np.argmin(rt.start_ns[rows])])  # the rank's first node, for an end no node precedes
        first_shift = int(start_ns[r][first] - rt.start_ns[first])
        dev = rows[~rt.is_cpu[rows]]
        last_end = _latest_ends_by_step(rt.step[dev], rt.end_ns[dev], end_ns[r][dev], spans)
        host = by_end[rt.is_cpu[by_end]]  # by recorded end, as by_end
        host_ends, host_shift = end_of[host], end_ns[r][host] - end_of[host]
        prev: tuple[int, int] | None = None  # recorded and moved end of the previous step
        window = min(k for k, _a, _b in spans)  # the rank's first marked step: earlier rows are in none
        for step, a, b in sorted(spans, key=lambda x: x[1]):
            if prev is not None and prev[0] == a:
                moved_a = prev[1]  # a step that begins where the previous one ended still does
            else:  # with the rank's latest node of an earlier step that ended by it; none: it cannot move
                n = int(np.searchsorted(ends_sorted, a, side="right"))
                k = _last_before_step(step_sorted, n, step, window)
                moved_a = a + int(shift_end[k]) if k >= 0 else a
                if prev is not None:  # no further than the previous step's end: no time between them grows
                    moved_a = min(moved_a, a + prev[1] - prev[0])
            k = int(np.searchsorted(ends_sorted, b, side="right")) - 1
            moved_b = b + (int(shift_end[k]) if k >= 0 else first_shift)
            if k >= 0 and ends_sorted[k] < b and not rt.is_cpu[by_end[k]]:
                # the mark lies after every node (the step annotation's own end: host time), and the node
                # before it is a kernel: the tail is the host's, and moves with the host's latest node
                kh = int(np.searchsorted(host_ends, b, side="right")) - 1
                moved_b = b + int(host_shift[kh]) if kh >= 0 else moved_b
            if step in last_end:  # not before the step's last GPU row; a CPU step may end earlier
                moved_b = max(moved_b, last_end[step])
            moved_b = max(moved_b, moved_a)  # nor before it begins: the earlier step's work ran past it
            out[(r, step)] = (a, b, moved_a, moved_b)
            prev = (b, moved_b)
    return out


def _last_before_step(step_sorted: npt.NDArray[np.integer], n: int, step: int, window: int) -> int:
    """The last of the first ``n`` positions whose row is labelled with a step from ``window`` (the rank's
    first marked step) to before ``step`` (-1: none). Walks back in growing windows: the rows of the step
    that end before its start mark (the host running ahead of its GPU) are few next to the rank's."""
    w = 64
    while n > 0 and step > window:
        lo = max(0, n - w)
        part = step_sorted[lo:n]
        hit = np.flatnonzero((part < step) & (part >= window))
        if hit.size:
            return lo + int(hit[-1])
        n, w = lo, w * 4
    return -1


def _latest_ends_by_step(
    step: npt.NDArray[np.integer], rec_end: I64, end: I64, spans: list[tuple[int, int, int]]
) -> dict[int, int]:
    """Step -> the latest replayed ``end`` of the rows labelled with that step whose recorded end
    (``rec_end``) lies by its end mark (steps in ``spans`` only)."""
    if not spans:
        return {}
    keys = np.asarray(sorted(k for k, _a, _b in spans), dtype=np.int64)
    mark = {k: b for k, _a, b in spans}
    bounds = np.asarray([mark[k] for k in keys.tolist()], dtype=np.int64)
    st = step.astype(np.int64)
    k = np.minimum(np.searchsorted(keys, st), keys.size - 1)
    ok = (keys[k] == st) & (rec_end <= bounds[k])
    none = np.iinfo(np.int64).min
    best = np.full(keys.size, none, dtype=np.int64)
    np.maximum.at(best, k[ok], end[ok])
    return {int(key): int(v) for key, v in zip(keys.tolist(), best.tolist(), strict=True) if v > none}


def sync_arrivals(
    run: RunTrace, res: SimResult, *, caller: str = "sync_arrivals"
) -> dict[int, tuple[I64, I64]]:
    """Per rank of the run, its sync rows (collective members, sends, recvs) and the replayed arrival each
    waits for: its instance's or pair's latest (:attr:`SimResult.coll_arrival_ns`, ``p2p_arrival_ns``), a
    rooted collective's member the one the execution model's ``waits_for`` names
    (:meth:`SimResult.rooted_awaited_ns`), an eager send its own (it waits for no one:
    :func:`~skewlens.replay.execution.eager_send_rows`). The summary's ``wait_ns`` and the timeline's
    replayed waits both read it. ``res`` must replay ``run`` (:func:`check_replays`: checked here, its
    messages beginning with ``caller``)."""
    check_replays(run, res, caller=caller)
    coll = run.collectives
    counts = np.fromiter((len(c.ranks) for c in coll), dtype=np.int64, count=len(coll))
    ranks = [np.fromiter(itertools.chain.from_iterable(c.ranks for c in coll), dtype=np.int64)]
    rows = [np.fromiter(itertools.chain.from_iterable(c.rows for c in coll), dtype=np.int64)]
    arrival = [np.repeat(np.asarray(res.coll_arrival_ns, dtype=np.int64), counts)]
    p2p = run.p2p
    for rank_attr, row_attr in (("src_rank", "src_row"), ("dst_rank", "dst_row")):
        ranks.append(np.fromiter((getattr(p, rank_attr) for p in p2p), dtype=np.int64, count=len(p2p)))
        rows.append(np.fromiter((getattr(p, row_attr) for p in p2p), dtype=np.int64, count=len(p2p)))
        arrival.append(np.asarray(res.p2p_arrival_ns, dtype=np.int64)[: len(p2p)])
    rank_of, row_of, last = np.concatenate(ranks), np.concatenate(rows), np.concatenate(arrival)
    offset = np.concatenate(([0], np.cumsum(counts)))  # each collective's members in the columns above
    for ci, awaited in rooted_awaited(run, res).items():  # what the model's waits_for names instead
        last[offset[ci] : offset[ci + 1]] = awaited
    order = np.argsort(rank_of, kind="stable")
    bounds = np.searchsorted(rank_of[order], np.asarray(sorted(run.ranks), dtype=np.int64), side="left")
    eager = eager_send_rows(run)
    out: dict[int, tuple[I64, I64]] = {}
    for k, r in enumerate(sorted(run.ranks)):
        sel = order[bounds[k] : bounds[k + 1] if k + 1 < len(bounds) else order.size]
        rows_r, last_r = row_of[sel], last[sel]
        d = eager[r][rows_r]  # an eager send waits for no one: its own arrival
        out[r] = rows_r, np.where(d, res.start_ns[r][rows_r], last_r) if d.any() else last_r
    return out


def summarize(run: RunTrace, res: SimResult) -> list[SummaryRecord]:
    """Summary rows for every (rank, step) with nodes (see the module docstring); ``res`` must replay ``run``
    (:func:`check_replays`, which :func:`sync_arrivals` does first)."""
    arrival = sync_arrivals(run, res, caller="summarize")
    out: list[SummaryRecord] = []
    model = execution_model(run)
    spans = res.step_spans()
    marks = replayed_step_marks(run, res)
    steps_of: dict[int, list[int]] = defaultdict(list)
    for rank, step in sorted(spans):
        steps_of[rank].append(step)
    for r in sorted(run.ranks):
        rt = run.ranks[r]
        st, en = res.start_ns[r], res.end_ns[r]
        sync_rows, sync_arr = arrival[r]
        m = model.ranks[r]
        comm_mask = comm_rows(rt)  # as the breakdown's M
        comp = Coverage.of(*compute_intervals(rt, m, st, en))
        busy = Coverage.of(*busy_intervals(rt, m, st, en))
        # each member waits from its arrival until the arrival it waits for, no longer than it lasted (the
        # skew's clamp); an eager send has its own arrival there: it waits for no one
        w_start = st[sync_rows]
        w_end = np.minimum(np.maximum(sync_arr, w_start), en[sync_rows])
        wait_comp = Coverage.of(np.concatenate([comp.starts, w_start]), np.concatenate([comp.ends, w_end]))
        # time covered, not summed (a rank's concurrent waits or transfers, DDP's buckets or a 1F1B batch,
        # happen at once), inside each step's window as every other column: a wait of one step's node that
        # runs into the next step's window counts there, as its exposed part does
        waits = Coverage.of(w_start, w_end)
        comms = Coverage.of(st[comm_mask], en[comm_mask])
        rows: list[tuple[int, int, int]] = []  # step, replayed, recorded (ns)
        windows: list[tuple[int, int]] = []
        for k in steps_of[r]:
            in_step = rt.step == k
            a, b = spans[(r, k)]
            mark = marks.get((r, k))
            if mark is not None:
                rec_ns, rep_ns = mark[1] - mark[0], mark[3] - mark[2]
                a, b = mark[2], mark[3]
            else:
                in_rec = in_step & res.timed[r]
                rec_ns = int(rt.end_ns[in_rec].max() - rt.start_ns[in_rec].min()) if in_rec.any() else 0
                rep_ns = b - a
            windows.append((a, b))
            rows.append((k, rep_ns, rec_ns))
        if not windows:
            continue
        # the breakdown's parts of every step window at once
        a_, b_ = (np.asarray(x, dtype=np.int64) for x in zip(*windows, strict=True))
        comp_ns, _busy, wait_ns, transfer_ns = exposed_parts(comp, busy, wait_comp, a_, b_)
        parts = zip(
            comp_ns.tolist(),
            wait_ns.tolist(),
            transfer_ns.tolist(),
            waits.between(a_, b_).tolist(),
            comms.between(a_, b_).tolist(),
            strict=True,
        )
        streams = [] if rt.is_cpu.all() else gpu_idle(rt, m, start=st, end=en, a=a_, b=b_)
        pick = compute_stream([(g.stream, int(g.compute.sum()), int(g.busy.sum())) for g in streams])
        gpu = next((g for g in streams if g.stream == pick), None)
        for j, ((k, rep_ns, rec_ns), (c, w, t, wait_all, comm_ns)) in enumerate(
            zip(rows, parts, strict=True)
        ):
            out.append(
                SummaryRecord(
                    rank=r,
                    source_rank=run.source_rank(r),
                    step=k,
                    step_time_ns=rep_ns,
                    recorded_step_ns=rec_ns,
                    compute_ns=c,
                    comm_ns=comm_ns,
                    wait_ns=wait_all,
                    exposed_wait_ns=w,
                    exposed_transfer_ns=t,
                    **_gpu_columns(gpu, j, int(b_[j] - a_[j])),
                )
            )
    return out


def _gpu_columns(g: StreamIdle | None, j: int, window_ns: int) -> dict[str, int]:
    """The ``gpu_*`` fields of step ``j`` (of ``window_ns``) for compute stream ``g`` (None: no GPU)."""
    if g is None:
        return {}
    return {
        "gpu_stream": g.stream,
        "gpu_busy_ns": int(g.busy[j]),
        "gpu_idle_ns": window_ns - int(g.busy[j]),
        **{f: int(p[j]) for f, p in zip(GPU_PART_FIELDS, g.parts, strict=True)},
    }
