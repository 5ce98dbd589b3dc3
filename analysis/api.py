"""The analysis entry points: :func:`analyze_run` (pure, store in, result out) and :func:`write_tables`.

``analyze_run`` derives the shared per-rank index once, then runs the four analyses: collective skew
(``skewlens.analysis.skew``), step breakdown (``skewlens.analysis.breakdown``), critical path
(``skewlens.analysis.critical_path``) and what-if blame (``skewlens.analysis.blame``, which asks the
simulator). Rendering lives in ``skewlens.analysis.render``, ``skewlens.analysis.plots`` and
``skewlens.analysis.perfetto``; the CLI in ``skewlens.cli.analyze``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skewlens.analysis.blame import BlameResult, SimulateFn, analyze_blame
from skewlens.analysis.breakdown import analyze_breakdown
from skewlens.analysis.critical_path import analyze_critical_path
from skewlens.analysis.index import RunIndex, build_index
from skewlens.analysis.records import (
    BlameRecord,
    BlameStepRecord,
    CollectiveSkewRecord,
    CriticalPathRecord,
    StepBreakdownRecord,
)
from skewlens.analysis.skew import SkewResult, analyze_skew
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.schema import write_records
from skewlens.progress import NO_PROGRESS, Progress

#: Output file names inside OUT_DIR.
SKEW_FILE = "collective_skew.parquet"
BREAKDOWN_FILE = "step_breakdown.parquet"
CRITICAL_PATH_FILE = "critical_path.parquet"
BLAME_FILE = "blame.parquet"
BLAME_STEPS_FILE = "blame_steps.parquet"


@dataclass(eq=False, kw_only=True, slots=True)
class AnalysisResult:
    """Everything the analyses found about one run."""

    index: RunIndex
    """The run and its derived per-rank arrays."""
    skew: SkewResult
    """Per collective instance / p2p pair: arrivals, waits, late and blamed rank, cause."""
    breakdown: list[StepBreakdownRecord]
    """Per rank and step: compute, exposed wait / transfer, overlapped communication, idle."""
    critical_path: list[CriticalPathRecord]
    """Per step: the nodes of the critical path, last node first."""
    blame: BlameResult | None
    """What-if straggler costs (None when blame was not asked for)."""

    @property
    def run(self) -> RunTrace:
        return self.index.run

    @property
    def stragglers(self) -> list[BlameRecord]:
        """Blame records, largest straggler cost first (empty without blame)."""
        return self.blame.records if self.blame is not None else []

    def top_straggler_by_step(self) -> dict[int, int]:
        """Step -> top straggler: the rank the most peer wait of that step is attributed to (skew
        analysis). ``blame.top_straggler_by_step()`` gives the simulator's per-step view instead."""
        return self.skew.top_straggler_by_step()


def analyze_run(
    run: RunTrace,
    *,
    blame: bool = True,
    max_simulations: int | None = None,
    simulate_fn: SimulateFn | None = None,
    progress: Progress = NO_PROGRESS,
) -> AnalysisResult:
    """Run every analysis on ``run``. ``progress`` is told of each what-if simulation."""
    ix = build_index(run)
    skew = analyze_skew(ix)
    return AnalysisResult(
        index=ix,
        skew=skew,
        breakdown=analyze_breakdown(ix),
        critical_path=analyze_critical_path(ix),
        blame=(
            analyze_blame(
                ix, skew, simulate_fn=simulate_fn, max_simulations=max_simulations, progress=progress
            )
            if blame
            else None
        ),
    )


def write_tables(result: AnalysisResult, out_dir: str | Path) -> list[Path]:
    """Write the Parquet tables (atomically, one file per table); returns their paths."""
    d = Path(out_dir)
    paths = [
        write_records(CollectiveSkewRecord, result.skew.records(), d / SKEW_FILE, "collective_skew"),
        write_records(StepBreakdownRecord, result.breakdown, d / BREAKDOWN_FILE, "step_breakdown"),
        write_records(CriticalPathRecord, result.critical_path, d / CRITICAL_PATH_FILE, "critical_path"),
    ]
    if result.blame is not None:
        paths.append(write_records(BlameRecord, result.blame.records, d / BLAME_FILE, "blame"))
        paths.append(
            write_records(BlameStepRecord, result.blame.step_records, d / BLAME_STEPS_FILE, "blame_steps")
        )
    return paths
