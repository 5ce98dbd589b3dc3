"""The real-replay worker's op loop (in process, no process group): when each compute op ends."""

from __future__ import annotations

import time
from typing import Any, cast

from skewlens.replay.real.plan import KIND_COMPUTE, ReplayOp
from skewlens.replay.real.worker import Runner

MS = 1_000_000


class _Compute:
    """Records the deadlines the loop gives and returns at once (as if the work took no time)."""

    def __init__(self) -> None:
        self.deadlines: list[int] = []

    def run_until(self, deadline: int) -> None:
        self.deadlines.append(deadline)


def _compute(row: int, *, dur_ns: int, deps: tuple[int, ...] = (), gap_ns: int = 0, **kw: Any) -> ReplayOp:
    return ReplayOp(
        row=row, node_id=row + 1, name="compute", kind=KIND_COMPUTE, step=0, dur_ns=dur_ns, deps=deps,
        gap_ns=gap_ns, delay_ns=0, **kw,
    )  # fmt: skip


def _runner(ops: list[ReplayOp]) -> tuple[Runner, _Compute]:
    compute = _Compute()
    runner = Runner(rank=0, ops=ops, dog=cast(Any, None), issuer=cast(Any, None), compute=cast(Any, compute))
    return runner, compute


def test_compute_ends_its_duration_after_its_start_in_the_model_not_after_the_workers_own_time() -> None:
    ops = [_compute(0, dur_ns=1 * MS, gap_ns=MS // 10), _compute(1, dur_ns=2 * MS, deps=(0,), gap_ns=MS // 2)]
    runner, compute = _runner(ops)
    origin = time.perf_counter_ns()
    runner.run(origin)
    assert compute.deadlines == [origin + MS // 10 + 1 * MS, runner.end[0] + MS // 2 + 2 * MS]


def test_a_wait_nodes_work_starts_when_its_communication_completed_if_that_is_later() -> None:
    ops = [_compute(1, dur_ns=3 * MS, gap_ns=MS // 10, wait_deps=(0,))]
    runner, compute = _runner(ops)
    origin = time.perf_counter_ns()
    runner.end[0] = origin + 5 * MS  # the communication it waits for completed late
    runner.run(origin)
    assert compute.deadlines == [origin + 5 * MS + 3 * MS]
    runner, compute = _runner(ops)
    origin = time.perf_counter_ns()
    runner.end[0] = origin  # ... or before the node's own start
    runner.run(origin)
    assert compute.deadlines == [origin + MS // 10 + 3 * MS]
