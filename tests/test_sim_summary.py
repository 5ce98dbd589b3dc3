"""Per (rank, step) summary of a simulated replay and its rendering."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.render import summary_table
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

MS = 1_000_000


def test_the_early_rank_waits_for_the_late_one_and_transfers_are_exposed(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r, compute_ms in ((0, 2), (1, 5)):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=compute_ms * MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=(5 - compute_ms) * MS + 300_000)
    rt = load_run(b.write(tmp_path / "run"))
    rows = {s.rank: s for s in summarize(rt, simulate(rt))}
    assert rows[0].wait_ns == 3 * MS
    assert rows[1].wait_ns == 0
    assert rows[0].exposed_comm_ns == rows[1].exposed_comm_ns == 300_000
    assert (rows[0].compute_ns, rows[1].compute_ns) == (2 * MS, 5 * MS)
    assert rows[0].comm_ns == 3 * MS + 300_000
    assert rows[0].step_time_ns == rows[1].step_time_ns == 5 * MS + 300_000


def test_transfer_hidden_under_compute_on_another_stream_is_not_exposed(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS, start_ns=0, stream=7)
        rb.compute("aten::mm", dur_ns=600_000, start_ns=0)
    rt = load_run(b.write(tmp_path / "run"))
    rows = summarize(rt, simulate(rt))
    assert [s.exposed_comm_ns for s in rows] == [400_000, 400_000]


def test_the_summary_table_shows_one_row_per_rank_in_ms(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        for k in range(2):
            b.rank(r).step(k).compute("x", dur_ns=(r + 1) * MS)
    rt = load_run(b.write(tmp_path / "run"))
    buf = io.StringIO()
    Console(file=buf, width=120).print(summary_table(summarize(rt, simulate(rt)), title="T"))
    text = buf.getvalue()
    assert "1.000" in text and "2.000" in text
    assert text.count("│    0 │") == 1 and text.count("│    1 │") == 1
