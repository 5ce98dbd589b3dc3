"""The trace store: one multi-rank, columnar model of a run, loaded from a run directory.

``load_run`` loads and matches (strict: the first inconsistency raises); ``validate_run`` collects every
problem into a ``ValidationReport``; ``load_validated`` is what replay and analysis call;
``skewlens.profiler.store.parquet.export_run`` writes the Parquet tables.

The names below are imported on first use, so that ``skewlens.profiler.store.model`` (the data model)
can be imported without the loader, its decoder and pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skewlens.profiler.store.issues import Issue, Severity
    from skewlens.profiler.store.load import load_run
    from skewlens.profiler.store.model import CollectiveInstance, P2PPair, RankTrace, RunTrace
    from skewlens.profiler.store.validate import ValidationReport, load_validated, validate_run

_WHERE = {
    "Issue": "issues",
    "Severity": "issues",
    "load_run": "load",
    "CollectiveInstance": "model",
    "P2PPair": "model",
    "RankTrace": "model",
    "RunTrace": "model",
    "ValidationReport": "validate",
    "load_validated": "validate",
    "validate_run": "validate",
}

__all__ = [
    "CollectiveInstance",
    "Issue",
    "P2PPair",
    "RankTrace",
    "RunTrace",
    "Severity",
    "ValidationReport",
    "load_run",
    "load_validated",
    "validate_run",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
