"""The replay plan: what each real-replay worker executes, derived from the execution model (pure, no torch).

One :class:`ReplayOp` per node a worker acts on, in execution order (recorded start order, dependencies
first). What each op waits for is the execution model's (``skewlens.replay.execution``), the same the
simulator reads:

- an op becomes ready when its start dependencies have completed (for one without any: the rank's replay
  origin); it starts ``gap_ns`` later (the model's recorded host gap, measured from the rank's first
  recorded start for an op without dependencies; the ranks' origins keep the recorded skew between their
  first nodes), plus ``delay_ns`` from the effects;
- a wait node (``wait_deps``) then blocks until those communication ops completed, and does its own work;
- a nested node (inside another node on its timeline) is not executed again: it takes its times from its
  enclosing node, at its offset into it, which, with its duration, scales with that node's work (the
  model's ``nested_times``, as the simulator times it);
- GPU work (a kernel, copy or memset: the trace's ``is_cpu_op`` false) says so (``gpu``) and names its
  recorded device stream (``stream``); it comes right after the host node that launched it (the model's
  launch edges: ordered by its launch call, not its start), so that a worker on a GPU enqueues it where the
  program launched it and the host runs ahead of the device as recorded; work launched by a host node
  before it waited on the GPU (``.item()``, waiting for the copy it launched) comes right before that
  node, since it was launched before the wait;
- communication whose completion the very next op waits for is re-issued as a blocking call, the rest
  asynchronously (eager sends among them); a profiler capturing the replay then sees the same blocking and
  overlapping calls;
- asynchronous communication issued from inside a host op that ran on after the issue (recorded start
  inside the op, no start edge from it: the model issues it at the op's start plus its recorded offset
  into the op scaled by the op's work factor, its issue edge, as the simulator does: ``issued_in``,
  ``issue_off_ns``) is that op's ``issues_inside``: the worker issues it at that time during the op's
  work, so that it overlaps the rest of the op as recorded;
- ``effects`` scale compute work (``compute_factor``) and untraced host time (``host_idle_factor``: the
  model's ``host_idle_scaled``, gaps and ``untraced`` nodes alike, as simulated) and add waits before
  nodes (``delay_before_ns``, plus ``stall_ns`` before the first node of a step: the model's
  ``effect_delays``, the simulator's, which puts a stall on the step's earliest recorded start, not on the
  plan's first op of the step); a wait
  before asynchronous communication is the issuing thread's, so it holds that thread's op after the issue
  too (the model's ``issuer_delays``, as the simulator does), also where the issue is inside a host op
  (``issues_inside``: that op ends as planned, the next one waits).

The plan is plain data (ints and strings) serialised as JSON for the workers: no pickles cross processes.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from skewlens.profiler.atomic import write_json_atomic
from skewlens.profiler.bounded import read_json_bounded as bounded_json
from skewlens.profiler.chakra_io import attr_value, iter_nodes
from skewlens.profiler.errors import ValidationError
from skewlens.profiler.manifest import HASHED_GROUP_NAME, ProcessGroupInfo, default_group_name
from skewlens.profiler.store.model import RankTrace, RunTrace
from skewlens.profiler.vocab import TORCH_DTYPE_NAMES, Attr, CommType, NodeType
from skewlens.replay.effects import Effects
from skewlens.replay.errors import ReplayError
from skewlens.replay.execution import (
    RankModel,
    deps_by_row,
    effect_delays,
    execution_model,
    host_idle_scaled,
    issue_anchors,
    issuer_delays,
    nested_times,
    scaled_work,
)
from skewlens.replay.lower import group_rank_order
from skewlens.replay.network.algorithms import even_split_bytes

PLAN_FORMAT = "skewlens-real-plan"
PLAN_VERSION = 8  # 3: send_splits / recv_splits; 4: gpu, stream, queue_deps, launch order; 5: reduce_op;
# 6: issues_inside; 7: issued_in, issue_off_ns; 8: a nested op's offset_ns and dur_ns scale with its parent
META_FILE = "meta.json"
RANK_PLAN_FILE = "rank-{rank}.json"
#: Files a worker writes into the work directory.
ERROR_FILE = "rank-{rank}.error.json"
RESULT_FILE = "rank-{rank}.result.json"
#: A worker's progress (the :class:`WorkerPhase` it reached; in the replay, its last op issued and each
#: group's last collective seq issued), rewritten by its watchdog at most every ``PROGRESS_S``.
PROGRESS_FILE = "rank-{rank}.progress.json"
PROGRESS_S = 0.25
#: The environment variable that names the process supervising the launcher (``launch.run_workers``, the
#: ``skewlens replay`` process): a worker exits once the launcher's parent is no longer that process
#: (killed with SIGKILL, which nothing of its own can catch to stop the workers).
SUPERVISOR_ENV = "SKEWLENS_REPLAY_SUPERVISOR"


class WorkerPhase(StrEnum):
    """A worker's phases, in the order it reaches them (each reported in its progress file as it does)."""

    START_UP = "start-up"
    INIT_PROCESS_GROUP = "init_process_group"
    CORE_COUNTS = "the exchange of core counts"
    GROUP_CREATION = "process group creation"
    WARM_UP = "warm-up"
    CLOCK_ALIGNMENT = "clock alignment"
    PROFILER_START_UP = "profiler start-up"
    COMMON_START = "the common start"
    REPLAY = "replay"
    PROFILER_SAVE = "profiler save"
    WRITING_TRACE = "writing the replayed trace"
    SHUTDOWN = "shutdown"


#: Largest plan file a worker accepts (the plan is written by us, but read back as untrusted JSON).
MAX_PLAN_BYTES = 512 * 1024 * 1024

KIND_COMPUTE = "compute"
KIND_COLL = "coll"
KIND_SEND = "send"
KIND_RECV = "recv"
KIND_NESTED = "nested"

_ELEMENT_BYTES = {
    "float32": 4,
    "float": 4,
    "float64": 8,
    "double": 8,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOp:
    """One node a worker replays."""

    row: int
    """Row of the node in its RankTrace (file order)."""
    node_id: int
    """Chakra node id."""
    name: str
    """Node name (for error messages and effects)."""
    kind: str
    """``compute``, ``coll``, ``send``, ``recv`` or ``nested``."""
    step: int
    """Training step, -1 when unknown."""
    dur_ns: int
    """Compute to do, ns (recorded duration times the compute factor); 0 for communication; for
    ``nested`` nodes its duration as the model's ``nested_times`` replays it (not executed: the enclosing
    node's time covers it)."""
    deps: tuple[int, ...]
    """Rows whose completion this node's start waits for (the model's start edges)."""
    gap_ns: int
    """Recorded host gap after the latest dependency (without any: after the rank's origin), ns."""
    delay_ns: int
    """Extra wait before the node from the effects (delay + stall:
    :func:`~skewlens.replay.execution.effect_delays`, as simulated), ns; on the op of a thread that follows
    an issue of asynchronous communication, plus that op's delay (the thread waited before the issue:
    :func:`~skewlens.replay.execution.issuer_delays`, as simulated)."""
    parent: int = -1
    """For ``nested`` nodes: the row of the enclosing compute node; else -1."""
    offset_ns: int = 0
    """For ``nested`` nodes: its start after the enclosing node's start, ns: the recorded offset, scaled with
    the enclosing node's work (:func:`~skewlens.replay.execution.nested_times`)."""
    comm_type: int = -1
    """Chakra ``CommType`` of a collective, else -1."""
    pg_name: str = ""
    """Process group of a collective / p2p op ('' = the default group)."""
    seq: int = -1
    """Per-group sequence number of a collective, else -1."""
    peer: int = -1
    """Global rank of the other side of a send / recv, else -1."""
    tag: int = 0
    """p2p tag."""
    comm_bytes: int = 0
    """Bytes of this rank's call (Chakra ``comm_size``)."""
    dtype: str = "float32"
    """Element type of the communicated tensor."""
    reduce_op: str = "sum"
    """An all_reduce's, reduce's or reduce_scatter's ReduceOp, by name (``skl_reduce_op``; ``sum`` where the
    trace records none, or one this replay does not know: :data:`REDUCE_OPS`)."""
    blocking: bool = False
    """Communication the next op waits for at once: issued as a blocking call (else asynchronously)."""
    wait_deps: tuple[int, ...] = ()
    """Communication rows whose completion a wait node blocks on before its own work."""
    root: int = -1
    """A rooted collective's root, global rank (broadcast / scatter: ``comm_src``; reduce / gather:
    ``comm_dst``); -1 where the trace names none (:func:`issued_root`: the group's first rank is taken)."""
    member_bytes: tuple[int, ...] = ()
    """An all_to_all's bytes of each member's call, in group order; without ``send_splits`` (a trace
    that records no splits) each member sends its bytes in equal parts, so each receives a part of every
    other member's."""
    send_splits: tuple[int, ...] = ()
    """An all_to_all's bytes to each member of its group, in group-rank order, as recorded
    (``skl_send_splits``; a member that recorded none sent equal parts of its ``comm_bytes``); () where no
    member recorded splits."""
    recv_splits: tuple[int, ...] = ()
    """Likewise, the bytes it receives from each member (``skl_recv_splits``)."""
    gpu: bool = False
    """Compute that is GPU work (a kernel, copy or memset: the trace's ``is_cpu_op`` false), run on the
    rank's device on recorded stream ``stream``; False for host work and communication."""
    stream: int = -1
    """The recorded device stream of GPU work (the store's ``stream``), else -1."""
    queue_deps: tuple[int, ...] = ()
    """Communication: rows whose end its transfer waits for though its issue does not (the model's queue
    edges: the collective before it on its stream, or GPU work NCCL's stream waited for)."""
    issues_inside: tuple[int, ...] = ()
    """Host compute: rows of the asynchronous communication the program issued while this op ran (recorded
    start inside it, no start edge from it; ``FSDP::all_gather`` around ``unshard(async_op=True)``'s
    all_gather), which the worker issues at their own ready time during this op's work, not after it."""
    issued_in: int = -1
    """Communication issued from inside a host op (the model's issue edge): the row of the top-level op
    whose start it is timed from (the enclosing row's, for an issue from inside a nested op); else -1."""
    issue_off_ns: int = 0
    """With ``issued_in``: it is ready no earlier than this long after that op started (the model's
    :func:`~skewlens.replay.execution.issue_offsets` of the replayed work, plus a nested op's offset into
    its enclosing one: :func:`~skewlens.replay.execution.issue_anchors`), ns."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupSpec:
    """A process group to re-create, in creation order."""

    name: str
    """Recorded group name (``pg_name`` of the nodes)."""
    ranks: tuple[int, ...]
    """Global ranks of the members."""
    desc: str
    """Recorded description, passed as ``group_desc``."""
    local: bool = False
    """Whether the program made it with ``new_group(..., use_local_synchronization=True)`` (its name is
    torch's hash of its ranks, :func:`hashed_group_name`): re-created so, by its members only, it takes no
    number from torch's counter, as it took none in the program."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanMeta:
    """What every worker needs besides its own ops."""

    world_size: int
    """Number of ranks (one process each)."""
    backend: str
    """``gloo`` or ``nccl``."""
    timeout_s: float
    """Per-operation timeout, seconds."""
    compute: str
    """How compute is replayed: ``auto``, ``spin`` (busy loop) or ``sleep``."""
    default_pg: str
    """Recorded name of the default group (nodes naming it use the default group)."""
    groups: tuple[GroupSpec, ...]
    """Further groups, in creation order."""
    origin_ns: dict[int, int]
    """Per rank: recorded first start minus the run's first start, ns (initial skew)."""
    first_start_ns: int
    """The run's first recorded start, ns (replayed times are written relative to it)."""
    source_run: str
    """The replayed run directory."""
    out_run: str
    """The run directory the workers write (the replay, captured)."""
    work_dir: str
    """Directory for worker status / error / result files."""
    capture_run: str = ""
    """Where the profiler (``skewlens.profiler.capture``, collectives level) captures the replay; '' for
    none."""
    capture_steps: int = 1
    """Steps the profiler records (every replayed step)."""
    source_files: dict[int, str] = field(default_factory=dict)
    """Per rank: its trace file in ``source_run`` (a run without a manifest names them ``<prefix>.<r>.et``);
    a rank not listed: ``rank-<r>.et``."""


#: The ReduceOps a recorded ``skl_reduce_op`` may name (``torch.distributed.ReduceOp``'s, lower case).
REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"})


def _comm_attrs_by_node(path: str) -> dict[int, tuple[str, str]]:
    """``skl_dtype`` and ``skl_reduce_op`` ('' where absent) of each communication node of a rank's file
    (the store keeps no column for them)."""
    out: dict[int, tuple[str, str]] = {}
    for _off, node in iter_nodes(path):
        if node.type in (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV):
            dtype = reduce_op = ""
            for a in node.attr:
                if a.name == Attr.DTYPE:
                    dtype = str(attr_value(a))
                elif a.name == Attr.REDUCE_OP:
                    reduce_op = str(attr_value(a))
            out[node.id] = (dtype, reduce_op)
    return out


def _recorded_splits(rt: RankTrace, i: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An all_to_all node's recorded splits (the store's ``split_send_bytes`` / ``split_recv_bytes``), ()
    for none. The store has checked them against each other, the node's totals and its group (one size per
    member, its own chunk at its place: ``skewlens.profiler.store.load``); a list the replay cannot issue as
    recorded never reaches gloo."""
    if rt.split_ptr is None or rt.split_send_bytes is None or rt.split_recv_bytes is None:
        return (), ()
    a, b = int(rt.split_ptr[i]), int(rt.split_ptr[i + 1])
    return tuple(rt.split_send_bytes[a:b].tolist()), tuple(rt.split_recv_bytes[a:b].tolist())


def _execution_order(rt: RankTrace, deps: list[list[int]], keys: list[int]) -> list[int]:
    """Rows in the order of ``keys`` (recorded starts; a launched GPU row's launch call), every dependency
    before its dependants (Kahn's algorithm)."""
    n = len(rt)
    indeg = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    heap = [(keys[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _s, i = heapq.heappop(heap)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (keys[u], u))
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise ValidationError(
            f"{rt.path}: rank {rt.rank}: dependency cycle through node {rt.node_id[stuck]} ({rt.name(stuck)})"
        )
    return order


def rank_plan(rt: RankTrace, run: RunTrace, effects: Effects) -> list[ReplayOp]:
    """The ops of one rank, in execution order (see the module docstring for the timing rules)."""
    m = execution_model(run).ranks[rt.rank]
    n = len(rt)
    comm_attrs = _comm_attrs_by_node(rt.path)
    starts = rt.start_ns.tolist()
    types = rt.node_type.tolist()
    steps = rt.step.tolist()
    work_ns, gap_ns = host_idle_scaled(effects, rt, m, scaled_work(effects, rt, m, m.work_ns), m.gap_ns)
    inner, nested_off, nested_dur = nested_times(rt, m, work_ns)
    work_ns = work_ns.copy()  # (may be the model's own, read-only column)
    work_ns[inner] = nested_dur
    offset = np.zeros(n, dtype=np.int64)
    offset[inner] = nested_off
    offsets = offset.tolist()
    gaps = gap_ns.tolist()
    work = work_ns.tolist()
    parent = m.parent.tolist()
    issued = _issued_from(rt, m, work_ns)
    start_deps = deps_by_row(m.start_src, m.start_dst, n)
    wait_deps = deps_by_row(m.wait_src, m.wait_dst, n)
    queue_deps = deps_by_row(m.queue_src, m.queue_dst, n)
    launched_by: list[list[int]] = [[] for _ in range(n)]
    # a launched GPU row comes right after the host row that launched it: ordered by its launch call; one
    # launched by a host row before it waited (``launch_at_arrival``: ``.item()``, which may wait for that
    # very row) comes before it, after what that row followed. A row with several launch edges (several host
    # dependencies) is keyed by the latest of them, whatever order its dependencies were listed in (the two
    # decoders list a node's dependencies in different orders where a file mixes packed and single values)
    keys = list(starts)
    keyed: set[int] = set()
    edges = zip(
        m.launch_src.tolist(),
        m.launch_dst.tolist(),
        m.launch_off_ns.tolist(),
        m.launch_at_arrival.tolist(),
        strict=True,
    )
    for s, d, off, before_wait in edges:
        at = starts[s] + off
        keys[d] = max(keys[d], at) if d in keyed else at
        keyed.add(d)
        if before_wait:
            launched_by[d] += [*start_deps[s], *([parent[s]] if parent[s] >= 0 else [])]
        else:
            launched_by[d].append(s)
    for d, (s, _off) in issued.items():
        launched_by[d].append(s)  # after the op it was issued from inside
    order_deps = [
        sorted({*start_deps[i], *wait_deps[i], *launched_by[i], *([parent[i]] if parent[i] >= 0 else [])})
        for i in range(n)
    ]
    on_gpu = (~rt.is_cpu).tolist()
    streams = rt.stream.tolist()
    comm = {int(NodeType.COMM_COLL), int(NodeType.COMM_SEND), int(NodeType.COMM_RECV)}
    a2a = {
        inst.rows[inst.ranks.index(rt.rank)]: inst
        for inst in run.collectives
        if inst.comm_type == CommType.ALL_TO_ALL and rt.rank in inst.ranks
    }
    ops: list[ReplayOp] = []
    delays = effect_delays(effects, rt, m).tolist()
    for i in _execution_order(rt, order_deps, keys):
        t = types[i]
        if not m.valid[i]:
            continue
        name = rt.name(i)
        step = steps[i]
        common: dict[str, Any] = {
            "row": i,
            "node_id": int(rt.node_id[i]),
            "name": name,
            "step": step,
            "deps": tuple(start_deps[i]),
            "gap_ns": gaps[i],
            "delay_ns": delays[i],
        }
        if t in comm:
            extra: dict[str, Any] = {}
            if (inst := a2a.get(i)) is not None:
                send, recv = _recorded_splits(rt, i)
                extra = {"member_bytes": inst.comm_bytes, "send_splits": send, "recv_splits": recv}
            extra["queue_deps"] = tuple(queue_deps[i])
            if i in issued:
                extra["issued_in"], extra["issue_off_ns"] = issued[i]
            ops.append(_comm_op(rt, run, i, comm_attrs, {**common, **extra}))
            continue
        if parent[i] >= 0:
            ops.append(
                ReplayOp(
                    kind=KIND_NESTED,
                    dur_ns=work[i],
                    parent=parent[i],
                    offset_ns=offsets[i],
                    **common,
                )
            )
            continue
        gpu = {"gpu": True, "stream": streams[i]} if on_gpu[i] else {}
        ops.append(
            ReplayOp(
                kind=KIND_COMPUTE,
                dur_ns=work[i],
                wait_deps=tuple(wait_deps[i]),
                **gpu,
                **common,
            )
        )
    ops = _issuer_holds(rt, m, ops)
    return _mark_blocking(_issued_inside(ops, starts, (rt.start_ns + rt.dur_ns).tolist()))


def _issued_from(rt: RankTrace, m: RankModel, work: npt.NDArray[np.int64]) -> dict[int, tuple[int, int]]:
    """Per communication row issued from inside a host row (the model's issue edges), the top-level row it
    is timed from and how long after that row's start it is issued, given each row's replayed ``work``: the
    model's :func:`~skewlens.replay.execution.issue_anchors`, as the simulator times it."""
    if m.issue_src.size == 0:
        return {}
    outer, off = issue_anchors(rt, m, work)
    return {d: (o, f) for d, o, f in zip(m.issue_dst.tolist(), outer.tolist(), off.tolist(), strict=True)}


def _issuer_holds(rt: RankTrace, m: RankModel, ops: list[ReplayOp]) -> list[ReplayOp]:
    """``ops`` with the delays before asynchronous ops added to the issuing thread's op that follows each
    issue (the execution model's :func:`~skewlens.replay.execution.issuer_delays`, which the simulator adds
    to its gaps): the thread waited before the issue, then went on. The worker counts an op's ``delay_ns``
    from its dependencies' end, not from the held issue, so the thread waits once, as it did."""
    delay = np.zeros(len(rt), dtype=np.int64)
    for op in ops:
        delay[op.row] = op.delay_ns
    hold = issuer_delays(rt, m, delay).tolist()
    return [replace(op, delay_ns=op.delay_ns + hold[op.row]) if hold[op.row] else op for op in ops]


def _issued_inside(ops: list[ReplayOp], starts: list[int], ends: list[int]) -> list[ReplayOp]:
    """Give each host compute op the asynchronous communication issued while it ran: the communication
    ops that follow it in execution order (past its nested ops), of its step, recorded to
    start inside it, with no start or queue edge from it nor from an op after it, whose start edges are
    all from host work before it or from what the op itself waited for (done, with its end known, when the
    op begins: a blocking recv the op follows)."""
    out = list(ops)
    pos = {op.row: k for k, op in enumerate(ops)}
    host_work = [o.kind == KIND_NESTED or (o.kind == KIND_COMPUTE and not o.gpu) for o in ops]
    comm = (KIND_COLL, KIND_SEND, KIND_RECV)
    for k, op in enumerate(ops):
        if op.kind != KIND_COMPUTE or op.gpu:
            continue
        inside: list[int] = []
        done = {*op.deps, *op.wait_deps}  # ended before the op began (the worker waited for them)
        for j in range(k + 1, len(ops)):  # (not a slice of the rest per op: quadratic in the rank's ops)
            nxt = ops[j]
            if nxt.kind == KIND_NESTED and nxt.parent == op.row:
                continue
            if (
                nxt.kind not in comm
                or nxt.step != op.step
                or not starts[op.row] < starts[nxt.row] < ends[op.row]
                or any(pos[d] >= k for d in nxt.queue_deps if d in pos)
                or not all(d in pos and pos[d] < k and (host_work[pos[d]] or d in done) for d in nxt.deps)
            ):
                break
            inside.append(nxt.row)
        if inside:
            out[k] = replace(op, issues_inside=tuple(inside))
    return out


def _mark_blocking(ops: list[ReplayOp]) -> list[ReplayOp]:
    """Communication whose completion the very next op waits for (or that ends the rank) is blocking; but
    never one issued inside a host op (the rest of that op runs on beside it)."""
    inside = {row for op in ops for row in op.issues_inside}
    out = []
    for k, op in enumerate(ops):
        if op.kind in (KIND_COLL, KIND_SEND, KIND_RECV) and op.row not in inside:
            nxt = ops[k + 1] if k + 1 < len(ops) else None
            waits = nxt is None or op.row in nxt.deps or op.row in nxt.wait_deps
            if waits:
                op = replace(op, blocking=True)
        out.append(op)
    return out


def _comm_op(
    rt: RankTrace, run: RunTrace, i: int, attrs: dict[int, tuple[str, str]], common: dict[str, Any]
) -> ReplayOp:
    t = int(rt.node_type[i])
    gi = int(rt.pg[i])
    pg_name = run.pg_names[gi] if gi >= 0 else ""
    dtype, reduce_op = attrs.get(int(rt.node_id[i]), ("", ""))
    fields: dict[str, Any] = {
        "pg_name": pg_name,
        "comm_bytes": int(rt.comm_bytes[i]),
        "dtype": normalise_dtype(dtype),
        "reduce_op": reduce_op if reduce_op in REDUCE_OPS else "sum",
        "dur_ns": 0,
    }
    if t == NodeType.COMM_COLL:
        ct = int(rt.comm_type[i])
        if ct not in {c.value for c in CommType}:
            raise ValidationError(
                f"{rt.path}: rank {rt.rank}: node {rt.node_id[i]} ({rt.name(i)}): unknown comm_type {ct}"
            )
        root = rt.src[i] if ct in (CommType.BROADCAST, CommType.SCATTER) else -1
        root = rt.dst[i] if ct in (CommType.REDUCE, CommType.GATHER) else root
        return ReplayOp(kind=KIND_COLL, comm_type=ct, seq=int(rt.seq[i]), root=int(root), **fields, **common)
    if t == NodeType.COMM_SEND:
        return ReplayOp(kind=KIND_SEND, peer=int(rt.dst[i]), tag=int(rt.tag[i]), **fields, **common)
    return ReplayOp(kind=KIND_RECV, peer=int(rt.src[i]), tag=int(rt.tag[i]), **fields, **common)


def all_to_all_splits(run: RunTrace, plans: dict[int, list[ReplayOp]]) -> dict[int, list[ReplayOp]]:
    """``plans`` with every all_to_all some member recorded splits for issued with the splits of all its
    members: a member that recorded none sent and received equal parts of its ``comm_bytes`` (its splits
    were even), and is given those (``network.algorithms.even_split_bytes``, the parts the simulated replay
    costs).
    Each member's own lists were checked against its group and totals when its plan was made
    (:func:`_checked_splits`); refused here where what one member sends another does not match what that
    one receives from it (the collective could not run as recorded). Where some
    size is not a whole number of its dtype's elements, every member moves ``uint8`` (the bytes are what
    the replay reproduces)."""
    by_row = {r: {o.row: k for k, o in enumerate(ops)} for r, ops in plans.items()}
    out = {r: list(ops) for r, ops in plans.items()}
    for inst in run.collectives:
        if inst.comm_type != CommType.ALL_TO_ALL:
            continue
        ops = {
            r: out[r][by_row[r][row]]
            for r, row in zip(inst.ranks, inst.rows, strict=True)
            if r in by_row and row in by_row[r]
        }
        if not any(o.send_splits or o.recv_splits for o in ops.values()):
            continue
        members = group_rank_order(run, inst)
        p = len(members)
        place = {q: k for k, q in enumerate(members)}
        splits: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for r, o in ops.items():
            if not o.send_splits and not o.recv_splits:
                splits[r] = ((even_split_bytes(o.comm_bytes, p),) * p,) * 2
            else:  # each member's lists were checked against its group and totals (_checked_splits)
                splits[r] = (o.send_splits, o.recv_splits)
        for r, (send, _recv) in splits.items():
            for q, nbytes in zip(members, send, strict=True):
                if q in splits and (got := splits[q][1][place[r]]) != nbytes:
                    raise ValidationError(
                        f"{run.run_dir}: all_to_all seq {inst.seq} on group {inst.pg_name!r}: rank {r} sends "
                        f"{nbytes} B to rank {q}, which receives {got} B from it "
                        f"({Attr.SEND_SPLITS} / {Attr.RECV_SPLITS})"
                    )
        whole = all(
            b % element_bytes(ops[r].dtype) == 0
            for r, lists in splits.items()
            for b in (*lists[0], *lists[1])
        )
        for r, o in ops.items():
            dtype = o.dtype if whole else "uint8"
            out[r][by_row[r][o.row]] = replace(
                o, send_splits=splits[r][0], recv_splits=splits[r][1], dtype=dtype
            )
    return out


def warmup_ops(run: RunTrace, rank: int, ops: list[ReplayOp]) -> list[ReplayOp]:
    """One op per distinct communication shape this rank takes part in, run once before the replay.

    gloo and NCCL set up buffers and connections lazily on the first use of a group / size; the recorded
    steps ran warm, so the replay warms up too. The list follows one global order (group, sequence number;
    then sender, receiver) on every rank, and every op is waited for before the next, so it cannot deadlock.
    """
    by_row = {o.row: o for o in ops}
    out: list[ReplayOp] = []
    seen: set[tuple[object, ...]] = set()
    for inst in sorted(run.collectives, key=lambda c: (run.pg_names.index(c.pg_name), c.seq)):
        key = (inst.pg_name, int(inst.comm_type), inst.comm_bytes)
        if key in seen:
            continue
        seen.add(key)
        if rank in inst.ranks:
            op = by_row.get(inst.rows[inst.ranks.index(rank)])
            if op is not None:
                out.append(op)
    for pair in sorted(run.p2p, key=lambda p: (p.src_rank, p.dst_rank, p.pg_name, p.tag, p.comm_bytes)):
        pkey = (pair.src_rank, pair.dst_rank, pair.pg_name, pair.tag, pair.comm_bytes)
        if pkey in seen:
            continue
        seen.add(pkey)
        row = pair.src_row if pair.src_rank == rank else pair.dst_row if pair.dst_rank == rank else -1
        op = by_row.get(row) if row >= 0 else None
        if op is not None:
            out.append(op)
    return out


def normalise_dtype(dtype: str) -> str:
    """A dtype name the worker can allocate: ``torch.`` prefix dropped, Kineto's names (``Float``, an
    imported trace's) as torch's (:data:`~skewlens.profiler.vocab.TORCH_DTYPE_NAMES`); none recorded ->
    ``float32``; one we do not know -> ``uint8`` (the recorded byte size is what matters for the transfer)."""
    name = dtype.removeprefix("torch.").strip()
    name = TORCH_DTYPE_NAMES.get(name, name)
    if not name:
        return "float32"
    return name if name in _ELEMENT_BYTES else "uint8"


def issued_root(root: int, ranks: Sequence[int]) -> int:
    """The root a rooted collective of group ``ranks`` (non-empty) is issued with: its recorded ``root``
    (:attr:`ReplayOp.root`) where that is one of them, else the group's first rank."""
    return root if root in ranks else ranks[0]


def element_bytes(dtype: str) -> int:
    """Size of one element of ``dtype`` (a torch dtype name)."""
    return _ELEMENT_BYTES[dtype]


def hashed_group_name(ranks: Sequence[int], groups_before: int) -> str:
    """The name torch gives a group made with ``use_local_synchronization=True`` (``_hash_ranks_to_str``):
    the SHA-1 of its ranks and the number of groups its creating member was in already (the default one
    included)."""
    key = "_".join(map(str, ranks)) + f"_{groups_before}"
    return hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()


def _locally_made(groups: Sequence[ProcessGroupInfo]) -> set[str]:
    """Names of ``groups`` that torch hashed from their ranks (:func:`hashed_group_name`): made with
    ``use_local_synchronization=True``. A member was in at most as many groups as list its first rank."""
    out: set[str] = set()
    for g in groups:
        if HASHED_GROUP_NAME.fullmatch(g.name) and g.ranks and not g.name.isdecimal():
            most = sum(1 for h in groups if g.ranks[0] in h.ranks) + 1
            if any(hashed_group_name(g.ranks, k) == g.name for k in range(most + 1)):
                out.add(g.name)
    return out


def group_specs(run: RunTrace) -> tuple[str, tuple[GroupSpec, ...]]:
    """(default group name, further groups in creation order) from the manifest and the traces."""
    ordered: list[ProcessGroupInfo] = list(run.manifest.process_groups)
    seen = {g.name for g in ordered}
    ordered += [g for n, g in run.process_groups.items() if n not in seen]
    default = default_group_name(ordered)
    # a group the nodes name but neither the manifest nor a trace describes (a capture saved after the
    # program destroyed its groups): its members are those of its communication, in the order of its names
    used: dict[str, set[int]] = {}
    for inst in run.collectives:
        used.setdefault(inst.pg_name, set()).update(inst.ranks)
    for pair in run.p2p:
        used.setdefault(pair.pg_name, set()).update((pair.src_rank, pair.dst_rank))
    known = {g.name for g in ordered} | {default, ""}
    ordered += [
        ProcessGroupInfo(name=n, ranks=tuple(sorted(used[n])), desc=n)
        for n in run.pg_names
        if n not in known and n in used
    ]
    local = _locally_made(ordered)
    if all(g.name.isdecimal() or g.name in local for g in ordered):
        # torch names groups by a counter, in creation order; the manifest lists the union of what each
        # rank knew, rank by rank (only its own groups), so a group of rank 1 alone made before one of rank 0
        # came after it, and the replay's groups took each other's names. A group made with
        # use_local_synchronization takes no number: it stays after the numbered group listed before it
        # (which its hashed name counts among its members' groups)
        keys: list[tuple[int, int]] = []
        for info in ordered:
            keys.append((int(info.name), 0) if info.name.isdecimal() else (keys[-1][0] if keys else -1, 1))
        ordered = [g for _k, g in sorted(zip(keys, ordered, strict=True), key=lambda kg: kg[0])]
    specs = tuple(
        GroupSpec(name=g.name, ranks=tuple(g.ranks), desc=g.desc or g.name, local=g.name in local)
        for g in ordered
        if g.name != default
    )
    for g in specs:
        bad = [r for r in g.ranks if not 0 <= r < run.world_size]
        if bad:
            raise ValidationError(
                f"{run.run_dir}: process group {g.name!r} names rank(s) {bad} outside the job"
            )
    return default, specs


def read_json_bounded(path: Path, what: str) -> Any:
    """Read a JSON file no larger than :data:`MAX_PLAN_BYTES`; errors name the file."""
    return bounded_json(path, MAX_PLAN_BYTES, error=ReplayError, what=what)


def write_plan(
    plan_dir: Path,
    meta: PlanMeta,
    ops_by_rank: dict[int, list[ReplayOp]],
    warmup_by_rank: dict[int, list[ReplayOp]],
) -> None:
    """Write ``meta.json`` and one ``rank-<r>.json`` (``{"warmup": [...], "ops": [...]}``) per rank."""
    meta_d = asdict(meta)
    meta_d["origin_ns"] = {str(k): v for k, v in meta.origin_ns.items()}
    meta_d["source_files"] = {str(k): v for k, v in meta.source_files.items()}
    write_json_atomic(plan_dir / META_FILE, {"format": PLAN_FORMAT, "version": PLAN_VERSION, **meta_d})
    for r, ops in ops_by_rank.items():
        write_json_atomic(
            plan_dir / RANK_PLAN_FILE.format(rank=r),
            {"warmup": [asdict(o) for o in warmup_by_rank.get(r, [])], "ops": [asdict(o) for o in ops]},
        )


def read_meta(plan_dir: Path) -> PlanMeta:
    """Read and check ``meta.json``."""
    path = plan_dir / META_FILE
    d = read_json_bounded(path, "replay plan")
    if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT or d.get("version") != PLAN_VERSION:
        raise ReplayError(f"{path}: not a version-{PLAN_VERSION} {PLAN_FORMAT} file")
    try:
        return PlanMeta(
            world_size=int(d["world_size"]),
            backend=str(d["backend"]),
            timeout_s=float(d["timeout_s"]),
            compute=str(d["compute"]),
            default_pg=str(d["default_pg"]),
            groups=tuple(
                GroupSpec(
                    name=str(g["name"]),
                    ranks=tuple(int(r) for r in g["ranks"]),
                    desc=str(g["desc"]),
                    local=bool(g.get("local", False)),
                )
                for g in d["groups"]
            ),
            origin_ns={int(k): int(v) for k, v in d["origin_ns"].items()},
            first_start_ns=int(d["first_start_ns"]),
            source_run=str(d["source_run"]),
            out_run=str(d["out_run"]),
            work_dir=str(d["work_dir"]),
            capture_run=str(d.get("capture_run", "")),
            capture_steps=int(d.get("capture_steps", 1)),
            source_files={int(k): str(v) for k, v in d.get("source_files", {}).items()},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ReplayError(f"{path}: malformed replay plan ({type(e).__name__}: {e})") from None


def read_rank_plan(plan_dir: Path, rank: int) -> tuple[list[ReplayOp], list[ReplayOp]]:
    """Read one rank's (warm-up ops, ops)."""
    path = plan_dir / RANK_PLAN_FILE.format(rank=rank)
    data = read_json_bounded(path, "replay plan")

    def decode(items: list[dict[str, Any]]) -> list[ReplayOp]:
        return [
            ReplayOp(
                **{
                    **o,
                    "deps": tuple(o["deps"]),
                    "wait_deps": tuple(o["wait_deps"]),
                    "member_bytes": tuple(o.get("member_bytes", ())),
                    "send_splits": tuple(o.get("send_splits", ())),
                    "recv_splits": tuple(o.get("recv_splits", ())),
                    "queue_deps": tuple(o.get("queue_deps", ())),
                    "issues_inside": tuple(o.get("issues_inside", ())),
                }
            )
            for o in items
        ]

    try:
        return decode(data["warmup"]), decode(data["ops"])
    except (KeyError, TypeError) as e:
        raise ReplayError(f"{path}: malformed replay plan ({type(e).__name__}: {e})") from None
