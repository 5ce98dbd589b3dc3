"""GPU execution semantics in the one execution model: launches, streams, event waits, host syncs, NCCL
kernels as collective members, and steps measured on the device.

Expected values are derived here from the raw Kineto JSON (or from the synthetic generator's known
schedule), not from the importer or the model under test.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import tarfile
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skewlens.analysis.api import AnalysisResult, analyze_run
from skewlens.analysis.breakdown import outlier_steps
from skewlens.analysis.render import breakdown_table
from skewlens.profiler.importers import import_traces
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, simulate_gpu_run, write_gpu_run
from skewlens.replay.driver import load_trace
from skewlens.replay.execution import RankModel, execution_model, latest_deps, launch_times
from skewlens.replay.outputs import slowest_rank_steps
from skewlens.replay.simulate import Simulator, simulate, step_times_from_spans
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.summary import replayed_step_marks, summarize

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SYNC_1 = "cuda_event_sync_kineto.json.gz"
SYNC_MULTI = "cuda_event_sync_multistream_kineto.json.gz"
SINGLE_FILES = (
    SYNC_1,
    SYNC_MULTI,
    "nccl_2gpu_rank0_kineto.json.gz",
    "nccl_16gpu_rank0_kineto.json.gz",
    "a2a_128gpu_sampled_rank0_kineto.json.gz",
)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _need(name: str) -> Path:
    p = SHARED / name
    if not p.is_file():
        pytest.skip(f"real GPU trace {p} not found (see shared/traces/README.md)")
    return p


def _raw(name: str) -> dict[str, Any]:
    with gzip.open(_need(name)) as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunTrace]:
    """Each single-file real trace imported, and the DLRM tarball (8 ranks)."""
    out: dict[str, RunTrace] = {}
    for name in (*SINGLE_FILES, "dlrm_8gpu_kineto.tar.gz"):
        if not (SHARED / name).is_file():
            continue
        d = tmp_path_factory.mktemp("gpu") / "run"
        import_traces([SHARED / name], None, d)
        out[name] = load_trace(d)
    return out


def _run(imported: dict[str, RunTrace], name: str) -> RunTrace:
    _need(name)
    return imported[name]


def _base_ns(doc: dict[str, Any]) -> int:
    return int(doc.get("baseTimeNanoseconds", 0))


def _ns(doc: dict[str, Any], ts: float) -> int:
    return _base_ns(doc) + round(ts * 1000)


def _row_of(run: RunTrace, doc: dict[str, Any], ev: dict[str, Any]) -> int:
    """Row of the node imported from event ``ev`` (by start time and name)."""
    rt = run.ranks[0]
    hits = np.flatnonzero(rt.start_ns == _ns(doc, ev["ts"]))
    hits = [int(i) for i in hits if rt.name(int(i)) == ev["name"]]
    assert len(hits) == 1, (ev["name"], ev["ts"], hits)
    return hits[0]


def _expected_sync_edges(doc: dict[str, Any]) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(stream-wait edges, host-sync edges) as (dependant event index, dependency event index), read
    straight from the JSON: the cuda_sync activities, their calls by correlation, launches by correlation."""
    evs = doc["traceEvents"]
    runtime = {
        e["args"]["correlation"]: e for e in evs if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"
    }
    gpu = [e for e in evs if e.get("cat") in GPU_CATS and e.get("ph") == "X"]

    def launch_ts(g: dict[str, Any]) -> float:
        return float(runtime[g["args"]["correlation"]]["ts"])

    def last_launched_before(stream: int, ts: float) -> dict[str, Any] | None:
        c = [g for g in gpu if g["args"]["stream"] == stream and launch_ts(g) < ts]
        return max(c, key=launch_ts) if c else None

    def first_launched_after(stream: int, ts: float) -> dict[str, Any] | None:
        c = [g for g in gpu if g["args"]["stream"] == stream and launch_ts(g) > ts]
        return min(c, key=launch_ts) if c else None

    ops = [e for e in evs if e.get("cat") == "cpu_op" and e.get("ph") == "X"]

    def host_of(call: dict[str, Any]) -> dict[str, Any]:
        around = [o for o in ops if o["ts"] <= call["ts"] <= o["ts"] + o["dur"] and o["tid"] == call["tid"]]
        return min(around, key=lambda o: o["ts"]) if around else call  # outermost op, else the call

    index = {id(e): i for i, e in enumerate(evs)}
    waits: set[tuple[int, int]] = set()
    syncs: set[tuple[int, int]] = set()
    for e in evs:
        if e.get("cat") != "cuda_sync":
            continue
        a = e["args"]
        call = runtime[a["correlation"]]
        if e["name"] == "Stream Wait Event":
            src = last_launched_before(
                a["wait_on_stream"], runtime[a["wait_on_cuda_event_record_corr_id"]]["ts"]
            )
            dst = first_launched_after(a["stream"], call["ts"])
            if src is not None and dst is not None:
                waits.add((index[id(dst)], index[id(src)]))
            continue
        if call["name"] not in ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize"):
            continue  # cudaEventQuery does not block
        if e["name"] == "Stream Sync":
            targets = [last_launched_before(a["stream"], call["ts"])]
        elif e["name"] == "Event Sync":
            rec = runtime[a["wait_on_cuda_event_record_corr_id"]]
            targets = [last_launched_before(a["wait_on_stream"], rec["ts"])]
        else:  # Context Sync: every stream
            targets = [last_launched_before(s, call["ts"]) for s in {g["args"]["stream"] for g in gpu}]
        for t in targets:
            if t is not None:
                syncs.add((index[id(host_of(call))], index[id(t)]))
    return waits, syncs


@pytest.mark.parametrize("name", [SYNC_1, SYNC_MULTI])
def test_the_cuda_sync_traces_give_the_stream_wait_and_host_sync_edges_they_record(
    imported: dict[str, RunTrace], name: str
) -> None:
    run = _run(imported, name)
    doc = _raw(name)
    evs = doc["traceEvents"]
    waits, syncs = _expected_sync_edges(doc)
    assert syncs, "each of these traces records host synchronisations"
    rt = run.ranks[0]
    m = execution_model(run).ranks[0]
    got_start = set(zip(m.start_dst.tolist(), m.start_src.tolist(), strict=True))
    got_wait = set(zip(m.wait_dst.tolist(), m.wait_src.tolist(), strict=True))
    for dst_i, src_i in waits:
        edge = (_row_of(run, doc, evs[dst_i]), _row_of(run, doc, evs[src_i]))
        assert rt.stream[edge[0]] != rt.stream[edge[1]]
        assert edge in got_start, (evs[dst_i]["name"], evs[src_i]["name"])
    for dst_i, src_i in syncs:
        edge = (_row_of(run, doc, evs[dst_i]), _row_of(run, doc, evs[src_i]))
        assert edge in got_wait, (evs[dst_i]["name"], evs[src_i]["name"])
        assert m.is_wait[edge[0]] and rt.is_cpu[edge[0]] and not rt.is_cpu[edge[1]]
    # no host sync edge other than those recorded (cudaEventQuery is not one)
    host_waits = {(d, s) for d, s in got_wait if not rt.is_cpu[s]}
    assert len(host_waits) == len(syncs)
    if name == SYNC_MULTI:
        assert len(waits) == 1  # the one Stream Wait Event with kernels on both sides


def test_a_gpu_node_depends_on_its_launch_not_on_the_end_of_the_op_that_launched_it(
    imported: dict[str, RunTrace],
) -> None:
    run = _run(imported, "nccl_2gpu_rank0_kineto.json.gz")
    rt = run.ranks[0]
    m = execution_model(run).ranks[0]
    assert rt.launch_ns is not None
    assert m.launch_dst.size > 0
    assert not rt.is_cpu[m.launch_dst].any() and rt.is_cpu[m.launch_src].all()
    launch_at = rt.start_ns[m.launch_src] + m.launch_off_ns
    np.testing.assert_array_equal(launch_at, rt.launch_ns[m.launch_dst])
    assert (rt.start_ns[m.launch_dst] >= launch_at).all()
    # the CPU runs ahead: many kernels start before the op that launched them ended
    ahead = rt.start_ns[m.launch_dst] < rt.end_ns[m.launch_src]
    assert ahead.sum() > 100
    # a host op waits on the GPU only where the trace has a synchronising call inside it
    doc = _raw("nccl_2gpu_rank0_kineto.json.gz")
    sync_calls = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaStreamSynchronize", "cudaDeviceSynchronize")
    ]
    host_wait_rows = np.unique(m.wait_dst[~rt.is_cpu[m.wait_src]])
    assert 0 < host_wait_rows.size <= len(sync_calls)
    for row in host_wait_rows.tolist():
        a, b = int(rt.start_ns[row]), int(rt.end_ns[row])
        assert any(a <= _ns(doc, e["ts"]) <= b for e in sync_calls), rt.name(row)


def _gpu_step_periods(doc: dict[str, Any]) -> dict[int, int]:
    """Per ProfilerStep: the end on the device of the GPU work launched inside it, minus the previous
    step's (the first: minus its annotation's start, or the end of the work launched before it where that
    is later: work with no launch in the trace that ran on its stream before the stream's first work
    launched in it), from the raw JSON."""
    evs = doc["traceEvents"]
    steps = sorted(
        (
            e
            for e in evs
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
        ),
        key=lambda e: e["ts"],
    )
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in evs
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e.get("ph") == "X"
        and "correlation" in e.get("args", {})
    }
    ends: dict[int, float] = defaultdict(float)
    cpu_end: dict[int, float] = defaultdict(float)
    for e in evs:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in GPU_CATS:
            t = launch.get(e["args"].get("correlation"))
            if t is None:
                continue
            ts, end = t, e["ts"] + e["dur"]
        elif e.get("cat") == "cpu_op":
            ts, end = e["ts"], e["ts"] + e["dur"]
        else:
            continue
        for s in steps:
            if s["ts"] <= ts <= s["ts"] + s["dur"]:
                k = int(s["name"].split("#")[1])
                if e.get("cat") == "cpu_op":
                    cpu_end[k] = max(cpu_end[k], end)
                else:
                    ends[k] = max(ends[k], end)
                break
    gpu = sorted((e for e in evs if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    first_launched: dict[Any, float] = {}
    for e in gpu:
        if e["args"].get("correlation") in launch:
            first_launched.setdefault(e["args"].get("stream"), e["ts"])
    before = [0.0]
    for e in gpu:
        t = launch.get(e["args"].get("correlation"))
        ahead = e["ts"] < first_launched.get(e["args"].get("stream"), -1.0)
        if (t is not None and t < steps[0]["ts"]) or (t is None and ahead):
            before.append(e["ts"] + e["dur"])
    out: dict[int, int] = {}
    prev: float | None = max(before) if max(before) > steps[0]["ts"] else None
    for s in steps:
        k = int(s["name"].split("#")[1])
        end = max(ends[k], cpu_end[k], s["ts"] + s["dur"])
        out[k] = round(((end - s["ts"]) if prev is None else (end - prev)) * 1000)
        prev = end
    return out


@pytest.mark.parametrize(
    "name",
    [
        "nccl_2gpu_rank0_kineto.json.gz",
        "nccl_16gpu_rank0_kineto.json.gz",
        "a2a_128gpu_sampled_rank0_kineto.json.gz",
    ],
)
def test_each_step_lasts_its_period_on_the_device_and_analyze_and_replay_agree(
    imported: dict[str, RunTrace], name: str
) -> None:
    run = _run(imported, name)
    expected = _gpu_step_periods(_raw(name))
    assert len(expected) >= 2
    res = simulate(run)
    replay = {s.step: s for s in summarize(run, res) if s.rank == 0}
    analysis = {b.step: b for b in analyze_run(run, blame=False).breakdown if b.rank == 0}
    assert set(expected) == set(replay) == set(analysis)
    for k, period in expected.items():
        a, s = analysis[k], replay[k]
        assert abs(a.step_ns - period) <= 0.02 * period, (k, a.step_ns, period)
        assert a.step_ns == s.recorded_step_ns
        # one measure of compute (it was 207.7 against 227.9 ms a step on the 16-GPU trace); the replay
        # reproduces a few nodes to within microseconds only (see the next test)
        assert abs(a.compute_ns - s.compute_ns) <= 0.001 * a.step_ns, (k, a.compute_ns, s.compute_ns)
        # and one measure of exposed communication, waiting and transfer (the breakdown's rule)
        assert abs(a.exposed_wait_ns - s.exposed_wait_ns) <= 0.001 * a.step_ns, (k, a, s)
        assert abs(a.exposed_transfer_ns - s.exposed_transfer_ns) <= 0.001 * a.step_ns, (k, a, s)
        # replaying the unmodified trace as recorded reproduces the step within 2%
        assert abs(s.step_time_ns - s.recorded_step_ns) <= 0.02 * s.recorded_step_ns, (k, s)
    # steps never overlap: they add up to the recorded span of the steps
    spans = sorted((b.start_ns, b.end_ns) for b in analysis.values())
    assert all(b0 <= a1 for (_a0, b0), (a1, _b1) in pairwise(spans))


@pytest.mark.parametrize(
    "name",
    [
        "nccl_2gpu_rank0_kineto.json.gz",
        "nccl_16gpu_rank0_kineto.json.gz",
        "a2a_128gpu_sampled_rank0_kineto.json.gz",
    ],
)
def test_gpu_work_belongs_to_the_step_whose_annotation_holds_its_launch_call(
    imported: dict[str, RunTrace], name: str
) -> None:
    # the 16-GPU trace's optimizer kernels are launched late in step N with no CPU op around the launch,
    # and start on the device inside step N+1's annotation: they are step N's work
    doc = _raw(name)
    spans = sorted(
        (_ns(doc, e["ts"]), _ns(doc, e["ts"] + e["dur"]), int(e["name"].split("#")[1]))
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    rt = _run(imported, name).ranks[0]
    assert rt.launch_ns is not None
    rows = np.flatnonzero(~rt.is_cpu & (rt.launch_ns >= 0))
    expected = [next((k for a, b, k in spans if a <= t <= b), -1) for t in rt.launch_ns[rows].tolist()]
    labelled = dict(zip(rows.tolist(), expected, strict=True))
    wrong = [
        (int(rt.node_id[i]), rt.name(i)[:40], int(rt.step[i]), k)
        for i, k in labelled.items()
        if rt.step[i] != k
    ]
    assert len(rows) > 100 and not wrong, wrong[:5]
    # so on each stream the steps never go back
    for st in np.unique(rt.stream[rows]).tolist():
        on = rows[rt.stream[rows] == st]
        steps = rt.step[on[np.argsort(rt.start_ns[on], kind="stable")]]
        assert (np.diff(steps[steps >= 0]) >= 0).all(), st


def test_the_critical_path_of_each_step_of_the_16_gpu_trace_spans_the_step(
    imported: dict[str, RunTrace],
) -> None:
    from skewlens.analysis.critical_path import DEVICE_GAP, shares

    res = analyze_run(_run(imported, "nccl_16gpu_rank0_kineto.json.gz"), blame=False)
    steps = {b.step: b.step_ns for b in res.breakdown}
    by_rank, by_op = shares(res.critical_path, res.index)
    assert set(by_rank) == set(steps)
    for s, ns in steps.items():
        on_path = sum(by_rank[s].values())  # from the step's first path node to its last node's end
        # the first step's path begins at its first all_to_all, 39 ms into the step: the kernel waited for
        # nothing in the trace after the work launched before the profiler started (untraced peers); that
        # work is no step's, so the path does not go on into it (it read 370.6 of 371.6 ms through it)
        assert (0.9 if s != min(steps) else 0.8) * ns <= on_path <= ns, (s, on_path, ns)
        assert "(host gap)" not in by_op[s] or by_op[s]["(host gap)"] < by_op[s][DEVICE_GAP]


def test_the_16_gpu_trace_runs_about_213_ms_per_step_not_375_its_first_step_too(
    imported: dict[str, RunTrace],
) -> None:
    run = _run(imported, "nccl_16gpu_rank0_kineto.json.gz")
    steps = sorted((b.step, b.step_ns) for b in analyze_run(run, blame=False).breakdown)
    # the first too: it begins where the work launched before the profiler started ended on the device
    # (155 ms into its annotation; it read 371.6 ms)
    assert all(205e6 <= ns <= 220e6 for _s, ns in steps), steps
    spans = [(b.start_ns, b.end_ns) for b in analyze_run(run, blame=False).breakdown]
    assert sum(ns for _s, ns in steps) == max(b for _a, b in spans) - min(a for a, _b in spans)


@pytest.mark.parametrize("name", [*SINGLE_FILES, "dlrm_8gpu_kineto.tar.gz"])
def test_replaying_a_real_gpu_trace_as_recorded_reproduces_every_node(
    imported: dict[str, RunTrace], name: str
) -> None:
    run = _run(imported, name)
    res = simulate(run)
    for r, rt in run.ranks.items():
        timed = rt.node_type != 1
        d = np.abs(res.start_ns[r][timed] - rt.start_ns[timed])
        span = int(rt.end_ns[timed].max() - rt.start_ns[timed].min())
        assert d.max() <= max(0.001 * span, 100_000), (r, int(d.max()), span)


def test_a_slower_host_delays_the_kernels_it_launches(
    imported: dict[str, RunTrace],
) -> None:
    run = _run(imported, "nccl_2gpu_rank0_kineto.json.gz")
    rt = run.ranks[0]
    base = simulate(run)
    gpu = ~rt.is_cpu & (rt.node_type != 1)
    slow_host = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", ranks=(0,), factor=3.0, pattern="aten::*")])
    )
    # a host three times slower launches later: GPU work is delayed
    assert slow_host.end_ns[0][gpu].max() > base.end_ns[0][gpu].max()
    for k in sorted(base.steps()):
        assert slow_host.step_time_ns(k) >= base.step_time_ns(k)


def test_a_host_op_blocked_in_a_copy_to_pageable_memory_waits_for_the_gpu_and_its_block_is_no_work(
    imported: dict[str, RunTrace],
) -> None:
    # the 16-GPU trace's `.cpu()` copies: cudaMemcpyAsync of a DtoH copy into pageable memory, which CUDA
    # runs synchronously; the call returns ~140 ms later, when the copy (queued behind the GPU's work) ends
    name = "nccl_16gpu_rank0_kineto.json.gz"
    run, doc = _run(imported, name), _raw(name)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    copies = {e["args"]["correlation"]: e for e in evs if e.get("name") == "Memcpy DtoH (Device -> Pageable)"}
    blocked = [
        (e, copies[e["args"]["correlation"]])
        for e in evs
        if e.get("name") == "cudaMemcpyAsync"
        and e["args"].get("correlation") in copies
        and e["dur"] > 100_000
    ]
    assert len(blocked) == 5  # one a step
    for call, copy in blocked:
        t = _ns(doc, call["ts"])
        top = max(
            (i for i in np.flatnonzero(rt.is_cpu & (m.parent < 0)) if rt.start_ns[i] <= t < rt.end_ns[i]),
            key=lambda i: rt.dur_ns[i],
        )
        assert m.is_wait[top], rt.name(int(top))
        # its work is what it did after the copy ended, not the 139-147 ms it was blocked
        assert m.work_ns[top] <= rt.end_ns[top] - _ns(doc, copy["ts"] + copy["dur"]) + 2_000
    # a host twice as slow, far ahead of the GPU, leaves the device's steps as they were (they were 68%
    # longer when the blocked time counted as host work and doubled with it)
    base = simulate(run)
    slow = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", ranks=(0,), factor=2.0, pattern="aten::*")])
    )
    for k in sorted(base.steps()):
        assert slow.step_time_ns(k) <= base.step_time_ns(k) * 1.01, k


def test_host_time_blocked_on_an_idle_gpu_is_not_called_transfer(imported: dict[str, RunTrace]) -> None:
    # the 16-GPU trace's host blocks ~140 ms a step in a .cpu() copy and a device synchronise, while its
    # NCCL kernels run ~30 ms: the breakdown called the whole block exposed transfer (121 ms a step against
    # 36 ms of communication). Blocked on the GPU, the host's time is the GPU's: transfer only where an
    # NCCL kernel ran, compute where kernels did, idle where nothing did
    from skewlens.analysis.index import Coverage, build_index
    from skewlens.profiler.store.model import type_mask
    from skewlens.profiler.vocab import COMM_NODE_TYPES
    from skewlens.replay.execution import nccl_kernel_rows

    run = _run(imported, "nccl_16gpu_rank0_kineto.json.gz")
    ri = build_index(run).ranks[0]
    rt = ri.trace
    comm = type_mask(rt.node_type, COMM_NODE_TYPES) | nccl_kernel_rows(rt)  # NCCL kernels kept as COMP too
    comm_cov = Coverage.of(rt.start_ns[comm], ri.end_ns[comm])
    records = analyze_run(run, blame=False).breakdown
    assert len(records) == 5
    for b in records:
        ran = int(comm_cov.between(np.array([b.start_ns]), np.array([b.end_ns]))[0])
        assert b.exposed_wait_ns + b.exposed_transfer_ns <= ran, b.step
        assert b.idle_ns > 0.4 * b.step_ns, b.step  # the GPU idles through most of the block
        assert b.compute_ns + b.exposed_wait_ns + b.exposed_transfer_ns + b.idle_ns == b.step_ns


def _union_ns(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    """Time inside ``[a, b)`` covered by ``intervals`` (``(start, end)`` pairs; their union)."""
    total, reach = 0, a
    for lo, hi in sorted((max(lo, a), min(hi, b)) for lo, hi in intervals):
        lo = max(lo, reach)
        if hi > lo:
            total, reach = total + hi - lo, hi
    return total


def _nccl_union_ns(doc: dict[str, Any], a: int, b: int) -> int:
    """Time inside ``[a, b)`` covered by the document's NCCL kernels (their union), from the raw JSON."""
    return _union_ns(
        [
            (_ns(doc, e["ts"]), _ns(doc, e["ts"] + e["dur"]))
            for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].lower().startswith("nccl")
        ],
        a,
        b,
    )


def test_every_nccl_kernel_of_the_16_gpu_trace_is_communication_in_the_breakdown(
    imported: dict[str, RunTrace],
) -> None:
    # 5 of its NCCL kernels (one 23.8 ms) were launched before the profiling window: the importer keeps
    # them as GPU COMP (it cannot say their collective), and the breakdown counted them as compute: step
    # 550's communication read 31.7 ms where its NCCL kernels ran 56.4 ms (the raw JSON), its compute
    # 24 ms too high. Communication is the NCCL kernels' union (+ what wait nodes add: < 0.1 ms here)
    name = "nccl_16gpu_rank0_kineto.json.gz"
    doc = _raw(name)
    records = analyze_run(_run(imported, name), blame=False).breakdown
    assert len(records) == 5
    for b in records:
        comm = b.overlapped_comm_ns + b.exposed_wait_ns + b.exposed_transfer_ns
        assert abs(comm - _nccl_union_ns(doc, b.start_ns, b.end_ns)) < 100_000, b.step


@pytest.mark.parametrize("name", ["nccl_2gpu_rank0_kineto.json.gz", "nccl_16gpu_rank0_kineto.json.gz"])
def test_each_step_gives_its_gpu_compute_kernels_time_alone_as_hta_counts_compute(
    imported: dict[str, RunTrace], name: str
) -> None:
    # compute holds host operators too (the 2-GPU trace: 195.3 ms of a 222.4 ms step), which a user comparing
    # with HTA cannot use; its compute kernels alone (no NCCL kernel, copy or memset) ran 38.5 ms of it,
    # the union of those kernels in the raw JSON within the step
    kernels = _gpu_ops(
        _raw(name),
        lambda e: not e["name"].lower().startswith("nccl") and not e["name"].startswith(("Memcpy", "Memset")),
    )
    records = analyze_run(_run(imported, name), blame=False).breakdown
    assert len(records) >= 3
    for b in records:
        total = _union_ns(kernels, b.start_ns, b.end_ns)
        assert abs(b.gpu_compute_ns - total) <= 1_000, b.step
        assert 0 < b.gpu_compute_ns < b.compute_ns


def _exact_ns(x: float) -> int:
    """A Kineto time or duration (µs) in ns, in decimal arithmetic: ``ts * 1000`` in floats is off by up to a
    few hundred ns at the 16-GPU trace's magnitudes (1.7e18 ns)."""
    return x * 1000 if isinstance(x, int) else round(Decimal(repr(x)) * 1000)


def _gpu_ops(doc: dict[str, Any], keep: Callable[[dict[str, Any]], bool]) -> list[tuple[int, int]]:
    """``(start, end)`` in ns of the document's GPU activities (kernels, copies, memsets) that ``keep``."""
    return [
        (start, start + _exact_ns(e["dur"]))
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS and keep(e)
        for start in [_base_ns(doc) + _exact_ns(e["ts"])]
    ]


@pytest.mark.parametrize("name", ["nccl_2gpu_rank0_kineto.json.gz", "nccl_16gpu_rank0_kineto.json.gz"])
def test_each_steps_gpu_busy_time_is_the_union_of_every_gpu_op_of_every_stream_in_the_raw_json(
    imported: dict[str, RunTrace], name: str
) -> None:
    # HTA's temporal breakdown's idle is its window less the time any op of any stream ran (kernels, NCCL
    # kernels, copies, memsets); the breakdown had no such figure. The union of every GPU activity of the
    # raw JSON within each step, its times converted exactly (the 2-GPU trace's have fractions of a µs)
    ops = _gpu_ops(_raw(name), lambda _e: True)
    records = analyze_run(_run(imported, name), blame=False).breakdown
    assert len(records) >= 3
    for b in records:
        assert b.gpu_busy_ns == _union_ns(ops, b.start_ns, b.end_ns), b.step
        assert b.gpu_compute_ns < b.gpu_busy_ns < b.step_ns


def test_an_nccl_kernel_without_its_launch_is_communication_not_compute(tmp_path: Path) -> None:
    # a GEMM launched in the step and an NCCL SendRecv kernel issued before the profiling window (no
    # launch call, its name does not say the collective: kept as GPU COMP), overlapping the GEMM by 50 us
    pid, us = 4242, 1000
    cpu = {"ph": "X", "pid": pid, "tid": pid}
    ev: list[dict[str, Any]] = [
        {**cpu, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "args": {}},
        {**cpu, "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 20, "args": {}},
        {**cpu, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 15, "dur": 5,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 100,
         "dur": 200, "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 20, "ts": 250, "dur": 300,
         "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
         "args": {"device": 0, "stream": 20, "correlation": 2}},
    ]  # fmt: skip
    f = tmp_path / "trace.json"
    f.write_text(
        json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev})
    )
    import_traces([f], None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    (b,) = analyze_run(run, blame=False).breakdown
    assert b.compute_ns == 20 * us + 200 * us  # the host op and the GEMM, not the NCCL kernel
    assert b.overlapped_comm_ns == 50 * us
    assert (b.exposed_wait_ns, b.exposed_transfer_ns) == (0, 250 * us)
    (s,) = summarize(run, simulate(run))
    assert (s.compute_ns, s.comm_ns) == (b.compute_ns, 300 * us)  # the replay's summary counts as analyze


def test_a_replayed_gpu_step_ends_no_earlier_than_its_last_kernel(tmp_path: Path) -> None:
    # the a2a pair: rank 0's step ends as recorded with a memset, while its NCCL kernels, held up by a slower
    # rank 1, end up to a quarter of a second later in the replay; the step must end with them
    names = ["a2a_128gpu_sampled_rank0_kineto.json.gz", "a2a_128gpu_sampled_rank1_kineto.json.gz"]
    import_traces([_need(n) for n in names], None, tmp_path / "run")
    run = load_trace(tmp_path / "run", lenient=True)
    slow = simulate(run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(1,), factor=1.5)]))
    rows = {(s.rank, s.step): s for s in summarize(run, slow)}
    base = {(s.rank, s.step): s for s in summarize(run, simulate(run))}
    rt = run.ranks[0]
    for step in sorted({k for r, k in rows if r == 0}):
        gpu = np.flatnonzero(~rt.is_cpu & (rt.step == step))
        _a, _b, start, end = replayed_step_marks(run, slow)[(0, step)]
        assert end >= slow.end_ns[0][gpu].max() and end - start == rows[(0, step)].step_time_ns
    grown = sum(rows[(0, k)].step_time_ns - base[(0, k)].step_time_ns for r, k in rows if r == 0)
    assert grown > 50_000_000  # rank 0 waits on rank 1 in every all_to_all


def test_a_stall_before_a_gpu_ranks_step_is_in_that_ranks_step_though_its_host_began_it_before_the_mark(
    imported: dict[str, RunTrace],
) -> None:
    # DLRM's rank 3: its step starts (on the device) when kernel 115 of the step before ends, and its
    # host's aten::lift_fresh of step 10 ends at that same instant; the start mark followed that host op,
    # so a 50 ms stall before the step's first node moved the mark 50 ms and rank 3's step read 13.087 ms
    # (-30%) while every peer's grew by 44 ms waiting for it
    run = _run(imported, "dlrm_8gpu_kineto.tar.gz")
    stalled = simulate(
        run, effects=SlowdownModel([Slowdown(kind="stall", ranks=(3,), step=10, delay_ns=50_000_000)])
    )
    base = {s.rank: s.step_time_ns for s in summarize(run, simulate(run))}
    rows = {s.rank: s.step_time_ns for s in summarize(run, stalled)}
    rec_start, _end, start, _moved_end = replayed_step_marks(run, stalled)[(3, 10)]
    assert start == rec_start  # nothing of the step before moved
    assert rows[3] - base[3] == 44_376_000  # 50 ms less the 5.6 ms it no longer waits for its peers
    assert rows[3] == max(rows.values())


def test_a_slower_gpu_never_shortens_the_ranks_step_whose_start_is_the_end_of_kernels_launched_before_it(
    imported: dict[str, RunTrace],
) -> None:
    # DLRM's rank 3 begins its one step when the 64 kernels launched before the profiler started (in no
    # step) end. slow_gpu slowed them too, the start mark moved with them, and the step's end, bound by its
    # peers, moved less: x0.5, x1, x2, x4 read 18.796, 18.711, 18.541, 18.410 ms while its GPU's busy time
    # grew 8-fold (the sweep's mean step 18.796 -> 18.566 ms). The step now starts where it was recorded
    run = _run(imported, "dlrm_8gpu_kineto.tar.gz")
    base = {s.rank: s.step_time_ns for s in summarize(run, simulate(run))}
    marks, steps, means = [], [], []
    for factor in (0.5, 1.0, 2.0, 4.0):
        res = simulate(
            run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(3,), factor=factor, device="gpu")])
        )
        rows = {s.rank: s.step_time_ns for s in summarize(run, res)}
        marks.append(replayed_step_marks(run, res)[(3, 10)])
        steps.append(rows[3])
        means.append(max(rows.values()))
        assert {r: t for r, t in rows.items() if r != 3} == {r: t for r, t in base.items() if r != 3}
    assert {m[2] - m[0] for m in marks} == {0}  # the start mark stays where it was recorded
    assert steps == [m[3] - m[2] for m in marks]  # the step ends where its last node moved it
    assert steps[1] == base[3] and steps == sorted(steps) and steps[0] < steps[1] < steps[3]
    assert means == sorted(means)


def test_dlrms_step_is_host_bound_down_to_about_4_gb_s_and_grows_with_the_network_below_it(
    imported: dict[str, RunTrace],
) -> None:
    from skewlens.replay.network.topology import Dimension, Topology
    from skewlens.replay.render import bound_note

    # a planner's sweep at 6.25 to 200 GB/s read 18.712 ms throughout and concluded the network does not
    # matter: the step is bounded by the host (rank 3's compute stream runs 1.02 ms of it), and DLRM's
    # collectives (two gradient all_reduces of 1.58 and 0.91 MB: 0.72 ms at 6.25 GB/s, 43.5 ms at 0.1) hide
    # under its backward and launch-bound optimizer down to about 4 GB/s; below, the step grows with them
    run = _run(imported, "dlrm_8gpu_kineto.tar.gz")
    slowest, ends = {}, {}
    for gbps in (0.1, 1.0, 6.25, 200.0):
        switch = Dimension(kind="switch", size=0, bandwidth_gbps=gbps, latency_ns=1000)
        topo = Topology(name="sw", dims=(switch,))
        res = simulate(run, topology=topo, comm_mode="model")
        rows = summarize(run, res)
        (s,) = slowest_rank_steps(rows)  # the trace's one step, of its slowest rank: the job's step
        slowest[gbps] = (s.rank, s.step_time_ns)
        rt = run.ranks[3]
        gpu = res.timed[3] & ~rt.is_cpu & (rt.step == 10)
        mark = replayed_step_marks(run, res)[(3, 10)]
        ends[gbps] = (int(res.end_ns[3][gpu].max()), mark[3], bound_note(rows))
    # rank 3's step throughout: 18.712 ms at 6.25 and 200 GB/s, 19.837 at 1, 58.206 at 0.1
    assert {rank for rank, _ns in slowest.values()} == {3}
    step = {g: ns for g, (_r, ns) in slowest.items()}
    # the same step as the sweep's table reads it (to the µs: 26 ns apart)
    assert ms_text(step[6.25]) == ms_text(step[200.0])
    assert max(step[6.25], step[200.0]) < step[1.0] < step[0.1]
    # host-bound: its last kernel ends before the step's end (the host's time after it: 0.117 ms at 6.25
    # and 200 GB/s); at 0.1 GB/s its last kernel (the optimizer's, after the gradient all_reduce) ends
    # later (by 39.611 ms), and the step with it, the host's tail long over (it read 58.323 ms, the host's
    # tail counted after the GPU's end)
    tail = {g: ends[g][1] - ends[g][0] for g in (6.25, 200.0, 0.1)}
    assert tail[6.25] > 0 and tail[200.0] > 0 and tail[0.1] == 0
    assert ends[0.1][0] > ends[6.25][0]
    assert str(ends[200.0][2]).startswith(
        f"rank 3, the rank with the longest mean step ({ms_text(step[200.0])} ms): its stream ran "
    )
    assert str(ends[200.0][2]).endswith(
        ": host-bound (GPU work, communication included, lengthens the step only where it outlasts the "
        "host's launches)"
    )
    assert str(ends[0.1][2]).endswith(": bound by communication (transfers, and waits for peers)")


def test_a_modelled_collective_spans_its_whole_group_where_only_one_rank_was_traced(
    imported: dict[str, RunTrace],
) -> None:
    from skewlens.replay.comm import ModelTiming
    from skewlens.replay.network.topology import Dimension, Topology

    run = _run(imported, "nccl_16gpu_rank0_kineto.json.gz")
    assert list(run.ranks) == [0] and run.world_size == 16
    switch = Dimension(kind="switch", size=0, bandwidth_gbps=25.0, latency_ns=5_000)
    topo = Topology(name="sw", dims=(switch,))
    res = simulate(run, topology=topo, comm_mode="model")
    timing = ModelTiming(topo)
    for k, inst in enumerate(run.collectives):
        assert inst.ranks == (0,)
        nbytes = max(inst.comm_bytes)
        # modelled among the 16 ranks of its group, not among the one traced (which would take no time)
        want = timing.collective_time_ns(inst.comm_type, nbytes, tuple(range(16)))
        assert want > 0 and int(res.coll_end_ns[k] - res.coll_arrival_ns[k]) == want, (k, inst.comm_type)


def _synth_run(tmp_path: Path, *, sync_events: bool) -> tuple[RunTrace, int]:
    spec = GpuRunSpec(world_size=32, steps=5, layers=8, slow_ranks={5: 1.3}, sync_events=sync_events, seed=0)
    truth = write_gpu_run(spec, tmp_path / "kineto")
    known = truth.total_ns - simulate_gpu_run(spec.without_slow_ranks()).total_ns
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    return load_trace(tmp_path / "run"), known


@pytest.mark.slow
@pytest.mark.parametrize(("sync_events", "tolerance"), [(True, 0.01), (False, 0.01)])
def test_blame_on_a_32_rank_gpu_run_finds_the_slow_rank_and_what_it_costs(
    tmp_path: Path, sync_events: bool, tolerance: float
) -> None:
    run, known = _synth_run(tmp_path, sync_events=sync_events)
    assert known > 0
    notes = " ".join(run.manifest.notes.values())
    assert ("inferred from timing" in notes) is not sync_events
    result = analyze_run(run)
    assert result.blame is not None
    top = result.stragglers[0]
    assert top.rank == 5
    assert abs(top.straggler_cost_ns - known) <= tolerance * known, (top.straggler_cost_ns, known)
    # the step times are the schedule's: steps measured on the device, end to end
    truth = simulate_gpu_run(GpuRunSpec(world_size=32, steps=5, layers=8, slow_ranks={5: 1.3}, seed=0))
    res = simulate(run)
    got = step_times_from_spans(res.step_spans())
    for k, period in zip(sorted(got), list(truth.step_period_ns)[: len(got)], strict=True):
        assert abs(got[k] - period) <= 0.02 * period


def test_blame_of_a_slow_rank_does_not_count_peers_nccl_kernels_kept_as_compute(tmp_path: Path) -> None:
    # 4 ranks, rank 2's kernels 1.3x slower: each step's first all_reduce kernel is written as a SendRecv
    # kernel whose launch is not in the trace (issued before the profiling window), which the importer keeps
    # as GPU COMP on every rank. On the peers that kernel holds their wait for rank 2; counted as compute in
    # the blame's intervals it made them look as slow as rank 2: 1.97 ms a step against 2.92 known (2.90 now)
    spec = GpuRunSpec(world_size=4, steps=3, slow_ranks={2: 1.3}, seed=0)
    truth = write_gpu_run(spec, tmp_path / "kineto")
    known = truth.total_ns - simulate_gpu_run(spec.without_slow_ranks()).total_ns
    sendrecv = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    for f in sorted((tmp_path / "kineto").glob("*.json.gz")):
        with gzip.open(f) as fh:
            doc = json.load(fh)
        nccl = sorted(
            (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDev")),
            key=lambda e: e["ts"],
        )
        first = nccl[:: len(nccl) // spec.steps]  # each step's first bucket
        gone = {e["args"]["correlation"] for e in first}
        for e in first:
            e["name"] = sendrecv
            e["args"] = {k: e["args"][k] for k in ("device", "stream", "correlation")}
        doc["traceEvents"] = [
            e
            for e in doc["traceEvents"]
            if not (e.get("cat") == "cuda_runtime" and e["args"].get("correlation") in gone)
            and not (e.get("cat") == "ac2g" and e.get("id") in gone)
        ]
        with gzip.open(f, "wt") as fh:
            json.dump(doc, fh)
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    kept = "3 NCCL kernel(s) of unknown collective/peer kept as GPU COMP"
    assert kept in run.manifest.notes["rank 0 import"]
    top = analyze_run(run).stragglers[0]
    assert top.rank == 2
    assert abs(top.straggler_cost_ns - known) <= 0.05 * known, (top.straggler_cost_ns, known)


def test_a_rank_that_began_its_step_last_is_blamed_for_what_its_late_start_cost(
    imported: dict[str, RunTrace],
) -> None:
    # DLRM's 8 ranks: rank 7 began ProfilerStep#10 7.5 ms after rank 1 and its first all_to_all kernel
    # started last (skew 7.6 ms), though from its step's start to that kernel it took what its peers took.
    # Its late start was no gap the what-if could shorten: rank 7 cost 0.036 ms, ranked below rank 4's
    # 0.038 ms, while beginning with its peers cuts the step from 20.66 to 20.16 ms
    name = "dlrm_8gpu_kineto.tar.gz"
    begin: dict[int, float] = {}
    to_first_a2a: dict[int, float] = {}
    with tarfile.open(_need(name)) as tar:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            if fh is None:
                continue
            doc = json.load(fh)
            r = doc["distributedInfo"]["rank"]
            ev = doc["traceEvents"]
            begin[r] = min(e["ts"] for e in ev if e.get("name", "").startswith("ProfilerStep#"))
            first = min(
                e["ts"] for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
            )
            to_first_a2a[r] = first - begin[r]
    assert max(begin, key=lambda r: begin[r]) == 7 and begin[7] - min(begin.values()) > 7_000  # us
    assert abs(to_first_a2a[7] - float(np.median([to_first_a2a[r] for r in range(7)]))) < 300
    run = _run(imported, name)
    top = analyze_run(run).stragglers[0]
    assert top.rank == 7
    # a second method: the replay with rank 7's first start moved to its peers' (lower) median
    em = execution_model(run)
    m7 = em.ranks[7]
    peers = sorted(em.ranks[r].t0_ns for r in range(7))
    base = sum(step_times_from_spans(simulate(run).step_spans()).values())
    try:
        em.ranks[7] = dataclasses.replace(m7, t0_ns=peers[(len(peers) - 1) // 2])
        earlier = sum(step_times_from_spans(simulate(run).step_spans()).values())
    finally:
        em.ranks[7] = m7
    assert base - earlier > 400_000
    assert top.straggler_cost_ns == pytest.approx(base - earlier, rel=0.05)


def test_dlrm_copies_launched_between_two_waits_of_an_index_op_follow_its_first_wait_with_no_host_gaps(
    imported: dict[str, RunTrace],
) -> None:
    # aten::index (and IndexBackward0) waits for one pageable copy, launches the next, waits for it: with
    # every host gap at 0 the first copy ends ~2 ms into the run, and the next followed it by ~6.6 ms,
    # its launch held by the op's whole recorded wait, which includes the wait for that very copy
    run = _run(imported, "dlrm_8gpu_kineto.tar.gz")
    em = execution_model(run)
    sim = Simulator(run)
    sim.simulate()
    res = sim.simulate(gap_override={r: np.zeros(len(rt), dtype=np.int64) for r, rt in run.ranks.items()})
    for r, rt in run.ranks.items():
        m = em.ranks[r]
        src = m.launch_src[m.part_wait_edge]
        assert sorted(rt.name(i) for i in src.tolist()) == [
            "aten::index",
            "autograd::engine::evaluate_function: IndexBackward0",
        ], r
        w, copy = m.part_wait_src, m.launch_dst[m.part_wait_edge]
        assert all(rt.name(i).startswith("Memcpy HtoD") for i in [*w.tolist(), *copy.tolist()])
        recorded = rt.start_ns[copy] - (rt.start_ns[w] + rt.dur_ns[w])
        replayed = res.start_ns[r][copy] - res.end_ns[r][w]
        assert (replayed <= recorded).all() and (recorded < 60_000).all(), (r, replayed, recorded)


def test_gpu_dependency_attributes_round_trip_through_the_trace(tmp_path: Path) -> None:
    spec = GpuRunSpec(world_size=2, steps=1, layers=2, sync_events=False, seed=1)
    write_gpu_run(spec, tmp_path / "kineto")
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    run = load_trace(tmp_path / "run")
    rt = run.ranks[0]
    assert rt.launch_ns is not None
    gpu = ~rt.is_cpu & (rt.node_type != 1)
    assert (rt.launch_ns[gpu] > 0).all() and (rt.launch_ns[rt.is_cpu] == -1).all()
    assert (rt.start_ns[gpu] >= rt.launch_ns[gpu]).all()


def test_a_cpu_run_has_no_launch_or_host_sync_edges(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=1_000_000)
    b.write(tmp_path / "run")
    m = execution_model(load_trace(tmp_path / "run"))
    assert all(rm.launch_src.size == 0 for rm in m.ranks.values())


def test_a_device_synchronise_on_any_rank_of_an_8_gpu_host_waits_for_that_rank_s_own_device(
    imported: dict[str, RunTrace],
) -> None:
    # without sync events nothing names the device a cudaDeviceSynchronize waited for: it is the rank's
    # own (rank r of the DLRM host runs on device r), so every rank has the waits rank 0 has
    run = _run(imported, "dlrm_8gpu_kineto.tar.gz")
    m = execution_model(run)
    waits: dict[int, list[str]] = {}
    for r, rt in run.ranks.items():
        mr = m.ranks[r]
        host_rows = np.unique(mr.wait_dst[~rt.is_cpu[mr.wait_src]]).tolist()
        waits[r] = sorted(rt.name(x) for x in host_rows)
    assert run.manifest.devices == {r: f"cuda:{r}" for r in range(8)}
    assert "cudaDeviceSynchronize" in waits[0]
    assert all(w == waits[0] for w in waits.values()), waits


_HOST, _GPU = {"ph": "X", "pid": 1, "tid": 1}, {"ph": "X", "pid": 0, "cat": "kernel"}


def _two_steps_after(tmp_path: Path, before: list[dict[str, Any]], first_at: int) -> AnalysisResult:
    """The events ``before``, then ProfilerStep#1 and #2, 500 us each from ``first_at``, each launching a
    kernel on stream 7 10 us in: "a" runs 400-600 us, "b" 620-900; imported and analysed."""
    ev = list(before)
    for k, (t0, start, dur) in enumerate([(first_at, 400, 200), (first_at + 500, 620, 280)], start=1):
        ev += [
            {**_HOST, "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": t0, "dur": 500,
             "args": {}},
            {**_HOST, "cat": "cpu_op", "name": "aten::mm", "ts": t0 + 5, "dur": 20, "args": {}},
            {**_HOST, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 10, "dur": 2,
             "args": {"correlation": k}},
            {**_GPU, "tid": 7, "name": "ab"[k - 1], "ts": start, "dur": dur,
             "args": {"stream": 7, "correlation": k}},
        ]  # fmt: skip
    f = tmp_path / "trace.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}))
    import_traces([f], None, tmp_path / "run")
    return analyze_run(load_trace(tmp_path / "run"), blame=False)


def test_gpu_work_launched_before_the_profiler_started_is_in_no_step_and_the_first_begins_where_it_ended(
    tmp_path: Path,
) -> None:
    # stream 7 runs "old" 0-400 us, whose launch is not in the trace (the step before the profiled ones),
    # then step 1's "a", launched at 10, 400-600; step 2's "b", launched at 510, runs 620-900
    old = {**_GPU, "tid": 7, "name": "old", "ts": 0, "dur": 400, "args": {"stream": 7}}
    res = _two_steps_after(tmp_path, [old], 0)
    us = 1000
    # step 1 read 600 us (from its annotation's start), with 600 us of GPU compute, "old" in it
    got = [(b.step, b.start_ns, b.step_ns, b.gpu_compute_ns) for b in res.breakdown]
    assert got == [(1, 400 * us, 200 * us, 200 * us), (2, 600 * us, 400 * us, 280 * us)]
    idle = {g.step: (g.busy_ns, g.idle_ns) for g in res.gpu_idle}
    assert idle == {1: (200 * us, 0), 2: (280 * us, 120 * us)}
    assert sorted(k.name for k in res.gpu_kernels) == ["a", "b"]


@pytest.mark.parametrize(
    ("kernels", "first"),
    [
        # "old", launched at 1, runs 5-400 us on stream 8: step 1 began at 100 (500 us, 300 of them "old"'s)
        ([("old", 8, 5, 395, True)], 400),
        # "x", launched at 1, 5-50 on stream 7, then "y", whose launch is not in the trace, 50-300: step 1
        # began at 100, where "x" ended before it (500 us, 200 of them "y"'s, a kernel in no step)
        ([("x", 7, 5, 45, True), ("y", 7, 50, 250, False)], 300),
    ],
    ids=["launched before it", "begun before it without a launch"],
)
def test_gpu_work_issued_before_the_first_step_annotation_is_in_no_step_and_the_first_begins_where_it_ended(
    tmp_path: Path, kernels: list[tuple[str, int, int, int, bool]], first: int
) -> None:
    # ProfilerStep#1 is 100-600 us: step 1's "a", launched at 110, runs 400-600 on stream 7, step 2's "b"
    # (launched at 610) 620-900
    before = [
        {**_HOST, "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5, "args": {}},
        {**_HOST, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 2,
         "args": {"correlation": 9}},
    ]  # fmt: skip
    for name, stream, ts, dur, launched in kernels:
        args = {"stream": stream, **({"correlation": 9} if launched else {})}
        before.append({**_GPU, "tid": stream, "name": name, "ts": ts, "dur": dur, "args": args})
    res = _two_steps_after(tmp_path, before, 100)
    us = 1000
    got = [(b.step, b.start_ns, b.step_ns, b.gpu_compute_ns) for b in res.breakdown]
    assert got == [(1, first * us, (600 - first) * us, 200 * us), (2, 600 * us, 500 * us, 280 * us)]
    assert sorted(k.name for k in res.gpu_kernels) == ["a", "b"]


_LEFT_OUT = (
    "1 GPU op(s) issued before the first step's annotation (the step before the profiler started) "
    "put in no step"
)


@pytest.mark.parametrize(
    ("old_us", "then"),
    [
        # "old" (stream 9, no launch in the trace) ends 300 us into step 1's annotation (100-600)
        ((0, 400), "; step 1 begins where they ended, 0.300 ms into its annotation"),
        # it ends after step 1's own work (400-600): step 1 has no span, and nothing else said so
        ((0, 1000), "; step 1 was left no time of its own (its work done by the time they ended)"),
        # it ends before the annotation: the first step begins there
        ((0, 50), ""),
    ],
    ids=["into the first step", "past the first step", "before the first step"],
)
def test_the_import_says_how_much_gpu_work_of_the_step_before_the_profiler_it_left_out_and_what_of_the_first(
    tmp_path: Path, old_us: tuple[int, int], then: str
) -> None:
    # the import put such work in no step and moved or dropped the first step without a word
    ts, dur = old_us
    old = {**_GPU, "tid": 9, "name": "old", "ts": ts, "dur": dur, "args": {"stream": 9}}
    _two_steps_after(tmp_path, [old], 100)
    notes = [n for n in read_manifest(tmp_path / "run").notes.values() if "put in no step" in n]
    assert notes == [_LEFT_OUT + then]


def test_the_16_gpu_traces_first_step_is_no_outlier_once_the_work_launched_before_the_profiler_is_left_out(
    imported: dict[str, RunTrace],
) -> None:
    # its first step read 371.6 ms against a median of 216.2, named as an outlier ("warm-up"): 155 ms of it
    # were 872 kernels, copies and memsets launched before the profiler started (the previous step's)
    name = "nccl_16gpu_rank0_kineto.json.gz"
    periods = _gpu_step_periods(_raw(name))
    median = sorted(periods.values())[len(periods) // 2]
    assert all(ns <= 1.05 * median for ns in periods.values()), periods
    result = analyze_run(_run(imported, name), blame=False)
    assert outlier_steps(result.breakdown) == []
    assert "the median step" not in str(breakdown_table(result).caption)


def test_the_16_gpu_imports_notes_print_ms_as_every_report_does(imported: dict[str, RunTrace]) -> None:
    # the import's notes printed ms by formats of their own ("155.35 ms into its annotation", "3444.032 ms of
    # recorded kernel waiting"), not by ms_text, as the tables and the other lines do
    notes = " ".join(_run(imported, "nccl_16gpu_rank0_kineto.json.gz").manifest.notes.values())
    assert "(3444.0 ms of recorded kernel waiting rests on event waits inferred so)" in notes
    assert "step 550 begins where they ended, 155.3 ms into its annotation" in notes


def test_an_imported_backward_pass_on_autograds_device_thread_follows_the_call_and_the_main_thread_waits(
    tmp_path: Path,
) -> None:
    # Kineto's shape of a GPU step: the main thread (100) calls backward() after the loss's seed and
    # waits, with no operator, while the engine's device thread (200) runs the backward graph
    main, engine = {"ph": "X", "pid": 1, "tid": 100}, {"ph": "X", "pid": 1, "tid": 200}
    back = "autograd::engine::evaluate_function: MmBackward0"
    ev = [
        {**main, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "args": {}},
        {**main, "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 10, "args": {}},
        {**main, "cat": "cpu_op", "name": "aten::ones_like", "ts": 100, "dur": 10, "args": {}},
        {**engine, "cat": "cpu_op", "name": back, "ts": 150, "dur": 150, "args": {}},
        {**engine, "cat": "cpu_op", "name": back, "ts": 320, "dur": 80, "args": {}},
        {**main, "cat": "cpu_op", "name": "Optimizer.step#SGD.step", "ts": 420, "dur": 100, "args": {}},
    ]
    f = tmp_path / "trace.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}))
    manifest = import_traces([f], None, tmp_path / "run")
    assert any("1 stretch(es) of backward passes" in n for n in manifest.notes.values()), manifest.notes
    run = load_trace(tmp_path / "run")
    rt = run.ranks[0]
    row = {rt.name(k): k for k in range(len(rt)) if rt.name(k) != back}
    passes = sorted((int(rt.start_ns[k]), k) for k in range(len(rt)) if rt.name(k) == back)
    first, last = passes[0][1], passes[-1][1]
    deps = {k: set(rt.dep_idx[rt.dep_ptr[k] : rt.dep_ptr[k + 1]].tolist()) for k in range(len(rt))}
    assert row["aten::ones_like"] in deps[first]  # the backward pass follows the call
    assert last in deps[row["Optimizer.step#SGD.step"]]  # the main thread goes on after it
    # a backward pass twice as slow holds the optimizer step back by as much
    slow = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", ranks=(0,), factor=2.0, pattern="autograd::*")])
    )
    base = simulate(run)
    opt = row["Optimizer.step#SGD.step"]
    assert slow.start_ns[0][opt] - base.start_ns[0][opt] == 150_000 + 80_000


def host_bound_spec(**kw: Any) -> GpuRunSpec:
    """A host-bound GPU run: microsecond kernels, 200 µs host ops; each step ends with ``aten::item``,
    which launches a DtoH copy and then waits for it (on the step's path)."""
    kernels = {"forward_kernel_ns": 1_000, "backward_kernel_ns": 1_000, "optimizer_kernel_ns": 1_000}
    return GpuRunSpec(**{"layers": 2, "op_cpu_ns": 200_000, **kernels, **kw})


def _host_bound_run(tmp_path: Path) -> RunTrace:
    """2 ranks, 2 steps of :func:`host_bound_spec`."""
    write_gpu_run(host_bound_spec(world_size=2, steps=2, seed=1, kernel_jitter=0.0), tmp_path / "kineto")
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    return load_trace(tmp_path / "run")


def test_the_copy_item_launches_and_waits_for_is_launched_in_it_and_a_slower_host_delays_it(
    tmp_path: Path,
) -> None:
    run = _host_bound_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    item = np.flatnonzero(np.asarray([rt.name(i) == "aten::item" for i in range(len(rt))]))
    copy = np.flatnonzero(np.asarray([rt.name(i).startswith("Memcpy DtoH") for i in range(len(rt))]))
    assert item.size == copy.size == 2
    # written as skl_launched_in (a dependency would close a cycle with the op's wait), read as a launch
    assert rt.launched_in is not None and rt.launched_in[copy].tolist() == item.tolist()
    launches = set(zip(m.launch_src.tolist(), m.launch_dst.tolist(), strict=True))
    assert {(int(i), int(c)) for i, c in zip(item, copy, strict=True)} <= launches
    assert set(m.wait_dst[np.isin(m.wait_src, copy)].tolist()) == set(item.tolist())
    base = simulate(run)
    slow = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", ranks=(0,), factor=3.0, pattern="aten::_foreach_*")])
    )
    for res in (base, slow):
        st, en = res.start_ns[0], res.end_ns[0]
        for i, c in zip(item.tolist(), copy.tolist(), strict=True):
            launch = int(rt.launch_ns[c]) - int(rt.start_ns[i])  # type: ignore[index]
            assert st[c] >= st[i] + launch  # never before the op that launches it reached the call
            assert en[i] >= en[c]  # and the op waits for it
    # the two optimizer ops before each item, 400 µs longer: the copy (on an idle GPU) moves with them
    moved = slow.start_ns[0][copy] - base.start_ns[0][copy]
    assert (moved >= 2 * 400_000 - 10_000).all(), moved


def test_the_critical_path_of_a_host_bound_step_goes_through_the_copy_item_launched(tmp_path: Path) -> None:
    from skewlens.analysis.critical_path import analyze_critical_path
    from skewlens.analysis.index import build_index

    run = _host_bound_run(tmp_path)
    recs = [r for r in analyze_critical_path(build_index(run)) if r.step == 1]
    names = [r.name for r in recs]
    k = next(i for i, n in enumerate(names) if n.startswith("Memcpy DtoH"))
    # item's work after its wait, its copy, item up to the copy's launch call, then the host ops before it
    assert names[k - 1 : k + 3] == ["aten::item", names[k], "aten::item", "aten::_foreach_add_"]
    assert recs[k].gap_before_ns <= 10_000  # the copy waited only for its launch, not for an unknown cause
    assert recs[k + 2].contribution_ns == 200_000  # the optimizer op is on the path whole
    # the path spans the step on the host: most of it is host ops, not device gaps
    span = recs[0].end_ns - recs[-1].start_ns
    host = sum(r.contribution_ns for r in recs if r.name.startswith(("aten::", "c10d::")))
    assert host >= 0.9 * span


def test_the_parquet_export_gives_each_gpu_nodes_launch_and_the_op_it_was_launched_in(tmp_path: Path) -> None:
    import duckdb

    from skewlens.profiler.store.parquet import export_run

    run = _host_bound_run(tmp_path)
    export_run(run.run_dir, tmp_path / "pq")
    nodes = f"read_parquet('{tmp_path / 'pq'}/nodes/*/*.parquet', hive_partitioning = true)"
    pairs = duckdb.sql(
        f"SELECT g.rank, g.name, h.name FROM {nodes} g JOIN {nodes} h "
        "ON g.rank = h.rank AND g.launched_in = h.node_id ORDER BY g.rank, g.start_ns"
    ).fetchall()
    assert [(r, h) for r, _g, h in pairs] == [(0, "aten::item")] * 2 + [(1, "aten::item")] * 2
    assert all(g.startswith("Memcpy DtoH") for _r, g, _h in pairs)
    ((gpu_launched, host_launched, early),) = duckdb.sql(
        "SELECT count(*) FILTER (NOT is_cpu_op AND launch_ns IS NOT NULL), "
        "count(*) FILTER (is_cpu_op AND launch_ns IS NOT NULL), "
        f"count(*) FILTER (launch_ns > start_ns) FROM {nodes}"
    ).fetchall()
    assert gpu_launched == sum(
        int((t.launch_ns >= 0).sum()) for t in run.ranks.values() if t.launch_ns is not None
    )
    assert gpu_launched > 0 and host_launched == early == 0  # host nodes have none; none before its call


def _sync_then_launch_run(
    tmp_path: Path, *, again: bool = False, twice: bool = False, gemm_end_us: int = 105
) -> RunTrace:
    """One rank, µs: ``aten::mm`` launches ``gemm`` (stream 7, 5-105); ``aten::index`` (20-120) synchronises
    on stream 7 (returns at 107, once ``gemm`` ended), then launches ``index_kernel`` (call at 110, kernel
    114-119), as ``aten::index`` does after its ``nonzero``; ``again``: then synchronises on stream 7 again
    (115-120: waits for ``index_kernel``); ``twice`` (with ``again``; ``aten::index`` 20-140): then launches
    ``index_kernel2`` (call at 122, kernel 126-131) and synchronises on it (123-132). ``gemm_end_us``: when
    ``gemm`` ends and the first synchronise returns (at most 110, the call)."""
    evs: list[dict[str, Any]] = []

    def x(cat: str, name: str, ts: int, dur: int, **args: Any) -> None:
        pid, tid = (0, args["stream"]) if cat in ("kernel", "cuda_sync") else (1, 100)
        evs.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    x("cpu_op", "aten::mm", 0, 10, **{"External id": 1})
    x("cuda_runtime", "cudaLaunchKernel", 2, 2, correlation=1)
    x("kernel", "gemm", 5, gemm_end_us - 5, device=0, stream=7, correlation=1)
    x("cpu_op", "aten::index", 20, 120 if twice else 100, **{"External id": 2})
    x("cuda_runtime", "cudaStreamSynchronize", 22, gemm_end_us - 20, correlation=2)
    x(
        "cuda_sync",
        "Stream Sync",
        gemm_end_us,
        1,
        cuda_sync_kind="Stream Sync",
        device=0,
        stream=7,
        correlation=2,
    )
    x("cuda_runtime", "cudaLaunchKernel", 110, 2, correlation=3)
    x("kernel", "index_kernel", 114, 5, device=0, stream=7, correlation=3)
    if again:
        x("cuda_runtime", "cudaStreamSynchronize", 115, 5, correlation=4)
        x("cuda_sync", "Stream Sync", 119, 1, cuda_sync_kind="Stream Sync", device=0, stream=7, correlation=4)
    if twice:
        x("cuda_runtime", "cudaLaunchKernel", 122, 1, correlation=5)
        x("kernel", "index_kernel2", 126, 5, device=0, stream=7, correlation=5)
        x("cuda_runtime", "cudaStreamSynchronize", 123, 9, correlation=6)
        x("cuda_sync", "Stream Sync", 131, 1, cuda_sync_kind="Stream Sync", device=0, stream=7, correlation=6)
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": evs}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    import_traces([tmp_path / "rank0.json"], None, tmp_path / "run")
    return load_trace(tmp_path / "run")


def test_a_kernel_launched_after_its_op_waited_moves_with_the_wait(tmp_path: Path) -> None:
    run = _sync_then_launch_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    src = zip(m.launch_src.tolist(), m.launch_after_wait.tolist(), strict=True)
    edges = dict(zip(m.launch_dst.tolist(), src, strict=True))
    assert edges[row["index_kernel"]] == (row["aten::index"], True)  # its call came after the op's wait
    assert edges[row["gemm"]] == (row["aten::mm"], False)
    base = simulate(run)
    assert int(base.start_ns[0][row["index_kernel"]]) == int(rt.start_ns[row["index_kernel"]])  # as recorded
    # a GPU twice as fast: gemm ends 50 µs sooner, so does the op's wait, and the launch after it
    fast = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", pattern="gemm", factor=0.5, device="gpu")])
    )
    moved = int(base.start_ns[0][row["index_kernel"]]) - int(fast.start_ns[0][row["index_kernel"]])
    assert moved == 50_000, moved
    assert int(fast.end_ns[0][row["aten::index"]]) == int(base.end_ns[0][row["aten::index"]]) - 50_000


def _launch_between_waits(tmp_path: Path) -> tuple[RunTrace, RankModel, dict[str, int], int]:
    """:func:`_sync_then_launch_run` with ``again`` (``index_kernel`` launched between two waits of
    ``aten::index``): the run, its rank's model, its rows by name and ``index_kernel``'s launch edge."""
    run = _sync_then_launch_run(tmp_path, again=True)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    return run, m, row, int(np.flatnonzero(m.launch_dst == row["index_kernel"])[0])


def test_a_launch_between_two_waits_of_its_op_moves_with_the_first_wait_not_the_second(
    tmp_path: Path,
) -> None:
    # aten::index waits for gemm (until 105 us), launches index_kernel (call at 110), then waits for it:
    # the launch follows the first wait, 5 us after it ended, not the op's whole wait (which includes the
    # kernel it launches)
    run, m, row, edge = _launch_between_waits(tmp_path)
    rt = run.ranks[0]
    op, k = row["aten::index"], row["index_kernel"]
    waits = sorted(m.wait_src[m.wait_dst == op].tolist())
    assert waits == sorted([row["gemm"], k])  # it waited for both
    assert int(m.launch_waited_ns[edge]) == 105_000 - 20_000  # the wait before the call ended at 105 us
    assert m.part_wait_src[m.part_wait_edge == edge].tolist() == [row["gemm"]]
    base = simulate(run)
    assert (base.start_ns[0] == rt.start_ns).all() and (base.end_ns[0] == rt.start_ns + rt.dur_ns).all()
    dep, met = latest_deps(m, rt.start_ns, rt.start_ns + rt.dur_ns)
    assert (int(dep[k]), int(met[k])) == (op, 110_000)  # met at the recorded call
    # a GPU twice as fast: gemm ends 50 µs sooner, so does the op's first wait, the launch after it, the
    # kernel and the op's second wait for it
    fast = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", pattern="gemm", factor=0.5, device="gpu")])
    )
    assert int(base.start_ns[0][k]) - int(fast.start_ns[0][k]) == 50_000
    assert int(base.end_ns[0][op]) - int(fast.end_ns[0][op]) == 50_000
    # the analyses meet the launch at the same time as the simulator
    dep, met = latest_deps(m, fast.start_ns[0], fast.end_ns[0])
    assert (int(dep[k]), int(met[k])) == (op, 110_000 - 50_000)
    # so does a what-if that re-times the lowered run (gemm's duration overridden: 50 µs)
    sim = Simulator(run)
    sim.simulate()
    dur = np.full(len(rt), -1, dtype=np.int64)
    dur[row["gemm"]] = 50_000
    what_if = sim.simulate(dur_override={0: dur})
    assert int(base.start_ns[0][k]) - int(what_if.start_ns[0][k]) == 50_000


def test_a_launch_between_two_waits_stays_as_long_after_the_first_wait_whatever_work_its_op_is_given(
    tmp_path: Path,
) -> None:
    # aten::index (20-120 us) waits for gemm until 105, calls index_kernel's launch at 110, then waits for
    # it until 119, then works 1 us: the call lies in its wait, not its work, so a what-if that gives the op
    # 30 us of work (launch_offsets: a call made between two waits is not scaled) still meets the launch
    # 110 - 105 = 5 us after gemm's end, at 110 us, and the op ends 30 us after its last wait, at 149 us;
    # scaled by the op's work factor (30x, within its 30 us of work) the call would be met at 135 us
    run, m, row, edge = _launch_between_waits(tmp_path)
    op, k = row["aten::index"], row["index_kernel"]
    assert int(m.work_ns[op]) == 1_000 and bool(m.launch_at_arrival[edge])
    dur = np.full(len(run.ranks[0]), -1, dtype=np.int64)
    dur[op] = 30_000
    sim = Simulator(run)
    sim.simulate()  # then a what-if, as blame and the critical path run them
    res = sim.simulate(dur_override={0: dur})
    start, end = res.start_ns[0], res.end_ns[0]
    assert (int(start[op]), int(end[op])) == (20_000, 149_000)
    assert int(end[row["gemm"]]) == 105_000
    assert int(start[k]) == 114_000  # the call at 110 us, then the recorded 4 us to the kernel
    assert int(launch_times(m, start, end)[edge]) == 105_000 + (110_000 - 105_000)
    dep, met = latest_deps(m, start, end)
    assert (int(dep[k]), int(met[k])) == (op, 110_000)


def test_the_critical_path_goes_from_a_launch_between_two_waits_to_the_copy_the_first_wait_waited_for(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.critical_path import analyze_critical_path
    from skewlens.analysis.index import build_index

    # aten::index (20-120 us) waits for gemm until 105, calls index_kernel's launch at 110, then waits for
    # it: of the 90 us before the call, 85 are gemm's, which is on the path, not aten::index
    run = _sync_then_launch_run(tmp_path, again=True)
    recs = analyze_critical_path(build_index(run))
    got = [(r.name, r.contribution_ns) for r in recs]
    assert got[:4] == [
        ("aten::index", 1_000),
        ("index_kernel", 5_000),
        ("aten::index", 5_000),
        ("gemm", 100_000),
    ]
    assert recs[-1].name == "aten::mm"
    assert sum(r.contribution_ns + r.gap_before_ns for r in recs) == recs[0].end_ns - recs[-1].start_ns


def test_a_launch_called_the_instant_its_ops_first_wait_ended_is_held_by_that_wait(tmp_path: Path) -> None:
    from skewlens.analysis.critical_path import analyze_critical_path
    from skewlens.analysis.index import build_index

    # gemm ends at 110 us, as aten::index's first synchronise returns and calls index_kernel's launch: the
    # launch waited for gemm (a wait ending at the call held it), so gemm's 105 us (5-110) are on the path
    # and aten::index none before the call. Taking only waits that ended before the call credited
    # aten::index with its 90 us from its arrival (20) and left gemm off the path
    run = _sync_then_launch_run(tmp_path, again=True, gemm_end_us=110)
    recs = analyze_critical_path(build_index(run))
    assert [(r.name, r.contribution_ns, r.gap_before_ns) for r in recs] == [
        ("aten::index", 1_000, 0),
        ("index_kernel", 5_000, 4_000),
        ("aten::index", 0, 0),
        ("gemm", 105_000, 3_000),
        ("aten::mm", 2_000, 0),
    ]


def test_the_critical_path_goes_from_each_of_two_launches_between_three_waits_to_the_wait_just_before_it(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.critical_path import analyze_critical_path
    from skewlens.analysis.index import build_index

    # aten::index (20-140 us) waits for gemm until 105, launches index_kernel at 110 (114-119), waits for
    # it, launches index_kernel2 at 122 (126-131), waits for that: each launch is held by the wait that
    # ended last before its call (index_kernel's at 119 for the second, gemm's at 105 for the first), not
    # by one that ended after it nor by the earliest
    run = _sync_then_launch_run(tmp_path, again=True, twice=True)
    ix = build_index(run)
    rt = run.ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    assert ix.ranks[0].part_waits[row["aten::index"]] == (
        (row["gemm"], 105_000),
        (row["index_kernel"], 119_000),
    )
    got = [(r.name, r.contribution_ns) for r in analyze_critical_path(ix)]
    assert [n for n, _c in got[:7]] == [
        "aten::index",
        "index_kernel2",
        "aten::index",
        "index_kernel",
        "aten::index",
        "gemm",
        "aten::mm",
    ]
    assert got[:6] == [
        ("aten::index", 9_000),
        ("index_kernel2", 5_000),
        ("aten::index", 3_000),
        ("index_kernel", 5_000),
        ("aten::index", 5_000),
        ("gemm", 100_000),
    ]


def test_a_launch_after_its_ops_wait_is_met_at_the_recorded_call_as_the_analyses_read_it(
    tmp_path: Path,
) -> None:
    # aten::index (20-120 us) waited for gemm until 105 us, then called the launch at 110: met as long
    # after the wait ended as recorded (110 - 105 = 5 us), so at 110 us in the recorded times, not 85 us
    # (its blocked time) later
    run = _sync_then_launch_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    row = {rt.name(i): i for i in range(len(rt))}
    dep, met = latest_deps(m, rt.start_ns, rt.start_ns + rt.dur_ns)
    k = row["index_kernel"]
    assert (int(dep[k]), int(met[k])) == (row["aten::index"], 105_000 + (110_000 - 105_000))


def test_a_launch_named_inside_a_gpu_node_or_a_node_itself_is_ignored_and_the_run_replays_as_recorded(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.chakra_io import EtWriter, read_et, set_attr

    run = _sync_then_launch_run(tmp_path)
    et = read_et(Path(run.run_dir) / "rank-0.et")
    ids = {n.name: n.id for n in et.nodes}
    for n in et.nodes:  # untrusted input: a kernel "launched in" itself, a host op "launched in" a kernel
        if n.name == "gemm":
            set_attr(n, "skl_launched_in", n.id)
        elif n.name == "aten::mm":
            set_attr(n, "skl_launched_in", ids["index_kernel"])
    with EtWriter(Path(run.run_dir) / "rank-0.et", et.metadata) as w:
        w.write_all(et.nodes)
    bad = load_trace(run.run_dir)
    rt, m = bad.ranks[0], execution_model(bad).ranks[0]
    assert rt.launched_in is not None and (rt.launched_in >= 0).sum() == 3  # index_kernel's own, and those
    assert m.launch_src.size == 2  # aten::mm -> gemm, aten::index -> index_kernel: nothing more
    res = simulate(bad)
    assert res.start_ns[0].tolist() == rt.start_ns.tolist()


@pytest.mark.parametrize("name", [SYNC_1, "a2a_128gpu_sampled_rank0_kineto.json.gz"])
def test_a_compute_stream_held_by_its_launches_alone_waits_for_each_launch_the_raw_json_records(
    imported: dict[str, RunTrace], name: str
) -> None:
    # stream 7 of these traces waits for nothing but its launches (no event or collective holds its ops):
    # its launch wait is, gap by gap in the raw JSON, from the stream's last end (or the first step's
    # start) to the next op's launch call, within the steps. Some of their kernels are launched by a call
    # inside no operator (a spin kernel; 16 fused optimizer kernels): that idle read as other (0.090 ms
    # of 2.933, and 16.354 of 337.707 ms)
    res = analyze_run(_run(imported, name), blame=False)
    rows = [g for g in res.gpu_idle if g.stream == 7]
    assert rows and sum(g.comm_wait_ns + g.stream_wait_ns for g in rows) == 0
    steps = sorted((b.start_ns, b.end_ns) for b in res.breakdown)
    doc = _raw(name)
    base = int(doc.get("baseTimeNanoseconds", 0))
    evs = doc["traceEvents"]
    ns = lambda us: round(us * 1000)  # noqa: E731
    launch = {e["args"]["correlation"]: base + ns(e["ts"]) for e in evs if e.get("cat") == "cuda_runtime"}
    ops = sorted(
        (base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), launch.get(e["args"].get("correlation")))
        for e in evs
        if e.get("cat") in GPU_CATS and e["args"].get("stream") == 7
    )
    want, last = 0, steps[0][0]
    for a, b, call in ops:
        if call is not None and a > last and call > last:
            want += sum(max(0, min(call, a, e) - max(last, s)) for s, e in steps)
        last = max(last, b)
    assert sum(g.launch_wait_ns for g in rows) == want
