"""Example workload: FSDP2 (``torch.distributed.fsdp.fully_shard``) on each layer and on the root.

Run it unchanged under ``torchrun --nproc-per-node 2 examples/fsdp2.py`` (CPU: gloo; GPU: NCCL, chosen
from the device) or as ``python examples/fsdp2.py`` (one rank: nothing is sharded, no communication).

The model is an MLP of ``LAYERS`` Linear layers (``HIDDEN`` x ``HIDDEN``) with ReLUs; every Linear is its
own FSDP2 unit and the root holds what is left (nothing but the wrapper). Each step, on the default group
(all ranks):

- forward: one ``all_gather_into_tensor`` per Linear (its parameters, un-sharded just before use);
- backward: one ``all_gather_into_tensor`` per Linear again (FSDP2 reshards after forward), then one
  ``reduce_scatter_tensor`` per Linear (its gradients, averaged);
- then ``optimizer.step()`` on the local shards, which marks the step.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step), and
``--slow-send-rank R --slow-send-ms D``: there is no p2p, so rank R sleeps D ms right before its first
collective of each step (before the forward, whose first Linear all-gathers).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import finish, init_distributed, mlp, parse, parser, run_steps, train_step
from torch.distributed.fsdp import fully_shard

BATCH = 64
HIDDEN = 256
LAYERS = 4


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(__doc__), argv)
    device = init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same full parameters on every rank before sharding
    model = mlp(LAYERS, HIDDEN, device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)

    step = train_step(args, model, opt, lambda: torch.randn(BATCH, HIDDEN, device=device, generator=gen))
    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
