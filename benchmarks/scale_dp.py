"""Extrapolation (``scale.dp=N``): the wall time of a 1,024-rank replay, and predicted vs measured step times.

    .venv/bin/python benchmarks/scale_dp.py [--trace RUN] [--dp 1024] [--slow-rank 777] [--factor 1.5]
    .venv/bin/python benchmarks/scale_dp.py --sizes 2,4,8 [--launcher CMD] [--script examples/ddp_accum.py]
        [--topology switch] [--override topology.dims.0.bandwidth_gbps=5 ...]

Part 1 (always): a 4-rank capture of ``--script`` (``examples/ddp_accum.py``; or ``--trace RUN``) replayed as
``--dp`` data-parallel ranks with rank ``--slow-rank`` computing ``--factor`` times slower, as
``skewlens replay trace=RUN scale.dp=1024 comm_mode=model slowdown=straggler`` does: the wall time of each
stage (load, scale, simulate, summary), the peak resident memory, and which rank the others waited for
(the smallest summed wait: it must be the slowed one). Target here: under a minute in all.

Part 2 (``--sizes``): capture ``--script`` at the smallest size with ``--launcher`` (``{nproc}`` in it is
replaced by the rank count; default torchrun on this host), extrapolate it to every size with
``--topology`` (an entry of ``conf/topology/``, with Hydra ``--override``s: a calibrated one belongs
here), and measure each size for real (the script's ``--step-times-out``, median step of rank 0 after two
warm-up steps). Prints predicted vs measured step times. On a machine with fewer cores than the largest
size this compares the model with CPU contention, not with the network (on a 2-core machine a DP run with
4 gloo all_reduces of 2 MiB and 30 ms of sleep per step measured 38.8 ms/step at 2 ranks, 55 at 4, 100 at
8: past 2 ranks gloo's reductions share the cores), so Part 2 is for a machine with a core per rank.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from skewlens.cli.replay import CONF_DIR, register_configs, to_config
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.replay.config import ReplayConfig
from skewlens.replay.driver import build_effects
from skewlens.replay.scale import scale_run
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.summary import summarize

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LAUNCHER = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node={{nproc}}"
STEPS = "1:1:3"  # capture window: wait, warm-up, active
TARGET_S = 60.0


def launcher_cmd(launcher: str, nproc: int) -> list[str]:
    return [a.replace("{nproc}", str(nproc)) for a in shlex.split(launcher)]


def capture(out: Path, nproc: int, launcher: str, script: Path, steps: int) -> Path:
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--level", "collectives",
        "--steps", STEPS, "--", *launcher_cmd(launcher, nproc), str(script), "--steps", str(steps),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=1800)
    return out


def measure_ms(tmp: Path, nproc: int, launcher: str, script: Path, steps: int) -> float:
    """Median step of rank 0 (after two warm-up steps) of a real run of ``nproc`` ranks, ms."""
    out = tmp / f"steps-{nproc}.json"
    cmd = [*launcher_cmd(launcher, nproc), str(script), "--steps", str(steps), "--step-times-out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=1800)
    step_ns = json.loads(out.read_text())["step_ns"][2:]
    return statistics.median(step_ns) / 1e6


def replay_config(topology: str, overrides: list[str], *extra: str) -> ReplayConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="replay",
            overrides=["trace=-", "out=-", "comm_mode=model", f"topology={topology}", *overrides, *extra],
        )
    return to_config(cfg)


def predicted_ms(run: RunTrace, n: int, cfg: ReplayConfig) -> float:
    """Median replayed step (step mark to step mark, as the recorded ones) of ``run`` scaled to ``n``, ms."""
    scaled = scale_run(run, n) if n != run.world_size else run
    return statistics.median(s.step_time_ns for s in summarize(scaled, replay(scaled, cfg))) / 1e6


def replay(run: RunTrace, cfg: ReplayConfig) -> SimResult:
    """``run`` replayed with ``cfg``'s topology, algorithm and slowdowns, transfers by the model."""
    return simulate(
        run,
        topology=cfg.topology.to_topology(),
        comm_mode="model",
        algorithm=cfg.topology.algorithm,
        effects=build_effects(cfg),
    )


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def part1(args: argparse.Namespace, tmp: Path) -> None:
    trace = Path(args.trace) if args.trace else None
    if trace is None:
        print(f"capturing {args.script} on 4 ranks ...", flush=True)
        trace = capture(tmp / "cap4", 4, args.launcher, Path(args.script), steps=7)
    cfg = replay_config(
        args.topology,
        args.override,
        "slowdown=straggler",
        f"slowdown.rank={args.slow_rank}",
        f"slowdown.factor={args.factor}",
    )
    t0 = time.perf_counter()
    run = load_run(trace)
    t1 = time.perf_counter()
    scaled = scale_run(run, args.dp)
    t2 = time.perf_counter()
    sim = replay(scaled, cfg)
    t3 = time.perf_counter()
    summary = summarize(scaled, sim)
    t4 = time.perf_counter()
    wait: dict[int, int] = {}
    for s in summary:
        wait[s.rank] = wait.get(s.rank, 0) + s.wait_ns
    held_up_by = min(wait, key=lambda r: wait[r])
    nodes = sum(len(rt) for rt in run.ranks.values())
    print(
        f"{trace}: {run.world_size} ranks, {nodes} nodes -> scale.dp={args.dp}: {scaled.world_size} ranks, "
        f"{len(scaled.collectives)} collectives of {len(scaled.collectives[0].ranks)} members"
    )
    print(f"  {scaled.manifest.notes['scale']}")
    print(
        f"  load {t1 - t0:.2f} s, scale {t2 - t1:.2f} s, simulate {t3 - t2:.2f} s, summary {t4 - t3:.2f} s: "
        f"{t4 - t0:.1f} s in all (target < {TARGET_S:.0f} s: {'ok' if t4 - t0 < TARGET_S else 'MISSED'}); "
        f"peak RSS {peak_rss_mib():.0f} MiB"
    )
    steps = sorted({s.step for s in summary})
    print(f"  replayed step times (ms): {[round(sim.step_time_ns(k) / 1e6, 3) for k in steps]}")
    verdict = "ok" if held_up_by == args.slow_rank else f"EXPECTED rank {args.slow_rank}"
    print(
        f"  the ranks waited least for rank {held_up_by} (its wait {wait[held_up_by] / 1e6:.3f} ms, median "
        f"of the others {statistics.median(w for r, w in wait.items() if r != held_up_by) / 1e6:.3f} ms): "
        f"{verdict}"
    )


def part2(args: argparse.Namespace, tmp: Path) -> None:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    script = Path(args.script)
    print(f"capturing {script} on {sizes[0]} ranks ({args.launcher}) ...", flush=True)
    run = load_run(capture(tmp / f"cap{sizes[0]}", sizes[0], args.launcher, script, steps=7))
    cfg = replay_config(args.topology, args.override)
    print(f"{'ranks':>6} {'predicted ms':>13} {'measured ms':>12} {'error':>8}")
    for n in sizes:
        pred = predicted_ms(run, n, cfg)
        meas = measure_ms(tmp, n, args.launcher, script, steps=args.measure_steps)
        print(f"{n:>6} {pred:>13.3f} {meas:>12.3f} {(pred - meas) / meas:>+8.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trace", default="", help="a run for part 1 (default: capture --script, 4 ranks)")
    ap.add_argument("--dp", type=int, default=1024)
    ap.add_argument("--slow-rank", type=int, default=777)
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--sizes", default="", help="part 2: comma-separated rank counts, e.g. 2,4,8")
    ap.add_argument("--launcher", default=DEFAULT_LAUNCHER, help="command before the script; {nproc} = ranks")
    ap.add_argument("--script", default=str(ROOT / "examples" / "ddp_accum.py"))
    ap.add_argument("--measure-steps", type=int, default=12)
    ap.add_argument("--topology", default="switch", help="an entry of conf/topology/")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="skl-scale-") as d:
        part1(args, Path(d))
        if args.sizes:
            part2(args, Path(d))


if __name__ == "__main__":
    main()
