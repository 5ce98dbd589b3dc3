"""Work on threads, in order: how many CPUs this process may use, and a bounded, ordered thread map; and
the worker processes of the commands that convert files one per process (:func:`process_pool`).

The decoder, Arrow's kernels and Parquet encoding spend most of their time in numpy and Arrow with the
GIL released, so a few threads overlap decoding the next trace file (or formatting the next chunk) with
this one's work, without the start-up, pickling and ``__main__`` guard that worker processes need.
Memory a thread freed stays in that thread's malloc arena (glibc gives each thread its own), where later
allocations on the main thread cannot use it: :func:`release_free_memory` hands it back to the OS once
the threads are done. This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

T = TypeVar("T")
R = TypeVar("R")

#: The most threads :func:`default_workers` gives (each holds a chunk or a decoded file in memory).
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


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """The function ``name`` of the C library the interpreter uses, None where it has none (not glibc:
    musl, macOS, which have no per-thread arenas to trim or thresholds to tune either)."""
    try:
        fn: Callable[..., int] = getattr(ctypes.CDLL(None), name)
        return fn
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    return _glibc("malloc_trim")


#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap and are reused once freed (glibc's largest allowed value).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Once more than this is free at the top of the heap, glibc gives it back to the OS (all but 128 KiB).
TRIM_THRESHOLD_BYTES = 32 << 20


def tune_malloc() -> bool:
    """Let glibc reuse freed blocks of up to 32 MiB instead of mapping fresh pages for each (the commands
    call this once at start; True where it was applied, False off glibc).

    By default glibc gives every block over its mmap threshold (128 KiB at start, rising to the largest
    block freed so far) pages of its own and unmaps them when the block is freed, so the next array of that
    size faults its memory in again, a page at a time. A command makes and frees columns of a rank, or of a
    whole run, many times over. With both thresholds at 32 MiB, ``skewlens replay`` of 1,024 x 10,000
    nodes (from its column cache) took 7.96 instead of 8.83 s and 430 k page faults instead of 720 k, at an
    11 MiB higher peak; ``skewlens analyze`` of the 32-rank GPU run 13.2 instead of 13.5 s, 6-11 MiB higher
    (``docs/benchmarks.md``). Blocks over 32 MiB are still mapped (numpy asks for huge pages for them), and
    once more than 32 MiB is free at the top of the heap glibc still gives it back.
    The setting is this process's own: the training command ``skewlens profile`` runs and real replay's
    worker processes keep glibc's defaults."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    )


def release_free_memory() -> None:
    """Return the free memory of every malloc arena to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Call it after work on threads: the decoding threads' arenas otherwise keep what they freed, and on the
    32-rank GPU run ``skewlens analyze`` peaked 150 MiB higher (1,375 against 1,229 MiB).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, workers: int, ahead: int = 2
) -> Generator[R, None, None]:
    """``map(fn, items)`` on ``workers`` threads, results in order, at most ``workers * ahead`` pending
    (so memory stays bounded by a few results). ``workers <= 1``: in this thread. An exception in ``fn``
    is raised where its result would have been; closing the iterator early waits for the pending calls.
    A caller whose own code may raise while the iterator is suspended closes it (``contextlib.closing``):
    left to the garbage collector, the pool's shutdown runs on whatever thread collects it, and on a thread
    being started it deadlocks."""
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


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: Why a worker process of :func:`process_pool` died (``BrokenProcessPool``), as the errors say it.
POOL_DIED = (
    "most likely out of memory, or, called from a Python script, the script has no "
    "'if __name__ == \"__main__\":' guard (worker processes import it)"
)


@contextlib.contextmanager
def process_pool(workers: int, preload: str) -> Iterator[ProcessPoolExecutor]:
    """Worker processes forked from a forkserver that imported ``preload`` once (no per-worker import, no
    fork of a parent that may run a progress-bar thread, no re-import of the caller's script), shut down on
    leaving. The workers ignore Ctrl-C: the terminal sends it to the whole process group, and a worker that
    dies of it while the pool hands it a job can leave the pool's shutdown waiting forever; the parent is
    interrupted alone and shuts the pool down (``shutdown(cancel_futures=True)``: the jobs running end, no
    other starts).

    A caller's process whose multiprocessing start method was not chosen is left so: the standard library
    fixes it as it starts a forkserver with modules to preload (``spawn.get_preparation_data`` reads
    ``get_start_method()``), and a notebook's ``multiprocessing.set_start_method("spawn")`` after an import
    from Python was ``RuntimeError: context has already been set``."""
    # imported here: multiprocessing and the process pool cost the commands that use threads only ~10 ms
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    unset = multiprocessing.get_start_method(allow_none=True) is None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([preload])
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_interrupts) as pool:
            yield pool
    finally:
        if unset:
            multiprocessing.set_start_method(None, force=True)
