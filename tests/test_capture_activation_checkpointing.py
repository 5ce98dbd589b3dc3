"""Activation checkpointing captured end to end on 2 gloo ranks: DDP over blocks checkpointed with
``torch.utils.checkpoint(use_reentrant=True)``. Each block's backward runs a backward of its own inside
``CheckpointFunctionBackward``, and DDP's reducer finishes from inside the last one, waiting in C++ for the
last bucket's all_reduce: that wait must not be the operator's work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from capture_helpers import profile

from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import NodeType

SCRIPT = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
dist.init_process_group("gloo")
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(lambda y, b=b: torch.relu(b(y)), x, use_reentrant=True)
        return x


model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(6):
    model(torch.randn(32, 256, requires_grad=True)).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddps_wait_for_its_last_bucket_inside_a_reentrant_checkpoints_backward_is_no_operators_work(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = profile(tmp_path / "run", level="ops", steps="1:1:3", script=script)
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_validated(tmp_path / "run")
    holders = []
    for rank, rt in run.ranks.items():
        comm = rt.rows_of_type(NodeType.COMM_COLL)
        comp = rt.rows_of_type(NodeType.COMP)
        comp = comp[rt.stream[comp] == 0]
        for step in np.unique(rt.step[comm]):
            rows = comm[rt.step[comm] == step]
            last = rows[np.argmax(rt.start_ns[rows] + rt.dur_ns[rows])]  # the bucket DDP waits for last
            done = int(rt.start_ns[last] + rt.dur_ns[last])
            holders += [
                (rank, int(step), rt.name(int(i)))
                for i in comp
                if rt.start_ns[i] < done < rt.start_ns[i] + rt.dur_ns[i]
                and "CheckpointFunctionBackward" in rt.name(int(i))
            ]
    # before, the last block's operator held it on every rank and step (8-41 ms of "work" a step)
    assert holders == []
