"""Simulated replay of a real captured run: the example on 4 gloo ranks, replayed as recorded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.replay.driver import load_trace
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not EXAMPLE.is_file() or importlib.util.find_spec("skewlens.profiler.capture") is None:
        pytest.skip("capture (profiler/capture, examples/train.py) is not available")
    run = tmp_path_factory.mktemp("captured") / "run"
    res = profile(run, "--steps", "6", steps="1:1:3", nproc=4)
    if res.returncode != 0:
        pytest.fail(f"capture failed ({res.returncode}): {res.stderr[-2000:]}")
    return run


@pytest.mark.slow
def test_replaying_the_unmodified_capture_reproduces_each_ranks_measured_step_time(captured: Path) -> None:
    run = load_trace(captured)
    res = simulate(run)
    spans = res.step_spans()
    measured = {(s.rank, s.step): s.end_ns - s.start_ns for s in run.manifest.steps}
    if not measured:  # no step marks in the manifest: measure from the recorded nodes
        measured = {
            (r, int(k)): int(rt.end_ns[rt.step == k].max() - rt.start_ns[rt.step == k].min())
            for r, rt in run.ranks.items()
            for k in set(rt.step.tolist()) - {-1}
        }
    assert len(measured) >= 4 * 2
    for key, want in measured.items():
        a, b = spans[key]
        assert abs((b - a) - want) <= 0.05 * want, (key, b - a, want)


@pytest.mark.slow
def test_slowing_one_rank_of_the_capture_never_speeds_up_a_step(captured: Path) -> None:
    run = load_trace(captured)
    base = simulate(run)
    slow = simulate(run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(2,), factor=1.5)]))
    for k in base.steps():
        assert slow.step_time_ns(k) >= base.step_time_ns(k)
    assert sum(slow.step_time_ns(k) for k in base.steps()) > sum(base.step_time_ns(k) for k in base.steps())


def test_replaying_imported_gpu_traces_reproduces_each_ranks_span(dlrm_imported: Path) -> None:
    run = load_trace(dlrm_imported)
    res = simulate(run)
    assert len(run.ranks) == 8 and len(run.collectives) > 0
    for r, rt in run.ranks.items():
        timed = rt.node_type != 1
        recorded = int(rt.end_ns[timed].max() - rt.start_ns[timed].min())
        replayed = int(res.end_ns[r][timed].max() - res.start_ns[r][timed].min())
        assert abs(replayed - recorded) <= 0.01 * recorded, (r, replayed, recorded)
