"""``skewlens import`` on the real GPU traces in ../shared/traces (8-rank DLRM, 2-GPU NCCL rank 0).

Expected numbers are computed here from the raw JSON, independently of the importer; a few literal
values were checked by hand against the files and are pinned as well.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
from rich.console import Console

from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.importers import import_traces
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.vocab import Attr, CommType, NodeType
from skewlens.rich_progress import RichProgress

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
DLRM_KINETO = SHARED / "dlrm_8gpu_kineto.tar.gz"
DLRM_HOST = SHARED / "dlrm_8gpu_host_et.tar.gz"
NCCL_2GPU = SHARED / "nccl_2gpu_rank0_kineto.json.gz"
ELEM = {"float": 4, "int": 4, "long int": 8}


def _need_shared() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"real GPU traces not found at {SHARED} (see shared/traces/README.md)")


@pytest.fixture(scope="session")
def raw_dlrm(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The raw Kineto JSON of each DLRM rank, by the rank in its distributedInfo."""
    _need_shared()
    d = tmp_path_factory.mktemp("raw")
    with tarfile.open(DLRM_KINETO) as tf:
        tf.extractall(d, filter="data")
    docs = [json.loads(p.read_text()) for p in sorted(d.rglob("*.json"))]
    return {doc["distributedInfo"]["rank"]: doc for doc in docs}


@pytest.fixture(scope="session")
def raw_2gpu() -> dict[str, Any]:
    _need_shared()
    with gzip.open(NCCL_2GPU) as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def dlrm_run(dlrm_imported: Path) -> Path:
    return dlrm_imported


@pytest.fixture(scope="session")
def dlrm_run_kineto_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_shared()
    out = tmp_path_factory.mktemp("imp") / "dlrm_k"
    import_traces([DLRM_KINETO], None, out)
    return out


@pytest.fixture(scope="session")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_shared()
    out = tmp_path_factory.mktemp("imp") / "nccl"
    import_traces([NCCL_2GPU], None, out)
    return out


def _nccl_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
        key=lambda e: e["ts"],
    )


def _annotations(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"] == name),
        key=lambda e: e["ts"],
    )


def _colls(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    nodes = read_et(run_dir / f"rank-{rank}.et").nodes
    colls = [node_attrs(n) | {"name": n.name} for n in nodes if n.type == NodeType.COMM_COLL]
    return sorted(colls, key=lambda a: a[Attr.SEQ])


def test_dlrm_manifest_lists_all_eight_ranks_of_an_eight_rank_job(dlrm_run: Path) -> None:
    m = read_manifest(dlrm_run)
    assert (m.world_size, m.ranks, m.missing_ranks, m.source) == (8, tuple(range(8)), (), "import")
    assert [g.name for g in m.process_groups] == ["0"]
    assert m.process_groups[0].ranks == tuple(range(8))
    assert m.devices == {r: f"cuda:{r}" for r in range(8)}
    assert "paired by pid" in m.notes["import"]


def test_every_dlrm_collective_matches_across_all_eight_ranks(
    dlrm_run: Path, raw_dlrm: dict[int, dict[str, Any]]
) -> None:
    run = load_run(dlrm_run)
    kernels_per_rank = {r: len(_nccl_kernels(doc)) for r, doc in raw_dlrm.items()}
    assert len(set(kernels_per_rank.values())) == 1
    assert len(run.collectives) == kernels_per_rank[0] > 0
    for inst in run.collectives:
        assert inst.ranks == tuple(range(8))
        assert {int(run.ranks[r].comm_type[row]) for r, row in zip(inst.ranks, inst.rows, strict=True)} == {
            int(inst.comm_type)
        }


def test_rank0_allreduce_count_and_sizes_come_from_the_raw_trace(
    dlrm_run: Path, raw_dlrm: dict[int, dict[str, Any]]
) -> None:
    doc = raw_dlrm[0]
    n_raw = sum(1 for k in _nccl_kernels(doc) if k["name"].startswith("ncclKernel_AllReduce"))
    sizes_raw = [
        math.prod(a["args"]["Input Dims"][0]) * ELEM[a["args"]["Input type"][0]]
        for a in _annotations(doc, "nccl:all_reduce")
    ]
    ours = [a for a in _colls(dlrm_run, 0) if a[Attr.COMM_TYPE] == CommType.ALL_REDUCE]
    assert len(ours) == n_raw == len(sizes_raw) == 3
    assert [a[Attr.COMM_SIZE] for a in ours] == sizes_raw


def test_pinned_dlrm_values_checked_by_hand(dlrm_run: Path) -> None:
    by_seq = {a[Attr.SEQ]: a for a in _colls(dlrm_run, 0)}
    # host ET rank 0: record_param_comms seq 150 is all_to_allv of a 3392-element int tensor
    assert by_seq[150][Attr.OP] == "all_to_allv"
    assert by_seq[150][Attr.COMM_TYPE] == CommType.ALL_TO_ALL
    assert by_seq[150][Attr.COMM_SIZE] == 3392 * 4 == 13568
    # seq 151: the first all_reduce, 394241 floats
    assert by_seq[151][Attr.COMM_SIZE] == 394241 * 4
    assert by_seq[151]["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert sorted(by_seq) == list(range(147, 155))


def test_dlrm_uneven_all_to_all_takes_its_splits_from_the_host_trace(dlrm_run: Path) -> None:
    # host ET: record_param_comms seq 150 (all_to_allv, int32) lists, on every rank, input splits
    # [96, 224, 288, 1664, 592, 96, 192, 240] and output splits of 96 (rank 0) / 1664 (rank 3) per member
    sent = [96 * 4, 224 * 4, 288 * 4, 1664 * 4, 592 * 4, 96 * 4, 192 * 4, 240 * 4]
    for rank, got_each in ((0, 96 * 4), (3, 1664 * 4)):
        a = {x[Attr.SEQ]: x for x in _colls(dlrm_run, rank)}[150]
        assert a[Attr.SEND_SPLITS] == sent
        assert a[Attr.RECV_SPLITS] == [got_each] * 8
        assert (a[Attr.SEND_BYTES], a[Attr.RECV_BYTES]) == (sum(sent) - sent[rank], 7 * got_each)
    even = {x[Attr.SEQ]: x for x in _colls(dlrm_run, 0)}[147]  # 768 floats to and from each: no splits
    assert Attr.SEND_SPLITS not in even


def test_kineto_only_import_counts_seq_from_zero_with_the_same_sizes(
    dlrm_run: Path, dlrm_run_kineto_only: Path
) -> None:
    with_host = _colls(dlrm_run, 3)
    kineto_only = _colls(dlrm_run_kineto_only, 3)
    assert [a[Attr.SEQ] for a in kineto_only] == list(range(len(with_host)))
    assert [(a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) for a in kineto_only] == [
        (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) for a in with_host
    ]
    assert len(load_run(dlrm_run_kineto_only).collectives) == len(with_host)


def test_top_level_cpu_ops_never_overlap_on_a_thread(dlrm_run: Path) -> None:
    run = load_run(dlrm_run, match=False)
    rt = run.ranks[0]
    cpu = np.flatnonzero(rt.is_cpu & (rt.node_type == NodeType.COMP))
    for tid in np.unique(rt.stream[cpu]):
        rows = cpu[rt.stream[cpu] == tid]
        order = np.argsort(rt.start_ns[rows], kind="stable")
        starts, ends = rt.start_ns[rows][order], rt.end_ns[rows][order]
        assert np.all(starts[1:] >= ends[:-1])


def test_gpu_kernels_depend_on_the_cpu_op_that_launched_them(
    dlrm_run: Path, raw_dlrm: dict[int, dict[str, Any]]
) -> None:
    doc = raw_dlrm[0]
    launches = {e["args"]["correlation"]: e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"}
    nodes = read_et(dlrm_run / "rank-0.et").nodes
    by_id = {n.id: n for n in nodes}
    colls = [n for n in nodes if n.type == NodeType.COMM_COLL]
    kernels = {round(k["ts"] * 1000): k for k in _nccl_kernels(doc)}
    for n in colls:
        launch = launches[kernels[node_attrs(n)[Attr.START_NS]]["args"]["correlation"]]
        t = round(launch["ts"] * 1000)
        cpu_parents = [by_id[d] for d in n.ctrl_deps if node_attrs(by_id[d])[Attr.IS_CPU_OP]]
        assert len(cpu_parents) == 1
        a = node_attrs(cpu_parents[0])
        assert a[Attr.START_NS] <= t <= a[Attr.START_NS] + a[Attr.DUR_NS]
        assert a[Attr.STREAM] == launch["tid"]


def test_nodes_carry_the_profiler_step_they_ran_in(
    dlrm_run: Path, raw_dlrm: dict[int, dict[str, Any]]
) -> None:
    (step,) = (e for e in raw_dlrm[2]["traceEvents"] if re.fullmatch(r"ProfilerStep#\d+", e.get("name", "")))
    n = int(step["name"].split("#")[1])
    m = read_manifest(dlrm_run)
    (span,) = (s for s in m.steps if s.rank == 2)
    assert (span.step, span.start_ns) == (n, round(step["ts"] * 1000))
    assert span.end_ns >= round((step["ts"] + step["dur"]) * 1000)
    rt = load_run(dlrm_run, match=False).ranks[2]
    inside = (rt.start_ns >= span.start_ns) & (rt.start_ns <= span.end_ns) & rt.is_cpu
    assert np.all(rt.step[inside] == n)
    assert np.all(rt.step[rt.node_type == NodeType.COMM_COLL] == n)


def test_two_gpu_trace_lists_world_size_two_with_rank_one_missing(nccl_run: Path) -> None:
    m = read_manifest(nccl_run)
    assert (m.world_size, m.ranks, m.missing_ranks) == (2, (0,), (1,))
    (pg,) = m.process_groups
    assert (pg.name, pg.ranks, pg.desc, pg.backend) == ("0", (0, 1), "default_pg", "cuda:nccl")
    assert [s.step for s in m.steps] == [4, 5, 6]
    run = load_run(nccl_run, match=False)
    assert list(run.ranks) == [0]


def test_the_import_summary_gives_each_ranks_steps_as_ranges(nccl_run: Path) -> None:
    import dataclasses

    from skewlens.cli.import_traces import summary_table
    from skewlens.profiler.manifest import StepSpan

    m = read_manifest(nccl_run)
    many = tuple(StepSpan(rank=0, step=s, start_ns=s, end_ns=s + 1) for s in [*range(190), 200, 202, 203])
    buf = io.StringIO()
    Console(file=buf, width=120).print(summary_table(dataclasses.replace(m, steps=many)))
    (row,) = (line for line in buf.getvalue().splitlines() if "cuda" in line)
    assert "0-189, 200, 202-203" in row and "188" not in row


def test_the_import_summary_on_a_narrow_terminal_folds_the_source_file_name_instead_of_cutting_it(
    nccl_run: Path,
) -> None:
    # at 60 columns a file name read `worker0_step_12.16941282…`
    from skewlens.cli.import_traces import summary_table

    buf = io.StringIO()
    Console(file=buf, width=50).print(summary_table(read_manifest(nccl_run)))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in buf.getvalue().splitlines()]
    source = "".join(cells[3] for cells in rows if cells and not cells[3].startswith("(missing"))
    assert source.startswith("nccl_2gpu_rank0_kineto.json.gz")


def test_the_import_summary_of_many_ranks_lists_32_and_counts_the_rest(nccl_run: Path) -> None:
    import dataclasses

    from skewlens.cli.import_traces import summary_table

    m = read_manifest(nccl_run)
    many = dataclasses.replace(
        m, world_size=1024, ranks=tuple(range(1000)), missing_ranks=tuple(range(1000, 1024))
    )
    buf = io.StringIO()
    Console(file=buf, width=160).print(summary_table(many))
    rows = [line for line in buf.getvalue().splitlines() if line.startswith("│")]
    assert len(rows) == 32 + 1  # ranks 0-31, and one row for the 24 without a trace
    assert (
        "1000-1023" in rows[-1]
        and "1,000 ranks: the first 32 listed, 968 more in manifest.json" in buf.getvalue()
    )


def test_two_gpu_collectives_take_type_size_and_group_from_kernel_args(
    nccl_run: Path, raw_2gpu: dict[str, Any]
) -> None:
    kernels = _nccl_kernels(raw_2gpu)
    ours = _colls(nccl_run, 0)
    assert len(ours) == len(kernels) == 21
    assert [a[Attr.SEQ] for a in ours] == list(range(21))
    assert Counter(a[Attr.COMM_TYPE] for a in ours) == Counter(
        {CommType.ALL_REDUCE: sum(k["args"]["Collective name"] == "allreduce" for k in kernels),
         CommType.BROADCAST: sum(k["args"]["Collective name"] == "broadcast" for k in kernels)}
    )  # fmt: skip
    elem = {"Float": 4, "Long": 8}
    assert [a[Attr.COMM_SIZE] for a in ours] == [
        k["args"]["In msg nelems"] * elem[k["args"]["dtype"]] for k in kernels
    ]
    # pinned by hand: the first broadcast moves 53120 floats, the second 53 int64, the first all-reduce
    # 2049000 floats
    assert ours[0][Attr.COMM_SIZE] == 212480
    assert ours[1][Attr.COMM_SIZE] == 424
    assert ours[2][Attr.COMM_SIZE] == 8196000
    assert {a[Attr.PG_NAME] for a in ours} == {"0"}


def test_times_are_integer_ns_on_the_base_time_clock(nccl_run: Path, raw_2gpu: dict[str, Any]) -> None:
    base = raw_2gpu["baseTimeNanoseconds"]
    first = _nccl_kernels(raw_2gpu)[0]
    a = _colls(nccl_run, 0)[0]
    assert a[Attr.START_NS] == base + round(first["ts"] * 1000)
    assert a[Attr.DUR_NS] == round(first["dur"] * 1000)
    assert a[Attr.STREAM] == first["args"]["stream"] and a[Attr.STREAM_KIND] == "cuda"
    assert a[Attr.IS_CPU_OP] is False


def test_chakras_own_reader_decodes_the_imported_files(dlrm_run: Path, nccl_run: Path) -> None:
    for path in (dlrm_run / "rank-5.et", nccl_run / "rank-0.et"):
        fh = openFileRd(str(path))
        gm = GlobalMetadata()
        assert decodeMessage(fh, gm)
        node = Node()
        count = colls = 0
        while decodeMessage(fh, node):
            count += 1
            colls += node.type == NodeType.COMM_COLL
        fh.close()
        assert count == len(read_et(path).nodes) > 100
        assert colls == len(_colls(path.parent, int(path.stem.split("-")[1])))


def test_cli_imports_a_directory_and_renders_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _need_shared()
    from skewlens.cli import main

    out = tmp_path / "run"
    assert main(["import", "--kineto", str(NCCL_2GPU), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "imported 1 of 2 ranks into" in text and "(missing)" in text
    assert main(["import", "--kineto", str(NCCL_2GPU), "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_progress_bar_goes_to_the_injected_console(tmp_path: Path) -> None:
    _need_shared()
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=True)
    import_traces([NCCL_2GPU], None, tmp_path / "run", progress=RichProgress(console))
    assert "converted rank 0" in buf.getvalue() or "written" in buf.getvalue()


def test_host_trace_adds_data_dependencies_on_earlier_writers(
    dlrm_run: Path, dlrm_run_kineto_only: Path
) -> None:
    m = read_manifest(dlrm_run)
    assert "host trace joined to" in m.notes["rank 0 import"]
    nodes = read_et(dlrm_run / "rank-0.et").nodes
    by_id = {n.id: n for n in nodes}
    data = [(n, by_id[d]) for n in nodes for d in n.data_deps]
    assert len(data) > 50
    for n, d in data:
        assert node_attrs(d)[Attr.START_NS] <= node_attrs(n)[Attr.START_NS]
        assert node_attrs(d)[Attr.IS_CPU_OP] is True  # only CPU nodes write
        assert d.id not in n.ctrl_deps
    # some collective kernels read tensors that a CPU op other than their launching op produced
    assert any(n.data_deps for n in nodes if n.type == NodeType.COMM_COLL)
    assert all(not n.data_deps for n in read_et(dlrm_run_kineto_only / "rank-0.et").nodes)


@pytest.mark.parametrize(
    "command",
    [
        ["check", "{t}"],
        ["analyze", "{t}", "--out", "{o}"],
        ["export", "{t}"],
        ["replay", "trace={t}", "out={o}"],
    ],
)
def test_a_real_kineto_trace_given_as_a_run_is_named_with_the_command_that_imports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # was "a file, not a run: give the run directory that holds it (.../traces)", and that directory then
    # "no manifest.json and no Chakra traces named <prefix>.<rank>.et (is this a run directory?)"
    _need_shared()
    from skewlens.cli import main

    args = [a.format(t=NCCL_2GPU, o=tmp_path / "o") for a in command]
    assert main(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        (
            f"skewlens {command[0]}: error: {NCCL_2GPU}: a Kineto trace (torch.profiler JSON), not a "
            f"run: import it first: skewlens import --kineto {NCCL_2GPU} --out RUN"
        )
    ]
    assert not (tmp_path / "o").exists()
