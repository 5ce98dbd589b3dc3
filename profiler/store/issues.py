"""Problems found while loading or validating a run, collected as records rather than raised one by one."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from skewlens.profiler.errors import ValidationError


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
