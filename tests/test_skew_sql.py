"""``analysis/sql/collective_skew.sql``, run by DuckDB on ``skewlens export``'s Parquet, gives what
``skewlens analyze`` writes to ``collective_skew.parquet``: row for row, every column the query has, on CPU
and GPU runs alike. Where the execution model reads a node otherwise than its name says (a host op that
synchronised on the GPU, a capture gap node that hid a wait, a lagged completion it ends earlier), the query
reads the model from the export's ``model`` table.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skewlens.analysis.api import SKEW_FILE
from skewlens.analysis.index import build_index
from skewlens.analysis.records import CollectiveSkewRecord
from skewlens.analysis.sql import (
    COLLECTIVE_SKEW_SQL_COLUMNS,
    NOT_IN_SQL,
    SQL_TABLES,
    collective_skew_sql,
)
from skewlens.cli import main as skewlens_main
from skewlens.profiler.manifest import LostCollectives, read_manifest, write_manifest
from skewlens.profiler.store.parquet import PARTITIONED
from skewlens.profiler.store.schema import arrow_schema, read_table
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import UNTRACED_NODE_NAME, WAIT_NODE_NAMES, CommType

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "parquet.md"
GROUPS = {"0": (0, 1, 2, 3), "tp0": (0, 1), "tp1": (2, 3), "odd": (0, 1, 3)}
#: Times are multiples of this, so that members often arrive at the same time (ties in late / median).
GRID_NS = 50_000
Row = dict[str, Any]


def _skewed_run(out: Path, seed: int, steps: int = 3) -> Path:
    """4 ranks, ``steps`` steps of seeded compute with a straggler (rank ``seed % 4``): an all_reduce on the
    world, all_gathers in pairs, a reduce_scatter of 3 ranks, an asynchronous all_reduce on its own stream
    waited for under compute, sends from 1 to 2 and from 3 to 0 in two groups (some eager), a second thread
    whose ops overlap the first's, a wait node and untraced host time on it (neither is compute), and rooted
    collectives (a root of every rank in turn; a reduce; a root that is no member)."""
    rng = random.Random(seed)
    b = RunBuilder(4, groups=GROUPS)
    ranks = [b.rank(r) for r in range(4)]
    t = [0] * 4  # each rank's host thread (stream 0) is busy until t[r]

    def grid(*choices: int) -> int:
        return rng.choice(choices) * GRID_NS

    def collective(ctype: CommType, pg: str, root: int | None = None) -> None:
        members = GROUPS[pg]
        arrive = {r: t[r] + grid(0, 0, 1) for r in members}
        last, transfer = max(arrive.values()), grid(0, 1, 2)
        for r in members:
            # what the member waits for (docs/execution.md, rooted collectives): the last arrival; with a
            # root, a broadcast member the root, the root no one; a scatter or gather member the root
            if root not in members or (r == root and ctype != CommType.BROADCAST):
                awaited = last
            else:
                awaited = arrive[root] if r != root else arrive[r]
            # now and then a member leaves early (its call returned before the others arrived)
            end = arrive[r] + GRID_NS if rng.random() < 0.15 else max(awaited, arrive[r]) + transfer
            ranks[r].collective(ctype, 4096, end - arrive[r], pg=pg, start_ns=arrive[r], root=root)
            t[r] = end

    def pair(src: int, dst: int, pg: str, tag: int) -> None:
        s = t[src] + grid(0, 1, 4)
        eager = rng.random() < 0.5  # the send returns at once, before the recv is posted
        d = max(s, t[dst]) + grid(2, 3) if eager else t[dst] + grid(0, 1, 4)
        done = max(s, d) + grid(1, 2)
        ranks[src].send(dst, 512, GRID_NS if eager else done - s, tag=tag, pg=pg, start_ns=s)
        ranks[dst].recv(src, 512, done - d, tag=tag, pg=pg, start_ns=d)
        t[src], t[dst] = s + (GRID_NS if eager else done - s), done

    for step in range(steps):
        for r in range(4):
            ranks[r].step(step)
            dur = grid(2, 4, 6) + (8 * GRID_NS if r == seed % 4 else 0)
            ranks[r].compute("aten::mm", dur, start_ns=t[r])
            if rng.random() < 0.6:  # another thread's op, overlapping the end of this one
                ranks[r].compute("aten::add", grid(1, 3, 8), start_ns=t[r] + dur - GRID_NS, stream=7)
            t[r] += dur
        collective(CommType.ALL_REDUCE, "0")
        for r in range(4):  # host time on the second thread, during the next waits
            name = UNTRACED_NODE_NAME if r % 2 else sorted(WAIT_NODE_NAMES)[step % 2]
            ranks[r].compute(name, grid(2, 4), start_ns=t[r], stream=7)
        collective(CommType.ALL_GATHER, "tp0")
        collective(CommType.ALL_GATHER, "tp1")
        collective(CommType.REDUCE_SCATTER, "odd")
        # rooted collectives, each rank a root in turn; a root that is no member is unknown
        collective(CommType.BROADCAST, "0", root=step % 4)
        collective(CommType.SCATTER, "odd", root=(0, 1, 3)[step % 3])
        collective(CommType.GATHER, "tp1", root=2 + step % 2)
        collective(CommType.REDUCE, "0", root=(step + 1) % 4)
        collective(CommType.BROADCAST, "tp0", root=3)
        pair(1, 2, "0", 3)
        pair(3, 0, "odd", 0)
        pair(1, 2, "0", 3)
        # an empty all_reduce (PowerSGD's DDP hook, each step): each member returns at once, waits for no one
        for r in range(4):
            ranks[r].collective(CommType.ALL_REDUCE, 0, GRID_NS, start_ns=t[r])
            t[r] += GRID_NS
        # an asynchronous all_reduce on stream 1, issued now; compute goes on while it waits for the others
        issued = [t[r] + grid(0, 1, 3) for r in range(4)]
        done = max(issued) + grid(1, 2)
        for r in range(4):
            ranks[r].collective(CommType.ALL_REDUCE, 1 << 16, done - issued[r], start_ns=issued[r], stream=1)
            ranks[r].compute("aten::mul", grid(1, 5, 9), start_ns=t[r])
            t[r] = max(t[r] + GRID_NS, done)
    return b.write(out / "run")


def _views(con: duckdb.DuckDBPyConnection, parquet_dir: Path) -> None:
    """The tables the query reads, as its header says to register them."""
    for t in SQL_TABLES:
        if t in PARTITIONED:
            files = f"'{parquet_dir}/{t}/*/*.parquet', hive_partitioning = true"
        else:
            files = f"'{parquet_dir}/{t}.parquet'"
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({files})")


def _sql_rows(parquet_dir: Path, sql: str | None = None) -> list[Row]:
    con = duckdb.connect()
    _views(con, parquet_dir)
    rel = con.sql(sql or collective_skew_sql())
    assert tuple(rel.columns) == COLLECTIVE_SKEW_SQL_COLUMNS
    # the columns' types are the table's (64-bit integers; strings)
    want = arrow_schema(CollectiveSkewRecord)
    for name, t in zip(rel.columns, rel.types, strict=True):
        assert str(t) == ("BIGINT" if want.field(name).type == pa.int64() else "VARCHAR"), name
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def _key(r: Row) -> tuple[str, str, int, int]:
    return (r["kind"], r["pg_name"], r["seq"], r["rank"])


def _export_and_analyze(run_dir: Path, work: Path) -> tuple[list[Row], list[Row]]:
    """(rows of the SQL on the export, rows ``skewlens analyze`` wrote), both by their unique key."""
    assert skewlens_main(["export", str(run_dir), "--out", str(work / "parquet"), "--workers", "1"]) == 0
    args = ["analyze", str(run_dir), "--out", str(work / "analysis"), "--no-blame", "--no-pictures"]
    assert skewlens_main(args) == 0
    written = pq.read_table(work / "analysis" / SKEW_FILE).to_pylist()
    got = sorted(_sql_rows(work / "parquet"), key=_key)
    assert len({_key(r) for r in got}) == len(got)
    return got, sorted(written, key=_key)


def _model_waits_overlap(run_dir: Path, rows: list[Row]) -> list[int]:
    """Per row: how long its wait overlaps COMP rows that the execution model counts as waiting though
    their names do not say so (host ops that synchronised on the GPU, gap nodes that waited): where a
    query reading names alone would count compute."""
    ix = build_index(load_validated(run_dir))
    out = []
    for r in rows:
        ri = ix.ranks[r["rank"]]
        rt = ri.trace
        named = np.isin(np.asarray(rt.names, dtype=object)[rt.name_idx], sorted(WAIT_NODE_NAMES))
        extra = np.flatnonzero(ri.is_wait & ~named)
        a, b = r["arrival_ns"], r["arrival_ns"] + r["wait_ns"]
        lo, hi = np.maximum(rt.start_ns[extra], a), np.minimum(ri.end_ns[extra], b)
        out.append(int(np.maximum(hi - lo, 0).sum()))
    return out


def _assert_equal_where_the_model_reads_no_name(run_dir: Path, got: list[Row], written: list[Row]) -> None:
    """Every SQL column equal row for row, on a run where some waits overlap nodes the model counts as
    waiting though their names do not say so."""
    assert got == [{c: r[c] for c in COLLECTIVE_SKEW_SQL_COLUMNS} for r in written]
    assert sum(o > 0 for o in _model_waits_overlap(run_dir, written)) > 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_sql_on_the_export_gives_the_skew_table_analyze_writes(tmp_path: Path, seed: int) -> None:
    run_dir = _skewed_run(tmp_path, seed)
    got, written = _export_and_analyze(run_dir, tmp_path)
    assert got == [{c: r[c] for c in COLLECTIVE_SKEW_SQL_COLUMNS} for r in written]
    # the runs exercise what the query must get right: skew, ties, clamped waits, hidden waits, both kinds
    assert {r["kind"] for r in got} == {"collective", "p2p"}
    late = {r["late_rank"] for r in got if r["kind"] == "collective"}
    assert seed % 4 in late and len(late) >= 3
    assert any(r["skew_ns"] > 0 for r in got) and any(r["skew_ns"] == 0 for r in got)
    assert any(0 < r["exposed_wait_ns"] < r["wait_ns"] for r in got)
    last: dict[tuple[str, str, int], int] = {}
    for r in got:
        last[_key(r)[:3]] = max(last.get(_key(r)[:3], 0), r["arrival_ns"])
    # a member that left before the last arrived (an eager send) waited only as long as its call lasted
    assert any(r["wait_ns"] < last[_key(r)[:3]] - r["arrival_ns"] for r in got)
    # an empty all_reduce makes no one wait, though its members arrive apart
    empty = [r for r in got if r["comm_type"] == "ALL_REDUCE" and r["arrival_ns"] < last[_key(r)[:3]]]
    assert any(r["end_ns"] - r["arrival_ns"] == GRID_NS and r["wait_ns"] == 0 for r in empty)
    # rooted collectives follow the model's rule: a root (a broadcast's, scatter's or gather's) is the late
    # member though another arrived after it, and a broadcast root waits for no one
    last_rank = {_key(r)[:3]: r["rank"] for r in sorted(got, key=lambda r: (r["arrival_ns"], r["rank"]))}
    rooted = [r for r in got if r["comm_type"] in ("BROADCAST", "SCATTER", "GATHER")]
    assert any(r["late_rank"] != last_rank[_key(r)[:3]] for r in rooted)
    assert any(
        r["comm_type"] == "BROADCAST"
        and r["rank"] == r["late_rank"]
        and r["wait_ns"] == 0
        and r["arrival_ns"] < last[_key(r)[:3]]
        for r in rooted
    )


def test_rows_come_in_the_order_analyze_writes_them_where_last_arrivals_differ(tmp_path: Path) -> None:
    """Analyze orders events by last arrival, ties by the store's numbering of the groups; the SQL breaks
    ties by group name. Without ties the orders agree."""
    b = RunBuilder(2, groups={"b": (0, 1), "a": (0, 1)})
    for r in range(2):
        rb = b.rank(r)
        rb.compute("aten::mm", 100_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, 64, 50_000, pg="b")
        rb.collective(CommType.BROADCAST, 64, 50_000, pg="a")
        rb.send(1 - r, 8, 10_000)
        rb.recv(1 - r, 8, 10_000)
    run_dir = b.write(tmp_path / "run")
    skewlens_main(["export", str(run_dir), "--out", str(tmp_path / "pq"), "--workers", "1"])
    skewlens_main(["analyze", str(run_dir), "--out", str(tmp_path / "an"), "--no-blame", "--no-pictures"])
    written = pq.read_table(tmp_path / "an" / SKEW_FILE).to_pylist()
    got = _sql_rows(tmp_path / "pq")
    assert [_key(r) for r in got] == [_key(r) for r in written]
    assert [r["pg_name"] for r in got][:4] == ["b", "b", "a", "a"]


def test_collectives_a_flight_recorder_lost_are_left_out_of_the_export_as_analyze_leaves_them_out(
    tmp_path: Path,
) -> None:
    b = RunBuilder(3)
    for r in range(3):
        rb = b.rank(r)
        for step in range(3):
            rb.step(step).compute("aten::mm", 100_000 * (1 + r * step))
            if r != 1 or step != 1:  # rank 1's recorder lost the collective of step 1
                rb.collective(CommType.ALL_REDUCE, 64, 20_000, seq=step)
    run_dir = b.write(tmp_path / "run")
    lost = LostCollectives(pg_name="0", first_seq=1, last_seq=1, steps=(1,), ranks=(1,))
    write_manifest(run_dir, dataclasses.replace(read_manifest(run_dir), lost_collectives=(lost,)))
    got, written = _export_and_analyze(run_dir, tmp_path)
    assert got == [{c: r[c] for c in COLLECTIVE_SKEW_SQL_COLUMNS} for r in written]
    assert sorted({r["seq"] for r in got}) == [0, 2]


@pytest.mark.slow  # writes, imports, exports and analyses 4 GPU ranks: 5 s
def test_the_sql_on_a_synthetic_gpu_run_gives_analyzes_table_where_the_host_synchronised(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.importers import import_traces
    from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run

    write_gpu_run(GpuRunSpec(world_size=4, steps=3, layers=4, slow_ranks={2: 1.3}, seed=0), tmp_path / "k")
    run_dir = tmp_path / "run"
    import_traces([tmp_path / "k"], None, run_dir)
    got, written = _export_and_analyze(run_dir, tmp_path)
    assert len(got) == 4 * 3 * 2  # two buckets per step
    _assert_equal_where_the_model_reads_no_name(run_dir, got, written)


@pytest.mark.slow  # import of 8 real ranks, export and analysis: 5 s
def test_the_sql_on_the_real_dlrm_trace_gives_analyzes_table_where_the_host_synchronised(
    dlrm_imported: Path, tmp_path: Path
) -> None:
    # the query read compute from node names, and counted the host ops that synchronised on the GPU as
    # compute: its exposed_wait_ns summed to 7.32 ms over the 64 rows, analyze's to 32.27 ms
    got, written = _export_and_analyze(dlrm_imported, tmp_path)
    assert len(got) == len(written) == 64
    _assert_equal_where_the_model_reads_no_name(dlrm_imported, got, written)
    assert sum(r["exposed_wait_ns"] for r in got) == pytest.approx(32.27e6, abs=0.01e6)


def test_the_sql_counts_a_gap_nodes_work_after_the_wait_it_hid_as_compute_and_the_rest_not(
    tmp_path: Path,
) -> None:
    # DDP at the collectives level: the reducer's wait for the second bucket hides in the compute gap node
    # that follows; the query counted the whole node as compute (no name says it waited), so the early
    # rank's exposed wait for the late one was 0 in SQL and 30 ms in analyze's table
    from test_execution_model import MS, _ddp_collectives_level

    run_dir = _ddp_collectives_level(tmp_path, 30.0)
    got, written = _export_and_analyze(run_dir, tmp_path)
    _assert_equal_where_the_model_reads_no_name(run_dir, got, written)
    second = [r for r in got if r["rank"] == 0 and r["seq"] % 2 == 1]
    assert [r["exposed_wait_ns"] for r in second] == [30 * MS] * 3


def test_the_export_numbers_each_pair_as_the_loaded_run_does(tmp_path: Path) -> None:
    """``p2p.pair`` (schema version 2) is the pair's index in ``RunTrace.p2p``, which analyze calls seq."""
    run_dir = _skewed_run(tmp_path, 5, steps=2)
    assert skewlens_main(["export", str(run_dir), "--out", str(tmp_path / "pq"), "--workers", "1"]) == 0
    rows = read_table(tmp_path / "pq" / "p2p.parquet").to_pylist()
    run = load_validated(run_dir)
    assert [r["pair"] for r in rows] == list(range(len(run.p2p))) and len(rows) == 2 * 3
    for r in rows:
        p = run.p2p[r["pair"]]
        src, dst = run.ranks[p.src_rank], run.ranks[p.dst_rank]
        assert (r["src_rank"], r["dst_rank"], r["tag"], r["pg_name"]) == (
            p.src_rank,
            p.dst_rank,
            p.tag,
            p.pg_name,
        )
        assert (r["send_node_id"], r["recv_node_id"]) == (src.node_id[p.src_row], dst.node_id[p.dst_row])


def test_the_sql_leaves_out_exactly_the_blame_columns() -> None:
    all_columns = list(CollectiveSkewRecord.__dataclass_fields__)
    assert [c for c in all_columns if c not in COLLECTIVE_SKEW_SQL_COLUMNS] == list(NOT_IN_SQL)
    assert "; " not in collective_skew_sql().rstrip().splitlines()[-1]  # no trailing semicolon (Spark)


def test_docs_show_the_query_the_package_ships() -> None:
    doc = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(.*?)```", doc, flags=re.DOTALL)
    assert collective_skew_sql().strip() in [b.strip() for b in blocks]


def test_the_sqls_eager_send_rule_allows_the_models_clock_skew() -> None:
    from skewlens.replay.execution import SKEW_NS

    (slack,) = re.findall(r"end_ns <= recv_arrival_ns \+ (\d+)", collective_skew_sql())
    assert int(slack) == SKEW_NS


def test_the_sql_takes_the_models_end_where_analyze_ends_a_lagged_completion_with_the_hidden_wait(
    tmp_path: Path,
) -> None:
    # the default demo (4 ranks, ops level): 2 of 90 rows differed in end_ns and transfer_ns: DDP's reducer
    # waited for its first bucket in untraced time that ended before gloo's worker recorded the bucket's
    # end, and analyze ends the bucket with that wait (replay.execution.model_ends); the query gave the
    # recorded end, lag later. It reads the model's end from the export's model table now
    from test_execution_model import _ddp_ops_level

    lag = 120_000
    run_dir = _ddp_ops_level(tmp_path, 30.0, lag_ns=lag)
    got, written = _export_and_analyze(run_dir, tmp_path)
    assert got == [{c: r[c] for c in COLLECTIVE_SKEW_SQL_COLUMNS} for r in written]
    recorded = {
        (r["rank"], r["node_id"]): r["end_ns"]
        for r in read_table(tmp_path / "parquet" / "collectives.parquet").to_pylist()
    }
    lagged = [recorded[(r["rank"], r["node_id"])] - r["end_ns"] for r in got]
    # each step's first bucket (seq 0, 2, 4), on both ranks: analyze's end, lag before the recorded one
    assert lagged == ([lag] * 2 + [0] * 2) * 3


def test_the_sql_gives_analyzes_table_on_empty_reduces_one_byte_all_reduces_groups_of_one_and_uneven_gathers(
    tmp_path: Path,
) -> None:
    # mutation round 13: the seeded runs hold none of these, so '<= 1 byte' for empty and an empty reduce
    # left waiting passed; a group of one and a gather's members' own bytes are held here too
    ms = 1_000_000
    b = RunBuilder(2, {"0": (0, 1), "solo": (0,)})
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("fwd", ms + r * ms, start_ns=0)  # rank 1 arrives 1 ms later at each
        rb.collective(CommType.REDUCE, 0, 20_000, root=0)
        rb.compute("mid", ms, start_ns=2 * ms + r * ms)
        rb.collective(CommType.ALL_REDUCE, 1, 2 * ms - r * ms, start_ns=3 * ms + r * ms)
        rb.collective(CommType.GATHER, 64 << (6 * r), 2 * ms - r * ms, start_ns=6 * ms + r * ms, root=0)
        if r == 0:
            rb.collective(CommType.BROADCAST, 4096, ms, pg="solo", start_ns=9 * ms, root=0)
    got, written = _export_and_analyze(b.write(tmp_path / "run"), tmp_path)
    assert got == [{c: r[c] for c in COLLECTIVE_SKEW_SQL_COLUMNS} for r in written]
    by = {(r["comm_type"], r["rank"]): r for r in got}
    assert [by["REDUCE", r]["wait_ns"] for r in range(2)] == [0, 0]  # empty: no one waits
    assert [by["ALL_REDUCE", r]["wait_ns"] for r in range(2)] == [ms, 0]  # one byte: rank 0 waits
    assert [by["GATHER", r]["comm_bytes"] for r in range(2)] == [64, 4096]
    assert (by["BROADCAST", 0]["late_rank"], by["BROADCAST", 0]["late_by_ns"]) == (0, 0)
