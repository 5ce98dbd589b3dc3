"""What the example workloads share: their knobs, the device and backend, the straggler, the step timing.

Not a workload itself. Each example imports it as ``_common`` (it lies beside them, and a script's own
folder is first on ``sys.path``). The knobs and the ``--step-times-out`` JSON are those of ``train.py``:

- ``--steps N``; ``--seed S`` (the model is initialised from S on every rank, the data from S + rank);
- ``--straggler-rank R --straggler-ms D``: rank R does D ms of real extra compute (a loop of small matmuls
  timed by the clock) at the start of each step, before its first collective;
- ``--slow-send-rank R --slow-send-ms D``: rank R sleeps D ms before each point-to-point send, or, in a
  workload without p2p, before its first collective of each step (each example says which);
- ``--step-times-out FILE``: per-step wall and CPU times of the process, all threads (JSON:
  ``{"rank": r, "world_size": n, "step_ns": [...], "step_cpu_ns": [...]}``); ``{rank}`` in FILE is
  replaced by the rank, otherwise only rank 0 writes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The knobs every example takes (add a workload's own before :func:`parse`)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=8, help="training steps to run")
    p.add_argument("--straggler-rank", type=int, default=-1, help="rank doing extra compute each step")
    p.add_argument("--straggler-ms", type=float, default=0.0, help="extra compute per step, ms")
    p.add_argument("--slow-send-rank", type=int, default=-1, help="rank that waits before each send")
    p.add_argument("--slow-send-ms", type=float, default=0.0, help="wait before each send, ms")
    p.add_argument("--step-times-out", default="", help="write per-step wall times (JSON) here")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed() -> torch.device:
    """Join the job (or make a one-rank job when not started by torchrun); returns this rank's device.

    CUDA with NCCL where there is a GPU (``LOCAL_RANK``'s), else the CPU with gloo.
    """
    if "RANK" not in os.environ:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def extra_compute(ms: float, device: torch.device) -> int:
    """Real compute for ``ms`` milliseconds: small matmuls until the deadline; returns how many ran."""
    a = torch.randn(128, 128, device=device)
    b = torch.randn(128, 128, device=device)
    c = torch.empty(128, 128, device=device)
    deadline = time.perf_counter() + ms / 1000.0
    n = 0
    while time.perf_counter() < deadline:
        for _ in range(4):
            torch.mm(a, b, out=c)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        n += 4
    return n


def straggle(args: argparse.Namespace, rank: int, device: torch.device) -> None:
    """The straggler's extra compute, on its rank (call at the start of each step)."""
    if rank == args.straggler_rank and args.straggler_ms > 0:
        extra_compute(args.straggler_ms, device)


def slow_send(args: argparse.Namespace, rank: int) -> None:
    """The slow sender's sleep, on its rank (call right before the send)."""
    if rank == args.slow_send_rank and args.slow_send_ms > 0:
        time.sleep(args.slow_send_ms / 1000.0)


def mlp(layers: int, hidden: int, device: torch.device) -> torch.nn.Sequential:
    """``layers`` times Linear(hidden, hidden) -> ReLU."""
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).to(device)


class MlpBlock(torch.nn.Module):
    """A Megatron-style MLP block, ``up`` (Linear(hidden, ffn)) -> ReLU -> ``down`` (Linear(ffn, hidden)):
    ``up`` is the one to shard column-wise and ``down`` row-wise."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(hidden, ffn)
        self.down = torch.nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def train_step(
    args: argparse.Namespace,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    make_input: Callable[[], torch.Tensor],
) -> Callable[[int], None]:
    """One plain step: the straggler's extra compute, a batch, the slow sender's sleep, forward, backward
    and ``optimizer.step()`` (which marks the step)."""
    rank = dist.get_rank()
    device = next(model.parameters()).device

    def step(_i: int) -> None:
        straggle(args, rank, device)
        x = make_input()
        slow_send(args, rank)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def schedule_step(schedule: Any, first: bool, last: bool, x: torch.Tensor, target: torch.Tensor) -> None:
    """One ``schedule.step`` of a ``torch.distributed.pipelining`` schedule as the rank's stages ask: the
    batch where it holds the first stage, the target where it holds the last."""
    if first and last:
        schedule.step(x, target=target)
    elif first:
        schedule.step(x)
    elif last:
        schedule.step(target=target)
    else:
        schedule.step()


def run_steps(
    args: argparse.Namespace, device: torch.device, step: Callable[[int], None]
) -> tuple[list[int], list[int]]:
    """Run ``step(i)`` for each step (it ends with ``optimizer.step()``); its wall and CPU times, ns."""
    step_ns: list[int] = []
    step_cpu_ns: list[int] = []
    for i in range(args.steps):
        t0 = time.perf_counter_ns()
        c0 = time.process_time_ns()
        step(i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ns.append(time.perf_counter_ns() - t0)
        step_cpu_ns.append(time.process_time_ns() - c0)
    return step_ns, step_cpu_ns


def write_step_times(path: str, step_ns: list[int], step_cpu_ns: list[int]) -> None:
    """``--step-times-out``: ``{rank}`` in ``path`` is replaced by the rank, otherwise rank 0 writes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if not path or ("{rank}" not in path and rank != 0):
        return
    out = Path(path.replace("{rank}", str(rank)))
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(
        json.dumps({"rank": rank, "world_size": world, "step_ns": step_ns, "step_cpu_ns": step_cpu_ns})
    )
    tmp.replace(out)


def finish(args: argparse.Namespace, times: tuple[list[int], list[int]]) -> int:
    """Write the step times, leave the job; the exit code."""
    write_step_times(args.step_times_out, *times)
    dist.destroy_process_group()
    return 0
