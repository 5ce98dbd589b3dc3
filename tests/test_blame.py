"""What-if blame: the straggler's cost is the step time it adds, checked against a run without it."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.analysis import blame as blame_module
from skewlens.analysis.api import analyze_run, tables
from skewlens.analysis.blame import BlameResult, _all_intervals, analyze_blame
from skewlens.analysis.index import build_index
from skewlens.analysis.records import CauseKind
from skewlens.analysis.render import hosts_table
from skewlens.analysis.skew import analyze_skew
from skewlens.profiler.manifest import read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay import simulate as simulate_module
from skewlens.replay.execution import execution_model
from skewlens.replay.simulate import simulate

STRAGGLER = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=5)
CLEAN = Scenario(steps=5)
SLOW_SEND = Scenario(slow_send_rank=0, slow_send_ns=25 * MS, steps=5)


def _blame(tmp: Path, sc: Scenario) -> BlameResult:
    ix = build_index(load_run(build_run(tmp, sc)))
    return analyze_blame(ix, analyze_skew(ix))


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> BlameResult:
    return _blame(tmp_path_factory.mktemp("s"), STRAGGLER)


def test_straggler_is_ranked_first_with_a_cost_equal_to_the_time_it_adds(straggler: BlameResult) -> None:
    top = straggler.records[0]
    assert top.rank == STRAGGLER.straggler_rank
    assert top.simulated
    assert top.straggler_cost_ns == pytest.approx(STRAGGLER.steps * STRAGGLER.straggler_ns, rel=0.03)
    assert top.steps_top == STRAGGLER.steps
    assert top.cause_kind == CauseKind.COMPUTE and top.cause_op == "aten::mm"
    costs = [r.straggler_cost_ns for r in straggler.records]
    assert costs == sorted(costs, reverse=True)
    for other in straggler.records[1:]:
        assert abs(other.straggler_cost_ns) < 0.01 * top.baseline_ns


def test_what_if_step_time_matches_a_run_without_the_straggler(
    straggler: BlameResult, tmp_path: Path
) -> None:
    clean = simulate(load_run(build_run(tmp_path, CLEAN)))
    for step, t in straggler.whatif_step_ns[STRAGGLER.straggler_rank].items():
        assert t == pytest.approx(clean.step_time_ns(step), rel=0.02)
    assert straggler.top_straggler_by_step() == dict.fromkeys(
        range(STRAGGLER.steps), STRAGGLER.straggler_rank
    )


def test_slow_sender_is_blamed_for_its_sends_not_compute(tmp_path: Path) -> None:
    res = _blame(tmp_path, SLOW_SEND)
    top = res.records[0]
    assert top.rank == SLOW_SEND.slow_send_rank
    assert top.cause_kind == CauseKind.LATE_SEND
    assert top.straggler_cost_ns == pytest.approx(SLOW_SEND.steps * SLOW_SEND.slow_send_ns, rel=0.05)


def test_max_simulations_bounds_the_what_ifs(tmp_path: Path) -> None:
    ix = build_index(load_run(build_run(tmp_path, STRAGGLER)))
    calls: list[object] = []

    def counting(run: object, **kw: object) -> object:
        calls.append(kw)
        return simulate(run, **kw)  # type: ignore[arg-type]

    res = analyze_blame(ix, analyze_skew(ix), simulate_fn=counting, max_simulations=1)
    assert len(calls) == 2  # baseline + the one rank with the largest excess
    assert [r.rank for r in res.records if r.simulated] == [STRAGGLER.straggler_rank]


def test_blame_lowered_once_gives_the_numbers_of_a_full_simulation_per_what_if(
    straggler: BlameResult, tmp_path: Path
) -> None:
    ix = build_index(load_run(build_run(tmp_path, STRAGGLER)))
    full = analyze_blame(ix, analyze_skew(ix), simulate_fn=simulate)
    assert full.records == straggler.records
    assert full.step_records == straggler.step_records
    assert full.whatif_step_ns == straggler.whatif_step_ns
    assert full.baseline_step_ns == straggler.baseline_step_ns


def test_a_run_without_step_marks_is_blamed_as_one_step(tmp_path: Path) -> None:
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    extra = 30 * MS
    b = RunBuilder(3)
    for r in range(3):
        b.rank(r).compute("aten::mm", 10 * MS + (extra if r == 1 else 0), start_ns=0)
    end = 10 * MS + extra + MS
    for r in range(3):
        start = 10 * MS + (extra if r == 1 else 0)
        b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, end - start, start_ns=start)
    ix = build_index(load_run(b.write(tmp_path / "run")))
    res = analyze_blame(ix, analyze_skew(ix))
    assert res.baseline_step_ns == {-1: end}
    assert res.records[0].rank == 1
    assert res.records[0].straggler_cost_ns == extra
    # ranks 0 and 2 cost nothing and made no one wait: in rank order after it
    rest = [(r.rank, r.straggler_cost_ns, r.caused_wait_ns) for r in res.records[1:]]
    assert rest == [(0, 0, 0), (2, 0, 0)]


def test_the_typical_value_of_each_slot_is_the_median_over_its_steps() -> None:
    from skewlens.analysis.blame import _typical

    rng = np.random.default_rng(7)
    steps = rng.integers(0, 6, size=200)
    slot = rng.integers(1, 9, size=200)
    keys = ((steps + 1) << 32) | slot  # the step above bit 32, the slot below
    comp = rng.integers(0, 10_000, size=200)
    gap = rng.integers(0, 50, size=200)
    slots, (med_comp, med_gap) = _typical(keys, comp, gap)
    assert slots.tolist() == sorted(set(slot.tolist()))
    for k, s in enumerate(slots.tolist()):
        assert med_comp[k] == np.median(comp[slot == s].astype(np.float64))
        assert med_gap[k] == np.median(gap[slot == s].astype(np.float64))


def test_a_slow_sender_with_no_other_sender_to_compare_it_with_is_named_under_the_blame(
    tmp_path: Path,
) -> None:
    # on 2 ranks only rank 0 sends: the what-if has nothing to compare its work before the send with, and
    # gave it no cost while the collectives table blamed it for every wait
    from skewlens.analysis.api import analyze_run
    from skewlens.analysis.render import uncompared_notes

    sc = Scenario(world_size=2, slow_send_rank=0, slow_send_ns=25 * MS, steps=5)
    res = analyze_run(load_run(build_run(tmp_path / "two", sc)), blame=True)
    assert res.blame is not None
    assert res.blame.uncompared_ns[0] >= sc.steps * sc.slow_send_ns
    (note,) = uncompared_notes(res)
    assert note.startswith("rank 0 caused 2") and "no counterpart on another rank" in note
    four = analyze_run(load_run(build_run(tmp_path / "four", SLOW_SEND)), blame=True)
    assert four.stragglers[0].rank == 0 and uncompared_notes(four) == []


def test_a_rank_nothing_was_blamed_on_is_given_no_cause(tmp_path: Path) -> None:
    # a rank of cost 0 that caused no wait was given a cause from whole-run totals ("DistributedDataParallel
    # .forward +0.0 ms"): here rank 0's aten::add, which rank 1 does not run
    from test_analysis_scenarios import build_one_slow_rank

    from skewlens.analysis import analyze_run

    res = analyze_run(load_run(build_one_slow_rank(tmp_path)))
    fast = next(r for r in res.stragglers if r.rank == 0)
    assert (fast.straggler_cost_ns, fast.caused_wait_ns) == (0, 0)
    assert (fast.cause_kind, fast.cause_op, fast.cause) == ("none", None, "")
    slow = next(r for r in res.stragglers if r.rank == 1)
    assert slow.cause == "compute grew: aten::mm +41.0 ms"


def _slow_sort_run(run_dir: Path, *, kernel_late_ns: int | None = None) -> Path:
    """3 ranks, 2 steps: rank 1 arrives 1 ms late at step 0's all_reduce (which ends at 7 ms for all); rank 2
    sorts 8 ms after the second step's all_reduce where the others sort 1 ms. With ``kernel_late_ns``, each
    aten::mm launches a kernel on GPU stream 7, which rank 2's GPU begins that long after the launch (the
    others' 10 us)."""
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for s in range(2):
            rb.step(s)
            late, wait = (MS if r == 1 else 0, MS) if s == 0 else (0, 0)
            t = s * 20 * MS
            mm = rb.compute("aten::mm", 5 * MS + late, start_ns=t)
            if kernel_late_ns is not None:
                begin = t + (kernel_late_ns if r == 2 else 10_000)
                rb.compute("sm90_gemm", MS // 10, start_ns=begin, stream=7, deps=(mm,), launch_ns=t)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS + wait - late)
            if s == 1:
                rb.compute("aten::sort", (8 if r == 2 else 1) * MS)
    return b.write(run_dir)


def test_the_cause_of_a_rank_that_made_no_one_wait_is_its_excess_over_the_median_rank_per_step(
    tmp_path: Path,
) -> None:
    # such a cause came from whole-run totals, unlabelled beside per-step figures: a rank of cost 9 us a step
    # read "host idle/gap +29.6 ms" over 5 steps. Here rank 2 sorts 8 ms after the step's last collective
    # where the others sort 1 ms, in the second of 2 steps: 7 ms more, 3.5 ms a step
    res = analyze_run(load_run(_slow_sort_run(tmp_path / "run")))
    top = res.stragglers[0]
    assert (top.rank, top.straggler_cost_ns, top.caused_wait_ns) == (2, 7 * MS, 0)
    assert top.cause == "compute grew: aten::sort +3.5 ms"
    # ranked by cost before the waits caused: rank 1 made both others wait 1 ms, but costs less
    second = res.stragglers[1]
    assert (second.rank, second.caused_wait_ns) == (1, 2 * MS) and 0 < second.straggler_cost_ns < 7 * MS


def test_a_gpus_idle_time_before_its_kernels_is_no_host_gap_in_the_cause_of_a_rank(tmp_path: Path) -> None:
    # the blame summed every row's gap as host gaps, a GPU op's too (its stream's idle time after the
    # launch), where untraced host time is the host rows' (execution.host_idle_rows, a host_idle slowdown's
    # rule): rank 2's GPU began each kernel 4 ms after its launch, its host idle no longer than its peers',
    # and it read "host idle/gap +4.0 ms"; its excess is its tail's aten::sort (8 ms against 1, in one of 2
    # steps)
    res = analyze_run(load_run(_slow_sort_run(tmp_path / "run", kernel_late_ns=4 * MS)))
    top = res.stragglers[0]
    assert (top.rank, top.straggler_cost_ns, top.caused_wait_ns) == (2, 7 * MS, 0)
    assert top.cause == "compute grew: aten::sort +3.5 ms"


def test_a_cause_from_an_excess_that_would_read_plus_zero_ms_is_no_cause() -> None:
    # the demo's rank 3 (cost 0.03 ms a step, no wait caused) read "Optimizer.step#SGD.step +0.0 ms"
    from skewlens.analysis.blame import _fallback_cause, _RunTotals

    tot = _RunTotals(
        comp={3: np.array([2 * MS + 40_000 * 5, 0.0])},
        gaps={3: 0},
        med_comp=np.array([2 * MS, 0.0]),
        med_gap=0,
    )
    assert _fallback_cause(tot, ["Optimizer.step#SGD.step", "aten::mm"], 3, steps=5).kind is CauseKind.NONE
    grown = _fallback_cause(tot, ["Optimizer.step#SGD.step", "aten::mm"], 3, steps=1)
    assert grown.text == "compute grew: Optimizer.step#SGD.step +0.2 ms"


def test_a_rank_that_began_late_is_charged_its_late_start_where_its_peers_began_at_once(
    tmp_path: Path,
) -> None:
    # rank 0 computes [0, 10) ms and arrives at the all_reduce at 10 ms; rank 1 begins 20 ms late, computes
    # [20, 30) ms and arrives at 30 ms; both done at 31 ms. Rank 1's first interval holds 20 ms of host idle
    # (its late start) against its peer's 0: run like it, rank 1 begins at 0, both arrive at 10 ms and are
    # done 1 ms (the recorded transfer) later: the step takes 11 ms instead of 31
    b = RunBuilder(2)
    for r, begin in ((0, 0), (1, 20 * MS)):
        rb = b.rank(r).step(0)
        rb.compute("fwd", 10 * MS, start_ns=begin)
        rb.collective(CommType.ALL_REDUCE, 4096, 31 * MS - (begin + 10 * MS))
    ix = build_index(load_run(b.write(tmp_path / "run")))
    res = analyze_blame(ix, analyze_skew(ix))
    assert res.baseline_step_ns == {0: 31 * MS}
    assert res.whatif_step_ns[1] == {0: 10 * MS + 1 * MS}
    assert {r.rank: r.straggler_cost_ns for r in res.records} == {1: 31 * MS - 11 * MS, 0: 0}


def test_of_ranks_whose_costs_are_equal_the_one_that_made_the_others_wait_is_ranked_first(
    tmp_path: Path,
) -> None:
    # with --max-simulations 0 every cost is 0: the report's top straggler was rank 0, which made no one
    # wait, above rank 2, at which every worst collective was blamed
    ix = build_index(load_run(build_run(tmp_path, STRAGGLER)))
    res = analyze_blame(ix, analyze_skew(ix), max_simulations=0)
    assert {r.straggler_cost_ns for r in res.records} == {0}
    top = res.records[0]
    assert top.rank == STRAGGLER.straggler_rank and not top.simulated
    assert top.caused_wait_ns == max(r.caused_wait_ns for r in res.records) > 0
    waits = [r.caused_wait_ns for r in res.records]
    assert waits == sorted(waits, reverse=True)


def _on_hosts(run: Path, hosts: dict[int, str]) -> Path:
    """``run`` with its manifest naming each rank's host."""
    write_manifest(run, dataclasses.replace(read_manifest(run), hosts=hosts))
    return run


SLOW_HOST = Scenario(straggler_ranks=(2, 3), straggler_ns=40 * MS, steps=5)


def test_a_host_whose_ranks_are_all_slow_costs_the_time_it_adds_though_each_rank_alone_costs_little(
    tmp_path: Path,
) -> None:
    # 2 gloo hosts of 2 ranks, host 1's ranks 200 ms a step slower: the stragglers table gave them 9.40 and
    # 2.11 ms a step (each rank's what-if leaves the host's other rank slow) and named no host; replayed
    # with both ranks' compute at the others', the steps took 59% less
    run = _on_hosts(build_run(tmp_path, SLOW_HOST), {0: "a", 1: "a", 2: "b", 3: "b"})
    ix = build_index(load_run(run))
    res = analyze_blame(ix, analyze_skew(ix))
    slow, fast = res.host_records
    assert (slow.host, slow.ranks, fast.host, fast.ranks) == ("b", [2, 3], "a", [0, 1])
    assert slow.simulated and slow.straggler_cost_ns == pytest.approx(SLOW_HOST.steps * 40 * MS, rel=0.03)
    assert slow.baseline_ns - slow.whatif_ns == slow.straggler_cost_ns
    assert abs(fast.straggler_cost_ns) < 0.01 * slow.straggler_cost_ns
    assert all(r.straggler_cost_ns < 0.1 * slow.straggler_cost_ns for r in res.records)
    result = analyze_run(load_run(run))
    tabled = tables(result)["blame_hosts"].to_pylist()
    assert [(t["host"], t["ranks"], t["straggler_cost_ns"]) for t in tabled] == [
        (h.host, h.ranks, h.straggler_cost_ns) for h in res.host_records
    ]
    shown = hosts_table(result)
    assert shown is not None
    console = Console(file=io.StringIO(), width=120)
    console.print(shown)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if "│" in line]
    cost = ms_text(slow.straggler_cost_ns / SLOW_HOST.steps)
    # no rank of host a is slower than the median anywhere: not simulated ('*')
    assert [r[:3] for r in rows] == [["b", "2-3", cost], ["a", "0-1", "0.000*"]]


def test_a_hosts_one_slow_rank_costs_the_host_what_it_costs_and_one_host_or_a_host_each_have_no_host_rows(
    tmp_path: Path, straggler: BlameResult
) -> None:
    run = _on_hosts(build_run(tmp_path, STRAGGLER), {0: "a", 1: "a", 2: "b", 3: "b"})
    ix = build_index(load_run(run))
    res = analyze_blame(ix, analyze_skew(ix))
    top = res.records[0]
    assert (res.host_records[0].host, res.host_records[0].straggler_cost_ns) == ("b", top.straggler_cost_ns)
    assert not straggler.host_records  # no hosts recorded
    for k, hosts in enumerate([dict.fromkeys(range(4), "a"), {r: f"h{r}" for r in range(4)}]):
        run = _on_hosts(build_run(tmp_path / f"{k}", STRAGGLER), hosts)  # one host; a host each
        ix = build_index(load_run(run))
        assert analyze_blame(ix, analyze_skew(ix)).host_records == []


def test_the_index_shares_the_models_gaps_and_the_traces_starts_where_they_hold_the_same_values(
    tmp_path: Path,
) -> None:
    run = load_run(build_run(tmp_path, STRAGGLER))
    ix = build_index(run)
    em = execution_model(run)
    for r, ri in ix.ranks.items():
        rt, m = run.ranks[r], em.ranks[r]
        assert np.array_equal(ri.sorted_start, rt.start_ns[ri.order])
        assert ri.sorted_start is rt.start_ns  # the rows are in start order already
        assert np.array_equal(ri.gap_ns, np.where(ri.has_deps, m.gap_ns, 0))
        assert ri.gap_ns is m.gap_ns  # 0 on every row without start edges already


def test_each_rows_interval_is_its_index_among_the_ranks_intervals_and_none_outside_them(
    tmp_path: Path,
) -> None:
    ix = build_index(load_run(build_run(tmp_path, STRAGGLER)))
    ivs = _all_intervals(ix)
    for r, iv in ivs.items():
        ri = ix.ranks[r]
        inside = ri.is_comp | ri.is_comm | ri.is_comm_comp | ri.is_untraced | ri.is_wait
        assert iv.slot.dtype == np.int32
        assert (iv.slot >= 0).tolist() == inside.tolist() and inside.any() and not inside.all()
        assert iv.slot.max() == iv.keys.size - 1  # every interval has rows
        work = np.where((ri.is_comp | ri.host_work) & inside, ri.work_ns, 0)
        comp = np.bincount(iv.slot[inside], weights=work[inside], minlength=iv.keys.size).astype(np.int64)
        assert comp.tolist() == iv.comp.tolist()


def test_blame_hands_the_lowerings_freed_memory_back_once_the_lowering_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ix = build_index(load_run(build_run(tmp_path, STRAGGLER)))
    skew = analyze_skew(ix)
    made: list[int] = []
    lowered = simulate_module.Simulator.__init__

    def lower(self: simulate_module.Simulator, *a: object, **k: object) -> None:
        lowered(self, *a, **k)
        made.append(len(calls))

    calls: list[int] = []
    monkeypatch.setattr(simulate_module.Simulator, "__init__", lower)
    monkeypatch.setattr(blame_module, "release_free_memory", lambda: calls.append(len(made)))
    analyze_blame(ix, skew)
    assert made == [0] and calls == [1]  # once, right after the one lowering


def test_a_ranks_longer_untraced_host_time_is_what_its_what_if_shortens_to_its_peers(tmp_path: Path) -> None:
    # 3 ranks, 2 back-to-back steps: each begins with untraced host time (a data loader; rank 2: 8 ms, the
    # others 1 ms; the first of the run follows no row), then runs aten::mm 2 ms and an all_reduce that ends
    # together (11 ms a step). The what-if gives rank 2 its peers' 1 ms of untraced time (the untraced nodes'
    # work, execution.host_idle_rows, each of them): steps of 1 + 2 + 1 ms, 8 ms against 22, a cost of 14 ms
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for s in range(2):
            rb.step(s)
            u = rb.compute("untraced", (8 if r == 2 else 1) * MS, start_ns=0 if s == 0 else None)
            mm = rb.compute("aten::mm", 2 * MS, deps=(u,))
            rb.collective(CommType.ALL_REDUCE, 1 << 20, (1 if r == 2 else 8) * MS, deps=(mm,))
    top = analyze_run(load_run(b.write(tmp_path / "run")), blame=True).stragglers[0]
    assert (top.rank, top.baseline_ns, top.whatif_ns, top.straggler_cost_ns) == (2, 22 * MS, 8 * MS, 14 * MS)
    assert top.cause == "host idle/gap +7.0 ms"


def test_a_rank_whose_gpu_alone_idled_longer_is_not_simulated_for_its_host_gaps(tmp_path: Path) -> None:
    # rank 2's GPU begins each kernel 4 ms after its launch (its peers' 10 us); its host ran as theirs. The
    # GPU's idle time is no host gap (execution.host_idle_rows), so the rank has no excess over its peers and
    # no what-if to simulate: before, every row's gap counted, its GPU intervals' 4 ms too, and it was
    # simulated (to no cost)
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for s in range(2):
            rb.step(s)
            t = s * 20 * MS
            late = MS if (r == 1 and s == 0) else 0
            mm = rb.compute("aten::mm", 5 * MS + late, start_ns=t)
            begin = t + (4 * MS if r == 2 else 10_000)
            rb.compute("sm90_gemm", MS // 10, start_ns=begin, stream=7, deps=(mm,), launch_ns=t)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 2 * MS - late if s == 0 else MS)
    res = analyze_run(load_run(b.write(tmp_path / "run")), blame=True)
    (gpu_late,) = [s for s in res.stragglers if s.rank == 2]
    assert (gpu_late.straggler_cost_ns, gpu_late.simulated, gpu_late.cause_kind) == (0, False, "none")
