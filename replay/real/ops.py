"""Re-issuing recorded operations on real processes (imported only by the worker: uses torch).

Communication is issued with the recorded type, size, dtype, group and peer: blocking where the original
waited for it right away (the next op on the rank depends on its completion), else asynchronously
(``async_op=True`` / ``isend`` / ``irecv``), so that a profiler capturing the replay sees the same
blocking and overlapping calls as in the original. For an asynchronous op a :class:`Completion` records
when it finished on this rank (a future callback where the backend gives one, else a waiter thread; or,
for an op a later op of the rank waits for and whose Work has no future, the issuing thread itself when
it waits, as the program's own ``wait()`` did).

Host compute is a busy loop of the recorded duration (``spin``; the deadline is on the monotonic clock,
so the loop needs no calibration), a plain sleep (``sleep``), or a busy loop for a share of every millisecond
and a sleep for the rest (``share``: the ranks of a host with fewer cores than ranks keep its cores as busy
as the original's compute did), on a CUDA device too; GPU work is enqueued on the device
(:mod:`skewlens.replay.real.gpu`). ``auto`` picks among the CPU modes by the cores each rank has (see
:func:`resolve_compute_mode` and :func:`cores_per_rank`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from skewlens.profiler.vocab import EMPTY_WAITS_FOR_NONE, CommType
from skewlens.replay.real.plan import KIND_COLL, KIND_SEND, ReplayOp, element_bytes, issued_root


@dataclass(eq=False, slots=True)
class Completion:
    """When an asynchronously issued op finished on this rank."""

    desc: str
    """The op, for error messages (rank, group, sequence number, op)."""
    issued_ns: int
    """Local monotonic time of the issue."""
    end_ns: int = -1
    """Local monotonic time of completion (-1 while in flight)."""
    error: str = ""
    """The backend's error message if the op failed."""
    event: threading.Event = field(default_factory=threading.Event)
    """Set once the op finished (successfully or not)."""
    work: Any = None
    """A Work no other thread waits on: the issuing thread waits on it itself (:meth:`wait`)."""
    op: ReplayOp | None = None
    """The replayed op (for the rank's progress report and a timeout's error: its group, seq, peer)."""

    def finish(self, error: str) -> None:
        """Record the completion (now) and wake whoever waits for it."""
        self.end_ns = time.perf_counter_ns()
        self.error = error
        self.event.set()

    def settle(self, outcome: Callable[[], object]) -> None:
        """Wait for the op by calling ``outcome`` (a Work's ``wait``, a future's ``value``) and record how it
        ended, with the backend's message if it raised."""
        try:
            outcome()
        except Exception as e:
            self.finish(str(e) or type(e).__name__)
            return
        self.finish("")

    def done(self) -> bool:
        """Whether the op finished (for a Work left to the issuing thread: in the backend, not yet seen)."""
        work = self.work
        return self.event.is_set() or (work is not None and bool(work.is_completed()))

    def wait(self) -> None:
        """Block until the op finished: on the Work itself where it was left to this thread, else until the
        thread or callback that records its completion has done so."""
        work, self.work = self.work, None
        if work is not None:
            self.settle(work.wait)
        self.event.wait()


def describe(op: ReplayOp, rank: int) -> str:
    """``rank 2: all_reduce on group '0' seq 4 (node 17 c10d::allreduce_)`` and the like."""
    node = f"(node {op.node_id} {op.name})"
    group = f"group {op.pg_name!r}" if op.pg_name else "the default group"
    if op.kind == KIND_COLL:
        return f"rank {rank}: {CommType(op.comm_type).name.lower()} on {group} seq {op.seq} {node}"
    if op.kind == KIND_SEND:
        return f"rank {rank}: send of {op.comm_bytes} B to rank {op.peer} tag {op.tag} on {group} {node}"
    return f"rank {rank}: recv of {op.comm_bytes} B from rank {op.peer} tag {op.tag} on {group} {node}"


#: Recorded ops (``skl_op``, the node's name) issued in their own form, not the single-tensor form their
#: ``comm_type`` otherwise gets (:meth:`CommIssuer._list_form`).
LIST_FORMS = frozenset(
    {
        "c10d::allgather_",
        "c10d::reduce_scatter_",
        "c10d::alltoall_",
        "c10d::monitored_barrier",
        "c10d::allreduce_coalesced_",
    }
)


def _scattered(numel: int, size: int) -> int:
    """Elements each of ``size`` members gets of a reduce_scatter of ``numel`` (its input, as
    ``comm_size`` records it): at least one, but none of an empty one (:data:`EMPTY_WAITS_FOR_NONE`)."""
    return max(1, numel // size) if numel else 0


def _even_parts(numel: int, size: int) -> list[int]:
    """``numel`` elements in ``size`` parts as even as they go, the first ``numel % size`` one larger: what
    a list reduce_scatter whose parts were uneven (the script's, unrecorded) moved in all."""
    per, rest = divmod(numel, size)
    return [per + (k < rest) for k in range(size)]


def _all_to_all_parts(op: ReplayOp, size: int, numel: int) -> tuple[list[int], list[int]]:
    """Elements an all_to_all sends to and receives from each of its ``size`` members: the recorded splits
    (whole elements of the dtype: the plan made it uint8 otherwise); where none were recorded, its
    ``numel`` in equal parts, and from each member an equal part of that member's bytes (members' amounts
    may differ)."""
    e = element_bytes(op.dtype)
    if len(op.send_splits) == len(op.recv_splits) == size:
        return [b // e for b in op.send_splits], [b // e for b in op.recv_splits]
    sizes = op.member_bytes if len(op.member_bytes) == size else (op.comm_bytes,) * size
    return [max(1, numel // size)] * size, [max(1, max(1, b // e) // size) for b in sizes]


class CommIssuer:
    """Issues one recorded communication op; keeps reusable buffers per (role, numel, dtype)."""

    def __init__(self, rank: int, device: torch.device, groups: dict[str, Any], default_pg: str) -> None:
        self.rank = rank
        self.device = device
        self.groups = groups
        self.default_pg = default_pg
        self._buffers: dict[tuple[str, int, str], torch.Tensor] = {}

    def _buf(self, role: str, numel: int, dtype: str) -> torch.Tensor:
        key = (role, numel, dtype)
        t = self._buffers.get(key)
        if t is None:
            t = self._buffers[key] = torch.zeros(numel, dtype=getattr(torch, dtype), device=self.device)
        return t

    @staticmethod
    def _reduce_op(op: ReplayOp, group: Any) -> Any:
        """The recorded ReduceOp (:attr:`ReplayOp.reduce_op`), where the backend and dtype take it: a
        ``premul_sum`` needs its factor, which is not recorded (``avg`` on NCCL, which runs it as one; on
        gloo, which has none, ``sum``: the same transfers), a bitwise op needs integers (``sum`` on
        others), and gloo's ``avg`` floats: of integers (NCCL's, or a dtype the plan made ``uint8``) it
        sums, then raises (``result type Float can't be cast to the desired output type Int``), so
        ``sum`` there."""
        name = op.reduce_op
        floating = getattr(torch, op.dtype).is_floating_point
        gloo = name in ("premul_sum", "avg") and dist.get_backend(group) == "gloo"
        if name == "premul_sum":
            name = "sum" if gloo else "avg"
        elif (name in ("band", "bor", "bxor") and floating) or (name == "avg" and gloo and not floating):
            name = "sum"
        return getattr(dist.ReduceOp, name.upper(), dist.ReduceOp.SUM)

    def _group(self, op: ReplayOp) -> tuple[Any, tuple[int, ...]]:
        if not op.pg_name or op.pg_name == self.default_pg:
            return None, tuple(range(dist.get_world_size()))
        group, ranks = self.groups[op.pg_name]
        return group, ranks

    def issue(self, op: ReplayOp, *, blocking: bool = False) -> Any:
        """Issue ``op``: asynchronously (returns the Work handle) or ``blocking`` (returns when done)."""
        group, ranks = self._group(op)
        size = len(ranks)
        root = issued_root(op.root, ranks)
        numel = op.comm_bytes // element_bytes(op.dtype)
        if numel == 0 and not (op.kind == KIND_COLL and op.comm_type in EMPTY_WAITS_FOR_NONE):
            numel = 1  # a send/recv, or a collective that meets its peers whatever it moves: one element
        dt = op.dtype
        if op.kind == KIND_SEND:
            if blocking:
                return dist.send(self._buf("p2p", numel, dt), dst=op.peer, group=group, tag=op.tag)
            return dist.isend(self._buf("p2p", numel, dt), dst=op.peer, group=group, tag=op.tag)
        if op.kind != KIND_COLL:
            if blocking:
                return dist.recv(self._buf("p2p", numel, dt), src=op.peer, group=group, tag=op.tag)
            return dist.irecv(self._buf("p2p", numel, dt), src=op.peer, group=group, tag=op.tag)
        ct = CommType(op.comm_type)
        if op.name in LIST_FORMS and (issued := self._list_form(op, group, ranks, numel, blocking)):
            return issued[0]
        if ct == CommType.BARRIER:
            return dist.barrier(group=group, async_op=not blocking)
        if ct == CommType.ALL_REDUCE:
            red = self._reduce_op(op, group)
            return dist.all_reduce(self._buf("in", numel, dt), op=red, group=group, async_op=not blocking)
        if ct == CommType.REDUCE:
            red = self._reduce_op(op, group)
            return dist.reduce(
                self._buf("in", numel, dt), dst=root, op=red, group=group, async_op=not blocking
            )
        if ct == CommType.BROADCAST:
            return dist.broadcast(self._buf("in", numel, dt), src=root, group=group, async_op=not blocking)
        if ct == CommType.ALL_GATHER:
            # comm_size of an all_gather is what this rank contributes (its input)
            out = self._buf("out", numel * size, dt)
            return dist.all_gather_into_tensor(
                out, self._buf("in", numel, dt), group=group, async_op=not blocking
            )
        if ct in (CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK):
            # comm_size of a reduce_scatter is this rank's input (the whole tensor to be reduced)
            per = _scattered(numel, size)
            out = self._buf("out", per, dt)
            return dist.reduce_scatter_tensor(
                out,
                self._buf("in", per * size, dt),
                op=self._reduce_op(op, group),
                group=group,
                async_op=not blocking,
            )
        if ct == CommType.ALL_TO_ALL:
            send, recv = _all_to_all_parts(op, size, numel)
            return dist.all_to_all_single(
                self._buf("out", sum(recv), dt),
                self._buf("in", sum(send), dt),
                output_split_sizes=recv,
                input_split_sizes=send,
                group=group,
                async_op=not blocking,
            )
        if ct == CommType.GATHER:
            bufs = [self._buf(f"g{k}", numel, dt) for k in range(size)] if self.rank == root else None
            return dist.gather(self._buf("in", numel, dt), bufs, dst=root, group=group, async_op=not blocking)
        # SCATTER
        bufs = [self._buf(f"g{k}", numel, dt) for k in range(size)] if self.rank == root else None
        return dist.scatter(self._buf("in", numel, dt), bufs, src=root, group=group, async_op=not blocking)

    def _list_form(
        self, op: ReplayOp, group: Any, ranks: tuple[int, ...], numel: int, blocking: bool
    ) -> tuple[Any] | None:
        """Re-issue a call recorded in its list form (``op.name``, :data:`LIST_FORMS`) in that form, as
        ``(its return value,)``: gloo runs the list and the single-tensor forms as different code (in a
        2-rank gloo capture each list ``reduce_scatter`` took over 4x the single-tensor one issued beside
        it), ``monitored_barrier`` is point-to-point messages to and from rank 0, not a barrier, and a
        profiler capturing the replay names each call as the original did. None where the form cannot be
        issued: a ``monitored_barrier`` waited for asynchronously or off gloo (it has no async form; gloo
        alone has it), a list ``all_to_all`` of uneven parts on gloo (which takes equal ones only), an
        ``all_reduce_coalesced`` on a torch without it; the single-tensor form is issued instead."""
        size, dt, a = len(ranks), op.dtype, not blocking
        gloo = dist.get_backend(group) == "gloo"
        if op.name == "c10d::monitored_barrier":
            return (dist.monitored_barrier(group=group),) if blocking and gloo else None
        if op.name == "c10d::allreduce_coalesced_":
            # its tensors' sizes are not recorded, their sum is: one tensor of that many elements
            coalesced = getattr(dist, "all_reduce_coalesced", None)  # deprecated: a later torch may lack it
            if coalesced is None:
                return None
            red = self._reduce_op(op, group)
            return (coalesced([self._buf("in", numel, dt)], op=red, group=group, async_op=a),)
        if op.name == "c10d::allgather_":
            out = list(self._buf("out", numel * size, dt).chunk(size))
            return (dist.all_gather(out, self._buf("in", numel, dt), group=group, async_op=a),)
        if op.name == "c10d::reduce_scatter_":
            # the list form takes parts of any size; theirs are not recorded, their sum is (comm_size, the
            # same on every member): that many elements, in parts as even as they go
            parts = _even_parts(numel, size)
            chunks = list(self._buf("in", numel, dt).split(parts))
            out_t, red = self._buf("out", parts[ranks.index(self.rank)], dt), self._reduce_op(op, group)
            return (dist.reduce_scatter(out_t, chunks, op=red, group=group, async_op=a),)
        # c10d::alltoall_: a list per side, each tensor one member's part (:func:`_all_to_all_parts`)
        send, recv = _all_to_all_parts(op, size, numel)
        if gloo and len({*send, *recv}) > 1:
            return None
        out = list(self._buf("out", sum(recv), dt).split(recv))
        inp = list(self._buf("in", sum(send), dt).split(send))
        return (dist.all_to_all(out, inp, group=group, async_op=a),)


#: Threads that block in ``Work.wait()`` for works without a future (gloo's send/recv), reused: starting a
#: thread per op cost the issuing thread 120 µs (median; 21 µs to hand the work to a pooled one), measured
#: on 2 gloo ranks of this 2-core machine. As many as can be outstanding at once: each waits for one work.
WAITERS = 32
_waiters: ThreadPoolExecutor | None = None


def _waiter_pool() -> ThreadPoolExecutor:
    global _waiters  # noqa: PLW0603 (one pool per worker process, made on first use)
    if _waiters is None:
        _waiters = ThreadPoolExecutor(max_workers=WAITERS, thread_name_prefix="skewlens-replay-wait")
    return _waiters


#: (op kind, group) whose Works have no future: asking raises a C++ error, 40-110 µs on the issuing thread.
_NO_FUTURE: set[tuple[str, str]] = set()


def track(
    work: Any, completion: Completion, kind: tuple[str, str] = ("", ""), *, waited: bool = False
) -> None:
    """Record ``work``'s completion time into ``completion`` (future callback, else a pooled waiter);
    ``kind`` (op kind, group) remembers which works have no future, so it is asked once. ``waited``: the
    issuing thread will wait for this op; a Work without a future is then left to it (a gloo send or recv
    can be waited on once), so its completion reaches it without two thread hand-overs (the likely cause
    of the 60-150 µs median lag the replay gained after each p2p op of a pipeline on 2 cores). ``work`` may
    be a future itself (an asynchronous ``all_reduce_coalesced`` on gloo returns one)."""
    fut = None
    if isinstance(work, torch._C.Future):  # what torch.futures.Future wraps; the call returns the bare one
        fut = work
    elif kind not in _NO_FUTURE:
        try:
            fut = work.get_future()
        except RuntimeError:
            _NO_FUTURE.add(kind)
    if fut is not None:
        fut.add_done_callback(lambda f: completion.settle(f.value))
        return
    if waited:
        completion.work = work
        return
    _waiter_pool().submit(completion.settle, work.wait)


def resolve_compute_mode(mode: str, cores: float) -> str:
    """``auto``: a busy loop (``spin``) when the rank has two cores (``cores``, from
    :func:`cores_per_rank`: one for the loop, one for its communication backend's threads); ``sleep`` when
    it has at least one; ``share`` when it has less.

    The busy loop is Python: it holds a core and the GIL. With fewer cores than that it starves the
    backend's threads and delays the completion callbacks: measured on 2 ranks of a 2-core machine
    (DTensor TP, gloo), the replay's all_reduces took 2.99 ms against 1.45 ms recorded and steps came out
    +27%; sleeping, 1.57 ms and +4.5..+10.6%. Recorded durations already include the original run's
    contention, so where cores are short they are reproduced better by sleeping.

    Where the ranks outnumber the cores, the original's compute kept every core busy, and its
    communication shared the cores with it: sleeping frees them, and the replay's transfers come out faster
    than recorded (the 2-D mesh, 4 ranks on 2 cores: collectives 290 ms against 437 ms recorded over six
    steps, steps -22..-32%; spinning, +15..+27%). ``share`` spins for the rank's share of a core
    (:func:`busy_share`), the share its compute had in the original.
    """
    if mode != "auto":
        return mode
    if cores >= 2:
        return "spin"
    return "sleep" if cores >= 1 else "share"


def busy_share(cores: float) -> float:
    """The share of its compute time a rank spins for in ``share`` mode: its cores, at most 1."""
    return min(1.0, cores)


def cores_per_rank(own: Collection[int], host: Sequence[Collection[int]]) -> float:
    """The cores one rank can count on: those it may run on (``own``, its affinity mask), but no more than
    an even split of the cores its host's ranks may run on between them (``host``: every local rank's mask,
    this one's included).

    Unpinned ranks share one mask (4 ranks on 2 cores: half a core each); ranks pinned to cores of their
    own each have theirs (2 ranks, a core each: one each, as unpinned); a job confined to part of a host
    (``taskset -c 0,1 torchrun ...``) splits that part.
    """
    return min(float(len(own)), len(set().union(*host)) / max(1, len(host)))


def host_cores() -> frozenset[int]:
    """The cores this process may run on (its affinity mask; every core where there is none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset(range(os.cpu_count() or 1))


class Compute:
    """Replays a host compute node's duration: a busy loop, a sleep, or a share of each (GPU work is the
    :class:`~skewlens.replay.real.gpu.GpuQueue`'s)."""

    def __init__(self, mode: str, cores: float = 1.0) -> None:
        """``cores``: the rank's cores (:func:`cores_per_rank`), which pick the ``auto`` mode."""
        self.mode = resolve_compute_mode(mode, cores)
        self.share = busy_share(cores)

    def run(self, dur_ns: int) -> None:
        """Do ``dur_ns`` of host work and return when it is done."""
        if dur_ns <= 0:
            return
        deadline = time.perf_counter_ns() + dur_ns
        if self.mode == "sleep":
            wait_until(deadline)
        elif self.mode == "share":
            shared_spin(deadline, self.share)
        else:
            spin_until(deadline)


def spin_until(deadline_ns: int) -> None:
    """Busy-loop until local monotonic time ``deadline_ns``."""
    while time.perf_counter_ns() < deadline_ns:
        pass


#: ``share`` mode spins for its share of every slice of this length and sleeps for the rest.
SHARE_SLICE_NS = 1_000_000


def shared_spin(deadline_ns: int, share: float) -> None:
    """Until ``deadline_ns``: spin for ``share`` of every ``SHARE_SLICE_NS`` and sleep for the rest; the
    last slice ends on the deadline exactly (:func:`wait_until`)."""
    while (now := time.perf_counter_ns()) < deadline_ns:
        end = min(now + SHARE_SLICE_NS, deadline_ns)
        spin_until(now + int(share * (end - now)))
        if end == deadline_ns:
            wait_until(deadline_ns)
            return
        left = end - time.perf_counter_ns()
        if left > 0:
            time.sleep(left / 1e9)


#: Below this much time to go, :func:`wait_until` spins instead of sleeping.
SPIN_BELOW_NS = 300_000


def wait_until(deadline_ns: int) -> None:
    """Return at local monotonic time ``deadline_ns``: sleep most of the way, spin the last bit."""
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        if left > SPIN_BELOW_NS:
            time.sleep((left - SPIN_BELOW_NS) / 1e9)
