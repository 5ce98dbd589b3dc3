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
from skewlens.profiler.chakra_io import read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.vocab import NodeType


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
