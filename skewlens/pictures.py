"""PNG pictures: matplotlib with its Agg backend (no display), each file written whole or not at all. The
analyses' pictures (``skewlens.analysis.plots``) and the replay's (``skewlens.replay.plots``) draw with
these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skewlens.profiler.atomic import atomic_file


def figure_class() -> Any:
    """matplotlib's ``Figure``, the Agg backend chosen (imported on first use, not by the commands that draw
    nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure


def save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG (a temporary file, then renamed); returns ``path``."""
    with atomic_file(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return path
