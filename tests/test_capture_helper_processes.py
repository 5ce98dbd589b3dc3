"""Processes of a captured command that are not ranks: the launcher of ``mp.spawn``, DataLoader workers
started with the spawn or forkserver method, any helper that imports torch.

Every process that imports torch under ``skewlens profile`` gets a capture session. With a window that
has no wait, it begins when torch is imported; at the ``ops`` level that is a Kineto session, which must
not run in a DataLoader worker, and must never be left running when a process exits (the interpreter
then dies of SIGSEGV as it finalizes).
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from skewlens.profiler.capture.schedule import parse_window
from skewlens.profiler.capture.session import CaptureSession


def test_a_process_started_by_multiprocessing_begins_its_window_when_it_joins_a_job_or_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a DataLoader worker started with the spawn method is called while it imports torch
    monkeypatch.setattr(multiprocessing.current_process(), "name", "SpawnProcess-1")
    session = CaptureSession(tmp_path / "run", level="ops", window=parse_window("0:1:2"), auto_step=False)
    session.install()
    try:
        assert session._kineto is None  # before: a Kineto session, from the import on
        assert not torch.autograd._profiler_enabled()
        session.step()  # a process that steps is a rank: its window begins
        assert session._kineto is not None and torch.autograd._profiler_enabled()
    finally:
        session._stop_unsaved()
        session.uninstall()
    assert not torch.autograd._profiler_enabled()


def test_a_process_that_recorded_no_step_stops_its_profiler_at_exit(tmp_path: Path) -> None:
    session = CaptureSession(tmp_path / "run", level="ops", window=parse_window("0:1:2"), auto_step=False)
    session.install()
    try:
        assert torch.autograd._profiler_enabled()  # the main process of a script begins at once
        session._at_exit()
        assert not torch.autograd._profiler_enabled()  # before: left running into finalization
        assert not (tmp_path / "run" / "rank-0.et").exists()  # nothing recorded, nothing saved
    finally:
        session._stop_unsaved()
        session.uninstall()


@pytest.mark.slow
def test_a_process_importing_torch_only_exits_cleanly_at_the_ops_level_with_no_wait(
    tmp_path: Path,
) -> None:
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(tmp_path / "run"), "--level", "ops",
        "--steps", "0:1:2", "--", sys.executable, "-c", "import torch; print('imported', flush=True)",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert "imported" in res.stdout
    assert "exited with code -11" not in res.stderr  # before: SIGSEGV at exit, every time
    assert "no rank saved a trace" in res.stderr  # the one complaint left: it ran no step


def _session_with_steps(run: Path) -> CaptureSession:
    session = CaptureSession(run, level="collectives", window=parse_window("0:0:50"), auto_step=False)
    session.install()
    for _ in range(3):
        torch.randn(8, 8).sum()
        session.step()
    return session


def test_a_copy_of_a_ranks_session_in_a_forked_process_saves_nothing_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from skewlens.profiler.capture import session as session_module

    run = tmp_path / "run"
    session = _session_with_steps(run)
    try:
        pid = os.getpid()
        # a fork Pool's worker, forked inside the window, holds this session as it was at the fork
        monkeypatch.setattr(session_module.os, "getpid", lambda: pid + 1)
        session._at_exit()
        assert not (run / "rank-0.et").exists()  # before: the worker saved the rank's trace of 3 steps
        monkeypatch.undo()
        session._at_exit()  # the rank itself still saves its partial trace
        assert (run / "rank-0.et").is_file() and len(session.steps) == 3
    finally:
        session._stop_unsaved()
        session.uninstall()


def _sleep(asleep: Any) -> None:
    import time

    asleep.set()
    time.sleep(60)


@pytest.mark.slow
def test_a_forked_helper_terminated_inside_the_window_dies_of_sigterm_writing_nothing(tmp_path: Path) -> None:
    # multiprocessing stops a fork Pool's workers with SIGTERM (Pool.__exit__, or at exit for a pool kept
    # open: on 2 gloo ranks, rank 1's pool worker, forked at step 5, then saved 2 of its 6 steps over the
    # rank's whole trace); torch's DataLoader workers put a SIGTERM handler of their own in place
    run = tmp_path / "run"
    session = _session_with_steps(run)
    try:
        ctx = multiprocessing.get_context("fork")
        asleep = ctx.Event()
        worker = ctx.Process(target=_sleep, args=(asleep,), daemon=True)
        worker.start()
        # in its sleep (before, a fixed 0.5 s: on a loaded machine the SIGTERM could come first)
        assert asleep.wait(timeout=60)
        worker.terminate()
        worker.join(timeout=30)
        assert worker.exitcode == -15
        # before: the worker's copy of the SIGTERM handler saved the rank's 3 steps as rank 0's trace
        assert sorted(p.name for p in run.rglob("*") if p.is_file()) == []
    finally:
        session._stop_unsaved()
        session.uninstall()
