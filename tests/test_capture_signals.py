"""SIGTERM (how torchrun stops surviving ranks) never leaves a rank's trace without its part file.

The child process saves its window with the part-file write held at its start: it says so on stdout and
waits there until the SIGTERM the parent then sends has been through the capture's handler. The handler
must let the save finish, then terminate the process by SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from skewlens.profiler.capture.session import part_file

IN_WRITE = "in the part-file write"
PUT_OFF = "SIGTERM put off"

CHILD = f"""
import signal, sys, threading
import skewlens.profiler.capture.session as session
from skewlens.profiler.capture.session import CaptureSession
from skewlens.profiler.manifest import StepWindow

handled = threading.Event()
write = session._write_json_atomic


def write_once_sigterm_was_handled(path, data):
    print({IN_WRITE!r}, flush=True)  # the parent sends SIGTERM now
    if not handled.wait(60):  # (a lock wait: the signal's handler runs meanwhile, on this thread)
        print("no SIGTERM came", flush=True)
    write(path, data)


session._write_json_atomic = write_once_sigterm_was_handled
s = CaptureSession(sys.argv[1], window=StepWindow(wait=0, warmup=0, active=2), auto_step=False).install()
capture_handler = signal.getsignal(signal.SIGTERM)


def handler_then_resume(signum, frame):
    capture_handler(signum, frame)  # puts the signal off while the save runs
    print({PUT_OFF!r}, flush=True)
    handled.set()


signal.signal(signal.SIGTERM, handler_then_resume)
s.step()
s.step()  # the window ends: save
threading.Event().wait(60)
print("not terminated", flush=True)
"""


def _written(pipe: IO[bytes]) -> str:
    """What an ended process wrote into ``pipe``, without waiting for the pipe's end."""
    os.set_blocking(pipe.fileno(), False)
    return (pipe.read() or b"").decode()


def test_sigterm_during_the_window_save_waits_for_the_part_file_then_terminates(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline().decode().strip()  # the child is inside the part-file write, waiting
        assert first == IN_WRITE, _written(proc.stderr) or first
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # (a guard against a hang only)
        # what the child wrote, read once it has ended, not to the pipes' end: communicate() waited for
        # that, which never came in one fast-tier run: the child had ended by SIGTERM and the wait timed
        # out after 60 s (likely a process forked meanwhile by another thread of pytest's held the pipes)
        rest, err = _written(proc.stdout), _written(proc.stderr)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert rest.split("\n")[0] == PUT_OFF
    assert "no SIGTERM came" not in rest and "not terminated" not in rest
    part = json.loads(part_file(run, 0).read_text())
    assert part["rank"] == 0 and len(part["steps"]) == 2
    assert (run / "rank-0.et").is_file()


HUNG = """
import os, sys, time, torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
open(os.path.join(sys.argv[1], f"pid-{rank}"), "w").write(str(os.getpid()))
dist.recv(torch.ones(4), src=1 - rank)  # each waits for the other: both blocked in C++, for 10 min
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_profile_leaves_no_hung_rank_running(tmp_path: Path) -> None:
    script, pids = tmp_path / "hung.py", tmp_path / "pids"
    script.write_text(HUNG)
    pids.mkdir()
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(tmp_path / "run"), "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(script), str(pids),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [int(p.read_text()) for p in pids.iterdir()]
        assert len(ranks) == 2
        time.sleep(2)  # both in their recv
        proc.send_signal(signal.SIGTERM)  # timeout, scancel
        proc.wait(timeout=60)
        # a blocked main thread never runs the capture's SIGTERM handler; before, torchrun was killed
        # after the grace period and both ranks ran on, orphaned, until gloo's timeout. The ranks are sent
        # SIGKILL as skewlens profile returns; their end is waited for (up to 20 s, not a fixed 1 s: a
        # loaded machine can take longer to tear a process down), a rank left running is still one alive
        gone = time.monotonic() + 20
        while any(_alive(r) for r in ranks) and time.monotonic() < gone:
            time.sleep(0.1)
        assert [r for r in ranks if _alive(r)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for r in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_a_command_killed_by_a_signal_exits_with_128_plus_the_signal_as_a_shell_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a host whose ranks hung was killed after the grace period: skewlens profile exited with status 247
    # (sys.exit(-9)) and said "command exited with code -9"
    from skewlens.cli import main as skewlens_main

    assert (
        skewlens_main(["profile", "--out", str(tmp_path / "run"), "--", "sh", "-c", "kill -KILL $$"]) == 137
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("skewlens profile: error: command was killed by SIGKILL: sh -c"), last


def _sigterm_once_ready(ready: Path) -> None:
    """SIGTERM this process once the command has written ``ready`` (it then ignores SIGTERM); before: at a
    fixed 0.5 s, racing the command's trap."""

    def stop() -> None:
        for _ in range(600):
            if ready.exists():
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop, daemon=True).start()


def test_a_command_killed_after_the_sigterm_grace_period_is_said_to_be_killed_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # a rank blocked in a collective (its peer on another host frozen) ignores SIGTERM; skewlens profile
    # killed it 20 s later without a word
    from skewlens.profiler.capture import run as run_mod

    monkeypatch.setattr(run_mod, "TERM_GRACE_S", 1.0)
    ready = tmp_path / "ready"

    _sigterm_once_ready(ready)
    code = run_mod.run_command(["sh", "-c", f"trap '' TERM; : > '{ready}'; sleep 30"], dict(os.environ))
    assert code == -signal.SIGKILL
    assert "the command did not end within 1 s of SIGTERM: killed it" in capsys.readouterr().err


@pytest.mark.parametrize("saved", [(0, 1), (1,)])
def test_a_command_killed_after_every_rank_saved_is_not_said_to_have_a_rank_that_cannot_save(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    saved: tuple[int, ...],
) -> None:
    # a PPO loop's 2 ranks hung at exit (torch: a gloo worker waiting for the GIL that the main thread held
    # while joining it) after both had saved their traces; killed 30 s after Ctrl-C, skewlens profile said
    # that a rank blocked in a collective cannot save its trace
    from skewlens.profiler.capture import run as run_mod

    run = tmp_path / "run"
    for r in saved:
        part_file(run, r).parent.mkdir(parents=True, exist_ok=True)
        part_file(run, r).write_text(json.dumps({"rank": r, "world_size": 2, "steps": []}))
        run_mod.rank_file(run, r).write_text("trace")
    monkeypatch.setattr(run_mod, "TERM_GRACE_S", 1.0)
    ready = tmp_path / "ready"

    _sigterm_once_ready(ready)
    command = ["sh", "-c", f"trap '' TERM; : > '{ready}'; sleep 30"]
    assert run_mod.run_command(command, dict(os.environ), run_dir=run) == -signal.SIGKILL
    err = capsys.readouterr().err
    assert "the command did not end within 1 s of SIGTERM: killed it" in err
    if saved == (0, 1):
        assert "cannot save its trace" not in err
        assert "Every rank had saved its trace (ranks 0-1, kept)" in err
    else:  # rank 0 may be the one blocked
        assert "A rank blocked in a collective" in err
        assert "cannot save its trace (rank 1: saved, kept)" in err
