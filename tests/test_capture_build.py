"""Capture records -> Chakra nodes (pure), including the CUDA/NCCL path on synthetic Kineto-like events."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.capture.build import (
    COMM_STREAM_BASE,
    CUDA_STREAM_BASE,
    GAP_NAME,
    UNTRACED_NAME,
    HostOpInfo,
    RankCapture,
    build_nodes,
    comm_on_host,
    reused_ids_note,
)
from skewlens.profiler.capture.hostet import parse_host_et
from skewlens.profiler.capture.kineto import op_records, rf_ids_from_chrome_trace
from skewlens.profiler.capture.records import END_UNKNOWN, CommRecord, OpRecord, StepRecord, WaitRecord
from skewlens.profiler.capture.waits import WORK_WAIT_NAME
from skewlens.profiler.chakra_io import TraceNode
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.store.load import parse_pg_init
from skewlens.profiler.vocab import Attr, CommType, NodeType, names_nccl_kernel

MAIN = 111
GROUPS = [ProcessGroupInfo(name="0", ranks=(0, 1), desc="default_pg", backend="cpu:gloo")]


def coll(
    start: int, end: int, *, seq: int, is_async: bool = False, issue_end: int | None = None, step: int = 0
) -> CommRecord:
    return CommRecord(
        node_type=NodeType.COMM_COLL,
        op="c10d::allreduce_",
        comm_type=CommType.ALL_REDUCE,
        pg_name="0",
        seq=seq,
        src=-1,
        dst=-1,
        tag=0,
        numel=256,
        dtype="float32",
        size_bytes=1024,
        start_ns=start,
        issue_end_ns=issue_end if issue_end is not None else end,
        end_ns=end,
        is_async=is_async,
        thread=MAIN,
        step=step,
    )


def host_op(name: str, start_ns: int, dur_ns: int, *, thread: int = MAIN) -> OpRecord:
    return OpRecord(name=name, start_ns=start_ns, dur_ns=dur_ns, thread=thread, is_cpu=True)


def one_step(comms: list[CommRecord], **more: Any) -> RankCapture:
    """Rank 0's capture of one step, 0-60 µs, on the main thread: ``comms`` and ``more`` of its fields."""
    steps = [StepRecord(step=0, start_ns=0, end_ns=60_000)]
    return RankCapture(rank=0, comms=comms, steps=steps, groups=GROUPS, main_thread=MAIN, **more)


def by_name(nodes: list[TraceNode], name: str) -> list[TraceNode]:
    return [n for n in nodes if n.name == name]


def test_time_between_blocking_collectives_becomes_compute_nodes_on_the_aligned_clock() -> None:
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 20_000, seq=0), coll(50_000, 55_000, seq=1)],
        steps=[StepRecord(step=0, start_ns=0, end_ns=60_000)],
        groups=GROUPS,
        main_thread=MAIN,
        offset_ns=1_000_000,
    )
    nodes = build_nodes(cap)
    assert nodes[0].node_type == NodeType.METADATA
    gaps = by_name(nodes, GAP_NAME)
    assert [(g.start_ns - 1_000_000, g.dur_ns) for g in gaps] == [
        (0, 10_000),
        (20_000, 30_000),
        (55_000, 5_000),
    ]
    comms = by_name(nodes, "c10d::allreduce_")
    assert [(c.start_ns - 1_000_000, c.dur_ns, c.attrs[Attr.SEQ]) for c in comms] == [
        (10_000, 10_000, 0),
        (50_000, 5_000, 1),
    ]
    # program order: each node depends on the previous one of the thread
    ordered = sorted(nodes[1:], key=lambda n: n.start_ns)
    for prev, cur in itertools.pairwise(ordered):
        assert cur.ctrl_deps == (prev.node_id,)


def test_an_async_collective_runs_on_its_group_stream_and_is_awaited_by_the_first_later_node() -> None:
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 40_000, seq=0, is_async=True, issue_end=11_000), coll(50_000, 52_000, seq=1)],
        steps=[StepRecord(step=0, start_ns=0, end_ns=60_000)],
        groups=GROUPS,
        main_thread=MAIN,
    )
    nodes = build_nodes(cap)
    async_node, sync_node = by_name(nodes, "c10d::allreduce_")
    assert async_node.attrs[Attr.STREAM] == COMM_STREAM_BASE and async_node.dur_ns == 30_000
    assert sync_node.attrs[Attr.STREAM] == 0
    issuer = next(n for n in nodes if n.name == GAP_NAME and n.start_ns == 0)
    assert issuer.node_id in async_node.ctrl_deps
    waiter = next(n for n in nodes if n.name == GAP_NAME and n.start_ns == 11_000)
    assert async_node.node_id not in waiter.ctrl_deps  # started before the all_reduce completed
    assert async_node.node_id in sync_node.ctrl_deps  # first node of the thread after completion


def test_a_collective_still_running_when_the_window_ended_is_a_node_without_an_end() -> None:
    # an async all_reduce the program waited for after the window's last step (CommHooks.flush keeps it with
    # END_UNKNOWN): a node of duration 0 at its issue end, which skewlens check reports as without an end.
    # Before, it spanned its issue time and so seemed done 0.2 ms after it began, while its peer began it
    # 20 ms later (check: "clocks disagree ... rank 0 done 19.8 ms before rank 1 began")
    running = replace(coll(50_000, END_UNKNOWN, seq=1, is_async=True, issue_end=50_200), end_ns=END_UNKNOWN)
    cap = one_step([coll(10_000, 12_000, seq=0), running])
    blocking, still = by_name(build_nodes(cap), "c10d::allreduce_")
    assert (blocking.start_ns, blocking.dur_ns) == (10_000, 2_000)
    assert (still.start_ns, still.dur_ns, still.attrs[Attr.SEQ]) == (50_200, 0, 1)


def test_an_isend_or_irecv_no_wait_in_the_window_ended_is_a_node_without_an_end() -> None:
    # gloo's send/recv Works have no future: a wait on them gives their end. One issued in the window's last
    # step and waited for after it (double buffering: step k waits for step k-1's exchange) kept its issue
    # time as if it had completed when its call returned, so a recv seemed done before its peer's send
    # began: on 2 gloo ranks, check warned "clocks disagree ... rank 0 done 54.1 ms before rank 1 began"
    # on one host. Now it is the collective's no-end node: duration 0 at its issue end, and counted
    running = replace(coll(50_000, END_UNKNOWN, seq=1, is_async=True, issue_end=50_200), end_ns=END_UNKNOWN)
    isend = replace(running, node_type=NodeType.COMM_SEND, op="c10d::send", comm_type=None, dst=1, seq=-1)
    irecv = replace(
        running, node_type=NodeType.COMM_RECV, op="c10d::recv_", comm_type=None, src=1, seq=-1,
        start_ns=50_300, issue_end_ns=50_400,
    )  # fmt: skip
    unended: list[int] = []
    nodes = build_nodes(one_step([coll(10_000, 12_000, seq=0), isend, irecv]), unended=unended)
    (send,), (recv,) = by_name(nodes, "c10d::send"), by_name(nodes, "c10d::recv_")
    assert [(n.start_ns, n.dur_ns) for n in (send, recv)] == [(50_200, 0), (50_400, 0)]
    assert unended == [2]
    # one the window's wait returned from ends there, and is not counted
    wait = WaitRecord(
        name=WORK_WAIT_NAME, start_ns=52_000, end_ns=55_000, thread=MAIN, ident=1, step=0,
        issue_start_ns=50_000, issue_thread=MAIN,
    )  # fmt: skip
    unended = []
    nodes = build_nodes(one_step([coll(10_000, 12_000, seq=0), isend, irecv], waits=[wait]), unended=unended)
    (send,), (recv,) = by_name(nodes, "c10d::send"), by_name(nodes, "c10d::recv_")
    assert [(send.start_ns, send.dur_ns), (recv.start_ns, recv.dur_ns)] == [(50_000, 5_000), (50_400, 0)]
    assert unended == [1]
    # a collective without an end is the hooks' to count (CommHooks.running), not counted again here
    unended = []
    build_nodes(one_step([coll(10_000, 12_000, seq=0), running, irecv]), unended=unended)
    assert unended == [1]


def test_no_node_of_the_thread_waits_for_communication_recorded_without_an_end() -> None:
    # an isend/irecv pair or an all_reduce issued in the window's last step and waited for after it: nothing
    # in the window saw it complete, so the thread's next node (the optimizer step) did not wait for it.
    # Before, that node depended on it as on DDP's hidden wait: on 2 gloo ranks of a double-buffered
    # exchange (step k waits for step k-1's), the unmodified replay held rank 0's last step until the
    # peer's send, 24.5 ms, and replayed its steps 21.2% slower than recorded
    running = replace(coll(20_000, END_UNKNOWN, seq=1, is_async=True, issue_end=20_200), end_ns=END_UNKNOWN)
    isend = replace(running, node_type=NodeType.COMM_SEND, op="c10d::send", comm_type=None, dst=1, seq=-1)
    for comm in (running, isend):
        nodes = build_nodes(one_step([coll(10_000, 12_000, seq=0), comm, coll(40_000, 45_000, seq=2)]))
        (still,) = [n for n in nodes if n.start_ns == 20_200 and n.dur_ns == 0]
        assert [n.name for n in nodes if still.node_id in n.ctrl_deps] == [], comm.op


def test_a_flight_recorder_collective_ends_with_its_worker_event_and_precedes_the_threads_next_node() -> None:
    fr = replace(coll(30_000, 30_000, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [  # the hooked blocking call's own worker event, then the recorder's collective's
        host_op("gloo:all_reduce", 11_000, 8_000, thread=7),
        host_op("gloo:all_reduce", 31_000, 14_000, thread=8),
    ]
    cap = one_step([coll(10_000, 20_000, seq=0), fr], worker_events=worker)
    nodes = build_nodes(cap)
    (node,) = by_name(nodes, "gloo:all_reduce")
    assert (node.start_ns, node.dur_ns, node.attrs[Attr.STREAM]) == (30_000, 15_000, COMM_STREAM_BASE)
    # issued where the thread's next stretch of host time begins: it comes first, after the one before
    nxt = next(n for n in nodes if n.name == GAP_NAME and n.start_ns == 30_000)
    before = next(n for n in nodes if n.name == GAP_NAME and n.start_ns == 20_000)
    assert node.node_id < nxt.node_id and before.node_id in node.ctrl_deps
    # without the worker event the end is unknown: the arrival
    (bare,) = by_name(build_nodes(replace(cap, worker_events=worker[:1])), "gloo:all_reduce")
    assert bare.dur_ns == 0


def test_an_async_hooked_all_reduce_keeps_its_worker_event_from_the_bucket_all_reduces_issued_after_it() -> (
    None
):
    # DDP's forward under Join (rank 0 of a 2-rank capture, µs): an async_op all_reduce whose future fired at
    # 3,534 while gloo's worker closed its event at 3,556 (Work::finish comes after), then two buckets the
    # flight recorder gave, issued at 1,314 and 1,389, run after it on the group's two threads. Before, the
    # first bucket took the async call's event (ending at 3,556 instead of 10,087) and the second the first's
    us = 1_000

    def fr(t: int, seq: int) -> CommRecord:
        return replace(coll(t, t, seq=seq, is_async=True), op="gloo:all_reduce")

    def ev(s: int, e: int, thread: int) -> OpRecord:
        return host_op("gloo:all_reduce", s * us, (e - s) * us, thread=thread)

    hooked = coll(294 * us, 3_534 * us, seq=14, is_async=True, issue_end=346 * us)
    workers = [ev(325, 3_556, 8), ev(3_569, 10_087, 8), ev(3_623, 11_329, 9)]
    cap = RankCapture(
        rank=0,
        comms=[hooked, fr(1_314 * us, 15), fr(1_389 * us, 16)],
        steps=[StepRecord(step=0, start_ns=0, end_ns=20_000 * us)],
        groups=GROUPS,
        main_thread=MAIN,
        worker_events=workers,
        group_threads={8: "0", 9: "0"},
    )
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {15: 10_087 * us, 16: 11_329 * us}
    # issued quiet (record functions off), the async call made no event: the buckets take the first two
    quiet = replace(cap, comms=[replace(hooked, quiet=True), *cap.comms[1:]])
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(quiet), "gloo:all_reduce")}
    assert ends == {15: 3_556 * us, 16: 10_087 * us}


def _on_gloo_threads(
    comms: list[CommRecord], workers: list[OpRecord], threads: dict[int, str]
) -> RankCapture:
    """Rank 0's capture of one step of 20 ms: ``comms``, and the gloo worker events ``workers`` on the group
    threads ``threads``."""
    steps = [StepRecord(step=0, start_ns=0, end_ns=20_000_000)]
    return RankCapture(
        rank=0,
        comms=comms,
        steps=steps,
        groups=GROUPS,
        main_thread=MAIN,
        worker_events=workers,
        group_threads=threads,
    )


@pytest.mark.parametrize("end", [END_UNKNOWN, 325_000], ids=["not-timed", "event-starts-at-its-end"])
def test_an_async_hooked_all_reduce_takes_its_event_when_its_completion_is_unknown_or_came_as_the_event_began(
    end: int,
) -> None:
    # µs: a completion the hooks never timed (END_UNKNOWN) says nothing against the event, and an event that
    # began as the future fired began before the call completed: either way the call's own event, and the
    # bucket issued after it takes the next one (10,087), not the call's (3,556)
    us = 1_000
    hooked = coll(294 * us, end, seq=14, is_async=True, issue_end=300 * us)
    bucket = replace(coll(1_314 * us, 1_314 * us, seq=15, is_async=True), op="gloo:all_reduce")
    workers = [
        host_op("gloo:all_reduce", 325 * us, 3_231 * us, thread=8),
        host_op("gloo:all_reduce", 3_569 * us, 6_518 * us, thread=8),
    ]
    cap = _on_gloo_threads([hooked, bucket], workers, {8: "0"})
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {15: 10_087 * us}


def test_an_async_hooked_reduce_scatter_takes_the_earliest_of_gloos_all_reduce_and_reduce_scatter_event() -> (
    None
):
    # µs: gloo may run a reduce_scatter as an all_reduce (its event gloo:all_reduce, 325-3,556); after it, a
    # recorder-only all_reduce (issued 1,314) and reduce_scatter (issued 3,600) each take their own event
    us = 1_000
    hooked = replace(
        coll(294 * us, 3_534 * us, seq=14, is_async=True, issue_end=346 * us),
        op="c10d::_reduce_scatter_base_",
        comm_type=CommType.REDUCE_SCATTER,
    )

    def fr(t: int, seq: int, name: str, kind: CommType) -> CommRecord:
        return replace(coll(t * us, t * us, seq=seq, is_async=True), op=name, comm_type=kind)

    comms = [
        hooked,
        fr(1_314, 15, "gloo:all_reduce", CommType.ALL_REDUCE),
        fr(3_600, 16, "gloo:reduce_scatter", CommType.REDUCE_SCATTER),
    ]
    workers = [
        host_op("gloo:all_reduce", 325 * us, 3_231 * us, thread=8),
        host_op("gloo:all_reduce", 3_569 * us, 6_518 * us, thread=8),
        host_op("gloo:reduce_scatter", 3_700 * us, 1_300 * us, thread=9),
    ]
    cap = _on_gloo_threads(comms, workers, {8: "0", 9: "0"})
    nodes = build_nodes(cap)
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in nodes if n.name.startswith("gloo:")}
    assert ends == {15: 10_087 * us, 16: 5_000 * us}


def test_a_quiet_async_hooked_call_hides_no_worker_event_of_a_recorder_only_collective_run_during_it() -> (
    None
):
    # µs: a quiet async all_reduce (no event of its own) in flight 294-3,534 on thread 8 while a collective
    # only the flight recorder saw, issued at 1,314, runs 1,400-3,000 on the group's other thread. Only a
    # blocking call's span holds the events it made: the recorder's collective keeps its own end
    us = 1_000
    hooked = replace(coll(294 * us, 3_534 * us, seq=14, is_async=True, issue_end=346 * us), quiet=True)
    fr = replace(coll(1_314 * us, 1_314 * us, seq=15, is_async=True), op="gloo:all_reduce")
    workers = [host_op("gloo:all_reduce", 1_400 * us, 1_600 * us, thread=9)]
    cap = _on_gloo_threads([hooked, fr], workers, {8: "0", 9: "0"})
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {15: 3_000 * us}
    # worker events recorded from the instant it was issued: its event is among them
    cap = replace(cap, worker_events_from_ns=1_314 * us)
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {15: 3_000 * us}


@pytest.mark.parametrize("quiet", [False, True], ids=["own-event", "quiet"])
def test_a_bucket_all_reduce_in_flight_during_a_blocking_hooked_all_reduce_keeps_its_own_worker_event(
    quiet: bool,
) -> None:
    # µs, rank 0 of a 2-rank capture of DDP (buckets of 0.05 MB) with SyncBatchNorm, whose backward
    # all_reduces (blocking, hooked) between the buckets the flight recorder gave: bucket 42 issued at
    # 21,259 runs 21,402-32,621 on thread 8 while the hooked all_reduce 43 (21,571-32,838) runs 21,643-32,791
    # on thread 9; then bucket 44 (33,701) and hooked 45 (33,890-40,188), bucket 46 (40,741). Before, every
    # event inside a blocking call was its own: bucket 42 took bucket 44's event (ending 39,956), 44 took
    # 46's and 46 none (no end). A quiet hooked call made no event: the buckets' are still theirs.
    us = 1_000

    def bucket(t: int, seq: int) -> CommRecord:
        return replace(coll(t * us, t * us, seq=seq, is_async=True), op="gloo:all_reduce")

    def ev(s: int, e: int, thread: int) -> OpRecord:
        return host_op("gloo:all_reduce", s * us, (e - s) * us, thread=thread)

    hooked = [replace(coll(21_571 * us, 32_838 * us, seq=43), quiet=quiet)]
    hooked.append(replace(coll(33_890 * us, 40_188 * us, seq=45), quiet=quiet))
    workers = [ev(21_402, 32_621, 8), ev(33_990, 39_956, 8), ev(40_759, 45_909, 8)]
    if not quiet:
        workers += [ev(21_643, 32_791, 9), ev(34_057, 40_136, 9)]
    cap = _on_gloo_threads(
        [bucket(21_259, 42), hooked[0], bucket(33_701, 44), hooked[1], bucket(40_741, 46)],
        sorted(workers, key=lambda o: o.start_ns),
        {8: "0", 9: "0"},
    )
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {42: 32_621 * us, 44: 39_956 * us, 46: 45_909 * us}
    calls = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "c10d::allreduce_")}
    assert calls == {43: 32_838 * us, 45: 40_188 * us}  # a blocking call keeps its own end


def _all_gather_end(hooked: CommRecord, inner_end_us: int) -> int:
    """The end of a recorder-only all_gather issued at 800 µs, whose own event runs 6,000-7,000 µs, when an
    all_gather event 2,000-``inner_end_us`` runs during the hooked all_reduce ``hooked``."""
    us = 1_000
    fr = replace(
        coll(800 * us, 800 * us, seq=0, is_async=True), op="gloo:all_gather", comm_type=CommType.ALL_GATHER
    )
    workers = [
        host_op("gloo:all_gather", 2_000 * us, (inner_end_us - 2_000) * us, thread=8),
        host_op("gloo:all_gather", 6_000 * us, 1_000 * us, thread=8),
    ]
    (node,) = by_name(build_nodes(_on_gloo_threads([fr, hooked], workers, {8: "0"})), "gloo:all_gather")
    return node.start_ns + node.dur_ns


@pytest.mark.parametrize("inner_end", [3_000, 5_000], ids=["inside", "ends-with-the-call"])
def test_a_blocking_hooked_call_still_hides_events_of_another_kind_inside_it(inner_end: int) -> None:
    # µs: a hooked all_reduce 1,000-5,000 with an all_gather event inside it (what it ran, not a recorder
    # collective's), ending before the call or as it ends: the recorder-only all_gather takes its own event
    assert _all_gather_end(coll(1_000_000, 5_000_000, seq=1), inner_end) == 7_000_000


def test_a_quiet_blocking_hooked_call_hides_no_worker_event_of_another_kind() -> None:
    # µs: a quiet hooked all_reduce 1,000-5,000 ran with record functions off and made no event, so the
    # all_gather event 2,000-3,000 during it is the recorder-only all_gather's (issued at 800), not the call's
    assert _all_gather_end(replace(coll(1_000_000, 5_000_000, seq=1), quiet=True), 3_000) == 3_000_000


def test_an_async_hooked_call_claims_only_its_own_kind_and_hides_no_event_of_another_kind() -> None:
    # µs: an async hooked all_reduce in flight 1,000-5,000 whose own event runs 2,500-4,800, and a
    # recorder-only all_gather issued at 1,500 whose event runs 2,000-3,000 during it: that event is neither
    # the call's (another kind, though earlier) nor hidden by its span (an async call's span holds no events)
    us = 1_000
    hooked = coll(1_000 * us, 5_000 * us, seq=1, is_async=True, issue_end=1_050 * us)
    fr = replace(
        coll(1_500 * us, 1_500 * us, seq=2, is_async=True),
        op="gloo:all_gather",
        comm_type=CommType.ALL_GATHER,
    )
    workers = [
        host_op("gloo:all_gather", 2_000 * us, 1_000 * us, thread=9),
        host_op("gloo:all_reduce", 2_500 * us, 2_300 * us, thread=8),
        host_op("gloo:all_gather", 6_000 * us, 1_000 * us, thread=9),
    ]
    cap = _on_gloo_threads([hooked, fr], workers, {8: "0", 9: "0"})
    (node,) = by_name(build_nodes(cap), "gloo:all_gather")
    assert node.start_ns + node.dur_ns == 3_000 * us


def test_a_bucket_issued_before_the_worker_event_recorder_started_takes_no_later_buckets_event() -> None:
    # µs: the recorder started at 1,000; bucket 14 issued at 500 has no event of its own, and the event
    # 1,400-3,000 is bucket 15's (issued at 1,314), not the first free one after bucket 14's issue
    us = 1_000

    def bucket(t: int, seq: int) -> CommRecord:
        return replace(coll(t * us, t * us, seq=seq, is_async=True), op="gloo:all_reduce")

    workers = [host_op("gloo:all_reduce", 1_400 * us, 1_600 * us, thread=8)]
    cap = replace(
        _on_gloo_threads([bucket(500, 14), bucket(1_314, 15)], workers, {8: "0"}),
        worker_events_from_ns=1_000 * us,
    )
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends[15] == 3_000 * us


def test_an_event_that_began_after_a_hooked_call_completed_is_left_to_the_bucket_issued_after_it() -> None:
    # µs: an async hooked all_reduce issued at 294 completed at 324 with no event of its own; the event
    # 325-3,556 began after it and is the bucket's (issued at 1,314), not the call's
    us = 1_000
    hooked = coll(294 * us, 324 * us, seq=14, is_async=True, issue_end=300 * us)
    bucket = replace(coll(1_314 * us, 1_314 * us, seq=15, is_async=True), op="gloo:all_reduce")
    workers = [host_op("gloo:all_reduce", 325 * us, 3_231 * us, thread=8)]
    cap = _on_gloo_threads([hooked, bucket], workers, {8: "0"})
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {15: 3_556 * us}


def test_step_markers_put_kineto_on_the_hooks_clock_when_no_hooked_call_does() -> None:
    # ops level, DDP alone: no hooked call to join the clocks; Kineto runs 40 µs behind time.time_ns()
    skew = 40_000
    mark_times = [100_000, 400_000]  # time.time_ns() read inside each marker
    ops = [
        *(host_op("skewlens::step", t - 1_000 - skew, 2_000) for t in mark_times),
        host_op("aten::mm", 150_000 - skew, 100_000),
        host_op("gloo:all_reduce", 260_000 - skew, 50_000, thread=7),  # the worker ran it
    ]
    fr = replace(coll(255_000, 255_000, seq=1, is_async=True), op="gloo:all_reduce")
    cap = RankCapture(
        rank=0,
        comms=[fr],
        steps=[StepRecord(step=0, start_ns=0, end_ns=500_000)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
        mark_times_ns=mark_times,
    )
    nodes = build_nodes(cap)
    (mm,) = by_name(nodes, "aten::mm")
    (ar,) = by_name(nodes, "gloo:all_reduce")
    assert (mm.start_ns, mm.dur_ns) == (150_000, 100_000)
    assert (ar.start_ns, ar.start_ns + ar.dur_ns) == (255_000, 310_000)  # the worker's end, on our clock
    assert not by_name(nodes, "skewlens::step")  # bookkeeping, not compute
    # markers whose count disagrees with the readings are not trusted: Kineto's clock is kept
    (raw_mm,) = by_name(build_nodes(replace(cap, mark_times_ns=mark_times[:1])), "aten::mm")
    assert raw_mm.start_ns == 150_000 - skew


def test_recorder_collectives_on_two_groups_take_the_worker_events_of_their_own_groups_threads() -> None:
    two = [*GROUPS, ProcessGroupInfo(name="1", ranks=(0, 1), desc="tp", backend="cpu:gloo")]

    def fr(t: int, pg: str) -> CommRecord:
        return replace(coll(t, t, seq=(1 << 40) + t, is_async=True), op="gloo:all_reduce", pg_name=pg)

    def ev(s: int, e: int, thread: int) -> OpRecord:
        return host_op("gloo:all_reduce", s, e - s, thread=thread)

    # blocking hooked all_reduces show which worker thread serves which group (7: "0", 8: "1"); then
    # group "1"'s worker starts first although group "0" issued first
    hooked = [coll(10_000, 50_000, seq=0), replace(coll(60_000, 90_000, seq=0), pg_name="1")]
    workers = [
        ev(20_000, 40_000, 7),
        ev(65_000, 85_000, 8),
        ev(120_000, 200_000, 8),
        ev(150_000, 300_000, 7),
    ]
    cap = RankCapture(
        rank=0,
        comms=[*hooked, fr(100_000, "0"), fr(110_000, "1")],
        steps=[StepRecord(step=0, start_ns=0, end_ns=400_000)],
        groups=two,
        main_thread=MAIN,
        worker_events=workers,
    )
    ends = {
        n.attrs[Attr.PG_NAME]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")
    }
    assert ends == {"0": 300_000, "1": 200_000}


def test_calls_outside_recorded_steps_are_not_written() -> None:
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 20_000, seq=0, step=0), coll(70_000, 80_000, seq=1, step=1)],
        steps=[StepRecord(step=1, start_ns=60_000, end_ns=90_000)],
        groups=GROUPS,
        main_thread=MAIN,
    )
    comms = by_name(build_nodes(cap), "c10d::allreduce_")
    assert [c.attrs[Attr.SEQ] for c in comms] == [1]
    assert all(n.attrs.get(Attr.STEP) == 1 for n in build_nodes(cap)[1:])


def test_the_process_group_node_parses_back_into_the_groups() -> None:
    nodes = build_nodes(RankCapture(rank=0, comms=[], steps=[], groups=GROUPS, main_thread=MAIN))
    groups = parse_pg_init(nodes[0].inputs_values, Path("x.et"))
    assert groups == {"0": GROUPS[0]}


def test_an_operator_enclosing_a_blocking_collective_is_replaced_by_its_children() -> None:
    ops = [
        host_op("my_block", 0, 100_000),
        host_op("aten::mm", 1_000, 9_000),
        host_op("aten::mm_inner", 2_000, 1_000),
        host_op("c10d::allreduce_", 10_000, 40_000),
        host_op("aten::add", 60_000, 5_000),
    ]
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 50_000, seq=0)],
        steps=[StepRecord(step=0, start_ns=0, end_ns=100_000)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
    )
    nodes = build_nodes(cap)
    comp = [n.name for n in nodes if n.node_type == NodeType.COMP and n.name != UNTRACED_NAME]
    assert [c for c in comp if c != "my_block"] == ["aten::mm", "aten::add"]
    # the rest of the step on the main thread is the block's own time: together they cover the step
    main = [(n.start_ns, n.start_ns + n.dur_ns) for n in nodes[1:] if n.attrs[Attr.STREAM] == 0]
    assert sum(b - a for a, b in main) == 100_000
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(sorted(main)))
    assert len(by_name(nodes, "c10d::allreduce_")) == 1
    assert by_name(nodes, "c10d::allreduce_")[0].node_type == NodeType.COMM_COLL


def main_thread_compute(cap: RankCapture) -> list[tuple[int, int, str]]:
    """(start, end, name) of the COMP nodes on the main thread, by start."""
    return sorted(
        (n.start_ns, n.start_ns + n.dur_ns, n.name)
        for n in build_nodes(cap)
        if n.node_type == NodeType.COMP and n.attrs[Attr.STREAM] == 0
    )


def test_at_the_ops_level_a_scope_enclosing_a_blocking_collective_keeps_its_own_time_not_untraced() -> None:
    # a user's ``record_function("checkpoint")`` around ``dcp.save``: its planning collectives cut it, and
    # its time around them (pickling, writing files) is the checkpoint's work, not idle host time
    ops = [
        host_op("checkpoint", 10_000, 70_000),
        host_op("aten::copy_", 15_000, 5_000),
        host_op("c10d::allgather_", 30_000, 10_000),
    ]
    cap = one_step([coll(30_000, 40_000, seq=0)], ops=ops)
    main = main_thread_compute(cap)
    assert main == [
        (0, 10_000, UNTRACED_NAME),
        (10_000, 15_000, "checkpoint"),
        (15_000, 20_000, "aten::copy_"),
        (20_000, 30_000, "checkpoint"),
        (40_000, 60_000, "checkpoint"),
    ]


def test_a_scope_opened_inside_a_python_dispatch_modes_handler_keeps_its_time_and_operators() -> None:
    # with a TorchDispatchMode active, the call that opens a record_function's range is dispatched through
    # the mode, whose PythonDispatchMode operator the range begins inside and outlives (and the one that
    # closes it begins inside the range). Before, the range and its operators were the handler's children,
    # left out: the scope's time was untraced (with the mode on, a 1-rank loop's record_function("myscope")
    # around a matmul, and every FSDP2 scope and Optimizer.step of a 2x2-mesh run, were gone)
    ops = [
        host_op("PythonDispatchMode", 1_000, 2_000),  # record_function's enter, dispatched by the mode
        host_op("myscope", 2_000, 40_000),
        host_op("aten::mm", 5_000, 30_000),
        host_op("PythonDispatchMode", 41_000, 2_000),  # its exit
    ]
    assert main_thread_compute(one_step([], ops=ops)) == [
        (0, 1_000, UNTRACED_NAME),
        (1_000, 2_000, "PythonDispatchMode"),
        (2_000, 42_000, "myscope"),
        (42_000, 60_000, UNTRACED_NAME),
    ]


def test_time_inside_nested_scopes_around_collectives_is_named_after_the_innermost_scope() -> None:
    # a program's record_function("user::step") around record_function("user::metrics") around an
    # all_reduce and record_function("user::sync") around another: each scope's own time is its own
    # (before, all of it was named after the outermost scope: 'user::step' five times a step on 2 DDP
    # ranks at the ops level, no 'user::metrics' or 'user::sync')
    scopes = {"user::step": (2_000, 55_000), "user::metrics": (5_000, 45_000), "user::sync": (25_000, 20_000)}
    calls = [
        ("aten::clone", 8_000, 3_000),
        ("c10d::allreduce_", 15_000, 5_000),
        ("c10d::allreduce_", 30_000, 5_000),
    ]
    ops = [host_op(name, *span) for name, span in scopes.items()] + [host_op(*c) for c in calls]
    cap = one_step([coll(15_000, 20_000, seq=0), coll(30_000, 35_000, seq=1)], ops=ops)
    assert main_thread_compute(cap) == [
        (0, 2_000, UNTRACED_NAME),
        (2_000, 5_000, "user::step"),
        (5_000, 8_000, "user::metrics"),
        (8_000, 11_000, "aten::clone"),
        (11_000, 15_000, "user::metrics"),
        (20_000, 25_000, "user::metrics"),
        (25_000, 30_000, "user::sync"),
        (35_000, 45_000, "user::sync"),
        (45_000, 50_000, "user::metrics"),
        (50_000, 57_000, "user::step"),
        (57_000, 60_000, UNTRACED_NAME),
    ]


def test_an_operator_the_step_was_marked_inside_ends_at_the_mark_unless_its_operators_ran_later() -> None:
    # the optimizer post-hook marks the step from inside Optimizer.step: the rest of that op is the
    # capture's own work and belongs to no step; a user scope spanning two steps is split into its ops,
    # its own time up to the mark its own
    ops = [
        host_op("aten::mm", 0, 50_000),
        host_op("Optimizer.step#SGD.step", 60_000, 70_000),
        host_op("aten::add_", 61_000, 39_000),  # ends at the mark (100 us): not after it
        host_op("epoch_scope", 140_000, 180_000),
        host_op("aten::mul", 150_000, 40_000),
        host_op("aten::div", 300_000, 10_000),
    ]
    steps = [StepRecord(step=k, start_ns=k * 100_000, end_ns=(k + 1) * 100_000) for k in range(4)]
    cap = RankCapture(rank=0, comms=[], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops)
    nodes = build_nodes(cap)
    comp = {n.name: n for n in nodes if n.node_type == NodeType.COMP and n.name != UNTRACED_NAME}
    assert set(comp) == {"aten::mm", "Optimizer.step#SGD.step", "aten::mul", "aten::div", "epoch_scope"}
    scope = [(n.start_ns, n.dur_ns, n.attrs[Attr.STEP]) for n in nodes if n.name == "epoch_scope"]
    assert scope == [(140_000, 10_000, 1), (190_000, 10_000, 1)]
    opt = comp["Optimizer.step#SGD.step"]
    assert (opt.start_ns, opt.dur_ns, opt.attrs[Attr.STEP]) == (60_000, 40_000, 0)
    assert (comp["aten::mul"].attrs[Attr.STEP], comp["aten::div"].attrs[Attr.STEP]) == (1, 3)
    for s in steps:  # every step's main-thread nodes lie inside it, without overlap, and cover it
        main = sorted(
            (n.start_ns, n.start_ns + n.dur_ns)
            for n in nodes[1:]
            if n.attrs[Attr.STREAM] == 0 and n.attrs[Attr.STEP] == s.step
        )
        assert all(s.start_ns <= a and b <= s.end_ns for a, b in main), s
        assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(main)), s


def test_a_scope_the_step_was_marked_inside_keeps_its_own_time_up_to_the_mark_not_untraced() -> None:
    # an RL loop's record_function("train") around forward, backward and optimizer.step(): the step is
    # marked inside Optimizer.step, which ends after the mark, so "train" gives way to its operators; its
    # own time between them is the training phase's work (before: untraced, idle to the analyses; on 4
    # gloo ranks at the ops level no 'train' node at all; now 0.4-0.6 ms a step)
    ops = [
        host_op("train", 10_000, 90_000),
        host_op("aten::linear", 20_000, 20_000),
        host_op("Optimizer.step#SGD.step", 70_000, 25_000),
        host_op("aten::add_", 75_000, 10_000),
    ]
    steps = [StepRecord(step=0, start_ns=0, end_ns=90_000)]
    cap = RankCapture(rank=0, comms=[], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops)
    assert main_thread_compute(cap) == [
        (0, 10_000, UNTRACED_NAME),
        (10_000, 20_000, "train"),
        (20_000, 40_000, "aten::linear"),
        (40_000, 70_000, "train"),
        (70_000, 90_000, "Optimizer.step#SGD.step"),
    ]


def test_inside_a_scope_the_time_right_after_issuing_a_collective_the_thread_waits_for_stays_untraced() -> (
    None
):
    # DDP's gradient all_reduce inside a record_function("train"): the main thread waits for it at the end
    # of backward (in C++) and goes on before gloo's worker closes its event (by 0.1-0.5 ms on 4 gloo ranks
    # sharing 2 loaded cores). That time stays untraced, which the execution model reads as the wait
    # (RankModel.end_clamp_rows); named 'train' it was compute of fixed length (10 ms a step on rank 0)
    fr = replace(coll(10_000, 10_000, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [host_op("gloo:all_reduce", 11_000, 29_500, thread=8)]  # ends at 40.5 us, after aten::add began
    ops = [
        host_op("train", 2_000, 64_000),
        host_op("aten::mul", 5_000, 5_000),
        host_op("aten::add", 40_000, 5_000),
        host_op("Optimizer.step#SGD.step", 50_000, 15_000),
    ]
    assert main_thread_compute(one_step([fr], worker_events=worker, ops=ops)) == [
        (0, 2_000, UNTRACED_NAME),
        (2_000, 5_000, "train"),
        (5_000, 10_000, "aten::mul"),
        (10_000, 40_000, UNTRACED_NAME),
        (40_000, 45_000, "aten::add"),
        (45_000, 50_000, "train"),
        (50_000, 60_000, "Optimizer.step#SGD.step"),
    ]
    # only the first gap after the issue, which the model reads: a later one while the collective still
    # runs (backward's operators overlapping a bucket's transfer) is the scope's own time
    ops[2:3] = [host_op("aten::add", 12_000, 8_000), host_op("aten::sub", 22_000, 18_000)]
    assert main_thread_compute(one_step([fr], worker_events=worker, ops=ops))[3:6] == [
        (10_000, 12_000, UNTRACED_NAME),
        (12_000, 20_000, "aten::add"),
        (20_000, 22_000, "train"),
    ]


def test_an_optimizer_step_whose_closure_ran_backward_gives_way_so_ddps_wait_inside_it_is_no_work() -> None:
    # Lightning (automatic optimisation) and any optimizer.step(closure) run forward and backward inside
    # Optimizer.step: DDP's gradient all_reduce is issued and waited for (in C++, at the end of backward)
    # inside it. It was one leaf up to the mark, its wait compute of fixed length (2 gloo ranks of a
    # Lightning DDP Trainer, rank 1 slowed by 45 ms a step: rank 0's 'compute' 69 of its 74 ms step, no
    # wait, and the blame on rank 0)
    fr = replace(coll(30_000, 30_000, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [host_op("gloo:all_reduce", 31_000, 28_500, thread=8)]  # ends at 59.5 us, in no operator
    ops = [
        host_op("Optimizer.step#SGD.step", 2_000, 95_000),  # the mark (step end) at 90 us is inside it
        host_op("aten::linear", 5_000, 10_000),
        host_op("autograd::engine::evaluate_function: AddmmBackward0", 20_000, 10_000),
        host_op("aten::add_", 60_000, 10_000),
    ]
    steps = [StepRecord(step=0, start_ns=0, end_ns=90_000)]
    cap = RankCapture(
        rank=0, comms=[fr], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops, worker_events=worker
    )
    assert main_thread_compute(cap) == [
        (0, 2_000, UNTRACED_NAME),
        (2_000, 5_000, "Optimizer.step#SGD.step"),
        (5_000, 15_000, "aten::linear"),
        (15_000, 20_000, "Optimizer.step#SGD.step"),
        (20_000, 30_000, "autograd::engine::evaluate_function: AddmmBackward0"),
        (60_000, 70_000, "aten::add_"),  # the wait from 30 to 59.5 us is no node's work
        (70_000, 90_000, "Optimizer.step#SGD.step"),
    ]
    nodes = build_nodes(cap)
    (bucket,) = by_name(nodes, "gloo:all_reduce")
    (after,) = by_name(nodes, "aten::add_")
    assert bucket.node_id in after.ctrl_deps  # what follows the wait waits for the bucket
    # a collective issued inside an operator and still running when it returned (DDP's bucket issued
    # from AccumulateGrad's hook) leaves the operator whole
    ops[2] = host_op("autograd::engine::evaluate_function: AddmmBackward0", 20_000, 20_000)
    ops[0] = host_op("Optimizer.step#SGD.step", 60_000, 35_000)
    del ops[1]
    cap = replace(cap, ops=ops)
    assert [c for c in main_thread_compute(cap) if c[2] != UNTRACED_NAME] == [
        (20_000, 40_000, "autograd::engine::evaluate_function: AddmmBackward0"),
        (60_000, 90_000, "Optimizer.step#SGD.step"),
    ]


def test_a_gradients_accumulation_whose_hook_bucket_completed_before_it_returned_stays_whole() -> None:
    # µs, from a 2-rank DDP capture with a comm hook (2 in 30 captures split one step's evaluation): the
    # hook issued the bucket at 45 inside AccumulateGrad's evaluation (0-400) and gloo finished it at 366,
    # while the hook's Python ran on. Before, the evaluation gave way to its operators as if it had waited
    # there, and the bucket was issued after a piece of it, not from inside it (a replay shortening the
    # evaluation did not move the bucket). The reducer waits at the end of backward, after its last node
    us = 1_000
    name = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    fr = replace(coll(45 * us, 45 * us, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [host_op("gloo:all_reduce", 46 * us, 320 * us, thread=8)]  # ends at 366
    ops = [
        host_op(name, 0, 400 * us),
        host_op("torch::autograd::AccumulateGrad", 1 * us, 1 * us),
        host_op("torch::distributed::reducer::copy_", 3 * us, 2 * us),
        host_op("aten::div_", 20 * us, 14 * us),
        host_op("c10d::allreduce_", 45 * us, 10 * us),
        host_op("Optimizer.step#SGD.step", 500 * us, 90 * us),
    ]
    steps = [StepRecord(step=0, start_ns=0, end_ns=600 * us)]
    cap = RankCapture(
        rank=0, comms=[fr], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops, worker_events=worker
    )
    assert (0, 400 * us, name) in main_thread_compute(cap)
    # the same completion inside an operator that ran a backward pass (optimizer.step(closure)) was waited
    # for there: it gives way
    closure = [host_op("Optimizer.step#SGD.step", 0, 400 * us), *ops[:5], ops[5]]
    closure[1] = host_op(name, 10 * us, 40 * us)
    cap = replace(cap, ops=sorted(closure, key=lambda o: (o.start_ns, -o.dur_ns)))
    assert (0, 400 * us, "Optimizer.step#SGD.step") not in main_thread_compute(cap)


def test_inside_a_scope_the_time_after_a_waited_collective_ended_is_the_scopes_not_untraced() -> None:
    # the thread blocked in wait() until the all_reduce ended at 38 us (no node: the wait), then ran 2 us of
    # the scope's own Python before aten::add: the collective is no longer in flight as that gap begins, so
    # the gap is named after the scope, as any gap inside it is
    fr = replace(coll(10_000, 10_000, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [host_op("gloo:all_reduce", 11_000, 27_000, thread=8)]  # ends at 38 us
    ops = [
        host_op("train", 2_000, 64_000),
        host_op("aten::mul", 5_000, 5_000),
        host_op("aten::add", 40_000, 5_000),
        host_op("Optimizer.step#SGD.step", 50_000, 15_000),
    ]
    assert main_thread_compute(one_step([fr], worker_events=worker, ops=ops))[2:5] == [
        (5_000, 10_000, "aten::mul"),
        (38_000, 40_000, "train"),
        (40_000, 45_000, "aten::add"),
    ]


def test_an_op_the_step_was_marked_inside_gives_way_to_its_operators_when_one_runs_across_the_mark() -> None:
    # the mark (100 us) falls inside Optimizer.step and inside its aten::add_ (90-110 us): that operator ran
    # after the mark, so the op is replaced by its operators: its own time before them, then the add_, in
    # step 0 up to its end
    ops = [
        host_op("aten::mm", 0, 50_000),
        host_op("Optimizer.step#SGD.step", 60_000, 70_000),
        host_op("aten::add_", 90_000, 20_000),
    ]
    steps = [StepRecord(step=k, start_ns=k * 100_000, end_ns=(k + 1) * 100_000) for k in range(2)]
    nodes = build_nodes(RankCapture(rank=0, comms=[], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops))
    comp = [
        (n.name, n.start_ns, n.dur_ns, n.attrs[Attr.STEP])
        for n in nodes
        if n.node_type == NodeType.COMP and n.name != UNTRACED_NAME
    ]
    assert comp == [
        ("aten::mm", 0, 50_000, 0),
        ("Optimizer.step#SGD.step", 60_000, 30_000, 0),
        ("aten::add_", 90_000, 10_000, 0),
    ]


def test_the_optimizer_step_keeps_its_name_when_the_step_marker_inside_it_seems_to_end_after_the_mark() -> (
    None
):
    # examples/mesh2d.py at --level ops: the post-hook leaves its skewlens::step marker inside
    # Optimizer.step, reads the clock inside it, closes it, then reads the step's end. Kineto's clock,
    # joined to the hooks' within tens of µs, put the marker's end 4 µs past the step's end: the op was
    # taken for one whose operators ran after the mark, replaced by its aten::add_ at top level
    ops, times, steps = [], [], []
    for k in range(3):
        t0 = k * 100_000
        ops += [
            host_op("aten::mm", t0 + 1_000, 40_000),
            host_op("Optimizer.step#SGD.step", t0 + 50_000, 45_000),
            host_op("aten::add_", t0 + 51_000, 10_000),
            host_op("aten::add_", t0 + 62_000, 10_000),
            host_op("skewlens::step", t0 + 80_000, 10_000),
        ]
        times.append(t0 + 85_000)  # inside the marker: its middle, so the clocks' offset is 0
        steps.append(StepRecord(step=k, start_ns=t0, end_ns=t0 + 86_000))
    cap = RankCapture(
        rank=0, comms=[], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops, mark_times_ns=times
    )
    nodes = build_nodes(cap)
    for s in steps:
        named = [
            (n.name, n.start_ns - s.start_ns, n.dur_ns)
            for n in nodes[1:]
            if n.attrs[Attr.STEP] == s.step and n.name != UNTRACED_NAME
        ]
        assert named == [("aten::mm", 1_000, 40_000), ("Optimizer.step#SGD.step", 50_000, 36_000)], s


@dataclass
class FakeKinetoEvent:
    """The part of torch's _KinetoEvent that op_records reads."""

    n: str
    t: int
    d: int
    dev: str = "DeviceType.CPU"
    tid: int = MAIN
    stream: int = 0
    index: int = 0
    corr: int = 0
    act: str = ""

    def name(self) -> str:
        return self.n

    def activity_type(self) -> str:
        return self.act

    def start_ns(self) -> int:
        return self.t

    def duration_ns(self) -> int:
        return self.d

    def device_type(self) -> str:
        return self.dev

    def start_thread_id(self) -> int:
        return self.tid

    def device_resource_id(self) -> int:
        return self.stream

    def device_index(self) -> int:
        return self.index

    def correlation_id(self) -> int:
        return self.corr


def test_the_profilers_memory_instant_events_are_not_operators() -> None:
    # the full level records allocations (profile_memory): Kineto gives each as a zero-length
    # "[memory]" instant event, which became a COMP node cutting the untraced time around it in two
    events = [
        FakeKinetoEvent("aten::mm", 0, 5_000, corr=1, act="cpu_op"),
        FakeKinetoEvent("[memory]", 7_000, 0, act="cpu_instant_event"),
        FakeKinetoEvent("aten::add_", 10_000, 5_000, corr=2, act="cpu_op"),
    ]
    assert [o.name for o in op_records(events)] == ["aten::mm", "aten::add_"]


def test_nccl_kernels_of_both_generations_and_rccls_are_recognised() -> None:
    assert names_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert names_nccl_kernel("ncclDevKernel_AllGather_RING_LL")
    assert names_nccl_kernel("ncclDevKernelDebug_Generic")  # RCCL's debug build
    assert names_nccl_kernel("mscclKernel_Sum_float_LL_false")  # RCCL's MSCCL algorithms (MI300X default)
    assert not names_nccl_kernel("volta_sgemm_128x64_nn")
    assert not names_nccl_kernel("Cijk_Alik_Bljk_SB_MT64x16x32")


@pytest.mark.parametrize("kernel", ["mscclKernel_Sum_float_LL_false", "ncclDevKernelDebug_Generic"])
def test_on_rocm_a_collective_ends_with_its_rccl_kernel_which_is_no_gpu_compute_node(kernel: str) -> None:
    # RCCL's MSCCL kernels (on by default on MI300X) and its debug build's Generic kernel: the capture knew
    # only the ncclKernel_ / ncclDevKernel_ prefixes, so the all_reduce ended at its host call and the
    # kernel was a GPU compute node
    events = [
        FakeKinetoEvent("aten::mm", 0, 5_000, corr=1),
        FakeKinetoEvent(kernel, 30_000, 20_000, dev="DeviceType.CUDA", stream=13, index=0),
    ]
    nodes = build_nodes(one_step([coll(10_000, 12_000, seq=0)], ops=op_records(events), device="cuda:0"))
    assert not by_name(nodes, kernel)
    (ar,) = by_name(nodes, "c10d::allreduce_")
    assert (ar.start_ns, ar.start_ns + ar.dur_ns, ar.attrs[Attr.IS_CPU_OP]) == (10_000, 50_000, False)


def test_on_gpus_kernels_keep_their_stream_and_a_collective_ends_with_its_nccl_kernel() -> None:
    events = [
        FakeKinetoEvent("aten::mm", 0, 5_000, corr=1),
        FakeKinetoEvent("volta_sgemm_128x64_nn", 6_000, 20_000, dev="DeviceType.CUDA", stream=7, index=1),
        FakeKinetoEvent(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            30_000,
            50_000,
            dev="DeviceType.CUDA",
            stream=13,
            index=1,
        ),
        FakeKinetoEvent(
            "ncclKernel_AllGather_RING_LL_Sum_float", 90_000, 5_000, dev="DeviceType.CUDA", stream=13, index=1
        ),
    ]
    ops = op_records(events, rf_ids={1: 42})
    assert [(o.is_cpu, o.thread, o.rf_id) for o in ops][:2] == [(True, MAIN, 42), (False, 7, -1)]
    assert ops[1].device == "cuda:1"
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 12_000, seq=0), coll(85_000, 86_000, seq=1)],  # host side: enqueue only
        steps=[StepRecord(step=0, start_ns=0, end_ns=100_000)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
        device="cuda:1",
    )
    nodes = build_nodes(cap)
    gemm = by_name(nodes, "volta_sgemm_128x64_nn")[0]
    assert gemm.attrs[Attr.STREAM] == CUDA_STREAM_BASE + 7 and gemm.attrs[Attr.IS_CPU_OP] is False
    assert not [n for n in nodes if names_nccl_kernel(n.name)]  # NCCL kernels are the comm nodes' device side
    first, second = by_name(nodes, "c10d::allreduce_")
    assert first.start_ns + first.dur_ns == 80_000  # completion = end of the NCCL kernel
    assert second.start_ns + second.dur_ns == 95_000
    assert first.attrs[Attr.IS_CPU_OP] is False


def test_an_async_nccl_collective_whose_kernel_ended_before_its_call_returned_has_an_end() -> None:
    # a small all_reduce's kernel (1 us) can finish before the Python call that enqueued it returns: the
    # NCCL kernel says it was done by then, so it is no node without an end (of duration 0 at its issue end,
    # which check reports as still running when the window ended): it spans its call
    events = [
        FakeKinetoEvent("aten::mm", 0, 5_000, corr=1),
        FakeKinetoEvent(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            10_500,
            1_000,
            dev="DeviceType.CUDA",
            stream=13,
            index=1,
        ),
    ]
    call = replace(coll(10_000, END_UNKNOWN, seq=0, is_async=True, issue_end=12_000), end_ns=END_UNKNOWN)
    cap = one_step([call], ops=op_records(events, rf_ids={1: 42}), device="cuda:1")
    (node,) = by_name(build_nodes(cap), "c10d::allreduce_")
    assert (node.start_ns, node.start_ns + node.dur_ns) == (10_000, 12_000)


def test_a_gpu_ranks_gloo_collectives_ran_on_the_host_and_its_nccl_ones_on_the_device() -> None:
    groups = [
        ProcessGroupInfo(name="0", ranks=(0, 1), desc="default_pg", backend="cpu:gloo,cuda:gloo"),
        ProcessGroupInfo(name="1", ranks=(0, 1), desc="dp", backend="cpu:gloo,cuda:nccl"),
    ]
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 12_000, seq=0), replace(coll(20_000, 22_000, seq=0), pg_name="1")],
        steps=[StepRecord(step=0, start_ns=0, end_ns=100_000)],
        groups=groups,
        main_thread=MAIN,
        device="cuda:0",
    )
    on_host = [n.attrs[Attr.HOST_OP] for n in by_name(build_nodes(cap), "c10d::allreduce_")]
    assert on_host == [True, False]  # gloo moves CUDA tensors on its worker threads; NCCL on the GPU


@pytest.mark.parametrize(
    ("device", "backend", "on_host"),
    [
        ("cpu", "cpu:gloo", True),
        ("cpu", "", True),
        ("cuda:0", "gloo", True),
        ("cuda:0", "cpu:gloo,cuda:gloo", True),
        ("cuda:0", "cuda:nccl", False),
        ("cuda:0", "cpu:gloo,cuda:nccl", False),
        ("cuda:0", "nccl", False),
        ("cuda:0", "cpu:gloo", False),  # no backend for CUDA tensors: not known, as NCCL
        ("cuda:0", "", False),
    ],
)
def test_where_a_collective_ran_follows_the_groups_backend_for_the_ranks_device(
    device: str, backend: str, on_host: bool
) -> None:
    assert comm_on_host(device, backend) is on_host


def full_capture(
    ops: list[OpRecord], host: dict[int, HostOpInfo], *, end_ns: int, comms: list[CommRecord] | None = None
) -> RankCapture:
    """One rank's full-level capture of one step ``[0, end_ns)``: Kineto's ``ops`` with the host trace's
    ``host`` (schemas and tensors, by correlation id)."""
    return RankCapture(
        rank=0,
        comms=comms or [],
        steps=[StepRecord(step=0, start_ns=0, end_ns=end_ns)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
        host_ops=host,
    )


def test_full_level_data_dependencies_follow_what_each_operator_wrote() -> None:
    ops = [
        OpRecord(name="aten::mm", start_ns=0, dur_ns=1_000, thread=MAIN, is_cpu=True, corr=1),
        OpRecord(name="aten::relu", start_ns=2_000, dur_ns=1_000, thread=MAIN, is_cpu=True, corr=2),
        OpRecord(name="aten::add", start_ns=4_000, dur_ns=1_000, thread=MAIN, is_cpu=True, corr=3),
    ]
    host = {
        1: HostOpInfo(schema="aten::mm(Tensor self, Tensor mat2) -> Tensor", inputs=(4, 5), outputs=(7,)),
        2: HostOpInfo(schema="aten::relu(Tensor self) -> Tensor", inputs=(7,), outputs=(13,)),
        3: HostOpInfo(schema="aten::add(...)", inputs=(13, 7), outputs=(14,)),
    }
    cap = full_capture(ops, host, end_ns=10_000)
    nodes = {n.name: n for n in build_nodes(cap)}
    assert nodes["aten::mm"].data_deps == ()
    assert nodes["aten::relu"].data_deps == (nodes["aten::mm"].node_id,)
    assert set(nodes["aten::add"].data_deps) == {nodes["aten::mm"].node_id, nodes["aten::relu"].node_id}
    assert nodes["aten::mm"].attrs[Attr.OP_SCHEMA].startswith("aten::mm(")


def test_full_level_time_of_a_scope_replaced_by_its_operators_is_that_scopes_work_not_untraced() -> None:
    # an autograd-engine scope has no schema: at the full level its operators are the nodes, and the
    # scope's own time around them (the engine, a compiled graph's kernels) is its work, as at ``ops``
    scope = "autograd::engine::evaluate_function: AddmmBackward0"
    ops = [
        OpRecord(name=scope, start_ns=10_000, dur_ns=50_000, thread=MAIN, is_cpu=True, corr=1),
        OpRecord(name="aten::mm", start_ns=20_000, dur_ns=10_000, thread=MAIN, is_cpu=True, corr=2),
        OpRecord(name="aten::add_", start_ns=70_000, dur_ns=10_000, thread=MAIN, is_cpu=True, corr=3),
    ]
    host = {
        1: HostOpInfo(schema="", inputs=(), outputs=()),
        2: HostOpInfo(schema="aten::mm(Tensor self, Tensor mat2) -> Tensor", inputs=(4, 5), outputs=(7,)),
        3: HostOpInfo(schema="aten::add_.Tensor(Tensor(a!) self, Tensor other)", inputs=(7,), outputs=(7,)),
    }
    cap = full_capture(ops, host, end_ns=100_000)
    main = main_thread_compute(cap)
    assert main == [
        (0, 10_000, UNTRACED_NAME),
        (10_000, 20_000, scope),
        (20_000, 30_000, "aten::mm"),
        (30_000, 60_000, scope),
        (60_000, 70_000, UNTRACED_NAME),
        (70_000, 80_000, "aten::add_"),
        (80_000, 100_000, UNTRACED_NAME),
    ]


def test_host_execution_trace_gives_schemas_and_tensor_ids(tmp_path: Path) -> None:
    et = {
        "schema": "1.1.1-chakra.0.0.4",
        "nodes": [
            {
                "id": 3,
                "name": "aten::mm",
                "attrs": [
                    {"name": "rf_id", "value": 9},
                    {"name": "op_schema", "value": "aten::mm(Tensor a) -> Tensor"},
                ],
                "inputs": {
                    "values": [[4, 5, 0, 16, 4, "cpu"], 2],
                    "shapes": [[4, 4], []],
                    "types": ["Tensor(float)", "Int"],
                },
                "outputs": {
                    "values": [[7, 8, 0, 16, 4, "cpu"]],
                    "shapes": [[4, 4]],
                    "types": ["Tensor(float)"],
                },
            },
            {"id": 1, "name": "[root]", "attrs": []},
        ],
    }
    p = tmp_path / "et.json"
    p.write_text(json.dumps(et))
    info = parse_host_et(p)
    assert list(info) == [9]
    assert (info[9].inputs, info[9].outputs, info[9].schema) == ((4,), (7,), "aten::mm(Tensor a) -> Tensor")


@pytest.mark.parametrize("content", ["{not json", json.dumps({"nodes": 3})])
def test_a_broken_host_execution_trace_is_an_error_naming_the_file(tmp_path: Path, content: str) -> None:
    p = tmp_path / "bad_et.json"
    p.write_text(content)
    with pytest.raises(CaptureError, match=r"bad_et\.json"):
        parse_host_et(p)


def test_record_function_ids_come_from_the_kineto_json(tmp_path: Path) -> None:
    p = tmp_path / "k.json"
    p.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"name": "aten::relu", "args": {"External id": 21, "Record function id": 1}},
                    {"name": "x", "args": {"External id": 22}},
                ]
            }
        )
    )
    assert rf_ids_from_chrome_trace(p) == {21: 1}


def test_kineto_thread_ids_are_matched_to_the_threads_that_made_the_calls() -> None:
    ops = [
        host_op("aten::mm", 0, 5_000, thread=1),
        host_op("c10d::allreduce_", 10_100, 9_000, thread=1),
        host_op("aten::add", 30_000, 1_000, thread=2),
    ]
    cap = RankCapture(
        rank=0,
        comms=[coll(10_000, 20_000, seq=0)],
        steps=[StepRecord(step=0, start_ns=0, end_ns=40_000)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
    )
    streams = {n.name: n.attrs[Attr.STREAM] for n in build_nodes(cap)[1:]}
    assert streams["aten::mm"] == streams["c10d::allreduce_"] == 0  # Kineto's thread 1 is the main thread
    assert streams["aten::add"] not in (0, COMM_STREAM_BASE)


def test_full_level_collectives_join_the_data_flow_through_their_c10d_operator() -> None:
    ops = [
        OpRecord(name="aten::mm", start_ns=0, dur_ns=5_000, thread=MAIN, is_cpu=True, rf_id=1, corr=1),
        OpRecord(
            name="c10d::allreduce_", start_ns=10_100, dur_ns=9_000, thread=MAIN, is_cpu=True, rf_id=2, corr=2
        ),
        OpRecord(name="aten::relu", start_ns=30_000, dur_ns=1_000, thread=MAIN, is_cpu=True, rf_id=3, corr=3),
    ]
    host = {
        1: HostOpInfo(schema="aten::mm(...)", inputs=(1, 2), outputs=(5,)),
        2: HostOpInfo(schema="c10d::allreduce_(...)", inputs=(5,), outputs=(5,)),
        3: HostOpInfo(schema="aten::relu(...)", inputs=(5,), outputs=(6,)),
    }
    cap = full_capture(ops, host, end_ns=40_000, comms=[coll(10_000, 20_000, seq=0)])
    nodes = {n.name: n for n in build_nodes(cap)}
    ar = nodes["c10d::allreduce_"]
    assert ar.node_type == NodeType.COMM_COLL and ar.attrs[Attr.RF_ID] == 2
    assert ar.data_deps == (nodes["aten::mm"].node_id,)  # reads what the matmul wrote
    assert nodes["aten::relu"].data_deps == (ar.node_id,)  # reads the reduced tensor


def test_a_recorder_collective_takes_a_worker_event_of_its_own_groups_threads_and_ends_inside_its_step() -> (
    None
):
    from skewlens.profiler.capture.build import FINISH_LAG_NS, RankCapture, build_nodes
    from skewlens.profiler.capture.records import CommRecord, OpRecord, StepRecord
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.vocab import Attr, CommType, NodeType

    ms = 1_000_000

    def fr(pg: str, seq: int, t: int) -> CommRecord:
        return CommRecord(
            node_type=NodeType.COMM_COLL, op="gloo:all_reduce", comm_type=CommType.ALL_REDUCE, pg_name=pg,
            seq=seq, src=-1, dst=-1, tag=0, numel=2048, dtype="float32", size_bytes=8192, start_ns=t,
            issue_end_ns=t, end_ns=t, is_async=True, thread=1, step=1,
        )  # fmt: skip

    def ev(thread: int, start: int, end: int) -> OpRecord:
        return OpRecord(
            name="gloo:all_reduce", start_ns=start, dur_ns=end - start, thread=thread, is_cpu=True
        )

    step = StepRecord(step=1, start_ns=0, end_ns=100 * ms)
    # tp ("3", threads 30/31) issued at 10 ms, dp ("1", threads 10/11) at 10.1 ms; dp's worker started
    # first, and tp's own event only at 12 ms: tp must not take dp's 60 ms event
    cap = RankCapture(
        rank=0, comms=[fr("3", 5, 10 * ms), fr("1", 7, 10 * ms + 100_000), fr("1", 8, 90 * ms)],
        steps=[step], groups=[ProcessGroupInfo(name=g, ranks=(0, 1)) for g in ("0", "1", "3")], main_thread=1,
        worker_events=[ev(10, 10 * ms + 50_000, 70 * ms), ev(30, 12 * ms, 13 * ms),
                       ev(11, 91 * ms, 100 * ms + FINISH_LAG_NS // 2)],
        group_threads={10: "1", 11: "1", 30: "3", 31: "3"},
    )  # fmt: skip
    ends = {
        (n.attrs[Attr.PG_NAME], n.attrs[Attr.SEQ]): (n.start_ns + n.dur_ns) // ms
        for n in build_nodes(cap)
        if n.node_type == NodeType.COMM_COLL
    }
    # the dp one whose worker event ended just after the step (gloo's finish lag) ends with the step
    assert ends == {("3", 5): 13, ("1", 7): 70, ("1", 8): 100}


def test_a_collective_of_another_thread_starting_inside_a_hooked_call_does_not_swap_the_threads() -> None:
    from skewlens.profiler.capture.build import kineto_thread_alias

    ckpt = 222  # a checkpoint thread (dcp.async_save) broadcasting through the hooks
    bcast = replace(coll(10_000, 20_000, seq=0), op="c10d::broadcast_", thread=ckpt)
    ops = [
        host_op("aten::mm", 1_000, 500, thread=1),
        host_op("aten::mm", 2_000, 500, thread=1),
        host_op("c10d::allreduce_", 11_000, 300, thread=1),  # the main thread's DDP all_reduce, meanwhile
        host_op("c10d::broadcast_", 12_000, 300, thread=2),
    ]
    # before: Kineto's thread 1 (the main thread's) was taken for the checkpoint thread, so every training
    # operator went to the checkpoint thread's stream and the main thread was all untraced time
    assert kineto_thread_alias([bcast], ops, MAIN) == {2: ckpt, 1: MAIN}
    # the checkpoint thread started after the profiler: Kineto has none of its operators
    assert kineto_thread_alias([bcast], ops[:3], MAIN) == {1: MAIN}


def test_the_main_threads_all_reduce_inside_a_metrics_threads_all_reduce_does_not_swap_the_threads() -> None:
    from skewlens.profiler.capture.build import kineto_thread_alias

    metrics = 333  # a metrics thread all_reducing loss counters on a group of its own, not profiled by Kineto
    calls = [replace(coll(10_000 + k * 20_000, 18_000 + k * 20_000, seq=k), thread=metrics) for k in range(3)]
    ops = [host_op("skewlens::step", 0, 100, thread=1)]
    for k in range(3):  # DDP's bucket all_reduce on the main thread, of the same name, inside each call
        ops += [host_op("aten::mm", 9_000 + k * 20_000, 500, thread=1)]
        ops += [host_op("c10d::allreduce_", 11_000 + k * 20_000, 300, thread=1)]
    # before: {1: 333}, every training operator on the metrics thread's stream
    assert kineto_thread_alias(calls, ops, MAIN) == {1: MAIN}
    assert kineto_thread_alias(calls, ops, MAIN, mark_thread=MAIN) == {1: MAIN}
    # a program that trains on a thread of its own (333 marks the steps and issues the collectives): its
    # operators stay with it
    assert kineto_thread_alias(calls, ops, MAIN, mark_thread=metrics) == {1: metrics}


def test_without_a_hooked_call_the_main_thread_is_the_one_that_marked_the_steps() -> None:
    from skewlens.profiler.capture.build import kineto_thread_alias

    # DDP on a GPU: its all_reduces come from C++ (no hooked call); the backward pass runs on autograd's
    # device thread (Kineto's 2), with more operators than the main thread (1), which marks the steps
    ops = [
        host_op("skewlens::step", 0, 100, thread=1),
        host_op("aten::mm", 1_000, 500, thread=1),
        *(
            host_op("autograd::engine::evaluate_function: MmBackward0", 2_000 + 100 * i, 50, thread=2)
            for i in range(5)
        ),
        host_op("skewlens::step", 9_000, 100, thread=1),
    ]
    assert kineto_thread_alias([], ops, MAIN) == {1: MAIN}
    assert kineto_thread_alias([], [o for o in ops if o.name != "skewlens::step"], MAIN) == {2: MAIN}


def test_a_backward_pass_on_autograds_device_thread_follows_the_call_and_the_main_thread_waits_for_it() -> (
    None
):
    # on a GPU the autograd engine runs backward() on a device thread of its own (Kineto's 2) while the
    # calling thread (1, which marks the steps) waits in the call, with no operator of its own
    engine = "autograd::engine::evaluate_function: MmBackward0"
    ops = [
        host_op("skewlens::step", 0, 100, thread=1),
        host_op("aten::mm", 1_000, 1_000, thread=1),
        host_op("aten::ones_like", 3_000, 500, thread=1),  # backward()'s seed, then the call waits
        host_op(engine, 4_000, 2_000, thread=2),
        host_op(engine, 6_500, 1_500, thread=2),
        host_op("Optimizer.step#SGD.step", 9_000, 1_000, thread=1),
        host_op("skewlens::step", 11_000, 100, thread=1),
    ]
    notes: list[str] = []
    cap = RankCapture(
        rank=0,
        comms=[],
        steps=[StepRecord(step=0, start_ns=0, end_ns=12_000)],
        groups=GROUPS,
        main_thread=MAIN,
        ops=ops,
    )
    nodes = build_nodes(cap, notes=notes)
    first, last = by_name(nodes, engine)
    seed = by_name(nodes, "aten::ones_like")[0]
    assert seed.node_id in first.ctrl_deps  # the pass starts after the call
    main = sorted((n for n in nodes if n.attrs.get(Attr.STREAM) == 0), key=lambda n: n.start_ns)
    # no untraced time on the main thread while it waited for the pass: a wait, not a fixed duration
    assert not [n for n in main if n.start_ns < 8_000 and n.start_ns + n.dur_ns > 4_000]
    after = next(n for n in main if n.start_ns >= 8_000)
    assert last.node_id in after.ctrl_deps and after.start_ns == 8_000  # the main thread goes on after it
    assert any("1 stretch(es) of backward passes on autograd's device thread" in n for n in notes), notes


def test_a_collectives_reduce_op_is_written_as_skl_reduce_op_and_none_where_it_is_not_known() -> None:
    nodes = build_nodes(
        one_step([replace(coll(10_000, 20_000, seq=0), reduce_op="max"), coll(30_000, 40_000, seq=1)])
    )
    maxed, unknown = by_name(nodes, "c10d::allreduce_")
    assert maxed.attrs[Attr.REDUCE_OP] == "max" and Attr.REDUCE_OP not in unknown.attrs


def isend(end_ns: int) -> CommRecord:
    """An isend to rank 1 issued at 10 µs (its call returned at 12 µs), waited for until ``end_ns``."""
    return replace(
        coll(10_000, end_ns, seq=0, is_async=True, issue_end=12_000),
        node_type=NodeType.COMM_SEND,
        op="c10d::send",
        comm_type=None,
        dst=1,
    )


def test_an_asynchronous_comm_node_records_when_its_call_returned_on_the_aligned_clock() -> None:
    # the hooks' issue end kept the call out of filler rows but never reached the trace, so a call that
    # blocked (gloo's isend) past its peer's end was read as idle (skl_return_ns, docs/store.md)
    nodes = build_nodes(one_step([isend(50_000), coll(52_000, 55_000, seq=1)], offset_ns=1_000))
    (send,) = by_name(nodes, "c10d::send")
    (blocking,) = by_name(nodes, "c10d::allreduce_")
    assert (send.start_ns, send.attrs[Attr.RETURN_NS]) == (11_000, 13_000)
    assert Attr.RETURN_NS not in blocking.attrs  # its node ends where its call returned


def ops_compute(comms: list[CommRecord], spans: dict[str, tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(name, start, duration) of each compute node built from one step (0-100 µs) of the main thread's
    operators ``spans`` (name: (start, duration)) around ``comms``, at the ops level."""
    ops = [host_op(name, start, dur) for name, (start, dur) in spans.items()]
    steps = [StepRecord(step=0, start_ns=0, end_ns=100_000)]
    cap = RankCapture(rank=0, comms=comms, steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops)
    return [(n.name, n.start_ns, n.dur_ns) for n in build_nodes(cap) if n.node_type == NodeType.COMP]


def test_operators_run_while_an_isend_is_in_flight_are_compute_not_untraced_time() -> None:
    # gloo's isend: c10d::send returns at once, but gloo:send (begun inside it) ends only when the wait
    # on it returned; the forwards the thread ran meanwhile (fwd1 with its aten::mm, fwd2) are its work
    spans = {"c10d::send": (10_000, 2_000), "gloo:send": (11_000, 79_000), "fwd1": (20_000, 30_000)}
    spans |= {"aten::mm": (21_000, 5_000), "fwd2": (55_000, 30_000)}
    comp = ops_compute([isend(90_000)], spans)
    # untraced: before the send, after its issue call, between the forwards, and after the send completed
    # (85-90 µs is the thread blocked on it, as untraced time ending just after an async op completed is)
    assert comp == [
        (UNTRACED_NAME, 0, 10_000),
        (UNTRACED_NAME, 12_000, 8_000),
        ("fwd1", 20_000, 30_000),
        (UNTRACED_NAME, 50_000, 5_000),
        ("fwd2", 55_000, 30_000),
        (UNTRACED_NAME, 90_000, 10_000),
    ]


def test_an_operator_inside_an_async_communication_call_is_part_of_the_call_not_compute() -> None:
    # c10d::send (outermost, the isend's call) ran aten::empty before gloo:send began: the call's own work,
    # as every operator inside a communication call is, whether or not a part of it outlives the call
    spans = {"c10d::send": (10_000, 2_000), "aten::empty": (10_200, 500), "gloo:send": (11_000, 79_000)}
    comp = ops_compute([isend(90_000)], spans | {"fwd1": (20_000, 30_000)})
    assert [c for c in comp if c[0] != UNTRACED_NAME] == [("fwd1", 20_000, 30_000)]


def test_at_the_full_level_an_operator_inside_a_communication_call_ending_with_its_scope_is_the_calls() -> (
    None
):
    # a module's scope (no schema: its operators are the nodes) ends as the isend it issued last returns;
    # the isend's call holds aten::empty, which is the call's work, not a node of the scope's own
    ops = [
        OpRecord(name="nn.Module: Stage", start_ns=0, dur_ns=12_000, thread=MAIN, is_cpu=True, corr=1),
        OpRecord(name="aten::mm", start_ns=1_000, dur_ns=8_000, thread=MAIN, is_cpu=True, corr=2),
        OpRecord(name="c10d::send", start_ns=10_000, dur_ns=2_000, thread=MAIN, is_cpu=True, corr=3),
        OpRecord(name="aten::empty", start_ns=10_500, dur_ns=500, thread=MAIN, is_cpu=True, corr=4),
    ]
    host = {
        2: HostOpInfo(schema="aten::mm(Tensor self, Tensor mat2) -> Tensor", inputs=(4, 5), outputs=(7,)),
        4: HostOpInfo(schema="aten::empty(SymInt[] size) -> Tensor", inputs=(), outputs=(8,)),
    }
    nodes = build_nodes(full_capture(ops, host, end_ns=40_000, comms=[isend(30_000)]))
    comp = [(n.name, n.start_ns, n.dur_ns) for n in nodes if n.node_type == NodeType.COMP]
    # the scope's own time around aten::mm is its work; 10-12 µs is the call's, 12-30 µs the send's
    assert comp == [
        ("nn.Module: Stage", 0, 1_000),
        ("aten::mm", 1_000, 8_000),
        ("nn.Module: Stage", 9_000, 1_000),
        (UNTRACED_NAME, 30_000, 10_000),
    ]


def test_a_hooked_call_paired_with_an_earlier_operator_leaves_kinetos_clock_where_the_rest_put_it() -> None:
    # Kineto's clock runs 7 µs behind the hooks'; each hooked all_reduce's operator spans its issue only
    # (10 µs from 2 µs in), so a blocking call, which returns after waiting, allows a wide range of offsets
    # and an asynchronous one a narrow one ([5, 15] µs). One call's operator is missing from Kineto: its
    # nearest is the previous call's, 900 µs before (it allows 905 µs and more)
    from skewlens.profiler.capture.build import kineto_clock_offset

    skew = 7_000
    comms: list[CommRecord] = []
    ops: list[OpRecord] = []
    for i in range(20):
        start = 1_000_000 + i * 1_000_000
        blocking = i % 2 == 0
        issue_end = None if blocking else start + 20_000
        comms.append(coll(start, start + 600_000, seq=i, is_async=not blocking, issue_end=issue_end))
        ops.append(host_op("c10d::allreduce_", start + 2_000 - skew, 10_000))
        ops.append(host_op("aten::mm", start + 700_000 - skew, 100_000))  # between this call and the next
    comms.append(coll(comms[-1].start_ns + 900_000, comms[-1].start_ns + 950_000, seq=20))
    off = kineto_clock_offset(comms, ops)
    assert 5_000 <= off <= 15_000  # where every correct pair allows it (was 300 µs: a median of middles)
    steps = [StepRecord(step=0, start_ns=0, end_ns=22_000_000)]
    cap = RankCapture(rank=0, comms=comms, steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops)
    mms = by_name(build_nodes(cap), "aten::mm")
    assert len(mms) == 20  # the operators between blocking calls were not moved into them and dropped


def _python_lines_building(steps: int) -> int:
    """Python lines run while building an ops-level window of ``steps`` 1 ms
    steps, each an operator, a blocking all_reduce and another operator on the main thread and one on a
    second thread."""
    comms, ops, marks = [], [], []
    for s in range(steps):
        t = s * 1_000_000
        comms.append(coll(t + 300_000, t + 400_000, seq=s, step=s))
        ops += [host_op("aten::mm", t + 100_000, 150_000), host_op("aten::add", t + 500_000, 100_000)]
        ops.append(host_op("aten::mul", t + 200_000, 50_000, thread=MAIN + 1))
        marks.append(StepRecord(step=s, start_ns=t, end_ns=t + 1_000_000))
    cap = RankCapture(rank=0, comms=comms, steps=marks, groups=GROUPS, main_thread=MAIN, ops=ops)
    lines = 0

    def count(_frame: object, event: str, _arg: object) -> Any:
        nonlocal lines
        lines += event == "line"
        return count

    before = sys.gettrace()  # (a coverage run's tracer: put back, or the rest of the run goes unmeasured)
    sys.settrace(count)
    try:
        nodes = build_nodes(cap)
    finally:
        sys.settrace(before)
    assert len(by_name(nodes, "aten::mm")) == steps and len(by_name(nodes, UNTRACED_NAME)) >= 2 * steps
    return lines


def test_building_a_window_costs_the_same_per_step_however_many_steps_it_has() -> None:
    # each step's untraced time was found by scanning every thread's operators of the whole window: the
    # save of an ops-level window took 11.0 s of CPU after 1,000 steps and 28.4 s after 2,000 (5.0 and
    # 10.1 s without); counted in Python lines run, not timed, so that the machine's load does not matter
    few, many = _python_lines_building(100), _python_lines_building(800)
    assert many / 800 < 1.5 * few / 100


def test_the_filler_of_a_step_begins_after_a_call_still_running_at_its_start() -> None:
    # the step mark is taken inside the optimizer's step, so a call begun in step 0 (95-104 ms) returns in
    # step 1: step 1's host time begins at its return, not at the mark (100 ms), under the call
    ms = 1_000_000
    steps = [
        StepRecord(step=0, start_ns=0, end_ns=100 * ms),
        StepRecord(step=1, start_ns=100 * ms, end_ns=200 * ms),
    ]
    comms = [
        coll(20 * ms, 30 * ms, seq=0),
        coll(95 * ms, 104 * ms, seq=1),
        coll(150 * ms, 160 * ms, seq=2, step=1),
    ]
    nodes = build_nodes(RankCapture(rank=0, comms=comms, steps=steps, groups=GROUPS, main_thread=MAIN))
    gaps = [(n.start_ns // ms, (n.start_ns + n.dur_ns) // ms) for n in nodes if n.name == GAP_NAME]
    assert gaps == [(0, 20), (30, 95), (104, 150), (160, 200)]


def waits_on_bucket(cap: RankCapture, none_of: tuple[str, ...]) -> None:
    """Assert that none of the nodes named ``none_of`` waits for the capture's one all_reduce."""
    nodes = build_nodes(cap)
    (bucket,) = by_name(nodes, "gloo:all_reduce")
    assert [n.name for n in nodes if n.name in none_of and bucket.node_id in n.ctrl_deps] == []
    assert [n.name for n in nodes if n.name in none_of], none_of


def test_ddps_wait_for_its_buckets_inside_a_reentrant_checkpoints_backward_is_no_operators_work() -> None:
    # reentrant activation checkpointing under DDP: the block's backward runs a backward of its own inside
    # CheckpointFunctionBackward, whose bucket hooks issue the all_reduce and whose end runs DDP's reducer
    # finalisation, waiting in C++ for the bucket. At the ops level the whole operator was one node, the
    # wait its work (2 gloo ranks: 8-41 ms a step, analyze read 0.01 ms of waiting where the all_reduces ran
    # 3-48 ms, and a replay slowing the other rank's compute doubled the wait)
    fr = replace(coll(15_000, 15_000, seq=1 << 40, is_async=True), op="gloo:all_reduce")
    worker = [host_op("gloo:all_reduce", 16_000, 24_000, thread=8)]  # completes at 40 us
    engine = "autograd::engine::evaluate_function: CheckpointFunctionBackward"
    ops = [
        host_op(engine, 2_000, 48_000),
        host_op("CheckpointFunctionBackward", 2_500, 47_000),
        host_op("aten::linear", 3_000, 5_000),  # the recomputed forward
        host_op("autograd::engine::evaluate_function: AddmmBackward0", 9_000, 5_000),
        host_op("torch.distributed.ddp.reducer::copy_bucket_to_grad", 40_300, 4_000),
        host_op("Optimizer.step#SGD.step", 51_000, 15_000),
    ]
    cap = one_step([fr], worker_events=worker, ops=ops)
    main = main_thread_compute(cap)
    assert not [n for n in main if n[0] < 40_000 and n[1] > 15_000]  # blocked: no node of work
    assert [n for n in main if n[0] >= 2_000 and n[1] <= 50_000] == [
        (2_000, 2_500, engine),
        (2_500, 3_000, "CheckpointFunctionBackward"),
        (3_000, 8_000, "aten::linear"),
        (8_000, 9_000, "CheckpointFunctionBackward"),
        (9_000, 14_000, "autograd::engine::evaluate_function: AddmmBackward0"),
        (14_000, 15_000, "CheckpointFunctionBackward"),
        (40_300, 44_300, "torch.distributed.ddp.reducer::copy_bucket_to_grad"),
        (44_300, 49_500, "CheckpointFunctionBackward"),
        (49_500, 50_000, engine),
    ]
    nodes = build_nodes(cap)
    (bucket,) = by_name(nodes, "gloo:all_reduce")
    (after,) = by_name(nodes, "torch.distributed.ddp.reducer::copy_bucket_to_grad")
    assert bucket.node_id in after.ctrl_deps  # what follows the wait waits for the bucket
    # the thread going on the very ns the bucket completed (Kineto's microseconds) waited all the same
    tie = [*ops[:4], host_op(ops[4].name, 40_000, 4_300), ops[5]]
    assert (40_000, 44_300, ops[4].name) in main_thread_compute(one_step([fr], worker_events=worker, ops=tie))
    # a bucket completing while an operator without children of its own runs (a matmul) overlapped it: the
    # matmul is whole and waits for nothing (the operators around it give way all the same, since gloo's
    # worker may record an end up to GLOO_FINISH_LAG_NS late, into the operator after a wait)
    mm = [*ops[:4], host_op("aten::mm", 30_000, 12_000), ops[5]]
    mm_cap = one_step([fr], worker_events=worker, ops=mm)
    assert (30_000, 42_000, "aten::mm") in main_thread_compute(mm_cap)
    mm_nodes = build_nodes(mm_cap)
    ((matmul,), (mm_bucket,)) = by_name(mm_nodes, "aten::mm"), by_name(mm_nodes, "gloo:all_reduce")
    assert mm_bucket.node_id not in matmul.ctrl_deps
    # nor was a bucket issued before the operator began (its transfer overlapping the next block's backward)
    early = replace(fr, start_ns=1_000, issue_end_ns=1_000)
    assert (2_000, 50_000, engine) in main_thread_compute(one_step([early], worker_events=worker, ops=ops))
    # nor where the innermost operator around the completion began after the issue, though those around it
    # began before (a later block's backward, 20-42 us, that the transfer overlapped): it is whole
    later_op = host_op(ops[3].name, 20_000, 22_000)
    later = [*ops[:3], later_op, host_op("aten::mm", 21_000, 3_000), ops[5]]
    waits_on_bucket(one_step([fr], worker_events=worker, ops=later), none_of=(later_op.name,))
    # nor inside an operator without children around both the issue and the completion: it is whole
    around = [*ops[:3], host_op("aten::mm", 14_500, 27_000), ops[5]]
    around_cap = one_step([fr], worker_events=worker, ops=around)
    waits_on_bucket(around_cap, none_of=("aten::mm",))
    assert (14_500, 41_500, "aten::mm") in main_thread_compute(around_cap)
    # nor is another thread's operator around the completion, with children, one the main thread waited in
    other = [
        *ops[:4],
        host_op("other", 10_000, 35_000, thread=77),
        host_op("aten::mm", 11_000, 2_000, thread=77),
    ]
    (node,) = by_name(
        build_nodes(one_step([fr], worker_events=worker, ops=sorted(other, key=lambda o: o.start_ns))),
        "other",
    )
    assert (node.start_ns, node.dur_ns) == (10_000, 35_000)


def test_a_collective_waited_for_by_a_later_wait_call_is_no_hidden_wait_where_it_completed() -> None:
    # an async all_reduce issued at 15 us inside CheckpointFunctionBackward, done at 40 us where none of its
    # operators runs, and waited for by work.wait() after the backward (50.5 us): the thread went on
    # working until that wait; with no wait call the same completion is a wait hidden in the operator
    issued = coll(15_000, 40_000, seq=0, is_async=True, issue_end=15_200)
    engine = "autograd::engine::evaluate_function: CheckpointFunctionBackward"
    ops = [
        host_op(engine, 2_000, 48_000),
        host_op("CheckpointFunctionBackward", 2_500, 47_000),
        host_op("aten::linear", 3_000, 5_000),
        host_op("Optimizer.step#SGD.step", 51_000, 8_000),
    ]
    wait = WaitRecord(
        name=WORK_WAIT_NAME, start_ns=50_500, end_ns=50_600, thread=MAIN, ident=0, step=0,
        issue_start_ns=15_000, issue_thread=MAIN,
    )  # fmt: skip
    waited = main_thread_compute(one_step([issued], ops=ops, waits=(wait,)))
    assert (2_000, 50_000, engine) in waited
    hidden = main_thread_compute(one_step([issued], ops=ops))
    assert (2_000, 50_000, engine) not in hidden
    assert not [n for n in hidden if n[0] < 40_000 and n[1] > 15_200]


def test_a_bucket_all_reduce_running_as_a_blocking_all_to_all_is_issued_keeps_its_own_worker_event() -> None:
    # µs, rank 0 of a 2-rank DLRM (DDP over a dense MLP, model-parallel tables exchanged with all_to_all):
    # DDP's bucket all_reduce is issued at 549, 0.2 ms before the backward's blocking all_to_all
    # (753-8,688); gloo runs the bucket 821-8,223 and the all_to_all's own event 8,234-8,660, both inside
    # the call. Before, an event of another kind inside a blocking call was hidden from every collective:
    # each bucket took the next step's event (the first bucket 549-17,000, a 7 ms all_reduce read as 16 ms)
    # and the last had no end.
    us = 1_000

    def bucket(t: int, seq: int) -> CommRecord:
        return replace(coll(t * us, t * us, seq=seq, is_async=True), op="gloo:all_reduce")

    def a2a(s: int, e: int, seq: int) -> CommRecord:
        return replace(
            coll(s * us, e * us, seq=seq), op="c10d::alltoall_base_", comm_type=CommType.ALL_TO_ALL
        )

    def ev(name: str, s: int, e: int) -> OpRecord:
        return host_op(name, s * us, (e - s) * us, thread=8)

    comms = [bucket(549, 1), a2a(753, 8_688, 2), bucket(12_000, 3), a2a(12_100, 14_000, 4), bucket(16_000, 5)]
    workers = [
        ev("gloo:all_reduce", 821, 8_223),
        ev("gloo:all_to_all", 8_234, 8_660),
        ev("gloo:all_reduce", 12_150, 12_800),
        ev("gloo:all_to_all", 12_810, 13_900),
        ev("gloo:all_reduce", 16_050, 17_000),
    ]
    cap = _on_gloo_threads(comms, workers, {8: "0"})
    ends = {n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "gloo:all_reduce")}
    assert ends == {1: 8_223 * us, 3: 12_800 * us, 5: 17_000 * us}
    calls = {
        n.attrs[Attr.SEQ]: n.start_ns + n.dur_ns for n in by_name(build_nodes(cap), "c10d::alltoall_base_")
    }
    assert calls == {2: 8_688 * us, 4: 14_000 * us}


def test_an_event_begun_in_a_blocking_call_before_its_own_is_taken_by_no_collective_issued_later() -> None:
    # µs: a blocking all_to_all 753-8,688 holds an all_reduce event 821-8,223 that began before its own event
    # (8,234-8,660): work issued before the call (a bucket whose recorder entry the window does not hold).
    # A bucket issued at 900, during the call, runs after the all_to_all (gloo runs a group's work in issue
    # order): its event is 8,700-9,000, not the earlier one, which would end it at 8,223, before its
    # predecessor's
    us = 1_000
    a2a = replace(coll(753 * us, 8_688 * us, seq=1), op="c10d::alltoall_base_", comm_type=CommType.ALL_TO_ALL)
    bucket = replace(coll(900 * us, 900 * us, seq=2, is_async=True), op="gloo:all_reduce")
    workers = [
        host_op("gloo:all_reduce", 821 * us, (8_223 - 821) * us, thread=8),
        host_op("gloo:all_to_all", 8_234 * us, (8_660 - 8_234) * us, thread=8),
        host_op("gloo:all_reduce", 8_700 * us, (9_000 - 8_700) * us, thread=8),
    ]
    cap = _on_gloo_threads([a2a, bucket], workers, {8: "0"})
    (node,) = by_name(build_nodes(cap), "gloo:all_reduce")
    assert node.start_ns + node.dur_ns == 9_000 * us


def test_a_tensor_id_another_thread_still_held_when_a_collective_began_is_reused_not_a_data_dependency() -> (
    None
):
    # a metrics thread all_reduces storage 9 over [2, 12) µs; the prefetch thread's broadcast of a new tensor
    # that the allocator gave the same id begins at 6 µs, inside it: no dependency between the two threads
    # (it held the prefetch thread behind the metrics one in replay). The main thread reading 9 at 20 µs,
    # after both ended, reads what the last of them wrote; and what the main thread itself wrote
    metrics, prefetch = 222, 333
    groups = [*GROUPS, *(ProcessGroupInfo(name=g, ranks=(0, 1)) for g in ("1", "2"))]

    def side(pg: str, start: int, end: int, thread: int) -> CommRecord:
        return replace(coll(start, end, seq=0), pg_name=pg, thread=thread, op="c10d::allreduce_")

    def op(name: str, start: int, dur: int, thread: int, rf: int) -> OpRecord:
        return OpRecord(name=name, start_ns=start, dur_ns=dur, thread=thread, is_cpu=True, rf_id=rf, corr=rf)

    ops = [
        op("aten::mm", 0, 5_000, MAIN, 1),
        op("c10d::allreduce_", 2_000, 10_000, metrics, 2),
        op("c10d::allreduce_", 6_000, 3_000, prefetch, 3),
        op("aten::add", 20_000, 1_000, MAIN, 4),
    ]
    host = {
        1: HostOpInfo(schema="aten::mm(...)", inputs=(1, 2), outputs=(5,)),
        2: HostOpInfo(schema="c10d::allreduce_(...)", inputs=(9,), outputs=(9,)),
        3: HostOpInfo(schema="c10d::allreduce_(...)", inputs=(9,), outputs=(9,)),
        4: HostOpInfo(schema="aten::add(...)", inputs=(5, 9), outputs=(6,)),
    }
    cap = replace(
        full_capture(
            ops,
            host,
            end_ns=40_000,
            comms=[side("1", 2_000, 12_000, metrics), side("2", 6_000, 9_000, prefetch)],
        ),
        groups=groups,
    )
    notes: list[str] = []
    nodes = build_nodes(cap, data_notes=notes)
    ar = {n.attrs[Attr.PG_NAME]: n for n in nodes if n.node_type == NodeType.COMM_COLL}
    add = next(n for n in nodes if n.name == "aten::add")
    assert ar["2"].data_deps == ()  # it named the metrics all_reduce
    assert set(add.data_deps) == {next(n for n in nodes if n.name == "aten::mm").node_id, ar["2"].node_id}
    assert notes == [reused_ids_note(1)]
    assert reused_ids_note(1) == (
        "1 data dependency between threads not drawn: the reader started before the writer ended, so the "
        "tensor id was reused, not the tensor"
    )


def test_a_program_that_trains_on_a_thread_of_its_own_keeps_its_operators_on_that_threads_stream() -> None:
    # the thread that marks the steps (333) is not the session's main thread: it issues the all_reduces and
    # Kineto's thread 1 runs its operators, with a c10d::allreduce_ inside each of its calls
    trainer = 333
    calls = [replace(coll(10_000 + k * 20_000, 18_000 + k * 20_000, seq=k), thread=trainer) for k in range(2)]
    ops = [host_op("skewlens::step", 0, 100, thread=1)]
    for k in range(2):
        ops += [host_op("aten::mm", 2_000 + k * 20_000, 1_000, thread=1)]
        ops += [host_op("c10d::allreduce_", 10_500 + k * 20_000, 300, thread=1)]
    nodes = build_nodes(replace(one_step(calls, ops=ops), mark_thread=trainer))
    comm_streams = {n.attrs[Attr.STREAM] for n in nodes if n.node_type == NodeType.COMM_COLL}
    assert len(comm_streams) == 1 and 0 not in comm_streams
    # both matmuls on the trainer's stream, beside its calls; the main thread's stream holds no operator
    assert [n.attrs[Attr.STREAM] for n in by_name(nodes, "aten::mm")] == [*comm_streams] * 2
    assert {n.name for n in nodes if n.attrs.get(Attr.STREAM) == 0} == {UNTRACED_NAME}


def test_without_a_known_marking_thread_the_one_that_marks_steps_pairs_with_the_main_thread() -> None:
    from skewlens.profiler.capture.build import kineto_thread_alias

    # the main thread marks the steps (Kineto's 1) and issues three all_reduces; in the third, a loader
    # thread's (Kineto's 2) all_reduce of the same name starts before the main thread's own operator
    calls = [coll(10_000 + k * 20_000, 18_000 + k * 20_000, seq=k) for k in range(3)]
    ops = [host_op("skewlens::step", 0, 100, thread=1)]
    ops += [host_op("c10d::allreduce_", 11_000 + k * 20_000, 300, thread=1) for k in range(3)]
    ops += [host_op("c10d::allreduce_", 50_500, 300, thread=2)]
    # two votes for 1 against one for 2: the marking thread, unknown (0), is the main thread's
    assert kineto_thread_alias(calls, ops, MAIN) == {1: MAIN}
    assert kineto_thread_alias(calls, ops, MAIN, mark_thread=MAIN) == {1: MAIN}


def _data_run(
    ops: list[OpRecord], host: dict[int, HostOpInfo], comms: list[CommRecord]
) -> tuple[list[TraceNode], list[str]]:
    """The nodes and the data-dependency notes of a full capture of one 40 µs step on groups 0-2."""
    groups = [*GROUPS, *(ProcessGroupInfo(name=g, ranks=(0, 1)) for g in ("1", "2"))]
    cap = replace(full_capture(ops, host, end_ns=40_000, comms=comms), groups=groups)
    notes: list[str] = []
    return build_nodes(cap, data_notes=notes), notes


def _rf_op(name: str, start: int, dur: int, thread: int, rf: int) -> OpRecord:
    return OpRecord(name=name, start_ns=start, dur_ns=dur, thread=thread, is_cpu=True, rf_id=rf, corr=rf)


def test_a_reader_on_another_thread_that_begins_as_the_writer_ends_depends_on_it_and_nothing_is_noted() -> (
    None
):
    # a metrics thread all_reduces storage 9 over [2, 12) µs; the main thread reads it at 12 µs, when it ended
    metrics = 222
    ops = [_rf_op("c10d::allreduce_", 2_000, 10_000, metrics, 2), _rf_op("aten::add", 12_000, 1_000, MAIN, 4)]
    host = {
        2: HostOpInfo(schema="c10d::allreduce_(...)", inputs=(9,), outputs=(9,)),
        4: HostOpInfo(schema="aten::add(...)", inputs=(9,), outputs=(6,)),
    }
    comm = replace(coll(2_000, 12_000, seq=0), pg_name="1", thread=metrics)
    nodes, notes = _data_run(ops, host, [comm])
    (ar,) = [n for n in nodes if n.node_type == NodeType.COMM_COLL]
    assert by_name(nodes, "aten::add")[0].data_deps == (ar.node_id,)
    assert notes == []


def test_a_threads_second_async_collective_on_a_tensor_its_first_still_holds_depends_on_the_first() -> None:
    # the main thread issues an async all_reduce of storage 9 on group 1 ([2, 20) µs), then, before it ended,
    # an async broadcast of 9 on group 2: one thread's order, no reused id (their streams differ, the
    # thread that issued them is one)
    ops = [
        _rf_op("c10d::allreduce_", 2_000, 500, MAIN, 2),
        _rf_op("c10d::broadcast_", 4_000, 500, MAIN, 3),
    ]
    host = {
        2: HostOpInfo(schema="c10d::allreduce_(...)", inputs=(9,), outputs=(9,)),
        3: HostOpInfo(schema="c10d::broadcast_(...)", inputs=(9,), outputs=(9,)),
    }
    first = replace(coll(2_000, 20_000, seq=0, is_async=True, issue_end=2_500), pg_name="1")
    second = replace(
        coll(4_000, 30_000, seq=0, is_async=True, issue_end=4_500),
        pg_name="2",
        op="c10d::broadcast_",
        comm_type=CommType.BROADCAST,
    )
    nodes, notes = _data_run(ops, host, [first, second])
    ar = {n.attrs[Attr.PG_NAME]: n for n in nodes if n.node_type == NodeType.COMM_COLL}
    assert ar["1"].attrs[Attr.STREAM] != ar["2"].attrs[Attr.STREAM]
    assert ar["2"].data_deps == (ar["1"].node_id,)
    assert notes == []
