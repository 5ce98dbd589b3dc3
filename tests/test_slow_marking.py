"""The slow-marker check (:mod:`slow_guard`): a test that starts torch ranks without the marker fails.

The command lines are classified in-process; the enforcement itself is shown on a small pytest session of
its own (a subprocess running a few throw-away tests with the same check), so that what it refuses there
fails those tests and not this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from slow_guard import launch_reason

TESTS_DIR = Path(__file__).resolve().parent
PY = sys.executable


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ([PY, "-m", "torch.distributed.run", "--standalone", "t.py"], "starts torch.distributed.run"),
        ([PY, "-mtorch.distributed.launch", "t.py"], "starts torch.distributed.launch"),
        (["/venv/bin/torchrun", "--nproc-per-node=2", "t.py"], "starts torchrun"),
        ("torchrun --nproc-per-node 2 t.py", "starts torchrun"),
        ([PY, "-m", "skewlens", "profile", "--out", "o", "--", PY, "t.py"], "runs skewlens profile"),
        ([PY, "-m", "skewlens", "demo", "--out", "o"], "runs skewlens demo"),
        (["/venv/bin/skewlens", "--quiet", "demo"], "runs skewlens demo"),
        ([PY, "-m", "skewlens.cli.profile"], "runs skewlens.cli.profile"),
        ([PY, "-m", "skewlens", "replay", "trace=run"], None),
        ([PY, "-m", "skewlens", "analyze", "run"], None),
        ([PY, "-c", "import torch"], None),
        (["g++", "-shared", "gloo_events.cpp"], None),
    ],
)
def test_command_lines_that_start_ranks_are_told_from_the_others(command: object, reason: str | None) -> None:
    assert launch_reason(command) == reason


def test_a_process_given_torchelastics_worker_environment_needs_the_marker() -> None:
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}
    assert launch_reason([PY, "-u", "train.py"], env) == (
        "starts a torchelastic worker (TORCHELASTIC_RUN_ID in its environment)"
    )
    assert launch_reason([PY, "-u", "train.py"], {"RANK": "0"}) is None


INNER_TESTS = """
import multiprocessing, subprocess, sys
import pytest

HARMLESS = [sys.executable, "-c", "pass", "-m", "torch.distributed.run"]  # torchrun's name, runs nothing


def test_unmarked_torchrun():
    subprocess.run(HARMLESS, check=True)


@pytest.mark.slow
def test_marked_torchrun():
    subprocess.run(HARMLESS, check=True)


def test_unmarked_that_swallows_the_refusal():
    try:
        subprocess.run(["torchrun", "--nproc-per-node=2", "t.py"])
    except BaseException:
        pass


@pytest.fixture(scope="module")
def captured():
    subprocess.run([sys.executable, "-m", "skewlens", "profile", "--help-not-run"], check=False)


def test_unmarked_using_a_capture_fixture(captured):
    pass


def rank():
    pass


rank.__module__ = "torch.multiprocessing.spawn"  # what mp.spawn starts


def test_unmarked_mp_spawn():
    multiprocessing.get_context("spawn").Process(target=rank).start()


def test_unmarked_two_python_processes_at_once():
    first = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    finally:
        first.communicate(b"")


def test_unmarked_python_processes_one_after_the_other():
    for _ in range(2):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_tests_starting_ranks_without_the_slow_marker_fail_naming_themselves(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: multi-process\n")
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(TESTS_DIR)!r})
            from slow_guard import install, pytest_runtest_makereport, pytest_runtest_protocol
            install()
            """
        )
    )
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    junit = tmp_path / "junit.xml"
    res = subprocess.run(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "test_inner.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # (hydra's plugin alone takes seconds)
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1, res.stdout[-3000:]
    outcomes = {}  # test name: "passed", or the text of its failure (or of its fixture's error)
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = next((p for p in case if p.tag in ("failure", "error")), None)
        outcomes[case.get("name")] = "passed" if problem is None else problem.get("message", "")
    assert outcomes.pop("test_marked_torchrun") == "passed"
    assert outcomes.pop("test_unmarked_python_processes_one_after_the_other") == "passed"
    expected = {
        "test_unmarked_torchrun": "starts torch.distributed.run",
        "test_unmarked_that_swallows_the_refusal": "starts torchrun",
        "test_unmarked_using_a_capture_fixture": "runs skewlens profile",
        "test_unmarked_mp_spawn": "starts a multiprocessing process running torch.multiprocessing.spawn.rank",
        "test_unmarked_two_python_processes_at_once": "starts a second Python process",
    }
    assert sorted(outcomes) == sorted(expected)
    for name, words in expected.items():
        assert f"test_inner.py::{name} {words}" in outcomes[name], outcomes[name]
        assert "must be marked @pytest.mark.slow" in outcomes[name]
