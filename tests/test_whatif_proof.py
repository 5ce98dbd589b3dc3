"""A what-if proven not to change any step (``Simulator.steps_unchanged``) really changes none, and blame
that skips simulating such what-ifs gives exactly what simulating every one gives."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest
from test_analysis_scenarios import MS, Scenario, build_run
from test_gpu_execution import SHARED, host_bound_spec

from skewlens.analysis.blame import analyze_blame
from skewlens.analysis.index import build_index
from skewlens.analysis.skew import analyze_skew
from skewlens.profiler.importers import import_traces
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.synth_gpu import GpuRunSpec, write_gpu_run
from skewlens.profiler.vocab import CommType
from skewlens.replay import simulate as simulate_module
from skewlens.replay.lower import recorded_gaps
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.simulate import Simulator, step_times_from_spans


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunTrace]:
    """Collectives in two groups and p2p (eager and waiting sends) with a straggler; imported GPU traces
    (launches, stream order, waits, nested nodes) with a slow rank."""
    tmp = tmp_path_factory.mktemp("proof")
    out = {
        "collectives and p2p": load_run(
            build_run(
                tmp / "cp", Scenario(straggler_rank=2, straggler_ns=8 * MS, slow_send_rank=0, slow_send_ns=MS)
            )
        )
    }
    write_gpu_run(GpuRunSpec(world_size=4, steps=3, layers=4, slow_ranks={1: 1.3}, seed=0), tmp / "kineto")
    import_traces(sorted((tmp / "kineto").glob("*.json.gz")), None, tmp / "gpu")
    out["gpu"] = load_run(tmp / "gpu")
    # host-bound: each ``aten::item`` launches the copy it waits for, and the copy is on the step's path
    host_bound = host_bound_spec(world_size=2, steps=3, seed=0, slow_ranks={1: 1.3})
    write_gpu_run(host_bound, tmp / "kineto-host")
    import_traces(sorted((tmp / "kineto-host").glob("*.json.gz")), None, tmp / "gpu-host")
    out["gpu, host-bound"] = load_run(tmp / "gpu-host")
    dlrm = SHARED / "dlrm_8gpu_kineto.tar.gz"  # host ops that launch after they synchronised (aten::index)
    if dlrm.is_file():
        import_traces([dlrm], None, tmp / "dlrm")
        out["DLRM"] = load_run(tmp / "dlrm")
    return out


def _steps(sim: Simulator, **overrides: dict[int, np.ndarray]) -> dict[int, int]:
    return step_times_from_spans(sim.simulate(**overrides).step_spans())


@pytest.mark.parametrize("name", ["collectives and p2p", "gpu", "gpu, host-bound", "DLRM"])
def test_a_what_if_proven_unchanged_simulates_to_the_same_step_times_and_others_are_not_proven(
    runs: dict[str, RunTrace], name: str
) -> None:
    if name not in runs:
        pytest.skip(f"{SHARED} has no DLRM trace (see shared/traces/README.md)")
    run = runs[name]
    sim = Simulator(run)
    base = _steps(sim)
    gaps = recorded_gaps(run)
    rng = np.random.default_rng(1)
    proven = unproven_changed = 0
    for r, rt in sorted(run.ranks.items()):
        n = len(rt)
        for factor in (0.0, 0.5, 0.9):  # down to nothing: a wrong proof would show
            pick = rng.random(n) < 0.6
            dur = np.where(pick, (rt.dur_ns * factor).astype(np.int64), -1)
            gap = np.where(pick, (gaps[r] * factor).astype(np.int64), -1)
            ok = sim.steps_unchanged(dur_override={r: dur}, gap_override={r: gap})
            got = _steps(sim, dur_override={r: dur}, gap_override={r: gap})
            if ok:
                proven += 1
                assert got == base, f"rank {r} x{factor}: proven unchanged, but the steps changed"
            elif got != base:
                unproven_changed += 1
    assert proven > 0  # the slow rank's peers are off the binding paths
    assert unproven_changed > 0  # and the slow rank's what-ifs are simulated (and do change the steps)


def test_an_override_that_lengthens_anything_is_never_proven_unchanged(runs: dict[str, RunTrace]) -> None:
    run = runs["collectives and p2p"]
    sim = Simulator(run)
    sim.simulate()
    rt = run.ranks[1]  # not the straggler: its shortening is proven harmless
    shorter = np.where(rt.dur_ns > 0, rt.dur_ns // 2, -1)
    assert sim.steps_unchanged(dur_override={1: shorter})
    longer = shorter.copy()
    longer[np.flatnonzero(rt.dur_ns > 0)[0]] = int(rt.dur_ns.max()) * 3
    assert not sim.steps_unchanged(dur_override={1: longer})


def test_nothing_is_proven_before_the_baseline_replay_or_under_contention(runs: dict[str, RunTrace]) -> None:
    run = runs["collectives and p2p"]
    rt = run.ranks[1]
    shorter = {1: np.where(rt.dur_ns > 0, rt.dur_ns // 2, -1)}
    sim = Simulator(run)
    assert not sim.steps_unchanged(dur_override=shorter)  # no baseline yet
    topo = Topology(
        name="flat",
        dims=(Dimension(kind="switch", size=len(run.ranks), bandwidth_gbps=10.0, latency_ns=1_000),),
    )
    shared = Simulator(run, comm_mode="model", topology=topo, contention=True)
    shared.simulate()
    assert not shared.steps_unchanged(dur_override=shorter)


@pytest.mark.parametrize("name", ["collectives and p2p", "gpu"])
def test_blame_that_skips_proven_what_ifs_equals_blame_that_simulates_every_one(
    runs: dict[str, RunTrace], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ix = build_index(runs[name])
    skew = analyze_skew(ix)
    calls: list[bool] = []
    real = simulate_module.Simulator.simulate

    def counted(self: Simulator, **kw: object) -> object:
        calls.append(bool(kw.get("dur_override") or kw.get("gap_override")))
        return real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(simulate_module.Simulator, "simulate", counted)
    full = analyze_blame(ix, skew, prove=False)
    full_whatifs = sum(calls)
    calls.clear()
    fast = analyze_blame(ix, skew)
    assert fast.records == full.records
    assert fast.step_records == full.step_records
    assert fast.whatif_step_ns == full.whatif_step_ns
    assert sum(calls) < full_whatifs  # some what-ifs were proven, not simulated
    assert full.records[0].straggler_cost_ns > 0


def test_a_host_gap_that_makes_a_rank_last_at_a_collective_is_on_the_path(tmp_path: Path) -> None:
    # rank 0 idles 4 ms before the all_reduce that rank 1 entered at 1 ms: removing that gap shortens the step
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=MS if r == 0 else MS // 2, start_ns=0)  # rank 1 idles 0.5 ms
        arrive = 5 * MS if r == 0 else MS
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=6 * MS - arrive, start_ns=arrive)
        rb.compute("aten::add", dur_ns=MS, start_ns=6 * MS)
    run = load_run(b.write(tmp_path / "run"))
    sim = Simulator(run)
    base = _steps(sim)
    gaps = recorded_gaps(run)
    for r in (0, 1):
        gap = np.where(gaps[r] > 0, 0, -1)
        assert (gap == 0).any()
        changed = _steps(sim, gap_override={r: gap}) != base
        assert changed == (r == 0)
        assert sim.steps_unchanged(gap_override={r: gap}) == (not changed)


def test_max_simulations_counts_only_the_what_ifs_that_were_simulated(
    runs: dict[str, RunTrace], monkeypatch: pytest.MonkeyPatch
) -> None:
    ix = build_index(runs["gpu"])
    skew = analyze_skew(ix)
    full = analyze_blame(ix, skew, prove=False)
    whatifs: list[int] = []
    real = simulate_module.Simulator.simulate

    def counted(self: Simulator, **kw: object) -> object:
        if kw.get("dur_override"):
            whatifs.append(1)
        return real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(simulate_module.Simulator, "simulate", counted)
    one = analyze_blame(ix, skew, max_simulations=1)
    assert len(whatifs) == 1
    assert one.records == full.records  # every rank evaluated: the slow one simulated, the others proven
    none = analyze_blame(ix, skew, max_simulations=0)
    assert len(whatifs) == 1
    slow = next(r for r in none.records if r.rank == 1)
    assert not slow.simulated and slow.straggler_cost_ns == 0
    assert all(r.simulated for r in none.records if r.rank != 1)


def test_the_proofs_reversed_launch_edges_keep_their_at_arrival_flags_in_a_byte_each(
    runs: dict[str, RunTrace],
) -> None:
    g = Simulator(runs["gpu, host-bound"])._lowering.lowered.graph
    assert g.lsucc_at_arrival is not None and g.lsucc_idx is not None and g.lsucc_off is not None
    preds = simulate_module._preds(g)
    by_dst = np.argsort(np.asarray(g.lsucc_idx), kind="stable")
    flags = np.frombuffer(bytes(g.lsucc_at_arrival), dtype=np.uint8)[by_dst]
    assert flags.any()  # some launch is met at its launching row's arrival
    assert preds.lat_arrival.dtype == np.uint8
    assert preds.lat_arrival.tolist() == flags.tolist()
    assert preds.loff.tolist() == np.asarray(g.lsucc_off, dtype=np.int64)[by_dst].tolist()


def test_the_lowering_holds_each_sync_groups_rows_segments_and_transfers_as_integer_arrays(
    runs: dict[str, RunTrace],
) -> None:
    low = Simulator(runs["collectives and p2p"])._lowering.lowered
    g = low.graph
    assert len(g.groups) == len(g.transfer) == len(low.sync_rows) == len(low.syncs) > 0
    for gi, rows in enumerate(low.sync_rows):
        assert isinstance(rows, array) and isinstance(g.groups[gi], array)
        assert isinstance(g.transfer[gi], array)
        assert list(g.groups[gi]) == low.seg_of_row[list(rows)].tolist()
        assert len(g.transfer[gi]) == len(rows) == len(low.syncs[gi].rows)
