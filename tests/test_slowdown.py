"""Slowdowns: compute factors, op patterns, step windows, jitter, stalls, comm delays, network."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from replay_workloads import worker_times

from skewlens.profiler.chakra_io import AttrValue
from skewlens.profiler.importers.run import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.vocab import Attr, CommType, NodeType
from skewlens.replay.effects import NO_EFFECTS, Effects, NetworkEffects
from skewlens.replay.errors import ConfigError
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.real.plan import KIND_NESTED, rank_plan
from skewlens.replay.simulate import Simulator, simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel, jitter_factor

MS = 1_000_000
STEPS = 4
WORLD = 4
COMPUTE_MS = 10
TRANSFER = 100_000


def compute_bound_run(tmp_path: Path) -> RunTrace:
    """Every rank: per step `fwd` (6 ms) + `bwd` (4 ms) then an all_reduce with a 100 us transfer."""
    b = RunBuilder(world_size=WORLD)
    for r in range(WORLD):
        rb = b.rank(r)
        t = 0
        for s in range(STEPS):
            rb.step(s)
            rb.compute("aten::fwd", dur_ns=6 * MS, start_ns=t)
            rb.compute("aten::bwd", dur_ns=4 * MS)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=TRANSFER)
            t += COMPUTE_MS * MS + TRANSFER
    return load_run(b.write(tmp_path / "run"))


def step_times(rt: RunTrace, effects: Effects = NO_EFFECTS) -> list[int]:
    res = simulate(rt, effects=effects)
    return [res.step_time_ns(s) for s in range(STEPS)]


def test_the_identity_effects_replay_the_recorded_step_times(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    assert step_times(rt) == [COMPUTE_MS * MS + TRANSFER] * STEPS


@pytest.mark.parametrize("factor", [1.25, 1.5, 2.0])
def test_a_compute_slowdown_on_one_rank_raises_the_step_time_by_the_extra_compute(
    tmp_path: Path, factor: float
) -> None:
    rt = compute_bound_run(tmp_path)
    base = step_times(rt)
    slow = step_times(rt, SlowdownModel([Slowdown(kind="compute", ranks=(2,), factor=factor)]))
    extra = round(COMPUTE_MS * MS * (factor - 1))
    assert [s - b for s, b in zip(slow, base, strict=True)] == [extra] * STEPS


def test_an_op_pattern_slows_only_matching_nodes_glob_and_regex(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    base = step_times(rt)
    glob = step_times(rt, SlowdownModel([Slowdown(kind="op", pattern="aten::f*", factor=2.0, ranks=(1,))]))
    regex = step_times(rt, SlowdownModel([Slowdown(kind="op", pattern="re:bwd$", factor=2.0, ranks=(1,))]))
    assert [g - b for g, b in zip(glob, base, strict=True)] == [6 * MS] * STEPS
    assert [x - b for x, b in zip(regex, base, strict=True)] == [4 * MS] * STEPS


def test_a_step_window_limits_a_slowdown_to_those_steps(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    base = step_times(rt)
    win = Slowdown(kind="compute", ranks=(0,), factor=1.5, first_step=1, last_step=2)
    slow = step_times(rt, SlowdownModel([win]))
    assert [s - b for s, b in zip(slow, base, strict=True)] == [0, 5 * MS, 5 * MS, 0]


def test_jitter_is_seeded_per_rank_and_step(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    a = step_times(rt, SlowdownModel([Slowdown(kind="jitter", sigma=0.2, seed=7)]))
    b = step_times(rt, SlowdownModel([Slowdown(kind="jitter", sigma=0.2, seed=7)]))
    c = step_times(rt, SlowdownModel([Slowdown(kind="jitter", sigma=0.2, seed=8)]))
    assert a == b
    assert a != c
    factors = {jitter_factor(7, 0.2, r, s) for r in range(WORLD) for s in range(STEPS)}
    assert len(factors) == WORLD * STEPS
    # a step lasts as long as its slowest rank's jittered compute
    for s in range(STEPS):
        slowest = max(jitter_factor(7, 0.2, r, s) for r in range(WORLD))
        assert a[s] >= round(COMPUTE_MS * MS * slowest)


def test_a_stall_delays_its_step_once(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    base = step_times(rt)
    slow = step_times(rt, SlowdownModel([Slowdown(kind="stall", ranks=(3,), step=2, delay_ns=7 * MS)]))
    assert [s - b for s, b in zip(slow, base, strict=True)] == [0, 0, 7 * MS, 0]


def test_a_stall_at_every_step_delays_each_step_of_its_window(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    base = step_times(rt)
    item = Slowdown(kind="stall", ranks=(3,), every_step=True, first_step=1, delay_ns=7 * MS)
    slow = step_times(rt, SlowdownModel([item]))
    assert [s - b for s, b in zip(slow, base, strict=True)] == [0, 7 * MS, 7 * MS, 7 * MS]
    assert item.describe() == "a 7 ms stall at every step on rank 3 (steps 1..)"


def test_an_extra_delay_before_a_ranks_collectives_delays_every_member(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    base = simulate(rt)
    res = simulate(rt, effects=SlowdownModel([Slowdown(kind="comm_delay", ranks=(1,), delay_ns=2 * MS)]))
    colls = [int(e) for e in res.coll_end_ns]
    base_colls = [int(e) for e in base.coll_end_ns]
    assert [c - b for c, b in zip(colls, base_colls, strict=True)] == [2 * MS * (k + 1) for k in range(STEPS)]


def test_a_slow_send_delays_the_matching_recv(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    b.rank(0).compute("work", dur_ns=MS, start_ns=0)
    b.rank(0).send(1, comm_bytes=1024, dur_ns=50_000)
    b.rank(1).recv(0, comm_bytes=1024, dur_ns=MS + 50_000, start_ns=0)
    rt = load_run(b.write(tmp_path / "run"))
    model = SlowdownModel([Slowdown(kind="comm_delay", before="send", ranks=(0,), delay_ns=3 * MS)])
    assert model.delay_before_ns(0, -1, NodeType.COMM_SEND, "c10d::send") == 3 * MS
    assert model.delay_before_ns(0, -1, NodeType.COMM_COLL, "c10d::allreduce_") == 0
    base, res = simulate(rt), simulate(rt, effects=model)
    assert res.end_ns[1][1] - base.end_ns[1][1] == 3 * MS


def test_a_slow_isend_delays_the_thread_that_issues_it_as_the_sleep_before_it_does(tmp_path: Path) -> None:
    """A pipeline stage sleeps, then isends each activation and goes on with its next forward: the delay
    holds the thread, so two slow sends of 3 ms each put 6 ms on the stage's last forward, not 3."""
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    f = r0.compute("fwd0", dur_ns=MS, start_ns=0)
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=MS, stream=1000, deps=(f,))
    f = r0.compute("fwd1", dur_ns=MS, start_ns=MS + 10_000)
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=2 * MS + 10_000, stream=1000, deps=(f,))
    r0.compute("fwd2", dur_ns=MS, start_ns=2 * MS + 20_000)
    for k in range(2):
        r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=(k + 1) * MS + k * 10_000)
    rt = load_run(b.write(tmp_path / "run"))
    model = SlowdownModel([Slowdown(kind="comm_delay", before="send", ranks=(0,), delay_ns=3 * MS)])
    base, res = simulate(rt), simulate(rt, effects=model)
    assert base.end_ns[0].max() == 3 * MS + 20_000
    assert res.end_ns[0].max() - base.end_ns[0].max() == 6 * MS
    assert res.end_ns[1].max() - base.end_ns[1].max() == 6 * MS  # the second recv waits for both sleeps


def test_a_network_slowdown_scales_bandwidth_and_adds_latency_on_the_affected_link(tmp_path: Path) -> None:
    rt = compute_bound_run(tmp_path)
    topo = Topology(name="sw", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=50.0, latency_ns=500),))
    slow = SlowdownModel([Slowdown(kind="network", links=((0, 3),), factor=0.5, latency_ns=1_000)])
    base = simulate(rt, topology=topo, comm_mode="model")
    res = simulate(rt, topology=topo, comm_mode="model", effects=slow)
    s, p = 1 << 20, WORLD
    expected = round(2 * (p - 1) * (1_500 + s / (p * 25.0)))
    assert int(res.coll_end_ns[0] - res.coll_arrival_ns[0]) == expected
    assert int(base.coll_end_ns[0] - base.coll_arrival_ns[0]) == round(2 * (p - 1) * (500 + s / (p * 50.0)))
    # as recorded: the recorded transfer is divided by the factor, plus the latency
    rec = simulate(rt, effects=slow)
    assert int(rec.coll_end_ns[0] - rec.coll_arrival_ns[0]) == 2 * TRANSFER + 1_000


def test_network_slowdowns_only_touch_groups_on_their_links_or_nodes() -> None:
    m = SlowdownModel(
        [
            Slowdown(kind="network", links=((0, 1),), factor=0.5),
            Slowdown(kind="network", nodes=(3,), latency_ns=7),
        ],
        node_of=lambda r: r // 2,
    )
    assert isinstance(m, NetworkEffects)
    assert m.comm_adjust((0, 1), 0) == (0.5, 0)
    assert m.comm_adjust((0, 2), 0) == (1.0, 0)
    assert m.comm_adjust((2, 6), 0) == (1.0, 7)


def test_slowdown_factors_multiply_and_delays_add() -> None:
    m = SlowdownModel(
        [
            Slowdown(kind="compute", factor=1.5),
            Slowdown(kind="op", pattern="aten::mm", factor=2.0),
            Slowdown(kind="comm_delay", before="comm", delay_ns=MS),
            Slowdown(kind="comm_delay", before="collective", delay_ns=MS // 2),
        ]
    )
    assert isinstance(m, Effects)
    assert m.compute_factor(0, 0, "aten::mm") == 3.0
    assert m.compute_factor(0, 0, "aten::add") == 1.5
    assert m.delay_before_ns(0, 0, NodeType.COMM_COLL, "x") == 1_500_000
    assert m.delay_before_ns(0, 0, NodeType.COMM_RECV, "x") == 1_000_000


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"kind": "slow"}, "kind"),
        ({"kind": "compute", "factor": 0.0}, "factor"),
        ({"kind": "op"}, "pattern"),
        ({"kind": "op", "pattern": "re:(("}, "regex"),
        ({"kind": "stall", "delay_ns": -1}, "delay_ns"),
        ({"kind": "comm_delay", "before": "everything"}, "before"),
        ({"kind": "compute", "first_step": 3, "last_step": 1}, "first_step"),
        ({"kind": "compute", "device": "cuda"}, "device must be one of any, host, gpu"),
        ({"kind": "stall", "device": "gpu"}, r"device \(gpu\) says which compute ops"),
        ({"kind": "compute", "every_step": True}, "every_step is a stall's"),
        ({"kind": "stall", "step": 2, "every_step": True}, "step 2 and every_step"),
        ({"kind": "stall", "step": 0, "first_step": 1}, r"step 0 is outside first_step..last_step \(1..\)"),
        # fields a kind does not read were ignored: a pattern slowed every op, a step every step
        (
            {"kind": "compute", "pattern": "aten::mm"},
            "pattern belongs to op items; a compute item reads none",
        ),
        ({"kind": "jitter", "sigma": 0.1, "pattern": "aten::mm"}, "a jitter item reads none"),
        (
            {"kind": "compute", "factor": 2.0, "step": 1},
            r"step belongs to stall items; .*\(first_step / last_step limit",
        ),
        (
            {"kind": "stall", "step": 1, "factor": 2.0},
            "factor belongs to compute, op, host_idle and network items",
        ),
        ({"kind": "network", "sigma": 0.5}, "sigma belongs to jitter items; a network item reads none"),
        ({"kind": "jitter", "sigma": 0.1, "links": ((0, 1),)}, "links belongs to network items"),
        ({"kind": "network", "links": ((0,),)}, r"links must be pairs of ranks, got \(\(0,\),\)"),
    ],
)
def test_invalid_slowdown_items_are_config_errors_naming_the_field(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Slowdown(**kwargs)


def test_a_network_slowdown_acts_on_the_steps_of_its_window_both_ends_included() -> None:
    # first_step..last_step = 3..4, inclusive: steps 3 and 4 slowed, 2 and 5 not
    m = SlowdownModel([Slowdown(kind="network", factor=0.5, latency_ns=100, first_step=3, last_step=4)])
    assert [m.comm_adjust((0, 1), s) for s in (2, 3, 4, 5)] == [(1.0, 0), (0.5, 100), (0.5, 100), (1.0, 0)]


def test_a_network_slowdown_on_ranks_touches_only_the_groups_with_one_of_them() -> None:
    m = SlowdownModel([Slowdown(kind="network", ranks=(1,), factor=0.5)])
    assert m.comm_adjust((0, 1), 0) == (0.5, 0)
    assert m.comm_adjust((0, 2), 0) == (1.0, 0)


def test_a_network_slowdown_with_ranks_and_nodes_touches_a_group_that_either_names() -> None:
    m = SlowdownModel(
        [Slowdown(kind="network", ranks=(0,), nodes=(3,), latency_ns=5)], node_of=lambda r: r // 2
    )
    assert m.comm_adjust((0, 1), 0) == (1.0, 5)  # has rank 0 (on node 0)
    assert m.comm_adjust((6, 7), 0) == (1.0, 5)  # on node 3
    assert m.comm_adjust((2, 3), 0) == (1.0, 0)  # neither


def test_the_latencies_of_two_network_slowdowns_add_and_their_bandwidth_factors_multiply() -> None:
    m = SlowdownModel(
        [
            Slowdown(kind="network", factor=0.5, latency_ns=100),
            Slowdown(kind="network", factor=0.5, latency_ns=200),
        ]
    )
    assert m.comm_adjust((0, 1), 0) == (0.25, 300)


def test_two_stalls_at_one_step_add_and_one_at_every_step_adds_to_each() -> None:
    m = SlowdownModel(
        [
            Slowdown(kind="stall", step=2, delay_ns=MS),
            Slowdown(kind="stall", step=2, delay_ns=2 * MS),
            Slowdown(kind="stall", every_step=True, delay_ns=5),
        ]
    )
    assert [m.stall_ns(0, s) for s in (1, 2, 3)] == [5, 3 * MS + 5, 5]


def test_the_identity_effects_scale_nothing_and_add_no_wait() -> None:
    assert NO_EFFECTS.compute_factor(0, 0, "aten::mm", on_gpu=True) == 1.0
    assert NO_EFFECTS.delay_before_ns(0, 0, NodeType.COMM_COLL, "allreduce") == 0
    assert NO_EFFECTS.stall_ns(0, 0) == 0


def test_a_config_items_delay_in_ms_becomes_integer_nanoseconds_once_and_still_reads_in_ms() -> None:
    # the core's record carried delay_ms: float, converted with round(delay_ms * 1e6) at every call
    from skewlens.replay.config import SlowdownItemConfig

    stall = SlowdownItemConfig(kind="stall", ranks=[1], delay_ms=40.0).to_slowdown()
    assert (stall.delay_ns, type(stall.delay_ns)) == (40 * MS, int)
    assert stall.describe() == "a 40 ms stall at the first step on rank 1"
    send = SlowdownItemConfig(kind="comm_delay", before="send", delay_ms=0.0025).to_slowdown()
    assert send.delay_ns == 2_500
    assert send.describe() == "+0.0025 ms before every send op"
    assert SlowdownModel([send]).delay_before_ns(0, 0, NodeType.COMM_SEND, "c10d::send") == 2_500
    # rounded, not cut: 1.005 ms is 1004999.9999999999 ns in floating point
    assert SlowdownItemConfig(kind="stall", delay_ms=1.005).to_slowdown().delay_ns == 1_005_000


@pytest.mark.parametrize(
    ("delay_ms", "problem"),
    [
        (float("nan"), "must be a finite number >= 0, got nan"),
        (float("inf"), "must be a finite number >= 0, got inf"),
        (-1.0, "must be a finite number >= 0, got -1.0"),
        (
            1e308,
            (
                "must be at most 4.61e+12 ms, got 1e+308: beyond it, times leave the simulator's clock "
                "(about 146 years)"
            ),
        ),
    ],
)
def test_a_config_items_delay_out_of_range_is_refused_as_delay_ms_before_it_is_converted(
    delay_ms: float, problem: str
) -> None:
    from skewlens.replay.config import SlowdownConfig, SlowdownItemConfig

    with pytest.raises(ConfigError) as e:
        SlowdownConfig(name="x", entries=[SlowdownItemConfig(kind="stall", delay_ms=delay_ms)])
    assert str(e.value) == f"slowdown.entries[0].delay_ms: {problem} (kind=stall)"


def test_a_config_items_field_its_kind_does_not_read_is_refused_naming_its_key_not_ignored() -> None:
    # {kind: compute, pattern: aten::mm} slowed every op; {kind: compute, delay_ms: 3} delayed nothing
    from skewlens.replay.config import SlowdownConfig, SlowdownItemConfig

    with pytest.raises(ConfigError) as e:
        SlowdownConfig(name="x", entries=[SlowdownItemConfig(kind="compute", pattern="aten::mm", factor=2.0)])
    assert str(e.value) == (
        "slowdown.entries[0].pattern: belongs to op items; a compute item reads none (kind op scales only "
        "the ops it matches) (kind=compute)"
    )
    with pytest.raises(ConfigError) as e:
        SlowdownConfig(name="x", entries=[SlowdownItemConfig(kind="compute", delay_ms=3.0)])
    assert str(e.value) == (
        "slowdown.entries[0].delay_ms: belongs to stall and comm_delay items; a compute item reads none "
        "(kind=compute)"
    )


def test_a_slowdowns_number_may_be_its_limit_on_the_simulators_clock_and_not_a_bit_more() -> None:
    from skewlens.replay.errors import MAX_SIM_NS
    from skewlens.replay.slowdown import number_problem

    assert number_problem(float(MAX_SIM_NS), positive=True, name="factor") is None
    assert number_problem(MAX_SIM_NS / 1e6, positive=False, name="delay_ms") is None
    over = number_problem(MAX_SIM_NS * 1.5, positive=True, name="factor")
    assert over is not None and over.startswith("must be at most 4.61e+18, got 6.91753e+18: beyond it")
    for name in ("sigma", "latency_ns", "delay_ns"):
        assert number_problem(MAX_SIM_NS * 1.5, positive=False, name=name) is not None, name
    assert number_problem(MAX_SIM_NS * 1.5, positive=False, name="another") is None  # no limit of its own


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (
            Slowdown(kind="compute", ranks=(5,), factor=2.0),
            "effects.items[0].ranks: rank 5 is not in the run",
        ),
        (
            Slowdown(kind="op", pattern="aten::fwdd", factor=2.0),
            "effects.items[0].pattern: 'aten::fwdd' matches",
        ),
        (
            Slowdown(kind="stall", ranks=(1,), step=9, delay_ns=MS),
            "effects.items[0].step: step 9 is not in the run",
        ),
        (Slowdown(kind="stall", ranks=(1,), delay_ns=MS), "effects.items[0].step: a stall needs the step"),
    ],
)
def test_a_slowdown_built_in_python_that_names_nothing_in_the_run_is_refused_not_ignored(
    tmp_path: Path, item: Slowdown, says: str
) -> None:
    # simulate() replayed these as if no slowdown were given, where `skewlens replay` refuses them
    rt = compute_bound_run(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(says)):
        simulate(rt, effects=SlowdownModel([item]))
    with pytest.raises(ConfigError, match=re.escape(says)):
        Simulator(rt, effects=SlowdownModel([item]))


#: Each field a kind of item may read (besides ranks, the step window and device), with the kinds that do,
#: and a value away from its default. Written out here, not taken from KIND_FIELDS, so that a field left
#: out of it (then ignored on every kind, as before KIND_FIELDS) fails.
_FIELD_OWNERS: dict[str, tuple[tuple[str, ...], object]] = {
    "factor": (("compute", "op", "host_idle", "network"), 2.0),
    "pattern": (("op",), "aten::fwd"),
    "sigma": (("jitter",), 0.1),
    "seed": (("jitter",), 3),
    "step": (("stall",), 1),
    "delay_ns": (("stall", "comm_delay"), 5),
    "before": (("comm_delay",), "send"),
    "latency_ns": (("network",), 5),
    "links": (("network",), ((0, 1),)),
    "nodes": (("network",), (0,)),
}
_BASE_ITEM: dict[str, dict[str, object]] = {
    "compute": {"factor": 2.0},
    "op": {"factor": 2.0, "pattern": "aten::fwd"},
    "jitter": {"sigma": 0.1},
    "stall": {"step": 1, "delay_ns": 5},
    "comm_delay": {"delay_ns": 5},
    "host_idle": {"factor": 0.0},
    "network": {"factor": 0.5},
}


@pytest.mark.parametrize("kind", sorted(_BASE_ITEM))
def test_every_field_is_taken_by_the_kinds_that_read_it_and_refused_naming_them_on_the_others(
    kind: str,
) -> None:
    # a seed on a compute item, a before on a stall, nodes on an op item or latency on a jitter item were
    # ignored, silently, as every field was before each kind named the ones it reads
    for name, (owners, value) in _FIELD_OWNERS.items():
        item = {**_BASE_ITEM[kind], name: value}
        if kind in owners:
            assert getattr(Slowdown(kind=kind, **item), name) == value  # type: ignore[arg-type]
            continue
        said = " and ".join(filter(None, (", ".join(owners[:-1]), owners[-1])))
        with pytest.raises(
            ConfigError, match=re.escape(f"{name} belongs to {said} items; a {kind} item reads none")
        ):
            Slowdown(kind=kind, **item)  # type: ignore[arg-type]


def test_a_network_slowdown_built_in_python_is_checked_against_nodes_one_rank_each_without_a_placement(
    tmp_path: Path,
) -> None:
    # a SlowdownModel without node_of places each rank on a node of its own (as its comm_adjust does), so
    # node 3 of 4 ranks is in the run and node 4 is not
    rt = compute_bound_run(tmp_path)
    slow = SlowdownModel([Slowdown(kind="network", nodes=(WORLD - 1,), factor=0.5)])
    assert simulate(rt, effects=slow).makespan_ns > 0
    with pytest.raises(ConfigError) as e:
        simulate(rt, effects=SlowdownModel([Slowdown(kind="network", nodes=(WORLD,), factor=0.5)]))
    assert str(e.value) == (
        f"effects.items[0].nodes: node {WORLD} holds none of the run's {WORLD} ranks (nodes 0-{WORLD - 1})"
    )


def test_a_stall_built_in_python_before_the_runs_first_step_zero_stalls_it(tmp_path: Path) -> None:
    # step 0 is one of the run's steps (a stall there was checked against steps 1.. only, it would be refused)
    rt = compute_bound_run(tmp_path)
    slow = SlowdownModel([Slowdown(kind="stall", ranks=(1,), step=0, delay_ns=3 * MS)])
    assert step_times(rt, slow)[0] - step_times(rt)[0] == 3 * MS


def _issuer_run(tmp_path: Path, sends_at: tuple[int, ...], next_at: int) -> RunTrace:
    """Rank 0 computes ``fwd0`` (1 ms), isends to rank 1 at each of ``sends_at`` (after ``fwd0``), then
    computes ``fwd1`` (1 ms) from ``next_at``; rank 1 receives each."""
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    f = r0.compute("fwd0", dur_ns=MS, start_ns=0)
    for t in sends_at:
        r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=t, stream=1000, deps=(f,))
        r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=t)
    r0.compute("fwd1", dur_ns=MS, start_ns=next_at)
    return load_run(b.write(tmp_path / "run"))


def _slow_send_ns(rt: RunTrace, delay_ns: int) -> int:
    """How much later rank 0's thread ends with ``delay_ns`` before each of its sends."""
    model = SlowdownModel([Slowdown(kind="comm_delay", before="send", ranks=(0,), delay_ns=delay_ns)])
    return int(simulate(rt, effects=model).end_ns[0].max() - simulate(rt).end_ns[0].max())


def _slow_send_moves(rt: RunTrace, name: str, delay_ns: int) -> tuple[int, int]:
    """How much later rank 0's op ``name`` starts, and its thread ends, with ``delay_ns`` before each of
    its sends."""
    model = SlowdownModel([Slowdown(kind="comm_delay", before="send", ranks=(0,), delay_ns=delay_ns)])
    base, res = simulate(rt), simulate(rt, effects=model)
    row = [rt.ranks[0].name(i) for i in range(len(rt.ranks[0]))].index(name)
    return (
        int(res.start_ns[0][row] - base.start_ns[0][row]),
        int(res.end_ns[0].max() - base.end_ns[0].max()),
    )


def test_two_slow_isends_issued_before_the_threads_next_op_hold_it_for_both_sleeps(tmp_path: Path) -> None:
    # the thread sleeps 3 ms, isends, sleeps 3 ms, isends, then computes: 6 ms later, not 3
    rt = _issuer_run(tmp_path, (MS, MS + 10_000), MS + 20_000)
    assert _slow_send_ns(rt, 3 * MS) == 6 * MS


def test_a_slow_isend_holds_the_threads_op_that_starts_at_the_same_nanosecond(tmp_path: Path) -> None:
    # the op starting as the isend does came after it on the thread (the isend returned at once)
    rt = _issuer_run(tmp_path, (MS,), MS)
    assert _slow_send_ns(rt, 3 * MS) == 3 * MS


def test_a_slow_isend_issued_inside_an_enclosing_op_holds_the_threads_next_outermost_op(
    tmp_path: Path,
) -> None:
    # the isend is issued at 1 ms inside `outer` (0.6-3 ms), whose child `inner` starts after it: a nested
    # op keeps its offset into its enclosing one (a delay on it is dropped), so the delay goes to the first
    # outermost op from the isend on (`fwd1`), and the thread ends 3 ms later
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    f = r0.compute("fwd0", dur_ns=MS // 2, start_ns=0)
    r0.compute("outer", dur_ns=2_400_000, start_ns=600_000)
    r0.compute("inner", dur_ns=MS, start_ns=3 * MS // 2)
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=MS, stream=1000, deps=(f,))
    r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=MS)
    r0.compute("fwd1", dur_ns=MS, start_ns=3 * MS + 10_000)
    assert _slow_send_ns(load_run(b.write(tmp_path / "run")), 3 * MS) == 3 * MS


def _outer_run(
    path: Path,
    *,
    outer: tuple[int, int] = (600_000, 2_400_000),
    send_at: int = MS,
    on: tuple[str, ...] = ("outer",),
) -> RunTrace:
    """Rank 0 computes ``fwd0`` (0-0.5 ms) and ``outer`` (from ``outer[0]``, for ``outer[1]``), isends to
    rank 1 at ``send_at`` with the ops named ``on`` as its dependencies, then computes ``fwd1`` from
    3.01 ms; rank 1 receives."""
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    ids = {"fwd0": r0.compute("fwd0", dur_ns=MS // 2, start_ns=0)}
    ids["outer"] = r0.compute("outer", dur_ns=outer[1], start_ns=outer[0])
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=send_at, stream=1000, deps=tuple(ids[n] for n in on))
    r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=send_at)
    r0.compute("fwd1", dur_ns=MS, start_ns=3 * MS + 10_000)
    return load_run(b.write(path))


def test_a_slow_isend_that_depends_on_the_op_it_was_issued_from_holds_the_threads_next_op(
    tmp_path: Path,
) -> None:
    # as above, but the isend's dependency is `outer`, the operator it was issued from and still running
    # then (a trace that names a node's parent operator as its dependency, as Chakra's converter does),
    # where the capture names the thread's last finished op: the model took no issuing thread from it,
    # and the delay went to the send alone
    rt = _outer_run(tmp_path / "run")
    assert _slow_send_moves(rt, "fwd1", 3 * MS) == (3 * MS, 3 * MS)
    assert _slow_send_moves(rt, "outer", 3 * MS)[0] == 0  # it began before the isend: it is not held


def test_a_slow_isend_issued_as_its_enclosing_op_begins_holds_the_threads_next_op_not_that_one(
    tmp_path: Path,
) -> None:
    # a Chakra trace's times are whole µs: the isend issued first thing in `outer` starts when `outer`
    # does. The sleep is inside `outer`, so it holds `fwd1`; `outer` starts as recorded (as where the
    # isend starts 1 ns later). It held `outer` itself
    for lag in (0, 1):
        rt = _outer_run(tmp_path / f"run{lag}", outer=(MS, 2 * MS), send_at=MS + lag)
        assert _slow_send_moves(rt, "outer", 3 * MS)[0] == 0, lag
        assert _slow_send_moves(rt, "fwd1", 3 * MS) == (3 * MS, 3 * MS), lag


def test_a_slow_isend_that_follows_one_op_and_was_issued_inside_another_holds_the_thread_once(
    tmp_path: Path,
) -> None:
    # two dependencies on the thread, `fwd0` done and `outer` still running: one issue, one 3 ms delay
    rt = _outer_run(tmp_path / "run", on=("fwd0", "outer"))
    assert _slow_send_moves(rt, "fwd1", 3 * MS) == (3 * MS, 3 * MS)


@pytest.mark.parametrize("on", [("outer",), ("fwd0", "outer"), ("fwd0",)])
def test_a_real_replay_worker_holds_the_threads_next_op_after_a_slow_isend_as_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: tuple[str, ...]
) -> None:
    # the isend issued 0.4 ms into `outer`, 3 ms late: the worker ran `fwd1` at 4.0 ms where the isend
    # depends on `outer` (issued after `outer`, 3 ms, at its ready time, 4 ms: the next op went on then)
    # and at 3.01 ms where it depends on `fwd0` alone (issued inside `outer`, the sleep inside it), where
    # the simulator holds `fwd1` by the 3 ms (6.01 ms). The plan now adds the delay to `fwd1` (issuer_delays)
    rt = _outer_run(tmp_path / "run", on=on)
    model = SlowdownModel([Slowdown(kind="comm_delay", before="send", ranks=(0,), delay_ns=3 * MS)])
    ops = [o for o in rank_plan(rt.ranks[0], rt, model) if o.kind != KIND_NESTED]
    start, _end = worker_times(ops, tmp_path, monkeypatch)
    sim = simulate(rt, effects=model).start_ns[0]
    assert {o.name: start[o.row] for o in ops} == {o.name: int(sim[o.row]) for o in ops}
    assert start[ops[-1].row] == 6 * MS + 10_000


def test_a_slow_isend_that_depends_on_a_collective_still_running_holds_no_op_of_that_collectives_thread(
    tmp_path: Path,
) -> None:
    # the isend waits for `ar0`, a host collective on another thread (gloo's worker) still running when it
    # starts: that thread issued nothing, so its next collective `ar1` starts as recorded
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).collective(CommType.ALL_REDUCE, 1024, 2 * MS, start_ns=MS, stream=1000, name="ar0")
    b.rank(0).send(1, comm_bytes=1024, dur_ns=50_000, start_ns=3 * MS // 2, stream=1001, deps=(1,))
    b.rank(1).recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=3 * MS // 2, stream=1001)
    for r in (0, 1):
        b.rank(r).collective(CommType.ALL_REDUCE, 1024, MS, start_ns=4 * MS, stream=1000, name="ar1")
    rt = load_run(b.write(tmp_path / "run"))
    assert _slow_send_moves(rt, "c10d::send", 3 * MS)[0] == 3 * MS
    assert _slow_send_moves(rt, "ar1", 3 * MS)[0] == 0


def test_a_slow_nccl_collective_holds_the_host_thread_that_launched_it(tmp_path: Path) -> None:
    # an imported GPU run (Kineto): each all_reduce kernel is launched from inside c10d::allreduce_, its
    # one dependency a launch edge; 3 ms before each held the kernel alone, and the host op after the
    # launching one started as recorded, where the thread sleeps before it issues (mode=real, a capture)
    write_gpu_run(GpuRunSpec(world_size=2, steps=1, layers=2, bucket_layers=2, seed=0), tmp_path / "kineto")
    import_traces(sorted((tmp_path / "kineto").glob("*.json.gz")), None, tmp_path / "run")
    rt = load_run(tmp_path / "run")
    r0 = rt.ranks[0]
    model = SlowdownModel([Slowdown(kind="comm_delay", before="collective", ranks=(0,), delay_ns=3 * MS)])
    base, res = simulate(rt), simulate(rt, effects=model)
    kernel = int(np.flatnonzero(r0.node_type == int(NodeType.COMM_COLL))[0])
    call = next(i for i in range(len(r0)) if r0.name(i) == "c10d::allreduce_")
    after = min(
        (i for i in range(len(r0)) if r0.is_cpu[i] and r0.start_ns[i] >= r0.start_ns[call] + r0.dur_ns[call]),
        key=lambda i: int(r0.start_ns[i]),
    )
    assert res.start_ns[0][kernel] - base.start_ns[0][kernel] == 3 * MS
    assert res.start_ns[0][after] - base.start_ns[0][after] == 3 * MS


def test_a_slow_isend_holds_the_threads_next_op_by_start_time_not_by_its_place_in_the_trace(
    tmp_path: Path,
) -> None:
    # the trace lists fwd2 (at 5 ms) before fwd1 (at 1.02 ms): fwd1 is the op after the isend
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    f = r0.compute("fwd0", dur_ns=MS, start_ns=0)
    r0.compute("fwd2", dur_ns=MS, start_ns=5 * MS)
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=MS, stream=1000, deps=(f,))
    r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=MS)
    r0.compute("fwd1", dur_ns=MS, start_ns=MS + 20_000)
    assert _slow_send_moves(load_run(b.write(tmp_path / "run")), "fwd1", 3 * MS)[0] == 3 * MS


def test_a_slow_isend_after_the_threads_last_op_delays_the_send_alone(tmp_path: Path) -> None:
    # nothing of the thread comes after it, so there is nothing to hold: the send starts 3 ms later
    b = RunBuilder(world_size=2)
    f = b.rank(0).compute("fwd0", dur_ns=MS, start_ns=0)
    b.rank(0).send(1, comm_bytes=1024, dur_ns=50_000, start_ns=2 * MS, stream=1000, deps=(f,))
    b.rank(1).recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=2 * MS)
    assert _slow_send_ns(load_run(b.write(tmp_path / "run")), 3 * MS) == 3 * MS


def test_a_slow_device_collective_queued_behind_a_running_kernel_holds_no_kernel_of_that_stream(
    tmp_path: Path,
) -> None:
    # the NCCL collective (on the GPU, at its call) waits for kernel k1 still running on stream 7: that
    # stream issued nothing, so a 3 ms delay before the collective leaves stream 7's next kernel k2 alone
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        f1 = rb.compute("fwd1", dur_ns=200_000, start_ns=0)
        k1 = rb.compute("k1", dur_ns=2 * MS, start_ns=MS // 2, stream=7, deps=(f1,), launch_ns=100_000)
        _nccl_all_reduce(rb, MS, (k1,))
        f2 = rb.compute("fwd2", dur_ns=200_000, start_ns=2_800_000)
        rb.compute("k2", dur_ns=MS, start_ns=3 * MS, stream=7, deps=(f2,), launch_ns=2_900_000)
    moved = _collective_delay_moves(load_run(b.write(tmp_path / "run")))
    assert (moved["nccl:all_reduce"], moved["k2"], moved["fwd2"]) == (3 * MS, 0, 0)


def _nccl_all_reduce(
    rb: RankBuilder, start_ns: int, deps: tuple[int, ...], launch_ns: int | None = None
) -> None:
    """An NCCL all_reduce kernel (0.5 ms on stream 20, at its call: no launch of its own unless ``launch_ns``)
    depending on ``deps``."""
    attrs: dict[str, AttrValue] = {
        Attr.IS_CPU_OP: False,
        Attr.COMM_TYPE: int(CommType.ALL_REDUCE),
        Attr.COMM_SIZE: 1024,
        Attr.PG_NAME: "0",
        Attr.SEQ: 0,
    }
    if launch_ns is not None:
        attrs[Attr.LAUNCH_NS] = launch_ns
    rb._add(
        "nccl:all_reduce",
        NodeType.COMM_COLL,
        dur_ns=MS // 2,
        start_ns=start_ns,
        stream=20,
        deps=deps,
        attrs=attrs,
    )


def _collective_delay_moves(rt: RunTrace) -> dict[str, int]:
    """How much later each of rank 0's ops starts with 3 ms before each of its collectives."""
    r0 = rt.ranks[0]
    model = SlowdownModel([Slowdown(kind="comm_delay", before="collective", ranks=(0,), delay_ns=3 * MS)])
    base, res = simulate(rt), simulate(rt, effects=model)
    return {r0.name(i): int(res.start_ns[0][i] - base.start_ns[0][i]) for i in range(len(r0))}


def test_a_slow_isend_that_follows_a_finished_op_and_was_issued_as_its_enclosing_op_began_holds_the_next_op(
    tmp_path: Path,
) -> None:
    # the isend follows `fwd0` (finished) and depends on `outer`, which it was issued from first thing
    # (both start in one µs): `outer` began before the issue and is not held; `fwd1` is. `outer` was held
    # (3 ms late) where 1 ns later it was not
    for lag in (0, 1):
        rt = _outer_run(tmp_path / f"run{lag}", outer=(MS, 2 * MS), send_at=MS + lag, on=("fwd0", "outer"))
        assert _slow_send_moves(rt, "outer", 3 * MS)[0] == 0, lag
        assert _slow_send_moves(rt, "fwd1", 3 * MS) == (3 * MS, 3 * MS), lag


def test_a_stall_before_a_step_that_follows_asynchronous_collectives_delays_the_step_once(
    tmp_path: Path,
) -> None:
    # DDP under Join's shape: each step issues an async all_reduce on the group's stream that nothing waits
    # for in the step; the next step's first node follows it. A stall before that first node was also taken
    # for a delay before an op the all_reduce's stream issued, so the next all_reduce on it waited as much
    # again: a 20 ms stall every step on rank 0 made every step after the first 40 ms longer, not 20 ms
    comm = 1000  # the capture's stream of the group (COMM_STREAM_BASE)
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r)
        prev: tuple[int, ...] = ()
        for s in range(STEPS):
            t = s * 5 * MS
            rb.step(s)
            fwd = rb.compute("aten::fwd", dur_ns=2 * MS, start_ns=t, deps=prev)
            ar = rb.collective(
                CommType.ALL_REDUCE,
                comm_bytes=4,
                dur_ns=TRANSFER,
                start_ns=t + 2 * MS,
                stream=comm,
                deps=(fwd,),
            )
            rb.compute("aten::bwd", dur_ns=2 * MS)
            prev = (ar,)
    rt = load_run(b.write(tmp_path / "run"))
    stall = SlowdownModel([Slowdown(kind="stall", ranks=(0,), every_step=True, delay_ns=20 * MS)])
    res = simulate(rt, effects=stall)
    r0 = rt.ranks[0]
    rows = {(int(r0.step[i]), r0.name(i)): i for i in range(len(r0)) if r0.step[i] >= 0}
    fwd_end = [int(res.end_ns[0][rows[(s, "aten::fwd")]]) for s in range(STEPS)]
    ar_start = [int(res.start_ns[0][rows[(s, "c10d::all_reduce_")]]) for s in range(STEPS)]
    assert ar_start == fwd_end  # issued as the stalled step's fwd ends, as recorded: no second stall
    fwd_start = [int(res.start_ns[0][rows[(s, "aten::fwd")]]) for s in range(STEPS)]
    assert fwd_start[0] == 20 * MS  # the stall itself, once, before each step's first node


def test_a_delay_before_a_collective_that_follows_another_groups_collective_delays_that_stream_not_again(
    tmp_path: Path,
) -> None:
    # each step: an async all_reduce on group 0's stream, then one on group 1's stream that follows it (a
    # start edge from the first, as a trace's dependencies may say). A 5 ms comm_delay before every
    # collective on rank 0 also took group 0's stream for the issuer of group 1's all_reduce, and delayed
    # the next step's all_reduce on it by 5 ms more: step 1's at 32 ms instead of 27 (its fwd's end, 22 ms,
    # and its own 5 ms)
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r)
        prev: tuple[int, ...] = ()
        for s in range(3):
            t = s * 10 * MS
            rb.step(s)
            fwd = rb.compute("aten::fwd", dur_ns=2 * MS, start_ns=t, deps=prev)
            ar0 = rb.collective(
                CommType.ALL_REDUCE, comm_bytes=4, dur_ns=MS, start_ns=t + 2 * MS, stream=1000, deps=(fwd,)
            )
            ar1 = rb.collective(
                CommType.ALL_REDUCE, 4, MS, start_ns=t + 3 * MS, stream=1001, deps=(ar0,), pg="1"
            )
            bwd = rb.compute("aten::bwd", dur_ns=2 * MS, start_ns=t + 2 * MS, deps=(fwd,))
            prev = (rb.compute("c10d::wait", dur_ns=MS // 10, start_ns=t + 4 * MS, deps=(bwd, ar1)),)
    rt = load_run(b.write(tmp_path / "run"))
    delay = SlowdownModel([Slowdown(kind="comm_delay", ranks=(0,), delay_ns=5 * MS, before="collective")])
    res = simulate(rt, effects=delay)
    r0 = rt.ranks[0]
    rows = [i for i in range(len(r0)) if r0.stream[i] == 1000]
    fwd = [i for i in range(len(r0)) if r0.name(i) == "aten::fwd"]
    assert [int(res.start_ns[0][i]) for i in rows] == [int(res.end_ns[0][i]) + 5 * MS for i in fwd]
    assert int(res.start_ns[0][rows[1]]) == 27 * MS


def test_a_slow_isend_that_completed_inside_its_call_holds_its_thread_once(tmp_path: Path) -> None:
    # rank 0 isends at 2 ms (its call returns at 2.01) and goes on; both ranks' waits on the pair, at 3.01 ms,
    # return at once, so the pair completed when both were issued and the thread's next row follows the send.
    # A 5 ms comm_delay before the send held that row by the send's end and again as the send's issuer: it
    # started at 12.01 ms, not 7.01 (what mode=real's thread does: sleep 5 ms, issue, go on)
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        f = rb.compute("aten::fwd", dur_ns=2 * MS, start_ns=0)
        op = rb.send if r == 0 else rb.recv
        p2p = op(1 - r, 4096, MS, start_ns=2 * MS, stream=1000, deps=(f,), return_ns=2 * MS + 10_000)
        nxt = rb.compute("aten::next", dur_ns=MS, start_ns=2 * MS + 10_000, deps=(f,))
        rb.compute("c10d::wait", dur_ns=10_000, start_ns=3 * MS + 10_000, deps=(nxt, p2p))
    rt = load_run(b.write(tmp_path / "run"))
    delay = SlowdownModel([Slowdown(kind="comm_delay", ranks=(0,), delay_ns=5 * MS, before="send")])
    res = simulate(rt, effects=delay)
    r0 = rt.ranks[0]
    row = {r0.name(i): i for i in range(len(r0))}
    assert int(res.start_ns[0][row["c10d::send"]]) == 7 * MS
    assert int(res.start_ns[0][row["aten::next"]]) == 7 * MS + 10_000


def _first_rank_waits_4_ms(tmp_path: Path) -> RunTrace:
    """2 ranks, one step: rank 0 begins 1 ms before rank 1 and waits 4 ms for it at the all_reduce."""
    b = RunBuilder(2)
    b.rank(0).step(0).compute("aten::mm", 2 * MS, start_ns=0)
    b.rank(1).step(0).compute("aten::mm", 5 * MS, start_ns=1 * MS)
    b.rank(0).collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=2 * MS)
    b.rank(1).collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=6 * MS)
    return load_run(b.write(tmp_path / "run"))


def test_a_stall_on_the_rank_that_began_first_never_shortens_the_makespan(tmp_path: Path) -> None:
    # rank 0 begins 1 ms before rank 1 and arrives 4 ms before it at the all_reduce: a stall of rank 0 up
    # to 4 ms is absorbed by that wait, a longer one delays the all_reduce by the rest. The makespan counts
    # from the replay's start (the run's first start), so the stall is in it where it shows at all: it read
    # 6 ms under a 1 ms stall (from rank 0's stalled first node), 7 ms without
    rt = _first_rank_waits_4_ms(tmp_path)
    base = simulate(rt).makespan_ns
    assert base == 7 * MS
    for delay_ms in (0.5, 1, 4, 6):
        d = int(delay_ms * MS)
        res = simulate(rt, effects=SlowdownModel([Slowdown(kind="stall", ranks=(0,), step=0, delay_ns=d)]))
        assert res.makespan_ns == base + max(d - 4 * MS, 0)


def test_a_stall_on_the_rank_that_began_a_step_first_never_shortens_that_step(tmp_path: Path) -> None:
    # two steps; in step 1 rank 0 begins 1 ms before rank 1 (its step 0 ended earlier) and then waits 3 ms
    # at the all_reduce: a stall of rank 0 at step 1 up to 3 ms is absorbed, a longer one delays the step
    # by the rest. Step 1 counts from step 0's completion, as the analyses' step times do: from rank 0's
    # stalled first node it read 8 ms under a 1 ms stall, 9 ms without
    b = RunBuilder(2)
    for r in (0, 1):
        b.rank(r).step(0).compute("aten::mm", 4 * MS, start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, 1 << 20, MS, start_ns=4 * MS)
        b.rank(r).compute("aten::sgd", (1 + r) * MS, start_ns=5 * MS)  # rank 0's step 0 ends at 6 ms
    b.rank(0).step(1).compute("aten::mm", 4 * MS, start_ns=6 * MS)
    b.rank(1).step(1).compute("aten::mm", 6 * MS, start_ns=7 * MS)
    b.rank(0).collective(CommType.ALL_REDUCE, 1 << 20, 4 * MS, start_ns=10 * MS)
    b.rank(1).collective(CommType.ALL_REDUCE, 1 << 20, 1 * MS, start_ns=13 * MS)
    rt = load_run(b.write(tmp_path / "run"))
    base = simulate(rt)
    assert [base.step_time_ns(s) for s in base.steps()] == [7 * MS, 7 * MS]
    for delay_ms in (0.5, 1, 3, 5):
        d = int(delay_ms * MS)
        res = simulate(rt, effects=SlowdownModel([Slowdown(kind="stall", ranks=(0,), step=1, delay_ns=d)]))
        assert res.step_time_ns(0) == 7 * MS
        assert res.step_time_ns(1) == 7 * MS + max(d - 3 * MS, 0)
        assert res.makespan_ns == base.makespan_ns + max(d - 3 * MS, 0)


def test_a_stall_on_the_rank_that_began_first_never_shortens_the_first_step(tmp_path: Path) -> None:
    # rank 0 begins 1 ms before rank 1 and waits 4 ms for it at the all_reduce: a stall of rank 0 before
    # step 0 up to 4 ms is absorbed, a longer one delays the step by the rest. The first step counted from
    # its earliest replayed start, rank 0's stalled first node: it read 6 ms under a 1 ms stall, 7 without
    rt = _first_rank_waits_4_ms(tmp_path)
    assert simulate(rt).step_times() == {0: 7 * MS}
    for delay_ms in (0.5, 1, 4, 6):
        d = int(delay_ms * MS)
        res = simulate(rt, effects=SlowdownModel([Slowdown(kind="stall", ranks=(0,), step=0, delay_ns=d)]))
        assert res.step_times() == {0: 7 * MS + max(d - 4 * MS, 0)}


def test_a_slow_isend_that_follows_ops_of_two_threads_holds_each_threads_next_op(tmp_path: Path) -> None:
    # the isend follows `fwd0` (the main thread) and `side0` (stream 5, another host thread): either thread
    # may have issued it, and each is held as its issuer (one issue per op and thread): `fwd1` and `side1`
    # both start 3 ms later. Taking one issue per op held the first thread's alone (`side1` moved 0)
    b = RunBuilder(world_size=2)
    r0, r1 = b.rank(0), b.rank(1)
    f = r0.compute("fwd0", dur_ns=MS, start_ns=0)
    g = r0.compute("side0", dur_ns=MS, start_ns=0, stream=5)
    r0.send(1, comm_bytes=1024, dur_ns=50_000, start_ns=MS + 10_000, stream=1000, deps=(f, g))
    r1.recv(0, comm_bytes=1024, dur_ns=50_000, start_ns=MS + 10_000)
    r0.compute("fwd1", dur_ns=MS, start_ns=MS + 20_000)
    r0.compute("side1", dur_ns=MS, start_ns=MS + 20_000, stream=5)
    rt = load_run(b.write(tmp_path / "run"))
    assert _slow_send_moves(rt, "fwd1", 3 * MS)[0] == 3 * MS
    assert _slow_send_moves(rt, "side1", 3 * MS)[0] == 3 * MS


def test_a_slow_nccl_kernel_with_two_launching_rows_of_one_thread_is_issued_at_the_later_launch(
    tmp_path: Path,
) -> None:
    # the kernel's dependencies name two host rows of the thread, `host_a` (0-1 ms) and `host_h` (1-2 ms),
    # and its launch call was at 1.5 ms, inside `host_h` (the model times it by that later launch): a 3 ms
    # delay before it holds the op after `host_h` (`fwd2`) and the kernel 3 ms, whichever row is listed
    # first. The earlier launch edge (its call clipped to `host_a`'s end, 1 ms) was taken for the issue:
    # `host_h` itself was held 3 ms and the kernel, behind it, 6 ms
    for deps in ("ah", "ha"):
        b = RunBuilder(world_size=2)
        for r in (0, 1):
            rb = b.rank(r)
            a = rb.compute("host_a", dur_ns=MS, start_ns=0)
            h = rb.compute("host_h", dur_ns=MS, start_ns=MS, deps=(a,))
            _nccl_all_reduce(rb, 3 * MS, (a, h) if deps == "ah" else (h, a), launch_ns=3 * MS // 2)
            rb.compute("fwd2", dur_ns=MS, start_ns=2_500_000)
        moved = _collective_delay_moves(load_run(b.write(tmp_path / deps)))
        assert (moved["host_h"], moved["nccl:all_reduce"], moved["fwd2"]) == (0, 3 * MS, 3 * MS), deps


# -- mutation round 41 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "host_factor", "gpu_factor"), [("any", 2.0, 2.0), ("host", 2.0, 1.0), ("gpu", 1.0, 2.0)]
)
def test_a_compute_items_device_says_whether_host_ops_gpu_ops_or_both_are_scaled(
    device: str, host_factor: float, gpu_factor: float
) -> None:
    m = SlowdownModel([Slowdown(kind="compute", factor=2.0, device=device)])
    assert m.compute_factor(0, 0, "aten::mm", on_gpu=False) == host_factor
    assert m.compute_factor(0, 0, "gemm_kernel", on_gpu=True) == gpu_factor


def test_a_jitter_factor_never_falls_below_a_twentieth_however_wide_its_sigma() -> None:
    # sigma 10: a draw below -0.095 would make the factor 0 or negative (an op taking no time or less);
    # the factor stops at 0.05, and the draws above it are left as drawn
    factors = [jitter_factor(0, 10.0, 0, step) for step in range(8)]
    assert [f for f in factors if f <= 1.0] == [0.05] * 5
    assert all(f > 1.0 for f in (factors[0], factors[4], factors[6]))


@pytest.mark.parametrize(
    ("item", "effect"),
    [
        (Slowdown(kind="compute", factor=2.0), lambda m, r, s: m.compute_factor(r, s, "aten::mm")),
        (
            Slowdown(kind="comm_delay", delay_ns=5),
            lambda m, r, s: m.delay_before_ns(r, s, NodeType.COMM_COLL, "all_reduce"),
        ),
        (Slowdown(kind="stall", delay_ns=5, every_step=True), lambda m, r, s: m.stall_ns(r, s)),
        (Slowdown(kind="host_idle", factor=0.5), lambda m, r, s: m.host_idle_factor(r, s)),
    ],
    ids=["compute", "comm_delay", "stall", "host_idle"],
)
def test_each_kinds_ranks_and_steps_limit_it_to_those_ranks_at_those_steps(
    item: Slowdown, effect: Callable[[SlowdownModel, int, int], float]
) -> None:
    # the item on rank 1 at steps 2..3: rank 0, and rank 1 at steps 1 and 4, as recorded
    m = SlowdownModel([dataclasses.replace(item, ranks=(1,), first_step=2, last_step=3)])
    none, slowed = effect(SlowdownModel([]), 0, 0), effect(SlowdownModel([item]), 0, 0)
    assert none != slowed
    assert [[effect(m, r, s) for s in (1, 2, 3, 4)] for r in (0, 1)] == [
        [none] * 4,
        [none, slowed, slowed, none],
    ]


def test_a_network_item_that_keeps_the_bandwidth_says_only_what_it_changes() -> None:
    # factor 1 is no bandwidth change: not "bandwidth x1, ..."
    assert (
        Slowdown(kind="network", latency_ns=20_000, nodes=(1,)).describe() == "+20,000 ns latency on node 1"
    )
    assert Slowdown(kind="network", ranks=(0, 3)).describe() == "network unchanged on ranks 0, 3"
    assert Slowdown(kind="network", factor=0.5, links=((0, 1),)).describe() == "bandwidth x0.5 on links 0-1"
