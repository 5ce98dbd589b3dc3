"""A data loader's stall on one rank at one step of a real capture (2 gloo ranks, DDP, ``ops``), taken away by
the ``host_idle`` replay: ``skewlens analyze`` names the rank, the step and the untraced host time with the
replay that removes it, and ``skewlens replay slowdown=host_idle slowdown.factor=0`` gives the step back
(0.5: half of it).

The script's loader is a generator of its own (not a ``torch.utils.data.DataLoader``, whose fetch Kineto
records as its ``enumerate(DataLoader)#...`` scope: compute, which an ``op`` item scales); on rank 1 it
sleeps ``STALL_MS`` before the batch of step ``STALL_STEP`` and writes when it slept to a side file.
Before, no replay could shorten untraced host time: ``kind: host_idle`` was refused.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from capture_helpers import stalled_ddp_script, stalled_event
from test_host_idle import printed_stragglers

from skewlens.analysis.records import CauseKind
from skewlens.cli import main as skewlens_main
from skewlens.replay.execution import execution_model, host_idle_rows
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

pytestmark = pytest.mark.slow

STALL_STEP, STALL_MS = 4, 200
#: What a shared CPU's noise may add to or take from a step (as ``test_one_off_stall.py`` allows).
NOISE_NS = 15_000_000

SCRIPT = stalled_ddp_script(f"""
def loader():
    global side
    for step in range(8):
        if rank == 1 and step == {STALL_STEP}:
            t0 = time.time_ns()
            time.sleep({STALL_MS} / 1e3)
            side = {{"start_ns": t0, "end_ns": time.time_ns()}}
        yield torch.randn(16, 64)

for x in loader():
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
""")


def test_a_loader_stall_is_named_with_the_host_idle_replay_which_gives_the_step_back(tmp_path: Path) -> None:
    run_dir, stall_ns, run, result, at = stalled_event(tmp_path, SCRIPT, STALL_STEP)
    assert (at.late_rank, at.blamed_rank, at.cause.kind) == (1, 1, CauseKind.HOST_GAP)
    text = " ".join(printed_stragglers(result, 400).split())  # the table and the replays under it
    assert f"slowdown=host_idle slowdown.rank=1 slowdown.step={STALL_STEP} slowdown.factor=0" in text
    # rank 1's untraced host time in the step: the sleep and the step's usual Python between operators
    rt, m = run.ranks[1], execution_model(run).ranks[1]
    gaps, untraced = host_idle_rows(rt, m)
    at_step = rt.step == STALL_STEP
    idle_ns = int(m.gap_ns[gaps & at_step].sum() + m.work_ns[untraced & at_step].sum())
    assert stall_ns <= idle_ns <= stall_ns + NOISE_NS
    # the user's command: the step without it (rank 0 had waited the whole stall, so nothing absorbs it)
    out = tmp_path / "replay"
    args = [f"trace={run_dir}", f"out={out}", "slowdown=host_idle", "slowdown.rank=1", "slowdown.factor=0"]
    assert skewlens_main(["replay", *args, f"slowdown.step={STALL_STEP}", "progress=false"]) == 0
    rows = pq.read_table(out / "summary.parquet").to_pylist()
    (row,) = [r for r in rows if (r["rank"], r["step"]) == (1, STALL_STEP)]
    assert row["recorded_step_ns"] - row["step_time_ns"] == pytest.approx(idle_ns, abs=NOISE_NS)
    assert all(r["step_time_ns"] == r["recorded_step_ns"] for r in rows if r["step"] < STALL_STEP)
    # half of it gives back half
    base = simulate(run).step_times()
    half = Slowdown(kind="host_idle", ranks=(1,), factor=0.5, first_step=STALL_STEP, last_step=STALL_STEP)
    halved = simulate(run, effects=SlowdownModel([half])).step_times()
    assert base[STALL_STEP] - halved[STALL_STEP] == pytest.approx(idle_ns / 2, abs=NOISE_NS)
