"""A captured program exits as cleanly as it would without skewlens.

torch 2.13's gloo worker threads free a finished collective's tensors a moment after the caller returned,
which takes the GIL; a thread still waiting for the GIL when the interpreter finalizes ends inside a C++
destructor and the process aborts ("terminate called without an active exception"). The capture waits a
little at exit with the GIL released, after its atexit save (:func:`skewlens.profiler.capture.session.
grace_at_exit`), so that such a thread gets it first.

The real-run test forces that moment instead of waiting for it to happen by chance: rank 0's last
collective waits on gloo's worker for rank 1, which completes it only when the capture's atexit save
begins; rank 0 then holds the GIL (no call that releases it, a switch interval of an hour) until the
worker's thread state appears, i.e. the worker is waiting for the GIL. From there only what runs at exit
can let it in: the grace does; without it the worker finds the interpreter finalizing, every time (a
collected cycle in the finalization releases the GIL once, so that the worker does not wait for ever).
"""

from __future__ import annotations

import atexit
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from capture_helpers import profile

from skewlens.profiler.capture.session import EXIT_GRACE_S, CaptureSession, grace_at_exit
from skewlens.profiler.manifest import StepWindow, read_manifest

ASKED = "rank 0: gloo's worker asked for the GIL during the capture's atexit save"
FREED_IN_GRACE = "rank 0: the worker freed the tensor while the main thread was in grace_at_exit"

SCRIPT = r"""
import ctypes, gc, os, sys, threading, time, weakref
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

go = sys.argv[1]  # rank 0 creates it when rank 1 may complete the last collective
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(8):
    model(torch.randn(32, 256)).square().mean().backward()
    opt.step()
    opt.zero_grad()

if dist.get_rank() == 1:
    deadline = time.monotonic() + 120
    while not os.path.isdir(go) and time.monotonic() < deadline:
        time.sleep(0.005)
    dist.broadcast(torch.ones(16), src=1)
    sys.exit(0)

api = ctypes.pythonapi  # (a PyDLL: its calls keep the GIL)
libc = ctypes.PyDLL(None)  # the same, for mkdir
api.PyInterpreterState_Get.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
api.PyThreadState_Next.restype = ctypes.c_void_p
api.PyThreadState_Next.argtypes = [ctypes.c_void_p]


def thread_states():
    n, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while ts:
        n, ts = n + 1, api.PyThreadState_Next(ts)
    return n


main, seen = threading.get_ident(), []


def freed(_ref):  # on gloo's worker thread, which holds the GIL here
    frame = sys._current_frames().get(main)
    where = frame.f_code.co_name if frame is not None else "?"
    line = f"rank 0: the worker freed the tensor while the main thread was in {where}\n"
    os.write(2, ("".join(seen) + line).encode())


t = torch.zeros(16)
ref = weakref.ref(t, freed)
dist.broadcast(t, src=1, async_op=True)  # waits on gloo's worker thread for rank 1
del t  # the worker holds the last reference: it frees the tensor, with the GIL, once rank 1 sent


def at_the_save(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "_at_exit" and "capture" in frame.f_code.co_filename:
        sys.setprofile(None)
        time.sleep(0.05)  # (GIL released) a thread still freeing an earlier collective's tensors finishes
        # counted before go, with the GIL held from here (mkdir through the PyDLL keeps it): the thread
        # states can only grow, and the worker's comes after the count whatever the scheduler does. Before,
        # os.mkdir (which releases the GIL) made go first, and rank 1 slept 50 ms so that the count came
        # before the worker's state: a rank 0 descheduled for 50 ms at that point (2 loaded cores) counted
        # the worker's state in `before` and spun the whole minute, with nothing to see
        before = thread_states()
        assert libc.mkdir(go.encode(), 0o755) == 0
        deadline = time.monotonic() + 60
        while thread_states() <= before and time.monotonic() < deadline:
            pass  # holding the GIL
        if thread_states() > before:
            seen.append("rank 0: gloo's worker asked for the GIL during the capture's atexit save\n")


class AtFinalization:
    def __init__(self):
        self.cycle = self  # collected in the interpreter's finalization (automatic collection is off)

    def __del__(self, ref=ref, sleep=time.sleep, write=os.write, seen=seen):
        if ref() is not None:
            write(2, ("".join(seen) + "rank 0: finalizing with the tensor alive\n").encode())
            sleep(30)  # the GIL released: the waiting worker takes it


sys.setswitchinterval(3600)  # a thread waiting for the GIL never makes this one give it up
sys.setprofile(at_the_save)
gc.disable()
AtFinalization()
"""


@pytest.mark.slow
def test_a_ddp_program_whose_last_collective_frees_its_tensor_as_it_exits_exits_cleanly(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train_exit.py"
    script.write_text(SCRIPT)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
        str(tmp_path / "go"),
    ]  # fmt: skip
    res = profile(tmp_path / "run", level="collectives", steps="1:1:4", command=cmd)
    assert "terminate called" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 0, res.stderr[-3000:]
    assert ASKED in res.stderr, res.stderr[-3000:]  # the worker did wait for the GIL at exit ...
    assert FREED_IN_GRACE in res.stderr  # ... and got it in the grace
    assert read_manifest(tmp_path / "run").ranks == (0, 1)


@pytest.mark.slow
def test_a_program_that_ends_inside_the_window_keeps_its_recorder_only_collectives_and_numbers(
    tmp_path: Path,
) -> None:
    # tp.py destroys its process group at the end; a 10-step window over 4 steps is saved at exit. The
    # recorder keeps its entries after the group is gone: DTensor's functional collectives (the recorder's
    # only) stay in the trace, and every collective has the recorder's number, so the run loads
    from capture_helpers import ROOT

    from skewlens.profiler.store.validate import load_validated

    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(ROOT / "examples" / "tp.py"), "--steps", "4",
    ]  # fmt: skip
    res = profile(tmp_path / "run", level="collectives", steps="1:1:10", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    notes = read_manifest(tmp_path / "run").notes
    for r in (0, 1):
        assert "partial trace" in notes[f"rank {r}"]
        assert "taken from the flight recorder" in notes[f"rank {r} flight recorder"]
    run = load_validated(tmp_path / "run")
    assert all(len(c.ranks) == 2 for c in run.collectives) and len(run.collectives) > 0


def test_the_exit_grace_is_registered_to_run_after_the_atexit_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CaptureSession(tmp_path / "run", window=StepWindow(wait=100, warmup=0, active=1), auto_step=False)
    ours, registered = (grace_at_exit, s._at_exit), []
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(f: Any, *args: Any, **kwargs: Any) -> Any:
        return registered.append(f) if f in ours else real_register(f, *args, **kwargs)

    def unregister(f: Any) -> None:
        if f not in ours:
            real_unregister(f)

    monkeypatch.setattr(atexit, "register", register)
    monkeypatch.setattr(atexit, "unregister", unregister)
    monkeypatch.setattr(signal, "signal", lambda *_a: None)  # (the capture's SIGTERM handler)
    s.install()
    try:
        assert registered == [grace_at_exit, s._at_exit]  # atexit runs the last first: save, then grace
    finally:
        s.uninstall()


def test_the_exit_grace_sleeps_which_releases_the_gil(recorded_sleeps: list[float]) -> None:
    grace_at_exit()
    assert recorded_sleeps == [EXIT_GRACE_S]
