"""A DDP training step with many small collectives, for capture-overhead and duration-bias audits.

Each step: ``--layers`` Linear layers under DDP with one bucket per layer (DDP's C++ reducer issues
``--layers`` all_reduces), then ``--collectives`` pairs of (a small matmul, a 1 KiB ``all_reduce``), then
``optimizer.step()``. Around each matmul and each explicit all_reduce the script reads
``time.perf_counter_ns`` itself, so that the durations a capture records can be set against an
independent measure of the same calls.

``--step-times-out FILE`` (``{rank}`` replaced): ``{"step_ns", "step_cpu_ns", "mm_ns", "ar_ns"}`` where
``mm_ns[s]`` / ``ar_ns[s]`` are step ``s``'s per-call durations (ns) of the matmuls and the all_reduces.

``--compare ROUNDS`` runs it under torchrun (2 ranks) ROUNDS times without skewlens and at each level, in
a random order per round, window ``1:1:12``, and prints per level the median over rounds of the process
CPU time per step (all threads, mean of the ranks, recorded steps but the last) against the round's run
without skewlens, with the range; and how much shorter each recorded explicit all_reduce is than the
script's own timing of the same call (the hooks' time, which the trace puts in the gap after the call).

    torchrun --standalone --nproc-per-node 2 benchmarks/many_collectives.py --steps 24 --collectives 100
    .venv/bin/python benchmarks/many_collectives.py --compare 8
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--collectives", type=int, default=100, help="explicit all_reduces per step")
    p.add_argument("--layers", type=int, default=8, help="Linear layers (one DDP bucket each)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--step-times-out", default="")
    p.add_argument("--compare", type=int, default=0, metavar="ROUNDS", help="A/B rounds (see above)")
    args = p.parse_args()
    if args.compare:
        compare(args.compare, args.collectives)
        return 0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    h = args.hidden
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(h, h), torch.nn.ReLU()]
    bucket_mb = (h * h + h) * 4 / 2**20  # one layer's gradients per bucket
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    a, b, c = torch.randn(64, h), torch.randn(h, h), torch.empty(64, h)
    small = torch.ones(256)
    perf, cpu = time.perf_counter_ns, time.process_time_ns
    step_ns: list[int] = []
    step_cpu_ns: list[int] = []
    mm_ns: list[list[int]] = []
    ar_ns: list[list[int]] = []
    for _ in range(args.steps):
        t0, c0 = perf(), cpu()
        mm: list[int] = []
        ar: list[int] = []
        loss = model(torch.randn(64, h)).square().mean()
        loss.backward()
        with torch.no_grad():
            for _ in range(args.collectives):
                s = perf()
                torch.mm(a, b, out=c)
                m = perf()
                dist.all_reduce(small)
                e = perf()
                mm.append(m - s)
                ar.append(e - m)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_ns.append(perf() - t0)
        step_cpu_ns.append(cpu() - c0)
        mm_ns.append(mm)
        ar_ns.append(ar)
    if args.step_times_out:
        out = Path(args.step_times_out.replace("{rank}", str(rank)))
        tmp = out.with_name(f".{out.name}.tmp")
        data = {"step_ns": step_ns, "step_cpu_ns": step_cpu_ns, "mm_ns": mm_ns, "ar_ns": ar_ns}
        tmp.write_text(json.dumps(data))
        tmp.replace(out)
    dist.destroy_process_group()
    return 0


LEVELS = ("collectives", "ops", "full")
ACTIVE = 12


def _run(work: Path, tag: str, level: str | None, collectives: int) -> list[dict[str, Any]]:
    times = work / f"{tag}-{{rank}}.json"
    train = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
        "--steps", str(ACTIVE + 3), "--collectives", str(collectives), "--step-times-out", str(times),
    ]  # fmt: skip
    cmd = train if level is None else [
        sys.executable, "-m", "skewlens", "profile", "--out", str(work / f"{tag}-run"), "--level", level,
        "--steps", f"1:1:{ACTIVE}", "--", *train,
    ]  # fmt: skip
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr[-2000:]}")
    return [json.loads(Path(str(times).replace("{rank}", str(r))).read_text()) for r in range(2)]


def _cpu_ms(per_rank: list[dict[str, Any]]) -> float:
    """Median over the recorded steps but the last (it saves) of the ranks' mean CPU ms per step."""
    steps = range(2, 2 + ACTIVE - 1)
    return statistics.median(sum(r["step_cpu_ns"][s] for r in per_rank) / 2e6 for s in steps)


def _hook_gap_us(run: Path, per_rank: list[dict[str, Any]]) -> list[float]:
    """Per rank and recorded step: median of (script's time of an explicit all_reduce - recorded one)."""
    from skewlens.profiler.chakra_io import iter_nodes, node_attrs

    out = []
    for r, times in enumerate(per_rank):
        rec: dict[int, list[tuple[int, int]]] = {}
        for _, n in iter_nodes(run / f"rank-{r}.et"):
            a = node_attrs(n)
            if n.name == "c10d::allreduce_" and a.get("comm_size") == 1024 and a.get("stream") == 0:
                rec.setdefault(a["skl_step"], []).append((a["skl_start_ns"], a["skl_dur_ns"]))
        for s, calls in rec.items():
            if len(calls) == len(times["ar_ns"][s]):
                diffs = [t - d for t, (_, d) in zip(times["ar_ns"][s], sorted(calls), strict=True)]
                out.append(statistics.median(diffs) / 1e3)
    return out


def compare(rounds: int, collectives: int) -> None:
    ratios: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    hooks: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(rounds):
            order: list[str | None] = [None, *LEVELS]
            random.shuffle(order)
            cpu = {}
            for level in order:
                tag = f"{level or 'none'}-{i}"
                per_rank = _run(work, tag, level, collectives)
                cpu[level] = _cpu_ms(per_rank)
                if level is not None:
                    hooks[level] += _hook_gap_us(work / f"{tag}-run", per_rank)
            for lv in LEVELS:
                ratios[lv].append(cpu[lv] / cpu[None])
            print(f"round {i}: CPU ms/step " + ", ".join(f"{k or 'none'} {v:.1f}" for k, v in cpu.items()))
    for lv in LEVELS:
        r, h = sorted(ratios[lv]), sorted(hooks[lv])
        print(
            f"{lv}: CPU per step {statistics.median(r):.3f}x (rounds {r[0]:.3f}-{r[-1]:.3f}); recorded "
            f"all_reduce shorter than the script's timing by {statistics.median(h):.1f} µs "
            f"(quartiles {h[len(h) // 4]:.1f}-{h[3 * len(h) // 4]:.1f})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
