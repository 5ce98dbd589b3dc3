"""Parquet schemas, derived in one place from frozen record dataclasses, plus atomic table writing.

Every table skewlens writes (the store's ``nodes``/``deps``/``model``/``collectives``/``p2p``/``ranks``,
replay's ``timeline``/``summary``, the analyses' outputs) is described by one record dataclass;
:func:`arrow_schema` turns it into an Arrow schema (string columns dictionary-encoded, field docstrings as
field metadata) and :func:`write_table` writes it atomically with ``skewlens.schema_version`` and the table
name in the file metadata. :func:`read_table` checks both back. How a column is laid out in the file (its
encoding, its statistics) is decided by :func:`parquet_options`, for every writer alike.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import os
import textwrap
import threading
import typing
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.errors import SkewlensError

if TYPE_CHECKING:
    from skewlens.profiler.manifest import Manifest

#: Bumped on any change to a table written by skewlens (2: ``p2p.pair``; 3: ``p2p.recv_bytes``,
#: ``step_breakdown.gpu_compute_ns``, and ``source_rank`` in replay's ``summary`` and ``timeline``; 4:
#: replay's ``summary.exposed_comm_ns`` is ``exposed_wait_ns`` and ``exposed_transfer_ns``, the breakdown's;
#: 5: ``nodes.send_splits_bytes`` and ``nodes.recv_splits_bytes``; 6: the analyses' ``gpu_idle`` and
#: ``gpu_kernels`` tables, ``step_breakdown.gpu_comm_ns`` and ``gpu_comm_overlap_ns``, and replay's
#: ``summary.gpu_*``; 7: ``gpu_idle.queued_idle_ns``; 8: ``nodes.launch_ns`` and ``nodes.launched_in``; 9:
#: ``step_breakdown.gpu_busy_ns`` and the export's ``model`` table, which no older export has; 10:
#: ``nodes.return_ns``; 11: ``collective_skew.comm_bytes``; 12: ``nodes.dtype``, ``timeline.dtype`` and
#: ``collectives.dtype``; 13: ``p2p.step``, the export's ``groups`` table, which no older export has, and
#: the analyses' and replay's files name the run they were made from in their key-value metadata,
#: :func:`provenance_metadata`; 14: ``ranks.gpu``; 15: replay's ``sweep.mean_exposed_transfer_ns`` and
#: ``mean_exposed_wait_ns``, and a column per swept setting after ``sweep``'s own, which no table lists;
#: 16: ``step_breakdown.complete`` is false of every step of a run a rank of which has no trace, no column
#: added; 17: the export's tables name their run as the analyses' and replay's files do, every such file
#: carries :data:`META_STARTED` where the manifest records the capture's start, and :data:`META_RUN_ID` is
#: left out where it is torchrun's ``none``, no column added).
SCHEMA_VERSION = "17"
#: The oldest version :func:`read_table` reads: every change since only added nullable columns
#: (:data:`ADDED_IN`), which a file of an older version reads as null.
OLDEST_READABLE = 4
#: Columns added by each version since :data:`OLDEST_READABLE`, per table (all nullable).
ADDED_IN: dict[int, dict[str, tuple[str, ...]]] = {
    5: {
        "nodes": ("send_splits_bytes", "recv_splits_bytes"),
        "timeline": ("send_splits_bytes", "recv_splits_bytes"),
    },
    6: {
        "step_breakdown": ("gpu_comm_ns", "gpu_comm_overlap_ns"),
        "summary": (
            "gpu_stream",
            "gpu_busy_ns",
            "gpu_idle_ns",
            "gpu_launch_wait_ns",
            "gpu_comm_wait_ns",
            "gpu_stream_wait_ns",
            "gpu_other_ns",
        ),
    },
    7: {"gpu_idle": ("queued_idle_ns",)},
    8: {"nodes": ("launch_ns", "launched_in"), "timeline": ("launch_ns", "launched_in")},
    9: {"step_breakdown": ("gpu_busy_ns",)},
    10: {"nodes": ("return_ns",), "timeline": ("return_ns",)},
    11: {"collective_skew": ("comm_bytes",)},
    12: {"nodes": ("dtype",), "timeline": ("dtype",), "collectives": ("dtype",)},
    13: {"p2p": ("step",)},
    14: {"ranks": ("gpu",)},
    15: {"sweep": ("mean_exposed_transfer_ns", "mean_exposed_wait_ns")},
}
META_VERSION = b"skewlens.schema_version"
META_TABLE = b"skewlens.table"
#: Key-value metadata of the export's, the analyses' and the replay's files (:func:`provenance_metadata`;
#: the analyses' and replay's from version 13, the export's and :data:`META_STARTED` from 17): the run they
#: were made from, its absolute path; its torchrun job id (the manifest's ``run_identity.run_id``, only
#: where the manifest records one other than torchrun's ``none``); when its capture began.
META_SOURCE = b"skewlens.source"
META_RUN_ID = b"skewlens.run_id"
META_STARTED = b"skewlens.started_ns"
#: torchrun's ``TORCHELASTIC_RUN_ID`` of every job given no id of its own: it names no run.
NO_RUN_ID = "none"

_ARROW_OF: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    str: pa.dictionary(pa.int32(), pa.string()),
    list[int]: pa.list_(pa.int64()),
}


#: One thread at a time parses source: two threads parsing at once corrupt the AST constructor's recursion
#: count on CPython 3.11.7 ("SystemError: AST constructor recursion depth mismatch", CPython gh-106905), and
#: ``write_tables`` builds its tables' schemas on several threads (with the gpu_idle table, 3 of 4 runs of
#: tests/test_gpu_idle.py failed so; none of 6 with the lock).
_PARSING = threading.Lock()


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass, its bases' included (``name -> doc``)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    try:
        with _PARSING:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return docs
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for a, b in itertools.pairwise(body):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


@cache
def arrow_schema(cls: type) -> pa.Schema:
    """Arrow schema of a record dataclass: int -> int64, float -> float64, bool, str -> dictionary,
    list[int] -> list<int64>; ``X | None`` nullable."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        nullable = False
        args = typing.get_args(t)
        if args and type(None) in args:
            nullable = True
            t = next(a for a in args if a is not type(None))
        if t not in _ARROW_OF:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported column type {t!r}")
        meta = {"doc": docs[f.name]} if f.name in docs else None
        fields.append(pa.field(f.name, _ARROW_OF[t], nullable=nullable, metadata=meta))
    return pa.schema(fields)


def columns_markdown(heading: str, cls: type, *, partition_key: str | None = None) -> str:
    """A table's section of the docs' column lists, from its record dataclass: a ``###`` heading, the class
    docstring, and a row per column (name, type, field docstring); ``partition_key`` is noted as read from
    the directory name."""
    parts = [f"### {heading}\n\n{' '.join((cls.__doc__ or '').split())}\n"]
    parts.append("| column | type | description |\n| --- | --- | --- |")
    docs = field_docs(cls)
    for f in arrow_schema(cls):
        if pa.types.is_dictionary(f.type):
            kind = "string (dictionary)"
        elif pa.types.is_list(f.type):
            kind = f"list<{f.type.value_type}>"
        else:
            kind = str(f.type)
        if f.nullable:
            kind += ", nullable"
        note = " Partition key (from the directory name)." if f.name == partition_key else ""
        parts.append(f"| `{f.name}` | {kind} | {docs.get(f.name, '')}{note} |")
    parts.append("")
    return "\n".join(parts)


def files_markdown(record_of: Mapping[str, type], command: str) -> str:
    """The column tables of ``command``'s output files in the docs (:func:`columns_markdown`), ``record_of``
    their record dataclasses by file name, in the order listed."""
    return "\n".join(columns_markdown(f"`{name}` (`{command}`)", cls) for name, cls in record_of.items())


def table_from_columns(cls: type, columns: Mapping[str, Any], table: str) -> pa.Table:
    """Build a table from column arrays/lists (names and types per ``cls``)."""
    schema = arrow_schema(cls)
    arrays = []
    for f in schema:
        col = columns[f.name]
        if pa.types.is_dictionary(f.type):
            arr = col if isinstance(col, pa.Array) else pa.array(col, type=pa.string())
            arrays.append(arr.dictionary_encode() if not pa.types.is_dictionary(arr.type) else arr)
        else:
            arrays.append(pa.array(col, type=f.type))
    meta = {META_VERSION: SCHEMA_VERSION.encode(), META_TABLE: table.encode()}
    return pa.Table.from_arrays(arrays, schema=schema.with_metadata(meta))


def table_from_records(cls: type, records: Iterable[Any], table: str) -> pa.Table:
    """Build a table from record instances (fine for up to ~1e6 rows; use columns beyond that)."""
    rows = list(records)
    cols = {f.name: [getattr(r, f.name) for r in rows] for f in dataclasses.fields(cls)}
    return table_from_columns(cls, cols, table)


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How every skewlens table is laid out in Parquet (the keyword arguments of ``pq.ParquetWriter`` and
    ``pq.write_table``), by column type:

    - string (dictionary-typed) columns: dictionary pages, no min/max statistics (string statistics cost
      ~15% of a write and prune nothing a query on a rank, step or time range needs);
    - integer columns: ``DELTA_BINARY_PACKED`` (times, ids, ranks and steps change by small steps from row
      to row) with min/max statistics;
    - integer list columns (an all_to_all's splits): their values ``DELTA_BINARY_PACKED``, no statistics
      (the min/max of a row group's splits prunes nothing a query asks for);
    - all pages compressed with zstd.

    On the 32-rank GPU run's ``timeline.parquet`` (2 M rows) this writes in 0.34 s of CPU instead of 0.59,
    27 MB become 17 MB, and DuckDB and pyarrow read it 2.5x as fast as with plain pages and statistics on
    every column (``docs/benchmarks.md``). Every reader skewlens names reads these encodings: pyarrow,
    DuckDB, pandas, Polars, Spark 3.3+.
    """
    strings = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    ints = {f.name: "DELTA_BINARY_PACKED" for f in schema if pa.types.is_integer(f.type)}
    lists = [f.name for f in schema if pa.types.is_list(f.type)]
    # a list's values are the leaf column ``<name>.list.element`` (Parquet's three-level list layout)
    ints.update({f"{f.name}.list.element": "DELTA_BINARY_PACKED" for f in schema if _is_int_list(f.type)})
    return {
        "compression": "zstd",
        "use_dictionary": strings or False,
        "column_encoding": ints or None,
        "write_statistics": [f.name for f in schema if f.name not in strings and f.name not in lists]
        or False,
    }


def _is_int_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) and pa.types.is_integer(t.value_type)


def arrow_file(path: str | Path, mode: str = "rb") -> pa.NativeFile:
    """``path`` opened by Arrow under its own bytes (``os.fsencode``): a ``str`` path Arrow encodes as UTF-8,
    which is another name, or none, where Python does not decode file names as UTF-8 (``LC_ALL=C
    PYTHONUTF8=0``: a run or an output in a directory named ``résumé`` was a UnicodeEncodeError traceback,
    'surrogates not allowed')."""
    return pa.OSFile(os.fsencode(path), mode)


def provenance_metadata(run_dir: str | Path, manifest: Manifest) -> dict[bytes, bytes]:
    """The key-value metadata that names the run a file was made from (the export's, the analyses' and the
    replay's files): :data:`META_SOURCE`, the run's absolute path (as the export's ``run.json`` gives its
    ``source``); :data:`META_RUN_ID`, its torchrun job id, only where its manifest records one and it is not
    torchrun's ``none`` (the id of every job given none of its own, which would match every other such
    run); :data:`META_STARTED`, when its capture began (the manifest's ``run_identity.started_ns``, wall
    clock ns since the epoch), only where the manifest records it: what tells apart two captures into
    the same path."""
    meta = {META_SOURCE: os.fsencode(Path(run_dir).resolve())}
    identity = manifest.run_identity
    if identity is not None and identity.run_id and identity.run_id != NO_RUN_ID:
        meta[META_RUN_ID] = identity.run_id.encode()
    if identity is not None and identity.started_ns > 0:
        meta[META_STARTED] = str(identity.started_ns).encode()
    return meta


def with_metadata(tbl: pa.Table, extra: Mapping[bytes, bytes]) -> pa.Table:
    """``tbl`` with ``extra`` added to its schema's key-value metadata."""
    return tbl.replace_schema_metadata({**(tbl.schema.metadata or {}), **extra}) if extra else tbl


def write_table(tbl: pa.Table, path: str | Path, *, row_group_size: int | None = None) -> Path:
    """Write one Parquet file atomically (temp file in the same directory, then rename), laid out by
    :func:`parquet_options`."""
    p = Path(path)
    with atomic_file(p) as tmp, arrow_file(tmp, "wb") as sink:
        pq.write_table(tbl, sink, row_group_size=row_group_size, **parquet_options(tbl.schema))
    return p


def write_records(cls: type, records: Iterable[Any], path: str | Path, table: str) -> Path:
    """Derive the table from records and write it atomically."""
    return write_table(table_from_records(cls, records, table), path)


def read_table(path: str | Path, cls: type | None = None, columns: Sequence[str] | None = None) -> pa.Table:
    """Read a skewlens Parquet file, checking the schema version (and the columns of ``cls``).

    A file of a version from :data:`OLDEST_READABLE` on reads as the current one: with ``cls`` or
    ``columns``, a column added since its version (:data:`ADDED_IN`) is null in every row."""
    p = Path(path)
    try:
        with arrow_file(p) as source:
            file_schema = pq.read_schema(source)
            added = added_since(p, file_schema.metadata or {})
            present = [c for c in columns if c not in added] if columns else None
            tbl = pq.read_table(source, columns=present)
    except (OSError, pa.ArrowInvalid) as e:
        raise SkewlensError(f"{p}: cannot read Parquet: {e}") from None
    if added and (cls is not None or columns):
        fields = {f.name: f for f in arrow_schema(cls)} if cls is not None else {}
        for name in added:
            if name not in tbl.column_names and (columns is None or name in columns) and name in fields:
                tbl = tbl.append_column(fields[name], pa.nulls(tbl.num_rows, type=fields[name].type))
        if columns:
            tbl = tbl.select([c for c in columns if c in tbl.column_names])
    if cls is not None and columns is None:
        missing = set(arrow_schema(cls).names) - set(tbl.column_names)
        if missing:
            raise SkewlensError(f"{p}: missing columns {sorted(missing)}")
    return tbl


#: The command that writes each table, for a file this skewlens cannot read: an export's tables, the
#: replay's; every other table skewlens writes is an analysis's.
_EXPORT_TABLES = ("nodes", "deps", "model", "collectives", "p2p", "ranks", "groups")
_REPLAY_TABLES = ("timeline", "summary")


def _remake(table: str) -> str:
    """What to do with a file of a version this skewlens cannot read: write it again from its run."""
    if table in _EXPORT_TABLES:
        how = "skewlens export RUN --out DIR"
    elif table in _REPLAY_TABLES:
        how = "skewlens replay trace=RUN out=DIR"
    elif table == "sweep":
        how = "skewlens replay -m trace=RUN out=DIR ..."
    elif table:
        how = "skewlens analyze RUN --out DIR"
    else:
        return "not a file this skewlens wrote, or written by an older one; write it again from its run"
    return f"written by an older skewlens; write it again from its run with this one: {how}"


def added_since(p: Path, meta: Mapping[bytes, bytes]) -> tuple[str, ...]:
    """The columns of ``p``'s table added since the version it was written with; refused unless that version
    is one this skewlens reads."""
    found = meta.get(META_VERSION)
    text = found.decode(errors="replace") if found else "missing"
    table = meta.get(META_TABLE, b"").decode(errors="replace")
    if not text.isdecimal() or not OLDEST_READABLE <= int(text) <= int(SCHEMA_VERSION):
        newer = text.isdecimal() and int(text) > int(SCHEMA_VERSION)
        raise SkewlensError(
            f"{p}: schema version {text} (this skewlens reads {OLDEST_READABLE} to {SCHEMA_VERSION}): "
            + ("written by a newer skewlens; read it with that one, or upgrade" if newer else _remake(table))
        )
    return tuple(
        c for v in range(int(text) + 1, int(SCHEMA_VERSION) + 1) for c in ADDED_IN.get(v, {}).get(table, ())
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NodeRecord:
    """One row of the ``nodes`` table: a node of one rank's trace."""

    rank: int
    """Global rank."""
    node_id: int
    """Chakra node id (unique within the rank)."""
    name: str
    """Operator, kernel or collective name."""
    type: str
    """Chakra node type name (COMP, COMM_COLL, COMM_SEND, COMM_RECV, METADATA, ...)."""
    start_ns: int
    """Start on the aligned clock, ns (where the trace records no start time on any node, as Chakra's
    generator and text2chakra write it: the nodes laid end to end in file order by the loader)."""
    dur_ns: int
    """Duration, ns."""
    stream: int
    """Thread id or CUDA stream."""
    step: int
    """Training step (-1 unknown)."""
    is_cpu_op: bool
    """Host op (True) or GPU kernel (False)."""
    comm_type: str | None
    """Collective type name (ALL_REDUCE, ...) for COMM_COLL nodes."""
    comm_bytes: int
    """Bytes of this rank's call as recorded (Chakra's ``comm_size``: the call's input, so an all_to_all's
    counts the chunk the rank keeps for itself and an all_gather's is its shard; not what crossed the
    network); 0 for compute."""
    pg_name: str | None
    """Process group name."""
    seq: int
    """Per-group sequence number (-1 none)."""
    src: int
    """Sender's global rank for send/recv (-1 none)."""
    dst: int
    """Receiver's global rank for send/recv (-1 none)."""
    tag: int
    """p2p tag."""
    send_splits_bytes: list[int] | None
    """An all_to_all's recorded splits: the bytes this rank sent to each member of its group, in group-rank
    order, its own chunk included (``skl_send_splits``). Null where none was recorded: even splits, which
    send ``comm_bytes / group size`` to each member, and every other node (also an all_to_all whose lists
    are inconsistent, in an export with ``--allow-errors``)."""
    recv_splits_bytes: list[int] | None
    """The bytes this rank received from each member of its group, in group-rank order, its own chunk
    included (``skl_recv_splits``); null where ``send_splits_bytes`` is."""
    launch_ns: int | None
    """GPU node: start of the runtime call that launched it (``cudaLaunchKernel``, ``cudaMemcpyAsync``;
    ``skl_launch_ns``) on the aligned clock; null for host nodes and where the launch is unknown."""
    launched_in: int | None
    """GPU node: ``node_id`` of the host node that launched it and then synchronised on it (``.item()``'s
    copy; ``skl_launched_in``), which is not in ``deps`` (with that synchronisation, a cycle); null
    elsewhere."""
    return_ns: int | None
    """Asynchronous communication node: when the call that issued it returned (``skl_return_ns``) on the
    aligned clock; the op did not complete before. Null for other nodes and where not recorded."""
    dtype: str | None
    """Communication node: the torch dtype of its tensor (``skl_dtype``: ``float32``, ``bfloat16``), the
    element ``comm_bytes`` counts; null for other nodes and where not recorded."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DepRecord:
    """One row of the ``deps`` table: ``dst`` depends on ``src`` within one rank."""

    rank: int
    """Global rank."""
    src: int
    """Node id that must finish first."""
    dst: int
    """Node id that depends on it."""
    kind: str
    """``ctrl`` (program / stream order) or ``data`` (tensor dependency)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelRecord:
    """One row of the ``model`` table: the execution model's reading of a node of one rank's trace
    (``skewlens.replay.execution``, as ``skewlens analyze`` reads it), which the node's name and type alone
    do not say."""

    rank: int
    """Global rank."""
    node_id: int
    """Chakra node id (the ``nodes`` row it reads)."""
    end_ns: int
    """The node's end as the model takes it: its recorded end (``start_ns + dur_ns``), but that of an
    asynchronous collective whose completion was recorded after the host time that waited for it had ended
    (gloo's worker lags the completion) is that host time's end."""
    compute_ns: int
    """How much of the node is the program's compute: the last ``compute_ns`` before ``end_ns``. A compute
    node's whole duration, but a ``compute`` gap node that hid a wait (DDP's, at the ``collectives``
    level) only its work after the wait; 0 for communication, for waits (``wait_tensor``, ``Work.wait``,
    and a host op that synchronised on the GPU: the outermost op around the call), for untraced host time
    and for NCCL kernels kept as COMP."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveRecord:
    """One row of the ``collectives`` table: one member of one collective instance."""

    pg_name: str
    """Process group name."""
    seq: int
    """Per-group sequence number; (pg_name, seq) identifies the instance."""
    comm_type: str
    """The member's collective type name. Members of one instance differ only in an export with
    ``--allow-errors`` of a run whose members disagree: each row has what its own rank called."""
    rank: int
    """Member's global rank."""
    node_id: int
    """The member's node id."""
    comm_bytes: int
    """Bytes of the member's call as recorded (the node's ``comm_bytes``: its input, an all_to_all's own
    chunk included)."""
    step: int
    """Training step (-1 unknown)."""
    start_ns: int
    """Member's arrival (call start), aligned ns."""
    end_ns: int
    """Member's completion, aligned ns."""
    group_size: int
    """Number of members of the group, those without a trace included (an export with ``--allow-errors`` of
    a run with a rank missing has fewer rows of the instance)."""
    dtype: str | None
    """The member's tensor dtype (``skl_dtype``: ``bfloat16`` where a mixed-precision run communicates
    in it), null where not recorded."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class P2PRecord:
    """One row of the ``p2p`` table: a send matched with its recv."""

    pair: int
    """The pair's number: its index in the run's matched send/recv pairs (ordered by sender, receiver, process
    group, tag, then the k-th send with the k-th recv); ``collective_skew`` gives it as the ``seq`` of p2p
    rows."""
    pg_name: str | None
    """Process group name."""
    src_rank: int
    """Sender."""
    dst_rank: int
    """Receiver."""
    tag: int
    """Tag."""
    step: int
    """Training step of the send (its node's ``nodes.step``; -1 unknown). The recv may be in another step
    (``nodes.step`` of ``recv_node_id`` on ``dst_rank``). Null in files written before schema 13."""
    comm_bytes: int
    """Message size in bytes: the send's."""
    recv_bytes: int
    """Bytes the recv expects: ``comm_bytes``, but in an export with ``--allow-errors`` of a pair whose sizes
    differ, the receiver's own."""
    send_node_id: int
    """Send node id on the sender."""
    recv_node_id: int
    """Recv node id on the receiver."""
    send_start_ns: int
    """Send call start, aligned ns."""
    send_end_ns: int
    """Send completion, aligned ns."""
    recv_start_ns: int
    """Recv call start, aligned ns."""
    recv_end_ns: int
    """Recv completion, aligned ns."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GroupRecord:
    """One row of the ``groups`` table: a process group of the run (the manifest's, then those only the
    traces name), in the store's order of the groups."""

    pg_name: str
    """Process group name, as ``pg_name`` of the other tables gives it."""
    pg_desc: str
    """The group's description (``default_pg``, ``tp``, a ``group_desc`` of the program's; torch's
    ``undefined`` for a group the program gave none; '' where none was recorded)."""
    ranks: list[int] | None
    """The members' global ranks in group-rank order (the ``i``-th is group rank ``i``, as an all_to_all's
    split lists count); null where the run names the group but records no members."""
    backend: str
    """Backend (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``; '' where not recorded)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankRecord:
    """One row of the ``ranks`` table: per-rank metadata."""

    rank: int
    """Global rank."""
    host: str
    """Host name."""
    device: str
    """Device (cpu, cuda:0, ...)."""
    gpu: str | None
    """The rank's GPU, the manifest's ``gpus``: model, SMs and memory, as an imported trace's
    ``deviceProperties`` or ``skewlens profile``'s CUDA device gave them (``NVIDIA A100-SXM4-80GB (108 SMs,
    80.0 GiB)``; the ranks on A100s: ``gpu LIKE '%A100%'``). Null where the run says none: a CPU rank, a trace
    without ``deviceProperties``, a run captured before it was recorded, a file written before schema 14."""
    clock_offset_ns: int
    """Offset applied to this rank's clock to align it with rank 0."""
    num_nodes: int
    """Nodes in the rank's trace."""
    trace_file: str
    """The rank's .et file, its absolute path."""
