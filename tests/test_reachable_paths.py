"""Paths a user reaches with ordinary input that the fast tier did not run before (branch coverage of
``-m "not slow"``): option checks, config choices, slowdown descriptions, topology files."""

from __future__ import annotations

import tarfile
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


@pytest.mark.parametrize(
    ("command", "args", "said"),
    [
        ("analyze", ["--max-simulations", "-1"], "--max-simulations: expected >= 0, got -1"),
        ("analyze", ["--perfetto-max-events", "-1"], "--perfetto-max-events: expected >= 0 (0: all), got -1"),
        ("replay", ["real.capture=x"], "real.capture: expected profiler or self, got 'x'"),
        ("replay", ["real.backend=mpi"], "real.backend: expected auto, gloo or nccl, got 'mpi'"),
        ("replay", ["real.nproc=0"], "real.nproc: must be >= 1, got 0"),
        ("replay", ["real.compute=busy"], "real.compute: expected auto, spin, sleep or share, got 'busy'"),
    ],
)
def test_an_option_or_real_replay_setting_out_of_range_is_one_line_naming_it_and_writes_nothing(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    args: list[str],
    said: str,
) -> None:
    out = tmp_path / "out"
    if command == "analyze":
        argv = ["analyze", str(run_dir), "--out", str(out), *args]
    else:  # the real replay's settings are checked before any process starts
        argv = ["replay", "mode=real", f"trace={run_dir}", f"out={out}", *args, "progress=false"]
    assert main(argv) == 2
    assert _one_line_error(capsys) == f"skewlens {command}: error: {said}"
    assert not out.exists()


def test_analyze_into_an_out_that_is_a_file_is_one_line_and_leaves_the_file_as_it_was(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("mine\n", encoding="utf-8")
    assert main(["analyze", str(run_dir), "--out", str(out)]) == 2
    assert _one_line_error(capsys) == f"skewlens analyze: error: --out {out}: exists and is not a directory"
    assert out.read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("{kind:op,pattern:'aten::mm',factor:2}", "slowdown ops 'aten::mm' x2"),
        ("{kind:network,factor:2,links:[[0,1]]}", "slowdown bandwidth x2 on links 0-1"),
        ("{kind:network,factor:2,nodes:[0]}", "slowdown bandwidth x2 on node 0"),
    ],
)
def test_the_replay_names_an_op_slowdown_and_a_network_slowdown_of_some_links_or_nodes_in_its_last_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, said: str
) -> None:
    out = tmp_path / "out"
    args = ["replay", f"trace={run_dir}", f"out={out}", f"slowdown.entries=[{entry}]", "progress=false"]
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"replayed with transfers as recorded; {said}"


def _topology(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topo.yaml"
    path.write_text(text, encoding="utf-8")
    return path


_TWO_LEVEL = (
    "name: t\nnode_of_rank: [0, 1]\ndims:\n"
    "  - {kind: switch, size: 2, bandwidth_gbps: 10, latency_ns: 5}\n"
    "  - {kind: switch, size: 2, bandwidth_gbps: 10, latency_ns: 5}\n"
)


def test_a_topology_that_places_fewer_ranks_than_the_run_has_names_the_first_rank_left_without_a_node(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = _topology(tmp_path, _TWO_LEVEL)  # node_of_rank lists ranks 0 and 1 of the run's 4
    out = tmp_path / "out"
    assert main(["replay", f"trace={run_dir}", f"out={out}", f"topology={topo}", "comm_mode=model"]) == 2
    assert "topology.node_of_rank: no node given for rank 2: " in _one_line_error(capsys)
    cal = tmp_path / "cal.yaml"
    assert main(["calibrate", str(run_dir), "--out", str(cal), "--topology", str(topo)]) == 2
    assert "topology.node_of_rank: no node given for rank 2: " in _one_line_error(capsys)


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


_NCCL2 = "nccl_2gpu_rank0_kineto.json.gz"
_A2A1 = "a2a_128gpu_sampled_rank1_kineto.json.gz"
_SYNC = "cuda_event_sync_kineto.json.gz"


@pytest.mark.parametrize(
    ("files", "args", "said"),
    [
        ([_NCCL2], ["--rank", "-1"], "--rank -1: expected a rank in 0..1048575"),
        ([_NCCL2], ["--world-size", "0"], "--world-size 0: expected 1..1048576"),
        ([_NCCL2, _A2A1], ["--rank", "3"], "--rank applies to a single Kineto trace, 2 given"),
        (
            [_NCCL2, _A2A1],
            [],
            f"Kineto traces disagree on the world size ({_NCCL2}: 2, {_A2A1}: 128)",
        ),
        ([_SYNC], ["--rank", "7", "--world-size", "4"], "rank 7 ({sync}) is outside world size 4"),
    ],
)
def test_import_refuses_a_rank_or_world_size_that_cannot_be_in_one_line_naming_it(
    shared_traces: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    files: list[str],
    args: list[str],
    said: str,
) -> None:
    out = tmp_path / "run"
    traces = [str(shared_traces / f) for f in files]
    assert main(["import", "--kineto", *traces, *args, "--out", str(out)]) == 2
    expected = said.format(sync=shared_traces / _SYNC)
    assert _one_line_error(capsys) == f"skewlens import: error: {expected}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("notes.tar.gz", "archive holds no .json / .json.gz trace files"),
        ("notes", "directory holds no .json / .json.gz trace files"),
        ("missing.json", "no such file or directory"),
    ],
)
def test_import_of_an_archive_or_directory_without_traces_or_a_missing_path_names_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, said: str
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("not a trace\n", encoding="utf-8")
    with tarfile.open(tmp_path / "notes.tar.gz", "w:gz") as tf:
        tf.add(notes / "readme.txt", arcname="readme.txt")
    out = tmp_path / "run"
    assert main(["import", "--kineto", str(tmp_path / name), "--out", str(out)]) == 2
    assert _one_line_error(capsys) == f"skewlens import: error: {tmp_path / name}: {said}"
    assert not out.exists()


def test_an_empty_rank_file_is_an_error_of_check_and_a_rank_left_out_by_lenient_analyze_naming_the_file(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "rank-1.et").write_bytes(b"")  # a save that never wrote a byte
    said = f"{run_dir / 'rank-1.et'}: empty file, expected a Chakra GlobalMetadata message"
    assert main(["check", str(run_dir)]) == 1
    report = capsys.readouterr().out
    row = next(line for line in report.splitlines() if "corrupt-trace" in line)
    assert [c.strip() for c in row.split("│")[1:4]] == ["error", "corrupt-trace", "1"]
    assert "rank-1.et: empty file, expected a Chakra" in row  # the table wraps the rest
    out = tmp_path / "analysis"
    assert main(["analyze", str(run_dir), "--out", str(out), "--lenient"]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert f"skewlens analyze: warning: rank 1 left out (lenient): {said}" in warnings
    assert (out / "blame.parquet").is_file()


def test_check_of_a_path_whose_folder_does_not_exist_says_it_is_no_run_directory_or_trace_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = tmp_path / "nope" / "x"
    assert main(["check", str(where)]) == 2
    assert _one_line_error(capsys) == f"skewlens check: error: {where}: no such run directory or trace prefix"


def test_a_network_slowdown_link_that_is_not_a_pair_of_ranks_is_one_line_naming_the_item(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    entry = "slowdown.entries=[{kind:network,factor:2},{kind:network,factor:2,links:[[0,1,2]]}]"
    assert main(["replay", f"trace={run_dir}", f"out={out}", entry, "progress=false"]) == 2
    assert _one_line_error(capsys) == (
        "skewlens replay: error: slowdown.entries[1]: links must be pairs of ranks, got ((0, 1, 2),)"
    )
    assert not out.exists()
