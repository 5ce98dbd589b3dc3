"""The two ways of timing communication in simulated replay.

``as_recorded`` (:class:`AsRecorded`): the transfer is taken from the trace with the wait for late peers
removed. For member ``m`` of a collective, ``transfer_m = recorded end_m − max(recorded arrivals)``
(clamped >= 0); a send/recv pair is a two-member group, so the recv completes at ``max(send start, recv
start) + recorded transfer``. Replaying an unmodified trace reproduces the measured run.

``model`` (:class:`ModelTiming`): every member ends ``T`` after the last arrival, with ``T`` from the
topology and the collective algorithm (``skewlens.replay.network.algorithms``). With ``contention=True``
a group's transfer is a flow over the links of the dimensions it spans (``Topology.link``: a rank's port,
its node's links on outer dimensions), and concurrent flows on a link share it. Both use the same links: a
lone transfer costs the same with and without contention, members of one group sharing a link being in the
formula's load of the busiest link (``Topology.outer_load``).

Network slowdowns (``Effects`` objects that also implement
:class:`~skewlens.replay.effects.NetworkEffects`) scale bandwidth and add latency in both modes: as
recorded, ``transfer' = transfer / factor + extra``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from skewlens.profiler.vocab import EMPTY_WAITS_FOR_NONE, CommType
from skewlens.replay.core import Flow
from skewlens.replay.effects import NetworkEffects
from skewlens.replay.errors import MAX_SIM_NS, SIM_CLOCK, ConfigError
from skewlens.replay.network.algorithms import (
    ALGORITHMS,
    double_binary_tree_edges,
    even_split_bytes,
    flat_algorithm,
    flat_time_ns,
    hierarchical_time_ns,
    p2p_time_ns,
    ring_exchange_load,
)
from skewlens.replay.network.topology import Topology, TopologyError, config_message, ring_arcs

#: Per dimension of a topology, a network slowdown's ``(bandwidth factor, extra latency ns)`` on its links.
Adjust = tuple[tuple[float, int], ...]

#: Collectives in which, under ``direct``, every member sends an equal part to every other (an all_reduce
#: twice): across dimensions, costed link by link (:meth:`ModelTiming._exchange_t`).
_EXCHANGES = frozenset(
    {CommType.ALL_REDUCE, CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK, CommType.ALL_GATHER}
)


def message_bytes(comm_type: CommType, comm_bytes: int, p: int) -> int:
    """The message size ``S`` of the cost formulas (``skewlens.replay.network.algorithms``) of a collective
    whose members' calls are ``comm_bytes`` each. ``comm_size`` is the bytes of a member's input buffer
    (Chakra's convention, ``skewlens.profiler.importers.convert``): the whole ``S`` for most types, but one
    member's piece of the ``S`` bytes gathered for all_gather and gather, so ``S = p * comm_bytes`` there."""
    if comm_type in (CommType.ALL_GATHER, CommType.GATHER):
        return comm_bytes * p
    return comm_bytes


class AsRecorded:
    """Transfers as recorded (wait for late peers removed)."""

    __slots__ = ("net",)

    def __init__(self, network_effects: NetworkEffects | None = None) -> None:
        self.net = network_effects

    def _adjust(self, ranks: Sequence[int], step: int, recorded: list[int]) -> list[int]:
        if self.net is None:
            return recorded
        factor, extra = self.net.comm_adjust(ranks, step)
        if factor == 1.0 and extra == 0:
            return recorded
        return [round(t / factor) + extra for t in recorded]

    def collective(
        self,
        comm_type: CommType,
        nbytes: int,
        ranks: Sequence[int],
        step: int,
        recorded: list[int],
        *,
        pairs: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[int]:
        del comm_type, nbytes, pairs
        return self._adjust(ranks, step, recorded)

    def p2p(self, src: int, dst: int, nbytes: int, step: int, recorded: list[int]) -> list[int]:
        del nbytes
        return self._adjust((src, dst), step, recorded)

    def flow(self, ranks: Sequence[int], alone_ns: int) -> Flow | None:
        del ranks, alone_ns
        return None


class ModelTiming:
    """Transfers computed from a topology and a collective algorithm (see ``skewlens.replay.network``)."""

    __slots__ = ("_cache", "algorithm", "contention", "link_ids", "net", "topology")

    def __init__(
        self,
        topology: Topology,
        *,
        algorithm: str = "ring",
        contention: bool = False,
        network_effects: NetworkEffects | None = None,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        self.topology = topology
        self.algorithm = algorithm
        self.contention = contention
        self.net = network_effects
        self.link_ids: dict[tuple[int, ...], int] = {}
        self._cache: dict[tuple[object, ...], int] = {}

    def _spanned(self, ranks: Sequence[int]) -> tuple[int, ...]:
        try:
            return self.topology.spanned(ranks)
        except TopologyError as e:
            raise ConfigError(config_message(e)) from None

    def _adjust(self, ranks: Sequence[int], step: int) -> tuple[float, int]:
        return self.net.comm_adjust(ranks, step) if self.net is not None else (1.0, 0)

    def _adjust_dims(self, members: tuple[int, ...], step: int) -> Adjust:
        """Per dimension of the topology, the network slowdown's ``(bandwidth factor, extra latency)`` on
        the group's links there: a slowed link between two members slows only the dimensions their traffic
        crosses (a slow NVLink pair, not the NICs of a group spanning nodes); on one dimension, what
        :meth:`_adjust` gives the group."""
        n = len(self.topology.dims)
        net = self.net
        if net is None or len(self._spanned(members)) < 2:
            return (self._adjust(members, step),) * n
        return tuple(
            net.comm_adjust(members, step, (d, lambda a, b: self._spanned((a, b)))) for d in range(n)
        )

    def collective_time_ns(
        self,
        comm_type: CommType,
        nbytes: int,
        ranks: Sequence[int],
        step: int = -1,
        *,
        pairs: Sequence[tuple[int, int, int]] | None = None,
    ) -> int:
        """Model time of one collective among ``ranks`` (all members end together); ``pairs``: an uneven
        all_to_all's traffic per pair (``skewlens.replay.lower.collective_pairs``).

        An all_to_all whose group spans more than one dimension is costed link by link, whatever the
        algorithm: its pairs' bytes through the links they cross (:meth:`_pairs_ns`), an even one's parts
        likewise (:meth:`_even_all_to_all_ns`), so that nearly even splits cost nearly what even ones do
        (before, an even all_to_all got the flat formula at the slowest dimension's bandwidth, blind to the
        members sharing a node's link: 8 ranks of 64 MiB on ``two_node_ib`` 2.47 ms even, 5.37 ms with one
        byte more to one member), and where it spans a ring dimension, at least that ring's busiest link's
        bytes (each pair crossing it by the shortest way, :meth:`_ring_loads`). An uneven one on a ring
        alone keeps its formula, at least its busiest ring link's bytes from its pairs. An all_reduce,
        all_gather, reduce_scatter or reduce of 0 bytes (``nbytes``: its largest member's) costs nothing:
        it waits for no one and moves nothing (:data:`~skewlens.profiler.vocab.EMPTY_WAITS_FOR_NONE`), not
        the formulas' latency (on 64 ranks of ``dgx_h100_8x`` 79.8 µs for an empty all_reduce, 315 µs for
        an empty reduce)."""
        members = tuple(sorted(set(ranks)))
        if len(members) <= 1 or (nbytes == 0 and comm_type in EMPTY_WAITS_FOR_NONE):
            return 0
        adj = self._adjust_dims(members, step)
        if comm_type == CommType.ALL_TO_ALL and any(f != 1.0 for f, _extra in adj):
            slowed = self._pairs_slowed_ns(nbytes, members, step, adj, pairs)
            if slowed is not None:
                return slowed
        across = comm_type == CommType.ALL_TO_ALL and len(self._spanned(members)) >= 2
        if across and pairs is not None:
            # not cached: uneven splits seldom repeat, and a key would hold p² pairs (MoE: one per call)
            return self._pairs_ns(pairs, members, adj)
        if comm_type == CommType.ALL_TO_ALL and pairs is not None and self._ring_alone(members):
            # round a ring, its busiest ring link's bytes from the pairs, not the even cut's (not cached)
            (d,) = self._spanned(members)
            link_bytes = max(self._ring_loads(pairs, d, members).values(), default=0.0)
            return self._collective_ns(
                comm_type, nbytes, members, adj, ring_link_bytes=link_bytes, pairs=pairs
            )
        key = (comm_type, nbytes, members, adj)
        cached = self._cache.get(key)
        if cached is None:
            if across:
                cached = self._even_all_to_all_ns(nbytes, members, adj)
            else:
                size = message_bytes(comm_type, nbytes, len(members))
                cached = self._collective_ns(comm_type, size, members, adj)
            self._cache[key] = cached
        return cached

    def _ring_alone(self, members: tuple[int, ...]) -> bool:
        """Whether the group spans one dimension, a ``ring``."""
        dims = self._spanned(members)
        return len(dims) == 1 and self.topology.dims[dims[0]].kind == "ring"

    def _collective_ns(
        self,
        comm_type: CommType,
        nbytes: int,
        members: tuple[int, ...],
        adj: Adjust,
        *,
        ring_link_bytes: float | None = None,
        pairs: Sequence[tuple[int, int, int]] | None = None,
    ) -> int:
        """The flat (or hierarchical) formula's time; on a ring alone an exchange's bandwidth term is at
        least its busiest ring link's bytes a phase over ``B``: ``ring_link_bytes`` (an uneven all_to_all's,
        from its pairs, :meth:`_ring_loads`), or None: even parts (:meth:`_even_ring_link_bytes`). ``pairs``:
        an uneven all_to_all's, whose farthest the messages' hops are (None: the group's farthest pair)."""
        p = len(members)
        dims = self._spanned(members)
        ds = [self.topology.dims[d] for d in dims]
        if self.algorithm == "hierarchical" and len(dims) >= 2 and dims[0] == 0:
            p0, p1 = self.topology.group_layout(members)
            # each phase's step to the next member (node) round its own dimension, if a ring: that ring's
            # widest gap in hops (on a torus the inner ring's and the outer's apart: ranks 0, 1, 8, 9 of a
            # 4 x 4 one 1 hop inside, 2 between nodes, where both paid the larger); every other dimension
            # one α
            rings = self._ring_dims(dims)
            hop_alphas = [
                self._hop_alphas(adj, members, self._ring_order_pairs(members, d))[d]
                if d in rings
                else self.topology.dims[d].latency_ns + adj[d][1]
                for d in range(len(self.topology.dims))
            ]
            inner = (hop_alphas[0], ds[0].effective_bandwidth_gbps * adj[0][0])
            # the inter-node phase at the outer dimension whose busiest link takes longest: its load per byte
            # (the p0 rings at once; members sharing a node's link (NIC); a node with fewer members)
            load, bw = max(
                (
                    (
                        self.topology.outer_load(members, d),
                        self.topology.dims[d].effective_bandwidth_gbps * adj[d][0],
                    )
                    for d in dims[1:]
                ),
                key=lambda lb: lb[0] / lb[1],
            )
            outer = (max(hop_alphas[d] for d in dims[1:]), bw)
            return self._ns(
                hierarchical_time_ns(
                    comm_type, nbytes=nbytes, p0=p0, p1=p1, inner=inner, outer=outer, outer_load=load, p=p
                ),
                f"one {comm_type.name.lower()} of {nbytes:,} B among {p} ranks",
            )
        ring_alone = self._ring_alone(members)
        rings = self._ring_dims(dims)
        # tree's reduce_scatter and all_gather are charged halving's formula: on a group spanning a ring
        # dimension, its steps
        halving = self.algorithm == "halving_doubling" or (
            bool(rings) and self.algorithm == "tree" and comm_type != CommType.ALL_REDUCE
        )
        if (len(dims) >= 2 or (ring_alone and halving)) and nbytes > 0 and comm_type in _EXCHANGES:
            # across dimensions, link by link: once (reduce_scatter, all_gather) or twice (an all_reduce's
            # reduce-scatter, then all-gather); direct: every member sends S/p to every other at once, as an
            # even all_to_all is costed; halving_doubling (a power-of-two group; tree's reduce_scatter and
            # all_gather, charged its formula, on a group spanning a ring dimension): step by step, round a
            # ring alone too; on any ring dimension spanned its partners p/2, p/4, ... away share the
            # ring's links; each step's (each exchange's) messages pay their farthest pair's ring hops
            phase: float | None = None
            if self.algorithm == "direct":
                phase = self._exchange_t(nbytes // p, members, adj)
            elif halving and p & (p - 1) == 0:
                phase = self._halving_doubling_t(nbytes, members, adj)
            if phase is not None:
                phases = 2 if comm_type == CommType.ALL_REDUCE else 1
                return self._ns(
                    phases * phase, f"one {comm_type.name.lower()} of {nbytes:,} B among {p} ranks"
                )
        # messages between non-neighbours pay their farthest pair's hops (the group's, or an uneven
        # all_to_all's pairs') on every ring dimension the group spans, summed, whether or not the ring is the
        # slowest dimension; ring's and hierarchical's go to the next member round the ring, one hop where the
        # group fills it, more where it does not (a 2 x 3 mesh's dp pair 0 and 3 on a ring of 6: 3 hops; on a
        # torus, the largest of each ring's widest gap)
        # (hierarchical's all_to_all: direct, flat_algorithm)
        algorithm = flat_algorithm(self.algorithm, comm_type)
        ring_order = algorithm == "ring"
        alphas = self._hop_alphas(adj, members, self._ring_order_pairs(members) if ring_order else pairs)
        alpha = max(alphas[d] for d in dims)
        bw = min(self.topology.dims[d].effective_bandwidth_gbps * adj[d][0] for d in dims)
        if algorithm == "direct" and all(d.kind == "fully_connected" for d in ds):
            # a link between every pair: a member's p − 1 parts (a root's copies) leave over p − 1 links at
            # once, not one after another through one port (a broadcast of 8 ranks took 7 S/B, not S/B)
            bw *= p - 1
        t = flat_time_ns(self.algorithm, comm_type, nbytes=nbytes, p=p, alpha=alpha, bw=bw)
        exchange = comm_type == CommType.ALL_TO_ALL or (
            self.algorithm == "direct" and comm_type in _EXCHANGES
        )
        if exchange and ring_alone and nbytes > 0:
            # every member's part to every other round the ring: even, the busiest link carries q²/8 parts
            # each way, more than a port's q − 1 from 8 members (a 64-rank all_to_all of 64 MiB on the ring
            # preset was a switch's 1.35 ms, its links' 10.77 ms); uneven, what its pairs put on it
            phases = 2 if comm_type == CommType.ALL_REDUCE else 1
            link = self._even_ring_link_bytes(nbytes, members) if ring_link_bytes is None else ring_link_bytes
            t += self._ring_link_excess(comm_type, nbytes, p, bw, phases * link / bw)
        if self.algorithm == "tree" and comm_type == CommType.ALL_REDUCE and rings and nbytes > 0:
            # NCCL's double binary tree: each edge of its two trees carries S/2 each way, by the shortest way
            # round; from 16 members the busiest ring link carries more than a port's 2 S (3 S at 16, 5 S
            # at 64), which sets the bandwidth term
            flows = [
                (members[a], members[b], nbytes / 2)
                for child, parent in double_binary_tree_edges(p)
                for a, b in ((child, parent), (parent, child))
            ]
            link_ns = max(
                load / (self.topology.dims[d].effective_bandwidth_gbps * adj[d][0])
                for d in rings
                for load in self._ring_loads(flows, d, members).values()
            )
            t += self._ring_link_excess(comm_type, nbytes, p, bw, link_ns)
        return self._ns(t, f"one {comm_type.name.lower()} of {nbytes:,} B among {p} ranks")

    def _ring_link_excess(self, comm_type: CommType, nbytes: int, p: int, bw: float, link_ns: float) -> float:
        """What the busiest ring link's bytes take, ``link_ns``, beyond the flat formula's bandwidth term at
        ``bw`` (0 where they take less): added to the formula's time, its bandwidth term is at least that
        link's."""
        moved = flat_time_ns(self.algorithm, comm_type, nbytes=nbytes, p=p, alpha=0.0, bw=bw)
        return max(0.0, link_ns - moved)

    def _even_ring_link_bytes(self, nbytes: int, members: tuple[int, ...]) -> float:
        """The bytes the busiest link of a ring carries each way when each of ``members`` (a group on that
        ring alone) sends ``S/p`` to every other by the shortest way: where the group fills the ring, the
        cut's ``q²/8`` parts (``ring_exchange_load``); where it does not (8 ranks of a ring of 16: a line,
        whose middle link carries 16 parts, not 8), what :meth:`_ring_loads` puts on it. The callers'
        results are cached per group and size (:meth:`collective_time_ns`)."""
        p = len(members)
        (d,) = self._spanned(members)
        if p == self._ring_size(d, members):
            return ring_exchange_load(p) * (nbytes / p)
        part = nbytes / p
        flows = ((a, b, part) for a in members for b in members if a != b)
        return max(self._ring_loads(flows, d, members).values(), default=0.0)

    def _pairs_slowed_ns(
        self,
        nbytes: int,
        members: tuple[int, ...],
        step: int,
        adj: Adjust,
        pairs: Sequence[tuple[int, int, int]] | None,
    ) -> int | None:
        """An all_to_all under a network slowdown that slows some of its links or pairs and not others (a
        slowed rank or node: its links; a slowed link ``(a, b)``: the traffic between ``a`` and ``b``): each
        link the pairs' bytes cross (as :meth:`_pairs_ns`) carries them at its own bandwidth, the slowdown's
        factor for the ranks it belongs to (``comm_adjust`` of them: a rank's port, a node's link of the
        ranks on it), and no pair's bytes pass faster than the slowdown lets that pair's traffic go
        (``comm_adjust`` of its two ranks); the latency is the group's. A link's time: its latency, plus the
        longer of its bytes at its bandwidth and its slowest pair's; on one dimension, the flat formula of
        the busiest port's bytes so weighed, and round a ring at least its busiest ring link's so weighed (a
        ring link belongs to the members at its two ends: a slowed rank slows the traffic passing through
        it too); across dimensions, a ring dimension's links too, each at the factor of the members at its
        two end units on that ring (:meth:`_ring_loads`). None where every link and pair has the group's
        factor, for
        the costs below. So rank 3 of 4 on one switch at a tenth of the bandwidth, sending 98,304 B to a
        hot expert's rank that received 3 such parts, makes that all_to_all 20,661 ns (its own port's
        98,304 B at a tenth), not the hot rank's 294,912 B at a tenth (59,982)."""
        net = self.net
        if net is None:
            return None
        p = len(members)
        key: tuple[object, ...] | None = None
        if pairs is None:  # even: every member sends its equal part to every other
            key = ("pairs slowed", nbytes, members, step)
            if key in self._cache:
                cached = self._cache[key]
                return cached if cached >= 0 else None
            part = even_split_bytes(nbytes, p)
            pairs = [(a, b, part) for a in members for b in members if a != b] if part > 0 else []
        dims = self._spanned(members)
        multi = len(dims) >= 2
        ring = self._ring_alone(members)
        size = self._ring_size(dims[0], members) if ring else 0

        def spanned(a: int, b: int) -> Sequence[int]:
            return self._spanned((a, b))

        def factor(ranks: Sequence[int], d: int) -> float:
            return net.comm_adjust(ranks, step, (d, spanned) if multi else None)[0]

        # per direction, link: [bytes through it, its slowest pair's bytes over that pair's factor]
        loads: tuple[dict[tuple[int, ...], list[float]], ...] = ({}, {})
        owners: dict[tuple[int, ...], set[int]] = {}
        differ = False
        ring_floor = 0.0  # round a ring: the most any pair's share of bytes over its factor
        for src, dst, n in pairs:
            for d in spanned(src, dst) if multi else dims:
                f = factor((src, dst), d)
                differ = differ or f != adj[d][0]
                for load, r in zip(loads, (src, dst), strict=True):
                    k = self.topology.link(r, d)
                    owners.setdefault(k, set()).add(r)
                    cur = load.setdefault(k, [0.0, 0.0])
                    cur[0] += n
                    cur[1] = max(cur[1], n / f)
                if ring:
                    a, b = self.topology.coords(src)[d], self.topology.coords(dst)[d]
                    ring_floor = max([ring_floor] + [n * share / f for *_, share in ring_arcs(a, b, size)])
        link_f = {k: factor(tuple(sorted(rs)), k[0]) for k, rs in owners.items()}
        ring_loads = self._ring_loads(pairs, dims[0], members) if ring else {}
        if ring:
            # a ring link is its two ends' (a slowed rank slows the traffic passing through it too); a
            # unit no member holds is not the group's, nor its slowdown
            at = {self.topology.coords(r)[dims[0]]: r for r in members}
            for k in ring_loads:
                ends = (k[2], (k[2] + k[3]) % size)
                link_f[k] = factor(tuple(sorted(at[c] for c in ends if c in at)), k[0])
        differ = differ or any(f != adj[k[0]][0] for k, f in link_f.items())
        result: int | None = None
        if differ:
            unit = tuple((1.0, extra) for _f, extra in adj)
            weighed = [{k: max(n / link_f[k], slowest) for k, (n, slowest) in load.items()} for load in loads]
            if multi:
                alphas = self._hop_alphas(unit, members, pairs)
                t = max(self._busiest_t(w, unit, alphas) for w in weighed)
                for d in self._ring_dims(dims):
                    # a ring link is its two end units' members on that ring's (as round a ring alone): a
                    # unit no member holds is not the group's, nor its slowdown (its factor: none's)
                    size = self._ring_size(d, members)
                    ring_w: dict[tuple[int, ...], float] = {}
                    for k, carried in self._ring_loads(pairs, d, members).items():
                        ends, rail, outer = (k[2], (k[2] + k[3]) % size), -1 - k[1], k[4:]
                        on_ends = tuple(
                            r
                            for r in members
                            if (c := self.topology.coords(r))[d] in ends
                            and c[d + 1 :] == outer
                            and self.topology.link(r, d)[1] == rail
                        )
                        ring_w[k] = carried / factor(on_ends, d)
                    t = max(t, self._busiest_t(ring_w, unit, alphas))
                result = self._ns(t, f"one all_to_all of {sum(n for *_, n in pairs):,} B among {p} ranks")
            else:
                busiest = max((n for w in weighed for n in w.values()), default=0.0)
                link = max([ring_floor] + [n / link_f[k] for k, n in ring_loads.items()])
                result = self._collective_ns(
                    CommType.ALL_TO_ALL,
                    math.ceil(busiest * p / (p - 1)),
                    members,
                    unit,
                    ring_link_bytes=link if ring else None,
                    pairs=pairs,
                )
        if key is not None:
            self._cache[key] = -1 if result is None else result
        return result

    def _pairs_ns(self, pairs: Sequence[tuple[int, int, int]], members: tuple[int, ...], adj: Adjust) -> int:
        """An all_to_all's time from its traffic per pair: each pair's bytes leave the sender and enter the
        receiver through their links (``Topology.link``) on every dimension the two differ in (two ranks
        of a node: its switch only; of two nodes: their nodes' links too); the time is the busiest link's,
        ``α + bytes / B`` of its dimension (one message per pair, sent at once: ``direct``; ``α`` times the
        hops of the farthest pair round the rings they cross, :meth:`_hop_alphas`), a ring
        dimension's links among them (:meth:`_ring_loads`: each pair crossing it goes the shortest way
        round). On one dimension that is the busiest port's ``α + D/B``, what the flat formulas charge
        (which are kept there)."""
        out: dict[tuple[int, ...], float] = {}  # link: bytes leaving through it
        into: dict[tuple[int, ...], float] = {}  # link: bytes entering through it
        for src, dst, n in pairs:
            for d in self._spanned((src, dst)):
                for load, r in ((out, src), (into, dst)):
                    k = self.topology.link(r, d)
                    load[k] = load.get(k, 0) + n
        alphas = self._hop_alphas(adj, members, pairs)
        t = max(self._busiest_t(out, adj, alphas), self._busiest_t(into, adj, alphas))
        for d in self._ring_dims(self._spanned(members)):
            t = max(t, self._busiest_t(self._ring_loads(pairs, d, members), adj, alphas))
        return self._ns(t, f"one all_to_all of {sum(n for *_, n in pairs):,} B among {len(members)} ranks")

    def _ring_size(self, d: int, members: tuple[int, ...]) -> int:
        """Units of ring dimension ``d`` (one of size 0, never sized: up to the members' farthest)."""
        topo = self.topology
        return topo.dims[d].size or 1 + max(topo.coords(r)[d] for r in members)

    def _ring_loads(
        self, flows: Iterable[tuple[int, int, float]], d: int, members: tuple[int, ...]
    ) -> dict[tuple[int, ...], float]:
        """Bytes each link of ring dimension ``d`` carries, one direction (``topology.ring_arcs``'s names),
        when every ``(src, dst, bytes)`` of ``flows`` (members') that crosses ``d`` goes the shortest way
        round: each way a range of the links, summed in a difference array (a pair's cost independent of
        its hops). A pair differing in other dimensions too crosses the inner ones first (NCCL's PXN: to the
        rank slot of the destination's on its own unit, then round the ring on that slot's link, one of
        the unit's ``links_per_node`` rings side by side; a ring of nodes of 8 GPUs, each its own NIC, is
        8 rings), at its source's coordinates on the outer ones."""
        topo = self.topology
        size = self._ring_size(d, members)
        # (step, ring index, the ring's outer coords): diffs
        diff: dict[tuple[int, int, tuple[int, ...]], list[float]] = {}
        index_at: dict[tuple[int, ...], int] = {}  # the destination's slot on its unit: its ring
        for src, dst, n in flows:
            a, b = topo.coords(src), topo.coords(dst)
            arcs = ring_arcs(a[d], b[d], size)
            index = 0
            if d and arcs:
                index = index_at.get(b[:d], -1)
                if index < 0:
                    index = index_at[b[:d]] = topo.link_at(b[:d] + a[d:], d)[1]
            for step, hops, share in arcs:
                arr = diff.setdefault((step, index, a[d + 1 :]), [0.0] * size)
                # the links leaving units a, a + step, ... (hops of them), as a range of their first units
                lo = a[d] if step == 1 else (a[d] - hops + 1) % size
                end = lo + hops
                arr[lo] += n * share
                if end < size:
                    arr[end] -= n * share
                elif end > size:  # round past the last unit
                    arr[0] += n * share
                    arr[end - size] -= n * share
        loads: dict[tuple[int, ...], float] = {}
        for (step, index, outer), arr in diff.items():
            acc = 0.0
            for c, x in enumerate(arr):
                acc += x
                if acc > 0:
                    loads[(d, -1 - index, c, step, *outer)] = acc
        return loads

    def _ring_order_pairs(
        self, members: tuple[int, ...], dim: int | None = None
    ) -> tuple[tuple[int, int, float], ...]:
        """The messages of a ring algorithm's step, for the hop rule (:meth:`_hop_alphas`): on a ``ring``
        dimension the group spans, from each unit it occupies there to the next occupied one round the ring
        (the ring ordered by topology, as NCCL orders it, not by rank), so that a group that leaves units out
        pays the widest gap between its units by the shortest way (the dp pair 0 and 3 of a 2 x 3 mesh on a
        ring of 6: 3 hops, where one was charged, and a message between the two 3); on a group filling the
        ring, one hop. Spanning several ring dimensions (a torus), those of the one whose steps pay the
        most hops (:meth:`_hops`, on the other rings too), the others' ring steps no longer (ranks 0, 2, 8
        and 10 of a 4 x 4 torus: 2 hops, where one was charged; 0, 2, 9 and 11: 3, a step between the rows
        crossing the inner ring too; a group filling the torus, 1); none spanned: none, one hop. ``dim``: that
        ring dimension's steps only (a hierarchical phase's, which goes round its own ring: ranks 0, 1, 8 and
        9 of the torus 1 hop round the inner ring, 2 round the outer), none where the group does not span it.
        A ring inside each unit of the dimensions outside it (a ring of GPUs in each node) is each node's: the
        gaps are those between a node's own members (ranks 0, 2 and 5, 7 of two nodes of a ring of 4: 2 hops
        in each, where the units the nodes hold together, 0 to 3, fill the ring and were charged one)."""
        widest: tuple[int, tuple[tuple[int, int, float], ...]] = (-1, ())
        for d in self._ring_dims(self._spanned(members)):
            if dim is not None and d != dim:
                continue
            # outer position -> unit on the ring -> its first member
            at: dict[tuple[int, ...], dict[int, int]] = {}
            for r in members:
                c = self.topology.coords(r)
                at.setdefault(c[d + 1 :], {}).setdefault(c[d], r)
            order = [(on, sorted(on)) for on in at.values()]
            steps = tuple(
                (on[a], on[b], 0.0)
                for on, units in order
                for a, b in zip(units, units[1:] + units[:1], strict=True)
            )
            # the hops its steps pay (:meth:`_hops`), those on the other rings too: of ranks 0, 2, 9 and 11 of
            # a 4 x 4 torus, (0, 0), (2, 0), (1, 2), (3, 2), each ring's widest gap is 2, but a step between
            # the rows, 0 to 9, also crosses the inner ring, 3 hops, where the first ring's 2 were charged
            gap = self._hops(members, steps)
            if gap > widest[0]:
                widest = (gap, steps)
        return widest[1]

    def _ring_dims(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """The ``ring`` dimensions among ``dims``."""
        return tuple(d for d in dims if self.topology.dims[d].kind == "ring")

    def _busiest_t(
        self, load: Mapping[tuple[int, ...], float], adj: Adjust, alphas: Sequence[float]
    ) -> float:
        """The time of the busiest of the links ``load`` gives bytes to (one direction): ``α + bytes / B`` of
        the link's dimension, ``α`` the step's there (``alphas``, :meth:`_hop_alphas`: times the hops of its
        farthest pair round the rings it crosses); 0 where none carries a byte."""
        dims = self.topology.dims
        return max(
            (
                alphas[k[0]] + n / (dims[k[0]].effective_bandwidth_gbps * adj[k[0]][0])
                for k, n in load.items()
                if n > 0
            ),
            default=0.0,
        )

    def _even_all_to_all_ns(self, nbytes: int, members: tuple[int, ...], adj: Adjust) -> int:
        """An even all_to_all (each member sends ``even_split_bytes(nbytes, p)`` to every other) costed as
        :meth:`_pairs_ns` costs those pairs (:meth:`_exchange_t`)."""
        part = even_split_bytes(nbytes, len(members))
        return self._ns(
            self._exchange_t(part, members, adj),
            f"one all_to_all of {nbytes:,} B among {len(members)} ranks",
        )

    def _exchange_t(self, part: int, members: tuple[int, ...], adj: Adjust) -> float:
        """Each member sending ``part`` bytes to every other at once, costed as :meth:`_pairs_ns` costs such
        pairs without listing the ``p²`` of them: on each dimension ``d`` the group spans, a member sends a
        part to, and receives one from, each member whose coordinate ``d`` differs from its own, through
        its link there; a link's load is the sum over the members on it, the same out as in; on a ring
        dimension, its links' too, the ``p²`` parts each the shortest way round (:meth:`_ring_loads`).
        Time: the busiest link's ``α + load / B``, ``α`` times the group's farthest pair's ring hops
        (:meth:`_hop_alphas`; 0 where every part is empty, as :meth:`_pairs_ns`, which lists no pair of 0
        bytes)."""
        p = len(members)
        topo = self.topology
        dims = self._spanned(members)
        load: Counter[tuple[int, ...]] = Counter()
        for d in dims:
            coord = {r: topo.coords(r)[d] for r in members}
            same = Counter(coord.values())
            for r in members:
                load[topo.link(r, d)] += (p - same[coord[r]]) * part
        alphas = self._hop_alphas(adj, members)
        t = self._busiest_t(load, adj, alphas)
        if part > 0:
            for d in self._ring_dims(dims):
                flows = ((a, b, part) for a in members for b in members if a != b)
                t = max(t, self._busiest_t(self._ring_loads(flows, d, members), adj, alphas))
        return t

    def _halving_doubling_t(self, nbytes: int, members: tuple[int, ...], adj: Adjust) -> float:
        """Recursive halving (a reduce-scatter of ``S`` among ``p``, a power of two, members in rank order:
        the partner ``p/2`` away first, then ``p/4``, ..., exchanging ``S/2``, ``S/4``, ..., ``S/p``) link
        by link; recursive doubling (an all-gather) pairs the same distances with the same parts, in the
        other order. In each step every member sends its part to its partner (and receives one) through
        its link on each dimension the two differ in; a link's load is the sum over the members on it, and
        the step lasts its busiest link's ``α + load / B``. Members sharing a node's link (a NIC) share it
        in the steps that cross nodes, which the flat formula charged as if each had one of its own. On a
        ring dimension the group spans (alone or with others) the messages to partners beyond the next
        unit also load the ring's links between them, by the shortest way (:meth:`_ring_loads`), and each
        step pays ``α`` times its own partners' hops round the rings they cross (:meth:`_hop_alphas`). A
        16-rank reduce-scatter round a ring alone: its busiest links carry ``2 S``, ``S``, ``S/4``,
        ``S/16`` in its four steps, where its ports carry ``15/16 S`` in all, and its messages cross 8, 4, 2
        and 1 hops (each step paid the group's 8 before: 1 MiB at 50 GB/s, 500 ns, 85,468 ns, now 76,968)."""
        p = len(members)
        topo = self.topology
        dims = self._spanned(members)
        rings = self._ring_dims(dims)
        coords = [topo.coords(r) for r in members]
        t = 0.0
        dist, part = p // 2, nbytes / 2
        while dist >= 1:
            load: dict[tuple[int, ...], float] = {}
            for i, r in enumerate(members):
                j = i ^ dist
                for d in dims:
                    if coords[i][d] != coords[j][d]:
                        k = topo.link(r, d)
                        load[k] = load.get(k, 0.0) + part
            step = [(r, members[i ^ dist], part) for i, r in enumerate(members)]
            for d in rings:
                load |= self._ring_loads(step, d, members)
            t += self._busiest_t(load, adj, self._hop_alphas(adj, members, step))
            dist, part = dist // 2, part / 2
        return t

    def _ns(self, t: float, what: str) -> int:
        """``t`` rounded to ns, or a :class:`ConfigError` where it is beyond the simulator's clock (a
        bandwidth_gbps of 1e-300 crashed the simulator with an OverflowError traceback)."""
        if not t <= MAX_SIM_NS:  # NaN too
            raise ConfigError(
                f"topology {self.topology.name}: the network model times {what} at {t / 1e9:.3g} s, beyond "
                f"{SIM_CLOCK}: its dims' bandwidth_gbps / latency_ns (or a "
                "network slowdown's factor / latency_ns) are out of any real range"
            )
        return round(t)

    def p2p_time_ns(self, src: int, dst: int, nbytes: int, step: int = -1) -> int:
        """Model time of one message ``src -> dst`` over the slowest dimension they span (at its effective
        bandwidth, oversubscription applied, as a collective between the same ranks gets); its ``α``
        times its hops round the ``ring`` dimensions they differ in (:meth:`_hop_alphas`)."""
        dims = self._spanned((src, dst))
        if not dims:
            return 0
        factor, extra = self._adjust((src, dst), step)
        adj = ((factor, extra),) * len(self.topology.dims)
        alphas = self._hop_alphas(adj, (src, dst), ((src, dst, nbytes),))
        alpha = max(alphas[d] for d in dims)
        bw = min(self.topology.dims[d].effective_bandwidth_gbps for d in dims) * factor
        return self._ns(
            p2p_time_ns(nbytes, alpha, bw), f"one message of {nbytes:,} B from rank {src} to {dst}"
        )

    def _hop_alphas(
        self, adj: Adjust, members: Sequence[int], pairs: Sequence[tuple[int, int, float]] | None = None
    ) -> tuple[float, ...]:
        """The hop rule, one for every way a transfer is costed (a message, a flat formula, a step or an
        exchange costed link by link): per dimension of the topology, the ``α`` a message of the step pays
        there, its latency (plus the slowdown's extra, ``adj``) times the step's hops. Those are, on each
        ``ring`` dimension the step's ``pairs`` cross (``(src, dst, bytes)`` among ``members``, each a
        message), its farthest pair's shortest way round (``topology.ring_arcs``), summed over the ring
        dimensions (a message crossing both rings of a torus pays the hops on each), at least 1. ``pairs``
        None: every pair of ``members``, the group's farthest (half the units of a ring the group fills,
        ``q − 1`` on a line of ``q`` units of a larger ring); empty: 1 (messages to neighbours only).
        Across dimensions a step's links each pay their dimension's ``α`` so multiplied, the same hops a
        flat formula pays with the slowest ``α``: 16 ranks, 8 nodes × 2 on a ring, an all_to_all's
        farthest pairs are 4 nodes apart and pay 4 ``α``, as two ranks 4 apart on a ring alone do (one
        ``α`` before, whatever the distance)."""
        hops = self._hops(members, pairs)
        return tuple(
            (dim.latency_ns + extra) * max(1, hops)
            for dim, (_f, extra) in zip(self.topology.dims, adj, strict=True)
        )

    def _hops(self, members: Sequence[int], pairs: Sequence[tuple[int, int, float]] | None) -> int:
        """The hops of :meth:`_hop_alphas` (before its at least 1): on each ring dimension ``members`` span,
        the farthest of ``pairs`` (None: of the group) by the shortest way round, summed over them."""
        topo = self.topology
        hops = 0
        rings = self._ring_dims(self._spanned(members))
        for d in rings:
            size = self._ring_size(d, tuple(members))
            at = {r: topo.coords(r)[d] for r in members}
            units = sorted(set(at.values()))
            if len(units) == size:  # the whole ring: half way round
                most = size // 2
            else:
                most = max(ring_arcs(a, b, size)[0][1] for i, a in enumerate(units) for b in units[i + 1 :])
            if pairs is None:
                hops += most
                continue
            far = 0  # the step's farthest pair: ring_arcs's hops, min(f, size − f), without its lists
            for src, dst, _n in pairs:
                f = (at[dst] - at[src]) % size
                far = max(far, min(f, size - f))
                if far == most:  # no pair of the group is farther
                    break
            hops += far
        return hops

    def collective(
        self,
        comm_type: CommType,
        nbytes: int,
        ranks: Sequence[int],
        step: int,
        recorded: list[int],
        *,
        pairs: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[int]:
        return [self.collective_time_ns(comm_type, nbytes, ranks, step, pairs=pairs)] * len(recorded)

    def p2p(self, src: int, dst: int, nbytes: int, step: int, recorded: list[int]) -> list[int]:
        return [self.p2p_time_ns(src, dst, nbytes, step)] * len(recorded)

    def flow(self, ranks: Sequence[int], alone_ns: int) -> Flow | None:
        """Links used by a group: per member and crossed dimension, the link it uses there
        (``Topology.link``: its port on the innermost dimension, its node's link (NIC) on outer ones)."""
        if not self.contention:
            return None
        links: list[int] = []
        members = sorted(set(ranks))
        for d in self._spanned(members):
            for r in members:
                key = self.topology.link(r, d)
                lk = self.link_ids.get(key)
                if lk is None:
                    lk = self.link_ids[key] = len(self.link_ids)
                links.append(lk)
        return Flow(alone_ns=alone_ns, links=tuple(sorted(set(links))))
