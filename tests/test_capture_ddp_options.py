"""DDP with a collective inside its backward pass, captured end to end on 2 gloo ranks: SyncBatchNorm's
pattern (a blocking all_reduce issued by an autograd function while DDP's bucket all_reduces, which only
the flight recorder sees, are in flight on the group's other gloo worker thread). Each bucket must keep
its own worker event for its end."""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import CommType, NodeType

SCRIPT = """
import time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class SyncStats(torch.autograd.Function):  # SyncBatchNorm's pattern: a blocking all_reduce in backward
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        stats = g.sum(0)
        dist.all_reduce(stats)
        return g + stats / 1e6


class LateBackward(torch.autograd.Function):  # rank 1 starts its backward 20 ms late
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if rank == 1:
            time.sleep(0.02)
        return g


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))

    def forward(self, x):
        x = SyncStats.apply(self.layers[0](x))
        for layer in self.layers[1:]:
            x = torch.relu(layer(x))
        return LateBackward.apply(x)


model = DDP(Net(), bucket_cap_mb=0.25)  # a bucket a layer
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(12):
    model(torch.randn(8, 256)).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("level", "steps"),
    [("ops", "1:1:3"), ("collectives", "9:1:2")],
    ids=["its-own-events", "quiet-after-step-8"],
)
def test_ddp_buckets_in_flight_during_a_blocking_all_reduce_in_backward_keep_their_own_ends(
    tmp_path: Path, level: str, steps: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = profile(tmp_path / "run", level=level, steps=steps, script=script)
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_validated(tmp_path / "run")
    assert not run.incomplete_steps and not run.steps_differ
    per_step: dict[int, list[tuple[int, int]]] = {}
    for inst in run.collectives:
        starts, ends, kinds = [], [], set()
        for r, row in zip(inst.ranks, inst.rows, strict=True):
            rt = run.ranks[r]
            starts.append(int(rt.start_ns[row]))
            ends.append(int(rt.start_ns[row] + rt.dur_ns[row]))
            assert rt.dur_ns[row] > 0, (r, inst.seq)  # every member has an end
            kinds.add((int(rt.step[row]), int(rt.stream[row]) != 0, int(rt.comm_bytes[row])))
        (kind,) = kinds
        per_step.setdefault(kind[0], []).append(kind[1:])
        assert inst.comm_type == CommType.ALL_REDUCE
        # no member ends before every member has arrived (one host: the clocks agree within µs); before,
        # a bucket whose worker event ran inside the blocking all_reduce took a later bucket's event, and
        # the step's last buckets none (10 nodes without an end at ops, 8 after step 8)
        assert min(ends) >= max(starts) - 1_000_000, (inst.pg_name, inst.seq)
    for step, calls in per_step.items():  # 4 buckets (flight recorder) and the blocking all_reduce (hooks)
        assert sorted(calls) == sorted([(True, 263_168)] * 4 + [(False, 1_024)]), step
    assert all(rt.dur_ns[i] > 0 for rt in run.ranks.values() for i in rt.rows_of_type(NodeType.COMM_COLL))
