"""Fidelity on the bundled example workloads: simulated replay, blame and real replay against real runs.

    .venv/bin/python benchmarks/fidelity.py [--pairs 1] [--workloads tp,fsdp2,...] [--no-real] [--level L]

For each workload of ``skewlens demo --workload`` (FSDP2, DTensor TP, pipelining GPipe / 1F1B, DDP with
``no_sync`` accumulation eager and compiled, the 2-D mesh, and ``train``), on gloo CPU ranks under
``skewlens profile``, per pair of interleaved captures (one plain, one with ``--straggler-rank R
--straggler-ms 40``):

* **sim error**: the simulator's unmodified replay of the plain capture, per rank, its median step time
  (step mark to step mark, as ``skewlens replay`` reports it) against the recorded one; the largest
  absolute difference over the ranks (target: within 5%);
* **calibrated sim error**: the same, of the replay with ``comm_mode=model`` on the topology ``skewlens
  calibrate`` fits from that same plain capture (its default base, one switch, ring formulas): every
  collective timed by the fitted α-β model instead of its recorded duration (target: within 10%). "-"
  where calibrate refuses the capture (its reason printed on the pair's line), e.g. transfers of one
  message size per link;
* **blamed vs real**: the straggler's blamed cost per step (``skewlens analyze``'s what-if blame on the
  straggler capture) against its real cost, the median step time of the straggler capture minus that of
  the plain one (target: within 25%); and whether the straggler is the top-blamed rank;
* **real-replay error** (unless ``--no-real``): the plain capture of every pair (or of the first
  ``--real-pairs``) re-executed on gloo processes (``replay mode=real``) ``--replays`` times, per rank, the
  median over the replays of their median step time against the recorded one; the largest absolute
  difference over the ranks is the capture's error, and the table shows the median over the captures and
  their range (target: within 15%). Single replays of one capture differ by up to ~20 points from one
  another here (GPipe, 2 ranks: +0.2% to +19.7% on one rank over five replays), and one capture's recorded
  steps are themselves one sample, hence several replays of several captures;
* **pooled** and **capture spread**: over the captures replayed for real, per rank, the median of their
  replays' steps against the median of their recorded steps (the largest over the ranks): the replay's
  systematic error, with gloo's launch-to-launch speed (up to ~2x on this 2-core VM: ``docs/benchmarks.md``)
  averaged out of both sides; and the captures' own spread, (max - min) / median of their recorded steps:
  the noise one capture's error is measured against.

Where a workload has more ranks than the machine has cores (the 2-D mesh: 4 ranks on 2 cores), its ranks
are pinned (``--pin shared``, the default; ``all``: every workload's; ``none``): each worker process of a
capture or a real replay to core ``LOCAL_RANK`` modulo the cores (``benchmarks/pin/sitecustomize.py``),
the same placement in every run. Unpinned, the kernel places 4 ranks on 2 cores differently from run to
run, and the placement decides how much of a straggler's delay its peers absorb: a 40 ms straggler cost
the mesh either 12-29 or 40-62 ms a step, by run (``docs/benchmarks.md``). With a core per rank there is
no placement to decide.

Prints one table, workload x figures, measured in this one run. Timing on a 2-core machine is noisy, so
``--pairs`` repeats the interleaved captures (in alternating order) and the table shows the median over
pairs, and the range of the real cost over them: the noise the blame is measured against.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from skewlens.analysis.api import analyze_run
from skewlens.cli.calibrate import load_topology_entry
from skewlens.paths import EXAMPLES_DIR
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.replay.config import RealConfig
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.summary import summarize

ROOT = Path(__file__).resolve().parents[1]
PIN_DIR = Path(__file__).resolve().parent / "pin"
#: Cores this benchmark (and the ranks it starts) may run on.
CORES = len(os.sched_getaffinity(0))
STRAGGLER_MS = 40.0
MS = 1e6
#: Ranks and straggler per workload where the benchmark differs from the demo: 4 ranks share this machine's
#: 2 cores, so every workload that allows it runs on 2 (the 2-D mesh needs 4).
OVERRIDES = {"train": (2, 1)}


@dataclass(frozen=True, slots=True)
class Figures:
    """One pair's figures for one workload."""

    sim_error: float
    calibrated_error: float | None
    """The sim error of the replay on the capture's calibrated topology (``comm_mode=model``); None where
    ``skewlens calibrate`` refused the capture."""
    blamed_ms: float
    real_cost_ms: float
    top_is_straggler: bool
    recorded_ms: dict[int, float] | None
    """Per rank, the plain capture's median recorded step (ms), where it was replayed for real."""
    replayed_ms: dict[int, float] | None
    """Per rank, the median over its real replays of their median step (ms)."""

    @property
    def real_error(self) -> float | None:
        """Largest |replayed - recorded| / recorded over the ranks (this capture against its replays)."""
        if self.recorded_ms is None or self.replayed_ms is None:
            return None
        return max(abs(self.replayed_ms[r] - o) / o for r, o in self.recorded_ms.items())


def capture(out: Path, script: str, args: tuple[str, ...], nproc: int, steps: int, level: str) -> RunTrace:
    """``skewlens profile`` of ``torchrun examples/SCRIPT ARGS`` (two steps skipped, then ``steps``)."""
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--level", level,
        "--steps", f"1:1:{steps}", "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(EXAMPLES_DIR / script), "--steps", str(steps + 4), *args,
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
    if res.returncode != 0:
        raise SystemExit(f"capture of {script} {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    return load_run(out)


def median_step_ns(run: RunTrace) -> float:
    """Median over steps of the mean over ranks of the recorded step time (step mark to step mark)."""
    by_step: dict[int, list[int]] = {}
    for s in run.manifest.steps:
        by_step.setdefault(s.step, []).append(s.end_ns - s.start_ns)
    return statistics.median(statistics.mean(v) for v in by_step.values())


def sim_error(run: RunTrace, res: SimResult | None = None) -> float:
    """Largest |replayed - recorded| / recorded over ranks of the median step time, of ``res`` (default:
    the unmodified replay)."""
    rows = summarize(run, simulate(run) if res is None else res)
    worst = 0.0
    for r in run.ranks:
        mine = [x for x in rows if x.rank == r]
        rep = statistics.median(x.step_time_ns for x in mine)
        rec = statistics.median(x.recorded_step_ns for x in mine)
        worst = max(worst, abs(rep - rec) / rec)
    return worst


def calibrated_error(run: RunTrace, run_dir: Path, out: Path) -> tuple[float | None, str]:
    """The sim error of the replay on the topology ``skewlens calibrate RUN_DIR --out OUT`` fits (with
    ``comm_mode=model``), and the first line of calibrate's error where it refused (None, reason)."""
    cmd = [sys.executable, "-m", "skewlens", "calibrate", str(run_dir), "--out", str(out), "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit code {res.returncode}"
    cfg = load_topology_entry(str(out))
    sim = simulate(run, topology=cfg.to_topology(), comm_mode="model", algorithm=cfg.algorithm)
    return sim_error(run, sim), ""


def real_steps(run_dir: Path, out: Path, replays: int) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank: the capture's median recorded step, and the median over ``replays`` real replays of their
    median step (ms)."""
    from skewlens.replay.real.api import real_replay

    orig: dict[int, float] = {}
    reps: dict[int, list[float]] = {}
    for k in range(replays):
        res = real_replay(
            run_dir=run_dir, out_dir=out / str(k), effects=NO_EFFECTS, cfg=RealConfig(timeout_s=60.0)
        )
        for r in res.ranks:
            orig[r.rank] = statistics.median(r.original_ns) / MS
            reps.setdefault(r.rank, []).append(statistics.median(r.replay_ns) / MS)
    return orig, {r: statistics.median(v) for r, v in reps.items()}


def pooled(figs: list[Figures]) -> tuple[float, float] | None:
    """Over the captures replayed for real: the largest over ranks of |median replayed - median recorded| /
    median recorded (the replay's systematic error, with the launch-to-launch speed of gloo averaged out of
    both sides), and of the captures' own spread, (max - min) / median of their recorded steps (the noise a
    single capture's error is measured against)."""
    done = [
        (f.recorded_ms, f.replayed_ms)
        for f in figs
        if f.recorded_ms is not None and f.replayed_ms is not None
    ]
    if not done:
        return None
    med = statistics.median
    error = spread = 0.0
    for r in done[0][0]:
        rec = [recorded[r] for recorded, _ in done]
        rep = [replayed[r] for _, replayed in done]
        error = max(error, abs(med(rep) - med(rec)) / med(rec))
        spread = max(spread, (max(rec) - min(rec)) / med(rec))
    return error, spread


def one_pair(tmp: Path, name: str, k: int, args: argparse.Namespace) -> Figures:
    """Pair ``k``: a plain and a straggler capture, in alternating order (odd pairs start with the
    straggler), so that a drift of the machine's speed over the run does not always favour one side."""
    from skewlens.cli.demo import workload

    w = workload(name)
    nproc, straggler = OVERRIDES.get(name, (w.nproc, w.straggler_rank))
    slow_args = ("--straggler-rank", str(straggler), "--straggler-ms", str(STRAGGLER_MS))
    runs = {}
    # inherited by every capture and real replay of this pair (benchmarks/pin/sitecustomize.py)
    pin = args.pin == "all" or (args.pin == "shared" and nproc > CORES)
    os.environ["SKEWLENS_BENCH_PIN"] = "1" if pin else "0"
    for side in ("plain", "slow") if k % 2 == 0 else ("slow", "plain"):
        extra = slow_args if side == "slow" else ()
        out = tmp / f"{name}-{k}-{side}"
        runs[side] = capture(out, w.script, w.args + extra, nproc, args.steps, args.level)
    plain, slow = runs["plain"], runs["slow"]
    real = (
        None
        if args.no_real or k >= args.real_pairs
        else real_steps(tmp / f"{name}-{k}-plain", tmp / f"{name}-{k}-real", args.replays)
    )
    cal_error, refused = calibrated_error(plain, tmp / f"{name}-{k}-plain", tmp / f"{name}-{k}-cal.yaml")
    if refused:
        print(f"{name} pair {k}: calibrate refused the plain capture: {refused}", flush=True)
    res = analyze_run(slow, blame=True)
    steps = len({s.step for s in slow.manifest.steps})
    rec = next(b for b in res.stragglers if b.rank == straggler)
    top = res.stragglers[0].rank if res.stragglers else -1
    return Figures(
        sim_error=sim_error(plain),
        calibrated_error=cal_error,
        blamed_ms=rec.straggler_cost_ns / steps / MS,
        real_cost_ms=(median_step_ns(slow) - median_step_ns(plain)) / MS,
        top_is_straggler=top == straggler,
        recorded_ms=real[0] if real else None,
        replayed_ms=real[1] if real else None,
    )


def main() -> None:
    from skewlens.cli.demo import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pairs", type=int, default=4, help="interleaved plain/straggler capture pairs")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated names")
    ap.add_argument("--steps", type=int, default=10, help="captured steps per run")
    ap.add_argument("--level", default="collectives", help="capture level")
    ap.add_argument("--no-real", action="store_true", help="skip the real replay")
    ap.add_argument("--replays", type=int, default=3, help="real replays of each replayed plain capture")
    ap.add_argument("--real-pairs", type=int, default=None, help="pairs replayed for real (default: all)")
    ap.add_argument(
        "--pin",
        choices=("shared", "all", "none"),
        default="shared",
        help="pin ranks to cores: where they outnumber the cores (default), always, or never",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the captures to DIR and keep them (to analyse them again, say with other code)",
    )
    args = ap.parse_args()
    if args.pin != "none":  # the folder of the sitecustomize that pins (where one_pair switches it on)
        rest = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(PIN_DIR), rest] if rest else [str(PIN_DIR)])
    if args.real_pairs is None:
        args.real_pairs = args.pairs
    names = [n for n in args.workloads.split(",") if n]
    pinned = {
        "none": "unpinned",
        "all": "ranks pinned to cores",
        "shared": f"ranks pinned where more than the {CORES} cores",
    }[args.pin]
    table = Table(
        title=f"Fidelity ({args.level} level, {args.pairs} pair(s), straggler {STRAGGLER_MS:g} ms, {pinned})"
    )
    cols = (
        "workload",
        "sim step error",
        "calibrated sim error",
        "blamed ms/step",
        "real cost ms/step",
        "real cost range",
    )
    for c in (
        *cols,
        "blame error",
        "top",
        "real-replay error",
        "real-replay range",
        "pooled",
        "capture spread",
    ):
        table.add_column(c, justify="right")
    t0 = time.monotonic()
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="skl-fidelity-"))
        else:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        for name in names:
            figs = []
            for k in range(args.pairs):
                f = one_pair(Path(tmp), name, k, args)
                figs.append(f)
                rr = "-" if f.real_error is None else f"{f.real_error:.1%}"
                ce = "-" if f.calibrated_error is None else f"{f.calibrated_error:.1%}"
                print(
                    f"{name} pair {k}: sim {f.sim_error:.1%}, calibrated sim {ce}, blamed {f.blamed_ms:.1f} "
                    f"ms/step, real cost {f.real_cost_ms:.1f} ms/step, top {f.top_is_straggler}, "
                    f"real replay {rr}",
                    flush=True,
                )
            med = statistics.median
            blamed, real = med(f.blamed_ms for f in figs), med(f.real_cost_ms for f in figs)
            reals = [f.real_error for f in figs if f.real_error is not None]
            cals = [f.calibrated_error for f in figs if f.calibrated_error is not None]
            table.add_row(
                name,
                f"{med(f.sim_error for f in figs):.1%}",
                f"{med(cals):.1%}" if cals else "-",
                f"{blamed:.1f}",
                f"{real:.1f}",
                f"{min(f.real_cost_ms for f in figs):.1f}-{max(f.real_cost_ms for f in figs):.1f}",
                f"{(blamed - real) / real:+.1%}" if real > 0 else "-",
                "yes" if all(f.top_is_straggler for f in figs) else "no",
                f"{med(reals):.1%}" if reals else "-",
                f"{min(reals):.1%}-{max(reals):.1%}" if reals else "-",
                *((f"{p[0]:.1%}", f"{p[1]:.1%}") if (p := pooled(figs)) else ("-", "-")),
            )
            print(f"{name}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    Console(width=max(140, Console().width)).print(table)


if __name__ == "__main__":
    main()
