"""benchmarks/pin: the fidelity benchmark's placement of ranks on cores, as every worker process sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skewlens.profiler.capture.bootstrap import __file__ as bootstrap_init

PIN_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "pin"
BOOTSTRAP_DIR = Path(bootstrap_init).parent
CORES = sorted(os.sched_getaffinity(0))


def _affinity(env: dict[str, str], *path: Path) -> list[int]:
    """The cores a fresh interpreter may run on, started with ``env`` and ``path`` on PYTHONPATH."""
    drop = ("LOCAL_RANK", "SKEWLENS_BENCH_PIN", "PYTHONPATH")
    base = {k: v for k, v in os.environ.items() if k not in drop}
    full = {**base, **env, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    res = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"],
        env=full,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return list(json.loads(res.stdout))


@pytest.mark.parametrize("local_rank", [0, 1, 2, 3])
def test_a_worker_is_pinned_to_its_local_rank_modulo_the_cores(local_rank: int) -> None:
    env = {"SKEWLENS_BENCH_PIN": "1", "LOCAL_RANK": str(local_rank)}
    assert _affinity(env, PIN_DIR) == [CORES[local_rank % len(CORES)]]


def test_a_worker_under_skewlens_profiles_bootstrap_is_pinned_the_same_way() -> None:
    env = {"SKEWLENS_BENCH_PIN": "1", "LOCAL_RANK": "1"}
    assert _affinity(env, BOOTSTRAP_DIR, PIN_DIR) == [CORES[1 % len(CORES)]]


def test_a_process_without_a_local_rank_or_without_the_switch_keeps_every_core() -> None:
    assert _affinity({"SKEWLENS_BENCH_PIN": "1"}, PIN_DIR) == CORES
    assert _affinity({"LOCAL_RANK": "1"}, PIN_DIR) == CORES


def test_the_pooled_real_replay_error_compares_medians_over_captures_and_reports_their_spread() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fidelity_bench", PIN_DIR.parent / "fidelity.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)

    def fig(rec: dict[int, float] | None, rep: dict[int, float] | None) -> object:
        return mod.Figures(
            sim_error=0.0,
            calibrated_error=None,
            blamed_ms=0.0,
            real_cost_ms=0.0,
            top_is_straggler=True,
            recorded_ms=rec,
            replayed_ms=rep,
        )

    # gloo ran fast in capture 0 and slow in capture 2; each replay lands near the middle
    figs = [fig({0: 80.0, 1: 90.0}, {0: 100.0, 1: 99.0}), fig({0: 100.0, 1: 100.0}, {0: 101.0, 1: 100.0})]
    figs += [fig({0: 120.0, 1: 110.0}, {0: 99.0, 1: 102.0}), fig(None, None)]
    assert [f.real_error for f in figs[:3]] == pytest.approx([0.25, 0.01, 0.175])
    error, spread = mod.pooled(figs)
    assert error == pytest.approx(0.0)  # rank 0: median 100 vs 100; rank 1: 100 vs 100
    assert spread == pytest.approx(0.4)  # rank 0: (120 - 80) / 100
    assert mod.pooled([fig(None, None)]) is None
