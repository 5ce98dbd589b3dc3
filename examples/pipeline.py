"""Example workload: pipeline parallelism with ``torch.distributed.pipelining`` (GPipe or 1F1B).

Run it unchanged under ``torchrun --nproc-per-node 2 examples/pipeline.py --schedule gpipe|1f1b`` (CPU:
gloo; GPU: NCCL, chosen from the device), or as ``python examples/pipeline.py`` (one rank: one stage
holding the whole model, no communication). One stage per rank: the MLP of ``LAYERS_PER_STAGE`` x world
Linear layers (``HIDDEN`` x ``HIDDEN``) with ReLUs is split by hand into equal consecutive parts, each a
``PipelineStage``; the loss (mean squared error against a target) is computed on the last stage.

Each step runs ``ScheduleGPipe`` (all forwards, then all backwards) or ``Schedule1F1B`` (one forward,
one backward in the steady state) over ``MICROBATCHES`` micro-batches of ``BATCH / MICROBATCHES`` rows,
then ``optimizer.step()`` on each stage's parameters, which marks the step. Communication, all p2p on the
default group, per step and per pair of neighbouring stages r -> r+1:

- ``MICROBATCHES`` sends r -> r+1 of one activation, ``BATCH / MICROBATCHES`` x ``HIDDEN`` float32
  (``ACT_BYTES``), each matched by a recv on r+1;
- ``MICROBATCHES`` sends r+1 -> r of the gradient of that activation (the same size), each matched by a
  recv on r; no collective.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step, before the schedule
runs), and ``--slow-send-rank R --slow-send-ms D``: rank R sleeps D ms right before each p2p send it
issues, i.e. at the end of each micro-batch's forward (activation send, all stages but the last) and at
the end of each micro-batch's backward (gradient send, all stages but the first).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
from _common import finish, init_distributed, parse, parser, run_steps, slow_send, straggle
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

BATCH = 64
HIDDEN = 512
LAYERS_PER_STAGE = 2
MICROBATCHES = 4
ACT_BYTES = BATCH // MICROBATCHES * HIDDEN * 4
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class _SleepInBackward(torch.autograd.Function):
    """Identity whose backward sleeps for the slow sender (the gradient is sent right after)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, args: argparse.Namespace, rank: int) -> torch.Tensor:
        ctx.args, ctx.rank = args, rank
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        slow_send(ctx.args, ctx.rank)
        return grad, None, None


class Stage(torch.nn.Module):
    """This rank's consecutive layers, with the slow sender's sleeps where its sends follow."""

    def __init__(self, layers: list[torch.nn.Module], args: argparse.Namespace, rank: int, world: int):
        super().__init__()
        self.layers = torch.nn.Sequential(*layers)
        self.args, self.rank = args, rank
        self.sends_forward, self.sends_backward = rank < world - 1, rank > 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sends_backward:
            x = _SleepInBackward.apply(x, self.args, self.rank)
        y: torch.Tensor = self.layers(x)
        if self.sends_forward:
            slow_send(self.args, self.rank)
        return y


def build_stage(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> Stage:
    """The whole model, built alike on every rank, cut into ``world`` parts; this rank's part."""
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS_PER_STAGE * world):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    per = 2 * LAYERS_PER_STAGE
    return Stage(layers[rank * per : (rank + 1) * per], args, rank, world).to(device)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe", help="pipeline schedule")
    args = parse(p, argv)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    module = build_stage(args, rank, world, device)
    stage = PipelineStage(module, rank, world, device)
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=MICROBATCHES, loss_fn=mse)
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed)  # every rank draws the same batch

    def step(_i: int) -> None:
        straggle(args, rank, device)
        x = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        target = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        first, last = rank == 0, rank == world - 1
        if first and last:
            schedule.step(x, target=target)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=target)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
