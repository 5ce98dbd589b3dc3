"""The execution model of a run: for every node, what it waits for. Derived once from the trace store.

The simulator (``skewlens.replay.lower`` -> ``skewlens.replay.core``), the analyses (``skewlens.analysis``)
and the real-replay plan (``skewlens.replay.real.plan``) all read this model; none of them derives timing
rules of its own. Everything here is measured on the recorded run, so replaying the model unmodified
reproduces the recorded times.

**Timelines.** A node's *timeline* is its stream; in a run whose host streams are not threads (an imported
profile, a synthetic one: not a capture), host streams that never run concurrently are merged into one
thread (tracers may give one thread several stream ids: :func:`_timelines`). A stream that holds only
communication nodes is a *communication stream* (the work of asynchronous collectives and p2p ops of one
process group, or NCCL kernels); it is never merged.

**Start edges** ``d -> i`` (``i`` starts ``gap_i`` after the latest of them ends):

- recorded ctrl/data dependencies, and the predecessor on ``i``'s timeline (the earlier-starting node with
  the latest end), unless ``i`` is nested inside it (then ``i`` is *nested*: its times follow its
  enclosing node, ``parent``, scaled with its work: :func:`nested_times`) or ``d`` was still running when
  ``i`` started (see below);
- *inferred waits*: a host node that starts at most ``WAIT_SLACK_NS`` after a communication node on another
  timeline completed, on a thread that had been idle ``WAIT_RATIO`` times longer before that, waited for it.

An edge whose source was still running when ``i`` started (by more than ``SKEW_NS`` of clock skew between
trace sources) does not constrain ``i``'s start: if ``i`` is communication, it becomes a *queue* edge (the
transfer waits for ``d``; an async collective queued behind the previous one on its stream); otherwise it
is dropped (nested operators, kernels launched inside their CPU op) unless ``i`` started and ended after
``d`` (timestamp skew: it follows ``d``). A GPU row before a captured device collective (which starts at
its call and has no launch of its own: the kernel its NCCL stream waited for) is a queue edge whatever
the overlap, none included: it holds the transfer, never the call.

**Communication streams.** A collective's transfer queues behind collectives of its stream, never its
start (a collective is issued by its host thread, whatever its stream is doing): on a device stream behind
the previous one; on a host stream (gloo's two worker threads) behind the first to end of the two that may
still run before it (:func:`_host_queue`). Host-side p2p ops of a stream do not wait for each other (gloo
runs them independently); on a device stream they queue like collectives.

**Wait nodes.** A COMP node named in :data:`~skewlens.profiler.vocab.WAIT_NODE_NAMES` (``wait_tensor``,
``Work.wait``) that depends on communication nodes is a *wait*: it arrives after its host dependencies
like any node, then its work (``work_ns``: the part of its recorded duration after the latest of those
completions) cannot begin before they complete. Those dependencies are *wait* edges. A host-time node
(the ``collectives`` level's ``compute`` gap, the ``ops`` level's ``untraced`` time) in which DDP's reducer
hid its wait for the step's gradient buckets is a wait node too (:func:`_gap_waits`); where that completion
was recorded just after the node ended (gloo's worker lags the work it completed), the model takes the
node's end as the collective's end (``RankModel.end_clamp_rows``), so the replay stays exact. A graph that
holds only the trace's own dependencies (the ASTRA-sim export's) cuts a wait node only at the
communication or GPU work those name: :func:`recorded_wait_work_ns`.

**Sync groups.** A matched collective instance, or a matched send/recv pair, completes as a group: the
transfer begins once every member has arrived; but a member of a rooted collective with a known root waits
only for the arrival :func:`waits_for` names (a broadcast's, scatter's or gather's non-root for the root;
a broadcast's root for no one, a scatter's or gather's for the last arrival), and the simulator, the skew
and stall analyses, the critical path and blame read that rule from :attr:`SyncGroup.waits_for` and
:func:`awaited_arrivals`. A send that completed before its receiver arrived (recorded send end at or
before the recv start, up to ``SKEW_NS``) is *eager*: it is *detached* from the group, ends its own
recorded duration after its arrival, and its recv waits for it (not the other way round). An
asynchronous send or recv recorded to end after the other member of its pair ended (gloo reports no
completion: it ends where the program's wait on it returned, at a pipeline stage's end of step) ended
with it (:func:`_p2p_done_by`), so it holds no phantom transfer before that wait; but not before its call
returned (``skl_return_ns``: gloo's call may block), so the call stays its communication.
A collective member recorded as done before the arrival it waits for (which cannot be: clock error
between the ranks' traces) is detached too, so the recording replays as it was.

**GPU work** (see "GPU dependencies" in :mod:`skewlens.profiler.vocab`). Each CUDA stream is a timeline: a
kernel, copy or memset starts ``gap`` after the later of its predecessor's end and its other start edges
(event waits across streams) and its *launch*: a *launch edge* from the host row around its launch call
is met ``launch_off_ns`` after that row starts (the call's place inside it, scaled with the row's work
where a replay changes it: "Issue edges"), not when it ends, so the CPU runs ahead of the GPU as
recorded. A host row that synchronised on the GPU (stream, event or device synchronise, a blocking copy)
is a wait node: its dependencies on GPU rows are wait edges; its launches
are met after it *arrives* (its recorded start), before it waits, so that a host op may launch the very
work it then waits for (``.item()``: the copy names the op in ``skl_launched_in``); those whose call came
after its wait had ended (``aten::index``: a synchronise, then launches) are met as long after its wait
as recorded, so that they move with the wait; one whose call came between two of its waits (``aten::index``
waiting for one copy, launching the next, waiting for that) as long after the waits before the call (those
recorded to end before it) as recorded, not after the later ones, which may be for the very work it
launches (:func:`launch_times`). An NCCL kernel
is a member of its collective's sync group: it arrives when launched and its stream is free, its
transfer begins once every member's kernel has arrived.

**Issue edges.** Host communication issued from inside a host row of the thread that issued it (a DDP
communication hook's all_reduce inside ``AccumulateGrad``, FSDP2's ``unshard`` all_gather inside
``FSDP::all_gather``, an all_reduce inside ``Optimizer.step``) has an *issue edge* from the innermost such
row (:func:`_issue_edges`): it is issued at that row's replayed start plus its recorded offset into the
row, scaled by the row's work factor (:func:`issue_offsets`: replayed over recorded work, so a slowdown,
a ``dur_override`` or calibration of the row moves it); the offset is clamped to the row's duration (a
start recorded just past the row's end, by the trace sources' clock error, is at its end). Launches and
nested rows move so too (:func:`scaled_offsets`, the one rule): a launch edge is met at its source's
replayed start plus its call's place scaled by the source's work factor (:func:`launch_offsets`; of a call
after its source's wait, the place after the wait, from the wait's end; a call made while the source waited
is met as recorded: the wait is the wait's, not the source's work), so a kernel launched 90% into an op a
replay halves is launched 45% into the op's recorded length, inside it; a nested row starts its recorded
offset into its enclosing row scaled by that row's factor and lasts its recorded work so scaled, unless the
replay changes its own work (an ``op`` item naming it, a ``compute`` item, a ``dur_override``: then its
own), so a child of a scope a replay halves ends inside the halved scope (:func:`nested_times`; one inside
an enclosing wait node's wait keeps its recorded offset and its own work).

**Host gaps.** ``gap_i = recorded start_i - max(recorded end of i's start edges, launch times, issue
times)`` (clamped >= 0); for a node without start edges ``gap_i = recorded start_i - t0`` (the rank's first
recorded start).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from skewlens.profiler.manifest import THREAD_STREAM_SOURCES
from skewlens.profiler.store.model import RankTrace, RunTrace, seal_arrays, type_mask
from skewlens.profiler.threads import default_workers, ordered_map, release_free_memory
from skewlens.profiler.vocab import (
    COMM_NODE_TYPES,
    COMPUTE_GAP_NODE_NAME,
    EMPTY_WAITS_FOR_NONE,
    GLOO_FINISH_LAG_NS,
    P2P_NODE_TYPES,
    UNTRACED_NODE_NAME,
    WAIT_NODE_NAMES,
    CommType,
    NodeType,
    names_gpu_memory_op,
    names_nccl_kernel,
)
from skewlens.replay.effects import Effects, HostIdleEffects
from skewlens.replay.errors import MAX_SIM_NS, SIM_CLOCK, ConfigError

I64 = npt.NDArray[np.int64]
#: Rows of one rank (fewer than 2**31), as the analyses' index keeps them: half the memory of int64.
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]

_MIN = np.iinfo(np.int64).min
_MAX = np.iinfo(np.int64).max

#: A node that starts at most this long before its dependency ends (and ends after it) still follows it:
#: the overlap is clock skew between trace sources, not concurrency.
SKEW_NS = 20_000
#: Host streams whose busy times overlap by at most this fraction are replayed as one thread (not a
#: capture's, whose streams are threads: :func:`_timelines`).
MERGE_OVERLAP = 0.01
#: A host node starting at most this long after a communication node completed, on a thread that had
#: been idle ``WAIT_RATIO`` times longer before the completion, is taken to have waited for it.
WAIT_SLACK_NS = 1_000_000
WAIT_RATIO = 10
#: A hidden wait's completion may be recorded up to gloo's finish lag after the host-time node that
#: waited for it ended (:func:`_gap_waits`).
LAG_SLACK_NS = GLOO_FINISH_LAG_NS
#: A wait node that returned at most this long after it began did not block: what it waited for had
#: completed before (an unblocked ``c10d::wait`` took up to 0.08 ms at the ``ops`` level, 0.01 below it).
UNBLOCKED_WAIT_NS = 100_000


@dataclass(frozen=True, kw_only=True, slots=True)
class RankModel:
    """What each node of one rank waits for (row-aligned with the rank's RankTrace)."""

    rank: int
    """Global rank."""
    valid: B
    """Rows that take part (all but METADATA / INVALID nodes, which keep their recorded times)."""
    sync: B
    """Rows that are members of a sync group (matched collective instance or send/recv pair)."""
    start_src: I32
    """Start edges, sources: the row ``start_dst[k]`` starts ``gap_ns`` after the latest of them ends."""
    start_dst: I32
    """Start edges, dependants."""
    queue_src: I32
    """Queue edges, sources: the transfer of sync row ``queue_dst[k]`` waits for their end."""
    queue_dst: I32
    """Queue edges, dependants (sync rows)."""
    wait_src: I32
    """Wait edges, sources (communication rows): the work of wait row ``wait_dst[k]`` waits for them."""
    wait_dst: I32
    """Wait edges, dependants (wait nodes)."""
    launch_src: I32
    """Launch edges, sources (host rows): GPU row ``launch_dst[k]`` cannot start before ``launch_off_ns[k]``
    (scaled by its source's work factor: :func:`launch_offsets`) after its source started (the launch call
    inside it), whatever the source does after that."""
    launch_dst: I32
    """Launch edges, dependants (GPU rows)."""
    launch_off_ns: I64
    """Launch edges: recorded launch call start minus the source's recorded start (within its duration)."""
    launch_after_wait: B
    """Launch edges whose call came after the source (a wait row) had waited (``aten::index``: a
    synchronise, then launches): met ``launch_off_ns - wait_in_ns`` after the source's wait ended (its
    work's start), so that the call moves with the wait; the others are met ``launch_off_ns`` after its
    start (:func:`launch_times`)."""
    launch_waited_ns: I64
    """Launch edges: of ``launch_off_ns``, the recorded time from the source's start to the end of its wait
    before the call (the latest recorded end of its wait edges that ended before the call; 0 where none
    did): its ``wait_in_ns`` for a call after its whole wait."""
    part_wait_src: I32
    """Launch edges met after part of their source's wait (a row that waited, launched, then waited
    again: ``aten::index`` waiting for one copy, then launching the next), sources: a wait dependency of
    the source of launch edge ``part_wait_edge[k]`` recorded to end before its call. That edge is met
    ``launch_off_ns - launch_waited_ns`` after the latest of those ends, and as long after the source's
    start, not after its later waits (:func:`launch_times`)."""
    part_wait_edge: I32
    """Those launch edges (indices into ``launch_src``)."""
    issue_src: I32
    """Issue edges, sources (host rows, nested ones included): the innermost host row that communication
    row ``issue_dst[k]`` was issued from inside (:func:`_issue_edges`). It cannot start before
    ``issue_off_ns[k]`` scaled by its source's work factor after its source started (:func:`issue_offsets`),
    so that it moves with that row's start and, inside it, with its length."""
    issue_dst: I32
    """Issue edges, dependants (host communication rows)."""
    issue_off_ns: I64
    """Issue edges: recorded start of the dependant minus its source's (within its duration: clamped)."""
    gap_ns: I64
    """Recorded host gap before each row (see the module docstring), 0 for invalid and nested rows."""
    work_ns: I64
    """Each row's own work: its recorded duration, less the waiting of a wait node."""
    parent: I32
    """Nested rows: the outermost enclosing row on the timeline (their times follow it, their offset into
    it and their work scaled with its work: :func:`nested_times`); else -1."""
    has_start_deps: B
    """Rows with at least one start edge."""
    is_wait: B
    """Wait nodes: COMP rows named in ``WAIT_NODE_NAMES``, and host-time nodes (``compute`` gaps,
    ``untraced`` time) taken to have waited for a hidden completion (:func:`_gap_waits`)."""
    host_work: B
    """Those wait nodes whose work after the completion is the program's own host work (a ``compute`` gap
    node that hid DDP's wait): compute, where a wait op's is its overhead and untraced time's is idle."""
    end_clamp_rows: I64
    """Communication rows whose recorded end lies after the host-time node that waited for them ended
    (gloo's worker lags the completion): the program saw them complete by then; and asynchronous sends
    and recvs recorded to end after the other member of their pair ended (:func:`_p2p_done_by`). Their
    end here is :attr:`end_clamp_ns` (ends lie within the work that consumes them; never before the call
    that issued the op returned, where the trace records it: :func:`_call_returned`). Sorted."""
    end_clamp_ns: I64
    """Their ends, aligned with :attr:`end_clamp_rows`."""
    t0_ns: int
    """The rank's first recorded start (valid rows)."""
    dur_ns: I64
    """Recorded duration of each row (the trace's)."""

    def __post_init__(self) -> None:
        # read-only, as the loaded run's columns are: the model is cached per run and its arrays are shared
        # (the analyses' index holds gap_ns, work_ns and host_work themselves, work_ns and dur_ns may be the
        # trace's), so a write into one would change every other reader's answer, unsaid
        seal_arrays(getattr(self, f.name) for f in fields(self))

    @property
    def wait_in_ns(self) -> I64:
        """Per row, the recorded time spent blocked on communication inside it (wait nodes), else 0."""
        return self.dur_ns - self.work_ns

    @property
    def launch_at_arrival(self) -> B:
        """Per launch edge: its source waits (has wait edges) and the call came before the wait, so it is
        met after the source *arrives* (its start), before the source blocks: ``.item()`` launching the
        copy it then waits for; or between two of its waits, so it is met after the arrival and the waits
        before the call (:attr:`part_wait_src`), not the later ones (:func:`launch_times`)."""
        waiting = np.zeros(self.valid.shape[0], dtype=np.bool_)
        waiting[self.wait_dst] = True
        return waiting[self.launch_src] & ~self.launch_after_wait


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncGroup:
    """A collective instance or send/recv pair whose members complete together."""

    is_p2p: bool
    """True for a send/recv pair, False for a collective instance."""
    index: int
    """Index into ``run.collectives`` or ``run.p2p``."""
    ranks: tuple[int, ...]
    """Members' global ranks (p2p: sender, receiver); members on ranks that were not loaded are left out."""
    rows: tuple[int, ...]
    """Members' rows in their rank's RankTrace, aligned with ``ranks``."""
    detached: tuple[bool, ...]
    """Members that do not wait for the group (an eager send), aligned with ``ranks``."""
    waits_for: tuple[int, ...]
    """Per member, whose arrival its transfer waits for (:func:`waits_for`): -1 the last arrival (every
    member of a pair, and of a collective but a rooted one with a known root), else a member's index (its
    own: no one). Aligned with ``ranks``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionModel:
    """What waits on what in a whole run: one :class:`RankModel` per rank and the sync groups."""

    ranks: dict[int, RankModel]
    """Per-rank models by global rank."""
    syncs: tuple[SyncGroup, ...]
    """Sync groups: collective instances (in ``run.collectives`` order), then send/recv pairs."""
    start_ns: int
    """The run's first recorded start: the earliest :attr:`RankModel.t0_ns` of the ranks with rows (0 for
    none); a rank's nodes without start edges are replayed from it (:func:`replay_gaps`)."""
    rooted: dict[int, tuple[int, ...]]
    """The :func:`waits_for` rule of each collective (by index in ``run.collectives``, aligned with its
    ``ranks``) whose members do not all wait for the last arrival (a rooted one with a known root, an
    empty one: :func:`collective_waits_for`); every other collective's members do (:meth:`rule`)."""

    def rule(self, ci: int, n: int) -> tuple[int, ...]:
        """The :func:`waits_for` rule of collective ``ci`` of ``n`` members, as derived once here: what
        the simulator, the analyses and the summary read."""
        return self.rooted.get(ci) or (-1,) * n


_CACHE: weakref.WeakKeyDictionary[RunTrace, ExecutionModel] = weakref.WeakKeyDictionary()


def execution_model(run: RunTrace) -> ExecutionModel:
    """The run's execution model, derived once per RunTrace (cached while the RunTrace lives; a RunTrace
    is not changed after loading)."""
    got = _CACHE.get(run)
    if got is None:
        got = _CACHE[run] = derive(run)
    return got


#: Names of COMP nodes that stand for host time inside no operator (capture at the ``ops``/``full`` levels
#: fills the main thread's untraced time with such nodes): host idle or gap, not compute, wherever compute
#: is measured (the analyses' breakdown, the replay's summary).
UNTRACED_NAMES = frozenset({UNTRACED_NODE_NAME})


def _comp_rows_named(rt: RankTrace, named_so: Callable[[str], bool]) -> B:
    """Per row: a COMP node whose name ``named_so`` accepts (tested once per distinct name)."""
    if not rt.names or len(rt) == 0:
        return np.zeros(len(rt), dtype=np.bool_)
    named = np.array([named_so(nm) for nm in rt.names], dtype=np.bool_)
    return (rt.node_type == int(NodeType.COMP)) & named[rt.name_idx]


def untraced_rows(rt: RankTrace) -> B:
    """Per row: a COMP node standing for untraced host time (:data:`UNTRACED_NAMES`)."""
    return _comp_rows_named(rt, UNTRACED_NAMES.__contains__)


#: Names of COMP nodes that stand for host time outside every traced call: the ``collectives`` level's
#: ``compute`` gaps and the ``ops``/``full`` levels' ``untraced`` time, where a wait can hide
#: (:func:`_gap_waits`).
HOST_TIME_NAMES = frozenset({COMPUTE_GAP_NODE_NAME, UNTRACED_NODE_NAME})


def host_time_rows(rt: RankTrace) -> B:
    """Per row: a COMP node standing for host time outside every traced call (:data:`HOST_TIME_NAMES`)."""
    return _comp_rows_named(rt, HOST_TIME_NAMES.__contains__)


def hidden_wait_edges(rt: RankTrace, m: RankModel) -> tuple[I32, I32]:
    """The wait edges into host-time nodes (:func:`host_time_rows`): the waits the model infers hidden in
    them (:func:`_gap_waits`), as sources (communication rows) and dependants. The dependants' work
    (:attr:`RankModel.work_ns`) is what follows the completion."""
    hidden = host_time_rows(rt)[m.wait_dst]
    return m.wait_src[hidden], m.wait_dst[hidden]


def gpu_dependency_kinds(rt: RankTrace, src: I32 | I64, dst: I32 | I64) -> tuple[B, B]:
    """Of the dependencies ``src -> dst`` (rows), the launches (a GPU row's dependency on a host row) and
    the host synchronisations (a host row's on a GPU row): "GPU dependencies" in
    :mod:`skewlens.profiler.vocab`."""
    return ~rt.is_cpu[dst] & rt.is_cpu[src], rt.is_cpu[dst] & ~rt.is_cpu[src]


def recorded_waits(rt: RankTrace, m: RankModel) -> tuple[I64, I64]:
    """The wait edges a graph of the trace's own dependencies holds, as sources and dependants: each wait
    node's (:attr:`RankModel.is_wait`) ``ctrl_deps``/``data_deps`` onto communication nodes, and each host
    row's onto GPU rows (a synchronisation: "GPU dependencies" in :mod:`skewlens.profiler.vocab`). A nested
    row's too: the model lets it follow its enclosing node (and moves a nested synchronisation's wait to
    that node), such a graph runs it on its own. The model's other wait edges it infers (a
    ``batch_isend_irecv`` call's other ops, a wait hidden in host time: :func:`_gap_waits`)."""
    owner = np.repeat(np.arange(len(rt), dtype=np.int64), np.diff(rt.dep_ptr))
    src = rt.dep_idx
    on_comm = m.is_wait[owner] & type_mask(rt.node_type, COMM_NODE_TYPES)[src]
    on_gpu = gpu_dependency_kinds(rt, src, owner)[1] & m.valid[owner] & m.valid[src]
    keep = (on_comm | on_gpu) & (src != owner)
    return src[keep], owner[keep]


def recorded_wait_work_ns(rt: RankTrace, m: RankModel) -> I64:
    """Each row's work where only the trace's own dependencies hold it back (ASTRA-sim's graph): a wait
    node's recorded duration after the latest completion of the communication or GPU work its own
    dependencies name (:func:`recorded_waits`), as :attr:`RankModel.work_ns` takes it over all its wait
    edges; every other row's whole recorded duration. A wait the model infers is not cut: the graph does
    not hold it, and would start the node early."""
    return _work_after(*recorded_waits(rt, m), rt.start_ns, rank_ends(rt, m), m.dur_ns)[0]


def _work_after(ws: I32 | I64, wd: I32 | I64, start: I64, end: I64, dur: I64) -> tuple[I64, I64]:
    """Per row, its work after the latest completion its wait edges ``ws -> wd`` name (within its recorded
    span; its whole duration without one), and that completion (``_MIN`` without one)."""
    done = np.full(dur.shape[0], _MIN, dtype=np.int64)
    np.maximum.at(done, wd, end[ws])
    rows = np.flatnonzero(done > _MIN)
    work = dur.astype(np.int64, copy=True)
    work[rows] = np.clip(end[rows] - np.maximum(done[rows], start[rows]), 0, dur[rows])
    return work, done


def nccl_kernel_rows(rt: RankTrace) -> B:
    """Per row: a GPU COMP node that is an NCCL kernel (:func:`~skewlens.profiler.vocab.names_nccl_kernel`,
    the importer's rule). The importer keeps such a kernel as compute where it cannot say which collective
    or peer it ran (its launch call is outside the trace, or a further kernel of an op already converted):
    it is communication nothing can match across ranks, not compute, wherever compute is measured (the
    analyses' breakdown, the replay's summary, a compute slowdown)."""
    return _comp_rows_named(rt, names_nccl_kernel) & ~rt.is_cpu


def comm_rows(rt: RankTrace) -> B:
    """Per row: communication by what it is: a collective or p2p node, or an NCCL kernel kept as COMP
    (:func:`nccl_kernel_rows`); not a wait node (which is communication only while blocked:
    :func:`comm_intervals`)."""
    return type_mask(rt.node_type, COMM_NODE_TYPES) | nccl_kernel_rows(rt)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompKinds:
    """What each COMP row of a rank is (row-aligned masks, disjoint): the one rule that splits COMP rows
    into the program's work and the rest, which :func:`compute_rows`, the interval functions, the analyses'
    index and the timelines' categories all read (:func:`comp_kinds`)."""

    untraced: B
    """Untraced host time (:func:`untraced_rows`): idle."""
    wait: B
    """Wait nodes (:attr:`RankModel.is_wait`) but untraced ones: blocked on communication (``host_work``
    ones among them: their work after the wait is compute)."""
    comm: B
    """NCCL kernels kept as COMP (:func:`nccl_kernel_rows`): communication nothing can match."""
    work: B
    """The other COMP rows: the program's compute (:func:`compute_rows` adds the ``host_work`` nodes)."""


def comp_kinds(rt: RankTrace, m: RankModel) -> CompKinds:
    """The rank's :class:`CompKinds`, ``m`` its execution model."""
    untraced = untraced_rows(rt)
    wait = m.is_wait & ~untraced
    comm = nccl_kernel_rows(rt)
    work = (rt.node_type == int(NodeType.COMP)) & ~untraced & ~wait & ~comm
    return CompKinds(untraced=untraced, wait=wait, comm=comm, work=work)


def replay_gaps(em: ExecutionModel, rank: int) -> I64:
    """Each row's host gap as the simulator replays it: :attr:`RankModel.gap_ns`, and for a row without
    start edges its recorded start less the run's first start (:attr:`ExecutionModel.start_ns`), not less
    the rank's. So a rank that began later than the others (DLRM's rank 7, 7.5 ms after rank 1) holds that
    as host idle before its first node, which a what-if (``gap_override``) can shorten like any other gap;
    unmodified, the replay is the same."""
    m = em.ranks[rank]
    late = m.t0_ns - em.start_ns
    if late <= 0:
        return m.gap_ns
    return np.where(start_heads(m), m.gap_ns + late, m.gap_ns).astype(np.int64)


def start_heads(m: RankModel) -> B:
    """Per row: one without start edges (nor a parent it follows), whose host gap counts from the rank's
    first start in :attr:`RankModel.gap_ns` and from the run's in :func:`replay_gaps`."""
    return ~m.has_start_deps & m.valid & (m.parent < 0)


def _thread_issues(rt: RankTrace, m: RankModel, ops: B) -> I64:
    """The issues of the rows ``ops`` marks that were issued asynchronously from a host row of another
    stream (:func:`issuer_heads` says which), one per op and issuing thread: rows of (op row, the issuing
    thread's stream, kind: 0 a launch call, 1 inside a running operator, 2 at the op's start, issue time)."""
    none = np.zeros((4, 0), dtype=np.int64)
    if not ops.any():
        return none
    comm = type_mask(rt.node_type, COMM_NODE_TYPES)
    # a start edge from a host thread's row: one from a communication stream (another group's collective, the
    # previous step's asynchronous all_reduce) or a GPU op (a stream wait) issued nothing, and taken for an
    # issue it delayed that stream's next op as much again
    starts = m.start_src.astype(np.int64)
    comm_streams = _comm_streams(rt, m.valid)
    on_host = rt.is_cpu & ~np.isin(rt.stream, list(comm_streams)) if comm_streams else rt.is_cpu
    hit = ops[m.start_dst] & on_host[starts]
    src, dst = starts[hit], m.start_dst[hit].astype(np.int64)
    at = rt.start_ns[dst]
    qs, qd = m.queue_src.astype(np.int64), m.queue_dst.astype(np.int64)
    inside = (
        ops[qd]
        & rt.is_cpu[qs]
        & ~comm[qs]
        & (rt.start_ns[qs] <= rt.start_ns[qd])
        & (rt.start_ns[qd] < rt.start_ns[qs] + rt.dur_ns[qs])
    )
    launched = ops[m.launch_dst]
    ls = m.launch_src[launched].astype(np.int64)
    # issued from inside a host row (the model's issue edges): inside a running op too
    issued = ops[m.issue_dst]
    i_s, i_d = m.issue_src[issued].astype(np.int64), m.issue_dst[issued].astype(np.int64)
    src = np.concatenate([src, qs[inside], i_s, ls])
    dst = np.concatenate([dst, qd[inside], i_d, m.launch_dst[launched].astype(np.int64)])
    # issued inside the running op, so after its start, even where both start in one µs (Chakra's times)
    inside_at = np.maximum(rt.start_ns[qd[inside]], rt.start_ns[qs[inside]] + 1)
    issue_at = np.maximum(rt.start_ns[i_s] + m.issue_off_ns[issued], rt.start_ns[i_s] + 1)
    at = np.concatenate([at, inside_at, issue_at, rt.start_ns[ls] + m.launch_off_ns[launched]])
    # one issue per op and thread: the launch call (kind 0), else inside a running op (1), else the op's
    # start (2); the earliest of its kind, but the latest launch call: a kernel with several launching rows
    # of one thread is launched by the last, as the model times it (a launch edge's call clipped into an
    # earlier row is that row's end, before the call)
    kind = np.repeat(
        np.array([2, 1, 1, 0], dtype=np.int64), [int(hit.sum()), int(inside.sum()), i_s.size, ls.size]
    )
    other = rt.stream[src] != rt.stream[dst]
    if not other.any():
        return none
    issues = np.stack([dst[other], rt.stream[src[other]].astype(np.int64), kind[other], at[other]])
    issues = issues[:, np.lexsort((np.where(issues[2] == 0, -issues[3], issues[3]), *issues[2::-1]))]
    first = np.ones(issues.shape[1], dtype=np.bool_)
    first[1:] = (issues[0, 1:] != issues[0, :-1]) | (issues[1, 1:] != issues[1, :-1])
    return issues[:, first]


def issuer_heads(rt: RankTrace, m: RankModel, threads: Sequence[tuple[I64, I64]]) -> tuple[I64, I64]:
    """Of the ops of ``threads`` (:func:`issuing_threads`: those issued asynchronously from a host row of
    another stream, the thread that issued them), each paired with what that thread does next after the
    issue: its first top-level row that starts at or after the issue, or its next such issue where that
    comes first (the wait before an op held the thread's next issue too: an isend issued after a delayed
    all_reduce). ``(op rows, head rows)``, one pair per op and issuing thread, in issue order on each
    thread (a head that is an issue is the next pair's op); an op issued last on its thread has none, and
    so has one its head follows (a start edge from the op: it completed inside its call, and holds the
    thread by its end already).

    The issuing row is the one the op follows (a start edge from a host thread's row of another stream, not a
    communication stream's or a GPU op's: issued at the op's start), or one it was issued from inside, still
    running then: the row of its issue edge (:attr:`RankModel.issue_src`), issued at its recorded offset into
    it, or an enclosing host operator it depends on (a queue edge from it, where a trace names a node's
    parent operator as its dependency, as Chakra's converter does), issued at the op's start (after the
    operator's own start: it is never the head); or a launch edge (a GPU op: an NCCL kernel), issued at the
    launch call. Of one op's issues from one thread the launch call is taken (the latest, where several rows
    of it launched the op), else the issue inside a running operator (where the op also follows a row that
    thread finished, it was still issued after the operator began), else the op's start."""
    empty = np.zeros(0, dtype=np.int64)
    out_ops: list[I64] = []
    out_heads: list[I64] = []
    for rows, on in threads:
        # the thread's next thing after each issue: its first top-level row that starts at or after the
        # issue, or its next issue where that comes before the row (the row where both come at once)
        k = np.minimum(np.searchsorted(rt.start_ns[rows], on[3], side="left"), rows.size)
        row = np.append(rows, -1)[k]
        row_at = np.append(rt.start_ns[rows], _MAX)[k]
        to_issue = np.append(on[3, 1:], _MAX) < row_at
        ok = to_issue | (row >= 0)
        out_ops.append(on[0][ok])
        out_heads.append(np.where(to_issue, np.append(on[0, 1:], -1), row)[ok])
    got_ops, got_heads = np.concatenate([empty, *out_ops]), np.concatenate([empty, *out_heads])
    # a head that follows the op (a start edge from it: an op that completed inside its call) waits for it
    # already, its delay with it: held again, a 5 ms slow isend held the thread 10 ms
    n = len(rt)
    pairs = m.start_src.astype(np.int64) * n + m.start_dst.astype(np.int64)
    follows = np.isin(got_ops * n + got_heads, pairs)
    return got_ops[~follows], got_heads[~follows]


def issuing_threads(rt: RankTrace, m: RankModel, ops: B) -> list[tuple[I64, I64]]:
    """Per thread that issued rows ``ops`` marks asynchronously (:func:`_thread_issues`): its top-level rows
    by start, and its issues by time (then row); what :func:`issuer_heads` and :func:`issued_during`
    read, found once for both."""
    issues = _thread_issues(rt, m, ops)
    top = m.valid & (m.parent < 0)
    out = []
    for stream in np.unique(issues[1]).tolist():
        rows = np.flatnonzero(top & (rt.stream == stream))
        on = issues[:, issues[1] == stream]
        out.append((rows[np.argsort(rt.start_ns[rows], kind="stable")], on[:, np.lexsort((on[0], on[3]))]))
    return out


def issued_during(rt: RankTrace, threads: Sequence[tuple[I64, I64]]) -> tuple[I64, I64]:
    """Of the ops of ``threads`` (:func:`issuing_threads`), those issued at their start (a start edge from a
    host row their thread finished: :func:`issuer_heads`) while a later top-level row of that thread ran
    (begun before the issue, ending after it: FSDP's all_gather issued inside ``fsdp``, following the row
    before it), paired with that row. ``(op rows, running rows)``. What holds the thread before that row (a
    delay before it, a hold as an issuer's head) held the issue inside it as well, though the op does not
    follow the row: the real replay's thread issues it during the row. One issued inside an operator it
    depends on (a queue edge from it), issued from inside it (an issue edge) or launched by it starts after
    that row's start, held with it already."""
    empty = np.zeros(0, dtype=np.int64)
    out_ops: list[I64] = [empty]
    out_rows: list[I64] = [empty]
    for rows, on in threads:
        on = on[:, on[2] == 2]
        k = np.searchsorted(rt.start_ns[rows], on[3], side="left") - 1  # the last row begun before it
        row = rows[np.maximum(k, 0)] if rows.size else np.zeros(k.size, dtype=np.int64)
        ok = (k >= 0) & (rt.start_ns[row] + rt.dur_ns[row] > on[3])
        out_ops.append(on[0][ok])
        out_rows.append(row[ok])
    return np.concatenate(out_ops), np.concatenate(out_rows)


def scaled_work(effects: Effects, rt: RankTrace, m: RankModel, d: I64) -> I64:
    """The durations ``d`` (per row: the model's ``work_ns``, or the simulator's overrides of it) with the
    :func:`compute_rows`' multiplied by ``effects.compute_factor``, evaluated once per (step, name, on the
    GPU or not) and rounded to the ns; the simulator and the real replay's plan both read it. A factor of 0
    takes a row's work away (an ``op`` item: a data loader's fetch that had not stalled). A factor that is
    negative or not finite, or a duration beyond the simulated clock, is a
    :class:`~skewlens.replay.errors.ConfigError` naming the rank."""
    rank = rt.rank
    rows = np.flatnonzero(compute_rows(rt, m))
    if rows.size == 0:
        return d
    nn = max(len(rt.names), 1)
    key = ((rt.step[rows].astype(np.int64) + 1) * nn + rt.name_idx[rows]) * 2 + ~rt.is_cpu[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    fac = np.array(
        [
            effects.compute_factor(
                rank, int(k // 2 // nn) - 1, rt.names[int(k // 2 % nn)], on_gpu=bool(k % 2)
            )
            for k in uniq.tolist()
        ],
        dtype=np.float64,
    )
    if (fac < 0).any() or not np.isfinite(fac).all():
        raise ConfigError(f"rank {rank}: compute factor must be a finite number >= 0, got {fac.min()}")
    if (fac == 1.0).all():
        return d
    scaled = d[rows] * fac[inv]
    if (over := scaled > MAX_SIM_NS).any():  # cast to int64, it would wrap around
        i = int(np.argmax(over))
        raise ConfigError(
            f"slowdown: rank {rank}'s {rt.names[int(rt.name_idx[rows[i]])]} x{fac[inv[i]]:g} lasts "
            f"{scaled[i] / 1e9:.3g} s, beyond {SIM_CLOCK}: the slowdown's factor / sigma is out of any "
            "real range"
        )
    out = d.copy()
    out[rows] = np.rint(scaled).astype(np.int64)
    return out


def effect_delays(effects: Effects, rt: RankTrace, m: RankModel) -> I64:
    """Per row, the wait the effects put before it, ns: ``effects.delay_before_ns`` on each valid row
    (asked once per (step, type, name)), plus ``effects.stall_ns`` of each step on the step's valid row with
    the earliest recorded start (the lower row among equal starts): the rank paused before it began the
    step, whatever the replayer's order of issue (a kernel of the step launched during the previous one
    comes before it in the real replay's plan, but it was launched before the pause). The simulator adds
    these to its host gaps (``skewlens.replay.lower``), the real replay's plan to its ops' ``delay_ns``;
    a negative wait, or one beyond the simulated clock, is a :class:`~skewlens.replay.errors.ConfigError`
    naming the rank (and the step, for a stall)."""
    rank = rt.rank
    out = np.zeros(len(rt), dtype=np.int64)
    rows = np.flatnonzero(m.valid)
    if rows.size == 0:
        return out
    nn = max(len(rt.names), 1)
    key = ((rt.step[rows].astype(np.int64) + 1) * 16 + rt.node_type[rows]) * nn + rt.name_idx[rows]
    uniq, inv = np.unique(key, return_inverse=True)
    vals = []
    for k in uniq.tolist():
        step, rest = divmod(k, 16 * nn)
        ntype, name = divmod(rest, nn)
        vals.append(int(effects.delay_before_ns(rank, step - 1, NodeType(ntype), rt.names[name])))
    if vals and max(vals) > MAX_SIM_NS:  # several items' delays, each on the clock, summed past it
        raise ConfigError(
            f"slowdown: rank {rank}'s delay before a node is {max(vals) / 1e9:.3g} s, beyond {SIM_CLOCK}"
        )
    delay = np.asarray(vals, dtype=np.int64)
    if (delay < 0).any():
        raise ConfigError(f"rank {rank}: delay before a node must be >= 0 ns, got {int(delay.min())}")
    out[rows] = delay[inv]
    order = rows[np.lexsort((rows, rt.start_ns[rows]))]
    steps, first = np.unique(rt.step[order], return_index=True)
    for st, fi in zip(steps.tolist(), first.tolist(), strict=True):
        if st < 0:
            continue
        stall = int(effects.stall_ns(rank, st))
        if stall < 0:
            raise ConfigError(f"rank {rank}: stall at step {st} must be >= 0 ns, got {stall}")
        if stall + int(out[order[fi]]) > MAX_SIM_NS:
            raise ConfigError(
                f"slowdown: rank {rank}'s stall at step {st} is {stall / 1e9:.3g} s, beyond {SIM_CLOCK}"
            )
        out[order[fi]] += stall
    return out


def host_idle_rows(rt: RankTrace, m: RankModel) -> tuple[B, B]:
    """A rank's untraced host time, as two row masks: the rows whose recorded gap (:attr:`RankModel.gap_ns`)
    is such time, and those whose work (:attr:`RankModel.work_ns`) is. Untraced host time is what a host
    thread spent outside every traced row (a data loader's stall, ``gc.collect()``, a checkpoint write):

    - the gap before a host row (not a GPU op: the GPU's idle time is no host time) after the rows it
      follows (its start edges; not a row without any, whose gap counts from the rank's first start, nor
      a nested one);
    - the capture's ``untraced`` nodes (:func:`untraced_rows`): of one in which the model found a hidden
      wait, its work after the completion (its wait is for the peers, as a traced collective's is).

    Not the time a thread waits inside a collective or a wait op (traced: the peers set it), nor the
    ``collectives`` level's ``compute`` gap nodes (compute to the analyses: that level cannot tell its
    idle time from its work). A ``host_idle`` slowdown scales exactly this (:func:`host_idle_scaled`)."""
    host = m.valid & rt.is_cpu
    gaps = host & m.has_start_deps & (m.parent < 0)
    return gaps, host & untraced_rows(rt)


def host_idle_scaled(effects: Effects, rt: RankTrace, m: RankModel, work: I64, gap: I64) -> tuple[I64, I64]:
    """``work`` and ``gap`` (per row: the model's, or what a replayer made of them) with the rank's untraced
    host time (:func:`host_idle_rows`) multiplied by the effects' ``host_idle_factor`` of each row's step
    (a :class:`~skewlens.replay.effects.HostIdleEffects`; other effects leave it as recorded), rounded to
    the ns; the simulator and the real replay's plan both read it. A factor that is not a finite number
    >= 0, or a time beyond the simulated clock, is a :class:`~skewlens.replay.errors.ConfigError` naming the
    rank."""
    if not isinstance(effects, HostIdleEffects):
        return work, gap
    rank = rt.rank
    steps, of_row = np.unique(rt.step, return_inverse=True)
    fac = np.array([float(effects.host_idle_factor(rank, st)) for st in steps.tolist()], dtype=np.float64)
    if (fac == 1.0).all():
        return work, gap
    if (fac < 0).any() or not np.isfinite(fac).all():
        raise ConfigError(f"rank {rank}: host idle factor must be a finite number >= 0, got {fac.min()}")
    per_row = fac[of_row]
    out = []
    for vals, rows in zip((gap, work), host_idle_rows(rt, m), strict=True):
        scaled = vals * per_row
        if (over := rows & (scaled > MAX_SIM_NS)).any():  # cast to int64, it would wrap around
            raise ConfigError(
                f"slowdown: rank {rank}'s untraced host time x{per_row[int(np.argmax(over))]:g} lasts "
                f"{scaled[over].max() / 1e9:.3g} s, beyond {SIM_CLOCK}"
            )
        out.append(np.where(rows, np.rint(scaled), vals).astype(np.int64))
    return out[1], out[0]


def issuer_delays(rt: RankTrace, m: RankModel, delay: I64) -> I64:
    """Per row, what the delays before asynchronous ops (``delay``, per row: before communication, a step's
    stall on its first node) add to the thread that issued them: the rank waits before it issues the op (the
    example's ``--slow-send`` sleeps, then isends), so the issuing thread's node that follows the issue
    (:func:`issuer_heads`: its next row, or its next issue, which passes the hold on) is delayed as much as
    the op, and what follows it on the thread with it; an issue made while a later row of the thread ran
    (:func:`issued_during`) is held as that row is. A blocking op, or one that node follows, holds it
    already (0 here). The simulator adds these to the host gaps (``skewlens.replay.lower``), the real
    replay's plan to the ops' ``delay_ns``."""
    out = np.zeros(len(rt), dtype=np.int64)
    # a step's stall sits on its first node, which may be compute that follows the previous step's
    # asynchronous collectives (start edges from their streams): issuer_heads takes issues from host rows
    # only, else it delayed the next collective on their stream as much again (DDP under Join, a 20 ms stall
    # every step on rank 0: 41.8 ms steps simulated, 30.8 ms measured with a real 20 ms sleep)
    if not (delay > 0).any():
        return out
    # every issue: one with no delay of its own passes on the hold of the issues before it (a chain: the
    # head of each is the next op's issue, until a row); so each head gets the delays of its chain so far
    threads = issuing_threads(rt, m, m.valid)
    ops, heads = issuer_heads(rt, m, threads)
    held = delay[ops]
    if ops.size:
        starts = np.flatnonzero(np.append(True, heads[:-1] != ops[1:]))
        total = np.cumsum(held)
        held = total - np.repeat(total[starts] - held[starts], np.diff(np.append(starts, ops.size)))
    np.add.at(out, heads, held)
    # an issue inside a later row is held by what held that row (not passed on: what follows the row
    # follows it); 6 ms before `fsdp`, the all_gather issued 4 ms into it was issued 2 ms before it began
    ops, running = issued_during(rt, threads)
    np.add.at(out, ops, delay[running] + out[running])
    return out


def gpu_op_rows(rt: RankTrace, m: RankModel) -> npt.NDArray[np.int64]:
    """A rank's GPU ops, every stream's (kernels, NCCL kernels, copies, memsets, collectives and p2p ops on a
    GPU stream): its valid rows off the host, as row numbers. Their union is the GPU's busy time (HTA's
    temporal breakdown's time that is not idle): :func:`gpu_busy`."""
    return np.flatnonzero(~rt.is_cpu & m.valid)


def gpu_busy(rt: RankTrace, m: RankModel, start: I64, end: I64) -> Coverage:
    """The time any stream of the rank's GPU ran an op (:func:`gpu_op_rows`), given each row's ``start``
    and ``end`` (recorded, or replayed)."""
    gpu = gpu_op_rows(rt, m)
    return Coverage.of(start[gpu].astype(np.int64), end[gpu].astype(np.int64))


def gpu_compute_rows(rt: RankTrace, m: RankModel) -> B:
    """Per row: a GPU row among :func:`compute_rows` that is a kernel, not a copy or memset
    (:func:`~skewlens.profiler.vocab.names_gpu_memory_op`): the GPU's compute as HTA counts it."""
    return compute_rows(rt, m) & ~rt.is_cpu & ~_comp_rows_named(rt, names_gpu_memory_op)


def launch_times(m: RankModel, start: I64, end: I64) -> I64:
    """Per launch edge, when it is met, given each row's ``start`` (a wait row's arrival) and ``end``
    (recorded, or replayed): :func:`launch_offsets` after its source's start (scaled by its source's work
    factor, its replayed work here being its span after its wait), or, for a call after the source's wait
    (:attr:`RankModel.launch_after_wait`), as long after that wait ended (the latest end of its wait
    edges, its start at the earliest: its work's start); for a call after part of it
    (:attr:`RankModel.part_wait_src`), as long after the latest end of the waits before the call (its
    start at the earliest) as recorded. The simulator meets its launch edges by the same rule
    (``Graph.lsucc_at_arrival``: those before a wait, or after part of it; ``Lowering.launch_at_end``: the
    end of a wait before the call)."""
    src = m.launch_src
    work_start = start.astype(np.int64, copy=True)
    if m.wait_dst.size:
        np.maximum.at(work_start, m.wait_dst, end[m.wait_src])
    after = launch_offsets(m, np.maximum(end - work_start, 0))  # the call's place after the wait before it
    met = np.where(m.launch_after_wait, work_start[src], start[src]) + after
    if m.part_wait_edge.size:
        np.maximum.at(met, m.part_wait_edge, end[m.part_wait_src] + after[m.part_wait_edge])
    return met


def latest_deps(m: RankModel, start: I64, end: I64, *, waits: bool = True) -> tuple[I32, I64]:
    """Per row, given each row's ``start`` and ``end`` (recorded, or replayed): of what it waits for in the
    execution model (start and wait edges, launches, met at the launch call: :func:`launch_times`, and
    issues from inside a host row: :func:`issue_times`; a nested row: its enclosing row, met at the nested
    row's start), the row met latest (the later row among
    ties), or -1, and when it was met (-1 for none). Without ``waits``: what held its arrival (wait edges
    left out)."""
    n = end.shape[0]
    out = np.full(n, -1, dtype=np.int32)
    met_at = np.full(n, -1, dtype=np.int64)
    ws, wd = (m.wait_src, m.wait_dst) if waits else (m.wait_src[:0], m.wait_dst[:0])
    src = np.concatenate([m.start_src, ws, m.launch_src, m.issue_src])
    dst = np.concatenate([m.start_dst, wd, m.launch_dst, m.issue_dst])
    met = np.concatenate([end[m.start_src], end[ws], launch_times(m, start, end), issue_times(m, start, end)])
    if src.size:
        # per row, the latest time met, then the latest row met then (two scatters: no sort of the edges)
        latest = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(latest, dst, met)
        at_latest = met == latest[dst]
        np.maximum.at(out, dst[at_latest], src[at_latest].astype(np.int32))
        has = out >= 0
        met_at[has] = latest[has]
    nested = m.parent >= 0
    out[nested] = m.parent[nested]
    met_at[nested] = start[nested]  # the enclosing row is on the path up to the nested start
    return out, met_at


#: What a GPU stream's idle stretch waited for (:func:`gpu_idle`), in the order of ``StreamIdle.parts``.
GPU_IDLE_PARTS = ("launch_wait", "comm_wait", "stream_wait", "other")
_LAUNCH, _COMM, _STREAM, _OTHER = range(len(GPU_IDLE_PARTS))


@dataclass(frozen=True, slots=True)
class StreamIdle:
    """One GPU stream's time in each of a rank's windows (steps): see :func:`gpu_idle`."""

    stream: int
    busy: I64
    """The union of the stream's ops in each window."""
    compute: I64
    """Of that, the union of its compute kernels (:func:`gpu_compute_rows`)."""
    ops: I64
    """Ops that started in each window."""
    parts: tuple[I64, ...]
    """The idle time in each window by what the stream waited for, in :data:`GPU_IDLE_PARTS`' order."""
    queued: I64
    """Of the ``other`` part, the time no op of any stream of the rank's GPU ran while the op the stream
    idled before had already been launched: a wait the trace does not show (an event of work outside it,
    kernels the profiler dropped), not launch latency."""


def compute_stream(streams: Sequence[tuple[int, float, float]]) -> int:
    """Of a rank's GPU streams, given as ``(stream, compute, busy)`` time over the same steps, its compute
    stream: the most compute kernels' time, then the busiest, then the lowest-numbered; -1 for none. The
    analyses' GPU idle table and the replay's summary both pick by this."""
    if not streams:
        return -1
    return max(streams, key=lambda s: (s[1], s[2], -s[0]))[0]


@dataclass(frozen=True, slots=True)
class IdleStretches:
    """One GPU stream's idle time, piece by piece (:func:`idle_stretches`): row-aligned arrays, one entry
    per piece, by start."""

    stream: int
    before: I32
    """The op (row) the piece came before."""
    lo: I64
    hi: I64
    """The piece, ``[lo, hi)``."""
    part: I64
    """What the stream waited for then: an index into :data:`GPU_IDLE_PARTS`."""


def idle_stretches(
    rt: RankTrace,
    m: RankModel,
    *,
    start: I64,
    end: I64,
    from_ns: int | None = None,
    stream: int | None = None,
) -> list[IdleStretches]:
    """Each GPU stream of a rank (or the one ``stream``), given each row's ``start`` and ``end`` (recorded,
    or replayed): the stretch before each of its ops during which it ran nothing, from the end of its work
    so far (the latest end of its earlier ops; the first op's: ``from_ns``, or none), split by the rule of
    :func:`gpu_idle` (the dependency met latest and when: until then it waited for that, after it, other).
    No piece after the stream's last op."""
    deps = (*latest_deps(m, start, end), comm_rows(rt), unheld_launches(rt, m, start))
    return [
        _stretches(rt, rows, sid=sid, start=start, end=end, deps=deps, from_ns=from_ns)
        for sid, rows in _gpu_streams(rt, m, start).items()
        if stream is None or sid == stream
    ]


def unheld_launches(rt: RankTrace, m: RankModel, start: I64) -> I64:
    """Per row, given each row's ``start`` (recorded, or replayed): for a GPU op whose launch call is in the
    trace but inside no host row (a kernel an extension launches with no operator around it: the fused
    optimizer kernels of the 128-GPU sample in ``../shared/traces``), so that no launch edge holds it (it
    keeps its stream order and its recorded start), when its launch was met: as long before its start as
    recorded (at the call, as recorded); the minimum int64 elsewhere. Its stream idled waiting for the host
    until then (:func:`gpu_idle`), not for nothing the trace says."""
    out = np.full(len(rt), np.iinfo(np.int64).min, dtype=np.int64)
    if rt.launch_ns is None:
        return out
    rows = gpu_op_rows(rt, m)
    held = np.zeros(len(rt), dtype=bool)
    held[m.launch_dst] = True
    rows = rows[(rt.launch_ns[rows] >= 0) & ~held[rows]]
    out[rows] = start[rows] - (rt.start_ns[rows] - rt.launch_ns[rows])
    return out


def _gpu_streams(rt: RankTrace, m: RankModel, start: I64) -> dict[int, npt.NDArray[np.int64]]:
    """Each GPU stream's rows, by start."""
    gpu = gpu_op_rows(rt, m)
    out = {}
    for sid in np.unique(rt.stream[gpu]).tolist():
        rows = gpu[rt.stream[gpu] == sid]
        out[int(sid)] = rows[np.argsort(start[rows], kind="stable")]
    return out


def _stretches(
    rt: RankTrace,
    rows: npt.NDArray[np.int64],
    *,
    sid: int,
    start: I64,
    end: I64,
    deps: tuple[I32, I64, B, I64],
    from_ns: int | None,
) -> IdleStretches:
    """:func:`idle_stretches` of stream ``sid``, its ``rows`` by start; ``deps``: :func:`latest_deps`'s
    two arrays, :func:`comm_rows` and :func:`unheld_launches`."""
    dep, met, comm, unheld = deps
    st, en = start[rows].astype(np.int64), end[rows].astype(np.int64)
    prev_end = np.empty_like(en)
    prev_end[0] = int(st[0]) if from_ns is None else min(from_ns, int(st[0]))
    prev_end[1:] = np.maximum.accumulate(en)[:-1]
    idle = st > prev_end
    d = dep[rows]
    at = np.where(d >= 0, met[rows], np.iinfo(np.int64).min)
    launched = unheld[rows] > at  # a launch no host row holds, met after what the model holds the op by
    at = np.where(launched, unheld[rows], at)
    kind = np.full(rows.shape, _OTHER, dtype=np.int64)
    late = np.flatnonzero(idle & (at > prev_end))  # met after the stream went idle
    dl = d[late]
    kind[late] = np.where(
        launched[late],
        _LAUNCH,
        np.where(
            comm[dl], _COMM, np.where(rt.is_cpu[dl], _LAUNCH, np.where(rt.stream[dl] == sid, _OTHER, _STREAM))
        ),
    )
    split = np.where(kind != _OTHER, np.minimum(at, st), prev_end)  # the dependency before, other after
    # per idle op: the wait (prev_end, split) of its kind, then other (split, st)
    k = np.flatnonzero(idle)
    lo = np.concatenate([prev_end[k], split[k]])
    hi = np.concatenate([split[k], st[k]])
    part = np.concatenate([kind[k], np.full(k.size, _OTHER, dtype=np.int64)])
    before = np.concatenate([rows[k], rows[k]]).astype(np.int32)
    keep = hi > lo
    o = np.argsort(lo[keep], kind="stable")
    return IdleStretches(
        stream=sid, before=before[keep][o], lo=lo[keep][o], hi=hi[keep][o], part=part[keep][o]
    )


def gpu_idle(rt: RankTrace, m: RankModel, *, start: I64, end: I64, a: I64, b: I64) -> list[StreamIdle]:
    """Each GPU stream of a rank in the windows ``[a, b)``, given each row's ``start`` and ``end`` (recorded,
    or replayed): the one rule the analyses' GPU idle table and the replay's summary read.

    A stream idles from the end of its work so far (the latest end of its earlier ops; the first: the
    first window's start) to the start of its next op; of what that op waited for, the dependency met
    latest and when (:func:`latest_deps`) split the stretch: until then it waited for that dependency,
    a launch wait where it is a host row (the launch call, or a host op it followed) or a launch call inside
    no host row (:func:`unheld_launches`), a comm wait where
    it is communication (a collective, a p2p op, an NCCL kernel), a stream wait where it is GPU work on
    another stream; after it (the launch latency), and all of a stretch whose op had nothing met after
    the stream went idle, other; so is the time after the stream's last op. So the parts sum to each
    window's length less the stream's busy time. The pieces themselves: :func:`idle_stretches`."""
    deps = (*latest_deps(m, start, end), comm_rows(rt), unheld_launches(rt, m, start))
    kernels = gpu_compute_rows(rt, m)
    busy = gpu_busy(rt, m, start, end)
    launch_ns = rt.launch_ns
    out = []
    for sid, rows in _gpu_streams(rt, m, start).items():
        st, en = start[rows].astype(np.int64), end[rows].astype(np.int64)
        pieces = _stretches(rt, rows, sid=sid, start=start, end=end, deps=deps, from_ns=int(a.min()))
        tail = (int(en.max()), max(int(b.max()), int(en.max())))  # after the last op: other
        parts = []
        for k in range(len(GPU_IDLE_PARTS)):
            mine = pieces.part == k
            lo, hi = pieces.lo[mine], pieces.hi[mine]
            if k == _OTHER:
                lo, hi = np.append(lo, tail[0]), np.append(hi, tail[1])
            parts.append(Coverage.of(lo, hi).between(a, b))
        comp = rows[kernels[rows]]
        # other pieces before an op launched before they began (not its launch latency; unknown: -1)
        launched = launch_ns[pieces.before] if launch_ns is not None else np.full(pieces.before.size, -1)
        queued = (pieces.part == _OTHER) & (launched >= 0) & (launched < pieces.lo)
        out.append(
            StreamIdle(
                stream=int(sid),
                busy=Coverage.of(st, en).between(a, b),
                compute=Coverage.of(start[comp].astype(np.int64), end[comp].astype(np.int64)).between(a, b),
                ops=(np.searchsorted(st, b) - np.searchsorted(st, a)).astype(np.int64),
                parts=tuple(parts),
                queued=_uncovered(pieces.lo[queued], pieces.hi[queued], busy, a, b),
            )
        )
    return out


def _uncovered(lo: I64, hi: I64, busy: Coverage, a: I64, b: I64) -> I64:
    """Per window ``[a, b)``: the time inside the disjoint pieces ``[lo, hi)`` (by start) that ``busy``
    does not cover."""
    out = np.zeros(a.size, dtype=np.int64)
    for k, (wa, wb) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        i, j = np.searchsorted(hi, wa, side="right"), np.searchsorted(lo, wb, side="left")
        clo, chi = np.maximum(lo[i:j], wa), np.minimum(hi[i:j], wb)
        if clo.size:
            out[k] = int((chi - clo).sum() - busy.between(clo, chi).sum())
    return out


def model_ends(run: RunTrace, rank: int) -> I64:
    """Each row's recorded end as the model takes it (:func:`rank_ends` of the run's model)."""
    return rank_ends(run.ranks[rank], execution_model(run).ranks[rank])


def rank_ends(rt: RankTrace, m: RankModel) -> I64:
    """Each row's recorded end as the model takes it: a hidden wait's completion recorded after the wait
    ended is that wait's end (:attr:`RankModel.end_clamp_rows`); what an unmodified replay reproduces."""
    end = rt.start_ns + rt.dur_ns
    end[m.end_clamp_rows] = m.end_clamp_ns
    return end


def compute_rows(rt: RankTrace, m: RankModel) -> B:
    """Per row: its work is the program's compute. COMP rows but wait nodes (blocked on communication,
    then a wait op's own overhead), the capture's untraced host time (idle) and NCCL kernels kept as COMP
    (:func:`nccl_kernel_rows`: communication), plus each ``host_work`` node (its work after the wait it
    hid). What a slowdown's compute factor scales, and (with the ``host_work`` nodes' part after their
    wait) what :func:`compute_intervals` measures."""
    return comp_kinds(rt, m).work | m.host_work


def row_compute_ns(rt: RankTrace, m: RankModel, start: I64, end: I64) -> I64:
    """Per row, given each row's ``start`` and ``end`` (recorded, or replayed): how much of it is the
    program's compute, the last that long before its end. A :func:`compute_rows` row's whole span, but a
    ``host_work`` node's work after the wait it hid (its last ``work_ns``, at most its span); 0 elsewhere.
    :func:`compute_intervals` row by row, as the Parquet export's ``model`` table holds it."""
    span = np.maximum(end - start, 0)
    own = np.where(m.host_work, np.clip(m.work_ns, 0, span), span)
    return np.where(compute_rows(rt, m), own, 0).astype(np.int64)


def compute_intervals(rt: RankTrace, m: RankModel, start: I64, end: I64) -> tuple[I64, I64]:
    """A rank's compute, as intervals ``[starts, ends)`` (overlapping, unsorted) given each row's
    ``start`` and ``end`` (recorded, or replayed): the last :func:`row_compute_ns` of each of its
    :func:`compute_rows` (empty ones left out). The analyses' breakdown and the replay's summary both
    measure compute as this union."""
    own = row_compute_ns(rt, m, start, end)
    rows = np.flatnonzero(own > 0)
    return end[rows] - own[rows], end[rows]


def model_columns(run: RunTrace) -> Iterator[tuple[int, dict[str, I64]]]:
    """Per rank, in rank order, the model's reading of each row as the Parquet export's ``model`` table
    holds it (``skewlens.profiler.store.schema.ModelRecord``): its ``node_id``, its end
    (:func:`model_ends`) and its compute (:func:`row_compute_ns` with those ends), what ``skewlens
    analyze`` measures a member's end and exposed wait with; so that the SQL over the export
    (``collective_skew.sql``) reads the model rather than guess it from node names."""
    em = execution_model(run)
    for r, rt in sorted(run.ranks.items()):
        m = em.ranks[r]
        end = rank_ends(rt, m)
        yield r, {"node_id": rt.node_id, "end_ns": end, "compute_ns": row_compute_ns(rt, m, rt.start_ns, end)}


def blocked_on_gpu_rows(rt: RankTrace, m: RankModel) -> B:
    """Per row: a host row blocked on the GPU (a synchronise, a blocking copy: a host-sync destination
    waiting on a GPU row). While blocked it is not busy by itself: that time is the GPU's, communication
    where an NCCL kernel runs, compute where kernels do, idle where the GPU idles too."""
    out = np.zeros(len(rt), dtype=np.bool_)
    out[m.wait_dst] = True
    out[m.wait_dst[rt.is_cpu[m.wait_src]]] = False
    return out


def comm_intervals(rt: RankTrace, m: RankModel, start: I64, end: I64) -> tuple[I64, I64]:
    """A rank's communication ``M`` as intervals (overlapping, unsorted), given each row's ``start`` and
    ``end`` (recorded, or replayed): communication nodes and wait nodes while blocked (a ``host_work``
    node only until its own work after the wait begins, a host row blocked on the GPU not at all), and NCCL
    kernels kept as COMP (:func:`nccl_kernel_rows`: communication nothing can match). The analyses'
    breakdown and the replay's summary both measure communication as this union."""
    gpu_only = blocked_on_gpu_rows(rt, m)
    comm = type_mask(rt.node_type, COMM_NODE_TYPES)
    k = comp_kinds(rt, m)
    like = ((comm | k.wait) & ~m.host_work & ~gpu_only) | k.comm
    hw = np.flatnonzero(m.host_work)
    hw_at = np.clip(end[hw] - m.work_ns[hw], start[hw], end[hw])
    return np.concatenate([start[like], start[hw]]), np.concatenate([end[like], hw_at])


def busy_intervals(rt: RankTrace, m: RankModel, start: I64, end: I64) -> tuple[I64, I64]:
    """A rank's busy time ``M ∪ C`` as intervals: its communication, compute, NCCL-kernel and wait rows
    (not a host row while blocked on the GPU: :func:`blocked_on_gpu_rows`), each whole."""
    k = comp_kinds(rt, m)
    busy = type_mask(rt.node_type, COMM_NODE_TYPES) | k.work | k.comm | (k.wait & ~blocked_on_gpu_rows(rt, m))
    return start[busy], end[busy]


def exposed_parts(
    comp: Coverage, busy: Coverage, wait_comp: Coverage, a: I64, b: I64
) -> tuple[I64, I64, I64, I64]:
    """``(compute, busy, exposed wait, exposed transfer)`` ns within each window ``[a, b)``, from the
    compute ``C``, busy ``M ∪ C`` (:func:`busy_intervals`) and ``W ∪ C`` (``W``: each member's wait for
    peers, ``[arrival, awaited arrival)``): ``|C|``, ``|M ∪ C|``, ``|W \\ C|`` (at most the exposed
    communication ``|M ∪ C| - |C|``) and the rest of the exposed communication. The one rule of the
    analyses' breakdown and the replay's summary."""
    comp_ns = comp.between(a, b)
    busy_ns = busy.between(a, b)
    exposed = busy_ns - comp_ns
    wait = np.minimum(wait_comp.between(a, b) - comp_ns, exposed)
    return comp_ns, busy_ns, wait, exposed - wait


def union_intervals(starts: I64, ends: I64) -> tuple[I64, I64]:
    """Merge intervals ``[start, end)`` into disjoint ones, sorted."""
    if starts.size == 0:
        return starts, ends
    o = np.argsort(starts, kind="stable")
    st, en = starts[o], ends[o]
    reach = np.maximum.accumulate(en)
    new = np.ones(st.size, dtype=np.bool_)
    new[1:] = st[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return st[idx], np.maximum.reduceat(en, idx)


@dataclass(eq=False, kw_only=True, slots=True)
class Coverage:
    """Union of intervals as sorted disjoint ``[starts, ends)`` with cumulative covered length."""

    starts: I64
    """Starts of the disjoint intervals, ascending."""
    ends: I64
    """Ends of the disjoint intervals."""
    cum: I64
    """Covered length before interval ``i`` (length ``len(starts) + 1``)."""

    EMPTY: ClassVar[Coverage]

    @staticmethod
    def of(starts: I64, ends: I64) -> Coverage:
        """Union of the intervals ``[starts[i], ends[i])`` (empty ones are dropped)."""
        keep = ends > starts
        us, ue = union_intervals(starts[keep], ends[keep])
        cum = np.zeros(us.size + 1, dtype=np.int64)
        np.cumsum(ue - us, out=cum[1:])
        return Coverage(starts=us, ends=ue, cum=cum)

    def upto(self, t: I64) -> I64:
        """Covered length in ``(-inf, t)`` for each ``t``."""
        t = np.asarray(t, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(t.shape, dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        ic = np.clip(i, 0, None)
        inside = np.minimum(t, self.ends[ic]) - self.starts[ic]
        return np.where(i >= 0, self.cum[ic] + inside, 0).astype(np.int64)

    def idle_before(self, t: I64) -> I64:
        """Length of the uncovered stretch that ends at ``t`` (0 when ``t`` is inside an interval)."""
        t = np.asarray(t, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(t.shape, dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="left") - 1
        ic = np.clip(i, 0, None)
        return np.where(i >= 0, np.maximum(t - self.ends[ic], 0), 0).astype(np.int64)

    def upto_one(self, t: int) -> int:
        """:meth:`upto` for one time (no array overhead)."""
        i = int(np.searchsorted(self.starts, t, side="right")) - 1
        if i < 0:
            return 0
        return int(self.cum[i]) + min(t, int(self.ends[i])) - int(self.starts[i])

    def between(self, a: I64, b: I64) -> I64:
        """Covered length inside ``[a, b)`` for each pair."""
        return np.maximum(self.upto(b) - self.upto(a), 0)

    @property
    def total_ns(self) -> int:
        return int(self.cum[-1])


Coverage.EMPTY = Coverage.of(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


#: Least contradiction :func:`clock_note` reports: below it, the recorded ends' own imprecision (a gloo
#: worker's end seen 0.5 ms early on one host), which changes a skew by less than the reports show.
CLOCK_NOTE_NS = 1_000_000


#: Rooted collectives whose members do not all wait for each other (:func:`waits_for`): a member of a
#: broadcast or scatter needs only the root's data, a member of a gather only sends to the root (only the
#: root needs everyone's). gloo lets such members finish before the others arrive.
_ROOT_SENDS = frozenset({CommType.BROADCAST, CommType.SCATTER})
_ROOT_GETS = frozenset({CommType.GATHER, CommType.REDUCE})


def root_member(run: RunTrace, comm_type: CommType, ranks: Sequence[int], rows: Sequence[int]) -> int:
    """Index among a collective's members (``ranks``, ``rows``) of its root (``comm_src`` of a broadcast /
    scatter, ``comm_dst`` of a gather / reduce, as the capture records it); -1 where unknown or not
    rooted."""
    if comm_type not in _ROOT_SENDS and comm_type not in _ROOT_GETS:
        return -1
    rt = run.ranks[ranks[0]]
    root = int((rt.src if comm_type in _ROOT_SENDS else rt.dst)[rows[0]])
    return list(ranks).index(root) if root in ranks else -1


def waits_for(comm_type: CommType, root: int, n: int) -> tuple[int, ...]:
    """The wait rule of a collective of ``n`` members whose root is member ``root`` (-1: unknown): per
    member, the member whose arrival its transfer waits for, -1 for the last arrival, its own index for
    none. Every member waits for the last arrival, but with a known root: a broadcast member waits for the
    root, the root for no one (it pushes its data down a tree or ring); a scatter or gather member waits for
    the root (gloo moves a buffer only once both ends have posted it), the root for the last arrival (it
    waits for every piece). A reduce keeps the last arrival for all (gloo's and NCCL's reduce pass partial
    sums through the non-roots). ``docs/execution.md`` says why, with what a gloo capture showed."""
    if root < 0 or comm_type not in _ROOT_SENDS | _ROOT_GETS or comm_type == CommType.REDUCE:
        return (-1,) * n
    if comm_type == CommType.BROADCAST:
        return (root,) * n
    return tuple(-1 if k == root else root for k in range(n))


def collective_waits_for(
    run: RunTrace, comm_type: CommType, ranks: Sequence[int], rows: Sequence[int]
) -> tuple[int, ...]:
    """:func:`waits_for` of a collective's members ``ranks`` / ``rows`` (loaded ranks), its root as the
    capture recorded it (a root among no loaded member is unknown); an all_reduce, all_gather,
    reduce_scatter or reduce whose members' calls are all empty: each member waits for no one
    (:data:`EMPTY_WAITS_FOR_NONE`)."""
    if not ranks:
        return ()
    if comm_type in EMPTY_WAITS_FOR_NONE and all(
        int(run.ranks[r].comm_bytes[w]) == 0 for r, w in zip(ranks, rows, strict=True)
    ):
        return tuple(range(len(ranks)))
    return waits_for(comm_type, root_member(run, comm_type, ranks, rows), len(ranks))


def awaited_arrivals(rule: Sequence[int], arrivals: Sequence[int]) -> list[int]:
    """Per member of a sync group, the arrival its transfer waits for under ``rule`` (:func:`waits_for`):
    the later of its own and the awaited member's (or the last) arrival. Its wait for peers is this less
    its own arrival; its transfer, its end less this."""
    last = max(arrivals)
    return [last if w < 0 else max(a, arrivals[w]) for a, w in zip(arrivals, rule, strict=True)]


def awaited_member(rule: Sequence[int], arrivals: Sequence[int], k: int) -> int:
    """The member whose arrival member ``k``'s transfer waits for under ``rule``: the last to arrive (the
    first of them), the root, or ``k`` itself where it waits for no one."""
    w = rule[k]
    return int(np.argmax(arrivals)) if w < 0 else w


def held_by(rule: Sequence[int]) -> int:
    """The member whose arrival the others wait for under ``rule`` (:func:`waits_for`) where that is not
    the last arrival (a broadcast's, scatter's or gather's known root), else -1 (the last to arrive)."""
    return next((w for k, w in enumerate(rule) if w >= 0 and w != k), -1)


def eager_sends(run: RunTrace) -> list[SyncGroup]:
    """The send/recv pairs whose send the model detaches from its recv (eager: done before the recv
    arrived): the send waits for no one. The one rule the analyses, the critical path and the replay's
    summary read (the SQL restates it, held equal by ``tests/test_skew_sql.py``)."""
    return [g for g in execution_model(run).syncs if g.is_p2p and g.detached[0]]


def eager_send_rows(run: RunTrace) -> dict[int, B]:
    """Per rank, whether each row is an eager send (:func:`eager_sends`): its wait for peers is 0 wherever
    one is measured (the analyses' ``wait_ns``, the replay's summary and timeline, the SQL's). (A
    collective member detached by clocks that contradict each other keeps its wait, which the analyses
    flag as not meaningful.)"""
    out = {r: np.zeros(len(rt), dtype=np.bool_) for r, rt in run.ranks.items()}
    for g in eager_sends(run):
        out[g.ranks[0]][g.rows[0]] = True
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockContradiction:
    """A sync group whose recorded times contradict each other (:func:`clock_contradictions`)."""

    is_p2p: bool
    """True for a send/recv pair, False for a collective instance."""
    index: int
    """Index into ``run.collectives`` or ``run.p2p``."""
    by_ns: int
    """How much earlier the member was done than the arrival it waits for."""
    where: str
    """Where, in words: the group and the two members."""


def clock_contradictions(run: RunTrace) -> list[ClockContradiction]:
    """Collective members recorded as done before the arrival they wait for (:func:`waits_for`: the last,
    or a rooted collective's root; the model detaches them) and recvs recorded as done before their send
    began, by more than :data:`CLOCK_NOTE_NS`, in sync group order."""
    out: list[ClockContradiction] = []
    for g in execution_model(run).syncs:
        if not g.is_p2p and not any(g.detached):  # a collective member is detached only by its clock
            continue
        rts = [run.ranks[r] for r in g.ranks]
        starts = [int(rt.start_ns[w]) for rt, w in zip(rts, g.rows, strict=True)]
        ends = [int(rt.start_ns[w] + rt.dur_ns[w]) for rt, w in zip(rts, g.rows, strict=True)]
        if g.is_p2p:  # (send, recv): a recv cannot complete before its send began
            early, last = 1, 0
            if ends[early] == starts[early]:  # recorded without an end (a zero-length one's was not seen)
                continue
            pg = f"{run.p2p[g.index].pg_name!r}"
        else:  # of the members whose end was seen (a zero-length one's was not)
            seen = [k for k, d in enumerate(g.detached) if d and ends[k] > starts[k]]
            if not seen:
                continue
            c = run.collectives[g.index]
            pg = f"{c.pg_name!r} seq {c.seq}"
            early = min(seen, key=lambda k: ends[k])
            last = awaited_member(g.waits_for, starts, early)
        late = starts[last] - ends[early]
        if late <= CLOCK_NOTE_NS:
            continue
        who = f"rank {g.ranks[early]} done {late / 1e6:.1f} ms before rank {g.ranks[last]} began"
        out.append(ClockContradiction(is_p2p=g.is_p2p, index=g.index, by_ns=late, where=f"group {pg}: {who}"))
    return out


#: Least drift :func:`clock_drifts` reports: under it, the spread of the ends of collectives that finish
#: together (on one host, under load, their medians over a third of a run moved by 0.1 ms).
CLOCK_DRIFT_NOTE_NS = 2_000_000

#: How many times the ends' own spread (the median distance from their median, at either end of the run)
#: a drift must exceed: on one clock, 4 gloo ranks of 2 torchrun under load, the ends of 15 collectives
#: were 1-4 ms apart (one 12.7), and the medians of the first 5 and the last 5 differed by 2.1 ms.
_DRIFT_SPREADS = 4

#: Fewest collectives at each end of the run :func:`clock_drifts` compares (a median of fewer is one
#: slow end), and a tenth of them where there are more.
_DRIFT_EDGE = 5

#: Collectives whose members finish together, within the last transfer: the ends of a rooted one
#: (broadcast, reduce, gather, scatter) differ by design, and an all_to_all's member ends when its own
#: pieces have come (on 2 ranks sampled from a 128-GPU run, 80 ms apart over 7 instances).
_FINISH_TOGETHER = frozenset(
    {
        CommType.ALL_REDUCE,
        CommType.ALL_GATHER,
        CommType.REDUCE_SCATTER,
        CommType.REDUCE_SCATTER_BLOCK,
        CommType.BARRIER,
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockDrift:
    """A rank whose clock moved against the reference rank's over the run (:func:`clock_drifts`)."""

    rank: int
    against: int
    """The reference: the run's lowest rank (rank 0 in a capture, whose clock the offsets align to)."""
    by_ns: int
    """How much the rank's clock gained on the reference's from the run's first collectives to its last
    (negative: lost)."""
    over_ns: int
    """Between those, on the reference's clock."""
    samples: int
    """Collectives compared."""


def clock_drifts(run: RunTrace) -> list[ClockDrift]:
    """Ranks whose clocks drift against the lowest rank's, largest first. The members of an all_reduce
    (all_gather, reduce_scatter, barrier) finish together, so the difference of their recorded
    ends is the difference of their clocks then; a capture measures each rank's offset once, at the
    window's start, so a difference that grows over the run is a clock running fast or slow (or stepped)
    on the rank's host, which the offset does not correct. Compared: the median difference over the
    first tenth (5 at least) of such collectives the two ranks share, against that over the last tenth (of
    a pair of ranks sharing fewer than three times that, none), reported past :data:`CLOCK_DRIFT_NOTE_NS`
    and past :data:`_DRIFT_SPREADS` times the differences' own spread about those medians."""
    if len(run.ranks) < 2:
        return []
    ref = min(run.ranks)
    member_ranks: list[int] = []
    member_rows: list[int] = []
    sizes: list[int] = []
    for g in execution_model(run).syncs:
        if g.is_p2p or run.collectives[g.index].comm_type not in _FINISH_TOGETHER or ref not in g.ranks:
            continue
        member_ranks += g.ranks
        member_rows += g.rows
        sizes.append(len(g.ranks))
    if not sizes:
        return []
    ranks = np.array(member_ranks, dtype=np.int64)
    rows = np.array(member_rows, dtype=np.int64)
    sync = np.repeat(np.arange(len(sizes)), sizes)
    ends = np.zeros(len(ranks), dtype=np.int64)
    seen = np.zeros(len(ranks), dtype=bool)
    for r in np.unique(ranks).tolist():
        at = ranks == r
        rt = run.ranks[r]
        ends[at] = rt.start_ns[rows[at]] + rt.dur_ns[rows[at]]
        seen[at] = rt.dur_ns[rows[at]] > 0  # a zero-length member's end was not seen
    whole = np.bincount(sync, weights=~seen, minlength=len(sizes)) == 0
    is_ref = ranks == ref
    ref_end = np.zeros(len(sizes), dtype=np.int64)
    ref_end[sync[is_ref]] = ends[is_ref]
    keep = whole[sync] & ~is_ref
    k_ranks, k_times = ranks[keep], ref_end[sync[keep]]
    k_diffs = (ends - ref_end[sync])[keep].astype(np.float64)
    out: list[ClockDrift] = []
    for r in np.unique(k_ranks).tolist():
        at = k_ranks == r
        order = np.argsort(k_times[at], kind="stable")
        times, diffs = k_times[at][order], k_diffs[at][order]
        edge = max(_DRIFT_EDGE, len(diffs) // 10)
        if len(diffs) < 3 * edge:
            continue
        first, last = diffs[:edge], diffs[-edge:]
        by = round(float(np.median(last) - np.median(first)))
        over = round(float(np.median(times[-edge:]) - np.median(times[:edge])))
        # the ends' own spread about each median (a gloo worker's end seen ms late under load)
        spread = float(np.median(np.abs(np.concatenate([first - np.median(first), last - np.median(last)]))))
        if abs(by) > max(CLOCK_DRIFT_NOTE_NS, _DRIFT_SPREADS * spread):
            out.append(ClockDrift(rank=r, against=ref, by_ns=by, over_ns=over, samples=len(diffs)))
    return sorted(out, key=lambda d: -abs(d.by_ns))


def _drift_note(found: list[ClockDrift]) -> str:
    worst = found[0]
    by_ms = abs(worst.by_ns) / 1e6
    ppm = f" ({abs(worst.by_ns) / worst.over_ns * 1e6:,.0f} ppm)" if worst.over_ns > 0 else ""
    others = f" and {len(found) - 1} other rank(s)" if len(found) > 1 else ""
    return (
        f"clocks drift: rank {worst.rank}'s clock {'gained' if worst.by_ns > 0 else 'lost'} {by_ms:.1f} ms "
        f"on rank {worst.against}'s over {worst.over_ns / 1e9:.1f} s{ppm}{others}: the ends of the "
        f"{worst.samples} collectives they share, which finish together, moved apart from the first of them "
        "to the last (a host clock running fast or slow, or set while it ran); the offsets align the clocks "
        f"at the window's start only, so the skew and waits between those ranks late in the run are off by "
        f"about {by_ms:.1f} ms (near the start, by less)"
    )


def clock_note(run: RunTrace) -> str | None:
    """What the traces' clocks contradict (:func:`clock_contradictions`) and how far they drift apart
    (:func:`clock_drifts`), in one line, or None. Such times come from clocks that disagree (traces of
    hosts without a common clock, an import without alignment, a host's clock running fast): their skew
    and waits are not meaningful."""
    found = clock_contradictions(run)
    drifts = clock_drifts(run)
    if not found and not drifts:
        return None
    said: list[str] = []
    if found:
        worst = max(found, key=lambda c: c.by_ns)  # the first of the largest
        said.append(
            f"clocks disagree: {len(found)} of {len(execution_model(run).syncs)} collectives and p2p pairs "
            f"have a member recorded as done before another began (worst: {worst.where}); the ranks' clocks "
            "are not aligned (traces of hosts without a common clock?): the skew and waits of those are not "
            "meaningful, and a replay keeps such members' recorded times"
        )
    if drifts:
        said.append(_drift_note(drifts))
    return "; ".join(said)


def _sync_groups(run: RunTrace) -> tuple[SyncGroup, ...]:
    out: list[SyncGroup] = []
    for ci, c in enumerate(run.collectives):
        members = [(r, row) for r, row in zip(c.ranks, c.rows, strict=True) if r in run.ranks]
        if members:
            rs, ws = zip(*members, strict=True)
            starts = [int(run.ranks[r].start_ns[w]) for r, w in members]
            ends = [int(run.ranks[r].start_ns[w] + run.ranks[r].dur_ns[w]) for r, w in members]
            rule = collective_waits_for(run, c.comm_type, rs, ws)
            # a member recorded as done before the arrival it waits for (clock error between the ranks'
            # traces: it cannot complete before then) keeps its recorded time
            awaited = awaited_arrivals(rule, starts)
            out.append(
                SyncGroup(
                    is_p2p=False,
                    index=ci,
                    ranks=rs,
                    rows=ws,
                    detached=tuple(e + SKEW_NS < a for e, a in zip(ends, awaited, strict=True)),
                    waits_for=rule,
                )
            )
    for pi, p in enumerate(run.p2p):
        if p.src_rank not in run.ranks or p.dst_rank not in run.ranks:
            continue
        s, d = run.ranks[p.src_rank], run.ranks[p.dst_rank]
        send_end = int(s.start_ns[p.src_row] + s.dur_ns[p.src_row])
        eager = send_end <= int(d.start_ns[p.dst_row]) + SKEW_NS
        out.append(
            SyncGroup(
                is_p2p=True,
                index=pi,
                ranks=(p.src_rank, p.dst_rank),
                rows=(p.src_row, p.dst_row),
                detached=(eager, False),
                waits_for=(-1, -1),
            )
        )
    return tuple(out)


def _comm_streams(rt: RankTrace, valid: B) -> set[int]:
    """Host streams that carry the work of asynchronous communication: they hold only communication
    nodes, and some of them depend on a node of another stream (the thread that issued them). A thread
    that runs only blocking collectives is not one."""
    rows = np.flatnonzero(valid)
    if rows.size == 0:
        return set()
    is_comm = type_mask(rt.node_type, COMM_NODE_TYPES)[rows]
    other = ~is_comm | ~rt.is_cpu[rows]  # rows that rule their stream out
    if other.all():  # the usual case of a rank without communication of its own streams
        return set()
    streams = rt.stream[rows]
    cand = np.setdiff1d(np.unique(streams), np.unique(streams[other]))
    if cand.size == 0:
        return set()
    n = len(rt)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(rt.dep_ptr))
    src = rt.dep_idx.astype(np.int64, copy=False)
    cross = rt.stream[src] != rt.stream[dst]
    issued = np.unique(rt.stream[dst[cross]])
    return set(np.intersect1d(cand, issued).tolist())


def _timelines(rt: RankTrace, valid: B, end: I64, comm_streams: set[int], *, merge: bool) -> I64:
    """Timeline of each row: its stream, with host streams that never run concurrently merged into one
    where ``merge`` (the run's stream ids are not threads).

    One rule, by the run's manifest source: a capture's (and a real replay's) host streams are threads,
    one stream per thread (:data:`~skewlens.profiler.manifest.THREAD_STREAM_SOURCES`), and are never
    merged: two threads that took turns by chance (a checkpoint thread's gather just after a prefetch
    thread's broadcast) keep no program order between them; what ties them is recorded (autograd's
    device threads' joins, control dependencies). Elsewhere (an imported profile, whose host events
    come from several sources: the autograd engine thread and the main thread of the 8-GPU DLRM trace
    take turns with nothing recorded between them) streams whose busy times overlap by at most
    ``MERGE_OVERLAP`` of the less busy one are taken as one thread, so program order holds across them.
    Communication streams are never merged.
    """
    tl = rt.stream.astype(np.int64, copy=True)
    if not merge:
        return tl
    rows = np.flatnonzero(valid)
    on = rt.stream[rows]
    if on.size == 0 or (on == on[0]).all():  # one stream (cheaper to see than to sort the rows' streams)
        return tl
    streams = np.unique(on)
    info = []
    for sid in streams.tolist():
        if sid in comm_streams:
            continue
        m = rows[rt.stream[rows] == sid]
        a, b = union_intervals(rt.start_ns[m], end[m])
        info.append((int(rt.start_ns[m].min()), int(sid), bool(rt.is_cpu[m].all()), a, b))
    info.sort(key=lambda x: (x[0], x[1]))
    groups: list[tuple[int, I64, I64]] = []  # host groups: (representative stream, union starts, ends)
    for _first, sid, host, a, b in info:
        if not host:
            continue
        busy = int((b - a).sum())
        for k, (rep, ga, gb) in enumerate(groups):
            ua, ub = union_intervals(np.concatenate([ga, a]), np.concatenate([gb, b]))
            g_busy = int((gb - ga).sum())
            inter = g_busy + busy - int((ub - ua).sum())
            if inter <= MERGE_OVERLAP * min(g_busy, busy):
                groups[k] = (rep, ua, ub)
                tl[rt.stream == sid] = rep
                break
        else:
            groups.append((sid, a, b))
    return tl


def _latest_ending(e: I64, runmax: I64) -> I64:
    """For each ``k``, the index of the latest-ending of ``e[:k + 1]`` (the last one, on ties; ``runmax``:
    ``e``'s running maximum)."""
    return np.maximum.accumulate(np.where(e == runmax, np.arange(e.size), 0))


def _host_queue(q: I64, end: I64) -> tuple[I64, I64]:
    """Queue edges of a host communication stream (``q``: its collectives in issue order).

    gloo runs a group's collectives on two worker threads (``ProcessGroupGloo``'s default), taking them in
    issue order, each onto the thread that comes free first. So a collective's transfer waits for the
    earlier-ending of the two collectives that may still run before it: the previous one, and the
    latest-ending one before that (``q[i]`` waits for ``q[i - 1]`` or for the latest-ending of
    ``q[:i - 1]``, whichever ended first; the first two wait for nothing). Two consecutive collectives
    can so overlap, and the later one end first, as recorded.
    """
    if q.size <= 2:
        return q[:0], q[:0]
    e = end[q]
    i = np.arange(2, q.size)
    far = _latest_ending(e, np.maximum.accumulate(e))[i - 2]
    dep = np.where(e[i - 1] <= e[far], i - 1, far)
    return q[dep], q[i]


def _along_comm_stream(rt: RankTrace, src: I64, dst: I64, comm_streams: set[int]) -> B:
    """Which edges ``(src, dst)`` join two rows of one communication stream (its queue order)."""
    on_comm = np.isin(rt.stream, list(comm_streams))
    return on_comm[src] & on_comm[dst] & (rt.stream[src] == rt.stream[dst])


def _edges(
    rt: RankTrace, valid: B, end: I64, sync: B, comm_streams: set[int], *, merge: bool
) -> tuple[I64, I64, I64, I64, I64, tuple[I64, I64, I64, I64], I64]:
    """Candidate edges ``(src, dst)`` of one rank, the queue edges of communication streams, the nesting
    parent of each row, the recorded GPU dependencies: launches ``(src, dst)`` and host
    synchronisations ``(src, dst)`` (see the module docstring), and each row's timeline (``merge``: see
    :func:`_timelines`)."""
    n = len(rt)
    counts = np.diff(rt.dep_ptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), counts)
    src = rt.dep_idx.astype(np.int64, copy=False)
    keep = (src != dst) & valid[src] & valid[dst] if n else np.zeros(0, dtype=np.bool_)
    src, dst = src[keep], dst[keep]
    launch, host_sync = gpu_dependency_kinds(rt, src, dst)  # edges of their own kind
    gpu = (src[launch], dst[launch], src[host_sync], dst[host_sync])
    plain = ~launch & ~host_sync
    src, dst = src[plain], dst[plain]
    parent = np.full(n, -1, dtype=np.int64)
    # recorded program order along a communication stream is the stream's queue, not a start order; but a
    # host collective that no host row issued (no recorded dependency off its stream) was issued by the
    # completion of the one before it: a callback chained on its future (a DDP communication hook's
    # second collective, PowerSGD's P and Q all_reduces) issues it once that completed
    if comm_streams:
        along = _along_comm_stream(rt, src, dst, comm_streams)
        issued_off = np.zeros(n, dtype=np.bool_)
        issued_off[dst[~along]] = True
        issued_off[gpu[1]] = True  # a launched row: its launch issued it
        chained = along & ~issued_off[dst] & rt.is_cpu[dst] & (rt.node_type[dst] == int(NodeType.COMM_COLL))
        srcs, dsts = [src[~along | chained]], [dst[~along | chained]]
    else:
        srcs, dsts = [src], [dst]
    qsrcs: list[I64] = []
    qdsts: list[I64] = []
    rows = np.flatnonzero(valid)
    timeline = rt.stream.astype(np.int64)
    if rows.size:
        timeline = _timelines(rt, valid, end, comm_streams, merge=merge)
        order = rows[np.lexsort((rows, rt.start_ns[rows], timeline[rows]))]
        cuts = np.flatnonzero(np.diff(timeline[order])) + 1
        comm_rows = rows[sync[rows] & rt.is_cpu[rows]]  # host threads wait on host-side communication
        is_p2p = type_mask(rt.node_type, P2P_NODE_TYPES)
        for part in np.split(order, cuts):
            e = end[part]
            runmax = np.maximum.accumulate(e)
            if int(rt.stream[part[0]]) in comm_streams:
                # collectives queue (on a device stream behind the previous one, on the host on gloo's
                # worker threads); host p2p ops wait for nothing there
                q = part[~is_p2p[part] | ~rt.is_cpu[part]]
                qs, qd = _host_queue(q, end) if rt.is_cpu[q].all() else (q[:-1], q[1:])
                qsrcs.append(qs)
                qdsts.append(qd)
                continue
            if part.size >= 2:
                holder = _latest_ending(e, runmax)
                free = runmax[:-1]
                follows = free <= rt.start_ns[part[1:]]
                partial = e[1:] > free
                ok = follows | partial
                srcs.append(part[holder[:-1][ok]])
                dsts.append(part[1:][ok])
                # a nested row follows its enclosing one (a sync row inside one keeps its own times)
                nested = ~ok & ~sync[part[1:]]
                parent[part[1:][nested]] = part[holder[:-1][nested]]
            cs = comm_rows[timeline[comm_rows] != timeline[part[0]]]
            # one recorded without an end (a 0-length node at its issue end: nothing in the window saw it
            # complete) completed nowhere a host node could have waited for it
            cs = cs[rt.dur_ns[cs] > 0]
            if cs.size and rt.is_cpu[part].all():
                starts = rt.start_ns[part]
                done = end[cs]
                k = np.searchsorted(starts, done, side="left")
                inside = k < part.size
                cs, done, k = cs[inside], done[inside], k[inside]
                prev_end = runmax[np.maximum(k - 1, 0)]
                delta, idle = starts[k] - done, done - prev_end
                # a timeline's first row waited for nothing: no idle time of its thread is recorded before it
                # (said here, not left to ``done - _MIN`` overflowing int64 to a negative idle)
                waited = (k > 0) & (delta <= WAIT_SLACK_NS) & (delta * WAIT_RATIO <= idle)
                srcs.append(cs[waited])
                dsts.append(part[k[waited]])
    # resolve nesting to the outermost enclosing row
    for _ in range(64):
        p = parent[parent >= 0]
        up = parent[p]
        if not (up >= 0).any():
            break
        idx = np.flatnonzero(parent >= 0)
        parent[idx] = np.where(up >= 0, up, p)
    s = np.concatenate(srcs)
    d = np.concatenate(dsts)
    # dedupe (sort-based: cheaper than np.unique's hashing here; a stable sort merges the parts, each
    # mostly in row order, in about linear time)
    key = np.sort(d * max(n, 1) + s, kind="stable")
    if key.size:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    qs = np.concatenate(qsrcs) if qsrcs else np.zeros(0, dtype=np.int64)
    qd = np.concatenate(qdsts) if qdsts else np.zeros(0, dtype=np.int64)
    return key % max(n, 1), key // max(n, 1), qs, qd, parent, gpu, timeline


def _issue_edges(
    rt: RankTrace,
    *,
    valid: B,
    end: I64,
    timeline: I64,
    parent: I64,
    comm_streams: set[int],
    starts: tuple[I64, I64],
    queues: tuple[I64, I64],
    waits: B,
) -> tuple[I64, I64, I64]:
    """The issue edges of one rank (:attr:`RankModel.issue_src`), as ``(src, dst, offset)``: each host
    communication row recorded to start inside a host row of the thread that issued it (its own timeline;
    for one on a communication stream, the timeline of the latest-starting host row it depends on, by a
    start or queue edge), from the innermost such row: the last row of that thread begun before it that
    had not ended then (or ended at most ``SKEW_NS`` before: the trace sources' clocks disagree by that
    much, and a call made as the row ended reads as just after it), else the innermost row around it
    within that row's enclosing one (likewise: not ended, or ended at most ``SKEW_NS`` before). The offset
    is the recorded start's into that row, clamped to the row's duration (so a start recorded just past the
    row's end is its end). Not from a row it follows (a start edge from it: issued after it, within the
    clocks' error) nor from a wait node (its recorded duration is the wait, not work to scale)."""
    empty = np.zeros(0, dtype=np.int64)
    n = len(rt)
    is_comm = type_mask(rt.node_type, COMM_NODE_TYPES)
    cand = np.flatnonzero(valid & is_comm & rt.is_cpu)
    on_cs = np.isin(rt.stream, list(comm_streams)) if comm_streams else np.zeros(n, dtype=np.bool_)
    host = valid & rt.is_cpu & ~is_comm & ~on_cs
    if cand.size == 0 or not host.any():
        return empty, empty, empty
    # the issuing thread of each row (-1: none known)
    thread = np.where(on_cs, -1, timeline).astype(np.int64)
    known = ~on_cs
    es, ed = np.concatenate([starts[0], queues[0]]), np.concatenate([starts[1], queues[1]])
    k = host[es] & on_cs[ed]
    es, ed = es[k], ed[k]
    if es.size:
        o = np.lexsort((rt.start_ns[es], ed))  # by row, then its dependencies by start: the last wins
        es, ed = es[o], ed[o]
        last = np.append(ed[1:] != ed[:-1], True)
        thread[ed[last]] = timeline[es[last]]
        known[ed[last]] = True
    cand = cand[known[cand]]
    into = np.zeros(n, dtype=np.bool_)
    into[cand] = True
    into = into[starts[1]]  # (only the start edges into them: a set of every edge is large on big runs)
    follows = set(zip(starts[0][into].tolist(), starts[1][into].tolist(), strict=True))
    out_s: list[int] = []
    out_d: list[int] = []
    hr = np.flatnonzero(host)
    pos = np.full(n, -1, dtype=np.int64)  # a row's place among its thread's (set per thread, reset after)
    for tl in np.unique(thread[cand]).tolist():
        rows = hr[timeline[hr] == tl]
        rows = rows[np.argsort(rt.start_ns[rows], kind="stable")]
        if rows.size == 0:
            continue
        pos[rows] = np.arange(rows.size)
        st, en = rt.start_ns[rows], end[rows]
        on = cand[thread[cand] == tl]
        at = rt.start_ns[on]
        ks = np.searchsorted(st, at, side="left") - 1  # the last row begun before each
        for c, cs, kk in zip(on.tolist(), at.tolist(), ks.tolist(), strict=True):
            if kk < 0:
                continue
            r = int(rows[kk])
            if int(en[kk]) + SKEW_NS <= cs:  # ended before: the innermost row around it, within r's parent
                p = int(parent[r])
                if p < 0 or pos[p] < 0 or int(end[p]) + SKEW_NS <= cs:
                    continue
                seg = np.arange(int(pos[p]), kk + 1)
                seg = seg[en[seg] + SKEW_NS > cs]  # (as for the last row begun: the clocks' error)
                if seg.size == 0:
                    continue
                r = int(rows[seg[-1]])
            if waits[r] or (r, c) in follows:
                continue
            out_s.append(r)
            out_d.append(c)
        pos[rows] = -1
    s = np.asarray(out_s, dtype=np.int64)
    d = np.asarray(out_d, dtype=np.int64)
    off = np.clip(rt.start_ns[d] - rt.start_ns[s], 0, rt.dur_ns[s]).astype(np.int64)
    return s, d, off


def scaled_offsets(m: RankModel, rows: I32 | I64, off_ns: I64, work: I64) -> I64:
    """Per offset ``off_ns[k]`` into the work of row ``rows[k]``, given each row's replayed ``work``: scaled
    by that row's work factor (its replayed work over its recorded ``work_ns``: a slowdown, a
    ``dur_override``, calibration), within ``[0, work]`` of the row, rounded to the ns (a row without
    recorded work: the offset, within the row); an unchanged replay keeps the recorded offsets exactly
    (each lies within its row's recorded work). The one rule by which what a row does at a place inside it
    moves with the row's length: its issues (:func:`issue_offsets`), launches (:func:`launch_offsets`) and
    nested rows (:func:`nested_times`)."""
    now = work[rows].astype(np.int64)
    was = m.work_ns[rows]
    ratio = np.where(was > 0, now / np.maximum(was, 1), 1.0)  # (exact where unchanged: 1.0)
    scaled = np.where(now == was, off_ns, np.rint(off_ns * ratio).astype(np.int64))
    return np.clip(scaled, 0, np.maximum(now, 0)).astype(np.int64)


def issue_offsets(m: RankModel, dur: I64) -> I64:
    """Per issue edge (:attr:`RankModel.issue_src`), given each row's replayed duration ``dur``: its
    recorded offset scaled by its source row's work factor (:func:`scaled_offsets`). The one rule the
    simulator (``skewlens.replay.lower``) and the real replay's plan (both through :func:`issue_anchors`)
    and the analyses (:func:`issue_times`) read; an unchanged replay issues at the recorded offset exactly."""
    return scaled_offsets(m, m.issue_src, m.issue_off_ns, dur)


def launch_offsets(m: RankModel, work: I64) -> I64:
    """Per launch edge, given each row's replayed ``work``: the launch call's place after the wait before
    it (``launch_off_ns - launch_waited_ns``: after its source's start, or after its wait for a call after
    the wait, :attr:`RankModel.launch_after_wait`), scaled by its source's work factor
    (:func:`scaled_offsets`): a kernel launched 90% into an op that a replay halves is launched 45% into
    its recorded length after the op starts. A call made while its source waited (before or between its
    waits: :attr:`RankModel.launch_at_arrival`) lies in the wait, not the work, and one made inside a sync
    group's member (whose replayed length is its transfer's, not work) is where it was: as recorded. What
    :func:`launch_times` (the analyses) and the simulator's lowering (``skewlens.replay.lower``) read."""
    after = m.launch_off_ns - m.launch_waited_ns
    fixed = m.launch_at_arrival | m.sync[m.launch_src]
    return np.where(fixed, after, scaled_offsets(m, m.launch_src, after, work)).astype(np.int64)


def nested_times(rt: RankTrace, m: RankModel, work: I64) -> tuple[I64, I64, I64]:
    """The nested rows (:attr:`RankModel.parent`), their offsets into their enclosing row and their
    durations, given each row's replayed ``work``: ``(rows, offset_ns, dur_ns)``. A nested row moves with
    its enclosing row's work as an issue or launch inside it does: its recorded offset, and its recorded
    work, scaled by the enclosing row's work factor (:func:`scaled_offsets`), so a child of a scope a
    replay halves stays inside it; but a row whose own work the replay changes (a factor of its own: an
    ``op`` item naming it, a ``compute`` item scaling it; a ``dur_override``) lasts its own replayed work.
    A nested row inside an enclosing wait node's wait (recorded to start before its wait ended) keeps its
    recorded offset and lasts its own replayed work: that part of the row is the wait's, not its work's;
    one after the wait is that long after the wait (recorded) plus its scaled offset after it. So does one
    inside a sync group's member (its length is its transfer's).
    The simulator (``skewlens.replay.lower``) and the real replay's plan read this."""
    inner = np.flatnonzero(m.parent >= 0)
    outer = m.parent[inner].astype(np.int64)
    off = (rt.start_ns[inner] - rt.start_ns[outer]).astype(np.int64)
    waited = m.wait_in_ns[outer]
    in_work = (off >= waited) & ~m.sync[outer]
    after = scaled_offsets(m, outer, np.maximum(off - waited, 0), work)
    own = work[inner].astype(np.int64)
    was = m.work_ns[inner]
    follows = in_work & (own == was)  # its length is its enclosing row's to scale
    dur = np.where(follows, scaled_offsets(m, outer, was, work), own)
    return inner, np.where(in_work, waited + after, off).astype(np.int64), dur.astype(np.int64)


def issue_anchors(rt: RankTrace, m: RankModel, work: I64) -> tuple[I64, I64]:
    """Per issue edge, given each row's replayed ``work``: the top-level row its issue is timed from (its
    source; a nested source's enclosing row, from which nested rows are replayed) and how long after that
    row's start it is issued (a nested source's offset into its enclosing row, :func:`nested_times`, plus
    :func:`issue_offsets`). What the simulator's lowering and the real replay's plan both read."""
    src = m.issue_src.astype(np.int64)
    outer = np.where(m.parent[src] >= 0, m.parent[src], src).astype(np.int64)
    into = np.zeros(m.parent.shape[0], dtype=np.int64)
    if (m.parent[src] >= 0).any():
        inner, off, _dur = nested_times(rt, m, work)
        into[inner] = off
    return outer, (into[src] + issue_offsets(m, work)).astype(np.int64)


def issue_times(m: RankModel, start: I64, end: I64) -> I64:
    """Per issue edge, when it is met, given each row's ``start`` and ``end`` (recorded, or replayed): its
    source's start plus :func:`issue_offsets` of the source's replayed duration."""
    return start[m.issue_src] + issue_offsets(m, end - start)


def _wait_rows(rt: RankTrace) -> B:
    """COMP rows named as wait nodes (see :data:`WAIT_NODE_NAMES`)."""
    if not rt.names:
        return np.zeros(len(rt), dtype=np.bool_)
    is_wait_name = np.array([nm in WAIT_NODE_NAMES for nm in rt.names], dtype=np.bool_)
    return (rt.node_type == int(NodeType.COMP)) & is_wait_name[rt.name_idx]


def _gap_waits(
    rt: RankTrace,
    *,
    valid: B,
    end: I64,
    sync: B,
    comm_streams: set[int],
    src: I64,
    dst: I64,
    explicit: I64,
    peer_later: B,
) -> tuple[I64, I64]:
    """Inferred wait edges into host-time nodes: the ``collectives`` level's ``compute`` gaps and the
    ``ops``/``full`` levels' ``untraced`` time.

    Such a node stands for host time outside every traced call, so a wait the program did inside it
    (DDP's reducer waits for its gradient buckets at the end of backward, out of the hooks' and the
    profiler's sight) is hidden in it. The host-time node right after the step's last asynchronous
    collective issued from its thread (where DDP's backward ends: its last bucket is issued, then the
    reducer waits for all of them) that holds the completion of asynchronous collectives its thread issued
    before it, none of which a wait node waited for, is taken to have waited for the one that completed
    last: its work is what follows that completion (what it did before that completion counts as waiting).
    Torch's reducer waits for its buckets in turn, copying each back before it waits for the next, so a
    later host-time node of the step that holds (by the same rule) the completion of one of them not yet
    waited for waited for it too: a DDP backward of two buckets at the ``ops`` level holds a wait for each.
    Where none was recorded inside it, the completion recorded soonest after the node ended, up to
    ``LAG_SLACK_NS`` after, while the node had run ``WAIT_RATIO`` times longer than that before it, is
    held: gloo's worker records a collective's end after it has completed the work the program waits on.
    The program saw it complete by the node's end, so that is its end in the model
    (:attr:`RankModel.end_clamp_rows`).

    A step may hold several such waits (gradient accumulation without ``no_sync``, two DDP models each with
    its own backward): the host-time node right after an earlier issue of the step (before the next one)
    waited too where it holds the completion of every collective its thread issued up to there that had
    not completed before it began, and the one that completed last had a member arrive after this rank's
    (``peer_later``: a peer kept it waiting, which compute overlapping a bucket's transfer during backward
    does not show). Other host-time nodes overlap communication (DDP's buckets during backward) and wait for
    nothing.

    Returns the edges' sources and dependants.
    """
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if not comm_streams:
        return none
    gaps = np.flatnonzero(valid & host_time_rows(rt))
    on_comm = np.isin(rt.stream, list(comm_streams))
    coll = sync & on_comm & (rt.node_type == int(NodeType.COMM_COLL))
    coll[explicit] = False
    # the thread each async collective was issued from: the stream of its start-edge sources
    issued = coll[dst] & ~on_comm[src]
    if gaps.size == 0 or not issued.any():
        return none
    c_rows, first = np.unique(dst[issued], return_index=True)
    c_stream = rt.stream[src[issued]][first]
    out_s: list[int] = []
    out_d: list[int] = []
    for stream in np.unique(rt.stream[gaps]).tolist():
        mine = c_rows[c_stream == stream]
        if mine.size == 0:
            continue
        g_rows = gaps[rt.stream[gaps] == stream]
        g_rows = g_rows[np.argsort(rt.start_ns[g_rows], kind="stable")]
        g_start = rt.start_ns[g_rows]
        for step in np.unique(rt.step[mine]).tolist():
            cs = mine[rt.step[mine] == step]
            cs = cs[np.argsort(rt.start_ns[cs], kind="stable")]
            c_start, c_end = rt.start_ns[cs], end[cs]
            waited = np.zeros(cs.size, dtype=np.bool_)
            for j in range(cs.size):
                k = int(np.searchsorted(g_start, c_start[j], side="left"))
                if k == g_rows.size:
                    break
                g = int(g_rows[k])
                a, b = int(rt.start_ns[g]), int(end[g])
                last = j == cs.size - 1
                if not last and c_start[j + 1] <= a:
                    continue  # the next issue came first: this node is not the one right after issue j
                late = c_end - b
                held = (late <= 0) | ((late <= LAG_SLACK_NS) & (late * WAIT_RATIO <= c_end - a))
                issued = np.arange(cs.size) <= j
                if last:
                    # completions recorded inside it, else the one recorded soonest after (the lag)
                    running = np.flatnonzero(issued & (c_end > a) & (c_start <= a) & held)
                    inside = running[late[running] <= 0]
                    if inside.size == 0 and running.size:
                        inside = running[[np.argmin(late[running])]]
                else:
                    inside = np.flatnonzero(issued & (c_end > a) & ~waited)
                    if not held[inside].all():
                        continue
                if inside.size:
                    c = int(cs[inside[np.argmax(c_end[inside])]])
                    if not last and not peer_later[c]:
                        continue
                    out_s.append(c)
                    out_d.append(g)
                    waited[inside] = True
                elif not last:
                    continue
                if last:
                    # torch's reducer waits for its buckets in turn, copying each back
                    # (``copy_bucket_to_grad``) before it waits for the next: a later host-time node of the
                    # step that holds a completion not yet waited for, by the same rule, waited for it too;
                    # so where the node right after the last issue held none (the first bucket had completed
                    # during backward, and a sliver of untraced time came before its copy: a rank whose peer
                    # was late before its backward), its wait for the last bucket was host time before
                    # (2 gloo ranks, a 30 ms sleep between forward and backward on rank 1: rank 0's 18-59 ms
                    # waits were fixed host time, and the what-if charged rank 1 nothing)
                    later = g_rows[k + 1 :]
                    for g in later[rt.step[later] == step].tolist():
                        if waited.all():
                            break
                        a, b = int(rt.start_ns[g]), int(end[g])
                        late = c_end - b
                        held = (late <= 0) | ((late <= LAG_SLACK_NS) & (late * WAIT_RATIO <= c_end - a))
                        running = np.flatnonzero(~waited & (c_end > a) & held)
                        if running.size == 0:
                            continue
                        inside = running[late[running] <= 0]
                        if inside.size == 0:
                            inside = running[[np.argmin(late[running])]]
                        out_s.append(int(cs[inside[np.argmax(c_end[inside])]]))
                        out_d.append(g)
                        waited[inside] = True
    # what a callback chained on a waited collective's future issued (PowerSGD's P and Q all_reduces) is
    # part of the future the program waited for: waited for too, where it completed by the node's end
    chained = coll[src] & coll[dst] & (rt.stream[src] == rt.stream[dst])
    if chained.any() and out_s:
        nxt: dict[int, list[int]] = {}
        for a_, b_ in zip(src[chained].tolist(), dst[chained].tolist(), strict=True):
            nxt.setdefault(a_, []).append(b_)
        for c, g in list(zip(out_s, out_d, strict=True)):
            todo = list(nxt.get(c, ()))
            while todo:
                d_ = todo.pop()
                if end[d_] <= end[g] + LAG_SLACK_NS:
                    out_s.append(d_)
                    out_d.append(g)
                    todo.extend(nxt.get(d_, ()))
    return np.asarray(out_s, dtype=np.int64), np.asarray(out_d, dtype=np.int64)


def _chained_completions(rt: RankTrace, src: I64, dst: I64, end: I64, comm_streams: set[int]) -> I64:
    """Of the start edges along a host communication stream (a collective issued by a callback chained on
    the previous one's future: :func:`_edges`), the sources recorded to end after their dependant began, up
    to gloo's finish lag (``LAG_SLACK_NS``) and a ``WAIT_RATIO``-th of their own length (as for hidden
    waits; one that ran on longer after the issue ran beside it, and stays its queue edge): the callback
    ran once the program saw that collective complete, so it completed by the issue, which becomes its end
    in ``end`` (in place; not before its call returned). Returns those rows
    (for :attr:`RankModel.end_clamp_rows`)."""
    if not comm_streams or src.size == 0:
        return np.zeros(0, dtype=np.int64)
    chain = _along_comm_stream(rt, src, dst, comm_streams)
    s, d = src[chain], dst[chain]
    late = end[s] - rt.start_ns[d]
    lag = (late > 0) & (late <= LAG_SLACK_NS) & (late * WAIT_RATIO <= end[s] - rt.start_ns[s])
    s, d = s[lag], d[lag]
    if s.size == 0:
        return s
    np.minimum.at(end, s, rt.start_ns[d])
    end[s] = np.maximum(end[s], _call_returned(rt, s))
    return np.unique(s)


def _join_batches(rt: RankTrace, edges: tuple[I64, I64], *, sync: B, end: I64, by: I64) -> tuple[I64, I64]:
    """Edges out of a member of a ``batch_isend_irecv`` call, from every member of that call: what waits
    for one of its sends or recvs waits for the whole batch (the program waits for all its works; NCCL
    completes them together). Only where that held in the recording (the member ended by ``by[dst]``)."""
    src, dst = edges
    batch = rt.batch
    if batch is None:
        return src, dst
    member = sync & (batch >= 0) & type_mask(rt.node_type, P2P_NODE_TYPES)
    hit = member[src]
    if not hit.any():
        return src, dst
    rows_of: dict[int, list[int]] = {}
    for i in np.flatnonzero(member).tolist():
        rows_of.setdefault(int(batch[i]), []).append(i)
    add_s: list[int] = []
    add_d: list[int] = []
    for s_, d_ in zip(src[hit].tolist(), dst[hit].tolist(), strict=True):
        for m in rows_of[int(batch[s_])]:
            if m not in (s_, d_) and end[m] <= by[d_] + SKEW_NS:
                add_s.append(m)
                add_d.append(d_)
    if not add_s:
        return src, dst
    n = max(len(rt), 1)
    key = np.unique(np.concatenate([dst, np.asarray(add_d)]) * n + np.concatenate([src, np.asarray(add_s)]))
    return key % n, key // n


def _with_launched_in(rt: RankTrace, valid: B, ls: I64, ld: I64) -> tuple[I64, I64]:
    """The launch edges ``ls -> ld`` and those a GPU row names in ``skl_launched_in`` (a host row that then
    synchronised on it: a launch, met at that row's arrival, which a ctrl dep could not say)."""
    if rt.launched_in is None:
        return ls, ld
    d = np.flatnonzero(rt.launched_in >= 0)
    s = rt.launched_in[d]
    ok = valid[d] & valid[s] & rt.is_cpu[s] & ~rt.is_cpu[d]
    return np.concatenate([ls, s[ok]]), np.concatenate([ld, d[ok]])


def _part_waits(
    ws: I64, wd: I64, ls: I64, *, call: I64, end: I64, start: I64, held: B, after_wait: B, waited: I64
) -> tuple[I64, I64, I64]:
    """Of the launch edges ``ls`` (calls at ``call``) whose source had waited for some of its wait edges
    ``ws -> wd`` before the call but not all (:attr:`RankModel.part_wait_src`): those wait sources and the
    launch edges they hold, and ``waited`` with each such edge's time from its source's start to the
    latest of their recorded ends. An edge one of whose earlier waits is a sync member or a nested row
    (the simulator meets a launch at the start of such a row's segment, not at its end) keeps its
    source's arrival."""
    o = np.argsort(wd, kind="stable")
    lo = np.searchsorted(wd[o], ls)
    cnt = np.searchsorted(wd[o], ls, side="right") - lo
    cnt[after_wait] = 0  # calls after the whole wait: met after it
    k = np.repeat(np.arange(ls.size), cnt)  # each launch edge beside each wait edge of its source
    j = o[np.arange(k.size) - np.repeat(np.cumsum(cnt) - cnt - lo, cnt)]
    before = end[ws[j]] <= call[k]
    k, j = k[before], ws[j[before]]
    bad = np.zeros(ls.size, dtype=np.bool_)
    bad[k[held[j]]] = True
    k, j = k[~bad[k]], j[~bad[k]]
    last = np.full(ls.size, _MIN, dtype=np.int64)
    np.maximum.at(last, k, end[j])
    waited = waited.copy()
    waited[k] = np.maximum(last[k], start[ls[k]]) - start[ls[k]]
    return j, k, waited


def _p2p_done_by(run: RunTrace, syncs: Sequence[SyncGroup]) -> dict[int, tuple[I64, I64]]:
    """Per rank, the send and recv rows recorded to end more than ``SKEW_NS`` after their pair completed, and
    that completion (at least the row's start): the time by which each had completed. A send and its recv
    complete together (gloo's send does not complete before its recv is posted, and the recv has its data once
    the send is done); an asynchronous op is recorded to end when the program's wait on it returned (gloo
    reports no completion), which may be much later (a pipeline stage waits for its activation sends at the
    end of the step, or for a recv after host work of its own). The pair completed by the earlier of its
    members' recorded ends; where that end is the return of its first wait (either member's, where both end at
    once) and that wait did not block (:data:`UNBLOCKED_WAIT_NS`), begun after both members had arrived and
    their calls returned, it only says the data was there before the wait: the pair completed once both were
    issued (the later of their starts and call returns). A schedule of several stages a rank posts a recv
    ahead and waits for it before the stage's compute that reads it, after other stages' work. But where the
    other member's first wait began after both were issued and before that end, and blocked, the pair was
    still running then, and completed by that end: a hand-rolled ring exchange (isend, irecv, wait for the
    recv, wait for the send) waits for its send without blocking once its recv has come. A member whose first
    wait began before the pair's completion and blocked past it completed at its own recorded end (gloo's send
    completes once its data is written, its recv once read). An eager send's pair is left as recorded.
    :func:`rank_model` takes it for the asynchronous ones."""
    waiters: dict[int, dict[int, list[int]]] = {}

    def waiters_of(r: int) -> dict[int, list[int]]:
        got = waiters.get(r)
        if got is None:
            rt = run.ranks[r]
            owner = np.repeat(np.arange(len(rt), dtype=np.int64), np.diff(rt.dep_ptr))
            on = _wait_rows(rt)[owner]
            got = waiters[r] = {}
            for d, w in zip(rt.dep_idx[on].tolist(), owner[on].tolist(), strict=True):
                got.setdefault(d, []).append(w)
        return got

    def issued(r: int, w: int) -> int:
        rt = run.ranks[r]
        ret = -1 if rt.return_ns is None else int(rt.return_ns[w])
        return max(int(rt.start_ns[w]), ret)

    def first_wait(r: int, w: int) -> int:
        """The first wait node on row ``w`` of rank ``r``; -1 for none."""
        ws = waiters_of(r).get(w)
        return -1 if ws is None else min(ws, key=lambda k: (int(run.ranks[r].start_ns[k]), k))

    out: dict[int, tuple[list[int], list[int]]] = {}
    for g in syncs:
        if not g.is_p2p or g.detached[0]:
            continue
        ends = [
            int(run.ranks[r].start_ns[w] + run.ranks[r].dur_ns[w])
            for r, w in zip(g.ranks, g.rows, strict=True)
        ]
        done = min(ends)
        both = max(issued(r, w) for r, w in zip(g.ranks, g.rows, strict=True))
        # each member's first wait: when it began (-1: none) and whether it blocked
        waits = [first_wait(r, w) for r, w in zip(g.ranks, g.rows, strict=True)]
        began = [int(run.ranks[r].start_ns[k]) if k >= 0 else -1 for r, k in zip(g.ranks, waits, strict=True)]
        blocked = [
            k >= 0 and int(run.ranks[r].dur_ns[k]) > UNBLOCKED_WAIT_NS
            for r, k in zip(g.ranks, waits, strict=True)
        ]
        # its first wait returned at that end (a later wait on it returns at once whatever the transfer took);
        # where both members end at once (whole µs in a Chakra trace), either one's wait says so
        if any(
            e == done and k >= 0 and both <= s and not b
            for e, k, s, b in zip(ends, waits, began, blocked, strict=True)
        ):
            # unless another member's first wait, begun after both were issued and before that end,
            # blocked: the pair had not completed when it began (each rank of a ring exchange blocks on
            # its recv while its send completes, and its wait for the send then returns at once)
            running = any(b and both <= s < done for s, b in zip(began, blocked, strict=True))
            done = done if running else min(done, both)
        for r, w, e, s, b in zip(g.ranks, g.rows, ends, began, blocked, strict=True):
            # a member whose first wait began before that completion and blocked past it completed at
            # its own end: gloo's send completes once its data is written, its recv once read
            if e > done + SKEW_NS and not (b and s < done):
                rows, at = out.setdefault(r, ([], []))
                rows.append(w)
                at.append(max(done, int(run.ranks[r].start_ns[w])))
    return {
        r: (np.asarray(rows, dtype=np.int64), np.asarray(at, dtype=np.int64)) for r, (rows, at) in out.items()
    }


def _call_returned(rt: RankTrace, rows: I64) -> I64:
    """When the call that issued each of ``rows`` (asynchronous ops) returned (``skl_return_ns``), at most
    the row's recorded end, ``_MIN`` where not recorded: an end clamp never ends an op before that. The
    call may block (gloo's ``isend`` writes its data inside the call once the peer has posted its recv),
    and the op had not completed before its call returned."""
    if rt.return_ns is None:
        return np.full(rows.size, _MIN, dtype=np.int64)
    ret = rt.return_ns[rows]
    return np.where(ret >= 0, np.minimum(ret, rt.start_ns[rows] + rt.dur_ns[rows]), _MIN)


def rank_model(
    rt: RankTrace,
    sync: B,
    peer_later: B | None = None,
    *,
    p2p_done: tuple[I64, I64] | None = None,
    thread_streams: bool = False,
) -> RankModel:
    """The model of one rank, given which of its rows are sync-group members and which of those had a
    member arrive after them (recorded starts; none where not given), and ``p2p_done``: rows of sends and
    recvs whose pair completed before they were recorded to end, and when (:func:`_p2p_done_by`); those
    issued asynchronously (on a communication stream) end then (:attr:`RankModel.end_clamp_rows`).
    ``thread_streams``: the trace gives each host thread a stream of its own (a capture's: no two are
    merged into one timeline, :func:`_timelines`)."""
    n = len(rt)
    valid = (rt.node_type != NodeType.METADATA) & (rt.node_type != NodeType.INVALID)
    end = rt.start_ns + rt.dur_ns
    comm_streams = _comm_streams(rt, valid)
    done_rows = np.zeros(0, dtype=np.int64)
    if p2p_done is not None and comm_streams:
        on = np.isin(rt.stream[p2p_done[0]], list(comm_streams))
        done_rows = p2p_done[0][on]
        end[done_rows] = np.maximum(p2p_done[1][on], _call_returned(rt, done_rows))
    src, dst, qs0, qd0, parent, (ls, ld, hs, hd), timeline = _edges(
        rt, valid, end, sync, comm_streams, merge=not thread_streams
    )
    chain_rows = _chained_completions(rt, src, dst, end, comm_streams)
    nested = parent >= 0
    # edges into or out of nested rows: the outermost enclosing row stands for them
    src = np.where(nested[src], parent[src], src)
    keep = ~nested[dst] & (src != dst)
    if not keep.all():
        src, dst = src[keep], dst[keep]
    ls, ld = _with_launched_in(rt, valid, ls, ld)
    ls = np.where(nested[ls], parent[ls], ls)
    hd = np.where(nested[hd], parent[hd], hd)
    launch_ns = rt.launch_ns if rt.launch_ns is not None else np.full(n, -1, dtype=np.int64)
    at = np.where(launch_ns[ld] >= 0, launch_ns[ld], rt.start_ns[ld])
    loff = np.clip(at - rt.start_ns[ls], 0, rt.dur_ns[ls])
    is_comm = type_mask(rt.node_type, COMM_NODE_TYPES)
    # wait nodes: their dependencies on communication are wait edges; a host row that synchronised on
    # the GPU waits for what it synchronised on
    waits = _wait_rows(rt)
    waits[hd] = True
    w = waits[dst] & is_comm[src]
    ws, wd = np.concatenate([src[w], hs]), np.concatenate([dst[w], hd])
    src, dst = src[~w], dst[~w]
    gs, gd = _gap_waits(
        rt,
        valid=valid,
        end=end,
        sync=sync,
        comm_streams=comm_streams,
        src=src,
        dst=dst,
        explicit=ws,
        peer_later=np.zeros(n, dtype=np.bool_) if peer_later is None else peer_later,
    )
    # a hidden wait's completion recorded after the node that waited for it (the worker's lag): it
    # completed by the node's end, which is its end from here on
    lagged = end[gs] > end[gd]
    clamp_rows = np.unique(np.concatenate([gs[lagged], done_rows, chain_rows]))
    if clamp_rows.size:
        end = end.copy()
        np.minimum.at(end, gs[lagged], end[gd[lagged]])
        end[gs[lagged]] = np.maximum(end[gs[lagged]], _call_returned(rt, gs[lagged]))
    clamp_ns = end[clamp_rows]
    ws, wd = np.concatenate([ws, gs]), np.concatenate([wd, gd])
    waits = waits.copy()
    waits[gd] = True
    host_work = np.zeros(n, dtype=np.bool_)
    host_work[gd] = True
    host_work[untraced_rows(rt)] = False  # what follows the wait stays untraced time: idle, not compute
    ov = end[src] - rt.start_ns[dst]  # > 0: the dependency was still running when the node started
    # a compute node that starts before its dependency ends but is not nested in it (ends later and
    # started later) follows it: the overlap is timestamp skew between trace sources, whatever its size
    later = (end[dst] >= end[src]) & (rt.start_ns[dst] > rt.start_ns[src])
    # GPU work before a device collective that starts at its call (captured: its call and its NCCL kernel,
    # no launch of its own) is the kernel NCCL's stream waited for: it holds the transfer, never the call,
    # whether it was still running at the call (however briefly) or had ended
    held = ~rt.is_cpu[src] & ~sync[src] & sync[dst] & ~rt.is_cpu[dst] & (launch_ns[dst] < 0)
    follows = ((ov <= 0) | ((ov <= SKEW_NS) & (end[dst] >= end[src]))) & ~held | (later & ~sync[dst])
    queued = ~follows & sync[dst]
    qs = np.concatenate([qs0, src[queued]])
    qd = np.concatenate([qd0, dst[queued]])
    qkeep = sync[qd] & (qs != qd)
    qs, qd = qs[qkeep], qd[qkeep]
    src, dst = src[follows], dst[follows]
    src, dst = _join_batches(rt, (src, dst), sync=sync, end=end, by=rt.start_ns)
    ws, wd = _join_batches(rt, (ws, wd), sync=sync, end=end, by=end)
    is_s, is_d, is_off = _issue_edges(
        rt,
        valid=valid,
        end=end,
        timeline=timeline,
        parent=parent,
        comm_streams=comm_streams,
        starts=(src, dst),
        queues=(qs, qd),
        waits=waits,
    )
    depmax = np.full(n, _MIN, dtype=np.int64)
    np.maximum.at(depmax, dst, end[src])
    np.maximum.at(depmax, ld, rt.start_ns[ls] + loff)
    np.maximum.at(depmax, is_d, rt.start_ns[is_s] + is_off)
    t0 = int(rt.start_ns[valid].min()) if valid.any() else 0
    gap = np.maximum(np.where(depmax > _MIN, rt.start_ns - depmax, rt.start_ns - t0), 0)
    gap[~valid | nested] = 0
    work = rt.dur_ns.astype(np.int64, copy=False)  # the recorded durations, shared, where nothing waits
    after_wait = np.zeros(ls.size, dtype=np.bool_)
    waited = np.zeros(ls.size, dtype=np.int64)
    pw_src = pw_edge = np.zeros(0, dtype=np.int64)
    if ws.size:
        work, done = _work_after(ws, wd, rt.start_ns, end, rt.dur_ns)
        call = rt.start_ns[ls] + loff
        after_wait = (done[ls] > _MIN) & (call > done[ls])
        waited[after_wait] = np.maximum(done[ls], rt.start_ns[ls])[after_wait] - rt.start_ns[ls[after_wait]]
        pw_src, pw_edge, waited = _part_waits(
            ws,
            wd,
            ls,
            call=call,
            end=end,
            start=rt.start_ns,
            held=sync | nested,
            after_wait=after_wait,
            waited=waited,
        )
    has = np.zeros(n, dtype=np.bool_)
    has[dst] = True
    has[ld] = True
    has[is_d] = True
    # the model's edges and nesting as rows of the rank, in 4 bytes (I32)
    return RankModel(
        rank=rt.rank,
        valid=valid,
        sync=sync,
        start_src=src.astype(np.int32),
        start_dst=dst.astype(np.int32),
        queue_src=qs.astype(np.int32),
        queue_dst=qd.astype(np.int32),
        wait_src=ws.astype(np.int32),
        wait_dst=wd.astype(np.int32),
        launch_src=ls.astype(np.int32),
        launch_dst=ld.astype(np.int32),
        launch_off_ns=loff.astype(np.int64),
        launch_after_wait=after_wait,
        launch_waited_ns=waited,
        part_wait_src=pw_src.astype(np.int32),
        part_wait_edge=pw_edge.astype(np.int32),
        issue_src=is_s.astype(np.int32),
        issue_dst=is_d.astype(np.int32),
        issue_off_ns=is_off,
        gap_ns=gap.astype(np.int64, copy=False),
        work_ns=work,
        parent=parent.astype(np.int32),
        has_start_deps=has,
        is_wait=waits,
        host_work=host_work,
        end_clamp_rows=clamp_rows,
        end_clamp_ns=clamp_ns,
        t0_ns=t0,
        dur_ns=rt.dur_ns.astype(np.int64, copy=False),
    )


def derive(run: RunTrace) -> ExecutionModel:
    """Derive the execution model of ``run`` (prefer :func:`execution_model`, which caches it)."""
    syncs = _sync_groups(run)
    sync_rows: dict[int, list[int]] = {r: [] for r in run.ranks}
    sync_group: dict[int, list[int]] = {r: [] for r in run.ranks}
    for k, g in enumerate(syncs):
        for r, row in zip(g.ranks, g.rows, strict=True):
            sync_rows[r].append(row)
            sync_group[r].append(k)
    # each sync group's last recorded arrival (a member's start)
    last_arrival = np.full(len(syncs), _MIN, dtype=np.int64)
    for r, rows in sync_rows.items():
        if rows:
            np.maximum.at(last_arrival, np.asarray(sync_group[r]), run.ranks[r].start_ns[np.asarray(rows)])
    # the arrival each member of a rooted collective waits for instead (:func:`waits_for`)
    rooted = {
        g.index: g.waits_for
        for g in syncs
        if any(w >= 0 for w in g.waits_for) and len(g.ranks) == len(run.collectives[g.index].ranks)
    }
    awaited: dict[tuple[int, int], int] = {}
    for g in syncs:
        if any(w >= 0 for w in g.waits_for):
            starts = [int(run.ranks[r].start_ns[w]) for r, w in zip(g.ranks, g.rows, strict=True)]
            awaited.update(
                zip(zip(g.ranks, g.rows, strict=True), awaited_arrivals(g.waits_for, starts), strict=True)
            )

    def one(r: int) -> RankModel:
        rt = run.ranks[r]
        sync = np.zeros(len(rt), dtype=np.bool_)
        sync[sync_rows[r]] = True
        later = np.zeros(len(rt), dtype=np.bool_)
        if sync_rows[r]:
            rows = np.asarray(sync_rows[r])
            t = last_arrival[np.asarray(sync_group[r])]
            if awaited:
                t = np.asarray(
                    [awaited.get((r, w), v) for w, v in zip(sync_rows[r], t.tolist(), strict=True)]
                )
            later[rows] = t > rt.start_ns[rows] + SKEW_NS
        return rank_model(rt, sync, later, p2p_done=p2p_done.get(r), thread_streams=threads)

    p2p_done = _p2p_done_by(run, syncs)
    threads = run.manifest.source in THREAD_STREAM_SOURCES  # one stream per host thread: none merged

    # ranks on a few threads (numpy releases the GIL for much of each rank's work); in rank order
    order = list(run.ranks)
    ranks = dict(zip(order, ordered_map(one, order, workers=default_workers()), strict=True))
    release_free_memory()  # what the threads freed stays in their malloc arenas otherwise
    start = min((m.t0_ns for m in ranks.values() if m.valid.any()), default=0)
    return ExecutionModel(ranks=ranks, syncs=syncs, start_ns=start, rooted=rooted)


def deps_by_row(src: I32, dst: I32, n: int) -> list[list[int]]:
    """Edges as per-dependant lists of sources (``out[i]``: the rows ``i`` depends on), sorted."""
    out: list[list[int]] = [[] for _ in range(n)]
    for s, d in sorted(zip(src.tolist(), dst.tolist(), strict=True), key=lambda x: (x[1], x[0])):
        out[d].append(s)
    return out
