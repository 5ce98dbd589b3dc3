"""Clock offsets between ranks on one host, as the capture estimates them (they share one clock: ~0).

    .venv/bin/python benchmarks/clock_offsets.py [--ranks 4] [--trials 20]

Each trial starts ``--ranks`` processes that run :func:`skewlens.profiler.capture.clock.estimate_offset`
over one TCP store, as the capture's ranks do, and prints the median and largest ``|offset|`` of the
non-zero ranks over the trials. (The tests check the estimator on scripted clocks; this is its error on
a real, possibly loaded, machine.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics


def _rank(rank: int, world: int, port: int, out: mp.Queue) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from skewlens.profiler.capture.clock import estimate_offset

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    out.put((rank, estimate_offset(store, rank, world, timeout_s=30)))
    store.set(f"done/{rank}", "1")
    if rank == 0:  # the store lives in rank 0: up until every rank has read its answers
        store.wait([f"done/{r}" for r in range(world)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    offsets: list[int] = []
    for trial in range(args.trials):
        q: mp.Queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, args.ranks, port, q)) for r in range(args.ranks)]
        for p in procs:
            p.start()
        got = dict(q.get(timeout=120) for _ in range(args.ranks))
        for p in procs:
            p.join(timeout=60)
        missing = [r for r, v in got.items() if v is None]
        if missing:
            print(f"trial {trial}: ranks {missing} got no answer from rank 0")
        offsets += [abs(v) for r, v in got.items() if r and v is not None]
    us = sorted(o / 1000 for o in offsets)
    print(
        f"{len(us)} offsets ({args.ranks} ranks x {args.trials} trials, load {os.getloadavg()[0]:.1f}): "
        f"|offset| median {statistics.median(us):.1f} us, max {us[-1]:.1f} us"
    )


if __name__ == "__main__":
    main()
