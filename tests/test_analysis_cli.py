"""``skewlens analyze``: tables, pictures, Perfetto JSON, the rich report, and one-line errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.analysis import analyze_run
from skewlens.analysis.render import report
from skewlens.cli import main
from skewlens.profiler.store import load_run
from skewlens.profiler.store.schema import read_table

SC = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=3)


def test_report_names_the_straggler_its_cost_and_cause(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, SC)))
    buf = io.StringIO()
    Console(file=buf, width=120).print(report(result))
    text = buf.getvalue()
    assert "Top stragglers" in text and "Worst collectives" in text and "Step breakdown" in text
    top_row = next(line for line in text.splitlines() if line.startswith("│    2 │"))
    cost_ms = result.stragglers[0].straggler_cost_ns / 1e6
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
    assert {e["ph"] for e in ev if e.get("cat") == "critical_path"} >= {"s", "f"}


def test_missing_run_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    assert not (tmp_path / "out").exists()
