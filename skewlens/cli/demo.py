"""``skewlens demo``: the whole loop on the bundled example, on the CPU.

1. capture ``examples/train.py`` on 4 gloo ranks under ``torchrun`` with a 40 ms straggler on rank 2
   (``skewlens profile --level ops``), or with ``--workload NAME`` another bundled example (see
   :data:`WORKLOADS`: FSDP2, DTensor tensor parallelism, pipelining with GPipe or 1F1B, DDP with
   ``no_sync`` accumulation, eager or compiled, a 2-D mesh) on its own rank count, the straggler on rank 1;
2. validate and analyse the run (``skewlens analyze``: skew, step breakdown, critical path, what-if blame,
   Parquet tables, PNGs and a Perfetto timeline);
3. replay the run in the simulator with and without the straggler and print the blame table.

Everything lands in ``--out`` (default ``demo-out/``).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table

from skewlens.cli.options import ArgumentParser, check_range, help_text, user_path
from skewlens.console import print_line, print_warning, report_console
from skewlens.paths import EXAMPLES_DIR
from skewlens.profiler.atomic import why_not_created
from skewlens.profiler.capture.run import INTERRUPT_GRACE_S, stop_with_parent
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.issues import hydra_override, ms_text, path_word
from skewlens.rich_progress import RichProgress

if TYPE_CHECKING:
    from rich.console import Console

    from skewlens.analysis.api import AnalysisResult
    from skewlens.analysis.records import BlameRecord

EXAMPLE = EXAMPLES_DIR / "train.py"
#: The most ranks, training steps and straggler ms a demo runs (1e20 ranks went to torchrun, 1e20 steps or
#: 1e308 ms never ended).
MAX_NPROC = 64
MAX_STEPS = 10_000
#: The fewest training steps a demo runs, and the most it records: its capture window is one step skipped,
#: one warming up, up to MAX_ACTIVE recorded and one more step, in which each rank saves its trace (with
#: fewer steps than the window the ranks saved partial traces at exit, with a warning each, and with 2 or
#: fewer no trace at all: the capture failed).
MIN_STEPS = 4
MAX_ACTIVE = 5
MAX_STRAGGLER_MS = 60_000.0


@dataclass(frozen=True, slots=True)
class Workload:
    """A bundled example the demo can run: its script in ``examples/``, arguments, ranks and straggler."""

    script: str
    """File name in :data:`skewlens.paths.EXAMPLES_DIR`."""
    args: tuple[str, ...]
    """The script's own arguments (beyond the shared knobs)."""
    nproc: int
    """Ranks it runs on by default."""
    straggler_rank: int
    """Rank given the extra compute by default."""


#: ``--workload`` names; ``train`` is the default (and the demo as it always was).
WORKLOADS: dict[str, Workload] = {
    "train": Workload("train.py", (), 4, 2),
    "fsdp2": Workload("fsdp2.py", (), 2, 1),
    "fsdp1": Workload("fsdp1.py", (), 2, 1),
    "tp": Workload("tp.py", (), 2, 1),
    "pipeline-gpipe": Workload("pipeline.py", ("--schedule", "gpipe"), 2, 1),
    "pipeline-1f1b": Workload("pipeline.py", ("--schedule", "1f1b"), 2, 1),
    "ddp-accum": Workload("ddp_accum.py", (), 2, 1),
    "ddp-compile": Workload("ddp_accum.py", ("--compile",), 2, 1),
    "mesh2d": Workload("mesh2d.py", (), 4, 1),
}


def workload(name: str) -> Workload:
    """The workload called ``name``; an unknown name is an error listing the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise SkewlensError(f"--workload {name!r}: unknown; one of {', '.join(WORKLOADS)}") from None


def capture_window(steps: int) -> str:
    """The ``--steps`` window the demo captures a run of ``steps`` (at least :data:`MIN_STEPS`) training
    steps with: one skipped, one warming up, up to :data:`MAX_ACTIVE` recorded, and a step left after them."""
    return f"1:1:{min(MAX_ACTIVE, steps - 3)}"


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="skewlens demo", description=help_text(__doc__.split("\n", 1)[0]))
    p.add_argument(
        "--out",
        type=user_path,
        default="demo-out",
        help="new or empty directory, or one an earlier demo made (replaced); default demo-out",
    )
    p.add_argument(
        "--workload", default="train", help=f"bundled example to run (default train): {', '.join(WORKLOADS)}"
    )
    p.add_argument(
        "--nproc", type=int, default=None, help="ranks (2 to 64; default: the workload's, 4 for train)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=8,
        help=f"training steps of the example ({MIN_STEPS} to {MAX_STEPS:,}; default 8): one skipped, one "
        f"warming up, up to {MAX_ACTIVE} recorded, and one after them",
    )
    p.add_argument(
        "--straggler-rank",
        type=int,
        default=None,
        help="the rank made slow (default: the workload's, 2 for train, else 1; with fewer ranks than "
        "that, the last one: rank 1 with --nproc 2)",
    )
    p.add_argument(
        "--straggler-ms",
        type=float,
        default=40.0,
        help="extra compute the straggler does at the start of each step, ms (0 to 60,000; default 40)",
    )
    return p


#: Left in every ``--out`` the demo creates: only a directory holding it is replaced by a later demo.
DEMO_MARKER = ".skewlens-demo"


def prepare_out(out: Path) -> None:
    """Make ``out`` an empty directory of the demo's own.

    A missing or empty directory is taken; a non-empty one only when an earlier demo created it (it holds
    :data:`DEMO_MARKER`), so ``--out .`` or a directory of the user's is never deleted. One that cannot be
    made or replaced (the default ``demo-out/`` in a read-only working directory) is a one-line
    :class:`SkewlensError`: it was an OSError traceback and exit code 1.
    """
    if out.exists() and not out.is_dir():
        raise SkewlensError(f"--out {out}: exists and is not a directory")
    try:
        if out.is_dir() and any(out.iterdir()):
            if not (out / DEMO_MARKER).is_file():
                raise SkewlensError(
                    f"--out {out}: not empty and not created by skewlens demo; "
                    "name a new or empty directory, or remove this one yourself"
                )
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        marker = "created by skewlens demo; replaced by the next demo with this --out\n"
        (out / DEMO_MARKER).write_text(marker)
    except OSError as e:
        raise SkewlensError(
            f"--out {out}: cannot be made the demo's directory ({why_not_created(out, e)}); "
            "give --out a directory you can write"
        ) from None


#: How long an interrupted demo waits for the ``skewlens`` it runs to clean up and end: longer than
#: ``skewlens profile`` gives its command after a Ctrl-C, so that it finalises the run with what was saved.
STOP_GRACE_S = INTERRUPT_GRACE_S + 15.0


def _skewlens(*args: str) -> int:
    """Run ``skewlens ARGS...`` as a user would (its own process, output to this terminal)."""
    return run_child([sys.executable, "-m", "skewlens", *args])


def run_child(command: list[str]) -> int:
    """Run ``command`` to its end, in a process group of its own, and return its exit code. Interrupted
    (the terminal's Ctrl-C, or SIGINT or SIGTERM to the demo), it passes Ctrl-C (SIGINT) on, once, and
    waits for the command to clean up and end (a ``subprocess.run`` killed it, leaving its staging
    directory) before SIGKILL; a second Ctrl-C is passed on too. In the demo's own group it got the
    terminal's Ctrl-C and then the SIGTERM the demo passed on: ``skewlens profile`` took that for a stop by
    SIGTERM and said ``error: command exited with code 1``. It gets SIGTERM if the demo dies first."""
    with subprocess.Popen(command, process_group=0, preexec_fn=stop_with_parent) as proc:  # noqa: PLW1509 (one prctl call)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            try:
                _wait_or_kill(proc)
            except KeyboardInterrupt:  # a second Ctrl-C: ``skewlens profile`` kills its command at once
                proc.send_signal(signal.SIGINT)
                _wait_or_kill(proc)
            raise


def _wait_or_kill(proc: subprocess.Popen[bytes]) -> None:
    """Wait up to :data:`STOP_GRACE_S` for ``proc`` to end; then SIGKILL it."""
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()


def _ms(ns: float) -> str:
    return f"{ms_text(ns)} ms"


def blame_table(result: AnalysisResult) -> Table:
    """The blame records as a table of per-step means (the top cause's amounts per event, as the caption
    says; ``-`` where nothing was blamed on the rank)."""
    from skewlens.analysis.render import CAUSE_NOTE, blame_steps, cause_column, shown_cause

    steps = blame_steps(result)
    t = Table(
        title=f"What-if blame: mean step time had each rank run like the median rank ({steps} steps)",
        caption=CAUSE_NOTE,
    )
    for col in ("rank", "straggler cost / step", "simulated step", "what-if step", "top cause (per event)"):
        if col.startswith("top cause"):
            cause_column(t, col)
        else:
            t.add_column(col, justify="right")
    for rec in result.stragglers:
        t.add_row(
            str(rec.rank),
            _ms(rec.straggler_cost_ns / steps),
            _ms(rec.baseline_ns / steps),
            _ms(rec.whatif_ns / steps),
            shown_cause(rec, steps),
        )
    return t


def verdict(top: BlameRecord, steps: int) -> str:
    """The verdict on the top straggler ``top``, per step over ``steps``: its cost, and its cause as the blame
    table shows it (``-`` where nothing is blamed on it: the table read ``-`` where the verdict gave the raw
    cause of a rank that cost 9 us in 5 steps)."""
    from skewlens.analysis.render import shown_cause

    return (
        f"Rank {top.rank} is the top straggler: it costs {_ms(top.straggler_cost_ns / steps)} per step "
        f"(mean simulated step {_ms(top.baseline_ns / steps)} -> {_ms(top.whatif_ns / steps)} had it run "
        f"like the median rank).\nCause: {shown_cause(top, steps)}"
    )


def analyse(
    run_dir: Path, analysis_dir: Path, console: Console, *, perfetto_max_events: int | None = None
) -> tuple[AnalysisResult, list[Path]]:
    """The demo's step 2: analyse its run into ``analysis_dir`` and print the report, then, as ``skewlens
    analyze`` does, a warning for what the analysis skipped or assumed and for what the heatmap and the
    Perfetto timeline left out (the timeline's names the ``skewlens analyze`` command that writes it all).
    The result and the files written (``skewlens analyze``'s: :func:`~skewlens.cli.analyze.write_outputs`)."""
    from skewlens.analysis.api import analyze_run
    from skewlens.analysis.perfetto import MAX_EVENTS_OPTION
    from skewlens.analysis.render import print_report, report
    from skewlens.cli.analyze import write_outputs
    from skewlens.profiler.store.validate import load_validated
    from skewlens.replay.streaming import DEFAULT_MAX_EVENTS

    run = load_validated(run_dir, lenient_option="")  # the demo's own run: no option to offer
    progress = RichProgress(console)
    result = analyze_run(run, progress=progress)
    notes: list[str] = []
    written = write_outputs(
        result,
        analysis_dir,
        progress,
        perfetto_max_events=DEFAULT_MAX_EVENTS if perfetto_max_events is None else perfetto_max_events,
        write_all=f"skewlens analyze {path_word(run_dir)} --out DIR {MAX_EVENTS_OPTION} 0",
        on_note=notes.append,
    )
    print_report(console, report(result))
    for note in (*result.notes, *notes):  # on stderr, as skewlens analyze's
        print_warning("demo", note)
    return result, written


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    console = report_console()
    work = workload(args.workload)
    example = EXAMPLES_DIR / work.script
    nproc = work.nproc if args.nproc is None else args.nproc
    straggler = work.straggler_rank if args.straggler_rank is None else args.straggler_rank
    if args.straggler_rank is None and nproc >= 2:  # fewer ranks than the workload's: its last one
        straggler = min(straggler, nproc - 1)
    if not example.is_file():
        raise SkewlensError(f"bundled example not found at {example} (the installed package is incomplete)")
    check_range("--nproc", nproc, 2, MAX_NPROC, "gloo ranks on this machine")
    check_range("--steps", args.steps, MIN_STEPS, MAX_STEPS, "the capture window and a step after it")
    check_range("--straggler-ms", args.straggler_ms, 0.0, MAX_STRAGGLER_MS, "a minute of extra compute")
    if nproc < 2 or not 0 <= straggler < nproc:
        raise SkewlensError("--nproc must be >= 2 and --straggler-rank one of its ranks")
    out = Path(args.out)
    prepare_out(out)
    run_dir, analysis_dir, replay_dir = out / "run", out / "analysis", out / "replay"

    console.rule(
        f"1/3 capture: {args.workload} ({work.script}) on {nproc} gloo ranks, "
        f"{args.straggler_ms:g} ms straggler on rank {straggler}"
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(example), *work.args, "--steps", str(args.steps),
        "--straggler-rank", str(straggler), "--straggler-ms", str(args.straggler_ms),
    ]  # fmt: skip
    window = capture_window(args.steps)
    rc = _skewlens(
        "profile", f"--out={run_dir}", "--level", "ops", "--steps", window, "--parquet", "--", *command
    )
    if rc != 0:
        raise SkewlensError(f"capture failed (exit code {rc}); see the output above")

    console.rule("2/3 analyze: skew, step breakdown, critical path, what-if blame")
    result, written = analyse(run_dir, analysis_dir, console)

    console.rule("3/3 replay: simulated, as recorded and without the straggler")
    rc = _skewlens(
        "replay",
        hydra_override("trace", str(run_dir)),  # a space or a non-ASCII letter in --out: quoted for Hydra
        hydra_override("out", str(replay_dir)),
        "topology=switch",
        "slowdown=none",
    )
    if rc != 0:
        raise SkewlensError(f"replay failed (exit code {rc})")
    console.print(blame_table(result))
    if result.stragglers and result.blame is not None:
        from skewlens.analysis.render import blame_steps

        console.print(Panel(verdict(result.stragglers[0], blame_steps(result)), title="verdict"))
    print_line(
        console,
        f"Outputs: run {run_dir} (Chakra .et + manifest + parquet/), analysis {analysis_dir} "
        f"({len(written)} files: Parquet, PNG, Perfetto JSON), replay {replay_dir}",
    )
    return 0
