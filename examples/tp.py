"""Example workload: DTensor tensor parallelism (``parallelize_module``) on a 1-D DeviceMesh.

Run it unchanged under ``torchrun --nproc-per-node 2 examples/tp.py`` (CPU: gloo; GPU: NCCL, chosen from
the device) or as ``python examples/tp.py`` (one rank: a mesh of one, no communication).

The model is ``BLOCKS`` Megatron-style MLP blocks, ``Linear(HIDDEN, FFN)`` -> ReLU -> ``Linear(FFN,
HIDDEN)``, the first ``ColwiseParallel`` and the second ``RowwiseParallel`` on a 1-D mesh of all ranks
(its group is the tp group). The input is the same on every rank (replicated). Each step, on the tp group:

- forward: one ``all_reduce`` per block (the row-parallel output's partial sums), a *functional*
  collective: DTensor issues it and the wait happens inside the op that consumes its result;
- backward: one ``all_reduce`` per block but the first (the column-parallel input's gradient; the first
  block's input needs none);
- then ``optimizer.step()`` on the local shards, which marks the step.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step), and
``--slow-send-rank R --slow-send-ms D``: there is no p2p, so rank R sleeps D ms right before its first
collective of each step (before the forward, whose first block all-reduces).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import MlpBlock, finish, init_distributed, parse, parser, run_steps, train_step
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

BATCH = 64
HIDDEN = 256
FFN = 1024
BLOCKS = 2


def tp_plan() -> dict[str, ParallelStyle]:
    """Column-parallel up projection, row-parallel down projection, in every block."""
    plan: dict[str, ParallelStyle] = {}
    for b in range(BLOCKS):
        plan[f"{b}.up"] = ColwiseParallel()
        plan[f"{b}.down"] = RowwiseParallel()
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(__doc__), argv)
    device = init_distributed()
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    torch.manual_seed(args.seed)  # the same full parameters on every rank before sharding
    model = torch.nn.Sequential(*(MlpBlock(HIDDEN, FFN) for _ in range(BLOCKS))).to(device)
    parallelize_module(model, mesh, tp_plan())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed)  # replicated input: the same on every rank

    step = train_step(args, model, opt, lambda: torch.randn(BATCH, HIDDEN, device=device, generator=gen))
    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
