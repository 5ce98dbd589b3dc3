"""PNG pictures of an analysis (matplotlib, Agg backend, no display): wait heatmap, step breakdown bars,
GPU idle bars."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from skewlens.analysis.api import GPU_IDLE_FILE as GPU_IDLE_TABLE
from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.breakdown import MEAN_PARTS, rank_means
from skewlens.analysis.gpu_idle import PARTS, compute_streams, most_idle, verdict
from skewlens.analysis.render import (
    MAX_RANK_ROWS,
    blame_steps,
    caused_wait_in_steps,
    outliers_note,
    ranks_left_out,
)
from skewlens.pictures import figure_class, save_png
from skewlens.profiler.store.issues import ms_text, no_trace_line

WAIT_HEATMAP_FILE = "wait_heatmap.png"
BREAKDOWN_FILE = "step_breakdown.png"
GPU_IDLE_FILE = "gpu_idle.png"
#: Most labelled ticks on an axis of ranks or collectives (every row / column is still drawn).
_MAX_TICKS = 40
#: Largest side of a picture, inches.
_MAX_INCHES = 18
#: Exponent of the wait heatmap's colour scale (a cell's shade is (wait / largest wait) ** it): a square-root
#: scale, so that a wait of 2.5% of the largest is drawn 16% of the way up the colours, not in the colour of
#: no wait.
WAIT_GAMMA = 0.5
#: The step breakdown's bars, bottom to top: compute, exposed wait, exposed transfer, idle. Its colours and
#: :data:`GPU_IDLE_COLOURS` are told apart by colour-blind readers too: every two are 30 or more apart
#: (CIELAB distance) as people with deuteranopia, protanopia or tritanopia see them (Machado et al.'s
#: simulation), from Paul Tol's indigo and wine, Okabe and Ito's orange and sky blue, and a grey. seaborn's,
#: drawn before, were 21 apart (exposed wait's orange, exposed transfer's red) to deuteranopes, and the GPU
#: idle bars' busy blue and stream-wait purple 3 apart to protanopes.
BREAKDOWN_COLOURS = ("#332288", "#E69F00", "#882255", "#BBBBBB")
#: The GPU idle bars, bottom to top: busy, launch wait, comm wait, stream wait, other.
GPU_IDLE_COLOURS = ("#332288", "#56B4E9", "#E69F00", "#882255", "#BBBBBB")


def _rectangle() -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle


def _ticks(n: int) -> list[int]:
    """Positions of at most about :data:`_MAX_TICKS` evenly spaced labels along ``n`` rows or columns."""
    return list(range(0, n, max(n // _MAX_TICKS, 1)))


#: Least space between two labels of the wait heatmap's colour bar, in their height.
_COLOUR_TICK_SPACING = 1.5


def _colour_ticks(top_ms: float, bar_points: float, label_points: float) -> list[float]:
    """The labelled waits of the heatmap's colour bar, ``bar_points`` tall for 0 to ``top_ms`` on the
    square-root scale (:data:`WAIT_GAMMA`), of labels ``label_points`` tall: round values up to ``top_ms``
    (matplotlib's), from 0 up, each :data:`_COLOUR_TICK_SPACING` labels' height or more above the last
    kept. matplotlib's own put a label past the top (40 above a largest wait of 33.06 ms) and drew it over
    the one below it (30), where the scale crowds the large values together: on 2 ranks, whose bar is 1.7
    inches tall."""
    from matplotlib.ticker import MaxNLocator

    kept: list[float] = []
    gap = _COLOUR_TICK_SPACING * label_points
    for t in map(float, MaxNLocator(nbins=5).tick_values(0.0, top_ms)):
        if t < 0 or t > top_ms:
            continue
        at = (t / top_ms) ** WAIT_GAMMA * bar_points
        if not kept or at - (kept[-1] / top_ms) ** WAIT_GAMMA * bar_points >= gap:
            kept.append(t)
    return kept


@dataclass(frozen=True, slots=True)
class HeatmapData:
    """What :func:`wait_heatmap` draws."""

    ranks: npt.NDArray[np.int64]
    """Rows: every rank of the run, ascending."""
    grid: npt.NDArray[np.float64]
    """Wait for peers (ms) of each rank (row) at each collective instance or send/recv pair (column), in
    order of last arrival; NaN where the rank is not a member."""
    labels: list[str]
    """Column labels, as the worst-collectives table names them (``SkewEvent.label``): ``all_reduce 0#3``
    (type, group, sequence number), ``send_recv 0#2 0->1`` (pair index, sender, receiver)."""
    note: str | None
    """What the picture leaves out, or why it has no cells; None when it shows everything."""
    clocks_disagree: npt.NDArray[np.bool_]
    """Per column: a member recorded as done before one it waits for began (``SkewEvent.clock_contradicted``,
    the execution model's :func:`~skewlens.replay.execution.clock_contradictions`): the ranks' clocks
    contradict each other there, and its waits are not meaningful (drawn hatched)."""
    untraced: str | None = None
    """Where ranks of the run have no trace (``126 of 128 ranks have no trace: 2-127``): a member waits for
    its traced peers only (of one traced rank, for none: every cell 0), said in the title; None when all
    are traced."""
    top_ms: float = 1.0
    """The top of the colour scale: the largest wait of the columns not hatched (:attr:`clocks_disagree`;
    of all columns where every one is), 1 ms where none waited (the scale starts at 0, no wait being the
    darkest colour). A hatched wait above it is drawn in the top colour."""
    labelled_rows: tuple[int, ...] = ()
    """Rows whose rank is written beside them: about :data:`_MAX_TICKS` evenly spaced, and always the row of
    the rank the most peer wait is blamed on in the steps (``render.caused_wait_in_steps``), the one a reader
    looks for (of 128 ranks every third was labelled, and the straggler's row, 77, was not); an evenly
    spaced label nearer to it than half their spacing is left out, so that none overlap."""
    blamed: str | None = None
    """The finding, in words, under the title: the rank the most peer wait is blamed on and how much a step
    (``rank 7 made its peers wait the most: 29.755 ms a step``); None where no one waited. The picture said it
    only by a row's colours, which a reader who cannot tell them apart could not read."""

    def shade(self) -> npt.NDArray[np.float64]:
        """Each cell's place on the colour scale, 0 (no wait) to 1 (:attr:`top_ms`), as drawn: on a
        square-root scale (:data:`WAIT_GAMMA`). On a linear one, of 1,024 ranks in 8-rank tensor-parallel
        groups, the 0.26 ms its group's peers waited for a slow rank at every layer was 2.5% of the scale,
        set by the 10.2 ms data-parallel waits: 368 of the 400 columns were drawn in the colour of no wait,
        and the slow rank could not be told from its peers."""
        return np.clip(self.grid / self.top_ms, 0.0, 1.0) ** WAIT_GAMMA


def wait_heatmap_data(result: AnalysisResult, *, max_columns: int = 400) -> HeatmapData:
    """Each rank's wait (ms) at each collective instance and send/recv pair (the sender's and the
    receiver's, as ``collective_skew`` has them), in order of last arrival. Of more than ``max_columns``,
    the collectives first (a column of every member: a pair's is two cells, a dot in a picture of 1,024
    ranks), the worst by exposed wait where they are too many, then the pairs of the most exposed wait in
    the columns left; the note says how many of each were left out."""
    events = list(result.skew.events)
    ranks = np.array(sorted(result.run.ranks), dtype=np.int64)
    note = None
    if not events:
        note = "no collectives or send/recv pairs in this run: no waits for peers to show"
    elif len(events) > max_columns:  # keep the collectives, then the worst pairs, still in time order
        pairs = np.array([e.kind == "p2p" for e in events], dtype=np.bool_)
        worst = np.argsort([-e.total_exposed_wait_ns for e in events], kind="stable")
        keep = np.sort(np.concatenate([worst[~pairs[worst]], worst[pairs[worst]]])[:max_columns])
        n_coll, n_pairs = int((~pairs).sum()), int(pairs.sum())
        kept_coll = int((~pairs[keep]).sum())
        kept_pairs = keep.size - kept_coll
        shown = [
            _all_or(k, n, what)
            for k, n, what in (
                (kept_coll, n_coll, "collective(s)"),
                (kept_pairs, n_pairs, "send/recv pair(s)"),
            )
            if n
        ]
        left = [
            f"{n - k:,} {what}"
            for n, k, what in ((n_coll, kept_coll, "collective(s)"), (n_pairs, kept_pairs, "pair(s)"))
            if n > k
        ]
        note = (
            f"{max_columns:,} of {len(events):,} collectives / send-recv pairs shown: {' and '.join(shown)}; "
            f"{' and '.join(left)} left out"
        )
        events = [events[i] for i in keep.tolist()]
    grid = np.full((ranks.size, len(events)), np.nan)
    for j, e in enumerate(events):
        grid[np.searchsorted(ranks, np.asarray(e.ranks, dtype=np.int64)), j] = e.wait_ns / 1e6
    missing = sorted(set(range(result.run.world_size)) - set(ranks.tolist()))
    clocks_disagree = np.array([e.clock_contradicted for e in events], dtype=np.bool_)
    # the scale is set by the meaningful waits: of the 128-GPU sampled pair a hatched 62.8 ms set its top,
    # and the meaningful cells (at most 39.6 ms) were drawn paler than they are; hatched cells above it are
    # drawn in the top colour. Where every column is hatched there is no meaningful wait to scale by.
    meaningful = grid[:, ~clocks_disagree] if (~clocks_disagree).any() else grid
    top = float(np.nanmax(meaningful)) if np.isfinite(meaningful).any() else 0.0
    # the title's figure is a mean over the steps, as the stragglers table's: a set-up collective's wait
    # before the first step is in none of them
    caused = caused_wait_in_steps(result)
    return HeatmapData(
        ranks=ranks,
        grid=grid,
        labels=[e.label for e in events],
        note=note,
        clocks_disagree=clocks_disagree,
        untraced=no_trace_line(missing, result.run.world_size) if missing else None,
        top_ms=top if top > 0 else 1.0,
        labelled_rows=_labelled_rows(ranks, caused),
        blamed=_blamed_line(caused, blame_steps(result)),
    )


def _most_blamed(caused_wait_ns: Mapping[int, int]) -> int | None:
    """The rank the most wait is blamed on (of equals, the lowest); None where no one waited."""
    blamed = [(w, -r) for r, w in caused_wait_ns.items() if w > 0]
    return -max(blamed)[1] if blamed else None


def _blamed_line(caused_wait_ns: Mapping[int, int], steps: int) -> str | None:
    """:attr:`HeatmapData.blamed` (``caused_wait_ns``: of the ``steps`` steps the figure is a mean over)."""
    if (r := _most_blamed(caused_wait_ns)) is None:
        return None
    return f"rank {r} made its peers wait the most: {ms_text(caused_wait_ns[r] / steps)} ms a step"


def _labelled_rows(ranks: npt.NDArray[np.int64], caused_wait_ns: Mapping[int, int]) -> tuple[int, ...]:
    """:attr:`HeatmapData.labelled_rows` (``ranks`` ascending)."""
    rows = _ticks(ranks.size)
    row_of = {int(r): k for k, r in enumerate(ranks.tolist())}
    most = _most_blamed({r: w for r, w in caused_wait_ns.items() if r in row_of})
    if most is None:
        return tuple(rows)
    top = row_of[most]
    spacing = rows[1] - rows[0] if len(rows) > 1 else ranks.size
    return tuple(sorted({*(k for k in rows if 2 * abs(k - top) >= spacing), top}))


def _all_or(kept: int, of: int, what: str) -> str:
    """``all 38 collective(s)``, ``the 362 of 1,024 send/recv pair(s) with the most exposed wait``, ``none of
    the 1,024 send/recv pair(s)``."""
    if kept == of:
        return f"all {of:,} {what}"
    return (
        f"the {kept:,} of {of:,} {what} with the most exposed wait" if kept else f"none of the {of:,} {what}"
    )


def wait_heatmap(
    result: AnalysisResult,
    path: str | Path,
    *,
    max_columns: int = 400,
    on_note: Callable[[str], object] | None = None,
) -> Path:
    """Heatmap of each rank's wait (ms) at each collective instance and send/recv pair, in order of last
    arrival (:func:`wait_heatmap_data`). Every rank is a row; of many ranks (or columns) only about
    :data:`_MAX_TICKS` are labelled, and the picture grows with them up to :data:`_MAX_INCHES`. What it
    leaves out, or why it has no cells, is written in the picture and given to ``on_note``."""
    data = wait_heatmap_data(result, max_columns=max_columns)
    ranks, n = data.ranks, len(data.labels)
    fig = figure_class()(figsize=(min(4 + 0.12 * n, _MAX_INCHES), min(1.5 + 0.35 * ranks.size, _MAX_INCHES)))
    ax = fig.add_subplot()
    ax.set_title("wait for peers (ms); blank: not a member")
    ax.set_ylabel("rank")
    ax.set_xlabel("collective / send-recv pair (by last arrival)")
    if n:
        # the scale starts at 0 (no wait: the darkest colour), whatever the smallest wait drawn; a run where
        # no one waited gets 0-1 ms, not matplotlib's -0.1..0.1 around a mid-scale colour; square-root
        # spaced (HeatmapData.shade), so that small waits are not drawn as none
        from matplotlib.colors import PowerNorm

        im = ax.imshow(
            data.grid,
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            norm=PowerNorm(WAIT_GAMMA, vmin=0.0, vmax=data.top_ms, clip=True),
        )
        bar = fig.colorbar(im, ax=ax, label="ms (square-root scale)")
        bar_points = bar.ax.get_position().height * fig.get_figheight() * 72
        label_points = max((t.get_size() for t in bar.ax.get_yticklabels()), default=10.0)
        bar.set_ticks(_colour_ticks(data.top_ms, bar_points, label_points))
        # where the clocks contradict each other the waits are not meaningful (the report's clock note):
        # those columns hatched over their cells
        for j in np.flatnonzero(data.clocks_disagree).tolist():
            ax.add_patch(
                _rectangle()((j - 0.5, -0.5), 1.0, ranks.size, fill=False, hatch="xx", edgecolor="red", lw=0)
            )
        yticks = list(data.labelled_rows)
        ax.set_yticks(yticks, [str(r) for r in ranks[yticks].tolist()])
        ticks = _ticks(n)
        ax.set_xticks(ticks, [data.labels[i] for i in ticks], rotation=90)
        ax.tick_params(axis="x", labelsize=6)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    lines = [data.blamed] if data.blamed is not None and n else []
    if data.untraced is not None and n:
        lines.append(textwrap.fill(f"{data.untraced}: waits for traced peers only", 70))
    if data.clocks_disagree.any():
        k = int(data.clocks_disagree.sum())
        lines.append(
            textwrap.fill(
                f"hatched: {k} where the ranks' clocks disagree (a member recorded as done before another "
                "began): their waits are not meaningful",
                70,
            )
        )
    if data.note is not None and n:
        lines.append(data.note)
    if lines:
        ax.set_title("\n".join(["wait for peers (ms); blank: not a member", *lines]), fontsize=9)
    if data.note is not None:
        if not n:
            text = textwrap.fill(data.note, 36)
            ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, transform=ax.transAxes)
        if on_note is not None:
            on_note(f"{WAIT_HEATMAP_FILE}: {data.note}")
    return save_png(fig, Path(path))


def breakdown_bars(result: AnalysisResult, path: str | Path, *, max_ranks: int = MAX_RANK_ROWS) -> Path:
    """Stacked bars of each rank's mean step breakdown (ms per step); of more than ``max_ranks`` ranks (0:
    no limit), those the report's breakdown table lists, and a line saying what was left out."""
    parts = ("compute", "exposed wait", "exposed transfer", "idle")
    shown, rest = rank_means(result.breakdown).least_waiting(max_ranks)
    vals = shown.mean_ns[:, [MEAN_PARTS.index(p) for p in parts]] / 1e6
    below = [ranks_left_out(shown, rest)] if rest.ranks else []
    if (outliers := outliers_note(result)) is not None:
        below.append(outliers)
    fig = _stacked_bars(
        [str(r) for r in shown.ranks],
        vals,
        parts,
        BREAKDOWN_COLOURS,
        xlabel="rank",
        title="step breakdown (communication hidden under compute not shown)",
        below=below,
    )
    return save_png(fig, Path(path))


def _stacked_bars(
    labels: list[str],
    vals: npt.NDArray[np.float64],
    names: Sequence[str],
    colors: Sequence[str],
    *,
    xlabel: str,
    title: str,
    below: list[str],
) -> Any:
    """A figure of one stacked bar per label (``vals``: ms per step, a column per name), the ``below`` lines
    under the axis."""
    fig = figure_class()(figsize=(max(4, 0.6 * len(labels) + 3), 4))
    ax = fig.add_subplot()
    bottom = np.zeros(len(labels))
    for k, name in enumerate(names):
        ax.bar(labels, vals[:, k], bottom=bottom, label=name, color=colors[k])
        bottom += vals[:, k]
    if bottom.size and bottom.max() > 0:
        # matplotlib's 5% headroom above the tallest bar, set here: a top part of 0 on every bar (no idle)
        # was drawn as an empty bar from the top, whose bottom the autoscale holds to ("sticky edges"), and
        # the axis ended at the bars' tops, as if they were cut off there
        ax.set_ylim(0, float(bottom.max()) * 1.05)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms per step (mean)")
    ax.set_title(title)
    if below:  # under the axis' label (a fixed 42 points down, it ran over gpu_idle.png's, under two-line
        # ticks), wrapped at the picture's width
        ax.annotate(
            "\n".join(below),
            xy=(0, 0),
            xycoords=("axes fraction", ax.xaxis.label),
            xytext=(0, -6),
            textcoords="offset points",
            va="top",
            fontsize=8,
            wrap=True,
        )
    # the legend top to bottom as the bars stack: in the order drawn, its first name (compute) was at its top,
    # beside the bars' tops, and a reader who cannot tell the colours apart matched the names the wrong way up
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, reverse=True)
    return fig


@dataclass(frozen=True, slots=True)
class GpuIdleBars:
    """What :func:`gpu_idle_bars` draws: per rank shown, its compute stream's busy time and idle parts."""

    ranks: list[int]
    streams: list[int]
    ms: npt.NDArray[np.float64]
    """(ranks, 1 + len(PARTS)): busy, then the idle parts (``gpu_idle.PARTS``), mean ms per step."""
    left_out: int
    """Ranks with a compute stream not drawn."""
    verdict: str | None = None
    """The finding, in words, under the bars: how much the compute streams idled and what they mostly
    waited for (the report's line, :func:`~skewlens.analysis.gpu_idle.verdict`)."""


def gpu_idle_bars_data(result: AnalysisResult, *, max_ranks: int = MAX_RANK_ROWS) -> GpuIdleBars | None:
    """The bars of :func:`gpu_idle_bars` (the report's table's ranks); None on a run without GPU streams."""
    streams = compute_streams(result.gpu_idle)
    if not streams:
        return None
    shown = most_idle(streams, max_ranks)
    ms = np.array([[s.busy_ns, *s.parts_ns] for s in shown], dtype=np.float64) / 1e6
    return GpuIdleBars(
        [s.rank for s in shown], [s.stream for s in shown], ms, len(streams) - len(shown), verdict(streams)
    )


def gpu_idle_bars(result: AnalysisResult, path: str | Path, *, max_ranks: int = MAX_RANK_ROWS) -> Path | None:
    """Stacked bars of each rank's compute stream (mean ms per step): busy, then its idle time by what it
    waited for; of more than ``max_ranks`` ranks, those that idled the most. None (nothing written) on a
    run without GPU streams."""
    data = gpu_idle_bars_data(result, max_ranks=max_ranks)
    if data is None:
        return None
    n = len(data.ranks)
    note = f"{n + data.left_out:,} ranks: the {n} whose compute stream idled the most; every stream is in "
    below = [data.verdict] if data.verdict is not None else []
    if data.left_out:
        below.append(note + GPU_IDLE_TABLE)
    fig = _stacked_bars(
        [f"{r}\n(s{s})" for r, s in zip(data.ranks, data.streams, strict=True)],
        data.ms,
        ("busy", *(p.replace("_", " ") for p in PARTS)),
        GPU_IDLE_COLOURS,
        xlabel="rank (compute stream)",
        title="GPU compute stream: busy, and idle by what it waited for",
        below=below,
    )
    return save_png(fig, Path(path))
