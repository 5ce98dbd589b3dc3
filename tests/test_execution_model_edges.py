"""Edges of the execution model the other tests leave unchecked (found by mutation testing): where a row
that touches its predecessor's end follows it or is nested in it, and when a host thread's idle time is
taken to be a wait for an asynchronous collective, and which one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.execution import execution_model
from skewlens.replay.simulate import simulate

MS = 1_000_000


def _row(rt: RunTrace, rank: int, name: str) -> int:
    r = rt.ranks[rank]
    return next(i for i in range(len(r)) if r.name(i) == name)


def test_a_nested_row_that_ends_with_its_enclosing_row_is_replayed_inside_it(tmp_path: Path) -> None:
    # a: [0, 100 us); b nested in it, [50 us, 100 us), ending when a ends; c after both
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    rb.compute("a", dur_ns=100_000, start_ns=0)
    rb.compute("b", dur_ns=50_000, start_ns=50_000)
    rb.compute("c", dur_ns=10_000)
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt)
    nested = _row(rt, 0, "b")
    assert (int(res.start_ns[0][nested]), int(res.end_ns[0][nested])) == (50_000, 100_000)
    assert int(res.start_ns[0][_row(rt, 0, "c")]) == 100_000


def test_a_zero_length_row_at_its_predecessors_end_follows_it_when_the_predecessor_grows(
    tmp_path: Path,
) -> None:
    # a: [0, 100 us); z: 0 ns at 100 us (it follows a, it is not inside it); c: after z
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    rb.compute("a", dur_ns=100_000, start_ns=0)
    rb.compute("z", dur_ns=0)
    rb.compute("c", dur_ns=10_000)
    rt = load_run(b.write(tmp_path / "run"))
    a, z, c = (_row(rt, 0, n) for n in ("a", "z", "c"))
    longer = np.full(len(rt.ranks[0]), -1, dtype=np.int64)
    longer[a] = 300_000
    res = simulate(rt, dur_override={0: longer})
    assert int(res.start_ns[0][z]) == 300_000  # a's new end
    assert int(res.start_ns[0][c]) == 300_000


def test_a_host_thread_briefly_idle_before_an_async_completion_is_not_taken_to_wait_for_it(
    tmp_path: Path,
) -> None:
    # each rank: fwd [0, 1 ms), an async all_reduce [1, 10 ms) on a communication stream, bwd [1, 9 ms) on
    # the host, then step at 10.5 ms: it resumes 0.5 ms after the completion, but its thread was idle only
    # 1 ms before it (from 9 ms), under 10 times as long (WAIT_RATIO): not a wait for the completion
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        fwd = rb.compute("fwd", dur_ns=MS, start_ns=0)
        rb.collective(
            CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=9 * MS, start_ns=MS, stream=1000, deps=(fwd,)
        )
        rb.compute("bwd", dur_ns=8 * MS)
        rb.compute("step", dur_ns=MS // 2, start_ns=10 * MS + MS // 2)
    rt = load_run(b.write(tmp_path / "run"))
    base = simulate(rt)
    slow = np.full(len(rt.ranks[1]), -1, dtype=np.int64)
    slow[_row(rt, 1, "fwd")] = 4 * MS  # rank 1 arrives 3 ms later: the all_reduce ends 3 ms later
    late = simulate(rt, dur_override={1: slow})
    coll, step = _row(rt, 0, "c10d::all_reduce_"), _row(rt, 0, "step")
    assert int(late.end_ns[0][coll]) - int(base.end_ns[0][coll]) == 3 * MS
    assert int(late.start_ns[0][step]) == int(base.start_ns[0][step]) == 10 * MS + MS // 2


def test_a_step_tail_that_ends_as_its_last_async_completion_does_waited_for_that_one(tmp_path: Path) -> None:
    # collectives level, one rank: fwd [0, 10) ms issues C1 (10 to 15 ms) on a communication stream, bwd
    # [10, 12) ms issues C2 (12 to 20 ms), then the step's last host-time node [12, 20) ms. It holds both
    # completions, C2's at its very end: it waited for the one that completed last, C2, and did no work
    # after it (C1's end at 15 ms would leave it 5 ms of work)
    b = RunBuilder(world_size=1)
    rb = b.rank(0).step(0)
    f = rb.compute("compute", dur_ns=10 * MS, start_ns=0)
    rb.collective(
        CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=5 * MS, start_ns=10 * MS, stream=1000, deps=(f,)
    )
    g = rb.compute("compute", dur_ns=2 * MS, start_ns=10 * MS)
    rb.collective(
        CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=8 * MS, start_ns=12 * MS, stream=1000, deps=(g,)
    )
    rb.compute("compute", dur_ns=8 * MS, start_ns=12 * MS)
    rt = load_run(b.write(tmp_path / "run"))
    m, r = execution_model(rt).ranks[0], rt.ranks[0]
    colls = [i for i in range(len(r)) if r.name(i) == "c10d::all_reduce_"]
    tail = [i for i in range(len(r)) if r.name(i) == "compute"][-1]
    assert (m.wait_src.tolist(), m.wait_dst.tolist()) == ([colls[1]], [tail])
    assert int(m.work_ns[tail]) == 20 * MS - 20 * MS


def test_a_broadcast_receiver_recorded_done_just_before_its_root_arrived_still_waits_for_the_root(
    tmp_path: Path,
) -> None:
    # the root (rank 0) arrives at 10 ms after 10 ms of x; rank 1 arrives at 1 ms. Recorded done 10 us
    # before the root arrived (within SKEW_NS: clock noise), rank 1 still waits for it: it replays done at
    # the root's arrival, 10 ms, and 3 ms later with the root's x 3 ms longer. Recorded done 30 us before
    # (beyond SKEW_NS: clocks that disagree), it is detached and keeps its recorded end either way
    for done, replayed, slowed in ((9_990_000, 10 * MS, 13 * MS), (9_970_000, 9_970_000, 9_970_000)):
        b = RunBuilder(world_size=2)
        for r, x in ((0, 10 * MS), (1, MS)):
            b.rank(r).compute("x", dur_ns=x, start_ns=0)
            b.rank(r).collective(
                CommType.BROADCAST, comm_bytes=4096, dur_ns=MS if r == 0 else done - x, root=0
            )
        rt = load_run(b.write(tmp_path / str(done)))
        longer = np.full(len(rt.ranks[0]), -1, dtype=np.int64)
        longer[_row(rt, 0, "x")] = 13 * MS
        bcast = _row(rt, 1, "c10d::broadcast_")
        assert int(simulate(rt).end_ns[1][bcast]) == replayed
        assert int(simulate(rt, dur_override={0: longer}).end_ns[1][bcast]) == slowed
