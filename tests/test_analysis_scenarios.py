"""Synthetic runs shaped like the bundled example (used by the analysis tests), and checks of their shape.

Each step on every rank: forward compute, a tensor-parallel all_gather on the rank's pair group, more
compute, a pipeline send (even rank) / recv (odd rank), compute, a data-parallel all_reduce on the world
group. Times are produced by a tiny lockstep model so waits are consistent: a collective completes at
the last arrival plus its transfer time, a recv at max(send start, recv start) plus its transfer.
A straggler does extra ``aten::mm`` before its first collective; a slow sender idles before each send.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

MS = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Scenario:
    world_size: int = 4
    steps: int = 6
    straggler_rank: int = -1
    straggler_ns: int = 0
    straggler_ranks: tuple[int, ...] = ()
    """More ranks doing ``straggler_ns`` of extra compute (a slow host's)."""
    slow_send_rank: int = -1
    slow_send_ns: int = 0
    fwd_ns: int = 10 * MS
    jitter_ns: int = 200_000
    transfer_ns: int = 1 * MS
    step_gap_ns: int = 100_000


def build_run(tmp: Path, sc: Scenario) -> Path:
    """Write the scenario as a run directory and return it."""
    w = sc.world_size
    pairs = {r: f"tp{r // 2}" for r in range(w)}
    groups: dict[str, tuple[int, ...]] = {"0": tuple(range(w))}
    for r in range(w):
        groups.setdefault(pairs[r], tuple(x for x in range(w) if x // 2 == r // 2))
    b = RunBuilder(w, groups)
    t = [0] * w
    for step in range(sc.steps):
        for r in range(w):
            rb = b.rank(r).step(step)
            t[r] += sc.step_gap_ns
            jit = (r * 7 + step * 3) % 5 * sc.jitter_ns // 4
            rb.compute("aten::linear", sc.fwd_ns + jit, start_ns=t[r])
            t[r] += sc.fwd_ns + jit
            if r == sc.straggler_rank or r in sc.straggler_ranks:
                rb.compute("aten::mm", sc.straggler_ns, start_ns=t[r])
                t[r] += sc.straggler_ns
        _collective(b, t, {r: pairs[r] for r in range(w)}, CommType.ALL_GATHER, sc.transfer_ns)
        for r in range(w):
            b.rank(r).compute("aten::addmm", 5 * MS, start_ns=t[r])
            t[r] += 5 * MS
        for src in range(0, w - 1, 2):
            dst = src + 1
            gap = sc.slow_send_ns if src == sc.slow_send_rank else 0
            s_start = t[src] + gap
            r_start = t[dst]
            r_end = max(s_start, r_start) + sc.transfer_ns
            b.rank(src).send(dst, 1 << 20, dur_ns=sc.transfer_ns, start_ns=s_start)
            b.rank(dst).recv(src, 1 << 20, dur_ns=r_end - r_start, start_ns=r_start)
            t[src] = s_start + sc.transfer_ns
            t[dst] = r_end
        for r in range(w):
            b.rank(r).compute("aten::relu", 3 * MS, start_ns=t[r])
            t[r] += 3 * MS
        _collective(b, t, dict.fromkeys(range(w), "0"), CommType.ALL_REDUCE, sc.transfer_ns)
    return b.write(tmp / "run", level="ops")


def build_one_slow_rank(tmp: Path, world_size: int = 2, steps: int = 3) -> Path:
    """Each step: every rank computes (the others ``aten::add`` 1 ms and ``aten::mm`` 5 ms, the last rank
    ``aten::mm`` 46 ms), then an all_reduce that ends at 47 ms: the others wait 40 ms a step for the last,
    and the last rank costs 40 ms a step. The others' ``aten::add`` has no counterpart on the last rank."""
    b = RunBuilder(world_size=world_size)
    slow = world_size - 1
    for r in range(world_size):
        rb = b.rank(r)
        for s in range(steps):
            rb.step(s)
            if r == slow:
                rb.compute("aten::mm", 46 * MS, start_ns=s * 47 * MS)
            else:
                rb.compute("aten::add", 1 * MS, start_ns=s * 47 * MS)
                rb.compute("aten::mm", 5 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS if r == slow else 41 * MS)
    return b.write(tmp / "run")


def build_eager_send(tmp: Path) -> Path:
    """2 ranks, one step: rank 0's 1 ms send completes 4 ms before rank 1, after 5 ms of compute, arrives at
    its recv (eager), then 6 ms of compute on rank 0."""
    b = RunBuilder(world_size=2)
    r0 = b.rank(0).step(0)
    r0.send(1, comm_bytes=1 << 20, dur_ns=MS, start_ns=0)
    r0.compute("aten::mm", dur_ns=6 * MS)
    r1 = b.rank(1).step(0)
    r1.compute("aten::mm", dur_ns=5 * MS, start_ns=0)
    r1.recv(0, comm_bytes=1 << 20, dur_ns=200_000)
    return b.write(tmp / "run")


def _collective(b: RunBuilder, t: list[int], group_of: dict[int, str], ct: CommType, transfer: int) -> None:
    by_group: dict[str, list[int]] = {}
    for r, g in group_of.items():
        by_group.setdefault(g, []).append(r)
    for g, members in by_group.items():
        end = max(t[m] for m in members) + transfer
        for m in members:
            b.rank(m).collective(ct, 1 << 20, dur_ns=end - t[m], start_ns=t[m], pg=g)
            t[m] = end


def test_scenario_loads_with_every_collective_matched(tmp_path: Path) -> None:
    sc = Scenario(steps=3)
    run = load_run(build_run(tmp_path, sc))
    assert len(run.ranks) == sc.world_size
    world = [c for c in run.collectives if c.pg_name == "0"]
    assert len(world) == sc.steps
    assert all(len(c.ranks) == sc.world_size for c in world)
    assert len(run.p2p) == sc.steps * (sc.world_size // 2)


def test_scenario_straggler_delays_its_pair_at_the_all_gather(tmp_path: Path) -> None:
    sc = Scenario(steps=2, straggler_rank=2, straggler_ns=40 * MS)
    run = load_run(build_run(tmp_path, sc))
    ag = next(c for c in run.collectives if c.pg_name == "tp1")
    arrivals = {r: int(run.ranks[r].start_ns[row]) for r, row in zip(ag.ranks, ag.rows, strict=True)}
    assert arrivals[2] - arrivals[3] > 35 * MS
