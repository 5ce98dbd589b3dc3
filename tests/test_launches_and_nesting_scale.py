"""What a row does at a place inside it (launches a kernel, runs a nested row) moves with the row's length:
a launch edge is met at its source's replayed start plus its recorded offset scaled by the source's work
factor, a nested row starts its scaled offset into its enclosing row and lasts its scaled work, in the
simulator, its retimed what-ifs, the analyses and the real replay's plan alike (question 164)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from replay_workloads import worker_times

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.execution import execution_model, latest_deps
from skewlens.replay.real.plan import KIND_NESTED, rank_plan
from skewlens.replay.simulate import Simulator, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

MS = 1_000_000
US = 1_000


def _launch_run(tmp_path: Path) -> RunTrace:
    """One rank: ``prep`` (0-1 ms), then ``aten::linear`` (1-11 ms), which launches ``gemm`` (stream 7) by a
    call 9 ms into it (90% of its length); the kernel runs 5 µs after the call, for 1 ms."""
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    prep = rb.compute("prep", MS, start_ns=0)
    op = rb.compute("aten::linear", 10 * MS, start_ns=MS, deps=(prep,))
    rb.compute("gemm", MS, start_ns=10 * MS + 5 * US, stream=7, deps=(op,), launch_ns=10 * MS)
    return load_run(b.write(tmp_path / "run"))


def _op(pattern: str, factor: float, device: str = "any") -> SlowdownModel:
    return SlowdownModel([Slowdown(kind="op", pattern=pattern, factor=factor, device=device)])


@pytest.mark.parametrize(("factor", "launch_ns"), [(0.5, MS + 4_500 * US), (2.0, MS + 18 * MS)])
def test_a_kernel_launched_90_percent_into_an_op_a_replay_scales_is_launched_as_far_into_the_scaled_op(
    tmp_path: Path, factor: float, launch_ns: int
) -> None:
    # halved, the op runs 1-6 ms: its launch is met 4.5 ms after its start (45% of its recorded 10 ms), the
    # kernel 5 µs later; before, at 9 ms after its start whatever the factor: the kernel began at 10.005 ms,
    # after the halved op had ended (doubled: 10.005 ms, 9 ms before the launch call inside the 20 ms op)
    run = _launch_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    m = execution_model(run).ranks[0]
    assert m.launch_src.tolist() == [row["aten::linear"]] and m.launch_off_ns.tolist() == [9 * MS]
    res = simulate(run, effects=_op("aten::linear", factor))
    start, end = res.start_ns[0], res.end_ns[0]
    assert int(start[row["aten::linear"]]) == MS
    assert int(end[row["aten::linear"]]) == MS + round(10 * MS * factor)
    assert int(start[row["gemm"]]) == launch_ns + 5 * US
    # the analyses meet the launch where the simulator did
    dep, met = latest_deps(m, start, end)
    assert (int(dep[row["gemm"]]), int(met[row["gemm"]])) == (row["aten::linear"], launch_ns)


def test_a_dur_override_what_if_moves_the_launch_inside_the_op_as_a_slowdown_does(tmp_path: Path) -> None:
    # the retimed lowering (blame's and the critical path's what-ifs): the op given 5 ms of its 10
    run = _launch_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    sim = Simulator(run)
    base = sim.simulate()
    assert np.array_equal(base.start_ns[0], rt.start_ns) and np.array_equal(base.end_ns[0], rt.end_ns)
    ov = np.full(len(rt), -1, dtype=np.int64)
    ov[row["aten::linear"]] = 5 * MS
    res = sim.simulate(dur_override={0: ov})
    assert int(res.start_ns[0][row["gemm"]]) == MS + 4_500 * US + 5 * US
    assert int(sim.simulate().start_ns[0][row["gemm"]]) == 10 * MS + 5 * US  # written back after the what-if


def test_a_scaled_launch_is_met_at_the_nearest_ns_of_its_scaled_place(tmp_path: Path) -> None:
    # a call 9,000,002 ns into the 10 ms op, the op given 3 ms: 0.3 of it, 2,700,000.6 ns, met at 2,700,001
    # ns after the op's start (rounded to the nearest ns, not down)
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    prep = rb.compute("prep", MS, start_ns=0)
    op = rb.compute("aten::linear", 10 * MS, start_ns=MS, deps=(prep,))
    call_ns = MS + 9 * MS + 2
    rb.compute("gemm", MS, start_ns=call_ns + 5 * US, stream=7, deps=(op,), launch_ns=call_ns)
    run = load_run(b.write(tmp_path / "run"))
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    ov = np.full(len(rt), -1, dtype=np.int64)
    ov[row["aten::linear"]] = 3 * MS
    res = Simulator(run).simulate(dur_override={0: ov})
    assert int(res.start_ns[0][row["gemm"]]) == MS + 2_700_001 + 5 * US
    res = simulate(run, effects=_op("aten::linear", 0.3))
    assert int(res.start_ns[0][row["gemm"]]) == MS + 2_700_001 + 5 * US
    dep, met = latest_deps(execution_model(run).ranks[0], res.start_ns[0], res.end_ns[0])
    assert (int(dep[row["gemm"]]), int(met[row["gemm"]])) == (row["aten::linear"], MS + 2_700_001)


def test_a_slower_gpu_alone_leaves_the_launch_where_the_host_made_it(tmp_path: Path) -> None:
    # the kernel's own factor is not its source's: the launch stays 9 ms into the op
    run = _launch_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    res = simulate(run, effects=_op("gemm", 2.0, device="gpu"))
    assert int(res.start_ns[0][row["gemm"]]) == 10 * MS + 5 * US
    assert int(res.end_ns[0][row["gemm"]]) == 10 * MS + 5 * US + 2 * MS


def _nested_run(tmp_path: Path) -> RunTrace:
    """One rank: ``scope`` (0-5 ms) holds ``child`` (4-4.9 ms; nested: it follows the scope), then ``after``
    (5-6 ms)."""
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    scope = rb.compute("scope", 5 * MS, start_ns=0)
    rb.compute("child", 900 * US, start_ns=4 * MS)
    rb.compute("after", MS, start_ns=5 * MS, deps=(scope,))
    return load_run(b.write(tmp_path / "run"))


def test_a_row_nested_in_a_scope_a_replay_halves_ends_inside_the_halved_scope(tmp_path: Path) -> None:
    # halved, the scope runs 0-2.5 ms: its child 2-2.45 ms; before, 4-4.9 ms, after the scope had ended
    run = _nested_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    assert execution_model(run).ranks[0].parent[row["child"]] == row["scope"]
    res = simulate(run, effects=_op("scope", 0.5))
    start, end = res.start_ns[0], res.end_ns[0]
    assert (int(start[row["scope"]]), int(end[row["scope"]])) == (0, 2_500 * US)
    assert (int(start[row["child"]]), int(end[row["child"]])) == (2 * MS, 2_450 * US)
    # the real replay's plan times the nested op so too
    ops = {o.row: o for o in rank_plan(rt, run, _op("scope", 0.5))}
    child = ops[row["child"]]
    assert (child.kind, child.offset_ns, child.dur_ns) == (KIND_NESTED, 2 * MS, 450 * US)


def test_a_dur_override_what_if_moves_a_nested_row_with_its_scope_then_puts_it_back(tmp_path: Path) -> None:
    # the retimed lowering (blame's and the critical path's what-ifs): the scope given 2.5 ms of its 5, its
    # child 4 ms into it runs 2-2.45 ms; the next, unchanged replay has it at 4-4.9 ms again
    run = _nested_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    sim = Simulator(run)
    sim.simulate()
    ov = np.full(len(rt), -1, dtype=np.int64)
    ov[row["scope"]] = 2_500 * US
    res = sim.simulate(dur_override={0: ov})
    assert (int(res.start_ns[0][row["child"]]), int(res.end_ns[0][row["child"]])) == (2 * MS, 2_450 * US)
    res = sim.simulate()
    assert (int(res.start_ns[0][row["child"]]), int(res.end_ns[0][row["child"]])) == (4 * MS, 4_900 * US)


def test_a_nested_row_the_replay_scales_itself_lasts_its_own_work_at_its_scaled_offset(
    tmp_path: Path,
) -> None:
    # one rule for a row both items name: the scope's factor places the child, the child's own factor
    # gives its length; a factor on the child alone leaves its place in the scope as recorded
    run = _nested_run(tmp_path)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    both = SlowdownModel(
        [Slowdown(kind="op", pattern="scope", factor=0.5), Slowdown(kind="op", pattern="child", factor=2.0)]
    )
    res = simulate(run, effects=both)
    assert (int(res.start_ns[0][row["child"]]), int(res.end_ns[0][row["child"]])) == (2 * MS, 3_800 * US)
    res = simulate(run, effects=_op("child", 2.0))
    assert (int(res.start_ns[0][row["child"]]), int(res.end_ns[0][row["child"]])) == (4 * MS, 5_800 * US)


def test_rows_nested_in_a_wait_keep_their_place_in_its_wait_and_scale_with_its_work_after_it(
    tmp_path: Path,
) -> None:
    # ops level, one rank: c10d::wait (1-6 ms) waits for an all_reduce (1-5 ms): 4 ms of wait, then 1 ms
    # of work. Nested in it: aten::detach 0.1 ms in (in the wait), aten::at_end at the wait's end, 4 ms in,
    # aten::copy_ 4.4 ms in (0.4 ms into the work). Given 0.5 ms of work: the detach is where it was and
    # lasts its own 0.2 ms; at_end starts at the wait's end and lasts 0.2 ms x 0.5; the copy_ starts the
    # wait's 4 ms plus 0.4 ms x 0.5 in and lasts 0.4 ms x 0.5
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    mm = rb.compute("aten::mm", MS, start_ns=0)
    ar = rb.collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=MS, stream=1000, deps=(mm,))
    rb.compute("c10d::wait", 5 * MS, start_ns=MS, deps=(mm, ar))
    rb.compute("aten::detach", 200 * US, start_ns=MS + 100 * US)
    rb.compute("aten::at_end", 200 * US, start_ns=5 * MS)
    rb.compute("aten::copy_", 400 * US, start_ns=5 * MS + 400 * US)
    run = load_run(b.write(tmp_path / "run", level="ops"))
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    m = execution_model(run).ranks[0]
    wait = row["c10d::wait"]
    assert m.parent[row["aten::copy_"]] == wait and int(m.work_ns[wait]) == MS
    ov = np.full(len(rt), -1, dtype=np.int64)
    ov[wait] = 500 * US
    res = Simulator(run).simulate(dur_override={0: ov})
    start, end = res.start_ns[0], res.end_ns[0]

    def placed(name: str) -> tuple[int, int]:
        return int(start[row[name]] - start[wait]), int(end[row[name]] - start[row[name]])

    assert placed("aten::detach") == (100 * US, 200 * US)
    assert placed("aten::at_end") == (4 * MS, 100 * US)
    assert placed("aten::copy_") == (4 * MS + 200 * US, 200 * US)


def test_a_row_nested_in_a_collective_keeps_its_recorded_place_whatever_a_what_if_gives_the_collective(
    tmp_path: Path,
) -> None:
    # a sync group's member lasts its transfer, not work: record_param_comms 2 ms into a 4 ms all_reduce
    # stays 2 ms in, 0.2 ms long, under a dur_override of the all_reduce (which the transfer's model times)
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        prep = rb.compute("prep", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=MS, deps=(prep,), name="allreduce")
        rb.compute("record_param_comms", 200 * US, start_ns=3 * MS)
    run = load_run(b.write(tmp_path / "run", level="ops"))
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    coll, inner = row["allreduce"], row["record_param_comms"]
    assert execution_model(run).ranks[0].parent[inner] == coll
    ov = np.full(len(rt), -1, dtype=np.int64)
    ov[coll] = 2 * MS
    res = Simulator(run).simulate(dur_override={0: ov, 1: ov})
    start, end = res.start_ns[0], res.end_ns[0]
    assert (int(start[inner] - start[coll]), int(end[inner] - start[inner])) == (2 * MS, 200 * US)


def test_the_worker_times_a_nested_op_of_a_scaled_scope_as_the_simulator_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _nested_run(tmp_path)
    rt = run.ranks[0]
    effects = _op("scope", 0.5)
    sim = simulate(run, effects=effects)
    ops = rank_plan(rt, run, effects)
    start, end = worker_times(ops, tmp_path, monkeypatch)
    assert len(ops) == 3
    for r in (o.row for o in ops):
        assert (start[r], end[r]) == (int(sim.start_ns[0][r]), int(sim.end_ns[0][r])), rt.name(r)


def test_an_unchanged_replay_of_launches_and_nested_rows_is_exact(tmp_path: Path) -> None:
    for run in (_launch_run(tmp_path / "a"), _nested_run(tmp_path / "b")):
        res = simulate(run)
        rt = run.ranks[0]
        assert np.array_equal(res.start_ns[0], rt.start_ns) and np.array_equal(res.end_ns[0], rt.end_ns)


def test_a_kernel_launched_inside_a_collective_is_launched_as_far_into_it_as_recorded(tmp_path: Path) -> None:
    # a sync group's member lasts its transfer, not work: its launches do not scale with it (the lowering
    # holds it as 0 ns of work, which scaled the call to the collective's start)
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        prep = rb.compute("prep", MS, start_ns=0)
        ar = rb.collective(CommType.ALL_REDUCE, 1 << 20, 10 * MS, start_ns=MS, deps=(prep,), name="allreduce")
        rb.compute("gemm", MS, start_ns=10 * MS + 5 * US, stream=7, deps=(ar,), launch_ns=10 * MS)
    run = load_run(b.write(tmp_path / "run"))
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    m = execution_model(run).ranks[0]
    assert m.sync[row["allreduce"]] and m.launch_src.tolist() == [row["allreduce"]]
    res = simulate(run)
    assert int(res.start_ns[0][row["gemm"]]) == 10 * MS + 5 * US
    dep, met = latest_deps(m, res.start_ns[0], res.end_ns[0])
    assert (int(dep[row["gemm"]]), int(met[row["gemm"]])) == (row["allreduce"], 10 * MS)
