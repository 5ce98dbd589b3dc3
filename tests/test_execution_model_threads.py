"""Which host streams of a run are one thread: a capture's streams are threads (never merged into one
timeline), an imported profile's that take turns are taken as one (``execution._timelines``)."""

from __future__ import annotations

from pathlib import Path

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

MS = 1_000_000
US = 1_000
#: rank 1's prefetch thread loads its batch 3 times as slowly
SLOW_PREFETCH = SlowdownModel([Slowdown(kind="op", pattern="load_batch", ranks=(1,), factor=3.0)])


def _two_threads(tmp_path: Path, source: str) -> RunTrace:
    """Two ranks, each with a prefetch thread (stream 1: loads a batch [0, 4) ms, then broadcasts it on
    group 'pref' [4, 5) ms) and a checkpoint thread (stream 2: gathers on group 'ckpt' from 4.995 ms for
    1 ms), both rooted at rank 0, beside the main thread's step (stream 0). The two side threads' busy
    times overlap by 5 us, under 1% of the less busy one's (``MERGE_OVERLAP``)."""
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "pref": (0, 1), "ckpt": (0, 1)})
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=10 * MS, start_ns=0)
        load = rb.compute("load_batch", dur_ns=4 * MS, start_ns=0, stream=1)
        rb.collective(
            CommType.BROADCAST,
            comm_bytes=1 << 20,
            dur_ns=MS,
            pg="pref",
            start_ns=4 * MS,
            stream=1,
            root=0,
            deps=(load,),
        )
        rb.collective(
            CommType.GATHER,
            comm_bytes=1 << 20,
            dur_ns=MS,
            pg="ckpt",
            start_ns=5 * MS - 5 * US,
            stream=2,
            root=0,
        )
    return load_run(b.write(tmp_path / "run", source=source))


def _row(run: RunTrace, rank: int, name: str) -> int:
    rt = run.ranks[rank]
    return next(i for i in range(len(rt)) if rt.name(i) == name)


def test_a_captured_threads_collective_does_not_wait_for_another_thread_that_ran_just_before_it(
    tmp_path: Path,
) -> None:
    # it was queued behind the prefetch thread's broadcast (the two streams merged into one timeline):
    # rank 1's gather started at 13 ms, when its slowed broadcast ended, not at 4.995 ms as recorded
    run = _two_threads(tmp_path, "capture")
    gather, bcast = _row(run, 1, "c10d::gather_"), _row(run, 1, "c10d::broadcast_")
    base, slow = simulate(run), simulate(run, effects=SLOW_PREFETCH)
    assert int(base.start_ns[1][gather]) == int(slow.start_ns[1][gather]) == 5 * MS - 5 * US
    assert int(slow.end_ns[1][gather]) == 6 * MS - 5 * US
    assert (int(slow.start_ns[1][bcast]), int(slow.end_ns[1][bcast])) == (12 * MS, 13 * MS)


def test_an_imported_profiles_streams_that_take_turns_are_still_one_thread(tmp_path: Path) -> None:
    # an imported profile's stream ids need not be threads (DLRM's autograd engine thread and main thread
    # take turns with nothing recorded between them): program order holds across the two streams, and
    # where they overlapped the merged timeline runs one after the other (the gather 5 us late unmodified,
    # as docs/replay.md says of DLRM's ranks 4 and 5)
    run = _two_threads(tmp_path, "import")
    gather = _row(run, 1, "c10d::gather_")
    assert int(simulate(run).start_ns[1][gather]) == 5 * MS
    assert int(simulate(run, effects=SLOW_PREFETCH).start_ns[1][gather]) == 13 * MS
