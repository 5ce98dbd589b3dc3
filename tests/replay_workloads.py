"""The synthetic run real replay is checked on (its tests and ``benchmarks/real_replay_fidelity.py``).

4 ranks, ``STEPS`` steps of about ``COMPUTE_NS`` each: compute, a world all_reduce, a pair all_gather,
more compute, a send/recv; and ``RankFactor``, the slowdown the slowdown config's ``compute`` item gives,
on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType

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
