"""Rich rendering of a real replay's step times next to the simulated ones (render layer only)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

from skewlens.replay.real.result import RealReplayResult


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def _delta(ns: int | None, ref: int) -> str:
    if ns is None or ref <= 0:
        return "-"
    return f"{(ns - ref) / ref:+.1%}"


def render_comparison(result: RealReplayResult, simulated: Mapping[int, int]) -> Table:
    """One row per rank: original measured, real-replay and simulated mean step time (ms), and deviations."""
    table = Table(title=f"Step time per rank: original vs real replay ({result.backend}) vs simulated")
    table.add_column("rank", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("original ms", justify="right")
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
            _ms(orig),
            _ms(r.replay_mean_ns),
            _delta(r.replay_mean_ns, orig),
            _ms(sim),
            _delta(sim, orig),
        )
    table.caption = f"Δ: against the original; replay captured in {result.run_dir}"
    return table
