"""Local SGD / DiLoCo: ranks that communicate only every K-th step (a model average after K local steps).

The wait at an average holds the slow rank's work of all K local steps since the previous one, which
``skewlens analyze`` names as the cause ("compute grew: <scope> +K x its growth"); the what-if replay it
prints under the stragglers table takes that scope away from those K steps, not from the averaging step
alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_host_idle import printed_stragglers, replay_lines, what_if_step_times

from skewlens.analysis import analyze_run
from skewlens.analysis.index import build_index
from skewlens.analysis.records import CauseKind
from skewlens.analysis.render import outliers_note
from skewlens.analysis.skew import _idle_by_step
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import UNTRACED_NODE_NAME, CommType

#: 8 steps, an all_reduce (the average) ending every ``K``-th step; each step ``MM_NS`` of ``aten::mm`` on
#: both ranks, after the model's forward scope ``FORWARD``: ``FWD_NS`` on rank 0, ``FWD_NS + SLOW_NS`` on
#: rank 1 (a slower rank every step, which its peer waits for only at the averages). Step 0 begins with a
#: broadcast of the parameters from rank 0 (``BCAST_NS``), which both ranks leave together.
STEPS, K, MM_NS, FWD_NS, SLOW_NS, XFER_NS, BCAST_NS = 8, 4, 1_000_000, 100_000, 5_000_000, 300_000, 200_000
FORWARD = "Net.forward"


def _local_sgd_run(tmp_path: Path, slow: str = FORWARD, *, bcast: bool = True) -> RunTrace:
    """The run above; ``slow``: what runs ``SLOW_NS`` on rank 1 each step, the forward scope's
    ``FORWARD`` (longer) or an ``untraced`` node after it (a sleep in no operator: untraced host time);
    ``bcast``: step 0 begins with the broadcast (else the first average is the ranks' first event)."""
    b = RunBuilder(world_size=2)
    t = {0: BCAST_NS, 1: BCAST_NS} if bcast else {0: 0, 1: 0}
    for r in (0, 1) if bcast else ():
        b.rank(r).step(0).collective(
            CommType.BROADCAST, comm_bytes=1 << 20, dur_ns=BCAST_NS, start_ns=0, root=0
        )
    for s in range(STEPS):
        for r in (0, 1):
            rb = b.rank(r).step(s)
            fwd = FWD_NS + (SLOW_NS if r == 1 and slow == FORWARD else 0)
            rb.compute(FORWARD, dur_ns=fwd, start_ns=t[r])
            if r == 1 and slow != FORWARD:
                rb.compute(slow, dur_ns=SLOW_NS)
                fwd += SLOW_NS
            rb.compute("aten::mm", dur_ns=MM_NS)
            t[r] += fwd + MM_NS
        if s % K == K - 1:
            end = max(t.values()) + XFER_NS
            for r in (0, 1):
                b.rank(r).step(s).collective(
                    CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=end - t[r], start_ns=t[r]
                )
                t[r] = end
    return load_run(b.write(tmp_path / "run", level="ops"))


def test_the_wait_at_an_average_is_caused_by_the_slow_ranks_work_of_the_k_local_steps_before_it(
    tmp_path: Path,
) -> None:
    res = analyze_run(_local_sgd_run(tmp_path))
    events = [e for e in res.skew.events if e.comm_type == "ALL_REDUCE"]
    assert [e.step for e in events] == [K - 1, 2 * K - 1]
    for e in events:
        assert e.blamed_rank == 1
        assert int(e.wait_ns[0]) == K * SLOW_NS
        assert e.cause.ops[0] == (FORWARD, K * SLOW_NS)
        # the first step of the slow scope since the previous synchronisation point: K steps, not one
        assert e.cause_first_step == e.step - K + 1
    # every step is delimited and timed, those with no collective too
    rank0 = {s.step: s.step_ns for s in res.breakdown if s.rank == 0}
    assert rank0 == {
        s: (BCAST_NS if s == 0 else 0) + FWD_NS + MM_NS + ((K * SLOW_NS + XFER_NS) if s % K == K - 1 else 0)
        for s in range(STEPS)
    }


def test_the_what_if_takes_the_slow_scope_away_from_every_local_step_and_the_peers_wait_vanishes(
    tmp_path: Path,
) -> None:
    run = _local_sgd_run(tmp_path)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 400))
    # every step of the run: no window of steps; before, first_step:3,last_step:3 and 7..7, the averages
    # alone, which left 3 of the 4 local steps' slow forward, and 15 ms of each 20 ms wait
    assert line.endswith(f"""'slowdown.entries=[{{kind:op,ranks:[1],factor:0,pattern:"{FORWARD}"}}]'"""), line
    # rank 1 now runs faster than rank 0, which waits for nobody: its own work and the transfer
    assert what_if_step_times(run, tmp_path, rank=0) == {
        s: (BCAST_NS if s == 0 else 0) + FWD_NS + MM_NS + (XFER_NS if s % K == K - 1 else 0)
        for s in range(STEPS)
    }


def test_the_host_idle_what_if_takes_untraced_time_away_from_every_local_step_and_the_wait_vanishes(
    tmp_path: Path,
) -> None:
    run = _local_sgd_run(tmp_path, "untraced")
    (e, later) = [e for e in analyze_run(run).skew.events if e.comm_type == "ALL_REDUCE"]
    assert e.cause.kind is CauseKind.HOST_GAP and e.cause.delta_ns == K * SLOW_NS
    assert (e.cause_first_step, later.cause_first_step) == (0, K)
    (line,) = replay_lines(printed_stragglers(analyze_run(run), 400))
    # before: the averaging steps 3 and 7 alone, an item each, which left 15 ms of each 20 ms wait
    assert line.endswith("slowdown=host_idle slowdown.rank=1 slowdown.factor=0"), line
    assert what_if_step_times(run, tmp_path, rank=0) == {
        s: (BCAST_NS if s == 0 else 0) + FWD_NS + MM_NS + (XFER_NS if s % K == K - 1 else 0)
        for s in range(STEPS)
    }


def test_the_first_average_of_a_trace_is_caused_by_the_k_local_steps_before_it_too(tmp_path: Path) -> None:
    # no event before it that both ranks share: its window began at the averaging step's start, on the
    # rank that began it first, and read 'Net.forward +17.0 ms' (with aten::mm +3.0 ms) of a 20 ms wait
    first, _ = analyze_run(_local_sgd_run(tmp_path, bcast=False)).skew.events
    assert int(first.wait_ns[0]) == K * SLOW_NS
    assert first.cause.ops == ((FORWARD, K * SLOW_NS),)
    assert first.cause_first_step == 0


def _average_run(
    tmp_path: Path,
    *,
    fwd: dict[int, list[float]],
    idle: dict[int, list[float]] | None = None,
    mm: dict[int, list[float]] | None = None,
) -> RunTrace:
    """2 ranks, 4 steps after a broadcast both leave together, an all_reduce (the average) ending step 3;
    each step of rank ``r`` runs ``FORWARD`` for ``fwd[r][s]`` ms, then untraced host time for
    ``idle[r][s]`` ms (if any) and ``aten::mm`` for 1 ms plus ``mm[r][s]``."""
    b = RunBuilder(world_size=2)
    t = dict.fromkeys((0, 1), BCAST_NS)
    for r in (0, 1):
        b.rank(r).step(0).collective(
            CommType.BROADCAST, comm_bytes=1 << 20, dur_ns=BCAST_NS, start_ns=0, root=0
        )
    for s in range(4):
        for r in (0, 1):
            rb = b.rank(r).step(s)
            took = [round(fwd[r][s] * 1e6), round((idle or {}).get(r, [0] * 4)[s] * 1e6)]
            took.append(MM_NS + round((mm or {}).get(r, [0] * 4)[s] * 1e6))
            rb.compute(FORWARD, dur_ns=took[0], start_ns=t[r])
            if took[1]:
                rb.compute(UNTRACED_NODE_NAME, dur_ns=took[1])
            rb.compute("aten::mm", dur_ns=took[2])
            t[r] += sum(took)
    end = max(t.values()) + XFER_NS
    for r in (0, 1):
        b.rank(r).step(3).collective(
            CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=end - t[r], start_ns=t[r]
        )
    return load_run(b.write(tmp_path / "run", level="ops"))


@pytest.mark.parametrize(
    ("fwd", "idle", "mm", "cause", "first"),
    [
        # both ranks run a 2 ms forward every step, rank 1's 5 ms longer from step 2: it grew at step 2,
        # though rank 1 ran it from step 0 (what it ran, not what grew, read step 0)
        ({0: [2, 2, 2, 2], 1: [2, 2, 7, 7]}, None, None, (FORWARD, 10_000_000), 2),
        # rank 1's forward 1, 3, 3, 3 ms longer: step 0 holds exactly a tenth of the growth, and is named
        ({0: [0.1] * 4, 1: [1.1, 3.1, 3.1, 3.1]}, None, None, (FORWARD, 10_000_000), 0),
        # rank 0's forward 4 ms longer at step 0, rank 1's 0.6, 4.4 and 4 at steps 1-3: step 1 holds 0.6 of
        # the 9 ms rank 1 grew by (under a tenth), though 0.6 of the 5 ms it ended later by
        ({0: [4.1, 0.1, 0.1, 0.1], 1: [0.1, 0.7, 4.5, 4.1]}, None, None, (FORWARD, 5_000_000), 2),
        # rank 1's aten::mm 2 ms longer at step 0, its forward 5 ms at steps 2 and 3: the forward's growth
        ({0: [0.1] * 4, 1: [0.1, 0.1, 5.1, 5.1]}, None, {1: [2, 0, 0, 0]}, (FORWARD, 10_000_000), 2),
    ],
    ids=["ran from step 0", "a tenth exactly", "a peer's growth", "another op grew first"],
)
def test_a_causes_first_step_is_where_its_scope_grew_against_the_median_member_not_where_it_ran(
    tmp_path: Path,
    fwd: dict[int, list[float]],
    idle: dict[int, list[float]] | None,
    mm: dict[int, list[float]] | None,
    cause: tuple[str, int],
    first: int,
) -> None:
    (e,) = [
        e for e in analyze_run(_average_run(tmp_path, fwd=fwd, idle=idle, mm=mm)).skew.events if e.step == 3
    ]
    assert (e.blamed_rank, e.cause.kind, e.cause.ops[0], e.cause_first_step) == (
        1,
        CauseKind.COMPUTE,
        cause,
        first,
    )


@pytest.mark.parametrize(
    ("fwd", "idle", "first"),
    [
        # both ranks idle 3 ms at step 0, rank 1 5 ms more at steps 2 and 3: its idle time grew at step 2
        ({0: [0.1] * 4, 1: [0.1] * 4}, {0: [3, 0, 0, 0], 1: [3, 0, 5, 5]}, 2),
        # rank 1's forward 2 ms longer at step 0 (a longer step, not idle time), its idle 5 ms at steps 2, 3
        ({0: [0.1] * 4, 1: [2.1, 0.1, 0.1, 0.1]}, {1: [0, 0, 5, 5]}, 2),
    ],
    ids=["idle alike at step 0", "a longer step 0"],
)
def test_a_host_gaps_first_step_is_where_the_late_ranks_idle_time_grew_against_the_median_members(
    tmp_path: Path, fwd: dict[int, list[float]], idle: dict[int, list[float]], first: int
) -> None:
    (e,) = [e for e in analyze_run(_average_run(tmp_path, fwd=fwd, idle=idle)).skew.events if e.step == 3]
    assert (e.blamed_rank, e.cause.kind, e.cause_first_step) == (1, CauseKind.HOST_GAP, first)


def test_the_first_step_of_a_scope_whose_label_is_cut_is_found_and_an_autograd_nodes_is_not_looked_for(
    tmp_path: Path,
) -> None:
    # a cause names an op by its whole name, its rows are matched by the label the cause shows (a name over
    # 64 characters cut with '…'); an autograd node is no scope a what-if takes away (Cause.stalled_scope),
    # so its first step is not looked for: -1
    long = "checkpoint_and_log_metrics_to_the_experiment_tracker_of_this_team_" + "x" * 20
    events = [
        e
        for e in analyze_run(_local_sgd_run(tmp_path / "a", long)).skew.events
        if e.comm_type == "ALL_REDUCE"
    ]
    assert [(e.cause.ops[0], e.cause.stalled_scope, e.cause_first_step) for e in events] == [
        ((long, K * SLOW_NS), True, 0),
        ((long, K * SLOW_NS), True, K),
    ]
    name = "autograd::engine::evaluate_function: MmBackward0"
    events = [
        e
        for e in analyze_run(_local_sgd_run(tmp_path / "b", name)).skew.events
        if e.comm_type == "ALL_REDUCE"
    ]
    assert [(e.cause.ops[0], e.cause.stalled_scope, e.cause_first_step) for e in events] == [
        ((name, K * SLOW_NS), False, -1),
        ((name, K * SLOW_NS), False, -1),
    ]


def test_a_ranks_idle_time_by_step_is_counted_in_its_own_steps_not_a_peers_of_the_same_time(
    tmp_path: Path,
) -> None:
    # rank 0 idles 6 ms in step 0, rank 1 5 ms in steps 2 and 3: rank 1's step 2 idle time falls in rank 0's
    # step 0, and is rank 1's step 2's alone (steps of none left out)
    ix = build_index(
        _average_run(tmp_path, fwd={0: [0.1] * 4, 1: [0.1] * 4}, idle={0: [6, 0, 0, 0], 1: [0, 0, 5, 5]})
    )
    ri = ix.ranks[1]
    assert +_idle_by_step(ri, ix.rank_windows()[1], 0, int(ri.trace.start_ns.max())) == {
        2: 5_000_000,
        3: 5_000_000,
    }


def test_the_averages_that_waited_for_the_slow_rank_are_said_to_have_mostly_waited_for_a_late_peer(
    tmp_path: Path,
) -> None:
    # rank 0's averaging steps: 0.1 + 1 ms of its own work, 20 ms (4 x 5) waiting for rank 1 and the 0.3 ms
    # transfer, 21.4 ms against its median step of 1.1 ms, 20 of the 20.3 ms over it a wait
    step = (
        "took 19.5x the median step (rank 0: 21.400 against 1.100 ms; 20.000 ms of it waiting for its peers)"
    )
    assert outliers_note(analyze_run(_local_sgd_run(tmp_path))) == (
        f"step 3 {step}; step 7 {step}: the means include them (2 of them mostly waited for a late peer: see "
        "the stragglers and the collectives above); every step is in step_breakdown.parquet"
    )
