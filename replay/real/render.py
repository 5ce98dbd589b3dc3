"""Rich rendering of a real replay's step times next to the simulated ones (render layer only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from skewlens.profiler.store.issues import path_word
from skewlens.replay.outputs import REAL_RUN_DIR, REAL_WORK_DIR
from skewlens.replay.real.result import RealReplayResult
from skewlens.replay.render import ms_or_dash


def _delta(ns: int | None, ref: int) -> str:
    if ns is None or ref <= 0:
        return "-"
    return f"{(ns - ref) / ref:+.1%}"


def render_comparison(result: RealReplayResult, simulated: Mapping[int, int]) -> Table:
    """One row per rank: recorded (the original run's), real-replay and simulated mean step time (ms), and
    deviations from the recorded one (the word the simulated replay's table uses too)."""
    table = Table(title=f"Step time per rank: recorded vs real replay ({result.backend}) vs simulated")
    table.add_column("rank", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("recorded ms", justify="right")
    table.add_column("real ms", justify="right")
    table.add_column("real Δ", justify="right")
    table.add_column("simulated ms", justify="right")
    table.add_column("sim Δ", justify="right")
    for r in result.ranks:
        orig = r.original_mean_ns
        sim = simulated.get(r.rank)
        table.add_row(
            str(r.rank),
            str(len(r.steps)),
            ms_or_dash(orig),
            ms_or_dash(r.replay_mean_ns),
            _delta(r.replay_mean_ns, orig),
            ms_or_dash(sim),
            _delta(sim, orig),
        )
    # the run's path is the outputs line's, printed whole on a line of its own: in the caption, wrapped to
    # the table's width (60 columns), a long one was broken over two lines in a CI log 160 wide
    table.caption = f"Δ: against the recorded step time; real replay captured in {REAL_RUN_DIR}/ (below)"
    return table


def outputs_line(result: RealReplayResult, simulated_files: Sequence[str]) -> str:
    """Which of a real replay's outputs are whose: ``OUT``'s own files (``simulated_files``) are the
    simulated replay's, ``OUT/run`` is the real replay's capture, ``OUT/real`` its working files."""
    files = ", ".join(simulated_files) or "no files"
    run = path_word(result.run_dir)
    return (
        f"outputs in {result.out_dir}: {files}: the simulated replay; {REAL_RUN_DIR}/: the real replay, "
        f"captured as a run (skewlens analyze {run}); {REAL_WORK_DIR}/: its plan, logs and each "
        "replayed node's own times"
    )
