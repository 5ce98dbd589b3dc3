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
    # compiled dependencies that ../shared/cuda-wheels lacks, for the GPU machine's CPython 3.12
    msgspec=$(.venv/bin/python -c 'import msgspec; print(msgspec.__version__)')
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "msgspec==$msgspec"
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
cp_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
for w in "${wheels[@]}"; do
    case $(basename "$w") in
    *-py3-none-any.whl | *-abi3-* | *-"$cp_tag"-"$cp_tag"-*) "$PY" -m zipfile -e "$w" "$SITE" ;;
    *) echo "cuda_check: $(basename "$w") is not for this Python ($cp_tag): the installed one is used" ;;
    esac
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

# what this torch's Kineto events give the capture (skewlens.profiler.capture.kineto reads them): one of
# each kind, with the accessors it uses
import os
from collections import Counter
from torch.profiler import ProfilerActivity, profile
from skewlens.profiler.capture.kineto import activity, event_metadata, is_host_event
cuda = torch.cuda.is_available()
config, _ = experimental_config(enable_cuda_sync_events=True, expose_kineto_event_metadata=True)
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
dev = "cuda" if cuda else "cpu"
with profile(activities=acts, experimental_config=config) as prof:
    a = torch.randn(256, 256, device=dev)
    b = a @ a
    if cuda:
        s = torch.cuda.Stream()
        ev = torch.cuda.Event()
        ev.record()
        with torch.cuda.stream(s):
            s.wait_event(ev)
            c = b + 1
        torch.cuda.current_stream().wait_stream(s)
        (c.sum()).item()
        torch.cuda.synchronize()
events = list(prof.profiler.kineto_results.events())
print("_KinetoEvent accessors:", sorted(n for n in dir(events[0]) if not n.startswith("_")))
seen = Counter()
for e in events:
    key = (str(e.device_type()), activity(e), e.name().split("(")[0][:28])
    seen[key] += 1
    if seen[key] > 1:
        continue
    raw = getattr(e, "activity_type", None)
    print(f"  {key}: activity_type()={raw() if raw else 'absent'!r} corr={e.correlation_id()} "
          f"linked={getattr(e, 'linked_correlation_id', lambda: '-')()} thread={e.start_thread_id()} "
          f"resource={e.device_resource_id()} host={is_host_event(e)} meta={event_metadata(e)}")
if os.environ.get("OUT"):
    prof.export_chrome_trace(os.path.join(os.environ["OUT"], "probe_kineto.json"))
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
    # the main thread (stream 0) holds the forward pass and the optimizer; autograd's device thread the
    # backward pass, its first node of each stretch joined to the main thread (a dep on a stream-0 node)
    threads = Counter((nodes[i][1]["stream"], nodes[i][0].name.startswith("autograd::engine")) for i in host)
    print(f"     host streams (stream, engine op): {dict(sorted(threads.items()))}")
    engine = sorted((nodes[i][1].get("skl_start_ns", 0), i) for i in host if nodes[i][0].name.startswith("autograd::engine"))
    forked = sum(1 for _, i in engine if any(nodes.get(d, (None, {}))[1].get("stream") == 0 and kind.get(d) == "thread" for d in nodes[i][0].ctrl_deps))
    print(f"     engine nodes with a dependency on the main thread: {forked} of {len(engine)}")
    print(f"     GPU streams (node count): {dict(streams)}")
    print(f"     kernels (top 5): {names.most_common(5)}")
    inside = Counter(nodes[nodes[i][1]["skl_launched_in"]][0].name[:40] for i in gpu
                     if nodes[i][1].get("skl_launched_in") in nodes)
    print(f"     launch: {len(with_ns)} GPU nodes with skl_launch_ns, {launch} with a launch edge"
          + (f"; launch-to-start median {statistics.median(lag) / 1e3:.1f} us" if lag else "")
          + f"; {sum(inside.values())} launched in an op that then waited on them (skl_launched_in): {dict(inside)}")
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
skipped=0
# CUDA_CHECK_RUNS (space-separated capture names) runs only those; CUDA_CHECK_BUDGET_S: no new capture or step starts after that many seconds, so that a device lease's
# limit leaves time for the archive below
DEADLINE=$((SECONDS + ${CUDA_CHECK_BUDGET_S:-86400}))
late() {
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
        echo "--- skipped (CUDA_CHECK_BUDGET_S spent): $1"
        skipped=$((skipped + 1))
        return 0
    fi
    return 1
}

capture() {  # capture NAME LEVEL NPROC SCRIPT [ARGS...]: one skewlens profile run, then its report
    local name=$1 level=$2 nproc=$3
    shift 3
    local out=$WORK/$name rc=0
    # CUDA_CHECK_RUNS: the names of the captures to run (all when unset)
    if [ -n "${CUDA_CHECK_RUNS:-}" ] && [[ " $CUDA_CHECK_RUNS " != *" $name "* ]]; then
        return 0
    fi
    late "capture $name" && return 0
    echo
    echo "### $name: --level $level, $nproc rank(s): $*"
    timeout 180 "$PY" -m skewlens profile --out "$out" --level "$level" --steps 1:1:2 --clock-timeout 10 -- \
        "$PY" -m torch.distributed.run --standalone --nproc-per-node="$nproc" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || [ ! -f "$out/manifest.json" ]; then
        echo "FAILED (exit $rc); the last lines of its output:"
        tail -n 25 "$WORK/$name.log"
        failed=$((failed + 1))
        return 0
    fi
    "$PY" "$WORK/report.py" "$out" || failed=$((failed + 1))
    "$PY" -m skewlens check --no-progress "$out" 2>&1 | tail -n 4 || true
    # what stands on the capture: the analyses (GPU execution model, blame) and the simulated replay
    step "$name: analyze" 180 "$PY" -m skewlens analyze "$out" --out "$out-analysis" --max-simulations 4
    # how much of each step the critical path covers, and where it stops
    [ -f "$out-analysis/critical_path.parquet" ] && "$PY" - "$out-analysis" <<'PYEOF' || true
import sys
from collections import defaultdict
import pyarrow.parquet as pq
d = sys.argv[1]
path = pq.read_table(f"{d}/critical_path.parquet").to_pylist()
step_ns = {b["step"]: b["step_ns"] for b in pq.read_table(f"{d}/step_breakdown.parquet").to_pylist()}
covered = defaultdict(int)
for p in path:
    covered[p["step"]] += p["contribution_ns"] + p["gap_before_ns"]
ends = {p["step"]: p["name"][:40] for p in path if p["via"] == "end"}
for s in sorted(covered):
    print(f"     critical path, step {s}: {covered[s] / 1e6:.2f} of {step_ns.get(s, 0) / 1e6:.2f} ms, from {ends.get(s)!r}")
PYEOF
    step "$name: replay (sim)" 120 "$PY" -m skewlens replay trace="$out" out="$out-replay" progress=false
}

step() {  # step TITLE TIMEOUT_S COMMAND...: one command on a capture, its output's end, counted if it fails
    local title=$1 limit=$2 rc=0
    shift 2
    late "$title" && return 0
    echo "--- $title"
    timeout "$limit" "$@" >"$WORK/step.log" 2>&1 || rc=$?
    tail -n "${STEP_TAIL:-30}" "$WORK/step.log"
    if [ "$rc" -ne 0 ]; then
        echo "FAILED (exit $rc): $title"
        failed=$((failed + 1))
    fi
}

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    # most telling first, so that a budget cut leaves out the least
    capture train-nccl-ops ops 1 "$ROOT"/examples/train.py --steps 5
    # the real replay on NCCL, kernels as timed device sleeps (calibrated cycles per ns)
    [ -f "$WORK/train-nccl-ops/manifest.json" ] && step "train-nccl-ops: replay (real, NCCL)" 180 \
        "$PY" -m skewlens replay mode=real trace="$WORK/train-nccl-ops" out="$WORK/train-nccl-ops-real" progress=false
    capture train-nccl-full full 1 "$ROOT"/examples/train.py --steps 5
    capture ddp-gloo-cuda-ops ops 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/ddp_accum.py --steps 5
    capture ddp-nccl-ops ops 1 "$ROOT"/examples/ddp_accum.py --steps 5
    capture train-nccl-collectives collectives 1 "$ROOT"/examples/train.py --steps 5
    capture ddp-gloo-cuda-collectives collectives 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/ddp_accum.py --steps 5
    capture fsdp2-gloo-cuda-ops ops 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/fsdp2.py --steps 5
    # the other bundled workloads (their torch APIs on this torch, their streams on a GPU); the pipeline
    # on CPU only: gloo sends no CUDA tensor point to point (its send fails with "writev ... Bad
    # address"), and NCCL on one GPU runs one rank, one stage
    CUDA_VISIBLE_DEVICES= capture pipeline-1f1b-cpu-ops ops 2 "$ROOT"/examples/pipeline.py --schedule 1f1b --steps 5
    capture tp-gloo-cuda-ops ops 2 "$WORK/gloo_cuda.py" "$ROOT"/examples/tp.py --steps 5
    capture ddp-compile-nccl-ops ops 1 "$ROOT"/examples/ddp_accum.py --compile --steps 5
    capture mesh2d-gloo-cuda-ops ops 4 "$WORK/gloo_cuda.py" "$ROOT"/examples/mesh2d.py --steps 5
else
    echo "cuda_check: no CUDA here: one CPU capture through the same steps, to check the script"
    capture train-cpu-ops ops 1 "$ROOT"/examples/train.py --steps 4
    [ -f "$WORK/train-cpu-ops/manifest.json" ] && step "train-cpu-ops: replay (real, gloo)" 240 \
        "$PY" -m skewlens replay mode=real trace="$WORK/train-cpu-ops" out="$WORK/train-cpu-ops-real" progress=false
fi

if [ -n "${OUT:-}" ]; then
    # the device tool brings back at most 8 files: a summary, and one archive of the rest (manifests,
    # traces under 8 MB, the analyses' and replays' tables and reports, every log)
    {
        for d in "$WORK"/*/; do
            [ -f "$d/manifest.json" ] && "$PY" "$WORK/report.py" "$d"
        done
    } >"$OUT/summary.txt" 2>&1 || true
    (cd "$WORK" && find . -path ./site -prune -o -path ./cache -prune -o -type f -size -8M \
        \( -name '*.json' -o -name '*.et' -o -name '*.log' -o -name '*.txt' -o -name '*.md' \
        -o -name '*.parquet' -o -name '*.yaml' -o -name '*.png' \) -print |
        tar -czf "$OUT/cuda_check.tar.gz" -T -) || true
fi
echo
echo "cuda_check: $failed run(s) failed, $skipped skipped; work folder $WORK"
[ "$failed" -eq 0 ]
