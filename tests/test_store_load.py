"""Loading runs into the store: the vectorised decoder, foreign Chakra traces, real imported traces."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
from rich.console import Console

from skewlens.profiler import threads as threads_mod
from skewlens.profiler.chakra_io import EtWriter, iter_messages
from skewlens.profiler.errors import ManifestError, TraceFormatError, ValidationError
from skewlens.profiler.store import colcache, load_run
from skewlens.profiler.store import fast as fast_mod
from skewlens.profiler.store import load as load_mod
from skewlens.profiler.store.fast import decode_file
from skewlens.profiler.store.load import load_rank
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.rich_progress import RichProgress

COLUMNS = (
    "node_id", "node_type", "name_idx", "start_ns", "dur_ns", "stream", "step", "comm_type", "comm_bytes",
    "pg", "seq", "src", "dst", "tag", "is_cpu", "dep_ptr", "dep_idx", "dep_kind",
)  # fmt: skip
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
CHAKRA_GENERATOR = Path(sys.executable).parent / "chakra_generator"  # the venv running the tests


def _assert_same(fast_path: Path, rank: int = 0) -> None:
    a = load_rank(fast_path, rank, [], {}, decoder="vectorised")
    b = load_rank(fast_path, rank, [], {}, decoder="reference")
    for c in COLUMNS:
        x, y = getattr(a, c), getattr(b, c)
        assert x.dtype == y.dtype and np.array_equal(x, y), c
    assert a.names == b.names


def mixed_run(tmp_path: Path, *, op: str = "op", name: str = "run") -> Path:
    """Three ranks of 50-54 nodes: compute on two streams, collectives on two groups, a send/recv pair."""
    b = RunBuilder(3, groups={"0": (0, 1, 2), "tp": (0, 1)})
    for r in range(3):
        rb = b.rank(r).step(1)
        for i in range(40):
            rb.compute(f"aten::{op}{i % 7}", 1000 + 37 * i + r, stream=i % 2)
            if i % 5 == 0:
                rb.collective(CommType.ALL_REDUCE, 1 << (10 + i % 4), 300)
            if r < 2 and i % 9 == 0:
                rb.collective(CommType.ALL_GATHER, 4096, 300, pg="tp")
        if r == 0:
            rb.send(2, 10**9 + 7, 5, tag=-3)
        if r == 2:
            rb.recv(0, 10**9 + 7, 5, tag=-3)
    return b.write(tmp_path / name)


def test_vectorised_decoder_gives_exactly_the_reference_columns(tmp_path: Path) -> None:
    run = mixed_run(tmp_path)
    for r in range(3):
        _assert_same(run / f"rank-{r}.et", r)


def test_a_file_of_few_nodes_is_read_by_the_reference_decoder_with_the_same_columns(tmp_path: Path) -> None:
    from skewlens.profiler.store.fast import MIN_NODES, FastDecodeError

    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        for i in range(MIN_NODES - 3):  # with the metadata node: MIN_NODES - 1 nodes on rank 0
            rb.compute(f"aten::op{i % 3}", 1000 + i, stream=i % 2)
        rb.collective(CommType.ALL_REDUCE, 4096, 300)
        if r == 1:
            rb.compute("aten::extra", 50)  # rank 1: MIN_NODES nodes
    run = b.write(tmp_path / "run")
    with pytest.raises(FastDecodeError, match=f"fewer than {MIN_NODES}"):
        decode_file(run / "rank-0.et")
    assert decode_file(run / "rank-0.et", min_nodes=0).node_id.shape == (MIN_NODES - 1,)
    assert decode_file(run / "rank-1.et").node_id.shape == (MIN_NODES,)
    for r in range(2):
        _assert_same(run / f"rank-{r}.et", r)
        a = load_rank(run / f"rank-{r}.et", r, [], {})
        v = load_rank(run / f"rank-{r}.et", r, [], {}, decoder="vectorised")
        for c in COLUMNS:
            assert np.array_equal(getattr(a, c), getattr(v, c)), c


def test_every_attribute_encoding_reads_as_the_same_integer(tmp_path: Path) -> None:
    f = tmp_path / "t.0.et"
    encodings = [
        ("int64_val", 5000), ("int32_val", 5000), ("uint32_val", 5000), ("uint64_val", 5000),
        ("sint32_val", 5000), ("sint64_val", 5000), ("fixed32_val", 5000), ("fixed64_val", 5000),
        ("sfixed32_val", 5000), ("sfixed64_val", 5000), ("double_val", 5000.0), ("float_val", 5000.0),
    ]  # fmt: skip
    with EtWriter(f) as w:
        for i, (field, value) in enumerate(encodings):
            node = pb.Node(id=i, name=field, type=int(NodeType.COMM_SEND))
            node.attr.add(name="comm_size", **{field: value})
            node.attr.add(name="comm_dst", sint64_val=-1)
            node.attr.add(name="doc_first", doc_string="x", string_val="y")
            w.write(node)
    rt = load_rank(f, 0, [], {})
    assert rt.comm_bytes.tolist() == [5000] * len(encodings)
    assert rt.dst.tolist() == [-1] * len(encodings)
    _assert_same(f)


def test_unpacked_dependency_lists_decode_like_packed_ones(tmp_path: Path) -> None:
    f = tmp_path / "u.0.et"
    with EtWriter(f) as w:
        w.write(pb.Node(id=1, name="a", type=int(NodeType.COMP)))
        w.write(pb.Node(id=2, name="b", type=int(NodeType.COMP)))
        # node 3 with ctrl_deps 1 and 2 written unpacked (field 4, wire type 0, one tag each)
        body = b"\x08\x03" + b"\x12\x01c" + b"\x18\x04" + b"\x20\x01" + b"\x20\x02" + b"\x2a\x01\x01"
        w.write_raw(bytes([len(body)]) + body)
    rt = load_rank(f, 0, [], {})
    assert rt.deps_of(2).tolist() == [0, 1, 0]
    assert rt.dep_kind[rt.dep_ptr[2] : rt.dep_ptr[3]].tolist() == [0, 0, 1]
    _assert_same(f)


def test_a_dependency_list_given_single_then_packed_reads_as_the_same_set_in_either_decoder(
    tmp_path: Path,
) -> None:
    # node 100: ctrl_deps 5 as a single value (field 4, wire type 0), then [2, 3] packed (wire type 2), as
    # only a hand-written file has it: the vectorised decoder lists packed values first ([2, 3, 5]), the
    # reference one in file order ([5, 2, 3]); the order within a node is not part of the contract
    f = tmp_path / "rank-0.et"
    body = b"\x08\x64" + b"\x12\x01d" + b"\x18\x04" + b"\x20\x05" + b"\x22\x02\x02\x03"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        w.write_all([pb.Node(id=i, name="a", type=int(NodeType.COMP)) for i in (2, 3, 5)])
        w.write_raw(bytes([len(body)]) + body)
    got = {}
    for decoder in ("vectorised", "reference"):
        rt = load_rank(f, 0, [], {}, decoder=decoder)  # type: ignore[arg-type]
        got[decoder] = rt.node_id[rt.deps_of(3)].tolist()
        assert rt.dep_kind.tolist() == [0, 0, 0], decoder
    assert got == {"vectorised": [2, 3, 5], "reference": [5, 2, 3]}
    assert sorted(got["vectorised"]) == sorted(got["reference"])


def test_fast_decoder_refuses_a_length_running_past_its_message(tmp_path: Path) -> None:
    from skewlens.profiler.store.fast import FastDecodeError

    f = tmp_path / "bad.0.et"
    with EtWriter(f) as w:
        w.write_raw(b"\x05\x12\x09abc")  # name claims 9 bytes, the message has 3 left
    with pytest.raises(FastDecodeError, match="runs past"):
        decode_file(f, min_nodes=0)
    with pytest.raises(TraceFormatError, match=r"bad\.0\.et: corrupt node message at byte offset \d+"):
        load_rank(f, 0, [], {})


def _sixty_nodes_and(f: Path, body: bytes) -> int:
    """Write ``f``: 60 plain nodes, then one node message of ``body``, then 10 more; return that message's
    byte offset."""
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            w.write(pb.Node(id=i + 1, name="aten::mm", type=int(NodeType.COMP), duration_micros=3))
    at = f.stat().st_size
    with f.open("ab") as fh:
        fh.write(_varint(len(body)) + body)
        for i in range(10):
            node = pb.Node(id=100 + i, name="aten::mm", type=int(NodeType.COMP))
            fh.write(_varint(node.ByteSize()) + node.SerializeToString())
    return at


_NODE = b"\x08\x3d" + b"\x12\x08aten::mm" + b"\x18\x04"  # id 61, name, type COMP

MALFORMED = {
    "a varint of 11 bytes": b"\x08" + b"\xff" * 10 + b"\x01" + _NODE[2:],
    "field number 0": b"\x00\x01" + _NODE,
    "a fixed64 with 3 of its 8 bytes in the message": _NODE + b"\x79\x01\x02\x03",  # field 15, wire 1
    "a length of 2**32 + 2 with 2 bytes left": _NODE + b"\x52\x82\x80\x80\x80\x10\x0a\x00",  # an attr
    "a packed dependency list ending inside a varint": _NODE + b"\x22\x02\x01\x81",
    "a packed dependency of 11 bytes": _NODE + b"\x22\x0b" + b"\xff" * 10 + b"\x01",
    "an attribute value of field number 0": _NODE + b"\x52\x0a\x0a\x06stream\x00\x05",
    "an unknown attribute's string that is not UTF-8": _NODE + b"\x52\x0a\x0a\x04note\xea\x01\x01\xff",
    # names of at most 16 ASCII bytes are checked from their first and last 8 bytes, longer ones whole
    "an attribute name of 12 bytes whose 11th is not UTF-8": (
        _NODE + b"\x52\x10\x0a\x0cabcdefghij\xffk\x48\x01"
    ),
    "an attribute name of 20 bytes whose 11th is not UTF-8": (
        _NODE + b"\x52\x18\x0a\x14abcdefghij\xffklmnopqrs\x48\x01"
    ),
}


def test_an_unknown_node_type_is_named_with_its_nodes_byte_offset_by_every_decoder_and_the_cache(
    tmp_path: Path,
) -> None:
    f = tmp_path / "rank-0.et"
    at = _sixty_nodes_and(f, b"\x08\x3d\x12\x03odd\x18\x09")  # node 61 "odd" of type 9
    unknown = rf"node 61 \(odd\) at byte offset {at} has unknown node type 9"
    for decoder in ("reference", "vectorised", "auto", "auto"):  # the second auto load reads the cache
        with pytest.raises(ValidationError, match=unknown):
            load_rank(f, 0, [], {}, decoder=decoder)  # type: ignore[arg-type]
    assert colcache.cache_path(f).is_file()


@pytest.mark.parametrize("how", list(MALFORMED))
def test_a_malformed_field_is_a_corrupt_node_at_its_offset_in_both_decoders(tmp_path: Path, how: str) -> None:
    # protobuf refuses each of these; a vectorised decoder that read on would give columns of garbage
    f = tmp_path / "rank-0.et"
    at = _sixty_nodes_and(f, MALFORMED[how])
    for decoder in ("reference", "vectorised", "auto"):
        with pytest.raises(TraceFormatError, match=rf"rank-0\.et: corrupt node message at byte offset {at}$"):
            load_mod.decode(f, decoder=decoder)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "unknown",
    # the fixed64's last 4 bytes read as fields would set id 7 and type 5
    [b"\x79\x00\x00\x00\x00\x08\x07\x18\x05", b"\x7d\x02\x03\x04\x05", b"\x7b\x08\x01\x7c"],
    ids=["fixed64", "fixed32", "group"],
)
def test_unknown_node_fields_of_every_wire_type_are_skipped_as_protobuf_skips_them(
    tmp_path: Path, unknown: bytes
) -> None:
    f = tmp_path / "rank-0.et"
    _sixty_nodes_and(f, unknown + _NODE + unknown)
    a = load_mod.decode(f, decoder="reference")
    b = load_mod.decode(f, decoder="vectorised")
    assert a.node_id.tolist() == b.node_id.tolist() == [*range(1, 62), *range(100, 110)]
    assert b.names.to_pylist() == ["aten::mm"] * 71 and b.node_type.tolist() == [4] * 71


def test_a_prefix_and_its_directory_load_the_same_foreign_run(tmp_path: Path) -> None:
    d = tmp_path / "chakra"
    for r in range(3):
        with EtWriter(d / f"job.{r}.et") as w:
            node = pb.Node(id=10, name="allreduce", type=int(NodeType.COMM_COLL), duration_micros=5)
            node.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
            node.attr.add(name="comm_size", int64_val=1024)
            w.write(node)
            w.write(pb.Node(id=11, name="mm", type=int(NodeType.COMP), data_deps=[10]))
    for where in (d, d / "job"):
        run = load_run(where)
        assert run.world_size == 3 and sorted(run.ranks) == [0, 1, 2]
        (inst,) = run.collectives
        assert (inst.pg_name, inst.seq, inst.ranks, inst.comm_bytes) == ("0", 0, (0, 1, 2), (1024,) * 3)
        assert run.process_groups["0"].ranks == (0, 1, 2)
        assert run.ranks[1].dur_ns.tolist() == [5000, 0]
        assert "no start times" in " ".join(run.ranks[1].notes)


def test_a_foreign_run_of_many_nodes_takes_its_groups_from_the_process_group_node(tmp_path: Path) -> None:
    # files of MIN_NODES nodes or more are read by the vectorised decoder, which keeps METADATA nodes whole
    # for the loader to parse: the sub-group "tp" is named nowhere else (no manifest)
    from skewlens.profiler.chakra_io import pg_init_node
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.fast import MIN_NODES

    groups = [ProcessGroupInfo(name="0", ranks=(0, 1, 2)), ProcessGroupInfo(name="tp", ranks=(1, 2))]
    d = tmp_path / "chakra"
    for r in range(3):
        with EtWriter(d / f"job.{r}.et") as w:
            w.write(pg_init_node(groups))
            for i in range(MIN_NODES):
                w.write(pb.Node(id=i + 1, name="mm", type=int(NodeType.COMP), duration_micros=2))
            if r > 0:
                node = pb.Node(id=100, name="allgather", type=int(NodeType.COMM_COLL), duration_micros=5)
                node.attr.add(name="comm_type", int64_val=int(CommType.ALL_GATHER))
                node.attr.add(name="comm_size", int64_val=64)
                node.attr.add(name="pg_name", string_val="tp")
                w.write(node)
    run = load_run(d)
    assert run.process_groups["tp"].ranks == (1, 2)
    assert [(c.pg_name, c.ranks) for c in run.collectives] == [("tp", (1, 2))]


@pytest.mark.parametrize("bad", [-1, 1 << 40])
def test_a_process_group_node_naming_a_rank_no_job_has_is_a_malformed_node_that_check_reports(
    tmp_path: Path, bad: int
) -> None:
    # a trace-only group naming rank 10**12 (or -1) loaded and checked clean; only the real replay refused
    # the run ("process group '1' names rank(s) [1000000000000] outside the job")
    from skewlens.profiler.store import validate_run

    values = json.dumps([{"pg_name": "0", "ranks": [0]}, {"pg_name": "odd", "ranks": [0, bad]}])
    init = pb.Node(id=0, name="## process_group:init ##", type=int(NodeType.METADATA))
    init.inputs.values = values
    with EtWriter(tmp_path / "job.0.et") as w:
        w.write(init)
        w.write(pb.Node(id=1, name="mm", type=int(NodeType.COMP), duration_micros=2))
    errors = [(i.kind, i.node, i.message) for i in validate_run(tmp_path / "job").errors]
    why = f"ValueError: group 'odd' names rank(s) [{bad}] outside 0..{(1 << 20) - 1}"
    where = f"{tmp_path / 'job.0.et'}: malformed process-group metadata node"
    assert errors == [("bad-metadata", 0, f"{where} ({why})")]


def test_a_folder_with_several_runs_asks_for_a_prefix(tmp_path: Path) -> None:
    for p in ("a", "b"):
        with EtWriter(tmp_path / f"{p}.0.et") as w:
            w.write(pb.Node(id=1, name="x", type=int(NodeType.COMP)))
    with pytest.raises(ManifestError, match=r"prefixes \['a', 'b'\]\); pass DIR/<prefix>"):
        load_run(tmp_path)
    assert len(load_run(tmp_path / "b").ranks) == 1


def test_a_missing_path_a_rank_file_and_an_empty_folder_are_each_told_apart(tmp_path: Path) -> None:
    # each said "no manifest.json and no Chakra traces named <prefix>.<rank>.et (is this a run directory?)"
    with EtWriter(tmp_path / "run" / "a.0.et") as w:
        w.write(pb.Node(id=1, name="x", type=int(NodeType.COMP)))
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "nope": rf"nope: no such run directory \(nor traces nope.<rank>.et in {tmp_path}\)",
        tmp_path / "run" / "a.0.et": rf"a.0.et: a file, not a run: give the run directory that holds it "
        rf"\({tmp_path / 'run'}\)",
        tmp_path / "empty": r"empty: no manifest.json and no Chakra traces named <prefix>.<rank>.et",
    }
    for path, says in cases.items():
        with pytest.raises(ManifestError, match=says):
            load_run(path)


def test_strict_load_still_raises_on_the_first_mismatch(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.REDUCE, 64, 10)
    with pytest.raises(ValidationError, match="seq 0: type differs"):
        load_run(b.write(tmp_path / "run"))


def test_progress_bars_leave_nothing_in_a_file_or_pipe(tmp_path: Path) -> None:
    buf = io.StringIO()
    run = load_run(mixed_run(tmp_path), progress=RichProgress(Console(file=buf, width=100)))
    assert len(run.ranks) == 3
    assert buf.getvalue() == ""  # it was one empty line per bar


def test_progress_bar_renders_to_the_injected_console(tmp_path: Path) -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    run = load_run(mixed_run(tmp_path), progress=RichProgress(console))
    assert len(run.ranks) == 3
    assert "rank-2.et" in buf.getvalue() or "loading" in buf.getvalue()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Traces written by Chakra's own generator (``<name>.<npu>.et``) for 4 NPUs."""
    if not CHAKRA_GENERATOR.exists():
        pytest.skip(f"{CHAKRA_GENERATOR} not found (mlc-chakra's console script)")
    d = tmp_path_factory.mktemp("chakra_generator")
    subprocess.run(
        [str(CHAKRA_GENERATOR.resolve()), "--num_npus", "4"], cwd=d, check=True, capture_output=True
    )
    return d


@pytest.mark.parametrize(
    ("prefix", "comm_type", "size"),
    [
        ("ALL_REDUCE", CommType.ALL_REDUCE, 65536),
        ("ALL_GATHER", CommType.ALL_GATHER, 65536),
        ("REDUCE_SCATTER", CommType.REDUCE_SCATTER, 65536),
        ("ALL_TO_ALL", CommType.ALL_TO_ALL, 65536),
        ("BARRIER", CommType.BARRIER, 0),
    ],
)
def test_chakra_generator_collectives_load_as_one_world_instance(
    generated: Path, prefix: str, comm_type: CommType, size: int
) -> None:
    run = load_run(generated / prefix)
    assert run.world_size == 4 and len(run.ranks) == 4
    (inst,) = run.collectives
    assert (inst.comm_type, inst.ranks, inst.seq, inst.comm_bytes) == (
        comm_type,
        (0, 1, 2, 3),
        0,
        (size,) * 4,
    )
    assert all(not rt.is_cpu[0] for rt in run.ranks.values())


def test_chakra_generator_compute_chains_keep_their_dependencies(generated: Path) -> None:
    run = load_run(generated / "two_comp_nodes_dependent")
    for rt in run.ranks.values():
        assert len(rt) == 2 and rt.deps_of(1).tolist() == [0] and rt.deps_of(0).tolist() == []
        assert rt.node_type.tolist() == [NodeType.COMP, NodeType.COMP]


def test_chakra_generator_all_attribute_types_decode_like_the_reference(generated: Path) -> None:
    for r in range(4):
        _assert_same(generated / f"one_metadata_node_all_types.{r}.et")


def test_chakra_generator_send_without_peer_fails_validation_by_name(generated: Path) -> None:
    from skewlens.profiler.store.validate import validate_run

    report = validate_run(generated / "one_comm_send_node")
    msgs = [i.message for i in report.errors]
    assert len(msgs) == 4 and all("has no destination rank (comm_dst)" in m for m in msgs)
    assert report.run is not None and report.run.ranks[0].comm_bytes.tolist() == [
        1024
    ]  # --default_tensor_size


def _chakra_count(path: Path) -> int:
    fh = openFileRd(str(path))
    gm, node, n = pb.GlobalMetadata(), pb.Node(), 0
    decodeMessage(fh, gm)
    while decodeMessage(fh, node):
        n += 1
    fh.close()
    return n


@pytest.fixture(scope="module")
def dlrm_run(dlrm_imported: Path) -> Path:
    return dlrm_imported


def test_imported_dlrm_run_loads_with_every_collective_matched_on_eight_ranks(dlrm_run: Path) -> None:
    from skewlens.profiler.store.validate import validate_run

    report = validate_run(dlrm_run)
    assert report.errors == []
    run = report.run
    assert run is not None and sorted(run.ranks) == list(range(8))
    for r, rt in run.ranks.items():
        assert len(rt) == _chakra_count(dlrm_run / f"rank-{r}.et")
    kinds = sorted(c.comm_type.name for c in run.collectives)
    assert kinds == ["ALL_REDUCE"] * 3 + ["ALL_TO_ALL"] * 5
    assert all(c.ranks == tuple(range(8)) for c in run.collectives)
    for c in run.collectives:
        for r, row in zip(c.ranks, c.rows, strict=True):
            assert run.ranks[r].node_type[row] == NodeType.COMM_COLL


def test_a_node_with_very_many_fields_falls_back_to_the_reference_decoder(tmp_path: Path) -> None:
    from skewlens.profiler.store.fast import MAX_FIELDS, FastDecodeError

    f = tmp_path / "wide.0.et"
    node = pb.Node(id=1, name="wide", type=int(NodeType.COMP))
    for i in range(MAX_FIELDS + 5):
        node.attr.add(name=f"a{i}", int64_val=i)
    node.attr.add(name="comm_size", int64_val=77)
    with EtWriter(f) as w:
        w.write(node)
    with pytest.raises(FastDecodeError, match="more than"):
        decode_file(f, min_nodes=0)
    assert load_rank(f, 0, [], {}).comm_bytes.tolist() == [77]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])


def test_ranks_are_decoded_on_other_threads_and_load_exactly_as_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = mixed_run(tmp_path)
    monkeypatch.setattr(load_mod, "default_workers", lambda: 1)
    one = load_run(run_dir)
    seen: list[str] = []
    decode = load_mod.decode

    def recording(path: Path, **kw: object) -> object:
        seen.append(threading.current_thread().name)
        return decode(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(load_mod, "decode", recording)
    monkeypatch.setattr(load_mod, "default_workers", lambda: 2)
    many = load_run(run_dir)
    assert len(seen) == 3 and threading.main_thread().name not in seen
    assert many.pg_names == one.pg_names and sorted(many.ranks) == sorted(one.ranks) == [0, 1, 2]
    for r in one.ranks:
        for c in COLUMNS:
            assert np.array_equal(getattr(many.ranks[r], c), getattr(one.ranks[r], c)), (r, c)
    assert [(c.pg_name, c.seq) for c in many.collectives] == [(c.pg_name, c.seq) for c in one.collectives]


def test_with_two_unreadable_ranks_the_load_names_the_first_in_rank_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = mixed_run(tmp_path)
    _truncate(run_dir / "rank-1.et")
    _truncate(run_dir / "rank-2.et")
    monkeypatch.setattr(load_mod, "default_workers", lambda: 4)
    with pytest.raises(TraceFormatError, match=r"rank-1\.et"):
        load_run(run_dir)
    (run_dir / "rank-1.et").unlink()
    with pytest.raises(ValidationError, match=r"rank 1 is listed but its trace file is missing"):
        load_run(run_dir)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_on_glibc_the_memory_decoding_threads_freed_can_be_given_back() -> None:
    assert threads_mod._malloc_trim() is not None
    threads_mod.release_free_memory()  # and calling it is harmless


_MAPPED_BLOCKS_OF_A_COLUMN = """
import ctypes, sys
import numpy as np
from skewlens.profiler.threads import tune_malloc

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Mallinfo2
if sys.argv[1] == "tuned":
    assert tune_malloc()
before = mallinfo2().hblks
col = np.empty(2 << 20, dtype=np.int64)  # a 16 MiB column
print(mallinfo2().hblks - before)
"""


def test_with_malloc_tuned_a_16_mib_column_comes_from_the_heap_not_pages_mapped_for_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib
    import subprocess
    import sys

    import skewlens.cli as cli

    mapped = {
        how: int(
            subprocess.run(
                [sys.executable, "-c", _MAPPED_BLOCKS_OF_A_COLUMN, how],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for how in ("default", "tuned")
    }
    # glibc maps a block that large to pages of its own by default (and unmaps them when it is freed)
    assert mapped == {"default": 1, "tuned": 0}
    calls: list[bool] = []
    monkeypatch.setattr(cli, "tune_malloc", lambda: calls.append(True) or True)
    with contextlib.suppress(SystemExit):
        cli.main(["analyze", "/nonexistent/run"])
    assert calls == [True]  # every command tunes it before it starts


def test_an_uneven_all_to_all_keeps_its_send_and_receive_bytes_through_both_decoders_and_the_cache(
    tmp_path: Path,
) -> None:
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(1)
        for i in range(50):  # enough nodes for the vectorised decoder and the cache
            rb.compute(f"aten::op{i % 3}", 1000)
        rb.collective(CommType.ALL_TO_ALL, 4096, 300, peer_bytes=(1000 + r, 3000 - r))
        rb.collective(CommType.ALL_TO_ALL, 4096, 300)  # even splits: none recorded
    run = b.write(tmp_path / "run")
    for decoder in ("vectorised", "reference"):
        rt = load_rank(run / "rank-1.et", 1, [], {}, decoder=decoder)
        assert rt.send_bytes is not None and rt.recv_bytes is not None
        assert (rt.send_bytes[-2:].tolist(), rt.recv_bytes[-2:].tolist()) == ([1001, -1], [2999, -1])
        assert (rt.send_bytes[:-2] == -1).all()
    for _ in range(2):  # decoded and cached, then read from the cache
        rt = load_run(run).ranks[0]
        assert rt.send_bytes is not None and rt.recv_bytes is not None
        assert (rt.send_bytes[-2:].tolist(), rt.recv_bytes[-2:].tolist()) == ([1000, -1], [3000, -1])
    assert load_run(mixed_run(tmp_path)).ranks[0].send_bytes is None  # a trace that records none


def uneven_splits_run(tmp_path: Path, send: list[int], recv: list[int]) -> Path:
    """2 ranks, 50 compute nodes each (enough for the vectorised decoder and the cache), then an all_to_all
    whose splits rank 0 records as ``send`` / ``recv`` (rank 1: the mirror image), then an even one."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(1)
        for i in range(50):
            rb.compute(f"aten::op{i % 3}", 1000)
        s, g = (send, recv) if r == 0 else (recv, send)
        rb.collective(
            CommType.ALL_TO_ALL, 4096, 300, peer_bytes=(sum(s) - s[r], sum(g) - g[r]), peer_splits=(s, g)
        )
        rb.collective(CommType.ALL_TO_ALL, 4096, 300)
    return b.write(tmp_path / "run")


def test_an_uneven_all_to_alls_per_member_splits_load_the_same_through_both_decoders_and_the_cache(
    tmp_path: Path,
) -> None:
    # before, the store kept only the totals (skl_send_bytes): which member got what was lost
    run = uneven_splits_run(tmp_path, [100, 2_000_000_000_000], [7, 0])
    got = []
    for decoder in ("vectorised", "reference"):
        got.append(load_rank(run / "rank-0.et", 0, [], {}, decoder=decoder))
    for _ in range(2):  # decoded and cached, then read from the cache
        got.append(load_run(run).ranks[0])
    for rt in got:
        assert (
            rt.split_ptr is not None and rt.split_send_bytes is not None and rt.split_recv_bytes is not None
        )
        n = rt.node_id.shape[0]
        assert rt.split_ptr.tolist() == [0] * (n - 1) + [2, 2]  # the uneven one only
        assert rt.split_send_bytes.tolist() == [100, 2_000_000_000_000]
        assert rt.split_recv_bytes.tolist() == [7, 0]
    _, vals = decode_file(run / "rank-0.et", min_nodes=0).attr_lists["skl_send_splits"]  # no fallback
    assert vals.tolist() == [100, 2_000_000_000_000]
    assert load_run(mixed_run(tmp_path)).ranks[0].split_ptr is None  # a trace that records none


@pytest.mark.parametrize(
    ("send", "recv", "max_splits"),
    [([100, 200, 300], [7, 0], None), ([100, -200], [7, 0], None), ([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], 4)],
    ids=["lengths-differ", "negative", "oversized"],
)
@pytest.mark.parametrize("decoder", ["vectorised", "reference"])
def test_a_corrupt_or_oversized_split_list_is_refused_naming_the_file_and_node(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    send: list[int],
    recv: list[int],
    max_splits: int | None,
    decoder: str,
) -> None:
    if max_splits is not None:
        monkeypatch.setattr(load_mod, "MAX_SPLITS", max_splits)
    run = uneven_splits_run(tmp_path, send, recv)
    with pytest.raises(TraceFormatError, match=r"rank-0\.et: rank 0: node \d+ .* corrupt all_to_all splits"):
        load_rank(run / "rank-0.et", 0, [], {}, decoder=decoder)  # type: ignore[arg-type]


def _odd_values_run(d: Path, nodes: int) -> Path:
    """One rank whose nodes give integer attributes as NaN, infinity, 1e30 and a uint64 past int64."""
    with EtWriter(d / "rank-0.et", {"rank": 0, "world_size": 1}) as w:
        for i in range(nodes):
            n = pb.Node(id=i + 1, name="aten::mm", type=4, duration_micros=3)
            odd = [float("nan"), float("inf"), -1e30, 7.9][i % 4]
            n.attr.add(name="stream", double_val=odd)
            n.attr.add(name="skl_seq", uint64_val=(1 << 64) - 1 - i)
            n.attr.add(name="skl_step", float_val=2.5)
            w.write(n)
    return d


@pytest.mark.parametrize("nodes", [8, 64])  # the reference decoder (few nodes), the vectorised one
def test_integer_attributes_given_as_floats_or_past_int64_read_alike_in_both_decoders(
    tmp_path: Path, nodes: int
) -> None:
    # int(nan) and an OverflowError were tracebacks in the reference decoder (files of under 48 nodes),
    # while the vectorised one read on
    run = _odd_values_run(tmp_path / "run", nodes)
    a = load_mod.decode(run / "rank-0.et", decoder="reference")
    b = load_mod.decode(run / "rank-0.et", decoder="vectorised")
    for name in ("stream", "skl_seq", "skl_step"):
        assert np.array_equal(a.attr_val[name], b.attr_val[name]), name
    assert a.attr_val["stream"][:4].tolist() == [0, 9_200_000_000_000_000_000, -9_200_000_000_000_000_000, 7]
    assert a.attr_val["skl_seq"][:2].tolist() == [-1, -2] and a.attr_val["skl_step"][0] == 2
    assert load_run(run).ranks[0].stream[3] == 7


def test_values_a_column_would_wrap_or_no_trace_can_mean_are_errors_naming_the_node(tmp_path: Path) -> None:
    # comm_src 2**32 was read as rank 0, comm_type 260 as 4, and a negative duration was taken as is
    from skewlens.profiler.store.validate import validate_run

    b = RunBuilder(2)
    b.rank(0).send(1, 256, 10, tag=5)
    b.rank(1).recv(0, 256, 10, tag=5)
    b.rank(0).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).collective(CommType.ALL_REDUCE, 64, 10)
    b.rank(1).compute("aten::mm", 10)
    r1 = b.rank(1).nodes
    r1[0] = dataclasses.replace(r1[0], attrs={**r1[0].attrs, "comm_src": 1 << 32})
    r1[1] = dataclasses.replace(r1[1], attrs={**r1[1].attrs, "comm_type": 260})
    r1[2] = dataclasses.replace(r1[2], attrs={**r1[2].attrs, "skl_dur_ns": -5})
    run = b.write(tmp_path / "run")
    bad = sorted(i.message for i in validate_run(run).errors if i.kind == "bad-attribute")
    f = run / "rank-1.et"
    assert bad == [
        f"{f}: rank 1: node 1: comm_src 4294967296 is out of range (-1..2147483647)",
        f"{f}: rank 1: node 2: comm_type 260 is out of range (-1..127)",
        f"{f}: rank 1: node 3: duration (ns) -5 is out of range (0..1125899906842624)",
    ]
    with pytest.raises(ValidationError, match=r"rank 1: node \d: .* is out of range"):
        load_run(run)


_LOAD_LOOP = """
import faulthandler, sys
from pathlib import Path
faulthandler.dump_traceback_later(100, exit=True)
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.load import load_run
bad, good = Path(sys.argv[1]), Path(sys.argv[2])
for _ in range(60):
    try:
        load_run(bad)
    except SkewlensError:
        pass
    load_run(good)
print("ok")
"""


@pytest.mark.slow  # a Python process of its own: a hang must not take the test run with it
def test_loads_that_fail_on_a_corrupt_rank_leave_no_thread_pool_for_the_garbage_collector(
    tmp_path: Path,
) -> None:
    # the decoding threads' iterator was left suspended in a reference cycle (the error raised was held by
    # the frame it was raised in): the collector then shut its pool down on one of the pool's own threads
    # ("RuntimeError: cannot join current thread", ignored) or on a thread being started (a deadlock)
    runs = []
    for name in ("bad", "good"):
        b = RunBuilder(8)
        for r in range(8):
            rb = b.rank(r).step(0)
            for i in range(60):
                rb.compute("aten::mm", 1000 + i)
            rb.collective(CommType.ALL_REDUCE, 1024, 100)
        runs.append(b.write(tmp_path / name))
    f = runs[0] / "rank-1.et"
    f.write_bytes(f.read_bytes()[:200])  # truncated: decoded on a thread, raised on the loading one
    env = {**os.environ, "SKEWLENS_COLUMN_CACHE": "off"}
    argv = [sys.executable, "-c", _LOAD_LOOP, *map(str, runs)]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=150, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert "Exception ignored" not in proc.stderr and "cannot join" not in proc.stderr, proc.stderr[-2000:]


def test_an_attribute_name_that_is_not_utf8_is_a_corrupt_node_in_both_decoders(tmp_path: Path) -> None:
    # the vectorised decoder dropped the attribute (check: "sizes differ ... 0 B") where protobuf refused
    # the node (analyze: "corrupt node message")
    f = tmp_path / "run" / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4, duration_micros=3)
            n.attr.add(name="my_attr", int64_val=i)
            w.write(n)
    data = bytearray(f.read_bytes())
    at = data.index(b"my_attr", len(data) // 2)
    data[at] = 0xFF
    f.write_bytes(bytes(data))
    for decoder in ("reference", "vectorised", "auto"):
        with pytest.raises(TraceFormatError, match=r"rank-0\.et: corrupt node message at byte offset"):
            load_mod.decode(f, decoder=decoder)  # type: ignore[arg-type]


def test_a_corrupt_input_or_output_description_is_a_corrupt_node_in_both_decoders(tmp_path: Path) -> None:
    # the vectorised decoder skipped a node's inputs/outputs (IOInfo) unparsed where protobuf refused the
    # node: the last disagreement of the audit's byte-flip fuzz
    f = tmp_path / "run" / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4, duration_micros=3)
            n.inputs.values, n.inputs.shapes, n.inputs.types = "[[1,2]]", "[[4,4]]", '["Tensor(float)"]'
            n.outputs.types = '["Tensor(float)"]'
            w.write(n)
    clean = load_mod.decode(f, decoder="vectorised")
    assert clean.node_id.tolist() == list(range(1, 61))
    data = bytearray(f.read_bytes())
    at = data.index(b"Tensor(float)", len(data) // 2)
    data[at] = 0xFF  # no longer UTF-8
    f.write_bytes(bytes(data))
    for decoder in ("reference", "vectorised", "auto"):
        with pytest.raises(TraceFormatError, match=r"rank-0\.et: corrupt node message at byte offset"):
            load_mod.decode(f, decoder=decoder)  # type: ignore[arg-type]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_a_bool_varint_past_1_and_an_attribute_given_two_values_read_as_protobuf_reads_them(
    tmp_path: Path,
) -> None:
    # the vectorised decoder read a bool_val of 15 as 15 (protobuf: True) and kept the first of two values
    # of one attribute where protobuf keeps the last (an int64 stream then a list: no stream)
    f = tmp_path / "run" / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4, duration_micros=3)
            body = n.SerializeToString()
            flag = pb.AttributeProto(name="is_cpu_op", bool_val=True).SerializeToString()
            assert flag.endswith(b"\xd8\x01\x01")
            flag = flag[:-1] + b"\x0f"  # bool_val 15
            two = (
                pb.AttributeProto(name="stream", int64_val=7).SerializeToString()
                + pb.AttributeProto(int64_list=pb.Int64List(values=[1])).SerializeToString()
            )
            for attr in (flag, two) if i == 30 else (flag,):
                body += b"\x52" + _varint(len(attr)) + attr  # field 10 (attr), length-delimited
            w.write_raw(_varint(len(body)) + body)
    a = load_mod.decode(f, decoder="reference")
    b = load_mod.decode(f, decoder="vectorised")
    for name in ("is_cpu_op", "stream"):
        assert np.array_equal(a.attr_has[name], b.attr_has[name]), name
        assert np.array_equal(a.attr_val[name][a.attr_has[name]], b.attr_val[name][b.attr_has[name]]), name
    assert set(a.attr_val["is_cpu_op"].tolist()) == {1} and not a.attr_has["stream"][30]


def test_narrow_and_signed_attribute_values_read_as_protobuf_reads_them_in_the_vectorised_decoder(
    tmp_path: Path,
) -> None:
    # protobuf: an int32 keeps the low 32 bits of its varint as a signed number, a uint32 unsigned, a bool
    # is 0 or 1, an sfixed32 is signed; every node is laid out as writers lay them out, so the vectorised
    # decoder reads the file itself (decode_file raises where it would leave it to the reference decoder)
    values = {  # attribute: (field number and wire type of its value, payload, what protobuf reads)
        "comm_tag": (7 << 3, _varint(-3 % (1 << 64)), -3),  # int32_val, a 10-byte varint
        "stream": (11 << 3, _varint((1 << 32) + 7), 7),  # uint32_val past 32 bits
        "is_cpu_op": (27 << 3, _varint(15), 1),  # bool_val 15
        "comm_src": ((23 << 3) | 5, (-2 % (1 << 32)).to_bytes(4, "little"), -2),  # sfixed32_val
    }
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            body = pb.Node(id=i + 1, name="aten::mm", type=4).SerializeToString()
            for name, (tag, payload, _) in values.items():
                attr = pb.AttributeProto(name=name).SerializeToString() + _varint(tag) + payload
                body += b"\x52" + _varint(len(attr)) + attr
            w.write_raw(_varint(len(body)) + body)
    fast = decode_file(f, min_nodes=0)
    ref = load_mod.decode(f, decoder="reference")
    for name, (_, _, want) in values.items():
        for raw in (fast, ref):
            assert raw.attr_has[name].all(), name
            assert raw.attr_val[name].tolist() == [want] * 60, name


def test_an_attribute_given_a_double_then_an_int_reads_the_int_as_protobuf_does(tmp_path: Path) -> None:
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            body = pb.Node(id=i + 1, name="aten::mm", type=4).SerializeToString()
            attr = (
                pb.AttributeProto(name="comm_size", double_val=7.0).SerializeToString()
                + pb.AttributeProto(int64_val=9).SerializeToString()
            )  # one AttributeProto holding two values of its oneof, the int last
            body += b"\x52" + _varint(len(attr)) + attr
            w.write_raw(_varint(len(body)) + body)
    for decoder in ("reference", "vectorised"):
        assert load_mod.decode(f, decoder=decoder).attr_val["comm_size"].tolist() == [9] * 60, decoder  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["given twice", "in two packed chunks", "unpacked"])
def test_a_split_list_given_twice_in_two_packed_chunks_or_unpacked_reads_as_protobuf_reads_it(
    tmp_path: Path, case: str
) -> None:
    # protobuf: of an attribute given twice the reference decoder keeps the last; the packed chunks of one
    # repeated field are one list, and so are its values written one field each
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4)
            if i == 30 and case == "given twice":
                n.attr.add(name="skl_send_splits", int64_list=pb.Int64List(values=[1, 2]))
                n.attr.add(name="skl_send_splits", int64_list=pb.Int64List(values=[4, 3, 5]))
            body = n.SerializeToString()
            if i == 30 and case == "in two packed chunks":  # Int64List {values: [4, 3]} {values: [5]}
                attr = pb.AttributeProto(name="skl_send_splits").SerializeToString()
                attr += b"\x52\x07" + b"\x0a\x02\x04\x03" + b"\x0a\x01\x05"
                body += b"\x52" + _varint(len(attr)) + attr
            if i == 30 and case == "unpacked":  # Int64List with values 4, 3, 5 one field each (wire type 0)
                attr = pb.AttributeProto(name="skl_send_splits").SerializeToString()
                attr += b"\x52\x06" + b"\x08\x04\x08\x03\x08\x05"
                body += b"\x52" + _varint(len(attr)) + attr
            w.write_raw(_varint(len(body)) + body)
    for decoder in ("reference", "vectorised"):
        rows, values = load_mod.decode(f, decoder=decoder).attr_lists["skl_send_splits"]  # type: ignore[arg-type]
        assert (rows.tolist(), values.tolist()) == ([30] * 3, [4, 3, 5]), decoder


def test_a_pg_name_given_as_an_integer_is_no_group_name_in_either_decoder(tmp_path: Path) -> None:
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4)
            n.attr.add(name="pg_name", int64_val=3)
            w.write(n)
    for decoder in ("reference", "vectorised"):
        raw = load_mod.decode(f, decoder=decoder)  # type: ignore[arg-type]
        assert not raw.attr_has["pg_name"].any() and raw.pg_name.null_count == 60, decoder


def test_an_unknown_attribute_whose_name_is_a_known_one_but_for_its_last_byte_or_length_is_not_read_as_it(
    tmp_path: Path,
) -> None:
    # the vectorised decoder compares names by their first and last 8 bytes and their length
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="aten::mm", type=4)
            n.attr.add(name="comm_srx", int64_val=5)  # comm_src but for its 8th byte
            n.attr.add(name="stream\x00", int64_val=9)  # stream and one more (zero) byte
            n.attr.add(name="comm_dst", int64_val=3)
            w.write(n)
    for raw in (decode_file(f, min_nodes=0), load_mod.decode(f, decoder="reference")):
        assert not raw.attr_has["comm_src"].any() and not raw.attr_has["stream"].any()
        assert raw.attr_val["comm_dst"].tolist() == [3] * 60


def test_a_foreign_trace_without_skewlens_attributes_loads_with_chakras_fields_and_the_documented_defaults(
    tmp_path: Path,
) -> None:
    # docs/store.md: Chakra's *_micros fields stand where skl_start_ns / skl_dur_ns are absent (µs -> ns),
    # and an attribute a node lacks reads as its documented default;
    # model.RankTrace: comm_bytes is 0 for compute (a tensor_size on a compute node is no message), tag is
    # 0 where none, comm_type -1 but on collectives. Rank 0: mm (start 7 µs, 3 µs, tensor_size 64), then
    # a send of tensor_size 256 to rank 1 (comm_type set, but no collective)
    d = tmp_path / "chakra"
    for r in range(2):
        with EtWriter(d / f"job.{r}.et") as w:
            mm = pb.Node(id=10, name="mm", type=int(NodeType.COMP), start_time_micros=7, duration_micros=3)
            mm.attr.add(name="tensor_size", uint64_val=64)
            w.write(mm)
            p2p = pb.Node(id=11, name="p2p", type=int(NodeType.COMM_SEND if r == 0 else NodeType.COMM_RECV),
                          start_time_micros=20, duration_micros=5, ctrl_deps=[10])  # fmt: skip
            p2p.attr.add(name="comm_src", int32_val=0)
            p2p.attr.add(name="comm_dst", int32_val=1)
            p2p.attr.add(name="tensor_size", uint64_val=256)
            p2p.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
            w.write(p2p)
    rt = load_run(d).ranks[0]
    assert rt.start_ns.tolist() == [7_000, 20_000]
    assert rt.comm_bytes.tolist() == [0, 256]
    assert rt.tag.tolist() == [0, 0]
    assert rt.comm_type.tolist() == [-1, -1]
    assert rt.stream.tolist() == [0, 0]  # no stream named: the one stream 0
    assert rt.step.tolist() == [-1, -1]  # in no step
    for decoder in ("vectorised", "reference"):
        assert load_rank(d / "job.0.et", 0, [], {}, decoder=decoder).dur_ns.tolist() == [3_000, 5_000]


def test_collectives_on_the_first_named_group_keep_it_and_are_not_taken_for_groupless(tmp_path: Path) -> None:
    # assign_defaults: the world group only for collectives naming none; "tp" is the run's only (index 0)
    # group, and the all_reduce on it stays there with no note
    b = RunBuilder(2, groups={"tp": (0, 1)})
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1024, 300, pg="tp")
    run = load_run(b.write(tmp_path / "run"))
    assert [(c.pg_name, c.ranks) for c in run.collectives] == [("tp", (0, 1))]
    assert not any("name no process group" in n for n in run.ranks[0].notes)


def test_kineto_traces_given_as_a_run_are_named_as_such_with_the_import_command(tmp_path: Path) -> None:
    # each said "a file, not a run: give the run directory that holds it", and that directory "no
    # manifest.json and no Chakra traces ... (is this a run directory?)"; the command quotes a path with a
    # space in it, which the user copies (it was two words to the shell)
    import shlex

    kineto = {"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}
    d = tmp_path / "my traces"
    d.mkdir()
    (d / "worker0.pt.trace.json").write_text(json.dumps(kineto))
    (d / "r1.json.gz").write_bytes(gzip.compress(json.dumps(kineto).encode()))
    (d / "et.json").write_text(json.dumps({"schema": "1.0.1", "nodes": []}))
    with tarfile.open(tmp_path / "k.tar.gz", "w:gz") as tf:
        tf.add(d / "r1.json.gz", arcname="k/r1.json.gz")
    imp = "skewlens import --kineto"
    cases = {
        d / "worker0.pt.trace.json": f"a Kineto trace (torch.profiler JSON), not a run: import it first: "
        f"{imp} {shlex.quote(str(d / 'worker0.pt.trace.json'))} --out RUN",
        d / "r1.json.gz": f"a Kineto trace (torch.profiler JSON), not a run: import it first: "
        f"{imp} {shlex.quote(str(d / 'r1.json.gz'))} --out RUN",
        tmp_path / "k.tar.gz": f"an archive of Kineto traces (torch.profiler JSON), not a run: import it "
        f"first: {imp} {tmp_path / 'k.tar.gz'} --out RUN",
        d / "et.json": f"a PyTorch host execution trace, not a run: import it with its Kineto traces: "
        f"{imp} KINETO --host-et {shlex.quote(str(d / 'et.json'))} --out RUN",
        d: f"it holds Kineto traces (r1.json.gz, worker0.pt.trace.json), not a run: import them first: "
        f"{imp} {shlex.quote(str(d))} --out RUN",
    }
    for path, says in cases.items():
        with pytest.raises(ManifestError) as e:
            load_run(path)
        assert str(e.value) == f"{path}: {says}"


@pytest.mark.parametrize("dangling", [False, True])
def test_dependencies_resolve_to_their_nodes_rows_where_the_ids_are_not_in_file_order(
    tmp_path: Path, dangling: bool
) -> None:
    # the loader resolves ids to rows through the ids' sort order, and skips it where they ascend: every
    # run the tests wrote had ascending ids, so resolving every file as if they did passed them all
    from skewlens.profiler.store.issues import IssueLog

    f = tmp_path / "rank-0.et"
    ids = [(7 * i) % 60 + 1 for i in range(60)]  # 1, 8, 15, ...: a permutation of 1..60
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for row, nid in enumerate(ids):
            n = pb.Node(id=nid, name="aten::mm", type=int(NodeType.COMP))
            if row:
                n.ctrl_deps.append(ids[row - 1])
            if row > 1:
                n.data_deps.append(ids[row - 2])
            if dangling and row == 30:
                n.ctrl_deps.append(999)
            w.write(n)
    for decoder in ("vectorised", "reference"):
        sink = IssueLog()
        rt = load_rank(f, 0, [], {}, decoder=decoder, sink=sink)
        assert rt.deps_of(0).tolist() == [] and rt.deps_of(1).tolist() == [0], decoder
        assert all(rt.deps_of(r).tolist() == [r - 1, r - 2] for r in range(2, 60)), decoder
        assert rt.dep_kind[rt.dep_ptr[5] : rt.dep_ptr[6]].tolist() == [0, 1], decoder
        assert rt.dep_kind[rt.dep_ptr[30] : rt.dep_ptr[31]].tolist() == [0, 1], decoder  # 999 dropped
        assert rt.dep_kind.shape == rt.dep_idx.shape, decoder
        assert [i.kind for i in sink.issues] == ["dangling-dependency"] * dangling, decoder


def test_a_node_listing_its_dependencies_again_and_again_keeps_each_once_with_a_warning(
    tmp_path: Path,
) -> None:
    # a hostile node listed one id 50 M times: skewlens check held the copies as edges, 3.1 GB at its peak
    from skewlens.profiler.store.issues import IssueLog, Severity
    from skewlens.profiler.store.load import REPEATS_CHECKED_ABOVE

    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for nid in (1, 2, 3):
            w.write(pb.Node(id=nid, name="aten::mm", type=int(NodeType.COMP)))
        hostile = pb.Node(id=4, name="aten::add", type=int(NodeType.COMP))
        hostile.ctrl_deps.extend([3, 1] * 100)
        hostile.data_deps.extend([2] * 300 + [99])  # and a dangling one among them
        w.write(hostile)
        few = pb.Node(id=5, name="aten::sub", type=int(NodeType.COMP))
        few.ctrl_deps.extend([4] * REPEATS_CHECKED_ABOVE)  # a short list is read as it is
        w.write(few)
    offset = [at for at, _msg in iter_messages(f)][4]  # GlobalMetadata, then nodes 1 to 4
    for decoder in ("vectorised", "reference"):
        sink = IssueLog()
        rt = load_rank(f, 0, [], {}, decoder=decoder, sink=sink)
        assert rt.deps_of(3).tolist() == [0, 2, 1], decoder  # ctrl (rows 0, 2), then data (row 1)
        assert rt.dep_kind[rt.dep_ptr[3] : rt.dep_ptr[4]].tolist() == [0, 0, 1], decoder
        assert rt.deps_of(4).tolist() == [3] * REPEATS_CHECKED_ABOVE, decoder
        repeated = [i for i in sink.issues if i.kind == "repeated-dependency"]
        assert [(i.severity, i.node, i.message) for i in repeated] == [
            (
                Severity.WARNING,
                4,
                (
                    f"{f}: rank 0: node 4 (aten::add) at byte offset {offset} lists 497 dependencies "
                    "again (read once each)"
                ),
            )
        ], decoder


def test_a_dependency_on_an_id_between_two_nodes_ids_is_dangling_not_the_next_node(tmp_path: Path) -> None:
    # ids 2, 4, ..., 120: a dependency on 7 lies among them (where 8 is) and on 0 before them all
    from skewlens.profiler.store.issues import IssueLog

    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for row in range(60):
            n = pb.Node(id=2 * row + 2, name="aten::mm", type=int(NodeType.COMP))
            if row == 10:
                n.ctrl_deps.extend([7, 4, 0])
            w.write(n)
    for decoder in ("vectorised", "reference"):
        sink = IssueLog()
        rt = load_rank(f, 0, [], {}, decoder=decoder, sink=sink)
        assert rt.deps_of(10).tolist() == [1], decoder
        assert [i.kind for i in sink.issues] == ["dangling-dependency"] * 2, decoder
        assert "depends on node 7, which does not exist" in sink.issues[0].message, decoder


def test_a_nodes_many_dependencies_keep_their_file_order_where_the_vectorised_decoder_sorts_them(
    tmp_path: Path,
) -> None:
    # ctrl lists, then data lists, are joined and sorted by (row, kind): a sort that is not stable put a
    # node's three ctrl dependencies in another order than the file's (and the reference decoder's)
    f = tmp_path / "rank-0.et"
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(100):
            n = pb.Node(id=i + 1, name="aten::mm", type=int(NodeType.COMP))
            if i >= 3:
                n.ctrl_deps.extend([i, i - 2, i - 1])
                n.data_deps.append(i - 2)
            w.write(n)
    raw = decode_file(f, min_nodes=0)
    assert raw.dep_id[raw.dep_node == 50].tolist() == [50, 48, 49, 48]
    assert raw.dep_kind[raw.dep_node == 50].tolist() == [0, 0, 0, 1]
    _assert_same(f)


def test_a_sniffed_archive_is_read_only_to_its_entry_bound_and_past_members_that_are_not_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a directory member named like a trace comes before the trace; past the bound nothing more is looked at
    monkeypatch.setattr(load_mod, "_SNIFF_ENTRIES", 3)
    kineto = json.dumps({"traceEvents": []}).encode()

    def archive(name: str, lead: int) -> Path:
        p = tmp_path / name
        with tarfile.open(p, "w") as tf:
            d = tarfile.TarInfo("dir.json")
            d.type = tarfile.DIRTYPE
            tf.addfile(d)
            for i in range(lead):
                info = tarfile.TarInfo(f"note{i}.txt")
                tf.addfile(info, io.BytesIO(b""))
            info = tarfile.TarInfo("w0.json")
            info.size = len(kineto)
            tf.addfile(info, io.BytesIO(kineto))
        return p

    assert load_mod._sniff(archive("a.tar", 1)) == "kineto"  # the third entry
    assert load_mod._sniff(archive("b.tar", 2)) is None  # the fourth


def test_a_json_with_nodes_but_no_schema_is_not_taken_for_a_host_execution_trace(tmp_path: Path) -> None:
    f = tmp_path / "graph.json"
    f.write_text(json.dumps({"nodes": [1, 2]}))
    assert load_mod._sniff(f) is None
    f.write_text(json.dumps({"schema": "1.0.1", "nodes": [1, 2]}))
    assert load_mod._sniff(f) == "host_et"


def test_a_folder_of_four_kineto_traces_names_three_and_counts_the_one_more(tmp_path: Path) -> None:
    kineto = json.dumps({"traceEvents": []})
    for r in range(4):
        (tmp_path / f"w{r}.json").write_text(kineto)
    with pytest.raises(ManifestError, match=r"\(w0\.json, w1\.json, w2\.json and 1 more\)"):
        load_run(tmp_path)


def test_an_archive_compressed_twice_is_not_inflated_a_second_time_when_sniffed(tmp_path: Path) -> None:
    # the bound holds the outer layer only: tarfile's r:* would inflate the inner gzip past it, unbounded
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tf:
        body = json.dumps({"traceEvents": []}).encode()
        info = tarfile.TarInfo("w0.json")
        info.size = len(body)
        tf.addfile(info, io.BytesIO(body))
    twice = tmp_path / "k.tar.gz"
    twice.write_bytes(gzip.compress(inner.getvalue()))
    assert load_mod._sniff(twice) is None
    once = tmp_path / "once.tar.gz"
    once.write_bytes(inner.getvalue())
    assert load_mod._sniff(once) == "kineto"


def test_a_collectives_group_rank_order_is_its_groups_as_recorded_and_sorted_where_the_group_does_not_hold_it(
    tmp_path: Path,
) -> None:
    import dataclasses

    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.model import group_rank_order
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    # new_group([3, 1], sort_ranks=False): group rank 0 is global rank 3, the order of its split lists
    b = RunBuilder(world_size=4, groups={"0": (0, 1, 2, 3), "g": (3, 1)})
    for r in (1, 3):
        b.rank(r).step(0).collective(CommType.ALL_TO_ALL, 64, 1_000, pg="g", start_ns=0)
    for r in (0, 2):
        b.rank(r).step(0).compute("op", 1_000, start_ns=0)
    run = load_run(b.write(tmp_path / "run"))
    (inst,) = run.collectives
    assert inst.ranks == (1, 3)
    assert group_rank_order(run, inst) == (3, 1)
    # a group listed with other members than the collective's: the members, sorted
    other = ProcessGroupInfo(name="g", ranks=(2, 0), desc="", backend="")
    odd = dataclasses.replace(run, process_groups={**run.process_groups, "g": other})
    assert group_rank_order(odd, inst) == (1, 3)


def test_a_process_group_entry_has_integer_ranks_and_its_first_four_outside_the_limit_are_named() -> None:
    from skewlens.profiler.manifest import MAX_WORLD_SIZE, ProcessGroupInfo, pg_init_group

    entry = {"pg_name": 0, "ranks": ["1", 0], "pg_desc": "tp", "backend_config": "cpu:gloo"}
    assert pg_init_group(entry) == ProcessGroupInfo(name="0", ranks=(1, 0), desc="tp", backend="cpu:gloo")
    assert pg_init_group({"pg_name": "g", "ranks": [MAX_WORLD_SIZE - 1]}).ranks == (MAX_WORLD_SIZE - 1,)
    top = MAX_WORLD_SIZE
    with pytest.raises(ValueError) as e:
        pg_init_group({"pg_name": "g", "ranks": [0, -1, top, -2, top + 1, -3]})
    assert str(e.value) == f"group 'g' names rank(s) [-1, {top}, -2, {top + 1}] outside 0..{top - 1}"


def _long_run(tmp_path: Path, nodes: int) -> Path:
    """Two ranks of ``nodes`` compute nodes and a collective every 50, on two streams."""
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(1)
        for i in range(nodes):
            rb.compute(f"aten::op{i % 11}", 1000 + i % 97 + r, stream=i % 2)
            if i % 50 == 0:
                rb.collective(CommType.ALL_REDUCE, 1 << (10 + i % 4), 300)
    return b.write(tmp_path / "run")


def _column_bytes(raw: fast_mod.RawColumns) -> int:
    arrays = [raw.node_id, raw.node_type, raw.start_us, raw.dur_us, raw.msg_offset, raw.dep_node, raw.dep_id]
    arrays += [raw.dep_kind, *raw.attr_val.values(), *raw.attr_has.values()]
    return sum(a.nbytes for a in {id(a): a for a in arrays}.values())


def test_a_file_of_many_batches_is_decoded_holding_its_bytes_columns_and_one_batch_not_all_its_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 56 MiB `full` rank held 11 times its size while the decoder ran: every field of every node at once
    f = _long_run(tmp_path, 12_000) / "rank-0.et"
    whole = decode_file(f)  # one batch: the file is under NODE_BATCH_BYTES
    batch = 16 << 10
    monkeypatch.setattr(fast_mod, "NODE_BATCH_BYTES", batch)
    tracemalloc.start()
    try:
        raw = load_mod.decode(f, decoder="vectorised")  # as a load decodes: the bytes kept for a fallback
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert colcache._batch(raw).equals(colcache._batch(whole))
    size = f.stat().st_size
    assert size > 40 * batch
    # the bytes once (padded), the columns, and one batch's temporaries. Before: 19.5 MB for this 1.3 MB
    # file, whose columns take 1.8 MB (every field of every node at once), then 5.3 MB (the bytes as read
    # held beside their padded copy); now 4.0 MB
    assert peak < size + _column_bytes(raw) + 128 * batch, (peak, size, _column_bytes(raw))


def test_batches_of_any_size_give_the_same_columns_and_tell_each_node_once(tmp_path: Path) -> None:
    f = mixed_run(tmp_path) / "rank-0.et"
    whole = colcache._batch(decode_file(f, batch_bytes=1 << 40))
    n = whole.num_rows
    for batch_bytes in (1, 100, 1000, 4000):
        told: list[int] = []
        raw = decode_file(f, batch_bytes=batch_bytes, on_batch=told.append)
        assert colcache._batch(raw).equals(whole), batch_bytes
        assert sum(told) == n
        # a batch is the nodes that start within batch_bytes of its first: one node at least
        assert len(told) == n if batch_bytes == 1 else len(told) > f.stat().st_size // (2 * batch_bytes)


def test_loading_shows_ranks_and_the_nodes_decoded_on_its_bars_whether_decoded_or_from_the_cache(
    tmp_path: Path,
) -> None:
    # a replay's first load of two 60 MB ranks sat 20 s on one bar that did not move
    run = _long_run(tmp_path, 3_000)
    nodes = sum(decode_file(run / f"rank-{r}.et").node_id.shape[0] for r in range(2))
    for cached in (False, True):
        progress = _Counting()
        load_run(run, progress=progress)
        assert (run / ".skewlens-cache" / "rank-0.et.arrow").is_file() == cached or not cached
        assert progress.totals == {"loading ranks": 2, "decoding nodes": None}
        assert progress.done == {"loading ranks": 2, "decoding nodes": nodes}, cached
        assert progress.calls["decoding nodes"] >= 2  # at least once a rank


class _Counting:
    """A Progress that counts, per task, its total, the units advanced and the calls that advanced any."""

    def __init__(self) -> None:
        self.totals: dict[str, int | None] = {}
        self.done: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()  # nodes are told from the decoding threads

    @contextlib.contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        self.totals[description] = total
        self.done[description] = self.calls[description] = 0

        def advance(n: int = 1, description_: str | None = None, **kw: str) -> None:
            with self.lock:
                self.done[description] += n
                self.calls[description] += n > 0

        yield advance
