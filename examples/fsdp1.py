"""Example workload: legacy FSDP (``torch.distributed.fsdp.FullyShardedDataParallel``, flat parameters).

Run it unchanged under ``torchrun --nproc-per-node 2 examples/fsdp1.py`` (CPU: gloo; GPU: NCCL, chosen
from the device) or as ``python examples/fsdp1.py`` (one rank: nothing is sharded, no communication).

The model is an MLP of ``LAYERS`` Linear layers (``HIDDEN`` x ``HIDDEN``) with ReLUs, wrapped by
``ModuleWrapPolicy({Linear})``: every Linear is its own FSDP unit with one flat parameter (weight and bias,
padded to a multiple of the world size), and the root holds nothing. On the CPU FSDP needs
``device_id=torch.device("cpu")`` (without it, it asks for an accelerator). Each step, with the default
``FULL_SHARD`` on the default group (all ranks):

- forward: one all-gather per Linear (its flat parameter); on the CPU FSDP gathers it with
  ``dist.all_gather`` into a list of the flat parameter's chunks (``c10d::allgather_``), on a GPU with
  ``all_gather_into_tensor`` on its unshard stream;
- backward: one all-gather per Linear again (resharded after forward), then one ``reduce_scatter_tensor``
  per Linear (its padded flat gradient);
- then ``optimizer.step()`` on the local shards, which marks the step.

``SHARD_GRAD_OP`` keeps the parameters after forward (no backward all-gathers), ``NO_SHARD`` all-reduces
the gradients instead, ``HYBRID_SHARD`` (4 or more ranks, an even number) shards over ``mesh_shard`` and
all-reduces the gradient shards over ``mesh_replicate`` of a 2 x world/2 mesh (on one host there are no
nodes to replicate across). Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``,
``--step-times-out FILE``, ``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each
step), ``--slow-send-rank R --slow-send-ms D`` (no p2p: rank R sleeps D ms before the forward, whose first
Linear all-gathers); FSDP's own: ``--sharding-strategy``, ``--backward-prefetch`` (``BACKWARD_PRE``,
``BACKWARD_POST``, ``NONE``), ``--forward-prefetch``, ``--limit-all-gathers``, ``--use-orig-params``, and
``--state-dict-at K --state-dict-type T``: after step K, a ``FULL_STATE_DICT`` (gathered to rank 0; each unit
all-gathers its flat parameter) or a ``SHARDED_STATE_DICT``, counted in step K + 1 (the steps are marked by
``optimizer.step()``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import finish, init_distributed, mlp, parse, parser, run_steps, train_step
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    BackwardPrefetch,
    FullStateDictConfig,
    FullyShardedDataParallel,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

BATCH = 64
HIDDEN = 256
LAYERS = 4


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--sharding-strategy", default="FULL_SHARD", choices=[s.name for s in ShardingStrategy])
    p.add_argument(
        "--backward-prefetch", default="BACKWARD_PRE", choices=["BACKWARD_PRE", "BACKWARD_POST", "NONE"]
    )
    p.add_argument("--forward-prefetch", action="store_true")
    p.add_argument("--limit-all-gathers", action="store_true")
    p.add_argument("--use-orig-params", action="store_true")
    p.add_argument("--state-dict-at", type=int, default=-1, help="take a state_dict after this step")
    p.add_argument(
        "--state-dict-type", default="FULL_STATE_DICT", choices=["FULL_STATE_DICT", "SHARDED_STATE_DICT"]
    )
    args = parse(p, argv)
    device = init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same full parameters on every rank before sharding
    prefetch = None if args.backward_prefetch == "NONE" else BackwardPrefetch[args.backward_prefetch]
    mesh = None
    if args.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        # one host has no nodes to replicate across: 2 replicas of world / 2 shards, on a 2-D mesh
        world = dist.get_world_size()
        if world < 4 or world % 2:
            p.error(f"--sharding-strategy {args.sharding_strategy} needs an even world size of 4 or more")
        names = ("replicate", "shard")
        mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=names)
    model = FullyShardedDataParallel(
        mlp(LAYERS, HIDDEN, device),
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        sharding_strategy=ShardingStrategy[args.sharding_strategy],
        backward_prefetch=prefetch,
        forward_prefetch=args.forward_prefetch,
        limit_all_gathers=args.limit_all_gathers,
        use_orig_params=args.use_orig_params,
        device_id=device,
        device_mesh=mesh,
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)
    train = train_step(args, model, opt, lambda: torch.randn(BATCH, HIDDEN, device=device, generator=gen))
    kind = StateDictType[args.state_dict_type]
    # offload_to_cpu=False: on the CPU, torch 2.13's offload frees the gathered storage it then reads
    config = FullStateDictConfig(rank0_only=True) if kind == StateDictType.FULL_STATE_DICT else None

    def step(i: int) -> None:
        train(i)
        if i == args.state_dict_at:
            with FullyShardedDataParallel.state_dict_type(model, kind, config):
                model.state_dict()

    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
