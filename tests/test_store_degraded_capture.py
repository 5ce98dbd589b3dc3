"""What a capture could not record is said where users look: ``skewlens check`` warns of it, and the
notes that ``analyze`` and ``replay`` print repeat it. Before, it was only in ``manifest.json``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skewlens.profiler.manifest import (
    DEGRADED_NOTE_KINDS,
    RankNote,
    degraded_notes,
    rank_note_key,
    read_manifest,
    write_manifest,
)
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

MIB = 1 << 20
OWN = "the program started its own profiler: operators not recorded"
INFO = "3 collective(s) taken from the flight recorder: end from gloo's worker thread where it was seen"


def _run(tmp_path: Path, *, ends: tuple[int, int], notes: dict[str, str] | None = None) -> Path:
    """Two ranks, two steps of a compute node and an all_reduce each; the all_reduces of step 1 last
    ``ends[r]`` ns on rank r (0: recorded without an end)."""
    b = RunBuilder(world_size=2)
    for step in range(2):
        for r in (0, 1):
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=ends[r] if step else 500)
    run = b.write(tmp_path / "run")
    if notes:
        m = read_manifest(run)
        write_manifest(run, dataclasses.replace(m, notes={**m.notes, **notes}))
    return run


def test_collectives_recorded_without_an_end_are_a_warning_and_a_report_note(tmp_path: Path) -> None:
    run = _run(tmp_path, ends=(0, 0))
    report = validate_run(run)
    assert report.ok
    (warn,) = [i for i in report.warnings if i.kind == "no-end"]
    assert warn.message.startswith("2 communication node(s) on ranks 0-1 recorded without an end")
    assert [n for n in run_notes(load_run(run)) if "without an end" in n] == [warn.message]


def test_a_run_whose_collectives_all_have_ends_has_no_such_warning(tmp_path: Path) -> None:
    report = validate_run(_run(tmp_path, ends=(500, 700)))
    assert report.ok and not report.warnings


def test_a_capture_note_that_data_was_not_recorded_is_one_warning_for_the_ranks_it_names(
    tmp_path: Path,
) -> None:
    notes = {"rank 0 operators": OWN, "rank 1 operators": OWN, "rank 0 flight recorder": INFO}
    run = _run(tmp_path, ends=(500, 500), notes=notes)
    report = validate_run(run)
    # said of two ranks, it is on no one rank (check's rank column: not rank 0 alone)
    assert [(i.kind, i.rank, i.message) for i in report.warnings] == [
        ("capture-note", None, f"ranks 0-1: {OWN}")
    ]
    said = run_notes(load_run(run))
    assert f"ranks 0-1: {OWN}" in said
    assert not [n for n in said if INFO in n]  # a note that loses nothing stays in the manifest


def test_the_degraded_kinds_are_read_from_the_keys_a_capture_writes_and_no_other_kind_is() -> None:
    for kind in RankNote:
        said = degraded_notes({rank_note_key(12, kind): "lost", rank_note_key(3): "lost"})
        assert said == ({"lost": [12]} if kind in DEGRADED_NOTE_KINDS else {}), kind
    assert set(RankNote) > DEGRADED_NOTE_KINDS


def test_partial_traces_are_noted_in_rank_order_not_in_the_order_of_their_notes(tmp_path: Path) -> None:
    from skewlens.profiler.manifest import PARTIAL_TRACE_NOTE

    notes = {"rank 10": f"{PARTIAL_TRACE_NOTE} 3", "rank 9": f"{PARTIAL_TRACE_NOTE} 4"}
    said = run_notes(load_run(_run(tmp_path, ends=(500, 500), notes=notes)))
    assert [n.split(":")[0] for n in said if PARTIAL_TRACE_NOTE in n] == ["rank 9", "rank 10"]


def test_a_rank_that_ran_rpc_is_a_warning_of_check_and_a_report_note(tmp_path: Path) -> None:
    from skewlens.profiler.manifest import RPC_NOTE

    # its RPC traffic is in no trace: a slow callee is blamed on its callers, which users must be told
    run = _run(tmp_path, ends=(500, 500), notes={rank_note_key(1, RankNote.RPC): RPC_NOTE})
    report = validate_run(run)
    assert [(i.kind, i.message) for i in report.warnings] == [("capture-note", f"rank 1: {RPC_NOTE}")]
    assert f"rank 1: {RPC_NOTE}" in run_notes(load_run(run))


def test_a_process_that_never_started_rpc_is_not_said_to_have_run_it() -> None:
    from skewlens.profiler.capture.compat import rpc_running

    # this process made no init_rpc: were it said to, every rank's capture would carry that warning
    assert rpc_running() is False


def test_a_run_whose_steps_several_optimizers_stepped_is_a_warning_of_check_and_of_profile_s_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli.profile import print_capture_warnings
    from skewlens.profiler.manifest import STEP_MARKS_NOTE

    # a GAN's two Adams: analyze and replay said which one marked the steps, while check said "OK (0
    # warning(s))" and profile printed nothing of it
    note = (
        "2 optimizers stepped; a step ends at each step() of the first to step (Adam, 7 calls by the end of "
        "the window; others: Adam 6): where a training step calls several, mark steps with the Python API"
    )
    run = _run(tmp_path, ends=(500, 500), notes={STEP_MARKS_NOTE: note})
    assert [(i.kind, i.rank, i.message) for i in validate_run(run).warnings] == [
        ("capture-note", None, f"steps: {note}")
    ]
    assert f"steps: {note}" in run_notes(load_run(run))
    print_capture_warnings(read_manifest(run), run)
    assert capsys.readouterr().err.splitlines() == [f"skewlens profile: warning: steps: {note}"]
