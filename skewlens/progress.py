"""Progress of long work, reported by the library and drawn at the edge.

Long work (loading ranks, importing traces, exporting Parquet, the what-if simulations, a replay's stages)
reports through a :class:`Progress`: ``with progress.task("loading ranks", total) as advance: ...
advance()``. The library defaults to :data:`NO_PROGRESS`, which draws nothing (as does ``progress=None``);
the CLIs pass :class:`skewlens.rich_progress.RichProgress`, a rich progress bar on stderr. This module
imports nothing beyond the standard library, so the model, the store and the analyses stay free of
rendering libraries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Advance(Protocol):
    """Marks ``n`` more units of a task done; ``description`` replaces its label."""

    def __call__(self, n: int = 1, description: str | None = None) -> None: ...


class Progress(Protocol):
    """Something that shows tasks advancing (a progress bar, a log, nothing)."""

    def task(self, description: str, total: int | None) -> AbstractContextManager[Advance]: ...


def _ignore(n: int = 1, description: str | None = None) -> None:
    return None


class _NoProgress:
    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Advance]:
        yield _ignore


#: Draws nothing: the library's default.
NO_PROGRESS: Progress = _NoProgress()


def given(progress: Progress | None) -> Progress:
    """``progress``, or :data:`NO_PROGRESS` where it is None: the Python API takes ``progress=None`` as no
    progress, as leaving it out is."""
    return NO_PROGRESS if progress is None else progress
