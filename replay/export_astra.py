"""Export a run as a workload ASTRA-sim runs: one Chakra ``.et`` per NPU plus its communicator groups.

ASTRA-sim (the simulator of Chakra execution traces) opens ``<prefix>.<npu>.et`` for every NPU of the
simulated network, where ``<prefix>`` is its ``--workload-configuration`` argument, and reads
sub-group membership from the JSON file given as ``--comm-group-configuration``. Its workload layer is
stricter than Chakra's format, and :func:`export_astra_sim` rewrites our traces to what it runs:

- **node types**: only ``COMP``, ``COMM_COLL``, ``COMM_SEND`` and ``COMM_RECV`` are written. The
  ``## process_group:init ##`` METADATA node (ASTRA-sim's statistics stop on it: *Invalid node_type*) and
  INVALID nodes are dropped; a node that depended on a dropped node depends on the dropped node's own
  dependencies instead, so the order they implied is kept. ``MEM_LOAD``/``MEM_STORE`` nodes become
  ``COMP`` nodes of their recorded duration.
- **is_cpu_op**: ``false`` on every communication node (ASTRA-sim refuses a comm node on the CPU; Chakra's
  convention). Compute nodes are ASTRA-sim's NPU compute (``false``) as well: its statistics only take
  NPU compute and communication, and a CPU-marked compute node stops its report. Where a run also has GPU
  kernels (an imported NCCL run), the host-side compute nodes are dropped (``host_compute="auto"``):
  their time is kernel launch and dispatch that the kernels overlap, and ASTRA-sim's single compute
  resource would otherwise add it to the kernels' time. What the source said is kept as ``skl_host_op``.
  One note (:attr:`AstraExport.notes`) says how long the hosts were busy in the dropped compute and the
  GPUs in the kept compute kernels, within the ranks' recorded steps (their traced span where none is
  recorded): a host-bound run loses most of its step time to ASTRA-sim.
- **timing**: ASTRA-sim replays a compute node for ``duration_micros`` (its roofline model, off in the
  example system configuration, would use ``num_ops``/``tensor_size`` instead, kept where the source has
  them). ``duration_micros`` is the recorded duration rounded to the nearest microsecond (the exact
  nanoseconds stay in ``skl_dur_ns``); a node under half a microsecond runs for ASTRA-sim's minimum of
  one nanosecond. What a wait node waits for is the replay's execution model's to say
  (:mod:`skewlens.replay.execution`, "Wait nodes"; :func:`model_waits` reads it): a wait node
  (``wait_tensor``, ``Work.wait``, a host row that synchronised on the GPU: ``aten::item``, a blocking
  copy, ``cudaStreamSynchronize``) runs only for its work after the communication or GPU work its own
  dependencies name completed: ASTRA-sim starts it once that completes, and the time it spent before was
  that work's (with its whole duration the waiting counted twice: rank 0 of the bundled tp example at 2
  ranks finished at 575 ms on ASTRA-sim, at 379 ms in the replay, 374 ms now; a 2-rank ``synth_gpu``
  run of 3 steps with ``host_compute="npu"`` at 33.8 ms, at 16.8 ms in the replay, 18.6 ms now); a wait
  the model infers and the trace does not name (a batch's other ops) is not cut, ASTRA-sim's graph not
  holding it. A host-time node
  (``untraced``, the ``compute`` gap) in which the model infers a hidden wait (DDP's reducer waiting for
  its buckets) runs only for its work after that wait, and depends on the communication it waited for, so
  that ASTRA-sim models the wait where the recording held it (whole, the recorded wait stood in for the
  modelled one: rank 1 of the bundled ddp-compile example at 2 ranks finished at 142.5 ms on ASTRA-sim, at
  135.7 ms in the replay, 135.0 ms now).
  Communication is timed by ASTRA-sim's network model from ``comm_size``.
- **collectives**: ASTRA-sim implements ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER and ALL_TO_ALL, and
  replays BROADCAST for its recorded duration (without synchronising the members). The others are
  written as the nearest one it has (see :data:`ASTRA_COMM_TYPE`); a collective over a one-member group
  is a replayed BROADCAST too (ASTRA-sim's ring over a single NPU never completes); the source type stays
  in ``skl_comm_type``. A **barrier is an ALL_REDUCE of
  its recorded size, at least four bytes** (one float32, which is how c10d's NCCL backend runs a barrier;
  gloo's record none) over the barrier's group: an all-reduce completes on a member only after every
  member has entered it, which is exactly a barrier's synchronisation, at the cost of the smallest message
  ASTRA-sim's network model moves.
- **sizes**: ``comm_size`` is the recorded per-call bytes, the call's input tensor on this rank, which is
  what ASTRA-sim's collectives divide: its ring all-gather sends ``comm_size`` per step and ends with ``p``
  of them, its reduce-scatter sends ``comm_size / p`` per step and ends with ``1/p``, its all-to-all sends
  ``comm_size / p`` to each member (``Ring``'s constructor, ``msg_size``). An all_to_all or a scatter is
  written on every member with the collective's message size (:func:`collective_sizes`): ASTRA-sim matches
  a message to its receive by size, so members of an uneven all_to_all (or an imported scatter's root)
  would otherwise never complete, and a captured scatter's piece would move ``1/p`` of what its root sent.
  An empty message is written as :data:`MIN_COMM_BYTES`.
- **dependencies**: all in ``data_deps`` (``ctrl_deps`` empty), where Chakra's converter writes what a
  node waits for: Chakra's own feeder (``src/feeder``) follows only ``data_deps``, and would issue a node
  whose order is in ``ctrl_deps`` at once; ASTRA-sim's ``feeder_v3`` follows both lists alike.
- **p2p**: ``COMM_SEND``/``COMM_RECV`` with ``comm_src``, ``comm_dst``, ``comm_tag`` and ``comm_size``
  (global ranks: ASTRA-sim's NPU ids), as recorded.
- **groups**: ASTRA-sim keys communicator groups by integer; ``"0"`` (or no ``pg_name``) is the group of
  all NPUs and the file must not list it. A group keeps its c10d name where that is a positive integer
  (c10d numbers its groups ``"0"``, ``"1"``, ...); any other name gets the next free integer, the source
  name kept in ``skl_pg_name``. ``comm_groups.json`` maps each group's id to its members' global ranks.

The output directory holds ``<prefix>.<rank>.et`` for every rank, ``comm_groups.json``, ``export.json``
(what was converted and the command line), and, unless ``configs=False``, small example ASTRA-sim
configurations (``system.json``, ``network.yml``: one switch joining all NPUs, ``remote_memory.json``) so
that the printed command runs as is; replace them with a model of the system to study. Everything is
written into a temporary directory beside the target and renamed into place at the end.

Limits of ASTRA-sim's workload model, not of the export: one compute and one communication operation in
flight per NPU (nodes of several threads or streams run one after another), and p2p sends that never
wait for their receiver.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.atomic import (
    FILE_MODE,
    check_replaceable,
    replace_dir,
    staging_dir,
    why_not_written,
    write_text_atomic,
)
from skewlens.profiler.chakra_io import (
    AttrValue,
    EtWriter,
    iter_nodes,
    node_attrs,
    read_et,
    set_attr,
)
from skewlens.profiler.errors import SkewlensError, ValidationError
from skewlens.profiler.manifest import ProcessGroupInfo, with_world_ranks
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.vocab import (
    PG_INIT_NODE_NAME,
    Attr,
    CommType,
    NodeType,
    collective_message_bytes,
)
from skewlens.progress import NO_PROGRESS, Progress, given

#: ``format`` of ``export.json``; an existing directory is replaced only if it holds one of these.
EXPORT_FORMAT = "skewlens-astra-sim"
EXPORT_VERSION = 1
#: Schema tag in the exported files' GlobalMetadata (ASTRA-sim's conventions, not ``skewlens-chakra-1``).
ASTRA_SCHEMA = "skewlens-astra-sim-1"
DEFAULT_PREFIX = "workload"
COMM_GROUPS_FILE = "comm_groups.json"
SYSTEM_FILE = "system.json"
NETWORK_FILE = "network.yml"
MEMORY_FILE = "remote_memory.json"
EXPORT_FILE = "export.json"
#: The ASTRA-sim binary of its analytical (congestion-unaware) network backend.
ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"
#: Bytes of the ALL_REDUCE a barrier becomes.
BARRIER_BYTES = 4
#: The smallest message written: ASTRA-sim aborts on a send of 0 bytes (``ChunkIdGenerator``'s assertion
#: ``chunk_size > 0``) and never completes an all-gather of 0.
MIN_COMM_BYTES = 1

#: Collective types ASTRA-sim's workload layer issues.
ASTRA_SUPPORTED = frozenset(
    {
        CommType.ALL_REDUCE,
        CommType.ALL_GATHER,
        CommType.REDUCE_SCATTER,
        CommType.ALL_TO_ALL,
        CommType.BROADCAST,
    }
)
#: What each collective type is written as: itself where ASTRA-sim has it, else the nearest operation it
#: has that moves at least the same data between the same members (REDUCE -> ALL_REDUCE: every member
#: ends with what the root gets; GATHER -> ALL_GATHER likewise; SCATTER -> ALL_TO_ALL: every member sends
#: each other member a distinct block, the root's scatter among them; REDUCE_SCATTER_BLOCK is
#: REDUCE_SCATTER with equal blocks; BARRIER -> an ALL_REDUCE of :data:`BARRIER_BYTES`).
ASTRA_COMM_TYPE: dict[CommType, CommType] = {
    CommType.ALL_REDUCE: CommType.ALL_REDUCE,
    CommType.ALL_GATHER: CommType.ALL_GATHER,
    CommType.REDUCE_SCATTER: CommType.REDUCE_SCATTER,
    CommType.ALL_TO_ALL: CommType.ALL_TO_ALL,
    CommType.BROADCAST: CommType.BROADCAST,
    CommType.REDUCE: CommType.ALL_REDUCE,
    CommType.GATHER: CommType.ALL_GATHER,
    CommType.SCATTER: CommType.ALL_TO_ALL,
    CommType.REDUCE_SCATTER_BLOCK: CommType.REDUCE_SCATTER,
    CommType.BARRIER: CommType.ALL_REDUCE,
}
#: A collective of unknown type is written as BROADCAST, which ASTRA-sim replays for its recorded time.
UNKNOWN_COMM_AS = CommType.BROADCAST
#: A collective over a group of one member (nothing crosses the network) is written as BROADCAST, replayed
#: for its recorded time: ASTRA-sim's ring over a single NPU never completes.
ONE_MEMBER_AS = CommType.BROADCAST
#: ASTRA-sim's name of the group of all NPUs.
WORLD_GROUP_ID = "0"
#: Source types whose members may record different sizes, or a size that is not ASTRA-sim's: every member of
#: one of these is written with the collective's message size (:func:`collective_sizes`).
SHARED_SIZE_TYPES = frozenset({CommType.ALL_TO_ALL, CommType.SCATTER})

#: Attribute names the export adds (ours: ``skl_`` prefix).
HOST_OP = Attr.HOST_OP  # bool: where the node ran (see skewlens.profiler.vocab)
SRC_COMM_TYPE = "skl_comm_type"  # int64: the source's comm_type where the export changed it (-1 unknown)
SRC_PG_NAME = "skl_pg_name"  # string: the source's pg_name where the export renamed the group

HostCompute = Literal["auto", "npu", "drop"]

_KEEP_TYPES = frozenset({NodeType.COMP, NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV})
_DROP_TYPES = frozenset({NodeType.METADATA, NodeType.INVALID})
_AS_COMP = frozenset({NodeType.MEM_LOAD, NodeType.MEM_STORE})
_P2P = frozenset({NodeType.COMM_SEND, NodeType.COMM_RECV})


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraGroup:
    """One process group as ASTRA-sim sees it."""

    source_name: str
    """The group's name in the run (c10d's ``pg_name``)."""
    astra_id: str
    """The ``pg_name`` written into the exported traces (an integer; ``"0"``: all NPUs)."""
    ranks: tuple[int, ...]
    """Global ranks of the members (ASTRA-sim's NPU ids), in group-rank order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraExport:
    """What :func:`export_astra_sim` wrote and how to run it."""

    out_dir: Path
    """The output directory."""
    prefix: Path
    """The workload prefix (``--workload-configuration``): rank ``r``'s trace is ``<prefix>.<r>.et``."""
    traces: dict[int, Path]
    """Trace file of each rank."""
    nodes: dict[int, int]
    """Nodes written per rank."""
    comm_groups: Path
    """The communicator-group file (``--comm-group-configuration``)."""
    groups: tuple[AstraGroup, ...]
    """Every process group and the id it has in the export."""
    system_config: Path | None
    """Example system configuration written beside the traces (None with ``configs=False``)."""
    network_config: Path | None
    """Example network configuration: one switch joining all NPUs (None with ``configs=False``)."""
    memory_config: Path | None
    """Example remote-memory configuration (None with ``configs=False``)."""
    command: tuple[str, ...]
    """The ASTRA-sim command line; with ``configs=False`` it names the configurations as ``<SYSTEM.json>``,
    ``<NETWORK.yml>`` and ``<REMOTE_MEMORY.json>``, for the user to supply."""
    changes: dict[str, int] = field(default_factory=dict)
    """What was rewritten, and how often (``"BARRIER -> ALL_REDUCE"``, ``"METADATA dropped"``, ...)."""
    notes: tuple[str, ...] = ()
    """Remarks for the user (e.g. a path ASTRA-sim would misread)."""

    @property
    def command_line(self) -> str:
        """:attr:`command` as one shell-quoted line."""
        return shlex.join(self.command)


# ------------------------------------------------------------------------------------------- groups


def astra_groups(groups: Iterable[ProcessGroupInfo], world_size: int) -> dict[str, AstraGroup]:
    """ASTRA-sim's id for each group (see the module docstring), by source name."""
    world = tuple(range(world_size))
    named: dict[str, ProcessGroupInfo] = {}
    for g in groups:
        named.setdefault(g.name, g)
    listed = {name: g.ranks for name, g in with_world_ranks(named, world_size).items()}
    out: dict[str, AstraGroup] = {}
    used: set[int] = set()
    for name, ranks in listed.items():
        if name == WORLD_GROUP_ID and sorted(ranks) == list(world):
            out[name] = AstraGroup(source_name=name, astra_id=WORLD_GROUP_ID, ranks=ranks)
        elif name.isdecimal() and name == str(int(name)) and int(name) > 0:
            out[name] = AstraGroup(source_name=name, astra_id=name, ranks=ranks)
            used.add(int(name))
    nxt = max(used, default=0) + 1
    for name, ranks in listed.items():
        if name not in out:
            out[name] = AstraGroup(source_name=name, astra_id=str(nxt), ranks=ranks)
            nxt += 1
    return out


def comm_group_json(groups: Iterable[AstraGroup]) -> dict[str, list[int]]:
    """The ``--comm-group-configuration`` content: every group but the one of all NPUs, by integer id."""
    out = {g.astra_id: list(g.ranks) for g in groups if g.astra_id != WORLD_GROUP_ID}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


# -------------------------------------------------------------------------------------- the rewrite


def _dur_ns(node: pb.Node, attrs: Mapping[str, Any]) -> int:
    v = attrs.get(Attr.DUR_NS)
    return int(v) if isinstance(v, int) else int(node.duration_micros) * 1000


def _int_attr(attrs: Mapping[str, Any], name: str) -> int | None:
    v = attrs.get(name)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(slots=True)
class _Counts:
    changes: dict[str, int] = field(default_factory=dict)
    dropped_ranks: int = 0
    """Ranks whose host compute was dropped (at least one node)."""
    dropped_host_ns: int = 0
    """On those ranks: time the host spent in the dropped compute nodes within the ranks' windows."""
    kept_gpu_ns: int = 0
    """On those ranks: time the GPU spent in compute kernels within the windows."""
    window_ns: int = 0
    """On those ranks: the windows' length (recorded steps, or the traced span where none is recorded)."""
    untimed_window: bool = False
    """A rank without recorded steps: its window is its traced span."""

    def add(self, what: str, n: int = 1) -> None:
        self.changes[what] = self.changes.get(what, 0) + n


def _covered_ns(intervals: Iterable[tuple[int, int]], windows: Sequence[tuple[int, int]]) -> int:
    """Length of the union of ``intervals`` within the (disjoint) ``windows``."""
    clipped = sorted(
        (max(b, ws), min(e, we)) for b, e in intervals for ws, we in windows if min(e, we) > max(b, ws)
    )
    total = 0
    cur: tuple[int, int] | None = None
    for b, e in clipped:
        if cur is not None and b <= cur[1]:
            cur = (cur[0], max(cur[1], e))
            continue
        if cur is not None:
            total += cur[1] - cur[0]
        cur = (b, e)
    return total + (cur[1] - cur[0] if cur is not None else 0)


def _start_ns(node: pb.Node, attrs: Mapping[str, Any]) -> int:
    v = attrs.get(Attr.START_NS)
    return int(v) if isinstance(v, int) else int(node.start_time_micros) * 1000


def _count_dropped_time(
    nodes: Sequence[pb.Node], attrs_of: Mapping[int, Mapping[str, Any]], dropped_host: set[int], ctx: _Rank
) -> None:
    """Add to ``ctx.counts`` how long this rank's host spent in the dropped compute and its GPU in the kept
    compute kernels, within its recorded steps (or its traced span where none is recorded)."""
    span = {
        n.id: (
            _start_ns(n, attrs_of[n.id]),
            _start_ns(n, attrs_of[n.id]) + max(_dur_ns(n, attrs_of[n.id]), 0),
        )
        for n in nodes
    }
    windows = sorted(ctx.steps)
    if not windows:  # the span of the nodes the export keeps or drops as compute (not the metadata node)
        timed = [span[n.id] for n in nodes if n.type not in _DROP_TYPES]
        windows = [(min(b for b, _e in timed), max(e for _b, e in timed))]
        ctx.counts.untimed_window = True
    merged: list[tuple[int, int]] = []
    for b, e in windows:  # steps do not overlap, but a rank's spans are not promised sorted or disjoint
        if merged and b <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((b, e))
    gpu = [
        span[n.id]
        for n in nodes
        if n.type == NodeType.COMP
        and n.id not in dropped_host
        and attrs_of[n.id].get(Attr.IS_CPU_OP) is False
    ]
    c = ctx.counts
    c.dropped_ranks += 1
    c.dropped_host_ns += _covered_ns((span[i] for i in dropped_host), merged)
    c.kept_gpu_ns += _covered_ns(gpu, merged)
    c.window_ns += sum(e - b for b, e in merged)


def _dropped_host_note(c: _Counts, host_compute: HostCompute) -> str | None:
    """One line for every rank together: how much of the steps the dropped host compute was, what ASTRA-sim
    replays instead, and the option that keeps it."""
    if not c.dropped_ranks or not c.dropped_host_ns:
        return None
    window = "traced time (steps where recorded)" if c.untimed_window else "recorded steps"

    def share(ns: int) -> str:
        return f"{ms_text(ns)} ms ({ns / c.window_ns:.0%})" if c.window_ns else f"{ms_text(ns)} ms"

    return (
        f"host compute dropped on {c.dropped_ranks} rank(s) (--host-compute {host_compute}): the hosts were "
        f"busy in it {share(c.dropped_host_ns)} of the ranks' {ms_text(c.window_ns)} ms of {window}; "
        f"ASTRA-sim replays only the GPUs' compute kernels, {share(c.kept_gpu_ns)}; --host-compute npu keeps "
        "the host compute, as NPU compute run in series with the kernels"
    )


def _resolve_deps(nodes: Sequence[pb.Node], dropped: set[int], counts: _Counts) -> None:
    """Replace dependencies on dropped nodes by those nodes' own (kept) dependencies; drop dangling ones."""
    present = {n.id for n in nodes}
    parents = {n.id: [*n.ctrl_deps, *n.data_deps] for n in nodes if n.id in dropped}
    memo: dict[int, list[int]] = {}

    def through(d: int, seen: frozenset[int]) -> list[int]:
        if d in memo:
            return memo[d]
        out: list[int] = []
        for p in parents[d]:
            if p in dropped:
                if p not in seen:
                    out.extend(through(p, seen | {p}))
            elif p in present:
                out.append(p)
        memo[d] = list(dict.fromkeys(out))
        return memo[d]

    for n in nodes:
        if n.id in dropped:
            continue
        for field_name in ("ctrl_deps", "data_deps"):
            deps = getattr(n, field_name)
            new: list[int] = []
            for d in deps:
                if d in dropped:
                    new.extend(through(d, frozenset({d})))
                elif d in present and d != n.id:
                    new.append(d)
                else:
                    counts.add("dangling dependencies dropped")
            new = list(dict.fromkeys(x for x in new if x != n.id))
            if new != list(deps):
                del deps[:]
                deps.extend(new)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Rank:
    """What rewriting one rank's trace needs."""

    path: Path
    rank: int
    world: int
    groups: dict[str, AstraGroup]
    host_compute: HostCompute
    counts: _Counts
    steps: tuple[tuple[int, int], ...] = ()
    """The rank's recorded step spans (start, end), aligned ns."""
    shared_sizes: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """The message size of each all_to_all and scatter, by (group, instance): :func:`collective_sizes`."""
    waits: Mapping[int, _Wait] = field(default_factory=dict)
    """By node id, the wait nodes ASTRA-sim runs only for their work after the wait (:func:`model_waits`)."""


def _rewrite_rank(ctx: _Rank) -> list[pb.Node]:
    """The nodes of one rank's trace, rewritten for ASTRA-sim (see the module docstring)."""
    path, counts = ctx.path, ctx.counts
    et = read_et(path)
    seen: set[int] = set()
    for n in et.nodes:
        if n.id in seen:
            raise ValidationError(f"{path}: node id {n.id} appears more than once")
        seen.add(n.id)
    attrs_of = {n.id: node_attrs(n) for n in et.nodes}
    gpu_compute = any(
        n.type == NodeType.COMP and attrs_of[n.id].get(Attr.IS_CPU_OP) is False for n in et.nodes
    )
    drop_host = ctx.host_compute == "drop" or (ctx.host_compute == "auto" and gpu_compute)
    dropped: set[int] = set()
    dropped_host: set[int] = set()
    for n in et.nodes:
        a = attrs_of[n.id]
        t = n.type
        if t in _DROP_TYPES:
            dropped.add(n.id)
            counts.add(f"{NodeType(t).name} nodes dropped")
        elif t in _AS_COMP:
            counts.add(f"{NodeType(t).name} -> COMP")
            n.type = int(NodeType.COMP)
        elif t not in _KEEP_TYPES:
            raise ValidationError(f"{path}: node {n.id} ({n.name!r}) has unknown node type {t}")
        if n.type == NodeType.COMP and n.id not in dropped and drop_host and a.get(Attr.IS_CPU_OP, True):
            dropped.add(n.id)
            dropped_host.add(n.id)
            counts.add("host compute nodes dropped (GPU kernels carry the compute)")
    if dropped_host:
        _count_dropped_time(et.nodes, attrs_of, dropped_host, ctx)
    _resolve_deps(et.nodes, dropped, counts)
    keys = {n.id: key for n, _a, key in _instances(et.nodes)}
    out: list[pb.Node] = []
    for n in et.nodes:
        if n.id in dropped:
            continue
        a = attrs_of[n.id]
        wait = ctx.waits.get(n.id)
        work = _dur_ns(n, a)
        if wait is not None:
            work = wait.work_ns
            n.ctrl_deps.extend(wait.hidden)  # after its own (_as_data_deps drops repeats)
            counts.add(
                "host-time nodes that hid a wait: only their time after the communication it waited for"
                if wait.hidden
                else "wait nodes: only their time after the communication or GPU work they waited for"
            )
        n.duration_micros = (max(work, 0) + 500) // 1000
        was_cpu = a.get(Attr.IS_CPU_OP)
        if was_cpu is not False:
            set_attr(n, Attr.IS_CPU_OP, False)
            set_attr(n, HOST_OP, True if was_cpu is None else bool(was_cpu))
        if n.type == NodeType.COMM_COLL:
            _rewrite_collective(n, a, ctx, keys[n.id])
        elif n.type in _P2P:
            _rewrite_p2p(n, a, ctx)
        _as_data_deps(n)
        out.append(n)
    if not out:
        idle = pb.Node(id=max(seen, default=-1) + 1, name="skl_idle", type=int(NodeType.COMP))
        idle.attr.add(name=Attr.IS_CPU_OP, bool_val=False)
        out.append(idle)
        counts.add("empty ranks given one idle node")
    return out


def _as_data_deps(n: pb.Node) -> None:
    """Every dependency of ``n`` as a data dependency: Chakra's own feeder (``src/feeder/et_feeder.cpp``)
    follows only ``data_deps``, ASTRA-sim's ``feeder_v3`` both lists alike."""
    deps = list(dict.fromkeys([*n.data_deps, *n.ctrl_deps]))
    del n.ctrl_deps[:]
    del n.data_deps[:]
    n.data_deps.extend(deps)


@dataclass(frozen=True, slots=True)
class _Wait:
    """A wait node as ASTRA-sim runs it (:func:`model_waits`)."""

    work_ns: int
    """Its work after the communication or GPU work it waited for."""
    hidden: tuple[int, ...] = ()
    """A host-time node's hidden wait: the ids of the communication nodes it waited for, which the trace
    does not name (the export adds them to its dependencies)."""


def model_waits(run: RunTrace) -> dict[int, dict[int, _Wait]]:
    """Per rank, by node id, the nodes ASTRA-sim runs for only their work after the communication they
    waited for, as the replay's execution model reads them (:mod:`skewlens.replay.execution`, "Wait
    nodes"): ASTRA-sim starts such a node once that communication completes, and its recorded time before
    was that communication's.

    - a wait node whose trace names what it waited for: its work after the communication or GPU work
      its own dependencies name (:func:`~skewlens.replay.execution.recorded_wait_work_ns`), where that is
      less than its recorded duration; a wait the model infers is not cut, ASTRA-sim's graph not holding
      it;
    - a host-time node (``untraced``, the ``compute`` gap) in which the model infers a hidden wait (DDP's
      reducer waiting for its buckets: :func:`~skewlens.replay.execution.hidden_wait_edges`): its work
      after the wait (:attr:`~skewlens.replay.execution.RankModel.work_ns`), and the communication nodes
      it waited for, which the export makes its dependencies: written whole, its recorded wait would
      stand in for the one ASTRA-sim models.

    ``run``: loaded as ``skewlens check`` loads it, its errors collected (:func:`_loaded`)."""
    from skewlens.replay.execution import execution_model, hidden_wait_edges, recorded_wait_work_ns

    em = execution_model(run)
    out: dict[int, dict[int, _Wait]] = {}
    for r, m in em.ranks.items():
        rt = run.ranks[r]
        work = recorded_wait_work_ns(rt, m)
        waits = {int(rt.node_id[i]): _Wait(int(work[i])) for i in (work != m.dur_ns).nonzero()[0].tolist()}
        src, dst = hidden_wait_edges(rt, m)
        awaited: dict[int, list[int]] = {}
        for s_, d_ in zip(src.tolist(), dst.tolist(), strict=True):
            awaited.setdefault(d_, []).append(int(rt.node_id[s_]))
        for d, ss in awaited.items():
            waits[int(rt.node_id[d])] = _Wait(int(m.work_ns[d]), tuple(ss))
        out[r] = waits
    return out


def _comm_size(a: Mapping[str, Any]) -> int:
    """A communication node's ``comm_size``: Chakra's ``tensor_size`` where it has none (a foreign trace)."""
    size = _int_attr(a, Attr.COMM_SIZE)
    return size if size is not None else _int_attr(a, "tensor_size") or 0


def _nonempty(size: int, counts: _Counts) -> int:
    """``size``, at least :data:`MIN_COMM_BYTES`."""
    if size >= MIN_COMM_BYTES:
        return size
    counts.add(f"empty messages written as {MIN_COMM_BYTES} byte")
    return MIN_COMM_BYTES


def _instances(nodes: Iterable[pb.Node]) -> Iterator[tuple[pb.Node, dict[str, Any], tuple[str, int]]]:
    """Each collective node, its attributes and its instance: (group, sequence number), or the n-th
    collective of its group in the file where the node records no sequence number."""
    counted: dict[str, int] = {}
    for n in nodes:
        if n.type != NodeType.COMM_COLL:
            continue
        a = node_attrs(n)
        pg = str(a.get(Attr.PG_NAME) or WORLD_GROUP_ID)
        seq = _int_attr(a, Attr.SEQ)
        if seq is None:
            seq = counted.get(pg, 0)
            counted[pg] = seq + 1
        yield n, a, (pg, seq)


def collective_sizes(
    files: Iterable[Path], groups: Mapping[str, AstraGroup], world: int
) -> dict[tuple[str, int], int]:
    """The ``comm_size`` every member of each all_to_all and scatter is written with, by (group, instance).

    ASTRA-sim matches a message to its receive by size (the analytical frontend's ``CallbackTracker`` keys
    on tag, source, destination and chunk size), and its all_to_all sends ``comm_size / p`` to each member
    (``Ring``: ``msg_size = data_size / nodes_in_ring``): members that recorded different sizes (uneven
    splits, an imported scatter's root) would never complete, and a scatter's piece would move ``1/p`` of
    what its root sent. Each member is written with the collective's message size,
    :func:`~skewlens.profiler.vocab.collective_message_bytes`, the size the replay's cost formulas take."""
    members: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    types: dict[tuple[str, int], CommType] = {}
    for f in files:
        for _n, a, key in _instances(n for _offset, n in iter_nodes(f)):
            raw = _int_attr(a, Attr.COMM_TYPE)
            if raw not in SHARED_SIZE_TYPES:
                continue
            sent, got = _int_attr(a, Attr.SEND_BYTES), _int_attr(a, Attr.RECV_BYTES)
            split = (sent, got) if sent is not None and got is not None else (-1, -1)
            members.setdefault(key, []).append((_comm_size(a), *split))
            types[key] = CommType(raw)
    out: dict[tuple[str, int], int] = {}
    for key, sizes in members.items():
        g = groups.get(key[0])
        p = len(g.ranks) if g is not None else world
        out[key] = collective_message_bytes(types[key], p, sizes)
    return out


def _group_of(n: pb.Node, a: Mapping[str, Any], ctx: _Rank) -> AstraGroup | None:
    """The node's group, its ``pg_name`` renamed to the group's ASTRA-sim id (None: the group of all NPUs)."""
    pg = a.get(Attr.PG_NAME)
    if pg is None or pg == "":
        return None
    g = ctx.groups.get(str(pg))
    if g is None:
        if str(pg) == WORLD_GROUP_ID:
            return None
        raise ValidationError(
            f"{ctx.path}: node {n.id} ({n.name!r}) names process group {pg!r}, which neither the manifest "
            f"nor the trace's process-group metadata lists"
        )
    if g.astra_id != g.source_name:
        set_attr(n, Attr.PG_NAME, g.astra_id)
        set_attr(n, SRC_PG_NAME, g.source_name)
    return g


def _rewrite_collective(n: pb.Node, a: Mapping[str, Any], ctx: _Rank, key: tuple[str, int]) -> None:
    raw = _int_attr(a, Attr.COMM_TYPE)
    try:
        src = CommType(raw) if raw is not None else None
    except ValueError:
        src = None
    group = _group_of(n, a, ctx)
    if (len(group.ranks) if group is not None else ctx.world) == 1:
        dst = ONE_MEMBER_AS  # nothing crosses the network; ASTRA-sim's ring over one NPU never completes
        ctx.counts.add(f"collectives of one-member groups -> {dst.name} (replayed)")
    else:
        dst = ASTRA_COMM_TYPE[src] if src is not None else UNKNOWN_COMM_AS
        if src is not dst:
            ctx.counts.add(f"{src.name if src is not None else 'unknown collective'} -> {dst.name}")
    if src is not dst:
        set_attr(n, SRC_COMM_TYPE, int(src) if src is not None else -1)
    set_attr(n, Attr.COMM_TYPE, int(dst))
    size = _comm_size(a)
    if src is CommType.BARRIER:
        size = max(size, BARRIER_BYTES)
    elif src in SHARED_SIZE_TYPES and dst is not ONE_MEMBER_AS:
        shared = ctx.shared_sizes.get(key, size)
        if shared != size:
            ctx.counts.add(f"{src.name} comm_size -> the collective's message size, the same on every member")
            size = shared
    set_attr(n, Attr.COMM_SIZE, _nonempty(size, ctx.counts))


def _rewrite_p2p(n: pb.Node, a: Mapping[str, Any], ctx: _Rank) -> None:
    path, rank = ctx.path, ctx.rank
    send = n.type == NodeType.COMM_SEND
    src = _int_attr(a, Attr.COMM_SRC)
    dst = _int_attr(a, Attr.COMM_DST)
    src = rank if src is None and send else src
    dst = rank if dst is None and not send else dst
    if src is None or dst is None:
        raise ValidationError(f"{path}: {'send' if send else 'recv'} node {n.id} ({n.name!r}) names no peer")
    if (src if send else dst) != rank:
        raise ValidationError(
            f"{path}: {'send' if send else 'recv'} node {n.id} ({n.name!r}) of rank {rank} has "
            f"comm_src={src}, comm_dst={dst}: ASTRA-sim issues sends on the sender, recvs on the receiver"
        )
    set_attr(n, Attr.COMM_SRC, src)
    set_attr(n, Attr.COMM_DST, dst)
    set_attr(n, Attr.COMM_TAG, _int_attr(a, Attr.COMM_TAG) or 0)
    set_attr(n, Attr.COMM_SIZE, _nonempty(_comm_size(a), ctx.counts))
    _group_of(n, a, ctx)


# ---------------------------------------------------------------------------------------- configs


def system_config() -> dict[str, Any]:
    """An example ASTRA-sim system configuration: ring collectives, replayed compute (no roofline)."""
    return {
        "scheduling-policy": "FIFO",
        "endpoint-delay": 10,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 1,
        "all-reduce-implementation": ["ring"],
        "all-gather-implementation": ["ring"],
        "reduce-scatter-implementation": ["ring"],
        "all-to-all-implementation": ["direct"],
        "collective-optimization": "baseline",
        "local-mem-bw": 50,
        "boost-mode": 0,
        "roofline-enabled": 0,
    }


def network_config(npus: int, bandwidth_gbps: float, latency_ns: float) -> str:
    """An example analytical-network configuration (YAML): one switch joining ``npus`` NPUs."""
    return (
        "# one switch joining every NPU; an example to replace with the network to study\n"
        "topology: [ Switch ]\n"
        f"npus_count: [ {npus} ]\n"
        f"bandwidth: [ {float(bandwidth_gbps)} ]  # GB/s per link\n"
        f"latency: [ {float(latency_ns)} ]  # ns per link\n"
    )


def astra_command(
    binary: str,
    prefix: Path,
    *,
    comm_groups: Path,
    system: Path | str,
    network: Path | str,
    memory: Path | str,
    log_dir: Path,
) -> tuple[str, ...]:
    """ASTRA-sim's command line for an exported workload."""
    return (
        binary,
        f"--workload-configuration={prefix}",
        f"--comm-group-configuration={comm_groups}",
        f"--system-configuration={system}",
        f"--network-configuration={network}",
        f"--remote-memory-configuration={memory}",
        f"--logging-folder={log_dir}",
    )


# ----------------------------------------------------------------------------------------- export


def _loaded(run_dir: str | Path, progress: Progress, *, strict: bool, allow_option: str) -> RunTrace:
    """The run, loaded once with its errors collected: ``strict``, as ``skewlens check`` checks it, refused
    where it finds errors; else leniently (members that disagree left unmatched)."""
    from skewlens.profiler.store.issues import IssueLog
    from skewlens.profiler.store.load import load_run
    from skewlens.profiler.store.validate import refusal, validate_run

    if not strict:
        return load_run(run_dir, lenient=True, sink=IssueLog(strict=False))
    report = validate_run(run_dir, progress=progress)
    if report.errors or report.run is None:
        notes = report.run.manifest.notes if report.run is not None else None
        raise refusal(run_dir, report.errors, "not exported", anyway=allow_option, notes=notes)
    return report.run


def export_astra_sim(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    prefix: str = DEFAULT_PREFIX,
    configs: bool = True,
    bandwidth_gbps: float = 50.0,
    latency_ns: float = 500.0,
    host_compute: HostCompute = "auto",
    strict: bool = True,
    binary: str = ASTRA_BINARY,
    progress: Progress | None = NO_PROGRESS,
    allow_option: str = "strict=False",
) -> AstraExport:
    """Write ``run_dir`` as an ASTRA-sim workload into ``out_dir`` (replaced atomically).

    ``configs`` writes the example system, network (one switch, ``bandwidth_gbps`` and ``latency_ns`` per
    link) and remote-memory configurations beside the traces; without it the command names placeholders.
    ``host_compute``: ``"npu"`` exports every compute node as the NPU's compute, ``"drop"`` drops host
    compute nodes, ``"auto"`` drops them only on ranks that also have GPU kernels. ``strict`` refuses a
    run that ``skewlens check`` finds errors in (ASTRA-sim would stall on an unmatched collective), naming
    ``allow_option``, how the caller's user asks to export it all the same.
    """
    progress = given(progress)
    from skewlens.profiler.store.issues import rank_ranges, unmatched_comm
    from skewlens.profiler.store.load import locate_run, parse_pg_init

    if not prefix or "/" in prefix or prefix.startswith("."):
        raise SkewlensError(f"workload prefix {prefix!r}: expected a plain file name")
    files = locate_run(run_dir)
    manifest = files.manifest
    world = manifest.world_size
    absent = sorted(set(range(world)) - set(files.files))
    if absent:
        raise ValidationError(
            f"{run_dir}: rank(s) {rank_ranges(absent)} of {world} have no trace; ASTRA-sim needs one per NPU"
        )
    for r, f in sorted(files.files.items()):
        if not f.exists():
            raise ValidationError(f"{f}: rank {r} is listed but its trace file is missing")
    run = _loaded(run_dir, progress, strict=strict, allow_option=allow_option)
    if strict and (left := unmatched_comm(run)) is not None:  # a warning to check, a stall to ASTRA-sim
        raise ValidationError(
            f"{run_dir}: not exported: {left}: ASTRA-sim would stall on each, waiting for peers that never "
            f"issue it (skewlens check says why they were left out of matching; {allow_option} exports them "
            "all the same)"
        )
    listed = list(manifest.process_groups)
    names = {g.name for g in listed}
    for f in files.files.values():
        for _offset, n in iter_nodes(f):  # the process-group node leads the file (ours and PyTorch's)
            if n.type != NodeType.METADATA:
                break
            if n.name == PG_INIT_NODE_NAME:
                for g in parse_pg_init(n.inputs.values, f).values():
                    if g.name not in names:
                        listed.append(g)
                        names.add(g.name)
    groups = astra_groups(listed, world)

    out = Path(out_dir)
    check_replaceable(out, marker=EXPORT_FILE, fmt=EXPORT_FORMAT, what="ASTRA-sim export")
    final = out.resolve()
    counts = _Counts()
    nodes: dict[int, int] = {}
    shared_sizes = collective_sizes(files.files.values(), groups, world)
    waits = model_waits(run)
    del run  # not held while the ranks are rewritten
    with staging_dir(out) as tmp:
        with progress.task("writing ASTRA-sim traces", len(files.files)) as advance:
            for r, f in sorted(files.files.items()):
                ctx = _Rank(
                    path=f,
                    rank=r,
                    world=world,
                    groups=groups,
                    host_compute=host_compute,
                    counts=counts,
                    steps=tuple((s.start_ns, s.end_ns) for s in manifest.steps if s.rank == r),
                    shared_sizes=shared_sizes,
                    waits=waits.get(r, {}),
                )
                rewritten = _rewrite_rank(ctx)
                meta: dict[str, AttrValue] = {
                    "schema": ASTRA_SCHEMA,
                    "rank": r,
                    "world_size": world,
                    "source": str(Path(f).resolve()),  # as export.json's: the same wherever run from
                }
                trace = tmp / f"{prefix}.{r}.et"
                try:
                    with EtWriter(trace, meta) as w:
                        w.write_all(rewritten)
                except OSError as e:  # its write named no file: 'cannot write OUT: File too large'
                    raise SkewlensError(f"cannot write {trace}: {why_not_written(e, trace)}") from None
                nodes[r] = len(rewritten)
                advance()
        # each through write_text_atomic, whose error names the file (a full disk: 'cannot write
        # OUT/comm_groups.json: File too large'); a bare write_text's named none ('cannot write OUT: ...')
        write_text_atomic(
            tmp / COMM_GROUPS_FILE, json.dumps(comm_group_json(groups.values()), indent=2) + "\n"
        )
        placeholders = ("<SYSTEM.json>", "<NETWORK.yml>", "<REMOTE_MEMORY.json>")
        sys_p = net_p = mem_p = None
        if configs:
            write_text_atomic(tmp / SYSTEM_FILE, json.dumps(system_config(), indent=2) + "\n")
            write_text_atomic(tmp / NETWORK_FILE, network_config(world, bandwidth_gbps, latency_ns))
            write_text_atomic(
                tmp / MEMORY_FILE, json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=2) + "\n"
            )
            sys_p, net_p, mem_p = final / SYSTEM_FILE, final / NETWORK_FILE, final / MEMORY_FILE
        command = astra_command(
            binary,
            final / prefix,
            comm_groups=final / COMM_GROUPS_FILE,
            system=sys_p or placeholders[0],
            network=net_p or placeholders[1],
            memory=mem_p or placeholders[2],
            log_dir=final / "log",
        )
        notes: list[str] = []
        dropped_note = _dropped_host_note(counts, host_compute)
        if dropped_note is not None:
            notes.append(dropped_note)
        if "empty" in str(final / COMM_GROUPS_FILE):
            notes.append(
                f"the communicator-group path {final / COMM_GROUPS_FILE} contains 'empty', which ASTRA-sim "
                f"takes for 'no file': choose an --out without that word if the run has sub-groups"
            )
        write_text_atomic(
            tmp / EXPORT_FILE,
            json.dumps(
                {
                    "format": EXPORT_FORMAT,
                    "version": EXPORT_VERSION,
                    "source": str(Path(run_dir).resolve()),
                    "prefix": prefix,
                    "world_size": world,
                    "nodes": {str(r): k for r, k in nodes.items()},
                    "groups": [
                        {"source_name": g.source_name, "astra_id": g.astra_id, "ranks": list(g.ranks)}
                        for g in groups.values()
                    ],
                    "changes": counts.changes,
                    "command": list(command),
                    "notes": notes,
                },
                indent=2,
            )
            + "\n",
        )
        for p in tmp.iterdir():
            p.chmod(FILE_MODE)
        replace_dir(tmp, out)
    return AstraExport(
        out_dir=out,
        prefix=final / prefix,
        traces={r: final / f"{prefix}.{r}.et" for r in nodes},
        nodes=nodes,
        comm_groups=final / COMM_GROUPS_FILE,
        groups=tuple(groups.values()),
        system_config=sys_p,
        network_config=net_p,
        memory_config=mem_p,
        command=command,
        changes=dict(counts.changes),
        notes=tuple(notes),
    )
