"""The docs a user follows, as lines of code: what the tests hold the commands and settings they show to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: README.md, conf/README.md and docs/*.md, docs/benchmarks.md (its figures) aside.
USER_DOCS = (
    ROOT / "README.md",
    ROOT / "conf" / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"),
)


def code_lines() -> Iterator[tuple[str, str]]:
    """(``file:line``, line) for each line of a code block, an inline code span or an indented command in
    the user docs, a line ending in ``\\`` joined with the next."""
    for doc in USER_DOCS:
        text = doc.read_text(encoding="utf-8")
        spans = [(m.start(1), m.group(1)) for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S)]
        inline = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
        spans += [(m.start(1), m.group(1)) for m in re.finditer(r"`([^`\n]+)`", inline)]
        spans += [
            (m.start(1), m.group(1))
            for m in re.finditer(r"^    (skewlens .*(?:\n        .*)*)", inline, re.M)
        ]
        for pos, span in spans:
            first = text.count("\n", 0, pos) + 1
            for i, line in enumerate(span.replace("\\\n", " ").splitlines()):
                yield f"{doc.relative_to(ROOT)}:{first + i}", line


def flags_in_code(command: str, stop: str) -> list[tuple[str, str, str]]:
    """(``file:line``, what, flag) for each ``--flag`` the user docs' code gives after a match of
    ``command`` (a pattern whose first group names what takes the flags, its second the rest), up to the
    first match of ``stop`` in that rest."""
    found = []
    for where, line in code_lines():
        for m in re.finditer(command, line):
            args = re.split(stop, m.group(2))[0]
            found += [(where, m.group(1), f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", args)]
    return found
