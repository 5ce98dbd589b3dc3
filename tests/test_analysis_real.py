"""The analyses on the real 8-GPU DLRM traces (NCCL kernels on CUDA streams), checked against the raw JSON.

The expected values are recomputed here from the Kineto files themselves: on every rank the k-th NCCL
kernel (by ``ts``) is the k-th collective; its arrival is the kernel's ``ts`` (µs). A few values read by
hand from the files are pinned too (the first all_to_all: rank 7 arrives last, rank 1 waits longest,
7.624 ms of skew).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from conftest import SHARED_TRACES

from skewlens.analysis import AnalysisResult, analyze_run
from skewlens.profiler.store import load_run

US = 1000


def _raw_nccl_kernels(kineto_tar: Path) -> dict[int, list[dict[str, float]]]:
    out: dict[int, list[dict[str, float]]] = {}
    with tarfile.open(kineto_tar) as tf:
        for m in tf.getmembers():
            if not m.name.endswith(".json"):
                continue
            f = tf.extractfile(m)
            assert f is not None
            data = json.load(f)
            rank = int(data["distributedInfo"]["rank"])
            ks = [
                e
                for e in data["traceEvents"]
                if e.get("cat") == "kernel"
                and str(e.get("name", "")).startswith(("ncclKernel", "ncclDevKernel"))
            ]
            out[rank] = sorted(({"ts": e["ts"], "dur": e["dur"]} for e in ks), key=lambda k: k["ts"])
    return out


@pytest.fixture(scope="module")
def dlrm(dlrm_imported: Path) -> tuple[AnalysisResult, dict]:
    result = analyze_run(load_run(dlrm_imported))
    return result, _raw_nccl_kernels(SHARED_TRACES / "dlrm_8gpu_kineto.tar.gz")


def test_all_to_all_skew_and_waits_match_the_raw_kernels(dlrm: tuple[AnalysisResult, dict]) -> None:
    result, raw = dlrm
    events = sorted((e for e in result.skew.events if e.kind == "collective"), key=lambda e: e.seq)
    assert len(events) == len(raw[0])
    for k, e in enumerate(events):
        arrivals = {r: round(raw[r][k]["ts"] * US) for r in e.ranks}
        last = max(arrivals.values())
        assert e.skew_ns == last - min(arrivals.values())
        assert arrivals[e.late_rank] == last
        for r, w in zip(e.ranks, e.wait_ns.tolist(), strict=True):
            assert w == min(last - arrivals[r], round(raw[r][k]["dur"] * US))
    first = events[0]
    assert first.comm_type == "ALL_TO_ALL"
    waits = dict(zip(first.ranks, first.wait_ns.tolist(), strict=True))
    assert first.late_rank == 7
    assert max(waits, key=waits.__getitem__) == 1
    assert first.skew_ns == 7_624_000


def test_breakdown_and_critical_path_are_consistent_on_gpu_streams(dlrm: tuple[AnalysisResult, dict]) -> None:
    result, _raw = dlrm
    assert {b.rank for b in result.breakdown} == set(range(8))
    for b in result.breakdown:
        assert b.compute_ns + b.exposed_wait_ns + b.exposed_transfer_ns + b.idle_ns == b.step_ns
        assert b.compute_ns > 0
    # kernels run on separate streams: some NCCL time is hidden under compute on some rank
    assert any(b.overlapped_comm_ns > 0 for b in result.breakdown)
    steps = {r.step for r in result.critical_path}
    for s in steps:
        path = [r for r in result.critical_path if r.step == s]
        span = path[0].end_ns - path[-1].start_ns
        assert sum(r.contribution_ns + r.gap_before_ns for r in path) == span


def test_blame_runs_on_the_real_traces(dlrm: tuple[AnalysisResult, dict]) -> None:
    result, _raw = dlrm
    recs = result.stragglers
    assert sorted(r.rank for r in recs) == list(range(8))
    assert all(r.baseline_ns > 0 for r in recs)
    costs = [r.straggler_cost_ns for r in recs]
    assert costs == sorted(costs, reverse=True)
