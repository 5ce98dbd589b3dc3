"""Example workload: pipeline parallelism with ``torch.distributed.pipelining``.

Run it unchanged under ``torchrun --nproc-per-node 2 examples/pipeline.py --schedule NAME`` (CPU: gloo;
GPU: NCCL, chosen from the device), or as ``python examples/pipeline.py`` (one rank: one stage holding the
whole model, no communication). The MLP of ``LAYERS_PER_STAGE`` x stages Linear layers (``HIDDEN`` x
``HIDDEN``) with ReLUs is split by hand into equal consecutive stages, each a ``PipelineStage``; the loss
(mean squared error against a target) is computed on the last stage.

- ``gpipe`` (``ScheduleGPipe``: all forwards, then all backwards) and ``1f1b`` (``Schedule1F1B``: one
  forward, one backward in the steady state): one stage per rank;
- ``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb`` (``ScheduleInterleaved1F1B``,
  ``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``): two stages per rank, stage s on rank
  s % world; ``zbv``, ``dualpipev`` (``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``): two per rank in a
  V, stage s on rank s for s < world, else on 2 world - 1 - s (the last rank holds two neighbouring
  stages, whose activation and gradient stay on it).

Each step runs the schedule over ``MICROBATCHES`` micro-batches of ``BATCH / MICROBATCHES`` rows, then
``optimizer.step()`` on the rank's parameters, which marks the step. Communication, all p2p on the default
group, per step and per pair of neighbouring stages s -> s+1 on different ranks (a multi-stage schedule
posts a stage's recvs ahead and waits for each before the compute that reads it, its sends at the end of
the step):

- ``MICROBATCHES`` sends s -> s+1 of one activation, ``BATCH / MICROBATCHES`` x ``HIDDEN`` float32
  (``ACT_BYTES``), each matched by a recv on s+1's rank;
- ``MICROBATCHES`` sends s+1 -> s of the gradient of that activation (the same size), each matched by a
  recv on s's rank; no collective.

Knobs (as ``train.py``'s; see ``_common.py``): ``--steps``, ``--seed``, ``--step-times-out FILE``,
``--straggler-rank R --straggler-ms D`` (D ms of matmuls at the start of each step, before the schedule
runs), and ``--slow-send-rank R --slow-send-ms D``: rank R sleeps D ms right before each p2p send it
issues, i.e. at the end of each micro-batch's forward (activation send, every stage whose next stage is on
another rank) and at the end of each micro-batch's backward (gradient send, every stage whose previous
stage is on another rank).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
from _common import finish, init_distributed, parse, parser, run_steps, schedule_step, slow_send, straggle
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

BATCH = 64
HIDDEN = 512
LAYERS_PER_STAGE = 2
MICROBATCHES = 4
ACT_BYTES = BATCH // MICROBATCHES * HIDDEN * 4
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
#: schedules of two stages a rank: ``loop`` places stage s on rank s % world, ``v`` on s or 2 world - 1 - s
MULTI = {
    "interleaved-1f1b": (ScheduleInterleaved1F1B, "loop"),
    "looped-bfs": (ScheduleLoopedBFS, "loop"),
    "interleaved-zb": (ScheduleInterleavedZeroBubble, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
    "dualpipev": (ScheduleDualPipeV, "v"),
}


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
    """One stage's consecutive layers, with the slow sender's sleeps where its p2p sends follow."""

    def __init__(
        self, layers: list[torch.nn.Module], args: argparse.Namespace, rank: int, sends: tuple[bool, bool]
    ):
        super().__init__()
        self.layers = torch.nn.Sequential(*layers)
        self.args, self.rank = args, rank
        self.sends_forward, self.sends_backward = sends

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sends_backward:
            x = _SleepInBackward.apply(x, self.args, self.rank)
        y: torch.Tensor = self.layers(x)
        if self.sends_forward:
            slow_send(self.args, self.rank)
        return y


def stage_ranks(n_stages: int, world: int, placement: str) -> list[int]:
    """Each stage's rank: ``loop`` (stage s on rank s % world) or ``v`` (s on s, else 2 world - 1 - s)."""
    if placement == "loop":
        return [s % world for s in range(n_stages)]
    return [s if s < world else 2 * world - 1 - s for s in range(n_stages)]


def build_stage(args: argparse.Namespace, index: int, owner: list[int], device: torch.device) -> Stage:
    """The whole model of ``len(owner)`` stages, built alike on every rank; stage ``index``'s part (its p2p
    sends: to the next stage's rank forward and the previous one's backward, where that is another rank)."""
    torch.manual_seed(args.seed)
    n = len(owner)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS_PER_STAGE * n):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    per = 2 * LAYERS_PER_STAGE
    rank = owner[index]
    sends = (index < n - 1 and owner[index + 1] != rank, index > 0 and owner[index - 1] != rank)
    return Stage(layers[index * per : (index + 1) * per], args, rank, sends).to(device)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--schedule", choices=[*SCHEDULES, *MULTI], default="gpipe", help="pipeline schedule")
    args = parse(p, argv)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.schedule in SCHEDULES:
        owner = list(range(world))
    else:
        owner = stage_ranks(2 * world, world, MULTI[args.schedule][1])
    mine = [s for s, r in enumerate(owner) if r == rank]
    modules = [build_stage(args, s, owner, device) for s in mine]
    stages = [PipelineStage(m, s, len(owner), device) for m, s in zip(modules, mine, strict=True)]
    if args.schedule in SCHEDULES:
        schedule: Any = SCHEDULES[args.schedule](stages[0], n_microbatches=MICROBATCHES, loss_fn=mse)
    else:
        schedule = MULTI[args.schedule][0](stages, n_microbatches=MICROBATCHES, loss_fn=mse)
    params = [q for m in modules for q in m.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(args.seed)  # every rank draws the same batch

    def step(_i: int) -> None:
        straggle(args, rank, device)
        x = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        target = torch.randn(BATCH, HIDDEN, device=device, generator=gen)
        schedule_step(schedule, owner[0] == rank, owner[-1] == rank, x, target)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return finish(args, run_steps(args, device, step))


if __name__ == "__main__":
    raise SystemExit(main())
