"""``skewlens analyze RUN_DIR --out OUT_DIR``: run the analyses, write tables and pictures, print a report."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console

from skewlens.analysis.api import (
    BLAME_FILE,
    BLAME_HOSTS_FILE,
    BLAME_STEPS_FILE,
    BREAKDOWN_FILE,
    CRITICAL_PATH_FILE,
    GPU_IDLE_FILE,
    GPU_KERNELS_FILE,
    SKEW_FILE,
    AnalysisResult,
    analyze_run,
    write_tables,
)
from skewlens.analysis.perfetto import MAX_EVENTS_OPTION, PERFETTO_FILE, write_perfetto
from skewlens.analysis.plots import BREAKDOWN_FILE as BREAKDOWN_PNG
from skewlens.analysis.plots import GPU_IDLE_FILE as GPU_IDLE_PNG
from skewlens.analysis.plots import WAIT_HEATMAP_FILE, breakdown_bars, gpu_idle_bars, wait_heatmap
from skewlens.analysis.render import print_report, report
from skewlens.cli.options import ArgumentParser, user_path
from skewlens.console import print_line, print_warning, report_console
from skewlens.profiler.atomic import move_into, staging_dir
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.issues import lenient_line, untraced_members_line
from skewlens.profiler.store.model import RunTrace
from skewlens.progress import Progress
from skewlens.replay.streaming import DEFAULT_MAX_EVENTS
from skewlens.rich_progress import RichProgress

#: What-if simulations per analysis unless --max-simulations says otherwise (each replays the whole run).
DEFAULT_MAX_SIMULATIONS = 16
#: The option that analyses a run whose communication does not match across ranks (named in the refusal).
LENIENT_OPTION = "--lenient"


def load_for_analysis(run_dir: str | Path, console: Console, *, lenient: bool = False) -> RunTrace:
    """Load and validate the run (the store's validating loader); ``lenient``: communication that
    disagrees across ranks is skipped (``RunTrace.skipped_comm``) instead of refusing the run."""
    from skewlens.profiler.store.validate import load_validated

    return load_validated(
        run_dir, progress=RichProgress(console), lenient=lenient, lenient_option=LENIENT_OPTION
    )


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="skewlens analyze",
        description="Attribute skew and communication stalls to ranks and ops; name the stragglers.",
    )
    p.add_argument(
        "run_dir", type=user_path, metavar="RUN_DIR", help="run directory (manifest.json + rank-<r>.et)"
    )
    p.add_argument(
        "--out", type=user_path, required=True, metavar="OUT_DIR", help="where to write tables and pictures"
    )
    p.add_argument("--no-blame", action="store_true", help="skip the what-if simulations")
    p.add_argument(
        "--max-simulations",
        type=int,
        default=DEFAULT_MAX_SIMULATIONS,
        metavar="N",
        help=f"simulate at most N what-ifs, ranks with the largest excess over the median first; "
        f"what-ifs proven to change no step are not simulated and not counted "
        f"(default {DEFAULT_MAX_SIMULATIONS}; 0: none)",
    )
    p.add_argument("--no-pictures", action="store_true", help="skip the PNGs and the Perfetto JSON")
    p.add_argument(
        MAX_EVENTS_OPTION,
        type=int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help=f"at most N nodes in the Perfetto JSON (default {DEFAULT_MAX_EVENTS:,}; 0: all): a larger run "
        "gets its first whole steps on all ranks that fit, and a note of what was left out",
    )
    p.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="N",
        help="rows in the straggler table (default 5; the worst collectives table has twice as many)",
    )
    p.add_argument(
        LENIENT_OPTION,
        action="store_true",
        help="analyse a run whose communication does not match across ranks (order, size, count): what "
        "disagrees is skipped, its nodes keep their recorded durations and synchronise with no other "
        "rank, and the report says per process group what was skipped and why; a rank whose trace file "
        "is missing, unreadable or another run's is left out, and the waits at its groups' collectives "
        "are blamed on no rank",
    )
    return p


#: Every file ``skewlens analyze`` may write into its output directory.
OUTPUTS = (
    SKEW_FILE,
    BREAKDOWN_FILE,
    CRITICAL_PATH_FILE,
    GPU_IDLE_FILE,
    GPU_KERNELS_FILE,
    BLAME_FILE,
    BLAME_STEPS_FILE,
    BLAME_HOSTS_FILE,
    WAIT_HEATMAP_FILE,
    BREAKDOWN_PNG,
    GPU_IDLE_PNG,
    PERFETTO_FILE,
)


@contextlib.contextmanager
def staged_outputs(out: Path) -> Iterator[Path]:
    """A directory beside ``out`` (inside it where it exists) to write the outputs into
    (:func:`staging_dir`); once the block ends without an error they replace ``out``'s (an earlier
    analysis's files this one did not write, a blame left from a run with blame, go too: a directory never
    mixes two analyses); on an error or an interrupt nothing in ``out`` changes, but for an interrupt between
    two of the final renames, which says so (:func:`~skewlens.profiler.atomic.moving_into`)."""
    with staging_dir(out.absolute(), inside=True) as stage:
        yield stage
        move_into(stage, out, OUTPUTS)


def write_outputs(
    result: AnalysisResult,
    out: Path,
    progress: Progress,
    *,
    pictures: bool = True,
    perfetto_max_events: int = DEFAULT_MAX_EVENTS,
    write_all: str = f"{MAX_EVENTS_OPTION} 0",
    on_note: Callable[[str], None],
) -> list[Path]:
    """Write the analysis' files into ``out``: its Parquet tables and, with ``pictures``, the wait heatmap,
    the breakdown bars, the GPU idle bars (a GPU run) and the Perfetto timeline; ``on_note`` is given what
    the heatmap and the timeline left out (``write_all``: the caller's way to write the timeline whole).
    The files written."""
    with progress.task("writing outputs: tables", 4 if pictures else 1) as advance:
        written = write_tables(result, out)
        advance()
        if pictures:
            advance(0, description="writing outputs: wait heatmap")
            written.append(wait_heatmap(result, out / WAIT_HEATMAP_FILE, on_note=on_note))
            advance(description="writing outputs: breakdown bars")
            written.append(breakdown_bars(result, out / BREAKDOWN_PNG))
            if (bars := gpu_idle_bars(result, out / GPU_IDLE_PNG)) is not None:
                written.append(bars)
            advance(description="writing outputs: Perfetto timeline")
            written.append(
                write_perfetto(
                    result,
                    out / PERFETTO_FILE,
                    max_events=perfetto_max_events,
                    on_note=on_note,
                    write_all=write_all,
                )
            )
            advance()
    return written


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.top < 1:
        raise SkewlensError(f"--top: expected >= 1, got {args.top}")
    if args.max_simulations is not None and args.max_simulations < 0:
        raise SkewlensError(f"--max-simulations: expected >= 0, got {args.max_simulations}")
    if args.perfetto_max_events < 0:
        raise SkewlensError(f"{MAX_EVENTS_OPTION}: expected >= 0 (0: all), got {args.perfetto_max_events}")
    err = report_console(stderr=True)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SkewlensError(f"--out {out}: exists and is not a directory")
    if out.resolve() == Path(args.run_dir).resolve():
        raise SkewlensError(
            f"--out {out}: is the run's own directory: the analysis' files would lie among the run's; give "
            "another directory, such as one beside it"
        )
    run = load_for_analysis(args.run_dir, err, lenient=args.lenient)
    progress = RichProgress(err)
    result = analyze_run(
        run, blame=not args.no_blame, max_simulations=args.max_simulations, progress=progress
    )
    notes: list[str] = []
    with staged_outputs(out) as stage:
        written = write_outputs(
            result,
            stage,
            progress,
            pictures=not args.no_pictures,
            perfetto_max_events=args.perfetto_max_events,
            on_note=notes.append,
        )
    console = report_console()
    if (lenient := lenient_line(run)) is not None:  # a saved report says it too, not stderr alone
        print_line(console, lenient)
    if (untraced := untraced_members_line(run, replay=False)) is not None:
        print_line(console, untraced)
    print_report(console, report(result, top=args.top))
    for note in (*result.notes, *notes):  # on stderr: a script's > out.txt gets the results only
        print_warning("analyze", note)
    print_line(console, f"wrote {len(written)} files to {out}")
    return 0
