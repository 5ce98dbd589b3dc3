"""The vectorised decoder's packed varint lists (dependency lists, int64 lists), decoded in batches."""

from __future__ import annotations

import functools
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as pb

from skewlens.profiler.chakra_io import EtWriter
from skewlens.profiler.store import fast
from skewlens.profiler.store import load as load_mod
from skewlens.profiler.store.fast import FastDecodeError, TraceBytes, _packed_varints, decode_file
from skewlens.profiler.store.load import load_rank
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

SMALL_BATCHES = (16, 17, 23, 40, 64)


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _layout(lists: list[bytes], gaps: list[int]) -> tuple[TraceBytes, np.ndarray, np.ndarray]:
    """The lists laid out in one buffer, each after ``gaps[i]`` bytes of 0xFF: (bytes, start, length)."""
    data = bytearray()
    start = []
    for body, gap in zip(lists, gaps, strict=True):
        data += b"\xff" * gap
        start.append(len(data))
        data += body
    return TraceBytes(bytes(data)), np.array(start, np.int64), np.array([len(x) for x in lists], np.int64)


def test_lists_decode_to_the_same_values_whatever_batches_split_them() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n_lists = int(rng.integers(0, 9))
        sizes = rng.integers(0, 12, n_lists)
        values = [
            [int(v) >> int(rng.integers(0, 64)) for v in rng.integers(0, 2**64, k, np.uint64)] for k in sizes
        ]
        for vs in values:  # values of 1 to 10 bytes, the extremes first
            vs[: int(rng.integers(0, 3))] = [0, 2**64 - 1][: len(vs)]
        owner = rng.integers(0, 1000, n_lists)
        b, start, length = _layout(
            [b"".join(_varint(v) for v in vs) for vs in values], [int(g) for g in rng.integers(0, 3, n_lists)]
        )
        want_owner = [int(o) for o, vs in zip(owner, values, strict=True) for _ in vs]
        want_vals = [v for vs in values for v in vs]
        for batch in (*SMALL_BATCHES, fast.PACKED_BATCH_BYTES):
            got_owner, got_vals = _packed_varints(b, owner, start, length, batch_bytes=batch)
            assert got_owner.dtype == np.int64 and got_vals.dtype == np.uint64
            assert got_owner.tolist() == want_owner, batch
            assert got_vals.tolist() == want_vals, batch


def test_a_ten_byte_varint_reads_whole_at_every_place_a_batch_can_cut_it() -> None:
    for lead in range(40):  # one-byte values before it, so that each batch of 16 cuts it elsewhere
        body = b"\x01" * lead + _varint(2**64 - 1) + b"\x05"
        b, start, length = _layout([body], [0])
        _, vals = _packed_varints(b, np.array([3]), start, length, batch_bytes=16)
        assert vals.tolist() == [1] * lead + [2**64 - 1, 5]


@pytest.mark.parametrize("batch", SMALL_BATCHES)
def test_a_list_ending_inside_a_varint_is_refused_wherever_the_batches_fall(batch: int) -> None:
    for lead in range(2 * batch):
        lists = [b"\x01" * lead + b"\x81", b"\x02\x03"]  # the first list ends on a continuation byte
        b, start, length = _layout(lists, [0, 1])
        with pytest.raises(FastDecodeError, match="packed list ends inside a varint"):
            _packed_varints(b, np.array([0, 1]), start, length, batch_bytes=batch)


@pytest.mark.parametrize("batch", SMALL_BATCHES)
def test_an_eleven_byte_varint_is_refused_wherever_the_batches_fall(batch: int) -> None:
    for lead in range(2 * batch):
        body = b"\x01" * lead + b"\x80" * 10 + b"\x01" + b"\x02" * batch  # 11 bytes, then more values
        b, start, length = _layout([body], [0])
        with pytest.raises(FastDecodeError, match="varint longer than 10 bytes"):
            _packed_varints(b, np.array([0]), start, length, batch_bytes=batch)


def test_a_batch_asked_smaller_than_a_varint_is_raised_to_sixteen_bytes() -> None:
    # a batch of under 11 bytes can hold no whole 10-byte varint: it would be refused as too long
    body = _varint(2**64 - 1) + b"\x07" + _varint(300)
    b, start, length = _layout([body], [0])
    for batch in (1, 5, 10):
        _, vals = _packed_varints(b, np.array([0]), start, length, batch_bytes=batch)
        assert vals.tolist() == [2**64 - 1, 7, 300], batch


def test_a_run_of_continuation_bytes_longer_than_a_batch_is_refused_as_a_long_varint() -> None:
    # a batch with no terminator at all: it was an IndexError (a traceback), not the decoder's refusal
    for lead in (0, 3, 16):
        body = b"\x01" * lead + b"\x80" * 40 + b"\x01"
        b, start, length = _layout([body], [0])
        with pytest.raises(FastDecodeError, match="varint longer than 10 bytes"):
            _packed_varints(b, np.array([0]), start, length, batch_bytes=16)


def test_decoding_one_long_list_allocates_little_more_than_its_values() -> None:
    # 2,000,000 values of one byte: the output is 16 bytes a value (owner, value); decoding them all at once
    # took 82 bytes a value in all (a 50 MB list held 4 GB in `skewlens check`), now 19
    n = 2_000_000
    b, start, length = _layout([b"\x01" * n], [0])
    tracemalloc.start()
    try:
        owner, vals = _packed_varints(b, np.array([5]), start, length)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert vals.shape == (n,) and int(vals.sum()) == n and bool((owner == 5).all())
    assert peak < 16 * n + 200 * fast.PACKED_BATCH_BYTES, peak  # one batch: about 90 bytes a byte


def test_a_run_decoded_in_tiny_batches_reads_as_the_reference_decoder_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        for i in range(60):
            rb.compute(f"aten::op{i % 4}", 1000 + 7 * i, stream=i % 2)
            if i % 6 == 0:
                send = [1000 + 97 * i, 3096 - i]
                kw = {"peer_bytes": (sum(send) - send[r], sum(send) - send[r]), "peer_splits": (send, send)}
                rb.collective(CommType.ALL_TO_ALL, sum(send), 300, **kw)
    run = b.write(tmp_path / "run")
    monkeypatch.setattr(fast, "_packed_varints", functools.partial(_packed_varints, batch_bytes=16))
    for r in range(2):
        v = load_rank(run / f"rank-{r}.et", r, [], {}, decoder="vectorised")
        ref = load_rank(run / f"rank-{r}.et", r, [], {}, decoder="reference")
        assert v.dep_ptr.tolist() == ref.dep_ptr.tolist() and v.dep_idx.tolist() == ref.dep_idx.tolist()
        assert v.dep_kind.tolist() == ref.dep_kind.tolist() and int(v.dep_idx.size) > 60
        assert v.split_ptr is not None and ref.split_ptr is not None
        assert v.split_ptr.tolist() == ref.split_ptr.tolist()
        assert v.split_send_bytes is not None and ref.split_send_bytes is not None
        assert v.split_send_bytes.tolist() == ref.split_send_bytes.tolist()


def _run_with_a_long_list(tmp_path: Path, n: int, *, out_of_order: bool) -> Path:
    """A rank of 60 nodes, then one listing ``n`` copies of a control dependency on node 1 (packed, a byte
    each); ``out_of_order``: with a node before it carrying a data dependency, so that the decoder sorts."""
    b = RunBuilder(1)
    rb = b.rank(0).step(1)
    for i in range(60):
        rb.compute(f"aten::op{i % 5}", 1000 + i)
    run = b.write(tmp_path / "run")
    f = run / "rank-0.et"
    node = b"\x08" + _varint(999_999) + b"\x12\x04long\x18\x04" + b"\x22" + _varint(n) + b"\x01" * n
    other = b"\x08" + _varint(999_998) + b"\x12\x04data\x18\x04\x2a\x01\x01" if out_of_order else b""
    with f.open("ab") as fh:
        fh.write(_varint(len(other)) + other if other else b"")
        fh.write(_varint(len(node)) + node)
    return run


@pytest.mark.parametrize("out_of_order", [False, True])
def test_loading_a_long_dependency_list_allocates_a_bounded_multiple_of_its_bytes(
    tmp_path: Path, out_of_order: bool
) -> None:
    # each value ends as 9 bytes (row, kind) and is decoded as 17 (owner, id, kind); joining, sorting and
    # resolving the lists took 67-90 bytes a value (a 50 MB file: 3.3 GB), now at most 36
    n = 2_000_000
    run = _run_with_a_long_list(tmp_path, n, out_of_order=out_of_order)
    tracemalloc.start()
    try:
        rt = load_rank(run / "rank-0.et", 0, [], {}, decoder="vectorised")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    row = rt.node_id.tolist().index(999_999)
    # resolved to node 1's row, and read once (a repeated-dependency warning): the copies were edges too
    assert rt.deps_of(row).tolist() == [rt.node_id.tolist().index(1)]
    assert peak < 40 * n, peak


def test_list_attributes_read_by_row_whatever_field_of_their_node_they_are(tmp_path: Path) -> None:
    # the decoder meets the attributes field by field across nodes: node 0's third field after node 1's first
    f = tmp_path / "rank-0.et"
    want: dict[int, list[int]] = {}
    with EtWriter(f, {"rank": 0, "world_size": 1}) as w:
        for i in range(60):
            n = pb.Node(id=i + 1, name="c10d::all_to_all_", type=7)
            for _ in range((7 * i) % 4):
                n.attr.add(name="stream", int64_val=i)
            if i % 3:
                want[i] = [1000 * i + k for k in range(1 + i % 5)]
                n.attr.add(name="skl_send_splits", int64_list=pb.Int64List(values=want[i]))
            w.write(n)
    rows = [r for r in sorted(want) for _ in want[r]]
    values = [v for r in sorted(want) for v in want[r]]
    for raw in (decode_file(f, min_nodes=0), load_mod.decode(f, decoder="reference")):
        got_rows, got_values = raw.attr_lists["skl_send_splits"]
        assert got_rows.tolist() == rows and got_values.tolist() == values


def test_decoding_a_long_list_attribute_allocates_little_more_than_its_values(tmp_path: Path) -> None:
    # one node's skl_send_splits of 2,000,000 one-byte values (refused later, by the loader, as more than
    # MAX_SPLITS): decoded as 16 bytes a value; sorting the values after decoding took 43 bytes a value
    n = 2_000_000
    run = _run_with_a_long_list(tmp_path, 0, out_of_order=False)
    inner = b"\x0a" + _varint(n) + b"\x01" * n
    attr = b"\x0a\x0fskl_send_splits\x52" + _varint(len(inner)) + inner
    node = b"\x08" + _varint(999_997) + b"\x12\x04list\x18\x07\x52" + _varint(len(attr)) + attr
    with (run / "rank-0.et").open("ab") as fh:
        fh.write(_varint(len(node)) + node)
    tracemalloc.start()
    try:
        rows, values = decode_file(run / "rank-0.et").attr_lists["skl_send_splits"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert values.shape == (n,) and bool((values == 1).all()) and bool((rows == rows[0]).all())
    assert peak < 26 * n, peak  # the file twice (read, padded), the values, one batch
