"""Export a run to Parquet: ``nodes``/``deps``/``model`` partitioned by rank, plus ``collectives``, ``p2p``,
``ranks``.

Layout of ``OUT_DIR`` (schemas: the record dataclasses in :mod:`skewlens.profiler.store.schema`; see
docs/parquet.md)::

    nodes/rank=<r>/part-0.parquet     one row per node of rank r (the rank is the partition key)
    deps/rank=<r>/part-0.parquet      one row per dependency edge of rank r
    model/rank=<r>/part-0.parquet     one row per node of rank r: the execution model's reading of it
    collectives.parquet               one row per member per collective instance
    p2p.parquet                       one row per matched send/recv pair
    ranks.parquet                     one row per rank
    groups.parquet                    one row per process group
    run.json, manifest.json           provenance: what was exported, from where, by which version

Every table's key-value metadata also names the run
(:func:`~skewlens.profiler.store.schema.provenance_metadata`, as the analyses' and the replay's files do),
so a file read away from ``run.json`` still says which run it is of.

The run is converted rank by rank (one worker process per rank file, ``workers`` at a time), each worker
streaming its rank's tables to disk and handing back only its communication rows, so memory stays
bounded by a few ranks whatever the size of the run. The ``model`` table is the replay layer's (the store
has no execution model): the caller passes its columns (``model``), which need the whole run loaded.
Everything is written into a temporary directory
beside ``OUT_DIR`` and renamed into place at the end.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.dataset as ds

from skewlens.profiler.atomic import check_replaceable, export_marker, no_temp_dir, replace_dir, staging_dir
from skewlens.profiler.errors import SkewlensError, TraceFormatError
from skewlens.profiler.manifest import MANIFEST_NAME, ProcessGroupInfo, with_world_ranks
from skewlens.profiler.store.issues import Issue, IssueLog, Severity, path_word
from skewlens.profiler.store.load import (
    PARQUET_EXPORT_FILE,
    PARQUET_EXPORT_FORMAT,
    RunFiles,
    assign_defaults,
    captured_steps,
    load_rank,
    locate_run,
    missing_rank_issues,
)
from skewlens.profiler.store.match import (
    CommRows,
    comm_type_name,
    match_instances,
    match_pairs,
    matchable,
    step_mark_stream,
)
from skewlens.profiler.store.model import CollectiveInstance, P2PPair, RankTrace
from skewlens.profiler.store.schema import (
    META_TABLE,
    META_VERSION,
    SCHEMA_VERSION,
    CollectiveRecord,
    DepRecord,
    GroupRecord,
    ModelRecord,
    NodeRecord,
    P2PRecord,
    RankRecord,
    added_since,
    arrow_schema,
    columns_markdown,
    provenance_metadata,
    table_from_columns,
    with_metadata,
    write_table,
)
from skewlens.profiler.store.validate import find_cycle, refusal
from skewlens.profiler.threads import POOL_DIED, process_pool, usable_cores
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.progress import NO_PROGRESS, Progress, given

#: Tables partitioned by rank (hive style, ``<table>/rank=<r>/part-0.parquet``).
PARTITIONED = ("nodes", "deps", "model")
#: Tables written as one file each (``<table>.parquet``).
SINGLE = ("collectives", "p2p", "ranks", "groups")
RECORD_OF: dict[str, type] = {
    "nodes": NodeRecord,
    "deps": DepRecord,
    "model": ModelRecord,
    "collectives": CollectiveRecord,
    "p2p": P2PRecord,
    "ranks": RankRecord,
    "groups": GroupRecord,
}
#: The schema version that first wrote each table that older exports lack.
FIRST_IN = {"model": 9, "groups": 13}
PART_FILE = "part-0.parquet"
#: The ``model`` table's columns per rank (``ModelRecord``'s but ``rank``), which the replay layer derives
#: (``skewlens.replay.execution.model_columns`` of the loaded run); called once the store's tables are
#: written.
ModelColumns = Callable[[], Iterable[tuple[int, Mapping[str, np.ndarray]]]]
ROW_GROUP = 1 << 20

_TYPE_NAMES = [t.name for t in NodeType]
_MAX_LIST_VALUES = (1 << 31) - 1
_COMM_NAMES = [t.name for t in CommType]


def partition_path(out_dir: str | Path, table: str, rank: int) -> Path:
    """File of one rank's partition of a partitioned table."""
    return Path(out_dir) / table / f"rank={rank}" / PART_FILE


def open_dataset(out_dir: str | Path, table: str) -> ds.Dataset:
    """A ``pyarrow.dataset`` over one exported table (``rank`` comes from the partition path)."""
    import pyarrow.dataset as ds  # (imports pandas: 0.5 s, paid only by the readers)

    base = Path(out_dir)
    if table not in PARTITIONED + SINGLE:
        raise SkewlensError(f"unknown table {table!r} (known: {', '.join(PARTITIONED + SINGLE)})")
    path = base / table if table in PARTITIONED else base / f"{table}.parquet"
    if not path.exists():
        # an export without it: the model table is left out by --no-model, and by exports before version 9;
        # the groups table by exports before version 13
        without = _missing_table_hint(base, table) if table in FIRST_IN else ""
        raise SkewlensError(f"{base}: no {table} table: {path.name} is missing{without}")
    part = ds.partitioning(pa.schema([("rank", pa.int64())]), flavor="hive") if table in PARTITIONED else None
    dataset = ds.dataset(path, format="parquet", partitioning=part)
    if not dataset.files:
        return dataset
    # the version checked as read_table checks it; an older export's columns added since read as null
    if added_since(Path(dataset.files[0]), dataset.schema.metadata or {}):
        schema = arrow_schema(RECORD_OF[table]).with_metadata(dataset.schema.metadata)
        return ds.dataset(path, format="parquet", partitioning=part, schema=schema)
    return dataset


def _missing_table_hint(base: Path, table: str) -> str:
    """Why an export lacks ``table`` (its model table, or one an older skewlens did not write), and what to
    do: export the run again (the run ``run.json`` names as its source)."""
    prov = export_marker(base, PARQUET_EXPORT_FILE, PARQUET_EXPORT_FORMAT) or {}
    version, source = prov.get("schema_version"), prov.get("source")
    this = f"; this export is version {version}" if isinstance(version, str) else ""
    run = path_word(source) if isinstance(source, str) else "RUN"
    how = "exported with --no-model, or " if table == "model" else ""
    return (
        f" ({how}by a skewlens before schema version {FIRST_IN[table]}{this}); "
        f"export the run again for it: skewlens export {run} --out {path_word(base)}"
    )


def _partition_table(cls: type, columns: dict[str, Any], table: str) -> pa.Table:
    """A table of ``cls``'s schema without the ``rank`` column (the partition key carries it)."""
    schema = arrow_schema(cls)
    schema = schema.remove(schema.get_field_index("rank"))
    arrays = [columns[f.name] for f in schema]
    meta = {META_VERSION: SCHEMA_VERSION.encode(), META_TABLE: table.encode()}
    return pa.Table.from_arrays(arrays, schema=schema.with_metadata(meta))


def _dict(indices: np.ndarray, dictionary: list[str], valid: np.ndarray | None = None) -> pa.Array:
    mask = None if valid is None else ~np.asarray(valid, dtype=np.bool_)
    idx = pa.array(indices.astype(np.int32), type=pa.int32(), mask=mask)
    return pa.DictionaryArray.from_arrays(idx, pa.array(dictionary, type=pa.string()))


def nodes_table(ranks: RankTrace | Sequence[RankTrace], pg_names: list[str]) -> pa.Table:
    """The ``nodes`` partition of one rank, or the rows of several ranks one after another (their node
    names in one dictionary): many small ranks then cost one table, not one each."""
    rts = [ranks] if isinstance(ranks, RankTrace) else list(ranks)

    def cat(column: Callable[[RankTrace], np.ndarray]) -> np.ndarray:
        return column(rts[0]) if len(rts) == 1 else np.concatenate([column(rt) for rt in rts])

    names, name_idx = _merged(rts, lambda rt: (rt.names, rt.name_idx))
    dtypes, dtype_idx = _merged(rts, lambda rt: (rt.dtypes, _or_none(rt, rt.dtype_idx)))
    comm_type = cat(lambda rt: rt.comm_type)
    pg = cat(lambda rt: rt.pg)
    comm_valid = (comm_type >= 0) & (comm_type < len(_COMM_NAMES))
    cols = {
        "node_id": pa.array(cat(lambda rt: rt.node_id)),
        "name": _dict(name_idx, names),
        "type": _dict(cat(lambda rt: rt.node_type), _TYPE_NAMES),
        "start_ns": pa.array(cat(lambda rt: rt.start_ns)),
        "dur_ns": pa.array(cat(lambda rt: rt.dur_ns)),
        "stream": pa.array(cat(lambda rt: rt.stream)),
        "step": pa.array(cat(lambda rt: rt.step).astype(np.int64)),
        "is_cpu_op": pa.array(cat(lambda rt: rt.is_cpu)),
        "comm_type": _dict(np.where(comm_valid, comm_type, 0), _COMM_NAMES, comm_valid),
        "comm_bytes": pa.array(cat(lambda rt: rt.comm_bytes)),
        "pg_name": _dict(np.maximum(pg, 0), pg_names or [""], pg >= 0),
        "seq": pa.array(cat(lambda rt: rt.seq)),
        "src": pa.array(cat(lambda rt: rt.src).astype(np.int64)),
        "dst": pa.array(cat(lambda rt: rt.dst).astype(np.int64)),
        "tag": pa.array(cat(lambda rt: rt.tag)),
        "send_splits_bytes": _splits_column(rts, lambda rt: rt.split_send_bytes),
        "recv_splits_bytes": _splits_column(rts, lambda rt: rt.split_recv_bytes),
        "launch_ns": _nullable(cat(lambda rt: _or_none(rt, rt.launch_ns))),
        "launched_in": _nullable(cat(_launched_in_ids)),
        "return_ns": _nullable(cat(lambda rt: _or_none(rt, rt.return_ns))),
        "dtype": _dict(np.maximum(dtype_idx, 0), dtypes or [""], dtype_idx >= 0),
    }
    return _partition_table(NodeRecord, cols, "nodes")


def _or_none(rt: RankTrace, col: np.ndarray | None) -> np.ndarray:
    """An optional per-row column of ``rt``, -1 in every row where the trace has none."""
    return col if col is not None else np.full(len(rt), -1, dtype=np.int64)


def _launched_in_ids(rt: RankTrace) -> np.ndarray:
    """Per row, the node id of the host node it was launched in (``RankTrace.launched_in``), else -1."""
    rows = _or_none(rt, rt.launched_in)
    return np.where(rows >= 0, rt.node_id[np.maximum(rows, 0)].astype(np.int64), -1)


def _nullable(values: np.ndarray) -> pa.Array:
    """An int64 column, null where ``values`` is negative (none recorded)."""
    return pa.array(values.astype(np.int64, copy=False), type=pa.int64(), mask=values < 0)


def _splits_column(rts: list[RankTrace], values: Callable[[RankTrace], np.ndarray | None]) -> pa.Array:
    """One list<int64> per node: its recorded splits (``split_ptr`` rows of ``values``), null for a node
    without (a rank's every node, where its trace records none)."""
    parts = []
    for rt in rts:
        vals = values(rt)
        if rt.split_ptr is None or vals is None:
            parts.append(pa.nulls(len(rt), type=pa.list_(pa.int64())))
            continue
        ptr = rt.split_ptr
        if int(ptr[-1]) > _MAX_LIST_VALUES:  # list<int64> has 32-bit offsets
            raise SkewlensError(
                f"{rt.path}: rank {rt.rank}: {int(ptr[-1])} all_to_all split sizes, more than one Parquet "
                f"list column of a rank holds ({_MAX_LIST_VALUES})"
            )
        parts.append(
            pa.ListArray.from_arrays(
                pa.array(ptr.astype(np.int32)),
                pa.array(vals, type=pa.int64()),
                mask=pa.array(ptr[1:] == ptr[:-1]),
            )
        )
    return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


def _merged(
    rts: list[RankTrace], column: Callable[[RankTrace], tuple[list[str], np.ndarray]]
) -> tuple[list[str], np.ndarray]:
    """One dictionary for a dictionary column (``column``: a rank's dictionary and its index per row, -1 for
    none) of the ranks' nodes and each node's index into it (one rank: its own)."""
    if len(rts) == 1:
        words, idx = column(rts[0])
        return list(words), idx
    ids: dict[str, int] = {}
    parts = []
    for rt in rts:
        words, idx = column(rt)
        remap = np.fromiter((ids.setdefault(w, len(ids)) for w in words), dtype=np.int64, count=len(words))
        parts.append(
            np.where(idx >= 0, remap[np.maximum(idx, 0)], -1) if remap.size else idx.astype(np.int64)
        )
    return list(ids), np.concatenate(parts)


def deps_table(rt: RankTrace) -> pa.Table:
    """The ``deps`` partition of one rank (node ids, not rows)."""
    owner = np.repeat(np.arange(len(rt), dtype=np.int64), np.diff(rt.dep_ptr))
    cols = {
        "src": pa.array(rt.node_id[rt.dep_idx]),
        "dst": pa.array(rt.node_id[owner]),
        "kind": _dict(rt.dep_kind, ["ctrl", "data"]),
    }
    return _partition_table(DepRecord, cols, "deps")


@dataclass(eq=False, kw_only=True, slots=True)
class _RankResult:
    rank: int
    comm: CommRows
    pg_names: list[str]
    pg_found: dict[str, ProcessGroupInfo]
    issues: list[Issue]
    num_nodes: int
    num_deps: int
    readable: bool = True


def _export_rank(
    path: Path,
    rank: int,
    tmp: Path,
    pg_names: list[str],
    world: tuple[int, ...],
    *,
    mark_stream: int | None,
    meta: Mapping[bytes, bytes],
    steps: Mapping[int, tuple[int, int]] | None = None,
) -> _RankResult:
    """Worker: decode one rank, write its partitions (``meta`` added to their key-value metadata: the
    run's :func:`provenance_metadata`), return its communication rows (``mark_stream``:
    :func:`step_mark_stream`; ``steps``: the rank's steps in the manifest, :func:`load_rank`'s)."""
    sink = IssueLog(strict=False)
    found: dict[str, ProcessGroupInfo] = {}
    names = list(pg_names)
    try:
        rt = load_rank(path, rank, names, found, sink=sink, steps=steps)
    except TraceFormatError as e:
        sink.error("corrupt-trace", str(e), file=str(path), rank=rank)
        return _RankResult(
            rank=rank,
            comm=CommRows.empty(rank, str(path)),
            pg_names=names,
            pg_found=found,
            issues=sink.issues,
            num_nodes=0,
            num_deps=0,
            readable=False,
        )
    assign_defaults(rt, names, found, world)
    cycle = find_cycle(rt)
    if cycle is not None:
        chain = " -> ".join(f"{rt.node_id[i]} ({rt.name(i)})" for i in reversed(cycle))
        sink.error("dependency-cycle", f"{path}: rank {rank}: dependency cycle: {chain}", rank=rank)
    nodes, deps = with_metadata(nodes_table(rt, names), meta), with_metadata(deps_table(rt), meta)
    write_table(nodes, partition_path(tmp, "nodes", rank), row_group_size=ROW_GROUP)
    write_table(deps, partition_path(tmp, "deps", rank), row_group_size=ROW_GROUP)
    for note in rt.notes:
        sink.info("inferred", f"{path}: rank {rank}: {note}", file=str(path), rank=rank)
    return _RankResult(
        rank=rank,
        comm=CommRows.of(rt, mark_stream),
        pg_names=names,
        pg_found=found,
        issues=sink.issues,
        num_nodes=len(rt),
        num_deps=int(rt.dep_idx.shape[0]),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportSummary:
    """What ``export_run`` wrote."""

    out_dir: Path
    """The output directory."""
    rows: dict[str, int]
    """Rows written per table."""
    issues: tuple[Issue, ...]
    """Problems found while converting (errors abort the export unless ``strict=False``)."""


def _remap(res: _RankResult, pg_names: list[str]) -> None:
    """Rewrite a worker's group indices into the run's ``pg_names``."""
    table = []
    for g in res.pg_names:
        if g not in pg_names:
            pg_names.append(g)
        table.append(pg_names.index(g))
    if table:
        lut = np.asarray(table, dtype=np.int32)
        valid = res.comm.pg >= 0
        res.comm.pg[valid] = lut[res.comm.pg[valid]]


def _results(
    files: RunFiles, tmp: Path, pg_names: list[str], workers: int, meta: Mapping[bytes, bytes]
) -> Iterator[_RankResult]:
    world = tuple(range(files.manifest.world_size))
    mark = step_mark_stream(files.manifest)
    spans = captured_steps(files.manifest)
    todo = [(f, r) for r, f in sorted(files.files.items()) if f.exists()]
    if workers <= 1 or len(todo) <= 1:
        for f, r in todo:
            yield _export_rank(f, r, tmp, pg_names, world, mark_stream=mark, meta=meta, steps=spans.get(r))
        return
    if (why := no_temp_dir()) is not None:  # it was "cannot write OUT: No such file or directory"
        raise SkewlensError(
            f"the export's worker processes need a temporary directory: {why} (or --workers 1)"
        )
    # imported here: the replay and analysis import this module for its writers, not its worker processes
    from concurrent.futures.process import BrokenProcessPool

    with process_pool(min(workers, len(todo)), __name__) as pool:  # no process without a rank file
        futures = [
            pool.submit(
                _export_rank, f, r, tmp, pg_names, world, mark_stream=mark, meta=meta, steps=spans.get(r)
            )
            for f, r in todo
        ]
        try:
            for (f, r), fut in zip(todo, futures, strict=True):
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    raise SkewlensError(
                        f"{f}: the worker exporting rank {r} (or another one) died: {POOL_DIED}"
                    ) from None
                yield res
        except BaseException:  # a failed rank (or Ctrl-C): do not convert the rest first
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    strict: bool = True,
    progress: Progress | None = NO_PROGRESS,
    allow_option: str = "strict=False",
    model: ModelColumns | None = None,
) -> ExportSummary:
    """Convert a run to Parquet in ``out_dir`` (replaced atomically). See the module docstring.
    ``allow_option``: how the caller's user asks for a run with errors to be exported, named in the
    refusal. ``model``: the ``model`` table's columns (none without); where it raises a SkewlensError (the
    run does not load), the export has no ``model`` table and a warning says why."""
    progress = given(progress)
    files = locate_run(run_dir)
    out = Path(out_dir)
    check_replaceable(out, marker=PARQUET_EXPORT_FILE, fmt=PARQUET_EXPORT_FORMAT, what="Parquet export")
    n_workers = workers if workers is not None else min(usable_cores(), len(files.files), 8)
    sink = IssueLog(strict=False)
    for r, f in sorted(files.files.items()):
        if not f.exists():
            sink.error("missing-rank", f"{f}: rank {r} is listed but its trace file is missing", rank=r)
    missing_rank_issues(files, sink)
    with staging_dir(out) as tmp:
        summary = _export_into(files, tmp, n_workers, sink, progress=progress, model=model, strict=strict)
        if strict and any(i.severity is Severity.ERROR for i in summary.issues):
            errors = [i for i in summary.issues if i.severity is Severity.ERROR]
            raise refusal(run_dir, errors, "not exported", anyway=allow_option, notes=files.manifest.notes)
        replace_dir(tmp, out)
    return ExportSummary(out_dir=out, rows=summary.rows, issues=summary.issues)


def _export_into(
    files: RunFiles,
    tmp: Path,
    workers: int,
    sink: IssueLog,
    *,
    progress: Progress,
    model: ModelColumns | None,
    strict: bool,
) -> ExportSummary:
    manifest = files.manifest
    meta = provenance_metadata(files.root, manifest)  # every table names its run, as the analyses' do
    pg_names = [g.name for g in manifest.process_groups]
    groups: dict[str, ProcessGroupInfo] = {}
    comm: dict[int, CommRows] = {}
    num_nodes: dict[int, int] = {}
    rows = {"nodes": 0, "deps": 0}
    with progress.task("exporting ranks", len(files.files)) as advance:
        for res in _results(files, tmp, pg_names, workers, meta):
            _remap(res, pg_names)
            for k, v in res.pg_found.items():
                groups.setdefault(k, v)
            sink.issues.extend(res.issues)
            advance()
            if not res.readable:
                continue
            comm[res.rank] = res.comm
            num_nodes[res.rank] = res.num_nodes
            rows["nodes"] += res.num_nodes
            rows["deps"] += res.num_deps
    groups.update({g.name: g for g in manifest.process_groups})
    groups = with_world_ranks(groups, manifest.world_size)  # a group listed with no ranks: the loader's rule
    comm, _ = matchable(comm, manifest, groups, pg_names, sink)  # as the loader does
    missing = frozenset(manifest.missing_ranks) | (frozenset(manifest.ranks) - frozenset(comm))
    instances = match_instances(comm, pg_names, groups, sink, missing_ranks=missing)
    pairs = match_pairs(comm, pg_names, sink)
    rows["collectives"] = _write_collectives(tmp, comm, instances, meta, groups)
    rows["p2p"] = _write_p2p(tmp, comm, pairs, meta)
    rows["ranks"] = _write_ranks(tmp, files, num_nodes, meta)
    rows["groups"] = _write_groups(tmp, groups, pg_names, meta)
    if model is not None and not (strict and any(i.severity is Severity.ERROR for i in sink.issues)):
        _write_model(tmp, model, rows, sink, meta)
    _write_provenance(tmp, files, rows, sink, frozenset(files.manifest.ranks) - frozenset(num_nodes))
    return ExportSummary(out_dir=tmp, rows=rows, issues=tuple(sink.issues))


def _write_model(
    tmp: Path, model: ModelColumns, rows: dict[str, int], sink: IssueLog, meta: Mapping[bytes, bytes]
) -> None:
    """The ``model`` table's partitions and ``rows["model"]``; none, and a warning, where ``model`` raises."""
    n = 0
    try:
        for rank, cols in model():
            arrays = {k: pa.array(v, type=pa.int64()) for k, v in cols.items()}
            table = with_metadata(_partition_table(ModelRecord, arrays, "model"), meta)
            write_table(table, partition_path(tmp, "model", rank), row_group_size=ROW_GROUP)
            n += table.num_rows
    except SkewlensError as e:
        shutil.rmtree(tmp / "model", ignore_errors=True)
        sink.warning("no-model", f"{e}; so the export has no model table (the execution model's reading)")
        return
    rows["model"] = n


def _at(c: CommRows, row: int) -> int:
    return int(np.searchsorted(c.row, row))


def _write_collectives(
    tmp: Path,
    comm: dict[int, CommRows],
    instances: list[CollectiveInstance],
    meta: Mapping[bytes, bytes],
    groups: Mapping[str, ProcessGroupInfo],
) -> int:
    """One row per member per instance, gathered rank by rank with numpy; ``group_size`` is the group's
    (``groups``: its members, those without a trace too), else the instance's member count."""
    sizes = np.fromiter((len(i.ranks) for i in instances), dtype=np.int64, count=len(instances))
    group_size = np.fromiter(
        (
            len(g.ranks) if (g := groups.get(i.pg_name)) is not None and g.ranks else len(i.ranks)
            for i in instances
        ),
        dtype=np.int64,
        count=len(instances),
    )
    total = int(sizes.sum())
    ranks = np.fromiter(itertools.chain.from_iterable(i.ranks for i in instances), np.int64, total)
    rows = np.fromiter(itertools.chain.from_iterable(i.rows for i in instances), np.int64, total)
    nbytes = np.fromiter(itertools.chain.from_iterable(i.comm_bytes for i in instances), np.int64, total)
    node_id, step, start, end, ctype = (np.zeros(total, dtype=np.int64) for _ in range(5))
    dtype = np.full(total, None, dtype=object)  # null where not recorded ('' in CommRows)
    for r, c in comm.items():
        m = np.flatnonzero(ranks == r)
        if m.size:
            at = np.searchsorted(c.row, rows[m])
            if c.dtype:
                words = np.asarray(c.dtype, dtype=object)[at]  # a copy
                words[words == ""] = None
                dtype[m] = words
            node_id[m] = c.node_id[at]
            ctype[m] = c.comm_type[at]
            step[m] = c.step[at]
            start[m] = c.start_ns[at]
            end[m] = c.start_ns[at] + c.dur_ns[at]
    pg_dict = sorted({i.pg_name for i in instances})
    pg_idx = np.fromiter((pg_dict.index(i.pg_name) for i in instances), np.int64, len(instances))
    # each member's own type: the members of an instance whose types differ (exported with
    # --allow-errors) keep what each called, not the first member's
    type_vals, type_idx = np.unique(ctype, return_inverse=True)
    cols = {
        "pg_name": _dict(np.repeat(pg_idx, sizes), pg_dict),
        "seq": np.repeat(np.fromiter((i.seq for i in instances), np.int64, len(instances)), sizes),
        "comm_type": _dict(type_idx, [comm_type_name(int(v)) for v in type_vals]),
        "rank": ranks,
        "node_id": node_id,
        "comm_bytes": nbytes,
        "step": step,
        "start_ns": start,
        "end_ns": end,
        "group_size": np.repeat(group_size, sizes),
        "dtype": pa.array(dtype, type=pa.string()).dictionary_encode(),
    }
    table = table_from_columns(CollectiveRecord, cols, "collectives")
    write_table(with_metadata(table, meta), tmp / "collectives.parquet")
    return total


def _write_p2p(
    tmp: Path, comm: dict[int, CommRows], pairs: list[P2PPair], meta: Mapping[bytes, bytes]
) -> int:
    cols: dict[str, list[Any]] = {f.name: [] for f in fields(P2PRecord)}
    for k, p in enumerate(pairs):
        s, d = comm[p.src_rank], comm[p.dst_rank]
        i, j = _at(s, p.src_row), _at(d, p.dst_row)
        cols["pair"].append(k)
        cols["pg_name"].append(p.pg_name or None)
        cols["src_rank"].append(p.src_rank)
        cols["dst_rank"].append(p.dst_rank)
        cols["tag"].append(p.tag)
        cols["step"].append(int(s.step[i]))
        cols["comm_bytes"].append(p.comm_bytes)
        cols["recv_bytes"].append(int(d.comm_bytes[j]))
        cols["send_node_id"].append(int(s.node_id[i]))
        cols["recv_node_id"].append(int(d.node_id[j]))
        cols["send_start_ns"].append(int(s.start_ns[i]))
        cols["send_end_ns"].append(int(s.start_ns[i] + s.dur_ns[i]))
        cols["recv_start_ns"].append(int(d.start_ns[j]))
        cols["recv_end_ns"].append(int(d.start_ns[j] + d.dur_ns[j]))
    write_table(with_metadata(table_from_columns(P2PRecord, cols, "p2p"), meta), tmp / "p2p.parquet")
    return len(cols["src_rank"])


def _write_ranks(tmp: Path, files: RunFiles, num_nodes: dict[int, int], meta: Mapping[bytes, bytes]) -> int:
    m = files.manifest
    ranks = sorted(num_nodes)
    cols = {
        "rank": ranks,
        "host": [m.hosts.get(r, "") for r in ranks],
        "device": [m.devices.get(r, "") for r in ranks],
        "gpu": [m.gpus.get(r) or None for r in ranks],
        "clock_offset_ns": [m.clock_offsets_ns.get(r, 0) for r in ranks],
        "num_nodes": [num_nodes[r] for r in ranks],
        # absolute, as run.json's source: a run named relative to the cwd gave a path only that cwd resolves
        "trace_file": [str(Path(files.files[r]).resolve()) for r in ranks],
    }
    write_table(with_metadata(table_from_columns(RankRecord, cols, "ranks"), meta), tmp / "ranks.parquet")
    return len(ranks)


def _write_groups(
    tmp: Path, groups: Mapping[str, ProcessGroupInfo], pg_names: list[str], meta: Mapping[bytes, bytes]
) -> int:
    """One row per group of ``pg_names`` (the store's order), with what the run records of it."""
    cols: dict[str, list[Any]] = {f.name: [] for f in fields(GroupRecord)}
    for name in pg_names:
        g = groups.get(name)
        cols["pg_name"].append(name)
        cols["pg_desc"].append(g.desc if g else "")
        cols["ranks"].append(list(g.ranks) if g else None)
        cols["backend"].append(g.backend if g else "")
    write_table(with_metadata(table_from_columns(GroupRecord, cols, "groups"), meta), tmp / "groups.parquet")
    return len(pg_names)


def _write_provenance(
    tmp: Path, files: RunFiles, rows: dict[str, int], sink: IssueLog, left_out: frozenset[int]
) -> None:
    """``run.json`` and the run's manifest; ``left_out``: the ranks the manifest lists whose trace the export
    has not (missing or unreadable, exported with errors allowed), which its copy lists among
    ``missing_ranks`` as the lenient loader's run does."""
    from skewlens import __version__

    run = {
        "format": PARQUET_EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "source": str(files.root.resolve()),
        "has_manifest": files.has_manifest,
        "world_size": files.manifest.world_size,
        "skewlens_version": __version__,
        "tables": {
            **{t: {"path": f"{t}/rank=<r>/{PART_FILE}", "rows": rows[t]} for t in PARTITIONED if t in rows},
            **{t: {"path": f"{t}.parquet", "rows": rows[t]} for t in SINGLE},
        },
        "issues": {s.value: sum(1 for i in sink.issues if i.severity is s) for s in Severity},
        "comm_types": {t.name: int(t) for t in CommType},
    }
    (tmp / PARQUET_EXPORT_FILE).write_text(json.dumps(run, indent=2) + "\n")
    manifest = files.manifest
    if left_out:
        manifest = dataclasses.replace(
            manifest,
            ranks=tuple(r for r in manifest.ranks if r not in left_out),
            missing_ranks=tuple(sorted({*manifest.missing_ranks, *left_out})),
        )
    (tmp / MANIFEST_NAME).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")


def schema_markdown() -> str:
    """The column tables of docs/parquet.md, generated from the record dataclasses' field docstrings."""
    return "\n".join(
        columns_markdown(
            f"`{table}` (`{table}/rank=<r>/{PART_FILE}`)"
            if table in PARTITIONED
            else f"`{table}` (`{table}.parquet`)",
            cls,
            partition_key="rank" if table in PARTITIONED else None,
        )
        for table, cls in RECORD_OF.items()
    )
