"""Step breakdown: where each rank's time went in each step.

Per rank, the compute intervals of all streams/threads are merged into one union ``C`` (so nested host
ops and concurrent GPU streams are not double counted); likewise communication ``M`` and its
wait-for-peers part ``W`` (``[start, start + wait]`` of each communication node, ``W ⊆ M``). A wait node
(``wait_tensor``, ``Work.wait``: see ``skewlens.replay.execution``) counts as waiting until the
communication it blocked on completed (in ``M`` and ``W``), and as compute for its own work after. Within a
step ``[a, b)``::

    compute             = |C|
    overlapped comm     = |M ∩ C|       = |M| + |C| - |M ∪ C|
    exposed comm        = |M \\ C|       = |M ∪ C| - |C|
      of which waiting  = |W \\ C|       = |W ∪ C| - |C|
      of which transfer = exposed comm - waiting
    idle                = (b - a) - |M ∪ C|

so ``compute + exposed wait + exposed transfer + idle = step length``. Every measure is a difference
of "covered time up to t" of a merged union (:class:`~skewlens.analysis.index.Coverage`), vectorised over
steps.
"""

from __future__ import annotations

import numpy as np

from skewlens.analysis.index import RunIndex
from skewlens.analysis.records import StepBreakdownRecord


def analyze_breakdown(ix: RunIndex) -> list[StepBreakdownRecord]:
    """One record per (rank, step) with a recorded step span, ordered by rank then step."""
    out: list[StepBreakdownRecord] = []
    incomplete = set(ix.run.incomplete_steps)
    for r, ri in sorted(ix.ranks.items()):
        keys = sorted(s for (rk, s) in ix.step_spans if rk == r)
        if not keys:
            continue
        a = np.array([ix.step_spans[(r, s)][0] for s in keys], dtype=np.int64)
        b = np.array([ix.step_spans[(r, s)][1] for s in keys], dtype=np.int64)
        # C, M and M ∪ C are the index's cov_comp, cov_comm and cov_all; W ∪ C is its cov_wait_comp
        cov_m = ri.cov_comm
        comp = ri.cov_comp.between(a, b)
        union_mc = ri.cov_all.between(a, b)
        exposed = union_mc - comp
        wait = np.minimum(ri.cov_wait_comp.between(a, b) - comp, exposed)
        overlapped = cov_m.between(a, b) + comp - union_mc
        idle = (b - a) - union_mc
        for k, s in enumerate(keys):
            out.append(
                StepBreakdownRecord(
                    rank=r,
                    step=s,
                    start_ns=int(a[k]),
                    end_ns=int(b[k]),
                    step_ns=int(b[k] - a[k]),
                    compute_ns=int(comp[k]),
                    exposed_wait_ns=int(wait[k]),
                    exposed_transfer_ns=int(exposed[k] - wait[k]),
                    overlapped_comm_ns=int(overlapped[k]),
                    idle_ns=int(idle[k]),
                    complete=s not in incomplete,
                )
            )
    return out
