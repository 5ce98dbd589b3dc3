"""A one-off stall on one rank at one step of a real capture (2 gloo ranks, DDP, ``ops``): analyze names that
rank for that step, with the stall's size, and no other step; a replay with the stall cut from its node
gives the step back.

The script sleeps ``STALL_MS`` on rank 1 before the forward of step ``STALL_STEP`` (a data loader's stall,
a ``gc.collect()``: untraced host time) and writes when it slept to a side file, which the checks compare
with. Before, the steps after such a stall could each be blamed on it ('host idle/gap +334.0 ms (passed
on by rank 0)' at steps 8-10 after a 333 ms ``gc.collect()`` at step 7), and the stragglers table gave
only its mean per step.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from capture_helpers import profile_stalled, row_holding, stalled_ddp_script
from rich.console import Console

from skewlens.analysis import analyze_run
from skewlens.analysis.records import CauseKind
from skewlens.analysis.render import stragglers_table
from skewlens.profiler.store import load_run
from skewlens.replay.simulate import simulate

pytestmark = pytest.mark.slow

STALL_STEP, STALL_MS = 4, 200

SCRIPT = stalled_ddp_script(f"""
x = torch.randn(16, 64)
for step in range(8):
    if rank == 1 and step == {STALL_STEP}:
        t0 = time.time_ns()
        time.sleep({STALL_MS} / 1e3)
        side = {{"start_ns": t0, "end_ns": time.time_ns()}}
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
""")


def test_a_one_off_stall_is_named_for_its_step_and_rank_with_its_size_and_its_removal_gives_the_step_back(
    tmp_path: Path,
) -> None:
    run_dir, side = profile_stalled(tmp_path, SCRIPT)
    stall_start, stall_end = side["start_ns"], side["end_ns"]
    stall_ns = stall_end - stall_start
    run = load_run(run_dir)
    result = analyze_run(run)
    events = [e for e in result.skew.events if e.kind == "collective"]
    (at,) = [e for e in events if e.step == STALL_STEP]
    assert (at.late_rank, at.blamed_rank, at.cause.kind) == (1, 1, CauseKind.HOST_GAP)
    # what rank 1 idled more than rank 0 before the all_reduce: the sleep, give or take a shared CPU's noise
    assert at.cause.delta_ns == pytest.approx(stall_ns, abs=15_000_000)
    # and where it sat: between the previous step's last op and this step's forward (before, no op named)
    place = "after Optimizer.zero_grad#SGD.zero_grad, before DistributedDataParallel.forward"
    assert at.cause.gap_at == place
    # no other step is blamed on the stall
    assert all(e.cause.delta_ns < stall_ns // 2 for e in events if e.step != STALL_STEP)
    text = " ".join(_render(stragglers_table(result)).split())
    assert (
        f"rank 1's caused wait is uneven over its steps: in step {STALL_STEP} it made its peers wait" in text
    )
    # the replay with the sleep cut from the untraced node that holds it
    rt = run.ranks[1]
    node = row_holding(rt, (stall_start, stall_end))
    assert rt.names[rt.name_idx[node]] == "untraced" and rt.step[node] == STALL_STEP
    dur = np.full(len(rt.start_ns), -1, dtype=np.int64)
    dur[node] = int(rt.dur_ns[node]) - stall_ns
    base = simulate(run).step_times()
    whatif = simulate(run, dur_override={1: dur}).step_times()
    assert {s: t for s, t in whatif.items() if s < STALL_STEP} == {
        s: t for s, t in base.items() if s < STALL_STEP
    }
    # the step takes what the stall added less nothing more: rank 0 had waited the whole stall
    assert base[STALL_STEP] - whatif[STALL_STEP] == pytest.approx(stall_ns, abs=15_000_000)


def _render(renderable: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200).print(renderable)
    return buf.getvalue()
