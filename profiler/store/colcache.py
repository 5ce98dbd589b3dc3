"""Decoded columns kept beside each trace file, so that a run is decoded once rather than on every load.

Decoding a ``.et`` file costs about 1.7 µs of CPU a node even vectorised (17 ms for 10,000 nodes; 17 s
for a run of 1,024 such ranks). The columns it yields are kept in
``DIR/.skewlens-cache/<file>.arrow``, an uncompressed Arrow IPC file that later loads map into memory
(about 2 ms for the same 10,000 nodes). Everything after the decode (the store's interpretation, its
checks, the matching of communication across ranks) runs as before, on the same columns.

A cache file is used only where it was written from the very bytes the ``.et`` holds now: it records the
trace's size, modification time and a CRC-32 of its first and last 64 KiB, and any difference (or a
cache file that is unreadable, of another format version, or inconsistent) makes the load decode the
``.et`` again and rewrite the cache. A cache file is never trusted further than the ``.et`` itself:
it is read by Arrow's IPC reader, validated in full (offsets, dictionary indices, UTF-8), its schema must
be exactly ours, and its row counts, strings and messages are bounded by the trace's size, so that it
cannot make the loader allocate more than the trace could.

The cache is written where the run's directory is writable (atomically: temp file, then rename; two
loads of one run may race, and either one's file is whole) and where its file system keeps 5% of its size
free after the file (:data:`MIN_FREE_SHARE`); elsewhere loads simply decode. A
``.skewlens-cache`` that is a symbolic link is neither read nor written: loading a run never writes
outside its directory. Set
``SKEWLENS_COLUMN_CACHE=off`` to neither read nor write it; deleting ``.skewlens-cache`` is always safe.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.bounded import open_regular
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.fast import INT_ATTRS, LIST_ATTRS, RawColumns
from skewlens.profiler.store.schema import arrow_file

CACHE_DIRNAME = ".skewlens-cache"
#: ``off`` (or ``0``, ``no``, ``false``) disables reading and writing the cache.
ENV_CACHE = "SKEWLENS_COLUMN_CACHE"
#: Bumped whenever the layout below or the decoder's output changes: older cache files are then ignored.
#: 2: skl_send_bytes / skl_recv_bytes (a version-1 file would lack them silently); 3: the split lists;
#: 4: skl_launched_in; 5: int32 / uint32 / bool varints and repeated values read as protobuf reads them
#: (b542942 changed that under format 4, so a format-4 file may hold what the earlier decoder read);
#: 6: skl_return_ns (a format-5 file of a trace that has it lacks it); 7: skl_dtype
FORMAT_VERSION = 7
#: The share of its file system a cache file must leave free once written (see :func:`write`).
MIN_FREE_SHARE = 0.05
_EDGE_BYTES = 64 * 1024
_KEY = b"skewlens.columns"
_GLOBAL = b"skewlens.global_metadata"

_DICT = pa.dictionary(pa.int32(), pa.string())
_FIXED: dict[str, pa.DataType] = {
    "node_id": pa.uint64(),
    "node_type": pa.int8(),
    "start_us": pa.int64(),
    "dur_us": pa.int64(),
    "msg_offset": pa.int64(),
    "name": _DICT,
    "pg_name": _DICT,
    "dtype": _DICT,
    "dep_id": pa.list_(pa.uint64()),
    "dep_kind": pa.list_(pa.int8()),
    "metadata_msg": pa.binary(),
}


def enabled() -> bool:
    """Whether loads read and write the cache (``SKEWLENS_COLUMN_CACHE``)."""
    return os.environ.get(ENV_CACHE, "on").strip().lower() not in ("off", "0", "no", "false")


def cache_path(trace: Path) -> Path:
    """Where the columns of ``trace`` are cached."""
    return trace.parent / CACHE_DIRNAME / f"{trace.name}.arrow"


def fingerprint(trace: Path) -> bytes | None:
    """What identifies the bytes of ``trace``: format version, size, modification time, CRC-32 of its
    first and last 64 KiB (which covers the whole of a file up to 128 KiB). None where the file cannot be
    read (the decoder then says why)."""
    try:
        with open_regular(trace) as fh:  # a FIFO's open blocked (the decoder then says what it is)
            st = os.fstat(fh.fileno())
            crc = zlib.crc32(fh.read(_EDGE_BYTES))
            if st.st_size > _EDGE_BYTES:
                fh.seek(max(_EDGE_BYTES, st.st_size - _EDGE_BYTES))
                crc = zlib.crc32(fh.read(_EDGE_BYTES), crc)
    except OSError:
        return None
    return f"{FORMAT_VERSION}:{st.st_size}:{st.st_mtime_ns}:{crc:08x}".encode()


def read(trace: Path, key: bytes) -> RawColumns | None:
    """The cached columns of ``trace`` if its cache file matches ``key`` (see :func:`fingerprint`) and
    is sound; else None."""
    path = cache_path(trace)
    if path.parent.is_symlink():  # not the run's own: see write
        return None
    try:
        open_regular(path).close()  # a FIFO's open blocked in memory_map: no cache, as an absent one
        reader = ipc.open_file(pa.memory_map(os.fsencode(path)))  # its own bytes: see arrow_file
        meta = reader.schema.metadata or {}
        if meta.get(_KEY) != key or reader.num_record_batches != 1:
            return None
        batch = reader.get_batch(0)
        batch.validate(full=True)
        return _columns(batch, meta, trace_bytes=int(key.split(b":")[1]))
    except (OSError, pa.ArrowException, ValueError, KeyError, IndexError, TypeError, MemoryError):
        return None  # absent, unreadable or inconsistent: the caller decodes the trace itself


def write(trace: Path, key: bytes, raw: RawColumns) -> bool:
    """Cache ``raw`` as the columns of ``trace`` (decoded from the bytes ``key`` names); False where the
    directory is not writable, where the file would leave its file system under :data:`MIN_FREE_SHARE`
    free, where the columns do not fit the cache's types (a node type the trace gives as 260 would read
    back as 4, a COMP node: such a trace, an error anyway, is decoded each time), and where
    ``.skewlens-cache`` is a symbolic link (a run from elsewhere may point it anywhere)."""
    if not (_fits_int8(raw.node_type) and _fits_int8(raw.dep_kind)):
        return False
    if cache_path(trace).parent.is_symlink():
        return False  # a run's .skewlens-cache linking elsewhere had analyze write rank-<r>.et.arrow there
    batch = _batch(raw).replace_schema_metadata({_KEY: key, _GLOBAL: raw.global_metadata})
    if not _room_for(trace.parent, batch.nbytes):
        return False
    try:
        with (
            atomic_file(cache_path(trace)) as tmp,
            arrow_file(tmp, "wb") as sink,
            ipc.new_file(sink, batch.schema) as w,
        ):
            w.write_batch(batch)
    except (OSError, SkewlensError):
        return False
    return True


def _room_for(run_dir: Path, nbytes: int) -> bool:
    """Whether the file system of ``run_dir`` keeps :data:`MIN_FREE_SHARE` of its size free (what an
    unprivileged user may use, as ``df`` counts it) once ``nbytes`` more are written there. A load of a
    128-rank run of 2.6 MB on a 3.5 MB file system wrote cache files until 20 KB were left, and what the
    run's owner wrote there next failed ``No space left on device``; a cache that may be deleted at any
    time does not take a disk's last space. True where the file system cannot be asked: the write finds
    out."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return True
    return (st.f_bavail * st.f_frsize - nbytes) >= st.f_blocks * st.f_frsize * MIN_FREE_SHARE


# ------------------------------------------------------------------------------------------ layout


def _fits_int8(a: np.ndarray) -> bool:
    return a.size == 0 or (int(a.min()) >= -128 and int(a.max()) <= 127)


def _batch(raw: RawColumns) -> pa.RecordBatch:
    n = raw.node_id.shape[0]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(raw.dep_node, minlength=n), out=offsets[1:])
    off = pa.array(offsets)
    meta: list[bytes | None] = [None] * n
    for row, msg in raw.metadata_msgs:
        meta[row] = msg
    cols: dict[str, pa.Array] = {
        "node_id": pa.array(raw.node_id, pa.uint64()),
        "node_type": pa.array(raw.node_type.astype(np.int8)),
        "start_us": pa.array(raw.start_us, pa.int64()),
        "dur_us": pa.array(raw.dur_us, pa.int64()),
        "msg_offset": pa.array(raw.msg_offset, pa.int64()),
        "name": raw.names.cast(_DICT),
        "pg_name": raw.pg_name.cast(_DICT),
        "dtype": raw.dtype.cast(_DICT),
        "dep_id": pa.ListArray.from_arrays(off, pa.array(raw.dep_id, pa.uint64())),
        "dep_kind": pa.ListArray.from_arrays(off, pa.array(raw.dep_kind)),
        "metadata_msg": pa.array(meta, pa.binary()),
    }
    for a in INT_ATTRS:
        has = raw.attr_has[a]
        if has.any():  # most attributes are absent from most traces: not stored
            cols[f"a:{a}"] = pa.array(raw.attr_val[a], pa.int64())
            cols[f"h:{a}"] = pa.array(has.astype(np.uint8))
    for a, (rows, vals) in raw.attr_lists.items():
        ptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(rows, minlength=n), out=ptr[1:])
        cols[f"l:{a}"] = pa.ListArray.from_arrays(pa.array(ptr), pa.array(vals, pa.int64()))
    return pa.RecordBatch.from_pydict(cols)


def _np(col: pa.Array) -> np.ndarray:
    if col.null_count:
        raise ValueError("unexpected nulls")
    return col.to_numpy(zero_copy_only=True)


def _value_bytes(values: pa.Array) -> int:
    """The bytes of a string or binary array's values (nulls: none)."""
    return int(pc.sum(pc.binary_length(values)).as_py() or 0)


def _columns(batch: pa.RecordBatch, meta: dict[bytes, bytes], *, trace_bytes: int) -> RawColumns:
    schema = batch.schema
    attrs = [a for a in INT_ATTRS if f"a:{a}" in schema.names]
    lists = [a for a in LIST_ATTRS if f"l:{a}" in schema.names]
    want = dict(_FIXED)
    for a in lists:
        want[f"l:{a}"] = pa.list_(pa.int64())
    for a in attrs:  # any other column (an unknown attribute's among them) fails the comparison below
        want[f"a:{a}"] = pa.int64()
        want[f"h:{a}"] = pa.uint8()
    if {f.name: f.type for f in schema} != want:
        raise ValueError("not this format's schema")
    n = batch.num_rows
    if n > trace_bytes // 2:  # each node takes at least 2 bytes of the trace (length prefix and one field)
        raise ValueError("more rows than the trace can hold")
    dep_id_l: pa.ListArray = batch.column("dep_id")
    dep_kind_l: pa.ListArray = batch.column("dep_kind")
    offsets = _np(dep_id_l.offsets)
    if dep_id_l.null_count or dep_kind_l.null_count or not np.array_equal(offsets, _np(dep_kind_l.offsets)):
        raise ValueError("dependency lists disagree")
    if offsets[0] != 0 or offsets[-1] > trace_bytes:  # each dependency takes at least a byte of the trace
        raise ValueError("more dependencies than the trace can hold")
    dep_kind = _np(dep_kind_l.values)[: offsets[-1]]
    if dep_kind.size and (dep_kind.min() < 0 or dep_kind.max() > 1):
        raise ValueError("dependency kind not 0 or 1")
    names = batch.column("name")
    if names.null_count:
        raise ValueError("node without a name")
    # the strings and messages are the trace's own bytes, each distinct string once: a forged cache of a
    # 7 KB trace naming a node with 600 MB (or 5 million names) was read, and export ran out of memory
    for c in ("name", "pg_name", "dtype"):
        values = batch.column(c).dictionary
        if len(values) > n or _value_bytes(values) > trace_bytes:
            raise ValueError(f"{c}: more distinct strings than the trace can hold")
    if _value_bytes(batch.column("metadata_msg")) + len(meta[_GLOBAL]) > trace_bytes:
        raise ValueError("metadata messages larger than the trace")
    zero = np.zeros(n, dtype=np.int64)
    none = np.zeros(n, dtype=np.bool_)
    attr_val = dict.fromkeys(INT_ATTRS, zero)
    attr_has = dict.fromkeys(INT_ATTRS, none)
    for a in attrs:
        has = _np(batch.column(f"h:{a}"))
        if has.size and has.max() > 1:
            raise ValueError(f"flag of {a} not 0 or 1")
        attr_val[a] = _np(batch.column(f"a:{a}"))
        attr_has[a] = has.view(np.bool_)
    attr_lists = {}
    for a in lists:
        col: pa.ListArray = batch.column(f"l:{a}")
        ptr = _np(col.offsets)
        if col.null_count or ptr[0] != 0 or ptr[-1] > trace_bytes:  # a value takes a byte of the trace
            raise ValueError(f"{a}: more values than the trace can hold")
        attr_lists[a] = (np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr)), _np(col.values)[: ptr[-1]])
    pg_name, dtype = batch.column("pg_name"), batch.column("dtype")
    attr_has["pg_name"] = pg_name.is_valid().to_numpy(zero_copy_only=False)
    attr_has["skl_dtype"] = dtype.is_valid().to_numpy(zero_copy_only=False)
    metadata = batch.column("metadata_msg")
    meta_rows = np.flatnonzero(metadata.is_valid().to_numpy(zero_copy_only=False))
    return RawColumns(
        node_id=_np(batch.column("node_id")),
        node_type=_np(batch.column("node_type")).astype(np.int64),
        start_us=_np(batch.column("start_us")),
        dur_us=_np(batch.column("dur_us")),
        names=names,
        msg_offset=_np(batch.column("msg_offset")),
        attr_val=attr_val,
        attr_has=attr_has,
        pg_name=pg_name,
        dtype=dtype,
        dep_node=np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets)),
        dep_id=_np(dep_id_l.values)[: offsets[-1]],
        dep_kind=dep_kind.astype(np.int8),
        metadata_msgs=[(int(r), metadata[int(r)].as_py()) for r in meta_rows.tolist()],
        global_metadata=meta[_GLOBAL],
        attr_lists=attr_lists,
    )
