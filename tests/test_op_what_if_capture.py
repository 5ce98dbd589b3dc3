"""A real ``DataLoader``'s stall on one rank at one step of a capture (2 gloo ranks, DDP, ``ops``), taken
away by the ``op`` replay that ``skewlens analyze`` names: Kineto records the fetch as its
``enumerate(DataLoader)#...`` scope, so analyze calls it compute ("compute grew: enumerate(DataLoader)#...")
and ``host_idle`` does not touch it; an ``op`` item of factor 0 on the scope gives the step back.

Before, an ``op`` item refused factor 0 and analyze named no replay for the stall.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from capture_helpers import stalled_ddp_script, stalled_event
from test_host_idle import printed_stragglers

from skewlens.analysis.records import CauseKind
from skewlens.cli import main as skewlens_main

pytestmark = pytest.mark.slow

STALL_STEP, STALL_MS = 4, 200
SCOPE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
#: What a shared CPU's noise may add to or take from a step (as ``test_one_off_stall.py`` allows).
NOISE_NS = 15_000_000

SCRIPT = stalled_ddp_script(f"""
from torch.utils.data import DataLoader, Dataset

class Batches(Dataset):
    def __len__(self):
        return 8 * 16

    def __getitem__(self, i):
        global side
        if rank == 1 and i == {STALL_STEP} * 16:
            t0 = time.time_ns()
            time.sleep({STALL_MS} / 1e3)
            side = {{"start_ns": t0, "end_ns": time.time_ns()}}
        return torch.randn(64)

for x in DataLoader(Batches(), batch_size=16):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
""")


def test_a_dataloader_stall_is_named_with_the_op_replay_which_gives_the_step_back(tmp_path: Path) -> None:
    run_dir, stall_ns, run, result, at = stalled_event(tmp_path, SCRIPT, STALL_STEP)
    assert (at.late_rank, at.blamed_rank, at.cause.kind, at.cause.op) == (1, 1, CauseKind.COMPUTE, SCOPE)
    text = " ".join(printed_stragglers(result, 400).split())  # the table and the replays under it
    hinted = (
        f"'slowdown.entries=[{{kind:op,ranks:[1],first_step:{STALL_STEP},last_step:{STALL_STEP},factor:0,"
        f'pattern:"{SCOPE}"}}]\''
    )
    assert hinted in text
    # the user's command: the step without the scope (rank 0 had waited the whole stall, so nothing absorbs
    # it); the scope held the stall and the batch's own fetch
    rt = run.ranks[1]
    (scope_row,) = [
        i for i in range(len(rt)) if rt.names[rt.name_idx[i]] == SCOPE and rt.step[i] == STALL_STEP
    ]
    scope_ns = int(rt.dur_ns[scope_row])
    assert stall_ns <= scope_ns <= stall_ns + NOISE_NS
    out = tmp_path / "replay"
    assert (
        skewlens_main(["replay", f"trace={run_dir}", f"out={out}", hinted.strip("'"), "progress=false"]) == 0
    )
    rows = pq.read_table(out / "summary.parquet").to_pylist()
    (row,) = [r for r in rows if (r["rank"], r["step"]) == (1, STALL_STEP)]
    assert row["recorded_step_ns"] - row["step_time_ns"] == pytest.approx(scope_ns, abs=NOISE_NS)
    assert all(r["step_time_ns"] == r["recorded_step_ns"] for r in rows if r["step"] < STALL_STEP)
