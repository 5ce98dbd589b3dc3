"""Critical path: walk back through the latest dependency, the last arriver of a collective, a late send."""

from __future__ import annotations

from pathlib import Path

from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.analysis.critical_path import analyze_critical_path, shares
from skewlens.analysis.index import build_index
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import UNTRACED_NODE_NAME, CommType


def test_path_runs_through_the_straggler_and_accounts_for_the_whole_step(tmp_path: Path) -> None:
    sc = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=3)
    recs = analyze_critical_path(build_index(load_run(build_run(tmp_path, sc))))
    assert sorted({r.step for r in recs}) == list(range(sc.steps))
    by_rank, by_op = shares(recs)
    for step in range(sc.steps):
        path = [r for r in recs if r.step == step]
        # every member's all_reduce ends at its completion: the path begins at the last arriver's
        assert (path[0].rank, path[0].name, path[0].via) == (sc.straggler_rank, "c10d::all_reduce_", "dep")
        mm = [r for r in path if r.name == "aten::mm"]
        assert len(mm) == 1 and mm[0].rank == sc.straggler_rank
        assert mm[0].contribution_ns == sc.straggler_ns
        span = path[0].end_ns - path[-1].start_ns
        assert sum(r.contribution_ns + r.gap_before_ns for r in path) == span
        assert by_rank[step][sc.straggler_rank] > 0.9 * span
        assert max(by_op[step], key=by_op[step].__getitem__) == "aten::mm"


def test_recv_waiting_for_a_late_send_jumps_to_the_sender(tmp_path: Path) -> None:
    compute0, recv_start, transfer, tail = 10 * MS, 1 * MS, 2 * MS, 3 * MS
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("produce", compute0, start_ns=0)
    r0.send(1, 1 << 20, transfer, start_ns=compute0)
    r1 = b.rank(1).step(0)
    r1.recv(0, 1 << 20, compute0 + transfer - recv_start, start_ns=recv_start)
    r1.compute("consume", tail, start_ns=compute0 + transfer)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name) for r in recs] == [
        (1, "consume"),
        (1, "c10d::recv_"),
        (0, "c10d::send"),
        (0, "produce"),
    ]
    assert [r.contribution_ns for r in recs] == [tail, transfer, 0, compute0]
    assert recs[1].via == "p2p"


def test_the_latest_dependency_of_each_row_is_the_one_met_last_and_the_later_row_among_ties() -> None:
    from types import SimpleNamespace

    import numpy as np

    from skewlens.replay.execution import latest_deps

    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 40))
        e, w, lk = (int(rng.integers(0, 3 * n)), int(rng.integers(0, 4)), int(rng.integers(0, 4)))
        ik = int(rng.integers(0, 4))
        dur = rng.integers(0, 3, n)
        ls = rng.integers(0, n, lk)
        m = SimpleNamespace(
            start_src=rng.integers(0, n, e),
            start_dst=rng.integers(0, n, e),
            wait_src=rng.integers(0, n, w),
            wait_dst=rng.integers(0, n, w),
            launch_src=ls,
            launch_dst=rng.integers(0, n, lk),
            launch_off_ns=np.minimum(rng.integers(0, 3, lk), dur[ls]),  # (the model's: within its source)
            launch_after_wait=np.zeros(lk, dtype=np.bool_),
            launch_waited_ns=np.zeros(lk, dtype=np.int64),
            part_wait_src=np.zeros(0, dtype=np.int32),
            part_wait_edge=np.zeros(0, dtype=np.int32),
            issue_src=rng.integers(0, n, ik),
            issue_dst=rng.integers(0, n, ik),
            issue_off_ns=rng.integers(0, 3, ik),
            dur_ns=dur,
            work_ns=dur,
            parent=np.where(rng.random(n) < 0.1, rng.integers(0, n, n), -1),
            sync=np.zeros(n, dtype=np.bool_),
        )
        # (RankModel's property: a launch from a row that waits, its call before the wait, is met in it)
        m.launch_at_arrival = np.isin(m.launch_src, m.wait_dst)
        end = rng.integers(0, 5, n)  # few distinct times: many ties
        start = end - m.dur_ns
        # the reference, edge by edge: (time met, row) compared as pairs, the larger wins
        best: dict[int, tuple[int, int]] = {}
        edges = [
            *zip(m.start_src, m.start_dst, end[m.start_src], strict=True),
            *zip(m.wait_src, m.wait_dst, end[m.wait_src], strict=True),
            *zip(m.launch_src, m.launch_dst, start[m.launch_src] + m.launch_off_ns, strict=True),
            # an issue from inside a row: its offset into the row, within the row
            *zip(
                m.issue_src,
                m.issue_dst,
                start[m.issue_src] + np.minimum(m.issue_off_ns, m.dur_ns[m.issue_src]),
                strict=True,
            ),
        ]
        for s, d, t in edges:
            pair = (int(t), int(s))
            best[int(d)] = max(best[int(d)], pair) if int(d) in best else pair
        want_row = [best.get(i, (-1, -1))[1] for i in range(n)]
        want_met = [best.get(i, (-1, -1))[0] for i in range(n)]
        for i in np.flatnonzero(m.parent >= 0).tolist():
            want_row[i], want_met[i] = int(m.parent[i]), int(start[i])
        row, met = latest_deps(m, start, end)  # type: ignore[arg-type]
        assert (row.tolist(), met.tolist()) == (want_row, want_met)


def _path_sum_and_span(recs: list, step: int) -> tuple[int, int]:
    path = [r for r in recs if r.step == step]
    return sum(r.contribution_ns + r.gap_before_ns for r in path), path[0].end_ns - path[-1].start_ns


def test_a_member_arriving_after_an_asynchronous_collective_ended_is_not_jumped_to(tmp_path: Path) -> None:
    # rank 0 launches the all_reduce at 10 ms and its node ends there (async); rank 1 arrives at 12 ms,
    # after it: the walk must not go forward in time to rank 1 and count 10..12 ms twice
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("a", 10 * MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 1 << 20, 0, start_ns=10 * MS)
    r0.compute("b", 4 * MS, start_ns=10 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("slow", 12 * MS, start_ns=0)
    r1.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=12 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via) for r in recs] == [
        (0, "b", "dep"),
        (0, "c10d::all_reduce_", "dep"),
        (0, "a", "end"),
    ]
    assert [r.contribution_ns for r in recs] == [4 * MS, 0, 10 * MS]
    assert _path_sum_and_span(recs, 0) == (14 * MS, 14 * MS)


def test_a_collective_whose_recorded_end_is_after_its_wait_ended_counts_only_up_to_that_end(
    tmp_path: Path,
) -> None:
    # the wait node ends at 14 ms, the all_reduce it waited for was recorded ending at 15 ms (gloo's worker
    # lag): the all_reduce is on the path only until 14 ms, not 15, so 14..15 ms is not counted twice
    b = RunBuilder(1)
    r0 = b.rank(0).step(0)
    a = r0.compute("a", 10 * MS, start_ns=0)
    coll = r0.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=10 * MS, stream=1, deps=(a,))
    r0.compute("c10d::wait", 4 * MS, start_ns=10 * MS, deps=(coll,))
    r0.compute("d", 2 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.name, r.contribution_ns) for r in recs] == [
        ("d", 2 * MS),
        ("c10d::wait", 0),
        ("c10d::all_reduce_", 4 * MS),
        ("a", 10 * MS),
    ]
    assert _path_sum_and_span(recs, 0) == (16 * MS, 16 * MS)


def test_a_send_that_waited_for_a_late_recv_jumps_to_the_receiver(tmp_path: Path) -> None:
    # rank 0's send (issued at 1 ms on gloo's worker, waited for by c10d::wait) is not eager: it completes
    # at 41 ms, 2 ms after rank 1, 39 ms late in "slow", posted the recv. The path goes through rank 1's
    # recv to "slow"; the send accounts only for its 2 ms transfer, not the 38 ms it waited for rank 1
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    a = r0.compute("a", 1 * MS, start_ns=0)
    snd = r0.send(1, 1 << 20, 40 * MS, start_ns=1 * MS, stream=1, deps=(a,))
    r0.compute("b", 3 * MS, start_ns=1 * MS)
    r0.compute("c10d::wait", 37 * MS, start_ns=4 * MS, deps=(snd,))
    r0.compute("after", 5 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("slow", 39 * MS, start_ns=0)
    r1.recv(0, 1 << 20, 2 * MS, start_ns=39 * MS)
    r1.compute("consume", 1 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (0, "after", "dep", 5 * MS),
        (0, "c10d::wait", "dep", 0),
        (0, "c10d::send", "p2p", 2 * MS),
        (1, "c10d::recv_", "dep", 0),
        (1, "slow", "end", 39 * MS),
    ]
    by_rank, _ = shares(recs)
    assert by_rank[0] == {0: 7 * MS, 1: 39 * MS}
    assert _path_sum_and_span(recs, 0) == (46 * MS, 46 * MS)


def test_an_eager_send_is_not_a_wait_for_its_recv(tmp_path: Path) -> None:
    # the send ends at 3 ms, 15 us after its recv began at 2.985 ms (within the clocks' skew): eager, it
    # waited for nobody; the path stays on rank 0 ("a", then the send's 2 ms)
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("a", 1 * MS, start_ns=0)
    r0.send(1, 1 << 20, 2 * MS)
    r0.compute("after", 5 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("slow", 2_985_000, start_ns=0)
    r1.recv(0, 1 << 20, 15_000)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.contribution_ns) for r in recs] == [
        (0, "after", 5 * MS),
        (0, "c10d::send", 2 * MS),
        (0, "a", 1 * MS),
    ]


def _three_queued_all_reduces(tmp_path: Path, *, rank1_c3_ns: int) -> Path:
    """Two ranks, one step, three async all_reduces on a gloo comm stream (two worker threads: C3's
    transfer waits for the first to end of C1 and C2). Rank 0 issues C1, C2, C3 at 1, 2 and 35 ms after
    "fwd", "bwd1", "bwd2"; rank 1, late in "slow", at 30, 31 and ``rank1_c3_ns``. C1 ends at 40 ms, C2 at
    41, C3 at 42; then a wait for all three and "opt" (1.1 ms on rank 0, 1 ms on rank 1)."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        t1, t2, t3 = (1 * MS, 2 * MS, 35 * MS) if r == 0 else (30 * MS, 31 * MS, rank1_c3_ns)
        h1 = rb.compute("fwd" if r == 0 else "slow", t1, start_ns=0)
        c1 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 40 * MS - t1, start_ns=t1, stream=1, deps=(h1,))
        h2 = rb.compute("bwd1", 1 * MS, start_ns=t1)
        c2 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 41 * MS - t2, start_ns=t2, stream=1, deps=(h2,))
        h3 = rb.compute("bwd2", t3 - t2, start_ns=t2)
        c3 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 42 * MS - t3, start_ns=t3, stream=1, deps=(h3,))
        rb.compute("c10d::wait", 42 * MS - t3, start_ns=t3, deps=(c1, c2, c3))
        rb.compute("opt", 1 * MS + (100_000 if r == 0 else 0))
    return b.write(tmp_path / "run")


def test_a_collective_whose_transfer_waited_for_the_one_queued_before_it_goes_through_that_one(
    tmp_path: Path,
) -> None:
    # gloo's two worker threads: C3's transfer waits for the first to end of C1 and C2 (the execution
    # model's queue edge). Rank 1, 30 ms late in "slow", issues C1 at 30 ms (done at 40), C2 at 31 (41);
    # rank 0 issues C3 last, at 35 ms, but C3 waits for C1 until 40, then transfers 2 ms. The step's end
    # is held by rank 1's lateness through C1, not by rank 0's "bwd2" (shorter, the end is the same)
    recs = analyze_critical_path(
        build_index(load_run(_three_queued_all_reduces(tmp_path, rank1_c3_ns=32 * MS)))
    )
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (0, "opt", "dep", 1_100_000),
        (0, "c10d::wait", "dep", 0),
        (0, "c10d::all_reduce_", "dep", 2 * MS),  # C3: its own transfer, after C1 ended
        (0, "c10d::all_reduce_", "collective", 10 * MS),  # C1: its transfer, after rank 1 arrived
        (1, "c10d::all_reduce_", "dep", 0),
        (1, "slow", "end", 30 * MS),
    ]
    by_rank, _ = shares(recs)
    assert by_rank[0] == {0: 13_100_000, 1: 30 * MS}
    assert _path_sum_and_span(recs, 0) == (43_100_000, 43_100_000)


def test_a_collective_whose_queued_predecessor_ended_before_its_last_peer_arrived_goes_to_that_peer(
    tmp_path: Path,
) -> None:
    # gloo's two worker threads: C3 is queued behind the first to end of C1 (40 ms) and C2 (41 ms). Rank 0
    # issues C3 at 35 ms; rank 1, late, at 41 ms, after C1 ended: rank 0's C3 waited for rank 1 (1 ms of
    # transfer after it), so the path goes to rank 1 and its "bwd2" (31 to 41 ms), not back through C1
    recs = analyze_critical_path(
        build_index(load_run(_three_queued_all_reduces(tmp_path, rank1_c3_ns=41 * MS)))
    )
    path = [(x.rank, x.name, x.via, x.contribution_ns) for x in recs]
    assert path[:4] == [
        (0, "opt", "dep", 1_100_000),
        (0, "c10d::wait", "dep", 0),
        (0, "c10d::all_reduce_", "collective", 42 * MS - 41 * MS),  # C3, after rank 1 arrived
        (1, "c10d::all_reduce_", "dep", 0),
    ]
    assert (1, "bwd2", "dep", 41 * MS - 31 * MS) in path


def test_a_collective_whose_awaited_member_arrived_when_it_did_stays_on_its_own_rank(tmp_path: Path) -> None:
    # both ranks arrive at the all_reduce at 10 ms; rank 1's "b" ends last (16 ms). Rank 1's member waited
    # for the first of the last arrivals (rank 0), which arrived no later than itself: no jump, the path
    # stays on rank 1 ("slow", its own 10 ms)
    b = RunBuilder(2)
    for r, name, tail in ((0, "a", 1 * MS), (1, "slow", 4 * MS)):
        rb = b.rank(r).step(0)
        rb.compute(name, 10 * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 2 * MS, start_ns=10 * MS)
        rb.compute("b", tail)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (1, "b", "dep", 4 * MS),
        (1, "c10d::all_reduce_", "dep", 2 * MS),
        (1, "slow", "end", 10 * MS),
    ]


def test_the_node_before_a_jumped_to_member_counts_only_up_to_that_members_arrival(tmp_path: Path) -> None:
    # rank 1's all_reduce arrives at 10 ms, 5 us before its "slow" ends (timestamp skew: it still follows
    # "slow"); rank 0 waited for it from 1 ms. The path jumps to rank 1 at 10 ms, so "slow" is on it only
    # until 10 ms: 10 ms, and the path adds up to its 14 ms span (not 14.005)
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("a", 1 * MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 1 << 20, 11 * MS, start_ns=1 * MS)
    r0.compute("b", 2 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("slow", 10 * MS + 5_000, start_ns=0)
    r1.collective(CommType.ALL_REDUCE, 1 << 20, 2 * MS, start_ns=10 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (0, "b", "dep", 2 * MS),
        (0, "c10d::all_reduce_", "collective", 12 * MS - 10 * MS),
        (1, "c10d::all_reduce_", "dep", 0),
        (1, "slow", "end", 10 * MS),
    ]
    assert _path_sum_and_span(recs, 0) == (14 * MS, 14 * MS)


def test_relabelling_the_ranks_of_a_step_that_ends_in_a_tie_relabels_its_path_and_changes_nothing_else(
    tmp_path: Path,
) -> None:
    # every member's all_reduce ends at 12 ms (a tie for the step's last node); rank `late` arrives last.
    # The path begins at the member the tie's walk goes on from, whatever the ranks are called: it began
    # at the lowest rank's all_reduce, so relabelling the late rank as 0 moved its transfer (1 ms) to
    # another rank's share and added a row
    def path(late: int, name: str) -> list[tuple[int, str, int, str]]:
        b = RunBuilder(3)
        for r in range(3):
            arrive = 11 * MS if r == late else (3 + 2 * r) * MS
            b.rank(r).step(0).compute("aten::mm", arrive, start_ns=0)
            b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, 12 * MS - arrive, start_ns=arrive)
        recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / name))))
        return [(r.rank, r.name, r.contribution_ns, r.via) for r in recs]

    as_two, as_zero = path(2, "late2"), path(0, "late0")
    assert as_two == [(2, "c10d::all_reduce_", MS, "dep"), (2, "aten::mm", 11 * MS, "end")]
    assert as_zero == [(0 if r == 2 else r, n, c, v) for r, n, c, v in as_two]


def test_of_two_ranks_compute_ending_at_once_the_path_begins_at_the_longer_whatever_the_ranks_are_called(
    tmp_path: Path,
) -> None:
    # rank `long` runs a 10 ms operator, the other a 4 ms one ending with it, and nothing joins them. The
    # tie rule for a collective's members (the last to start) began the path at the 4 ms one: a path over
    # 4 ms of a 10 ms step (found by mutation round 20)
    def path(long: int, name: str) -> list[tuple[int, str, int]]:
        b = RunBuilder(2)
        b.rank(long).step(0).compute("aten::linear", 10 * MS, start_ns=0)
        b.rank(1 - long).step(0).compute("aten::mm", 4 * MS, start_ns=6 * MS)
        recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / name))))
        return [(r.rank, r.name, r.contribution_ns) for r in recs]

    assert path(0, "long0") == [(0, "aten::linear", 10 * MS)]
    assert path(1, "long1") == [(1, "aten::linear", 10 * MS)]


def test_a_collective_queued_behind_two_rows_goes_through_the_one_that_ended_last_whatever_its_row(
    tmp_path: Path,
) -> None:
    # rank 0's C3 (issued at 35 ms, done at 42) has two queue edges: C1, the first to end of the two before
    # it on gloo's workers (at 40 ms), and "side", a 40 ms operator on another stream it depends on,
    # recorded before C1 and still running at C3's issue (done at 41). Its transfer waited for "side" to
    # 41 ms: C3 1 ms, then "side" (1 to 41 ms) and "fwd". Taking the queue source recorded last (C1), or
    # the first to end, gave C3 2 ms and C1's path to rank 1, leaving "side" off the path
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        t1, t2, t3 = (1 * MS, 2 * MS, 35 * MS) if r == 0 else (30 * MS, 31 * MS, 32 * MS)
        h1 = rb.compute("fwd" if r == 0 else "slow", t1, start_ns=0)
        side = rb.compute("side", 41 * MS - t1, start_ns=t1, stream=2, deps=(h1,))
        c1 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 40 * MS - t1, start_ns=t1, stream=1, deps=(h1,))
        h2 = rb.compute("bwd1", 1 * MS, start_ns=t1)
        c2 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 41 * MS - t2, start_ns=t2, stream=1, deps=(h2,))
        h3 = rb.compute("bwd2", t3 - t2, start_ns=t2)
        c3 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 42 * MS - t3, start_ns=t3, stream=1, deps=(h3, side))
        rb.compute("c10d::wait", 42 * MS - t3, start_ns=t3, deps=(c1, c2, c3))
        rb.compute("opt", 1 * MS + (100_000 if r == 0 else 0))
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (0, "opt", "dep", 1_100_000),
        (0, "c10d::wait", "dep", 0),
        (0, "c10d::all_reduce_", "dep", 42 * MS - 41 * MS),  # C3, after "side" ended
        (0, "side", "dep", 40 * MS),
        (0, "fwd", "end", 1 * MS),
    ]
    assert _path_sum_and_span(recs, 0) == (43_100_000, 43_100_000)


def test_a_collective_whose_last_member_arrived_the_instant_it_completed_goes_to_that_member(
    tmp_path: Path,
) -> None:
    # rank 0 arrives at 1 ms and waits; rank 1, late in "slow", arrives at 10 ms and the all_reduce
    # completes the same instant (no transfer left). Rank 0's member waited 9 ms for rank 1: the path goes
    # to rank 1's "slow" (10 ms); staying on rank 0 gave its all_reduce those 9 ms and "a" 1 ms
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("a", 1 * MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 1 << 20, 9 * MS, start_ns=1 * MS)
    r0.compute("b", 2 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("slow", 10 * MS, start_ns=0)
    r1.collective(CommType.ALL_REDUCE, 1 << 20, 0, start_ns=10 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name, r.via, r.contribution_ns) for r in recs] == [
        (0, "b", "dep", 2 * MS),
        (0, "c10d::all_reduce_", "collective", 0),
        (1, "c10d::all_reduce_", "dep", 0),
        (1, "slow", "end", 10 * MS),
    ]


def _pair_path(
    tmp_path: Path, *, before_send_ns: int, send_ns: int, before_recv_ns: int, recv_ns: int
) -> list:
    """Rank 0 computes "produce" from 0 for ``before_send_ns``, then sends (``send_ns`` long); rank 1
    computes "prepare" for ``before_recv_ns``, receives (``recv_ns``), then "consume" (2 ms), which ends
    the step. The path as ``(rank, name, via, contribution_ns)``."""
    b = RunBuilder(2)
    b.rank(0).step(0).compute("produce", before_send_ns, start_ns=0)
    b.rank(0).send(1, 1 << 20, send_ns)
    r1 = b.rank(1).step(0)
    r1.compute("prepare", before_recv_ns, start_ns=0)
    r1.recv(0, 1 << 20, recv_ns)
    r1.compute("consume", 2 * MS)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    return [(r.rank, r.name, r.via, r.contribution_ns) for r in recs]


def test_a_recv_posted_before_its_eager_send_began_waits_for_that_send(tmp_path: Path) -> None:
    # rank 1 posts the recv at 2.985 ms (done at 3.0); rank 0's send begins at 2.990 and ends at 2.995,
    # within the clocks' skew of the recv's arrival, so it is eager: it waited for nobody. The recv still
    # waited for the send to begin: the path goes recv (10 us after the send began) -> send -> "produce"
    # (2.99 ms), not recv (15 us) -> "prepare"
    path = _pair_path(
        tmp_path, before_send_ns=2_990_000, send_ns=5_000, before_recv_ns=2_985_000, recv_ns=15_000
    )
    assert path == [
        (1, "consume", "dep", 2 * MS),
        (1, "c10d::recv_", "p2p", 3_000_000 - 2_990_000),
        (0, "c10d::send", "dep", 0),
        (0, "produce", "end", 2_990_000),
    ]


def test_a_recv_whose_send_began_the_instant_it_completed_goes_to_the_sender(tmp_path: Path) -> None:
    # rank 1 posts the recv at 1 ms; rank 0 sends at 10 ms and the recv completes the same instant. The
    # recv waited 9 ms for the send: the path goes to rank 0's "produce" (10 ms), not the recv's 9 ms and
    # "prepare"
    path = _pair_path(tmp_path, before_send_ns=10 * MS, send_ns=0, before_recv_ns=1 * MS, recv_ns=9 * MS)
    assert path == [
        (1, "consume", "dep", 2 * MS),
        (1, "c10d::recv_", "p2p", 0),
        (0, "c10d::send", "dep", 0),
        (0, "produce", "end", 10 * MS),
    ]


def test_a_recv_whose_send_began_when_it_did_stays_on_its_own_rank(tmp_path: Path) -> None:
    # both ranks reach the pair at 10 ms: the recv waited for no one (its send began with it), so the path
    # stays on rank 1 ("prepare", its own 10 ms) and does not jump to the sender
    path = _pair_path(
        tmp_path, before_send_ns=10 * MS, send_ns=2 * MS, before_recv_ns=10 * MS, recv_ns=2 * MS
    )
    assert path == [
        (1, "consume", "dep", 2 * MS),
        (1, "c10d::recv_", "dep", 2 * MS),
        (1, "prepare", "end", 10 * MS),
    ]


def test_untraced_host_time_on_the_path_is_idle_not_compute(tmp_path: Path) -> None:
    # "a" (2 ms), 1 ms of host time the capture did not trace, then "b" (3 ms) after it: the untraced
    # node is on the path, kind idle; the operators around it are compute
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    a = rb.compute("a", 2 * MS, start_ns=0)
    gap = rb.compute(UNTRACED_NODE_NAME, MS, start_ns=2 * MS, deps=(a,))
    rb.compute("b", 3 * MS, start_ns=3 * MS, deps=(gap,))
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.name, r.kind, r.contribution_ns) for r in recs] == [
        ("b", "compute", 3 * MS),
        (UNTRACED_NODE_NAME, "idle", MS),
        ("a", "compute", 2 * MS),
    ]
