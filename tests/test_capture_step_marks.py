"""Step marks from ``optimizer.step()`` (``skewlens profile``, or the Python API with ``auto_step``)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from workload_helpers import capture_workload

from skewlens.profiler.capture import capture
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import STEP_MARKS_NOTE, read_manifest
from skewlens.profiler.vocab import Attr


class Wrapper(torch.optim.Optimizer):
    """An optimizer whose step() runs another's, then works on (as ZeroRedundancyOptimizer runs its local
    optimizer, then broadcasts the parameters it updated)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__(params, {})
        self.inner = torch.optim.SGD(params, lr=0.1)
        self.after_inner_ns: list[int] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.inner.step()
        time.sleep(0.005)  # the wrapper's own work, after the inner step
        self.after_inner_ns.append(time.time_ns())


def test_an_optimizer_stepped_inside_another_ones_step_is_part_of_that_step(tmp_path: Path) -> None:
    w = torch.zeros(4, requires_grad=True)
    opt = Wrapper([w])
    with capture(tmp_path / "run", steps="0:0:3", auto_step=True):
        for _ in range(3):
            w.sum().backward()
            opt.step()
    m = read_manifest(tmp_path / "run")
    steps = sorted(m.steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [0, 1, 2]
    # each step ends after the wrapper's own work; before, at the inner SGD's end, 5 ms before it
    for s, after in zip(steps, opt.after_inner_ns, strict=True):
        assert s.end_ns >= after
    assert STEP_MARKS_NOTE not in m.notes  # one optimizer stepped the training; before: "2 optimizers"


class Unhooked(torch.optim.Optimizer):
    """A wrapper that never runs ``Optimizer.__init__`` (as ``PostLocalSGDOptimizer``, whose step() steps its
    local optimizer, then averages the model): torch's step hooks do not see its step()."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.inner = torch.optim.SGD(params, lr=0.1)
        self.after_inner_ns: list[int] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.inner.step()
        time.sleep(0.005)  # the model average, after the local step
        self.after_inner_ns.append(time.time_ns())


def test_a_wrapper_whose_step_torch_does_not_hook_ends_its_steps_after_its_own_work(tmp_path: Path) -> None:
    w = torch.zeros(4, requires_grad=True)
    opt = Unhooked([w])
    own_step = Unhooked.step
    with capture(tmp_path / "run", steps="1:0:3", auto_step=True):
        for _ in range(4):
            w.sum().backward()
            opt.step()
    steps = sorted(read_manifest(tmp_path / "run").steps, key=lambda s: s.step)
    assert [s.step for s in steps] == [1, 2, 3]
    # each step ends after the wrapper's work of its iteration; before, at the inner SGD's end, 5 ms before
    # it, the wrapper's work falling into the next step (only the first step(), the one that found the
    # wrapper, still ends at its inner optimizer's end: step 0, outside the window)
    for s, after in zip(steps, opt.after_inner_ns[1:], strict=True):
        assert s.end_ns >= after
    for s, before in zip(steps[1:], opt.after_inner_ns[1:], strict=False):
        assert s.start_ns >= before
    assert Unhooked.step is own_step  # the capture gave the class its own step() back


@pytest.mark.slow
def test_every_captured_step_of_every_rank_keeps_its_optimizer_step_at_the_ops_level(tmp_path: Path) -> None:
    # the step is marked inside Optimizer.step, after the capture's skewlens::step marker closes; before,
    # in about 2 captures of 3 a rank's marker seemed (Kineto's clock) to end after the mark, and its
    # steps had their 8 aten::add_ at top level where Optimizer.step#SGD.step should be
    capture_workload(tmp_path / "run", "mesh2d.py", level="ops")
    for rank in (0, 1):
        per_step: dict[int, Counter[str]] = defaultdict(Counter)
        for node in read_et(tmp_path / "run" / f"rank-{rank}.et").nodes:
            attrs = node_attrs(node)
            if attrs.get(Attr.STREAM) == 0 and Attr.STEP in attrs:
                per_step[attrs[Attr.STEP]][node.name] += 1
        found = {s: (c["Optimizer.step#SGD.step"], c["aten::add_"]) for s, c in per_step.items()}
        assert found == {2: (1, 0), 3: (1, 0), 4: (1, 0)}, f"rank {rank}"
