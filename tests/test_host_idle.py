"""``host_idle``: a replay with a rank's untraced host time scaled (0 removes it), in the one execution model.

Untraced host time is what a host thread spent outside every traced row (``execution.host_idle_rows``): the
gap before a host row after the rows it follows, and the capture's ``untraced`` nodes. Before, a replay could
add such time (``slowdown=stall``) but not take it away: "what if my data loader had not stalled" had no
answer (``kind: host_idle`` was refused as an unknown kind).
"""

from __future__ import annotations

import io
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from rich.console import Console

from skewlens.analysis import analyze_run
from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.render import print_report, stragglers
from skewlens.cli import main as skewlens_main
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.errors import ConfigError
from skewlens.replay.execution import execution_model, host_idle_rows
from skewlens.replay.real.plan import rank_plan
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

#: Rank 1 idles this long before its compute at step ``GAP_STEP``; rank 0 computes ``LONGER_NS`` longer
#: there, so that part of the gap is absorbed by rank 0's own lateness.
GAP_NS, GAP_STEP, LONGER_NS = 5_000_000, 2, 1_000_000
STEPS = 4


def two_rank_run(tmp_path: Path, work: Callable[[RankBuilder, int, int, int], int], level: str) -> RunTrace:
    """2 ranks, ``STEPS`` steps: ``work(rank builder, rank, step, t)`` adds the rank's nodes of the step
    from ``t`` and gives when the rank arrives at the step's all_reduce, which ends together on both ranks
    0.3 ms after the later arrival."""
    b = RunBuilder(world_size=2)
    t = 0
    for s in range(STEPS):
        arrive = {r: work(b.rank(r).step(s), r, s, t) for r in (0, 1)}
        end = max(arrive.values()) + 300_000
        for r in (0, 1):
            b.rank(r).collective(
                CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=end - arrive[r], start_ns=arrive[r]
            )
        t = end
    return load_run(b.write(tmp_path / "run", level=level))


def idle_run(tmp_path: Path, gaps: dict[int, int], *, compute_ns: int = 2_000_000) -> RunTrace:
    """:func:`two_rank_run` at the ``collectives`` level, each rank computing ``compute_ns`` a step and rank 1
    idling ``gaps[step]`` more before the all_reduce (untraced host time)."""

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        rb.compute("aten::mm", dur_ns=compute_ns, start_ns=t)
        return t + compute_ns + (gaps.get(s, 0) if r == 1 else 0)

    return two_rank_run(tmp_path, work, "collectives")


def _gap_run(tmp_path: Path, *, untraced: bool = False) -> RunTrace:
    """2 ranks, 4 steps of a 2 ms compute and an all_reduce ending together on both ranks; at step 2 rank 1
    idles ``GAP_NS`` between its compute and the all_reduce (a recorded gap, or with ``untraced`` an
    ``untraced`` node, as the ``ops`` level records main-thread time in no operator: a logging flush) and
    rank 0 computes ``LONGER_NS`` longer."""

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        comp = 2_000_000 + (LONGER_NS if (r, s) == (0, GAP_STEP) else 0)
        rb.compute("aten::mm", dur_ns=comp, start_ns=t)
        gap = GAP_NS if (r, s) == (1, GAP_STEP) else 0
        if gap and untraced:
            rb.compute("untraced", dur_ns=gap)
        return t + comp + gap

    return two_rank_run(tmp_path, work, "ops" if untraced else "collectives")


def _host_idle(factor: float, **kw: object) -> SlowdownModel:
    return SlowdownModel([Slowdown(kind="host_idle", ranks=(1,), factor=factor, **kw)])  # type: ignore[arg-type]


def arrivals(run: RunTrace, step: int) -> dict[int, int]:
    """Each rank's recorded arrival at the step's all_reduce."""
    (inst,) = [c for c in run.collectives if run.ranks[c.ranks[0]].step[c.rows[0]] == step]
    return {r: int(run.ranks[r].start_ns[row]) for r, row in zip(inst.ranks, inst.rows, strict=True)}


@pytest.mark.parametrize("untraced", [False, True], ids=["recorded gap", "untraced node"])
def test_removing_a_ranks_untraced_host_time_shortens_its_step_by_the_gap_less_what_the_peer_absorbs(
    tmp_path: Path, untraced: bool
) -> None:
    run = _gap_run(tmp_path, untraced=untraced)
    arrive = arrivals(run, GAP_STEP)
    # rank 1 arrives the gap earlier; the all_reduce then waits for rank 0 instead
    saved = arrive[1] - max(arrive[0], arrive[1] - GAP_NS)
    assert 0 < saved < GAP_NS  # the fixture has rank 0 absorb part of it
    base = simulate(run).step_times()
    gone = simulate(run, effects=_host_idle(0.0, first_step=GAP_STEP, last_step=GAP_STEP)).step_times()
    assert base[GAP_STEP] - gone[GAP_STEP] == saved
    assert {s: t for s, t in gone.items() if s != GAP_STEP} == {
        s: t for s, t in base.items() if s != GAP_STEP
    }
    # half of it: the step gives back what the half removed beyond rank 0's lateness; twice: the gap again
    half = simulate(run, effects=_host_idle(0.5)).step_times()
    assert base[GAP_STEP] - half[GAP_STEP] == arrive[1] - max(arrive[0], arrive[1] - GAP_NS // 2)
    double = simulate(run, effects=_host_idle(2.0)).step_times()
    assert double[GAP_STEP] - base[GAP_STEP] == GAP_NS


def test_the_real_replays_plan_scales_the_same_gaps_and_untraced_nodes_as_the_simulator(
    tmp_path: Path,
) -> None:
    for untraced in (False, True):
        run = _gap_run(tmp_path / str(untraced), untraced=untraced)
        ops = rank_plan(run.ranks[1], run, _host_idle(0.5))
        got = [
            (o.name, o.gap_ns, o.dur_ns) for o in ops if o.step == GAP_STEP and o.name != "c10d::all_reduce_"
        ]
        if untraced:  # the untraced node's work halved, the all_reduce after it on time
            assert got == [("aten::mm", 0, 2_000_000), ("untraced", 0, GAP_NS // 2)]
        else:  # the gap before the all_reduce halved
            assert got == [("aten::mm", 0, 2_000_000)]
            (ar,) = [o for o in ops if o.step == GAP_STEP and o.name == "c10d::all_reduce_"]
            assert ar.gap_ns == GAP_NS // 2


def test_untraced_host_time_is_the_host_rows_gaps_and_untraced_nodes_not_a_collectives_wait(
    tmp_path: Path,
) -> None:
    run = _gap_run(tmp_path, untraced=True)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    gap, work = host_idle_rows(rt, m)
    # rank 0 idled nowhere: its wait at the all_reduce (rank 1's gap) is a collective's, not host idle time
    assert int(m.gap_ns[gap].sum()) == 0 and not work.any()
    rt1, m1 = run.ranks[1], execution_model(run).ranks[1]
    gap1, work1 = host_idle_rows(rt1, m1)
    assert int(m1.gap_ns[gap1].sum() + m1.work_ns[work1].sum()) == GAP_NS


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"factor": -1.0}, "slowdown item (kind=host_idle): factor must be a finite number >= 0, got -1.0"),
        ({"factor": float("nan")}, "factor must be a finite number >= 0, got nan"),
        ({"factor": 0.0, "step": 2}, "step belongs to stall items; a host_idle item reads none"),
        ({"factor": 0.0, "device": "host"}, "device (host) says which compute ops"),
    ],
)
def test_a_bad_host_idle_item_is_a_config_error_naming_its_field(item: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        Slowdown(kind="host_idle", **item)
    assert says in str(e.value)


def test_a_factor_of_zero_is_refused_for_every_kind_but_host_idle_and_op() -> None:
    assert Slowdown(kind="host_idle", factor=0.0).factor == 0.0
    assert Slowdown(kind="op", pattern="enumerate(DataLoader)*", factor=0.0).factor == 0.0
    with pytest.raises(ConfigError, match=r"factor must be a finite number > 0, got 0\.0"):
        Slowdown(kind="compute", factor=0.0)


def test_a_host_idle_item_on_a_rank_or_steps_the_run_lacks_is_refused_naming_the_key(tmp_path: Path) -> None:
    run = _gap_run(tmp_path)
    with pytest.raises(
        ConfigError, match=r"effects.items\[0\].ranks: rank 5 is not in the run \(ranks 0-1\)"
    ):
        simulate(run, effects=SlowdownModel([Slowdown(kind="host_idle", ranks=(5,), factor=0.0)]))
    with pytest.raises(
        ConfigError, match=r"effects.items\[0\].first_step: steps 9..9 hold none of the run's \(steps 0-3\)"
    ):
        simulate(run, effects=_host_idle(0.0, first_step=9, last_step=9))
    # rank 1 idles at step 2 only: at step 1 there is nothing for the factor to scale
    with pytest.raises(
        ConfigError, match=r"effects.items\[0\]: rank 1 has no untraced host time in steps 1..1"
    ):
        simulate(run, effects=_host_idle(0.0, first_step=1, last_step=1))


def _cli(tmp_path: Path, run: Path, *overrides: str) -> int:
    return skewlens_main(
        ["replay", f"trace={run}", f"out={tmp_path / 'out'}", "progress=false", "perfetto=false", *overrides]
    )


def test_the_host_idle_entry_replays_the_step_without_the_gap_from_the_command_line(tmp_path: Path) -> None:
    run = _gap_run(tmp_path)
    arrive = arrivals(run, GAP_STEP)
    saved = arrive[1] - max(arrive[0], arrive[1] - GAP_NS)
    assert (
        _cli(tmp_path, tmp_path / "run", "slowdown=host_idle", "slowdown.rank=1", f"slowdown.step={GAP_STEP}")
        == 0
    )
    rows = pq.read_table(tmp_path / "out" / "summary.parquet").to_pylist()
    got = {(r["rank"], r["step"]): r["step_time_ns"] for r in rows}
    base = simulate(run).step_times()
    # each rank's step, mark to mark, as the job's: both end at the all_reduce
    assert {r: got[(r, GAP_STEP)] for r in (0, 1)} == {0: base[GAP_STEP] - saved, 1: base[GAP_STEP] - saved}
    assert {r: got[(r, GAP_STEP + 1)] for r in (0, 1)} == {0: base[GAP_STEP + 1], 1: base[GAP_STEP + 1]}


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["slowdown.factor=-1"], "slowdown.factor: must be a finite number >= 0, got -1.0"),
        (
            ["slowdown.rank=7"],
            (
                "slowdown.entries[0].ranks: rank 7 is not in the run (ranks 0-1); the host_idle preset "
                "takes it from slowdown.rank"
            ),
        ),
        (
            ["slowdown.rank=1", "slowdown.step=9"],
            (
                "slowdown.entries[0].first_step: steps 9..9 hold none of the run's (steps 0-3); the "
                "host_idle preset takes it from slowdown.step"
            ),
        ),
    ],
)
def test_a_bad_host_idle_setting_is_one_line_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], says: str
) -> None:
    _gap_run(tmp_path)
    assert _cli(tmp_path, tmp_path / "run", "slowdown=host_idle", *overrides) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"skewlens replay: error: {says}"]
    assert not (tmp_path / "out").exists()


def printed_stragglers(result: AnalysisResult, width: int) -> str:
    """The stragglers table and the replays under it, as ``skewlens analyze`` prints them ``width`` wide."""
    buf = io.StringIO()
    print_report(Console(file=buf, width=width), stragglers(result))
    return buf.getvalue()


def stragglers_text(run: RunTrace) -> str:
    """:func:`printed_stragglers` of ``run``'s analysis, 400 wide, its whitespace folded."""
    return " ".join(printed_stragglers(analyze_run(run), 400).split())


def replay_lines(printed: str) -> list[str]:
    """The printed lines that are a replay to paste."""
    return [line for line in printed.splitlines() if line.startswith("skewlens replay ")]


def test_analyze_names_the_host_idle_replay_for_a_rank_that_made_its_peers_wait_for_untraced_host_time(
    tmp_path: Path,
) -> None:
    run = _gap_run(tmp_path)
    assert (
        "rank 1 made its peers wait for untraced host time (between traced operators: a data loader, "
        "gc.collect(), a checkpoint write); what if it were gone: the replay under the table"
    ) in stragglers_text(run)
    command = (
        f"skewlens replay trace={tmp_path / 'run'} out=OUT slowdown=host_idle slowdown.rank=1 "
        f"slowdown.step={GAP_STEP} slowdown.factor=0"
    )
    assert replay_lines(printed_stragglers(analyze_run(run), 80)) == [command]


@pytest.mark.parametrize("folder", ["", "my run's [dir]"])
def test_analyze_names_the_host_idle_replay_at_every_step_where_the_rank_idled_not_only_the_worst(
    tmp_path: Path, folder: str
) -> None:
    # rank 1 idles 5 ms at step 1 and 3 ms at step 3 (a checkpoint written every other step, untraced):
    # before, the replay named step 1 alone (62% of the wait), and left step 3's 3 ms wait in it. The run
    # also in a directory whose name has a space, a quote and brackets; before, the command sat in the
    # table's caption with trace=RUN, wrapped at 80 columns over four lines (inside the Hydra list too)
    gaps = {1: GAP_NS, 3: 3_000_000}
    run = idle_run(tmp_path / folder, gaps)
    items = ", ".join(f"{{kind:host_idle,ranks:[1],first_step:{s},last_step:{s},factor:0}}" for s in gaps)
    printed = printed_stragglers(analyze_run(run), 80)
    assert "what if it were gone: the replay under the table" in " ".join(printed.split())
    (line,) = replay_lines(printed)
    assert line.endswith(f" out=OUT 'slowdown.entries=[{items}]'") and len(line) > 80  # the terminal wraps it
    trace = OverridesParser.create().parse_override(shlex.split(line)[2])  # Hydra's quotes in the shell's
    assert (trace.key_or_group, trace.value()) == ("trace", run.run_dir)
    # the command as printed, pasted: every gap is gone (rank 0 absorbs none of it), the other steps as they
    # were
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {s: t - gaps.get(s, 0) for s, t in base.items()}


def test_analyze_names_one_host_idle_item_for_consecutive_steps_where_the_rank_idled(tmp_path: Path) -> None:
    # rank 1 idles at steps 1 and 2: one run of steps, an entries item from step 1 to step 2 (the preset's
    # slowdown.step takes one step), and the replay pasted takes both gaps away
    gaps = {1: GAP_NS, 2: 3_000_000}
    run = idle_run(tmp_path, gaps)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 80))
    item = "{kind:host_idle,ranks:[1],first_step:1,last_step:2,factor:0}"
    assert line.endswith(f" out=OUT 'slowdown.entries=[{item}]'"), line
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {s: t - gaps.get(s, 0) for s, t in base.items()}


def test_a_step_of_a_job_of_many_short_steps_is_named_where_the_rank_idled_a_tenth_of_the_median_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 steps of 0.31 ms (10 us of compute, the all_reduce 0.3 ms): rank 1 idles 400 us at step 2 and 50 us
    # at step 5. A step is named from a tenth of the median step (31 us) and of the wait (45 us); the least
    # wait the note is given for at all, 5 us a step (120 us), is no step's floor: both steps are named
    monkeypatch.setattr(sys.modules[__name__], "STEPS", 24)
    gaps = {2: 400_000, 5: 50_000}
    run = idle_run(tmp_path, gaps, compute_ns=10_000)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 80))
    items = ", ".join(f"{{kind:host_idle,ranks:[1],first_step:{s},last_step:{s},factor:0}}" for s in gaps)
    assert line.endswith(f" out=OUT 'slowdown.entries=[{items}]'"), line
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {s: t - gaps.get(s, 0) for s, t in base.items()}


def test_the_uneven_wait_line_names_the_steps_the_host_idle_replay_under_it_takes_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 steps; rank 1 idles 19.03 ms at step 4 and 28.22 ms at step 9 (a data loader slow at every 5th
    # batch: 40% and 60% of the wait). Before, the line named step 9 alone ('28.220 ms, 60% of it') over a
    # replay that took away steps 4 and 9, as if step 4 were fine
    monkeypatch.setattr(sys.modules[__name__], "STEPS", 10)
    gaps = {4: 19_030_000, 9: 28_220_000}
    run = idle_run(tmp_path, gaps)
    assert (
        "rank 1's caused wait is uneven over its steps: in steps 4 and 9 it made its peers wait 19.030 and "
        "28.220 ms, 100% of it, in its median step 0.000 ms"
    ) in stragglers_text(run)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 80))
    items = ", ".join(f"{{kind:host_idle,ranks:[1],first_step:{s},last_step:{s},factor:0}}" for s in gaps)
    assert line.endswith(f" out=OUT 'slowdown.entries=[{items}]'"), line


def what_if_step_times(run: RunTrace, tmp_path: Path, *, rank: int) -> dict[int, int]:
    """Rank ``rank``'s step times in the replay printed under ``run``'s stragglers table at 80 columns, as
    a user pastes it: the one line, split as a shell splits it, with ``OUT`` replaced (into ``tmp_path /
    "out"``); the printed ``trace=`` is the run's own path. Before, the command sat in the table's caption,
    wrapped to its width (inside the Hydra list too), with ``trace=RUN`` to fill in."""
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 80))
    words = shlex.split(line)
    assert words[:2] == ["skewlens", "replay"] and words[2].startswith("trace=") and words[3] == "out=OUT", (
        line
    )
    args = [words[2], f"out={tmp_path / 'out'}", *words[4:]]
    assert skewlens_main(["replay", *args, "progress=false", "perfetto=false"]) == 0
    rows = pq.read_table(tmp_path / "out" / "summary.parquet").to_pylist()
    return {r["step"]: r["step_time_ns"] for r in rows if r["rank"] == rank}


def test_analyze_names_no_host_idle_replay_for_a_rank_whose_compute_grew(run_dir: Path) -> None:
    # the shared fixture: rank r computes r x 0.1 ms longer than rank 0, no idle time
    text = stragglers_text(load_run(run_dir))
    assert "compute grew" in text and "host_idle" not in text


def test_a_host_idle_item_scales_only_its_ranks_and_steps_and_two_items_multiply(tmp_path: Path) -> None:
    # rank 1 idles GAP_NS before its all_reduce at steps 1 and 2, rank 0 at step 3 (nobody computes longer:
    # the peers absorb none of it); rank 1's at step 2 alone is scaled: x0.5 twice is x0.25 of it
    idle = {(1, 1), (1, 2), (0, 3)}

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        rb.compute("aten::mm", dur_ns=2_000_000, start_ns=t)
        return t + 2_000_000 + (GAP_NS if (r, s) in idle else 0)

    run = two_rank_run(tmp_path, work, "collectives")
    base = simulate(run).step_times()
    window = {"first_step": 2, "last_step": 2}
    gone = simulate(run, effects=_host_idle(0.0, **window)).step_times()
    assert gone == {s: t - (GAP_NS if s == 2 else 0) for s, t in base.items()}
    quarter = SlowdownModel([Slowdown(kind="host_idle", ranks=(1,), factor=0.5, **window)] * 2)  # type: ignore[arg-type]
    assert simulate(run, effects=quarter).step_times() == {
        s: t - (GAP_NS * 3 // 4 if s == 2 else 0) for s, t in base.items()
    }


def test_a_thread_that_starts_late_keeps_its_start_with_the_untraced_time_gone(tmp_path: Path) -> None:
    # a second host thread's first row begins 1.5 ms after the rank's first: no row precedes it, so the
    # time before it is no gap after anything (the thread had not begun), and factor 0 leaves it there
    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        rb.compute("aten::mm", dur_ns=2_000_000, start_ns=t)
        if s == 0:
            rb.compute("aten::copy_", dur_ns=100_000, start_ns=t + 1_500_000, stream=7)
        return t + 2_000_000 + (GAP_NS if (r, s) == (1, GAP_STEP) else 0)

    run = two_rank_run(tmp_path, work, "collectives")
    rt = run.ranks[1]
    (copy,) = [i for i in range(len(rt)) if rt.name(i) == "aten::copy_"]
    gaps, _untraced = host_idle_rows(rt, execution_model(run).ranks[1])
    assert not gaps[copy]
    gone = simulate(run, effects=_host_idle(0.0))
    assert int(gone.start_ns[1][copy]) == int(rt.start_ns[copy])


def test_untraced_host_time_scaled_past_the_simulated_clock_is_a_config_error_naming_the_rank(
    tmp_path: Path,
) -> None:
    run = _gap_run(tmp_path)
    with pytest.raises(
        ConfigError, match=r"^slowdown: rank 1's untraced host time x1e\+12 lasts .* s, beyond "
    ):
        simulate(run, effects=_host_idle(1e12))


def test_a_scaled_gap_is_rounded_to_the_nearest_ns(tmp_path: Path) -> None:
    run = _gap_run(tmp_path)
    ops = rank_plan(run.ranks[1], run, _host_idle(1 / 3))
    (ar,) = [o for o in ops if o.step == GAP_STEP and o.name == "c10d::all_reduce_"]
    assert ar.gap_ns == round(GAP_NS / 3) == 1_666_667


def test_the_gpus_idle_time_between_kernels_is_no_untraced_host_time(tmp_path: Path) -> None:
    # a kernel launched at 0.1 ms runs 1 ms after the kernel before it on its stream ended (the GPU idled:
    # no host time): factor 0 leaves it where it ran
    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        op = rb.compute("aten::mm", dur_ns=200_000, start_ns=t)
        k1 = rb.compute(
            "k1", dur_ns=1_000_000, start_ns=t + 50_000, stream=7, deps=(op,), launch_ns=t + 10_000
        )
        rb.compute(
            "k2", dur_ns=500_000, start_ns=t + 2_050_000, stream=7, deps=(op, k1), launch_ns=t + 100_000
        )
        return t + 3_000_000 + (GAP_NS if (r, s) == (1, GAP_STEP) else 0)

    run = two_rank_run(tmp_path, work, "collectives")
    rt = run.ranks[1]
    k2 = [i for i in range(len(rt)) if rt.name(i) == "k2"]
    base, gone = simulate(run), simulate(run, effects=_host_idle(0.0))
    assert [int(gone.start_ns[1][i] - gone.start_ns[1][i - 1]) for i in k2] == [2_000_000] * STEPS
    assert base.start_ns[1][k2].tolist() == rt.start_ns[k2].tolist()


def test_the_host_idle_replay_takes_away_every_step_of_a_rank_that_idled_alike_at_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 9 steps; rank 1 logs (a JSON line and a print, untraced) at every step, 21.4-38.5 ms as measured on
    # 2 gloo ranks: the steps above a tenth of the wait (30.3 ms and up, four of nine) held over half of it,
    # and the replay named steps 0, 4 and 6-8 alone (on the capture: 6 and 8-10; pasted, it left rank 0
    # waiting 13.9 ms a step of 30.0)
    monkeypatch.setattr(sys.modules[__name__], "STEPS", 9)
    logs_ms = [32.7, 21.7, 25.2, 25.0, 31.2, 21.4, 38.5, 33.9, 37.6]
    gaps = {s: int(ms * 1_000_000) for s, ms in enumerate(logs_ms)}
    run = idle_run(tmp_path, gaps)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 80))
    assert line.endswith(" out=OUT slowdown=host_idle slowdown.rank=1 slowdown.factor=0"), line
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {s: t - gaps[s] for s, t in base.items()}
