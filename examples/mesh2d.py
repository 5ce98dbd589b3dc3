"""Example workload: a 2-D DeviceMesh, tensor parallelism inside and FSDP2 across (TP x FSDP2).

Run it unchanged under ``torchrun --nproc-per-node 4 examples/mesh2d.py`` (CPU: gloo; GPU: NCCL, chosen
from the device), ``--tp T`` (default 2) ranks per tensor-parallel group and world / T data-parallel
replicas, or as ``python examples/mesh2d.py`` (one rank: a 1 x 1 mesh, no communication).

``init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))`` lays the ranks out row-major: the tp
groups are consecutive ranks ({0,1}, {2,3} with 4 ranks) and the dp groups strided ({0,2}, {1,3}). The
model is ``BLOCKS`` MLP blocks, ``Linear(HIDDEN, FFN)`` -> ReLU -> ``Linear(FFN, HIDDEN)``, parallelised
with ``parallelize_module`` on ``mesh["tp"]`` (up projection ``ColwiseParallel``, down ``RowwiseParallel``),
then each block and the root ``fully_shard``-ed on ``mesh["dp"]``. The ranks of one tp group draw the same
batch, the dp replicas different ones. Each step:

- on the dp group: per block, ``all_gather_into_tensor`` of its (TP-sharded) parameters in forward and
  again in backward, and ``reduce_scatter_tensor`` of its gradients in backward (FSDP2);
- on the tp group: per block, one ``all_reduce`` of the row-parallel output in forward and one of the
  column-parallel input's gradient in backward (but the first block's), functional collectives waited on
  inside the op that consumes them (DTensor);
- then ``optimizer.step()``, which marks the step. No p2p.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step), and
``--slow-send-rank R --slow-send-ms D``: there is no p2p, so rank R sleeps D ms right before its first
collective of each step (before the forward, whose first block all-gathers on dp).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from _common import MlpBlock, finish, init_distributed, parse, parser, run_steps, train_step
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

BATCH = 32
HIDDEN = 256
FFN = 1024
BLOCKS = 2


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group (divides the world)")
    args = parse(p, argv)
    device = init_distributed()
    world = dist.get_world_size()
    tp = min(args.tp, world)
    if tp < 1 or world % tp:
        p.error(f"--tp {args.tp} must divide the world size {world}")
    # the root returns the last row-parallel output, a view; nothing here changes it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(args.seed)  # the same full parameters on every rank before sharding
    model = torch.nn.Sequential(*(MlpBlock(HIDDEN, FFN) for _ in range(BLOCKS))).to(device)
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    gen = torch.Generator(device=device).manual_seed(args.seed + dp_rank)  # one batch per tp group

    step = train_step(args, model, opt, lambda: torch.randn(BATCH, HIDDEN, device=device, generator=gen))
    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
