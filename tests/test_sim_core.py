"""The simulator core and the lowering from the store: timing rules, determinism, errors."""

from __future__ import annotations

import dataclasses
from array import array
from pathlib import Path

import numpy as np
import pytest

from skewlens.profiler.importers import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay import core as core_mod
from skewlens.replay.core import PRIO_COMPLETE, PRIO_START, SYNC, DeadlockError, EventQueue, Graph, run
from skewlens.replay.effects import NO_EFFECTS, Effects
from skewlens.replay.errors import ReplayError
from skewlens.replay.lower import recorded_gaps
from skewlens.replay.simulate import SimResult, Simulator, simulate, step_times_from_spans
from skewlens.replay.slowdown import Slowdown, SlowdownModel

MIB = 1 << 20


@pytest.fixture
def queue() -> EventQueue:
    return EventQueue()


def test_event_queue_pops_equal_times_by_priority_then_insertion(queue: EventQueue) -> None:
    log: list[tuple[int, int, int]] = []
    queue.schedule(20, PRIO_START, 1)
    queue.schedule(10, PRIO_START, 2)
    queue.schedule(10, PRIO_COMPLETE, 3)
    queue.schedule(10, PRIO_START, 4)
    while queue:
        log.append(queue.pop())
    assert log == [(10, PRIO_COMPLETE, 3), (10, PRIO_START, 2), (10, PRIO_START, 4), (20, PRIO_START, 1)]
    assert queue.now == 20


def test_event_queue_refuses_events_in_the_past(queue: EventQueue) -> None:
    queue.schedule(5, PRIO_START, 0)
    queue.pop()
    with pytest.raises(ValueError, match="in the past"):
        queue.schedule(4, PRIO_START, 1)


def _graph(**kw: object) -> Graph:
    base: dict[str, object] = {"groups": [], "transfer": [], "sync_of": []}
    base.update(kw)
    return Graph(**base)  # type: ignore[arg-type]


def test_core_chains_compute_and_releases_members_after_the_last_arrival() -> None:
    # rank A: compute(100) -> sync ; rank B: compute(300) -> sync ; after sync: compute(10) on A
    g = _graph(
        ready0=[0, 0, 0, 0, 0],
        gap=[0, 5, 0, 0, 2],
        length=[100, SYNC, 300, SYNC, 10],
        ndeps=[0, 1, 0, 1, 1],
        succ_ptr=[0, 1, 2, 3, 3, 3],
        succ_idx=[1, 4, 3],
        sync_of=[-1, 0, -1, 0, -1],
        groups=[[1, 3]],
        transfer=[[7, 9]],
    )
    out = run(g)
    assert list(out.seg_start) == [0, 105, 0, 300, 309]
    assert list(out.seg_end) == [100, 307, 300, 309, 319]
    assert out.group_arrival == [300]
    assert out.group_end == [309]


def _host_op_graph(
    *, lengths: tuple[int, int, int], off: int, waits_for: int, at_arrival: bytes | None
) -> Graph:
    """0: a host op, arriving at 10, that launches 2 ``off`` ns in and waits for ``waits_for``: 2, the work
    it launched (which also follows 1 on its stream), or 1."""
    own = waits_for == 2
    return _graph(
        ready0=[0, 0, 0],
        gap=[10, 0, 0],
        length=list(lengths),
        ndeps=[1, 0, 2 if own else 1],  # 0: its wait; 2: its launch (and its stream predecessor)
        succ_ptr=[0, 0, 1, 1] if own else [0, 0, 0, 0],
        succ_idx=[2] if own else [],
        sync_of=[-1, -1, -1],
        wsucc_ptr=[0, 0, 0, 1] if own else [0, 0, 1, 1],
        wsucc_idx=[0],
        lsucc_ptr=[0, 1, 1, 1],
        lsucc_idx=[2],
        lsucc_off=[off],
        lsucc_at_arrival=at_arrival,
    )


def test_a_host_segment_that_launches_the_work_it_then_waits_for_arrives_launches_and_waits() -> None:
    # 0: host op (.item()) arrives at 10, launches 2 (a copy) 4 ns in, then waits for it and works 3 ns
    # 1: the copy's stream predecessor, ends at 50; 2: the copy, 6 ns, after its launch and its predecessor
    def graph(at_arrival: bytes | None) -> Graph:
        return _host_op_graph(lengths=(3, 50, 6), off=4, waits_for=2, at_arrival=at_arrival)

    out = run(graph(bytes([1])))
    assert list(out.seg_start) == [56, 0, 50] and list(out.seg_end) == [59, 50, 56]
    assert out.arrival(0) == 10 and out.arrival(2) == 50
    # the stream free first: the copy waits for its launch (arrival 60 + 4), the op for the copy
    g = graph(bytes([1]))
    out = run(dataclasses.replace(g, gap=[60, 0, 0]))
    assert list(out.seg_start) == [70, 0, 64] and list(out.seg_end) == [73, 50, 70]
    # launched at its (post-wait) start, the copy would never run: a cycle, reported
    with pytest.raises(DeadlockError) as ei:
        run(graph(None))
    assert ei.value.stuck == [0, 2]


def test_a_launch_after_a_segments_wait_is_met_as_long_after_the_wait_as_recorded() -> None:
    # 0: host op arrives at 10, waits for 1 (ends at 50), works 30 (ends 80); it launched 2 (a kernel, 5
    # ns) 20 ns into its work, after its wait: at 70. 1: 50 ns of GPU work.
    def graph(length_1: int) -> Graph:
        return _host_op_graph(lengths=(30, length_1, 5), off=20, waits_for=1, at_arrival=bytes([0]))

    out = run(graph(50))
    assert list(out.seg_start) == [50, 0, 70] and list(out.seg_end) == [80, 50, 75]
    # the GPU work 30 ns shorter: the wait, the work and the launch after it all 30 ns earlier
    out = run(graph(20))
    assert list(out.seg_start) == [20, 0, 40] and list(out.seg_end) == [50, 20, 45]
    # launched at its arrival (not after its wait), the kernel would not move with it
    out = run(dataclasses.replace(graph(20), lsucc_at_arrival=bytes([1])))
    assert out.seg_start[2] == 30


def test_core_reports_a_group_whose_members_never_all_arrive() -> None:
    # A's sync waits for B's, but B's sync depends on a segment that waits for A's sync end
    g = _graph(
        ready0=[0, 0, 0],
        gap=[0, 0, 0],
        length=[SYNC, SYNC, 5],
        ndeps=[0, 1, 1],
        succ_ptr=[0, 1, 1, 2],
        succ_idx=[2, 1],
        sync_of=[0, 0, -1],
        groups=[[0, 1]],
        transfer=[[0, 0]],
    )
    with pytest.raises(DeadlockError) as ei:
        run(g)
    assert ei.value.waiting == [0]


def test_a_deadlock_names_only_the_blocked_groups_not_a_rooted_group_whose_members_all_ended() -> None:
    # group 0, rooted (member 0 waits for the root, member 1; the root for no one): seg 0 (compute) is
    # queued before its member 1 on its stream, and every member ends; group 1 deadlocks as in the test
    # above (seg 4 needs seg 5, which needs seg 3's group to end)
    g = _graph(
        ready0=[0] * 6,
        gap=[0] * 6,
        length=[5, SYNC, SYNC, SYNC, SYNC, 5],
        ndeps=[0, 0, 0, 0, 1, 1],
        succ_ptr=[0, 0, 0, 0, 1, 1, 2],
        succ_idx=[5, 4],
        sync_of=[-1, 0, 0, 1, 1, -1],
        groups=[[1, 2], [3, 4]],
        transfer=[[3, 0], [0, 0]],
        xsucc_ptr=[0, 1, 1, 1, 1, 1, 1],
        xsucc_idx=[1],
        group_xdeps=[1, 0],
        waits_for=[[1, 1], None],
    )
    with pytest.raises(DeadlockError) as ei:
        run(g)
    assert ei.value.waiting == [1]
    assert ei.value.stuck == [4, 5]


def _two_rank_run(tmp_path: Path, durs: tuple[int, int], steps: int = 1) -> Path:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        t = 0
        for s in range(steps):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=durs[r], start_ns=t + 1_000)
            arrive = t + 1_000 + durs[r]
            done = t + 1_000 + max(durs) + 50_000
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=done - arrive, start_ns=arrive)
            t = done
    return b.write(tmp_path / "run")


def test_unmodified_replay_reproduces_recorded_times_exactly(tmp_path: Path) -> None:
    rt = load_run(_two_rank_run(tmp_path, (2_000_000, 3_000_000), steps=3))
    res = simulate(rt)
    for r, trace in rt.ranks.items():
        assert np.array_equal(res.start_ns[r], trace.start_ns)
        assert np.array_equal(res.end_ns[r], trace.end_ns)


def test_a_late_rank_delays_every_member_of_the_collective(tmp_path: Path) -> None:
    rt = load_run(_two_rank_run(tmp_path, (2_000_000, 2_000_000)))
    base = simulate(rt)
    late = {1: np.where(rt.ranks[1].node_type == 4, 5_000_000, -1).astype(np.int64)}
    res = simulate(rt, dur_override=late)
    coll = 2  # rows: metadata, compute, all_reduce
    for r in (0, 1):
        assert res.end_ns[r][coll] - base.end_ns[r][coll] == 3_000_000
    assert int(res.coll_arrival_ns[0]) == res.start_ns[1][coll]


def test_gap_override_replaces_the_host_gap_before_a_node(tmp_path: Path) -> None:
    rt = load_run(_two_rank_run(tmp_path, (2_000_000, 2_000_000)))
    gaps = {0: np.array([-1, 500_000, 123_456], dtype=np.int64)}
    res = simulate(rt, gap_override=gaps)
    first_start = int(rt.ranks[0].start_ns[1:].min())  # the rank's t0: the first node's gap counts from it
    assert res.start_ns[0][1] == first_start + 500_000
    assert res.start_ns[0][2] == res.end_ns[0][1] + 123_456


def test_step_spans_and_step_time_follow_the_replayed_nodes(tmp_path: Path) -> None:
    rt = load_run(_two_rank_run(tmp_path, (1_000_000, 1_500_000), steps=2))
    res = simulate(rt)
    spans = res.step_spans()
    assert set(spans) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    # a step lasts from the previous step's completion (its latest end) to its own
    done0 = max(spans[(0, 0)][1], spans[(1, 0)][1])
    hi = max(spans[(0, 1)][1], spans[(1, 1)][1])
    assert res.step_time_ns(1) == hi - done0
    timed = {r: rt.ranks[r].node_type != 1 for r in rt.ranks}  # all but the METADATA node
    assert res.makespan_ns == max(int(a[timed[r]].max()) for r, a in res.end_ns.items()) - min(
        int(a[timed[r]].min()) for r, a in res.start_ns.items()
    )


def test_simulation_is_deterministic(tmp_path: Path) -> None:
    rt = load_run(_two_rank_run(tmp_path, (1_234_567, 2_345_678), steps=4))
    a, b = simulate(rt), simulate(rt)
    for r in rt.ranks:
        assert np.array_equal(a.start_ns[r], b.start_ns[r])
        assert np.array_equal(a.end_ns[r], b.end_ns[r])


def test_send_and_recv_pair_up_and_the_recv_waits_for_the_send(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    b.rank(0).compute("work", dur_ns=4_000_000, start_ns=0)
    b.rank(0).send(1, comm_bytes=MIB, dur_ns=100_000)
    b.rank(1).recv(0, comm_bytes=MIB, dur_ns=4_100_000, start_ns=0)
    b.rank(1).compute("after", dur_ns=10_000)
    rt = load_run(b.write(tmp_path / "run"))
    assert len(rt.p2p) == 1
    slow = {0: np.array([-1, 6_000_000, -1], dtype=np.int64)}
    res = simulate(rt, dur_override=slow)
    # recv completes at max(send start, recv start) + recorded transfer (100 us)
    assert res.end_ns[1][1] == 6_000_000 + 100_000
    assert res.start_ns[1][2] == res.end_ns[1][1]


def test_collectives_issued_in_crossed_order_deadlock_with_a_clear_error(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2, groups={"a": (0, 1), "b": (0, 1)})
    b.rank(0).collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=10_000, pg="a", start_ns=0)
    b.rank(0).collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=10_000, pg="b")
    b.rank(1).collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=10_000, pg="b", start_ns=0)
    b.rank(1).collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=10_000, pg="a")
    rt = load_run(b.write(tmp_path / "run"))
    with pytest.raises(ReplayError, match=r"the recorded order deadlocks .*group '[ab]' seq 0 waits for"):
        simulate(rt)


def test_an_async_collective_behind_two_running_ones_starts_its_transfer_when_the_first_ends(
    tmp_path: Path,
) -> None:
    # three async all_reduces on a gloo comm stream (two worker threads): the second runs beside the
    # first; the third, issued after the host op, waits for the first of them to end (the first, 5 ms)
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        first = rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=5_000_000, start_ns=0, stream=9)
        host = rb.compute("host", dur_ns=1_000_000, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=5_500_000, start_ns=500_000, stream=9)
        rb.collective(
            CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=7_000_000, start_ns=1_000_000, stream=9, deps=(host,)
        )
        assert first == 1
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt)
    for r in (0, 1):
        assert np.array_equal(res.start_ns[r], rt.ranks[r].start_ns)
        assert np.array_equal(res.end_ns[r], rt.ranks[r].end_ns)
    slower = simulate(rt, dur_override={0: np.array([-1, -1, 5_500_000, -1, -1], dtype=np.int64)})
    # the third now arrives at 5.5 ms on rank 0, after the first ended (5 ms): its recorded transfer
    # (8 ms - 5 ms) begins at once; behind the second (6 ms) it would have ended at 8 ms
    assert slower.start_ns[0][4] == 5_500_000
    assert slower.end_ns[0][4] == 5_500_000 + 3_000_000


def test_host_streams_that_never_overlap_replay_as_one_thread(tmp_path: Path) -> None:
    # operators recorded on stream 1 and the blocking collective on stream 0 of the same host thread,
    # with no recorded dependency between them: slowing the operator still delays the collective
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        rb.compute("aten::mm", dur_ns=2_000_000, start_ns=0, stream=1)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=100_000, start_ns=2_010_000, stream=0)
    rt = load_run(b.write(tmp_path / "run"))
    base = simulate(rt)
    slow = simulate(rt, dur_override={0: np.array([-1, 5_000_000, -1], dtype=np.int64)})
    assert np.array_equal(base.start_ns[0], rt.ranks[0].start_ns)
    assert slow.start_ns[0][2] == 5_010_000
    assert slow.end_ns[1][2] - base.end_ns[1][2] == 3_000_000


def test_a_host_thread_idle_until_an_async_collective_completes_is_taken_to_wait_for_it(
    tmp_path: Path,
) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        fwd = rb.compute("fwd", dur_ns=1_000_000, start_ns=0)
        rb.collective(
            CommType.ALL_REDUCE,
            comm_bytes=MIB,
            dur_ns=9_000_000,
            start_ns=1_000_000,
            stream=1000,
            deps=(fwd,),
        )
        rb.compute("bwd", dur_ns=1_000_000)  # host work overlapping the transfer, until 2 ms
        rb.compute("step", dur_ns=500_000, start_ns=10_050_000)  # idle 8 ms, resumes 50 us after completion
    rt = load_run(b.write(tmp_path / "run"))
    base = simulate(rt)
    assert np.array_equal(base.start_ns[1], rt.ranks[1].start_ns)
    late = simulate(rt, dur_override={1: np.array([-1, 4_000_000, -1, -1, -1], dtype=np.int64)})
    # rank 1 arrives 3 ms later, the all_reduce completes 3 ms later, and so does the waiting `step`
    assert late.end_ns[0][2] - base.end_ns[0][2] == 3_000_000
    assert late.start_ns[0][4] - base.start_ns[0][4] == 3_000_000


def test_recorded_gaps_are_the_gaps_the_simulator_uses(tmp_path: Path) -> None:
    from skewlens.replay.lower import recorded_gaps

    rt = load_run(_two_rank_run(tmp_path, (1_500_000, 2_500_000), steps=3))
    gaps = recorded_gaps(rt)
    assert set(gaps) == {0, 1}
    assert gaps[0][1] == 0 and gaps[1][1] == 0  # first nodes: at the rank's t0
    same = simulate(rt, gap_override=gaps)
    doubled = simulate(rt, gap_override={0: gaps[0] + 1_000})
    base = simulate(rt)
    for r in (0, 1):
        assert np.array_equal(same.start_ns[r], base.start_ns[r])
    assert doubled.start_ns[0][1] == base.start_ns[0][1] + 1_000


def test_a_run_without_step_marks_is_one_step_spanning_each_rank(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("a", dur_ns=1_000, start_ns=5_000 + r * 100)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=8, dur_ns=2_000 - r * 100)
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt)
    assert res.step_spans() == {(0, -1): (5_000, 8_000), (1, -1): (5_100, 8_000)}
    assert res.step_time_ns(-1) == 3_000
    assert res.makespan_ns == 3_000  # the METADATA node at t=0 does not count


def test_a_steps_span_takes_every_row_of_the_step_wherever_it_lies_among_the_ranks_rows() -> None:
    # a node of step 0 recorded after step 1's (a late callback): it still belongs to step 0's span
    def i64(*v: int) -> np.ndarray:
        return np.asarray(v, dtype=np.int64)

    res = SimResult(
        start_ns={0: i64(0, 10, 20, 5)},
        end_ns={0: i64(4, 15, 30, 8)},
        step={0: np.asarray([0, 1, 1, 0], dtype=np.int32)},
        timed={0: np.ones(4, dtype=np.bool_)},
        coll_arrival_ns=i64(),
        coll_end_ns=i64(),
        p2p_arrival_ns=i64(),
        p2p_end_ns=i64(),
        comm_mode="as_recorded",
    )
    assert res.step_spans() == {(0, 0): (0, 8), (0, 1): (10, 30)}


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> RunTrace:
    """A small imported GPU run: kernels launched from host ops, stream waits, nested nodes."""
    tmp = tmp_path_factory.mktemp("gpu")
    write_gpu_run(GpuRunSpec(world_size=4, steps=3, layers=4, slow_ranks={1: 1.3}, seed=0), tmp / "kineto")
    import_traces(sorted((tmp / "kineto").glob("*.json.gz")), None, tmp / "run")
    return load_run(tmp / "run")


def _assert_same_replay(a: SimResult, b: SimResult) -> None:
    for r in a.start_ns:
        assert np.array_equal(a.start_ns[r], b.start_ns[r]), f"start_ns of rank {r}"
        assert np.array_equal(a.end_ns[r], b.end_ns[r]), f"end_ns of rank {r}"
    for f in ("coll_arrival_ns", "coll_end_ns", "p2p_arrival_ns", "p2p_end_ns"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize(
    "effects",
    [
        NO_EFFECTS,
        SlowdownModel(
            [
                Slowdown(kind="compute", ranks=(2,), factor=1.5),
                Slowdown(kind="stall", ranks=(0,), step=1, delay_ns=100_000),
                Slowdown(kind="comm_delay", ranks=(1,), delay_ns=50_000),
            ]
        ),
    ],
    ids=["no effects", "slowdowns"],
)
def test_a_simulator_lowered_once_replays_each_rank_override_as_simulate_does(
    gpu_run: RunTrace, effects: Effects
) -> None:
    gaps = recorded_gaps(gpu_run)
    sim = Simulator(gpu_run, effects=effects)
    base = simulate(gpu_run, effects=effects)
    _assert_same_replay(sim.simulate(), base)
    rng = np.random.default_rng(0)
    for r, rt in sorted(gpu_run.ranks.items()):
        n = len(rt)
        dur = np.where(rng.random(n) < 0.5, (rt.dur_ns * 0.7).astype(np.int64), -1)
        gap = np.where(rng.random(n) < 0.5, gaps[r] // 2, -1)
        got = sim.simulate(dur_override={r: dur}, gap_override={r: gap})
        _assert_same_replay(
            got, simulate(gpu_run, effects=effects, dur_override={r: dur}, gap_override={r: gap})
        )
        assert not np.array_equal(got.end_ns[r], base.end_ns[r])  # the override did change the replay
    _assert_same_replay(sim.simulate(), base)  # what-ifs leave the shared lowering as it was


def test_a_what_if_that_fails_halfway_leaves_the_shared_lowering_as_it_was(gpu_run: RunTrace) -> None:
    from skewlens.replay.errors import ConfigError

    sim = Simulator(gpu_run)
    base = sim.simulate()
    (r0, rt0), (r1, _rt1) = sorted(gpu_run.ranks.items())[:2]
    halved = (rt0.dur_ns // 2).astype(np.int64)  # rank r0's values are written over the lowering's first
    with pytest.raises(ConfigError, match="expected"):
        sim.simulate(dur_override={r0: halved, r1: np.zeros(1, dtype=np.int64)})
    _assert_same_replay(sim.simulate(), base)
    _assert_same_replay(sim.simulate(dur_override={r0: halved}), simulate(gpu_run, dur_override={r0: halved}))
    _assert_same_replay(sim.simulate(), base)


def test_the_lowering_keeps_counts_and_ids_in_4_bytes_and_times_in_8_and_the_core_reads_either(
    gpu_run: RunTrace,
) -> None:

    from skewlens.replay.lower import _indices, _shared_ints

    sim = Simulator(gpu_run)
    g = sim._lowering.lowered.graph
    index_cols = ("ndeps", "succ_ptr", "succ_idx", "sync_of", "xsucc_ptr", "wsucc_ptr", "lsucc_ptr")
    time_cols = ("gap", "length", "lsucc_off")
    assert {c: getattr(g, c).itemsize for c in (*index_cols, "lsucc_idx")} == dict.fromkeys(
        (*index_cols, "lsucc_idx"), 4
    )
    assert {c: getattr(g, c).itemsize for c in time_cols} == dict.fromkeys(time_cols, 8)
    # ready0: a list whose equal times are one int object (the core's copy then holds no int per segment)
    assert isinstance(g.ready0, list) and len({id(v) for v in g.ready0}) == len(set(g.ready0))
    assert _shared_ints(np.zeros(0, dtype=np.int64)) == []
    assert _shared_ints(np.array([5, 5, 7, 5], dtype=np.int64)) == [5, 5, 7, 5]
    wide = dataclasses.replace(g, **{c: array("q", getattr(g, c)) for c in (*index_cols, "lsucc_idx")})
    a, b = run(g), run(wide)
    assert (a.seg_start, a.seg_end, a.group_end) == (b.seg_start, b.seg_end, b.group_end)
    # a value that needs more than 4 bytes keeps 8, and every value as it was
    big = _indices(np.array([0, -1, 2**31], dtype=np.int64))
    assert (big.itemsize, big.tolist()) == (8, [0, -1, 2**31])
    assert _indices(np.array([-(2**31), 2**31 - 1])).itemsize == 4


def test_a_cycle_of_chained_rows_stays_a_cycle_between_segments_so_the_core_reports_it() -> None:
    from skewlens.replay.core import DeadlockError, Graph, run
    from skewlens.replay.lower import KIND_COMPUTE, _segments

    # row 0 alone; rows 1 and 2 each wait only for the other: a chain that never reaches a head
    kind = np.full(3, KIND_COMPUTE, dtype=np.int8)
    dur = np.array([5, 7, 11], dtype=np.int64)
    gap = np.zeros(3, dtype=np.int64)
    edges = [np.array([1, 2], dtype=np.int64), np.array([2, 1], dtype=np.int64)]
    seg_of_row, _off, head_gap, length, ndeps, succ_ptr, succ_idx, heads, _pred, is_head = _segments(
        kind=kind, dur=dur, gap=gap, start_edges=edges, extra_src=(), extra_dst=()
    )
    assert edges == []  # taken over
    assert is_head.tolist() == [True, True, True] and heads.tolist() == [0, 1, 2]
    assert ndeps.tolist() == [0, 1, 1]
    assert [succ_idx[succ_ptr[s] : succ_ptr[s + 1]].tolist() for s in range(3)] == [[], [2], [1]]
    g = Graph(
        ready0=[0, 0, 0],
        gap=head_gap.tolist(),
        length=length.tolist(),
        ndeps=ndeps.tolist(),
        succ_ptr=succ_ptr.tolist(),
        succ_idx=succ_idx.tolist(),
        sync_of=[-1, -1, -1],
        groups=[],
        transfer=[],
    )
    with pytest.raises(DeadlockError) as e:
        run(g)
    assert sorted(e.value.stuck) == [1, 2]
    assert seg_of_row.tolist() == [0, 1, 2]


def test_the_segments_with_edges_are_read_from_the_csr_offsets_as_arrays_or_lists() -> None:
    offsets = [0, 0, 2, 2, 3]
    assert core_mod._with_edges(array("q", offsets), 4) == bytearray([0, 1, 0, 1])
    assert core_mod._with_edges(offsets, 4) == bytearray([0, 1, 0, 1])
    assert core_mod._with_edges([0] * 6, 5) == bytearray(5)


def test_a_run_without_step_marks_has_no_step_times_and_its_one_step_lasts_its_nodes_span(
    tmp_path: Path,
) -> None:
    # without step marks every node is in step -1, which step_times leaves out (it times marked steps,
    # as the analyses do), while step_time_ns(-1) still gives the span of the nodes
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).compute("setup", 5_000_000, start_ns=r * 1_000_000)
        b.rank(r).compute("fwd", 2_000_000)
    res = simulate(load_run(b.write(tmp_path / "run")))
    assert set(res.step_spans()) == {(0, -1), (1, -1)}
    assert (res.step_times(), res.step_time_ns(-1)) == ({}, 8_000_000)


def test_the_first_step_counts_from_its_own_earliest_start_not_from_a_later_steps_earlier_one() -> None:
    # rank 1 has no step 0 and began its step 1 at 20, before rank 0 began step 0 at 50: step 0 counts from
    # 50 (50 long), or from the window's start where one is given (10: 90 long); step 1 takes the 20 after,
    # and rank 0's step 2, which ends (115) before rank 1's step 1 does (120), takes 0
    spans = {(0, 0): (50, 100), (1, 1): (20, 120), (0, 2): (100, 115)}
    assert step_times_from_spans(spans) == {0: 50, 1: 20, 2: 0}
    assert step_times_from_spans(spans, 10) == {0: 90, 1: 20, 2: 0}
    # a window that began as recorded at 70, where the replay began step 0 at 50 (work before the window that
    # a what-if shortened): step 0 counts from 50, as without a window, not 30 long from 70
    assert step_times_from_spans(spans, 70) == {0: 50, 1: 20, 2: 0}


def test_every_replay_counts_the_first_step_from_the_earliest_recorded_start_of_that_step_over_ranks(
    tmp_path: Path,
) -> None:
    # rank 0 begins step 0 at 2 ms and rank 1 at 1 ms (its step 1's "c", on another thread, at 0.7 ms);
    # rank 2 has no step 0 and begins step 1 at 0.5 ms. The first step begins at 1 ms: rank 1's start of
    # step 0, not the first rank's (2 ms), nor any earlier start of a later step (0.7, 0.5 ms)
    ms = 1_000_000
    b = RunBuilder(world_size=3)
    b.rank(0).step(0).compute("a", 2 * ms, start_ns=2 * ms)
    b.rank(1).step(0).compute("b", 2 * ms, start_ns=ms)
    b.rank(1).step(1).compute("c", ms, start_ns=700_000, stream=1)
    b.rank(2).step(1).compute("d", 5 * ms, start_ns=500_000)
    run = load_run(b.write(tmp_path / "run"))
    res = simulate(run)
    assert res.steps_start_ns == ms
    assert res.step_times() == {0: 4 * ms - ms, 1: 5_500_000 - 4 * ms}
    # a 1 ms stall of rank 1 before step 0 starts "b" at 2 ms; step 0 still counts from 1 ms, not 2
    stalled = simulate(run, effects=SlowdownModel([Slowdown(kind="stall", ranks=(1,), step=0, delay_ns=ms)]))
    assert stalled.steps_start_ns == ms
    assert stalled.step_times()[0] == 4 * ms - ms


def test_a_metadata_node_labelled_with_the_first_step_does_not_move_where_that_step_begins(
    tmp_path: Path,
) -> None:
    # step 0 holds a metadata node at 0 (which the replay does not time) and "a" [1, 3) ms: the first step
    # begins at 1 ms, where its timed rows begin as step_spans gives them, so it takes 2 ms, not 3
    b = RunBuilder(world_size=1)
    rb = b.rank(0).step(0)
    rb._add("meta", NodeType.METADATA, dur_ns=100_000, start_ns=0, stream=0, deps=(), attrs={})
    rb.compute("a", 2_000_000, start_ns=1_000_000)
    res = simulate(load_run(b.write(tmp_path / "run")))
    assert res.step_spans() == {(0, 0): (1_000_000, 3_000_000)}
    assert (res.steps_start_ns, res.step_times()) == (1_000_000, {0: 2_000_000})
