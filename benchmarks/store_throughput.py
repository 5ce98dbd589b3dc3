"""Benchmark: ``.et`` -> Parquet throughput and peak memory of ``skewlens.profiler.store.parquet.export_run``.

    .venv/bin/python benchmarks/store_throughput.py                   # 64 ranks x 100,000 nodes
    .venv/bin/python benchmarks/store_throughput.py --ranks 4 --nodes 20000 --workers 2

Generates a synthetic run (mixed compute / collectives / p2p; not timed; in --workdir, removed at the
end unless --keep: ~1 GB at the default size), then runs the conversion in a child process and samples
the resident memory and CPU time of that process and its workers (summed over the process tree, every
20 ms, with psutil). Throughput = nodes converted / wall time of ``export_run``; nodes per CPU-second
shows what a loaded machine hides.
Targets: >= 500,000 nodes/s and peak RSS <= 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import EtWriter, encode_message, node_template
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, rank_file, write_manifest
from skewlens.profiler.vocab import Attr, CommType, NodeType

COLL_EVERY = 20  # one collective every 20 nodes
P2P_EVERY = 500  # one send + one recv (ring) every 500 nodes
COLL_TYPES = (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER)
COMPUTE_NAMES = ("aten::mm", "aten::add", "aten::relu", "aten::layer_norm", "aten::softmax", "aten::gelu")


def generate_rank(run_dir: Path, rank: int, world: int, nodes: int) -> int:
    """Write one rank's trace: a chain of compute nodes with collectives and ring p2p mixed in."""
    base = [(Attr.STREAM, 0), (Attr.IS_CPU_OP, True), (Attr.STEP, 0)]
    comp = [node_template(n, NodeType.COMP, base) for n in COMPUTE_NAMES]
    coll = {
        t: node_template(
            f"c10d::{t.name.lower()}_",
            NodeType.COMM_COLL,
            [*base, (Attr.COMM_TYPE, int(t)), (Attr.COMM_SIZE, 1 << 20), (Attr.PG_NAME, "0"), (Attr.SEQ, 0)],
        )
        for t in COLL_TYPES
    }
    p2p = [(Attr.COMM_SIZE, 65536), (Attr.COMM_TAG, 7), (Attr.PG_NAME, "0")]
    send = node_template(
        "c10d::send",
        NodeType.COMM_SEND,
        [*base, (Attr.COMM_SRC, rank), (Attr.COMM_DST, (rank + 1) % world), *p2p],
    )
    recv = node_template(
        "c10d::recv_",
        NodeType.COMM_RECV,
        [*base, (Attr.COMM_SRC, (rank - 1) % world), (Attr.COMM_DST, rank), *p2p],
    )
    t = 0
    seq = 0
    with EtWriter(rank_file(run_dir, rank), {"rank": rank, "world_size": world}) as w:
        w.write_raw(encode_message(pb.Node(id=0, name="ProfilerStep#0", type=int(NodeType.COMP))))
        for i in range(1, nodes):
            if i % P2P_EVERY == 0:
                node = send if rank % 2 == 0 else recv
            elif i % P2P_EVERY == 1 and i > 1:
                node = recv if rank % 2 == 0 else send
            elif i % COLL_EVERY == 0:
                node = coll[COLL_TYPES[seq % len(COLL_TYPES)]]
                node.attr[-1].int64_val = seq
                seq += 1
            else:
                node = comp[i % len(COMPUTE_NAMES)]
            dur = 1000 + (i * 7919 + rank * 104729) % 50_000
            node.id = i
            node.ctrl_deps[0] = i - 1
            node.start_time_micros = t // 1000
            node.duration_micros = dur // 1000
            node.attr[0].int64_val = t
            node.attr[1].int64_val = dur
            w.write_raw(encode_message(node))
            t += dur
    return nodes


def generate(run_dir: Path, world: int, nodes: int, procs: int) -> None:
    """Write a ``world``-rank run of ``nodes`` nodes per rank, one process per rank file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        pool.starmap(generate_rank, [(run_dir, r, world, nodes) for r in range(world)])
    write_manifest(
        run_dir,
        Manifest(
            world_size=world,
            ranks=tuple(range(world)),
            process_groups=(ProcessGroupInfo(name="0", ranks=tuple(range(world)), desc="default_pg"),),
            backend="gloo",
            source="synthetic",
        ),
    )


def convert(run_dir: Path, out_dir: Path, workers: int | None) -> dict[str, float]:
    """Run the export (in this process) and report its wall time and rusage peaks."""
    from skewlens.profiler.store.parquet import export_run

    t0 = time.perf_counter()
    summary = export_run(run_dir, out_dir, workers=workers)
    dt = time.perf_counter() - t0
    return {
        "seconds": dt,
        "nodes": summary.rows["nodes"],
        "collective_rows": summary.rows["collectives"],
        "p2p_rows": summary.rows["p2p"],
        "errors": sum(1 for i in summary.issues if i.severity.value == "error"),
        "maxrss_self_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(run_dir: Path, out_dir: Path, workers: int | None) -> dict[str, float]:
    """Convert in a child process, sampling the summed RSS of it and its workers."""
    from proctree import watch  # a sibling, imported when used (tests load this file by path)

    cmd = [sys.executable, __file__, "--convert", str(run_dir), str(out_dir)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    seen = watch(proc)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed with exit code {proc.returncode}")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result["peak_tree_rss_mib"] = seen.peak_rss_bytes / (1 << 20)
    result["tree_cpu_seconds"] = seen.cpu_total_s
    result["nodes_per_s"] = result["nodes"] / result["seconds"]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes per rank")
    ap.add_argument("--workers", type=int, default=None, help="export worker processes (default: CPUs)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "skewlens-bench")
    ap.add_argument("--keep", action="store_true", help="keep the generated run and the Parquet output")
    ap.add_argument("--convert", nargs=2, type=Path, metavar=("RUN_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.convert:
        print(json.dumps(convert(args.convert[0], args.convert[1], args.workers)))
        return 0
    run_dir = args.workdir / f"run-{args.ranks}x{args.nodes}"
    if not (run_dir / "manifest.json").exists():
        t0 = time.perf_counter()
        generate(run_dir, args.ranks, args.nodes, procs=max(1, psutil.cpu_count() or 1))
        print(f"generated {run_dir} in {time.perf_counter() - t0:.1f} s (not timed below)")
    size = sum(f.stat().st_size for f in run_dir.glob("rank-*.et"))
    load = psutil.getloadavg()
    try:
        res = measure(run_dir, args.workdir / "parquet", args.workers)
    finally:
        if not args.keep:  # ~1 GB for the default size: do not leave it in /tmp
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(args.workdir / "parquet", ignore_errors=True)
    print(
        f"{args.ranks} ranks x {args.nodes:,} nodes = {res['nodes']:,} nodes "
        f"({size / (1 << 20):,.0f} MiB of .et)\n"
        f"export: {res['seconds']:.2f} s -> {res['nodes_per_s']:,.0f} nodes/s "
        f"(target >= 500,000) on {psutil.cpu_count()} CPUs; CPU time of the process tree "
        f"{res['tree_cpu_seconds']:.2f} s (= {res['nodes'] / res['tree_cpu_seconds']:,.0f} nodes per "
        f"CPU-second; load average before {load[0]:.1f})\n"
        f"peak RSS, conversion process + workers (sampled sum): {res['peak_tree_rss_mib']:,.0f} MiB "
        f"(target <= 1,536); ru_maxrss of the converting process itself {res['maxrss_self_mib']:,.0f} MiB\n"
        f"collective rows {res['collective_rows']:,}, p2p pairs {res['p2p_rows']:,}, errors {res['errors']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
