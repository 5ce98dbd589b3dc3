"""Network model: topologies, placement, closed-form collective costs (exact to the ns), contention."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from skewlens.paths import CONF_DIR
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.comm import ModelTiming
from skewlens.replay.config import TopologyConfig
from skewlens.replay.errors import ConfigError
from skewlens.replay.network.algorithms import flat_time_ns, hierarchical_time_ns
from skewlens.replay.network.topology import Dimension, Topology, TopologyError
from skewlens.replay.simulate import simulate

S = 1_048_576  # bytes
BW = 50.0  # GB/s = bytes/ns
ALPHA = 500  # ns


def flat(kind: str = "switch", bw: float = BW, alpha: int = ALPHA) -> Topology:
    return Topology(name=kind, dims=(Dimension(kind=kind, size=0, bandwidth_gbps=bw, latency_ns=alpha),))


def one_collective_run(
    tmp_path: Path, world: int, comm_type: CommType = CommType.ALL_REDUCE, groups: dict | None = None
) -> RunTrace:
    b = RunBuilder(world_size=world, groups=groups)
    names = list((groups or {"0": tuple(range(world))}).items())
    for r in range(world):
        for name, members in names:
            if r in members:
                b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
                b.rank(r).collective(comm_type, comm_bytes=S, dur_ns=123_456, pg=name)
    return load_run(b.write(tmp_path / "run"))


def replayed_transfer(rt: RunTrace, **kw: object) -> list[int]:
    res = simulate(rt, comm_mode="model", **kw)  # type: ignore[arg-type]
    return [int(e - a) for a, e in zip(res.coll_arrival_ns, res.coll_end_ns, strict=True)]


# closed forms written out independently of replay.network.algorithms (p = 2, L = 1)
TWO_RANK_ALL_REDUCE = {
    "ring": 2 * (2 - 1) * (ALPHA + S / (2 * BW)),
    "tree": 2 * 1 * ALPHA + 2 * S / BW,
    "halving_doubling": 2 * 1 * ALPHA + 2 * (1 / 2) * S / BW,
    "direct": 2 * ALPHA + 2 * (1 / 2) * S / BW,
    "hierarchical": 2 * (2 - 1) * (ALPHA + S / (2 * BW)),  # one level: falls back to ring
}


@pytest.mark.parametrize("algorithm", sorted(TWO_RANK_ALL_REDUCE))
def test_two_rank_all_reduce_takes_the_closed_form_time_to_the_nanosecond(
    tmp_path: Path, algorithm: str
) -> None:
    rt = one_collective_run(tmp_path, 2)
    assert replayed_transfer(rt, topology=flat(), algorithm=algorithm) == [
        round(TWO_RANK_ALL_REDUCE[algorithm])
    ]


EIGHT = 8
L8 = 3
EIGHT_RANK = {
    ("ring", CommType.ALL_REDUCE): 2 * 7 * (ALPHA + S / (8 * BW)),
    ("tree", CommType.ALL_REDUCE): 2 * L8 * ALPHA + 2 * S / BW,
    ("halving_doubling", CommType.ALL_REDUCE): 2 * L8 * ALPHA + 2 * 7 / 8 * S / BW,
    ("direct", CommType.ALL_REDUCE): 2 * ALPHA + 2 * 7 / 8 * S / BW,
    # comm_size is a member's input, its shard: the 8 ranks gather 8 * S bytes
    ("ring", CommType.ALL_GATHER): 7 * (ALPHA + 8 * S / (8 * BW)),
    ("halving_doubling", CommType.REDUCE_SCATTER): L8 * ALPHA + 7 / 8 * S / BW,
    ("direct", CommType.ALL_TO_ALL): ALPHA + 7 / 8 * S / BW,
    ("tree", CommType.BROADCAST): L8 * (ALPHA + S / BW),
    ("ring", CommType.BROADCAST): 7 * ALPHA + S / BW,
    ("ring", CommType.BARRIER): 2 * 7 * ALPHA,
}


@pytest.mark.parametrize(("algorithm", "comm_type"), list(EIGHT_RANK))
def test_eight_rank_collectives_follow_their_closed_forms(
    tmp_path: Path, algorithm: str, comm_type: CommType
) -> None:
    rt = one_collective_run(tmp_path, EIGHT, comm_type)
    got = replayed_transfer(rt, topology=flat(), algorithm=algorithm)
    assert got == [round(EIGHT_RANK[(algorithm, comm_type)])]


def two_level(per_node: int = 2, nodes: int = 2, oversub: float = 1.0, links: int = 0) -> Topology:
    return Topology(
        name="two-level",
        dims=(
            Dimension(kind="switch", size=per_node, bandwidth_gbps=200.0, latency_ns=300),
            Dimension(
                kind="fat_tree",
                size=nodes,
                bandwidth_gbps=25.0,
                latency_ns=2_000,
                oversubscription=oversub,
                links_per_node=links,
            ),
        ),
    )


def test_hierarchical_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_all_gather(
    tmp_path: Path,
) -> None:
    rt = one_collective_run(tmp_path, 4)
    p0, p1 = 2, 2
    intra = (p0 - 1) * (300 + S / (p0 * 200.0))
    inter = 2 * (p1 - 1) * (2_000 + S / (p0 * p1 * 25.0))
    assert replayed_transfer(rt, topology=two_level(), algorithm="hierarchical") == [round(2 * intra + inter)]


@pytest.mark.parametrize(("world", "fewest"), [(6, 2), (5, 1)])
def test_a_hierarchical_group_with_unevenly_filled_nodes_pays_the_emptiest_nodes_links(
    tmp_path: Path, world: int, fewest: int
) -> None:
    # nodes of 4: 6 ranks are 4 + 2, 5 are 4 + 1. The emptiest node's m members must import the other
    # nodes' (p - m)/p of S twice (reduce-scatter, all-gather) over their m links; the model priced 5 and 6
    # ranks as 8 (p0 = 4): S/(p0 p1 B) = 5,243 ns per phase on the outer link, against 13,981 (6 ranks)
    # and 33,554 (5 ranks)
    rt = one_collective_run(tmp_path, world)
    p0, p1 = 4, 2
    intra = (p0 - 1) * (300 + S / (p0 * 200.0))
    inter = 2 * (p1 - 1) * 2_000 + 2 * (world - fewest) / (world * fewest) * S / 25.0
    topo = two_level(per_node=4, nodes=2)
    assert replayed_transfer(rt, topology=topo, algorithm="hierarchical") == [round(2 * intra + inter)]
    # one link (NIC) per node: the emptiest node's m members share it, carrying m times as much
    inter = 2 * (p1 - 1) * 2_000 + 2 * (world - fewest) / world * S / 25.0
    topo = two_level(per_node=4, nodes=2, links=1)
    assert replayed_transfer(rt, topology=topo, algorithm="hierarchical") == [round(2 * intra + inter)]


@pytest.mark.parametrize(
    ("kind", "oversub", "says"),
    [
        (
            "switch",
            4.0,
            "oversubscription: applies to a fat_tree dimension, and this one is a switch (got 4)",
        ),
        ("fat_tree", math.inf, "oversubscription: must be a finite number >= 1, got inf"),
        ("fat_tree", 0.5, "oversubscription: must be a finite number >= 1, got 0.5"),
    ],
)
def test_oversubscription_other_than_a_fat_trees_finite_ratio_is_refused_naming_it(
    kind: str, oversub: float, says: str
) -> None:
    # a switch's oversubscription=4 divided its bandwidth by 4 though the docs give it to fat_tree only, and
    # inf divided it to 0: a ZeroDivisionError traceback
    with pytest.raises(TopologyError, match=re.escape(says)):
        Dimension(kind=kind, size=2, bandwidth_gbps=50.0, latency_ns=1_000, oversubscription=oversub)
    assert Dimension(kind="fat_tree", size=2, bandwidth_gbps=50.0, latency_ns=1, oversubscription=4.0)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "topology.node_of_rank=[0,-1]",
            "topology.node_of_rank: rank 1 is placed on node -1, and the topology has nodes 0-1",
        ),
        (
            "topology.node_of_rank=[0,5]",
            "topology.node_of_rank: rank 1 is placed on node 5, and the topology has nodes 0-1",
        ),
        ("topology.dims.0.size=0", "topology.dims[0].size: only the outermost dimension may have size 0"),
    ],
)
def test_a_node_the_topology_lacks_or_an_inner_size_of_0_is_refused_naming_its_key(
    override: str, says: str
) -> None:
    # nodes -1 and 5 of two_node_ib's 2 were taken as nodes of their own; the size's key read "topology.size"
    from test_scale import compose_replay

    with pytest.raises(ConfigError, match=re.escape(says)):
        compose_replay("topology=two_node_ib", override)
    assert compose_replay("topology=two_node_ib", "topology.node_of_rank=[1,0]").topology.node_of_rank == [
        1,
        0,
    ]


@pytest.mark.parametrize(("bandwidth_gbps", "latency_ns"), [(1e-300, 1_000), (50.0, 9 * 10**18)])
def test_a_transfer_time_beyond_the_simulators_clock_is_a_config_error_not_an_overflow(
    tmp_path: Path, bandwidth_gbps: float, latency_ns: int
) -> None:
    # bandwidth_gbps=1e-300 timed 1 MiB at 1e303 ns and the simulator's int64 clock raised an OverflowError
    rt = one_collective_run(tmp_path, 2)
    topo = Topology(
        name="t",
        dims=(Dimension(kind="switch", size=0, bandwidth_gbps=bandwidth_gbps, latency_ns=latency_ns),),
    )
    with pytest.raises(
        ConfigError,
        match=r"topology t: the network model times one all_reduce of 1,048,576 B among 2 ranks at .* s, "
        r"beyond the simulator's clock",
    ):
        replayed_transfer(rt, topology=topo)


def test_a_flat_algorithm_across_nodes_runs_at_the_slowest_dimension_with_oversubscription(
    tmp_path: Path,
) -> None:
    rt = one_collective_run(tmp_path, 4)
    expected = 2 * 3 * (2_000 + S / (4 * (25.0 / 4)))
    assert replayed_transfer(rt, topology=two_level(oversub=4.0), algorithm="ring") == [round(expected)]


def test_block_round_robin_and_explicit_placement_put_ranks_on_the_expected_nodes() -> None:
    dims = two_level(per_node=4, nodes=2).dims
    block = Topology(name="b", dims=dims)
    rr = Topology(name="r", dims=dims, placement="round_robin")
    explicit = Topology(name="e", dims=dims, node_of_rank=(1, 1, 0, 0, 1, 0, 0, 1))
    assert [block.coords(r)[1] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [rr.coords(r)[1] for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [explicit.coords(r) for r in range(4)] == [(0, 1), (1, 1), (0, 0), (1, 0)]


def test_a_rank_that_does_not_fit_the_topology_is_a_config_error(tmp_path: Path) -> None:
    rt = one_collective_run(tmp_path, 8)
    with pytest.raises(ConfigError, match="does not fit"):
        simulate(rt, topology=two_level(per_node=2, nodes=2), comm_mode="model")


def test_bad_dimension_values_name_the_field() -> None:
    with pytest.raises(TopologyError, match="bandwidth_gbps"):
        Dimension(kind="switch", size=0, bandwidth_gbps=0.0, latency_ns=1)
    with pytest.raises(TopologyError, match="kind"):
        Dimension(kind="torus", size=0, bandwidth_gbps=1.0, latency_ns=1)


def test_a_topology_built_in_python_fails_with_a_skewlens_error() -> None:
    # it was a bare ValueError: a notebook's `except SkewlensError` around a what-if loop let it through
    with pytest.raises(SkewlensError, match="bandwidth_gbps: must be > 0, got 0"):
        Dimension(kind="switch", size=0, bandwidth_gbps=0.0, latency_ns=1)
    with pytest.raises(SkewlensError, match="dims: a topology needs at least one dimension"):
        Topology(name="t", dims=())
    with pytest.raises(ValueError, match="placement"):  # still a ValueError, for callers that caught one
        Topology(
            name="t",
            dims=(Dimension(kind="switch", size=0, bandwidth_gbps=1.0, latency_ns=1),),
            placement="x",
        )


def test_point_to_point_costs_latency_plus_size_over_bandwidth_and_ring_hops() -> None:
    sw = ModelTiming(flat("switch"))
    assert sw.p2p_time_ns(0, 1, S) == round(ALPHA + S / BW)
    ring = ModelTiming(
        Topology(name="r", dims=(Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA),))
    )
    assert ring.p2p_time_ns(0, 3, S) == round(3 * ALPHA + S / BW)
    assert ring.p2p_time_ns(0, 7, S) == round(ALPHA + S / BW)


def test_a_point_to_point_message_across_an_oversubscribed_fat_tree_gets_its_effective_bandwidth() -> None:
    # ranks 0 and 2 sit on different nodes: a 4:1 oversubscribed 25 GB/s uplink gives 6.25 GB/s, to a send
    # as to a two-member broadcast between the same ranks
    timing = ModelTiming(two_level(oversub=4.0))
    assert timing.p2p_time_ns(0, 2, S) == round(2_000 + S / (25.0 / 4))
    assert timing.p2p_time_ns(0, 2, S) == timing.collective_time_ns(CommType.BROADCAST, S, (0, 2))
    assert timing.p2p_time_ns(0, 1, S) == round(300 + S / 200.0)


def test_concurrent_collectives_sharing_node_uplinks_share_their_bandwidth_under_contention(
    tmp_path: Path,
) -> None:
    # groups (0,2) and (1,3) both cross between node 0 = {0,1} and node 1 = {2,3} at the same time, over the
    # one link each node has; with a link per rank (the default) they do not meet
    rt = one_collective_run(tmp_path, 4, groups={"a": (0, 2), "b": (1, 3)})
    one_link = two_level(links=1)
    alone = replayed_transfer(rt, topology=one_link, algorithm="ring")
    shared = replayed_transfer(rt, topology=one_link, algorithm="ring", contention=True)
    assert alone[0] == alone[1] == round(2 * (2_000 + S / (2 * 25.0)))
    assert shared == [2 * alone[0], 2 * alone[1]]
    assert replayed_transfer(rt, topology=two_level(), algorithm="ring", contention=True) == alone


def test_concurrent_sends_from_one_rank_share_its_switch_port_only_under_contention(tmp_path: Path) -> None:
    # docs/replay.md: rank 0 sends 1 MiB to each of ranks 1-4 at once (a stream each), the recvs posted at 0.
    # By default each pair is charged alone, α + S/B = 500 + 1,048,576 / 50 = 21,471.52 ns, though the port
    # carries 4 MiB; under contention the four flows share rank 0's port, each at a quarter: 4 x 21,472
    b = RunBuilder(world_size=5)
    for peer in range(1, 5):
        b.rank(0).send(peer, S, 1_000, start_ns=0, stream=peer)
        b.rank(peer).recv(0, S, 1_000, start_ns=0)
    rt = load_run(b.write(tmp_path / "run"))
    ends = {}
    for contention in (False, True):
        res = simulate(rt, comm_mode="model", topology=flat(), algorithm="ring", contention=contention)
        ends[contention] = [
            int(res.end_ns[p][rt.ranks[p].rows_of_type(NodeType.COMM_RECV)[0]]) for p in range(1, 5)
        ]
    assert ends[False] == [21_472] * 4
    assert ends[True] == [85_888] * 4


def test_contention_does_not_slow_transfers_on_disjoint_links(tmp_path: Path) -> None:
    rt = one_collective_run(tmp_path, 4, groups={"a": (0, 1), "b": (2, 3)})
    topo = two_level()
    assert replayed_transfer(rt, topology=topo, contention=True) == replayed_transfer(rt, topology=topo)


def test_model_mode_needs_a_topology_and_a_known_algorithm(tmp_path: Path) -> None:
    rt = one_collective_run(tmp_path, 2)
    with pytest.raises(ConfigError, match="topology"):
        simulate(rt, comm_mode="model")
    with pytest.raises(ConfigError, match="algorithm"):
        simulate(rt, comm_mode="model", topology=flat(), algorithm="magic")
    assert math.isfinite(replayed_transfer(rt, topology=flat())[0])


def test_chained_all_reduces_of_the_benchmark_trace_add_up_to_n_times_the_closed_form(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "sim_throughput", Path(__file__).parents[1] / "benchmarks" / "sim_throughput.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run_dir = bench.write_run(tmp_path / "bench", "allreduce", 8, 5)
    rt = load_run(run_dir)
    res = simulate(rt, topology=bench.ring_topology(), comm_mode="model", algorithm="ring")
    one = round(2 * 7 * (500 + S / (8 * 50.0)))
    assert res.makespan_ns == 5 * one


def shipped_topology(name: str) -> TopologyConfig:
    """A ``conf/topology/`` entry read with the replay's schema."""
    path = CONF_DIR / "topology" / f"{name}.yaml"
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TopologyConfig), OmegaConf.load(path)))
    assert isinstance(obj, TopologyConfig)
    return obj


def both_ways(rt: RunTrace, cfg: TopologyConfig) -> tuple[list[int], list[int]]:
    """Transfers without and with contention."""
    kw = {"topology": cfg.to_topology(), "algorithm": cfg.algorithm}
    return replayed_transfer(rt, **kw), replayed_transfer(rt, contention=True, **kw)


def test_the_dp_all_reduces_of_tp8_dp2_on_dgx_h100_take_the_ring_time_on_a_nic_each_in_both_modes(
    tmp_path: Path,
) -> None:
    # 16 ranks as tp=8 x dp=2: the 8 dp groups (i, i+8) all_reduce at once between the two nodes, each GPU on
    # its own NDR NIC (8 per node), so they do not share one: contention modelled the node as one NIC (8x)
    cfg = shipped_topology("dgx_h100_8x")
    ib = cfg.dims[1]
    assert cfg.to_topology().links_per_node(1) == 8
    rt = one_collective_run(tmp_path, 16, groups={f"dp{i}": (i, i + 8) for i in range(8)})
    p = 2
    textbook = 2 * (p - 1) * (ib.latency_ns + S / (p * ib.bandwidth_gbps))
    alone, contended = both_ways(rt, cfg)
    assert alone == contended == [round(textbook)] * 8


def test_a_hierarchical_gather_or_scatter_on_dgx_h100_charges_the_roots_port_every_other_members_piece() -> (
    None
):
    # NCCL's PXN: the pieces of members on other nodes cross on the NICs of the root's node, then go on to
    # the root over NVLink, so the root's port takes (p − 1)/p of S, not (p0 − 1)/p0 of it (half as much at
    # p0 = 2, which is what was charged). A gather's comm_size is a member's piece: S = 8 MiB of 8 pieces
    cfg = shipped_topology("dgx_h100_8x")
    nv, ib = cfg.dims
    timing = ModelTiming(cfg.to_topology(), algorithm=cfg.algorithm)
    s = 8 * S
    a0, b0, a1, b1 = nv.latency_ns, nv.bandwidth_gbps, ib.latency_ns, ib.bandwidth_gbps
    # 2 nodes x 4 (ranks 0-3, 8-11): p0 = 4, p1 = 2, each GPU its own NIC: L = (p1 − 1)/(p0·p1) = 1/8
    two_by_four = [0, 1, 2, 3, 8, 9, 10, 11]
    want = 3 * a0 + 7 / 8 * s / b0 + 1 * (a1 + s / 8 / b1)
    assert timing.collective_time_ns(CommType.GATHER, S, two_by_four) == round(want) == 44_383
    assert timing.collective_time_ns(CommType.SCATTER, s, two_by_four) == round(want)
    # was 3 (α0 + S/(4 B0)) + α1 + S/(8 B1): 42,053 ns
    # 4 nodes x 2 (ranks 0, 1, 8, 9, 16, 17, 24, 25): p0 = 2, p1 = 4, L = 3/8
    four_by_two = [0, 1, 8, 9, 16, 17, 24, 25]
    want = a0 + 7 / 8 * s / b0 + 3 * a1 + 3 / 8 * s / b1
    assert timing.collective_time_ns(CommType.GATHER, S, four_by_two) == round(want) == 94_926
    assert timing.collective_time_ns(CommType.SCATTER, s, four_by_two) == round(want)
    # was α0 + S/(2 B0) + 3 α1 + 3/8 S / B1: 87,935 ns


def test_an_uneven_hierarchical_gather_charges_the_roots_port_its_members_pieces_not_full_nodes() -> None:
    # 4 ranks on node 0 and 2 on node 1 (p = 6, p0 = 4, p1 = 2): the root's port takes the other 5 members'
    # pieces, 5/6 of S, not the 7/8 of S that p0 · p1 = 8 members would put there. Node 1's 2 members import
    # the other 4 pieces over their own NICs: L = (6 − 2)/(6 · 2) = 1/3
    cfg = shipped_topology("dgx_h100_8x")
    nv, ib = cfg.dims
    timing = ModelTiming(cfg.to_topology(), algorithm=cfg.algorithm)
    a0, b0, a1, b1 = nv.latency_ns, nv.bandwidth_gbps, ib.latency_ns, ib.bandwidth_gbps
    s = 6 * S
    want = 3 * a0 + 5 / 6 * s / b0 + (a1 + 1 / 3 * s / b1)
    assert timing.collective_time_ns(CommType.GATHER, S, [0, 1, 2, 3, 8, 9]) == round(want)
    assert timing.collective_time_ns(CommType.SCATTER, s, [0, 1, 2, 3, 8, 9]) == round(want)


def test_a_hierarchical_gather_with_one_member_a_node_pays_no_phase_inside_the_nodes() -> None:
    # ranks 0 and 9 (slot 0 of node 0, slot 1 of node 1): p0 = 1, p1 = 2. Rank 9's piece reaches the root
    # through the NIC of the root's rail, never through the root's NVLink port: the inter-node phase alone,
    # α1 + L · S / B1 with L = (2 − 1)/(2 · 1) = 1/2
    cfg = shipped_topology("dgx_h100_8x")
    ib = cfg.dims[1]
    timing = ModelTiming(cfg.to_topology(), algorithm=cfg.algorithm)
    s = 2 * S
    want = ib.latency_ns + 1 / 2 * s / ib.bandwidth_gbps
    assert timing.collective_time_ns(CommType.GATHER, S, [0, 9]) == round(want)
    assert timing.collective_time_ns(CommType.SCATTER, s, [0, 9]) == round(want)


def test_a_hierarchical_all_reduce_on_two_node_ib_shares_the_one_link_in_both_timing_modes(
    tmp_path: Path,
) -> None:
    # 8 ranks, 4 per node: after the intra-node reduce-scatter the 4 inter-node rings (S/4 each) run at
    # once over the nodes' one HDR link, each at a quarter of it; the analytic cost gave each a whole link
    cfg = shipped_topology("two_node_ib")
    pcie, hdr = cfg.dims
    assert cfg.to_topology().links_per_node(1) == 1
    rt = one_collective_run(tmp_path, 8)
    p0, p1 = 4, 2
    intra = (p0 - 1) * (pcie.latency_ns + S / (p0 * pcie.bandwidth_gbps))
    ring_bw = hdr.bandwidth_gbps / p0
    inter = 2 * (p1 - 1) * (hdr.latency_ns + S / (p0 * p1 * ring_bw))
    alone, contended = both_ways(rt, cfg)
    assert alone == contended == [round(2 * intra + inter)]


def test_a_topology_file_without_links_per_node_loads_with_a_link_per_rank(tmp_path: Path) -> None:
    # the meaning such a file always had without contention: bandwidth_gbps per GPU, one ring each
    text = (CONF_DIR / "topology" / "two_node_ib.yaml").read_text()
    bare = "\n".join(line for line in text.splitlines() if "links_per_node" not in line)
    (tmp_path / "t.yaml").write_text(bare)
    obj = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(TopologyConfig), OmegaConf.load(tmp_path / "t.yaml"))
    )
    assert isinstance(obj, TopologyConfig)
    topo = obj.to_topology()
    assert topo.dims[1].links_per_node == 0 and topo.links_per_node(1) == 4
    assert [topo.link(r, 1)[1] for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    rt = one_collective_run(tmp_path, 8)
    pcie, hdr = obj.dims
    intra = 3 * (pcie.latency_ns + S / (4 * pcie.bandwidth_gbps))
    inter = 2 * (hdr.latency_ns + S / (8 * hdr.bandwidth_gbps))
    assert both_ways(rt, obj) == ([round(2 * intra + inter)], [round(2 * intra + inter)])


def test_ranks_of_a_node_are_spread_over_its_links_in_slot_order_and_a_bad_count_names_the_field() -> None:
    topo = two_level(per_node=8, nodes=2, links=2)
    assert [topo.link(r, 1) for r in (0, 3, 4, 7, 8, 15)] == [
        (1, 0, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 1, 0),
        (1, 0, 1),
        (1, 1, 1),
    ]
    # 16 ranks on 2 nodes: 4 on each link, each node importing half of S: 4 * (16 - 8) / (16 * 8)
    assert topo.outer_load(range(16), 1) == 4 * 8 / (16 * 8)
    # one rank on each link of each node: 1 * (4 - 2) / (4 * 2)
    assert topo.outer_load((0, 4, 8, 12), 1) == 2 / 8
    with pytest.raises(TopologyError, match=r"dims\[1\]\.links_per_node: .* 2 rank slots"):
        two_level(per_node=2, links=3)
    with pytest.raises(TopologyError, match=r"dims\[0\]\.links_per_node"):
        Topology(
            name="t",
            dims=(Dimension(kind="switch", size=0, bandwidth_gbps=1.0, latency_ns=0, links_per_node=2),),
        )
    with pytest.raises(TopologyError, match="links_per_node"):
        Dimension(kind="switch", size=0, bandwidth_gbps=1.0, latency_ns=0, links_per_node=-1)


def uneven_all_to_all_run(tmp_path: Path, *, uneven: bool = True) -> RunTrace:
    """4 ranks, one all_to_all of S bytes each whose splits send everything to rank 0 (rank 0's own S stays
    with it): ranks 1-3 send S and receive nothing, rank 0 receives 3 S. ``uneven=False``: the capture
    recorded no splits (as before it did)."""
    b = RunBuilder(world_size=4)
    for r in range(4):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
        peers = (0, 3 * S) if r == 0 else (S, 0)
        b.rank(r).collective(
            CommType.ALL_TO_ALL, comm_bytes=S, dur_ns=123_456, peer_bytes=peers if uneven else None
        )
    return load_run(b.write(tmp_path / "run"))


@pytest.mark.parametrize("algorithm", ["direct", "ring"])
def test_an_uneven_all_to_all_costs_what_its_busiest_port_carries(tmp_path: Path, algorithm: str) -> None:
    # rank 0 receives 3 S through one port: direct alpha + 3 S / B, ring (p - 1) alpha + 3 S / B; the even
    # formula (p - 1)/p S / B charged 0.75 S (a quarter of it: 21 us for 63 us direct, 24 for 65 ring)
    rt = uneven_all_to_all_run(tmp_path)
    busiest = {"direct": ALPHA + 3 * S / BW, "ring": 3 * ALPHA + 3 * S / BW}[algorithm]
    assert replayed_transfer(rt, topology=flat(), algorithm=algorithm) == [round(busiest)]
    even = {"direct": ALPHA + 3 / 4 * S / BW, "ring": 3 * (ALPHA + S / (4 * BW))}[algorithm]
    flat_run = uneven_all_to_all_run(tmp_path / "even", uneven=False)
    assert replayed_transfer(flat_run, topology=flat(), algorithm=algorithm) == [round(even)]


@pytest.mark.parametrize(
    ("algorithm", "closed_form"), [("ring", 7 * (ALPHA + S / BW)), ("direct", ALPHA + 7 * S / BW)]
)
def test_a_captured_scatter_costs_the_p_pieces_its_root_sends(
    tmp_path: Path, algorithm: str, closed_form: float
) -> None:
    # the capture records each member's piece (S here) on every member, the root included: the root sends
    # 8 S, of which 7/8 leave it (before: S in all, 7/8 S / B, an eighth of it)
    rt = one_collective_run(tmp_path, EIGHT, CommType.SCATTER)
    assert replayed_transfer(rt, topology=flat(), algorithm=algorithm) == [round(closed_form)]


def one_pair_all_to_all_run(tmp_path: Path, dst: int, nbytes: int = 280_000) -> RunTrace:
    """4 ranks (2 nodes of 2 on ``two_level()``), one all_to_all in which rank 0 sends ``nbytes`` to ``dst``
    only and nobody else sends anything (ranks outside the pair record no splits: even, of 0 bytes)."""
    b = RunBuilder(world_size=4)
    for r in range(4):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
        send, recv = [0] * 4, [0] * 4
        if r == 0:
            send[dst] = nbytes
        if r == dst:
            recv[0] = nbytes
        kw: dict = {}
        if r in (0, dst):
            kw = {"peer_bytes": (sum(send), sum(recv)), "peer_splits": (send, recv)}
        b.rank(r).collective(CommType.ALL_TO_ALL, comm_bytes=nbytes if r == 0 else 0, dur_ns=123_456, **kw)
    return load_run(b.write(tmp_path / f"run{dst}"))


@pytest.mark.parametrize("algorithm", ["hierarchical", "direct", "ring"])
def test_an_uneven_all_to_all_costs_only_the_links_its_pairs_cross(tmp_path: Path, algorithm: str) -> None:
    # rank 0 -> rank 1 stays on node 0's switch: alpha0 + 280,000 / B0; rank 0 -> rank 2 crosses to node 1:
    # alpha1 + 280,000 / B1. Before, both cost the busiest port over the slowest dimension whatever the
    # pair (17,200 ns ring / hierarchical, 13,200 direct for either)
    intra = round(300 + 280_000 / 200.0)
    inter = round(2_000 + 280_000 / 25.0)
    assert replayed_transfer(
        one_pair_all_to_all_run(tmp_path, 1), topology=two_level(), algorithm=algorithm
    ) == [intra]
    assert replayed_transfer(
        one_pair_all_to_all_run(tmp_path, 2), topology=two_level(), algorithm=algorithm
    ) == [inter]


def all_to_all_run(tmp_path: Path, world: int, *, one_more_to: int | None = None) -> RunTrace:
    """One all_to_all of S bytes per member; with ``one_more_to``, every member records its splits, even
    but for one byte more to that member."""
    b = RunBuilder(world_size=world)
    part = S // world
    for r in range(world):
        b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
        kw: dict = {}
        if one_more_to is not None:
            send = [part + (d == one_more_to) for d in range(world)]
            recv = [part + (r == one_more_to) for _ in range(world)]
            kw = {"peer_bytes": (sum(send) - send[r], sum(recv) - recv[r]), "peer_splits": (send, recv)}
        b.rank(r).collective(CommType.ALL_TO_ALL, comm_bytes=S, dur_ns=123_456, **kw)
    return load_run(b.write(tmp_path / f"run{one_more_to}"))


@pytest.mark.parametrize("algorithm", ["hierarchical", "ring", "direct", "tree", "halving_doubling"])
def test_an_even_all_to_all_across_nodes_costs_the_link_its_members_share_as_its_pairs_do(
    tmp_path: Path, algorithm: str
) -> None:
    # 8 ranks, 4 on each node's one link: each member sends S/8 to each of the 4 on the other node, so the
    # link carries 4 * 4 * S/8 = 2 S each way (a member's port: S/8 to each of the 6 in other slots). Before,
    # even splits got the flat formula at the link's bandwidth as if each member had a link of its own
    # (ring and hierarchical 50.7 us here, direct 38.7, tree and halving_doubling 68.9), while the same
    # traffic with one byte more to one member was costed link by link (85.9 us): up to 2.2x for one byte
    topo = two_level(per_node=4, links=1)
    shared = round(2_000 + 2 * S / 25.0)
    assert replayed_transfer(all_to_all_run(tmp_path, 8), topology=topo, algorithm=algorithm) == [shared]
    nearly = replayed_transfer(all_to_all_run(tmp_path, 8, one_more_to=0), topology=topo, algorithm=algorithm)
    assert nearly[0] - shared in range(2)  # rank 0's link carries 4 bytes more (0.16 ns)
    # a link per member: each sends half of S over its own link, S/2 / B1
    own = replayed_transfer(all_to_all_run(tmp_path, 8), topology=two_level(per_node=4), algorithm=algorithm)
    assert own == [round(2_000 + S / 2 / 25.0)]


@pytest.mark.parametrize(
    ("comm_type", "message", "phases"),
    [(CommType.ALL_REDUCE, S, 2), (CommType.REDUCE_SCATTER, S, 1), (CommType.ALL_GATHER, 8 * S, 1)],
)
@pytest.mark.parametrize("links", [1, 0], ids=["a-link-a-node", "a-link-a-gpu"])
def test_halving_doubling_across_nodes_costs_each_step_at_its_busiest_link(
    tmp_path: Path, comm_type: CommType, message: int, phases: int, links: int
) -> None:
    # 8 ranks, 4 a node: recursive halving pairs members 4 apart first (across nodes: each sends half the
    # message, M/2), then 2 and 1 apart (inside a node: M/4, M/8, each over its own port); on one link a
    # node its 4 members' halves share it. Before, the flat formula charged 2 L alpha + 2 (p-1)/p M / B at
    # the slowest dimension for every step: all_reduce 85.4 us here, now 176.9 us with one link a node
    # (its 4 members share it) and 51.1 us with a link a GPU (the steps inside a node go at its 200 GB/s)
    outer = (4 if links == 1 else 1) * message / 2
    step = (2_000 + outer / 25.0) + (300 + message / 4 / 200.0) + (300 + message / 8 / 200.0)
    rt = one_collective_run(tmp_path, EIGHT, comm_type)
    got = replayed_transfer(rt, topology=two_level(per_node=4, links=links), algorithm="halving_doubling")
    assert got == [round(phases * step)]


@pytest.mark.parametrize(
    ("comm_type", "link_bytes", "phases"),
    [(CommType.ALL_REDUCE, 2 * S, 2), (CommType.REDUCE_SCATTER, 2 * S, 1), (CommType.ALL_GATHER, 16 * S, 1)],
)
def test_a_direct_collective_across_nodes_costs_what_each_nodes_shared_link_carries(
    tmp_path: Path, comm_type: CommType, link_bytes: int, phases: int
) -> None:
    # 8 ranks, 4 on each node's one link; every member sends its part to each of the 4 on the other node
    # (an all_reduce's or reduce_scatter's S/8, an all_gather's piece S): the link carries 4 * 4 parts each
    # way, per phase. Before, the flat formula charged alpha + (p - 1)/p of the message at the link's
    # bandwidth as if each member had a link of its own (all_reduce 77.4 us here against 171.8 us)
    rt = one_collective_run(tmp_path, EIGHT, comm_type)
    got = replayed_transfer(rt, topology=two_level(per_node=4, links=1), algorithm="direct")
    assert got == [round(phases * (2_000 + link_bytes / 25.0))]


def test_a_collective_of_one_rank_costs_nothing_whatever_the_algorithm() -> None:
    # algorithms: "p <= 1 costs 0"; the tree formula 2Lα + 2S/B would otherwise charge 2S/B for p = 1
    for algorithm in ("ring", "tree", "halving_doubling", "direct"):
        assert flat_time_ns(algorithm, CommType.ALL_REDUCE, nbytes=S, p=1, alpha=ALPHA, bw=BW) == 0.0


def test_a_bruck_all_to_all_sends_half_its_bytes_in_each_of_its_log2_p_rounds() -> None:
    # halving_doubling all_to_all (Bruck): L(α + S/(2B)), L = ⌈log2 8⌉ = 3
    got = ModelTiming(flat(), algorithm="halving_doubling").collective_time_ns(
        CommType.ALL_TO_ALL, S, range(8)
    )
    assert got == round(3 * (ALPHA + S / (2 * BW)))


def test_a_direct_broadcast_root_sends_the_message_to_each_of_the_other_ranks() -> None:
    # direct broadcast (root sends to all): α + (p − 1)·S/B
    got = ModelTiming(flat(), algorithm="direct").collective_time_ns(CommType.BROADCAST, S, range(8))
    assert got == round(ALPHA + 7 * S / BW)


def test_a_hierarchical_all_reduce_without_an_outer_load_takes_whole_nodes_on_links_of_their_own() -> None:
    # outer_load None: L = (p1 − 1)/(p0·p1); p0 = 4, p1 = 2: the inter-node phase is (p1−1)α1 + S/(8·B1),
    # twice, plus the intra-node reduce-scatter and all-gather (p0 − 1)(α0 + S/(p0·B0)) each
    got = hierarchical_time_ns(
        CommType.ALL_REDUCE, nbytes=S, p0=4, p1=2, inner=(300.0, 200.0), outer=(2_000.0, 25.0)
    )
    intra = 3 * (300 + S / (4 * 200.0))
    phase = 1 * 2_000 + S / (8 * 25.0)
    assert got == pytest.approx(2 * intra + 2 * phase)


def test_explicit_placement_refuses_a_node_past_the_last_and_a_node_holding_more_ranks_than_slots() -> None:
    dims = (
        Dimension(kind="switch", size=2, bandwidth_gbps=BW, latency_ns=ALPHA),
        Dimension(kind="fat_tree", size=2, bandwidth_gbps=BW, latency_ns=ALPHA),
    )
    with pytest.raises(TopologyError, match="rank 1 is placed on node 2"):  # nodes are 0 and 1
        Topology(name="t", dims=dims, node_of_rank=(0, 2))
    crowded = Topology(name="t", dims=dims, node_of_rank=(0, 0, 0))  # a node has 2 slots
    assert crowded.coords(1) == (1, 0)
    with pytest.raises(TopologyError, match="node 0 holds more than 2 ranks"):
        crowded.coords(2)


def test_the_outer_load_is_that_of_a_nodes_busiest_link() -> None:
    # nodes of 4 slots with 2 NICs: slots 0-1 on NIC 0, 2-3 on NIC 1. Members 0, 1, 2 (node 0) and 4, 5, 6
    # (node 1): p = 6, m = 3 per node, k = 2 members on the busiest NIC: L = k(p − m)/(p·m) = 2·3/18
    topo = Topology(
        name="t",
        dims=(
            Dimension(kind="switch", size=4, bandwidth_gbps=BW, latency_ns=ALPHA),
            Dimension(kind="fat_tree", size=2, bandwidth_gbps=BW, latency_ns=ALPHA, links_per_node=2),
        ),
    )
    assert topo.outer_load([0, 1, 2, 4, 5, 6], 1) == pytest.approx(2 * 3 / 18)


def test_round_robin_on_a_topology_of_as_many_nodes_as_needed_deals_the_ranks_to_the_nodes_they_fill(
    tmp_path: Path,
) -> None:
    # 8 ranks on nodes of 4, the node count left to the run (size 0, as the bundled dgx_h100_8x): round_robin
    # puts the even ranks on node 0 and the odd on node 1, 4 a node, as on a topology of 2 nodes given;
    # it put every rank on a node of its own (slot 0), so no traffic crossed a node's switch
    rt = one_collective_run(tmp_path, 8)
    p0, p1 = 4, 2
    expected = 2 * ((p0 - 1) * (300 + S / (p0 * 200.0)) + (p1 - 1) * 2_000 + (p1 - 1) / (p0 * p1) * S / 25.0)
    for nodes in (0, 2):
        topo = Topology(name="rr", dims=two_level(per_node=4, nodes=nodes).dims, placement="round_robin")
        assert replayed_transfer(rt, topology=topo, algorithm="hierarchical") == [round(expected)], nodes


def test_a_message_on_a_ring_of_as_many_ranks_as_needed_crosses_the_hops_between_them(tmp_path: Path) -> None:
    # 8 ranks on the bundled `ring` (size 0): rank 0 to rank 2 is 2 hops, to rank 6 2 hops the other way,
    # to rank 4 4 hops; every message was charged 1 hop (the ring's size taken as the distance + 1)
    b = RunBuilder(world_size=8)
    for dst in (2, 4, 6):
        b.rank(0).send(dst, S, 1_000)
        b.rank(dst).recv(0, S, 1_000)
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt, comm_mode="model", topology=flat("ring"), algorithm="ring")
    transfers = [int(e - a) for a, e in zip(res.p2p_arrival_ns, res.p2p_end_ns, strict=True)]
    assert sorted(transfers) == [round(2 * ALPHA + S / BW)] * 2 + [round(4 * ALPHA + S / BW)]


def test_a_topology_sized_for_a_run_keeps_every_node_its_explicit_placement_names() -> None:
    # nodes 0 and 5 of a fat tree of as many nodes as needed: 4 ranks fill 2 nodes of 2, and node 5 stays
    topo = Topology(name="e", dims=two_level(per_node=2, nodes=0).dims, node_of_rank=(0, 0, 5, 5))
    assert [topo.sized(4).coords(r) for r in range(4)] == [(0, 0), (1, 0), (0, 5), (1, 5)]
    assert topo.sized(4).dims[1].size == 6


def test_direct_on_a_fully_connected_dimension_sends_to_every_member_at_once_over_its_own_link(
    tmp_path: Path,
) -> None:
    # a link between every pair (the fully_connected preset, whose algorithm is direct): each member's p − 1
    # parts leave over p − 1 links at once, so a part's time is the phase's; through one port (a switch)
    # the parts queue. 8 ranks: an all_to_all sends S/8 to each other member, a broadcast's root S to each
    p = 8
    expected = {
        CommType.ALL_TO_ALL: ALPHA + S / p / BW,
        CommType.ALL_REDUCE: 2 * ALPHA + 2 * S / p / BW,
        CommType.BROADCAST: ALPHA + S / BW,
    }
    for comm_type, t in expected.items():
        rt = one_collective_run(tmp_path / comm_type.name, p, comm_type)
        got = replayed_transfer(rt, topology=flat("fully_connected"), algorithm="direct")
        assert got == [round(t)] * len(got), comm_type
    switch = replayed_transfer(one_collective_run(tmp_path / "sw", p), topology=flat(), algorithm="direct")
    assert switch == [round(2 * ALPHA + 2 * (p - 1) / p * S / BW)]


def test_only_direct_and_only_a_group_wholly_on_fully_connected_links_sends_its_parts_at_once(
    tmp_path: Path,
) -> None:
    # a tree on a fully_connected dimension forwards as it does on a switch; a broadcast of 8 ranks over a
    # fully_connected inner dimension of 4 and a switch between the 2 nodes still queues the root's copies
    # through the switch's port: neither takes the bandwidth of p − 1 links at once
    p = 8
    rt = one_collective_run(tmp_path / "bc", p, CommType.BROADCAST)
    tree = flat_time_ns("tree", CommType.BROADCAST, nbytes=S, p=p, alpha=ALPHA, bw=BW)
    assert replayed_transfer(rt, topology=flat("fully_connected"), algorithm="tree") == [round(tree)]
    mixed = Topology(
        name="mixed",
        dims=(
            Dimension(kind="fully_connected", size=4, bandwidth_gbps=BW, latency_ns=ALPHA),
            Dimension(kind="switch", size=2, bandwidth_gbps=BW, latency_ns=ALPHA),
        ),
    )
    direct = flat_time_ns("direct", CommType.BROADCAST, nbytes=S, p=p, alpha=ALPHA, bw=BW)
    assert direct == ALPHA + (p - 1) * S / BW
    assert replayed_transfer(rt, topology=mixed, algorithm="direct") == [round(direct)]


def test_a_run_that_part_fills_its_last_node_is_given_that_node_too() -> None:
    # 6 ranks on nodes of 4 (as many as needed) fill 2 nodes, the second half full: round_robin deals
    # ranks 0, 2, 4 to node 0 and 1, 3, 5 to node 1
    topo = Topology(name="rr", dims=two_level(per_node=4, nodes=0).dims, placement="round_robin")
    sized = topo.sized(6)
    assert sized.dims[-1].size == 2
    assert [sized.coords(r)[-1] for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert topo.sized(8).dims[-1].size == 2 and topo.sized(9).dims[-1].size == 3


def test_a_topology_given_lists_from_python_is_hashable_and_equal_to_one_given_tuples() -> None:
    switch = Dimension(kind="switch", size=2, bandwidth_gbps=100.0, latency_ns=500)
    nic = Dimension(kind="switch", size=2, bandwidth_gbps=25.0, latency_ns=2_000)
    listed = Topology(name="t", dims=[switch, nic], node_of_rank=[0, 1, 0, 1])  # type: ignore[arg-type]
    tupled = Topology(name="t", dims=(switch, nic), node_of_rank=(0, 1, 0, 1))
    assert listed == tupled
    assert hash(listed) == hash(tupled)
    assert {listed: "a"}[tupled] == "a"
    assert listed.coords(1) == tupled.coords(1) == (0, 1)
