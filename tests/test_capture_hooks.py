"""The communication hooks on a real (one-rank gloo) process group: what a call leaves, and when.

Each recorded call is described before it is made and only its times are taken after; records are
built when the session saves (:meth:`CommHooks.flush`). The script runs in its own process so that the
process group and the wrapped ``torch.distributed`` functions do not outlive it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from capture_helpers import ONE_GLOO_RANK

from skewlens.profiler.vocab import CommType, NodeType

SCRIPT = r"""
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
recording = [True]
original = dist.all_reduce
hooks = H.CommHooks(lambda: recording[0], lambda: 7, ddp=False)
hooks.install()
t = torch.ones(300, dtype=torch.float64)
dist.all_reduce(t)                                    # blocking
dist.all_reduce(t, async_op=True).wait()              # asynchronous, completed
recording[0] = False
dist.broadcast(t, src=0)                              # not recorded, but numbered
recording[0] = True
dist.barrier()
class Pending:                                        # an asynchronous call that never completes
    def get_future(self):
        return torch.futures.Future()
spec = H.SPECS["all_reduce"]
never = hooks._wrap("all_reduce", spec, lambda tensor, async_op=False: Pending())
never(t, async_op=True)
recs = hooks.flush()
hooks.uninstall()
out = [dict(op=r.op, seq=r.seq, step=r.step, numel=r.numel, size=r.size_bytes, dtype=r.dtype,
            start=r.start_ns, issue_end=r.issue_end_ns, end=r.end_ns, is_async=r.is_async) for r in recs]
print(json.dumps({"records": out, "restored": dist.all_reduce is original, "running": hooks.running}))
dist.destroy_process_group()
"""


def run_script(script: str) -> Any:
    """Run ``script`` in a fresh process; the JSON of its last line."""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_calls_become_records_at_flush_with_sizes_numbers_and_ordered_times() -> None:
    data = run_script(SCRIPT)
    recs = data["records"]
    # the broadcast was not recorded but took seq 2; the pending asynchronous call is kept without an end
    # (before: left out, so that the flight recorder's entry for it passed for a collective issued past the
    # hooks, noted "issued outside torch.distributed's Python API")
    assert [(r["op"], r["seq"], r["is_async"]) for r in recs] == [
        ("c10d::allreduce_", 0, False),
        ("c10d::allreduce_", 1, True),
        ("c10d::barrier", 3, False),
        ("c10d::allreduce_", 4, True),
    ]
    assert (recs[-1]["end"], data["running"]) == (-1, 1)  # END_UNKNOWN, counted (the session notes it)
    first = recs[0]
    assert (first["numel"], first["size"], first["dtype"], first["step"]) == (300, 2400, "float64", 7)
    for r in recs[:-1]:
        assert r["start"] <= r["issue_end"] <= r["end"]
        if not r["is_async"]:
            assert r["end"] == r["issue_end"]
    assert data["restored"]  # uninstall puts torch.distributed's own function back


QUIET_SCRIPT = r"""
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
from skewlens.profiler.capture.kineto import MARKS, WorkerEvents
workers = WorkerEvents()
assert workers.start()
loud = [False]
hooks = H.CommHooks(lambda: True, lambda: 0, ddp=False, quiet=lambda: workers.quiet() and not loud[0])
hooks.install()
t = torch.ones(300)
quiet = []
for _ in range(MARKS + 1):
    quiet.append(workers.quiet())
    dist.all_reduce(t)
    workers.mark()
dist.all_reduce(t)                                    # a quiet call: gloo's work item records nothing
dist.all_reduce(t, async_op=True).wait()
loud[0] = True
dist.all_reduce(t)                                    # record functions are on again after quiet calls
recs = hooks.flush()
hooks.uninstall()
events = workers.stop()
print(json.dumps({"quiet": quiet, "gloo": [e.name for e in events], "records": len(recs),
                  "timed": all(r.start_ns <= r.issue_end_ns <= r.end_ns for r in recs),
                  "quiet_records": [r.quiet for r in recs]}))
dist.destroy_process_group()
"""


def test_once_the_worker_threads_are_known_hooked_calls_leave_the_worker_event_profiler_alone() -> None:
    data = run_script(QUIET_SCRIPT)
    marks = len(data["quiet"]) - 1
    assert data["quiet"] == [False] * marks + [True]  # loud for the first MARKS steps, then quiet
    # the profiler saw the loud calls' work items and none of the quiet ones'; the hooks timed all of them
    assert data["gloo"].count("gloo:all_reduce") == marks + 1
    assert data["records"] == marks + 4 and data["timed"]
    # each record says whether it was issued quiet (build then knows it made no worker event to take)
    assert data["quiet_records"] == [*data["quiet"], True, True, False]


#: One gloo rank with the flight recorder on, the hooks installed and a sub-group ``pair`` of it.
ONE_RANK_HOOKED = (
    ONE_GLOO_RANK
    + r"""
from skewlens.profiler.capture import flight, hooks as H
hooks = H.CommHooks(lambda: True, lambda: 5, ddp=False)
hooks.install()
pair = dist.new_group([0])
"""
)

LEAN_SCRIPT = (
    ONE_RANK_HOOKED
    + r"""
def calls():
    t = torch.ones(300, dtype=torch.float64)
    dist.all_reduce(t)
    dist.all_reduce(t, group=pair, async_op=True).wait()
    dist.broadcast(torch.ones(7, dtype=torch.int32), src=0)
    dist.all_gather_into_tensor(torch.empty(40), torch.ones(40))   # calls another wrapped function
    dist.reduce_scatter_tensor(torch.empty(16), torch.ones(16))
    dist.barrier()
    dist.reduce_scatter(torch.empty(3), [torch.ones(3)])            # one recorder entry per chunk: full path
hooks._quiet = lambda: True                                         # quiet, as once gloo threads are known
hooks.lean_left = 6
calls()                                                             # 6 lean calls, then the full path
left = hooks.lean_left
raw = hooks.flush()
calls()                                                             # all on the full path
full = hooks.flush()
hooks.uninstall()
lean, lost = flight.resolve(flight.dump_entries(), raw)
_, none_left = flight.resolve([], raw)
key = lambda r: [r.op, r.pg_name, r.numel, r.size_bytes, r.dtype, r.is_async, r.step, r.ident, r.quiet]
print(json.dumps({"raw_groups": [r.pg_name for r in raw], "left": left, "lost": lost, "none_left": none_left,
                  "full_roots": [(r.src, r.dst) for r in full], "lean_roots": [(r.src, r.dst) for r in lean],
                  "lean": [key(r) for r in lean], "full": [key(r) for r in full],
                  "timed": all(r.start_ns <= r.issue_end_ns <= r.end_ns for r in lean),
                  "quiet": H._enable_record_function is not None}))
dist.destroy_process_group()
"""
)


def test_lean_calls_resolved_from_the_flight_recorder_equal_calls_described_by_the_hooks() -> None:
    data = run_script(LEAN_SCRIPT)
    # six lean calls, recorded before the call without reading its arguments; reduce_scatter of a list
    # takes the full path even while lean calls are left
    assert data["left"] == 0
    assert data["raw_groups"] == [""] * 6 + ["0"]
    assert (data["lost"], data["none_left"]) == (0, 6)
    assert data["lean"] == data["full"] and data["timed"]
    assert data["quiet"] and all(key[-1] for key in data["lean"])  # each says it was issued quiet
    assert data["full_roots"][2] == data["lean_roots"][2] == [0, -1]  # the broadcast's root, rank 0
    assert data["full_roots"] == data["lean_roots"]
    ops = [(r[0], r[2], r[3], r[4], r[5]) for r in data["full"]]
    assert ops == [
        ("c10d::allreduce_", 300, 2400, "float64", False),
        ("c10d::allreduce_", 300, 2400, "float64", True),
        ("c10d::broadcast_", 7, 28, "int32", False),
        ("c10d::_allgather_base_", 40, 160, "float32", False),
        ("c10d::_reduce_scatter_base_", 16, 64, "float32", False),
        ("c10d::barrier", 0, 0, "", False),
        ("c10d::reduce_scatter_", 3, 12, "float32", False),
    ]
    assert data["full"][1][1] != data["full"][0][1]  # the sub-group's name, from the recorder too


GROUP_ROOT_SCRIPT = (
    ONE_RANK_HOOKED
    + r"""
hooks.lean_left = 100
dist.broadcast(torch.ones(5), group_src=0, group=pair)
dist.reduce(torch.ones(5), group_dst=0)
dist.gather(torch.ones(5), [torch.empty(5)], group_dst=0, group=pair)
dist.broadcast_object_list([{"a": 1}], src=0)      # torch names the root as group_src
raw = hooks.flush()
hooks.uninstall()
lean, lost = flight.resolve(flight.dump_entries(), raw)
print(json.dumps({"roots": [(r.op, r.src, r.dst) for r in lean], "lost": lost}))
dist.destroy_process_group()
"""
)


def test_lean_calls_record_a_root_given_as_a_rank_of_the_group() -> None:
    # broadcast_object_list(src=1) and gather_object(dst=1) name their root as group_src / group_dst: the
    # lean path left it -1, and a real replay broadcast from the group's first rank instead
    data = run_script(GROUP_ROOT_SCRIPT)
    assert data["lost"] == 0
    assert [tuple(r) for r in data["roots"]] == [
        ("c10d::broadcast_", 0, -1),
        ("c10d::reduce_", -1, 0),
        ("c10d::gather_", -1, 0),
        ("c10d::broadcast_", 0, -1),
        ("c10d::broadcast_", 0, -1),
    ]


REDUCE_OP_SCRIPT = (
    ONE_RANK_HOOKED
    + r"""
R = dist.ReduceOp
def calls():
    dist.all_reduce(torch.ones(4), R.MAX)
    dist.all_reduce(torch.ones(4), op=R.MIN, async_op=True).wait()
    dist.all_reduce(torch.ones(4))
    dist.reduce(torch.ones(4), 0, R.PRODUCT)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2), op=R.MAX)
    dist.reduce_scatter(torch.empty(3), [torch.ones(3)], R.MIN)
    dist.broadcast(torch.ones(4), src=0)
hooks.lean_left = 100
calls()                                                             # the lean path
lean, lost = flight.resolve(flight.dump_entries(), hooks.flush())
hooks.lean_left = 0
calls()                                                             # the full path
full = hooks.flush()
hooks.uninstall()
print(json.dumps({"lean": [r.reduce_op for r in lean], "full": [r.reduce_op for r in full], "lost": lost}))
dist.destroy_process_group()
"""
)


def test_a_reducing_call_records_its_reduce_op_on_either_path() -> None:
    # the capture recorded no reduce op: a real replay re-issued MAX, MIN and PRODUCT as SUM
    data = run_script(REDUCE_OP_SCRIPT)
    assert data["lost"] == 0
    assert data["lean"] == data["full"] == ["max", "min", "sum", "product", "max", "min", ""]


MONITORED_SCRIPT = r"""
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                  TORCH_FR_BUFFER_SIZE="100")
dist.init_process_group("gloo")
from skewlens.profiler.capture import flight, hooks as H
hooks = H.CommHooks(lambda: True, lambda: 3, ddp=False)
hooks.install()
dist.all_reduce(torch.ones(4))
dist.monitored_barrier()
dist.all_reduce(torch.ones(4))
recs = hooks.flush()
hooks.uninstall()
entries = flight.dump_entries()
print(json.dumps({"records": [(r.op, int(r.node_type), int(r.comm_type), r.pg_name, r.seq, r.size_bytes,
                               r.is_async, r.end_ns == r.issue_end_ns) for r in recs],
                  "recorder": [e.seq for e in entries], "issued": hooks.issued(),
                  "unhooked": flight.unhooked_groups(entries, hooks.issued())}))
dist.destroy_process_group()
"""


def test_a_monitored_barrier_is_recorded_as_a_blocking_barrier_of_its_group() -> None:
    # gloo's monitored_barrier runs its messages in C++: unhooked, its time was a compute gap (collectives
    # level) or untraced time (ops, full) on every rank, not communication
    data = run_script(MONITORED_SCRIPT)
    recs = [tuple(r) for r in data["records"]]
    barrier = ("c10d::monitored_barrier", int(NodeType.COMM_COLL), int(CommType.BARRIER))
    assert recs[1] == (*barrier, recs[0][3], 1, 0, False, True)  # its group's, numbered after the all_reduce
    # it takes two of its group's numbers, as the flight recorder (which has no entry for it) counts them:
    # the hooks' count keeps up with the recorder's, so no collective seems to have gone past the hooks
    assert [r[4] for r in recs] == [0, 1, 3] and data["recorder"] == [1, 4]
    assert list(data["issued"].values()) == [4] and data["unhooked"] == []


INSIDE_SCRIPT = (
    ONE_GLOO_RANK
    + r"""
from skewlens.profiler.capture import hooks as H
hooks = H.CommHooks(lambda: True, lambda: 3, ddp=False)
hooks.install()
dist.monitored_barrier()                              # returned: in the trace, not inside
def timed_out(group=None, timeout=None, wait_all_ranks=False):
    raise RuntimeError("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms")
spec = H.SPECS["monitored_barrier"]
failing = hooks._wrap("monitored_barrier", spec, timed_out)
try:
    failing()
except RuntimeError:
    pass
inside = hooks.inside()
recs = hooks.flush()
hooks.uninstall()
print(json.dumps({"inside": [(r.op, r.seq, r.start_ns == r.issue_end_ns, r.end_ns) for r in inside],
                  "records": [r.op for r in recs]}))
dist.destroy_process_group()
"""
)


def test_a_monitored_barrier_a_rank_raised_out_of_is_the_call_it_is_inside_and_one_it_left_is_not() -> None:
    # a monitored_barrier makes no flight-recorder entry: a rank that timed out in one (or is blocked in it)
    # left nothing saying so, and its stop record named another call (a DDP all_reduce that had completed)
    data = run_script(INSIDE_SCRIPT)
    assert data["records"] == ["c10d::monitored_barrier"]  # the one that returned
    # the one it raised out of, numbered by the hooks after the first (which took two numbers), no end
    assert [tuple(c) for c in data["inside"]] == [("c10d::monitored_barrier", 2, True, -1)]


def test_an_all_to_all_reads_its_bytes_to_and_from_each_member_from_its_split_sizes_or_tensor_list(
    monkeypatch: Any,
) -> None:
    import torch

    from skewlens.profiler.capture import hooks

    monkeypatch.setattr(hooks.c10d, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(hooks.c10d, "get_rank", lambda group=None: 1)
    single, lists = "c10d::alltoall_base_", "c10d::alltoall_"
    rows = torch.ones(12, 4)  # 16 bytes a row
    # rank 1 of 3 sends 2, 3 (to itself), 7 rows and receives 3, 0 (its own), 5: 9 and 8 rows move
    assert hooks.uneven_all_to_all(single, (torch.empty(8, 4), rows, [3, 0, 5], [2, 3, 7]), {}) == (
        144, 128, (32, 48, 112), (48, 0, 80)
    )  # fmt: skip
    even = (-1, -1, (), ())
    assert hooks.uneven_all_to_all(single, (), {"output": torch.empty(12, 4), "input": rows}) == even
    # only the input split: the output is cut in 3 equal parts of 4 rows (64 bytes)
    assert hooks.uneven_all_to_all(single, (torch.empty(12, 4), rows), {"input_split_sizes": [2, 3, 7]}) == (
        144, 128, (32, 48, 112), (64, 64, 64)
    )  # fmt: skip
    ins = [torch.ones(n) for n in (5, 6, 7)]  # the list form: NCCL lets its parts differ (4-byte floats)
    assert hooks.uneven_all_to_all(lists, ([torch.empty(n) for n in (1, 2, 3)], ins), {}) == (
        48, 16, (20, 24, 28), (4, 8, 12)
    )  # fmt: skip
    same = [torch.ones(4) for _ in range(3)]
    assert hooks.uneven_all_to_all(lists, (same, same), {}) == even  # even: the formulas' (p - 1) / p
    assert hooks.uneven_all_to_all("c10d::allreduce_", (rows,), {}) == even


UNREADABLE_SPLITS_SCRIPT = (
    ONE_RANK_HOOKED
    + r"""
def unreadable(op, args, kwargs):
    raise TypeError("split sizes of an unknown kind")
H.uneven_all_to_all = unreadable
def a2a():
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
hooks.lean_left = 1
a2a()                                                               # the lean path
a2a()                                                               # the full path
raw = hooks.flush()
hooks.uninstall()
print(json.dumps({"calls": len(raw), "dropped": hooks.dropped, "unread": hooks.unread_splits,
                  "splits": [(r.send_bytes, r.recv_bytes, list(r.send_splits)) for r in raw]}))
dist.destroy_process_group()
"""
)


def test_an_all_to_all_whose_splits_cannot_be_read_is_recorded_with_even_ones_on_either_path() -> None:
    # before: the lean path recorded it with even splits and said nothing, the full path dropped the call
    # (1 call recorded of 2, dropped=1)
    data = run_script(UNREADABLE_SPLITS_SCRIPT)
    assert (data["calls"], data["dropped"], data["unread"]) == (2, 0, 2)
    assert data["splits"] == [[-1, -1, []], [-1, -1, []]]


COALESCED_SCRIPT = (
    ONE_GLOO_RANK
    + r"""
import time
from torch.distributed.distributed_c10d import _coalescing_manager
from skewlens.profiler.capture import flight, hooks as H
from skewlens.profiler.capture.records import StepRecord
ahead = []
hooks = H.CommHooks(lambda: True, lambda: 0, ddp=False, on_unhooked=lambda: ahead.append(1))
hooks.install()
start = time.time_ns()
for lean_left in (0, 10):                           # the full path, then the lean one
    hooks.lean_left = lean_left
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(3), src=0)        # not queued: issued (and recorded) at once
        dist.all_reduce(torch.ones(6))
    cm.wait()
    dist.all_reduce(torch.ones(2))
recs = hooks.flush()
hooks.uninstall()
recs, lost = flight.resolve(flight.dump_entries(), recs)
hooked, extra, left_out = flight.merge(
    flight.dump_entries(), recs, [StepRecord(step=0, start_ns=start, end_ns=time.time_ns())], thread=0
)
print(json.dumps({"hooked": [(r.op, r.seq, r.size_bytes) for r in hooked],
                  "extra": [(r.op, r.seq, r.size_bytes) for r in extra], "left_out": (lost, left_out),
                  "ahead": len(ahead)}))
dist.destroy_process_group()
"""
)


def test_calls_queued_by_a_coalescing_manager_are_one_collective_the_flight_recorder_sees() -> None:
    # before: each all_reduce queued inside _coalescing_manager was recorded as a hooked call, which issues
    # nothing; the one coalesced all_reduce its end issues from C++ has the recorder's only entry, so the
    # queued calls had none and were left out as if the ring buffer had wrapped (a note saying so), and
    # where the window had skipped gloo's worker events the coalesced collective had no end
    data = run_script(COALESCED_SCRIPT)
    assert [tuple(r) for r in data["hooked"]] == [
        ("c10d::broadcast_", 1, 12),
        ("c10d::allreduce_", 3, 8),
        ("c10d::broadcast_", 4, 12),
        ("c10d::allreduce_", 6, 8),
    ]
    # one all_reduce of 4 + 6 floats per context, numbered by the recorder, on either path
    assert [tuple(r) for r in data["extra"]] == [("gloo:all_reduce", 2, 40), ("gloo:all_reduce", 5, 40)]
    assert data["left_out"] == [0, 0]  # before: [2, 2] (the lean path's, the full path's)
    assert data["ahead"] == 4  # the session is told: collectives past the hooks are ahead (their ends)


def test_a_reduce_op_is_named_from_its_enum_a_reduce_op_object_or_the_calls_default() -> None:
    import torch
    import torch.distributed as dist

    from skewlens.profiler.capture.hooks import reduce_op_name

    red, t = dist.ReduceOp, torch.ones(1)
    assert reduce_op_name("c10d::allreduce_", (t, red.MAX), {}) == "max"
    assert reduce_op_name("c10d::allreduce_", (t,), {"op": red(red.PRODUCT)}) == "product"
    assert reduce_op_name("c10d::allreduce_", (t, dist._make_nccl_premul_sum(2.0)), {}) == "premul_sum"
    assert reduce_op_name("c10d::reduce_", (t, 0), {}) == "sum"  # none given: the call's default
    assert reduce_op_name("c10d::reduce_", (t, 0, "not an op"), {}) == ""
    assert reduce_op_name("c10d::broadcast_", (t, 0), {}) == ""


def test_each_reducing_call_reads_its_reduce_op_from_its_own_place_in_the_arguments() -> None:
    import torch
    import torch.distributed as dist

    from skewlens.profiler.capture.hooks import reduce_op_name

    red, t = dist.ReduceOp, torch.ones(2)
    # all_reduce_coalesced(tensors, op), reduce_scatter_tensor(output, input, op), reduce(tensor, dst, op),
    # reduce_scatter(output, input_list, op)
    assert reduce_op_name("c10d::allreduce_coalesced_", ([t, t], red.MIN), {}) == "min"
    assert reduce_op_name("c10d::_reduce_scatter_base_", (t, t, red.MAX), {}) == "max"
    assert reduce_op_name("c10d::_reduce_scatter_base_", (t, t), {}) == "sum"
    assert reduce_op_name("c10d::reduce_", (t, 1, red.PRODUCT), {}) == "product"
    assert reduce_op_name("c10d::reduce_scatter_", (t, [t], red.MAX), {}) == "max"


class _UnreadableOp:
    """An argument whose reading raises (a ReduceOp binding of another torch, a proxy)."""

    @property
    def op(self) -> object:
        raise RuntimeError("cannot read this op")


def test_a_reduce_op_that_cannot_be_read_is_recorded_as_unknown_and_the_call_goes_on() -> None:
    import torch

    from skewlens.profiler.capture.hooks import SPECS, CommHooks

    hooks = CommHooks(lambda: True, lambda: 0, ddp=False)
    assert hooks._reduce_op(SPECS["all_reduce"], (torch.ones(1), _UnreadableOp()), {}) == ""


def test_a_reduce_op_argument_whose_name_is_not_a_string_is_not_named() -> None:
    from types import SimpleNamespace

    from skewlens.profiler.capture.hooks import reduce_op_name

    assert reduce_op_name("c10d::allreduce_", (None, SimpleNamespace(name=3)), {}) == ""
    assert reduce_op_name("c10d::allreduce_", (None, SimpleNamespace(name=None)), {}) == ""


PROGRAM_WRAPPERS = r"""
import json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from skewlens.profiler.capture import hooks as H
logged = []
def logger(name):  # an in-house communication logger: counts each call, then calls what it replaced
    replaced = getattr(dist, name)
    def log(*args, **kwargs):
        logged.append(name)
        return replaced(*args, **kwargs)
    setattr(dist, name, log)
    return log
t = torch.ones(8)
# a logger installed before the hooks (a Python API capture), on torch.distributed only
before = logger("broadcast")
hooks = H.CommHooks(lambda: True, lambda: 0, ddp=False)
hooks.install()
# a logger installed after them (every skewlens profile rank: the hooks come with torch's import)
after = logger("all_reduce")
dist.all_reduce(t); dist.broadcast(t, src=0)
recorded = [r.op for r in hooks.flush()]
hooks.uninstall()
dist.all_reduce(t); dist.broadcast(t, src=0)  # the rest of the run, after the capture window
print(json.dumps({
    "recorded": recorded, "after_uninstall": [r.op for r in hooks.flush()], "logged": logged,
    "kept": [dist.all_reduce is after, dist.broadcast is before],
    "c10d_restored": dist.distributed_c10d.all_reduce.__module__ == "torch.distributed.distributed_c10d",
}))
dist.destroy_process_group()
"""


def test_a_programs_own_wrappers_of_collectives_are_recorded_through_and_kept_after_uninstall() -> None:
    data = run_script(PROGRAM_WRAPPERS)
    # both calls recorded once: the broadcast through the program's wrapper installed before the hooks
    # (before: its wrapper called torch's function directly, past the hooks, and the call came from the
    # flight recorder only, noted as issued outside torch.distributed's Python API)
    assert data["recorded"] == ["c10d::allreduce_", "c10d::broadcast_"]
    # uninstall leaves both wrappers in place and they log every call of the run; the hook left under the
    # later one records nothing (before: torch's function was put back over it, and the logger saw the
    # window's calls only: 5 of 8 steps' all_reduces under skewlens profile --steps 1:1:3)
    assert data["kept"] == [True, True]
    assert data["logged"] == ["all_reduce", "broadcast", "all_reduce", "broadcast"]
    assert data["after_uninstall"] == []
    assert data["c10d_restored"]
