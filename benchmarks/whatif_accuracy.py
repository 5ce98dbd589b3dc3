"""What-if accuracy: the simulated step time of a straggler run "had rank 2 run like the median
rank" against real runs of the example without the straggler.

    .venv/bin/python benchmarks/whatif_accuracy.py [--trios 3] [--workload train]

Each trio captures (ops level, 4 gloo ranks under torchrun) a run without the straggler, one with
``--straggler-rank 2 --straggler-ms 40`` and another without; the reference is the median step time of
the two clean runs, the what-if the median of blame's per-step what-if for rank 2. Prints the error of
each trio and of the medians over all trios (target: within 10%), and how long rank 2's peers waited for
it at its first collective of each step (median over the steps of the longest peer wait; injected: 40 ms)
and in how many steps rank 2 is the top straggler (target: >= 95%).

Forward, the other way round: each clean run replayed with a ``STRAGGLER_MS`` stall on the straggler rank
before every step (``slowdown=stall slowdown.entries.0.every_step=true``, the injected compute as a wait
before the step's first node) against the straggler run's median step time, per trio and as the median
over trios. Each trio also prints how far its two clean runs' medians are apart: the noise that neither
prediction can be judged more finely than.

``--workload NAME`` measures another bundled example of ``skewlens demo --workload`` instead of
``examples/train.py`` (the default, ``train``, is the above), on that workload's ranks with the straggler
on its rank (``skewlens.cli.demo.WORKLOADS``: rank 1 of 2, of 4 for the 2-D mesh).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from skewlens.analysis import AnalysisResult, analyze_run
from skewlens.analysis.index import build_index
from skewlens.cli.demo import WORKLOADS, Workload, workload
from skewlens.profiler.store import load_run
from skewlens.replay.simulate import simulate, step_times_from_spans
from skewlens.replay.slowdown import Slowdown, SlowdownModel

ROOT = Path(__file__).resolve().parents[1]
STRAGGLER_MS = 40.0


def capture(out: Path, work: Workload, *extra: str) -> Path:
    torchrun = Path(sys.executable).parent / "torchrun"
    example = ROOT / "examples" / work.script
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--level", "ops", "--steps", "1:1:10",
        "--", str(torchrun), "--standalone", "--nproc-per-node", str(work.nproc), str(example), *work.args,
        "--steps", "12", *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    return out


def step_times(run_dir: Path) -> list[int]:
    return list(step_times_from_spans(build_index(load_run(run_dir)).step_spans).values())


def forward_ns(run_dir: Path, straggler: int) -> float:
    """Median step time of ``run_dir`` replayed with a ``STRAGGLER_MS`` stall on ``straggler`` before every
    step, measured as :func:`step_times` measures a run."""
    stall = Slowdown(kind="stall", ranks=(straggler,), every_step=True, delay_ns=round(STRAGGLER_MS * 1e6))
    res = simulate(load_run(run_dir), effects=SlowdownModel([stall]))
    return statistics.median(res.step_times().values())


def peer_waits_ms(res: AnalysisResult, straggler: int) -> list[float]:
    """Per step, the longest wait of a peer at the straggler's first collective of the step, ms (a run
    without collectives, a pipeline: at any of its send/recv pairs of the step, the longest)."""
    kind = "collective" if any(e.kind == "collective" for e in res.skew.events) else "p2p"
    firsts: dict[int, float] = {}
    for e in res.skew.events:  # in order of last arrival
        if e.kind != kind or straggler not in e.ranks or (kind == "collective" and e.step in firsts):
            continue
        wait = max(w for r, w in zip(e.ranks, e.wait_ns.tolist(), strict=True) if r != straggler) / 1e6
        firsts[e.step] = max(wait, firsts.get(e.step, 0.0))
    return list(firsts.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trios", type=int, default=3)
    ap.add_argument(
        "--workload", default="train", help=f"bundled example (default train): {', '.join(WORKLOADS)}"
    )
    args = ap.parse_args()
    work = workload(args.workload)
    straggler = work.straggler_rank
    whatifs, refs, forwards, measureds = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="skl-whatif-") as tmp:
        for k in range(args.trios):
            d = Path(tmp) / f"trio{k}"
            before = capture(d / "clean_before", work)
            strag = capture(
                d / "straggler", work, "--straggler-rank", str(straggler), "--straggler-ms", str(STRAGGLER_MS)
            )
            after = capture(d / "clean_after", work)
            res = analyze_run(load_run(strag))
            assert res.blame is not None
            whatif = statistics.median(res.blame.whatif_step_ns[straggler].values())
            waits = peer_waits_ms(res, straggler) or [float("nan")]
            tops = res.top_straggler_by_step()
            on_top = sum(1 for r in tops.values() if r == straggler)
            measured = statistics.median(step_times_from_spans(res.index.step_spans).values())
            ref = statistics.median(step_times(before) + step_times(after))
            clean = [statistics.median(step_times(d)) for d in (before, after)]
            forward = statistics.median(forward_ns(d, straggler) for d in (before, after))
            whatifs.append(whatif)
            refs.append(ref)
            forwards.append(forward)
            measureds.append(measured)
            print(
                f"trio {k}: straggler run {measured / 1e6:.1f} ms/step, "
                f"what-if without it {whatif / 1e6:.1f} ms, "
                f"real runs without it {ref / 1e6:.1f} ms -> error {whatif / ref - 1:+.1%}; "
                f"clean runs replayed with the stall {forward / 1e6:.1f} ms -> error "
                f"{forward / measured - 1:+.1%}; clean runs {clean[0] / 1e6:.1f} and {clean[1] / 1e6:.1f} ms "
                f"({max(clean) / min(clean) - 1:+.1%} apart); "
                f"peers waited {statistics.median(waits):.1f} ms for rank {straggler} "
                f"(median of {len(waits)} steps), top straggler in {on_top} of {len(tops)} steps"
            )
    w, r = statistics.median(whatifs), statistics.median(refs)
    f, m = statistics.median(forwards), statistics.median(measureds)
    print(
        f"median over {args.trios} trios: what-if {w / 1e6:.1f} ms vs real {r / 1e6:.1f} ms "
        f"-> error {w / r - 1:+.1%} (target within 10%); forward {f / 1e6:.1f} ms vs the straggler runs' "
        f"{m / 1e6:.1f} ms -> error {f / m - 1:+.1%}"
    )


if __name__ == "__main__":
    main()
