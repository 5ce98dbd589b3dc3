"""Clock alignment: each rank's offset to rank 0's clock, NTP-style (minimum round trip wins).

The exchange runs over the job's c10d store (no process group, so it adds no collective and does not
shift process-group names or sequence numbers). Rank ``r`` writes a ping with its time ``t0``; rank 0,
waiting for it, answers with its own time ``t``; rank ``r`` reads it at ``t1``. With the smallest
round trip ``t1 - t0`` over several rounds, ``offset = t - (t0 + t1) / 2`` is what rank ``r`` adds to its
clock to read rank 0's. Ranks on one host share ``CLOCK_REALTIME`` and get offsets near zero.

The estimate is off by up to half the round trip's part that is the store's own delay in noticing a key.
A ``FileStore`` (``init_method="file://..."``) looks for a key every 10 ms in its ``wait``: on one host it
gave rank 1 offsets of 2.8-5.0 ms, and the analyses then found every all_reduce's member done before its
peer began. Over such a store each wait of the exchange first looks for its key itself (``check``, 6 µs on
a local file) every :data:`POLL_S` for up to :data:`SPIN_S`, then leaves it to the store's ``wait``: round
trips of 0.2 ms and offsets under 0.1 ms. Not a busy loop: on a loaded machine the two ranks spinning took
turns at the CPU, and round trips were 8-20 ms.

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
from time import monotonic
from typing import Any

ROUNDS = 8
PREFIX = "skewlens/clock"
#: How long a wait of the exchange over a store that polls (:func:`polls`) looks for its key itself.
SPIN_S = 0.05
#: How often such a wait looks for its key.
POLL_S = 0.0001


def polls(store: Any) -> bool:
    """Whether ``store``, under its prefixes, is a ``FileStore``, whose ``wait`` looks for a key every
    10 ms (a ``TCPStore``'s server answers a wait at once)."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return isinstance(store, dist.FileStore)


def _wait(store: Any, key: str, timeout: timedelta, spin: bool) -> None:
    """``store.wait([key], timeout)``; with ``spin``, after looking for ``key`` itself for up to
    :data:`SPIN_S`."""
    if spin:
        end = monotonic() + min(SPIN_S, timeout.total_seconds())
        while monotonic() < end:
            if store.check([key]):
                return
            time.sleep(POLL_S)  # not a busy loop: the peer that sets the key may need this CPU
    store.wait([key], timeout)


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
    spin = polls(store)
    done = _key("done", 0, 0, epoch)
    if rank == 0:
        # no rank waits for the word before rank 0 has answered its pings, which it does after this
        store.delete_key(done)
        for r in range(1, world_size):
            for i in range(ROUNDS):
                try:
                    _wait(store, _key("ping", r, i, epoch), timeout, spin)
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
            _wait(store, _key("pong", rank, i, epoch), timeout, spin)
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
