"""Multirun sweeps: one :class:`~skewlens.replay.outputs.SweepRecord` per job in ``<sweep
dir>/sweep.parquet``.

Jobs run one after another (Hydra's basic launcher); each appends its row by rewriting the table
atomically. :class:`SweepSummary` is a Hydra callback that prints the comparison table when the sweep ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console

from skewlens.profiler.store.schema import read_table, table_from_records, write_table
from skewlens.replay.outputs import SWEEP_PARQUET, SweepRecord
from skewlens.replay.render import sweep_table


def read_sweep(path: Path) -> list[SweepRecord]:
    """Rows of a ``sweep.parquet``."""
    tbl = read_table(path, SweepRecord)
    return [SweepRecord(**row) for row in tbl.to_pylist()]


def append_sweep_row(sweep_dir: Path, row: SweepRecord) -> Path:
    """Add (or replace, by job number) one row of ``sweep_dir/sweep.parquet``."""
    path = sweep_dir / SWEEP_PARQUET
    rows = [r for r in read_sweep(path) if r.job != row.job] if path.exists() else []
    rows.append(row)
    rows.sort(key=lambda r: r.job)
    return write_table(table_from_records(SweepRecord, rows, "sweep"), path)


class SweepSummary(Callback):
    """Prints the sweep's comparison table at the end of a multirun."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        del kwargs
        path = Path(str(config.hydra.sweep.dir)) / SWEEP_PARQUET
        if path.exists():
            Console().print(sweep_table(read_sweep(path)))
            Console().print(f"sweep table: {path}")
