"""Benchmark: ``skewlens import`` wall time, CPU time and peak memory; and the JSON parsers compared.

    .venv/bin/python benchmarks/import_throughput.py                  # 32 ranks x ~200,000 events
    .venv/bin/python benchmarks/import_throughput.py --input ../shared/traces/nccl_16gpu_rank0_kineto.json.gz
    .venv/bin/python benchmarks/import_throughput.py --grow           # one rank at 1x and 2x the events
    .venv/bin/python benchmarks/import_throughput.py --compare-json FILE  # json, orjson, msgspec, pysimdjson

The synthetic input (``profiler.synth_gpu``: ``--ranks`` ranks, ``--layers`` x ``--steps``; 624 x 20 gives
200,267 Kineto events per rank, 39 MB of JSON) is written once under ``--workdir`` and reused. Each import
runs ``python -m skewlens import --quiet`` in a child process (``--repeat`` times); the resident memory of
its process tree (the CLI, its forkserver and workers) is summed every 20 ms with psutil, and its CPU time
is the children's rusage after it exited, plus what the samples saw of processes not reaped by it.
The machine's other load shows as wall time above CPU time / cores: compare CPU times across machines.
Extra environment (``PYTHONPATH`` to another checkout) applies to the child: that measures another version
(run it from outside this checkout, whose folder ``python -m`` puts first on the path).

``--compare-json`` parses each file in a fresh process per parser (each only if installed in ``--python``'s
environment, which must import skewlens: e.g. ``PYTHONPATH=.``) and reports CPU
time, wall time and the memory added while parsing and reading each kept event's fields (name, times,
pid, tid, correlation, stream, device): json, orjson and msgspec build the whole tree, pysimdjson a proxy
per value read, "msgspec-typed" the importer's typed decoding (``kineto._DOC``: Structs with only the keys
read); "skewlens" is the importer's whole reading (``kineto.load_kineto``, down to ``KEvent`` records).
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PARSERS = ("json", "orjson", "msgspec", "simdjson", "msgspec-typed", "skewlens")


def synthetic(workdir: Path, ranks: int, layers: int, steps: int) -> Path:
    """The synthetic run's folder, written on first use."""
    from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run

    d = workdir / f"synth_w{ranks}_l{layers}_s{steps}"
    done = d / ".complete"
    if not done.exists():
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.perf_counter()
        write_gpu_run(GpuRunSpec(world_size=ranks, layers=layers, steps=steps), d)
        done.write_text("")
        print(f"wrote {d} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return d


def measure(cmd: list[str]) -> dict[str, float]:
    """Run ``cmd``; wall s, CPU s of its process tree, peak summed RSS (bytes)."""
    from proctree import watch  # a sibling, imported when used (tests load this file by path)

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = watch(proc)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # the forkserver and its workers are not always reaped by the CLI: add what the samples saw beyond it
    sampled = seen.cpu_total_s
    return {"wall_s": wall, "cpu_s": max(reaped, sampled), "peak_rss": float(seen.peak_rss_bytes)}


def count_events(path: Path) -> int:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return len(json.loads(data)["traceEvents"])


def run_import(inputs: list[Path], out: Path, repeat: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "skewlens", "import", "--quiet", "--force", "--out", str(out), "--kineto"]
    cmd += [str(p) for p in inputs] + extra
    rows = []
    for k in range(repeat):
        m = measure(cmd)
        rows.append(m)
        print(
            f"run {k + 1}: wall {m['wall_s']:.1f} s  cpu {m['cpu_s']:.1f} s  "
            f"peak RSS {m['peak_rss'] / 2**20:.0f} MiB"
        )
    if repeat > 1:
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(
            f"median of {repeat}: wall {med['wall_s']:.1f} s  cpu {med['cpu_s']:.1f} s  "
            f"peak RSS {med['peak_rss'] / 2**20:.0f} MiB"
        )


_PARSE = r"""
import gzip, resource, sys, time
from typing import Any
path, how = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
del raw
KEPT = {"cpu_op", "user_annotation", "cuda_sync", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
        "cuda_driver"}
try:
    if how == "json":
        import json as lib; loads = lib.loads
    elif how == "orjson":
        import orjson as lib; loads = lib.loads
    elif how == "msgspec":
        import msgspec as lib; loads = lib.json.decode
    elif how in ("msgspec-typed", "skewlens"):
        import msgspec as lib
        from skewlens.profiler.importers import kineto
    elif how == "simdjson":
        import simdjson as lib
except ImportError:
    print("not installed"); sys.exit(0)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0, c0 = time.perf_counter(), time.process_time()
n = 0
if how == "skewlens":
    from pathlib import Path
    kt = kineto.load_kineto(data, Path(path), rank=0, max_bytes=len(data))
    n = len(kt.cpu_ops) + len(kt.annotations) + len(kt.gpu) + len(kt.launches) + len(kt.syncs)
elif how == "msgspec-typed":
    for e in kineto._DOC.decode(data).traceEvents:
        if e.ph == "X" and e.cat in KEPT:
            n += 1
            (e.name, e.ts, e.dur, e.pid, e.tid, e.args.correlation, e.args.stream, e.args.device)
elif how == "simdjson":
    for e in lib.Parser().parse(data)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in KEPT:
            n += 1
            (e["name"], e["ts"], e.get("dur"), e["pid"], e["tid"])
            a = e.get("args")
            if a is not None:
                (a.get("correlation"), a.get("stream"), a.get("device"))
else:
    for e in loads(data)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in KEPT:
            n += 1
            a = e.get("args", {})
            (e["name"], e["ts"], e.get("dur"), e["pid"], e["tid"])
            (a.get("correlation"), a.get("stream"), a.get("device"))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
print(f"cpu {cpu:.2f} s  wall {wall:.2f} s  +{added:.0f} MiB  ({n} kept events; {lib.__name__} "
      f"{getattr(lib, '__version__', '')})")
"""


def compare_json(files: list[Path], repeat: int, python: str) -> None:
    for f in files:
        size = len(gzip.decompress(f.read_bytes())) if f.name.endswith(".gz") else f.stat().st_size
        print(f"{f} ({size / 1e6:.1f} MB of JSON)")
        for how in PARSERS:
            for _ in range(repeat):
                r = subprocess.run(
                    [python, "-c", _PARSE, str(f), how], capture_output=True, text=True, check=False
                )
                print(f"  {how:14s} {(r.stdout or r.stderr).strip().splitlines()[-1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path, nargs="+", help="traces to import (default: the synthetic run)")
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--layers", type=int, default=624)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/skl_import_bench"))
    ap.add_argument("--out", type=Path, default=None, help="run directory to write (default: WORKDIR/run)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--grow", action="store_true", help="one rank at --steps and 2 x --steps")
    ap.add_argument("--compare-json", type=Path, nargs="*", metavar="FILE", default=None)
    ap.add_argument("--python", default=sys.executable, help="--compare-json: interpreter with the parsers")
    ap.add_argument("--import-args", nargs=argparse.REMAINDER, default=[], help="more `skewlens import` args")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.compare_json is not None:
        synth = synthetic(args.workdir, 2, args.layers, args.steps) / "rank0_kineto.json.gz"
        files = args.compare_json or [synth]
        compare_json(files, args.repeat, args.python)
        return
    out = args.out or args.workdir / "run"
    if args.grow:
        for steps in (args.steps, 2 * args.steps):
            f = synthetic(args.workdir, 2, args.layers, steps) / "rank0_kineto.json.gz"
            print(f"one rank, {count_events(f):,} events ({f})")
            run_import([f], out, args.repeat, args.import_args)
        return
    inputs = args.input or [synthetic(args.workdir, args.ranks, args.layers, args.steps)]
    print(f"importing {', '.join(map(str, inputs))}")
    run_import(inputs, out, args.repeat, args.import_args)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
