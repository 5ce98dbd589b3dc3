"""``skewlens profile``: run an unmodified training command with capture in every rank.

    skewlens profile --out RUN_DIR [--level collectives|ops|full] [--steps WAIT:WARMUP:ACTIVE]
                     [--host-trace profiler|observer] [--keep-raw] [--parquet] -- COMMAND ...

The command's exit code passes through; a failed command still leaves the traces of the ranks that
saved one, with the missing ranks listed in the manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from skewlens.cli.options import ArgumentParser, help_text, user_path
from skewlens.console import print_stderr
from skewlens.paths import doc
from skewlens.profiler.atomic import no_temp_dir
from skewlens.profiler.capture.native import ENV_UNAVAILABLE
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import PARQUET_DIR, PARTS_DIR
from skewlens.profiler.vocab import HostTrace, Level

if TYPE_CHECKING:
    from rich.console import Group

    from skewlens.profiler.manifest import Manifest


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="skewlens profile",
        description=help_text(__doc__.split("\n", 1)[0]),
        usage="%(prog)s [-h] --out RUN_DIR [--level LEVEL] [--steps WAIT:WARMUP:ACTIVE] [--host-trace "
        "SOURCE] [--keep-raw] [--parquet] -- COMMAND ...",
        epilog="COMMAND: the training command, after '--' (torchrun ... train.py ..., python train.py ...)",
    )
    p.add_argument(
        "--out",
        type=user_path,
        required=True,
        metavar="RUN_DIR",
        help="run directory to create (must be new or empty)",
    )
    p.add_argument(
        "--level",
        default=Level.COLLECTIVES.value,
        metavar="LEVEL",
        help="what is recorded: collectives (the time between torch.distributed calls), ops (torch "
        "operators and GPU kernels too), full (operator schemas and tensor dependencies too); one of "
        f"{', '.join(v.value for v in Level)} (default collectives)",
    )
    p.add_argument(
        "--steps",
        default="1:1:3",
        metavar="WAIT:WARMUP:ACTIVE",
        help="capture window: steps to skip, to warm up, to record (default 1:1:3)",
    )
    p.add_argument(
        "--host-trace",
        default=HostTrace.PROFILER.value,
        metavar="SOURCE",
        help="full level: take operator schemas and tensor ids from torch.profiler (profiler, cheap) or "
        "from PyTorch's ExecutionTraceObserver (observer: its host trace JSON is kept with --keep-raw); "
        f"one of {', '.join(v.value for v in HostTrace)} (default profiler)",
    )
    p.add_argument(
        "--keep-raw", action="store_true", help="keep the raw torch traces under RUN_DIR/raw/ (ops, full)"
    )
    p.add_argument("--parquet", action="store_true", help="also export RUN_DIR/parquet/ after capture")
    p.add_argument("--clock-timeout", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    from skewlens.profiler.capture.autostart import ENV_PROFILE, clock_timeout_s, seconds_above_zero
    from skewlens.profiler.capture.flight import DEBUG_ENV, refuse_wrapped_groups
    from skewlens.profiler.capture.run import (
        INTERRUPTED,
        OPTIONS_NOTE,
        TERMINATED,
        capture_env,
        existing_manifest,
        finalize_run,
        leave_run_dir,
        prepare_run_dir,
        run_command,
    )
    from skewlens.profiler.capture.schedule import parse_choice, parse_window

    if "--" in argv:
        k = argv.index("--")
        own, command = argv[:k], argv[k + 1 :]
        args = _parser().parse_args(own)
    else:
        args, rest = _parser().parse_known_args(argv)
        if rest:  # the command without "--": its own --out or --steps would have been taken as ours
            raise CaptureError(
                f"put the command after '--': skewlens profile --out RUN_DIR [options] -- {shlex.join(rest)} "
                "(without it, the command's own options such as --out or --steps are read as skewlens's)"
            )
        command = []
    level = parse_choice(Level, args.level, "--level")
    host_trace = parse_choice(HostTrace, args.host_trace, "--host-trace")
    window = parse_window(args.steps)
    if not command:
        raise CaptureError("no command given: skewlens profile --out RUN_DIR -- COMMAND ...")
    # from this environment, which the ranks' environment is made from: the ranks wait as long as it says
    timeout_s = (
        clock_timeout_s()
        if args.clock_timeout is None
        else seconds_above_zero(args.clock_timeout, f"--clock-timeout {args.clock_timeout}")
    )
    if args.keep_raw and level == Level.COLLECTIVES:
        print_stderr(
            "skewlens profile: warning: --keep-raw: the collectives level records no torch trace to keep "
            "(RUN_DIR/raw/ is written at --level ops and full)"
        )
    if host_trace != HostTrace.PROFILER and level != Level.FULL:
        print_stderr(
            f"skewlens profile: warning: --host-trace {host_trace.value}: only the full level takes operator "
            f"schemas and tensor ids from a host trace; at --level {level.value} it changes nothing"
        )
    refuse_wrapped_groups(os.environ.get(DEBUG_ENV, ""), "in skewlens profile's environment")
    if (why := no_temp_dir()) is not None:  # only the command's traceback said it (torchrun's log directory)
        print_stderr(f"skewlens profile: warning: {why} (torchrun and torch need one)")
    native_failure = _build_native() if level == Level.COLLECTIVES else ""
    run_dir = Path(args.out)
    created = prepare_run_dir(run_dir)
    env = capture_env(
        run_dir,
        level,
        window,
        keep_raw=args.keep_raw,
        clock_timeout_s=timeout_s,
        host_trace=host_trace,
    )
    env.pop(ENV_UNAVAILABLE, None)
    if native_failure:  # the ranks need not try again
        env[ENV_UNAVAILABLE] = native_failure
    stops: list[str] = []
    try:
        code = run_command(command, env, stops=stops, run_dir=run_dir)
    except CaptureError:
        leave_run_dir(run_dir)
        if created:
            _remove_if_empty(run_dir)
        raise
    try:
        manifest = finalize_run(
            run_dir, level=level, window=window, command=command, exit_code=code, profile=env[ENV_PROFILE]
        )
    finally:
        leave_run_dir(run_dir)
    # a failed command stopped by SIGTERM (timeout, scancel) said only "error: command exited with code 1"
    # (torchrun's code when stopped), as if the training had failed
    failed = "stopped (SIGTERM): " if TERMINATED in stops else "error: "
    if INTERRUPTED in stops:
        return _interrupted(manifest, run_dir, command, code, created=created)
    if manifest is None and (other := existing_manifest(run_dir)) is not None:
        return _merged_elsewhere(other, run_dir, command, code)
    if manifest is None:
        why = _unsaved(run_dir)
        if created:
            _remove_if_empty(run_dir)
        if code != 0:
            # it said only "command exited with code 1": the run directory, removed, was looked for in vain
            print_stderr(
                f"skewlens profile: {failed}command {_exited(code)}: {shlex.join(command)} "
                f"({_none_saved(why)})"
            )
            return exit_status(code)
        if why:
            raise CaptureError(f"{shlex.join(command)}: {_none_saved(why)}")
        raise CaptureError(
            f"{shlex.join(command)}: no rank saved a trace. A rank saves it when the window ends or when "
            "it exits through Python (os._exit skips that); did it import torch, and run "
            f"{window.wait + window.warmup + 1}+ steps, each ended by optimizer.step()? A loop without an "
            f"optimizer marks its steps with the Python API (cap.step(), {doc('docs/capture.md')})"
        )
    if OPTIONS_NOTE in manifest.notes:
        print_stderr(f"skewlens profile: {manifest.notes[OPTIONS_NOTE]}")
    if code != 0:
        print_capture_warnings(manifest, run_dir)
        print_stderr(
            f"skewlens profile: {failed}command {_exited(code)}: {shlex.join(command)}"
            f" (traces of {_ranks(manifest.ranks)} kept in {run_dir}{_missing(manifest)})"
        )
        return exit_status(code)
    if (lost := _not_saved(manifest)) is not None:  # before --parquet, which refuses the missing rank
        return _report_not_saved(manifest, run_dir, lost)
    if args.parquet:
        _export_parquet(run_dir)

    from skewlens.console import report_console

    report_console(stderr=True).print(summary_table(manifest, run_dir))
    print_capture_warnings(manifest, run_dir)
    return 0


def _not_saved(manifest: Manifest) -> str | None:
    """``rank 1: trace not saved: RUN/rank-1.et: No space left on device`` (``; and 2 more``) where a
    rank's save failed (its manifest note says so), else None."""
    from skewlens.profiler.capture.run import NOT_SAVED_NOTE
    from skewlens.profiler.manifest import rank_note_key

    lost = [
        (r, note)
        for r in manifest.missing_ranks
        if (note := manifest.notes.get(rank_note_key(r), "")).startswith(NOT_SAVED_NOTE)
    ]
    if not lost:
        return None
    more = f"; and {len(lost) - 1} more" if len(lost) > 1 else ""
    return f"rank {lost[0][0]}: {lost[0][1]}{more}"


def _report_not_saved(manifest: Manifest, run_dir: Path, lost: str) -> int:
    """A command that succeeded while a rank's save failed (a full disk, a quota) or saved none (it marked no
    step): its trace is lost, so the capture failed, exit code 2 (it was 0: a script went on to analyse a run
    without that rank), the others' traces kept. analyze and replay read them as they are, the missing rank
    left out with a warning, unless a kept rank's p2p has its partner there: then they refuse, naming their
    own lenient option, which ``skewlens check`` names too (the line said "skewlens analyze --lenient reads
    them", an option analyze does not need for a run whose collectives are all that is left unmatched)."""
    from skewlens.console import report_console

    report_console(stderr=True).print(summary_table(manifest, run_dir))
    print_capture_warnings(manifest, run_dir)
    print_stderr(
        f"skewlens profile: error: {lost} (the traces of {_ranks(manifest.ranks)} are kept in {run_dir}; "
        f"skewlens analyze and replay use them without {_ranks(manifest.missing_ranks)}, and "
        f"`skewlens check {run_dir}` lists what that leaves unmatched)"
    )
    return 2


def print_capture_warnings(manifest: Manifest, run_dir: Path, *, command: str = "profile") -> None:
    """The warnings of the manifest's notes (data not recorded, traces cut short by the command's end), each
    in the words ``skewlens check`` uses, on stderr (the first
    :data:`~skewlens.profiler.store.render.SHOWN_ISSUES`)."""
    from skewlens.profiler.store.issues import IssueLog, capture_note_issues
    from skewlens.profiler.store.render import issue_lines

    log = IssueLog()
    capture_note_issues(manifest, log)
    for line in issue_lines(log.issues, run_dir):
        print_stderr(f"skewlens {command}: {line}")  # printable, as print_stderr writes


def merge_main(argv: list[str]) -> int:
    """``skewlens merge --out RUN_DIR HOST_DIR...``: the run directories that the hosts of one job wrote
    to storage of their own (each ``skewlens profile --out HOST_DIR``), combined into one."""
    from skewlens.console import print_warning, report_console
    from skewlens.profiler.capture.combine import RUN_IDENTITY_NOTE, combine_runs

    p = ArgumentParser(prog="skewlens merge", description=help_text(merge_main.__doc__))
    p.add_argument(
        "--out", type=user_path, required=True, help="run directory to create (must be new or empty)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="merge directories whose run identities (torchrun's run id and rendezvous) differ",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="merge the ranks found when some rank is in no directory (crashed); it is listed missing",
    )
    p.add_argument(
        "dirs", nargs="+", type=user_path, metavar="HOST_DIR", help="each host's run directory of the job"
    )
    args = p.parse_args(argv)
    run_dir = Path(args.out)
    manifest = combine_runs(
        [Path(d) for d in args.dirs], run_dir, force=args.force, allow_missing=args.allow_missing
    )
    if note := manifest.notes.get(RUN_IDENTITY_NOTE):
        print_warning("merge", f"run identity {note}")  # the hosts' manifests' words: untrusted
    # on stdout, as every command's report but profile's (its stdout is its command's)
    report_console().print(summary_table(manifest, run_dir, command="merge"))
    print_capture_warnings(manifest, run_dir, command="merge")
    return 0


#: ``skewlens profile``'s exit status when interrupted (Ctrl-C), as every command's (128 + SIGINT).
INTERRUPTED_STATUS = 130


def _interrupted(
    manifest: Manifest | None, run_dir: Path, command: list[str], code: int, *, created: bool
) -> int:
    """Ctrl-C: the command got it once and ended (or was killed at a second one); the run is finalised with
    what its ranks saved. Say so, in one line after the capture's warnings, and exit 130."""
    from skewlens.profiler.capture.run import existing_manifest

    if manifest is not None:
        print_capture_warnings(manifest, run_dir)
        kept = f"traces of {_ranks(manifest.ranks)} kept in {run_dir}{_missing(manifest)}"
    elif (other := existing_manifest(run_dir)) is not None:
        kept = _already_merged(other, run_dir)
    else:
        kept = _none_saved(_unsaved(run_dir))
        if created:
            _remove_if_empty(run_dir)
    print_stderr(
        f"skewlens profile: interrupted (Ctrl-C): command {_exited(code)}: {shlex.join(command)} ({kept})"
    )
    return INTERRUPTED_STATUS


def _already_merged(manifest: Manifest, run_dir: Path) -> str:
    """``RUN: manifest.json already merged by another host of the job (ranks 0-1 of 2)``, and, where every
    rank of that manifest ran on this host, that it may instead be a second ``skewlens profile`` into this
    ``--out``, with its command. Such a profile (a one-host job, started 1 s after this one, that ended first)
    had merged its own ranks, which replaced this one's traces: this one said only that another host of the
    job merged them, of a job that ran on one host, and exited 0 with the other's table, its capture lost.
    Several ``torchrun --nnodes`` on one machine look the same (one host name), so it is said, not refused."""
    import socket

    where = (
        f"{run_dir}: manifest.json already merged by another host of the job "
        f"({_ranks(manifest.ranks)} of {manifest.world_size}{_missing(manifest)})"
    )
    here = socket.gethostname()
    hosts = {manifest.hosts.get(r) for r in range(manifest.world_size)}
    if hosts != {here}:
        return where
    return (
        f"{where}; but every rank of it ran on this host ({here}): unless this command is one of several "
        f"torchrun --nnodes on this machine, a second skewlens profile into this --out merged it, its ranks' "
        f"traces replaced this command's, and this capture is lost (the manifest's command: "
        f"{shlex.join(manifest.command) or '?'}); capture again into a directory of its own"
    )


def _merged_elsewhere(manifest: Manifest, run_dir: Path, command: list[str], code: int) -> int:
    """Across hosts: another host's ``skewlens profile`` already merged every trace found into the run's
    manifest (this host's ranks included where they saved one); say so and pass the exit code through."""
    where = _already_merged(manifest, run_dir)
    if code != 0:
        print_stderr(f"skewlens profile: error: command {_exited(code)}: {shlex.join(command)} ({where})")
        return exit_status(code)
    from skewlens.console import report_console

    print_stderr(f"skewlens profile: {where}")
    if (lost := _not_saved(manifest)) is not None:
        return _report_not_saved(manifest, run_dir, lost)
    report_console(stderr=True).print(summary_table(manifest, run_dir))
    print_capture_warnings(manifest, run_dir)
    return 0


def _none_saved(why: str) -> str:
    """``no rank saved a trace``, and why where a part file says (``: rank 0: trace not saved: ...``)."""
    return f"no rank saved a trace{f': {why}' if why else ''}"


def _unsaved(run_dir: Path) -> str:
    """``rank 0: trace not saved: RUN_DIR/rank-0.et: No space left on device; and 1 more``: the ranks
    whose save failed, as their part files say, or ''."""
    from skewlens.profiler.capture.run import NOT_SAVED_NOTE, unsaved_traces

    unsaved = unsaved_traces(run_dir)
    if not unsaved:
        return ""
    first = min(unsaved)
    more = f"; and {len(unsaved) - 1} more" if len(unsaved) > 1 else ""
    return f"rank {first}: {NOT_SAVED_NOTE}: {unsaved[first]}{more}"


def _ranks(ranks: tuple[int, ...]) -> str:
    """``rank 3``, ``ranks 0-7, 16-1023``: a one-line list however many ranks a job has (each host of a
    128-host job of 8 ranks lists the other 1,016 as missing)."""
    from skewlens.profiler.store.issues import ranks_label

    return ranks_label(ranks) if ranks else "no ranks"


def _missing(manifest: Manifest) -> str:
    return f"; missing {_ranks(manifest.missing_ranks)}" if manifest.missing_ranks else ""


def exit_status(code: int) -> int:
    """The command's exit code as a shell reports it: 128 + N for a command killed by signal N (``-N``
    from :func:`run_command`; returned as is, the exit status was ``256 - N``: 247 for SIGKILL)."""
    return 128 - code if code < 0 else code


def _exited(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _build_native() -> str:
    """Build the native gloo-event recorder once here, not in every rank (a no-op once built); where it
    cannot be built, say so and return why ("" otherwise): the ranks then use torch's profiler, which
    costs more."""
    from skewlens.profiler.capture import native

    if not native.wanted():
        return ""
    try:
        native.build()
    except native.NativeBuildError as e:
        print_stderr(f"skewlens profile: warning: {e}; torch's profiler will record gloo's worker events")
        return str(e)
    return ""


def summary_table(manifest: Manifest, run_dir: Path, *, command: str = "profile") -> Group:
    """One row per captured rank (the first :data:`MAX_RANK_ROWS`; the caption counts the rest): host, device,
    clock offset, the steps recorded (as ranges, ``2-4``, like ``skewlens import``), nodes written; one row
    per reason for the ranks without a trace (``0-7, 16-1023`` ... ``missing``), the reason on a line of its
    own under the table (``ranks 0-7, 16-1023 missing: ...``), as wide as the console: in the table's
    right-aligned last column, or its caption, a reason of three lines took ten."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from skewlens.console import ranks_caption
    from skewlens.profiler.chakra_io import iter_messages
    from skewlens.profiler.manifest import rank_file
    from skewlens.profiler.store.issues import MAX_RANK_ROWS, rank_ranges, ranks_label

    title = f"skewlens {command}: {run_dir} (level {manifest.level}, world size {manifest.world_size})"
    table = Table(title=title, title_justify="left", min_width=len(title))  # a narrow table wrapped it
    for col in ("rank", "host", "device", "clock offset µs", "steps", "nodes"):
        left = col in ("host", "device")  # a host's name folded, not cut, where the terminal is narrow
        table.add_column(col, justify="left" if left else "right", overflow="fold" if left else "ellipsis")
    caption: list[str] = []
    if len(manifest.ranks) > MAX_RANK_ROWS:
        caption.append(ranks_caption(manifest.ranks, str(run_dir / "manifest.json")))
    lines: list[Text] = []
    steps: dict[int, list[int]] = {}
    for s in manifest.steps:
        steps.setdefault(s.rank, []).append(s.step)
    most = 0
    for r in manifest.ranks[:MAX_RANK_ROWS]:
        nodes = sum(1 for _ in iter_messages(rank_file(run_dir, r))) - 1  # minus the GlobalMetadata
        most = max(most, nodes)
        offset = manifest.clock_offsets_ns.get(r, 0) / 1000
        table.add_row(
            str(r),
            manifest.hosts.get(r, ""),
            manifest.devices.get(r, ""),
            f"{offset:.1f}",
            rank_ranges(steps.get(r, ())) or "-",
            str(nodes),
        )
    for note, ranks in manifest.missing_by_note().items():  # ranks without a trace: one row per reason
        table.add_row(rank_ranges(ranks), "", "", "", "missing", "")
        if note:
            lines.append(Text(f"{ranks_label(ranks)} missing: {note}"))
    if most <= 1 and manifest.level == "collectives":  # the process group's node at most
        caption.append(
            "no communication in the capture window: the collectives level records the time between "
            "torch.distributed calls, so a program that makes none has only its step marks (--level ops "
            "records its operators)"
        )
    if caption:
        table.caption = "; ".join(caption)
    return Group(table, *lines)


def _export_parquet(run_dir: Path) -> None:
    from skewlens.cli.store import parquet_model
    from skewlens.profiler.store.parquet import export_run  # lazy: pyarrow only when asked
    from skewlens.rich_progress import RichProgress

    progress = RichProgress()
    model = parquet_model(run_dir, lenient=False, progress=progress)
    export_run(run_dir, run_dir / PARQUET_DIR, progress=progress, model=model)


def _remove_if_empty(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(run_dir / PARTS_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()
