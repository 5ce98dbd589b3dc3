"""Errors of the analysis package family."""

from __future__ import annotations

from skewlens.profiler.errors import SkewlensError


class AnalysisError(SkewlensError):
    """An analysis cannot run on this input (no steps, no collectives, inconsistent run)."""
