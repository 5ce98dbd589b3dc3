"""The replay's pictures: ``sweep.png``, the replayed step time of each job of a sweep."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skewlens.pictures import figure_class, save_png
from skewlens.replay.outputs import (
    GBPS_NOTE,
    SweepRecord,
    distinct_overrides,
    setting_numbers,
    setting_unit,
    swept_settings,
)

#: Most labelled bars of a sweep of many jobs (one in every ``ceil(jobs / _MAX_LABELS)``).
_MAX_LABELS = 40


@dataclass(frozen=True, slots=True)
class SweepPoints:
    """What :func:`sweep_plot` draws: one point per finished job, in drawing order."""

    jobs: tuple[SweepRecord, ...]
    """The jobs, by ``x`` where there is one, else by job number."""
    labels: tuple[str, ...]
    """Each job's overrides that set it apart from the others."""
    key: str | None
    """The one setting the jobs differ in, where they differ in one only and its values are numbers: the
    x axis; None: one bar per job."""
    x: tuple[float, ...]
    """The value of ``key`` of each job (empty without ``key``)."""


def sweep_points(rows: Sequence[SweepRecord]) -> SweepPoints:
    """The points of a sweep's picture: a line over the swept value where the jobs differ in one setting,
    each job by its value of it, and its values are numbers (``-m slowdown.factor=1,1.5,2``), else a bar per
    job labelled with what sets it apart. The setting and its values are ``sweep.parquet``'s
    (:func:`~skewlens.replay.outputs.swept_settings`, :func:`~skewlens.replay.outputs.setting_numbers`): a
    numeric axis here is a number column there."""
    jobs = sorted(rows, key=lambda r: r.job)
    overrides = [r.overrides for r in jobs]
    labels = distinct_overrides(overrides)
    settings = swept_settings(overrides)
    if len(jobs) >= 2 and len(settings) == 1 and all(len(label.split()) == 1 for label in labels):
        ((key, values),) = settings.items()
        numbers = setting_numbers(values)
        if numbers is not None and all(v is not None for v in numbers):
            x = [float(v) for v in numbers if v is not None]
            order = sorted(range(len(jobs)), key=lambda k: (x[k], jobs[k].job))
            return SweepPoints(
                jobs=tuple(jobs[k] for k in order),
                labels=tuple(labels[k] for k in order),
                key=key,
                x=tuple(x[k] for k in order),
            )
    return SweepPoints(jobs=tuple(jobs), labels=tuple(labels), key=None, x=())


#: The swept values' span (largest over smallest positive) from which the x axis is logarithmic: a
#: bandwidth sweep doubling from 6.25 to 200 GB/s crowded four of its six points into the left quarter.
LOG_SPAN = 10.0
#: Most swept values each given a tick of its own on a logarithmic axis (else matplotlib's decades).
_MAX_VALUE_TICKS = 12


def setting_label(key: str) -> str:
    """The axis label of the swept setting ``key``: the key and its unit (:func:`setting_unit`), GB/s said
    in words (``bandwidth_gbps`` reads as gigabits a second, 8x less than the model takes it)."""
    unit = setting_unit(key)
    if unit is None:
        return key
    return f"{key} ({GBPS_NOTE})" if unit == "GB/s" else f"{key} ({unit})"


def _scale_x(ax: Any, x: Sequence[float]) -> None:
    """A logarithmic x axis where the positive values ``x`` span :data:`LOG_SPAN` or more (symmetric-log,
    linear up to the smallest positive value, where some are 0 or negative), ticked at the values."""
    positive = [v for v in x if v > 0]
    if len(positive) < 2 or max(positive) / min(positive) < LOG_SPAN:
        return
    if len(positive) == len(x):
        ax.set_xscale("log")
    else:
        ax.set_xscale("symlog", linthresh=min(positive))
    values = sorted(set(x))
    if len(values) <= _MAX_VALUE_TICKS:
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()


#: What the sweep picture's step times are, on its axis: a step of the job lasts as long as its slowest rank
#: (:attr:`SweepRecord.mean_step_ns`, ``max_step_ns``).
STEP_TIME_AXIS = "replayed step time, ms (each step's slowest rank)"


def sweep_plot(rows: Sequence[SweepRecord], path: Path, *, failed: int = 0) -> Path:
    """Draw a sweep's replayed step times (the mean over steps and the longest, each step's time its slowest
    rank's, ms) to ``path``; ``failed``: how many of the sweep's jobs failed (the title says so)."""
    return save_png(sweep_figure(rows, failed=failed), path)


def sweep_figure(rows: Sequence[SweepRecord], *, failed: int = 0) -> Any:
    """The figure of :func:`sweep_plot`: a line per step time against one numeric setting, else a bar per
    job; the legend above the axes (inside, it covered the last job's longest-step marker); the title counts
    the jobs drawn, of how many where ``failed`` did not finish."""
    pts = sweep_points(rows)
    mean = [r.mean_step_ns / 1e6 for r in pts.jobs]
    longest = [r.max_step_ns / 1e6 for r in pts.jobs]
    if pts.key is not None:
        fig = figure_class()(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot(pts.x, mean, marker="o", label="mean step")
        ax.plot(pts.x, longest, marker="^", linestyle="--", label="longest step")
        ax.set_xlabel(setting_label(pts.key))
        _scale_x(ax, pts.x)
        ax.set_ylabel(STEP_TIME_AXIS)
        ax.set_ylim(bottom=0)
    else:
        n = len(pts.jobs)
        fig = figure_class()(figsize=(7, min(2 + 0.4 * n, 18)))
        ax = fig.subplots()
        pos = list(range(n))
        ax.barh(pos, mean, label="mean step")
        ax.scatter(longest, pos, marker="|", s=200, color="black", label="longest step", zorder=3)
        every = -(-n // _MAX_LABELS)  # at most about _MAX_LABELS labels; every bar is drawn
        ax.set_yticks(
            pos[::every],
            [f"{r.job}: {label or '(as given)'}" for r, label in zip(pts.jobs, pts.labels, strict=True)][
                ::every
            ],
        )
        ax.invert_yaxis()
        ax.set_xlabel(STEP_TIME_AXIS)
        ax.set_xlim(left=0)
    # above the axes, under the title: it covers no point (the picture is cropped to what is drawn)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, frameon=False, borderaxespad=0.2)
    n = len(pts.jobs)
    jobs = f"{n} of {n + failed} jobs ({failed} failed)" if failed else f"{n} jobs"
    ax.set_title(f"Replay sweep: {jobs}", pad=26)
    return fig
