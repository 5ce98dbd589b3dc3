"""Example workload: DDP with ``no_sync()`` gradient accumulation, optionally ``torch.compile``-d.

Run it unchanged under ``torchrun --nproc-per-node 2 examples/ddp_accum.py [--accum K] [--compile]``
(CPU: gloo; GPU: NCCL, chosen from the device) or as ``python examples/ddp_accum.py`` (one rank: DDP of
one, its all-reduces on a group of one).

The model is an MLP of ``LAYERS`` Linear layers (``HIDDEN`` x ``HIDDEN``) with ReLUs, wrapped in
``DistributedDataParallel``. Each step runs K micro-batches (``--accum``, default 2) of ``BATCH`` rows:
the first K-1 forward and backward inside ``model.no_sync()`` (gradients accumulate locally, nothing is
communicated), the last one outside it, so DDP's reducer all-reduces the accumulated gradients once per
step (``all_reduce`` on the default group, one per bucket: every gradient exactly once); then
``optimizer.step()``, which marks the step. No p2p. (DDP's construction broadcasts the parameters from
rank 0 once, before the first step.)

``--compile``: the module inside DDP is ``torch.compile``-d (``DDP(torch.compile(model))``: DDP's reducer
and its hooks stay eager, forward and backward of the MLP are compiled) with the default backend,
inductor, which compiles C++ on the CPU (it needs a C++ compiler; it worked on a 2-core CPU machine).
``--compile-backend aot_eager`` takes AOTAutograd without code generation, for a machine where inductor
cannot compile. (``torch.compile(DDP(model))`` compiled nothing with torch 2.13: dynamo breaks the graph
at ``Reducer._rebuild_buckets`` in DDP's forward and runs the MLP eagerly.) Compiling happens in the
first step, so that step is long (about 30 s on 2 CPU cores with an empty inductor cache, under a second
with a warm one); keep it outside a capture's active window (the default ``--steps 1:1:3`` does).

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step), and
``--slow-send-rank R --slow-send-ms D``: there is no p2p, so rank R sleeps D ms right before its first
collective of each step (before the last micro-batch's backward, whose gradients DDP all-reduces).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import finish, init_distributed, mlp, parse, parser, run_steps, slow_send, straggle
from torch.nn.parallel import DistributedDataParallel

BATCH = 32
HIDDEN = 512
LAYERS = 4


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--accum", type=int, default=2, help="micro-batches per step (gradient accumulation)")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (with --compile)")
    args = parse(p, argv)
    if args.accum < 1:
        p.error("--accum must be >= 1")
    device = init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    net: torch.nn.Module = mlp(LAYERS, HIDDEN, device)
    if args.compile:
        net = torch.compile(net, backend=args.compile_backend)  # type: ignore[assignment]
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)

    def step(_i: int) -> None:
        straggle(args, rank, device)
        for _ in range(args.accum - 1):
            with model.no_sync():
                x = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
                (model(x).square().mean() / args.accum).backward()
        x = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        loss = model(x).square().mean() / args.accum
        slow_send(args, rank)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
