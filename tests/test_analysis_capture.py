"""The analyses on real captured runs of the bundled example (4 gloo ranks on CPU).

A run is captured once per module with ``--straggler-rank 2 --straggler-ms 100``, and one with
``--slow-send-rank 0 --slow-send-ms 100``. The checks: rank 2 is the top straggler of more steps than any
other rank (4 ranks share 2 cores here: a rank starved of CPU is a real straggler of its step), for its
matmuls; it is the last to arrive at its first collective of a step, and its peers' waits there are blamed
on it, in all but two steps (in a step a CPU-starved peer delayed, it passes the lateness on), each the
time to the last arrival; what-if blame finds rank 2 the costliest rank by what its what-if saves; with a
slow sender the reported cause is the send, not compute. In how many steps rank 2 is on top, how long the
peers wait (~40 ms) and how close the what-if comes to real runs without the straggler are measured by
``benchmarks/whatif_accuracy.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.analysis import AnalysisResult, analyze_run
from skewlens.analysis.records import CauseKind
from skewlens.analysis.skew import SkewEvent
from skewlens.profiler.store import load_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"
STEPS = 12  # wait 1, warmup 1, active 10
NPROC = 4
# 100 ms, not 40: the checks need the injected rank late by more than what a CPU-starved peer loses (4
# ranks, 2 cores). At 40 ms rank 2's lead over the latest other member at its first collective of a step
# came down to 2.0 and 13.3 ms (3 captures beside two CPU hogs); at 100 ms its smallest was 62.5 ms
STRAGGLER, STRAGGLER_MS = 2, 100.0
SLOW_SENDER, SLOW_SEND_MS = 0, 100.0

pytestmark = pytest.mark.slow


def _capture(out: Path, *extra: str) -> Path:
    if not EXAMPLE.is_file() or not (ROOT / "profiler" / "capture").is_dir():
        pytest.skip("capture (profiler/capture) or the example (examples/train.py) is missing")
    proc = profile(out, "--steps", str(STEPS), *extra, level="ops", steps="1:1:10", nproc=NPROC)
    if proc.returncode != 0:
        pytest.fail(f"capture failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return out


def _analyze(run_dir: Path) -> AnalysisResult:
    return analyze_run(load_run(run_dir))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    d = tmp_path_factory.mktemp("capture")
    straggler = _capture(
        d / "straggler", "--straggler-rank", str(STRAGGLER), "--straggler-ms", str(STRAGGLER_MS)
    )
    return {"straggler": _analyze(straggler)}


def test_rank_2_is_the_top_straggler_of_more_steps_than_any_other_rank_for_its_matmuls(
    runs: dict[str, AnalysisResult],
) -> None:
    tops = runs["straggler"].top_straggler_by_step()
    steps = sorted({s for (_r, s) in runs["straggler"].index.step_spans})
    assert len(steps) == STEPS - 2
    counts = Counter(tops.values())
    assert counts.most_common(1)[0][0] == STRAGGLER, f"top straggler per step: {tops}"
    cause = runs["straggler"].skew.top_cause_in()[STRAGGLER]
    assert cause.kind is CauseKind.COMPUTE and cause.op == "aten::mm", cause


def test_peers_waits_at_rank_2s_first_collective_of_each_step_are_blamed_on_it(
    runs: dict[str, AnalysisResult],
) -> None:
    firsts: dict[int, SkewEvent] = {}
    for e in runs["straggler"].skew.events:  # in order of last arrival: rank 2's first collective a step
        if e.kind == "collective" and STRAGGLER in e.ranks and e.step not in firsts:
            firsts[e.step] = e
    assert len(firsts) == STEPS - 2  # every recorded step
    # Rank 2 arrives last in most steps. With 4 ranks on 2 cores a CPU-starved peer can be later still, or
    # make rank 2 start a step late: then the lateness is passed on by rank 2 (CI saw one step of ten
    # blamed on rank 1 "passed on by rank 2", and once its pair peer rank 3 last, by 2 ms, "via rank 2"),
    # so rank 2 is late and blamed in most steps, and passes the lateness on in the others. Its own lateness
    # can also come back to it: under load, rank 3 (delayed by waiting on rank 2 at the end of the step
    # before) was last at their pair collective by 0.3 ms, and the wait was blamed on rank 2 "via rank 3".
    # So the late rank is rank 2 in most steps, and every step's wait is blamed on rank 2 or passed on by it.
    late = {s: e.late_rank for s, e in firsts.items()}
    assert sum(r == STRAGGLER for r in late.values()) >= len(firsts) - 2, f"late rank per step: {late}"
    blamed = {s: e.blamed_rank for s, e in firsts.items()}
    assert sum(b == STRAGGLER for b in blamed.values()) >= len(firsts) - 2, f"blamed rank per step: {blamed}"
    # A step whose wait is neither rank 2's nor passed on by it had another rank last: a peer starved of CPU
    # by the others (4 ranks on 2 cores) can be later than rank 2 by itself, and then the analysis rightly
    # blames that peer (a CI run beside other test runs saw one such step of ten). At most one step may be
    # such, and never one where rank 2 was last.
    others = {
        s: (e.late_rank, e.blamed_rank, e.cause.via_rank, e.cause.text)
        for s, e in firsts.items()
        if not (e.blamed_rank == STRAGGLER or e.cause.via_rank == STRAGGLER)
    }
    assert len(others) <= 1 and all(late != STRAGGLER for late, *_ in others.values()), others
    for e in firsts.values():  # each member waited until the last arrival, or for all of its call
        last = int(e.arrival_ns.max())
        assert e.wait_ns.tolist() == [
            min(last - a, end - a) for a, end in zip(e.arrival_ns.tolist(), e.end_ns.tolist(), strict=True)
        ]
        # someone waited for the late rank (rank 2, or in the one step allowed above the peer that was
        # later: of a pair collective with rank 3, then rank 2 waited and rank 3 did not)
        assert max(w for r, w in zip(e.ranks, e.wait_ns.tolist(), strict=True) if r != e.late_rank) > 0


def test_what_if_blame_finds_rank_2_the_costliest_by_what_its_what_if_saves(
    runs: dict[str, AnalysisResult],
) -> None:
    blame = runs["straggler"].blame
    assert blame is not None
    top = blame.records[0]
    assert (top.rank, top.simulated) == (STRAGGLER, True)
    whatif = blame.whatif_step_ns[STRAGGLER]
    assert sorted(whatif) == sorted(blame.baseline_step_ns)
    assert top.baseline_ns == sum(blame.baseline_step_ns.values())
    assert top.whatif_ns == sum(whatif.values())
    assert top.straggler_cost_ns == top.baseline_ns - top.whatif_ns > 0


def test_slow_sender_is_blamed_for_the_send_not_compute(tmp_path: Path) -> None:
    res = _analyze(
        _capture(
            tmp_path / "slow_send", "--slow-send-rank", str(SLOW_SENDER), "--slow-send-ms", str(SLOW_SEND_MS)
        )
    )
    late_sends = [
        e
        for e in res.skew.events
        if e.kind == "p2p" and e.ranks[0] == SLOW_SENDER and e.late_rank == SLOW_SENDER
    ]
    assert late_sends
    assert all(e.cause.kind is CauseKind.LATE_SEND for e in late_sends)
    assert res.skew.top_cause_in()[SLOW_SENDER].kind is CauseKind.LATE_SEND
