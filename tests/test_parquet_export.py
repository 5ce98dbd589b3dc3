"""Parquet export: round trip, rank partitions, DuckDB example queries from docs/parquet.md, atomicity."""

from __future__ import annotations

import dataclasses
import datetime
import io
import itertools
import json
import re
import shlex
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from capture_helpers import profile
from rich.console import Console
from test_parquet_joins import JOINED_STEPS
from trace_edits import without_dtype

from skewlens.analysis.api import RECORD_OF as ANALYSIS_RECORDS
from skewlens.analysis.api import SKEW_FILE
from skewlens.analysis.api import schema_markdown as analysis_markdown
from skewlens.analysis.sql import collective_skew_sql
from skewlens.cli import main as skewlens_main
from skewlens.cli.store import export_main, parquet_model
from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.atomic import STAGING_SUFFIX, temp_prefix
from skewlens.profiler.errors import SkewlensError, TraceFormatError, ValidationError
from skewlens.profiler.importers import import_traces
from skewlens.profiler.manifest import read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import Severity
from skewlens.profiler.store.parquet import PARTITIONED, SINGLE, export_run, open_dataset, schema_markdown
from skewlens.profiler.store.schema import (
    META_SOURCE,
    META_TABLE,
    META_VERSION,
    SCHEMA_VERSION,
    arrow_schema,
    read_table,
)
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.outputs import RECORD_OF as REPLAY_RECORDS
from skewlens.replay.outputs import SWEEP_PARQUET
from skewlens.replay.outputs import schema_markdown as replay_markdown

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "parquet.md"
MS = 1_000_000


def _run(tmp_path: Path, rank1_slower_ns: int = 0) -> Path:
    b = RunBuilder(3)
    for r in range(3):
        rb = b.rank(r).step(0)
        for i in range(6):
            extra_ns = rank1_slower_ns if r == 1 else 0
            rb.compute("aten::mm" if i % 2 else "aten::add", 10_000 * (r + 1) + 1_000 * i + extra_ns)
            rb.collective(CommType.ALL_REDUCE if i % 3 else CommType.ALL_GATHER, 4096, 2_000)
        if r == 0:
            rb.send(1, 512, 100, tag=9)
        if r == 1:
            rb.recv(0, 512, 100, tag=9)
    return b.write(tmp_path / "run")


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    run = _run(tmp_path)
    out = tmp_path / "pq"
    export_run(run, out, workers=1, model=parquet_model(run, lenient=False))
    return run, out


def test_nodes_round_trip_column_by_column(exported: tuple[Path, Path]) -> None:
    run_dir, out = exported
    run = load_run(run_dir)
    tbl = open_dataset(out, "nodes").to_table().sort_by([("rank", "ascending"), ("node_id", "ascending")])
    assert tbl.num_rows == sum(len(rt) for rt in run.ranks.values())
    for r, rt in run.ranks.items():
        part = tbl.filter(pa.compute.equal(tbl["rank"], r))
        order = np.argsort(rt.node_id)
        assert part["node_id"].to_pylist() == rt.node_id[order].tolist()
        assert part["start_ns"].to_pylist() == rt.start_ns[order].tolist()
        assert part["dur_ns"].to_pylist() == rt.dur_ns[order].tolist()
        assert part["name"].to_pylist() == [rt.name(i) for i in order.tolist()]
        assert part["type"].to_pylist() == [NodeType(t).name for t in rt.node_type[order].tolist()]
        assert part["seq"].to_pylist() == rt.seq[order].tolist()
        kinds = [None if t < 0 else CommType(t).name for t in rt.comm_type[order].tolist()]
        assert part["comm_type"].to_pylist() == kinds
        for col, values in (
            ("stream", rt.stream), ("step", rt.step), ("is_cpu_op", rt.is_cpu), ("comm_bytes", rt.comm_bytes),
            ("src", rt.src), ("dst", rt.dst), ("tag", rt.tag),
        ):  # fmt: skip
            assert part[col].to_pylist() == values[order].tolist(), col
        groups = [run.pg_names[g] if g >= 0 else None for g in rt.pg[order].tolist()]
        assert part["pg_name"].to_pylist() == groups and "0" in groups
    assert {tuple(tbl[c].unique().to_pylist()) for c in ("src", "dst", "tag")} >= {(-1, 0), (-1, 1), (0, 9)}


def test_dependencies_and_the_node_a_kernel_was_launched_in_are_node_ids_and_a_launch_at_0_is_kept(
    tmp_path: Path,
) -> None:
    # DepRecord and NodeRecord: deps and launched_in name node ids (here not the rows: 10, 20, 30), launch_ns
    # is null only where none was recorded (a launch at 0 ns is one)
    from skewlens.profiler.chakra_io import EtWriter, TraceNode
    from skewlens.profiler.vocab import Attr

    host = {Attr.IS_CPU_OP: True, Attr.STREAM: 0}
    nodes = [
        TraceNode(node_id=10, name="aten::item", node_type=NodeType.COMP, start_ns=0, dur_ns=5_000,
                  attrs=host),
        TraceNode(
            node_id=20, name="copy", node_type=NodeType.COMP, start_ns=1_000, dur_ns=1_000,
            attrs={Attr.IS_CPU_OP: False, Attr.STREAM: 7, Attr.LAUNCH_NS: 0, Attr.LAUNCHED_IN: 10},
        ),
        TraceNode(node_id=30, name="aten::mm", node_type=NodeType.COMP, start_ns=5_000, dur_ns=100,
                  ctrl_deps=(10,), data_deps=(20,), attrs=host),
    ]  # fmt: skip
    with EtWriter(tmp_path / "gpu" / "job.0.et") as w:
        w.write_all(nodes)
    export_run(tmp_path / "gpu", tmp_path / "pq", workers=1)
    tbl = open_dataset(tmp_path / "pq", "nodes").to_table().sort_by("node_id")
    assert tbl["node_id"].to_pylist() == [10, 20, 30]
    assert tbl["launch_ns"].to_pylist() == [None, 0, None]
    assert tbl["launched_in"].to_pylist() == [None, 10, None]
    deps = open_dataset(tmp_path / "pq", "deps").to_table().to_pylist()
    assert sorted((d["src"], d["dst"], d["kind"]) for d in deps) == [(10, 30, "ctrl"), (20, 30, "data")]


def test_deps_round_trip_as_node_id_pairs(exported: tuple[Path, Path]) -> None:
    run_dir, out = exported
    rt = load_run(run_dir).ranks[2]
    got = sorted(
        (row["src"], row["dst"], row["kind"])
        for row in open_dataset(out, "deps").to_table(filter=ds.field("rank") == 2).to_pylist()
    )
    want = sorted(
        (int(rt.node_id[d]), int(rt.node_id[i]), "ctrl" if k == 0 else "data")
        for i in range(len(rt))
        for d, k in zip(
            rt.deps_of(i).tolist(), rt.dep_kind[rt.dep_ptr[i] : rt.dep_ptr[i + 1]].tolist(), strict=True
        )
    )
    assert got == want and len(got) == len(rt) - 2  # the metadata node and the first op have none


def test_collectives_and_p2p_tables_match_the_loaded_run(exported: tuple[Path, Path]) -> None:
    run_dir, out = exported
    run = load_run(run_dir)
    coll = read_table(out / "collectives.parquet").to_pylist()
    assert len(coll) == sum(len(c.ranks) for c in run.collectives) == 6 * 3
    first = [c for c in coll if c["seq"] == 0]
    assert {c["rank"] for c in first} == {0, 1, 2} and {c["comm_type"] for c in first} == {"ALL_GATHER"}
    for c in first:
        rt = run.ranks[c["rank"]]
        row = int(np.flatnonzero(rt.node_id == c["node_id"])[0])
        assert (c["start_ns"], c["end_ns"]) == (int(rt.start_ns[row]), int(rt.end_ns[row]))
        assert c["group_size"] == 3
    (p2p,) = read_table(out / "p2p.parquet").to_pylist()
    assert (p2p["src_rank"], p2p["dst_rank"], p2p["tag"], p2p["comm_bytes"]) == (0, 1, 9, 512)
    ranks = read_table(out / "ranks.parquet").to_pylist()
    assert [(r["rank"], r["num_nodes"]) for r in ranks] == [(r, len(run.ranks[r])) for r in range(3)]


def test_the_ranks_table_gives_each_ranks_host_device_clock_offset_node_count_and_trace(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.manifest import read_manifest, write_manifest

    run_dir = _run(tmp_path)
    m = read_manifest(run_dir)
    hosts, devices = {0: "a", 1: "b", 2: "c"}, {r: f"cuda:{r}" for r in range(3)}
    offsets = {1: -1_500, 2: 2_500}  # rank 0: none recorded, 0
    write_manifest(run_dir, dataclasses.replace(m, hosts=hosts, devices=devices, clock_offsets_ns=offsets))
    export_run(run_dir, tmp_path / "pq", workers=1)
    run = load_run(run_dir)
    got = read_table(tmp_path / "pq" / "ranks.parquet").to_pylist()
    assert [(g["rank"], g["host"], g["device"], g["clock_offset_ns"], g["num_nodes"]) for g in got] == [
        (r, hosts[r], devices[r], offsets.get(r, 0), len(run.ranks[r])) for r in range(3)
    ]
    assert [Path(g["trace_file"]).name for g in got] == ["rank-0.et", "rank-1.et", "rank-2.et"]


def test_the_ranks_table_names_each_trace_file_by_its_absolute_path_however_the_run_was_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "skewlens export cpu --out pq" wrote trace_file "cpu/rank-0.et", a path only that cwd resolves
    # (run.json's source is absolute); the profile's own export of the same run, "/tmp/.../cpu/rank-0.et"
    run_dir = _run(tmp_path)
    monkeypatch.chdir(run_dir.parent)
    export_run(run_dir.name, "pq", workers=1)
    got = [g["trace_file"] for g in read_table(tmp_path / "pq" / "ranks.parquet").to_pylist()]
    assert got == [str((run_dir / f"rank-{r}.et").resolve()) for r in range(3)]


def test_groups_each_rank_names_only_in_its_own_trace_are_one_run_wide_group_list(tmp_path: Path) -> None:
    # a foreign run (no manifest): rank 0 lists group a, rank 2 group b, rank 1 both; each rank is decoded
    # on its own, its group numbers then mapped into the run's
    from skewlens.profiler.chakra_io import EtWriter, pg_init_node
    from skewlens.profiler.manifest import ProcessGroupInfo

    a, b = ProcessGroupInfo(name="a", ranks=(0, 1)), ProcessGroupInfo(name="b", ranks=(1, 2))
    mine = {0: [a], 1: [a, b], 2: [b]}
    for r, groups in mine.items():
        with EtWriter(tmp_path / "chakra" / f"job.{r}.et") as w:
            w.write(pg_init_node(groups))
            for k, g in enumerate(groups):
                node = pb.Node(id=10 + k, name="allreduce", type=int(NodeType.COMM_COLL), duration_micros=5)
                node.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
                node.attr.add(name="comm_size", int64_val=64)
                node.attr.add(name="pg_name", string_val=g.name)
                w.write(node)
    export_run(tmp_path / "chakra", tmp_path / "pq", workers=2)  # each worker starts from no groups
    rows = read_table(tmp_path / "pq" / "collectives.parquet").to_pylist()
    assert sorted((c["pg_name"], c["rank"], c["group_size"]) for c in rows) == [
        ("a", 0, 2),
        ("a", 1, 2),
        ("b", 1, 2),
        ("b", 2, 2),
    ]
    nodes = open_dataset(tmp_path / "pq", "nodes").to_table(filter=ds.field("type") == "COMM_COLL")
    assert sorted(zip(nodes["rank"].to_pylist(), nodes["pg_name"].to_pylist(), strict=True)) == [
        (0, "a"),
        (1, "a"),
        (1, "b"),
        (2, "b"),
    ]


def test_rank_filter_reads_only_that_ranks_files(exported: tuple[Path, Path]) -> None:
    _, out = exported
    dataset = open_dataset(out, "nodes")
    files = [f.path for f in dataset.get_fragments(filter=ds.field("rank") == 1)]
    assert files == [str(out / "nodes" / "rank=1" / "part-0.parquet")]
    tbl = dataset.to_table(filter=ds.field("rank") == 1)
    assert set(tbl["rank"].to_pylist()) == {1} and tbl.num_rows == pq.read_metadata(files[0]).num_rows


def test_every_file_carries_schema_version_and_dictionary_strings(exported: tuple[Path, Path]) -> None:
    _, out = exported
    files = [*out.glob("*/rank=*/*.parquet"), *(out / f"{t}.parquet" for t in SINGLE)]
    assert len(files) == 3 * 3 + len(SINGLE)
    for f in files:
        schema = pq.read_schema(f)
        assert schema.metadata[META_VERSION] == SCHEMA_VERSION.encode()
        assert schema.metadata[META_TABLE].decode() in PARTITIONED + SINGLE
    nodes = pq.read_schema(out / "nodes" / "rank=0" / "part-0.parquet")
    assert pa.types.is_dictionary(nodes.field("name").type) and "rank" not in nodes.names
    prov = json.loads((out / "run.json").read_text())
    assert prov["schema_version"] == SCHEMA_VERSION and prov["tables"]["collectives"]["rows"] == 18
    assert json.loads((out / "manifest.json").read_text())["world_size"] == 3


def test_integers_are_delta_encoded_with_statistics_and_strings_are_dictionary_pages_without(
    exported: tuple[Path, Path],
) -> None:
    _, out = exported
    for f in (out / "nodes" / "rank=0" / "part-0.parquet", out / "collectives.parquet"):
        meta = pq.ParquetFile(f).metadata
        schema = pq.read_schema(f)
        kinds = {"int": 0, "str": 0}
        for i, field in enumerate(schema):
            col = meta.row_group(0).column(i)  # one leaf column a field (a list's: its element)
            assert col.compression == "ZSTD", (f.name, field.name)
            if pa.types.is_integer(field.type):
                kinds["int"] += 1
                assert "DELTA_BINARY_PACKED" in col.encodings, (f.name, field.name, col.encodings)
                st = col.statistics
                all_null = st is not None and st.null_count == meta.row_group(0).num_rows  # nothing to bound
                assert st is not None and (st.has_min_max or all_null), (f.name, field.name)
            elif pa.types.is_dictionary(field.type):
                kinds["str"] += 1
                assert "RLE_DICTIONARY" in col.encodings, (f.name, field.name, col.encodings)
                assert col.statistics is None or not col.statistics.has_min_max, (f.name, field.name)
        assert kinds["int"] >= 3 and kinds["str"] >= 1, (f.name, kinds)
    part = out / "nodes" / "rank=0" / "part-0.parquet"
    nodes = pq.read_table(part)
    got = duckdb.sql(f"SELECT max(start_ns), sum(dur_ns) FROM '{part}'").fetchall()
    assert got == [(max(nodes.column("start_ns").to_pylist()), sum(nodes.column("dur_ns").to_pylist()))]


def _doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def _killed_beside(out: Path, names: Iterable[str], written: Path) -> Path:
    """The staging directory that an export or analysis into ``out`` killed (SIGKILL, the OOM killer) after
    writing ``names`` (paths inside it; copies of ``written``'s) leaves beside ``out``, until the next
    command that stages beside it (into ``out`` or another run's directory) removes it."""
    left = out.parent / f"{temp_prefix(out.name)}k3j2x7ab{STAGING_SUFFIX}"
    for name in names:
        (left / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(written / name, left / name)
    return left


def _section(title: str) -> str:
    """docs/parquet.md's section ``## title``, up to the next."""
    return DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _doc_python() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_documented_longest_waits_query_gives_the_waits_analyze_writes_members_that_returned_early_included(
    exported: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_dir, out = exported
    run = load_run(run_dir)
    waits, unclamped = [], {}
    for c in run.collectives:
        starts = [int(run.ranks[r].start_ns[row]) for r, row in zip(c.ranks, c.rows, strict=True)]
        ends = [s + int(run.ranks[r].dur_ns[row]) for s, r, row in zip(starts, c.ranks, c.rows, strict=True)]
        for s, e, r in zip(starts, ends, c.ranks, strict=True):
            waits.append((min(max(starts), e) - s, c.pg_name, c.seq, r))
            unclamped[(c.pg_name, c.seq, r)] = max(starts) - s
    want = sorted(waits, key=lambda w: (-w[0], w[1], w[2], w[3]))[:10]
    assert (
        skewlens_main(["analyze", str(run_dir), "--out", str(tmp_path / "an"), "--no-blame", "--no-pictures"])
        == 0
    )
    skew = [r for r in pq.read_table(tmp_path / "an" / SKEW_FILE).to_pylist() if r["kind"] == "collective"]
    analyzed = sorted(
        ((r["wait_ns"], r["pg_name"], r["seq"], r["rank"]) for r in skew),
        key=lambda w: (-w[0], w[1], w[2], w[3]),
    )[:10]
    monkeypatch.chdir(out)
    rows = [(w, g, s, r) for g, s, _t, r, w in duckdb.sql(_doc_queries()[0]).fetchall()]
    assert rows == want == analyzed
    assert rows[0][0] > 0
    # the fixture's members return 2 us after their own arrival, before a late member arrives: their wait
    # stops there (the last arrival alone would make it longer than the call)
    assert any(w < unclamped[(g, s, r)] for w, g, s, r in rows)


def test_documented_per_rank_op_time_query_sums_durations(
    exported: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, out = exported
    run = load_run(run_dir)
    monkeypatch.chdir(out)
    rows = duckdb.sql(_doc_queries()[1]).fetchall()
    for rank, name, calls, total in rows:
        rt = run.ranks[rank]
        mask = np.asarray([rt.name(i) == name for i in range(len(rt))])
        assert (calls, total) == (int(mask.sum()), int(rt.dur_ns[mask].sum()))
    assert {r[0] for r in rows} == {0, 1, 2}
    one = duckdb.sql(_doc_queries()[2]).fetchall()
    assert one == [(len(run.ranks[1]), int(run.ranks[1].dur_ns.sum()))]


def test_schema_tables_in_the_docs_are_generated_from_the_dataclasses() -> None:
    assert schema_markdown() in DOC.read_text()


def test_export_of_an_invalid_run_writes_nothing(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    run = b.write(tmp_path / "run")
    out = tmp_path / "out" / "pq"
    with pytest.raises(ValidationError, match="not exported, 1 problem") as e:
        export_run(run, out, workers=1)
    assert str(e.value).endswith("; strict=False does it all the same")  # the way round it
    with pytest.raises(ValidationError, match=r"; --allow-errors does it all the same$"):
        export_run(run, out, workers=1, allow_option="--allow-errors")
    assert list((tmp_path / "out").iterdir()) == []
    summary = export_run(run, out, workers=1, strict=False)
    assert summary.rows["collectives"] == 2 and (out / "nodes" / "rank=1" / "part-0.parquet").exists()


def test_an_export_with_errors_gives_each_member_of_a_mismatched_collective_its_own_type(
    tmp_path: Path,
) -> None:
    b = RunBuilder(3)
    for r, (t, size) in enumerate(
        [(CommType.ALL_REDUCE, 64), (CommType.BROADCAST, 64), (CommType.ALL_GATHER, 32)]
    ):
        b.rank(r).collective(t, size, 10)
        b.rank(r).collective(CommType.ALL_REDUCE, 64, 10)
    run = b.write(tmp_path / "run")
    out = tmp_path / "pq"
    export_run(run, out, workers=1, strict=False)
    rows = read_table(out / "collectives.parquet").to_pylist()
    got = {(r["seq"], r["rank"]): (r["comm_type"], r["comm_bytes"]) for r in rows}
    assert got == {
        (0, 0): ("ALL_REDUCE", 64),
        (0, 1): ("BROADCAST", 64),
        (0, 2): ("ALL_GATHER", 32),
        **{(1, r): ("ALL_REDUCE", 64) for r in range(3)},
    }


def test_an_export_with_errors_writes_a_comm_type_no_collective_has_as_null(tmp_path: Path) -> None:
    # NodeRecord.comm_type names the collective type; 50 names none (the load's error: unknown comm_type)
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, 64, 10)
        rb.collective(CommType.ALL_REDUCE, 64, 10)
        rb.nodes[-1] = dataclasses.replace(rb.nodes[-1], attrs={**rb.nodes[-1].attrs, "comm_type": 50})
    run = b.write(tmp_path / "run")
    summary = export_run(run, tmp_path / "pq", workers=1, strict=False)
    assert any("unknown comm_type 50" in i.message for i in summary.issues)
    tbl = open_dataset(tmp_path / "pq", "nodes").to_table(filter=ds.field("type") == "COMM_COLL")
    assert sorted(tbl["comm_type"].to_pylist(), key=str) == ["ALL_REDUCE", "ALL_REDUCE", None, None]


def test_an_export_with_errors_keeps_both_sizes_of_a_send_and_recv_that_disagree(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).send(1, 512, 100, tag=9)
    b.rank(1).recv(0, 4096, 100, tag=9)
    b.rank(0).send(1, 64, 100, tag=3)
    b.rank(1).recv(0, 64, 100, tag=3)
    run = b.write(tmp_path / "run")
    export_run(run, tmp_path / "pq", workers=1, strict=False)
    rows = read_table(tmp_path / "pq" / "p2p.parquet").to_pylist()
    assert {(r["tag"], r["comm_bytes"], r["recv_bytes"]) for r in rows} == {(9, 512, 4096), (3, 64, 64)}


def test_export_replaces_an_older_export_in_one_step(exported: tuple[Path, Path]) -> None:
    run_dir, out = exported
    (out / "stale.txt").write_text("old")
    export_run(run_dir, out, workers=1)
    assert not (out / "stale.txt").exists() and (out / "run.json").exists()
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_an_export_over_a_directory_that_is_not_an_earlier_export_is_refused_and_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SkewlensError, match="not empty and not an earlier Parquet export"):
        export_run(run, mine, workers=1)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    # --out RUN: the run's own traces stay
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SkewlensError, match="not empty and not an earlier Parquet export"):
        export_run(run, run, workers=1)
    assert sorted(p.name for p in run.iterdir()) == before and "rank-0.et" in before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # a file in the way is refused too; an empty directory is taken
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SkewlensError, match="exists and is not a directory"):
        export_run(run, tmp_path / "afile", workers=1)
    (tmp_path / "empty").mkdir()
    assert export_run(run, tmp_path / "empty", workers=1).rows["ranks"] == 3


def test_worker_processes_write_the_same_tables_as_one_process(exported: tuple[Path, Path]) -> None:
    run_dir, out = exported
    out2 = out.parent / "pq2"
    export_run(run_dir, out2, workers=2, model=parquet_model(run_dir, lenient=False))
    for t in PARTITIONED + SINGLE:
        a = open_dataset(out, t).to_table().to_pylist()
        b = open_dataset(out2, t).to_table().to_pylist()
        key = lambda row: json.dumps(row, sort_keys=True, default=str)  # noqa: E731
        assert sorted(a, key=key) == sorted(b, key=key), t


def test_export_cli_writes_beside_the_run_by_default(tmp_path: Path) -> None:
    run = _run(tmp_path)
    buf = io.StringIO()
    code = export_main([str(run), "--workers", "1", "--no-progress"], console=Console(file=buf, width=120))
    assert code == 0 and (run / "parquet" / "collectives.parquet").exists()
    assert re.search(r"collectives\s*│\s*18", buf.getvalue())


def test_an_export_from_before_the_model_table_names_its_version_and_the_command_that_exports_its_run_again(
    tmp_path: Path,
) -> None:
    # an export of schema version 8 (before the model table): the collective_skew SQL needs the table, and
    # open_dataset said only 'exported with --no-model, or by a skewlens before the table', not what to do
    run = _run(tmp_path)
    out = tmp_path / "old export"
    export_run(run, out, workers=1)  # no model columns given: no model table
    prov = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**prov, "schema_version": "8"}))
    with pytest.raises(SkewlensError) as e:
        open_dataset(out, "model")
    assert str(e.value) == (
        f"{out}: no model table: model is missing (exported with --no-model, or by a skewlens before schema "
        f"version 9; this export is version 8); export the run again for it: skewlens export {run.resolve()} "
        f"--out '{out}'"
    )
    (out / "run.json").unlink()  # nothing says which run, nor which version: the command says RUN
    with pytest.raises(SkewlensError) as e:
        open_dataset(out, "model")
    assert str(e.value).endswith("skewlens before schema version 9); export the run again for it: "
                                 f"skewlens export RUN --out '{out}'")  # fmt: skip


def test_export_cli_no_model_leaves_out_only_the_model_table_which_open_dataset_says_is_missing(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    argv = [str(run), "--workers", "1", "--no-progress"]
    assert export_main([*argv, "--out", str(tmp_path / "with")], console=Console(file=io.StringIO())) == 0
    assert (
        export_main(
            [*argv, "--out", str(tmp_path / "without"), "--no-model"], console=Console(file=io.StringIO())
        )
        == 0
    )
    assert (tmp_path / "with" / "model").is_dir() and not (tmp_path / "without" / "model").exists()
    for t in ("nodes", "deps", "collectives", "p2p", "ranks"):
        assert (
            open_dataset(tmp_path / "without", t)
            .to_table()
            .equals(open_dataset(tmp_path / "with", t).to_table())
        ), t
    with pytest.raises(
        SkewlensError,
        match=r"without: no model table: model is missing \(exported with --no-model, or by a skewlens "
        rf"before schema version 9; this export is version {SCHEMA_VERSION}\); export the run again for it: "
        r"skewlens export ",
    ):
        open_dataset(tmp_path / "without", "model")
    with pytest.raises(SkewlensError, match=r"with: no p2p table: p2p.parquet is missing$"):
        (tmp_path / "with" / "p2p.parquet").unlink()
        open_dataset(tmp_path / "with", "p2p")
    with pytest.raises(SkewlensError, match=r"^--no-model: an option of --format parquet"):
        export_main([*argv, "--format", "astra-sim", "--no-model", "--out", str(tmp_path / "astra")])


def test_the_export_summary_title_keeps_a_long_output_path_on_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = tmp_path / ("long-output-directory-" * 3) / "parquet"
    buf = io.StringIO()
    argv = [str(run), "--out", str(out), "--workers", "1", "--no-progress"]
    assert export_main(argv, console=Console(file=buf, width=len(str(out)) + 20)) == 0
    # the table is narrower than its title: rich wrapped it mid-path ("exported to /tmp/.../parque", "t")
    assert buf.getvalue().splitlines()[0].strip() == f"exported to {out}"


def test_export_cli_says_which_warnings_and_errors_it_counted_on_stderr_named_after_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # they were `warning: ...` lines on stdout, under the summary: in a script's > out.txt
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    run = b.write(tmp_path / "run")
    (run / "manifest.json").unlink()
    buf = io.StringIO()
    argv = [str(run), "--workers", "1", "--no-progress", "--allow-errors"]
    assert export_main(argv, console=Console(file=buf, width=400)) == 0
    text = buf.getvalue()
    assert "2 warning(s)/error(s)" in text
    assert "error:" not in text and "warning:" not in text
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        "skewlens export: error: collective mismatch in group '0' seq 0: type differs"
    )
    assert lines[1].startswith("skewlens export: warning: ") and "without manifest.json" in lines[1]


def test_export_cli_with_allow_errors_writes_the_model_of_the_run_loaded_leniently(tmp_path: Path) -> None:
    # as skewlens analyze --lenient reads it: the all_reduce the ranks disagree on skipped, every node kept
    b = RunBuilder(2)
    for r, nbytes in ((0, 64), (1, 128)):
        b.rank(r).step(0).compute("aten::mm", 1000)
        b.rank(r).collective(CommType.ALL_REDUCE, nbytes, 10)
    run = b.write(tmp_path / "run")
    argv = [str(run), "--out", str(tmp_path / "pq"), "--workers", "1", "--no-progress", "--allow-errors"]
    assert export_main(argv, console=Console(file=io.StringIO())) == 0
    model = (
        open_dataset(tmp_path / "pq", "model")
        .to_table()
        .sort_by([("rank", "ascending"), ("node_id", "ascending")])
    )
    assert model.select(["rank", "node_id", "end_ns", "compute_ns"]).to_pylist() == [
        {"rank": r, "node_id": i, "end_ns": end, "compute_ns": comp}
        for r in range(2)
        for i, end, comp in [(0, 0, 0), (1, 1000, 1000), (2, 1010, 0)]
    ]


def test_export_cli_counts_the_warnings_it_does_not_show_and_names_the_command_that_lists_them(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.store.issues import Issue, Severity
    from skewlens.profiler.store.parquet import ExportSummary
    from skewlens.profiler.store.render import SHOWN_ISSUES, issue_lines

    issues = [
        Issue(severity=Severity.WARNING, kind="w", message=f"warning {i}") for i in range(SHOWN_ISSUES + 3)
    ]
    bad = Issue(severity=Severity.ERROR, kind="e", message="bad")
    summary = ExportSummary(out_dir=tmp_path, rows={}, issues=(*issues, bad))
    lines = issue_lines(summary.issues, "RUN_DIR")
    assert lines[0] == "error: bad" and lines[1] == "warning: warning 0"
    assert len(lines) == SHOWN_ISSUES + 1
    assert lines[-1] == "and 4 more warning(s)/error(s): skewlens check RUN_DIR"


def test_the_issues_after_a_summary_leave_out_infos_show_ten_and_quote_the_run_in_the_check_command(
    tmp_path: Path,
) -> None:
    from rich.console import Console

    from skewlens.profiler.store.issues import Issue, Severity
    from skewlens.profiler.store.parquet import ExportSummary
    from skewlens.profiler.store.render import issue_lines, render_export

    info = Issue(severity=Severity.INFO, kind="i", message="just so you know")
    ten = [Issue(severity=Severity.WARNING, kind="w", message=f"warning {i}") for i in range(10)]
    assert issue_lines([info, *ten], "my run") == [
        f"warning: warning {i}" for i in range(10)
    ]  # no "and 0 more"
    lines = issue_lines([*ten, info, ten[0]], "my run")
    assert len(lines) == 11 and lines[-1] == "and 1 more warning(s): skewlens check 'my run'"
    out = io.StringIO()
    Console(file=out, width=200).print(
        render_export(ExportSummary(out_dir=tmp_path, rows={}, issues=(info,)), 1.0)
    )
    assert "0 warning(s)/error(s)" in out.getvalue()


def test_a_parquet_export_given_where_a_run_is_read_is_named_as_an_export_not_as_eight_missing_traces(
    exported: tuple[Path, Path],
) -> None:
    from skewlens.profiler.errors import ManifestError
    from skewlens.profiler.store.validate import validate_run

    run_dir, out = exported
    for read in (load_run, validate_run, lambda p: export_run(p, p.parent / "again", workers=1)):
        with pytest.raises(ManifestError, match="a Parquet export") as e:
            read(out)
        assert f"pass the run it was exported from ({run_dir.resolve()})" in str(e.value)
        assert "trace file is missing" not in str(e.value)


def test_benchmark_code_path_converts_a_tiny_generated_run(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "store_throughput", ROOT / "benchmarks" / "store_throughput.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = tmp_path / "bench"
    for r in range(2):
        bench.generate_rank(run, r, 2, 1200)
    res = bench.convert(run, tmp_path / "out", 1)
    per_rank = sum(1 for i in range(1, 1200) if i % bench.COLL_EVERY == 0 and i % bench.P2P_EVERY != 0)
    assert res["nodes"] == 2400 and res["errors"] == 0
    assert res["collective_rows"] == 2 * per_rank
    assert res["p2p_rows"] == 4  # two ring exchanges each way


def test_an_unreadable_rank_file_is_named_and_the_rest_exported_on_request(tmp_path: Path) -> None:
    run = _run(tmp_path)
    f = run / "rank-2.et"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(ValidationError, match=r"rank-2\.et: truncated message at byte offset \d+"):
        export_run(run, tmp_path / "pq", workers=1)
    summary = export_run(run, tmp_path / "pq", workers=1, strict=False)
    assert sorted(p.name for p in (tmp_path / "pq" / "nodes").iterdir()) == ["rank=0", "rank=1"]
    assert summary.rows["ranks"] == 2 and summary.rows["p2p"] == 1


# ------------------------------------------------------------------------------- all_to_all splits

#: Bytes global rank r sends to each member of group "ep" (ranks 1, 2, 3, group-rank order) in an uneven
#: all_to_all; rank 0 is not a member.
EP = (1, 2, 3)
EP_SENDS = {1: [100, 2_000, 30], 2: [400, 5, 6_000], 3: [70, 800, 9]}


def _uneven_run(tmp_path: Path, *, damaged: bool = False) -> Path:
    """4 ranks: an even world all_to_all (no splits recorded), then an uneven one on group "ep" (1-3);
    ``damaged``: rank 2 records a negative size in its send list."""
    b = RunBuilder(4, groups={"0": (0, 1, 2, 3), "ep": EP})
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 10_000 * (r + 1))
        rb.collective(CommType.ALL_TO_ALL, 4096, 2_000)
        if r in EP_SENDS:
            me = EP.index(r)
            send = list(EP_SENDS[r])
            recv = [EP_SENDS[k][me] for k in EP]
            peer = (sum(send) - send[me], sum(recv) - recv[me])
            if damaged and r == 2:
                send[0] = -send[0]
            rb.collective(
                CommType.ALL_TO_ALL, sum(send), 3_000, pg="ep", peer_bytes=peer, peer_splits=(send, recv)
            )
    return b.write(tmp_path / "run")


def test_the_nodes_table_carries_an_uneven_all_to_alls_splits_for_pyarrow_and_duckdb(tmp_path: Path) -> None:
    # before (schema version 4), the splits were not exported: only comm_bytes, the rank's total
    run = _uneven_run(tmp_path)
    out = tmp_path / "pq"
    export_run(run, out, workers=1)
    loaded = load_run(run)
    want: dict[tuple[int, int], tuple[list[int], list[int]] | None] = {}
    for r, rt in loaded.ranks.items():
        for i in range(len(rt)):
            a, b = (0, 0) if rt.split_ptr is None else (int(rt.split_ptr[i]), int(rt.split_ptr[i + 1]))
            got = None
            if b > a and rt.split_send_bytes is not None and rt.split_recv_bytes is not None:
                got = (rt.split_send_bytes[a:b].tolist(), rt.split_recv_bytes[a:b].tolist())
            want[(r, int(rt.node_id[i]))] = got
    # what the traces hold, in group-rank order: member k of "ep" is global rank EP[k]
    uneven = {k: v for k, v in want.items() if v is not None}
    assert sorted(uneven.values()) == sorted(
        (EP_SENDS[r], [EP_SENDS[k][EP.index(r)] for k in EP]) for r in EP
    )
    tbl = open_dataset(out, "nodes").to_table()
    assert pa.types.is_list(tbl.schema.field("send_splits_bytes").type)
    assert pa.types.is_int64(tbl.schema.field("send_splits_bytes").type.value_type)
    by_pyarrow = {
        (row["rank"], row["node_id"]): (
            None if row["send_splits_bytes"] is None else (row["send_splits_bytes"], row["recv_splits_bytes"])
        )
        for row in tbl.to_pylist()
    }
    assert by_pyarrow == want
    nodes = f"read_parquet('{out}/nodes/*/*.parquet', hive_partitioning = true)"
    by_duckdb = {
        (r, n): None if s is None else (s, g)
        for r, n, s, g in duckdb.sql(
            f"SELECT rank, node_id, send_splits_bytes, recv_splits_bytes FROM {nodes}"
        ).fetchall()
    }
    assert by_duckdb == want
    assert duckdb.sql(f"SELECT typeof(send_splits_bytes) FROM {nodes} LIMIT 1").fetchall() == [("BIGINT[]",)]
    # the documented imbalance query: one row per (sender, member) pair of the uneven all_to_all
    pairs = duckdb.sql(_doc_queries()[3].replace("'nodes/", f"'{out}/nodes/")).fetchall()
    assert pairs == [("ep", 0, r, k, EP_SENDS[r][k]) for r in EP for k in range(3)]
    # its values delta-encoded, like every integer column
    meta = pq.ParquetFile(out / "nodes" / "rank=1" / "part-0.parquet").metadata.row_group(0)
    leaves = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in leaves["send_splits_bytes.list.element"]


def _node_record(**changes: Any) -> Any:
    """One host node of rank 0 (node 7, ``aten::mm``, 5 ns) as the nodes table holds it, with ``changes``."""
    from skewlens.profiler.store.schema import NodeRecord

    row = NodeRecord(
        rank=0, node_id=7, name="aten::mm", type="COMP", start_ns=0, dur_ns=5, stream=0, step=0,
        is_cpu_op=True, comm_type=None, comm_bytes=0, pg_name=None, seq=-1, src=-1, dst=-1, tag=0,
        send_splits_bytes=None, recv_splits_bytes=None, launch_ns=None, launched_in=None, return_ns=None,
        dtype=None,
    )  # fmt: skip
    return dataclasses.replace(row, **changes)


def test_version_4_7_and_9_nodes_files_still_read_with_null_new_columns_and_older_ones_are_refused(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.store.schema import NodeRecord, table_from_records, write_table

    row = _node_record()
    current = table_from_records(
        NodeRecord, [row, dataclasses.replace(row, send_splits_bytes=[1, 2])], "nodes"
    )
    assert read_table(write_table(current, tmp_path / "v5.parquet"), NodeRecord)[
        "send_splits_bytes"
    ].to_pylist() == [
        None,
        [1, 2],
    ]
    v11 = current.drop_columns(["dtype"])
    f = tmp_path / "v11.parquet"
    write_table(v11.replace_schema_metadata({META_VERSION: b"11", META_TABLE: b"nodes"}), f)
    assert read_table(f, NodeRecord)["dtype"].to_pylist() == [None, None]  # before nodes.dtype
    v9 = v11.drop_columns(["return_ns"])
    f = tmp_path / "v9.parquet"
    write_table(v9.replace_schema_metadata({META_VERSION: b"9", META_TABLE: b"nodes"}), f)
    assert read_table(f, NodeRecord)["return_ns"].to_pylist() == [None, None]  # before nodes.return_ns
    v7 = v9.drop_columns(["launch_ns", "launched_in"])
    f = tmp_path / "v7.parquet"
    write_table(v7.replace_schema_metadata({META_VERSION: b"7", META_TABLE: b"nodes"}), f)
    tbl = read_table(f, NodeRecord)  # a version-7 file: no launch columns, read as null
    assert tbl["launch_ns"].to_pylist() == tbl["launched_in"].to_pylist() == [None, None]
    assert tbl["send_splits_bytes"].to_pylist() == [None, [1, 2]]
    old = v7.drop_columns(["send_splits_bytes", "recv_splits_bytes"])
    for version, readable in (("4", True), ("3", False)):
        f = tmp_path / f"v{version}.parquet"
        write_table(old.replace_schema_metadata({META_VERSION: version.encode(), META_TABLE: b"nodes"}), f)
        if readable:
            tbl = read_table(f, NodeRecord)
            assert (
                tbl["send_splits_bytes"].to_pylist() == tbl["recv_splits_bytes"].to_pylist() == [None, None]
            )
            assert tbl["node_id"].to_pylist() == [7, 7]
            picked = read_table(f, NodeRecord, columns=["node_id", "recv_splits_bytes"])
            assert picked.column_names == ["node_id", "recv_splits_bytes"]
            assert read_table(f).num_columns == len(old.column_names)  # as written
        else:
            with pytest.raises(
                SkewlensError,
                match=rf"v3\.parquet: schema version 3 \(this skewlens reads 4 to {SCHEMA_VERSION}\)",
            ):
                read_table(f, NodeRecord)


def _as_version(export: Path, version: str, drop: tuple[str, ...] = ()) -> None:
    """Rewrite each nodes partition of ``export`` as a skewlens of ``version`` wrote it, without ``drop``."""
    for f in sorted((export / "nodes").glob("rank=*/*.parquet")):
        t = pq.read_table(f).drop_columns(list(drop))
        pq.write_table(t.replace_schema_metadata({META_VERSION: version.encode(), META_TABLE: b"nodes"}), f)


def test_open_dataset_reads_an_older_exports_added_columns_as_null_and_refuses_a_version_it_cannot_read(
    tmp_path: Path,
) -> None:
    # a version-7 export (before nodes.launch_ns) raised pyarrow's 'No match for FieldRef.Name(launch_ns)'
    # where read_table gives the column as null, and a version-3 one read as if current, unchecked
    run = _run(tmp_path)
    out = tmp_path / "pq"
    export_run(run, out, workers=1)
    current = open_dataset(out, "nodes").to_table(columns=["rank", "node_id", "dur_ns", "launch_ns"])
    _as_version(out, "7", drop=("launch_ns", "launched_in", "return_ns"))
    v7 = open_dataset(out, "nodes").to_table(columns=["rank", "node_id", "dur_ns", "launch_ns"])
    assert v7.num_rows == current.num_rows > 0 and v7["launch_ns"].null_count == v7.num_rows
    key = lambda t: sorted(zip(*(t[c].to_pylist() for c in ("rank", "node_id", "dur_ns")), strict=True))  # noqa: E731
    assert key(v7) == key(current)
    assert open_dataset(out, "nodes").schema.metadata[META_VERSION] == b"7"  # the version read, kept
    _as_version(out, "3")
    with pytest.raises(
        SkewlensError,
        match=rf"part-0\.parquet: schema version 3 \(this skewlens reads 4 to {SCHEMA_VERSION}\)",
    ):
        open_dataset(out, "nodes")
    for f in (out / "nodes").glob("rank=*/*.parquet"):  # a table with no file left: nothing to check
        f.unlink()
    assert open_dataset(out, "nodes").to_table().num_rows == 0


def test_a_file_of_a_newer_or_unnamed_version_or_missing_a_column_is_refused_and_a_current_one_read_whole(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.store.schema import NodeRecord, table_from_records, write_table

    row = _node_record(name="copy", stream=9, is_cpu_op=False, launch_ns=2, launched_in=3)
    current = table_from_records(NodeRecord, [row], "nodes")
    f = write_table(current, tmp_path / "current.parquet")
    picked = read_table(f, NodeRecord, columns=["node_id", "launch_ns", "launched_in"])  # version 8's own
    assert picked.to_pylist() == [{"node_id": 7, "launch_ns": 2, "launched_in": 3}]
    newer = str(int(SCHEMA_VERSION) + 1)
    for version in (newer, "x", None):
        meta = {META_TABLE: b"nodes", **({META_VERSION: version.encode()} if version else {})}
        g = write_table(current.replace_schema_metadata(meta), tmp_path / f"v{version}.parquet")
        said = rf"schema version {version or 'missing'} \(this skewlens reads 4 to {SCHEMA_VERSION}\)"
        with pytest.raises(SkewlensError, match=said):
            read_table(g, NodeRecord)
    h = write_table(current.drop_columns(["dur_ns"]), tmp_path / "no_dur.parquet")
    with pytest.raises(SkewlensError, match=r"no_dur\.parquet: missing columns \['dur_ns'\]"):
        read_table(h, NodeRecord)


def test_a_file_too_old_or_too_new_to_read_says_which_command_writes_it_again_or_to_upgrade(
    tmp_path: Path,
) -> None:
    # the refusal said only 'schema version 2 (this skewlens reads 4 to 16)': an upgraded user with a
    # version-2 export, analysis and sweep (skewlens at 176e06a) was not told what to do with them
    from skewlens.profiler.store.schema import NodeRecord, table_from_records, write_table

    current = table_from_records(NodeRecord, [_node_record()], "nodes")
    remade = {
        "nodes": "skewlens export RUN --out DIR",
        "collectives": "skewlens export RUN --out DIR",
        "blame": "skewlens analyze RUN --out DIR",
        "step_breakdown": "skewlens analyze RUN --out DIR",
        "summary": "skewlens replay trace=RUN out=DIR",
        "sweep": "skewlens replay -m trace=RUN out=DIR ...",
    }
    for table, how in remade.items():
        f = write_table(
            current.replace_schema_metadata({META_VERSION: b"2", META_TABLE: table.encode()}),
            tmp_path / f"{table}.parquet",
        )
        with pytest.raises(SkewlensError) as e:
            read_table(f)
        assert str(e.value) == (
            f"{f}: schema version 2 (this skewlens reads 4 to {SCHEMA_VERSION}): written by an older "
            f"skewlens; write it again from its run with this one: {how}"
        )
    newer = str(int(SCHEMA_VERSION) + 1)
    g = write_table(
        current.replace_schema_metadata({META_VERSION: newer.encode(), META_TABLE: b"nodes"}),
        tmp_path / "newer.parquet",
    )
    with pytest.raises(SkewlensError) as e:
        read_table(g)
    assert str(e.value).endswith("written by a newer skewlens; read it with that one, or upgrade")
    h = write_table(current.replace_schema_metadata({}), tmp_path / "unnamed.parquet")
    with pytest.raises(SkewlensError) as e:
        read_table(h)
    assert str(e.value).endswith(
        f"schema version missing (this skewlens reads 4 to {SCHEMA_VERSION}): not a file this skewlens wrote,"
        " or written by an older one; write it again from its run"
    )


def test_every_table_an_export_or_a_replay_writes_is_remade_by_that_command_when_too_old(
    tmp_path: Path,
) -> None:
    # each of the export's tables (its partitioned and single files) and the replay's timeline: a file of
    # one too old to read names the command that writes it, not 'skewlens analyze'
    from skewlens.profiler.store.parquet import PARTITIONED, SINGLE
    from skewlens.profiler.store.schema import NodeRecord, table_from_records, write_table

    current = table_from_records(NodeRecord, [_node_record()], "nodes")
    remade = dict.fromkeys((*PARTITIONED, *SINGLE), "skewlens export RUN --out DIR")
    remade["timeline"] = "skewlens replay trace=RUN out=DIR"
    for table, how in remade.items():
        f = write_table(
            current.replace_schema_metadata({META_VERSION: b"3", META_TABLE: table.encode()}),
            tmp_path / f"{table}.parquet",
        )
        with pytest.raises(SkewlensError) as e:
            read_table(f)
        assert str(e.value).endswith(f"write it again from its run with this one: {how}"), table


def test_an_export_with_errors_keeps_the_rank_of_an_all_to_all_with_inconsistent_splits_without_them(
    tmp_path: Path,
) -> None:
    # before, the whole of rank 2 was left out of an export with --allow-errors (its file "corrupt")
    run = _uneven_run(tmp_path, damaged=True)
    with pytest.raises(
        ValidationError, match=r"rank-2\.et: rank 2: node \d+ \(c10d::all_to_all_\) .* a negative"
    ):
        export_run(run, tmp_path / "pq", workers=1)
    summary = export_run(run, tmp_path / "pq", workers=1, strict=False)
    assert [(i.kind, i.rank) for i in summary.issues if i.severity is Severity.ERROR] == [
        ("corrupt-splits", 2)
    ]
    assert sorted(p.name for p in (tmp_path / "pq" / "nodes").iterdir()) == [f"rank={r}" for r in range(4)]
    rows = duckdb.sql(
        f"SELECT rank, send_splits_bytes FROM read_parquet('{tmp_path}/pq/nodes/*/*.parquet', "
        "hive_partitioning = true) WHERE send_splits_bytes IS NOT NULL ORDER BY rank"
    ).fetchall()
    assert rows == [(1, EP_SENDS[1]), (3, EP_SENDS[3])]


@pytest.mark.slow
def test_a_script_without_a_main_guard_gets_an_error_that_says_so_not_out_of_memory(
    exported: tuple[Path, Path], tmp_path: Path
) -> None:
    import subprocess
    import sys

    run, _ = exported
    script = tmp_path / "export_it.py"  # the worker processes import it, and it exports again: refused
    script.write_text(
        "from skewlens.profiler.store.parquet import export_run\n"
        f"export_run({str(run)!r}, {str(tmp_path / 'pq')!r}, workers=2)\n"
    )
    p = subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120
    )
    assert p.returncode != 0
    said = [line for line in p.stderr.splitlines() if "the worker exporting rank" in line]
    assert said and 'if __name__ == "__main__":' in said[0], p.stderr[-2000:]
    assert "SkewlensError" in said[0]  # one error of ours, not a BrokenProcessPool from inside the pool


def test_an_export_is_readable_as_an_ordinary_directory_is_not_private_to_its_writer(
    exported: tuple[Path, Path], tmp_path: Path
) -> None:
    """The export is written into a staging directory that ``mkdtemp`` makes 0700, then moved into place:
    it gets the mode ``mkdir`` gives under the same umask, so that others (a team, a Spark service user) can
    read it."""
    _run_dir, out = exported
    ordinary = tmp_path / "ordinary"
    ordinary.mkdir()
    assert out.stat().st_mode & 0o777 == ordinary.stat().st_mode & 0o777
    for p in out.rglob("*"):
        assert p.stat().st_mode & 0o444 == ordinary.stat().st_mode & 0o444, p


def _skew_rows(con: duckdb.DuckDBPyConnection, export: str) -> list[tuple[Any, ...]]:
    """``collective_skew.sql`` over the export(s) in ``export`` (a directory, or a glob of them)."""
    for t in ("nodes", "model"):
        con.execute(
            f"CREATE OR REPLACE VIEW {t} AS SELECT * FROM read_parquet('{export}/{t}/*/*.parquet', "
            "hive_partitioning = true)"
        )
    collectives, p2p = f"{export}/collectives.parquet", f"{export}/p2p.parquet"
    con.execute(f"CREATE OR REPLACE VIEW collectives AS SELECT * FROM read_parquet('{collectives}')")
    con.execute(f"CREATE OR REPLACE VIEW p2p AS SELECT * FROM read_parquet('{p2p}')")
    return con.sql(collective_skew_sql()).fetchall()


def test_the_documented_many_runs_query_and_loop_keep_runs_apart_where_a_union_of_exports_mixes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {"a": _run(tmp_path / "a"), "b": _run(tmp_path / "b", rank1_slower_ns=25_000)}
    for name, run_dir in runs.items():
        export_run(
            run_dir,
            tmp_path / "FLEET" / f"run={name}",
            workers=1,
            model=parquet_model(run_dir, lenient=False),
        )
    monkeypatch.chdir(tmp_path)
    (query,) = [q for q in _doc_queries() if "FLEET/" in q and "busy_ns" in q]
    want = []
    for name, run_dir in runs.items():
        run = load_run(run_dir)
        want += [(name, r, len(rt), int(rt.dur_ns.sum())) for r, rt in sorted(run.ranks.items())]
    assert duckdb.sql(query).fetchall() == want
    # each run alone, and a union of the two exports read as one
    con = duckdb.connect()
    alone = {name: _skew_rows(con, f"FLEET/run={name}") for name in runs}
    union = _skew_rows(con, "FLEET/*")
    assert alone["a"] != alone["b"] and len(alone["a"]) == len(alone["b"]) > 0
    assert set(union) - set(alone["a"]) - set(alone["b"])  # rows of neither run: the union mixed them
    # a third export, killed after it wrote rank 1's nodes: a directory of FLEET/*/, not of FLEET/run=*/
    fleet = tmp_path / "FLEET"
    _killed_beside(fleet / "run=c", ["nodes/rank=1/part-0.parquet"], fleet / "run=a")
    assert duckdb.sql(query).fetchall() == want
    (loop,) = [c for c in _doc_python() if "FLEET" in c]
    scope: dict[str, Any] = {}
    exec(loop, scope)  # the docs' snippet, verbatim
    assert scope["skew"] == [(name, *row) for name in runs for row in alone[name]]


def test_the_documented_union_by_name_reads_two_runs_of_different_schema_versions_a_plain_glob_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.profiler.store.schema import write_table

    for name in ("a", "b"):
        export_run(_run(tmp_path / name), tmp_path / "FLEET" / f"run={name}", workers=1)
    old = tmp_path / "FLEET" / "run=a" / "collectives.parquet"  # a's as a skewlens before collectives.dtype
    v11 = pq.read_table(old).drop_columns(["dtype"])
    write_table(v11.replace_schema_metadata({META_VERSION: b"11", META_TABLE: b"collectives"}), old)
    monkeypatch.chdir(tmp_path)
    (query,) = [q for q in _doc_queries() if "union_by_name" in q and "dtype" in q]
    members = v11.num_rows
    assert duckdb.sql(query).fetchall() == [("a", None, members), ("b", "float32", members)]
    plain = query.replace(", union_by_name = true", "")
    with pytest.raises(duckdb.BinderException, match='"dtype" not found'):  # as the docs say
        duckdb.sql(plain).fetchall()
    glob = "read_parquet('FLEET/*/collectives.parquet', hive_partitioning = true)"
    assert "dtype" not in duckdb.sql(f"SELECT * FROM {glob}").columns  # b's dtype left out, unsaid


def _before_after_run(run_dir: Path, *, after: bool) -> Path:
    """2 ranks; ``after``: one more step, a bigger DDP bucket (``gloo:all_reduce``), an all_reduce of 4 bytes
    of the script's own (``c10d::allreduce_``) a step before it, rank 1's ``aten::mm`` 20 us slower (rank 0
    waits for it at that first all_reduce), rank 0's ``aten::add`` 4 us slower (rank 1 waits for its send)
    and a second send a step (laid out so that the ranks' times agree)."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(4 if after else 3):
            rb.step(s).compute("aten::mm", 30_000 if after and r == 1 else 10_000)
            if after:
                rb.collective(CommType.ALL_REDUCE, 4, 21_000 if r == 0 else 1_000, name="c10d::allreduce_")
                rb.collective(CommType.ALL_REDUCE, 16_384, 2_000, name="gloo:all_reduce")
            else:
                rb.collective(CommType.ALL_REDUCE, 4_096, 2_000, name="gloo:all_reduce")
            rb.compute("aten::add", 5_000 if after and r == 0 else 1_000)
            sizes = (1_024, 4) if after else (1_024,)
            for i, size in enumerate(sizes):
                if r == 0:
                    rb.send(1, size, 1_000)
                else:  # in b, the first recv waits 4 us for rank 0's slower add
                    rb.recv(0, size, 5_000 if after and i == 0 else 1_000)
    return b.write(run_dir)


def test_the_documented_two_run_comparison_lines_up_steps_collectives_and_ops_of_runs_that_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/parquet.md's "Comparing two runs", verbatim: its commands, then its four queries, on two runs
    whose differences are known: what each should find, by hand."""
    _before_after_run(tmp_path / "runs" / "before", after=False)
    _before_after_run(tmp_path / "runs" / "after", after=True)
    section = _section("Comparing two runs")
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]  # export and analyze
    monkeypatch.chdir(tmp_path)
    for line in commands.splitlines():
        for command in line.split("&&"):
            argv = command.split()
            assert argv[0] == "skewlens"
            assert skewlens_main(argv[1:]) == 0, command
    # a third run's export and analysis, killed while they wrote (copies of a's files), beside the runs
    fleet, an = tmp_path / "FLEET", tmp_path / "AN"
    _killed_beside(fleet / "run=c", ["nodes/rank=1/part-0.parquet", "collectives.parquet"], fleet / "run=a")
    _killed_beside(an / "run=c", ["step_breakdown.parquet", "collective_skew.parquet"], an / "run=a")
    breakdown, collectives, ops, _predicted, p2p = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    # a: 14 us steps (10 compute, 2 all_reduce, 1 compute, 1 send); b: 40 us, rank 0 waiting 20 us for rank
    # 1's compute at the first all_reduce, rank 1 4 us for rank 0's send
    before = {"step_ns": 14_000, "compute_ns": 11_000, "exposed_transfer_ns": 3_000}
    after = {
        0: {"step_ns": 40_000, "compute_ns": 15_000, "exposed_wait_ns": 20_000, "exposed_transfer_ns": 5_000},
        1: {"step_ns": 40_000, "compute_ns": 31_000, "exposed_wait_ns": 4_000, "exposed_transfer_ns": 5_000},
    }
    parts = ("step_ns", "compute_ns", "exposed_wait_ns", "exposed_transfer_ns", "overlapped_comm_ns")
    parts += ("idle_ns",)
    rows = [
        (r, p, before.get(p, 0), after[r].get(p, 0), after[r].get(p, 0) - before.get(p, 0))
        for r in (0, 1)
        for p in parts
    ]
    assert duckdb.sql(breakdown).fetchall() == sorted(rows, key=lambda row: (-abs(row[4]), row[0], row[1]))
    # the bucket lines up although its seq differs and b's own all_reduce, of the same type, comes first in
    # the step; that one is b's alone
    assert [r["seq"] for r in pq.read_table("FLEET/run=b/collectives.parquet").to_pylist() if r["rank"] == 0][
        :3
    ] == [0, 1, 2]
    own, bucket = ("0", "ALL_REDUCE", "c10d::allreduce_", 1), ("0", "ALL_REDUCE", "gloo:all_reduce", 1)
    assert duckdb.sql(collectives).fetchall() == [
        (*own, 0, None, 4, None, 4, None, 20_000, None, 1_000),
        (*own, 1, None, 4, None, 4, None, 0, None, 1_000),
        (*bucket, 0, 3, 4, 4_096, 16_384, 0, 0, 2_000, 2_000),
        (*bucket, 1, 3, 4, 4_096, 16_384, 0, 0, 2_000, 2_000),
    ]
    assert duckdb.sql(ops).fetchall() == [
        (1, "aten::mm", 10_000, 30_000, 20_000),
        (0, "aten::add", 1_000, 5_000, 4_000),
        (0, "aten::mm", 10_000, 10_000, 0),
        (1, "aten::add", 1_000, 1_000, 0),
    ]
    # the pair of each step lines up, rank 1 (the receiver) waiting 4 us in b; the second pair is b's alone
    assert duckdb.sql(p2p).fetchall() == [
        ("0", 0, 1, 0, 1, 0, 3, 4, 1_024, 1_024, 0, 0, 1_000, 1_000),
        ("0", 0, 1, 0, 1, 1, 3, 4, 1_024, 1_024, 0, 4_000, 1_000, 1_000),
        ("0", 0, 1, 0, 2, 0, None, 4, None, 4, None, 0, None, 1_000),
        ("0", 0, 1, 0, 2, 1, None, 4, None, 4, None, 0, None, 1_000),
    ]
    # run a exported by a skewlens before p2p.step (version 12), as an upgraded user keeps it: the docs say
    # the breakdown, collectives and ops queries read it as they are, and the send/recv query fails by name
    # rather than reading its pairs as of no step
    pairs = pq.read_table("FLEET/run=a/p2p.parquet").drop_columns(["step"])
    pq.write_table(
        pairs.replace_schema_metadata({META_VERSION: b"12", META_TABLE: b"p2p"}), "FLEET/run=a/p2p.parquet"
    )
    assert len(duckdb.sql(collectives).fetchall()) == len(duckdb.sql(breakdown).fetchall()) // 3 == 4
    assert len(duckdb.sql(ops).fetchall()) == 4
    with pytest.raises(duckdb.BinderException, match='Referenced column "step" not found'):
        duckdb.sql(p2p).fetchall()
    assert "with a run exported by an older skewlens\nthe query fails" in section


def _without_source(schema: pa.Schema) -> pa.Schema:
    meta = dict(schema.metadata or {})
    assert meta.pop(META_SOURCE).startswith(b"/")
    return schema.with_metadata(meta)


def test_two_runs_exports_have_the_same_schemas_and_an_empty_table_is_a_typed_file(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in range(2):
        b.rank(r).step(0).compute("aten::mm", 1_000 * (r + 1))
    quiet = tmp_path / "quiet"
    no_comm = b.write(tmp_path / "no_comm")
    export_run(no_comm, quiet, workers=1, model=parquet_model(no_comm, lenient=False))
    busy = tmp_path / "busy"
    run = _run(tmp_path)
    export_run(run, busy, workers=1, model=parquet_model(run, lenient=False))
    files = sorted(
        p.relative_to(busy) for p in busy.rglob("*.parquet") if "rank=0" in str(p) or p.parent == busy
    )
    assert len(files) == 3 + len(SINGLE)
    for f in files:  # the same but for the run each names (skewlens.source)
        q, y = (_without_source(pq.read_schema(d / f)) for d in (quiet, busy))
        assert q.equals(y, check_metadata=True), f
    assert pq.read_metadata(quiet / "p2p.parquet").num_rows == 0
    assert pq.read_metadata(quiet / "collectives.parquet").num_rows == 0


def test_the_docs_list_the_columns_of_every_file_analyze_and_replay_write_as_they_write_them(
    tmp_path: Path,
) -> None:
    doc = DOC.read_text()
    assert analysis_markdown() in doc and replay_markdown() in doc
    write_gpu_run(GpuRunSpec(world_size=3, steps=2, layers=2, slow_ranks={1: 1.5}, seed=0), tmp_path / "k")
    run = tmp_path / "run"
    import_traces(sorted((tmp_path / "k").glob("*.json.gz")), None, run)
    # on two hosts, one of two ranks, so that blame_hosts.parquet is written too
    write_manifest(run, dataclasses.replace(read_manifest(run), hosts={0: "a", 1: "a", 2: "b"}))
    an, rp = tmp_path / "an", tmp_path / "rp"
    assert skewlens_main(["analyze", str(run), "--out", str(an), "--no-pictures"]) == 0
    assert skewlens_main(["replay", f"trace={run}", f"out={rp}", "progress=false"]) == 0
    written = {p.name: p for d in (an, rp) for p in d.glob("*.parquet")}
    records = {**ANALYSIS_RECORDS, **REPLAY_RECORDS}
    assert set(written) == set(records) - {SWEEP_PARQUET}  # a GPU run: every analysis; no sweep here
    for name, path in written.items():
        schema = pq.read_schema(path)
        assert schema.equals(arrow_schema(records[name])), name
        assert schema.metadata[META_VERSION] == SCHEMA_VERSION.encode(), name
    export_run(run, tmp_path / "pq", workers=1)
    for path in [*written.values(), *(tmp_path / "pq").rglob("*.parquet")]:
        assert _parquet_types(path) <= SPARK_READS, path


#: The Parquet (physical, logical) types of skewlens' columns, all of which Spark reads without a setting:
#: INT64 (bigint), BYTE_ARRAY STRING (string), BOOLEAN (boolean).
SPARK_READS = {("INT64", "None"), ("BYTE_ARRAY", "String"), ("BOOLEAN", "None")}


def _parquet_types(path: Path) -> set[tuple[str, str]]:
    """The (physical type, logical type) of every leaf column of a file (a list's values included)."""
    schema = pq.ParquetFile(path).schema
    return {(c.physical_type, str(c.logical_type)) for c in (schema.column(i) for i in range(len(schema)))}


@pytest.mark.parametrize("level", ["collectives", "ops"])
def test_the_model_table_holds_the_ends_and_compute_analyze_measures_waits_with(
    tmp_path: Path, level: str
) -> None:
    # DDP hiding its wait for a bucket in a compute gap node (collectives level: the node's work after the
    # wait is compute, the rest not) and in untraced time that ended before gloo recorded the bucket's end
    # (ops level: the model ends the bucket there); names alone say neither
    from test_execution_model import _ddp_collectives_level, _ddp_ops_level

    from skewlens.analysis.index import build_index
    from skewlens.profiler.store.validate import load_validated
    from skewlens.replay.execution import Coverage

    if level == "collectives":
        run_dir = _ddp_collectives_level(tmp_path, 30.0)
    else:
        run_dir = _ddp_ops_level(tmp_path, 30.0, lag_ns=120_000)
    assert export_main([str(run_dir), "--out", str(tmp_path / "pq"), "--workers", "1", "--no-progress"]) == 0
    model = open_dataset(tmp_path / "pq", "model").to_table()
    ix = build_index(load_validated(run_dir))
    clamped = hidden = 0
    for r, ri in ix.ranks.items():
        part = model.filter(pa.compute.equal(model["rank"], r)).sort_by("node_id").to_pydict()
        order = np.argsort(ri.trace.node_id)
        assert part["node_id"] == ri.trace.node_id[order].tolist()
        end, comp = np.asarray(part["end_ns"]), np.asarray(part["compute_ns"])
        assert end.tolist() == ri.end_ns[order].tolist()
        cov = Coverage.of(end - comp, end)
        assert (cov.starts.tolist(), cov.ends.tolist()) == (
            ri.cov_comp.starts.tolist(),
            ri.cov_comp.ends.tolist(),
        )
        recorded = ri.trace.start_ns[order] + ri.trace.dur_ns[order]
        clamped += int((end < recorded).sum())
        hidden += int(((comp > 0) & (comp < ri.trace.dur_ns[order])).sum())
    # what the table says that names do not: 3 ends (a bucket a step) per rank, or 3 gap nodes' compute
    assert (clamped, hidden) == ((0, 6) if level == "collectives" else (6, 0))


def test_the_model_table_names_each_node_by_its_trace_id_not_its_row(tmp_path: Path) -> None:
    # node ids as a converter writes them (from 1000, not the row numbers 0..n-1 our synthetic runs have):
    # each model row joins the nodes row of its id, the all_reduce's end and the compute's length theirs
    b = RunBuilder(world_size=2, first_node_id=1000)
    for rb in (b.rank(r).step(0) for r in range(2)):
        mm = rb.compute("aten::mm", 2_000_000, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 3_000_000, start_ns=2_000_000, deps=(mm,))
    run_dir = b.write(tmp_path / "run")
    export_run(run_dir, tmp_path / "pq", workers=1, model=parquet_model(run_dir, lenient=False))
    con = duckdb.connect()
    for t in ("nodes", "model"):
        con.register(t, open_dataset(tmp_path / "pq", t).to_table())
    joined = con.execute(
        "SELECT n.rank, n.node_id, n.name, m.end_ns, m.compute_ns FROM nodes n "
        "JOIN model m ON m.rank = n.rank AND m.node_id = n.node_id ORDER BY n.rank, n.node_id"
    ).fetchall()
    assert joined == [
        (r, nid, name, end, comp)
        for r in range(2)
        for nid, name, end, comp in [
            (0, "## process_group:init ##", 0, 0),
            (1000, "aten::mm", 2_000_000, 2_000_000),
            (1001, "c10d::all_reduce_", 5_000_000, 0),
        ]
    ]


def test_the_model_table_and_its_row_counts_hold_every_node_of_every_rank(
    exported: tuple[Path, Path],
) -> None:
    run_dir, out = exported
    nodes = sum(len(rt) for rt in load_run(run_dir).ranks.values())
    assert (
        open_dataset(out, "model").count_rows() == nodes == 41
    )  # 3 ranks of 13 (a process-group node, 6 ops, 6 collectives), a send, a recv
    assert json.loads((out / "run.json").read_text())["tables"]["model"]["rows"] == nodes


@pytest.mark.parametrize("written", [0, 1])  # 1: the model failed after rank 0's partition was written
def test_an_export_whose_model_cannot_be_derived_keeps_its_other_tables_and_says_why(
    exported: tuple[Path, Path], tmp_path: Path, written: int
) -> None:
    run_dir, _out = exported

    def refused() -> Iterator[tuple[int, Mapping[str, np.ndarray]]]:
        yield from itertools.islice(parquet_model(run_dir, lenient=False)(), written)
        raise ValidationError(f"{run_dir}: not loaded, 1 problem(s): rank 1 is corrupt")

    out = tmp_path / "nomodel"
    summary = export_run(run_dir, out, workers=1, model=refused)
    assert not (out / "model").exists() and "model" not in summary.rows and summary.rows["collectives"] == 18
    assert "model" not in json.loads((out / "run.json").read_text())["tables"]
    (said,) = [i for i in summary.issues if i.kind == "no-model"]
    assert said.severity is Severity.WARNING
    assert said.message == (
        f"{run_dir}: not loaded, 1 problem(s): rank 1 is corrupt; so the export has no model table (the "
        "execution model's reading)"
    )


def test_the_nodes_table_gives_each_async_sends_call_return_and_null_elsewhere(tmp_path: Path) -> None:
    # nodes.return_ns is skl_return_ns, on the aligned clock: 16 ms for rank 0's isend, null for the rest
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", 10_000_000, start_ns=0)
    r0.send(1, 4096, 20_000_000, start_ns=10_000_000, stream=1000, deps=(f,), return_ns=16_000_000)
    r1.recv(0, 4096, 12_000_000, start_ns=0)
    run = b.write(tmp_path / "run")
    export_run(run, tmp_path / "pq", workers=1)
    tbl = open_dataset(tmp_path / "pq", "nodes").to_table()
    got = {
        (r, n): v
        for r, n, v in zip(*(tbl[c].to_pylist() for c in ("rank", "name", "return_ns")), strict=True)
    }
    assert got[(0, "c10d::send")] == 16_000_000
    assert {k: v for k, v in got.items() if k != (0, "c10d::send")} == dict.fromkeys(
        set(got) - {(0, "c10d::send")}
    )


def _mixed_precision_run(tmp_path: Path) -> Path:
    """2 ranks, 30 steps of FSDP2-like mixed precision: a bf16 all_gather of a 4,096-element shard, a bf16
    reduce_scatter of 8,192 and an fp32 all_reduce of 8,192 (over 48 nodes a rank: the vectorised decoder)."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(30):
            rb.step(s).compute("aten::mm", 10_000)
            rb.collective(CommType.ALL_GATHER, 4096 * 2, 1_000, dtype="bfloat16")
            rb.collective(CommType.REDUCE_SCATTER, 8192 * 2, 1_000, dtype="bfloat16")
            rb.collective(CommType.ALL_REDUCE, 8192 * 4, 1_000)
    return b.write(tmp_path / "run")


@pytest.mark.parametrize("decoder", ["vectorised", "reference"])
def test_a_dtype_takes_one_byte_a_row_and_a_trace_naming_more_dtypes_than_torch_has_is_refused(
    tmp_path: Path, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import skewlens.profiler.store.load as load_module

    monkeypatch.setenv("SKEWLENS_COLUMN_CACHE", "off")
    monkeypatch.setattr(load_module, "MIN_NODES", 0 if decoder == "vectorised" else 10**9)
    rt = load_run(_mixed_precision_run(tmp_path)).ranks[0]
    assert rt.dtype_idx is not None and rt.dtype_idx.dtype == np.int8  # an int32 was 8 MB of 32 GPU ranks
    assert sorted({rt.dtypes[i] for i in rt.dtype_idx.tolist() if i >= 0}) == ["bfloat16", "float32"]
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        for k in range(load_module.MAX_DTYPES + 1):
            rb.collective(CommType.ALL_REDUCE, 64, 1_000, dtype=f"float{k}")
    run = b.write(tmp_path / "many")
    with pytest.raises(
        TraceFormatError,
        match=r"rank-0\.et: rank 0: 128 different skl_dtype names \(a trace holds at most 127\)",
    ):
        load_run(run)


def test_a_trace_naming_as_many_dtypes_as_it_may_loads_each_ones_name(tmp_path: Path) -> None:
    import skewlens.profiler.store.load as load_module

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        for k in range(load_module.MAX_DTYPES):
            rb.collective(CommType.ALL_REDUCE, 64, 1_000, dtype=f"float{k}")
    rt = load_run(b.write(tmp_path / "run")).ranks[1]
    assert rt.dtype_idx is not None
    named = [rt.dtypes[i] for i in rt.dtype_idx.tolist() if i >= 0]
    assert named == [f"float{k}" for k in range(load_module.MAX_DTYPES)]


def test_a_collective_recorded_without_a_dtype_beside_ones_with_is_exported_with_a_null_dtype(
    tmp_path: Path,
) -> None:
    # all_reduces that carry no skl_dtype: null, as a column not recorded is, not '' (a dtype named '')
    run = without_dtype(_mixed_precision_run(tmp_path), frozenset({CommType.ALL_REDUCE}))
    export_run(run, tmp_path / "pq", workers=1, model=None)
    coll = read_table(tmp_path / "pq" / "collectives.parquet").to_pylist()
    assert {(c["comm_type"], c["dtype"]) for c in coll} == {
        ("ALL_GATHER", "bfloat16"),
        ("REDUCE_SCATTER", "bfloat16"),
        ("ALL_REDUCE", None),
    }
    nodes = open_dataset(tmp_path / "pq", "nodes").to_table().to_pylist()
    assert {(n["comm_type"], n["dtype"]) for n in nodes if n["type"] == "COMM_COLL"} == {
        ("ALL_GATHER", "bfloat16"),
        ("REDUCE_SCATTER", "bfloat16"),
        ("ALL_REDUCE", None),
    }


@pytest.mark.parametrize("decoder", ["vectorised", "reference", "cached"])
def test_the_dtype_a_collective_was_recorded_in_is_exported_beside_its_bytes(
    tmp_path: Path, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _mixed_precision_run(tmp_path)
    if decoder == "cached":
        load_run(run)  # writes the column cache, which the export then reads
    else:
        import skewlens.profiler.store.load as load_module

        monkeypatch.setenv("SKEWLENS_COLUMN_CACHE", "off")
        monkeypatch.setattr(load_module, "MIN_NODES", 0 if decoder == "vectorised" else 10**9)
    out = tmp_path / "pq"
    export_run(run, out, workers=1, model=None)
    coll = read_table(out / "collectives.parquet").to_pylist()
    got = {(c["comm_type"], c["comm_bytes"], c["dtype"]) for c in coll}
    assert got == {("ALL_GATHER", 8192, "bfloat16"), ("REDUCE_SCATTER", 16384, "bfloat16"),
                   ("ALL_REDUCE", 32768, "float32")}  # fmt: skip
    assert len(coll) == 2 * 30 * 3
    nodes = open_dataset(out, "nodes").to_table().to_pylist()
    dtypes = {(n["type"], n["comm_type"], n["dtype"]) for n in nodes}
    assert dtypes == {
        ("COMP", None, None), ("METADATA", None, None), ("COMM_COLL", "ALL_GATHER", "bfloat16"),
        ("COMM_COLL", "REDUCE_SCATTER", "bfloat16"), ("COMM_COLL", "ALL_REDUCE", "float32"),
    }  # fmt: skip


def _slow_rank_run(run_dir: Path, *, slow_ms: int) -> Path:
    """2 ranks, 3 steps of 10 ms of compute and an all_reduce; rank 1 does ``slow_ms`` more compute at the
    start of each step, for which rank 0 waits at the all_reduce."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(3):
            rb.step(s)
            if slow_ms and r == 1:
                rb.compute("aten::mm", slow_ms * MS)
            rb.compute("aten::addmm", 10 * MS)
            rb.collective(CommType.ALL_REDUCE, 4_096, (slow_ms if r == 0 else 0) * MS + 2 * MS)
    return b.write(run_dir)


def test_the_documented_replay_of_a_with_bs_slowdown_is_held_to_bs_measured_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Comparing two runs": its export and analyze commands, its replay of run a with rank 1 20 ms slower
    at every step, and its query of predicted against measured step times, on runs where b is a with rank
    1 doing 20 ms more at the start of each step: the prediction is b's steps exactly."""
    _slow_rank_run(tmp_path / "runs" / "before", slow_ms=0)
    _slow_rank_run(tmp_path / "runs" / "after", slow_ms=20)
    section = _section("Comparing two runs")
    analyze, replay = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    for command in [c for line in analyze.splitlines() for c in line.split("&&")] + [replay]:
        argv = shlex.split(command)
        assert argv[0] == "skewlens"
        assert skewlens_main(argv[1:]) == 0, command
    (query,) = [q for q in re.findall(r"```sql\n(.*?)```", section, flags=re.S) if "predicted_ns" in q]
    assert duckdb.sql(query).fetchall() == [(0, 32 * MS, 32 * MS, 0.0), (1, 32 * MS, 32 * MS, 0.0)]
    # and a, unslowed, is 12 ms a step: the replay added the 20 ms where b's rank 1 spent them
    summary = pq.read_table("RP/run=a-slow1/summary.parquet").to_pylist()
    assert {(r["step_time_ns"], r["recorded_step_ns"]) for r in summary} == {(32 * MS, 12 * MS)}


#: A 2-rank DDP script for real captures: one bucket of all the gradients (one ``gloo:all_reduce``), a send
#: from rank 0 to rank 1 each step; with ``OWN = True``, an all_reduce of 4 bytes of its own before the
#: forward (a ``c10d::allreduce_`` of the same type, earlier in the step than the bucket).
DDP_SCRIPT = """
OWN = False
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model = DistributedDataParallel(layers)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    if OWN:
        dist.all_reduce(torch.ones(1))
    model(torch.randn(16, 64)).sum().backward()
    msg = torch.zeros(256)
    if rank == 0:
        dist.send(msg, 1)
    else:
        dist.recv(msg, 0)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""
DDP_GRAD_BYTES = 4 * (64 * 64 + 64 + 64 * 8 + 8)


@pytest.mark.slow
def test_the_documented_two_run_comparison_lines_up_real_captures_whose_new_all_reduce_precedes_the_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collectives and send/recv queries of "Comparing two runs" on two real 2-rank gloo captures: the
    bucket, recorded as ``gloo:all_reduce`` in both, lines up; the script's own all_reduce is b's alone."""
    for name, own in (("before", False), ("after", True)):
        script = tmp_path / f"{name}.py"
        script.write_text(DDP_SCRIPT.replace("OWN = False", f"OWN = {own}"))
        proc = profile(tmp_path / "runs" / name, level="ops", steps="1:1:3", script=script)
        assert proc.returncode == 0, proc.stderr[-2000:]
    section = _section("Comparing two runs")
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]  # export and analyze
    monkeypatch.chdir(tmp_path)
    for command in (c for line in commands.splitlines() for c in line.split("&&")):
        assert skewlens_main(command.split()[1:]) == 0, command
    _breakdown, collectives, _ops, _predicted, p2p = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    lined = {row[:5]: row[5:9] for row in duckdb.sql(collectives).fetchall()}  # -> steps and bytes
    assert lined == {
        **{
            ("0", "ALL_REDUCE", "gloo:all_reduce", 1, r): (3, 3, DDP_GRAD_BYTES, DDP_GRAD_BYTES)
            for r in (0, 1)
        },
        **{("0", "ALL_REDUCE", "c10d::allreduce_", 1, r): (None, 3, None, 4) for r in (0, 1)},
    }
    pairs = {row[:6]: row[6:10] for row in duckdb.sql(p2p).fetchall()}
    assert pairs == {("0", 0, 1, 0, 1, r): (3, 3, 1_024, 1_024) for r in (0, 1)}
    for name in ("a", "b"):  # the step the query reads, p2p.step, is the send node's, as a join gives it
        out = tmp_path / "FLEET" / f"run={name}"
        steps = duckdb.sql(f"SELECT pair, step FROM '{out}/p2p.parquet' ORDER BY pair").fetchall()
        assert steps == duckdb.sql(JOINED_STEPS.format(out=out)).fetchall() and len(steps) >= 3, name


def _night(
    run_dir: Path,
    addmm_ms: tuple[list[float], list[float]],
    gather_bytes: int = 4_096,
    ranks: tuple[int, ...] = (0, 1),
) -> Path:
    """2 ranks, 3 steps of ``aten::addmm`` (rank r's in step s: ``addmm_ms[r][s]``), an all_gather of
    ``gather_bytes`` that transfers for 2 ms after the later rank arrives (the earlier one waits for it),
    then 1 ms of ``aten::add``; the traces of ``ranks`` alone (a rank left out crashed: no trace)."""
    b = RunBuilder(2)
    for r in ranks:
        rb = b.rank(r)
        for s in range(3):
            mine, latest = addmm_ms[r][s], max(addmm_ms[0][s], addmm_ms[1][s])
            rb.step(s).compute("aten::addmm", round(mine * MS))
            rb.collective(
                CommType.ALL_GATHER, gather_bytes, round((latest - mine + 2) * MS), name="c10d::allgather_"
            )
            rb.compute("aten::add", MS)
    return b.write(run_dir)


def test_the_documented_nightly_gate_names_the_op_and_collective_that_regressed_and_not_a_noisy_night(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "Every night: a gate and a dashboard", verbatim: five earlier nights, some with one slow step on a
    rank (contention), one slow throughout (a loaded machine), the first exported by a skewlens before
    ``dtype`` (schema 11); then tonight either with rank 1's addmm 25% slower in every step and the
    all_gather 4 times bigger, or as noisy as the earlier nights. The gate names the op, rank and change, the
    collective and its bytes, and stays quiet on the noisy night; the dashboard gives each night's figures."""
    from skewlens.profiler.store.schema import write_table

    earlier = {
        "2026-12-01": ([10, 30, 10], [10, 10, 10]),  # rank 0's second step 20 ms slower
        "2026-12-02": ([10, 10, 10], [10.2, 10.2, 30]),  # rank 1's least addmm of every night: 10.2 ms
        "2026-12-03": ([9.9, 9.9, 9.9], [10, 10, 10]),
        "2026-12-04": ([14, 14, 14], [14, 14, 14]),  # a loaded machine: above tonight's 12.5 ms
        "2026-12-05": ([10, 10, 10], [10.1, 10.1, 10.1]),
    }
    tonight = {
        "regressed": (([10, 10, 10], [12.5, 12.5, 12.5]), 16_384),
        "noisy": (([10, 30, 10], [10.1, 10.1, 10.1]), 4_096),
    }
    ops, collectives, dashboard = re.findall(
        r"```sql\n(.*?)```", _section("Every night: a gate and a dashboard"), flags=re.S
    )
    (ci,) = re.findall(r"```python\n(.*?)```", _section("Every night: a gate and a dashboard"), flags=re.S)
    found: dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int, str]] = {}
    for case, (ms, gather) in tonight.items():
        root = tmp_path / case
        nights = {**{d: (a, 4_096) for d, a in earlier.items()}, "2026-12-06": (ms, gather)}
        for day, (addmm, size) in nights.items():
            run = _night(root / "runs" / day, addmm, size)
            argv = ["export", str(run), "--out", str(root / "FLEET" / f"run={day}"), "--no-progress"]
            assert skewlens_main(argv) == 0
            argv = ["analyze", str(run), "--out", str(root / "AN" / f"run={day}"), "--no-pictures"]
            assert skewlens_main(argv) == 0
        # the first night as a skewlens before schema 12 wrote it: no dtype in nodes nor collectives
        old = root / "FLEET" / "run=2026-12-01"
        for f, table in [
            (old / "collectives.parquet", "collectives"),
            *((p, "nodes") for p in old.glob("nodes/*/*.parquet")),
        ]:
            v11 = pq.read_table(f).drop_columns(["dtype"])
            write_table(v11.replace_schema_metadata({META_VERSION: b"11", META_TABLE: table.encode()}), f)
        # tonight's export and analysis killed once before they finished (the run exported again since)
        fleet, an = root / "FLEET" / "run=2026-12-06", root / "AN" / "run=2026-12-06"
        _killed_beside(fleet, ["nodes/rank=1/part-0.parquet", "collectives.parquet"], fleet)
        _killed_beside(an, ["step_breakdown.parquet", "blame.parquet"], an)
        monkeypatch.chdir(root)
        (root / "gate_ops.sql").write_text(ops)
        (root / "gate_collectives.sql").write_text(collectives)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            exec(ci, {})  # the docs' CI snippet, verbatim
        found[case] = (
            duckdb.sql(ops).fetchall(),
            duckdb.sql(collectives).fetchall(),
            int(exited.value.code or 0),
            capsys.readouterr().out,
        )
    night = datetime.date(2026, 12, 6)
    gate_ops, gate_collectives, code, said = found["regressed"]
    # rank 1's least addmm of a step: 12.5 ms tonight, 10.2 ms before but for the loaded night's 14 ms (the
    # largest of five is left out); rank 0's slow steps are no night's least, so they do not count
    assert gate_ops == [(night, 1, "aten::addmm", 10_200_000, 12_500_000, 2_300_000)]
    # the all_gather's bytes on both ranks; its transfer, 2 ms every night, is not a change
    gather = ("0", "ALL_GATHER", "c10d::allgather_", 1)
    assert gate_collectives == [(night, *gather, r, 4_096, 16_384, 2 * MS, 2 * MS) for r in (0, 1)]
    assert code == 1
    assert said.splitlines()[0] == (
        "gate_ops.sql {'run': datetime.date(2026, 12, 6), 'rank': 1, 'name': 'aten::addmm', "
        "'earlier_ns': 10200000, 'tonight_ns': 12500000, 'change_ns': 2300000}"
    )
    assert len(said.splitlines()) == 3
    assert found["noisy"][:3] == ([], [], 0)
    # the next night rank 1 crashed and left no trace (analyze warns and exits 0): its steps are rank 0's
    # alone, a whole night's figures to read but for incomplete_steps, which the dashboard did not have
    crashed = _night(tmp_path / "noisy" / "runs" / "2026-12-07", ([10, 10, 10], [10, 10, 10]), ranks=(0,))
    an = tmp_path / "noisy" / "AN" / "run=2026-12-07"
    assert skewlens_main(["analyze", str(crashed), "--out", str(an), "--no-pictures"]) == 0
    # the dashboard: 3 steps a night; a step lasts as long as the slower rank's addmm and 3 ms more; the
    # earlier rank waits for the later at the all_gather (exposed), then both transfer 2 ms
    rows = duckdb.sql(dashboard).fetchall()  # the noisy fleet's, the last one entered
    steps = {**earlier, "2026-12-06": tonight["noisy"][0]}
    for (day, n, incomplete, step_ns, exposed_ns, _rank, _cost), (want_day, addmm) in zip(
        rows[:-1], steps.items(), strict=True
    ):
        longest = [max(addmm[0][s], addmm[1][s]) for s in range(3)]
        apart = [abs(addmm[0][s] - addmm[1][s]) for s in range(3)]
        assert (str(day), n, incomplete) == (want_day, 3, 0)
        assert step_ns == round(sum(x + 3 for x in longest) * MS / 3)
        assert exposed_ns == round(sum(x + 2 for x in apart) * MS / 3)
    assert rows[-1] == (datetime.date(2026, 12, 7), 3, 3, 13 * MS, 2 * MS, None, None)
    # blame compares typical steps: night 1's one slow step on rank 0 costs nothing (no straggler), rank 1's
    # 0.2 ms more of every step of night 2 (and its slow third step) costs 0.99 ms over the 3 steps
    assert [(str(d), r, c) for d, _n, _i, _s, _e, r, c in rows] == [
        ("2026-12-01", None, None),
        ("2026-12-02", 1, 329_412),
        ("2026-12-03", 1, 100_000),
        ("2026-12-04", None, None),  # every rank alike
        ("2026-12-05", 1, 100_000),
        ("2026-12-06", 1, 66_667),
        ("2026-12-07", None, None),  # one rank: no peers to compare with
    ]


def _drifting(run_dir: Path, *, steps: int, since: int, grow_ns: int) -> Path:
    """2 ranks, ``steps`` steps of 10 ms of ``aten::mm``, an all_reduce that transfers for 2 ms after the
    later rank arrives (the earlier one waits for it), then 1 ms of ``aten::add``; rank 1's mm ``grow_ns``
    longer each step from step ``since`` on."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(steps):
            mm = [10 * MS, 10 * MS + grow_ns * max(0, s - since)]
            rb.step(s).compute("aten::mm", mm[r])
            rb.collective(CommType.ALL_REDUCE, 4_096, max(mm) - mm[r] + 2 * MS)
            rb.compute("aten::add", MS)
    return b.write(run_dir)


def test_the_documented_drift_queries_give_a_slower_ranks_growth_per_step_and_the_step_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "A rank that gets slower step by step", verbatim: rank 1 of 2 does 0.5 ms more each step from step 8
    of 40. Before, analyze gave means alone, and nothing said how to read the trend from its tables."""
    steps, since, grow = 40, 8, MS // 2
    run = _drifting(tmp_path / "run", steps=steps, since=since, grow_ns=grow)
    monkeypatch.chdir(tmp_path)
    assert skewlens_main(["analyze", str(run), "--out", "AN", "--no-pictures"]) == 0
    per_step, trend, began = re.findall(
        r"```sql\n(.*?)```", _section("A rank that gets slower step by step"), flags=re.S
    )
    # each rank's compute a step, by hand: the mm and the add; rank 0 costs nothing (it waits), rank 1 its
    # growth while the what-if's step stays its peer's (its typical mm is 15.75 ms: to step 19)
    compute = {r: [11 * MS + (grow * max(0, s - since) if r else 0) for s in range(steps)] for r in (0, 1)}
    rows = duckdb.sql(per_step).fetchall()
    assert [row[:3] for row in rows] == [(r, s, compute[r][s]) for r in (0, 1) for s in range(steps)]
    cost = {(r, s): c for r, s, _c, c in rows}
    assert [cost[0, s] for s in range(steps)] == [0] * steps
    assert [cost[1, s] for s in range(20)] == [grow * max(0, s - since) for s in range(20)]
    # the fitted lines: the compute's from the input; the cost's from the costs, less than the compute's
    x = np.arange(steps)
    want = {}
    for r in (0, 1):
        y = np.asarray(compute[r], dtype=float)
        c = np.asarray([cost[r, s] for s in range(steps)], dtype=float)
        want[r] = (
            steps,
            round(np.polyfit(x, y, 1)[0]),
            round(np.corrcoef(x, y)[0, 1] ** 2, 3) if r else 1.0,  # a value that never changes: 1, slope 0
            round(np.polyfit(x, c, 1)[0]),
            round(np.corrcoef(x, c)[0, 1] ** 2, 3) if r else 1.0,
        )
    got = duckdb.sql(trend).fetchall()
    assert [row[0] for row in got] == [1, 0]
    assert {row[0]: row[1:] for row in got} == want
    assert want[0][1:] == (0, 1.0, 0, 1.0)
    assert 0 < want[1][3] < want[1][1] and want[1][2] > 0.9
    # since which step: rank 1's first five steps cost nothing; its first over 1 ms is the third of growth
    assert duckdb.sql(began).fetchall() == [(1, since + MS // grow + 1, 0.0)]


def _four_ranks_one_all_reduce(tmp_path: Path) -> Path:
    b = RunBuilder(world_size=4)
    _ = [b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000_000) for r in range(4)]
    return b.write(tmp_path / "run")


def test_a_collectives_group_size_counts_the_members_without_a_trace_in_an_export_that_allows_errors(
    tmp_path: Path,
) -> None:
    # one host's traces lost: ranks 2 and 3 of the world group of 4; the rows were counted as the group's size
    run = _four_ranks_one_all_reduce(tmp_path)
    _ = [(run / f"rank-{r}.et").unlink() for r in (2, 3)]
    export_run(run, tmp_path / "pq", strict=False, workers=1)
    rows = read_table(tmp_path / "pq" / "collectives.parquet").to_pylist()
    assert [(c["rank"], c["group_size"]) for c in rows] == [(0, 4), (1, 4)]


def test_an_export_that_allows_errors_lists_the_ranks_it_has_no_trace_of_among_its_manifests_missing_ranks(
    tmp_path: Path,
) -> None:
    # rank 2's trace deleted after the capture: the copied manifest said ranks [0, 1, 2, 3], missing_ranks []
    run = _four_ranks_one_all_reduce(tmp_path)
    (run / "rank-2.et").unlink()
    (run / "rank-3.et").write_bytes(b"\x00garbage")  # unreadable: no trace either
    export_run(run, tmp_path / "pq", strict=False, workers=1)
    got = read_manifest(tmp_path / "pq")
    assert (got.ranks, got.missing_ranks) == ((0, 1), (2, 3))
    assert sorted(read_table(tmp_path / "pq" / "ranks.parquet").column("rank").to_pylist()) == [0, 1]
