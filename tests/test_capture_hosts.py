"""Capture across hosts: every host's ``skewlens profile`` merges the part files of one shared run directory
when its command ends (docs/capture.md, Across hosts). The hosts are emulated by calling the merge (and
the CLI) once per host on the same directory, with the part files each host's ranks left."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from capture_helpers import EXAMPLE, run_together

from skewlens.analysis import analyze_run
from skewlens.cli import main as skewlens_main
from skewlens.paths import doc
from skewlens.profiler.capture.run import PROBE_PREFIX, finalize_run, prepare_run_dir
from skewlens.profiler.capture.session import part_file
from skewlens.profiler.chakra_io import EtWriter
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import (
    PARTS_DIR,
    Manifest,
    RankNote,
    RunIdentity,
    StepWindow,
    rank_file,
    rank_note_key,
    read_manifest,
    write_manifest,
)
from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import Level
from skewlens.replay.execution import clock_note

WINDOW = StepWindow(wait=1, warmup=1, active=3)


def save_rank(run: Path, rank: int, host: str, *, world: int = 2, per_host: int = 1, **extra: object) -> None:
    """What a rank leaves when it saves: its trace (no nodes) and its part file (``extra`` added to it)."""
    with EtWriter(rank_file(run, rank), {"rank": rank, "world_size": world}):
        pass
    part_file(run, rank).parent.mkdir(parents=True, exist_ok=True)
    part = {
        "rank": rank,
        "world_size": world,
        "local_world_size": per_host,
        "host": host,
        "device": "cpu",
        "backend": "gloo",
        "clock_offset_ns": 1000 * rank,
        "process_groups": [{"name": "0", "ranks": list(range(world)), "desc": "default_pg"}],
        "steps": [{"step": s, "start_ns": 10 * s, "end_ns": 10 * s + 5} for s in (2, 3, 4)],
        "partial": False,
        "notes": {},
        "level": "collectives",
        "window": {"wait": 1, "warmup": 1, "active": 3},
        **extra,
    }
    part_file(run, rank).write_text(json.dumps(part))


def merge(run: Path, node_rank: int) -> object:
    return finalize_run(
        run, level=Level.COLLECTIVES, window=WINDOW, command=("torchrun", f"--node-rank={node_rank}")
    )


def test_a_host_that_finishes_after_another_adds_its_ranks_to_the_manifest_instead_of_replacing_it(
    tmp_path: Path,
) -> None:
    # host A's command ended before host B's rank had saved (a scancel, B's save slower): A merged rank 0
    # alone and removed the part files; B then merged rank 1 alone and replaced the manifest, which said
    # rank 0 (whose trace was complete) crashed
    save_rank(tmp_path, 0, "a")
    first = merge(tmp_path, 0)
    assert first is not None and read_manifest(tmp_path).missing_ranks == (1,)
    save_rank(tmp_path, 1, "b")
    second = merge(tmp_path, 1)
    m = read_manifest(tmp_path)
    assert second is not None and (m.ranks, m.missing_ranks) == ((0, 1), ())
    assert m.hosts == {0: "a", 1: "b"} and m.clock_offsets_ns == {0: 0, 1: 1000}
    assert not any("rank 0" in k for k in m.notes)
    assert not (tmp_path / PARTS_DIR).exists()  # complete: the part files are gone


def test_a_host_that_finds_fewer_ranks_than_the_manifest_leaves_it_alone(tmp_path: Path) -> None:
    # host A merged both ranks; host B read its part files while A removed them and saw only rank 1
    save_rank(tmp_path, 0, "a")
    save_rank(tmp_path, 1, "b")
    assert merge(tmp_path, 0) is not None
    save_rank(tmp_path, 1, "b")  # the part file B still read
    assert merge(tmp_path, 1) is None
    m = read_manifest(tmp_path)
    assert (m.ranks, m.missing_ranks) == ((0, 1), ())


def _other_host(run: Path, body: str) -> str:
    """A script standing for the other host's ``skewlens profile`` on ``run``: ``save_rank`` and ``run`` at
    hand, then ``body``."""
    head = f"""
        import pathlib, sys
        sys.path[:0] = {sys.path!r}
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_capture_hosts import save_rank
        run = pathlib.Path({str(run)!r})
        """
    return textwrap.dedent(head) + textwrap.dedent(body)


def _profile_while(run: Path, body: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``skewlens profile --out run`` of a command that runs ``body`` (:func:`_other_host`): its exit code
    and stderr, its lines joined by spaces."""
    code = skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", _other_host(run, body)])
    return code, " ".join(capsys.readouterr().err.split())


def test_a_host_whose_ranks_another_host_merged_reports_that_manifest_and_exits_with_the_commands_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the command stands for this host's torchrun: while it runs, the other host's skewlens profile merges
    # both ranks (this host's too) and removes the part files. This host then said "no rank saved a trace
    # (did it run 3+ steps ...?)" and exited with code 2 after a successful run.
    run = tmp_path / "run"
    other_host = _other_host(
        run,
        """
        from skewlens.profiler.capture.run import finalize_run
        from skewlens.profiler.manifest import StepWindow
        from skewlens.profiler.vocab import Level
        save_rank(run, 0, "a"); save_rank(run, 1, "b")
        finalize_run(run, level=Level.COLLECTIVES, window=StepWindow())
        """,
    )
    code = skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", other_host])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "no rank saved a trace" not in err
    assert "manifest.json already merged by another host of the job (ranks 0-1 of 2)" in err
    assert "every rank of it ran on this host" not in err  # hosts a and b: not this one
    assert (read_manifest(run).ranks, read_manifest(run).missing_ranks) == ((0, 1), ())


@pytest.mark.parametrize(
    "ranks",
    [
        # rank 1 on another host: a job of two hosts
        "save_rank(run, 0, {here!r}, per_host=1); save_rank(run, 1, 'b', per_host=1)",
        # rank 1 missing: where it ran is not known, so not every rank is known to have run here
        "save_rank(run, 0, {here!r}, per_host=1)",
    ],
)
def test_a_profile_whose_merged_manifest_has_a_rank_not_known_to_be_on_this_host_says_only_another_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ranks: str
) -> None:
    here = socket.gethostname()
    run = tmp_path / "run"
    body = f"""
        from skewlens.profiler.capture.run import finalize_run
        from skewlens.profiler.manifest import StepWindow
        from skewlens.profiler.vocab import Level
        {ranks.format(here=here)}
        finalize_run(run, level=Level.COLLECTIVES, window=StepWindow(), command=["torchrun", "other.py"])
        """
    code, err = _profile_while(run, body, capsys)
    assert code == 0, err
    assert "manifest.json already merged by another host of the job (rank" in err
    assert "every rank of it ran on this host" not in err


def test_a_profile_whose_one_host_job_another_profile_merged_says_its_capture_may_be_that_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two skewlens profile into one --out on one host: the second (2 gloo ranks of examples/train.py --steps
    # 6, started 1 s after one of --steps 30) ended first and merged its own ranks, whose traces had replaced
    # the first's; the first then said "already merged by another host of the job" of a one-host job and
    # showed the other's table, its capture lost unsaid. Every rank of the manifest on this host: it says so
    here = socket.gethostname()
    run = tmp_path / "run"
    code, err = _profile_while(
        run,
        f"""
        from skewlens.profiler.capture.run import finalize_run
        from skewlens.profiler.manifest import StepWindow
        from skewlens.profiler.vocab import Level
        save_rank(run, 0, {here!r}, per_host=2); save_rank(run, 1, {here!r}, per_host=2)
        finalize_run(run, level=Level.COLLECTIVES, window=StepWindow(), command=["torchrun", "other run.py"])
        """,
        capsys,
    )
    assert code == 0, err  # several torchrun --nnodes on one machine look the same: said, not refused
    assert (
        f"manifest.json already merged by another host of the job (ranks 0-1 of 2); but every rank of it ran "
        f"on this host ({here}): unless this command is one of several torchrun --nnodes on this machine, a "
        "second skewlens profile into this --out merged it, its ranks' traces replaced this command's, and "
        "this capture is lost (the manifest's command: torchrun 'other run.py'); capture again into a "
        "directory of its own"
    ) in err


def _job(run_id: str, port: int) -> dict[str, object]:
    """A part file's ``run_identity`` of a torchrun job."""
    return {"run_id": run_id, "rendezvous": f"127.0.0.1:{port}", "started_ns": 10, "restart_count": 0}


_MIXED = """
    import os
    def job(run_id, port):
        return {"run_id": run_id, "rendezvous": f"127.0.0.1:{port}", "started_ns": 10, "restart_count": 0}
    mine = os.environ["SKEWLENS_PROFILE_ID"]
    save_rank(run, 0, "vm", per_host=2, profile=mine, run_identity=job("uuid-a", 29500))
    save_rank(run, 1, "vm", per_host=2, profile="other", run_identity=job("uuid-b", 29501))
    """
_REPLACED = """
    for r in (0, 1):
        save_rank(run, r, "vm", per_host=2, profile="other", run_identity={"run_id": "uuid-b"})
    """


@pytest.mark.parametrize(
    ("body", "says"),
    [
        # this profile's ranks save, then another skewlens profile's rank 1 (started into the directory this
        # one's probe had left empty) replaces rank 1's trace and part file before the merge: the manifest
        # held rank 0 of one job and rank 1 of the other, and the profile exited 0
        (
            _MIXED,
            (
                "{run}: its ranks' traces are of rank 0: run id uuid-a at 127.0.0.1:29500; rank 1: run id "
                "uuid-b at 127.0.0.1:29501: two skewlens profile commands captured into this --out at once"
            ),
        ),
        # another skewlens profile's one-host job saves both ranks, replacing this command's: the manifest
        # said this command (and its --steps) over the other job's traces and steps, and both profiles
        # exited 0 (the other: "already merged by another host of the job")
        (
            _REPLACED,
            (
                "{run}: ranks 0-1 of a job on one host (vm) saved by another skewlens profile's command, not "
                "this one's (run id uuid-b at (no rendezvous)): two skewlens profile commands captured into "
                "this --out"
            ),
        ),
    ],
    ids=["ranks-of-two-jobs", "another-profiles-ranks"],
)
def test_ranks_another_profile_saved_into_the_same_out_at_once_are_refused_not_merged_into_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, says: str
) -> None:
    # the race, forced: the command stands for this profile's torchrun while the other profile's ranks save
    run = tmp_path / "run"
    code, err = _profile_while(run, body, capsys)
    assert code == 2, err
    assert says.format(run=run) in err
    assert not (run / "manifest.json").exists()


def test_one_profile_per_rank_of_a_job_torchrun_did_not_start_into_one_out_is_refused_saying_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # srun -n 2 skewlens profile --out RUN -- python train.py: each task's profile runs one rank of the job
    # (no torchrun run id, one MASTER_ADDR:MASTER_PORT), and finds the other's rank in its --out. Before, it
    # said "rank 1 of a job on one host (vm) saved by another skewlens profile's command, not this one's:
    # two skewlens profile commands captured into this --out at once", naming neither the job nor what to run
    run = tmp_path / "run"
    body = """
        import os
        job = {"run_id": "", "rendezvous": "127.0.0.1:29631", "started_ns": 10, "restart_count": 0}
        save_rank(run, 0, "vm", per_host=2, profile=os.environ["SKEWLENS_PROFILE_ID"], run_identity=job)
        save_rank(run, 1, "vm", per_host=2, profile="other", run_identity=job)
        """
    code, err = _profile_while(run, body, capsys)
    assert code == 2, err
    assert (
        f"{run}: rank 1 of this job (rendezvous 127.0.0.1:29631, on vm) saved by other skewlens profile "
        "commands than this one's (rank 0): one skewlens profile per rank (srun ... skewlens profile) cannot "
        "share an --out, and no manifest.json was written. Give each its own (--out RUN-$SLURM_PROCID) and "
        "join them with skewlens merge, or start every rank under one (skewlens profile --out RUN -- "
        "srun ...)"
    ) in err
    assert not (run / "manifest.json").exists()


def test_a_profile_that_replaces_the_manifest_another_profile_merged_first_says_whose_capture_is_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the race, forced: another skewlens profile's job (run id uuid-a) captured into the same --out and
    # merged first; this command's ranks then saved over its traces. This merge replaced its manifest with
    # nothing said: the other command's capture was lost unnoticed, and exit 0 here
    run = tmp_path / "run"
    body = """
        import os
        from skewlens.profiler.capture.run import finalize_run
        from skewlens.profiler.manifest import StepWindow
        from skewlens.profiler.vocab import Level
        def job(run_id):
            return {"run_id": run_id, "rendezvous": "127.0.0.1:29500", "started_ns": 10, "restart_count": 0}
        for r in (0, 1):
            save_rank(run, r, "vm", per_host=2, profile="other", run_identity=job("uuid-a"))
        finalize_run(run, level=Level.COLLECTIVES, window=StepWindow(), command=["torchrun", "a.py"])
        for r in (0, 1):
            steps = [{"step": s, "start_ns": 7 * s, "end_ns": 7 * s + 5} for s in (2, 3, 4)]
            mine = os.environ["SKEWLENS_PROFILE_ID"]
            save_rank(run, r, "vm", per_host=2, profile=mine, run_identity=job("uuid-b"), steps=steps)
        """
    code, err = _profile_while(run, body, capsys)
    said = (
        "this manifest replaced that of another job (run id uuid-a at 127.0.0.1:29500: torchrun a.py), "
        "captured into this directory at the same time: its ranks' traces were replaced by this job's, and "
        "its capture is lost"
    )
    assert code == 0 and said in err, err
    m = read_manifest(run)
    assert m.run_identity is not None and m.run_identity.run_id == "uuid-b"
    assert m.notes["replaced another job"] == said


def test_a_profile_merges_the_ranks_another_hosts_profile_saved_for_the_same_job(tmp_path: Path) -> None:
    # the other host of a two-host job (a rank per host) has a skewlens profile of its own
    save_rank(tmp_path, 0, "a", profile="mine", run_identity=_job("job-1", 29500))
    save_rank(tmp_path, 1, "b", profile="theirs", run_identity=_job("job-1", 29500))
    m = finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW, profile="mine")
    assert m is not None and (m.ranks, m.hosts) == ((0, 1), {0: "a", 1: "b"})


def test_a_merge_that_replaces_another_jobs_manifest_writes_its_own_even_where_their_steps_agree(
    tmp_path: Path,
) -> None:
    # another profile's job (uuid-a) merged first; this one's ranks (uuid-b) saved over its traces with the
    # same steps and times: a manifest that holds every rank and the same steps reads as this job's own
    # other host's, but it is another job's, and is replaced with the note
    for r in (0, 1):
        save_rank(tmp_path, r, "vm", per_host=2, profile="other", run_identity=_job("uuid-a", 29500))
    finalize_run(
        tmp_path, level=Level.COLLECTIVES, window=WINDOW, command=("torchrun", "a.py"), profile="other"
    )
    for r in (0, 1):
        save_rank(tmp_path, r, "vm", per_host=2, profile="mine", run_identity=_job("uuid-b", 29500))
    m = finalize_run(
        tmp_path, level=Level.COLLECTIVES, window=WINDOW, command=("torchrun", "b.py"), profile="mine"
    )
    assert m is not None and read_manifest(tmp_path).command == ("torchrun", "b.py")
    assert m.notes["replaced another job"].startswith(
        "this manifest replaced that of another job (run id uuid-a at 127.0.0.1:29500: torchrun a.py)"
    )
    assert m.notes["replaced another job"] in run_notes(load_run(tmp_path))  # analyze's and replay's warnings


def test_a_capture_outside_skewlens_profile_saved_again_into_its_directory_replaces_it_with_no_note(
    tmp_path: Path,
) -> None:
    # capture() rerun into the same directory under a new torchrun job: its own run, not another
    # profile's captured at once, so no 'replaced another job'
    for run_id, first in (("uuid-a", 2), ("uuid-b", 5)):
        steps = [{"step": s, "start_ns": 10 * s, "end_ns": 10 * s + 5} for s in range(first, first + 3)]
        for r in (0, 1):
            save_rank(tmp_path, r, "vm", per_host=2, run_identity=_job(run_id, 29500), steps=steps)
        m = finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW, world_size=2)
    assert m is not None and m.run_identity is not None and m.run_identity.run_id == "uuid-b"
    assert "replaced another job" not in m.notes


def test_a_profile_into_an_empty_directory_that_saved_nothing_leaves_it_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the directory was there before: it is kept, without the .parts/ that says a capture is under way
    # (analyze would then say a skewlens profile may still be capturing into it)
    run = tmp_path / "run"
    run.mkdir()
    assert skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", "pass"]) == 2
    assert list(run.iterdir()) == []
    assert skewlens_main(["profile", "--out", str(run), "--", str(tmp_path / "no-such-command")]) == 2
    assert capsys.readouterr().err.endswith(
        f"cannot run {str(tmp_path / 'no-such-command')!r}: No such file or directory\n"
    )
    assert list(run.iterdir()) == []


@pytest.mark.parametrize("unreadable", [False, True], ids=["a-part-file", "cannot-be-listed"])
def test_a_run_directory_whose_parts_folder_is_not_empty_is_refused_as_not_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unreadable: bool
) -> None:
    # only an empty .parts/ (another host's profile starting) counts as nothing: one holding a rank's part
    # file is a capture that saved there, and one that cannot be listed may be
    run = tmp_path / "run"
    (run / PARTS_DIR).mkdir(parents=True)
    if unreadable:
        listdir = Path.iterdir

        def iterdir(self: Path) -> Any:
            if self.name == PARTS_DIR:
                raise PermissionError(13, "Permission denied")
            return listdir(self)

        monkeypatch.setattr(Path, "iterdir", iterdir)
    else:
        (run / PARTS_DIR / "rank-0.json").write_text("{}")
    with pytest.raises(CaptureError, match="directory is not empty"):
        prepare_run_dir(run)


def test_analyze_while_a_profile_runs_before_any_rank_saved_says_a_capture_is_writing_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the race, forced: a dashboard runs analyze on the run while skewlens profile's command runs, before
    # the window's end (the whole run, for a long job). It said 'RUN: no manifest.json and no Chakra traces
    # named <prefix>.<rank>.et (is this a run directory?)'
    run = tmp_path / "run"
    body = """
        import os, subprocess
        from skewlens.profiler.capture.run import prepare_run_dir
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        cmd = [sys.executable, "-m", "skewlens", "analyze", str(run), "--out", str(run.parent / "an")]
        seen = subprocess.run(cmd, capture_output=True, text=True, env=env)
        (run.parent / "seen").write_text(f"{seen.returncode} {seen.stderr}")
        prepare_run_dir(run)  # another host of the job starting now is not refused
        """
    code, _err = _profile_while(run, body, capsys)
    assert code == 2  # no rank saved a trace
    seen = " ".join((tmp_path / "seen").read_text().split())
    assert seen == (
        f"2 skewlens analyze: error: {run}: no rank has saved its trace yet: {run / PARTS_DIR} is a skewlens "
        "profile's, which may still be capturing into it (a rank saves when its window ends, or at exit) or "
        "was killed before any did; wait for `skewlens profile` to finish"
    )
    assert not run.exists()  # made by the profile, left empty: removed, .parts/ too


def test_a_failing_host_of_a_1024_rank_job_gives_its_kept_and_missing_ranks_as_ranges_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the error line listed every missing rank: "missing ranks [0, 1, 2, ..., 1023]", 1,016 numbers
    run = tmp_path / "run"
    host = textwrap.dedent(
        f"""
        import pathlib, sys
        sys.path[:0] = {sys.path!r}
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_capture_hosts import save_rank
        for r in range(8, 16):
            save_rank(pathlib.Path({str(run)!r}), r, "h1", world=1024, per_host=8)
        sys.exit(3)
        """
    )
    assert skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", host]) == 3
    err = capsys.readouterr().err  # the error's command line holds the script's lines
    error = err[err.index("skewlens profile: error: command exited with code 3: ") :]
    assert error.endswith(f"' (traces of ranks 8-15 kept in {run}; missing ranks 0-7, 16-1023)\n")


def test_a_rank_saved_on_another_hosts_storage_is_not_said_to_have_crashed(tmp_path: Path) -> None:
    # each host given a RUN_DIR of its own (no shared storage): both commands succeeded, and each host's
    # manifest said the other host's rank "crashed or was killed before saving"
    save_rank(tmp_path, 0, "a")
    merge(tmp_path, 0)
    note = read_manifest(tmp_path).notes["rank 1"]
    assert "the job spans hosts (this directory's host ran 1 rank of its 2)" in note
    assert (
        "RUN_DIR must be on storage every host sees, or the hosts' directories combined with skewlens merge"
        in note
    )


def test_hosts_of_different_sizes_each_say_what_they_ran_not_that_every_host_ran_as_many(
    tmp_path: Path,
) -> None:
    # 1 rank on host a, 2 on host b (torchrun's --nproc-per-node per host), each into a directory of its own:
    # a's manifest said "(1 rank(s) per host)" of b's two ranks, b's "(2 rank(s) per host)" of a's one
    a, b = tmp_path / "a", tmp_path / "b"
    save_rank(a, 0, "a", world=3, per_host=1)
    for r in (1, 2):
        save_rank(b, r, "b", world=3, per_host=2)
    merge(a, 0)
    merge(b, 1)
    on_a, on_b = read_manifest(a).notes, read_manifest(b).notes
    assert on_a.keys() == {"rank 1", "rank 2"} and on_b.keys() == {"rank 0"}
    spans = "no trace here: the job spans hosts (this directory's host ran {}) and the rank's host saved none"
    assert on_a["rank 1"] == on_a["rank 2"] and on_a["rank 1"].startswith(spans.format("1 rank of its 3"))
    assert on_b["rank 0"].startswith(spans.format("2 ranks of its 3"))
    # two hosts' ranks saved into one directory, a third host's not
    both = tmp_path / "both"
    for r, host in ((0, "a"), (1, "b"), (2, "b")):
        save_rank(both, r, host, world=4, per_host=1 if host == "a" else 2)
    merge(both, 0)
    assert (
        read_manifest(both)
        .notes["rank 3"]
        .startswith("no trace here: the job spans hosts (this directory's 2 hosts ran 3 ranks of its 4)")
    )
    # every host saved here: a missing rank crashed (before, the smallest host's 1 rank per host said the
    # job spans hosts whose rank's host saved none here)
    shared = tmp_path / "shared"
    for r, host in ((0, "a"), (1, "b")):
        save_rank(shared, r, host, world=3, per_host=1 if host == "a" else 2)
    merge(shared, 0)
    assert read_manifest(shared).notes["rank 2"].startswith("no trace: the process crashed or was killed")


def test_a_hosts_summary_and_check_give_the_other_hosts_ranks_of_a_1024_rank_job_one_line_not_1016(
    tmp_path: Path,
) -> None:
    # host 1 of 128 hosts of 8 ranks, with a directory of its own: each of the 1,016 other ranks' notes
    # named its rank ("rank 17's host saved none"), so the summary had a row per rank and check's warning
    # 1,016 "N: ..." parts
    import io

    from rich.console import Console

    from skewlens.cli.profile import summary_table
    from skewlens.profiler.store.validate import validate_run

    for r in range(8, 16):
        save_rank(tmp_path, r, "h1", world=1024, per_host=8)
    m = merge(tmp_path, 1)
    assert isinstance(m, Manifest) and len(m.missing_ranks) == 1016
    note = (
        "no trace here: the job spans hosts (this directory's host ran 8 ranks of its 1,024) and the rank's "
        "host saved none in this "
        "directory: RUN_DIR must be on storage every host sees, or the hosts' directories combined with "
        f"skewlens merge ({doc('docs/capture.md')}, Across hosts); else the process crashed or was killed "
        "before saving (the command exited)"
    )
    assert set(m.notes.values()) == {note} and m.notes.keys() == {f"rank {r}" for r in m.missing_ranks}
    buf = io.StringIO()
    Console(file=buf, width=1000).print(summary_table(m, tmp_path))
    text = buf.getvalue().splitlines()
    assert [line for line in text if "missing" in line][1:] == [f"ranks 0-7, 16-1023 missing: {note}"]
    assert sum(line.startswith("│") for line in text) == 8 + 1
    [warning] = [i.message for i in validate_run(tmp_path).issues if i.kind == "missing-rank"]
    assert (
        warning
        == f"{tmp_path}: 1016 of 1024 ranks have no trace: 0-7, 16-1023 (the manifest says so): {note}"
    )


def test_a_rank_missing_from_a_one_host_job_is_still_said_to_have_crashed(tmp_path: Path) -> None:
    save_rank(tmp_path, 0, "a", per_host=2)
    merge(tmp_path, 0)
    assert read_manifest(tmp_path).notes["rank 1"].startswith("no trace: the process crashed or was killed")


def host_command(run: Path, port: int, node_rank: int) -> list[str]:
    """What host ``node_rank`` of a two-host job runs: skewlens profile around its torchrun."""
    return [
        sys.executable, "-m", "skewlens", "profile", "--out", str(run), "--clock-timeout", "5", "--",
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(EXAMPLE), "--steps", "6", "--straggler-rank", "1", "--straggler-ms", "20",
    ]  # fmt: skip


@pytest.mark.slow
def test_two_hosts_profiling_one_job_into_one_directory_both_exit_0_with_one_complete_manifest(
    tmp_path: Path,
) -> None:
    # two torchrun invocations joined by --nnodes 2 (the hosts share this machine's clock and name); one
    # host's skewlens profile exited 2: "no rank saved a trace (did it run 3+ steps ...?)"
    run = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_together([host_command(run, port, k) for k in (0, 1)], tmp_path / "hosts", timeout_s=240)
    errs = [h.output for h in done]
    assert [h.returncode for h in done] == [0, 0], [e[-2000:] for e in errs]
    assert sum("manifest.json already merged by another host of the job" in e for e in errs) <= 1
    m = read_manifest(run)
    assert (m.world_size, m.ranks, m.missing_ranks) == (2, (0, 1), ())
    assert sorted({s.step for s in m.steps}) == [2, 3, 4]
    assert not (run / PARTS_DIR).exists()


#: libfaketime (Debian's ``libfaketime``), to run a host's command on a clock ahead of this machine's.
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def c10d_host_command(run: Path, port: int, node_rank: int) -> list[str]:
    """What host ``node_rank`` of a job of 2 hosts × 2 ranks runs under a c10d rendezvous, saving into a
    directory of its own: torchrun gives the ranks by arrival, not by ``--node-rank``."""
    return [
        sys.executable, "-m", "skewlens", "profile", "--out", str(run), "--",
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
        "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "job-c10d", str(EXAMPLE), "--steps", "6", "--straggler-rank", "3",
        "--straggler-ms", "150",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "ahead_s",
    [0, pytest.param(3, marks=pytest.mark.skipif(not FAKETIME.is_file(), reason=f"no {FAKETIME}"))],
    ids=["one-clock", "host-1-3s-ahead"],
)
def test_c10d_hosts_saving_each_into_a_directory_of_its_own_merge_into_one_run_on_rank_0s_clock(
    tmp_path: Path, ahead_s: int
) -> None:
    # the docs' steps for hosts without shared storage, under torchrun's c10d rendezvous (tested before with
    # a static one only); host 1's whole command 3 s ahead under libfaketime: measured -3.000 s, the
    # injected straggler (rank 3) named and no clock warning
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dirs = [tmp_path / f"host{k}" for k in (0, 1)]
    cmds = [c10d_host_command(d, port, k) for k, d in enumerate(dirs)]
    if ahead_s:
        # monotonic clocks faked too: with FAKETIME_DONT_FAKE_MONOTONIC=1 Python's time.sleep fails with
        # EINVAL (libfaketime 0.9.10), and torchrun's rendezvous with it
        fake = [f"LD_PRELOAD={FAKETIME}", f"FAKETIME=+{ahead_s}s", "FAKETIME_DONT_FAKE_MONOTONIC=0"]
        cmds[1] = ["env", *fake, *cmds[1]]
    done = run_together(cmds, tmp_path / "logs", timeout_s=300)
    assert [h.returncode for h in done] == [0, 0], [h.output[-2000:] for h in done]
    mine = [read_manifest(d).ranks for d in dirs]
    assert sorted(mine[0] + mine[1]) == [0, 1, 2, 3] and len(mine[0]) == 2
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), *map(str, dirs)]) == 0
    m = read_manifest(out)
    assert (m.ranks, m.missing_ranks, m.merged_from) == ((0, 1, 2, 3), (), tuple(map(str, dirs)))
    ahead = {r: ahead_s * 1e9 * (r in mine[1]) for r in range(4)}
    for r, off in m.clock_offsets_ns.items():  # what each rank adds to read rank 0's clock
        assert abs(off - (ahead[0] - ahead[r])) < 50e6, (r, off, mine)
    report = validate_run(out)
    assert report.ok and not report.warnings, [i.message for i in report.issues]
    run = load_run(out)
    assert clock_note(run) is None
    assert analyze_run(run).stragglers[0].rank == 3


def test_hosts_that_gave_different_steps_are_named_in_an_error_note(tmp_path: Path) -> None:
    # host B ran --steps 2:1:3: rank 1 recorded steps 3-5 against rank 0's 2-4, the manifest kept B's
    # window alone, and `skewlens check` reported only "count differs" at 12 collectives
    save_rank(tmp_path, 0, "a")
    save_rank(tmp_path, 1, "b")
    part = json.loads(part_file(tmp_path, 1).read_text())
    part["window"] = {"wait": 2, "warmup": 1, "active": 3}
    part_file(tmp_path, 1).write_text(json.dumps(part))
    merge(tmp_path, 1)
    note = read_manifest(tmp_path).notes["skewlens options"]
    assert note.startswith("error: the ranks were captured with different skewlens profile options (")
    assert (
        "--level collectives --steps 1:1:3 on ranks [0]; --level collectives --steps 2:1:3 on ranks [1]"
        in note
    )


def test_two_hosts_merging_at_once_keep_every_rank_in_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # host A read the parts (rank 0) and the manifest (none); host B, whose rank 1 had just saved, merged
    # both ranks and removed the part files; A then wrote its manifest of rank 0 over B's: rank 1, whose
    # trace is complete, was listed missing, with no part file left to merge it again (18 of 200 tries of
    # two processes finishing at once)
    import threading

    from skewlens.profiler.capture import run as run_mod

    a_writing, a_go = threading.Event(), threading.Event()
    write = run_mod.write_manifest

    def write_after_b(run_dir: Path, manifest: object) -> object:
        if not a_writing.is_set():  # host A's write: wait until B has merged (or is waiting for A)
            a_writing.set()
            assert a_go.wait(timeout=30)
        return write(run_dir, manifest)  # type: ignore[arg-type]

    monkeypatch.setattr(run_mod, "write_manifest", write_after_b)
    save_rank(tmp_path, 0, "a")
    host_a = threading.Thread(target=merge, args=(tmp_path, 0))
    host_a.start()
    assert a_writing.wait(timeout=30)
    save_rank(tmp_path, 1, "b")
    host_b = threading.Thread(target=merge, args=(tmp_path, 1))
    host_b.start()
    host_b.join(timeout=2)  # without a lock B merges here; with one it waits for A
    a_go.set()
    host_a.join(timeout=30)
    host_b.join(timeout=30)
    m = read_manifest(tmp_path)
    assert (m.ranks, m.missing_ranks) == ((0, 1), ())
    assert not (tmp_path / PARTS_DIR).exists() and not (tmp_path / run_mod.MERGE_LOCK).exists()


def test_a_merge_lock_left_by_a_host_that_died_while_merging_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.profiler.capture import run as run_mod

    monkeypatch.setattr(run_mod, "MERGE_LOCK_STALE_S", 0.3)  # its wait, not 60 s
    lock = tmp_path / run_mod.MERGE_LOCK
    lock.write_text("otherhost 123\n")
    save_rank(tmp_path, 0, "a")
    save_rank(tmp_path, 1, "b")
    assert merge(tmp_path, 0) is not None
    assert read_manifest(tmp_path).ranks == (0, 1) and not lock.exists()


def test_a_host_whose_clock_is_ahead_of_the_file_servers_waits_for_the_lock_another_host_holds(
    tmp_path: Path,
) -> None:
    # host b took the merge lock a moment ago, by the file server's clock 70 s before host a's: host a
    # took the lock's modification time for an age of 70 s, broke it and merged beside host b
    import threading
    import time

    from skewlens.profiler.capture import run as run_mod

    lock = tmp_path / run_mod.MERGE_LOCK
    lock.write_text("hostb 123\n")
    then = time.time() - 70
    os.utime(lock, (then, then))
    held: list[str] = []

    def host_b_merges() -> None:
        time.sleep(1.0)
        held.append(lock.read_text() if lock.exists() else "(broken)")
        lock.unlink()

    b = threading.Thread(target=host_b_merges)
    b.start()
    save_rank(tmp_path, 0, "a")
    save_rank(tmp_path, 1, "b")
    assert merge(tmp_path, 0) is not None
    b.join()
    assert held == ["hostb 123\n"]  # still its own when it let go: host a waited for it
    assert read_manifest(tmp_path).ranks == (0, 1) and not lock.exists()


def host_dir(
    run: Path,
    ranks: tuple[int, ...],
    host: str,
    *,
    world: int = 2,
    late_s: float = 0.0,
    run_id: str | None = None,
    gpus: Mapping[int, str] | None = None,
) -> Path:
    """A host's own run directory (no shared storage) after its ``skewlens profile`` merged it: its ranks'
    traces and part files, steps 2-4 of 0.5 s each at whole seconds of rank 0's clock (``late_s`` later;
    a rank saves its times with its clock offset applied), under torchrun's run id ``run_id`` (None: a part
    file of a skewlens that recorded no run identity), on the GPUs ``gpus`` (rank -> model; none: CPU)."""
    for r in ranks:
        save_rank(run, r, host, world=world, per_host=len(ranks))
        part = json.loads(part_file(run, r).read_text())
        at = {s: int((s + late_s) * 1e9) for s in (2, 3, 4)}
        part["steps"] = [{"step": s, "start_ns": t, "end_ns": t + 500_000_000} for s, t in at.items()]
        if run_id is not None:
            started_ns = 1_000_000_000 + r
            part["run_identity"] = {
                "run_id": run_id,
                "rendezvous": "10.0.0.1:29500",
                "started_ns": started_ns,
            }
        if gpus and r in gpus:  # what a rank on CUDA says of its device
            part["gpu"] = gpus[r]
        part_file(run, r).write_text(json.dumps(part))
    merge(run, 0)
    return run


def test_skewlens_merge_combines_the_run_directories_of_a_jobs_hosts_into_one_complete_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each host saved into a directory of its own: every manifest listed the other host's ranks as
    # missing, and nothing combined them (skewlens analyze takes one RUN_DIR)
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4)
    b = host_dir(tmp_path / "b", (2, 3), "b", world=4)
    assert read_manifest(a).missing_ranks == (2, 3)
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 0
    m = read_manifest(out)
    assert (m.world_size, m.ranks, m.missing_ranks) == (4, (0, 1, 2, 3), ())
    assert m.hosts == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert m.clock_offsets_ns == {0: 0, 1: 1000, 2: 2000, 3: 3000}
    assert not any(k.startswith("rank ") for k in m.notes)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *(f"rank-{r}.et" for r in range(4))]
    printed = capsys.readouterr()  # the report on stdout, as every command's but profile's
    title = f"skewlens merge: {out} (level"
    assert title in printed.out and title not in printed.err
    assert read_manifest(a).ranks == (0, 1)  # the hosts' directories are left as they were


H100 = "NVIDIA H100 80GB HBM3 (132 SMs, 79.2 GiB)"
A100 = "NVIDIA A100-SXM4-80GB (108 SMs, 80.0 GiB)"


def test_skewlens_merge_keeps_each_ranks_gpu_from_the_host_it_ran_on(tmp_path: Path) -> None:
    # the hosts' part files said each rank's GPU; the merged manifest had none (gpus was import's only)
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4, gpus={0: H100, 1: H100})
    b = host_dir(tmp_path / "b", (2, 3), "b", world=4, gpus={2: A100})  # rank 3's device could not say
    assert read_manifest(a).gpus == {0: H100, 1: H100}
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 0
    assert read_manifest(out).gpus == {0: H100, 1: H100, 2: A100}


def test_skewlens_merge_refuses_hosts_that_disagree_on_a_ranks_gpu_naming_the_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = host_dir(tmp_path / "a", (0,), "a", gpus={0: H100})
    b = host_dir(tmp_path / "b", (1,), "b", gpus={1: A100})
    # host a's manifest (of an earlier attempt, or edited) says rank 1, whose trace b holds, ran on an H100
    m = read_manifest(a)
    write_manifest(a, dataclasses.replace(m, gpus={**m.gpus, 1: H100}))
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"rank 1: GPU '{H100}' in {a / 'manifest.json'} but '{A100}' in its part file in {b}: the "
        "directories disagree on which GPU it ran on" in err
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([((0,), 0.0)], "rank 1 of 2 is in none of"),
        ([((0,), 0.0), ((0,), 0.0)], "rank 0 is in both"),
        (
            [((0,), 0.0), ((1,), 10.0)],
            "not one run: rank 1 (host h1, in {h1}) began step 2 9.500 s after rank 0 (host h0, in {h0})",
        ),
        # 0.6 s late with steps of 0.5 s: each of rank 1's steps begins 0.1 s after rank 0's ended
        (
            [((0,), 0.0), ((1,), 0.6)],
            "not one run: rank 1 (host h1, in {h1}) began step 2 0.100 s after rank 0 (host h0, in {h0})",
        ),
    ],
    ids=["a rank missing", "a rank twice", "another run", "steps apart by less than a second"],
)
def test_skewlens_merge_refuses_directories_that_are_not_every_rank_of_one_run_once(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    hosts: list[tuple[tuple[int, ...], float]],
    message: str,
) -> None:
    dirs = [
        str(host_dir(tmp_path / f"h{k}", ranks, f"h{k}", late_s=late))
        for k, (ranks, late) in enumerate(hosts)
    ]
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), *dirs]) == 2
    err = capsys.readouterr().err
    message = message.format(**{f"h{k}": d for k, d in enumerate(dirs)})
    assert err.startswith("skewlens merge: error: ") and message in err, err
    assert not out.exists()


def test_skewlens_merge_refuses_steps_that_do_not_overlap_even_with_force_naming_each_ranks_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the refusal named ranks and hosts (one host name on every machine of a container job) but not the
    # directories to look at, and did not say whether --force, which the run-identity refusal offers, helps
    a = host_dir(tmp_path / "a", (0,), "vm", run_id="job-7")
    b = host_dir(tmp_path / "b", (1,), "vm", late_s=38.873, run_id="job-7")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--force", "--out", str(out), str(a), str(b)]) == 2
    assert capsys.readouterr().err == (
        f"skewlens merge: error: not one run: rank 1 (host vm, in {b}) began step 2 38.373 s after rank 0 "
        f"(host vm, in {a}) ended it, on rank 0's clock: the directories are of different runs, or a clock "
        "offset is wrong; --force does not merge them (it overrides only a run identity that differs)\n"
    )
    assert not out.exists()


def test_skewlens_merge_refusing_steps_apart_names_the_rank_whose_clock_offset_its_host_could_not_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # host b's clock 3 s ahead and its rank's clock exchange timed out (offset 0 assumed): the refusal
    # said "the directories are of different runs, or a clock offset is wrong (the manifests' notes say if
    # one is unknown)", the note it meant in b/.parts/rank-1.json
    a = host_dir(tmp_path / "a", (0,), "ha", run_id="job-7")
    b = host_dir(tmp_path / "b", (1,), "hb", late_s=3.0, run_id="job-7")
    part = json.loads(part_file(b, 1).read_text())
    said = "clock offset unknown (rank 0 did not answer); 0 assumed"
    part["notes"] = {rank_note_key(1, RankNote.CLOCK): said}
    part_file(b, 1).write_text(json.dumps(part))
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert (
        f"rank 1 (host hb, in {b}) began step 2 2.500 s after rank 0 (host ha, in {a}) ended it, on rank 0's "
        f"clock: rank 1's {said}: its host's times are on its own clock, not rank 0's (capture again with a "
        "longer SKEWLENS_CLOCK_TIMEOUT_S"
    ) in err, err
    assert not (tmp_path / "run").exists()


def test_skewlens_merge_given_one_directory_twice_says_so_instead_of_that_its_rank_is_in_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # said "rank 0 is in both h0 and h0: give each host's directory once"
    monkeypatch.chdir(tmp_path)
    host_dir(tmp_path / "h0", (0,), "a")
    host_dir(tmp_path / "h1", (1,), "b")
    assert skewlens_main(["merge", "--out", "run", "h0", "h1", "h0"]) == 2
    assert capsys.readouterr().err == (
        "skewlens merge: error: h0 is given twice: give each host's directory once\n"
    )
    assert skewlens_main(["merge", "--out", "run", "h0", str(tmp_path / "h0")]) == 2
    assert capsys.readouterr().err == (
        f"skewlens merge: error: h0 and {tmp_path}/h0 are one directory: give each host's directory once\n"
    )
    assert not (tmp_path / "run").exists()


def test_the_merged_manifest_records_the_host_directories_it_was_merged_from_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it kept rank 0's host's command and nothing of which directories were combined
    monkeypatch.chdir(tmp_path)
    host_dir(tmp_path / "h1", (1,), "b")
    host_dir(tmp_path / "h0", (0,), "a")
    assert skewlens_main(["merge", "--out", "run", "h1", "h0"]) == 0
    m = read_manifest(tmp_path / "run")
    assert m.merged_from == (str((tmp_path / "h1").resolve()), str((tmp_path / "h0").resolve()))
    assert m.command == ("torchrun", "--node-rank=0")
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["merged_from"] == list(m.merged_from)
    assert read_manifest(tmp_path / "h0").merged_from == ()  # a host's own profile merged no directories


def test_skewlens_merge_refuses_an_out_that_holds_files_and_leaves_them_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 2
    assert f"--out {out}: exists and is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_skewlens_merge_refuses_hosts_that_gave_different_steps_or_world_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    m = json.loads((b / "manifest.json").read_text())
    m["step_window"] = {"wait": 2, "warmup": 1, "active": 3}
    (b / "manifest.json").write_text(json.dumps(m))
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    assert (
        f"not one run: --level collectives --steps 1:1:3 in {a}; --level collectives --steps 2:1:3 in {b}"
        in capsys.readouterr().err
    )
    c = host_dir(tmp_path / "c", (1,), "c", world=3)
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(c)]) == 2
    assert f"not one run: world size 2 in {a}; world size 3 in {c}" in capsys.readouterr().err


def test_skewlens_merge_refuses_hosts_of_different_run_ids_naming_each_directory_and_its_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two jobs of the same world size and options, captured the same day (steps overlapping on the
    # clock): their hosts' directories merged without a word into one run of two jobs
    a = host_dir(tmp_path / "a", (0,), "a", run_id="job-7")
    b = host_dir(tmp_path / "b", (1,), "b", run_id="job-8")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert (
        f"not one run: run id job-7 at 10.0.0.1:29500 in {a}; run id job-8 at 10.0.0.1:29500 in {b}" in err
    ), err
    assert not out.exists()
    assert skewlens_main(["merge", "--force", "--out", str(out), str(a), str(b)]) == 0
    m = read_manifest(out)
    assert m.ranks == (0, 1)
    assert m.notes["run identity"].startswith("merged with --force although the directories' identities")
    assert "skewlens merge: warning: run identity merged with --force" in capsys.readouterr().err


def test_the_merged_manifest_keeps_the_jobs_run_identity_with_its_earliest_start(tmp_path: Path) -> None:
    # the manifest said nothing of which job it was, so a merged run could not be checked against another
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4, run_id="job-7")
    b = host_dir(tmp_path / "b", (2, 3), "b", world=4, run_id="job-7")
    assert read_manifest(b).run_identity == RunIdentity(
        run_id="job-7", rendezvous="10.0.0.1:29500", started_ns=1_000_000_002
    )
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 0
    m = read_manifest(out)
    assert m.run_identity == RunIdentity(
        run_id="job-7", rendezvous="10.0.0.1:29500", started_ns=1_000_000_000
    )
    assert "run identity" not in m.notes


def _without_run_identity(d: Path) -> Path:
    """``d`` with its manifest as an older skewlens wrote it: no ``run_identity`` key at all."""
    old = json.loads((d / "manifest.json").read_text())
    assert old.pop("run_identity") is None
    (d / "manifest.json").write_text(json.dumps(old))
    return d


def test_host_directories_captured_before_the_run_identity_still_merge_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a directory of an older skewlens (no run identity) merged as if checked, with no word that it was not
    a = _without_run_identity(host_dir(tmp_path / "a", (0,), "a"))
    b = host_dir(tmp_path / "b", (1,), "b", run_id="job-7")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 0
    note = f"not checked for {a}: captured by a skewlens that did not record the run's identity"
    assert read_manifest(out).notes["run identity"] == note
    assert f"skewlens merge: warning: run identity {note}" in capsys.readouterr().err


def test_the_merge_warning_and_an_ignored_part_file_show_an_esc_in_a_hosts_path_as_a_replacement_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # both printed the path as it was: an ESC ]0;...BEL in a host's directory name set the terminal's title
    from skewlens.profiler.capture.run import read_parts

    a = _without_run_identity(host_dir(tmp_path / "a\x1b]0;pwned\x07", (0,), "a"))
    b = host_dir(tmp_path / "b", (1,), "b", run_id="job-7")
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 0
    shown = str(a).replace("\x1b", "\ufffd").replace("\x07", "\ufffd")
    note = f"not checked for {shown}: captured by a skewlens that did not record the run's identity"
    assert f"skewlens merge: warning: run identity {note}" in capsys.readouterr().err.splitlines()
    part_file(a, 0).write_text("{")
    assert read_parts(a) == {}
    said = capsys.readouterr().err
    assert said.startswith(f"skewlens: ignoring unreadable part file {shown}/.parts/") and "\x1b" not in said


def test_skewlens_merge_allow_missing_merges_the_ranks_found_and_lists_a_crashed_rank_with_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 3 crashed before saving: merge refused "ranks [3] of 4 are in none of ...", and the three
    # ranks' traces could not be analysed together at all
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4, run_id="job-7")
    b = host_dir(tmp_path / "b", (2,), "b", world=4, run_id="job-7")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 2
    assert "--allow-missing to merge the ranks found" in capsys.readouterr().err
    assert skewlens_main(["merge", "--allow-missing", "--out", str(out), str(a), str(b)]) == 0
    m = read_manifest(out)
    assert (m.ranks, m.missing_ranks) == ((0, 1, 2), (3,))
    assert m.notes["rank 3"].startswith(
        f"no trace in any host directory merged ({a}, {b}): its process crashed"
    )
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *(f"rank-{r}.et" for r in range(3))]


def test_skewlens_merge_missing_a_host_of_many_names_its_ranks_as_a_range_and_a_few_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 16 hosts of 4 ranks, host 1's directory not given: the refusal listed the ranks as a Python list
    # ("ranks [4, 5, 6, 7] of 64", 1,016 numbers for a host of 8 missing from 1,024 ranks) and every
    # one of the 15 directories given, 15 paths on one line
    dirs = [
        host_dir(tmp_path / f"h{k}", tuple(range(4 * k, 4 * k + 4)), f"h{k}", world=64)
        for k in range(16)
        if k != 1
    ]
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), *map(str, dirs)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (
        f"skewlens merge: error: ranks 4-7 of 64 are in none of {dirs[0]}, {dirs[1]}, {dirs[2]} and 12 "
        "more: give the directory of every host of the job (or --allow-missing to merge the ranks found)"
    )
    assert skewlens_main(["merge", "--allow-missing", "--out", str(out), *map(str, dirs)]) == 0
    notes = read_manifest(out).notes
    assert notes["rank 4"] == notes["rank 7"]
    assert notes["rank 4"].startswith(
        f"no trace in any host directory merged ({dirs[0]}, {dirs[1]}, {dirs[2]} and 12 more): its process"
    )


def test_the_hosts_directories_copied_into_one_say_which_traces_are_there_and_merge_into_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # host a's and host b's directories copied into one (`cp -r a/. b/. run`): the manifest, the last one
    # copied (b's), listed rank 0 as missing and check said "rank 0 of 2 has no trace (the manifest says
    # so): no trace here: the job spans hosts ...", its rank-0.et right there
    run = tmp_path / "run"
    for d in (host_dir(tmp_path / "a", (0,), "a"), host_dir(tmp_path / "b", (1,), "b")):
        shutil.copytree(d, run, dirs_exist_ok=True)
    [said] = [i.message for i in validate_run(run).issues if i.kind == "missing-rank"]
    assert said == (
        f"{run}: rank 0 left out although {rank_file(run, 0)} is here: {run / 'manifest.json'} is that of a "
        "host which saved none of them ('no trace here: the job spans hosts'): the hosts' directories copied "
        f"into one? `skewlens merge --out NEW_RUN {run}` makes one run of them"
    )
    out = tmp_path / "merged"
    assert skewlens_main(["merge", "--out", str(out), str(run)]) == 0, capsys.readouterr().err
    m = read_manifest(out)
    assert (m.ranks, m.missing_ranks, m.hosts) == ((0, 1), (), {0: "a", 1: "b"})


def test_analyze_given_each_hosts_directory_says_to_merge_them_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `skewlens analyze host0/RUN host1/RUN` said only "unrecognized arguments: host1/RUN"
    a, b = host_dir(tmp_path / "a", (0,), "a"), host_dir(tmp_path / "b", (1,), "b")
    for command in (["analyze", str(a), str(b), "--out", str(tmp_path / "out")], ["check", str(a), str(b)]):
        with pytest.raises(SystemExit):
            skewlens_main(command)
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"skewlens {command[0]}: error: unrecognized arguments: {b} (skewlens {command[0]} reads one run "
            "directory: combine the run directories of a job's hosts with skewlens merge --out RUN DIR..., "
            "then give it RUN)"
        )
    assert not (tmp_path / "out").exists()


def test_skewlens_merge_given_a_host_directory_that_does_not_exist_says_so_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # host b's skewlens profile was stopped (SIGTERM) while its rank was blocked in a collective: the rank
    # saved nothing and the profile left no directory; merge said "b/manifest.json: no manifest (is b a
    # skewlens run directory?)", --allow-missing or not
    a = host_dir(tmp_path / "a", (0,), "a")
    b = tmp_path / "b"
    out = tmp_path / "run"
    for options in ([], ["--allow-missing"]):
        assert skewlens_main(["merge", *options, "--out", str(out), str(a), str(b)]) == 2
        assert " ".join(capsys.readouterr().err.split()) == (
            f"skewlens merge: error: {b}: no such directory: a host's skewlens profile whose ranks saved no "
            "trace leaves none (its stderr said so); leave it out and merge the others with --allow-missing"
        )
    assert not out.exists()


def test_skewlens_merge_allow_missing_keeps_what_the_crashed_ranks_host_said_of_it(tmp_path: Path) -> None:
    # rank 3 was killed while saving: its host's manifest says its trace is incomplete; the merge's note
    # replaced that with a guess ("crashed ... or its host's directory was not given")
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4, run_id="job-7")
    b = host_dir(tmp_path / "b", (2,), "b", world=4, run_id="job-7")
    rank_file(b, 3).write_bytes(rank_file(b, 2).read_bytes()[:10])  # its trace, cut short; no part file
    (b / "manifest.json").unlink()
    merge(b, 1)  # host b's skewlens profile as it ends
    host_note = read_manifest(b).notes["rank 3"]
    assert host_note.startswith("trace incomplete")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--allow-missing", "--out", str(out), str(a), str(b)]) == 0
    note = read_manifest(out).notes["rank 3"]
    assert note.startswith(f"no trace in any host directory merged ({a}, {b})")
    assert note.endswith(f"; {b} said: {host_note}")
    assert str(a) + " said" not in note  # host a only guessed that another host held rank 3


@pytest.mark.slow
def test_skewlens_merge_refuses_the_host_directories_of_two_torchrun_jobs_of_different_run_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two two-host jobs of one world size and options (--rdzv-id job-1 and job-2), each host saving into a
    # directory of its own: host A's directory of job 1 and host B's of job 2 were not told apart by id
    dirs: dict[tuple[str, int], Path] = {}
    for job in ("job-1", "job-2"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmds = []
        for k in (0, 1):
            dirs[job, k] = tmp_path / f"{job}-host{k}"
            cmd = host_command(dirs[job, k], port, k)
            cmd.insert(cmd.index("--nnodes"), f"--rdzv-id={job}")
            cmds.append(cmd)
        done = run_together(cmds, tmp_path / f"{job}-logs", timeout_s=240)
        assert [h.returncode for h in done] == [0, 0], [h.output[-2000:] for h in done]
    identity = read_manifest(dirs["job-1", 0]).run_identity
    assert (
        identity is not None and identity.run_id == "job-1" and identity.rendezvous.startswith("127.0.0.1:")
    )
    out = tmp_path / "run"
    a, b = dirs["job-1", 0], dirs["job-2", 1]
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"not one run: run id job-1 at {identity.rendezvous} in {a}; run id job-2 at " in err, err
    assert skewlens_main(["merge", "--out", str(out), str(a), str(dirs["job-1", 1])]) == 0
    merged = read_manifest(out).run_identity
    assert merged is not None and (merged.run_id, merged.rendezvous) == ("job-1", identity.rendezvous)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("clock_offset_ns", "x", "clock_offset_ns: expected an integer"),
        ("steps", "abc", "steps: expected a JSON list"),
        ("notes", ["a"], "notes: expected a JSON object"),
        ("window", {"bogus": 1}, "window: expected {wait, warmup, active} integers"),
        ("world_size", 10**12, "world_size: expected 1..1048576"),
        ("process_groups", [{"name": "0", "ranks": "ab"}], "process_groups: expected {name, ranks:"),
    ],
)
def test_skewlens_merge_names_a_malformed_part_file_and_its_field_instead_of_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object, says: str
) -> None:
    # another host's files: each of these was a TypeError or ValueError traceback (a world size of 10**12
    # a loop over that many ranks)
    a = host_dir(tmp_path / "a", (0, 1), "a", world=4)
    b = host_dir(tmp_path / "b", (2, 3), "b", world=4)
    f = part_file(b, 2)
    f.write_text(json.dumps({**json.loads(f.read_text()), field: value}))
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"skewlens: ignoring malformed part file {f}: {says}" in err and "Traceback" not in err
    assert f"{b}: ranks [2]: part file unreadable or malformed ({f})" in err
    assert not (tmp_path / "run").exists()


def test_skewlens_merge_names_a_hosts_missing_trace_instead_of_blaming_its_sound_part_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 1's trace was not copied: merge said "part file unreadable or malformed (b/.parts/rank-1.json)",
    # a file that was fine
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    rank_file(b, 1).unlink()
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"skewlens merge: error: {b}/rank-1.et is missing: {b}/manifest.json lists rank 1 with a trace "
        "(copy the host's whole directory)\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("make", "kind"), [(os.mkfifo, "a FIFO"), (os.mkdir, "a directory")])
def test_skewlens_merge_names_a_hosts_trace_that_is_no_regular_file_as_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], None], kind: str
) -> None:
    # a FIFO or a directory named rank-1.et was "missing", beside the very file named
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    rank_file(b, 1).unlink()
    make(rank_file(b, 1))
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    assert capsys.readouterr().err == (
        f"skewlens merge: error: {b}/rank-1.et: {kind}, not the trace file the host saved: {b}/manifest.json "
        "lists rank 1 with a trace (copy the host's whole directory)\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("which", ["trace", "part file"])
def test_skewlens_merge_refuses_a_hosts_file_that_is_a_link_instead_of_copying_what_it_points_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    # a host directory's rank-1.et linking to ~/.ssh/id_rsa put the merging user's key into the run
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    f = rank_file(b, 1) if which == "trace" else part_file(b, 1)
    secret = tmp_path / "secret"
    f.rename(secret)
    f.symlink_to(secret)
    assert skewlens_main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    assert capsys.readouterr().err == (
        f"skewlens merge: error: {f}: a symbolic link (to {secret}), not a file the host saved: merge copies "
        "only the hosts' own files (copy the host's directory with its files, not links)\n"
    )
    assert not (tmp_path / "run").exists()


def test_skewlens_merge_copies_a_hosts_raw_traces_but_not_its_links_or_fifos(tmp_path: Path) -> None:
    # a link in a host's raw/ to /etc/passwd was copied into the run as raw/rank-1.json
    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    (b / "raw").mkdir()
    (b / "raw" / "rank-1_kineto.json").write_text("{}")
    (b / "raw" / "extra").mkdir()  # a folder of the host's own is copied
    (b / "raw" / "extra" / "rank-1_host.json").write_text("{}")
    (b / "raw" / "rank-1.json").symlink_to("/etc/passwd")
    os.mkfifo(b / "raw" / "rank-1_host.json")
    (a / "raw").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "private").write_text("x")
    out = tmp_path / "run"
    assert skewlens_main(["merge", "--out", str(out), str(a), str(b)]) == 0
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["extra", "rank-1_kineto.json"]
    assert (out / "raw" / "extra" / "rank-1_host.json").read_text() == "{}"


def test_a_gzipped_part_file_that_inflates_past_its_ratio_is_ignored_unparsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # part files were read bounded at the manifest's 1 GiB but gunzipped at any ratio: a 1 MB gzip of one
    # repeated value became 1 GiB of JSON and some 5 GB parsed, as a gzipped manifest did before 2774ac9
    import gzip

    from skewlens.profiler.bounded import JSON_GZIP_FLOOR_BYTES
    from skewlens.profiler.capture.run import read_parts

    p = part_file(tmp_path, 0)
    p.parent.mkdir()
    p.write_bytes(gzip.compress(b'{"x": "' + b"0" * JSON_GZIP_FLOOR_BYTES + b'"}', compresslevel=1))
    assert read_parts(tmp_path) == {}
    said = capsys.readouterr().err
    assert said.startswith(f"skewlens: ignoring unreadable part file {p}: gzipped part file expands past")


def test_a_host_starting_while_another_proves_the_shared_directory_writable_is_not_refused(
    tmp_path: Path,
) -> None:
    # the hosts of a job start at once: one listed the directory while the other's probe file was in it,
    # said "directory is not empty" and exited 2, and the other host's ranks waited for its ranks until the
    # rendezvous timed out (a CI run of the two-host test: 240 s)
    run = tmp_path / "run"
    run.mkdir()
    (run / f"{PROBE_PREFIX}abc123").write_text("")  # the other host's, not yet removed
    assert prepare_run_dir(run) is False
    (run / "rank-0.et").write_text("")  # anything else is a run already there
    with pytest.raises(CaptureError, match="directory is not empty"):
        prepare_run_dir(run)


def test_a_run_directory_holding_only_a_hidden_file_that_is_no_probe_is_refused_as_not_empty(
    tmp_path: Path,
) -> None:
    # only a probe file counts as nothing: a dotfile of one's own (a .keep, an earlier run's cache) is a
    # directory in use
    run = tmp_path / "run"
    run.mkdir()
    (run / ".keep").write_text("")
    with pytest.raises(CaptureError, match="directory is not empty"):
        prepare_run_dir(run)


def test_the_probe_file_a_host_makes_is_one_that_another_host_starting_then_counts_as_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the other host lists the directory while this host's probe file is in it
    import tempfile

    real = tempfile.NamedTemporaryFile
    seen: list[bool] = []

    def probe(*args: Any, **kwargs: Any) -> Any:
        f = real(*args, **kwargs)
        if not seen:
            seen.append(True)
            seen.append(prepare_run_dir(run) is False)  # the other host, starting then
        return f

    run = tmp_path / "run"
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", probe)
    assert prepare_run_dir(run) is True
    assert seen == [True, True]
    assert list(run.iterdir()) == [run / PARTS_DIR]  # the sign of a capture under way, empty
    assert not any((run / PARTS_DIR).iterdir())


def test_a_host_whose_ranks_another_host_merged_without_a_rank_whose_save_failed_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the other host merged rank 0 and listed rank 1, whose save failed, as missing: this host's command
    # succeeded, but the capture did not (exit 0 let a nightly job go on without rank 1)
    run = tmp_path / "run"
    other_host = _other_host(
        run,
        """
        from skewlens.profiler.manifest import Manifest, rank_note_key, write_manifest
        save_rank(run, 0, "a")
        note = "trace not saved: run/rank-1.et: No space left on device"
        write_manifest(run, Manifest(world_size=2, ranks=(0,), missing_ranks=(1,), level="collectives",
                                     notes={rank_note_key(1): note}))
        """,
    )
    code = skewlens_main(["profile", "--out", str(run), "--", sys.executable, "-c", other_host])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "manifest.json already merged by another host of the job (rank 0 of 2" in err
    assert err.splitlines()[-1].startswith(
        "skewlens profile: error: rank 1: trace not saved: run/rank-1.et: No space left on device (the traces"
    )
