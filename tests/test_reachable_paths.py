"""Paths a user reaches with ordinary input that the fast tier did not run before (branch coverage of
``-m "not slow"``): option checks, config choices, slowdown descriptions, topology files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.cli import main

SC = Scenario(straggler_rank=1, straggler_ns=40 * MS, steps=3)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return build_run(tmp_path, SC)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _topology(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topo.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text", ["- 1\n- 2\n", ""])
def test_calibrate_says_a_topology_file_that_is_not_a_mapping_holds_no_topology_as_the_replay_does(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    # calibrate said 'Cannot merge DictConfig with ListConfig' of a YAML list, where the replay said what a
    # topology file must hold
    topo = _topology(tmp_path, text)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(run_dir), "--out", str(out), "--topology", str(topo)]) == 2
    said = _one_line_error(capsys)
    assert said == (
        f"skewlens calibrate: error: {topo}: holds no topology (a YAML mapping of its settings: name, dims, "
        "placement, ...)"
    )
    assert main(["replay", f"trace={run_dir}", f"out={tmp_path / 'r'}", f"topology={topo}"]) == 2
    assert _one_line_error(capsys) == (
        f"skewlens replay: error: topology={topo}: holds no topology (a YAML mapping of its settings: name, "
        "dims, placement, ...)"
    )
    assert not out.exists()
