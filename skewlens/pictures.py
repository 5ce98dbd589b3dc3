"""PNG pictures: matplotlib's Agg canvas (no display, no backend chosen), each file written whole or not at
all. The analyses' pictures (``skewlens.analysis.plots``) and the replay's (``skewlens.replay.plots``) draw
with these."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.errors import SkewlensError


def figure_class() -> Any:
    """matplotlib's ``Figure`` (imported on first use, not by the commands that draw nothing). A ``Figure``
    made from it draws its PNG with the Agg canvas, whatever backend the process uses: no backend is chosen
    here, so that a notebook's own (``%matplotlib inline``) stays as it was; ``matplotlib.use("Agg")`` here
    switched it, and the user's next ``plt.show()`` showed nothing. Its import does not log: where ``HOME``
    cannot be written (a CI container's, a service account's) matplotlib printed two lines of its own on
    stderr ("mkdir -p failed for path .../.config/matplotlib", "Matplotlib created a temporary cache
    directory ... it is highly recommended to set the MPLCONFIGDIR environment variable") among the
    command's warnings, and then drew from that temporary directory as well. Where matplotlib cannot be
    imported at all (uninstalled, or a broken install), a one-line :class:`SkewlensError` says so: ``skewlens
    analyze`` printed a 20-line traceback ending ``ImportError`` and wrote none of its outputs."""
    log = logging.getLogger("matplotlib")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from matplotlib.figure import Figure
    except OSError as e:  # no cache directory it can write (HOME read-only and no temporary directory)
        raise SkewlensError(f"cannot draw pictures: {e}") from None
    except ImportError as e:  # matplotlib (a dependency) missing or broken: a traceback said so before
        raise SkewlensError(
            f"cannot draw pictures: matplotlib cannot be imported ({e}); skewlens needs matplotlib>=3.8 "
            "installed beside it"
        ) from None
    finally:
        log.setLevel(level)
    return Figure


def save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG (a temporary file, then renamed); returns ``path``."""
    with atomic_file(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")  # png: the Agg canvas
    return path
