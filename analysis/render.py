"""Rich renderables of an :class:`~skewlens.analysis.api.AnalysisResult` (no computation beyond
sorting/summing)."""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from skewlens.analysis.api import (
    BLAME_FILE,
    BLAME_HOSTS_FILE,
    BLAME_STEPS_FILE,
    BREAKDOWN_FILE,
    CRITICAL_PATH_FILE,
    GPU_IDLE_FILE,
    GPU_KERNELS_FILE,
    SKEW_FILE,
    AnalysisResult,
)
from skewlens.analysis.breakdown import (
    MEAN_PARTS,
    OUTLIER_FACTOR,
    WARM_UP_STEPS,
    RankMeans,
    outlier_steps,
    rank_means,
    step_comm,
    steps_compiled,
)
from skewlens.analysis.critical_path import DEVICE_GAP, HOST_GAP, shares
from skewlens.analysis.gpu_idle import compute_streams, most_idle, verdict
from skewlens.analysis.gpu_kernels import top_kernels
from skewlens.analysis.records import BlameRecord, CauseKind
from skewlens.console import print_line
from skewlens.profiler.manifest import default_group_name
from skewlens.profiler.store.issues import (
    MAX_RANK_ROWS,
    consecutive_runs,
    ms_text,
    percent_text,
    rank_ranges,
    replay_command,
)
from skewlens.profiler.store.render import group_desc, group_members

#: Node names (kernel names run to hundreds of characters) are cut to this many characters in tables.
NAME_WIDTH = 60


def size_text(n: int) -> str:
    """A byte count as people read it: ``512 B``, ``4.0 KiB``, ``1.5 MiB``, ``2.0 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n} B"


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` in ``width`` characters: two thirds its start (a kernel's name), a third its end (where
    names cut at the end differ: arguments, ``...AccumulateGrad``), an ellipsis between."""
    if len(name) <= width:
        return name
    tail = width // 3
    return name[: width - 1 - tail] + "…" + name[len(name) - tail :]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def short_names(names: Sequence[str], width: int = NAME_WIDTH) -> list[str]:
    """Each of ``names`` in ``width`` characters, so that rows of one table can be told apart: a name that
    shares a long start with another (kernels of one template: ``void at::native::vectorized_elementwise_
    kernel<4, at::native::...``) keeps a third of its start, then from a little before where they differ;
    others, their start and end (:func:`short_name`)."""
    out = []
    for i, name in enumerate(names):
        shared = max(
            (_common_prefix(name, other) for j, other in enumerate(names) if j != i and other != name),
            default=0,
        )
        if len(name) <= width or shared < width // 2:
            out.append(short_name(name, width))
            continue
        head = width // 3
        rest = name[max(shared - 8, head) :]
        room = width - head - 1
        out.append(name[:head] + "…" + (rest if len(rest) <= room else rest[: room - 1] + "…"))
    return out


def _name_column(t: Table, header: str) -> None:
    """A column of names (:func:`short_names`, in :func:`_name_cell`) that gives way on a narrow terminal,
    each name ending in an ellipsis on its one line, and leaves the figures beside it whole: a column that
    may not wrap is one rich does not narrow first, and with every column so, it cut them all alike (at 80
    columns the GPU kernels' ``ranks`` and ``%`` to nothing, ``ms / step`` to ``4…``). The figures beside it
    may wrap too (a report console folds them, :class:`skewlens.console.FoldFigures`): rich narrows the
    widest column first, this one, and the others only once it is no wider than they are; with only this
    one allowed to, rich narrowed it to nothing (at 60 columns the GPU kernels had no ``kernel`` column, at
    50 their ``%`` was ``5…``)."""
    t.add_column(header, max_width=NAME_WIDTH)


def _name_cell(name: str) -> Text:
    """A name for :func:`_name_column`: on one line, cut with an ellipsis where the column is narrower."""
    return Text(name, no_wrap=True, overflow="ellipsis")


def cause_column(t: Table, header: str = "cause") -> None:
    """The free-text cause: wrapped at spaces, a word longer than the cell folded onto the next line, not
    cut; the other columns' headers wrap to leave it room. A cause holds figures (``aten::mm +41.4 ms``),
    and rich narrows it with the table's other wrapping columns: cut with an ellipsis, at 60 columns the
    worst collectives' causes read ``+4…`` and ``+3…`` for +41.4 ms and +39.1 ms, and at 80 their op names
    ``aten:…``, ``Addmm…``, ``Distr…``."""
    t.add_column(header, ratio=1, overflow="fold")


#: What the amounts of a rank's top cause are (the stragglers table's caption, the demo's too).
CAUSE_NOTE = (
    "top cause: what grew on the rank before an event it made others wait at, against the event's median "
    "member, ms per such event (their mean, weighted by the wait each caused); of a rank that made no one "
    "wait, its excess over the median rank, ms per step"
)


#: What the stragglers table's cost % is a share of.
COST_NOTE = (
    "cost %: of the job's step time replayed unmodified (from the first rank's start, or the previous "
    "step's end, to the last rank's end: longer than one rank's own step where ranks start apart)"
)


#: The caption's note on a cost marked ``*``.
NOT_EVALUATED = "* not evaluated: nowhere slower than the median rank, or beyond the limit on simulations"
#: The cost cell of a rank whose what-if was not simulated (:data:`NOT_EVALUATED`).
NOT_EVALUATED_COST = f"{ms_text(0)}*"


def blame_step_ids(result: AnalysisResult) -> list[int]:
    """The steps the per-step figures are a mean over: the what-if's, else the run's."""
    if result.blame is not None:
        return sorted(result.blame.baseline_step_ns)
    return list(result.index.steps)


def blame_steps(result: AnalysisResult) -> int:
    """How many steps the per-step figures are a mean over (:func:`blame_step_ids`; at least 1)."""
    return max(len(blame_step_ids(result)), 1)


def caused_wait_in_steps(result: AnalysisResult) -> dict[int, int]:
    """Rank -> the wait it caused in the steps the per-step figures are a mean over (:func:`blame_step_ids`;
    not a set-up collective's before the first step): what every 'caused wait ... a step' divides."""
    return result.skew.caused_wait_in(blame_step_ids(result))


#: A cost or a caused wait under this a step is no blame on a rank, in every table and note: its cause is not
#: shown, the stragglers table leaves the rank out, its one-off is not named. 5 us: noise beside the ms a
#: straggler costs; the stragglers table's caption gives it as 0.005 ms.
BLAMED_NS = 5_000


def shown_cause(rec: BlameRecord, steps: int) -> str:
    """``rec``'s cause, or ``-`` where nothing is blamed on the rank: no cause, or a cost (either way) and a
    caused wait both under :data:`BLAMED_NS` a step (a rank of cost 9 us was shown "host idle/gap +29.6
    ms")."""
    blamed = abs(rec.straggler_cost_ns) >= BLAMED_NS * steps or rec.caused_wait_ns >= BLAMED_NS * steps
    return (rec.cause if blamed else "") or "-"


@dataclass(frozen=True, slots=True)
class Command:
    """A command for the user to copy, which :func:`print_report` prints on a line of its own, whole: the
    terminal's own wrap the only one (``print_line``). In a table's caption, rich wrapped it to the table's
    width, with a line break inside a Hydra list (``rank s:[0]``) that a paste then held."""

    text: str


#: Printed: a report's parts, of which each :class:`Command` on its own line.
ReportPart = RenderableType | Command


def print_report(console: Console, parts: Sequence[ReportPart]) -> None:
    """``parts`` (:func:`report`'s) on ``console``: a :class:`Command` through ``print_line``, unwrapped,
    the rest as rich renders it."""
    for part in parts:
        if isinstance(part, Command):
            print_line(console, part.text)
        else:
            console.print(part)


#: Above the replays that the stragglers table's what-if notes name (:func:`stragglers`).
REPLAYS_HEADING = (
    "what-if replays, one a line (OUT: a directory for the replay's outputs; factor 0.5 in place of 0: half "
    "of it gone):"
)


def stragglers(result: AnalysisResult, top: int = 5) -> list[ReportPart]:
    """:func:`stragglers_table` and, under it, the replays its what-if notes name (:func:`what_if_notes`),
    each a :class:`Command` on the run analysed (``trace=`` the path it was loaded from)."""
    table, what_ifs = _stragglers(result, top)
    if not what_ifs:
        return [table]
    run = result.run.run_dir
    return [
        table,
        Text(REPLAYS_HEADING),
        *(Command(replay_command(run, *w.overrides)) for w in what_ifs),
    ]


def stragglers_table(result: AnalysisResult, top: int = 5) -> Table:
    """The table of :func:`stragglers`, without the replays its notes name."""
    return _stragglers(result, top)[0]


def _stragglers(result: AnalysisResult, top: int) -> tuple[Table, list[WhatIf]]:
    """Top stragglers, ms per step (the mean over the steps, named in the title): what-if cost (simulated),
    steps where each is the top straggler, the peer wait it caused and its top cause (``-`` where nothing
    was blamed on it). After the first, a rank that costs nothing and made no one wait is left out (at 1,024
    ranks, four rows of 0.00 under the one straggler); the caption then says how many ranks cost anything (and
    how many of those are shown, where there are more than ``top``) and that every rank is in
    ``blame.parquet``. With the what-ifs its notes name, whose replays :func:`stragglers` prints under it."""
    steps = blame_steps(result)
    recs = result.stragglers
    # without the what-if (analyze_run(blame=False), --no-blame) the table has no costs: its title and
    # caption said "what-if: rank runs like the median rank" and what its cost % is of, over dashes
    how = "what-if: rank runs like the median rank" if recs else "no what-if: ranked by the wait they caused"
    t = Table(
        title=f"Top stragglers, ms per step over {steps:,} step{'s' if steps != 1 else ''} ({how})",
        title_justify="left",
    )
    for c in ("rank", "cost ms / step", "cost %", "top in steps", "caused wait ms / step"):
        t.add_column(c, justify="right")
    cause_column(t, "top cause (ms per event)")
    t.caption = f"{COST_NOTE}\n{CAUSE_NOTE}" if recs else CAUSE_NOTE
    if not recs:
        # the waits of the steps the means are over (not a set-up collective's before the first step)
        in_steps = caused_wait_in_steps(result)
        top_cause = result.skew.top_cause_in(blame_step_ids(result))
        caused = sorted(in_steps.items(), key=lambda x: -x[1])[:top]
        for r, w in caused:
            cause = top_cause.get(r)
            t.add_row(str(r), "-", "-", "-", ms_text(w / steps), (cause.text if cause else "") or "-")
        for note in uneven_wait_notes(result, [r for r, _w in caused]):
            t.caption += f"\n{note}"
        return t, _what_ifs_said(t, what_if_notes(result, [r for r, _w in caused]))
    shown = [recs[0], *(rec for rec in recs[1:] if _costs_anything(rec, steps))][:top]
    for rec in shown:
        t.add_row(
            str(rec.rank),
            ms_text(rec.straggler_cost_ns / steps) if rec.simulated else NOT_EVALUATED_COST,
            percent_text(rec.straggler_cost_ns, rec.baseline_ns),
            str(rec.steps_top),
            ms_text(rec.caused_wait_ns / steps),
            shown_cause(rec, steps),
        )
    if any(not r.simulated for r in shown):
        t.caption += f"\n{NOT_EVALUATED}"
    if len(shown) < len(recs):
        n = sum(_costs_anything(rec, steps) for rec in recs)
        # more of them than rows: say so (at 1,024 ranks, 5 rows under "128 of 1,024 ranks cost ... (those
        # that did not are left out)", as if the 128 were all shown)
        which = f"cost, or made others wait, {ms_text(BLAMED_NS)} ms a step or more"
        if n > len(shown):
            said = f"{len(shown)} shown of the {n:,} of {len(recs):,} ranks that {which} "
            said += "(the first by cost, then by the wait they caused)"
        else:
            said = f"{n:,} of {len(recs):,} ranks {which} (those that did not are left out)"
        t.caption += f"\n{said}; every rank is in {BLAME_FILE}"
    if (uneven := uneven_cost_note(result, shown[0])) is not None:
        t.caption += f"\n{uneven}"
    for note in uneven_wait_notes(result, [rec.rank for rec in shown]):
        t.caption += f"\n{note}"
    return t, _what_ifs_said(t, what_if_notes(result, [rec.rank for rec in shown]))


def _what_ifs_said(t: Table, what_ifs: list[WhatIf]) -> list[WhatIf]:
    """``what_ifs``, each said in ``t``'s caption, naming its replay under the table (the Nth of them where
    there are several) rather than holding it: a caption is wrapped to the table's width."""
    for i, w in enumerate(what_ifs, 1):
        which = "the replay" if len(what_ifs) == 1 else f"replay {i} of those"
        t.caption = f"{t.caption}\n{w.note}; what if it were gone: {which} under the table"
    return what_ifs


def hosts_table(result: AnalysisResult, top: int = 5) -> Table | None:
    """Hosts, ms per step: the what-if of every rank of a host at once (``blame_hosts``), for a run whose
    ranks name two hosts or more, one of them with several ranks (None otherwise, and without the
    what-if). A host whose ranks are all slow costs the job that much, while each of its ranks' own
    what-if, which leaves the others slow, costs little: 2 hosts of 2 gloo ranks, host 1's ranks 200 ms a
    step slower, cost 9.40 and 2.11 ms a step in the stragglers table, 190.34 ms a step as a host."""
    if result.blame is None or not (recs := result.blame.host_records):
        return None
    steps = blame_steps(result)
    title = (
        f"Hosts, ms per step over {steps:,} step{'s' if steps != 1 else ''} (what-if: every rank of the host "
        "runs like the median rank)"
    )
    t = Table(title=title, title_justify="left", min_width=len(title))
    t.add_column("host")
    t.add_column("ranks", justify="right")
    for c in ("cost ms / step", "cost %"):
        t.add_column(c, justify="right")
    for rec in recs[:top]:
        cost = ms_text(rec.straggler_cost_ns / steps) if rec.simulated else NOT_EVALUATED_COST
        t.add_row(
            rec.host, rank_ranges(rec.ranks), cost, percent_text(rec.straggler_cost_ns, rec.baseline_ns)
        )
    t.caption = "cost %: as in the stragglers table"
    if any(not r.simulated for r in recs[:top]):
        t.caption += f"\n{NOT_EVALUATED}"
    if len(recs) > top:
        t.caption += f"\n{top} of {len(recs):,} hosts shown; every host is in {BLAME_HOSTS_FILE}"
    return t


#: A top straggler whose steps :func:`_uneven_steps` names hold over this share of its cost, its costliest
#: over :data:`UNEVEN_OVER_MEDIAN` times its median step, is named with those steps.
UNEVEN_SHARE = 0.2
#: How many times its rank's median step a step's cost or caused wait exceeds to be named as uneven: twice,
#: so that steps alike are not named (one of them is always the largest).
UNEVEN_OVER_MEDIAN = 2
#: The fewest steps whose median says what a typical step is, against which one step is uneven.
UNEVEN_MIN_STEPS = 3


def _typical_step(values: Sequence[float]) -> float:
    """The median of ``values`` for the uneven notes: of an even count, the upper of the two middle ones, a
    figure some step has. Their mean is none: where half the steps stall alike and half do not (a rank
    whose 2 DataLoader workers each deliver a slow batch at every other step), it is half a stalled step,
    and one of the stalled steps, alike, read as uneven (2 gloo ranks: `step 6 cost 229.1 ms, 37% of it,
    its median step 83.214 ms`, steps 4 and 8 costing as much)."""
    return float(sorted(values)[len(values) // 2])


def uneven_cost_note(result: AnalysisResult, rec: BlameRecord) -> str | None:
    """Where the steps :func:`_uneven_steps` names by ``rec``'s rank's straggler cost by step (of 3 steps or
    more: those a what-if would name, else its costliest alone) hold over :data:`UNEVEN_SHARE` of it and the
    costliest costs over twice its median step, those steps, each one's cost, their share and the median
    step's cost; else None. A mean per step hides them: a serving loop with each decode step a step read
    about 11.2 ms a step where one prefill cost 398 ms (24%) and the median step about 6.4 ms. Before, the
    line named the costliest step alone: on a DataLoader capture, `step 9 cost 37.008 ms, 59% of it`, while
    step 4 cost 25.2 ms (41%) and the replay under it took both away."""
    if result.blame is None or not rec.simulated:
        return None
    cost = {s.step: s.straggler_cost_ns for s in result.blame.step_records if s.rank == rec.rank}
    total = sum(cost.values())
    if len(cost) < UNEVEN_MIN_STEPS or total <= 0:
        return None
    runs, named = _uneven_steps(cost, _what_if_step_floor(result))
    held = sum(cost[s] for s in named)
    worst = max(cost.values())
    median = _typical_step(list(cost.values()))
    if held <= UNEVEN_SHARE * total or worst <= UNEVEN_OVER_MEDIAN * median:
        return None
    # a step in which the rank compiled (torch.compile) costs its compile time: warm-up, not skew
    compiled = [s for s in named if (rec.rank, s) in steps_compiled(result.index)]
    warm = ""
    if compiled:
        where = "it" if len(named) == 1 else _steps_text(consecutive_runs(compiled))
        warm = f" (torch.compile compiled in {where} on this rank: warm-up)"
    return (
        f"rank {rec.rank}'s cost is uneven over its steps: {_steps_text(runs)} cost "
        f"{_and_text([ms_text(cost[s]) for s in named])} ms{warm}, {percent_text(held, total, 0)}% of it, "
        f"its median step {ms_text(median)} ms; every step is in {BLAME_STEPS_FILE}"
    )


#: A rank whose steps :func:`_uneven_steps` names hold over this share of the wait it caused, its worst over
#: twice its median step's and over :data:`ONE_OFF_OF_STEP` of the job's median step, is named with those
#: steps (a one-off, or a few).
UNEVEN_WAIT_SHARE = 0.5
ONE_OFF_OF_STEP = 0.1


def uneven_wait_notes(result: AnalysisResult, ranks: Sequence[int]) -> list[str]:
    """For each of ``ranks`` where the steps :func:`_uneven_steps` names by the wait it made its peers wait in
    the steps the per-step figures are a mean over (of 3 steps or more: those a what-if names by it,
    :func:`_what_if_steps`, the same rule and floor, else its worst step alone) hold over
    :data:`UNEVEN_WAIT_SHARE` of it, and its worst step's is over twice its median step's and over
    :data:`ONE_OFF_OF_STEP` of the job's median simulated step (with the what-if), those steps, their waits,
    their share and the median step's: a mean per step hides a one-off. A 333 ms ``gc.collect()`` on rank 1
    at one step of 10 read as a rank that made its peers wait about 34 ms every step, the what-if (which
    compares typical steps) costing it about 0.6 ms a step. Before, the line fired only where one step held
    over half the wait, and named it alone: a DataLoader slow at every 5th batch (2 gloo ranks), steps 4 and
    9 holding 40% and 60% of the wait, read `in step 9 it made its peers wait 282.2 ms, 60% of it` over a
    replay that took away steps 4 and 9, as if step 4 were fine; two equal one-offs (200 ms at steps 4 and
    9) got no line, the table reading 40 ms a step as if every step waited."""
    steps = blame_step_ids(result)
    by_step = result.skew.caused_wait_by_step
    floor = ONE_OFF_OF_STEP * _median_step_ns(result)
    step_floor = _what_if_step_floor(result)
    out = []
    for r in ranks:
        wait = {s: by_step.get((r, s), 0) for s in steps}
        total = sum(wait.values())
        if len(wait) < UNEVEN_MIN_STEPS or total < BLAMED_NS * len(wait):
            continue
        # the steps a what-if names by this wait: one rule for which steps (step 4 left out of a line over a
        # replay taking steps 4 and 9 away read as if step 4 were fine; two equal one-offs, each half the
        # wait, read as no one-off at all)
        runs, named = _uneven_steps(wait, step_floor)
        held = sum(wait[s] for s in named)
        # the twice-its-median check is of the worst step, as before: steps alike (one of them always the
        # worst) are not uneven, and a lesser named step near the median does not silence a one-off beside it
        worst = max(wait.values())
        median = _typical_step(list(wait.values()))
        if held <= UNEVEN_WAIT_SHARE * total or worst <= UNEVEN_OVER_MEDIAN * median or worst <= floor:
            continue
        out.append(
            f"rank {r}'s caused wait is uneven over its steps: in {_steps_text(runs)} it made its peers wait "
            f"{_and_text([ms_text(wait[s]) for s in named])} ms, {percent_text(held, total, 0)}% of it, "
            f"in its median step {ms_text(median)} ms"
        )
    return out


def _uneven_steps(by_step: Mapping[int, int], floor: float) -> tuple[tuple[tuple[int, int], ...], list[int]]:
    """The steps an uneven line (:func:`uneven_wait_notes`, :func:`uneven_cost_note`) names by a rank's figure
    by step (the wait it caused, its cost; every step the figures are a mean over): the runs of consecutive
    steps (first, last) a what-if names by it (:func:`_what_if_steps`, with ``floor``), else (it names none:
    every step, steps holding no more than half of it, or over :data:`WHAT_IF_STEPS` runs) the step of the
    most alone, the first of equals; and those runs' steps one by one. One rule for which steps, so that a
    line names the steps whose waits the replay under it takes away (which may begin earlier, where the
    work grew: :func:`_grown_since`)."""
    worst = max(by_step, key=lambda s: (by_step[s], -s))
    runs = _what_if_steps(by_step, floor, len(by_step)) or ((worst, worst),)
    return runs, [s for a, b in runs for s in range(a, b + 1)]


def _steps_text(runs: Sequence[tuple[int, int]]) -> str:
    """Runs of steps (first, last) as words: ``step 9``, ``steps 4 and 9``, ``steps 2, 4-6 and 9``."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return f"step {parts[0]}" if len(runs) == 1 and runs[0][0] == runs[0][1] else f"steps {_and_text(parts)}"


def _and_text(words: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _what_if_step_floor(result: AnalysisResult) -> float:
    """The least wait at a step that a what-if (:func:`_what_if_steps`) names it for: :data:`ONE_OFF_OF_STEP`
    of the job's median simulated step, and :data:`BLAMED_NS` or more."""
    return max(BLAMED_NS, ONE_OFF_OF_STEP * _median_step_ns(result))


def _median_step_ns(result: AnalysisResult) -> float:
    """The job's median simulated step (the what-if's baseline), 0 without the what-if."""
    if result.blame is None or not result.blame.baseline_step_ns:
        return 0.0
    return float(np.median(list(result.blame.baseline_step_ns.values())))


class WhatIf(NamedTuple):
    """A what-if of :func:`what_if_notes`: what a rank made its peers wait for (``rank 1 made its peers
    wait for ...``), and the replay's overrides that take it away (shell words: after ``trace=`` and
    ``out=``, :func:`~skewlens.profiler.store.issues.replay_command`)."""

    note: str
    overrides: tuple[str, ...]


def what_if_notes(result: AnalysisResult, ranks: Sequence[int]) -> list[WhatIf]:
    """For each of ``ranks`` that made its peers wait mostly for one thing it did (half its caused wait or
    more at events whose own cause is it, passed on by another rank or not: its caused wait holds both, and
    before, a hybrid-sharded run's straggler, whose replicas waited for it through its shard peer, was named
    none; in the steps the per-step figures are a mean over, and in all :data:`ONE_OFF_OF_STEP` of the job's
    median simulated step or more: a first step's warm-up of 0.45 ms in six 13.5 ms steps is none), the
    replay that takes it away, at the steps where it did
    (:func:`_what_if_steps`): untraced host time (events caused by ``host idle/gap``:
    ``slowdown=host_idle``), or a scope that stalled (events caused by ``compute grew`` whose first-named op
    is one, :attr:`~skewlens.analysis.skew.Cause.stalled_scope`: an ``op`` item matching its name, factor 0;
    a real ``DataLoader``'s stall is its ``enumerate(DataLoader)#...`` scope, compute), as
    :func:`mixed_gpus_note` names ``slow_gpu`` for a rank's GPU."""
    wanted = set(blame_step_ids(result))
    caused = caused_wait_in_steps(result)
    step_floor = _what_if_step_floor(result)
    floor = max(BLAMED_NS * len(wanted), ONE_OFF_OF_STEP * _median_step_ns(result))
    # rank -> what it did (None: untraced host time; else the op's name) -> step -> the wait it caused
    held: dict[int, dict[str | None, dict[int, int]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(int))
    )
    on_median: set[tuple[int, str | None]] = set()  # (rank, scope) where the median member ran the scope too
    # (rank, what) -> event's step -> the earliest step where it grew in the late member's window
    grew_from: dict[tuple[int, str | None], dict[int, int]] = defaultdict(dict)
    # (rank, what) -> the wait its lateness caused where another rank passed it on: counted with the rank's
    # own events against its caused wait (which holds them too), but not where it stalled (not its steps)
    passed: dict[tuple[int, str | None], int] = defaultdict(int)
    for e in result.skew.events:
        c = e.cause
        if e.clock_contradicted or e.blamed_rank < 0 or e.step not in wanted or e.total_exposed_wait_ns <= 0:
            continue
        if c.kind is CauseKind.HOST_GAP:
            what: str | None = None
        elif c.stalled_scope:
            what = c.ops[0][0]
        else:
            continue
        if c.passed_on:
            passed[(e.blamed_rank, what)] += e.total_exposed_wait_ns
            continue
        held[e.blamed_rank][what][e.step] += e.total_exposed_wait_ns
        if e.cause_first_step >= 0:
            at = grew_from[(e.blamed_rank, what)]
            at[e.step] = min(at.get(e.step, e.step), e.cause_first_step)
        if what is not None and c.op_median_ns > 0:
            on_median.add((e.blamed_rank, what))
    out = []
    for r in ranks:
        for what, by_step in held.get(r, {}).items():
            total = sum(by_step.values()) + passed[(r, what)]
            if total < floor or 2 * total < caused.get(r, 0):
                continue
            steps = _what_if_steps(by_step, step_floor, len(wanted))
            steps = _grown_since(steps, grew_from[(r, what)], min(wanted), max(wanted))
            out.append(_what_if_text(r, what, steps, alone=(r, what) not in on_median))
    return out


#: At most this many runs of consecutive steps are named in a what-if of :func:`what_if_notes`
#: (:func:`_what_if_steps`).
WHAT_IF_STEPS = 4
#: A step is named in a what-if where it holds this share of the wait the thing caused or more
#: (:func:`_what_if_steps`): not one where a loaded host's noise made the peers wait a little.
WHAT_IF_STEP_SHARE = 0.1


def _what_if_steps(by_step: Mapping[int, int], floor: float, steps: int) -> tuple[tuple[int, int], ...]:
    """The runs of consecutive steps (first, last) that a what-if of :func:`what_if_notes` takes the thing
    away at, and that the uneven lines name (:func:`_uneven_steps`) by its wait or its cost; none: every step.

    ``by_step``: step -> the wait it made the rank's peers wait there (or its cost); ``floor``: a one-off's
    least; ``steps``: how many steps the run has (those missing from ``by_step`` count as 0). In order:

    * **Steps alike: none.** Where the worst step's wait is no more than :data:`UNEVEN_OVER_MEDIAN` times the
      lower median step's, the steps are alike, as the uneven lines say. Before, a rank that logged 21-39 ms
      at each of 9 steps was given a replay of the 4 steps over a tenth of the wait, which held over half of
      it; pasted, it left its peer waiting 13.9 ms a step of 30.0.
    * **The steps named:** each step whose wait is ``floor`` or more, :data:`WHAT_IF_STEP_SHARE` of the total
      or more, and ``floor`` more than the lower median step's (so that no step as typical as the median is
      named: a rank's sub-ms waits of load noise at 5 of 9 steps were all named, the median step itself among
      them), and always the worst step; consecutive ones merged into runs.
    * **None** where those are every one of the ``steps``, or hold no more than :data:`UNEVEN_WAIT_SHARE` of
      the wait (it is spread over many steps; two tied steps under the floor, the first named alone, held
      exactly half: over half is needed).
    * **Over :data:`WHAT_IF_STEPS` runs:** the one step holding over :data:`UNEVEN_WAIT_SHARE` of the wait,
      else none (a data loader's scope runs in every step, and is not taken away at every step where it
      stalled at some). That was once the only rule: a checkpoint rank 0 wrote every 3rd step while its peers
      waited at a barrier, 62% of their wait at step 3 and 35% at step 6 (2 gloo ranks), was given a replay
      that took away step 3's alone."""
    total = sum(by_step.values())
    worst = max(by_step, key=lambda s: (by_step[s], -s))
    # steps alike (the worst no more than twice the lower median step's, the steps it made no one wait at
    # counted as 0) are no one-off: every step
    waits = sorted([*by_step.values(), *[0] * (steps - len(by_step))])
    if by_step[worst] <= UNEVEN_OVER_MEDIAN * waits[(len(waits) - 1) // 2]:
        return ()
    # a step named exceeds that lower median step by the floor too, so that no step as typical as it is named:
    # before, a rank's sub-ms waits of load noise at 5 of 9 steps were all named, the median step itself among
    # them ('steps 2-5 and 7 ... 1.662, 1.002, 3.520, 1.114 and 0.881 ms, 100% of it, in its median step
    # 0.881 ms', the floor 0.652 ms)
    least = max(floor, WHAT_IF_STEP_SHARE * total, waits[(len(waits) - 1) // 2] + floor)
    held = sorted(s for s, w in by_step.items() if w >= least or s == worst)
    runs = consecutive_runs(held)
    if len(held) >= steps or sum(by_step[s] for s in held) <= UNEVEN_WAIT_SHARE * total:
        return ()
    if len(runs) > WHAT_IF_STEPS:
        return ((worst, worst),) if by_step[worst] > UNEVEN_WAIT_SHARE * total else ()
    return tuple(runs)


def _grown_since(
    runs: tuple[tuple[int, int], ...], grew_from: Mapping[int, int], first: int, last: int
) -> tuple[tuple[int, int], ...]:
    """``runs`` (first, last) of :func:`_what_if_steps`, each begun at the earliest step where the scope grew
    before the events of its steps (``grew_from``: an event's step -> the first step of the scope's rows in
    its window, :attr:`~skewlens.analysis.skew.SkewEvent.cause_first_step`), not before ``first`` (the run's
    first step), overlapping or adjacent runs merged in the order of their new starts (runs (5, 5) and (8, 8)
    whose growth began at steps 4 and 1 are (1, 8): merged in run order, they were (4, 8)); none (every step)
    where they are none or every step to ``last``. Before, a run was the events' steps alone: on 2 gloo ranks
    of Local SGD averaging every 4th step, rank 1's forward 30 ms slower every step, the what-if took its
    forward away at the averaging steps 2, 6 and 10, and its peer still waited 15.8 ms a step of 23.2 (the 3
    local steps before each average)."""
    grown = sorted(
        (max(first, min([a, *(grew_from.get(s, s) for s in range(a, b + 1))])), b) for a, b in runs
    )  # by their new starts: a later run's growth can reach back past an earlier run's (subgroups)
    out: list[tuple[int, int]] = []
    for a, b in grown:
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return () if out == [(first, last)] else tuple(out)


#: Between the items of a what-if's ``slowdown.entries`` (one shell word: quoted).
_WHAT_IF_ITEMS_SEP = ", "


def _what_if_text(
    rank: int, op: str | None, steps: tuple[tuple[int, int], ...], *, alone: bool = False
) -> WhatIf:
    """The what-if note of :func:`what_if_notes`: rank ``rank``'s untraced host time (``op`` None) or op
    ``op`` taken away, at the runs of steps ``steps`` (first, last; none: every step); ``alone``: the median
    member ran none of the scope (rank 0's checkpoint write), which then did not take "over twice its time on
    the median member", as the note said before, but is the rank's alone."""
    if op is None:
        what = (
            "untraced host time (between traced operators: a data loader, gc.collect(), a checkpoint write)"
        )
        if len(steps) > 1 or (steps and steps[0][0] != steps[0][1]):
            # the preset takes one step: several are an item each
            items = _WHAT_IF_ITEMS_SEP.join(
                f"{{kind:host_idle,ranks:[{rank}],first_step:{a},last_step:{b},factor:0}}" for a, b in steps
            )
            return _what_if(rank, what, shlex.quote(f"slowdown.entries=[{items}]"))
        at = (f"slowdown.step={steps[0][0]}",) if steps else ()
        return _what_if(rank, what, "slowdown=host_idle", f"slowdown.rank={rank}", *at, "slowdown.factor=0")
    what = (
        f"its scope {op}, which the median member did not run"
        if alone
        else f"its scope {op}, which stalled (it took over twice its time on the median member)"
    )
    # the name itself, as a glob, in a Hydra string (a quote escaped) in a shell word (shlex: a name
    # with a ' or a space is one argument still)
    pattern = re.sub(r"([*?\[])", r"[\1]", op).replace('"', '\\"')
    ats = [f"first_step:{a},last_step:{b}," for a, b in steps] or [""]
    items = _WHAT_IF_ITEMS_SEP.join(
        f'{{kind:op,ranks:[{rank}],{at}factor:0,pattern:"{pattern}"}}' for at in ats
    )
    return _what_if(rank, what, shlex.quote(f"slowdown.entries=[{items}]"))


def _what_if(rank: int, what: str, *overrides: str) -> WhatIf:
    """The what-if of :func:`_what_if_text`: what rank ``rank`` made its peers wait for, and the replay."""
    return WhatIf(f"rank {rank} made its peers wait for {what}", overrides)


def _costs_anything(rec: BlameRecord, steps: int) -> bool:
    """Whether ``rec``'s rank costs (simulated), or made others wait, :data:`BLAMED_NS` a step or more."""
    floor = BLAMED_NS * steps
    return (rec.simulated and rec.straggler_cost_ns >= floor) or rec.caused_wait_ns >= floor


#: The waits a rank caused beyond its cost, a step, from which :func:`uncompared_notes` looks for why: 1 ms,
#: what a reader of the stragglers table sees as a rank blamed for more than it costs.
UNEXPLAINED_NS = 1_000_000
#: The share of those unexplained waits that its work without a counterpart must reach to be the reason.
UNCOMPARED_SHARE = 0.5


def uncompared_notes(result: AnalysisResult) -> list[str]:
    """A note for each rank the collectives table blames for waits that the what-if cannot charge it: the
    waits it caused exceed its cost by :data:`UNEXPLAINED_NS` a step, and :data:`UNCOMPARED_SHARE` as much of
    its work or more has no counterpart on another rank (the work before sends only it makes), which the
    what-if keeps as it is."""
    blame = result.blame
    if blame is None:
        return []
    steps = max(len(blame.baseline_step_ns), 1)
    out = []
    for rec in blame.records:
        alone = blame.uncompared_ns.get(rec.rank, 0)
        unexplained = rec.caused_wait_ns - max(rec.straggler_cost_ns, 0)
        if unexplained >= steps * UNEXPLAINED_NS and alone >= UNCOMPARED_SHARE * unexplained:
            caused, kept = ms_text(rec.caused_wait_ns // steps), ms_text(alone // steps)
            out.append(
                f"rank {rec.rank} caused {caused} ms of waits a step, but {kept} ms a step of its work has "
                "no counterpart on another rank to compare it with (the work before sends only it makes): "
                "the what-if keeps it as it is, so its cost leaves it out; the worst collectives say what "
                "it held up"
            )
    return out


#: At most this many GPU models are named in :func:`mixed_gpus_note` (the rest are counted).
MAX_GPU_MODELS = 4


def mixed_gpus_note(result: AnalysisResult) -> str | None:
    """Where the traces say the ranks ran on different GPUs (``manifest.gpus``: model, SMs or memory differ),
    which ranks ran on which, and that the causes and the what-if compare each rank's kernels with its
    peers' on other GPUs; None where they ran on one kind (or the traces do not say). Before, a rank on an
    A100 among H100s read "compute grew: sm90_xmma_gemm... +1.3 ms" against its peers', the GPUs unsaid."""
    m = result.run.manifest
    by_gpu: dict[str, list[int]] = {}
    for r in m.ranks:
        if gpu := m.gpus.get(r, ""):
            by_gpu.setdefault(gpu, []).append(r)
    if len(by_gpu) < 2:
        return None
    groups = sorted(by_gpu.items(), key=lambda g: (-len(g[1]), g[1][0]))
    said = [
        f"{'ranks' if len(rs) > 1 else 'rank'} {rank_ranges(rs)} on {gpu}"
        for gpu, rs in groups[:MAX_GPU_MODELS]
    ]
    if len(groups) > MAX_GPU_MODELS:
        said.append(f"{len(groups) - MAX_GPU_MODELS} more models on the other ranks (manifest.json's gpus)")
    unsaid = [r for r in m.ranks if not m.gpus.get(r)]
    if unsaid:
        whose = "the traces of ranks" if len(unsaid) > 1 else "the trace of rank"
        said.append(f"no GPU said by {whose} {rank_ranges(unsaid)}")
    return (
        f"the ranks ran on {len(groups)} kinds of GPU: {'; '.join(said)}. The causes ('compute grew') and "
        "the what-if (runs like the median rank) compare each rank's kernels with its peers' on other GPUs: "
        "a rank's slower kernels may be its GPU's (what replacing rank R's would give: the replay under "
        "this note, F below 1 the new GPU's speed-up)"
    )


#: The replay that :func:`mixed_gpus_note` names: rank R's GPU ops F times as long.
SLOW_GPU_OVERRIDES = ("slowdown=slow_gpu", "slowdown.rank=R", "slowdown.factor=F")


#: Mark of a synchronisation point whose members' recorded times contradict each other.
CLOCK_MARK = "(clocks?)"


def worst_collectives_table(result: AnalysisResult, top: int = 10) -> Table:
    """Synchronisation points with the most exposed wait, summed over their members (31 members waiting
    1.63 ms each: 50.54 ms beside a skew of 1.63), with the bytes of the largest member's call as recorded
    (``collective_skew.comm_bytes``: its input, an all_to_all's own chunk included, not what crossed the
    network). Those whose
    members' recorded times contradict each other (``clock_contradicted``: clocks that disagree) come after
    the others, marked :data:`CLOCK_MARK`: their skew and waits are not meaningful. Those of a group with a
    member without a trace, who may have been the late one, are blamed on no rank (``-``)."""
    t = Table(
        title="Worst collectives / p2p (by exposed wait: not hidden under compute)", title_justify="left"
    )
    for c in ("step", "collective", "bytes", "skew ms", "exposed wait ms (members' sum)", "late", "blamed"):
        t.add_column(c, justify="left" if c == "collective" else "right", no_wrap=c == "collective")
    cause_column(t)
    waited = [e for e in result.skew.events if e.total_exposed_wait_ns > 0]
    events = sorted(waited, key=lambda e: (e.clock_contradicted, -e.total_exposed_wait_ns))[:top]
    for e in events:
        mark = f" {CLOCK_MARK}" if e.clock_contradicted else ""
        t.add_row(
            str(e.step),
            f"{e.label}{mark}",
            size_text(int(e.comm_bytes.max())),
            ms_text(e.skew_ns),
            ms_text(e.total_exposed_wait_ns),
            str(e.late_rank),
            str(e.blamed_rank) if e.blamed_rank >= 0 else "-",
            e.cause.text or "-",
        )
    notes = []
    if len(waited) > len(events):  # at 1,024 ranks: 10 rows of 20,512 and nothing said of the rest
        notes.append(
            f"{len(events)} of the {len(waited):,} with exposed wait shown; every one is in {SKEW_FILE}"
        )
    named = _groups_named(result, [e.pg_name for e in events])
    if named:
        notes.append(named)
    if any(e.blamed_rank < 0 for e in events):
        notes.insert(
            0,
            "blamed -: a member of the group has no trace and may have arrived last: late is the last traced "
            "member, and its members' waits are charged to no rank",
        )
    if any(e.clock_contradicted for e in events):
        notes.insert(
            0,
            f"{CLOCK_MARK}: a member recorded as done before one it waits for began: the ranks' clocks "
            "disagree, so its skew, waits and cause are not meaningful (listed after the others)",
        )
    if notes:
        t.caption = "\n".join(notes)
    elif not events:
        t.caption = (
            "none: no member of a collective or p2p waited for a peer outside compute"
            if result.skew.events
            else "none: the run has no collective or p2p whose members were all traced"
        )
    return t


def _groups_named(result: AnalysisResult, names: Sequence[str]) -> str:
    """``group 2: rev_unsorted, ranks 1, 0; group 5: ranks 0, 1``: the groups other than the default one
    that ``names`` name (first named first), with the description the program gave each and its members in
    group-rank order ('' for none): a label gives a group only torch's number (or its hash of the ranks)."""
    run = result.run
    default = default_group_name(run.process_groups.values())
    parts = []
    for name in dict.fromkeys(names):
        g = run.process_groups.get(name)
        if g is None or name == default:
            continue
        desc = group_desc(g)
        parts.append(f"group {name}: {desc + ', ' if desc else ''}{group_members(g)}")
    return "; ".join(parts)


def ranks_left_out(shown: RankMeans, rest: RankMeans) -> str:
    """What a per-rank breakdown of only ``shown`` leaves out: how many ranks, and the others' medians."""
    step = float(np.median(rest.mean_ns[:, MEAN_PARTS.index("step")]))
    wait = float(np.median(rest.mean_ns[:, MEAN_PARTS.index("exposed wait")]))
    n = len(shown.ranks) + len(rest.ranks)
    return (
        f"{n:,} ranks: the {len(shown.ranks)} that waited least for their peers; the other "
        f"{len(rest.ranks):,}: step {ms_text(step)} ms, wait {ms_text(wait)} ms (medians); every rank is in "
        f"{BREAKDOWN_FILE}"
    )


def outliers_note(result: AnalysisResult, *, most: int = 3) -> str | None:
    """The steps far longer than their ranks' median (:func:`~skewlens.analysis.breakdown.outlier_steps`),
    which the per-rank means include, or None; of more than ``most``, the ``most`` longest against their
    ranks' medians, longest first."""
    found = outlier_steps(
        result.breakdown, step_work=step_comm(result.index), compiled=steps_compiled(result.index)
    )
    if not found:
        return None
    # of many, the longest against their medians, longest first: a 1,000-step run named its first three
    # (steps 19-21 at 1.6-3.7x) and "382 more", not step 838 at 5.9x
    longest = sorted(found, key=lambda o: -o.worst_step_ns / o.median_step_ns)[:most]
    named = "; ".join(o.describe() for o in (longest if len(found) > most else found))
    rest = len(found) - most
    more = (
        f"; and {rest:,} more {'step' if rest == 1 else 'steps'} over {OUTLIER_FACTOR}x, none longer against "
        f"{'its' if rest == 1 else 'their'} median"
        if rest > 0
        else ""
    )
    # a step of far more collectives or bytes than the median step did more work (a prefill among decode
    # steps, a longer request, two iterations where the optimizer.step() between them did not run, which
    # marks no step): before, a serving loop's were put down to warm-up like a first step, and a GradScaler's
    # skipped step read only as an evaluation pass, a prefill or a longer request
    work = sum(o.more_work for o in found)
    why = (
        f"{'it' if len(found) == 1 else f'{work:,} of them'} made or moved over {OUTLIER_FACTOR}x the "
        "collectives or bytes of the median step: more work, such as two iterations in one step (an "
        "optimizer.step() that did not run: a GradScaler's skip), an evaluation pass, a prefill or a longer "
        "request; "
        if work
        else ""
    )
    # a step its worst rank spent mostly waiting for its peers is a late rank's (Local SGD's or DiLoCo's
    # average after steps with no collective), not more work: before, an average read 'more work'
    late = sum(o.waited for o in found)
    why += (
        f"{'it' if len(found) == 1 else f'{late:,} of them'} mostly waited for a late peer: see the "
        "stragglers and the collectives above; "
        if late
        else ""
    )
    # a step in which torch.compile compiled (the first, a recompile) is warm-up, however long: before, a
    # 2-rank compiled TP capture from step 0 named that step (11.0 s against 19.6 ms) as 'more work, such as
    # a prefill', and the stragglers table its slower compiler's rank
    built = sum(o.compiled for o in found)
    compiled = (
        f"{'it' if len(found) == 1 else f'{built:,} of them'} compiled (torch.compile: warm-up, not skew); "
        if built
        else ""
    )
    # warm-up is said only of a step among the first profiled ones: a rank that got 0.5 ms slower each step
    # (2 gloo ranks, 60 steps) had its last steps named, with "(a first profiled step often holds warm-up)"
    first = sorted({b.step for b in result.breakdown})[:WARM_UP_STEPS]
    warm = "a first profiled step often holds warm-up" if any(o.step in first for o in found) else ""
    said = f"{why}{compiled}{warm}".removesuffix("; ")
    return (
        f"{named}{more}: the means include {'it' if len(found) == 1 else 'them'}"
        f"{f' ({said})' if said else ''}; every step is in {BREAKDOWN_FILE}"
    )


def breakdown_table(result: AnalysisResult, *, max_ranks: int = MAX_RANK_ROWS) -> Table:
    """Each rank's mean step breakdown (ms per step); of more than ``max_ranks`` ranks (0: no limit), those
    that waited least for their peers (where stragglers are), the others summed up in the caption."""
    shown, rest = rank_means(result.breakdown).least_waiting(max_ranks)
    # a GPU run also gets its kernels' own compute (HTA's), which the host operators' time hides in compute:
    # four more columns, which at their full names took 117 columns ("GPU kernels", "overlapped"); a
    # terminal of 100 cut every name to "compu…", "trans…": shorter names, the legend below, the share of
    # GPU comm hidden beside it (as the GPU idle table gives shares), and the steps in the title where every
    # rank has as many (as the stragglers table's "over 3 steps")
    gpu = any(b.gpu_compute_ns for b in result.breakdown)
    counts = {*shown.steps, *rest.steps}
    one_count = gpu and len(counts) == 1
    n_steps = next(iter(counts)) if one_count else 0
    over = f" over {n_steps:,} step{'s' if n_steps != 1 else ''}" if one_count else ""
    # padding shared between neighbouring cells (as the replay summary's): the eleven columns of a GPU run
    # fit 80 characters with figures of six (up to 999999 ms); their own padding folded its 14.46 over two
    # lines (14.4 / 6)
    t = Table(
        title=f"Step breakdown per rank (mean ms per step{over})", title_justify="left", collapse_padding=True
    )
    cols = ["rank", "steps", "step", "compute", "wait", "transfer", "overlapped", "idle"]
    if gpu:
        cols = [*cols[:5], "xfer", "overlap", "idle", "GPU kernels", "GPU comm", "GPU idle"]
    for c in cols:
        if not (one_count and c == "steps"):
            t.add_column(c, justify="right")  # GPU comm's share goes under it where the table is narrow
    notes = [ranks_left_out(shown, rest)] if rest.ranks else []
    if (outliers := outliers_note(result)) is not None:
        notes.append(outliers)
    if gpu:
        notes.append(
            "compute: host operators or GPU kernels running; wait, xfer: communication not under compute "
            "(its wait for peers, its transfer); overlap: communication under compute; GPU kernels: compute "
            "kernels alone (no NCCL, copies, memsets), as HTA counts compute; GPU comm: communication on the "
            "GPU (the part of it under compute kernels: HTA's overlap); GPU idle: no stream of the GPU ran "
            "anything (HTA's idle)"
        )
    if notes:
        t.caption = "\n".join(notes)
    for r, n, means in zip(shown.ranks, shown.steps, shown.mean_ns.tolist(), strict=True):
        cells = [ms_text(v) for v in means[: MEAN_PARTS.index("gpu comm") if gpu else len(cols) - 2]]
        if gpu:  # the GPU's communication and the share of it under compute kernels, and its idle time
            comm, hidden = means[MEAN_PARTS.index("gpu comm")], means[MEAN_PARTS.index("gpu comm overlap")]
            cells.append(f"{ms_text(comm)} ({percent_text(hidden, comm, 0)}%)" if comm > 0 else ms_text(comm))
            cells.append(ms_text(means[MEAN_PARTS.index("step")] - means[MEAN_PARTS.index("gpu busy")]))
        t.add_row(str(r), *([] if one_count else [str(n)]), *cells)
    return t


def gpu_idle_table(result: AnalysisResult, *, max_ranks: int = MAX_RANK_ROWS) -> Table | None:
    """Each rank's compute stream: its idle time and what it waited for (ms per step; the shares of the
    idle time); of more than ``max_ranks`` ranks (0: no limit), those whose stream idled the most. None on
    a run without GPU streams."""
    streams = compute_streams(result.gpu_idle)
    if not streams:
        return None
    t = Table(
        title="GPU idle per rank, compute stream (mean ms per step)",
        title_justify="left",
        collapse_padding=True,
    )
    for c in (
        "rank",
        "stream",
        "steps",
        "step",
        "busy",
        "idle",
        "launch wait",
        "comm wait",
        "stream wait",
        "other",
    ):
        t.add_column(c, justify="right")
    shown = most_idle(streams, max_ranks)
    notes = [v] if (v := verdict(streams)) is not None else []
    if len(shown) < len(streams):
        notes.append(f"{len(streams):,} ranks: the {len(shown)} whose compute stream idled the most")
    notes.append(
        "idle: the stream ran nothing; it waited for: launch: the host to launch its next op (host-bound); "
        "comm: communication; stream: work on another stream (an event); other: launch latency, and what "
        f"the trace does not say. Every stream of every rank and step is in {GPU_IDLE_FILE}"
    )
    t.caption = "\n".join(notes)

    def share(ns: float, idle: float) -> str:
        return f"{ms_text(ns)} ({percent_text(ns, idle, 0)}%)" if idle > 0 else ms_text(ns)

    for s in shown:
        t.add_row(
            str(s.rank),
            str(s.stream),
            str(s.steps),
            ms_text(s.step_ns),
            ms_text(s.busy_ns),
            ms_text(s.idle_ns),
            *(share(p, s.idle_ns) for p in s.parts_ns),
        )
    return t


def gpu_kernels_table(result: AnalysisResult, top: int = 8) -> Table | None:
    """The GPU ops with the most summed time over all ranks (ms and count a step on a rank that ran them,
    their share of all GPU ops' time); None on a run without GPU ops."""
    rows = top_kernels(result.gpu_kernels, top)
    if not rows:
        return None
    t = Table(title="GPU kernels by time (all ranks)", title_justify="left")
    _name_column(t, "kernel")
    for c in ("kind", "ranks", "ms / step", "count / step", "%"):
        t.add_column(c, justify="right")
    for k, name in zip(rows, short_names([k.name for k in rows]), strict=True):
        t.add_row(
            _name_cell(name),
            k.kind,
            str(k.ranks),
            ms_text(k.per_step_ns),
            f"{k.kernels_per_step:,.1f}",
            percent_text(k.share, 1.0),
        )
    t.caption = (
        "ms / step and count / step (how many ran): on a rank that ran it (the mean over those ranks); %: "
        "of all GPU ops' "
        "summed time; durations summed as HTA sums them (concurrent ones count twice); every rank's are in "
        f"{GPU_KERNELS_FILE}"
    )
    return t


def critical_path_table(result: AnalysisResult, top_ops: int = 5, *, max_ranks: int = MAX_RANK_ROWS) -> Group:
    """Each rank's share of the critical path over all steps (the ``max_ranks`` largest, 0: all; the rest
    summed up in the caption), and the ops that dominate it (their names cut to :data:`NAME_WIDTH`, one
    line each)."""
    by_rank, by_op = shares(result.critical_path, result.index)
    rank_tot: dict[int, int] = defaultdict(int)
    op_tot: dict[str, int] = defaultdict(int)
    for v in by_rank.values():
        for r, ns in v.items():
            rank_tot[r] += ns
    for ops in by_op.values():
        for n, ns in ops.items():
            op_tot[n] += ns
    total = sum(rank_tot.values()) or 1
    # what the figures sum (the Parquet's contributions alone gave 220.39 ms where the table said 221.02); the
    # table as wide as that line, which the three narrow columns wrapped into three
    summed = f"ms: contribution_ns + gap_before_ns in {CRITICAL_PATH_FILE}"
    t = Table(title="Critical path by rank", title_justify="left", min_width=len(summed))
    t.add_column("rank", justify="right")
    t.add_column("ms, all steps", justify="right")
    t.add_column("%", justify="right")
    ranked = sorted(rank_tot.items(), key=lambda x: -x[1])
    t.caption = summed
    if len(ranked) > max_ranks > 0:
        rest_ns = sum(ns for _r, ns in ranked[max_ranks:])
        t.caption = (
            f"{len(ranked):,} ranks on the path: the other {len(ranked) - max_ranks:,} hold "
            f"{ms_text(rest_ns)} ms ({percent_text(rest_ns, total)}%); every path node is in "
            f"{CRITICAL_PATH_FILE}"
            f"\n{summed}"
        )
        ranked = ranked[:max_ranks]
    for r, ns in ranked:
        t.add_row(str(r), ms_text(ns), percent_text(ns, total))
    # each name's contribution_ns, the gaps before them under a name of their own (a name's contribution_ns +
    # gap_before_ns gave gloo:all_reduce 20.57 ms where the table said 20.41, unsaid)
    gaps = " / ".join(g for g in (HOST_GAP, DEVICE_GAP) if g in op_tot) or HOST_GAP
    named = f"ms: contribution_ns by name, gap_before_ns as {gaps}"
    top = Table(title="Critical path by op", title_justify="left", caption=named, min_width=len(named))
    _name_column(top, "op")
    top.add_column("ms, all steps", justify="right")
    top.add_column("%", justify="right")
    shown = sorted(op_tot.items(), key=lambda x: -x[1])[:top_ops]
    for (_n, ns), name in zip(shown, short_names([n for n, _ns in shown]), strict=True):
        top.add_row(_name_cell(name), ms_text(ns), percent_text(ns, total))  # one decimal, as by rank
    return Group(t, top)


def report(result: AnalysisResult, *, top: int = 5) -> list[ReportPart]:
    """The terminal report (:func:`print_report` prints it): stragglers, worst collectives, per-rank
    breakdown, critical path shares; each replay a note names a :class:`Command` under it. What the
    run's analysis left out or assumed (``result.notes``: the ranks without a trace, what a lenient load
    skipped, incomplete steps) is not in it: the commands print those as warnings, on stderr."""
    gpus: list[ReportPart] = []
    if (gpu_note := mixed_gpus_note(result)) is not None:
        gpus = [
            Text(gpu_note, style="yellow"),
            Command(replay_command(result.run.run_dir, *SLOW_GPU_OVERRIDES)),
        ]
    return [
        *stragglers(result, top),
        *([hosts] if (hosts := hosts_table(result, top)) is not None else []),
        *(Text(note, style="yellow") for note in uncompared_notes(result)),
        *gpus,
        worst_collectives_table(result, 2 * top),
        breakdown_table(result),
        *([gpu] if (gpu := gpu_idle_table(result)) is not None else []),
        *([kern] if (kern := gpu_kernels_table(result)) is not None else []),
        critical_path_table(result),
    ]
