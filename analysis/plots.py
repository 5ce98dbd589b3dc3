"""PNG pictures of an analysis (matplotlib, Agg backend, no display): wait heatmap, step breakdown bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.breakdown import MEAN_PARTS, rank_means
from skewlens.analysis.render import MAX_RANK_ROWS, ranks_left_out
from skewlens.profiler.atomic import atomic_file

WAIT_HEATMAP_FILE = "wait_heatmap.png"
BREAKDOWN_FILE = "step_breakdown.png"
#: Most labelled ticks on an axis of ranks or collectives (every row / column is still drawn).
_MAX_TICKS = 40
#: Largest side of a picture, inches.
_MAX_INCHES = 18


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure


def _save(fig: Any, path: Path) -> Path:
    with atomic_file(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return path


def _ticks(n: int) -> list[int]:
    """Positions of at most about :data:`_MAX_TICKS` evenly spaced labels along ``n`` rows or columns."""
    return list(range(0, n, max(n // _MAX_TICKS, 1)))


def wait_heatmap(result: AnalysisResult, path: str | Path, *, max_columns: int = 400) -> Path:
    """Heatmap of each rank's wait (ms) at each collective instance, in order of last arrival. Every rank
    is a row; of many ranks (or instances) only about :data:`_MAX_TICKS` are labelled, and the picture
    grows with them up to :data:`_MAX_INCHES`."""
    events = [e for e in result.skew.events if e.kind == "collective"]
    if len(events) > max_columns:  # keep the worst ones, still in time order
        keep = np.sort(np.argsort([-e.total_exposed_wait_ns for e in events])[:max_columns])
        events = [events[i] for i in keep.tolist()]
    ranks = np.array(sorted(result.run.ranks), dtype=np.int64)
    grid = np.full((ranks.size, max(len(events), 1)), np.nan)
    for j, e in enumerate(events):
        grid[np.searchsorted(ranks, np.asarray(e.ranks, dtype=np.int64)), j] = e.wait_ns / 1e6
    fig = _figure()(
        figsize=(min(4 + 0.12 * len(events), _MAX_INCHES), min(1.5 + 0.35 * ranks.size, _MAX_INCHES))
    )
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    yticks = _ticks(ranks.size)
    ax.set_yticks(yticks, [str(r) for r in ranks[yticks].tolist()])
    ax.set_ylabel("rank")
    ax.set_xlabel("collective instance (by last arrival)")
    ticks = _ticks(len(events))
    labels = [f"{events[i].comm_type.lower()} {events[i].pg_name}#{events[i].seq}" for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_title("wait for peers (ms); blank: not a member")
    fig.colorbar(im, ax=ax, label="ms")
    return _save(fig, Path(path))


def breakdown_bars(result: AnalysisResult, path: str | Path, *, max_ranks: int = MAX_RANK_ROWS) -> Path:
    """Stacked bars of each rank's mean step breakdown (ms per step); of more than ``max_ranks`` ranks (0:
    no limit), those the report's breakdown table lists, and a line saying what was left out."""
    parts = ("compute", "exposed wait", "exposed transfer", "idle")
    shown, rest = rank_means(result.breakdown).least_waiting(max_ranks)
    vals = shown.mean_ns[:, [MEAN_PARTS.index(p) for p in parts]] / 1e6
    labels = [str(r) for r in shown.ranks]
    fig = _figure()(figsize=(max(4, 0.6 * len(labels) + 3), 4))
    ax = fig.add_subplot()
    bottom = np.zeros(len(labels))
    colors = ("#4c72b0", "#dd8452", "#c44e52", "#bbbbbb")
    for k, name in enumerate(parts):
        ax.bar(labels, vals[:, k], bottom=bottom, label=name, color=colors[k])
        bottom += vals[:, k]
    ax.set_xlabel("rank")
    ax.set_ylabel("ms per step (mean)")
    title = "step breakdown (communication hidden under compute not shown)"
    ax.set_title(title)
    if rest.ranks:  # under the rank axis, wrapped at the picture's width
        ax.annotate(
            ranks_left_out(shown, rest),
            xy=(0, 0),
            xycoords="axes fraction",
            xytext=(0, -42),
            textcoords="offset points",
            va="top",
            fontsize=8,
            wrap=True,
        )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, Path(path))
