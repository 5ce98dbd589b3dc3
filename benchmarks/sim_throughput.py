"""Simulated-replay throughput on synthetic Chakra traces.

Cases (each at two sizes, to show that the cost grows linearly with the number of nodes):

- (a) ``compute``: R ranks x N chained compute nodes;
- (b) ``allreduce``: R ranks x N chained 1 MiB all_reduces, ring algorithm on a Ring (50 GB/s, 500 ns);
- (c) ``wide``: R ranks x N such all_reduces (1,024 ranks).

Traces are written as real ``.et`` run directories (one protobuf encoding per distinct node, reused for
every rank), loaded with the trace store, and simulated; loading and simulation (``simulate()``: lowering
the store's run to the core's graph, the event loop, and mapping times back to rows) are timed separately,
the simulation as the best of ``--repeat`` runs.
Usage: ``python benchmarks/sim_throughput.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path

from skewlens.profiler.chakra_io import EtWriter, TraceNode, encode_message, to_proto
from skewlens.profiler.manifest import rank_file
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import PG_INIT_NODE_NAME, CommType, NodeType
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.simulate import simulate

MIB = 1 << 20
TARGETS_S = {"compute": 1.14, "allreduce": 4.05, "wide": 7.5}
FULL = {"compute": (64, 10_000), "allreduce": (64, 1_000), "wide": (1024, 4)}


def write_run(run_dir: Path, kind: str, world: int, n: int) -> Path:
    """Write a run of ``world`` identical ranks with ``n`` chained nodes each."""
    b = RunBuilder(world_size=world)
    for r in range(world):
        b.rank(r)
    b.write(run_dir)  # manifest + process-group metadata; rank files are rewritten below
    rb = RankBuilder(rank=0, groups=b.groups)
    rb.step(0)
    for _ in range(n):
        if kind == "compute":
            rb.compute("aten::mm", dur_ns=10_000)
        else:
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=50_000)
    meta = TraceNode(
        node_id=0,
        name=PG_INIT_NODE_NAME,
        node_type=NodeType.METADATA,
        start_ns=0,
        dur_ns=0,
        inputs_values=json.dumps(
            [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cpu:gloo",
                    "ranks": list(range(world)),
                }
            ]
        ),
    )
    blob = b"".join(encode_message(to_proto(x)) for x in [meta, *rb.nodes])
    for r in range(world):
        with EtWriter(rank_file(run_dir, r), {"rank": r, "world_size": world}) as w:
            w.write_raw(blob)
    return run_dir


def ring_topology() -> Topology:
    return Topology(name="ring", dims=(Dimension(kind="ring", size=0, bandwidth_gbps=50.0, latency_ns=500),))


def measure(tmp: Path, kind: str, world: int, n: int, repeat: int = 3) -> tuple[float, float, int]:
    """Returns (load seconds, best simulate seconds of ``repeat`` runs, nodes)."""
    d = write_run(tmp / f"{kind}-{world}x{n}", kind, world, n)
    gc.collect()
    t0 = time.perf_counter()
    run = load_run(d)
    load_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t1 = time.perf_counter()
        if kind == "compute":
            res = simulate(run)
        else:
            res = simulate(run, topology=ring_topology(), comm_mode="model", algorithm="ring")
        best = min(best, time.perf_counter() - t1)
        assert res.makespan_ns > 0
    nodes = sum(len(rt) - 1 for rt in run.ranks.values())  # minus the metadata node
    shutil.rmtree(d)
    return load_s, best, nodes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one tenth of the sizes (smoke test)")
    ap.add_argument("--out", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="simulate each trace this many times, report the best"
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="skl-bench-", dir=args.out))
    ok = True
    try:
        for kind, (world, n) in FULL.items():
            if args.quick:
                world, n = (world, max(1, n // 10)) if kind != "wide" else (world // 8, n)
            small = (world, max(1, n // 2)) if kind != "wide" else (world // 2, n)
            rows = []
            for w, k in (small, (world, n)):
                load_s, sim_s, nodes = measure(tmp, kind, w, k, args.repeat)
                rows.append((w, k, load_s, sim_s, nodes))
                print(
                    f"{kind:9s} {w:5d} ranks x {k:6d} nodes: load {load_s:7.3f} s, simulate {sim_s:7.3f} s, "
                    f"{nodes / sim_s:,.0f} node-events/s"
                )
            (_, _, _, s_small, n_small), (_, _, _, s_full, n_full) = rows
            ratio = s_full / s_small if s_small > 0 else float("nan")
            target = TARGETS_S[kind] if not args.quick else TARGETS_S[kind] / 10
            passed = s_full <= target
            ok &= passed
            print(
                f"{kind:9s} nodes x{n_full / n_small:.2f} -> simulate time x{ratio:.2f}; "
                f"target <= {target:.2f} s: {'PASS' if passed else 'FAIL'}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
