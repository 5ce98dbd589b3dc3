"""What waits on what between one rank's host threads and its CUDA streams: the rules, stated once.

Pure: plain records in (:class:`GpuNode`, :class:`Call`, :class:`SyncActivity`), edges out, in the form
:mod:`skewlens.profiler.vocab` describes under "GPU dependencies". Both writers feed it: the Kineto importer
(:func:`skewlens.profiler.importers.convert.convert_rank`, from a trace's events) and the CUDA capture
(:func:`skewlens.profiler.capture.build.build_nodes`, from torch.profiler's). Each says which of its host
nodes contains a call (``host``): the importer's top-level ops, the capture's host nodes.
The calls are named here as CUDA names them; ROCm's HIP calls (:data:`HIP_NAMES`) are read as their
CUDA counterparts, by the same rules.

Launch
    A GPU node depends on the host node that contains its launch call (the runtime or driver call with its
    correlation id: ``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...; ``skl_launch_ns`` is that call's
    start), except where that host node also synchronises on the node's stream (``.item()``: a copy, then
    a stream synchronise, inside one op). The synchronisation waits for the node, so a dependency would
    close a cycle: such a launch is no dependency but ``launched_in`` (``skl_launched_in``, which the
    execution model meets at the host node's arrival, before it blocks). A launch inside no host node gets
    no edge. A
    collective run on the host (gloo on CUDA tensors) is the host node of the staging copies it launches
    (on the calling thread, or its worker thread inside it): they keep their launch edge, and its own
    synchronisation on them is not written (the copies are part of the collective).
Event wait (``cudaEventRecord`` on stream W, then ``cudaStreamWaitEvent`` of stream S)
    With CUDA sync events, each ``Stream Wait Event`` activity names S, W and the correlation of the event
    record: the first GPU node launched on S after the wait call depends on the last GPU node launched on
    W before the record.
Stream current at a collective's call (NCCL kernels, and the comm nodes that end with one)
    c10d makes NCCL's stream wait for the stream current at the call (an event recorded there, waited for
    by NCCL's stream), so an NCCL kernel depends on the last GPU node launched on that stream before its
    call, whether that node still ran at the call or had ended (a what-if that slows it must hold the
    collective; as recorded the edge holds nothing). Where a named ``Stream Wait Event`` says what the
    kernel waited for, that decides. Otherwise the current stream is the stream of the last other GPU
    node (not NCCL's) that the calling thread launched on the device before the call (any thread's where
    the thread is unknown or launched none): Kineto names no stream for ``cudaEventRecord``. An edge the
    recorded times contradict is not written.
Host synchronisation (:data:`BLOCKING_CALLS`: ``cudaStreamSynchronize``, ``cudaEventSynchronize``,
``cudaDeviceSynchronize``, their driver forms, a blocking ``cudaMemcpy``; and a ``cudaMemcpyAsync`` whose
copy is into pageable host memory, :data:`PAGEABLE_DTOH`, which CUDA runs synchronously: ``.cpu()``,
``.tolist()`` of a CUDA tensor)
    The host node containing the call (or, where none does, the call itself as a node: ``bare_calls``)
    depends on what the call waited for: with sync events, ``Stream Sync`` -> the last GPU node launched on
    that stream before the call, ``Event Sync`` -> the last node launched on the recorded stream before
    the event record, ``Context Sync`` -> the last node of every stream of the device; without its sync
    event (or with an ``Event Sync`` that names no record), a device synchronise still waits for every
    stream, a blocking copy for its own copy, and a stream or event synchronise for the GPU node launched
    before the call that ended last while the call was blocked (inferred). Non-blocking queries
    (``cudaEventQuery``) are not waits.
Inferred event waits (a trace without any CUDA sync event; or a ``Stream Wait Event`` that names no event
record, only the event's id, as torch 2.11's Kineto writes it: then behind that wait call alone)
    A GPU node that started more than :data:`INFER_MIN_DELAY_NS` after both its launch and the end of its
    predecessor on its stream, with a ``cudaStreamWaitEvent`` call between its predecessor's launch and its
    own, waited for something on another stream: the node of another stream of its device that ended last
    within :data:`INFER_SLACK_NS` before it started. Inferred edges (these and the inferred host waits) are
    listed apart (``inferred``: ``skl_inferred_deps``) and counted in the notes, with the recorded waiting
    time that rests on them.

An edge the recorded times contradict (what is waited for ends more than :data:`CLOCK_SLACK_NS` after
the waiting GPU node started, or after the synchronising call returned) is not written.

Communication nodes whose GPU side is their NCCL kernel but which start at their host call (the capture's
comm nodes, ``GpuNode.comm``, the call's start in ``issue_ns``) get no launch edge (it would contradict
their recorded start): a GPU node may wait on one, a host node synchronise on one. c10d makes NCCL's
stream wait for the stream that was current at the call (an event recorded there, waited for by NCCL's
stream); the event-wait rules above find what the NCCL kernel waited for, and the comm node depends on it:
the execution model reads an edge from GPU work to such a node as a queue edge (the transfer waits for
it, the call does not), whether that work was still running at the call or had ended. An inferred wait
(no record named: torch 2.11) is written only where that work was still running at the call: one that
had ended cannot have held the kernel, whose delay the inference explains; the stream current at the call
gives such a node its edge all the same (above).

Acyclic, as far as the rules go: order host nodes by start and GPU nodes by launch; every edge goes to a
node no later in that order (program order, launches, stream order and event waits do), except a
synchronisation on work launched after its host node began. For work that host node launched on the
stream it synchronises on (``.item()``) the launch is no dependency, as said above; a cycle through other
work launched meanwhile (another thread's, or another stream's waited for by event) is left for the
trace's validation to report.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import pairwise

import msgspec

from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.vocab import names_nccl_kernel

#: A GPU node delayed by more than this after its launch and its stream predecessor waited for something.
INFER_MIN_DELAY_NS = 10_000
#: ... for the node of another stream that ended at most this long before it started.
INFER_SLACK_NS = 20_000
#: What is waited for may be recorded as ending at most this long after what waited for it started (a GPU
#: node) or returned (a host call): timestamp rounding between the CPU and GPU timelines.
CLOCK_SLACK_NS = 2_000

STREAM_WAIT = "Stream Wait Event"
STREAM_SYNC = "Stream Sync"
EVENT_SYNC = "Event Sync"
CONTEXT_SYNC = "Context Sync"

#: HIP's name of each CUDA runtime or driver call the rules read: ROCm's torch records the HIP runtime's
#: calls under the same Kineto category (``cuda_runtime``), sharing their correlation ids with what they
#: launched, so the rules read both names (HIP's API list, ``hip_prof_str.h``; HIP has no driver forms of the
#: synchronisations, and its stream wait takes its flags as an argument, as CUDA's does).
HIP_NAMES = {
    "cudaDeviceSynchronize": "hipDeviceSynchronize",
    "cuCtxSynchronize": "hipCtxSynchronize",
    "cudaStreamSynchronize": "hipStreamSynchronize",
    "cudaEventSynchronize": "hipEventSynchronize",
    "cudaMemcpy": "hipMemcpy",
    "cudaMemcpy2D": "hipMemcpy2D",
    "cudaMemcpy3D": "hipMemcpy3D",
    "cuMemcpyDtoH_v2": "hipMemcpyDtoH",
    "cuMemcpyHtoD_v2": "hipMemcpyHtoD",
    "cudaMemcpyAsync": "hipMemcpyAsync",
    "cudaMemcpy2DAsync": "hipMemcpy2DAsync",
    "cudaMemcpy3DAsync": "hipMemcpy3DAsync",
    "cuMemcpyDtoHAsync_v2": "hipMemcpyDtoHAsync",
    "cudaStreamWaitEvent": "hipStreamWaitEvent",
    "cudaEventRecord": "hipEventRecord",
    "cudaEventRecordWithFlags": "hipEventRecordWithFlags",
}


def _with_hip(*cuda: str) -> frozenset[str]:
    """The CUDA names and their HIP names (:data:`HIP_NAMES`)."""
    return frozenset(cuda) | {HIP_NAMES[c] for c in cuda if c in HIP_NAMES}


_DEVICE_SYNC = _with_hip("cudaDeviceSynchronize", "cuCtxSynchronize")
#: Blocking copies; HIP's ``hipMemcpyWithStream`` too, a copy on a stream that returns once done: torch's
#: ``memcpy_and_sync`` on ROCm (``.item()``, ``.cpu()``), where on CUDA it is ``cudaMemcpyAsync`` then
#: ``cudaStreamSynchronize``.
_BLOCKING_COPY = _with_hip(
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"
) | {"hipMemcpyWithStream"}
#: Asynchronous copy calls: they block too where their copy is :data:`PAGEABLE_DTOH`.
_ASYNC_COPY = _with_hip("cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync", "cuMemcpyDtoHAsync_v2")
#: Kineto's name of a copy from the device into pageable host memory: CUDA returns from the call that
#: issued it, asynchronous or not, only once the copy has completed (after the stream's earlier work).
PAGEABLE_DTOH = "Memcpy DtoH (Device -> Pageable)"
#: Kineto's name of a copy from the device to the host on ROCm, pinned or pageable alike (its loggers name the
#: host memory "Host" either way).
ROCM_DTOH = "Memcpy DtoH (Device -> Host)"
#: Note of the asynchronous HIP copies to the host: not written as host waits, and not known not to be ones.
_UNNAMED_HOST_MEMORY = (
    "asynchronous HIP copies to the host (hipMemcpyAsync, Memcpy DtoH (Device -> Host)) whose host memory "
    "the ROCm trace does not name: where pageable the call waited for its copy, as on CUDA; no host wait "
    "written for them"
)
#: Runtime/driver calls that block the host until the GPU work they name is done.
BLOCKING_CALLS = (
    _with_hip("cudaStreamSynchronize", "cuStreamSynchronize", "cudaEventSynchronize", "cuEventSynchronize")
    | _DEVICE_SYNC
    | _BLOCKING_COPY
)
STREAM_WAIT_CALLS = _with_hip("cudaStreamWaitEvent", "cuStreamWaitEvent")
EVENT_RECORD_CALLS = _with_hip("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord")
#: The calls the rules read (a caller may leave the others out of ``calls``; GPU nodes carry their launch).
CALLS_READ = BLOCKING_CALLS | _ASYNC_COPY | STREAM_WAIT_CALLS | EVENT_RECORD_CALLS

_COMM_WAITS = "stream waits of NCCL kernels not written (of a comm node without its call's start)"
_COMM_QUEUED = "stream waits of NCCL kernels (queue edges: the transfer waits, the call does not)"


# the records are frozen msgspec Structs, made in C: one per GPU node and call of a rank (an importer makes
# hundreds of thousands), 17x faster to build than the frozen dataclasses they were
class GpuNode(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One GPU node (kernel, memcpy, memset), or the NCCL kernel a comm node ends with."""

    key: int
    """The caller's handle of the node."""
    device: int
    """CUDA device."""
    stream: int
    """CUDA stream."""
    launch_ns: int
    """Start of its launch call (its own start where the launch is unknown)."""
    start_ns: int
    """Start."""
    end_ns: int
    """End."""
    corr: int | None
    """Correlation id of its launch (None where unknown)."""
    host: int | None = None
    """Key of the host node containing its launch call (None: none does, or the launch is unknown)."""
    comm: bool = False
    """A comm node's NCCL kernel, the node starting at its host call: no launch edge."""
    issue_ns: int | None = None
    """A comm node's start: its host call (None otherwise; a comm node without it gets no wait edge)."""
    name: str = ""
    """Kernel, memcpy or memset name, as Kineto gives it (:data:`PAGEABLE_DTOH` blocks its launch call)."""
    thread: int | None = None
    """Host thread of its launch call, or a comm node's of its call (None where unknown)."""


class Call(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A CUDA runtime or driver call."""

    key: int
    """The caller's handle of the call: orders calls of one start, and keys it where it becomes a host node
    (a blocking call inside no host node: :attr:`GpuDeps.bare_calls`)."""
    name: str
    """``cudaEventRecord``, ``cudaStreamSynchronize``, ..."""
    start_ns: int
    """Start."""
    end_ns: int
    """End."""
    host: int | None = None
    """Key of the host node containing it (None where none does)."""


class SyncActivity(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One CUDA synchronisation activity (Kineto's ``cuda_sync``, with ``enable_cuda_sync_events``)."""

    kind: str
    """:data:`STREAM_WAIT`, :data:`STREAM_SYNC`, :data:`EVENT_SYNC` or :data:`CONTEXT_SYNC`."""
    corr: int
    """Correlation id of the call that made it (-1 where unknown)."""
    device: int
    """CUDA device."""
    stream: int = -1
    """The waiting stream (Stream Wait Event) or the stream synchronised (Stream Sync); -1 otherwise."""
    wait_on_stream: int = -1
    """Stream Wait Event, Event Sync: the stream the event was recorded on (-1 where unknown)."""
    record_corr: int = -1
    """Stream Wait Event, Event Sync: correlation id of the event's ``cudaEventRecord`` (-1 where unknown)."""


@dataclass(kw_only=True, slots=True)
class GpuDeps:
    """Edges found, by the callers' keys."""

    deps: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Dependant key -> dependency keys: event waits and host synchronisations (launches: :attr:`launch`)."""
    inferred: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Dependant key -> those of its dependency keys inferred from timing."""
    launch: dict[int, int] = field(default_factory=dict)
    """GPU node key -> key of the host node it depends on (its launch)."""
    launched_in: dict[int, int] = field(default_factory=dict)
    """GPU node key -> key of the host node around its launch call where that host node synchronises on the
    node's stream (``.item()``): a launch all the same, written as ``skl_launched_in``, not a dependency."""
    bare_calls: list[int] = field(default_factory=list)
    """Keys of the blocking calls inside no host node that waited for something (keys in :attr:`deps`)."""
    notes: list[str] = field(default_factory=list)
    """Counts for the manifest."""


class _Streams:
    """GPU nodes per (device, stream), in launch order."""

    def __init__(self, nodes: Sequence[GpuNode]) -> None:
        by: dict[tuple[int, int], list[GpuNode]] = defaultdict(list)
        for g in nodes:
            by[(g.device, g.stream)].append(g)
        self.by = {k: sorted(v, key=lambda g: (g.launch_ns, g.start_ns, g.key)) for k, v in by.items()}
        self.launches = {k: [g.launch_ns for g in v] for k, v in self.by.items()}

    def last_before(self, device: int, stream: int, t: int) -> GpuNode | None:
        """The last node launched on the stream strictly before ``t``."""
        v = self.by.get((device, stream))
        if not v:
            return None
        i = bisect_left(self.launches[(device, stream)], t) - 1
        return v[i] if i >= 0 else None

    def first_after(self, device: int, stream: int, t: int) -> GpuNode | None:
        """The first node launched on the stream strictly after ``t``."""
        v = self.by.get((device, stream))
        if not v:
            return None
        i = bisect_right(self.launches[(device, stream)], t)
        return v[i] if i < len(v) else None

    def streams_of(self, device: int) -> list[int]:
        return sorted(s for d, s in self.by if d == device)


def gpu_dependencies(
    nodes: Sequence[GpuNode],
    calls: Mapping[int, Call],
    syncs: Sequence[SyncActivity],
    *,
    default_device: int,
    collectives: Set[int] = frozenset(),
) -> GpuDeps:
    """Launch, event-wait and host-synchronisation edges of one rank (the rules in the module docstring).

    ``calls``: the runtime/driver calls by correlation id (those in :data:`CALLS_READ` suffice);
    ``syncs``: the synchronisation activities (none: the trace has no sync events, and waits are
    inferred); ``default_device``: the device of a synchronisation no activity names; ``collectives``:
    the keys of host nodes that are collectives run on the host (gloo's on CUDA tensors): work they
    launch and then synchronise on (their staging copies) keeps its launch edge, and the synchronisation
    is not written (the copy is part of the collective).
    """
    out = GpuDeps()
    streams = _Streams(nodes)
    by_corr = {g.corr: g for g in nodes if g.corr is not None}
    sync_of: dict[int, SyncActivity] = {}
    for activity in syncs:
        if activity.corr >= 0:
            sync_of.setdefault(activity.corr, activity)
    records = {c: call.start_ns for c, call in calls.items() if call.name in EVENT_RECORD_CALLS}
    counts: dict[str, int] = defaultdict(int)
    named: set[int] = set()
    unnamed = _event_waits(syncs, calls, streams, out, counts, named=named)
    bare_keys: set[int] = set()
    for corr, call in sorted(calls.items(), key=lambda kv: (kv[1].start_ns, kv[1].key)):
        if not _blocks(call, by_corr.get(corr)):
            if _host_memory_unnamed(call, by_corr.get(corr)):
                counts[_UNNAMED_HOST_MEMORY] += 1
            continue
        targets, inferred = _sync_targets(
            call,
            sync_of.get(corr),
            streams,
            own=by_corr.get(corr),
            records=records,
            default_device=default_device,
        )
        kept = [g for g in targets if g.end_ns <= call.end_ns + CLOCK_SLACK_NS]
        if len(kept) < len(targets):
            counts["host waits contradicted by the recorded times (ignored)"] += len(targets) - len(kept)
        targets = kept
        if not targets:
            continue
        host = call.host
        if host is None:
            host = call.key
            if host not in bare_keys:
                bare_keys.add(host)
                out.bare_calls.append(host)
        # once per edge: ``.item()`` waits for its copy in the copy call and again in a stream synchronise
        added = [g for g in targets if g.key not in out.deps[host]]
        for g in added:
            out.deps[host].append(g.key)
            if inferred:
                out.inferred[host].append(g.key)
        counts["inferred host waits on the GPU" if inferred else "host waits on the GPU"] += len(added)
    if not syncs:
        waits = sorted(c.start_ns for c in calls.values() if c.name in STREAM_WAIT_CALLS)
        waited_ns = _infer_event_waits(waits, nodes, out, counts)
        n = sum(len(v) for v in out.inferred.values())
        if n:
            out.notes.append(
                f"no CUDA sync events in the trace: {n} GPU wait edge(s) inferred from timing "
                f"({ms_text(waited_ns)} ms of recorded kernel waiting rests on event waits inferred so)"
            )
    elif unnamed:
        before = sum(len(v) for v in out.inferred.values())
        waited_ns = _infer_event_waits(sorted(unnamed), nodes, out, counts)
        n = sum(len(v) for v in out.inferred.values()) - before
        out.notes.append(
            f"{len(unnamed)} CUDA stream wait(s) whose sync event names no event record (the trace gives "
            f"only the event's id): {n} GPU wait edge(s) inferred from timing ({ms_text(waited_ns)} ms of "
            "recorded kernel waiting rests on them)"
        )
    _current_stream_waits(nodes, streams, out, counts, named)
    out.launch = _launches(nodes, out.deps, collectives)
    out.launched_in = {
        g.key: g.host for g in nodes if g.host is not None and not g.comm and g.key not in out.launch
    }
    for host in collectives & out.deps.keys():  # its own staging copies: part of it, no cycle
        own = {d for d in out.deps[host] if out.launch.get(d) == host}
        if own:
            out.deps[host] = [d for d in out.deps[host] if d not in own]
            out.inferred[host] = [d for d in out.inferred.get(host, []) if d not in own]
            counts["synchronisations of host-run collectives on the copies they launched (not written)"] += (
                len(own)
            )
    out.notes += [f"{v} {k}" for k, v in sorted(counts.items())]
    return out


def _launches(
    nodes: Sequence[GpuNode], deps: Mapping[int, list[int]], collectives: Set[int]
) -> dict[int, int]:
    """Launch edges: each GPU node on the host node around its launch, unless that host node synchronises
    on the node's stream (``.item()``: the launch would close a cycle; stream order keeps it) and is not
    one of ``collectives`` (whose synchronisations on their own copies are dropped instead)."""
    by_key = {g.key: g for g in nodes}
    waited_on: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for key, ds in deps.items():
        if key not in by_key and key not in collectives:  # a host node: what it synchronised on
            waited_on[key].update((by_key[d].device, by_key[d].stream) for d in ds)
    return {
        g.key: g.host
        for g in nodes
        if g.host is not None and not g.comm and (g.device, g.stream) not in waited_on.get(g.host, ())
    }


def _event_waits(
    syncs: Sequence[SyncActivity],
    calls: Mapping[int, Call],
    streams: _Streams,
    out: GpuDeps,
    counts: dict[str, int],
    *,
    named: set[int],
) -> list[int]:
    """``Stream Wait Event`` activities: the waiting stream's next node depends on the recorded stream's
    (its key added to ``named``, whether or not anything ran there before the record). Returns the start
    times of the wait calls whose activity does not name the event record or its stream (torch 2.11's
    Kineto gives only the event's id): those waits are inferred from timing."""
    unnamed: list[int] = []
    for sy in syncs:
        if sy.kind != STREAM_WAIT:
            continue
        s, w = sy.stream, sy.wait_on_stream
        call, record = calls.get(sy.corr), calls.get(sy.record_corr)
        if call is not None and (w < 0 or sy.record_corr < 0):
            unnamed.append(call.start_ns)
            continue
        if s < 0 or w < 0 or call is None or record is None:
            counts["stream waits without their calls in the trace"] += 1
            continue
        if s == w:
            continue  # stream order already
        src = streams.last_before(sy.device, w, record.start_ns)
        dst = streams.first_after(sy.device, s, call.start_ns)
        if dst is not None:
            named.add(dst.key)
        if src is None or dst is None or src.key == dst.key:
            continue  # nothing ran before the record, or nothing waited after it in the window
        if dst.comm and dst.issue_ns is None:
            counts[_COMM_WAITS] += 1
            continue
        if src.end_ns > dst.start_ns + CLOCK_SLACK_NS:
            counts["stream waits contradicted by the recorded times (ignored)"] += 1
            continue
        if src.key not in out.deps[dst.key]:
            out.deps[dst.key].append(src.key)
            counts[_COMM_QUEUED if dst.comm else "GPU event waits across streams"] += 1
    return unnamed


_CURRENT_STREAM = (
    "stream waits of NCCL kernels for the stream current at their call (c10d's; from the launch order)"
)


def _current_stream_waits(
    nodes: Sequence[GpuNode], streams: _Streams, out: GpuDeps, counts: dict[str, int], named: Set[int]
) -> None:
    """Each NCCL kernel (or comm node) not in ``named`` depends on the last node launched before its call
    on the stream current at that call (module docstring)."""
    nccl = [g for g in nodes if g.comm or names_nccl_kernel(g.name)]
    if not nccl:
        return
    waiting = {g.key for g in nccl}
    others: dict[tuple[int, int | None], list[GpuNode]] = defaultdict(list)
    for g in nodes:
        if g.key not in waiting:
            others[(g.device, None)].append(g)
            if g.thread is not None:
                others[(g.device, g.thread)].append(g)
    launched = {k: sorted(v, key=lambda g: (g.launch_ns, g.key)) for k, v in others.items()}
    at = {k: [g.launch_ns for g in v] for k, v in launched.items()}

    def last_launched(key: tuple[int, int | None], t: int) -> GpuNode | None:
        i = bisect_left(at.get(key, ()), t) - 1
        return launched[key][i] if i >= 0 else None

    for g in nccl:
        if g.key in named:
            continue
        t = g.issue_ns if g.comm else g.launch_ns
        if t is None:
            continue  # a comm node without its call's start gets no wait edge (counted where one applied)
        mine = last_launched((g.device, g.thread), t) if g.thread is not None else None
        last = mine or last_launched((g.device, None), t)
        src = None if last is None else streams.last_before(g.device, last.stream, t)
        if src is None or src.key in out.deps[g.key]:
            continue
        if src.end_ns > g.start_ns + CLOCK_SLACK_NS:
            counts["stream waits contradicted by the recorded times (ignored)"] += 1
            continue
        out.deps[g.key].append(src.key)
        counts[_CURRENT_STREAM] += 1


def _running_at_call(end_ns: int, comm: GpuNode) -> bool:
    """Whether what a comm node's NCCL kernel waited for (ending at ``end_ns``) still ran at its call."""
    return comm.issue_ns is not None and end_ns > comm.issue_ns


def _blocks(call: Call, own: GpuNode | None) -> bool:
    """Whether the call blocks the host until GPU work is done (``own``: the GPU node it issued)."""
    if call.name in _ASYNC_COPY:
        return own is not None and own.name == PAGEABLE_DTOH
    return call.name in BLOCKING_CALLS


def _host_memory_unnamed(call: Call, own: GpuNode | None) -> bool:
    """An asynchronous HIP copy to the host: ROCm's Kineto names no pageable memory, so whether the call
    waited for its copy (:data:`PAGEABLE_DTOH` on CUDA) is unknown."""
    return (
        call.name in _ASYNC_COPY and call.name.startswith("hip") and own is not None and own.name == ROCM_DTOH
    )


def _sync_targets(
    call: Call,
    sy: SyncActivity | None,
    streams: _Streams,
    *,
    own: GpuNode | None,
    records: Mapping[int, int],
    default_device: int,
) -> tuple[list[GpuNode], bool]:
    """What a blocking call waited for, and whether that was inferred (no sync event said it). ``own``: the
    GPU node of the call's correlation (a blocking copy's copy)."""
    device = sy.device if sy is not None else default_device
    t = call.start_ns
    found: list[GpuNode | None]
    if call.name in _BLOCKING_COPY or call.name in _ASYNC_COPY:
        return ([own] if own is not None else []), False
    if sy is not None and sy.kind == STREAM_SYNC:
        found = [streams.last_before(device, sy.stream, t)]
    elif sy is not None and sy.kind == EVENT_SYNC and sy.wait_on_stream >= 0 and sy.record_corr in records:
        found = [streams.last_before(device, sy.wait_on_stream, records[sy.record_corr])]
    elif (sy is not None and sy.kind == CONTEXT_SYNC) or call.name in _DEVICE_SYNC:
        found = [streams.last_before(device, s, t) for s in streams.streams_of(device)]
    else:
        # a stream or event synchronise with no sync event: the node launched before it that ended last
        # while the call was blocked
        best: GpuNode | None = None
        for key, v in streams.by.items():
            i = bisect_left(streams.launches[key], t) - 1
            if i < 0:
                continue
            g = v[i]
            if t <= g.end_ns <= call.end_ns + CLOCK_SLACK_NS and (best is None or g.end_ns > best.end_ns):
                best = g
        return ([best] if best is not None else []), True
    return [g for g in found if g is not None], False


def _infer_event_waits(
    waits: Sequence[int], nodes: Sequence[GpuNode], out: GpuDeps, counts: dict[str, int]
) -> int:
    """Inferred event waits (module docstring) behind the stream-wait calls starting at ``waits`` (sorted);
    returns the recorded waiting time resting on them, ns."""
    if not waits:
        return 0
    by_dev: dict[int, list[GpuNode]] = defaultdict(list)
    for g in nodes:
        by_dev[g.device].append(g)
    total = 0
    for dev_nodes in by_dev.values():
        per_stream: dict[int, list[GpuNode]] = defaultdict(list)
        for g in sorted(dev_nodes, key=lambda g: (g.start_ns, g.key)):
            per_stream[g.stream].append(g)
        ends = sorted((g.end_ns, g.stream, g.key) for g in dev_nodes)
        end_t = [e for e, _s, _k in ends]
        for stream, v in per_stream.items():
            for prev, g in pairwise(v):
                delay = g.start_ns - max(g.launch_ns, prev.end_ns)
                if delay <= INFER_MIN_DELAY_NS:
                    continue
                k = bisect_left(waits, prev.launch_ns)
                if k == len(waits) or waits[k] > g.launch_ns:
                    continue  # no stream-wait call could have put a wait in front of it
                hi = bisect_right(end_t, g.start_ns) - 1
                while hi >= 0 and end_t[hi] >= g.start_ns - INFER_SLACK_NS:
                    e, s, key = ends[hi]
                    if s != stream:
                        if g.comm and not _running_at_call(e, g):
                            # ended before the call: it cannot have held the kernel (the stream current
                            # at the call gives the node its edge); a node without its call, no edge
                            if g.issue_ns is None:
                                counts[_COMM_WAITS] += 1
                        else:
                            out.deps[g.key].append(key)
                            out.inferred[g.key].append(key)
                            total += delay
                            if g.comm:
                                counts[_COMM_QUEUED] += 1
                        break
                    hi -= 1
    return total
