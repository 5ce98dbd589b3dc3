"""The collectives level's worker events: gloo's worker events on the hooks' clock, and never in the way.

At the collectives level DDP's all_reduce is left to DDP and its end comes from gloo's worker thread,
recorded by the native recorder (:mod:`skewlens.profiler.capture.native`) or, where it cannot be built or
``SKEWLENS_GLOO_EVENTS=kineto`` asks for it, by a Kineto session that records nothing else
(:class:`skewlens.profiler.capture.kineto.WorkerEvents`). A program that profiles itself must work as without
skewlens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.profiler.capture.build import marker_clock_offset
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.vocab import Attr, NodeType


def test_step_markers_pin_kinetos_clock_to_the_hooks_clock() -> None:
    true_offset = 1_234_567
    # time.time_ns() read inside each marker; Kineto saw the marker at (time - offset) +- its own width
    times = [10_000_000, 20_000_000, 30_000_000]
    spans = [(t - true_offset - 3_000, t - true_offset + 1_000) for t in times]
    spans[1] = (times[1] - true_offset - 500, times[1] - true_offset + 9_000)
    off = marker_clock_offset(times, spans)
    assert abs(off - true_offset) <= 1_000  # the intersection of [t - end, t - start] over the markers
    assert marker_clock_offset([], []) == 0
    # markers whose ranges disagree (noise): the median of their middles
    assert marker_clock_offset([100, 100, 100], [(0, 10), (50, 60), (90, 95)]) == 45


SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
seen = bcast = 0
for step in range(STEPS):
    if step == PROFILE_AT:  # the program's own profiler, inside skewlens' window
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.start()
    model(torch.randn(32, 256)).square().mean().backward()
    dist.broadcast(torch.ones(16), src=0)
    opt.step()
    opt.zero_grad()
    if step == PROFILE_AT:
        prof.stop()
        seen = sum(e.name == "aten::addmm" for e in prof.events())
        bcast = sum(e.name == "c10d::broadcast_" for e in prof.events())
print(f"rank {dist.get_rank()} own profiler saw {seen} addmm {bcast} broadcast", file=sys.stderr)
dist.destroy_process_group()
"""


def run_script(
    tmp_path: Path, text: str, *, steps: str = "1:1:4", env: dict[str, str] | None = None
) -> tuple[Path, str]:
    """Run ``text`` on 2 gloo ranks under ``skewlens profile`` at the collectives level."""
    script = tmp_path / "train.py"
    script.write_text(text)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    res = profile(out, level="collectives", steps=steps, command=cmd, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stderr


#: How the worker events are recorded: the native library (default), Kineto asked for, Kineto because
#: the library cannot be built (no compiler; an empty cache so that nothing built earlier is found).
RECORDERS = {
    "native": {},
    "kineto": {"SKEWLENS_GLOO_EVENTS": "kineto"},
    "no compiler": {"CXX": "skewlens-no-such-compiler", "SKEWLENS_CACHE_DIR": "{tmp}/cache"},
}


def recorder_env(recorder: str, tmp_path: Path) -> dict[str, str]:
    return {k: v.format(tmp=tmp_path) for k, v in RECORDERS[recorder].items()}


def ddp_all_reduces(out: Path, rank: int) -> list[dict]:
    colls = [node_attrs(n) for n in read_et(out / f"rank-{rank}.et").nodes if n.type == NodeType.COMM_COLL]
    return [a for a in colls if a[Attr.OP] == "gloo:all_reduce"]


@pytest.mark.slow
@pytest.mark.parametrize("recorder", ["native", "kineto"])
def test_a_program_that_profiles_itself_inside_the_window_keeps_its_profiler(
    tmp_path: Path, recorder: str
) -> None:
    # profiled at step 11, once the hooked calls are kept out of the worker events (after 8 steps)
    text = SCRIPT.replace("PROFILE_AT", "11").replace("STEPS", "14")
    out, stderr = run_script(tmp_path, text, steps="1:1:11", env=recorder_env(recorder, tmp_path))
    for r in (0, 1):
        # its profiler recorded the operators (2 linear layers forward) and the broadcast, as without skewlens
        assert f"rank {r} own profiler saw 2 addmm 1 broadcast" in stderr
        ddp = ddp_all_reduces(out, r)
        assert len(ddp) == 11
        if recorder == "native":  # the native recorder runs beside it: every end is there
            assert f"rank {r} worker events" not in read_manifest(out).notes
            assert all(a[Attr.DUR_NS] > 0 for a in ddp)
        else:  # the program's profiler took Kineto over: the window's worker events are lost
            note = read_manifest(out).notes[f"rank {r} worker events"]
            assert "own profiler" in note and "ends unknown" in note
            assert all(a[Attr.DUR_NS] == 0 for a in ddp)  # there, but without an end


@pytest.mark.slow
@pytest.mark.parametrize("recorder", list(RECORDERS))
def test_without_a_profiler_of_the_programs_own_ddps_all_reduce_gets_its_end(
    tmp_path: Path, recorder: str
) -> None:
    out, stderr = run_script(
        tmp_path,
        SCRIPT.replace("PROFILE_AT", "-1").replace("STEPS", "8"),
        env=recorder_env(recorder, tmp_path),
    )
    m = read_manifest(out)
    for r in (0, 1):
        assert f"rank {r} worker events" not in m.notes
        ddp = ddp_all_reduces(out, r)
        assert len(ddp) == 4 and all(a[Attr.DUR_NS] > 0 for a in ddp)
        steps = {s.step: s for s in m.steps if s.rank == r}
        assert [a[Attr.STEP] for a in ddp] == sorted(steps)  # one a step, in order
        ends = [a[Attr.START_NS] + a[Attr.DUR_NS] for a in ddp]
        assert ends == sorted(ends)
        if recorder == "native":  # on the steps' clock: it runs inside its step (backward waits for it)
            for a in ddp:
                step = steps[a[Attr.STEP]]
                assert step.start_ns <= a[Attr.START_NS] < a[Attr.START_NS] + a[Attr.DUR_NS] <= step.end_ns
        # (Kineto's events are put on that clock through markers, to within their noise: no bound there)
    if recorder == "no compiler":
        assert "skewlens-no-such-compiler" in stderr and "warning" in stderr  # the launcher said so
        for r in (0, 1):
            note = m.notes[f"rank {r} worker events recorder"]
            assert "skewlens-no-such-compiler" in note and "torch's profiler" in note
    elif recorder == "kineto":  # the manifest says which recorder, and why
        for r in (0, 1):
            note = m.notes[f"rank {r} worker events recorder"]
            assert "SKEWLENS_GLOO_EVENTS=kineto" in note and "torch's profiler" in note
    else:
        assert not any("worker events recorder" in k for k in m.notes)


def test_a_profiler_that_cannot_start_or_is_already_running_is_a_note_never_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    import torch._C._autograd as autograd_c

    from skewlens.profiler.capture.kineto import WorkerEvents

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        w = WorkerEvents()
        assert w.start() is False and "own profiler" in w.note
        torch.ones(4).add_(1)
    assert any(e.name == "aten::add_" for e in prof.events())  # the program's profiler is untouched

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("no kineto here")

    monkeypatch.setattr(autograd_c, "_prepare_profiler", boom)
    w = WorkerEvents()
    assert w.start() is False and "could not start" in w.note and "no kineto here" in w.note
    w.mark()
    assert w.stop() == []


LATE_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
on = []
for step in range(6):
    model(torch.randn(8, 64)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # through torch.distributed's Python API: the hooks time it
    if step >= LATE_AT:  # one the hooks cannot see (a functional collective, as DTensor issues)
        t = torch.ops._c10d_functional.all_reduce(torch.ones(16), "sum", dist.group.WORLD.group_name)
        torch.ops._c10d_functional.wait_tensor(t)
    on.append(torch.autograd._profiler_enabled())
    opt.step()
    opt.zero_grad()
print(f"rank {dist.get_rank()} profiler on: {on}", file=sys.stderr)
dist.destroy_process_group()
os._exit(0)  # torch 2.13 may abort at exit after gloo functional collectives; the trace is saved
"""


@pytest.mark.slow
@pytest.mark.parametrize("late_at", [99, 3])
def test_no_profiler_runs_when_every_collective_before_the_window_went_through_the_hooks(
    tmp_path: Path, late_at: int
) -> None:
    out, stderr = run_script(tmp_path, LATE_SCRIPT.replace("LATE_AT", str(late_at)), steps="1:1:3")
    m = read_manifest(out)
    for r in (0, 1):
        assert f"rank {r} profiler on: {[False] * 6}" in stderr  # not in the window either
        colls = [node_attrs(n) for n in read_et(out / f"rank-{r}.et").nodes if n.type == NodeType.COMM_COLL]
        hooked = [a for a in colls if a[Attr.OP] == "c10d::allreduce_"]
        assert len(hooked) == 2 * 3 and all(a[Attr.DUR_NS] > 0 for a in hooked)  # timed by the hooks
        late = [a for a in colls if a[Attr.OP] == "gloo:all_reduce"]
        if late_at == 99:
            assert late == [] and f"rank {r} flight recorder" not in m.notes
        else:  # began inside the window (steps 3 and 4): there, with their arrival, and said to lack an end
            assert [a[Attr.STEP] for a in late] == [3, 4] and all(a[Attr.DUR_NS] == 0 for a in late)
            assert "no end" in m.notes[f"rank {r} flight recorder"]


@pytest.mark.slow
@pytest.mark.parametrize("window", ["0:1:3", "0:0:3"])
def test_a_window_with_no_wait_still_ends_ddps_all_reduce_and_measures_the_clock_offset(
    tmp_path: Path, window: str
) -> None:
    # with no wait the window starts when torch is imported, before the process joins its job: the
    # recorder of gloo's worker events and the clock exchange wait for the first step's end
    out, _ = run_script(tmp_path, SCRIPT.replace("PROFILE_AT", "-1").replace("STEPS", "6"), steps=window)
    m = read_manifest(out)
    for r in (0, 1):
        steps = {s.step: s for s in m.steps if s.rank == r}
        ddp = {a[Attr.STEP]: a for a in ddp_all_reduces(out, r)}
        assert sorted(ddp) == sorted(steps)
        for step, a in ddp.items():
            if step == 0:  # issued before the recorder could start: no end, nor a later one's
                assert a[Attr.DUR_NS] == 0
            else:  # before: every one 0 (no end); it ends inside its step (backward waits for it)
                assert steps[step].start_ns <= a[Attr.START_NS] < a[Attr.START_NS] + a[Attr.DUR_NS]
                assert a[Attr.START_NS] + a[Attr.DUR_NS] <= steps[step].end_ns
    assert m.clock_offsets_ns[1] != 0  # exchanged (two processes never read exactly the same clock)
