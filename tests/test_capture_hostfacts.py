"""The full level's host facts (schemas, reads, writes) from torch.profiler, and against PyTorch's ET.

Real torch.profiler runs in this process on small programs; the last test captures the same program
through the Python API with both sources and compares the Chakra traces they give.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from skewlens.profiler.capture import capture
from skewlens.profiler.capture.hostfacts import host_facts, schema_of
from skewlens.profiler.capture.kineto import KinetoCapture, is_host_event
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.vocab import Attr, NodeType


def facts_of(program: Callable[[], None]) -> list[tuple[str, Any]]:
    """(name, HostOpInfo) of every host operator ``program`` ran, in start order."""
    k = KinetoCapture(cuda=False, host_facts=True)
    k.start()
    program()
    events = k.stop()
    host = sorted((e for e in events if is_host_event(e)), key=lambda e: e.start_ns())
    facts = host_facts(k.event_tree(), {e.correlation_id(): e.dtypes() for e in host})
    return [(e.name(), facts[e.correlation_id()]) for e in host if e.correlation_id() in facts]


def only(facts: list[tuple[str, Any]], name: str) -> Any:
    found = [f for n, f in facts if n == name]
    assert len(found) == 1, (name, [n for n, _ in facts])
    return found[0]


def test_each_operator_gets_its_schema_what_it_reads_and_what_it_writes() -> None:
    a = torch.randn(32, 32)
    out = torch.empty(32)

    def program() -> None:
        b = a @ a
        c = torch.relu(b)
        c.add_(b)
        torch.sum(c, 0, out=out)

    facts = facts_of(program)
    mm, relu, add, total = (only(facts, n) for n in ("aten::mm", "aten::relu", "aten::add_", "aten::sum"))
    assert mm.schema == "aten::mm(Tensor self, Tensor mat2) -> Tensor"
    assert add.schema.startswith("aten::add_.Tensor(Tensor(a!) self, Tensor other")
    assert total.schema.startswith("aten::sum.IntList_out(")
    (a_id,) = set(mm.inputs)
    (b_id,) = mm.outputs  # the matmul allocated its result
    assert a_id != b_id and relu.inputs == (b_id,)
    (c_id,) = relu.outputs
    assert set(add.inputs) == {c_id, b_id} and add.outputs == (c_id,)  # in place: writes its input
    (out_id,) = total.outputs  # the out= argument
    assert total.inputs == (c_id, out_id)
    assert json.loads(add.types) == ["Tensor(float)", "Tensor(float)", "Int"]
    assert json.loads(total.shapes)[0] == [32, 32] and json.loads(total.shapes)[4] == [32]


def test_an_in_place_write_through_a_view_is_a_write_of_the_viewed_data() -> None:
    a = torch.randn(16, 16)

    def program() -> None:
        c = torch.relu(a)
        c.view(-1).mul_(2.0)
        torch.neg(c)

    facts = facts_of(program)
    relu, mul, neg = (only(facts, n) for n in ("aten::relu", "aten::mul_", "aten::neg"))
    (c_id,) = relu.outputs
    assert c_id in mul.outputs and neg.inputs == (c_id,)  # (mul_ also wrote its scalar's temporary)


def test_collective_schemas_mark_their_output_arguments_as_written() -> None:
    schema, written = schema_of("c10d::_allgather_base_", "")
    assert schema.startswith("c10d::_allgather_base_(Tensor output_tensor, Tensor input_tensor")
    assert written == {0}
    assert schema_of("c10d::allreduce_", "")[1] == {0}
    assert schema_of("c10d::send", "")[1] == frozenset()
    assert schema_of("DistributedDataParallel.forward", "") == ("", frozenset())


def _step_program(steps: int, mark: Callable[[], None]) -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    acc = torch.zeros(64, 64)
    for _ in range(steps):
        x = torch.randn(64, 64)
        y = torch.relu(x @ w)
        acc.add_(y)
        torch.tanh(acc)
        mark()


def _edges(run: Path) -> tuple[list[tuple[str, str]], set[tuple[int, int]]]:
    """(name, schema) of the COMP nodes of the first recorded step, and their data edges by position."""
    nodes = [(n, node_attrs(n)) for n in read_et(run / "rank-0.et").nodes]
    first = min(a[Attr.STEP] for n, a in nodes if n.type == NodeType.COMP and Attr.STEP in a)
    comp = [(n, a) for n, a in nodes if n.type == NodeType.COMP and a.get(Attr.STEP) == first]
    comp = [(n, a) for n, a in comp if a.get(Attr.OP_SCHEMA)]
    pos = {n.id: i for i, (n, _) in enumerate(comp)}
    edges = {(pos[d], i) for i, (n, _) in enumerate(comp) for d in n.data_deps if d in pos}
    return [(n.name, a[Attr.OP_SCHEMA]) for n, a in comp], edges


@pytest.mark.timeout(120)
def test_the_profiler_and_the_execution_trace_observer_give_the_same_schemas_and_dependencies(
    tmp_path: Path,
) -> None:
    runs = {}
    for source in ("profiler", "observer"):
        run = tmp_path / source
        with capture(run, level="full", steps="1:1:2", host_trace=source) as cap:
            _step_program(5, cap.step)
        assert read_et(run / "rank-0.et").metadata["host_trace"] == source
        runs[source] = _edges(run)
    (ops_p, edges_p), (ops_o, edges_o) = runs["profiler"], runs["observer"]
    assert ops_p == ops_o
    assert [n for n, _ in ops_p][:3] == ["aten::randn", "aten::matmul", "aten::relu"]
    assert edges_p == edges_o
    names = [n for n, _ in ops_p]
    # the chain matmul -> relu -> add_ -> tanh is in both
    i = names.index("aten::matmul")
    assert {(i, i + 1), (i + 1, i + 2), (i + 2, i + 3)} <= edges_p
