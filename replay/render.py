"""Rich rendering of replay results (summary per rank, sweep comparison); no computation here."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from rich.table import Table

from skewlens.profiler.store.issues import MAX_RANK_ROWS, ms_text
from skewlens.replay.outputs import GBPS_NOTE, SweepRecord, distinct_overrides, setting_unit, swept_settings
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


def gpu_idle_table(rows: Sequence[SummaryRecord], *, max_ranks: int = MAX_RANK_ROWS) -> Table | None:
    """Each GPU rank's compute stream in the replay (mean ms per step): busy, idle, and the idle by what it
    waited for (``skewlens analyze``'s rule, on the replayed times); of more than ``max_ranks`` ranks,
    those whose stream idled the most. None for a replay without GPU ranks."""
    by_rank: dict[int, list[SummaryRecord]] = {}
    for r in rows:
        if r.gpu_stream >= 0:
            by_rank.setdefault(r.rank, []).append(r)
    if not by_rank:
        return None
    t = Table(title="GPU compute stream in the replay (mean ms per step)", collapse_padding=True)
    for col in ("rank", "stream", "busy", "idle", "launch", "comm", "stream wait", "other"):
        t.add_column(col, justify="right")

    def mean(rs: list[SummaryRecord], field: str) -> float:
        return sum(getattr(x, field) for x in rs) / len(rs)

    shown = sorted(by_rank, key=lambda k: (-mean(by_rank[k], "gpu_idle_ns"), k))[: max_ranks or None]
    if len(shown) < len(by_rank):
        t.caption = f"{len(by_rank)} GPU ranks: the {len(shown)} whose stream idled the most"
    for rank in sorted(shown):
        rs = by_rank[rank]
        t.add_row(
            str(rank),
            str(rs[0].gpu_stream),
            *(ms_text(mean(rs, f)) for f in ("gpu_busy_ns", "gpu_idle_ns", *GPU_PART_FIELDS)),
        )
    return t


def _settings_header(overrides: Sequence[str]) -> str:
    """The overrides column's header: ``overrides``, and under it the unit of each swept setting whose name
    says one (``bandwidth_gbps: GB/s``, gigabytes per second, which ``gbps`` does not say)."""
    units = {
        key.rpartition(".")[2]: unit
        for key in swept_settings(overrides)
        if (unit := setting_unit(key)) is not None
    }
    return "\n".join(["overrides", *(f"{name}: {unit}" for name, unit in units.items())])


def _ms_or_dash(ns: int | None) -> str:
    return "-" if ns is None else ms_text(ns)


def sweep_table(rows: Sequence[SweepRecord], failed: Sequence[str] = ()) -> Table:
    """One row per sweep job: the overrides that differ between jobs (those that ``failed``, given by
    their overrides, included; the header gives their units), the replayed step times and the exposed
    communication of each step's slowest rank (ms). The topology, slowdown or communication mode that two or
    more jobs all share is said once, in the title, not in a column of its own: with the exposed figures,
    ten columns at 80 characters folded every number over two lines."""
    first = min(rows, key=lambda r: r.job) if rows else None
    everyone = [r.overrides for r in rows] + list(failed)
    header = _settings_header(everyone)
    names = {
        "topology": [r.topology for r in rows],
        "slowdown": [r.slowdown for r in rows],
        "comm": [r.comm_mode for r in rows],
    }
    shared = {col: v[0] for col, v in names.items() if len(v) >= 2 and len(set(v)) == 1}
    t = Table(
        title="Replay sweep" + (f" ({', '.join(f'{c} {v}' for c, v in shared.items())})" if shared else ""),
        caption="mean / max step: over steps, each step's replayed time that of its slowest rank (step mark "
        "to step mark); exposed transfer / wait: that rank's communication not under compute, mean over "
        "steps"
        # what the ratio is against: the first finished job's (job 1's where job 0 failed); it was not said
        + (f"; (x): mean step against job {first.job}'s" if first is not None and first.mean_step_ns else "")
        + (f"; {GBPS_NOTE}" if "GB/s" in header else ""),
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
            _ms_or_dash(r.mean_exposed_transfer_ns),
            _ms_or_dash(r.mean_exposed_wait_ns),
            ms_text(r.makespan_ns),
        )
    return t
