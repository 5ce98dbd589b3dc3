"""Capture on CUDA without a GPU: launch, event-wait and synchronisation edges from torch.profiler's events,
NCCL's device times from the flight recorder, and what an older torch's missing APIs cost.

The Kineto events are synthetic objects of the shape torch's ``_KinetoEvent`` has, built from the real
single-GPU traces recorded with CUDA sync events in ``../shared/traces`` (their JSON ``args`` are what
torch gives as event metadata); the flight-recorder dumps have the shape of torch's JSON dump.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch  # here, not inside the first test that needs it: importing it takes seconds

from skewlens.profiler.capture import compat, flight
from skewlens.profiler.capture.build import CUDA_STREAM_BASE, RankCapture, build_nodes
from skewlens.profiler.capture.flight import FrEntry, device_spans, merge, parse_dump, settle
from skewlens.profiler.capture.kineto import (
    SYNC_KIND,
    KinetoCapture,
    activities,
    activity,
    event_metadata,
    op_records,
    sync_records,
)
from skewlens.profiler.capture.records import CommRecord, StepRecord
from skewlens.profiler.capture.run import capture_env
from skewlens.profiler.chakra_io import EtWriter, TraceNode
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, StepWindow, rank_file, write_manifest
from skewlens.profiler.vocab import Attr, CommType, Level, NodeType
from skewlens.replay.driver import load_trace
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.execution import execution_model
from skewlens.replay.real.plan import rank_plan
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
GROUPS = [ProcessGroupInfo(name="0", ranks=(0,), desc="default_pg", backend="cuda:nccl")]
HOST_CATS = {"cpu_op", "cuda_runtime", "cuda_driver"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"}


@dataclass
class Ev:
    """The part of torch's ``_KinetoEvent`` the capture reads."""

    n: str
    kind: str
    t: int
    d: int
    tid: int = 1
    resource: int = 1
    index: int = 0
    corr: int = 0
    meta: str = ""

    def name(self) -> str:
        return self.n

    def activity_type(self) -> str:
        return self.kind

    def start_ns(self) -> int:
        return self.t

    def duration_ns(self) -> int:
        return self.d

    def device_type(self) -> str:
        return "DeviceType.CPU" if self.kind in HOST_CATS else "DeviceType.CUDA"

    def start_thread_id(self) -> int:
        return self.tid

    def device_resource_id(self) -> int:
        return self.resource

    def device_index(self) -> int:
        return self.index

    def correlation_id(self) -> int:
        return self.corr

    def metadata_json(self) -> str:
        return self.meta

    def is_user_annotation(self) -> bool:  # torch: a record_function's range, on the host or the device
        return self.kind in ("user_annotation", "gpu_user_annotation")


def _real(name: str) -> list[dict[str, Any]]:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"real trace {path} not found (the shared traces folder is absent)")
    with gzip.open(path) as f:
        doc = json.load(f)
    keep = HOST_CATS | DEVICE_CATS
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in keep]


def _events(raw: list[dict[str, Any]]) -> list[Ev]:
    """torch's events for a Kineto JSON's: host ops correlate by ``External id``, the rest by CUPTI's
    ``correlation``; a device event's metadata is its ``args`` less what torch adds (``External id``)."""
    out = []
    for e in raw:
        a = e.get("args", {})
        host = e["cat"] in HOST_CATS
        meta = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in a.items() if k != "External id")
        out.append(
            Ev(
                e["name"],
                e["cat"],
                round(e["ts"] * 1000),
                round(e["dur"] * 1000),
                tid=1,  # Kineto's own thread number of the host thread
                resource=int(e["tid"]) if host else int(a.get("stream", e["tid"])),
                index=int(a.get("device", 0)),
                corr=int(a["External id"] if e["cat"] == "cpu_op" else a.get("correlation", 0)),
                meta="" if host else "\n      " + meta,
            )
        )
    return out


class Torch211Event:
    """An event as torch 2.11 gives it (seen on an H200 with torch 2.11+cu130, ``scripts/cuda_check.sh``):
    no ``activity_type()``; an operator's metadata is its event index, a runtime call's CUPTI's callback id
    and correlation, a device event's what Kineto attached (as :class:`Ev`)."""

    def __init__(self, ev: Ev, meta: str) -> None:
        self._ev = ev
        self._meta = meta

    def __getattr__(self, name: str) -> Any:
        if name == "activity_type":
            raise AttributeError(name)
        return getattr(self._ev, name)

    def metadata_json(self) -> str:
        return self._meta


def _as_torch_2_11(raw: list[dict[str, Any]], evs: list[Ev]) -> list[Any]:
    out: list[Any] = []
    for i, (e, ev) in enumerate(zip(raw, evs, strict=True)):
        if e["cat"] == "cpu_op":
            meta = f'"Ev Idx": {i}'
        elif e["cat"] in HOST_CATS:
            meta = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in e["args"].items() if k != "External id")
        else:
            meta = ev.meta
        out.append(Torch211Event(ev, meta))
    return out


def _build(
    raw: list[dict[str, Any]], notes: list[str] | None = None, *, events: list[Any] | None = None
) -> list[TraceNode]:
    evs = events if events is not None else _events(raw)
    lo = min(e.start_ns() for e in evs)
    hi = max(e.start_ns() + e.duration_ns() for e in evs)
    cap = RankCapture(
        rank=0,
        comms=[],
        steps=[StepRecord(step=0, start_ns=lo - 1_000, end_ns=hi + 1_000)],
        groups=GROUPS,
        main_thread=111,
        ops=op_records(evs),
        syncs=sync_records(evs),
        device="cuda:0",
    )
    return build_nodes(cap, notes=notes)


def _gpu(nodes: list[TraceNode]) -> list[TraceNode]:
    return [n for n in nodes if n.attrs.get(Attr.STREAM_KIND) == "cuda"]


def _at(nodes: list[TraceNode], t_ns: int) -> TraceNode:
    """The host node on a thread whose span holds ``t_ns``."""
    around = [
        n
        for n in nodes
        if n.attrs.get(Attr.STREAM_KIND) == "thread" and n.start_ns <= t_ns <= n.start_ns + n.dur_ns
    ]
    return max(around, key=lambda n: n.start_ns)  # of two that meet at t_ns, the one starting there


def _by_corr(raw: list[dict[str, Any]], cat: str) -> dict[int, dict[str, Any]]:
    return {e["args"]["correlation"]: e for e in raw if e["cat"] == cat}


def _acyclic(nodes: list[TraceNode]) -> bool:
    deps = {n.node_id: (*n.ctrl_deps, *n.data_deps) for n in nodes}
    state: dict[int, int] = {}

    def visit(v: int) -> bool:
        state[v] = 1
        for w in deps.get(v, ()):
            if state.get(w) == 1 or (w not in state and not visit(w)):
                return False
        state[v] = 2
        return True

    return all(v in state or visit(v) for v in deps)


def test_cuda_events_split_into_host_ops_launch_calls_gpu_work_and_sync_activities() -> None:
    raw = _real("cuda_event_sync_kineto.json.gz")
    evs = _events(raw)
    ops = op_records(evs)
    calls = {o.corr: o for o in ops if o.kind == "cuda_runtime"}
    assert set(calls) == set(_by_corr(raw, "cuda_runtime"))
    gpu = [o for o in ops if not o.is_cpu]
    want = {e["args"]["correlation"] for e in raw if e["cat"] in {"kernel", "gpu_memcpy", "gpu_memset"}}
    assert {o.corr for o in gpu} == want  # the sync activities are not GPU work
    assert {o.thread for o in gpu} == {7}
    syncs = {s.corr: s for s in sync_records(evs)}
    for e in raw:
        if e["cat"] == "cuda_sync":
            a, s = e["args"], syncs[e["args"]["correlation"]]
            assert (s.kind, s.stream, s.device) == (e["name"], a["stream"], a["device"])
            assert (s.wait_on_stream, s.record_corr) == (
                a.get("wait_on_stream", -1),
                a.get("wait_on_cuda_event_record_corr_id", -1),
            )


def test_a_gpu_annotation_is_no_gpu_node_and_metadata_comes_from_either_accessor() -> None:
    ann = Ev("nccl:all_reduce", "gpu_user_annotation", 0, 5_000, resource=13, corr=4)
    kernel = Ev("sgemm", "kernel", 100, 2_000, resource=7, corr=5)
    assert [o.name for o in op_records([ann, kernel])] == ["sgemm"]

    class Extra(Ev):
        def metadata_json(self) -> str:
            return ""

        def extra_meta(self) -> dict[str, str]:
            return {"wait_on_stream": "20", "stream": "24"}

    sync = Extra("Stream Wait Event", "cuda_sync", 0, 10, resource=24, corr=9)
    assert event_metadata(sync) == {"wait_on_stream": "20", "stream": "24"}
    (rec,) = sync_records([sync])
    assert (rec.stream, rec.wait_on_stream, rec.record_corr) == (24, 20, -1)


def test_events_of_a_torch_without_activity_type_give_the_same_trace_told_apart_by_their_metadata() -> None:
    # torch 2.11 and 2.12 have no activity_type(): before, every device event (sync activities too) became
    # a GPU node and no runtime call was taken for a launch, so no launch or synchronisation edge was drawn
    raw = _real("cuda_event_sync_kineto.json.gz")
    evs = _events(raw)
    old = _as_torch_2_11(raw, evs)
    lo = min(e.t for e in evs)
    # Kineto's overhead ranges: host events on no thread (resource 0) with no metadata, over the ops
    overhead = [
        Torch211Event(Ev(name, "cpu_op", lo + 10, 50_000, resource=0, corr=2), "")  # a host event
        for name in ("Activity Buffer Request", "Lazy Function Loading")
    ]
    assert [activity(e) for e in old] == [activity(e) for e in evs]
    assert [activity(e) for e in overhead] == ["overhead", "overhead"]

    def key(o: Any) -> tuple[Any, ...]:
        return (o.name, o.start_ns, o.dur_ns, o.thread, o.is_cpu, o.corr, o.kind)

    assert [key(o) for o in op_records([*old, *overhead])] == [key(o) for o in op_records(evs)]
    assert sync_records(old) == sync_records(evs)
    want = [(n.node_id, n.name, n.ctrl_deps, n.attrs) for n in _build(raw)]
    assert [(n.node_id, n.name, n.ctrl_deps, n.attrs) for n in _build(raw, events=old)] == want
    assert sum(1 for n in _gpu(_build(raw, events=old)) if n.name in {"Event Sync", "Stream Sync"}) == 0


def test_hip_calls_and_rocm_kernels_of_a_torch_without_activity_type_are_told_apart_as_cudas_are() -> None:
    # ROCm's Kineto (roctracer and rocprofiler-sdk loggers) gives a HIP call HIP's API id ("cid"), not
    # CUPTI's callback id, and a kernel its dispatch kind and no grid where its launch's was not kept: the
    # call was taken for an operator and the kernel for a GPU annotation, left out
    rocm = [
        Torch211Event(Ev("aten::mm", "cpu_op", 0, 20_000, corr=13), '"Ev Idx": 4'),
        Torch211Event(
            Ev("hipLaunchKernel", "cuda_runtime", 2_000, 5_000, corr=121), '"cid": 83, "correlation": 121'
        ),
        Torch211Event(
            Ev("Cijk_Alik_Bljk_SB_MT64x16x32", "kernel", 10_000, 17_600, resource=0, corr=121),
            '"device": 0, "stream": 0, "hsa_queue": 0, "correlation": 121, "kind": "Dispatch Kernel"',
        ),
        Torch211Event(
            Ev("Memcpy DtoH (Device -> Host)", "gpu_memcpy", 30_000, 2_000, resource=0, corr=122),
            '"device": 0, "stream": 0, "correlation": 122, "kind": "DtoH", "bytes": 4',
        ),
        Torch211Event(  # a copy call's metadata names its kind too (roctracer's and rocprofiler-sdk's alike)
            Ev("hipMemcpyWithStream", "cuda_runtime", 29_000, 4_000, corr=122),
            '"stream": "0x5", "cid": 153, "correlation": 122, "src": "0x7f01", "dst": "0x7e02", "size": "4", '
            '"kind": "2"',
        ),
    ]
    assert [activity(e) for e in rocm] == ["cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "cuda_runtime"]

    def key(o: Any) -> tuple[Any, ...]:
        return (o.name, o.start_ns, o.dur_ns, o.thread, o.is_cpu, o.corr, o.kind)

    assert [key(o) for o in op_records(rocm)] == [key(o) for o in op_records([e._ev for e in rocm])]


class CountingTorch211Event(Torch211Event):
    """A :class:`Torch211Event` that counts the reads of its metadata text."""

    reads = 0

    def metadata_json(self) -> str:
        CountingTorch211Event.reads += 1
        return super().metadata_json()


def test_a_capture_on_a_torch_without_activity_type_reads_each_events_metadata_once_for_its_kind() -> None:
    # the kinds are inferred from the metadata text; op_records and sync_records each inferred them all,
    # so the end of a torch 2.11 capture read every event's metadata twice for its kind
    raw = _real("cuda_event_sync_kineto.json.gz")
    evs = _events(raw)
    old = [CountingTorch211Event(e._ev, e._meta) for e in _as_torch_2_11(raw, evs)]
    want_ops, want_syncs = op_records(old), sync_records(old)
    CountingTorch211Event.reads = 0
    kinds = activities(old)
    ops, syncs = op_records(old, kinds=kinds), sync_records(old, kinds)
    # one read per event for its kind, and one more per synchronisation activity for its streams
    assert CountingTorch211Event.reads == len(old) + kinds.count(SYNC_KIND)
    assert kinds.count(SYNC_KIND) == len(syncs) > 0
    assert (ops, syncs) == (want_ops, want_syncs)


def test_a_device_event_with_no_metadata_is_gpu_work_as_before() -> None:
    # without expose_kineto_event_metadata nothing tells the kinds apart: taken as before
    bare = Torch211Event(Ev("sgemm", "kernel", 0, 10, resource=7, corr=5), "")
    assert activity(bare) == ""
    assert [o.name for o in op_records([bare])] == ["sgemm"]
    annotation = Torch211Event(Ev("nccl:all_reduce", "gpu_user_annotation", 0, 10), '"device": 0')
    assert activity(annotation) == "gpu_user_annotation"


def test_a_record_functions_range_on_the_device_without_metadata_is_no_gpu_work_on_torch_2_11() -> None:
    # on an H200 (torch 2.11, fsdp2 on gloo with CUDA tensors) FSDP's, gloo's and the optimizer's ranges on
    # the device came with no metadata at all and became GPU nodes: 97 of rank 0's 342, which made its GPU
    # compute 4.2-4.6 ms a step where its kernels ran 0.16 ms
    fsdp = Torch211Event(Ev("FSDP::post_backward_reduce (6)", "gpu_user_annotation", 0, 4_000_000), "")
    kernel = Torch211Event(Ev("sgemm", "kernel", 10, 50, resource=7, corr=5), '"grid": [1, 1, 1]')
    assert [activity(fsdp), activity(kernel)] == ["gpu_user_annotation", "kernel"]
    assert [o.name for o in op_records([fsdp, kernel])] == ["sgemm"]


def test_allocation_records_of_a_torch_without_activity_type_are_no_operators_nor_gpu_work() -> None:
    # the full level's [memory] records (profile_memory) carry no metadata on torch 2.11 and sit on the
    # allocation's device: on an H200 140 of them became GPU nodes that host synchronisations waited on
    on_gpu = Torch211Event(Ev("[memory]", "kernel", 0, 0, resource=2908), "")
    on_host = Torch211Event(Ev("[memory]", "cpu_op", 5, 0, resource=2908), "")
    assert [activity(on_gpu), activity(on_host)] == ["cpu_instant_event"] * 2
    assert op_records([on_gpu, on_host]) == []


def test_every_gpu_node_gets_its_launch_time_and_depends_on_the_host_node_around_the_launch() -> None:
    raw = _real("cuda_event_sync_kineto.json.gz")
    nodes = _build(raw)
    runtime = _by_corr(raw, "cuda_runtime")
    gpu = _gpu(nodes)
    assert len(gpu) == sum(1 for e in raw if e["cat"] in {"kernel", "gpu_memcpy"})
    by_id = {n.node_id: n for n in nodes}
    unlaunched = []
    for g in gpu:
        (e,) = [
            e for e in raw if e["cat"] in {"kernel", "gpu_memcpy"} and round(e["ts"] * 1000) == g.start_ns
        ]
        launch = runtime[e["args"]["correlation"]]
        assert g.attrs[Attr.LAUNCH_NS] == round(launch["ts"] * 1000)
        host = _at(nodes, round(launch["ts"] * 1000))
        assert by_id[host.node_id].attrs[Attr.IS_CPU_OP] is True
        if host.node_id not in g.ctrl_deps:
            unlaunched.append(g)
            # .item(): the host node then synchronises on this node's stream (on this very node)
            assert g.node_id in host.ctrl_deps
    assert g.attrs[Attr.STREAM] == CUDA_STREAM_BASE + 7
    # only the copy .item() launched and waited for keeps just its stream order
    assert [g.name for g in unlaunched] == ["Memcpy DtoH (Device -> Pageable)"]


def test_host_synchronisations_depend_on_what_they_waited_for_and_make_no_cycle() -> None:
    raw = _real("cuda_event_sync_kineto.json.gz")
    notes: list[str] = []
    nodes = _build(raw, notes)
    runtime = {e["name"]: e for e in raw if e["cat"] == "cuda_runtime"}
    kernels = {e["args"]["correlation"]: e for e in raw if e["cat"] in {"kernel", "gpu_memcpy"}}
    gpu_at = {n.start_ns: n.node_id for n in _gpu(nodes)}

    def gpu(corr: int) -> int:
        return gpu_at[round(kernels[corr]["ts"] * 1000)]

    def deps_of(call: str) -> set[int]:
        host = _at(nodes, round(runtime[call]["ts"] * 1000))
        return {d for d in host.ctrl_deps if d in gpu_at.values()}

    launches = {e["args"]["correlation"]: e["ts"] for e in raw if e["cat"] == "cuda_runtime"}
    on_stream = sorted(kernels, key=lambda c: launches[c])  # one stream (7), in launch order
    # .item(): copy and stream synchronise inside one operator; that operator waits for the last node
    # launched on the stream before the synchronise, its own copy, whose launch edge then goes (a cycle)
    sync_ts = runtime["cudaStreamSynchronize"]["ts"]
    copy = [c for c in on_stream if launches[c] < sync_ts][-1]
    assert kernels[copy]["cat"] == "gpu_memcpy"
    assert deps_of("cudaStreamSynchronize") == {gpu(copy)}
    item = _at(nodes, round(sync_ts * 1000))
    assert item.node_id not in next(n for n in nodes if n.node_id == gpu(copy)).ctrl_deps
    # event synchronise: the last kernel launched on the recorded stream before the event record
    sync = next(e for e in raw if e["name"] == "Event Sync")
    record_ts = next(
        e["ts"]
        for e in raw
        if e["args"].get("correlation") == sync["args"]["wait_on_cuda_event_record_corr_id"]
    )
    assert deps_of("cudaEventSynchronize") == {
        gpu(max((c for c in on_stream if launches[c] < record_ts), key=lambda c: launches[c]))
    }
    # device synchronise: the last node of the (only) stream; the event query waits for nothing
    assert deps_of("cudaDeviceSynchronize") == {gpu(on_stream[-1])}
    assert deps_of("cudaEventQuery") == set()
    assert _acyclic(nodes)
    assert "3 host waits on the GPU" in notes, notes


def test_a_stream_wait_event_makes_the_waiting_streams_next_node_depend_on_the_recorded_streams_last() -> (
    None
):
    raw = _real("cuda_event_sync_multistream_kineto.json.gz")
    nodes = _build(raw)
    gpu = {n.start_ns: n for n in _gpu(nodes)}
    work = [e for e in raw if e["cat"] in {"kernel", "gpu_memset"}]
    launch = {e["args"]["correlation"]: e["ts"] for e in raw if e["cat"] == "cuda_runtime"}
    wait = next(e for e in raw if e["name"] == "Stream Wait Event")["args"]
    record_ts, wait_ts = launch[wait["wait_on_cuda_event_record_corr_id"]], launch[wait["correlation"]]
    src = max(
        (
            e
            for e in work
            if e["args"]["stream"] == wait["wait_on_stream"] and launch[e["args"]["correlation"]] < record_ts
        ),
        key=lambda e: launch[e["args"]["correlation"]],
    )
    dst = min(
        (
            e
            for e in work
            if e["args"]["stream"] == wait["stream"] and launch[e["args"]["correlation"]] > wait_ts
        ),
        key=lambda e: launch[e["args"]["correlation"]],
    )
    src_node, dst_node = gpu[round(src["ts"] * 1000)], gpu[round(dst["ts"] * 1000)]
    assert src_node.node_id in dst_node.ctrl_deps
    assert src_node.attrs[Attr.STREAM] != dst_node.attrs[Attr.STREAM]
    # the device synchronise at the end waits for the last node of each of the three streams
    sync = _at(
        nodes,
        round(launch[next(e for e in raw if e["name"] == "Context Sync")["args"]["correlation"]] * 1000),
    )
    last: dict[int, dict[str, Any]] = {}
    for e in sorted(work, key=lambda e: launch[e["args"]["correlation"]]):
        last[e["args"]["stream"]] = e
    assert {d for d in sync.ctrl_deps if d in {n.node_id for n in gpu.values()}} == {
        gpu[round(e["ts"] * 1000)].node_id for e in last.values()
    }
    assert len(last) == 3
    assert _acyclic(nodes)


def _stream_wait(t: int, *, corr: int, stream: int, on: int, record: int) -> Ev:
    """A Stream Wait Event activity: ``stream`` waits for the event ``record`` recorded on ``on``."""
    meta = (
        f'"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": {on}, '
        f'"wait_on_cuda_event_record_corr_id": {record}, "stream": {stream}'
    )
    return Ev("Stream Wait Event", "cuda_sync", t, 10, resource=stream, corr=corr, meta=meta)


def _nccl_capture(
    *, nccl_waits_on_compute: bool, relu_end_ns: int = 40_000, record_named: bool = True
) -> tuple[list[TraceNode], list[str]]:
    """A blocking all_reduce (called at 10 µs) whose NCCL kernel (stream 13) a compute kernel (stream 7)
    waits for; ``nccl_waits_on_compute``: NCCL's stream waits for the relu (stream 7, ending at
    ``relu_end_ns``), its kernel starting 1 µs after the relu's end (at 25 µs at the earliest); its wait's
    sync activity names the event record unless not ``record_named`` (torch 2.11: inferred from timing,
    behind a memset on stream 13)."""
    nccl_start_ns = max(relu_end_ns, 24_000) + 1_000
    call = CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::allreduce_", comm_type=CommType.ALL_REDUCE, pg_name="0",
        seq=1, src=-1, dst=-1, tag=0, numel=256, dtype="float32", size_bytes=1024, start_ns=10_000,
        issue_end_ns=12_000, end_ns=12_000, is_async=False, thread=111, step=0,
    )  # fmt: skip
    evs = [
        Ev("aten::relu", "cpu_op", 2_000, 3_000, corr=1),
        Ev("cudaMemsetAsync", "cuda_runtime", 2_200, 200, corr=799),
        Ev("Memset (Device)", "gpu_memset", 3_000, 500, resource=13, corr=799),
        Ev("cudaLaunchKernel", "cuda_runtime", 2_500, 1_000, corr=800),
        Ev("relu_kernel", "kernel", 4_000, relu_end_ns - 4_000, resource=7, corr=800),
        Ev("c10d::allreduce_", "cpu_op", 10_100, 1_800, corr=2),
        Ev("cudaLaunchKernelExC", "cuda_runtime", 11_000, 500, corr=900),
        Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", nccl_start_ns, 30_000, resource=13, corr=900),
        Ev("aten::add", "cpu_op", 12_200, 3_000, corr=3),
        Ev("cudaEventRecord", "cuda_runtime", 12_300, 100, corr=901),
        Ev("cudaStreamWaitEvent", "cuda_runtime", 12_500, 100, corr=902),
        Ev("cudaLaunchKernel", "cuda_runtime", 13_000, 1_000, corr=903),
        Ev("add_kernel", "kernel", nccl_start_ns + 30_500, 2_000, resource=7, corr=903),
    ]
    evs.append(_stream_wait(12_550, corr=902, stream=7, on=13, record=901))
    if nccl_waits_on_compute:  # NCCL's stream waits for the relu before the all_reduce
        evs += [
            Ev("cudaEventRecord", "cuda_runtime", 10_200, 100, corr=898),
            Ev("cudaStreamWaitEvent", "cuda_runtime", 10_400, 100, corr=899),
            _stream_wait(10_450, corr=899, stream=13, on=7, record=898 if record_named else -1),
        ]
    return _build_one_call(call, evs, end_ns=nccl_start_ns + 40_000, groups=GROUPS)


def _build_one_call(
    call: CommRecord, evs: list[Any], *, end_ns: int, groups: list[ProcessGroupInfo]
) -> tuple[list[TraceNode], list[str]]:
    """The nodes and notes of one CUDA rank's step ``[0, end_ns)`` holding ``call`` and Kineto's ``evs``."""
    cap = RankCapture(
        rank=0,
        comms=[call],
        steps=[StepRecord(step=0, start_ns=0, end_ns=end_ns)],
        groups=groups,
        main_thread=111,
        ops=op_records(evs),
        syncs=sync_records(evs),
        device="cuda:0",
    )
    notes: list[str] = []
    return build_nodes(cap, notes=notes), notes


def test_a_kernel_waiting_on_the_nccl_stream_depends_on_the_comm_node_which_gets_no_launch_edge() -> None:
    nodes, notes = _nccl_capture(nccl_waits_on_compute=True)
    (comm,) = [n for n in nodes if n.node_type == NodeType.COMM_COLL]
    add = next(n for n in nodes if n.name == "add_kernel")
    relu = next(n for n in nodes if n.name == "relu_kernel")
    assert comm.start_ns + comm.dur_ns == 71_000  # ends with its NCCL kernel
    assert comm.node_id in add.ctrl_deps
    assert Attr.LAUNCH_NS not in comm.attrs
    # NCCL's stream waited for the relu, which ended (40 µs) after the call (10 µs): the comm node depends
    # on it (a queue edge in the model: the transfer waits for it, the call does not)
    assert relu.node_id in comm.ctrl_deps
    assert Attr.INFERRED_DEPS not in comm.attrs
    queued = "1 stream waits of NCCL kernels (queue edges"
    assert any(queued in n for n in notes), notes
    assert not any("stream waits of NCCL kernels not written" in n for n in notes), notes
    assert add.attrs[Attr.LAUNCH_NS] == 13_000
    assert next(n for n in nodes if n.name == "aten::add").node_id in add.ctrl_deps
    assert _acyclic(nodes)


def test_a_kernel_launched_through_the_driver_api_gets_that_calls_launch_time_as_a_runtime_launch_does() -> (
    None
):
    # Triton launches with cuLaunchKernel, which Kineto files as cuda_driver, not cuda_runtime
    call = CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::allreduce_", comm_type=CommType.ALL_REDUCE, pg_name="0",
        seq=1, src=-1, dst=-1, tag=0, numel=256, dtype="float32", size_bytes=1024, start_ns=30_000,
        issue_end_ns=32_000, end_ns=32_000, is_async=False, thread=111, step=0,
    )  # fmt: skip
    evs = [
        Ev("triton_poi_fused_add", "cpu_op", 2_000, 4_000, corr=1),
        Ev("cuLaunchKernel", "cuda_driver", 2_500, 1_000, corr=800),
        Ev("triton_poi_fused_add_0", "kernel", 5_000, 3_000, resource=7, corr=800),
        Ev("aten::relu", "cpu_op", 10_000, 4_000, corr=2),
        Ev("cudaLaunchKernel", "cuda_runtime", 11_000, 1_000, corr=801),
        Ev("relu_kernel", "kernel", 13_000, 3_000, resource=7, corr=801),
    ]
    nodes, notes = _build_one_call(call, evs, end_ns=60_000, groups=GROUPS)
    triton = next(n for n in nodes if n.name == "triton_poi_fused_add_0")
    relu = next(n for n in nodes if n.name == "relu_kernel")
    assert (triton.attrs[Attr.LAUNCH_NS], relu.attrs[Attr.LAUNCH_NS]) == (2_500, 11_000)
    assert not any("launch call is not in the trace" in n for n in notes), notes


@pytest.mark.parametrize("record_named", [True, False], ids=["named-record", "torch-2.11-inferred"])
def test_a_comm_node_depends_on_the_kernel_its_nccl_stream_waited_for_whether_or_not_it_ran_at_the_call(
    record_named: bool,
) -> None:
    # a named wait is certain whenever the kernel ended. Without the record's name, a kernel still running
    # at the call explains the NCCL kernel's delay (an inferred wait); one that ended before it explains
    # nothing, but it was the last launched on the stream current at the call (c10d's stream sync), so the
    # comm node depends on it all the same (a what-if that slows it must hold the transfer)
    late, late_notes = _nccl_capture(
        nccl_waits_on_compute=True, record_named=record_named, relu_end_ns=40_000
    )
    early, early_notes = _nccl_capture(
        nccl_waits_on_compute=True, record_named=record_named, relu_end_ns=9_000
    )
    for nodes, relu_ends_after_call, notes in ((late, True, late_notes), (early, False, early_notes)):
        (comm,) = [n for n in nodes if n.node_type == NodeType.COMM_COLL]
        relu = next(n for n in nodes if n.name == "relu_kernel")
        assert comm.start_ns == 10_000
        assert relu.node_id in comm.ctrl_deps
        # without the record's name the wait is inferred from timing, and listed so
        assert _ids(comm.attrs.get(Attr.INFERRED_DEPS, [])) == (
            [relu.node_id] if relu_ends_after_call and not record_named else []
        )
        by_wait = relu_ends_after_call or record_named
        written = "1 stream waits of NCCL kernels (queue edges: the transfer waits, the call does not)"
        current = "1 stream waits of NCCL kernels for the stream current at their call"
        assert any(written in n for n in notes) is by_wait, notes
        assert any(current in n for n in notes) is not by_wait, notes
        assert not any("not written" in n for n in notes), notes
        assert _acyclic(nodes)


GLOO_GROUPS = [ProcessGroupInfo(name="0", ranks=(0,), desc="default_pg", backend="cpu:gloo,cuda:gloo")]


def _gloo_cuda_capture() -> tuple[list[TraceNode], list[str]]:
    """A blocking gloo all_gather of CUDA tensors (called at 10 µs on the main thread, done at 60 µs):
    its call launches the copy of the input to pinned host memory (stream 20), gloo's worker thread (its
    ``gloo:all_gather``, no host node) synchronises on it, moves the bytes, and launches the copy back
    (stream 24)."""
    call = CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::_allgather_base_", comm_type=CommType.ALL_GATHER,
        pg_name="0", seq=1, src=-1, dst=-1, tag=0, numel=256, dtype="float32", size_bytes=1024,
        start_ns=10_000, issue_end_ns=60_000, end_ns=60_000, is_async=False, thread=111, step=0,
    )  # fmt: skip
    worker = 2
    evs = [
        Ev("aten::mm", "cpu_op", 2_000, 3_000, corr=1),
        Ev("gloo:all_gather", "cpu_op", 11_500, 40_000, tid=worker, corr=3),  # the worker's work
        Ev("cudaMemcpyAsync", "cuda_runtime", 11_000, 500, corr=700),
        Ev("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 12_000, 2_000, resource=20, corr=700),
        Ev("cudaStreamSynchronize", "cuda_runtime", 11_800, 2_300, tid=worker, corr=701),
        Ev("Stream Sync", "cuda_sync", 14_000, 10, resource=20, corr=701,
           meta='"cuda_sync_kind": "Stream Sync", "stream": 20'),
        Ev("cudaMemcpyAsync", "cuda_runtime", 50_000, 500, tid=worker, corr=702),
        Ev("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 51_000, 2_000, resource=24, corr=702),
        Ev("aten::add", "cpu_op", 62_000, 3_000, corr=2),
    ]  # fmt: skip
    return _build_one_call(call, evs, end_ns=70_000, groups=GLOO_GROUPS)


def test_gloos_staging_copies_of_cuda_tensors_are_launched_by_their_collective_which_waits_for_the_first(
    tmp_path: Path,
) -> None:
    nodes, notes = _gloo_cuda_capture()
    (comm,) = [n for n in nodes if n.node_type == NodeType.COMM_COLL]
    copy_in = next(n for n in nodes if n.name.startswith("Memcpy DtoH"))
    copy_out = next(n for n in nodes if n.name.startswith("Memcpy HtoD"))
    assert comm.attrs[Attr.HOST_OP] is True  # gloo moved the bytes on the host
    # launched by the call (its thread) and by the worker thread inside it: both from the collective
    assert comm.node_id in copy_in.ctrl_deps and comm.node_id in copy_out.ctrl_deps
    assert (copy_in.attrs[Attr.LAUNCH_NS], copy_out.attrs[Attr.LAUNCH_NS]) == (11_000, 50_000)
    # the worker's synchronisation on the copy in is part of the collective: no edge (it would be a cycle)
    assert copy_in.node_id not in comm.ctrl_deps
    assert any("2 launch edges from collectives run on the host" in n for n in notes), notes
    assert any("1 synchronisations of host-run collectives on the copies they launched" in n for n in notes)
    # the execution model: launches met at the calls inside the collective
    _write_run(tmp_path / "run", nodes, groups=GLOO_GROUPS, backend="gloo")
    trace = load_trace(tmp_path / "run")
    m = execution_model(trace).ranks[0]
    row = {int(i): k for k, i in enumerate(trace.ranks[0].node_id)}
    launches = set(zip(m.launch_src.tolist(), m.launch_dst.tolist(), m.launch_off_ns.tolist(), strict=True))
    comm_row = row[comm.node_id]
    assert {(comm_row, row[copy_in.node_id], 1_000), (comm_row, row[copy_out.node_id], 40_000)} <= launches


def test_without_sync_activities_the_waits_are_inferred_listed_and_noted() -> None:
    raw = [e for e in _real("cuda_event_sync_multistream_kineto.json.gz") if e["cat"] != "cuda_sync"]
    notes: list[str] = []
    nodes = _build(raw, notes)
    gpu_ids = {n.node_id for n in _gpu(nodes)}
    inferred = {n.node_id: set(_ids(n.attrs.get(Attr.INFERRED_DEPS, []))) for n in nodes}
    # a GPU node's GPU deps beyond stream order are inferred event waits, listed as such
    for n in _gpu(nodes):
        assert {d for d in n.ctrl_deps if d in gpu_ids and d != _stream_prev(nodes, n)} == inferred[n.node_id]
    # the device synchronise needs no sync event: it waits for the last node of each of the three streams
    launch = {e["args"]["correlation"]: e["ts"] for e in raw if e["cat"] == "cuda_runtime"}
    work = sorted(
        (e for e in raw if e["cat"] in {"kernel", "gpu_memset"}),
        key=lambda e: launch[e["args"]["correlation"]],
    )
    last = {e["args"]["stream"]: round(e["ts"] * 1000) for e in work}
    sync = next(e for e in raw if e["name"] == "cudaDeviceSynchronize")
    host = _at(nodes, round(sync["ts"] * 1000))
    start_of = {n.node_id: n.start_ns for n in nodes}
    assert {start_of[d] for d in host.ctrl_deps if d in gpu_ids} == set(last.values())
    assert not inferred[host.node_id]
    assert any("no CUDA synchronisation activities" in n for n in notes), notes
    assert _acyclic(nodes)


def _ids(v: object) -> list[int]:
    assert isinstance(v, list | tuple), v
    return [int(d) for d in v]


def _stream_prev(nodes: list[TraceNode], n: TraceNode) -> int | None:
    same = [m for m in nodes if m.attrs.get(Attr.STREAM) == n.attrs[Attr.STREAM] and m.start_ns < n.start_ns]
    return max(same, key=lambda m: m.start_ns).node_id if same else None


def test_profiler_options_this_torch_lacks_are_left_out_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    _profiler = torch._C._profiler

    class OldConfig:
        """An _ExperimentalConfig from before enable_cuda_sync_events."""

        trace_only = False  # what torch.profiler reads of a config when it is created

        def __init__(
            self, *, capture_overload_names: bool = False, expose_kineto_event_metadata: bool = False
        ) -> None:
            self.overloads = capture_overload_names

    monkeypatch.setattr(_profiler, "_ExperimentalConfig", OldConfig)
    config, missing = compat.experimental_config(enable_cuda_sync_events=True, capture_overload_names=True)
    assert missing == ("enable_cuda_sync_events",)
    assert isinstance(config, OldConfig) and config.overloads is True
    k = KinetoCapture(cuda=True)
    assert len(k.notes) == 1 and "no CUDA synchronisation events" in k.notes[0]
    assert "enable_cuda_sync_events" in k.notes[0]
    monkeypatch.delattr(_profiler, "_ExperimentalConfig")
    assert compat.experimental_config(capture_overload_names=True) == (None, ("capture_overload_names",))


def test_this_torchs_profiler_takes_every_option_the_capture_asks_for() -> None:
    _, missing = compat.experimental_config(
        enable_cuda_sync_events=True, expose_kineto_event_metadata=True, capture_overload_names=True
    )
    assert missing == ()
    assert KinetoCapture(cuda=False, host_facts=True).notes == []


# ---- the flight recorder's device times (NCCL, TORCH_NCCL_ENABLE_TIMING) -------------------------------


def _nccl_entry(seq: int, created: int, **extra: object) -> dict[str, object]:
    return {
        "record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": created,
        "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
        "output_dtypes": ["Float"], "state": "scheduled", "time_discovered_started_ns": 0,
        "time_discovered_completed_ns": 0, "retired": False, "timeout_ms": 600000, "is_p2p": False,
        "thread_id": "140", "thread_name": "pt_main_thread", **extra,
    }  # fmt: skip


def _timed(seq: int, created: int, duration_ms: float, found_ns: int) -> dict[str, object]:
    return _nccl_entry(
        seq, created, state="completed", retired=True, duration_ms=duration_ms,
        time_discovered_started_ns=found_ns, time_discovered_completed_ns=found_ns,
    )  # fmt: skip


def test_nccl_entries_carry_their_discovered_times_and_device_duration() -> None:
    text = json.dumps(
        {"version": "2.10", "entries": [_timed(1, 1_000, 0.05, 200_000), _nccl_entry(2, 5_000)]}
    )
    timed, untimed = parse_dump(text, recorder="nccl")
    assert (timed.recorder, timed.started_ns, timed.completed_ns, timed.duration_ns) == (
        "nccl",
        200_000,
        200_000,
        50_000,
    )
    assert (untimed.started_ns, untimed.completed_ns, untimed.duration_ns) == (-1, -1, -1)
    pickled_form = {**_timed(3, 1_000, 0.05, 9_000), "time_discovered_started_ns": None}
    (e,) = parse_dump(json.dumps({"entries": [pickled_form]}), recorder="nccl")
    assert (e.started_ns, e.completed_ns) == (-1, 9_000)


def test_a_collective_runs_on_the_device_from_its_issue_or_its_predecessors_end_for_its_duration() -> None:
    entries = parse_dump(
        json.dumps(
            {
                "entries": [
                    _timed(1, 1_000, 0.05, 300_000),  # watchdog found it long after: starts at its issue
                    _timed(2, 20_000, 0.01, 300_000),  # issued while 1 ran: starts when 1 ended
                    _timed(3, 100_000, 0.02, 110_000),  # found at 110 us: it cannot have started after 90 us
                    _nccl_entry(4, 150_000),  # untimed: no span
                ]
            }
        ),
        recorder="nccl",
    )
    spans = device_spans(entries)
    assert spans == {
        ("0", 1): (1_000, 51_000),
        ("0", 2): (51_000, 61_000),
        ("0", 3): (100_000, 120_000),
    }
    gloo = [
        FrEntry(
            pg_name="0",
            seq=1,
            op="gloo:all_reduce",
            created_ns=1,
            numel=1,
            dtype="float32",
            size_bytes=4,
            duration_ns=5,
            completed_ns=9,
        )
    ]
    assert device_spans(gloo) == {}  # only NCCL's recorder times on the device


def test_a_later_bound_caps_a_start_the_predecessor_would_push_past_it() -> None:
    entries = parse_dump(
        json.dumps({"entries": [_timed(1, 1_000, 0.1, 500_000), _timed(2, 2_000, 0.01, 50_000)]}),
        recorder="nccl",
    )
    # 2 was found done at 50 us, so it started by 40 us, though 1 (issued first) is taken to end at 101 us
    assert device_spans(entries)[("0", 2)] == (40_000, 50_000)


def test_recorder_collectives_and_async_calls_end_on_the_device_while_blocking_calls_keep_their_return() -> (
    None
):
    entries = parse_dump(
        json.dumps(
            {
                "entries": [
                    _timed(1, 10_000, 0.05, 400_000),
                    _timed(2, 30_000, 0.02, 400_000),
                    _timed(3, 100_000, 0.01, 400_000),
                ]
            }
        ),
        recorder="nccl",
    )
    spans = device_spans(entries)
    steps = [StepRecord(step=0, start_ns=0, end_ns=300_000)]

    def call(start: int, end: int, *, is_async: bool) -> CommRecord:
        return CommRecord(
            node_type=NodeType.COMM_COLL, op="c10d::allreduce_", comm_type=CommType.ALL_REDUCE, pg_name="0",
            seq=-1, src=-1, dst=-1, tag=0, numel=1024, dtype="float32", size_bytes=4096, start_ns=start,
            issue_end_ns=end, end_ns=end, is_async=is_async, thread=1, step=0, ident=140,
        )  # fmt: skip

    hooked, extra, left_out = merge(
        entries, [call(29_000, 31_000, is_async=True), call(99_000, 101_000, is_async=False)], steps,
        thread=1, spans=spans,
    )  # fmt: skip
    assert left_out == 0
    (only_recorded,) = extra
    assert (only_recorded.seq, only_recorded.start_ns, only_recorded.end_ns) == (
        1,
        10_000,
        spans[("0", 1)][1],
    )
    async_call, blocking = hooked
    assert (async_call.seq, async_call.end_ns) == (2, spans[("0", 2)][1])
    assert (blocking.seq, blocking.end_ns) == (3, 101_000)
    note = flight.device_time_note(entries, spans, steps)
    assert note.startswith("3 NCCL collective(s) end on the device")


def test_collectives_without_device_times_are_counted_in_a_note_that_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = parse_dump(
        json.dumps({"entries": [_timed(1, 1_000, 0.05, 900_000), _nccl_entry(2, 5_000)]}), recorder="nccl"
    )
    steps = [StepRecord(step=0, start_ns=0, end_ns=10_000)]
    monkeypatch.delenv(flight.NCCL_TIMING_ENV, raising=False)
    note = flight.device_time_note(entries, device_spans(entries), steps)
    assert note.startswith("1 of 2 NCCL collective(s) without device times")
    assert "TORCH_NCCL_ENABLE_TIMING=1 was not set" in note
    monkeypatch.setenv(flight.NCCL_TIMING_ENV, "1")
    assert "the watchdog had not retired them" in flight.device_time_note(
        entries, device_spans(entries), steps
    )
    assert flight.device_time_note(entries, {}, [StepRecord(step=0, start_ns=50_000, end_ns=60_000)]) == ""


def test_the_end_of_a_window_waits_for_the_watchdog_to_time_its_last_collectives() -> None:
    pending = parse_dump(
        json.dumps({"entries": [_nccl_entry(1, 5_000, time_discovered_started_ns=6_000)]}), recorder="nccl"
    )
    done = parse_dump(json.dumps({"entries": [_timed(1, 5_000, 0.001, 7_000)]}), recorder="nccl")
    dumps = iter([pending, done])
    slept: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    got = settle(pending, 0, dump=lambda: next(dumps), sleep=sleep, clock=lambda: now[0])
    assert got == done and len(slept) == 2
    stuck = settle(pending, 0, dump=lambda: pending, sleep=sleep, clock=lambda: now[0], timeout_s=0.1)
    assert stuck == pending and now[0] >= 0.1
    untimed = parse_dump(json.dumps({"entries": [_nccl_entry(1, 5_000)]}), recorder="nccl")
    assert settle(untimed, 0, dump=lambda: pytest.fail("no wait for untimed entries"), sleep=sleep) == untimed


class _C10d:
    """A stand-in for ``torch._C._distributed_c10d`` with the given dumps."""

    def __init__(self, **dumps: list[dict[str, object]]) -> None:
        for name, entries in dumps.items():
            setattr(self, name, lambda _c, _a, es=entries: json.dumps({"entries": es}))


def test_both_recorders_are_read_nccls_and_the_generic_one(monkeypatch: pytest.MonkeyPatch) -> None:
    gloo = {**_nccl_entry(1, 2_000), "process_group": ["1", "g"], "profiling_name": "gloo:all_reduce"}
    monkeypatch.setattr(
        torch._C,
        "_distributed_c10d",
        _C10d(_dump_nccl_trace_json=[_timed(1, 1_000, 0.01, 5_000)], _dump_fr_trace_json=[gloo]),
    )
    got = sorted((e.recorder, e.pg_name, e.op) for e in flight.dump_entries())
    assert got == [("fr", "1", "gloo:all_reduce"), ("nccl", "0", "nccl:all_reduce")]
    monkeypatch.setattr(torch._C, "_distributed_c10d", _C10d())
    monkeypatch.setenv(flight.FR_BUFFER_ENV, "100")
    with pytest.raises(CaptureError, match="has neither dump"):
        flight.dump_entries()
    monkeypatch.delenv(flight.FR_BUFFER_ENV)
    assert flight.dump_entries() == []  # the recorder is off: nothing was expected


def test_the_legacy_buffer_variable_turns_the_recorder_on_as_torch_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(flight.FR_BUFFER_ENV, raising=False)
    monkeypatch.setenv(flight.FR_BUFFER_LEGACY_ENV, "300")
    assert flight.buffer_size() == 300
    monkeypatch.setenv(flight.FR_BUFFER_ENV, "50")
    assert flight.buffer_size() == 50


def test_each_recorder_numbers_its_own_entries_when_losses_are_found() -> None:
    steps = [StepRecord(step=0, start_ns=0, end_ns=100_000)]
    # NCCL's recorder kept all of group "0" from its first entry; the generic one wrapped (ids from 40)
    nccl = [
        FrEntry(
            pg_name="0",
            seq=s,
            op="nccl:all_reduce",
            created_ns=1_000 * s,
            numel=1,
            dtype="float32",
            size_bytes=4,
            record_id=s - 1,
            recorder="nccl",
        )
        for s in (1, 2, 3)
    ]
    gloo = [
        FrEntry(
            pg_name="1",
            seq=s,
            op="gloo:all_reduce",
            created_ns=50_000 + s,
            numel=1,
            dtype="float32",
            size_bytes=4,
            record_id=40 + s,
            recorder="fr",
        )
        for s in (5, 6)
    ]
    lost = flight.losses([*nccl, *gloo], steps, ["0", "1"])
    assert [(x.pg_name, x.first_seq, x.last_seq) for x in lost] == [("1", 1, 4)]


def test_skewlens_profile_turns_nccl_timing_on_unless_the_user_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(flight.NCCL_TIMING_ENV, raising=False)
    env = capture_env(tmp_path, Level.COLLECTIVES, StepWindow(), keep_raw=False, clock_timeout_s=1.0)
    assert env[flight.NCCL_TIMING_ENV] == "1"
    monkeypatch.setenv(flight.NCCL_TIMING_ENV, "0")
    env = capture_env(tmp_path, Level.COLLECTIVES, StepWindow(), keep_raw=False, clock_timeout_s=1.0)
    assert env[flight.NCCL_TIMING_ENV] == "0"


def test_a_torch_without_the_record_function_switch_issues_calls_profiled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._C._autograd as autograd

    assert compat.record_function_switch() is autograd._enable_record_function
    monkeypatch.delattr(autograd, "_enable_record_function")
    assert compat.record_function_switch() is None
    from skewlens.profiler.capture import hooks

    monkeypatch.setattr(hooks, "_enable_record_function", None)
    h = hooks.CommHooks(lambda: True, lambda: 0, quiet=lambda: True)
    result, start, end, quiet = h._timed(lambda x: x + 1, (1,), {})
    assert result == 2 and start <= end
    # profiled after all: gloo's worker records its event, which the call's record claims (CommRecord.quiet)
    assert quiet is False
    monkeypatch.setattr(hooks, "_enable_record_function", lambda on: None)
    assert h._timed(lambda x: x + 1, (1,), {})[3] is True


def test_groups_are_kept_apart_by_group_in_device_spans() -> None:
    a = _timed(1, 1_000, 0.05, 900_000)
    b = {**_timed(1, 2_000, 0.05, 900_000), "process_group": ["1", "tp"]}
    spans = device_spans(parse_dump(json.dumps({"entries": [a, b]}), recorder="nccl"))
    assert spans[("1", 1)][0] == 2_000  # its own stream: not after group "0"'s collective
    per_group: dict[str, int] = defaultdict(int)
    for pg, _ in spans:
        per_group[pg] += 1
    assert dict(per_group) == {"0": 1, "1": 1}


def _write_run(
    run: Path, nodes: list[TraceNode], *, groups: list[ProcessGroupInfo] = GROUPS, backend: str = "nccl"
) -> None:
    """The captured nodes as rank 0's trace of a one-rank run."""
    run.mkdir()
    with EtWriter(rank_file(run, 0), {"rank": 0, "world_size": 1}) as w:
        for n in nodes:
            w.write(n)
    write_manifest(
        run,
        Manifest(
            world_size=1,
            ranks=(0,),
            process_groups=tuple(groups),
            backend=backend,
            level=Level.OPS,
            devices={0: "cuda:0"},
        ),
    )


# the relu ends 30 µs after the call, or 10 µs (within the model's timestamp skew, SKEW_NS, for other
# edges, which would make it a start edge holding the call: the collective replayed 10 µs late), or 1 µs
# before the call (a start edge too: slowed, it would hold the call)
@pytest.mark.parametrize("relu_end_ns", [40_000, 20_000, 9_000])
def test_a_collective_whose_nccl_stream_waited_for_a_kernel_moves_with_it_and_its_call_does_not(
    tmp_path: Path, relu_end_ns: int
) -> None:
    nodes, _notes = _nccl_capture(nccl_waits_on_compute=True, relu_end_ns=relu_end_ns)
    comm_end_ns = max(relu_end_ns, 24_000) + 31_000  # (the fixture's NCCL kernel)
    relu_ns = relu_end_ns - 4_000
    _write_run(tmp_path / "run", nodes)
    run = load_trace(tmp_path / "run")
    rt = run.ranks[0]
    row = {int(i): k for k, i in enumerate(rt.node_id)}
    by_name = {n.name: row[n.node_id] for n in nodes if n.node_id in row}
    comm, relu = by_name["c10d::allreduce_"], by_name["relu_kernel"]
    m = execution_model(run).ranks[0]
    # the transfer queues behind the relu (from 4 µs), the call (10 µs) does not wait for it
    assert (relu, comm) in set(zip(m.queue_src.tolist(), m.queue_dst.tolist(), strict=True))
    assert (relu, comm) not in set(zip(m.start_src.tolist(), m.start_dst.tolist(), strict=True))
    # ... and the real replay on CUDA issues the collective once the relu has ended on the device
    (op,) = [o for o in rank_plan(rt, run, NO_EFFECTS) if o.row == comm]
    assert op.queue_deps == (relu,)
    assert relu not in op.deps
    base = simulate(run)
    timed = rt.node_type != int(NodeType.METADATA)
    assert (base.start_ns[0][timed] == rt.start_ns[timed]).all()
    assert (base.end_ns[0][timed] == rt.end_ns[timed]).all()
    assert int(base.start_ns[0][comm]) == 10_000
    assert int(base.end_ns[0][comm]) == comm_end_ns
    # the relu twice as long: the call stays, the collective's transfer begins when the relu ends (or at
    # the call) and lasts as recorded
    slow = simulate(
        run, effects=SlowdownModel([Slowdown(kind="op", ranks=(0,), factor=2.0, pattern="relu_kernel")])
    )
    assert int(slow.end_ns[0][relu]) == relu_end_ns + relu_ns
    assert int(slow.start_ns[0][comm]) == 10_000
    transfer_ns = comm_end_ns - max(10_000, relu_end_ns)
    assert int(slow.end_ns[0][comm]) == max(10_000, relu_end_ns + relu_ns) + transfer_ns


def _on_gpu(monkeypatch: pytest.MonkeyPatch, index: int, props: Any) -> None:
    """This process's torch.cuda as on a rank whose current device is ``index``, of properties ``props`` (an
    exception: what reading them raises)."""

    def get_device_properties(i: int) -> Any:
        assert i == index  # the rank's own device, not device 0
        if isinstance(props, Exception):
            raise props
        return props

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: index)
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)


def test_a_capture_on_cuda_records_each_ranks_gpu_model_sms_and_memory_in_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # skewlens profile said cuda:N of each rank and nothing of its GPU: analyze's mixed-GPU note and the
    # export's ranks.gpu came only from imported traces (unverified on a device: torch.cuda is stood in for)
    from types import SimpleNamespace

    from skewlens.profiler.capture.run import finalize_run
    from skewlens.profiler.capture.session import CaptureSession
    from skewlens.profiler.manifest import read_manifest

    window = StepWindow(wait=0, warmup=0, active=1)
    gpus = {
        0: SimpleNamespace(
            name="NVIDIA H100 80GB HBM3", multi_processor_count=132, total_memory=85_045_231_616
        ),
        1: SimpleNamespace(
            name="NVIDIA A100-SXM4-80GB", multi_processor_count=108, total_memory=85_899_345_920
        ),
        2: RuntimeError("CUDA error: unspecified launch failure"),
    }
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setattr("signal.signal", lambda *_a: None)  # (the capture's SIGTERM handler)
    for rank, props in gpus.items():
        monkeypatch.setenv("RANK", str(rank))
        with monkeypatch.context() as m:
            _on_gpu(m, rank + 4, props)
            s = CaptureSession(tmp_path, level=Level.COLLECTIVES, window=window, auto_step=False).install()
            try:
                s.step()
            finally:
                s.uninstall()
    assert finalize_run(tmp_path, level=Level.COLLECTIVES, window=window, world_size=3) is not None
    m = read_manifest(tmp_path)
    assert m.devices == {0: "cuda:4", 1: "cuda:5", 2: "cuda:6"}
    # a device that could not say (rank 2) is left out, as a trace without deviceProperties is; its save
    # went on
    assert m.gpus == {
        0: "NVIDIA H100 80GB HBM3 (132 SMs, 79.2 GiB)",
        1: "NVIDIA A100-SXM4-80GB (108 SMs, 80.0 GiB)",
    }
    assert m.ranks == (0, 1, 2) and m.missing_ranks == ()
