"""Network-model costs the other tests leave unchecked (found by mutation testing).

Every expected time is written out from the formulas of ``skewlens.replay.network.algorithms`` and
``skewlens.replay.comm`` (``α + bytes / B`` per link, bandwidth scaled and latency added by a network
slowdown), not read from a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from skewlens.profiler.store import load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType
from skewlens.replay.comm import ModelTiming
from skewlens.replay.lower import collective_bytes
from skewlens.replay.network.topology import Dimension, Topology
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

S = 1_048_576  # bytes
BW = 50.0  # GB/s = bytes/ns
ALPHA = 500  # ns


def two_level(per_node: int = 2, nodes: int = 2, links: int = 0) -> Topology:
    """Nodes of ``per_node`` ranks on a 200 GB/s, 300 ns switch, joined by a 25 GB/s, 2 us fat tree."""
    return Topology(
        name="two-level",
        dims=(
            Dimension(kind="switch", size=per_node, bandwidth_gbps=200.0, latency_ns=300),
            Dimension(
                kind="fat_tree", size=nodes, bandwidth_gbps=25.0, latency_ns=2_000, links_per_node=links
            ),
        ),
    )


class Slower:
    """A network slowdown on every link: bandwidth times ``factor``, ``extra`` ns more latency."""

    def __init__(self, factor: float, extra: int) -> None:
        self.factor, self.extra = factor, extra

    def comm_adjust(self, ranks: Sequence[int], step: int, on_dim: object = None) -> tuple[float, int]:
        del ranks, step, on_dim
        return self.factor, self.extra


def test_a_gather_of_eight_pieces_moves_the_eight_pieces_its_root_collects() -> None:
    # comm_size of a gather is one member's piece: the message S of the ring formula is 8 pieces
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    got = ModelTiming(flat, algorithm="ring").collective_time_ns(CommType.GATHER, S, range(8))
    assert got == round(7 * (ALPHA + 8 * S / (8 * BW)))


def test_a_tree_all_reduce_moves_twice_the_message_through_each_port_never_beating_the_ring() -> None:
    # NCCL's double binary tree: a rank sends S/2 up and S/2 to each of two children in the tree it is
    # interior in, S/2 up in the other: 2 S through its port, which NCCL's tuning model charges too (its
    # algorithm bandwidth is half the bus bandwidth). No all_reduce moves less than the ring's 2 (p-1)/p S
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=0),))
    big = 64 * S
    tree = ModelTiming(flat, algorithm="tree").collective_time_ns(CommType.ALL_REDUCE, big, range(16))
    ring = ModelTiming(flat, algorithm="ring").collective_time_ns(CommType.ALL_REDUCE, big, range(16))
    assert tree == round(2 * big / BW)
    assert tree >= ring == round(2 * 15 / 16 * big / BW)


def test_a_tree_all_reduce_on_a_ring_network_pays_up_to_half_the_ring_in_hops_per_message() -> None:
    ring = Topology(name="r", dims=(Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA),))
    got = ModelTiming(ring, algorithm="tree").collective_time_ns(CommType.ALL_REDUCE, S, range(8))
    hops = 8 // 2
    assert got == round(2 * 3 * (hops * ALPHA) + 2 * S / BW)


def test_a_message_between_ranks_that_differ_in_both_dimensions_goes_at_the_slower_ones_bandwidth() -> None:
    # rank 1 is slot 1 of node 0, rank 2 slot 0 of node 1: the pair crosses the switch and the fat tree
    timing = ModelTiming(two_level())
    assert timing.p2p_time_ns(1, 2, S) == round(max(300, 2_000) + S / min(200.0, 25.0))


def test_an_all_to_all_whose_pairs_all_send_to_one_rank_costs_what_that_ranks_links_receive() -> None:
    # ranks 1, 2, 3 each send S to rank 0 (node 0 = {0, 1}, node 1 = {2, 3}, a link per rank): rank 0's
    # fat-tree link receives 2 S (from 2 and 3), its switch port 2 S (from 1 and 3); each sender sends S
    timing = ModelTiming(two_level(), algorithm="direct")
    got = timing.collective_time_ns(
        CommType.ALL_TO_ALL, S, (0, 1, 2, 3), pairs=[(1, 0, S), (2, 0, S), (3, 0, S)]
    )
    assert got == round(max(2_000 + 2 * S / 25.0, 300 + 2 * S / 200.0))


def test_a_network_slowdown_scales_both_levels_of_a_hierarchical_all_reduce() -> None:
    f, extra = 0.5, 100
    timing = ModelTiming(two_level(), algorithm="hierarchical", network_effects=Slower(f, extra))
    p0, p1 = 2, 2
    intra = (p0 - 1) * (300 + extra + S / (p0 * 200.0 * f))
    inter = 2 * (p1 - 1) * (2_000 + extra + S / (p0 * p1 * 25.0 * f))
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4)) == round(2 * intra + inter)


def test_a_network_slowdown_scales_the_links_of_an_all_to_all_across_nodes() -> None:
    # 8 ranks, 4 a node, a link each: a member sends S/8 to each of the 4 on the other node, S/2 over its
    # link (its switch port carries 6 S/8 at 200 GB/s: less time)
    f, extra = 0.5, 100
    timing = ModelTiming(two_level(per_node=4), algorithm="direct", network_effects=Slower(f, extra))
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(8))
    assert got == round(2_000 + extra + (S / 2) / (25.0 * f))


def test_a_slow_link_inside_a_node_slows_a_hierarchical_all_reduce_inside_nodes_not_between_them() -> None:
    # ranks 0 and 1 share node 0: their link is the switch's, which the intra-node rings cross; the
    # inter-node rings ({0, 2} and {1, 3}) never use it, so the fat tree keeps its bandwidth and latency
    f, extra = 0.25, 20_000
    slow = SlowdownModel([Slowdown(kind="network", links=((0, 1),), factor=f, latency_ns=extra)])
    timing = ModelTiming(two_level(), algorithm="hierarchical", network_effects=slow)
    p0, p1 = 2, 2
    intra = (p0 - 1) * (300 + extra + S / (p0 * 200.0 * f))
    inter = 2 * (p1 - 1) * (2_000 + S / (p0 * p1 * 25.0))
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4)) == round(2 * intra + inter)


def test_a_slow_link_between_nodes_slows_a_hierarchical_all_reduce_between_nodes_not_inside_them() -> None:
    f, extra = 0.25, 20_000
    slow = SlowdownModel([Slowdown(kind="network", links=((0, 2),), factor=f, latency_ns=extra)])
    timing = ModelTiming(two_level(), algorithm="hierarchical", network_effects=slow)
    p0, p1 = 2, 2
    intra = (p0 - 1) * (300 + S / (p0 * 200.0))
    inter = 2 * (p1 - 1) * (2_000 + extra + S / (p0 * p1 * 25.0 * f))
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4)) == round(2 * intra + inter)


def test_a_slow_link_inside_a_node_slows_an_all_to_all_across_nodes_on_the_switch_only() -> None:
    # 8 ranks, 4 a node, a link each: each member's fat-tree link carries S/2 at 25 GB/s, as before; its
    # switch port 6 S/8 (to the 6 members in another slot) at 200 GB/s, with 20 us more, and the S/8
    # between ranks 0 and 1 at a quarter of it (before: all 6 S/8 of every port at a quarter, 36,029 ns)
    slow = SlowdownModel([Slowdown(kind="network", links=((0, 1),), factor=0.25, latency_ns=20_000)])
    timing = ModelTiming(two_level(per_node=4), algorithm="direct", network_effects=slow)
    switch = 300 + 20_000 + max((6 * S / 8) / 200.0, (S / 8) / 50.0)
    fat_tree = 2_000 + (S / 2) / 25.0
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(8)) == round(max(switch, fat_tree))


def test_a_hierarchical_collective_over_three_levels_pays_the_outer_level_whose_busiest_link_is_slowest() -> (
    None
):
    # 8 ranks: nodes of 2 (200 GB/s switch), pairs of nodes (100 GB/s, 1 us), racks of 4 ranks (10 GB/s,
    # 5 us), a link per rank everywhere. Per byte of S the busiest link of a level carries (p - m)/(p m)
    # for units of m members: nodes 6/16 at 100 GB/s, racks 4/32 at 10 GB/s, the slower (0.0125 ns/B)
    topo = Topology(
        name="three",
        dims=(
            Dimension(kind="switch", size=2, bandwidth_gbps=200.0, latency_ns=300),
            Dimension(kind="fat_tree", size=2, bandwidth_gbps=100.0, latency_ns=1_000),
            Dimension(kind="fat_tree", size=0, bandwidth_gbps=10.0, latency_ns=5_000),
        ),
    )
    got = ModelTiming(topo, algorithm="hierarchical").collective_time_ns(CommType.ALL_REDUCE, S, range(8))
    p0, p1 = 2, 4  # 2 ranks on each of 4 nodes
    intra = (p0 - 1) * (300 + S / (p0 * 200.0))
    phase = (p1 - 1) * 5_000 + (4 / 32) * S / 10.0
    assert got == round(2 * intra + 2 * phase)
    # ranks 0, 1 (node 0, rack 0) and 4, 5 (node 2, rack 1) span the nodes and the racks, not the pairs of
    # nodes: 2 nodes of 2, the racks' links carrying (4 - 2)/(4 x 2) of S, the racks' latency
    pair = ModelTiming(topo, algorithm="hierarchical").collective_time_ns(
        CommType.ALL_REDUCE, S, (0, 1, 4, 5)
    )
    assert pair == round(2 * intra + 2 * (5_000 + (2 / 8) * S / 10.0))


def test_under_contention_a_group_shares_the_links_of_every_member_not_only_its_first(tmp_path: Path) -> None:
    # 3 nodes of 2 ranks, one fat-tree link a node; groups (0, 2), (3, 4), (1, 5) each join two nodes, and
    # every node's link carries two of them at once: each gets half, so each takes twice its lone time
    groups = {"a": (0, 2), "b": (3, 4), "c": (1, 5)}
    b = RunBuilder(world_size=6, groups=groups)
    for name, members in groups.items():
        for r in members:
            b.rank(r).compute("fwd", dur_ns=1_000_000, start_ns=0)
            b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=S, dur_ns=123_456, pg=name)
    rt = load_run(b.write(tmp_path / "run"))
    topo = two_level(per_node=2, nodes=3, links=1)
    res = simulate(rt, comm_mode="model", topology=topo, algorithm="ring", contention=True)
    got = [int(e - a) for a, e in zip(res.coll_arrival_ns, res.coll_end_ns, strict=True)]
    alone = 2 * (2_000 + S / (2 * 25.0))  # a two-member ring all_reduce over one fat-tree link
    assert got == [round(2 * alone)] * 3


def test_an_uneven_all_to_all_is_costed_from_its_busiest_port_rounded_up(tmp_path: Path) -> None:
    # three members; rank 0 sends 7 bytes to the others and receives 7 (the busiest port), ranks 1 and 2
    # move 3 each way: S = D * p / (p - 1) = 7 * 3 / 2 = 10.5 bytes, charged as 11 (never less than moved)
    b = RunBuilder(world_size=3)
    for r, moved in ((0, 7), (1, 3), (2, 3)):
        b.rank(r).collective(CommType.ALL_TO_ALL, comm_bytes=12, dur_ns=100, peer_bytes=(moved, moved))
    run = load_run(b.write(tmp_path / "run"))
    (inst,) = run.collectives
    assert collective_bytes(run, inst) == -(-7 * 3 // 2) == 11


def test_under_contention_a_recv_after_an_eager_send_takes_the_models_transfer_not_the_sends_duration(
    tmp_path: Path,
) -> None:
    # rank 0: a [0, 1) ms, then an eager send of S that returned at 3 ms (before rank 1 arrived); rank 1:
    # slow [0, 5) ms, then the recv at 5 ms. No other flow shares the switch: the recv takes the model's
    # alpha + S / B with contention as without it, not the send's 2 ms
    b = RunBuilder(world_size=2)
    b.rank(0).compute("a", dur_ns=1_000_000, start_ns=0)
    b.rank(0).send(1, S, 2_000_000)
    b.rank(1).compute("slow", dur_ns=5_000_000, start_ns=0)
    b.rank(1).recv(0, S, 1_000)
    rt = load_run(b.write(tmp_path / "run"))
    topo = Topology(name="one", dims=(Dimension(kind="switch", size=2, bandwidth_gbps=BW, latency_ns=ALPHA),))
    alone = round(ALPHA + S / BW)
    for contention in (False, True):
        res = simulate(rt, comm_mode="model", topology=topo, algorithm="ring", contention=contention)
        (recv,) = rt.ranks[1].rows_of_type(NodeType.COMM_RECV)
        assert int(res.end_ns[1][recv]) == 5_000_000 + alone, contention


def test_a_hierarchical_broadcast_is_a_flat_ring_at_the_slowest_links_bandwidth() -> None:
    # hierarchical, types other than all_reduce / reduce_scatter / all_gather: the flat ring over the
    # slowest dimension, α = max(300, 2000), B = min(200, 25): (p − 1)α + S/B with p = 4
    got = ModelTiming(two_level(), algorithm="hierarchical").collective_time_ns(
        CommType.BROADCAST, S, range(4)
    )
    assert got == round(3 * 2_000 + S / 25.0)


def test_a_network_slowdown_from_a_later_step_slows_that_steps_collective_and_not_an_earlier_one() -> None:
    # the time of a collective is cached by its size and group: the slowdown asked per step must be in the
    # key, or step 1 would take step 0's unslowed time (and the cache's first comer would win)
    f, extra = 0.5, 1_000
    slow = SlowdownModel([Slowdown(kind="network", factor=f, latency_ns=extra, first_step=1)])
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    timing = ModelTiming(flat, algorithm="ring", network_effects=slow)
    first = timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4), step=0)
    later = timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4), step=1)
    assert first == round(2 * 3 * (ALPHA + S / (4 * BW)))
    assert later == round(2 * 3 * (ALPHA + extra + S / (4 * BW * f)))
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(4), step=0) == first


def test_a_network_slowdown_slows_the_busiest_receiving_link_of_an_uneven_all_to_all() -> None:
    # ranks 0 and 1 (node 0) each send S to rank 2 (node 1) alone: rank 2's fat-tree link takes 2 S in, each
    # sender's S out, so the slowed receiving link is the busiest
    f = 0.25
    slow = SlowdownModel([Slowdown(kind="network", factor=f)])
    timing = ModelTiming(two_level(), algorithm="direct", network_effects=slow)
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(4), pairs=[(0, 2, S), (1, 2, S)])
    switch, fat_tree = 300 + S / (200.0 * f), 2_000 + 2 * S / (25.0 * f)
    assert got == round(max(switch, fat_tree))


def test_an_empty_all_reduce_all_gather_reduce_scatter_or_reduce_costs_nothing_an_empty_broadcast_its_latency(
    tmp_path: Path,
) -> None:
    # gloo returns from these at once and NCCL discards them (vocab.EMPTY_WAITS_FOR_NONE): no message, no
    # latency; a broadcast, gather, scatter or all_to_all of nothing still waits for its peers
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    timing = ModelTiming(flat, algorithm="ring")
    for ct in (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE):
        assert timing.collective_time_ns(ct, 0, range(8)) == 0, ct
    assert timing.collective_time_ns(CommType.ALL_REDUCE, 1, range(8)) == round(14 * (ALPHA + 1 / (8 * BW)))
    assert timing.collective_time_ns(CommType.BROADCAST, 0, range(8)) == 7 * ALPHA
    # in a replay: rank 1 arrives 1 ms late at an empty all_reduce, which neither waits for: each ends as it
    # arrives; the 8-byte all_reduce after it waits for rank 1, then takes its 2 α + 8 / B
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("fwd", dur_ns=1_000_000 * (r + 1), start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=0, dur_ns=50_000)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=8, dur_ns=50_000)
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt, comm_mode="model", topology=flat, algorithm="ring")
    empty, full = (res.coll_end_ns[k] - res.coll_arrival_ns[k] for k in range(2))
    assert [int(x) for x in (empty, full)] == [0, round(2 * (ALPHA + 8 / (2 * BW)))]
    assert [int(res.end_ns[r][1]) for r in (0, 1)] == [1_000_000, 2_000_000]  # each its own arrival


def test_a_faster_switch_inside_the_nodes_never_slows_a_tree_all_reduce_across_a_ring_of_nodes() -> None:
    # 16 ranks, 4 nodes of 4 on a switch, the nodes on a ring of 50 GB/s: a tree's messages between nodes
    # cross up to 4/2 = 2 ring hops whatever the switch's bandwidth. Before, the hops were charged only
    # where the ring was the slowest dimension, and p/2 = 8 of them: the switch at 450 GB/s (the ring the
    # slowest) 361.9 µs for 1 MiB, at 25 GB/s (the switch the slowest) 123.9 µs; now 121.9 and 163.9 µs
    def topo(switch_gbps: float) -> Topology:
        return Topology(
            name="ring-of-nodes",
            dims=(
                Dimension(kind="switch", size=4, bandwidth_gbps=switch_gbps, latency_ns=700),
                Dimension(kind="ring", size=4, bandwidth_gbps=50.0, latency_ns=5_000),
            ),
        )

    def t(switch_gbps: float) -> int:
        timing = ModelTiming(topo(switch_gbps), algorithm="tree")
        return timing.collective_time_ns(CommType.ALL_REDUCE, S, range(16))

    hops, depth = 4 // 2, 4  # ⌈log2 16⌉
    assert t(450.0) == round(2 * depth * hops * 5_000 + 2 * S / 50.0)
    assert t(25.0) == round(2 * depth * hops * 5_000 + 2 * S / 25.0)
    assert t(450.0) < t(25.0)


def test_an_all_to_all_round_a_ring_costs_what_crosses_a_cut_of_the_ring_not_one_port() -> None:
    # 16 ranks on a ring, each sending S/16 to every other by the shortest way: the link between two
    # neighbours carries 1 + 2 + ... + 7 parts each way from the pairs up to 7 apart and half of the 8
    # pairs 8 apart, 32 parts = 16²/8, where a port carries 15. Before, a port's (p - 1)/p S / B as on a
    # switch: 27.2 µs for 1 MiB a rank on 50 GB/s links, now 49.4 µs
    ring = Topology(name="r", dims=(Dimension(kind="ring", size=16, bandwidth_gbps=BW, latency_ns=ALPHA),))
    busiest = (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 / 2) * (S / 16)
    a2a = ModelTiming(ring, algorithm="ring").collective_time_ns(CommType.ALL_TO_ALL, S, range(16))
    assert a2a == round(15 * ALPHA + busiest / BW)
    # direct: every part at once, up to 8 hops away; an all_reduce is two such exchanges
    direct = ModelTiming(ring, algorithm="direct")
    assert direct.collective_time_ns(CommType.ALL_TO_ALL, S, range(16)) == round(8 * ALPHA + busiest / BW)
    assert direct.collective_time_ns(CommType.ALL_REDUCE, S, range(16)) == round(
        2 * (8 * ALPHA + busiest / BW)
    )
    # the ring algorithm's all_reduce only ever talks to its neighbours: a port's load, as on a switch
    ar = ModelTiming(ring, algorithm="ring").collective_time_ns(CommType.ALL_REDUCE, S, range(16))
    assert ar == round(2 * 15 * (ALPHA + S / (16 * BW)))


def _hot_expert_dispatch(b: RunBuilder) -> None:
    """A 4-rank MoE dispatch: ranks 0, 2 and 3 send 98,304 B each to rank 1 (the hot expert's), which sends
    512 B to rank 0 (splits in bytes per member, own chunk 0); every rank arrives at 1 ms."""
    part = 98_304
    _dispatch(b, {0: [0, part, 0, 0], 1: [512, 0, 0, 0], 2: [0, part, 0, 0], 3: [0, part, 0, 0]})


def _dispatch(b: RunBuilder, sent: dict[int, list[int]]) -> None:
    """An all_to_all in which rank ``r`` sends ``sent[r][d]`` bytes to rank ``d``, after a 1 ms router."""
    p = len(sent)
    for r in range(p):
        got = [sent[s][r] for s in range(p)]
        b.rank(r).compute("router", dur_ns=1_000_000, start_ns=0)
        b.rank(r).collective(
            CommType.ALL_TO_ALL,
            comm_bytes=sum(sent[r]),
            dur_ns=50_000,
            peer_bytes=(sum(sent[r]), sum(got)),
            peer_splits=(sent[r], got),
        )


def test_a_slow_rank_of_an_uneven_all_to_all_slows_its_own_traffic_not_the_hot_ranks(tmp_path: Path) -> None:
    # one switch (50 GB/s, 500 ns), direct: the hot rank's port takes 3 parts in (294,912 B), rank 3's sends
    # one. Rank 3's network at a tenth: its port's 98,304 B take 19,660.8 ns (+ α), longer than the hot
    # port's 5,898 ns at full speed; before, every port was slowed, the hot one's 294,912 B at a tenth
    # (59,482 ns). Rank 1's (the hot rank's) network at a tenth is what bounds it, as before
    b = RunBuilder(world_size=4)
    _hot_expert_dispatch(b)
    rt = load_run(b.write(tmp_path / "run"))
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    got = {}
    for slow in (3, 1):
        effects = SlowdownModel([Slowdown(kind="network", ranks=(slow,), factor=0.1)])
        res = simulate(rt, comm_mode="model", topology=flat, algorithm="direct", effects=effects)
        (end,), (arrival,) = res.coll_end_ns, res.coll_arrival_ns
        got[slow] = int(end - arrival)
    assert got == {3: round(ALPHA + 98_304 / (BW * 0.1)), 1: round(ALPHA + 3 * 98_304 / (BW * 0.1))}


def test_a_slow_rank_across_nodes_slows_its_own_links_and_its_pairs_not_every_link_of_the_group() -> None:
    # ranks 1, 2 and 3 each send S to rank 0 (node 0 = {0, 1}, node 1 = {2, 3}, a link per rank), rank 3's
    # network at half speed: rank 0's fat-tree link takes 2 S in at 25 GB/s, rank 3's takes its S out at
    # 12.5: 2 S / 25 either way; before, every link at half speed: rank 0's 2 S at 12.5 GB/s
    slow = SlowdownModel([Slowdown(kind="network", ranks=(3,), factor=0.5)])
    timing = ModelTiming(two_level(), algorithm="direct", network_effects=slow)
    got = timing.collective_time_ns(
        CommType.ALL_TO_ALL, S, (0, 1, 2, 3), pairs=[(1, 0, S), (2, 0, S), (3, 0, S)]
    )
    assert got == round(2_000 + 2 * S / 25.0)


def test_an_even_all_to_all_with_one_slow_rank_costs_that_ranks_port_as_before() -> None:
    # every member sends S/4 to each other: the slowed rank's port carries its 3 parts at a tenth, the
    # busiest, as when the whole group was slowed (the ring's 3 (α + S / (4 B f)))
    slow = SlowdownModel([Slowdown(kind="network", ranks=(2,), factor=0.1)])
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    for alg, want in (
        ("ring", 3 * (ALPHA + S / (4 * BW * 0.1))),
        ("direct", ALPHA + 3 * (S / 4) / (BW * 0.1)),
    ):
        timing = ModelTiming(flat, algorithm=alg, network_effects=slow)
        assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(4)) == round(want), alg


def _ring(size: int) -> Topology:
    return Topology(name="r", dims=(Dimension(kind="ring", size=size, bandwidth_gbps=BW, latency_ns=ALPHA),))


def test_a_hierarchical_all_reduce_on_a_ring_alone_is_the_ring_algorithms_with_no_hops() -> None:
    # on one dimension hierarchical is the ring algorithm: each message goes to a neighbour, one hop
    got = ModelTiming(_ring(16), algorithm="hierarchical").collective_time_ns(
        CommType.ALL_REDUCE, S, range(16)
    )
    assert got == round(2 * 15 * (ALPHA + S / (16 * BW)))


def test_a_tree_all_reduce_round_an_odd_ring_pays_half_the_ring_rounded_down_in_hops() -> None:
    # on a ring of 5 no rank is more than 2 hops from another: 2 hops a message, ⌈log2 5⌉ = 3 levels
    got = ModelTiming(_ring(5), algorithm="tree").collective_time_ns(CommType.ALL_REDUCE, S, range(5))
    assert got == round(2 * 3 * (2 * ALPHA) + 2 * S / BW)


def test_an_all_to_all_round_a_small_ring_costs_a_port_and_round_an_odd_ring_its_cut() -> None:
    # direct, every part at once. 4 ranks: a link carries 1 + 2/2 = 2 parts each way, a port 3: the port's
    # 3 S/4. 9 ranks: a link carries 1 + 2 + 3 + 4 = 10 parts each way ((9² - 1)/8), a port 8: 10 S/9
    small = ModelTiming(_ring(4), algorithm="direct").collective_time_ns(CommType.ALL_TO_ALL, S, range(4))
    assert small == round(2 * ALPHA + 3 * S / (4 * BW))
    odd = ModelTiming(_ring(9), algorithm="direct").collective_time_ns(CommType.ALL_TO_ALL, S, range(9))
    assert odd == round(4 * ALPHA + 10 * S / (9 * BW))


def test_an_even_all_to_all_on_half_a_ring_costs_the_line_its_members_form_not_a_whole_rings_cut() -> None:
    # ranks 0..7 on a ring of 16 (direct, S/8 a part, 7 hops of α: 0 to 7 the shortest way, along the
    # line, not 8/2 = 4): they form a line, no pair's shortest way round the other half, and the link from
    # 3 to 4 carries every part from 0..3 to 4..7, 4 · 4 = 16 parts, 2 S (as the same parts given as
    # pairs). Before, the whole ring's cut, 8²/8 = 8 parts: 22,972 ns where the pairs gave 43,943
    timing = ModelTiming(_ring(16), algorithm="direct")
    pairs = [(a, b, S // 8) for a in range(8) for b in range(8) if a != b]
    even = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(8))
    assert even == timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(8), pairs=pairs)
    assert even == round(7 * ALPHA + 2 * S / BW) == 45_443
    # direct's all_reduce is two such exchanges, its reduce_scatter one; the ring algorithm's all_to_all its
    # 7 steps and the same busiest link, each step as long as its ring's widest edge, 7 back to 0: 7 hops
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(8)) == round(2 * (7 * ALPHA + 2 * S / BW))
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, S, range(8)) == round(7 * ALPHA + 2 * S / BW)
    ring_alg = ModelTiming(_ring(16), algorithm="ring")
    assert ring_alg.collective_time_ns(CommType.ALL_TO_ALL, S, range(8)) == round(7 * 7 * ALPHA + 2 * S / BW)


def test_a_group_on_part_of_a_ring_pays_its_farthest_pairs_hops_not_half_its_units() -> None:
    # a tree broadcast among ranks 0..7 of a ring of 16: 0 and 7 are 7 hops apart by the shortest way (the
    # other way is 9), so a message pays up to 7 α, where half the 8 units, 4, was charged (68,915 ns)
    got = ModelTiming(_ring(16), algorithm="tree").collective_time_ns(CommType.BROADCAST, S, range(8))
    assert got == round(3 * (7 * ALPHA + S / BW)) == 73_415


def _torus(x: int, y: int) -> Topology:
    """A 2-D torus of ``x`` by ``y`` ranks: a ring of ``x``, each of its units on a ring of ``y`` (a rank's
    own link on each, every link 50 GB/s, 500 ns)."""
    return Topology(
        name="torus",
        dims=(
            Dimension(kind="ring", size=x, bandwidth_gbps=BW, latency_ns=ALPHA),
            Dimension(kind="ring", size=y, bandwidth_gbps=BW, latency_ns=ALPHA),
        ),
    )


def test_a_message_crossing_both_rings_of_a_torus_pays_the_hops_on_each() -> None:
    # 4 x 4: rank 10 is (2, 2), 2 hops from rank 0 round each ring: 4 hops of α, where the larger ring's 2
    # was charged (21,972 ns for S, 87,886 ns for a 16-rank tree broadcast, now 91,886)
    timing = ModelTiming(_torus(4, 4), algorithm="tree")
    assert timing.p2p_time_ns(0, 10, S) == round(4 * ALPHA + S / BW) == 22_972
    # a tree broadcast among all 16: ⌈log2 16⌉ = 4 levels, each message up to 2 + 2 hops
    assert timing.collective_time_ns(CommType.BROADCAST, S, range(16)) == round(4 * (4 * ALPHA + S / BW))


def test_a_group_on_part_of_both_rings_of_a_torus_pays_its_farthest_pairs_shortest_hops_on_each() -> None:
    # 8 x 8: the 9 ranks at x and y in {7, 0, 1} (units 7, 0, 1 of each ring, a line of 3 across the ring's
    # end): on each ring the farthest pair, 7 and 1, is 2 hops apart by the shortest way (through 0; the
    # other way is 6), so a message pays up to 2 + 2 hops of α. A tree broadcast: ⌈log2 9⌉ = 4 levels
    group = [x + 8 * y for x in (7, 0, 1) for y in (7, 0, 1)]
    timing = ModelTiming(_torus(8, 8), algorithm="tree")
    assert timing.collective_time_ns(CommType.BROADCAST, S, group) == round(4 * (4 * ALPHA + S / BW))


def test_a_pair_crossing_both_rings_of_a_torus_goes_round_the_inner_ring_in_its_sources_row() -> None:
    # 8 x 4 (rank x + 8 y): rank 0 (0, 0) to rank 9 (1, 1) and rank 16 (0, 2) to rank 10 (2, 1) cross the
    # inner ring's link from x = 0 to 1 in their sources' rows, y = 0 and y = 2, S each, then the outer ring
    # at their destinations' x; taken in the destinations' row, y = 1, that link would carry 2 S. The
    # farthest pair's hops: 2 round the inner ring, 1 round the outer
    timing = ModelTiming(_torus(8, 4), algorithm="direct")
    pairs = [(0, 9, S), (16, 10, S)]
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(32), pairs=pairs)
    assert got == round(3 * ALPHA + S / BW)


def test_a_fat_tree_of_nodes_is_no_ring_its_links_are_the_nics_alone() -> None:
    # 8 nodes of 2 ranks on a fat tree (a NIC per rank): an even all_to_all of S sends 14 parts of S/16 a
    # rank through its NIC, one α; halving_doubling's reduce_scatter crosses nodes in its steps 8, 4 and 2
    # apart (S/2, S/4, S/8 through a NIC, one α each), then the switch (S/16). Taken round a ring of the 8
    # nodes, each would pay the ring's links and hops too (49,943 and 82,785 ns)
    timing = ModelTiming(two_level(per_node=2, nodes=8), algorithm="halving_doubling")
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16))
    assert got == round(2_000 + 14 * (S / 16) / 25.0) == 38_700
    steps = 3 * 2_000 + (S / 2 + S / 4 + S / 8) / 25.0 + 300 + S / 16 / 200.0
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, S, range(16)) == round(steps) == 43_328


def _ring_of_nodes(links: int) -> Topology:
    """8 nodes of 2 ranks (a 200 GB/s, 300 ns switch) on a ring of 50 GB/s, 500 ns links, ``links`` rings
    side by side (0: one per rank slot, 2; 1: one per node)."""
    return Topology(
        name="ring-of-nodes",
        dims=(
            Dimension(kind="switch", size=2, bandwidth_gbps=200.0, latency_ns=300),
            Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA, links_per_node=links),
        ),
    )


def test_an_all_to_all_across_a_ring_of_nodes_pays_the_ring_links_its_pairs_cross_not_only_the_nics() -> None:
    # 16 ranks, S/16 a part. A pair crosses the switch first, to the slot of its destination, then goes
    # round that slot's ring the shortest way: on each of the 2 rings every node sends 2 parts (its 2
    # ranks') to each other node, an 8-node ring exchange of 2 parts a pair: the busiest link carries
    # 8²/8 · 2 = 16 parts, where a rank's NIC carries 14 (the 14 members off its node). Its farthest pairs
    # are 4 nodes apart: 4 hops of α (one, 21,472 ns, before the hop rule reached link-by-link costing).
    # Before the ring links, the NICs' 14 parts only: 18,850 ns
    part = S // 16
    pairs = [(a, b, part) for a in range(16) for b in range(16) if a != b]
    want = round(4 * ALPHA + 16 * part / BW)
    for algorithm in ("direct", "ring"):  # link by link whatever the algorithm
        timing = ModelTiming(_ring_of_nodes(0), algorithm=algorithm)
        assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16)) == want == 22_972
        assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16), pairs=pairs) == want
    # rank 3 (node 1, slot 1) at half speed: the links of slot 1's ring at node 1 (a ring link is its two
    # ends') carry their 16 parts at 25 GB/s, the traffic passing through too; its NIC's 14 parts at 25 GB/s
    # were charged before (37,200 ns)
    slow = SlowdownModel([Slowdown(kind="network", ranks=(3,), factor=0.5)])
    slowed = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=slow)
    assert slowed.collective_time_ns(CommType.ALL_TO_ALL, S, range(16)) == round(
        4 * ALPHA + 16 * part / (BW * 0.5)
    )


def test_a_slow_rank_on_a_ring_of_nodes_slows_the_ring_links_at_its_unit_on_its_slots_ring_only() -> None:
    # a ring link across nodes is its two end units' members on that slot's ring; S from one rank:
    # rank 4 (node 2, slot 0) to rank 2 (node 1, slot 0) crosses the slot-0 link from node 2 down to node 1;
    # rank 6 (node 3, slot 0) at half speed is at neither end: S at full speed
    half = {r: SlowdownModel([Slowdown(kind="network", ranks=(r,), factor=0.5)]) for r in (2, 3, 6)}

    def cost(slow: int, src: int, dst: int) -> int:
        timing = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=half[slow])
        return timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16), pairs=[(src, dst, S)])

    assert cost(6, 4, 2) == round(ALPHA + S / BW)
    # rank 0 to rank 4 (nodes 0 to 2 on slot 0's ring: 2 hops, 2 α) passes node 1: rank 2 (its slot 0) at
    # half speed slows it, rank 3 (its slot 1, the other ring) does not
    assert cost(2, 0, 4) == round(2 * ALPHA + S / (BW * 0.5))
    assert cost(3, 0, 4) == round(2 * ALPHA + S / BW)


def test_a_slow_rank_slows_the_links_of_its_own_ring_not_those_of_the_ring_beside_it_in_another_pod() -> None:
    # 2 pods (an outer switch) of a ring of 8 nodes of 2 ranks: rank r is slot r % 2, node r // 2 % 8, pod
    # r // 16. Rank 16 to rank 20 (pod 1, nodes 0 to 2, slot 0: 2 hops, 2 α) passes node 1 of pod 1's ring:
    # rank 18 at half speed there slows it; rank 2, at node 1 slot 0 of pod 0's ring, does not
    switch = Dimension(kind="switch", size=2, bandwidth_gbps=200.0, latency_ns=300)
    ring = Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA)
    pods = Topology(name="pods", dims=(switch, ring, switch))

    def cost(slow: int) -> int:
        half = SlowdownModel([Slowdown(kind="network", ranks=(slow,), factor=0.5)])
        timing = ModelTiming(pods, algorithm="direct", network_effects=half)
        return timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(32), pairs=[(16, 20, S)])

    assert cost(18) == round(2 * ALPHA + S / (BW * 0.5))
    assert cost(2) == round(2 * ALPHA + S / BW)


def test_a_slow_rank_slows_the_ring_link_into_its_node_as_well_as_the_one_out_of_it() -> None:
    # rank 2 (node 1, slot 0) sends S to rank 4 (node 2, slot 0), at half speed, and S on to rank 6 (node
    # 3): the slot-0 link from node 1 into node 2 carries 2 S and has rank 4 at one end, so it runs at half
    # speed: 2 S at half speed, where the link out of node 2 carries S and rank 4's port S
    half = SlowdownModel([Slowdown(kind="network", ranks=(4,), factor=0.5)])
    timing = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=half)
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16), pairs=[(2, 4, S), (2, 6, S)])
    assert got == round(2 * ALPHA + 2 * S / (BW * 0.5))


def test_a_slowed_link_between_ranks_of_next_nodes_slows_their_ring_link_for_all_it_carries() -> None:
    # the link between ranks 4 and 6 (slot 0 of nodes 2 and 3) at half speed is slot 0's ring link between
    # those nodes: rank 4's S to rank 6 and rank 2's S to rank 8 (nodes 1 to 4, 3 hops) both cross it, 2 S at
    # half speed; rank 2's pair is not slowed, nor any port with one of them
    slowed = SlowdownModel([Slowdown(kind="network", links=((4, 6),), factor=0.5)])
    timing = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=slowed)
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(16), pairs=[(4, 6, S), (2, 8, S)])
    assert got == round(3 * ALPHA + 2 * S / (BW * 0.5))


def test_a_slowdowns_extra_latency_is_paid_on_every_hop_round_a_ring() -> None:
    # rank 0 to rank 4 of a ring of 8: 4 hops, each α plus the slowdown's 100 ns
    ring = Topology(name="ring", dims=(Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA),))
    timing = ModelTiming(ring, network_effects=Slower(1.0, 100))
    assert timing.p2p_time_ns(0, 4, S) == round(4 * (ALPHA + 100) + S / BW)


def test_a_slow_rank_does_not_slow_a_ring_link_between_nodes_where_its_group_has_no_member() -> None:
    # 4 of the 16 ranks: slot 0 of nodes 0, 3 and 6, and slot 1 of node 6. Rank 0 to rank 6 (nodes 0 to 3 on
    # slot 0's ring, 3 hops, 3 α) crosses the link from node 1 to node 2, whose ends hold no member of the
    # group; rank 12 (node 6) at half speed is at neither end of any link on the way: S at full speed, as
    # round a ring alone (ranks 0, 3, 6 of a ring of 8, rank 6 at half speed, 0 to 3). Before, that link
    # took the group's factor, the slow rank's: 43,443 ns
    half = SlowdownModel([Slowdown(kind="network", ranks=(12,), factor=0.5)])
    timing = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=half)
    got = timing.collective_time_ns(CommType.ALL_TO_ALL, S, (0, 6, 12, 13), pairs=[(0, 6, S)])
    assert got == round(3 * ALPHA + S / BW) == 22_472
    # rank 0 to rank 12 (nodes 0 to 6, the other way round: 2 hops) ends at the slow rank's node: slowed
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, (0, 6, 12, 13), pairs=[(0, 12, S)]) == round(
        2 * ALPHA + S / (BW * 0.5)
    )
    ring = Topology(name="ring", dims=(Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA),))
    alone = SlowdownModel([Slowdown(kind="network", ranks=(6,), factor=0.5)])
    timing = ModelTiming(ring, algorithm="direct", network_effects=alone)
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, S, (0, 3, 6), pairs=[(0, 3, S)]) == got


def test_a_halving_doubling_reduce_scatter_across_a_ring_of_nodes_pays_the_ring_links_of_its_far_steps() -> (
    None
):
    # 16 ranks in rank order, rank r on node r // 2: partners 8 apart (4 nodes, half way round: S/2 split
    # both ways) load the link from node c to c + 1 with S/4 from each of c − 3 .. c: S, where a NIC
    # carries S/2; partners 4 apart (2 nodes: 0 <-> 2, 1 <-> 3, ...) load the link from node 1 to 2 with the
    # S/4 of 0 -> 2 and 1 -> 3: S/2, a NIC S/4; 2 apart, the next node, S/8 as the NIC; 1 apart, the switch,
    # S/16. Each step's α times its partners' hops round the ring: 4, 2, 1 nodes, none (one α a step,
    # 36,206 ns, before the hop rule reached link-by-link costing). Before, the NICs' S/2 and S/4: 20,478 ns
    steps = (4 * ALPHA + S / BW) + (2 * ALPHA + S / 2 / BW) + (ALPHA + S / 8 / BW) + (300 + S / 16 / 200.0)
    for algorithm in ("halving_doubling", "tree"):  # tree's reduce_scatter is charged halving's steps
        timing = ModelTiming(_ring_of_nodes(0), algorithm=algorithm)
        assert timing.collective_time_ns(CommType.REDUCE_SCATTER, S, range(16)) == round(steps) == 38_206
    # tree's was its flat formula: 4 levels of 4 hops, 15/16 S through a port (27,661 ns)


def test_a_tree_all_reduce_across_a_ring_of_nodes_is_charged_its_busiest_ring_link() -> None:
    # 16 ranks, rank r on node r // 2, the nodes on one ring (one link per node). NCCL's double binary
    # tree, every edge S/2 each way by the shortest way round: the link between nodes 2 and 3 carries the
    # edges 5-6, 6-4 and 4-8 (nodes 2 -> 4) of the first tree, 6-5 and 3-7 (nodes 1 -> 3) of the second,
    # and half of 8-0 and of 7-15 (4 nodes apart, half way round): 6 edges' S/2, 3 S each way, where a
    # port carries 2 S. 4 levels, 8/2 = 4 hops of α a message. Before, the port's 2 S: 57,943 ns
    timing = ModelTiming(_ring_of_nodes(1), algorithm="tree")
    got = timing.collective_time_ns(CommType.ALL_REDUCE, S, range(16))
    assert got == round(2 * 4 * 4 * ALPHA + 3 * S / BW) == 78_915
    # every link at half speed: the busiest ring link's 3 S at half the bandwidth too
    slowed = ModelTiming(_ring_of_nodes(1), algorithm="tree", network_effects=Slower(0.5, 0))
    assert slowed.collective_time_ns(CommType.ALL_REDUCE, S, range(16)) == round(
        2 * 4 * 4 * ALPHA + 3 * S / (BW * 0.5)
    )


def test_a_tree_all_reduce_across_two_rings_is_charged_the_busiest_link_of_either_ring() -> None:
    # as above, the node's 2 ranks on a ring of 2 (200 GB/s, 300 ns) in place of the switch: the ring of
    # nodes' link still carries 3 S at 50 GB/s, the busiest of both rings; a message pays 1 hop round the
    # ring of 2 and 4 round the ring of nodes
    inner_ring = Dimension(kind="ring", size=2, bandwidth_gbps=200.0, latency_ns=300)
    nodes = Dimension(kind="ring", size=8, bandwidth_gbps=BW, latency_ns=ALPHA, links_per_node=1)
    timing = ModelTiming(Topology(name="ring-of-rings", dims=(inner_ring, nodes)), algorithm="tree")
    got = timing.collective_time_ns(CommType.ALL_REDUCE, S, range(16))
    assert got == round(2 * 4 * (1 + 4) * ALPHA + 3 * S / BW)


def test_a_message_four_nodes_round_a_ring_pays_four_hops_whether_its_group_spans_the_switch_or_not() -> None:
    # ranks 0 and 8 are slot 0 of nodes 0 and 4, half way round the ring of 8 nodes; 1 and 9 slot 1 of
    # the same nodes. Alone, 0 <-> 8 spans the ring alone and pays its 4 hops of α, as the message 0 -> 8
    # does; with 1 <-> 9 the group spans the switch too and was costed link by link at one α for the same
    # messages (21,472 ns). Each NIC carries S, each ring link S/2 (half each way round): 4 α + S/B
    timing = ModelTiming(_ring_of_nodes(0), algorithm="direct")
    want = round(4 * ALPHA + S / BW)
    assert timing.p2p_time_ns(0, 8, S) == want == 22_972
    alone = [(0, 8, S), (8, 0, S)]
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, 2 * S, (0, 8), pairs=alone) == want
    both = [*alone, (1, 9, S), (9, 1, S)]
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, 2 * S, (0, 1, 8, 9), pairs=both) == want
    # a direct all_reduce among the 16 ranks: two exchanges of S/16 parts, the farthest 4 nodes apart (one
    # α an exchange before: 42,943 ns)
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(16)) == round(
        2 * (4 * ALPHA + 16 * (S // 16) / BW)
    )


def test_an_uneven_all_to_all_round_a_ring_pays_the_hops_of_its_farthest_pair_not_the_groups() -> None:
    # 8 ranks on a ring of 8, each sending S to the next: every message crosses one hop, where the group's
    # farthest pair's 4 were charged (22,972 ns). A port carries S, as a ring link does: 7/8 of the size
    nbytes = -(-8 * S // 7)
    pairs = [(r, (r + 1) % 8, S) for r in range(8)]
    got = ModelTiming(_ring(8), algorithm="direct").collective_time_ns(
        CommType.ALL_TO_ALL, nbytes, range(8), pairs=pairs
    )
    assert got == round(ALPHA + 7 / 8 * nbytes / BW) == 21_472


def test_an_all_to_all_of_two_nodes_whose_messages_stay_inside_each_node_pays_one_alpha() -> None:
    # ranks 0, 1 (node 0) and 8, 9 (node 4, half way round the ring of 8 nodes), each sending S to the other
    # rank of its node only: no message crosses the ring, so each pays the switch's one α (300 ns) over its
    # S at 200 GB/s, not the 4 ring hops of the group's farthest pair; with rank 1's network at half speed,
    # its switch link carries S at 100 GB/s
    pairs = [(0, 1, S), (1, 0, S), (8, 9, S), (9, 8, S)]
    timing = ModelTiming(_ring_of_nodes(0), algorithm="direct")
    assert timing.collective_time_ns(CommType.ALL_TO_ALL, 2 * S, (0, 1, 8, 9), pairs=pairs) == round(
        300 + S / 200.0
    )
    slow = SlowdownModel([Slowdown(kind="network", ranks=(1,), factor=0.5)])
    slowed = ModelTiming(_ring_of_nodes(0), algorithm="direct", network_effects=slow)
    assert slowed.collective_time_ns(CommType.ALL_TO_ALL, 2 * S, (0, 1, 8, 9), pairs=pairs) == round(
        300 + S / 100.0
    )


def _two_levels(inner: tuple[str, int], outer: tuple[str, int]) -> Topology:
    """Nodes of ``inner`` (its kind and size: 200 GB/s, 300 ns) on ``outer`` (its kind and size: ``BW``,
    ``ALPHA``)."""
    return Topology(
        name="n",
        dims=(
            Dimension(kind=inner[0], size=inner[1], bandwidth_gbps=200.0, latency_ns=300),
            Dimension(kind=outer[0], size=outer[1], bandwidth_gbps=BW, latency_ns=ALPHA),
        ),
    )


def _one_switch() -> Topology:
    return Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))


def test_an_even_all_to_all_slowed_on_every_link_costs_the_same_each_time_it_is_asked() -> None:
    # every link at half speed: the group's factor (the per-link costing finds nothing to tell apart, and
    # keeps that answer for the next call of the same all_to_all)
    slow = SlowdownModel([Slowdown(kind="network", factor=0.5)])
    timing = ModelTiming(_one_switch(), algorithm="direct", network_effects=slow)
    want = round(ALPHA + 3 * (S / 4) / (BW * 0.5))
    assert [timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(4)) for _ in range(2)] == [want, want]


def test_a_slow_link_for_one_step_slows_that_steps_all_to_all_by_its_pair_not_the_other_steps() -> None:
    # every link at half speed, and link (0, 1) at a tenth of that in step 1 only: in step 0 each port's 3
    # parts at half speed; in step 1 the part between 0 and 1 at a twentieth (10 parts' time at full speed,
    # more than a port's 3 at half speed), not every port's 3 parts at a twentieth (30 parts)
    slow = SlowdownModel(
        [
            Slowdown(kind="network", factor=0.5),
            Slowdown(kind="network", links=((0, 1),), factor=0.1, first_step=1, last_step=1),
        ]
    )
    timing = ModelTiming(_one_switch(), algorithm="direct", network_effects=slow)
    part = S / 4
    got = [timing.collective_time_ns(CommType.ALL_TO_ALL, S, range(4), step) for step in (0, 1, 2)]
    half, pair = round(ALPHA + 3 * part / (BW * 0.5)), round(ALPHA + part / (BW * 0.05))
    assert got == [half, pair, half]


def test_a_slow_link_between_ranks_that_send_each_other_nothing_leaves_an_uneven_all_to_all_as_it_was() -> (
    None
):
    # ranks 0, 2 and 3 each send X to rank 1, link (2, 3) at a tenth: no byte crosses it, so rank 1's port
    # takes its 3 X at full speed (before the per-link costing, every port at a tenth: 30 X)
    x = 100_000
    pairs = [(0, 1, x), (2, 1, x), (3, 1, x)]
    slow = SlowdownModel([Slowdown(kind="network", links=((2, 3),), factor=0.1)])
    for effects in (None, slow):
        timing = ModelTiming(_one_switch(), algorithm="direct", network_effects=effects)
        got = timing.collective_time_ns(CommType.ALL_TO_ALL, 4 * x, range(4), pairs=pairs)
        assert got == round(ALPHA + 3 * x / BW), effects


def test_a_faster_network_of_one_rank_speeds_its_own_traffic_not_the_hot_ranks() -> None:
    # ranks 0, 2 and 3 each send X to rank 1; rank 3's network twice as fast: its port sends X in X / 2B,
    # rank 1's still takes 3 X in at B (not at 2 B, as if the whole group were faster)
    x = 100_000
    fast = SlowdownModel([Slowdown(kind="network", ranks=(3,), factor=2.0)])
    timing = ModelTiming(_one_switch(), algorithm="direct", network_effects=fast)
    got = timing.collective_time_ns(
        CommType.ALL_TO_ALL, 4 * x, range(4), pairs=[(0, 1, x), (2, 1, x), (3, 1, x)]
    )
    assert got == round(ALPHA + 3 * x / BW)


def test_a_slow_rank_slows_the_node_link_it_shares_and_a_slow_pair_inside_a_node_leaves_it_alone() -> None:
    # two nodes of 2 ranks, one fat-tree link (NIC) a node; an even all_to_all of S a rank: node 0's NIC
    # carries ranks 0 and 1's 4 parts to node 1, S. Rank 1 (the NIC's second rank) at a tenth: the NIC is
    # its network too, S at 2.5 GB/s. Link (0, 1) at a tenth (their switch pair): the NIC at full speed,
    # S at 25 GB/s (the pair's part at 20 GB/s on the switch takes less)
    rank1 = SlowdownModel([Slowdown(kind="network", ranks=(1,), factor=0.1)])
    nic = ModelTiming(two_level(links=1), algorithm="direct", network_effects=rank1)
    assert nic.collective_time_ns(CommType.ALL_TO_ALL, S, range(4)) == round(2_000 + S / 2.5)
    pair01 = SlowdownModel([Slowdown(kind="network", links=((0, 1),), factor=0.1)])
    pair = ModelTiming(two_level(links=1), algorithm="direct", network_effects=pair01)
    assert pair.collective_time_ns(CommType.ALL_TO_ALL, S, range(4)) == round(2_000 + S / 25.0)


def _hot_expert(q: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Every rank of ``q`` but rank 1 sends ``S`` to rank 1 (a hot expert): the all_to_all's message size
    (``(q − 1)/q`` of it is rank 1's port's ``(q − 1) S``) and its pairs."""
    return q * S, [(r, 1, S) for r in range(q) if r != 1]


def test_an_uneven_all_to_all_round_a_ring_costs_its_busiest_port_or_ring_link_from_its_pairs() -> None:
    # direct, hops ⌊q/2⌋ a message. Hot expert, 8 ranks: rank 1's port takes 7 S; its two ring links take
    # what comes from either side: from 2, 3, 4 and half of 5's (4 hops either way) 3.5 S, the same from
    # 0, 7, 6 and the other half: the port's 7 S. Before, the even cut's 8 parts of 8 S / 8 (8 S / B).
    # 64 ranks: the port's 63 S, a link's 31.5 S (not 64²/8 parts of 64 S / 64: 512 S)
    for q in (8, 64):
        nbytes, pairs = _hot_expert(q)
        got = ModelTiming(_ring(q), algorithm="direct").collective_time_ns(
            CommType.ALL_TO_ALL, nbytes, range(q), pairs=pairs
        )
        assert got == round(q // 2 * ALPHA + (q - 1) * S / BW), q
    # the ring algorithm: its (q − 1) messages' latency, one hop each, and the same bandwidth term
    nbytes, pairs = _hot_expert(8)
    ring_alg = ModelTiming(_ring(8), algorithm="ring").collective_time_ns(
        CommType.ALL_TO_ALL, nbytes, range(8), pairs=pairs
    )
    assert ring_alg == round(7 * ALPHA + 7 * S / BW)
    # every rank sends S to the rank opposite (4 hops, half each way): a ring link from c to c + 1 carries
    # half of what ranks c − 3 .. c send, 2 S, where a port carries S (before: the even cut of the port's
    # size, 8/7 S)
    opposite = [(r, (r + 4) % 8, S) for r in range(8)]
    got = ModelTiming(_ring(8), algorithm="direct").collective_time_ns(
        CommType.ALL_TO_ALL, -(-8 * S // 7), range(8), pairs=opposite
    )
    assert got == round(4 * ALPHA + 2 * S / BW)


def test_an_even_all_to_all_given_as_pairs_costs_what_the_ring_cut_charges_even_traffic() -> None:
    # the cut's q²/8 parts ((q² − 1)/8 for odd q) are what the pairs' shortest ways put on the busiest link
    for q, alg in ((8, "direct"), (9, "direct"), (16, "ring"), (16, "tree"), (64, "direct")):
        nbytes = q * S
        pairs = [(a, b, S) for a in range(q) for b in range(q) if a != b]
        timing = ModelTiming(_ring(q), algorithm=alg)
        even = timing.collective_time_ns(CommType.ALL_TO_ALL, nbytes, range(q))
        assert timing.collective_time_ns(CommType.ALL_TO_ALL, nbytes, range(q), pairs=pairs) == even, (q, alg)
    assert even == round(32 * ALPHA + 64 * 64 / 8 * S / BW)


def test_a_slow_rank_on_a_ring_slows_the_traffic_passing_through_it_to_a_hot_expert() -> None:
    # hot expert on 8 ranks, rank 3 at a tenth. Rank 3's link towards rank 2 carries 3's S, 4's S (4 -> 3
    # -> 2 -> 1) and half of 5's (4 hops either way): 2.5 S at a tenth, 25 S' time; rank 3's port S at a
    # tenth (10 S), rank 1's port 7 S at full speed. Before, the busiest port's 10 S taken as an even
    # all_to_all's size whose cut was then charged: 8/7 · 10 S
    nbytes, pairs = _hot_expert(8)
    slow = SlowdownModel([Slowdown(kind="network", ranks=(3,), factor=0.1)])
    got = ModelTiming(_ring(8), algorithm="direct", network_effects=slow).collective_time_ns(
        CommType.ALL_TO_ALL, nbytes, range(8), pairs=pairs
    )
    assert got == round(4 * ALPHA + 2.5 * S / (BW * 0.1))


def test_a_halving_doubling_reduce_scatter_round_a_ring_pays_the_ring_links_its_far_partners_share() -> None:
    # 16 ranks, partners 8, 4, 2, 1 away with S/2, S/4, S/8, S/16, each step's messages its partners' 8,
    # 4, 2, 1 hops of α. The link from c to c + 1 carries: 8 away (half way: half each way), S/4 from each
    # of c − 7 .. c: 2 S; 4 away, S/4 from each of c − 3 .. c sending forward (all four where c − 3 starts a
    # block of 8): S; 2 away, S/8 from c − 1 and c: S/4; 1 away, S/16. Before, a port's S/2 + S/4 + S/8 +
    # S/16 = 15/16 S in all; then every step the group's 8 hops (4 · 8 α: 85,468 ns)
    timing = ModelTiming(_ring(16), algorithm="halving_doubling")
    steps = (8 + 4 + 2 + 1) * ALPHA + (2 + 1 + 1 / 4 + 1 / 16) * S / BW
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, S, range(16)) == round(steps) == 76_968
    # an all_reduce: the reduce-scatter, then the all-gather's same steps in the other order
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, range(16)) == round(2 * steps)
    # 4 ranks: the partner 2 away is half way round (S/4 each way on two links), a link's S/2 is its port's;
    # 2 hops, then 1
    small = ModelTiming(_ring(4), algorithm="halving_doubling").collective_time_ns(
        CommType.REDUCE_SCATTER, S, range(4)
    )
    assert small == round((2 + 1) * ALPHA + 3 / 4 * S / BW)


def test_a_tree_reduce_scatter_and_all_gather_round_a_ring_pay_the_ring_links_of_halvings_steps() -> None:
    # tree's reduce_scatter and all_gather are halving's formula: round a ring alone, halving's steps, 16
    # ranks, 1 MiB: 2 S, S, S/4 and S/16 on the busiest links, 8, 4, 2 and 1 hops of α. Before, a port's
    # 15/16 S (35,661 ns); then the group's 8 hops every step (85,468 ns)
    timing = ModelTiming(_ring(16), algorithm="tree")
    steps = round((8 + 4 + 2 + 1) * ALPHA + (2 + 1 + 1 / 4 + 1 / 16) * S / BW)
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, S, range(16)) == steps == 76_968
    # an all_gather's comm_size is one member's piece: S/16 each, the same S gathered
    assert timing.collective_time_ns(CommType.ALL_GATHER, S // 16, range(16)) == steps


def test_a_tree_all_reduce_round_a_ring_is_charged_its_busiest_ring_link_not_a_port() -> None:
    # NCCL's double binary tree, every edge of both trees carrying S/2 each way by the shortest way round.
    # 16 ranks: the link from 4 to 5 carries the S/2 of 4 -> 8, 4 -> 6, 4 -> 5, 3 -> 7 and 3 -> 5, and half
    # of the S/2 of 0 -> 8 and of 15 -> 7 (8 hops: half each way): 3 S, where a port carries 2 S; 64 ranks
    # 5 S. Before, the port's 2 S (73,943 and 233,943 ns)
    for q, depth, busiest in ((16, 4, 3), (64, 6, 5)):
        got = ModelTiming(_ring(q), algorithm="tree").collective_time_ns(CommType.ALL_REDUCE, S, range(q))
        assert got == round(2 * depth * (q // 2) * ALPHA + busiest * S / BW), q
    # 8 ranks: the busiest link's 2 S is the port's (test above: unchanged)


def test_a_replayed_moe_dispatch_to_a_hot_expert_round_the_ring_preset_costs_the_hot_port(
    tmp_path: Path,
) -> None:
    # the ring preset's shape (size 0, sized to the run's 8 ranks), direct: every rank but 1 sends S to
    # rank 1, whose port takes 7 S in; a ring link into it takes 3.5 S. Before, the even cut of the port's
    # size: 8 parts of 8 S / 8
    b = RunBuilder(world_size=8)
    _dispatch(b, {r: [S if d == 1 and r != 1 else 0 for d in range(8)] for r in range(8)})
    rt = load_run(b.write(tmp_path / "run"))
    res = simulate(rt, comm_mode="model", topology=_ring(0), algorithm="direct")
    (end,), (arrival,) = res.coll_end_ns, res.coll_arrival_ns
    assert int(end - arrival) == round(4 * ALPHA + 7 * S / BW)


def test_a_halving_doubling_all_reduce_of_a_group_not_a_power_of_two_pays_the_fold_to_one() -> None:
    # Rabenseifner's algorithm (MPICH) on p = q + r members, q a power of two: 2r of them fold in pairs (one
    # sends its whole S to the other), q halve and double, the result goes back whole: q's 2 log2 q α +
    # 2 (q-1)/q S/B plus 2 α + 2 S/B. Before, every p was charged 2 ⌈log2 p⌉ α + 2 (p-1)/p S/B, the least
    # any all_reduce through one port takes: 3 ranks 85,886 ns, as cheap as the ring, now 190,744
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    timing = ModelTiming(flat, algorithm="halving_doubling")
    assert timing.collective_time_ns(CommType.ALL_REDUCE, 3 * S, range(3)) == round(
        4 * ALPHA + (1 + 2) * 3 * S / BW
    )
    for p in (5, 6, 7):  # q = 4
        got = timing.collective_time_ns(CommType.ALL_REDUCE, 3 * S, range(p))
        assert got == round(6 * ALPHA + (3 / 2 + 2) * 3 * S / BW), p
    # a power of two keeps recursive halving and doubling alone
    assert timing.collective_time_ns(CommType.ALL_REDUCE, 3 * S, range(8)) == round(
        6 * ALPHA + 2 * 7 / 8 * 3 * S / BW
    )
    # round a ring of 5, one group filling it, the fold pays the group's farthest pair's 2 hops a message
    ring5 = ModelTiming(_ring(5), algorithm="halving_doubling")
    assert ring5.collective_time_ns(CommType.ALL_REDUCE, 3 * S, range(5)) == round(
        6 * 2 * ALPHA + (3 / 2 + 2) * 3 * S / BW
    )


def test_a_ring_algorithm_on_a_group_that_leaves_units_of_a_ring_out_pays_its_widest_gap_each_step() -> None:
    # a 2 x 3 mesh on a ring of 6: the dp pair 0 and 3 is 3 hops apart either way, the tp row 0, 1, 2 closes
    # its ring from 2 back to 0 over 2 hops, the strided group 1, 3, 5 steps 2 hops. Every step of a ring
    # lasts its widest edge. Before, one hop a step whatever the gaps: the pair's all_reduce (2 alpha + S/B)
    # cost less than one message between the two (3 alpha + S/B)
    ring6 = ModelTiming(_ring(6), algorithm="ring")
    assert ring6.collective_time_ns(CommType.ALL_REDUCE, S, (0, 3)) == round(2 * (3 * ALPHA + S / (2 * BW)))
    assert ring6.p2p_time_ns(0, 3, S) == round(3 * ALPHA + S / BW)
    for group in ((0, 1, 2), (1, 3, 5)):
        got = ring6.collective_time_ns(CommType.ALL_REDUCE, S, group)
        assert got == round(2 * 2 * (2 * ALPHA + S / (3 * BW))), group
    # a group filling the ring: its neighbours, one hop
    assert ring6.collective_time_ns(CommType.ALL_REDUCE, S, range(6)) == round(2 * 5 * (ALPHA + S / (6 * BW)))
    # nodes on a ring of nodes (a switch inside each): ranks on nodes 0 and 2 of 4 are 2 hops apart
    nodes = _two_levels(("switch", 2), ("ring", 4))
    got = ModelTiming(nodes, algorithm="ring").collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 4, 5))
    assert got == round(2 * 3 * (2 * ALPHA + S / (4 * BW)))


def test_a_hierarchical_all_reduce_over_nodes_apart_round_a_ring_pays_their_gap_between_nodes() -> None:
    # nodes of 2 on a ring of 4 nodes; ranks 0, 1 (node 0) and 4, 5 (node 2): the inter-node rings step 2
    # hops, the intra-node phases one switch latency. Before, one ring α whatever the nodes' distance
    nodes = _two_levels(("switch", 2), ("ring", 4))
    timing = ModelTiming(nodes, algorithm="hierarchical")
    intra = 300 + S / (2 * 200.0)
    inter = 2 * ALPHA + S / (2 * 2 * BW)
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 4, 5)) == round(2 * intra + 2 * inter)
    # neighbouring nodes: one hop
    near = ALPHA + S / (2 * 2 * BW)
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 2, 3)) == round(2 * intra + 2 * near)


def test_a_halving_doubling_reduce_scatter_of_a_group_not_a_power_of_two_pays_the_fold_too() -> None:
    # MPICH's recursive halving on p = q + r members: the first 2r fold in pairs (one sends its whole S to the
    # other, α + S/B), the q left halve over the p pieces of S/p, the first r of them holding two (their
    # partner's too), so the pair holding piece 0 moves the most each step, then each folded member gets its
    # own piece back (α + S/(pB)). Before, every p was charged ⌈log2 p⌉ α + (p-1)/p S/B, the least a port
    # moves, with no fold, while the all_reduce paid it: 3 ranks, 6 MiB, 84,886 ns here, now 253,158
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    timing = ModelTiming(flat, algorithm="halving_doubling")
    big = 6 * S
    # 3 ranks, q = 2: fold S; one step, new rank 0 holding pieces 0 and 1 receives both, 2 S/3; S/3 back
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, big, range(3)) == round(
        3 * ALPHA + (1 + 2 / 3 + 1 / 3) * big / BW
    )
    # 6 ranks, q = 4, r = 2: fold S; new rank 0's half [0, 2) is 2 + 2 pieces, then [0, 1) 2 pieces; S/6 back
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, big, range(6)) == round(
        4 * ALPHA + (1 + 4 / 6 + 2 / 6 + 1 / 6) * big / BW
    )
    # a power of two keeps recursive halving alone
    assert timing.collective_time_ns(CommType.REDUCE_SCATTER, big, range(8)) == round(
        3 * ALPHA + 7 / 8 * big / BW
    )
    # all_gather (Bruck's) takes ⌈log2 p⌉ steps and (p-1)/p of S for any p: no fold (S: 3 pieces of 2 MiB)
    assert timing.collective_time_ns(CommType.ALL_GATHER, 2 * S, range(3)) == round(
        2 * ALPHA + 2 / 3 * 3 * 2 * S / BW
    )


def test_each_way_a_halving_reduce_scatter_not_a_power_of_two_is_costed_agrees_on_a_flat_switch() -> None:
    # halving_doubling's and tree's (charged halving's formula) reduce_scatter and reduce_scatter_block, and a
    # group across two dimensions alike (a GPU a link, 500 ns, 50 GB/s on both: a flat switch), all pay the
    # fold: p = 5, q = 4, r = 1: new rank 0's half [0, 2) is 2 + 1 pieces, then [0, 1) 2
    flat = Topology(name="f", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=BW, latency_ns=ALPHA),))
    two = Topology(
        name="two",
        dims=(
            Dimension(kind="switch", size=3, bandwidth_gbps=BW, latency_ns=ALPHA),
            Dimension(kind="fat_tree", size=2, bandwidth_gbps=BW, latency_ns=ALPHA),
        ),
    )
    big = 6 * S
    want = {
        3: 3 * ALPHA + (1 + 2 / 3 + 1 / 3) * big / BW,
        5: 4 * ALPHA + (1 + 3 / 5 + 2 / 5 + 1 / 5) * big / BW,
        6: 4 * ALPHA + (1 + 4 / 6 + 2 / 6 + 1 / 6) * big / BW,
    }
    for p, t in want.items():
        for algorithm in ("halving_doubling", "tree"):
            for comm_type in (CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK):
                got = ModelTiming(flat, algorithm=algorithm).collective_time_ns(comm_type, big, range(p))
                assert got == round(t), (p, algorithm, comm_type)
    across = ModelTiming(two, algorithm="halving_doubling")
    assert across.collective_time_ns(CommType.REDUCE_SCATTER, big, range(6)) == round(want[6])
    assert across.collective_time_ns(CommType.REDUCE_SCATTER, big, (0, 1, 3, 4, 5)) == round(want[5])


def test_a_hierarchical_all_reduce_whose_members_leave_units_of_a_ring_inside_a_node_out_pays_their_gap() -> (
    None
):
    # a ring of 4 inside each node, nodes on a switch; ranks 0, 2 (node 0) and 4, 6 (node 1): the intra-node
    # rings step 2 hops round the ring of 4, as the inter-node ones pay their gap round a ring of nodes
    timing = ModelTiming(_two_levels(("ring", 4), ("switch", 2)), algorithm="hierarchical")
    inter = ALPHA + S / (2 * 2 * BW)
    apart = 2 * 300 + S / (2 * 200.0)
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 4, 6)) == round(2 * apart + 2 * inter)
    # neighbours round the ring: one hop
    near = 300 + S / (2 * 200.0)
    assert timing.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 4, 5)) == round(2 * near + 2 * inter)


def test_a_ring_inside_each_node_pays_the_gap_between_the_nodes_own_members() -> None:
    # ranks 0, 2 (node 0, units 0 and 2 of its ring of 4) and 5, 7 (node 1, units 1 and 3): 2 hops apart in
    # each node, as 0, 2, 4, 6 are. Before, the units the two nodes hold together (0 to 3) filled the ring
    # and its steps were charged one hop, as neighbours 0, 1, 4, 5 are
    topo = _two_levels(("ring", 4), ("switch", 2))
    hierarchical = ModelTiming(topo, algorithm="hierarchical")
    inter = ALPHA + S / (2 * 2 * BW)
    apart = 2 * 300 + S / (2 * 200.0)
    assert hierarchical.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 5, 7)) == round(
        2 * apart + 2 * inter
    )
    # the ring algorithm over both nodes: each of its 2(p - 1) steps as long as its widest gap, 2 hops (the
    # slower dimension's α, the slower bandwidth)
    ring = ModelTiming(topo, algorithm="ring")
    got = ring.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 5, 7))
    assert got == ring.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 4, 6))
    assert got == round(2 * 3 * (2 * ALPHA + S / (4 * BW)))
    # a ring of nodes (the outermost dimension) is one ring, whichever slot of a node each member holds:
    # ranks 0 (slot 0 of node 0) and 5 (slot 1 of node 2) are 2 hops apart
    pair = ModelTiming(_two_levels(("switch", 2), ("ring", 4)), algorithm="ring")
    assert pair.collective_time_ns(CommType.ALL_REDUCE, S, (0, 5)) == round(2 * (2 * ALPHA + S / (2 * BW)))


def test_a_ring_of_nodes_is_ordered_by_the_nodes_not_by_rank_under_a_round_robin_placement() -> None:
    # round robin: rank r on node r % 4, so ranks 0, 2, 5, 7 are on nodes 0, 2, 1, 3: the ring of nodes is
    # filled, its steps to neighbours, one hop; in rank order the ring would go 0, 2, 1, 3, 2 hops a step
    dims = _two_levels(("switch", 2), ("ring", 4)).dims
    rr = ModelTiming(Topology(name="rr", dims=dims, placement="round_robin"), algorithm="ring")
    assert [rr.topology.coords(r)[1] for r in (0, 2, 5, 7)] == [0, 2, 1, 3]
    assert rr.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 5, 7)) == round(
        2 * 3 * (ALPHA + S / (4 * BW))
    )


def test_a_ring_algorithm_on_a_group_that_leaves_units_of_both_rings_of_a_torus_out_pays_the_widest_gap() -> (
    None
):
    # 4 x 4 (rank x + 4 y): ranks 0, 2, 8 and 10 are (0, 0), (2, 0), (0, 2), (2, 2), every ring step 2 hops
    # on whichever ring it goes round: 2 alpha a step, where one hop was charged (2 · 3 (500 + S/200):
    # 34,457 ns). A group filling the torus: its neighbours, one hop
    torus = ModelTiming(_torus(4, 4), algorithm="ring")
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 8, 10))
    assert got == round(2 * 3 * (2 * ALPHA + S / (4 * BW))) == 37_457
    assert torus.collective_time_ns(CommType.ALL_REDUCE, S, range(16)) == round(
        2 * 15 * (ALPHA + S / (16 * BW))
    )
    # the gaps of the ring with the wider ones: ranks 0, 1, 8 and 9 step 1 hop round the inner ring, 2 round
    # the outer
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 8, 9))
    assert got == round(2 * 3 * (2 * ALPHA + S / (4 * BW))) == 37_457
    # ranks 0 and 9, (0, 0) and (1, 2): each step's message crosses both rings, 1 + 2 hops, as a message
    # between the two pays; the all_reduce is no cheaper than that message
    assert torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 9)) == round(2 * (3 * ALPHA + S / (2 * BW)))
    assert torus.p2p_time_ns(0, 9, S) == round(3 * ALPHA + S / BW)


def test_a_ring_algorithm_on_a_torus_pays_the_hops_its_steps_between_rows_cross_on_the_inner_ring() -> None:
    # 4 x 4 (rank x + 4 y): ranks 0, 2, 9 and 11 are (0, 0), (2, 0), (1, 2), (3, 2). Each ring's widest gap is
    # 2, but any ring through them goes between the rows twice, from an even x to an odd one: 2 hops round
    # the outer ring and 1 round the inner, 3, as the message 0 to 9 pays. The tie between the rings went to
    # the inner one's steps, 2 hops: 37,457 ns (2 · 3 (2 · 500 + S/200)), where 3 hops is 40,457
    torus = ModelTiming(_torus(4, 4), algorithm="ring")
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 9, 11))
    assert got == round(2 * 3 * (3 * ALPHA + S / (4 * BW))) == 40_457
    # ranks 0, 2, 8 and 10 (every step 2 hops, on one ring alone) still pay 2
    assert torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 8, 10)) == 37_457
    # the rings are compared by their widest steps, not their first: on 8 x 4 (rank x + 8 y), x 0, 1 and 4 in
    # rows 0 and 2 step 1, 3 and 4 hops round the inner ring (widest 4), 2 between the rows: 4 hops
    wide = ModelTiming(_torus(8, 4), algorithm="ring")
    got = wide.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 4, 16, 17, 20))
    assert got == round(2 * 5 * (4 * ALPHA + S / (6 * BW))) == 54_953


def test_each_phase_of_a_hierarchical_all_reduce_on_a_torus_pays_its_own_rings_widest_gap() -> None:
    # 4 x 4 (rank x + 4 y), nodes the rows (y): ranks 0, 1, 8 and 9 are 2 nodes (y 0 and 2) of 2 neighbours
    # (x 0 and 1): the inner ring steps 1 hop, the outer 2, where both paid the outer's 2 (35,457 ns)
    torus = ModelTiming(_torus(4, 4), algorithm="hierarchical")
    inner = ALPHA + S / (2 * BW)  # (p0 − 1)(α0 + S/(p0 B0)), p0 = 2
    outer = 2 * ALPHA + S / (4 * BW)  # (p1 − 1)(α1 + S/(p0 p1 B1)), p1 = 2, 2 hops
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 1, 8, 9))
    assert got == round(2 * inner + 2 * outer) == 34_457
    # the other way round: ranks 0, 2, 4 and 6 are 2 neighbouring nodes (y 0 and 1) of x 0 and 2, 2 hops apart
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 4, 6))
    assert got == round(2 * (2 * ALPHA + S / (2 * BW)) + 2 * (ALPHA + S / (4 * BW))) == 34_457
    # ranks 0, 2, 8 and 10: 2 hops on both rings
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, (0, 2, 8, 10))
    assert got == round(2 * (2 * ALPHA + S / (2 * BW)) + 2 * outer) == 35_457
    # a group filling the torus: neighbours on both, one hop; 4 nodes of 4, 3 steps each
    got = torus.collective_time_ns(CommType.ALL_REDUCE, S, range(16))
    assert got == round(2 * 3 * (ALPHA + S / (4 * BW)) + 2 * (3 * ALPHA + 3 * S / (16 * BW))) == 45_322


def test_a_hierarchical_all_to_all_inside_one_node_costs_no_more_than_the_same_across_two_nodes() -> None:
    # NCCL runs an all_to_all as grouped point-to-point messages, all at once, whatever its algorithm; across
    # nodes it is costed so, link by link, one α. Inside one node `hierarchical` fell back to the ring's
    # (p − 1) steps: on `two_node_ib` (24 GB/s, 2 us PCIe; one 25 GB/s, 4 us IB link a node) DLRM's 192 B
    # all_to_all of 8 ranks took 14,007 ns with the 8 GPUs on one PCIe switch and 4,015 ns split over two
    # nodes, and the whole step was faster on the slower network (18.709 ms, not 18.719). Now the direct
    # formula inside a node: α + (p − 1)/p · S/B
    def two_node_ib(per_node: int) -> Topology:
        return Topology(
            name="two_node_ib",
            dims=(
                Dimension(kind="switch", size=per_node, bandwidth_gbps=24.0, latency_ns=2_000),
                Dimension(kind="fat_tree", size=0, bandwidth_gbps=25.0, latency_ns=4_000, links_per_node=1),
            ),
        )

    size = 192
    one_node = ModelTiming(two_node_ib(8), algorithm="hierarchical")
    two_nodes = ModelTiming(two_node_ib(4), algorithm="hierarchical")
    inside = one_node.collective_time_ns(CommType.ALL_TO_ALL, size, range(8))
    across = two_nodes.collective_time_ns(CommType.ALL_TO_ALL, size, range(8))
    assert inside == round(2_000 + 7 / 8 * size / 24.0) == 2_007
    assert across == round(4_000 + 4 * 4 * (size // 8) / 25.0) == 4_015
    # the other collectives keep hierarchical's ring inside a node (an all_gather of 8 pieces of S)
    assert one_node.collective_time_ns(CommType.ALL_GATHER, S, range(8)) == round(7 * (2_000 + S / 24.0))


def test_a_hierarchical_all_to_all_on_one_dimension_costs_what_a_direct_one_does() -> None:
    # hierarchical's all_to_all on one dimension is direct (flat_algorithm): its links and its α, a fully
    # connected node's p − 1 links at once, and every pair's hops, not the ring's neighbours'
    for kind in ("fully_connected", "ring", "switch"):
        topo = Topology(
            name="node",
            dims=(
                Dimension(kind=kind, size=8, bandwidth_gbps=24.0, latency_ns=2_000),
                Dimension(kind="fat_tree", size=0, bandwidth_gbps=25.0, latency_ns=4_000, links_per_node=1),
            ),
        )
        for members in (range(8), (0, 2, 5)):
            direct, hier = (ModelTiming(topo, algorithm=a) for a in ("direct", "hierarchical"))
            want = direct.collective_time_ns(CommType.ALL_TO_ALL, S, members)
            got = hier.collective_time_ns(CommType.ALL_TO_ALL, S, members)
            assert got == want, (kind, members)
