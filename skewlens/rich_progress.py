"""A :class:`skewlens.progress.Progress` drawn as a rich progress bar (rendering; the CLIs use it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from skewlens.console import on_a_terminal
from skewlens.progress import NO_PROGRESS, Advance


class RichProgress:
    """One transient bar per task on ``console`` (stderr by default); none where the console is not a
    terminal (a file or pipe, where a transient bar would leave only an empty line per task, ``FORCE_COLOR``
    or not: :func:`skewlens.console.on_a_terminal`) or is a dumb one (``TERM=dumb``: Emacs' shell and
    compilation buffers, where screen-reader users of Emacspeak read), which rich draws no bar on either:
    ``skewlens analyze`` of the DLRM run began its report with six empty lines there; or where it is not
    interactive (``TTY_INTERACTIVE=0``, which rich's docs pair with ``TTY_COMPATIBLE=1`` for a CI log in
    colour): rich draws no bar there, and ``skewlens analyze`` wrote a line of cursor codes (hide, show)
    per task into the log, six of them."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=True)

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Advance]:
        if (
            not on_a_terminal(self.console)
            or self.console.is_dumb_terminal
            or not self.console.is_interactive
        ):
            # no bar at all, not a disabled one: rich before 14.3 ends a disabled bar off a terminal with an
            # empty line, and `skewlens analyze RUN 2>err.txt` began err.txt with one per task
            with NO_PROGRESS.task(description, total) as advance:
                yield advance
            return
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        with bar:
            task_id = bar.add_task(description, total=total)

            def advance(n: int = 1, description: str | None = None) -> None:
                if description is None:
                    bar.update(task_id, advance=n)
                else:
                    bar.update(task_id, advance=n, description=description)

            yield advance
