"""``skewlens check RUN_DIR`` and ``skewlens export [--format parquet|astra-sim] RUN_DIR --out DIR``."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from skewlens.cli.options import ArgumentParser, check_range, user_file, user_path
from skewlens.console import printable, report_console
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.manifest import MAX_WORLD_SIZE
from skewlens.progress import NO_PROGRESS, Progress
from skewlens.rich_progress import RichProgress

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy as np
    from rich.console import RenderableType

    from skewlens.profiler.store.parquet import ModelColumns
    from skewlens.profiler.store.validate import ValidationReport
    from skewlens.replay.export_astra import AstraExport


def _console() -> Console:
    return report_console()


def _progress(off: bool, console: Console | None) -> Progress:
    """A bar on stderr (or on the console a caller gave), unless ``--no-progress``."""
    return NO_PROGRESS if off else RichProgress(console if console is not None else Console(stderr=True))


def check_main(argv: list[str], console: Console | None = None) -> int:
    """Validate a run; prints a rich report; exit code 1 when it has errors."""
    ap = ArgumentParser(
        prog="skewlens check",
        description="validate a run directory",
        epilog="exit status: 0 when the run has no errors (warnings allowed), 1 when it has errors (a "
        "corrupt or missing rank file, unmatched communication, ...), 2 when it cannot be read as a run "
        "(no manifest or traces, a manifest that is not JSON)",
    )
    ap.add_argument(
        "run_dir",
        type=user_path,
        help="run directory (manifest + rank-<r>.et), Chakra trace folder or prefix",
    )
    ap.add_argument("--all", action="store_true", help="list every problem (default: the first 50)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from skewlens.profiler.store.render import render_report
    from skewlens.replay.simulate import validate_replayable

    out = console or _console()
    # every file decoded: a file whose bytes changed in the middle (bit rot, an edit that kept its size and
    # time) still matches its column cache
    report = validate_replayable(
        args.run_dir, progress=_progress(args.no_progress, console), decoder="vectorised"
    )
    out.print(render_report(report, max_issues=None if args.all else 50))
    hint = _lenient_hint(report)
    if hint is not None:
        out.print(hint)
    return 0 if report.ok else 1


def _lenient_hint(report: ValidationReport) -> RenderableType | None:
    """Where communication disagrees across ranks, a rank's trace is missing, unreadable or another run's,
    or an all_to_all's splits are inconsistent, and nothing else is wrong: what ``analyze --lenient`` /
    ``replay lenient=true`` would skip (one line per process group, one for the ranks left out for a trace
    missing or unreadable, one for those left out for another run's, one per node whose splits it drops)
    to use the rest."""
    from rich.text import Text

    from skewlens.profiler.store.issues import rank_ranges, summarise_dropped_splits, summarise_skipped
    from skewlens.profiler.store.validate import lenient_remedy

    if report.ok:
        return None
    remedy = lenient_remedy(report.errors)
    lines = summarise_skipped(report.skipped)
    if remedy.unreadable:
        lines.append(f"rank(s) {rank_ranges(remedy.unreadable)} left out (trace missing or unreadable)")
    if remedy.another_runs:
        lines.append(f"rank(s) {rank_ranges(remedy.another_runs)} left out (another run's trace)")
    if report.run is not None:
        lines.extend(summarise_dropped_splits(report.run.dropped_splits))
    if not lines or not remedy.covered:
        return None
    head = "`skewlens analyze --lenient` / `skewlens replay lenient=true` use the rest, skipping:"
    return Text("\n".join([head, *(f"  {line}" for line in lines)]), style="yellow")


def parquet_model(run_dir: str | Path, *, lenient: bool, progress: Progress = NO_PROGRESS) -> ModelColumns:
    """The Parquet export's ``model`` table: the execution model's reading of each node of the run, loaded
    as ``skewlens analyze`` loads it (``lenient``: as with ``--lenient``, for ``--allow-errors``)."""

    def columns() -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        from skewlens.profiler.store.validate import load_validated
        from skewlens.replay.execution import model_columns

        option = "" if lenient else "--allow-errors"
        run = load_validated(run_dir, progress=progress, lenient=lenient, lenient_option=option)
        return model_columns(run)

    return columns


#: The options of ``skewlens export --format astra-sim`` alone (refused with the Parquet export).
ASTRA_OPTIONS = ("--prefix", "--no-configs", "--bandwidth", "--latency", "--host-compute")


def export_main(argv: list[str], console: Console | None = None) -> int:
    """Export a run: to Parquet (nodes/deps/model partitioned by rank, collectives, p2p, ranks; the
    default), or as an ASTRA-sim workload (``--format astra-sim``: one Chakra trace per NPU, communicator
    groups, example configurations and the command line that runs it)."""
    ap = ArgumentParser(
        prog="skewlens export", description="export a run directory to Parquet or as an ASTRA-sim workload"
    )
    ap.add_argument("run_dir", type=user_path, help="run directory, Chakra trace folder or prefix")
    ap.add_argument(
        "--format",
        choices=("parquet", "astra-sim"),
        default="parquet",
        help="parquet (default): Parquet tables; astra-sim: Chakra traces ASTRA-sim runs",
    )
    ap.add_argument(
        "--out",
        type=user_file,
        default=None,
        help="output directory (default: RUN_DIR/parquet or RUN_DIR/astra-sim, or PREFIX.parquet / "
        "PREFIX.astra-sim)",
    )
    ap.add_argument(
        "--workers", type=int, default=None, help="processes converting rank files in parallel (parquet)"
    )
    ap.add_argument("--allow-errors", action="store_true", help="export even if validation finds errors")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    parquet = ap.add_argument_group("parquet")
    parquet.add_argument(
        "--no-model",
        action="store_true",
        help="leave out the model table (the execution model's reading of each node, which needs the whole "
        "run loaded, as analyze loads it): memory bounded by a few ranks; the skew SQL needs the table",
    )
    astra = ap.add_argument_group("astra-sim")
    astra.add_argument(
        "--prefix", default="workload", help="workload prefix: rank r's trace is <OUT>/<PREFIX>.<r>.et"
    )
    astra.add_argument(
        "--no-configs",
        action="store_true",
        help="write no example system/network/memory configurations (the command names placeholders)",
    )
    astra.add_argument(
        "--bandwidth", type=float, default=50.0, help="example network: GB/s per link (default 50)"
    )
    astra.add_argument(
        "--latency", type=float, default=500.0, help="example network: ns per link (default 500)"
    )
    astra.add_argument(
        "--host-compute",
        choices=("auto", "npu", "drop"),
        default="auto",
        help="host compute nodes: the NPU's compute (npu), dropped (drop), or dropped only on ranks that "
        "also have GPU kernels (auto, the default)",
    )
    args = ap.parse_args(argv)
    if args.format != "astra-sim":  # an option of the other format would be ignored, silently
        given = [
            o
            for o in ASTRA_OPTIONS
            if getattr(args, o[2:].replace("-", "_")) != ap.get_default(o[2:].replace("-", "_"))
        ]
        if given:
            raise SkewlensError(
                f"{given[0]}: an option of --format astra-sim, which this export (--format {args.format}) "
                "does not use; add --format astra-sim, or leave it out"
            )
    if args.format == "astra-sim" and args.no_model:
        raise SkewlensError(
            "--no-model: an option of --format parquet, which this export (--format astra-sim) does not use; "
            "leave it out"
        )
    check_range("--workers", args.workers, 1, MAX_WORLD_SIZE, "one process per rank file at most")
    if not (math.isfinite(args.bandwidth) and args.bandwidth > 0):
        raise SkewlensError(f"--bandwidth: expected GB/s > 0, got {args.bandwidth}")
    if not (math.isfinite(args.latency) and args.latency >= 0):
        raise SkewlensError(f"--latency: expected ns >= 0, got {args.latency}")
    out = console or _console()
    run = Path(args.run_dir)
    suffix = "parquet" if args.format == "parquet" else "astra-sim"
    default = run / suffix if run.is_dir() else run.with_name(f"{run.name}.{suffix}")  # a prefix
    target = args.out if args.out is not None else default
    t0 = time.perf_counter()
    if args.format == "astra-sim":
        from skewlens.replay.export_astra import export_astra_sim

        result = export_astra_sim(
            args.run_dir,
            target,
            prefix=args.prefix,
            configs=not args.no_configs,
            bandwidth_gbps=args.bandwidth,
            latency_ns=args.latency,
            host_compute=args.host_compute,
            strict=not args.allow_errors,
            progress=_progress(args.no_progress, console),
            allow_option="--allow-errors",
        )
        out.print(_render_astra(result, time.perf_counter() - t0))
        out.print(
            result.command_line, soft_wrap=True, markup=False, highlight=False, style="bold"
        )  # one line
        return 0
    from skewlens.profiler.store.parquet import export_run
    from skewlens.profiler.store.render import issue_lines, render_export

    progress = _progress(args.no_progress, console)
    summary = export_run(
        args.run_dir,
        target,
        workers=args.workers,
        strict=not args.allow_errors,
        progress=progress,
        allow_option="--allow-errors",
        model=None
        if args.no_model
        else parquet_model(args.run_dir, lenient=args.allow_errors, progress=progress),
    )
    out.print(render_export(summary, time.perf_counter() - t0))
    for line in issue_lines(summary.issues, args.run_dir):  # on stderr: a script's > out.txt gets results
        print(f"skewlens export: {printable(line)}", file=sys.stderr)
    return 0


def _render_astra(result: AstraExport, seconds: float) -> RenderableType:
    """Files per rank, groups and what was rewritten (the command line is printed after it, unwrapped)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = f"ASTRA-sim workload in {result.out_dir}"
    table = Table(title=title, min_width=len(title))  # narrower, the table wrapped its title mid-path
    table.add_column("rank", justify="right")
    table.add_column("trace")
    table.add_column("nodes", justify="right")
    for r, path in sorted(result.traces.items()):
        table.add_row(str(r), path.name, f"{result.nodes[r]:,}")
    parts: list[RenderableType] = [table]
    subgroups = [g for g in result.groups if g.astra_id != "0"]
    if subgroups:
        parts.append(
            Text(
                "communicator groups: "
                + "; ".join(
                    f"{g.astra_id} = ranks {list(g.ranks)}"
                    + (f" (c10d group {g.source_name!r})" if g.source_name != g.astra_id else "")
                    for g in subgroups
                )
            )
        )
    if result.changes:
        parts.append(Text("rewritten: " + "; ".join(f"{k}: {v}" for k, v in sorted(result.changes.items()))))
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes)
    configs = "example configs written beside the traces" if result.system_config else "supply the configs"
    parts.append(Text(f"{sum(result.nodes.values()):,} nodes in {seconds:.2f} s; {configs}. Run:"))
    return Group(*parts)
