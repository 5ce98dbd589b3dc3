"""skewlens analysis: attribute skew and communication stalls, name the stragglers.

``analyze_run(run) -> AnalysisResult`` is the entry point; ``write_tables`` writes the Parquet tables, and
``tables`` returns them in memory (pyarrow tables, ``.to_pandas()`` for a DataFrame).
"""

from skewlens.analysis.api import AnalysisResult, analyze_run, tables, write_tables

__all__ = ["AnalysisResult", "analyze_run", "tables", "write_tables"]
