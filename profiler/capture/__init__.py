"""Capture: run a training job with hooks in every rank and write a skewlens run directory.

Two ways in:

- ``skewlens profile --out RUN_DIR -- torchrun ... train.py`` (no edits to the script: a bootstrap
  ``sitecustomize`` starts a :class:`CaptureSession` in every rank, steps are detected from
  ``optimizer.step()``);
- the Python API, for scripts that mark steps themselves::

      from skewlens.profiler.capture import capture
      with capture("runs/x", level="collectives", steps="1:1:3") as cap:
          for batch in data:
              train_step(batch)
              cap.step()
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skewlens.profiler.vocab import HostTrace, Level

if TYPE_CHECKING:
    from skewlens.profiler.capture.schedule import Action, action_for, parse_window
    from skewlens.profiler.capture.session import CaptureSession, cuda_gpu
    from skewlens.profiler.manifest import StepWindow

__all__ = ["Action", "CaptureSession", "action_for", "capture", "cuda_gpu", "parse_window"]

#: The names this package exports, by module: imported when first used, so that the bootstrap's
#: ``autostart`` (imported by every Python process of a wrapped command) does not import numpy and the
#: trace store into processes that never import torch.
_LAZY = {
    "Action": "schedule",
    "action_for": "schedule",
    "parse_window": "schedule",
    "CaptureSession": "session",
    "cuda_gpu": "session",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def capture(
    run_dir: str | Path,
    *,
    level: Level | str = Level.COLLECTIVES,
    steps: str | StepWindow = "1:1:3",
    auto_step: bool = False,
    keep_raw: bool = False,
    merge_timeout_s: float = 30.0,
    host_trace: HostTrace | str = HostTrace.PROFILER,
) -> Iterator[CaptureSession]:
    """Capture the steps marked with ``session.step()`` (or ``optimizer.step()`` with ``auto_step``).

    Call it after ``init_process_group`` on every rank. On exit each rank saves its trace; rank 0 then
    waits (up to ``merge_timeout_s``) for the other ranks' part files and writes ``manifest.json``.
    Collectives issued outside ``torch.distributed``'s Python functions (functional, C++) are taken from
    the flight recorder when it is on: set ``TORCH_FR_BUFFER_SIZE`` (e.g. 20000) before
    ``init_process_group`` (``skewlens profile`` does this for you).

    Under ``skewlens profile`` it gives the session profile started in this process: the steps marked with
    ``session.step()`` (only those, unless ``auto_step``) go into profile's run, at its ``--level`` and
    ``--steps``, and profile writes its manifest; rank 0 says so on stderr.
    """
    from skewlens.profiler.capture.autostart import profiled

    if (profiling := profiled()) is not None:
        yield _joined(profiling, run_dir, auto_step=auto_step)
        return
    import torch.distributed as dist

    from skewlens.profiler.capture.flight import refuse_wrapped_groups
    from skewlens.profiler.capture.run import finalize_run
    from skewlens.profiler.capture.schedule import Action, parse_window
    from skewlens.profiler.capture.session import CaptureSession, part_file

    if dist.is_available() and dist.is_initialized():
        refuse_wrapped_groups(dist.get_debug_level().name, "this process's torch.distributed debug level")
    window = parse_window(steps) if isinstance(steps, str) else steps
    session = CaptureSession(
        run_dir, level=level, window=window, keep_raw=keep_raw, auto_step=auto_step, host_trace=host_trace
    ).install()
    try:
        yield session
    except BaseException:
        session.save(partial=session.action != Action.DONE)
        raise
    else:
        session.close()
    finally:
        session.uninstall()
        if session.rank == 0:
            world = session.world_size
            deadline = time.monotonic() + merge_timeout_s
            root = Path(run_dir)
            while time.monotonic() < deadline and not all(part_file(root, r).is_file() for r in range(world)):
                time.sleep(0.05)
            finalize_run(root, level=Level(level), window=window, world_size=world)


def _joined(session: CaptureSession, run_dir: str | Path, *, auto_step: bool) -> CaptureSession:
    """The session ``skewlens profile`` runs in this process, whose steps the program marks from now on
    (unless ``auto_step``); rank 0 says where they go. A second session of its own would capture the
    program into ``run_dir`` while profile's, whose steps nothing marked, saved none."""
    import sys

    if not auto_step:
        session.steps_by_hand(by_program=True)
    if session.rank == 0:
        w = session.window
        print(
            f"skewlens: capture({str(run_dir)!r}) under skewlens profile: the steps the program marks are "
            f"recorded into {str(session.run_dir)!r}, at profile's --level {session.level.value} and "
            f"--steps {w.wait}:{w.warmup}:{w.active}; capture()'s run directory, level, steps, keep_raw and "
            "host_trace are not used",
            file=sys.stderr,
        )
    return session
