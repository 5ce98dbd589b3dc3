"""Clock alignment between replay workers (uses torch.distributed): NTP-style, minimum round trip.

Each rank ``r > 0`` exchanges a few timestamps with rank 0 over the default group; the offset of the
exchange with the shortest round trip is kept: ``offset = t_rank0 - (t_send + t_recv) / 2``, so that
``local monotonic ns + offset`` is rank 0's monotonic clock. Then rank 0 picks the common start time.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

ROUNDS = 5
#: How far ahead of "now" rank 0 sets the common start (covers the broadcast and a late rank's wake-up).
START_LEAD_NS = 100_000_000


def estimate_offset_ns(rank: int, world_size: int, device: torch.device) -> int:
    """This rank's offset to rank 0's monotonic clock, ns (0 on rank 0)."""
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    best_rtt = None
    best_offset = 0
    for peer in range(1, world_size):
        for _ in range(ROUNDS):
            if rank == 0:
                dist.recv(buf, src=peer)
                buf.fill_(time.perf_counter_ns())
                dist.send(buf, dst=peer)
            elif rank == peer:
                t0 = time.perf_counter_ns()
                buf.fill_(t0)
                dist.send(buf, dst=0)
                dist.recv(buf, src=0)
                t2 = time.perf_counter_ns()
                t_ref = int(buf.item())
                if best_rtt is None or t2 - t0 < best_rtt:
                    best_rtt = t2 - t0
                    best_offset = t_ref - (t0 + t2) // 2
    return best_offset


def common_start_ns(rank: int, offset_ns: int, device: torch.device, lead_ns: int = START_LEAD_NS) -> int:
    """A start time all ranks agree on, ``lead_ns`` after now on rank 0, in this rank's local monotonic ns."""
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        buf.fill_(time.perf_counter_ns() + lead_ns)
    dist.broadcast(buf, src=0)
    return int(buf.item()) - offset_ns
