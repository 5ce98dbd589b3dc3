"""Benchmark-only bootstrap for ``capture_overhead.py --inprocess`` (never shipped, never on a user's path).

Put after skewlens' own bootstrap on PYTHONPATH (it chains here). With ``SKEWLENS_BENCH_TOGGLE`` set to
``profiler``, ``hooks`` or ``both``, the capture session of a ``collectives``-level run switches that
part of itself off and on again in blocks of ``SKEWLENS_BENCH_BLOCK`` steps from step
``SKEWLENS_BENCH_FIRST`` on (blocks with an even index on, odd ones off; the benchmark sets both), so that
one run holds both sides: the same processes, threads and memory, which is what differs most between
whole runs on a 2-core machine.
"""

import os
import sys

_WHAT = os.environ.get("SKEWLENS_BENCH_TOGGLE", "")
_BLOCK = int(os.environ.get("SKEWLENS_BENCH_BLOCK", "8"))
FIRST = int(os.environ.get("SKEWLENS_BENCH_FIRST", "12"))


def _install() -> None:
    from skewlens.profiler.capture import autostart

    # start the session here, after patching it (skewlens' bootstrap would start it on `import torch`)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, autostart._TorchWatcher)]
    import torch  # noqa: F401
    from torch._C._autograd import _disable_profiler

    from skewlens.profiler.capture import session as s

    orig_step = s.CaptureSession.step
    state = {"on": True, "left": 0}

    def step(self: s.CaptureSession) -> None:
        orig_step(self)
        if self.action.name != "RECORD" or self.step_index < FIRST:
            return
        on = (self.step_index // _BLOCK) % 2 == 0
        if on == state["on"]:
            return
        state["on"] = on
        hooks, workers = self._hooks, self._workers
        if _WHAT in ("hooks", "both") and hooks is not None:
            if on:
                hooks.install()
                hooks.lean_left = state["left"]
            else:
                state["left"] = hooks.lean_left
                hooks.lean_left = 0
                hooks.uninstall()
        if _WHAT in ("profiler", "both") and workers is not None:
            if on:
                workers._on = False
                workers.start()
            elif workers._on:
                if workers.recorder == "native":
                    workers._native.stop()
                else:
                    _disable_profiler()

    s.CaptureSession.step = step  # type: ignore[method-assign]
    autostart.start_from_env()


if _WHAT and os.environ.get("SKEWLENS_CAPTURE_DIR"):
    _install()
