"""The README's main command: ``skewlens demo`` runs the whole loop on the bundled example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow


def test_demo_captures_analyses_replays_and_names_the_injected_straggler(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "skewlens", "demo", "--out", str(out), "--steps", "7"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Rank 2 is the top straggler" in proc.stdout
    for f in ("run/manifest.json", "run/rank-3.et", "run/parquet/collectives.parquet"):
        assert (out / f).is_file(), f
    blame = pq.read_table(out / "analysis" / "blame.parquet").to_pylist()
    top = max(blame, key=lambda r: r["straggler_cost_ns"])
    assert top["rank"] == 2 and top["straggler_cost_ns"] > 0
    assert (out / "analysis" / "wait_heatmap.png").stat().st_size > 1000
    assert pq.read_table(out / "replay" / "summary.parquet").num_rows > 0
