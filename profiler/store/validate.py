"""Validate a run: collect every problem (``validate_run``) or refuse a bad run at once (``load_validated``).

Checked: truncated or corrupt protobuf (file and byte offset), unknown node types, dangling
dependencies, dependency cycles (the cycle's node ids and names), duplicate node ids, missing ranks
(against the manifest, or gaps in 0..N-1 without one), collectives that do not match across a group's
members (type, size or count; see :mod:`skewlens.profiler.store.match` for what "size differs" means
per type), sends without a matching recv and recvs without a matching send. Inferences the loader made (no
start times, sequence numbers numbered in file order, world-wide groups assumed) are reported as info.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from skewlens.profiler.errors import ValidationError
from skewlens.profiler.store.issues import Issue, IssueLog, Severity
from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.model import RankTrace, RunTrace
from skewlens.progress import NO_PROGRESS, Progress

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
    whose members disagree kept with its first member's type."""

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
    only starts from the sources of such edges.
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


def _check_cycles(run: RunTrace, sink: IssueLog) -> None:
    for r, rt in sorted(run.ranks.items()):
        cycle = find_cycle(rt)
        if cycle is not None:
            chain = " -> ".join(f"{rt.node_id[i]} ({rt.name(i)})" for i in reversed(cycle))
            sink.error(
                "dependency-cycle",
                f"{rt.path}: rank {r}: dependency cycle: {chain}",
                file=rt.path,
                rank=r,
                node=int(rt.node_id[cycle[0]]),
            )


def validate_run(path: str | Path, *, progress: Progress = NO_PROGRESS) -> ValidationReport:
    """Load and check a run, collecting every problem instead of stopping at the first."""
    sink = IssueLog(strict=False)
    run = load_run(path, progress=progress, sink=sink)
    _check_cycles(run, sink)
    for r, rt in sorted(run.ranks.items()):
        for note in rt.notes:
            sink.info("inferred", f"{rt.path}: rank {r}: {note}", file=rt.path, rank=r)
    return ValidationReport(path=str(path), issues=sink.issues, run=run)


def refusal(path: str | Path, errors: Sequence[Issue], what: str) -> ValidationError:
    """The one error for a run that has ``errors``: what was not done (``what``), how many problems, the
    first :data:`FIRST_ERRORS` of them, and the command that lists them all."""
    shown = "; ".join(e.message for e in errors[:FIRST_ERRORS])
    more = f" (and {len(errors) - FIRST_ERRORS} more)" if len(errors) > FIRST_ERRORS else ""
    return ValidationError(
        f"{path}: {what}, {len(errors)} problem(s){more}: {shown} -- run `skewlens check {path}` for all"
    )


def load_validated(path: str | Path, *, progress: Progress = NO_PROGRESS) -> RunTrace:
    """The run, validated: raises :class:`ValidationError` naming the first few problems if there are any."""
    report = validate_run(path, progress=progress)
    if report.errors:
        raise refusal(path, report.errors, "not loaded")
    assert report.run is not None
    return report.run
