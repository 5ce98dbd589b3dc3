"""Replay outputs: timeline/summary Parquet, ``timeline.json`` (Chrome/Perfetto) and ``config.yaml``.

Tables are described by record dataclasses (schemas from ``skewlens.profiler.store.schema``) and written
atomically; ``timeline.parquet`` is built from the trace's numpy columns, rank by rank on a few threads.
The Perfetto JSON has one process per rank and one thread per stream (times are µs at that edge); it is
streamed a chunk at a time (:mod:`skewlens.replay.streaming`) and capped at ``perfetto_max_events`` nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from skewlens.profiler.atomic import atomic_file, move_into, moving_into, replace_dir
from skewlens.profiler.manifest import SCALE_NOTE, TIMELINE_SCALED_RANKS
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.parquet import ROW_GROUP, nodes_table
from skewlens.profiler.store.schema import (
    META_TABLE,
    META_VERSION,
    SCHEMA_VERSION,
    NodeRecord,
    arrow_file,
    arrow_schema,
    files_markdown,
    parquet_options,
    provenance_metadata,
    table_from_records,
    with_metadata,
    write_table,
)
from skewlens.profiler.threads import default_workers, ordered_map
from skewlens.profiler.vocab import NodeType
from skewlens.replay.errors import ConfigError
from skewlens.replay.execution import IdleStretches, execution_model, idle_stretches
from skewlens.replay.real.plan import META_FILE
from skewlens.replay.simulate import SimResult, check_replays
from skewlens.replay.streaming import (
    CATEGORY_JSON,
    DEFAULT_MAX_EVENTS,
    Lookup,
    RankRows,
    StepSpans,
    Value,
    cap_events,
    format_events,
    gpu_idle_events,
    idle_track_name,
    json_fixed,
    json_int,
    process_metadata,
    rank_categories,
    rank_chunks,
    rank_tracks,
    steps_track_metadata,
    wait_events,
    write_trace,
)
from skewlens.replay.summary import SummaryRecord, sync_arrivals

TIMELINE_PARQUET = "timeline.parquet"
SUMMARY_PARQUET = "summary.parquet"
TIMELINE_JSON = "timeline.json"
CONFIG_YAML = "config.yaml"
#: ``mode=real``: the run the real replay captured, and its working files (plans, logs).
REAL_RUN_DIR = "run"
REAL_WORK_DIR = "real"
#: ``mode=real``: a failed real replay's logs (the launcher's, torchrun's, the workers' error files).
REAL_FAILED_DIR = "real-failed"
SWEEP_PARQUET = "sweep.parquet"
SWEEP_PNG = "sweep.png"


def publish_replay(stage: Path, out_dir: Path, *, mode: str) -> None:
    """Move a whole replay staged in ``stage`` (:func:`~skewlens.profiler.atomic.staging_dir`, inside
    ``out_dir``) into ``out_dir``: its files replace an earlier replay's, and those this one did not write go
    (``timeline.json`` under ``perfetto=false``, ``config.yaml`` from Python, which writes none); a real
    replay's staged ``run/`` and ``real/`` replace the earlier ones, which a simulated replay removes; an
    earlier failure's logs (``real-failed/``) go. ``skewlens replay`` and :func:`replay_run` both end so."""
    with moving_into(out_dir):  # an interrupt between two of its renames says what it left
        move_into(stage, out_dir, (TIMELINE_PARQUET, SUMMARY_PARQUET, TIMELINE_JSON, CONFIG_YAML))
        for name in (REAL_RUN_DIR, REAL_WORK_DIR):  # a real replay on one host staged them
            if (stage / name).exists():
                replace_dir(stage / name, out_dir / name)
            elif mode != "real":  # an earlier real replay's
                shutil.rmtree(out_dir / name, ignore_errors=True)
    shutil.rmtree(out_dir / REAL_FAILED_DIR, ignore_errors=True)


#: What tells a directory written anew or changed from the one that was there: its inode, and the mtime
#: of its entries.
DirIdentity = tuple[int, int]


def _identity(p: Path) -> DirIdentity:
    st = p.stat()
    return (st.st_ino, st.st_mtime_ns)


def real_dirs_state(out_dir: Path) -> dict[Path, DirIdentity | None]:
    """``out_dir``'s ``run/`` and ``real/`` as they are before a replay into it (None: not there), and the
    real replay plan's ``meta.json`` (under key ``real/plan/meta.json``), which every real replay that
    began writes anew, atomically: :func:`remove_begun` tells from them what a failed one began."""
    paths = [out_dir / REAL_RUN_DIR, out_dir / REAL_WORK_DIR, out_dir / REAL_WORK_DIR / "plan" / META_FILE]
    return {p: _identity(p) if p.exists() else None for p in paths}


def remove_begun(out_dir: Path, before: dict[Path, DirIdentity | None]) -> None:
    """Remove the ``run/`` and ``real/`` that a failed or interrupted replay into ``out_dir`` began there
    (a real replay across hosts writes them in place), ``before`` being :func:`real_dirs_state` from before
    it began. It writes inside an earlier one's directories (leaving their own entries, so their times, as
    they were), so its new plan tells that it began; an earlier replay's, where none began, stay."""
    now = real_dirs_state(out_dir)
    meta = out_dir / REAL_WORK_DIR / "plan" / META_FILE
    began = now[meta] != before.get(meta)
    for p in (out_dir / REAL_RUN_DIR, out_dir / REAL_WORK_DIR):
        if now[p] is not None and (began or before.get(p) != now[p]):
            shutil.rmtree(p, ignore_errors=True)


def check_trace_outside(trace: str | Path, out_dir: Path) -> None:
    """Refuse a trace inside ``out_dir``'s ``run/`` or ``real/``: a real replay into ``out_dir`` replaces
    ``run/`` (it cleared the trace's files before its workers read them), a simulated one removes both (an
    earlier real replay's), so ``trace=OUT/run out=OUT`` lost the trace. Refuse ``out`` the run's own
    directory too: the replay's files would lie among the run's."""
    t = Path(trace).resolve()
    if t == Path(out_dir).resolve():
        raise ConfigError(
            f"out={out_dir} is the run's own directory (trace={trace}): the replay's files would lie among "
            "the run's; give another out, such as a directory beside it"
        )
    for name in (REAL_RUN_DIR, REAL_WORK_DIR):
        d = (Path(out_dir) / name).resolve()
        if t == d or d in t.parents:
            raise ConfigError(
                f"trace={trace} lies in out={out_dir}'s {name}/, which a replay into it replaces "
                "(mode=real) or removes (mode=sim) along with the trace; give another out"
            )


#: Rows of the ranks ``write_timeline`` builds one table of (whole ranks, at least this many rows: a larger
#: rank is a table of its own, its columns not copied).
TABLE_ROWS = 1 << 12
#: The config key that caps ``timeline.json`` (0: write every node).
MAX_EVENTS_KEY = "perfetto_max_events"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayedNodeRecord(NodeRecord):
    """One row of ``timeline.parquet``: a trace node (the store's node columns) with its replayed times."""

    source_rank: int
    """The captured rank whose trace holds this node: ``rank``, but in an extrapolated run (``scale.dp``)
    the captured rank that ``rank`` is a copy of."""
    replay_start_ns: int
    """Replayed start, ns."""
    replay_end_ns: int
    """Replayed end, ns."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRecord:
    """One row of ``sweep.parquet``: one job of a multirun sweep. After these columns, ``sweep.parquet`` has
    one per swept setting, named by its override's key (``topology.dims.0.bandwidth_gbps``: a setting whose
    value is not the same in every job of the sweep, failed ones included; a lone job's every override),
    the job's value (a quoted one, ``trace='runs/run=a'``, without its quotes: ``runs/run=a``): int64 where
    every job's value is an integer that int64 holds, double where every one is a number, else a string;
    null in a job without that override. A key that is one of these columns
    (``topology``, ``slowdown``, ``comm_mode``) is that column, which names the job's choice.
    ``bandwidth_gbps`` is in GB/s: gigabytes per second (a 400 Gb/s NIC is 50)."""

    job: int
    """Hydra job number."""
    overrides: str
    """The job's command-line overrides."""
    topology: str
    """Topology name."""
    slowdown: str
    """Slowdown name."""
    comm_mode: str
    """as_recorded | model."""
    makespan_ns: int
    """Replayed makespan: the latest replayed end less the replay's start (the run's first recorded start,
    so a stall of the rank that began first is in it), ns."""
    mean_step_ns: int
    """Mean over steps of each step's slowest rank's replayed step time (step mark to step mark, as the
    replay's summary measures it), ns: a step of the job lasts as long as its slowest rank, so this is at
    least the mean of any one rank (where the slowest rank changes from step to step, more than each rank's);
    the makespan where the run has no step marks."""
    max_step_ns: int
    """Longest replayed step (of its slowest rank, the same measure), ns."""
    out_dir: str
    """The job's output directory."""
    mean_exposed_transfer_ns: int | None = None
    """Mean over steps of the exposed transfer (communication not under compute nor waiting for peers,
    ``summary.parquet``'s ``exposed_transfer_ns``) of each step's slowest rank, the rank whose step time
    ``mean_step_ns`` takes, ns; null in a file of schema version 14 or older, or a replay without steps."""
    mean_exposed_wait_ns: int | None = None
    """Mean over steps of the exposed wait for peers (``summary.parquet``'s ``exposed_wait_ns``) of each
    step's slowest rank, ns; null as ``mean_exposed_transfer_ns``."""


#: Each output file's record dataclass (its columns), in the order docs/parquet.md lists them.
RECORD_OF: dict[str, type] = {
    TIMELINE_PARQUET: ReplayedNodeRecord,
    SUMMARY_PARQUET: SummaryRecord,
    SWEEP_PARQUET: SweepRecord,
}


def schema_markdown() -> str:
    """The column tables of the replay's files in docs/parquet.md, from their record dataclasses."""
    return files_markdown(RECORD_OF, "skewlens replay")


def distinct_overrides(overrides: Sequence[str]) -> list[str]:
    """Each sweep job's overrides (``overrides[k]``, space-separated) without those every job shares: what
    sets the job apart (a lone job keeps all of its own)."""
    every = [set(override_tokens(o)) for o in overrides]
    common = set.intersection(*every) if len(every) > 1 else set()
    return [" ".join(x for x in override_tokens(o) if x not in common) for o in overrides]


def _quote_end(text: str, start: int) -> int:
    """Where the quoted string that opens at ``text[start]`` ends (the index after its closing quote; the
    text's length where it has none): at the first quote of its kind after a run of backslashes of even
    length, Hydra's rule (an odd run escapes the quote)."""
    q, k = text[start], start + 1
    while k < len(text):
        if text[k] == q:
            run = len(text[:k]) - len(text[:k].rstrip("\\"))
            if run % 2 == 0:
                return k + 1
        k += 1
    return len(text)


def override_tokens(overrides: str) -> list[str]:
    """One job's overrides (Hydra's, joined by spaces) one by one: split at the spaces outside quoted
    strings and brackets, so that ``trace='runs/my run'`` and ``'a=[{k: 1}]'`` are one override each."""
    tokens: list[str] = []
    start, depth, k = 0, 0, 0
    while k < len(overrides):
        c = overrides[k]
        if c in "'\"":
            k = _quote_end(overrides, k)
            continue
        if c in "[{(":
            depth += 1
        elif c in "]})":
            depth = max(0, depth - 1)
        elif c.isspace() and depth == 0:
            if k > start:
                tokens.append(overrides[start:k])
            start = k + 1
        k += 1
    if len(overrides) > start:
        tokens.append(overrides[start:])
    return tokens


def override_value(value: str) -> str:
    """An override's value as the setting takes it: a value that is one quoted string (``'runs/run=a'``,
    how Hydra takes a value with ``=`` or a space in it) without its quotes, its escaped quotes and
    backslashes unescaped as Hydra does; any other value as given."""
    if value[:1] not in ("'", '"') or _quote_end(value, 0) != len(value) or len(value) < 2:
        return value
    q = value[0]
    # a run of backslashes before a quote (or the closing one) stands for half as many
    return re.sub(rf"(\\+)(?={q}|$)", lambda m: m.group(1)[: len(m.group(1)) // 2], value[1:-1])


def slowest_rank_steps(summary: Sequence[SummaryRecord]) -> list[SummaryRecord]:
    """Each step's row of its slowest rank (the longest ``step_time_ns``; of equals, the lowest rank), by
    step: a step of the job lasts as long as that rank's."""
    slowest: dict[int, SummaryRecord] = {}
    for s in summary:
        best = slowest.get(s.step)
        if best is None or (s.step_time_ns, -s.rank) > (best.step_time_ns, -best.rank):
            slowest[s.step] = s
    return [slowest[k] for k in sorted(slowest)]


def _mean(values: Sequence[int]) -> int:
    return round(sum(values) / len(values))


def sweep_record(
    *,
    job: int,
    overrides: str,
    topology: str,
    slowdown: str,
    comm_mode: str,
    out_dir: str,
    makespan_ns: int,
    summary: Sequence[SummaryRecord],
) -> SweepRecord:
    """A sweep job's row, its step figures from its replay's ``summary`` (each step's slowest rank's:
    :func:`slowest_rank_steps`); a replay without steps has the makespan as its step and no exposed
    communication figures."""
    steps = slowest_rank_steps(summary)
    return SweepRecord(
        job=job,
        overrides=overrides,
        topology=topology,
        slowdown=slowdown,
        comm_mode=comm_mode,
        makespan_ns=makespan_ns,
        mean_step_ns=_mean([s.step_time_ns for s in steps]) if steps else makespan_ns,
        max_step_ns=max((s.step_time_ns for s in steps), default=makespan_ns),
        out_dir=out_dir,
        mean_exposed_transfer_ns=_mean([s.exposed_transfer_ns for s in steps]) if steps else None,
        mean_exposed_wait_ns=_mean([s.exposed_wait_ns for s in steps]) if steps else None,
    )


#: The unit of a setting, by how its key ends (``bandwidth_gbps``: GB/s, gigabytes per second, as the
#: network model reads it: 1 GB/s = 1 byte/ns).
_UNIT_OF_SUFFIX = {"_gbps": "GB/s", "_ns": "ns", "_ms": "ms"}
#: What ``GB/s`` is, where a swept key's unit is it: ``gbps`` reads as gigabits, 8x less.
GBPS_NOTE = "GB/s: gigabytes per second (a 400 Gb/s NIC is 50)"


def setting_unit(key: str) -> str | None:
    """The unit of the setting ``key`` (``topology.dims.0.bandwidth_gbps``: ``GB/s``), None where its name
    says none."""
    return next((u for end, u in _UNIT_OF_SUFFIX.items() if key.endswith(end)), None)


def override_key(token: str) -> str:
    """The key one command-line override names: ``key=value``, ``+key=value`` and ``++key=value`` (add or
    force ``key``), ``~key`` and ``~key=value`` (delete it)."""
    return token.lstrip("+~").partition("=")[0]


def override_setting(token: str) -> tuple[str, str] | None:
    """The key (:func:`override_key`) and value of one command-line override; None for one that sets no
    value (``~key`` deletes it)."""
    if token.startswith("~"):
        return None
    key, (_, eq, value) = override_key(token), token.partition("=")
    return (key, override_value(value)) if eq and key else None


def swept_settings(overrides: Sequence[str]) -> dict[str, list[str | None]]:
    """The settings a sweep's jobs (``overrides[k]``, space-separated) differ in (those of
    :func:`distinct_overrides`), in the order they first appear, each with every job's value (None where a
    job has no override of it)."""
    keys: dict[str, None] = {}
    for own in distinct_overrides(overrides):
        for token in override_tokens(own):
            if (kv := override_setting(token)) is not None:
                keys.setdefault(kv[0])
    jobs = [job_settings(o) for o in overrides]
    return {key: [job.get(key) for job in jobs] for key in keys}


def job_settings(overrides: str) -> dict[str, str]:
    """The settings one job's overrides (space-separated) give: key to value (:func:`override_setting`)."""
    return dict(kv for t in override_tokens(overrides) if (kv := override_setting(t)) is not None)


def shared_setting(overrides: Sequence[str], key: str) -> str | None:
    """The value of ``key`` that every one of two or more sweep jobs (``overrides[k]``) gives, as the setting
    takes it (``trace='runs/run=a'``: ``runs/run=a``); None where a job gives another or none, or for a
    lone job."""
    values = {job_settings(o).get(key) for o in overrides}
    return values.pop() if len(overrides) >= 2 and len(values) == 1 else None


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _number(text: str) -> float | None:
    if "_" in text:  # float() reads 1_000, which is no number a user wrote as such
        return None
    try:
        return float(text)
    except ValueError:
        return None


#: The int64 column's range: an integer beyond it (a 64-bit unsigned seed, 18446744073709551615) made the
#: column an OverflowError, a traceback at the end of the sweep with no sweep.parquet, table or picture.
_INT64 = range(-(1 << 63), 1 << 63)


def setting_numbers(values: Sequence[str | None]) -> list[float | None] | None:
    """A swept setting's values (each job's, None where it has none) as numbers, where each given one is a
    number (not ``1_000``, which ``float()`` reads); else None: a setting of names, a string column of
    ``sweep.parquet`` (:func:`setting_column`) and no axis of ``sweep.png``."""
    given = [v for v in values if v is not None]
    numbers = [None if v is None else _number(v) for v in values]
    if not given or any(x is None for x, v in zip(numbers, values, strict=True) if v is not None):
        return None
    return numbers


def setting_column(values: Sequence[str | None]) -> pa.Array:
    """A swept setting's column of ``sweep.parquet`` from the jobs' values (None: null): int64 where each is
    an integer int64 holds, double where each is a number (:func:`setting_numbers`), else a (dictionary)
    string."""
    numbers = setting_numbers(values)
    if numbers is not None:
        if all(v is None or (_INTEGER.fullmatch(v) and int(v) in _INT64) for v in values):
            return pa.array([None if v is None else int(v) for v in values], type=pa.int64())
        return pa.array(numbers, type=pa.float64())
    return pa.array(values, type=pa.string()).dictionary_encode()


def sweep_parquet_table(rows: Sequence[SweepRecord], failed: Sequence[str] = ()) -> pa.Table:
    """``sweep.parquet``'s table: ``rows`` (:class:`SweepRecord`'s columns), then a column per swept setting
    (:func:`swept_settings` of the rows' overrides and the ``failed`` jobs', which tell the swept settings
    too: a sweep whose every job but one failed has them), named by its key, typed by
    :func:`setting_column`. A key that is a column of :class:`SweepRecord` is left to that column."""
    tbl = table_from_records(SweepRecord, rows, "sweep")
    settings = swept_settings([r.overrides for r in rows] + list(failed))
    for key, values in settings.items():
        if key in tbl.column_names:
            continue
        col = setting_column(values[: len(rows)])
        doc = f"Swept setting {key}: the job's override of it" + (
            f", {unit}" if (unit := setting_unit(key)) else ""
        )
        tbl = tbl.append_column(pa.field(key, col.type, metadata={"doc": doc}), col)
    return tbl


def timeline_table(run: RunTrace, res: SimResult, ranks: Sequence[int]) -> pa.Table:
    """The rows of ``timeline.parquet`` of ``ranks``, one rank after another, from their numpy columns (the
    store's node columns, the rank, the replayed times); string columns are dictionary arrays. ``res`` must
    replay ``run`` (:func:`check_replays`)."""
    check_replays(run, res, ranks, caller="timeline_table")
    rts = [run.ranks[r] for r in ranks]
    nodes = nodes_table(rts, run.pg_names)
    cols: dict[str, Any] = {name: nodes.column(name) for name in nodes.column_names}
    lengths = [len(rt) for rt in rts]
    cols["rank"] = pa.array(np.repeat(np.asarray(ranks, dtype=np.int64), lengths))
    sources = np.asarray([run.source_rank(r) for r in ranks], dtype=np.int64)
    cols["source_rank"] = pa.array(np.repeat(sources, lengths))
    for col, times in (("replay_start_ns", res.start_ns), ("replay_end_ns", res.end_ns)):
        parts = [times[r] for r in ranks]  # one rank: its column as it is, not copied
        cols[col] = pa.array(parts[0] if len(parts) == 1 else np.concatenate(parts), type=pa.int64())
    schema = _timeline_schema(run)
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def rank_batches(run: RunTrace, rows: int) -> list[list[int]]:
    """The ranks in order, in batches of whole ranks of at least ``rows`` rows (the last may have fewer)."""
    out: list[list[int]] = [[]]
    n = 0
    for r in sorted(run.ranks):
        if n >= rows:
            out.append([])
            n = 0
        out[-1].append(r)
        n += len(run.ranks[r])
    return [b for b in out if b]


def _timeline_schema(run: RunTrace) -> pa.Schema:
    meta = {META_VERSION: SCHEMA_VERSION.encode(), META_TABLE: b"timeline"}
    meta.update(provenance_metadata(run.run_dir, run.manifest))
    return arrow_schema(ReplayedNodeRecord).with_metadata(meta)


def write_timeline(run: RunTrace, res: SimResult, path: Path, *, workers: int | None = None) -> Path:
    """Write ``timeline.parquet``: one file, one row per node, ranks in order, a row group per
    ``ROW_GROUP`` rows of whole ranks (so a query for one rank reads one row group).

    Tables of whole ranks (batches of at least ``TABLE_ROWS`` rows: a table has a fixed cost of ~0.4 ms,
    0.4 s for 1,024 ranks of a few nodes) are built on ``workers`` threads (default: the usable CPUs) while
    the file is written (Parquet encoding releases the GIL); at most a few row groups are in memory at
    once. One file, not a directory of per-rank files: readers open ``timeline.parquet`` as a file (DuckDB,
    pandas, the tests), and at 1,024 ranks x 10,000 nodes per-rank files cost twice the CPU (4.6 s vs 2.2 s,
    measured)."""
    schema = _timeline_schema(run)
    n_workers = default_workers() if workers is None else workers
    batches = rank_batches(run, TABLE_ROWS)
    tables = ordered_map(lambda rs: timeline_table(run, res, rs), batches, workers=n_workers, ahead=4)
    with (
        contextlib.closing(tables),  # closed here if the writer raises (see ordered_map)
        atomic_file(path) as tmp,
        arrow_file(tmp, "wb") as sink,
        pq.ParquetWriter(sink, schema, **parquet_options(schema)) as w,
    ):
        group: list[pa.Table] = []
        rows = 0
        for tbl in tables:
            group.append(tbl)
            rows += tbl.num_rows
            if rows >= ROW_GROUP:
                w.write_table(pa.concat_tables(group), row_group_size=rows)
                group, rows = [], 0
        if group:
            w.write_table(pa.concat_tables(group), row_group_size=rows)
    return path


def write_summary(run: RunTrace, rows: list[SummaryRecord], path: Path) -> Path:
    """Write ``summary.parquet`` (its metadata naming ``run``: :func:`provenance_metadata`)."""
    table = table_from_records(SummaryRecord, rows, "summary")
    return write_table(with_metadata(table, provenance_metadata(run.run_dir, run.manifest)), path)


def _atomic_text(path: Path, write: Callable[[TextIO], object]) -> Path:
    with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        write(fh)
    return path


def write_text(path: Path, text: str) -> Path:
    """Write a text file atomically."""
    return _atomic_text(path, lambda fh: fh.write(text))


def replayed_waits(run: RunTrace, res: SimResult) -> dict[int, npt.NDArray[np.int64]]:
    """Per rank, each row's replayed wait for late peers (0 where none): a collective member or a send /
    recv waits from its replayed start until the replayed latest arrival of its instance or pair (a rooted
    collective's member: the arrival :meth:`SimResult.rooted_awaited_ns` names), at most until its own end
    (the summary's :func:`~skewlens.replay.summary.sync_arrivals`, as its ``wait_ns`` counts it)."""
    out: dict[int, npt.NDArray[np.int64]] = {}
    for r, (rows, awaited) in sync_arrivals(run, res, caller="replayed_waits").items():
        st, en = res.start_ns[r], res.end_ns[r]
        w = np.zeros(len(st), dtype=np.int64)
        w[rows] = np.clip(awaited - st[rows], 0, en[rows] - st[rows])
        out[r] = w
    return out


def write_perfetto(
    run: RunTrace,
    res: SimResult,
    path: Path,
    *,
    max_events: int = DEFAULT_MAX_EVENTS,
    on_note: Callable[[str], object] | None = None,
    workers: int | None = None,
    idle_streams: Mapping[int, int] | None = None,
) -> Path:
    """Write ``timeline.json`` (Chrome trace events: one process per rank, one thread per stream, ``cat`` from
    :data:`~skewlens.replay.streaming.CATEGORIES`, times in µs from the first replayed start, which
    ``otherData.t0_ns`` keeps), streamed a chunk at a time. At most ``max_events`` nodes (0: all): beyond
    that, the first whole steps on all ranks that fit (see :func:`skewlens.replay.streaming.cap_events`); what
    was left out is in ``otherData``, in an instant event where the trace stops, and given to ``on_note``.
    ``idle_streams`` (rank -> its GPU compute stream, as the replay's summary picks it): a track more per such
    rank, its idle time on the replayed times by what it waited for
    (:func:`~skewlens.replay.streaming.gpu_idle_events`)."""
    p = Path(path)
    ranks = sorted(run.ranks)
    cap = cap_events(
        {r: run.ranks[r].node_type != NodeType.METADATA for r in ranks},
        res.start_ns,
        {r: run.ranks[r].step for r in ranks},
        max_events=max_events,
        file=p.name,
        option=f"{MAX_EVENTS_KEY}=0",
    )
    names = {r: tuple(json.dumps(n) for n in run.ranks[r].names) for r in ranks}
    # times are µs from the first replayed start (otherData.t0_ns): absolute ns as µs doubles lose precision
    written = {r: run.ranks[r].node_type != NodeType.METADATA for r in ranks}
    t0 = min((int(res.start_ns[r][k].min()) for r, k in written.items() if k.any()), default=0)
    waits = replayed_waits(run, res)
    # a track per stream (tid: the stream), and one more per lane of slices that partly overlap others there
    # (or the wait for peers drawn inside one)
    tracks = {
        r: rank_tracks(
            run.ranks[r],
            written[r],
            start_ns=res.start_ns[r],
            end_ns=res.end_ns[r],
            stream_tid={s: s for s in np.unique(run.ranks[r].stream).tolist()},
            pg_names=run.pg_names,
            wait_ns=waits[r],
        )
        for r in ranks
    }

    em = execution_model(run)
    cats = {r: rank_categories(run.ranks[r], em.ranks[r]) for r in ranks}
    # each rank's replayed steps, on a track of their own (as in the analysis's trace)
    spans = StepSpans.of((r, k, a, b) for (r, k), (a, b) in res.step_spans().items())
    steps_kept = spans.kept(cap)
    step_ranks = set(spans.rank[steps_kept].tolist())
    idle: dict[int, IdleStretches] = {}
    idle_tid: dict[int, int] = {}
    for r, sid in sorted((idle_streams or {}).items()):
        first = int(res.start_ns[r][written[r]].min()) if written[r].any() else None  # the rank's start
        found = idle_stretches(
            run.ranks[r], em.ranks[r], start=res.start_ns[r], end=res.end_ns[r], from_ns=first, stream=sid
        )
        if found:
            idle[r] = found[0]
            idle_tid[r] = max(tracks[r].names, default=0) + 1

    def fmt(job: RankRows) -> pa.Array:
        """The events of a chunk's ranks, one rank after another (their names tables likewise)."""
        table: list[str] = []
        name_idx, cat, pid, tid, st, en, node_id, step = [], [], [], [], [], [], [], []
        for r, rows in job:
            rt = run.ranks[r]
            name_idx.append(rt.name_idx[rows] + len(table))
            cat.append(cats[r][rows])
            table += names[r]
            pid.append(np.full(len(rows), r, dtype=np.int64))
            tid.append(tracks[r].tids(rt.stream, rows))
            st.append(res.start_ns[r][rows])
            en.append(res.end_ns[r][rows])
            node_id.append(rt.node_id[rows])
            step.append(rt.step[rows])
        s, e = np.concatenate(st), np.concatenate(en)
        fields: list[tuple[str, Value]] = [
            ("name", Lookup(tuple(table), np.concatenate(name_idx))),
            ("ph", '"X"'),
            ("cat", Lookup(CATEGORY_JSON, np.concatenate(cat))),
            ("pid", json_int(np.concatenate(pid))),
            ("tid", json_int(np.concatenate(tid))),
            ("ts", json_fixed(s - t0, 3)),
            ("dur", json_fixed(e - s, 3)),
            (
                "args",
                [("node_id", json_int(np.concatenate(node_id))), ("step", json_int(np.concatenate(step)))],
            ),
        ]
        return format_events(fields, len(s))

    def metadata() -> Iterator[dict[str, Any]]:
        for r in ranks:
            proc = (
                f"rank {r} (copy of captured rank {run.source_rank(r)})" if run.source_ranks else f"rank {r}"
            )
            yield from process_metadata(r, proc)
            if r in step_ranks:
                yield from steps_track_metadata(r)
            for t, label in tracks[r].used_names(run.ranks[r].stream, cap.keep[r]).items():
                yield {"name": "thread_name", "ph": "M", "pid": r, "tid": t, "args": {"name": label}}
            if r in idle and cap.keep[r][idle[r].before].any():
                label = idle_track_name(idle[r].stream)
                yield {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": r,
                    "tid": idle_tid[r],
                    "args": {"name": label},
                }

    return write_trace(
        p,
        cap,
        other_data={
            "t0_ns": t0,
            "run_dir": str(Path(run.run_dir).resolve()),  # as config.yaml's trace: the same wherever run from
            # an extrapolated run's ranks are in no run directory: the loader says so, given this file
            **({TIMELINE_SCALED_RANKS: run.world_size} if SCALE_NOTE in run.manifest.notes else {}),
        },
        metadata=metadata(),
        jobs=rank_chunks(cap),
        fmt=fmt,
        extra=lambda: itertools.chain(
            spans.events(steps_kept, t0),
            wait_events(
                cap.keep,
                res.start_ns,
                waits,
                tid=lambda r, rows: tracks[r].tids(run.ranks[r].stream, rows),
                origin_ns=t0,
                traces=run.ranks,
            ),
            gpu_idle_events(idle, cap.keep, tid=idle_tid, origin_ns=t0, traces=run.ranks),
        ),
        end_ns=res.end_ns,
        origin_ns=t0,
        workers=workers,
        on_note=on_note,
    )
