"""Critical path: walk back through the latest dependency, the last arriver of a collective, a late send."""

from __future__ import annotations

from pathlib import Path

from test_analysis_scenarios import MS, Scenario, build_run

from skewlens.analysis.critical_path import analyze_critical_path, shares
from skewlens.analysis.index import build_index
from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder


def test_path_runs_through_the_straggler_and_accounts_for_the_whole_step(tmp_path: Path) -> None:
    sc = Scenario(straggler_rank=2, straggler_ns=40 * MS, steps=3)
    recs = analyze_critical_path(build_index(load_run(build_run(tmp_path, sc))))
    assert sorted({r.step for r in recs}) == list(range(sc.steps))
    by_rank, by_op = shares(recs)
    for step in range(sc.steps):
        path = [r for r in recs if r.step == step]
        assert path[0].via == "collective"  # the all_reduce completes after the last arriver's arrival
        mm = [r for r in path if r.name == "aten::mm"]
        assert len(mm) == 1 and mm[0].rank == sc.straggler_rank
        assert mm[0].contribution_ns == sc.straggler_ns
        span = path[0].end_ns - path[-1].start_ns
        assert sum(r.contribution_ns + r.gap_before_ns for r in path) == span
        assert by_rank[step][sc.straggler_rank] > 0.9 * span
        assert max(by_op[step], key=by_op[step].__getitem__) == "aten::mm"


def test_recv_waiting_for_a_late_send_jumps_to_the_sender(tmp_path: Path) -> None:
    compute0, recv_start, transfer, tail = 10 * MS, 1 * MS, 2 * MS, 3 * MS
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    r0.compute("produce", compute0, start_ns=0)
    r0.send(1, 1 << 20, transfer, start_ns=compute0)
    r1 = b.rank(1).step(0)
    r1.recv(0, 1 << 20, compute0 + transfer - recv_start, start_ns=recv_start)
    r1.compute("consume", tail, start_ns=compute0 + transfer)
    recs = analyze_critical_path(build_index(load_run(b.write(tmp_path / "run"))))
    assert [(r.rank, r.name) for r in recs] == [
        (1, "consume"),
        (1, "c10d::recv_"),
        (0, "c10d::send"),
        (0, "produce"),
    ]
    assert [r.contribution_ns for r in recs] == [tail, transfer, 0, compute0]
    assert recs[1].via == "p2p"
