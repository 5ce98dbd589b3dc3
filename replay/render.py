"""Rich rendering of replay results (summary per rank, sweep comparison); no computation here."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from rich.table import Table

from skewlens.profiler.store.issues import MAX_RANK_ROWS, ms_text, rank_ranges
from skewlens.replay.outputs import (
    GBPS_NOTE,
    SweepRecord,
    distinct_overrides,
    setting_unit,
    shared_setting,
    swept_settings,
)
from skewlens.replay.summary import GPU_PART_FIELDS, SummaryRecord


def _change(ns: float, ref: float) -> str:
    """``ns`` against ``ref``: ``+60.0%``; from +1000% in whole percents (``+223182%``), as fits."""
    if not ref:
        return "-"
    d = (ns - ref) / ref
    return f"{d:+.1%}" if abs(d) < 10 else f"{d:+.0%}"


def summary_table(
    rows: Sequence[SummaryRecord], *, title: str = "Simulated replay", max_ranks: int = MAX_RANK_ROWS
) -> Table:
    """One row per rank: mean replayed and recorded step time (step mark to step mark) and the difference,
    compute, communication, and the exposed wait and transfer as the analyses' breakdown counts them (ms).
    Padding is shared between neighbouring cells, so that the nine columns fit 80 characters without
    cutting the figures. Of more than ``max_ranks`` ranks, those that waited least for their peers (the
    late arrivals, where stragglers are) are listed, the others summed up in the caption. A rank of an
    extrapolated run reads ``5←1``: rank 5, a copy of captured rank 1, whose recorded step (at the captured
    size) is in ``recorded ms``."""
    t = Table(title=title, collapse_padding=True, min_width=len(title))  # narrower, it wrapped a path in two
    cols = ("rank", "steps", "step ms", "recorded ms", "vs recorded", "compute ms", "comm ms")
    for col in (*cols, "wait ms", "xfer ms"):  # exposed (not under compute) wait and transfer
        t.add_column(col, justify="right")
    by_rank: dict[int, list[SummaryRecord]] = {}
    for r in rows:
        by_rank.setdefault(r.rank, []).append(r)
    copies = any(r.source_rank != r.rank for r in rows)  # an extrapolated run: say what each rank copies
    if len(by_rank) > max_ranks > 0:
        mean_wait = {rank: sum(x.exposed_wait_ns for x in rs) / len(rs) for rank, rs in by_rank.items()}
        shown = sorted(sorted(by_rank, key=lambda k: (mean_wait[k], k))[:max_ranks])
        rest = sorted(set(by_rank) - set(shown))
        # medians of an even count, the middle two's mean (the upper one read 20.000 for steps of 10 and 20)
        step = median(sum(x.step_time_ns for x in by_rank[k]) / len(by_rank[k]) for k in rest)
        wait = median(mean_wait[k] for k in rest)
        t.caption = (
            f"{len(by_rank)} ranks: the {len(shown)} that waited least for their peers; the other "
            f"{len(rest)}: step {ms_text(step)} ms, wait {ms_text(wait)} ms (medians); every rank is in "
            "summary.parquet"
        )
        by_rank = {k: by_rank[k] for k in shown}
    if copies:
        # its recorded step is the captured rank's, at the captured size: 'vs recorded' compares the sizes
        copied = "rank←captured rank it copies, recorded ms that rank's step as captured"
        t.caption = copied + (f"; {t.caption}" if t.caption else "")
    # summary.parquet's wait_ns counts every wait; the columns are the exposed part, which the step paid
    exposed = (
        "wait, xfer: exposed (not under compute): summary.parquet's exposed_wait_ns, exposed_transfer_ns"
    )
    t.caption = f"{t.caption}; {exposed}" if t.caption else exposed
    for rank, rs in sorted(by_rank.items()):
        n = len(rs)
        rep = sum(x.step_time_ns for x in rs) / n
        rec = sum(x.recorded_step_ns for x in rs) / n
        t.add_row(
            f"{rank}←{rs[0].source_rank}" if copies else str(rank),
            str(n),
            ms_text(rep),
            ms_text(rec),
            _change(rep, rec),
            ms_text(sum(x.compute_ns for x in rs) / n),
            ms_text(sum(x.comm_ns for x in rs) / n),
            ms_text(sum(x.exposed_wait_ns for x in rs) / n),
            ms_text(sum(x.exposed_transfer_ns for x in rs) / n),
        )
    return t


def _gpu_ranks(rows: Sequence[SummaryRecord]) -> dict[int, list[SummaryRecord]]:
    """The rows of each rank with a GPU compute stream."""
    by_rank: dict[int, list[SummaryRecord]] = {}
    for r in rows:
        if r.gpu_stream >= 0:
            by_rank.setdefault(r.rank, []).append(r)
    return by_rank


def gpu_idle_table(rows: Sequence[SummaryRecord], *, max_ranks: int = MAX_RANK_ROWS) -> Table | None:
    """Each GPU rank's compute stream in the replay (mean ms per step): busy, idle, and the idle by what it
    waited for (``skewlens analyze``'s rule, on the replayed times); of more than ``max_ranks`` ranks,
    those whose stream idled the most; under it, what bounds the slowest rank's step (:func:`bound_note`).
    None for a replay without GPU ranks."""
    by_rank = _gpu_ranks(rows)
    if not by_rank:
        return None
    t = Table(title="GPU compute stream in the replay (mean ms per step)", collapse_padding=True)
    for col in ("rank", "stream", "busy", "idle", "launch", "comm", "stream wait", "other"):
        t.add_column(col, justify="right")

    def mean(rs: list[SummaryRecord], field: str) -> float:
        return sum(getattr(x, field) for x in rs) / len(rs)

    shown = sorted(by_rank, key=lambda k: (-mean(by_rank[k], "gpu_idle_ns"), k))[: max_ranks or None]
    notes = []
    if len(shown) < len(by_rank):
        notes.append(f"{len(by_rank)} GPU ranks: the {len(shown)} whose stream idled the most")
    if (bound := bound_note(rows)) is not None:  # what bounds the slowest rank's step
        notes.append(bound)
    t.caption = "; ".join(notes) or None
    for rank in sorted(shown):
        rs = by_rank[rank]
        t.add_row(
            str(rank),
            str(rs[0].gpu_stream),
            *(ms_text(mean(rs, f)) for f in ("gpu_busy_ns", "gpu_idle_ns", *GPU_PART_FIELDS)),
        )
    return t


#: What bounds a step, by the largest of its GPU compute stream's busy time and idle parts (``other``, idle
#: for nothing known or after its last op, says nothing).
_BOUND_BY = {
    "gpu_busy_ns": "GPU-bound (its kernels set the step)",
    "gpu_launch_wait_ns": "host-bound (GPU work, communication included, lengthens the step only where it "
    "outlasts the host's launches)",
    "gpu_comm_wait_ns": "bound by communication (transfers, and waits for peers)",
    "gpu_stream_wait_ns": "bound by work on other streams",
}


def bound_note(rows: Sequence[SummaryRecord]) -> str | None:
    """What bounds the step of the GPU rank with the longest mean step, from its ``gpu_*`` figures (mean ms
    per step): its compute stream's busy time and its two largest idle parts, and the verdict of the largest
    of busy, launch, communication and stream waits (:data:`_BOUND_BY`; none where the rest, ``other``, is
    larger). A planner's bandwidth sweep of the 8-GPU DLRM trace read 18.712 ms at every bandwidth: rank 3's
    stream ran 1.020 ms of it and waited 9.569 ms for launches, so the network counts only where
    communication outlasts the host. None without GPU ranks."""
    by_rank = _gpu_ranks(rows)
    if not by_rank:
        return None

    def mean(rank: int, field: str) -> float:
        return sum(getattr(x, field) for x in by_rank[rank]) / len(by_rank[rank])

    rank = max(sorted(by_rank), key=lambda k: mean(k, "step_time_ns"))
    waits = {"gpu_launch_wait_ns": "launches", "gpu_comm_wait_ns": "communication"}
    waits |= {"gpu_stream_wait_ns": "other streams"}
    said = sorted(waits, key=lambda f: -mean(rank, f))[:2]
    parts = ", ".join(f"{ms_text(mean(rank, f))} ms for {waits[f]}" for f in said if mean(rank, f) > 0)
    figures = {f: mean(rank, f) for f in (*_BOUND_BY, "gpu_other_ns")}
    largest = max(figures, key=lambda f: figures[f])
    verdict = f": {_BOUND_BY[largest]}" if largest in _BOUND_BY and figures[largest] > 0 else ""
    step_ms = ms_text(mean(rank, "step_time_ns"))
    return (
        f"rank {rank}, the rank with the longest mean step ({step_ms} ms): its stream ran "
        f"{ms_text(mean(rank, 'gpu_busy_ns'))} ms" + (f" and waited {parts}" if parts else "") + verdict
    )


def flat_sweep_note(rows: Sequence[SweepRecord]) -> str | None:
    """Where two or more jobs' mean steps read the same in the table (to the µs) while their exposed transfer
    does not: that the communication the setting changed held up nothing the step waited for, so that a
    planner does not read the flat step as "the network does not matter" everywhere, nor the exposed
    transfer as what the step paid (the 8-GPU DLRM trace at 6.25 to 200 GB/s: 18.712 ms each, exposed
    transfer 0.381 to 0.042 ms; below 4 GB/s the step grows, 19.837 ms at 1). The first such group; None
    where there is none."""
    groups: dict[str, list[SweepRecord]] = {}
    for r in sorted(rows, key=lambda r: r.job):
        if r.mean_exposed_transfer_ns is not None:
            groups.setdefault(ms_text(r.mean_step_ns), []).append(r)
    for step, rs in groups.items():
        xfer = sorted({ms_text(x.mean_exposed_transfer_ns or 0) for x in rs}, key=float)
        if len(rs) >= 2 and len(xfer) >= 2:
            jobs = rank_ranges(r.job for r in rs)
            return (
                f"jobs {jobs}: one mean step, {step} ms, while their exposed transfer "
                f"ranges {xfer[0]}-{xfer[-1]} ms: that communication overlapped no traced compute but ended "
                "before the step's end needed it, so the swept setting did not reach what bounds the step "
                "there (on a GPU run, each job's GPU table says what does)"
            )
    return None


def _settings_header(overrides: Sequence[str]) -> str:
    """The overrides column's header: ``overrides``, and under it the unit of each swept setting whose name
    says one (``bandwidth_gbps: GB/s``, gigabytes per second, which ``gbps`` does not say)."""
    units = {
        key.rpartition(".")[2]: unit
        for key in swept_settings(overrides)
        if (unit := setting_unit(key)) is not None
    }
    return "\n".join(["overrides", *(f"{name}: {unit}" for name, unit in units.items())])


def ms_or_dash(ns: int | None) -> str:
    """A table's cell of ``ns`` in ms (:func:`~skewlens.profiler.store.issues.ms_text`), ``-`` for none."""
    return "-" if ns is None else ms_text(ns)


def sweep_table(rows: Sequence[SweepRecord], failed: Sequence[str] = ()) -> Table:
    """One row per sweep job: the overrides that differ between jobs (those that ``failed``, given by
    their overrides, included; the header gives their units), the replayed step times and the exposed
    communication of each step's slowest rank (ms). The trace, topology, slowdown or communication mode that
    two or more jobs all share is said once, in the title, not in a column of its own: with the exposed
    figures, ten columns at 80 characters folded every number over two lines. The trace is the ``trace=``
    override every job (``failed`` ones too) gives alike, as given (unquoted: ``sweep.parquet``'s rule),
    a path as the rest of the sweep's output prints them: the table, caption and column said no word of
    which run every job replayed."""
    first = min(rows, key=lambda r: r.job) if rows else None
    everyone = [r.overrides for r in rows] + list(failed)
    header = _settings_header(everyone)
    names = {
        "topology": [r.topology for r in rows],
        "slowdown": [r.slowdown for r in rows],
        "comm": [r.comm_mode for r in rows],
    }
    shared = {col: v[0] for col, v in names.items() if len(v) >= 2 and len(set(v)) == 1}
    if (trace := shared_setting(everyone, "trace")) is not None:
        shared = {"trace": trace, **shared}
    t = Table(
        title="Replay sweep" + (f" ({', '.join(f'{c} {v}' for c, v in shared.items())})" if shared else ""),
        caption="mean / max step: over steps, each step's replayed time that of its slowest rank (step mark "
        "to step mark); exposed transfer / wait: that rank's communication not under compute, mean over "
        "steps"
        # what the ratio is against: the first finished job's (job 1's where job 0 failed); it was not said
        + (f"; (x): mean step against job {first.job}'s" if first is not None and first.mean_step_ns else "")
        + (f"; {GBPS_NOTE}" if "GB/s" in header else "")
        + (f"; {flat}" if (flat := flat_sweep_note(rows)) else ""),
    )
    columns = [
        ("job", "right"),
        (header, "left"),
        *((c, "left") for c in names if c not in shared),
        ("mean step ms", "right"),
        ("max step ms", "right"),
        ("exposed transfer ms", "right"),
        ("exposed wait ms", "right"),
        ("makespan ms", "right"),
    ]
    for col, just in columns:
        # folded, not cut: at 80 columns every job's overrides read `slowdow…`, which tell the jobs apart
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    base = first.mean_step_ns if first is not None else 0
    own = distinct_overrides(everyone)[: len(rows)]
    for k, (r, mine) in sorted(enumerate(zip(rows, own, strict=True)), key=lambda x: x[1][0].job):
        rel = f" ({r.mean_step_ns / base:.2f}x)" if base else ""
        t.add_row(
            str(r.job),
            mine,
            *(v[k] for c, v in names.items() if c not in shared),
            ms_text(r.mean_step_ns) + rel,
            ms_text(r.max_step_ns),
            ms_or_dash(r.mean_exposed_transfer_ns),
            ms_or_dash(r.mean_exposed_wait_ns),
            ms_text(r.makespan_ns),
        )
    return t
