"""The in-memory multi-rank trace model, columnar (numpy arrays per rank, not one object per node).

Row ``i`` of every column of a :class:`RankTrace` is the ``i``-th node of that rank's file, in file
order. Dependencies are stored CSR-style as row positions (not node ids), so consumers never need a
dict lookup per edge. Sentinels: ``-1`` for "none" in integer columns (``step``, ``comm_type``,
``pg``, ``seq``, ``src``, ``dst``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from skewlens.profiler.manifest import Manifest, ProcessGroupInfo
from skewlens.profiler.vocab import CommType, NodeType

if TYPE_CHECKING:
    from skewlens.profiler.store.issues import DroppedSplits, SkippedComm

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
B = npt.NDArray[np.bool_]

DEP_CTRL = 0
DEP_DATA = 1

#: The key of :meth:`RankTrace.__getstate__` that lists its read-only columns.
_READ_ONLY = "__read_only__"


def seal_arrays(values: Iterable[object]) -> None:
    """Make each numpy array among ``values`` read-only (other values are left): a run's columns, its
    execution model, its analyses' index and a replay's result are each shared by every reader, so a
    write into one would change the others' answers."""
    for value in values:
        if isinstance(value, np.ndarray):
            value.flags.writeable = False


@functools.lru_cache(maxsize=32)
def _type_table(types: tuple[int, ...]) -> B:
    table = np.zeros(256, dtype=np.bool_)
    table[[t & 0xFF for t in types]] = True
    table.flags.writeable = False  # shared by every caller (cached)
    return table


def type_mask(node_type: npt.NDArray[np.integer], types: Iterable[int]) -> B:
    """Whether each row's node type is one of ``types``: a lookup in a 256-entry table for the store's
    ``int8`` column (``np.isin`` costs tens of microseconds a call, and a run of a thousand small ranks
    makes thousands of such calls)."""
    wanted = tuple(sorted({int(t) for t in types}))
    if node_type.dtype != np.int8:
        return np.isin(node_type, wanted)
    return _type_table(wanted)[node_type.view(np.uint8)]


@dataclass(eq=False, kw_only=True, slots=True)
class RankTrace:
    """All nodes of one rank, as columns."""

    rank: int
    """Global rank."""
    path: str
    """File the trace was read from (for error messages)."""
    node_id: I64
    """Chakra node id (unique within the rank)."""
    node_type: I8
    """Chakra ``NodeType`` value."""
    name_idx: I32
    """Index into ``names``."""
    names: list[str]
    """Dictionary of node names."""
    start_ns: I64
    """Start on the aligned clock, ns."""
    dur_ns: I64
    """Duration, ns."""
    stream: I64
    """Thread id or CUDA stream the node ran on (nodes on one stream run in order)."""
    step: I32
    """Training step, -1 when unknown."""
    comm_type: I8
    """Chakra ``CollectiveCommType`` for COMM_COLL nodes, else -1."""
    comm_bytes: I64
    """Bytes this rank sends/receives/contributes (Chakra ``comm_size``), 0 for compute."""
    pg: I32
    """Index into ``RunTrace.pg_names`` of the node's process group, -1 for none."""
    seq: I64
    """Per-group sequence number of a collective (or p2p op where known), -1 for none."""
    src: I32
    """Global rank of the sender (send/recv), -1 for none."""
    dst: I32
    """Global rank of the receiver (send/recv), -1 for none."""
    tag: I64
    """p2p tag (0 where none)."""
    is_cpu: B
    """True for host-side ops, False for GPU kernels."""
    dep_ptr: I64
    """CSR offsets, length n+1: deps of row i are ``dep_idx[dep_ptr[i]:dep_ptr[i+1]]``."""
    dep_idx: I64
    """Row positions (within this rank) of the nodes each row depends on."""
    dep_kind: I8
    """``DEP_CTRL`` or ``DEP_DATA`` per entry of ``dep_idx``."""
    batch: I64 | None = None
    """Per row, the ``batch_isend_irecv`` call a send/recv was issued in (numbered per rank), -1 for
    none; None for a trace that records no batches."""
    send_bytes: I64 | None = None
    """Per row, the bytes an all_to_all with uneven splits sends to the other members of its group (its own
    chunk left out; ``skl_send_bytes``), -1 where not recorded (even splits, other nodes); None for a trace
    that records none."""
    recv_bytes: I64 | None = None
    """Likewise, the bytes it receives from them (``skl_recv_bytes``)."""
    split_ptr: I64 | None = None
    """CSR offsets, length n+1: an uneven all_to_all's per-member splits (``skl_send_splits`` /
    ``skl_recv_splits``, group-rank order, its own chunk included) are
    ``split_send_bytes[split_ptr[i]:split_ptr[i+1]]`` and likewise ``split_recv_bytes``; empty for rows
    without; None (all three) for a trace that records none."""
    split_send_bytes: I64 | None = None
    """Bytes each row sends to each member of its group (see ``split_ptr``)."""
    split_recv_bytes: I64 | None = None
    """Bytes each row receives from each member of its group (see ``split_ptr``)."""
    launch_ns: I64 | None = None
    """Per row, the recorded start of the runtime call that launched a GPU node (``skl_launch_ns``), -1
    where unknown; None for a trace that records no launches."""
    launched_in: I32 | None = None
    """Per row, the row of the host node whose launch call launched this GPU node where that host node then
    synchronised on it (``skl_launched_in``: a launch, not a dependency, which would close a cycle), -1
    elsewhere; None for a trace that records none."""
    return_ns: I64 | None = None
    """Per row, when the call that issued an asynchronous communication node returned (``skl_return_ns``),
    -1 where not recorded; None for a trace that records none."""
    dtype_idx: I8 | None = None
    """Per row, index into ``dtypes`` of the dtype of a communication node's tensor (``skl_dtype``), -1 where
    not recorded; None for a trace that records none."""
    dtypes: list[str] = field(default_factory=list)
    """Dictionary of dtype names (``bfloat16``) that ``dtype_idx`` points into."""
    streams: dict[int, str] = field(default_factory=dict)
    """Optional labels of streams (``"thread 1234"``, ``"cuda stream 7"``)."""
    notes: list[str] = field(default_factory=list)
    """What the loader inferred for this rank (no start times, sequence numbers numbered in file order)."""
    untimed: bool = False
    """The trace records no start time on any node (Chakra's generator and ``text2chakra`` write none): its
    ``start_ns`` are the loader's layout, not measured (``notes`` says which)."""

    def __len__(self) -> int:
        return int(self.node_id.shape[0])

    @property
    def end_ns(self) -> I64:
        return self.start_ns + self.dur_ns

    def name(self, i: int) -> str:
        return self.names[int(self.name_idx[i])]

    def deps_of(self, i: int) -> I64:
        return self.dep_idx[self.dep_ptr[i] : self.dep_ptr[i + 1]]

    def rows_of_type(self, *types: NodeType) -> I64:
        return np.flatnonzero(type_mask(self.node_type, types))

    def seal(self) -> None:
        """Make every column read-only, as the loader hands a rank out: the execution model is derived once
        per :class:`RunTrace` and cached (``skewlens.replay.execution``), so a column edited in place would
        be replayed and analysed against the model of the run as loaded. A what-if edits a copy
        (``dataclasses.replace`` with new arrays, in a new ``RunTrace``) or is a slowdown."""
        seal_arrays(getattr(self, f, None) for f in self.__slots__)

    def __getstate__(self) -> dict[str, object]:
        """What pickling (joblib, multiprocessing) and ``copy.deepcopy`` keep: the fields, and which columns
        are read-only (:meth:`seal`). numpy unpickles every array writable: a loaded run sent to a joblib
        worker, or deep-copied, could be edited in place after its first simulate, and was then replayed
        against the execution model cached for it as it was (rank 7 of the 8-GPU DLRM trace with its
        durations doubled: 20.81 ms, 22.59 ms from a copy edited before any simulate)."""
        state: dict[str, object] = {f: getattr(self, f) for f in self.__slots__ if hasattr(self, f)}
        state[_READ_ONLY] = tuple(
            f for f, v in state.items() if isinstance(v, np.ndarray) and not v.flags.writeable
        )
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for f, value in state.items():
            if f != _READ_ONLY:
                object.__setattr__(self, f, value)
        for f in cast("tuple[str, ...]", state.get(_READ_ONLY, ())):
            getattr(self, f).flags.writeable = False


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveInstance:
    """One collective call, identified by (process group, sequence number), with its members' rows."""

    pg_name: str
    """Process group name."""
    seq: int
    """Per-group sequence number."""
    comm_type: CommType
    """Collective type."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group order."""
    rows: tuple[int, ...]
    """Row of the instance's node in each member's RankTrace, aligned with ``ranks``."""
    comm_bytes: tuple[int, ...]
    """Bytes of each member's call, aligned with ``ranks``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class P2PPair:
    """A send matched with its recv."""

    src_rank: int
    """Sender's global rank."""
    src_row: int
    """Row of the send node in the sender's RankTrace."""
    dst_rank: int
    """Receiver's global rank."""
    dst_row: int
    """Row of the recv node in the receiver's RankTrace."""
    comm_bytes: int
    """Message size in bytes."""
    tag: int
    """Tag."""
    pg_name: str
    """Process group of the pair ('' when unknown)."""


@dataclass(eq=False, kw_only=True, slots=True, weakref_slot=True)
class RunTrace:
    """A whole multi-rank run: manifest, one RankTrace per rank, and communication matched across ranks."""

    run_dir: str
    """Directory (or file prefix) the run was loaded from."""
    manifest: Manifest
    """The run's manifest (synthesised for runs without one)."""
    ranks: dict[int, RankTrace]
    """Per-rank traces by global rank."""
    pg_names: list[str]
    """Dictionary of process-group names used by ``RankTrace.pg``."""
    process_groups: dict[str, ProcessGroupInfo]
    """Process groups by name."""
    collectives: list[CollectiveInstance] = field(default_factory=list)
    """Matched collective instances, ordered by (group, seq)."""
    p2p: list[P2PPair] = field(default_factory=list)
    """Matched send/recv pairs."""
    incomplete_steps: tuple[int, ...] = ()
    """Steps some of whose communication is not in every trace (a flight recorder lost collectives,
    ``manifest.lost_collectives``; a rank stopped inside the step, its trace ending before the others'; a
    thread that issued collectives across the window's start or end, inside one rank's window and outside
    another's): it is left out of matching, and analyses should not take these steps as whole."""
    steps_differ: str = ""
    """Where collectives were issued in different steps on different members (the ranks marked steps
    differently, so a step number names different work on different ranks): the loader's
    ``step-mismatch`` warning; '' where every matched collective's members agree."""
    skipped_comm: tuple[SkippedComm, ...] = ()
    """Communication whose members disagree across ranks, left out of ``collectives`` / ``p2p`` by a
    lenient load (its nodes keep their recorded durations and synchronise with no other rank)."""
    left_out_ranks: tuple[tuple[int, str], ...] = ()
    """(rank, why) of the ranks a lenient load left out because their trace file is missing or cannot be
    read; the manifest then lists them among ``missing_ranks``, as ranks without a trace."""
    dropped_splits: tuple[DroppedSplits, ...] = ()
    """All_to_all nodes whose recorded splits are inconsistent, kept by a lenient load without them (each
    keeps its ``comm_size`` and is an even all_to_all; its rank's split and ``send_bytes`` / ``recv_bytes``
    columns hold nothing for it), in rank and file order."""
    source_ranks: dict[int, int] = field(default_factory=dict)
    """rank -> the captured rank whose trace it copies, for a run extrapolated to another size
    (``skewlens.replay.scale``); empty for a run as captured, whose every rank is its own source."""

    def source_rank(self, rank: int) -> int:
        """The captured rank whose trace ``rank`` replays: itself, unless the run was extrapolated."""
        return self.source_ranks.get(rank, rank)

    @property
    def world_size(self) -> int:
        return self.manifest.world_size

    def pg_index(self, name: str) -> int:
        return self.pg_names.index(name)


def not_a_run(value: object) -> str | None:
    """What is wrong with ``value`` given where a loaded run is meant, None for a :class:`RunTrace`: a
    notebook's ``simulate("runs/x")`` was ``TypeError: cannot create weak reference to 'str' object``, its
    ``analyze_run("runs/x")`` ``AttributeError: 'str' object has no attribute 'ranks'``."""
    if isinstance(value, RunTrace):
        return None
    if isinstance(value, str | os.PathLike):
        return (
            f"got the path {os.fspath(value)!r}, not a loaded run: load it first "
            f"(skewlens.profiler.store.validate.load_validated({os.fspath(value)!r}))"
        )
    return f"expected a loaded run (a RunTrace, from load_validated(path)), got {type(value).__name__}"


def group_members(run: RunTrace, inst: CollectiveInstance) -> tuple[int, ...]:
    """The ranks a collective runs among: its process group's (the loader has read a group listed with no
    ranks as the whole world: ``manifest.with_world_ranks``), which a run with ranks missing has more of than
    ``inst.ranks`` (the members with a trace); ``inst.ranks`` where the group is not known or does not hold
    them."""
    pg = run.process_groups.get(inst.pg_name)
    if pg is None:
        return inst.ranks
    full = pg.ranks
    return full if len(full) > len(inst.ranks) and set(inst.ranks) <= set(full) else inst.ranks


def group_rank_order(run: RunTrace, inst: CollectiveInstance) -> tuple[int, ...]:
    """A collective's members (:func:`group_members`) in group-rank order, the order of an all_to_all's
    split lists: its process group's ranks as recorded, which torch sorts unless the program created the
    group with ``new_group(..., sort_ranks=False)``; sorted where the group is not known."""
    members = group_members(run, inst)
    pg = run.process_groups.get(inst.pg_name)
    if pg is not None and set(pg.ranks) == set(members):
        return tuple(pg.ranks)
    return tuple(sorted(members))
