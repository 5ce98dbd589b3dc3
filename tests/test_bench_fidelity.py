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
