"""``skewlens demo``'s analysis step says what its pictures and its Perfetto timeline left out."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from skewlens.analysis.records import BlameRecord
from skewlens.cli.demo import analyse
from skewlens.profiler.manifest import CAPTURE_PARTS_NOTE, read_manifest, write_manifest
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

MS = 1_000_000


def _run(tmp_path: Path, collectives: int) -> Path:
    """Two ranks, one step: each computes 1 ms before each of ``collectives`` all_reduces."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        for i in range(collectives):
            rb.compute("work", 1 * MS, start_ns=i * 3 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=i * 3 * MS + 1 * MS)
    return b.write(tmp_path / "demo run")  # a space: the command the notes name quotes the path


def test_what_the_demos_heatmap_and_timeline_left_out_is_said_on_its_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the demo wrote the heatmap and the timeline without their notes: a demo of many ranks got pictures
    # with columns and events missing, and nothing said so (skewlens analyze said it of the same run)
    run_dir = _run(tmp_path, 401)  # one column more than the heatmap draws
    console = Console(file=io.StringIO(), width=100)
    analyse(run_dir, tmp_path / "analysis", console, perfetto_max_events=100)
    warnings = capsys.readouterr().err.splitlines()
    assert warnings[0] == (
        "skewlens demo: warning: wait_heatmap.png: 400 of 401 collectives / send-recv pairs shown: the 400 "
        "of 401 collective(s) with the most exposed wait; 1 collective(s) left out"
    )
    assert warnings[1].startswith("skewlens demo: warning: trace_critical_path.json: 100 of ")
    assert warnings[1].endswith(
        f"; skewlens analyze '{run_dir}' --out DIR --perfetto-max-events 0 writes all"
    )  # the demo has no such option: the command that has it
    assert len(warnings) == 2


def test_the_demo_warns_of_nothing_left_out_where_its_pictures_show_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    console = Console(file=io.StringIO(), width=100)
    _, written = analyse(_run(tmp_path, 3), tmp_path / "analysis", console)
    assert capsys.readouterr().err == ""
    assert {p.name for p in written} >= {"wait_heatmap.png", "trace_critical_path.json"}


def test_the_demos_timeline_with_perfetto_max_events_0_holds_every_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import skewlens.replay.streaming

    monkeypatch.setattr(skewlens.replay.streaming, "DEFAULT_MAX_EVENTS", 10)  # the run has more
    run_dir = _run(tmp_path, 3)
    analyse(run_dir, tmp_path / "all", Console(file=io.StringIO()), perfetto_max_events=0)
    assert capsys.readouterr().err == ""
    analyse(run_dir, tmp_path / "default", Console(file=io.StringIO()))
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith("skewlens demo: warning: trace_critical_path.json: 10 of ")


def test_the_demo_says_the_runs_notes_before_its_pictures_as_skewlens_analyze_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _run(tmp_path, 3)
    m = read_manifest(run_dir)
    write_manifest(run_dir, dataclasses.replace(m, notes={**m.notes, CAPTURE_PARTS_NOTE: "still capturing"}))
    analyse(run_dir, tmp_path / "analysis", Console(file=io.StringIO()), perfetto_max_events=5)
    notes = capsys.readouterr().err.splitlines()
    assert [n.split(": ")[2] for n in notes] == ["still capturing", "trace_critical_path.json"]


def test_the_demos_verdict_gives_the_cause_as_its_blame_table_shows_it(
    host_gap_blame: Callable[[int, int], BlameRecord],
) -> None:
    # the blame table read "-" for a top rank that cost 9 us in 5 steps, the verdict under it its raw cause
    from skewlens.cli.demo import verdict

    assert verdict(host_gap_blame(9_177, 0), steps=5) == (
        "Rank 1 is the top straggler: it costs 0.002 ms per step (mean simulated step 80.000 ms -> 79.998 ms "
        "had it run like the median rank).\nCause: -"
    )
    assert verdict(host_gap_blame(5 * 45 * MS, 0), steps=5) == (
        "Rank 1 is the top straggler: it costs 45.000 ms per step (mean simulated step 80.000 ms -> "
        "35.000 ms had it run like the median rank).\nCause: host idle/gap +29.6 ms"
    )
