"""What-if accuracy: the simulated step time of a straggler run "had rank 2 run like the median
rank" against real runs of the example without the straggler.

    .venv/bin/python benchmarks/whatif_accuracy.py [--trios 3]

Each trio captures (ops level, 4 gloo ranks under torchrun) a run without the straggler, one with
``--straggler-rank 2 --straggler-ms 40`` and another without; the reference is the median step time of
the two clean runs, the what-if the median of blame's per-step what-if for rank 2. Prints the error of
each trio and of the medians over all trios (target: within 10%).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from skewlens.analysis import analyze_run
from skewlens.analysis.blame import step_times_from_spans
from skewlens.analysis.index import build_index
from skewlens.profiler.store import load_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"
STRAGGLER, STRAGGLER_MS = 2, 40.0


def capture(out: Path, *extra: str) -> Path:
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--level", "ops", "--steps", "1:1:10",
        "--", str(torchrun), "--standalone", "--nproc-per-node", "4", str(EXAMPLE), "--steps", "12", *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    return out


def step_times(run_dir: Path) -> list[int]:
    return list(step_times_from_spans(build_index(load_run(run_dir)).step_spans).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trios", type=int, default=3)
    args = ap.parse_args()
    whatifs, refs = [], []
    with tempfile.TemporaryDirectory(prefix="skl-whatif-") as tmp:
        for k in range(args.trios):
            d = Path(tmp) / f"trio{k}"
            before = capture(d / "clean_before")
            strag = capture(
                d / "straggler", "--straggler-rank", str(STRAGGLER), "--straggler-ms", str(STRAGGLER_MS)
            )
            after = capture(d / "clean_after")
            res = analyze_run(load_run(strag))
            assert res.blame is not None
            whatif = statistics.median(res.blame.whatif_step_ns[STRAGGLER].values())
            measured = statistics.median(step_times_from_spans(res.index.step_spans).values())
            ref = statistics.median(step_times(before) + step_times(after))
            whatifs.append(whatif)
            refs.append(ref)
            print(
                f"trio {k}: straggler run {measured / 1e6:.1f} ms/step, "
                f"what-if without it {whatif / 1e6:.1f} ms, "
                f"real runs without it {ref / 1e6:.1f} ms -> error {whatif / ref - 1:+.1%}"
            )
    w, r = statistics.median(whatifs), statistics.median(refs)
    print(
        f"median over {args.trios} trios: what-if {w / 1e6:.1f} ms vs real {r / 1e6:.1f} ms "
        f"-> error {w / r - 1:+.1%} (target within 10%)"
    )


if __name__ == "__main__":
    main()
