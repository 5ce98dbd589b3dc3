"""The console the commands (and the sweep summary, which Hydra calls back) print their reports on."""

from __future__ import annotations

import os

from rich.console import Console

from skewlens.profiler.store.issues import MAX_RANK_ROWS

#: Width of the reports where they go to a file or a pipe (a CI log, ``| tee``): rich's default there is
#: 80 columns, which wraps a table's free-text cause column into slivers a word wide. ``COLUMNS`` in the
#: environment still decides, and a terminal keeps its own width.
FILE_WIDTH = 160


def report_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr), :data:`FILE_WIDTH` wide where it is not a terminal."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = FILE_WIDTH
    return console


def ranks_caption(ranks: tuple[int, ...], where: str) -> str:
    """What a summary listing only the first :data:`MAX_RANK_ROWS` of ``ranks`` says of the rest: ``1,024
    ranks: the first 32 listed, 992 more in RUN/manifest.json``."""
    rest = len(ranks) - MAX_RANK_ROWS
    return f"{len(ranks):,} ranks: the first {MAX_RANK_ROWS} listed, {rest:,} more in {where}"
