"""Bounded reading of input files, and the node-type lookup that replaced ``np.isin`` on hot paths."""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skewlens.profiler import bounded
from skewlens.profiler.bounded import read_bytes_bounded
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.model import type_mask
from skewlens.profiler.vocab import NodeType


def test_a_file_is_read_whole_up_to_the_limit_and_refused_one_byte_over(tmp_path: Path) -> None:
    f = tmp_path / "t.bin"
    body = bytes(range(256)) * 40
    f.write_bytes(body)
    assert read_bytes_bounded(f, len(body)) == body
    with pytest.raises(SkewlensError, match=f"t.bin: file larger than the {len(body) - 1}-byte limit"):
        read_bytes_bounded(f, len(body) - 1)
    (tmp_path / "empty").write_bytes(b"")
    assert read_bytes_bounded(tmp_path / "empty", 10) == b""


def test_a_gzip_file_is_bounded_by_its_decompressed_size(tmp_path: Path) -> None:
    f = tmp_path / "t.gz"
    body = b"x" * 10_000
    f.write_bytes(gzip.compress(body))
    assert read_bytes_bounded(f, 10_000) == body
    with pytest.raises(SkewlensError, match="limit"):
        read_bytes_bounded(f, 9_999)


def test_a_gzip_file_allowed_a_high_ratio_is_inflated_no_further_than_the_byte_limit(tmp_path: Path) -> None:
    # the limit is min(max_bytes, max(ratio x size, floor)): a generous ratio never lifts max_bytes
    import tracemalloc

    f = tmp_path / "t.gz"
    f.write_bytes(gzip.compress(b"\0" * (64 << 20), compresslevel=9))  # 64 MiB in about 64 KB
    tracemalloc.start()
    try:
        with pytest.raises(SkewlensError, match=r"t\.gz: file larger than the 1048576-byte limit"):
            read_bytes_bounded(f, 1 << 20, gzip_ratio=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # about 1 MiB inflated, not 64


def test_a_file_that_grew_after_its_size_was_taken_is_read_on_still_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "t.bin"
    body = b"abcdefghij" * 100
    f.write_bytes(body)
    real_fstat = os.fstat

    class _Stale:
        st_size = 10  # the size seen before the file grew
        st_mode = stat.S_IFREG | 0o644

    monkeypatch.setattr(bounded.os, "fstat", lambda fd: _Stale() if fd > 2 else real_fstat(fd))
    assert read_bytes_bounded(f, 10_000) == body
    with pytest.raises(SkewlensError, match="limit"):
        read_bytes_bounded(f, 500)


def test_short_reads_are_continued_to_the_end(tmp_path: Path) -> None:
    class _Trickle:
        """A file whose every read returns at most 7 bytes, as a read past 2 GiB returns less on Linux."""

        def __init__(self, data: bytes) -> None:
            self.data, self.pos = data, 0

        def read(self, n: int) -> bytes:
            out = self.data[self.pos : self.pos + min(n, 7)]
            self.pos += len(out)
            return out

    data = bytes(range(100))
    assert bounded._read_upto(_Trickle(data), 1_000) == data  # type: ignore[arg-type]
    assert bounded._read_upto(_Trickle(data), 50) == data[:50]  # type: ignore[arg-type]


def test_the_node_type_lookup_agrees_with_isin_on_every_int8_value() -> None:
    values = np.arange(-128, 128, dtype=np.int8)
    for types in ((NodeType.COMM_COLL,), (NodeType.COMM_SEND, NodeType.COMM_RECV), (0, 1, 5, 127, -1), ()):
        want = np.isin(values, [int(t) for t in types])
        assert np.array_equal(type_mask(values, types), want), types
    wide = values.astype(np.int64)  # another dtype takes np.isin
    assert np.array_equal(type_mask(wide, (NodeType.COMM_SEND,)), wide == int(NodeType.COMM_SEND))


def test_a_gzipped_trace_that_expands_past_its_ratio_is_refused_before_it_is_held(tmp_path: Path) -> None:
    # a 51 KB gzip of zeros held 8.4 GB as empty nodes; now at most 32x its size (or 16 MiB) is inflated
    from skewlens.profiler.chakra_io import MAX_GZIP_RATIO, MIN_GZIP_LIMIT_BYTES
    from skewlens.profiler.errors import TraceFormatError
    from skewlens.profiler.store.load import decode

    bomb = tmp_path / "rank-0.et"
    bomb.write_bytes(gzip.compress(b"\0" * (MIN_GZIP_LIMIT_BYTES + 1), compresslevel=9))
    size = bomb.stat().st_size
    assert MAX_GZIP_RATIO * size < MIN_GZIP_LIMIT_BYTES  # the floor is what it is held to
    with pytest.raises(
        TraceFormatError, match=f"expands past {MIN_GZIP_LIMIT_BYTES} bytes, over 32 times its"
    ):
        decode(bomb)
    fine = tmp_path / "fine.gz"
    body = os.urandom(1 << 20) * 20  # 20 MiB compressing 20x: over the floor, under the ratio
    fine.write_bytes(gzip.compress(body, compresslevel=1))
    assert len(body) > MIN_GZIP_LIMIT_BYTES and len(body) < MAX_GZIP_RATIO * fine.stat().st_size
    assert (
        read_bytes_bounded(fine, 1 << 30, gzip_ratio=MAX_GZIP_RATIO, gzip_floor=MIN_GZIP_LIMIT_BYTES) == body
    )


@pytest.mark.parametrize("decoder", ["vectorised", "reference"])
def test_an_empty_node_message_is_a_corrupt_trace_in_either_decoder(tmp_path: Path, decoder: str) -> None:
    # each zero byte was a node (no id, no type): 10 MiB of them took 1.9 GB and as many errors
    from skewlens.profiler import chakra_schema as pb
    from skewlens.profiler.chakra_io import EtWriter, encode_message
    from skewlens.profiler.errors import TraceFormatError
    from skewlens.profiler.store.load import decode

    f = tmp_path / "rank-0.et"
    with EtWriter(f) as w:
        for i in range(60):
            w.write(pb.Node(id=i + 1, name="aten::mm", type=int(NodeType.COMP)))
    head = f.read_bytes()
    f.write_bytes(head + b"\0" * 100 + encode_message(pb.Node(id=99, name="x", type=int(NodeType.COMP))))
    with pytest.raises(
        TraceFormatError, match=f"rank-0.et: empty node message .* at byte offset {len(head)}"
    ):
        decode(f, decoder=decoder)  # type: ignore[arg-type]


def test_a_file_of_nodes_too_small_to_mean_anything_is_refused_not_held_fifty_times_over(
    tmp_path: Path,
) -> None:
    from skewlens.profiler import chakra_schema as pb
    from skewlens.profiler.chakra_io import EtWriter, encode_message
    from skewlens.profiler.errors import TraceFormatError
    from skewlens.profiler.store.load import decode

    f = tmp_path / "rank-0.et"
    with EtWriter(f):
        pass
    tiny = encode_message(pb.Node(id=1))  # 3 bytes: a length and one field
    assert len(tiny) == 3
    f.write_bytes(f.read_bytes() + tiny * 100_000)
    with pytest.raises(TraceFormatError, match=r"100,00[0-9] messages in .* fewer than 6 bytes a node"):
        decode(f)


def test_a_file_whose_messages_average_six_bytes_is_read_and_a_node_after_an_empty_header_is_not(
    tmp_path: Path,
) -> None:
    # docs/store.md: a file whose messages average under 6 bytes (length prefixes included) is corrupt
    from skewlens.profiler import chakra_schema as pb
    from skewlens.profiler.chakra_io import EtWriter, encode_message
    from skewlens.profiler.errors import TraceFormatError
    from skewlens.profiler.store.load import decode

    f = tmp_path / "rank-0.et"
    with EtWriter(f):
        pass
    header = f.stat().st_size
    node = [encode_message(pb.Node(id=k + 1, type=int(NodeType.COMP))) for k in range(header - 6)]
    assert {len(m) for m in node} == {5}
    f.write_bytes(f.read_bytes() + b"".join(node))  # 6 * (1 + header - 6) bytes: 6 a message
    assert f.stat().st_size == 6 * (1 + len(node))
    assert decode(f).node_id.tolist() == list(range(1, header - 5))
    f.write_bytes(b"\x00" + node[0])  # an empty GlobalMetadata and a node: 6 bytes, 3 a message
    with pytest.raises(TraceFormatError, match="2 messages in 6 bytes: fewer than 6 bytes a node"):
        decode(f)


def test_a_disk_that_fills_while_an_output_is_written_is_one_error_naming_the_output(tmp_path: Path) -> None:
    # matplotlib's and pyarrow's OSErrors went through as tracebacks (analyze's pictures, export's tables)
    import errno

    from skewlens.profiler.atomic import atomic_file, staging_dir

    full = OSError(errno.ENOSPC, "No space left on device")
    target = tmp_path / "out" / "wait_heatmap.png"
    says = f"^cannot write {target}: No space left on device$"
    with pytest.raises(SkewlensError, match=says), atomic_file(target) as tmp:
        tmp.write_bytes(b"half a picture")
        raise full
    assert list(target.parent.iterdir()) == []  # nor its temporary file
    says = f"^cannot write {tmp_path / 'pq'}: No space left on device$"
    with pytest.raises(SkewlensError, match=says), staging_dir(tmp_path / "pq") as d:
        (d / "nodes.parquet").write_bytes(b"part")
        raise full
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    reading = FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "in.et"))
    with pytest.raises(SkewlensError, match=r"No such file or directory \(.*in.et\)$"), atomic_file(target):
        raise reading  # an input's error inside the block names that file


def test_a_gzipped_manifest_that_inflates_past_its_ratio_is_refused_before_it_is_parsed(
    tmp_path: Path,
) -> None:
    # a 1 MB gzip of a manifest padded with "0,0,0,..." was 1 GiB of JSON, and a 5.4 GB MemoryError parsed
    from skewlens.profiler.bounded import JSON_GZIP_FLOOR_BYTES
    from skewlens.profiler.errors import ManifestError
    from skewlens.profiler.manifest import read_manifest

    head = b'{"format": "skewlens-run", "version": 1, "world_size": 1, "ranks": [0], "x": ['
    (tmp_path / "manifest.json").write_bytes(
        gzip.compress(head + b"0," * (JSON_GZIP_FLOOR_BYTES >> 1) + b"0]}")
    )
    with pytest.raises(
        ManifestError, match=f"manifest.json: gzipped manifest expands past {JSON_GZIP_FLOOR_BYTES}"
    ) as e:
        read_manifest(tmp_path)
    assert "trace" not in str(e.value)  # the advice said "if it is a real trace" of a manifest


def test_a_gzip_that_expands_to_exactly_its_limit_is_read_and_its_stream_sought_to_that_limit(
    tmp_path: Path,
) -> None:
    # 1,000 zero bytes in a gzip of a few dozen: the floor, 1,000 bytes, is the limit, and it is allowed
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"\0" * 1000))
    assert read_bytes_bounded(path, 1 << 20, gzip_ratio=1, gzip_floor=1000) == b"\0" * 1000
    with pytest.raises(SkewlensError, match="expands past 999 bytes"):
        read_bytes_bounded(path, 1 << 20, gzip_ratio=1, gzip_floor=999)
    with bounded.open_archive(path, 1 << 20, ratio=1, floor=1000) as (stream, limit):
        assert limit == 1000
        assert stream.read(1000) == b"\0" * 1000
        assert stream.seek(1000) == 1000
        for bad in (lambda: stream.seek(-1), lambda: stream.seek(1001), lambda: stream.seek(0, os.SEEK_END)):
            with pytest.raises(SkewlensError, match="archive expands past 1000 bytes"):
                bad()
        stream.seek(0)
        assert len(stream.read()) == 1000  # all of it, and no more to read
    with bounded.open_archive(path, 1 << 20, ratio=1, floor=999) as (stream, _limit):
        assert stream.read(999) == b"\0" * 999
        with pytest.raises(SkewlensError, match="archive expands past 999 bytes"):
            stream.read(1)


def test_an_xz_archive_is_read_decompressed_and_an_uncompressed_one_is_held_to_its_own_size(
    tmp_path: Path,
) -> None:
    import lzma

    body = os.urandom(300)
    xz, plain = tmp_path / "a.tar.xz", tmp_path / "a.tar"
    xz.write_bytes(lzma.compress(body))
    plain.write_bytes(body)
    with bounded.open_archive(xz, 1 << 20, ratio=64, floor=10) as (stream, _limit):
        assert stream.read() == body
    with bounded.open_archive(plain, 1 << 20, ratio=64, floor=10) as (stream, limit):
        assert (limit, stream.read()) == (300, body)
    # a corrupt xz stream is an OSError, as a corrupt gzip's or bzip2's is (what the callers catch)
    packed = bytearray(lzma.compress(body))
    packed[30] ^= 0xFF  # inside the compressed block: lzma's "Corrupt input data"
    xz.write_bytes(packed)
    with bounded.open_archive(xz, 1 << 20, ratio=64, floor=10) as (stream, _limit), pytest.raises(OSError):
        stream.read()


def test_a_device_or_a_directory_in_place_of_a_file_is_named_as_what_it_is(tmp_path: Path) -> None:
    for path, kind in ((Path(os.devnull), "a device"), (tmp_path, "a directory")):
        with pytest.raises(SkewlensError) as e:
            read_bytes_bounded(path, 1 << 20, what="trace file")
        assert str(e.value) == f"{path}: {kind}, not a regular file: cannot read trace file"


def test_a_bzip2_archive_is_read_decompressed_and_a_plain_one_is_held_to_its_end_but_may_inflate_to_the_floor(
    tmp_path: Path,
) -> None:
    import bz2

    body = os.urandom(300)
    bz, plain = tmp_path / "a.tar.bz2", tmp_path / "a.tar"
    bz.write_bytes(bz2.compress(body))
    plain.write_bytes(body)
    with bounded.open_archive(bz, 1 << 20, ratio=64, floor=10) as (stream, _limit):
        assert stream.read() == body
    # a plain tar's members may inflate (sparse ones) to the floor, but its stream ends where the file does
    with bounded.open_archive(plain, 1 << 20, ratio=64, floor=1000) as (stream, limit):
        assert limit == 1000
        assert stream.read(100) == body[:100]
        assert stream.seek(50, os.SEEK_CUR) == 150 and stream.tell() == 150
        assert stream.read() == body[150:]
        with pytest.raises(
            SkewlensError, match=r"a\.tar: not a readable tar archive \(a member runs past its end\)"
        ):
            stream.seek(301)
        with pytest.raises(SkewlensError, match="not a readable tar archive"):
            stream.seek(-400, os.SEEK_CUR)  # from 300: before the start


def test_a_file_holding_less_than_its_limit_is_read_within_an_address_space_far_below_that_limit(
    tmp_path: Path,
) -> None:
    # a read asks for (allocates) what it may get: the whole limit was asked of a /proc file (size 0: 8 GiB
    # for a trace) and of a gzip (its ratio times its size), an out-of-memory error under ulimit -v
    packed = tmp_path / "t.gz"
    # 4 MiB + 0xC0: its trailer's size read the wrong way round (big-endian) is 3 GiB
    body = os.urandom((4 << 20) + 0xC0)
    packed.write_bytes(gzip.compress(body, compresslevel=1))
    script = f"""
import resource, sys
from pathlib import Path
from skewlens.profiler.bounded import read_bytes_bounded
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
status = read_bytes_bounded(Path("/proc/self/status"), 8 << 30)
data = read_bytes_bounded(Path({str(packed)!r}), 8 << 30, gzip_ratio=1 << 10)
print(status.startswith(b"Name:"), len(data))
"""
    cmd = [sys.executable, "-c", script]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert (got.returncode, got.stdout.split()) == (0, ["True", str(len(body))]), got.stderr[-600:]


class _Recorded:
    """A file of ``size`` zero bytes that records what each read asks for."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.asked: list[int] = []

    def read(self, n: int) -> bytes:
        self.asked.append(n)
        got = min(n, self.left)
        self.left -= got
        return bytes(got)


@pytest.mark.parametrize(
    ("held", "expect", "limit", "asked"),
    [
        # 1 MiB expected of a 100 MiB file under a 70 MiB limit: as many as held so far, at most 16 MiB
        (100 << 20, 1 << 20, 70 << 20, [1, 1, 2, 4, 8, 16, 16, 16, 6]),
        # a size of 0 (a /proc file) holding 300 KiB: from 64 KiB up, until a read returns nothing
        (300 << 10, 0, 1 << 20, [1 / 16, 1 / 16, 1 / 8, 1 / 4, 300 / 1024]),
    ],
    ids=["past-1-mib-expected", "a-size-of-0"],
)
def test_past_the_bytes_a_file_should_hold_a_read_asks_for_as_many_as_held_so_far_from_64_kib_to_16_mib(
    held: int, expect: int, limit: int, asked: list[float]
) -> None:
    from skewlens.profiler.bounded import _read_upto

    fh = _Recorded(held)
    data = _read_upto(fh, limit, expect)  # type: ignore[arg-type]
    assert len(data) == min(held, limit)
    assert fh.asked == [int(a * (1 << 20)) for a in asked]
