"""skewlens analysis: attribute skew and communication stalls, name the stragglers.

``analyze_run(run) -> AnalysisResult`` is the entry point; ``write_tables`` writes the Parquet tables.
"""

from skewlens.analysis.api import AnalysisResult, analyze_run, write_tables

__all__ = ["AnalysisResult", "analyze_run", "write_tables"]
