"""The column cache: a run's decoded columns beside its traces, used only for the bytes they came from."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from test_store_load import COLUMNS, mixed_run, uneven_splits_run

from skewlens.profiler.errors import ValidationError
from skewlens.profiler.store import colcache, load_run
from skewlens.profiler.store import load as load_mod
from skewlens.profiler.store.fast import MIN_NODES
from skewlens.profiler.store.load import load_rank
from skewlens.profiler.store.model import RankTrace
from skewlens.profiler.synth import RunBuilder


def _decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every file the loader decodes (rather than reads from the cache)."""
    seen: list[Path] = []
    real = load_mod.decode_file

    def counting(path: str | Path, **kw: object) -> object:
        seen.append(Path(path))
        return real(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(load_mod, "decode_file", counting)
    return seen


def _assert_same(a: load_mod.RankTrace, b: load_mod.RankTrace) -> None:
    for c in COLUMNS:
        x, y = getattr(a, c), getattr(b, c)
        assert x.dtype == y.dtype and np.array_equal(x, y), c
    assert a.names == b.names


def test_a_second_load_reads_the_cache_and_gives_exactly_the_decoded_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = mixed_run(tmp_path)
    seen = _decodes(monkeypatch)
    first = load_run(run)
    assert sorted(p.name for p in seen) == ["rank-0.et", "rank-1.et", "rank-2.et"]
    assert colcache.cache_path(run / "rank-0.et").is_file()
    assert (run / ".skewlens-cache" / "rank-0.et.arrow").is_file()  # as docs/store.md names it
    seen.clear()
    second = load_run(run)
    assert seen == []  # every rank came from the cache
    for r in (0, 1, 2):
        _assert_same(first.ranks[r], second.ranks[r])
        _assert_same(first.ranks[r], load_rank(run / f"rank-{r}.et", r, [], {}, decoder="reference"))
    assert first.collectives == second.collectives and first.p2p == second.p2p
    assert len(second.collectives) == 8 + 5 and len(second.p2p) == 1


def test_a_rewritten_trace_is_decoded_again_not_read_from_its_old_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = mixed_run(tmp_path)
    load_run(run)
    other = mixed_run(tmp_path, op="oq", name="other")  # same shape and size, other names
    et = run / "rank-0.et"
    stat = et.stat()
    et.write_bytes((other / "rank-0.et").read_bytes())
    os.utime(et, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: only the CRC differs
    assert et.stat().st_size == stat.st_size
    seen = _decodes(monkeypatch)
    loaded = load_run(run, match=False)
    assert [p.name for p in seen] == ["rank-0.et"]
    assert "aten::oq0" in loaded.ranks[0].names and "aten::op0" in loaded.ranks[1].names


def _long_trace(d: Path, odd: int | None = None) -> Path:
    """One rank of 3,000 compute nodes (about 300 KB), ``aten::mm`` but node ``odd``: ``aten::zz``."""
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    for i in range(3000):
        rb.compute("aten::zz" if i == odd else "aten::mm", 1000)
    return b.write(d) / "rank-0.et"


@pytest.mark.parametrize(("node", "new_mtime"), [(0, False), (2999, False), (1500, True)])
def test_a_large_trace_changed_in_its_first_or_last_64_kib_or_given_a_new_mtime_is_decoded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: int, new_mtime: bool
) -> None:
    # docs/store.md: the cache is used only for a trace of the same size, mtime and CRC-32 of its first and
    # last 64 KiB; a change elsewhere is seen only through the mtime
    et = _long_trace(tmp_path / "run")
    load_rank(et, 0, [], {})
    data = et.read_bytes()
    changed = _long_trace(tmp_path / "other", odd=node).read_bytes()
    assert len(changed) == len(data) > 4 * 64 * 1024
    at = next(i for i, (x, y) in enumerate(zip(data, changed, strict=True)) if x != y)
    edge = 64 * 1024
    assert (edge <= at < len(data) - edge) == new_mtime  # the middle case changes no byte the CRC covers
    stat = et.stat()
    et.write_bytes(changed)
    mtime = stat.st_mtime_ns + 1_000_000_000 if new_mtime else stat.st_mtime_ns
    os.utime(et, ns=(stat.st_atime_ns, mtime))
    seen = _decodes(monkeypatch)
    loaded = load_rank(et, 0, [], {})
    assert seen == [et]
    assert loaded.names[loaded.name_idx[node + 1]] == "aten::zz"  # row 0 is the process-group node


def test_a_cache_written_by_format_3_is_not_used_it_lacks_launched_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/store.md: a cache file of another format version is ignored (format 3 lacks launched_in)
    run = mixed_run(tmp_path)
    et = run / "rank-0.et"
    monkeypatch.setattr(colcache, "FORMAT_VERSION", 3)  # as a skewlens of format 3 wrote it
    load_rank(et, 0, [], {})
    assert colcache.cache_path(et).is_file()
    monkeypatch.undo()
    seen = _decodes(monkeypatch)
    load_rank(et, 0, [], {})
    assert seen == [et]
    seen.clear()
    load_rank(et, 0, [], {})
    assert seen == []  # rewritten in this format


def test_a_cache_written_by_format_4_is_not_used_its_decoder_read_int32_varints_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # format 4 caches were written both before and after the vectorised decoder came to read an int32 varint
    # as protobuf does (its low 32 bits: b542942); an earlier one holds 2**32 + 1 where the trace says 1
    et = mixed_run(tmp_path) / "rank-0.et"
    decoded = load_rank(et, 0, [], {})
    assert (decoded.step == 1).sum() > 0

    def whole_int32(b: pa.RecordBatch) -> pa.RecordBatch:
        steps = np.asarray(b.column("a:skl_step")) + 2**32
        return _with(b, "a:skl_step", pa.array(steps, pa.int64()))

    # the old code served the cache: 'skl_step 4294967297 is out of range'
    _assert_same(decoded, _load_past_a_cache_of(et, 4, whole_int32, monkeypatch))


def _load_past_a_cache_of(
    et: Path, version: int, change: object, monkeypatch: pytest.MonkeyPatch
) -> RankTrace:
    """Load ``et`` once its cache is rewritten by ``change`` as format ``version`` wrote it; the load must
    decode the trace (not serve that cache)."""
    key = colcache.fingerprint(et)
    assert key is not None
    _rewrite_cache(et, change, key=f"{version}:".encode() + key.split(b":", 1)[1])
    seen = _decodes(monkeypatch)
    again = load_rank(et, 0, [], {})
    assert seen == [et]
    return again


def _rewrite_cache(et: Path, change: object, key: bytes | None = None) -> None:
    """Apply ``change`` (batch -> batch) to ``et``'s cache file, keeping its key unless given ``key``."""
    path = colcache.cache_path(et)
    with ipc.open_file(pa.memory_map(str(path))) as r:
        meta, batch = dict(r.schema.metadata), r.get_batch(0)
    new = change(batch)  # type: ignore[operator]
    if key is not None:
        meta[b"skewlens.columns"] = key
    path.unlink()
    parts = new if isinstance(new, list) else [new]  # a list: one record batch each
    with ipc.new_file(str(path), parts[0].schema.with_metadata(meta)) as w:
        for part in parts:
            w.write_batch(part.replace_schema_metadata(meta))


def _with(batch: pa.RecordBatch, name: str, col: pa.Array | None) -> pa.RecordBatch:
    """``batch`` with its column ``name`` replaced by ``col``, added last where it has none, or dropped where
    ``col`` is None: RecordBatch's set_column, append_column and drop_columns came in pyarrow 16, and these
    tests failed with an AttributeError at pyproject's pyarrow>=15."""
    columns = {field.name: (field, batch.column(field.name)) for field in batch.schema}
    if col is None:
        del columns[name]
    else:
        columns[name] = (pa.field(name, col.type), col)
    fields, arrays = zip(*columns.values(), strict=True)
    return pa.RecordBatch.from_arrays(list(arrays), schema=pa.schema(fields))


def _kinds_of_seven(b: pa.RecordBatch) -> pa.RecordBatch:
    kinds = b.column("dep_kind")
    sevens = pa.array([7] * len(kinds.values), pa.int8())
    return _with(b, "dep_kind", pa.ListArray.from_arrays(kinds.offsets, sevens))


def _bad_name_index(b: pa.RecordBatch) -> pa.RecordBatch:
    names = b.column("name")
    idx = np.full(len(names), len(names.dictionary) + 5, dtype=np.int32)
    return _with(b, "name", pa.DictionaryArray.from_arrays(pa.array(idx), names.dictionary, safe=False))


def _names(b: pa.RecordBatch, extra: list[str], column: str = "name") -> pa.DictionaryArray:
    """``b``'s names (or another string ``column``), their dictionary followed by ``extra`` (unused)
    strings."""
    names = b.column(column)
    return pa.DictionaryArray.from_arrays(names.indices, pa.array(names.dictionary.to_pylist() + extra))


def _distinct(b: pa.RecordBatch, column: str, count: int) -> pa.RecordBatch:
    """``b`` with ``column``'s dictionary grown to ``count`` distinct strings."""
    have = len(b.column(column).dictionary)
    return _with(b, column, _names(b, [f"n{i}" for i in range(count - have)], column))


def _null_name(b: pa.RecordBatch) -> pa.RecordBatch:
    names = b.column("name")
    idx = pa.array([None, *names.indices.to_pylist()[1:]], pa.int32())
    return _with(b, "name", pa.DictionaryArray.from_arrays(idx, names.dictionary))


def _kinds_apart_from_ids(b: pa.RecordBatch) -> pa.RecordBatch:
    kinds = b.column("dep_kind")  # as many kinds as ids, but all on the last row
    offsets = np.zeros(b.num_rows + 1, dtype=np.int32)
    offsets[-1] = len(kinds.values)
    return _with(b, "dep_kind", pa.ListArray.from_arrays(pa.array(offsets), kinds.values))


TAMPERED = {
    "truncated": None,
    "dependency kinds of 7": _kinds_of_seven,
    "a name index past its dictionary": _bad_name_index,
    "a column of another type": lambda b: _with(b, "start_us", b.column("start_us").cast(pa.float64())),
    "a column the format lacks": lambda b: _with(b, "a:evil", pa.array([1] * b.num_rows, pa.int64())),
    "an unknown attribute's pair of columns": lambda b: _with(
        _with(b, "a:evil", pa.array([1] * b.num_rows, pa.int64())),
        "h:evil",
        pa.array([1] * b.num_rows, pa.uint8()),
    ),
    "flags that are not 0 or 1": lambda b: _with(b, "h:stream", pa.array([9] * b.num_rows, pa.uint8())),
    "a node without a name": _null_name,
    "dependency kinds listed apart from their ids": _kinds_apart_from_ids,
    "its rows in two record batches": lambda b: [b.slice(0, 20), b.slice(20)],
    # bytes the trace does not hold (a forged cache of a 7 KB trace named a node with 600 MB)
    "a name longer than the trace": lambda b: _with(b, "name", _names(b, ["x" * (4 << 20)])),
    "more distinct names than nodes": lambda b: _with(
        b, "name", _names(b, [f"n{i}" for i in range(b.num_rows)])
    ),
    "one more distinct name than nodes": lambda b: _distinct(b, "name", b.num_rows + 1),
    "more distinct group names than nodes": lambda b: _distinct(b, "pg_name", b.num_rows + 1),
    "more distinct dtypes than nodes": lambda b: _distinct(b, "dtype", b.num_rows + 1),
    "a metadata message longer than the trace": lambda b: _with(
        b, "metadata_msg", pa.array([b"\x08" * (4 << 20)] * b.num_rows, pa.binary())
    ),
}


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_damaged_cache_is_never_used_the_trace_is_decoded_and_the_cache_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run = mixed_run(tmp_path)
    et = run / "rank-0.et"
    truth = load_rank(et, 0, [], {})
    change = TAMPERED[how]
    if change is None:
        path = colcache.cache_path(et)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        _rewrite_cache(et, change)
    seen = _decodes(monkeypatch)
    _assert_same(load_rank(et, 0, [], {}), truth)
    assert seen == [et]
    seen.clear()
    _assert_same(load_rank(et, 0, [], {}), truth)
    assert seen == []  # the rewritten cache is sound


def test_a_cache_claiming_more_rows_than_its_trace_could_hold_is_refused(tmp_path: Path) -> None:
    run = mixed_run(tmp_path)
    et = run / "rank-0.et"
    load_rank(et, 0, [], {})
    key = colcache.fingerprint(et)
    assert key is not None and colcache.read(et, key) is not None
    size = int(key.split(b":")[1])
    small = key.replace(f":{size}:".encode(), f":{2 * MIN_NODES}:".encode())  # a trace of 96 bytes
    _rewrite_cache(et, lambda b: b, key=small)
    assert colcache.read(et, small) is None
    _rewrite_cache(et, lambda b: b, key=key)
    assert colcache.read(et, key) is not None


def test_a_cache_whose_dependency_lists_hold_more_entries_than_the_trace_could_is_refused(
    tmp_path: Path,
) -> None:
    run = mixed_run(tmp_path)
    et = run / "rank-0.et"
    truth = load_rank(et, 0, [], {})
    key = colcache.fingerprint(et)
    assert key is not None and colcache.read(et, key) is not None
    size = int(key.split(b":")[1])

    def bloated(b: pa.RecordBatch) -> pa.RecordBatch:  # a last row of one dependency more than the bytes
        offsets = np.zeros(b.num_rows + 1, dtype=np.int32)
        offsets[-1] = size + 1
        ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(size + 1, dtype=np.uint64)))
        kinds = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(size + 1, dtype=np.int8)))
        return _with(_with(b, "dep_id", ids), "dep_kind", kinds)

    _rewrite_cache(et, bloated)
    assert colcache.read(et, key) is None
    _assert_same(load_rank(et, 0, [], {}), truth)  # decoded again


def test_a_cache_that_says_so_is_trusted_for_its_content_but_the_explicit_decoders_read_the_trace(
    tmp_path: Path,
) -> None:
    run = mixed_run(tmp_path)
    et = run / "rank-0.et"
    truth = load_rank(et, 0, [], {})
    _rewrite_cache(et, lambda b: _with(b, "a:skl_dur_ns", pa.array(np.full(b.num_rows, 5, np.int64))))
    auto = load_rank(et, 0, [], {})  # the cache's key matches the trace: its columns are used
    has = truth.dur_ns != 0
    assert has.sum() > 50 and (auto.dur_ns[has] == 5).all()
    for decoder in ("vectorised", "reference"):
        _assert_same(load_rank(et, 0, [], {}, decoder=decoder), truth)  # type: ignore[arg-type]


def test_errors_in_a_trace_are_reported_the_same_from_the_cache(tmp_path: Path) -> None:
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    for i in range(MIN_NODES + 2):
        rb.compute(f"aten::op{i % 3}", 1000 + i)
    rb.compute("aten::late", 10, deps=(999_999,))  # a dependency on no node
    run = b.write(tmp_path / "run")
    msgs = []
    for _ in range(2):
        with pytest.raises(ValidationError) as err:
            load_run(run)
        msgs.append(str(err.value))
    assert colcache.cache_path(run / "rank-0.et").is_file()
    assert msgs[0] == msgs[1] and "999999" in msgs[0] and "dangling" in msgs[0]


def test_a_node_type_the_cache_cannot_hold_is_not_cached_so_a_second_load_refuses_it_too(
    tmp_path: Path,
) -> None:
    # stored as int8, type 260 read back as 4 (COMP): the first load refused the trace, the second passed
    import dataclasses

    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    for i in range(MIN_NODES + 2):
        rb.compute(f"aten::op{i % 3}", 1000 + i)
    rb.nodes[3] = dataclasses.replace(rb.nodes[3], node_type=260)  # type: ignore[arg-type]
    run = b.write(tmp_path / "run")
    for _ in range(2):
        with pytest.raises(ValidationError, match="unknown node type 260"):
            load_run(run)
    assert not colcache.cache_path(run / "rank-0.et").exists()


def test_no_cache_is_written_where_the_directory_cannot_hold_one_or_where_it_is_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = mixed_run(tmp_path)
    (run / colcache.CACHE_DIRNAME).write_text("a file where the cache folder would go")
    first = load_run(run)
    assert (run / colcache.CACHE_DIRNAME).is_file()  # the load went on, decoding
    other = mixed_run(tmp_path, name="off")
    monkeypatch.setenv(colcache.ENV_CACHE, "off")
    seen = _decodes(monkeypatch)
    for _ in range(2):
        load_run(other)
    assert not (other / colcache.CACHE_DIRNAME).exists()
    assert len(seen) == 6
    _assert_same(first.ranks[0], load_run(other).ranks[0])


@pytest.mark.parametrize("value", ["off", "0", "no", "false", " OFF "])
def test_each_documented_off_value_turns_the_cache_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # colcache.ENV_CACHE: off (or 0, no, false), in any case
    monkeypatch.setenv(colcache.ENV_CACHE, value)
    assert not colcache.enabled()
    monkeypatch.setenv(colcache.ENV_CACHE, "on")
    assert colcache.enabled()


def test_files_of_few_nodes_are_not_cached(tmp_path: Path) -> None:
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    for i in range(MIN_NODES - 5):
        rb.compute("aten::mm", 1000 + i)
    run = b.write(tmp_path / "run")
    load_run(run)
    assert not colcache.cache_path(run / "rank-0.et").exists()


def test_a_cache_whose_split_lists_hold_more_values_than_the_trace_could_is_refused(tmp_path: Path) -> None:
    # before format 3 the cache had no split lists: a version-2 cache would have loaded without them
    run = uneven_splits_run(tmp_path, [100, 200], [7, 0])
    et = run / "rank-0.et"
    truth = load_rank(et, 0, [], {})
    key = colcache.fingerprint(et)
    assert key is not None and key.startswith(f"{colcache.FORMAT_VERSION}:".encode())
    cached = colcache.read(et, key)
    assert cached is not None and cached.attr_lists["skl_send_splits"][1].tolist() == [100, 200]
    size = int(key.split(b":")[1])

    def bloated(b: pa.RecordBatch) -> pa.RecordBatch:  # a last row of one value more than the trace's bytes
        ptr = np.zeros(b.num_rows + 1, dtype=np.int32)
        ptr[-1] = size + 1
        lists = pa.ListArray.from_arrays(pa.array(ptr), pa.array(np.zeros(size + 1, dtype=np.int64)))
        return _with(b, "l:skl_send_splits", lists)

    _rewrite_cache(et, bloated)
    assert colcache.read(et, key) is None
    loaded = load_rank(et, 0, [], {})  # decoded again
    assert loaded.split_send_bytes is not None and truth.split_send_bytes is not None
    assert loaded.split_send_bytes.tolist() == truth.split_send_bytes.tolist() == [100, 200]


def test_a_cache_folder_that_is_a_link_is_neither_written_through_nor_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run from elsewhere whose .skewlens-cache linked to another folder had analyze write rank-<r>.et.arrow
    # there (replacing files of those names): loading a run wrote outside its directory
    run = mixed_run(tmp_path)
    load_run(run)  # a sound cache, moved away and linked to
    elsewhere = tmp_path / "elsewhere"
    (run / colcache.CACHE_DIRNAME).rename(elsewhere)
    (run / colcache.CACHE_DIRNAME).symlink_to(elsewhere, target_is_directory=True)
    seen = _decodes(monkeypatch)
    load_run(run)
    assert len(seen) == 3  # decoded, not read through the link
    for f in elsewhere.iterdir():
        f.unlink()
    load_run(run)
    assert list(elsewhere.iterdir()) == []


def test_the_cached_raw_columns_have_the_decoders_types_and_values(tmp_path: Path) -> None:
    # the cache read dependency kinds back as int64 (8 bytes an entry) where the decoders give int8
    import dataclasses

    from skewlens.profiler.store.fast import decode_file

    et = mixed_run(tmp_path) / "rank-0.et"
    load_run(et.parent)
    key = colcache.fingerprint(et)
    assert key is not None
    cached, decoded = colcache.read(et, key), decode_file(et)
    assert cached is not None
    for f in dataclasses.fields(decoded):
        a, b = getattr(cached, f.name), getattr(decoded, f.name)
        if isinstance(b, np.ndarray):
            assert (a.dtype, a.tolist()) == (b.dtype, b.tolist()), f.name


def _returned_run(tmp_path: Path) -> Path:
    """2 ranks, enough nodes for the vectorised decoder; rank 0's asynchronous sends record their calls'
    returns (``skl_return_ns``), one past int32, and one send records none."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    for i in range(MIN_NODES):
        r0.compute("aten::mm", 1_000)
        at = 10_000_000 * (i + 1)
        r0.send(1, 4096, 500, start_ns=at, stream=1000, return_ns=None if i == 3 else at + 5_000_000_000 * i)
        r1.recv(0, 4096, 500, start_ns=at)
    return b.write(tmp_path / "run")


def test_the_return_of_an_asynchronous_call_round_trips_through_chakra_the_decoders_the_cache_and_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq
    from chakra_reader import read_with_chakra

    from skewlens.profiler.store.parquet import export_run

    run = _returned_run(tmp_path)
    want = [None if i == 3 else 10_000_000 * (i + 1) + 5_000_000_000 * i for i in range(MIN_NODES)]
    # Chakra's own reader: an int64 attribute of the send nodes
    _gm, nodes = read_with_chakra(run / "rank-0.et")
    got = [
        next((a.int64_val for a in n.attr if a.name == "skl_return_ns"), None)
        for n in nodes
        if n.name == "c10d::send"
    ]
    assert got == want
    sends = lambda rt: [i for i in range(len(rt)) if rt.name(i) == "c10d::send"]  # noqa: E731
    for decoder in ("vectorised", "reference"):
        rt = load_rank(run / "rank-0.et", 0, [], {}, decoder=decoder)
        assert rt.return_ns is not None
        assert [None if v < 0 else v for v in rt.return_ns[sends(rt)].tolist()] == want, decoder
        assert (rt.return_ns[[i for i in range(len(rt)) if i not in sends(rt)]] == -1).all()
        assert load_rank(run / "rank-1.et", 1, [], {}, decoder=decoder).return_ns is None  # records none
    load_run(run)  # decodes and writes the cache
    seen = _decodes(monkeypatch)
    cached = load_run(run)
    assert seen == []  # from the cache
    assert cached.ranks[0].return_ns is not None
    assert np.array_equal(cached.ranks[0].return_ns, rt.return_ns)
    out = export_run(run, tmp_path / "pq", workers=1) and tmp_path / "pq"
    t = pq.read_table(out / "nodes" / "rank=0", columns=["name", "return_ns"]).to_pylist()
    assert [row["return_ns"] for row in t if row["name"] == "c10d::send"] == want
    assert {row["return_ns"] for row in t if row["name"] != "c10d::send"} == {None}


def test_a_cache_written_by_format_5_is_not_used_it_lacks_the_calls_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # format 5's decoder knew no skl_return_ns: its cache of a trace that has them holds none
    et = _returned_run(tmp_path) / "rank-0.et"
    decoded = load_rank(et, 0, [], {})
    assert decoded.return_ns is not None

    def format_5(b: pa.RecordBatch) -> pa.RecordBatch:
        return _with(_with(b, "a:skl_return_ns", None), "h:skl_return_ns", None)

    again = _load_past_a_cache_of(et, 5, format_5, monkeypatch)  # served, it gave no returns at all
    assert again.return_ns is not None and np.array_equal(again.return_ns, decoded.return_ns)


def test_a_cache_file_is_not_written_where_it_would_leave_the_runs_disk_under_its_free_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 128-rank run of 2.6 MB on a 3.5 MB file system: its load wrote cache until 20 KB were left
    run = mixed_run(tmp_path)
    first = load_run(run)
    size = max(p.stat().st_size for p in (run / colcache.CACHE_DIRNAME).iterdir())
    cache = run / colcache.CACHE_DIRNAME
    for p in cache.iterdir():
        p.unlink()
    total = 1_000 * size
    reserve = int(total * colcache.MIN_FREE_SHARE)

    def disk(free: int) -> None:  # a file system of ``total`` bytes, ``free`` of them available
        st = os.statvfs_result((1, 1, total, free, free, 1_000, 1_000, 1_000, 0, 255))
        monkeypatch.setattr(os, "statvfs", lambda _p: st)

    disk(reserve + 1)  # any cache file would take it under the reserve
    seen = _decodes(monkeypatch)
    for _ in range(2):
        again = load_run(run)
    assert list(cache.iterdir()) == []
    assert len(seen) == 6  # each load decoded every rank
    for r in (0, 1, 2):
        _assert_same(first.ranks[r], again.ranks[r])
    disk(reserve + 4 * size)  # room for the largest, as each load sees it
    load_run(run)
    assert sorted(p.name for p in cache.iterdir()) == [f"rank-{r}.et.arrow" for r in (0, 1, 2)]


def test_a_caches_names_and_metadata_may_hold_as_many_bytes_as_its_trace_and_not_one_more(
    tmp_path: Path,
) -> None:
    et = mixed_run(tmp_path) / "rank-0.et"
    load_rank(et, 0, [], {})
    key = colcache.fingerprint(et)
    assert key is not None
    size = int(key.split(b":")[1])
    path = colcache.cache_path(et)
    sound = path.read_bytes()
    with ipc.open_file(pa.memory_map(str(path))) as r:
        meta, batch = dict(r.schema.metadata), r.get_batch(0)
    names = sum(len(s.encode()) for s in batch.column("name").dictionary.to_pylist())
    msgs = batch.column("metadata_msg").to_pylist()
    held = sum(len(m or b"") for m in msgs) + len(meta[b"skewlens.global_metadata"])

    def padded(b: pa.RecordBatch, pad: int) -> pa.RecordBatch:
        return _with(b, "metadata_msg", pa.array([(msgs[0] or b"") + b"\0" * pad, *msgs[1:]], pa.binary()))

    read = {}
    for over in (0, 1):
        for what, change in (
            ("names", lambda b, o=over: _with(b, "name", _names(b, ["x" * (size - names + o)]))),
            ("metadata", lambda b, o=over: padded(b, size - held + o)),
        ):
            path.write_bytes(sound)
            _rewrite_cache(et, change)
            read[what, over] = colcache.read(et, key) is not None
    assert read == {("names", 0): True, ("metadata", 0): True, ("names", 1): False, ("metadata", 1): False}
