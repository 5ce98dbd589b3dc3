"""The execution model: what waits on what, read alike by the simulator, analyses and real-replay plan."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from replay_workloads import RankFactor

from skewlens.analysis.api import analyze_run
from skewlens.analysis.records import CauseKind
from skewlens.analysis.skew import _held
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import Attr, CommType
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.execution import execution_model, model_ends, recorded_wait_work_ns
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.real.plan import KIND_COMPUTE, rank_plan
from skewlens.replay.simulate import simulate
from skewlens.replay.summary import summarize

MS = 1_000_000
COMM = 1000  # a communication stream (the work of async ops of one group)


def _exact(run_dir: Path) -> None:
    run = load_run(run_dir)
    res = simulate(run)
    for r, rt in run.ranks.items():
        t = res.timed[r]
        assert np.array_equal(res.start_ns[r][t], rt.start_ns[t]), r
        assert np.array_equal(res.end_ns[r][t], rt.end_ns[t]), r


def _one_f_one_b(tmp_path: Path, *, steps: int = 2) -> Path:
    """Rank 0 sends micro-batch 1 before it receives gradient 0; rank 1 sends gradient 0 before it
    receives micro-batch 1. Legal because sends complete without their receiver (eager)."""
    b = RunBuilder(2)
    t = 0
    for s in range(steps):
        r0, r1 = b.rank(0).step(s), b.rank(1).step(s)
        f0 = r0.compute("fwd0", 2 * MS, start_ns=t)
        s0 = r0.send(1, 4096, 40_000, start_ns=t + 2 * MS, deps=(f0,))
        r1.recv(0, 4096, 2 * MS + 60_000, start_ns=t)
        g = r1.compute("fwd_bwd0", 3 * MS, start_ns=t + 2 * MS + 60_000)
        sg = r1.send(0, 4096, 40_000, start_ns=t + 5 * MS + 60_000, deps=(g,))
        f1 = r0.compute("fwd1", 2 * MS, start_ns=t + 2 * MS + 40_000, deps=(s0,))
        s1 = r0.send(1, 4096, 40_000, start_ns=t + 4 * MS + 40_000, deps=(f1,))
        rg = r0.recv(1, 4096, 1 * MS + 30_000, start_ns=t + 4 * MS + 80_000, deps=(s1,))
        r1.recv(0, 4096, 30_000, start_ns=t + 5 * MS + 100_000, deps=(sg,))
        r1.compute("fwd_bwd1", 3 * MS, start_ns=t + 5 * MS + 130_000)
        r0.compute("bwd", 2 * MS, start_ns=t + 5 * MS + 110_000, deps=(rg,))
        t += 9 * MS
    return b.write(tmp_path / "run")


def test_crossing_eager_sends_of_1f1b_replay_without_deadlock_and_exactly(tmp_path: Path) -> None:
    run_dir = _one_f_one_b(tmp_path)
    run = load_run(run_dir)
    model = execution_model(run)
    eager = [g for g in model.syncs if g.is_p2p and g.detached[0]]
    # micro-batch 1 of each step went before its receiver arrived; the others found their receiver there
    assert [run.p2p[g.index].src_rank for g in eager] == [0, 0]
    assert len([g for g in model.syncs if g.is_p2p]) == 6
    _exact(run_dir)
    ops = {r: rank_plan(rt, run, NO_EFFECTS) for r, rt in run.ranks.items()}
    assert all(len(o) == len(run.ranks[r]) - 1 for r, o in ops.items())  # all but the METADATA node


def test_an_eager_send_does_not_wait_for_a_late_receiver_but_its_recv_waits_for_it(tmp_path: Path) -> None:
    run_dir = _one_f_one_b(tmp_path, steps=1)
    run = load_run(run_dir)
    base, slow = simulate(run), simulate(run, effects=RankFactor(1, 2.0))
    r0 = run.ranks[0]
    send = [i for i in range(len(r0)) if r0.name(i) == "c10d::send"]
    # rank 0's sends last what they lasted, however late rank 1 gets
    assert np.array_equal(slow.end_ns[0][send] - slow.start_ns[0][send], r0.dur_ns[send])
    # rank 0's recv of the gradient waits for rank 1's (slower) send: it ends later
    recv = next(i for i in range(len(r0)) if r0.name(i) == "c10d::recv_")
    assert slow.end_ns[0][recv] - base.end_ns[0][recv] >= 3 * MS


def _functional(tmp_path: Path, straggler_ms: float, steps: int = 3) -> Path:
    """Tensor-parallel style: compute, an async all_reduce on a communication stream, more compute, then
    ``wait_tensor`` (a wait node) before the consumer. Rank 1 computes ``straggler_ms`` longer first."""
    b = RunBuilder(2)
    t0 = {0: 0, 1: 0}
    extra = int(straggler_ms * MS)
    ar_end = 0
    for s in range(steps):
        ends = {}
        nodes = {}
        for r in (0, 1):
            rb = b.rank(r).step(s)
            t = t0[r]
            a = rb.compute("aten::mm", 5 * MS + (extra if r == 1 else 0), start_ns=t)
            t += 5 * MS + (extra if r == 1 else 0)
            nodes[r] = (rb, a, t)
        arrive = max(v[2] for v in nodes.values())
        ar_end = arrive + MS
        for r in (0, 1):
            rb, a, t = nodes[r]
            ar = rb.collective(
                CommType.ALL_REDUCE, 8192, ar_end - (t + 10_000), start_ns=t + 10_000, stream=COMM, deps=(a,)
            )
            c = rb.compute("aten::relu", 100_000, start_ns=t + 20_000, deps=(a,))
            w_start = t + 120_000
            w_end = max(w_start, ar_end) + 5_000
            w = rb.compute("_c10d_functional::wait_tensor", w_end - w_start, start_ns=w_start, deps=(c, ar))
            rb.compute("aten::linear", 2 * MS, start_ns=w_end, deps=(w,))
            ends[r] = w_end + 2 * MS
        t0 = {r: max(ends.values()) + 50_000 for r in (0, 1)}
    return b.write(tmp_path / f"run{straggler_ms}")


def test_a_wait_node_counts_its_blocked_time_as_waiting_and_its_consumer_follows_the_completion(
    tmp_path: Path,
) -> None:
    run_dir = _functional(tmp_path, 40.0)
    _exact(run_dir)
    run = load_run(run_dir)
    m0 = execution_model(run).ranks[0]
    rt0 = run.ranks[0]
    w = [i for i in range(len(rt0)) if rt0.name(i) == "_c10d_functional::wait_tensor"]
    assert m0.wait_dst.size == 3 and set(m0.wait_dst.tolist()) == set(w)
    assert (m0.work_ns[w] == 5_000).all()  # all but the part after the all_reduce completed was waiting
    assert (m0.wait_in_ns[w] >= 39 * MS).all()
    res = analyze_run(run, blame=True)
    bd0 = [b for b in res.breakdown if b.rank == 0]
    assert all(b.compute_ns < 8 * MS for b in bd0)  # 5 + 0.1 + 2 ms of work, not the 40 ms wait
    assert all(b.exposed_wait_ns > 38 * MS for b in bd0)
    # the replay's report counts compute as the analysis does (it counted the 40 ms blocked as compute)
    sm0 = sorted((s.step, s.compute_ns) for s in summarize(run, simulate(run)) if s.rank == 0)
    assert sm0 == sorted((b.step, b.compute_ns) for b in bd0)


def test_blame_of_a_straggler_behind_a_functional_collective_matches_its_real_cost(tmp_path: Path) -> None:
    slow = load_run(_functional(tmp_path, 40.0))
    plain = load_run(_functional(tmp_path, 0.0))
    real_cost = (simulate(slow).makespan_ns - simulate(plain).makespan_ns) / 3
    res = analyze_run(slow, blame=True)
    top = res.stragglers[0]
    assert top.rank == 1
    per_step = top.straggler_cost_ns / 3
    assert per_step == pytest.approx(real_cost, rel=0.1)
    assert "aten::mm" in (top.cause or "")


def test_host_collectives_run_two_at_a_time_like_gloos_workers_and_p2p_ops_there_do_not_queue(
    tmp_path: Path,
) -> None:
    # gloo runs a group's collectives on two worker threads: B overlaps A and ends first (as recorded on
    # the demo's captures), C waits for B (the first of A and B to end), D for A (the first of C and A)
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("issue", MS, start_ns=0)
        for k, (start, dur) in enumerate(((1, 8), (2, 4), (3, 9), (4, 6))):
            rb.collective(
                CommType.ALL_REDUCE, 1 << 20, dur * MS, start_ns=start * MS + k, stream=COMM, deps=(a,)
            )
        rb.compute("after", MS, start_ns=13 * MS, deps=(a,))
    run_dir = b.write(tmp_path / "run")
    run = load_run(run_dir)
    m = execution_model(run).ranks[0]
    rt = run.ranks[0]
    ar = [i for i in range(len(rt)) if rt.name(i).startswith("c10d::all_reduce")]
    assert sorted(zip(m.queue_src.tolist(), m.queue_dst.tolist(), strict=True)) == sorted(
        [(ar[1], ar[2]), (ar[0], ar[3])]
    )
    starts = set(zip(m.start_src.tolist(), m.start_dst.tolist(), strict=True))
    assert not {(x, y) for x in ar for y in ar} & starts  # issued by the host, whatever the stream does
    _exact(run_dir)

    b = RunBuilder(2)
    for r, peer in ((0, 1), (1, 0)):
        rb = b.rank(r).step(0)
        a = rb.compute("issue", MS, start_ns=0)
        rb.send(peer, 4096, 3 * MS, start_ns=MS, stream=COMM, deps=(a,))
        rb.recv(peer, 4096, 3 * MS, start_ns=MS + 5_000, stream=COMM, deps=(a,))
    run = load_run(b.write(tmp_path / "p2p"))
    m = execution_model(run).ranks[0]
    assert m.queue_src.size == 0
    assert not any(run.ranks[0].name(int(s)) == "c10d::send" for s in m.start_src)


def test_a_nested_node_follows_its_enclosing_node_in_the_replay_and_the_plan(tmp_path: Path) -> None:
    from skewlens.profiler.vocab import NodeType

    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    first = rb.compute("aten::mm", 4 * MS, start_ns=0)
    outer = rb.compute("aten::linear", 10 * MS, start_ns=4 * MS, deps=(first,))
    rb.compute("aten::addmm", 6 * MS, start_ns=6 * MS, deps=(outer,))
    run = load_run(b.write(tmp_path / "run"))

    class SlowMm:
        def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
            return 2.0 if name == "aten::mm" else 1.0

        def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
            return 0

        def stall_ns(self, rank: int, step: int) -> int:
            return 0

    res = simulate(run, effects=SlowMm())
    assert res.start_ns[0][2] == 8 * MS and res.start_ns[0][3] == 10 * MS  # linear, then addmm inside it
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert [o.kind for o in ops][:2] == [KIND_COMPUTE, KIND_COMPUTE]
    assert ops[2].parent == ops[1].row and ops[2].offset_ns == 2 * MS


def test_a_nested_node_is_timed_by_its_enclosing_nodes_segment_at_its_recorded_offset(
    tmp_path: Path,
) -> None:
    from skewlens.replay.comm import AsRecorded
    from skewlens.replay.lower import lower

    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        first = rb.compute("aten::mm", 4 * MS, start_ns=0)
        outer = rb.compute("aten::linear", 10 * MS, start_ns=4 * MS, deps=(first,))
        rb.compute("aten::addmm", 6 * MS, start_ns=(6 + r) * MS, deps=(outer,))
    run = load_run(b.write(tmp_path / "run"))
    low = lower(run, effects=NO_EFFECTS, timing=AsRecorded())
    names = {r: [run.ranks[r].name(k) for k in range(len(run.ranks[r]))] for r in low.ranks}
    first_row = {r: int(low.row_offset[i]) for i, r in enumerate(low.ranks)}
    linear = {r: first_row[r] + names[r].index("aten::linear") for r in low.ranks}
    addmm = {r: first_row[r] + names[r].index("aten::addmm") for r in low.ranks}
    assert low.nested.tolist() == [addmm[0], addmm[1]]
    assert low.nested_parent.tolist() == [linear[0], linear[1]]
    assert low.nested_off_ns.tolist() == [2 * MS, 3 * MS]
    every = np.arange(int(low.row_offset[-1]), dtype=np.int64)
    anchors = low.anchor_segments(every)
    expect = low.seg_of_row.copy()
    expect[[addmm[0], addmm[1]]] = low.seg_of_row[[linear[0], linear[1]]]
    assert anchors.tolist() == expect.tolist()
    assert anchors[addmm[1]] != low.seg_of_row[addmm[1]]


def test_check_refuses_a_trace_where_two_ranks_each_recv_first_naming_both(tmp_path: Path) -> None:
    from skewlens.cli.store import check_main

    b = RunBuilder(2)
    for r, peer in ((0, 1), (1, 0)):
        rb = b.rank(r).step(0)
        a = rb.compute("fwd", MS, start_ns=0)
        rb.recv(peer, 4096, 5 * MS, start_ns=MS, tag=7, deps=(a,))
        rb.send(peer, 4096, 2 * MS, start_ns=6 * MS, tag=7)
    run_dir = b.write(tmp_path / "run")
    from skewlens.replay.simulate import find_deadlock

    why = find_deadlock(load_run(run_dir))
    assert why is not None
    # node 1 is the compute, 2 the recv, 3 the send
    assert "rank 0 node 2 (c10d::recv_): recv from rank 1, group '0', tag 7 waits for rank 1 node 3" in why
    assert "rank 1 node 2 (c10d::recv_): recv from rank 0, group '0', tag 7 waits for rank 0 node 3" in why
    assert check_main([str(run_dir), "--no-progress"]) == 1


def test_check_passes_a_1f1b_run_that_completed(tmp_path: Path) -> None:
    from skewlens.replay.simulate import find_deadlock

    assert find_deadlock(load_run(_one_f_one_b(tmp_path))) is None


def test_the_replay_summary_measures_steps_mark_to_mark_and_an_unmodified_replay_matches_them(
    tmp_path: Path,
) -> None:
    from skewlens.replay.summary import summarize

    run = load_run(_functional(tmp_path, 40.0))
    rows = summarize(run, simulate(run))
    assert len(rows) == 6
    assert all(r.step_time_ns == r.recorded_step_ns > 0 for r in rows)
    slower = summarize(run, simulate(run, effects=RankFactor(1, 1.5)))
    assert all(s.step_time_ns > s.recorded_step_ns for s in slower)


def _ddp_collectives_level(tmp_path: Path, late_ms: float, steps: int = 3) -> Path:
    """DDP at the collectives level: backward issues two bucket all_reduces, then DDP's reducer waits for
    them inside the host-time node that follows (out of the hooks' sight), then the optimizer runs."""
    b = RunBuilder(2)
    t = 0
    late = int(late_ms * MS)
    for s in range(steps):
        fwd = {0: 10 * MS, 1: 10 * MS + late}
        last = t + max(fwd.values()) + 2 * MS  # the later rank issues the second bucket here
        for r in (0, 1):
            rb = b.rank(r).step(s)
            f0 = t + fwd[r]
            f = rb.compute("compute", fwd[r], start_ns=t)
            a1 = rb.collective(
                CommType.ALL_REDUCE, 1 << 20, last - 2 * MS + MS - f0, start_ns=f0, stream=COMM, deps=(f,)
            )
            g = rb.compute("compute", 2 * MS, start_ns=f0, deps=(f,))
            rb.collective(
                CommType.ALL_REDUCE,
                1 << 20,
                last + MS - (f0 + 2 * MS),
                start_ns=f0 + 2 * MS,
                stream=COMM,
                deps=(g, a1),
            )
            rb.compute("compute", last + MS + 5 * MS - (f0 + 2 * MS), start_ns=f0 + 2 * MS, deps=(g,))
        t = last + 6 * MS + 100_000
    return b.write(tmp_path / f"ddp{late_ms}")


def test_a_collectives_level_gap_holding_its_threads_last_async_completion_waited_for_it(
    tmp_path: Path,
) -> None:
    run_dir = _ddp_collectives_level(tmp_path, 30.0)
    _exact(run_dir)
    run = load_run(run_dir)
    for r in (0, 1):
        m, rt = execution_model(run).ranks[r], run.ranks[r]
        tails = [i for i in range(len(rt)) if rt.name(i) == "compute"][2::3]
        assert sorted(m.wait_dst.tolist()) == tails  # each step's tail waited for its second bucket
        assert (m.work_ns[tails] == 5 * MS).all()  # the optimizer's 5 ms, after the completion
    res = analyze_run(run, blame=True)
    assert res.stragglers[0].rank == 1
    assert res.stragglers[0].straggler_cost_ns / 3 == pytest.approx(30 * MS, rel=0.05)


def test_the_work_after_a_hidden_wait_is_compute_in_the_breakdown_and_in_the_replay(
    tmp_path: Path,
) -> None:
    # the optimizer's 5 ms after DDP's hidden wait (or a sleep before the next send) is the program's work,
    # not the overhead of a wait op: it was counted as transfer, and a slow sender was never the cause
    run = load_run(_ddp_collectives_level(tmp_path, 30.0))
    res = analyze_run(run, blame=False)
    for r in (0, 1):
        rt = run.ranks[r]
        tails = [i for i in range(len(rt)) if rt.name(i) == "compute"][2::3]
        assert np.flatnonzero(execution_model(run).ranks[r].host_work).tolist() == tails
        assert np.flatnonzero(res.index.ranks[r].host_work).tolist() == tails
    bd = {(b.rank, b.step): b for b in res.breakdown}
    fwd = {0: 10 * MS, 1: 40 * MS}  # forward, then 2 ms of backward, then the optimizer's 5 ms
    for (r, _s), b in bd.items():
        assert b.compute_ns == fwd[r] + 2 * MS + 5 * MS, (r, b)
        assert b.compute_ns + b.exposed_wait_ns + b.exposed_transfer_ns + b.idle_ns == b.step_ns
    # nor communication: rank 0's only overlap is its buckets under the 2 ms of backward (10 to 12 ms of the
    # step), rank 1's its first bucket (40 to 41); counting the hidden wait's node whole as communication
    # put the optimizer's 5 ms in the overlap too (7 and 6 ms)
    assert {(r, s): b.overlapped_comm_ns for (r, s), b in bd.items()} == {
        (r, s): {0: 2 * MS, 1: MS}[r] for r, s in bd
    }
    replayed = {(x.rank, x.step): x.compute_ns for x in summarize(run, simulate(run))}
    assert replayed == {k: b.compute_ns for k, b in bd.items()}


def _accumulation_without_no_sync(tmp_path: Path, late_ms: float, steps: int = 3) -> Path:
    """DDP at the ``collectives`` level, two micro-batches a step without ``no_sync``: each backward issues
    two buckets and its end waits for both (hidden in the host-time node after the second), then the next
    micro-batch or the optimizer runs. Rank 1 is ``late_ms`` late into the first backward's second half."""
    b = RunBuilder(2)
    t = 0
    late = int(late_ms * MS)
    for s in range(steps):
        for r in (0, 1):
            rb = b.rank(r).step(s)
            at = t
            prev = rb.compute("compute", 3 * MS, start_ns=at)  # forward, backward's first half
            for micro in range(2):
                extra = late if (r == 1 and micro == 0) else 0
                i1 = at + 3 * MS
                # bucket 1 issued; then the backward's second half (2 ms, the late rank more)
                peer1 = at + 3 * MS  # both issue bucket 1 together
                done1 = peer1 + MS
                a1 = rb.collective(
                    CommType.ALL_REDUCE, 1 << 20, done1 - i1, start_ns=i1, stream=COMM, deps=(prev,)
                )
                g = rb.compute("compute", 2 * MS + extra, start_ns=i1, deps=(prev,))
                i2 = i1 + 2 * MS + extra
                last2 = at + 3 * MS + 2 * MS + (late if micro == 0 else 0)  # the later rank's issue
                done2 = last2 + MS
                rb.collective(
                    CommType.ALL_REDUCE, 1 << 20, done2 - i2, start_ns=i2, stream=COMM, deps=(g, a1)
                )
                # DDP's wait for both buckets, then the next micro-batch's forward and backward's first half
                # (3 ms) or the optimizer (3 ms)
                prev = rb.compute("compute", done2 + 3 * MS - i2, start_ns=i2, deps=(g,))
                at = done2
        t = at + 3 * MS + 100_000
    return b.write(tmp_path / f"accum{late_ms}")


def test_every_backward_of_a_step_without_no_sync_waited_for_its_buckets_where_a_peer_was_late(
    tmp_path: Path,
) -> None:
    # gradient accumulation without no_sync: only the step's last backward had its hidden wait; the
    # first one's was counted as rank 0's compute, which named rank 0 the straggler (0.59 ms) and rank 1
    # (20 ms late a step) 0.06 ms
    run_dir = _accumulation_without_no_sync(tmp_path, 20.0)
    _exact(run_dir)
    run = load_run(run_dir)
    model = execution_model(run)
    for r in (0, 1):
        m, rt = model.ranks[r], run.ranks[r]
        # a step's compute nodes: forward, then per micro-batch the backward's second half and the tail
        comp = [i for i in range(len(rt)) if rt.name(i) == "compute"]
        tails = [i for k, i in enumerate(comp) if k % 5 in (2, 4)]
        waited = sorted(m.wait_dst.tolist())
        if r == 0:  # both backwards: the first waited for rank 1, the last is the step's last issue
            assert waited == tails
            assert (m.work_ns[tails] == 3 * MS).all()  # what follows the completion: its own work
        else:  # rank 1 arrived last at the first backward's buckets: only the step's last one
            assert waited == tails[1::2]
        mids = [i for k, i in enumerate(comp) if k % 5 in (1, 3)]  # backward's second halves
        assert not set(mids) & set(waited)
    res = analyze_run(run, blame=True)
    assert res.stragglers[0].rank == 1
    assert res.stragglers[0].straggler_cost_ns / 3 == pytest.approx(20 * MS, rel=0.05)


def _ddp_ops_level(
    tmp_path: Path,
    late_ms: float,
    *,
    lag_ns: int,
    steps: int = 3,
    tail_ns: int = 0,
    nested_wait: bool = False,
    returned_ns: int | None = None,
) -> Path:
    """DDP at the ``ops`` level: backward ops issue two bucket all_reduces, then DDP's reducer waits for the
    first inside ``untraced`` host time, which ends ``lag_ns`` before gloo's worker recorded that bucket's
    end (the worker lags the completion the program saw), or ``tail_ns`` after it (the thread went on in
    untraced time), copies it back (where ``nested_wait``, through a ``c10d::wait`` on the first bucket
    0.1-0.4 ms into the copy), waits for the second, then the optimizer runs. ``returned_ns``: the first
    bucket's call returned that long after the untraced time ended (``skl_return_ns``; none by default)."""
    b = RunBuilder(2)
    t = 0
    late = int(late_ms * MS)
    for s in range(steps):
        fwd = {0: 10 * MS, 1: 10 * MS + late}
        done1 = t + max(fwd.values()) + 5 * MS  # the later rank's first bucket, 5 ms after it is issued
        for r in (0, 1):
            rb = b.rank(r).step(s)
            f0 = t + fwd[r]
            f = rb.compute("aten::mm", fwd[r], start_ns=t)
            a1 = rb.collective(CommType.ALL_REDUCE, 1 << 20, done1 - f0, start_ns=f0, stream=COMM, deps=(f,))
            g = rb.compute("aten::mm", 2 * MS, start_ns=f0, deps=(f,))
            a2 = rb.collective(
                CommType.ALL_REDUCE,
                1 << 20,
                done1 + 2 * MS - (f0 + 2 * MS),
                start_ns=f0 + 2 * MS,
                stream=COMM,
                deps=(g, a1),
            )
            u_end = done1 - lag_ns + tail_ns
            if returned_ns is not None:
                node = next(n for n in rb.nodes if n.node_id == a1)
                node.attrs[Attr.RETURN_NS] = u_end + returned_ns
            u = rb.compute("untraced", u_end - (f0 + 2 * MS), start_ns=f0 + 2 * MS, deps=(g,))
            c = rb.compute("copy_bucket_to_grad", MS // 2, start_ns=u_end, deps=(u,))
            if nested_wait:
                rb.compute("c10d::wait", 300_000, start_ns=u_end + 100_000, deps=(c, a1))
            rb.compute("Optimizer.step", 5 * MS, start_ns=done1 + 2 * MS, deps=(c, a2))
        t = done1 + 7 * MS + 100_000
    return b.write(tmp_path / f"ddp_ops{late_ms}")


def test_ops_level_untraced_time_that_holds_the_first_buckets_lagged_completion_waited_for_it(
    tmp_path: Path,
) -> None:
    # compiled DDP at the ops level: the reducer's wait for the first bucket sits in untraced time that
    # ends 0.12 ms before gloo's worker records the bucket's end; kept as host time, it hid rank 1's
    # lateness from the what-if (7.1 ms blamed on a step that cost 37)
    lag = 120_000
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=lag))
    for r in (0, 1):
        m, rt = execution_model(run).ranks[r], run.ranks[r]
        untraced = [i for i in range(len(rt)) if rt.name(i) == "untraced"]
        assert sorted(m.wait_dst.tolist()) == untraced
        assert [rt.name(i) for i in m.wait_src.tolist()] == ["c10d::all_reduce_"] * 3
        assert (rt.start_ns[m.wait_src] < rt.start_ns[m.wait_dst]).all()  # the first bucket of each step
        assert not m.host_work.any()  # what follows the wait is still untraced time: idle, not compute
    # the program saw the bucket complete by the end of its wait: that is its end in the model, and the
    # unmodified replay reproduces every other time exactly
    res = simulate(run)
    for r, rt in run.ranks.items():
        m = execution_model(run).ranks[r]
        assert m.end_clamp_rows.tolist() == sorted(m.wait_src.tolist())
        assert (m.end_clamp_ns == rt.end_ns[m.end_clamp_rows] - lag).all()
        t = res.timed[r]
        assert np.array_equal(res.start_ns[r][t], rt.start_ns[t])
        want = rt.end_ns.copy()
        want[m.end_clamp_rows] = m.end_clamp_ns
        assert np.array_equal(res.end_ns[r][t], want[t])
    assert all(s.step_time_ns == s.recorded_step_ns for s in summarize(run, res))
    out = analyze_run(run, blame=True)
    assert out.stragglers[0].rank == 1
    assert out.stragglers[0].straggler_cost_ns / 3 == pytest.approx(30 * MS, rel=0.05)


def _two_buckets(
    rb: RankBuilder, prev: int, g0: int, bwd_ns: int, done1: int, done2: int
) -> tuple[int, int, int]:
    """A DDP backward of two buckets from ``g0``: 2 ms, the first bucket's all_reduce (1 MiB, recorded end
    ``done1``), ``bwd_ns`` more, the second's (4 MiB, ``done2``); returns the backward's last row, the
    second all_reduce and its issue time."""
    g1 = rb.compute("aten::mm", 2 * MS, start_ns=g0, deps=(prev,))
    a1 = rb.collective(
        CommType.ALL_REDUCE, 1 << 20, done1 - (g0 + 2 * MS), start_ns=g0 + 2 * MS, stream=COMM, deps=(g1,)
    )
    e = g0 + 2 * MS + bwd_ns
    g2 = rb.compute("aten::mm", bwd_ns, start_ns=g0 + 2 * MS, deps=(g1,))
    a2 = rb.collective(CommType.ALL_REDUCE, 4 << 20, done2 - e, start_ns=e, stream=COMM, deps=(g2, a1))
    return g2, a2, e


def _ddp_two_bucket_waits(tmp_path: Path, late_ms: float, *, lag_ns: int = 50_000, steps: int = 3) -> Path:
    """DDP at the ``ops`` level as torch's reducer finishes a backward of two buckets: it waits for the
    first in ``untraced`` time, copies it back (``copy_bucket_to_grad``), waits for the second in untraced
    time again, copies it back, then the optimizer runs. Rank 1's backward between the two issues is
    ``late_ms`` longer (more tokens), so rank 0's wait for the second bucket holds the lateness. Each wait
    ends ``lag_ns`` before gloo's worker recorded its bucket's end."""
    b = RunBuilder(2)
    t = 0
    late = int(late_ms * MS)
    for s in range(steps):
        f0 = t + 10 * MS
        bwd = {0: 2 * MS, 1: 2 * MS + late}
        done1 = f0 + 5 * MS  # both issued the first bucket at f0 + 2 ms
        done2 = f0 + 2 * MS + max(bwd.values()) + MS
        for r in (0, 1):
            rb = b.rank(r).step(s)
            f = rb.compute("aten::mm", 10 * MS, start_ns=t)
            g2, a2, e = _two_buckets(rb, f, f0, bwd[r], done1, done2)
            prev = g2
            at = e
            if done1 - lag_ns > e:  # bucket 1 still running at the last issue: the reducer waits for it
                prev = rb.compute("untraced", done1 - lag_ns - e, start_ns=e, deps=(g2,))
                at = done1 - lag_ns
            c1 = rb.compute("copy_bucket_to_grad", MS // 2, start_ns=at, deps=(prev,))
            u2 = rb.compute("untraced", done2 - lag_ns - (at + MS // 2), start_ns=at + MS // 2, deps=(c1,))
            c2 = rb.compute("copy_bucket_to_grad", MS // 2, start_ns=done2 - lag_ns, deps=(u2,))
            rb.compute("Optimizer.step", 2 * MS, start_ns=done2 - lag_ns + MS // 2, deps=(c2, a2))
        t = done2 + 3 * MS
    return b.write(tmp_path / f"ddp_two_buckets{late_ms}")


def test_the_reducers_wait_for_a_later_bucket_after_copying_back_an_earlier_one_is_a_wait_too(
    tmp_path: Path,
) -> None:
    # 2 gloo ranks of a DDP transformer at `ops` fed variable-length batches: the light rank's reducer
    # waited for its first bucket (17.6 ms), copied it back, then waited 146 ms for the second, in untraced
    # time ending 1.7 ms before gloo recorded the bucket's end. Only the untraced time right after the last
    # issue was taken as a wait; the second wait stayed host time, so a what-if that balanced the tokens
    # still waited 146 ms there (rank 1's balanced step 424 ms, recorded 276) and blame missed the late rank
    run = load_run(_ddp_two_bucket_waits(tmp_path, 30.0))
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    untraced = [i for i in range(len(rt)) if rt.name(i) == "untraced"]
    assert sorted(m.wait_dst.tolist()) == untraced  # both of rank 0's waits, in every step
    assert len(untraced) == 6
    assert [rt.comm_bytes[i] for i in m.wait_src[np.argsort(m.wait_dst)].tolist()] == [1 << 20, 4 << 20] * 3
    res = simulate(run)
    assert all(s.step_time_ns == s.recorded_step_ns for s in summarize(run, res))
    out = analyze_run(run, blame=True)
    assert out.stragglers[0].rank == 1
    assert out.stragglers[0].straggler_cost_ns / 3 == pytest.approx(30 * MS, rel=0.05)


def _ddp_sleep_before_backward(tmp_path: Path, sleep_ms: float = 30.0, *, steps: int = 3) -> Path:
    """DDP at the ``ops`` level, two buckets, as captured of 2 gloo ranks whose rank 1 slept ``sleep_ms``
    (untraced) between forward and backward: rank 0's first bucket completes while its backward still runs,
    so after its last issue the reducer finds it done, copies it back (after a 10 us sliver of untraced
    time) and waits for the second bucket in untraced time."""
    b = RunBuilder(2)
    t = 0
    sleep = int(sleep_ms * MS)
    us10 = 10_000
    for s in range(steps):
        f0 = t + 10 * MS
        late = {0: 0, 1: sleep}
        done1 = f0 + sleep + 3 * MS  # rank 1 issued the first bucket at f0 + sleep + 2 ms
        done2 = f0 + sleep + 43 * MS
        for r in (0, 1):
            rb = b.rank(r).step(s)
            prev = rb.compute("DistributedDataParallel.forward", 10 * MS, start_ns=t)
            if late[r]:
                prev = rb.compute("untraced", late[r], start_ns=f0, deps=(prev,))
            g0 = f0 + late[r]
            g2, a2, e = _two_buckets(rb, prev, g0, 40 * MS, done1, done2)
            sl = rb.compute("untraced", us10, start_ns=e, deps=(g2,))
            c1 = rb.compute("copy_bucket_to_grad", MS // 2, start_ns=e + us10, deps=(sl,))
            at = e + us10 + MS // 2
            u2 = rb.compute("untraced", done2 - 20_000 - at, start_ns=at, deps=(c1,))
            c2 = rb.compute("copy_bucket_to_grad", MS // 2, start_ns=done2 - 20_000, deps=(u2,))
            rb.compute("Optimizer.step", 2 * MS, start_ns=done2 - 20_000 + MS // 2, deps=(c2, a2))
        t = done2 + 3 * MS
    return b.write(tmp_path / "ddp_sleep_before_backward")


def test_the_wait_for_the_last_bucket_is_a_wait_where_the_first_bucket_was_done_before_the_last_issue(
    tmp_path: Path,
) -> None:
    # 2 gloo ranks of DDP (two buckets) at `ops`, rank 1 sleeping 30 ms between forward and backward: rank
    # 0's first bucket completed during its backward, and a 10 us sliver of untraced time came before its
    # copy, so the rule found no wait right after the last issue and never looked further: rank 0's waits
    # for the second bucket (18-59 ms a step) were fixed host time, and blame charged rank 1 0.000 ms a step
    # of its 34.9 ms caused wait
    run = load_run(_ddp_sleep_before_backward(tmp_path))
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    long_waits = [i for i in range(len(rt)) if rt.name(i) == "untraced" and rt.dur_ns[i] > MS]
    assert len(long_waits) == 3
    assert set(long_waits) <= set(m.wait_dst.tolist())
    waited = dict(zip(m.wait_dst.tolist(), m.wait_src.tolist(), strict=True))
    assert [rt.comm_bytes[waited[i]] for i in long_waits] == [4 << 20] * 3
    steps = summarize(run, simulate(run))
    assert [s.step_time_ns for s in steps] == [s.recorded_step_ns for s in steps]
    top = analyze_run(run, blame=True).stragglers[0]
    assert (top.rank, top.straggler_cost_ns / 3) == (1, pytest.approx(30 * MS, rel=0.05))


def _bucket_then_host_time(path: Path, *, next_step: bool) -> tuple[int, int, set[tuple[int, int]]]:
    """2 ranks: a bucket issued at 12 ms that completes at 25 ms, waited for by no wait node; 1 ms of
    untraced time, a 7 ms op, then 10 ms of untraced time (20-30 ms), in step 1 where ``next_step`` (the op
    ``Optimizer.step``, the step's end) else in step 0 (the op ``copy_bucket_to_grad``). Rank 0's bucket
    row, that later untraced row, and its model's wait edges."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        g = rb.compute("aten::mm", 12 * MS, start_ns=0)
        a = rb.collective(CommType.ALL_REDUCE, 1 << 20, 13 * MS, start_ns=12 * MS, stream=COMM, deps=(g,))
        u = rb.compute("untraced", MS, start_ns=12 * MS, deps=(g,))
        op = "Optimizer.step" if next_step else "copy_bucket_to_grad"
        o = rb.compute(op, 7 * MS, start_ns=13 * MS, deps=(u,))
        if next_step:
            rb.step(1)
        u1 = rb.compute("untraced", 10 * MS, start_ns=20 * MS, deps=(o,))
        rb.compute("aten::mm", 5 * MS, start_ns=30 * MS, deps=(u1, a))
    run = load_run(b.write(path))
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    (bucket,) = [i for i in range(len(rt)) if rt.comm_bytes[i] == 1 << 20]
    (later,) = [i for i in range(len(rt)) if rt.name(i) == "untraced" and rt.dur_ns[i] == 10 * MS]
    return bucket, later, set(zip(m.wait_src.tolist(), m.wait_dst.tolist(), strict=True))


def test_a_host_time_node_of_the_next_step_does_not_wait_for_a_bucket_left_running_from_the_step_before(
    tmp_path: Path,
) -> None:
    # step 0's last bucket (issued at 12 ms) is waited for nowhere in step 0 and completes at 25 ms, inside
    # step 1's first untraced node (20-30 ms): DDP's reducer waits for its buckets in the backward that
    # issued them, so that node's time is step 1's own host time, not a wait (question 287: kept so; a
    # mutant that let the reducer's later-node rule cross into the next step went unnoticed)
    bucket, later, waits = _bucket_then_host_time(tmp_path / "run", next_step=True)
    assert (bucket, later) not in waits
    # while the same completion inside a later host-time node of its own step is that node's wait
    bucket, later, waits = _bucket_then_host_time(tmp_path / "same_step", next_step=False)
    assert (bucket, later) in waits


def test_a_sleep_before_backward_is_named_host_idle_at_the_last_bucket_not_the_backward_after_it(
    tmp_path: Path,
) -> None:
    # the same run: rank 0 waited for the first bucket under its backward (gloo's worker waited, its thread
    # ran on), so the two threads did not meet there. Its completion was taken as their common point, and
    # the windows from it to the last bucket held 39 ms of rank 1's backward and 9 ms of rank 0's: "compute
    # grew: AddmmBackward0 +32.7 ms" of a 30 ms sleep before backward, in a capture of 2 gloo ranks
    out = analyze_run(load_run(_ddp_sleep_before_backward(tmp_path)), blame=False)
    last = [e for e in out.skew.events if e.step >= 1 and int(e.comm_bytes[0]) == 4 << 20]
    assert len(last) == 2
    for e in last:
        assert e.late_rank == 1
        assert e.cause.kind is CauseKind.HOST_GAP
        assert e.cause.delta_ns == pytest.approx(30 * MS, abs=0.1 * MS)


def test_a_sleep_before_the_first_backward_is_named_host_idle_where_no_earlier_bucket_held_both(
    tmp_path: Path,
) -> None:
    # the same run's first step: no event before its last bucket synchronised the two (the first bucket's
    # wait hid under rank 0's backward), and the windows started at the first bucket's completion anyway, as
    # the group's previous instance: "compute grew: aten::mm +30.0 ms" here, and "compute grew:
    # AddmmBackward0 +40.2 ms" of a step whose rank 0 waited 47.7 ms for rank 1's 30.1 ms sleep, in a capture
    # of 2 gloo ranks; from each member's step start, the sleep
    out = analyze_run(load_run(_ddp_sleep_before_backward(tmp_path)), blame=False)
    first = [e for e in out.skew.events if e.step == 0]
    assert [int(e.comm_bytes[0]) for e in first] == [1 << 20, 4 << 20]
    for e in first:
        assert e.late_rank == 1
        assert e.cause.kind is CauseKind.HOST_GAP
        assert e.cause.delta_ns == pytest.approx(30 * MS, abs=0.1 * MS)


#: The reducer's buckets at the end of a backward, one shape a step (ms from the step's start): each bucket's
#: issue, recorded end and bytes; then the host rows after the last issue, (name, start, end), "untraced"
#: time and traced copies. Step 0: the first bucket completed before the last issue (no wait), the second's
#: end is recorded 1 ms after the first untraced stretch, the third's 1 ms after the second. Step 1: the
#: second untraced stretch holds the ends of two buckets. Step 2: the second stretch (6 ms) ends 9.5 ms
#: before the second bucket's end, under ``WAIT_RATIO`` (10) times that, and a third holds it; the
#: fourth holds that end again (recorded 0.3 ms into it), a bucket already waited for. Step 3: the ends of
#: two buckets are recorded 1 and 2 ms after the second stretch: it waited for the one recorded soonest.
#: Step 4: the second stretch holds the end of one bucket 5 ms before its own end and another's at its end.
_BUCKET_SHAPES: tuple[
    tuple[tuple[tuple[int, float, int], ...], tuple[tuple[str, float, float], ...]], ...
] = (
    (
        ((2, 3.5, 1 << 20), (3, 25, 2 << 20), (4, 41, 4 << 20)),
        (
            ("untraced", 4, 24),
            ("copy_bucket_to_grad", 24, 24.5),
            ("untraced", 24.5, 40),
            ("copy_bucket_to_grad", 40, 40.5),
        ),
    ),
    (
        ((2, 25, 1 << 20), (3, 30, 2 << 20), (4, 35, 4 << 20)),
        (
            ("untraced", 4, 24),
            ("copy_bucket_to_grad", 24, 24.5),
            ("untraced", 24.5, 40),
            ("copy_bucket_to_grad", 40, 40.5),
        ),
    ),
    (
        ((2, 25, 1 << 20), (4, 40, 4 << 20)),
        (
            ("untraced", 4, 24),
            ("copy_bucket_to_grad", 24, 24.5),
            ("untraced", 24.5, 30.5),
            ("aten::zero_", 30.5, 31),
            ("untraced", 31, 39.5),
            ("copy_bucket_to_grad", 39.5, 39.7),
            ("untraced", 39.7, 40.8),
        ),
    ),
    (
        ((2, 25, 1 << 20), (3, 46, 2 << 20), (4, 47, 4 << 20)),
        (
            ("untraced", 4, 24),
            ("copy_bucket_to_grad", 24, 24.5),
            ("untraced", 24.5, 45),
            ("copy_bucket_to_grad", 45, 45.5),
        ),
    ),
    (
        ((2, 25, 1 << 20), (3, 40, 2 << 20), (4, 45, 4 << 20)),
        (
            ("untraced", 4, 24),
            ("copy_bucket_to_grad", 24, 24.5),
            ("untraced", 24.5, 45),
            ("copy_bucket_to_grad", 45, 45.5),
        ),
    ),
)


def test_a_later_untraced_stretch_waits_for_the_bucket_it_holds_by_the_rule_of_the_first(
    tmp_path: Path,
) -> None:
    # the rule of the wait hidden after the last issue, applied to each later untraced stretch of the step:
    # of the buckets not yet waited for whose end it holds (recorded inside it, else the one recorded soonest
    # after, up to LAG_SLACK_NS, where it ran WAIT_RATIO times that before), the one that ended last
    b = RunBuilder(2)
    for r in (0, 1):
        for s, (buckets, host) in enumerate(_BUCKET_SHAPES):
            rb, t0 = b.rank(r).step(s), s * 50 * MS
            prev = rb.compute("aten::mm", 2 * MS, start_ns=t0)
            issued = []
            for k, (at, done, nbytes) in enumerate(buckets):
                if k:  # the backward between two issues
                    was = buckets[k - 1][0]
                    prev = rb.compute("aten::mm", (at - was) * MS, start_ns=t0 + was * MS, deps=(prev,))
                issued.append(
                    rb.collective(
                        CommType.ALL_REDUCE,
                        nbytes,
                        int((done - at) * MS),
                        start_ns=t0 + at * MS,
                        stream=COMM,
                        deps=(prev,),
                    )
                )
            for name, a, e in host:
                prev = rb.compute(name, int((e - a) * MS), start_ns=t0 + int(a * MS), deps=(prev,))
            rb.compute("Optimizer.step", MS, start_ns=t0 + int(host[-1][2] * MS), deps=(prev, *issued))
    run = load_run(b.write(tmp_path / "run"))
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    waits = sorted(zip(m.wait_dst.tolist(), m.wait_src.tolist(), strict=True))
    assert [
        (int(rt.step[d]), int(rt.start_ns[d] - rt.step[d] * 50 * MS), int(rt.comm_bytes[c])) for d, c in waits
    ] == [
        (0, 4 * MS, 2 << 20),  # the first stretch: the second bucket, 1 ms after it
        (
            0,
            24_500_000,
            4 << 20,
        ),  # the second: the third, 1 ms after it (not the first, done before it began)
        (1, 4 * MS, 1 << 20),
        (1, 24_500_000, 4 << 20),  # the later of the two ends inside it
        (2, 4 * MS, 1 << 20),
        (2, 31 * MS, 4 << 20),  # not the 6 ms stretch that ended 9.5 ms before the bucket: the next one
        # (and not the last stretch too)
        (3, 4 * MS, 1 << 20),
        (3, 24_500_000, 2 << 20),  # the one recorded soonest after it
        (4, 4 * MS, 1 << 20),
        (4, 24_500_000, 4 << 20),  # the one recorded at its very end, not the one inside it before
    ]


def test_a_lagged_completion_the_model_moves_earlier_is_no_wait_for_the_astra_sim_export(
    tmp_path: Path,
) -> None:
    # the model takes each first bucket's end 0.12 ms earlier (the untraced time that hid its wait ended
    # there), but no node of the trace names it as a wait: the ASTRA-sim export's graph runs every row for its
    # whole recorded duration, the all_reduces' too (cut to their clamped end, each was 0.12 ms short)
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=120_000))
    for r, rt in run.ranks.items():
        m = execution_model(run).ranks[r]
        assert m.end_clamp_rows.size == 3
        assert recorded_wait_work_ns(rt, m).tolist() == rt.dur_ns.tolist()
        assert m.work_ns[m.end_clamp_rows].tolist() == rt.dur_ns[m.end_clamp_rows].tolist()


def test_a_wait_nested_in_an_op_on_a_lagged_completion_is_cut_at_the_end_the_model_takes(
    tmp_path: Path,
) -> None:
    # the nested c10d::wait [u+0.1, u+0.4) ms names the first bucket, which the model ends with the untraced
    # time (at u, 0.12 ms before gloo recorded it): the ASTRA-sim export's graph starts the wait once the
    # bucket completes, so all of its 0.3 ms is its own (cut at the recorded end, 0.28 ms)
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=120_000, nested_wait=True))
    for r, rt in run.ranks.items():
        m = execution_model(run).ranks[r]
        waits = [i for i in range(len(rt)) if rt.name(i) == "c10d::wait"]
        assert m.end_clamp_rows.size == len(waits) == 3
        assert recorded_wait_work_ns(rt, m)[waits].tolist() == [300_000] * 3


def test_blame_compares_untraced_time_that_hid_a_wait_by_its_part_after_the_completion(
    tmp_path: Path,
) -> None:
    # the what-if scaled such a node's whole recorded length (its wait included) toward its peers': rank 0
    # looked 30 ms slower than the median in untraced time, and its override, longer than the node's work
    # after the wait, made a what-if step 2.6 ms slower (a negative cost)
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=0, tail_ns=MS))
    m = execution_model(run).ranks[0]
    (u,) = m.wait_dst.tolist()[:1]
    assert m.work_ns[u] == MS  # blocked until the bucket completed, then 1 ms of untraced time
    res = analyze_run(run, blame=True)
    assert res.stragglers[0].rank == 1
    assert all(x.straggler_cost_ns >= 0 for x in res.blame.step_records)
    assert not [x for x in res.blame.step_records if x.rank == 0]  # its 1 ms is its peer's too


def test_untraced_time_that_only_overlaps_a_late_completion_did_not_wait_for_it(tmp_path: Path) -> None:
    # a completion recorded 2 ms after the untraced time ended: within a tenth of rank 0's 33 ms of it (the
    # worker's lag), not of rank 1's 1 ms (it was not what that waited on)
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=2 * MS))
    model = execution_model(run)
    assert model.ranks[0].wait_dst.size == 3
    assert model.ranks[1].wait_dst.size == 0


def test_what_waits_for_one_op_of_a_batch_waits_for_the_whole_batch(tmp_path: Path) -> None:
    """1F1B's steady state: ``batch_isend_irecv([send activation, recv gradient])``, then a wait on the
    send's Work; the program waits for every work of the batch, so the gradient's recv holds it too."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", MS, start_ns=0)
    s = r0.send(1, 4096, 30_000, start_ns=MS, stream=COMM, deps=(f,), batch=0)
    r0.recv(1, 4096, 5 * MS, start_ns=MS + 10_000, stream=COMM, deps=(f,), batch=0)
    w = r0.compute("c10d::wait", 5 * MS, start_ns=MS + 20_000, deps=(f, s))
    r0.compute("bwd", MS, start_ns=6 * MS + 30_000, deps=(w,))
    g = r1.compute("fwd_bwd", 6 * MS, start_ns=0)
    r1.recv(0, 4096, 20_000, start_ns=6 * MS, stream=COMM, deps=(g,), batch=0)
    r1.send(0, 4096, 20_000, start_ns=6 * MS + 5_000, stream=COMM, deps=(g,), batch=0)
    run_dir = b.write(tmp_path / "run")
    _exact(run_dir)
    run = load_run(run_dir)
    assert run.ranks[0].batch is not None
    m0 = execution_model(run).ranks[0]
    rt0 = run.ranks[0]
    wait_row = next(i for i in range(len(rt0)) if rt0.name(i) == "c10d::wait")
    recv_row = next(i for i in range(len(rt0)) if rt0.name(i) == "c10d::recv_")
    assert (recv_row, wait_row) in set(zip(m0.wait_src.tolist(), m0.wait_dst.tolist(), strict=True))
    slow = simulate(run, effects=RankFactor(1, 2.0))  # rank 1's gradient comes 6 ms later
    assert slow.end_ns[0][wait_row] - simulate(run).end_ns[0][wait_row] >= 5 * MS


def test_a_member_recorded_done_before_the_last_arrival_keeps_its_time(tmp_path: Path) -> None:
    """Clock error between two ranks' traces: rank 0's all_reduce ends before rank 1 arrives."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        c = rb.compute("fwd", 5 * MS + (2 * MS if r == 1 else 0), start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 8192, MS if r == 0 else 500_000, deps=(c,))
        rb.compute("bwd", MS)
    run_dir = b.write(tmp_path / "run")
    _exact(run_dir)
    run = load_run(run_dir)
    (g,) = execution_model(run).syncs
    assert g.detached == (True, False)


def test_the_model_derived_on_threads_is_the_model_derived_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from skewlens.replay import execution

    run = load_run(_one_f_one_b(tmp_path, steps=4))
    models = {}
    for workers in (1, 4):
        monkeypatch.setattr(execution, "default_workers", lambda w=workers: w)
        models[workers] = execution.derive(run)
    one, many = models[1], models[4]
    assert list(many.ranks) == list(one.ranks) == sorted(run.ranks)
    for r, m in one.ranks.items():
        for f in dataclasses.fields(m):
            a, b = getattr(m, f.name), getattr(many.ranks[r], f.name)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (r, f.name)
    assert one.syncs == many.syncs


def _contradicting_clocks(tmp_path: Path, early_ms: float) -> Path:
    """Two ranks: rank 0's all_reduce recorded as done ``early_ms`` before rank 1's began (clocks of two
    hosts that disagree), then one that agrees."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    r0.collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=MS)
    r1.collective(CommType.ALL_REDUCE, 4096, 2 * MS, start_ns=int((3 + early_ms) * MS))
    r0.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=20 * MS)
    r1.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=20 * MS)
    return b.write(tmp_path / f"run-{early_ms}")


def test_check_analyze_and_replay_say_where_the_ranks_clocks_contradict_the_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the 128-GPU sample's first all_to_all: rank 0's kernel ended 46.5 ms before rank 1's began, and
    # analyze reported a 109 ms skew for it without a word
    from skewlens.cli.store import check_main
    from skewlens.replay.execution import clock_note
    from skewlens.replay.simulate import validate_replayable

    run_dir = _contradicting_clocks(tmp_path, 5.0)
    note = clock_note(load_run(run_dir))
    assert note is not None
    assert note.startswith("clocks disagree: 1 of 2 collectives and p2p pairs")
    assert "group '0' seq 0: rank 0 done 5.0 ms before rank 1 began" in note
    (issue,) = [i for i in validate_replayable(run_dir).issues if i.kind == "clocks"]
    assert issue.severity.name == "WARNING" and note in issue.message
    assert check_main([str(run_dir), "--no-progress"]) == 0  # a warning, not an error
    assert note in analyze_run(load_run(run_dir), blame=False).notes  # analyze's warnings
    cmd = [sys.executable, "-m", "skewlens", "replay", f"trace={run_dir}", f"out={tmp_path / 'replay'}"]
    replayed = subprocess.run(
        [*cmd, "progress=false", "perfetto=false"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert "skewlens replay: warning: clocks disagree: 1 of 2" in replayed.stderr
    assert "clocks disagree" not in replayed.stdout  # a script's > out.txt gets the results only
    # an end recorded under a millisecond early (a gloo worker's on one host) is the ends' own imprecision
    assert clock_note(load_run(_contradicting_clocks(tmp_path, 0.5))) is None


def _recv_before_send(tmp_path: Path, recv_ms: float) -> Path:
    """Two ranks of one host: rank 1 sends rank 0 4 KiB at 10-11 ms on its comm stream; rank 0's irecv,
    issued at 1 ms, lasted ``recv_ms`` (0: recorded without an end, at its issue end)."""
    b = RunBuilder(2)
    b.rank(0).step(0).recv(1, 4096, int(recv_ms * MS), start_ns=MS, stream=1000)
    b.rank(1).step(0).send(0, 4096, MS, start_ns=10 * MS, stream=1000)
    return b.write(tmp_path / f"run-recv-{recv_ms}")


def _drifting_clock(
    tmp_path: Path, drift_ms_per_step: float, late_ends_ms: Sequence[float] = (), *, steps: int = 20
) -> Path:
    """Two ranks, ``steps`` steps of 1,031 ms: rank 0 computes 30 ms longer, and rank 1 waits for it at the
    all_reduce; rank 1's clock gains ``drift_ms_per_step`` on rank 0's each step (a host clock running
    fast, aligned once at the start), and its end of step ``k``'s all_reduce is seen ``late_ends_ms[k]``
    late."""
    b = RunBuilder(2)
    step_ms = 1031
    for k in range(steps):
        t0 = k * step_ms * MS
        r0, r1 = b.rank(0).step(k), b.rank(1).step(k)
        r0.compute("compute", 1030 * MS, start_ns=t0)
        r0.collective(CommType.ALL_REDUCE, 4096, MS, start_ns=t0 + 1030 * MS)
        late = round(k * drift_ms_per_step * MS)
        r1.compute("compute", 1000 * MS, start_ns=t0 + late)
        seen = round((late_ends_ms[k] if late_ends_ms else 0) * MS)
        r1.collective(CommType.ALL_REDUCE, 4096, 31 * MS + seen, start_ns=t0 + 1000 * MS + late)
    return b.write(tmp_path / f"run-{drift_ms_per_step}-{len(late_ends_ms)}-{steps}")


def test_a_rank_whose_clock_drifts_after_alignment_is_said_with_how_far_though_no_collective_contradicts(
    tmp_path: Path,
) -> None:
    # 2 hosts, host B's clock 1,000 ppm fast (libfaketime): the offsets, measured at the window's start,
    # were 0.2 ms off there and 21.5 ms off 21 s later; every skew and wait between the hosts late in the
    # run was off by up to that. Where the drift shortens a wait (here: the waiting rank's clock is the fast
    # one), no member is recorded as done before another began: rank 0's 30 ms lateness read 11 ms at the
    # last step, and check, analyze and replay said nothing
    from skewlens.replay.execution import clock_note

    run = load_run(_drifting_clock(tmp_path, 1.0))
    note = clock_note(run)
    assert note == (
        "clocks drift: rank 1's clock gained 15.0 ms on rank 0's over 15.5 s (970 ppm): the ends of the 20 "
        "collectives they share, which finish together, moved apart from the first of them to the last (a "
        "host clock running fast or slow, or set while it ran); the offsets align the clocks at the window's "
        "start only, so the skew and waits between those ranks late in the run are off by about 15.0 ms "
        "(near the start, by less)"
    )
    assert note in analyze_run(run, blame=False).notes
    # the same run on one clock, and a drift under the ends' own spread (0.1 ms a step: 1.9 ms), say nothing
    assert clock_note(load_run(_drifting_clock(tmp_path, 0.0))) is None
    assert clock_note(load_run(_drifting_clock(tmp_path, 0.1))) is None
    # nor ends seen late by 0-8 ms whose medians at either end differ by 2.5 ms: under their own spread
    # (on one clock under load, 4 gloo ranks' ends were 1-4 ms apart, their medians 2.1 ms)
    jitter = [0, 6, 3, 1, 5] + [0] * 10 + [6, 2, 8, 5.5, 3]
    assert clock_note(load_run(_drifting_clock(tmp_path, 0.0, jitter))) is None


def test_a_drift_is_said_from_fifteen_collectives_two_ranks_share_and_not_from_fourteen(
    tmp_path: Path,
) -> None:
    # the first and the last 5 of them are compared where they are three times that or more (a median of
    # fewer is one slow end, and ends that overlap compare a collective with itself): 1 ms a step over 15
    # steps is 10 ms between the medians of steps 0-4 and 10-14
    from skewlens.replay.execution import clock_drifts

    (drift,) = clock_drifts(load_run(_drifting_clock(tmp_path, 1.0, steps=15)))
    assert (drift.rank, drift.against, drift.samples) == (1, 0, 15)
    assert drift.by_ns == pytest.approx(10 * MS, abs=1_000)
    assert clock_drifts(load_run(_drifting_clock(tmp_path, 1.0, steps=14))) == []


def test_ranks_that_share_a_group_without_rank_0_on_one_clock_are_said_to_drift_nowhere(
    tmp_path: Path,
) -> None:
    # ranks 1 and 2 of 3 also all_reduce on a group of their own (a pipeline stage's pair) each step: rank
    # 0's clock is the reference, and it has no end of those to compare with, so they are not compared
    # (compared, their ends against nothing read as a drift of the run's whole length)
    from skewlens.replay.execution import clock_drifts, clock_note

    b = RunBuilder(3, groups={"world": (0, 1, 2), "pair": (1, 2)})
    for k in range(20):
        t0 = k * 100 * MS
        for r in range(3):
            rb = b.rank(r).step(k)
            rb.compute("compute", (40 if r == 0 else 10) * MS, start_ns=t0)
            rb.collective(
                CommType.ALL_REDUCE,
                4096,
                (1 if r == 0 else 31) * MS,
                start_ns=t0 + (40 if r == 0 else 10) * MS,
                pg="world",
            )
            if r:
                rb.collective(CommType.ALL_REDUCE, 4096, 5 * MS, start_ns=t0 + 50 * MS, pg="pair")
    run = load_run(b.write(tmp_path / "run"))
    assert clock_drifts(run) == []
    assert clock_note(run) is None


def test_collectives_a_rank_recorded_without_an_end_are_no_drift_of_its_clock(tmp_path: Path) -> None:
    # rank 1's last 6 all_reduces of 30 were still running when its window ended (0-length nodes at their
    # issue): their ends were not seen, so they say nothing of its clock; read as ends, the arrivals 30 ms
    # before rank 0's ends read as its clock losing 30 ms
    from skewlens.replay.execution import clock_drifts

    b = RunBuilder(2)
    for k in range(30):
        t0 = k * 100 * MS
        b.rank(0).step(k).compute("compute", 40 * MS, start_ns=t0)
        b.rank(0).collective(CommType.ALL_REDUCE, 4096, MS, start_ns=t0 + 40 * MS)
        b.rank(1).step(k).compute("compute", 10 * MS, start_ns=t0)
        b.rank(1).collective(CommType.ALL_REDUCE, 4096, 0 if k >= 24 else 31 * MS, start_ns=t0 + 10 * MS)
    assert clock_drifts(load_run(b.write(tmp_path / "run"))) == []


def test_a_recv_recorded_without_an_end_is_no_clock_error_against_its_later_send(tmp_path: Path) -> None:
    from skewlens.replay.execution import clock_note

    # an irecv issued in the window's last step and waited for after it has no end (a 0-length node at its
    # issue end, as a collective still running then): its peer's isend, issued 9 ms later, says nothing of
    # the clocks. Before, check, analyze and replay said "clocks disagree ... rank 0 done 9.0 ms before rank
    # 1 began" (54.1 ms on 2 gloo ranks of a double-buffered exchange), as of a recv recorded as done
    assert clock_note(load_run(_recv_before_send(tmp_path, 0))) is None
    # a recv recorded as done 8 ms before its send began is the clocks
    note = clock_note(load_run(_recv_before_send(tmp_path, 1)))
    assert note is not None and "rank 0 done 8.0 ms before rank 1 began" in note


def test_a_collective_member_recorded_without_an_end_is_no_clock_error_against_a_later_arrival(
    tmp_path: Path,
) -> None:
    # rank 0's all_reduce, issued at 1 ms, was still running when its window ended (a 0-length node at its
    # issue end); rank 1 arrived at 11 ms. Its end was not seen, so it says nothing of the clocks; read as
    # done at its issue, it was "done 10.0 ms before rank 1 began"
    from skewlens.replay.execution import clock_note

    b = RunBuilder(2)
    b.rank(0).step(0).compute("compute", MS, start_ns=0)
    b.rank(0).collective(CommType.ALL_REDUCE, 4096, 0, start_ns=MS)
    b.rank(1).step(0).compute("compute", 11 * MS, start_ns=0)
    b.rank(1).collective(CommType.ALL_REDUCE, 4096, MS, start_ns=11 * MS)
    assert clock_note(load_run(b.write(tmp_path / "run"))) is None


def test_no_host_node_waits_for_a_recv_recorded_without_an_end(tmp_path: Path) -> None:
    # rank 0's irecv issued at 1 ms in the window's last step and waited for after it: a 0-length node at its
    # issue end, right where the thread's next host time begins. Read as a completion, that host node waited
    # for it (an inferred wait: 0 after it, on a thread idle 0 before), so the unmodified replay held it
    # until rank 1's send at 10 ms (on 2 gloo ranks of a double-buffered exchange at `collectives`, rank 0's
    # last step 24.8 ms against 16.2 recorded, 10.6% over its 6 steps)
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    first = r0.compute("compute", MS, start_ns=0)
    recv = r0.recv(1, 4096, 0, start_ns=MS, stream=1000, deps=(first,))
    after = r0.compute("compute", 2 * MS, start_ns=MS, deps=(first,))
    b.rank(1).step(0).compute("compute", 10 * MS, start_ns=0)
    b.rank(1).step(0).send(0, 4096, MS, start_ns=10 * MS, stream=1000)
    run = load_run(b.write(tmp_path / "run"))
    m = execution_model(run).ranks[0]
    rt = run.ranks[0]
    row = {int(n): k for k, n in enumerate(rt.node_id)}
    into_after = m.start_src[m.start_dst == row[after]].tolist()
    assert row[recv] not in into_after and into_after == [row[first]]
    res = simulate(run)
    assert int(res.start_ns[0][row[after]] - res.start_ns[0][row[first]]) == MS  # as recorded


def _rooted(tmp_path: Path, comm_type: CommType, root: int, early_ms: float) -> Path:
    """3 ranks of one host, one rooted collective: rank 1 arrives at 1 ms and is done at 2 ms, rank 0 (or
    2) arrives ``early_ms`` after that, the third at 10 ms; every member recorded ``root``."""
    b = RunBuilder(3)
    starts = {1: MS, 0: int((2 + early_ms) * MS), 2: 10 * MS}
    for r, start in starts.items():
        b.rank(r).step(0).collective(comm_type, 4096, MS if r == 1 else 2 * MS, start_ns=start, root=root)
    return b.write(tmp_path / f"run-{comm_type.name}-{root}-{early_ms}")


def test_a_rooted_collective_member_done_before_others_arrived_is_not_a_clock_error_where_its_root_allows(
    tmp_path: Path,
) -> None:
    from skewlens.replay.execution import clock_note

    # gloo on one host (4 ranks): a scatter's rank 0 got its piece from root 1 and left 11.9 ms before
    # rank 2 arrived; analyze, replay and check said the ranks' clocks were not aligned. The model's rule
    # (waits_for) has it wait for its root only: nothing to note; nor for a broadcast root (rank 1) done
    # before its receivers arrived
    assert clock_note(load_run(_rooted(tmp_path, CommType.BROADCAST, 1, 5.0))) is None
    # a gather member cannot be done before its root arrived (gloo sends once the root posted its recv)
    gather = clock_note(load_run(_rooted(tmp_path, CommType.GATHER, 2, 5.0)))
    assert gather is not None and "rank 1 done 8.0 ms before rank 2 began" in gather
    # rank 1 of a scatter from rank 0 cannot be done before rank 0 arrived (5 ms later): that is the clocks
    scatter = clock_note(load_run(_rooted(tmp_path, CommType.SCATTER, 0, 5.0)))
    assert scatter is not None
    assert "clocks disagree: 1 of 1" in scatter and "rank 1 done 5.0 ms before rank 0 began" in scatter
    # ... and can be before rank 2 (not the root) arrived
    assert clock_note(load_run(_rooted(tmp_path, CommType.SCATTER, 0, 0.5))) is None
    # a root recorded as done before the last member of its gather arrived is the clocks again
    gather = clock_note(load_run(_rooted(tmp_path, CommType.GATHER, 1, 0.5)))
    assert gather is not None and "clocks disagree: 1 of 1" in gather
    assert "rank 1 done 8.0 ms before rank 2 began" in gather


def _two_launchers(tmp_path: Path, name: str, *, listed: str) -> Path:
    """Host rows a (0-1 ms) and b (1-2 ms); kernel k1 depends on both (listed ``ab`` or ``ba``), launched at
    1.5 ms inside b; kernel k2, on another stream, depends on b and was launched at 1.2 ms."""
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    a = rb.compute("host_a", MS, start_ns=0)
    h = rb.compute("host_b", MS, start_ns=MS, deps=(a,))
    deps = (a, h) if listed == "ab" else (h, a)
    rb.compute("k1", MS, start_ns=3 * MS, stream=7, deps=deps, launch_ns=MS + MS // 2)
    rb.compute("k2", MS, start_ns=3 * MS, stream=8, deps=(h,), launch_ns=MS + MS // 5)
    return b.write(tmp_path / name)


def test_a_kernel_with_two_launching_host_rows_is_planned_by_the_later_launch_whatever_their_listed_order(
    tmp_path: Path,
) -> None:
    # the plan keyed a kernel by whichever launch edge came last, so the order its dependencies were
    # listed in decided it: (a, b) put k2 before k1, (b, a) k1 before k2 (keyed at a's end, 1 ms)
    orders = []
    for listed in ("ab", "ba"):
        run = load_run(_two_launchers(tmp_path, listed, listed=listed))
        orders.append([o.name for o in rank_plan(run.ranks[0], run, NO_EFFECTS)])
    assert orders == [["host_a", "host_b", "k2", "k1"]] * 2


def test_an_async_send_waited_for_late_completed_when_its_recv_did_so_faster_stages_shorten_the_step(
    tmp_path: Path,
) -> None:
    """A pipeline stage isends its activation at 10 ms and waits for it only at the end of its step (40
    ms), where gloo's send is recorded to end; the recv got the data at 12 ms. The send completed then: its
    transfer is 2 ms, not 30, so halving the stage's compute halves its step instead of leaving 30 ms of
    phantom transfer in front of its wait."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", 10 * MS, start_ns=0)
    s = r0.send(1, 4096, 30 * MS, start_ns=10 * MS, stream=COMM, deps=(f,))
    o = r0.compute("other", 28 * MS, start_ns=10 * MS, deps=(f,))
    r0.compute("c10d::wait", 2 * MS, start_ns=38 * MS, deps=(o, s))
    r1.recv(0, 4096, 12 * MS, start_ns=0)
    r1.compute("fwd", 8 * MS)
    run = load_run(b.write(tmp_path / "run"))
    rt0 = run.ranks[0]
    send_row = next(i for i in range(len(rt0)) if rt0.name(i) == "c10d::send")
    assert model_ends(run, 0)[send_row] == 12 * MS
    base, fast = simulate(run), simulate(run, effects=RankFactor(0, 0.5))
    assert base.end_ns[0].max() == 40 * MS  # the recording, unmodified
    assert fast.end_ns[0][send_row] == 7 * MS  # arrives at 5 ms, 2 ms of transfer
    assert fast.end_ns[0].max() == 5 * MS + 14 * MS + 2 * MS  # fwd, other, then the wait, not blocked


def test_an_async_recv_waited_for_after_host_work_completed_with_its_send(tmp_path: Path) -> None:
    """A stage irecvs at 0.1 ms, runs its own host work until 20 ms, then waits (0.1 ms) for the recv,
    recorded to end there; its peer's blocking send of that data was done at 12 ms. The recv completed
    then, so halving the stage's work leaves its wait blocked until 12 ms, not until a phantom 20.1."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    r0.send(1, 4096, 2 * MS, start_ns=10 * MS)
    p = r1.compute("prep", 100_000, start_ns=0)
    rv = r1.recv(0, 4096, 20 * MS, start_ns=100_000, stream=COMM, deps=(p,))
    h = r1.compute("host", 19_900_000, start_ns=100_000)
    r1.compute("c10d::wait", 100_000, deps=(h, rv))
    run = load_run(b.write(tmp_path / "run"))
    rt1 = run.ranks[1]
    recv_row = next(i for i in range(len(rt1)) if rt1.name(i) == "c10d::recv_")
    assert model_ends(run, 1)[recv_row] == 12 * MS
    assert simulate(run).end_ns[1].max() == 20 * MS + 100_000
    assert simulate(run, effects=RankFactor(1, 0.5)).end_ns[1].max() == 12 * MS + 100_000


def _row(run: RunTrace, rank: int, name: str, k: int = 0) -> int:
    """The row of rank ``rank``'s ``k``-th node named ``name``."""
    rt = run.ranks[rank]
    return [i for i in range(len(rt)) if rt.name(i) == name][k]


def test_a_blocking_send_on_the_programs_thread_keeps_its_recorded_end_after_its_recv_ended(
    tmp_path: Path,
) -> None:
    """The program waited in the send itself: its end is when the send returned, which the thread's next
    op starts after, not a wait's; only asynchronous ones (on a communication stream) end with their
    pair. Rank 0 has one of those too, so its communication stream is known."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", MS, start_ns=0)
    blocking = r0.send(1, 4096, 10 * MS, start_ns=MS, deps=(f,))  # ends at 11 ms, its recv at 3
    s = r0.send(1, 4096, 8 * MS, start_ns=12 * MS, stream=COMM, deps=(blocking,))  # waited at 20 ms
    r0.compute("c10d::wait", MS, start_ns=19 * MS, deps=(s,))
    r1.recv(0, 4096, 3 * MS, start_ns=0)
    r1.recv(0, 4096, MS, start_ns=12 * MS)
    run = load_run(b.write(tmp_path / "run"))
    ends = model_ends(run, 0)
    assert ends[_row(run, 0, "c10d::send", 0)] == 11 * MS
    assert ends[_row(run, 0, "c10d::send", 1)] == 13 * MS  # the asynchronous one ended with its recv


def test_an_async_send_recorded_to_start_after_its_recv_ended_ends_no_earlier_than_it_started(
    tmp_path: Path,
) -> None:
    # the recv's recorded end (8 ms) lies before the send's start (10 ms): clock error between the ranks;
    # the send completed with it, but no op ends before it starts: it ends at its start
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", 10 * MS, start_ns=0)
    s = r0.send(1, 4096, 10 * MS, start_ns=10 * MS, stream=COMM, deps=(f,))
    r0.compute("c10d::wait", MS, start_ns=19 * MS, deps=(s,))
    r1.recv(0, 4096, 8 * MS, start_ns=0)
    run = load_run(b.write(tmp_path / "run"))
    assert model_ends(run, 0)[_row(run, 0, "c10d::send")] == 10 * MS


def test_an_async_collective_keeps_its_recorded_end_where_another_member_ended_earlier(
    tmp_path: Path,
) -> None:
    """A collective's recorded end is its completion (the capture reads its future), not where the program
    waited, unlike gloo's sends and recvs: a member that ended later than another is left as recorded."""
    b = RunBuilder(2)
    for r, dur in ((0, 2 * MS), (1, 19 * MS)):
        rb = b.rank(r).step(0)
        f = rb.compute("prep", MS, start_ns=0)
        c = rb.collective(CommType.ALL_REDUCE, 4096, dur, start_ns=MS, stream=COMM, deps=(f,))
        rb.compute("fwd", 20 * MS, start_ns=MS)
        rb.compute("c10d::wait", MS, start_ns=21 * MS, deps=(c,))
    run = load_run(b.write(tmp_path / "run"))
    assert model_ends(run, 1)[_row(run, 1, "c10d::all_reduce_")] == 20 * MS
    assert model_ends(run, 0)[_row(run, 0, "c10d::all_reduce_")] == 3 * MS


def test_a_lagged_completion_is_not_ended_before_its_call_returned_nor_an_isend_after_its_recorded_end(
    tmp_path: Path,
) -> None:
    # the end clamp of a hidden wait (the untraced time's end, 0.12 ms before the worker's record) stops
    # where the bucket's call returned, 0.06 ms after that end (0.06 ms before the record)
    lag = 120_000
    run = load_run(_ddp_ops_level(tmp_path, 30.0, lag_ns=lag, returned_ns=60_000))
    for r in (0, 1):
        m, rt = execution_model(run).ranks[r], run.ranks[r]
        assert m.end_clamp_rows.size == 3
        assert (m.end_clamp_ns == rt.end_ns[m.end_clamp_rows] - lag + 60_000).all()
    # an isend whose call is recorded to return (35 ms) after its own recorded end (30 ms): it ends there
    run = _isend_blocking_in_its_call(tmp_path, 35 * MS)
    assert model_ends(run, 0)[_row(run, 0, "c10d::send")] == 30 * MS


def _isend_blocking_in_its_call(tmp_path: Path, returned_ns: int | None) -> RunTrace:
    """Rank 0 isends 4 MB at 10 ms; the call returns at 16 ms (gloo writes the data inside it once the
    recv is posted; ``returned_ns``: what the trace records of that, if anything), the thread runs
    ``fwd2`` from then on and waits for the send at 28-30 ms, where the send is recorded to end. Its recv
    on rank 1 ended at 12 ms."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    f = r0.compute("fwd", 10 * MS, start_ns=0)
    s = r0.send(1, 4 << 20, 20 * MS, start_ns=10 * MS, stream=COMM, deps=(f,), return_ns=returned_ns)
    g = r0.compute("fwd2", 12 * MS, start_ns=16 * MS, deps=(f,))
    r0.compute("c10d::wait", 2 * MS, start_ns=28 * MS, deps=(g, s))
    r1.recv(0, 4 << 20, 12 * MS, start_ns=0)
    r1.compute("bwd", 18 * MS)
    return load_run(b.write(tmp_path / f"run-{returned_ns}"))


def test_an_async_send_is_not_ended_before_its_blocking_call_returned_so_the_call_is_no_idle_or_host_gap(
    tmp_path: Path,
) -> None:
    """The end clamp took the send's end to its recv's (12 ms), so 12-16 ms, inside the send's call, was
    in no row: the breakdown read it as idle and the critical path as a host gap before ``fwd2``. With
    the call's return recorded (``skl_return_ns``) the send ends at 16 ms; without it, as before."""
    from skewlens.analysis.breakdown import analyze_breakdown
    from skewlens.analysis.critical_path import HOST_GAP, analyze_critical_path, shares
    from skewlens.analysis.index import build_index

    for returned, send_end, idle_ns in ((16 * MS, 16 * MS, 0), (None, 12 * MS, 4 * MS)):
        run = _isend_blocking_in_its_call(tmp_path, returned)
        assert model_ends(run, 0)[_row(run, 0, "c10d::send")] == send_end
        ix = build_index(run)
        r0 = next(x for x in analyze_breakdown(ix) if x.rank == 0)
        assert (r0.idle_ns, r0.compute_ns, r0.exposed_transfer_ns) == (idle_ns, 22 * MS, 8 * MS - idle_ns)
        path = analyze_critical_path(ix)
        assert shares(path)[1][0].get(HOST_GAP, 0) == (0 if returned else 6 * MS)
        assert [(p.name, p.contribution_ns) for p in path if p.name == "c10d::send"] == (
            [("c10d::send", 6 * MS)] if returned else []
        )
        res = simulate(run)  # an unmodified replay still replays the recording, the send's new end too
        for r, rt in run.ranks.items():
            t = res.timed[r]
            assert np.array_equal(res.start_ns[r][t], rt.start_ns[t]), r
            assert np.array_equal(res.end_ns[r][t], model_ends(run, r)[t]), r


def _recv_posted_ahead(tmp_path: Path) -> RunTrace:
    """A stage of a schedule with two stages a rank: rank 0 irecvs at 0.1 ms (posted ahead), runs its
    other stage's work until 20 ms, then waits 10 µs for the recv (not blocked), where gloo's recv is
    recorded to end; rank 1 isends at 5 ms (the call returns at 5.05) and waits for its send only at the
    end of its step (30 ms)."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p = r0.compute("prep", 100_000, start_ns=0)
    rv = r0.recv(1, 4096, 19_910_000, start_ns=100_000, stream=COMM, deps=(p,))
    o = r0.compute("other_stage", 19_900_000, start_ns=100_000, deps=(p,))
    r0.compute("c10d::wait", 10_000, start_ns=20 * MS, deps=(o, rv))
    f = r1.compute("fwd", 5 * MS, start_ns=0)
    s = r1.send(0, 4096, 25_010_000, start_ns=5 * MS, stream=COMM, deps=(f,), return_ns=5_050_000)
    m = r1.compute("more", 25 * MS, start_ns=5_050_000, deps=(f,))
    r1.compute("c10d::wait", 10_000, start_ns=30_050_000, deps=(m, s))
    return load_run(b.write(tmp_path / "run"))


def test_a_recv_posted_ahead_whose_wait_did_not_block_completed_once_its_send_was_issued(
    tmp_path: Path,
) -> None:
    """Its recorded end (20.01 ms, the wait's return) only says the data was there before the wait: the
    pair completed when the send's call returned (5.05 ms). Taken as 15 ms of transfer, rank 1 computing 5x
    slower (its send at 25 ms) kept rank 0 blocked until 40 ms instead of 25.05."""
    run = _recv_posted_ahead(tmp_path)
    recv_row, send_row = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert model_ends(run, 0)[recv_row] == model_ends(run, 1)[send_row] == 5_050_000
    assert simulate(run).end_ns[0].max() == 20_010_000  # the recording, unmodified
    slow = simulate(run, effects=RankFactor(1, 5.0))
    assert slow.end_ns[0][recv_row] == 25 * MS + 50_000
    assert slow.end_ns[0].max() == 25 * MS + 50_000 + 10_000  # blocked until then, then its 10 µs


def _recv_waited(
    tmp_path: Path,
    *,
    wait_at: int,
    wait_ns: int,
    consumer: str = "c10d::wait",
    send_wait_ns: int = 10_000,
    send_return: int | None = 5_050_000,
) -> RunTrace:
    """:func:`_recv_posted_ahead` with rank 0's ``consumer`` of the recv begun at ``wait_at`` for
    ``wait_ns`` (the recv recorded to end at its return), rank 1's wait for its send ``send_wait_ns`` long,
    and its call's return ``send_return`` (None: not recorded, as in a trace older than the field)."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p = r0.compute("prep", 100_000, start_ns=0)
    rv = r0.recv(1, 4096, wait_at + wait_ns - 100_000, start_ns=100_000, stream=COMM, deps=(p,))
    o = r0.compute("other_stage", wait_at - 100_000, start_ns=100_000, deps=(p,))
    r0.compute(consumer, wait_ns, start_ns=wait_at, deps=(o, rv))
    f = r1.compute("fwd", 5 * MS, start_ns=0)
    s = r1.send(
        0, 4096, 25 * MS + send_wait_ns, start_ns=5 * MS, stream=COMM, deps=(f,), return_ns=send_return
    )
    m = r1.compute("more", 25 * MS, start_ns=5_050_000, deps=(f,))
    r1.compute("c10d::wait", send_wait_ns, start_ns=30_050_000, deps=(m, s))
    return load_run(b.write(tmp_path / "run"))


#: (wait begun, its length, more of :func:`_recv_waited`, the recv's and the send's model ends)
_RECV_WAITS = {
    "wait-at-limit": (20 * MS, 100_000, {}, (5_050_000, 5_050_000)),  # 0.1 ms: did not block
    "wait-past-limit": (20 * MS, 100_001, {}, (20_100_001, 20_100_001)),  # blocked: as recorded
    "wait-at-issue": (5_050_000, 10_000, {}, (5_060_000, 5_050_000)),  # begun as the send returned
    "wait-before-issue": (4_990_000, 100_000, {}, (5_090_000, 5_090_000)),  # before: as recorded
    "compute-reads-it": (20 * MS, 10_000, {"consumer": "read_activation"}, (20_010_000, 20_010_000)),
    "send-blocked": (20 * MS, 10_000, {"send_wait_ns": MS}, (5_050_000, 5_050_000)),  # the recv's did not
    "no-call-returns": (
        20 * MS,
        10_000,
        {"send_return": None},
        (5_000_000, 5_000_000),
    ),  # issued at its start
}


@pytest.mark.parametrize(("wait_at", "wait_ns", "more", "ends"), _RECV_WAITS.values(), ids=_RECV_WAITS.keys())
def test_a_posted_recv_completes_at_its_sends_issue_only_where_a_wait_begun_after_both_took_at_most_0_1_ms(
    tmp_path: Path, wait_at: int, wait_ns: int, more: dict[str, Any], ends: tuple[int, int]
) -> None:
    run = _recv_waited(tmp_path, wait_at=wait_at, wait_ns=wait_ns, **more)
    recv_row, send_row = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv_row], model_ends(run, 1)[send_row]) == ends


def test_a_recv_whose_first_wait_blocked_keeps_its_end_though_a_later_wait_on_it_did_not_block(
    tmp_path: Path,
) -> None:
    """Rank 0 posts its recv ahead, waits for it at 10 ms and is blocked until 20 ms (its data came then),
    then waits on it again at 25 ms, which returns at once; rank 1's send call returned at 5.05 ms. The
    later wait says nothing of when the data came: the recv still completed at 20 ms. Before, the pair was
    taken to complete at 5.05 ms and the first wait's 10 ms of blocking became work of its own: with rank 1
    computing 5x slower (its send at 25 ms), the wait ran until 35.05 ms instead of 40."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p = r0.compute("prep", 100_000, start_ns=0)
    rv = r0.recv(1, 4096, 19_900_000, start_ns=100_000, stream=COMM, deps=(p,))
    o = r0.compute("other_stage", 9_900_000, start_ns=100_000, deps=(p,))
    w = r0.compute("c10d::wait", 10 * MS, start_ns=10 * MS, deps=(o, rv))
    o2 = r0.compute("more", 5 * MS, start_ns=20 * MS, deps=(w,))
    r0.compute("c10d::wait", 10_000, start_ns=25 * MS, deps=(o2, rv))
    f = r1.compute("fwd", 5 * MS, start_ns=0)
    s = r1.send(0, 4096, 25_010_000, start_ns=5 * MS, stream=COMM, deps=(f,), return_ns=5_050_000)
    m = r1.compute("more", 25 * MS, start_ns=5_050_000, deps=(f,))
    r1.compute("c10d::wait", 10_000, start_ns=30_050_000, deps=(m, s))
    run = load_run(b.write(tmp_path / "run"))
    recv_row, wait_row = _row(run, 0, "c10d::recv_"), _row(run, 0, "c10d::wait")
    assert model_ends(run, 0)[recv_row] == 20 * MS
    slow = simulate(run, effects=RankFactor(1, 5.0))
    assert slow.end_ns[0][recv_row] == slow.end_ns[0][wait_row] == 40 * MS  # the send at 25, then its 15 ms


def _ring_exchange(tmp_path: Path) -> RunTrace:
    """One step of a hand-rolled ring all-reduce on 2 ranks: each rank isends its chunk to the other at 2 ms
    (the call returns at 2.05), irecvs the other's at 2.1 (returns at 2.15), waits for the recv from 2.2,
    blocked until the exchange ends (rank 0 at 4.0 ms, rank 1 at 3.9), then for its send, which returns
    at once (0.01 ms). gloo reports no completion: each op is recorded to end where its first wait
    returned."""
    return _ring_waited_at(tmp_path, 2_200_000, 4 * MS)


def test_a_ring_exchange_completes_where_the_wait_that_blocked_on_it_returned_not_when_both_were_issued(
    tmp_path: Path,
) -> None:
    """Rank 1's send to rank 0 is recorded to end at 3.91 ms, the return of a wait that did not block (the
    transfer ran while rank 1 was blocked on its own recv); rank 0's wait for the matching recv, begun at
    2.2 ms after both were issued, blocked until 4.0. The pair had not completed when that wait began:
    the send completed at 3.91, the recv at 4.0 (its wait's return), not both when both were issued
    (2.15): before, rank 0's 1.8 ms of blocking was work of its own wait, which no network what-if
    shortened (on a 2-rank gloo capture of a hand-rolled ring, 32 of 64 pairs, 41.6 ms of waiting over 4
    steps; on a faster network rank 0 still ended 1.8 ms after rank 1)."""
    run = _ring_exchange(tmp_path)
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    send0, recv1 = _row(run, 0, "c10d::send"), _row(run, 1, "c10d::recv_")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (4 * MS, 3_910_000)
    assert model_ends(run, 0)[send0] == model_ends(run, 1)[recv1] == 3_900_000
    wait0 = _row(run, 0, "c10d::wait")
    assert execution_model(run).ranks[0].work_ns[wait0] == 0
    sim = simulate(run)
    for r in run.ranks:
        assert (sim.end_ns[r] == model_ends(run, r)).all()  # the recording, unmodified
    switch = Dimension(kind="switch", size=0, bandwidth_gbps=100.0, latency_ns=1_000)
    res = simulate(run, comm_mode="model", topology=Topology(name="fast", dims=(switch,)))
    # both transfers take µs: each rank's waits end by 2.2 ms, when its host issued them, then rank 0's
    # wait for its send does its 0.01 ms; before, 4.01 ms and 2.21
    assert [int(res.end_ns[r].max()) for r in (0, 1)] == [2_210_000, 2_200_000]


def test_a_recv_whose_wait_blocked_past_its_sends_completion_completes_at_its_own_end(
    tmp_path: Path,
) -> None:
    """A batch of a hand-rolled ring (``batch_isend_irecv``, then each work waited in turn): rank 1's
    send, issued at 2.0 ms, is waited for from 2.06 and completes at 2.4 (gloo's send completes once its
    data is written); rank 0 posts the recv at 2.3 and waits for it from 2.33, blocked until 4.5 (its data
    read). Its wait began before the send completed and blocked past it: the recv completed at 4.5. Before,
    the pair completed with the send at 2.4 and the recv's 2.1 ms of blocking was work of its wait (on a
    2-rank gloo capture of a batched ring, 15 waits, 71.8 ms over 4 steps), which a faster network kept."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p0 = r0.compute("prep", 2_300_000, start_ns=0)
    rv = r0.recv(1, 131_584, 2_200_000, start_ns=2_300_000, stream=COMM, deps=(p0,), return_ns=2_320_000)
    i0 = r0.compute("issue", 30_000, start_ns=2_300_000, deps=(p0,))
    r0.compute("c10d::wait", 2_170_000, start_ns=2_330_000, deps=(i0, rv))
    p1 = r1.compute("prep", 2 * MS, start_ns=0)
    s = r1.send(0, 131_584, 400_000, start_ns=2 * MS, stream=COMM, deps=(p1,), return_ns=2_050_000)
    i1 = r1.compute("issue", 60_000, start_ns=2 * MS, deps=(p1,))
    r1.compute("c10d::wait", 340_000, start_ns=2_060_000, deps=(i1, s))
    run = load_run(b.write(tmp_path / "run"))
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (4_500_000, 2_400_000)
    assert execution_model(run).ranks[0].work_ns[_row(run, 0, "c10d::wait")] == 0
    switch = Dimension(kind="switch", size=0, bandwidth_gbps=100.0, latency_ns=1_000)
    res = simulate(run, comm_mode="model", topology=Topology(name="fast", dims=(switch,)))
    assert int(res.end_ns[0].max()) < 2_400_000  # a µs transfer after 2.33 ms; before, 4.5 ms


def _ring_waited_at(tmp_path: Path, wait_at: int, recv_end: int) -> RunTrace:
    """:func:`_ring_exchange` with rank 0's wait for its recv begun at ``wait_at`` and blocked until
    ``recv_end`` (its wait for its send then 0.01 ms); rank 1 as there."""
    b = RunBuilder(2)
    for r, at, end in ((0, wait_at, recv_end), (1, 2_200_000, 3_900_000)):
        rb = b.rank(r).step(0)
        p = rb.compute("prep", 2 * MS, start_ns=0)
        s = rb.send(1 - r, 131_584, end + 10_000 - 2 * MS, start_ns=2 * MS, stream=COMM, deps=(p,),
                    return_ns=2_050_000)  # fmt: skip
        rv = rb.recv(1 - r, 131_584, end - 2_100_000, start_ns=2_100_000, stream=COMM, deps=(p,),
                     return_ns=2_150_000)  # fmt: skip
        g = rb.compute("issue", at - 2 * MS, start_ns=2 * MS, deps=(p,))
        w = rb.compute("c10d::wait", end - at, start_ns=at, deps=(g, rv))
        rb.compute("c10d::wait", 10_000, start_ns=end, deps=(w, s))
    return load_run(b.write(tmp_path / "run"))


#: (rank 0's recv wait begun, its end; the model ends of rank 0's recv and rank 1's send)
_RING_WAITS = {
    # begun as the last call returned (2.15 ms, both issued): the pair was running, as recorded
    "wait-begun-as-both-were-issued": (2_150_000, 4 * MS, (4 * MS, 3_910_000)),
    # begun at the send's end (3.91, its wait's return): the data was sent, the pair done when both issued
    "wait-begun-at-the-sends-end": (3_910_000, 4_500_000, (2_150_000, 2_150_000)),
}


@pytest.mark.parametrize(("wait_at", "recv_end", "ends"), _RING_WAITS.values(), ids=_RING_WAITS.keys())
def test_a_ring_exchanges_pair_is_running_where_a_blocked_wait_began_from_both_issued_until_before_its_end(
    tmp_path: Path, wait_at: int, recv_end: int, ends: tuple[int, int]
) -> None:
    run = _ring_waited_at(tmp_path, wait_at, recv_end)
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == ends


def _send_waited_early(tmp_path: Path, *, recv_wait: tuple[int, int]) -> RunTrace:
    """Rank 1 isends at 1 ms (returns 1.05) and waits for it from 1.1, blocked until 5 ms; rank 0 irecvs at
    3 ms (returns 3.05) and waits for it at ``recv_wait`` (start, length), the recv recorded to end with
    that wait."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    at, ns = recv_wait
    p0 = r0.compute("prep", 3 * MS, start_ns=0)
    rv = r0.recv(1, 4096, at + ns - 3 * MS, start_ns=3 * MS, stream=COMM, deps=(p0,), return_ns=3_050_000)
    o = r0.compute("other_stage", at - 3 * MS, start_ns=3 * MS, deps=(p0,))
    r0.compute("c10d::wait", ns, start_ns=at, deps=(o, rv))
    p1 = r1.compute("prep", MS, start_ns=0)
    s = r1.send(0, 4096, 4 * MS, start_ns=MS, stream=COMM, deps=(p1,), return_ns=1_050_000)
    i1 = r1.compute("issue", 100_000, start_ns=MS, deps=(p1,))
    r1.compute("c10d::wait", 3_900_000, start_ns=1_100_000, deps=(i1, s))
    return load_run(b.write(tmp_path / "run"))


def test_a_send_waited_for_before_its_recv_was_posted_keeps_its_end_and_the_recv_completes_when_both_issued(
    tmp_path: Path,
) -> None:
    """Rank 1's wait for its send began at 1.1 ms, before rank 0 posted the recv (3 ms, returned 3.05), and
    blocked until 5 ms; rank 0's wait for the recv, at 4.9, did not block. That wait says the data was there:
    the recv completed once both were issued (3.05); the send's wait, begun before both were issued, says
    nothing of the pair still running after that, and the send completed at its own end (5 ms)."""
    run = _send_waited_early(tmp_path, recv_wait=(4_900_000, 10_000))
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (3_050_000, 5 * MS)


def test_a_recv_whose_unblocked_wait_ends_with_its_blocked_send_completes_when_both_issued_as_if_earlier(
    tmp_path: Path,
) -> None:
    """As above, with rank 0's 10 µs wait for the recv at 4.99 ms, so that the recv ends at 5 ms, with its
    send (whole µs in a Chakra trace make such ties common): the recv still completed when both were issued
    (3.05 ms), as at 4.98. Before, the tie went to the sender (the pair's first member), whose wait blocked,
    and the recv kept 1.95 ms of phantom transfer (5 ms), where 10 ns earlier it read 3.05."""
    for at in (4_980_000, 4_990_000):
        run = _send_waited_early(tmp_path / str(at), recv_wait=(at, 10_000))
        recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
        assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (3_050_000, 5 * MS), at


def test_a_pair_member_without_a_wait_says_nothing_of_the_pair_running_whatever_its_ranks_last_row_did(
    tmp_path: Path,
) -> None:
    """Rank 1's send is never waited for; its rank's last row, host work on another thread from 3.5 to
    4.5 ms (0.1 ms past the 'did not block' limit), is no wait on the pair: the recv posted ahead, whose
    wait at 4.9 did not block, completed when both were issued (3.05), and so did the send."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p0 = r0.compute("prep", 3 * MS, start_ns=0)
    rv = r0.recv(1, 4096, 1_910_000, start_ns=3 * MS, stream=COMM, deps=(p0,), return_ns=3_050_000)
    o = r0.compute("other_stage", 1_900_000, start_ns=3 * MS, deps=(p0,))
    r0.compute("c10d::wait", 10_000, start_ns=4_900_000, deps=(o, rv))
    p1 = r1.compute("prep", MS, start_ns=0)
    r1.send(0, 4096, 5 * MS, start_ns=MS, stream=COMM, deps=(p1,), return_ns=1_050_000)
    r1.compute("side", MS, start_ns=3_500_000, stream=5)
    run = load_run(b.write(tmp_path / "run"))
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert run.ranks[1].name(len(run.ranks[1]) - 1) == "side"
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (3_050_000, 3_050_000)


def _send_blocked_first(
    tmp_path: Path, *, recv_wait: tuple[int, int] | None, recv_end: int, side: bool = False
) -> RunTrace:
    """Rank 1 isends at 1 ms and waits for it from 1.1, blocked until 3 ms (the send's end); rank 0 irecvs
    at 1 ms (returns 1.05), recorded to end at ``recv_end``, and waits for it at ``recv_wait`` (start,
    length; None: never). ``side``: rank 0's last row, host work on another thread from 2 to 3 ms."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p0 = r0.compute("prep", MS, start_ns=0)
    rv = r0.recv(1, 4096, recv_end - MS, start_ns=MS, stream=COMM, deps=(p0,), return_ns=1_050_000)
    if recv_wait is not None:
        at, ns = recv_wait
        o = r0.compute("other", at - MS, start_ns=MS, deps=(p0,))
        r0.compute("c10d::wait", ns, start_ns=at, deps=(o, rv))
    if side:
        r0.compute("side", MS, start_ns=2 * MS, stream=5)
    p1 = r1.compute("prep", MS, start_ns=0)
    s = r1.send(0, 4096, 2 * MS, start_ns=MS, stream=COMM, deps=(p1,), return_ns=1_050_000)
    i1 = r1.compute("issue", 100_000, start_ns=MS, deps=(p1,))
    r1.compute("c10d::wait", 1_900_000, start_ns=1_100_000, deps=(i1, s))
    return load_run(b.write(tmp_path / "run"))


#: (rank 0's wait for its recv, the recv's recorded end, rank 0's side work; the recv's model end)
_RECV_AFTER_SEND = {
    # begun at the send's completion (3 ms) and blocked: not begun before it, so the recv completed with it
    "wait-begun-at-the-sends-end": ((3 * MS, MS), 4 * MS, False, 3 * MS),
    # begun before it, 0.1 ms long: it did not block, so the recv completed with the send
    "wait-of-0.1-ms": ((2_950_000, 100_000), 3_050_000, False, 3 * MS),
    # begun before it, blocked past it: the recv completed at its own end
    "wait-blocked-past-it": ((2_950_000, 100_001), 3_050_001, False, 3_050_001),
    # never waited for: the rank's last row (host work before and past 3 ms) is not a wait on it
    "no-wait": (None, 4 * MS, True, 3 * MS),
    # never waited for, recorded to end SKEW_NS (20 µs) after the send: within the clocks' error, as recorded
    "no-wait-ending-20-us-after-it": (None, 3_020_000, False, 3_020_000),
    # 1 ns more: past the clocks' error, it completed with the send
    "no-wait-ending-20.001-us-after-it": (None, 3_020_001, False, 3 * MS),
}


@pytest.mark.parametrize(
    ("recv_wait", "recv_end", "side", "end"), _RECV_AFTER_SEND.values(), ids=_RECV_AFTER_SEND.keys()
)
def test_a_recv_keeps_its_end_only_where_its_first_wait_began_before_its_sends_completion_and_blocked_past_it(
    tmp_path: Path, recv_wait: tuple[int, int] | None, recv_end: int, side: bool, end: int
) -> None:
    run = _send_blocked_first(tmp_path, recv_wait=recv_wait, recv_end=recv_end, side=side)
    assert model_ends(run, 0)[_row(run, 0, "c10d::recv_")] == end
    assert model_ends(run, 1)[_row(run, 1, "c10d::send")] == 3 * MS


def test_a_recvs_first_wait_is_the_one_that_began_first_not_the_one_recorded_first(tmp_path: Path) -> None:
    """Rank 0 waits on its recv from another thread at 25 ms (returning at once), a node recorded before its
    main thread's wait at 10 ms, which blocked until 20 ms: the first wait is the one begun at 10 ms, so the
    recv completed at 20 ms, not when its send's call returned (5.05 ms)."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p = r0.compute("prep", 100_000, start_ns=0)
    rv = r0.recv(1, 4096, 19_900_000, start_ns=100_000, stream=COMM, deps=(p,))
    r0.compute("c10d::wait", 10_000, start_ns=25 * MS, stream=5, deps=(rv,))
    o = r0.compute("other_stage", 9_900_000, start_ns=100_000, deps=(p,))
    r0.compute("c10d::wait", 10 * MS, start_ns=10 * MS, deps=(o, rv))
    f = r1.compute("fwd", 5 * MS, start_ns=0)
    s = r1.send(0, 4096, 25_010_000, start_ns=5 * MS, stream=COMM, deps=(f,), return_ns=5_050_000)
    m = r1.compute("more", 25 * MS, start_ns=5_050_000, deps=(f,))
    r1.compute("c10d::wait", 10_000, start_ns=30_050_000, deps=(m, s))
    run = load_run(b.write(tmp_path / "run"))
    waits = [i for i in range(len(run.ranks[0])) if run.ranks[0].name(i) == "c10d::wait"]
    assert [int(run.ranks[0].start_ns[i]) for i in waits] == [25 * MS, 10 * MS]  # recorded in this order
    assert model_ends(run, 0)[_row(run, 0, "c10d::recv_")] == 20 * MS


def test_a_send_recorded_to_complete_before_its_blocked_wait_began_completed_then_not_when_both_were_issued(
    tmp_path: Path,
) -> None:
    """Rank 1's send (issued at 1 ms) is recorded to end at 3 ms, before its first wait began (4 ms, blocked 1
    ms on something else): that end is a completion, not a wait's return, and the pair completed then; rank
    0's recv, posted at 1 ms and waited for at 5.9 ms without blocking, completed with it. Taking the send's
    end for the 'data was there before the wait' rule moved both to when both were issued (1.05 ms)."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p0 = r0.compute("prep", MS, start_ns=0)
    rv = r0.recv(1, 4096, 5 * MS, start_ns=MS, stream=COMM, deps=(p0,), return_ns=1_050_000)
    o = r0.compute("other", 4_900_000, start_ns=MS, deps=(p0,))
    r0.compute("c10d::wait", 100_000, start_ns=5_900_000, deps=(o, rv))
    p1 = r1.compute("prep", MS, start_ns=0)
    s = r1.send(0, 4096, 2 * MS, start_ns=MS, stream=COMM, deps=(p1,), return_ns=1_050_000)
    i1 = r1.compute("issue", 3 * MS, start_ns=MS, deps=(p1,))
    r1.compute("c10d::wait", MS, start_ns=4 * MS, deps=(i1, s))
    run = load_run(b.write(tmp_path / "run"))
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (3 * MS, 3 * MS)


def test_a_recv_whose_unblocked_wait_ended_first_keeps_its_end_where_its_sends_wait_blocked_after_both_issued(
    tmp_path: Path,
) -> None:
    """Rank 1 isends at 2 ms (returns 2.05) and waits for it from 2.2, blocked until 4 ms; rank 0 irecvs at
    2.1 (returns 2.15) and waits for it at 3 ms for 10 µs, where the recv is recorded to end. The send's wait
    began after both were issued and blocked: the pair was running then, so the recv completed at 3.01 ms
    and the send, whose wait began before that and blocked past it, at its own end (4 ms); not both at
    2.15 ms, when both were issued (as for the sender's end coming first, the ring exchange above)."""
    b = RunBuilder(2)
    r0, r1 = b.rank(0).step(0), b.rank(1).step(0)
    p0 = r0.compute("prep", 2_100_000, start_ns=0)
    rv = r0.recv(1, 4096, 910_000, start_ns=2_100_000, stream=COMM, deps=(p0,), return_ns=2_150_000)
    o = r0.compute("other", 900_000, start_ns=2_100_000, deps=(p0,))
    r0.compute("c10d::wait", 10_000, start_ns=3 * MS, deps=(o, rv))
    p1 = r1.compute("prep", 2 * MS, start_ns=0)
    s = r1.send(0, 4096, 2 * MS, start_ns=2 * MS, stream=COMM, deps=(p1,), return_ns=2_050_000)
    i1 = r1.compute("issue", 200_000, start_ns=2 * MS, deps=(p1,))
    r1.compute("c10d::wait", 1_800_000, start_ns=2_200_000, deps=(i1, s))
    run = load_run(b.write(tmp_path / "run"))
    recv0, send1 = _row(run, 0, "c10d::recv_"), _row(run, 1, "c10d::send")
    assert (model_ends(run, 0)[recv0], model_ends(run, 1)[send1]) == (3_010_000, 4 * MS)


class _Effects:
    """An ``Effects`` of the test's own: ``factor(name, on_gpu)`` per compute op, ``delay(step, name)`` before
    each node and ``stall(step)`` before each step (any step the replayer asks about, -1 included)."""

    def __init__(self, factor: Any = None, delay: Any = None, stall: Any = None) -> None:
        self.factor, self.delay, self.stall = factor, delay, stall

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return 1.0 if self.factor is None else float(self.factor(name, on_gpu))

    def delay_before_ns(self, rank: int, step: int, node_type: Any, name: str) -> int:
        return 0 if self.delay is None else int(self.delay(step, name))

    def stall_ns(self, rank: int, step: int) -> int:
        return 0 if self.stall is None else int(self.stall(step))


def _host_and_kernel_run(tmp_path: Path) -> RunTrace:
    """Rank 0: an untimed-step ``setup`` op, then step 0's ``aten::add`` (0.1 ms) and ``aten::mm`` (0.5 ms),
    which launches a 0.1 ms ``gemm_kernel`` on stream 7; step 1's ``aten::add`` (0.1 ms) and, starting with
    it on another thread, ``aten::mul`` (0.1 ms)."""
    b = RunBuilder(1)
    rb = b.rank(0)
    rb.compute("setup", 100_000, start_ns=0)
    rb.step(0)
    rb.compute("aten::add", 100_000, start_ns=MS)
    mm = rb.compute("aten::mm", 500_000, start_ns=2 * MS)
    rb.compute("gemm_kernel", 100_000, start_ns=3 * MS, stream=7, deps=(mm,), launch_ns=2 * MS + 100_000)
    rb.step(1)
    rb.compute("aten::add", 100_000, start_ns=5 * MS)
    rb.compute("aten::mul", 100_000, start_ns=5 * MS, stream=1)
    return load_run(b.write(tmp_path / "run"))


def _by_name(rt: Any, values: Any) -> list[tuple[str, int]]:
    """Each row's name and value, the trace's metadata rows (``## process_group:init ##``) left out."""
    return [(rt.name(i), int(v)) for i, v in enumerate(values) if not rt.name(i).startswith("##")]


def test_scaled_work_scales_a_gpu_only_factor_on_the_kernel_alone_and_rounds_to_the_nearest_ns(
    tmp_path: Path,
) -> None:
    from skewlens.replay.execution import scaled_work

    run = _host_and_kernel_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    gpu_only = _Effects(factor=lambda name, on_gpu: 2.0 if on_gpu else 1.0)
    assert dict(_by_name(rt, scaled_work(gpu_only, rt, m, m.work_ns)))["gemm_kernel"] == 200_000
    assert dict(_by_name(rt, scaled_work(gpu_only, rt, m, m.work_ns)))["aten::mm"] == 500_000
    # 100 us x 2/3 is 66,666.67 ns: 66,667, not cut to 66,666
    third = scaled_work(_Effects(factor=lambda name, on_gpu: 2 / 3), rt, m, m.work_ns)
    assert dict(_by_name(rt, third))["aten::mul"] == 66_667


def test_scaled_work_names_the_bad_factor_and_the_op_whose_scaled_work_leaves_the_clock(
    tmp_path: Path,
) -> None:
    from skewlens.replay.errors import ConfigError
    from skewlens.replay.execution import scaled_work

    run = _host_and_kernel_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    with pytest.raises(ConfigError) as e:
        scaled_work(
            _Effects(factor=lambda name, on_gpu: -1.0 if name == "aten::mm" else 3.0), rt, m, m.work_ns
        )
    assert str(e.value) == "rank 0: compute factor must be a finite number >= 0, got -1.0"
    # x1e13: 0.1 ms is 1e18 ns, on the clock (4.61e18); aten::mm's 0.5 ms is 5e18 ns, past it
    with pytest.raises(ConfigError) as e:
        scaled_work(_Effects(factor=lambda name, on_gpu: 1e13), rt, m, m.work_ns)
    assert str(e.value).startswith("slowdown: rank 0's aten::mm x1e+13 lasts 5e+09 s, beyond the simulator's")


def test_effect_delays_asks_each_nodes_own_step_and_adds_a_steps_stall_to_its_earliest_lowest_rows_delay(
    tmp_path: Path,
) -> None:
    from skewlens.replay.execution import effect_delays

    run = _host_and_kernel_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    effects = _Effects(
        delay=lambda step, name: MS if (step, name) == (1, "aten::add") else 0, stall=lambda s: 2 * MS
    )
    # no stall for setup (no step); step 1's aten::add and aten::mul start together: the lower row's
    assert _by_name(rt, effect_delays(effects, rt, m)) == [
        ("setup", 0),
        ("aten::add", 2 * MS),
        ("aten::mm", 0),
        ("gemm_kernel", 0),
        ("aten::add", 3 * MS),
        ("aten::mul", 0),
    ]
    # a row the model leaves out (the trace's metadata row) waits for nothing, whatever its name asks
    everywhere = effect_delays(_Effects(delay=lambda step, name: 7), rt, m)
    assert (~m.valid).any() and everywhere[~m.valid].tolist() == [0] * int((~m.valid).sum())


def test_effect_delays_refuses_a_delay_or_a_delay_and_stall_together_beyond_the_clock_naming_what(
    tmp_path: Path,
) -> None:
    from skewlens.replay.errors import ConfigError
    from skewlens.replay.execution import effect_delays

    run = _host_and_kernel_run(tmp_path)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    big = 5 * 10**18  # past the clock's 4.61e18 ns
    with pytest.raises(ConfigError) as e:
        effect_delays(_Effects(delay=lambda step, name: big if name == "aten::mm" else 0), rt, m)
    assert str(e.value).startswith(
        "slowdown: rank 0's delay before a node is 5e+09 s, beyond the simulator's"
    )
    half = 3 * 10**18  # each on the clock, together past it
    with pytest.raises(ConfigError) as e:
        effect_delays(_Effects(delay=lambda step, name: half, stall=lambda s: half), rt, m)
    assert str(e.value).startswith("slowdown: rank 0's stall at step 0 is 3e+09 s, beyond the simulator's")


def test_the_execution_models_arrays_are_read_only_so_an_analysis_cannot_change_what_the_others_read(
    tmp_path: Path,
) -> None:
    # the model is cached per run and its arrays are shared: the analyses' index holds its gap_ns, work_ns
    # and host_work themselves, so a write into one (an analysis zeroing a gap) changed the index's, the
    # simulator's and every later analysis's answer, unsaid; and the lowering wrote 0s into gap_ns itself
    from skewlens.analysis.index import build_index

    b = RunBuilder(2)
    for r in (0, 1):
        rank = b.rank(r).step(0)
        rank.compute("fwd", (2 + r) * MS, start_ns=MS)
        rank.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=MS)
        rank.compute("opt", MS)
    run = load_run(b.write(tmp_path / "run"))
    em = execution_model(run)
    for r, m in em.ranks.items():
        for name in m.__slots__:
            value = getattr(m, name)
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable, f"rank {r}: {name} is writable"
    ix = build_index(run)
    assert ix.ranks[0].gap_ns is em.ranks[0].gap_ns  # shared, not copied
    # and the index's own, which every analysis of the run reads
    for r, ri in ix.ranks.items():
        for name in ri.__slots__:
            value = getattr(ri, name)
            if isinstance(value, np.ndarray):
                assert not value.flags.writeable, f"rank {r}: index {name} is writable"
    with pytest.raises(ValueError, match="read-only"):
        ix.ranks[0].gap_ns[1] = 0
    gaps = {r: m.gap_ns.tolist() for r, m in em.ranks.items()}
    before = simulate(run).makespan_ns
    assert simulate(run).makespan_ns == before
    assert {r: m.gap_ns.tolist() for r, m in em.ranks.items()} == gaps


def test_a_collective_after_an_instance_neither_member_held_at_reads_its_own_step_not_the_trace(
    tmp_path: Path,
) -> None:
    # one all_reduce a step whose early rank (0) waits for it under its backward (gloo's worker waits, its
    # thread runs on: never held there), rank 1 sleeping 30 ms before it each step: no event synchronised
    # the two, so each step's instance starts both windows at the step's start, not at the rank's first
    # recorded step (that of a group's first instance), which would hold every earlier step's sleep too
    b = RunBuilder(2)
    for s in range(3):
        t = s * 100 * MS
        for r in (0, 1):
            rb = b.rank(r).step(s)
            prev = rb.compute("aten::mm", 10 * MS, start_ns=t)
            at = t + 10 * MS
            if r == 1:
                prev = rb.compute("untraced", 30 * MS, start_ns=at, deps=(prev,))
                at += 30 * MS
            a = rb.collective(
                CommType.ALL_REDUCE, 1 << 20, t + 45 * MS - at, start_ns=at, stream=COMM, deps=(prev,)
            )
            g = rb.compute("aten::mm", t + 60 * MS - at, start_ns=at, deps=(prev,))
            rb.compute("Optimizer.step", 2 * MS, start_ns=t + 60 * MS, deps=(g, a))
    out = analyze_run(load_run(b.write(tmp_path / "run")), blame=False)
    assert [e.step for e in out.skew.events] == [0, 1, 2]
    for e in out.skew.events:
        assert e.late_rank == 1
        assert e.cause.kind is CauseKind.HOST_GAP
        assert e.cause.delta_ns == pytest.approx(30 * MS, abs=0.1 * MS)


@pytest.mark.parametrize(("hidden_ms", "held"), [(12, True), (15, True), (16, False)])
def test_a_rank_held_at_a_collective_where_half_its_wait_or_more_was_exposed(
    tmp_path: Path, hidden_ms: int, held: bool
) -> None:
    # rank 0 waits 30 ms for rank 1 (asleep before its issue), ``hidden_ms`` of it under compute: its
    # thread held at the collective (a synchronisation point of the two) where 15 ms or more was exposed
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        prev = rb.compute("aten::mm", 10 * MS, start_ns=0)
        at = 10 * MS
        if r == 1:
            prev = rb.compute("untraced", 30 * MS, start_ns=at, deps=(prev,))
            at += 30 * MS
        a = rb.collective(CommType.ALL_REDUCE, 1 << 20, 45 * MS - at, start_ns=at, stream=COMM, deps=(prev,))
        end = at + hidden_ms * MS if r == 0 else 45 * MS
        prev = rb.compute("aten::mm", end - at, start_ns=at, deps=(prev,))
        if r == 0:
            prev = rb.compute("untraced", 45 * MS - end, start_ns=end, deps=(prev,))
        rb.compute("Optimizer.step", 2 * MS, start_ns=45 * MS, deps=(prev, a))
    (e,) = analyze_run(load_run(b.write(tmp_path / "run")), blame=False).skew.events
    assert (e.wait_ns.tolist(), e.exposed_wait_ns.tolist()) == ([30 * MS, 0], [(30 - hidden_ms) * MS, 0])
    assert (_held(e, 0), _held(e, 1)) == (held, True)
