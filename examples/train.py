"""The bundled example workload: a small hybrid-parallel training loop with known, injectable slowdowns.

Run it unchanged under ``torchrun --nproc-per-node N examples/train.py`` (CPU: gloo; GPU: NCCL, chosen
from the device) or as ``python examples/train.py`` (one rank). Each step exercises:

- a tensor-parallel style layer on sub-groups (pairs {0,1}, {2,3}, ...): all_gather of activation shards
  and reduce_scatter of partial sums (the first collectives of a step);
- data parallelism: DDP's gradient all_reduce over all ranks (issued by DDP's C++ reducer);
- a pipeline-style send/recv between neighbouring ranks (r -> r+1);
- a broadcast from rank 0 and a barrier; then ``optimizer.step()``, which marks the step.

Known slowdowns, for the analyses to find:

- ``--straggler-rank R --straggler-ms D``: rank R does D ms of real extra compute (a loop of small matmuls
  timed by the clock) at the start of each step, before its first collective;
- ``--slow-send-rank R --slow-send-ms D``: rank R sleeps D ms right before each pipeline send.

``--step-times-out FILE`` writes the per-step wall times and CPU times of the process, all threads
(JSON: ``{"rank": r, "world_size": n, "step_ns": [...], "step_cpu_ns": [...]}``);
``{rank}`` in FILE is replaced by the rank, otherwise only rank 0 writes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BATCH = 128
HIDDEN = 512
LAYERS = 4
TP_DIM = 2048  # per-rank activation shard elements per row for the tensor-parallel layer
PIPE_NUMEL = 256 * 1024  # floats sent between pipeline neighbours (1 MiB)
BCAST_NUMEL = 64 * 1024  # floats broadcast from rank 0 (256 KiB)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=8, help="training steps to run")
    p.add_argument("--straggler-rank", type=int, default=-1, help="rank doing extra compute each step")
    p.add_argument("--straggler-ms", type=float, default=0.0, help="extra compute per step, ms")
    p.add_argument("--slow-send-rank", type=int, default=-1, help="rank that waits before each send")
    p.add_argument("--slow-send-ms", type=float, default=0.0, help="wait before each send, ms")
    p.add_argument("--crash-rank", type=int, default=-1, help="rank that exits with code 3 (tests)")
    p.add_argument("--crash-step", type=int, default=0, help="step at which --crash-rank exits")
    p.add_argument("--step-times-out", default="", help="write per-step wall times (JSON) here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed() -> torch.device:
    """Join the job (or make a one-rank job when not started by torchrun); returns this rank's device."""
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


def tp_groups(world: int) -> list[dist.ProcessGroup]:
    """Pairs {0,1}, {2,3}, ... (a lone last rank forms its own group); every rank creates every group."""
    groups = []
    for first in range(0, world, 2):
        g = dist.new_group(list(range(first, min(first + 2, world))))
        assert g is not None
        groups.append(g)
    return groups


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


def build_model(device: torch.device) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    groups = tp_groups(world)
    tp = groups[rank // 2]
    tp_size = dist.get_world_size(tp)

    model = DistributedDataParallel(
        build_model(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    shard_w = torch.randn(HIDDEN, TP_DIM // 8, device=device) * 0.01
    pipe = torch.empty(PIPE_NUMEL, device=device)
    bcast = torch.empty(BCAST_NUMEL, device=device)
    gathered = torch.empty(tp_size * BATCH, TP_DIM // 8, device=device)
    rs_out = torch.empty(BATCH * TP_DIM // 8 // tp_size, device=device)

    step_ns: list[int] = []
    step_cpu_ns: list[int] = []
    for step in range(args.steps):
        t0 = time.perf_counter_ns()
        c0 = time.process_time_ns()
        if rank == args.crash_rank and step == args.crash_step:
            os._exit(3)
        if rank == args.straggler_rank and args.straggler_ms > 0:
            extra_compute(args.straggler_ms, device)
        x = torch.randn(BATCH, HIDDEN, device=device)
        with torch.no_grad():
            # tensor-parallel style layer: column shard, gather the activations, reduce-scatter partials
            local = x @ shard_w
            # torch 2.13's names; 2.11 and 2.12 have only the older ones (deprecated since 2.13)
            all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            all_gather(gathered, local.contiguous(), group=tp)
            partial = (gathered[:BATCH] * 0.5).reshape(-1)
            reduce_scatter(rs_out, partial, group=tp)
        # data parallel: forward/backward; DDP all_reduces the gradients
        loss = model(x).square().mean()
        loss.backward()
        with torch.no_grad():
            # pipeline-style p2p: receive from the previous stage, send to the next
            if rank > 0:
                dist.recv(pipe, src=rank - 1)
            if rank < world - 1:
                pipe.fill_(float(step))
                if rank == args.slow_send_rank and args.slow_send_ms > 0:
                    time.sleep(args.slow_send_ms / 1000.0)
                dist.send(pipe, dst=rank + 1)
            if rank == 0:
                bcast.normal_()
            dist.broadcast(bcast, src=0)
        dist.barrier()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ns.append(time.perf_counter_ns() - t0)
        step_cpu_ns.append(time.process_time_ns() - c0)

    if args.step_times_out and ("{rank}" in args.step_times_out or rank == 0):
        out = Path(args.step_times_out.replace("{rank}", str(rank)))
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(
            json.dumps({"rank": rank, "world_size": world, "step_ns": step_ns, "step_cpu_ns": step_cpu_ns})
        )
        tmp.replace(out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
