"""Rich rendering of validation reports and export summaries (the pure results live elsewhere)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from skewlens.profiler.manifest import ProcessGroupInfo, creation_order, own_desc
from skewlens.profiler.store.issues import Issue, Severity, by_reason, counted, path_word, rank_ranges
from skewlens.profiler.store.parquet import ExportSummary
from skewlens.profiler.store.validate import ValidationReport

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def render_report(report: ValidationReport, *, max_issues: int | None = 50) -> RenderableType:
    """Summary of the run, then the issues (errors first), then the verdict. With ``max_issues``, the first
    that many rows, where issues of one kind said of several ranks for one reason (:func:`by_reason`: a
    hundred ranks whose trace file is missing) are one row with their ranks; without, a row per issue."""
    # the title a line of its own: as the table's, it was wrapped to the table's width, mid-path
    title = Text(f"skewlens check {report.path}", style="italic")
    summary = Table(show_header=False, box=None)
    run = report.run
    if run is not None:
        summary.add_row("ranks", f"{len(run.ranks)} of world size {run.world_size}")
        summary.add_row("nodes", f"{report.num_nodes:,}")
        summary.add_row("process groups", _groups(run.process_groups))
        summary.add_row("collective instances", f"{len(run.collectives):,}")
        summary.add_row("p2p pairs", f"{len(run.p2p):,}")
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    issues = sorted(report.issues, key=lambda i: order[i.severity])
    rows = [(i, "" if i.rank is None else str(i.rank), i.message) for i in issues]
    if max_issues is not None:
        rows = _per_reason(issues)
    shown = rows if max_issues is None else rows[:max_issues]
    parts: list[RenderableType] = [title, summary]
    if shown:
        table = Table(title="problems", show_lines=False, expand=False)
        table.add_column("severity")
        table.add_column("kind", no_wrap=True)  # the problem's name, kept whole: the message gives way
        table.add_column("rank", justify="right")
        table.add_column("node", justify="right")
        table.add_column("message", overflow="fold")
        for i, ranks, message in shown:
            table.add_row(
                Text(i.severity.value, style=_STYLE[i.severity]),
                i.kind,
                ranks,
                "" if i.node is None else str(i.node),
                message,
            )
        parts.append(table)
        if len(rows) > len(shown):
            parts.append(Text(f"... {len(rows) - len(shown)} more (use --all)", style="dim"))
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = (
        Text(f"OK ({n_warn} warning(s))", style="bold green")
        if report.ok
        else Text(f"FAILED: {n_err} error(s), {n_warn} warning(s)", style="bold red")
    )
    parts.append(verdict)
    return Group(*parts)


def _per_reason(issues: list[Issue]) -> list[tuple[Issue, str, str]]:
    """(first issue, its ranks, message) per row: the issues of one severity and kind on a rank and no node
    one row per reason (:func:`by_reason`), where the first of them was; the others a row each."""
    same: dict[tuple[Severity, str], list[Issue]] = {}
    for i in issues:
        if i.rank is not None and i.node is None:
            same.setdefault((i.severity, i.kind), []).append(i)
    rows: list[tuple[Issue, str, str]] = []
    grouped: set[tuple[Severity, str]] = set()
    for i in issues:
        key = (i.severity, i.kind)
        if i.rank is None or i.node is not None:
            rows.append((i, "" if i.rank is None else str(i.rank), i.message))
        elif key not in grouped:
            grouped.add(key)
            said = by_reason((j.rank, j.message) for j in same[key] if j.rank is not None)
            first = {j.rank: j for j in same[key]}
            rows.extend((first[rs[0]], rank_ranges(rs), message) for rs, message in said)
    return rows


#: At most this many process groups are named in the summary (all are counted).
SHOWN_GROUPS = 8
#: At most this many names of groups alike (one description and size) are shown in their entry.
SHOWN_ALIKE = 4


#: At most this many members of a group are listed one by one, in group-rank order (more as ranges).
LISTED_MEMBERS = 8


def group_desc(g: ProcessGroupInfo) -> str:
    """The description torch's ``new_group`` was given, '' for none (:func:`own_desc`)."""
    return own_desc(g.name, g.desc)


def group_members(g: ProcessGroupInfo) -> str:
    """``ranks 3, 1`` in group-rank order (the program's, made with ``sort_ranks=False``), ``16 ranks: 0-15``
    past :data:`LISTED_MEMBERS`."""
    if len(g.ranks) <= LISTED_MEMBERS:
        return f"{'rank' if len(g.ranks) == 1 else 'ranks'} {', '.join(map(str, g.ranks))}"
    return f"{len(g.ranks):,} ranks: {rank_ranges(g.ranks)}"


def _groups(groups: dict[str, ProcessGroupInfo]) -> str:
    """``1: '0' (128 ranks, default_pg)``: how many groups, then the first few in creation order (a bare
    ``0``, the usual name of the world group, read as a count). A group's description is shown where torch's
    ``new_group`` was given one (:func:`group_desc`); groups of one description and size (a DeviceMesh
    dimension's) are one entry, the description first: ``mesh_dp: '5', '6', '7', '8' (2 ranks each)``."""
    # one entry per (description, size), where its first group came; a group without a description alone
    entries: dict[tuple[str, int, str], list[str]] = {}
    for g in sorted(groups.values(), key=lambda g: creation_order(g.name)):
        desc = group_desc(g)
        entries.setdefault((desc, len(g.ranks), "" if desc else g.name), []).append(repr(g.name))
    named: list[str] = []
    for (desc, size, _name), names in entries.items():
        if len(names) > 1:
            more = f", ... {len(names) - SHOWN_ALIKE} more" if len(names) > SHOWN_ALIKE else ""
            named.append(f"{desc}: {', '.join(names[:SHOWN_ALIKE])}{more} ({counted(size, 'rank')} each)")
        else:
            named.append(f"{names[0]} ({counted(size, 'rank')}{', ' + desc if desc else ''})")
    more = f", ... {len(named) - SHOWN_GROUPS} more" if len(named) > SHOWN_GROUPS else ""
    return f"{len(groups)}: {', '.join(named[:SHOWN_GROUPS])}{more}" if named else "0"


#: At most this many of a command's warnings and errors are printed after its summary (all are counted).
SHOWN_ISSUES = 10


def _notable(issues: Iterable[Issue]) -> list[Issue]:
    """The errors, then the warnings (not the infos)."""
    return sorted(
        (i for i in issues if i.severity is not Severity.INFO), key=lambda i: i.severity is not Severity.ERROR
    )


def render_export(summary: ExportSummary, seconds: float) -> RenderableType:
    """Rows per table, conversion throughput and how many warnings and errors the run has (said on their
    own by :func:`issue_lines`)."""
    title = f"exported to {summary.out_dir}"
    table = Table(title=title, min_width=len(title))  # narrower, the table wrapped its title mid-path
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, rows in summary.rows.items():
        table.add_row(name, f"{rows:,}")
    nodes = summary.rows.get("nodes", 0)
    rate = nodes / seconds if seconds > 0 else 0.0
    notes = len(_notable(summary.issues))
    return Group(
        table, Text(f"{nodes:,} nodes in {seconds:.2f} s ({rate:,.0f} nodes/s); {notes} warning(s)/error(s)")
    )


def issue_lines(issues: Iterable[Issue], run: str | Path) -> list[str]:
    """A command's errors, then its warnings, one line each (``error: ...``, ``warning: ...``; the first
    :data:`SHOWN_ISSUES`, and a line counting the rest), for stderr: a script's ``> out.txt`` gets the
    summary alone. ``run``: the run as the command was given it (for ``skewlens check RUN``)."""
    notes = _notable(issues)
    lines = [f"{i.severity.value}: {i.message}" for i in notes[:SHOWN_ISSUES]]
    if len(notes) > SHOWN_ISSUES:
        what = "warning(s)/error(s)" if notes[0].severity is Severity.ERROR else "warning(s)"
        lines.append(f"and {len(notes) - SHOWN_ISSUES} more {what}: skewlens check {path_word(run)}")
    return lines
