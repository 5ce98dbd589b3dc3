"""Validate a run: collect every problem (``validate_run``) or refuse a bad run at once (``load_validated``).

Checked: truncated or corrupt protobuf (file and byte offset), unknown node types, dangling
dependencies, dependency cycles (the cycle's node ids and names), duplicate node ids, missing ranks
(against the manifest, or gaps in 0..N-1 without one), collectives that do not match across a group's
members (type, size or count; see :mod:`skewlens.profiler.store.match` for what "size differs" means
per type), sends without a matching recv and recvs without a matching send. Inferences the loader made (no
start times, sequence numbers numbered in file order, world-wide groups assumed) are reported as info.

Lenient (``lenient=True``; ``skewlens analyze --lenient``, ``skewlens replay lenient=true``): communication
whose members disagree across ranks is a warning instead of an error and is left unmatched, so the rest of
the run can be used; ``RunTrace.skipped_comm`` says, per process group, what was skipped and why. A rank
whose trace is missing or unreadable is left out (``RunTrace.left_out_ranks``), and an all_to_all node whose
splits are inconsistent loses only them (``RunTrace.dropped_splits``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from skewlens.profiler.errors import ValidationError
from skewlens.profiler.manifest import CAPTURE_PARTS_ADVICE, CAPTURE_PARTS_NOTE
from skewlens.profiler.store.issues import (
    Issue,
    IssueLog,
    Severity,
    SkippedComm,
    ends_unknown,
    ends_unknown_line,
    path_word,
    rank_ranges,
    summarise_skipped,
)
from skewlens.profiler.store.load import ANOTHER_RUNS, SPLITS_KIND, SYNTH_NOTE, Decoder, load_run
from skewlens.profiler.store.match import MISMATCH_KINDS
from skewlens.profiler.store.model import RankTrace, RunTrace
from skewlens.progress import NO_PROGRESS, Advance, Progress, given

#: How many errors ``load_validated`` puts into its one-line message.
FIRST_ERRORS = 5


@dataclass(eq=False, kw_only=True, slots=True)
class ValidationReport:
    """Everything ``validate_run`` found, plus the loaded run (for callers that go on to use it)."""

    path: str
    """The run directory or prefix validated."""
    issues: list[Issue] = field(default_factory=list)
    """All problems, in the order found."""
    run: RunTrace | None = None
    """The run as loaded: dangling dependencies dropped, unmatched sends/recvs left out, a collective
    whose members disagree kept with its first member's type (left out too where ``lenient``)."""
    skipped: list[SkippedComm] = field(default_factory=list)
    """Communication whose members disagree: what a lenient load leaves unmatched."""
    lenient: bool = False
    """Whether the run was loaded leniently (those disagreements are warnings, and left unmatched)."""

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def num_nodes(self) -> int:
        return sum(len(rt) for rt in self.run.ranks.values()) if self.run else 0


def find_cycle(rt: RankTrace) -> list[int] | None:
    """Rows of one dependency cycle of a rank, or None.

    A cycle needs at least one edge to a row at or after its own (file order is almost always a
    topological order), so the vectorised check settles the common case and the depth-first search
    only starts from the sources of such edges. The lowest row of a cycle is such a source and the
    cycle has no row below it, so the search from source ``u`` (in ascending order) skips rows below
    ``u``: on an imported GPU trace, whose few such edges are host syncs waiting for a copy 150 rows
    on, it visits about half the rows instead of every ancestor (32 ranks of 62,000 nodes: 1.18 -> 0.95
    CPU-s).
    """
    n = len(rt)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(rt.dep_ptr))
    forward = np.flatnonzero(rt.dep_idx >= owner)
    if forward.size == 0:
        return None
    ptr = rt.dep_ptr.tolist()
    dep = rt.dep_idx.tolist()
    color = bytearray(n)  # 0 new, 1 on the stack, 2 done
    for start in sorted(set(owner[forward].tolist())):
        if color[start]:
            continue
        stack: list[tuple[int, int]] = [(start, ptr[start])]
        path = [start]
        color[start] = 1
        while stack:
            v, k = stack[-1]
            if k < ptr[v + 1]:
                stack[-1] = (v, k + 1)
                w = dep[k]
                if w < start:
                    continue
                if color[w] == 1:
                    return [*path[path.index(w) :], w]
                if color[w] == 0:
                    color[w] = 1
                    stack.append((w, ptr[w]))
                    path.append(w)
            else:
                color[v] = 2
                stack.pop()
                path.pop()
    return None


def _check_cycles(run: RunTrace, sink: IssueLog, advance: Advance) -> None:
    for r, rt in sorted(run.ranks.items()):
        advance(0, description=f"checking dependencies: rank {r}")
        cycle = find_cycle(rt)
        advance()
        if cycle is not None:
            chain = " -> ".join(f"{rt.node_id[i]} ({rt.name(i)})" for i in reversed(cycle))
            sink.error(
                "dependency-cycle",
                f"{rt.path}: rank {r}: dependency cycle: {chain}",
                file=rt.path,
                rank=r,
                node=int(rt.node_id[cycle[0]]),
            )


def validate_run(
    path: str | Path,
    *,
    progress: Progress | None = NO_PROGRESS,
    lenient: bool = False,
    decoder: Decoder = "auto",
) -> ValidationReport:
    """Load and check a run, collecting every problem instead of stopping at the first (``lenient``: see
    the module docstring; ``decoder``: :func:`~skewlens.profiler.store.load.decode`'s)."""
    progress = given(progress)
    sink = IssueLog(strict=False)
    run = load_run(path, progress=progress, sink=sink, lenient=lenient, decoder=decoder)
    with progress.task("checking dependencies", len(run.ranks)) as advance:
        _check_cycles(run, sink, advance)
    if run.manifest.source == "foreign" and SYNTH_NOTE in run.manifest.notes:
        sink.info("inferred", f"{path}: {run.manifest.notes[SYNTH_NOTE]}", file=str(path))
    if unknown := ends_unknown(run):
        sink.warning(
            "no-end",
            ends_unknown_line(unknown, run.manifest.source),
            rank=next(iter(unknown)) if len(unknown) == 1 else None,
        )
    for r, rt in sorted(run.ranks.items()):
        for note in rt.notes:
            sink.info("inferred", f"{rt.path}: rank {r}: {note}", file=rt.path, rank=r)
    return ValidationReport(
        path=str(path), issues=sink.issues, run=run, skipped=sink.skipped, lenient=lenient
    )


#: Kinds of error that make a rank unreadable as a whole (its file missing or corrupt): a lenient load leaves
#: the rank out and goes on with the others.
UNREADABLE_KINDS = frozenset({"corrupt-trace", "missing-rank"})


def _unreadable_rank(e: Issue) -> bool:
    """Whether ``e`` is a rank's trace file missing or unreadable (not a gap in the manifest's ranks)."""
    return e.kind in UNREADABLE_KINDS and bool(e.file) and e.rank is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class LenientRemedy:
    """What a lenient load does about a strict load's errors."""

    mismatches: int
    """Communication mismatches it skips."""
    unreadable: tuple[int, ...]
    """Ranks it leaves out for their trace missing or unreadable."""
    another_runs: tuple[int, ...]
    """Ranks it leaves out for their trace being another run's (a file of another capture copied in)."""
    split_ranks: tuple[int, ...]
    """Ranks of the all_to_all nodes whose inconsistent splits it drops (the nodes stay)."""
    covered: bool
    """Whether that is every error (then it uses the rest)."""

    def parts(self) -> list[str]:
        """``skip the 2 communication mismatch(es)``, ``leave out the unreadable rank(s) 3``, ..."""
        out = [f"skip the {self.mismatches} communication mismatch(es)"] if self.mismatches else []
        if self.unreadable:
            out.append(f"leave out the unreadable rank(s) {rank_ranges(self.unreadable)}")
        if self.another_runs:
            out.append(f"leave out rank(s) {rank_ranges(self.another_runs)} (another run's trace)")
        if self.split_ranks:
            out.append(f"drop the inconsistent all_to_all splits on rank(s) {rank_ranges(self.split_ranks)}")
        return out


def lenient_remedy(errors: Sequence[Issue]) -> LenientRemedy:
    """What a lenient load does about ``errors``: the communication mismatches it skips, the ranks it leaves
    out (their trace missing or unreadable, or another run's), the ranks whose all_to_all nodes lose their
    inconsistent splits, and whether that is every error (then it uses the rest)."""
    mismatch = [e for e in errors if e.kind in MISMATCH_KINDS]
    unreadable_errors = [e for e in errors if _unreadable_rank(e)]
    split_errors = [e for e in errors if e.kind == SPLITS_KIND]
    foreign = {e.rank for e in unreadable_errors if ANOTHER_RUNS in e.message and e.rank is not None}
    return LenientRemedy(
        mismatches=len(mismatch),
        unreadable=tuple(sorted({e.rank for e in unreadable_errors if e.rank is not None} - foreign)),
        another_runs=tuple(sorted(foreign)),
        split_ranks=tuple(sorted({e.rank for e in split_errors if e.rank is not None})),
        covered=len(mismatch) + len(unreadable_errors) + len(split_errors) == len(errors),
    )


def refusal(
    path: str | Path,
    errors: Sequence[Issue],
    what: str,
    *,
    skipped: Sequence[SkippedComm] = (),
    lenient_option: str = "",
    anyway: str = "",
    notes: Mapping[str, str] | None = None,
    missing: Sequence[Issue] = (),
) -> ValidationError:
    """The one error for a run that has ``errors``: what was not done (``what``), how many problems, the
    first :data:`FIRST_ERRORS` of them, and the command that lists them all.

    ``lenient_option`` names how the caller's user asks for a lenient load (``--lenient``): where every
    error is communication that disagrees across ranks, the message says per group what disagrees and
    that this option uses the rest; where there are other errors too, that it would not be enough.
    ``anyway`` names how the user asks for the work to be done regardless (an export's ``--allow-errors``).
    ``notes``: the run's manifest notes; where one says a capture may still be writing the run
    (:data:`~skewlens.profiler.manifest.CAPTURE_PARTS_NOTE`), which may explain the errors, it is said after
    them with what to do. ``missing``: the run's warnings that ranks have no trace (the manifest's word on
    why: crashed, or saved on another host's storage), said after the errors, which the communication with
    those ranks may explain.
    """
    hint = (notes or {}).get(CAPTURE_PARTS_NOTE, "")
    if hint:
        lenient = f" (or use {lenient_option})" if lenient_option else ""
        hint = f". Hint: {hint}; {CAPTURE_PARTS_ADVICE}{lenient}"
    hint += "".join(f". Hint: {w.message}" for w in missing)
    command = f"skewlens check {path_word(path)}"  # to copy: a path with a space in it still one word
    check = f"`{command}` lists every problem"
    remedy = lenient_remedy(errors)
    if lenient_option and skipped and remedy.mismatches == len(errors):
        groups = ". ".join(summarise_skipped(skipped)).replace(" skipped: ", " disagree: ")
        return ValidationError(
            f"{path}: {what}: communication does not match across ranks: {groups}. With {lenient_option} "
            "the rest is used and this communication skipped (its nodes keep their recorded durations and "
            f"do not synchronise across ranks); {check}{hint}"
        )
    shown = "; ".join(e.message for e in errors[:FIRST_ERRORS])
    more = f" (and {len(errors) - FIRST_ERRORS} more)" if len(errors) > FIRST_ERRORS else ""
    tail = f"run `{command}` for all"
    parts = remedy.parts()
    if lenient_option and parts:
        if remedy.covered:
            tail += f"; {lenient_option} would {' and '.join(parts)} and use the rest"
        else:
            tail += f" ({lenient_option} would {' and '.join(parts)}, not the rest)"
    if anyway:
        tail += f"; {anyway} does it all the same"
    return ValidationError(f"{path}: {what}, {len(errors)} problem(s){more}: {shown} -- {tail}{hint}")


def load_validated(
    path: str | Path,
    *,
    progress: Progress | None = NO_PROGRESS,
    lenient: bool = False,
    lenient_option: str = "lenient=True",
) -> RunTrace:
    """The run, validated: raises :class:`ValidationError` naming the first few problems if there are any.

    ``lenient``: communication that disagrees across ranks is skipped (``RunTrace.skipped_comm``) instead;
    ``lenient_option``: how the caller's user asks for that, named in the refusal (see :func:`refusal`).
    """
    report = validate_run(path, progress=progress, lenient=lenient)
    if report.errors:
        raise refusal(
            path,
            report.errors,
            "not loaded",
            skipped=report.skipped,
            lenient_option=lenient_option,
            notes=report.run.manifest.notes if report.run is not None else None,
            missing=[w for w in report.warnings if w.kind == "missing-rank"],
        )
    assert report.run is not None
    return report.run
