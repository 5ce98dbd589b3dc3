"""Waits for async communication results: the hooks (one-rank gloo) and their nodes (synthetic records).

A wait is a COMP node named as :data:`skewlens.profiler.vocab.WAIT_NODE_NAMES` lists, spanning the wait
call on its thread, with a control dependency on the COMM node it waited for; it cuts the gaps around it
and splits an operator that encloses it (:mod:`skewlens.profiler.capture.waits`).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.capture.build import GAP_NAME, UNTRACED_NAME, RankCapture, build_nodes
from skewlens.profiler.capture.flight import FUNCTIONAL_REDUCE_SCATTER_OP
from skewlens.profiler.capture.records import END_UNKNOWN, CommRecord, OpRecord, StepRecord, WaitRecord
from skewlens.profiler.capture.waits import WAIT_TENSOR_NAME, WORK_WAIT_NAME
from skewlens.profiler.chakra_io import TraceNode, node_attrs, read_et
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import WAIT_NODE_NAMES, Attr, CommType, NodeType

MAIN, IDENT = 111, 7_000_111
MS = 1_000_000
GROUPS = [ProcessGroupInfo(name="0", ranks=(0, 1), desc="default_pg", backend="cpu:gloo")]
STEP = StepRecord(step=0, start_ns=0, end_ns=100 * MS)


def funcol(start: int, end: int, *, ident: int = IDENT) -> CommRecord:
    """A functional all_reduce as the flight recorder gives it: issued at ``start``, done at ``end``."""
    return CommRecord(
        node_type=NodeType.COMM_COLL, op="gloo:all_reduce", comm_type=CommType.ALL_REDUCE, pg_name="0",
        seq=start, src=-1, dst=-1, tag=0, numel=256, dtype="float32", size_bytes=1024, start_ns=start,
        issue_end_ns=start, end_ns=end, is_async=True, thread=MAIN, step=0, ident=ident,
    )  # fmt: skip


def hooked_async(start: int, issue_end: int, end: int) -> CommRecord:
    """``dist.all_gather_into_tensor(..., async_op=True)`` through the hooks."""
    return CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::_allgather_base_", comm_type=CommType.ALL_GATHER,
        pg_name="0", seq=start, src=-1, dst=-1, tag=0, numel=256, dtype="float32", size_bytes=1024,
        start_ns=start, issue_end_ns=issue_end, end_ns=end, is_async=True, thread=MAIN, step=0, ident=IDENT,
    )  # fmt: skip


def wait_tensor(start: int, end: int) -> WaitRecord:
    return WaitRecord(name=WAIT_TENSOR_NAME, start_ns=start, end_ns=end, thread=MAIN, ident=IDENT, step=0)


def work_wait(start: int, end: int, issued_at: int) -> WaitRecord:
    return WaitRecord(
        name=WORK_WAIT_NAME, start_ns=start, end_ns=end, thread=MAIN, ident=IDENT, step=0,
        issue_start_ns=issued_at, issue_thread=MAIN,
    )  # fmt: skip


def capture(
    comms: list[CommRecord], waits: list[WaitRecord], ops: list[OpRecord] | None = None
) -> RankCapture:
    return RankCapture(
        rank=0, comms=comms, steps=[STEP], groups=GROUPS, main_thread=MAIN, ops=ops or [], waits=waits
    )


def thread_nodes(nodes: list[TraceNode]) -> list[TraceNode]:
    return sorted(
        (n for n in nodes[1:] if n.attrs.get(Attr.STREAM_KIND) == "thread"), key=lambda n: n.start_ns
    )


def assert_thread_tiled(nodes: list[TraceNode], filler: str, *, gaps_ok: bool = False) -> None:
    """No two nodes overlap on the main thread; with ``gaps_ok`` False they cover the step exactly."""
    main = thread_nodes(nodes)
    assert all(a.start_ns + a.dur_ns <= b.start_ns for a, b in itertools.pairwise(main)), [
        (n.name, n.start_ns, n.dur_ns) for n in main
    ]
    if not gaps_ok:
        assert sum(n.dur_ns for n in main) == STEP.end_ns - STEP.start_ns
    assert any(n.name == filler for n in main)


def the(nodes: list[TraceNode], name: str) -> list[TraceNode]:
    return [n for n in nodes if n.name == name]


def test_the_node_names_are_the_vocabularys() -> None:
    assert {WAIT_TENSOR_NAME, WORK_WAIT_NAME} == WAIT_NODE_NAMES


def test_a_functional_collectives_wait_is_a_node_depending_on_it_that_cuts_the_compute_gap() -> None:
    coll = funcol(10 * MS, 50 * MS)
    nodes = build_nodes(capture([coll], [wait_tensor(20 * MS, 50 * MS + 30_000)]))
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (comm,) = the(nodes, "gloo:all_reduce")
    assert wait.node_type == NodeType.COMP and wait.attrs[Attr.STREAM] == 0
    assert (wait.start_ns, wait.dur_ns) == (20 * MS, 30 * MS + 30_000)
    assert comm.node_id in wait.ctrl_deps
    # the gaps around it: [0, 10 ms] and [10, 20 ms] before (the issue splits them), after it the rest
    gaps = [(n.start_ns, n.start_ns + n.dur_ns) for n in the(nodes, GAP_NAME)]
    assert gaps == [(0, 10 * MS), (10 * MS, 20 * MS), (50 * MS + 30_000, 100 * MS)]
    assert_thread_tiled(nodes, GAP_NAME)
    # the node after the wait depends on the wait (program order), not on the collective again
    after = next(n for n in thread_nodes(nodes) if n.start_ns == wait.start_ns + wait.dur_ns)
    assert after.ctrl_deps == (wait.node_id,)


def test_work_wait_depends_on_the_call_that_returned_the_work_and_others_keep_the_implicit_rule() -> None:
    waited = hooked_async(5 * MS, 6 * MS, 30 * MS)
    unwaited = hooked_async(7 * MS, 8 * MS, 20 * MS)  # its Work is never waited from Python
    nodes = build_nodes(capture([waited, unwaited], [work_wait(25 * MS, 31 * MS, issued_at=5 * MS)]))
    (wait,) = the(nodes, WORK_WAIT_NAME)
    first, second = sorted(the(nodes, "c10d::_allgather_base_"), key=lambda n: n.start_ns)
    assert first.node_id in wait.ctrl_deps
    assert (wait.start_ns, wait.dur_ns) == (25 * MS, 6 * MS)
    # on the thread, nothing but the wait depends on the waited one (the next call on the group's comm
    # stream follows it in queue order); on the unwaited one, the first node of the thread that starts
    # after it completed (as without waits: here the wait node itself)
    assert {n.node_id for n in thread_nodes(nodes) if first.node_id in n.ctrl_deps} == {wait.node_id}
    (after,) = [n for n in thread_nodes(nodes) if second.node_id in n.ctrl_deps]
    assert after.start_ns == min(n.start_ns for n in thread_nodes(nodes) if n.start_ns >= 20 * MS)
    assert_thread_tiled(nodes, GAP_NAME, gaps_ok=True)  # (the two issues are the comm nodes' own time)


def test_a_work_waited_on_by_another_thread_depends_on_the_call_that_issued_it() -> None:
    # the Work's call was made on the main thread; a helper thread (native id 222) waits on it
    waited = hooked_async(5 * MS, 6 * MS, 30 * MS)
    wait = WaitRecord(
        name=WORK_WAIT_NAME, start_ns=25 * MS, end_ns=31 * MS, thread=222, ident=7_000_222, step=0,
        issue_start_ns=5 * MS, issue_thread=MAIN,
    )  # fmt: skip
    nodes = build_nodes(capture([waited], [wait]))
    (node,) = the(nodes, WORK_WAIT_NAME)
    (comm,) = the(nodes, "c10d::_allgather_base_")
    assert comm.node_id in node.ctrl_deps


def test_a_wait_takes_the_collective_that_completed_last_while_it_waited_else_the_oldest_done() -> None:
    a = funcol(10 * MS, 20 * MS)
    b = funcol(12 * MS, 40 * MS)
    c = funcol(13 * MS, 14 * MS)
    late = funcol(16 * MS, 90 * MS)  # issued before the first wait, completes long after every wait
    waits = [
        wait_tensor(15 * MS, 40 * MS + 10_000),  # blocked until b completed (a completed meanwhile too)
        wait_tensor(41 * MS, 41 * MS + 5_000),  # returned at once: the oldest issued of those done
        wait_tensor(42 * MS, 42 * MS + 5_000),
    ]
    nodes = build_nodes(capture([a, b, c, late], waits))
    ids = {n.start_ns: n.node_id for n in the(nodes, "gloo:all_reduce")}
    got = [
        next(d for d in w.ctrl_deps if d in ids.values())
        for w in sorted(the(nodes, WAIT_TENSOR_NAME), key=lambda n: n.start_ns)
    ]
    assert got == [ids[12 * MS], ids[10 * MS], ids[13 * MS]]


def waited_issue(comms: list[CommRecord], wait: WaitRecord) -> int:
    """When the collective that ``wait``'s node depends on was issued."""
    nodes = build_nodes(capture(comms, [wait]))
    (w,) = the(nodes, WAIT_TENSOR_NAME)
    (target,) = [n for n in the(nodes, "gloo:all_reduce") if n.node_id in w.ctrl_deps]
    return target.start_ns


def test_a_collective_ending_within_the_clock_slack_after_the_wait_returned_is_what_it_blocked_on() -> None:
    # b's recorded end is 0.1 ms (within END_SLACK_NS) after the wait returned: clock error between the
    # recorder and the hooks, so b completed during the wait, last; a completed earlier in it
    a = funcol(10 * MS, 20 * MS)
    b = funcol(12 * MS, 40 * MS + 100_000)
    assert waited_issue([a, b], wait_tensor(15 * MS, 40 * MS)) == 12 * MS


def test_a_wait_by_whose_return_no_collective_had_completed_takes_the_earliest_issued() -> None:
    # both recorded ends lie long after the wait returned (they cannot be right): issue order decides
    a = funcol(10 * MS, 70 * MS)
    b = funcol(12 * MS, 80 * MS)
    assert waited_issue([b, a], wait_tensor(20 * MS, 25 * MS)) == 10 * MS


def test_a_collective_issued_at_the_instant_its_thread_began_the_wait_is_a_candidate() -> None:
    # the thread issued it, then waited: the same clock reading is still an issue before the wait
    assert waited_issue([funcol(20 * MS, 29 * MS)], wait_tensor(20 * MS, 30 * MS)) == 20 * MS


def test_a_collective_whose_recorded_end_is_after_its_waits_return_ends_there() -> None:
    a = funcol(10 * MS, 70 * MS)  # a later call's worker event taken for its end
    b = funcol(12 * MS, 20 * MS)
    waits = [wait_tensor(11 * MS, 15 * MS), wait_tensor(21 * MS, 21 * MS + 5_000)]
    nodes = build_nodes(capture([a, b], waits))
    ars = sorted(the(nodes, "gloo:all_reduce"), key=lambda n: n.start_ns)
    first, second = sorted(the(nodes, WAIT_TENSOR_NAME), key=lambda n: n.start_ns)
    assert ars[0].node_id in first.ctrl_deps  # nothing had completed by 15 ms: the earliest issued
    assert ars[0].start_ns + ars[0].dur_ns == 15 * MS  # it completed by the time its wait returned
    assert ars[1].node_id in second.ctrl_deps


def test_a_wait_only_takes_collectives_of_its_own_thread_issued_before_it() -> None:
    other = funcol(10 * MS, 30 * MS, ident=999)  # issued from another thread
    later = funcol(21 * MS, 25 * MS)  # issued after the wait began
    mine = funcol(11 * MS, 29 * MS)
    nodes = build_nodes(capture([other, later, mine], [wait_tensor(20 * MS, 30 * MS)]))
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (target,) = [n for n in the(nodes, "gloo:all_reduce") if n.node_id in wait.ctrl_deps]
    assert target.start_ns == 11 * MS


def test_a_wait_that_took_no_work_waited_for_no_collective_and_leaves_it_to_the_wait_that_blocked() -> None:
    # sequence parallelism's residual add: a second wait on a result waited for already returns at once
    # (6 us) and took nothing off torch's registry; the reduce_scatter issued before it (its end unknown,
    # as gloo's) is what the next wait blocked on for 2.7 ms
    scatter = replace(funcol(10 * MS, 10 * MS), end_ns=END_UNKNOWN, comm_type=CommType.REDUCE_SCATTER)
    again = replace(wait_tensor(11 * MS, 11 * MS + 6_000), took_work=False)
    blocked = wait_tensor(11 * MS + 8_000, 13 * MS + 700_000)
    nodes = build_nodes(capture([scatter], [again, blocked]))
    (rs,) = the(nodes, "gloo:all_reduce")
    first, second = sorted(the(nodes, WAIT_TENSOR_NAME), key=lambda n: n.start_ns)
    assert rs.node_id not in first.ctrl_deps and rs.node_id in second.ctrl_deps
    assert rs.start_ns + rs.dur_ns == 13 * MS + 700_000  # it ends where the wait that blocked on it returned


def test_a_wait_whose_collective_is_not_in_the_trace_is_kept_without_a_dependency() -> None:
    nodes = build_nodes(capture([], [wait_tensor(20 * MS, 30 * MS), work_wait(40 * MS, 41 * MS, 1)]))
    assert [(n.name, n.dur_ns) for n in the(nodes, WAIT_TENSOR_NAME) + the(nodes, WORK_WAIT_NAME)] == [
        (WAIT_TENSOR_NAME, 10 * MS),
        (WORK_WAIT_NAME, 1 * MS),
    ]
    assert_thread_tiled(nodes, GAP_NAME)


def test_waits_outside_the_recorded_steps_are_not_written() -> None:
    w = WaitRecord(name=WAIT_TENSOR_NAME, start_ns=1, end_ns=2, thread=MAIN, ident=IDENT, step=5)
    assert not the(build_nodes(capture([], [w])), WAIT_TENSOR_NAME)


def host_op(name: str, start: int, end: int) -> OpRecord:
    return OpRecord(name=name, start_ns=start, dur_ns=end - start, thread=1, is_cpu=True)


def test_at_the_ops_level_an_operator_enclosing_a_wait_is_replaced_by_its_children() -> None:
    coll = funcol(10 * MS, 50 * MS)
    ops = [
        host_op("aten::mm", 2 * MS, 9 * MS),
        host_op("aten::linear", 19 * MS, 55 * MS),  # the consumer of the async result: encloses the wait
        host_op("aten::t", 19 * MS + 100_000, 19 * MS + 200_000),
        host_op("_c10d_functional::wait_tensor", 20 * MS + 10_000, 50 * MS + 20_000),
        host_op("aten::addmm", 50 * MS + 100_000, 54 * MS),
    ]
    nodes = build_nodes(capture([coll], [wait_tensor(20 * MS, 50 * MS + 30_000)], ops))
    names = [n.name for n in thread_nodes(nodes) if n.name != UNTRACED_NAME]
    # its own time around them is its work, a node named after it (not untraced time)
    linear = "aten::linear"
    assert names == ["aten::mm", linear, "aten::t", linear, WAIT_TENSOR_NAME, linear, "aten::addmm", linear]
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (comm,) = the(nodes, "gloo:all_reduce")
    assert comm.node_id in wait.ctrl_deps
    assert_thread_tiled(nodes, UNTRACED_NAME)
    # the operator's time right before the wait is not taken for a wait on the collective (it has a node)
    before = [n for n in the(nodes, linear) if n.start_ns + n.dur_ns == wait.start_ns]
    assert before and before[0].start_ns == 19 * MS + 200_000


def test_an_operator_that_issued_a_collective_done_before_it_returned_but_waited_for_later_stays_whole() -> (
    None
):
    # FSDP2's prefetch: an all_gather issued (async_op=True) and done inside an operator, its Work.wait
    # after it. The thread did not wait inside the operator, so it keeps its time as one node (an operator
    # in which an asynchronous collective was issued and completed gives way to its operators only where
    # no wait node waited for it: Lightning's optimizer.step closure, DDP's wait in C++)
    ops = [
        host_op("prefetch", 2 * MS, 20 * MS),
        host_op("aten::mm", 8 * MS, 18 * MS),
        host_op("aten::add", 35 * MS, 40 * MS),
    ]
    nodes = build_nodes(
        capture([hooked_async(5 * MS, 6 * MS, 15 * MS)], [work_wait(30 * MS, 31 * MS, 5 * MS)], ops)
    )
    assert [(n.name, n.start_ns, n.dur_ns) for n in thread_nodes(nodes) if n.name != UNTRACED_NAME] == [
        ("prefetch", 2 * MS, 18 * MS),
        (WORK_WAIT_NAME, 30 * MS, MS),
        ("aten::add", 35 * MS, 5 * MS),
    ]


def test_at_the_ops_level_a_wait_tensor_operator_no_hook_saw_is_a_wait_too() -> None:
    coll = funcol(10 * MS, 30 * MS)
    ops = [
        host_op("aten::mm", 2 * MS, 9 * MS),
        host_op("my_consumer", 19 * MS, 35 * MS),
        host_op("_c10d_functional::wait_tensor", 20 * MS, 30 * MS + 10_000),  # torch.ops called directly
        host_op("aten::add", 31 * MS, 34 * MS),
    ]
    nodes = build_nodes(capture([coll], [], ops))
    names = [n.name for n in thread_nodes(nodes) if n.name != UNTRACED_NAME]
    mine = "my_consumer"
    assert names == ["aten::mm", mine, WAIT_TENSOR_NAME, mine, "aten::add", mine]
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (comm,) = the(nodes, "gloo:all_reduce")
    assert comm.node_id in wait.ctrl_deps and (wait.start_ns, wait.dur_ns) == (20 * MS, 10 * MS + 10_000)
    assert_thread_tiled(nodes, UNTRACED_NAME)


def test_a_wait_tensor_operator_traced_by_torch_compile_or_inside_another_is_no_wait() -> None:
    # a recompile inside the window: dynamo and AOTAutograd trace the graph's wait_tensor on fake tensors
    # (14 such operators a rank on 2 gloo ranks, 131 ms of tracing on rank 0), and the new graph's first
    # call dispatches its wait again through a Python dispatch mode. Each was a wait node, for no
    # collective: the recompiling step's exposed transfer was 74.0 ms against 17-24 ms around it
    coll = funcol(62 * MS, 79 * MS)
    ops = [
        host_op("dynamo", 5 * MS, 60 * MS),  # the frame compiled
        host_op("bytecode_tracing (dynamo_timed)", 6 * MS, 30 * MS),
        host_op(WAIT_TENSOR_NAME, 10 * MS, 20 * MS),
        host_op(WAIT_TENSOR_NAME, 12 * MS, 19 * MS),
        host_op("aot_trace_joint_graph (dynamo_timed)", 31 * MS, 50 * MS),
        host_op(WAIT_TENSOR_NAME, 32 * MS, 45 * MS),
        host_op("Torch-Compiled Region: 0/1", 61 * MS, 85 * MS),  # the new graph's first call
        host_op(WAIT_TENSOR_NAME, 70 * MS, 80 * MS),
        host_op("PythonDispatchMode", 70 * MS + 100_000, 79 * MS + 900_000),
        host_op(WAIT_TENSOR_NAME, 70 * MS + 200_000, 79 * MS + 800_000),
    ]
    nodes = build_nodes(capture([coll], [], ops))
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (comm,) = the(nodes, "gloo:all_reduce")
    assert comm.node_id in wait.ctrl_deps and (wait.start_ns, wait.dur_ns) == (70 * MS, 10 * MS)
    assert [(n.start_ns, n.dur_ns) for n in the(nodes, "dynamo")] == [(5 * MS, 55 * MS)]  # compute, whole
    assert_thread_tiled(nodes, UNTRACED_NAME)


TP_BACKWARD = "autograd::engine::evaluate_function: _FromTorchTensorBackward"


def tp_backward(*more: OpRecord) -> list[TraceNode]:
    """DTensor TP's backward on gloo (rank 0 of 2, the early rank): _FromTorchTensorBackward (10-40 ms)
    issues a functional all_reduce whose call (c10d::allreduce_) held the thread 14.3 ms until the peer
    arrived, then waited 0.2 ms in wait_tensor (36-37 ms); ``more``: other operators; the nodes built."""
    ops = [
        host_op(TP_BACKWARD, 10 * MS, 40 * MS),
        host_op("aten::clone", 10 * MS + 100_000, 11 * MS),
        host_op("_c10d_functional::all_reduce", 11 * MS, 35 * MS),
        host_op("c10d::allreduce_", 11 * MS + 100_000, 34 * MS),
        host_op("_c10d_functional::wait_tensor", 36 * MS, 37 * MS),
        *more,
    ]
    return build_nodes(capture([funcol(11 * MS + 100_000, 37 * MS)], [wait_tensor(36 * MS, 37 * MS)], ops))


def scope_times(nodes: list[TraceNode]) -> list[tuple[int, int]]:
    """(start, end) of the main thread's nodes of :data:`TP_BACKWARD`'s own work."""
    return sorted((n.start_ns, n.start_ns + n.dur_ns) for n in thread_nodes(nodes) if n.name == TP_BACKWARD)


def test_time_inside_a_collective_call_in_an_enclosing_scope_is_not_the_scopes_work() -> None:
    # the call's time is the collective's, not the scope's compute
    nodes = tp_backward()
    assert scope_times(nodes) == [(10 * MS, 10 * MS + 100_000), (35 * MS, 36 * MS), (37 * MS, 40 * MS)]
    # the call's time stays untraced (cut where the hook saw the collective issued)
    untraced = [(n.start_ns, n.start_ns + n.dur_ns) for n in the(nodes, UNTRACED_NAME)]
    assert [u for u in untraced if 11 * MS <= u[0] < 35 * MS] == [
        (11 * MS, 11 * MS + 100_000),
        (11 * MS + 100_000, 35 * MS),
    ]
    assert_thread_tiled(nodes, UNTRACED_NAME)


def test_a_collective_call_on_another_thread_does_not_cut_the_main_threads_scope() -> None:
    # a background thread (an asynchronous checkpoint's) issued an all_reduce at 38-39 ms while the main
    # thread ran the scope's own work: that time is still the scope's
    other = OpRecord(name="c10d::allreduce_", start_ns=38 * MS, dur_ns=MS, thread=2, is_cpu=True)
    assert scope_times(tp_backward(other)) == [
        (10 * MS, 10 * MS + 100_000),
        (35 * MS, 36 * MS),
        (37 * MS, 40 * MS),
    ]


def test_a_wait_tensor_operator_outside_the_recorded_steps_is_no_wait() -> None:
    ops = [host_op("_c10d_functional::wait_tensor", 150 * MS, 160 * MS)]  # the step ends at 100 ms
    assert not the(build_nodes(capture([funcol(140 * MS, 155 * MS)], [], ops)), WAIT_TENSOR_NAME)


def test_a_wait_tensor_operator_seeming_to_begin_just_before_its_hooked_wait_is_that_wait() -> None:
    # Kineto's clock put the operator 0.46 us before the Python call around it: taken for a second wait,
    # it held the thread for the whole wait again after the first, and the unmodified replay ran 5.9% long
    coll = funcol(10 * MS, 30 * MS)
    ops = [
        host_op("aten::mm", 2 * MS, 9 * MS),
        host_op("_c10d_functional::wait_tensor", 20 * MS - 460, 30 * MS - 8_000),
        host_op("aten::add", 31 * MS, 34 * MS),
    ]
    nodes = build_nodes(capture([coll], [wait_tensor(20 * MS, 30 * MS)], ops))
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    (comm,) = the(nodes, "gloo:all_reduce")
    assert comm.node_id in wait.ctrl_deps and (wait.start_ns, wait.dur_ns) == (20 * MS, 10 * MS)
    assert_thread_tiled(nodes, UNTRACED_NAME)
    # one that begins well before the hooked wait is an operator of its own (the op called directly)
    ops[1] = host_op("_c10d_functional::wait_tensor", 12 * MS, 15 * MS)
    nodes = build_nodes(capture([coll], [wait_tensor(20 * MS, 30 * MS)], ops))
    assert len(the(nodes, WAIT_TENSOR_NAME)) == 2


HOOK_SCRIPT = r"""
import json, os, socket, time, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._C._distributed_c10d import Work
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
originals = (funcol.wait_tensor, Work.wait)
recording = [True]
hooks = H.CommHooks(lambda: recording[0], lambda: 3, ddp=False)
hooks.install()
t = torch.ones(64)
dist.all_reduce(t)                                   # blocking: its internal wait is not a wait node
work = dist.all_reduce(t, async_op=True)
work.wait()                                          # recorded
work.wait()                                          # a second wait on the same Work: not recorded
y = funcol.all_reduce(t, "sum", dist.group.WORLD)    # an AsyncCollectiveTensor
z = y + 1                                            # its first use waits (wait_tensor): recorded
late = dist.all_reduce(t, async_op=True)             # issued in the window ...
recording[0] = False
late.wait()                                          # ... waited on after it: not recorded
dist.all_reduce(t, async_op=True).wait()             # outside the window
(funcol.all_reduce(t, "sum", dist.group.WORLD) * 2).sum()
recording[0] = True
comms = hooks.flush()
waits = hooks.waits.flush()
hooks.uninstall()
print(json.dumps({
    "comms": [dict(op=c.op, start=c.start_ns, thread=c.thread, is_async=c.is_async) for c in comms],
    "waits": [dict(name=w.name, start=w.start_ns, end=w.end_ns, step=w.step, thread=w.thread,
                   issue_start=w.issue_start_ns, issue_thread=w.issue_thread) for w in waits],
    "restored": (funcol.wait_tensor, Work.wait) == originals,
}))
dist.destroy_process_group()
"""


def run_script(script: str) -> Any:
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_hooks_record_the_first_wait_on_a_recorded_work_and_each_wait_tensor_in_the_window() -> None:
    data = run_script(HOOK_SCRIPT)
    assert data["restored"]
    waits = data["waits"]
    assert [w["name"] for w in waits] == [WORK_WAIT_NAME, WAIT_TENSOR_NAME]
    work_w, tensor_w = waits
    issued = [c for c in data["comms"] if c["is_async"]]
    assert len(issued) == 2  # the Work waited on, and one waited on after the window
    assert (work_w["issue_start"], work_w["issue_thread"]) == (issued[0]["start"], issued[0]["thread"])
    assert issued[0]["start"] < work_w["start"] <= work_w["end"] <= tensor_w["start"] <= tensor_w["end"]
    assert tensor_w["issue_start"] == -1 and all(w["step"] == 3 for w in waits)


SECOND_WAIT_SCRIPT = r"""
import json, os, socket, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
hooks = H.CommHooks(lambda: True, lambda: 0, ddp=False)
hooks.install()
y = funcol.all_reduce(torch.ones(64), "sum", dist.group.WORLD)
funcol.wait_tensor(y.elem)  # takes its Work off torch's registry
funcol.wait_tensor(y.elem)  # its result waited for already: takes none
hooks.flush()
waits = hooks.waits.flush()
hooks.uninstall()
print(json.dumps([[w.name, w.took_work] for w in waits]))
dist.destroy_process_group()
"""


def test_the_hooks_record_that_a_second_wait_tensor_on_a_result_already_waited_for_took_no_work() -> None:
    assert run_script(SECOND_WAIT_SCRIPT) == [[WAIT_TENSOR_NAME, True], [WAIT_TENSOR_NAME, False]]


def test_a_wait_tensor_took_work_where_the_registry_shrank_or_where_torch_has_no_registry_count() -> None:
    # torch without c10d._get_work_registry_size cannot say: every wait_tensor is taken to wait for a
    # collective (the rule before the count), never for none
    from skewlens.profiler.capture.waits import WaitHooks

    sizes = iter([3, 2, 2, 2])  # (before, after) of two waits: the first took one off, the second none
    hooks = WaitHooks(lambda: True, lambda: 0)
    for pending in (lambda: next(sizes), lambda: next(sizes), None):
        hooks._wrap_tensor(lambda t: t, pending, lambda: False)(object())
    assert [w.took_work for w in hooks.flush()] == [True, False, True]


class _Handle:
    """A Work or future: weak references to it, no attributes (as pybind's)."""

    __slots__ = ("__weakref__",)


def test_a_wait_on_a_future_of_a_recorded_work_or_one_chained_from_it_is_the_works_one_wait() -> None:
    from skewlens.profiler.capture.waits import WaitHooks

    hooks = WaitHooks(lambda: True, lambda: 4)
    no = lambda: False  # noqa: E731 (not compiling)
    wait = hooks._wrap_wait(lambda self: None, no)
    get_future = hooks._wrap_stands_for(lambda self: _Handle(), no)
    # a callback runs at once in then where the future is done: here it waits on it, as torch's docs write
    then = hooks._wrap_stands_for(lambda self, cb: (cb and cb(self), _Handle())[1], no, callback=True)
    collect_all = hooks._wrap_stands_for(lambda futures: _Handle(), no, of_list=True)
    a, b, c, d = _Handle(), _Handle(), _Handle(), _Handle()
    for work, start in ((a, 100), (b, 200), (c, 300), (d, 400)):
        hooks.issued(work, start, 7)
    chained = then(then(get_future(a), wait), id)  # the callback's wait is not a's: it runs once done
    program_waits_from = time.time_ns()
    wait(chained)  # work.get_future().then(cb).then(cb2).wait(): a's wait
    wait(a)  # a second wait on it, through the Work: not recorded
    wait(get_future(a))  # nor through another of its futures
    wait(get_future(b))  # work.get_future().wait(): b's
    wait(_Handle())  # a future of no recorded call: not recorded
    wait(collect_all([get_future(c), _Handle(), then(get_future(d), id)]))  # torch.futures.wait_all
    wait(d)
    waits = hooks.flush()
    assert [(w.name, w.issue_start_ns, w.issue_thread, w.step) for w in waits] == [
        (WORK_WAIT_NAME, start, 7, 4) for start in (100, 200, 300, 400)
    ]
    # collect_all's wait is c's, spanning the call, then d's, of no time, at its return
    assert waits[2].start_ns <= waits[2].end_ns == waits[3].start_ns == waits[3].end_ns
    # a's is where the program waited, after then() had run the callback (whose wait was none)
    assert waits[0].start_ns >= program_waits_from


def test_a_future_of_an_object_that_took_a_dropped_works_place_stands_for_no_call() -> None:
    # a Work of a recorded call dropped unwaited (fire and forget) frees its id, which CPython gives the next
    # object of its size: a Work or future of a call the hooks did not record. A future got from that one
    # is not the dropped call's, so waiting on it records no wait (the registry's weak reference tells them
    # apart)
    from skewlens.profiler.capture.waits import WaitHooks

    hooks = WaitHooks(lambda: True, lambda: 4)
    no = lambda: False  # noqa: E731 (not compiling)
    wait = hooks._wrap_wait(lambda self: None, no)
    get_future = hooks._wrap_stands_for(lambda self: _Handle(), no)
    dropped = _Handle()
    hooks.issued(dropped, 100, 7)
    freed = id(dropped)
    del dropped
    other = _Handle()
    if id(other) != freed:
        pytest.skip("this interpreter did not reuse the dropped Work's id")
    wait(get_future(other))
    assert hooks.flush() == []


FUTURE_SCRIPT = r"""
import json, os, socket, time, torch, torch.distributed as dist
from torch._C._distributed_c10d import Work
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
F = torch._C.Future
patched = lambda: (Work.wait, Work.get_future, F.wait, F.then, torch._C._collect_all)
originals = patched()
hooks = H.CommHooks(lambda: True, lambda: 3, ddp=False)
hooks.install()
t = torch.ones(64)
a = dist.all_reduce(t, async_op=True)
fut = a.get_future().then(lambda f: f.wait()[0].div_(2)).then(lambda f: f.value())  # f.wait(): no wait
fut.wait()                                           # a's wait
a.wait()                                             # waited for already
b = dist.all_reduce(t, async_op=True)
b.get_future().wait()                                # b's
c = dist.all_reduce(t, async_op=True)
d = dist.all_reduce(t, async_op=True)
done = torch.futures.Future()
done.set_result(0)
torch.futures.wait_all([c.get_future(), done, d.get_future()])   # c's, then d's
done.wait()                                          # a future of no collective
e = dist.all_reduce(t, async_op=True)
e.get_future().add_done_callback(lambda f: f.wait())  # run once done (here, or on gloo's thread): no wait
time.sleep(0.2)                                      # (done, and the callback run, by now)
e_waited_from = time.time_ns()
e.wait()                                             # e's
comms = hooks.flush()
waits = hooks.waits.flush()
hooks.uninstall()
print(json.dumps({
    "issues": [[c.start_ns, c.thread] for c in comms if c.is_async],
    "waits": [[w.name, w.issue_start_ns, w.thread] for w in waits],
    "last_wait_from": waits[-1].start_ns if waits else 0,
    "e_waited_from": e_waited_from,
    "restored": patched() == originals,
}))
dist.destroy_process_group()
"""


def test_the_hooks_record_a_wait_on_a_recorded_works_future_chained_or_collected_as_that_works_wait() -> None:
    data = run_script(FUTURE_SCRIPT)
    assert data["restored"]
    assert len(data["issues"]) == 5
    # each on the main thread, which issued them: not a's in its callback (on gloo's thread, or at once)
    assert data["waits"] == [[WORK_WAIT_NAME, start, thread] for start, thread in data["issues"]]
    # e's is the program's e.wait(), not the wait its add_done_callback's callback made once e was done
    assert data["last_wait_from"] >= data["e_waited_from"]


# ---- real captures (2 gloo ranks) ------------------------------------------------------------------------

#: Rank 1's sleep before the collective rank 0 waits for, each step. The checks ask for waits over half of
#: it; at 40 ms a rank 0 descheduled for 20 ms (2 loaded cores) could fail them, at 100 ms it takes 50 ms.
STRAGGLER_MS = 100
TP_SCRIPT = """
import os, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(STEPS):
    x = torch.randn(32, 256)
    if rank == 1:
        time.sleep(STRAGGLER_MS / 1000)  # the straggler: late for the forward's all_reduce
    model(x).square().mean().backward()  # the row-parallel output's all_reduce is waited for in square()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)  # (torch 2.13 can abort at exit after gloo functional collectives; the trace is saved)
"""
FSDP_SCRIPT = """
import os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(LAYERS)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(STEPS):
    for layer in model:  # explicit prefetch: async_op=True all_gathers; each pre-forward waits (Work.wait)
        layer.unshard(async_op=True)
    model(torch.randn(32, 128)).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)
"""
SP_SCRIPT = """
import os, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
class Block(torch.nn.Module):  # sequence parallelism: activations sharded on the sequence dim
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(256, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
    def forward(self, tok):
        x = self.emb(tok)
        return x + self.down(torch.relu(self.up(self.norm(x))))  # the residual add waits twice
model = Block()
parallelize_module(model, mesh, {
    "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "up": ColwiseParallel(input_layouts=Shard(1)),
    "down": RowwiseParallel(output_layouts=Shard(1)),
})
if rank == 1:  # the straggler: late for the down projection's reduce_scatter
    model.down.register_forward_pre_hook(lambda *_: time.sleep(STRAGGLER_MS / 1000))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(STEPS):
    model(torch.randint(0, 256, (4, 32))).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)
"""
STEPS, ACTIVE, LAYERS = 5, 3, 3


def _profile_script(work: Path, script: str, level: str) -> Path:
    from capture_helpers import profile

    path = work / "train.py"
    path.write_text(script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(path)]
    out = work / "run"
    res = profile(out, level=level, steps=f"1:1:{ACTIVE}", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _filled(script: str) -> str:
    """A script with this module's constants in place of their names."""
    for name, value in (("STRAGGLER_MS", STRAGGLER_MS), ("STEPS", STEPS), ("LAYERS", LAYERS)):
        script = script.replace(name, str(value))
    return script


def _nodes(run: Path, rank: int) -> list[Any]:
    return list(read_et(run / f"rank-{rank}.et").nodes)


def _no_overlap_on_threads(nodes: list[Any]) -> None:
    by_stream: dict[int, list[tuple[int, int, str]]] = {}
    for n in nodes:
        a = node_attrs(n)
        if a and a.get(Attr.STREAM_KIND) == "thread":
            by_stream.setdefault(a[Attr.STREAM], []).append(
                (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS], n.name)
            )
    for iv in by_stream.values():
        iv.sort()
        assert all(x[1] <= y[0] for x, y in itertools.pairwise(iv)), [
            (x, y) for x, y in itertools.pairwise(iv) if x[1] > y[0]
        ][:3]


@pytest.fixture(scope="module", params=["collectives", "ops"])
def tp_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile_script(
        tmp_path_factory.mktemp(f"tp-waits-{request.param}"), _filled(TP_SCRIPT), request.param
    )


@pytest.mark.slow
def test_dtensor_waits_depend_on_the_all_reduce_and_the_early_rank_waits_out_the_straggler(
    tp_run: Path,
) -> None:
    median_wait = {}
    for r in (0, 1):
        nodes = _nodes(tp_run, r)
        by_id = {n.id: n for n in nodes}
        waits = [n for n in nodes if n.name == WAIT_TENSOR_NAME]
        assert len(waits) == ACTIVE, [n.name for n in nodes]  # one forward all_reduce a step
        for w in waits:
            assert w.type == NodeType.COMP
            (target,) = [by_id[d] for d in w.ctrl_deps if by_id[d].type == NodeType.COMM_COLL]
            assert target.name == "gloo:all_reduce"
            assert node_attrs(target)[Attr.COMM_TYPE] == CommType.ALL_REDUCE
        assert len({d for w in waits for d in w.ctrl_deps if by_id[d].type == NodeType.COMM_COLL}) == ACTIVE
        _no_overlap_on_threads(nodes)
        durs = sorted(node_attrs(w)[Attr.DUR_NS] for w in waits)
        median_wait[r] = durs[len(durs) // 2]
    # rank 0 reaches the all_reduce ~STRAGGLER_MS before rank 1 and blocks in the wait meanwhile
    assert median_wait[0] > STRAGGLER_MS * 1_000_000 / 2, median_wait
    assert median_wait[1] < median_wait[0]
    load_validated(tp_run)


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile_script(tmp_path_factory.mktemp("sp-waits"), _filled(SP_SCRIPT), "collectives")


@pytest.mark.slow
def test_a_sequence_parallel_reduce_scatter_is_taken_by_the_wait_that_blocked_on_it(sp_run: Path) -> None:
    # the residual add waits twice: on the embedding's result again (at once), then on the down
    # projection's reduce_scatter, which rank 0 reaches STRAGGLER_MS before rank 1
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for r in (0, 1):
        nodes = _nodes(sp_run, r)
        by_id = {n.id: n for n in nodes}
        for n in nodes:
            a = node_attrs(n)
            if n.type == NodeType.COMM_COLL:
                spans.setdefault((a[Attr.PG_NAME], a[Attr.SEQ]), []).append(
                    (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS])
                )
        if r == 0:
            waited = [
                node_attrs(w)[Attr.DUR_NS]
                for w in sorted(nodes, key=lambda n: node_attrs(n).get(Attr.START_NS, -1))
                if w.name == WAIT_TENSOR_NAME
                for d in w.ctrl_deps
                if node_attrs(by_id[d]).get(Attr.COMM_TYPE) == CommType.REDUCE_SCATTER
                and by_id[d].name == FUNCTIONAL_REDUCE_SCATTER_OP
            ]
            # three a step, in program order: the embedding's (forward), the down projection's, and the
            # backward's. The down projection's blocked on the late member every step; the others are
            # short, but no bound on them holds: under load (CI's 2 shared cores) a descheduled rank 1 was
            # 26 ms late for one of them, which a count of the waits above STRAGGLER_MS / 2 took for a
            # fourth blocked wait
            assert len(waited) == 3 * ACTIVE, waited
            down = waited[1::3]
            assert all(d > STRAGGLER_MS * 1_000_000 / 2 for d in down), waited
    # no member of any collective ends before another member began (one host: one clock)
    bad = {k: v for k, v in spans.items() if min(e for _, e in v) < max(s for s, _ in v)}
    assert len(spans) > 0 and not bad, bad


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile_script(tmp_path_factory.mktemp("fsdp-waits"), _filled(FSDP_SCRIPT), "collectives")


#: Each rank's compute between issuing its all_reduce and waiting on the future chained from its Work;
#: rank 1 issues STRAGGLER_MS late, so rank 0 then blocks about STRAGGLER_MS - OVERLAP_MS, and rank 1's
#: all_reduce completes (its callback runs, on gloo's thread) before it waits.
OVERLAP_MS = 50
FUTURE_SCRIPT_2 = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
w = torch.nn.Parameter(torch.randn(4096))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(STEPS):
    (w * 2).sum().backward()
    if rank == 1:
        time.sleep(STRAGGLER_MS / 1000)
    work = dist.all_reduce(w.grad, async_op=True)
    got = work.get_future()  # held: the callback's f is this object (a temporary's would be a new one)
    fut = got.then(lambda f: f.wait()[0].div_(world))  # as torch.futures documents
    time.sleep(OVERLAP_MS / 1000)  # compute that lets gloo's thread run the callback meanwhile (no GIL)
    if step % 2:
        torch.futures.wait_all([fut])
    else:
        fut.wait()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)
"""


@pytest.fixture(scope="module")
def future_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = _filled(FUTURE_SCRIPT_2).replace("OVERLAP_MS", str(OVERLAP_MS))
    return _profile_script(tmp_path_factory.mktemp("future-waits"), script, "collectives")


@pytest.mark.slow
def test_a_wait_on_a_future_chained_from_a_work_is_its_wait_and_the_compute_before_it_no_wait(
    future_run: Path,
) -> None:
    """``work.get_future().then(cb)`` waited for by ``fut.wait()`` or ``torch.futures.wait_all``, at the
    collectives level. Before, no wait was recorded: the hidden-wait rule took rank 0's compute between
    issue and wait (OVERLAP_MS) for waiting too, its exposed wait and transfer about STRAGGLER_MS a step."""
    from skewlens.analysis.breakdown import analyze_breakdown
    from skewlens.analysis.index import build_index
    from skewlens.profiler.store import load_run

    for r in (0, 1):
        nodes = _nodes(future_run, r)
        by_id = {n.id: n for n in nodes}
        waits = [n for n in nodes if n.name == WORK_WAIT_NAME]
        assert len(waits) == ACTIVE, [n.name for n in nodes]
        targets = {d for w in waits for d in w.ctrl_deps if by_id[d].type == NodeType.COMM_COLL}
        assert len(targets) == ACTIVE and all(by_id[d].name == "c10d::allreduce_" for d in targets)
        # on the main thread, where the compute is: not the callback's f.wait() on gloo's thread
        main = {node_attrs(n)[Attr.STREAM] for n in nodes if n.name == GAP_NAME}
        assert {node_attrs(w)[Attr.STREAM] for w in waits} <= main
        _no_overlap_on_threads(nodes)
        if r == 0:  # it blocked for the rest of rank 1's lateness
            assert all(
                node_attrs(w)[Attr.DUR_NS] > (STRAGGLER_MS - OVERLAP_MS) * 1_000_000 / 2 for w in waits
            )
    rows = [x for x in analyze_breakdown(build_index(load_run(future_run))) if x.rank == 0]
    assert len(rows) == ACTIVE
    for (
        x
    ) in rows:  # its compute is compute (before, 1.0-5.3 ms, and 96-100 ms of exposed wait), its block wait
        assert x.compute_ns > OVERLAP_MS * 1_000_000 * 3 // 4, x
        assert x.exposed_wait_ns + x.exposed_transfer_ns > (STRAGGLER_MS - OVERLAP_MS) * 1_000_000 / 2, x
    load_validated(future_run)


@pytest.mark.slow
def test_fsdp2_work_waits_depend_on_their_async_all_gathers(fsdp_run: Path) -> None:
    for r in (0, 1):
        nodes = _nodes(fsdp_run, r)
        by_id = {n.id: n for n in nodes}
        waits = [n for n in nodes if n.name == WORK_WAIT_NAME]
        assert len(waits) == LAYERS * ACTIVE, [n.name for n in nodes]
        targets = set()
        for w in waits:
            (t,) = [by_id[d] for d in w.ctrl_deps if by_id[d].type == NodeType.COMM_COLL]
            a = node_attrs(t)
            assert a[Attr.COMM_TYPE] == CommType.ALL_GATHER and a[Attr.STREAM_KIND] == "comm"
            assert a[Attr.START_NS] < node_attrs(w)[Attr.START_NS]
            targets.add(t.id)
        assert len(targets) == len(waits)  # each wait on its own all_gather
        _no_overlap_on_threads(nodes)
    load_validated(fsdp_run)


def test_a_recorder_collective_whose_end_no_worker_event_showed_ends_at_the_wait_on_it() -> None:
    # the 2-D mesh: a functional all_reduce the flight recorder gave, whose gloo worker event the capture did
    # not see, was written as done at its issue; its wait_tensor's 3.78 ms then counted as the wait's own
    # work where 3.25 ms of it was waiting for a peer
    from skewlens.profiler.capture.flight import merge, parse_dump

    entry = {
        "record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 5,
        "p2p_seq_id": 0, "op_id": 5, "profiling_name": "gloo:all_reduce", "time_created_ns": 10 * MS,
        "input_sizes": [[256]], "input_dtypes": ["Float"], "output_sizes": [[256]],
        "output_dtypes": ["Float"], "state": "completed", "thread_id": str(IDENT),
    }  # fmt: skip
    _hooked, extra, _left_out = merge(parse_dump(json.dumps({"entries": [entry]})), [], [STEP], thread=MAIN)
    (coll,) = extra
    nodes = build_nodes(capture([coll], [wait_tensor(20 * MS, 50 * MS)]))
    (comm,) = the(nodes, "gloo:all_reduce")
    (wait,) = the(nodes, WAIT_TENSOR_NAME)
    assert comm.node_id in wait.ctrl_deps
    assert (comm.start_ns, comm.start_ns + comm.dur_ns) == (10 * MS, 50 * MS)


def test_a_hooked_async_reduce_scatter_whose_work_has_no_future_ends_at_the_work_wait_on_it() -> None:
    # gloo's reduce_scatter Works (reduce_scatter_tensor / _single / the list form, torch 2.13) have no
    # future, so the hooks record no end; the real replay issues DTensor's reduce_scatters so. Before, the
    # node was moved to its issue end with duration 0 and its Work.wait (keyed by the call's start) found
    # nothing: 2 gloo ranks, rank 1 20 ms late, rank 0's c10d::wait of 20.5 ms depended on no collective
    from dataclasses import replace

    rs = replace(
        hooked_async(5 * MS, 6 * MS, -1),
        op="c10d::_reduce_scatter_base_",
        comm_type=CommType.REDUCE_SCATTER,
    )
    nodes = build_nodes(capture([rs], [work_wait(8 * MS, 30 * MS, issued_at=5 * MS)]))
    (comm,) = the(nodes, "c10d::_reduce_scatter_base_")
    (wait,) = the(nodes, WORK_WAIT_NAME)
    assert comm.node_id in wait.ctrl_deps
    assert (comm.start_ns, comm.start_ns + comm.dur_ns) == (5 * MS, 30 * MS)


def test_an_async_collective_with_no_end_and_no_wait_stays_a_zero_length_node_at_its_issue_end() -> None:
    nodes = build_nodes(capture([hooked_async(5 * MS, 6 * MS, -1)], []))
    (comm,) = the(nodes, "c10d::_allgather_base_")
    assert (comm.start_ns, comm.dur_ns) == (6 * MS, 0)


RS_SCRIPT = """
import os, time, warnings, torch, torch.distributed as dist
warnings.simplefilter("ignore")  # reduce_scatter_tensor is deprecated in torch 2.13
dist.init_process_group("gloo")
p = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([p], lr=0.1)
for step in range(STEPS):
    if dist.get_rank() == 1:
        time.sleep(STRAGGLER_MS / 1000)
    out = torch.empty(256)
    dist.reduce_scatter_tensor(out, torch.ones(512), async_op=True).wait()  # gloo: a Work with no future
    opt.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_an_async_gloo_reduce_scatter_lasts_until_its_work_wait_returned_which_depends_on_it(
    tmp_path: Path,
) -> None:
    script = RS_SCRIPT.replace("STRAGGLER_MS", str(STRAGGLER_MS)).replace("STEPS", str(STEPS))
    run = _profile_script(tmp_path, script, "collectives")
    nodes = _nodes(run, 0)
    by_id = {n.id: n for n in nodes}
    rss = [n for n in nodes if n.name == "c10d::_reduce_scatter_base_"]
    waits = [n for n in nodes if n.name == WORK_WAIT_NAME]
    assert len(rss) == len(waits) == ACTIVE
    for rs, w in zip(rss, waits, strict=True):
        assert rs.id in w.ctrl_deps
        rs_a, w_a = node_attrs(rs), node_attrs(by_id[w.id])
        # rank 0 waited out rank 1's sleep inside the wait; the collective ran until the wait returned
        assert w_a[Attr.DUR_NS] > STRAGGLER_MS * 1_000_000 / 2
        assert rs_a[Attr.START_NS] + rs_a[Attr.DUR_NS] == w_a[Attr.START_NS] + w_a[Attr.DUR_NS]
    load_validated(run)


COMPILED_SCRIPT = r"""
import json, os, socket, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
recording = [False]
hooks = H.CommHooks(lambda: recording[0], lambda: 2, ddp=False)
hooks.install()
graphs = []
def backend(gm, example_inputs):
    graphs.append(sorted(str(n.target) for n in gm.graph.nodes if "c10d" in str(n.target)))
    return gm.forward
@torch.compile(backend=backend)
def step(x):
    dist.all_reduce(x)                                          # dynamo makes it a functional all_reduce
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)       # waited for inside the graph
    z = funcol.reduce_scatter_tensor(x, "sum", 0, dist.group.WORLD)
    return y + z
t = torch.ones(8)
step(t)                                                          # compiled before the window
recording[0] = True
for _ in range(3):                                               # the window
    step(t)
recording[0] = False
step(t)                                                          # after it
hooks.flush()
waits = hooks.waits.flush()
hooks.uninstall()
print(json.dumps({"graphs": graphs, "waits": len(waits)}))
dist.destroy_process_group()
"""


def test_a_compiled_program_is_compiled_once_whole_whether_the_window_records_or_not() -> None:
    # the hooks are Python functions a compiled graph calls through (functional collectives' wait_tensor,
    # dist.all_reduce): traced into, they made torch.compile guard on the window's state and break the graph
    # at their C++ calls (on 2 gloo ranks, 3 recompiles of a compiled TP-style MLP and 3 graphs instead of 1;
    # recorded steps of 15-43 ms against 6 ms). Traced, they are the original call: one graph, as without them
    data = run_script(COMPILED_SCRIPT)
    collectives = [
        "_c10d_functional.all_reduce",
        "_c10d_functional.all_reduce",
        "_c10d_functional.reduce_scatter_tensor",
        "_c10d_functional.wait_tensor",
        "_c10d_functional.wait_tensor",
        "_c10d_functional.wait_tensor",
    ]
    assert data["graphs"] == [collectives]
    assert data["waits"] == 0  # the graph calls the ops themselves: nothing of the hooks' runs in it


DOUBLE_BUFFERED_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
pending = []
for i in range(8):
    recv = torch.empty(1024)
    works = [dist.isend(torch.full((1024,), float(i)), peer), dist.irecv(recv, peer)]
    for w in pending:  # step i waits for step i-1's exchange: the window's last exchange, after it
        w.wait()
    pending = works
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
for w in pending:
    w.wait()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("level", ["collectives", "ops"])
def test_a_double_buffered_exchange_waited_for_after_the_window_is_noted_as_still_running(
    tmp_path: Path, level: str
) -> None:
    # each rank's isend and irecv of the window's last step are waited for only in the step after it: the
    # manifest's note counts them, the two calls each rank recorded without an end (round 44's N60: a
    # note leaving out the unended sends and receives failed no test)
    from capture_helpers import profile_script

    from skewlens.profiler.manifest import RankNote, rank_note_key

    run_dir, proc = profile_script(tmp_path, DOUBLE_BUFFERED_SCRIPT, nproc=2, steps="1:1:3", level=level)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = load_validated(run_dir)
    for r in (0, 1):
        note = run.manifest.notes[rank_note_key(r, RankNote.RUNNING_CALLS)]
        assert note.startswith("2 asynchronous call(s) still running when the window ended"), (r, note)
