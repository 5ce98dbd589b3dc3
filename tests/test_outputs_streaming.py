"""Output writers that cost less than the work: the streamed Chrome/Perfetto JSON (vectorised formatting,
the cap on events and its note), ``timeline.parquet`` built from numpy columns, and the analysis tables."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from perfetto_lint import lint
from test_analysis_scenarios import MS, Scenario, build_run
from trace_edits import without_dtype

from skewlens.analysis import analyze_run
from skewlens.analysis.api import skew_table
from skewlens.analysis.index import RankIndex, build_index
from skewlens.analysis.perfetto import write_perfetto as write_analysis_perfetto
from skewlens.analysis.records import CollectiveSkewRecord
from skewlens.cli import main as skewlens_main
from skewlens.profiler.importers import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RankTrace, RunTrace
from skewlens.profiler.store.schema import read_table, table_from_records
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.threads import ordered_map
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay import outputs
from skewlens.replay.outputs import ReplayedNodeRecord, write_perfetto, write_timeline
from skewlens.replay.simulate import SimResult, simulate
from skewlens.replay.streaming import (
    _EVENT_SEP,
    STEPS_TID,
    EventCap,
    Lookup,
    StepSpans,
    TraceWriter,
    _pieces,
    cap_events,
    format_events,
    json_fixed,
    json_int,
    json_strings,
    track_lanes,
)
from skewlens.replay.streaming import _fold as fold_pieces

ODD_NAME = 'aten::"odd"\\name\tµ→'
STEPS = 4
RANKS = 3


def _run(tmp_path: Path) -> Path:
    """Three ranks: a setup node of no step, then per step a compute node (an awkward name), a second
    stream's kernel, an all_reduce and a send/recv ring; last, an uneven all_to_all."""
    b = RunBuilder(world_size=RANKS)
    for r in range(RANKS):
        b.rank(r).compute("setup", dur_ns=5_000 + r)
    for s in range(STEPS):
        for r in range(RANKS):
            rb = b.rank(r).step(s)
            rb.compute(ODD_NAME, dur_ns=1_000_000 + 1_000 * r + 7)
            rb.compute("kernel", dur_ns=123_456, stream=7)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=50_000)
        for r in range(RANKS):
            b.rank(r).send((r + 1) % RANKS, comm_bytes=4096, dur_ns=10_000, tag=s)
            b.rank((r + 1) % RANKS).recv(r, comm_bytes=4096, dur_ns=10_000, tag=s)
    for r in range(RANKS):  # an uneven all_to_all: rank r sends 100 * (k + 1) + r bytes to rank k
        send = [100 * (k + 1) + r for k in range(RANKS)]
        recv = [100 * (r + 1) + k for k in range(RANKS)]
        peer = (sum(send) - send[r], sum(recv) - recv[r])
        b.rank(r).collective(
            CommType.ALL_TO_ALL, sum(send), 20_000, peer_bytes=peer, peer_splits=(send, recv)
        )
    return b.write(tmp_path / "run")


@pytest.fixture
def replayed(tmp_path: Path) -> tuple[RunTrace, SimResult]:
    run = load_run(_run(tmp_path))
    return run, simulate(run)


def _x_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The X events of nodes and of the critical path (not the wait slices inside communication nodes, nor
    the analysis trace's step slices)."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] not in ("wait_for_peers", "step")]


def _key(e: dict[str, Any]) -> str:
    return json.dumps(e, sort_keys=True)


# ------------------------------------------------------------------------------------ the formatter


def test_formatted_rows_parse_to_the_values_they_were_given() -> None:
    ints = np.array([0, -1, 7, 2**62, -(2**62), 999, -1000], dtype=np.int64)
    small = np.array([3, 3, 4, 3, 5, 4, 3], dtype=np.int64)
    names = ["plain", ODD_NAME, "", "\x00ctl"]
    idx = np.array([1, 0, 2, 3, 1, 1, 0])
    fields: list[tuple[str, Any]] = [
        ("name", json_strings(names, idx)),
        ("ph", '"X"'),
        ("big", json_int(ints)),
        ("small", json_int(small)),
        ("us", json_fixed(ints, 3)),
        ("ms", json_fixed(ints, 6)),
        ("args", [("k", json_int(small)), ("deeper", [("n", json_int(ints))])]),
    ]
    buf = io.BytesIO()
    TraceWriter(buf).write_formatted(format_events(fields, len(ints)))
    rows = json.loads("[" + buf.getvalue().decode() + "]")
    assert len(rows) == len(ints)
    for i, row in enumerate(rows):
        v = int(ints[i])
        assert row["name"] == names[idx[i]] and row["ph"] == "X"
        assert row["big"] == v and row["small"] == int(small[i])
        assert row["us"] == v / 1000 and isinstance(row["us"], float)
        assert row["ms"] == v / 10**6
        assert row["args"] == {"k": int(small[i]), "deeper": {"n": v}}


def test_neighbouring_small_lookups_are_taken_as_one_and_a_one_entry_lookup_is_written_as_text() -> None:
    # a chunk of one rank's events: name and category are small tables side by side, pid and tid one
    # value each; then a column of large numbers, and the step again one value
    n = 300
    rng = np.random.default_rng(0)
    names = [f"op{k}" for k in range(5)] + [ODD_NAME]
    # int8, as the categories are: the pair's index, name x 120 + category, overflows it (up to 719)
    name_idx = rng.integers(0, len(names), n).astype(np.int8)
    cat_idx = rng.integers(0, 120, n).astype(np.int8)
    cats = tuple(json.dumps(f"c{k}") for k in range(120))
    big = rng.integers(10**9, 10**12, n)
    fields: list[tuple[str, Any]] = [
        ("name", json_strings(names, name_idx)),
        ("cat", Lookup(cats, cat_idx)),
        ("pid", json_int(np.full(n, 7))),
        ("tid", json_int(np.full(n, 3))),
        ("ts", json_fixed(big, 3)),
        ("args", [("step", json_int(np.full(n, 2)))]),
    ]
    pieces = fold_pieces([_EVENT_SEP, *_pieces(fields)])
    # name x category one lookup (pid and tid folded in as text), the µs' whole part a column, their
    # fraction a lookup carrying the step as text: 8 lookups before, 2 now
    assert [type(p).__name__ for p in pieces] == ["Lookup", "StringArray", "Lookup"]
    assert isinstance(pieces[0], Lookup) and len(pieces[0].table) == len(names) * len(cats)
    buf = io.BytesIO()
    TraceWriter(buf).write_formatted(format_events(fields, n))
    rows = json.loads("[" + buf.getvalue().decode() + "]")
    assert rows == [
        {
            "name": names[name_idx[i]],
            "cat": f"c{cat_idx[i]}",
            "pid": 7,
            "tid": 3,
            "ts": int(big[i]) / 1000,
            "args": {"step": 2},
        }
        for i in range(n)
    ]


def test_ordered_map_on_threads_keeps_the_order_of_its_items() -> None:
    assert list(ordered_map(lambda x: x * x, range(100), workers=3, ahead=1)) == [x * x for x in range(100)]
    assert list(ordered_map(lambda x: -x, range(5), workers=1)) == [0, -1, -2, -3, -4]


# --------------------------------------------------------------------------------- replay timeline.json


def test_the_streamed_timeline_json_has_every_node_as_one_dict_per_event_would(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path
) -> None:
    run, sim = replayed
    path = write_perfetto(run, sim, tmp_path / "timeline.json", max_events=0, workers=2)
    doc = json.loads(path.read_text(encoding="utf-8"))
    expected = []
    t0 = min(int(sim.start_ns[r][rt.node_type != NodeType.METADATA].min()) for r, rt in run.ranks.items())
    assert doc["otherData"]["t0_ns"] == t0
    for r, rt in run.ranks.items():
        for i in np.flatnonzero(rt.node_type != NodeType.METADATA).tolist():
            st, en = int(sim.start_ns[r][i]), int(sim.end_ns[r][i])
            expected.append(
                {
                    "name": rt.name(i),
                    "ph": "X",
                    "cat": CATS[NodeType(int(rt.node_type[i]))],
                    "pid": r,
                    "tid": int(rt.stream[i]),
                    "ts": (st - t0) / 1000,
                    "dur": (en - st) / 1000,
                    "args": {"node_id": int(rt.node_id[i]), "step": int(rt.step[i])},
                }
            )
    assert sorted(map(_key, _x_events(doc))) == sorted(map(_key, expected))
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {(r, s) for r in range(RANKS) for s in (0, 7, STEPS_TID)}
    # each rank's replayed steps on its steps track, from where its step before ended (before: none drawn)
    steps = sorted(
        (e["pid"], e["args"]["step"], round(e["ts"] * 1000) + t0, round(e["dur"] * 1000))
        for e in doc["traceEvents"]
        if e.get("cat") == "step"
    )
    tiled, ended = [], {}
    for (r, k), (a, b) in sorted(sim.step_spans().items()):
        a = max(a, ended.get(r, a))
        tiled.append((r, k, a, max(a, b) - a))
        ended[r] = max(ended.get(r, b), b)
    assert steps == tiled and len(steps) == RANKS * len(sim.steps())
    assert doc["otherData"]["events_written"] == doc["otherData"]["events_total"] == len(expected)
    assert doc["otherData"]["left_out"] is None
    assert not any(e["ph"] == "i" for e in doc["traceEvents"])


def test_small_ranks_share_a_chunk_and_large_ones_keep_their_own_every_row_once_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skewlens.replay import streaming

    monkeypatch.setattr(streaming, "CHUNK_EVENTS", 10)
    monkeypatch.setattr(streaming, "PACK_EVENTS", 4)
    sizes = {0: 1, 1: 2, 2: 3, 3: 25, 4: 1, 5: 4, 6: 1}
    keep = {r: np.ones(n, dtype=np.bool_) for r, n in sizes.items()}
    keep[3][[0, 7]] = False  # rows left out by the cap are not written
    starts = {r: np.arange(n) for r, n in sizes.items()}
    steps = {r: np.zeros(n, dtype=np.int64) for r, n in sizes.items()}
    cap = cap_events(keep, starts, steps, max_events=0, file="t.json", option="x")
    batches = list(streaming.rank_chunks(cap))
    shape = [[(r, len(rows)) for r, rows in b] for b in batches]
    assert shape == [[(0, 1), (1, 2), (2, 3)], [(3, 10)], [(3, 10)], [(3, 3), (4, 1)], [(5, 4)], [(6, 1)]]
    got = [(r, int(i)) for b in batches for r, rows in b for i in rows]
    assert got == [(r, i) for r in sorted(sizes) for i in np.flatnonzero(keep[r]).tolist()]


def test_a_capped_timeline_keeps_the_first_whole_steps_on_all_ranks_and_says_what_it_left_out(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path
) -> None:
    run, sim = replayed
    per_step = {
        s: sum(int(((rt.step == s) & (rt.node_type != NodeType.METADATA)).sum()) for rt in run.ranks.values())
        for s in range(STEPS)
    }
    total = sum(int((rt.node_type != NodeType.METADATA).sum()) for rt in run.ranks.values())
    notes: list[str] = []
    cap = per_step[0] + per_step[1] + per_step[2] // 2  # two steps fit, the third does not
    doc = json.loads(
        write_perfetto(run, sim, tmp_path / "t.json", max_events=cap, on_note=notes.append).read_text()
    )
    xs = _x_events(doc)
    assert {e["args"]["step"] for e in xs} == {0, 1}
    assert {e["pid"] for e in xs} == set(range(RANKS))
    assert len(xs) == per_step[0] + per_step[1]
    meta = doc["otherData"]
    assert meta["events_written"] == len(xs) and meta["events_total"] == total
    assert meta["steps_written"] == [0, 1] and meta["max_events"] == cap
    assert len(notes) == 1 and meta["left_out"] == notes[0]
    assert f"{len(xs):,} of {total:,} events" in notes[0] and "steps 0-1" in notes[0]
    assert f"{STEPS - 2} later step(s)" in notes[0] and f"{RANKS} events of no step" in notes[0]
    assert "perfetto_max_events=0" in notes[0]
    (marker,) = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert marker["s"] == "g" and marker["args"]["note"] == notes[0]
    assert marker["ts"] == max(e["ts"] + e["dur"] for e in xs)


def test_a_cap_inside_the_first_step_keeps_every_rank_up_to_one_time() -> None:
    starts = {r: np.arange(10, dtype=np.int64) * 100 + r for r in range(4)}
    cand = {r: np.ones(10, dtype=np.bool_) for r in range(4)}
    cap = cap_events(
        cand, starts, {r: np.zeros(10, np.int32) for r in range(4)}, max_events=9, file="f", option="o"
    )
    assert cap.steps is None and cap.until_ns is not None
    assert cap.written == 9 and cap.total == 40
    for r, m in cap.keep.items():
        assert m.sum() > 0  # every rank, side by side
        assert (starts[r][m] < cap.until_ns).all() and (starts[r][~m] >= cap.until_ns).all()
    assert cap.note is not None and "step 0 alone has 40" in cap.note and "9 of 40 events" in cap.note


def test_a_cap_that_the_run_fits_leaves_nothing_out() -> None:
    cand = {0: np.array([True, False, True])}
    cap = cap_events(
        cand, {0: np.zeros(3, np.int64)}, {0: np.zeros(3, np.int32)}, max_events=2, file="f", option="o"
    )
    assert cap.note is None and cap.written == 2 and cap.keep[0].tolist() == [True, False, True]


def test_replay_prints_the_note_and_refuses_a_negative_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _run(tmp_path)
    out = tmp_path / "out"
    args = ["replay", f"trace={run_dir}", f"out={out}", "progress=false"]
    assert skewlens_main([*args, "perfetto_max_events=5"]) == 0
    note = json.loads((out / "timeline.json").read_text())["otherData"]["left_out"]
    assert note and f"skewlens replay: warning: {note}" in capsys.readouterr().err.splitlines()
    assert skewlens_main([*args, "perfetto_max_events=-1"]) == 2
    assert "perfetto_max_events: must be >= 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ timeline.parquet


def _given(col: np.ndarray | None, i: int) -> int | None:
    """Row ``i`` of an optional column, None where the trace has none or the row -1."""
    return None if col is None or col[i] < 0 else int(col[i])


def _splits(rt: RankTrace, values: np.ndarray | None, i: int) -> list[int] | None:
    """Row ``i``'s recorded all_to_all splits (``values``: the send or recv column), None for none."""
    if rt.split_ptr is None or values is None or rt.split_ptr[i] == rt.split_ptr[i + 1]:
        return None
    return [int(v) for v in values[rt.split_ptr[i] : rt.split_ptr[i + 1]]]


@pytest.mark.parametrize("table_rows", [1, outputs.TABLE_ROWS])  # a table per rank; all ranks in one
def test_timeline_parquet_has_every_node_with_its_replayed_times_in_whole_rank_row_groups(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_rows: int
) -> None:
    run, sim = replayed
    monkeypatch.setattr(outputs, "ROW_GROUP", 10)  # fewer rows than a rank has: a row group per table
    monkeypatch.setattr(outputs, "TABLE_ROWS", table_rows)
    path = write_timeline(run, sim, tmp_path / "timeline.parquet", workers=2)
    rows = read_table(path, ReplayedNodeRecord).to_pylist()
    expected = []
    for r in sorted(run.ranks):
        rt = run.ranks[r]
        for i in range(len(rt)):
            expected.append(
                {
                    "rank": r,
                    "node_id": int(rt.node_id[i]),
                    "name": rt.name(i),
                    "type": NodeType(int(rt.node_type[i])).name,
                    "start_ns": int(rt.start_ns[i]),
                    "dur_ns": int(rt.dur_ns[i]),
                    "stream": int(rt.stream[i]),
                    "step": int(rt.step[i]),
                    "is_cpu_op": bool(rt.is_cpu[i]),
                    "comm_type": CommType(int(rt.comm_type[i])).name if rt.comm_type[i] >= 0 else None,
                    "comm_bytes": int(rt.comm_bytes[i]),
                    "pg_name": run.pg_names[int(rt.pg[i])] if rt.pg[i] >= 0 else None,
                    "seq": int(rt.seq[i]),
                    "src": int(rt.src[i]),
                    "dst": int(rt.dst[i]),
                    "tag": int(rt.tag[i]),
                    "send_splits_bytes": _splits(rt, rt.split_send_bytes, i),
                    "recv_splits_bytes": _splits(rt, rt.split_recv_bytes, i),
                    "launch_ns": _given(rt.launch_ns, i),
                    "launched_in": None if (k := _given(rt.launched_in, i)) is None else int(rt.node_id[k]),
                    "return_ns": _given(rt.return_ns, i),
                    "dtype": None if (d := _given(rt.dtype_idx, i)) is None else rt.dtypes[d],
                    "source_rank": r,
                    "replay_start_ns": int(sim.start_ns[r][i]),
                    "replay_end_ns": int(sim.end_ns[r][i]),
                }
            )
    assert rows == expected
    assert [r["send_splits_bytes"] for r in rows if r["send_splits_bytes"]][1] == [101, 201, 301]
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index("rank")
    stats = [meta.row_group(g).column(col).statistics for g in range(meta.num_row_groups)]
    batches = outputs.rank_batches(run, table_rows)
    assert len(batches) == (RANKS if table_rows == 1 else 1)
    assert [(s.min, s.max) for s in stats] == [(b[0], b[-1]) for b in batches]
    con = duckdb.connect()
    assert con.execute(f"SELECT count(*) FROM '{path}' WHERE rank = 1").fetchall() == [(len(run.ranks[1]),)]


def test_a_timeline_table_of_ranks_with_and_without_dtypes_gives_each_row_its_own(tmp_path: Path) -> None:
    # rank 0 captured before skl_dtype, rank 1 after, in one table: rank 0's dictionary of dtypes is empty
    b = RunBuilder(2)
    for r in range(2):
        b.rank(r).step(0).compute("fwd", 1_000)
        b.rank(r).collective(CommType.ALL_GATHER, 8_192, 1_000, dtype="bfloat16")
    run = load_run(without_dtype(b.write(tmp_path / "run"), files="rank-0.et"))
    table = outputs.timeline_table(run, simulate(run), [0, 1])
    got = list(zip(*table.select(["rank", "type", "dtype"]).to_pydict().values(), strict=True))
    assert [g for g in got if g[1] != "METADATA"] == [
        (0, "COMP", None),
        (0, "COMM_COLL", None),
        (1, "COMP", None),
        (1, "COMM_COLL", "bfloat16"),
    ]


def test_a_batch_of_ranks_is_complete_once_it_holds_at_least_the_rows_asked_for() -> None:
    sizes = {0: 3, 1: 3, 2: 2, 3: 1}
    run = cast(RunTrace, SimpleNamespace(ranks={r: [0] * n for r, n in sizes.items()}))
    assert outputs.rank_batches(run, 3) == [[0], [1], [2, 3]]
    assert outputs.rank_batches(run, 4) == [[0, 1], [2, 3]]
    assert outputs.rank_batches(run, 6) == [[0, 1], [2, 3]]


def test_a_row_group_of_timeline_parquet_ends_at_the_rank_that_brings_it_to_row_group_rows(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sim = replayed
    monkeypatch.setattr(outputs, "TABLE_ROWS", 1)  # a table per rank
    monkeypatch.setattr(outputs, "ROW_GROUP", len(run.ranks[0]))  # rank 0 alone fills a row group
    path = write_timeline(run, sim, tmp_path / "timeline.parquet", workers=2)
    meta = pq.ParquetFile(path).metadata
    assert meta.row_group(0).num_rows == len(run.ranks[0])


def test_the_timelines_times_count_from_the_earliest_replayed_start_of_any_rank(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r, start_ms in ((0, 7), (1, 5)):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 2 * MS, start_ns=start_ms * MS)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS)
    run = load_run(b.write(tmp_path / "run"))
    sim = simulate(run)
    first = {r: int(sim.start_ns[r][rt.node_type != NodeType.METADATA].min()) for r, rt in run.ranks.items()}
    assert first[1] < first[0]  # rank 1 starts first
    doc = json.loads(write_perfetto(run, sim, tmp_path / "t.json").read_text(encoding="utf-8"))
    assert doc["otherData"]["t0_ns"] == first[1]
    assert min(e["ts"] for e in _x_events(doc)) == 0.0


def test_a_text_output_that_fails_while_written_leaves_the_earlier_file_whole(tmp_path: Path) -> None:
    path = outputs.write_text(tmp_path / "config.yaml", "trace: /r\n")
    with pytest.raises(UnicodeEncodeError):
        outputs.write_text(path, "trace: /s\nmode: \ud800\n")  # a lone surrogate: no UTF-8
    assert path.read_text(encoding="utf-8") == "trace: /r\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_the_duckdb_query_in_the_replay_docs_reads_timeline_parquet_by_its_name(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sim = replayed
    doc = (Path(__file__).resolve().parents[1] / "docs" / "replay.md").read_text(encoding="utf-8")
    section = doc.split("## Outputs", 1)[1].split("\n## ", 1)[0]
    (query,) = re.findall(r"```sql\n(.*?)```", section, flags=re.DOTALL)
    write_timeline(run, sim, tmp_path / "timeline.parquet")
    monkeypatch.chdir(tmp_path)
    got = duckdb.connect().execute(query).fetchall()
    rt = run.ranks[1]
    want = []
    for k in sorted(set(rt.step.tolist())):
        m = rt.step == k
        want.append((1, k, int(sim.end_ns[1][m].max() - sim.start_ns[1][m].min())))
    assert len(want) == STEPS + 1 and got == want  # the steps and the rows of no step


# ----------------------------------------------------------------------------------------- analysis


SC = Scenario(straggler_rank=1, straggler_ns=20 * MS, steps=5)
CATS = {
    NodeType.COMP: "compute",
    NodeType.COMM_COLL: "collective",
    NodeType.COMM_SEND: "send",
    NodeType.COMM_RECV: "recv",
}


def _analysed(ri: RankIndex) -> np.ndarray:
    return ri.is_comp | ri.is_comm | ri.is_untraced | ri.is_wait


def test_the_analysis_trace_cap_keeps_whole_steps_and_their_critical_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = build_run(tmp_path, SC)
    run = load_run(run_dir)
    ix = build_index(run)
    per_step = {
        s: sum(int((_analysed(ri) & (ri.trace.step == s)).sum()) for ri in ix.ranks.values())
        for s in range(SC.steps)
    }
    cap = per_step[0] + per_step[1]
    out = tmp_path / "out"
    argv = ["analyze", str(run_dir), "--out", str(out), "--no-blame", "--perfetto-max-events", str(cap)]
    assert skewlens_main(argv) == 0
    doc = json.loads((out / "trace_critical_path.json").read_text())
    assert doc["otherData"]["steps_written"] == [0, 1]
    nodes = [e for e in _x_events(doc) if e["cat"] != "critical_path"]
    assert len(nodes) == cap and {e["args"]["step"] for e in nodes} == {0, 1}
    path = [e for e in _x_events(doc) if e["cat"] == "critical_path"]
    assert path and {e["args"]["step"] for e in path} == {0, 1}
    result = analyze_run(run, blame=False)
    assert len(path) == sum(1 for rec in result.critical_path if rec.step in (0, 1))
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert sorted((e["pid"], e["args"]["step"]) for e in steps) == [(r, s) for r in range(4) for s in (0, 1)]
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert sorted(e["id"] for e in flows if e["ph"] == "s") == sorted(
        e["id"] for e in flows if e["ph"] == "f"
    )
    note = doc["otherData"]["left_out"]
    assert "--perfetto-max-events 0" in note
    assert f"skewlens analyze: warning: {note}" in capsys.readouterr().err.splitlines()
    assert skewlens_main([*argv[:-1], "-3"]) == 2
    assert "--perfetto-max-events: expected >= 0" in capsys.readouterr().err


def test_the_analysis_trace_draws_each_rank_s_recorded_steps_on_a_steps_track(tmp_path: Path) -> None:
    # before: no step boundaries at all; a serving loop's 200 decode steps of 11 nodes each were told apart
    # only by each slice's args.step
    result = analyze_run(load_run(build_run(tmp_path, SC)), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "t.json", max_events=0).read_text())
    t0 = doc["otherData"]["t0_ns"]
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    tid = {e["tid"] for e in steps}
    assert len(tid) == 1
    assert sorted(
        (e["pid"], e["name"], round(e["ts"] * 1000) + t0, round(e["dur"] * 1000)) for e in steps
    ) == [
        (b.rank, f"step {b.step}", b.start_ns, b.step_ns)
        for b in sorted(result.breakdown, key=lambda b: (b.rank, b.step))
    ]
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M" and e.get("tid") in tid]
    assert sorted((e["pid"], e["name"], e["args"]["name"]) for e in meta) == [
        (r, "thread_name", "steps") for r in range(SC.world_size)
    ]
    assert not lint(tmp_path / "t.json").counts


def test_the_analysis_trace_uncapped_has_every_node_on_its_stream_track(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, SC)), blame=False)
    doc = json.loads(
        write_analysis_perfetto(result, tmp_path / "t.json", max_events=0, workers=2).read_text()
    )
    t0 = doc["otherData"]["t0_ns"]
    got = sorted(map(_key, (e for e in _x_events(doc) if e["cat"] != "critical_path")))
    expected = []
    for r, ri in result.index.ranks.items():
        rt = ri.trace
        tids = {int(s): k + 1 for k, s in enumerate(np.unique(rt.stream).tolist())}
        for i in np.flatnonzero(_analysed(ri)).tolist():
            args: dict[str, Any] = {"node_id": int(rt.node_id[i]), "step": int(rt.step[i])}
            if ri.is_comm[i]:
                pg = int(rt.pg[i])
                args |= {
                    "wait_ms": int(ri.wait_ns[i]) / 10**6,
                    "bytes": int(rt.comm_bytes[i]),
                    "group": result.run.pg_names[pg] if pg >= 0 else None,
                    "seq": int(rt.seq[i]),
                }
            expected.append(
                {
                    "ph": "X",
                    "name": rt.name(i),
                    "cat": CATS[NodeType(int(rt.node_type[i]))],
                    "pid": r,
                    "tid": tids[int(rt.stream[i])],
                    "ts": (int(rt.start_ns[i]) - t0) / 1000,
                    "dur": int(rt.dur_ns[i]) / 1000,
                    "args": args,
                }
            )
    assert got == sorted(map(_key, expected))
    path = [e for e in _x_events(doc) if e["cat"] == "critical_path"]
    assert len(path) == len(result.critical_path)
    jumps = sum(
        1
        for a, b in zip(result.critical_path, result.critical_path[1:], strict=False)
        if a.step == b.step and a.rank != b.rank
    )
    assert jumps > 0 and sum(1 for e in doc["traceEvents"] if e["ph"] == "s") == jumps


def test_the_analysis_trace_names_each_collectives_group_and_seq_as_the_report_does(tmp_path: Path) -> None:
    # a PPO loop: the actor's all_reduce on the default group, the critic's on a group of its own, a
    # broadcast to the rollout copy; the report names them "all_reduce 1#9", the trace's slices only
    # "c10d::allreduce_" (a blocking one on the host thread: no group anywhere)
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "1": (0, 1)})
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 1_000_000 + (2_000_000 if r == 1 else 0), start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 300_000, pg="1")
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 300_000, pg="0")
        rb.collective(CommType.BROADCAST, 1 << 10, 100_000, pg="0")
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "t.json", max_events=0).read_text())
    by_node = {
        (e["pid"], e["args"]["node_id"]): e["args"] for e in _x_events(doc) if e["cat"] == "collective"
    }
    records = list(result.skew.records())
    assert {(x.pg_name, x.comm_type) for x in records} == {
        ("1", "ALL_REDUCE"),
        ("0", "ALL_REDUCE"),
        ("0", "BROADCAST"),
    }
    for x in records:
        args = by_node[(x.rank, x.node_id)]
        assert (args["group"], args["seq"]) == (x.pg_name, x.seq)
    assert not lint(tmp_path / "t.json").counts


def test_the_skew_table_is_built_from_the_event_arrays_as_the_records_give_it(tmp_path: Path) -> None:
    result = analyze_run(load_run(build_run(tmp_path, SC)), blame=False)
    got = skew_table(result.skew)
    want = table_from_records(CollectiveSkewRecord, result.skew.records(), "collective_skew")
    assert got.num_rows > 0
    assert got.schema.equals(want.schema, check_metadata=True)
    assert got.to_pylist() == want.to_pylist()
    assert all(pa.types.is_dictionary(got.schema.field(c).type) for c in ("kind", "pg_name", "cause"))


def test_untraced_host_time_is_in_the_untraced_category_of_both_traces_and_times_start_at_the_first_node(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.vocab import UNTRACED_NODE_NAME

    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 2 * MS, start_ns=5 * MS)  # the builder's METADATA node is recorded at 0
        rb.compute(UNTRACED_NODE_NAME, 1 * MS)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS)
    run_dir = b.write(tmp_path / "run")
    run = load_run(run_dir)
    analysed = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json")
    replayed = write_perfetto(run, simulate(run), tmp_path / "t.json")
    for path in (analysed, replayed):
        doc = json.loads(path.read_text(encoding="utf-8"))
        nodes = [e for e in _x_events(doc) if e["cat"] != "critical_path"]
        assert {(e["name"], e["cat"]) for e in nodes} == {
            ("aten::mm", "compute"),
            (UNTRACED_NODE_NAME, "untraced"),
            ("c10d::all_reduce_", "collective"),
        }
        assert min(e["ts"] for e in nodes) == 0.0
        assert doc["otherData"]["t0_ns"] == 5 * MS


def test_the_critical_path_track_shows_each_node_only_while_it_was_on_the_path(tmp_path: Path) -> None:
    from skewlens.profiler.importers import import_traces
    from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run

    # a host op is on the path only until the launch inside it; its slice used to be drawn up to the op's
    # end, overlapping the kernel it launched on the same track (6 of the DLRM trace's 495 path nodes)
    write_gpu_run(GpuRunSpec(world_size=2, steps=2, layers=2, slow_ranks={1: 1.5}, seed=0), tmp_path / "k")
    import_traces(sorted((tmp_path / "k").glob("*.json.gz")), None, tmp_path / "run")
    res = analyze_run(load_run(tmp_path / "run"), blame=False)
    doc = json.loads(write_analysis_perfetto(res, tmp_path / "t.json").read_text(encoding="utf-8"))
    t0 = doc["otherData"]["t0_ns"]
    drawn = [e for e in doc["traceEvents"] if e.get("cat") == "critical_path" and e["ph"] == "X"]
    pieces = [(round(e["ts"] * 1000) + t0, round(e["dur"] * 1000)) for e in drawn]
    path = res.critical_path
    assert len(pieces) == len(path)
    assert any(a + d < p.end_ns for (a, d), p in zip(pieces, path, strict=True))  # some node was cut
    for k in range(len(path) - 1):
        if path[k].step == path[k + 1].step:  # the earlier piece ends its gap before the later one begins
            assert pieces[k + 1][0] + pieces[k + 1][1] + path[k].gap_before_ns == pieces[k][0], k
    for p, (a, d) in zip(path, pieces, strict=True):
        assert p.start_ns <= a and a + d <= p.end_ns and d == p.contribution_ns


def test_both_traces_order_their_ranks_by_rank_not_by_the_viewer_s_rule(tmp_path: Path) -> None:
    # the replay's timeline wrote no process_sort_index, so a viewer ordered its ranks by its own rule:
    # chrome://tracing by name, "rank 10" before "rank 2"; the analysis trace wrote one
    b = RunBuilder(world_size=12)
    for r in range(12):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=1_000_000 + 1_000 * r)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=50_000)
    run = load_run(b.write(tmp_path / "run"))
    replayed = write_perfetto(run, simulate(run), tmp_path / "t.json")
    analysed = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json")
    for path in (replayed, analysed):
        meta = [e for e in json.loads(path.read_text(encoding="utf-8"))["traceEvents"] if e["ph"] == "M"]
        sort_index = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
        names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
        assert sort_index == {r: r for r in range(12)}, path.name
        in_order = sorted(names, key=sort_index.__getitem__)
        assert [names[p] for p in in_order] == [f"rank {r}" for r in range(12)]


def _thread_names(doc: dict[str, Any], pid: int) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def test_timeline_tracks_are_named_host_thread_gpu_stream_or_communication_stream_by_what_runs_on_them(
    tmp_path: Path,
) -> None:
    # a capture's layout: the main thread (0), a group's asynchronous communication stream (1000)
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=1_000_000)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=50_000, stream=1000)
    run = load_run(b.write(tmp_path / "cpu"))
    replay_doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "t.json").read_text())
    assert _thread_names(replay_doc, 1) == {
        0: "host thread 0",
        1000: "communication stream 1000 (group 0)",
        STEPS_TID: "steps",
    }
    result = analyze_run(run, blame=False)
    analysis_doc = json.loads(write_analysis_perfetto(result, tmp_path / "a.json").read_text())
    names = _thread_names(analysis_doc, 1)
    path = {0: "critical path"} if 1 in {p.rank for p in result.critical_path} else {}
    steps = {STEPS_TID: "steps"}  # the recorded steps' track
    assert names == {**path, 1: "host thread 0", 2: "communication stream 1000 (group 0)", **steps}
    # an imported GPU run: host threads by their tid, the compute and the NCCL stream by their number; the
    # streams that hold only METADATA nodes get no (empty) track
    write_gpu_run(GpuRunSpec(world_size=2, steps=1, layers=2, seed=1), tmp_path / "kineto")
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "gpu")
    run = load_run(tmp_path / "gpu")
    rt = run.ranks[0]
    doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "g.json").read_text())
    names = _thread_names(doc, 0)
    kinds = {}
    for s in set(rt.stream[rt.node_type != NodeType.METADATA].tolist()):
        on = rt.stream == s
        if rt.is_cpu[on].all():
            kinds[s] = f"host thread {s}"
        elif (rt.node_type[on] == NodeType.COMM_COLL).all():
            kinds[s] = f"GPU stream {s} (communication)"
        else:
            kinds[s] = f"GPU stream {s}"
    assert names == {**kinds, STEPS_TID: "steps"}
    kind_of = {re.sub(r" \d+", "", v) for t, v in names.items() if t != STEPS_TID}
    assert kind_of == {"host thread", "GPU stream", "GPU stream (communication)"}


def _waits_by_node(doc: dict[str, Any]) -> dict[tuple[int, int], float]:
    """``wait for peers`` slices by (rank, step) of the communication node they lie in (same track and start,
    inside it), in ms."""
    nodes = [e for e in _x_events(doc) if e["cat"] in ("collective", "send", "recv")]
    out: dict[tuple[int, int], float] = {}
    for w in (e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "wait_for_peers"):
        (node,) = [n for n in nodes if (n["pid"], n["tid"], n["ts"]) == (w["pid"], w["tid"], w["ts"])]
        assert w["dur"] <= node["dur"] and w["name"] == "wait for peers"
        assert (w["args"]["node_id"], w["args"]["step"]) == (node["args"]["node_id"], node["args"]["step"])
        assert w["args"]["wait_ms"] == pytest.approx(w["dur"] / 1000, abs=1e-9)
        out[(w["pid"], node["args"]["step"])] = round(w["dur"] / 1000, 6)
    return out


def test_both_timelines_draw_each_wait_for_peers_inside_its_communication_node_and_the_replay_its_new_wait(
    tmp_path: Path,
) -> None:
    # 2 ranks, 3 steps 10 ms apart: rank 0 arrives at the all_reduce after 1 ms of compute, rank 1 after 3 ms,
    # and both finish 0.5 ms after the last arrival: rank 0 waits 2 ms per step, rank 1 none
    b = RunBuilder(world_size=2)
    for s in range(3):
        for r, comp in ((0, 1 * MS), (1, 3 * MS)):
            rb = b.rank(r).step(s)
            rb.compute("aten::mm", comp, start_ns=s * 10 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 3 * MS + MS // 2 - comp, start_ns=s * 10 * MS + comp)
    run_dir = b.write(tmp_path / "run")
    result = analyze_run(load_run(run_dir), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "a.json").read_text())
    assert _waits_by_node(doc) == {(0, 0): 2.0, (0, 1): 2.0, (0, 2): 2.0}
    # replayed with a 5 ms stall of rank 0 at the start of step 1: there rank 0 arrives 3 ms after rank 1
    out = tmp_path / "replay"
    argv = [f"trace={run_dir}", f"out={out}", "slowdown=stall", "slowdown.rank=0", "slowdown.step=1"]
    assert skewlens_main(["replay", *argv, "slowdown.delay_ms=5", "progress=false"]) == 0
    doc = json.loads((out / "timeline.json").read_text())
    assert _waits_by_node(doc) == {(0, 0): 2.0, (1, 1): 3.0, (0, 2): 2.0}


def test_a_trace_cut_inside_the_first_step_marks_the_cut_where_the_written_nodes_stop_being_all(
    tmp_path: Path,
) -> None:
    # one step: rank 0 one 10 ms node, rank 1 ten 1 ms nodes; a cap of 5 keeps what starts before 4 ms
    b = RunBuilder(world_size=2)
    b.rank(0).step(0).compute("long", 10 * MS)
    for _ in range(10):
        b.rank(1).step(0).compute("short", 1 * MS)
    run = load_run(b.write(tmp_path / "run"))
    sim = simulate(run)
    doc = json.loads(write_perfetto(run, sim, tmp_path / "t.json", max_events=5).read_text())
    meta = doc["otherData"]
    assert meta["until_ns"] - meta["t0_ns"] == 4 * MS and meta["events_written"] == 5
    (marker,) = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert marker["ts"] == 4000.0  # not 10,000 (the long node's end), where rank 1 looked idle from 4 ms
    # every node that starts before the marker is in the file, none after
    written = {(e["pid"], e["args"]["node_id"]) for e in _x_events(doc)}
    for r, rt in run.ranks.items():
        for i in np.flatnonzero(rt.node_type != NodeType.METADATA).tolist():
            before = (int(sim.start_ns[r][i]) - meta["t0_ns"]) / 1000 < marker["ts"]
            assert ((r, int(rt.node_id[i])) in written) == before, (r, i)


def _partial_overlaps(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Slices of one track that overlap without one holding the other (a viewer nests them wrongly)."""
    by: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            ts = round(e["ts"] * 1000)
            by.setdefault((e["pid"], e["tid"]), []).append((ts, ts + round(e["dur"] * 1000)))
    bad = []
    for track, spans in by.items():
        stack: list[tuple[int, int]] = []
        for s, e in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= s:
                stack.pop()
            if stack and e > stack[-1][1]:
                bad.append((track, stack[-1], (s, e)))
            stack.append((s, e))
    return bad


def test_collectives_in_flight_at_once_on_one_stream_are_drawn_on_lanes_of_their_own_not_nested(
    tmp_path: Path,
) -> None:
    # DDP-like: two buckets' all_reduces in flight at once on the group's stream (0-5 ms and 2-7 ms) while
    # the host computes; a viewer nests slices of one track by time, so the second looked part of the first
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("backward", 8 * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=0, stream=1000)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=2 * MS, stream=1000)
    run = load_run(b.write(tmp_path / "run"))
    replay_doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "t.json").read_text())
    analysis_doc = json.loads(
        write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json").read_text()
    )
    for doc, comm_tid in ((replay_doc, 1000), (analysis_doc, 2)):
        assert _partial_overlaps(doc) == []
        names = _thread_names(doc, 1)
        lane = next(t for t, n in names.items() if n == "communication stream 1000 (group 0) (lane 2)")
        assert names[comm_tid] == "communication stream 1000 (group 0)"
        colls = sorted(
            (e["args"]["node_id"], e["tid"])
            for e in _x_events(doc)
            if e["pid"] == 1 and e["cat"] == "collective"
        )
        assert [t for _, t in colls] == [comm_tid, lane]  # the first on the stream's track, the second beside
        assert (
            len({(e["pid"], e["args"]["node_id"]) for e in _x_events(doc) if e["cat"] != "critical_path"})
            == 6
        )


def test_a_slice_nested_in_another_keeps_its_lane_and_only_a_partial_overlap_opens_one() -> None:
    # stream 5: [0, 10] holds [2, 4]; [3, 12] overlaps [0, 10] in part; [12, 13] follows; stream 6 alone
    stream = np.array([5, 5, 5, 6, 5], dtype=np.int64)
    start = np.array([0, 2, 3, 1, 12], dtype=np.int64)
    end = np.array([10, 4, 12, 20, 13], dtype=np.int64)
    lanes = track_lanes(stream, start, end, np.arange(5))
    assert lanes.tolist() == [0, 0, 1, 0, 0]


def test_a_slice_that_outlasts_the_wait_for_peers_of_the_node_holding_it_is_drawn_on_a_lane_of_its_own(
    tmp_path: Path,
) -> None:
    # rank 0: all_reduce A (0-10 ms) holds all_reduce B (1-9 ms) on stream 1000 (a 1F1B send and recv in
    # flight at once, as on examples/pipeline.py's replay); rank 1 comes to A at 6 ms, so A's "wait for
    # peers" slice is 0-6 ms, drawn on A's track: B started inside it and ended after it, a partial overlap
    # that viewers nest wrongly (B shown as a child of the wait); B now goes on the stream's second lane
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    for rb in (r0, r1):
        rb.compute("forward", 12 * MS, start_ns=0)
    r0.collective(CommType.ALL_REDUCE, 1 << 20, 10 * MS, start_ns=0, stream=1000)
    r0.collective(CommType.ALL_REDUCE, 1 << 20, 8 * MS, start_ns=1 * MS, stream=1000)
    r1.collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=6 * MS, stream=1001)
    r1.collective(CommType.ALL_REDUCE, 1 << 20, 8 * MS, start_ns=1 * MS, stream=1000)
    run = load_run(b.write(tmp_path / "run"))
    replay_doc = json.loads(write_perfetto(run, simulate(run), tmp_path / "t.json").read_text())
    analysis_doc = json.loads(
        write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json").read_text()
    )
    for doc in (replay_doc, analysis_doc):
        assert _partial_overlaps(doc) == []
        names = _thread_names(doc, 0)
        drawn = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
        on_0 = sorted((e["ts"], e["cat"], names[e["tid"]]) for e in drawn)
        stream = "communication stream 1000 (group 0)"
        assert [x for x in on_0 if x[1] in ("collective", "wait_for_peers")] == [
            (0.0, "collective", stream),
            (0.0, "wait_for_peers", stream),
            (1000.0, "collective", f"{stream} (lane 2)"),
        ]
    for doc in (replay_doc, analysis_doc):  # A's wait: until rank 1 came, at 6 ms
        waits = [(e["pid"], e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "wait_for_peers"]
        assert waits == [(0, 6000.0)]


def test_a_slice_nested_in_a_node_keeps_its_lane_inside_or_after_the_wait_drawn_in_that_node() -> None:
    # stream 5: [0, 10] waits 0-4; [1, 3] inside the wait, [6, 8] after it: both nest; [3, 5] overlaps it
    stream = np.full(4, 5, dtype=np.int64)
    start = np.array([0, 1, 6, 3], dtype=np.int64)
    end = np.array([10, 3, 8, 5], dtype=np.int64)
    wait = np.array([4, 0, 0, 0], dtype=np.int64)
    assert track_lanes(stream, start, end, np.arange(4), wait).tolist() == [0, 0, 0, 1]
    assert track_lanes(stream, start, end, np.arange(4)).tolist() == [0, 0, 0, 0]
    # no waits given: a slice nested from its holder's first nanosecond nests (none opens a lane)
    assert track_lanes(stream[:2], np.array([0, 0]), np.array([10, 5]), np.arange(2)).tolist() == [0, 0]


def test_the_wait_of_a_node_on_a_second_lane_sends_a_slice_outlasting_it_to_a_third() -> None:
    # stream 5: [0, 10]; [5, 20] overlaps it (lane 2) and waits 5-12; [8, 15] nests in [5, 20] but
    # outlasts its wait, and partly overlaps [0, 10]: a third lane (the wait is on the second, not the first)
    stream = np.full(3, 5, dtype=np.int64)
    start, end = np.array([0, 5, 8], dtype=np.int64), np.array([10, 20, 15], dtype=np.int64)
    wait = np.array([0, 7, 0], dtype=np.int64)
    assert track_lanes(stream, start, end, np.arange(3), wait).tolist() == [0, 1, 2]


def test_both_timelines_draw_a_host_op_blocked_on_a_gpu_sync_as_wait_where_the_analyses_count_compute(
    tmp_path: Path,
) -> None:
    from skewlens.replay.execution import compute_rows, execution_model

    # aten::item copies to the host and synchronises: the execution model's wait node (waiting, not
    # compute, in the breakdown); both timelines drew it as compute (DLRM's rank 0: 9 such ops, 2.56 ms)
    write_gpu_run(GpuRunSpec(world_size=2, steps=2, layers=2, seed=0), tmp_path / "k")
    import_traces(sorted((tmp_path / "k").glob("*.json.gz")), None, tmp_path / "run")
    run = load_run(tmp_path / "run")
    em = execution_model(run)
    analysed = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json")
    replayed = write_perfetto(run, simulate(run), tmp_path / "t.json")
    for path in (analysed, replayed):
        nodes = [e for e in _x_events(json.loads(path.read_text(encoding="utf-8"))) if "node_id" in e["args"]]
        nodes = [e for e in nodes if e["cat"] != "critical_path"]
        for r, rt in run.ranks.items():
            compute = set(rt.node_id[compute_rows(rt, em.ranks[r])].tolist())
            mine = [e for e in nodes if e["pid"] == r]
            assert sorted(e["name"] for e in mine if e["cat"] == "wait") == ["aten::item", "aten::item"], path
            assert {e["args"]["node_id"] for e in mine if e["cat"] == "compute"} == compute, path


def test_the_replay_and_the_analysis_timelines_say_the_same_display_time_unit_ms(tmp_path: Path) -> None:
    # the replay's timeline.json said "ns", the analysis trace "ms", both with ts in µs; chrome://tracing
    # shows "ns" steps in millions of ns, and older Perfetto importers took "ns" as the unit of ts
    run = load_run(build_run(tmp_path / "run", Scenario(world_size=2, steps=1)))
    analysed = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json")
    replayed = write_perfetto(run, simulate(run), tmp_path / "t.json")
    units = [json.loads(p.read_text(encoding="utf-8"))["displayTimeUnit"] for p in (analysed, replayed)]
    assert units == ["ms", "ms"]


def test_only_ranks_the_drawn_critical_path_passes_through_get_a_critical_path_track(tmp_path: Path) -> None:
    # every rank got a 'critical path' track, empty on those the path never visits (DLRM: 6 of 8 ranks)
    run = load_run(
        build_run(tmp_path / "run", Scenario(world_size=4, steps=3, straggler_rank=2, straggler_ns=5 * MS))
    )
    res = analyze_run(run, blame=False)
    on_path = {p.rank for p in res.critical_path}
    assert on_path and on_path != set(run.ranks)
    for cap in (0, 20):  # all, and a cap that keeps the first step(s)
        doc = json.loads(
            write_analysis_perfetto(res, tmp_path / f"a{cap}.json", max_events=cap).read_text("utf-8")
        )
        named = {
            e["pid"]
            for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] == 0
        }
        drawn = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "critical_path"}
        assert named == drawn, cap
        if cap == 0:
            assert drawn == on_path


def test_a_critical_path_arrow_runs_from_where_the_path_picks_up_on_one_rank_to_its_piece_on_the_other(
    tmp_path: Path,
) -> None:
    # perfetto.py: record k + 1 precedes record k in time; where they are of one step on two ranks, an arrow
    # starts ("s") on k + 1's rank at k + 1's node start and ends ("f") on k's rank at k's drawn piece; the
    # arrows are numbered by the jumps of the whole path (1, 2, ...)
    result = analyze_run(load_run(build_run(tmp_path, SC)), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "t.json", max_events=0).read_text())
    t0 = doc["otherData"]["t0_ns"]
    pieces = [e["ts"] for e in _x_events(doc) if e["cat"] == "critical_path"]
    path = result.critical_path
    want_s, want_f, jump, cut = {}, {}, 0, []
    for k in range(len(path) - 1):
        if path[k].step == path[k + 1].step and path[k].rank != path[k + 1].rank:
            jump += 1
            want_s[jump] = (path[k + 1].rank, (path[k + 1].start_ns - t0) / 1000)
            want_f[jump] = (path[k].rank, pieces[k])
            cut.append(pieces[k] != (path[k].start_ns - t0) / 1000)  # drawn after the node's start
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert want_s and {e["id"]: (e["pid"], e["ts"]) for e in flows if e["ph"] == "s"} == want_s
    assert {e["id"]: (e["pid"], e["ts"]) for e in flows if e["ph"] == "f"} == want_f
    assert any(cut)  # the arrow's end is the drawn piece, not the node


def test_a_cap_inside_the_first_step_leaves_out_the_nodes_and_path_pieces_that_start_at_the_cut(
    tmp_path: Path,
) -> None:
    # cap_events: when not even the first step fits, rows that start before until_ns are kept, until_ns
    # being where the first row left out starts. One rank, step 0 = a, b, c (1 ms each, back to back from
    # 1 ms), cap 1: until_ns = b's start (2 ms), so only a is written; the path a <- b <- c is drawn piece
    # by piece from each node's start (each is on it for its whole time): only a's piece, at 1 ms, is kept
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    rb.compute("a", 1 * MS, start_ns=1 * MS)
    rb.compute("b", 1 * MS)
    rb.compute("c", 1 * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "t.json", max_events=1).read_text())
    assert doc["otherData"]["until_ns"] == 2 * MS
    assert [e["name"] for e in _x_events(doc) if e["cat"] != "critical_path"] == ["a"]
    assert [e["name"] for e in _x_events(doc) if e["cat"] == "critical_path"] == ["a"]


def test_the_analysis_trace_begins_at_the_first_node_of_any_rank(tmp_path: Path) -> None:
    # perfetto.py: the origin is the first start of a node written: rank 0 begins at 5 ms, rank 1 at 7 ms
    # -> t0_ns = 5 ms and rank 0's first node is drawn at 0
    b = RunBuilder(2)
    for r in (0, 1):
        b.rank(r).step(0).compute("aten::mm", 2 * MS, start_ns=(5 + 2 * r) * MS)
    result = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    doc = json.loads(write_analysis_perfetto(result, tmp_path / "t.json").read_text())
    assert doc["otherData"]["t0_ns"] == 5 * MS
    assert sorted((e["pid"], e["ts"]) for e in _x_events(doc) if e["cat"] != "critical_path") == [
        (0, 0.0),
        (1, 2000.0),
    ]


def test_the_analysis_trace_begins_at_a_step_that_began_before_its_first_node(tmp_path: Path) -> None:
    # a step mark (an imported Kineto trace's ProfilerStep) may begin before the first node it holds: the
    # 128-GPU trace's step 551 began 2.3 ms before its first node, and its slice on the steps track was
    # written at ts -2305.0, which Perfetto drops. Here rank 0's step 0 is marked from 3 ms, its one node
    # at 5 ms: the origin is the step's start, the step drawn at 0 and the node at 2000 us
    import dataclasses

    from skewlens.profiler.manifest import read_manifest, write_manifest

    b = RunBuilder(1)
    b.rank(0).step(0).compute("aten::mm", 2 * MS, start_ns=5 * MS)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    write_manifest(run, dataclasses.replace(m, steps=(dataclasses.replace(m.steps[0], start_ns=3 * MS),)))
    result = analyze_run(load_run(run), blame=False)
    assert [(s.start_ns, s.end_ns) for s in result.breakdown] == [(3 * MS, 7 * MS)]
    path = write_analysis_perfetto(result, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    assert doc["otherData"]["t0_ns"] == 3 * MS
    steps = [(e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert steps == [(0.0, 4000.0)]
    nodes = [(e["name"], e["ts"]) for e in _x_events(doc) if e["cat"] != "critical_path"]
    assert nodes == [("aten::mm", 2000.0)]
    assert lint(path).lines() == []


def test_a_cap_inside_the_first_step_says_how_long_a_stretch_from_the_first_start_it_kept() -> None:
    # cap_events: the rows that start in the run's first stretch of time, told in the note as "the first
    # <until - first start> ms": starts 1, 2, 3 ms, cap 1 -> until 2 ms, the first 1.000 ms
    starts = {0: np.array([1, 2, 3], dtype=np.int64) * MS}
    cap = cap_events(
        {0: np.ones(3, np.bool_)}, starts, {0: np.zeros(3, np.int32)}, max_events=1, file="f", option="o"
    )
    assert cap.until_ns == 2 * MS and cap.keep[0].tolist() == [True, False, False]
    assert cap.note is not None and "the first 1.000 ms on rank 0" in cap.note


def test_both_timelines_name_the_run_by_its_absolute_path_where_it_was_loaded_by_a_relative_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same analysis run from another directory, with the run named relative or absolute, is the same file
    _run(tmp_path)
    monkeypatch.chdir(tmp_path)
    run = load_run("run")
    analysed = write_analysis_perfetto(analyze_run(run, blame=False), tmp_path / "a.json")
    replayed = write_perfetto(run, simulate(run), tmp_path / "r.json")
    absolute = str((tmp_path / "run").resolve())
    for path in (analysed, replayed):
        assert json.loads(path.read_text(encoding="utf-8"))["otherData"]["run_dir"] == absolute


def test_a_timeline_written_before_the_call_return_column_reads_with_it_null(
    replayed: tuple[RunTrace, SimResult], tmp_path: Path
) -> None:
    # schema version 10 added timeline.return_ns: a version-9 timeline.parquet reads it as null
    from skewlens.profiler.store.schema import META_TABLE, META_VERSION, write_table

    run, sim = replayed
    current = pq.read_table(write_timeline(run, sim, tmp_path / "timeline.parquet"))
    old = current.drop_columns(["return_ns"]).replace_schema_metadata(
        {META_VERSION: b"9", META_TABLE: b"timeline"}
    )
    got = read_table(write_table(old, tmp_path / "v9.parquet"), ReplayedNodeRecord)
    assert got.num_rows == current.num_rows > 0
    assert got["return_ns"].null_count == got.num_rows
    assert got.drop_columns(["return_ns"]).equals(current.drop_columns(["return_ns"]))


def test_a_slice_that_starts_where_a_longer_one_after_it_starts_gets_a_lane_and_one_before_it_nests() -> None:
    # stream 5: a zero-length wait at 0, [0, 4], then [0, 10]: a viewer nests each in the longer one of its
    # start after it by its sort (longest first), so each goes beside it; [12, 20] then [12, 15] nests
    stream = np.full(5, 5, dtype=np.int64)
    start = np.array([0, 0, 0, 12, 12], dtype=np.int64)
    end = np.array([0, 4, 10, 20, 15], dtype=np.int64)
    assert track_lanes(stream, start, end, np.arange(5)).tolist() == [2, 1, 0, 0, 0]
    # in order and none overlaps, but for the zero-length one at the next one's start
    assert track_lanes(stream[:2], np.array([0, 0]), np.array([0, 10]), np.arange(2)).tolist() == [1, 0]
    assert track_lanes(stream[:2], np.array([0, 0]), np.array([10, 0]), np.arange(2)).tolist() == [0, 0]


def test_a_ranks_step_slice_begins_where_its_steps_before_it_ended_and_never_ends_before_it_begins() -> None:
    # rank 0 (ns): step 0 0-10, step 1 2-4 (inside step 0's span), step 2 6-12 (begun before step 0 ended);
    # rank 1's first step is its own; a rank's steps before it marked one (-1) are not drawn
    spans = StepSpans.of([(0, 0, 0, 10), (0, 1, 2, 4), (0, 2, 6, 12), (1, 0, 3, 7), (1, -1, 0, 3)])
    rows = list(
        zip(*(a.tolist() for a in (spans.rank, spans.step, spans.start_ns, spans.end_ns)), strict=True)
    )
    assert rows == [(0, 0, 0, 10), (0, 1, 10, 10), (0, 2, 10, 12), (1, 0, 3, 7)]


def test_the_steps_a_capped_trace_keeps_are_those_of_its_step_range_or_begun_before_its_cut() -> None:
    spans = StepSpans.of([(0, s, 10 * s, 10 * s + 10) for s in range(4)])

    def kept(**cut: Any) -> list[int]:
        cap = EventCap(keep={}, max_events=1, written=0, total=0, **cut)
        return spans.step[spans.kept(cap)].tolist()

    assert kept(steps=(1, 2)) == [1, 2]
    assert kept(until_ns=20) == [0, 1]  # step 2 begins at the cut
    assert kept() == [0, 1, 2, 3]


def test_a_slice_that_starts_with_a_node_and_ends_inside_its_wait_goes_beside_it() -> None:
    # stream 5: [0, 10] waits 0-4 (its wait for peers, written after every node), then [0, 3]: a viewer sorts
    # the wait before [0, 3] (longer, of one start) and nests [0, 3] in it, so it gets a lane of its own
    stream = np.full(2, 5, dtype=np.int64)
    start, end = np.array([0, 0], dtype=np.int64), np.array([10, 3], dtype=np.int64)
    assert track_lanes(stream, start, end, np.arange(2), np.array([4, 0], dtype=np.int64)).tolist() == [0, 1]
