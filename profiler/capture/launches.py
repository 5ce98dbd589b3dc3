"""What waits on what between one rank's host threads and its CUDA streams (ops/full levels on CUDA).

Pure: plain records in (the GPU nodes, the host nodes, the CUDA runtime/driver calls by correlation id,
the synchronisation activities), edges out, in the form :mod:`skewlens.profiler.vocab` describes under
"GPU dependencies". :func:`skewlens.profiler.capture.build.build_nodes` adds them to the trace.

Launch
    A GPU node (kernel, memcpy, memset) depends on the host node that contains its launch call (the
    runtime or driver call with its correlation id: ``cudaLaunchKernel``, ``cudaMemcpyAsync``,
    ``cuLaunchKernelEx``, ...), and ``skl_launch_ns`` is that call's start. A launch inside no host node
    (a call under ``gloo:*`` on a worker thread, whose scope is no node) keeps its ``skl_launch_ns`` and
    no edge.
Event wait (``Stream Wait Event``: ``cudaEventRecord`` on stream W, ``cudaStreamWaitEvent`` of S on it)
    The first GPU node launched on S after the wait call depends on the last GPU node launched on W
    before the event record.
Host synchronisation (``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``
and their driver forms, each with its ``Stream Sync`` / ``Event Sync`` / ``Context Sync`` activity)
    The host node that contains the call depends on what it waited for: the last node launched on that
    stream (Stream Sync), on the stream the event was recorded on before the record (Event Sync), on each
    stream of the device (Context Sync). Non-blocking queries (``cudaEventQuery`` also makes an Event Sync
    activity) are not waits.

Only what the trace records is written: without synchronisation activities (a torch without
``enable_cuda_sync_events``) there are no event-wait or synchronisation edges, and nothing is inferred.

Communication nodes take part as the NCCL kernel they end with (launched inside their own call): a GPU
node may wait on one, and a host node synchronise on one, both of which end with that kernel. They
depend on nothing here: a comm node starts at its host call, before whatever its kernel waited for on
the device began, so such an edge would contradict its recorded start.

Acyclic: order host nodes by their start and GPU nodes by their launch. Every edge of the trace goes to a
node no later in that order (program order, launches, stream order, event waits all do), and a
synchronisation could break that only by waiting for a node launched after its host node began: the
host node containing the call synchronises on what was launched before it began. What the call waited
for that its own host node launched (``.item()``: a copy, then a stream synchronise, inside one
operator) is then covered by that node's own recorded time.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from skewlens.profiler.capture.records import CudaSyncRecord

#: A GPU node recorded as ending at most this much after what waited for it still counts as waited for
#: (CUPTI's GPU timestamps are converted to the host clock, with an error of a few µs).
CLOCK_SLACK_NS = 2_000

STREAM_WAIT = "Stream Wait Event"
STREAM_SYNC = "Stream Sync"
EVENT_SYNC = "Event Sync"
CONTEXT_SYNC = "Context Sync"
#: Runtime/driver calls that block the host until the GPU work they name is done.
HOST_SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaDeviceSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuCtxSynchronize",
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuNode:
    """One node's GPU side: a GPU node's activity, or the NCCL kernel a comm node ends with."""

    nid: int
    """Node id."""
    device: int
    """CUDA device index."""
    stream: int
    """CUDA stream."""
    corr: int
    """Correlation id of its launch call."""
    start_ns: int
    """Start of the activity."""
    end_ns: int
    """End of the activity."""
    comm: bool = False
    """A comm node's NCCL kernel: the node is a dependency only."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSpan:
    """A host node on a thread stream."""

    nid: int
    """Node id."""
    stream: int
    """The thread's stream number."""
    start_ns: int
    """Start."""
    end_ns: int
    """End."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """A CUDA runtime or driver call."""

    name: str
    """``cudaLaunchKernel``, ``cudaEventRecord``, ``cudaStreamSynchronize``, ..."""
    start_ns: int
    """Start."""
    end_ns: int
    """End."""
    stream: int
    """Stream number of the thread that made it (-1: a thread with no node)."""


@dataclass(kw_only=True, slots=True)
class GpuEdges:
    """The edges found, and counts of what they are (and of what could not be drawn) for the manifest."""

    deps: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Node id -> node ids it depends on (ctrl)."""
    launch_ns: dict[int, int] = field(default_factory=dict)
    """GPU node id (not comm nodes) -> start of its launch call."""
    counts: Counter[str] = field(default_factory=Counter)
    """What was drawn or left out, by kind."""

    def add(self, nid: int, dep: int, what: str) -> None:
        if dep != nid and dep not in self.deps[nid]:
            self.deps[nid].append(dep)
            self.counts[what] += 1


class _Hosts:
    """Host nodes per thread stream, by start: which one contains a time."""

    def __init__(self, hosts: Sequence[HostSpan]) -> None:
        by: dict[int, list[HostSpan]] = defaultdict(list)
        for h in hosts:
            by[h.stream].append(h)
        self._by = {s: sorted(v, key=lambda h: (h.start_ns, h.nid)) for s, v in by.items()}
        self._starts = {s: [h.start_ns for h in v] for s, v in self._by.items()}

    def containing(self, stream: int, t: int) -> HostSpan | None:
        v = self._by.get(stream)
        if not v:
            return None
        k = bisect.bisect_right(self._starts[stream], t) - 1  # a thread's host nodes do not overlap
        if k >= 0 and t <= v[k].end_ns:
            return v[k]
        return None


class _Streams:
    """GPU nodes per (device, stream), in launch order."""

    def __init__(self, nodes: Sequence[tuple[int, GpuNode]]) -> None:
        by: dict[tuple[int, int], list[tuple[int, GpuNode]]] = defaultdict(list)
        for launch, g in nodes:
            by[(g.device, g.stream)].append((launch, g))
        self._by = {k: sorted(v, key=lambda x: (x[0], x[1].start_ns, x[1].nid)) for k, v in by.items()}
        self._launches = {k: [t for t, _ in v] for k, v in self._by.items()}

    def last_before(self, device: int, stream: int, t: int) -> GpuNode | None:
        """The last node launched on the stream strictly before ``t``."""
        key = (device, stream)
        k = bisect.bisect_left(self._launches.get(key, []), t) - 1
        return self._by[key][k][1] if k >= 0 else None

    def first_after(self, device: int, stream: int, t: int) -> GpuNode | None:
        """The first node launched on the stream strictly after ``t``."""
        key = (device, stream)
        launches = self._launches.get(key, [])
        k = bisect.bisect_right(launches, t)
        return self._by[key][k][1] if k < len(launches) else None

    def streams_of(self, device: int) -> list[int]:
        return sorted(s for d, s in self._by if d == device)


def gpu_edges(
    gpu: Sequence[GpuNode],
    calls: Mapping[int, Call],
    syncs: Sequence[CudaSyncRecord],
    hosts: Sequence[HostSpan],
) -> GpuEdges:
    """Launch, event-wait and host-synchronisation edges of one rank (the rules in the module docstring).

    ``calls``: the runtime/driver calls by correlation id; ``syncs``: the synchronisation activities;
    ``hosts``: the host nodes that may contain a call.
    """
    out = GpuEdges()
    where = _Hosts(hosts)
    launched: list[tuple[int, GpuNode]] = []
    for g in gpu:
        call = calls.get(g.corr)
        if call is None:
            if not g.comm:
                out.counts["GPU nodes whose launch call is not in the trace"] += 1
            continue
        launched.append((call.start_ns, g))
        if g.comm:
            continue
        out.launch_ns[g.nid] = call.start_ns
        host = where.containing(call.stream, call.start_ns)
        if host is None:
            out.counts["GPU nodes launched inside no host node (no launch edge)"] += 1
        else:
            out.add(g.nid, host.nid, "launch edges")
    streams = _Streams(launched)
    for sy in syncs:
        if sy.kind == STREAM_WAIT:
            _event_wait(sy, calls, streams, out)
    by_corr = {sy.corr: sy for sy in syncs if sy.kind != STREAM_WAIT}
    for corr, sync_call in sorted(calls.items(), key=lambda kv: (kv[1].start_ns, kv[0])):
        if sync_call.name not in HOST_SYNC_CALLS:
            continue
        activity = by_corr.get(corr)
        if activity is None:
            out.counts["host synchronisations without their synchronisation activity"] += 1
            continue
        host = where.containing(sync_call.stream, sync_call.start_ns)
        if host is None:
            out.counts["host synchronisations inside no host node"] += 1
            continue
        for g in _waited_for(activity, calls, streams, host.start_ns):
            if g.end_ns > sync_call.end_ns + CLOCK_SLACK_NS:
                out.counts["host synchronisations contradicted by the recorded times (not written)"] += 1
            else:
                out.add(host.nid, g.nid, "host synchronisations on GPU nodes")
    return out


def _event_wait(sy: CudaSyncRecord, calls: Mapping[int, Call], streams: _Streams, out: GpuEdges) -> None:
    """A ``Stream Wait Event``: the waiting stream's next node depends on the recorded stream's last."""
    call, record = calls.get(sy.corr), calls.get(sy.record_corr)
    if sy.stream < 0 or sy.wait_on_stream < 0 or call is None or record is None:
        out.counts["stream waits without their stream, event record or call in the trace"] += 1
        return
    if sy.stream == sy.wait_on_stream:
        return  # stream order already
    src = streams.last_before(sy.device, sy.wait_on_stream, record.start_ns)
    dst = streams.first_after(sy.device, sy.stream, call.start_ns)
    if src is None or dst is None:
        return  # nothing recorded before the record, or nothing waited after it, in the window
    if dst.comm:
        out.counts["stream waits of NCCL kernels (not written: a comm node starts at its call)"] += 1
    elif src.end_ns > dst.start_ns + CLOCK_SLACK_NS:
        out.counts["stream waits contradicted by the recorded times (not written)"] += 1
    else:
        out.add(dst.nid, src.nid, "event waits across streams")


def _waited_for(
    sy: CudaSyncRecord, calls: Mapping[int, Call], streams: _Streams, before_ns: int
) -> list[GpuNode]:
    """What a host synchronisation waited for among the nodes launched before ``before_ns`` (the start of
    the host node that made it)."""
    found: list[GpuNode | None] = []
    if sy.kind == STREAM_SYNC:
        found = [streams.last_before(sy.device, sy.stream, before_ns)]
    elif sy.kind == EVENT_SYNC:
        record = calls.get(sy.record_corr)
        if record is not None and sy.wait_on_stream >= 0:
            found = [streams.last_before(sy.device, sy.wait_on_stream, min(record.start_ns, before_ns))]
    elif sy.kind == CONTEXT_SYNC:
        found = [streams.last_before(sy.device, s, before_ns) for s in streams.streams_of(sy.device)]
    return [g for g in found if g is not None]
