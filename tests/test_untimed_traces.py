"""Chakra traces without timings, as Chakra's generator and ``text2chakra`` write them (no start times;
compute durations at most; communication only by type and size): loaded end to end, replayed with modelled
communication, refused by the analyses and by an as-recorded replay of nothing, one line each."""

from __future__ import annotations

import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from skewlens.analysis.api import analyze_run
from skewlens.analysis.errors import AnalysisError
from skewlens.cli import main as skewlens_main
from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import EtWriter, encode_message
from skewlens.profiler.errors import ManifestError, TraceFormatError
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import run_notes, untimed_ranks
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.calibrate import CalibrationError, calibrate

# one pass of text2chakra's DATA workload of two layers, as its converter writes it: compute nodes with
# duration_micros, collectives with comm_type and comm_size only, data_deps between them, no start times
TEXT2CHAKRA_DATA = [
    # (id, name, type, duration_micros, comm_size, data_deps)
    (0, "COMP_NODE_l0_FWD", NodeType.COMP, 50, 0, []),
    (1, "COMP_NODE_l1_FWD", NodeType.COMP, 30, 0, [0]),
    (2, "COMP_NODE_l1_BWD_WG", NodeType.COMP, 20, 0, [1]),
    (3, "COMM_COLL_NODE_l1_ALLREDUCE", NodeType.COMM_COLL, 0, 4 << 20, [2]),
    (4, "COMP_NODE_l1_BWD_IG", NodeType.COMP, 30, 0, [2]),
    (5, "COMP_NODE_l0_BWD_WG", NodeType.COMP, 40, 0, [4]),
    (6, "COMM_COLL_NODE_l0_ALLREDUCE", NodeType.COMM_COLL, 0, 1 << 20, [5]),
]


def _write(d: Path, prefix: str, nodes: list[tuple[int, str, NodeType, int, int, list[int]]]) -> Path:
    for r in (0, 1):
        with EtWriter(d / f"{prefix}.{r}.et") as w:
            for nid, name, kind, dur_us, size, deps in nodes:
                node = pb.Node(id=nid, name=name, type=int(kind), duration_micros=dur_us, data_deps=deps)
                if kind == NodeType.COMM_COLL:
                    node.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
                    node.attr.add(name="comm_size", int64_val=size)
                w.write(node)
    return d / prefix


@pytest.fixture
def text2chakra(tmp_path: Path) -> Path:
    return _write(tmp_path / "t2c", "dp", TEXT2CHAKRA_DATA)


@pytest.fixture
def generator_allreduce(tmp_path: Path) -> Path:
    """Chakra's generator's ``one_comm_coll_node_allreduce``: one collective, no time at all."""
    return _write(tmp_path / "gen", "ALL_REDUCE", [(0, "ALL_REDUCE", NodeType.COMM_COLL, 0, 65536, [])])


def test_a_trace_without_start_times_lays_its_nodes_end_to_end_in_file_order(text2chakra: Path) -> None:
    run = load_run(text2chakra)
    for rt in run.ranks.values():
        assert rt.start_ns.tolist() == [0, 50_000, 80_000, 100_000, 100_000, 130_000, 170_000]
        assert rt.dur_ns.tolist() == [50_000, 30_000, 20_000, 0, 30_000, 40_000, 0]
    assert untimed_ranks(run) == [0, 1]
    assert "ranks 0-1: no start times in the trace: its nodes were laid end to end" in " ".join(
        run_notes(run)
    )


def test_a_text2chakra_trace_replays_every_compute_node_one_after_the_other_with_modelled_allreduces(
    text2chakra: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # at start 0 every node nested inside the first one: the replay took 50 us, the first node's duration
    out = tmp_path / "as_recorded"
    assert (
        skewlens_main(["replay", f"trace={text2chakra}", f"out={out}", "progress=false", "perfetto=false"])
        == 0
    )
    (row0, row1) = pq.read_table(out / "summary.parquet").to_pylist()
    assert (row0["step_time_ns"], row0["compute_ns"], row1["step_time_ns"]) == (170_000, 170_000, 170_000)
    err = capsys.readouterr().err
    assert "no start times in the trace" in err
    assert "recorded without an end (duration 0; the trace records none)" in err
    assert "manifest's notes" not in err
    out = tmp_path / "model"
    args = ["comm_mode=model", "progress=false", "perfetto=false"]
    assert skewlens_main(["replay", f"trace={text2chakra}", f"out={out}", *args]) == 0
    (row0, _row1) = pq.read_table(out / "summary.parquet").to_pylist()
    assert row0["compute_ns"] == 170_000 and row0["step_time_ns"] > 170_000  # the allreduces cost time


def test_analyze_refuses_a_run_none_of_whose_traces_records_a_start_time(
    text2chakra: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(AnalysisError, match="ranks 0-1 record no start time on any node"):
        analyze_run(load_run(text2chakra))
    line = _analyze_refused(text2chakra, tmp_path, capsys)
    assert line == (
        f"skewlens analyze: error: {text2chakra}: ranks 0-1 record no start time on any node (Chakra's "
        "start_time_micros, skewlens' skl_start_ns): an untimed trace has no skew, waits or step times to "
        f"analyse; replay it with modelled communication instead: skewlens replay trace={text2chakra} "
        "out=OUT comm_mode=model"
    )
    # the command as given, pasted with OUT replaced, runs (before, it had no out=, which replay requires)
    words = shlex.split(line.partition("instead: ")[2])
    args = [f"out={tmp_path / 'model'}" if w == "out=OUT" else w for w in words[2:]]
    assert skewlens_main(["replay", *args, "progress=false", "perfetto=false"]) == 0


def _analyze_refused(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``skewlens analyze RUN`` refuses ``run_dir`` with (exit 2, no output directory)."""
    out = tmp_path / "analysis"
    assert skewlens_main(["analyze", str(run_dir), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert not out.exists()
    return line


def test_analyze_refuses_a_run_where_one_rank_records_no_start_time_beside_ranks_that_do(
    text2chakra: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 0 timed (from 1 s on), rank 1 untimed: analyze set rank 1's layout from 0 against rank 0's
    # measured times, reported each all_reduce's skew as ~1,000 ms ("clocks disagree") and exited 0
    with EtWriter(text2chakra.parent / "dp.0.et") as w:
        start_us = 1_000_000
        for nid, name, kind, dur_us, size, deps in TEXT2CHAKRA_DATA:
            node = pb.Node(id=nid, name=name, type=int(kind), duration_micros=dur_us, data_deps=deps)
            node.start_time_micros = start_us
            start_us += dur_us
            if kind == NodeType.COMM_COLL:
                node.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
                node.attr.add(name="comm_size", int64_val=size)
            w.write(node)
    run = load_run(text2chakra)
    assert untimed_ranks(run) == [1] and run.ranks[0].start_ns[0] == 1_000_000_000
    assert _analyze_refused(text2chakra, tmp_path, capsys).startswith(
        f"skewlens analyze: error: {text2chakra}: rank 1 records no start time on any node (Chakra's "
        "start_time_micros, skewlens' skl_start_ns), unlike rank 0: an untimed trace has no skew"
    )


def test_an_as_recorded_replay_of_a_trace_that_records_no_duration_is_refused_and_a_modelled_one_runs(
    generator_allreduce: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "as_recorded"
    assert skewlens_main(["replay", f"trace={generator_allreduce}", f"out={out}", "progress=false"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "skewlens replay: error: comm_mode=as_recorded: "
        f"no node of {generator_allreduce} (ranks 0-1) records a duration (Chakra's duration_micros, "
        "skewlens' skl_dur_ns)"
    )
    assert line.endswith("use comm_mode=model, which costs the communication from its sizes on the topology")
    assert not out.exists()
    out = tmp_path / "model"
    args = ["comm_mode=model", "progress=false", "perfetto=false"]
    assert skewlens_main(["replay", f"trace={generator_allreduce}", f"out={out}", *args]) == 0
    assert all(r["step_time_ns"] > 0 for r in pq.read_table(out / "summary.parquet").to_pylist())


def test_a_modelled_replay_of_a_trace_with_no_duration_and_no_communication_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Chakra's generator's one_remote_mem_load_node: a MEM_LOAD node with a tensor_size, no time
    run = _write(tmp_path / "gen", "mem", [(0, "MEM_LOAD_NODE", NodeType.MEM_LOAD, 0, 0, [])])
    out = tmp_path / "model"
    assert skewlens_main(["replay", f"trace={run}", f"out={out}", "comm_mode=model", "progress=false"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("and none is communication: nothing in it takes time")
    assert not out.exists()


def test_check_says_the_trace_records_no_end_instead_of_pointing_at_a_manifest_it_lacks(
    generator_allreduce: Path,
) -> None:
    report = validate_run(generator_allreduce)
    (warn,) = [i for i in report.issues if i.kind == "no-end"]
    assert warn.message == (
        "2 communication node(s) on ranks 0-1 recorded without an end (duration 0; the trace records none): "
        "their recorded transfers and waits are missing (replay comm_mode=model costs them from their sizes)"
    )
    assert report.ok


def test_calibrate_on_a_trace_that_times_no_communication_says_so_instead_of_asking_for_a_capture_level(
    text2chakra: Path,
) -> None:
    with pytest.raises(CalibrationError) as e:
        calibrate(load_run(text2chakra))
    assert str(e.value) == (
        f"{text2chakra}: 2 transfers, all 0 ns to calibrate from (Chakra traces from another tool, such as "
        "its generator's or text2chakra's, may time no communication; calibrate from a capture or a "
        "skewlens import of the run)"
    )


def test_a_rank_file_among_several_runs_traces_is_answered_with_its_prefix_not_the_ambiguous_folder(
    text2chakra: Path,
) -> None:
    # Chakra's generator writes every microbenchmark into one folder (ALL_REDUCE.0.et, BARRIER.0.et, ...):
    # the folder it named was refused next, as holding several runs
    _write(text2chakra.parent, "other", TEXT2CHAKRA_DATA[:1])
    with pytest.raises(ManifestError) as e:
        load_run(text2chakra.parent / "dp.0.et")
    assert (
        str(e.value)
        == f"{text2chakra.parent / 'dp.0.et'}: a file, not a run: give its traces' prefix ({text2chakra})"
    )
    assert len(load_run(text2chakra).ranks) == 2


@pytest.mark.parametrize("nodes", [3, 60])  # the per-node decoder's file size, and the vectorised one's
def test_a_trace_from_before_chakras_global_metadata_is_named_as_such_with_what_to_do(
    tmp_path: Path, nodes: int
) -> None:
    # ASTRA-sim's 2023 examples (runs/example/workload/resnet50_DataParallel.<r>.et): nodes from byte 0,
    # no GlobalMetadata; every rank was 'corrupt GlobalMetadata at byte offset 0'
    for r in (0, 1):
        with (tmp_path / f"old.{r}.et").open("wb") as f:
            for i in range(nodes):
                f.write(encode_message(pb.Node(id=i, name="COMP_NODE_conv1_FWD", type=int(NodeType.COMP))))
    with pytest.raises(TraceFormatError) as e:
        load_run(tmp_path / "old")
    hint = (
        "the first message is a node ('COMP_NODE_conv1_FWD'), as Chakra wrote traces before its schema "
        "0.0.4; write a GlobalMetadata message before the nodes (Chakra's encodeMessage(f, "
        "GlobalMetadata(version='0.0.4'))) to load it"
    )
    assert str(e.value) == f"{tmp_path / 'old.0.et'}: no GlobalMetadata at byte offset 0: {hint}"


@pytest.mark.parametrize(
    "first",
    [
        b"\x03\x12\x01\xff",  # field 2 a byte that is neither an attribute nor a name: no message at all
        encode_message(pb.Node(id=0, name="COMP_NODE_conv1_FWD", type=99)),  # a node of no known type
    ],
    ids=["no message", "unknown node type"],
)
def test_a_first_message_that_is_neither_metadata_nor_a_known_node_is_named_corrupt_without_the_hint(
    tmp_path: Path, first: bytes
) -> None:
    for r in (0, 1):
        (tmp_path / f"bad.{r}.et").write_bytes(first)
    with pytest.raises(TraceFormatError) as e:
        load_run(tmp_path / "bad")
    assert str(e.value) == f"{tmp_path / 'bad.0.et'}: corrupt GlobalMetadata at byte offset 0"


def test_a_trace_timed_only_in_nanoseconds_below_a_microsecond_keeps_its_start_times(tmp_path: Path) -> None:
    # skl_start_ns stands where start_time_micros is 0: starts of 100, 400 and 700 ns are recorded times
    for r in (0, 1):
        with EtWriter(tmp_path / f"ns.{r}.et") as w:
            for nid, start in enumerate((100, 400, 700)):
                node = pb.Node(id=nid, name=f"op{nid}", type=int(NodeType.COMP))
                node.attr.add(name="skl_start_ns", int64_val=start)
                node.attr.add(name="skl_dur_ns", int64_val=200)
                w.write(node)
    run = load_run(tmp_path / "ns")
    assert run.ranks[0].start_ns.tolist() == [100, 400, 700]
    assert untimed_ranks(run) == []


def test_a_trace_without_start_times_whose_durations_sum_past_2_62_ns_keeps_its_starts_at_0(
    tmp_path: Path,
) -> None:
    # 4,100 nodes of just under 2^50 ns each: 4.616e18 ns end to end, past the 2^62 ns (4.612e18) a start
    # may have
    big = (1 << 50) // 1000
    nodes = [(i, f"op{i}", NodeType.COMP, big, 0, []) for i in range(4100)]
    run = load_run(_write(tmp_path, "big", nodes))
    rt = run.ranks[0]
    assert not rt.start_ns.any()
    assert rt.dur_ns[0] == big * 1000
    assert any("start_ns kept at 0: its durations sum past 2^62 ns" in n for n in rt.notes)
    assert untimed_ranks(run) == [0, 1]


def test_a_run_timed_or_communicating_on_one_rank_only_is_not_refused_as_taking_no_time(
    tmp_path: Path, generator_allreduce: Path
) -> None:
    import dataclasses

    from test_replay_cli import compose_replay

    from skewlens.replay.driver import check_timed
    from skewlens.replay.errors import ConfigError

    # rank 0: the generator's untimed all_reduce; rank 1: an untimed MEM_LOAD, or the same timed 5 us
    coll = load_run(generator_allreduce)
    mem = load_run(_write(tmp_path / "m", "mem", [(0, "MEM_LOAD_NODE", NodeType.MEM_LOAD, 0, 0, [])]))
    timed = load_run(_write(tmp_path / "t", "mem", [(0, "MEM_LOAD_NODE", NodeType.MEM_LOAD, 5, 0, [])]))
    model = compose_replay(["comm_mode=model"])
    check_timed(dataclasses.replace(coll, ranks={0: coll.ranks[0], 1: mem.ranks[1]}), model)
    as_recorded = compose_replay(["comm_mode=as_recorded"])
    check_timed(dataclasses.replace(mem, ranks={0: mem.ranks[0], 1: timed.ranks[1]}), as_recorded)
    with pytest.raises(ConfigError, match="nothing in it takes time"):  # untimed on both, no communication
        check_timed(mem, model)


def test_a_call_return_in_a_trace_without_start_times_is_not_read_as_one_on_the_nodes_laid_end_to_end(
    tmp_path: Path,
) -> None:
    # the nodes are laid end to end from 0: a return time of the producer's clock says nothing of them
    for r, kind, peer in ((0, NodeType.COMM_SEND, ("comm_dst", 1)), (1, NodeType.COMM_RECV, ("comm_src", 0))):
        with EtWriter(tmp_path / "run" / f"dp.{r}.et") as w:
            w.write(pb.Node(id=0, name="fwd", type=int(NodeType.COMP), duration_micros=50))
            node = pb.Node(id=1, name="p2p", type=int(kind), duration_micros=10, data_deps=[0])
            for name, value in (("comm_size", 4096), peer, ("skl_return_ns", 7_000_000_000)):
                node.attr.add(name=name, int64_val=value)
            w.write(node)
    rt = load_run(tmp_path / "run").ranks[0]
    assert rt.start_ns.tolist() == [0, 50_000]
    assert rt.return_ns is None
