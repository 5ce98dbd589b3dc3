"""A save that fails (a full disk, a quota) never ends the training it runs in.

A rank saves its trace inside the program (from optimizer.step()'s hook, at exit): the writer's
``OSError: [Errno 28] No space left on device`` used to reach the training script, which died, and
torchrun stopped the other ranks. Now the save leaves nothing half-written and says why in the rank's
part file, which the manifest's note on the missing rank repeats.
"""

from __future__ import annotations

import errno
import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.capture.autostart import ENV_PROFILE
from skewlens.profiler.capture.run import capture_env, finalize_run, read_parts, unsaved_traces
from skewlens.profiler.capture.session import CaptureSession, run_identity
from skewlens.profiler.chakra_io import EtWriter
from skewlens.profiler.manifest import StepWindow
from skewlens.profiler.vocab import Level

WINDOW = StepWindow(wait=0, warmup=0, active=1)


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace writer runs out of space after its first bytes (its temporary file exists by then)."""

    def write_all(self: EtWriter, _nodes: Any) -> None:
        self.write_raw(b"\0" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(EtWriter, "write_all", write_all)


def capture_one_step(run: Path, monkeypatch: pytest.MonkeyPatch, rank: int) -> CaptureSession:
    """Rank ``rank`` of 2 (no process group: the rank from torchrun's environment) records one step; its
    end saves the window, as the optimizer's step hook does."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    s = CaptureSession(run, level=Level.COLLECTIVES, window=WINDOW, auto_step=False)
    monkeypatch.setattr("signal.signal", lambda *_a: None)  # (the capture's SIGTERM handler)
    s.install()
    try:
        s.step()
    finally:
        s.uninstall()
    return s


def test_each_profile_gives_its_ranks_a_token_of_its_own_which_each_ranks_part_file_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two skewlens profile commands into one --out are told apart by it (run._not_one_capture)
    envs = [
        capture_env(tmp_path / "run", Level.COLLECTIVES, WINDOW, keep_raw=False, clock_timeout_s=1)
        for _ in "ab"
    ]
    token = envs[0][ENV_PROFILE]
    assert token and token != envs[1][ENV_PROFILE]
    monkeypatch.setenv(ENV_PROFILE, token)
    capture_one_step(tmp_path / "run", monkeypatch, rank=0)
    assert read_parts(tmp_path / "run")[0]["profile"] == token


def test_a_save_that_runs_out_of_space_returns_to_the_training_and_leaves_only_a_part_file_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    disk_full(monkeypatch)
    s = capture_one_step(run, monkeypatch, rank=1)  # raised OSError into the program
    assert s.saved
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == [".parts", ".parts/rank-1.json"]
    why = f"{run}/rank-1.et: No space left on device"
    assert read_parts(run)[1]["not_saved"] == why
    assert capsys.readouterr().err == f"skewlens: rank 1: trace not saved: {why}\n"


def test_the_manifest_lists_a_rank_whose_save_failed_as_missing_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    capture_one_step(run, monkeypatch, rank=0)
    with monkeypatch.context() as m:
        disk_full(m)
        capture_one_step(run, monkeypatch, rank=1)
    manifest = finalize_run(run, level=Level.COLLECTIVES, window=WINDOW, command=["train"])
    assert manifest is not None
    assert (manifest.ranks, manifest.missing_ranks) == ((0,), (1,))
    # was "no trace: the process crashed or was killed before saving (the command exited)"
    assert manifest.notes["rank 1"] == f"trace not saved: {run}/rank-1.et: No space left on device"


def test_a_rank_killed_before_saving_is_not_given_the_reason_an_earlier_attempts_failed_save_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # attempt 0: rank 1's save ran out of space (its part file says so); torchrun restarted the ranks, and
    # attempt 1's rank 1 was killed before saving (it left nothing), rank 0 saved: the manifest said
    # 'trace not saved: .../rank-1.et: No space left on device', attempt 0's reason, and profile repeated it
    run = tmp_path / "run"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with monkeypatch.context() as m:
        disk_full(m)
        capture_one_step(run, monkeypatch, rank=1)
    assert read_parts(run)[1]["run_identity"]["restart_count"] == 0  # which attempt's save failed
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    capture_one_step(run, monkeypatch, rank=0)
    manifest = finalize_run(run, level=Level.COLLECTIVES, window=WINDOW, command=["train"], exit_code=1)
    assert manifest is not None and (manifest.ranks, manifest.missing_ranks) == ((0,), (1,))
    note = manifest.notes["rank 1"]
    assert note.startswith("no trace from the command's last attempt: the process crashed or was killed")
    assert "its part file is an earlier attempt's (torchrun restarted the command: its capture began " in note
    assert note.endswith(f"whose save failed: {run}/rank-1.et: No space left on device")
    assert unsaved_traces(run) == {}
    # the same attempt's failed save keeps its reason
    with monkeypatch.context() as m:
        disk_full(m)
        capture_one_step(run, monkeypatch, rank=1)
    assert unsaved_traces(run) == {1: f"{run}/rank-1.et: No space left on device"}


def test_a_restart_count_that_is_no_plain_number_reads_as_attempt_0_and_never_fails_the_save(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # int('²') raised ValueError ('²'.isdigit() is true) inside the save, out of the training's step()
    for value, count in (("3", 3), ("-1", 0), ("²", 0), ("", 0)):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", value)
        assert run_identity(0)["restart_count"] == count, value


def test_a_trace_whose_part_file_cannot_be_written_is_removed_and_the_run_says_its_save_may_have_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / ".parts").mkdir(parents=True)
    (run / ".parts" / "rank-1.json").mkdir()  # the part file's place is taken: it cannot be written
    capture_one_step(run, monkeypatch, rank=1)
    assert not (run / "rank-1.et").exists()  # a trace without its part file is no part of the run
    why = f"cannot write {run}/.parts/rank-1.json: Is a directory"
    assert capsys.readouterr().err.splitlines() == [
        f"skewlens: rank 1: trace not saved: {why}",
        f"skewlens: rank 1: its save failed (above), and so did the part file that tells the run why: {why}",
    ]
    # the run cannot know why, and no longer says only that the rank crashed or was killed
    capture_one_step(run, monkeypatch, rank=0)
    manifest = finalize_run(run, level=Level.COLLECTIVES, window=WINDOW, command=["train"])
    assert manifest is not None and manifest.missing_ranks == (1,)
    assert manifest.notes["rank 1"] == (
        "no trace: the process crashed or was killed before saving (the command exited), or its save failed "
        "and so did the part file that says why (its stderr then says 'trace not saved')"
    )


def test_a_profile_whose_only_rank_could_not_save_gives_its_reason_instead_of_asking_whether_it_stepped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli import main as skewlens_main

    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import pathlib, torch
        pathlib.Path({str(run / "rank-0.et")!r}).mkdir()  # the trace's place is taken: its rename fails
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        pathlib.Path({str(tmp_path / "trained")!r}).touch()  # the save failed at the second step()
        """
    )
    argv = ["profile", "--out", str(run), "--steps", "0:0:2", "--", sys.executable, "-c", script]
    assert skewlens_main(argv) == 2
    err = capsys.readouterr().err
    assert (tmp_path / "trained").exists()
    # was "no rank saved a trace. A rank saves it when the window ends ...; did it import torch, and run
    # 3+ steps ...?" (after the script died of the save's IsADirectoryError); worded as where the command
    # failed ("no rank saved a trace: WHY"), not "(WHY)" here and ": WHY" there
    assert err.endswith(
        f"skewlens profile: error: {shlex.join([sys.executable, '-c', script])}: no rank saved a trace: "
        f"rank 0: trace not saved: {run}/rank-0.et: Is a directory\n"
    )


def test_uninstalling_a_session_puts_back_the_sigterm_handler_it_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an in-process capture (the Python API, and the tests) left its handler in the process after it ended
    import signal

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        s = CaptureSession(tmp_path / "run", level=Level.COLLECTIVES, window=WINDOW, auto_step=False)
        s.install()
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the session's, while it runs
        s.uninstall()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("named", ["temporary", "other"])
def test_a_failed_save_names_the_trace_for_its_temporary_file_and_any_other_file_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    run = tmp_path / "run"
    other = tmp_path / "elsewhere.bin"
    failed = run / ".rank-1.et.12345.tmp" if named == "temporary" else other

    def write_all(_self: EtWriter, _nodes: Any) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(failed))

    monkeypatch.setattr(EtWriter, "write_all", write_all)
    capture_one_step(run, monkeypatch, rank=1)
    shown = run / "rank-1.et" if named == "temporary" else other
    assert capsys.readouterr().err == f"skewlens: rank 1: trace not saved: {shown}: Permission denied\n"


def test_a_profile_whose_command_succeeded_while_one_rank_could_not_save_fails_keeping_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli import main as skewlens_main

    saved = tmp_path / "saved"  # what two ranks leave: rank 0's trace, rank 1's part file saying why not
    capture_one_step(saved, monkeypatch, rank=0)
    with monkeypatch.context() as m:
        disk_full(m)
        capture_one_step(saved, monkeypatch, rank=1)
    capsys.readouterr()
    run = tmp_path / "run"
    script = f"import shutil; shutil.copytree({str(saved)!r}, {str(run)!r}, dirs_exist_ok=True)"
    argv = ["profile", "--out", str(run), "--", sys.executable, "-c", script]
    # was 0: a nightly job went on to analyse a run without rank 1 (its analyze refused it, or, --lenient,
    # named rank 0 the straggler of a run of one)
    assert skewlens_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"skewlens profile: error: rank 1: trace not saved: {saved}/rank-1.et: No space left on device "
        f"(the traces of rank 0 are kept in {run}; skewlens analyze and replay use them without rank 1, and "
        f"`skewlens check {run}` lists what that leaves unmatched)"
    )
    assert (run / "rank-0.et").is_file() and (run / "manifest.json").is_file()


def test_only_a_rank_whose_save_failed_is_named_as_not_saved_not_one_missing_for_another_reason() -> None:
    from skewlens.cli.profile import _not_saved
    from skewlens.profiler.manifest import Manifest, rank_note_key

    crashed = {rank_note_key(1): "exited with code 1 before it saved a trace"}
    full = {rank_note_key(2): "trace not saved: run/rank-2.et: No space left on device"}
    m = Manifest(
        world_size=3, ranks=(0,), missing_ranks=(1, 2), level="collectives", notes={**crashed, **full}
    )
    assert _not_saved(m) == "rank 2: trace not saved: run/rank-2.et: No space left on device"
    assert (
        _not_saved(
            Manifest(world_size=3, ranks=(0, 2), missing_ranks=(1,), level="collectives", notes=crashed)
        )
        is None
    )
