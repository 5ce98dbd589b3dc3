"""Local SGD / DiLoCo: ranks that communicate only every K-th step (a model average after K local steps).

The wait at an average holds the slow rank's work of all K local steps since the previous one, which
``skewlens analyze`` names as the cause ("compute grew: <scope> +K x its growth"); the what-if replay it
prints under the stragglers table takes that scope away from those K steps, not from the averaging step
alone.
"""

from __future__ import annotations

from pathlib import Path

from test_host_idle import printed_stragglers, replay_lines, what_if_step_times

from skewlens.analysis import analyze_run
from skewlens.analysis.records import CauseKind
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

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
