"""One real-replay rank: ``python -m skewlens.replay.real.worker --plan PLAN_DIR`` under torchrun.

Reads its rank's plan (JSON), joins the job (``init_process_group`` from torchrun's environment),
re-creates the recorded process groups in the recorded order, warms the communication up (one op per
distinct shape), aligns its clock to rank 0, starts the profiler's capture (unless the plan says not
to), then executes its ops from a common start time (see :mod:`skewlens.replay.real.plan` for the
timing rules; on a CUDA device GPU work is enqueued on streams, see :class:`Runner`). It writes
``rank-<r>.et`` of the node-aligned record (the original nodes with the replayed times) and a small result
file for the parent; the profiler writes its own capture of the replay.

A watchdog thread aborts the process (exit code 3) when an op stays in flight longer than the timeout,
after writing ``rank-<r>.error.json`` naming the rank, group, sequence number and op; it also exits when
the launcher that started this process goes away, or the process supervising that launcher does (the
``skewlens replay`` process killed with SIGKILL), so no worker outlives its job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from skewlens.profiler.atomic import write_json_atomic
from skewlens.profiler.chakra_io import EtWriter, iter_nodes
from skewlens.profiler.manifest import rank_file
from skewlens.profiler.vocab import Attr
from skewlens.replay.real import clock
from skewlens.replay.real.gpu import ISSUE, CudaQueue, GpuQueue
from skewlens.replay.real.ops import (
    CommIssuer,
    Completion,
    Compute,
    cores_per_rank,
    describe,
    host_cores,
    track,
    wait_until,
)
from skewlens.replay.real.plan import (
    ERROR_FILE,
    KIND_COMPUTE,
    KIND_NESTED,
    PROGRESS_FILE,
    PROGRESS_S,
    RESULT_FILE,
    SUPERVISOR_ENV,
    PlanMeta,
    ReplayOp,
    WorkerPhase,
    read_meta,
    read_rank_plan,
)

#: Extra time allowed for start-up (imports, rendezvous, group creation) on top of the op timeout.
SETUP_GRACE_S = 60.0
GIL_SWITCH_S = 0.0002
EXIT_TIMEOUT = 3
EXIT_FAILED = 1
EXIT_ORPHANED = 4
#: The watchdog's key of a wait of this thread for work on the device (warm-up ops use -1, ops their row).
DEVICE_WAIT = -2


def _waited(op: ReplayOp | None) -> dict[str, Any]:
    """What a rank stuck in ``op`` waited for, for the parent's message (``launch.waiting_for``)."""
    if op is None:
        return {}
    return {"group": op.pg_name, "seq": op.seq, "peer": op.peer, "comm_type": op.comm_type, "root": op.root}


class Watchdog:
    """Aborts the worker when an op (or the start-up phase) exceeds its time limit, or when orphaned."""

    def __init__(self, rank: int, work_dir: Path, timeout_s: float) -> None:
        self.rank = rank
        self.work_dir = work_dir
        self.timeout_ns = int(timeout_s * 1e9)
        self.lock = threading.Lock()
        self.inflight: dict[int, Completion] = {}
        self.phase = WorkerPhase.START_UP
        self.phase_deadline_ns = time.perf_counter_ns() + int((timeout_s + SETUP_GRACE_S) * 1e9)
        self.parent = os.getppid()
        self.supervisor = int(os.environ.get(SUPERVISOR_ENV) or 0)  # 0: none named (started by hand)
        self.next_supervisor_check_ns = 0
        self.stop = threading.Event()
        self.reached_phase = WorkerPhase.START_UP
        self.last = ""
        self.issued: dict[str, int] = {}
        self.changed = True
        self.next_report_ns = 0

    def reached(self, phase: WorkerPhase) -> WorkerPhase:
        """Report (now) that start-up got to ``phase``; returns it."""
        with self.lock:
            self.reached_phase, self.changed = phase, True
        self.report()
        return phase

    def report(self) -> None:
        """Rewrite ``rank-<r>.progress.json`` where anything changed since the last one."""
        with self.lock:
            if not self.changed:
                return
            doc = {
                "rank": self.rank,
                "phase": self.reached_phase,
                "last": self.last,
                "issued": dict(self.issued),
            }
            self.changed = False
        with contextlib.suppress(OSError):
            write_json_atomic(self.work_dir / PROGRESS_FILE.format(rank=self.rank), doc)

    def set_phase(self, phase: WorkerPhase, limit_s: float | None) -> None:
        with self.lock:
            self.phase = phase
            self.phase_deadline_ns = (
                time.perf_counter_ns() + int(limit_s * 1e9) if limit_s is not None else -1
            )

    def add(self, row: int, completion: Completion) -> None:
        with self.lock:
            self.inflight[row] = completion
            op = completion.op
            if op is not None and row >= 0:
                self.last, self.changed = completion.desc, True
                if op.seq >= 0:
                    self.issued[op.pg_name] = op.seq

    def done(self, row: int) -> None:
        with self.lock:
            self.inflight.pop(row, None)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="skewlens-replay-watchdog", daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(0.02):
            now = time.perf_counter_ns()
            if self._orphaned(now):
                os._exit(EXIT_ORPHANED)
            if now >= self.next_report_ns:
                self.report()
                self.next_report_ns = now + int(PROGRESS_S * 1e9)
            with self.lock:
                late = [c for c in self.inflight.values() if not c.done()]
                phase, deadline = self.phase, self.phase_deadline_ns
            stuck = min(late, key=lambda c: c.issued_ns, default=None)
            if stuck is not None and now - stuck.issued_ns > self.timeout_ns:
                op = stuck.op
                self.abort(
                    "timeout",
                    f"{stuck.desc} did not complete within {self.timeout_ns / 1e9:g} s (real.timeout_s)",
                    stuck.issued_ns,
                    _waited(op),
                )
            if deadline >= 0 and now > deadline:
                self.abort(
                    "timeout", f"rank {self.rank}: {phase} did not finish in time", now, {"phase": phase}
                )

    def _orphaned(self, now_ns: int) -> bool:
        """Whether the launcher that started this process is gone, or its supervisor is (looked at every
        ``PROGRESS_S``, not every tick: reading the launcher's parent took 0.24 ms, the GIL held): killed
        with SIGKILL, ``skewlens replay`` stopped nothing, and torchrun (re-parented) and its workers ran the
        whole replay on (a 2-rank replay of the demo's run with a 30 s stall: both workers, 30 s more)."""
        if os.getppid() != self.parent:
            return True
        if not self.supervisor or now_ns < self.next_supervisor_check_ns:
            return False
        self.next_supervisor_check_ns = now_ns + int(PROGRESS_S * 1e9)
        try:
            return psutil.Process(self.parent).ppid() != self.supervisor
        except psutil.Error:
            return True

    def abort(self, kind: str, message: str, at_ns: int, waited: dict[str, Any] | None = None) -> None:
        """Write ``rank-<r>.error.json`` and end the process at once (no cleanup: peers may be hung);
        ``waited``: what the rank waited for (a stuck op's group, seq and peer; a phase)."""
        try:
            write_json_atomic(
                self.work_dir / ERROR_FILE.format(rank=self.rank),
                {"rank": self.rank, "kind": kind, "message": message, "at_ns": at_ns, "waited": waited or {}},
            )
        finally:
            os._exit(EXIT_TIMEOUT if kind == "timeout" else EXIT_FAILED)


class Runner:
    """Executes one rank's ops and keeps their replayed times (local monotonic ns).

    Without a ``gpu`` queue (CPU ranks) every op runs on this thread: compute as host work, each op once
    its dependencies have completed. With one (a CUDA device), host ops and communication still run here,
    but GPU ops (``ReplayOp.gpu``) are enqueued on a stream per recorded device stream without waiting,
    and the dependencies on them, or on communication (which completes on the device), are met where the
    program met them:

    - a GPU op after GPU work of its own stream: stream order, nothing more; after GPU work of another
      stream or after communication: its stream waits for that (an event wait); after a host op: issue
      order (it comes right after the op that launched it);
    - a host op after GPU work or communication: it blocks until that is done (a host synchronisation);
    - communication after GPU work or communication: the stream it is issued from waits for that (NCCL
      orders its own stream after it); the host does not wait.

    The device's times are read once the rank's work is done (:meth:`GpuQueue.times`).
    """

    def __init__(
        self,
        *,
        rank: int,
        ops: list[ReplayOp],
        dog: Watchdog,
        issuer: CommIssuer,
        compute: Compute,
        gpu: GpuQueue | None = None,
    ) -> None:
        self.rank = rank
        self.ops = ops
        self.dog = dog
        self.issuer = issuer
        self.compute = compute
        self.gpu = gpu
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}
        self.pending: dict[int, Completion] = {}
        #: rows a later op waits for (its start, or its work as a wait node): this thread waits on them
        self.waited = {d for op in ops if op.kind != KIND_NESTED for d in (*op.deps, *op.wait_deps)}
        #: with a GPU queue, the recorded stream of each GPU op (by row)
        self.gpu_stream = {op.row: op.stream for op in ops if op.gpu} if gpu is not None else {}
        #: with a GPU queue, the token of each op whose work is on the device: GPU ops and communication
        self.device: dict[int, Any] = {}
        #: nested ops of GPU ops: timed once the device's times are read
        self._nested_late: list[ReplayOp] = []
        self.by_row = {op.row: op for op in ops}

    def _settle(self, row: int, c: Completion) -> int:
        """Wait for the asynchronous op ``c`` (watched as ``row``); returns its completion time."""
        c.wait()
        self.dog.done(row)
        if c.error:
            raise RuntimeError(f"{c.desc} failed: {c.error}")
        return c.end_ns

    def _finish(self, row: int) -> int:
        """Wait for the in-flight op at ``row``; returns its completion time."""
        c = self.pending.pop(row, None)
        if c is not None:
            self.end[row] = self._settle(row, c)
        return self.end[row]

    def warm_up(self, ops: list[ReplayOp]) -> None:
        """Issue each op and wait for it, one at a time (connection and buffer set-up)."""
        for op in ops:
            c = Completion(desc=f"warm-up: {describe(op, self.rank)}", issued_ns=time.perf_counter_ns())
            self.dog.add(-1, c)
            track(self.issuer.issue(op), c)
            self._settle(-1, c)

    def run(self, origin_ns: int, on_step_end: Callable[[], None] | None = None) -> None:
        """Execute the ops from ``origin_ns`` (local ns); ``on_step_end`` is called between steps."""
        if self.gpu is not None:
            self.gpu.begin()  # the reference for the device's times, recorded on the idle device
        step = self.ops[0].step if self.ops else -1
        for op in self.ops:
            if on_step_end is not None and op.step != step and op.step >= 0:
                step = op.step
                on_step_end()
            if op.kind == KIND_NESTED:
                if op.parent in self.device:
                    self._nested_late.append(op)
                    continue
                s = self.start.get(op.parent, origin_ns) + op.offset_ns
                self.start[op.row], self.end[op.row] = s, s + op.dur_ns
                continue
            if self.gpu is not None and op.row in self.gpu_stream:
                self._enqueue(self.gpu, op)
                continue
            if op.row in self.start:
                continue  # issued during the host op it was issued inside (``issues_inside``)
            wait_until(self._ready_at(op, origin_ns))
            if op.kind == KIND_COMPUTE:
                s = time.perf_counter_ns()
                for d in op.wait_deps:  # a wait node: blocked until the communication (or GPU work) completed
                    if d in self.pending:
                        self._finish(d)
                    if self.gpu is not None and d in self.device:
                        self._sync(self.gpu, d)
                self.start[op.row] = s  # before its work: what it issues from inside is timed from it
                self._compute(op, origin_ns)
                self.end[op.row] = time.perf_counter_ns()
                continue
            self._issue(op)
        for row in list(self.pending):
            self._finish(row)
        if self.gpu is not None:
            self._device_times(self.gpu)

    def _ready_at(self, op: ReplayOp, origin_ns: int) -> int:
        """When ``op`` starts, local ns: its dependencies' end, and for communication issued from inside a
        host op ``issue_off_ns`` after that op's start (the model's issue edge, as the simulator meets it),
        plus its gap and delay."""
        ready = origin_ns
        for d in op.deps:
            ready = max(ready, self._ready(op, d, origin_ns))
        if op.issued_in >= 0 and (began := self.start.get(op.issued_in)) is not None:
            ready = max(ready, began + op.issue_off_ns)
        return ready + op.gap_ns + op.delay_ns

    def _compute(self, op: ReplayOp, origin_ns: int) -> None:
        """``op``'s host work; the communication issued inside it (``issues_inside``, whose dependencies
        have all ended) is issued at its ready time during that work, one that is not ready before the work
        ends is left to its own turn."""
        if not op.issues_inside:
            self.compute.run(op.dur_ns)
            return
        deadline = time.perf_counter_ns() + op.dur_ns
        for row in op.issues_inside:
            inner = self.by_row[row]
            at = self._ready_at(inner, origin_ns)
            if at >= deadline:
                break
            self.compute.run(at - time.perf_counter_ns())
            self._issue(inner)
        self.compute.run(deadline - time.perf_counter_ns())

    def _issue(self, op: ReplayOp) -> None:
        """Issue communication op ``op`` now: blocking (done on return) or in flight (``pending``)."""
        if self.gpu is not None:
            for d in op.queue_deps:
                if (token := self.device.get(d)) is not None:
                    self.gpu.wait(ISSUE, token)
        s = time.perf_counter_ns()
        c = Completion(desc=describe(op, self.rank), issued_ns=s, op=op)
        self.dog.add(op.row, c)
        self.start[op.row] = s
        if op.blocking:
            self.issuer.issue(op, blocking=True)
            if self.gpu is not None:  # NCCL calls return once enqueued: done on the device
                self.device[op.row] = self.gpu.comm_done(ISSUE, None)
            self.end[op.row] = time.perf_counter_ns()
            c.event.set()
            self.dog.done(op.row)
            return
        work = self.issuer.issue(op)
        if self.gpu is not None:
            self.device[op.row] = self.gpu.comm_done(("comm", op.kind, op.pg_name, op.peer), work)
        track(work, c, (op.kind, op.pg_name), waited=op.row in self.waited)
        self.pending[op.row] = c

    def _ready(self, op: ReplayOp, d: int, origin_ns: int) -> int:
        """When dependency ``d`` lets ``op`` (a host op or communication) start, local ns. Work on the device
        is waited for there: a host op blocks until it is done (a host synchronisation; then it is ready
        now), communication is issued after its stream waits for it (the host need not wait)."""
        token = self.device.get(d)
        if token is None or self.gpu is None:
            return self._finish(d) if d in self.pending else self.end.get(d, origin_ns)
        if op.kind == KIND_COMPUTE:
            self._sync(self.gpu, d)
            return time.perf_counter_ns()
        self.gpu.wait(ISSUE, token)
        return origin_ns

    def _sync(self, gpu: GpuQueue, row: int) -> None:
        """Block until the work on the device of the op at ``row`` is done (watched)."""
        op = self.by_row[row]
        what = (
            f"rank {self.rank}: GPU op on stream {op.stream} (node {op.node_id} {op.name})"
            if op.gpu
            else describe(op, self.rank)
        )
        token = self.device[row]
        self._watched(what, lambda: gpu.sync(token))

    def _watched(self, what: str, wait: Callable[[], None]) -> None:
        """``wait()`` for work on the device, watched like an op in flight: a collective that never completes
        on the device fails the rank naming ``what`` after ``real.timeout_s``."""
        c = Completion(desc=what, issued_ns=time.perf_counter_ns())
        self.dog.add(DEVICE_WAIT, c)
        wait()
        c.event.set()
        self.dog.done(DEVICE_WAIT)

    def _enqueue(self, gpu: GpuQueue, op: ReplayOp) -> None:
        """Enqueue GPU op ``op`` on its stream after what it depends on (see the class docstring); the host
        waits only for its delay from the effects, if any."""
        for d in (*op.deps, *op.wait_deps):
            token = self.device.get(d)
            if token is not None and self.gpu_stream.get(d) != op.stream:
                gpu.wait(op.stream, token)  # another stream's work, or communication
        if op.delay_ns > 0:
            wait_until(time.perf_counter_ns() + op.delay_ns)
        self.device[op.row] = gpu.enqueue(op.stream, op.dur_ns)

    def _device_times(self, gpu: GpuQueue) -> None:
        """Once the device is done: each GPU op's times, and each communication op's end, from the device
        (communication starts at its issue on this thread); then the nested ops of GPU ops."""
        self._watched(f"rank {self.rank}: the work left on the device at the end", gpu.finish)
        for row, token in self.device.items():
            s, e = gpu.times(token)
            if row in self.gpu_stream:
                self.start[row], self.end[row] = s, e
            else:
                self.end[row] = max(self.start[row], e)
        for op in self._nested_late:
            s = self.start[op.parent] + op.offset_ns
            self.start[op.row], self.end[op.row] = s, s + op.dur_ns


def _create_groups(meta: PlanMeta, rank: int) -> dict[str, Any]:
    """Re-create the recorded groups, in the recorded order, on every rank (members or not; one the program
    made with ``use_local_synchronization=True`` on its members only, so), each with its ranks in the
    recorded group-rank order (a group the program made with ``sort_ranks=False``: an all_to_all's split
    lists follow it)."""
    groups: dict[str, Any] = {}
    for g in meta.groups:
        if g.local and rank not in g.ranks:
            continue  # made by its members alone, as the program made it
        _number_next(g.name)
        ranks = list(g.ranks)
        pg = dist.new_group(
            ranks, group_desc=g.desc, sort_ranks=ranks == sorted(ranks), use_local_synchronization=g.local
        )
        if rank in g.ranks:
            groups[g.name] = (pg, g.ranks)
    return groups


def _number_next(name: str) -> None:
    """Have torch number the next group it makes ``name`` where that is a number ahead of its counter: the
    program made groups the run does not list (destroyed before the window), whose numbers the replay
    would otherwise give the groups after them. Every rank skips the same numbers, as it re-creates the
    same groups."""
    world = getattr(dist.distributed_c10d, "_world", None)
    count = getattr(world, "group_count", None)
    if name.isdecimal() and isinstance(count, int) and count < int(name):
        world.group_count = int(name)  # type: ignore[union-attr]


def _profiler(meta: PlanMeta) -> AbstractContextManager[Any]:
    """The profiler's capture of the replay (collectives level): a pre-roll step, then every replayed step."""
    from skewlens.profiler.capture import capture
    from skewlens.profiler.manifest import StepWindow

    window = StepWindow(wait=1, warmup=0, active=max(1, meta.capture_steps) + 1)
    return capture(meta.capture_run, level="collectives", steps=window, merge_timeout_s=meta.timeout_s)


def _device(meta: PlanMeta) -> torch.device:
    if meta.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _write_trace(meta: PlanMeta, rank: int, runner: Runner, to_replay_ns: Any) -> None:
    """Write the original nodes (same ids, attributes, dependencies) with their replayed times."""
    src = meta.source_files.get(rank) or rank_file(meta.source_run, rank)
    with EtWriter(
        rank_file(meta.out_run, rank), {"rank": rank, "world_size": meta.world_size, "source": "replay"}
    ) as w:
        for row, (_off, node) in enumerate(iter_nodes(src)):
            if row in runner.start:
                s = to_replay_ns(runner.start[row])
                e = max(s, to_replay_ns(runner.end[row]))
                node.start_time_micros = max(s, 0) // 1000
                node.duration_micros = (e - s) // 1000
                for a in node.attr:
                    if a.name == Attr.START_NS:
                        a.int64_val = s
                    elif a.name == Attr.DUR_NS:
                        a.int64_val = e - s
            w.write(node)


def _cores(world_size: int) -> float:
    """This rank's cores (:func:`~skewlens.replay.real.ops.cores_per_rank`), from every rank's host name and
    affinity mask (one all-gather on the default group; the masks are plain lists of ints)."""
    mine = (socket.gethostname(), sorted(host_cores()))
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return cores_per_rank(mine[1], [mask for host, mask in everyone if host == mine[0]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="skewlens real-replay worker (started by torchrun)")
    p.add_argument("--plan", required=True, type=Path, help="plan directory written by real_replay")
    args = p.parse_args(argv)
    rank = int(os.environ["RANK"])
    # completion callbacks and waiter threads need the GIL while the main thread busy-loops: hand it over
    # often, so completion times are taken when the op completes, not when the compute loop yields
    sys.setswitchinterval(GIL_SWITCH_S)
    meta = read_meta(args.plan)
    work_dir = Path(meta.work_dir)
    dog = Watchdog(rank, work_dir, meta.timeout_s)
    dog.start()
    phase = dog.reached(WorkerPhase.START_UP)
    try:
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if world != meta.world_size:
            raise RuntimeError(
                f"the launcher started {world} processes, the trace has {meta.world_size} ranks"
            )
        warmup, ops = read_rank_plan(args.plan, rank)
        device = _device(meta)
        phase = dog.reached(WorkerPhase.INIT_PROCESS_GROUP)
        dist.init_process_group(meta.backend, timeout=timedelta(seconds=meta.timeout_s * 2 + SETUP_GRACE_S))
        phase = dog.reached(WorkerPhase.CORE_COUNTS)
        cores = _cores(meta.world_size)
        phase = dog.reached(WorkerPhase.GROUP_CREATION)
        groups = _create_groups(meta, rank)
        runner = Runner(
            rank=rank,
            ops=ops,
            dog=dog,
            issuer=CommIssuer(rank, device, groups, meta.default_pg),
            compute=Compute(meta.compute, cores),
            gpu=CudaQueue(device) if device.type == "cuda" else None,
        )
        phase = dog.reached(WorkerPhase.WARM_UP)
        runner.warm_up(warmup)
        phase = dog.reached(WorkerPhase.CLOCK_ALIGNMENT)
        offset = clock.estimate_offset_ns(rank, meta.world_size, device)
        with ExitStack() as stack:
            session = None
            if meta.capture_run:
                # the profiler records a pre-roll step (its own start-up, the common start's broadcast and
                # the wait for it), then one step per replayed step; the parent drops the pre-roll. It
                # starts before the common start is set: a start-up longer than the lead made every rank
                # begin late, and the first replayed step took the delay (1 s: 229 -> 1,057 ms)
                phase = dog.reached(WorkerPhase.PROFILER_START_UP)
                session = stack.enter_context(_profiler(meta))
                session.step()
            phase = dog.reached(WorkerPhase.COMMON_START)
            t0 = clock.common_start_ns(rank, offset, device)
            origin = t0 + meta.origin_ns.get(rank, 0)
            if session is not None:
                wait_until(origin)
                session.step()
            phase = dog.reached(WorkerPhase.REPLAY)
            dog.set_phase(phase, None)
            runner.run(origin, session.step if session is not None else None)
            phase = dog.reached(WorkerPhase.PROFILER_SAVE)
            dog.set_phase(phase, meta.timeout_s + SETUP_GRACE_S)
            if session is not None:
                session.step()
        phase = dog.reached(WorkerPhase.WRITING_TRACE)
        _write_trace(meta, rank, runner, lambda t: t - t0 + meta.first_start_ns)
        gpu = ""  # the GPU it replayed on, as a capture says it
        if device.type == "cuda" and device.index is not None:
            from skewlens.profiler.capture import cuda_gpu

            gpu = cuda_gpu(torch, device.index)
        write_json_atomic(
            work_dir / RESULT_FILE.format(rank=rank),
            {
                "rank": rank,
                "host": socket.gethostname(),
                "device": str(device),
                **({"gpu": gpu} if gpu else {}),
                "clock_offset_ns": offset,
            },
        )
        phase = dog.reached(WorkerPhase.SHUTDOWN)
        dog.set_phase(phase, meta.timeout_s + SETUP_GRACE_S)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:
        dog.abort("failed", f"rank {rank}: {phase}: {type(e).__name__}: {e}", time.perf_counter_ns())
    dog.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
