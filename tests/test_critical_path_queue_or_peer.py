"""A critical-path rule the other tests leave unchecked (found by mutation testing): a collective whose
queued predecessor ended before its last peer arrived waited for that peer, not for the queue."""

from __future__ import annotations

from pathlib import Path

from skewlens.analysis.critical_path import analyze_critical_path
from skewlens.analysis.index import build_index
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

MS = 1_000_000


def test_a_collective_whose_queued_predecessor_ended_before_its_last_peer_arrived_goes_to_that_peer(
    tmp_path: Path,
) -> None:
    # gloo's two worker threads: C3 is queued behind the first to end of C1 (40 ms) and C2 (41 ms). Rank 0
    # issues C3 at 35 ms; rank 1, late, at 41 ms, after C1 ended: rank 0's C3 waited for rank 1 (1 ms of
    # transfer after it), so the path goes to rank 1 and its "bwd2" (31 to 41 ms), not back through C1
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        t1, t2, t3 = (1 * MS, 2 * MS, 35 * MS) if r == 0 else (30 * MS, 31 * MS, 41 * MS)
        h1 = rb.compute("fwd" if r == 0 else "slow", t1, start_ns=0)
        c1 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 40 * MS - t1, start_ns=t1, stream=1, deps=(h1,))
        h2 = rb.compute("bwd1", 1 * MS, start_ns=t1)
        c2 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 41 * MS - t2, start_ns=t2, stream=1, deps=(h2,))
        h3 = rb.compute("bwd2", t3 - t2, start_ns=t2)
        c3 = rb.collective(CommType.ALL_REDUCE, 1 << 20, 42 * MS - t3, start_ns=t3, stream=1, deps=(h3,))
        rb.compute("c10d::wait", 42 * MS - t3, start_ns=t3, deps=(c1, c2, c3))
        rb.compute("opt", 1 * MS + (100_000 if r == 0 else 0))
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    path = [(x.rank, x.name, x.via, x.contribution_ns) for x in recs]
    assert path[:4] == [
        (0, "opt", "dep", 1_100_000),
        (0, "c10d::wait", "dep", 0),
        (0, "c10d::all_reduce_", "collective", 42 * MS - 41 * MS),  # C3, after rank 1 arrived
        (1, "c10d::all_reduce_", "dep", 0),
    ]
    assert (1, "bwd2", "dep", 41 * MS - 31 * MS) in path
