"""Per (rank, step) summary of a simulated replay and its rendering."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
from rich.console import Console
from test_analysis_scenarios import build_eager_send
from test_execution_model import _contradicting_clocks

from skewlens.profiler.manifest import StepSpan, read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.render import summary_table
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.summary import replayed_step_marks, summarize

MS = 1_000_000


def test_the_early_rank_waits_for_the_late_one_and_transfers_are_exposed(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r, compute_ms in ((0, 2), (1, 5)):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=compute_ms * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=(5 - compute_ms) * MS + 300_000)
    rt = load_run(b.write(tmp_path / "run"))
    rows = {s.rank: s for s in summarize(rt, simulate(rt))}
    assert rows[0].wait_ns == 3 * MS
    assert rows[1].wait_ns == 0
    assert (rows[0].exposed_wait_ns, rows[1].exposed_wait_ns) == (3 * MS, 0)
    assert rows[0].exposed_transfer_ns == rows[1].exposed_transfer_ns == 300_000
    assert (rows[0].compute_ns, rows[1].compute_ns) == (2 * MS, 5 * MS)
    assert rows[0].comm_ns == 3 * MS + 300_000
    assert rows[0].step_time_ns == rows[1].step_time_ns == 5 * MS + 300_000


def test_transfer_hidden_under_compute_on_another_stream_is_not_exposed(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS, start_ns=0, stream=7)
        rb.compute("aten::mm", dur_ns=600_000, start_ns=0)
    rt = load_run(b.write(tmp_path / "run"))
    rows = summarize(rt, simulate(rt))
    assert [(s.exposed_wait_ns, s.exposed_transfer_ns) for s in rows] == [(0, 400_000)] * 2


def test_untraced_host_time_is_not_compute_and_the_replay_counts_compute_as_the_breakdown_does(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.api import analyze_run
    from skewlens.profiler.vocab import UNTRACED_NODE_NAME

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        for k in range(2):
            rb = b.rank(r).step(k)
            rb.compute("aten::mm", dur_ns=2 * MS)
            rb.compute(UNTRACED_NODE_NAME, dur_ns=(r + 1) * MS)  # the capture's host time in no operator
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS)
    rt = load_run(b.write(tmp_path / "run"))
    rows = {(s.rank, s.step): s.compute_ns for s in summarize(rt, simulate(rt))}
    assert set(rows.values()) == {2 * MS}
    breakdown = {(x.rank, x.step): x.compute_ns for x in analyze_run(rt, blame=False).breakdown}
    assert rows == breakdown


def test_one_collectives_transfer_during_anothers_wait_is_counted_once_as_the_breakdown_counts_it(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.api import analyze_run

    # two concurrent collectives on two streams (DDP's buckets): A moves its data during [0, 1 ms) while
    # rank 0 waits for rank 1 at B until 2 ms; B then transfers until 3 ms. Rank 0's 3 ms of exposed
    # communication are 2 ms of waiting and 1 ms of transfer; counting each collective's transfer apart
    # made it 2 ms of transfer beside the 2 ms of waiting (4 ms in a 3 ms step)
    b = RunBuilder(world_size=2)
    for r, b_start in ((0, 0), (1, 2 * MS)):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS, start_ns=0, stream=7)
        rb.collective(
            CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=3 * MS - b_start, start_ns=b_start, stream=8
        )
    rt = load_run(b.write(tmp_path / "run"))
    rows = {s.rank: s for s in summarize(rt, simulate(rt))}
    assert (rows[0].exposed_wait_ns, rows[0].exposed_transfer_ns) == (2 * MS, MS)
    assert rows[0].wait_ns == 2 * MS  # every wait, exposed or not (none is under compute here)
    breakdown = {
        x.rank: (x.exposed_wait_ns, x.exposed_transfer_ns) for x in analyze_run(rt, blame=False).breakdown
    }
    assert {r: (s.exposed_wait_ns, s.exposed_transfer_ns) for r, s in rows.items()} == breakdown


def test_the_summary_table_shows_one_row_per_rank_in_ms(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        for k in range(2):
            b.rank(r).step(k).compute("x", dur_ns=(r + 1) * MS)
    rt = load_run(b.write(tmp_path / "run"))
    buf = io.StringIO()
    Console(file=buf, width=120).print(summary_table(summarize(rt, simulate(rt)), title="T"))
    text = buf.getvalue()
    assert "1.000" in text and "2.000" in text
    assert text.count("│    0 │") == 1 and text.count("│    1 │") == 1


def test_the_summary_table_of_steps_of_seconds_and_an_hour_shows_every_figure_whole_at_80_columns() -> None:
    from rich.console import Console

    from skewlens.replay.render import summary_table
    from skewlens.replay.summary import SummaryRecord

    def row(r: int, step_ns: int, recorded_ns: int) -> SummaryRecord:
        return SummaryRecord(
            rank=r, source_rank=r, step=0, step_time_ns=step_ns, recorded_step_ns=recorded_ns,
            compute_ns=step_ns // 2, comm_ns=step_ns // 2, wait_ns=1_234_567, exposed_wait_ns=1_234_567,
            exposed_transfer_ns=step_ns // 2,
        )  # fmt: skip

    # a 53-minute step against 33 recorded; a 4.5-s step against 2 ms (a model of 4 GiB transfers)
    rows = [row(0, 3_200_000_000_000, 2_000_000_000_000), row(1, 4_467_869_000, 2_001_000)]
    console = Console(width=80, record=True)
    console.print(summary_table(rows))
    text = console.export_text()
    # here it read '320000…' (3200000.000 cut), '4467.8…', '+223181…'; the CLI folded them in two lines
    assert "…" not in text
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in text.splitlines() if ln.startswith("│")]
    assert cells == [
        ["0", "1", "3200000", "2000000", "+60.0%", "1600000", "1600000", "1.235", "1600000"],
        ["1", "1", "4467.9", "2.001", "+223182%", "2233.9", "2233.9", "1.235", "2233.9"],
    ]


def test_the_summary_table_of_a_thousand_ranks_lists_the_late_arrivals_and_sums_up_the_rest() -> None:
    from rich.console import Console

    from skewlens.replay.render import summary_table
    from skewlens.replay.summary import SummaryRecord

    def row(r: int) -> SummaryRecord:
        wait = 0 if r in (7, 777) else 5_000_000 + r
        return SummaryRecord(
            rank=r, source_rank=r, step=0, step_time_ns=10_000_000, recorded_step_ns=9_000_000,
            compute_ns=1, comm_ns=1, wait_ns=wait, exposed_wait_ns=wait, exposed_transfer_ns=0,
        )  # fmt: skip

    table = summary_table([row(r) for r in range(1024)], max_ranks=2)
    assert table.row_count == 2
    console = Console(width=120, record=True)
    console.print(table)
    text = console.export_text()
    assert " 777 " in text and " 7 " in text and " 8 " not in text
    words = " ".join(text.split())  # the caption wraps at the table's width
    assert "1024 ranks" in words and "the other 1022" in words and "wait 5.001" in words
    # which wait the column is: the exposed one, not summary.parquet's wait_ns
    assert "wait, xfer: exposed (not under compute): summary.parquet's exposed_wait_ns" in words


def test_a_replay_that_speeds_the_straggler_up_gives_shorter_steps_and_all_their_compute(
    tmp_path: Path,
) -> None:
    # a CPU step's end mark could only move later: a straggler sped up tenfold still read +0.0%, and
    # the compute of steps whose marks did not follow read 0
    from replay_workloads import RankFactor

    b = RunBuilder(world_size=2)
    for k in range(3):
        for r in (0, 1):
            rb = b.rank(r).step(k)
            rb.compute("aten::mm", dur_ns=(2 if r == 0 else 30) * MS)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=(29 if r == 0 else 1) * MS)
    rt = load_run(b.write(tmp_path / "run"))
    rows = summarize(rt, simulate(rt, effects=RankFactor(1, 0.1)))
    assert len(rows) == 6
    for s in rows:
        assert s.recorded_step_ns == 31 * MS
        assert s.step_time_ns == 4 * MS  # rank 1's 3 ms of compute, then the 1 ms transfer
        assert s.compute_ns == (2 if s.rank == 0 else 3) * MS


def test_a_compute_factor_slows_what_the_summary_counts_as_compute_and_not_untraced_host_time(
    tmp_path: Path,
) -> None:
    # the straggler preset doubled a 30 ms sleep between operators (untraced time, idle in every table)
    from replay_workloads import RankFactor

    from skewlens.profiler.vocab import UNTRACED_NODE_NAME

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=2 * MS)
        rb.compute(UNTRACED_NODE_NAME, dur_ns=30 * MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS)
    rt = load_run(b.write(tmp_path / "run"))
    rows = {s.rank: s for s in summarize(rt, simulate(rt, effects=RankFactor(1, 2.0)))}
    assert (rows[0].compute_ns, rows[1].compute_ns) == (2 * MS, 4 * MS)
    assert rows[1].step_time_ns == rows[0].step_time_ns == 2 * MS + 30 * MS + 2 * MS + MS


def test_concurrent_waits_and_transfers_of_a_rank_count_once(tmp_path: Path) -> None:
    # two DDP buckets in flight at once: their waits were summed, and a step of 51.4 ms read 80.6 ms of wait
    b = RunBuilder(world_size=2)
    for r, late in ((0, 0), (1, 10 * MS)):
        rb = b.rank(r).step(0)
        f = rb.compute("aten::mm", dur_ns=2 * MS + late, start_ns=0)
        for _ in range(2):  # both issued when rank r's backward ends, on the group's stream
            rb.collective(
                CommType.ALL_REDUCE, 1 << 20, dur_ns=12 * MS + MS - 2 * MS - late, start_ns=2 * MS + late,
                stream=1000, deps=(f,),
            )  # fmt: skip
        rb.compute("aten::add", dur_ns=MS, start_ns=13 * MS)
    rt = load_run(b.write(tmp_path / "run"))
    rows = {s.rank: s for s in summarize(rt, simulate(rt))}
    assert rows[0].wait_ns == 10 * MS  # not 20: the two waits are the same 10 ms
    assert rows[0].comm_ns == 11 * MS
    assert rows[0].wait_ns <= rows[0].step_time_ns


def test_an_eager_send_waits_for_no_one_as_the_model_and_analyze_count_it(tmp_path: Path) -> None:
    from skewlens.analysis.api import analyze_run
    from skewlens.replay.outputs import replayed_waits

    # rank 0's send completes in 1 ms, 4 ms before rank 1 arrives at its recv: the summary said rank 0
    # waited 5 ms (to the recv's arrival) in a step whose only communication lasted 1 ms, then 1 ms (its
    # whole send), though the execution model detaches the send (eager: it waits for no one)
    rt = load_run(build_eager_send(tmp_path))
    res = simulate(rt)
    rows = {s.rank: s for s in summarize(rt, res)}
    assert (rows[0].wait_ns, rows[0].comm_ns, rows[0].exposed_transfer_ns) == (0, MS, MS)
    assert rows[1].wait_ns == 0
    # the timeline draws the same: no wait
    assert {r: int(w.sum()) for r, w in replayed_waits(rt, res).items()} == {0: 0, 1: 0}
    (event,) = analyze_run(rt, blame=False).skew.events
    assert event.wait_ns.tolist() == [rows[0].wait_ns, rows[1].wait_ns]


def test_a_stalled_ranks_own_step_holds_its_stall_in_the_first_step_and_later(tmp_path: Path) -> None:
    # slowdown=stall stalls the run's first step: pipeline-1f1b's stalled rank 0 read -1.6% while rank 1
    # read +41%, since the step's start mark moved with the stalled first node
    from skewlens.replay.slowdown import Slowdown, SlowdownModel

    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(3):
            rb.step(s)
            rb.compute("aten::mm", 2 * MS, start_ns=s * 5 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, MS)
    run = load_run(b.write(tmp_path / "run"))
    base = {(x.rank, x.step): x.step_time_ns for x in summarize(run, simulate(run))}
    for step in (0, 1):
        stall = SlowdownModel([Slowdown(kind="stall", ranks=(0,), step=step, delay_ns=50_000_000)])
        got = {
            (x.rank, x.step): x.step_time_ns - base[(x.rank, x.step)]
            for x in summarize(run, simulate(run, effects=stall))
        }
        # rank 0 stalls 50 ms inside its step; rank 1 waits as long for it at the all_reduce
        assert got[(0, step)] == 50 * MS, step
        assert got[(1, step)] == 50 * MS, step
        assert all(v == 0 for (r, s), v in got.items() if s != step), got


def test_the_timelines_replayed_waits_are_the_summarys_waits(tmp_path: Path) -> None:
    from skewlens.replay.outputs import replayed_waits

    # a late all_reduce member, an eager send, and a broadcast whose non-root waits for its root alone
    b = RunBuilder(world_size=3)
    for r, compute_ms in ((0, 2), (1, 5), (2, 3)):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=compute_ms * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=(6 - compute_ms) * MS)
        rb.compute("aten::relu", dur_ns=r * MS)
        rb.collective(CommType.BROADCAST, comm_bytes=1 << 20, dur_ns=3 * MS, root=1)
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt)
    rows = {s.rank: s.wait_ns for s in summarize(rt, res)}
    waits = {r: int(w.sum()) for r, w in replayed_waits(rt, res).items()}
    assert waits == rows
    assert waits[0] > 0 and waits[2] > 0


def _loading() -> tuple[RunBuilder, RankBuilder, int]:
    """One rank whose step 0 begins with "load" [0, 5) ms; nodes added next are in step 0 (and its id)."""
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    return b, rb, rb.step(0).compute("load", 5 * MS, start_ns=0)


def _retimed(run: RunTrace, name: str, dur_ns: int) -> SimResult:
    """The replay of ``run`` with rank 0's node ``name`` lasting ``dur_ns``."""
    longer = np.full(len(run.ranks[0]), -1, dtype=np.int64)
    longer[next(i for i in range(len(run.ranks[0])) if run.ranks[0].name(i) == name)] = dur_ns
    return simulate(run, dur_override={0: longer})


def _marked(run_dir: Path, *marks: tuple[int, int]) -> RunTrace:
    """The run with rank 0's steps 0, 1, ... marked ``marks`` (start, end) in its manifest instead of its
    nodes' spans (as a profiler's step annotations, or a GPU trace's device-timed steps, mark them)."""
    steps = tuple(StepSpan(rank=0, step=k, start_ns=a, end_ns=b) for k, (a, b) in enumerate(marks))
    write_manifest(run_dir, dataclasses.replace(read_manifest(run_dir), steps=steps))
    return load_run(run_dir)


def _retimed_steps(run_dir: Path, name: str, dur_ns: int) -> dict[int, tuple[int, int]]:
    """Step -> (replayed, recorded) step time of rank 0 with its node ``name`` lasting ``dur_ns``."""
    run = load_run(run_dir)
    return {s.step: (s.step_time_ns, s.recorded_step_ns) for s in summarize(run, _retimed(run, name, dur_ns))}


def test_a_steps_start_mark_moves_with_the_node_of_an_earlier_step_that_ended_right_at_it(
    tmp_path: Path,
) -> None:
    # step 0 is "load" [0, 5) ms and, on another thread after it, "tail" [5, 6) ms; step 1 ("fwd") is marked
    # [5, 10) ms. "load" 2 ms longer ends at 7 ms and "tail" at 8: step 1's start mark moves with "load"
    # (the latest node of an earlier step that ended by the mark, here at it), so "fwd" [7, 12) ms still
    # takes its 5 ms step, not 7
    b, rb, load = _loading()
    rb.compute("tail", MS, start_ns=5 * MS, stream=1, deps=(load,))
    rb.step(1).compute("fwd", 5 * MS, start_ns=5 * MS)
    steps = _retimed_steps(b.write(tmp_path / "run"), "load", 7 * MS)
    assert steps == {0: (8 * MS, 6 * MS), 1: (12 * MS - 7 * MS, 10 * MS - 5 * MS)}


def test_a_steps_start_mark_moves_no_further_than_the_previous_steps_end_mark(tmp_path: Path) -> None:
    # step 0 is "load" [0, 5) ms and "side" [0, 6) ms on another thread; step 1 ("fwd") is marked [5, 10) ms.
    # "load" 2 ms longer ends at 7 ms, "fwd" [7, 12) ms, "side" (step 0's end) stays: step 1's start mark
    # moved with "load" and read 5 ms, the 2 ms between step 0's end and step 1's start (1 ms of overlap
    # became 1 ms of gap) in no step, though step 1 ends 2 ms later (a slower link on a generated 2-rank
    # GPU run read the sum of a rank's steps 24 us shorter). Step 1 now starts where step 0 ends, as recorded
    b, rb, _load = _loading()
    rb.compute("side", 6 * MS, start_ns=0, stream=1)
    rb.step(1).compute("fwd", 5 * MS, start_ns=5 * MS)
    steps = _retimed_steps(b.write(tmp_path / "run"), "load", 7 * MS)
    assert steps == {0: (6 * MS, 6 * MS), 1: (12 * MS - 5 * MS, 10 * MS - 5 * MS)}


def test_a_node_before_the_first_step_that_runs_longer_lengthens_that_step_rather_than_vanishing(
    tmp_path: Path,
) -> None:
    # "load" [0, 5) ms belongs to no step; step 0 ("fwd") is marked [5, 10) ms. "load" 2 ms longer ends at
    # 7 ms and "fwd" [7, 12) ms: the start mark moved with "load" and the step read 5 ms, its 2 ms in no
    # step (on DLRM, rank 3's step read 0.3 ms shorter with its GPU 4x slower). The window's first step now
    # starts where it was recorded, as the replay does: 7 ms
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    rb.compute("load", 5 * MS, start_ns=0)
    rb.step(0).compute("fwd", 5 * MS)
    steps = _retimed_steps(b.write(tmp_path / "run"), "load", 7 * MS)
    assert steps[0] == (12 * MS - 5 * MS, 10 * MS - 5 * MS)


def test_a_collective_member_detached_by_contradicting_clocks_waits_no_longer_than_it_lasts(
    tmp_path: Path,
) -> None:
    # rank 0's all_reduce (1-3 ms) is recorded as done 5 ms before rank 1's began (8 ms): the model detaches
    # it, so the replay ends it at 3 ms; its wait is its 2 ms, not the 7 ms to rank 1's arrival
    run = load_run(_contradicting_clocks(tmp_path, 5.0))
    assert [(s.rank, s.wait_ns) for s in summarize(run, simulate(run))] == [(0, 2 * MS), (1, 0)]


def test_the_medians_of_the_ranks_a_summary_table_leaves_out_are_the_middle_of_an_even_count() -> None:
    from rich.console import Console

    from skewlens.replay.render import summary_table
    from skewlens.replay.summary import SummaryRecord

    def row(r: int, step_ms: int, wait_ms: int) -> SummaryRecord:
        return SummaryRecord(
            rank=r, source_rank=r, step=0, step_time_ns=step_ms * 1_000_000, recorded_step_ns=1,
            compute_ns=1, comm_ns=1, wait_ns=wait_ms * 1_000_000, exposed_wait_ns=wait_ms * 1_000_000,
            exposed_transfer_ns=0,
        )  # fmt: skip

    # ranks 0 and 1 waited least and are listed; of the other two (steps 10 and 20 ms, waits 1 and 3 ms) the
    # caption gave the upper one of each as their median: 'step 20.000 ms, wait 3.000 ms (medians)'
    rows = [row(0, 30, 0), row(1, 30, 0), row(2, 10, 1), row(3, 20, 3)]
    console = Console(width=200, record=True)
    console.print(summary_table(rows, max_ranks=2))
    words = " ".join(console.export_text().split())
    assert "the other 2: step 15.000 ms, wait 2.000 ms (medians)" in words


def test_a_step_whose_host_work_ran_under_the_step_befores_kernels_reads_0_not_a_negative_time(
    tmp_path: Path,
) -> None:
    # step 0: "op" launches kernel "k" [0.1, 2) ms; step 1: host op "opt" [2.5, 3.5) ms, no kernel. With the
    # GPU 3x slower "k" ends at 5.8 ms: step 1's start mark moves with it to 6.3 ms, past its end (3.5 ms,
    # its host op, which waits for no kernel), and step 1 read -2.8 ms. A step ends no earlier than it begins
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    op = rb.step(0).compute("op", MS, start_ns=0)
    rb.compute("k", 1_900_000, start_ns=100_000, stream=7, deps=(op,), launch_ns=50_000)
    rb.step(1).compute("opt", MS, start_ns=2_500_000)
    run = load_run(b.write(tmp_path / "run"))
    slow = SlowdownModel([Slowdown(kind="compute", factor=3.0, device="gpu")])
    marks = replayed_step_marks(run, simulate(run, effects=slow))
    steps = {s.step: s.step_time_ns for s in summarize(run, simulate(run, effects=slow))}
    assert marks[(0, 1)][2:] == (6_300_000, 6_300_000)
    assert steps == {0: 5_800_000, 1: 0}


def test_a_step_that_begins_where_the_previous_ended_begins_where_another_streams_kernel_ends_that_step(
    tmp_path: Path,
) -> None:
    # step 0: "op" launches "k2" [1, 5) ms on stream 8 and "k1" [1, 5) ms on stream 7, both ending at the
    # end mark; step 1 is "op1" at 5 ms, which launches "k3" [5.1, 9.1) ms on stream 7: step 1 begins where
    # step 0 ends (5 ms). "k2" lasting 5.9 ms ends at 6.9 ms and ends step 0 (not "k1", the later row of
    # the two that ended at the mark, which still ends at 5 ms); step 1 begins there too
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    op = rb.step(0).compute("op", 500_000, start_ns=0)
    rb.compute("k2", 4 * MS, start_ns=MS, stream=8, deps=(op,), launch_ns=100_000)
    rb.compute("k1", 4 * MS, start_ns=MS, stream=7, deps=(op,), launch_ns=200_000)
    op1 = rb.step(1).compute("op1", 500_000, start_ns=5 * MS)
    rb.compute("k3", 4 * MS, start_ns=5_100_000, stream=7, deps=(op1,), launch_ns=5_100_000)
    run = load_run(b.write(tmp_path / "run"))
    marks = replayed_step_marks(run, _retimed(run, "k2", 5_900_000))
    assert marks[(0, 0)][2:] == (0, 6_900_000)
    assert marks[(0, 1)][2:] == (6_900_000, 9_100_000)


def test_an_end_mark_no_node_ended_by_moves_with_the_ranks_first_node(tmp_path: Path) -> None:
    # step 0 is marked [0, 0.5) ms (as a profiler's step annotation may end before its op does) and its
    # node "a" runs [1, 3) ms; step 1's "b" [4, 5) ms has no mark. A 1 ms stall before step 0 starts "a" at
    # 2 ms and one of 2 ms before step 1 "b" at 7 ms: the end mark, which no node ended by, moves with the
    # rank's first node to 1.5 ms, not with its last (3.5 ms); the start mark stays at 0
    b = RunBuilder(world_size=1)
    b.rank(0).step(0).compute("a", 2 * MS, start_ns=MS)
    b.rank(0).step(1).compute("b", MS, start_ns=4 * MS)
    run = _marked(b.write(tmp_path / "run"), (0, MS // 2))
    stall = SlowdownModel([Slowdown(kind="stall", ranks=(0,), step=k, delay_ns=(k + 1) * MS) for k in (0, 1)])
    assert replayed_step_marks(run, simulate(run, effects=stall))[(0, 0)] == (0, MS // 2, 0, 3 * MS // 2)


def test_an_empty_step_between_two_steps_leaves_the_next_steps_start_moving_with_the_one_before(
    tmp_path: Path,
) -> None:
    # step 0 "load" [0, 5) ms, step 1 only "z" lasting 0 at 4 ms (an empty mark), step 2 "b" [5, 10) ms.
    # "load" 2 ms longer: step 2's start mark moves with it to 7 ms, so step 2 still reads its 5 ms. Had the
    # empty mark counted as the step before, its unmoved end (4 ms) would have held step 2's start back: 7 ms
    b, rb, _load = _loading()
    rb.step(1).compute("z", 0, start_ns=4 * MS, stream=1)
    rb.step(2).compute("b", 5 * MS, start_ns=5 * MS)
    run = load_run(b.write(tmp_path / "run"))
    res = _retimed(run, "load", 7 * MS)
    assert replayed_step_marks(run, res)[(0, 2)] == (5 * MS, 10 * MS, 7 * MS, 12 * MS)
    assert [(s.step, s.step_time_ns) for s in summarize(run, res)] == [(0, 7 * MS), (1, 0), (2, 5 * MS)]


def test_a_steps_own_host_op_that_ended_by_its_device_timed_start_mark_does_not_move_it(
    tmp_path: Path,
) -> None:
    # step 0 is "load" [0, 5) ms; step 1's "op1" [4.9, 5.1) ms, on another thread, launches "k" [6, 10) ms,
    # and step 1 is marked on the device, [6, 10) ms. "load" 2 ms longer: step 1's start mark moves with
    # "load" (the latest node of an earlier step that ended by it) to 8 ms, not with "op1", its own op that
    # ended last by the mark, which stays
    b, rb, _load = _loading()
    op1 = rb.step(1).compute("op1", 200_000, start_ns=4_900_000, stream=1)
    rb.compute("k", 4 * MS, start_ns=6 * MS, stream=7, deps=(op1,), launch_ns=5 * MS)
    run = _marked(b.write(tmp_path / "run"), (0, 5 * MS), (6 * MS, 10 * MS))
    assert replayed_step_marks(run, _retimed(run, "load", 7 * MS))[(0, 1)] == (
        6 * MS,
        10 * MS,
        8 * MS,
        10 * MS,
    )


def test_a_kernel_launched_before_the_first_step_that_runs_past_its_end_does_not_move_that_end(
    tmp_path: Path,
) -> None:
    # "k0" [0.1, 1) ms on stream 7 is in no step; step 0 is "op" [1, 1.5) ms launching "k" [2, 5) ms on
    # stream 8. "k0" lasting 6.9 ms ends at 7 ms, past step 0's end, which it does not move: still 5 ms
    b = RunBuilder(world_size=1)
    rb = b.rank(0)
    pre = rb.compute("pre", 50_000, start_ns=0)
    rb.compute("k0", 900_000, start_ns=100_000, stream=7, deps=(pre,), launch_ns=10_000)
    op = rb.step(0).compute("op", 500_000, start_ns=MS)
    rb.compute("k", 3 * MS, start_ns=2 * MS, stream=8, deps=(op,), launch_ns=1_100_000)
    run = load_run(b.write(tmp_path / "run"))
    assert replayed_step_marks(run, _retimed(run, "k0", 6_900_000))[(0, 0)] == (MS, 5 * MS, MS, 5 * MS)


def test_an_unmodified_replay_keeps_an_end_mark_that_a_kernel_of_its_step_ends_after(tmp_path: Path) -> None:
    # step 0 is marked [0, 5) ms on the host, "load" [0, 5) ms, whose kernel "k" runs [1, 6) ms: the mark is
    # before the kernel's end, and an unmodified replay keeps it at 5 ms rather than moving it to the kernel's
    b, rb, load = _loading()
    rb.compute("k", 5 * MS, start_ns=MS, stream=7, deps=(load,), launch_ns=100_000)
    run = _marked(b.write(tmp_path / "run"), (0, 5 * MS))
    assert replayed_step_marks(run, simulate(run))[(0, 0)] == (0, 5 * MS, 0, 5 * MS)


def test_step_marks_listed_out_of_order_in_the_manifest_move_as_they_do_in_order(tmp_path: Path) -> None:
    # step 0 is "load" [0, 5) ms and "side" [0, 6) ms on another thread; step 1 ("fwd") is marked [5, 10) ms,
    # and the manifest lists step 1 first. "load" 2 ms longer: step 1's start still moves no further than
    # step 0's end did (not at all), rather than with "load" to 7 ms as if it had no step before it
    b, rb, _load = _loading()
    rb.compute("side", 6 * MS, start_ns=0, stream=1)
    rb.step(1).compute("fwd", 5 * MS, start_ns=5 * MS)
    d = b.write(tmp_path / "run")
    m = read_manifest(d)
    write_manifest(d, dataclasses.replace(m, steps=tuple(reversed(m.steps))))
    run = load_run(d)
    assert replayed_step_marks(run, _retimed(run, "load", 7 * MS))[(0, 1)] == (
        5 * MS,
        10 * MS,
        5 * MS,
        12 * MS,
    )


def test_a_rank_with_a_step_mark_but_no_nodes_has_no_replayed_marks_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    # rank 1's trace holds no node, yet the manifest marks its step 0 [0, 5) ms as rank 0's: rank 0's marks
    # are replayed as recorded and rank 1 has none (nothing to move them with), rather than an error
    b = RunBuilder(world_size=2)
    b.rank(0).step(0).compute("a", 5 * MS, start_ns=0)
    b.rank(1)
    d = b.write(tmp_path / "run")
    steps = tuple(StepSpan(rank=r, step=0, start_ns=0, end_ns=5 * MS) for r in (0, 1))
    write_manifest(d, dataclasses.replace(read_manifest(d), steps=steps))
    run = load_run(d)
    res = simulate(run)
    assert replayed_step_marks(run, res) == {(0, 0): (0, 5 * MS, 0, 5 * MS)}
    assert [(s.rank, s.step, s.step_time_ns) for s in summarize(run, res)] == [(0, 0, 5 * MS)]
