"""``validate_run`` / ``load_validated`` / ``skewlens check``: hand-made broken traces, one per problem."""

from __future__ import annotations

import dataclasses
import io
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as pb
from rich.console import Console

from skewlens.cli.store import check_main
from skewlens.profiler.chakra_io import EtWriter, TraceNode
from skewlens.profiler.errors import ValidationError
from skewlens.profiler.manifest import PARTS_DIR, rank_file, read_manifest, write_manifest
from skewlens.profiler.store.issues import Severity, run_notes
from skewlens.profiler.store.validate import find_cycle, load_validated, validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType


def _good_run(tmp_path: Path, world: int = 2) -> Path:
    b = RunBuilder(world)
    for r in range(world):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 1_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, 4096, 100)
        rb.collective(CommType.ALL_GATHER, 1024, 100)
    return b.write(tmp_path / "run")


def _rewrite_rank(run: Path, rank: int, nodes: list[TraceNode | pb.Node]) -> None:
    with EtWriter(rank_file(run, rank), {"rank": rank}) as w:
        w.write_all(nodes)


def _comp(node_id: int, name: str, deps: tuple[int, ...] = ()) -> TraceNode:
    return TraceNode(
        node_id=node_id, name=name, node_type=NodeType.COMP, start_ns=0, dur_ns=1, ctrl_deps=deps
    )


def _errors(path: Path, kind: str) -> list[str]:
    report = validate_run(path)
    return [i.message for i in report.errors if i.kind == kind]


def test_a_consistent_run_validates_without_problems(tmp_path: Path) -> None:
    report = validate_run(_good_run(tmp_path))
    assert report.ok and report.errors == [] and report.warnings == []
    assert report.run is not None and len(report.run.collectives) == 2


def test_truncated_file_is_reported_with_file_and_byte_offset(tmp_path: Path) -> None:
    run = _good_run(tmp_path)
    f = rank_file(run, 1)
    data = f.read_bytes()
    f.write_bytes(data[:-7])
    (msg,) = _errors(run, "corrupt-trace")
    assert "rank-1.et: truncated message at byte offset" in msg
    offset = int(msg.split("byte offset ")[1].split(":")[0])
    assert 0 < offset < len(data) - 7


def test_corrupt_protobuf_inside_a_message_is_reported_with_its_offset(tmp_path: Path) -> None:
    run = _good_run(tmp_path)
    f = rank_file(run, 0)
    good = f.read_bytes()
    f.write_bytes(good + encode_message_bytes(b"\x0a\xff\xff\xff"))  # field 1 as a string claiming 2 MiB
    (msg,) = _errors(run, "corrupt-trace")
    assert f"rank-0.et: corrupt node message at byte offset {len(good)}" in msg


def encode_message_bytes(body: bytes) -> bytes:
    return bytes([len(body)]) + body


def test_unknown_node_type_names_the_node(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _rewrite_rank(run, 0, [_comp(1, "ok"), pb.Node(id=2, name="weird", type=42)])
    (msg,) = _errors(run, "unknown-node-type")
    assert "rank-0.et: rank 0: node 2 (weird)" in msg and "unknown node type 42" in msg


def test_dangling_dependency_names_both_nodes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _rewrite_rank(run, 0, [_comp(1, "a"), _comp(2, "b", deps=(1, 99))])
    (msg,) = _errors(run, "dangling-dependency")
    assert "node 2 (b) depends on node 99, which does not exist" in msg


def test_a_launch_inside_a_node_is_read_as_its_row_and_one_inside_a_missing_node_names_both(
    tmp_path: Path,
) -> None:
    run = _good_run(tmp_path)
    copy = TraceNode(node_id=3, name="Memcpy DtoH", node_type=NodeType.COMP, start_ns=5, dur_ns=1)
    item = _comp(2, "aten::item")
    _rewrite_rank(run, 1, [item, dataclasses.replace(copy, attrs={"is_cpu_op": False, "skl_launched_in": 2})])
    _rewrite_rank(
        run, 0, [item, dataclasses.replace(copy, attrs={"is_cpu_op": False, "skl_launched_in": 77})]
    )
    (msg,) = _errors(run, "dangling-dependency")
    assert "rank 0: node 3 (Memcpy DtoH) was launched inside node 77 (skl_launched_in), which does" in msg
    rt = validate_run(run).run.ranks[1]  # type: ignore[union-attr]
    assert rt.launched_in is not None and rt.launched_in.tolist() == [-1, 0]  # rows, not ids


def test_dependency_cycle_prints_the_cycles_ids_and_names(tmp_path: Path) -> None:
    run = tmp_path / "run"
    nodes = [_comp(1, "root"), _comp(2, "a", deps=(1, 4)), _comp(3, "b", deps=(2,)), _comp(4, "c", deps=(3,))]
    _rewrite_rank(run, 0, nodes)
    (msg,) = _errors(run, "dependency-cycle")
    chain = msg.split("dependency cycle: ")[1].split(" -> ")
    assert chain[0] == chain[-1]
    assert sorted(set(chain)) == ["2 (a)", "3 (b)", "4 (c)"]


def test_a_node_depending_on_itself_is_a_cycle(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _rewrite_rank(run, 0, [_comp(1, "self", deps=(1,))])
    (msg,) = _errors(run, "dependency-cycle")
    assert msg.endswith("dependency cycle: 1 (self) -> 1 (self)")


def test_duplicate_node_ids_are_reported_with_both_offsets(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _rewrite_rank(run, 0, [_comp(1, "a"), _comp(7, "b"), _comp(7, "c")])
    (msg,) = _errors(run, "duplicate-node-id")
    assert "rank 0: duplicate node id 7 (rows 1 and 2, byte offsets" in msg


def test_rank_listed_in_the_manifest_without_a_file_is_missing(tmp_path: Path) -> None:
    run = _good_run(tmp_path, world=3)
    rank_file(run, 2).unlink()
    msgs = _errors(run, "missing-rank")
    assert msgs == [f"{rank_file(run, 2)}: rank 2 is listed but its trace file is missing"]


def _capture_under_way(tmp_path: Path, *, saved: tuple[int, ...]) -> Path:
    """A 2-rank run as ``skewlens profile`` leaves it while still writing it: the ranks ``saved`` have their
    trace and part file, ``.parts/`` is there, ``manifest.json`` is not yet."""
    b = RunBuilder(2)
    b.rank(0).compute("aten::mm", 1_000)
    b.rank(0).send(1, 64, 100)
    b.rank(1).recv(0, 64, 100)
    run = b.write(tmp_path / "run")
    (run / "manifest.json").unlink()
    (run / PARTS_DIR).mkdir()
    for r in (0, 1):
        if r in saved:
            (run / PARTS_DIR / f"rank-{r}.json").write_text("{}")
        else:
            rank_file(run, r).unlink()
    return run


def test_a_refusal_at_a_rank_saved_on_another_host_names_that_rank_and_says_why_it_has_no_trace(
    tmp_path: Path,
) -> None:
    # `skewlens analyze` of host 0's own directory of a 2-host job (rank 1's trace on host 1's storage)
    # said only "4 p2p op(s) disagree: no matching recv (rank 0 -> 1, ...). With --lenient ...": nothing
    # said that rank 1 has no trace here, nor that the hosts' directories must be merged
    b = RunBuilder(2)
    b.rank(0).compute("aten::mm", 1_000)
    b.rank(0).send(1, 64, 100)
    b.rank(1).recv(0, 64, 100)
    run = b.write(tmp_path / "run")
    rank_file(run, 1).unlink()
    why = "no trace here: the job spans hosts (1 rank(s) per host): combine them with skewlens merge"
    m = read_manifest(run)
    write_manifest(run, dataclasses.replace(m, ranks=(0,), missing_ranks=(1,), notes={"rank 1": why}))
    with pytest.raises(ValidationError) as e:
        load_validated(run, lenient_option="--lenient")
    said = str(e.value)
    assert "4 p2p op(s)" not in said  # one send, as built
    assert f"{run}: not loaded: communication does not match across ranks: group '0': 1 p2p op(s) " in said
    assert "disagree: rank 1 has no trace (rank 0 -> 1, tag 0: 1 send(s), 0 recv(s))" in said
    assert said.endswith(
        f"lists every problem. Hint: {run}: rank 1 of 2 has no trace (the manifest says so): {why}"
    )


def test_a_run_a_capture_may_still_be_writing_is_loaded_with_one_warning_saying_so(tmp_path: Path) -> None:
    run = _capture_under_way(tmp_path, saved=(0, 1))
    said = (
        f"{run}: no manifest.json, and {run / PARTS_DIR} holds a capture's part files: a skewlens profile "
        "may still be writing this run, or was killed before it finished"
    )
    notes = run_notes(load_validated(run))  # what analyze and replay print as warnings
    assert notes == [
        f"{said}: read from the traces saved so far (ranks 0-1); wait for `skewlens profile` to finish"
    ]
    report = validate_run(run)  # skewlens check: one warning, not also the generic one
    assert [i.message.split("; ")[0] for i in report.warnings] == [said]
    assert "wait for `skewlens profile` to finish" in report.warnings[0].message and report.ok


def test_a_half_written_captures_mismatch_hints_that_a_capture_may_still_be_writing_it(
    tmp_path: Path,
) -> None:
    run = _capture_under_way(tmp_path, saved=(0,))
    with pytest.raises(ValidationError) as e:
        load_validated(run, lenient_option="--lenient")
    assert "rank 1 has no trace (rank 0 -> 1" in str(e.value)
    assert str(e.value).endswith(
        f"lists every problem. Hint: {run}: no manifest.json, and {run / PARTS_DIR} holds a capture's part "
        "files: a skewlens profile may still be writing this run, or was killed before it finished; wait for "
        "`skewlens profile` to finish (or use --lenient)"
    )
    # the same traces without part files (not a capture's leftovers): no hint
    for f in (run / PARTS_DIR).iterdir():
        f.unlink()
    (run / PARTS_DIR).rmdir()
    with pytest.raises(ValidationError) as e:
        load_validated(run, lenient_option="--lenient")
    assert "Hint" not in str(e.value) and ".parts" not in str(e.value)


def test_gap_in_foreign_rank_numbering_is_a_missing_rank(tmp_path: Path) -> None:
    d = tmp_path / "foreign"
    for r in (0, 2):
        with EtWriter(d / f"trace.{r}.et") as w:
            w.write(_comp(1, "x"))
    msgs = _errors(d, "missing-rank")
    assert len(msgs) == 1 and "rank 1 of 3 has no trace (gap in the rank numbering)" in msgs[0]


def test_a_captures_traces_without_their_manifest_are_a_warning_a_foreign_runs_are_not(
    tmp_path: Path,
) -> None:
    run = _good_run(tmp_path)
    (run / "manifest.json").unlink()  # a capture interrupted before skewlens profile wrote it
    report = validate_run(run)
    (msg,) = [i.message for i in report.warnings if i.kind == "no-manifest"]
    assert msg.startswith(f"{run}: rank-*.et without manifest.json") and report.ok
    d = tmp_path / "foreign"
    for r in (0, 1):
        with EtWriter(d / f"trace.{r}.et") as w:
            w.write(_comp(1, "x"))
    foreign = validate_run(d)
    assert not [i for i in foreign.warnings if i.kind == "no-manifest"]
    # the world size it guessed is said as info (it was not said at all)
    infos = [i.message for i in foreign.issues if i.severity.value == "info"]
    assert f"{d}: no manifest: world size inferred from the trace file names" in infos


def test_a_rank_whose_trace_the_capture_saved_partially_is_a_warning_in_check_and_a_note_in_reports(
    tmp_path: Path,
) -> None:
    # the command raised in one rank after its first step: check said OK (0 warning(s))
    from dataclasses import replace

    from skewlens.profiler.manifest import read_manifest, write_manifest
    from skewlens.profiler.store import load_run
    from skewlens.profiler.store.issues import run_notes

    run = _good_run(tmp_path)
    m = read_manifest(run)
    write_manifest(run, replace(m, notes={**m.notes, "rank 1": "partial trace: saved 1 of 3 steps at exit"}))
    report = validate_run(run)
    (w,) = [i for i in report.warnings if i.kind == "partial-trace"]
    assert w.rank == 1 and w.message.startswith("rank 1: partial trace: saved 1 of 3 steps at exit")
    assert report.ok
    assert "rank 1: partial trace: saved 1 of 3 steps at exit" in "\n".join(run_notes(load_run(run)))


def test_collectives_of_different_types_name_group_seq_and_ranks(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    (msg,) = _errors(b.write(tmp_path / "run"), "collective-type")
    assert msg.startswith("collective mismatch in group '0' seq 0: type differs")
    assert "rank 0: ALL_REDUCE" in msg and "rank 1: BROADCAST" in msg


def test_a_collective_mismatch_names_the_step_it_happened_in(tmp_path: Path) -> None:
    # a broadcast that gloo let through with a larger tensor on rank 1 (step 3 of a 2-rank capture) was
    # "collective mismatch in group '0' seq 11 (BROADCAST): size differs (...)", and which step of the
    # training that was had to be looked up by node id
    b = RunBuilder(3)
    for r in range(3):
        for step in (2, 3):
            b.rank(r).step(step).collective(CommType.ALL_REDUCE, 64, 10)
            b.rank(r).step(step).collective(CommType.BROADCAST, 128 if (r, step) == (1, 3) else 64, 10)
    b.rank(2).step(4).collective(CommType.ALL_GATHER, 64, 10)
    run = b.write(tmp_path / "run")
    (size,) = _errors(run, "collective-size")
    assert size == (
        "collective mismatch in group '0' seq 3 (BROADCAST): size differs (rank 0: 64 B, rank 1: 128 B, "
        "rank 2: 64 B), in step 3"
    )
    (count, _rank_1) = _errors(run, "collective-count")
    assert count == (
        "collective mismatch in group '0' seq 4: rank 0 has no such collective (count differs: rank 0 "
        "issued 4 collective(s) on this group; present on rank(s) [2]), in step 4"
    )


def test_a_type_mismatch_names_step_0_members_in_different_steps_each_and_no_step_where_none_is_known(
    tmp_path: Path,
) -> None:
    # step 0 is a step (not "unknown"); members that issued the instance in different steps are each named
    # with theirs; a trace that marks no steps gives none (no dangling ", in steps")
    b = RunBuilder(2)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).step(0).collective(CommType.BROADCAST, 64, 10)
    b.rank(0).step(2).collective(CommType.ALL_GATHER, 64, 10)
    b.rank(1).step(3).collective(CommType.ALL_GATHER, 128, 10)
    run = b.write(tmp_path / "run")
    assert _errors(run, "collective-type") == [
        (
            "collective mismatch in group '0' seq 0: type differs (rank 0: ALL_REDUCE (node 1), rank 1: "
            "BROADCAST (node 1)), in step 0"
        )
    ]
    assert _errors(run, "collective-size") == [
        (
            "collective mismatch in group '0' seq 1 (ALL_GATHER): size differs (rank 0: 64 B, rank 1: "
            "128 B), in steps 2 (rank 0), 3 (rank 1)"
        )
    ]
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_GATHER, 64, 10)
    b.rank(1).collective(CommType.ALL_GATHER, 128, 10)
    assert _errors(b.write(tmp_path / "unstepped"), "collective-size") == [
        "collective mismatch in group '0' seq 0 (ALL_GATHER): size differs (rank 0: 64 B, rank 1: 128 B)"
    ]


def test_a_collective_mismatch_fills_the_rank_and_node_of_the_member_that_disagrees(tmp_path: Path) -> None:
    # check's problems table left rank and node blank though the message named them
    b = RunBuilder(3)
    for r in range(3):
        b.rank(r).compute("aten::mm", 10)
        b.rank(r).collective(CommType.BROADCAST if r == 1 else CommType.ALL_REDUCE, 64, 10)
        b.rank(r).collective(CommType.ALL_GATHER, 2048 if r == 2 else 1024, 10)
    report = validate_run(b.write(tmp_path / "run"))
    said = {i.kind: (i.rank, i.node) for i in report.errors}
    assert said == {"collective-type": (1, 2), "collective-size": (2, 3)}  # after the mm (node 1)
    # two members: the one that is not the first member's (the instance is kept with the first's type)
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    (issue,) = validate_run(b.write(tmp_path / "run2")).errors
    assert (issue.kind, issue.rank, issue.node) == ("collective-type", 1, 1)


def test_collectives_of_different_sizes_are_reported_per_rank(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_GATHER, 1024, 10)
    b.rank(1).collective(CommType.ALL_GATHER, 2048, 10)
    (msg,) = _errors(b.write(tmp_path / "run"), "collective-size")
    assert "group '0' seq 0 (ALL_GATHER): size differs (rank 0: 1024 B, rank 1: 2048 B)" in msg


def test_all_to_all_members_may_move_different_sizes(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_TO_ALL, 1024, 10)
    b.rank(1).collective(CommType.ALL_TO_ALL, 4096, 10)
    assert validate_run(b.write(tmp_path / "run")).ok


def test_a_rank_that_issues_fewer_collectives_is_a_count_mismatch(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for _ in range(3):
        b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    for _ in range(2):
        b.rank(1).collective(CommType.ALL_REDUCE, 64, 10)
    (msg,) = _errors(b.write(tmp_path / "run"), "collective-count")
    assert "group '0' seq 2: rank 1 has no such collective" in msg
    assert "rank 1 issued 2 collective(s) on this group" in msg


def test_send_without_recv_names_the_send(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).send(1, 256, 10, tag=5)
    b.rank(0).send(1, 256, 10, tag=5)
    b.rank(1).recv(0, 256, 10, tag=5)
    report = validate_run(b.write(tmp_path / "run"))
    (msg,) = [i.message for i in report.errors if i.kind == "p2p-unmatched"]
    assert "send node 2 on rank 0 (to rank 1, tag 5) has no matching recv" in msg
    assert report.run is not None and len(report.run.p2p) == 1


def test_sends_to_a_rank_without_a_trace_are_one_error_not_one_per_send(tmp_path: Path) -> None:
    # each send was its own error, drowning the one that matters (the missing rank)
    b = RunBuilder(3)
    for _ in range(5):
        b.rank(0).send(1, 256, 10, tag=5)
        b.rank(1).recv(0, 256, 10, tag=5)
    b.rank(2).recv(1, 256, 10, tag=7)
    run = b.write(tmp_path / "run")
    rank_file(run, 1).unlink()
    report = validate_run(run)
    msgs = sorted(i.message for i in report.errors if i.kind == "p2p-unmatched")
    no_trace = "which has no trace"
    assert msgs == [
        f"p2p mismatch: rank 0 posts 5 send(s) to rank 1 (tag 5), {no_trace}: nodes 1-5 have no partner",
        f"p2p mismatch: rank 2 posts 1 recv(s) from rank 1 (tag 7), {no_trace}: node 1 has no partner",
    ]


def test_every_problem_is_collected_not_just_the_first(tmp_path: Path) -> None:
    b = RunBuilder(3)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    b.rank(2).collective(CommType.ALL_REDUCE, 32, 10)
    b.rank(0).send(2, 8, 1)
    run = b.write(tmp_path / "run")
    with EtWriter(rank_file(run, 1)) as w:  # rank 1 also gets a dangling dependency
        w.write(_comp(1, "x", deps=(5,)))
        w.write(TraceNode(node_id=2, name="c", node_type=NodeType.COMM_COLL, start_ns=0, dur_ns=1,
                          attrs={"comm_type": int(CommType.BROADCAST), "comm_size": 64, "pg_name": "0",
                                 "skl_seq": 0}))  # fmt: skip
    kinds = {i.kind for i in validate_run(run).errors}
    assert kinds == {"dangling-dependency", "collective-type", "p2p-unmatched"}


def test_load_validated_raises_one_message_with_the_first_problems(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for _ in range(8):
        b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
        b.rank(1).collective(CommType.REDUCE, 64, 10)
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError) as e:
        load_validated(run, lenient_option="")
    text = str(e.value)
    assert "8 problem(s)" in text and "seq 0: type differs" in text and "seq 4: type differs" in text
    assert "seq 5:" not in text and "skewlens check" in text
    # by default the refusal names the Python caller's way round it (the CLIs name their options)
    with pytest.raises(ValidationError, match="With lenient=True the rest is used"):
        load_validated(run)


def test_load_validated_returns_the_matched_run_when_it_is_clean(tmp_path: Path) -> None:
    run = load_validated(_good_run(tmp_path))
    assert [(c.comm_type, c.ranks) for c in run.collectives] == [
        (CommType.ALL_REDUCE, (0, 1)),
        (CommType.ALL_GATHER, (0, 1)),
    ]


def test_inferences_are_reported_as_info_not_errors(tmp_path: Path) -> None:
    d = tmp_path / "foreign"
    for r in (0, 1):
        with EtWriter(d / f"t.{r}.et") as w:
            node = pb.Node(id=1, name="ar", type=int(NodeType.COMM_COLL))
            node.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
            w.write(node)
    report = validate_run(d)
    assert report.ok
    infos = [i.message for i in report.issues if i.severity is Severity.INFO]
    assert any("no start times" in m for m in infos)
    assert any("numbered per group in file order" in m for m in infos)


def test_check_cli_prints_the_problems_and_exits_nonzero(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _rewrite_rank(run, 0, [_comp(1, "a"), _comp(2, "b", deps=(99,))])
    buf = io.StringIO()
    code = check_main([str(run), "--no-progress"], console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert code == 1
    assert "dangling-dependency" in text and "depends on node 99" in text and "FAILED: 1 error(s)" in text


def test_check_cli_exits_zero_on_a_clean_run(tmp_path: Path) -> None:
    buf = io.StringIO()
    assert check_main([str(_good_run(tmp_path)), "--no-progress"], console=Console(file=buf, width=200)) == 0
    assert "OK" in buf.getvalue() and "collective instances  2" in buf.getvalue()


def test_a_rank_issuing_the_same_instance_twice_is_reported(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10, seq=0)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10, seq=0)
    b.rank(1).collective(CommType.ALL_REDUCE, 64, 10, seq=0)
    (msg,) = _errors(b.write(tmp_path / "run"), "collective-duplicate")
    assert "group '0' seq 0: rank(s) [0] issue this instance more than once" in msg


@dataclass
class _Deps:
    """What :func:`find_cycle` reads of a rank: its rows' dependency lists (CSR)."""

    dep_ptr: np.ndarray
    dep_idx: np.ndarray

    def __len__(self) -> int:
        return self.dep_ptr.size - 1


def _has_cycle(deps: list[list[int]]) -> bool:
    """Kahn's algorithm over every row: a cycle leaves rows that never become ready."""
    indeg = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in deps]
    for v, ds in enumerate(deps):
        for w in ds:
            users[w].append(v)
    ready = [v for v, k in enumerate(indeg) if k == 0]
    seen = 0
    while ready:
        w = ready.pop()
        seen += 1
        for v in users[w]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return seen < len(deps)


def test_the_cycle_search_finds_a_cycle_exactly_when_a_full_topological_sort_fails() -> None:
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(300):
        n = int(rng.integers(2, 40))
        deps = [
            sorted({int(x) for x in rng.integers(0, max(v, 1), rng.integers(0, 3))} - {v}) for v in range(n)
        ]
        for _ in range(int(rng.integers(0, 3))):  # a few edges to a row at or after the node's own
            v = int(rng.integers(0, n))
            deps[v].append(int(rng.integers(v, n)))
        ptr = np.cumsum([0] + [len(d) for d in deps])
        idx = np.asarray([w for d in deps for w in d], dtype=np.int64)
        cycle = find_cycle(_Deps(ptr, idx))  # type: ignore[arg-type]
        assert (cycle is not None) == _has_cycle(deps)
        if cycle is not None:
            found += 1
            assert cycle[0] == cycle[-1]
            for a, b in itertools.pairwise(cycle):
                assert b in deps[a]  # each row of the cycle depends on the next
    assert 20 < found < 280  # graphs with and without cycles were tried


def test_check_decodes_every_file_where_its_column_cache_still_matches_a_changed_one(
    tmp_path: Path,
) -> None:
    import os

    from skewlens.profiler.store.fast import MIN_NODES
    from skewlens.profiler.store.load import load_run

    b = RunBuilder(1)
    for k in range(MIN_NODES + 6_000):  # over 128 KiB: the cache checks the first and last 64 KiB
        b.rank(0).step(0).compute("aten::mm", 1_000 + k)
    run = b.write(tmp_path / "run")
    load_run(run)  # writes the column cache
    f = rank_file(run, 0)
    st = f.stat()
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 40] = b"\xff" * 40  # bit rot in the middle: same size, and the time put back
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert validate_run(run).ok  # a load reads the cache, which matches the file's size, time and ends
    out = io.StringIO()
    assert check_main([str(run), "--no-progress"], console=Console(file=out, width=200)) == 1
    assert "rank-0.et" in out.getvalue() and "corrupt" in out.getvalue()


def test_a_group_member_that_issues_none_of_its_collectives_is_a_count_mismatch(tmp_path: Path) -> None:
    # group "0" is ranks 0-2 by the manifest; rank 2 (traced, with collectives on group "b") issues none on it
    b = RunBuilder(3, groups={"0": (0, 1, 2), "b": (1, 2)})
    for r in (0, 1):
        b.rank(r).collective(CommType.ALL_REDUCE, 64, 10)
    for r in (1, 2):
        b.rank(r).collective(CommType.ALL_REDUCE, 64, 10, pg="b")
    (msg,) = _errors(b.write(tmp_path / "run"), "collective-count")
    assert "group '0' seq 0: rank 2 has no such collective" in msg


def test_a_strict_load_keeps_an_instance_whose_members_disagree_with_its_first_members_type(
    tmp_path: Path,
) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.BROADCAST, 64, 10)
    report = validate_run(b.write(tmp_path / "run"))
    assert not report.ok
    assert report.run is not None
    assert [(c.comm_type, c.ranks) for c in report.run.collectives] == [(CommType.ALL_REDUCE, (0, 1))]


def test_a_strict_load_pairs_a_send_and_recv_of_different_sizes(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).send(1, 256, 10)
    b.rank(1).recv(0, 512, 10)
    report = validate_run(b.write(tmp_path / "run"))
    assert [i.kind for i in report.errors] == ["p2p-size"]
    assert report.run is not None and [(p.src_rank, p.dst_rank) for p in report.run.p2p] == [(0, 1)]


def test_consecutive_instances_whose_ranks_issue_the_same_types_in_another_order_are_one_order_skip(
    tmp_path: Path,
) -> None:
    # rank 0: all_reduce then broadcast; rank 1: broadcast then all_reduce (seq 0 and 1 disagree)
    b = RunBuilder(2)
    for r, types in (
        (0, (CommType.ALL_REDUCE, CommType.BROADCAST)),
        (1, (CommType.BROADCAST, CommType.ALL_REDUCE)),
    ):
        for t in types:
            b.rank(r).collective(t, 64, 10)
    report = validate_run(b.write(tmp_path / "run"), lenient=True)
    assert [(s.reason, s.seqs) for s in report.skipped] == [("order differs", (0, 1))]


def test_instances_whose_types_differ_with_an_agreeing_one_between_are_skipped_one_by_one(
    tmp_path: Path,
) -> None:
    # seq 0 and 2 disagree, seq 1 agrees: not consecutive, so not one reordering
    b = RunBuilder(2)
    for r, types in (
        (0, (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.BROADCAST)),
        (1, (CommType.BROADCAST, CommType.ALL_GATHER, CommType.ALL_REDUCE)),
    ):
        for t in types:
            b.rank(r).collective(t, 64, 10)
    report = validate_run(b.write(tmp_path / "run"), lenient=True)
    assert [(s.reason, s.seqs) for s in report.skipped] == [("types differ", (0,)), ("types differ", (2,))]


def test_the_check_report_counts_a_groups_ranks_in_the_singular_for_one(tmp_path: Path) -> None:
    b = RunBuilder(world_size=1)
    b.rank(0).step(0)
    b.rank(0).compute("aten::mm", dur_ns=1000, start_ns=0)
    buf = io.StringIO()
    assert (
        check_main([str(b.write(tmp_path / "run")), "--no-progress"], console=Console(file=buf, width=200))
        == 0
    )
    assert "process groups        1: '0' (1 rank, default_pg) " in buf.getvalue()  # was "(1 ranks, ...)"
