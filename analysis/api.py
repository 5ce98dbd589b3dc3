"""The analysis entry points: :func:`analyze_run` (pure, store in, result out) and :func:`write_tables`.

``analyze_run`` derives the shared per-rank index once, then runs the analyses: collective skew
(``skewlens.analysis.skew``), step breakdown (``skewlens.analysis.breakdown``), GPU idle time
(``skewlens.analysis.gpu_idle``) and GPU kernels by time (``skewlens.analysis.gpu_kernels``) on GPU runs,
critical path (``skewlens.analysis.critical_path``) and what-if
blame (``skewlens.analysis.blame``, which asks the simulator). Rendering lives in
``skewlens.analysis.render``, ``skewlens.analysis.plots`` and ``skewlens.analysis.perfetto``; the CLI in
``skewlens.cli.analyze``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from skewlens.analysis.blame import BlameResult, SimulateFn, analyze_blame
from skewlens.analysis.breakdown import analyze_breakdown
from skewlens.analysis.critical_path import analyze_critical_path
from skewlens.analysis.errors import AnalysisError
from skewlens.analysis.gpu_idle import analyze_gpu_idle
from skewlens.analysis.gpu_kernels import analyze_gpu_kernels
from skewlens.analysis.index import RunIndex, build_index
from skewlens.analysis.records import (
    BlameRecord,
    BlameStepRecord,
    CollectiveSkewRecord,
    CriticalPathRecord,
    GpuIdleRecord,
    GpuKernelRecord,
    HostBlameRecord,
    StepBreakdownRecord,
)
from skewlens.analysis.skew import SkewResult, analyze_skew
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.issues import ranks_label, replay_command, run_notes, untimed_ranks
from skewlens.profiler.store.model import RunTrace, not_a_run
from skewlens.profiler.store.schema import (
    files_markdown,
    provenance_metadata,
    table_from_columns,
    table_from_records,
    with_metadata,
    write_table,
)
from skewlens.profiler.threads import default_workers, ordered_map, release_free_memory
from skewlens.progress import NO_PROGRESS, Progress, given
from skewlens.replay.execution import clock_note

#: Output file names inside OUT_DIR.
SKEW_FILE = "collective_skew.parquet"
BREAKDOWN_FILE = "step_breakdown.parquet"
CRITICAL_PATH_FILE = "critical_path.parquet"
BLAME_FILE = "blame.parquet"
BLAME_STEPS_FILE = "blame_steps.parquet"
BLAME_HOSTS_FILE = "blame_hosts.parquet"
GPU_IDLE_FILE = "gpu_idle.parquet"
GPU_KERNELS_FILE = "gpu_kernels.parquet"
#: Each output file's record dataclass (its columns), in the order docs/parquet.md lists them.
RECORD_OF: dict[str, type] = {
    SKEW_FILE: CollectiveSkewRecord,
    BREAKDOWN_FILE: StepBreakdownRecord,
    GPU_IDLE_FILE: GpuIdleRecord,
    GPU_KERNELS_FILE: GpuKernelRecord,
    CRITICAL_PATH_FILE: CriticalPathRecord,
    BLAME_FILE: BlameRecord,
    BLAME_STEPS_FILE: BlameStepRecord,
    BLAME_HOSTS_FILE: HostBlameRecord,
}


@dataclass(eq=False, kw_only=True, slots=True)
class AnalysisResult:
    """Everything the analyses found about one run."""

    index: RunIndex
    """The run and its derived per-rank arrays."""
    skew: SkewResult
    """Per collective instance / p2p pair: arrivals, waits, late and blamed rank, cause."""
    breakdown: list[StepBreakdownRecord]
    """Per rank and step: compute, exposed wait / transfer, overlapped communication, idle."""
    gpu_idle: list[GpuIdleRecord]
    """Per rank, step and GPU stream: its idle time and what it waited for (empty on a CPU run)."""
    gpu_kernels: list[GpuKernelRecord]
    """Per rank and GPU op name: how many ran and their summed time (empty on a CPU run)."""
    critical_path: list[CriticalPathRecord]
    """Per step: the nodes of the critical path, last node first."""
    blame: BlameResult | None
    """What-if straggler costs (None when blame was not asked for)."""

    @property
    def run(self) -> RunTrace:
        return self.index.run

    @property
    def notes(self) -> list[str]:
        """What a report on the run says besides its tables (:func:`run_notes`), and where the ranks' clocks
        contradict the traces (:func:`clock_note`)."""
        clocks = clock_note(self.run)
        return [*run_notes(self.run), *([clocks] if clocks else [])]

    @property
    def stragglers(self) -> list[BlameRecord]:
        """Blame records, largest straggler cost first, of equal costs the most wait caused first (empty
        without blame): a list of the caller's own, a copy of the blame's (sorting it reorders neither the
        result nor the blame table written from it)."""
        return list(self.blame.records) if self.blame is not None else []

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
    progress: Progress | None = NO_PROGRESS,
) -> AnalysisResult:
    """Run every analysis on ``run``. ``max_simulations``: at most this many what-if simulations for the
    blame (None: no limit; ``skewlens analyze`` gives 16). ``progress`` is told of each analysis and what-if
    simulation.

    Raises :class:`AnalysisError` on a run with a trace that records no start time (Chakra's generator and
    ``text2chakra`` write none): its times are the loader's layout, so there is nothing to measure, and
    beside ranks that record theirs (a run whose ranks came from two tools) they were set against those as
    if measured."""
    progress = given(progress)
    if (problem := not_a_run(run)) is not None:
        raise AnalysisError(f"analyze_run: {problem}")
    # -1 was taken as 0 (every cost 0, silently); "3" (a widget's value) was a TypeError from a comparison
    if max_simulations is not None and (
        isinstance(max_simulations, bool)
        or not isinstance(max_simulations, numbers.Integral)
        or max_simulations < 0
    ):
        raise AnalysisError(f"max_simulations: expected >= 0 (None: no limit), got {max_simulations!r}")
    if untimed := untimed_ranks(run):
        timed = sorted(set(run.ranks) - set(untimed))
        unlike = f", unlike {ranks_label(timed)}" if timed else ""
        verb = "records" if len(untimed) == 1 else "record"
        raise AnalysisError(
            f"{run.run_dir}: {ranks_label(untimed)} {verb} no start time on any node (Chakra's "
            f"start_time_micros, skewlens' skl_start_ns){unlike}: an untimed trace has no skew, waits or "
            "step times to analyse; replay it with modelled communication instead: "
            f"{replay_command(run.run_dir, 'comm_mode=model')}"
        )
    with progress.task("analyses: index", 5) as advance:
        ix = build_index(run)
        advance(description="analyses: skew")
        skew = analyze_skew(ix)
        advance(description="analyses: breakdown")
        breakdown = analyze_breakdown(ix)
        advance(description="analyses: GPU idle")
        gpu_idle = analyze_gpu_idle(ix)
        gpu_kernels = analyze_gpu_kernels(ix)
        advance(description="analyses: critical path")
        critical_path = analyze_critical_path(ix)
        advance()
    blamed = None
    if blame:
        blamed = analyze_blame(
            ix, skew, simulate_fn=simulate_fn, max_simulations=max_simulations, progress=progress
        )
        # the simulator's lowering is freed by now: hand its memory back, or the outputs (Arrow's own
        # allocator, Python's small objects) grow the process past it (the 32-rank GPU run's outputs
        # peaked at 1,008-1,022 MiB with it kept, above the blame's 1,001-1,008; 799-818 MiB with it
        # handed back)
        release_free_memory()
    return AnalysisResult(
        index=ix,
        skew=skew,
        breakdown=breakdown,
        gpu_idle=gpu_idle,
        gpu_kernels=gpu_kernels,
        critical_path=critical_path,
        blame=blamed,
    )


def skew_table(skew: SkewResult) -> pa.Table:
    """``collective_skew`` as a table, column by column from the events' arrays (one row per member, as
    :meth:`SkewResult.records` gives them, without a record object per row)."""
    ev = skew.events
    members = np.fromiter((len(e.ranks) for e in ev), dtype=np.int64, count=len(ev))
    owner = np.repeat(np.arange(len(ev)), members)

    def per_event(values: list[Any]) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)[owner] if ev else np.zeros(0, dtype=np.int64)

    def per_event_str(values: list[str | None]) -> pa.Array:
        return pa.array(values, type=pa.string()).dictionary_encode().take(pa.array(owner))

    def per_member(attr: str) -> np.ndarray:
        parts = [np.asarray(getattr(e, attr), dtype=np.int64) for e in ev]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    cols: dict[str, Any] = {
        "kind": per_event_str([e.kind for e in ev]),
        "pg_name": per_event_str([e.pg_name for e in ev]),
        "seq": per_event([e.seq for e in ev]),
        "comm_type": per_event_str([e.comm_type for e in ev]),
        "comm_bytes": per_member("comm_bytes"),
        "step": per_event([e.step for e in ev]),
        "rank": per_member("ranks"),
        "node_id": per_member("node_ids"),
        "arrival_ns": per_member("arrival_ns"),
        "end_ns": per_member("end_ns"),
        "wait_ns": per_member("wait_ns"),
        "exposed_wait_ns": per_member("exposed_wait_ns"),
        "transfer_ns": per_member("transfer_ns"),
        "skew_ns": per_event([e.skew_ns for e in ev]),
        "late_rank": per_event([e.late_rank for e in ev]),
        "blamed_rank": per_event([e.blamed_rank for e in ev]),
        "late_by_ns": per_event([e.late_by_ns for e in ev]),
        "cause_kind": per_event_str([str(e.cause.kind) for e in ev]),
        "cause_op": per_event_str([e.cause.op for e in ev]),
        "cause_delta_ns": per_event([e.cause.delta_ns for e in ev]),
        "cause": per_event_str([e.cause.text for e in ev]),
        "clock_contradicted": np.asarray([e.clock_contradicted for e in ev], dtype=np.bool_)[owner]
        if ev
        else np.zeros(0, dtype=np.bool_),
    }
    return table_from_columns(CollectiveSkewRecord, cols, "collective_skew")


def schema_markdown() -> str:
    """The column tables of the analyses' files in docs/parquet.md, from their record dataclasses."""
    return files_markdown(RECORD_OF, "skewlens analyze")


def _table_builders(result: AnalysisResult, caller: str) -> dict[str, Callable[[], pa.Table]]:
    """File name -> what builds its table (``gpu_idle`` and ``gpu_kernels`` for a run with GPU ops, the
    blame's where it was asked for), in the order the files are written; each table's metadata names the
    run (:func:`provenance_metadata`). Anything but an :class:`AnalysisResult` is an :class:`AnalysisError`
    naming ``caller`` (``tables(run)`` was ``AttributeError: 'RunTrace' object has no attribute 'run'``)."""
    if not isinstance(result, AnalysisResult):
        what = "a path" if isinstance(result, str | Path) else type(result).__name__
        raise AnalysisError(f"{caller}: expected an AnalysisResult (from analyze_run(run)), got {what}")
    meta = provenance_metadata(result.run.run_dir, result.run.manifest)
    return {name: _named(build, meta) for name, build in _record_builders(result).items()}


def _named(build: Callable[[], pa.Table], meta: dict[bytes, bytes]) -> Callable[[], pa.Table]:
    return lambda: with_metadata(build(), meta)


def _record_builders(result: AnalysisResult) -> dict[str, Callable[[], pa.Table]]:
    builders: dict[str, Callable[[], pa.Table]] = {
        SKEW_FILE: lambda: skew_table(result.skew),
        BREAKDOWN_FILE: lambda: table_from_records(StepBreakdownRecord, result.breakdown, "step_breakdown"),
        CRITICAL_PATH_FILE: lambda: table_from_records(
            CriticalPathRecord, result.critical_path, "critical_path"
        ),
    }
    if result.gpu_idle:
        builders[GPU_IDLE_FILE] = lambda: table_from_records(GpuIdleRecord, result.gpu_idle, "gpu_idle")
    if result.gpu_kernels:
        builders[GPU_KERNELS_FILE] = lambda: table_from_records(
            GpuKernelRecord, result.gpu_kernels, "gpu_kernels"
        )
    blame = result.blame
    if blame is not None:
        builders[BLAME_FILE] = lambda: table_from_records(BlameRecord, blame.records, "blame")
        builders[BLAME_STEPS_FILE] = lambda: table_from_records(
            BlameStepRecord, blame.step_records, "blame_steps"
        )
        if blame.host_records:
            builders[BLAME_HOSTS_FILE] = lambda: table_from_records(
                HostBlameRecord, blame.host_records, "blame_hosts"
            )
    return builders


def tables(result: AnalysisResult) -> dict[str, pa.Table]:
    """The tables :func:`write_tables` writes, in memory (for ``.to_pandas()`` in a notebook), keyed by table
    name (``collective_skew``, ``step_breakdown``, ``critical_path``, ``gpu_idle``, ``gpu_kernels``,
    ``blame``, ``blame_steps``, ``blame_hosts``; the file is the name + ``.parquet``), with the files' schemas
    (docs/parquet.md)."""
    return {
        name.removesuffix(".parquet"): build() for name, build in _table_builders(result, "tables").items()
    }


def write_tables(result: AnalysisResult, out_dir: str | Path, *, workers: int | None = None) -> list[Path]:
    """Write the Parquet tables (atomically, one file per table; ``gpu_idle`` and ``gpu_kernels`` for a run
    with GPU ops, the blame's where it was asked for); returns their paths. An analysis table this result
    has none of (an earlier analysis' ``blame.parquet``, written with blame) is removed from ``out_dir``,
    so that its tables are all of one analysis. The tables are encoded on ``workers`` threads at once
    (default: the usable CPUs; Parquet encoding releases the GIL)."""
    d = Path(out_dir)
    builders = _table_builders(result, "write_tables")
    jobs = [(build, d / name) for name, build in builders.items()]

    def write(job: tuple[Callable[[], pa.Table], Path]) -> Path:
        build, path = job
        return write_table(build(), path)

    written = list(ordered_map(write, jobs, workers=default_workers() if workers is None else workers))
    for name in RECORD_OF.keys() - builders.keys():
        try:
            (d / name).unlink(missing_ok=True)
        except OSError as e:
            raise SkewlensError(
                f"cannot remove {d / name} (an earlier analysis' table): {e.strerror}"
            ) from None
    return written
