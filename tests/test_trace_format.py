"""Contracts of the on-disk format: Chakra .et files, the manifest, and loading into the store."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

from skewlens.profiler.chakra_io import EtWriter, TraceNode, iter_messages, node_attrs, read_et
from skewlens.profiler.errors import ManifestError, TraceFormatError
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store import fast, load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import Attr, CommType, NodeType


def _two_rank_run(tmp_path: Path) -> Path:
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 1_000_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, 1 << 20, 200_000)
        if r == 0:
            rb.send(1, 4096, 10_000, tag=3)
        else:
            rb.recv(0, 4096, 10_000, tag=3)
    return b.write(tmp_path / "run")


def test_chakra_own_reader_decodes_every_node_we_write(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    fh = openFileRd(str(run / "rank-1.et"))
    gm = GlobalMetadata()
    assert decodeMessage(fh, gm)
    node = Node()
    names = []
    while decodeMessage(fh, node):
        names.append(node.name)
    fh.close()
    assert names == ["## process_group:init ##", "aten::mm", "c10d::all_reduce_", "c10d::recv_"]
    assert {a.name for a in gm.attr} >= {"schema", "rank", "world_size"}


def test_chakra_jsonizer_reads_our_trace(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    out = tmp_path / "rank0.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "chakra.src.jsonizer.jsonizer",
            "--input_filename",
            str(run / "rank-0.et"),
            "--output_filename",
            str(out),
        ],
        check=True,
    )
    text = out.read_text()
    assert '"comm_size"' in text and '"1048576"' in text


def test_times_keep_nanoseconds_and_micros_at_the_edge(tmp_path: Path) -> None:
    node = TraceNode(node_id=7, name="x", node_type=NodeType.COMP, start_ns=1_234_567, dur_ns=2_500)
    with EtWriter(tmp_path / "a.et") as w:
        w.write(node)
    (n,) = read_et(tmp_path / "a.et").nodes
    assert (n.start_time_micros, n.duration_micros) == (1234, 2)
    attrs = node_attrs(n)
    assert (attrs[Attr.START_NS], attrs[Attr.DUR_NS]) == (1_234_567, 2_500)


def test_a_negative_start_or_duration_is_written_as_zero_micros_and_kept_exact_in_nanoseconds(
    tmp_path: Path,
) -> None:
    # Chakra's *_micros fields are uint64: the exact (and wrong) values stay in skl_*, where the loader
    # reports them (docs/store.md: a negative duration is a bad-attribute error naming the node)
    node = TraceNode(node_id=7, name="x", node_type=NodeType.COMP, start_ns=-5_000, dur_ns=-2_500)
    with EtWriter(tmp_path / "a.et") as w:
        w.write(node)
    (n,) = read_et(tmp_path / "a.et").nodes
    assert (n.start_time_micros, n.duration_micros) == (0, 0)
    attrs = node_attrs(n)
    assert (attrs[Attr.START_NS], attrs[Attr.DUR_NS]) == (-5_000, -2_500)


def test_a_failed_write_leaves_no_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "b.et"
    with pytest.raises(RuntimeError), EtWriter(target) as w:
        w.write(TraceNode(node_id=1, name="x", node_type=NodeType.COMP, start_ns=0, dur_ns=1))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_truncated_trace_names_file_and_offset(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    f = run / "rank-0.et"
    data = f.read_bytes()
    f.write_bytes(data[:-5])
    with pytest.raises(TraceFormatError, match=r"rank-0\.et: truncated message at byte offset \d+"):
        read_et(f)


def test_length_prefix_beyond_the_bound_is_refused_without_allocating(tmp_path: Path) -> None:
    f = tmp_path / "evil.et"
    f.write_bytes(b"\xff\xff\xff\xff\x7f")  # claims ~34 GB
    with pytest.raises(TraceFormatError, match=r"claims .* bytes"):
        read_et(f)


def test_a_message_of_exactly_the_size_limit_is_split_by_both_splitters_one_byte_more_is_refused() -> None:
    from skewlens.profiler.chakra_io import MAX_MESSAGE_BYTES

    for size in (MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1):
        prefix = bytes([0x80 | size & 0x7F, 0x80 | size >> 7 & 0x7F, 0x80 | size >> 14 & 0x7F, size >> 21])
        data = b"\x00" + prefix + bytes(size)  # an empty GlobalMetadata, then one message of `size` bytes
        if size == MAX_MESSAGE_BYTES:
            _, starts, sizes = fast.split_messages(data, Path("f.et"))
            assert (starts.tolist(), sizes.tolist()) == ([1, 5], [0, size])
            assert [(at, len(m)) for at, m in iter_messages(Path("f.et"), data)] == [(0, 0), (1, size)]
            continue
        claims = rf"f\.et: message at byte offset 1 claims {size} bytes \(limit {MAX_MESSAGE_BYTES}\)"
        with pytest.raises(TraceFormatError, match=claims):
            fast.split_messages(data, Path("f.et"))
        with pytest.raises(TraceFormatError, match=claims):
            list(iter_messages(Path("f.et"), data))


def _split_by_hand(data: bytes, path: Path) -> tuple[list[int], list[int]]:
    """Body starts and sizes as the reference decoder's splitter reads them, a varint byte at a time."""
    msgs = [(start, len(view)) for start, view in iter_messages(path, data)]
    ends = [start for start, _ in msgs[1:]] + [len(data)] * bool(msgs)
    return [end - size for end, (_, size) in zip(ends, msgs, strict=True)], [size for _, size in msgs]


def test_the_decoder_splits_damaged_files_into_the_messages_and_errors_a_byte_by_byte_reading_finds(
    tmp_path: Path,
) -> None:
    run = _two_rank_run(tmp_path)
    whole = (run / "rank-0.et").read_bytes()
    big = b"\x80\x02" + b"x" * 256  # a two-byte prefix
    huge = b"\xff\xff\xff\xff\x0f"  # claims 4 GiB
    samples = [b"", b"\x00", b"\x80", b"\xff" * 12, b"\x05ab", whole, whole + big, big + whole, whole + huge]
    samples.append(b"\xff" * 10 + b"\x01")  # a length prefix ending in its 11th byte: 10 at most
    rng = random.Random(7)
    for _ in range(400):
        damaged = bytearray(rng.choice([whole, whole + big])[: rng.randrange(len(whole) + 1)])
        for _ in range(rng.randrange(3)):
            if damaged:
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        samples.append(bytes(damaged))
    outcomes = set()
    for data in samples:
        try:
            want: object = _split_by_hand(data, Path("f.et"))
        except TraceFormatError as e:
            want = str(e)
        try:
            _, starts, sizes = fast.split_messages(data, Path("f.et"))
            got: object = (starts.tolist(), sizes.tolist())
        except TraceFormatError as e:
            got = str(e)
        assert got == want, data[:40]
        outcomes.add(want.split(" at ")[0].split(": ")[-1] if isinstance(want, str) else "ok")
    assert outcomes >= {"ok", "truncated message", "truncated length prefix", "message"}, outcomes


def test_manifest_of_another_version_is_refused_by_name(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    m["version"] = 99
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="manifest version 99 is not supported"):
        read_manifest(run)
    del m["version"]  # said "manifest version None is not supported"
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(
        ManifestError, match=r"manifest.json: version: missing \(this skewlens reads version 1\)"
    ):
        read_manifest(run)
    m["version"] = True  # JSON's true equals Python's 1: it was read as version 1
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="manifest version True is not supported"):
        read_manifest(run)


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (
            lambda t: t[:56],
            "line 4 column 3: Unterminated string",
        ),  # was "line 4: Unterminated string starting at"
        (lambda t: t[:20] + "\x01" + t[20:], "line 2 column 19: Invalid control character"),
        (
            lambda t: '{"format": "skewlens-run",}',
            "line 1 column 27: Expecting property name enclosed in double quotes",
        ),
    ],
)
def test_a_manifest_that_is_not_json_is_named_with_the_line_and_column_where_it_goes_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[str], str], error: str
) -> None:
    from skewlens.cli import main

    run = _two_rank_run(tmp_path)
    path = run / "manifest.json"
    path.write_text(damage(path.read_text()))
    assert main(["check", str(run)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"skewlens check: error: {path}: not valid JSON ({error})"
    ]


_CALL = {"type": "recv", "pg_name": "0", "seq": -1, "size_bytes": 8, "at_ns": 3}
_STOP = {"rank": 0, "step": 3, "step_start_ns": 0, "saved_ns": 9, "last": None, "in_flight": []}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"world_size": 10**12}, "world_size: 1000000000000 is outside 1..1048576"),
        ({"world_size": "2"}, "world_size: expected an integer, got '2'"),
        ({"world_size": 1}, "ranks[1]: rank 1 is outside world size 1"),
        ({"ranks": "01"}, "ranks: expected a list, got '01'"),
        ({"ranks": [0, 0]}, "ranks: rank 0 listed twice"),
        ({"devices": ["cpu", "cpu"]}, "devices: expected an object, got ['cpu', 'cpu']"),
        ({"clock_offsets_ns": {"0": "abc"}}, "clock_offsets_ns['0']: expected an integer, got 'abc'"),
        ({"steps": [{"rank": 0, "step": 1, "start_ns": "x", "end_ns": 5}]}, "steps[0].start_ns: expected an"),
        ({"steps": [{"rank": 0, "step": 1, "start_ns": 9, "end_ns": 5}]}, "steps[0]: end_ns 5 is before"),
        (
            {"process_groups": [{"name": "0", "ranks": [0, 9]}]},
            "process_groups[0].ranks[1]: rank 9 is outside",
        ),
        ({"missing_ranks": [1]}, "ranks and missing_ranks both list rank 1"),
        (
            {"steps": [{"rank": 0, "step": 1, "start_ns": -(2**63), "end_ns": 2**63 - 1}]},
            f"steps[0].start_ns: {-(2**63)} is outside {-(2**62)}..{2**62}",
        ),
        (
            {"process_groups": [{"name": "0", "ranks": [0, 1]}, {"name": "0", "ranks": [0]}]},
            "process_groups[1].name: group '0' is listed twice",
        ),
        ({"merged_from": ["/a", 7]}, "merged_from[1]: expected a string, got 7"),
        # a second stop record of a rank was read over the first, unsaid (skewlens check named its calls)
        ({"stopped": [_STOP, {**_STOP, "step": 4}]}, "stopped[1].rank: rank 0 is listed twice"),
        # mutation round 13: each check of a stop record held by a case
        ({"stopped": [{**_STOP, "extra": 1}]}, "stopped[0]: unknown key 'extra'"),
        (
            {"stopped": [{**_STOP, "in_flight": [{**_CALL, "bogus": 1}]}]},
            "stopped[0].in_flight[0]: unknown key 'bogus'",
        ),
        ({"stopped": [{**_STOP, "step": -1}]}, "stopped[0].step: -1 is outside 0.."),
        (
            {"stopped": [{**_STOP, "in_flight": [{**_CALL, "size_bytes": -1}]}]},
            "in_flight[0].size_bytes: -1 is outside 0..",
        ),
        (
            {"stopped": [{**_STOP, "in_flight": [{**_CALL, "seq": -2}]}]},
            "stopped[0].in_flight[0].seq: -2 is outside -1..",
        ),
        ({"stopped": [{**_STOP, "rank": 2}]}, "stopped[0].rank: rank 2 is outside world size 2"),
        ({"level": "bogus"}, "level: expected one of collectives, ops, full, got 'bogus'"),
    ],
)
def test_a_manifest_value_of_the_wrong_type_or_range_is_refused_naming_its_key(
    tmp_path: Path, change: dict[str, object], error: str
) -> None:
    run = _two_rank_run(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    m.update(change)
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=re.escape(error)):
        read_manifest(run)


def test_loaded_run_matches_collectives_and_p2p_across_ranks(tmp_path: Path) -> None:
    run = load_run(_two_rank_run(tmp_path))
    (coll,) = run.collectives
    assert (coll.pg_name, coll.seq, coll.comm_type, coll.ranks) == ("0", 0, CommType.ALL_REDUCE, (0, 1))
    assert coll.comm_bytes == (1 << 20, 1 << 20)
    (pair,) = run.p2p
    assert (pair.src_rank, pair.dst_rank, pair.comm_bytes, pair.tag) == (0, 1, 4096, 3)
    r1 = run.ranks[1]
    assert r1.start_ns.tolist() == [0, 0, 2_000_000, 2_200_000]
    assert r1.deps_of(2).tolist() == [1]


def test_loading_a_run_directory_does_not_import_torch(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    code = (
        "import sys; from skewlens.profiler.store import load_run; load_run(sys.argv[1]); "
        "bad = [m for m in ('torch', 'hydra', 'rich') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_record_dataclasses_give_documented_dictionary_encoded_arrow_schemas() -> None:
    import pyarrow as pa

    from skewlens.profiler.store.schema import NodeRecord, arrow_schema

    s = arrow_schema(NodeRecord)
    assert s.field("rank").type == pa.int64()
    assert pa.types.is_dictionary(s.field("name").type)
    assert s.field("comm_type").nullable and not s.field("rank").nullable
    assert s.field("dur_ns").metadata[b"doc"] == b"Duration, ns."


@pytest.mark.parametrize("decoder", ["vectorised", "reference"])
def test_a_bad_utf8_byte_in_a_metadata_node_is_a_corrupt_trace_naming_the_rank_and_offset(
    tmp_path: Path, decoder: str
) -> None:
    from skewlens.profiler.store.load import load_rank

    b = RunBuilder(2)
    for r in (0, 1):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 64, 1000)
    run = b.write(tmp_path / "run")
    path = run / "rank-0.et"
    data = bytearray(path.read_bytes())
    data[data.find(b"default_pg") + 2] = 0x88  # inside the process-group metadata node's strings
    path.write_bytes(bytes(data))
    # the vectorised decoder keeps metadata nodes whole; parsing them later raised protobuf's DecodeError
    with pytest.raises(TraceFormatError, match=r"rank-0\.et: .*byte offset 64"):
        load_rank(path, 0, [], {}, decoder=decoder)
    lenient = load_run(run, lenient=True)
    assert sorted(lenient.ranks) == [1]


def test_a_rank_file_holding_another_ranks_trace_is_a_corrupt_trace_naming_both(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path)
    (run / "rank-1.et").write_bytes((run / "rank-0.et").read_bytes())  # copied over: it passed check
    with pytest.raises(TraceFormatError, match=r"rank-1\.et: holds rank 0's trace .*not rank 1's"):
        load_run(run)
    assert sorted(load_run(run, lenient=True).ranks) == [0]
