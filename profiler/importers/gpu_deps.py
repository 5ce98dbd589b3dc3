"""What waits on what between a rank's host threads and its CUDA streams, read from a Kineto trace.

The edges are written in the form ``skewlens.profiler.vocab`` describes under "GPU dependencies" (the
launch itself, a GPU node's ctrl dep on the host op around its launch call, is added by the converter):

Event waits (``cudaEventRecord`` on stream W, then ``cudaStreamWaitEvent`` of stream S)
    With CUDA sync events, each ``Stream Wait Event`` activity names S, W and the correlation of the
    event record: the first GPU node launched on S after the wait call depends on the last GPU node
    launched on W before the record.
Host synchronisation (``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``,
a blocking ``cudaMemcpy``)
    The host node around the call (the top-level op enclosing it, or the call itself as a node where no
    op encloses it) depends on what the call waited for: with sync events, ``Stream Sync`` -> the last
    GPU node launched on that stream before the call, ``Event Sync`` -> the last node launched on the
    recorded stream before the event record, ``Context Sync`` -> the last node of every stream of the
    device; without them, a device synchronise still waits for every stream, a blocking copy for its own
    copy, and a stream or event synchronise for the GPU node launched before the call that ended last
    while the call was blocked (inferred). Non-blocking queries (``cudaEventQuery``) are not waits.
Inferred event waits (a trace without CUDA sync events)
    A GPU node that started more than ``INFER_MIN_DELAY_NS`` after both its launch and the end of its
    predecessor on its stream, with a ``cudaStreamWaitEvent`` call between its predecessor's launch and
    its own, waited for something on another stream: the node of another stream of its device that ended
    last within ``INFER_SLACK_NS`` before it started. Such edges are listed in ``skl_inferred_deps`` and
    counted in the manifest notes, with the recorded waiting time that rests on them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import msgspec

from skewlens.profiler.importers.kineto import KEvent, KinetoTrace, as_int

#: A GPU node delayed by more than this after its launch and its stream predecessor waited for something.
INFER_MIN_DELAY_NS = 10_000
#: ... for the node of another stream that ended at most this long before it started.
INFER_SLACK_NS = 20_000
#: A host call that ends at most this long before what it waited for ended is still taken to have waited
#: for it (timestamp rounding between the CPU and GPU timelines).
SKEW_NS = 2_000

_STREAM_SYNC = frozenset({"cudaStreamSynchronize", "cuStreamSynchronize"})
_EVENT_SYNC = frozenset({"cudaEventSynchronize", "cuEventSynchronize"})
_DEVICE_SYNC = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize"})
_BLOCKING_COPY = frozenset(
    {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}
)
BLOCKING_CALLS = _STREAM_SYNC | _EVENT_SYNC | _DEVICE_SYNC | _BLOCKING_COPY
_STREAM_WAIT_CALLS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent"})
_EVENT_RECORD_CALLS = frozenset({"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord"})


class GpuNode(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the dependency search needs of one GPU node (a frozen msgspec Struct: one per GPU node)."""

    key: int
    """The converter's handle of the node (its Kineto event index)."""
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
    """Correlation id."""


@dataclass(kw_only=True, slots=True)
class GpuDeps:
    """Edges found: ``deps[key]`` are the keys a node depends on; ``inferred[key]`` those of them inferred."""

    deps: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Dependant key -> dependency keys."""
    inferred: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Dependant key -> dependency keys inferred from timing."""
    bare_calls: list[KEvent] = field(default_factory=list)
    """Blocking runtime calls enclosed by no host op: each becomes a host node (key: its event index)."""
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
        v = self.by.get((device, stream))
        if not v:
            return None
        i = bisect_left(self.launches[(device, stream)], t) - 1
        return v[i] if i >= 0 else None

    def first_after(self, device: int, stream: int, t: int) -> GpuNode | None:
        v = self.by.get((device, stream))
        if not v:
            return None
        i = bisect_right(self.launches[(device, stream)], t)
        return v[i] if i < len(v) else None

    def streams_of(self, device: int) -> list[int]:
        return sorted(s for d, s in self.by if d == device)


def _arg(e: KEvent, key: str) -> int | None:
    return as_int(e.args.get(key))


def gpu_dependencies(
    kt: KinetoTrace, nodes: Sequence[GpuNode], host_of: Callable[[KEvent], int | None]
) -> GpuDeps:
    """Event waits and host synchronisations of one rank (rules in the module docstring).

    ``host_of(call)`` is the key of the host node enclosing a runtime call (None where none does).
    """
    out = GpuDeps()
    streams = _Streams(nodes)
    by_corr = {g.corr: g for g in nodes if g.corr is not None}
    sync_of: dict[int, KEvent] = {}
    for sev in kt.syncs:
        c = sev.corr
        if c is not None:
            sync_of.setdefault(c, sev)
    records = {c: e.start_ns for c, e in kt.launches.items() if e.name in _EVENT_RECORD_CALLS}
    counts: dict[str, int] = defaultdict(int)
    _event_waits(kt, streams, out, counts)
    bare_keys: set[int] = set()
    for call in sorted(kt.launches.values(), key=lambda e: (e.start_ns, e.index)):
        if call.name not in BLOCKING_CALLS:
            continue
        targets, inferred = _sync_targets(call, sync_of.get(call.corr or -1), streams, by_corr, records)
        targets = [g for g in targets if g.end_ns <= call.end_ns + SKEW_NS]
        if not targets:
            continue
        host = host_of(call)
        if host is None:
            host = call.index
            if host not in bare_keys:
                bare_keys.add(host)
                out.bare_calls.append(call)
        for g in targets:
            if g.key not in out.deps[host]:
                out.deps[host].append(g.key)
                if inferred:
                    out.inferred[host].append(g.key)
        counts["inferred host waits on the GPU" if inferred else "host waits on the GPU"] += len(targets)
    if not kt.syncs:
        waited_ns = _infer_event_waits(kt, nodes, out)
        n = sum(len(v) for v in out.inferred.values())
        if n:
            out.notes.append(
                f"no CUDA sync events in the trace: {n} GPU wait edge(s) inferred from timing "
                f"({waited_ns / 1e6:.3f} ms of recorded kernel waiting rests on event waits inferred so)"
            )
    out.notes += [f"{v} {k}" for k, v in sorted(counts.items())]
    return out


def _event_waits(kt: KinetoTrace, streams: _Streams, out: GpuDeps, counts: dict[str, int]) -> None:
    """``Stream Wait Event`` activities: the waiting stream's next node depends on the recorded stream's."""
    for ev in kt.syncs:
        if ev.name != "Stream Wait Event":
            continue
        device = _arg(ev, "device") or 0
        s, w = _arg(ev, "stream"), _arg(ev, "wait_on_stream")
        call = kt.launches.get(ev.corr or -1)
        record = kt.launches.get(_arg(ev, "wait_on_cuda_event_record_corr_id") or -1)
        if s is None or w is None or s < 0 or w < 0 or call is None or record is None:
            counts["stream waits without their calls in the trace"] += 1
            continue
        src = streams.last_before(device, w, record.start_ns)
        dst = streams.first_after(device, s, call.start_ns)
        if src is None or dst is None or src.key == dst.key:
            continue  # nothing ran before the record, or nothing waited after it in the window
        if src.end_ns > dst.start_ns + SKEW_NS:
            counts["stream waits contradicted by the recorded times (ignored)"] += 1
            continue
        if src.key not in out.deps[dst.key]:
            out.deps[dst.key].append(src.key)
            counts["GPU event waits across streams"] += 1


def _sync_targets(
    call: KEvent, ev: KEvent | None, streams: _Streams, by_corr: dict[int, GpuNode], records: dict[int, int]
) -> tuple[list[GpuNode], bool]:
    """What a blocking call waited for, and whether that was inferred (no sync event said it)."""
    device = (_arg(ev, "device") if ev is not None else None) or 0
    t = call.start_ns
    found: list[GpuNode | None]
    if call.name in _BLOCKING_COPY:
        own = by_corr.get(call.corr or -1)
        return ([own] if own is not None else []), False
    if ev is not None and ev.name == "Stream Sync":
        found = [streams.last_before(device, _arg(ev, "stream") or -1, t)]
        return [g for g in found if g is not None], False
    if ev is not None and ev.name == "Event Sync":
        record_corr = _arg(ev, "wait_on_cuda_event_record_corr_id")
        w = _arg(ev, "wait_on_stream")
        record_t = records.get(record_corr) if record_corr is not None else None
        if w is None or w < 0 or record_t is None:
            return [], False
        found = [streams.last_before(device, w, record_t)]
        return [g for g in found if g is not None], False
    if (ev is not None and ev.name == "Context Sync") or call.name in _DEVICE_SYNC:
        found = [streams.last_before(device, s, t) for s in streams.streams_of(device)]
        return [g for g in found if g is not None], False
    # a stream or event synchronise with no sync event: the node launched before it that ended last while
    # the call was blocked
    best: GpuNode | None = None
    for (_d, _s), v in streams.by.items():
        i = bisect_left(streams.launches[(_d, _s)], t) - 1
        if i < 0:
            continue
        g = v[i]
        if t <= g.end_ns <= call.end_ns + SKEW_NS and (best is None or g.end_ns > best.end_ns):
            best = g
    return ([best] if best is not None else []), True


def _infer_event_waits(kt: KinetoTrace, nodes: Sequence[GpuNode], out: GpuDeps) -> int:
    """Inferred event waits (module docstring); returns the recorded waiting time resting on them, ns."""
    waits = sorted(e.start_ns for e in kt.launches.values() if e.name in _STREAM_WAIT_CALLS)
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
                ready = max(g.launch_ns, prev.end_ns)
                delay = g.start_ns - ready
                if delay <= INFER_MIN_DELAY_NS:
                    continue
                k = bisect_left(waits, prev.launch_ns)
                if k == len(waits) or waits[k] > g.launch_ns:
                    continue  # no stream-wait call could have put a wait in front of it
                hi = bisect_right(end_t, g.start_ns) - 1
                while hi >= 0 and end_t[hi] >= g.start_ns - INFER_SLACK_NS:
                    _e, s, key = ends[hi]
                    if s != stream:
                        out.deps[g.key].append(key)
                        out.inferred[g.key].append(key)
                        total += delay
                        break
                    hi -= 1
    return total
