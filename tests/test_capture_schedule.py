"""The capture window is a pure function step -> action with an explicit transition table."""

from __future__ import annotations

import pytest

from skewlens.profiler.capture.schedule import (
    TRANSITIONS,
    Action,
    Phase,
    action_for,
    format_window,
    parse_window,
    phases_between,
)
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import StepWindow


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (StepWindow(wait=1, warmup=1, active=3), "N W R R R D D"),
        (StepWindow(wait=0, warmup=0, active=2), "R R D D D D D"),
        (StepWindow(wait=2, warmup=0, active=1), "N N R D D D D"),
        (StepWindow(wait=0, warmup=2, active=1), "W W R D D D D"),
    ],
)
def test_each_step_gets_the_action_of_its_place_in_the_window(window: StepWindow, expected: str) -> None:
    letters = {"N": Action.NONE, "W": Action.WARMUP, "R": Action.RECORD, "D": Action.DONE}
    assert [action_for(s, window) for s in range(7)] == [letters[c] for c in expected.split()]


def test_exactly_active_steps_are_recorded_whatever_the_window() -> None:
    for wait in range(3):
        for warmup in range(3):
            for active in range(1, 4):
                w = StepWindow(wait=wait, warmup=warmup, active=active)
                recorded = [s for s in range(20) if action_for(s, w) == Action.RECORD]
                assert recorded == list(range(wait + warmup, wait + warmup + active))


def test_walking_any_window_runs_warmup_record_and_save_once_each_in_order() -> None:
    for w in (StepWindow(wait=1, warmup=1, active=3), StepWindow(wait=0, warmup=0, active=1)):
        phases: list[Phase] = []
        prev = Action.NONE
        for s in range(10):
            cur = action_for(s, w)
            phases.extend(phases_between(prev, cur))
            prev = cur
        assert phases == [Phase.START_WARMUP, Phase.START_RECORD, Phase.SAVE]


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (StepWindow(wait=1, warmup=1, active=0), [Phase.START_WARMUP, Phase.SAVE]),
        (StepWindow(wait=1, warmup=0, active=0), [Phase.SAVE]),
    ],
)
def test_a_window_without_recorded_steps_given_to_the_api_still_saves_once_when_it_is_done(
    window: StepWindow, expected: list[Phase]
) -> None:
    # capture(steps=StepWindow(...)) takes a window parse_window would refuse; its capture still ends
    phases: list[Phase] = []
    prev = Action.NONE
    for s in range(5):
        cur = action_for(s, window)
        phases.extend(phases_between(prev, cur))
        prev = cur
    assert phases == expected


def test_unchanged_action_runs_no_phase() -> None:
    assert all(phases_between(a, a) == () for a in Action)
    assert all(prev != cur for prev, cur in TRANSITIONS)


@pytest.mark.parametrize("spec", ["1:1:3", "0:0:1", "5:2:10"])
def test_a_window_spec_round_trips(spec: str) -> None:
    assert format_window(parse_window(spec)) == spec


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("1:1", "WAIT:WARMUP:ACTIVE"),
        ("a:1:3", "integers"),
        ("1:1:0", "ACTIVE >= 1"),
        ("-1:0:2", ">= 0"),
        ("1:1:4611686018427387905", "at most 2**62 (4611686018427387904)"),
    ],
)
def test_a_bad_window_spec_is_a_one_line_error_naming_the_flag(spec: str, words: str) -> None:
    with pytest.raises(CaptureError) as e:
        parse_window(spec)
    msg = str(e.value)
    assert "--steps" in msg and spec in msg and words in msg and "\n" not in msg


def test_capture_starts_in_training_processes_but_not_in_torchruns_launcher() -> None:
    from skewlens.profiler.capture.autostart import _is_launcher

    assert _is_launcher(["/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"])
    assert not _is_launcher(["examples/train.py", "--steps", "3"])
    # python -m torch.distributed.run: while -m imports torch, argv[0] is "-m"; the interpreter's line says
    py = "/venv/bin/python"
    assert _is_launcher(["-m"], [py, "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"])
    assert not _is_launcher(["-m"], [py, "-u", "-m", "mypkg.train", "--steps", "3"])
    assert not _is_launcher(["train.py"], [py, "train.py", "-m"])


def test_a_process_of_a_wrapped_command_that_never_imports_torch_imports_no_capture_machinery() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    import skewlens.profiler.capture

    boot = Path(skewlens.profiler.capture.__file__).parent / "bootstrap"
    env = {**os.environ, "SKEWLENS_CAPTURE_DIR": "/nonexistent/run", "PYTHONPATH": os.pathsep.join(
        [str(boot), *[p for p in sys.path if p]]
    )}  # fmt: skip
    seen = "('numpy', 'skewlens.profiler.capture.session', 'skewlens.profiler.capture.autostart')"
    code = f"import sys; print(sorted(m for m in {seen} if m in sys.modules))"
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    # before: the bootstrap's import of autostart imported the capture session, numpy and the trace store
    # (0.28 s for `python -c pass`, against 0.03 s without the bootstrap)
    assert res.stdout.split("\n")[0] == "['skewlens.profiler.capture.autostart']"


def test_a_window_past_what_a_part_file_may_hold_is_refused_at_the_flag_and_the_bound_is_taken() -> None:
    # --steps 1:1:10**21 was taken; both ranks saved their traces, the merge refused their part files (a
    # window past 2**62) and the run ended "no rank saved a trace", its traces without a manifest
    with pytest.raises(CaptureError) as e:
        parse_window("1:1:1000000000000000000000")
    assert str(e.value) == (
        "--steps '1:1:1000000000000000000000': WAIT, WARMUP and ACTIVE must be at most 2**62 "
        "(4611686018427387904)"
    )
    assert parse_window(f"{2**62}:0:{2**62}") == StepWindow(wait=2**62, warmup=0, active=2**62)
