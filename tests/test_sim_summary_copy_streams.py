"""The replay summary's GPU columns on a compute stream that also copies, and a step that ends with its
last kernel (found by mutation testing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from skewlens.profiler.importers import import_traces
from skewlens.replay.driver import load_trace
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

US = 1_000


def _event(cat: str, name: str, ts: int, dur: int, **args: Any) -> dict[str, Any]:
    """A Kineto complete event (us): GPU work on its stream's thread, host work on thread 1."""
    pid, tid = (0, args["stream"]) if cat in ("kernel", "gpu_memcpy") else (1, 1)
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(path: Path, evs: list[dict[str, Any]]) -> Path:
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}
    path.write_text(json.dumps(doc))
    return path


def _trace(path: Path) -> Path:
    """One rank, one step of 1,000 us, one GPU stream (7): a host-to-device copy 100-300 us (launched at
    52), then a ``gemm`` kernel 400-600 us (launched at 352)."""
    return _write(
        path,
        [
            _event("user_annotation", "ProfilerStep#1", 0, 1000),
            _event("cpu_op", "aten::copy_", 50, 10, **{"External id": 1}),
            _event("cuda_runtime", "cudaMemcpyAsync", 52, 2, correlation=1),
            _event(
                "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 100, 200, device=0, stream=7, correlation=1
            ),
            _event("cpu_op", "aten::mm", 350, 10, **{"External id": 2}),
            _event("cuda_runtime", "cudaLaunchKernel", 352, 2, correlation=2),
            _event("kernel", "gemm", 400, 200, device=0, stream=7, correlation=2),
        ],
    )


def test_the_gpu_idle_time_of_a_compute_stream_that_also_copies_is_its_time_running_nothing(
    tmp_path: Path,
) -> None:
    import_traces([_trace(tmp_path / "trace.json")], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    (s,) = summarize(run, simulate(run))
    assert s.gpu_stream == 7
    assert s.step_time_ns == 1000 * US
    assert s.gpu_busy_ns == (200 + 200) * US  # the copy and the kernel
    assert s.gpu_idle_ns == (1000 - 400) * US  # not less the kernel alone


def test_a_step_whose_last_kernel_ends_at_its_end_mark_ends_no_sooner_than_that_kernel_replayed(
    tmp_path: Path,
) -> None:
    # step 1 is marked 0-1000 us; "gemm" (launched at 52) runs 100-1000 us, "aten::add" on the host
    # 900-1000 us: both end at the mark. "gemm" 300 us longer ends at 1300 us, "aten::add" still at 1000:
    # the step ends no sooner than its GPU rows that ended by its mark, so at 1300 us
    evs = [
        _event("user_annotation", "ProfilerStep#1", 0, 1000),
        _event("cpu_op", "aten::mm", 50, 10, **{"External id": 1}),
        _event("cuda_runtime", "cudaLaunchKernel", 52, 2, correlation=1),
        _event("kernel", "gemm", 100, 900, device=0, stream=7, correlation=1),
        _event("cpu_op", "aten::add", 900, 100, **{"External id": 2}),
    ]
    import_traces([_write(tmp_path / "trace.json", evs)], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    rt = run.ranks[0]
    longer = np.full(len(rt), -1, dtype=np.int64)
    longer[next(i for i in range(len(rt)) if rt.name(i) == "gemm")] = 1200 * US
    (s,) = summarize(run, simulate(run, dur_override={0: longer}))
    assert (s.recorded_step_ns, s.step_time_ns) == (1000 * US, (100 + 1200) * US)
