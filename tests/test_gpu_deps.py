"""The GPU-dependency rules (:mod:`skewlens.profiler.gpu_deps`): on plain records, and through both of their
writers, the CUDA capture and the Kineto importer, which must give the same edges for the same events.

Expected edges are worked out here from the synthetic schedules (times in µs), not from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from skewlens.profiler.capture.build import RankCapture, build_nodes
from skewlens.profiler.capture.records import CudaSyncRecord, OpRecord, StepRecord
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.gpu_deps import (
    CONTEXT_SYNC,
    EVENT_SYNC,
    PAGEABLE_DTOH,
    STREAM_SYNC,
    STREAM_WAIT,
    Call,
    GpuDeps,
    GpuNode,
    SyncActivity,
    gpu_dependencies,
)
from skewlens.profiler.importers import import_traces
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.vocab import Attr

# -- the rules on plain records ---------------------------------------------------------------------------


def _node(key: int, stream: int, launch: int, start: int, end: int, *, host: int | None = None) -> GpuNode:
    return GpuNode(
        key=key, device=0, stream=stream, launch_ns=launch, start_ns=start, end_ns=end, corr=key, host=host
    )


def _call(corr: int, name: str, start: int, end: int, host: int | None = None) -> tuple[int, Call]:
    return corr, Call(key=1000 + corr, name=name, start_ns=start, end_ns=end, host=host)


def _stream_20_waits_for_7(nodes: list[GpuNode]) -> GpuDeps:
    """``gpu_dependencies`` of ``nodes`` where stream 20 waits for an event recorded on stream 7: the record
    call at 2-2.01 µs, the cudaStreamWaitEvent call at 2.1-2.11 µs (CUDA sync events on)."""
    calls = dict([_call(1, "cudaEventRecord", 2_000, 2_010), _call(2, "cudaStreamWaitEvent", 2_100, 2_110)])
    wait = SyncActivity(kind=STREAM_WAIT, corr=2, device=0, stream=20, wait_on_stream=7, record_corr=1)
    return gpu_dependencies(nodes, calls, [wait], default_device=0)


def test_an_op_that_synchronises_on_its_own_copy_waits_for_it_and_the_copy_is_launched_in_it() -> None:
    # op 1 launches kernel 10 (stream 7); op 2 (.item()) launches copy 11 on stream 7, then synchronises
    nodes = [_node(10, 7, 100, 200, 900, host=1), _node(11, 7, 1_000, 1_100, 1_300, host=2)]
    calls = dict([_call(10, "cudaLaunchKernel", 100, 150), _call(11, "cudaMemcpyAsync", 1_000, 1_050)])
    calls.update([_call(12, "cudaStreamSynchronize", 1_060, 1_400, host=2)])
    found = gpu_dependencies(
        nodes, calls, [SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)], default_device=0
    )
    assert found.deps[2] == [11]
    assert found.launch == {10: 1}  # the copy's launch as a dependency would close a cycle with the wait:
    assert found.launched_in == {11: 2}  # launched in op 2 all the same
    assert not found.inferred
    assert found.notes == ["1 host waits on the GPU"]


def test_an_async_copy_into_pageable_host_memory_blocks_its_op_until_the_copy_ends() -> None:
    # op 1 launches kernel 10 (stream 7, ends at 900); op 2 (`.cpu()`) issues copy 11 with cudaMemcpyAsync,
    # which returns only when the copy, queued behind kernel 10, has ended (CUDA: DtoH into pageable memory)
    def copy(name: str) -> GpuNode:
        return GpuNode(
            key=11, device=0, stream=7, launch_ns=300, start_ns=900, end_ns=950, corr=11, host=2, name=name
        )

    calls = dict([_call(10, "cudaLaunchKernel", 100, 150), _call(11, "cudaMemcpyAsync", 300, 960, host=2)])
    kernel = _node(10, 7, 100, 200, 900, host=1)
    found = gpu_dependencies([kernel, copy(PAGEABLE_DTOH)], calls, [], default_device=0)
    assert dict(found.deps) == {2: [11]}
    assert found.launch == {10: 1}  # its op waits for it: launched in it, not a dependency of it
    assert found.launched_in == {11: 2}
    assert not found.inferred
    assert found.notes == ["1 host waits on the GPU"]
    # into pinned memory the same call returns at once: no wait
    found = gpu_dependencies([kernel, copy("Memcpy DtoH (Device -> Pinned)")], calls, [], default_device=0)
    assert not any(found.deps.values())
    assert found.launch == {10: 1, 11: 2}
    assert found.launched_in == {}


def test_a_stream_wait_makes_the_waiting_streams_next_node_wait_for_the_recorded_streams_last() -> None:
    nodes = [
        _node(10, 7, 100, 200, 5_000),
        _node(11, 7, 3_000, 5_000, 6_000),
        _node(12, 20, 2_500, 5_100, 5_500),
    ]
    found = _stream_20_waits_for_7(nodes)
    assert dict(found.deps) == {12: [10]}  # 11 was launched after the record
    contradicted = [_node(10, 7, 100, 200, 9_000), *nodes[1:]]  # ends after 12 started: not written
    found = _stream_20_waits_for_7(contradicted)
    assert not any(found.deps.values())
    assert found.notes == ["1 stream waits contradicted by the recorded times (ignored)"]


def test_without_sync_events_a_delayed_node_after_a_stream_wait_call_waits_for_another_streams_node() -> None:
    # 12 follows 11 on stream 20, launched long before it starts: 31 µs late, after a cudaStreamWaitEvent,
    # 15 µs after 10 (stream 7) ended
    nodes = [_node(10, 7, 12_000, 20_000, 60_000), _node(11, 20, 2_000, 5_000, 9_000)]
    nodes.append(_node(12, 20, 44_000, 75_000, 85_000))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert found.deps[12] == [10]
    assert found.inferred[12] == [10]
    assert found.notes == [
        (
            "no CUDA sync events in the trace: 1 GPU wait edge(s) inferred from timing "
            "(0.031 ms of recorded kernel waiting rests on event waits inferred so)"
        )
    ]
    # the same delay with no stream-wait call before it is no event wait
    assert not any(gpu_dependencies(nodes, {}, [], default_device=0).deps.values())


@pytest.mark.parametrize(
    ("issue_ns", "inferred"), [(50_000, True), (60_000, False), (61_000, False), (None, False)]
)
def test_without_sync_events_a_comm_node_depends_on_the_last_node_of_the_stream_current_at_its_call(
    issue_ns: int | None, inferred: bool
) -> None:
    # as above, 12 being a comm node's NCCL kernel whose call began at issue_ns; 10 (stream 7, launched at
    # 12 µs) is the last other node launched before the call, so stream 7 was current there: c10d made the
    # NCCL stream wait for 10 either way. 10 ended (60 µs) after a call at 50 µs: the timing inference finds
    # it too (the recorded waiting rests on it); before one at 61 µs it held nothing as recorded, but a
    # what-if that slows it must hold the collective; so for one at 60 µs, the instant it ended. A comm node
    # without its call's start gets no edge.
    nodes = [_node(10, 7, 12_000, 20_000, 60_000), _node(11, 20, 2_000, 5_000, 9_000)]
    nccl = _node(12, 20, 44_000, 75_000, 85_000, host=5)
    nodes.append(msgspec.structs.replace(nccl, comm=True, issue_ns=issue_ns))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert found.deps.get(12, []) == ([] if issue_ns is None else [10])
    assert found.inferred.get(12, []) == ([10] if inferred else [])
    assert found.launch == {}  # a comm node starts at its own call
    queued = "1 stream waits of NCCL kernels (queue edges: the transfer waits, the call does not)"
    current = (
        "1 stream waits of NCCL kernels for the stream current at their call (c10d's; from the launch order)"
    )
    assert (queued in found.notes) is inferred, found.notes
    assert (current in found.notes) is (issue_ns is not None and not inferred), found.notes


_NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _launched(key: int, stream: int, times: tuple[int, int, int], thread: int | None, name: str) -> GpuNode:
    """A GPU node launched by host thread ``thread`` at ``times`` (launch, start, end)."""
    launch, start, end = times
    return GpuNode(
        key=key, device=0, stream=stream, launch_ns=launch, start_ns=start, end_ns=end, corr=key, name=name,
        thread=thread,
    )  # fmt: skip


@pytest.mark.parametrize("kernel", [_NCCL_KERNEL, "mscclKernel_Sum_float_LL_false"])  # NCCL's, RCCL's MSCCL
@pytest.mark.parametrize("thread_known", [True, False])
def test_an_nccl_kernel_waits_for_the_last_node_of_the_stream_its_calling_thread_had_current(
    thread_known: bool, kernel: str
) -> None:
    # thread 1 launches kernel 10 on stream 7 (ended at 20 µs), thread 2 then copy 11 on stream 24, then
    # thread 1 calls the all_reduce whose NCCL kernel 12 (stream 20) starts at once: c10d made stream 20
    # wait for thread 1's current stream, 7, so 12 depends on 10 though 10 had ended (no timing says so).
    # Where the launches' threads are unknown, the last other node launched on the device says the stream.
    def node(key: int, stream: int, launch: int, start: int, end: int, thread: int, name: str) -> GpuNode:
        return _launched(key, stream, (launch, start, end), thread if thread_known else None, name)

    nodes = [
        node(10, 7, 10_000, 11_000, 20_000, 1, "void gemm_kernel"),
        node(11, 24, 30_000, 31_000, 32_000, 2, "Memcpy HtoD (Pinned -> Device)"),
        node(12, 20, 40_000, 41_000, 60_000, 1, kernel),
    ]
    found = gpu_dependencies(nodes, {}, [], default_device=0)
    assert found.deps[12] == ([10] if thread_known else [11])
    assert not found.inferred
    assert found.notes == [
        "1 stream waits of NCCL kernels for the stream current at their call (c10d's; from the launch order)"
    ]
    # a named Stream Wait Event decides: stream 20 waited for stream 24 (its record after the copy's launch)
    calls = dict(
        [_call(1, "cudaEventRecord", 33_000, 33_100), _call(2, "cudaStreamWaitEvent", 34_000, 34_100)]
    )
    wait = SyncActivity(kind=STREAM_WAIT, corr=2, device=0, stream=20, wait_on_stream=24, record_corr=1)
    assert dict(gpu_dependencies(nodes, calls, [wait], default_device=0).deps) == {12: [11]}


def test_the_stream_current_at_an_nccl_call_is_the_one_last_launched_on_and_its_last_node_is_waited_for() -> (
    None
):
    # thread 1 launches 10 on stream 7 at 10 µs (queued: it runs at 30-36 µs), then 13 on stream 8 at 12 µs,
    # so stream 8 is current at its all_reduce's call (40 µs), whatever ran first; thread 2 launched 14 on
    # stream 8 at 20 µs, the last node there before the call, which ends 1.5 µs after the NCCL kernel 12
    # started: within the clock slack, so the wait on it is written
    nodes = [
        _launched(10, 7, (10_000, 30_000, 36_000), 1, "void gemm_kernel"),
        _launched(13, 8, (12_000, 13_000, 15_000), 1, "void gemm_kernel"),
        _launched(14, 8, (20_000, 21_000, 42_500), 2, "void relu_kernel"),
        _launched(12, 20, (40_000, 41_000, 60_000), 1, _NCCL_KERNEL),
    ]
    assert dict(gpu_dependencies(nodes, {}, [], default_device=0).deps) == {12: [14]}
    # 14 ending 9 µs after 12 started, the times contradict the wait: not written, and counted
    nodes[2] = _launched(14, 8, (20_000, 21_000, 50_000), 2, "void relu_kernel")
    found = gpu_dependencies(nodes, {}, [], default_device=0)
    assert found.deps.get(12, []) == []
    assert found.notes == ["1 stream waits contradicted by the recorded times (ignored)"]
    # threads unknown, on the rank's second GPU: 11, launched at the instant of the NCCL kernel's launch, was
    # not launched before it
    nodes = [
        _launched(10, 7, (10_000, 11_000, 20_000), None, "void gemm_kernel"),
        _launched(11, 8, (40_000, 40_500, 45_000), None, "void gemm_kernel"),
        _launched(12, 20, (40_000, 41_000, 60_000), None, _NCCL_KERNEL),
    ]
    nodes = [msgspec.structs.replace(g, device=1) for g in nodes]
    assert dict(gpu_dependencies(nodes, {}, [], default_device=0).deps) == {12: [10]}


def test_a_named_stream_wait_decides_an_nccl_kernels_wait_with_nothing_to_wait_for_or_without_its_call() -> (
    None
):
    # stream 20 (NCCL's) waited for an event recorded on stream 24 at 33 µs, where nothing had run: the
    # kernel 12 waited for nothing, though thread 1's current stream 7 ran 10 before the call
    calls = dict(
        [_call(1, "cudaEventRecord", 33_000, 33_100), _call(2, "cudaStreamWaitEvent", 34_000, 34_100)]
    )
    wait = SyncActivity(kind=STREAM_WAIT, corr=2, device=0, stream=20, wait_on_stream=24, record_corr=1)
    nodes = [
        _launched(10, 7, (10_000, 11_000, 20_000), 1, "void gemm_kernel"),
        _launched(12, 20, (40_000, 41_000, 60_000), 1, _NCCL_KERNEL),
    ]
    found = gpu_dependencies(nodes, calls, [wait], default_device=0)
    assert (found.deps.get(12, []), found.notes) == ([], [])
    # a copy 11 ran on stream 24 before the record, but 12 is a comm node without its call's start: no edge
    nodes.append(_launched(11, 24, (30_000, 31_000, 32_000), 2, "Memcpy HtoD (Pinned -> Device)"))
    nodes[1] = msgspec.structs.replace(nodes[1], comm=True, issue_ns=None, host=5)
    found = gpu_dependencies(nodes, calls, [wait], default_device=0)
    assert found.deps.get(12, []) == []
    assert found.notes == [
        "1 stream waits of NCCL kernels not written (of a comm node without its call's start)"
    ]


def test_a_stream_wait_whose_sync_event_names_no_record_is_inferred_from_timing_behind_that_call() -> None:
    # torch 2.11's Kineto: the Stream Wait Event activity gives the waiting stream and the event's id, but
    # wait_on_stream and the record's correlation are -1. 12 follows 11 on stream 20, 31 µs late, after
    # the wait call, 15 µs after 10 (stream 7) ended; a second wait call (corr 3) has its record named
    nodes = [_node(10, 7, 12_000, 20_000, 60_000), _node(11, 20, 2_000, 5_000, 9_000)]
    nodes.append(_node(12, 20, 44_000, 75_000, 85_000))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    unnamed = SyncActivity(kind=STREAM_WAIT, corr=1, device=0, stream=20)
    found = gpu_dependencies(nodes, calls, [unnamed], default_device=0)
    assert found.deps[12] == [10]
    assert found.inferred[12] == [10]
    assert found.notes == [
        (
            "1 CUDA stream wait(s) whose sync event names no event record (the trace gives only the event's "
            "id): 1 GPU wait edge(s) inferred from timing (0.031 ms of recorded kernel waiting rests on them)"
        )
    ]
    # a wait whose record is named is not inferred over: the named rule alone decides (nothing ran on
    # stream 7 before its record at 1 µs)
    calls.update([_call(2, "cudaEventRecord", 1_000, 1_010)])
    named = SyncActivity(kind=STREAM_WAIT, corr=1, device=0, stream=20, wait_on_stream=7, record_corr=2)
    found = gpu_dependencies(nodes, calls, [named], default_device=0)
    assert not any(found.deps.values()) and not found.inferred


def test_an_event_synchronise_whose_sync_event_names_no_record_waits_for_the_node_that_ended_last() -> None:
    # op 1 (host node 1) blocks in cudaEventSynchronize from 1 to 9 µs; kernel 10 (stream 7) ends at 8 µs,
    # kernel 11 (stream 20) at 3 µs: the call returned when 10 ended
    nodes = [_node(10, 7, 100, 200, 8_000), _node(11, 20, 150, 300, 3_000)]
    calls = dict([_call(5, "cudaEventSynchronize", 1_000, 9_000, host=1)])
    sync = SyncActivity(kind=EVENT_SYNC, corr=5, device=0, stream=7)
    found = gpu_dependencies(nodes, calls, [sync], default_device=0)
    assert found.deps[1] == [10]
    assert found.inferred[1] == [10]


def test_a_blocking_call_inside_no_host_node_is_a_node_of_its_own_and_a_comm_kernel_only_a_dependency() -> (
    None
):
    comm = GpuNode(
        key=10, device=1, stream=13, launch_ns=100, start_ns=200, end_ns=900, corr=10, host=5, comm=True
    )
    calls = dict(
        [_call(10, "cudaLaunchKernelExC", 100, 150, host=5), _call(11, "cudaDeviceSynchronize", 1_000, 1_200)]
    )
    found = gpu_dependencies([comm], calls, [], default_device=1)  # no sync event: the rank's device
    assert found.bare_calls == [1011]
    assert found.deps[1011] == [10]
    assert found.launch == {}  # a comm node starts at its own call
    assert found.launched_in == {}  # ... so it is no launch in any form (skl_launched_in is a launch too)
    context = SyncActivity(kind=CONTEXT_SYNC, corr=11, device=0)  # ... or the device the activity names
    assert not any(gpu_dependencies([comm], calls, [context], default_device=1).deps.values())


def test_a_node_launched_at_the_instant_of_a_call_is_neither_launched_before_it_nor_after_it() -> None:
    # another thread launches 11 on stream 7 at 1 µs, the instant op 2's cudaStreamSynchronize (1-1.4 µs)
    # starts: the synchronise waits for the last node launched strictly before it, 10
    nodes = [_node(10, 7, 100, 200, 900), _node(11, 7, 1_000, 1_000, 1_300)]
    calls = dict([_call(12, "cudaStreamSynchronize", 1_000, 1_400, host=2)])
    sync = SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)
    assert gpu_dependencies(nodes, calls, [sync], default_device=0).deps[2] == [10]
    # stream 20's 12 is launched at 2.1 µs, the instant of the cudaStreamWaitEvent call: the wait holds the
    # first node launched strictly after the call, 13 (12, starting at 2.2 µs before 10 ended at 5 µs,
    # would contradict the wait)
    nodes = [
        _node(10, 7, 100, 200, 5_000),
        _node(12, 20, 2_100, 2_200, 2_300),
        _node(13, 20, 2_500, 5_100, 5_500),
    ]
    found = _stream_20_waits_for_7(nodes)
    assert dict(found.deps) == {13: [10]}


def test_what_is_waited_for_may_end_up_to_the_clock_slack_after_the_wait_without_contradicting_it() -> None:
    # 10 ends at 6 µs, 1 µs after the cudaStreamSynchronize it waits for returned (5 µs): within the 2 µs
    # clock slack, so the wait is written
    nodes = [_node(10, 7, 100, 200, 6_000)]
    calls = dict([_call(12, "cudaStreamSynchronize", 1_000, 5_000, host=2)])
    sync = SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)
    found = gpu_dependencies(nodes, calls, [sync], default_device=0)
    assert found.deps[2] == [10]
    assert found.notes == ["1 host waits on the GPU"]
    # a stream wait: 10 ends at 5 µs, 1 µs after the waiting 12 started (4 µs): written too
    nodes = [_node(10, 7, 100, 200, 5_000), _node(12, 20, 2_500, 4_000, 5_500)]
    found = _stream_20_waits_for_7(nodes)
    assert dict(found.deps) == {12: [10]}
    assert found.notes == ["1 GPU event waits across streams"]


def test_an_op_that_waits_for_its_copy_in_the_copy_call_and_again_in_a_synchronise_depends_on_it_once() -> (
    None
):
    # op 2 copies 11 (stream 7) with a blocking cudaMemcpy (1-1.35 µs), then synchronises stream 7
    # (1.36-1.4 µs), whose last node launched before is the same copy: one edge, one wait counted
    nodes = [_node(10, 7, 100, 200, 900, host=1), _node(11, 7, 1_000, 1_100, 1_300, host=2)]
    calls = dict(
        [
            _call(11, "cudaMemcpy", 1_000, 1_350, host=2),
            _call(12, "cudaStreamSynchronize", 1_360, 1_400, host=2),
        ]
    )
    sync = SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)
    found = gpu_dependencies(nodes, calls, [sync], default_device=0)
    assert found.deps[2] == [11]
    assert found.notes == ["1 host waits on the GPU"]


def test_without_sync_events_a_node_is_inferred_to_wait_only_if_delayed_by_more_than_ten_microseconds() -> (
    None
):
    # 12 follows 11 on stream 20 after a cudaStreamWaitEvent; 10 (stream 7) ended 15 µs before 12 started.
    # 12 starts exactly 10 µs after 11 ends (at 65 µs; launched at 44 µs): not more than 10 µs, no wait
    nodes = [_node(10, 7, 12_000, 20_000, 60_000), _node(11, 20, 2_000, 5_000, 65_000)]
    nodes.append(_node(12, 20, 44_000, 75_000, 85_000))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    assert not any(gpu_dependencies(nodes, calls, [], default_device=0).deps.values())
    # 1 ns more delay (11 ends at 64.999 µs): 12 waited for 10
    nodes[1] = _node(11, 20, 2_000, 5_000, 64_999)
    assert gpu_dependencies(nodes, calls, [], default_device=0).inferred[12] == [10]


def test_without_sync_events_an_inferred_wait_is_on_another_stream_not_on_its_own_streams_predecessor() -> (
    None
):
    # 12 follows 11 on stream 20, 15 µs after 11 ended (at 60 µs), after a cudaStreamWaitEvent; 10 (stream
    # 7) ended at 57 µs: 11 ended later, but stream order is no event wait, so 12 waited for 10
    nodes = [_node(10, 7, 12_000, 20_000, 57_000), _node(11, 20, 2_000, 5_000, 60_000)]
    nodes.append(_node(12, 20, 44_000, 75_000, 85_000))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert dict(found.deps) == {12: [10]}


# -- capture and import of one event stream -----------------------------------------------------------------

THREAD = 100
DEVICE_CATS = ("kernel", "gpu_memcpy")


def _kineto_events(*, sync_events: bool) -> list[dict[str, Any]]:
    """One thread, streams 7 and 20 of device 0 (µs):

    - ``aten::zero_`` launches ``fill`` (stream 20), ``aten::mm`` launches ``gemm`` (stream 7, 20-60);
    - ``aten::record`` records an event on 7 and makes 20 wait for it; ``aten::add`` then launches ``add``
      (stream 20), which starts at 75, 15 after ``gemm`` ended;
    - ``aten::item`` launches a copy (stream 7) and synchronises on stream 7;
    - ``aten::to`` launches ``copy_kernel`` (stream 20) and synchronises the device;
    - ``aten::query`` queries the event (no wait); ``aten::wait_event`` synchronises on it.
    """
    evs: list[dict[str, Any]] = []
    ext = iter(range(1, 100))

    def x(cat: str, name: str, ts: int, dur: int, **args: Any) -> None:
        pid, tid = (0, args["stream"]) if cat in (*DEVICE_CATS, "cuda_sync") else (1, THREAD)
        evs.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def op(name: str, ts: int, dur: int) -> None:
        x("cpu_op", name, ts, dur, **{"External id": next(ext)})

    def call(name: str, ts: int, dur: int, corr: int) -> None:
        x("cuda_runtime", name, ts, dur, correlation=corr)

    def gpu(cat: str, name: str, stream: int, ts: int, dur: int, corr: int) -> None:
        x(cat, name, ts, dur, device=0, stream=stream, correlation=corr)

    def sync(kind: str, ts: int, corr: int, stream: int = -1, **more: int) -> None:
        if sync_events:
            x(
                "cuda_sync",
                kind,
                ts,
                1,
                cuda_sync_kind=kind,
                device=0,
                stream=stream,
                correlation=corr,
                **more,
            )

    op("aten::zero_", 0, 8)
    call("cudaLaunchKernel", 2, 2, 5)
    gpu("kernel", "fill", 20, 5, 4, 5)
    op("aten::mm", 10, 20)
    call("cudaLaunchKernel", 12, 3, 1)
    gpu("kernel", "gemm", 7, 20, 40, 1)
    op("aten::record", 32, 8)
    call("cudaEventRecord", 33, 1, 2)
    call("cudaStreamWaitEvent", 35, 1, 3)
    sync("Stream Wait Event", 35, 3, stream=20, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2)
    op("aten::add", 42, 8)
    call("cudaLaunchKernel", 44, 2, 4)
    gpu("kernel", "add", 20, 75, 10, 4)
    op("aten::item", 90, 40)
    call("cudaMemcpyAsync", 92, 2, 6)
    gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 7, 100, 5, 6)
    call("cudaStreamSynchronize", 95, 12, 7)
    sync("Stream Sync", 100, 7, stream=7)
    op("aten::to", 140, 30)
    call("cudaLaunchKernel", 141, 2, 11)
    gpu("kernel", "copy_kernel", 20, 150, 10, 11)
    call("cudaDeviceSynchronize", 145, 20, 8)
    sync("Context Sync", 150, 8)
    op("aten::query", 175, 5)
    call("cudaEventQuery", 176, 1, 9)
    sync("Event Sync", 176, 9, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2)
    op("aten::wait_event", 185, 15)
    call("cudaEventSynchronize", 186, 5, 10)
    sync("Event Sync", 187, 10, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2)
    return evs


Edges = tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]], frozenset[tuple[str, str]]]


def _gpu_edges(nodes: list[tuple[int, str, bool, list[int], list[int], int | None]]) -> Edges:
    """(dependant, dependency) names of the edges with a GPU node at either end, the inferred ones, and
    (GPU node, host node) of each ``skl_launched_in``; from ``(id, name, is_gpu, ctrl_deps, inferred_deps,
    launched_in)`` rows."""
    name = {nid: n for nid, n, *_ in nodes}
    gpu = {nid for nid, _n, g, *_ in nodes if g}
    edges = {(n, name[d]) for nid, n, _g, ctrl, *_ in nodes for d in ctrl if nid in gpu or d in gpu}
    inferred = {(n, name[d]) for _nid, n, _g, _c, inf, _l in nodes for d in inf}
    inside = {(n, name[h]) for _nid, n, *_, h in nodes if h is not None}
    return frozenset(edges), frozenset(inferred), frozenset(inside)


def _id(v: object) -> int | None:
    assert v is None or isinstance(v, int), v
    return v


def _ids(v: object) -> list[int]:
    assert isinstance(v, list | tuple), v
    return [int(d) for d in v]


def _captured(evs: list[dict[str, Any]]) -> Edges:
    ops, syncs = [], []
    for e in evs:
        a, ns, dur = e["args"], e["ts"] * 1000, e["dur"] * 1000
        if e["cat"] == "cuda_sync":
            syncs.append(
                CudaSyncRecord(
                    kind=e["name"], corr=a["correlation"], device=a["device"], stream=a["stream"],
                    wait_on_stream=a.get("wait_on_stream", -1),
                    record_corr=a.get("wait_on_cuda_event_record_corr_id", -1),
                )
            )  # fmt: skip
        elif e["cat"] in DEVICE_CATS:
            ops.append(
                OpRecord(
                    name=e["name"], start_ns=ns, dur_ns=dur, thread=a["stream"], is_cpu=False,
                    device="cuda:0", corr=a["correlation"], kind=e["cat"],
                )
            )  # fmt: skip
        else:
            call = e["cat"] == "cuda_runtime"
            corr = a["correlation"] if call else a["External id"]
            kind = e["cat"] if call else ""
            ops.append(
                OpRecord(name=e["name"], start_ns=ns, dur_ns=dur, thread=1, is_cpu=True, corr=corr, kind=kind)
            )
    cap = RankCapture(
        rank=0,
        comms=[],
        steps=[StepRecord(step=0, start_ns=-1_000, end_ns=300_000)],
        groups=[ProcessGroupInfo(name="0", ranks=(0,), desc="default_pg", backend="cuda:nccl")],
        main_thread=111,
        ops=ops,
        syncs=syncs,
        device="cuda:0",
    )
    nodes = build_nodes(cap)
    return _gpu_edges(
        [
            (
                n.node_id,
                n.name,
                n.attrs.get(Attr.STREAM_KIND) == "cuda",
                list(n.ctrl_deps),
                _ids(n.attrs.get(Attr.INFERRED_DEPS, [])),
                _id(n.attrs.get(Attr.LAUNCHED_IN)),
            )
            for n in nodes
        ]
    )


def _imported(evs: list[dict[str, Any]], tmp: Path) -> Edges:
    path = tmp / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": evs}))
    import_traces([path], None, tmp / "run")
    rows = []
    for n in read_et(tmp / "run" / "rank-0.et").nodes:
        attrs = node_attrs(n)
        inferred = attrs.get(Attr.INFERRED_DEPS, [])
        cuda = attrs.get(Attr.STREAM_KIND) == "cuda"
        rows.append((n.id, n.name, cuda, list(n.ctrl_deps), list(inferred), _id(attrs.get(Attr.LAUNCHED_IN))))
    return _gpu_edges(rows)


COPY = "Memcpy DtoH (Device -> Pageable)"
#: What both modes give: launches (none for what its own op then synchronises on), stream order, and the
#: device synchronise (exact without sync events too).
COMMON = {
    ("fill", "aten::zero_"),
    ("gemm", "aten::mm"),
    ("add", "aten::add"),
    ("add", "fill"),
    ("add", "gemm"),  # the event wait
    (COPY, "gemm"),
    ("copy_kernel", "add"),
    ("aten::item", COPY),  # .item(): the op waits for its own copy, launched in it (LAUNCHED_IN)
    ("aten::to", COPY),
    ("aten::to", "copy_kernel"),
}


#: What both modes give as ``skl_launched_in``: GPU work its op launched and then synchronised on (not a
#: dependency: the op waits for it).
LAUNCHED_IN = frozenset({(COPY, "aten::item"), ("copy_kernel", "aten::to")})


@pytest.mark.parametrize(
    ("sync_events", "expected", "inferred"),
    [
        (True, {*COMMON, ("aten::wait_event", "gemm")}, set()),
        # without sync events: the event wait and the stream synchronise are inferred from timing, the event
        # synchronise (which ended before anything it could have waited for) is lost
        (False, COMMON, {("add", "gemm"), ("aten::item", COPY)}),
    ],
)
def test_capture_and_import_give_the_same_gpu_edges_for_the_same_events(
    tmp_path: Path, sync_events: bool, expected: set[tuple[str, str]], inferred: set[tuple[str, str]]
) -> None:
    evs = _kineto_events(sync_events=sync_events)
    captured, imported = _captured(evs), _imported(evs, tmp_path)
    assert captured == imported
    assert captured == (expected, inferred, LAUNCHED_IN)


def test_an_imported_device_synchronise_no_sync_event_names_a_device_for_waits_on_the_ranks_own_device(
    tmp_path: Path,
) -> None:
    # convert.py: a synchronisation no sync event names a device for is on the device most of the rank's GPU
    # work ran on. Kernels k1, k2 on device 1 (stream 7), k0 on device 0 (stream 9), all done by 300 µs;
    # the cudaDeviceSynchronize at 400 µs (inside no op: a node of its own) waits for device 1's last
    # kernel, k2, and not for k0 (device 0 has 1 kernel of 3)
    evs: list[dict[str, Any]] = []
    for corr, (name, device, stream, ts) in enumerate(
        [("k1", 1, 7, 100), ("k0", 0, 9, 100), ("k2", 1, 7, 200)]
    ):
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": THREAD,
                    "ts": 10 + 10 * corr, "dur": 2, "args": {"correlation": corr + 1}})  # fmt: skip
        evs.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": 100,
                    "args": {"device": device, "stream": stream, "correlation": corr + 1}})  # fmt: skip
    evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": THREAD,
                "ts": 400, "dur": 100, "args": {"correlation": 9}})  # fmt: skip
    edges, _inferred, _inside = _imported(evs, tmp_path)
    assert {d for n, d in edges if n == "cudaDeviceSynchronize"} == {"k2"}


# -- ROCm: the HIP runtime's calls, under the same Kineto category -----------------------------------------

#: HIP's names of the CUDA calls of :func:`_kineto_events`, as ROCm's torch records them (Kineto's roctracer
#: and rocprofiler-sdk loggers file them as ``cuda_runtime`` too, with the correlation ids of their work).
ON_ROCM = {
    "cudaLaunchKernel": "hipLaunchKernel",
    "cudaEventRecord": "hipEventRecord",
    "cudaStreamWaitEvent": "hipStreamWaitEvent",
    "cudaMemcpyAsync": "hipMemcpyAsync",
    "cudaStreamSynchronize": "hipStreamSynchronize",
    "cudaDeviceSynchronize": "hipDeviceSynchronize",
    "cudaEventQuery": "hipEventQuery",
    "cudaEventSynchronize": "hipEventSynchronize",
    COPY: "Memcpy DtoH (Device -> Host)",  # ROCm's Kineto names no pageable memory
}


def _on_rocm(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``evs`` as a ROCm trace has them: HIP's names, and no ``cuda_sync`` events (ROCm's Kineto has none)."""
    return [{**e, "name": ON_ROCM.get(e["name"], e["name"])} for e in evs if e["cat"] != "cuda_sync"]


def _named_as_on_cuda(edges: Edges) -> Edges:
    back = {hip: cuda for cuda, hip in ON_ROCM.items()}
    return tuple(frozenset((back.get(a, a), back.get(b, b)) for a, b in part) for part in edges)  # type: ignore[return-value]


def test_a_rocm_trace_gives_the_gpu_edges_its_cuda_twin_without_sync_events_gives(tmp_path: Path) -> None:
    # the HIP names were unknown to the rules: the event wait, the stream and device synchronises were lost
    # (no edge from add to gemm, none from aten::item or aten::to to what they waited for)
    evs = _on_rocm(_kineto_events(sync_events=False))
    expected = (COMMON, {("add", "gemm"), ("aten::item", COPY)}, LAUNCHED_IN)
    assert _named_as_on_cuda(_imported(evs, tmp_path)) == expected
    assert _named_as_on_cuda(_captured(evs)) == expected


def test_hip_memcpy_with_stream_blocks_its_op_until_its_copy_ends_as_a_copy_and_synchronise_do_on_cuda() -> (
    None
):
    # torch's .item() on ROCm: one hipMemcpyWithStream (memcpy_and_sync), where CUDA's build calls
    # cudaMemcpyAsync then cudaStreamSynchronize. Kernel 10 (stream 7) ends at 900; op 2's copy 11, queued
    # behind it, ends at 950; the call returns at 960
    kernel = _node(10, 7, 100, 200, 900, host=1)
    copy = GpuNode(key=11, device=0, stream=7, launch_ns=300, start_ns=900, end_ns=950, corr=11, host=2)
    launch = _call(10, "hipLaunchKernel", 100, 150)
    rocm = gpu_dependencies(
        [kernel, copy],
        dict([launch, _call(11, "hipMemcpyWithStream", 300, 960, host=2)]),
        [],
        default_device=0,
    )
    cuda_calls = dict(
        [launch, _call(11, "cudaMemcpyAsync", 300, 310), _call(12, "cudaStreamSynchronize", 320, 960, host=2)]
    )
    cuda = gpu_dependencies(
        [kernel, copy],
        cuda_calls,
        [SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)],
        default_device=0,
    )
    assert (dict(rocm.deps), rocm.launch, rocm.launched_in) == ({2: [11]}, {10: 1}, {11: 2})
    assert (dict(cuda.deps), cuda.launch, cuda.launched_in) == ({2: [11]}, {10: 1}, {11: 2})
    assert not rocm.inferred


def test_an_async_hip_copy_to_the_host_is_no_host_wait_and_the_notes_say_its_memory_is_unknown() -> None:
    # ROCm's Kineto names a copy to the host "Memcpy DtoH (Device -> Host)", pinned or pageable: whether
    # hipMemcpyAsync waited for it (pageable, as CUDA's Device -> Pageable copy) the trace cannot say
    kernel = _node(10, 7, 100, 200, 900, host=1)
    copy = GpuNode(
        key=11, device=0, stream=7, launch_ns=300, start_ns=900, end_ns=950, corr=11, host=2,
        name="Memcpy DtoH (Device -> Host)",
    )  # fmt: skip
    calls = dict([_call(10, "hipLaunchKernel", 100, 150), _call(11, "hipMemcpyAsync", 300, 960, host=2)])
    found = gpu_dependencies([kernel, copy], calls, [], default_device=0)
    assert (dict(found.deps), found.launch) == ({}, {10: 1, 11: 2})
    (note,) = found.notes
    assert note == (
        "1 asynchronous HIP copies to the host (hipMemcpyAsync, Memcpy DtoH (Device -> Host)) whose host "
        "memory the ROCm trace does not name: where pageable the call waited for its copy, as on CUDA; no "
        "host wait written for them"
    )


#: Each CUDA call the rules read and its HIP name (HIP's API list, ``hip_prof_str.h`` / ``hip_event.cpp``),
#: written out here rather than read from the code's table, with what the call does: synchronise the
#: device, synchronise a stream or event, copy and return once done, record an event, wait for one.
HIP_TWINS = [
    ("cudaDeviceSynchronize", "hipDeviceSynchronize", "device"),
    ("cuCtxSynchronize", "hipCtxSynchronize", "device"),
    ("cudaStreamSynchronize", "hipStreamSynchronize", "sync"),
    ("cudaEventSynchronize", "hipEventSynchronize", "sync"),
    ("cudaMemcpy", "hipMemcpy", "copy"),
    ("cudaMemcpy2D", "hipMemcpy2D", "copy"),
    ("cudaMemcpy3D", "hipMemcpy3D", "copy"),
    ("cuMemcpyDtoH_v2", "hipMemcpyDtoH", "copy"),
    ("cuMemcpyHtoD_v2", "hipMemcpyHtoD", "copy"),
    ("cudaStreamWaitEvent", "hipStreamWaitEvent", "wait"),
    ("cudaEventRecord", "hipEventRecord", "record"),
    ("cudaEventRecordWithFlags", "hipEventRecordWithFlags", "record"),
]


def _rules_read(name: str, does: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The host waits (sorted) and inferred ones of a schedule in which ``name`` does what ``does`` says
    (times in ns): kernels 10 (stream 7, 2-50 µs) and 11 (stream 20, 3-20 µs) launched by op 1."""
    kernels = [_node(10, 7, 1_000, 2_000, 50_000, host=1), _node(11, 20, 1_500, 3_000, 20_000, host=1)]
    syncs: list[SyncActivity] = []
    if does in ("device", "sync"):  # op 2 blocks in it from 10 to 51 µs, no sync event
        nodes, calls = kernels, dict([_call(20, name, 10_000, 51_000, host=2)])
    elif does == "copy":  # op 2's copy 12 of its correlation, queued behind 10, ends at 52 µs; the call too
        copy = GpuNode(
            key=12, device=0, stream=7, launch_ns=10_000, start_ns=50_000, end_ns=52_000, corr=20, host=2
        )
        nodes, calls = [*kernels, copy], dict([_call(20, name, 10_000, 52_500, host=2)])
    elif does == "wait":  # 12 follows 11 on stream 20, 30 µs late, after the wait call, as 10 ends
        late = _node(12, 20, 25_000, 51_000, 60_000)
        nodes, calls = [*kernels, late], dict([_call(20, name, 24_000, 24_500)])
    else:  # recorded on stream 7 at 1.2 µs, after 10's launch; op 2 synchronises on it (sync events on)
        nodes = kernels
        calls = dict(
            [_call(20, name, 1_200, 1_300), _call(21, "cudaEventSynchronize", 10_000, 51_000, host=2)]
        )
        syncs = [SyncActivity(kind=EVENT_SYNC, corr=21, device=0, stream=7, wait_on_stream=7, record_corr=20)]
    found = gpu_dependencies(nodes, calls, syncs, default_device=0)
    return (
        {k: sorted(v) for k, v in found.deps.items() if v},
        {k: v for k, v in found.inferred.items() if v},
    )


@pytest.mark.parametrize(("cuda", "hip", "does"), HIP_TWINS)
def test_each_hip_call_the_rules_read_makes_the_waits_its_cuda_twin_makes(
    cuda: str, hip: str, does: str
) -> None:
    # a HIP name missing from the table was no call at all: hipCtxSynchronize, hipMemcpy2D, ... made no op
    # wait (hipEventRecordWithFlags, which HIP has, too: its event synchronise waited for nothing)
    expected = {
        "device": ({2: [10, 11]}, {}),  # the last node of every stream of the device
        "sync": ({2: [10]}, {2: [10]}),  # no sync event: the node that ended last while it blocked
        "copy": ({2: [12]}, {}),  # its own copy
        "wait": ({12: [10]}, {12: [10]}),  # an event wait inferred behind the call
        "record": ({2: [10]}, {}),  # the record's stream's last node launched before it
    }[does]
    assert _rules_read(cuda, does) == expected
    assert _rules_read(hip, does) == expected


@pytest.mark.parametrize(
    "call", ["hipMemcpyAsync", "hipMemcpy2DAsync", "hipMemcpy3DAsync", "hipMemcpyDtoHAsync"]
)
@pytest.mark.parametrize(
    ("copy", "noted"), [("Memcpy DtoH (Device -> Host)", 1), ("Memcpy HtoD (Host -> Device)", 0), (None, 0)]
)
def test_only_an_async_hip_copy_to_the_host_is_noted_as_one_whose_host_memory_is_unknown(
    call: str, copy: str | None, noted: int
) -> None:
    # a copy to the host may have waited (pageable memory); one from the host, or a call whose copy is not in
    # the trace, says nothing of the kind. None of them is a host wait
    nodes = [_node(10, 7, 100, 200, 900, host=1)]
    if copy is not None:
        own = GpuNode(
            key=11, device=0, stream=7, launch_ns=300, start_ns=900, end_ns=950, corr=11, host=2, name=copy
        )
        nodes.append(own)
    calls = dict([_call(10, "hipLaunchKernel", 100, 150), _call(11, call, 300, 960, host=2)])
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert not any(found.deps.values())
    assert [
        n.split(" ", 1)[0] for n in found.notes if "whose host memory the ROCm trace does not name" in n
    ] == (["1"] if noted else [])


# -- mutation round 41: bounds and duplicates the rules above left open -------------------------------------


def test_what_is_waited_for_may_end_exactly_the_clock_slack_after_the_wait_and_not_a_nanosecond_more() -> (
    None
):
    # op 2's cudaStreamSynchronize returns at 5 µs; 10 (stream 7) ends 2 µs later, the clock slack itself:
    # written; 1 ns later the times contradict the wait
    calls = dict([_call(12, "cudaStreamSynchronize", 1_000, 5_000, host=2)])
    sync = SyncActivity(kind=STREAM_SYNC, corr=12, device=0, stream=7)
    found = gpu_dependencies([_node(10, 7, 100, 200, 7_000)], calls, [sync], default_device=0)
    assert found.deps[2] == [10]
    found = gpu_dependencies([_node(10, 7, 100, 200, 7_001)], calls, [sync], default_device=0)
    assert not any(found.deps.values())
    assert found.notes == ["1 host waits contradicted by the recorded times (ignored)"]
    # a stream wait: 12 (stream 20) starts at 4 µs; 10 ends at 6 µs, written; at 6.001 µs, not
    found = _stream_20_waits_for_7([_node(10, 7, 100, 200, 6_000), _node(12, 20, 2_500, 4_000, 6_500)])
    assert dict(found.deps) == {12: [10]}
    found = _stream_20_waits_for_7([_node(10, 7, 100, 200, 6_001), _node(12, 20, 2_500, 4_000, 6_500)])
    assert not any(found.deps.values())
    assert found.notes == ["1 stream waits contradicted by the recorded times (ignored)"]

    # the stream current at an NCCL call: 12 starts at 41 µs; 10 (stream 7) ends at 43 µs: written; later, not
    def nccl_run(end_ns: int) -> GpuDeps:
        nodes = [
            _launched(10, 7, (10_000, 11_000, end_ns), 1, "void gemm_kernel"),
            _launched(12, 20, (40_000, 41_000, 60_000), 1, _NCCL_KERNEL),
        ]
        return gpu_dependencies(nodes, {}, [], default_device=0)

    assert dict(nccl_run(43_000).deps) == {12: [10]}
    found = nccl_run(43_001)
    assert not any(found.deps.values())
    assert found.notes == ["1 stream waits contradicted by the recorded times (ignored)"]


def test_a_stream_that_waits_for_an_event_recorded_on_itself_gets_no_edge_stream_order_holds_it() -> None:
    # the record and the wait both on stream 7: 11 follows 10 on the stream anyway, no event-wait edge
    calls = dict([_call(1, "cudaEventRecord", 2_000, 2_010), _call(2, "cudaStreamWaitEvent", 2_100, 2_110)])
    wait = SyncActivity(kind=STREAM_WAIT, corr=2, device=0, stream=7, wait_on_stream=7, record_corr=1)
    nodes = [_node(10, 7, 100, 200, 5_000), _node(11, 7, 3_000, 5_000, 6_000)]
    found = gpu_dependencies(nodes, calls, [wait], default_device=0)
    assert not any(found.deps.values())
    assert found.notes == []


def test_two_stream_waits_between_the_same_nodes_give_one_edge_counted_once() -> None:
    # stream 20 waits twice for events recorded on stream 7, with nothing launched on either in between:
    # both waits hold 12 behind 10, one edge
    calls = dict(
        [
            _call(1, "cudaEventRecord", 2_000, 2_010),
            _call(2, "cudaStreamWaitEvent", 2_100, 2_110),
            _call(3, "cudaEventRecord", 2_200, 2_210),
            _call(4, "cudaStreamWaitEvent", 2_300, 2_310),
        ]
    )
    waits = [
        SyncActivity(kind=STREAM_WAIT, corr=2, device=0, stream=20, wait_on_stream=7, record_corr=1),
        SyncActivity(kind=STREAM_WAIT, corr=4, device=0, stream=20, wait_on_stream=7, record_corr=3),
    ]
    nodes = [_node(10, 7, 100, 200, 5_000), _node(12, 20, 2_500, 5_100, 5_500)]
    found = gpu_dependencies(nodes, calls, waits, default_device=0)
    assert dict(found.deps) == {12: [10]}
    assert found.notes == ["1 GPU event waits across streams"]


def test_the_note_on_stream_waits_naming_no_record_counts_the_gpu_edges_inferred_not_the_host_waits() -> None:
    # as above, torch 2.11's unnamed wait: 12 (stream 20) inferred to wait for 10 (stream 7); then op 1
    # blocks in a cudaEventSynchronize (90-96 µs) whose sync event names no record either: it waited for 13
    # (stream 7, ended at 95 µs), an inferred host wait, which the stream waits' note does not count
    nodes = [_node(10, 7, 12_000, 20_000, 60_000), _node(11, 20, 2_000, 5_000, 9_000)]
    nodes += [_node(12, 20, 44_000, 75_000, 85_000), _node(13, 7, 86_000, 87_000, 95_000)]
    calls = dict(
        [
            _call(1, "cudaStreamWaitEvent", 35_000, 36_000),
            _call(5, "cudaEventSynchronize", 90_000, 96_000, host=1),
        ]
    )
    syncs = [
        SyncActivity(kind=STREAM_WAIT, corr=1, device=0, stream=20),
        SyncActivity(kind=EVENT_SYNC, corr=5, device=0, stream=7),
    ]
    found = gpu_dependencies(nodes, calls, syncs, default_device=0)
    assert dict(found.inferred) == {1: [13], 12: [10]}
    assert found.notes == [
        (
            "1 CUDA stream wait(s) whose sync event names no event record (the trace gives only the event's "
            "id): 1 GPU wait edge(s) inferred from timing (0.031 ms of recorded kernel waiting rests on them)"
        ),
        "1 inferred host waits on the GPU",
    ]


def test_a_host_run_collective_drops_its_waits_on_its_own_copies_not_on_work_another_op_launched() -> None:
    # gloo's collective 5 first synchronises stream 7 (1-1.5 µs), whose last node, 10, op 1 launched; then
    # launches its staging copy 11 there and synchronises on it: the wait on 10 is the collective's, the
    # one on its own copy is part of it (not written)
    nodes = [_node(10, 7, 100, 200, 1_200, host=1), _node(11, 7, 2_000, 2_100, 2_300, host=5)]
    calls = dict(
        [
            _call(12, "cudaStreamSynchronize", 1_000, 1_500, host=5),
            _call(11, "cudaMemcpyAsync", 2_000, 2_050, host=5),
            _call(13, "cudaStreamSynchronize", 2_060, 2_400, host=5),
        ]
    )
    syncs = [SyncActivity(kind=STREAM_SYNC, corr=c, device=0, stream=7) for c in (12, 13)]
    found = gpu_dependencies(nodes, calls, syncs, default_device=0, collectives={5})
    assert found.deps[5] == [10]
    assert found.launch == {10: 1, 11: 5}
    assert found.notes == [
        "2 host waits on the GPU",
        "1 synchronisations of host-run collectives on the copies they launched (not written)",
    ]


def test_an_event_synchronise_on_an_event_recorded_on_stream_0_waits_for_that_streams_last_node() -> None:
    # stream 0 is a stream (ROCm's default stream; -1 is "unknown"): op 1's cudaEventSynchronize (2.6-3.1 µs)
    # waits for 10, the last node launched on stream 0 before the record (2 µs), not for 11, launched after
    nodes = [_node(10, 0, 100, 200, 3_000), _node(11, 0, 2_500, 3_000, 4_000)]
    calls = dict(
        [_call(1, "cudaEventRecord", 2_000, 2_010), _call(5, "cudaEventSynchronize", 2_600, 3_100, host=1)]
    )
    sync = SyncActivity(kind=EVENT_SYNC, corr=5, device=0, wait_on_stream=0, record_corr=1)
    found = gpu_dependencies(nodes, calls, [sync], default_device=0)
    assert dict(found.deps) == {1: [10]}
    assert not found.inferred
    assert found.notes == ["1 host waits on the GPU"]


def test_a_synchronise_no_sync_event_explains_waits_for_a_node_that_ended_the_instant_it_began() -> None:
    # op 2's cudaStreamSynchronize (1-1.4 µs) with no sync event: 10 ended at 1 µs, the instant the call
    # began, and nothing ended later while it was blocked: the call waited for 10 (inferred)
    calls = dict([_call(12, "cudaStreamSynchronize", 1_000, 1_400, host=2)])
    found = gpu_dependencies([_node(10, 7, 100, 200, 1_000)], calls, [], default_device=0)
    assert dict(found.inferred) == {2: [10]}
    # ended 1 ns before the call: not what it waited for
    found = gpu_dependencies([_node(10, 7, 100, 200, 999)], calls, [], default_device=0)
    assert not any(found.deps.values())


def test_without_sync_events_the_inferred_waits_do_not_depend_on_the_order_the_nodes_are_given_in() -> None:
    # the delayed 12 (stream 20) after a cudaStreamWaitEvent, as above, its nodes given latest first
    nodes = [_node(12, 20, 44_000, 75_000, 85_000), _node(11, 20, 2_000, 5_000, 9_000)]
    nodes.append(_node(10, 7, 12_000, 20_000, 60_000))
    calls = dict([_call(1, "cudaStreamWaitEvent", 35_000, 36_000)])
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert dict(found.inferred) == {12: [10]}


def test_device_synchronises_list_their_waits_by_stream_and_the_bare_calls_by_start_whatever_the_order() -> (
    None
):
    # two cudaDeviceSynchronize calls inside no host op, given latest first; stream 20's node given before
    # stream 7's: the calls become nodes in the order they ran, each waiting for stream 7's node, then 20's
    nodes = [_node(12, 20, 150, 300, 800), _node(10, 7, 100, 200, 900)]
    calls = dict(
        [_call(21, "cudaDeviceSynchronize", 3_000, 3_100), _call(20, "cudaDeviceSynchronize", 1_000, 1_200)]
    )
    found = gpu_dependencies(nodes, calls, [], default_device=0)
    assert found.bare_calls == [1020, 1021]
    assert dict(found.deps) == {1020: [10, 12], 1021: [10, 12]}
