"""Lenient analysis and replay of runs whose communication does not match across ranks, and the reports
around it: missing ranks in one line, process groups counted, long node names cut in the report.

The real case is the sampled pair of a 128-GPU run in ../shared/traces (ranks 0 and 1 issue their
collectives in different orders, and one all_reduce differs in size); what ``check`` must find there is
computed from the raw Kineto files. The synthetic case checks what lenient replay does with the nodes it
skips: they keep their recorded durations and synchronise with no one, while matched collectives still
synchronise.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.render import NAME_WIDTH, critical_path_table
from skewlens.cli import main as skewlens_main
from skewlens.cli.store import check_main
from skewlens.profiler.errors import TraceFormatError, ValidationError
from skewlens.profiler.manifest import read_manifest, write_manifest
from skewlens.profiler.store.issues import (
    DroppedSplits,
    Severity,
    SkippedComm,
    lenient_line,
    rank_ranges,
    summarise_skipped,
)
from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.validate import load_validated, validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SAMPLED = [SHARED / f"a2a_128gpu_sampled_rank{r}_kineto.json.gz" for r in (0, 1)]
MS = 1_000_000
#: Raw ``nccl:*`` annotation name -> collective type.
NCCL_TYPES = {
    "nccl:all_reduce": CommType.ALL_REDUCE,
    "nccl:all_to_all": CommType.ALL_TO_ALL,
    "nccl:_all_gather_base": CommType.ALL_GATHER,
    "nccl:all_gather": CommType.ALL_GATHER,
}
MISMATCH_ERRORS = {"collective-type", "collective-size", "collective-count"}


# ------------------------------------------------------------------------------ the sampled 128-GPU pair


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not all(p.is_file() for p in SAMPLED):
        pytest.skip(f"real GPU traces not found at {SHARED} (see shared/traces/README.md)")
    from skewlens.profiler.importers import import_traces

    out = tmp_path_factory.mktemp("sampled") / "run"
    import_traces(SAMPLED, None, out)
    return out


def _raw_collectives(path: Path) -> list[tuple[CommType, int]]:
    """(type, element count) of each ``nccl:*`` annotation of a raw Kineto file, in issue order."""
    with gzip.open(path) as fh:
        doc: dict[str, Any] = json.load(fh)
    events = sorted(
        (e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") in NCCL_TYPES),
        key=lambda e: e["ts"],
    )
    return [(NCCL_TYPES[e["name"]], int(e["args"]["Input Dims"][0][0])) for e in events]


@pytest.fixture(scope="module")
def raw_mismatches(sampled_run: Path) -> dict[str, set[int]]:
    """What the raw files say disagrees between rank 0 and 1, by the seq of the world group ('0'): the
    positions where the types differ, and where an all_reduce's element counts differ. Only the types the
    importer turns into collectives are numbered (the raw files have no sequence numbers of their own)."""
    imported = load_run(sampled_run, match=False)
    kinds = {
        int(t)
        for rt in imported.ranks.values()
        for t in rt.comm_type[rt.node_type == NodeType.COMM_COLL].tolist()
    }
    r0, r1 = ([c for c in _raw_collectives(p) if int(c[0]) in kinds] for p in SAMPLED)
    assert len(r0) == len(r1) > 0
    types = {k for k, (a, b) in enumerate(zip(r0, r1, strict=True)) if a[0] != b[0]}
    sizes = {
        k
        for k, (a, b) in enumerate(zip(r0, r1, strict=True))
        if a[0] == b[0] == CommType.ALL_REDUCE and a[1] != b[1]
    }
    order: set[int] = set()  # runs of consecutive type mismatches over which both ranks issue the same types
    for k in sorted(types):
        if k - 1 in types:
            continue
        run = [k]
        while run[-1] + 1 in types:
            run.append(run[-1] + 1)
        if len(run) > 1 and sorted(r0[j][0] for j in run) == sorted(r1[j][0] for j in run):
            order.update(run)
    return {"types": types, "sizes": sizes, "order": order}


def _seq_of(message: str) -> int:
    """The sequence number a collective-mismatch message names (``... group '0' seq 3 ...``)."""
    found = re.search(r" seq (\d+)", message)
    assert found is not None, message
    return int(found[1])


def test_check_names_the_size_and_type_mismatches_the_raw_files_show(
    sampled_run: Path, raw_mismatches: dict[str, set[int]]
) -> None:
    report = validate_run(sampled_run)
    errors = report.errors
    assert {e.kind for e in errors} == {"collective-type", "collective-size"}
    named: dict[str, set[int]] = {e.kind: set() for e in errors}
    for e in errors:
        assert "group '0' seq " in e.message
        named[e.kind].add(_seq_of(e.message))
    assert named["collective-type"] == raw_mismatches["types"]
    assert named["collective-size"] == raw_mismatches["sizes"]
    assert raw_mismatches["sizes"] and raw_mismatches["order"]


def test_check_prints_the_missing_ranks_the_groups_and_what_lenient_would_skip(sampled_run: Path) -> None:
    buf = io.StringIO()
    assert check_main([str(sampled_run), "--no-progress"], console=Console(file=buf, width=200)) == 1
    text = buf.getvalue()
    missing = sorted(set(range(128)) - {0, 1})
    no_trace = [line for line in text.splitlines() if "no trace" in line]
    assert len(no_trace) == 1
    assert f"{len(missing)} of 128 ranks have no trace: {rank_ranges(missing)}" in no_trace[0]
    assert rank_ranges(missing) == "2-127"
    assert re.search(r"process groups +1: '0' \(128 ranks", text)
    assert "--lenient" in text and "lenient=true" in text


def test_the_lenient_load_skips_exactly_the_instances_check_reports(
    sampled_run: Path, raw_mismatches: dict[str, set[int]]
) -> None:
    strict = validate_run(sampled_run)
    reported = {_seq_of(e.message) for e in strict.errors if e.kind in MISMATCH_ERRORS}
    lenient = validate_run(sampled_run, lenient=True)
    assert lenient.ok
    assert {i.kind for i in lenient.warnings} >= {"collective-type", "collective-size"}
    assert lenient.run is not None
    skipped = lenient.run.skipped_comm
    assert {s.pg_name for s in skipped} == {"0"}
    assert sorted(q for s in skipped for q in s.seqs) == sorted(reported)
    assert {q for s in skipped if s.reason == "order differs" for q in s.seqs} == raw_mismatches["order"]
    assert {q for s in skipped if s.reason == "sizes differ" for q in s.seqs} == raw_mismatches["sizes"]
    assert strict.run is not None
    kept = {(c.pg_name, c.seq) for c in lenient.run.collectives}
    assert kept == {(c.pg_name, c.seq) for c in strict.run.collectives} - {("0", q) for q in reported}
    (line,) = summarise_skipped(skipped)
    assert line.startswith(f"group '0': {len(reported)} collective instance(s) skipped: ")


def test_without_lenient_analyze_and_replay_refuse_in_one_paragraph_naming_the_group_and_the_option(
    sampled_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        load_validated(sampled_run, lenient_option="--lenient")
    assert "\n" not in str(info.value)
    assert skewlens_main(["analyze", str(sampled_run), "--out", str(tmp_path / "a")]) == 2
    assert skewlens_main(["replay", f"trace={sampled_run}", f"out={tmp_path / 'r'}", "progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    analyze, replay = err
    for line, option in ((analyze, "--lenient"), (replay, "lenient=true")):
        assert "Traceback" not in line
        assert "group '0'" in line and "sizes differ" in line and "order differs" in line
        assert f"With {option} the rest is used" in line
    assert not (tmp_path / "a").exists()


def _skipped_line(out: str) -> str:
    """The one per-group line of what was skipped, joined back where the console wrapped it."""
    flat = " ".join(out.split())
    start = flat.index("group '0': ")
    return flat[start:]


def test_analyze_lenient_writes_its_tables_and_says_what_it_skipped(
    sampled_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "analysis"
    assert skewlens_main(["analyze", str(sampled_run), "--out", str(out), "--lenient", "--no-pictures"]) == 0
    text = capsys.readouterr().err  # warnings, on stderr
    assert (out / "collective_skew.parquet").is_file() and (out / "step_breakdown.parquet").is_file()
    skipped = validate_run(sampled_run, lenient=True).skipped
    n = sum(s.count for s in skipped)
    assert _skipped_line(text).startswith(f"group '0': {n} collective instance(s) skipped: sizes differ")
    assert "126 of 128 ranks have no trace: 2-127" in text
    skew = pq.read_table(out / "collective_skew.parquet").to_pylist()
    skipped_seqs = {q for s in skipped for q in s.seqs}
    assert skew and not {r["seq"] for r in skew if r["pg_name"] == "0"} & skipped_seqs


def test_replay_lenient_writes_its_outputs_and_says_what_it_skipped(
    sampled_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay"
    args = ["replay", f"trace={sampled_run}", f"out={out}", "progress=false", "lenient=true"]
    assert skewlens_main(args) == 0
    text = capsys.readouterr().err  # warnings, on stderr
    for name in ("timeline.parquet", "summary.parquet", "timeline.json", "config.yaml"):
        assert (out / name).is_file()
    assert "lenient: true" in (out / "config.yaml").read_text()
    skipped = load_validated(sampled_run, lenient=True).skipped_comm
    n = sum(s.count for s in skipped)
    assert _skipped_line(text).startswith(f"group '0': {n} collective instance(s) skipped:")
    assert text.count("have no trace") == 1
    # the skipped nodes replayed at their recorded durations
    timeline = pq.read_table(out / "timeline.parquet").to_pylist()
    run = load_validated(sampled_run, lenient=True)
    by_node = {(r["rank"], r["node_id"]): r for r in timeline}
    for s in skipped:
        for rank, row in s.nodes:
            rt = run.ranks[rank]
            rec = by_node[(rank, int(rt.node_id[row]))]
            assert rec["dur_ns"] == int(rt.dur_ns[row])


# --------------------------------------------------------------------------------------- synthetic


def _mismatched_run(tmp_path: Path) -> Path:
    """Two ranks, three all_reduces; the middle one, B, differs in size (rank 0: 4 MiB, rank 1: 2 MiB).

    rank 0: mm 1 ms, A, mm 1 ms, B, mm 1 ms, C; rank 1: mm 5 ms, A, mm 3 ms, B, mm 1 ms, C. As recorded, A,
    B and C each end together on both ranks (rank 0 waited in them for rank 1), so a B that synchronised
    would still wait for rank 1 in replay; a B that does not lasts its recorded 2.3 ms on rank 0."""
    plan = {  # per rank, in program order: (ms of compute before it, collective, bytes, recorded ns)
        0: [(1, "A", 1 << 20, 4_200_000), (1, "B", 4 << 20, 2_300_000), (1, "C", 1 << 20, 200_000)],
        1: [(5, "A", 1 << 20, 200_000), (3, "B", 2 << 20, 300_000), (1, "C", 1 << 20, 200_000)],
    }
    b = RunBuilder(world_size=2)
    for r, ops in plan.items():
        rb = b.rank(r).step(0)
        for mm_ms, name, nbytes, dur_ns in ops:
            rb.compute("aten::mm", dur_ns=mm_ms * MS)
            rb.collective(CommType.ALL_REDUCE, nbytes, dur_ns=dur_ns, name=name)
    return b.write(tmp_path / "run")


def _row(run: Any, rank: int, name: str) -> int:
    rt = run.ranks[rank]
    (row,) = [i for i in range(len(rt)) if rt.name(i) == name]
    return row


def test_a_slowdown_of_a_rank_the_lenient_load_has_no_trace_of_is_refused_naming_the_key(
    sampled_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 5 is in the 128-rank world but only ranks 0 and 1 were traced: a straggler there slowed
    # nothing, and the report said "compute x1.5 on rank 5" with every rank at +0.0%
    args = ["replay", f"trace={sampled_run}", f"out={tmp_path / 'o'}", "progress=false", "lenient=true"]
    assert skewlens_main([*args, "slowdown=straggler", "slowdown.rank=5"]) == 2
    error = (
        "skewlens replay: error: slowdown.entries[0].ranks: rank 5 has no trace in the run (traced: 0-1), so "
        "slowing it would slow nothing; the straggler preset takes it from slowdown.rank"
    )
    assert capsys.readouterr().err.strip().splitlines() == [error]
    assert not (tmp_path / "o").exists()


def test_a_synthetic_size_mismatch_is_refused_strictly_and_skipped_leniently(tmp_path: Path) -> None:
    d = _mismatched_run(tmp_path)
    with pytest.raises(ValidationError, match=r"group '0': 1 collective instance\(s\) disagree: sizes differ "
                       r"\(rank 0: 4 MiB, rank 1: 2 MiB\) at seq 1\. With lenient=true"):  # fmt: skip
        load_validated(d, lenient_option="lenient=true")
    run = load_validated(d, lenient=True)
    assert [(c.pg_name, c.seq) for c in run.collectives] == [("0", 0), ("0", 2)]
    (skip,) = run.skipped_comm
    assert (skip.reason, skip.seqs) == ("sizes differ", (1,))
    assert sorted(skip.nodes) == [(0, _row(run, 0, "B")), (1, _row(run, 1, "B"))]


def test_lenient_replay_keeps_matched_collectives_synchronised_and_the_skipped_one_at_its_recorded_time(
    tmp_path: Path,
) -> None:
    run = load_validated(_mismatched_run(tmp_path), lenient=True)
    factor = 2.0
    slow = SlowdownModel([Slowdown(kind="compute", ranks=(1,), factor=factor)])
    plain, slowed = simulate(run), simulate(run, effects=slow)
    rt0, rt1 = run.ranks[0], run.ranks[1]
    for r, rt in run.ranks.items():  # unmodified, the replay is the recording
        valid = rt.node_type != NodeType.METADATA
        assert np.array_equal(plain.start_ns[r][valid], rt.start_ns[valid])
        assert np.array_equal(plain.end_ns[r][valid], rt.end_ns[valid])
    a0, a1, b0, b1, c0, c1 = (
        _row(run, r, n) for n, r in (("A", 0), ("A", 1), ("B", 0), ("B", 1), ("C", 0), ("C", 1))
    )
    # the matched collectives still synchronise: rank 1's slower compute delays rank 0 through them
    for x0, x1 in ((a0, a1), (c0, c1)):
        assert slowed.end_ns[0][x0] == slowed.end_ns[1][x1]
        assert slowed.end_ns[0][x0] > rt0.end_ns[x0]
    assert slowed.end_ns[0][a0] - slowed.start_ns[1][a1] == rt1.dur_ns[a1]
    # the skipped one waits for no one: recorded duration on each rank, rank 0 done before rank 1 starts it
    for r, row in ((0, b0), (1, b1)):
        assert slowed.end_ns[r][row] - slowed.start_ns[r][row] == run.ranks[r].dur_ns[row]
    assert slowed.end_ns[0][b0] < slowed.start_ns[1][b1]
    assert slowed.start_ns[0][b0] == slowed.end_ns[0][b0 - 1]


def test_a_collective_one_rank_never_issues_is_skipped_as_a_count_difference(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    b.rank(0).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    run = load_validated(b.write(tmp_path / "run"), lenient=True)
    assert [c.seq for c in run.collectives] == [0]
    assert summarise_skipped(run.skipped_comm) == [
        "group '0': 1 collective instance(s) skipped: count differs (absent on rank(s) 1) at seq 1"
    ]


def test_p2p_ops_that_disagree_are_skipped_and_replay_at_their_recorded_durations(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    b.rank(0).send(1, 1 << 20, dur_ns=MS, start_ns=0)
    b.rank(1).recv(0, 2 << 20, dur_ns=3 * MS, start_ns=2 * MS)
    b.rank(1).recv(0, 1 << 20, dur_ns=MS)
    d = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match="p2p op"):
        load_validated(d, lenient_option="--lenient")
    run = load_validated(d, lenient=True)
    assert run.p2p == []
    assert {(s.reason, len(s.nodes)) for s in run.skipped_comm} == {
        ("sizes differ", 2),
        ("no matching send", 1),
    }
    (line,) = summarise_skipped(run.skipped_comm)
    assert line.startswith("group '0': 3 p2p op(s) skipped: ")
    assert "sizes differ (send rank 0: 1 MiB, recv rank 1: 2 MiB)" in line
    sim = simulate(run)
    for r, rt in run.ranks.items():
        comm = np.flatnonzero(rt.node_type != NodeType.METADATA)
        assert np.array_equal(sim.end_ns[r][comm] - sim.start_ns[r][comm], rt.dur_ns[comm])


def test_lenient_real_replay_is_refused_naming_the_key() -> None:
    from test_replay_cli import compose_replay

    from skewlens.replay.errors import ConfigError

    assert compose_replay(["lenient=true"]).lenient is True
    assert compose_replay([]).lenient is False
    with pytest.raises(ConfigError, match=r"^lenient: real replay .* lenient=true works with mode=sim$"):
        compose_replay(["lenient=true", "mode=real"])


# ----------------------------------------------------------------------------------------- reports


def test_missing_ranks_are_one_warning(tmp_path: Path) -> None:
    b = RunBuilder(world_size=6)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=MS)
    report = validate_run(b.write(tmp_path / "run"))
    (issue,) = [i for i in report.issues if i.kind == "missing-rank"]
    assert issue.severity is Severity.WARNING
    assert "4 of 6 ranks have no trace: 2-5 (the manifest says so)" in issue.message


def test_rank_ranges_join_consecutive_ranks() -> None:
    assert rank_ranges([7, 0, 2, 3, 4]) == "0, 2-4, 7"
    assert rank_ranges(range(2, 128)) == "2-127"


def test_the_check_summary_counts_process_groups_and_names_them(tmp_path: Path) -> None:
    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "tp": (0, 1)})
    for r in range(4):
        b.rank(r).compute("aten::mm", dur_ns=MS)
    buf = io.StringIO()
    assert (
        check_main([str(b.write(tmp_path / "run")), "--no-progress"], console=Console(file=buf, width=200))
        == 0
    )
    (line,) = [ln for ln in buf.getvalue().splitlines() if "process groups" in ln]
    assert line.split("process groups", 1)[1].strip() == "2: '0' (4 ranks, default_pg), 'tp' (2 ranks)"


def test_the_check_summary_leaves_out_torchs_undefined_group_description() -> None:
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.render import _groups

    groups = [
        ProcessGroupInfo(name="0", ranks=(0, 1, 2, 3), desc="default_pg"),
        ProcessGroupInfo(name="1", ranks=(0, 1), desc="undefined"),  # new_group() without group_desc
        ProcessGroupInfo(name="2", ranks=(2, 3), desc="mesh_tp"),
    ]
    assert _groups({g.name: g for g in groups}) == (
        "3: '0' (4 ranks, default_pg), '1' (2 ranks), '2' (2 ranks, mesh_tp)"
    )


def test_a_400_character_kernel_name_renders_on_one_line_in_the_critical_path_panel(tmp_path: Path) -> None:
    from skewlens.analysis import analyze_run

    kernel = "void fbgemm_gpu::permute_2D_data_kernel<false, int, int>(" + ", ".join(["int"] * 80) + ")"
    assert len(kernel) >= 400
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).step(0).compute(kernel, dur_ns=(r + 2) * MS, start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    result: AnalysisResult = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert any(rec.name == kernel for rec in result.critical_path)
    buf = io.StringIO()
    Console(file=buf, width=100).print(critical_path_table(result))
    lines = [ln for ln in buf.getvalue().splitlines() if "permute_2D_data_kernel" in ln]
    assert len(lines) == 1
    assert sum("int, int" in ln for ln in buf.getvalue().splitlines()) == 1  # no wrapped continuation
    assert kernel[: NAME_WIDTH // 2] in lines[0] and "…" in lines[0]
    assert len(lines[0]) <= 100


# ------------------------------------------------------------------------------ unreadable ranks


def _three_rank_run(tmp_path: Path) -> Path:
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r).step(0)
        for k in range(2):
            rb.compute("aten::mm", dur_ns=(1 + r + k) * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    return b.write(tmp_path / "run")


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_an_unreadable_rank_is_refused_strictly_and_left_out_leniently(tmp_path: Path, damage: str) -> None:
    from skewlens.profiler.store.issues import run_notes

    d = _three_rank_run(tmp_path)
    f = d / "rank-2.et"
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[:-7])
    else:
        f.unlink()
    why = "truncated message" if damage == "truncated" else "listed but its trace file is missing"
    with pytest.raises(ValidationError, match=re.escape(why)) as refused:
        load_validated(d, lenient_option="--lenient")
    assert str(refused.value).endswith("--lenient would leave out the unreadable rank(s) 2 and use the rest")
    run = load_validated(d, lenient=True)
    assert sorted(run.ranks) == [0, 1]
    assert (run.manifest.ranks, run.manifest.missing_ranks) == ((0, 1), (2,))
    ((rank, text),) = run.left_out_ranks
    assert rank == 2 and why in text and str(f) in text
    assert run_notes(run) == [f"rank 2 left out (lenient): {text}"]
    # check says the same
    out = io.StringIO()
    assert check_main([str(d), "--no-progress"], console=Console(file=out, width=200)) == 1
    hint = out.getvalue().split("use the rest, skipping:")[1].strip().splitlines()
    assert hint == ["rank(s) 2 left out (trace missing or unreadable)"]
    # both all_reduces still match, between the two ranks that remain, and replay as recorded
    assert [(c.pg_name, c.seq, c.ranks) for c in run.collectives] == [("0", 0, (0, 1)), ("0", 1, (0, 1))]
    sim = simulate(run)
    for r, rt in run.ranks.items():
        valid = rt.node_type != NodeType.METADATA
        assert np.array_equal(sim.end_ns[r][valid], rt.end_ns[valid])


def test_a_lenient_check_warns_of_each_unreadable_rank_and_loads_the_others(tmp_path: Path) -> None:
    d = _three_rank_run(tmp_path)
    (d / "rank-2.et").unlink()
    (d / "rank-1.et").write_bytes(b"\x05abc")  # a message that claims 5 bytes and has 3
    report = validate_run(d, lenient=True)
    assert [(i.kind, i.rank, i.severity) for i in report.issues if i.rank in (1, 2)] == [
        ("corrupt-trace", 1, Severity.WARNING),
        ("missing-rank", 2, Severity.WARNING),
    ]
    assert report.run is not None and sorted(report.run.ranks) == [0]


def test_the_refusal_says_lenient_is_not_enough_where_other_errors_remain() -> None:
    from skewlens.profiler.store.issues import Issue
    from skewlens.profiler.store.validate import refusal

    err = Severity.ERROR
    corrupt = Issue(
        severity=err, kind="corrupt-trace", message="r/rank-3.et: cut", file="r/rank-3.et", rank=3
    )
    cycle = Issue(severity=err, kind="dependency-cycle", message="r/rank-1.et: rank 1: a cycle", rank=1)
    text = str(refusal("r", [corrupt, cycle], "not loaded", lenient_option="--lenient"))
    assert text.endswith("(--lenient would leave out the unreadable rank(s) 3, not the rest)")
    gap = Issue(severity=err, kind="missing-rank", message="r: rank 5 of 8 is not in the manifest", rank=5)
    text = str(refusal("r", [gap], "not loaded", lenient_option="--lenient"))
    assert "--lenient" not in text  # a gap in the manifest is no unreadable file
    text = str(refusal("r", [corrupt, gap], "not loaded", lenient_option="--lenient"))
    assert text.endswith("(--lenient would leave out the unreadable rank(s) 3, not the rest)")


def test_a_refusal_with_a_skip_summary_says_lenient_is_not_enough_where_other_errors_remain() -> None:
    # a collective mismatch (its skip summary given, as load_validated gives it) and a dependency cycle:
    # lenient would skip the mismatch but not mend the cycle, so no "the rest is used"
    from skewlens.profiler.store.issues import Issue, SkippedComm
    from skewlens.profiler.store.match import MISMATCH_KINDS
    from skewlens.profiler.store.validate import refusal

    kind = sorted(MISMATCH_KINDS)[0]
    clash = Issue(severity=Severity.ERROR, kind=kind, message="r: group '0' seq 3: sizes differ")
    cycle = Issue(
        severity=Severity.ERROR, kind="dependency-cycle", message="r/rank-1.et: rank 1: a cycle", rank=1
    )
    skipped = [SkippedComm(pg_name="0", p2p=False, reason="sizes differ", detail="", seqs=(3,))]
    text = str(refusal("r", [clash, cycle], "not loaded", skipped=skipped, lenient_option="--lenient"))
    assert "the rest is used" not in text
    assert text.endswith("(--lenient would skip the 1 communication mismatch(es), not the rest)")


def test_the_refusal_says_lenient_uses_the_rest_where_it_covers_every_error_even_without_a_skip_summary() -> (
    None
):
    # every error a communication mismatch, but no per-group summary of what lenient skips passed (a caller
    # other than load_validated): lenient still covers every error, so it uses the rest
    from skewlens.profiler.store.issues import Issue
    from skewlens.profiler.store.match import MISMATCH_KINDS
    from skewlens.profiler.store.validate import refusal

    kind = sorted(MISMATCH_KINDS)[0]
    clash = Issue(severity=Severity.ERROR, kind=kind, message="r: group '0' seq 3: sizes differ")
    text = str(refusal("r", [clash], "not loaded", lenient_option="--lenient"))
    assert text.endswith("; --lenient would skip the 1 communication mismatch(es) and use the rest")


# ------------------------------------------------------------------------- inconsistent all_to_all splits

#: Bytes rank r sends to rank k in the run's two uneven all_to_alls (group-rank order, own chunk included).
A2A_SENDS = [[100, 2_000, 30], [400, 5, 6_000], [70, 800, 9]]


def _splits_run(tmp_path: Path, damage: str) -> tuple[Path, int]:
    """3 ranks, 50 compute nodes each (enough for the column cache), then two uneven all_to_alls; rank 1's
    second one records splits made inconsistent by ``damage``. Returns the run and that node's id."""
    b = RunBuilder(world_size=3)
    bad_node = -1
    for r in range(3):
        rb = b.rank(r).step(0)
        for i in range(50):
            rb.compute(f"aten::op{i % 3}", dur_ns=1000)
        send = A2A_SENDS[r]
        recv = [A2A_SENDS[k][r] for k in range(3)]
        peer = (sum(send) - send[r], sum(recv) - recv[r])
        for k in range(2):
            s, g, p = list(send), list(recv), peer
            if r == 1 and k == 1:
                if damage == "sum-differs":
                    p = (peer[0] + 1_000, peer[1])
                elif damage == "negative":
                    s[0] = -s[0]
                elif damage == "group-size":  # each list consistent, one member too many for the group
                    s.append(0)
                    g.append(0)
                else:  # lengths-differ
                    s.append(0)
            node = rb.collective(CommType.ALL_TO_ALL, sum(send), MS, peer_bytes=p, peer_splits=(s, g))
            if r == 1 and k == 1:
                bad_node = node
    return b.write(tmp_path / "run"), bad_node


@pytest.mark.parametrize("damage", ["sum-differs", "negative", "lengths-differ"])
def test_a_lenient_load_drops_only_the_inconsistent_splits_and_keeps_the_rank(
    tmp_path: Path, damage: str
) -> None:
    from skewlens.profiler.store import colcache
    from skewlens.profiler.store.issues import DroppedSplits, run_notes
    from skewlens.profiler.store.model import RunTrace
    from skewlens.replay.lower import collective_pairs

    d, bad = _splits_run(tmp_path, damage)
    f = d / "rank-1.et"
    node_re = (
        rf"rank-1\.et: rank 1: node {bad} \(c10d::all_to_all_\) at byte offset \d+ has corrupt all_to_all "
        "splits"
    )
    with pytest.raises(TraceFormatError, match=node_re):
        load_run(d)
    with pytest.raises(ValidationError, match=node_re) as refused:
        load_validated(d, lenient_option="--lenient")
    assert str(refused.value).endswith(
        "--lenient would drop the inconsistent all_to_all splits on rank(s) 1 and use the rest"
    )
    runs: list[RunTrace] = []
    for _ in range(2):  # cold (decoded, cache written), then warm (read from the column cache)
        runs.append(load_validated(d, lenient=True))
        assert colcache.cache_path(f).exists()
    for run in runs:
        assert sorted(run.ranks) == [0, 1, 2] and run.left_out_ranks == ()
        rt = run.ranks[1]
        row = int(np.flatnonzero(rt.node_id == bad)[0])
        assert (
            rt.split_ptr is not None and rt.split_send_bytes is not None and rt.split_recv_bytes is not None
        )
        a, b = int(rt.split_ptr[row]), int(rt.split_ptr[row + 1])
        assert a == b  # no splits left on that node
        assert rt.split_send_bytes.tolist() == A2A_SENDS[1]  # the first all_to_all keeps its own
        assert rt.split_recv_bytes.tolist() == [2_000, 5, 800]
        assert rt.send_bytes is not None and rt.recv_bytes is not None
        assert (int(rt.send_bytes[row]), int(rt.recv_bytes[row])) == (-1, -1)  # as a node without splits
        assert int(rt.comm_bytes[row]) == sum(A2A_SENDS[1])  # its recorded comm_size
        ((dropped),) = run.dropped_splits
        assert isinstance(dropped, DroppedSplits)
        assert (dropped.file, dropped.rank, dropped.node_id) == (str(f), 1, bad)
        why = {"sum-differs": "sums to", "negative": "a negative size", "lengths-differ": "lengths differ"}
        assert why[damage] in dropped.reason
        assert [n for n in run_notes(run) if "splits" in n] == [dropped.describe()]
        assert dropped.describe().startswith(f"{f}: rank 1: node {bad}: all_to_all splits dropped (lenient)")
        # rank 1 is costed as an even all_to_all of its comm_size: a third to each member
        second = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL][1]
        pairs = collective_pairs(run, second)
        assert pairs is not None
        even = sum(A2A_SENDS[1]) // 3
        assert [(s, t, n) for s, t, n in pairs if s == 1] == [(1, 0, even), (1, 2, even)]
        assert [(s, t, n) for s, t, n in pairs if s == 0] == [(0, 1, 2_000), (0, 2, 30)]
    assert np.array_equal(runs[0].ranks[1].split_ptr, runs[1].ranks[1].split_ptr)  # type: ignore[arg-type]
    # said once, as a warning naming the file, rank and node; check names the same node as an error
    warned = [i for i in validate_run(d, lenient=True).issues if i.kind == "corrupt-splits"]
    assert [(i.severity, i.file, i.rank, i.node) for i in warned] == [(Severity.WARNING, str(f), 1, bad)]
    out = io.StringIO()
    assert check_main([str(d), "--no-progress"], console=Console(file=out, width=400)) == 1
    hint = out.getvalue().split("use the rest, skipping:")[1].strip().splitlines()
    assert [h.strip() for h in hint] == [runs[0].dropped_splits[0].describe()]


def test_split_lists_of_another_length_than_the_group_are_refused_strictly_and_dropped_leniently(
    tmp_path: Path,
) -> None:
    # rank 1 lists 4 members for its 3-rank group, each list consistent in itself: the load took it, the
    # simulator costed that all_to_all by its busiest member, and only a real replay refused it
    from skewlens.replay.lower import collective_pairs

    d, bad = _splits_run(tmp_path, "group-size")
    why = r"4 entries for a group of 3"
    with pytest.raises(
        TraceFormatError, match=rf"rank-1\.et: rank 1: node {bad} \(c10d::all_to_all_\) .*{why}"
    ):
        load_run(d)
    with pytest.raises(ValidationError, match=why):
        load_validated(d, lenient_option="--lenient")
    run = load_validated(d, lenient=True)
    assert sorted(run.ranks) == [0, 1, 2]
    rt = run.ranks[1]
    row = int(np.flatnonzero(rt.node_id == bad)[0])
    assert rt.split_ptr is not None and rt.split_send_bytes is not None
    assert int(rt.split_ptr[row]) == int(rt.split_ptr[row + 1])  # that node's splits dropped
    assert rt.split_send_bytes.tolist() == A2A_SENDS[1]  # the first all_to_all keeps its own
    assert rt.send_bytes is not None and int(rt.send_bytes[row]) == -1
    ((dropped),) = run.dropped_splits
    assert (dropped.rank, dropped.node_id) == (1, bad) and why in dropped.reason
    second = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL][1]
    pairs = collective_pairs(run, second)
    assert pairs is not None
    even = sum(A2A_SENDS[1]) // 3
    assert [(a, b, n) for a, b, n in pairs if a == 1] == [(1, 0, even), (1, 2, even)]
    warned = [i for i in validate_run(d, lenient=True).issues if i.kind == "corrupt-splits"]
    assert [(i.severity, i.rank, i.node) for i in warned] == [(Severity.WARNING, 1, bad)]


def test_every_replayed_step_counts_its_waits_in_its_window_so_exposed_never_exceeds_all(
    sampled_run: Path,
) -> None:
    # with its GPU twice as slow, rank 1's step 551 read wait_ns 0 and exposed_wait_ns 9.66 ms: the waits
    # were counted by their nodes' step, the exposed part by the step's window (mark to mark)
    from skewlens.replay.summary import summarize

    run = load_validated(sampled_run, lenient=True)
    slow = SlowdownModel([Slowdown(kind="compute", factor=2.0, device="gpu")])
    rows = summarize(run, simulate(run, effects=slow))
    assert len(rows) == 4  # two ranks, two steps
    for row in rows:
        assert row.exposed_wait_ns <= row.wait_ns, (row.rank, row.step)
        assert row.exposed_wait_ns + row.exposed_transfer_ns <= row.step_time_ns, (row.rank, row.step)
    assert max(r.exposed_wait_ns for r in rows) > 1_000_000  # it did wait


def test_a_crashed_ranks_warning_gives_the_manifests_note_after_the_line_not_nested_in_brackets(
    tmp_path: Path,
) -> None:
    b = RunBuilder(world_size=4)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=MS)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    crashed = "no trace: the process crashed or was killed before saving (the command exited with code 1)"
    notes = {**m.notes, "rank 2": crashed, "rank 3": crashed}
    write_manifest(run, dataclasses.replace(m, notes=notes))
    (issue,) = [i for i in validate_run(run).issues if i.kind == "missing-rank"]
    # was "... have no trace: 2-3 (no trace: the process crashed ... (the command exited with code 1)) (the
    # manifest says so)"
    assert issue.message == (
        f"{run}: 2 of 4 ranks have no trace: 2-3 (the manifest says so): the process crashed or was killed "
        "before saving (the command exited with code 1)"
    )
    write_manifest(
        run, dataclasses.replace(m, notes={**notes, "rank 3": "no Kineto trace given for this rank"})
    )
    (issue,) = [i for i in validate_run(run).issues if i.kind == "missing-rank"]
    assert issue.message == (
        f"{run}: 2 of 4 ranks have no trace: 2-3 (the manifest says so): 2: the process crashed or was "
        "killed before saving (the command exited with code 1); 3: no Kineto trace given for this rank"
    )


def _pairs_run(tmp_path: Path, world: int, *, recv_bytes: int = 1024) -> Path:
    """``world`` ranks, an all_reduce then even rank r sending 1 KiB to r + 1 (rank 1 expects
    ``recv_bytes``)."""
    b = RunBuilder(world_size=world)
    for r in range(world):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
        if r % 2 == 0:
            rb.send(r + 1, 1024, dur_ns=MS)
        else:
            rb.recv(r - 1, recv_bytes if r == 1 else 1024, dur_ns=MS)
    return b.write(tmp_path / "run")


def test_the_ranks_a_lenient_load_leaves_out_are_one_line_per_reason_with_their_ranks(tmp_path: Path) -> None:
    from skewlens.profiler.store.issues import run_notes

    d = _pairs_run(tmp_path, 64)
    for r in range(54, 64):
        (d / f"rank-{r}.et").unlink()
    for r in (20, 21):  # cut at different places
        f = d / f"rank-{r}.et"
        f.write_bytes(f.read_bytes()[: -7 - r])
    f = d / "rank-30.et"
    f.write_bytes(b"")
    run = load_validated(d, lenient=True)
    assert run_notes(run)[:3] == [
        (
            f"ranks 20-21 left out (lenient): {d}/rank-<r>.et: truncated message"
            " (at a different place in each file)"
        ),
        f"rank 30 left out (lenient): {d}/rank-30.et: empty file, expected a Chakra GlobalMetadata message",
        f"ranks 54-63 left out (lenient): {d}/rank-<r>.et: rank <r> is listed but its trace file is missing",
    ]
    assert not any(n.startswith("rank 55 ") for n in run_notes(run))


def test_a_run_directory_whose_path_holds_a_ranks_number_keeps_that_rank_with_the_others_of_its_reason(
    tmp_path: Path,
) -> None:
    # with the run under .../job-5/, rank 5's path digits were taken for its number: "ranks 4, 6-7" and a
    # row of its own for rank 5 (as under pytest's numbered tmp directories, which made two tests flaky)
    from skewlens.profiler.store.issues import by_reason, run_notes

    d = _pairs_run(tmp_path / "job-5", 8)
    for r in range(4, 8):
        (d / f"rank-{r}.et").unlink()
    assert run_notes(load_validated(d, lenient=True))[0] == (
        f"ranks 4-7 left out (lenient): {d}/rank-<r>.et: rank <r> is listed but its trace file is missing"
    )
    # the rank's number in the forms the messages give it: a file's name, a Kineto file's, a phrase
    said = [(r, f"/x/3/rank-{r}.et, rank{r}_kineto.json: rank {r} of 4 is 3 ms late") for r in (2, 3)]
    assert by_reason(said) == [([2, 3], "/x/3/rank-<r>.et, rank<r>_kineto.json: rank <r> of 4 is 3 ms late")]


def test_the_ranks_of_a_chakra_prefix_that_break_alike_are_one_row_naming_their_files_by_prefix() -> None:
    # a run given as Chakra traces <prefix>.<rank>.et carries its rank's number after a dot, not "rank":
    # check gave each rank of such a run a row of its own (128 rows for 128 ranks truncated alike)
    from skewlens.profiler.store.issues import by_reason

    said = [(r, f"/x/3/trace.{r}.et: truncated message at byte offset 0") for r in range(4)]
    assert by_reason(said) == [([0, 1, 2, 3], "/x/3/trace.<r>.et: truncated message at byte offset 0")]


def test_a_ranks_number_inside_a_longer_number_or_word_is_not_taken_for_it_when_grouping_by_reason() -> None:
    # rank 1's text holds rank-12 and prerank1, which are not rank 1's number: ranks 1 and 2 say the same
    from skewlens.profiler.store.issues import by_reason

    said = [(r, f"/x/rank-12/prerank1/rank-{r}.et: rank {r} is late") for r in (1, 2)]
    assert by_reason(said) == [([1, 2], "/x/rank-12/prerank1/rank-<r>.et: rank <r> is late")]
    # a Chakra prefix's number before .et is the rank's, not one before .etc: 1 and 2 say different things
    said = [(r, f"/x/trace.{r}.et and /y/trace.{r}.etc: rank {r} is late") for r in (1, 2)]
    assert by_reason(said) == [
        ([1], "/x/trace.1.et and /y/trace.1.etc: rank 1 is late"),
        ([2], "/x/trace.2.et and /y/trace.2.etc: rank 2 is late"),
    ]


def test_counts_and_rank_ranges_say_every_rank_they_leave_unnamed_and_group_thousands() -> None:
    from skewlens.profiler.store.issues import SHOWN_RANGES, counted, rank_ranges

    assert [counted(n, "rank") for n in (0, 1, 2, 1024)] == ["0 ranks", "1 rank", "2 ranks", "1,024 ranks"]
    # the ranges past the shown ones: 2 ranks (100-101) and 1 (200)
    ranks = [2 * k for k in range(SHOWN_RANGES)] + [100, 101, 200]
    assert rank_ranges(ranks).endswith(f"{2 * (SHOWN_RANGES - 1)} and 3 more")


def test_check_gives_the_missing_ranks_one_row_so_the_p2p_size_error_is_not_cut(tmp_path: Path) -> None:
    d = _pairs_run(tmp_path, 64, recv_bytes=2048)
    for r in range(8, 64):
        (d / f"rank-{r}.et").unlink()
    out = io.StringIO()
    assert check_main([str(d), "--no-progress"], console=Console(file=out, width=300)) == 1
    rows = [ln.split("│")[1:-1] for ln in out.getvalue().splitlines() if ln.startswith("│")]
    assert [(c[1].strip(), c[2].strip()) for c in rows] == [("missing-rank", "8-63"), ("p2p-size", "0")]
    assert rows[0][4].strip() == f"{d}/rank-<r>.et: rank <r> is listed but its trace file is missing"
    assert "more (use --all)" not in out.getvalue()
    assert "FAILED: 57 error(s)" in out.getvalue()
    # --all lists every issue on its own row
    out = io.StringIO()
    check_main([str(d), "--no-progress", "--all"], console=Console(file=out, width=300))
    assert sum(ln.startswith("│") for ln in out.getvalue().splitlines()) == 57


def test_the_check_summary_names_a_meshs_groups_by_dimension_in_the_order_of_their_numbers() -> None:
    # an 8-rank pp x dp x tp capture's summary read "13: '0' (8 ranks, default_pg), '1' (2 ranks, mesh_pp),
    # '10' (2 ranks, mesh_tp), '11' ..., '4' (2 ranks, mesh_pp), ... 5 more": by name as text, eight
    # entries, not one of the dp groups among them
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.render import _groups

    groups = [ProcessGroupInfo(name="0", ranks=tuple(range(8)), desc="default_pg")]
    for k, dim in enumerate(("pp", "dp", "tp")):
        groups += [
            ProcessGroupInfo(name=str(1 + 4 * k + j), ranks=(j, j + 4), desc=f"mesh_{dim}") for j in range(4)
        ]
    assert _groups({g.name: g for g in groups}) == (
        "13: '0' (8 ranks, default_pg), mesh_pp: '1', '2', '3', '4' (2 ranks each), "
        "mesh_dp: '5', '6', '7', '8' (2 ranks each), mesh_tp: '9', '10', '11', '12' (2 ranks each)"
    )
    wide = [ProcessGroupInfo(name=str(k), ranks=(2 * k, 2 * k + 1), desc="mesh_tp") for k in range(1, 129)]
    assert (
        _groups({g.name: g for g in wide}) == "128: mesh_tp: '1', '2', '3', '4', ... 124 more (2 ranks each)"
    )


def test_a_groups_members_are_listed_one_by_one_up_to_eight_in_group_rank_order_and_as_ranges_past_that() -> (
    None
):
    # the worst-collectives caption names each group's members: one rank is 'rank', eight are still listed
    # in the program's (sort_ranks=False) order, and nine or more are counted and given as ranges
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.render import group_members

    def members(ranks: tuple[int, ...]) -> str:
        return group_members(ProcessGroupInfo(name="7", ranks=ranks, desc="undefined"))

    assert members((3,)) == "rank 3"
    assert members((3, 1)) == "ranks 3, 1"
    assert members((7, 6, 5, 4, 3, 2, 1, 0)) == "ranks 7, 6, 5, 4, 3, 2, 1, 0"
    assert members(tuple(range(9))) == "9 ranks: 0-8"


def test_a_lenient_report_saved_from_stdout_says_what_the_load_left_out_on_its_first_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # what a lenient load left out went to stderr alone: a report saved with > report.txt never said it
    mismatched = _mismatched_run(tmp_path / "a")
    args = ["analyze", str(mismatched), "--out", str(tmp_path / "analysis"), "--lenient", "--no-pictures"]
    assert skewlens_main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "lenient: 1 collective instance(s) not matched across ranks, at their recorded durations; the "
        "warnings on stderr say why"
    )
    (d := _three_rank_run(tmp_path / "b") / "rank-2.et").unlink()
    args = ["replay", f"trace={d.parent}", f"out={tmp_path / 'replay'}", "progress=false", "lenient=true"]
    assert skewlens_main(args) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == "lenient: left out rank 2; the warnings on stderr say why"
    assert printed.count("lenient:") == 1
    # a run the load left nothing out of: no such line
    whole = _three_rank_run(tmp_path / "c")
    args = ["replay", f"trace={whole}", f"out={tmp_path / 'whole'}", "progress=false", "lenient=true"]
    assert skewlens_main(args) == 0
    assert "lenient:" not in capsys.readouterr().out


def test_the_lenient_line_counts_collectives_and_p2p_ops_apart_and_the_dropped_splits(tmp_path: Path) -> None:
    # 3 collective instances of one group, 2 p2p ops of a pair, the splits of 2 all_to_all nodes
    run = dataclasses.replace(
        load_run(_three_rank_run(tmp_path / "run")),
        skipped_comm=(
            SkippedComm(pg_name="0", p2p=False, reason="r", detail="", seqs=(1, 2, 3)),
            SkippedComm(pg_name="0", p2p=True, reason="r", detail="", nodes=((0, 5), (1, 6))),
        ),
        dropped_splits=tuple(DroppedSplits(file="rank-0.et", rank=0, node_id=n, reason="r") for n in (7, 9)),
    )
    assert lenient_line(run) == (
        "lenient: 3 collective instance(s) and 2 p2p op(s) not matched across ranks, at their recorded "
        "durations; the all_to_all splits of 2 node(s) dropped; the warnings on stderr say why"
    )


# ---------------------------------------------------------------------- ranks of another run, absent members


def _straggler_run(path: Path, *, start_ns: int = 0, source: str = "synthetic") -> Path:
    """Three ranks, two steps of an all_reduce after compute: rank 2's 10 ms longer, rank 1's 2 ms
    (``source``: the manifest's)."""
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for k in range(2):
            rb.step(k).compute(
                "aten::mm", dur_ns=(5 + {0: 0, 1: 2, 2: 10}[r]) * MS, start_ns=start_ns if k == 0 else None
            )
            rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    return b.write(path, source=source)


def test_a_rank_file_of_another_run_is_refused_naming_it_and_left_out_leniently(tmp_path: Path) -> None:
    d = _straggler_run(tmp_path / "run")
    other = _straggler_run(tmp_path / "other", start_ns=10_000 * MS)
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    why = (
        f"{d / 'rank-2.et'}: rank 2's trace is not this run's: none of its 4 node(s) of steps 0-1 ran in "
        "those steps as the manifest records them for rank 2; they ran 9.968 s after them: a trace of "
        "another run or capture copied in?"
    )
    with pytest.raises(ValidationError, match=re.escape(why)):
        load_validated(d, lenient_option="--lenient")
    out = io.StringIO()
    assert check_main([str(d), "--no-progress"], console=Console(file=out, width=400)) == 1
    assert why in out.getvalue()
    run = load_validated(d, lenient=True)
    assert sorted(run.ranks) == [0, 1]
    assert run.left_out_ranks == ((2, why),)
    # and the export, which reads each rank on its own, refuses it too
    from skewlens.profiler.store.parquet import export_run

    with pytest.raises(ValidationError, match=re.escape(why)):
        export_run(d, tmp_path / "pq", workers=1)
    assert not (tmp_path / "pq").exists()


def test_the_remedy_for_a_rank_file_of_another_run_says_it_leaves_the_rank_out_as_another_runs(
    tmp_path: Path,
) -> None:
    # check said "rank(s) 2 left out (trace missing or unreadable)" and the refusal "leave out the unreadable
    # rank(s) 2" of a file that reads whole: it is left out for being another run's
    d = _straggler_run(tmp_path / "run")
    other = _straggler_run(tmp_path / "other", start_ns=10_000 * MS)
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    with pytest.raises(ValidationError) as refused:
        load_validated(d, lenient_option="--lenient")
    assert str(refused.value).endswith(
        "--lenient would leave out rank(s) 2 (another run's trace) and use the rest"
    )
    out = io.StringIO()
    assert check_main([str(d), "--no-progress"], console=Console(file=out, width=400)) == 1
    hint = out.getvalue().split("use the rest, skipping:")[1].strip().splitlines()
    assert hint == ["rank(s) 2 left out (another run's trace)"]


def test_an_imported_runs_rank_file_is_not_refused_for_nodes_outside_its_manifests_steps(
    tmp_path: Path,
) -> None:
    # an import's steps are read from its own files, and a step's GPU work may lie wholly outside the span
    # it is given (the step before the profiler started): its spans say nothing of which run a file is of
    d = _straggler_run(tmp_path / "run", source="import")
    other = _straggler_run(tmp_path / "other", start_ns=10_000 * MS, source="import")
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    run = load_validated(d)
    assert sorted(run.ranks) == [0, 1, 2]
    assert int(run.ranks[2].start_ns.max()) > 10_000 * MS  # the other run's file, loaded as it is


def test_a_collective_whose_group_has_a_member_without_a_trace_is_blamed_on_no_traced_rank(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.index import build_index
    from skewlens.analysis.records import CauseKind
    from skewlens.analysis.skew import analyze_skew

    d = _straggler_run(tmp_path / "run")
    whole = analyze_skew(build_index(load_validated(d)))
    assert [(e.late_rank, e.blamed_rank) for e in whole.events] == [(2, 2), (2, 2)]
    (d / "rank-2.et").unlink()  # the straggler's trace is lost
    skew = analyze_skew(build_index(load_validated(d, lenient=True)))
    # rank 1, the last traced member, is not blamed for the waits rank 2 may have caused: no rank is
    assert skew.caused_wait_ns == {}
    assert [e.blamed_rank for e in skew.events] == [-1, -1]
    for e in skew.events:
        assert (e.late_rank, e.blamed_rank, e.cause.kind) == (1, -1, CauseKind.UNTRACED)
        assert e.cause.text == "rank(s) 2 of the group have no trace: who was late is unknown"
    assert skew.events[0].skew_ns == 2 * MS  # among the traced members, as recorded
    assert skew.top_cause_in() == {}


def test_a_modelled_replay_without_a_ranks_trace_says_it_models_no_wait_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the straggler's trace lost: comm_mode=model synchronises the traced members alone, so the time they
    # waited for rank 2 is gone; the report said only "lenient: left out rank 2"
    d = _straggler_run(tmp_path / "run")
    (d / "rank-2.et").unlink()
    said = (
        "no trace of rank 2: 2 collective instance(s) of groups with rank 2 synchronise the traced members "
        "only, and comm_mode=model models no wait for rank 2 there (as if never late), so steps may be "
        "shorter than the run's; comm_mode=as_recorded keeps those waits in the recorded transfers"
    )
    for mode, says in (("model", True), ("as_recorded", False)):
        args = ["replay", f"trace={d}", f"out={tmp_path / mode}", "progress=false", "lenient=true"]
        assert skewlens_main([*args, f"comm_mode={mode}"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "lenient: left out rank 2; the warnings on stderr say why"
        assert (said in lines) is says


def test_an_analysis_without_a_ranks_trace_says_first_that_its_waits_are_blamed_on_no_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _straggler_run(tmp_path / "run")
    assert skewlens_main(["analyze", str(d), "--out", str(tmp_path / "whole")]) == 0
    assert "no trace of" not in capsys.readouterr().out
    (d / "rank-2.et").unlink()
    assert skewlens_main(["analyze", str(d), "--out", str(tmp_path / "out"), "--lenient"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "no trace of rank 2: 2 collective instance(s) of groups with rank 2 synchronise the traced members "
        "only: their waits are blamed on no rank, and the what-if costs keep the time spent waiting for "
        "rank 2 as recorded, so lateness passed on through rank 2 is not in them"
    )


def test_a_rank_whose_nodes_ran_just_past_its_step_marks_is_not_refused_as_another_runs(
    tmp_path: Path,
) -> None:
    # a step mark may end before its op does (a profiler's step annotation): rank 2's nodes moved 20 ms
    # past their steps' marks (under a second, and under nothing like the 9.968 s of another run's file)
    # are this run's; before, the refusal fired on any node outside its step's mark
    d = _straggler_run(tmp_path / "run")
    other = _straggler_run(tmp_path / "other", start_ns=20 * MS)
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    run = load_validated(d, lenient_option="--lenient")
    assert sorted(run.ranks) == [0, 1, 2]


def _long_steps_run(path: Path, *, start_ns: int) -> Path:
    """_straggler_run's three ranks with steps of 1.5 s of compute each (the steps span 3.0 s)."""
    b = RunBuilder(world_size=3)
    for r in range(3):
        rb = b.rank(r)
        for k in range(2):
            rb.step(k).compute("aten::mm", dur_ns=1500 * MS, start_ns=start_ns if k == 0 else None)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=MS)
    return b.write(path)


@pytest.mark.parametrize(
    ("other_start_s", "refused"), [(15.0, False), (17.0, True), (6.4, False), (3.0, True)]
)
def test_a_rank_file_is_refused_as_another_runs_only_past_a_second_and_the_steps_whole_span_from_them(
    tmp_path: Path, other_start_s: float, refused: bool
) -> None:
    # steps of 1.5 s (3.0 s in all, 10-13.002 s): a rank file whose nodes ran 2 s after them (another run
    # started at 15 s) or ended 0.6 s before them (one started at 6.4 s, its nodes spanning 3 s) is within
    # the steps' span of them, where marks and nodes may just disagree; 4 s after or 4 s before is apart
    d = _long_steps_run(tmp_path / "run", start_ns=10_000 * MS)
    other = _long_steps_run(tmp_path / "other", start_ns=round(other_start_s * 1000) * MS)
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    if refused:
        side = "after" if other_start_s > 10 else "before"
        with pytest.raises(
            ValidationError, match=rf"rank 2's trace is not this run's: .*; they ran 3\.99\d s {side}"
        ):
            load_validated(d, lenient_option="--lenient")
    else:
        assert sorted(load_validated(d, lenient_option="--lenient").ranks) == [0, 1, 2]


def _late_from_another_group(path: Path, *, late: tuple[int, ...]) -> Path:
    """A step where rank 1 spends 31 ms in an all_reduce of group "late" (members ``late``, rank 1 first)
    waiting for its last member (40 ms of compute, the others 10), then comes 31 ms late to the all_reduce of
    group "duo" (ranks 0 and 1) that rank 0 waits at."""
    world = max(late) + 1
    b = RunBuilder(world_size=world, groups={"late": late, "duo": (0, 1)})
    for r in range(world):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=(40 if r == late[-1] else 10) * MS, start_ns=0)
        if r in late:
            rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=(31 if r == 1 else 1) * MS, pg="late")
        if r < 2:
            rb.collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=(32 if r == 0 else 1) * MS, pg="duo")
    return b.write(path)


def test_lateness_passed_on_from_a_wait_for_a_member_without_a_trace_is_blamed_on_no_rank(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.index import build_index
    from skewlens.analysis.records import CauseKind
    from skewlens.analysis.skew import analyze_skew

    # rank 1 waits 30 ms for rank 3 at an all_reduce of group "late", whose rank 2's trace is lost (it may
    # have been later still), so it comes 30 ms late to the all_reduce of group "duo" that rank 0 waits at:
    # that lateness may be rank 2's, and no rank is blamed for it
    d = _late_from_another_group(tmp_path / "run", late=(1, 2, 3))
    (d / "rank-2.et").unlink()
    skew = analyze_skew(build_index(load_validated(d, lenient=True)))
    assert [(e.pg_name, e.late_rank, e.blamed_rank) for e in skew.events] == [("late", 3, -1), ("duo", 1, -1)]
    assert skew.events[1].cause.kind is CauseKind.UNTRACED
    assert skew.events[1].cause.passed_on
    assert skew.caused_wait_ns == {}


def test_lateness_passed_on_from_a_wait_where_the_rank_was_the_only_traced_member_is_blamed_on_no_rank(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.index import build_index
    from skewlens.analysis.records import CauseKind
    from skewlens.analysis.skew import analyze_skew

    # rank 1 spends 31 ms in an all_reduce of group "late" waiting for rank 2, whose trace is lost: as its
    # only traced member it waited for no traced rank, yet it comes 30 ms late to the all_reduce of group
    # "duo" that rank 0 waits at, and that lateness may be rank 2's: no rank is blamed for it (before, rank
    # 1 was, with cause none, and caused 31 ms of rank 0's wait)
    d = _late_from_another_group(tmp_path / "run", late=(1, 2))
    (d / "rank-2.et").unlink()
    skew = analyze_skew(build_index(load_validated(d, lenient=True)))
    assert [(e.pg_name, e.ranks, e.late_rank, e.blamed_rank) for e in skew.events] == [
        ("late", (1,), 1, -1),
        ("duo", (0, 1), 1, -1),
    ]
    duo = skew.events[1]
    assert (duo.cause.kind, duo.cause.passed_on, duo.cause.untraced) == (CauseKind.UNTRACED, True, (2,))
    assert duo.late_by_ns == 31 * MS
    assert skew.events[0].wait_ns.tolist() == [0]  # the event keeps its recorded waits
    assert skew.caused_wait_ns == {}


def test_a_send_between_traced_ranks_of_a_group_with_a_rank_without_a_trace_is_blamed_on_the_sender(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.index import build_index
    from skewlens.analysis.records import CauseKind
    from skewlens.analysis.skew import analyze_skew

    # a send of rank 1's, 30 ms late, to rank 0 on the world group, whose rank 2's trace is lost: both
    # members of the pair are traced, so rank 1 is blamed (only a collective may have waited for rank 2)
    b = RunBuilder(world_size=3)
    b.rank(0).step(0).compute("aten::mm", dur_ns=10 * MS, start_ns=0)
    b.rank(0).recv(1, 1 << 20, 31 * MS)
    b.rank(1).step(0).compute("aten::mm", dur_ns=40 * MS, start_ns=0)
    b.rank(1).send(0, 1 << 20, MS)
    b.rank(2).step(0).compute("aten::mm", dur_ns=10 * MS, start_ns=0)
    d = b.write(tmp_path / "run")
    (d / "rank-2.et").unlink()
    (e,) = analyze_skew(build_index(load_validated(d, lenient=True))).events
    assert (e.kind, e.late_rank, e.blamed_rank) == ("p2p", 1, 1)
    assert e.cause.kind is not CauseKind.UNTRACED


def test_the_worst_collectives_table_blames_no_rank_for_a_collective_with_a_member_without_a_trace(
    tmp_path: Path,
) -> None:
    from skewlens.analysis.api import analyze_run
    from skewlens.analysis.render import worst_collectives_table

    d = _straggler_run(tmp_path / "run")
    (d / "rank-2.et").unlink()
    buf = io.StringIO()
    Console(file=buf, width=250).print(worst_collectives_table(analyze_run(load_validated(d, lenient=True))))
    text = buf.getvalue()
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    # late: the last traced member; blamed: none
    assert [(row[5], row[6]) for row in rows] == [("1", "-")] * 2
    assert (
        "blamed -: a member of the group has no trace and may have arrived last: late is the last traced "
        "member, and its members' waits are charged to no rank"
    ) in " ".join(text.split())


def test_a_rank_file_of_a_run_that_ran_before_this_one_is_refused_saying_how_long_before(
    tmp_path: Path,
) -> None:
    # the mirror of the file that ran 9.968 s after: one of a run 10 s earlier (this run starting at 10 s);
    # a file whose nodes ran among this run's steps, each outside its own, is no longer refused (5f0dd6d:
    # a step mark may disagree with its nodes' times), so only a file apart from the steps is
    d = _straggler_run(tmp_path / "run", start_ns=10_000 * MS)
    other = _straggler_run(tmp_path / "other")
    (d / "rank-2.et").write_bytes((other / "rank-2.et").read_bytes())
    with pytest.raises(
        ValidationError, match=r"rank 2's trace is not this run's: .*; they ran 9\.9\d\d s before"
    ):
        load_validated(d, lenient_option="--lenient")
