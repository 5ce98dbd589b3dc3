"""Turn one rank's Kineto trace (plus, optionally, its host execution trace) into Chakra nodes.

Conversion rules
================

Times
    Kineto ``ts``/``dur`` are microseconds (floats in newer files); they become integer ns as
    ``baseTimeNanoseconds + round(ts * 1000)`` (``baseTimeNanoseconds`` is 0 in older files, whose ``ts``
    is already absolute). Floats of ~16 significant digits keep this exact to about 1 ns. Kineto clocks
    of different hosts are not aligned by anything in the files, so ``clock_offsets_ns`` is 0 for every
    rank (ranks of one host share the clock).

Compute
    Only **top-level** ``cpu_op`` events of each thread become COMP nodes (``stream`` = tid,
    ``skl_stream_kind`` = ``thread``, ``is_cpu_op`` = True): an op is top-level when it starts at or after
    the end of the previous top-level op of its thread. Nested ops are dropped, so summing COMP
    durations per thread never double counts. User annotations (``ProfilerStep#N``, ``## forward ##``,
    ``nccl:*``) are not nodes. Every kernel, memcpy and memset becomes a GPU node on its CUDA stream
    (``stream`` = ``args.stream``, ``skl_stream_kind`` = ``cuda``, ``is_cpu_op`` = False).

Communication
    A kernel whose name starts with ``nccl`` (``ncclKernel_*``, ``ncclDevKernel_*``) is the GPU side of a
    communication op. Its CPU side is found through the launch: kernel ``args.correlation`` -> the
    ``cuda_runtime``/``cuda_driver`` event with that correlation -> the backend annotation
    (``nccl:*``/``gloo:*``) enclosing the launch on that thread, and the ``record_param_comms`` and
    ``c10d::``/``_c10d_functional::`` ops enclosing that annotation (or, with no annotation, the launch).
    What the op is, first source that says it wins (:mod:`skewlens.profiler.importers.comm` reads each):

    1. ``Collective name`` / ``In msg nelems`` / ``dtype`` / ``Process Group Name`` / ``Seq`` in the kernel's
       or ``record_param_comms``'s args (newer Kineto);
    2. the paired host execution trace's op (the k-th backend annotation of the Kineto trace, in start
       order, is the host trace's k-th, in id order; names must agree, else the pair is refused): its
       ``record_param_comms`` (c10d seq, ``all_to_allv``, peer ...) and input tensors (numel x element size);
    3. the Kineto ``nccl:*`` annotation (its name, ``nccl:send 0->1`` with the peer; ``Input Dims`` x
       ``Input type`` for the size);
    4. the ``c10d::`` op (``c10d::_allgather_base_``; its input argument's dims, the peer of
       ``c10d::send``/``recv_`` in ``Concrete Inputs``);
    5. the kernel name, where it says the op (``ncclKernel_AllReduce_*`` -> ALL_REDUCE, ``*_Send*``; size
       unknown, 0). ``SendRecv`` and ``Generic`` kernels say nothing: they run all-to-all, batched p2p and,
       in some NCCL builds, every collective.

    Collectives become COMM_COLL nodes with ``comm_type`` (Chakra enum), ``comm_size`` = **bytes of this
    rank's input buffer** (what it contributes: ``In msg nelems`` x element size, the whole tensor for
    all-reduce, the local shard for all-gather, the full input for reduce-scatter, the send buffer for
    all-to-all(v); this is Chakra's converter's convention, the sum of input tensor sizes), ``pg_name``
    (trace arg, else ``"0"``), ``skl_seq``: the trace's sequence number where every collective of the rank
    has one (Kineto ``Seq``, or the host trace's c10d seq), otherwise the n-th collective a rank issues on
    a group (in CPU launch order) gets seq n. Send/recv become COMM_SEND/COMM_RECV where the peer is
    known (``Dst Rank`` / ``Src Rank`` args, a global rank; else host trace, annotation or op: a rank within
    the op's group, mapped to the global rank through the group's ranks, the default group ``"0"`` being
    the world); a p2p op whose peer the trace does not
    give, and a ``SendRecv`` kernel whose CPU side is not in the trace, stay GPU COMP nodes (counted in the
    manifest notes, with the reason). Only the first NCCL kernel launched by one op carries the op; further
    kernels of the same op are GPU COMP nodes (none of the shared real traces has one). A backend annotation
    with no kernel in the trace (gloo, a zero-byte all-to-all that launches none, or a kernel outside the
    window) makes the top-level CPU op around it the communication node, so that every rank counts the
    same collectives; one on a thread of its own (gloo's worker threads) is itself the node, depending on
    the op that issued it (``c10d::<collective>`` ops and such annotations of one type paired first-in
    first-out).

Dependencies
    Control: program order per thread / per CUDA stream (each node depends on the previous node of its
    stream); launches, event waits and host synchronisations as :mod:`skewlens.profiler.gpu_deps` says,
    the host node of a launch or a synchronisation being the top-level CPU op whose extent contains the call;
    a backward pass on autograd's device thread follows the main thread's call of it and the main thread's
    next node follows the pass (:mod:`skewlens.profiler.autograd`).
    Data (with a host trace): host ops are joined to Kineto ops (:mod:`skewlens.profiler.importers.join`); a
    top-level CPU node reads/writes its host op's input/output tensors (tensor id, storage id), a
    collective's GPU node reads the tensors of its host annotation; a node gets a data dependency on the
    latest earlier-starting CPU node that wrote a tensor it reads (unless that is already a control
    dependency). GPU nodes write nothing (a CPU op never waits for a kernel through a data edge).

Process groups and steps
    ``distributedInfo.pg_config`` and the groups named in the events' args (``Process Group Name`` /
    ``Ranks``); where neither names any, the host trace's ``## process_group:init ##`` node; else one
    world group ``"0"`` (an empty rank list means the whole world); written as the
    ``## process_group:init ##`` METADATA node (node id 0). A ``ProfilerStep#N`` annotation sets
    ``skl_step`` = N on the CPU nodes that start inside it and on the GPU nodes those launch (or, where no
    top-level CPU op encloses the launch, on those whose launch call lies inside it); the step
    span ends at the later of the annotation's end and its last node's (on the device, for GPU work),
    and begins where the previous step's span ended (the first at its annotation's start, or where the GPU
    work issued before it ended, if later: work launched before it, or with no launch in the trace begun
    before it or run on its stream ahead of the stream's first node launched in it, the work of the step
    before the profiler started, which is in no step): a step's time is the period from one step's end to
    the next, and steps never overlap, however far the CPU runs ahead of the GPU.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from skewlens.profiler.autograd import backward_runs, is_engine_op, joins, joins_note
from skewlens.profiler.chakra_io import AttrValue, as_comm_node
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.gpu_deps import CALLS_READ, Call, GpuNode, SyncActivity, gpu_dependencies
from skewlens.profiler.importers.comm import (
    DEFAULT_PG,
    OVER,
    CommInfo,
    info_from_annotation,
    info_from_args,
    info_from_host,
    info_from_kernel_name,
    info_from_op,
    kernel_kind,
    merge,
)
from skewlens.profiler.importers.encode import NodeEncoder, id_and_time_fields
from skewlens.profiler.importers.host_et import COMM_ANNOTATION_PREFIXES, HostComm, HostTrace, TensorKey
from skewlens.profiler.importers.join import join_ops
from skewlens.profiler.importers.kineto import (
    COMM_OP_PREFIXES,
    MAX_INT,
    KEvent,
    KinetoTrace,
    as_int,
    cut_ranks_text,
    ranks_text,
)
from skewlens.profiler.manifest import MAX_WORLD_SIZE, ProcessGroupInfo, StepSpan
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.vocab import (
    Attr,
    CommType,
    NodeType,
    collective_from_op,
    names_nccl_kernel,
    uneven_splits,
)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: Most earlier-starting events examined when looking for the event enclosing a time (nesting bound).
_LOOK_BACK = 1024
#: Nodes whose id and time fields are encoded together (:func:`id_and_time_fields`).
_FIELDS_BATCH = 8192
# enum members read once: ``Attr.X`` costs ~0.25 us a look-up (Python 3.11), and the paths below that run
# once per event or node would make hundreds of thousands of them
_STREAM, _STREAM_KIND, _IS_CPU_OP, _DEVICE = Attr.STREAM, Attr.STREAM_KIND, Attr.IS_CPU_OP, Attr.DEVICE
_RF_ID, _LAUNCH_NS, _PG_NAME, _STEP_ATTR = Attr.RF_ID, Attr.LAUNCH_NS, Attr.PG_NAME, Attr.STEP
_INFERRED_DEPS, _LAUNCHED_IN, _COMP = Attr.INFERRED_DEPS, Attr.LAUNCHED_IN, NodeType.COMP


@dataclass(frozen=True, kw_only=True, slots=True)
class RankConversion:
    """One rank converted: its nodes, step spans, what it revealed about groups, and remarks."""

    rank: int
    """Global rank."""
    body: bytes
    """Its nodes in file order, encoded (length-prefixed Chakra ``Node`` messages; the METADATA node that
    lists the process groups, id 0, is not among them: it is written before them, once all ranks are
    converted)."""
    node_count: int
    """Nodes in ``body``."""
    pg_names: frozenset[str]
    """Process groups its communication nodes name (``pg_name``)."""
    steps: list[StepSpan]
    """Step spans of this rank."""
    groups: dict[str, ProcessGroupInfo]
    """Process groups named by the events (before merging with pg_config)."""
    device: str
    """``cuda:<i>`` of the GPU activities, ``cpu`` where there are none."""
    gpu: str = ""
    """That GPU as the trace's ``deviceProperties`` describe it (``manifest.gpu_model``), '' where not."""
    notes: list[str] = field(default_factory=list)
    """Remarks for the manifest."""
    unsized: int = 0
    """Communication nodes whose size the trace does not give (imported as 0 bytes)."""
    unnamed: int = 0
    """Collectives on a group smaller than the world that the trace does not name, kept as compute."""


class _Intervals:
    """Events of one thread sorted by start, for "which event encloses time t" queries."""

    def __init__(self, events: Sequence[KEvent]) -> None:
        self.events = sorted(events, key=lambda e: (e.start_ns, -e.dur_ns, e.index))
        self.starts = [e.start_ns for e in self.events]
        self.ends = [e.start_ns + e.dur_ns for e in self.events]
        self.max_end = list(accumulate(self.ends, max))  # no event at or before k ends later than this

    def enclosing(self, t: int) -> KEvent | None:
        """The latest-starting event with ``start <= t <= end`` (None where there is none)."""
        i = bisect_right(self.starts, t) - 1
        for k in range(i, max(i - _LOOK_BACK, -1), -1):  # bounded: a crafted trace cannot make this quadratic
            if self.max_end[k] < t:
                return None
            if self.ends[k] >= t:
                return self.events[k]
        return None

    def enclosing_all(self, ts: Sequence[int]) -> list[KEvent | None]:
        """:meth:`enclosing` of each time, at once: the latest event starting at or before a time decides
        for most (it encloses the time, or nothing before it ends that late); the rest are looked up one by
        one."""
        if not ts:
            return []
        t = np.asarray(ts, dtype=np.int64)
        i = np.searchsorted(np.asarray(self.starts, dtype=np.int64), t, side="right") - 1
        k = np.maximum(i, 0)
        hit = (i >= 0) & (np.asarray(self.ends, dtype=np.int64)[k] >= t)
        none = (i < 0) | (np.asarray(self.max_end, dtype=np.int64)[k] < t)
        events = self.events
        out: list[KEvent | None] = [None] * len(ts)
        for j, kk in zip(np.flatnonzero(hit).tolist(), k[hit].tolist(), strict=True):
            out[j] = events[kk]
        for j in np.flatnonzero(~(hit | none)).tolist():
            out[j] = self.enclosing(ts[j])
        return out


def _enclosing_each(by_tid: dict[int, _Intervals], calls: Sequence[KEvent | None]) -> list[KEvent | None]:
    """For each call, the event of its thread enclosing its start (:meth:`_Intervals.enclosing`); None for
    no call."""
    out: list[KEvent | None] = [None] * len(calls)
    at: dict[int, list[int]] = defaultdict(list)
    for j, c in enumerate(calls):
        if c is not None:
            at[c.tid].append(j)
    for tid, js in at.items():
        iv = by_tid.get(tid)
        if iv is not None:
            for j, e in zip(js, iv.enclosing_all([calls[j].start_ns for j in js]), strict=True):  # type: ignore[union-attr]
                out[j] = e
    return out


def _by_tid(events: Sequence[KEvent]) -> dict[int, _Intervals]:
    groups: dict[int, list[KEvent]] = defaultdict(list)
    for e in events:
        groups[e.tid].append(e)
    return {tid: _Intervals(evs) for tid, evs in groups.items()}


def top_level_ops(cpu_ops: Sequence[KEvent]) -> list[KEvent]:
    """Ops not nested in another op of their thread (a nested op starts before its parent ends)."""
    out: list[KEvent] = []
    groups: dict[int, list[KEvent]] = defaultdict(list)
    for e in cpu_ops:
        groups[e.tid].append(e)
    for evs in groups.values():
        end = None
        for e in sorted(evs, key=lambda e: (e.start_ns, -e.dur_ns, e.index)):
            if end is None or e.start_ns >= end:
                out.append(e)
                end = e.start_ns + e.dur_ns
    return out


def _comm_sites(kt: KinetoTrace) -> list[KEvent]:
    sites = [e for e in (*kt.annotations, *kt.cpu_ops) if e.name.startswith(COMM_ANNOTATION_PREFIXES)]
    return sorted(sites, key=lambda e: (e.start_ns, e.tid, e.index))


def _pair_host(kt: KinetoTrace, sites: list[KEvent], host: HostTrace) -> dict[int, HostComm]:
    """Pair the k-th comm annotation of the Kineto trace with the host trace's k-th comm op."""
    if len(host.comms) != len(sites) or any(
        h.name != s.name for h, s in zip(host.comms, sites, strict=False)
    ):
        first = next(
            (k for k, (h, s) in enumerate(zip(host.comms, sites, strict=False)) if h.name != s.name),
            min(len(host.comms), len(sites)),
        )
        raise TraceImportError(
            f"{host.path}: host execution trace does not match Kineto trace {kt.path} (rank {kt.rank}): "
            f"{len(host.comms)} vs {len(sites)} communication ops, first difference at op #{first}"
        )
    ptrs = {h.pg_ptr for h in host.comms if h.pg_ptr is not None}
    if len(ptrs) > 1 and not kt.pg_config:
        raise TraceImportError(
            f"{host.path}: communication on {len(ptrs)} process groups identified only by object address; "
            "cannot name the groups consistently across ranks"
        )
    return {s.index: h for s, h in zip(sites, host.comms, strict=True)}


class _Pending(msgspec.Struct, kw_only=True):
    """A node being built (mutable while communication and sequence numbers are attached); a msgspec
    Struct, one per node, made in C."""

    event: KEvent
    """The Kineto event the node comes from."""
    node_type: NodeType
    """Chakra node type (COMP until a communication op is attached)."""
    stream_key: tuple[Any, ...]
    """``("thread", tid)`` or ``("cuda", device, stream)``: nodes of one key run in order."""
    attrs: dict[str, AttrValue]
    """Attributes written with the node."""
    launch_order: int
    """CPU issue time (the comm annotation's start for comm nodes): orders collectives for seq."""
    parent: KEvent | None = None
    """Top-level CPU op whose extent contains this GPU node's launch call."""
    comm: CommInfo | None = None
    """The collective attached to this node, if any."""
    reads: tuple[TensorKey, ...] = ()
    """Host-trace tensors the node reads (data dependencies)."""
    writes: tuple[TensorKey, ...] = ()
    """Host-trace tensors the node writes."""
    extra_deps: list[int] = msgspec.field(default_factory=list)
    """Event indices of further nodes it waits for (event waits, host synchronisation: gpu_deps)."""
    inferred: list[int] = msgspec.field(default_factory=list)
    """Those of ``extra_deps`` inferred from timing."""
    launch_dep: bool = True
    """Whether a GPU node depends on ``parent`` (its launch); False where ``parent`` then synchronises on
    the node's stream (a dependency would close a cycle)."""
    launched_in: bool = False
    """Where ``launch_dep`` is False for that reason: the launch is written as ``skl_launched_in``."""


@dataclass(kw_only=True, slots=True)
class _Sources:
    """Lookup structures of one rank's trace used while attaching communication."""

    kt: KinetoTrace
    """The rank's trace."""
    tops: dict[int, _Intervals]
    """Top-level CPU ops per thread."""
    sites: dict[int, _Intervals]
    """Backend annotations (``nccl:*``) per thread."""
    rpcs: dict[int, _Intervals]
    """``record_param_comms`` ops per thread."""
    ops: dict[int, _Intervals]
    """``c10d::`` / ``_c10d_functional::`` ops per thread."""
    host_of_site: dict[int, HostComm]
    """Paired host-trace op per annotation (by event index)."""
    groups: dict[str, ProcessGroupInfo] = field(default_factory=dict)
    """Process groups named by event args."""
    unsized: int = 0
    """Communication nodes made whose size no source gave (0 bytes)."""
    unnamed: int = 0
    """Collectives kept as compute: on a group smaller than the world that the trace does not name."""

    def cpu_side(
        self, site: KEvent | None, call: KEvent | None
    ) -> tuple[KEvent | None, list[dict[str, Any]]]:
        """The CPU side of a communication op and what it says, best first.

        Sources: the ``record_param_comms`` around the backend annotation ``site``, the paired host-trace
        op, the annotation, the ``c10d::`` op around it; with no annotation (a kernel launched outside any),
        the ``record_param_comms`` and ``c10d::`` op around the launch ``call``. Also returns the event that
        stands for the op (the annotation, else the ``c10d::`` op, else the ``record_param_comms``).
        """
        at = site or call
        if at is None:
            return None, []
        rv, ov = self.rpcs.get(at.tid), self.ops.get(at.tid)
        rpc = rv.enclosing(at.start_ns) if rv else None
        op = ov.enclosing(at.start_ns) if ov else None
        out = []
        if rpc is not None:
            out.append(info_from_args(rpc.args))
            _note_group(self.groups, rpc.args, self.kt)
        if site is not None:
            if site.index in self.host_of_site:
                out.append(info_from_host(self.host_of_site[site.index]))
            out.append(info_from_annotation(site))
        if op is not None:
            out.append(info_from_op(op))
        return site or op or rpc, out

    def split_attrs(self, info: CommInfo) -> dict[str, AttrValue]:
        """An all_to_all's uneven splits as the capture records them (``vocab.uneven_splits``), from the
        trace's ``In split size`` / ``Out split size``; none where they are even, or where this rank's place
        in the group is unknown or the lists do not have one entry per member."""
        kt = self.kt
        g = self.groups.get(info.pg_name) or next((g for g in kt.pg_config if g.name == info.pg_name), None)
        members = list(g.ranks) if g is not None and g.ranks else None
        if members is None:  # the whole world (group rank = global rank)
            if g is None and info.pg_name != DEFAULT_PG:
                return {}
            members = list(range(kt.world_size or 0))
        if kt.rank not in members or len(info.send_splits) != len(members):
            return {}
        split = uneven_splits(info.send_splits, info.recv_splits, members.index(kt.rank))
        if split is None:
            return {}
        sent, got, to, frm = split
        return {
            Attr.SEND_BYTES: sent,
            Attr.RECV_BYTES: got,
            Attr.SEND_SPLITS: list(to),
            Attr.RECV_SPLITS: list(frm),
        }

    def global_rank(self, pg_name: str, group_rank: int, what: str) -> int | None:
        """Global rank of ``group_rank`` in group ``pg_name``; None where the group's ranks are unknown.

        The groups of ``pg_config`` and of event args give the mapping; an empty rank list, or the default
        group ``"0"`` that nothing describes, is the whole world (group rank = global rank).
        """
        g = self.groups.get(pg_name) or next((g for g in self.kt.pg_config if g.name == pg_name), None)
        if g is None or not g.ranks:
            return group_rank if g is not None or pg_name == DEFAULT_PG else None
        if not 0 <= group_rank < len(g.ranks):
            raise TraceImportError(
                f"{self.kt.path}: rank {self.kt.rank}: {what} names rank {group_rank} of process group "
                f"{pg_name!r}, which has {len(g.ranks)} rank(s)"
            )
        return g.ranks[group_rank]


def _attach(p: _Pending, info: CommInfo, src: _Sources) -> bool:
    """Make ``p`` a communication node; False where the op is neither a collective nor a p2p whose peer
    is known (the trace gives the peer as a group rank: mapped to the global rank here)."""
    kt = src.kt
    rank = kt.rank
    for what, v in (
        ("size", info.size_bytes),
        ("element count", info.numel),
        ("sequence number", info.seq),
        # in bytes: a split of 10**30 elements was a traceback writing the trace ('Value out of range')
        ("all_to_all bytes sent", sum(info.send_splits)),
        ("all_to_all bytes received", sum(info.recv_splits)),
    ):
        if v is not None and not 0 <= v < MAX_INT:
            raise TraceImportError(
                f"{kt.path}: rank {rank}: {p.event.name[:60]} (traceEvents[{p.event.index}]) has {what} "
                f"{v if v < OVER else f'over 2**{OVER.bit_length() - 1}'} out of range"
            )
    if info.comm_type is not None:
        if _unnamed_subgroup(info, kt):
            # older torch names no group: such a collective went to the world group, matched with ranks
            # that never ran it; it is kept as compute, with a note (:func:`_unknown_note`), which check
            # warns of (the rank's ``communication groups`` note)
            src.unnamed += 1
            return False
        p.node_type = NodeType.COMM_COLL
        p.comm = info
        p.attrs.update(
            {
                Attr.COMM_TYPE: int(info.comm_type),
                Attr.COMM_SIZE: info.size_bytes,
                Attr.PG_NAME: info.pg_name,
                Attr.DTYPE: info.dtype,
                Attr.NUMEL: info.numel,
                Attr.OP: info.op,
            }
        )
        if info.comm_type == CommType.ALL_TO_ALL and info.send_splits:
            p.attrs.update(src.split_attrs(info))
        src.unsized += not info.sized
        as_comm_node(p.attrs)
        return True
    peer = info.peer_global
    if peer is None and info.p2p and info.peer is not None:
        peer = src.global_rank(info.pg_name, info.peer, info.op)
    if peer is not None:
        if not 0 <= peer < (kt.world_size or MAX_INT):
            raise TraceImportError(f"{kt.path}: rank {rank}: {info.op} with peer rank {peer} out of range")
        p.node_type = NodeType.COMM_SEND if info.p2p == "send" else NodeType.COMM_RECV
        sender, receiver = (rank, peer) if info.p2p == "send" else (peer, rank)
        p.attrs.update(
            {
                Attr.COMM_SRC: sender,
                Attr.COMM_DST: receiver,
                Attr.COMM_TAG: 0,
                Attr.COMM_SIZE: info.size_bytes,
                Attr.PG_NAME: info.pg_name,
                Attr.OP: info.op,
            }
        )
        src.unsized += not info.sized
        as_comm_node(p.attrs)
        return True
    return False


def _cpu_node(e: KEvent) -> _Pending:
    attrs: dict[str, AttrValue] = {_STREAM: e.tid, _STREAM_KIND: "thread", _IS_CPU_OP: True}
    if e.rf_id is not None:
        attrs[_RF_ID] = e.rf_id
    return _Pending(
        event=e, node_type=_COMP, stream_key=("thread", e.tid), attrs=attrs, launch_order=e.start_ns
    )


@functools.cache
def _device_name(device: int) -> str:
    return f"cuda:{device}"  # one string per device (its hash is computed once, where the encoder caches)


#: Per (device, stream): the stream key and the attributes every GPU node of the stream starts with.
_GpuStreams = dict[tuple[int, int], tuple[tuple[Any, ...], dict[str, AttrValue]]]


def _gpu_node(e: KEvent, launch: KEvent | None, parent: KEvent | None, streams: _GpuStreams) -> _Pending:
    """The GPU node of a kernel/memcpy/memset launched by ``launch`` inside the top-level op ``parent``."""
    stream = e.tid if e.stream is None else e.stream
    device = e.device or 0
    known = streams.get((device, stream))
    if known is None:
        first: dict[str, AttrValue] = {
            _STREAM: stream,
            _STREAM_KIND: "cuda",
            _IS_CPU_OP: False,
            _DEVICE: _device_name(device),
        }
        known = streams[(device, stream)] = (("cuda", device, stream), first)
    key, first = known
    attrs = first.copy()
    if launch is not None:
        attrs[_LAUNCH_NS] = launch.start_ns
    return _Pending(
        event=e,
        node_type=_COMP,
        stream_key=key,
        attrs=attrs,
        launch_order=launch.start_ns if launch is not None else e.start_ns,
        parent=parent,
    )


def convert_rank(kt: KinetoTrace, host: HostTrace | None) -> RankConversion:
    """Convert one rank (rules in the module docstring)."""
    tops = top_level_ops(kt.cpu_ops)
    sites = _comm_sites(kt)
    src = _Sources(
        kt=kt,
        tops=_by_tid(tops),
        sites=_by_tid(sites),
        rpcs=_by_tid([e for e in kt.cpu_ops if e.name == "record_param_comms"]),
        ops=_by_tid([e for e in kt.cpu_ops if e.name.startswith(COMM_OP_PREFIXES)]),
        host_of_site=_pair_host(kt, sites, host) if host is not None else {},
    )
    cpu_nodes = {e.index: _cpu_node(e) for e in tops}
    pending = list(cpu_nodes.values())
    notes: list[str] = []
    if host is not None:
        joined = join_ops(host.ops, kt.cpu_ops)
        for idx, p in cpu_nodes.items():
            h = joined.get(idx)
            if h is not None:
                p.reads, p.writes = h.reads, h.writes
        notes.append(f"host trace joined to {len(joined)} of {len(kt.cpu_ops)} Kineto cpu ops")
    if kt.negative_durations:
        notes.append(f"{kt.negative_durations} event(s) with a negative dur, read as 0 long")
    used_sites: set[int] = set()
    counts: dict[str, int] = defaultdict(int)
    gpu = sorted(kt.gpu, key=attrgetter("start_ns", "index"))
    launches = kt.launches
    calls = [launches.get(e.corr) if e.corr is not None else None for e in gpu]
    streams: _GpuStreams = {}
    for e, call, parent, site in zip(
        gpu, calls, _enclosing_each(src.tops, calls), _enclosing_each(src.sites, calls), strict=True
    ):
        p = _gpu_node(e, call, parent, streams)
        pending.append(p)
        if e.cat != "kernel" or not names_nccl_kernel(e.name):
            continue
        anchor, cpu_side = src.cpu_side(site, call)
        if anchor is not None and anchor.index in used_sites:
            counts["further NCCL kernel(s) of an already converted op kept as GPU COMP"] += 1
            continue
        _note_group(src.groups, e.args, kt)
        if anchor is not None:
            used_sites.add(anchor.index)
            p.launch_order = anchor.start_ns
        if site is not None and site.index in src.host_of_site:
            p.reads = src.host_of_site[site.index].reads
        info = merge(info_from_args(e.args), *cpu_side, info_from_kernel_name(e.name))
        if not _attach(p, info, src):
            kind = kernel_kind(e.name) or e.name[:40]
            alone = (
                ""
                if anchor
                else f"{kind} kernel(s) launched outside any communication op"
                if call
                else f"{kind} kernel(s) whose launch call is not in the trace (issued before the profiling "
                "window, or not recorded)"
            )
            counts[_unknown_note("NCCL kernel(s)", "GPU COMP", info, alone)] += 1
    del gpu, calls  # not held while the nodes are encoded
    pending += _kernel_less_comms([x for x in sites if x.index not in used_sites], src, cpu_nodes, counts)
    pending += _gpu_edges(kt, src, pending, notes)
    _join_backward_passes(cpu_nodes, kt, notes)
    devices = sorted({e.device or 0 for e in kt.gpu})
    notes += [f"{n} {what}" for what, n in counts.items()]
    if len(devices) > 1:
        notes.append(f"GPU activities on devices {devices}: streams of different devices share numbers")
    _assign_seq(pending)
    body, steps = _finish(pending, kt, notes)
    return RankConversion(
        rank=kt.rank,
        body=body,
        node_count=len(pending),
        pg_names=frozenset(str(p.attrs[_PG_NAME]) for p in pending if _PG_NAME in p.attrs),
        steps=steps,
        groups=src.groups,
        device=f"cuda:{devices[0]}" if devices else "cpu",
        gpu=kt.gpu_models.get(devices[0], "") if devices else "",
        notes=notes,
        unsized=src.unsized,
        unnamed=src.unnamed,
    )


def _gpu_edges(kt: KinetoTrace, src: _Sources, pending: list[_Pending], notes: list[str]) -> list[_Pending]:
    """Launches, event waits and host synchronisations (:mod:`skewlens.profiler.gpu_deps`): the extra deps
    and which launches keep their edge; returns the host nodes made for blocking calls no host op encloses."""
    by_index = {p.event.index: p for p in pending}
    gpu = [p for p in pending if p.stream_key[0] == "cuda"]
    nodes = []
    for p in gpu:
        e, (_kind, device, stream), launch, parent = p.event, p.stream_key, p.attrs.get(_LAUNCH_NS), p.parent
        nodes.append(
            GpuNode(
                key=e.index,
                device=device,
                stream=stream,
                launch_ns=launch if type(launch) is int else e.start_ns,
                start_ns=e.start_ns,
                end_ns=e.start_ns + e.dur_ns,
                corr=e.corr,
                host=parent.index if parent is not None else None,
                name=e.name,
                thread=call.tid if e.corr is not None and (call := kt.launches.get(e.corr)) else None,
            )
        )
    read = {c: e for c, e in kt.launches.items() if e.name in CALLS_READ}
    calls = {
        c: Call(
            key=e.index,
            name=e.name,
            start_ns=e.start_ns,
            end_ns=e.start_ns + e.dur_ns,
            host=top.index if top is not None else None,
        )
        for (c, e), top in zip(read.items(), _enclosing_each(src.tops, list(read.values())), strict=True)
    }
    # a synchronisation no sync event names a device for is on the rank's device: the one most of its GPU
    # work ran on (a rank of an 8-GPU host runs on its own device, not on device 0)
    devices = Counter(n.device for n in nodes)
    device = min(devices, key=lambda d: (-devices[d], d)) if devices else 0
    found = gpu_dependencies(nodes, calls, [_sync_activity(e) for e in kt.syncs], default_device=device)
    call_event = {e.index: e for e in read.values()}
    extra = [_cpu_node(call_event[k]) for k in found.bare_calls]
    by_index.update((p.event.index, p) for p in extra)
    for key, deps in found.deps.items():
        p = by_index[key]
        p.extra_deps += [d for d in deps if d in by_index and d not in p.extra_deps]
        p.inferred += [d for d in found.inferred.get(key, ()) if d in by_index]
    for p in gpu:
        p.launch_dep = p.event.index in found.launch
        p.launched_in = p.event.index in found.launched_in
    notes += found.notes
    return extra


def _join_backward_passes(cpu_nodes: dict[int, _Pending], kt: KinetoTrace, notes: list[str]) -> None:
    """Each stretch of autograd's device thread that the main thread waited for
    (:func:`skewlens.profiler.autograd.backward_runs`) follows the main thread's node before it, and the
    main thread's next node follows it (:func:`skewlens.profiler.autograd.joins`). The main thread
    is the one of the ``ProfilerStep#`` annotations (else the one with most operators but the engine's)."""
    by_tid: dict[int, list[_Pending]] = defaultdict(list)
    for p in cpu_nodes.values():
        by_tid[p.event.tid].append(p)
    engine = {t for t, ps in by_tid.items() if any(is_engine_op(p.event.name) for p in ps)}
    steps = [a for a in kt.annotations if _STEP.match(a.name)]
    marks = Counter(a.tid for a in steps if a.tid in by_tid)
    others = {t: len(ps) for t, ps in by_tid.items() if t not in engine}
    main_tid = marks.most_common(1)[0][0] if marks else max(others, key=others.__getitem__, default=None)
    if main_tid is None or not engine - {main_tid}:
        return
    main = sorted(by_tid[main_tid], key=lambda p: p.event.start_ns)
    spans = [(p.event.start_ns, p.event.start_ns + p.event.dur_ns) for p in main]
    step_starts = [a.start_ns for a in steps]
    bounds = sorted([*(s for s, _e in spans), *step_starts])
    runs = joined = 0
    for tid in sorted(engine - {main_tid}):
        nodes = sorted(by_tid[tid], key=lambda p: p.event.start_ns)
        pairs = backward_runs([p.event.start_ns for p in nodes], bounds)
        stretches = [
            (nodes[i].event.start_ns, nodes[j].event.start_ns + nodes[j].event.dur_ns) for i, j in pairs
        ]
        for (i, j), (k, a) in zip(pairs, joins(stretches, spans, step_starts), strict=True):
            runs += 1
            if k >= 0:
                nodes[i].extra_deps.append(main[k].event.index)
            if a >= 0:
                main[a].extra_deps.append(nodes[j].event.index)
                joined += 1
    notes.append(joins_note(runs, joined))


def _sync_activity(e: KEvent) -> SyncActivity:
    """A ``cuda_sync`` event as the dependency rules read it (-1 for what it does not say)."""
    return SyncActivity(
        kind=e.name,
        corr=-1 if e.corr is None else e.corr,
        device=as_int(e.args.get("device")) or 0,
        stream=_or_unknown(as_int(e.args.get("stream"))),
        wait_on_stream=_or_unknown(as_int(e.args.get("wait_on_stream"))),
        record_corr=_or_unknown(as_int(e.args.get("wait_on_cuda_event_record_corr_id"))),
    )


def _or_unknown(v: int | None) -> int:
    return -1 if v is None else v


def _issuers(cpu_ops: Sequence[KEvent]) -> dict[CommType, deque[KEvent]]:
    """``c10d::<collective>`` ops by collective type, in issue order."""
    out: dict[CommType, deque[KEvent]] = defaultdict(deque)
    for e in sorted((e for e in cpu_ops if e.name.startswith("c10d::")), key=lambda e: (e.start_ns, e.index)):
        ct = collective_from_op(e.name)
        if ct is not None:
            out[ct].append(e)
    return out


def _kernel_less_comms(
    sites: Sequence[KEvent], src: _Sources, cpu_nodes: dict[int, _Pending], counts: dict[str, int]
) -> list[_Pending]:
    """Communication with no GPU kernel in the trace (gloo, or a kernel outside the window).

    An annotation inside a top-level CPU op of its thread makes that op the communication node. One on
    a thread of its own (gloo runs collectives on worker threads) becomes a CPU node itself, depending
    on the top-level op around the ``c10d::`` op that issued it (issuers and annotations of one
    collective type are paired first-in first-out, as the backend runs them).
    """
    issuers = _issuers(src.kt.cpu_ops)
    extra: list[_Pending] = []
    for site in sites:
        info = merge(*src.cpu_side(site, None)[1])
        iv = src.tops.get(site.tid)
        top = iv.enclosing(site.start_ns) if iv else None
        if top is not None:
            p = cpu_nodes[top.index]
            if p.node_type != NodeType.COMP:
                counts["communication annotation(s) sharing a CPU op with another dropped"] += 1
                continue
            p.launch_order = site.start_ns
        else:
            p = _cpu_node(site)
            queue = issuers.get(info.comm_type) if info.comm_type is not None else None
            if queue and queue[0].start_ns <= site.start_ns:
                issuer = queue.popleft()
                tv = src.tops.get(issuer.tid)
                p.parent = tv.enclosing(issuer.start_ns) if tv else None
                p.launch_order = issuer.start_ns
            extra.append(p)
        host = src.host_of_site.get(site.index)
        if host is not None:
            p.reads = (*p.reads, *host.reads)
        if not _attach(p, info, src):
            counts[_unknown_note("communication op(s)", "COMP", info)] += 1
    return extra


def _unnamed_subgroup(info: CommInfo, kt: KinetoTrace) -> bool:
    """Whether ``info`` is a collective on a group smaller than the world that the trace does not name
    (older torch gives ``Group size`` and no ``Process Group Name``): its group is unknown."""
    return not info.pg_named and bool(kt.world_size) and info.group_size not in (None, kt.world_size)


def _unknown_note(what: str, kept: str, info: CommInfo, alone: str = "") -> str:
    """Manifest note for communication left as compute, saying why (``alone``: a kernel without CPU side)."""
    head = f"{what} of unknown collective/peer kept as {kept}"
    if info.p2p:
        return f"{head}: {info.op} ({info.p2p}) without its peer rank in the trace (a host trace gives it)"
    if info.comm_type is not None and not info.pg_named and info.group_size is not None:
        return (
            f"{head}: {info.op} on a group of {info.group_size} ranks (Group size) that the trace does not "
            "name (Process Group Name; older torch writes none), so neither its group nor its peers are known"
        )
    if alone:
        return f"{head}: {alone}, and the kernel name does not say the op"
    return f"{head}: {info.op or '(unnamed)'} is neither a known collective nor a send/recv"


def _note_group(groups: dict[str, ProcessGroupInfo], args: dict[str, Any], kt: KinetoTrace) -> None:
    """File the group an op's args name (``Process Group Name`` / ``Ranks``) in ``groups``.

    torch lists at most 30 of a group's ranks there (``[r0, ..., r29, ...]``; newer ``[r0, ..., r28, ...,
    r_last]``): a larger group's ranks are then those that ``Global rank start`` / ``Global rank stride`` /
    ``Group size`` give (torch writes them where the ranks are evenly spaced), if they agree with the ranks
    listed; else, where ``distributedInfo.pg_config`` does not list the group either, the import stops
    naming the group (its ranks are unknown, and any guess would match the wrong ranks)."""
    name = args.get("Process Group Name")
    if not isinstance(name, str) or not name or name in groups:
        return
    text = args.get("Process Group Ranks")
    ranks = ranks_text(text)
    if ranks is None and (cut := cut_ranks_text(text)) is not None:
        ranks = _strided_ranks(args, *cut)
        if ranks is None and not any(g.name == name for g in kt.pg_config):
            size, listed = as_int(args.get("Group size")), len(cut[0]) + len(cut[1])
            raise TraceImportError(
                f"{kt.path}: rank {kt.rank}: process group {name!r} lists only {listed} of its "
                f"{size if size else 'more'} ranks (Process Group Ranks: {_cut_shown(*cut)}; torch writes at "
                "most 30), and neither distributedInfo.pg_config (torch >= 2.3 writes it) nor Global rank "
                "start / stride / Group size give the rest"
            )
    if ranks is not None:
        desc = args.get("Process Group Description")
        groups[name] = ProcessGroupInfo(name=name, ranks=ranks, desc=desc if isinstance(desc, str) else "")


def _cut_shown(head: tuple[int, ...], tail: tuple[int, ...]) -> str:
    """``0 to 58, then '...'``, ``0 to 56, then '...', then 62``: a rank list torch cut short, in a few words
    (its text, 30 ranks long, was cut at 80 characters mid-list)."""
    parts = [f"{head[0]} to {head[-1]}" if len(head) > 1 else str(head[0])] if head else []
    return ", then ".join([*parts, "'...'", *([", ".join(map(str, tail))] if tail else [])])


def _strided_ranks(
    args: dict[str, Any], head: tuple[int, ...], tail: tuple[int, ...]
) -> tuple[int, ...] | None:
    """``Group size`` ranks from ``Global rank start`` by ``Global rank stride``, where they begin with
    ``head`` and end with ``tail`` (the ranks a cut list shows); else None."""
    start, stride = as_int(args.get("Global rank start")), as_int(args.get("Global rank stride"))
    size = as_int(args.get("Group size"))
    if start is None or stride is None or size is None or start < 0 or stride < 1:
        return None
    if not 0 < size <= MAX_WORLD_SIZE or start + stride * (size - 1) >= MAX_WORLD_SIZE:
        return None
    ranks = tuple(range(start, start + stride * size, stride))
    if ranks[: len(head)] != head or (tail and ranks[-len(tail) :] != tail) or len(head) + len(tail) > size:
        return None
    return ranks


def _assign_seq(pending: list[_Pending]) -> None:
    colls = sorted((p for p in pending if p.comm is not None), key=lambda p: (p.launch_order, p.event.index))
    given = [p.comm.seq for p in colls if p.comm is not None]
    keys = [(p.comm.pg_name, s) for p, s in zip(colls, given, strict=True) if p.comm is not None]
    use_given = all(s is not None for s in given) and len(set(keys)) == len(keys)
    counters: dict[str, int] = defaultdict(int)
    for p in colls:
        assert p.comm is not None
        if use_given and p.comm.seq is not None:
            p.attrs[Attr.SEQ] = p.comm.seq
        else:
            p.attrs[Attr.SEQ] = counters[p.comm.pg_name]
            counters[p.comm.pg_name] += 1


def _before_first_step(
    order: list[_Pending], issued: Sequence[int], in_step: list[int], first_ann: int
) -> tuple[int | None, int]:
    """The end on the device of the GPU work issued before the first step's annotation (None: none), and how
    many nodes that work is; it is put in no step (``in_step`` -1, in place). ``order``: the nodes in start
    order, ``issued`` their issue times. Issued before it: launched before it, or, with no launch in the
    trace, begun before it or run on its stream before the stream's first node launched in the trace (a
    stream runs its work in launch order: that work was launched before the trace began). Such work is the
    previous step's: on the 16-GPU trace in ``../shared/traces`` 872 kernels, copies and memsets launched
    before the profiler started ran 155 ms into the first step's annotation, which read 371.6 ms where the
    others took 212-217."""
    first_launched: dict[tuple[Any, ...], int] = {}
    for k, p in enumerate(order):
        if p.stream_key[0] == "cuda" and type(p.attrs.get(_LAUNCH_NS)) is int:
            first_launched.setdefault(p.stream_key, k)
    end: int | None = None
    count = 0
    for k, p in enumerate(order):
        if p.stream_key[0] != "cuda":
            continue
        # issued (launched, or lacking a launch begun) before it, or run ahead of the stream's first launch
        before = issued[k] < first_ann
        if not before and type(p.attrs.get(_LAUNCH_NS)) is not int:
            before = k < first_launched.get(p.stream_key, -1)
        if before:
            in_step[k] = -1
            count += 1
            e = p.event.start_ns + p.event.dur_ns
            end = e if end is None else max(end, e)
    return end, count


def _finish(pending: list[_Pending], kt: KinetoTrace, notes: list[str]) -> tuple[bytes, list[StepSpan]]:
    """The nodes numbered in start order, their dependencies resolved, encoded; and the step spans. What the
    first step leaves out (the GPU work of the step before the profiler started) is said in ``notes``."""
    step_anns = sorted(
        ((int(m.group(1)), a) for a in kt.annotations if (m := _STEP.match(a.name))),
        key=lambda sa: sa[1].start_ns,
    )
    step_nums = [s for s, _a in step_anns]
    # in start order, CPU nodes first, then in trace order
    events = [p.event for p in pending]
    t = np.asarray([e.start_ns for e in events], dtype=np.int64)
    by = np.lexsort(
        (np.asarray([e.index for e in events]), np.asarray([e.cat != "cpu_op" for e in events]), t)
    )
    t = t[by]
    order = [pending[k] for k in by.tolist()]
    del events, by
    node_id = {p.event.index: k + 1 for k, p in enumerate(order)}
    durs = np.asarray([p.event.dur_ns for p in order], dtype=np.int64)
    # the step annotation each node is issued in, by time (index into step_anns; -1: none): its start, or
    # for GPU work its launch call's (a kernel launched late in step N may start in step N+1's annotation);
    # an annotation holds its end instant too (a node issued exactly as it ends, before the next begins)
    issued = np.asarray(
        [v if type(v := p.attrs.get(_LAUNCH_NS)) is int else p.event.start_ns for p in order], dtype=np.int64
    )
    i = np.searchsorted(np.asarray([a.start_ns for _s, a in step_anns], dtype=np.int64), issued, "right") - 1
    ends = np.asarray([a.end_ns for _s, a in step_anns] or [0], dtype=np.int64)
    in_step: list[int] = np.where((i >= 0) & (issued <= ends[np.maximum(i, 0)]), i, -1).tolist()
    first_ann = step_anns[0][1].start_ns if step_anns else None
    pre_end, pre_count = (
        (None, 0) if first_ann is None else _before_first_step(order, issued.tolist(), in_step, first_ann)
    )
    del i, ends, issued
    last_on: dict[tuple[Any, ...], int] = {}
    last_writer: dict[TensorKey, int] = {}
    step_of: dict[int, int | None] = {}
    step_end: dict[int, int] = {}
    encode = NodeEncoder().encode
    fields: list[tuple[bytes, bytes]] | None = None
    chunks: list[bytes] = []
    for nid, p in enumerate(order, start=1):
        e = p.event
        in_batch = (nid - 1) % _FIELDS_BATCH
        if in_batch == 0:  # the next batch's id and time fields, at once (a batch at a time: bounded memory)
            upto = nid - 1 + _FIELDS_BATCH
            ids = range(nid, nid + len(t[nid - 1 : upto]))
            fields = id_and_time_fields(ids, t[nid - 1 : upto], durs[nid - 1 : upto])
        deps: list[int] = []
        prev = last_on.get(p.stream_key)
        if prev is not None:
            deps.append(prev)
        for x in p.extra_deps:
            xid = node_id.get(x)
            if xid is not None and xid not in deps:
                deps.append(xid)
        parent = p.parent
        launched_in = None
        if parent is not None and (p.launch_dep or p.launched_in):
            pid = node_id.get(parent.index)
            if p.launch_dep and pid is not None and pid not in deps:
                deps.append(pid)
            elif not p.launch_dep:
                launched_in = pid
        last_on[p.stream_key] = nid
        data: list[int] = []
        if p.reads:
            data = sorted({w for k in p.reads if (w := last_writer.get(k)) is not None} - {nid, *deps})
        for k in p.writes:
            last_writer[k] = nid
        step = step_of.get(parent.index) if parent is not None else None
        if step is None and (si := in_step[nid - 1]) >= 0:
            step = step_nums[si]
        step_of[e.index] = step
        extra: list[tuple[str, AttrValue]] = []
        if launched_in is not None:
            extra.append((_LAUNCHED_IN, launched_in))
        if p.inferred:
            extra.append((_INFERRED_DEPS, [node_id[x] for x in p.inferred if x in node_id]))
        if step is not None:
            extra.append((_STEP_ATTR, step))
            end_ns = e.start_ns + e.dur_ns
            if end_ns > step_end.get(step, end_ns - 1):
                step_end[step] = end_ns
        chunks.append(
            encode(
                node_id=nid,
                name=e.name,
                node_type=p.node_type,
                start_ns=e.start_ns,
                dur_ns=e.dur_ns,
                ctrl_deps=deps,
                data_deps=data,
                attrs=p.attrs,
                extra=extra,
                fields=fields[in_batch] if fields is not None else None,
            )
        )
    # a step ends when its last node (on the device, for GPU work) ends, and the next one begins there:
    # where the CPU runs ahead of the GPU, the annotations overlap, the steps do not; a step left no time
    # of its own (all of it done by the time the previous step ended on the device) has no span; the first
    # step begins where the GPU work issued before it ended, where that is later than its annotation's start
    steps: list[StepSpan] = []
    prev_end: int | None = None
    for s, a in step_anns:
        end = max(a.end_ns, step_end.get(s, a.end_ns))
        start = max(a.start_ns, pre_end or a.start_ns) if prev_end is None else prev_end
        if end > start:
            steps.append(StepSpan(rank=kt.rank, step=s, start_ns=start, end_ns=end))
            prev_end = end
    if pre_count:
        notes.append(_before_first_note(pre_count, step_anns[0], pre_end, steps))
    return b"".join(chunks), steps


def _before_first_note(
    count: int, first: tuple[int, KEvent], pre_end: int | None, steps: list[StepSpan]
) -> str:
    """What the importer said of the GPU work issued before the first step (``count`` nodes, ending on the
    device at ``pre_end``): in no step, and where that left the first step (``first``: its number and
    annotation)."""
    step, ann = first
    said = (
        f"{count:,} GPU op(s) issued before the first step's annotation (the step before the profiler "
        "started) put in no step"
    )
    if not steps or steps[0].step != step:
        return f"{said}; step {step} was left no time of its own (its work done by the time they ended)"
    if pre_end is not None and pre_end > ann.start_ns:
        into = ms_text(pre_end - ann.start_ns)
        return f"{said}; step {step} begins where they ended, {into} ms into its annotation"
    return said
