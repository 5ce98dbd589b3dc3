"""Step breakdown: compute, exposed wait / transfer, overlapped communication and idle per rank per step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.analysis import analyze_run
from skewlens.analysis.breakdown import (
    MEAN_PARTS,
    OutlierStep,
    analyze_breakdown,
    outlier_steps,
    rank_means,
    step_comm,
    steps_compiled,
)
from skewlens.analysis.index import Coverage, build_index
from skewlens.analysis.records import StepBreakdownRecord
from skewlens.analysis.render import outliers_note, uneven_cost_note
from skewlens.analysis.skew import analyze_skew
from skewlens.profiler.store import load_run
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import UNTRACED_NODE_NAME, CommType
from skewlens.replay.execution import execution_model
from skewlens.replay.streaming import CATEGORIES, rank_categories


def test_coverage_merges_overlapping_intervals_and_measures_windows() -> None:
    starts = np.array([0, 2, 10, 12, 30], dtype=np.int64)
    ends = np.array([5, 4, 15, 20, 30], dtype=np.int64)  # [0,5) ∪ [10,20); [30,30) is empty
    cov = Coverage.of(starts, ends)
    assert cov.starts.tolist() == [0, 10]
    assert cov.ends.tolist() == [5, 20]
    assert cov.total_ns == 5 + 10
    a = np.array([-5, 3, 6, 14], dtype=np.int64)
    b = np.array([100, 12, 9, 40], dtype=np.int64)
    assert cov.between(a, b).tolist() == [15, (5 - 3) + (12 - 10), 0, 20 - 14]


def test_overlap_on_another_stream_is_hidden_and_the_rest_is_split_into_wait_and_transfer(
    tmp_path: Path,
) -> None:
    comp1_end, arrive0, arrive1, coll_end, comp2_start, comp2_end = (
        5 * MS,
        4 * MS,
        6 * MS,
        8 * MS,
        9 * MS,
        10 * MS,
    )
    b = RunBuilder(2)
    for r, arrive in ((0, arrive0), (1, arrive1)):
        rb = b.rank(r).step(0)
        rb.compute("kernel_a", comp1_end, start_ns=0, stream=7)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, coll_end - arrive, start_ns=arrive, stream=9)
        rb.compute("kernel_b", comp2_end - comp2_start, start_ns=comp2_start, stream=7)
    recs = {x.rank: x for x in analyze_breakdown(build_index(load_run(b.write(tmp_path / "run"))))}
    r0 = recs[0]
    assert r0.step_ns == comp2_end
    assert r0.compute_ns == comp1_end + (comp2_end - comp2_start)
    assert r0.overlapped_comm_ns == comp1_end - arrive0
    assert (
        r0.exposed_wait_ns == arrive1 - comp1_end
    )  # the wait [arrive0, arrive1) minus the part under compute
    assert r0.exposed_transfer_ns == coll_end - arrive1
    assert r0.idle_ns == comp2_start - coll_end
    r1 = recs[1]
    assert r1.overlapped_comm_ns == 0
    assert r1.exposed_wait_ns == 0
    assert r1.idle_ns == (arrive1 - comp1_end) + (comp2_start - coll_end)


def test_a_wait_node_waits_for_peers_only_until_the_last_member_arrived_and_the_rest_is_transfer(
    tmp_path: Path,
) -> None:
    # each rank computes, issues an async all_reduce on a communication stream, computes 1 ms more, then
    # blocks in wait_tensor until the all_reduce completed (+50 µs of its own overhead); rank 0 arrives
    # first, rank 1 (the straggler) last
    arrive = {0: 2 * MS, 1: 6 * MS}
    coll_end, overhead_ns, comm_stream = 9 * MS, 50_000, 9
    b = RunBuilder(2)
    for r, a in arrive.items():
        rb = b.rank(r).step(0)
        mm = rb.compute("aten::mm", a, start_ns=0)
        ar = rb.collective(
            CommType.ALL_REDUCE, 1 << 20, coll_end - a, start_ns=a, stream=comm_stream, deps=(mm,)
        )
        relu = rb.compute("aten::relu", MS, start_ns=a, deps=(mm,))
        w_end = coll_end + overhead_ns
        w = rb.compute("_c10d_functional::wait_tensor", w_end - (a + MS), start_ns=a + MS, deps=(relu, ar))
        rb.compute("aten::linear", MS, start_ns=w_end, deps=(w,))
    ix = build_index(load_run(b.write(tmp_path / "run")))
    recs = {x.rank: x for x in analyze_breakdown(ix)}
    # rank 0 waits for rank 1 from its arrival (2 ms) to rank 1's (6 ms), of which [2, 3) is under relu;
    # its wait_tensor, blocked [3, 9), waits for peers until 6 ms, then for the transfer
    r0 = recs[0]
    assert r0.compute_ns == 2 * MS + MS + MS
    assert r0.exposed_wait_ns == 3 * MS
    assert r0.exposed_transfer_ns == 3 * MS + overhead_ns
    assert r0.overlapped_comm_ns == MS
    assert r0.idle_ns == 0
    # rank 1 arrived last: its wait_tensor, blocked [7, 9), waits for the transfer alone
    r1 = recs[1]
    assert r1.compute_ns == 6 * MS + MS + MS
    assert r1.exposed_wait_ns == 0
    assert r1.exposed_transfer_ns == 2 * MS + overhead_ns
    assert r1.overlapped_comm_ns == MS
    assert r1.idle_ns == 0
    # the same split as the skew table's per-member exposed wait
    skew = {
        r: int(w) for e in analyze_skew(ix).events for r, w in zip(e.ranks, e.exposed_wait_ns, strict=True)
    }
    assert skew == {0: r0.exposed_wait_ns, 1: r1.exposed_wait_ns}


def test_parts_add_up_to_the_step_and_the_straggler_computes_while_peers_wait(tmp_path: Path) -> None:
    sc = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=4)
    recs = analyze_breakdown(build_index(load_run(build_run(tmp_path, sc))))
    assert len(recs) == sc.world_size * sc.steps
    for x in recs:
        assert x.compute_ns + x.exposed_wait_ns + x.exposed_transfer_ns + x.idle_ns == x.step_ns
        assert (
            min(x.compute_ns, x.exposed_wait_ns, x.exposed_transfer_ns, x.idle_ns, x.overlapped_comm_ns) >= 0
        )
    mean = {
        r: {
            k: float(np.mean([getattr(x, k) for x in recs if x.rank == r]))
            for k in ("compute_ns", "exposed_wait_ns")
        }
        for r in range(sc.world_size)
    }
    assert mean[2]["compute_ns"] - mean[0]["compute_ns"] == pytest.approx(sc.straggler_ns, rel=0.02)
    assert mean[2]["exposed_wait_ns"] < 1 * MS
    # rank 3 waits for rank 2 at the all_gather; ranks 0 and 1 wait at the all_reduce
    for r in (0, 1, 3):
        assert mean[r]["exposed_wait_ns"] == pytest.approx(sc.straggler_ns, rel=0.05)


def test_rank_means_average_each_ranks_steps_and_the_least_waiting_ranks_include_the_straggler(
    tmp_path: Path,
) -> None:
    sc = Scenario(world_size=6, straggler_rank=4, straggler_ns=30 * MS, steps=3)
    recs = analyze_breakdown(build_index(load_run(build_run(tmp_path, sc))))
    means = rank_means(recs)
    assert means.ranks == list(range(sc.world_size)) and means.steps == [sc.steps] * sc.world_size
    for i, r in enumerate(means.ranks):
        mine = [b for b in recs if b.rank == r]
        idle, wait = MEAN_PARTS.index("idle"), MEAN_PARTS.index("exposed wait")
        assert means.mean_ns[i, idle] == sum(b.idle_ns for b in mine) / len(mine)
        assert means.mean_ns[i, wait] == sum(b.exposed_wait_ns for b in mine) / len(mine)
    shown, rest = means.least_waiting(2)
    assert sc.straggler_rank in shown.ranks and len(rest.ranks) == sc.world_size - 2
    assert sorted(shown.ranks + rest.ranks) == means.ranks
    everyone, nobody = means.least_waiting(0)
    assert everyone.ranks == means.ranks and nobody.ranks == []


def _steps(lengths_ms: dict[int, list[float]]) -> list[StepBreakdownRecord]:
    out = []
    for r, lengths in lengths_ms.items():
        t = 0
        for s, ms in enumerate(lengths):
            ns = int(ms * MS)
            out.append(StepBreakdownRecord(
                rank=r, step=s, start_ns=t, end_ns=t + ns, step_ns=ns, compute_ns=ns, exposed_wait_ns=0,
                exposed_transfer_ns=0, overlapped_comm_ns=0, gpu_compute_ns=0, idle_ns=0, complete=True,
            ))  # fmt: skip
            t += ns
    return out


def test_a_step_far_longer_than_its_ranks_median_is_named_with_the_rank_where_it_is_longest() -> None:
    recs = _steps({0: [30, 10, 11, 10, 12], 1: [50, 10, 10, 10, 10], 2: [12, 10, 11, 10, 10], 3: [10, 40]})
    (found,) = outlier_steps(recs)
    # rank 1's 50 ms is 5x its median (10); rank 0's 30 ms 2.7x its 11; rank 2's 12 is under 1.5x; rank 3
    # has too few steps for a median
    assert (found.step, found.ranks, found.worst_rank) == (0, 2, 1)
    assert (found.worst_step_ns, found.median_step_ns) == (50 * MS, 10 * MS)
    assert (
        found.describe()
        == "step 0 took 5.0x the median step (on 2 ranks, e.g. rank 1: 50.000 against 10.000 ms)"
    )
    assert outlier_steps(_steps({0: [10, 14, 10, 11], 1: [11, 10, 10, 10]})) == []
    assert outlier_steps([]) == []


def test_a_long_run_with_more_outlier_steps_than_the_note_names_names_the_longest_first(
    tmp_path: Path,
) -> None:
    b = RunBuilder(2)  # a run of compute alone: the steps below all make as many collectives (none)
    for r in range(2):
        b.rank(r).step(0).compute("aten::mm", MS, start_ns=0)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    # 2,000 steps of 10 ms on rank 0, of which the first three (warm-up) and five more are over 1.5x its
    # median; the longest are late in the run
    lengths = [10.0] * 2000
    for step, ms in {0: 16, 1: 17, 2: 16, 700: 18, 1200: 60, 1500: 45, 1800: 20, 1999: 16}.items():
        lengths[step] = ms
    result.breakdown = _steps({0: lengths, 1: [10.0] * 2000})
    assert outliers_note(result) == (
        "step 1200 took 6.0x the median step (rank 0: 60.000 against 10.000 ms); step 1500 took 4.5x the "
        "median step (rank 0: 45.000 against 10.000 ms); step 1800 took 2.0x the median step (rank 0: 20.000 "
        "against 10.000 ms); and 5 more steps over 1.5x, none longer against their median: the means include "
        "them (a first profiled step often holds warm-up); every step is in step_breakdown.parquet"
    )
    # one more than it names: 'and 1 more step(s) ..., the means include it' of four steps
    result.breakdown = _steps({0: [16, 10, 10, 17, 10, 18, 10, 19, 10, 10, 10], 1: [10.0] * 11})
    assert (note := outliers_note(result)) is not None and note.endswith(
        "; and 1 more step over 1.5x, none longer against its median: the means include them (a first "
        "profiled step often holds warm-up); every step is in step_breakdown.parquet"
    )
    # one step alone: 'it'
    result.breakdown = _steps({0: [16, 10, 10, 10, 10], 1: [10.0] * 5})
    assert (
        (note := outliers_note(result)) is not None
        and note.startswith("step 0 took 1.6x")
        and (": the means include it (a first profiled step" in note)
    )
    # of as many as it names, all of them, in step order
    result.breakdown = _steps({0: [16, 10, 10, 10, 30, 10], 1: [10] * 6})
    note = outliers_note(result)
    assert note is not None
    assert note.startswith("step 0 took 1.6x the median step (rank 0: 16.000 against 10.000 ms); step 4 took")


def test_an_outlier_note_of_a_rank_that_drifts_slower_names_its_last_steps_without_warm_up(
    tmp_path: Path,
) -> None:
    # a rank 0.5 ms slower each step (its peer waits for it: both ranks' steps grow), 60 steps from 10 ms: the
    # last five are over 1.5x the median (24.75 ms). Before, the note added "(a first profiled step often
    # holds warm-up)" of them
    result = analyze_run(load_run(build_run(tmp_path, Scenario(world_size=2, steps=3))), blame=False)
    drift = [10 + 0.5 * s for s in range(60)]
    result.breakdown = _steps({0: drift, 1: drift})
    assert outliers_note(result) == (
        "step 59 took 1.6x the median step (on 2 ranks, e.g. rank 0: 39.500 against 24.750 ms); step 58 took "
        "1.6x the median step (on 2 ranks, e.g. rank 0: 39.000 against 24.750 ms); step 57 took 1.6x the "
        "median step (on 2 ranks, e.g. rank 0: 38.500 against 24.750 ms); and 2 more steps over 1.5x, none "
        "longer against their median: the means include them; every step is in step_breakdown.parquet"
    )
    # the same with a slow third profiled step (of steps numbered from 4: a window that began later) says it
    result.breakdown = _steps({0: [12, 12, 40, *drift[3:]], 1: drift})
    result.breakdown = [replace(b, step=b.step + 4) for b in result.breakdown]
    note = outliers_note(result)
    assert note is not None and "; step 6 took 1.6x the median step (rank 0" in note
    assert note.endswith(
        "include them (a first profiled step often holds warm-up); every step is in step_breakdown.parquet"
    )


def test_an_outlier_note_of_exactly_as_many_steps_as_it_names_adds_no_more(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, Scenario(world_size=2, steps=3))), blame=False)
    result.breakdown = _steps({0: [16, 10, 10, 17, 10, 18, 10, 10, 10, 10], 1: [10.0] * 10})
    assert outliers_note(result) == (
        "step 0 took 1.6x the median step (rank 0: 16.000 against 10.000 ms); step 3 took 1.7x the median "
        "step (rank 0: 17.000 against 10.000 ms); step 5 took 1.8x the median step (rank 0: 18.000 against "
        "10.000 ms): the means include them (a first profiled step often holds warm-up); every step is in "
        "step_breakdown.parquet"
    )


def _decode_loop(tmp_path: Path, *, slow: int | None, prefill: int) -> Path:
    """2 ranks of a serving loop that marked each decode step a step, 6 steps: one 4 KB all_reduce after 1 ms
    of compute, 1 ms of transfer; step ``slow`` computes 5 ms, step ``prefill`` makes 16 all_reduces of 64 KB
    after 2 ms each."""
    b = RunBuilder(2)
    for r in range(2):
        t = 0
        for s in range(6):
            rb = b.rank(r).step(s)
            calls, size, comp = (
                (16, 64 << 10, 2 * MS) if s == prefill else (1, 4 << 10, 5 * MS if s == slow else MS)
            )
            for _ in range(calls):
                rb.compute("aten::mm", comp, start_ns=t)
                rb.collective(CommType.ALL_REDUCE, size, MS, start_ns=t + comp)
                t += comp + MS
    return b.write(tmp_path / "run")


def test_a_prefill_among_decode_steps_is_named_as_more_work_and_a_slow_step_is_not(tmp_path: Path) -> None:
    # a serving loop marked each decode step a step: one 4 KB all_reduce after 1 ms of compute, 1 ms of
    # transfer; step 1 is slow (5 ms of compute), step 4 a prefill (16 all_reduces of 64 KB after 2 ms each).
    # Before, the note put both down to warm-up alike ('a first profiled step often holds warm-up')
    result = analyze_run(load_run(_decode_loop(tmp_path, slow=1, prefill=4)), blame=False)
    slow, prefill = outlier_steps(result.breakdown, step_work=step_comm(result.index))
    assert (slow.step, slow.more_work, prefill.step, prefill.more_work) == (1, False, 4, True)
    assert (prefill.step_calls, prefill.median_step_calls) == (16, 1)
    assert (prefill.step_bytes, prefill.median_step_bytes) == (16 * (64 << 10), 4 << 10)
    assert outliers_note(result) == (
        "step 1 took 3.0x the median step (on 2 ranks, e.g. rank 0: 6.000 against 2.000 ms); step 4 took "
        "24.0x the median step (on 2 ranks, e.g. rank 0: 48.000 against 2.000 ms; 16.0x the collectives and "
        "256.0x the bytes of the median step): the means include them (1 of them made or moved over 1.5x the "
        "collectives or bytes of the median step: more work, such as two iterations in one step (an "
        "optimizer.step() that did not run: a GradScaler's skip), an evaluation pass, a prefill or a longer "
        "request; a first profiled step often holds warm-up); every step is in step_breakdown.parquet"
    )


def test_a_prefill_in_the_fourth_profiled_step_is_more_work_and_no_warm_up(tmp_path: Path) -> None:
    # the decode loop above without its slow step, its prefill in step 3: the fourth profiled step, past the
    # first WARM_UP_STEPS (3), so the note says more work and nothing of warm-up, its parenthesis closed
    # after the reason it gives
    result = analyze_run(load_run(_decode_loop(tmp_path, slow=None, prefill=3)), blame=False)
    assert outliers_note(result) == (
        "step 3 took 24.0x the median step (on 2 ranks, e.g. rank 0: 48.000 against 2.000 ms; 16.0x the "
        "collectives and 256.0x the bytes of the median step): the means include it (it made or moved over "
        "1.5x the collectives or bytes of the median step: more work, such as two iterations in one step (an "
        "optimizer.step() that did not run: a GradScaler's skip), an evaluation pass, a prefill or a longer "
        "request); every step is in step_breakdown.parquet"
    )


def test_a_step_that_holds_two_iterations_after_a_skipped_optimizer_step_is_named_as_such(
    tmp_path: Path,
) -> None:
    # a GradScaler-style loop on 2 ranks, 6 steps: each iteration 1 ms of compute, the gradient all_reduce
    # (32 KB, 1 ms) and the inf flag's (4 B, 1 ms); at step 3 optimizer.step() did not run after the first
    # iteration, which marks no step, so step 3 holds two iterations. Measured on 2 gloo ranks skipping every
    # 5th step (14 iterations, window 1:1:9): steps 4 and 8 took 1.8x the median step with 2.0x its
    # collectives and bytes, and the note named only an evaluation pass, a prefill or a longer request
    b = RunBuilder(2)
    for r in range(2):
        t = 0
        for s in range(6):
            rb = b.rank(r).step(s)
            for _ in range(2 if s == 3 else 1):
                rb.compute("aten::mm", MS, start_ns=t)
                rb.collective(CommType.ALL_REDUCE, 32 << 10, MS, start_ns=t + MS)
                rb.collective(CommType.ALL_REDUCE, 4, MS, start_ns=t + 2 * MS)
                t += 3 * MS
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    (merged,) = outlier_steps(result.breakdown, step_work=step_comm(result.index))
    assert (merged.step, merged.more_work, merged.step_calls, merged.median_step_calls) == (3, True, 4, 2)
    assert outliers_note(result) == (
        "step 3 took 2.0x the median step (on 2 ranks, e.g. rank 0: 6.000 against 3.000 ms; 2.0x the "
        "collectives and 2.0x the bytes of the median step): the means include it (it made or moved over "
        "1.5x the collectives or bytes of the median step: more work, such as two iterations in one step (an "
        "optimizer.step() that did not run: a GradScaler's skip), an evaluation pass, a prefill or a longer "
        "request); every step is in step_breakdown.parquet"
    )


def test_a_step_in_which_torch_compile_compiled_is_named_as_warm_up_and_a_slow_step_is_not(
    tmp_path: Path,
) -> None:
    # each step 1 ms of compute before a 4 KB all_reduce of 1 ms; in step 0 torch.compile compiles on both
    # ranks (dynamo's record functions, 30 ms on rank 0 and 50 on rank 1), step 3 is slow on rank 0 (6 ms of
    # compute). Before, the compile step read as any long step (a 2-rank compiled TP capture from step 0:
    # 'more work, such as a prefill', its slower compiler's rank the top straggler)
    b = RunBuilder(2)
    for r in range(2):
        t = 0
        for s in range(5):
            rb = b.rank(r).step(s)
            if s == 0:
                # rank 1's compile is dynamo's frame alone, as the ops level keeps it (inner events dropped)
                name = "dynamo" if r else "bytecode_tracing (dynamo_timed)"
                rb.compute(name, (30 + 20 * r) * MS, start_ns=t)
                t += (30 + 20 * r) * MS
            # 0.1 ms of the step's compute: a recompile on rank 1 only, in the step rank 0 is slow in; and a
            # name that only begins with dynamo's frame's (only that name itself is a compile)
            before = {(1, 3): "recompile (dynamo_timed)", (0, 2): "dynamo_cache_lookup"}.get((r, s))
            if before is not None:
                rb.compute(before, MS // 10, start_ns=t)
                t += MS // 10
            comp = 6 * MS if (r, s) == (0, 3) else MS - (MS // 10 if before else 0)
            rb.compute("aten::mm", comp, start_ns=t)
            rb.collective(CommType.ALL_REDUCE, 4 << 10, MS, start_ns=t + comp)
            t += comp + MS
    result = analyze_run(load_run(b.write(tmp_path / "run", level="ops")), blame=False)
    assert steps_compiled(result.index) == {(0, 0), (1, 0), (1, 3)}
    first, slow = outlier_steps(
        result.breakdown, step_work=step_comm(result.index), compiled=steps_compiled(result.index)
    )
    assert (first.step, first.compiled, first.more_work) == (0, True, False)
    assert (slow.step, slow.compiled) == (3, False)
    assert outliers_note(result) == (
        "step 0 took 26.0x the median step (on 2 ranks, e.g. rank 1: 52.000 against 2.000 ms; torch.compile "
        "compiled in it); step 3 took 3.5x the median step (rank 0: 7.000 against 2.000 ms): the means "
        "include them (1 of them compiled (torch.compile: warm-up, not skew); a first profiled step often "
        "holds warm-up); every step is in step_breakdown.parquet"
    )
    # the stragglers table's uneven-cost note says so of a rank's costliest step in which it compiled
    costs = SimpleNamespace(step_records=[
        SimpleNamespace(rank=1, step=s, straggler_cost_ns=c * MS) for s, c in enumerate((20, 1, 1, 1, 1))
    ], baseline_step_ns=dict.fromkeys(range(5), 2 * MS))  # fmt: skip
    faked = SimpleNamespace(blame=costs, index=result.index)
    assert uneven_cost_note(faked, SimpleNamespace(rank=1, simulated=True)) == (  # type: ignore[arg-type]
        "rank 1's cost is uneven over its steps: step 0 cost 20.000 ms (torch.compile compiled in it on this "
        "rank: warm-up), 83% of it, its median step 1.000 ms; every step is in blame_steps.parquet"
    )
    # rank 0's costliest step 3, in which only rank 1 recompiled: no warm-up said of it
    costs.step_records = [
        SimpleNamespace(rank=0, step=s, straggler_cost_ns=c * MS) for s, c in enumerate((1, 1, 1, 20, 1))
    ]
    assert uneven_cost_note(faked, SimpleNamespace(rank=0, simulated=True)).startswith(  # type: ignore[arg-type,union-attr]
        "rank 0's cost is uneven over its steps: step 3 cost 20.000 ms, 83% of it"
    )
    # steps 0 and 3 named together: the warm-up said of those in which the rank compiled (rank 1: both;
    # rank 0: step 0 alone), 40 of 43 ms
    costs.step_records = [
        SimpleNamespace(rank=r, step=s, straggler_cost_ns=c * MS)
        for r in (0, 1)
        for s, c in enumerate((20, 1, 1, 20, 1))
    ]
    said = "cost is uneven over its steps: steps 0 and 3 cost 20.000 and 20.000 ms (torch.compile compiled in"
    assert uneven_cost_note(faked, SimpleNamespace(rank=1, simulated=True)).startswith(  # type: ignore[arg-type,union-attr]
        f"rank 1's {said} steps 0 and 3 on this rank: warm-up), 93% of it, its median step 1.000 ms"
    )
    assert uneven_cost_note(faked, SimpleNamespace(rank=0, simulated=True)).startswith(  # type: ignore[arg-type,union-attr]
        f"rank 0's {said} step 0 on this rank: warm-up), 93% of it"
    )
    # one run of two steps, 0-1, rank 0 compiling in step 0 alone: that step is said, not "it" (which reads
    # as the run's every step), 40 of 43 ms
    costs.step_records = [
        SimpleNamespace(rank=0, step=s, straggler_cost_ns=c * MS) for s, c in enumerate((20, 20, 1, 1, 1))
    ]
    assert uneven_cost_note(faked, SimpleNamespace(rank=0, simulated=True)) == (  # type: ignore[arg-type]
        "rank 0's cost is uneven over its steps: steps 0-1 cost 20.000 and 20.000 ms (torch.compile compiled "
        "in step 0 on this rank: warm-up), 93% of it, its median step 1.000 ms; every step is in "
        "blame_steps.parquet"
    )


def test_a_step_is_more_work_only_past_1_5x_its_ranks_median_calls_or_bytes_an_even_count_averaged() -> None:
    # rank 0's 4 steps: 20 ms, then 10 ms each; calls 3, 2, 1, 3 (median (2 + 3) // 2 = 2, not the upper 3);
    # bytes 3, 2, 2, 2 KB. Step 0's 3 calls and 3 KB are exactly 1.5x the medians: not more work
    recs = _steps({0: [20, 10, 10, 10]})
    work = {(0, 0): (3, 3072), (0, 1): (2, 2048), (0, 2): (1, 2048), (0, 3): (3, 2048)}
    (found,) = outlier_steps(recs, step_work=work)
    assert (found.step_calls, found.median_step_calls, found.step_bytes, found.median_step_bytes) == (
        3,
        2,
        3072,
        2048,
    )
    assert not found.more_work and found.describe().endswith("against 10.000 ms)")
    more = replace(found, step_calls=4)
    assert more.more_work and more.describe().endswith("10.000 ms; 2.0x the collectives of the median step)")
    more = replace(found, step_bytes=3073)
    assert more.more_work and more.describe().endswith("10.000 ms; 1.5x the bytes of the median step)")


def test_each_steps_communication_is_counted_from_step_0(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in range(2):
        for s, calls in enumerate((2, 1)):
            for _ in range(calls):
                b.rank(r).step(s).collective(CommType.ALL_REDUCE, 4096 * (s + 1), MS)
    index = analyze_run(load_run(b.write(tmp_path / "run")), blame=False).index
    assert step_comm(index) == {
        (r, s): (c, c * 4096 * (s + 1)) for r in range(2) for s, c in enumerate((2, 1))
    }


def test_the_timeline_draws_each_row_as_the_analyses_index_counts_it(tmp_path: Path) -> None:
    # compute, untraced host time, an async all_reduce and the wait_tensor blocked on it: the timeline's
    # category of each row comes from the same execution-model rule as the index's masks
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        mm = rb.compute("aten::mm", 2 * MS, start_ns=0)
        gap = rb.compute(UNTRACED_NODE_NAME, MS, start_ns=2 * MS, deps=(mm,))
        ar = rb.collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=3 * MS, stream=9, deps=(gap,))
        w = rb.compute("_c10d_functional::wait_tensor", 3 * MS, start_ns=4 * MS, deps=(gap, ar))
        rb.compute("aten::relu", MS, start_ns=7 * MS, deps=(w,))
    ix = build_index(load_run(b.write(tmp_path / "run")))
    em = execution_model(ix.run)
    for r, ri in ix.ranks.items():
        drawn = [CATEGORIES[c] for c in rank_categories(ri.trace, em.ranks[r])]
        counted = np.full(len(ri.trace), "other", dtype=object)
        counted[ri.is_comm] = "collective"
        counted[ri.is_comp | ri.host_work] = "compute"
        counted[ri.is_wait & ~ri.host_work] = "wait"
        counted[ri.is_untraced] = "untraced"
        assert drawn == counted.tolist()
        assert sorted(set(drawn)) == ["collective", "compute", "other", "untraced", "wait"]


def _three_rank_run(path: Path, ranks: tuple[int, ...] = (0, 1, 2)) -> Path:
    """Ranks ``ranks`` of a world of 3 (the others without a trace): 2 steps of a compute and an all_reduce
    each."""
    b = RunBuilder(3)
    for r in ranks:
        rb = b.rank(r)
        for s in range(2):
            rb.step(s)
            rb.compute("aten::mm", 2 * MS, start_ns=s * 3 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, MS // 2)
    return b.write(path)


def test_a_step_is_complete_only_where_every_rank_of_the_world_recorded_it(tmp_path: Path) -> None:
    # a run whose rank 2 crashed and left no trace (the manifest lists it among missing_ranks; read with a
    # warning, or with lenient where its trace file is gone) said complete = True of every step of the
    # ranks kept, so a nightly dashboard could not tell that night from a whole one
    def complete(run: Path, *, lenient: bool = False) -> dict[tuple[int, int], bool]:
        rt = load_validated(run, lenient=True) if lenient else load_run(run)
        return {(x.rank, x.step): x.complete for x in analyze_breakdown(build_index(rt))}

    whole = complete(_three_rank_run(tmp_path / "whole"))
    assert whole == {(r, s): True for r in range(3) for s in range(2)}
    crashed = _three_rank_run(tmp_path / "crashed", ranks=(0, 1))
    assert load_run(crashed).manifest.missing_ranks == (2,)
    assert complete(crashed) == {(r, s): False for r in range(2) for s in range(2)}
    gone = _three_rank_run(tmp_path / "gone")
    (gone / "rank-2.et").unlink()  # listed among the ranks, its trace file missing: lenient leaves it out
    assert complete(gone, lenient=True) == {(r, s): False for r in range(2) for s in range(2)}


def test_a_step_whose_collectives_a_flight_recorder_lost_is_not_complete_on_any_rank(tmp_path: Path) -> None:
    # every rank recorded steps 0-2; rank 1's recorder lost step 1's all_reduce (declared in the manifest's
    # lost_collectives, as a capture does): that step's waits are partial on both ranks
    from skewlens.profiler.manifest import LostCollectives, read_manifest, write_manifest

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(3):
            rb.step(s)
            rb.compute("aten::mm", 2 * MS, start_ns=s * 3 * MS)
            if r != 1 or s != 1:
                rb.collective(CommType.ALL_REDUCE, 1 << 20, MS // 2, seq=s)
    run = b.write(tmp_path / "run")
    lost = LostCollectives(pg_name="0", first_seq=1, last_seq=1, steps=(1,), ranks=(1,))
    write_manifest(run, replace(read_manifest(run), lost_collectives=(lost,)))
    rt = load_run(run)
    assert rt.incomplete_steps == (1,)
    got = {(x.rank, x.step): x.complete for x in analyze_breakdown(build_index(rt))}
    assert got == {(r, s): s != 1 for r in range(2) for s in range(3)}


def test_a_local_sgd_average_that_mostly_waited_for_a_late_peer_is_no_more_work() -> None:
    # rank 0 of Local SGD averaging every 4th step: local steps of 3 ms with one call (DDP's all_reduce on a
    # group of one), the average's step 2 calls, 2x the bytes, 140 ms of which 127 waiting for the slow
    # rank. Before: 'more work, such as an evaluation pass'
    recs = _steps({0: [3, 3, 3, 140, 3, 3, 3, 131]})
    recs = [
        replace(b, exposed_wait_ns=(127 if b.step == 3 else 119 if b.step == 7 else 0) * MS) for b in recs
    ]
    work = {(0, s): ((2, 2048) if s in (3, 7) else (1, 1024)) for s in range(8)}
    first, second = outlier_steps(recs, step_work=work)
    assert (first.step, first.more_work, second.step, second.more_work) == (3, False, 7, False)
    assert first.waited
    assert first.describe() == (
        "step 3 took 46.7x the median step (rank 0: 140.0 against 3.000 ms; 2.0x the collectives and 2.0x "
        "the bytes of the median step; 127.0 ms of it waiting for its peers)"
    )
    # a step that waited under half its excess did more work still
    busy = replace(first, waited_ns=60 * MS)
    assert busy.more_work and not busy.waited


def test_a_step_whose_wait_for_its_peers_is_half_its_excess_over_the_median_mostly_waited() -> None:
    # 140 ms against a median of 3: 137 ms over it, half of which is 68.5 ms
    half = OutlierStep(
        step=3, ranks=1, worst_rank=0, worst_step_ns=140 * MS, median_step_ns=3 * MS, step_calls=2,
        median_step_calls=1, waited_ns=137 * MS // 2,
    )  # fmt: skip
    assert (half.waited, half.more_work) == (True, False)
    under = replace(half, waited_ns=137 * MS // 2 - 1)
    assert (under.waited, under.more_work) == (False, True)
