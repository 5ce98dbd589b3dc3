"""Work on threads, in order: how many CPUs this process may use, and a bounded, ordered thread map.

The decoder, Arrow's kernels and Parquet encoding spend most of their time in numpy and Arrow with the
GIL released, so a few threads overlap decoding the next trace file (or formatting the next chunk) with
this one's work, without the start-up, pickling and ``__main__`` guard that worker processes need.
This module imports only the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: The most threads :func:`default_workers` gives (beyond this, the work is bound by memory bandwidth).
MAX_THREADS = 8


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """Threads for decoding, formatting and building outputs: :func:`usable_cores`, at most 8."""
    return max(1, min(usable_cores(), MAX_THREADS))


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int, ahead: int = 2) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads, results in order, at most ``workers * ahead`` pending
    (so memory stays bounded by a few results). ``workers <= 1``: in this thread. An exception in ``fn``
    is raised where its result would have been; closing the iterator early waits for the pending calls."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=workers) as ex:
        pending: list[Future[R]] = []
        for item in items:
            pending.append(ex.submit(fn, item))
            if len(pending) >= workers * ahead:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()
