"""Ctrl-C during ``skewlens demo``: the ``skewlens`` it runs is told once, as Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from skewlens.cli.demo import run_child

#: A command that logs whether it leads a process group of its own, then each signal it gets, and ends.
CHILD = """
import os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def note(signum, frame):
    log.write(signal.Signals(signum).name + "\\n")
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
log.write(f"own group: {os.getpgrp() == os.getpid()}\\n")
time.sleep(60)
"""


def test_ctrl_c_reaches_the_skewlens_the_demo_runs_once_as_ctrl_c_not_as_sigterm(tmp_path: Path) -> None:
    # it ran in the demo's process group: the terminal's Ctrl-C reached it, then the SIGTERM the demo passed
    # on, and skewlens profile took that for a stop by SIGTERM ("error: command exited with code 1")
    log, script = tmp_path / "signals.txt", tmp_path / "child.py"
    script.write_text(CHILD)

    def ctrl_c_once_started() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.exists() and "own group" in log.read_text():
                os.kill(os.getpid(), signal.SIGINT)  # the demo's Ctrl-C (the terminal's reaches it alone)
                return
            time.sleep(0.01)

    t = threading.Thread(target=ctrl_c_once_started)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        run_child([sys.executable, str(script), str(log)])
    t.join()
    assert log.read_text().splitlines() == ["own group: True", "SIGINT"]
