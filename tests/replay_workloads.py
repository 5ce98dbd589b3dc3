"""The synthetic run real replay is checked on (its tests and ``benchmarks/real_replay_fidelity.py``).

4 ranks, ``STEPS`` steps of about ``COMPUTE_NS`` each: compute, a world all_reduce, a pair all_gather,
more compute, a send/recv; and ``RankFactor``, the slowdown the slowdown config's ``compute`` item gives,
on one rank. :func:`worker_times` runs one CPU worker's plan on a virtual clock, in-process.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.real.ops import Completion
from skewlens.replay.real.plan import ReplayOp

MS = 1_000_000
# 8 steps of ~300 ms compute (a 50 % slower compute on rank 2 is ~150 ms a step)
STEPS = 8
COMPUTE_NS = 300 * MS
STEP_PERIOD_NS = COMPUTE_NS + 15 * MS  # recorded start-to-start (compute, communication and a host gap)


@dataclass(frozen=True)
class RankFactor:
    """Compute on one rank runs ``factor`` times slower (an ``Effects``, as the slowdown config gives)."""

    rank: int
    factor: float

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return self.factor if rank == self.rank else 1.0

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        return 0

    def stall_ns(self, rank: int, step: int) -> int:
        return 0


def four_rank_run(path: Path) -> Path:
    """4 ranks, STEPS steps of ~COMPUTE_NS: compute, world all_reduce, pair all_gather, compute, send/recv."""
    b = RunBuilder(4, groups={"0": (0, 1, 2, 3), "tp0": (0, 1), "tp1": (2, 3)})
    for r in range(4):
        rb = b.rank(r)
        for s in range(STEPS):
            rb.step(s)
            rb.compute(
                "aten::mm", COMPUTE_NS - 5 * MS, start_ns=1_000_000_000 + s * STEP_PERIOD_NS + r * 100_000
            )
            rb.collective(CommType.ALL_REDUCE, 16 << 10, 500_000)
            rb.collective(CommType.ALL_GATHER, 4 << 10, 300_000, pg="tp0" if r < 2 else "tp1")
            rb.compute("aten::add", 5 * MS)
            if r % 2 == 0:
                rb.send(r + 1, 4 << 10, 200_000)
            else:
                rb.recv(r - 1, 4 << 10, 200_000)
    return b.write(path)


class _VirtualClock:
    """A worker's clock (``time.perf_counter_ns``, ``wait_until``), host work (``Compute.run``) and
    communication (``CommIssuer.issue``: done as issued, its future calling back at once) that only move
    time on: a ``Runner`` run on it keeps its plan's times to the nanosecond, whatever the machine's load."""

    def __init__(self) -> None:
        self.now_ns = 0

    def perf_counter_ns(self) -> int:
        return self.now_ns

    def wait_until(self, t: int) -> None:
        self.now_ns = max(self.now_ns, t)

    def run(self, dur_ns: int) -> None:
        self.now_ns += max(0, dur_ns)

    def issue(self, op: ReplayOp, *, blocking: bool = False) -> _VirtualClock | None:
        return None if blocking else self

    def get_future(self) -> _VirtualClock:
        return self

    def add_done_callback(self, cb: Callable[[_VirtualClock], None]) -> None:
        cb(self)

    def value(self) -> None:
        return None


class _PeersClock(_VirtualClock):
    """A :class:`_VirtualClock` whose communication completes when the peers and the network let it:
    at ``ends[row]`` (the simulator's end of that op), or at its issue if that is later. A blocking call
    returns then; an asynchronous op's future calls back when the clock passes that time, and waiting for
    it moves the clock there."""

    def __init__(self, ends: dict[int, int]) -> None:
        super().__init__()
        self.ends = ends
        self.due: list[tuple[int, int, Callable[[_VirtualClock], None]]] = []
        self.issued = itertools.count()

    def _pass(self, t: int) -> None:
        """Move the clock to ``t``, calling back each completion due by then at its own time."""
        while self.due and self.due[0][0] <= t:
            at, _k, cb = heapq.heappop(self.due)
            self.now_ns = max(self.now_ns, at)
            cb(self)
        self.now_ns = max(self.now_ns, t)

    def wait_until(self, t: int) -> None:
        self._pass(t)

    def run(self, dur_ns: int) -> None:
        self._pass(self.now_ns + max(0, dur_ns))

    def issue(self, op: ReplayOp, *, blocking: bool = False) -> _VirtualClock | None:
        at = max(self.now_ns, self.ends[op.row])
        if blocking:
            self._pass(at)
            return None
        return _PeerWork(self, at)

    def wait_for(self, completion: Completion) -> None:
        """``Completion.wait`` on this clock: the clock moves on to the completion."""
        while not completion.event.is_set() and self.due:
            self._pass(self.due[0][0])


@dataclass
class _PeerWork:
    clock: _PeersClock
    at: int

    def get_future(self) -> _PeerWork:
        return self

    def add_done_callback(self, cb: Callable[[_PeerWork], None]) -> None:
        heapq.heappush(self.clock.due, (self.at, next(self.clock.issued), lambda _c: cb(self)))
        self.clock._pass(self.clock.now_ns)

    def value(self) -> None:
        return None


def worker_times(
    ops: list[ReplayOp],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    origin_ns: int = 0,
    comm_ends: dict[int, int] | None = None,
) -> tuple[dict[int, int], dict[int, int]]:
    """Each op's (start, end) by row when one CPU worker (``skewlens.replay.real.worker.Runner``) runs
    ``ops`` from ``origin_ns`` on a virtual clock: the plan's timing rules as the worker applies them, no
    process. Communication completes at its issue, or, with ``comm_ends`` (by row: the simulator's ends, the
    peers' and network's part), then."""
    from skewlens.replay.real import ops as real_ops
    from skewlens.replay.real import worker

    clock = _VirtualClock() if comm_ends is None else _PeersClock(comm_ends)
    for module in (worker, real_ops):
        monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(worker, "wait_until", clock.wait_until)
    if isinstance(clock, _PeersClock):
        # (a function, not the bound method: bound to each Completion as its ``wait``)
        monkeypatch.setattr(real_ops.Completion, "wait", lambda c: clock.wait_for(c))  # noqa: PLW0108
    dog = worker.Watchdog(0, tmp_path, 10.0)
    runner = worker.Runner(rank=0, ops=ops, dog=dog, issuer=clock, compute=clock)  # type: ignore[arg-type]
    runner.run(origin_ns)
    return runner.start, runner.end
