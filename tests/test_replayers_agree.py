"""The two replayers follow one execution model: over small generated 2-rank runs (seeded) and random
effects (compute factors per rank and name, delays before a node type or name, stalls per step), a real
replay's CPU worker (its ``Runner``, in-process on a virtual clock: ``replay_workloads.worker_times``)
starts and ends every op where the simulator does, to the nanosecond.

The worker's communication completes where the simulator's does (the peers' and the network's part, which a
worker does not decide); everything else (when each op is issued or starts, how long host work runs, what a
delay, a stall or a wait holds) is the plan's and the worker's own.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from replay_workloads import worker_times

from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.execution import execution_model
from skewlens.replay.real.plan import rank_plan
from skewlens.replay.simulate import simulate

US = 1_000
SEEDS = range(8)
COMM = 1000  # the communication stream (asynchronous ops, issued from the host thread)


def _generated_run(seed: int, path: Path) -> RunTrace:
    """2 ranks, 1 to 3 steps of host ops (some with a nested op), blocking all_reduces and send/recvs, and
    asynchronous all_reduces and isend/irecvs, some issued inside a host op, each waited for by a
    ``c10d::wait`` later; the ranks' times differ, their communication ends together."""
    rnd = random.Random(seed)
    b = RunBuilder(world_size=2)
    rbs = [b.rank(0), b.rank(1)]
    t = [rnd.randint(0, 200) * US for _ in rbs]
    last: list[int | None] = [None, None]  # each rank's last top-level row of its host thread

    def host(name: str, r: int, dur: int) -> int:
        nid = rbs[r].compute(name, dur, start_ns=t[r])
        last[r] = nid
        return nid

    for s in range(rnd.randint(1, 3)):
        for rb in rbs:
            rb.step(s)
        pending: list[tuple[list[int], int]] = []  # async ops: (their ids by rank, their end)
        for j in range(rnd.randint(2, 6)):
            what = rnd.choice(["op", "nested", "coll", "p2p", "async_inside", "async_p2p", "wait"])
            if what == "wait" and not pending:
                what = "op"
            if what in ("async_inside", "async_p2p") and last[0] is None:
                what = "op"
            if what in ("op", "nested"):
                for r in (0, 1):
                    dur = rnd.randint(100, 900) * US
                    host(f"op{j % 3}", r, dur)
                    if what == "nested":
                        rbs[r].compute("inner", dur // 3, start_ns=t[r] + dur // 4)
                    t[r] += dur + rnd.randint(0, 80) * US
            elif what in ("coll", "p2p"):
                dur = rnd.randint(50, 400) * US
                end = max(t) + dur
                for r in (0, 1):
                    if what == "coll":
                        last[r] = rbs[r].collective(CommType.ALL_REDUCE, 1 << 16, end - t[r], start_ns=t[r])
                    elif r == 0:
                        last[r] = rbs[r].send(1, 1 << 12, end - t[r], start_ns=t[r])
                    else:
                        last[r] = rbs[r].recv(0, 1 << 12, end - t[r], start_ns=t[r])
                    t[r] = end + rnd.randint(0, 50) * US
            elif what == "async_inside":
                # an all_reduce issued `off` into op `fsdp`, its start edge from the op before
                offs = [rnd.randint(10, 300) * US for _ in (0, 1)]
                end = max(t[r] + offs[r] for r in (0, 1)) + rnd.randint(50, 800) * US
                ids = []
                for r in (0, 1):
                    before = last[r]
                    assert before is not None
                    dur = rnd.randint(400, 1200) * US
                    start = t[r] + offs[r]
                    host("fsdp", r, dur)
                    ids.append(
                        rbs[r].collective(
                            CommType.ALL_REDUCE,
                            1 << 16,
                            end - start,
                            start_ns=start,
                            stream=COMM,
                            deps=(before,),
                        )
                    )
                    t[r] += dur + rnd.randint(0, 50) * US
                pending.append((ids, end))
            elif what == "async_p2p":
                end = max(t) + rnd.randint(50, 600) * US
                ids = []
                for r in (0, 1):
                    before = last[r]
                    assert before is not None
                    if r == 0:
                        ids.append(
                            rbs[r].send(1, 1 << 12, end - t[r], start_ns=t[r], stream=COMM, deps=(before,))
                        )
                    else:
                        ids.append(
                            rbs[r].recv(0, 1 << 12, end - t[r], start_ns=t[r], stream=COMM, deps=(before,))
                        )
                    t[r] += rnd.randint(5, 30) * US
                pending.append((ids, end))
            else:
                ids, end = pending.pop(0)
                for r in (0, 1):
                    before = last[r]
                    deps = (ids[r],) if before is None else (before, ids[r])
                    s0 = t[r]
                    e = max(s0, end) + rnd.randint(5, 40) * US
                    last[r] = rbs[r].compute("c10d::wait", e - s0, start_ns=s0, deps=deps)
                    t[r] = e + rnd.randint(0, 50) * US
        for ids, end in pending:  # waited for at the end of the step
            for r in (0, 1):
                s0 = t[r]
                e = max(s0, end) + 10 * US
                before = last[r]
                deps = (ids[r],) if before is None else (before, ids[r])
                last[r] = rbs[r].compute("c10d::wait", e - s0, start_ns=s0, deps=deps)
                t[r] = e
        for r in (0, 1):
            t[r] += rnd.randint(0, 300) * US
    return load_run(b.write(path))


@dataclass(frozen=True)
class _Effects:
    """Random effects: compute factors by (rank, name), delays before (rank, node type) or (rank, name),
    stalls by (rank, step)."""

    factors: dict[tuple[int, str], float] = field(default_factory=dict)
    type_delays: dict[tuple[int, int], int] = field(default_factory=dict)
    name_delays: dict[tuple[int, str], int] = field(default_factory=dict)
    stalls: dict[tuple[int, int], int] = field(default_factory=dict)

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return self.factors.get((rank, name), 1.0)

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        return self.type_delays.get((rank, int(node_type)), 0) + self.name_delays.get((rank, name), 0)

    def stall_ns(self, rank: int, step: int) -> int:
        return self.stalls.get((rank, step), 0)


NAMES = ("op0", "op1", "op2", "fsdp", "inner", "c10d::wait", "c10d::send", "c10d::recv_", "c10d::all_reduce_")
TYPES = (NodeType.COMP, NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV)


def _effects(seed: int) -> _Effects:
    rnd = random.Random(seed * 7919 + 1)
    pick = lambda pool: rnd.sample(pool, rnd.randint(0, 2))  # noqa: E731
    return _Effects(
        factors={(rnd.randint(0, 1), n): rnd.choice([0.5, 1.5, 2.0, 3.0]) for n in pick(NAMES)},
        type_delays={(rnd.randint(0, 1), int(t)): rnd.randint(1, 800) * US for t in pick(TYPES)},
        name_delays={(rnd.randint(0, 1), n): rnd.randint(1, 800) * US for n in pick(NAMES)},
        stalls={(rnd.randint(0, 1), k): rnd.randint(1, 800) * US for k in pick([0, 1, 2])},
    )


def disagreements(
    run: RunTrace, effects: _Effects, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[tuple[int, str, int], tuple[tuple[int, int], tuple[int, int]]]:
    """(rank, name, row) -> ((worker start, end), (simulated start, end)) of each op they disagree on."""
    sim = simulate(run, effects=effects)
    out = {}
    for r, rt in sorted(run.ranks.items()):
        ops = rank_plan(rt, run, effects)
        comm = {o.row for o in ops if o.kind in ("coll", "send", "recv")}
        ends = {row: int(sim.end_ns[r][row]) for row in comm}
        # the plan re-issues communication its next op (a wait node) waits for as a blocking call: the
        # worker's thread blocks in the call, and the wait node starts at the completion, where the
        # simulator starts it at its arrival and blocks it there; both end it at the same time
        blocked = {
            nxt.row: ends[op.row]
            for op, nxt in itertools.pairwise(ops)
            if op.blocking and op.row in nxt.wait_deps
        }
        origin = execution_model(run).ranks[r].t0_ns  # the rank's first recorded start, as the replay's
        start, end = worker_times(ops, tmp_path, monkeypatch, origin_ns=origin, comm_ends=ends)
        for o in ops:
            got = (start[o.row], end[o.row])
            want = (int(sim.start_ns[r][o.row]), int(sim.end_ns[r][o.row]))
            if o.row in blocked:
                want = (max(want[0], blocked[o.row]), want[1])
            if got != want:
                out[(r, o.name, o.row)] = (got, want)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_a_real_replay_worker_starts_and_ends_every_op_where_the_simulator_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    run = _generated_run(seed, tmp_path / "run")
    assert disagreements(run, _Effects(), tmp_path, monkeypatch) == {}


@pytest.mark.parametrize("seed", SEEDS)
def test_under_random_slowdowns_a_real_replay_worker_starts_and_ends_every_op_where_the_simulator_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    run = _generated_run(seed, tmp_path / "run")
    assert disagreements(run, _effects(seed), tmp_path, monkeypatch) == {}


@pytest.mark.parametrize("factor", [0.5, 3.0])
def test_a_compute_factor_on_a_nested_op_scales_it_on_the_worker_as_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factor: float
) -> None:
    # `inner` (300 us, 100 us into the 900 us `outer`) `factor` times as long: the worker wrote it 300 us
    # long whatever the factor (the plan took a nested op's recorded duration), the simulator 150 or 900 us
    b = RunBuilder(world_size=1)
    rb = b.rank(0).step(0)
    rb.compute("outer", 900 * US, start_ns=0)
    rb.compute("inner", 300 * US, start_ns=100 * US)
    rb.compute("after", 100 * US, start_ns=1000 * US)
    run = load_run(b.write(tmp_path / "run"))
    effects = _Effects(factors={(0, "inner"): factor})
    assert disagreements(run, effects, tmp_path, monkeypatch) == {}
    ops = rank_plan(run.ranks[0], run, effects)
    _start, end = worker_times(ops, tmp_path, monkeypatch)
    assert end[ops[1].row] == round((100 + 300 * factor) * US)


def test_an_all_reduce_issued_inside_a_host_op_that_follows_a_blocking_recv_is_issued_during_that_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the all_reduce, recorded 150 us into `fsdp` (1.2 ms), follows the recv its thread finished last (as
    # the capture names it): the plan took only host work for a start edge an issue inside the op may have,
    # and the worker issued it after `fsdp` ended, at 1.69 ms, simulated at 0.64 ms (seed 41 of the
    # generated runs, unmodified)
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        p2p = (
            rb.send(1, 1 << 12, 400 * US, start_ns=0) if r == 0 else rb.recv(0, 1 << 12, 400 * US, start_ns=0)
        )
        rb.compute("fsdp", 1200 * US, start_ns=490 * US)
        ar = rb.collective(
            CommType.ALL_REDUCE, 1 << 16, 800 * US, start_ns=640 * US, stream=COMM, deps=(p2p,)
        )
        rb.compute("c10d::wait", 10 * US, start_ns=1700 * US, deps=(ar,))
    run = load_run(b.write(tmp_path / "run"))
    assert disagreements(run, _Effects(), tmp_path, monkeypatch) == {}
    ops = rank_plan(run.ranks[0], run, _Effects())
    sim = simulate(run)
    ends = {o.row: int(sim.end_ns[0][o.row]) for o in ops if o.kind != "compute"}
    start, _end = worker_times(ops, tmp_path, monkeypatch, comm_ends=ends)
    assert ops[1].issues_inside == (ops[2].row,)
    assert start[ops[2].row] == 640 * US


def _inside_run(path: Path) -> RunTrace:
    """An all_gather issued 4 ms into the 20 ms `fsdp` (its start edge from `a`, the row before)."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("a", 1000 * US, start_ns=0)
        op = rb.compute("fsdp", 20_000 * US, start_ns=1000 * US, deps=(a,))
        ag = rb.collective(CommType.ALL_GATHER, 4096, 10_000 * US, start_ns=5000 * US, stream=COMM, deps=(a,))
        rb.compute("c10d::wait", 1000 * US, start_ns=21_000 * US, deps=(op, ag))
    return load_run(b.write(path))


def test_a_delay_before_a_host_op_longer_than_the_issue_inside_it_holds_the_issue_in_both_replayers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 6 ms before `fsdp` on rank 0: the simulator issued the all_gather at 5 ms (a's end + its gap), 2 ms
    # before `fsdp` started (7 ms), the worker, one thread, at 7 ms, as `fsdp` began; the thread held
    # before `fsdp` holds what it issues inside it: 4 ms into it, at 11 ms, in both
    effects = _Effects(name_delays={(0, "fsdp"): 6000 * US})
    run = _inside_run(tmp_path / "run")
    assert disagreements(run, effects, tmp_path, monkeypatch) == {}
    sim = simulate(run, effects=effects)
    assert (int(sim.start_ns[0][2]), int(sim.start_ns[0][3])) == (7000 * US, 11_000 * US)


def test_a_delay_before_an_all_reduce_holds_the_isend_its_thread_issues_next_in_both_replayers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an all_reduce at 1.05 ms and an isend at 1.1 ms, both after `op0`, 3 ms before each collective on
    # rank 0: the simulator issued the isend at 1.1 ms, before the all_reduce (4.05 ms), the worker after it
    # at 4.05 ms; the all_reduce's issue now holds the thread's next issue (the isend: 4.1 ms) and through
    # it `op1` (4.2 ms), in both
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("op0", 1000 * US, start_ns=0)
        ar = rb.collective(CommType.ALL_REDUCE, 4096, 2000 * US, start_ns=1050 * US, stream=COMM, deps=(a,))
        at = 1100 * US
        p = rb.send(1, 4096, 1000 * US, start_ns=at, stream=COMM + 1, deps=(a,)) if r == 0 else None
        p = p or rb.recv(0, 4096, 1000 * US, start_ns=at, stream=COMM + 1, deps=(a,))
        o1 = rb.compute("op1", 1000 * US, start_ns=1200 * US, deps=(a,))
        rb.compute("c10d::wait", 10 * US, start_ns=3100 * US, deps=(o1, ar, p))
    run = load_run(b.write(tmp_path / "run"))
    effects = _Effects(type_delays={(0, int(NodeType.COMM_COLL)): 3000 * US})
    assert disagreements(run, effects, tmp_path, monkeypatch) == {}
    sim = simulate(run, effects=effects)
    names = run.ranks[0].names
    start = {names[int(i)]: int(s) for i, s in zip(run.ranks[0].name_idx, sim.start_ns[0], strict=True)}
    got = (start["c10d::all_reduce_"], start["c10d::send"], start["op1"])
    assert got == (4050 * US, 4100 * US, 4200 * US)
