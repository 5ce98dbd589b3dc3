"""Problems found while loading or validating a run, collected as records rather than raised one by one."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from skewlens.profiler.errors import ValidationError
from skewlens.profiler.manifest import (
    CAPTURE_PARTS_ADVICE,
    CAPTURE_PARTS_NOTE,
    EARLIER_ATTEMPT_NOTE,
    REPLACED_NOTE,
    SCALE_NOTE,
    STEP_MARKS_NOTE,
    CallAt,
    Manifest,
    RankStop,
    degraded_notes,
    partial_traces,
)
from skewlens.profiler.store.model import type_mask
from skewlens.profiler.vocab import COMM_NODE_TYPES, SIZE_MUST_MATCH

if TYPE_CHECKING:
    from skewlens.profiler.store.model import RunTrace


class Severity(StrEnum):
    """How bad a problem is: errors make ``skewlens check`` fail and replay refuse the run."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, kw_only=True, slots=True)
class Issue:
    """One problem found in a run."""

    severity: Severity
    """error, warning or info."""
    kind: str
    """Short machine-readable kind (``dangling-dependency``, ``collective-mismatch``, ...)."""
    message: str
    """What is wrong, naming the file, rank, node, group and sequence number where they apply."""
    file: str = ""
    """The trace file concerned ('' for problems across ranks)."""
    rank: int | None = None
    """Global rank concerned, where one is."""
    node: int | None = None
    """Node id concerned, where one is."""

    def __str__(self) -> str:
        return self.message


@dataclass(eq=False, kw_only=True, slots=True)
class IssueLog:
    """Collects issues; in strict mode the first error is raised at once as :class:`ValidationError`."""

    strict: bool = False
    """Raise on the first error instead of collecting it."""
    issues: list[Issue] = field(default_factory=list)
    """Everything found so far, in the order found."""
    skipped: list[SkippedComm] = field(default_factory=list)
    """Communication whose members disagree: what a lenient load leaves out of matching (a strict one
    keeps it matched, and reports it as errors)."""
    dropped_splits: list[DroppedSplits] = field(default_factory=list)
    """All_to_all nodes whose recorded splits are inconsistent, their splits dropped (a strict load refuses
    the rank instead)."""

    def add(
        self,
        severity: Severity,
        kind: str,
        message: str,
        *,
        file: str = "",
        rank: int | None = None,
        node: int | None = None,
    ) -> None:
        if self.strict and severity is Severity.ERROR:
            raise ValidationError(message)
        self.issues.append(
            Issue(severity=severity, kind=kind, message=message, file=file, rank=rank, node=node)
        )

    def skip(self, item: SkippedComm) -> None:
        """Record communication whose members disagree (its issues are added separately)."""
        self.skipped.append(item)

    def drop_splits(self, item: DroppedSplits) -> None:
        """Record a node whose splits were dropped (its issue is added separately)."""
        self.dropped_splits.append(item)

    def error(
        self, kind: str, message: str, *, file: str = "", rank: int | None = None, node: int | None = None
    ) -> None:
        self.add(Severity.ERROR, kind, message, file=file, rank=rank, node=node)

    def warning(
        self, kind: str, message: str, *, file: str = "", rank: int | None = None, node: int | None = None
    ) -> None:
        self.add(Severity.WARNING, kind, message, file=file, rank=rank, node=node)

    def info(
        self, kind: str, message: str, *, file: str = "", rank: int | None = None, node: int | None = None
    ) -> None:
        self.add(Severity.INFO, kind, message, file=file, rank=rank, node=node)


@dataclass(frozen=True, kw_only=True, slots=True)
class SkippedComm:
    """Communication whose members disagree across ranks, left out of matching by a lenient load: its nodes
    keep their recorded durations and synchronise with no other rank."""

    pg_name: str
    """Process group ('' where the nodes name none)."""
    p2p: bool
    """True for sends/recvs, False for collectives."""
    reason: str
    """What disagrees, short: ``sizes differ``, ``order differs``, ``no matching recv``, ..."""
    detail: str
    """The values that disagree, per rank (``rank 0: 4 MiB, rank 1: 2 MiB``); '' where none."""
    seqs: tuple[int, ...] = ()
    """Sequence numbers of the collective instances concerned (a run of them for ``order differs``)."""
    nodes: tuple[tuple[int, int], ...] = ()
    """(global rank, row) of every node left unmatched."""

    @property
    def count(self) -> int:
        """Collective instances (or p2p ops) skipped."""
        return len(self.seqs) if self.seqs else len(self.nodes)

    def describe(self) -> str:
        """``sizes differ (rank 0: 4 MiB, rank 1: 2 MiB) at seq 12``."""
        text = self.reason + (f" ({self.detail})" if self.detail else "")
        if not self.seqs:
            return text
        lo, hi = self.seqs[0], self.seqs[-1]
        return f"{text} at seq {lo}" + (f"-{hi}" if hi != lo else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class DroppedSplits:
    """An all_to_all node whose recorded per-member splits are inconsistent, kept by a lenient load without
    them: it keeps its recorded ``comm_size`` and is an even all_to_all, as a node that recorded none."""

    file: str
    """The rank's trace file."""
    rank: int
    """Global rank."""
    node_id: int
    """The node's id."""
    reason: str
    """What is inconsistent (``lengths differ: 3 and 2 entries``)."""

    def describe(self) -> str:
        """``RUN/rank-1.et: rank 1: node 57: all_to_all splits dropped (lenient): a negative size; ...``."""
        return (
            f"{self.file}: rank {self.rank}: node {self.node_id}: all_to_all splits dropped (lenient): "
            f"{self.reason}; the node is an even all_to_all of its recorded comm_size"
        )


#: Per group and reason, at most this many skipped items are described; the rest are counted.
DESCRIBED_SKIPS = 3
#: At most this many ranges of ranks are spelt out by :func:`rank_ranges`.
SHOWN_RANGES = 12
#: Most ranks a per-rank table of any report lists one by one (a run of 1,024 ranks is summed up in its
#: caption): the replay's and the analyses' tables, the import and capture summaries.
MAX_RANK_ROWS = 32


def consecutive_runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """``numbers`` as runs of consecutive ones, (first, last) each, in order: ``0, 2, 3, 4, 7`` is
    ``(0, 0), (2, 4), (7, 7)``."""
    runs: list[tuple[int, int]] = []
    for r in sorted(set(numbers)):
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return runs


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks as ranges: ``0, 2-4, 7`` (at most :data:`SHOWN_RANGES` ranges, then how many more ranks)."""
    runs = consecutive_runs(ranks)
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:SHOWN_RANGES]]
    rest = sum(b - a + 1 for a, b in runs[SHOWN_RANGES:])
    return ", ".join(parts) + (f" and {rest} more" if rest else "")


#: Where in its file a trace breaks (``at byte offset 1234: needs 56 bytes, 7 left``): left out of what
#: :func:`by_reason` groups ranks by.
_WHERE_IN_FILE = re.compile(r" at byte offset \d+(?:: needs \d+ bytes, \d+ left)?")


def by_reason(said: Iterable[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """What was said of each rank, grouped: (ranks, what was said of them) per reason, in the order first
    said. Texts that differ only in the rank's own number (its file's name included) and in where in its file
    a trace breaks are one reason; said of one rank, it is as it was said; of several, with ``<r>`` for each
    rank's number (``run/rank-<r>.et: rank <r> is listed but its trace file is missing``), and where the
    place in the file differed, without it and a word that it differs."""
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for r, text in said:
        # the rank's own number (rank 5, rank-5.et, rank5_kineto, a Chakra prefix's trace.5.et), not a path's
        number = re.compile(rf"(\brank[-_ ]?){r}(?!\d)|(\.){r}(?=\.et\b)")
        own = number.sub(r"\1\2<r>", text)
        groups.setdefault(number.sub(r"\1\2<r>", _WHERE_IN_FILE.sub("", text)), []).append((r, text, own))
    out = []
    for key, items in groups.items():
        if len(items) == 1:
            out.append(([items[0][0]], items[0][1]))
        elif len({own for _r, _text, own in items}) == 1:
            out.append(([r for r, _text, _own in items], items[0][2]))
        else:
            out.append(([r for r, _text, _own in items], f"{key} (at a different place in each file)"))
    return out


def path_word(path: object) -> str:
    """``path`` as one word of a command the user copies: shell-quoted (a space in it still one word), and a
    relative path that begins with ``-`` written ``./-x``, which the command would otherwise take for an
    option (``skewlens check -x/run``: 'unrecognized arguments')."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def hydra_override(key: str, value: str) -> str:
    """``key=value`` as one argument Hydra reads back as that value: bare where its override grammar takes
    the value as it is, else in Hydra's single quotes (a path with a space, ``=``, ``,`` or a non-ASCII
    letter). For an argument list (a child ``skewlens replay``); :func:`override` writes it for a shell."""
    if _BARE.fullmatch(value):
        return f"{key}={value}"
    # inside Hydra's quotes a backslash is itself except before a quote (and the closing one)
    inner = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    inner = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, inner)
    return f"{key}='{inner}'"


def override(key: str, value: str) -> str:
    """``key=value`` as a shell word Hydra reads back as that value (quoted where the value has
    characters Hydra's override grammar or the shell would read otherwise: spaces, ``=``, non-ASCII)."""
    if _BARE.fullmatch(value):
        return f"{key}={value}"
    if re.fullmatch(r"[^'\"$`\\!]*", value):  # the shell's double quotes keep it as it is: easier to read
        return f"\"{key}='{value}'\""
    return shlex.quote(hydra_override(key, value))


#: A value Hydra's override grammar and the shell both take as it is.
_BARE = re.compile(r"[A-Za-z0-9_./:@+-]+")


def replay_command(trace: str, *overrides: str) -> str:
    """``skewlens replay trace=TRACE out=OUT OVERRIDES...``: a replay of the run at ``trace`` for the user to
    copy, its path one shell word that Hydra reads back as it is (:func:`override`), ``OUT`` theirs to
    replace; each of ``overrides`` a shell word already. Every command a note or a message gives to replay
    a run is written here, and printed on a line of its own (``skewlens.console.print_line``), whole."""
    return " ".join(("skewlens replay", override("trace", trace), "out=OUT", *overrides))


def counted(n: int, noun: str) -> str:
    """``1 rank``, ``2 ranks``, ``1,024 ranks``: a count and its noun, in the plural unless it is one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def no_trace_line(missing: Sequence[int], world_size: int) -> str:
    """``rank 3 of 4 has no trace``, ``126 of 128 ranks have no trace: 2-127``: all ranks without a trace in
    one line."""
    if len(missing) == 1:
        return f"rank {missing[0]} of {world_size} has no trace"
    return f"{len(missing)} of {world_size} ranks have no trace: {rank_ranges(missing)}"


def format_bytes(n: int) -> str:
    """``3072`` -> ``3 KiB``, ``107822144`` -> ``102.8 MiB`` (binary units, at most one decimal)."""
    if abs(n) < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
        value /= 1024
    return f"{value:.1f}".removesuffix(".0") + " GiB"


#: Decimals of a figure in ms by its magnitude (:func:`ms_text`): three below 100 ms (to the µs), one below
#: 10,000 ms, none from there.
_MS_DECIMALS = ((3, 100.0), (1, 10_000.0))


def ms_text(ns: float) -> str:
    """``ns`` in ms, its decimals by its magnitude, as every report's tables and lines print ms: ``0.500``,
    ``12.345``, ``876.5``, ``4467.9``, ``168924`` (to the µs below 100 ms, then three to five significant
    digits; the digits before the point all kept, no thousands separator): six characters at most up to
    1,000 s, which the analyses' ten-column tables hold at 80 columns, eight up to a day (two decimals
    throughout, ``168,923.52`` for a 169 s step, fold over three lines there: ``168,`` / ``923.`` /
    ``52``). A figure that rounds to zero is ``0.000``, not ``-0.000`` (a what-if cost a few ns below
    zero)."""
    ms = ns / 1e6
    decimals = 0
    for places, below in _MS_DECIMALS:
        if abs(round(ms, places)) < below:  # 99.9996 is 100.0, not 100.000
            decimals = places
            break
    text = f"{ms:.{decimals}f}"
    return text.removeprefix("-") if float(text) == 0 else text


def percent_text(part: float, whole: float, decimals: int = 1) -> str:
    """``part`` as a percentage of ``whole``, without the sign, to one decimal as the reports' ``%``
    columns print it (``40.8``), or ``decimals`` (a share beside a figure: ``876.5 (1%)``); 0 of a ``whole``
    of 0, and never ``-0.0``."""
    text = f"{100.0 * part / whole if whole else 0.0:.{decimals}f}"
    return text.removeprefix("-") if float(text) == 0 else text


def per_rank(values: Mapping[int, str]) -> str:
    """Ranks grouped by value: ``rank 0: 4 MiB, rank 1: 2 MiB`` or ``ranks 0-62: 4 MiB, rank 63: 2 MiB``."""
    by_value: dict[str, list[int]] = {}
    for r, v in sorted(values.items()):
        by_value.setdefault(v, []).append(r)
    return ", ".join(
        f"{'rank' if len(rs) == 1 else 'ranks'} {rank_ranges(rs)}: {v}" for v, rs in by_value.items()
    )


def sizes_per_rank(sizes: Mapping[int, int]) -> str:
    """:func:`per_rank` of byte counts, exact where the rounded figures would hide the difference."""
    short = {r: format_bytes(b) for r, b in sizes.items()}
    if len(set(short.values())) < len(set(sizes.values())):
        short = {r: f"{b} B" for r, b in sizes.items()}
    return per_rank(short)


def summarise_skipped(skipped: Sequence[SkippedComm]) -> list[str]:
    """One line per process group: how many collective instances / p2p ops were skipped, and why.

    ``group '0': 3 collective instance(s) skipped: sizes differ (rank 0: 102.8 MiB, rank 1: 100.2 MiB)
    at seq 3; order differs (rank 0: ALL_TO_ALL, ALL_REDUCE; rank 1: ALL_REDUCE, ALL_TO_ALL) at seq 5-6``
    """
    by_group: dict[str, list[SkippedComm]] = {}
    for s in skipped:
        by_group.setdefault(s.pg_name, []).append(s)
    lines = []
    for g, items in sorted(by_group.items()):
        coll = sum(s.count for s in items if not s.p2p)
        p2p = sum(s.count for s in items if s.p2p)
        counts = [f"{n} {what}" for n, what in ((coll, "collective instance(s)"), (p2p, "p2p op(s)")) if n]
        by_reason: dict[str, list[SkippedComm]] = {}
        for s in items:
            by_reason.setdefault(s.reason, []).append(s)
        why = []
        for group_items in by_reason.values():
            shown = [s.describe() for s in group_items[:DESCRIBED_SKIPS]]
            rest = group_items[DESCRIBED_SKIPS:]
            if rest:
                seqs = [q for s in rest for q in s.seqs]
                where = f" at seq {rank_ranges(seqs)}" if seqs else ""
                shown.append(f"{sum(s.count for s in rest)} more {group_items[0].reason}{where}")
            why.append("; ".join(shown))
        name = f"group {g!r}" if g else "no process group"
        lines.append(f"{name}: {' and '.join(counts)} skipped: {'; '.join(why)}")
    return lines


#: At most this many nodes whose splits a lenient load dropped are described one by one; the rest are counted.
DESCRIBED_DROPS = 20


def summarise_dropped_splits(dropped: Sequence[DroppedSplits]) -> list[str]:
    """A line per node whose splits a lenient load dropped (the first :data:`DESCRIBED_DROPS`), then one
    that counts the rest with their ranks."""
    lines = [d.describe() for d in dropped[:DESCRIBED_DROPS]]
    rest = dropped[DESCRIBED_DROPS:]
    if rest:
        lines.append(
            f"and the all_to_all splits of {len(rest)} more node(s) dropped (lenient), on rank(s) "
            f"{rank_ranges(d.rank for d in rest)}"
        )
    return lines


def run_notes(run: RunTrace) -> list[str]:
    """What a report on ``run`` says besides its tables: that a capture may still be writing it (its
    :data:`~skewlens.profiler.manifest.CAPTURE_PARTS_NOTE`), the ranks a lenient load left out (a line per
    reason, with their ranks: :func:`by_reason`), the ranks without a trace (one line), the nodes whose
    inconsistent all_to_all splits it dropped (a line each, see :func:`summarise_dropped_splits`), and per
    process group the communication a lenient load skipped (see :func:`summarise_skipped`)."""
    m = run.manifest
    notes = []
    if CAPTURE_PARTS_NOTE in m.notes:
        saved = f" ({ranks_label(sorted(run.ranks))})" if run.ranks else ""
        notes.append(
            f"{m.notes[CAPTURE_PARTS_NOTE]}: read from the traces saved so far{saved}; {CAPTURE_PARTS_ADVICE}"
        )
    notes.extend(f"{ranks_label(rs)} left out (lenient): {why}" for rs, why in by_reason(run.left_out_ranks))
    left_out = {r for r, _why in run.left_out_ranks}
    missing = [r for r in m.missing_ranks if r not in left_out]
    if missing:
        notes.append(f"{no_trace_line(missing, m.world_size)}: only the traced ranks are used")
    stops = {s.rank: s for s in m.stopped}
    for r, note in sorted(partial_traces(m.notes).items()):
        unfinished = unfinished_step(stops.get(r))
        notes.append(f"{_partial_line(r, note)}{f': {unfinished}' if unfinished else ''}")
    notes.extend(f"{ranks_label(rs)}: {note}" for note, rs in degraded_notes(m.notes).items())
    notes.extend(whole_run_notes(m.notes))
    if (answer := stop_answer(m)) is not None:
        notes.append(answer)
    if untimed := untimed_ranks(run):
        notes.append(
            f"{ranks_label(untimed)}: {NO_START_TIMES}: its nodes were laid end to end in file order, so "
            "the recorded times are their durations back to back, not measured ones, and no wait for a peer "
            "is known"
        )
    if unknown := ends_unknown(run):
        notes.append(ends_unknown_line(unknown, m.source))
    if run.incomplete_steps:
        one = len(run.incomplete_steps) == 1
        their, those = ("its", "that step's") if one else ("their", "those steps'")
        notes.append(
            f"incomplete {steps_label(run.incomplete_steps)}: some of {their} communication is not "
            "in every trace (a flight recorder lost collectives, a rank stopped inside the step, or a thread "
            "issued collectives across the window's start or end: see skewlens check); it was left out of "
            f"matching, so {those} waits are partial"
        )
    if run.steps_differ:
        notes.append(run.steps_differ)
    if SCALE_NOTE in m.notes:
        notes.append(f"extrapolated: {m.notes[SCALE_NOTE]}")
    if STEP_MARKS_NOTE in m.notes:
        notes.append(f"steps: {m.notes[STEP_MARKS_NOTE]}")
    notes.extend(summarise_dropped_splits(run.dropped_splits))
    skipped = summarise_skipped(run.skipped_comm)
    if skipped:
        notes.append(
            "not synchronised across ranks (lenient), these nodes were used at their recorded durations:"
        )
        notes.extend(f"  {line}" for line in skipped)
    return notes


def lenient_line(run: RunTrace) -> str | None:
    """What a lenient load left out of ``run``, in one short line for the top of a report's stdout (its
    warnings, which say why, go to stderr, so a report saved with ``> report.txt`` said nothing of it):
    ``lenient: left out rank 2; 3 collective instance(s) not matched across ranks, ...``. None where it
    left out nothing."""
    parts = []
    if run.left_out_ranks:
        parts.append(f"left out {ranks_label(sorted({r for r, _why in run.left_out_ranks}))}")
    coll = sum(s.count for s in run.skipped_comm if not s.p2p)
    p2p = sum(s.count for s in run.skipped_comm if s.p2p)
    if counts := [f"{n} {what}" for n, what in ((coll, "collective instance(s)"), (p2p, "p2p op(s)")) if n]:
        parts.append(f"{' and '.join(counts)} not matched across ranks, at their recorded durations")
    if run.dropped_splits:
        parts.append(f"the all_to_all splits of {len(run.dropped_splits)} node(s) dropped")
    return f"lenient: {'; '.join(parts)}; the warnings on stderr say why" if parts else None


def untraced_members_line(run: RunTrace, *, replay: bool) -> str | None:
    """Where ranks of ``run``'s world have no trace and collectives of their groups were matched among the
    traced members alone, what that does to the figures. ``replay``: of a replay that models transfers
    (``comm_mode=model``), which synchronises those members only, so the time they waited for an untraced
    member, which a recorded transfer holds, is gone (a straggler without a trace replays as never late);
    else of an analysis, which blames those waits on no rank and whose what-if replays keep them as recorded
    (a rank whose lateness reached the others through an untraced rank costs less than it did). None
    elsewhere."""
    traced = set(run.ranks)
    untraced = sorted(set(range(run.manifest.world_size)) - traced)
    n = sum(
        1
        for c in run.collectives
        if (g := run.process_groups.get(c.pg_name)) is not None and not set(g.ranks) <= traced
    )
    if not untraced or not n:
        return None
    who = ranks_label(untraced)
    head = f"no trace of {who}: {n} collective instance(s) of groups with {who} synchronise the traced"
    head += " members only"
    if replay:
        return (
            f"{head}, and comm_mode=model models no wait for {who} there (as if never late), so steps may be "
            "shorter than the run's; comm_mode=as_recorded keeps those waits in the recorded transfers"
        )
    return (
        f"{head}: their waits are blamed on no rank, and the what-if costs keep the time spent waiting for "
        f"{who} as recorded, so lateness passed on through {who} is not in them"
    )


def capture_note_issues(m: Manifest, sink: IssueLog) -> None:
    """A warning per distinct note of the manifest's ``notes`` that says data was not recorded (with its
    ranks), for the note that several optimizers stepped (which one marked the steps), per rank whose trace
    is partial, and where the job stopped inside a step, which rank did not arrive at which collective
    (:func:`stop_answer`): what ``skewlens check`` lists and ``skewlens profile`` prints after its summary."""
    notes = m.notes
    for note, rs in degraded_notes(notes).items():
        sink.warning("capture-note", f"{ranks_label(rs)}: {note}", rank=rs[0] if len(rs) == 1 else None)
    for note in whole_run_notes(notes):
        sink.warning("capture-note", note)
    if STEP_MARKS_NOTE in notes:  # several optimizers stepped (analyze and replay said so)
        sink.warning("capture-note", f"steps: {notes[STEP_MARKS_NOTE]}")
    stops = {s.rank: s for s in m.stopped}
    for r, note in sorted(partial_traces(notes).items()):
        unfinished = unfinished_step(stops.get(r))
        after = f"{unfinished}, and the steps after it" if unfinished else "the steps after those"
        sink.warning("partial-trace", f"{_partial_line(r, note)}: {after} are not in its trace", rank=r)
    if (answer := stop_answer(m)) is not None:
        sink.warning("unfinished-step", answer)


def _partial_line(rank: int, note: str) -> str:
    """How the run's notes and ``skewlens check`` begin the line of a rank whose trace is partial: the
    note's steps saved, then why, with what the note says after ``; `` of the steps the rank marked."""
    head, _, marked = note.partition("; ")
    why = f"the command ended before the capture window did{f': {marked}' if marked else ''}"
    return f"rank {rank}: {head} ({why})"


def unfinished_step(stop: RankStop | None) -> str:
    """The step a rank that saved a partial trace was in, which no trace holds, and how many collectives
    it had started in it (``step 7 did not finish (3 collectives started in it are not in the trace)``);
    '' where it has no stop record or one written before skewlens counted them, and where it started no
    collective in it and its program raised nothing (a program that ran fewer steps than the window ends
    between steps: its trace lacks nothing of the step, which had not begun)."""
    if stop is None or stop.collectives_started is None:
        return ""
    n = stop.collectives_started
    if n == 0:
        return f"step {stop.step} did not finish (it had started no collective)" if stop.raised else ""
    return (
        f"step {stop.step} did not finish ({counted(n, 'collective')} started in it "
        f"{'is' if n == 1 else 'are'} not in the trace)"
    )


def whole_run_notes(notes: Mapping[str, str]) -> list[str]:
    """The manifest's notes of the whole run (an earlier attempt's traces, a replaced run) that the run's
    notes and ``skewlens check``'s warnings both repeat as written, in that order."""
    return [notes[k] for k in (EARLIER_ATTEMPT_NOTE, REPLACED_NOTE) if k in notes]


#: A message names at most this many files or directories of a list, then how many more (:func:`first_named`).
SHOWN_NAMES = 3


def first_named(names: Iterable[object]) -> str:
    """``h0, h2, h3 and 124 more``: the first :data:`SHOWN_NAMES` of ``names``, then how many more (a
    message naming 127 hosts' paths hid what it said)."""
    items = [str(n) for n in names]
    shown = ", ".join(items[:SHOWN_NAMES])
    return f"{shown} and {len(items) - SHOWN_NAMES} more" if len(items) > SHOWN_NAMES else shown


def ranks_label(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-1, 4`` (:func:`rank_ranges`)."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


def steps_label(steps: Sequence[int]) -> str:
    """``step 3``, ``steps 3-5, 7`` (:func:`rank_ranges`)."""
    return f"{'step' if len(steps) == 1 else 'steps'} {rank_ranges(steps)}"


NO_START_TIMES = "no start times in the trace"
"""The start of the note on a rank whose trace records no start time on any node (Chakra's generator and
``text2chakra`` write none): :func:`untimed_ranks`."""


def untimed_ranks(run: RunTrace) -> list[int]:
    """The ranks whose traces record no start times (``RankTrace.untimed``; their note begins with
    :data:`NO_START_TIMES`): their times are laid out by the loader, not measured."""
    return [r for r, rt in sorted(run.ranks.items()) if rt.untimed]


def unmatched_comm(run: RunTrace) -> str | None:
    """What says that communication nodes of ``run`` match no other rank (``3 communication node(s) match no
    other rank (incomplete steps 6-9), first rank 0's c10d::all_reduce_ (node 41, group '0' seq 6, step
    6)``), or None where every one does. The loader leaves them out of matching (their steps incomplete: a
    rank that stopped early, a flight recorder's losses, a window's tail; or a lenient load's
    disagreements); the simulator replays them like compute, but what issues them again (a real replay,
    ASTRA-sim) waits for peers that never issue them."""
    matched = {(r, row) for inst in run.collectives for r, row in zip(inst.ranks, inst.rows, strict=True)}
    matched |= {(p.src_rank, p.src_row) for p in run.p2p} | {(p.dst_rank, p.dst_row) for p in run.p2p}
    count, first = 0, None
    for r, rt in sorted(run.ranks.items()):
        rows = rt.rows_of_type(*COMM_NODE_TYPES).tolist()
        left = [i for i in rows if (r, i) not in matched]
        count += len(left)
        if left and first is None:
            first = (r, left[0])
    if first is None:
        return None
    r, i = first
    rt = run.ranks[r]
    group = f", group {run.pg_names[rt.pg[i]]!r} seq {rt.seq[i]}" if rt.pg[i] >= 0 and rt.seq[i] >= 0 else ""
    steps = f" (incomplete steps {rank_ranges(run.incomplete_steps)})" if run.incomplete_steps else ""
    return (
        f"{count:,} communication node(s) match no other rank{steps}, first rank {r}'s {rt.name(i)} "
        f"(node {rt.node_id[i]}{group}, step {rt.step[i]})"
    )


def ends_unknown(run: RunTrace) -> dict[int, int]:
    """Rank -> how many of its communication nodes were recorded without an end (a duration of 0: a
    collective only the flight recorder saw, whose gloo worker event was not recorded), where any."""
    out: dict[int, int] = {}
    for r, rt in sorted(run.ranks.items()):
        if n := int((type_mask(rt.node_type, COMM_NODE_TYPES) & (rt.dur_ns == 0)).sum()):
            out[r] = n
    return out


def ends_unknown_line(counts: Mapping[int, int], source: str) -> str:
    """One line on :func:`ends_unknown`'s counts, of a run whose manifest's ``source`` is ``source``: a
    capture's manifest notes why; another producer's trace (Chakra's generator, ``text2chakra``) may time no
    communication at all, which only a modelled replay costs."""
    why = "the manifest's notes say why" if source != "foreign" else "the trace records none"
    return (
        f"{sum(counts.values())} communication node(s) on {ranks_label(sorted(counts))} recorded without an "
        f"end (duration 0; {why}): their recorded transfers and waits are missing (replay comm_mode=model "
        "costs them from their sizes)"
    )


def _into(ns: int, start_ns: int) -> str:
    """``+12.3 ms`` / ``+10.02 s`` / ``-0.3 ms``: how far ``ns`` is past (or before) ``start_ns``."""
    d = ns - start_ns
    return f"{d / 1e9:+.2f} s" if abs(d) >= 1_000_000_000 else f"{d / 1e6:+.1f} ms"


def _between(deltas_ns: Sequence[int]) -> str:
    """``+0.5 ms`` or ``+0.5 ms to +0.7 ms``: the span of several ranks' times, each from its own start."""
    lo, hi = _into(min(deltas_ns), 0), _into(max(deltas_ns), 0)
    return lo if lo == hi else f"{lo} to {hi}"


def _seconds_between(ns: Sequence[int]) -> str:
    """``10.0 s`` or ``9.8 to 10.0 s``."""
    lo, hi = f"{min(ns) / 1e9:.1f}", f"{max(ns) / 1e9:.1f}"
    return f"{lo} s" if lo == hi else f"{lo} to {hi} s"


#: The stop records' names of the collective types whose members must agree on the size (``all_reduce``).
_SIZES_AGREE = frozenset(t.name.lower() for t in SIZE_MUST_MATCH)


def _issued_apart(inside: Sequence[tuple[int, CallAt]]) -> str | None:
    """``rank 0 broadcast of 2 KiB, ranks 1-3 all_reduce of 16 KiB``: the members of one call number grouped
    by what they issued as it, where they issued different collectives (another type, or another size of a
    type whose members must agree on it); None where they agree."""
    if len({(c.type, c.size_bytes if c.type in _SIZES_AGREE else -1) for _r, c in inside}) < 2:
        return None
    short = {(c.type, c.size_bytes): f"{c.type} of {format_bytes(c.size_bytes)}" for _r, c in inside}
    if len(set(short.values())) < len(short):  # rounded alike: exact
        short = {(t, b): f"{t} of {b:,} B" for t, b in short}
    by: dict[str, list[int]] = {}
    for r, c in inside:
        by.setdefault(short[(c.type, c.size_bytes)], []).append(r)
    return ", ".join(f"{ranks_label(rs)} {what}" for what, rs in by.items())


def _name(c: CallAt) -> str:
    return f"{c.type} {c.pg_name}#{c.seq}" if c.seq >= 0 else f"{c.type} on group {c.pg_name}"


def _sized(c: CallAt) -> str:
    """``broadcast 0#14 of 2 KiB``: the call with the bytes of its input, which the members must agree on."""
    return f"{_name(c)} of {format_bytes(c.size_bytes)}"


def stop_answer(m: Manifest) -> str | None:
    """Which rank did not arrive at which collective of the step a failed or hung job did not finish, read
    across the ranks' stop records (``manifest.stopped``): the first collective some member of its group is
    in (issued, not returned) that another member saved without having issued, with the rank in it since
    when (into its unfinished step) and the laggard's last returned call; members that issued different
    collectives under one number (another type, or another size where members must agree); and the ranks
    that saved no trace, beside every member in the call where all that saved are in it. None where no rank
    was in a call.
    With several groups a laggard that is itself in a call another member did not arrive at waits there: a
    collective with a laggard in no such call comes first, and a waiting laggard is said with its call."""
    stops = {s.rank: s for s in m.stopped}
    if not any(s.in_flight for s in stops.values()):
        return None
    members = {g.name: g.ranks for g in m.process_groups}
    # read once, not per call in flight and member (a manifest is untrusted: 4,000 calls in flight on each
    # of 2 ranks took 24 s): the highest number each rank issued on each group, and who is in each call
    issued: dict[str, dict[int, int]] = {}
    inside_of: dict[tuple[str, int], list[tuple[int, CallAt]]] = {}
    for r, s in sorted(stops.items()):
        for c in (*([s.last] if s.last else []), *s.in_flight):
            on = issued.setdefault(c.pg_name, {})
            on[r] = max(on.get(r, -1), c.seq)
        for c in s.in_flight:
            inside_of.setdefault((c.pg_name, c.seq), []).append((r, c))
    place_of: dict[str, dict[int, int]] = {}  # a group's members that saved a stop record: their places
    lowest: dict[str, float] = {}  # the lowest number any of them issued on it (-1: one issued none)

    def stopped_in(pg: str) -> dict[int, int]:
        if pg not in place_of:
            group = [r for r in members[pg] if r in stops] if pg in members else sorted(stops)
            place_of[pg] = {r: k for k, r in enumerate(group)}
            lowest[pg] = min((issued.get(pg, {}).get(r, -1) for r in group), default=float("inf"))
        return place_of[pg]

    late_of: dict[tuple[str, int], list[int]] = {}

    def late_at(pg: str, seq: int) -> list[int]:
        """The members of ``pg`` that saved without having issued its call ``seq`` (once per call)."""
        if (pg, seq) not in late_of:
            place = stopped_in(pg)
            late_of[(pg, seq)] = (
                [r for r in place if issued.get(pg, {}).get(r, -1) < seq] if lowest[pg] < seq else []
            )
        return late_of[(pg, seq)]

    flying = sorted(
        ((c.pg_name, c.seq, r, c) for r, s in stops.items() for c in s.in_flight if c.seq >= 0),
        key=lambda x: (x[1], x[0], x[2]),
    )
    # where each rank waits: the first call it is in that a member of its group did not arrive at
    waits_in: dict[int, CallAt] = {}
    for pg, seq, r, c in flying:
        if late_at(pg, seq):
            waits_in.setdefault(r, c)
    # a call whose laggards all wait in such calls themselves goes last (stable: then by number)
    flying.sort(key=lambda x: bool(late := late_at(x[0], x[1])) and all(r in waits_in for r in late))
    said: list[str] = []
    timed = False  # whether what is said has times (not of different collectives, nor of a missing rank)
    seen: set[tuple[str, int]] = set()
    for pg, seq, _r, call in flying:
        if (pg, seq) in seen:  # said as its first member's
            continue
        seen.add((pg, seq))
        place = stopped_in(pg)
        inside = sorted(((r, c) for r, c in inside_of[(pg, seq)] if r in place), key=lambda rc: place[rc[0]])
        late = late_at(pg, seq)
        if late:
            # one clause for all the members in it (with 64 ranks, one each made a line of 63 clauses)
            waits = (
                f"{ranks_label([r for r, _c in inside])} in it since "
                f"{_between([c.at_ns - stops[r].step_start_ns for r, c in inside])}, "
                f"{_seconds_between([stops[r].saved_ns - c.at_ns for r, c in inside])} before "
                + ("it saved" if len(inside) == 1 else "they saved")
            )
            # laggards whose last call, call waited in and exception agree are said together (a host's 8
            # ranks stuck reading data: one clause, not 8)
            alike: dict[tuple[str, str, str], list[int]] = {}
            for r in late:
                last, w = stops[r].last, waits_in.get(r)
                key = (_name(last) if last else "", _name(w) if w else "", stops[r].raised)
                alike.setdefault(key, []).append(r)
            lasts = "; ".join(
                (f"rank {rs[0]}'s last: " if len(rs) == 1 else f"last of ranks {rank_ranges(rs)}: ")
                + (
                    f"{last_name}, returned at "
                    + _between(
                        [lc.at_ns - stops[r].step_start_ns for r in rs if (lc := stops[r].last) is not None]
                    )
                    if last_name
                    else "none in the capture window"
                )
                + (
                    f", waiting in {wait_name} since "
                    + _between([waits_in[r].at_ns - stops[r].step_start_ns for r in rs])
                    if wait_name
                    else ""
                )
                + (
                    f", then {'its program' if len(rs) == 1 else 'their programs'} raised {raised}"
                    if raised
                    else ""
                )
                for (last_name, wait_name, raised), rs in alike.items()
            )
            said.append(f"{ranks_label(late)} did not arrive at {_sized(call)} ({waits}; {lasts})")
            timed = True
            break
        if (apart := _issued_apart(inside)) is not None:
            said.append(f"ranks issued different collectives as {pg}#{seq}: {apart}")
            break
    else:  # every member is in every collective some member is in: name where the ranks wait
        r, s = min((r, s) for r, s in stops.items() if s.in_flight)
        c = s.in_flight[-1]
        # unless a member saved its whole window (no stop record, not missing): it went on past the call, so
        # the call completed; gloo's recorder marks none completed, so a rank that ran out of batches under
        # Join and exited was said to be 'in' the broadcast that synced its final model
        went_on = (set(members.get(c.pg_name, m.ranks)) & set(m.ranks)) - set(stops) - set(m.missing_ranks)
        if not went_on:  # every member in it, not the first alone (who read as the one that held it)
            place = stopped_in(c.pg_name)  # its group's members only (a manifest is untrusted)
            inside = [(ri, ci) for ri, ci in sorted(inside_of[(c.pg_name, c.seq)]) if ri in place]
            inside = inside if c.seq >= 0 and inside else [(r, c)]
            since = _between([ci.at_ns - stops[ri].step_start_ns for ri, ci in inside])
            said.append(f"{ranks_label([ri for ri, _c in inside])} in {_sized(c)} since {since}")
            timed = True
    if m.missing_ranks:
        said.append(f"{ranks_label(list(m.missing_ranks))} saved no trace")
    if not said:
        return None
    step = min(s.step for s in stops.values())
    return (
        f"step {step} did not finish: "
        + "; ".join(said)
        + (" (times from the start of the step on each rank)" if timed else "")
    )
