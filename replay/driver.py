"""One replay, end to end, from a typed :class:`~skewlens.replay.config.ReplayConfig` (the CLI's library
call).

Load (validated) -> build the slowdown model -> simulate (and, for ``mode=real``, re-execute through
``skewlens.replay.real``) -> write ``timeline.parquet``, ``summary.parquet``, ``timeline.json``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.replay.config import ReplayConfig
from skewlens.replay.errors import ConfigError
from skewlens.replay.outputs import (
    SUMMARY_PARQUET,
    TIMELINE_JSON,
    TIMELINE_PARQUET,
    write_perfetto,
    write_summary,
    write_timeline,
)
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.slowdown import SlowdownModel
from skewlens.replay.summary import SummaryRecord, summarize


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOutcome:
    """What one replay produced."""

    out_dir: Path
    """Where the outputs were written."""
    run: RunTrace
    """The replayed (loaded) run."""
    sim: SimResult
    """The simulated replay."""
    summary: list[SummaryRecord]
    """Per (rank, step) summary of the simulated replay."""
    real: Any = None
    """``skewlens.replay.real`` result for ``mode=real`` (else None)."""


def load_trace(run_dir: str | Path, *, progress: bool = False, console: Console | None = None) -> RunTrace:
    """Load a run with the store's validation when available (``skewlens.profiler.store.validate``)."""
    try:
        validate = importlib.import_module("skewlens.profiler.store.validate")
    except ImportError:
        return load_run(run_dir)
    run: RunTrace = validate.load_validated(run_dir, progress=progress, console=console)
    return run


def build_effects(cfg: ReplayConfig) -> SlowdownModel:
    """The slowdown model of ``cfg`` (nodes for network slowdowns follow the topology's placement)."""
    topo = cfg.topology.to_topology()

    def node_of(rank: int) -> int:
        c = topo.coords(rank)
        return c[1] if len(c) > 1 else c[0]

    return SlowdownModel(cfg.slowdown.to_items(), node_of=node_of)


def replay_run(cfg: ReplayConfig, out_dir: Path, *, console: Console | None = None) -> ReplayOutcome:
    """Run the replay ``cfg`` describes and write its outputs into ``out_dir``."""
    err = console or Console(stderr=True)
    effects = build_effects(cfg)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not cfg.progress,
        transient=True,
    ) as bar:
        task = bar.add_task(f"loading {cfg.trace}", total=4)
        run = load_trace(cfg.trace)
        bar.update(task, advance=1, description="simulating")
        sim = simulate(
            run,
            topology=cfg.topology.to_topology(),
            effects=effects,
            comm_mode=cfg.comm_mode,
            algorithm=cfg.topology.algorithm,
            contention=cfg.topology.contention,
        )
        summary = summarize(run, sim)
        bar.update(task, advance=1, description="writing outputs")
        write_timeline(run, sim, out_dir / TIMELINE_PARQUET)
        write_summary(summary, out_dir / SUMMARY_PARQUET)
        if cfg.perfetto:
            write_perfetto(run, sim, out_dir / TIMELINE_JSON)
        bar.update(task, advance=1)
    real = None
    if cfg.mode == "real":
        try:
            api = importlib.import_module("skewlens.replay.real.api")
        except ImportError:
            raise ConfigError("mode=real: real replay is not available") from None
        real = api.real_replay(run_dir=Path(cfg.trace), out_dir=out_dir, effects=effects, cfg=cfg.real)
    return ReplayOutcome(out_dir=out_dir, run=run, sim=sim, summary=summary, real=real)
