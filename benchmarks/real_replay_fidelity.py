"""Real-replay fidelity: how close real replays on gloo processes come to the recorded and simulated times.

    .venv/bin/python benchmarks/real_replay_fidelity.py [--reps 2] [--no-capture]

Per repetition, on a synthetic 4-rank run (8 steps of ~300 ms compute, a world all_reduce, a pair
all_gather, a send/recv):

* compute overshoot: replayed minus recorded duration of every compute node (workers sleep then spin to
  a deadline, so never shorter), median and largest;
* slowdown: per rank, the median step time of a replay with rank 2's compute 1.5 times as long minus that
  of a plain replay, against the simulator's delta on the plain replay's own record (target: within 10%);

and (unless ``--no-capture``) the example captured on 4 gloo ranks under ``skewlens profile`` and replayed:
per rank, the median replayed step time against the captured one (target: within 10%), and the median
step time of the simulator's unmodified replay of the capture against it too.

The tests check what cannot vary with the machine's load (the plans the workers get, that they never
start early or compute short); these are the figures that do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from skewlens.profiler.store import load_run
from skewlens.profiler.vocab import NodeType
from skewlens.replay.config import RealConfig
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.real.api import real_replay
from skewlens.replay.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"
sys.path.insert(0, str(ROOT / "tests"))  # the run the real-replay tests use
from replay_workloads import MS, RankFactor, four_rank_run  # noqa: E402

CFG = RealConfig(timeout_s=30.0)


def median_steps(spans: dict[tuple[int, int], tuple[int, int]]) -> dict[int, float]:
    by_rank: dict[int, list[int]] = {}
    for (r, _s), (a, b) in spans.items():
        by_rank.setdefault(r, []).append(b - a)
    return {r: statistics.median(v) for r, v in by_rank.items()}


def synthetic(tmp: Path, rep: int) -> None:
    orig = four_rank_run(tmp / f"orig{rep}")
    base = real_replay(run_dir=orig, out_dir=tmp / f"base{rep}", effects=NO_EFFECTS, cfg=CFG)
    record = load_run(base.out_dir / "real" / "replayed")
    source = load_run(orig)
    over = []
    for r, rt in source.ranks.items():
        comp = rt.node_type == int(NodeType.COMP)
        over += (record.ranks[r].dur_ns[comp] - rt.dur_ns[comp]).tolist()
    print(
        f"rep {rep}: compute overshoot over {len(over)} nodes: median {statistics.median(over) / MS:.2f} ms, "
        f"largest {max(over) / MS:.2f} ms"
    )
    slow = RankFactor(2, 1.5)
    sim = median_steps(simulate(record, effects=slow).step_spans())
    sim_base = median_steps(simulate(record).step_spans())
    slowed = real_replay(run_dir=orig, out_dir=tmp / f"slow{rep}", effects=slow, cfg=CFG)
    base_ns = {b.rank: statistics.median(b.replay_ns) for b in base.ranks}
    for r in slowed.ranks:
        real_d = statistics.median(r.replay_ns) - base_ns[r.rank]
        sim_d = sim[r.rank] - sim_base[r.rank]
        print(
            f"rep {rep}: slowdown rank {r.rank}: real +{real_d / MS:.1f} ms, simulated +{sim_d / MS:.1f} ms "
            f"({(real_d - sim_d) / sim_d:+.1%})"
        )


def captured(tmp: Path, rep: int) -> None:
    run = tmp / f"captured{rep}"
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(run), "--level", "collectives", "--steps",
        "1:1:8", "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        str(EXAMPLE), "--steps", "10",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=600)
    result = real_replay(run_dir=run, out_dir=tmp / f"captured-out{rep}", effects=NO_EFFECTS, cfg=CFG)
    sim = median_steps(simulate(load_run(run)).step_spans())
    for r in result.ranks:
        orig, rep_ns = statistics.median(r.original_ns), statistics.median(r.replay_ns)
        print(
            f"rep {rep}: captured rank {r.rank}: step {orig / MS:.1f} ms, replayed {rep_ns / MS:.1f} ms "
            f"({(rep_ns - orig) / orig:+.1%}), simulated {sim[r.rank] / MS:.1f} ms "
            f"({(sim[r.rank] - orig) / orig:+.1%})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-capture", action="store_true", help="skip the captured example")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="skl-real-fidelity-") as tmp:
        for rep in range(args.reps):
            synthetic(Path(tmp), rep)
            if not args.no_capture:
                captured(Path(tmp), rep)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
