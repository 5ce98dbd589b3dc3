"""The replay's and the analyses' timelines as ui.perfetto.dev reads them (:mod:`perfetto_lint`: its JSON
importer's sorting, nesting and flow binding), capped or not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from perfetto_lint import lint
from test_analysis_scenarios import MS, Scenario, build_run
from test_outputs_streaming import _run

from skewlens.analysis import analyze_run
from skewlens.analysis.perfetto import write_perfetto as write_analysis_perfetto
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.outputs import write_perfetto
from skewlens.replay.simulate import simulate

SC = Scenario(straggler_rank=1, straggler_ns=20 * MS, steps=3)


def _named_and_used(doc: dict[str, Any]) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """The (pid, tid) tracks that a thread_name names, and those that hold a slice."""
    ev = doc["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "X"}
    return named, used


def test_the_checker_reports_what_perfetto_drops_or_misdraws(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 1}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "unsorted"}},
        {"ph": "X", "name": "u", "pid": 2, "tid": 1, "ts": 0, "dur": 1},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "t"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "empty"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10},  # partly overlaps a
        {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 0, "dur": 1},  # nests in d only by the sort
        {"ph": "X", "name": "d", "pid": 1, "tid": 2, "ts": 0, "dur": 5},
        {"ph": "s", "name": "fl", "cat": "x", "id": 1, "pid": 1, "tid": 2, "ts": 7},  # d ended at 5
        {"ph": "f", "bp": "e", "name": "fl", "cat": "x", "id": 1, "pid": 1, "tid": 3, "ts": 7},  # no slice
        {"ph": "X", "name": "e", "pid": 1, "tid": 2, "ts": -1, "dur": 0.5},
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert dict(lint(path).counts) == {
        "X partly overlapping its parent (spilled or dropped)": 1,
        "nesting at one ts only by Perfetto's sort (file order reversed)": 1,
        "flow endpoint bound to a slice that ended before it": 1,
        "flow endpoint with no slice on its track (dropped)": 1,
        "flow id without exactly one s and one f": 1,
        "negative ts (dropped)": 1,
        "track without thread_name": 2,
        "named track with no events": 1,
        "process without process_sort_index": 1,
    }


@pytest.mark.parametrize("cap", [0, 5])
def test_the_replay_timeline_passes_the_checker_and_a_capped_one_names_no_empty_track(
    tmp_path: Path, cap: int
) -> None:
    # cap 5: the cut falls inside the first step (setup nodes on the host threads only): the kernel
    # stream's and the communication streams' tracks were named with nothing on them
    run = load_run(_run(tmp_path))
    path = write_perfetto(run, simulate(run), tmp_path / "t.json", max_events=cap)
    assert dict(lint(path).counts) == {}
    named, used = _named_and_used(json.loads(path.read_text()))
    assert named == used
    if cap:
        assert len(used) < len({(r, int(s)) for r, rt in run.ranks.items() for s in np.unique(rt.stream)})


@pytest.mark.parametrize("cap", [0, 2])  # 2: ranks whose host thread the cut leaves empty
def test_the_analysis_timeline_passes_the_checker_and_a_capped_one_names_no_empty_track(
    tmp_path: Path, cap: int
) -> None:
    result = analyze_run(load_run(build_run(tmp_path, SC)), blame=False)
    path = write_analysis_perfetto(result, tmp_path / "t.json", max_events=cap, workers=1)
    assert dict(lint(path).counts) == {}
    named, used = _named_and_used(json.loads(path.read_text()))
    assert named == used


def test_a_zero_length_op_that_ends_where_the_next_starts_is_not_drawn_inside_that_next_op(
    tmp_path: Path,
) -> None:
    # a wait that took no time (a 1F1B stage's c10d::wait on a recv already done), then the backward pass
    # from the same instant: a viewer sorts the slices of one start longest first, so it drew the wait as
    # a part of the backward after it (in a 2-rank 1F1B replay of examples/pipeline.py, 1 such wait)
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("forward", 2 * MS)
        rb.compute("c10d::wait", 0)
        rb.compute("backward", 3 * MS)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS)
    run = load_run(b.write(tmp_path / "run"))
    replay = write_perfetto(run, simulate(run), tmp_path / "t.json")
    analysis = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json", workers=1)
    for path in (replay, analysis):
        assert dict(lint(path).counts) == {}, path.name
        drawn = {
            (e["pid"], e["name"]): (e["tid"], e["ts"], e["dur"])
            for e in json.loads(path.read_text())["traceEvents"]
            if e["ph"] == "X" and e.get("cat") != "critical_path"
        }
        for r in (0, 1):
            wait_tid, wait_ts, wait_dur = drawn[(r, "c10d::wait")]
            bwd_tid, bwd_ts, _ = drawn[(r, "backward")]
            assert (wait_dur, wait_ts) == (0, bwd_ts)
            assert wait_tid != bwd_tid  # beside it, not under it
            assert drawn[(r, "forward")][0] == bwd_tid  # the rest stays on the thread's own track
