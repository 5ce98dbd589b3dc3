#!/usr/bin/env bash
# The capture on a real GPU, in a few minutes: NCCL and gloo-with-CUDA-tensors ranks at the ops and
# collectives levels, and what the traces show (kernels, streams, launch, event-wait and synchronisation
# edges, the flight recorder's device times, the manifest notes).
#
#   bash scripts/cuda_check.sh --prepare   # here: skewlens's wheel and ../shared/cuda-wheels into .whl/
#   bash scripts/cuda_check.sh             # on the GPU machine (.whl/ carried along); no registry needed
#
# The GPU machine has torch (2.11+), numpy, pyarrow, rich, matplotlib and psutil; .whl/ brings skewlens
# and the rest (hydra-core, omegaconf, antlr4, mlc-chakra, protobuf), unpacked into a folder put on
# PYTHONPATH, so neither pip nor setuptools is needed there. Without CUDA (this machine) it runs one
# CPU capture through the same steps instead, to check the script itself. Results go to stdout, and to
# $OUT (summary.txt, the manifests, small traces) when set. PYTHON picks the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac # the script changes folder
WHEELS=$ROOT/${SKEWLENS_WHEELS:-.whl}

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/skewlens-*.whl
    .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" .
    cp -f ../shared/cuda-wheels/*.whl "$WHEELS"/
    ls -l "$WHEELS"
    exit 0
fi

WORK=$(mktemp -d /tmp/skl-cuda-check.XXXXXX)
SITE=$WORK/site
mkdir -p "$SITE"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "cuda_check: no wheels in $WHEELS (run 'bash scripts/cuda_check.sh --prepare' first)" >&2
    exit 2
fi
for w in "${wheels[@]}"; do
    "$PY" -m zipfile -e "$w" "$SITE"
done
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export SKEWLENS_CACHE_DIR=$WORK/cache # the native gloo-event recorder is built there
cd "$WORK"                            # so that the checkout's own skewlens/ folder is not imported
"$PY" - <<'EOF'
import importlib, sys
import torch
import skewlens
for name in ("hydra", "omegaconf", "google.protobuf", "chakra.schema.protobuf.et_def_pb2"):
    importlib.import_module(name)
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, skewlens from {skewlens.__file__}")
print(f"cuda: {torch.cuda.is_available()}", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
c10d = torch._C._distributed_c10d
print("flight recorder dumps:", [n for n in ("_dump_nccl_trace_json", "_dump_fr_trace_json") if hasattr(c10d, n)])
from skewlens.profiler.capture.compat import experimental_config
_, missing = experimental_config(enable_cuda_sync_events=True, expose_kineto_event_metadata=True, capture_overload_names=True)
print("profiler options this torch lacks:", list(missing) or "none")
EOF

# gloo with CUDA tensors on one GPU: the examples pick NCCL whenever CUDA is there, and each rank its own
# GPU by LOCAL_RANK; this runs an example with gloo and every rank on cuda:0
cat >"$WORK/gloo_cuda.py" <<'EOF'
import os, runpy, sys
import torch.distributed as dist

_init = dist.init_process_group


def _gloo(backend=None, *args, **kwargs):
    kwargs.pop("device_id", None)
    return _init("gloo", *args, **kwargs)


dist.init_process_group = _gloo
os.environ["LOCAL_RANK"] = "0"
script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
EOF

cat >"$WORK/report.py" <<'EOF'
"""What one run directory's traces show of the CUDA capture."""
import json, statistics, sys
from collections import Counter
from pathlib import Path
from skewlens.profiler.chakra_io import node_attrs, read_et

run = Path(sys.argv[1])
m = json.loads((run / "manifest.json").read_text())
print(f"== {run.name}: level {m['level']}, backend {m['backend']}, ranks {m['ranks']}, devices {m['devices']}, torch {m['torch_version']}")
for k, v in sorted(m["notes"].items()):
    print(f"   note [{k}]: {v}")
for r in m["ranks"]:
    et = read_et(run / f"rank-{r}.et")
    nodes = {n.id: (n, node_attrs(n)) for n in et.nodes}
    kind = {i: a.get("skl_stream_kind", "") for i, (n, a) in nodes.items()}
    gpu = [i for i in nodes if kind[i] == "cuda"]
    host = [i for i in nodes if kind[i] == "thread"]
    comm = [i for i, (n, a) in nodes.items() if "comm_type" in a or "comm_src" in a]
    streams = Counter(nodes[i][1]["stream"] for i in gpu)
    names = Counter(nodes[i][0].name[:60] for i in gpu)
    launch = sum(1 for i in gpu if any(kind.get(d) == "thread" for d in nodes[i][0].ctrl_deps))
    with_ns = [i for i in gpu if "skl_launch_ns" in nodes[i][1]]
    lag = [nodes[i][1]["skl_start_ns"] - nodes[i][1]["skl_launch_ns"] for i in with_ns if "skl_start_ns" in nodes[i][1]]
    waits = [(i, d) for i in gpu for d in nodes[i][0].ctrl_deps
             if (kind.get(d) == "cuda" and nodes[d][1]["stream"] != nodes[i][1]["stream"]) or d in comm]
    syncs = [(i, d) for i in host for d in nodes[i][0].ctrl_deps if kind.get(d) == "cuda"]
    on_comm = [(i, d) for i in host for d in nodes[i][0].ctrl_deps if d in comm]
    print(f"   rank {r}: {len(nodes)} nodes, {len(host)} host, {len(gpu)} GPU, {len(comm)} comm")
    print(f"     GPU streams (node count): {dict(streams)}")
    print(f"     kernels (top 5): {names.most_common(5)}")
    print(f"     launch: {len(with_ns)} GPU nodes with skl_launch_ns, {launch} with a launch edge"
          + (f"; launch-to-start median {statistics.median(lag) / 1e3:.1f} us" if lag else ""))
    print(f"     event waits (GPU -> GPU of another stream or a comm node): {len(waits)}"
          + "".join(f"\n       {nodes[i][0].name[:40]} (s {nodes[i][1]['stream']}) <- {nodes[d][0].name[:40]} (s {nodes[d][1].get('stream')})" for i, d in waits[:4]))
    print(f"     host synchronisations (host -> GPU): {len(syncs)}"
          + "".join(f"\n       {nodes[i][0].name[:40]} <- {nodes[d][0].name[:40]}" for i, d in syncs[:4]))
    print(f"     host waits on comm nodes: {len(on_comm)}")
    per_op = {}
    for i in comm:
        n, a = nodes[i]
        per_op.setdefault(n.name, []).append(a.get("skl_dur_ns", n.duration_micros * 1000))
    for op, ds in sorted(per_op.items()):
        print(f"     comm {op}: {len(ds)}, duration median {statistics.median(ds) / 1e3:.1f} us, max {max(ds) / 1e3:.1f} us, zero {sum(1 for d in ds if d == 0)}")
EOF

failed=0
capture() {  # capture NAME LEVEL NPROC SCRIPT [ARGS...]: one skewlens profile run, then its report
    local name=$1 level=$2 nproc=$3
    shift 3
    local out=$WORK/$name rc=0
    echo
    echo "### $name: --level $level, $nproc rank(s): $*"
    timeout 300 "$PY" -m skewlens profile --out "$out" --level "$level" --steps 1:1:2 --clock-timeout 10 -- \
        "$PY" -m torch.distributed.run --standalone --nproc-per-node="$nproc" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || [ ! -f "$out/manifest.json" ]; then
        echo "FAILED (exit $rc); the last lines of its output:"
        tail -n 25 "$WORK/$name.log"
        failed=$((failed + 1))
        return 0
    fi
    "$PY" "$WORK/report.py" "$out" || failed=$((failed + 1))
    "$PY" -m skewlens check --no-progress "$out" 2>&1 | tail -n 4 || true
}

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    capture train-nccl-ops ops 1 "$ROOT"/examples/train.py --steps 5
    capture train-nccl-collectives collectives 1 "$ROOT"/examples/train.py --steps 5
    capture ddp-gloo-cuda-ops ops 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/ddp_accum.py --steps 5
    capture ddp-gloo-cuda-collectives collectives 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/ddp_accum.py --steps 5
    capture ddp-nccl-ops ops 1 "$ROOT"/examples/ddp_accum.py --steps 5
else
    echo "cuda_check: no CUDA here: one CPU capture through the same steps, to check the script"
    capture train-cpu-ops ops 1 "$ROOT"/examples/train.py --steps 4
fi

if [ -n "${OUT:-}" ]; then
    {
        for d in "$WORK"/*/; do
            [ -f "$d/manifest.json" ] && "$PY" "$WORK/report.py" "$d"
        done
    } >"$OUT/summary.txt" 2>&1 || true
    for d in "$WORK"/*/; do
        name=$(basename "$d")
        [ -f "$d/manifest.json" ] || continue
        mkdir -p "$OUT/$name"
        cp "$d/manifest.json" "$OUT/$name/"
        find "$d" -maxdepth 1 -name 'rank-*.et' -size -8M -exec cp {} "$OUT/$name/" \;
    done
    cp "$WORK"/*.log "$OUT/" 2>/dev/null || true
fi
echo
echo "cuda_check: $failed run(s) failed; work folder $WORK"
[ "$failed" -eq 0 ]
