"""Clock alignment: each rank's offset to rank 0's clock, NTP-style (minimum round trip wins).

The exchange runs over the job's c10d store (no process group, so it adds no collective and does not
shift process-group names or sequence numbers). Rank ``r`` writes a ping with its time ``t0``; rank 0,
waiting for it, answers with its own time ``t``; rank ``r`` reads it at ``t1``. With the smallest
round trip ``t1 - t0`` over several rounds, ``offset = t - (t0 + t1) / 2`` is what rank ``r`` adds to its
clock to read rank 0's. Ranks on one host share ``CLOCK_REALTIME`` and get offsets near zero.

The store may outlive the exchange: torchrun's restarts keep the agent's store for every attempt
(``TORCHELASTIC_USE_AGENT_STORE``), so the keys an exchange leaves are there when the next attempt's ranks
come. Each key is therefore deleted by the side that read it (a ping by rank 0, a pong by its rank), a rank
deletes its own pings and pongs before its first ping (those of an attempt that ended inside the exchange),
and rank 0 deletes the word that it is done before it serves anyone: no rank reads an earlier attempt's
answer or leaves on its word.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any

ROUNDS = 8
PREFIX = "skewlens/clock"


def _key(kind: str, rank: int, i: int, epoch: int) -> str:
    return f"{PREFIX}/{epoch}/{kind}/{rank}/{i}"


def estimate_offset(
    store: Any, rank: int, world_size: int, *, timeout_s: float = 10.0, epoch: int = 0
) -> int | None:
    """This rank's offset to rank 0 in ns (0 on rank 0); None when rank 0 did not answer in time.

    Every rank of the job must call it at about the same time (rank 0 serves the others in rank order).
    Every rank returns once rank 0 has served them all (or given up on those gone), so that all begin
    what follows (the first recorded step) together: rank 0 waited for the last rank to come, while the
    ranks it had served went on, and it began that step late by the wait, as if its own work had been
    slow.
    """
    timeout = timedelta(seconds=timeout_s)
    done = _key("done", 0, 0, epoch)
    if rank == 0:
        # no rank waits for the word before rank 0 has answered its pings, which it does after this
        store.delete_key(done)
        for r in range(1, world_size):
            for i in range(ROUNDS):
                try:
                    store.wait([_key("ping", r, i, epoch)], timeout)
                except RuntimeError:  # rank r is gone: serve the others
                    break
                store.delete_key(_key("ping", r, i, epoch))
                store.set(_key("pong", r, i, epoch), str(time.time_ns()))
        store.set(done, "1")
        return 0
    for i in range(ROUNDS):  # an earlier attempt's, left where it ended inside the exchange
        store.delete_key(_key("ping", rank, i, epoch))
        store.delete_key(_key("pong", rank, i, epoch))
    best_rtt: int | None = None
    offset = 0
    for i in range(ROUNDS):
        t0 = time.time_ns()
        store.set(_key("ping", rank, i, epoch), "1")
        try:
            store.wait([_key("pong", rank, i, epoch)], timeout)
        except RuntimeError:
            return None
        t1 = time.time_ns()
        t = int(store.get(_key("pong", rank, i, epoch)))
        store.delete_key(_key("pong", rank, i, epoch))
        rtt = t1 - t0
        if best_rtt is None or rtt < best_rtt:
            best_rtt = rtt
            offset = t - (t0 + t1) // 2
    with contextlib.suppress(RuntimeError):  # rank 0 gone since: the offset stands
        store.wait([done], timeout)
    return offset
