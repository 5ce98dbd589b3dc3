"""Bounded reading of input files, and the node-type lookup that replaced ``np.isin`` on hot paths."""

from __future__ import annotations

import gzip
import os
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


def test_a_file_that_grew_after_its_size_was_taken_is_read_on_still_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "t.bin"
    body = b"abcdefghij" * 100
    f.write_bytes(body)
    real_fstat = os.fstat

    class _Stale:
        st_size = 10  # the size seen before the file grew

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
