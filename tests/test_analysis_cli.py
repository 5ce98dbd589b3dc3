"""``skewlens analyze``: tables, pictures, Perfetto JSON, the rich report, and one-line errors."""

from __future__ import annotations

import io
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from picture_helpers import assert_read_without_colour_names, drawn_figures
from rich.console import Console
from test_analysis_scenarios import MS, Scenario, build_one_slow_rank, build_run

from skewlens.analysis import analyze_run
from skewlens.analysis.plots import breakdown_bars, wait_heatmap, wait_heatmap_data
from skewlens.analysis.records import BlameRecord
from skewlens.analysis.render import (
    _grown_since,
    breakdown_table,
    critical_path_table,
    print_report,
    report,
    stragglers,
    stragglers_table,
    uneven_cost_note,
    uneven_wait_notes,
    worst_collectives_table,
)
from skewlens.cli import main
from skewlens.pictures import figure_class
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import ms_text, percent_text
from skewlens.profiler.store.schema import read_table
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

SC = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=3)


def test_report_names_the_straggler_its_cost_and_cause(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, SC)))
    buf = io.StringIO()
    print_report(Console(file=buf, width=120), report(result))
    text = buf.getvalue()
    assert "Top stragglers" in text and "Worst collectives" in text and "Step breakdown" in text
    top_row = next(line for line in text.splitlines() if line.startswith("│    2 │"))
    cost_ms = result.stragglers[0].straggler_cost_ns / SC.steps / 1e6
    assert f"{cost_ms:,.2f}" in top_row
    assert "aten::mm" in top_row


def test_analyze_writes_tables_pictures_and_a_perfetto_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = build_run(tmp_path, SC)
    out = tmp_path / "out"
    assert main(["analyze", str(run_dir), "--out", str(out)]) == 0
    assert "Top stragglers" in capsys.readouterr().out
    blame = read_table(out / "blame.parquet").to_pylist()
    assert blame[0]["rank"] == SC.straggler_rank and blame[0]["straggler_cost_ns"] > 0
    skew = read_table(out / "collective_skew.parquet").to_pylist()
    assert {r["rank"] for r in skew} == set(range(SC.world_size))
    assert read_table(out / "step_breakdown.parquet").num_rows == SC.world_size * SC.steps
    assert read_table(out / "critical_path.parquet").num_rows > 0
    for png in ("wait_heatmap.png", "step_breakdown.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace_critical_path.json").read_text())
    ev = trace["traceEvents"]
    assert any(e["ph"] == "M" and e["args"].get("name") == "critical path" for e in ev)
    cp = [e for e in ev if e.get("cat") == "critical_path" and e["ph"] == "X"]
    assert any(e["name"] == "aten::mm" and e["pid"] == SC.straggler_rank for e in cp)
    # a flow arrow where the path jumps to another rank (none here: it stays on the straggler, the last to
    # arrive at the all_reduce every rank's step ends with)
    path = read_table(out / "critical_path.parquet").to_pylist()
    jumps = sum(1 for a, b in itertools.pairwise(path) if a["step"] == b["step"] and a["rank"] != b["rank"])
    assert sum(1 for e in ev if e.get("cat") == "critical_path" and e["ph"] == "s") == jumps


def test_analyzing_into_a_used_directory_replaces_the_earlier_outputs_and_an_interrupt_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import skewlens.cli.analyze as cli_analyze

    run_dir = build_run(tmp_path, SC)
    out = tmp_path / "out"
    assert main(["analyze", str(run_dir), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["analyze", str(run_dir), "--out", str(out), "--no-blame", "--no-pictures"]) == 0
    # the earlier blame and pictures are not left beside tables they do not belong to; the user's file stays
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["collective_skew.parquet", "step_breakdown.parquet", "critical_path.parquet", "notes.txt"]
    )
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(*_a: object, **_k: object) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_analyze, "breakdown_bars", interrupted)
    assert main(["analyze", str(run_dir), "--out", str(out)]) != 0  # "interrupted"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([run_dir.name, "out"])  # no staging left
    capsys.readouterr()


def test_missing_run_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    assert not (tmp_path / "out").exists()


def test_pictures_without_an_importable_matplotlib_are_a_one_line_error_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib uninstalled or broken (a None in sys.modules makes its import raise ModuleNotFoundError, as
    # an absent package does): analyze printed a 20-line traceback ending "ImportError" and exit code 1
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    run = build_one_slow_rank(tmp_path)
    out = tmp_path / "out"
    assert main(["analyze", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("skewlens analyze: error: cannot draw pictures: matplotlib cannot be imported (")
    assert err[0].endswith("); skewlens needs matplotlib>=3.8 installed beside it")
    assert not out.exists()
    # without pictures it needs no matplotlib
    assert main(["analyze", str(run), "--out", str(out), "--no-pictures"]) == 0
    assert sorted(p.suffix for p in out.iterdir()) == [".parquet"] * 5


def test_a_broken_matplotlib_whose_import_fails_with_a_plain_import_error_is_the_same_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a broken install: the module is there, its name is not (ImportError, not ModuleNotFoundError)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", ModuleType("matplotlib.figure"))
    with pytest.raises(
        SkewlensError, match=r"^cannot draw pictures: matplotlib cannot be imported \(cannot import"
    ):
        figure_class()


def test_an_out_that_is_the_runs_own_directory_is_a_one_line_error_and_writes_nothing_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = build_one_slow_rank(tmp_path)
    files = sorted(p.name for p in run.iterdir())
    assert main(["analyze", str(run), "--out", str(run)]) == 2
    error = (
        f"skewlens analyze: error: --out {run}: is the run's own directory: the analysis' files "
        "would lie among the run's; give another directory, such as one beside it"
    )
    assert capsys.readouterr().err.strip().splitlines() == [error]
    assert sorted(p.name for p in run.iterdir()) == files


WIDE = Scenario(world_size=8, straggler_rank=5, straggler_ns=40 * MS, steps=3)


def _render(renderable: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200).print(renderable)
    return buf.getvalue()


def test_a_breakdown_table_of_more_ranks_than_its_cap_lists_the_least_waiting_and_names_the_rest(
    tmp_path: Path,
) -> None:
    result = analyze_run(load_run(build_run(tmp_path, WIDE)), blame=False)
    per_rank: dict[int, list[int]] = {}
    for b in result.breakdown:
        per_rank.setdefault(b.rank, []).append(b.exposed_wait_ns)
    mean_wait = {r: sum(v) / len(v) for r, v in per_rank.items()}
    least = sorted(sorted(mean_wait, key=lambda r: (mean_wait[r], r))[:3])
    assert WIDE.straggler_rank in least  # the others wait for the straggler
    text = _render(breakdown_table(result, max_ranks=3))
    listed = [int(line.split("│")[1]) for line in text.splitlines() if line.startswith("│")]
    assert listed == least
    caption = " ".join(text.split())
    assert f"{WIDE.world_size} ranks: the 3 that waited least" in caption
    assert f"the other {WIDE.world_size - 3}" in caption and "step_breakdown.parquet" in caption
    uncapped = _render(breakdown_table(result, max_ranks=0))
    assert [int(line.split("│")[1]) for line in uncapped.splitlines() if line.startswith("│")] == sorted(
        mean_wait
    )
    assert "waited least" not in uncapped


def test_a_critical_path_share_table_of_more_ranks_than_its_cap_sums_up_the_others(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, WIDE)), blame=False)
    on_path: dict[int, int] = {}
    for rec in result.critical_path:
        on_path[rec.rank] = on_path.get(rec.rank, 0) + rec.contribution_ns + rec.gap_before_ns
    assert len(on_path) > 1
    top = max(on_path, key=lambda r: on_path[r])
    text = _render(critical_path_table(result, max_ranks=1))
    share_rows = text.split("Critical path by op")[0]
    listed = [int(line.split("│")[1]) for line in share_rows.splitlines() if line.startswith("│")]
    assert listed == [top]
    rest = ms_text(sum(on_path.values()) - on_path[top])
    caption = " ".join(text.split())  # the caption wraps at the table's width
    assert f"{len(on_path)} ranks on the path: the other {len(on_path) - 1} hold {rest} ms" in caption


def test_the_breakdown_picture_of_more_ranks_than_its_cap_draws_only_the_capped_ranks(tmp_path: Path) -> None:
    from PIL import Image

    result = analyze_run(load_run(build_run(tmp_path, WIDE)), blame=False)
    capped = breakdown_bars(result, tmp_path / "capped.png", max_ranks=2)
    every = breakdown_bars(result, tmp_path / "every.png", max_ranks=0)
    with Image.open(capped) as a, Image.open(every) as b:
        assert a.width < b.width  # 0.6 inch a bar: 6 bars fewer


def test_the_wait_heatmap_has_a_cell_for_the_sender_and_the_receiver_of_each_send_recv_pair(
    tmp_path: Path,
) -> None:
    # a pipeline of 2 stages: rank 1's recv waits for rank 0's compute in each step (no collectives)
    b = RunBuilder(2)
    for step in range(2):
        t0 = step * 20 * MS
        r0 = b.rank(0).step(step)
        r0.compute("stage0", 10 * MS, start_ns=t0)
        r0.send(1, 1 << 20, 1 * MS, start_ns=t0 + 10 * MS)
        b.rank(1).step(step).recv(0, 1 << 20, 10 * MS, start_ns=t0 + 1 * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    data = wait_heatmap_data(result)
    assert data.ranks.tolist() == [0, 1]
    # told apart, and named as the worst-collectives table names them (they were "p2p 0->1" both)
    assert data.labels == ["send_recv 0#0 0->1", "send_recv 0#1 0->1"]
    assert data.grid.tolist() == [[0.0, 0.0], [9.0, 9.0]]  # ms, the receiver's wait, as in the skew table
    assert data.note is None
    notes: list[str] = []
    png = wait_heatmap(result, tmp_path / "w.png", on_note=notes.append)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and notes == []


def test_the_wait_heatmap_draws_no_wait_in_the_colour_of_zero_when_no_one_waited(tmp_path: Path) -> None:
    # two ranks that arrive together at every all_reduce: every cell is 0 ms; matplotlib's own scale for a
    # constant grid was -0.1..0.1 ms, which drew them in the middle colour (teal) as if they had waited
    import matplotlib as mpl
    from PIL import Image

    b = RunBuilder(2)
    for r in (0, 1):
        for step in range(3):
            rb = b.rank(r).step(step)
            rb.compute("work", 5 * MS, start_ns=step * 10 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=step * 10 * MS + 5 * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert wait_heatmap_data(result).grid.tolist() == [[0.0] * 3, [0.0] * 3]
    with Image.open(wait_heatmap(result, tmp_path / "w.png")) as im:
        colours = im.convert("RGB").getcolors(1 << 20)
    # the cells are the largest area of one colour that is not the white page
    cell = max((c for c in colours if c[1] != (255, 255, 255)), key=lambda c: c[0])[1]
    zero = tuple(round(255 * v) for v in mpl.colormaps["viridis"](0.0)[:3])
    assert max(abs(a - b) for a, b in zip(cell, zero, strict=True)) <= 1, (cell, zero)


def _rank_0_computing(tmp_path: Path, world_size: int) -> Path:
    """A run whose rank 0 computes 5 ms in step 0, its other ranks without a trace."""
    b = RunBuilder(world_size)
    b.rank(0).step(0).compute("work", 5 * MS)
    return b.write(tmp_path / "run")


def test_the_wait_heatmap_of_a_run_with_untraced_ranks_says_its_waits_are_for_the_traced_peers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one traced rank of 16 (shared/traces' nccl_16gpu_rank0): every member's wait is 0 ms, since no peer
    # it waited for has a trace, and the heatmap drew a row of zeros titled "wait for peers (ms)" as if
    # rank 0 never waited; the same run with rank 1 traced too has rank 0's wait at the all_reduce
    import skewlens.analysis.plots as plots

    titles: list[str] = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path: titles.append(fig.axes[0].get_title()) or path)
    for traced, waits in (((0,), [[0.0]]), ((0, 1), [[2.0], [0.0]])):
        b = RunBuilder(world_size=16)
        for r in traced:
            rb = b.rank(r).step(0)
            rb.compute("work", (3 + 2 * r) * MS, start_ns=0)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 6 * MS - (3 + 2 * r) * MS, start_ns=(3 + 2 * r) * MS)
        result = analyze_run(load_run(b.write(tmp_path / f"run{len(traced)}")), blame=False)
        data = wait_heatmap_data(result)
        assert data.grid.tolist() == waits
        missing = "1-15" if len(traced) == 1 else "2-15"
        assert data.untraced == f"{16 - len(traced)} of 16 ranks have no trace: {missing}"
        wait_heatmap(result, tmp_path / "w.png")
        # no "rank 1 made its peers wait the most": any of the 14 untraced members may have come later
        assert titles.pop().splitlines() == [
            "wait for peers (ms); blank: not a member",
            f"{data.untraced}: waits for traced peers only",
        ]
    b = RunBuilder(world_size=2)  # every rank traced: nothing more said
    for r in (0, 1):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=0)
    result = analyze_run(load_run(b.write(tmp_path / "whole")), blame=False)
    assert wait_heatmap_data(result).untraced is None
    wait_heatmap(result, tmp_path / "w.png")
    assert titles.pop() == "wait for peers (ms); blank: not a member"
    b = RunBuilder(world_size=4)  # ranks untraced but no collective: no waits drawn to qualify
    b.rank(0).step(0).compute("work", MS, start_ns=0)
    result = analyze_run(load_run(b.write(tmp_path / "none")), blame=False)
    assert wait_heatmap_data(result).untraced == "3 of 4 ranks have no trace: 1-3"
    wait_heatmap(result, tmp_path / "w.png")
    assert titles == ["wait for peers (ms); blank: not a member"]


def test_a_run_without_collectives_or_send_recv_gets_a_heatmap_and_a_warning_that_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _rank_0_computing(tmp_path, 1)
    data = wait_heatmap_data(analyze_run(load_run(run_dir), blame=False))
    assert data.grid.shape == (1, 0)
    said = "no collectives or send/recv pairs in this run: no waits for peers to show"
    assert data.note == said
    assert main(["analyze", str(run_dir), "--out", str(tmp_path / "out"), "--no-blame"]) == 0
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [f"skewlens analyze: warning: wait_heatmap.png: {said}"]
    assert "wait_heatmap.png" not in printed.out  # on stderr: a script's > out.txt gets the results only
    assert (tmp_path / "out" / "wait_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Recording:
    """A Progress that records each task and every description it showed, in order."""

    def __init__(self) -> None:
        self.shown: list[str] = []

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        self.shown.append(description)

        def advance(n: int = 1, description: str | None = None) -> None:
            if description is not None:
                self.shown.append(description)

        yield advance


def test_every_stage_of_loading_and_analysing_a_run_shows_on_the_progress_bar(tmp_path: Path) -> None:
    progress = _Recording()
    run = load_validated(build_run(tmp_path, SC), progress=progress)
    analyze_run(run, progress=progress)
    stages = [s.split(":")[0] for s in progress.shown]
    assert list(dict.fromkeys(stages)) == [
        "loading ranks",
        "decoding nodes",
        "loading rank-0.et",
        "loading rank-1.et",
        "loading rank-2.et",
        "loading rank-3.et",
        "checking dependencies",
        "analyses",
        "blame baseline",
        "what-if blame",
    ]
    assert "blame baseline: simulating" in progress.shown and "analyses: critical path" in progress.shown


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_the_stragglers_table_gives_ms_per_step_over_the_steps_it_names_and_no_cause_where_none_was_blamed(
    tmp_path: Path,
) -> None:
    # ops-train-0-slow showed "cost ms" 399.41 for a 40 ms/step straggler: totals over the steps, unlabelled;
    # a rank of cost 0 that caused no wait read "compute grew: aten::add +1.5 ms"
    result = analyze_run(load_run(build_one_slow_rank(tmp_path)))
    text = _render(stragglers_table(result))
    assert text.splitlines()[0].strip() == (
        "Top stragglers, ms per step over 3 steps (what-if: rank runs like the median rank)"
    )
    header = " ".join(text.splitlines()[2].split())
    assert "cost ms / step" in header and "caused wait ms / step" in header
    assert "top cause (ms per event)" in header
    assert _rows(text) == [["1", "40.000", "85.1", "3", "40.000", "compute grew: aten::mm +41.0 ms"]]
    from skewlens.analysis.render import CAUSE_NOTE

    assert CAUSE_NOTE in " ".join(text.split())  # what the cause's amounts are
    no_blame = analyze_run(load_run(build_one_slow_rank(tmp_path / "b")), blame=False)
    assert _rows(_render(stragglers_table(no_blame))) == [
        ["1", "-", "-", "-", "40.000", "compute grew: aten::mm +41.0 ms"]
    ]


def test_a_straggler_whose_cost_is_mostly_one_step_is_named_with_that_step_and_its_median(
    tmp_path: Path,
) -> None:
    # a serving loop with each decode step a step: rank 1 1 ms late in each decode step, 20 ms in the
    # prefill (step 2). Before, the table said only its mean cost per step
    b = RunBuilder(3)
    for r in range(3):
        t = 0
        for s in range(5):
            late = (20 if s == 2 else 1) * MS
            comp = 10 * MS + (late if r == 1 else 0)
            b.rank(r).step(s).compute("aten::mm", comp, start_ns=t)
            arrive = t + 10 * MS + late  # every member waits for rank 1
            b.rank(r).step(s).collective(
                CommType.ALL_REDUCE, 4096, arrive - (t + comp) + MS, start_ns=t + comp
            )
            t = arrive + MS
    result = analyze_run(load_run(b.write(tmp_path / "run")))
    assert result.blame is not None
    costs = {x.step: x.straggler_cost_ns for x in result.blame.step_records if x.rank == 1}
    assert max(costs, key=lambda k: costs[k]) == 2 and costs[2] > 0.2 * sum(costs.values())
    text = " ".join(_render(stragglers_table(result)).split())
    share = round(100 * costs[2] / sum(costs.values()))
    median = sorted(costs.values())[2]
    assert (
        f"rank 1's cost is uneven over its steps: step 2 cost {ms_text(costs[2])} ms, {share}% of it, its "
        f"median step {ms_text(median)} ms; every step is in blame_steps.parquet" in text
    )
    # an even straggler (build_one_slow_rank's: 40 ms in each of 3 steps) gets no such line
    even = analyze_run(load_run(build_one_slow_rank(tmp_path / "even")))
    assert "uneven" not in _render(stragglers_table(even))


def test_a_rank_that_made_its_peers_wait_in_one_step_only_is_named_with_that_step_not_left_as_a_mean(
    tmp_path: Path,
) -> None:
    # 2 ranks, 6 steps of 10 ms compute and an all_reduce; rank 1 idles 60 ms before it in step 3 only (a
    # one-off gc.collect()). Its typical step is its peers', so the what-if costs it nothing, and the
    # table's 'caused wait ms / step' read 10.00 as if it made rank 0 wait every step
    b = RunBuilder(2)
    t = 0
    for s in range(6):
        stall = 60 * MS if s == 3 else 0
        for r in range(2):
            rb = b.rank(r).step(s)
            rb.compute("aten::mm", 10 * MS, start_ns=t)
            arrive = t + 10 * MS + (stall if r == 1 else 0)
            rb.collective(CommType.ALL_REDUCE, 4096, t + 10 * MS + stall + MS - arrive, start_ns=arrive)
        t += 11 * MS + stall
    result = analyze_run(load_run(b.write(tmp_path / "run")))
    text = " ".join(_render(stragglers_table(result)).split())
    assert _rows(_render(stragglers_table(result)))[0][0] == "1"
    assert _rows(_render(stragglers_table(result)))[0][4] == "10.000"  # the mean of its 6 steps
    assert (
        "rank 1's caused wait is uneven over its steps: in step 3 it made its peers wait 60.000 ms, 100% of "
        "it, in its median step 0.000 ms" in text
    )
    assert "rank 0's caused wait" not in text
    # a rank that made its peers wait in every step alike gets no such line
    even = analyze_run(load_run(build_one_slow_rank(tmp_path / "even")))
    assert "caused wait is uneven" not in _render(stragglers_table(even))


def _uneven(costs_ms: list[float], *, simulated: bool = True, other: Sequence[float] = ()) -> str | None:
    """The uneven-cost line of rank 1 whose steps cost ``costs_ms`` (rank 0's ``other``), the job's steps
    10 ms each."""
    steps = [
        SimpleNamespace(rank=r, step=s, straggler_cost_ns=round(c * MS))
        for r, costs in ((0, other), (1, costs_ms))
        for s, c in enumerate(costs)
    ]
    blame = SimpleNamespace(step_records=steps, baseline_step_ns=dict.fromkeys(range(len(costs_ms)), 10 * MS))
    # index: a run in which torch.compile compiled nothing
    result = SimpleNamespace(blame=blame, index=SimpleNamespace(ranks={}))
    return uneven_cost_note(result, SimpleNamespace(rank=1, simulated=simulated))  # type: ignore[arg-type]


def test_a_stragglers_uneven_cost_is_named_only_past_a_fifth_of_its_cost_and_twice_its_median_step() -> None:
    said = "rank 1's cost is uneven over its steps: step {} cost {} ms, {}% of it, its median step {} ms; "
    said += "every step is in blame_steps.parquet"
    assert _uneven([1, 1, 20, 1, 1], other=[0, 0, 0, 0, 100]) == said.format(
        2, "20.000", 83, "1.000"
    )  # its own
    # two equal steps, each a tenth of the cost or more: both, by the what-if's rule (before, the first of
    # them alone: 'step 1 cost 10.000 ms, 43% of it')
    assert _uneven([1, 10, 1, 10, 1]) == said.replace("step {} cost {} ms", "steps {} cost {} ms").format(
        "1 and 3", "10.000 and 10.000", 87, "1.000"
    )  # 20 of 23 ms
    assert _uneven([1] * 8 + [2.5]) == said.format(8, "2.500", 24, "1.000")  # 23.8% of it
    assert _uneven([1] * 16 + [4]) is None  # 20% of its cost, not over
    assert _uneven([1] * 10 + [2.1]) is None  # 17%, though over twice its median
    assert _uneven([1, 1, 2]) is None  # 50%, but twice its median step, not over
    assert _uneven([20, -5]) is None  # two steps (a what-if may gain in one): no median to speak of
    assert _uneven([1, 1, 20, 1, 1], simulated=False) is None  # no what-if: no cost


def test_half_a_stragglers_steps_stalling_alike_are_not_named_as_uneven_against_half_a_stall() -> None:
    # rank 1's 2 DataLoader workers each deliver a slow batch at every other step, so half its steps cost a
    # stall and half nothing. The mean of the two middle steps, half a stall, is no step's cost: one of the
    # three alike read 'step 2 cost 229.1 ms, 37% of it, its median step 83.214 ms' (as measured on 2 gloo
    # ranks, steps 4-9, the DataLoader's workers spawned)
    assert _uneven([166.4, 0, 229.1, 0, 218.6, 0]) is None
    assert _uneven([0, 21, 0, 19]) is None  # 53% of it, over its two middle steps' mean (9.5)
    # a one-off among an even count still is; with it step 4, 6 of its 30 ms, a tenth of it or more, which
    # the what-if's rule names too (before, 'step 5 cost 20.000 ms, 67% of it' alone)
    said = (
        "rank 1's cost is uneven over its steps: steps 4-5 cost 6.000 and 20.000 ms, 87% of it, its median "
    )
    assert (_uneven([1, 1, 1, 1, 6, 20]) or "").startswith(f"{said}step 1.000")


@pytest.mark.parametrize(
    ("costs_ms", "said"),
    [
        # a DataLoader capture: step 9 cost 37.008 ms (59%), step 4 25.2 ms (41%), and the replay under the
        # table takes both away; before, 'step 9 cost 37.008 ms, 59% of it' alone
        ([0, 0, 0, 0, 25.2, 0, 0, 0, 0, 37.008], "steps 4 and 9 cost 25.200 and 37.008 ms, 100% of it"),
        # two equal one-offs; before, the first alone: 'step 4 cost 30.000 ms, 50% of it'
        ([0, 0, 0, 0, 30, 0, 0, 0, 0, 30], "steps 4 and 9 cost 30.000 and 30.000 ms, 100% of it"),
    ],
)
def test_an_uneven_cost_names_every_step_its_what_if_rule_names_not_only_the_costliest(
    costs_ms: list[float], said: str
) -> None:
    assert _uneven(costs_ms) == (
        f"rank 1's cost is uneven over its steps: {said}, its median step 0.000 ms; every step is in "
        "blame_steps.parquet"
    )


def _uneven_wait(waits_ms: list[float], *, step_ms: float = 10) -> list[str]:
    """The uneven-wait lines of rank 1, which made its peers wait ``waits_ms`` in its steps (each
    ``step_ms``)."""
    steps = range(len(waits_ms))
    result = SimpleNamespace(
        blame=SimpleNamespace(baseline_step_ns=dict.fromkeys(steps, round(step_ms * MS))),
        skew=SimpleNamespace(caused_wait_by_step={(1, s): round(w * MS) for s, w in enumerate(waits_ms)}),
    )
    return uneven_wait_notes(result, [1])  # type: ignore[arg-type]


def test_a_caused_wait_half_of_whose_steps_are_alike_is_not_named_as_uneven_against_their_mean() -> None:
    assert _uneven_wait([0, 21, 0, 19]) == []  # 53% of it, but step 3 is as much
    said = (
        "rank 1's caused wait is uneven over its steps: in step 2 it made its peers wait 30.000 ms, 97% of it"
    )
    assert _uneven_wait([0, 0, 30, 1]) == [f"{said}, in its median step 1.000 ms"]  # a figure some step has
    # rank 1's 2 DataLoader workers each deliver a slow batch at every other step (as measured on 2 gloo
    # ranks): the what-if's rule names steps 0, 2 and 4, all of the wait, but the worst, 229.1 ms, is not
    # over twice the median step's, 166.4 ms (the upper of the two middle ones of 6)
    assert _uneven_wait([166.4, 0, 229.1, 0, 218.6, 0]) == []


@pytest.mark.parametrize(
    ("waits_ms", "steps", "each_ms", "share", "median_ms"),
    [
        # a DataLoader slow at every 5th batch (as measured on 2 gloo ranks): steps 4 and 9 hold 40% and 60%
        # of the wait, and the what-if under the line takes both away; before, 'in step 9 it made its peers
        # wait 282.2 ms, 60% of it', as if step 4 were fine
        ([0, 0, 0, 0, 190.3, 0, 0, 0, 0, 282.2], "4 and 9", "190.3 and 282.2", 100, "0.000"),
        # consecutive steps as a run; 2 ms at step 5 is under a tenth of the wait (13.4 ms) and not named:
        # 132 of 134 ms, 99% of it (before, 'in step 6 ... 90.000 ms, 67% of it')
        ([0, 14, 14, 14, 0, 2, 90, 0, 0, 0], "1-3 and 6", "14.000, 14.000, 14.000 and 90.000", 99, "2.000"),
        # two one-offs, 190 and 200 of 390 ms: the worst over half (51%), a line before too
        ([0, 0, 0, 0, 190, 0, 0, 0, 0, 200], "4 and 9", "190.0 and 200.0", 100, "0.000"),
        # two equal one-offs, each exactly half: before, no line, the table reading 40 ms a step as if every
        # step waited, while the what-if named steps 4 and 9
        ([0, 0, 0, 0, 200, 0, 0, 0, 0, 200], "4 and 9", "200.0 and 200.0", 100, "0.000"),
        # three equal one-offs, a third each: before, no line
        ([0, 0, 100, 0, 0, 100, 0, 0, 100, 0], "2, 5 and 8", "100.0, 100.0 and 100.0", 100, "0.000"),
        # a run of two, 120 of 180 ms (67%), each 60 ms a third of it and 6 times the 10 ms median step (the
        # upper of the two middle ones of 8): before, no line
        ([10, 10, 10, 10, 10, 10, 60, 60], "6-7", "60.000 and 60.000", 67, "10.000"),
        # the twice-its-median check is of the worst step (40 ms, 8 times the 5 ms median), not of the least
        # named (9 ms, under twice it): step 3 holds a tenth of the 64 ms or more (6.4), so it is named, and
        # does not silence step 4's one-off; 49 of 64 ms, 77%
        ([5, 5, 5, 9, 40], "3-4", "9.000 and 40.000", 77, "5.000"),
    ],
)
def test_an_uneven_wait_names_the_steps_its_what_if_takes_away_where_they_hold_over_half_of_it(
    waits_ms: list[float], steps: str, each_ms: str, share: int, median_ms: str
) -> None:
    said = f"in steps {steps} it made its peers wait {each_ms} ms, {share}% of it, in its median step"
    assert _uneven_wait(waits_ms) == [f"rank 1's caused wait is uneven over its steps: {said} {median_ms} ms"]


@pytest.mark.parametrize(
    ("waits_ms", "said"),
    [
        # every step held (each a tenth of the wait or more): the what-if names none, the line its worst step
        ([60, 20, 20], "in step 0 it made its peers wait 60.000 ms, 60% of it, in its median step 20.000 ms"),
        # 5 runs, over the what-if's 4: the worst step alone, holding over half (51 of 99 ms); its median
        # step the upper of the two middle ones, 12 ms
        (
            [51, 0, 12, 0, 12, 0, 12, 0, 12, 0],
            "in step 0 it made its peers wait 51.000 ms, 52% of it, in its median step 12.000 ms",
        ),
        # step 1's 0.9 ms is 15% of the wait but under the what-if's floor, a tenth of the 10 ms median step
        (
            [0, 0.9, 0, 5, 0],
            "in step 3 it made its peers wait 5.000 ms, 85% of it, in its median step 0.000 ms",
        ),
    ],
)
def test_an_uneven_wait_whose_what_if_names_no_other_step_names_its_worst_step_alone(
    waits_ms: list[float], said: str
) -> None:
    assert _uneven_wait(waits_ms) == [f"rank 1's caused wait is uneven over its steps: {said}"]


def test_an_uneven_wait_over_consecutive_steps_alone_names_them_as_one_run_of_steps() -> None:
    said = "in steps 1-2 it made its peers wait 20.000 and 40.000 ms, 100% of it, in its median step 0.000 ms"
    assert _uneven_wait([0, 20, 40, 0, 0, 0, 0, 0, 0, 0]) == [
        f"rank 1's caused wait is uneven over its steps: {said}"
    ]


def test_an_uneven_wait_names_no_step_that_exceeds_its_median_step_by_less_than_a_one_offs_least() -> None:
    # rank 1's sub-ms waits of load noise (a collectives-level capture of 2 gloo ranks, its peer checkpointing
    # every 4th step; the job's median step 6.52 ms, a one-off's least 0.652 ms): before, 'in steps 0-3 and
    # 5 ... 1.662, 1.002, 3.520, 1.114 and 0.881 ms, 100% of it, in its median step 0.881 ms', the median step
    # among the steps named as uneven; steps 1 and 3, within 0.652 ms of it, are as typical
    said = "in steps 0 and 2 it made its peers wait 1.662 and 3.520 ms, 63% of it, in its median step 0.881"
    waits = [1.662, 1.002, 3.520, 1.114, 0, 0.881, 0, 0, 0]
    assert _uneven_wait(waits, step_ms=6.52) == [f"rank 1's caused wait is uneven over its steps: {said} ms"]


def test_an_uneven_cost_over_three_steps_or_with_a_named_step_near_its_median_is_named() -> None:
    said = (
        "rank 1's cost is uneven over its steps: {} ms, {}% of it, its median step {} ms; every step is in "
    )
    said += "blame_steps.parquet"
    # 3 steps are enough: 20 of 22 ms
    assert _uneven([1, 1, 20]) == said.format("step 2 cost 20.000", 91, "1.000")
    # the twice-its-median check is of the costliest step (40 ms, 8 times the 5 ms median), not of the least
    # named (9 ms, a tenth of the 64 ms or more): 49 of 64 ms
    assert _uneven([5, 5, 5, 9, 40]) == said.format("steps 3-4 cost 9.000 and 40.000", 77, "5.000")
    # step 1's 0.9 ms is 15% of the cost but under the what-if's floor (a tenth of the 10 ms median step):
    # step 3 alone, 5 of 5.9 ms
    assert _uneven([0, 0.9, 0, 5, 0]) == said.format("step 3 cost 5.000", 85, "0.000")
    # two equal steps holding half of it between them (20 of 40 ms, so the what-if names every step): the
    # first of them alone, a quarter of it
    assert _uneven([1, 1, 10, 1, 1, 1, 1, 10] + [1] * 14) == said.format("step 2 cost 10.000", 25, "1.000")


def test_an_uneven_wait_is_named_only_over_half_of_it_and_over_the_one_off_floor_not_at_them() -> None:
    # every step a tenth of the wait or more (the what-if names none): the worst, 50 of 100 ms, exactly half
    assert _uneven_wait([50, 10, 10, 10, 10, 10]) == []
    # 1 ms, exactly a tenth of the job's 10 ms median step: not over it
    assert _uneven_wait([0, 0, 1]) == []


def test_an_uneven_wait_of_tiny_steps_keeps_the_blamed_floor_of_a_step_and_of_the_what_if() -> None:
    # steps of 20 us: the one-off floor is 2 us, the what-if's 5 us (BLAMED_NS). 12 us over 3 steps is under
    # 5 us a step: no line
    assert _uneven_wait([0, 0, 0.012], step_ms=0.02) == []
    # 4 us at step 1 is 12% of the 34 us but under the what-if's floor: step 2 alone, as the what-if names
    said = "in step 2 it made its peers wait 0.030 ms, 88% of it, in its median step 0.004 ms"
    assert _uneven_wait([0, 0.004, 0.03], step_ms=0.02) == [
        f"rank 1's caused wait is uneven over its steps: {said}"
    ]


def test_an_uneven_wait_leaves_out_a_step_under_the_what_ifs_least_wait_of_blamed_ns() -> None:
    # steps of 20 us: a tenth of one is 2 us, under BLAMED_NS (5 us), the least wait a what-if names a step
    # for; step 1's 4 us (12% of the wait) is named by neither
    said = "in step 3 it made its peers wait 0.030 ms, 88% of it, in its median step 0.000 ms"
    assert _uneven_wait([0, 0.004, 0, 0.030, 0], step_ms=0.02) == [
        f"rank 1's caused wait is uneven over its steps: {said}"
    ]


def test_a_what_ifs_steps_grown_since_before_the_steps_it_compares_begin_at_the_first_of_them() -> None:
    # an event at step 3 whose scope grew from step 0, the blamed steps 2-9: the what-if starts at step 2
    assert _grown_since(((3, 3), (7, 7)), {3: 0, 7: 6}, 2, 9) == ((2, 3), (6, 7))
    # grown from step 2 to the last step: every step, no window
    assert _grown_since(((3, 3), (9, 9)), {3: 0, 9: 4}, 2, 9) == ()


def test_a_later_what_if_run_whose_growth_reaches_past_an_earlier_runs_start_begins_where_it_grew() -> None:
    # events at steps 5 and 8 (subgroups: the step-8 event's window reached back past step 5's sync point),
    # grown from steps 4 and 1: one run from step 1, where the merge in run order kept (4, 8)
    assert _grown_since(((5, 5), (8, 8)), {5: 4, 8: 1}, 0, 9) == ((1, 8),)
    # and one reaching back past two earlier runs swallows both
    assert _grown_since(((3, 3), (5, 5), (8, 8)), {8: 2}, 0, 9) == ((2, 8),)


def test_a_wait_heatmap_whose_every_column_is_hatched_takes_its_scale_from_them(tmp_path: Path) -> None:
    # one all_reduce, rank 0 done (1-3 ms) before rank 1 began (8 ms): the clocks contradict; rank 0 waited
    # its whole 2 ms call. With no meaningful cell the hatched ones set the scale, not the 1 ms of no wait
    b = RunBuilder(2)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=MS)
    b.rank(1).step(0).collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=8 * MS)
    data = wait_heatmap_data(analyze_run(load_run(b.write(tmp_path / "run")), blame=False))
    assert data.clocks_disagree.tolist() == [True]
    assert data.grid.tolist() == [[2.0], [0.0]]
    assert data.top_ms == 2.0


def test_a_cpu_runs_breakdown_table_keeps_its_steps_column(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_one_slow_rank(tmp_path / "run")), blame=False)
    t = breakdown_table(result)
    assert [str(c.header) for c in t.columns] == [
        "rank", "steps", "step", "compute", "wait", "transfer", "overlapped", "idle"
    ]  # fmt: skip
    assert t.title == "Step breakdown per rank (mean ms per step)"


def test_the_stragglers_table_without_the_what_if_lists_the_rank_that_caused_the_most_wait_first(
    tmp_path: Path,
) -> None:
    # 3 ranks, 2 steps: rank 1 computes 10 ms longer than the others in step 0, rank 2 30 ms in step 1; each
    # then makes its two peers wait at the step's all_reduce (rank 1: 20 ms, rank 2: 60 ms in all)
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for s, slow, extra in ((0, 1, 10), (1, 2, 30)):
            took = 5 + (extra if r == slow else 0)
            rb.step(s).compute("aten::mm", took * MS, start_ns=s * 50 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, (5 + extra - took + 1) * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert [row[:5] for row in _rows(_render(stragglers_table(result)))] == [
        ["2", "-", "-", "-", "30.000"],
        ["1", "-", "-", "-", "10.000"],
    ]


def test_the_stragglers_table_without_the_what_if_says_it_ranks_by_the_wait_caused(tmp_path: Path) -> None:
    # --no-blame printed "(what-if: rank runs like the median rank)" and what cost % is a share of, over a
    # table whose costs were all "-"
    from skewlens.analysis.render import CAUSE_NOTE, COST_NOTE

    table = stragglers_table(analyze_run(load_run(build_one_slow_rank(tmp_path)), blame=False))
    assert (
        table.title == "Top stragglers, ms per step over 3 steps (no what-if: ranked by the wait they caused)"
    )
    assert table.caption == CAUSE_NOTE
    assert COST_NOTE not in str(table.caption)


def test_the_worst_collectives_table_says_its_exposed_wait_is_the_sum_over_members(tmp_path: Path) -> None:
    # gpurun: "skew 1.63" beside "exposed wait 50.54" (31 members x 1.63), the sum not said
    result = analyze_run(load_run(build_one_slow_rank(tmp_path, world_size=3)), blame=False)
    text = _render(worst_collectives_table(result))
    assert "exposed wait ms (members' sum)" in text
    assert [row[2:5] for row in _rows(text)] == [["1.0 MiB", "40.000", "80.000"]] * 3


def test_the_worst_collectives_table_names_rank_0_where_it_was_late_and_blamed(tmp_path: Path) -> None:
    # "-" in the blamed column is for a collective blamed on no rank (a member without a trace): rank 0,
    # 29 ms late to the all_reduce rank 1 waits at, is named there as any other rank
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).compute("aten::mm", (30 if r == 0 else 1) * MS, start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, 4096, (1 if r == 0 else 30) * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    text = _render(worst_collectives_table(result))
    assert [(row[5], row[6]) for row in _rows(text)] == [("0", "0")]
    assert "blamed -" not in text


def test_the_worst_collectives_table_says_how_many_it_left_out(tmp_path: Path) -> None:
    # 1,024 ranks, TP8 x DP128: 10 rows of the 20,512 collectives with exposed wait, nothing said of the rest
    result = analyze_run(load_run(build_one_slow_rank(tmp_path, world_size=3)), blame=False)
    text = _render(worst_collectives_table(result, top=2))
    assert len(_rows(text)) == 2
    assert " ".join(text.split("┘", 1)[1].split()) == (
        "2 of the 3 with exposed wait shown; every one is in collective_skew.parquet"
    )


def test_the_worst_collectives_table_names_its_groups_descriptions_and_members_in_group_rank_order(
    tmp_path: Path,
) -> None:
    # groups made with new_group([3, 1], sort_ranks=False, group_desc='tp') and new_group([0, 2]): the table
    # said 'all_reduce 2#0' and 'all_reduce 1#0'; which ranks (in which order) only manifest.json told
    b = RunBuilder(4, {"0": (0, 1, 2, 3), "1": (0, 2), "2": (3, 1)})
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=MS * (1 + r), start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, pg="2" if r in (1, 3) else "1")
    run = b.write(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    for g in manifest["process_groups"]:
        g["desc"] = {"2": "tp", "1": "undefined"}.get(g["name"], g["desc"])
    (run / "manifest.json").write_text(json.dumps(manifest))
    text = _render(worst_collectives_table(analyze_run(load_run(run), blame=False)))
    assert {row[1] for row in _rows(text)} == {"all_reduce 1#0", "all_reduce 2#0"}
    assert " ".join(text.split("┘", 1)[1].split()) == "group 1: ranks 0, 2; group 2: tp, ranks 3, 1"


def test_a_locally_synchronised_groups_hashed_name_is_cut_in_the_label_and_leaves_the_other_columns_room(
    tmp_path: Path,
) -> None:
    # new_group(use_local_synchronization=True) names a group by 40 hex digits: at 80 columns its label
    # 'all_reduce 3722ef32ad8fe7c3370e39700f5dc805571d7206#0' took the table's width and every other column
    # (step, bytes, skew, wait, late, blamed, cause) was drawn empty
    hashed = "3722ef32ad8fe7c3370e39700f5dc805571d7206"
    b = RunBuilder(2, {"0": (0, 1), hashed: (0, 1)})
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=MS * (1 + r), start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4096, MS, pg=hashed)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    out = io.StringIO()
    Console(file=out, width=80).print(worst_collectives_table(result))
    text = out.getvalue()
    assert _rows(text)[0][:7] == ["0", "all_reduce 3722ef32…#0", "4.0", "1.000", "1.000", "1", "1"]
    assert f"group {hashed}: ranks 0, 1" in " ".join(text.split("┘", 1)[1].split())


def test_an_empty_worst_collectives_table_says_why_it_is_empty(tmp_path: Path) -> None:
    # a one-rank import of a 16-GPU job printed the table's header and nothing else
    def caption(ranks: int, comm: bool) -> str:
        b = RunBuilder(world_size=ranks)
        for step in range(2):
            for r in range(ranks):
                rb = b.rank(r).step(step)
                rb.compute("fwd", dur_ns=MS)  # the same on every rank: no one waits
                if comm:
                    rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS // 2)
        result = analyze_run(load_run(b.write(tmp_path / f"{ranks}-{comm}")), blame=False)
        text = _render(worst_collectives_table(result))
        assert _rows(text) == []
        return " ".join(text.split("┘", 1)[1].split())

    assert caption(2, True) == "none: no member of a collective or p2p waited for a peer outside compute"
    assert caption(2, False) == "none: the run has no collective or p2p whose members were all traced"


def test_the_critical_path_tables_have_titles_that_fit_on_one_line(tmp_path: Path) -> None:
    # "Critical path share (all\nsteps)": the title was wider than the three narrow columns
    result = analyze_run(load_run(build_one_slow_rank(tmp_path)), blame=False)
    lines = _render(critical_path_table(result)).splitlines()
    assert [line.strip() for line in lines if line.startswith("Critical path")] == [
        "Critical path by rank",
        "Critical path by op",
    ]
    assert all("ms, all steps" in line for line in lines if line.startswith("┃"))


def test_the_critical_path_share_by_rank_says_it_sums_the_contributions_and_the_gaps_before_them(
    tmp_path: Path,
) -> None:
    # its figures are contribution_ns + gap_before_ns per rank, unsaid: summing critical_path.parquet's
    # contribution_ns gave 220.39 ms where the table said 221.02
    slow_send = Scenario(world_size=2, steps=2, slow_send_rank=0, slow_send_ns=5 * MS)  # idle on the path
    result = analyze_run(load_run(build_run(tmp_path, slow_send)), blame=False)
    by_rank = _render(critical_path_table(result)).split("Critical path by op")[0]
    on_path: dict[int, int] = {}
    for rec in result.critical_path:
        on_path[rec.rank] = on_path.get(rec.rank, 0) + rec.contribution_ns + rec.gap_before_ns
    assert any(rec.gap_before_ns for rec in result.critical_path)
    assert {int(row[0]): row[1] for row in _rows(by_rank)} == {r: ms_text(ns) for r, ns in on_path.items()}
    # one line: under the three narrow columns it was wrapped into three
    (caption,) = by_rank.split("┘", 1)[1].strip().splitlines()
    assert caption.strip() == "ms: contribution_ns + gap_before_ns in critical_path.parquet"


def test_the_critical_path_by_op_says_it_sums_each_names_contributions_and_names_the_gaps_before_them(
    tmp_path: Path,
) -> None:
    # its figures are each name's contribution_ns, the gaps as "(host gap)", unsaid: a name's
    # contribution_ns + gap_before_ns in critical_path.parquet gave gloo:all_reduce 20.57 ms where the table
    # said 20.41
    slow_send = Scenario(world_size=2, steps=2, slow_send_rank=0, slow_send_ns=5 * MS)  # idle on the path
    result = analyze_run(load_run(build_run(tmp_path, slow_send)), blame=False)
    by_op = _render(critical_path_table(result, top_ops=100)).split("Critical path by op")[1]
    on_path: dict[str, int] = {}
    for rec in result.critical_path:
        on_path[rec.name] = on_path.get(rec.name, 0) + rec.contribution_ns
        if rec.gap_before_ns:
            on_path["(host gap)"] = on_path.get("(host gap)", 0) + rec.gap_before_ns
    assert "(host gap)" in on_path
    assert {row[0]: row[1] for row in _rows(by_op)} == {n: ms_text(ns) for n, ns in on_path.items()}
    (caption,) = by_op.split("┘", 1)[1].strip().splitlines()
    assert caption.strip() == "ms: contribution_ns by name, gap_before_ns as (host gap)"


def test_the_critical_path_shares_by_rank_and_by_op_are_both_given_to_one_decimal(tmp_path: Path) -> None:
    # by op "41", by rank "68.8"
    result = analyze_run(load_run(build_one_slow_rank(tmp_path)), blame=False)
    by_rank, by_op = _render(critical_path_table(result)).split("Critical path by op")
    shares = [row[-1] for text in (by_rank, by_op) for row in _rows(text)]
    assert len(shares) > 2 and all(re.fullmatch(r"\d+\.\d", pct) for pct in shares)


def test_the_stragglers_table_leaves_out_ranks_of_no_cost_after_the_first_and_says_where_they_are(
    tmp_path: Path,
) -> None:
    # at 1,024 ranks: the one straggler, then ranks 0-3 at 0.00 and no word of the other 1,019
    result = analyze_run(load_run(build_one_slow_rank(tmp_path)))
    text = _render(stragglers_table(result))
    assert [row[0] for row in _rows(text)] == ["1"]
    assert " ".join(text.split("┘", 1)[1].split()).endswith(
        "1 of 2 ranks cost, or made others wait, 0.005 ms a step or more (those that did not are left out); "
        "every rank is in blame.parquet"
    )


def test_the_stragglers_caption_says_how_many_of_the_ranks_that_cost_anything_it_shows(
    tmp_path: Path,
) -> None:
    # 1,024 ranks, 8-rank TP x 128 DP, two slow ranks: 5 rows under "128 of 1,024 ranks cost, or made others
    # wait, 0.01 ms a step or more (those that did not are left out)", as if the 128 were all shown
    b = RunBuilder(world_size=8)
    for r in range(8):
        for step, slow in enumerate((3, 6)):  # rank 3 late in step 0, rank 6 in step 1
            work = (9 if r == slow else 3) * MS
            rb = b.rank(r).step(step)
            rb.compute("work", work, start_ns=step * 10 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 10 * MS - work, start_ns=step * 10 * MS + work)
    result = analyze_run(load_run(b.write(tmp_path / "run")))
    buf = io.StringIO()
    print_report(Console(file=buf, width=200), stragglers(result, top=1))
    text = buf.getvalue()
    assert [row[0] for row in _rows(text)] == ["3"]
    caption, replays = text.split("┘", 1)[1].split("what-if replays", 1)
    assert " ".join(caption.split()).endswith(
        "1 shown of the 2 of 8 ranks that cost, or made others wait, 0.005 ms a step or more (the first by "
        "cost, then by the wait they caused); every rank is in blame.parquet "
        # its "work" (a scope by its name) took 9 ms, not 3: the replay without it
        "rank 3 made its peers wait for its scope work, which stalled (it took over twice its time on the "
        "median member); what if it were gone: the replay under the table"
    )
    command = (
        f"skewlens replay trace={tmp_path / 'run'} out=OUT "
        "'slowdown.entries=[{kind:op,ranks:[3],first_step:0,last_step:0,factor:0,pattern:\"work\"}]'"
    )
    assert replays.splitlines()[1:] == [command]


def test_the_stragglers_caption_says_what_cost_percent_is_a_share_of(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_one_slow_rank(tmp_path)))
    caption = " ".join(_render(stragglers_table(result)).split("┘", 1)[1].split())
    assert caption.startswith(
        "cost %: of the job's step time replayed unmodified (from the first rank's start, or the previous "
        "step's end, to the last rank's end: longer than one rank's own step where ranks start apart) "
        "top cause:"
    )


def test_long_names_of_one_template_are_cut_so_that_rows_can_be_told_apart() -> None:
    from skewlens.analysis.render import short_names

    # "void at::native::vectorized_elementwise_kernel<4, at::nativ…" on several rows of the kernels table
    stem = "void at::native::vectorized_elementwise_kernel<4, at::native::"
    kernels = [
        f"{stem}{f}<float>, std::array<char*, {n}ul> >(int, at::native::{f}<float>, std::array<char*, {n}ul>)"
        for f, n in (("CUDAFunctor_add", 3), ("FillFunctor", 1))
    ]
    alone = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    assert short_names([*kernels, alone, "aten::mm"]) == [
        "void at::native::vec…native::CUDAFunctor_add<float>, std::a…",
        "void at::native::vec…native::FillFunctor<float>, std::array…",
        "autograd::engine::evaluate_function: to…grad::AccumulateGrad",  # its start and its end
        "aten::mm",
    ]


def test_a_rank_whose_cost_and_caused_wait_show_as_zero_is_shown_no_cause(
    host_gap_blame: Callable[[int, int], BlameRecord],
) -> None:
    # the demo showed rank 1 at "0.00" cost and caused wait with "host idle/gap +29.6 ms" (a cost of 9 us)
    from skewlens.analysis.render import shown_cause

    rec = host_gap_blame

    assert shown_cause(rec(9_177, 0), steps=5) == "-"
    assert shown_cause(rec(25_000, 0), steps=5) == "host idle/gap +29.6 ms"  # 0.01 ms a step
    assert shown_cause(rec(0, 25_000), steps=5) == "host idle/gap +29.6 ms"
    assert shown_cause(rec(-25_000, 0), steps=5) == "host idle/gap +29.6 ms"


def test_the_wait_heatmap_hatches_the_collectives_where_the_clocks_disagree_and_says_why(
    tmp_path: Path, shared_traces: Path
) -> None:
    # the 128-GPU sampled pair: at all_to_all 0#1 rank 0 is recorded done 46.5 ms before rank 1 began, so
    # its 62.8 ms wait is not meaningful (the report's clock note), yet the heatmap drew it as the run's
    # worst wait with nothing to tell it apart
    from PIL import Image

    from skewlens.profiler.importers import import_traces
    from skewlens.replay.driver import load_trace
    from skewlens.replay.execution import clock_note

    pair = [shared_traces / f"a2a_128gpu_sampled_rank{r}_kineto.json.gz" for r in (0, 1)]
    import_traces(pair, None, tmp_path / "run")
    run = load_trace(tmp_path / "run", lenient=True)
    result = analyze_run(run, blame=False)
    data = wait_heatmap_data(result)
    hatched = [label for label, bad in zip(data.labels, data.clocks_disagree.tolist(), strict=True) if bad]
    assert hatched == ["all_to_all 0#0", "all_to_all 0#1"]
    assert data.grid[0, data.labels.index("all_to_all 0#1")] == pytest.approx(62.783, abs=1e-3)
    assert f"clocks disagree: {len(hatched)} of " in (clock_note(run) or "")  # the report's count
    with Image.open(wait_heatmap(result, tmp_path / "w.png")) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    red = (rgb[..., 0] > 200) & (rgb[..., 1] < 80) & (rgb[..., 2] < 80)  # the hatching (viridis has no red)
    cols = np.flatnonzero(red.any(axis=0))
    assert red.sum() > 500
    # only over the first two of the seven columns: the left 2/7 of the cells' span
    assert cols.max() - cols.min() < (rgb.shape[1] * 0.5) * 2 / 7 + 20


def test_the_wait_heatmap_takes_its_colour_scale_from_the_cells_not_hatched(
    tmp_path: Path, shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the 128-GPU sampled pair: the hatched 62.8 ms at all_to_all 0#1 (clocks contradicted, not meaningful)
    # set the scale's top, and every meaningful cell (at most rank 1's 39.6 ms at all_to_all 0#5) was drawn
    # paler than it is
    from matplotlib.figure import Figure

    import skewlens.analysis.plots as plots
    from skewlens.profiler.importers import import_traces
    from skewlens.replay.driver import load_trace

    pair = [shared_traces / f"a2a_128gpu_sampled_rank{r}_kineto.json.gz" for r in (0, 1)]
    import_traces(pair, None, tmp_path / "run")
    result = analyze_run(load_trace(tmp_path / "run", lenient=True), blame=False)
    data = wait_heatmap_data(result)
    assert data.clocks_disagree.tolist() == [True, True, False, False, False, False, False]
    a2a5 = data.labels.index("all_to_all 0#5")
    assert data.top_ms == pytest.approx(39.630, abs=1e-3) == data.grid[1, a2a5]
    shade = data.shade()
    assert shade[1, a2a5] == 1.0
    assert shade[0, data.labels.index("all_to_all 0#1")] == 1.0  # 62.8 ms: clipped at the top colour
    assert shade[0, data.labels.index("all_reduce 0#8")] == pytest.approx((22.328 / 39.630) ** 0.5, abs=1e-3)
    drawn: list[Figure] = []
    save = plots.save_png
    monkeypatch.setattr(plots, "save_png", lambda fig, path: (drawn.append(fig), save(fig, path))[1])
    wait_heatmap(result, tmp_path / "w.png")
    (image,) = drawn[0].axes[0].images
    assert (image.norm.vmin, image.norm.vmax) == (0.0, pytest.approx(39.630, abs=1e-3))
    assert float(image.norm(62.783)) == 1.0  # drawn in the top colour, not beyond the colour map


def test_a_cut_wait_heatmap_keeps_every_collective_before_the_pairs_and_says_what_it_left_out(
    tmp_path: Path,
) -> None:
    # 1,024 ranks: 400 of 1,062 columns, nearly all of them two-member pairs (a dot each), because a pair's
    # receiver waited longer than an all_reduce's members put together
    b = RunBuilder(4)
    for step in range(4):
        t0 = step * 20 * MS
        b.rank(0).step(step).compute("mm", (1 + step) * MS, start_ns=t0)
        b.rank(0).send(1, 1024, MS // 10, start_ns=t0 + (1 + step) * MS)
        b.rank(1).step(step).recv(0, 1024, (1 + step) * MS + MS // 10, start_ns=t0)
        for r in range(4):
            late = MS // 10 if r == 3 else 0
            b.rank(r).step(step).collective(
                CommType.ALL_REDUCE, 1024, MS // 10 + MS // 10 - late, start_ns=t0 + 10 * MS + late
            )
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert [e.total_exposed_wait_ns for e in result.skew.events][:2] == [1 * MS, 3 * MS // 10]
    data = wait_heatmap_data(result, max_columns=6)
    assert data.labels == [  # still in order of last arrival
        "all_reduce 0#0",
        "all_reduce 0#1",
        "send_recv 0#2 0->1",
        "all_reduce 0#2",
        "send_recv 0#3 0->1",
        "all_reduce 0#3",
    ]
    assert data.note == (
        "6 of 8 collectives / send-recv pairs shown: all 4 collective(s) and the 2 of 4 send/recv pair(s) "
        "with the most exposed wait; 2 pair(s) left out"
    )


def test_what_the_analysis_left_out_is_a_warning_on_stderr_and_stdout_holds_the_report_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 'only the traced ranks are used' was a line on stdout under the tables, in a script's > out.txt
    run_dir = _rank_0_computing(tmp_path, 2)
    assert main(["analyze", str(run_dir), "--out", str(tmp_path / "out"), "--no-pictures", "--no-blame"]) == 0
    printed = capsys.readouterr()
    said = ["skewlens analyze: warning: rank 1 of 2 has no trace: only the traced ranks are used"]
    assert printed.err.splitlines() == said
    assert "no trace" not in printed.out
    assert printed.out.splitlines()[-1] == f"wrote 3 files to {tmp_path / 'out'}"


def test_drawing_where_home_cannot_be_written_prints_nothing_of_matplotlibs_own(tmp_path: Path) -> None:
    # a CI container's HOME: matplotlib's import printed "mkdir -p failed for path .../.config/matplotlib"
    # and "Matplotlib created a temporary cache directory ..." on stderr, among the command's warnings
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.write_text("")  # a file: no directory can be made under it, by root either
    env = {
        k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")
    }
    code = "from skewlens.pictures import figure_class; figure_class()().savefig(__import__('io').BytesIO())"
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "HOME": str(home)},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (p.returncode, p.stderr) == (0, "")


def test_the_wait_heatmap_labels_the_row_of_the_rank_most_wait_is_blamed_on_among_its_spaced_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # of 128 ranks every third row was labelled (0, 3, ..., 126), and the straggler's, 77, was not
    import skewlens.analysis.plots as plots

    drawn: list[list[str]] = []

    def labels(fig: Any, path: Path) -> Path:
        drawn.append([t.get_text() for t in fig.axes[0].get_yticklabels()])
        return path

    monkeypatch.setattr(plots, "save_png", labels)
    b = RunBuilder(world_size=128)
    for r in range(128):
        work = (9 if r == 77 else 3) * MS
        rb = b.rank(r).step(0)
        rb.compute("work", work, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 10 * MS - work, start_ns=work)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert max(result.skew.caused_wait_ns, key=lambda r: result.skew.caused_wait_ns[r]) == 77
    data = wait_heatmap_data(result)
    spaced = list(range(0, 128, 3))
    assert data.labelled_rows == tuple(sorted({*spaced, 77} - {78}))  # 78 is too near 77 to label too
    wait_heatmap(result, tmp_path / "w.png")
    assert drawn.pop() == [str(k) for k in data.labelled_rows]


def test_sizes_read_in_the_largest_binary_unit_they_reach() -> None:
    from skewlens.analysis.render import size_text

    assert [size_text(n) for n in (0, 1023, 1024, 1536 << 10, (1 << 30) - 1, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 MiB",
        "1,024.0 MiB",
        "3.0 GiB",
    ]


def test_the_heatmap_labels_the_row_of_the_rank_blamed_most_not_least_and_of_equals_the_lowest() -> None:
    from skewlens.analysis.plots import _labelled_rows

    ranks = np.arange(128, dtype=np.int64)
    spaced = set(range(0, 128, 3))
    # rank 77 is blamed for 9 ms, rank 40 for 1 ms: 77's row is labelled (78 too near it), 40 is not
    assert _labelled_rows(ranks, {40: 1_000_000, 77: 9_000_000}) == tuple(sorted({*spaced, 77} - {78}))
    # of two blamed alike, the lower rank's row: 40's (39 too near it to label too)
    assert _labelled_rows(ranks, {77: 5_000_000, 40: 5_000_000}) == tuple(sorted({*spaced, 40} - {39}))


def test_the_heatmap_labels_only_the_spaced_rows_where_no_rank_is_blamed_for_any_wait() -> None:
    from skewlens.analysis.plots import _labelled_rows

    # ranks present with 0 ns blamed are no straggler: rank 77's row is not singled out
    ranks = np.arange(128, dtype=np.int64)
    assert _labelled_rows(ranks, {77: 0, 5: 0}) == tuple(range(0, 128, 3))


def test_a_spaced_label_exactly_half_their_spacing_from_the_blamed_rows_label_is_kept() -> None:
    from skewlens.analysis.plots import _labelled_rows

    # 160 ranks: every fourth row labelled; rank 2's, blamed, lies 2 rows (half the spacing) from 0 and 4
    ranks = np.arange(160, dtype=np.int64)
    assert _labelled_rows(ranks, {2: 1_000_000}) == tuple(sorted({*range(0, 160, 4), 2}))
    # rank 3's lies 1 row from 4 (left out) and 3 from 0 (kept)
    assert _labelled_rows(ranks, {3: 1_000_000}) == tuple(sorted({*range(0, 160, 4), 3} - {4}))


def test_the_wait_heatmap_draws_a_slow_ranks_tensor_parallel_peers_apart_from_it_beside_larger_waits(
    tmp_path: Path,
) -> None:
    # 1,024 ranks, 8-rank TP groups x 128 DP, rank 517 1.5x slow: its TP peers waited 0.26 ms a layer for
    # it, 2.5% of the 10.2 ms DP waits that topped a linear scale; 368 of 400 columns were drawn in the
    # colour of no wait and 517 could not be told from its peers. Here: 2-rank TP groups x 8 DP, rank 5.
    tp, world, layers = 2, 16, 40
    groups = {"0": tuple(range(world))}
    groups |= {f"tp{g}": tuple(range(g * tp, (g + 1) * tp)) for g in range(world // tp)}
    groups |= {f"dp{j}": tuple(range(j, world, tp)) for j in range(tp)}
    b = RunBuilder(world_size=world, groups=groups)
    work = [(15 if r == 5 else 10) * MS // 10 for r in range(world)]  # rank 5: 1.5 ms a layer, others 1
    end = 0
    for r in range(world):
        rb = b.rank(r).step(0)
        t = 0
        for _ in range(layers):
            rb.compute("aten::mm", work[r], start_ns=t)
            done = max(t + work[p] for p in groups[f"tp{r // tp}"]) + MS // 10
            rb.collective(
                CommType.ALL_REDUCE, 1 << 20, done - t - work[r], start_ns=t + work[r], pg=f"tp{r // tp}"
            )
            t = done
        end = max(end, t)
    assert end == layers * (15 * MS // 10 + MS // 10)
    for r in range(world):  # the DP all_reduce: every DP group waits for TP group 2 (40 layers x 0.5 ms)
        t = layers * ((15 if r in (4, 5) else 10) * MS // 10 + MS // 10)
        b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, end + MS - t, start_ns=t, pg=f"dp{r % tp}")
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    data = wait_heatmap_data(result)
    assert data.top_ms == pytest.approx(20.0)  # the DP waits: 40 layers x 0.5 ms
    tp2 = [j for j, label in enumerate(data.labels) if label.startswith("all_reduce tp2#")]
    assert len(tp2) == layers
    shade = data.shade()
    assert data.grid[4, tp2].tolist() == pytest.approx([0.5] * layers)  # rank 4 waits 0.5 ms for rank 5
    assert data.grid[5, tp2].tolist() == [0.0] * layers
    # 2.5% of the scale, drawn 16% of the way up its colours (on a linear scale 2.5%: as no wait)
    assert shade[4, tp2].tolist() == pytest.approx([0.025**0.5] * layers)
    assert shade[5, tp2].tolist() == [0.0] * layers


def test_the_worst_collectives_bytes_are_the_largest_members_and_each_record_keeps_its_own(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.api import skew_table

    # an uneven all_to_all of 3 ranks: rank 1 sends 3 KiB, ranks 0 and 2 1 KiB and 2 KiB, rank 2 arriving
    # 5 ms late; the table gives the largest member's call (not the first's or the smallest's), the records
    # and the table analyze writes each member's own
    sizes = {0: 1024, 1: 3072, 2: 2048}
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r).step(0)
        rb.compute("fwd", dur_ns=MS if r < 2 else 6 * MS, start_ns=0)
        rb.collective(CommType.ALL_TO_ALL, comm_bytes=sizes[r], dur_ns=6 * MS if r < 2 else MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    rows = _rows(_render(worst_collectives_table(result)))
    assert [row[2] for row in rows] == ["3.0 KiB"]
    got = sorted((rec.rank, rec.comm_bytes) for rec in result.skew.records())
    assert got == sorted(sizes.items())
    table = skew_table(result.skew).to_pydict()
    assert sorted(zip(table["rank"], table["comm_bytes"], strict=True)) == got


def _set_up_then_steps(path: Path, steps: int = 4) -> Path:
    """2 ranks: a set-up all_reduce before the first step that rank 1 reaches 50 ms late, then ``steps``
    steps in each of which rank 1 computes 10 ms longer before the step's all_reduce."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r)
        late = 50 * MS if r == 1 else 0
        rb.compute("setup", 10 * MS + late, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 4, 61 * MS - (10 * MS + late), start_ns=10 * MS + late)
        for s in range(steps):
            rb.step(s)
            t0 = 100 * MS + s * 40 * MS
            grown = 10 * MS if r == 1 else 0
            rb.compute("aten::mm", 20 * MS + grown, start_ns=t0)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 11 * MS - grown, start_ns=t0 + 20 * MS + grown)
            rb.compute("aten::add", 2 * MS)
    return b.write(path)


@pytest.mark.parametrize("blame", [True, False])
def test_the_wait_a_rank_caused_per_step_leaves_out_the_waits_before_the_first_step(
    tmp_path: Path, blame: bool
) -> None:
    # the set-up all_reduce's 50 ms wait was counted in the caused wait and divided by the 4 steps: 22.50 ms a
    # step beside rank 0's 10.00 ms of wait a step in the breakdown and a cost of 10.00
    result = analyze_run(load_run(_set_up_then_steps(tmp_path / "run")), blame=blame)
    assert {e.step: int(e.total_exposed_wait_ns) for e in result.skew.events} == {
        -1: 50 * MS,
        **dict.fromkeys(range(4), 10 * MS),
    }
    text = _render(stragglers_table(result))
    row = next(line for line in text.splitlines() if line.startswith("│    1 │"))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[4] == "10.000"  # caused wait ms / step
    assert cells[1] == ("10.000" if blame else "-")
    # and its cause is of the same steps: it read 'compute grew: setup +50.0 ms, aten::mm +10.0 ms'
    assert cells[5] == "compute grew: aten::mm +10.0 ms"
    if blame:
        assert result.stragglers[0].caused_wait_ns == 4 * 10 * MS
        assert result.stragglers[0].cause_op == "aten::mm"


def test_the_breakdown_picture_is_read_without_telling_red_from_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # seaborn's orange and red (exposed wait, exposed transfer) were 21 apart to a deuteranope, and the
    # legend listed the parts top to bottom in the order they were drawn, bottom to top
    drawn = drawn_figures(monkeypatch)
    breakdown_bars(analyze_run(load_run(build_run(tmp_path, WIDE)), blame=False), tmp_path / "b.png")
    assert_read_without_colour_names(drawn[0], ["compute", "exposed wait", "exposed transfer", "idle"])


def test_the_breakdown_picture_leaves_room_above_its_tallest_bar_when_no_rank_idled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 ranks, one step of compute (2 ms; rank 1 5 ms) then an all_reduce to 5.3 ms: no idle on either, and
    # the empty idle bars at the stacks' tops held matplotlib's autoscale there: the axis ended at 5.3 ms,
    # the bars' tops on its frame, as if cut off
    b = RunBuilder(2)
    for r in (0, 1):
        c = (2 + 3 * r) * MS
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", c, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=53 * MS // 10 - c)
    drawn = drawn_figures(monkeypatch)
    breakdown_bars(analyze_run(load_run(b.write(tmp_path / "run")), blame=False), tmp_path / "b.png")
    ax = drawn[0].axes[0]
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(5.3)
    assert ax.get_ylim() == pytest.approx((0.0, 5.3 * 1.05))


def test_the_wait_heatmap_says_in_words_whom_the_most_wait_is_blamed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it said so only by colours: a dark row (the late rank waits least) among lighter ones
    drawn = drawn_figures(monkeypatch)
    result = analyze_run(load_run(build_one_slow_rank(tmp_path, world_size=3)), blame=False)
    wait_heatmap(result, tmp_path / "w.png")
    title = drawn[0].axes[0].get_title().splitlines()
    steps = len(result.index.steps)
    caused_ns = result.skew.caused_wait_ns[2] / steps
    assert abs(caused_ns / 1e6 - 80) < 1  # the two others wait 40 ms a step each for rank 2
    assert title[1] == f"rank 2 made its peers wait the most: {ms_text(caused_ns)} ms a step"


@pytest.mark.parametrize("late_ms", [33.056228, 0.6, 4_000.0])
def test_the_wait_heatmaps_colour_bar_labels_only_waits_on_it_each_clear_of_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late_ms: float
) -> None:
    # a PPO loop on 2 gloo ranks: rank 0 waited 33.06 ms at most; the bar (1.7 inches tall) was labelled
    # 0, 10, 20, 30 and 40, the 40 past its top and drawn over the 30 (the square-root scale crowds the top)
    drawn = drawn_figures(monkeypatch)
    late_ns = round(late_ms * 1e6)
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        arrive = MS + (late_ns if r == 1 else 0)
        rb.compute("work", arrive, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, late_ns + 2 * MS - arrive, start_ns=arrive)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    wait_heatmap(result, tmp_path / "w.png")
    fig = drawn[0]
    bar = fig.axes[1]
    top = wait_heatmap_data(result).top_ms
    assert abs(top - late_ms) < 1e-3
    ticks = [float(t) for t in bar.get_yticks()]
    assert ticks[0] == 0.0 and len(ticks) >= 2
    assert all(0.0 <= t <= top for t in ticks), (ticks, top)
    # each label at least its own height and half again above the one below it, on the drawn bar
    height_pt = bar.get_position().height * fig.get_figheight() * 72
    size_pt = max(label.get_size() for label in bar.get_yticklabels())
    at = [(t / top) ** 0.5 * height_pt for t in ticks]
    assert min(b - a for a, b in itertools.pairwise(at)) >= 1.5 * size_pt, (ticks, at, size_pt)


def test_the_wait_heatmap_draws_each_cell_in_the_colour_its_shade_gives(tmp_path: Path) -> None:
    # mutation round 13: the picture's own norm (PowerNorm) is apart from HeatmapData.shade, which the tests
    # read; drawn linear, or up to twice the largest wait, it still passed. Rank 0 waits 1 ms at the first
    # all_reduce and 0.25 ms at the second: that cell is drawn half way up the colours, not a quarter
    import matplotlib as mpl
    from PIL import Image

    b = RunBuilder(2)
    for r in (0, 1):
        for step, late in enumerate((MS, MS // 4)):
            rb = b.rank(r).step(step)
            arrive = step * 10 * MS + 2 * MS + (late if r == 1 else 0)
            rb.compute("work", arrive - step * 10 * MS, start_ns=step * 10 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, step * 10 * MS + 4 * MS - arrive, start_ns=arrive)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    data = wait_heatmap_data(result)
    assert data.grid.tolist() == [[1.0, 0.25], [0.0, 0.0]]
    assert data.shade().tolist() == [[1.0, 0.5], [0.0, 0.0]]
    with Image.open(wait_heatmap(result, tmp_path / "w.png")) as im:
        colours = im.convert("RGB").getcolors(1 << 20)
    # the cells' three colours (both 0 ms cells in one) are the largest areas but the white page
    cells = sorted((c for c in colours if c[1] != (255, 255, 255)), key=lambda c: -c[0])[:3]
    for shade in (1.0, 0.5, 0.0):
        want = tuple(round(255 * v) for v in mpl.colormaps["viridis"](shade)[:3])
        assert any(max(abs(a - b) for a, b in zip(rgb, want, strict=True)) <= 1 for _n, rgb in cells), (
            shade,
            cells,
        )


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0.0004, "0.000"),  # to the µs below 100 ms
        (0.5, "0.500"),
        (12.345, "12.345"),
        (1234.5, "1234.5"),  # one decimal below 10,000 ms, no thousands separator
        (123456.7, "123457"),  # none from there, every digit before the point kept
        (99.9996, "100.0"),  # by the magnitude it rounds to: not 100.000
        (9999.96, "10000"),  # not 10000.0
        (-150.0, "-150.0"),  # a what-if cost below zero by its size: not -150.000
        (-12345.6, "-12346"),
    ],
)
def test_a_figure_in_ms_has_its_decimals_by_its_magnitude_and_every_digit_before_the_point(
    ms: float, text: str
) -> None:
    # the analyses' tables printed two decimals whatever the size (168,923.52 for a 169 s step, which an
    # 80-column table folded over three lines): now the replay summary's rule, in every table
    assert ms_text(ms * 1e6) == text


def _folded_figures(text: str) -> list[str]:
    """The table lines of ``text`` that go on with a figure's rest, a row's continuation (its first cell
    blank) with a cell that begins with a digit, a point, a comma, a percent sign or a closing parenthesis:
    a figure folded over two lines (``168,`` / ``923.`` / ``52``, ``(100%`` / ``)``). A table's free-text
    cause column, last, is left out: it folds a word longer than the cell, names and figures alike, rather
    than cut it (``+13895`` / ``.1 ms``)."""
    out = []
    header: list[str] = []
    for line in text.splitlines():
        if line.startswith("┏"):
            header = []
        elif line.startswith("┃"):
            header.append(line.split("┃")[-2])
        cells = line.split("│")[1:-1]
        if "cause" in " ".join(header):
            cells = cells[:-1]
        if cells and not cells[0].strip() and any(re.match(r"[\d.,%)]", c.strip()) for c in cells):
            out.append(line)
    return out


def test_an_80_column_analyze_of_steps_of_minutes_folds_no_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a GPU run of kernels of seconds: steps of 169 s, 10 columns of figures of 10^2-10^5 ms in the step
    # breakdown and the GPU idle table
    from skewlens.profiler.importers import import_traces
    from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run

    spec = GpuRunSpec(
        world_size=4, steps=3, slow_ranks={1: 1.7}, forward_kernel_ns=4_000_000_000,
        backward_kernel_ns=8_000_000_000, optimizer_kernel_ns=1_500_000_000, start_skew_ns=2_000_000_000,
    )  # fmt: skip
    write_gpu_run(spec, tmp_path / "kineto")
    import_traces([tmp_path / "kineto"], None, tmp_path / "run")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["analyze", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--no-pictures"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└") <= 80  # tables (not paths)
    # here: '│    0 │ 168, │ 98,9 │ 69,0 │ 0.9 │ ...' over '│      │ 923. │ 92.4 │ 53.6 │   4 │ ...'
    assert _folded_figures(text) == []
    breakdown = text[text.index("Step breakdown") : text.index("GPU idle per rank")]
    row = next(line for line in breakdown.splitlines() if line.startswith("│    0"))
    figures = [c.strip() for c in row.split("│")[2:-1]]
    assert all(re.fullmatch(r"\d+(\.\d+)?( \(\d+%\))?", f) for f in figures), figures
    assert float(figures[0]) >= 10_000  # the step, whole


@pytest.mark.parametrize(("ns", "text"), [(-3, "0.000"), (-499, "0.000"), (-5_000, "-0.005"), (0, "0.000")])
def test_a_figure_in_ms_that_rounds_to_zero_reads_zero_not_minus_zero(ns: int, text: str) -> None:
    # a what-if cost a few ns below zero read '-0.00' in the stragglers table
    assert ms_text(ns) == text


@pytest.mark.parametrize(
    ("part", "whole", "decimals", "text"),
    [
        (-1, 100_000, 1, "0.0"),
        (-1, 100_000, 0, "0"),
        (-1, 1_000, 1, "-0.1"),
        (5, 0, 1, "0.0"),
        (1, 8, 1, "12.5"),
    ],
)
def test_a_percentage_that_rounds_to_zero_reads_zero_and_one_of_nothing_is_zero(
    part: int, whole: int, decimals: int, text: str
) -> None:
    assert percent_text(part, whole, decimals) == text


def test_a_rank_blamed_1_ms_a_step_beyond_its_cost_half_of_it_uncompared_work_is_noted() -> None:
    from types import SimpleNamespace

    from skewlens.analysis.render import uncompared_notes

    steps, ms = 4, 1_000_000

    def notes(caused_ns: int, alone_ns: int, cost_ns: int = 0) -> list[str]:
        rec = SimpleNamespace(rank=0, caused_wait_ns=caused_ns, straggler_cost_ns=cost_ns)
        blame = SimpleNamespace(baseline_step_ns=dict.fromkeys(range(steps), 10 * ms), records=[rec],
                                uncompared_ns={0: alone_ns})  # fmt: skip
        return uncompared_notes(SimpleNamespace(blame=blame))

    # waits 1 ms a step beyond its cost, half of them its work without a counterpart: said
    (note,) = notes(steps * ms + 3 * ms, steps * ms // 2, cost_ns=3 * ms)
    assert note.startswith(
        f"rank 0 caused {ms_text(7 * ms // 4)} ms of waits a step, but {ms_text(ms // 2)} ms"
    )
    assert notes(steps * ms - 1, steps * ms) == []  # under 1 ms a step beyond its cost
    assert notes(steps * ms, steps * ms // 2 - 1) == []  # under half of it without a counterpart


@pytest.mark.parametrize("blame", [True, False])
def test_the_wait_heatmaps_title_gives_the_same_wait_a_step_as_the_stragglers_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blame: bool
) -> None:
    # the title divided every wait blamed on the rank, the set-up all_reduce's 50 ms before the first step
    # too, by the 4 steps: 22.50 ms a step beside the stragglers table's 10.00
    drawn = drawn_figures(monkeypatch)
    result = analyze_run(load_run(_set_up_then_steps(tmp_path / "run")), blame=blame)
    wait_heatmap(result, tmp_path / "w.png")
    title = drawn[0].axes[0].get_title().splitlines()
    assert title[1] == "rank 1 made its peers wait the most: 10.000 ms a step"
    row = next(line for line in _render(stragglers_table(result)).splitlines() if line.startswith("│    1 │"))
    assert [c.strip() for c in row.split("│")[1:-1]][4] == "10.000"


def _cause_cells(renderable: object, width: int) -> list[str]:
    """The last column of each row of the table ``renderable`` as a report console ``width`` wide prints
    it, its lines joined without their spaces (a row starts where its first column is not empty)."""
    from skewlens.console import report_console

    buf = io.StringIO()
    console = report_console()
    console.file, console.width = buf, width
    console.print(renderable)
    rows: list[str] = []
    for line in buf.getvalue().splitlines():
        if line.startswith("│"):
            cells = line.split("│")[1:-1]
            if cells[0].strip():
                rows.append("")
            rows[-1] += "".join(cells[-1].split())
    return rows


@pytest.mark.parametrize("width", [60, 80])
def test_a_narrow_reports_causes_fold_onto_more_lines_and_lose_no_figure_or_name(
    tmp_path: Path, width: int
) -> None:
    # the worst collectives' cause was cut: at 80 columns `compu… grew: aten:… +39.1 ms, Addmm…`, at 60
    # `co… gr… at… +3… ms`, +39.1 ms read as +3 (the demo's run); the demo's blame table cut its causes too
    from skewlens.cli.demo import blame_table

    result = analyze_run(load_run(build_run(tmp_path, SC)))
    for table in (worst_collectives_table, stragglers_table, blame_table):
        whole = _cause_cells(table(result), 400)
        assert any("aten::mm" in cause for cause in whole)
        assert _cause_cells(table(result), width) == whole
