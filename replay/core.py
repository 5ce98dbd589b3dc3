"""The discrete-event core of simulated replay: pure data in, pure data out, no I/O.

The input is a :class:`Graph` of *segments* over all ranks (``skewlens.replay.lower`` builds it from the trace
store). A segment is either a chain of compute nodes that run back to back on one stream (their relative
timing is fixed, so only the chain's head needs scheduling) or one communication node that is a member of
a *sync group* (a collective instance, or a matched send/recv pair).

Timing rules (all integer nanoseconds):

- a segment is *ready* when all its dependencies have ended (``ready0`` before that: its rank's start);
- it *arrives* at ``ready + gap`` (the recorded host gap plus any injected delay);
- a compute segment starts its work at its arrival, or, if it has *wait* dependencies (a consumer that
  blocks on an asynchronous result: the completion it waits for), at the later of its arrival and their
  ends; it ends ``length`` after its work starts;
- a sync member *arrives* when it starts; once every member of the group has arrived and every
  *queue-order* dependency has ended (the previous async op on a member's communication stream), at
  ``T``, the transfer begins, and member ``m`` ends at ``T + transfer[m]`` (fixed durations,
  ``as_recorded`` or the analytic network model) or, in contention mode, when its share of the
  bandwidth of the links it uses has moved its data;
- a *detached* member (an eager send: it completed without its receiver) counts as arrived for the
  group but does not wait for it: it ends ``transfer[m]`` after its own arrival.
- a member of a group with a per-member rule (``waits_for``: a rooted collective) waits only for the
  arrival the rule names (the last, a root's, or its own) and its own queue-order dependencies: it ends
  ``transfer[m]`` after the later of them.
- a *launch* dependency (GPU work launched from inside a host segment) is met ``offset`` after the
  launching segment starts, not when it ends; where the launch is ``lsucc_at_arrival`` (a host op that
  launched work and then waited for it, such as ``.item()``: the launch comes before the wait, and the
  wait may be for that very work), ``offset`` after the segment arrives.

Ready compute work is advanced in a tight loop without the event queue; the queue only orders
cross-rank synchronisation (group completions, and in contention mode transfer starts and rate changes).
Its key is ``(time, priority, sequence)`` as in SimPy, so equal-time events pop in a deterministic order.
Every event scheduled while handling an event at time ``t`` lies at ``t`` or later, so the order is causal.
"""

from __future__ import annotations

import heapq
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Protocol

#: Event priorities: at equal times completions are handled before starts.
PRIO_COMPLETE = 0
PRIO_START = 1

#: Below any time in a trace.
_NEVER = -(1 << 62)

#: ``Graph.length`` of a sync segment (its end is decided by the group, not by the segment).
SYNC = -1


class DeadlockError(Exception):
    """Simulation stopped with unfinished segments (a cycle, or a group whose members never all arrive)."""

    def __init__(self, waiting: list[int], stuck: list[int]) -> None:
        super().__init__(f"{len(stuck)} segment(s) never ran; blocked sync groups {waiting[:5]}")
        self.waiting = waiting
        """Sync groups some (not all) of whose members arrived."""
        self.stuck = stuck
        """Segments that never became ready."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Flow:
    """Contention-mode description of a sync group's transfer."""

    alone_ns: int
    """Transfer time when no other transfer shares its links."""
    links: tuple[int, ...]
    """Ids of the links it uses; concurrent transfers on a link share its bandwidth equally."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Graph:
    """Segments of all ranks (global ids), their dependencies, and the sync groups."""

    ready0: Sequence[int]
    """Earliest ready time of each segment (its rank's first recorded start)."""
    gap: Sequence[int]
    """Wait between ready and start of each segment's head (host gap + injected delays)."""
    length: Sequence[int]
    """Compute segments: head start to tail end; sync segments: ``SYNC``."""
    ndeps: Sequence[int]
    """Number of segments each segment waits for."""
    succ_ptr: Sequence[int]
    """CSR offsets of successors (length ``n + 1``)."""
    succ_idx: Sequence[int]
    """Successor segment ids."""
    sync_of: Sequence[int]
    """Sync group of each segment (-1 for compute)."""
    groups: Sequence[Sequence[int]]
    """Member segments of each sync group."""
    transfer: Sequence[Sequence[int]]
    """Per member (aligned with ``groups``): ns from the last arrival to that member's end."""
    flows: Sequence[Flow] | None = None
    """Contention mode: one flow per group (``transfer`` is then ignored)."""
    xsucc_ptr: Sequence[int] | None = None
    """CSR offsets of *queue-order* successors: sync segments whose transfer waits for this segment's end
    but whose arrival does not (an async collective queued behind the previous one on its stream)."""
    xsucc_idx: Sequence[int] | None = None
    """Queue-order successor segment ids (sync segments only)."""
    group_xdeps: Sequence[int] | None = None
    """Number of queue-order dependencies of each group (over all its members)."""
    wsucc_ptr: Sequence[int] | None = None
    """CSR offsets of *wait* successors: compute segments whose work cannot start before this segment
    ends (with no gap: they were blocked on it), counted in their ``ndeps`` (though they hold only the
    work's start, not the arrival: :func:`run` counts them apart)."""
    wsucc_idx: Sequence[int] | None = None
    """Wait successor segment ids."""
    detached: Sequence[Sequence[bool]] | None = None
    """Per group, aligned with ``groups``: members that do not wait for the group (eager sends)."""
    waits_for: Sequence[Sequence[int] | None] | None = None
    """Per group, None (every member's transfer begins at the group's) or, aligned with ``groups``, whose
    arrival each member's transfer waits for: -1 every member's, ``k`` member ``k``'s (its own index: no
    one's). Such a member's transfer begins once it and that member have arrived and its own queue-order
    dependencies have ended; it ends ``transfer`` after that (a rooted collective's members: the execution
    model's ``waits_for``). In contention mode it is timed so too, and takes no share of the links."""
    lsucc_ptr: Sequence[int] | None = None
    """CSR offsets of *launch* successors: segments (GPU work) that cannot start before this segment's
    start plus an offset (the launch call inside it; or a call some time after a row of it ended, where
    it is GPU work that the calling host row had waited for before the call), counted in their ``ndeps``."""
    lsucc_idx: Sequence[int] | None = None
    """Launch successor segment ids."""
    lsucc_off: Sequence[int] | None = None
    """Per launch successor: ns after this segment's start (its work start; a sync member's arrival; its
    arrival where ``lsucc_at_arrival``)."""
    lsucc_at_arrival: Sequence[int] | None = None
    """Per launch successor (aligned with ``lsucc_idx``), 1 where it is met ``lsucc_off`` after the
    launching segment *arrives*, not after its work starts: a segment with wait dependencies that launched
    work before it waited (the work it waits for, maybe; a wait dependency holds only the work's start, so
    it arrives, launches, and waits). Only a segment with wait dependencies tells the two apart (None:
    none is so)."""


@dataclass(kw_only=True, slots=True)
class Outcome:
    """Start and end of every segment; arrival and completion of every sync group."""

    seg_start: Sequence[int]
    """Start of each segment's work (its arrival, or later where it waited)."""
    seg_end: Sequence[int]
    """End of each segment's tail."""
    group_arrival: list[int] = field(default_factory=list)
    """Latest member arrival per group."""
    group_end: list[int] = field(default_factory=list)
    """Latest member end per group."""
    waited: dict[int, int] = field(default_factory=dict)
    """Arrival (``ready + gap``) of each segment whose work waited for a completion after it arrived (its
    start is then later); every other segment arrived at its start (:meth:`arrival`). Kept for those few
    only: a whole column of arrivals, a copy of the starts but there, is 16 MiB on 2 M segments."""

    def arrival(self, s: int) -> int:
        """Arrival of segment ``s`` (``ready + gap``): its start, unless it waited for a completion."""
        return self.waited.get(s, self.seg_start[s])


class EventQueue:
    """A SimPy-style event queue: ``(time, priority, seq, payload)``, popped in that order."""

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, int]] = []
        self._seq = 0
        self.now = 0

    def schedule(self, time: int, priority: int, payload: int) -> None:
        """Schedule ``payload`` at ``time`` (never before ``now``)."""
        if time < self.now:
            raise ValueError(f"event at {time} ns scheduled in the past (now {self.now} ns)")
        heapq.heappush(self._heap, (time, priority, self._seq, payload))
        self._seq += 1

    def __bool__(self) -> bool:
        return bool(self._heap)

    def peek(self) -> int | None:
        """Time of the next event, or None."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[int, int, int]:
        """Remove the next event; returns ``(time, priority, payload)`` and advances ``now``."""
        t, prio, _seq, payload = heapq.heappop(self._heap)
        self.now = t
        return t, prio, payload


def _with_edges(ptr: Sequence[int], n: int) -> bytearray:
    """1 for each of the ``n`` segments with an edge in the CSR offsets ``ptr``, else 0.

    A ``map`` over the offsets, about a third of the time a loop over the segments takes (on the 2 M
    segments of a GPU run, 0.09 s against 0.33 s a flag set: two a simulation); nothing to scan where
    there is no edge at all."""
    if not ptr[n]:
        return bytearray(n)
    return bytearray(map(operator.ne, ptr[:n], ptr[1:]))


def run(g: Graph) -> Outcome:
    """Simulate ``g`` to completion; raises :class:`DeadlockError` if some segment can never run.

    :func:`binding_segments` walks these rules backwards: a change to how a time is set here is a change
    there too (``tests/test_whatif_proof.py`` compares its proofs with simulations)."""
    n = len(g.length)
    # each segment's ready time, dropped (set to 0) once the segment is taken: what is held is then the
    # ends of the segments still to run, not an int object for every segment (``Graph.ready0`` from the
    # lowering shares one object among equal times)
    ready = list(g.ready0)
    wready: dict[int, int] = {}  # latest end of the wait dependencies of the segments that have some
    remaining = list(g.ndeps)  # dependencies still to end, but wait dependencies (``wpending``)
    gap, length, succ_ptr, succ_idx, sync_of = g.gap, g.length, g.succ_ptr, g.succ_idx, g.sync_of
    xptr = g.xsucc_ptr if g.xsucc_ptr is not None else [0] * (n + 1)
    xidx = g.xsucc_idx if g.xsucc_idx is not None else []
    wptr = g.wsucc_ptr if g.wsucc_ptr is not None else [0] * (n + 1)
    widx = g.wsucc_idx if g.wsucc_idx is not None else []
    # the results as int64 arrays: 8 bytes a segment, where a list holds a pointer and an int object (the
    # state read in the hot loop stays in lists: reading an array item makes an int object each time)
    start = array("q", bytes(8 * n))
    end = array("q", bytes(8 * n))
    ngroups = len(g.groups)
    arrived = [0] * ngroups
    arrival_max = [_NEVER] * ngroups
    xready = [_NEVER] * ngroups  # latest end of the groups' queue-order dependencies
    xpending = list(g.group_xdeps) if g.group_xdeps is not None else [0] * ngroups
    group_end = [0] * ngroups
    group_size = [len(m) for m in g.groups]
    slot: dict[int, int] = {}  # detached segment -> its index among its group's members
    if g.detached is not None:
        for gi, flags in enumerate(g.detached):
            for j, f in enumerate(flags):
                if f:
                    slot[g.groups[gi][j]] = j
    # groups with a per-member rule (rooted collectives): their members are timed one by one
    rule_of: dict[int, Sequence[int]] = {}
    if g.waits_for is not None:
        rule_of = {gi: w for gi, w in enumerate(g.waits_for) if w is not None}
    pslot: dict[int, int] = {}  # member segment of such a group -> its index among the group's members
    for gi in rule_of:
        for j, s in enumerate(g.groups[gi]):
            pslot[s] = j
    p_arr: dict[int, int] = {}  # their arrivals
    p_xready: dict[int, int] = {}  # latest end of each one's own queue-order dependencies
    p_xpending: dict[int, int] = {}  # how many of those are still to end
    if pslot:
        for s in xidx:
            if s in pslot:
                p_xpending[s] = p_xpending.get(s, 0) + 1
    q = EventQueue()
    contention = _Contention(g.flows, q) if g.flows is not None else None
    prio_launch = PRIO_COMPLETE if contention is None else PRIO_START
    done = 0
    stack: list[int] = []

    def release_rare(s: int, e: int) -> None:
        """Wait and queue-order successors of ``s`` (most segments have none: checked by the caller)."""
        for k in range(wptr[s], wptr[s + 1]):
            d = widx[k]
            if e > wready.get(d, _NEVER):
                wready[d] = e
            wpending[d] -= 1
            if wpending[d] == 0 and d in arrived_at:  # it arrived before: its work may start now
                stack.append(d)
        for k in range(xptr[s], xptr[s + 1]):
            if xidx[k] in pslot:  # a member timed on its own: its own queue dependencies
                d = xidx[k]
                p_xready[d] = max(p_xready.get(d, _NEVER), e)
                p_xpending[d] -= 1
                fire_members(sync_of[d], (d,))
                continue
            gi = sync_of[xidx[k]]
            xready[gi] = max(xready[gi], e)
            xpending[gi] -= 1
            if xpending[gi] == 0 and arrived[gi] == group_size[gi]:
                q.schedule(max(arrival_max[gi], xready[gi]), prio_launch, gi)

    lptr = g.lsucc_ptr if g.lsucc_ptr is not None else [0] * (n + 1)
    lidx = g.lsucc_idx if g.lsucc_idx is not None else []
    loff = g.lsucc_off if g.lsucc_off is not None else []
    lrare = _with_edges(lptr, n)  # 1 for segments that launch GPU work

    def release_launches(s: int, t: int) -> None:
        """Launch successors of ``s``, which started at ``t``."""
        for k in range(lptr[s], lptr[s + 1]):
            d = lidx[k]
            v = t + loff[k]
            if v > ready[d]:  # noqa: PLR1730
                ready[d] = v
            remaining[d] -= 1
            if remaining[d] == 0:
                stack.append(d)

    at_arrival = g.lsucc_at_arrival if g.lsucc_at_arrival is not None else bytes(len(loff))

    def release_split(s: int, t: int, arrived: int) -> None:
        """Launch successors of a waiting segment that launches: those ``lsucc_at_arrival`` at its arrival
        ``t`` (``arrived``), or the others at its work's start ``t``."""
        for k in range(lptr[s], lptr[s + 1]):
            if at_arrival[k] != arrived:
                continue
            v = t + loff[k]
            d = lidx[k]
            if v > ready[d]:  # noqa: PLR1730
                ready[d] = v
            remaining[d] -= 1
            if remaining[d] == 0:
                stack.append(d)

    def release_eager(s: int, e: int) -> None:
        """All successors of an eager send (few: the hot paths below inline the same loop)."""
        for k in range(succ_ptr[s], succ_ptr[s + 1]):
            d = succ_idx[k]
            ready[d] = max(ready[d], e)
            remaining[d] -= 1
            if remaining[d] == 0:
                stack.append(d)
        release_rare(s, e)

    fired: set[int] = set()  # members of groups with a per-member rule that have ended

    def fire_members(gi: int, candidates: Sequence[int]) -> None:
        """End those of ``candidates`` (members of group ``gi``, which has a per-member rule) whose
        transfer may now begin: they, the member they wait for (all, for -1) have arrived and their own
        queue-order dependencies have ended."""
        rule = rule_of[gi]
        members = g.groups[gi]
        for m in candidates:
            if m in fired or m in slot or m not in p_arr or p_xpending.get(m, 0):
                continue
            j = pslot[m]
            w = rule[j]
            if w < 0:
                if arrived[gi] < group_size[gi]:
                    continue
                t = arrival_max[gi]
            else:
                a = p_arr.get(members[w])
                if a is None:
                    continue
                t = max(p_arr[m], a)
            t = max(t, p_xready.get(m, _NEVER))
            e = t + g.transfer[gi][j]
            end[m] = e
            fired.add(m)
            release_eager(m, e)

    # per segment: 1 if it has wait or queue-order successors (checked once, not two CSR ranges)
    rare = _with_edges(xptr, n)
    if wptr[n]:
        rare = bytearray(map(operator.or_, rare, _with_edges(wptr, n)))
    waits_on = bytearray(n)  # 1 for segments with wait dependencies
    wpending: dict[int, int] = {}  # how many wait dependencies of each such segment are still to end
    for d in widx:
        waits_on[d] = 1
        wpending[d] = wpending.get(d, 0) + 1
        remaining[d] -= 1  # a wait dependency holds the work's start, not the arrival
    # waiting segments with launches met at arrival: released in two parts, not by release_launches
    split = bytearray(n)
    if g.lsucc_at_arrival is not None:
        for d in wpending:
            if lrare[d]:
                split[d], lrare[d] = 1, 0
    arrived_at: dict[int, int] = {}  # arrival of the segments with wait dependencies
    stack.extend(compress(range(n), map(operator.not_, remaining)))  # those with no dependency
    while True:
        while stack:
            s = stack.pop()
            t = ready[s] + gap[s]
            ready[s] = 0
            ln = length[s]
            if ln >= 0:
                if waits_on[s]:
                    a = arrived_at.get(s)
                    if a is None:  # its arrival (popped again once its wait dependencies end)
                        arrived_at[s] = a = t
                        if split[s]:
                            release_split(s, a, 1)
                        if wpending[s]:
                            continue
                    t = max(a, wready.get(s, _NEVER))
                    if split[s]:
                        release_split(s, t, 0)
                start[s] = t
                e = t + ln
                end[s] = e
                done += 1
                if lrare[s]:
                    release_launches(s, t)
                for k in range(succ_ptr[s], succ_ptr[s + 1]):
                    d = succ_idx[k]
                    if e > ready[d]:  # noqa: PLR1730 (cheaper than max() in the hot loop)
                        ready[d] = e
                    remaining[d] -= 1
                    if remaining[d] == 0:
                        stack.append(d)
                if rare[s]:
                    release_rare(s, e)
            else:
                start[s] = t
                if lrare[s]:
                    release_launches(s, t)
                gi = sync_of[s]
                arrived[gi] += 1
                if t > arrival_max[gi]:  # noqa: PLR1730
                    arrival_max[gi] = t
                j = slot.get(s, -1) if slot else -1
                if j >= 0:  # an eager send: done without its receiver
                    e = t + g.transfer[gi][j]
                    end[s] = e
                    done += 1
                    release_eager(s, e)
                if s in pslot:  # a member timed on its own, and those that waited for its arrival
                    p_arr[s] = t
                    fire_members(gi, g.groups[gi])
                elif arrived[gi] == group_size[gi] and xpending[gi] == 0:
                    q.schedule(max(arrival_max[gi], xready[gi]), prio_launch, gi)
        if not q:
            break
        t, prio, gi = q.pop()
        if contention is not None:
            if prio == PRIO_START:
                contention.start(gi, t)
                continue
            if not contention.finish(gi, t):
                continue  # stale completion (rates changed since it was scheduled)
        members = g.groups[gi]
        tr = g.transfer[gi] if contention is None else None
        gend = _NEVER
        for j, s in enumerate(members):
            if slot and s in slot:
                gend = max(gend, end[s])
                continue
            e = t + tr[j] if tr is not None else t
            end[s] = e
            gend = max(gend, e)
            done += 1
            for k in range(succ_ptr[s], succ_ptr[s + 1]):
                d = succ_idx[k]
                if e > ready[d]:  # noqa: PLR1730 (cheaper than max() in the hot loop)
                    ready[d] = e
                remaining[d] -= 1
                if remaining[d] == 0:
                    stack.append(d)
            if rare[s]:
                release_rare(s, e)
        group_end[gi] = gend
    done += len(fired)
    for gi in rule_of:
        group_end[gi] = max((end[m] for m in g.groups[gi] if m in fired or m in slot), default=0)
    if done != n:
        # a group with a per-member rule counts its members' own queue dependencies (its xpending stays)
        pending = [
            sum(p_xpending.get(m, 0) for m in g.groups[i]) if i in rule_of else xpending[i]
            for i in range(ngroups)
        ]
        waiting = [i for i in range(ngroups) if 0 < arrived[i] < group_size[i] or pending[i] > 0]
        stuck = [i for i in range(n) if remaining[i] > 0 or wpending.get(i, 0) > 0]
        raise DeadlockError(waiting, stuck)
    return Outcome(
        seg_start=start, seg_end=end, group_arrival=arrival_max, group_end=group_end, waited=arrived_at
    )


#: What :func:`binding_segments` explains of a segment: its end, its start, its ready time.
_END, _START, _READY = 0, 1, 2


class _Ints(Protocol):
    """Integers by position: a list, or an array of a loader that the core only indexes."""

    def __getitem__(self, i: int, /) -> Any: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Preds:
    """The edges of a :class:`Graph` reversed (CSR by destination segment), for :func:`binding_segments`."""

    ptr: _Ints
    idx: _Ints
    """Start-edge predecessors."""
    wptr: _Ints
    widx: _Ints
    """Wait predecessors."""
    xptr: _Ints
    xidx: _Ints
    """Queue-order predecessors of each sync segment."""
    lptr: _Ints
    lidx: _Ints
    loff: _Ints
    """Launch predecessors and the offset of each launch after its launching segment's start."""
    lat_arrival: _Ints
    """Per launch predecessor: 1 where ``Graph.lsucc_at_arrival`` (met after the launching segment's
    arrival)."""


def binding_segments(g: Graph, out: Outcome, targets: Sequence[int], preds: Preds) -> bytearray | None:
    """Segments on a *binding path* of ``out`` (a run of ``g`` without contention) to each target's end.

    Walking back from a target, each step follows the rule of :func:`run` that gave the value its time,
    found by equality: a compute segment's end is its start plus its length; its start is a wait
    dependency's end where it waited, else its arrival, ``ready + gap``; ``ready`` is its ``ready0`` or a
    dependency's end or a launching segment's start (its arrival, where ``lsucc_at_arrival``) plus the
    launch offset; a sync member ends ``transfer``
    after its group's transfer began (an eager send: after its own arrival), which is the last member's
    arrival or a queue-order dependency's end. Returns a flag per segment: 1 where its gap, length, row
    times or launch offsets are on some path (a sync member only where its own arrival is; its transfer is
    fixed). Every step is an inequality that holds in any run of a graph of the same edges, so a run of
    ``g`` whose changes only shorten (gaps, lengths, launch offsets) and touch no flagged segment ends every
    target at the same time. None if ``g`` has contention (transfer times are then not fixed) or a time
    was not explained (nothing may then be concluded).
    """
    if g.flows is not None:
        return None
    n = len(g.length)
    gap, length, ready0, sync_of = g.gap, g.length, g.ready0, g.sync_of
    start, end, arrival = out.seg_start, out.seg_end, out.arrival

    def ended_at(ptr: _Ints, idx: _Ints, s: int, t: int) -> int:
        """The first predecessor of ``s`` (in the CSR ``ptr``/``idx``) that ended at ``t``, else -1."""
        for k in range(ptr[s], ptr[s + 1]):
            if end[idx[k]] == t:
                return int(idx[k])
        return -1

    on = bytearray(n)
    seen_end = bytearray(n)
    seen_start = bytearray(n)
    for target in targets:
        todo: tuple[int, int] | None = (_END, target)
        while todo is not None:
            what, s = todo
            todo = None
            if what == _END:
                if seen_end[s]:
                    continue
                seen_end[s] = 1
                if length[s] >= 0:  # a compute segment: start + length
                    on[s] = 1
                    todo = (_START, s)
                    continue
                gi = sync_of[s]
                members = g.groups[gi]
                j = members.index(s)
                if g.detached is not None and g.detached[gi][j]:  # an eager send: arrival + transfer
                    on[s] = 1
                    todo = (_READY, s)
                    continue
                t = end[s] - g.transfer[gi][j]  # the group's transfer began at t
                rule = g.waits_for[gi] if g.waits_for is not None else None
                if rule is not None and rule[j] >= 0:  # a member timed on its own: its awaited arrival
                    p = next((m for m in (s, members[rule[j]]) if arrival(m) == t), -1)
                    if p >= 0:
                        on[p] = 1
                        todo = (_READY, p)
                        continue
                    p = ended_at(preds.xptr, preds.xidx, s, t)  # or its own queue-order dependency
                    if p < 0:
                        return None
                    todo = (_END, p)
                    continue
                if t == out.group_arrival[gi]:  # when its last member arrived
                    p = next((m for m in members if arrival(m) == t), -1)
                    if p < 0:
                        return None
                    on[p] = 1
                    todo = (_READY, p)
                    continue
                # else when the op queued before it on one member's stream ended (its own only, for a member
                # of a group with a per-member rule)
                queued = (s,) if rule is not None else members
                p = next((q for m in queued if (q := ended_at(preds.xptr, preds.xidx, m, t)) >= 0), -1)
                if p < 0:
                    return None
                todo = (_END, p)
            elif what == _START:
                if seen_start[s]:
                    continue
                seen_start[s] = 1
                on[s] = 1
                if start[s] == arrival(s):
                    todo = (_READY, s)
                    continue
                p = ended_at(preds.wptr, preds.widx, s, start[s])  # it waited for a completion
                if p < 0:
                    return None
                todo = (_END, p)
            else:  # _READY: explain ``arrival - gap``: ready0, a dependency's end or a launch
                r = arrival(s) - gap[s]
                if r == ready0[s]:
                    continue
                p = ended_at(preds.ptr, preds.idx, s, r)
                if p >= 0:
                    todo = (_END, p)
                    continue
                met_at_arrival = False
                for k in range(preds.lptr[s], preds.lptr[s + 1]):
                    q = int(preds.lidx[k])
                    met_at_arrival = bool(preds.lat_arrival[k])
                    if (arrival(q) if met_at_arrival else start[q]) + preds.loff[k] == r:
                        p = q
                        break
                if p < 0:
                    return None
                if met_at_arrival:  # launched before it waited: on the path up to its arrival
                    on[p] = 1
                    todo = (_READY, p)
                    continue
                todo = (_START, p)
    return on


class _Contention:
    """Fluid bandwidth sharing: a flow's rate is 1 / (most flows on any of its links).

    Work is measured in "alone" nanoseconds; a flow alone on its links progresses at rate 1. On every
    start and finish the rates of the active flows are recomputed and their completions rescheduled;
    a completion event whose time no longer matches the flow's current ETA is stale and ignored.
    """

    __slots__ = ("active", "eta", "flows", "last", "link_load", "q", "rate", "remaining")

    def __init__(self, flows: Sequence[Flow], q: EventQueue) -> None:
        self.flows = flows
        self.q = q
        self.remaining: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.eta: dict[int, int] = {}
        self.link_load: dict[int, int] = {}
        self.last = 0
        self.active: set[int] = set()

    def _advance(self, t: int) -> None:
        dt = t - self.last
        if dt:
            for gi in self.active:
                self.remaining[gi] -= dt * self.rate[gi]
        self.last = t

    def _reschedule(self, t: int) -> None:
        for gi in sorted(self.active):
            load = max((self.link_load[lk] for lk in self.flows[gi].links), default=1)
            rate = 1.0 / load
            if self.rate.get(gi) != rate:
                self.rate[gi] = rate
                eta = t + max(0, round(self.remaining[gi] / rate))
                self.eta[gi] = eta
                self.q.schedule(eta, PRIO_COMPLETE, gi)

    def start(self, gi: int, t: int) -> None:
        self._advance(t)
        self.active.add(gi)
        self.remaining[gi] = float(self.flows[gi].alone_ns)
        for lk in self.flows[gi].links:
            self.link_load[lk] = self.link_load.get(lk, 0) + 1
        self._reschedule(t)

    def finish(self, gi: int, t: int) -> bool:
        """Complete ``gi`` at ``t`` unless the event is stale; returns whether it completed."""
        if gi not in self.active or self.eta.get(gi) != t:
            return False
        self._advance(t)
        self.active.discard(gi)
        for lk in self.flows[gi].links:
            self.link_load[lk] -= 1
        self._reschedule(t)
        return True
