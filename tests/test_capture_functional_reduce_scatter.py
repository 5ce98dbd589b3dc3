"""A functional reduce_scatter on gloo (DTensor's ``Partial`` to ``Shard``: sequence parallelism's
``RowwiseParallel(output_layouts=Shard(1))``) is recorded as the reduce_scatter the program issued, not as
the all_reduce of the whole input that gloo runs for it and its flight-recorder entry names."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_capture_build import GROUPS, MAIN, coll

from skewlens.profiler.capture import waits
from skewlens.profiler.capture.build import STEP_MARK_NAME, RankCapture, build_nodes
from skewlens.profiler.capture.flight import FUNCTIONAL_REDUCE_SCATTER_OP, as_issued
from skewlens.profiler.capture.records import CommRecord, OpRecord, StepRecord
from skewlens.profiler.capture.waits import WaitHooks
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.vocab import Attr, CommType, NodeType

MS = 1_000_000
THREAD = 140_000_000_000_001


def recorder_only(op: str, comm_type: CommType, start_ns: int, ident: int = THREAD) -> CommRecord:
    """A collective only the flight recorder saw, as :func:`flight.merge` makes it (asynchronous, its
    entry's thread)."""
    c = coll(start_ns, start_ns + MS, seq=1, is_async=True, issue_end=start_ns, step=2)
    return replace(c, op=op, comm_type=comm_type, size_bytes=262_144, ident=ident)


def test_a_gloo_all_reduce_issued_inside_a_functional_reduce_scatter_call_is_a_reduce_scatter() -> None:
    inside = recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, 10 * MS)
    outside = recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, 20 * MS)
    other_thread = recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, 10 * MS, ident=THREAD + 1)
    gather = recorder_only("gloo:all_gather", CommType.ALL_GATHER, 10 * MS)
    nccl = recorder_only("nccl:all_reduce", CommType.ALL_REDUCE, 10 * MS)
    scatters = [(THREAD, 10 * MS - 5_000, 10 * MS + 5_000)]

    out = as_issued([inside, outside, other_thread, gather, nccl], scatters)

    assert [c.comm_type for c in out] == [
        CommType.REDUCE_SCATTER,
        CommType.ALL_REDUCE,
        CommType.ALL_REDUCE,
        CommType.ALL_GATHER,
        CommType.ALL_REDUCE,
    ]
    # named as the program called it, gloo's name kept for its worker event; the rest kept
    assert (out[0].op, out[0].ran_as) == ("_c10d_functional::reduce_scatter_tensor", "gloo:all_reduce")
    assert (out[0].size_bytes, out[0].seq) == (262_144, 1)
    assert [c.op for c in out[1:]] == ["gloo:all_reduce"] * 2 + ["gloo:all_gather", "nccl:all_reduce"]
    assert not any(c.ran_as for c in out[1:])
    assert as_issued([inside], []) == [inside]
    # an entry created as the call began or as it returned is the call's
    lo, hi = scatters[0][1:]
    at_ends = [recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, t) for t in (lo, hi, hi + 1)]
    assert [c.comm_type for c in as_issued(at_ends, scatters)] == [
        CommType.REDUCE_SCATTER,
        CommType.REDUCE_SCATTER,
        CommType.ALL_REDUCE,
    ]


def test_a_functional_reduce_scatter_node_is_named_as_the_program_called_it_and_ends_with_gloos_event() -> (
    None
):
    # before, the node kept the recorder's name (gloo:all_reduce), and whatever groups by name (the
    # critical path's share by op) counted sequence parallelism's reduce_scatters with the all_reduces
    rs, ar = (recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, t * MS) for t in (10, 30))
    (rs,) = as_issued([rs], [(THREAD, 10 * MS - 5_000, 10 * MS + 5_000)])
    worker = [  # gloo's worker events: both ran as all_reduces
        OpRecord(name="gloo:all_reduce", start_ns=t * MS + 1_000, dur_ns=d, thread=7, is_cpu=True)
        for t, d in ((10, 3 * MS), (30, 2 * MS))
    ]
    steps = [StepRecord(step=2, start_ns=0, end_ns=50 * MS)]
    cap = RankCapture(
        rank=0, comms=[rs, ar], steps=steps, groups=GROUPS, main_thread=MAIN, worker_events=worker
    )

    colls = {n.name: n for n in build_nodes(cap) if n.node_type == NodeType.COMM_COLL}

    assert set(colls) == {"_c10d_functional::reduce_scatter_tensor", "gloo:all_reduce"}
    scatter, reduce = colls["_c10d_functional::reduce_scatter_tensor"], colls["gloo:all_reduce"]
    assert scatter.attrs[Attr.COMM_TYPE] == CommType.REDUCE_SCATTER
    assert scatter.attrs[Attr.OP] == "_c10d_functional::reduce_scatter_tensor"
    assert reduce.attrs[Attr.COMM_TYPE] == CommType.ALL_REDUCE
    # each took its own worker event for its end
    assert (scatter.start_ns, scatter.dur_ns) == (10 * MS, 3 * MS + 1_000)
    assert (reduce.start_ns, reduce.dur_ns) == (30 * MS, 2 * MS + 1_000)


def test_at_the_ops_level_an_all_reduce_issued_inside_kinetos_functional_reduce_scatter_operator_is_one() -> (
    None
):
    # a compiled graph calls torch.ops._c10d_functional.reduce_scatter_tensor itself, past the hooks: before,
    # on 2 gloo ranks the backward of a compiled all_gather_tensor was an ALL_REDUCE of 2,048 B, which
    # replay comm_mode=model on switch charged 2,041 ns against the reduce_scatter's 1,020
    kineto_main = 5  # Kineto's number for the main thread, told by the step marks on it
    rs, ar = (
        replace(recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, t * MS), thread=MAIN) for t in (10, 30)
    )
    ops = [
        OpRecord(name=STEP_MARK_NAME, start_ns=49 * MS, dur_ns=1_000, thread=kineto_main, is_cpu=True),
        OpRecord(
            name=FUNCTIONAL_REDUCE_SCATTER_OP,
            start_ns=10 * MS - 40_000,
            dur_ns=60_000,
            thread=kineto_main,
            is_cpu=True,
        ),
        # the same operator on another thread does not make the main thread's all_reduce a reduce_scatter
        OpRecord(
            name=FUNCTIONAL_REDUCE_SCATTER_OP, start_ns=30 * MS - 40_000, dur_ns=60_000, thread=9, is_cpu=True
        ),
    ]
    steps = [StepRecord(step=2, start_ns=0, end_ns=50 * MS)]
    cap = RankCapture(rank=0, comms=[rs, ar], steps=steps, groups=GROUPS, main_thread=MAIN, ops=ops)

    colls = {n.name: n for n in build_nodes(cap) if n.node_type == NodeType.COMM_COLL}

    assert {k: v.attrs[Attr.COMM_TYPE] for k, v in colls.items()} == {
        FUNCTIONAL_REDUCE_SCATTER_OP: CommType.REDUCE_SCATTER,
        "gloo:all_reduce": CommType.ALL_REDUCE,
    }
    assert colls[FUNCTIONAL_REDUCE_SCATTER_OP].start_ns == 10 * MS


def test_a_gpu_annotation_of_the_functional_reduce_scatters_name_makes_no_all_reduce_a_reduce_scatter() -> (
    None
):
    # Kineto's GPU timeline repeats the operator's name as an annotation on a stream, whose number may be
    # the one Kineto gave the main thread: only the operator on the host thread tells what was issued
    kineto_main = 7  # the main thread's number, and the default CUDA stream's
    ar = replace(recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, 10 * MS), thread=MAIN)
    mark = OpRecord(name=STEP_MARK_NAME, start_ns=49 * MS, dur_ns=1_000, thread=kineto_main, is_cpu=True)
    annotation = replace(
        mark, name=FUNCTIONAL_REDUCE_SCATTER_OP, start_ns=10 * MS - 40_000, dur_ns=60_000, is_cpu=False
    )
    steps = [StepRecord(step=2, start_ns=0, end_ns=50 * MS)]
    cap = RankCapture(
        rank=0, comms=[ar], steps=steps, groups=GROUPS, main_thread=MAIN, ops=[mark, annotation]
    )

    [coll_node] = [n for n in build_nodes(cap) if n.node_type == NodeType.COMM_COLL]

    assert (coll_node.name, coll_node.attrs[Attr.COMM_TYPE]) == ("gloo:all_reduce", CommType.ALL_REDUCE)


def test_the_wait_hooks_time_each_functional_reduce_scatter_call_made_while_recording_on_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed._functional_collectives as funcol

    ticks = itertools.count(100, 100)
    monkeypatch.setattr(waits, "time", SimpleNamespace(time_ns=lambda: next(ticks)))  # the hooks' clock
    recording = [False]
    orig = funcol.reduce_scatter_single
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(funcol, "reduce_scatter_single", lambda *a, **k: calls.append(a) or "out")
    hooks = WaitHooks(lambda: recording[0], lambda: 0)
    hooks.install()
    try:
        assert funcol.reduce_scatter_single(1) == "out"  # not recording: passed through, not timed
        recording[0] = True
        assert funcol.reduce_scatter_single(2) == "out"
        assert calls == [(1,), (2,)]
        assert hooks.flush_scatters() == [(threading.get_ident(), 100, 200)]
        assert hooks.flush_scatters() == []  # each call once
    finally:
        hooks.uninstall()
    assert funcol.reduce_scatter_single(3) == "out" and not hooks.flush_scatters()  # torch's own again
    monkeypatch.undo()
    assert funcol.reduce_scatter_single is orig


B, S, H, F, BLOCKS = 4, 16, 64, 128, 2
SP_SCRIPT = f"""
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)
dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm({H})
        self.up = torch.nn.Linear({H}, {F})
        self.down = torch.nn.Linear({F}, {H})
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

torch.manual_seed(0)
model = torch.nn.Sequential(*(Block() for _ in range({BLOCKS})))
plan = {{}}
for b in range({BLOCKS}):
    plan[f"{{b}}.norm"] = SequenceParallel()
    plan[f"{{b}}.up"] = ColwiseParallel(input_layouts=Shard(1))
    plan[f"{{b}}.down"] = RowwiseParallel(output_layouts=Shard(1))
parallelize_module(model, mesh, plan)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(5):
    model(torch.randn({B}, {S} // world, {H})).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)  # (torch 2.13 can abort at exit after gloo functional collectives; the trace is saved)
"""


@pytest.mark.slow
def test_sequence_parallel_on_gloo_records_its_reduce_scatters_and_all_gathers_with_their_bytes(
    tmp_path: Path,
) -> None:
    from capture_helpers import profile_script

    run, res = profile_script(tmp_path, SP_SCRIPT, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    shard = B * (S // 2) * H * 4  # one rank's sequence shard of the activations, float32
    for rank in range(2):
        per_step: dict[int, Counter[tuple[int, int]]] = {}
        for n in read_et(run / f"rank-{rank}.et").nodes:
            a = node_attrs(n)
            if a and n.type == NodeType.COMM_COLL:
                per_step.setdefault(a[Attr.STEP], Counter())[(a[Attr.COMM_TYPE], a[Attr.COMM_SIZE])] += 1
        assert len(per_step) == 3
        for kinds in per_step.values():
            # each block: the column-parallel input's all_gather of the sequence shards (forward) and the
            # row-parallel output's reduce_scatter of the whole partial sums (forward), each the other's
            # gradient in backward; then the layer norms' weight and bias gradients, all_reduced
            assert kinds == {
                (CommType.ALL_GATHER, shard): 2 * BLOCKS,
                (CommType.REDUCE_SCATTER, 2 * shard): 2 * BLOCKS,
                (CommType.ALL_REDUCE, H * 4): 2 * BLOCKS,
            }


def test_an_entry_inside_a_long_span_is_a_reduce_scatter_where_a_later_short_span_ended_before_it() -> None:
    # spans looked up by their starts: the one begun last before the entry at 50 ms (10-12 ms) ended before
    # it, the one begun first (0-60 ms) holds it; an entry after both, or before any, stays an all_reduce
    scatters = [(THREAD, 10 * MS, 12 * MS), (THREAD, 0, 60 * MS)]
    entries = [recorder_only("gloo:all_reduce", CommType.ALL_REDUCE, t * MS) for t in (50, 11, 61, 5)]
    rs, ar = CommType.REDUCE_SCATTER, CommType.ALL_REDUCE
    assert [c.comm_type for c in as_issued(entries, scatters[:1])] == [ar, rs, ar, ar]
    assert [c.comm_type for c in as_issued(entries, scatters)] == [rs, rs, ar, rs]
