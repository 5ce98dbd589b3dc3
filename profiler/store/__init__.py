"""The trace store: one multi-rank, columnar model of a run, loaded from a run directory."""

from profiler.store.load import load_run
from profiler.store.model import CollectiveInstance, P2PPair, RankTrace, RunTrace

__all__ = ["CollectiveInstance", "P2PPair", "RankTrace", "RunTrace", "load_run"]
