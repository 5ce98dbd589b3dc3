"""DDP with uneven inputs under ``torch.distributed.algorithms.Join`` and a ``ZeroRedundancyOptimizer``,
captured end to end on 2 gloo ranks: rank 1 runs out of batches first and its join hooks shadow rank 0's
collectives (DDP's all_reduces, ZeRO's step, whose parameter broadcasts mark its steps), so both ranks
record the same steps and the same collectives in each, with the broadcasts rooted at each shard's owner."""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_helpers import profile_script

from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import CommType

SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
model = DDP(net)
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=1e-3)
with Join([model, opt]):
    for _ in range(6 if rank == 0 else 4):  # rank 1 joins after step 3
        model(torch.randn(4, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_joined_rank_records_the_collectives_it_shadows_in_the_steps_of_the_rank_still_training(
    tmp_path: Path,
) -> None:
    run_dir, res = profile_script(tmp_path, SCRIPT, nproc=2, steps="1:1:4")
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_validated(run_dir)
    assert not run.incomplete_steps and not run.steps_differ
    # ZeRO's greedy partition, largest first: rank 0 owns the 256x64 weight (65,536 B), rank 1 the rest
    # (8,192, 1,024 and 32 B); one broadcast per parameter from its owner, and DDP's one bucket of every
    # gradient
    want_broadcasts = sorted([(65_536, 0), (1_024, 1), (8_192, 1), (32, 1)])
    per_step: dict[int, dict[int, list[tuple[str, int, int]]]] = {}
    for inst in run.collectives:
        members, starts, ends = {}, [], []
        for r, row in zip(inst.ranks, inst.rows, strict=True):
            rt = run.ranks[r]
            root = int(rt.src[row]) if inst.comm_type == CommType.BROADCAST else -1
            members[r] = (int(rt.step[row]), inst.comm_type.name, int(rt.comm_bytes[row]), root)
            starts.append(int(rt.start_ns[row]))
            ends.append(int(rt.start_ns[row] + rt.dur_ns[row]))
        # no member ends before every member has arrived (one host: the clocks agree within µs); before, a
        # bucket all_reduce could take the worker event of the async all_reduce DDP's forward issues under
        # Join and end 4.4 ms before its peer issued it
        assert min(ends) >= max(starts) - 1_000_000, (inst.pg_name, inst.seq)
        assert members[0] == members[1], (inst.pg_name, inst.seq)
        step, kind, nbytes, root = members[0]
        per_step.setdefault(step, {}).setdefault(0, []).append((kind, nbytes, root))
    assert sorted(per_step) == [2, 3, 4, 5]  # steps 4 and 5: rank 1 joined, shadowing
    for step, by_rank in per_step.items():
        calls = by_rank[0]
        assert sorted((b, root) for kind, b, root in calls if kind == "BROADCAST") == want_broadcasts, step
        reduces = sorted(b for kind, b, _ in calls if kind == "ALL_REDUCE")
        assert reduces[-1] == 65_536 + 1_024 + 8_192 + 32, step  # the gradient bucket, on both ranks
