"""Per-rank, per-step summary of a simulated replay (pure: store + SimResult in, records out).

For rank ``r`` and step ``k`` (nodes with that step on that rank):

- ``step_time_ns``: replayed span of the rank's nodes of the step (last end − first start);
- ``compute_ns``: time covered by compute nodes (union of their intervals);
- ``comm_ns``: summed duration of its communication nodes (arrival to completion);
- ``wait_ns``: summed wait for peers: for every sync member, latest arrival of the group − own arrival;
- ``exposed_comm_ns``: transfer time (latest arrival to own completion) not hidden under compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.vocab import NodeType
from skewlens.replay.execution import union_intervals
from skewlens.replay.simulate import SimResult

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class SummaryRecord:
    """One row of ``summary.parquet``: one rank in one step of the replay."""

    rank: int
    """Global rank."""
    step: int
    """Training step."""
    step_time_ns: int
    """Replayed span of the rank's nodes of the step, ns."""
    compute_ns: int
    """Time covered by compute nodes, ns."""
    comm_ns: int
    """Summed duration of communication nodes (arrival to completion), ns."""
    wait_ns: int
    """Summed wait for late peers at sync points, ns."""
    exposed_comm_ns: int
    """Transfer time not overlapped by compute, ns."""


def _covered(a: I64, b: I64, t: I64) -> I64:
    """Length of the union ``[a_k, b_k)`` below each ``t``."""
    if a.size == 0:
        return np.zeros_like(t)
    lens = b - a
    prefix = np.concatenate(([0], np.cumsum(lens)))
    k = np.searchsorted(a, t, side="right") - 1
    kk = np.maximum(k, 0)
    part = np.clip(t - a[kk], 0, lens[kk])
    return np.where(k >= 0, prefix[kk] + part, 0)


def summarize(run: RunTrace, res: SimResult) -> list[SummaryRecord]:
    """Summary rows for every (rank, step) with nodes (see the module docstring)."""
    arrival: dict[int, dict[int, int]] = {r: {} for r in run.ranks}
    for ci, c in enumerate(run.collectives):
        t = int(res.coll_arrival_ns[ci])
        for r, row in zip(c.ranks, c.rows, strict=True):
            arrival[r][row] = t
    for pi, p in enumerate(run.p2p):
        t = int(res.p2p_arrival_ns[pi])
        arrival[p.src_rank][p.src_row] = t
        arrival[p.dst_rank][p.dst_row] = t
    out: list[SummaryRecord] = []
    spans = res.step_spans()
    for r in sorted(run.ranks):
        rt = run.ranks[r]
        st, en = res.start_ns[r], res.end_ns[r]
        sync_rows = np.fromiter(arrival[r].keys(), dtype=np.int64, count=len(arrival[r]))
        sync_arr = np.fromiter(arrival[r].values(), dtype=np.int64, count=len(arrival[r]))
        comm_mask = np.isin(rt.node_type, [NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV])
        comp_mask = rt.node_type == NodeType.COMP
        for k in sorted({s for (rr, s) in spans if rr == r}):
            in_step = rt.step == k
            ca, cb = union_intervals(st[comp_mask & in_step], en[comp_mask & in_step])
            comm = comm_mask & in_step
            srows = sync_rows[rt.step[sync_rows] == k] if sync_rows.size else sync_rows
            sarr = sync_arr[rt.step[sync_rows] == k] if sync_rows.size else sync_arr
            wait = np.maximum(sarr - st[srows], 0)
            t_lo = np.maximum(sarr, st[srows])
            t_hi = np.maximum(en[srows], t_lo)
            hidden = _covered(ca, cb, t_hi) - _covered(ca, cb, t_lo)
            exposed = (t_hi - t_lo) - hidden
            a, b = spans[(r, k)]
            out.append(
                SummaryRecord(
                    rank=r,
                    step=k,
                    step_time_ns=b - a,
                    compute_ns=int((cb - ca).sum()),
                    comm_ns=int((en[comm] - st[comm]).sum()),
                    wait_ns=int(wait.sum()),
                    exposed_comm_ns=int(exposed.sum()),
                )
            )
    return out
