"""The ops and full levels beside a torch.profiler the program runs itself.

Kineto is one session per process: a profiler started over another takes its session, and the first
then stops with no events. The capture leaves the program's profiler alone, as without skewlens, and its
trace then has the collectives level's content, with a note saying why.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from skewlens.profiler.capture import capture
from skewlens.profiler.capture.kineto import KinetoCapture
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.vocab import Attr, NodeType


def _program_profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def _steps(n: int, mark: object) -> None:
    x = torch.randn(32, 32)
    for _ in range(n):
        torch.mm(x, x).relu_()
        mark()  # type: ignore[operator]


def _mms(prof: torch.profiler.profile) -> int:
    return Counter(e.name for e in prof.events())["aten::mm"]


def test_a_program_profiling_itself_before_the_ops_level_starts_keeps_every_event_of_its_profiler(
    tmp_path: Path,
) -> None:
    with _program_profiler() as prof, capture(tmp_path / "run", level="ops", steps="0:1:2") as cap:
        _steps(5, cap.step)
    # without skewlens: 5 mm; before the fix, skewlens' session took Kineto over and the program got 0
    assert _mms(prof) == 5
    notes = read_manifest(tmp_path / "run").notes
    assert "own torch profiler" in notes["rank 0 operators"]
    # the trace is written, with the collectives level's content: no operator nodes
    nodes = read_et(tmp_path / "run" / "rank-0.et").nodes
    assert not [n.name for n in nodes if n.type == NodeType.COMP and n.name.startswith("aten::")]


def test_a_program_starting_its_profiler_inside_the_ops_window_keeps_it_and_the_trace_says_operators_are_lost(
    tmp_path: Path,
) -> None:
    prof = _program_profiler()
    with capture(tmp_path / "run", level="ops", steps="0:1:3") as cap:
        x = torch.randn(32, 32)
        for step in range(6):
            if step == 2:  # the window records steps 1-3
                prof.start()
            torch.mm(x, x)
            if step == 3:
                prof.stop()
            cap.step()
    assert _mms(prof) == 2
    note = read_manifest(tmp_path / "run").notes["rank 0 operators"]
    assert "started its own profiler" in note and "operators not recorded" in note


def test_the_ops_levels_profiler_says_why_it_did_not_start_and_hands_kineto_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.ones(4)
    with _program_profiler() as prof:
        k = KinetoCapture(cuda=False)
        assert k.start() is False and "own profiler" in k.note
        x.add_(1)
        k.mark()
        assert k.stop() == []
    names = [e.name for e in prof.events()]
    assert names.count("aten::add_") == 1 and "skewlens::step" not in names
    # alone, it records; stopped, the program's profilers prepare through torch's own function again
    import torch.autograd.profiler as autograd_profiler

    original = autograd_profiler._prepare_profiler
    k = KinetoCapture(cuda=False)
    assert k.start() is True and k.note == ""
    x.mul_(2)
    assert any(e.name() == "aten::mul_" for e in k.stop())
    assert autograd_profiler._prepare_profiler is original


#: A script with instrumentation of its own: torch.profiler on a schedule writing TensorBoard traces,
#: record_function ranges around its phases (one around its collectives), and an in-house logger that
#: replaces ``dist.all_reduce`` / ``dist.broadcast`` to count the calls. DDP; 8 steps.
INSTRUMENTED = r"""
import collections, json, os, sys, torch, torch.distributed as dist
from torch.profiler import profile, record_function, schedule, tensorboard_trace_handler, ProfilerActivity
dist.init_process_group("gloo")
rank = dist.get_rank()
logged = collections.Counter()
def logger(name):
    replaced = getattr(dist, name)
    def log(*args, **kwargs):
        logged[name] += 1
        return replaced(*args, **kwargs)
    setattr(dist, name, log)
for name in ("all_reduce", "broadcast"):
    logger(name)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
               on_trace_ready=tensorboard_trace_handler(os.path.join(sys.argv[1], f"rank{rank}")))
x = torch.randn(8, 16)
with prof:
    for step in range(8):
        with record_function("user::step"):
            model(x).square().mean().backward()
            with record_function("user::metrics"):
                dist.all_reduce(torch.ones(1))
                dist.broadcast(torch.zeros(16), src=0)
            opt.step()
        prof.step()
print(f"rank {rank} logged {dict(logged)}", file=sys.stderr)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("level", ["collectives", "ops"])
def test_an_instrumented_script_keeps_its_profiler_and_logger_and_its_collectives_are_captured_whole(
    tmp_path: Path, level: str
) -> None:
    import json
    import sys

    from capture_helpers import profile

    from skewlens.profiler.chakra_io import node_attrs
    from skewlens.profiler.vocab import Attr, CommType

    script, tb = tmp_path / "train.py", tmp_path / "tb"
    script.write_text(INSTRUMENTED)
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
        str(tb),
    ]  # fmt: skip
    res = profile(out, level=level, command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    notes = read_manifest(out).notes
    for r in (0, 1):
        # its logger saw every call of the 8 steps (before: 5 of each, torch's functions being put back
        # over it when the window ended in step 5)
        assert f"rank {r} logged {{'all_reduce': 8, 'broadcast': 8}}" in res.stderr
        # its profiler wrote its trace of steps 2 and 3, with its ranges and calls
        (trace,) = (tb / f"rank{r}").glob("*.json")
        names = Counter(e.get("name") for e in json.loads(trace.read_text())["traceEvents"])
        assert sorted(n for n in names if n.startswith("ProfilerStep")) == [
            f"ProfilerStep#{s}" for s in (2, 3)
        ]
        # (DDP's all_reduce is a c10d::allreduce_ operator too, as without skewlens)
        assert (names["user::metrics"], names["c10d::allreduce_"], names["c10d::broadcast_"]) == (2, 4, 2)
        # the window (steps 2-4): per step DDP's all_reduce (68 floats), the logger's all_reduce and
        # broadcast, each with its end (before, at the ops level: DDP's, which only the flight recorder
        # sees, had none, the program's profiler having taken Kineto over from the window's)
        colls = [node_attrs(n) for n in read_et(out / f"rank-{r}.et").nodes if n.type == NodeType.COMM_COLL]
        per_step = Counter((a[Attr.STEP], a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) for a in colls)
        assert per_step == Counter(
            (s, t, b)
            for s in (2, 3, 4)
            for t, b in ((CommType.ALL_REDUCE, 272), (CommType.ALL_REDUCE, 4), (CommType.BROADCAST, 64))
        )
        assert all(a[Attr.DUR_NS] > 0 for a in colls)
        if level == "ops":
            assert "worker events recorded from when it started" in notes[f"rank {r} operators"]


def test_a_program_profiler_in_its_schedules_warm_up_as_the_window_begins_records_and_the_capture_steps_aside(
    tmp_path: Path,
) -> None:
    # torch.profiler prepares Kineto when its warm-up begins and enables it a prof.step() later; the ops
    # level's session started in between (nothing was enabled yet), and the program's enable raised
    # "RuntimeError: Profiler is already enabled on this thread" from its prof.step(), ending the training
    sched = torch.profiler.schedule(wait=0, warmup=2, active=2, repeat=1)
    traces: list[int] = []
    with capture(tmp_path / "run", level="ops", steps="1:1:2") as cap:  # as under skewlens profile: first
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=sched,
            on_trace_ready=lambda p: traces.append(_mms(p)),
        )
        with prof:  # warm-up from step 0: prepared, not yet enabled when the window's warm-up begins
            x = torch.randn(32, 32)
            for _ in range(6):
                torch.mm(x, x)
                cap.step()
                prof.step()
    assert traces == [2]  # its 2 recorded steps' mm, as without skewlens
    notes = read_manifest(tmp_path / "run").notes
    assert "own torch profiler" in notes["rank 0 operators"]


def test_operators_inside_the_step_ranges_of_a_program_profiler_still_waiting_for_its_schedule_are_recorded(
    tmp_path: Path,
) -> None:
    # a program's torch.profiler opens a ProfilerStep#<n> range at each prof.step(), recording or not
    # (here it waits for step 10): the capture's session records the range around each step's operators,
    # and every operator inside it was left out with it, as communication is (before: no operator node,
    # and no note saying so)
    sched = torch.profiler.schedule(wait=10, warmup=1, active=1, repeat=1)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched)
    with capture(tmp_path / "run", level="ops", steps="1:1:2") as cap, prof:
        x = torch.randn(32, 32)
        for _ in range(5):
            with torch.profiler.record_function("user::block"):
                torch.mm(x, x)
            cap.step()
            prof.step()
    nodes = read_et(tmp_path / "run" / "rank-0.et").nodes
    steps = Counter((n.name, node_attrs(n)[Attr.STEP]) for n in nodes if n.type == NodeType.COMP)
    # as without the program's profiler: the scope (the outermost operator, its matmul inside) each step
    assert {k: v for k, v in steps.items() if k[0] == "user::block"} == {
        ("user::block", 2): 1,
        ("user::block", 3): 1,
    }
    assert not [n for n, _ in steps if n.startswith("ProfilerStep")]
    assert "rank 0 operators" not in read_manifest(tmp_path / "run").notes
