"""What a real replay returns: the captured replay run and per-rank step times (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from skewlens.profiler.store.model import RankTrace
from skewlens.profiler.vocab import NodeType


@dataclass(frozen=True, kw_only=True, slots=True)
class RankStepTimes:
    """One rank's step times, original and replayed, for the steps both have."""

    rank: int
    """Global rank."""
    steps: tuple[int, ...]
    """Step indices of the original (-1 when it has no step marks: the whole trace is one step)."""
    original_ns: tuple[int, ...]
    """Measured step time of the original run per step: step mark to step mark, as the simulated replay's
    summary measures it (without step marks, or where the record's nodes are not the original's row for
    row: last end minus first start of the step's nodes), ns."""
    replay_ns: tuple[int, ...]
    """The same, measured in the real replay, ns."""

    @property
    def original_mean_ns(self) -> int:
        """Mean original step time, ns."""
        return round(sum(self.original_ns) / len(self.original_ns)) if self.original_ns else 0

    @property
    def replay_mean_ns(self) -> int:
        """Mean real-replay step time, ns."""
        return round(sum(self.replay_ns) / len(self.replay_ns)) if self.replay_ns else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RealReplayResult:
    """Outcome of :func:`skewlens.replay.real.api.real_replay`."""

    run_dir: Path
    """The replay, captured as a run directory (``OUT_DIR/run``)."""
    out_dir: Path
    """The output directory (plan, worker logs and results under ``real/``)."""
    backend: str
    """Backend the replay ran on (``gloo`` or ``nccl``)."""
    ranks: tuple[RankStepTimes, ...]
    """Per-rank step times, by rank."""

    def original_step_ns(self) -> dict[int, int]:
        """Rank -> mean measured step time of the original run, ns."""
        return {r.rank: r.original_mean_ns for r in self.ranks}

    def replay_step_ns(self) -> dict[int, int]:
        """Rank -> mean step time measured in the real replay, ns."""
        return {r.rank: r.replay_mean_ns for r in self.ranks}


def step_spans(rt: RankTrace) -> dict[int, tuple[int, int]]:
    """Step -> (first start, last end) over a rank's nodes (metadata nodes excluded), ns."""
    keep = rt.node_type != int(NodeType.METADATA)
    steps = rt.step[keep]
    starts = rt.start_ns[keep]
    ends = rt.end_ns[keep]
    out: dict[int, tuple[int, int]] = {}
    for s in np.unique(steps).tolist():
        m = steps == s
        out[int(s)] = (int(starts[m].min()), int(ends[m].max()))
    if len(out) > 1:
        out.pop(-1, None)  # nodes outside any step (set-up, tail) are not a step
    return out


def rank_step_times(
    rank: int, original: dict[int, tuple[int, int]], replayed: dict[int, tuple[int, int]]
) -> RankStepTimes:
    """Pair the original and replayed steps in order (a profiler capture of the replay counts from 0)."""
    pairs = list(zip(sorted(original), sorted(replayed), strict=False))
    return RankStepTimes(
        rank=rank,
        steps=tuple(o for o, _r in pairs),
        original_ns=tuple(original[o][1] - original[o][0] for o, _r in pairs),
        replay_ns=tuple(replayed[r][1] - replayed[r][0] for _o, r in pairs),
    )
