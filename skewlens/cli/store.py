"""``skewlens check RUN_DIR`` and ``skewlens export RUN_DIR --out PARQUET_DIR``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from skewlens.progress import NO_PROGRESS, Progress
from skewlens.rich_progress import RichProgress


def _console() -> Console:
    return Console(stderr=False)


def _progress(off: bool, console: Console | None) -> Progress:
    """A bar on stderr (or on the console a caller gave), unless ``--no-progress``."""
    return NO_PROGRESS if off else RichProgress(console if console is not None else Console(stderr=True))


def check_main(argv: list[str], console: Console | None = None) -> int:
    """Validate a run; prints a rich report; exit code 1 when it has errors."""
    ap = argparse.ArgumentParser(prog="skewlens check", description="validate a run directory")
    ap.add_argument("run_dir", help="run directory (manifest + rank-<r>.et), Chakra trace folder or prefix")
    ap.add_argument("--all", action="store_true", help="list every problem (default: the first 50)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from skewlens.profiler.store.render import render_report
    from skewlens.profiler.store.validate import validate_run

    out = console or _console()
    report = validate_run(args.run_dir, progress=_progress(args.no_progress, console))
    out.print(render_report(report, max_issues=None if args.all else 50))
    return 0 if report.ok else 1


def export_main(argv: list[str], console: Console | None = None) -> int:
    """Export a run to Parquet (nodes/deps partitioned by rank, collectives, p2p, ranks)."""
    ap = argparse.ArgumentParser(prog="skewlens export", description="export a run directory to Parquet")
    ap.add_argument("run_dir", help="run directory, Chakra trace folder or prefix")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: RUN_DIR/parquet, or PREFIX.parquet)",
    )
    ap.add_argument("--workers", type=int, default=None, help="processes converting rank files in parallel")
    ap.add_argument("--allow-errors", action="store_true", help="export even if validation finds errors")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from skewlens.profiler.store.parquet import export_run
    from skewlens.profiler.store.render import render_export

    out = console or _console()
    run = Path(args.run_dir)
    default = run / "parquet" if run.is_dir() else run.with_name(run.name + ".parquet")  # a prefix
    target = args.out if args.out is not None else default
    t0 = time.perf_counter()
    summary = export_run(
        args.run_dir,
        target,
        workers=args.workers,
        strict=not args.allow_errors,
        progress=_progress(args.no_progress, console),
    )
    out.print(render_export(summary, time.perf_counter() - t0))
    return 0
