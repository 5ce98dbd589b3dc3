"""The replay summary's GPU columns on a compute stream that also copies (found by mutation testing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skewlens.profiler.importers import import_traces
from skewlens.replay.driver import load_trace
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

US = 1_000


def _trace(path: Path) -> Path:
    """One rank, one step of 1,000 us, one GPU stream (7): a host-to-device copy 100-300 us (launched at
    52), then a ``gemm`` kernel 400-600 us (launched at 352)."""
    evs: list[dict[str, Any]] = []

    def x(cat: str, name: str, ts: int, dur: int, **args: Any) -> None:
        pid, tid = (0, args["stream"]) if cat in ("kernel", "gpu_memcpy") else (1, 1)
        evs.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    x("user_annotation", "ProfilerStep#1", 0, 1000)
    x("cpu_op", "aten::copy_", 50, 10, **{"External id": 1})
    x("cuda_runtime", "cudaMemcpyAsync", 52, 2, correlation=1)
    x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 100, 200, device=0, stream=7, correlation=1)
    x("cpu_op", "aten::mm", 350, 10, **{"External id": 2})
    x("cuda_runtime", "cudaLaunchKernel", 352, 2, correlation=2)
    x("kernel", "gemm", 400, 200, device=0, stream=7, correlation=2)
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}
    path.write_text(json.dumps(doc))
    return path


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
