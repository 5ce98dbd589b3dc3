"""``skewlens import``: Kineto JSON (+ host execution traces) of a real run -> a run directory.

    skewlens import --kineto traces/dlrm_kineto.tar.gz --host-et traces/dlrm_et.tar.gz --out runs/dlrm
    skewlens import --kineto rank0.json.gz --out runs/one
    skewlens import --kineto traces/ --out runs/big --workers 2 --memory-budget-mib 2048

Inputs may be files (``.json``, ``.json.gz``), directories or tar archives. Errors print one line
(the dispatcher in ``skewlens.cli`` does that) and exit 2.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from skewlens.cli.options import ArgumentParser, user_file
from skewlens.console import print_line, ranks_caption, report_console
from skewlens.profiler.importers import import_traces
from skewlens.profiler.importers.run import DEFAULT_MEMORY_BUDGET_BYTES
from skewlens.profiler.manifest import Manifest
from skewlens.profiler.store.issues import MAX_RANK_ROWS, counted, no_trace_line, rank_ranges
from skewlens.progress import NO_PROGRESS
from skewlens.rich_progress import RichProgress


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="skewlens import",
        description="Convert per-rank Kineto traces (+ host execution traces) into a run directory.",
    )
    p.add_argument(
        "--kineto", nargs="+", type=user_file, required=True, metavar="PATH",
        help="per-rank Kineto traces: .json/.json.gz files, directories or .tar.gz archives",
    )  # fmt: skip
    p.add_argument(
        "--host-et", nargs="+", type=user_file, default=None, metavar="PATH",
        help="the matching PyTorch host execution traces (paired by pid or by the file name's number)",
    )  # fmt: skip
    p.add_argument("--out", type=user_file, required=True, help="run directory to create")
    p.add_argument("--rank", type=int, default=None, help="rank of a single trace without distributedInfo")
    p.add_argument("--world-size", type=int, default=None, help="world size where the traces lack it")
    p.add_argument(
        "--workers", type=_positive, default=None, metavar="N",
        help="at most N worker processes converting ranks (default: one per core, within the memory budget)",
    )  # fmt: skip
    p.add_argument(
        "--memory-budget-mib", type=_positive, default=None, metavar="MIB",
        help=f"memory the workers may use together (default {DEFAULT_MEMORY_BUDGET_BYTES >> 20} MiB)",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace an existing run directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return p


def summary_table(manifest: Manifest) -> Table:
    """One row per imported rank (the first :data:`MAX_RANK_ROWS`; the caption counts the rest): device, the
    ``ProfilerStep#`` numbers of its steps (as ranges: ``0-189``; none: the whole trace is one step), source
    file; one row for all ranks without a trace."""
    t = Table()
    t.add_column("rank", justify="right")
    t.add_column("device")
    t.add_column("step numbers", overflow="fold")  # folded, not cut where the terminal is narrow: a
    t.add_column("source", overflow="fold")  # file name read `worker0_step_12.16941282…` at 60 columns
    steps: dict[int, list[int]] = {}
    for s in manifest.steps:
        steps.setdefault(s.rank, []).append(s.step)
    if len(manifest.ranks) > MAX_RANK_ROWS:
        t.caption = ranks_caption(manifest.ranks, "manifest.json")
    for r in manifest.ranks[:MAX_RANK_ROWS]:
        t.add_row(
            str(r),
            " ".join(d for d in (manifest.devices.get(r, ""), manifest.gpus.get(r, "")) if d),
            rank_ranges(steps.get(r, ())) or "none: one step",
            manifest.notes.get(f"rank {r} source", ""),
        )
    missing = manifest.missing_ranks
    if missing:
        notes = sorted(set(manifest.missing_by_note()) - {""})
        why = f" ({'; '.join(notes)})" if notes else ""
        line = no_trace_line(missing, manifest.world_size)
        t.add_row(rank_ranges(missing), "-", "-", f"(missing) {line}{why}")
    return t


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    console = report_console(stderr=True)
    manifest = import_traces(
        args.kineto,
        args.host_et,
        args.out,
        rank=args.rank,
        world_size=args.world_size,
        overwrite=args.force,
        workers=args.workers,
        memory_budget_bytes=None if args.memory_budget_mib is None else args.memory_budget_mib << 20,
        progress=NO_PROGRESS if args.quiet else RichProgress(console),
    )
    if not args.quiet:
        out = report_console()
        print_line(
            out, f"imported {len(manifest.ranks)} of {counted(manifest.world_size, 'rank')} into {args.out}"
        )
        out.print(summary_table(manifest))
    return 0
