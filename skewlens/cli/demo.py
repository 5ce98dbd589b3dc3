"""``skewlens demo``: the whole loop on the bundled example, on the CPU.

1. capture ``examples/train.py`` on 4 gloo ranks under ``torchrun`` with a 40 ms straggler on rank 2
   (``skewlens profile --level ops``);
2. validate and analyse the run (``skewlens analyze``: skew, step breakdown, critical path, what-if blame,
   Parquet tables, PNGs and a Perfetto timeline);
3. replay the run in the simulator with and without the straggler and print the blame table.

Everything lands in ``--out`` (default ``demo-out/``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from skewlens.paths import EXAMPLES_DIR
from skewlens.profiler.errors import SkewlensError
from skewlens.rich_progress import RichProgress

if TYPE_CHECKING:
    from skewlens.analysis.api import AnalysisResult

EXAMPLE = EXAMPLES_DIR / "train.py"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewlens demo", description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--out", default="demo-out", help="new or empty directory, or one an earlier demo made (replaced)"
    )
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--steps", type=int, default=8, help="training steps of the example (default 8)")
    p.add_argument("--straggler-rank", type=int, default=2)
    p.add_argument("--straggler-ms", type=float, default=40.0)
    return p


#: Left in every ``--out`` the demo creates: only a directory holding it is replaced by a later demo.
DEMO_MARKER = ".skewlens-demo"


def prepare_out(out: Path) -> None:
    """Make ``out`` an empty directory of the demo's own.

    A missing or empty directory is taken; a non-empty one only when an earlier demo created it (it holds
    :data:`DEMO_MARKER`), so ``--out .`` or a directory of the user's is never deleted.
    """
    if out.exists() and not out.is_dir():
        raise SkewlensError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / DEMO_MARKER).is_file():
            raise SkewlensError(
                f"--out {out}: not empty and not created by skewlens demo; "
                "name a new or empty directory, or remove this one yourself"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("created by skewlens demo; replaced by the next demo with this --out\n")


def _skewlens(*args: str) -> int:
    """Run ``skewlens ARGS...`` as a user would (its own process, output to this terminal)."""
    return subprocess.run([sys.executable, "-m", "skewlens", *args], check=False).returncode


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def blame_table(result: AnalysisResult) -> Table:
    """The blame records as a table of per-step means."""
    steps = max(len(result.blame.baseline_step_ns), 1) if result.blame is not None else 1
    t = Table(title=f"What-if blame: mean step time had each rank run like the median rank ({steps} steps)")
    for col in ("rank", "straggler cost / step", "simulated step", "what-if step", "top cause"):
        t.add_column(col, justify="right" if col != "top cause" else "left")
    for rec in result.stragglers:
        t.add_row(
            str(rec.rank),
            _ms(rec.straggler_cost_ns / steps),
            _ms(rec.baseline_ns / steps),
            _ms(rec.whatif_ns / steps),
            rec.cause,
        )
    return t


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    if not EXAMPLE.is_file():
        raise SkewlensError(f"bundled example not found at {EXAMPLE} (the installed package is incomplete)")
    if args.nproc < 2 or not 0 <= args.straggler_rank < args.nproc:
        raise SkewlensError("--nproc must be >= 2 and --straggler-rank one of its ranks")
    out = Path(args.out)
    prepare_out(out)
    run_dir, analysis_dir, replay_dir = out / "run", out / "analysis", out / "replay"

    console.rule(
        f"1/3 capture: {args.nproc} gloo ranks, "
        f"{args.straggler_ms:g} ms straggler on rank {args.straggler_rank}"
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
        str(EXAMPLE), "--steps", str(args.steps),
        "--straggler-rank", str(args.straggler_rank), "--straggler-ms", str(args.straggler_ms),
    ]  # fmt: skip
    rc = _skewlens(
        "profile", "--out", str(run_dir), "--level", "ops", "--steps", "1:1:5", "--parquet", "--", *command
    )
    if rc != 0:
        raise SkewlensError(f"capture failed (exit code {rc}); see the output above")

    console.rule("2/3 analyse: skew, step breakdown, critical path, what-if blame")
    from skewlens.analysis.api import analyze_run, write_tables
    from skewlens.analysis.perfetto import PERFETTO_FILE, write_perfetto
    from skewlens.analysis.plots import BREAKDOWN_FILE, WAIT_HEATMAP_FILE, breakdown_bars, wait_heatmap
    from skewlens.analysis.render import report
    from skewlens.profiler.store.validate import load_validated

    run = load_validated(run_dir)
    result = analyze_run(run, progress=RichProgress(console))
    written = write_tables(result, analysis_dir)
    written += [
        wait_heatmap(result, analysis_dir / WAIT_HEATMAP_FILE),
        breakdown_bars(result, analysis_dir / BREAKDOWN_FILE),
        write_perfetto(result, analysis_dir / PERFETTO_FILE),
    ]
    console.print(report(result))

    console.rule("3/3 replay: simulated, as recorded and without the straggler")
    rc = _skewlens("replay", f"trace={run_dir}", f"out={replay_dir}", "topology=switch", "slowdown=none")
    if rc != 0:
        raise SkewlensError(f"replay failed (exit code {rc})")
    console.print(blame_table(result))
    if result.stragglers and result.blame is not None:
        top = result.stragglers[0]
        n = max(len(result.blame.baseline_step_ns), 1)
        console.print(
            Panel(
                f"Rank {top.rank} is the top straggler: it costs {_ms(top.straggler_cost_ns / n)} per step "
                f"(mean simulated step {_ms(top.baseline_ns / n)} -> {_ms(top.whatif_ns / n)} had it run "
                f"like the median rank).\nCause: {top.cause}",
                title="verdict",
            )
        )
    console.print(
        f"Outputs: run {run_dir} (Chakra .et + manifest + parquet/), analysis {analysis_dir} "
        f"({len(written)} files: Parquet, PNG, Perfetto JSON), replay {replay_dir}"
    )
    return 0
