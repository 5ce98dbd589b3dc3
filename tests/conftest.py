"""Shared fixtures: synthetic run builders and the real GPU traces in ../shared/traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from skewlens.profiler.synth import RunBuilder

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    """The folder of real GPU traces; tests using it skip with a clear message where it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real GPU traces not found at {SHARED_TRACES} (see shared/traces/README.md)")
    return SHARED_TRACES


@pytest.fixture
def run_builder() -> type[RunBuilder]:
    return RunBuilder
