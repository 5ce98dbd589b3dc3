"""Tests that start torch ranks must carry the ``slow`` marker: enforced while they run, not remembered.

While a test without the marker runs (its fixtures' setup and teardown included), starting any of these
fails it with a message naming the test:

* a command line with ``torchrun``, ``-m torch.distributed.run`` / ``torch.distributed.launch``, or the
  ``skewlens profile`` / ``skewlens demo`` subcommands (``python -m skewlens ...`` or the console script),
  through :class:`subprocess.Popen` (so ``subprocess.run`` and friends) or :func:`os.system`;
* a process given torchelastic's worker environment (``TORCHELASTIC_RUN_ID``: torchrun started in-process);
* a :mod:`multiprocessing` process whose target is torch's (``torch.multiprocessing.spawn``'s wrapper,
  which ``mp.spawn`` and torchelastic's function launches start);
* a second Python interpreter while one this test started is still running (ranks started by hand).

The refusal is raised where the process would start (as pytest's failure, which ``except Exception``
does not catch) and recorded as well, so that a test which swallows it still fails.
"""

from __future__ import annotations

import inspect
import multiprocessing.process
import os
import shlex
import subprocess
import sys
import weakref
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

MARKER = "slow"
TORCH_LAUNCHERS = frozenset({"torch.distributed.run", "torch.distributed.launch"})
TORCHRUN_PROGRAMS = frozenset({"torchrun", "torchrun.exe"})
#: ``skewlens`` subcommands that start a training command (profile) or torchrun (demo).
SKEWLENS_LAUNCHING = frozenset({"profile", "demo"})
SKEWLENS_LAUNCHING_MODULES = frozenset({"skewlens.cli.profile", "skewlens.cli.demo"})
ELASTIC_WORKER_ENV = "TORCHELASTIC_RUN_ID"
TORCH_TARGET_MODULES = ("torch.multiprocessing", "torch.distributed")

_real_popen_init = subprocess.Popen.__init__
_real_os_system = os.system
_real_process_start = multiprocessing.process.BaseProcess.start
_POPEN_SIGNATURE = inspect.signature(_real_popen_init)


@dataclass
class _Running:
    """The test running now, as far as the checks are concerned."""

    #: Its node id when it is not marked slow, else None (nothing is refused).
    test: str | None = None
    #: What it tried to start that it may not (kept in case it swallowed the failure).
    refused: list[str] = field(default_factory=list)
    #: The Python interpreters it started, to tell when a second one overlaps the first.
    pythons: list[weakref.ref[subprocess.Popen[Any]]] = field(default_factory=list)


_now = _Running()


def _tokens(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)):
        text = os.fsdecode(args)
        try:
            return shlex.split(text)
        except ValueError:
            return text.split()
    if isinstance(args, os.PathLike):
        return [os.fsdecode(args)]
    if isinstance(args, Sequence):
        return [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else str(a) for a in args]
    return [str(args)]


def _skewlens_subcommand(tokens: list[str]) -> str | None:
    for i, tok in enumerate(tokens):
        if tok == "-mskewlens" or os.path.basename(tok) in ("skewlens", "skewlens.exe"):
            rest = [t for t in tokens[i + 1 :] if not t.startswith("-")]
            return rest[0] if rest else None
    return None


def launch_reason(args: Any, env: Mapping[str, str] | None = None) -> str | None:
    """Why starting ``args`` (with ``env``) needs the slow marker; None when it does not."""
    tokens = _tokens(args)
    for tok in tokens:
        if os.path.basename(tok) in TORCHRUN_PROGRAMS:
            return "starts torchrun"
        module = tok[2:] if tok.startswith("-m") and len(tok) > 2 else tok
        if module in TORCH_LAUNCHERS:
            return f"starts {module}"
        if module in SKEWLENS_LAUNCHING_MODULES:
            return f"runs {module}"
    sub = _skewlens_subcommand(tokens)
    if sub in SKEWLENS_LAUNCHING:
        return f"runs skewlens {sub}"
    if env is not None and ELASTIC_WORKER_ENV in env:
        return f"starts a torchelastic worker ({ELASTIC_WORKER_ENV} in its environment)"
    return None


def _is_python(args: Any, executable: Any) -> bool:
    program = os.fsdecode(executable) if executable is not None else next(iter(_tokens(args)), "")
    name = os.path.basename(program)
    return name.startswith("python") or os.path.realpath(program) == os.path.realpath(sys.executable)


def _refuse(what: str) -> None:
    __tracebackhide__ = True
    msg = (
        f"{_now.test} {what}: tests that start torch ranks (torchrun, skewlens profile/demo, mp.spawn, "
        f"several Python processes) must be marked @pytest.mark.{MARKER} (run them with -m {MARKER})"
    )
    _now.refused.append(msg)
    pytest.fail(msg, pytrace=True)


def _guarded_popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    __tracebackhide__ = True
    if _now.test is not None:
        bound = _POPEN_SIGNATURE.bind(self, *args, **kwargs).arguments
        cmd, env = bound.get("args"), bound.get("env")
        reason = launch_reason(cmd, env)
        if reason:
            _refuse(f"{reason} ({shlex.join(_tokens(cmd))})")
        if _is_python(cmd, bound.get("executable")):
            running = [p for ref in _now.pythons if (p := ref()) is not None and p.poll() is None]
            if running:
                _refuse(f"starts a second Python process while {running[0].args!r} still runs")
            _real_popen_init(self, *args, **kwargs)
            _now.pythons.append(weakref.ref(self))
            return
    _real_popen_init(self, *args, **kwargs)


def _guarded_os_system(command: Any) -> int:
    __tracebackhide__ = True
    if _now.test is not None and (reason := launch_reason(command)):
        _refuse(f"{reason} ({command})")
    return _real_os_system(command)


def _guarded_process_start(self: multiprocessing.process.BaseProcess) -> None:
    __tracebackhide__ = True
    target = getattr(self, "_target", None)
    module = getattr(target, "__module__", "") or ""
    if _now.test is not None and module.startswith(TORCH_TARGET_MODULES):
        _refuse(f"starts a multiprocessing process running {module}.{getattr(target, '__qualname__', '?')}")
    _real_process_start(self)


def install() -> None:
    """Route process starts through the checks (they refuse nothing until a test not marked slow runs)."""
    subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]
    os.system = _guarded_os_system
    multiprocessing.process.BaseProcess.start = _guarded_process_start  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """Refuse torch ranks while a test without the marker runs, its fixtures' setup and teardown included."""
    _now.test = None if item.get_closest_marker(MARKER) else item.nodeid
    _now.refused.clear()
    _now.pythons.clear()
    try:
        return (yield)
    finally:
        _now.test = None
        _now.pythons.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """A test that caught the refusal and went on still fails, with the refusal as its reason."""
    report = yield
    if _now.refused and report.passed and call.when in ("setup", "call"):
        report.outcome = "failed"
        report.longrepr = "\n".join(_now.refused)
    return report
