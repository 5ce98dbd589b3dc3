"""The analyses on real captured runs of the bundled example (4 gloo ranks on CPU).

Two runs are captured once per module (with ``--straggler-rank 2 --straggler-ms 40`` and without), plus
one with ``--slow-send-rank 0 --slow-send-ms 40``. The checks: rank 2 is the top straggler in >= 95% of
the steps; its peers' wait attributed to it at its first collective of the step is 40 ms ±20%; the
what-if step time "rank 2 runs like the median rank" is within 10% of the real run without a straggler;
with a slow sender the reported cause is the send, not compute.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import pytest
from capture_helpers import profile

from skewlens.analysis import AnalysisResult, analyze_run
from skewlens.analysis.blame import step_times_from_spans
from skewlens.analysis.records import CauseKind
from skewlens.profiler.store import load_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"
STEPS = 12  # wait 1, warmup 1, active 10
NPROC = 4
STRAGGLER, STRAGGLER_MS = 2, 40.0
SLOW_SENDER, SLOW_SEND_MS = 0, 40.0

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


def _bracketed(d: Path) -> dict[str, AnalysisResult]:
    """A straggler run bracketed by two runs without it, so drift of the shared machine during the
    module affects the reference and the what-if alike."""
    clean_before = _capture(d / "clean_before")
    straggler = _capture(
        d / "straggler", "--straggler-rank", str(STRAGGLER), "--straggler-ms", str(STRAGGLER_MS)
    )
    clean = _capture(d / "clean")
    return {
        "straggler": _analyze(straggler),
        "clean": _analyze(clean),
        "clean_before": _analyze(clean_before),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    return _bracketed(tmp_path_factory.mktemp("capture"))


def _whatif_and_reference_ns(runs: dict[str, AnalysisResult]) -> tuple[float, float]:
    """Median what-if step time of the straggler run without it, and median real step time without it."""
    blame = runs["straggler"].blame
    assert blame is not None
    clean = [
        t
        for name in ("clean_before", "clean")
        for t in step_times_from_spans(runs[name].index.step_spans).values()
    ]
    return median(blame.whatif_step_ns[STRAGGLER].values()), median(clean)


def test_rank_2_is_the_top_straggler_in_almost_every_step(runs: dict[str, AnalysisResult]) -> None:
    tops = runs["straggler"].top_straggler_by_step()
    steps = sorted({s for (_r, s) in runs["straggler"].index.step_spans})
    assert len(steps) >= 5
    hits = sum(1 for s in steps if tops.get(s) == STRAGGLER)
    if hits / len(steps) < 0.95:
        # 4 ranks share 2 cores here: a rank starved of CPU is a real straggler of its step. Only when the
        # run without an injected straggler shows stragglers as large as the injected one is a miss blamed
        # on the machine rather than on the analysis.
        noise = max(runs["clean"].skew.caused_wait_by_step.values(), default=0)
        if noise >= STRAGGLER_MS * 1e6:
            pytest.skip(
                f"machine too noisy: without an injected straggler a rank still caused {noise / 1e6:.0f} ms "
                f"of peer wait in one step (>= the injected {STRAGGLER_MS:.0f} ms); top per step: {tops}"
            )
    assert hits / len(steps) >= 0.95, f"top straggler per step: {tops}"
    cause = runs["straggler"].skew.top_cause[STRAGGLER]
    assert cause.kind is CauseKind.COMPUTE and cause.op == "aten::mm", cause


def test_peers_wait_about_the_injected_40_ms_at_the_next_collective(runs: dict[str, AnalysisResult]) -> None:
    res = runs["straggler"]
    firsts: dict[int, float] = {}
    for e in res.skew.events:  # in order of last arrival: the first collective of each step with rank 2
        if e.kind == "collective" and STRAGGLER in e.ranks and e.step not in firsts:
            peers = [w for r, w in zip(e.ranks, e.wait_ns.tolist(), strict=True) if r != STRAGGLER]
            assert e.blamed_rank == STRAGGLER, f"step {e.step}: {e.pg_name}#{e.seq} blamed on {e.blamed_rank}"
            firsts[e.step] = max(peers) / 1e6
    assert median(firsts.values()) == pytest.approx(STRAGGLER_MS, rel=0.20), firsts


def test_what_if_without_the_straggler_is_close_to_a_real_run_without_it(
    runs: dict[str, AnalysisResult], tmp_path: Path
) -> None:
    # The 10% target is measured by benchmarks/whatif_accuracy.py over several bracketed trios:
    # with 4 ranks on 2 CPU cores two real runs without a straggler already differ by ~10% from one
    # trio to the next, so a single trio is checked at 25% (the what-if bugs this guards against were
    # off by 40% or more: the straggler's cost replayed as fixed waits).
    whatif, reference = _whatif_and_reference_ns(runs)
    if abs(whatif - reference) > 0.25 * reference:
        # a burst of other load during one of the module's three captures: one fresh trio decides
        whatif, reference = _whatif_and_reference_ns(_bracketed(tmp_path))
    assert whatif == pytest.approx(reference, rel=0.25)


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
    assert res.skew.top_cause[SLOW_SENDER].kind is CauseKind.LATE_SEND
