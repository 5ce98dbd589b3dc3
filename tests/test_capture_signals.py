"""SIGTERM (how torchrun stops surviving ranks) never leaves a rank's trace without its part file.

The child process saves its window with the part-file write slowed down, and receives SIGTERM in the
middle of that save: the handler must let the save finish, then terminate the process by SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from skewlens.profiler.capture.session import part_file

CHILD = """
import os, signal, sys, threading, time
import skewlens.profiler.capture.session as session
from skewlens.profiler.capture.session import CaptureSession
from skewlens.profiler.manifest import StepWindow

write = session._write_json_atomic
def slow_write(path, data):
    time.sleep(0.6)  # SIGTERM arrives in here
    write(path, data)
session._write_json_atomic = slow_write

s = CaptureSession(sys.argv[1], window=StepWindow(wait=0, warmup=0, active=2), auto_step=False).install()
s.step()
threading.Thread(target=lambda: (time.sleep(0.2), os.kill(os.getpid(), signal.SIGTERM)), daemon=True).start()
s.step()  # the window ends: save
print("saved", flush=True)
time.sleep(20)
print("not terminated", flush=True)
"""


def test_sigterm_during_the_window_save_waits_for_the_part_file_then_terminates(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == -signal.SIGTERM, res.stderr[-2000:]
    assert "not terminated" not in res.stdout
    part = json.loads(part_file(run, 0).read_text())
    assert part["rank"] == 0 and len(part["steps"]) == 2
    assert (run / "rank-0.et").is_file()
