"""Collective skew: who arrived last at each synchronisation point, who waited, and why.

For every collective instance and every matched send/recv pair (an *event*):

- each member's arrival (its COMM node's start), wait (``awaited arrival - my arrival``) and transfer
  (``my end - awaited arrival``), and the skew (``last - first arrival``); the awaited arrival is the last
  one, or for a rooted collective with a known root what the execution model says the member waits for
  (``replay.execution.waits_for``: a broadcast's, scatter's or gather's root; a broadcast root waits for
  no one);
- the late member (the one whose arrival the longest wait was for: the last, or such a root; where nobody
  waited, the root) and why it was late. The late
  member's *window* since the previous common synchronisation point (the previous instance of the same
  process group; for p2p, the last communication completed on that rank) is compared with the median
  member's window:

  - compute: summed COMP durations per op name; the ops that grew most are named;
  - host gap: idle time before nodes (``start - latest dependency end``), split into gaps right before a
    send (``late_send``) and other gaps (``host_gap``), whose cause says where the gap that grew most sat
    on the late member's thread (:func:`_gap_place`: ``after Optimizer.step#SGD.step, before
    c10d::barrier``);
  - earlier wait: time the late member itself spent waiting for peers at communication in its window
    (the breakdown's ``W``: not a wait node's wait for the transfer), where not hidden under compute (an
    asynchronous all_reduce waiting under backward compute costs nothing). Then the lateness is passed
    on: the event is *blamed* on whoever caused that earlier wait (events are processed in order of their
    last arrival, so that rank is already known).

  The largest positive difference is the cause. A recv that waits for a send whose sender idled right
  before it (host gap before the send >= half the wait) is a ``late_send``, blamed on the sender.

Each member's wait is attributed to the event's blamed rank (the blamed rank's own wait, at an event passed
on to it, is not: it waited for someone else); per rank and step the *exposed* part of it
(not hidden under compute on the waiting rank) names the top straggler of each step. A rank's time is
counted once: waits that overlap on one rank (four asynchronous recvs waiting at once) are united per
waiting rank before they are summed. Pure functions; rendering is elsewhere.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from skewlens.analysis.index import (
    I32,
    I64,
    B,
    Coverage,
    RankIndex,
    RunIndex,
    last_comm_end_before,
    rows_starting_in,
)
from skewlens.analysis.records import CauseKind, CollectiveSkewRecord
from skewlens.profiler.autograd import backward_function
from skewlens.profiler.manifest import HASHED_GROUP_NAME
from skewlens.profiler.store.issues import rank_ranges
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.execution import HOST_TIME_NAMES, clock_contradictions, execution_model, held_by

#: Number of grown ops named in a compute cause.
TOP_OPS = 3
#: Least growth of an op named in a compute cause (shown as +0.1 ms), and of a cause: a smaller one shows as
#: +0.0 ms and explains nothing.
SHOWN_NS = 50_000
#: How many earlier events of the late rank are searched for the last common synchronisation point.
COMMON_LOOKBACK = 256
#: Characters of a hashed group name (torch's 40 hex digits for a group made with
#: ``use_local_synchronization=True``) kept in a label, before ``…``.
HASHED_GROUP_SHOWN = 8


def group_label(pg_name: str) -> str:
    """``pg_name`` as labels show it: a hashed name cut to its first :data:`HASHED_GROUP_SHOWN` digits and
    ``…`` (whole, it took a table's width from every other column), any other whole."""
    return f"{pg_name[:HASHED_GROUP_SHOWN]}…" if HASHED_GROUP_NAME.fullmatch(pg_name) else pg_name


#: An autograd node's name (``MmBackward0``, DTensor's ``RedistributeBackward``, a custom Function's
#: ``<Name>Backward``): an operator the engine ran (recomputation inside it too), not a program's scope.
AUTOGRAD_NODE = re.compile(r"Backward\d*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """Why a member was late."""

    kind: CauseKind
    """Category."""
    delta_ns: int
    """Growth of that category, late member minus median member."""
    op: str | None = None
    """Op that grew most (compute)."""
    ops: tuple[tuple[str, int], ...] = ()
    """Grown ops with their growth in ns, largest first (compute)."""
    op_median_ns: int = 0
    """Compute, of one event: the first-named op's time in the median member's window (what it grew from:
    a stall where its growth is larger); 0 in a cause summed over events."""
    op_on_gpu: bool = False
    """Compute, of one event: whether the first-named op is GPU work (its rows ran on a GPU stream,
    :attr:`~skewlens.analysis.index.RunIndex.gpu_names`: a kernel, whose growth is a slower GPU, not a scope
    of the program's that stalled); False in a cause summed over events."""
    blamed_from: int = -1
    """For an earlier wait: the rank that caused it."""
    via_rank: int = -1
    """When the lateness was passed on by another rank than the blamed one: that rank (else -1)."""
    passed_on: bool = False
    """Whether this is an earlier event's cause, passed on by an earlier wait of the late member (also
    when that member is the blamed rank itself, whose own lateness came back to it: ``via_rank`` is -1)."""
    untraced: tuple[int, ...] = ()
    """Of an :attr:`CauseKind.UNTRACED` cause: the group's members without a trace."""
    gap_at: str = ""
    """Of a host-gap cause: where the gap that grew most lay on the late member's thread, between the traced
    ops around it (:func:`_gap_place`): ``after Optimizer.step#SGD.step, before c10d::barrier``, ``at the
    start of step 4, before aten::randn``, ``before aten::mm``; empty where not known."""

    @property
    def stalled_scope(self) -> bool:
        """Whether this cause is compute and its first-named op is a scope that stalled: not an operator
        (``aten::mm``, ``c10d::...``, ``autograd::engine::...``: a slower operator is a slower rank, which the
        what-if cost compares with the median one) nor GPU work (``Cause.op_on_gpu``: a kernel, a slower GPU,
        ``slow_gpu``; told apart by the stream its rows ran on, not by its name: cuBLAS's
        ``sm90_xmma_gemm_...`` has no ``void`` nor ``::``, and a kernel of another GPU model's name, one the
        median member never ran, was "its scope ..., which the median member did not run", an op replay
        deleting it), a name such as ``enumerate(DataLoader)#...``, ``Optimizer.step#SGD.step`` or a
        ``record_function``'s; grown by half the cause or more, and by more than it took on the median member.
        Nor the capture's own host-time nodes (:data:`~skewlens.replay.execution.HOST_TIME_NAMES`): the
        ``collectives`` level's ``compute`` is all of a rank's work between two collectives, which an ``op``
        replay at factor 0 would take away whole. Nor an autograd node (:data:`AUTOGRAD_NODE`): an op replay
        would take its whole backward op away."""
        if self.kind is not CauseKind.COMPUTE or not self.ops:
            return False
        name, grew = self.ops[0]
        scope = (
            not self.op_on_gpu
            and "::" not in name
            and name not in HOST_TIME_NAMES
            and AUTOGRAD_NODE.search(name) is None
        )
        return scope and 2 * grew >= self.delta_ns and grew > self.op_median_ns

    @property
    def text(self) -> str:
        base = self._base_text()
        return f"{base} (passed on by rank {self.via_rank})" if self.via_rank >= 0 and base else base

    def _base_text(self) -> str:
        ms = self.delta_ns / 1e6
        if self.kind is CauseKind.COMPUTE:
            # ops whose growth rounds to +0.0 ms name nothing: where none grew more, the whole growth reads
            ops = [(n, d) for n, d in self.ops if d >= SHOWN_NS]
            grown = ", ".join(f"{_short(n)} +{d / 1e6:.1f} ms" for n, d in ops) or f"+{ms:.1f} ms"
            return f"compute grew: {grown}"
        if self.kind is CauseKind.HOST_GAP:
            at = f" ({self.gap_at})" if self.gap_at else ""
            return f"host idle/gap +{ms:.1f} ms{at}"
        if self.kind is CauseKind.LATE_SEND:
            return f"late send: host gap +{ms:.1f} ms before the send"
        if self.kind is CauseKind.WAIT:
            by = f" (caused by rank {self.blamed_from})" if self.blamed_from >= 0 else ""
            return f"earlier wait +{ms:.1f} ms{by}"
        if self.kind is CauseKind.UNTRACED:
            return (
                f"rank(s) {rank_ranges(list(self.untraced))} of the group have no trace: "
                "who was late is unknown"
            )
        return ""


def _short(name: str, limit: int = 64) -> str:
    """An op's name in a cause, cut to ``limit`` characters: a backward op without the autograd engine's
    prefix; a kernel by its function's name, without its signature (``void f<int>(float*, int)``: ``f``).
    Only a name that ends in its parenthesis, opened right after the function's name, has a signature:
    ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` (the DataLoader's scope) and
    ``train.py(42): step`` keep theirs, and so does a name whose parenthesis follows a space, a note on
    what the name names: FSDP2's scopes' module (``FSDP::all_gather (layers.0)``, which was cut to
    ``FSDP::all_gather `` and lost which layer's all-gather grew), a copy's direction (``Memcpy HtoD
    (Pageable -> Device)``)."""
    name = backward_function(name)
    if name.startswith("void "):
        name = re.split(r"[<(]", name[5:], maxsplit=1)[0] or name
    elif "(" in name and name.endswith(")") and not name.split("(", 1)[0].endswith(" "):
        name = name.split("(", 1)[0] or name
    return name if len(name) <= limit else name[: limit - 1] + "…"


NO_CAUSE = Cause(kind=CauseKind.NONE, delta_ns=0)
#: How PyTorch describes the group of a DeviceMesh dimension: ``mesh_`` and the dimension's name.
MESH_DESC_PREFIX = "mesh_"


@dataclass(frozen=True, kw_only=True, slots=True)
class SkewEvent:
    """One synchronisation point: a collective instance or a send/recv pair."""

    kind: str
    """``collective`` or ``p2p``."""
    pg_name: str
    """Process group name."""
    seq: int
    """Sequence number (collective) or pair index (p2p)."""
    comm_type: str
    """Collective type name or ``SEND_RECV``."""
    step: int
    """Step of the late member's node."""
    ranks: tuple[int, ...]
    """Members (p2p: sender, receiver)."""
    rows: tuple[int, ...]
    """Members' rows."""
    node_ids: tuple[int, ...]
    """Members' node ids."""
    comm_bytes: I64
    """Bytes of the members' calls as recorded."""
    arrival_ns: I64
    """Members' arrivals."""
    end_ns: I64
    """Members' completions."""
    wait_ns: I64
    """Members' waits."""
    exposed_wait_ns: I64
    """Members' waits not hidden under compute on their rank."""
    late_rank: int
    """Member whose arrival the longest wait was for: the last to arrive, or a rooted collective's known
    root (:func:`~skewlens.replay.execution.waits_for`); where nobody waited, that root."""
    blamed_rank: int
    """Rank the waits are attributed to."""
    late_by_ns: int
    """Late member's arrival minus the median arrival of the others (0 where it was not later)."""
    cause: Cause
    """Why the late member was late."""
    pg_desc: str = ""
    """The group's description as the capture recorded it (``mesh_dp`` for a DeviceMesh dimension)."""
    cause_first_step: int = -1
    """Of a ``compute grew`` or ``host idle/gap`` cause (not passed on): the earliest step where what it
    names grew in the late member's window (since the previous synchronisation point) against the median
    member's (:func:`_first_step_of`), which may be steps before :attr:`step` where the window spans steps
    without this group's collectives (Local SGD averaging every K steps: the slow forward of all K local
    steps); else -1."""
    clock_contradicted: bool = False
    """Whether the members' recorded times contradict each other (a member done before one it waits for
    began: clocks that disagree, :func:`~skewlens.replay.execution.clock_contradictions`): its skew, waits
    and cause are not meaningful."""

    @property
    def transfer_ns(self) -> I64:
        """Members' transfers: completion less the arrival each waited for (``end - arrival - wait``; 0 for a
        member done before it)."""
        return np.maximum(self.end_ns - self.arrival_ns - self.wait_ns, 0)

    @property
    def label(self) -> str:
        """``all_reduce 0#3`` (type, group, sequence number); a send/recv pair ``send_recv 0#2 0->1`` (its
        index, sender and receiver); a group of a DeviceMesh dimension with the dimension's name before
        its own, ``all_gather dp:5#27``, ``send_recv pp:1#0 0->4``: how the worst-collectives table and
        the wait heatmap name it. A hashed group name is cut (:func:`group_label`)."""
        pair = f" {self.ranks[0]}->{self.ranks[1]}" if self.kind == "p2p" else ""
        dim = self.pg_desc.removeprefix(MESH_DESC_PREFIX)
        name = group_label(self.pg_name)
        group = f"{dim}:{name}" if dim != self.pg_desc and dim else name
        return f"{self.comm_type.lower()} {group}#{self.seq}{pair}"

    @property
    def skew_ns(self) -> int:
        return int(self.arrival_ns.max() - self.arrival_ns.min())

    @property
    def total_wait_ns(self) -> int:
        return int(self.wait_ns.sum())

    @property
    def total_exposed_wait_ns(self) -> int:
        return int(self.exposed_wait_ns.sum())


@dataclass(eq=False, kw_only=True, slots=True)
class SkewResult:
    """All events, in order of their last arrival."""

    events: list[SkewEvent]
    """Events by last arrival."""
    caused_wait_ns: dict[int, int] = field(default_factory=dict)
    """Rank -> the exposed wait (not hidden under compute) of the events blamed on it: per waiting rank the
    union over time of those waits (a rank waiting at four recvs at once waited once), summed over the
    waiting ranks."""
    caused_wait_by_step: dict[tuple[int, int], int] = field(default_factory=dict)
    """(rank, step) -> the part of ``caused_wait_ns`` in events of that step (an instant of waiting counts
    in the step of the first-begun wait that covers it), so the steps add up to the total."""

    def records(self) -> list[CollectiveSkewRecord]:
        out = []
        for e in self.events:
            transfer = e.transfer_ns
            for k, r in enumerate(e.ranks):
                out.append(
                    CollectiveSkewRecord(
                        kind=e.kind,
                        pg_name=e.pg_name,
                        seq=e.seq,
                        comm_type=e.comm_type,
                        comm_bytes=int(e.comm_bytes[k]),
                        step=e.step,
                        rank=r,
                        node_id=e.node_ids[k],
                        arrival_ns=int(e.arrival_ns[k]),
                        end_ns=int(e.end_ns[k]),
                        wait_ns=int(e.wait_ns[k]),
                        exposed_wait_ns=int(e.exposed_wait_ns[k]),
                        transfer_ns=int(transfer[k]),
                        skew_ns=e.skew_ns,
                        late_rank=e.late_rank,
                        blamed_rank=e.blamed_rank,
                        late_by_ns=e.late_by_ns,
                        cause_kind=str(e.cause.kind),
                        cause_op=e.cause.op,
                        cause_delta_ns=e.cause.delta_ns,
                        cause=e.cause.text,
                        clock_contradicted=e.clock_contradicted,
                    )
                )
        return out

    def caused_wait_in(self, steps: Collection[int]) -> dict[int, int]:
        """Rank -> the part of ``caused_wait_ns`` in events of ``steps`` (the steps a per-step figure is a
        mean over: events before the first step, set-up's, are in no such step)."""
        wanted = set(steps)
        out: dict[int, int] = defaultdict(int)
        for (r, s), w in self.caused_wait_by_step.items():
            if s in wanted:
                out[r] += w
        return dict(out)

    def top_cause_in(self, steps: Collection[int] | None = None) -> dict[int, Cause]:
        """Rank -> its dominant cause (:func:`_top_cause`), weighted by the wait it caused, over the events
        of ``steps`` (all events where ``None``) that made others wait and whose clocks do not contradict
        each other (``SkewEvent.clock_contradicted``): beside per-step figures, the steps they are means
        over (a set-up collective before the first step read 'setup +50.0 ms' beside 10 ms a step)."""
        wanted = None if steps is None else set(steps)
        kind_w: dict[int, dict[CauseKind, int]] = defaultdict(lambda: defaultdict(int))
        blamed_on: dict[int, list[SkewEvent]] = defaultdict(list)  # rank -> its events with exposed wait
        for e in self.events:
            if (
                e.clock_contradicted
                or e.blamed_rank < 0
                or e.total_exposed_wait_ns <= 0
                or (wanted is not None and e.step not in wanted)
            ):
                continue
            blamed_on[e.blamed_rank].append(e)
            if e.cause.kind is not CauseKind.NONE:
                kind_w[e.blamed_rank][e.cause.kind] += e.total_exposed_wait_ns
        top: dict[int, Cause] = {}
        for r, kinds in kind_w.items():
            k = max(kinds, key=lambda x: kinds[x])
            top[r] = _top_cause(k, [e for e in blamed_on[r] if e.cause.kind is k])
        return top

    def top_straggler_by_step(self) -> dict[int, int]:
        """Step -> rank with the most peer wait blamed on it in that step (steps with any wait)."""
        best: dict[int, tuple[int, int]] = {}
        for (r, s), w in self.caused_wait_by_step.items():
            if w > 0 and (s not in best or w > best[s][0]):
                best[s] = (w, r)
        return {s: r for s, (_w, r) in sorted(best.items())}


#: How many of the rows begun last before a window :func:`_window` looks at for compute still running.
_RUNNING_AT_START = 16
#: How many of the rows begun last before a window :func:`_window` looks at for a wait still going on in it.
_WAITING_AT_START = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class _Window:
    compute_ns: int
    host_gap_ns: int
    send_gap_ns: int
    wait_ns: int
    max_wait_row: int
    by_name: I64


def _window(
    ri: RankIndex, a: int, b: int, own_row: int, waits: tuple[Coverage, I64] | None = None
) -> _Window:
    """What a member did in ``[a, b)``: compute (union over streams, and per op name: each op's work inside
    the window), idle time (no node of the rank running) split into the idle stretches right before sends
    and the rest, and waits (``waits``: W ∪ C and each row's wait, where not the index's)."""
    cov_wait_comp, wait_ns = waits if waits is not None else (ri.cov_wait_comp, ri.wait_ns)
    rows = rows_starting_in(ri, a, b)
    rt = ri.trace
    comp = rows[ri.is_comp[rows]]
    # a host-time node's work begins where the wait it hid ended: it counts where that lies
    lo, hi = np.searchsorted(ri.host_work_at_ns, [a, b], side="left")
    comp = np.concatenate([comp, ri.host_work_rows[lo:hi]])
    # a row that runs on past b counts up to b (the 128-GPU sample's host "forward" scope, 119.3 ms from
    # 5 ms before a member's arrival, read +133.8 ms in a 113 ms window)
    dur = np.clip(b - np.maximum(ri.end_ns[comp] - ri.work_ns[comp], a), 0, ri.work_ns[comp])
    # compute still running at a (begun before the window): its part inside it, under its own name
    k = int(np.searchsorted(ri.sorted_start, a, side="left"))
    before = ri.order[max(k - _RUNNING_AT_START, 0) : k]
    before = before[ri.is_comp[before] & (ri.end_ns[before] > a)]
    comp = np.concatenate([comp, before])
    dur = np.concatenate([dur, np.minimum(ri.end_ns[before], b) - a])
    by_name = (
        np.bincount(ri.gname[comp], weights=dur).astype(np.int64) if comp.size else np.zeros(0, np.int64)
    )
    idle = (b - a) - (ri.cov_all.upto_one(b) - ri.cov_all.upto_one(a))
    compute = ri.cov_comp.upto_one(b) - ri.cov_comp.upto_one(a)
    sends = rows[ri.is_send[rows]]
    if ri.is_send[own_row]:
        sends = np.append(sends, own_row)
    send_idle = 0
    if sends.size:
        s_start = rt.start_ns[sends]
        send_idle = int(np.maximum(np.minimum(ri.cov_all.idle_before(s_start), s_start - a), 0).sum())
    # the wait that filled most of the window: a row begun before it may still be waiting inside it (a halo
    # exchange's recvs from a slow neighbour, issued before the exchange with another peer that starts the
    # window); before, only rows begun inside counted, and where none waited the lateness was passed on from
    # the event that opened the window, blaming the late rank for its own wait
    waited = np.concatenate([ri.order[max(k - _WAITING_AT_START, 0) : k], rows])
    w_start = rt.start_ns[waited]
    inside = np.minimum(w_start + wait_ns[waited], b) - np.maximum(w_start, a)
    # only waiting that nothing else hid counts (an asynchronous all_reduce waits under backward compute)
    exposed_wait = (cov_wait_comp.upto_one(b) - cov_wait_comp.upto_one(a)) - compute
    return _Window(
        compute_ns=compute,
        host_gap_ns=max(idle - send_idle, 0),
        send_gap_ns=min(send_idle, idle),
        wait_ns=max(exposed_wait, 0),
        max_wait_row=int(waited[int(np.argmax(inside))]) if inside.size and inside.max() > 0 else -1,
        by_name=by_name,
    )


def _grown_ops(
    late: _Window, med: _Window, names: list[str], gpu_names: B
) -> tuple[tuple[tuple[str, int], ...], int, bool]:
    """The ops that grew most from the median member's window to the late member's, with their growth
    (summed by the label a cause shows them by, :func:`_by_label`), the first's time in the median
    member's window, and whether the first is GPU work (``gpu_names``: per name of ``names``,
    :attr:`~skewlens.analysis.index.RunIndex.gpu_names`)."""
    n = max(late.by_name.size, med.by_name.size)
    d = np.zeros(n, dtype=np.int64)
    d[: late.by_name.size] += late.by_name
    d[: med.by_name.size] -= med.by_name
    # a few more than are named, so that those one label sums (below) still leave TOP_OPS to name
    top = [int(i) for i in np.argsort(-d, kind="stable")[: TOP_OPS * _LABEL_SPARES] if d[i] > 0]
    ops = _by_label([(names[i], int(d[i])) for i in top])[:TOP_OPS]
    # the first's time on the median member: of every name its label sums
    label = _short(ops[0][0]) if ops else None
    was = sum(int(med.by_name[i]) for i in top if i < med.by_name.size and _short(names[i]) == label)
    on_gpu = any(bool(gpu_names[i]) for i in top if names[i] == ops[0][0]) if ops else False
    return ops, was, on_gpu


#: How many times :data:`TOP_OPS` grown ops :func:`_grown_ops` reads before :func:`_by_label` sums them.
_LABEL_SPARES = 4


def _by_label(ops: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """``ops`` (name, growth) summed by the label a cause shows (:func:`_short`), largest first, each under
    its largest name: the autograd engine's ``evaluate_function: MmBackward0`` (its hooks, an activation
    checkpoint's recomputation) and the ``MmBackward0`` inside it both read ``MmBackward0``, and a cause
    named it twice (``MmBackward0 +34.4 ms, RedistributeBackward +2.6 ms, MmBackward0 +1.4 ms``)."""
    total: dict[str, int] = defaultdict(int)
    rep: dict[str, tuple[int, str]] = {}
    for name, grew in ops:
        label = _short(name)
        total[label] += grew
        rep[label] = max(rep.get(label, (grew, name)), (grew, name))
    return tuple(sorted(((rep[lb][1], g) for lb, g in total.items()), key=lambda o: -o[1]))


def _cause(
    late: _Window, med: _Window, start_delta_ns: int, ix: RunIndex, *, waited: bool = True
) -> tuple[Cause, int]:
    """The dominant cause and the row of the late member's longest earlier wait (-1 if none); not an
    earlier wait where not ``waited``; ops named by ``ix``'s names."""
    deltas = {
        CauseKind.COMPUTE: late.compute_ns - med.compute_ns,
        CauseKind.HOST_GAP: late.host_gap_ns - med.host_gap_ns,
        CauseKind.LATE_SEND: late.send_gap_ns - med.send_gap_ns,
        # A window that starts later is lateness passed on too (``start_delta_ns``: the caller gives 0 where
        # both windows start at their completion of the common event, which both waited at)
        CauseKind.WAIT: late.wait_ns - med.wait_ns + start_delta_ns,
    }
    if not waited:
        del deltas[CauseKind.WAIT]
    kind = max(deltas, key=lambda k: deltas[k])
    if deltas[kind] < SHOWN_NS:
        # growth that shows as +0.0 ms explains none of the lateness: the late member's extra time lies in
        # what no category counts (a transfer at another group's collective in its window)
        return NO_CAUSE, -1
    if kind is CauseKind.COMPUTE:
        ops, was, on_gpu = _grown_ops(late, med, ix.names, ix.gpu_names)
        first = ops[0][0] if ops else None
        return Cause(
            kind=kind, delta_ns=deltas[kind], op=first, ops=ops, op_median_ns=was, op_on_gpu=on_gpu
        ), -1
    return Cause(kind=kind, delta_ns=deltas[kind]), late.max_wait_row


#: :func:`_first_step_of`: the earliest step of a window holding this share of what grew in it, or more.
FIRST_STEP_SHARE = 0.1


def _first_step_of(
    cause: Cause,
    ix: RunIndex,
    windows: Mapping[int, tuple[list[int], I64, I64]],
    late: tuple[RankIndex, int, int],
    med: tuple[RankIndex, int, int],
) -> int:
    """:attr:`SkewEvent.cause_first_step`: the earliest step where the late member's window (``late``: its
    rank, from, to) grew by :data:`FIRST_STEP_SHARE` of what the cause names or more against the median
    member's (``med``), step by step (``windows``: :meth:`~skewlens.analysis.index.RunIndex.rank_windows`):
    the cause's first-named op (compute: its rows begun in the window, by the label the cause shows it by,
    :func:`_short`) or the idle time (host gap); -1 for another cause, or none grew so."""
    if cause.stalled_scope:  # what a what-if reads it for (render.what_if_notes): not every compute cause
        label = _short(cause.ops[0][0])
        grew = _op_by_step(*late, ix.names, label)
        grew.subtract(_op_by_step(*med, ix.names, label))
    elif cause.kind is CauseKind.HOST_GAP:
        grew = _idle_by_step(late[0], windows.get(late[0].rank), *late[1:])
        grew.subtract(_idle_by_step(med[0], windows.get(med[0].rank), *med[1:]))
    else:
        return -1
    total = sum(max(g, 0) for g in grew.values())
    held = [st for st, g in grew.items() if st >= 0 and g > 0 and g >= FIRST_STEP_SHARE * total]
    return min(held) if held else -1


def _op_by_step(ri: RankIndex, a: int, b: int, names: Sequence[str], label: str) -> Counter[int]:
    """Step -> the work of ``ri``'s rows begun in ``[a, b)`` that ``label`` names (:func:`_short`)."""
    rows = rows_starting_in(ri, a, b)
    ids = np.unique(ri.gname[rows])
    named = ids[[_short(names[int(i)]) == label for i in ids]] if ids.size else ids
    rows = rows[np.isin(ri.gname[rows], named)]
    out: Counter[int] = Counter()
    for st, w in zip(ri.trace.step[rows].tolist(), ri.work_ns[rows].tolist(), strict=True):
        out[st] += w
    return out


def _idle_by_step(ri: RankIndex, window: tuple[list[int], I64, I64] | None, a: int, b: int) -> Counter[int]:
    """Step -> ``ri``'s idle time (no node running) in ``[a, b)`` inside that step's span (``window``: the
    rank's steps and spans, :meth:`~skewlens.analysis.index.RunIndex.rank_windows`; None: no steps)."""
    out: Counter[int] = Counter()
    if window is None:
        return out
    for st, lo, hi in zip(window[0], window[1].tolist(), window[2].tolist(), strict=True):
        x, y = max(lo, a), min(hi, b)
        if x < y:
            out[st] += (y - x) - (ri.cov_all.upto_one(y) - ri.cov_all.upto_one(x))
    return out


#: How many of a window's longest idle stretches :func:`_gaps_by_place` places (an ``ops`` capture's window
#: holds an untraced stretch between every two operators: thousands, most of a few us).
_GAPS_PLACED = 16
#: How many rows before and after an idle stretch :func:`_op_after` / :func:`_op_before` look at.
_AROUND = 64


def _gap_place(
    ix: RunIndex,
    windows: Mapping[int, tuple[list[int], I64, I64]],
    delta_ns: int,
    late: tuple[RankIndex, int, int],
    med: tuple[RankIndex, int, int],
) -> str:
    """:attr:`Cause.gap_at` of a host-gap cause of growth ``delta_ns``: of the late member's idle stretches
    in its window (``late``: its rank, from, to) by where they lay (:func:`_gaps_by_place`), the place whose
    idle grew most against the median member's (``med``) at the same place, where it grew by half the cause
    or more (not one of many small gaps); else empty."""
    grown = _gaps_by_place(ix, windows, *late)
    for place, idle in _gaps_by_place(ix, windows, *med).items():
        grown[place] = grown.get(place, 0) - idle
    best = max(grown, key=lambda p: grown[p], default="")
    return best if best and 2 * grown[best] >= delta_ns else ""


def _gaps_by_place(
    ix: RunIndex, windows: Mapping[int, tuple[list[int], I64, I64]], ri: RankIndex, a: int, b: int
) -> dict[str, int]:
    """Place -> ``ri``'s idle time (no node running) in ``[a, b)`` there, of its :data:`_GAPS_PLACED`
    longest idle stretches of :data:`SHOWN_NS` or more, each placed by the traced ops around it: ``after X,
    before Y`` (the op that ended last before it, the op that began first at its end, each as a cause names
    it, :func:`_short`); ``at the start of step N, before Y`` where the rank's last step mark before the
    stretch's end lies after that op's end (or no op came before); ``before Y`` where no op nor step mark
    came before. A stretch right before a send is not placed: it is a late send's."""
    starts, ends = ri.cov_all.starts, ri.cov_all.ends
    # stretch k lies between interval k-1's end and interval k's start (unbounded before the first and
    # after the last); those that meet [a, b)
    k0 = int(np.searchsorted(starts, a, side="right"))
    k1 = int(np.searchsorted(ends, b, side="left"))
    if k0 > k1:
        return {}
    ks = np.arange(k0, k1 + 1)
    lo, hi = np.full(ks.size, a, dtype=np.int64), np.full(ks.size, b, dtype=np.int64)
    lo[ks > 0] = ends[ks[ks > 0] - 1]
    hi[ks < starts.size] = starts[ks[ks < starts.size]]
    idle = np.minimum(hi, b) - np.maximum(lo, a)
    top = np.argsort(-idle, kind="stable")[:_GAPS_PLACED]
    out: dict[str, int] = defaultdict(int)
    window = windows.get(ri.rank)
    for i in top.tolist():
        if idle[i] < SHOWN_NS:  # +0.0 ms: places nothing a cause would name
            break
        x, y = int(lo[i]), int(hi[i])
        before = _op_before(ri, y)
        if before >= 0 and ri.is_send[before]:
            continue
        after = _op_after(ri, x)
        parts = []
        since = int(ri.end_ns[after]) if after >= 0 else np.iinfo(np.int64).min
        # the last step mark before the stretch's end, where it lies after that op's end
        m = int(np.searchsorted(window[1], y, side="left")) - 1 if window is not None else -1
        mark = window[0][m] if window is not None and m >= 0 and int(window[1][m]) > since else -1
        if mark >= 0:
            parts.append(f"at the start of step {mark}")
        elif after >= 0:
            parts.append(f"after {_short(ix.names[int(ri.gname[after])])}")
        if before >= 0:
            parts.append(f"before {_short(ix.names[int(ri.gname[before])])}")
        out[", ".join(parts)] += int(idle[i])
    return dict(out)


def _traced(ri: RankIndex, rows: I32) -> I32:
    """Those of ``rows`` that are traced ops: not untraced host time, not metadata."""
    keep = ~ri.is_untraced[rows] & (ri.trace.node_type[rows] != int(NodeType.METADATA))
    return rows[keep]


def _op_after(ri: RankIndex, x: int) -> int:
    """The traced op (:func:`_traced`) of ``ri`` that ended last at or before ``x`` (of those ending
    together, the outermost: begun first), among the :data:`_AROUND` begun last by then; -1 if none."""
    k = int(np.searchsorted(ri.sorted_start, x, side="right"))
    rows = _traced(ri, ri.order[max(k - _AROUND, 0) : k])
    rows = rows[ri.end_ns[rows] <= x]
    if not rows.size:
        return -1
    last = rows[ri.end_ns[rows] == ri.end_ns[rows].max()]
    return int(last[np.argmin(ri.trace.start_ns[last])])


def _op_before(ri: RankIndex, y: int) -> int:
    """The traced op (:func:`_traced`) of ``ri`` that began first at or after ``y`` (of those beginning
    together, the outermost: ending last), among the :data:`_AROUND` begun first from then; -1 if none."""
    k = int(np.searchsorted(ri.sorted_start, y, side="left"))
    rows = _traced(ri, ri.order[k : k + _AROUND])
    if not rows.size:
        return -1
    first = rows[ri.trace.start_ns[rows] == ri.trace.start_ns[rows].min()]
    return int(first[np.argmax(ri.end_ns[first])])


def _window_start(
    ix: RunIndex, ri: RankIndex, prev_row: int | None, row: int, collective: bool, *, first_step: int
) -> tuple[int, int]:
    """Start of a member's window: the previous instance of the group (collectives), else the rank's
    step start (collectives) or its last completed communication (p2p), else its step start (p2p), else
    its first timed node (not the process-group METADATA node at 0 ns); and the row of the completed
    communication that start is, a synchronisation point (-1 for a step start or first node). A collective
    without a previous instance starts at the rank's first recorded step (``first_step``; -1: none)."""
    arrival = int(ri.trace.start_ns[row])
    if prev_row is not None:
        return int(ri.end_ns[prev_row]), prev_row
    step = int(ri.trace.step[row])
    if collective:
        # the rank's first recorded step: where members share no earlier event (the caller's common event),
        # the steps before this one hold what they did since the last synchronisation too (Local SGD's or
        # DiLoCo's first average of a trace, after K local steps); before, this step's start alone, which
        # read the first outer all_reduce of a DiLoCo loop (5 local steps, a 30 ms sleep each on rank 1)
        # as 'host idle/gap +101.2 ms' of a 119.2 ms wait
        step = first_step if first_step >= 0 else step
    span = ix.step_spans.get((ri.rank, step))
    step_start = span[0] if span is not None and span[0] <= arrival else None
    if collective and step_start is not None:
        return step_start, -1
    last = last_comm_end_before(ri, arrival)
    if last is not None:
        return last
    if step_start is not None:
        return step_start, -1
    timed = np.flatnonzero(ri.trace.node_type[ri.order] != int(NodeType.METADATA))
    return (int(ri.sorted_start[timed[0]]) if timed.size else arrival), -1


def _common_event(
    events: list[SkewEvent], late_history: list[int], late: int, other: int
) -> SkewEvent | None:
    """The latest earlier event in which the ``late`` rank and ``other`` both took part and synchronised
    (their last common synchronisation point), looking back at most ``COMMON_LOOKBACK`` events of the late
    rank. An event synchronised the two where the first of them to arrive waited until the other arrived:
    not a broadcast whose root arrived first (a ZeroRedundancyOptimizer's parameter broadcasts, issued
    back to back), whose receiver was already as late as it is here."""
    for i in reversed(late_history[-COMMON_LOOKBACK:]):
        e = events[i]
        if other in e.ranks:
            a, b = e.ranks.index(late), e.ranks.index(other)
            first, then = (a, b) if e.arrival_ns[a] <= e.arrival_ns[b] else (b, a)
            if _held(e, first) and e.arrival_ns[first] + e.wait_ns[first] >= e.arrival_ns[then]:
                return e
    return None


def _held(e: SkewEvent, member: int) -> bool:
    """Whether ``member``'s thread held at event ``e`` while it waited there (half its wait exposed, or no
    wait): not a wait hidden under its compute (DDP's first bucket, waited for by gloo's worker while
    backward ran on: the rank's thread was nowhere near the op at its completion, and a window from there
    held the late rank's backward but not the early rank's, which read a 30 ms sleep before backward as
    "compute grew: AddmmBackward0")."""
    return bool(e.exposed_wait_ns[member] * 2 >= e.wait_ns[member])


@dataclass(frozen=True, kw_only=True, slots=True)
class _Members:
    """Every member of every event, events one after another (``at[i]:at[i + 1]``), with its columns
    gathered one rank at a time (numpy) instead of one member at a time."""

    at: I64
    arrival_ns: I64
    end_ns: I64
    wait_ns: I64
    exposed_wait_ns: I64
    node_id: I64
    comm_bytes: I64


def _members(ix: RunIndex, raw: list[tuple[str, int, tuple[int, ...], tuple[int, ...]]]) -> _Members:
    """Members' arrival, end, wait, node id, bytes and exposed wait (the part of the wait ``[arrival,
    arrival + wait)`` not covered by compute on the member's rank)."""
    count = np.fromiter((len(rs) for *_x, rs, _ws in raw), dtype=np.int64, count=len(raw))
    at = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum(count, out=at[1:])
    rank = np.fromiter((r for *_x, rs, _ws in raw for r in rs), dtype=np.int64, count=int(at[-1]))
    row = np.fromiter((w for *_x, _rs, ws in raw for w in ws), dtype=np.int64, count=int(at[-1]))
    cols = [np.zeros(rank.size, dtype=np.int64) for _ in range(6)]
    by_rank = np.argsort(rank, kind="stable")
    cuts = np.flatnonzero(np.diff(rank[by_rank])) + 1
    for part in np.split(by_rank, cuts) if rank.size else []:
        ri = ix.ranks[int(rank[part[0]])]
        rows = row[part]
        a, w = ri.trace.start_ns[rows], ri.wait_ns[rows]
        for col, values in zip(
            cols,
            (
                a,
                ri.end_ns[rows],
                w,
                w - ri.cov_comp.between(a, a + w),
                ri.trace.node_id[rows],
                ri.trace.comm_bytes[rows],
            ),
            strict=True,
        ):
            col[part] = values
    arrival, end, wait, exposed, node_id, comm_bytes = cols
    return _Members(
        at=at,
        arrival_ns=arrival,
        end_ns=end,
        wait_ns=wait,
        exposed_wait_ns=exposed,
        node_id=node_id,
        comm_bytes=comm_bytes,
    )


def analyze_skew(ix: RunIndex) -> SkewResult:
    """Skew, waits, late member, blamed rank and cause of every collective instance and p2p pair."""
    run = ix.run
    # (kind, index, ranks, rows)
    raw: list[tuple[str, int, tuple[int, ...], tuple[int, ...]]] = [
        ("collective", k, c.ranks, c.rows) for k, c in enumerate(run.collectives)
    ]
    raw += [("p2p", k, (p.src_rank, p.dst_rank), (p.src_row, p.dst_row)) for k, p in enumerate(run.p2p)]
    mem = _members(ix, raw)
    contradicted = {("p2p" if c.is_p2p else "collective", c.index) for c in clock_contradictions(run)}
    bounds = zip(mem.at[:-1].tolist(), mem.at[1:].tolist(), strict=True)
    last_arrival = [int(mem.arrival_ns[lo:hi].max()) for lo, hi in bounds]
    order = sorted(range(len(raw)), key=lambda i: (last_arrival[i], i))
    prev_row: dict[tuple[str, int], int] = {}  # (pg_name, rank) -> row of the previous instance
    prev_at: dict[str, int] = {}  # pg_name -> index into events of its previous instance
    windows = ix.rank_windows()  # rank -> its steps in order and their spans
    # rank -> its first recorded step
    first_step = {
        r: st for r, (keys, _a, _b) in windows.items() if (st := next((k for k in keys if k >= 0), -1)) >= 0
    }
    # group -> its members without a trace
    untraced_of = {
        name: tuple(sorted(set(g.ranks) - set(ix.ranks)))
        for name, g in run.process_groups.items()
        if not set(g.ranks) <= set(ix.ranks)
    }
    # rank -> its waits as windows read them (:func:`_window`) where it took part in such a group's
    # collective: all its time inside one counts as waiting there (maybe for a member without a trace), so
    # lateness passed on from it is blamed on no rank; before, its only traced member's 31 ms there was no
    # wait at all, and the rank was blamed for arriving 31 ms late at its next collective (cause none)
    in_untraced: dict[int, list[int]] = defaultdict(list)
    for c in run.collectives:
        if c.pg_name in untraced_of:
            for r, w in zip(c.ranks, c.rows, strict=True):
                in_untraced[r].append(w)
    waits: dict[int, tuple[Coverage, I64]] = {}
    for r, rs in in_untraced.items():
        ri, at = ix.ranks[r], np.asarray(rs, dtype=np.int64)
        in_from, in_to, cw = ri.trace.start_ns[at], ri.end_ns[at], ri.cov_wait_comp
        row_wait = ri.wait_ns.copy()
        row_wait[at] = in_to - in_from
        cov = Coverage.of(np.concatenate([cw.starts, in_from]), np.concatenate([cw.ends, in_to]))
        waits[r] = (cov, row_wait)
    blamed_row: dict[int, I64] = {r: np.full(len(ri.trace), -1, dtype=np.int64) for r, ri in ix.ranks.items()}
    cause_of: dict[tuple[int, int], Cause] = {}
    history: dict[int, list[int]] = {}  # rank -> indexes into events of the events it took part in
    events: list[SkewEvent] = []
    for i in order:
        kind, k, ranks, rows = raw[i]
        rts = [ix.ranks[r] for r in ranks]
        lo, hi = int(mem.at[i]), int(mem.at[i + 1])
        arr, end, wait = mem.arrival_ns[lo:hi], mem.end_ns[lo:hi], mem.wait_ns[lo:hi]
        if kind == "collective":
            c = run.collectives[k]
            pg_name, seq, ctype = c.pg_name, c.seq, CommType(c.comm_type).name
        else:
            p = run.p2p[k]
            pg_name, seq, ctype = p.pg_name, k, "SEND_RECV"
        by_arrival = np.argsort(arr, kind="stable")
        # the late member: the one whose arrival the longest wait was for (the model's rule: the last, or
        # a rooted collective's root), where nobody waited the one the others wait for; compared with the
        # median of the others
        rule = execution_model(run).rule(k, len(ranks)) if kind == "collective" else ()
        held = held_by(rule)
        if held >= 0 and wait.max() > 0:
            w = rule[int(np.argmax(wait))]
            held = w if w >= 0 else -1
        li = int(by_arrival[-1]) if held < 0 else held
        others = by_arrival if held < 0 else by_arrival[by_arrival != li]
        mi = int(others[(len(others) - 1) // 2]) if held < 0 or others.size else li
        late_rank = ranks[li]
        step = int(rts[li].trace.step[rows[li]])
        cause, blamed, cause_first_step = NO_CAUSE, late_rank, -1
        untraced = untraced_of.get(pg_name, ()) if kind == "collective" else ()
        if untraced:
            # a member without a trace may have arrived after every traced one: who the traced members
            # waited for, and why, is unknown, so no traced rank is blamed (before, the last traced member
            # was, for the waits of an absent straggler: rank 3 caused 45.9 ms a step of rank 2's)
            cause, blamed = Cause(kind=CauseKind.UNTRACED, delta_ns=0, untraced=untraced), -1
        elif li != mi and arr[li] > arr[mi]:
            common = _common_event(events, history.get(late_rank, []), late_rank, ranks[mi])
            starts = []
            synced = common is not None
            start_row = -1  # the late member's window starts at the end of this row of it (-1: none)
            completed = 0  # members whose window starts at their completion of the common event
            # where no common event was found, the group's previous instance starts each member's window at
            # its end of it only where both members' threads held there (:func:`_held`): else at their step
            # starts. DDP's first bucket of a step with no common event before it, its wait hidden under
            # rank 0's backward, started rank 0's window at a completion its thread was long past: the
            # windows held the late rank's backward and none of rank 0's, and a 30.1 ms sleep before
            # backward read "compute grew: AddmmBackward0 +40.2 ms" (2 gloo ranks, ops)
            prev_event = events[prev_at[pg_name]] if kind == "collective" and pg_name in prev_at else None
            prev_held = prev_event is None or all(
                _held(prev_event, prev_event.ranks.index(ranks[j])) for j in (li, mi)
            )
            for j in (li, mi):
                if common is not None:
                    cm = common.ranks.index(ranks[j])
                    # an asynchronous op (DDP's bucket all_reduce) may complete after this arrival: then
                    # the member's last known synchronised point is its arrival at the common op
                    done = int(common.end_ns[cm])
                    starts.append(done if done <= arr[j] else int(common.arrival_ns[cm]))
                    completed += done <= arr[j]
                    continue
                prev = prev_row.get((pg_name, ranks[j])) if kind == "collective" and prev_held else None
                t, sync_row = _window_start(
                    ix,
                    rts[j],
                    prev,
                    rows[j],
                    kind == "collective",
                    first_step=first_step.get(ranks[j], -1) if prev_held else -1,
                )
                starts.append(min(t, int(arr[j])))
                synced = synced or sync_row >= 0
                start_row = sync_row if j == li else start_row
            if not synced:
                # neither window starts at a synchronisation point (the first collective of a trace: each
                # member's step start): a member that began its step later did not wait for anyone, so
                # both windows start together and the late member's later start is its idle time
                starts = [min(starts)] * 2
            wl = _window(rts[li], starts[0], int(arr[li]), rows[li], waits.get(late_rank))
            wm = _window(rts[mi], starts[1], int(arr[mi]), rows[mi], waits.get(ranks[mi]))
            peer_wait = int(wait[mi]) if kind == "p2p" else int(wait.max())
            own_gap = int(rts[li].cov_all.idle_before(np.array([arr[li]]))[0])
            if kind == "p2p" and li == 0 and own_gap * 2 >= peer_wait:
                cause, wait_row = Cause(kind=CauseKind.LATE_SEND, delta_ns=own_gap), -1
            else:
                # both windows start where the common event completed: both waited there for its last
                # arrival, so one completing later did not wait longer, its transfer took longer (gloo's
                # members finish apart): no lateness passed on by whoever was late there. Counted as
                # passed on, a one-off 334 ms gc.collect() on rank 1 at step 7 was the cause, "passed on
                # by rank 0", of rank 0's 2-5 ms lateness in steps 8-10, each 2 ms later completion
                # handing it on to the next
                delta = 0 if completed == 2 else starts[0] - starts[1]
                cause, wait_row = _cause(wl, wm, delta, ix)
            if cause.kind is CauseKind.WAIT and wait_row < 0:
                # the window itself started late: the lateness comes from the previous sync point
                # (the group's previous instance; for a pair, the late member's last completed communication:
                # before, none, and a halo exchange's neighbour that slept 30 ms before its sends, its window
                # starting at the end of its first pair, read "earlier wait +27.9 ms (caused by rank 2)" of
                # itself at the next, not the sleep)
                wait_row = common.rows[common.ranks.index(late_rank)] if common is not None else start_row
            if cause.kind is CauseKind.WAIT and wait_row >= 0:
                b = int(blamed_row[late_rank][wait_row])
                origin = cause_of.get((late_rank, wait_row))
                if b >= 0:
                    blamed = b
                if origin is not None and origin.kind is CauseKind.UNTRACED:
                    blamed = -1  # late from waiting where an untraced member may have been the late one
                if origin is not None and origin.kind not in (CauseKind.WAIT, CauseKind.NONE):
                    # report the root cause, noting who passed the lateness on (not the blamed rank
                    # itself: its own lateness that came back to it through its earlier wait)
                    via = origin.via_rank if origin.via_rank >= 0 else late_rank
                    cause = replace(origin, via_rank=via if via != blamed else -1, passed_on=True)
            if cause.kind is CauseKind.WAIT and blamed == late_rank:
                # a wait no one else is blamed for: its own lateness at the sync point its window starts
                # from, of no cause there, or a wait whose event is not blamed yet, its last arrival after
                # this one's (recvs from a slow neighbour still pending while the rank exchanged with
                # another peer: they did not hold it back). A rank never causes its own wait, so the cause
                # is what else grew; before, "earlier wait +1.2 ms (caused by rank 1)" of rank 1 itself
                cause, _ = _cause(wl, wm, 0, ix, waited=False)
            if cause.kind is CauseKind.WAIT:
                cause = Cause(kind=cause.kind, delta_ns=cause.delta_ns, blamed_from=blamed)
            if not cause.passed_on:
                late_window = (rts[li], starts[0], int(arr[li]))
                med_window = (rts[mi], starts[1], int(arr[mi]))
                cause_first_step = _first_step_of(cause, ix, windows, late_window, med_window)
                if cause.kind is CauseKind.HOST_GAP:
                    place = _gap_place(ix, windows, cause.delta_ns, late_window, med_window)
                    cause = replace(cause, gap_at=place)
        if kind == "collective":
            prev_at[pg_name] = len(events)
            for r, w in zip(ranks, rows, strict=True):
                prev_row[(pg_name, r)] = w
        for r, w in zip(ranks, rows, strict=True):
            blamed_row[r][w] = blamed
            cause_of[(r, w)] = cause
        for r in ranks:
            history.setdefault(r, []).append(len(events))
        events.append(
            SkewEvent(
                kind=kind,
                pg_name=pg_name,
                seq=seq,
                comm_type=ctype,
                step=step,
                ranks=tuple(ranks),
                rows=tuple(rows),
                node_ids=tuple(mem.node_id[lo:hi].tolist()),
                comm_bytes=mem.comm_bytes[lo:hi],
                arrival_ns=arr,
                end_ns=end,
                wait_ns=wait,
                exposed_wait_ns=mem.exposed_wait_ns[lo:hi],
                late_rank=late_rank,
                blamed_rank=blamed,
                late_by_ns=max(int(arr[li] - arr[mi]), 0),
                cause=cause,
                cause_first_step=cause_first_step,
                pg_desc=pg.desc if (pg := run.process_groups.get(pg_name)) is not None else "",
                clock_contradicted=(kind, k) in contradicted,
            )
        )
    return _summarise(events, {r: ri.cov_comp for r, ri in ix.ranks.items()})


def _caused_waits(
    events: list[SkewEvent], compute: Mapping[int, Coverage]
) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
    """Exposed wait blamed on each rank, in total and per (rank, step): its peers' waits (a blamed rank that
    waits at an event passed on to it waits for someone else, not for itself). Each waiting rank's time counts
    once: per (blamed rank, waiting rank) the members' waits ``[arrival, arrival + wait)`` are cut into
    disjoint pieces (a wait keeps the part no earlier-begun one covered, and that part's step), and each
    piece counts without the compute on the waiting rank (``compute``) that hid it."""
    parts: list[tuple[I64, I64, I64, I64, I64]] = []  # blamed rank, waiting rank, step, wait start, end
    for e in events:
        has = (e.exposed_wait_ns > 0) & (np.asarray(e.ranks) != e.blamed_rank)  # a peer's wait, not its own
        if has.any():
            a, n = e.arrival_ns[has], int(has.sum())
            parts.append(
                (
                    np.full(n, e.blamed_rank, np.int64),
                    np.asarray(e.ranks, np.int64)[has],
                    np.full(n, e.step, np.int64),
                    a,
                    a + e.wait_ns[has],
                )
            )
    if not parts:
        return {}, {}
    caused: dict[int, int] = defaultdict(int)
    by_step: dict[tuple[int, int], int] = defaultdict(int)
    blamed, waiting, step, a, b = (np.concatenate(c) for c in zip(*parts, strict=True))
    order = np.lexsort((b, a, waiting, blamed))
    blamed, waiting, step, a, b = blamed[order], waiting[order], step[order], a[order], b[order]
    cuts = np.flatnonzero((np.diff(blamed) != 0) | (np.diff(waiting) != 0)) + 1
    for g in np.split(np.arange(a.size), cuts):
        ga, gb = a[g], b[g]
        # covered by an earlier-begun wait of the same rank: up to the latest end before this one
        before = np.empty_like(gb)
        before[0] = ga[0]
        np.maximum.accumulate(gb[:-1], out=before[1:])
        lo = np.maximum(ga, before)
        hi = np.maximum(gb, lo)
        cov = compute.get(int(waiting[g[0]]), Coverage.EMPTY)
        exposed = (hi - lo) - cov.between(lo, hi)
        r = int(blamed[g[0]])
        caused[r] += int(exposed.sum())
        steps, at = np.unique(step[g], return_inverse=True)
        for s, w in zip(steps.tolist(), np.bincount(at, weights=exposed).tolist(), strict=True):
            by_step[(r, s)] += int(w)
    return {r: w for r, w in caused.items() if w > 0}, {k: w for k, w in by_step.items() if w > 0}


def _summarise(events: list[SkewEvent], compute: Mapping[int, Coverage] | None = None) -> SkewResult:
    """The per-rank sums of ``events``: the wait each rank caused (``compute``: each rank's compute
    coverage, which hides waits; none when not given), of the events whose clocks do not contradict each
    other (``SkewEvent.clock_contradicted``); each rank's top cause is :meth:`SkewResult.top_cause_in`."""
    # an event whose members' clocks contradict each other has no meaningful waits: it is listed (flagged)
    # but neither charged to a rank nor a source of its top cause
    # nor is one blamed on no rank (a member of its group has no trace)
    counted = [e for e in events if not e.clock_contradicted and e.blamed_rank >= 0]
    caused, by_step = _caused_waits(counted, compute or {})
    return SkewResult(events=events, caused_wait_ns=caused, caused_wait_by_step=by_step)


def _top_cause(kind: CauseKind, mine: list[SkewEvent]) -> Cause:
    """A rank's cause of kind ``kind`` from the events of that kind blamed on it that made others wait
    (``mine``; its own causes, not the ones passed on to it, where it has any): each amount is the growth
    before one such event, the mean over the events that name it weighted by the exposed wait each caused
    (one 77.8 ms checkpoint barrier beside a barrier of no wait reads +77.8 ms, not +38.9). A host gap's
    place (:attr:`Cause.gap_at`) is the one of the events that caused the most wait, where they caused more
    than half of it (a data loader's gap, at step 0's start and after each step's last all_reduce, in
    equal parts, is placed nowhere)."""
    own = [e for e in mine if not e.cause.passed_on] or mine
    weight = [e.total_exposed_wait_ns for e in own]
    delta = sum(e.cause.delta_ns * w for e, w in zip(own, weight, strict=True)) // max(sum(weight), 1)
    # by the label a cause shows (:func:`_by_label`): an event may name an op by either of its names
    grown: dict[str, int] = defaultdict(int)  # label -> growth times wait, summed over the events naming it
    named: dict[str, int] = defaultdict(int)  # label -> wait of the events naming it
    rep: dict[str, tuple[int, str]] = {}  # label -> the name with the most growth times wait
    for e, w in zip(own, weight, strict=True):
        for name, d in e.cause.ops:  # one name a label already (_grown_ops)
            label = _short(name)
            grown[label] += d * w
            named[label] += w
            rep[label] = max(rep.get(label, (d * w, name)), (d * w, name))
    if kind is CauseKind.HOST_GAP:
        # where the gaps lay: the place of the events that caused the most wait, named where they caused
        # more than half of it
        at: dict[str, int] = defaultdict(int)
        for e, w in zip(own, weight, strict=True):
            at[e.cause.gap_at] += w
        place = max(at, key=lambda p: at[p])
        return Cause(kind=kind, delta_ns=delta, gap_at=place if 2 * at[place] > sum(weight) else "")
    if kind is not CauseKind.COMPUTE or not grown:
        return Cause(kind=kind, delta_ns=delta)
    top = sorted(grown, key=lambda n: -grown[n])[:TOP_OPS]
    ops = tuple((rep[lb][1], grown[lb] // named[lb]) for lb in top)
    return Cause(kind=kind, delta_ns=delta, op=ops[0][0], ops=ops)
