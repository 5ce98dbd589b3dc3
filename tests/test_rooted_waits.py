"""Rooted collectives wait per type (the execution model's ``waits_for``): a broadcast, scatter or gather
member waits for the root's arrival, a broadcast root for no one, a scatter or gather root for the last
arrival (gloo's); a reduce, or a collective whose root is unknown, keeps the last arrival for all. The
skew table, the critical path, the summary and the simulator all follow that one rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from replay_workloads import RankFactor

from skewlens.analysis.critical_path import analyze_critical_path
from skewlens.analysis.index import build_index
from skewlens.analysis.skew import SkewEvent, analyze_skew
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.execution import clock_note, collective_waits_for, execution_model
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

MS = 1_000_000
US = 1_000


def _run(
    tmp_path: Path,
    comm_type: CommType,
    root: int | None,
    times: dict[int, tuple[int, int]],
    *,
    nbytes: int = 4096,
) -> RunTrace:
    """3 ranks, one step: each computes until its arrival ``times[r][0]`` (ns), then the collective of
    ``nbytes`` (recorded as ending at ``times[r][1]``), then 1 ms of optimizer; every member records
    ``root``."""
    b = RunBuilder(3)
    for r, (arrive, end) in times.items():
        rb = b.rank(r).step(0)
        rb.compute("fwd", arrive, start_ns=0)
        rb.collective(comm_type, nbytes, end - arrive, start_ns=arrive, root=root)
        rb.compute("opt", MS)
    name = f"run-{comm_type.name}-{root}-{nbytes}-{abs(hash(tuple(times.items())))}"
    return load_run(b.write(tmp_path / name))


def _event(run: RunTrace) -> SkewEvent:
    (event,) = analyze_skew(build_index(run)).events
    return event


def _coll_rows(run: RunTrace) -> dict[int, int]:
    (c,) = run.collectives
    return dict(zip(c.ranks, c.rows, strict=True))


def _replays_as_recorded(run: RunTrace) -> None:
    res = simulate(run)
    for r, rt in run.ranks.items():
        t = res.timed[r]
        assert np.array_equal(res.start_ns[r][t], rt.start_ns[t]), r
        assert np.array_equal(res.end_ns[r][t], rt.end_ns[t]), r


def test_a_late_broadcast_receiver_makes_no_one_wait_and_does_not_stretch_the_roots_step(
    tmp_path: Path,
) -> None:
    # root 0 arrives at 1 ms and sends until 4 ms; rank 2 arrives at 2 ms, after the root: the old rule
    # had the root (and rank 1) wait 1 ms for rank 2, and blamed rank 2
    run = _run(tmp_path, CommType.BROADCAST, 0, {0: (MS, 4 * MS), 1: (MS, 4200 * US), 2: (2 * MS, 4200 * US)})
    e = _event(run)
    assert e.wait_ns.tolist() == [0, 0, 0]
    assert e.late_rank == 0 and e.late_by_ns == 0
    assert analyze_skew(build_index(run)).caused_wait_ns.get(2, 0) == 0
    _replays_as_recorded(run)
    # rank 2's forward 4x slower: it arrives at 8 ms; the root still sends from 1 ms to 4 ms (the old rule
    # ended its broadcast at 10 ms), and only rank 2's own broadcast moves, by its 6 ms
    rows = _coll_rows(run)
    slow = simulate(run, effects=RankFactor(rank=2, factor=4.0))
    assert int(slow.end_ns[0][rows[0]]) == 4 * MS
    assert int(slow.end_ns[1][rows[1]]) == 4200 * US
    assert int(slow.end_ns[2][rows[2]]) == 8 * MS + 2200 * US
    step0 = {s.rank: s.step_time_ns for s in summarize(run, slow)}
    assert step0[0] == 5 * MS  # forward, broadcast, optimizer: not stretched by rank 2
    assert {s.rank: s.wait_ns for s in summarize(run, slow)} == {0: 0, 1: 0, 2: 0}
    assert execution_model(run).syncs[0].waits_for == (0, 0, 0)  # the rule all of them read


def test_a_late_broadcast_root_makes_every_receiver_wait_from_its_own_arrival_to_the_roots(
    tmp_path: Path,
) -> None:
    # root 0 arrives at 5 ms; rank 1 at 1 ms, rank 2 at 7 ms (after the root: it waits for nobody)
    times = {0: (5 * MS, 9 * MS), 1: (MS, 9 * MS), 2: (7 * MS, 9 * MS)}
    run = _run(tmp_path, CommType.BROADCAST, 0, times)
    e = _event(run)
    assert e.wait_ns.tolist() == [0, 4 * MS, 0]  # root_arrival - own_arrival, where positive
    assert e.late_rank == 0 and e.blamed_rank == 0
    assert analyze_skew(build_index(run)).caused_wait_ns == {0: 4 * MS}
    _replays_as_recorded(run)
    # the root 2 ms later (at 7 ms, with rank 2): rank 1's broadcast ends 2 ms later, rank 2's does not
    rows = _coll_rows(run)
    slow = simulate(run, effects=RankFactor(rank=0, factor=1.4))
    assert [int(slow.end_ns[r][rows[r]]) for r in range(3)] == [11 * MS, 11 * MS, 9 * MS]


def test_the_critical_path_goes_from_a_broadcast_receiver_to_the_root_it_waited_for(tmp_path: Path) -> None:
    # rank 1 (at 1 ms) waits for root 0 (at 5 ms) and ends last; rank 2 arrives later still (7 ms): the
    # old rule took the path to rank 2, for which nobody waited
    times = {0: (5 * MS, 6 * MS), 1: (MS, 9 * MS), 2: (7 * MS, 7500 * US)}
    path = analyze_critical_path(build_index(_run(tmp_path, CommType.BROADCAST, 0, times)))
    k = next(i for i, p in enumerate(path) if p.via == "collective")
    assert (path[k].rank, path[k + 1].rank) == (1, 0)
    assert path[k].contribution_ns == 4 * MS  # its transfer: from the root's arrival to its end


def test_a_scatter_receiver_waits_for_the_root_only_and_the_root_for_its_last_receiver(
    tmp_path: Path,
) -> None:
    # root 0 and rank 1 arrive at 1 ms: rank 1 has its piece at 1.5 ms; rank 2 arrives at 3 ms, and the
    # root (gloo: each send waits for its recv) is done with it at 3.5 ms
    times = {0: (MS, 3500 * US), 1: (MS, 1500 * US), 2: (3 * MS, 3500 * US)}
    run = _run(tmp_path, CommType.SCATTER, 0, times)
    e = _event(run)
    assert e.wait_ns.tolist() == [2 * MS, 0, 0]  # the old rule had rank 1 wait 0.5 ms (to its end) too
    assert e.late_rank == 2 and e.blamed_rank == 2
    assert analyze_skew(build_index(run)).caused_wait_ns == {2: 2 * MS}
    _replays_as_recorded(run)
    rows = _coll_rows(run)
    slow = simulate(run, effects=RankFactor(rank=2, factor=2.0))  # rank 2 arrives at 6 ms
    assert [int(slow.end_ns[r][rows[r]]) for r in range(3)] == [6500 * US, 1500 * US, 6500 * US]
    assert clock_note(run) is None
    assert execution_model(run).syncs[0].waits_for == (-1, 0, 0)


def test_only_a_gather_root_waits_for_the_last_member_where_it_came_first(tmp_path: Path) -> None:
    # root 2 at 1 ms; rank 0 sends at 2 ms and leaves at 2.5 ms; rank 1 arrives at 3 ms, the root waits
    # for it: the old rule had rank 0 wait for rank 1 too (to its end)
    times = {0: (2 * MS, 2500 * US), 1: (3 * MS, 3500 * US), 2: (MS, 4 * MS)}
    run = _run(tmp_path, CommType.GATHER, 2, times)
    e = _event(run)
    assert e.wait_ns.tolist() == [0, 0, 2 * MS]
    assert e.late_rank == 1 and e.blamed_rank == 1
    _replays_as_recorded(run)
    # rank 1 3 ms later: the root's gather ends 3 ms later, rank 0's does not move
    rows = _coll_rows(run)
    slow = simulate(run, effects=RankFactor(rank=1, factor=2.0))
    assert [int(slow.end_ns[r][rows[r]]) for r in range(3)] == [2500 * US, 6500 * US, 7 * MS]
    assert clock_note(run) is None  # rank 0 done before rank 1 arrived is what a gather allows
    assert execution_model(run).syncs[0].waits_for == (2, 2, -1)
    assert execution_model(run).syncs[0].detached == (False, False, False)


def test_a_late_gather_root_makes_its_members_wait_for_it(tmp_path: Path) -> None:
    # gloo sends a member's part only once the root has posted its recv: rank 0 at 1 ms waits for root 2
    # (at 3 ms), not for rank 1 (at 4 ms), for which only the root waits
    times = {0: (MS, 3500 * US), 1: (4 * MS, 4500 * US), 2: (3 * MS, 5 * MS)}
    e = _event(_run(tmp_path, CommType.GATHER, 2, times))
    assert e.wait_ns.tolist() == [2 * MS, 0, MS]


def test_a_rooted_collective_with_an_unknown_root_and_a_reduce_keep_the_last_arrival_rule(
    tmp_path: Path,
) -> None:
    times = {0: (MS, 4 * MS), 1: (MS, 4 * MS), 2: (2 * MS, 4 * MS)}
    # a broadcast's root not recorded, or a rank that is not a member; a reduce passes partial sums through
    # its non-roots (a gloo capture: members 6 ms early ended after the last arrival)
    for comm_type, root in ((CommType.BROADCAST, None), (CommType.BROADCAST, 7), (CommType.REDUCE, 0)):
        run = _run(tmp_path, comm_type, root, times)
        e = _event(run)
        assert e.wait_ns.tolist() == [MS, MS, 0]
        assert e.late_rank == 2
        _replays_as_recorded(run)
    # a collective of no loaded member has no rule, rooted or not
    assert collective_waits_for(run, CommType.BROADCAST, [], []) == ()


def test_an_empty_all_reduce_makes_no_one_wait_and_a_late_member_delays_only_itself(tmp_path: Path) -> None:
    # PowerSGD's DDP hook all_reduces an empty tensor each step; gloo returns at once without the others
    # (rank 0 done 39.4 ms before rank 1 began in a 2-rank capture, read as "clocks disagree"), and NCCL
    # discards it. Rank 2 arrives 4 ms after ranks 0 and 1, each done 20 us after its own arrival.
    times = {0: (MS, MS + 20 * US), 1: (MS, MS + 20 * US), 2: (5 * MS, 5 * MS + 20 * US)}
    for comm_type in (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE):
        run = _run(tmp_path, comm_type, 0 if comm_type == CommType.REDUCE else None, times, nbytes=0)
        assert execution_model(run).syncs[0].waits_for == (0, 1, 2)
        assert clock_note(run) is None
        e = _event(run)
        assert e.wait_ns.tolist() == [0, 0, 0]
        assert analyze_skew(build_index(run)).caused_wait_ns.get(2, 0) == 0
        _replays_as_recorded(run)
        # rank 2's forward twice as slow: ranks 0 and 1 still end theirs at 1.02 ms
        rows = _coll_rows(run)
        slow = simulate(run, effects=RankFactor(rank=2, factor=2.0))
        assert [int(slow.end_ns[r][rows[r]]) for r in range(3)] == [
            MS + 20 * US,
            MS + 20 * US,
            10 * MS + 20 * US,
        ]
    # an empty broadcast, scatter, gather, all_to_all or barrier still waits (gloo's did, 500 ms), and so
    # does an all_reduce that moves bytes
    times = {0: (MS, 5 * MS + 20 * US), 1: (MS, 5 * MS + 20 * US), 2: (5 * MS, 5 * MS + 20 * US)}
    for comm_type, nbytes in (
        (CommType.BROADCAST, 0),
        (CommType.ALL_TO_ALL, 0),
        (CommType.BARRIER, 0),
        (CommType.ALL_REDUCE, 4),
    ):
        run = _run(tmp_path, comm_type, 2 if comm_type == CommType.BROADCAST else None, times, nbytes=nbytes)
        assert _event(run).wait_ns.tolist() == [4 * MS, 4 * MS, 0], comm_type


def test_a_receiver_late_at_a_broadcast_whose_root_came_first_keeps_its_own_lateness_at_the_next(
    tmp_path: Path,
) -> None:
    # ZeroRedundancyOptimizer's shape: an all_reduce where rank 0 waits for rank 1, then rank 1's 4 ms more
    # optimizer, then each rank's parameters broadcast back to back: rank 0's (root 0, first: rank 1 waits
    # for no one) and rank 1's (root 1: rank 0 waits 4 ms for it). Rank 1's arrival at rank 0's broadcast
    # was no synchronisation: the wait at its own is its optimizer's, not "earlier wait (caused by rank 0)"
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("fwd", MS if r == 0 else 3 * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, 3 * MS if r == 0 else MS, start_ns=MS if r == 0 else 3 * MS)
        rb.compute("opt", MS if r == 0 else 5 * MS)
        t = 5 * MS if r == 0 else 9 * MS
        rb.collective(CommType.BROADCAST, 4096, 5 * MS if r == 0 else MS, start_ns=t, root=0, stream=1)
        rb.collective(
            CommType.BROADCAST, 4096, 5 * MS if r == 0 else MS, start_ns=t + 100 * US, root=1, stream=1
        )
    run = load_run(b.write(tmp_path / "zero"))
    events = analyze_skew(build_index(run)).events
    assert [e.comm_type for e in events] == ["ALL_REDUCE", "BROADCAST", "BROADCAST"]
    e = events[2]
    assert e.wait_ns.tolist() == [4 * MS, 0]
    assert e.late_rank == 1 and e.blamed_rank == 1
    assert e.cause.kind.value == "compute" and e.cause.op == "opt" and e.cause.delta_ns == 4 * MS


def test_a_broadcast_the_late_rank_rooted_and_reached_first_is_no_synchronisation_of_its_later_lateness(
    tmp_path: Path,
) -> None:
    # rank 1 roots a broadcast it reaches 2 ms before rank 0 and waits for no one: that broadcast did not
    # line the two up, so rank 1's lateness at the next all_reduce (5 ms) is measured from the all_reduce
    # before (rank 1: 1 + 8 ms since, rank 0: 3 + 1), not from the broadcast (which would read +7 ms)
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS // 10, start_ns=MS)
        rb.compute("pre", MS if r == 1 else 3 * MS)
        rb.collective(CommType.BROADCAST, 4096, MS // 10, root=1)
        rb.compute("opt", 8 * MS if r == 1 else MS)
        rb.collective(CommType.ALL_REDUCE, 4096, MS // 10)
    events = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert [e.wait_ns.tolist() for e in events[1:]] == [[0, 0], [100 * US, 0]]
    e = events[2]
    assert e.late_rank == 1 and e.blamed_rank == 1
    assert e.cause.kind.value == "compute" and e.cause.op == "opt" and e.cause.delta_ns == 5 * MS


def test_an_all_reduce_of_one_byte_still_makes_the_early_members_wait(tmp_path: Path) -> None:
    # only a call empty on every member returns at once; a 1-byte one waits for the last arrival
    times = {0: (MS, 5 * MS + 20 * US), 1: (MS, 5 * MS + 20 * US), 2: (5 * MS, 5 * MS + 20 * US)}
    run = _run(tmp_path, CommType.ALL_REDUCE, None, times, nbytes=1)
    assert execution_model(run).syncs[0].waits_for == (-1, -1, -1)
    assert _event(run).wait_ns.tolist() == [4 * MS, 4 * MS, 0]
