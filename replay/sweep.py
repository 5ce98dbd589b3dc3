"""Multirun sweeps: a :class:`~skewlens.replay.outputs.SweepRecord` per job in ``<sweep dir>/sweep.parquet``.

A sweep's jobs may run one after another in this process (Hydra's basic launcher), in parallel worker
processes on this machine (``hydra/launcher=joblib``) or as cluster jobs (``hydra/launcher=submitit_slurm``,
``ray``): every job writes only files of its own, so none has to share a table with another while they
run. Its output directory is ``<sweep dir>/<job number>``; its row of the comparison table, or the
one-line error that stopped it, goes to ``<sweep dir>/.jobs/`` (:data:`JOBS_DIR`). :class:`SweepSummary`,
a Hydra callback that runs in the process that launched the sweep, clears ``.jobs/``, an earlier sweep's
``sweep.parquet`` and its jobs' outputs before the first job and, when the last one has ended, gathers the
rows into ``sweep.parquet``, prints the comparison table, draws it (``sweep.png``: step time against the
swept value, :func:`skewlens.replay.plots.sweep_plot`) and names every job that failed, with its
overrides; then the command exits with status 2. An interrupted sweep writes no ``sweep.parquet``: the
command names the jobs that finished and where their outputs and rows are (:func:`interrupted`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.conf import HydraConf
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from skewlens.console import print_stderr, report_console
from skewlens.profiler.atomic import lock_directory, remove_abandoned, write_text_atomic
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store.issues import first_named, rank_ranges
from skewlens.profiler.store.schema import arrow_schema, read_table, table_from_records, write_table
from skewlens.replay.errors import missing_value
from skewlens.replay.outputs import (
    CONFIG_YAML,
    REAL_RUN_DIR,
    REAL_WORK_DIR,
    SUMMARY_PARQUET,
    SWEEP_PARQUET,
    SWEEP_PNG,
    TIMELINE_JSON,
    TIMELINE_PARQUET,
    SweepRecord,
    distinct_overrides,
    sweep_parquet_table,
)
from skewlens.replay.plots import sweep_plot
from skewlens.replay.render import sweep_table

#: Folder of the sweep directory where each job leaves its row (``<job>.parquet``) or error (``<job>.error``).
JOBS_DIR = ".jobs"
ROW_SUFFIX = ".parquet"
ERROR_SUFFIX = ".error"
#: Exit status of a sweep in which a job failed (as for any other bad input to ``skewlens replay``).
FAILED_EXIT = 2


def read_sweep(path: Path) -> list[SweepRecord]:
    """Rows of a ``sweep.parquet`` (or of one job's row file): its :class:`SweepRecord` columns (not the
    swept settings' columns after them, whose values are in each row's ``overrides``)."""
    tbl = read_table(path, SweepRecord)
    return [SweepRecord(**row) for row in tbl.select(arrow_schema(SweepRecord).names).to_pylist()]


def job_sweep_dir(hc: HydraConf) -> Path:
    """In a multirun job, with Hydra's config ``hc``: the sweep's directory, a relative one taken from where
    the sweep was launched. Under ``hydra.job.chdir=true`` a job runs in its own directory, where the
    relative path had put its row in ``SWEEP/<job>/SWEEP/.jobs/``, which the summary never read."""
    return Path(str(hc.runtime.cwd)) / str(hc.sweep.dir)


def _job_file(sweep_dir: Path, job: int, suffix: str) -> Path:
    return sweep_dir / JOBS_DIR / f"{job}{suffix}"


def append_sweep_row(sweep_dir: Path, row: SweepRecord) -> Path:
    """Record one finished job's row (its own file: jobs may run at the same time); returns the file.

    :func:`collect_sweep` gathers the rows into ``sweep.parquet`` when the sweep ends.
    """
    _job_file(sweep_dir, row.job, ERROR_SUFFIX).unlink(missing_ok=True)
    return write_table(
        table_from_records(SweepRecord, [row], "sweep"), _job_file(sweep_dir, row.job, ROW_SUFFIX)
    )


def record_failure(error: SkewlensError) -> bool:
    """In a multirun job: record why it failed (its overrides and the one-line error) for the sweep's
    summary, and return True; outside a multirun (a single run): False, the caller reports the error."""
    if not HydraConfig.initialized():
        return False
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return False
    sweep_dir, job = job_sweep_dir(hc), int(hc.job.num)
    _job_file(sweep_dir, job, ROW_SUFFIX).unlink(missing_ok=True)
    overrides = " ".join(hc.overrides.task)
    write_text_atomic(_job_file(sweep_dir, job, ERROR_SUFFIX), f"{overrides}\n{error}\n")
    return True


def _job_number(path: Path) -> int:
    return int(path.name.removesuffix(path.suffix))


def _job_records(sweep_dir: Path) -> tuple[list[SweepRecord], dict[int, tuple[str, str]]]:
    """The rows the finished jobs of the sweep into ``sweep_dir`` recorded in ``.jobs/``, by job number, and
    its failed jobs (job number -> (overrides, error)): what :func:`collect_sweep` writes the table of, and
    what an interrupted sweep names (:func:`interrupted`)."""
    jobs = sweep_dir / JOBS_DIR
    rows = sorted((r for p in jobs.glob(f"*{ROW_SUFFIX}") for r in read_sweep(p)), key=lambda r: r.job)
    failed: dict[int, tuple[str, str]] = {}
    for p in sorted(jobs.glob(f"*{ERROR_SUFFIX}"), key=_job_number):
        overrides, _, message = p.read_text(encoding="utf-8").partition("\n")
        failed[_job_number(p)] = (overrides, message.strip())
    return rows, failed


def collect_sweep(sweep_dir: Path) -> tuple[list[SweepRecord], dict[int, tuple[str, str]]]:
    """The finished jobs' rows, written to ``sweep_dir/sweep.parquet`` (by job number, with a column per
    swept setting: :func:`~skewlens.replay.outputs.sweep_parquet_table`), and the failed jobs
    (job number -> (overrides, error)). No ``sweep.parquet`` is written when no job finished (an earlier
    sweep's was removed when this one began: :func:`clear_earlier_sweep`)."""
    rows, failed = _job_records(sweep_dir)
    if rows:
        failed_overrides = [o for o, _m in failed.values()]
        write_table(sweep_parquet_table(rows, failed_overrides), sweep_dir / SWEEP_PARQUET)
    return rows, failed


def _is_job_dir(path: Path, sweep_dir: Path) -> bool:
    """Whether ``path`` is a job directory a sweep into ``sweep_dir`` wrote: it holds a replay's
    ``config.yaml`` whose ``out`` is ``sweep_dir`` (a job's is its sweep's), or, as an older skewlens's
    jobs were found, it is named by a number and holds a replay's ``config.yaml``."""
    try:
        conf = yaml.safe_load((path / CONFIG_YAML).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    if not (isinstance(conf, dict) and "trace" in conf and "mode" in conf):
        return False
    if path.name.isdigit():
        return True
    out = conf.get("out")
    return isinstance(out, str) and Path(out).is_absolute() and Path(out).resolve() == sweep_dir.resolve()


def _earlier_job_dirs(sweep_dir: Path) -> Iterator[tuple[Path, bool]]:
    """The directories under ``sweep_dir`` an earlier sweep's jobs may have written, each with whether it
    is a job directory (:func:`_is_job_dir`), their stale staging directories removed (the job's own,
    which a job killed before it moved its outputs in left, unless a running job holds it:
    :func:`~skewlens.profiler.atomic.remove_abandoned`): each directory of ``sweep_dir``, and those below
    one whose name holds ``=`` (``hydra.sweep.subdir=${hydra.job.override_dirname}`` names a job
    ``slowdown.factor=2.0,topology=ring``, and a value with a ``/`` in it nests it: ``trace=/data/runs/a``
    is ``.../trace=/data/runs/a/``), down to a job directory. Hidden ones (``.jobs``, ``.submitit``) are
    passed over."""
    stack = [(sweep_dir, False)]
    while stack:
        parent, named = stack.pop()
        with contextlib.suppress(OSError):  # gone or unreadable: nothing of a sweep's to clear there
            for d in sorted(parent.iterdir()):
                if d.name.startswith(".") or d.is_symlink() or not d.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    remove_abandoned(d, out_name=d.name)
                job = _is_job_dir(d, sweep_dir)
                yield d, job
                if (named or "=" in d.name) and not job:
                    stack.append((d, True))


def clear_earlier_sweep(sweep_dir: Path) -> None:
    """Remove what an earlier sweep into ``sweep_dir`` wrote, before this one runs: its job records
    (``.jobs/``), its ``sweep.parquet`` and ``sweep.png`` and, in each of its job directories
    (:func:`_is_job_dir`, whatever ``hydra.sweep.subdir`` named them), the replay's outputs and the staging
    directories of a job killed while it wrote them (the directory too, when that empties it). Otherwise a
    sweep of fewer points, or a point that fails, left an earlier sweep's timelines beside this one's
    table. Files of other names are left alone."""
    if not sweep_dir.is_dir():
        return
    jobs = sweep_dir / JOBS_DIR
    for p in [*jobs.glob(f"*{ROW_SUFFIX}"), *jobs.glob(f"*{ERROR_SUFFIX}")]:
        p.unlink(missing_ok=True)  # gone since the listing: not this sweep's to say
    (sweep_dir / SWEEP_PARQUET).unlink(missing_ok=True)
    (sweep_dir / SWEEP_PNG).unlink(missing_ok=True)
    dirs = list(_earlier_job_dirs(sweep_dir))  # each directory's parents before it
    for job_dir in (d for d, job in dirs if job):
        for name in (TIMELINE_PARQUET, SUMMARY_PARQUET, TIMELINE_JSON, CONFIG_YAML):
            (job_dir / name).unlink(missing_ok=True)
        for name in (REAL_RUN_DIR, REAL_WORK_DIR):
            shutil.rmtree(job_dir / name, ignore_errors=True)
    for job_dir, _job in reversed(dirs):
        with contextlib.suppress(OSError):
            job_dir.rmdir()  # emptied (deepest first: a nested job's parents too), else left


def hold_sweep(sweep_dir: Path) -> int | None:
    """Take ``sweep_dir``'s ``.jobs/`` (made if missing) for this sweep, for as long as the returned file
    descriptor is open (an exclusive ``flock``, released when the process ends however it ends), so that
    a second sweep into the same directory is refused while this one runs (a :class:`SkewlensError`):
    one's clear removed the other's rows and job outputs as they were written, and its gather took the
    other's rows into its table (or read a row file the other's clear had just removed, and printed no
    table, exiting 0). None where the directory cannot be made or opened (the jobs then say why they cannot
    write there) or the file system cannot lock (some network ones): the sweep runs unlocked."""
    jobs = sweep_dir / JOBS_DIR
    try:
        jobs.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    try:
        return lock_directory(jobs, wait=False)
    except BlockingIOError:
        raise SkewlensError(
            f"{sweep_dir}: another sweep into it is running (it holds {jobs} locked); give this one an "
            "out= of its own, or run it when that one has ended"
        ) from None


def shared_out_dirs(rows: list[SweepRecord]) -> dict[str, list[int]]:
    """The directories two or more finished jobs replayed into (``hydra.sweep.subdir=${topology.name}`` in
    a sweep of ``slowdown.factor``), each with its jobs: one job's outputs replace the other's, and the
    table's rows name one directory for both, which holds the last job's figures. Every other job's is its
    own."""
    by_dir: dict[str, list[int]] = {}
    for r in rows:
        by_dir.setdefault(r.out_dir, []).append(r.job)
    return {d: jobs for d, jobs in by_dir.items() if len(jobs) > 1}


def _fail(message: str) -> NoReturn:
    """End the sweep with ``message`` as skewlens replay's one-line error and :data:`FAILED_EXIT`: by
    ``SystemExit``, as Hydra turns a callback's exception into a two-line ``UserWarning`` and exit code 0."""
    print_stderr(f"skewlens replay: error: {message}")
    sys.exit(FAILED_EXIT)


@dataclasses.dataclass(frozen=True, eq=False)
class _Running:
    """The sweep this process launched, from when its earlier sweep's records were cleared until it ends."""

    sweep_dir: Path
    jobs: int | None
    """How many jobs it runs; None where that is not known (a sweeper other than Hydra's basic one)."""
    held: int | None
    """The lock of its ``.jobs/`` (:func:`hold_sweep`)."""


#: The sweep running in this process (at most one): what an interrupt's message reads (:func:`interrupted`).
_RUNNING: list[_Running] = []


def sweep_size(config: DictConfig) -> int | None:
    """How many jobs the sweep of ``config`` (a multirun's) runs, as Hydra's basic sweeper makes them of
    ``hydra.sweeper.params`` and the command line's overrides (the product of each key's values, a glob
    of a group's entries as it matches); None for another sweeper, or overrides it would refuse."""
    basic = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
    if OmegaConf.select(config, "hydra.sweeper._target_") != basic:
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
    try:
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        return sum(len(batch) for batch in BasicSweeper.split_arguments(parser.parse_overrides(lines), None))
    except Exception:  # Hydra's sweeper refuses it, with its own message, when the sweep runs
        return None


def end_sweep(sweep: _Running | None = None) -> None:
    """Release ``sweep``, else every one this process runs (:data:`_RUNNING`), however it ended: an
    interrupted one's ``.jobs/`` stayed locked while the process lived, and a second sweep into it from
    the same process was refused as another one running."""
    for s in [sweep] if sweep is not None else list(_RUNNING):
        if s in _RUNNING:
            _RUNNING.remove(s)
            if s.held is not None:
                os.close(s.held)


def _jobs(numbers: list[int]) -> str:
    """``job 3``, ``jobs 0-2, 5`` (ranges, then how many more)."""
    return f"job{'s' if len(numbers) > 1 else ''} {rank_ranges(numbers)}"


def interrupted() -> str | None:
    """What an interrupt (Ctrl-C, SIGTERM) of the sweep this process runs leaves, for the command to say
    after ``interrupted``; None outside a sweep, or before its earlier sweep's records were cleared (the
    rows in ``.jobs/`` may then be that one's). A job is finished where its row is in ``.jobs/``: a job
    writes it once its outputs are whole in its directory; an interrupted job's outputs are not there (its
    staging directory is removed) and neither is its row. No ``sweep.parquet`` is written: a table of some
    jobs would read as the whole sweep. A second interrupt while the rows are read says where they are."""
    if not _RUNNING:
        return None
    sweep = _RUNNING[-1]
    jobs = sweep.sweep_dir / JOBS_DIR
    again = "run the sweep again to get sweep.parquet"
    try:
        rows, errors = _job_records(sweep.sweep_dir)
    except KeyboardInterrupt:
        return f"(again while it read its finished jobs' rows): they are in {jobs}/; {again}"
    except (OSError, UnicodeDecodeError, SkewlensError) as e:
        return f"(its finished jobs' rows are in {jobs}/, unread: {e}); {again}"
    of = "" if sweep.jobs is None else f" of {sweep.jobs}"
    said = f"after {len(rows)}{of} sweep jobs finished"
    failed = list(errors)
    if rows:
        dirs = list(dict.fromkeys(r.out_dir for r in rows))  # jobs that share one directory: named once
        said += (
            f" ({_jobs([r.job for r in rows])}); their outputs are in {first_named(dirs)}; their rows in "
            f"{jobs}/"
        )
    if failed:
        said += (
            f"; {len(failed)} failed ({_jobs(failed)}: see "
            f"{first_named(_job_file(sweep.sweep_dir, j, ERROR_SUFFIX) for j in failed)})"
        )
    return f"{said} ({again})" if rows or failed else f"{said}; {again}"


class SweepSummary(Callback):
    """Clears the job records before a multirun; at its end writes ``sweep.parquet`` and ``sweep.png``,
    prints the comparison table and the failed jobs, and exits with status 2 if any job failed. The sweep
    directory is held (:func:`hold_sweep`) from before the clear until the table is written. An interrupted
    sweep writes no table: the command says which jobs finished (:func:`interrupted`)."""

    def __init__(self) -> None:
        self._running: _Running | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        del kwargs
        if OmegaConf.is_missing(config, "out"):
            # the sweep's directory follows out, else ".": an earlier sweep's outputs there were cleared, and
            # each job failed on the missing out
            _fail(missing_value("out"))
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            held = hold_sweep(sweep_dir)
        except SkewlensError as e:
            _fail(str(e))
        try:
            clear_earlier_sweep(sweep_dir)
        except BaseException:
            if held is not None:
                os.close(held)
            raise
        self._running = _Running(sweep_dir, sweep_size(config), held)
        _RUNNING.append(self._running)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        del kwargs
        try:
            self._summarise(Path(str(config.hydra.sweep.dir)))
        except SkewlensError as e:
            _fail(str(e))
        finally:
            if self._running is not None:
                end_sweep(self._running)  # releases the sweep directory
                self._running = None

    def _summarise(self, sweep_dir: Path) -> None:
        rows, failed = collect_sweep(sweep_dir)
        if rows:
            console = report_console()
            console.print(sweep_table(rows, [o for o, _m in failed.values()]))
            console.print(f"sweep table: {sweep_dir / SWEEP_PARQUET}")
            if len(rows) >= 2:
                console.print(f"sweep plot: {sweep_plot(rows, sweep_dir / SWEEP_PNG, failed=len(failed))}")
            else:  # said: a sweep of 3 points, 2 of them failed, ended with no sweep.png and no word of it
                console.print(f"sweep plot: none ({SWEEP_PNG} draws two or more finished jobs; 1 finished)")
        if not rows and not failed:  # Hydra launches nothing, silently, for a glob that matches nothing
            _fail(
                "the sweep has no jobs: its overrides give no point (a glob(...) that matches no entry of "
                "its group, an empty range(...)?)"
            )
        shared = shared_out_dirs(rows)
        if not failed and not shared:
            return
        # name each failed job by what sets it apart (as the comparison table does), else by every override
        own = distinct_overrides([r.overrides for r in rows] + [o for o, _m in failed.values()])
        for (job, (overrides, message)), mine in zip(failed.items(), own[len(rows) :], strict=True):
            # through printable, as the dispatcher's: a message may quote a trace's names
            print_stderr(f"skewlens replay: error: sweep job {job} ({mine or overrides}): {message}")
        apart = {r.job: mine or r.overrides for r, mine in zip(rows, own, strict=False)}
        for out_dir, jobs in shared.items():
            print_stderr(
                f"skewlens replay: error: sweep jobs {', '.join(map(str, jobs))} "
                f"({'; '.join(apart[j] for j in jobs)}) each replayed into {out_dir}, which holds the last "
                "one's outputs only: hydra.sweep.subdir names their directories the same; give it a name "
                "that differs per job (${hydra.job.num}, the default, or ${hydra.job.override_dirname})"
            )
        if not failed:
            sys.exit(FAILED_EXIT)
        where = f"the others' outputs are in {sweep_dir}" if rows else "none wrote outputs"
        print_stderr(
            f"skewlens replay: {len(failed)} of {len(failed) + len(rows)} sweep jobs failed; {where}"
        )
        # SystemExit, not an exception: Hydra would print an exception raised here with a traceback
        sys.exit(FAILED_EXIT)
