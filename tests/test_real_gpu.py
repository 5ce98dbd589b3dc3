"""Real replay on a CUDA device, without one: the plan says which ops are GPU work, and the worker's ordering
(what is enqueued on which stream, what waits for what, what the host synchronises on) is checked against a
fake GPU queue that records the calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.importers import import_traces
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth_gpu import COMPUTE_STREAM, GpuRunSpec, write_gpu_run
from skewlens.replay.driver import load_trace
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.execution import execution_model
from skewlens.replay.real.gpu import ISSUE
from skewlens.replay.real.ops import wait_until
from skewlens.replay.real.plan import (
    KIND_COLL,
    KIND_COMPUTE,
    KIND_NESTED,
    ReplayOp,
    rank_plan,
    read_rank_plan,
    write_plan,
)
from skewlens.replay.real.worker import Runner, Watchdog

Log = list[tuple[Any, ...]]
MS = 1_000_000


class FakeGpu:
    """Records the calls a CUDA worker makes; token ``k`` is the ``k``-th enqueued or completed work, which
    ran from ``base + 1000 k`` to ``base + 1000 k + 500`` (a communication op's completion: at
    ``base + 1000 k``); ``base`` is a second after :meth:`begin` (after every host time of these tests)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.tokens = 0
        self.finished = False
        self.base = 0

    def _token(self) -> int:
        self.tokens += 1
        return self.tokens

    def begin(self) -> None:
        self.base = time.perf_counter_ns() + 1_000_000_000
        self.log.append(("begin",))

    def enqueue(self, stream: Hashable, dur_ns: int) -> int:
        t = self._token()
        self.log.append(("enqueue", stream, dur_ns, t))
        return t

    def wait(self, stream: Hashable, token: int) -> None:
        self.log.append(("wait", stream, token))

    def comm_done(self, stream: Hashable, work: Any) -> int:
        t = -self._token()
        self.log.append(("comm_done", ISSUE if work is None else "own stream", t))
        return t

    def sync(self, token: int) -> None:
        self.log.append(("sync", token))

    def finish(self) -> None:
        self.finished = True
        self.log.append(("finish",))

    def times(self, token: int) -> tuple[int, int]:
        assert self.finished, "device times read before the device was done"
        at = self.base + 1000 * abs(token)
        return (at, at) if token < 0 else (at, at + 500)


class FakeCompute:
    def __init__(self, log: Log) -> None:
        self.log = log

    def run(self, dur_ns: int) -> None:
        self.log.append(("host", dur_ns))


class FakeFuture:
    def add_done_callback(self, cb: Callable[[FakeFuture], None]) -> None:
        cb(self)

    def value(self) -> None:
        return None


class FakeWork:
    def get_future(self) -> FakeFuture:
        return FakeFuture()


class FakeIssuer:
    def __init__(self, log: Log) -> None:
        self.log = log

    def issue(self, op: ReplayOp, *, blocking: bool = False) -> FakeWork | None:
        self.log.append(("issue", op.row, "blocking" if blocking else "async"))
        return None if blocking else FakeWork()


def _runner(ops: list[ReplayOp], tmp_path: Path, *, gpu: bool = True) -> tuple[Runner, Log, int]:
    """A runner of ``ops`` with fakes, run from now; returns it, the log of its calls and the fake device's
    time base (see :class:`FakeGpu`)."""
    log: Log = []
    fake = FakeGpu(log)
    runner = Runner(
        rank=0,
        ops=ops,
        dog=Watchdog(0, tmp_path, 10.0),
        issuer=FakeIssuer(log),  # type: ignore[arg-type]
        compute=FakeCompute(log),  # type: ignore[arg-type]
        gpu=fake if gpu else None,
    )
    runner.run(time.perf_counter_ns())
    return runner, log, fake.base


def _op(row: int, **kw: Any) -> ReplayOp:
    base: dict[str, Any] = {
        "row": row,
        "node_id": row,
        "name": f"n{row}",
        "kind": KIND_COMPUTE,
        "step": 0,
        "dur_ns": 100 * (row + 1),
        "deps": (),
        "gap_ns": 0,
        "delay_ns": 0,
    }
    return ReplayOp(**{**base, **kw})


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> RunTrace:
    """2 ranks of the synthetic DDP-like GPU run, one step of 2 layers, with CUDA sync events: host ops
    launch kernels on the compute stream, an NCCL all_reduce waits for the backward's last kernel and
    the optimizer's first kernel for it (event waits), and ``aten::item`` synchronises on a copy."""
    d = tmp_path_factory.mktemp("gpu")
    write_gpu_run(GpuRunSpec(world_size=2, steps=1, layers=2, sync_events=True, seed=1), d / "kineto")
    import_traces(sorted((d / "kineto").glob("*.json.gz")), None, d / "run")
    return load_trace(d / "run")


def test_the_plan_marks_gpu_work_with_its_recorded_stream_and_host_work_as_host_work(
    gpu_run: RunTrace,
) -> None:
    rt = gpu_run.ranks[0]
    ops = rank_plan(rt, gpu_run, NO_EFFECTS)
    for op in ops:
        on_gpu = not bool(rt.is_cpu[op.row])
        assert op.gpu is (on_gpu and op.kind == KIND_COMPUTE), op
        assert op.stream == (int(rt.stream[op.row]) if op.gpu else -1), op
    assert {op.stream for op in ops if op.gpu} == {COMPUTE_STREAM}
    assert sum(op.gpu for op in ops) == 7 and sum(not op.gpu and op.kind == KIND_COMPUTE for op in ops) == 8


def test_each_launched_kernel_comes_right_after_the_host_op_that_launched_it(gpu_run: RunTrace) -> None:
    # the host ops run ahead of the GPU (the device is still on the first layer while the host launches
    # the backward's): in recorded start order the kernels came after all of them, so a worker enqueued
    # each one late, where the recording showed it starting, not where the program launched it
    rt = gpu_run.ranks[0]
    m = execution_model(gpu_run).ranks[0]
    ops = rank_plan(rt, gpu_run, NO_EFFECTS)
    place = {op.row: k for k, op in enumerate(ops)}
    launches = list(zip(m.launch_src.tolist(), m.launch_dst.tolist(), strict=True))
    waiting = set(m.wait_dst.tolist())
    # the 7 kernels, and the copy ``aten::item`` launches and then waits for: it comes right before it
    assert len(launches) == 8
    assert [rt.name(s) for s, _d in launches if s in waiting] == ["aten::item"]
    for src, dst in launches:
        assert place[dst] == place[src] + (-1 if src in waiting else 1), (rt.name(src), rt.name(dst))


def test_the_plan_keeps_its_gpu_fields_through_its_json_file(gpu_run: RunTrace, tmp_path: Path) -> None:
    from skewlens.replay.real.plan import PlanMeta

    ops = rank_plan(gpu_run.ranks[0], gpu_run, NO_EFFECTS)
    meta = PlanMeta(
        world_size=2,
        backend="nccl",
        timeout_s=10.0,
        compute="auto",
        default_pg="0",
        groups=(),
        origin_ns={0: 0},
        first_start_ns=0,
        source_run="",
        out_run="",
        work_dir="",
    )
    write_plan(tmp_path, meta, {0: ops}, {})
    assert read_rank_plan(tmp_path, 0)[1] == ops


def test_a_gpu_rank_enqueues_kernels_without_waiting_and_meets_event_waits_and_syncs_where_recorded(
    gpu_run: RunTrace, tmp_path: Path
) -> None:
    rt = gpu_run.ranks[0]
    ops = rank_plan(rt, gpu_run, NO_EFFECTS)
    _, log, _ = _runner(ops, tmp_path)
    names = {op.row: rt.name(op.row) for op in ops}
    gpu_rows = [op.row for op in ops if op.gpu]
    host_durs = [op.dur_ns for op in ops if op.kind == KIND_COMPUTE and not op.gpu]
    tokens = {e[3]: row for e, row in zip([e for e in log if e[0] == "enqueue"], gpu_rows, strict=True)}
    (coll,) = [op for op in ops if op.kind == KIND_COLL]
    readable = []
    for e in log:
        if e[0] == "enqueue":
            readable.append(("enqueue", e[1], names[tokens[e[3]]]))
        elif e[0] in ("wait", "sync"):
            readable.append((e[0], *e[1:-1], names[tokens[e[-1]]] if e[-1] > 0 else "all_reduce"))
        elif e[0] == "issue":
            readable.append(("issue", names[e[1]]))
        else:
            readable.append(e[:2] if e[0] == "comm_done" else e)
    nn, nt = "ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nt"
    gemm_tn, gemm_nt = (n for n in (names[r] for r in gpu_rows) if n.startswith("sm90"))
    opt1, opt2 = (names[r] for r in gpu_rows if names[r].startswith("void at::native"))
    copy = "Memcpy DtoH (Device -> Pageable)"
    assert readable == [
        ("begin",),
        ("host", host_durs[0]),  # aten::addmm
        ("enqueue", COMPUTE_STREAM, gemm_tn),  # launched by it, not waited for
        ("host", host_durs[1]),  # aten::mm
        ("enqueue", COMPUTE_STREAM, nn),
        ("host", host_durs[2]),
        ("enqueue", COMPUTE_STREAM, nt),
        ("host", host_durs[3]),
        ("enqueue", COMPUTE_STREAM, gemm_nt),
        ("host", host_durs[4]),  # c10d::allreduce_
        # NCCL's kernel waited for the backward's last one (an event wait): the issuing stream waits
        ("wait", ISSUE, gemm_nt),
        ("issue", coll.name),
        ("comm_done", "own stream"),
        ("host", host_durs[5]),  # aten::_foreach_add_
        ("wait", COMPUTE_STREAM, "all_reduce"),  # the optimizer's kernel waits for the all_reduce
        ("enqueue", COMPUTE_STREAM, opt1),
        ("host", host_durs[6]),
        ("enqueue", COMPUTE_STREAM, opt2),
        ("enqueue", COMPUTE_STREAM, copy),  # aten::item's copy (launched inside the op that syncs)
        ("sync", copy),  # aten::item blocks until its copy is done: the host synchronisation
        ("host", host_durs[7]),
        ("finish",),
    ]
    # no host op became GPU work, and no GPU op ran on the host
    assert len(host_durs) == 8 and sum(e[0] == "host" for e in log) == 8


def test_a_gpu_op_waits_for_another_streams_work_but_not_its_own_streams(tmp_path: Path) -> None:
    ops = [
        _op(0),  # host: launches 1 and 2
        _op(1, gpu=True, stream=7, deps=()),
        _op(2, gpu=True, stream=7, deps=(1,)),  # stream order
        _op(3, gpu=True, stream=9, deps=(1,)),  # event wait on stream 7's work
        _op(4, deps=(0, 3)),  # host op depending on GPU work: synchronises on it
        _op(5, gpu=True, stream=9, deps=(3, 2)),  # stream order on 9, event wait on 7
        _op(6, kind=KIND_NESTED, parent=5, offset_ns=100, dur_ns=50, deps=()),
    ]
    runner, log, base = _runner(ops, tmp_path)
    assert log == [
        ("begin",),
        ("host", 100),
        ("enqueue", 7, 200, 1),
        ("enqueue", 7, 300, 2),
        ("wait", 9, 1),
        ("enqueue", 9, 400, 3),
        ("sync", 3),
        ("host", 500),
        ("wait", 9, 2),
        ("enqueue", 9, 600, 4),
        ("finish",),
    ]
    # the GPU ops' times are the device's, read after it was done; a nested op follows its GPU parent
    assert [(runner.start[r] - base, runner.end[r] - base) for r in (1, 2, 3, 5)] == [
        (1000, 1500),
        (2000, 2500),
        (3000, 3500),
        (4000, 4500),
    ]
    assert (runner.start[6] - base, runner.end[6] - base) == (4100, 4150)


def test_communication_after_gpu_work_is_ordered_on_the_device_and_ends_when_the_device_says(
    tmp_path: Path,
) -> None:
    ops = [
        _op(0, gpu=True, stream=7),
        _op(1, kind=KIND_COLL, comm_type=0, dur_ns=0, deps=(0,), blocking=True),
        _op(2, kind=KIND_COLL, comm_type=0, dur_ns=0, queue_deps=(0,)),
        _op(3, gpu=True, stream=7, deps=(0, 1)),
        _op(4, wait_deps=(2,)),  # a wait node: blocked until the collective completed on the device
    ]
    runner, log, base = _runner(ops, tmp_path)
    assert log == [
        ("begin",),
        ("enqueue", 7, 100, 1),
        ("wait", ISSUE, 1),  # the blocking collective's stream waits for the kernel; the host does not
        ("issue", 1, "blocking"),
        ("comm_done", ISSUE, -2),
        ("wait", ISSUE, 1),  # a queue edge (NCCL's stream waited for the kernel)
        ("issue", 2, "async"),
        ("comm_done", "own stream", -3),
        ("wait", 7, -2),  # the kernel after the collective waits for it on the device
        ("enqueue", 7, 400, 4),
        ("sync", -3),
        ("host", 500),
        ("finish",),
    ]
    # issued on the host, done when the device says
    assert runner.start[1] < base and (runner.end[1] - base, runner.end[2] - base) == (2000, 3000)


def test_without_a_gpu_queue_gpu_ops_run_as_host_work_as_before(tmp_path: Path) -> None:
    ops = [_op(0), _op(1, gpu=True, stream=7, deps=(0,)), _op(2, deps=(1,))]
    _, log, _ = _runner(ops, tmp_path, gpu=False)
    assert log == [("host", 100), ("host", 200), ("host", 300)]


class _FakeCuda:
    """The part of ``torch.cuda`` the CUDA queue calls, recording each call; an event's time is the number
    of calls made before its record, in ms (so ``elapsed_time`` differences are whole ms)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.current = "default"
        outer = self

        class Stream:
            made = 0

            def __init__(self, device: Any = None, name: str = "") -> None:
                if not name:
                    Stream.made += 1
                self.name = name or f"s{Stream.made}"

            def wait_event(self, event: Any) -> None:
                outer.calls.append(("wait_event", self.name, event.name))

        class Event:
            made = 0

            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                Event.made += 1
                self.name = f"e{Event.made}"
                self.at_ms = -1.0

            def record(self, stream: Any = None) -> None:
                on = outer.current if stream is None else getattr(stream, "name", stream)
                self.at_ms = float(len(outer.calls))
                outer.calls.append(("record", self.name, on))

            def synchronize(self) -> None:
                outer.calls.append(("event_sync", self.name))

            def elapsed_time(self, end: Any) -> float:
                return float(end.at_ms - self.at_ms)

        class StreamContext:
            def __init__(self, s: Any) -> None:
                self.s = s

            def __enter__(self) -> None:
                self.prev, outer.current = outer.current, self.s.name

            def __exit__(self, *exc: object) -> None:
                outer.current = self.prev

        self.Stream = Stream
        self.Event = Event
        self.stream = StreamContext

    def current_stream(self, device: Any = None) -> Any:
        return self.Stream(name=self.current)

    def _sleep(self, cycles: int) -> None:
        self.calls.append(("sleep", self.current, cycles))

    def synchronize(self, device: Any = None) -> None:
        self.calls.append(("device_sync",))


def test_the_cuda_queue_sleeps_on_the_ops_stream_between_timing_events_and_times_them_from_one_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from skewlens.replay.real import gpu

    fake = _FakeCuda()
    monkeypatch.setattr(gpu, "torch", SimpleNamespace(cuda=fake))
    monkeypatch.setattr(gpu, "_calibrate", lambda device: 2.0)  # cycles per ns
    q = gpu.CudaQueue("cuda:0")  # type: ignore[arg-type]

    class Work:
        def wait(self) -> None:
            fake.calls.append(("work_wait", fake.current))

    q.begin()
    a = q.enqueue(7, 1_000)
    q.wait(9, a)
    b = q.enqueue(9, 10)
    q.wait(ISSUE, b)
    c = q.comm_done(ISSUE, None)
    d = q.comm_done(("comm", "coll", "0", -1), Work())
    q.sync(d)
    q.finish()
    assert fake.calls == [
        ("device_sync",),
        ("record", "e1", "default"),  # the reference, on the idle device
        ("event_sync", "e1"),
        ("record", "e2", "s1"),  # stream 7's, made on first use
        ("sleep", "s1", 2_000),
        ("record", "e3", "s1"),
        ("wait_event", "s2", "e3"),  # stream 9 waits for stream 7's op to end
        ("record", "e4", "s2"),
        ("sleep", "s2", 20),
        ("record", "e5", "s2"),
        ("wait_event", "default", "e5"),  # where communication is issued from
        ("record", "e6", "default"),  # a blocking call's completion: the issuing stream waits already
        ("work_wait", "s3"),  # an asynchronous one's: its Work waited for on a stream of its own
        ("record", "e7", "s3"),
        ("event_sync", "e7"),
        ("device_sync",),
    ]
    ref = q.times((q._ref, q._ref))[0]
    # each event's time is the reference's plus its elapsed_time from it (ms) in ns
    assert [q.times(t) for t in (a, b, c, d)] == [
        (ref + 2_000_000, ref + 4_000_000),  # e2, e3: 2 and 4 calls after the reference
        (ref + 6_000_000, ref + 8_000_000),
        (ref + 10_000_000, ref + 10_000_000),
        (ref + 12_000_000, ref + 12_000_000),
    ]


def test_a_host_wait_for_work_on_the_device_is_watched_naming_the_op(tmp_path: Path) -> None:
    # a blocking collective's call returns once enqueued: a collective that never completes on the device
    # keeps the host waiting where it synchronises on it, or at the end, and the watchdog names it there
    ops = [
        _op(0, kind=KIND_COLL, comm_type=0, dur_ns=0, pg_name="0", seq=3, blocking=True, name="allreduce"),
        _op(1, gpu=True, stream=7, name="gemm", node_id=41),
        _op(2, wait_deps=(0,)),
        _op(3, deps=(1,)),
    ]
    watched: list[list[str]] = []
    log: Log = []
    dog = Watchdog(0, tmp_path, 10.0)

    class Watching(FakeGpu):
        def _note(self) -> None:
            watched.append([c.desc for c in dog.inflight.values() if not c.done()])

        def sync(self, token: int) -> None:
            self._note()
            super().sync(token)

        def finish(self) -> None:
            self._note()
            super().finish()

    runner = Runner(
        rank=0,
        ops=ops,
        dog=dog,
        issuer=FakeIssuer(log),  # type: ignore[arg-type]
        compute=FakeCompute(log),  # type: ignore[arg-type]
        gpu=Watching(log),
    )
    runner.run(time.perf_counter_ns())
    assert watched == [
        ["rank 0: all_reduce on group '0' seq 3 (node 0 allreduce)"],
        ["rank 0: GPU op on stream 7 (node 41 gemm)"],
        ["rank 0: the work left on the device at the end"],
    ]
    assert not [c for c in dog.inflight.values() if not c.done()]


def test_communication_issued_inside_a_host_op_is_issued_once_at_its_ready_time_during_the_ops_work(
    tmp_path: Path,
) -> None:
    # a 20 ms host op the all_gather was issued 4 ms into (ready 4 ms after the rank began): the worker runs
    # the op's work up to then, issues it, runs the rest, and does not issue it again at its own turn
    ops = [
        _op(0, dur_ns=20 * MS, issues_inside=(1,)),
        _op(1, kind=KIND_COLL, comm_type=0, gap_ns=4 * MS, pg_name="0", dur_ns=0),
        _op(2, wait_deps=(1,)),
    ]
    _, log, _ = _runner(ops, tmp_path, gpu=False)
    assert [e[0] for e in log] == ["host", "issue", "host", "host"]
    (_, before), (_, after) = log[0], log[2]
    assert (log[1], log[3]) == (("issue", 1, "async"), ("host", 300))
    # the fake compute takes no time: the rest runs to the op's end, 20 ms after it began
    assert before <= 4 * MS < after <= 20 * MS  # (before: less by the time the runner took to get there)


class SlowIssuer(FakeIssuer):
    """A :class:`FakeIssuer` whose every issue takes ``issue_ns`` (the worker's Python call into the backend:
    a median 0.14-0.26 ms per asynchronous gloo all_reduce inside a replay on a loaded 2-core machine)."""

    def __init__(self, log: Log, issue_ns: int) -> None:
        super().__init__(log)
        self.issue_ns = issue_ns

    def issue(self, op: ReplayOp, *, blocking: bool = False) -> FakeWork | None:
        until = time.perf_counter_ns() + self.issue_ns
        while time.perf_counter_ns() < until:
            pass
        return super().issue(op, blocking=blocking)


class TimedCompute(FakeCompute):
    """A :class:`FakeCompute` that also takes the time asked of it (so the op's replayed times are real)."""

    def run(self, dur_ns: int) -> None:
        super().run(dur_ns)
        wait_until(time.perf_counter_ns() + dur_ns)


@pytest.mark.parametrize(("dur_ms", "issue_ms"), [(20, 6), (5, 3)])
def test_the_time_an_issue_inside_a_host_op_takes_comes_out_of_the_rest_of_the_op_not_on_top_of_it(
    tmp_path: Path, dur_ms: int, issue_ms: int
) -> None:
    # DDP's bucket all_reduce issued 4 ms into an AccumulateGrad op: the worker's issue (its Python call)
    # took issue_ms. The op's work after the issue is what is left of its recorded duration, so the op ends
    # at its recorded end where the issue fits in it (20 ms op), and at the issue's end where it does not
    # (5 ms op: 2 ms late, the issue's cost beyond the 1 ms left): its work is never counted twice
    ops = [
        _op(0, dur_ns=dur_ms * MS, issues_inside=(1,)),
        _op(1, kind=KIND_COLL, comm_type=0, issued_in=0, issue_off_ns=4 * MS, pg_name="0", dur_ns=0),
        _op(2, wait_deps=(1,)),
    ]
    log: Log = []
    runner = Runner(
        rank=0,
        ops=ops,
        dog=Watchdog(0, tmp_path, 10.0),
        issuer=SlowIssuer(log, issue_ms * MS),  # type: ignore[arg-type]
        compute=TimedCompute(log),  # type: ignore[arg-type]
    )
    runner.run(time.perf_counter_ns())
    assert [e[0] for e in log] == ["host", "issue", "host", "host"]
    before, after = log[0][1], log[2][1]
    assert before <= 4 * MS
    # the work asked for after the issue: what is left of the op once the issue returned (not the 16 ms or
    # 1 ms left after the issue's start; 1 ms for the runner's own steps on a loaded machine); no upper
    # bound on the op's span, which a loaded machine stretches
    assert after <= (dur_ms - 4 - issue_ms + 1) * MS
    assert runner.end[0] - runner.start[0] >= max(dur_ms, 4 + issue_ms) * MS


def test_communication_issued_inside_a_host_op_after_one_not_ready_before_its_end_waits_for_its_own_turn(
    tmp_path: Path,
) -> None:
    # the first all_gather issued inside the 20 ms op is ready only at 21 ms: it and the one after it (ready
    # at 2 ms) are issued in their own turn after the op, in order, never the second before the first
    ops = [
        _op(0, dur_ns=20 * MS, issues_inside=(1, 2)),
        _op(1, kind=KIND_COLL, comm_type=0, gap_ns=21 * MS, pg_name="0", dur_ns=0),
        _op(2, kind=KIND_COLL, comm_type=0, gap_ns=2 * MS, pg_name="0", dur_ns=0),
        _op(3, wait_deps=(1, 2)),
    ]
    _, log, _ = _runner(ops, tmp_path, gpu=False)
    assert [e[:2] for e in log] == [("host", log[0][1]), ("issue", 1), ("issue", 2), ("host", 400)]
    assert log[0][1] <= 20 * MS
