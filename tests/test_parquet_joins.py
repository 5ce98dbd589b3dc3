"""What a query over several runs' Parquet needs without reading manifest.json: each send/recv pair's step
(``p2p.step``), the process groups (``groups.parquet``), and which run an analysis or replay file is of
(``skewlens.source`` / ``skewlens.run_id`` in its key-value metadata)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from skewlens.cli import main as skewlens_main
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store import load_run
from skewlens.profiler.store.fast import MIN_NODES
from skewlens.profiler.store.parquet import export_run, open_dataset
from skewlens.profiler.store.schema import (
    META_RUN_ID,
    META_SOURCE,
    META_STARTED,
    META_TABLE,
    META_VERSION,
    P2PRecord,
    read_table,
    write_table,
)
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "parquet.md"

#: The send's step (its node's) of the nodes join the docs used before ``p2p.step``.
JOINED_STEPS = """
SELECT p.pair, n.step
FROM read_parquet('{out}/p2p.parquet') p
JOIN read_parquet('{out}/nodes/*/*.parquet', hive_partitioning = true) n
  ON n.rank = p.src_rank AND n.node_id = p.send_node_id
ORDER BY p.pair
"""


def _pipeline_run(run_dir: Path, *, pad: int = 0) -> Path:
    """3 ranks, 3 steps: rank 0 sends to 1 in each step, rank 1 receives it in the next step (its steps
    lag); rank 2 sends to 0 twice in step 1; one pair before any step (-1). ``pad``: that many compute
    nodes first on each rank."""
    b = RunBuilder(3)
    r0, r1, r2 = b.rank(0), b.rank(1), b.rank(2)
    for rb in (r0, r1, r2):
        for _ in range(pad):
            rb.compute("aten::add", 100)
    r0.send(1, 8, 1_000, tag=3)
    r1.recv(0, 8, 1_000, tag=3)
    for s in range(3):
        r0.step(s).compute("aten::mm", 10_000)
        r0.send(1, 1_024 * (s + 1), 1_000)
        r1.step(s + 1).compute("aten::mm", 10_000)
        r1.recv(0, 1_024 * (s + 1), 1_000)
        r2.step(s).compute("aten::add", 10_000)
        if s == 1:
            for _ in range(2):
                r2.send(0, 64, 500)
                r0.recv(2, 64, 500)
    return b.write(run_dir)


def _exported(build: Callable[[Path], Path], tmp_path: Path) -> tuple[Path, Path]:
    """A run ``build`` writes into ``tmp_path / "run"``, exported to ``tmp_path / "pq"``."""
    run_dir = build(tmp_path / "run")
    export_run(run_dir, tmp_path / "pq", workers=1)
    return run_dir, tmp_path / "pq"


def test_each_pairs_step_is_its_sends_step_as_the_documented_join_of_nodes_gave_it(tmp_path: Path) -> None:
    run_dir, out = _exported(_pipeline_run, tmp_path)
    rows = read_table(out / "p2p.parquet", P2PRecord).to_pylist()
    joined = duckdb.sql(JOINED_STEPS.format(out=out)).fetchall()
    assert [(r["pair"], r["step"]) for r in rows] == joined
    # by hand: the send's step, not the recv's (rank 1 received each a step later), -1 before any step
    by_pair = {(r["src_rank"], r["dst_rank"], r["comm_bytes"]): r["step"] for r in rows}
    assert by_pair == {(0, 1, 8): -1, (0, 1, 1_024): 0, (0, 1, 2_048): 1, (0, 1, 3_072): 2, (2, 0, 64): 1}
    run = load_run(run_dir)
    assert [r["step"] for r in rows] == [int(run.ranks[p.src_rank].step[p.src_row]) for p in run.p2p]


def test_a_p2p_file_of_version_12_reads_with_a_null_step_and_an_export_of_it_has_no_groups_table(
    tmp_path: Path,
) -> None:
    _run_dir, out = _exported(_pipeline_run, tmp_path)
    f = out / "p2p.parquet"
    v12 = pq.read_table(f).drop_columns(["step"])
    write_table(v12.replace_schema_metadata({META_VERSION: b"12", META_TABLE: b"p2p"}), f)
    tbl = read_table(f, P2PRecord)
    assert tbl["step"].to_pylist() == [None] * 6
    assert tbl["comm_bytes"].to_pylist() == v12["comm_bytes"].to_pylist()
    assert open_dataset(out, "p2p").to_table(columns=["pair", "step"])["step"].null_count == 6
    (out / "groups.parquet").unlink()
    prov = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**prov, "schema_version": "12"}))
    with pytest.raises(
        SkewlensError,
        match=r"no groups table: groups\.parquet is missing \(by a skewlens before schema version 13; this "
        r"export is version 12\); export the run again for it: skewlens export .*run --out .*pq$",
    ):
        open_dataset(out, "groups")


def _grouped_run(run_dir: Path) -> Path:
    """4 ranks, the world group and two more; group ``5`` is created with its members out of rank order,
    and its manifest entry gets a description and a backend of its own; the world group is listed with no
    ranks (as PyTorch lists a group that spans the world)."""
    b = RunBuilder(4, groups={"0": (0, 1, 2, 3), "5": (3, 1), "7": (0, 2)})
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 10_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, 4_096, 2_000, pg="0")
        rb.collective(CommType.BROADCAST, 512, 1_000, pg="5" if r in (1, 3) else "7")
    b.write(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for g in manifest["process_groups"]:
        if g["name"] == "5":
            g.update(desc="same_b", backend="cpu:gloo,cuda:nccl")
        if g["name"] == "0":
            g["ranks"] = []
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def test_the_groups_table_gives_each_groups_description_members_in_group_order_and_backend(
    tmp_path: Path,
) -> None:
    run_dir, out = _exported(_grouped_run, tmp_path)
    rows = open_dataset(out, "groups").to_table().to_pylist()
    assert rows == [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3], "backend": "gloo"},
        {"pg_name": "5", "pg_desc": "same_b", "ranks": [3, 1], "backend": "cpu:gloo,cuda:nccl"},
        {"pg_name": "7", "pg_desc": "7", "ranks": [0, 2], "backend": "gloo"},
    ]
    run = load_run(run_dir)  # as the store holds them, in its order
    want = [(n, run.process_groups[n].desc, list(run.process_groups[n].ranks)) for n in run.pg_names]
    assert [(r["pg_name"], r["pg_desc"], r["ranks"]) for r in rows] == want
    assert json.loads((out / "run.json").read_text())["tables"]["groups"]["rows"] == 3


def _doc_sql(marker: str) -> str:
    (query,) = [q for q in re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S) if marker in q]
    return query


def test_the_documented_longest_waits_by_group_name_each_group_by_description_and_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_dir, out = _exported(_grouped_run, tmp_path)
    monkeypatch.chdir(out)
    named = duckdb.sql(_doc_sql("'groups.parquet'")).fetchall()
    plain = duckdb.sql(_doc_sql("FROM 'collectives.parquet'\n)\nSELECT pg_name")).fetchall()
    groups = {"0": ("default_pg", [0, 1, 2, 3], "gloo"), "5": ("same_b", [3, 1], "cpu:gloo,cuda:nccl")}
    groups["7"] = ("7", [0, 2], "gloo")
    assert named == [(g, *groups[g], s, t, r, w) for g, s, t, r, w in plain]
    assert len(named) == 8 and {row[1] for row in named} == {"default_pg", "same_b", "7"}


def _kv(path: Path) -> dict[bytes, bytes]:
    return dict(pq.read_schema(path).metadata or {})


def test_analyze_and_replay_files_name_their_runs_path_and_job_id_for_pyarrow_and_duckdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _pipeline_run(tmp_path / "runs" / "a")
    _grouped_run(tmp_path / "runs" / "b")
    manifest = json.loads((tmp_path / "runs" / "b" / "manifest.json").read_text())
    manifest["run_identity"] = {"run_id": "job-7", "rendezvous": "node0:29500", "started_ns": 1}
    (tmp_path / "runs" / "b" / "manifest.json").write_text(json.dumps(manifest))
    for name in ("a", "b"):  # named relative to the cwd: the files give the absolute path
        assert skewlens_main(["analyze", f"runs/{name}", "--out", f"AN/run={name}", "--no-pictures"]) == 0
    assert skewlens_main(["replay", "trace=runs/b", "out=RP", "perfetto=false"]) == 0
    source = {n: str((tmp_path / "runs" / n).resolve()).encode() for n in ("a", "b")}
    for name in ("a", "b"):
        files = sorted((tmp_path / "AN" / f"run={name}").glob("*.parquet"))
        assert len(files) >= 5
        for f in files:
            kv = _kv(f)
            assert kv[META_SOURCE] == source[name], f
            assert kv.get(META_RUN_ID) == (b"job-7" if name == "b" else None), f
    for f in ("timeline.parquet", "summary.parquet"):
        assert (_kv(tmp_path / "RP" / f)[META_SOURCE], _kv(tmp_path / "RP" / f)[META_RUN_ID]) == (
            source["b"],
            b"job-7",
        )
    section = DOC.read_text().split("## Which run a file is of", 1)[1].split("\n## ", 1)[0]
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    scope: dict[str, Any] = {}
    exec(python, scope)  # the docs' snippet, verbatim: run a has no job id
    assert (scope["source"], scope["run_id"], scope["started_ns"]) == (source["a"].decode(), "", 0)
    (sql,) = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    steps = {
        name: {
            r["rank"]: r["step_ns"]
            for r in pq.read_table(tmp_path / "AN" / f"run={name}" / "step_breakdown.parquet").to_pylist()
        }
        for name in ("a", "b")
    }
    assert steps["a"] and steps["b"]
    got = duckdb.sql(sql).fetchall()
    assert [(s, i, t, r) for s, i, t, r, _n, _ns in got] == [
        (source[n].decode(), "job-7" if n == "b" else None, 1 if n == "b" else None, r)
        for n in sorted(source)
        for r in sorted(steps[n])
    ]


def _captured(run_dir: Path, started_ns: int) -> Path:
    """A capture of the pipeline program into ``run_dir`` (replacing what is there) that began at
    ``started_ns``, by a one-host torchrun job given no ``--rdzv-id`` (its run id torchrun's ``none``)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    _pipeline_run(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["run_identity"] = {"run_id": "none", "rendezvous": "127.0.0.1:29500", "started_ns": started_ns}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def test_two_captures_into_the_same_path_are_told_apart_by_every_export_and_analysis_file_by_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    started = {"mon": 1_765_000_000_123_456_789, "tue": 1_765_086_400_987_654_321}
    for day, ns in started.items():  # the same program, into the same path, a day apart
        _captured(tmp_path / "runs" / "x", ns)
        assert skewlens_main(["export", "runs/x", "--out", f"FLEET/run={day}", "--no-progress"]) == 0
        assert skewlens_main(["analyze", "runs/x", "--out", f"AN/run={day}", "--no-pictures"]) == 0
    source = str((tmp_path / "runs" / "x").resolve()).encode()
    for day, ns in started.items():
        files = sorted((tmp_path / "FLEET" / f"run={day}").rglob("*.parquet"))
        tables = {_kv(f)[META_TABLE] for f in files}
        assert tables >= {b"nodes", b"deps", b"collectives", b"p2p", b"ranks", b"groups"}
        files += sorted((tmp_path / "AN" / f"run={day}").glob("*.parquet"))
        for f in files:  # the same path; no job id (torchrun's none names no run); the capture's start
            kv = _kv(f)
            said = (kv[META_SOURCE], kv.get(META_RUN_ID), kv[META_STARTED])
            assert said == (source, None, str(ns).encode()), f
    runs = duckdb.sql(
        """
        SELECT decode(max(value) FILTER (WHERE key = encode('skewlens.source'))) AS source,
               decode(max(value) FILTER (WHERE key = encode('skewlens.run_id'))) AS run_id,
               CAST(decode(max(value) FILTER (WHERE key = encode('skewlens.started_ns'))) AS BIGINT)
                 AS started_ns
        FROM parquet_kv_metadata('FLEET/run=*/collectives.parquet')
        GROUP BY file_name
        ORDER BY started_ns
        """
    ).fetchall()
    assert runs == [(source.decode(), None, started["mon"]), (source.decode(), None, started["tue"])]


def test_the_new_columns_are_the_same_whether_the_ranks_were_decoded_or_read_from_the_column_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column cache holds the decoder's columns, not the store's reading of them (its format version is
    unchanged): an export made from the cache gives each pair the step and each group the row that one
    decoding each trace does."""
    run_dir = _pipeline_run(tmp_path / "run", pad=MIN_NODES)  # files the cache keeps
    tables = {}
    for cache in ("off", "on", "on"):  # the second "on" reads what the first wrote
        monkeypatch.setenv("SKEWLENS_COLUMN_CACHE", cache)
        out = tmp_path / f"pq-{len(tables)}"
        export_run(run_dir, out, workers=1)
        tables[out.name] = [read_table(out / f"{t}.parquet").to_pylist() for t in ("p2p", "groups")]
    assert len(list((run_dir / ".skewlens-cache").glob("*.arrow"))) == 3
    first, *rest = tables.values()
    assert all(t == first for t in rest) and [r["step"] for r in first[0]] == [0, 1, 2, -1, 1, 1]
