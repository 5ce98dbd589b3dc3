"""Example workload: a 3-D DeviceMesh, pipeline x FSDP2 x tensor parallel (torchtitan-style).

Run it unchanged under ``torchrun --nproc-per-node 8 examples/mesh3d.py`` (CPU: gloo; GPU: NCCL, chosen
from the device), ``--pp P`` (default 2) pipeline stages, ``--tp T`` (default 2) ranks per tensor-parallel
group and world / (P T) data-parallel replicas; on 4 ranks ``--tp 1`` is pp x FSDP2 and ``--tp 2`` pp x TP.

``init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))`` lays the ranks out
row-major, rank = p dp T + d T + t: with 8 ranks the tp groups are {0,1}, {2,3}, ..., the dp groups {0,2},
{1,3}, {4,6}, {5,7} and the pp groups {0,4}, {1,5}, {2,6}, {3,7}. Stage p is ``BLOCKS`` MLP blocks
(``Linear(HIDDEN, FFN)`` -> ReLU -> ``Linear(FFN, HIDDEN)``, of a model of ``BLOCKS`` x P built alike on
every rank), each ``parallelize_module``-d on ``mesh["tp"]`` (up ``ColwiseParallel``, down
``RowwiseParallel``) and ``fully_shard``-ed on ``mesh["dp"]``, then the stage root ``fully_shard``-ed; a
``PipelineStage`` on ``mesh["pp"]``'s group runs it with ``--schedule`` (``1f1b`` or ``gpipe``) over
``MICROBATCHES`` micro-batches of ``BATCH / MICROBATCHES`` rows. The replicas draw different batches, the
ranks of one tp group the same. Each step, on a rank of stage p (a group of one rank issues nothing):

- on its pp group: ``MICROBATCHES`` sends of an activation (``BATCH / MICROBATCHES`` x ``HIDDEN``
  float32) to stage p+1 and as many recvs of its gradient from it; from stage p-1 ``MICROBATCHES`` recvs
  of an activation and sends of its gradient (p2p, to the peer's global rank);
- on its dp group, per block: ``all_gather_into_tensor`` of its (TP-sharded) parameters before each
  micro-batch's forward (resharded after it) and once for the backward (kept until the last micro-batch's),
  ``MICROBATCHES`` + 1 in all, and one ``reduce_scatter_tensor`` of its gradients (FSDP2);
- on its tp group, per block and micro-batch: one ``all_reduce`` of the row-parallel output in forward and
  one of the column-parallel input's gradient in backward (but stage 0's first block's, whose input needs
  none) (DTensor);
- then ``optimizer.step()``, which marks the step.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step, before the schedule).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from _common import MlpBlock, finish, init_distributed, parse, parser, run_steps, schedule_step, straggle
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

BATCH = 32
HIDDEN = 128
FFN = 256
BLOCKS = 2
MICROBATCHES = 4
SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--pp", type=int, default=2, help="pipeline stages, one per rank of a pp group")
    p.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group")
    p.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b", help="pipeline schedule")
    args = parse(p, argv)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    pp, tp = min(args.pp, world), min(args.tp, world)
    if pp < 1 or tp < 1 or world % (pp * tp):
        p.error(f"--pp {args.pp} x --tp {args.tp} must divide the world size {world}")
    # the stage returns the last row-parallel output, a view; nothing here changes it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (pp, world // (pp * tp), tp), mesh_dim_names=("pp", "dp", "tp"))
    stage_index = mesh["pp"].get_local_rank()
    torch.manual_seed(args.seed)  # the same full model on every rank; stage p keeps its blocks
    blocks = [MlpBlock(HIDDEN, FFN) for _ in range(BLOCKS * pp)]
    model = torch.nn.Sequential(*blocks[stage_index * BLOCKS : (stage_index + 1) * BLOCKS]).to(device)
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    # shapes inferred at the first step (given as input_args, torch 2.13's 1F1B stage 0 got no gradient)
    stage = PipelineStage(model, stage_index, pp, device, group=mesh["pp"].get_group())
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=MICROBATCHES, loss_fn=mse)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed + mesh["dp"].get_local_rank())
    first, last = stage_index == 0, stage_index == pp - 1

    def step(_i: int) -> None:
        straggle(args, rank, device)
        x = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        target = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        schedule_step(schedule, first, last, x, target)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
