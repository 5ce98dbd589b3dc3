"""A slowdown never makes a replay finish sooner: over small generated runs (seeded), slower compute, a
slower GPU, a slower link or a stall never shortens the makespan, never moves a rank's step end earlier,
never shortens a rank's steps up to any step (its step marks, as ``summary.parquet`` times them) nor the
run's (:meth:`SimResult.step_times`, as the analyses and blame time them), and never makes a step negative.

One step alone may still shorten where a delay landed in the step before it and the step had slack to
absorb it (docs/replay.md, "Steps under a what-if are timed mark to mark"): what is checked is each step's
completion, from the window's start.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.summary import replayed_step_marks, summarize

US = 1_000
SEEDS = range(16)  # even: host-only ranks; odd: with a GPU stream


def _generated_run(seed: int, path: Path) -> RunTrace:
    """2 ranks, 2 or 3 steps of host ops (some launching a kernel on stream 7 on a GPU run), an all_reduce
    and, in some steps, a send/recv; on some ranks, work before the first step (in no step)."""
    rnd = random.Random(seed)
    gpu = seed % 2 == 1
    steps = rnd.randint(2, 3)
    p2p = [rnd.random() < 0.5 for _ in range(steps)]
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        t = rnd.randint(0, 300) * US
        if rnd.random() < 0.5:
            load = rb.compute("load", rnd.randint(50, 300) * US, start_ns=t)
            if gpu:
                dur = rnd.randint(50, 900) * US
                rb.compute("pre_k", dur, start_ns=t + 100 * US, stream=7, deps=(load,), launch_ns=t + 10 * US)
            t += rnd.randint(310, 400) * US
        for s in range(steps):
            rb.step(s)
            kernel_end = 0
            for j in range(rnd.randint(1, 3)):
                dur = rnd.randint(100, 1000) * US
                op = rb.compute(f"op{j}", dur, start_ns=t)
                if gpu and rnd.random() < 0.7:
                    ks, kd = max(t + 20 * US, kernel_end), rnd.randint(50, 1500) * US
                    rb.compute(f"k{j}", kd, start_ns=ks, stream=7, deps=(op,), launch_ns=t + 10 * US)
                    kernel_end = ks + kd
                t += dur + rnd.randint(0, 100) * US
            rb.collective(CommType.ALL_REDUCE, 1 << 20, rnd.randint(100, 600) * US, start_ns=t)
            t += 700 * US
            if p2p[s]:
                if r == 0:
                    rb.send(1, 1 << 16, 200 * US, start_ns=t)
                else:
                    rb.recv(0, 1 << 16, 200 * US, start_ns=t)
                t += 300 * US
            t += rnd.randint(0, 500) * US
    return load_run(b.write(path))


def _whatifs(gpu: bool) -> list[Slowdown]:
    out = [Slowdown(kind="network", links=((0, 1),), factor=0.5, latency_ns=50 * US)]
    for r in (0, 1):
        out.append(Slowdown(kind="compute", ranks=(r,), factor=2.0))
        out.extend(Slowdown(kind="stall", ranks=(r,), step=k, delay_ns=400 * US) for k in (0, 1))
        if gpu:
            out.append(Slowdown(kind="compute", ranks=(r,), factor=3.0, device="gpu"))
    return out


def _completions(run: RunTrace, res: SimResult) -> tuple[dict[tuple[int, int], tuple[int, int]], list[int]]:
    """Per (rank, step): (its replayed end mark, its steps' time from its first step's start to that end,
    from the summary's step times); and the run's steps' times added up to each step."""
    marks = replayed_step_marks(run, res)
    rows = sorted((s.rank, s.step, s.step_time_ns) for s in summarize(run, res))
    assert min(t for _r, _k, t in rows) >= 0
    ranks: dict[tuple[int, int], tuple[int, int]] = {}
    done: dict[int, int] = {}
    for r, k, t in rows:
        done[r] = done.get(r, 0) + t
        ranks[(r, k)] = (marks[(r, k)][3], done[r])
    total, run_steps = 0, []
    for _k, t in sorted(res.step_times().items()):
        total += t
        run_steps.append(total)
    return ranks, run_steps


@pytest.mark.parametrize("seed", SEEDS)
def test_a_slowdown_never_shortens_the_makespan_nor_any_ranks_or_the_runs_steps_up_to_any_step(
    tmp_path: Path, seed: int
) -> None:
    run = _generated_run(seed, tmp_path / "run")
    base = simulate(run)
    base_ranks, base_steps = _completions(run, base)
    for item in _whatifs(gpu=seed % 2 == 1):
        res = simulate(run, effects=SlowdownModel([item]))
        ranks, steps = _completions(run, res)
        assert res.makespan_ns >= base.makespan_ns, item
        shorter = {
            k: (base_ranks[k], v)
            for k, v in ranks.items()
            if v[0] < base_ranks[k][0] or v[1] < base_ranks[k][1]
        }
        assert not shorter, item
        assert all(a >= b for a, b in zip(steps, base_steps, strict=True)), (item, base_steps, steps)
