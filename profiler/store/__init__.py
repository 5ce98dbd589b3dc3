"""The trace store: one multi-rank, columnar model of a run, loaded from a run directory.

``load_run`` loads and matches (strict: the first inconsistency raises); ``validate_run`` collects every
problem into a ``ValidationReport``; ``load_validated`` is what replay and analysis call;
``skewlens.profiler.store.parquet.export_run`` writes the Parquet tables.
"""

from skewlens.profiler.store.issues import Issue, Severity
from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.model import CollectiveInstance, P2PPair, RankTrace, RunTrace
from skewlens.profiler.store.validate import ValidationReport, load_validated, validate_run

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
