"""Shared fixtures (synthetic run builders, the real GPU traces in ../shared/traces); the slow-marker check.

Tests that start torch ranks (torchrun, ``skewlens profile`` / ``demo``, ``mp.spawn``, several Python
processes) fail unless marked ``slow``: see :mod:`slow_guard`. ``pytest -m "not slow"`` is the fast tier.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slow_guard import install, pytest_runtest_makereport, pytest_runtest_protocol

from skewlens.analysis.records import BlameRecord
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

__all__ = ["pytest_runtest_makereport", "pytest_runtest_protocol"]

install()

# A test run started in the background of a script (`pytest ... &`, no job control) inherits Ctrl-C
# ignored, and so would every command the tests start: the tests of what Ctrl-C does (to `skewlens
# profile`, the demo, a real replay) then waited out their commands and failed. They need Ctrl-C as a
# terminal gives it; a handler set here is reset to the default in the processes the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    """The folder of real GPU traces; tests using it skip with a clear message where it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real GPU traces not found at {SHARED_TRACES} (see shared/traces/README.md)")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def dlrm_imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-GPU DLRM traces (Kineto + host execution traces) imported once for the session; read only."""
    kineto, host = SHARED_TRACES / "dlrm_8gpu_kineto.tar.gz", SHARED_TRACES / "dlrm_8gpu_host_et.tar.gz"
    if not kineto.is_file():
        pytest.skip(f"real GPU traces not found at {SHARED_TRACES} (see shared/traces/README.md)")
    from skewlens.profiler.importers import import_traces

    out = tmp_path_factory.mktemp("dlrm") / "run"
    import_traces([kineto], [host], out)
    return out


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """4 ranks, 2 steps of a compute (rank r 2 ms + r x 0.1 ms) and an all_reduce, 2.6 ms apart: a run to
    replay (a test file may define its own ``run_dir``)."""
    b = RunBuilder(world_size=4)
    for r in range(4):
        rb = b.rank(r)
        t = 0
        for s in range(2):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=2_000_000 + 100_000 * r, start_ns=t)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=300_000 - 100_000 * r)
            t += 2_600_000
    return b.write(tmp_path / "run")


@pytest.fixture
def run_builder() -> type[RunBuilder]:
    return RunBuilder


@pytest.fixture
def host_gap_blame() -> Callable[[int, int], BlameRecord]:
    """``(cost_ns, caused_wait_ns) -> `` rank 1's blame record over 400 ms of simulated steps, its cause
    ``host idle/gap +29.6 ms``."""

    def record(cost_ns: int, caused_ns: int) -> BlameRecord:
        return BlameRecord(
            rank=1,
            straggler_cost_ns=cost_ns,
            baseline_ns=400_000_000,
            whatif_ns=400_000_000 - cost_ns,
            steps_top=0,
            caused_wait_ns=caused_ns,
            cause_kind="host_gap",
            cause_op=None,
            cause="host idle/gap +29.6 ms",
            simulated=True,
        )

    return record


@pytest.fixture
def recorded_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.sleep`` of the test's own thread recorded instead of slept. Only that thread's: the patch is
    process-wide, and a thread another test left running (a sampler, a watchdog) that sleeps meanwhile
    must neither land in the list nor spin."""
    slept: list[float] = []
    mine, real = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == mine:
            slept.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return slept
