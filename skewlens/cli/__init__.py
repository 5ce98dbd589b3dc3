"""``skewlens`` console script: dispatches a subcommand to its package's CLI module.

Each subcommand is ``module:function`` taking the remaining arguments and returning an exit code; modules are
imported lazily so ``skewlens check`` never imports torch. A :class:`SkewlensError` that reaches this edge is
printed as one line and gives exit code 2, and so is a :class:`MemoryError`; Ctrl-C, and SIGTERM as Ctrl-C
(:func:`sigterm_as_interrupt`), one line and exit code 130. A reader that goes away early (``| head``) does
not stop a command's work: its reports go quiet (:class:`skewlens.console.ReportConsole`) and it exits with
its own code; where printing was all there was to do (``--help``, ``--version``), it ends without a word with
:data:`BROKEN_PIPE_EXIT`, as ``cat`` ended by SIGPIPE does.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from skewlens.profiler.errors import SkewlensError, out_of_memory
from skewlens.profiler.threads import tune_malloc

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "profile": (
        "skewlens.cli.profile:main",
        "run a training command under the profiler (per-rank Chakra traces)",
    ),
    "merge": (
        "skewlens.cli.profile:merge_main",
        "combine the run directories of a job's hosts (no shared storage) into one run directory",
    ),
    "import": (
        "skewlens.cli.import_traces:main",
        "convert Kineto / host execution traces into a run directory",
    ),
    "check": ("skewlens.cli.store:check_main", "validate a run directory"),
    "export": (
        "skewlens.cli.store:export_main",
        "export a run directory to Parquet, or as an ASTRA-sim workload (--format astra-sim)",
    ),
    "replay": (
        "skewlens.cli.replay:main",
        "replay a run (simulated or real) under another topology / slowdowns (Hydra)",
    ),
    "calibrate": (
        "skewlens.cli.calibrate:main",
        "fit the network model (latency, bandwidth) to a run; write a topology entry",
    ),
    "analyze": ("skewlens.cli.analyze:main", "attribute skew and communication stalls; name the stragglers"),
    "demo": ("skewlens.cli.demo:main", "end-to-end demo on a bundled example (--workload; CPU ranks)"),
}


def _usage() -> str:
    lines = ["usage: skewlens <command> [args...]", "", "commands:"]
    lines += [f"  {name:<9} {desc}" for name, (_target, desc) in SUBCOMMANDS.items()]
    lines += ["", "skewlens <command> --help (or skewlens help <command>): its options; skewlens --version"]
    return "\n".join(lines)


def _resolve(target: str) -> Callable[[list[str]], int]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


#: A second SIGTERM within this long of the first is the same stop (as ``skewlens profile`` takes it).
TERM_REPEAT_S = 2.0


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``, a batch system's end of job) interrupts as Ctrl-C does: a subcommand
    cleans up as for Ctrl-C (its worker processes stopped, its staging directory removed, a real replay's
    ``run/`` and ``real/`` not left half-written) instead of dying where it stands (``analyze`` and
    ``export`` left ``.OUT.*.tmp`` directories and, export, leaked semaphores). A second SIGTERM within
    :data:`TERM_REPEAT_S` is the same stop (coreutils ``timeout`` signals its command, then its process
    group); a later one ends the process as SIGTERM did before (a command stuck where an interrupt cannot
    reach it, as in a blocking read on another thread, still ends). Only on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def interrupt(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if not first:
            first.append(now)
            raise KeyboardInterrupt
        if now - first[0] < TERM_REPEAT_S:
            return
        signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        signal.raise_signal(signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: The exit code of a command whose output's reader went away before it was written (128 + SIGPIPE, as the
#: shell reports ``cat`` ended by that signal); it was a BrokenPipeError traceback and exit code 1.
BROKEN_PIPE_EXIT = 128 + int(signal.SIGPIPE)


@contextlib.contextmanager
def closed_streams_as_null() -> Iterator[None]:
    """A standard output or error the command was started without (``>&-``, ``2>&-``: Python makes it
    None) is the null device while the command runs: with no stdout, ``main``'s flush was an
    AttributeError traceback and exit code 1 after the command's work was done; with no stderr, an error
    line (``print(file=None)``) and argparse's usage went to stdout, among the results."""
    closed = [name for name in ("stdout", "stderr") if getattr(sys, name) is None]
    for name in closed:
        setattr(sys, name, Path(os.devnull).open("w", encoding="utf-8"))  # noqa: SIM115 (closed below)
    try:
        yield
    finally:
        for name in closed:
            getattr(sys, name).close()
            setattr(sys, name, None)


def main(argv: Sequence[str] | None = None) -> int:
    from skewlens.console import encodable_output

    with closed_streams_as_null(), encodable_output():
        return _main_flushed(argv)


def _main_flushed(argv: Sequence[str] | None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # argparse's --help exits: flushed here, not at exit, where Python prints its own error
            sys.stdout.flush()
    except BrokenPipeError:
        from skewlens.console import silence

        silence(sys.stdout)  # nothing more to say; Python's flush at exit would raise again
        silence(sys.stderr)
        return BROKEN_PIPE_EXIT


#: The first words that ask for help: of the command named after them, else the list of commands.
_HELP = ("-h", "--help", "help")


def _say(line: str) -> None:
    """``line`` on stderr as :func:`skewlens.console.print_stderr` writes it: a command's error line to a
    stderr whose reader went away (``skewlens analyze RUN --out OUT 2>&1 | head -3``, a later sweep job
    failing) raised again, and the command's exit code 2 (130 interrupted) was 141."""
    from skewlens.console import print_stderr

    print_stderr(line)


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in _HELP and len(args) > 2:  # the list of commands, the words after ignored
        print(
            f"skewlens {args[0]}: one command at a time, got {len(args) - 1}: {' '.join(args[1:])}",
            file=sys.stderr,
        )
        return 2
    if args[:1] and args[0] in _HELP and len(args) == 2:
        args = [args[1], "--help"]  # `skewlens help replay` printed the list of commands, not replay's help
    if not args or args[0] in _HELP:
        print(_usage(), file=sys.stdout if args else sys.stderr)  # no command: an error, said on stderr
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from skewlens import __version__

        print(f"skewlens {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _say(f"skewlens: unknown command {name!r}{hint}\n\n{_usage()}")
        return 2
    tune_malloc()
    try:
        with sigterm_as_interrupt():
            return int(_resolve(SUBCOMMANDS[name][0])(rest) or 0)
    except SkewlensError as e:
        _say(f"skewlens {name}: error: {e}")  # printable: a message may quote a trace's names
        return 2
    except MemoryError as e:  # a run larger than the memory, or ``ulimit -v``: a numpy allocation's
        _say(f"skewlens {name}: error: {out_of_memory(e)}")
        return 2
    except KeyboardInterrupt as e:  # one that says more: outputs half moved in (atomic.moving_into)
        _say(f"skewlens {name}: interrupted{f' {e}' if e.args else ''}")
        return 130
    except UnicodeEncodeError as e:
        from skewlens.console import undecodable_name

        if (why := undecodable_name(e)) is None:
            raise
        _say(f"skewlens {name}: error: {why}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
