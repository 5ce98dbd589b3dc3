"""A node with no usable temporary directory (``TMPDIR`` missing, ``/tmp`` and ``/var/tmp`` read-only, a
read-only working directory): what still runs there, and the one line the rest says. The environment is
simulated by Python's own failure, ``tempfile.gettempdir`` raising ``No usable temporary directory found``
(a chmod would not stop root)."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from skewlens.cli import main as skewlens_main
from skewlens.paths import CONF_DIR

NONE_USABLE = "No usable temporary directory found in ['/nowhere', '/tmp', '/var/tmp', '/usr/tmp', '/ro']"


@pytest.fixture
def no_temp_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    def gettempdir() -> str:
        raise FileNotFoundError(errno.ENOENT, NONE_USABLE)

    monkeypatch.setattr(tempfile, "gettempdir", gettempdir)  # mkdtemp and mkstemp without dir= call it
    monkeypatch.setattr(tempfile, "tempdir", None)


def _step_times(out: Path) -> list[tuple[int, int, int]]:
    rows = pq.read_table(out / "summary.parquet").to_pylist()
    return sorted((r["rank"], r["step"], r["step_time_ns"]) for r in rows)


def test_a_replay_needs_no_temporary_directory_and_times_the_steps_as_with_one(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every replay (simulated, real, a sweep) was a FileNotFoundError traceback and exit code 1: the CLI
    # made a temporary directory for topology files whether one was given or not
    args = [f"trace={run_dir}", "slowdown=straggler", "slowdown.rank=1", "progress=false"]
    assert skewlens_main(["replay", f"out={tmp_path / 'with'}", *args]) == 0

    def gettempdir() -> str:
        raise FileNotFoundError(errno.ENOENT, NONE_USABLE)

    monkeypatch.setattr(tempfile, "gettempdir", gettempdir)
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert skewlens_main(["replay", f"out={tmp_path / 'without'}", *args]) == 0
    times = _step_times(tmp_path / "without")
    assert [(r, s) for r, s, _ in times] == [(r, s) for r in range(4) for s in range(2)]
    assert times == _step_times(tmp_path / "with")


def test_a_topology_file_needs_no_temporary_directory_and_replays_under_the_files_topology(
    run_dir: Path, tmp_path: Path, no_temp_dir: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # the file was copied into a temporary directory put on Hydra's search path: with none, the replay was
    # refused ("topology=FILE: cannot be copied where Hydra finds it: No usable temporary directory ...")
    topo = tmp_path / "net.yaml"
    topo.write_text((CONF_DIR / "topology" / "ring.yaml").read_text().replace("name: ring", "name: mine"))
    out = tmp_path / "out"
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", f"topology={topo}"]) == 0, (
        capsys.readouterr().err
    )
    config = (out / "config.yaml").read_text()
    assert "name: mine" in config and "kind: ring" in config


@pytest.mark.usefixtures("no_temp_dir")
def test_an_export_in_worker_processes_says_what_to_set_and_one_process_needs_none(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # multiprocessing's forkserver makes its socket in a temporary directory: the export said "cannot write
    # RUN/parquet: No such file or directory" (a directory that was there, writable)
    out = tmp_path / "pq"
    assert skewlens_main(["export", str(run_dir), "--out", str(out), "--workers", "2"]) == 2
    assert capsys.readouterr().err == (
        f"skewlens export: error: the export's worker processes need a temporary directory: {NONE_USABLE}; "
        "set TMPDIR to a writable directory (or --workers 1)\n"
    )
    assert not out.exists()
    assert skewlens_main(["export", str(run_dir), "--out", str(out), "--workers", "1"]) == 0
    ranks = pq.read_table(out / "ranks.parquet").column("rank").to_pylist()
    assert sorted(ranks) == [0, 1, 2, 3]


@pytest.mark.usefixtures("no_temp_dir")
def test_an_import_says_its_scratch_files_need_a_temporary_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a FileNotFoundError traceback, exit code 1
    trace = tmp_path / "rank0.json"
    trace.write_text('{"traceEvents": [], "distributedInfo": {"rank": 0, "world_size": 1}}')
    out = tmp_path / "run"
    assert skewlens_main(["import", "--kineto", str(trace), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"skewlens import: error: the import's scratch files need a temporary directory: {NONE_USABLE}; "
        "set TMPDIR to a writable directory\n"
    )
    assert not out.exists()


@pytest.mark.usefixtures("no_temp_dir")
def test_profile_says_before_the_command_runs_that_no_temporary_directory_is_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torchrun's own FileNotFoundError traceback (its log directory), then "command exited with code 1 ...
    # (no rank saved a trace)", was all a user saw
    import sys

    run = tmp_path / "run"
    assert skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", "pass"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"skewlens profile: warning: {NONE_USABLE}; set TMPDIR to a writable directory (torchrun and torch "
        "need one)"
    )
