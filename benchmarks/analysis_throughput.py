"""Benchmark: ``skewlens analyze`` end to end on a large synthetic run.

    .venv/bin/python benchmarks/analysis_throughput.py                      # 16 ranks x 100,000 nodes
    .venv/bin/python benchmarks/analysis_throughput.py --ranks 4 --nodes 20000

Generates (not timed; cached in --workdir) a run shaped like data-parallel training: per rank a chain of
compute nodes with a world all_reduce every ``COLL_EVERY`` nodes and a ring send/recv every ``P2P_EVERY``
nodes, over ``--steps`` steps; rank ``--straggler`` does 30% more compute. Times follow a lockstep model
(a collective completes at the last arrival plus a transfer time), so the waits are consistent.

Then times, in this process: load (``skewlens.profiler.store.load_run``), the shared index, the four analyses
(skew, breakdown, critical path, what-if blame with ``--max-simulations`` what-ifs) and writing the
Parquet tables; pictures are optional (``--pictures``). Target: load + analyses + Parquet <= 20 s for
16 x 100,000 on the 2-core reference machine. Wall and CPU time are both printed: on a machine shared with
other work the wall time overstates the cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import numpy as np

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import EtWriter, encode_message, node_template
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, rank_file, write_manifest
from skewlens.profiler.vocab import Attr, CommType, NodeType

COLL_EVERY = 50
P2P_EVERY = 1000
COMPUTE_NAMES = ("aten::mm", "aten::add", "aten::relu", "aten::layer_norm", "aten::softmax", "aten::gelu")
TRANSFER_NS = 20_000
SEND_NS = 5_000


def _template(name: str, node_type: NodeType, attrs: list[tuple[str, int | str | bool]]) -> pb.Node:
    return node_template(name, node_type, [(Attr.STEP, 0), *attrs])


def kinds(nodes: int, rank: int) -> np.ndarray:
    """Per position: 0 compute, 1 collective, 2 send, 3 recv. Even ranks send to rank + 1 then receive from
    rank - 1; odd ranks the other way round (a rendezvous ring that cannot deadlock)."""
    i = np.arange(nodes)
    k = np.zeros(nodes, dtype=np.int8)
    k[(i % COLL_EVERY == 0) & (i > 0)] = 1
    first, second = (2, 3) if rank % 2 == 0 else (3, 2)
    k[(i % P2P_EVERY == 0) & (i > 0)] = first
    k[(i % P2P_EVERY == 1) & (i > 1)] = second
    return k


def timeline(world: int, nodes: int, straggler: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration of every node of every rank (lockstep model), shape (world, nodes)."""
    k = np.stack([kinds(nodes, r) for r in range(world)])
    i = np.arange(nodes, dtype=np.int64)
    dur = np.empty((world, nodes), dtype=np.int64)
    for r in range(world):
        dur[r] = 1000 + (i * 7919 + r * 104729) % 50_000
        if r == straggler:
            dur[r] = dur[r] * 13 // 10
    start = np.empty_like(dur)
    t = np.zeros(world, dtype=np.int64)
    sync = np.flatnonzero(k[0] != 0)
    prev = 0
    for p in sync.tolist():
        seg = dur[:, prev:p]
        start[:, prev:p] = t[:, None] + np.cumsum(seg, axis=1) - seg
        t = t + seg.sum(axis=1)
        if k[0, p] == 1:
            end = int(t.max()) + TRANSFER_NS
            start[:, p] = t
            dur[:, p] = end - t
            t[:] = end
        else:
            snd = k[:, p] == 2
            start[:, p] = t
            src_start = np.roll(t, 1)  # the sender of rank r is r - 1
            end = np.where(snd, t + SEND_NS, np.maximum(src_start, t) + TRANSFER_NS)
            dur[:, p] = end - t
            t = end
        prev = p + 1
    seg = dur[:, prev:]
    start[:, prev:] = t[:, None] + np.cumsum(seg, axis=1) - seg
    return start, dur


def write_rank(run_dir: Path, rank: int, world: int, steps: int, start: np.ndarray, dur: np.ndarray) -> None:
    nodes = start.size
    k = kinds(nodes, rank)
    base: list[tuple[str, int | str | bool]] = [(Attr.STREAM, 0), (Attr.IS_CPU_OP, True)]
    comp = [_template(n, NodeType.COMP, base) for n in COMPUTE_NAMES]
    coll = _template(
        "c10d::allreduce_",
        NodeType.COMM_COLL,
        [
            *base,
            (Attr.COMM_TYPE, int(CommType.ALL_REDUCE)),
            (Attr.COMM_SIZE, 1 << 20),
            (Attr.PG_NAME, "0"),
            (Attr.SEQ, 0),
        ],
    )
    p2p: list[tuple[str, int | str | bool]] = [
        (Attr.COMM_SIZE, 65536),
        (Attr.COMM_TAG, 7),
        (Attr.PG_NAME, "0"),
    ]
    send = _template(
        "c10d::send",
        NodeType.COMM_SEND,
        [*base, (Attr.COMM_SRC, rank), (Attr.COMM_DST, (rank + 1) % world), *p2p],
    )
    recv = _template(
        "c10d::recv_",
        NodeType.COMM_RECV,
        [*base, (Attr.COMM_SRC, (rank - 1) % world), (Attr.COMM_DST, rank), *p2p],
    )
    per_step = -(-nodes // steps)
    seq = 0
    with EtWriter(rank_file(run_dir, rank), {"rank": rank, "world_size": world}) as w:
        for i in range(nodes):
            kind = int(k[i])
            if kind == 1:
                node = coll
                node.attr[-1].int64_val = seq
                seq += 1
            elif kind == 2:
                node = send
            elif kind == 3:
                node = recv
            else:
                node = comp[i % len(COMPUTE_NAMES)]
            node.id = i + 1
            if i:
                node.ctrl_deps[:] = [i]
            else:
                del node.ctrl_deps[:]
            s, d = int(start[i]), int(dur[i])
            node.start_time_micros = s // 1000
            node.duration_micros = d // 1000
            node.attr[0].int64_val = s
            node.attr[1].int64_val = d
            node.attr[2].int64_val = i // per_step
            w.write_raw(encode_message(node))
            if i == 0:
                node.ctrl_deps.append(0)


def generate(run_dir: Path, world: int, nodes: int, steps: int, straggler: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    start, dur = timeline(world, nodes, straggler)
    args = [(run_dir, r, world, steps, start[r], dur[r]) for r in range(world)]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.starmap(write_rank, args)
    write_manifest(
        run_dir,
        Manifest(
            world_size=world,
            ranks=tuple(range(world)),
            process_groups=(ProcessGroupInfo(name="0", ranks=tuple(range(world)), desc="default_pg"),),
            backend="gloo",
            level="ops",
            source="synthetic",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--straggler", type=int, default=3)
    p.add_argument("--max-simulations", type=int, default=2)
    p.add_argument("--pictures", action="store_true")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "skewlens-analysis-bench")
    a = p.parse_args(argv)
    run_dir = a.workdir / f"run-{a.ranks}x{a.nodes}x{a.steps}-s{a.straggler}"
    if not (run_dir / "manifest.json").is_file():
        t = time.perf_counter()
        generate(run_dir, a.ranks, a.nodes, a.steps, a.straggler)
        print(f"generated {run_dir} in {time.perf_counter() - t:.1f} s (not timed)")

    from skewlens.analysis.api import analyze_run, write_tables
    from skewlens.analysis.blame import analyze_blame
    from skewlens.analysis.breakdown import analyze_breakdown
    from skewlens.analysis.critical_path import analyze_critical_path
    from skewlens.analysis.index import build_index
    from skewlens.analysis.skew import analyze_skew
    from skewlens.profiler.store import load_run

    stages: dict[str, float] = {}
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    run = load_run(run_dir)
    stages["load"] = time.perf_counter() - t0
    load_cpu = time.process_time() - cpu0
    t = time.perf_counter()
    ix = build_index(run)
    stages["index"] = time.perf_counter() - t
    t = time.perf_counter()
    skew = analyze_skew(ix)
    stages["skew"] = time.perf_counter() - t
    t = time.perf_counter()
    analyze_breakdown(ix)
    stages["breakdown"] = time.perf_counter() - t
    t = time.perf_counter()
    analyze_critical_path(ix)
    stages["critical path"] = time.perf_counter() - t
    t = time.perf_counter()
    blame = analyze_blame(ix, skew, max_simulations=a.max_simulations)
    stages[f"blame ({1 + sum(r.simulated for r in blame.records)} simulations)"] = time.perf_counter() - t
    # the public entry point once more, end to end from the loaded run, then the tables
    t = time.perf_counter()
    cpu = time.process_time()
    result = analyze_run(run, max_simulations=a.max_simulations)
    analyses_total = time.perf_counter() - t
    analyses_cpu = time.process_time() - cpu
    t = time.perf_counter()
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        write_tables(result, out)
        stages["parquet"] = time.perf_counter() - t
        parquet_cpu = time.process_time() - cpu
        if a.pictures:
            from skewlens.analysis.perfetto import write_perfetto
            from skewlens.analysis.plots import breakdown_bars, wait_heatmap

            t = time.perf_counter()
            wait_heatmap(result, Path(out) / "w.png")
            breakdown_bars(result, Path(out) / "b.png")
            write_perfetto(result, Path(out) / "t.json")
            stages["pictures (not in the total)"] = time.perf_counter() - t
    total_nodes = sum(len(rt) for rt in run.ranks.values())
    print(
        f"{a.ranks} ranks x {a.nodes} nodes = {total_nodes:,} nodes, {len(run.collectives)} collectives, "
        f"{len(run.p2p)} p2p pairs"
    )
    for name, secs in stages.items():
        print(f"  {name:<32} {secs:7.2f} s")
    end_to_end = stages["load"] + analyses_total + stages["parquet"]
    print(f"  {'analyze_run (all four)':<32} {analyses_total:7.2f} s")
    print(
        f"end to end (load + analyze_run + parquet): {end_to_end:.2f} s wall, "
        f"{load_cpu + analyses_cpu + parquet_cpu:.2f} s CPU of this process  (target <= 20 s)"
    )
    top = result.stragglers[0]
    print(
        f"top straggler: rank {top.rank} (generated: {a.straggler}), "
        f"cost {top.straggler_cost_ns / 1e6:.1f} ms, cause: {top.cause}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
