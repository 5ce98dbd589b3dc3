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


def _rewrite_cache(et: Path, change: object, key: bytes | None = None) -> None:
    """Apply ``change`` (batch -> batch) to ``et``'s cache file, keeping its key unless given ``key``."""
    path = colcache.cache_path(et)
    with ipc.open_file(pa.memory_map(str(path))) as r:
        meta, batch = dict(r.schema.metadata), r.get_batch(0)
    new = change(batch)  # type: ignore[operator]
    if key is not None:
        meta[b"skewlens.columns"] = key
    path.unlink()
    with ipc.new_file(str(path), new.schema.with_metadata(meta)) as w:
        w.write_batch(new.replace_schema_metadata(meta))


def _with(batch: pa.RecordBatch, name: str, col: pa.Array) -> pa.RecordBatch:
    i = batch.schema.get_field_index(name)
    return batch.set_column(i, name, col)


def _kinds_of_seven(b: pa.RecordBatch) -> pa.RecordBatch:
    kinds = b.column("dep_kind")
    sevens = pa.array([7] * len(kinds.values), pa.int8())
    return _with(b, "dep_kind", pa.ListArray.from_arrays(kinds.offsets, sevens))


def _bad_name_index(b: pa.RecordBatch) -> pa.RecordBatch:
    names = b.column("name")
    idx = np.full(len(names), len(names.dictionary) + 5, dtype=np.int32)
    return _with(b, "name", pa.DictionaryArray.from_arrays(pa.array(idx), names.dictionary, safe=False))


TAMPERED = {
    "truncated": None,
    "dependency kinds of 7": _kinds_of_seven,
    "a name index past its dictionary": _bad_name_index,
    "a column of another type": lambda b: _with(b, "start_us", b.column("start_us").cast(pa.float64())),
    "a column the format lacks": lambda b: b.append_column("a:evil", pa.array([1] * b.num_rows, pa.int64())),
    "an unknown attribute's pair of columns": lambda b: b.append_column(
        "a:evil", pa.array([1] * b.num_rows, pa.int64())
    ).append_column("h:evil", pa.array([1] * b.num_rows, pa.uint8())),
    "flags that are not 0 or 1": lambda b: _with(b, "h:stream", pa.array([9] * b.num_rows, pa.uint8())),
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
