"""Turn one rank's capture records into Chakra nodes: pure data in, :class:`TraceNode` list out.

Streams (the ``stream`` attribute, with ``skl_stream_kind``):

- host threads are numbered in order of first appearance, the thread that marks steps first: ``0, 1, ...``
  (kind ``thread``);
- work of asynchronous communication (DDP's bucket all_reduce, ``async_op=True``, isend/irecv) runs on
  one stream per process group, ``COMM_STREAM_BASE + k`` for the group's index ``k`` (kind ``comm``);
- CUDA kernels keep their CUDA stream number, offset by ``CUDA_STREAM_BASE`` (kind ``cuda``).

Timing contract: a COMM node starts when this rank entered the call and ends when the op completed on
this rank (the call returned for blocking calls; the work's completion for asynchronous ones; the end of
the matching NCCL kernel on GPUs). At the ``collectives`` level the time between communication calls on a
host thread becomes one COMP node named :data:`GAP_NAME` per gap; at ``ops``/``full`` the COMP nodes are
the outermost operators of Kineto (a CPU op that encloses a blocking collective is replaced by its
children, so no time is counted twice on a thread; at ``full`` a scope without an operator schema, such
as an autograd-engine or module-forward scope, is replaced by its children too; either way its own
time around them on the main thread becomes COMP nodes named after it: its work, as an operator's own
time is, less its time inside a collective call), and the main thread's time inside no operator and no
call becomes COMP nodes named :data:`UNTRACED_NAME`, so every nanosecond of a step on the main thread is
in exactly one node. At every level a wait for an asynchronous result (``wait_tensor``, ``Work.wait``)
is a COMP node of its own that counts as blocking here, with a control dependency on the COMM node it
waited for (:mod:`skewlens.profiler.capture.waits`).

Control dependencies keep program order per stream; an asynchronous COMM node depends on the node its
thread ran before issuing it, and the first node of that thread starting after its completion depends on
it. Data dependencies come from the host execution trace (``full``): a node (operator or collective, joined
through its ``c10d::`` operator's record-function id) depends on the last node that wrote a tensor it reads;
between threads only where it began after that node ended (else the id was reused: :func:`_data_deps`).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from skewlens.profiler.autograd import backward_runs, is_accumulation, is_engine_op, joins, joins_note
from skewlens.profiler.capture.records import (
    CALL_KINDS,
    END_UNKNOWN,
    GPU_KINDS,
    CommRecord,
    CudaSyncRecord,
    OpRecord,
    StepRecord,
    WaitRecord,
)
from skewlens.profiler.chakra_io import AttrValue, TraceNode, as_comm_node, pg_init_node
from skewlens.profiler.gpu_deps import Call, GpuNode, SyncActivity, gpu_dependencies
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.vocab import (
    COMM_NODE_TYPES,
    COMPUTE_GAP_NODE_NAME,
    GLOO_FINISH_LAG_NS,
    UNTRACED_NODE_NAME,
    Attr,
    CommType,
    NodeType,
    collective_from_op,
    names_nccl_kernel,
)

GAP_NAME = COMPUTE_GAP_NODE_NAME
UNTRACED_NAME = UNTRACED_NODE_NAME
COMM_STREAM_BASE = 1000
CUDA_STREAM_BASE = 2000
#: The record function each of the first steps leaves around a ``time.time_ns()`` reading (joins Kineto's
#: clock to the hooks').
STEP_MARK_NAME = "skewlens::step"
#: Shortest gap between communication calls that becomes a COMP node at the collectives level.
MIN_GAP_NS = 1_000
#: Kineto CPU events that are communication (their time is in the COMM nodes) or profiler bookkeeping.
COMM_OP_PREFIXES = (
    "c10d::",
    "_c10d_functional::",
    "gloo:",
    "nccl:",
    "record_param_comms",
    "ProfilerStep",
    "## ",
    "skewlens::",
)
#: Of those, the collective calls themselves (not the backends' events, which may outlive their call).
COMM_CALL_PREFIXES = ("c10d::", "_c10d_functional::")
#: Of those, the range a program's own torch.profiler opens at each ``prof.step()`` (whether or not it is
#: recording: the capture's session records it too). It is no work: the operators inside it are the step's.
PROFILER_STEP_PREFIX = "ProfilerStep"
#: Kineto's operator for a Python ``TorchDispatchMode``'s handler of one call (``CommDebugMode``,
#: ``FlopCounterMode``, a program's own mode); the calls that open and close a ``record_function``'s range
#: are dispatched through it too.
DISPATCH_MODE_OP = "PythonDispatchMode"
#: Untraced host time ending at most this long after an async collective completed was a wait for it.
WAIT_SLACK_NS = 1_000_000
#: A hooked call and Kineto's c10d operator further apart than this are not the same call.
MAX_KINETO_SKEW_NS = 2_000_000
#: Earlier than any timestamp (what :class:`Reach` answers before the first interval).
NEVER_NS = -(1 << 62)
#: Later than any timestamp.
ALWAYS_NS = 1 << 62
#: How much earlier than the flight recorder's issue time a gloo worker event may appear to start (the
#: recorder stamps an entry after the work is queued; a worker can start it first).
WORKER_SLACK_NS = 1_000_000
#: An end past the end of the collective's step by at most gloo's finish lag is that lag: the step consumed
#: the result, and the end is the step's.
FINISH_LAG_NS = GLOO_FINISH_LAG_NS


@dataclass(frozen=True, kw_only=True, slots=True)
class HostOpInfo:
    """What the full level knows of one host operator, keyed by its Kineto correlation id.

    It comes from torch.profiler's input and allocation records
    (:mod:`skewlens.profiler.capture.hostfacts`) or from PyTorch's ExecutionTraceObserver
    (:mod:`skewlens.profiler.capture.hostet`).
    """

    schema: str = ""
    """Operator schema string."""
    inputs: tuple[int, ...] = ()
    """Ids of the data (storages) it reads."""
    outputs: tuple[int, ...] = ()
    """Ids of the data (storages) it writes or creates."""
    shapes: str = ""
    """JSON of the input shapes."""
    types: str = ""
    """JSON of the input types."""


@dataclass(kw_only=True, slots=True)
class RankCapture:
    """Everything one rank recorded in the window, on its local clock."""

    rank: int
    """Global rank."""
    comms: Sequence[CommRecord]
    """Communication calls."""
    steps: Sequence[StepRecord]
    """Recorded steps (only calls and ops inside them are written)."""
    groups: Sequence[ProcessGroupInfo]
    """Process groups of the job."""
    main_thread: int
    """Native id of the thread that marks steps (stream 0)."""
    offset_ns: int = 0
    """Added to every local time to get the aligned clock."""
    ops: Sequence[OpRecord] = ()
    """Kineto operators and kernels (ops/full levels); empty at the collectives level."""
    worker_events: Sequence[OpRecord] = ()
    """Collectives level: gloo's ``gloo:*`` worker-thread events, on the hooks' clock already (they end
    the collectives the flight recorder gave); the ops level has them among ``ops``."""
    worker_events_from_ns: int = 0
    """Collectives level: when the worker-event recorder started. It starts after the program's first
    step where the window has no wait (the process joins its job after torch is imported): a collective
    issued before it has no event of its own, and takes none of a later one's."""
    mark_times_ns: Sequence[int] = ()
    """Ops/full levels: the ``time.time_ns()`` read inside each step marker among ``ops`` (the
    ``skewlens::step`` record functions, in order); with the hooked calls they put Kineto on the hooks'
    clock."""
    mark_thread: int = 0
    """Ops/full levels: native id of the thread that left those markers (0: unknown, ``main_thread``)."""
    host_ops: Mapping[int, HostOpInfo] = field(default_factory=dict)
    """Full level: what is known of each host operator, by its Kineto correlation id."""
    group_threads: Mapping[int, str] = field(default_factory=dict)
    """Native thread id -> the process group whose creation started it (gloo's worker threads)."""
    device: str = "cpu"
    """Device of the rank."""
    waits: Sequence[WaitRecord] = ()
    """Waits for asynchronous communication results (:mod:`skewlens.profiler.capture.waits`)."""
    syncs: Sequence[CudaSyncRecord] = ()
    """Ops/full levels on CUDA: the synchronisation activities (with ``enable_cuda_sync_events``); with
    the runtime calls and GPU activities among ``ops`` they give the GPU dependencies
    (:mod:`skewlens.profiler.gpu_deps`)."""


@dataclass(slots=True)
class _Proto:
    """A node before ids and dependencies are assigned."""

    name: str
    node_type: NodeType
    start_ns: int
    end_ns: int
    stream: int
    attrs: dict[str, AttrValue]
    issue_stream: int = -1  # async comm: the thread stream that issued it
    issue_end_ns: int = 0
    rf_id: int = -1
    key: int = -1  # Kineto correlation id of the operator: keys RankCapture.host_ops
    inputs_shapes: str = ""
    inputs_types: str = ""
    end_known: bool = True  # False: an async op whose backend reported no completion (END_UNKNOWN)
    kernel: OpRecord | None = None  # its GPU side: a GPU node's activity, a comm node's NCCL kernel
    host_waits: bool = True  # an async comm whose completion its issuing thread waits for at some point


MAIN_STREAM = 0
"""Stream number of the thread that runs the training loop (and marks the steps)."""


class _Streams:
    """Stream numbers of host threads, keyed by native thread id or ``("kineto", id)``."""

    def __init__(self, main_thread: int) -> None:
        self.threads: dict[Hashable, int] = {main_thread: MAIN_STREAM}

    def thread(self, tid: Hashable) -> int:
        s = self.threads.get(tid)
        if s is None:
            s = self.threads[tid] = len(self.threads)
        return s


def kineto_thread_alias(
    comms: Sequence[CommRecord], ops: Sequence[OpRecord], main_thread: int, mark_thread: int = 0
) -> dict[int, int]:
    """Kineto's thread ids (small sequential numbers) -> native thread ids of the hooks' records.

    The ``c10d::*`` operator of a hooked call's name that Kineto saw start inside its ``[start, return]``
    ran on the calling thread; each Kineto thread goes to the native thread most of its calls name (one
    to one). Only of its name: another thread's operator can start inside a call, as DDP's all_reduce on
    the main thread does while a checkpoint thread (``dcp.async_save``) broadcasts, and that thread may
    not be profiled at all (Kineto records the threads that existed when it started). Nor is the Kineto
    thread of the step marks (:data:`STEP_MARK_NAME`) another thread than the one that left them
    (``mark_thread``; unknown, the main thread): DDP's
    ``c10d::allreduce_`` on the main thread starts inside a metrics thread's blocking all_reduce of its
    own group, of the same name (before, that took the main thread's operators to the metrics thread's
    stream, and the metrics thread's collectives into the main thread's timeline). Where no call
    identifies the main thread, the Kineto thread of the step marks is it, and without marks the one with
    most operators.
    """
    c10d: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for o in ops:
        if o.is_cpu and o.name.startswith("c10d::"):
            c10d[o.name].append((o.start_ns, o.thread))
    for v in c10d.values():
        v.sort()
    votes: Counter[tuple[int, int]] = Counter()
    for c in comms:
        cands = c10d.get(c.op, [])
        k = bisect.bisect_left(cands, (c.start_ns, -1))
        if k < len(cands) and cands[k][0] <= c.issue_end_ns:
            votes[(cands[k][1], c.thread)] += 1
    marking = {o.thread for o in ops if o.is_cpu and o.name == STEP_MARK_NAME}
    alias: dict[int, int] = {}
    for (kineto, native), _ in sorted(votes.items(), key=lambda kv: -kv[1]):
        if kineto in marking and native != (mark_thread or main_thread):
            continue  # the main thread's operator inside another thread's call
        if kineto not in alias and native not in alias.values():
            alias[kineto] = native
    if main_thread not in alias.values():
        # the thread that marks the steps is the main thread; failing marks, the one with most operators
        # (on a GPU the backward pass runs on autograd's device thread, which can have more)
        marks: Counter[int] = Counter()
        counts: Counter[int] = Counter()
        for o in ops:
            if o.is_cpu and o.thread not in alias:
                counts[o.thread] += 1
                if o.name == STEP_MARK_NAME:
                    marks[o.thread] += 1
        if marks or counts:
            alias[(marks or counts).most_common(1)[0][0]] = main_thread
    return alias


def kineto_clock_offset(
    comms: Sequence[CommRecord], ops: Sequence[OpRecord], mark_times_ns: Sequence[int] = ()
) -> int:
    """Offset to add to Kineto's timestamps to put them on the hooks' clock (``time.time_ns``).

    Kineto converts its own clock to the Unix epoch once; against ``time.time_ns()`` it can be off by
    tens of microseconds, enough to make an operator appear to start before the blocking collective it
    follows has returned. Every hooked call ``[start, return]`` encloses the ``c10d::*`` operator Kineto
    recorded for it, so the true offset lies in ``[start - k.start, return - k.end]`` for each matched
    pair; likewise each step marker (a :data:`STEP_MARK_NAME` operator, around the ``time.time_ns()``
    reading ``mark_times_ns[i]``; ignored unless their counts agree), which covers programs whose
    collectives all come from C++ (DDP alone). The answer is the middle of the intersection of those
    ranges, or where noise or a wrong match leaves it empty, of the stretch most of them cover
    (:func:`_bounded_offset`). 0 when nothing matches.
    """
    by_name: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for o in ops:
        if o.is_cpu and o.name.startswith("c10d::"):
            by_name[o.name].append((o.start_ns, o.start_ns + o.dur_ns))
    for v in by_name.values():
        v.sort()
    lo: list[int] = []
    hi: list[int] = []
    for c in comms:
        cands = by_name.get(c.op)
        if not cands:
            continue
        k = bisect.bisect_left(cands, (c.start_ns, -1))
        near = [cands[j] for j in (k - 1, k) if 0 <= j < len(cands)]
        ks, ke = min(near, key=lambda iv: abs(iv[0] - c.start_ns))
        if abs(ks - c.start_ns) > MAX_KINETO_SKEW_NS:
            continue
        lo.append(c.start_ns - ks)
        hi.append(c.issue_end_ns - ke)
    marks = sorted((o.start_ns, o.start_ns + o.dur_ns) for o in ops if o.is_cpu and o.name == STEP_MARK_NAME)
    if marks and len(marks) == len(mark_times_ns):
        mark_lo, mark_hi = _marker_bounds(mark_times_ns, marks)
        lo += mark_lo
        hi += mark_hi
    return _bounded_offset(lo, hi)


def marker_clock_offset(times_ns: Sequence[int], spans: Sequence[tuple[int, int]]) -> int:
    """Offset to add to Kineto's timestamps to put them on ``time.time_ns``'s clock, from markers.

    Marker ``i`` is a Kineto event ``spans[i] = (start, end)`` inside which ``time.time_ns()`` read
    ``times_ns[i]``, so the offset lies in ``[time - end, time - start]``: the middle of the intersection
    over all markers (where noise leaves it empty, of the stretch most of them cover). 0 without markers.
    """
    return _bounded_offset(*_marker_bounds(times_ns, spans))


def _marker_bounds(times_ns: Sequence[int], spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Per marker, the lowest and highest offset it allows: ``time - end`` and ``time - start``."""
    pairs = list(zip(times_ns, spans, strict=False))
    return [t - e for t, (_, e) in pairs], [t - s for t, (s, _) in pairs]


def _bounded_offset(lo: Sequence[int], hi: Sequence[int]) -> int:
    """The middle of the stretch that the most ranges ``[lo[i], hi[i]]`` cover (their intersection when
    they all meet); where several stretches tie, the median of their middles. A range from a wrong match
    (a hooked call paired with an earlier ``c10d::`` operator, its own missing) leaves the others' common
    stretch as it was. Before, it emptied the intersection and the answer was the median of all the
    ranges' middles, which a blocking call's wide range (Kineto's operator ends at the issue, the hook's
    call at the return) drags far off: 2.04 ms on a rank of a 100-all_reduce-per-step capture whose
    ranges but one met within 12 µs, and the operators then fell inside the collectives and were lost."""
    if not lo:
        return 0
    a, b = max(lo), min(hi)
    if a <= b:
        return (a + b) // 2
    # sweep the ends in order, a range's start before another's end at the same value (closed ranges)
    edges = sorted([(x, 0) for x in lo] + [(y, 1) for y in hi])
    best = depth = start = 0
    stretches: list[tuple[int, int]] = []
    for x, is_end in edges:
        if not is_end:
            depth += 1
            if depth > best:
                best, stretches = depth, []
            if depth == best:
                start = x
        else:
            if depth == best:
                stretches.append((start, x))
            depth -= 1
    mids = sorted((x + y) // 2 for x, y in stretches)
    return mids[len(mids) // 2]


def _gloo_worker_ends(cap: RankCapture) -> Callable[[CommRecord], int]:
    """End of a flight-recorder collective (op ``gloo:*``, or :attr:`CommRecord.ran_as` so; no end of its
    own) from gloo's worker event.

    gloo runs each group's collectives in issue order on worker threads of that group, and records
    ``gloo:<op>`` there (Kineto at the ops level; at the collectives level the worker-event recorder,
    :class:`skewlens.profiler.capture.kineto.WorkerEvents`). A collective takes, once, the first event of
    its name that starts at or after its issue (less :data:`WORKER_SLACK_NS`) on a thread of its own
    group. A hooked collective that was not quiet (:attr:`CommRecord.quiet`), blocking or asynchronous,
    takes its own event the same way, in issue order with the others, and gives it to no one: the event
    ends in gloo's ``Work::finish()``, after the Work's future fired (the hooks' end), so it may lie
    outside the call's ``[start, end]`` (the ``async_op`` all_reduce DDP's forward issues under ``Join``:
    10-40 µs outside; before, the bucket all_reduce issued after it took that event and ended early, and
    each later bucket of the step the one before). A blocking call's ``[start, end]`` hides only the events
    of other kinds than its own (what it ran inside, such as an object collective's), and those that began
    before its own event did only from the collectives issued after it began (gloo ran them first: work
    issued before the call, such as DDP's bucket all_reduce still running as the backward's all_to_all is
    issued; before, that bucket took a later bucket's event, 253 ms on a 2-rank DLRM whose real all_reduce
    took 7 ms, and the last bucket of the window had no end): a recorder-only
    collective of its kind may run during it on the group's other thread (a DDP bucket all_reduce in
    flight while SyncBatchNorm's backward all_reduces: before, every event inside the blocking call was
    its, so the bucket took a later bucket's event, its two members' ends up to 27 ms apart on 2 gloo
    ranks, and the last buckets of the window had no end). A quiet blocking call made no event and hides
    none. A
    group's threads are those its creation started (``RankCapture.group_threads``: all of them; native
    ids, so not at the ops level, where Kineto numbers the threads); for a group created before the hooks,
    or at the ops level, those its blocking hooked collectives waited on (:func:`_worker_groups`) and any
    thread not known to serve another group.
    """
    every = sorted(
        (o.start_ns, o.start_ns + o.dur_ns, o.name, o.thread)
        for o in itertools.chain(cap.ops, cap.worker_events)
        if o.is_cpu and o.name.startswith("gloo:")
    )
    every_starts = [ev[0] for ev in every]

    def own_start(a: int, b: int, kinds: set[CommType | None]) -> int:
        """Start of the first event of its own kind that a blocking call ``[a, b]`` holds (NEVER_NS: none)."""
        k = bisect.bisect_left(every_starts, a)
        while k < len(every) and every[k][0] <= b:
            if collective_from_op(every[k][2]) in kinds:
                return every[k][0]
            k += 1
        return NEVER_NS

    calls = sorted(
        (c.start_ns, c.end_ns, kinds, own_start(c.start_ns, c.end_ns, kinds))
        for c in cap.comms
        if not _ran_as(c).startswith("gloo:") and not c.is_async and not c.quiet
        for kinds in [_event_kinds(c)]
    )
    call_starts = [a for a, *_ in calls]
    longest = max((b - a for a, b, *_ in calls), default=0)
    hides: dict[CommType | None, Reach] = {}

    def visible_before(s: int, e: int, name: str) -> int:
        """Issue time before which a collective may take the event ``[s, e]`` of op ``name``: never where a
        blocking hooked call of another kind holds it (what the call ran), unless it began before that
        call's own event did: work issued before the call (gloo runs a group's work in issue order), which
        a collective issued before the call may take (DDP's bucket all_reduce still running when the
        backward's all_to_all is issued; before, the bucket took a later step's event)."""
        kind = collective_from_op(name)
        if kind not in hides:
            hides[kind] = Reach((a, b) for a, b, kinds, _ in calls if kind not in kinds)
        limit = ALWAYS_NS
        if hides[kind](s) < e:
            return limit
        j = bisect.bisect_right(call_starts, s) - 1
        while j >= 0 and call_starts[j] >= s - longest:
            a, b, kinds, own = calls[j]
            if kind not in kinds and b >= e:
                limit = min(limit, a if s < own else NEVER_NS)
            j -= 1
        return limit

    # native thread ids: the collectives level's recorder; Kineto (ops level) numbers threads its own way
    created = {} if any(o.is_cpu and o.name.startswith("gloo:") for o in cap.ops) else cap.group_threads
    group_of = {**_worker_groups(cap.comms, every), **created}
    exact = set(created.values())  # groups whose every thread is known
    # name -> (s, e, visible_before, owner, thread)
    owned: dict[str, list[tuple[int, int, int, str, str]]] = defaultdict(list)
    for s, e, name, thread in every:
        if (vis := visible_before(s, e, name)) > NEVER_NS:
            owned[name].append((s, e, vis, group_of.get(thread, ""), str(thread)))
    lists: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    taken: dict[str, set[tuple[int, int]]] = defaultdict(set)  # name -> events claimed

    def candidates(name: str, group: str) -> tuple[list[tuple[int, int, int]], set[tuple[int, int]]]:
        key = (name, group)
        if key not in lists:
            mine = {group} if group in exact else {group, ""}
            lists[key] = [(s, e, vis) for s, e, vis, owner, _ in owned.get(name, []) if owner in mine]
        return lists[key], taken[name]

    def first_free(name: str, c: CommRecord) -> tuple[int, int] | None:
        cands, used = candidates(name, c.pg_name)
        k = bisect.bisect_left(cands, (c.start_ns - WORKER_SLACK_NS, -1))
        while k < len(cands) and (cands[k][:2] in used or c.start_ns >= cands[k][2]):
            k += 1
        return cands[k][:2] if k < len(cands) else None

    def end_of(c: CommRecord) -> int:
        """Called in issue order (the order gloo runs a group's collectives in)."""
        if c.start_ns < cap.worker_events_from_ns:
            return 0
        if (ran := _ran_as(c)).startswith("gloo:"):
            ev = first_free(ran, c)
            if ev is None:
                return 0
            taken[ran].add(ev)
            return ev[1]
        if c.quiet or c.node_type != NodeType.COMM_COLL or c.comm_type is None:
            return 0
        want = _event_kinds(c)
        found = [(ev, n) for n in owned if collective_from_op(n) in want and (ev := first_free(n, c))]
        if found:  # its own event (the earliest free one), which started before the call completed
            ev, name = min(found)
            if c.end_ns < 0 or ev[0] <= c.end_ns:
                taken[name].add(ev)
        return 0

    return end_of


def _ran_as(c: CommRecord) -> str:
    """The backend's name for what ``c`` ran as: a collective only the flight recorder saw is named so in
    gloo's worker events (``gloo:all_reduce`` for a functional reduce_scatter too)."""
    return c.ran_as or c.op


def _event_kinds(c: CommRecord) -> set[CommType | None]:
    """The collective kinds a hooked call's gloo worker event may name: its own, and an all_reduce for a
    reduce_scatter (gloo may run one as an all_reduce)."""
    return {c.comm_type, CommType.ALL_REDUCE if c.comm_type == CommType.REDUCE_SCATTER else c.comm_type}


def _worker_groups(
    comms: Sequence[CommRecord], events: Sequence[tuple[int, int, str, int]]
) -> dict[int, str]:
    """gloo worker thread -> the process group it works for, learnt from the blocking hooked collectives.

    Each process group runs its collectives on threads of its own. A blocking call on group ``g`` waits
    while its ``gloo:*`` event (``events``: ``(start, end, name, thread)`` by start) runs inside it: that
    thread votes for ``g`` (gloo runs a reduce_scatter as an all_reduce). Threads never seen are not
    listed.
    """
    starts = [ev[0] for ev in events]
    votes: Counter[tuple[int, str]] = Counter()
    for c in comms:
        if c.is_async or c.node_type != NodeType.COMM_COLL or _ran_as(c).startswith("gloo:"):
            continue
        want = _event_kinds(c)
        k = bisect.bisect_left(starts, c.start_ns)
        while k < len(events) and events[k][0] <= c.end_ns:
            _, e, name, thread = events[k]
            if e <= c.end_ns and collective_from_op(name) in want:
                votes[(thread, c.pg_name)] += 1
            k += 1
    best: dict[int, tuple[int, str]] = {}
    for (thread, pg), n in sorted(votes.items()):
        if thread not in best or n > best[thread][0]:
            best[thread] = (n, pg)
    return {thread: pg for thread, (_, pg) in best.items()}


class Reach:
    """The latest end among intervals starting at or before a time.

    ``t`` lies inside one of the intervals iff ``reach(t) >= t``; a span ``[s, e]`` lies inside one iff
    ``reach(s) >= e``.
    """

    def __init__(self, intervals: Iterable[tuple[int, int]]) -> None:
        ordered = sorted(intervals)
        self._starts = [a for a, _ in ordered]
        self._reach = list(itertools.accumulate((b for _, b in ordered), max))

    def __call__(self, t: int) -> int:
        i = bisect.bisect_right(self._starts, t) - 1
        return self._reach[i] if i >= 0 else NEVER_NS


def step_of(t: int, starts: list[int], steps: Sequence[StepRecord]) -> int:
    """The step whose ``[start, end]`` holds ``t`` (``steps`` by start, ``starts`` their starts), or -1."""
    i = bisect.bisect_right(starts, t) - 1
    if i >= 0 and t <= steps[i].end_ns:
        return steps[i].step
    return -1


def _boundary_inside(bounds: list[int], start_ns: int, end_ns: int) -> int | None:
    """The first step boundary strictly inside ``(start_ns, end_ns)`` (``bounds`` sorted), or None."""
    k = bisect.bisect_right(bounds, start_ns)
    return bounds[k] if k < len(bounds) and bounds[k] < end_ns else None


def _holds_flight(flights: list[tuple[int, int]], start_ns: int, end_ns: int) -> bool:
    """Whether one of ``flights`` (an issuing thread's asynchronous collectives as ``(issue, end)``, sorted)
    was issued at or after ``start_ns`` and completed by ``end_ns``: a span of the thread that may hold
    its wait for it."""
    k = bisect.bisect_left(flights, (start_ns, -1))
    while k < len(flights) and flights[k][0] < end_ns:
        if flights[k][1] <= end_ns:
            return True
        k += 1
    return False


def _within_step(end_ns: int, step_end_ns: int) -> int:
    """A worker event's end, less gloo's finish lag (:data:`FINISH_LAG_NS`) where that lag carries it
    past the end of the step; an end further past is the program's: the collective ran on."""
    return step_end_ns if step_end_ns < end_ns <= step_end_ns + FINISH_LAG_NS else end_ns


def comm_on_host(device: str, backend: str) -> bool:
    """Whether a collective or p2p op of a group whose backend config is ``backend`` (``gloo``, ``nccl``,
    ``cpu:gloo,cuda:nccl``; ``""`` unknown) ran on a host thread of a rank whose device is ``device``: on
    a CPU rank always; on a GPU rank where the group's backend for that device type is gloo (or MPI),
    which stages CUDA tensors through host memory and moves them on its worker threads (its GPU side is
    the staging copies). NCCL, or a backend not known, on a GPU: on the device, as NCCL runs it."""
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        return True
    default = ""
    for part in backend.split(","):
        dev, sep, name = part.strip().partition(":")
        if not sep:
            default = dev
        elif dev == kind:
            return name in _HOST_BACKENDS
    return default in _HOST_BACKENDS


#: Backends that move a GPU's tensors on host threads.
_HOST_BACKENDS = frozenset({"gloo", "mpi"})


def _comm_protos(cap: RankCapture, streams: _Streams, pg_index: dict[str, int]) -> list[_Proto]:
    kernels = sorted(
        (o for o in cap.ops if not o.is_cpu and names_nccl_kernel(o.name)), key=lambda o: o.start_ns
    )
    ki = 0
    out = []
    steps = {s.step: s.end_ns for s in cap.steps}
    backends = {g.name: g.backend for g in cap.groups}
    # the c10d operator Kineto saw inside each call: its ids join the host facts (full level)
    c10d = sorted((o.start_ns, o.rf_id, o.corr) for o in cap.ops if o.is_cpu and o.name.startswith("c10d::"))
    c10d_starts = [t for t, _, _ in c10d]
    worker_end = _gloo_worker_ends(cap)
    for c in sorted(cap.comms, key=lambda c: c.start_ns):
        if c.step not in steps:
            continue
        k = bisect.bisect_left(c10d_starts, c.start_ns)
        inside = k < len(c10d) and c10d[k][0] <= c.issue_end_ns
        rf_id, key = (c10d[k][1], c10d[k][2]) if inside else (-1, -1)
        end = max(c.end_ns, c.issue_end_ns, _within_step(worker_end(c), steps[c.step]))
        # on GPUs the op completes when its NCCL kernel ends: take the next kernel that starts after the call
        while ki < len(kernels) and kernels[ki].start_ns < c.start_ns:
            ki += 1
        kernel = None
        if ki < len(kernels):
            kernel = kernels[ki]
            end = max(end, kernel.start_ns + kernel.dur_ns)
            ki += 1
        thread_stream = streams.thread(c.thread)
        attrs: dict[str, AttrValue] = {
            Attr.COMM_SIZE: c.size_bytes,
            Attr.PG_NAME: c.pg_name,
            Attr.HOST_OP: comm_on_host(cap.device, backends.get(c.pg_name, "")),
            Attr.STEP: c.step,
            Attr.DTYPE: c.dtype,
            Attr.NUMEL: c.numel,
            Attr.OP: c.op,
        }
        if c.node_type == NodeType.COMM_COLL:
            attrs[Attr.COMM_TYPE] = int(c.comm_type) if c.comm_type is not None else -1
            attrs[Attr.SEQ] = c.seq
            if c.src >= 0:  # a rooted collective's root (broadcast, scatter send from it)
                attrs[Attr.COMM_SRC] = c.src
            if c.dst >= 0:  # (reduce, gather to it)
                attrs[Attr.COMM_DST] = c.dst
            if c.reduce_op:
                attrs[Attr.REDUCE_OP] = c.reduce_op
            if c.send_bytes >= 0:  # an all_to_all's uneven splits
                attrs[Attr.SEND_BYTES] = c.send_bytes
                attrs[Attr.RECV_BYTES] = c.recv_bytes
                attrs[Attr.SEND_SPLITS] = list(c.send_splits)
                attrs[Attr.RECV_SPLITS] = list(c.recv_splits)
        else:
            attrs[Attr.COMM_SRC] = c.src
            attrs[Attr.COMM_DST] = c.dst
            attrs[Attr.COMM_TAG] = c.tag
            if c.batch >= 0:
                attrs[Attr.BATCH] = c.batch
        if rf_id >= 0:
            attrs[Attr.RF_ID] = rf_id
        # on a GPU a "blocking" call returns once its kernel is enqueued and its thread goes on: the
        # node runs on the group's comm stream like an asynchronous one, and no host node waits for it
        on_device = kernel is not None and not c.is_async
        if c.is_async or on_device:
            stream = COMM_STREAM_BASE + pg_index.setdefault(c.pg_name, len(pg_index))
            attrs[Attr.STREAM_KIND] = "comm"
        else:
            stream = thread_stream
            attrs[Attr.STREAM_KIND] = "thread"
        out.append(
            _Proto(
                name=c.op,
                node_type=c.node_type,
                start_ns=c.start_ns,
                end_ns=end,
                stream=stream,
                attrs=as_comm_node(attrs),
                issue_stream=thread_stream if c.is_async or on_device else -1,
                issue_end_ns=c.issue_end_ns,
                rf_id=rf_id,
                key=key,
                end_known=c.end_ns != END_UNKNOWN or end > c.issue_end_ns,
                kernel=kernel,
                host_waits=not on_device,
            )
        )
    return out


def _split_by_scopes(
    lo: int, hi: int, scopes: Sequence[tuple[int, int, str]], name: str
) -> list[tuple[int, int, str]]:
    """``[lo, hi)`` cut at the edges of ``scopes`` (disjoint, sorted): the pieces inside one take its name,
    the others ``name``."""
    out: list[tuple[int, int, str]] = []
    k = max(bisect.bisect_right(scopes, (lo,)) - 1, 0)
    cur = lo
    while k < len(scopes) and scopes[k][0] < hi:
        a, b, nm = scopes[k]
        k += 1
        if b <= cur:
            continue
        if a > cur:
            out.append((cur, a, name))
            cur = a
        top = min(b, hi)
        out.append((cur, top, nm))
        cur = top
    if cur < hi:
        out.append((cur, hi, name))
    return out


def _hidden_flights(nodes: Iterable[_Proto], waited: Set[int]) -> dict[int, list[tuple[int, int]]]:
    """Each host thread's asynchronous collectives whose wait is no node of the trace (DDP's reducer waits
    for its buckets in C++; ``waited``: ``id`` of those a wait node waits for), as ``(issue, end)``,
    sorted."""
    flights: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p in nodes:
        if p.issue_stream >= 0 and id(p) not in waited and p.host_waits:
            flights[p.issue_stream].append((p.start_ns, p.end_ns))
    for f in flights.values():
        f.sort()
    return flights


def _gap_protos(
    cap: RankCapture,
    nodes: list[_Proto],
    name: str,
    *,
    main_only: bool = False,
    waited: Set[int] = frozenset(),
    scopes: Sequence[tuple[int, int, str]] = (),
    blocked: Sequence[tuple[int, int]] = (),
) -> list[_Proto]:
    """COMP nodes named ``name`` for the time no node covers on a thread, within each step (``waited``:
    ``id`` of the async comms whose wait is a node of its own, not to be guessed from untraced time).

    ``scopes``: main-thread scopes that were replaced by their operators (:func:`_op_protos`), as
    ``(start, end, name)``: the part of a gap inside one is that scope's own work (the autograd engine,
    a module's Python, a compiled graph's generated kernels, a ``record_function`` around a checkpoint's
    save and its collectives), a COMP node named after it, not untraced
    time, as the scope itself is at the ``ops`` level. ``blocked``: spans the main thread waited in, for
    work of another thread (a backward pass on autograd's device thread): no node, as for a blocking
    call, so that the replay keeps it a wait on that work."""
    busy: dict[int, list[tuple[int, int]]] = defaultdict(list)
    busy[MAIN_STREAM].extend(blocked)
    for p in nodes:
        if p.issue_stream >= 0:
            busy[p.issue_stream].append((p.start_ns, p.issue_end_ns))
        elif p.attrs.get(Attr.STREAM_KIND) == "thread":
            busy[p.stream].append((p.start_ns, p.end_ns))
    if main_only:
        busy = {0: busy.get(0, [])}
    # Ops/full levels: untraced time that ends just after an async collective issued from this thread
    # completed is the thread blocked in wait() (DDP's end of backward): no node for the blocked part,
    # so replay keeps it a wait on the collective (build_nodes adds that dependency), not a fixed duration.
    # The first gap after such a collective's issue, begun while it was in flight, stays untraced inside a
    # scope too: the execution model reads the untraced node right after the issue as that wait where
    # gloo's worker recorded the end after the thread went on (RankModel.end_clamp_rows); named after the
    # scope it would be compute of fixed length.
    flights = _hidden_flights(nodes, waited) if main_only else {}
    done = {stream: sorted(b for _a, b in f) for stream, f in flights.items()}
    issues = {stream: [a for a, _b in f] for stream, f in flights.items()}
    # each thread's intervals sorted once, a step's found by bisection, and the latest end of those begun
    # before each: scanning every interval for every step made a 2,000-step ops-level window's save (in
    # the training loop's last step) take 28.4 s of CPU, 10.1 s without
    ordered = {stream: sorted(intervals) for stream, intervals in busy.items()}
    begins = {stream: [a for a, _b in iv] for stream, iv in ordered.items()}
    latest_end = {k: list(itertools.accumulate((b for _a, b in iv), max)) for k, iv in ordered.items()}
    out = []
    for s in cap.steps:
        for stream, intervals in ordered.items():
            at = begins[stream]
            before = bisect.bisect_left(at, s.start_ns)
            inside = intervals[before : bisect.bisect_right(at, s.end_ns)]
            if stream == 0:
                # the step boundary is taken inside the optimizer's step (its post hook): start the
                # filler after whatever was still running on the thread then
                reach = latest_end[stream][before - 1] if before else s.start_ns
                first = max(reach, s.start_ns)
                edges = [(first, first), *inside, (s.end_ns, s.end_ns)]
            elif inside:
                edges = inside
            else:
                continue
            cursor = edges[0][1]
            last = NEVER_NS  # where the last gap began
            ends = done.get(stream, [])
            flown, iss = flights.get(stream, []), issues.get(stream, [])
            for a, b in edges[1:]:
                k = bisect.bisect_right(ends, a) - 1
                if k >= 0 and cursor < ends[k] and a - ends[k] <= WAIT_SLACK_NS:
                    cursor = ends[k]
                if a - cursor >= MIN_GAP_NS:
                    # not while a collective issued since the last gap began is still running (only the
                    # main thread's gaps are named)
                    since = flown[bisect.bisect_right(iss, last) : bisect.bisect_right(iss, cursor)]
                    named = scopes if stream == 0 and all(e <= cursor for _s, e in since) else ()
                    last = cursor
                    for lo, hi, nm in _split_by_scopes(cursor, a, named, name):
                        out.append(
                            _Proto(
                                name=nm,
                                node_type=NodeType.COMP,
                                start_ns=lo,
                                end_ns=hi,
                                stream=stream,
                                attrs={Attr.IS_CPU_OP: True, Attr.STEP: s.step, Attr.STREAM_KIND: "thread"},
                            )
                        )
                cursor = max(cursor, b)
    return out


def _outlives(o: OpRecord, parent: OpRecord) -> bool:
    """Whether ``o`` ends after ``parent`` does."""
    return o.start_ns + o.dur_ns > parent.start_ns + parent.dur_ns


def _op_protos(
    cap: RankCapture,
    streams: _Streams,
    comms: list[_Proto],
    alias: Mapping[int, int],
    waited: Set[int] = frozenset(),
) -> tuple[list[_Proto], list[tuple[int, int, str]]]:
    """Ops/full levels: outermost Kineto operators (split around blocking collectives and hidden waits,
    :func:`_holds_flight`) and GPU kernels (``alias``: Kineto's thread ids -> native ones,
    :func:`kineto_thread_alias`; ``waited``: as for :func:`_hidden_flights`); and the main thread's
    scopes replaced by their operators (because they enclosed a blocking call or a hidden wait, or for want
    of a schema at the full level), each ending at the first step mark inside it (what follows the mark is
    the capture's own), as disjoint ``(start, end, name)`` pieces, sorted, named after the innermost scope
    (:func:`_innermost`) and less the collective calls inside them (:func:`_without_calls`)."""
    starts = [s.start_ns for s in cap.steps]
    bounds = sorted({t for s in cap.steps for t in (s.start_ns, s.end_ns)})
    blocking: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p in comms:
        if p.issue_stream < 0:
            blocking[p.stream].append((p.start_ns, p.end_ns))
    flights = _hidden_flights(comms, waited)
    by_thread: dict[int, list[OpRecord]] = defaultdict(list)
    out: list[_Proto] = []
    scopes: list[tuple[int, int, str]] = []
    calls: list[tuple[int, int]] = []  # the main thread's collective calls inside replaced operators
    for o in cap.ops:
        if o.is_cpu:
            by_thread[o.thread].append(o)
        elif not names_nccl_kernel(o.name) and (not o.kind or o.kind in GPU_KINDS):
            step = step_of(o.start_ns, starts, cap.steps)
            if step < 0:
                continue
            out.append(
                _Proto(
                    name=o.name,
                    node_type=NodeType.COMP,
                    start_ns=o.start_ns,
                    end_ns=o.start_ns + o.dur_ns,
                    stream=CUDA_STREAM_BASE + o.thread,
                    attrs={
                        Attr.IS_CPU_OP: False,
                        Attr.STEP: step,
                        Attr.STREAM_KIND: "cuda",
                        Attr.DEVICE: o.device,
                    },
                    kernel=o,
                )
            )
    for tid, ops in by_thread.items():
        native = alias.get(tid)
        stream = streams.thread(native if native is not None else ("kineto", tid))
        ops.sort(key=lambda o: (o.start_ns, -o.dur_ns))
        comm_iv = sorted(blocking.get(stream, []))
        # nest: children[i] = ops directly inside op i; roots = outermost ops. A communication event
        # that outlives the call it started in (gloo's ``gloo:send`` of an isend, ended only when the
        # program's wait on it returned) contains nothing: what the thread ran meanwhile is its own work
        children: dict[int, list[int]] = defaultdict(list)
        roots: list[int] = []
        stack: list[int] = []
        for i, o in enumerate(ops):
            while stack and ops[stack[-1]].start_ns + ops[stack[-1]].dur_ns <= o.start_ns:
                stack.pop()
            # a Python dispatch mode's handler wraps the call that opens a record_function's range: the
            # range begins inside it and runs on past it, and is not its work; the handler ends where the
            # range begins (before, the range and all inside it were the handler's children, left out, and
            # with any TorchDispatchMode active every FSDP2 scope and Optimizer.step was untraced time)
            while stack and ops[stack[-1]].name == DISPATCH_MODE_OP and _outlives(o, ops[stack[-1]]):
                crossed = stack.pop()
                ops[crossed] = replace(ops[crossed], dur_ns=o.start_ns - ops[crossed].start_ns)
            (children[stack[-1]] if stack else roots).append(i)
            outlives = bool(stack) and o.start_ns + o.dur_ns > ops[stack[-1]].start_ns + ops[stack[-1]].dur_ns
            if not (outlives and o.name.startswith(COMM_OP_PREFIXES)):
                stack.append(i)
        flown = flights.get(stream, [])
        todo = list(reversed(roots))
        while todo:
            i = todo.pop()
            o = ops[i]
            end = o.start_ns + o.dur_ns
            if o.name.startswith(PROFILER_STEP_PREFIX):
                todo.extend(reversed(children[i]))
                continue
            if o.name.startswith(COMM_OP_PREFIXES):
                if stream == MAIN_STREAM and o.name.startswith(COMM_CALL_PREFIXES):
                    calls.append((o.start_ns, end))
                continue
            j = bisect.bisect_right(comm_iv, (o.start_ns, end)) - 1
            if j >= 0 and comm_iv[j][0] <= o.start_ns and end <= comm_iv[j][1]:
                continue  # ran inside a blocking call (gloo's reduce_scatter copy-out): part of the comm
            k = bisect.bisect_left(comm_iv, (o.start_ns, -1))
            # a blocking call inside, or, in an operator with operators of its own, an asynchronous one
            # issued and completed inside that no wait node waited for (a hidden wait: DDP's reducer
            # finishes a backward run from inside CheckpointFunctionBackward under reentrant activation
            # checkpointing, or inside Optimizer.step under optimizer.step(closure)): the operator and
            # those around it give way to their operators, so that the wait is no operator's work
            # (:func:`_gap_protos` cuts it out). Wherever the completion lies in it: gloo's worker may
            # record its end up to GLOO_FINISH_LAG_NS after the thread went on, into the operator after
            # the wait (in 2 of 5 2-rank captures of an optimizer.step(closure), a rule asking for the
            # completion outside the operator's operators left Optimizer.step whole). A bucket issued
            # before the operator began (its transfer overlapping backward), or an operator without
            # operators of its own (a matmul the completion landed in), holds no wait. Nor does a gradient's
            # accumulation (AccumulateGrad's evaluation, whose post-hooks issue DDP's buckets): the reducer
            # waits at the end of a backward pass, after its last node, and a bucket done before the
            # evaluation returned (a fast all_reduce while a comm hook's Python ran on) was no wait (before,
            # 2 in 30 captures of a comm hook on 2 gloo ranks split one such evaluation around its bucket)
            encloses_comm = k < len(comm_iv) and comm_iv[k][0] < end
            encloses_comm = encloses_comm or (
                bool(children[i]) and not is_accumulation(o.name) and _holds_flight(flown, o.start_ns, end)
            )
            # a runtime call's correlation id is CUPTI's, not an operator's
            info = cap.host_ops.get(o.corr) if o.corr >= 0 and not o.kind else None
            # full level: a scope without an operator schema (autograd engine, module forward) is not
            # replayable; its operators are
            scope_only = bool(cap.host_ops) and (info is None or not info.schema) and bool(children[i])
            if encloses_comm or scope_only:
                if stream == MAIN_STREAM:
                    b = _boundary_inside(bounds, o.start_ns, end)
                    scopes.append((o.start_ns, end if b is None else b, o.name))
                todo.extend(reversed(children[i]))
                continue
            if stream == MAIN_STREAM and (b := _boundary_inside(bounds, o.start_ns, end)) is not None:
                # the step was marked from inside this op (the optimizer's post-hook): what follows the
                # mark is the capture's own step work unless operators of the op ran after it. The
                # capture's own step marker is no such operator: it closes just before the mark is read,
                # and Kineto's clock, joined to the hooks' only within tens of µs, often puts its end past
                # the mark (the op was then replaced by its operators: its name lost)
                if any(
                    ops[c].start_ns + ops[c].dur_ns > b and ops[c].name != STEP_MARK_NAME for c in children[i]
                ):
                    # replaced by its operators, as a scope around a blocking call is: its own time up to
                    # the mark is its work (a record_function("train") around the optimizer's step), not
                    # untraced time
                    scopes.append((o.start_ns, b, o.name))
                    todo.extend(reversed(children[i]))
                    continue
                end = b
            step = step_of(o.start_ns, starts, cap.steps)
            if step < 0:
                continue
            attrs: dict[str, AttrValue] = {Attr.IS_CPU_OP: True, Attr.STEP: step, Attr.STREAM_KIND: "thread"}
            if o.rf_id >= 0:
                attrs[Attr.RF_ID] = o.rf_id
            if info is not None and info.schema:
                attrs[Attr.OP_SCHEMA] = info.schema
            out.append(
                _Proto(
                    name=o.name,
                    node_type=NodeType.COMP,
                    start_ns=o.start_ns,
                    end_ns=end,
                    stream=stream,
                    attrs=attrs,
                    rf_id=o.rf_id,
                    key=o.corr,
                    inputs_shapes=info.shapes if info else "",
                    inputs_types=info.types if info else "",
                )
            )
    return out, _without_calls(_innermost(scopes), sorted(calls))


def _innermost(scopes: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Nested ``scopes`` (``(start, end, name)``, a thread's record functions) as disjoint pieces, sorted,
    each named after the innermost scope it lies in: a program's ``record_function("metrics")`` around an
    all_reduce, inside its ``record_function("step")``, names its own time around the call, the step's
    time outside it the step's. (Before, every piece took the outermost scope's name.) A scope that
    outlives the one it began in is cut at its end."""
    out: list[tuple[int, int, str]] = []
    stack: list[tuple[int, str]] = []  # (end, name) of the scopes open at ``cur``, innermost last
    cur = 0

    def close_until(t: int) -> None:
        nonlocal cur
        while stack and stack[-1][0] <= t:
            end, name = stack.pop()
            if cur < end:
                out.append((cur, end, name))
                cur = end
        if stack and cur < t:
            out.append((cur, t, stack[-1][1]))
        cur = max(cur, t)

    for a, b, name in sorted(scopes, key=lambda sc: (sc[0], -sc[1])):
        close_until(a)
        stack.append((min(b, stack[-1][0]) if stack else b, name))
    close_until(stack[0][0] if stack else 0)
    return out


def _without_calls(
    scopes: list[tuple[int, int, str]], calls: list[tuple[int, int]]
) -> list[tuple[int, int, str]]:
    """``scopes`` (disjoint, sorted) less the collective calls inside them (sorted): the thread's time in
    such a call (a functional all_reduce on gloo holds it until the peers arrive) is the collective's, no
    work of the scope; it stays untraced, as it is outside any scope."""
    out: list[tuple[int, int, str]] = []
    for a, b, name in scopes:
        cur = a
        # from the call before the scope, by index: a slice copied the rest of the calls for every scope,
        # 1.9 s for 40,000 scopes and calls (a 2,000-step window with 20 collectives a step), 0.06 s now
        for k in range(max(bisect.bisect_right(calls, (a,)) - 1, 0), len(calls)):
            lo, hi = calls[k]
            if lo >= b:
                break
            if hi > cur and lo > cur:
                out.append((cur, lo, name))
            cur = max(cur, hi)
        if cur < b:
            out.append((cur, b, name))
    return out


_Run = tuple[_Proto, _Proto]
"""A stretch of an autograd engine thread's work: its first and last node."""


def _backward_passes(
    ops: Sequence[_Proto], main: Sequence[_Proto], steps: Sequence[StepRecord]
) -> list[_Run]:
    """The stretches of autograd's device threads that the main thread waited for
    (:func:`skewlens.profiler.autograd.backward_runs`; ``ops`` and ``main``, communication and waits, on
    the main thread, where an asynchronous call counts at its issue): each one's first and last node."""
    starts = sorted(
        [
            *(p.start_ns for p in [*ops, *main] if MAIN_STREAM in (p.stream, p.issue_stream)),
            *(s.start_ns for s in steps),
        ]
    )
    threads: dict[int, list[_Proto]] = defaultdict(list)
    for p in ops:
        if p.stream != MAIN_STREAM and p.attrs.get(Attr.STREAM_KIND) == "thread":
            threads[p.stream].append(p)
    out: list[_Run] = []
    for nodes in threads.values():
        if any(is_engine_op(p.name) for p in nodes):
            nodes.sort(key=lambda p: p.start_ns)
            out += [(nodes[i], nodes[j]) for i, j in backward_runs([p.start_ns for p in nodes], starts)]
    return out


def _join_backward_passes(
    runs: Sequence[_Run],
    protos: Sequence[_Proto],
    ids: Mapping[int, int],
    ctrl: dict[int, list[int]],
    *,
    steps: Sequence[StepRecord],
    notes: list[str] | None,
) -> None:
    """Each stretch of :func:`_backward_passes` follows the main thread's node before it and the main
    thread's next node follows it (:func:`skewlens.profiler.autograd.joins`)."""
    main = sorted((ids[id(p)], p.start_ns, p.end_ns) for p in protos if p.stream == MAIN_STREAM)
    joined = 0
    stretches = [(first.start_ns, last.end_ns) for first, last in runs]
    for (first, last), (k, a) in zip(
        runs, joins(stretches, [(s, e) for _, s, e in main], [s.start_ns for s in steps]), strict=True
    ):
        if k >= 0 and main[k][0] not in ctrl[ids[id(first)]]:
            ctrl[ids[id(first)]].append(main[k][0])
        if a >= 0:
            if ids[id(last)] not in ctrl[main[a][0]]:
                ctrl[main[a][0]].append(ids[id(last)])
            joined += 1
    if notes is not None:
        notes.append(joins_note(len(runs), joined))


def compiled_reduce_scatters(
    comms: Sequence[CommRecord], ops: Sequence[OpRecord], alias: Mapping[int, int]
) -> list[CommRecord]:
    """``comms`` with each gloo all_reduce that a compiled graph issued for a functional reduce_scatter as
    the reduce_scatter it is (:func:`skewlens.profiler.capture.flight.as_issued`).

    A compiled graph calls ``torch.ops._c10d_functional.reduce_scatter_tensor`` itself, past the hooks'
    ``reduce_scatter_single``, so only Kineto's operator of that name (``ops``, on the hooks' clock;
    ``alias``: :func:`kineto_thread_alias`) tells that the recorder's ``gloo:all_reduce`` its thread
    created inside it was one; recorder collectives are on the main thread (:func:`flight.merge`). Before,
    on 2 gloo ranks, the backward of a compiled ``all_gather_tensor`` was an ALL_REDUCE of 2,048 B, which
    ``replay comm_mode=model`` charges twice a reduce_scatter's time.
    """
    from skewlens.profiler.capture.flight import FUNCTIONAL_REDUCE_SCATTER_OP, as_issued

    spans = [
        (alias[o.thread], o.start_ns, o.start_ns + o.dur_ns)
        for o in ops
        if o.is_cpu and o.name == FUNCTIONAL_REDUCE_SCATTER_OP and o.thread in alias
    ]
    return as_issued(comms, spans, thread_of=lambda c: c.thread) if spans else list(comms)


def build_nodes(
    cap: RankCapture,
    notes: list[str] | None = None,
    *,
    data_notes: list[str] | None = None,
    unended: list[int] | None = None,
) -> list[TraceNode]:
    """All nodes of one rank's trace: the process-group METADATA node, then COMP and COMM nodes by start.

    ``notes``: where given, receives what the GPU dependencies came to (counts of the edges drawn and
    of those the trace could not give), for the manifest; ``data_notes`` likewise what the data
    dependencies left out (:func:`reused_ids_note`); ``unended`` how many asynchronous sends and recvs
    nothing in the window gave an end (their Work has no future, and no wait on it returned in the window:
    the program waited for them after it, or never), each a node without an end.
    """
    streams = _Streams(cap.main_thread)
    pg_index = {g.name: i for i, g in enumerate(cap.groups)}
    if cap.ops:  # on the hooks' clock before anything joins them (worker ends, c10d ids, nesting)
        off = kineto_clock_offset(cap.comms, cap.ops, cap.mark_times_ns)
        if off:
            cap = replace(cap, ops=[replace(o, start_ns=o.start_ns + off) for o in cap.ops])
    alias = kineto_thread_alias(cap.comms, cap.ops, cap.main_thread, cap.mark_thread) if cap.ops else {}
    if cap.ops:
        cap = replace(cap, comms=compiled_reduce_scatters(cap.comms, cap.ops, alias))
    comms = _comm_protos(cap, streams, pg_index)
    # waits for async results: COMP nodes that block their thread like a blocking call (they split the
    # operators around them and cut the gaps), each depending on the COMM node it waited for
    from skewlens.profiler.capture.waits import wait_protos  # (it builds on this module)

    waits, waited = wait_protos(cap, streams, comms, alias)
    waited_for = {id(w) for w in waited.values()}
    by_id = {id(w): w for w in waits}
    for wid, target in waited.items():
        if not target.end_known:  # gloo's send/recv: it completed when the wait on it returned
            target.end_ns = max(target.end_ns, by_id[wid].end_ns)
            target.end_known = True
    p2p_unended = 0
    for p in comms:
        if not p.end_known and p.kernel is None:
            # communication whose end nothing showed (a collective still running when the window ended,
            # CommHooks.flush; a Work without a future, gloo's reduce_scatter and send/recv, never waited on
            # in the window): a node of duration 0 at its issue end, which the no-end check reports (its
            # issue time a gap). Moved only now: a Work.wait finds its call by the call's start
            # (waits.wait_protos) and ends it where it returned. Before, a send or recv kept its issue time,
            # as if done when its call returned: a recv then seemed done before its peer's send began
            p.start_ns = p.end_ns
            p2p_unended += p.node_type != NodeType.COMM_COLL
    if unended is not None and p2p_unended:
        unended.append(p2p_unended)
    bursts: list[_Run] = []
    if cap.ops:
        ops, scopes = _op_protos(cap, streams, comms + waits, alias, waited_for)
        bursts = _backward_passes(ops, comms + waits, cap.steps)
        gaps = _gap_protos(
            cap,
            comms + waits + ops,
            UNTRACED_NAME,
            main_only=True,
            waited=waited_for,
            scopes=scopes,
            blocked=[(first.start_ns, last.end_ns) for first, last in bursts],
        )
        comp = waits + ops + gaps
    else:
        comp = waits + _gap_protos(cap, comms + waits, GAP_NAME)
    # at equal starts an asynchronous call comes first: it was issued before the thread went on (the
    # flight recorder's collectives arrive exactly where the thread's next stretch of host time begins)
    protos = sorted([*comms, *comp], key=lambda p: (p.start_ns, p.issue_stream < 0, p.stream, p.end_ns))
    for p in protos:
        p.attrs[Attr.STREAM] = p.stream
    ids = {id(p): k + 1 for k, p in enumerate(protos)}
    last_on: dict[int, int] = {}
    done_on: dict[int, list[tuple[int, int]]] = defaultdict(list)  # stream -> (end, id) in start order
    ctrl: dict[int, list[int]] = defaultdict(list)
    pending_async: dict[int, list[_Proto]] = defaultdict(list)  # issuing thread stream -> async comms
    for p in protos:
        nid = ids[id(p)]
        if p.stream in last_on:
            ctrl[nid].append(last_on[p.stream])
        if (w := waited.get(id(p))) is not None:
            ctrl[nid].append(ids[id(w)])
        if p.issue_stream >= 0:
            # issued from inside a running operator (DDP's hook in the autograd engine): its arrival
            # follows the last node the issuing thread had finished, not the enclosing operator
            prev = _last_finished(done_on[p.issue_stream], p.start_ns)
            if prev is not None and prev not in ctrl[nid]:
                ctrl[nid].append(prev)
            # else its wait node is where the thread consumed it, or (a call on a GPU) its thread never waits,
            # or nothing in the window saw it complete (no end: waited for after the window, or never), so no
            # node of the window waited for it (before, the next one did: a double-buffered exchange's last
            # irecv held the optimizer step after it until the peer's isend, 24.5 ms in an unmodified replay)
            if id(p) not in waited_for and p.host_waits and p.end_known:
                pending_async[p.issue_stream].append(p)
        else:
            still = []
            for a in pending_async.get(p.stream, []):
                if a.end_ns <= p.start_ns:
                    ctrl[nid].append(ids[id(a)])
                else:
                    still.append(a)
            if p.stream in pending_async:
                pending_async[p.stream] = still
        last_on[p.stream] = nid
        done_on[p.stream].append((p.end_ns, nid))
    if bursts:
        _join_backward_passes(bursts, protos, ids, ctrl, steps=cap.steps, notes=notes)
    if any(p.kernel is not None for p in protos):
        _gpu_dependencies(cap, protos, ids, streams=streams, alias=alias, ctrl=ctrl, notes=notes)
    data, reused = _data_deps(protos, ids, cap.host_ops)
    if data_notes is not None and reused:
        data_notes.append(reused_ids_note(reused))
    off = cap.offset_ns
    nodes = [pg_init_node(cap.groups)]
    for p in protos:
        nid = ids[id(p)]
        if p.issue_stream >= 0:  # an asynchronous comm node: when its call returned
            p.attrs[Attr.RETURN_NS] = p.issue_end_ns + off
        nodes.append(
            TraceNode(
                node_id=nid,
                name=p.name,
                node_type=p.node_type,
                start_ns=p.start_ns + off,
                dur_ns=max(p.end_ns - p.start_ns, 0),
                ctrl_deps=tuple(ctrl.get(nid, ())),
                data_deps=tuple(data.get(nid, ())),
                attrs=p.attrs,
                inputs_shapes=p.inputs_shapes,
                inputs_types=p.inputs_types,
            )
        )
    return nodes


def _issuer(p: _Proto) -> int:
    """The host stream (thread) that issued a comm node: its own stream where it ran on the thread."""
    return p.issue_stream if p.issue_stream >= 0 else p.stream


def _known(stream: int) -> int | None:
    """A host stream id, None for an unknown one (-1)."""
    return None if stream < 0 else stream


def _device_index(device: str) -> int:
    """``cuda:3`` -> 3 (0 where the name has no index)."""
    tail = device.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


class _Hosts:
    """Host nodes (id, start, end) per thread stream, by start: which one contains a time."""

    def __init__(self, spans: Iterable[tuple[int, int, int, int]]) -> None:
        by: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for stream, start, end, nid in spans:
            by[stream].append((start, end, nid))
        self._by = {s: sorted(v) for s, v in by.items()}
        self._starts = {s: [start for start, _e, _n in v] for s, v in self._by.items()}

    def containing(self, stream: int, t: int) -> int | None:
        v = self._by.get(stream)
        if not v:
            return None
        k = bisect.bisect_right(self._starts[stream], t) - 1  # a thread's host nodes do not overlap
        return v[k][2] if k >= 0 and t <= v[k][1] else None


_STAGING_LAUNCHES = (
    "launch edges from collectives run on the host (gloo's staging copies; of the launch edges)"
)


class _Collectives:
    """Host-side collectives (stream, start, end, id): the one a time on a thread falls in."""

    def __init__(self, spans: Iterable[tuple[int, int, int, int]]) -> None:
        self._spans = sorted((start, end, stream, nid) for stream, start, end, nid in spans)
        self._starts = [s for s, _e, _st, _n in self._spans]
        # the latest end of the spans up to each: none before a span whose reach is below t contains t
        self._reach = list(itertools.accumulate((e for _s, e, _st, _n in self._spans), max))

    def containing(self, stream: int, t: int) -> int | None:
        """The collective issued on thread ``stream`` that contains ``t`` (the latest issued, where several
        do), else the only collective of any thread that contains it (a worker thread's launch); None
        where there is no such one, or several and none issued on ``stream``."""
        around: list[tuple[int, int]] = []  # (thread, id) of those containing t, the latest issued first
        i = bisect.bisect_right(self._starts, t) - 1
        while i >= 0 and self._reach[i] >= t:
            _s, e, st, n = self._spans[i]
            if e >= t:
                if st == stream:
                    return n
                around.append((st, n))
            i -= 1
        return around[0][1] if len(around) == 1 else None


def _gpu_dependencies(
    cap: RankCapture,
    protos: Sequence[_Proto],
    ids: Mapping[int, int],
    *,
    streams: _Streams,
    alias: Mapping[int, int],
    ctrl: dict[int, list[int]],
    notes: list[str] | None,
) -> None:
    """Launch, event-wait and synchronisation edges (:mod:`skewlens.profiler.gpu_deps`) into ``ctrl``,
    ``skl_launch_ns`` on the GPU nodes and ``skl_inferred_deps`` where edges were inferred."""

    def thread_stream(tid: int) -> int:
        native = alias.get(tid)
        return streams.threads.get(native if native is not None else ("kineto", tid), -1)

    hosts = _Hosts(
        (p.stream, p.start_ns, p.end_ns, ids[id(p)])
        for p in protos
        if p.node_type == NodeType.COMP and p.attrs.get(Attr.STREAM_KIND) == "thread"
    )
    # collectives that ran on the host (gloo on CUDA tensors): the staging copies they launch, on the
    # calling thread or on the group's worker thread, are launched by the collective
    on_host = [
        (p.issue_stream if p.issue_stream >= 0 else p.stream, p.start_ns, p.end_ns, ids[id(p)])
        for p in protos
        if p.node_type in COMM_NODE_TYPES and p.attrs.get(Attr.HOST_OP) is True
    ]
    in_comm = _Collectives(on_host)

    def launcher(stream: int, t: int) -> int | None:
        host = hosts.containing(stream, t)
        return in_comm.containing(stream, t) if host is None else host

    calls = {
        o.corr: Call(
            key=-o.corr,  # apart from node ids: a call is no node here
            name=o.name,
            start_ns=o.start_ns,
            end_ns=o.start_ns + o.dur_ns,
            host=launcher(thread_stream(o.thread), o.start_ns),
        )
        for o in cap.ops
        if o.kind in CALL_KINDS and o.corr > 0
    }
    call_thread = {o.corr: thread_stream(o.thread) for o in cap.ops if o.kind in CALL_KINDS and o.corr > 0}
    by_id = {ids[id(p)]: p for p in protos}
    counts: Counter[str] = Counter()
    gpu = []
    for p in protos:
        if (k := p.kernel) is None:
            continue
        nid, comm = ids[id(p)], p.node_type in COMM_NODE_TYPES
        call = calls.get(k.corr) if k.corr > 0 else None
        if call is not None and not comm:
            p.attrs[Attr.LAUNCH_NS] = call.start_ns + cap.offset_ns
        elif call is None and not comm:
            counts["GPU nodes whose launch call is not in the trace"] += 1
        gpu.append(
            GpuNode(
                key=nid,
                device=_device_index(k.device),
                stream=k.thread,
                launch_ns=k.start_ns if call is None else call.start_ns,
                start_ns=k.start_ns,
                end_ns=k.start_ns + k.dur_ns,
                corr=k.corr if k.corr > 0 else None,
                host=None if call is None else call.host,
                comm=comm,
                issue_ns=p.start_ns if comm else None,
                name=k.name,
                thread=_known(_issuer(p) if comm else call_thread.get(k.corr, -1)),
            )
        )
    syncs = [
        SyncActivity(
            kind=s.kind,
            corr=s.corr,
            device=s.device,
            stream=s.stream,
            wait_on_stream=s.wait_on_stream,
            record_corr=s.record_corr,
        )
        for s in cap.syncs
    ]
    collectives = {n for *_, n in on_host}
    found = gpu_dependencies(
        gpu, calls, syncs, default_device=_device_index(cap.device), collectives=collectives
    )
    for g in gpu:
        host = found.launch.get(g.key)
        if host is not None:
            if host not in ctrl[g.key]:
                ctrl[g.key].append(host)
            counts["launch edges"] += 1
            if host in collectives:
                counts[_STAGING_LAUNCHES] += 1
        elif (inside := found.launched_in.get(g.key)) is not None:
            by_id[g.key].attrs[Attr.LAUNCHED_IN] = inside
            counts["launches their host node then synchronises on (skl_launched_in, no dependency)"] += 1
        elif not g.comm and g.corr is not None and g.corr in calls:
            counts["GPU nodes launched inside no host node (no launch edge)"] += 1
    counts["host synchronisations inside no host node (not written)"] += len(found.bare_calls)
    bare = set(found.bare_calls)
    for nid, deps in found.deps.items():
        if nid not in bare:
            ctrl[nid].extend(d for d in deps if d not in ctrl[nid])
    for nid, deps in found.inferred.items():
        if nid not in bare and deps:
            by_id[nid].attrs[Attr.INFERRED_DEPS] = list(deps)
    if notes is not None:
        notes += found.notes
        launch_counts = "; ".join(f"{n} {what}" for what, n in sorted(counts.items()) if n)
        if launch_counts:
            notes.append(launch_counts)
        if calls and not cap.syncs:
            notes.append(
                "no CUDA synchronisation activities in the profile (a torch without "
                "enable_cuda_sync_events): event waits and host synchronisations inferred from timing"
            )


def _last_finished(history: list[tuple[int, int]], t: int, *, scan: int = 64) -> int | None:
    """Id of the latest-started node in ``history`` (``(end, id)`` in start order) that ended by ``t``."""
    for end, nid in reversed(history[-scan:]):
        if end <= t:
            return nid
    return history[-1][1] if history else None


def _data_deps(
    protos: list[_Proto], ids: dict[int, int], host_ops: Mapping[int, HostOpInfo]
) -> tuple[dict[int, list[int]], int]:
    """Per node id, the nodes that last wrote what it reads, and how many such pairs were dropped as a reused
    id: a reader on another thread than its writer (the issuing thread, for asynchronous communication)
    that started before the writer ended. A tensor one thread wrote and another reads was written
    first; an id that another thread's node still held when the reader began names another tensor (the
    allocator reuses ids, and a side thread's own allocations are not among the operators recorded), and
    taken for a dependency it would make a side thread's collective wait for another's, or the main
    thread for a side thread."""
    if not host_ops:
        return {}, 0
    writer: dict[int, _Proto] = {}
    deps: dict[int, list[int]] = {}
    reused = 0
    for p in protos:  # start order: the last writer before an op started produced what it reads
        info = host_ops.get(p.key) if p.key >= 0 else None
        if info is None:
            continue
        nid = ids[id(p)]
        found: set[int] = set()
        stale: set[int] = set()
        for t in info.inputs:
            w = writer.get(t)
            if w is None or w is p:
                continue
            (stale if _issuer(w) != _issuer(p) and p.start_ns < w.end_ns else found).add(ids[id(w)])
        reused += len(stale - found)
        if found:
            deps[nid] = sorted(found)
        for t in info.outputs:
            writer[t] = p
    return deps, reused


def reused_ids_note(dropped: int) -> str:
    """The manifest note of :func:`_data_deps`'s dropped pairs."""
    return (
        f"{dropped} data dependenc{'y' if dropped == 1 else 'ies'} between threads not drawn: the reader "
        "started before the writer ended, so the tensor id was reused, not the tensor"
    )
