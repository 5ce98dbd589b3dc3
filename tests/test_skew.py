"""Collective skew: late rank, per-member wait, blamed rank and cause, on synthetic runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_analysis_scenarios import MS, Scenario, build_eager_send, build_run

from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.index import build_index
from skewlens.analysis.records import CauseKind, CollectiveSkewRecord
from skewlens.analysis.skew import Cause, SkewEvent, SkewResult, analyze_skew
from skewlens.profiler.importers import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.schema import read_table, write_records
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run

STRAGGLER = Scenario(straggler_rank=2, straggler_ns=40 * MS)
SLOW_SEND = Scenario(slow_send_rank=0, slow_send_ns=25 * MS)


def _skew(tmp: Path, sc: Scenario) -> SkewResult:
    return analyze_skew(build_index(load_run(build_run(tmp, sc))))


@pytest.fixture(scope="module")
def straggler_skew(tmp_path_factory: pytest.TempPathFactory) -> SkewResult:
    return _skew(tmp_path_factory.mktemp("straggler"), STRAGGLER)


@pytest.fixture(scope="module")
def slow_send_skew(tmp_path_factory: pytest.TempPathFactory) -> SkewResult:
    return _skew(tmp_path_factory.mktemp("slow_send"), SLOW_SEND)


def test_late_rank_is_blamed_for_the_wait_it_causes(straggler_skew: SkewResult) -> None:
    ag = [e for e in straggler_skew.events if e.pg_name == "tp1"]
    assert len(ag) == STRAGGLER.steps
    for e in ag:
        assert e.late_rank == STRAGGLER.straggler_rank
        assert e.blamed_rank == STRAGGLER.straggler_rank
        waits = dict(zip(e.ranks, e.wait_ns.tolist(), strict=True))
        assert waits[STRAGGLER.straggler_rank] == 0
        # the peer waits the extra compute, give or take the scenario's per-step jitter
        assert waits[3] == pytest.approx(STRAGGLER.straggler_ns, abs=2 * STRAGGLER.jitter_ns)


def test_compute_cause_names_the_op_that_grew(straggler_skew: SkewResult) -> None:
    e = next(e for e in straggler_skew.events if e.pg_name == "tp1")
    assert e.cause.kind is CauseKind.COMPUTE
    assert e.cause.op == "aten::mm"
    assert e.cause.delta_ns == pytest.approx(STRAGGLER.straggler_ns, abs=2 * STRAGGLER.jitter_ns)
    assert "aten::mm" in e.cause.text


def test_lateness_passed_on_through_an_earlier_wait_is_blamed_on_its_origin(
    straggler_skew: SkewResult,
) -> None:
    world = [e for e in straggler_skew.events if e.kind == "collective" and e.pg_name == "0"]
    assert len(world) == STRAGGLER.steps
    for e in world:
        # ranks 2 and 3 both arrive late at the all_reduce; whoever is last, rank 2 is to blame
        assert e.late_rank in (2, 3)
        assert e.blamed_rank == STRAGGLER.straggler_rank
        waits = dict(zip(e.ranks, e.wait_ns.tolist(), strict=True))
        assert waits[0] > 30 * MS and waits[1] > 30 * MS


def test_every_step_names_the_straggler_as_top(straggler_skew: SkewResult) -> None:
    tops = straggler_skew.top_straggler_by_step()
    assert sorted(tops) == list(range(STRAGGLER.steps))
    assert set(tops.values()) == {STRAGGLER.straggler_rank}
    assert straggler_skew.top_cause_in()[2].kind is CauseKind.COMPUTE
    assert straggler_skew.top_cause_in()[2].op == "aten::mm"


def test_recv_waiting_for_a_late_send_blames_the_sender_with_a_late_send(slow_send_skew: SkewResult) -> None:
    p2p = [e for e in slow_send_skew.events if e.kind == "p2p" and e.ranks == (0, 1)]
    assert len(p2p) == SLOW_SEND.steps
    for e in p2p:
        assert e.late_rank == 0
        assert e.blamed_rank == 0
        assert e.cause.kind is CauseKind.LATE_SEND
        assert e.cause.delta_ns == SLOW_SEND.slow_send_ns
        assert int(e.wait_ns[1]) == SLOW_SEND.slow_send_ns  # the recv side waited the whole sleep
    assert slow_send_skew.top_cause_in()[0].kind is CauseKind.LATE_SEND


def test_collective_after_a_slow_send_reports_the_send_not_compute(slow_send_skew: SkewResult) -> None:
    world = [e for e in slow_send_skew.events if e.kind == "collective" and e.pg_name == "0"]
    late0 = [e for e in world if e.blamed_rank == 0 and e.total_wait_ns > 10 * MS]
    assert late0, "rank 0's sleep before its send should make it late at the all_reduce"
    assert all(e.cause.kind is CauseKind.LATE_SEND for e in late0)


def test_skew_table_round_trips_through_parquet(straggler_skew: SkewResult, tmp_path: Path) -> None:
    recs = straggler_skew.records()
    n_members = sum(len(e.ranks) for e in straggler_skew.events)
    assert len(recs) == n_members
    p = write_records(CollectiveSkewRecord, recs, tmp_path / "collective_skew.parquet", "collective_skew")
    tbl = read_table(p, CollectiveSkewRecord)
    assert tbl.num_rows == n_members
    waits = tbl.column("wait_ns").to_pylist()
    assert sum(waits) == sum(r.wait_ns for r in recs)
    assert set(tbl.column("cause_kind").to_pylist()) >= {"compute"}


def test_a_compute_cause_names_backward_ops_by_function_and_skips_growth_rounding_to_zero() -> None:
    from skewlens.analysis.skew import Cause

    ops = (
        ("autograd::engine::evaluate_function: AddmmBackward0", 2_000_000),
        ("aten::mm", 300_000),
        ("aten::slice", 20_000),
    )
    cause = Cause(kind=CauseKind.COMPUTE, delta_ns=2_320_000, op=ops[0][0], ops=ops)
    assert cause.text == "compute grew: AddmmBackward0 +2.0 ms, aten::mm +0.3 ms"
    kernels = (
        ("void at::native::vectorized_elementwise_kernel<4, at::native::Fill<float> >(int, float*)", 900_000),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 800_000),
        ("torch::autograd::CppNode<SplitLookupFunction_sgd_Op>", 700_000),
    )
    cause = Cause(kind=CauseKind.COMPUTE, delta_ns=2_400_000, op=kernels[0][0], ops=kernels)
    assert cause.text == (
        "compute grew: at::native::vectorized_elementwise_kernel +0.9 ms, "
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL +0.8 ms, "
        "torch::autograd::CppNode<SplitLookupFunction_sgd_Op> +0.7 ms"
    )
    spread = Cause(kind=CauseKind.COMPUTE, delta_ns=120_000, op="aten::slice", ops=ops[2:])
    assert spread.text == "compute grew: +0.1 ms"  # no op named at +0.0 ms: the whole growth


def test_a_compute_cause_names_a_dataloaders_scope_whole_not_cut_at_its_parenthesis() -> None:
    from skewlens.analysis.skew import Cause

    # torch's profiler's DataLoader __next__ (workers 0, then 2), and a Python function's event in a Kineto
    # trace recorded with with_stack (skewlens import); before: "enumerate +1.0 ms", "train.py +1.0 ms"
    for name in (
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        "train.py(42): load",
    ):
        cause = Cause(kind=CauseKind.COMPUTE, delta_ns=1_000_000, op=name, ops=((name, 1_000_000),))
        assert cause.text == f"compute grew: {name} +1.0 ms"


def test_a_cause_is_a_stalled_scope_from_half_its_growth_and_only_past_the_median_members_time() -> None:
    # a DataLoader's scope grew 1 ms of the cause's 2 ms: exactly half is enough; of 2 ms and 1 ns, not
    name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

    def cause(delta_ns: int, median_ns: int, kind: CauseKind = CauseKind.COMPUTE) -> Cause:
        return Cause(kind=kind, delta_ns=delta_ns, op=name, ops=((name, 1_000_000),), op_median_ns=median_ns)

    assert cause(2_000_000, 0).stalled_scope
    assert not cause(2_000_001, 0).stalled_scope
    # grown by more than it took on the median member (999,999 ns), a stall; by as much (1 ms), no more than
    # a slower rank's
    assert cause(2_000_000, 999_999).stalled_scope
    assert not cause(2_000_000, 1_000_000).stalled_scope
    # a cause of another kind carrying the op is none
    assert not cause(2_000_000, 0, CauseKind.HOST_GAP).stalled_scope


def test_a_compute_cause_keeps_a_note_in_parentheses_after_a_space_and_cuts_a_signature() -> None:
    from skewlens.analysis.skew import Cause

    # FSDP2's scopes name their module after a space (a torchtitan-style 2x2 mesh at ops: rank 1's cause read
    # "FSDP::all_gather  +1.8 ms", which layer's all-gather lost), as Kineto names a copy's direction
    for name in (
        "FSDP::all_gather (layers.0)",
        "FSDP::post_backward_reduce (layers.1)",
        "FSDP::post_backward_rs_wait ()",
        "Memcpy HtoD (Pageable -> Device)",
    ):
        cause = Cause(kind=CauseKind.COMPUTE, delta_ns=1_000_000, op=name, ops=((name, 1_000_000),))
        assert cause.text == f"compute grew: {name} +1.0 ms"
    # a kernel's signature, opened right after its name, is still cut
    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    cause = Cause(kind=CauseKind.COMPUTE, delta_ns=1_000_000, op=kernel, ops=((kernel, 1_000_000),))
    assert cause.text == "compute grew: ncclDevKernel_AllReduce_Sum_f32_RING_LL +1.0 ms"


def test_a_ranks_top_cause_gives_each_op_its_mean_growth_over_the_events_that_named_it() -> None:
    # the tp capture said "aten::mm +25.5 ms" where each event said +40: the sum over the three events with
    # exposed wait was divided by all five events blamed on the rank

    from skewlens.analysis.skew import Cause, _summarise

    def event(seq: int, exposed_ms: int, grew_ms: int) -> SkewEvent:
        ops = (("aten::mm", grew_ms * MS),) if exposed_ms else ()
        cause = Cause(kind=CauseKind.COMPUTE, delta_ns=grew_ms * MS, op="aten::mm", ops=ops)
        return _late_rank_1_event(seq, "all_reduce", late_ms=grew_ms, exposed_ms=exposed_ms, cause=cause)

    res = _summarise([event(0, 40, 40), event(1, 40, 42), event(2, 40, 38), event(3, 0, 40), event(4, 0, 40)])
    cause = res.top_cause_in()[1]
    assert cause.ops == (("aten::mm", 40 * MS),)


def test_a_cause_names_an_op_once_where_the_autograd_engine_and_its_node_both_grew() -> None:
    # a torchtitan-style 2x2 mesh at ops, rank 1 sleeping in each checkpointed block's forward: its
    # recomputation lies inside the engine's "evaluate_function: MmBackward0", and the cause read
    # "MmBackward0 +34.4 ms, RedistributeBackward +2.6 ms, MmBackward0 +1.4 ms"
    import numpy as np

    from skewlens.analysis.skew import Cause, _grown_ops, _summarise, _Window
    from skewlens.profiler.autograd import ENGINE_NODE_PREFIX

    engine = f"{ENGINE_NODE_PREFIX}MmBackward0"
    names = [engine, "RedistributeBackward", "MmBackward0", "aten::mm", "aten::add"]

    def window(*ms: float) -> _Window:
        by_name = np.array([int(m * MS) for m in ms], dtype=np.int64)
        total = int(by_name.sum())
        return _Window(
            compute_ns=total, host_gap_ns=0, send_gap_ns=0, wait_ns=0, max_wait_row=-1, by_name=by_name
        )

    on_host = np.zeros(len(names), dtype=bool)
    ops, was, on_gpu = _grown_ops(
        window(34.5, 2.6, 1.5, 1.2, 1.0), window(0.1, 0.0, 0.1, 0.0, 0.0), names, on_host
    )
    assert not on_gpu
    grown = [(names[0], 35.8), ("RedistributeBackward", 2.6), ("aten::mm", 1.2)]
    assert ops == tuple((n, int(ms * MS)) for n, ms in grown)
    assert was == int(0.2 * MS)  # both names' time on the median member
    cause = Cause(kind=CauseKind.COMPUTE, delta_ns=int(40 * MS), op=ops[0][0], ops=ops)
    assert cause.text == "compute grew: MmBackward0 +35.8 ms, RedistributeBackward +2.6 ms, aten::mm +1.2 ms"

    # a rank's top cause over events that named the op by either name: one label, its mean growth
    def event(seq: int, name: str) -> SkewEvent:
        c = Cause(kind=CauseKind.COMPUTE, delta_ns=30 * MS, op=name, ops=((name, 30 * MS),))
        return _late_rank_1_event(seq, "all_reduce", late_ms=30, exposed_ms=30, cause=c)

    top = _summarise([event(0, names[0]), event(1, "MmBackward0")]).top_cause_in()[1]
    assert [(Cause(kind=CauseKind.COMPUTE, delta_ns=1, ops=(o,)).text, o[1]) for o in top.ops] == [
        ("compute grew: MmBackward0 +30.0 ms", 30 * MS)
    ]


def test_a_ranks_top_cause_names_an_op_two_events_read_alike_by_the_name_whose_growth_weighs_most() -> None:
    # one event's cause grew the node (10 ms), a later one's the engine's evaluate_function around it
    # (30 ms), each with 30 ms of wait: one label, named (blame.parquet's cause_op) by the engine's name,
    # whose growth times wait is the larger, with the mean growth (30 x 10 + 30 x 30) / 60 = 20 ms
    from skewlens.analysis.skew import Cause, _summarise
    from skewlens.profiler.autograd import ENGINE_NODE_PREFIX

    def event(seq: int, name: str, grew_ms: int) -> SkewEvent:
        c = Cause(kind=CauseKind.COMPUTE, delta_ns=grew_ms * MS, op=name, ops=((name, grew_ms * MS),))
        return _late_rank_1_event(seq, "all_reduce", late_ms=30, exposed_ms=30, cause=c)

    engine = f"{ENGINE_NODE_PREFIX}MmBackward0"
    top = _summarise([event(0, "MmBackward0", 10), event(1, engine, 30)]).top_cause_in()[1]
    assert (top.op, top.ops) == (engine, ((engine, 20 * MS),))


def test_a_ranks_top_cause_is_of_the_wait_it_caused_with_a_known_cause_and_clocks_that_agree() -> None:
    # rank 1 caused 10 ms of wait by compute, 40 ms at a collective whose clocks contradict each other and
    # 50 ms of no measurable cause: its top cause is the compute; a late arrival that made no one wait
    # (0 ms exposed) is no cause at all
    from dataclasses import replace

    from skewlens.analysis.skew import _summarise

    def event(seq: int, kind: CauseKind, exposed_ms: int) -> SkewEvent:
        cause = Cause(kind=kind, delta_ns=(seq + 1) * MS)
        return _late_rank_1_event(seq, "all_reduce", late_ms=60, exposed_ms=exposed_ms, cause=cause)

    contradicted = replace(event(1, CauseKind.HOST_GAP, 40), clock_contradicted=True)
    res = _summarise([event(0, CauseKind.COMPUTE, 10), contradicted, event(2, CauseKind.NONE, 50)])
    top = res.top_cause_in()
    assert list(top) == [1] and (top[1].kind, top[1].delta_ns) == (CauseKind.COMPUTE, 1 * MS)
    assert _summarise([event(3, CauseKind.LATE_SEND, 0)]).top_cause_in() == {}


def test_compute_begun_before_the_late_members_window_is_named_in_its_cause(tmp_path: Path) -> None:
    # rank 1's matmul starts beside an asynchronous all_reduce and runs on long after it: the next
    # all_reduce's window opens when the first ends, with the matmul already running (the cause read
    # "compute grew: +40.0 ms", naming no op)
    from skewlens.analysis.api import analyze_run
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r, mm_ms in ((0, 2), (1, 42)):
        rb = b.rank(r).step(0)
        lin = rb.compute("aten::linear", 5 * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, MS, start_ns=5 * MS, stream=7, deps=(lin,))
        rb.compute("aten::mm", mm_ms * MS, start_ns=5 * MS)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, (42 - mm_ms) * MS + MS, start_ns=(5 + mm_ms) * MS)
    res = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    (second,) = [e for e in res.skew.events if e.seq == 1]
    assert second.late_rank == 1
    assert second.cause.op == "aten::mm" and second.cause.ops[0][1] == pytest.approx(40 * MS, rel=0.01)


def _four_recvs_at_once(tmp: Path) -> SkewResult:
    """Rank 0 posts four recvs at 0 ms (one stream each) while computing 10 ms; rank 1 computes 40 ms and
    then sends at 40, 41, 42 and 43 ms: rank 0 waits 40-43 ms at four recvs at once."""
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    r0.compute("aten::add", 10 * MS, start_ns=0)
    r1.compute("aten::mm", 40 * MS, start_ns=0)
    for k in range(4):
        r1.send(0, 4096, MS, tag=k, start_ns=(40 + k) * MS)
        r0.recv(1, 4096, (41 + k) * MS, tag=k, start_ns=0, stream=1 + k)
    return analyze_skew(build_index(load_run(b.write(tmp / "run"))))


def test_waits_that_overlap_on_one_rank_are_counted_once_in_the_wait_a_rank_caused(tmp_path: Path) -> None:
    # rank 0's p2p waits on gpipe overlapped (four recvs of ~40 ms at once) and were summed: rank 1 was
    # charged 1,608.51 ms of caused wait where rank 0's ten steps lasted 563.94 ms
    skew = _four_recvs_at_once(tmp_path)
    p2p = [e for e in skew.events if e.kind == "p2p"]
    assert [e.blamed_rank for e in p2p] == [1, 1, 1, 1]
    # each event still says what its own member waited (less the 10 ms of compute under it)
    assert sorted(int(e.exposed_wait_ns[1]) for e in p2p) == [30 * MS, 31 * MS, 32 * MS, 33 * MS]
    # rank 0 waited from 0 to 43 ms, 10 ms of it under its own compute: 33 ms, not 30 + 31 + 32 + 33
    assert skew.caused_wait_ns == {1: 33 * MS}
    assert skew.caused_wait_by_step == {(1, 0): 33 * MS}
    assert skew.top_straggler_by_step() == {0: 1}


def test_a_rank_is_never_said_to_have_passed_its_lateness_on_to_itself(
    tmp_path: Path, straggler_skew: SkewResult
) -> None:
    # gpipe: "compute grew: aten::mm +37.7 ms (passed on by rank 1)" where rank 1 was both late and blamed
    # (31 of 80 events): its later sends' windows began where its own late first send did
    skew = _four_recvs_at_once(tmp_path)
    p2p = [e for e in skew.events if e.kind == "p2p"]
    assert [e.cause.text for e in p2p] == ["compute grew: aten::mm +40.0 ms"] * 4
    assert [(e.late_rank, e.blamed_rank, e.cause.passed_on) for e in p2p] == [
        (1, 1, False),
        (1, 1, True),
        (1, 1, True),
        (1, 1, True),
    ]
    # lateness another rank passed on still says so: rank 3 late at the all_reduce for rank 2's compute
    world = [e for e in straggler_skew.events if e.pg_name == "0" and e.blamed_rank != e.late_rank]
    assert world and all(e.cause.text.endswith(f"(passed on by rank {e.late_rank})") for e in world)


def test_a_ranks_top_cause_amount_is_the_growth_before_one_event_weighted_by_the_wait_it_caused() -> None:
    # mixed: the table said "compute +5.1 ms" where each all_to_all that made rank 0 wait said +15.1: the
    # growth was a plain mean over every event naming it, and trivial events of no wait diluted it

    from skewlens.analysis.skew import Cause, _summarise

    def event(seq: int, exposed_ms: int, ops: tuple[tuple[str, int], ...]) -> SkewEvent:
        grew = sum(d for _n, d in ops)
        cause = Cause(kind=CauseKind.COMPUTE, delta_ns=grew, op=ops[0][0], ops=ops)
        return _late_rank_1_event(seq, "all_to_all", late_ms=exposed_ms, exposed_ms=exposed_ms, cause=cause)

    res = _summarise(
        [
            event(0, 8, (("aten::mm", 20 * MS),)),
            event(1, 1, (("aten::mm", 2 * MS), ("aten::add", 1 * MS))),
            event(2, 1, (("aten::mm", 2 * MS),)),
        ]
    )
    cause = res.top_cause_in()[1]
    # aten::mm: (20 * 8 + 2 * 1 + 2 * 1) / 10; aten::add: named by one event only, its growth there
    assert cause.ops == (("aten::mm", 16_400_000), ("aten::add", 1 * MS))
    assert cause.delta_ns == (20 * 8 + 3 * 1 + 2 * 1) * MS // 10
    assert cause.text == "compute grew: aten::mm +16.4 ms, aten::add +1.0 ms"


def _late_rank_1_event(seq: int, comm_type: str, *, late_ms: int, exposed_ms: int, cause: Cause) -> SkewEvent:
    """A 2-rank collective of step ``seq`` that rank 1 reached ``late_ms`` after rank 0, whose wait was
    ``exposed_ms`` exposed, blamed on rank 1 for ``cause``."""
    import numpy as np

    return SkewEvent(
        kind="collective",
        pg_name="0",
        seq=seq,
        comm_type=comm_type,
        step=seq,
        ranks=(0, 1),
        rows=(seq, seq),
        node_ids=(seq, seq),
        comm_bytes=np.array([1024, 1024]),
        arrival_ns=np.array([0, late_ms * MS]),
        end_ns=np.array([late_ms * MS + 1, late_ms * MS + 1]),
        wait_ns=np.array([late_ms * MS, 0]),
        exposed_wait_ns=np.array([exposed_ms * MS, 0]),
        late_rank=1,
        blamed_rank=1,
        late_by_ns=late_ms * MS,
        cause=cause,
    )


def test_the_wait_a_rank_caused_never_counts_its_own_wait(tmp_path: Path) -> None:
    # rank 2 is 20 ms late at a pair all_reduce with rank 1; rank 1's lateness at the next all-rank
    # all_reduce is passed on to rank 2, which itself waits 1 ms there for rank 1: that 1 ms is rank 2's own
    # wait, not a wait it made a peer suffer
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=4, groups={"pair": (1, 2)})
    ranks = {r: b.rank(r).step(0) for r in range(4)}
    ranks[2].compute("aten::mm", 20 * MS, start_ns=0)
    ranks[2].collective(CommType.ALL_REDUCE, 4096, MS, start_ns=20 * MS, pg="pair")
    ranks[1].collective(CommType.ALL_REDUCE, 4096, 21 * MS, start_ns=0, pg="pair")
    for r, (at_ms, last_ms) in {0: (5, 23), 3: (5, 23), 2: (22, 23), 1: (23, 23)}.items():
        ranks[r].collective(CommType.ALL_REDUCE, 4096, (last_ms + 1 - at_ms) * MS, start_ns=at_ms * MS)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (pair,) = [e for e in skew.events if e.pg_name == "pair"]
    (whole,) = [e for e in skew.events if e.pg_name != "pair"]
    assert (pair.blamed_rank, whole.late_rank, whole.blamed_rank) == (2, 1, 2)
    # rank 1 waited 20 ms at the pair, ranks 0 and 3 18 ms each at the whole group; rank 2's 1 ms is not in
    assert skew.caused_wait_ns == {2: (20 + 18 + 18) * MS}


def test_a_wait_begun_before_the_late_members_window_passes_its_lateness_on_and_one_still_pending_does_not(
    tmp_path: Path,
) -> None:
    # a halo exchange: rank 0 posts its recv from rank 2 (30 ms late: compute) at 0, then exchanges with rank
    # 1 at 0.1 ms (their last common synchronisation, the start of rank 0's window), still waiting for rank
    # 2 until 30.1 ms, and arrives at the row group's all_reduce 30 ms after rank 1. The wait that made it
    # late began before its window: before, only waits begun inside counted, so the lateness was passed on
    # from the exchange with rank 1 and rank 0 blamed for its own wait ("earlier wait +29.8 ms (caused by
    # rank 0)"; on 4 gloo ranks of a 2x2 stencil with rank 2 sleeping 30 ms, rank 1's 29.9 ms at an FFT
    # all_to_all with rank 0)
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=3, groups={"0": (0, 1, 2), "row": (0, 1)})
    r0, r1, r2 = (b.rank(r).step(0) for r in range(3))
    r2.compute("aten::mm", 30 * MS, start_ns=0)
    r2.send(0, 256, MS // 10, start_ns=30 * MS)
    r0.recv(2, 256, 30 * MS + MS // 10, start_ns=0, stream=1)
    r0.send(1, 256, MS // 10, start_ns=MS // 10)
    r1.recv(0, 256, MS // 5, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=31 * MS, pg="row")
    r1.collective(CommType.ALL_REDUCE, 4096, 30 * MS + MS // 2, start_ns=MS, pg="row")
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (row,) = [e for e in skew.events if e.pg_name == "row"]
    (pair,) = [e for e in skew.events if e.kind == "p2p" and e.ranks == (0, 1)]
    # rank 0 was 0.1 ms late to its send to rank 1 while its recv from rank 2 was pending, a wait that went
    # on past that send: it did not hold rank 0 back. Before, it was the cause, "earlier wait +0.1 ms (caused
    # by rank 0)", rank 2 not yet blamed for it when the pair (last arrival 0.1 ms) was
    assert (pair.late_rank, pair.blamed_rank, pair.cause.kind) == (0, 0, CauseKind.NONE)
    assert (row.late_rank, row.blamed_rank) == (0, 2)
    assert row.cause.text == "compute grew: aten::mm +30.0 ms (passed on by rank 0)"
    # rank 0's 30 ms at its recv and rank 1's 30 ms at the all_reduce, both rank 2's
    assert skew.caused_wait_ns[2] == 60 * MS


def test_the_earlier_wait_passed_on_is_the_one_that_filled_the_window_not_one_still_pending_past_arrival(
    tmp_path: Path,
) -> None:
    # rank 0 waits for its recv from rank 3 (30 ms late: compute) over [0, 30.1) ms, then posts its recv from
    # rank 2 (100 ms late) at 30.2 ms and arrives at the row group's all_reduce at 31 ms, 30 ms after rank 1.
    # Of its window [0, 31) ms the first wait fills 30.1 ms and the second 0.8 ms (it goes on to 100 ms):
    # the lateness is rank 3's, whose event was blamed; the second wait's event comes later
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "row": (0, 1)})
    r0, r1, r2, r3 = (b.rank(r).step(0) for r in range(4))
    r3.compute("aten::mm", 30 * MS, start_ns=0)
    r3.send(0, 256, MS // 10, start_ns=30 * MS)
    r2.compute("aten::add", 100 * MS, start_ns=0)
    r2.send(0, 256, MS // 10, start_ns=100 * MS)
    r0.recv(3, 256, 30 * MS + MS // 10, start_ns=0)
    r0.recv(2, 256, 70 * MS - MS // 10, start_ns=30 * MS + MS // 5, stream=1)
    r0.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=31 * MS, pg="row")
    r1.collective(CommType.ALL_REDUCE, 4096, 30 * MS + MS // 2, start_ns=MS, pg="row")
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (row,) = [e for e in skew.events if e.pg_name == "row"]
    assert (row.late_rank, row.blamed_rank) == (0, 3)
    assert row.cause.text == "compute grew: aten::mm +30.0 ms (passed on by rank 0)"


def test_a_wait_begun_long_before_the_window_counts_only_its_part_inside_it(tmp_path: Path) -> None:
    # rank 0's recv from rank 2 (41 ms late) runs [0, 41.1) ms and its recv from rank 3 (70 ms late)
    # [40.1, 70.1) ms; the row group's all_reduce completed at 40 ms, where rank 0's window at the next one
    # (arrival 71 ms) starts. Inside [40, 71) ms the first wait fills 1.1 ms, the second 30 ms: rank 3 made
    # rank 0 late, though the first wait lasted 41.1 ms in all
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "row": (0, 1)})
    r0, r1, r2, r3 = (b.rank(r).step(0) for r in range(4))
    r2.compute("aten::add", 41 * MS, start_ns=0)
    r2.send(0, 256, MS // 10, start_ns=41 * MS)
    r3.compute("aten::mm", 70 * MS, start_ns=0)
    r3.send(0, 256, MS // 10, start_ns=70 * MS)
    r0.recv(2, 256, 41 * MS + MS // 10, start_ns=0, stream=1)
    for r in (r0, r1):
        r.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=39 * MS, pg="row")
    r0.recv(3, 256, 30 * MS, start_ns=40 * MS + MS // 10)
    r0.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=71 * MS, pg="row")
    r1.collective(CommType.ALL_REDUCE, 4096, 30 * MS + MS // 2, start_ns=41 * MS, pg="row")
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (_, second) = [e for e in skew.events if e.pg_name == "row"]
    assert (second.late_rank, second.blamed_rank) == (0, 3)
    # the pair 3 -> 0's cause: rank 3's window [0, 70) ms at it holds its 70 ms aten::mm, rank 0's none
    assert second.cause.text == "compute grew: aten::mm +70.0 ms (passed on by rank 0)"


def test_a_pairs_late_sender_whose_window_starts_at_its_own_late_pair_is_late_for_what_made_that_late(
    tmp_path: Path,
) -> None:
    # rank 2 idles 30 ms, then sends its halo to rank 0 and then to rank 3, which have waited since 0. Its
    # window at the second pair starts where its first pair completed, 30.1 ms after rank 3's: lateness that
    # pair hands on. Before, a pair's window start was no row to pass it on from, and the second read
    # "earlier wait +30.1 ms (caused by rank 2)", rank 2's own
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=4)
    r0, _r1, r2, r3 = (b.rank(r).step(0) for r in range(4))
    r2.compute("aten::add", MS // 10, start_ns=0)
    r2.send(0, 256, MS // 10, start_ns=30 * MS)
    r2.send(3, 256, MS // 10, start_ns=30 * MS + MS // 5)
    r0.recv(2, 256, 30 * MS + MS // 10, start_ns=0)
    r3.recv(2, 256, 30 * MS + 3 * MS // 10, start_ns=0)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(e.ranks, e.blamed_rank, e.cause.text) for e in skew.events] == [
        ((2, 0), 2, "late send: host gap +29.9 ms before the send"),
        ((2, 3), 2, "late send: host gap +29.9 ms before the send"),
    ]


def test_a_pairs_late_receiver_whose_window_starts_at_its_last_wait_passes_on_what_made_that_late(
    tmp_path: Path,
) -> None:
    # rank 0 waits for its recv from rank 2 (30 ms late: compute) until 30.1 ms, sorts 0.2 ms, then posts
    # its recv from rank 1, which sent at 1 ms. Rank 0's window at that pair, [30.1, 30.3) ms, starts where
    # its recv from rank 2 completed and holds no wait (only the sort): the lateness is that recv's, rank 2's
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=3)
    r0, r1, r2 = (b.rank(r).step(0) for r in range(3))
    r2.compute("aten::mm", 30 * MS, start_ns=0)
    r2.send(0, 256, MS // 10, start_ns=30 * MS)
    r0.recv(2, 256, 30 * MS + MS // 10, start_ns=0)
    r0.compute("aten::sort", MS // 5, start_ns=30 * MS + MS // 10)
    r0.recv(1, 256, MS // 10, start_ns=30 * MS + 3 * MS // 10)
    r1.send(0, 256, 29 * MS + 4 * MS // 10, start_ns=MS)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (pair,) = [e for e in skew.events if e.ranks == (1, 0)]
    assert (pair.late_rank, pair.blamed_rank) == (0, 2)
    assert pair.cause.text == "compute grew: aten::mm +30.0 ms (passed on by rank 0)"


def test_each_members_window_at_a_collective_starts_at_its_own_end_of_the_groups_previous_instance(
    tmp_path: Path,
) -> None:
    # a broadcast whose root (rank 0) completed at 0.2 ms, before rank 1 arrived at 5 ms (no synchronisation
    # of the two), then an all_reduce: rank 0 arrives at 40 ms, rank 1 at 6 ms. Each window starts where the
    # member completed the broadcast: rank 0 idled 39.8 ms of [0.2, 40), rank 1 0.9 of [5.1, 6), so rank 0's
    # host gap grew 38.9 ms (starting both at 0.2 ms, rank 1's 4.8 ms before its broadcast would count)
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    r0, r1 = (b.rank(r).step(0) for r in range(2))
    for rb in (r0, r1):
        rb.compute("aten::mm", MS // 10, start_ns=0)
    r0.collective(CommType.BROADCAST, 4096, MS // 10, start_ns=MS // 10, root=0)
    r1.collective(CommType.BROADCAST, 4096, MS // 10, start_ns=5 * MS, root=0)
    r0.collective(CommType.ALL_REDUCE, 4096, MS // 2, start_ns=40 * MS)
    r1.collective(CommType.ALL_REDUCE, 4096, 34 * MS + MS // 2, start_ns=6 * MS)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (_, all_reduce) = skew.events
    assert (all_reduce.late_rank, all_reduce.blamed_rank) == (0, 0)
    place = "after c10d::broadcast_, before c10d::all_reduce_"
    assert all_reduce.cause.text == f"host idle/gap +38.9 ms ({place})"


def test_a_member_that_began_its_first_step_late_is_idle_not_said_to_have_waited(tmp_path: Path) -> None:
    # the first all_reduce of a GPU run has no earlier synchronisation point: each member's window is its
    # step, and the late member began its step ~2 ms after the median one (a seeded start delay) without
    # waiting anywhere; it used to read "earlier wait +2.1 ms (caused by rank 1)", blaming itself
    spec = GpuRunSpec(world_size=4, steps=1, layers=2, start_skew_ns=5 * MS, kernel_jitter=0.0, seed=0)
    write_gpu_run(spec, tmp_path / "kineto")
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    first = analyze_skew(build_index(load_run(tmp_path / "run"))).events[0]
    assert first.late_rank == first.blamed_rank == 1
    assert first.late_by_ns > 2 * MS
    assert first.cause.kind is CauseKind.HOST_GAP
    assert first.cause.delta_ns == pytest.approx(first.late_by_ns, abs=20_000)
    # it idled at its step's start, before its first op (the seeded start delay)
    place = "at the start of step 0, before aten::addmm"
    assert first.cause.text == f"host idle/gap +{first.cause.delta_ns / 1e6:.1f} ms ({place})"


def _contradicted_then_late(tmp: Path, *, late: int) -> AnalysisResult:
    """2 ranks: at seq 0 rank 0 is done at 3 ms and rank 1 begins at 8 ms (clocks that disagree: rank 0
    "waits" 7 ms); at seq 1 rank ``late`` arrives 1 ms after the other, both done together."""
    from skewlens.analysis.api import analyze_run
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    r0.collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=MS)
    r1.collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=8 * MS)
    early, last = (r1, r0) if late == 0 else (r0, r1)
    early.collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=20 * MS)
    last.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=21 * MS)
    return analyze_run(load_run(b.write(tmp / "run")), blame=False)


def test_an_event_whose_members_clocks_contradict_is_flagged_and_listed_after_the_others(
    tmp_path: Path,
) -> None:
    # the 128-GPU sample's all_to_all 0#1 (rank 0 done 46.5 ms before rank 1 began) was listed among the
    # worst collectives with a 109.29 ms skew and a compute cause, unmarked, in the table and the Parquet
    from rich.console import Console

    from skewlens.analysis.api import skew_table
    from skewlens.analysis.render import worst_collectives_table

    result = _contradicted_then_late(tmp_path, late=0)
    by_seq = {e.seq: e for e in result.skew.events}
    assert (by_seq[0].skew_ns, by_seq[0].clock_contradicted) == (7 * MS, True)
    assert (by_seq[1].skew_ns, by_seq[1].clock_contradicted) == (MS, False)
    tbl = skew_table(result.skew)
    flags = tbl.column("clock_contradicted").to_pylist()
    assert list(zip(tbl.column("seq").to_pylist(), flags, strict=True)) == [
        (0, True),
        (0, True),
        (1, False),
        (1, False),
    ]
    assert [r.clock_contradicted for r in result.skew.records()] == [True, True, False, False]
    console = Console(width=300, record=True)
    console.print(worst_collectives_table(result))
    text = console.export_text()
    rows = [ln for ln in text.splitlines() if "all_reduce" in ln]
    # the 2 ms of exposed "wait" would rank first: it comes after the 1 ms, marked
    assert len(rows) == 2
    assert "all_reduce 0#1 " in rows[0] and "(clocks?)" not in rows[0]
    assert "all_reduce 0#0 (clocks?)" in rows[1]
    assert "(clocks?): a member recorded as done before one it waits for began" in " ".join(text.split())


def test_waits_at_an_event_whose_clocks_contradict_are_not_charged_to_the_late_rank(tmp_path: Path) -> None:
    # the 128-GPU sample: 9.91 of rank 1's 11.68 ms of caused wait came from the two all_to_alls whose clocks
    # contradict each other, which ranked it first among the stragglers with a cause taken from one of them

    result = _contradicted_then_late(tmp_path, late=1)
    by_seq = {e.seq: e for e in result.skew.events}
    assert by_seq[0].clock_contradicted and by_seq[0].blamed_rank == 1 and by_seq[0].wait_ns.max() > 0
    assert (by_seq[1].clock_contradicted, by_seq[1].blamed_rank) == (False, 1)
    # only seq 1's wait (1 ms) is charged to rank 1, not seq 0's
    assert result.skew.caused_wait_ns == {1: int(by_seq[1].exposed_wait_ns.sum())}
    assert result.skew.caused_wait_ns[1] <= MS


def _late_after_a_transfer(tmp: Path) -> SkewEvent:
    """4 ranks: after a world all_reduce, ranks 2 and 3 exchange 4.9 ms of uneven all_to_all on their own
    group (both arrive together: a transfer, no wait), then everyone computes 1 ms (rank 3: 1.02 ms) and
    meets at a world all_to_all, where rank 3 arrives last, 4.92 ms after the median member."""
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(4, groups={"0": (0, 1, 2, 3), "pair": (2, 3)})
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=0)
        if r >= 2:
            rb.collective(CommType.ALL_TO_ALL, 1 << 20, 4_900_000 if r == 3 else 4_880_000, pg="pair")
        rb.compute("aten::mm", MS + (20_000 if r == 3 else 0))
        rb.collective(CommType.ALL_TO_ALL, 4096, 6 * MS if r < 2 else MS, start_ns=None)
    run = load_run(b.write(tmp / "run"))
    (event,) = [e for e in analyze_skew(build_index(run)).events if e.pg_name == "0" and e.seq == 1]
    return event


def test_a_cause_that_grew_by_less_than_it_shows_is_not_named(tmp_path: Path) -> None:
    # a 4-rank gloo capture's uneven all_to_all (4.9 ms skew) was said to be late because "compute grew:
    # compute +0.0 ms": the largest positive difference between the windows, 0.02 ms, was taken as the cause
    event = _late_after_a_transfer(tmp_path)
    assert (event.late_rank, event.skew_ns, event.late_by_ns) == (3, 4_920_000, 4_920_000)
    assert event.cause.kind is CauseKind.NONE and event.cause.text == ""
    # a compute growth spread over ops that each grew less than it shows reads as the whole
    ops = (("aten::add", 40_000), ("aten::mul", 40_000))
    spread = Cause(kind=CauseKind.COMPUTE, delta_ns=120_000, op="aten::add", ops=ops)
    assert spread.text == "compute grew: +0.1 ms"


def test_an_op_running_on_past_the_late_members_arrival_counts_only_its_part_before_it(
    tmp_path: Path,
) -> None:
    # the 128-GPU sample's all_to_all 0#5 read "compute grew: forward +133.8 ms" in a 113.3 ms window: a
    # host "forward" scope of 119.3 ms, begun 8.0 ms before rank 0's arrival, counted whole
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 4096, MS, start_ns=0)
    b.rank(0).compute("aten::mm", MS, start_ns=MS)
    b.rank(0).collective(CommType.ALL_REDUCE, 4096, 4 * MS, start_ns=2 * MS)
    # rank 1's scope runs 50 ms from 1 ms; the collective it issued on a second stream arrives at 5 ms
    b.rank(1).compute("forward", 50 * MS, start_ns=MS)
    b.rank(1).collective(CommType.ALL_REDUCE, 4096, MS, start_ns=5 * MS, stream=1)
    run = load_run(b.write(tmp_path / "run"))
    (event,) = [e for e in analyze_skew(build_index(run)).events if e.seq == 1]
    assert (event.late_rank, event.late_by_ns) == (1, 3 * MS)
    assert event.cause.kind is CauseKind.COMPUTE
    assert event.cause.ops == (("forward", 4 * MS),)  # [1 ms, 5 ms), not 50 ms
    assert event.cause.delta_ns == 3 * MS
    assert event.cause.text == "compute grew: forward +4.0 ms"


def test_an_eager_send_waits_for_no_one_so_its_late_receiver_is_charged_no_wait(tmp_path: Path) -> None:
    # rank 0's send completes in 1 ms, 4 ms before rank 1 arrives at its recv: the execution model (and the
    # critical path) has it wait for no one, but the skew counted its whole 1 ms as a wait for rank 1,
    # charged rank 1 with 1 ms of caused wait and put the send in rank 0's exposed wait, not its transfer
    from skewlens.analysis.api import analyze_run

    result = analyze_run(load_run(build_eager_send(tmp_path)), blame=False)
    (event,) = result.skew.events
    assert event.wait_ns.tolist() == [0, 0]
    assert result.skew.caused_wait_ns.get(1, 0) == 0
    rank0 = next(r for r in result.breakdown if r.rank == 0)
    assert (rank0.exposed_wait_ns, rank0.exposed_transfer_ns) == (0, MS)


def test_each_members_record_has_its_own_transfer_and_a_pair_is_labelled_from_sender_to_receiver(
    slow_send_skew: SkewResult, tmp_path: Path
) -> None:
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    # both ranks arrive at 1 µs; the all_reduce lasts 2 µs on rank 0 and 5 µs on rank 1: their transfers
    b = RunBuilder(world_size=2)
    for r, dur in ((0, 2_000), (1, 5_000)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=1_000)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=dur)
    recs = analyze_skew(build_index(load_run(b.write(tmp_path / "run")))).records()
    assert [(r.rank, r.wait_ns, r.transfer_ns) for r in recs] == [(0, 0, 2_000), (1, 0, 5_000)]
    e = next(e for e in slow_send_skew.events if e.kind == "p2p" and e.ranks == (0, 1))
    assert e.label == f"send_recv {e.pg_name}#{e.seq} 0->1"
    e = next(e for e in slow_send_skew.events if e.kind == "collective")
    assert e.label == f"{e.comm_type.lower()} {e.pg_name}#{e.seq}"


def test_each_members_record_carries_the_bytes_of_its_own_call(tmp_path: Path) -> None:
    from skewlens.analysis.api import skew_table
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    # an all_reduce of 1 MiB on both ranks, then rank 0 sends 4 KiB to rank 1: each row gives its member's
    # bytes, in the records and in the table analyze writes alike
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=1_000)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=2_000)
    b.rank(0).send(1, comm_bytes=4096, dur_ns=1_000)
    b.rank(1).recv(0, comm_bytes=4096, dur_ns=1_000)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    got = sorted((r.kind, r.rank, r.comm_bytes) for r in skew.records())
    assert got == [("collective", 0, 1 << 20), ("collective", 1, 1 << 20), ("p2p", 0, 4096), ("p2p", 1, 4096)]
    table = skew_table(skew).to_pydict()
    assert sorted(zip(table["kind"], table["rank"], table["comm_bytes"], strict=True)) == got


def test_an_event_on_a_device_mesh_dimensions_group_is_labelled_with_the_dimensions_name(
    tmp_path: Path,
) -> None:
    # an 8-rank pp x dp x tp capture's worst collectives read "send_recv 2#24 1->5", "reduce_scatter 6#73":
    # which of the 12 two-rank groups was a pipeline, data- or tensor-parallel one, only the manifest said
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    groups = {"0": (0, 1, 2, 3), "1": (0, 2), "2": (1, 3), "5": (0, 1), "6": (2, 3)}
    descs = {"1": "mesh_pp", "2": "mesh_pp", "5": "mesh_dp", "6": "mesh_dp"}
    b = RunBuilder(world_size=4, groups=groups, descs=descs)
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", (1 + r) * MS, start_ns=0)
        rb.collective(CommType.ALL_GATHER, 4096, MS, start_ns=5 * MS, pg="5" if r < 2 else "6")
        rb.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=7 * MS)
    b.rank(0).send(2, 4096, MS, start_ns=9 * MS, pg="1")
    b.rank(2).recv(0, 4096, MS, start_ns=9 * MS, pg="1")
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    assert sorted(e.label for e in skew.events) == [
        "all_gather dp:5#0",
        "all_gather dp:6#0",
        "all_reduce 0#0",
        "send_recv pp:1#0 0->2",
    ]


def test_a_hashed_group_name_is_cut_to_eight_digits_in_a_label_and_a_shorter_hex_name_is_kept_whole(
    tmp_path: Path,
) -> None:
    # new_group(use_local_synchronization=True) names a group by a 40-digit SHA-1: whole, it took the
    # worst-collectives table's width from every other column; a name the program gave is never cut
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    hashed, named = "3722ef32ad8fe7c3370e39700f5dc805571d7206", "ab" * 16
    b = RunBuilder(world_size=2, groups={"0": (0, 1), hashed: (0, 1), named: (0, 1)})
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", (1 + r) * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=3 * MS, pg=hashed)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=5 * MS, pg=named)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    assert sorted(e.label for e in skew.events) == ["all_reduce 3722ef32…#0", f"all_reduce {named}#0"]
    assert sorted(e.pg_name for e in skew.events) == [hashed, named]


@pytest.mark.parametrize("where", ["set-up-before-its-step", "no-step-marks", "after-its-steps"])
def test_a_late_members_first_communication_opens_its_window_at_its_step_else_at_its_first_timed_node(
    tmp_path: Path, where: str
) -> None:
    # a 3-D (pp x dp x tp) capture on 8 gloo ranks: a second pipeline stage's first communication is a
    # recv, so its window fell back to its first node, the process-group METADATA node at 0 ns, on clocks
    # of 1.8e18 ns: "host idle/gap +1643462838782.2 ms" was rank 5's top cause. Rank 1's recv here is its
    # first communication: in a step its window opens at that step's start (not at the 50 ms set-up
    # before it); without step marks, or past its last step, at its first timed node
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    t0 = 1_796_571_370_000_000_000
    b = RunBuilder(world_size=3, groups={"0": (0, 1, 2), "dp": (0, 2)})
    for r in (0, 2):
        rb = b.rank(r).step(0)
        lin = rb.compute("aten::linear", 55 * MS, start_ns=t0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=t0 + 55 * MS, pg="dp", deps=(lin,))
    b.rank(0).send(1, 4096, 21 * MS, start_ns=t0 + 60 * MS)
    rb = b.rank(1).step(0 if where == "after-its-steps" else -1)
    rb.compute("setup", 50 * MS, start_ns=t0)
    rb.step(0 if where != "no-step-marks" else -1).compute("aten::mm", 30 * MS, start_ns=t0 + 50 * MS)
    rb.step(-1 if where != "set-up-before-its-step" else 0).recv(0, 4096, MS, start_ns=t0 + 80 * MS)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (pair,) = [e for e in skew.events if e.kind == "p2p"]
    first_op, delta = ("aten::mm", 30 * MS) if where == "set-up-before-its-step" else ("setup", 80 * MS)
    assert (pair.late_rank, pair.cause.kind, pair.cause.op, pair.cause.delta_ns) == (
        1,
        CauseKind.COMPUTE,
        first_op,
        delta,
    )


def _host_gap_cause(b: object, tmp_path: Path) -> Cause:
    """The cause of the last event of the run ``b`` (a RunBuilder) writes, of rank 1's lateness; rank 1's
    top cause (the stragglers table's) the same."""
    from skewlens.profiler.synth import RunBuilder

    assert isinstance(b, RunBuilder)
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    event = skew.events[-1]
    assert (event.late_rank, event.blamed_rank) == (1, 1)
    assert event.cause.kind is CauseKind.HOST_GAP
    assert skew.top_cause_in()[1].text == event.cause.text
    return event.cause


def test_a_host_gap_cause_says_between_which_two_ops_the_gap_sat(tmp_path: Path) -> None:
    # rank 1 idles 30 ms between aten::mm and aten::add (a checkpoint write, a sleep before backward): the
    # cause read "host idle/gap +30.0 ms", naming nothing, and the user had to find the gap in their code
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.compute("aten::add", MS, start_ns=MS + (30 * MS if r == 1 else 0))
        rb.collective(CommType.ALL_REDUCE, 4096, MS + (30 * MS if r == 0 else 0))
    cause = _host_gap_cause(b, tmp_path)
    assert cause.text == "host idle/gap +30.0 ms (after aten::mm, before aten::add)"
    assert cause.op is None  # cause_op stays the op that grew of a compute cause


def test_a_host_gap_at_a_steps_start_is_said_to_be_there(tmp_path: Path) -> None:
    # step 1 begins 1 ms after step 0's all_reduce (its mark, its first node: untraced host time, a data
    # loader); rank 1's lasts 30 ms, rank 0's 1 ms: the gap that grew lay at step 1's start, before aten::mm
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS)
        rb.step(1)
        rb.compute("untraced", (30 if r == 1 else 1) * MS, start_ns=3 * MS)
        rb.compute("aten::mm", MS)
        rb.collective(CommType.ALL_REDUCE, 4096, MS + (29 * MS if r == 0 else 0))
    cause = _host_gap_cause(b, tmp_path)
    assert cause.text == "host idle/gap +29.0 ms (at the start of step 1, before aten::mm)"


def test_a_host_gap_before_a_ranks_first_op_names_only_the_op_after_it(tmp_path: Path) -> None:
    # no step marks, and rank 1's first op begins 30 ms after rank 0's: nothing came before the gap
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r)
        rb.compute("aten::mm", MS, start_ns=30 * MS if r == 1 else 0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS + (30 * MS if r == 0 else 0))
    cause = _host_gap_cause(b, tmp_path)
    assert cause.text == "host idle/gap +30.0 ms (before aten::mm)"


def _gaps_run(gaps_ms: dict[int, tuple[float, float]]) -> object:
    """2 ranks, one step: aten::mm (1 ms), aten::add and aten::sub (1 ms each) after idle stretches of
    ``gaps_ms[rank]`` ms, then an all_reduce both leave together."""
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    ends = {r: 3 * MS + round(sum(g) * MS) for r, g in gaps_ms.items()}
    for r, (before_add, before_sub) in gaps_ms.items():
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.compute("aten::add", MS, start_ns=MS + round(before_add * MS))
        rb.compute("aten::sub", MS, start_ns=2 * MS + round((before_add + before_sub) * MS))
        rb.collective(CommType.ALL_REDUCE, 4096, MS + max(ends.values()) - ends[r])
    return b


def test_a_host_gap_cause_names_where_the_gap_grew_not_where_both_members_idled(tmp_path: Path) -> None:
    # both idle between aten::mm and aten::add (rank 1 30 ms, rank 0 25 ms); only rank 1 idles 10 ms
    # between aten::add and aten::sub: of its 15 ms of lateness, 10 grew there, 5 where both idled
    cause = _host_gap_cause(_gaps_run({0: (25, 0), 1: (30, 10)}), tmp_path)
    assert cause.text == "host idle/gap +15.0 ms (after aten::add, before aten::sub)"


def test_a_host_gap_cause_names_a_place_holding_over_half_of_it(
    tmp_path: Path,
) -> None:
    # rank 1 idles 20 ms before aten::add and 15 before aten::sub: the first place holds over half of
    # the 35 ms and is named (it was where the user's code idled most)
    cause = _host_gap_cause(_gaps_run({0: (0, 0), 1: (20, 15)}), tmp_path / "a")
    assert cause.text == "host idle/gap +35.0 ms (after aten::mm, before aten::add)"


def test_idle_stretches_too_short_to_show_place_no_host_gap(tmp_path: Path) -> None:
    # an ops capture's untraced slivers between operators: rank 1's 0.04 and 0.02 ms (+0.0 ms each as a
    # cause shows them) make it 0.06 ms late, a host gap, placed nowhere: no sliver is where it sat
    cause = _host_gap_cause(_gaps_run({0: (0, 0), 1: (0.04, 0.02)}), tmp_path)
    assert (cause.delta_ns, cause.text) == (60_000, "host idle/gap +0.1 ms")


def test_a_host_gap_is_placed_between_the_outermost_ops_around_it(tmp_path: Path) -> None:
    # the op before the gap ends together with its last child (Optimizer.step and its aten::add_), the op
    # after it begins together with its first (a module's forward and its aten::linear): the gap is named by
    # the scopes, as the code the user wrote reads
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        gap = 30 * MS if r == 1 else 0
        rb.compute("Optimizer.step#SGD.step", 5 * MS, start_ns=0)
        rb.compute("aten::add_", MS, start_ns=4 * MS)
        rb.compute("nn.Module: Linear_0", 3 * MS, start_ns=5 * MS + gap)
        rb.compute("aten::linear", MS, start_ns=5 * MS + gap)
        rb.collective(CommType.ALL_REDUCE, 4096, MS + 30 * MS - gap, start_ns=8 * MS + gap)
    cause = _host_gap_cause(b, tmp_path)
    assert cause.text == "host idle/gap +30.0 ms (after Optimizer.step#SGD.step, before nn.Module: Linear_0)"


def test_a_host_gap_is_not_placed_at_the_idle_stretch_before_a_send_which_is_a_late_sends(
    tmp_path: Path,
) -> None:
    # rank 1 idles 10 ms before each of aten::add, aten::sub and aten::mul, then 15 ms before its send to
    # rank 2, then comes 45 ms late to the all_reduce of ranks 0 and 1: 30 ms of host gap and 15 of late
    # send. The 15 ms stretch is the late send's, not where the host gap sat; the host gap's three
    # stretches, none half of it, place it nowhere
    from skewlens.profiler.synth import DEFAULT_PG, RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=3, groups={DEFAULT_PG: (0, 1, 2), "duo": (0, 1)})
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    for k, name in enumerate(("aten::mm", "aten::add", "aten::sub", "aten::mul")):
        r0.compute(name, MS, start_ns=k * MS)
        r1.compute(name, MS, start_ns=k * 11 * MS)
    r1.send(2, 4096, MS, start_ns=49 * MS)
    b.rank(2).step(0).recv(1, 4096, 50 * MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 4096, 47 * MS, start_ns=4 * MS, pg="duo")
    r1.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=50 * MS, pg="duo")
    skew = analyze_skew(build_index(load_run(b.write(tmp_path / "run"))))
    (duo,) = [e for e in skew.events if e.pg_name == "duo"]
    assert (duo.late_rank, duo.blamed_rank) == (1, 1)
    assert duo.cause.text == "host idle/gap +30.0 ms"


def test_a_gap_that_ended_where_the_next_steps_mark_began_is_placed_after_the_op_before_it(
    tmp_path: Path,
) -> None:
    # step 1's mark begins with its first op (aten::mm): rank 1's 30 ms idle after step 0's all_reduce
    # ended where step 1 began, so it lay before that step, not at its start (the docs' rule: the last mark
    # before the stretch's end)
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS)
        rb.step(1).compute("aten::add", MS, start_ns=(32 if r == 1 else 2) * MS)
        rb.collective(CommType.ALL_REDUCE, 4096, MS + (30 * MS if r == 0 else 0))
    cause = _host_gap_cause(b, tmp_path)
    assert cause.text == "host idle/gap +30.0 ms (after c10d::all_reduce_, before aten::add)"
