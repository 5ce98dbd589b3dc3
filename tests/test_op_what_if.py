"""``op`` at factor 0: "what if my DataLoader had not stalled", where the stall is a traced scope.

A real ``DataLoader``'s fetch is traced (Kineto's ``enumerate(DataLoader)#...__next__`` scope), so its
stall is compute to ``skewlens analyze`` ("compute grew: enumerate(DataLoader)#... +30.4 ms"), not the
untraced host time that ``host_idle`` takes away. An ``op`` item scaled the scope but refused factor 0, and
analyze named no replay for it; now factor 0 takes the matched ops' time away (the same rule as at any
factor: their own durations), and analyze names that replay where a rank made its peers wait for a stalled
op.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from test_analysis_scenarios import build_one_slow_rank
from test_host_idle import STEPS, arrivals, stragglers_text, two_rank_run, what_if_step_times

from skewlens.cli import main as skewlens_main
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import COMPUTE_GAP_NODE_NAME, CommType
from skewlens.replay.config import SlowdownConfig, SlowdownItemConfig
from skewlens.replay.errors import ConfigError
from skewlens.replay.real.plan import rank_plan
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel, op_matches

SCOPE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
#: Each step's fetch takes ``FETCH_NS``; at ``STALL_STEP`` rank 1's takes ``STALL_NS`` more, and rank 0
#: computes ``LONGER_NS`` longer there, so that part of the stall is absorbed by rank 0's own lateness.
FETCH_NS, STALL_NS, STALL_STEP, LONGER_NS = 100_000, 5_000_000, 2, 1_000_000


def _scope_run(tmp_path: Path) -> RunTrace:
    """2 ranks, 4 steps of a fetch (the DataLoader's scope), a 2 ms compute and an all_reduce ending together
    on both ranks; at ``STALL_STEP`` rank 1's fetch stalls ``STALL_NS`` and rank 0 computes ``LONGER_NS``
    longer."""

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        fetch = FETCH_NS + (STALL_NS if (r, s) == (1, STALL_STEP) else 0)
        comp = 2_000_000 + (LONGER_NS if (r, s) == (0, STALL_STEP) else 0)
        rb.compute(SCOPE, dur_ns=fetch, start_ns=t)
        rb.compute("aten::mm", dur_ns=comp)
        return t + fetch + comp

    return two_rank_run(tmp_path, work, "ops")


def _scope(factor: float) -> SlowdownModel:
    item = Slowdown(
        kind="op", ranks=(1,), factor=factor, pattern="enumerate(DataLoader)*", first_step=STALL_STEP,
        last_step=STALL_STEP,
    )  # fmt: skip
    return SlowdownModel([item])


def test_an_op_item_of_factor_0_is_accepted_where_another_kinds_is_refused() -> None:
    assert Slowdown(kind="op", pattern="enumerate(DataLoader)*", factor=0.0).factor == 0.0
    cfg = SlowdownConfig(entries=[SlowdownItemConfig(kind="op", pattern="x", factor=0.0)])
    assert cfg.to_items()[0].factor == 0.0
    with pytest.raises(ConfigError, match=r"op\): factor must be a finite number >= 0, got -1\.0"):
        Slowdown(kind="op", pattern="x", factor=-1.0)
    # no compute at all, a network that never delivers: they mean nothing
    for kind in ("compute", "network"):
        with pytest.raises(ConfigError, match=r"factor must be a finite number > 0, got 0\.0"):
            Slowdown(kind=kind, factor=0.0)


def test_the_straggler_presets_factor_0_is_refused_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _scope_run(tmp_path)
    args = [f"trace={tmp_path / 'run'}", f"out={tmp_path / 'out'}", "progress=false", "perfetto=false"]
    assert skewlens_main(["replay", *args, "slowdown=straggler", "slowdown.factor=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["skewlens replay: error: slowdown.factor: must be a finite number > 0, got 0.0"]


def test_a_scope_at_factor_0_shortens_the_step_by_its_duration_less_what_the_peer_absorbs(
    tmp_path: Path,
) -> None:
    run = _scope_run(tmp_path)
    arrive = arrivals(run, STALL_STEP)
    scope_ns = FETCH_NS + STALL_NS
    # rank 1 arrives the scope's duration earlier; the all_reduce then waits for rank 0 instead
    saved = arrive[1] - max(arrive[0], arrive[1] - scope_ns)
    assert 0 < saved < scope_ns  # the fixture has rank 0 absorb part of it
    base = simulate(run).step_times()
    gone = simulate(run, effects=_scope(0.0)).step_times()
    assert base[STALL_STEP] - gone[STALL_STEP] == saved
    assert {s: t for s, t in gone.items() if s != STALL_STEP} == {
        s: t for s, t in base.items() if s != STALL_STEP
    }
    half = simulate(run, effects=_scope(0.5)).step_times()
    assert base[STALL_STEP] - half[STALL_STEP] == arrive[1] - max(arrive[0], arrive[1] - scope_ns // 2)
    # the real replay's plan: the scope's work gone at that step, kept at the others
    ops = rank_plan(run.ranks[1], run, _scope(0.0))
    assert [(o.step, o.dur_ns) for o in ops if o.name == SCOPE] == [
        (s, 0 if s == STALL_STEP else FETCH_NS) for s in range(STEPS)
    ]


def test_analyze_names_the_op_replay_that_takes_a_stalled_scope_away_and_that_replay_runs(
    tmp_path: Path,
) -> None:
    run = _scope_run(tmp_path)
    text = stragglers_text(run)
    said = (
        f"rank 1 made its peers wait for its scope {SCOPE}, which stalled (it took over twice its time on "
        "the median member); what if it were gone: the replay under the table"
    )
    assert said in text
    assert (
        f"skewlens replay trace={tmp_path / 'run'} out=OUT "
        f"'slowdown.entries=[{{kind:op,ranks:[1],first_step:{STALL_STEP},last_step:{STALL_STEP},factor:0,"
        f'pattern:"{SCOPE}"}}]\''
    ) in text
    assert "host_idle" not in text  # a traced scope is no untraced host time
    # the command as printed, pasted: the step gives back the stall less what rank 0 absorbed
    arrive = arrivals(run, STALL_STEP)
    saved = arrive[1] - max(arrive[0], arrive[1] - FETCH_NS - STALL_NS)
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=1) == {
        s: t - (saved if s == STALL_STEP else 0) for s, t in base.items()
    }


def test_analyze_names_no_op_replay_for_a_rank_whose_operator_is_slower(tmp_path: Path) -> None:
    # the last rank's aten::mm takes 46 ms where the others' take 5: a slower rank (its what-if cost)
    text = stragglers_text(load_run(build_one_slow_rank(tmp_path)))
    assert "compute grew: aten::mm" in text and "what if it were gone" not in text
    assert "what-if replays" not in text  # no heading over no replay


@pytest.mark.parametrize("name", ['load "shard" [0]', "it's a scope*", "plain#1.step"])
def test_the_op_replay_for_a_scope_with_quotes_or_globs_in_its_name_parses_back_to_a_glob_of_it_alone(
    name: str,
) -> None:
    import fnmatch

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from skewlens.analysis.render import _what_if_text
    from skewlens.profiler.store.issues import replay_command

    what_if = _what_if_text(2, name, ((5, 5),))
    words = shlex.split(replay_command("RUN", *what_if.overrides))  # as a shell splits the line pasted
    assert words[:4] == ["skewlens", "replay", "trace=RUN", "out=OUT"] and len(words) == 5
    (entry,) = OverridesParser.create().parse_override(words[4]).value()
    assert (entry["kind"], entry["ranks"], entry["first_step"], entry["factor"]) == ("op", [2], 5, 0)
    assert fnmatch.fnmatchcase(name, entry["pattern"])
    assert not fnmatch.fnmatchcase(name + "x", entry["pattern"])


def _scopes_run(tmp_path: Path, name: str, fetch_ns: int, stall_ns: dict[int, int]) -> RunTrace:
    """As :func:`_scope_run`, with the scope named ``name``, each fetch ``fetch_ns`` long and rank 1's
    ``stall_ns[step]`` longer (rank 0 computes no longer)."""

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        fetch = fetch_ns + (stall_ns.get(s, 0) if r == 1 else 0)
        rb.compute(name, dur_ns=fetch, start_ns=t)
        rb.compute("aten::mm", dur_ns=2_000_000)
        return t + fetch + 2_000_000

    return two_rank_run(tmp_path, work, "ops")


def test_the_op_replays_pattern_matches_a_scope_named_with_glob_characters_as_itself(tmp_path: Path) -> None:
    # a record_function scope "fetch[0]*": as a glob, "[0]" would match "0" and "*" anything; the pattern
    # given escapes them so that it matches the name itself
    run = _scopes_run(tmp_path, "fetch[0]*", FETCH_NS, {STALL_STEP: STALL_NS})
    text = stragglers_text(run)
    assert 'factor:0,pattern:"fetch[[]0][*]"}]\'' in text
    assert op_matches("fetch[[]0][*]", "fetch[0]*")
    assert not op_matches("fetch[[]0][*]", "fetch0x")


def test_analyze_names_the_op_replay_for_every_step_where_the_scope_stalled_in_each(tmp_path: Path) -> None:
    # rank 1's fetch stalls as long at every step: no step holds over half of it, so the replay names none
    run = _scopes_run(tmp_path, SCOPE, FETCH_NS, dict.fromkeys(range(STEPS), STALL_NS))
    text = stragglers_text(run)
    assert f"'slowdown.entries=[{{kind:op,ranks:[1],factor:0,pattern:\"{SCOPE}\"}}]'" in text


@pytest.mark.parametrize(
    ("stalls", "windows"),
    [
        # a checkpoint at steps 1 and 3, 8 and 4 ms: before, step 1's alone (two thirds of the wait)
        ({1: 8_000_000, 3: 4_000_000}, [(1, 1), (3, 3)]),
        # at steps 1 and 2: one item of both
        ({1: 8_000_000, 2: 4_000_000}, [(1, 2)]),
    ],
)
def test_analyze_names_the_op_replay_at_every_step_where_a_recurring_scope_stalled_not_only_the_worst(
    tmp_path: Path, stalls: dict[int, int], windows: list[tuple[int, int]]
) -> None:
    run = _scopes_run(tmp_path, "checkpoint", FETCH_NS, stalls)
    text = stragglers_text(run)
    items = ", ".join(
        f'{{kind:op,ranks:[1],first_step:{a},last_step:{b},factor:0,pattern:"checkpoint"}}'
        for a, b in windows
    )
    assert f"skewlens replay trace={tmp_path / 'run'} out=OUT 'slowdown.entries=[{items}]'" in text, text
    # the command as printed, pasted: every stall is gone (rank 0 absorbs none of it), the other steps as
    # they were
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=1) == {s: t - stalls.get(s, 0) for s, t in base.items()}


def test_analyze_names_no_step_where_the_scope_made_its_peers_wait_under_a_tenth_of_the_median_step(
    tmp_path: Path,
) -> None:
    # rank 1's checkpoint stalls 1.5 ms at step 1 and 0.2 ms at step 3: step 3 holds over a tenth of the
    # wait (0.17 ms) but under a tenth of the median simulated step (over 2.1 ms: a 0.1 ms fetch and a 2 ms
    # mm), a one-off's least: the replay names step 1 alone
    run = _scopes_run(tmp_path, "checkpoint", FETCH_NS, {1: 1_500_000, 3: 200_000})
    item = '{kind:op,ranks:[1],first_step:1,last_step:1,factor:0,pattern:"checkpoint"}'
    assert f"skewlens replay trace={tmp_path / 'run'} out=OUT 'slowdown.entries=[{item}]'" in stragglers_text(
        run
    )


@pytest.mark.parametrize(
    ("waits", "steps", "windows"),
    [
        ({1: 8, 3: 4}, 4, ((1, 1), (3, 3))),  # two checkpoints: both, not the worst alone
        ({1: 8, 2: 4}, 4, ((1, 2),)),  # consecutive: one run
        ({1: 8, 3: 0.5}, 4, ((1, 1),)),  # under the floor (1): not named
        ({4: 200, 1: 1.5, 2: 3}, 6, ((4, 4),)),  # over the floor, under a tenth of the wait: noise
        (dict.fromkeys(range(12), 1), 20, ()),  # spread thin over many steps: every step
        ({0: 1, 1: 1, 2: 1, 3: 1}, 4, ()),  # every step: none named
        # over 4 runs: the worst where it holds over half, else every step
        ({0: 30, 2: 1, 4: 1, 6: 1, 8: 1, 10: 1}, 12, ((0, 0),)),
        ({0: 5, 2: 5, 4: 5, 6: 5, 8: 5}, 12, ()),
        # the bounds are kept: a step at the floor (1) or at a tenth of the wait is named, 4 runs are
        # named, and over 4 the worst holding half (not over half) is not named alone
        ({1: 8, 3: 1}, 4, ((1, 1), (3, 3))),
        ({1: 18, 3: 2}, 4, ((1, 1), (3, 3))),
        ({0: 5, 2: 5, 4: 5, 6: 5}, 12, ((0, 0), (2, 2), (4, 4), (6, 6))),
        ({0: 5, 2: 1, 4: 1, 6: 1, 8: 1, 10: 1}, 12, ()),
        # a step between a tenth and a fifth of the wait is named
        ({1: 8, 3: 1.5}, 4, ((1, 1), (3, 3))),
        # the worst step under the floor is named still (it holds most of the wait)
        ({1: 0.8, 3: 0.3}, 4, ((1, 1),)),
        # two tied steps under the floor: the first alone holds half, not over half: every step (it was
        # step 1's alone, leaving step 3's equal wait; question 221)
        ({1: 0.5, 3: 0.5}, 4, ()),
        # steps alike (a log line at each of 9 steps, 21.4-38.5 ms): the four over a tenth of the wait held
        # over half of it and were named alone, the others' waits left in the replay
        ({0: 32.7, 1: 21.7, 2: 25.2, 3: 25.0, 4: 31.2, 5: 21.4, 6: 38.5, 7: 33.9, 8: 37.6}, 9, ()),
        # a worst step at twice the lower median (the steps of no wait counted: 0 here) names those steps
        ({1: 40, 2: 30, 3: 20, 4: 12, 6: 9}, 8, ((1, 4),)),
        # steps alike but the worst, over twice the lower median step: the one-off rule as before
        ({0: 10, 1: 10, 2: 10, 3: 10, 4: 10, 5: 10, 6: 60, 7: 60}, 8, ((6, 7),)),
        # at most twice it (20 against 10), the four at 20 holding 61% of the wait: alike, every step
        ({0: 10, 1: 10, 2: 10, 3: 10, 4: 10, 5: 20, 6: 20, 7: 20, 8: 20}, 9, ()),
        # waits of load noise at most steps: a step named exceeds the lower median step (0.9) by the floor;
        # the one left (3.5), 43% of the wait, is no one-off: every step (before, steps 0-3, each at the
        # floor or more, 1.0 and 1.1 among them, 0.1 and 0.2 over the median step)
        ({0: 1.6, 1: 1.0, 2: 3.5, 3: 1.1, 5: 0.9}, 9, ()),
    ],
)
def test_a_what_if_names_the_runs_of_steps_where_the_rank_made_its_peers_wait_a_floor_or_more(
    waits: dict[int, float], steps: int, windows: tuple[tuple[int, int], ...]
) -> None:
    from skewlens.analysis.render import _what_if_steps

    assert _what_if_steps({s: int(w * 1_000_000) for s, w in waits.items()}, 1_000_000, steps) == windows


def test_analyze_says_a_scope_only_the_late_rank_ran_is_its_alone_not_one_that_took_twice_its_peers_time(
    tmp_path: Path,
) -> None:
    # rank 1 alone writes a checkpoint (5 ms) at one step while rank 0 goes on to the all_reduce: before, the
    # note said it "stalled (it took over twice its time on the median member)", which ran none of it
    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        rb.compute("aten::mm", dur_ns=2_000_000, start_ns=t)
        if (r, s) == (1, STALL_STEP):
            rb.compute("checkpoint", dur_ns=STALL_NS)
            return t + 2_000_000 + STALL_NS
        return t + 2_000_000

    text = stragglers_text(two_rank_run(tmp_path, work, "ops"))
    assert (
        "rank 1 made its peers wait for its scope checkpoint, which the median member did not run; what if "
        "it were gone: the replay under the table"
    ) in text, text
    assert (
        f"skewlens replay trace={tmp_path / 'run'} out=OUT 'slowdown.entries=[{{kind:op,ranks:[1],"
        f'first_step:{STALL_STEP},last_step:{STALL_STEP},factor:0,pattern:"checkpoint"}}]\''
    ) in text, text
    assert "took over twice" not in text


def test_analyze_names_no_op_replay_for_a_scope_that_grew_by_less_than_it_takes_on_the_median_member(
    tmp_path: Path,
) -> None:
    # the scope takes 6 ms on each rank and 11 ms on rank 1 at one step: it grew, by less than its own time
    # on the median member, so it ran slower there, no stall (the what-if cost answers a slower rank)
    run = _scopes_run(tmp_path, SCOPE, 6_000_000, {STALL_STEP: STALL_NS})
    text = stragglers_text(run)
    assert f"compute grew: {SCOPE}" in text
    assert "what if it were gone" not in text


def _grown_run(tmp_path: Path, grown: dict[tuple[int, str], int]) -> RunTrace:
    """2 ranks, ``STEPS`` steps of the scope (``FETCH_NS``), ``aten::mm`` (2 ms) and ``aten::add`` (1 ms),
    rank 1's op ``name`` at step ``s`` longer by ``grown[(s, name)]``."""

    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        for name, dur in ((SCOPE, FETCH_NS), ("aten::mm", 2_000_000), ("aten::add", 1_000_000)):
            dur += grown.get((s, name), 0) if r == 1 else 0
            rb.compute(name, dur_ns=dur, start_ns=t)
            t += dur
        return t

    return two_rank_run(tmp_path, work, "ops")


@pytest.mark.parametrize(
    ("grown", "note"),
    [
        # a 0.15 ms stall in 3 ms steps: under a tenth of the median step, no what-if worth naming
        ({(STALL_STEP, SCOPE): 150_000}, False),
        # the scope grew 2 ms, the operators 3 ms with it: the scope is under half of what grew, no stall
        (
            {
                (STALL_STEP, SCOPE): 2_000_000,
                (STALL_STEP, "aten::mm"): 1_500_000,
                (STALL_STEP, "aten::add"): 1_500_000,
            },
            False,
        ),
        # a 5 ms stall, and a slower operator at another step made the peers wait 3 ms: the stall is over half
        ({(STALL_STEP, SCOPE): 5_000_000, (1, "aten::mm"): 3_000_000}, True),
    ],
)
def test_analyze_names_the_op_replay_only_for_a_stall_that_is_most_of_what_grew_and_of_the_wait(
    tmp_path: Path, grown: dict[tuple[int, str], int], note: bool
) -> None:
    text = stragglers_text(_grown_run(tmp_path, grown))
    said = (
        f"'slowdown.entries=[{{kind:op,ranks:[1],first_step:{STALL_STEP},last_step:{STALL_STEP},factor:0,"
        f'pattern:"{SCOPE}"}}]\''
    )
    assert (said in text) == note, text


def test_analyze_names_no_op_replay_for_the_collectives_levels_compute_gap_that_grew(tmp_path: Path) -> None:
    # the collectives level records all of a rank's host time between two collectives as one `compute` node:
    # no scope that stalled but the rank's whole step of work, whose "op replay at factor 0" took all of it
    # away (a drifting rank at that level was told "its scope compute, which stalled")
    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        comp = 2_000_000 + (STALL_NS if (r, s) == (1, STALL_STEP) else 0)
        rb.compute(COMPUTE_GAP_NODE_NAME, dur_ns=comp, start_ns=t)
        return t + comp

    text = stragglers_text(two_rank_run(tmp_path, work, "collectives"))
    assert f"compute grew: {COMPUTE_GAP_NODE_NAME} +" in text
    assert "what if it were gone" not in text and "its scope" not in text


@pytest.mark.parametrize(
    ("name", "scope"),
    [
        ("MmBackward0", False),
        ("RedistributeBackward", False),
        ("CheckpointFunctionBackward", False),
        ("BackwardPrefetch", True),
    ],
)
def test_analyze_names_no_op_replay_for_an_autograd_node_that_grew(
    tmp_path: Path, name: str, scope: bool
) -> None:
    # an autograd node (a backward op's own name, no '::' in it) is an operator the engine ran, not a scope of
    # the program's: it grows where the rank is slower, or where activation checkpointing recomputes inside it
    # (a TP recipe's rank sleeping in forward read "MmBackward0 +32.9 ms"); an op replay at factor 0 would
    # take the whole backward matmul away, not the stall. A record_function scope whose name holds
    # "Backward" without ending in it is a scope still, and its replay is named
    def work(rb: RankBuilder, r: int, s: int, t: int) -> int:
        comp = 2_000_000 + (STALL_NS if (r, s) == (1, STALL_STEP) else 0)
        rb.compute(name, dur_ns=comp, start_ns=t)
        return t + comp

    text = stragglers_text(two_rank_run(tmp_path, work, "ops"))
    assert f"compute grew: {name} +" in text
    assert ("its scope" in text, "kind:op" in text) == (scope, scope), text


def test_a_caption_with_several_what_ifs_names_each_ones_replay_by_its_place_under_the_table() -> None:
    # the replays are printed under the table in the notes' order: with two, "the replay" would not say
    # which line is whose
    from rich.table import Table

    from skewlens.analysis.render import WhatIf, _what_ifs_said

    t = Table(caption="stragglers")
    notes = [
        WhatIf("rank 1 made its peers wait for A", ("x=1",)),
        WhatIf("rank 2 made its peers wait for B", ()),
    ]
    assert _what_ifs_said(t, notes) == notes
    assert t.caption == (
        "stragglers"
        "\nrank 1 made its peers wait for A; what if it were gone: replay 1 of those under the table"
        "\nrank 2 made its peers wait for B; what if it were gone: replay 2 of those under the table"
    )
    one = Table(caption="stragglers")
    _what_ifs_said(one, notes[:1])
    assert one.caption == (
        "stragglers\nrank 1 made its peers wait for A; what if it were gone: the replay under the table"
    )


def _passed_on_run(tmp_path: Path, *, b_next_step: bool = False) -> RunTrace:
    """4 ranks, ``STEPS`` steps of a fetch (the scope) and a 2 ms compute, then an all_reduce on group ``a``
    (ranks 0, 1) and one on ``b`` (ranks 0, 2, 3), each ending 0.3 ms after its last arrival; at
    ``STALL_STEP`` rank 1's fetch stalls ``STALL_NS``: rank 0 waits for it at ``a``, then arrives late at
    ``b``, where ranks 2 and 3 wait, the lateness passed on by rank 0 (as hybrid sharding's replicas wait for
    a shard group's straggler through its peer). ``b_next_step``: ``b``'s all_reduce is the first thing of
    the next step (the last step's, of a step of its own)."""
    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "a": (0, 1), "b": (0, 2, 3)})
    t = 0
    for s in range(STEPS):
        arrive = {}
        for r in range(4):
            rb = b.rank(r).step(s)
            fetch = FETCH_NS + (STALL_NS if (r, s) == (1, STALL_STEP) else 0)
            rb.compute(SCOPE, dur_ns=fetch, start_ns=t)
            rb.compute("aten::mm", dur_ns=2_000_000)
            arrive[r] = t + fetch + 2_000_000
        end_a = max(arrive[0], arrive[1]) + 300_000
        for r in (0, 1):
            b.rank(r).collective(
                CommType.ALL_REDUCE, 1 << 20, dur_ns=end_a - arrive[r], start_ns=arrive[r], pg="a"
            )
        at_b = {0: end_a, 2: arrive[2], 3: arrive[3]}
        end_b = max(at_b.values()) + 300_000
        for r, a in at_b.items():
            b.rank(r).step(s + b_next_step).collective(
                CommType.ALL_REDUCE, 1 << 20, dur_ns=end_b - a, start_ns=a, pg="b"
            )
        t = max(end_a, end_b)
    return load_run(b.write(tmp_path / "run", level="ops"))


def test_analyze_names_the_op_replay_for_a_stall_whose_wait_was_mostly_passed_on_by_another_rank(
    tmp_path: Path,
) -> None:
    # rank 1's stall made rank 0 wait at group a (its own event: 5 ms) and ranks 2 and 3 at group b through
    # rank 0 (passed on: 10 ms): all 15 ms are rank 1's caused wait. Before, only its own events counted
    # towards the half of it a what-if needs, so no replay was named (an FSDP1 HYBRID_SHARD run on 4 gloo
    # ranks whose rank 1 slept 30 ms in a layer's forward: "compute grew: FullyShardedDataParallel.forward
    # +29.1 ms", and no replay, where the 2-rank FULL_SHARD run named one)
    run = _passed_on_run(tmp_path)
    text = stragglers_text(run)
    assert f"rank 1 made its peers wait for its scope {SCOPE}, which stalled" in text, text
    # the replay, pasted, gives back the whole stall: no rank absorbed any of it
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {
        s: t - (STALL_NS if s == STALL_STEP else 0) for s, t in base.items()
    }


def test_a_stall_whose_wait_was_passed_on_in_the_next_step_is_taken_away_where_it_stalled_alone(
    tmp_path: Path,
) -> None:
    # rank 0 is late at group b's all_reduce as the next step begins: that wait, passed on, counts towards
    # the half of rank 1's caused wait the replay needs, but the replay takes its scope away only at the
    # step where it stalled: step 3's fetch took its usual 0.1 ms (counted as a step of the stall, the
    # replay named steps 2-3, taking away a fetch that did not stall)
    run = _passed_on_run(tmp_path, b_next_step=True)
    text = stragglers_text(run)
    assert f"first_step:{STALL_STEP},last_step:{STALL_STEP},factor:0" in text, text
    base = simulate(run).step_times()
    assert what_if_step_times(run, tmp_path, rank=0) == {
        s: t - (STALL_NS if s == STALL_STEP else 0) for s, t in base.items()
    }
