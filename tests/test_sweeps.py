"""Sweeps of ``skewlens replay -m`` on other Hydra launchers: joblib (parallel on one machine), submitit.

Each job writes its outputs into its own ``SWEEP/<job>/`` and its row (or its error) into ``SWEEP/.jobs/``;
the process that launched the sweep gathers ``sweep.parquet`` and names the failed jobs.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from skewlens.cli import main as skewlens_main
from skewlens.cli.replay import CONF_DIR, check_launcher, register_configs, to_config
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.outputs import SweepRecord, distinct_overrides
from skewlens.replay.plots import sweep_plot, sweep_points
from skewlens.replay.summary import SummaryRecord
from skewlens.replay.sweep import (
    JOBS_DIR,
    SweepSummary,
    append_sweep_row,
    clear_earlier_sweep,
    collect_sweep,
    hold_sweep,
    record_failure,
)

README = Path(__file__).resolve().parents[1] / "README.md"
#: Compute of rank r in the synthetic run, ns (rank 2 is the one ``slowdown=straggler`` slows).
COMPUTE_NS = [2_000_000 + 100_000 * r for r in range(4)]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """4 ranks, 2 steps of compute then an all_reduce; every rank's all_reduce ends when the last
    (rank 3) arrives, so recorded transfers take no time."""
    b = RunBuilder(world_size=4)
    for r in range(4):
        rb = b.rank(r)
        for s in range(2):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=COMPUTE_NS[r], start_ns=s * 2_600_000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=COMPUTE_NS[3] - COMPUTE_NS[r])
    return b.write(tmp_path / "run")


def _sweep(run_dir: Path, out: Path, factors: str, *launcher: str) -> subprocess.CompletedProcess[str]:
    """``python -m skewlens replay -m`` of the straggler's factors on a launcher, as a user runs it (the
    launcher's workers are its children)."""
    args = ["-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", f"slowdown.factor={factors}"]
    return subprocess.run(
        [sys.executable, "-m", "skewlens", "replay", *args, *launcher, "progress=false", "perfetto=false"],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        cwd=out.parent,
    )


def _summary(job_dir: Path) -> dict[int, tuple[int, int]]:
    """rank -> (compute_ns, step_time_ns) of step 0 of one job's summary."""
    rows = pq.read_table(job_dir / "summary.parquet").to_pylist()
    return {r["rank"]: (r["compute_ns"], r["step_time_ns"]) for r in rows if r["step"] == 0}


def _assert_straggler_sweep(out: Path, factors: list[float]) -> None:
    """Job k replayed slowdown.factor=factors[k]: rank 2's compute scaled by it, the others' unchanged."""
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["job"] for r in rows] == list(range(len(factors)))
    for k, factor in enumerate(factors):
        job = out / str(k)
        assert rows[k]["out_dir"] == str(job)
        assert f"slowdown.factor={factor}" in rows[k]["overrides"].split()
        assert OmegaConf.load(job / "config.yaml").slowdown.entries[0].factor == factor
        got = _summary(job)
        want = [round(c * factor) if r == 2 else c for r, c in enumerate(COMPUTE_NS)]
        assert [got[r][0] for r in range(4)] == want
        # the last member to arrive ends the step (the recorded transfers take no time)
        assert {got[r][1] for r in range(4)} == {max(want)}
        assert rows[k]["mean_step_ns"] == max(want)


@pytest.mark.slow
def test_a_joblib_sweep_runs_its_points_in_worker_processes_each_into_its_own_directory(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    res = _sweep(run_dir, out, "1.0,2.0", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert res.returncode == 0, res.stderr
    _assert_straggler_sweep(out, [1.0, 2.0])
    assert sorted(p.name for p in (out / JOBS_DIR).iterdir()) == ["0.parquet", "1.parquet"]
    assert "Replay sweep" in res.stdout
    assert f"sweep plot: {out / 'sweep.png'}" in " ".join(res.stdout.split())
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_joblib_sweep_over_two_topology_files_replays_each_in_its_worker_under_that_files_topology(
    run_dir: Path, tmp_path: Path
) -> None:
    # the files are entries in Hydra's ConfigStore, which the launcher hands to its worker processes (they
    # were copies in a temporary directory on Hydra's search path); nothing is left in TMPDIR
    files = []
    for name, bandwidth in (("slow", 1.0), ("fast", 100.0)):
        text = (CONF_DIR / "topology" / "switch.yaml").read_text()
        text = text.replace("name: switch", f"name: {name}").replace("50.0", str(bandwidth))
        (f := tmp_path / f"{name}.yaml").write_text(text)
        files.append(str(f))
    out, temp = tmp_path / "sweep", tmp_path / "temp"
    temp.mkdir()
    args = ["-m", f"trace={run_dir}", f"out={out}", f"topology={','.join(files)}", "comm_mode=model"]
    res = subprocess.run(
        [sys.executable, "-m", "skewlens", "replay", *args, "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", "progress=false", "perfetto=false"],
        capture_output=True, text=True, check=False, timeout=240, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    saved = [OmegaConf.load(out / job / "config.yaml").topology for job in ("0", "1")]
    assert [(t.name, t.dims[0].bandwidth_gbps) for t in saved] == [("slow", 1.0), ("fast", 100.0)]
    slow, fast = (_summary(out / job) for job in ("0", "1"))
    assert all(slow[r][1] > fast[r][1] for r in slow)  # each replayed on its own file's network
    assert [p.name for p in temp.iterdir() if p.name.startswith("skewlens")] == []


@pytest.mark.slow
def test_a_failing_point_of_a_joblib_sweep_is_named_with_its_overrides_and_the_others_finish(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    res = _sweep(run_dir, out, "1.0,-2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert res.returncode == 2
    # job 0's warnings (rank 3's communication without an end) aside
    assert [line for line in res.stderr.strip().splitlines() if ": warning: " not in line] == [
        (
            "skewlens replay: error: sweep job 1 (slowdown.factor=-2): slowdown.factor: must be a finite "
            "number > 0, got -2.0"
        ),
        f"skewlens replay: 1 of 2 sweep jobs failed; the others' outputs are in {out}",
    ]
    assert "Traceback" not in res.stdout + res.stderr
    _assert_straggler_sweep(out, [1.0])
    assert not (out / "1").exists()  # the failed point leaves no directory of its own behind


@pytest.mark.slow  # three replays in this process, 7 s
def test_a_failing_point_of_a_sweep_in_this_process_is_reported_the_same_way(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, "slowdown.factor=3.0", "perfetto=false"]) == 0
    capsys.readouterr()
    # the same directory again, where an earlier, longer sweep left job 7's row: not this sweep's
    shutil.copy(out / JOBS_DIR / "0.parquet", out / JOBS_DIR / "7.parquet")
    rc = skewlens_main([*args, "slowdown.factor=-1,2.0", "perfetto=false"])
    # job 1's warnings (rank 3's communication without an end) aside
    err = [line for line in capsys.readouterr().err.strip().splitlines() if ": warning: " not in line]
    assert rc == 2
    assert err[0] == (
        "skewlens replay: error: sweep job 0 (slowdown.factor=-1): slowdown.factor: must be a finite "
        "number > 0, got -1.0"
    )
    assert len(err) == 2
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [(r["job"], "slowdown.factor=2.0" in r["overrides"]) for r in rows] == [(1, True)]
    # job 0 failed: the first sweep's job 0 (factor 3.0) is not left in its place
    assert not (out / "0").exists()
    assert OmegaConf.load(out / "1" / "config.yaml").slowdown.factor == 2.0


def test_a_sweep_whose_picture_cannot_be_drawn_is_an_error_with_its_table_kept(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # HOME read-only and no temporary directory (a locked-down node): matplotlib's import raised OSError
    # in Hydra's end-of-sweep callback, which Hydra printed as two lines, "UserWarning: Callback
    # SweepSummary.on_multirun_end raised OSError: Matplotlib requires access to a writable cache
    # directory ..." and "warnings.warn(", then exit code 0 without sweep.png. The import is made to fail
    # as it did there (the test process has matplotlib loaded already)
    import types

    class Unimportable(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            raise OSError("Matplotlib requires access to a writable cache directory; set MPLCONFIGDIR")

    monkeypatch.setitem(sys.modules, "matplotlib.figure", Unimportable("matplotlib.figure"))
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, "slowdown.factor=1.0,2.0", "perfetto=false"]) == 2
    # the jobs' warnings (rank 3's communication without an end) aside
    err = [line for line in capsys.readouterr().err.splitlines() if ": warning: " not in line]
    said = "cannot draw pictures: Matplotlib requires access to a writable cache directory; set MPLCONFIGDIR"
    assert err == [f"skewlens replay: error: {said}"]
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert sorted(r["job"] for r in rows) == [0, 1]
    assert not (out / "sweep.png").exists()


def test_a_sweep_with_one_finished_job_says_it_draws_no_picture(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # sweep.png compares two or more finished jobs: of one (a sweep of one point, or of several of which
    # all but one failed) the sweep printed its table and no "sweep plot:" line, and wrote no picture,
    # without a word
    out = tmp_path / "sweep"
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown.factor=2.0"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "sweep plot: none (sweep.png draws two or more finished jobs; 1 finished)" in said
    assert not (out / "sweep.png").exists()
    assert [r["job"] for r in pq.read_table(out / "sweep.parquet").to_pylist()] == [0]


def test_a_sweep_into_the_directory_of_an_earlier_one_first_removes_that_ones_job_outputs_and_table(
    tmp_path: Path,
) -> None:
    # an earlier sweep of 3 points left 0/, 1/, 2/ and sweep.parquet; a user's own folder 7/ (no replay
    # config) and file beside a job's outputs are not a sweep's and stay
    out = tmp_path / "sweep"
    for job in range(3):
        d = out / str(job)
        (d / "real").mkdir(parents=True)
        (d / "config.yaml").write_text(f"trace: /r\nmode: sim\nslowdown:\n  factor: {job}\n")
        for name in ("timeline.parquet", "summary.parquet", "timeline.json", "real/x"):
            (d / name).write_text("old")
    (out / "2" / "mine.txt").write_text("keep")
    (out / "7").mkdir()
    (out / "7" / "config.yaml").write_text("mine: 1\n")
    # a user's own replay beside the jobs: a replay's config.yaml, but not a job number
    (out / "baseline").mkdir()
    (out / "baseline" / "config.yaml").write_text("trace: /r\nmode: sim\n")
    (out / "baseline" / "timeline.parquet").write_text("mine")
    (out / "sweep.parquet").write_text("old")
    (out / "sweep.png").write_text("old")
    SweepSummary().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(out)}}}))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        ".jobs",  # held for the sweep (hold_sweep), empty
        "2",
        "2/mine.txt",
        "7",
        "7/config.yaml",
        "baseline",
        "baseline/config.yaml",
        "baseline/timeline.parquet",
    ]


def test_a_sweep_clears_an_earlier_sweeps_jobs_named_by_their_overrides_and_what_a_killed_job_left(
    tmp_path: Path,
) -> None:
    # an earlier sweep with hydra.sweep.subdir=${hydra.job.override_dirname}: its job directories are named
    # by their overrides (nested by a trace=runs/a value, or deeper), each a replay's config.yaml whose out
    # is the sweep's; a job killed while it wrote left its staging directory in 1/ (and nothing else)
    out = tmp_path / "sweep"
    jobs = ["slowdown.factor=1.0", "slowdown.factor=2.0", "trace=runs/a", "trace=/data/runs/b"]
    for name in jobs:
        d = out / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(f"trace: /r\nout: {out}\nmode: sim\n")
        for f in ("timeline.parquet", "summary.parquet", "timeline.json"):
            (d / f).write_text("old")
    (out / "slowdown.factor=2.0" / "mine.txt").write_text("keep")
    (out / "1" / ".1.k3j2x9ab.tmp").mkdir(parents=True)
    (out / "1" / ".1.k3j2x9ab.tmp" / "timeline.parquet").write_text("half")
    # a user's own replay into a directory of the sweep's: its out is that directory, not the sweep's
    (out / "baseline").mkdir()
    (out / "baseline" / "config.yaml").write_text(f"trace: /r\nout: {out / 'baseline'}\nmode: sim\n")
    (out / "baseline" / "timeline.parquet").write_text("mine")
    SweepSummary().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(out)}}}))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        ".jobs",
        "baseline",
        "baseline/config.yaml",
        "baseline/timeline.parquet",
        "slowdown.factor=2.0",
        "slowdown.factor=2.0/mine.txt",
    ]


def _sweep_config(out: Path) -> DictConfig:
    return OmegaConf.create({"out": str(out), "hydra": {"sweep": {"dir": str(out)}}})


def test_a_second_sweep_into_the_directory_of_a_running_one_is_refused_before_it_clears_that_ones_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the race, forced: sweep A has begun and its job 0 has written its row; sweep B into the same out= then
    # begins. B's clear removed A's row and outputs, and A's summary printed B's rows (or, where B's clear
    # removed a row between A's listing and its reading, no table at all, exiting 0)
    out = tmp_path / "sweep"
    first, second = SweepSummary(), SweepSummary()
    first.on_multirun_start(_sweep_config(out))
    append_sweep_row(out, _row(0, "slowdown.factor=1.0"))
    with pytest.raises(SystemExit) as stop:
        second.on_multirun_start(_sweep_config(out))
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        f"skewlens replay: error: {out}: another sweep into it is running (it holds {out / JOBS_DIR} "
        "locked); give this one an out= of its own, or run it when that one has ended\n"
    )
    first.on_multirun_end(_sweep_config(out))
    assert [r.overrides for r in collect_sweep(out)[0]] == ["slowdown.factor=1.0"]
    second.on_multirun_start(_sweep_config(out))  # A has ended: B may begin, and clears A's
    assert collect_sweep(out)[0] == []


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_refused_sweep_leaves_no_descriptor_of_the_running_ones_directory_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    first = SweepSummary()
    first.on_multirun_start(_sweep_config(out))
    before = _open_fds()
    with pytest.raises(SystemExit):
        SweepSummary().on_multirun_start(_sweep_config(out))
    assert _open_fds() == before
    with pytest.raises(SystemExit):  # no job wrote a row: 'the sweep has no jobs', exit 2
        first.on_multirun_end(_sweep_config(out))
    assert _open_fds() == before - 1  # the first's lock, released all the same
    capsys.readouterr()


def test_a_sweep_runs_unlocked_where_its_directory_cannot_be_made_or_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # out= under a file: the jobs say why they cannot write there; a file system that cannot lock (ENOLCK):
    # the sweep runs unlocked, leaving nothing open
    (tmp_path / "file").write_text("")
    assert hold_sweep(tmp_path / "file" / "sweep") is None

    def no_locks(_fd: int, _op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    before = _open_fds()
    assert hold_sweep(tmp_path / "sweep") is None
    assert _open_fds() == before


def test_a_sweeps_clear_passes_over_a_row_file_removed_since_it_listed_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # where the file system cannot lock (hold_sweep runs unlocked), another sweep's clear removed the rows
    # between this one's listing and its unlink: Hydra's warning 'Callback SweepSummary.on_multirun_start
    # raised FileNotFoundError: ... SW/.jobs/1.parquet', and the earlier sweep's table and outputs stayed
    append_sweep_row(tmp_path, _row(1, "slowdown.factor=1.0"))
    (tmp_path / "sweep.parquet").write_text("old")
    listed = Path.glob

    def glob_then_other_clear(self: Path, pattern: str) -> list[Path]:
        found = list(listed(self, pattern))
        for p in found:
            p.unlink()
        return found

    monkeypatch.setattr(Path, "glob", glob_then_other_clear)
    clear_earlier_sweep(tmp_path)
    assert not (tmp_path / "sweep.parquet").exists()


def _row(job: int, overrides: str) -> SweepRecord:
    return SweepRecord(
        job=job, overrides=overrides, topology="switch", slowdown="none", comm_mode="as_recorded",
        makespan_ns=10, mean_step_ns=5, max_step_ns=6, out_dir=str(job),
    )  # fmt: skip


def test_the_sweep_gathers_each_failed_jobs_overrides_and_its_one_line_error(tmp_path: Path) -> None:
    append_sweep_row(tmp_path, _row(10, "slowdown=none topology=switch"))
    append_sweep_row(tmp_path, _row(0, "slowdown=none topology=switch"))
    # as record_failure writes it: the job's overrides, then its error, a line each
    (tmp_path / JOBS_DIR / "1.error").write_text(
        "slowdown=straggler topology=switch\nrank 9 is not in the run\n"
    )
    rows, failed = collect_sweep(tmp_path)
    assert [r.job for r in rows] == [0, 10]  # by job number
    assert failed == {1: ("slowdown=straggler topology=switch", "rank 9 is not in the run")}


def test_a_sweep_with_a_failed_job_names_it_by_what_sets_it_apart_and_exits_2_with_no_plot_of_one_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append_sweep_row(tmp_path, _row(0, "slowdown=none topology=switch"))
    (tmp_path / JOBS_DIR / "1.error").write_text(
        "slowdown=straggler topology=switch\nrank 9 is not in the run\n"
    )
    with pytest.raises(SystemExit) as stop:
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "skewlens replay: error: sweep job 1 (slowdown=straggler): rank 9 is not in the run",
        f"skewlens replay: 1 of 2 sweep jobs failed; the others' outputs are in {tmp_path}",
    ]
    assert (tmp_path / "sweep.parquet").is_file()
    assert not (tmp_path / "sweep.png").exists()  # drawn with two or more finished jobs


def test_sweep_jobs_that_replayed_into_one_directory_are_named_and_the_sweep_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # hydra.sweep.subdir=${topology.name} in a sweep of slowdown.factor=1.0,2.0: both jobs wrote into
    # SWEEP/switch, which held job 1's outputs (66.3 ms a step) while row 0 said 49.4, and the sweep exited 0
    shared = str(tmp_path / "switch")
    for job, factor in ((0, "1.0"), (1, "2.0"), (2, "3.0")):
        row = _row(job, f"slowdown=straggler slowdown.factor={factor}")
        append_sweep_row(
            tmp_path, dataclasses.replace(row, out_dir=shared if job < 2 else str(tmp_path / "2"))
        )
    with pytest.raises(SystemExit) as stop:
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        (
            "skewlens replay: error: sweep jobs 0, 1 (slowdown.factor=1.0; slowdown.factor=2.0) each "
            f"replayed into {shared}, which holds the last one's outputs only: hydra.sweep.subdir names "
            "their directories the same; give it a name that differs per job (${hydra.job.num}, the "
            "default, or ${hydra.job.override_dirname})"
        )
    ]
    assert [r["job"] for r in pq.read_table(tmp_path / "sweep.parquet").to_pylist()] == [0, 1, 2]


def test_a_failed_jobs_error_line_quoting_a_traces_name_prints_no_terminal_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the dispatcher's error line shows them as U+FFFD (d3f4e2a), but a sweep's job errors, printed by the
    # sweep's summary, passed an op named with ESC ]0;...BEL through: it set the terminal's title
    (tmp_path / JOBS_DIR).mkdir()
    (tmp_path / JOBS_DIR / "0.error").write_text("slowdown=straggler\nnode 7 (\x1b]0;pwned\x07) is bad\n")
    with pytest.raises(SystemExit):
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "node 7 (\N{REPLACEMENT CHARACTER}]0;pwned\N{REPLACEMENT CHARACTER}) is bad" in err


def test_a_job_that_wrote_its_row_and_then_failed_counts_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    cfg = _compose(["slowdown=straggler"], hydra=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path)
        cfg.hydra.job.num = 3
        cfg.hydra.overrides.task = ["slowdown=straggler"]
    HydraConfig.instance().set_config(cfg)
    append_sweep_row(tmp_path, _row(3, "slowdown=straggler"))
    assert record_failure(SkewlensError("real replay: worker 1 died"))
    assert collect_sweep(tmp_path) == ([], {3: ("slowdown=straggler", "real replay: worker 1 died")})
    assert not (tmp_path / "sweep.parquet").exists()  # no job finished: no table


def test_a_job_that_failed_and_then_finished_counts_as_finished(tmp_path: Path) -> None:
    # a cluster job requeued after it failed: its row replaces its error
    (tmp_path / JOBS_DIR).mkdir()
    (tmp_path / JOBS_DIR / "0.error").write_text("slowdown=none\nout of memory\n")
    append_sweep_row(tmp_path, _row(0, "slowdown=none"))
    rows, failed = collect_sweep(tmp_path)
    assert ([r.job for r in rows], failed) == ([0], {})


def _readme_slurm_command() -> list[str]:
    """The overrides of the README's SLURM sweep (the ``skewlens replay -m`` line naming submitit_slurm)."""
    text = README.read_text(encoding="utf-8")
    commands = [
        " ".join(shlex.split(m.group(0).replace("\\\n", " ")))
        for m in re.finditer(r"^skewlens replay -m (?:.*\\\n)*.*$", text, flags=re.MULTILINE)
    ]
    (cmd,) = [c for c in commands if "hydra/launcher=submitit_slurm" in c]
    return shlex.split(cmd)[3:]


def _compose(overrides: list[str], *, hydra: bool) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="replay", overrides=overrides, return_hydra_config=hydra)


def test_the_readme_slurm_sweep_composes_into_a_submitit_slurm_launcher_without_a_cluster() -> None:
    overrides = _readme_slurm_command()
    swept = {o.split("=")[0] for o in overrides if "," in o}
    assert swept == {"topology", "slowdown.factor"}
    point = [o.split(",")[0].replace("=RUN", "=/runs/x").replace("=SWEEP", "=/sweeps/y") for o in overrides]
    cfg = _compose(point, hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    given = dict(
        o.removeprefix("hydra.launcher.").split("=", 1) for o in point if o.startswith("hydra.launcher.")
    )
    assert {k: str(launcher[k]) for k in given} == given
    assert {"partition", "timeout_min", "mem_gb"} <= set(given)
    assert cfg.hydra.sweep.dir == "/sweeps/y"
    assert launcher.submitit_folder == "/sweeps/y/.submitit/%j"
    # the plugin accepts the config (it talks to SLURM only when a sweep is launched)
    plugin = instantiate(launcher)
    assert type(plugin).__name__ == "SlurmLauncher"
    assert plugin.params["partition"] == given["partition"]
    # and each job's own config is valid
    conf = to_config(_compose(point, hydra=False))
    assert (conf.trace, conf.out, conf.comm_mode, conf.slowdown.name) == (
        "/runs/x",
        "/sweeps/y",
        "model",
        "straggler",
    )


@pytest.mark.slow
def test_a_submitit_sweep_runs_on_submitits_local_executor_like_on_a_cluster(
    run_dir: Path, tmp_path: Path
) -> None:
    """The SLURM launcher's path (the task pickled into a job, run, its result read back) without SLURM."""
    out = tmp_path / "sweep"
    res = _sweep(run_dir, out, "1.0,1.5", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=4")
    assert res.returncode == 0, res.stderr
    _assert_straggler_sweep(out, [1.0, 1.5])
    assert len(list((out / ".submitit").glob("*/*_result.pkl"))) == 2


def test_a_sweep_value_not_of_its_settings_type_is_one_line_before_any_point_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"]
    rc = skewlens_main([*args, "slowdown.factor=1.0,1.5,abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [
        (
            "skewlens replay: error: slowdown.factor=1.0,1.5,abc: Value 'abc' of type 'str' could not be "
            "converted to Float"
        )
    ]
    assert not out.exists()
    assert skewlens_main(["replay", f"trace={run_dir}", f"out={out}", "scale.dp=1.5"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("skewlens replay: error: scale.dp=1.5: ")


def test_a_sweep_over_a_glob_of_a_config_groups_entries_runs_the_entries_it_matches(
    run_dir: Path, tmp_path: Path
) -> None:
    # the type check before the sweep asked the glob for its values, which only Hydra's config loader
    # knows: "hydra.errors.HydraException: ConfigLoader is not set", a traceback, and no point ran
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "comm_mode=model", "progress=false"]
    assert skewlens_main([*args, "perfetto=false", "topology=glob(rin*)"]) == 0
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [(r["job"], r["topology"]) for r in rows] == [(0, "ring")]


def test_a_sweep_that_changes_into_each_jobs_directory_reads_relative_paths_from_where_it_was_launched(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # under hydra.job.chdir=true the relative trace was looked for in the job's directory ("run: no such run
    # directory or trace prefix"), and a job wrote its row into SWEEP/<job>/SWEEP/.jobs/: no sweep.parquet
    monkeypatch.chdir(tmp_path)
    args = ["replay", "-m", f"trace={run_dir.name}", "out=sweep", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, "perfetto=false", "hydra.job.chdir=true", "slowdown.factor=1.0,-2"]) == 2
    assert Path.cwd() == tmp_path
    rows = pq.read_table(tmp_path / "sweep" / "sweep.parquet").to_pylist()
    assert [(r["job"], r["mean_step_ns"], r["out_dir"]) for r in rows] == [
        (0, COMPUTE_NS[3], str(tmp_path / "sweep" / "0"))
    ]
    assert (tmp_path / "sweep" / JOBS_DIR / "1.error").read_text(encoding="utf-8").splitlines()[1] == (
        "slowdown.factor: must be a finite number > 0, got -2.0"
    )
    assert sorted(p.name for p in (tmp_path / "sweep" / "0").iterdir()) == [
        "config.yaml",
        "summary.parquet",
        "timeline.parquet",
    ]


@pytest.mark.parametrize("empty", ["topology=glob(nothing*)", "slowdown.factor=range(1,1)"])
def test_a_sweep_whose_overrides_give_no_point_says_so_and_exits_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], empty: str
) -> None:
    # Hydra launched no job and the command exited 0 having printed nothing
    out = tmp_path / "sweep"
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={out}", "progress=false", empty]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            "skewlens replay: error: the sweep has no jobs: its overrides give no point (a glob(...) that "
            "matches no entry of its group, an empty range(...)?)"
        )
    ]
    assert not (out / "sweep.parquet").exists()


@pytest.mark.parametrize(
    ("launcher", "error"),
    [  # Hydra's ten lines: "In 'hydra/config': Could not find 'hydra/launcher/ray'", its options, search path
        (
            "hydra/launcher=ray",
            (
                "no such launcher installed (one of basic, joblib, submitit_local, submitit_slurm; "
                "pip install hydra-ray-launcher for it)"
            ),
        ),
        (
            "hydra/launcher=jobib",
            "no such launcher installed (one of basic, joblib, submitit_local, submitit_slurm)",
        ),
        ("hydra/sweeper=optuna", "no such sweeper installed (one of basic)"),
        # Hydra's ten lines too: "Could not find 'hydra/job_logging/disable'"; hydra/job_logging=null was
        # its ValueError traceback ('Config group override must be a string or a list. Got NoneType')
        ("hydra/job_logging=disable", "no such entry (one of default, disabled, none, stdout)"),
        ("hydra/job_logging=null", "no such entry (one of default, disabled, none, stdout)"),
        (
            "hydra/joblogging=disabled",
            (
                "no such group of Hydra's (one of hydra/env, hydra/help, hydra/hydra_help, "
                "hydra/hydra_logging, hydra/job_logging, hydra/launcher, hydra/output, hydra/sweeper)"
            ),
        ),
        (  # submitit's RuntimeError traceback: 'Could not detect "srun", are you indeed on a slurm cluster?'
            "hydra/launcher=submitit_slurm",
            (
                "no SLURM here (srun is not on PATH): run the sweep on a SLURM login node, or "
                "hydra/launcher=submitit_local for the same jobs on this machine"
            ),
        ),
    ],
)
def test_a_launcher_that_is_not_installed_or_slurm_where_there_is_none_is_one_line_before_any_point_runs(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    launcher: str,
    error: str,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.factor=1,2"]
    assert skewlens_main([*args, launcher]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {launcher}: {error}"]
    assert not out.exists()


def test_a_slurm_sweeps_config_is_composed_and_shown_where_there_is_no_slurm(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --cfg runs nothing, and composing on a laptop is how a sweep is checked before it goes to the cluster:
    # it was refused 'no SLURM here (srun is not on PATH)'
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    out = tmp_path / "sweep"
    args = [
        "replay",
        "hydra.mode=MULTIRUN",
        f"trace={run_dir}",
        f"out={out}",
        "hydra/launcher=submitit_slurm",
    ]
    assert (
        skewlens_main([*args, "hydra.launcher.partition=cpu", "--cfg", "hydra", "-p", "hydra.launcher"]) == 0
    )
    shown = OmegaConf.create(capsys.readouterr().out.partition("\n")[2])  # after '# @package hydra.launcher'
    assert shown._target_.endswith("submitit_launcher.SlurmLauncher")
    assert shown.partition == "cpu"


#: How a refused joblib setting ends: the launcher's settings.
JOBLIB_HAS = (
    "(the joblib launcher has n_jobs, backend, prefer, require, verbose, timeout, pre_dispatch, batch_size, "
    "temp_folder, max_nbytes, mmap_mode)"
)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [  # Hydra's six lines each; n_jobs=0 joblib's ValueError traceback once the sweep had begun
        (
            ["hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
            "joblib takes a number of workers, or -1 for one per CPU",
        ),
        (
            ["hydra/launcher=joblib", "hydra.launcher.n_jobs=two"],
            "Value 'two' of type 'str' could not be converted to Integer " + JOBLIB_HAS,
        ),
        (
            ["hydra/launcher=joblib", "hydra.launcher.n_job=2"],
            "Key 'n_job' not in 'JobLibLauncherConf' " + JOBLIB_HAS,
        ),
        (
            ["hydra.launcher.n_jobs=2"],
            "Key 'n_jobs' not in 'BasicLauncherConf' (the basic launcher has no settings)",
        ),
    ],
)
def test_a_launcher_setting_it_lacks_or_of_the_wrong_type_is_one_line_before_any_point_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], error: str
) -> None:
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.factor=1,2"]
    assert skewlens_main([*args, *overrides]) == 2
    said = f"{overrides[-1]}: {error}"
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {said}"]
    assert not out.exists()


def test_the_readme_slurm_sweeps_launcher_settings_pass_the_launcher_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # on a login node: srun is there
    check_launcher(["-m", *_readme_slurm_command()])  # refuses nothing the README shows


def test_hydras_mode_override_sweeps_as_m_does(run_dir: Path, tmp_path: Path) -> None:
    # Hydra's own 'hydra.mode=MULTIRUN' in place of -m was refused as a sweep value without -m
    out = tmp_path / "sweep"
    args = ["replay", f"trace={run_dir}", f"out={out}", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, "hydra.mode=MULTIRUN", "slowdown=straggler", "slowdown.factor=1,2"]) == 0
    assert pq.read_table(out / "sweep.parquet").num_rows == 2


def test_launcher_settings_are_left_to_hydra_where_the_users_primary_config_chooses_the_launcher(
    run_dir: Path, tmp_path: Path
) -> None:
    # its joblib was not seen: 'hydra.launcher.n_jobs=2' was refused as a setting the basic launcher lacks
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mine.yaml").write_text("defaults:\n  - replay\n  - override hydra/launcher: joblib\n  - _self_\n")
    out = tmp_path / "sweep"
    args = [
        "replay",
        "-m",
        "-cd",
        str(cfg),
        "-cn",
        "mine",
        f"trace={run_dir}",
        f"out={out}",
        "progress=false",
    ]
    assert skewlens_main([*args, "perfetto=false", "slowdown.factor=1,2", "hydra.launcher.n_jobs=1"]) == 0
    assert pq.read_table(out / "sweep.parquet").num_rows == 2


@pytest.mark.parametrize(
    ("params", "says"),
    [  # Hydra's four lines, whose advice for a misspelt key was 'To append to your config use +...'
        (
            ["slowdown: straggler", "slowdown.factr: 1,2"],
            "slowdown.factr: no such setting (slowdown has name, factor, rank, delay_ms, step, entries; did",
        ),
        (
            ["slowdown.factor: 1,abc"],
            "slowdown.factor=1,abc: Value 'abc' of type 'str' could not be converted",
        ),
        (["slowdown: stragler,none"], "slowdown=stragler: no such entry (one of host_idle, jitter, none,"),
    ],
)
def test_a_bad_sweep_in_the_users_primary_configs_sweeper_params_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], params: list[str], says: str
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    sweep = "defaults: [replay, _self_]\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n"
    (cfg / "mine.yaml").write_text(sweep + "".join(f"      {p}\n" for p in params))
    out = tmp_path / "sweep"
    args = ["replay", "-cd", str(cfg), "-cn", "mine", f"trace={tmp_path / 'run'}", f"out={out}"]
    assert skewlens_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"skewlens replay: error: {cfg / 'mine.yaml'}: hydra.sweeper.params: {says}"), (
        err
    )
    assert len(err) == 1 and not out.exists()


def test_a_launcher_entry_of_the_users_config_dir_is_taken(run_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg" / "hydra" / "launcher"
    cfg.mkdir(parents=True)
    (cfg / "mine.yaml").write_text("defaults:\n  - basic\n")
    out = tmp_path / "sweep"
    args = ["replay", "-m", "-cd", str(tmp_path / "cfg"), f"trace={run_dir}", f"out={out}", "progress=false"]
    assert skewlens_main([*args, "perfetto=false", "hydra/launcher=mine"]) == 0
    assert pq.read_table(out / "sweep.parquet").num_rows == 1


def test_a_sweep_over_out_is_one_line_before_any_point_runs(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # each point ran into its own directory, and the launching process took the sweep's directory for "."
    # (writing multirun.yaml and clearing an earlier sweep's job directories there), found no job's row there
    # and exited 0 with no sweep.parquet anywhere
    monkeypatch.chdir(tmp_path)
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", "out=a,b", "progress=false"]) == 2
    said = "out=a,b: a sweep writes every point under one out (OUT/<job>/); sweep other settings"
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_sweep_without_out_says_so_once_and_leaves_the_current_directory_as_it_was(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the sweep's directory became ".": an earlier sweep's job outputs there were removed, .jobs/ and
    # multirun.yaml written, and every job failed on the missing out, one line each
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "0"
    earlier.mkdir()
    (earlier / "config.yaml").write_text(f"trace: {run_dir}\nmode: sim\n")
    (earlier / "summary.parquet").write_text("an earlier sweep's")
    args = ["replay", "-m", f"trace={run_dir}", "slowdown=straggler", "slowdown.factor=1,2", "progress=false"]
    assert skewlens_main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "skewlens replay: error: out: missing value (give it on the command line, e.g. out=...)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "run"]
    assert (earlier / "summary.parquet").read_text() == "an earlier sweep's"


def test_a_sweep_subdir_the_same_for_every_job_is_one_line_before_any_point_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each job replayed into SWEEP/same over the one before; the table named SWEEP/same for every row
    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.factor=1,2"]
    assert skewlens_main([*args, "hydra.sweep.subdir=same"]) == 2
    said = (
        "hydra.sweep.subdir=same: every job would write into that one directory; it must differ per job "
        "(${hydra.job.num}, the default, or ${hydra.job.override_dirname})"
    )
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {said}"]
    assert not out.exists()


def test_a_sweep_subdir_is_left_alone_in_a_single_run(run_dir: Path, tmp_path: Path) -> None:
    # a single run has no job directories: 'hydra.sweep.subdir=same' was refused as if it swept
    args = ["replay", f"trace={run_dir}", f"out={tmp_path / 'o'}", "progress=false", "perfetto=false"]
    assert skewlens_main([*args, "hydra.sweep.subdir=same"]) == 0
    assert (tmp_path / "o" / "summary.parquet").is_file()


@pytest.mark.parametrize(
    ("sweep", "error"),
    [  # each was a traceback from the type check: HydraException "Can only enumerate CHOICE and RANGE
        # sweeps", ValueError "range() arg 3 must not be zero"
        (
            "slowdown.factor=interval(1,2)",
            (
                "interval() is for sweepers that sample (Optuna, Nevergrad); Hydra's basic sweeper takes a "
                "comma list, range() or choice()"
            ),
        ),
        ("slowdown.factor=range(1,2,0)", "range() arg 3 must not be zero"),
    ],
)
def test_a_sweep_the_basic_sweeper_cannot_enumerate_is_one_line_before_any_point_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sweep: str, error: str
) -> None:
    out = tmp_path / "sweep"
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", sweep]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {sweep}: {error}"]
    assert not out.exists()


@pytest.mark.parametrize(
    "params",
    [  # each was a traceback, as in any Hydra app whose sweeper's params are null: OmegaConf's AttributeError
        # "'NoneType' object has no attribute 'get'", AssertionError "Unexpected type for root: NoneType"
        '+hydra.sweeper.params={slowdown.factor:"1,3"}',
        'hydra.sweeper.params={slowdown.factor:"1,3"}',
        '++hydra.sweeper.params.slowdown.factor="1,3"',
    ],
)
def test_the_sweepers_params_on_the_command_line_are_one_line_saying_where_a_sweep_is_given(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], params: str
) -> None:
    out = tmp_path / "sweep"
    said = (
        "hydra.sweeper.params cannot be set on the command line, where replay.yaml's is null; give the "
        "sweep's values as overrides (slowdown.factor=1,3 with -m), or set hydra.sweeper.params in a primary "
        "config of your own (-cd DIR -cn NAME)"
    )
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={out}", params]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"skewlens replay: error: {params}: {said}"]
    assert not out.exists()


def test_the_sweep_table_names_a_finished_point_by_what_sets_it_apart_from_the_failed_ones() -> None:
    from rich.console import Console

    from skewlens.replay.render import sweep_table

    row = SweepRecord(
        job=0,
        overrides="trace=r slowdown.rank=1",
        topology="switch",
        slowdown="straggler",
        comm_mode="as_recorded",
        makespan_ns=2_000_000,
        mean_step_ns=1_000_000,
        max_step_ns=1_000_000,
        out_dir="o/0",
    )
    console = Console(width=200, record=True)
    console.print(sweep_table([row], ["trace=r slowdown.rank=99"]))
    (line,) = (x for x in console.export_text().splitlines() if "straggler" in x)
    assert "slowdown.rank=1" in line and "trace=r" not in line


def test_the_sweep_table_on_an_80_column_terminal_folds_each_jobs_overrides_instead_of_cutting_them() -> None:
    # they read `slowdow…` in every row, the one column that told the jobs apart
    from rich.console import Console

    from skewlens.replay.render import sweep_table

    rows = [
        dataclasses.replace(_job(k, f"slowdown.factor={f} topology=two_node_ib", 10.0 * (1 + k)), topology=t)
        for k, (f, t) in enumerate([(1.0, "two_node_ib"), (1.5, "two_node_ib")])
    ]
    console = Console(width=80, record=True)
    console.print(sweep_table(rows))
    lines = console.export_text().splitlines()
    top = lines.index(next(x for x in lines if x.startswith("┡")))
    body = lines[top + 1 : lines.index(next(x for x in lines if x.startswith("└")))]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in body]
    jobs = "".join(c[0] + "|" if c[0] else "" for c in cells).split("|")[:-1]
    assert jobs == ["0", "1"]
    overrides = [""]
    for c in cells:
        if c[0] and overrides[-1]:
            overrides.append("")
        overrides[-1] += c[1]
    assert overrides == ["slowdown.factor=1.0", "slowdown.factor=1.5"]  # what differs between them


def _job(job: int, overrides: str, mean_ms: float) -> SweepRecord:
    ns = round(mean_ms * 1e6)
    return SweepRecord(
        job=job,
        overrides=f"trace=r out=o {overrides}",
        topology="switch",
        slowdown="straggler",
        comm_mode="as_recorded",
        makespan_ns=2 * ns,
        mean_step_ns=ns,
        max_step_ns=ns + 1,
        out_dir=f"o/{job}",
    )


def test_a_sweep_of_one_numeric_setting_is_drawn_as_step_time_against_its_values_in_their_order(
    tmp_path: Path,
) -> None:
    rows = [
        _job(0, "slowdown.factor=2", 20.0),
        _job(1, "slowdown.factor=1", 10.0),
        _job(2, "slowdown.factor=1.5", 15.0),
    ]
    pts = sweep_points(rows)
    assert (pts.key, pts.x, [r.job for r in pts.jobs]) == ("slowdown.factor", (1.0, 1.5, 2.0), [1, 2, 0])
    path = sweep_plot(rows, tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]  # written whole: no temporary file left


@pytest.mark.parametrize(
    "overrides", [("slowdown.factor=1", "slowdown.factor=2"), ("slowdown=a", "slowdown=b")]
)
def test_the_sweep_pictures_legend_lies_outside_the_axes_so_it_covers_no_jobs_marker(
    overrides: tuple[str, str],
) -> None:
    # the legend sat at the lower right of the bars, on the last job's longest-step marker
    from skewlens.replay.plots import sweep_figure

    fig = sweep_figure([_job(0, overrides[0], 10.0), _job(1, overrides[1], 20.0)])
    fig.canvas.draw()
    (ax,) = fig.axes
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y0 >= axes.y1  # above the plotting area (y grows upwards)
    assert ax.title.get_window_extent().y0 >= legend.y1  # and under the title


def test_a_sweep_of_two_settings_or_of_names_is_a_bar_per_job_labelled_with_what_sets_it_apart() -> None:
    two = [_job(0, "slowdown.factor=1 topology=ring", 1.0), _job(1, "slowdown.factor=2 topology=switch", 2.0)]
    pts = sweep_points(two)
    assert (pts.key, pts.x, pts.labels) == (
        None,
        (),
        ("slowdown.factor=1 topology=ring", "slowdown.factor=2 topology=switch"),
    )
    names = sweep_points([_job(1, "slowdown=stall", 1.0), _job(0, "slowdown=straggler", 2.0)])
    assert (names.key, [r.job for r in names.jobs], names.labels) == (
        None,
        [0, 1],
        ("slowdown=straggler", "slowdown=stall"),
    )


@pytest.mark.parametrize(
    ("values", "key", "x", "kind"),
    [
        # float() reads 1_000: the picture drew a line over 1000 and 2000 beside a string column
        (("scale.seed=1_000", "scale.seed=2_000"), None, (), "string"),
        # the picture's axis was named '+scale.seed', the column scale.seed
        (("+scale.seed=2", "+scale.seed=1"), "scale.seed", (1.0, 2.0), "int64"),
        (("slowdown.factor=0.5", "slowdown.factor=2"), "slowdown.factor", (0.5, 2.0), "double"),
    ],
)
def test_a_sweeps_picture_draws_an_axis_where_sweep_parquet_has_a_number_column_of_that_setting(
    values: tuple[str, str], key: str | None, x: tuple[float, ...], kind: str
) -> None:
    from skewlens.replay.outputs import sweep_parquet_table

    rows = [_job(k, v, 10.0 + k) for k, v in enumerate(values)]
    pts = sweep_points(rows)
    assert (pts.key, pts.x) == (key, x)
    col = sweep_parquet_table(rows).column("scale.seed" if key is None else key)
    assert str(col.type.value_type if kind == "string" else col.type) == kind


@pytest.mark.parametrize(
    "overrides",
    [
        # each job sets a setting of its own: two settings, one token a job
        ("slowdown.factor=1", "scale.seed=2"),
        # the jobs differ in a deletion too, which sets no value
        ("slowdown.factor=1 ~topology.oversubscription", "slowdown.factor=2"),
        # a job that deletes the setting has no value of it
        ("slowdown.factor=1", "slowdown.factor=2", "~slowdown.factor"),
    ],
)
def test_a_sweep_whose_jobs_differ_in_more_than_the_values_of_one_numeric_setting_is_a_bar_per_job(
    overrides: tuple[str, ...],
) -> None:
    pts = sweep_points([_job(k, o, 10.0 + k) for k, o in enumerate(overrides)])
    assert (pts.key, pts.x, pts.labels) == (None, (), overrides)


def test_a_lone_sweep_job_keeps_all_its_overrides_as_what_sets_it_apart() -> None:
    assert distinct_overrides(["a=1 b=2"]) == ["a=1 b=2"]
    assert distinct_overrides(["a=1 b=2", "a=1 b=3", "a=1"]) == ["b=2", "b=3", ""]


def test_the_sweep_picture_says_its_step_times_are_each_steps_slowest_rank_and_counts_failed_jobs() -> None:
    from skewlens.replay.plots import sweep_figure

    rows = [_job(k, f"slowdown.factor={k + 1}", 10.0 * (k + 1)) for k in range(3)]
    line = sweep_figure(rows, failed=1)
    (ax,) = line.axes
    assert ax.get_ylabel() == "replayed step time, ms (each step's slowest rank)"
    assert ax.get_title() == "Replay sweep: 3 of 4 jobs (1 failed)"
    bars = sweep_figure([_job(0, "slowdown=a", 1.0), _job(1, "slowdown=b", 2.0)])
    (ax,) = bars.axes
    assert ax.get_xlabel() == "replayed step time, ms (each step's slowest rank)"
    assert ax.get_title() == "Replay sweep: 2 jobs"


def test_the_sweep_table_says_a_step_is_timed_by_its_slowest_rank() -> None:
    from skewlens.replay.render import sweep_table

    assert sweep_table([_job(0, "slowdown.factor=1", 1.0)]).caption == (
        "mean / max step: over steps, each step's replayed time that of its slowest rank (step mark to step "
        "mark); exposed transfer / wait: that rank's communication not under compute, mean over steps; (x): "
        "mean step against job 0's"
    )


def test_a_sweep_whose_jobs_read_one_mean_step_while_their_exposed_transfer_differs_says_it_hid() -> None:
    from skewlens.replay.render import sweep_table

    # the 8-GPU DLRM trace's bandwidth sweep: 18.712 ms at every bandwidth from 6.25 GB/s, while the exposed
    # transfer fell 0.381 -> 0.042 ms; a planner read "the network does not matter". Below 4 GB/s it grows
    rows = []
    jobs = [(1, 19_836_888, 1_472_809), (6.25, 18_712_027, 380_905), (50, 18_712_003, 56_463)]
    for job, (gbps, step_ns, xfer_ns) in enumerate([*jobs, (200, 18_712_001, 42_061)]):
        row = _job(job, f"topology.dims.0.bandwidth_gbps={gbps}", step_ns / 1e6)
        rows.append(
            dataclasses.replace(row, mean_exposed_transfer_ns=xfer_ns, mean_exposed_wait_ns=6_914_000)
        )
    assert str(sweep_table(rows).caption).endswith(
        "; jobs 1-3: one mean step, 18.712 ms, while their exposed transfer ranges 0.042-0.381 ms: that "
        "communication overlapped no traced compute but ended before the step's end needed it, so the swept "
        "setting did not reach what bounds the step there (on a GPU run, each job's GPU table says what does)"
    )
    # a step that moves with the setting, or one exposed transfer throughout: nothing to say
    assert "one mean step" not in str(sweep_table(rows[:2]).caption)
    same = [dataclasses.replace(r, mean_exposed_transfer_ns=42_061) for r in rows]
    assert "one mean step" not in str(sweep_table(same).caption)


def test_the_flat_sweep_note_lists_its_jobs_as_ranges_and_orders_the_transfers_by_value() -> None:
    from skewlens.replay.render import flat_sweep_note

    # jobs 1 and 4-6 read 18.712 ms (job 3 another step, job 2 no exposed transfer known: left out);
    # exposed transfers of 2 and 10 ms: their range is 2.000-10.000 ms (by value, not as text)
    rows = []
    for job, step_ns, xfer_ns in [
        (1, 18_712_000, 2_000_000),
        (2, 18_712_000, None),
        (3, 19_000_000, 1_000_000),
        (4, 18_712_000, 10_000_000),
        (5, 18_712_000, 3_000_000),
        (6, 18_712_000, 2_000_000),
    ]:
        row = _job(job, f"topology.dims.0.bandwidth_gbps={job}", step_ns / 1e6)
        rows.append(dataclasses.replace(row, mean_exposed_transfer_ns=xfer_ns))
    assert str(flat_sweep_note(rows)).startswith(
        "jobs 1, 4-6: one mean step, 18.712 ms, while their exposed transfer ranges 2.000-10.000 ms:"
    )


def test_the_sweep_tables_ratios_say_which_jobs_mean_step_they_are_against() -> None:
    from rich.console import Console

    from skewlens.replay.render import sweep_table

    # job 0 failed: the ratios are against job 1's mean step (10 ms), which the table did not say
    rows = [_job(2, "slowdown.factor=3", 30.0), _job(1, "slowdown.factor=2", 10.0)]
    console = Console(width=200, record=True)
    console.print(sweep_table(rows, ["trace=r out=o slowdown.factor=1"]))
    text = console.export_text()
    assert "10.000 (1.00x)" in text and "30.000 (3.00x)" in text
    assert "(x): mean step against job 1's" in " ".join(text.split())


def test_the_sweep_title_names_the_trace_every_job_replayed_and_a_swept_one_stays_in_its_column() -> None:
    from rich.console import Console

    from skewlens.replay.render import sweep_table

    # every job replayed runs/run=a (quoted, as Hydra takes a value with `=`): the table said no word of it
    same = [
        dataclasses.replace(_job(k, f"slowdown.factor={k + 1}", 10.0 * (k + 1)), overrides=f"{o} out=S")
        for k, o in enumerate(["trace='runs/run=a' slowdown.factor=1", "slowdown.factor=2 trace=runs/run=a"])
    ]
    failed = ["trace=runs/run=a out=S slowdown.factor=3"]
    table = sweep_table(same, failed)
    assert table.title == (
        "Replay sweep (trace runs/run=a, topology switch, slowdown straggler, comm as_recorded)"
    )
    console = Console(width=80, record=True)
    console.print(table)
    assert "trace runs/run=a, topology switch" in " ".join(console.export_text().split())
    # a failed job that replayed another trace: the trace is swept, each job's in the overrides column
    assert str(sweep_table(same, ["trace=runs/run=b out=S slowdown.factor=3"]).title).startswith(
        "Replay sweep (topology switch,"
    )
    swept = [
        dataclasses.replace(_job(k, "", 10.0), overrides=f"trace=runs/run={x} out=S")
        for k, x in enumerate("ab")
    ]
    console = Console(width=200, record=True)
    console.print(sweep_table(swept))
    text = console.export_text()
    assert "trace runs" not in text and "trace=runs/run=a" in text and "trace=runs/run=b" in text
    assert "trace" not in str(sweep_table(swept[:1]).title)  # a lone job: nothing is shared


def test_the_sweep_table_names_no_base_for_ratios_where_the_first_jobs_mean_step_is_zero() -> None:
    from skewlens.replay.render import sweep_table

    # no ratio is shown beside any mean step then: the caption does not say what they would be against
    table = sweep_table([_job(0, "slowdown.factor=1", 0.0), _job(1, "slowdown.factor=2", 10.0)])
    assert "(x)" not in str(table.caption) and str(table.caption).endswith("mean over steps")


def test_a_sweep_jobs_warnings_name_the_job_they_come_from(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # on stderr, apart from each job's table on stdout, two jobs' warnings read alike: which job ignored
    # slowdown.factor could not be told
    sweep = ("slowdown=none,straggler", "slowdown.factor=2", "progress=false", "perfetto=false")
    assert skewlens_main(["replay", "-m", f"trace={run_dir}", f"out={tmp_path / 'sweep'}", *sweep]) == 0
    said = capsys.readouterr().err.splitlines()
    assert [line for line in said if "slowdown.factor=2" in line] == [
        (
            "skewlens replay: warning: sweep job 0: slowdown.factor=2: slowdown none does not use "
            "slowdown.factor; it changes nothing here"
        )
    ]
    assert {line.split(":")[2] for line in said} == {" sweep job 0", " sweep job 1"}  # each job's, named


def test_a_failed_sweep_whose_stderr_reader_went_away_still_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its error lines were print()s: a closed stderr (2>&1 | head) raised BrokenPipeError at the sweep's end
    # and the command exited 141 instead of the failed sweep's 2
    class Gone(io.StringIO):
        def write(self, _s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    append_sweep_row(tmp_path, _row(0, "slowdown=none topology=switch"))
    (tmp_path / JOBS_DIR / "1.error").write_text(
        "slowdown=straggler topology=switch\nrank 9 is not in the run\n"
    )
    monkeypatch.setattr(sys, "stderr", Gone())
    with pytest.raises(SystemExit) as stop:
        SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stop.value.code == 2


def test_a_sweeps_clear_leaves_what_no_job_of_it_wrote_beside_and_inside_its_job_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job's config.yaml has trace, mode and the sweep's out, absolute (write_config): one without mode,
    # with a relative out, or not in UTF-8 is the user's; in a job's directory, only the job's own staging
    # directories (.<job>.<random>.tmp) and outputs are the sweep's, and a folder of the user's keeps its
    # job directory
    monkeypatch.chdir(tmp_path)  # where the relative out names the sweep
    out = tmp_path / "sweep"
    for name, conf in [
        ("slowdown.factor=1.0", f"trace: /r\nout: {out}\nmode: sim\n"),
        ("1", f"trace: /r\nout: {out}\nmode: sim\n"),
        ("mine=relative", "trace: /r\nout: sweep\nmode: sim\n"),
        ("mine=no_mode", f"trace: /r\nout: {out}\n"),
    ]:
        (out / name).mkdir(parents=True)
        (out / name / "config.yaml").write_text(conf)
        (out / name / "timeline.parquet").write_text("old")
    (out / "slowdown.factor=1.0" / "notes").mkdir()
    (out / "mine=latin1").mkdir()
    (out / "mine=latin1" / "config.yaml").write_bytes(b"trace: /r\nmode: sim\nname: caf\xe9\n")  # not UTF-8
    for staging in (".1.k3j2x9ab.tmp", ".2.k3j2x9ab.tmp", ".1.k3j2x9ab.keep"):
        (out / "1" / staging).mkdir()
    SweepSummary().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(out)}}}))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        ".jobs",
        "1",
        "1/.1.k3j2x9ab.keep",
        "1/.2.k3j2x9ab.tmp",
        "mine=latin1",
        "mine=latin1/config.yaml",
        "mine=no_mode",
        "mine=no_mode/config.yaml",
        "mine=no_mode/timeline.parquet",
        "mine=relative",
        "mine=relative/config.yaml",
        "mine=relative/timeline.parquet",
        "slowdown.factor=1.0",
        "slowdown.factor=1.0/notes",
    ]


@pytest.mark.parametrize(
    "shows", [["--cfg", "hydra"], ["--info"], ["--info", "config"], ["-h"], ["--hydra-help"]]
)
def test_a_slurm_sweep_that_only_shows_its_config_or_help_passes_the_launcher_check_where_there_is_no_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shows: list[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun: a sweep would be refused (the test above)
    check_launcher(["hydra.mode=MULTIRUN", "hydra/launcher=submitit_slurm", *shows])


def _summary_row(rank: int, step: int, step_ms: float, transfer_us: int, wait_us: int) -> SummaryRecord:
    return SummaryRecord(
        rank=rank,
        source_rank=rank,
        step=step,
        step_time_ns=round(step_ms * 1e6),
        recorded_step_ns=0,
        compute_ns=0,
        comm_ns=0,
        wait_ns=wait_us * 1000,
        exposed_wait_ns=wait_us * 1000,
        exposed_transfer_ns=transfer_us * 1000,
    )


def test_a_sweep_jobs_row_gives_the_exposed_transfer_and_wait_of_each_steps_slowest_rank_averaged() -> None:
    # sweep.parquet had the step time only: a planner buying bandwidth could not see the exposed transfer
    from skewlens.replay.outputs import sweep_record

    summary = [
        _summary_row(0, 0, 10.0, transfer_us=100, wait_us=900),  # step 0: rank 1 is the slowest
        _summary_row(1, 0, 12.0, transfer_us=300, wait_us=50),
        _summary_row(0, 1, 11.0, transfer_us=200, wait_us=10),  # step 1: ranks 0 and 1 equal: rank 0's
        _summary_row(1, 1, 11.0, transfer_us=999, wait_us=999),
    ]
    row = sweep_record(
        job=3,
        overrides="a=1",
        topology="switch",
        slowdown="none",
        comm_mode="model",
        out_dir="o/3",
        makespan_ns=30_000_000,
        summary=summary,
    )
    assert (row.mean_step_ns, row.max_step_ns) == (11_500_000, 12_000_000)
    assert (row.mean_exposed_transfer_ns, row.mean_exposed_wait_ns) == (250_000, 30_000)
    empty = sweep_record(
        job=0, overrides="", topology="t", slowdown="s", comm_mode="c", out_dir="o", makespan_ns=5, summary=[]
    )
    assert (empty.mean_step_ns, empty.mean_exposed_transfer_ns, empty.mean_exposed_wait_ns) == (5, None, None)


@pytest.mark.slow  # two replays in this process, 5 s
def test_a_bandwidth_sweeps_table_has_each_jobs_bandwidth_as_a_number_and_its_slowest_ranks_exposed_comm(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import duckdb

    out = tmp_path / "sweep"
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "comm_mode=model", "topology=switch"]
    assert skewlens_main([*args, "topology.dims.0.bandwidth_gbps=0.5,50", "progress=false"]) == 0
    table = capsys.readouterr().out
    got = duckdb.sql(
        f"""SELECT "topology.dims.0.bandwidth_gbps", mean_exposed_transfer_ns, mean_exposed_wait_ns
        FROM '{out / "sweep.parquet"}' ORDER BY job"""
    ).fetchall()
    want = []
    for job, bandwidth in ((0, 0.5), (1, 50.0)):
        # the job's own summary: each step's slowest rank's exposed figures, averaged over the steps
        rows = pq.read_table(out / str(job) / "summary.parquet").to_pylist()
        slowest = [
            max((r for r in rows if r["step"] == s), key=lambda r: (r["step_time_ns"], -r["rank"]))
            for s in sorted({r["step"] for r in rows})
        ]
        means = [
            round(sum(r[c] for r in slowest) / len(slowest))
            for c in ("exposed_transfer_ns", "exposed_wait_ns")
        ]
        want.append((bandwidth, *means))
    assert got == want
    assert got[0][1] > got[1][1] > 0  # 1 MiB at 0.5 GB/s is exposed for longer than at 50
    assert pq.read_schema(out / "sweep.parquet").field("topology.dims.0.bandwidth_gbps").type == "double"
    assert "bandwidth_gbps: GB/s" in table and "GB/s: gigabytes per second (a 400 Gb/s NIC" in " ".join(
        table.split()
    )


def test_the_sweep_table_has_a_typed_column_per_swept_setting_the_failed_jobs_included(
    tmp_path: Path,
) -> None:
    # the swept values were only in the overrides string: no SQL could select or order by them
    from skewlens.replay.sweep import read_sweep

    rows = [
        _job(0, "+steps=2 factor=1.5 name=ring topology=ring", 1.0),
        _job(1, "+steps=4 factor=2 name=4 topology=switch", 2.0),
        _job(3, "+steps=8 factor=1e1 topology=ring", 3.0),  # sets no name: null there
    ]
    for r in rows:
        append_sweep_row(tmp_path, r)
    # job 2 failed: the one job that sets `other`, which the sweep therefore differs in
    (tmp_path / JOBS_DIR / "2.error").write_text("trace=r out=o +steps=6 factor=3 other=x\nbad\n")
    got, failed = collect_sweep(tmp_path)
    assert [r.job for r in got] == [0, 1, 3] and list(failed) == [2]
    tbl = pq.read_table(tmp_path / "sweep.parquet")
    swept = tbl.column_names[len(dataclasses.fields(SweepRecord)) :]
    assert swept == ["steps", "factor", "name", "other"]  # topology: its own column, not a second one
    types = [tbl.schema.field(k).type for k in swept]
    assert types[:2] == [pa.int64(), pa.float64()]
    assert types[2:] == [pa.dictionary(pa.int32(), pa.string())] * 2  # as every string column of skewlens'
    assert tbl.schema.field("factor").metadata == {b"doc": b"Swept setting factor: the job's override of it"}
    assert [tbl[k].to_pylist() for k in swept] == [
        [2, 4, 8],
        [1.5, 2.0, 10.0],
        ["ring", "4", None],
        [None, None, None],
    ]
    assert read_sweep(tmp_path / "sweep.parquet") == got == sorted(rows, key=lambda r: r.job)


def test_a_sweep_file_of_schema_version_14_reads_with_no_exposed_comm_and_a_current_one_round_trips(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.store.schema import (
        META_TABLE,
        META_VERSION,
        SCHEMA_VERSION,
        table_from_records,
        write_table,
    )
    from skewlens.replay.sweep import read_sweep

    row = dataclasses.replace(_job(0, "a=1", 1.0), mean_exposed_transfer_ns=7, mean_exposed_wait_ns=8)
    current = table_from_records(SweepRecord, [row], "sweep")
    assert current.schema.metadata[META_VERSION] == SCHEMA_VERSION.encode() == b"17"
    assert read_sweep(write_table(current, tmp_path / "v15.parquet")) == [row]
    v14 = current.drop_columns(["mean_exposed_transfer_ns", "mean_exposed_wait_ns"])
    f = write_table(
        v14.replace_schema_metadata({META_VERSION: b"14", META_TABLE: b"sweep"}), tmp_path / "v14.parquet"
    )
    assert read_sweep(f) == [
        dataclasses.replace(row, mean_exposed_transfer_ns=None, mean_exposed_wait_ns=None)
    ]


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        ((6.25, 12.5, 25, 50, 100, 200), "log"),  # 32x: a doubling sweep
        ((10, 50, 100), "log"),  # exactly 10x
        ((1, 1.5, 2), "linear"),
        ((0, 1, 10, 100), "symlog"),  # a 0 among them: linear up to 1
        (tuple(2.0**k for k in range(12)), "log"),  # twelve values: each ticked
    ],
)
def test_a_sweep_picture_is_logarithmic_where_its_values_span_10x_and_ticked_at_them(
    values: tuple[float, ...], scale: str
) -> None:
    from skewlens.replay.plots import sweep_figure

    rows = [_job(k, f"slowdown.factor={v}", 10.0 + k) for k, v in enumerate(values)]
    (ax,) = sweep_figure(rows).axes
    assert ax.get_xscale() == scale
    if scale != "linear":
        assert list(ax.get_xticks()) == [float(v) for v in values]
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{float(v):g}" for v in values]
    if scale == "symlog":  # linear up to the smallest positive value, not matplotlib's default of 2
        assert ax.xaxis.get_transform().linthresh == min(v for v in values if v > 0)


def test_a_swept_trace_in_quotes_is_its_path_in_the_sweep_table_whatever_it_holds() -> None:
    from skewlens.replay.outputs import sweep_parquet_table

    # `-m "trace='R/run=a','R/run=b'"` (Hydra takes a value with `=` or a space only quoted): the trace
    # column held the quotes, 'R/run=a', which no path nor `WHERE trace = 'R/run=a'` matches; a path with a
    # space was cut at it ('R/my), and an entries list with a space in its pattern made up settings
    entries = 'slowdown.entries=[{kind:op,factor:0,pattern:"re:^(?!Memcpy (%s))"}]'
    rows = [
        _job(0, f"trace='R/run=a' {entries % 'HtoD'}", 1.0),
        _job(1, f"trace='R/my run' {entries % 'DtoH'}", 2.0),
        # an escaped quote, then an escaped backslash at its end
        _job(2, r'trace="R/it\"s\\" seed=3', 3.0),
    ]
    collect = [dataclasses.replace(r, overrides=r.overrides.replace("trace=r ", "")) for r in rows]
    tbl = sweep_parquet_table(collect)
    swept = tbl.column_names[len(dataclasses.fields(SweepRecord)) :]
    assert swept == ["trace", "slowdown.entries", "seed"]
    assert tbl["trace"].to_pylist() == ["R/run=a", "R/my run", 'R/it"s\\']
    assert tbl["slowdown.entries"].to_pylist() == [
        entries.partition("=")[2] % d for d in ("HtoD", "DtoH")
    ] + [None]
    assert tbl["seed"].to_pylist() == [None, None, 3]


def test_a_jobs_overrides_split_at_the_spaces_outside_quotes_and_brackets_one_override_each() -> None:
    from skewlens.replay.outputs import override_tokens

    # double quotes as single ones; a function's arguments (Hydra's glob(...)) as a list's
    assert override_tokens('trace="R/my run" seed=1') == ['trace="R/my run"', "seed=1"]
    assert override_tokens("a=glob(x, y) b=1") == ["a=glob(x, y)", "b=1"]
    # no empty override between two spaces nor after a trailing one
    assert override_tokens(" a=1  b=2 ") == ["a=1", "b=2"]
    # a stray closing bracket closes nothing: the space after it still splits
    assert override_tokens("a=] b=1") == ["a=]", "b=1"]
    # a quote never closed runs to the end (one override, not split in it)
    assert override_tokens("trace='R/my run") == ["trace='R/my run"]


def test_an_overrides_value_loses_its_quotes_only_where_it_is_one_quoted_string() -> None:
    from skewlens.replay.outputs import override_value

    assert override_value("'R/run=a'") == "R/run=a"
    assert override_value("'a'b") == "'a'b"  # a quoted string and more: as given
    assert override_value("'") == "'"  # a lone quote: no string
    assert override_value(r"'a\\'") == "a\\"  # an escaped backslash before the closing quote: one


def test_what_sets_a_sweep_job_apart_keeps_a_quoted_value_with_a_space_whole() -> None:
    # the trace every job shares is left out whole, not cut at its space ("trace='R/my run' seed=1")
    assert distinct_overrides(["trace='R/my run' seed=1", "trace='R/my run' seed=2"]) == ["seed=1", "seed=2"]


def test_an_override_sets_a_setting_only_where_it_gives_a_key_and_a_value() -> None:
    from skewlens.replay.outputs import override_setting

    assert override_setting("slowdown.factor=2") == ("slowdown.factor", "2")
    assert override_setting("+a.b=1") == ("a.b", "1")
    assert override_setting("++a.b=x=y") == ("a.b", "x=y")
    # hydra's deletions, with or without the value they expect, and a token of a value with a space in it
    assert [override_setting(t) for t in ("~a.b", "~a.b=1", 'b"', "=1")] == [None] * 4


def test_the_key_an_override_names_drops_hydras_add_force_and_delete_marks() -> None:
    from skewlens.replay.outputs import override_key

    tokens = ("a.b=1", "+a.b=1", "++a.b=x=y", "~a.b", "~a.b=1", "=1")
    assert [override_key(t) for t in tokens] == ["a.b", "a.b", "a.b", "a.b", "a.b", ""]


@pytest.mark.parametrize(
    ("values", "kind", "column"),
    [
        (["-1", "2", None], "int64", [-1, 2, None]),
        (["0.5", "-2", "1e3"], "double", [0.5, -2.0, 1000.0]),
        (["1_000", "2"], "string", ["1_000", "2"]),  # float() reads 1_000; no one typed it as a number
        # beyond int64 (a 64-bit unsigned seed): a number, where int64 was an OverflowError, a traceback
        ([str(2**64 - 1), "1"], "double", [float(2**64 - 1), 1.0]),
        ([str(2**63 - 1), str(-(2**63))], "int64", [2**63 - 1, -(2**63)]),
        (["ring", "12"], "string", ["ring", "12"]),
    ],
)
def test_a_swept_settings_column_is_an_integer_a_number_or_a_string_as_every_jobs_value_is(
    values: list[str | None], kind: str, column: list[object]
) -> None:
    from skewlens.replay.outputs import setting_column

    col = setting_column(values)
    assert str(col.type.value_type if kind == "string" else col.type) == kind
    assert col.to_pylist() == column


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("slowdown.delay_ms", "slowdown.delay_ms (ms)"),
        ("topology.dims.0.latency_ns", "topology.dims.0.latency_ns (ns)"),
        ("slowdown.factor", "slowdown.factor"),
    ],
)
def test_a_swept_settings_axis_gives_the_unit_its_name_ends_in(key: str, label: str) -> None:
    from skewlens.replay.plots import setting_label

    assert setting_label(key) == label


def test_a_bandwidth_sweeps_picture_and_table_say_its_unit_is_gigabytes_a_second() -> None:
    # the axis read `topology.dims.0.bandwidth_gbps`: gbps reads as gigabits, and an NDR NIC's 400 Gb/s
    # typed as 400 is 8x too fast
    from rich.console import Console

    from skewlens.replay.plots import sweep_figure
    from skewlens.replay.render import sweep_table

    rows = [
        dataclasses.replace(
            # steps that move with the bandwidth (one step under two exposed transfers has a note of its own)
            _job(k, f"topology.dims.0.bandwidth_gbps={b} topology.dims.0.latency_ns=900", 11.0 - k),
            mean_exposed_transfer_ns=t,
            mean_exposed_wait_ns=250_000,
        )
        for k, (b, t) in enumerate([(25, 2_000_000), (50, 1_000_000)])
    ]
    (ax,) = sweep_figure(rows).axes
    assert ax.get_xlabel() == (
        "topology.dims.0.bandwidth_gbps (GB/s: gigabytes per second (a 400 Gb/s NIC is 50))"
    )
    latency = [
        dataclasses.replace(r, overrides=f"topology.dims.0.latency_ns={k}") for k, r in enumerate(rows)
    ]
    (ax,) = sweep_figure(latency).axes
    assert ax.get_xlabel() == "topology.dims.0.latency_ns (ns)"
    table = sweep_table(rows)
    assert table.columns[1].header == "overrides\nbandwidth_gbps: GB/s"
    assert str(table.caption).endswith("; GB/s: gigabytes per second (a 400 Gb/s NIC is 50)")
    console = Console(width=200, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    cells = [[c.strip() for c in x.split("│")[1:-1]] for x in lines if x.startswith("│")]
    header = [c.strip() for c in next(x for x in lines if "job" in x).split("┃")[1:-1]]
    transfer, wait = header.index("exposed transfer ms"), header.index("exposed wait ms")
    assert [(c[0], c[transfer], c[wait]) for c in cells] == [("0", "2.000", "0.250"), ("1", "1.000", "0.250")]
    # shared by every job: said once, in the title
    assert table.title == "Replay sweep (trace r, topology switch, slowdown straggler, comm as_recorded)"


@pytest.mark.parametrize(
    ("out", "sweep", "error"),
    [  # replayed into S/1.0/0 and S/2.0/1 while the sweep looked in S/1.5, the entry's default: 'the sweep
        # has no jobs', exit 2
        ("${slowdown.factor}", "slowdown.factor=1,2", "${slowdown.factor} differs from job to job"),
        ("${topology.name}", "topology=ring,switch", "${topology.name} differs from job to job"),
        # Hydra's traceback: 'InterpolationResolutionError: ... HydraConfig was not set'
        (
            "${hydra:runtime.choices.topology}",
            "topology=ring,switch",
            "${hydra:runtime.choices.topology} is Hydra's per job",
        ),
    ],
)
def test_a_sweeps_out_that_interpolates_what_differs_per_job_is_one_line_before_any_job_runs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, sweep: str, error: str
) -> None:
    given = f"out={tmp_path / 'sweep'}/{out}"
    args = ["replay", "-m", f"trace={run_dir}", given, "slowdown=straggler", sweep]
    assert skewlens_main(args) == 2
    said = (
        "a sweep writes every job under one out, made before any job runs; name the jobs' directories by it"
    )
    assert capsys.readouterr().err.strip().splitlines() == [
        f"skewlens replay: error: {given}: {error}, and {said} with hydra.sweep.subdir instead"
    ]
    assert not (tmp_path / "sweep").exists()


def test_a_sweeps_out_may_interpolate_what_is_the_same_for_every_job(run_dir: Path, tmp_path: Path) -> None:
    given = f"out={tmp_path / 'sweep'}/" + "${topology.name}"
    args = [
        "replay",
        "-m",
        f"trace={run_dir}",
        given,
        "topology=ring",
        "slowdown=straggler",
        "slowdown.factor=1,2",
    ]
    assert skewlens_main([*args, "progress=false", "perfetto=false"]) == 0
    assert pq.read_table(tmp_path / "sweep" / "ring" / "sweep.parquet").column("job").to_pylist() == [0, 1]


def _interrupt_job(monkeypatch: pytest.MonkeyPatch, job: int, *, again: bool = False) -> None:
    """Ctrl-C while job ``job`` of a sweep in this process replays (the earlier ones finished); with
    ``again``, a second one while the command reads the finished jobs' rows to say which they are."""
    import skewlens.replay.driver as driver
    import skewlens.replay.sweep as sweep

    replay = driver._replay_into

    def interrupted(conf: object, out_dir: Path, *args: object) -> object:
        if out_dir.name == str(job):
            if again:
                monkeypatch.setattr(sweep, "read_sweep", _raise_interrupt)
            raise KeyboardInterrupt
        return replay(conf, out_dir, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(driver, "_replay_into", interrupted)


def _raise_interrupt(*_a: object) -> None:
    raise KeyboardInterrupt


def _interrupted_sweep(run_dir: Path, out: Path, factors: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The line an interrupted sweep of the straggler's ``factors`` ends with (its exit status 130)."""
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, f"slowdown.factor={factors}", "perfetto=false"]) == 130
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_sweep_interrupted_after_its_first_job_names_the_finished_job_and_its_outputs_and_writes_no_table(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said "skewlens replay: interrupted" alone: job 0's outputs and row were there, unmentioned
    out = tmp_path / "sweep"
    _interrupt_job(monkeypatch, 1)
    assert _interrupted_sweep(run_dir, out, "1.0,2.0,3.0", capsys) == (
        f"skewlens replay: interrupted after 1 of 3 sweep jobs finished (job 0); their outputs are in "
        f"{out / '0'}; their rows in {out / JOBS_DIR}/ (run the sweep again to get sweep.parquet)"
    )
    assert not (out / "sweep.parquet").exists()  # a table of some jobs would read as the whole sweep
    assert sorted(p.name for p in (out / "0").iterdir()) == [
        "config.yaml",
        "summary.parquet",
        "timeline.parquet",
    ]
    assert not (out / "1").exists() and not (out / "2").exists()
    assert [r.job for r in collect_sweep(out)[0]] == [0]
    monkeypatch.undo()
    # the interrupted sweep's .jobs/ was released: the same directory takes a sweep in this process again
    args = ["replay", "-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "progress=false"]
    assert skewlens_main([*args, "slowdown.factor=4.0", "perfetto=false"]) == 0
    capsys.readouterr()
    assert [r["job"] for r in pq.read_table(out / "sweep.parquet").to_pylist()] == [0]


def test_a_long_sweep_interrupted_names_its_finished_jobs_as_ranges_and_a_few_of_their_directories(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # every finished job's directory was listed: a 1,000-job sweep's line named all of them
    out = tmp_path / "sweep"
    _interrupt_job(monkeypatch, 5)
    assert _interrupted_sweep(run_dir, out, "1.0,1.5,2.0,2.5,3.0,3.5", capsys) == (
        f"skewlens replay: interrupted after 5 of 6 sweep jobs finished (jobs 0-4); their outputs are in "
        f"{out / '0'}, {out / '1'}, {out / '2'} and 2 more; their rows in {out / JOBS_DIR}/ (run the sweep "
        "again to get sweep.parquet)"
    )


def test_a_sweep_interrupted_in_its_first_job_says_none_of_its_jobs_finished_not_an_earlier_sweeps(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    append_sweep_row(out, _row(0, "slowdown.factor=9.0"))  # an earlier sweep's, cleared when this one began
    _interrupt_job(monkeypatch, 0)
    assert _interrupted_sweep(run_dir, out, "1.0,2.0", capsys) == (
        "skewlens replay: interrupted after 0 of 2 sweep jobs finished; run the sweep again to get "
        "sweep.parquet"
    )


def test_a_sweep_interrupted_before_it_cleared_an_earlier_sweeps_rows_claims_none_of_them(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import skewlens.replay.sweep as sweep

    out = tmp_path / "sweep"
    append_sweep_row(out, _row(0, "slowdown.factor=9.0"))
    monkeypatch.setattr(sweep, "clear_earlier_sweep", _raise_interrupt)
    assert _interrupted_sweep(run_dir, out, "1.0,2.0", capsys) == "skewlens replay: interrupted"


def test_a_second_interrupt_while_the_finished_jobs_rows_are_read_still_says_where_they_are(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    _interrupt_job(monkeypatch, 1, again=True)
    assert _interrupted_sweep(run_dir, out, "1.0,2.0", capsys) == (
        f"skewlens replay: interrupted (again while it read its finished jobs' rows): they are in "
        f"{out / JOBS_DIR}/; run the sweep again to get sweep.parquet"
    )


def test_an_interrupted_sweep_names_its_failed_jobs_apart_from_its_finished_ones(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    _interrupt_job(monkeypatch, 2)
    said = _interrupted_sweep(run_dir, out, "-1,2.0,3.0", capsys)
    assert said.split("; ") == [
        "skewlens replay: interrupted after 1 of 3 sweep jobs finished (job 1)",  # job 0 failed: not counted
        f"their outputs are in {out / '1'}",
        f"their rows in {out / JOBS_DIR}/",
        f"1 failed (job 0: see {out / JOBS_DIR / '0.error'}) (run the sweep again to get sweep.parquet)",
    ]
    assert not (out / "0").exists() and not (out / "2").exists()


#: sitecustomize of a sweep's processes: job 1 replays until interrupted; every process takes Ctrl-C as a
#: terminal's user's does (a non-interactive shell starts a background command with SIGINT ignored).
BLOCK_JOB_1 = """\
import signal
import time
from pathlib import Path

import skewlens.replay.driver as driver

signal.signal(signal.SIGINT, signal.default_int_handler)
_replay = driver._replay_into


def _blocked(conf, out_dir, *args):
    while Path(out_dir).name == "1":
        time.sleep(0.05)
    return _replay(conf, out_dir, *args)


driver._replay_into = _blocked
"""


@pytest.mark.slow  # a sweep on joblib's workers, interrupted as a terminal's Ctrl-C does
def test_a_joblib_sweep_interrupted_names_exactly_the_jobs_that_finished_out_of_order(
    run_dir: Path, tmp_path: Path
) -> None:
    # two workers: job 1 runs on while jobs 0 and 2 finish; Ctrl-C reaches the whole process group
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_JOB_1)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    out = tmp_path / "sweep"
    args = ["-m", f"trace={run_dir}", f"out={out}", "slowdown=straggler", "slowdown.factor=1.0,2.0,3.0"]
    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "progress=false", "perfetto=false"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "skewlens", "replay", *args, *launcher],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        rows = [out / JOBS_DIR / f"{job}.parquet" for job in (0, 2)]
        deadline = time.monotonic() + 200
        while not all(p.exists() for p in rows) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(p.exists() for p in rows), proc.poll()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == (
        f"skewlens replay: interrupted after 2 of 3 sweep jobs finished (jobs 0, 2); their outputs are in "
        f"{out / '0'}, {out / '2'}; their rows in {out / JOBS_DIR}/ (run the sweep again to get "
        "sweep.parquet)"
    )
    assert "Traceback" not in err
    assert not (out / "sweep.parquet").exists() and not (out / "1").exists()
    for job in (0, 2):
        assert sorted(p.name for p in (out / str(job)).iterdir()) == [
            "config.yaml",
            "summary.parquet",
            "timeline.parquet",
        ]
