"""Collectives a DDP communication hook issues from a callback chained on an earlier collective's future
(PowerSGD's P and Q all_reduces after its all_reduce of the uncompressed part, a user's hook with two
collectives a bucket): what issues them and what waits for them, in the execution model and the replay.

The synthetic rank below has the shape of a gloo capture of ``powerSGD_hook`` past ``start_powerSGD_iter``
(2 ranks, one bucket): the backward (``bwd``) issues the empty all_reduce ``E`` on the group's communication
stream; gloo's worker runs the callback once ``E`` completed, which issues ``P`` (no host row issued it:
its only recorded dependency is ``E``, the stream's program order), whose callback issues ``Q``; the
main thread's host-time node after the backward (``compute``: DDP's reducer waiting for the hook's future
in C++) ends just after ``Q`` completed, then the optimizer runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.execution import RankModel, execution_model
from skewlens.replay.simulate import simulate

MS = 1_000_000
COMM = 1000
BWD_MS = (10, 12)  # rank 1 arrives 2 ms later at E


def _powersgd_step(
    tmp_path: Path, *, p_lag_ns: int = 0, p_ns: int = 3 * MS, q_ns: int = 2 * MS, tail_ns: int = MS // 5
) -> RunTrace:
    """One step of each rank; ``p_lag_ns``: how long after Q began P's end was recorded (gloo's worker
    records a collective's end after the future the callback ran on fired); ``p_ns``, ``q_ns``: P's time to
    Q's issue and Q's length; ``tail_ns``: when the reducer's wait ends, after Q's end (negative: before)."""
    b = RunBuilder(world_size=2)
    for rank, bwd_ms in enumerate(BWD_MS):
        rb = b.rank(rank).step(0)
        bwd = rb.compute("bwd", dur_ns=bwd_ms * MS, start_ns=0)
        e_end = 12 * MS + MS // 2  # both members end together, after the later arrival
        rb.collective(
            CommType.ALL_REDUCE,
            comm_bytes=0,
            dur_ns=e_end - bwd_ms * MS,
            start_ns=bwd_ms * MS,
            stream=COMM,
            deps=(bwd,),
        )
        p_start = e_end + MS // 10
        q_start = p_start + p_ns
        rb.collective(
            CommType.ALL_REDUCE,
            comm_bytes=8192,
            dur_ns=q_start - p_start + p_lag_ns,
            start_ns=p_start,
            stream=COMM,
        )
        q_end = q_start + q_ns
        rb.collective(CommType.ALL_REDUCE, comm_bytes=4112, dur_ns=q_ns, start_ns=q_start, stream=COMM)
        tail_end = q_end + tail_ns
        rb.compute("compute", dur_ns=tail_end - bwd_ms * MS, start_ns=bwd_ms * MS)
        rb.compute("Optimizer.step#SGD.step", dur_ns=MS)
    return load_run(b.write(tmp_path / "run"))


def _rows(rt: RunTrace, rank: int) -> tuple[int, int, int, int]:
    r = rt.ranks[rank]
    colls = [i for i in range(len(r)) if r.name(i) == "c10d::all_reduce_"]
    tail = next(i for i in range(len(r)) if r.name(i) == "compute")
    return colls[0], colls[1], colls[2], tail


def _rank0_model(tmp_path: Path) -> tuple[RankModel, tuple[int, int, int, int]]:
    rt = _powersgd_step(tmp_path)
    return execution_model(rt).ranks[0], _rows(rt, 0)


def test_a_collective_a_hook_callback_issued_starts_after_the_completion_it_was_chained_on(
    tmp_path: Path,
) -> None:
    m, (e, p, q, _) = _rank0_model(tmp_path)
    edges = set(zip(m.start_src.tolist(), m.start_dst.tolist(), strict=True))
    assert (e, p) in edges and (p, q) in edges
    # issued 0.1 ms after E completed, not pinned to the rank's first start
    assert int(m.gap_ns[p]) == MS // 10
    assert int(m.gap_ns[q]) == 0


def test_the_reducers_hidden_wait_waits_for_the_last_collective_the_hooks_callbacks_issued(
    tmp_path: Path,
) -> None:
    m, (e, p, q, tail) = _rank0_model(tmp_path)
    waited = {s for s, d in zip(m.wait_src.tolist(), m.wait_dst.tolist(), strict=True) if d == tail}
    assert waited == {e, p, q}
    # its work is what followed Q's completion (0.2 ms), not P's and Q's whole time after E
    assert int(m.work_ns[tail]) == MS // 5


def test_a_later_peer_moves_the_hooks_chained_collectives_and_the_step_end_with_it(tmp_path: Path) -> None:
    rt = _powersgd_step(tmp_path)
    e, p, q, _ = _rows(rt, 0)
    base = simulate(rt)
    # the unmodified replay keeps every recorded time
    r0 = rt.ranks[0]
    assert np.array_equal(base.start_ns[0], r0.start_ns)
    late = 20 * MS
    longer = np.full(len(rt.ranks[1]), -1, dtype=np.int64)
    longer[next(i for i in range(len(rt.ranks[1])) if rt.ranks[1].name(i) == "bwd")] = BWD_MS[1] * MS + late
    res = simulate(rt, dur_override={1: longer})
    s0, e0 = res.start_ns[0], res.end_ns[0]
    # E is empty (gloo returns at once, waiting for no one), so rank 0 issues P as recorded, 0.1 ms after
    # E; P waits for rank 1's P, which rank 1 issues only after its own E: before, rank 1's P and Q stayed at
    # their recorded times, 20 ms before the backward that leads to them ended
    s1, e1 = res.start_ns[1], res.end_ns[1]
    e_1, p_1, q_1, _ = _rows(rt, 1)
    assert int(s1[p_1]) == int(e1[e_1]) + MS // 10
    assert int(s1[q_1]) == int(e1[p_1])
    assert int(s0[p]) == int(e0[e]) + MS // 10
    assert int(e0[p]) - int(base.end_ns[0][p]) == late
    assert int(s0[q]) == int(e0[p])
    # the optimizer after the reducer's wait moves by the peer's 20 ms
    opt = next(i for i in range(len(r0)) if r0.name(i) == "Optimizer.step#SGD.step")
    assert int(s0[opt]) - int(base.start_ns[0][opt]) == late


def test_a_chained_collective_recorded_to_begin_before_its_predecessors_lagging_end_still_follows_it(
    tmp_path: Path,
) -> None:
    # gloo's worker recorded P's end 0.09 ms after Q began (Work::finish after the future fired): Q was still
    # issued by P's completion, which the model takes as P's end
    rt = _powersgd_step(tmp_path, p_lag_ns=90_000)
    m = execution_model(rt).ranks[0]
    _, p, q, _ = _rows(rt, 0)
    assert (p, q) in set(zip(m.start_src.tolist(), m.start_dst.tolist(), strict=True))
    assert p in m.end_clamp_rows.tolist()
    assert int(m.end_clamp_ns[m.end_clamp_rows.tolist().index(p)]) == int(rt.ranks[0].start_ns[q])


def _waited_by_tail(rt: RunTrace) -> set[int]:
    m = execution_model(rt).ranks[0]
    tail = _rows(rt, 0)[3]
    return {s for s, d in zip(m.wait_src.tolist(), m.wait_dst.tolist(), strict=True) if d == tail}


def test_the_reducers_wait_holds_a_chained_collective_recorded_to_end_within_gloos_lag_after_it_and_no_later(
    tmp_path: Path,
) -> None:
    # Q recorded to end 5 ms after the wait returned (within gloo's 10 ms finish lag): the program waited for
    # it; one recorded to end 15 ms after ran on past the wait, which did not hold it
    rt = _powersgd_step(tmp_path / "lag5", q_ns=20 * MS, tail_ns=-5 * MS)
    e, p, q, _ = _rows(rt, 0)
    assert _waited_by_tail(rt) == {e, p, q}
    rt = _powersgd_step(tmp_path / "lag15", q_ns=20 * MS, tail_ns=-15 * MS)
    e, p, q, _ = _rows(rt, 0)
    assert _waited_by_tail(rt) == {e, p}


def test_a_chained_collectives_predecessor_is_clamped_to_its_issue_within_gloos_lag_and_a_tenth_of_its_length(
    tmp_path: Path,
) -> None:
    def clamped(name: str, **kw: int) -> bool:
        rt = _powersgd_step(tmp_path / name, **kw)
        m = execution_model(rt).ranks[0]
        _, p, q, _ = _rows(rt, 0)
        rows = m.end_clamp_rows.tolist()
        if p not in rows:
            return False
        assert int(m.end_clamp_ns[rows.index(p)]) == int(rt.ranks[0].start_ns[q])  # Q's issue
        return True

    # P of 200 ms: recorded 7 ms after Q's issue (within the 10 ms lag, a 30th of its length) is clamped;
    # 15 ms after (past the lag, though a 14th of its length) it ran beside Q (Q of 20 ms, so that the
    # reducer's wait, after Q, holds P's recorded end either way)
    assert clamped("p7", p_ns=200 * MS, p_lag_ns=7 * MS, q_ns=20 * MS)
    assert not clamped("p15", p_ns=200 * MS, p_lag_ns=15 * MS, q_ns=20 * MS)
    # P of 3 ms recorded 1 ms after Q's issue: within the lag, but a quarter of its length: beside Q
    assert not clamped("p1", p_lag_ns=MS, q_ns=20 * MS)
