"""Start capture in a process of a wrapped command, configured by environment variables.

``SKEWLENS_CAPTURE_DIR`` (run directory), ``SKEWLENS_LEVEL``, ``SKEWLENS_STEPS`` (``WAIT:WARMUP:ACTIVE``),
``SKEWLENS_KEEP_RAW`` (``1``), ``SKEWLENS_HOST_TRACE`` (``profiler`` | ``observer``) and
``SKEWLENS_CLOCK_TIMEOUT_S``. The session is created when the process
finishes importing torch (not at interpreter start, so processes that never import torch pay nothing),
and not in launcher processes (torchrun's agent), which run no training steps.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV_DIR = "SKEWLENS_CAPTURE_DIR"
ENV_LEVEL = "SKEWLENS_LEVEL"
ENV_STEPS = "SKEWLENS_STEPS"
ENV_KEEP_RAW = "SKEWLENS_KEEP_RAW"
ENV_CLOCK_TIMEOUT = "SKEWLENS_CLOCK_TIMEOUT_S"
#: How long a rank waits for rank 0 to answer in the clock exchange where ``ENV_CLOCK_TIMEOUT`` is unset.
CLOCK_TIMEOUT_DEFAULT_S = 10.0
ENV_HOST_TRACE = "SKEWLENS_HOST_TRACE"
#: Which ``skewlens profile`` started the command (a token of its own), recorded in each rank's part file.
ENV_PROFILE = "SKEWLENS_PROFILE_ID"
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")

_session: Any = None


def _is_launcher(argv: Sequence[str], orig_argv: Sequence[str] = ()) -> bool:
    """torchrun's agent, whether started as ``torchrun`` or ``python -m torch.distributed.run``.

    While ``-m`` imports torch, ``sys.argv[0]`` is still ``"-m"`` and ``__main__`` has no spec yet: the
    interpreter's own command line (``sys.orig_argv``) names the module.
    """
    prog = Path(argv[0]).name if argv else ""
    if prog in ("torchrun", "torchrun.exe"):
        return True
    orig = list(orig_argv)
    if "-m" in orig[:-1] and orig[orig.index("-m") + 1] in LAUNCHER_MODULES:
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", "") in LAUNCHER_MODULES or (
        prog in ("run.py", "launch.py") and "torch" in argv[0]
    )


def profiled() -> Any:
    """The session ``skewlens profile`` started in this process, or None."""
    return _session


def clock_timeout_s() -> float:
    """``SKEWLENS_CLOCK_TIMEOUT_S`` from the environment, else :data:`CLOCK_TIMEOUT_DEFAULT_S`: what
    ``skewlens profile`` gives its command (from its own environment) and what each rank waits. A value
    that is no time is refused, naming the variable: ``skewlens profile`` and a rank started without it
    read it by this one rule (:func:`seconds_above_zero`)."""
    text = os.environ.get(ENV_CLOCK_TIMEOUT)
    if text is None:
        return CLOCK_TIMEOUT_DEFAULT_S
    return seconds_above_zero(text, f"{ENV_CLOCK_TIMEOUT}={text!r}")


def seconds_above_zero(text: str, what: str) -> float:
    """``text`` as a finite number of seconds above 0, else a :class:`CaptureError` naming ``what`` (the
    variable or option it came from)."""
    import math

    from skewlens.profiler.errors import CaptureError

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise CaptureError(f"{what}: not a number of seconds above 0")
    return value


def start_from_env() -> Any:
    """Create and install the session described by the environment (once per process)."""
    global _session  # noqa: PLW0603 - one session per process, by design
    if _session is not None or _is_launcher(sys.argv, getattr(sys, "orig_argv", ())):
        return _session
    from skewlens.profiler.capture.schedule import parse_window
    from skewlens.profiler.capture.session import CaptureSession

    timeout_s = clock_timeout_s()
    _session = CaptureSession(
        os.environ[ENV_DIR],
        level=os.environ.get(ENV_LEVEL, "collectives"),
        window=parse_window(os.environ.get(ENV_STEPS, "1:1:3")),
        keep_raw=os.environ.get(ENV_KEEP_RAW, "") == "1",
        host_trace=os.environ.get(ENV_HOST_TRACE, "profiler"),
        clock_timeout_s=timeout_s,
    ).install()
    return _session


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so capture starts right after ``import torch``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                start_from_env()
            except Exception as e:
                print(f"skewlens: capture not started: {type(e).__name__}: {e}", file=sys.stderr)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def watch_for_torch() -> None:
    """Start capture when torch is imported (or now, if it already is)."""
    if "torch" in sys.modules:
        start_from_env()
    else:
        sys.meta_path.insert(0, _TorchWatcher())
