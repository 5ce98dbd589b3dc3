"""Analyses as SQL over the Parquet export (``skewlens export RUN``), for engines that read Parquet at fleet
scale (DuckDB, Spark SQL, ...): the queries ship as ``.sql`` files beside this module.

``collective_skew.sql`` gives the ``collective_skew`` table of ``skewlens analyze``
(:class:`~skewlens.analysis.records.CollectiveSkewRecord`) less the columns of the blame pass
(:data:`NOT_IN_SQL`); the query reads the export's ``nodes``, ``model``, ``collectives`` and ``p2p`` tables
registered under those names (the file's header says how, for DuckDB and Spark; docs/parquet.md says more).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from skewlens.analysis.records import CollectiveSkewRecord

SQL_DIR = Path(__file__).resolve().parent
COLLECTIVE_SKEW_SQL = SQL_DIR / "collective_skew.sql"
#: Columns of ``collective_skew`` that the analysis derives event by event in order of arrival, each event's
#: from the ones before (who passed lateness on to whom), and ``clock_contradicted``, which the execution
#: model's rules of who waits for whom (rooted collectives) decide: not in the SQL.
NOT_IN_SQL = ("blamed_rank", "cause_kind", "cause_op", "cause_delta_ns", "cause", "clock_contradicted")
#: The columns ``collective_skew.sql`` returns, in this order.
COLLECTIVE_SKEW_SQL_COLUMNS = tuple(f.name for f in fields(CollectiveSkewRecord) if f.name not in NOT_IN_SQL)
#: The tables the query reads, by the names it gives them.
SQL_TABLES = ("nodes", "model", "collectives", "p2p")


def collective_skew_sql() -> str:
    """The text of ``collective_skew.sql``."""
    return COLLECTIVE_SKEW_SQL.read_text(encoding="utf-8")
