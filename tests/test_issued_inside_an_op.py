"""Communication a host op issues from inside itself (a DDP communication hook inside ``AccumulateGrad``,
FSDP2's ``unshard(async_op=True)`` inside ``FSDP::all_gather``, an all_reduce inside ``Optimizer.step``) is
issued at the enclosing row's replayed start plus its recorded offset into the row, scaled by that row's
work factor: the execution model's issue edges, which the simulator, the analyses and the real replay's
worker all read. Before, it was issued a fixed gap after the last row its thread finished before the op, so
shortening the op moved nothing: a 30 ms sleep in a DDP hook could not be replayed away.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from capture_helpers import profile_script, profile_stalled_script, row_holding
from replay_workloads import worker_times

from skewlens.profiler.store import RunTrace, load_run
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.execution import SKEW_NS, execution_model, latest_deps
from skewlens.replay.real.plan import KIND_COLL, rank_plan
from skewlens.replay.simulate import Simulator, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

MS = 1_000_000
OP_NS = 10 * MS


def _issued_inside(run_dir: Path, *, issue_at: int, nested: bool = False) -> RunTrace:
    """Each of 2 ranks: ``a`` (0-1 ms), then a 10 ms ``op`` (1-11 ms) that issues an all_gather ``issue_at``
    (gloo's worker stream, its recorded dependency ``a``, as the capture records it), and ``c10d::wait``
    after the op and the all_gather; with ``nested``, the all_gather is issued from inside ``inner``
    (3-7 ms) inside ``op``."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("aten::randn", MS, start_ns=0)
        op = rb.compute("FSDP::all_gather", OP_NS, start_ns=MS, deps=(a,))
        if nested:
            rb.compute("inner", 4 * MS, start_ns=3 * MS, deps=(op,))
        ag = rb.collective(CommType.ALL_GATHER, 4096, MS // 2, start_ns=issue_at, stream=1000, deps=(a,))
        rb.compute("c10d::wait", MS, start_ns=max(MS + OP_NS, issue_at + MS // 2), deps=(op, ag))
    return load_run(b.write(run_dir))


def _op_run(run_dir: Path, inside: Callable[[RankBuilder, int, int], int], *, a_at: int = 0) -> RunTrace:
    """Each of 2 ranks: ``a`` (``a_at``-1 ms), the 10 ms ``op`` (1-11 ms), the rows ``inside(rank builder, a,
    op)`` adds (it gives the last collective's) and ``c10d::wait`` after the op and that collective."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("aten::randn", MS - a_at, start_ns=a_at)
        op = rb.compute("FSDP::all_gather", OP_NS, start_ns=MS, deps=(a,))
        ag = inside(rb, a, op)
        rb.compute("c10d::wait", MS, start_ns=MS + OP_NS, deps=(op, ag))
    return load_run(b.write(run_dir))


def _rows(run: RunTrace, *names: str) -> list[int]:
    rt = run.ranks[0]
    return [next(i for i in range(len(rt)) if rt.name(i) == nm) for nm in names]


def _slowed(pattern: str, factor: float) -> SlowdownModel:
    return SlowdownModel([Slowdown(kind="op", pattern=pattern, ranks=(0, 1), factor=factor)])


@pytest.mark.parametrize(("factor", "after_ns"), [(1.0, 4 * MS), (0.5, 2 * MS), (2.0, 8 * MS)])
def test_a_collective_issued_40_percent_into_an_op_is_issued_40_percent_into_the_op_as_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factor: float, after_ns: int
) -> None:
    # issued 4 ms into the 10 ms op: before, 4 ms after the op began whatever the op's factor (the gap after
    # `a`); now at 40% of the op as replayed, in the simulator and the real replay's worker alike
    run = _issued_inside(tmp_path / "run", issue_at=MS + 4 * MS)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    slow = _slowed("FSDP::*", factor)
    sim = simulate(run, effects=slow)
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == after_ns
    assert int(sim.end_ns[0][op] - sim.start_ns[0][op]) == round(OP_NS * factor)
    start, _end = worker_times(rank_plan(run.ranks[0], run, slow), tmp_path, monkeypatch)
    assert start[ag] - start[op] == after_ns


def test_a_what_if_on_a_lowered_run_issues_the_collective_as_a_fresh_replay_does(tmp_path: Path) -> None:
    # the analyses' what-ifs (blame) re-time one rank of a run lowered once: the op at a quarter of its
    # length on rank 0 issues the all_gather 1 ms into it there, as simulate() with the override does
    run = _issued_inside(tmp_path / "run", issue_at=MS + 4 * MS)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    dur = np.full(len(run.ranks[0]), -1, dtype=np.int64)
    dur[op] = OP_NS // 4
    sim = Simulator(run)
    sim.simulate()
    assert not sim.steps_unchanged(dur_override={0: dur})
    whatif = sim.simulate(dur_override={0: dur})
    fresh = simulate(run, dur_override={0: dur})
    assert int(whatif.start_ns[0][ag] - whatif.start_ns[0][op]) == MS
    for r in run.ranks:
        assert whatif.start_ns[r].tolist() == fresh.start_ns[r].tolist()
    assert sim.simulate().start_ns[0].tolist() == run.ranks[0].start_ns.tolist()  # the lowering's own back


def test_the_model_issues_a_collective_from_inside_the_op_it_was_recorded_in(tmp_path: Path) -> None:
    from skewlens.replay.execution import issue_times

    run = _issued_inside(tmp_path / "run", issue_at=MS + 4 * MS)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_dst.tolist(), m.issue_off_ns.tolist()) == ([op], [ag], [4 * MS])
    assert int(m.gap_ns[ag]) == 0
    # the analyses' latest dependency of the all_gather is the op, met at the issue (not `a` and a gap)
    rt = run.ranks[0]
    dep, met = latest_deps(m, rt.start_ns, rt.start_ns + rt.dur_ns)
    assert (int(dep[ag]), int(met[ag])) == (op, MS + 4 * MS)
    # on the op replayed half as long (its end 6 ms): issued 2 ms into it
    end = (rt.start_ns + rt.dur_ns).copy()
    end[op] = MS + OP_NS // 2
    assert issue_times(m, rt.start_ns, end).tolist() == [MS + 2 * MS]


def test_a_collective_issued_inside_a_nested_op_is_issued_from_the_innermost_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issued 2 ms into `inner` (3-7 ms, inside the op): `inner` at half its length issues it 1 ms in; `inner`
    # starts as long after the op's start as recorded (nested rows keep their offset)
    run = _issued_inside(tmp_path / "run", issue_at=5 * MS, nested=True)
    op, inner, ag = _rows(run, "FSDP::all_gather", "inner", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_off_ns.tolist()) == ([inner], [2 * MS])
    slow = _slowed("inner", 0.5)
    sim = simulate(run, effects=slow)
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == 2 * MS + MS
    start, _end = worker_times(rank_plan(run.ranks[0], run, slow), tmp_path, monkeypatch)
    assert start[ag] - start[op] == 3 * MS


def test_a_collective_issued_inside_a_nested_op_moves_with_the_enclosing_op_a_replay_scales(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the op at half its length: `inner`, 2 ms into it, starts 1 ms in and lasts 2 ms (its recorded 4 ms
    # scaled with the op); its issue, 2 ms into its recorded 4, is 1 ms into it: 2 ms after the op's start
    run = _issued_inside(tmp_path / "run", issue_at=5 * MS, nested=True)
    op, inner, ag = _rows(run, "FSDP::all_gather", "inner", "c10d::all_gather_")
    slow = _slowed("FSDP::all_gather", 0.5)
    sim = simulate(run, effects=slow)
    assert int(sim.start_ns[0][inner] - sim.start_ns[0][op]) == MS
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == MS + MS
    start, _end = worker_times(rank_plan(run.ranks[0], run, slow), tmp_path, monkeypatch)
    assert start[ag] - start[op] == 2 * MS


def test_a_collective_recorded_just_after_its_op_ended_is_issued_at_the_ops_replayed_end(
    tmp_path: Path,
) -> None:
    # recorded 10 µs past the op's end (the clocks of the trace's sources disagree by that much): its offset
    # is clamped to the op's length, so it moves with the op's end; before, 10.01 ms after the op began
    run = _issued_inside(tmp_path / "run", issue_at=MS + OP_NS + 10_000)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_off_ns.tolist()) == ([op], [OP_NS])
    assert int(m.gap_ns[ag]) == 10_000  # unchanged, the replay keeps the recorded start
    assert int(simulate(run).start_ns[0][ag]) == MS + OP_NS + 10_000
    sim = simulate(run, effects=_slowed("FSDP::*", 0.5))
    assert int(sim.start_ns[0][ag]) == MS + OP_NS // 2 + 10_000


def test_an_unchanged_replay_issues_the_collective_where_it_was_recorded(tmp_path: Path) -> None:
    run = _issued_inside(tmp_path / "run", issue_at=MS + 4 * MS)
    sim = simulate(run)
    for r, rt in run.ranks.items():
        assert sim.start_ns[r].tolist() == rt.start_ns.tolist()
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    (ag,) = [o for o in ops if o.kind == KIND_COLL]
    assert (ag.issued_in, ag.issue_off_ns, ag.gap_ns) == (_rows(run, "FSDP::all_gather")[0], 4 * MS, 0)


def test_a_collective_recorded_skew_ns_or_more_after_its_op_ended_is_not_issued_from_inside_it(
    tmp_path: Path,
) -> None:
    # the clocks' error is under SKEW_NS (20 µs): a start recorded that long after the op's end was made
    # after the op returned, so the op's length does not move it (it keeps its gap after `a`)
    run = _issued_inside(tmp_path / "run", issue_at=MS + OP_NS + SKEW_NS)
    ag = _rows(run, "c10d::all_gather_")[0]
    m = execution_model(run).ranks[0]
    assert m.issue_src.tolist() == []
    assert int(m.gap_ns[ag]) == OP_NS + SKEW_NS
    sim = simulate(run, effects=_slowed("FSDP::*", 0.5))
    assert int(sim.start_ns[0][ag]) == MS + OP_NS + SKEW_NS
    # a ns earlier it is the op's (its offset clamped to the op's length): it moves with the op's end
    run = _issued_inside(tmp_path / "run2", issue_at=MS + OP_NS + SKEW_NS - 1)
    sim = simulate(run, effects=_slowed("FSDP::*", 0.5))
    assert int(sim.start_ns[0][ag]) == MS + OP_NS // 2 + SKEW_NS - 1


def test_a_collective_issued_inside_a_row_nested_two_deep_is_issued_from_the_innermost_row_running(
    tmp_path: Path,
) -> None:
    # `op` (1-11 ms) holds `inner` (3-7 ms), which holds `leaf` (3.5-4 ms); the all_gather is recorded at
    # 5 ms, after `leaf` ended, inside `inner`: it is `inner`'s, 2 ms into it (not the op's, 4 ms into it),
    # so `inner` at half its length issues it 1 ms into it, 3 ms after the op's start

    def inside(rb: RankBuilder, a: int, op: int) -> int:
        inner = rb.compute("inner", 4 * MS, start_ns=3 * MS, deps=(op,))
        rb.compute("leaf", MS // 2, start_ns=3 * MS + MS // 2, deps=(inner,))
        return rb.collective(CommType.ALL_GATHER, 4096, MS // 2, start_ns=5 * MS, stream=1000, deps=(a,))

    run = _op_run(tmp_path / "run", inside)
    op, inner, ag = _rows(run, "FSDP::all_gather", "inner", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_off_ns.tolist()) == ([inner], [2 * MS])
    sim = simulate(run, effects=_slowed("inner", 0.5))
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == 2 * MS + MS


@pytest.mark.parametrize("leaf", [False, True])
def test_a_collective_recorded_just_after_a_nested_row_ended_is_that_rows_whatever_ran_inside_it(
    tmp_path: Path, leaf: bool
) -> None:
    # `inner` (3-5 ms, inside the op) and the all_gather recorded 10 µs after its end (the clocks' error): it
    # is `inner`'s, at its end, whether or not `leaf` (3.5-4 ms) ran inside `inner`; so `inner` at half its
    # length issues it at 4 ms + 10 µs (1 ms after inner's start, then its gap). Before, with `leaf` (the
    # last row begun, ended long before) it was the op's, 4.01 ms into it whatever `inner` lasted
    def inside(rb: RankBuilder, a: int, op: int) -> int:
        inner = rb.compute("inner", 2 * MS, start_ns=3 * MS, deps=(op,))
        if leaf:
            rb.compute("leaf", MS // 2, start_ns=3 * MS + MS // 2, deps=(inner,))
        at = 5 * MS + 10_000
        return rb.collective(CommType.ALL_GATHER, 4096, MS // 2, start_ns=at, stream=1000, deps=(a,))

    run = _op_run(tmp_path / "run", inside)
    op, inner, ag = _rows(run, "FSDP::all_gather", "inner", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_off_ns.tolist()) == ([inner], [2 * MS])
    assert int(simulate(run).start_ns[0][ag]) == 5 * MS + 10_000  # unchanged: as recorded
    sim = simulate(run, effects=_slowed("inner", 0.5))
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == 2 * MS + MS + 10_000


def test_a_collective_queued_behind_another_on_gloos_stream_is_issued_by_the_host_thread_it_depends_on(
    tmp_path: Path,
) -> None:
    # three all_gathers on gloo's stream, issued inside the op at 1.2, 1.5 and 5 ms; the third queues behind
    # the first (gloo's two worker threads), which began later than `a`: the issuing thread is still the host
    # row's (a row on a communication stream issues nothing), so all three are the op's, and at half the
    # op's length the third is issued 2 ms into it

    def inside(rb: RankBuilder, a: int, _op: int) -> int:
        for at, dur in ((MS + MS // 5, MS // 2), (MS + MS // 2, MS), (5 * MS, MS // 2)):
            ag = rb.collective(CommType.ALL_GATHER, 4096, dur, start_ns=at, stream=1000, deps=(a,))
        return ag

    run = _op_run(tmp_path / "run", inside)
    rt = run.ranks[0]
    op = _rows(run, "FSDP::all_gather")[0]
    c1, c2, ag = [i for i in range(len(rt)) if rt.name(i) == "c10d::all_gather_"]
    m = execution_model(run).ranks[0]
    assert (m.queue_src.tolist(), m.queue_dst.tolist()) == ([c1], [ag])
    assert sorted(zip(m.issue_dst.tolist(), m.issue_src.tolist(), m.issue_off_ns.tolist(), strict=True)) == [
        (c1, op, MS // 5),
        (c2, op, MS // 2),
        (ag, op, 4 * MS),
    ]
    sim = simulate(run, effects=_slowed("FSDP::*", 0.5))
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == 2 * MS


def test_a_collective_depending_on_rows_of_two_host_threads_is_issued_by_the_later_starting_ones_thread(
    tmp_path: Path,
) -> None:
    # the all_gather (5 ms, gloo's stream) depends on `x` (thread 7, 0-0.5 ms) and on `a` (the main thread,
    # 0.2-1 ms): the later-starting dependency's thread issued it, from inside the op that thread was
    # running (not from thread 7, idle then), so at half the op's length it is issued 2 ms into it

    def inside(rb: RankBuilder, a: int, _op: int) -> int:
        x = rb.compute("aten::empty", MS // 2, start_ns=0, stream=7)
        return rb.collective(CommType.ALL_GATHER, 4096, MS // 2, start_ns=5 * MS, stream=1000, deps=(x, a))

    run = _op_run(tmp_path / "run", inside, a_at=MS // 5)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    m = execution_model(run).ranks[0]
    assert (m.issue_src.tolist(), m.issue_dst.tolist(), m.issue_off_ns.tolist()) == ([op], [ag], [4 * MS])
    sim = simulate(run, effects=_slowed("FSDP::*", 0.5))
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == 2 * MS


def test_a_scaled_issue_offset_is_rounded_to_the_nearest_ns(tmp_path: Path) -> None:
    # issued 4 ms + 3 ns into the op; the op at a quarter of its length issues it 1,000,000.75 ns into it,
    # rounded: 1,000,001
    run = _issued_inside(tmp_path / "run", issue_at=MS + 4 * MS + 3)
    op, ag = _rows(run, "FSDP::all_gather", "c10d::all_gather_")
    sim = simulate(run, effects=_slowed("FSDP::*", 0.25))
    assert int(sim.start_ns[0][ag] - sim.start_ns[0][op]) == round((4 * MS + 3) / 4) == 1_000_001


HOOK_STALL_STEP, HOOK_STALL_MS = 3, 30

HOOK_SCRIPT = f"""
import json, os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(64, 64))
it = [0]
side = {{}}
def hook(state, bucket):
    if rank == 1 and it[0] == {HOOK_STALL_STEP}:  # the profiler numbers steps from 0 too
        t0 = time.time_ns()
        time.sleep({HOOK_STALL_MS} / 1e3)
        side.update(start_ns=t0, end_ns=time.time_ns())
    return default_hooks.allreduce_hook(state, bucket)
model.register_comm_hook(None, hook)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(6):
    it[0] = i
    opt.zero_grad()
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
if rank == 1:
    with open(os.environ["SIDE_FILE"], "w") as f:
        json.dump(side, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_stall_inside_a_ddp_comm_hook_is_replayed_away_by_shortening_the_op_it_ran_in(
    tmp_path: Path,
) -> None:
    # rank 1's hook sleeps 30 ms in step 3, inside AccumulateGrad, then issues the all_reduce; the replay
    # with that op cut by the sleep: before, rank 1's step took as long (31.1 -> 31.1 ms; the all_reduce 30 ms
    # after the row before the op whatever the op lasted), now it loses the sleep
    run_dir, (stall_start, stall_end) = profile_stalled_script(tmp_path, HOOK_SCRIPT, steps="1:1:4")
    stall_ns = stall_end - stall_start
    run = load_run(run_dir)
    rt = run.ranks[1]
    node = row_holding(rt, (stall_start, stall_end))
    assert rt.name(node).endswith("AccumulateGrad") and rt.step[node] == HOOK_STALL_STEP
    dur = np.full(len(rt), -1, dtype=np.int64)
    dur[node] = int(rt.dur_ns[node]) - stall_ns
    base = simulate(run).step_spans()
    whatif = simulate(run, dur_override={1: dur}).step_spans()

    def took(spans: dict[tuple[int, int], tuple[int, int]]) -> int:
        a, b = spans[(1, HOOK_STALL_STEP)]
        return b - a

    # rank 1's step loses the sleep, give or take a shared CPU's noise (rank 0's may keep it where the
    # clocks contradict: its all_reduce recorded done before rank 1's began is detached from the group)
    assert took(base) - took(whatif) == pytest.approx(stall_ns, abs=5_000_000)
    assert {k: v for k, v in whatif.items() if k[1] < HOOK_STALL_STEP} == {
        k: v for k, v in base.items() if k[1] < HOOK_STALL_STEP
    }
    # the all_reduce is issued from inside it: the model's issue edge
    assert node in execution_model(run).ranks[1].issue_src.tolist()


@pytest.mark.slow
def test_fsdp2_all_gathers_issued_inside_their_ops_move_with_those_ops(tmp_path: Path) -> None:
    # FSDP2's unshard(async_op=True) at `ops`: each all_gather is issued inside an `FSDP::all_gather (k)`
    # op; with those ops at half their length each is issued at half its recorded offset into its op
    # (before: at its recorded offset, however short the op)
    from test_capture_waits import FSDP_SCRIPT, _filled

    run_dir, proc = profile_script(tmp_path, _filled(FSDP_SCRIPT), nproc=2, steps="1:1:3", level="ops")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = load_run(run_dir)
    slow = SlowdownModel([Slowdown(kind="op", pattern="FSDP::all_gather*", factor=0.5)])
    sim, half = simulate(run), simulate(run, effects=slow)
    for r, rt in run.ranks.items():
        assert sim.start_ns[r].tolist() == rt.start_ns.tolist(), r  # unchanged: exact
        ops = [i for i in range(len(rt)) if rt.name(i).startswith("FSDP::all_gather") and rt.is_cpu[i]]
        found = 0
        for i in range(len(rt)):
            if rt.name(i) != "c10d::_allgather_base_" or rt.stream[i] == rt.stream[ops[0]]:
                continue
            around = [o for o in ops if rt.start_ns[o] < rt.start_ns[i] < rt.start_ns[o] + rt.dur_ns[o]]
            if not around:
                continue
            (op,) = around
            off = int(rt.start_ns[i] - rt.start_ns[op])
            assert abs(int(half.start_ns[r][i] - half.start_ns[r][op]) - off / 2) <= 1, (r, i)
            found += 1
        assert found >= 3, r  # each layer's, each step
