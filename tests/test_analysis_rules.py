"""Analysis rules the other tests leave unchecked (found by mutation testing): the step-outlier median,
step times where a rank lacks a step, the compute-stream verdict without idle time, a rooted
collective's lateness, a scatter's message size; the run index's step spans, hidden waits' host work and
last communication."""

from __future__ import annotations

from pathlib import Path

from skewlens.analysis.breakdown import outlier_steps
from skewlens.analysis.gpu_idle import PARTS, StreamMeans, verdict
from skewlens.analysis.index import build_index
from skewlens.analysis.records import StepBreakdownRecord
from skewlens.analysis.skew import CauseKind, analyze_skew
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.simulate import simulate, step_times_from_spans

MS = 1_000_000


def _steps(rank: int, lengths: list[int]) -> list[StepBreakdownRecord]:
    return [
        StepBreakdownRecord(
            rank=rank,
            step=s,
            start_ns=0,
            end_ns=n,
            step_ns=n,
            compute_ns=n,
            exposed_wait_ns=0,
            exposed_transfer_ns=0,
            overlapped_comm_ns=0,
            gpu_compute_ns=0,
            idle_ns=0,
        )
        for s, n in enumerate(lengths)
    ]


def test_the_median_step_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    # 10, 10, 16, 20 ms: median 13 ms, so 20 ms is over 1.5 times it (19.5 ms); the upper middle (16 ms)
    # would make the bar 24 ms and name no step
    found = outlier_steps(_steps(0, [10 * MS, 10 * MS, 16 * MS, 20 * MS]))
    assert [(o.step, o.median_step_ns) for o in found] == [(3, (10 * MS + 16 * MS) // 2)]


def test_a_rank_of_exactly_three_steps_can_have_an_outlier_step() -> None:
    found = outlier_steps(_steps(0, [20 * MS, 10 * MS, 10 * MS]))
    assert [(o.step, o.worst_rank, o.median_step_ns) for o in found] == [(0, 0, 10 * MS)]
    assert outlier_steps(_steps(0, [20 * MS, 10 * MS])) == []  # two steps: too few for a median


def test_compute_streams_that_never_idled_give_no_verdict() -> None:
    busy = StreamMeans(
        rank=0,
        stream=7,
        steps=3,
        step_ns=10.0 * MS,
        busy_ns=10.0 * MS,
        compute_ns=10.0 * MS,
        idle_ns=0.0,
        parts_ns=(0.0,) * len(PARTS),
    )
    assert verdict([busy]) is None


def test_a_broadcast_root_that_arrived_first_is_late_by_nothing(tmp_path: Path) -> None:
    # root 0 arrives at 1 ms, its receivers at 2 and 3 ms: nobody waits for anybody (the receivers need only
    # the root's data, which was there), and the root, the member the others wait for, is not late
    b = RunBuilder(3)
    for r, arrive in ((0, MS), (1, 2 * MS), (2, 3 * MS)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", arrive, start_ns=0)
        rb.collective(CommType.BROADCAST, 4096, 4 * MS - arrive, start_ns=arrive, root=0)
        rb.compute("opt", MS)
    (event,) = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert event.wait_ns.tolist() == [0, 0, 0]
    assert event.late_rank == 0
    assert event.late_by_ns == 0


def test_an_imported_scatter_whose_root_records_its_whole_buffer_moves_that_buffer(tmp_path: Path) -> None:
    # Chakra's input convention: the root's comm_size is its whole buffer (4 pieces), each receiver's its
    # piece; S is the root's buffer, not 4 times it
    piece = 1 << 20
    b = RunBuilder(4)
    for r in range(4):
        rb = b.rank(r)
        rb.compute("fwd", MS, start_ns=0)
        rb.collective(CommType.SCATTER, 4 * piece if r == 0 else piece, 123_456, root=0)
    rt = load_run(b.write(tmp_path / "run"))
    bw, alpha = 50.0, 500
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=bw, latency_ns=alpha),))
    res = simulate(rt, comm_mode="model", topology=flat, algorithm="ring")
    got = [int(e - a) for a, e in zip(res.coll_arrival_ns, res.coll_end_ns, strict=True)]
    s = 4 * piece
    assert got == [round((4 - 1) * (alpha + s / (4 * bw)))]


def test_a_members_transfer_is_its_time_after_the_last_arrival_not_its_whole_call(tmp_path: Path) -> None:
    # rank 0 arrives at 1 ms, rank 1 at 3 ms, both end at 5 ms: rank 0 waits 2 ms, then each moves 2 ms
    b = RunBuilder(2)
    for r, arrive in ((0, MS), (1, 3 * MS)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", arrive, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, 5 * MS - arrive, start_ns=arrive)
    recs = {x.rank: x for x in analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).records()}
    assert {r: (x.wait_ns, x.transfer_ns) for r, x in recs.items()} == {0: (2 * MS, 2 * MS), 1: (0, 2 * MS)}


def test_a_send_after_a_host_gap_of_at_least_half_its_receivers_wait_is_a_late_send(tmp_path: Path) -> None:
    # rank 0 computes 2 ms, idles 0.5 ms, sends at 2.5 ms; rank 1 computes 1 ms, idles 0.6 ms, receives from
    # 1.6 ms: it waits 0.9 ms, and the sender's gap (0.5 ms) is at least half of that: a late send, though
    # the sender's compute grew more (1 ms) than its gap
    us = MS // 1000
    b = RunBuilder(2)
    s = b.rank(0).step(0)
    s.compute("fwd", 2 * MS, start_ns=0)
    s.send(1, 4096, 100 * us, start_ns=2500 * us)
    r = b.rank(1).step(0)
    r.compute("fwd", MS, start_ns=0)
    r.recv(0, 4096, 1000 * us, start_ns=1600 * us)
    (event,) = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert event.wait_ns.tolist() == [0, 900 * us]
    assert event.late_rank == 0
    assert event.cause.kind is CauseKind.LATE_SEND
    assert event.cause.delta_ns == 500 * us


def test_a_step_only_some_ranks_have_and_end_early_takes_no_time_and_the_steps_add_up() -> None:
    # rank 0 has no step 1; rank 1 ends its step 1 (at 90) before rank 0 ends step 0 (at 100)
    spans = {(0, 0): (0, 100), (1, 0): (0, 60), (1, 1): (60, 90), (0, 2): (100, 200), (1, 2): (90, 180)}
    times = step_times_from_spans(spans)
    assert times == {0: 100 - 0, 1: 0, 2: 200 - 100}
    first_start = min(a for a, _ in spans.values())
    last_end = max(b for _, b in spans.values())
    assert sum(times.values()) == last_end - first_start


def test_a_collectives_last_member_that_arrived_with_the_median_member_is_late_by_nothing_and_has_no_cause(
    tmp_path: Path,
) -> None:
    # rank 0 arrives at 1 ms, ranks 1 and 2 at 3 ms: the last (rank 2) arrived with the median member (rank
    # 1), so it was late by nothing, though its window holds 2 ms more compute than rank 1's (whose 2 ms
    # were idle): there is no lateness to explain
    b = RunBuilder(3)
    for r, fwd, arrive in ((0, MS, MS), (1, MS, 3 * MS), (2, 3 * MS, 3 * MS)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", fwd, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, 4 * MS - arrive, start_ns=arrive)
    (event,) = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert event.late_rank == 2
    assert event.late_by_ns == 3 * MS - 3 * MS
    assert event.cause.kind is CauseKind.NONE


def test_a_window_starts_at_the_common_collectives_end_where_that_end_is_the_members_next_arrival(
    tmp_path: Path,
) -> None:
    # C1: rank 0 arrives at 1 ms, rank 1 at 2 ms, both done at 3 ms. C2: rank 1 arrives at 3 ms, right at
    # C1's end (its last synchronised point is that end, not its arrival at C1: C1 did not complete after
    # it); rank 0 computes 0.5 ms more and arrives at 3.5 ms. Windows: rank 0 [3, 3.5) ms, rank 1 [3, 3)
    # ms: both start at C1's end, so the cause is rank 0's 0.5 ms of compute, not a wait (the median's
    # window starting 1 ms earlier, at its C1 arrival, would read as 1 ms of lateness passed on)
    b = RunBuilder(2)
    for r, fwd in ((0, MS), (1, 2 * MS)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", fwd, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, 3 * MS - fwd, start_ns=fwd)
    b.rank(0).compute("bwd", MS // 2)
    for r in (0, 1):
        b.rank(r).collective(CommType.ALL_REDUCE, 4096, 4 * MS - (3 * MS + (MS // 2 if r == 0 else 0)))
    _c1, c2 = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert c2.arrival_ns.tolist() == [3 * MS + MS // 2, 3 * MS]
    assert c2.late_rank == 0
    assert (c2.cause.kind, c2.cause.delta_ns, c2.cause.op) == (CauseKind.COMPUTE, MS // 2, "bwd")


def test_a_member_that_completed_the_common_collective_later_is_late_for_itself_not_for_its_late_rank(
    tmp_path: Path,
) -> None:
    # step 0: rank 1 idles 29 ms (a gc.collect()) and arrives at C1 at 30 ms, rank 0 at 1 ms; both waited
    # there for rank 1, and C1 completes on rank 1 at 31 ms, on rank 0 at 33 ms (gloo's members finish
    # apart: rank 0's transfer took 2 ms longer). Step 1: each computes 1 ms and arrives at C2, rank 1 at
    # 32 ms, rank 0 at 34 ms. Rank 0 is 2 ms late at C2 for its own later completion, not for rank 1's
    # 29 ms idle: before, C2 (and each later step, chained) read "host idle/gap +29.0 ms (passed on by rank
    # 0)", blamed on rank 1
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    r0.compute("fwd", MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 4096, 32 * MS, start_ns=MS)
    r1.compute("fwd", MS, start_ns=0)
    r1.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=30 * MS)
    r0.step(1).compute("fwd", MS)
    r0.collective(CommType.ALL_REDUCE, 4096, MS)
    r1.step(1).compute("fwd", MS)
    r1.collective(CommType.ALL_REDUCE, 4096, 3 * MS)
    c1, c2 = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    assert (c1.late_rank, c1.blamed_rank, c1.cause.kind) == (1, 1, CauseKind.HOST_GAP)
    assert c1.cause.delta_ns == 29 * MS
    assert c2.arrival_ns.tolist() == [34 * MS, 32 * MS]
    assert (c2.step, c2.late_rank, c2.late_by_ns) == (1, 0, 2 * MS)
    assert c2.blamed_rank == 0
    # both windows hold 1 ms of compute: nothing a category counts grew, the 2 ms are C1's transfer
    assert c2.cause.kind is CauseKind.NONE
    assert not c2.cause.passed_on


def test_a_collectives_late_member_idle_right_before_a_send_in_its_window_is_a_late_send_not_a_host_gap(
    tmp_path: Path,
) -> None:
    # rank 0: fwd [0, 1) ms, idle [1, 4) ms, a send to rank 2 at 4 ms (done at 4.1), then the all_reduce of
    # ranks 0 and 1 at 4.1 ms; rank 1: fwd [0, 1) ms, the all_reduce at 1 ms. Windows from the step start:
    # rank 0's 3 ms idle lie right before its send (late_send 3 ms, host gap 0), rank 1 has no idle time
    us = MS // 1000
    b = RunBuilder(3, groups={"world": (0, 1, 2), "pair": (0, 1)})
    r0 = b.rank(0).step(0)
    r0.compute("fwd", MS, start_ns=0)
    r0.send(2, 4096, 100 * us, start_ns=4 * MS, pg="world")
    r0.collective(CommType.ALL_REDUCE, 4096, MS, pg="pair")
    r1 = b.rank(1).step(0)
    r1.compute("fwd", MS, start_ns=0)
    r1.collective(CommType.ALL_REDUCE, 4096, 5100 * us - MS, start_ns=MS, pg="pair")
    b.rank(2).step(0).recv(0, 4096, 4100 * us, start_ns=0, pg="world")
    events = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).events
    (ar,) = [e for e in events if e.kind == "collective"]
    assert ar.late_rank == 0
    assert (ar.cause.kind, ar.cause.delta_ns) == (CauseKind.LATE_SEND, 4 * MS - MS)


# ------------------------------------------------------------------------------- the run index's own rules


def test_step_spans_without_the_manifests_run_from_a_steps_first_start_to_its_last_end(
    tmp_path: Path,
) -> None:
    # RunIndex.step_spans: the manifest's spans, else each step's nodes; a rank without step marks is one
    # step, -1, from its first node's start to its last node's end (the process-group node is no work)
    import dataclasses

    from skewlens.profiler.manifest import read_manifest, write_manifest

    b = RunBuilder(2)
    r0 = b.rank(0)
    for s in (0, 1):
        r0.step(s).compute("aten::mm", 2 * MS, start_ns=5 * MS * s + MS)
        r0.collective(CommType.ALL_REDUCE, 4096, MS // 2)
        r0.compute("aten::add", MS)  # from the step's start + 2.5 ms: its last end at + 3.5 ms
    r1 = b.rank(1)  # no step marks: a compute running past a later, shorter one
    r1.compute("aten::mm", 7 * MS, start_ns=MS // 4)
    r1.compute("aten::add", MS, start_ns=2 * MS, stream=1)
    r1.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=2 * MS, deps=())
    r1.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=8 * MS, deps=())
    run = b.write(tmp_path / "run")
    write_manifest(run, dataclasses.replace(read_manifest(run), steps=()))
    ix = build_index(load_run(run))
    assert ix.step_spans == {
        (0, 0): (MS, MS + 3 * MS + MS // 2),
        (0, 1): (6 * MS, 6 * MS + 3 * MS + MS // 2),
        (1, -1): (MS // 4, 8 * MS + MS // 2),
    }


def test_a_hidden_waits_host_work_begins_where_the_collective_it_held_completed(tmp_path: Path) -> None:
    # RankIndex.host_work_at_ns: a host-time node's work begins at its end less its work; here the compute
    # gap [2, 8) ms holds the completion of the all_reduce issued before it at 6 ms: its work is [6, 8) ms
    from skewlens.profiler.vocab import COMPUTE_GAP_NODE_NAME

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        mm = rb.compute("aten::mm", 2 * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=2 * MS, stream=9, deps=(mm,))
        rb.compute(COMPUTE_GAP_NODE_NAME, 6 * MS, start_ns=2 * MS, deps=(mm,))
    for ri in build_index(load_run(b.write(tmp_path / "run"))).ranks.values():
        (row,) = ri.host_work_rows.tolist()
        assert ri.trace.name(row) == COMPUTE_GAP_NODE_NAME
        assert ri.host_work_at_ns.tolist() == [6 * MS] and int(ri.work_ns[row]) == 2 * MS


def test_the_last_communication_before_t_counts_one_that_ended_exactly_at_t(tmp_path: Path) -> None:
    from skewlens.analysis.index import last_comm_end_before

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS)  # [1, 2) ms
    ri = build_index(load_run(b.write(tmp_path / "run"))).ranks[0]
    last = last_comm_end_before(ri, 2 * MS)  # "at or before t": the all_reduce, its end and its row
    assert last is not None and last[0] == 2 * MS
    assert (int(ri.end_ns[last[1]]), int(ri.coll[last[1]])) == (2 * MS, 0)
    assert last_comm_end_before(ri, 2 * MS - 1) is None


def test_the_last_communication_before_t_is_the_row_that_ended_last_not_the_one_begun_last(
    tmp_path: Path,
) -> None:
    # an asynchronous all_reduce over [0, 10) ms and an all_gather begun after it that ended first, [1, 5) ms:
    # the communication that completed last before 6 ms is the all_gather (the window start a pair's late
    # member passes its lateness on from), before 10 ms the all_reduce
    from skewlens.analysis.index import last_comm_end_before

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 10 * MS, start_ns=0, stream=1)
        rb.collective(CommType.ALL_GATHER, 4096, 4 * MS, start_ns=MS)
    ri = build_index(load_run(b.write(tmp_path / "run"))).ranks[0]
    rt = ri.trace
    assert [
        (end, int(rt.comm_bytes[row]))
        for end, row in (last_comm_end_before(ri, t * MS) or (-1, 0) for t in (6, 10))
    ] == [(5 * MS, 4096), (10 * MS, 1 << 20)]


def test_a_rank_left_out_of_a_lenient_load_has_no_steps_in_the_index(tmp_path: Path) -> None:
    from skewlens.profiler.store.validate import load_validated

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS)
    run = b.write(tmp_path / "run")
    f = run / "rank-1.et"
    f.write_bytes(f.read_bytes()[:-3])  # truncated: left out, its steps still in the manifest
    ix = build_index(load_validated(run, lenient=True))
    assert sorted(ix.run.ranks) == [0] and ix.run.left_out_ranks
    assert ix.step_spans == {(0, 0): (0, 2 * MS)} and list(ix.rank_windows()) == [0]
