"""Replay outputs: timeline/summary Parquet, ``timeline.json`` (Chrome/Perfetto) and ``config.yaml``.

Tables are described by record dataclasses and written atomically through ``skewlens.profiler.store.schema``.
The Perfetto JSON has one process per rank and one thread per stream; times are µs floats at that edge.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.schema import NodeRecord, table_from_columns, write_records, write_table
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.simulate import SimResult
from skewlens.replay.summary import SummaryRecord

TIMELINE_PARQUET = "timeline.parquet"
SUMMARY_PARQUET = "summary.parquet"
TIMELINE_JSON = "timeline.json"
CONFIG_YAML = "config.yaml"
SWEEP_PARQUET = "sweep.parquet"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayedNodeRecord(NodeRecord):
    """One row of ``timeline.parquet``: a trace node (the store's node columns) with its replayed times."""

    replay_start_ns: int
    """Replayed start, ns."""
    replay_end_ns: int
    """Replayed end, ns."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRecord:
    """One row of ``sweep.parquet``: one job of a multirun sweep."""

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
    """Replayed makespan, ns."""
    mean_step_ns: int
    """Mean replayed step time over steps, ns."""
    max_step_ns: int
    """Longest replayed step, ns."""
    out_dir: str
    """The job's output directory."""


def _names(values: Iterable[int], enum: type[NodeType] | type[CommType]) -> list[str]:
    return [enum(v).name for v in values]


def write_timeline(run: RunTrace, res: SimResult, path: Path) -> Path:
    """Write ``timeline.parquet`` (one row per node, column arrays: fine for millions of rows)."""
    cols: dict[str, list[np.ndarray]] = {}
    names: list[str] = []
    types: list[str] = []
    comm: list[str | None] = []
    pgs: list[str | None] = []
    for r in sorted(run.ranks):
        rt = run.ranks[r]
        n = len(rt)
        part = {
            "rank": np.full(n, r, dtype=np.int64),
            "node_id": rt.node_id,
            "start_ns": rt.start_ns,
            "dur_ns": rt.dur_ns,
            "stream": rt.stream,
            "step": rt.step.astype(np.int64),
            "is_cpu_op": rt.is_cpu,
            "comm_bytes": rt.comm_bytes,
            "seq": rt.seq,
            "src": rt.src.astype(np.int64),
            "dst": rt.dst.astype(np.int64),
            "tag": rt.tag,
            "replay_start_ns": res.start_ns[r],
            "replay_end_ns": res.end_ns[r],
        }
        for k, v in part.items():
            cols.setdefault(k, []).append(v)
        names.extend(np.asarray(rt.names, dtype=object)[rt.name_idx].tolist() if n else [])
        type_names = {int(t): NodeType(int(t)).name for t in np.unique(rt.node_type)}
        types.extend(type_names[int(t)] for t in rt.node_type.tolist())
        comm.extend(CommType(int(c)).name if c >= 0 else None for c in rt.comm_type.tolist())
        pgs.extend(run.pg_names[g] if g >= 0 else None for g in rt.pg.tolist())
    merged: dict[str, object] = {k: np.concatenate(v) for k, v in cols.items()}
    merged.update(name=names, type=types, comm_type=comm, pg_name=pgs)
    return write_table(table_from_columns(ReplayedNodeRecord, merged, "timeline"), path)


def write_summary(rows: list[SummaryRecord], path: Path) -> Path:
    """Write ``summary.parquet``."""
    return write_records(SummaryRecord, rows, path, "summary")


def _atomic_text(path: Path, write: Callable[[TextIO], object]) -> Path:
    with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        write(fh)
    return path


def write_text(path: Path, text: str) -> Path:
    """Write a text file atomically."""
    return _atomic_text(path, lambda fh: fh.write(text))


def write_perfetto(run: RunTrace, res: SimResult, path: Path) -> Path:
    """Write ``timeline.json``: Chrome trace events, one process per rank, one thread per stream."""

    def emit(fh: TextIO) -> None:
        w = fh.write
        w('{"displayTimeUnit":"ns","traceEvents":[\n')
        first = True
        for r in sorted(run.ranks):
            rt = run.ranks[r]
            meta = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}}]
            for s in np.unique(rt.stream).tolist():
                label = rt.streams.get(int(s), f"stream {s}")
                meta.append(
                    {"name": "thread_name", "ph": "M", "pid": r, "tid": int(s), "args": {"name": label}}
                )
            for m in meta:
                w(("" if first else ",\n") + json.dumps(m))
                first = False
            st = res.start_ns[r]
            en = res.end_ns[r]
            keep = np.flatnonzero(rt.node_type != NodeType.METADATA)
            for i in keep.tolist():
                ev = {
                    "name": rt.names[int(rt.name_idx[i])],
                    "ph": "X",
                    "pid": r,
                    "tid": int(rt.stream[i]),
                    "ts": int(st[i]) / 1000.0,
                    "dur": int(en[i] - st[i]) / 1000.0,
                    "args": {"node_id": int(rt.node_id[i]), "step": int(rt.step[i])},
                }
                w(",\n" + json.dumps(ev))
        w("\n]}\n")

    return _atomic_text(path, emit)
