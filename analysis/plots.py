"""PNG pictures of an analysis (matplotlib, Agg backend, no display): wait heatmap, step breakdown bars."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from skewlens.analysis.api import AnalysisResult
from skewlens.profiler.atomic import atomic_file

WAIT_HEATMAP_FILE = "wait_heatmap.png"
BREAKDOWN_FILE = "step_breakdown.png"


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure


def _save(fig: Any, path: Path) -> Path:
    with atomic_file(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return path


def wait_heatmap(result: AnalysisResult, path: str | Path, *, max_columns: int = 400) -> Path:
    """Heatmap of each rank's wait (ms) at each collective instance, in order of last arrival."""
    events = [e for e in result.skew.events if e.kind == "collective"]
    if len(events) > max_columns:  # keep the worst ones, still in time order
        keep = set(np.argsort([-e.total_exposed_wait_ns for e in events])[:max_columns].tolist())
        events = [e for i, e in enumerate(events) if i in keep]
    ranks = sorted(result.run.ranks)
    row = {r: i for i, r in enumerate(ranks)}
    grid = np.full((len(ranks), max(len(events), 1)), np.nan)
    for j, e in enumerate(events):
        for r, w in zip(e.ranks, e.wait_ns.tolist(), strict=True):
            grid[row[r], j] = w / 1e6
    fig = _figure()(figsize=(min(4 + 0.12 * len(events), 18), 1.5 + 0.35 * len(ranks)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    ax.set_ylabel("rank")
    ax.set_xlabel("collective instance (by last arrival)")
    step = max(len(events) // 40, 1)
    ticks = list(range(0, len(events), step))
    labels = [f"{events[i].comm_type.lower()} {events[i].pg_name}#{events[i].seq}" for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_title("wait for peers (ms); blank: not a member")
    fig.colorbar(im, ax=ax, label="ms")
    return _save(fig, Path(path))


def breakdown_bars(result: AnalysisResult, path: str | Path) -> Path:
    """Stacked bars of each rank's mean step breakdown (ms per step)."""
    parts = ("compute", "exposed wait", "exposed transfer", "idle")
    acc: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(5))
    for b in result.breakdown:
        acc[b.rank] += (b.compute_ns, b.exposed_wait_ns, b.exposed_transfer_ns, b.idle_ns, 1)
    ranks = sorted(acc)
    vals = np.array([acc[r][:4] / max(acc[r][4], 1) / 1e6 for r in ranks]).reshape(len(ranks), 4)
    fig = _figure()(figsize=(max(4, 0.6 * len(ranks) + 3), 4))
    ax = fig.add_subplot()
    bottom = np.zeros(len(ranks))
    colors = ("#4c72b0", "#dd8452", "#c44e52", "#bbbbbb")
    for k, name in enumerate(parts):
        ax.bar([str(r) for r in ranks], vals[:, k], bottom=bottom, label=name, color=colors[k])
        bottom += vals[:, k]
    ax.set_xlabel("rank")
    ax.set_ylabel("ms per step (mean)")
    ax.set_title("step breakdown (communication hidden under compute not shown)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, Path(path))
