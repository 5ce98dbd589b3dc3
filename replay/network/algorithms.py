"""Closed-form (congestion-unaware) costs of collective algorithms, in ns.

Notation: ``S`` bytes (the collective's message size: a member's ``comm_size``, its input, and ``p`` times
that for all_gather and gather, whose input is one member's piece; ``skewlens.replay.comm.message_bytes``),
``p`` ranks, ``α`` latency per message (ns), ``B`` link bandwidth (bytes/ns = GB/s), ``L = ⌈log2 p⌉``.
Every formula is the time from the last member's arrival until all members are done; ``p <= 1`` costs 0.

- all_reduce: ring ``2(p−1)(α + S/(pB))``; tree ``2Lα + 2S/B``; halving_doubling ``2Lα + 2(p−1)/p·S/B``
  for ``p`` a power of two, and otherwise, with ``q`` the largest power of two below ``p``,
  ``(2 log2 q + 2)α + (2(q−1)/q + 2)·S/B`` (Rabenseifner's algorithm as MPICH runs it, Thakur, Rabenseifner
  and Gropp 2005: the first ``2(p−q)`` members fold in pairs, one sending the other its whole ``S``, the
  ``q`` left run recursive halving and doubling, and the whole result goes back to the folded ones; 3 ranks
  pay ``4α + 3S/B``, not the ring's ``4α + 4/3·S/B``); direct ``2α + 2(p−1)/p·S/B``.
- reduce_scatter, all_gather, gather, scatter: ring ``(p−1)(α + S/(pB))``; tree and halving_doubling
  ``Lα + (p−1)/p·S/B``; direct ``α + (p−1)/p·S/B``. halving_doubling's (and tree's, its formula)
  reduce_scatter on ``p`` not a power of two folds as its all_reduce does (``q`` and ``r = p − q``, one
  helper, ``fold``), as MPICH's recursive halving runs it: the first ``2r`` members fold in pairs (one
  sends the other its whole ``S``), the ``q`` left halve over the ``p`` pieces of ``S/p``, the first ``r``
  of them holding two (their partner's too), and each folded member gets its piece back:
  ``(log2 q + 2)α + (1 + (q + Σ_{j < log2 q} min(r, 2^j))/p)·S/B``: the fold's ``S``, then the pair
  holding piece 0 moves the most, ``2^j`` pieces and the ``min(r, 2^j)`` doubled among them in the step
  with its partner ``2^j`` away, ``q − 1`` and the sum in all, and one piece back (3 ranks ``3α + 2S/B``,
  6 ranks ``4α + 13/6·S/B``, not ``2α + 2/3·S/B`` and ``3α + 5/6·S/B``, the least a port moves).
  all_gather (Bruck's, ``L`` steps and ``(p−1)/p`` of ``S`` for any ``p``), gather and scatter (binomial
  trees, likewise) need no fold.
- all_to_all: ring ``(p−1)(α + S/(pB))``; tree and halving_doubling (Bruck) ``L(α + S/(2B))``;
  direct ``α + (p−1)/p·S/B``. Even splits (each member sends ``even_split_bytes`` to each other); with
  uneven ones the caller makes ``S`` the size whose ``(p−1)/p`` is what the busiest member sends or
  receives (``skewlens.replay.lower.collective_bytes``). These are for a group on one dimension: across
  dimensions an all_to_all is costed link by link, even or not, and so are ``direct``'s all_reduce,
  reduce_scatter and all_gather, and ``halving_doubling``'s for a power-of-two group, step by step (and so
  on a ``ring`` dimension alone, whose links its far partners share)
  (``skewlens.replay.comm.ModelTiming``).
- broadcast, reduce: ring (pipelined chain) ``(p−1)α + S/B``; tree and halving_doubling (binomial)
  ``L(α + S/B)``; direct (root sends to all) ``α + (p−1)·S/B``.
- barrier: all_reduce with ``S = 0``.

``tree`` is NCCL's double binary tree: the two trees each carry half the data, pipelined. A rank is
interior in one tree (it sends ``S/2`` to its parent and ``S/2`` to each of two children) and a leaf in the
other (``S/2`` to its parent), so its port carries ``2S`` each way (``2S/B``: NCCL's own tuning model
charges a tree all_reduce ``S / (busBw · 0.5)``, its ``src/graph/tuning.cc``), while latency grows with the
depth (``2Lα``: reduce up, broadcast down). ``S/B``, charged before, was below what any all_reduce can take
with one link per rank (``2(p−1)/p · S/B``, the ring's) and made a tree twice the ring's speed at scale. On
a ``ring`` dimension alone its trees' edges go the shortest way round, sharing the ring's links
(``double_binary_tree_edges``, ``skewlens.replay.comm.ModelTiming``): from 16 members the busiest link
carries more than a port's ``2S`` (``3S`` at 16, ``5S`` at 64), and the bandwidth term is that; tree's
reduce_scatter and all_gather (halving_doubling's formula) go through halving_doubling's steps there. A
group spanning a ring dimension and others pays that ring's links the same way (each pair crossing it by
the shortest way round, on the ring of its destination's slot).

``hierarchical`` (a group spanning nodes, ``p0`` ranks per node on ``(α0, B0)``, ``p1`` nodes on
``(α1, B1)``): intra-node ring reduce-scatter of ``S``, inter-node ring all-reduce of ``S/p0``, intra-node
ring all-gather of ``S``:
``T = (p0−1)(α0 + S/(p0·B0)) + 2(p1−1)(α1 + S/(p0·p1·B1)) + (p0−1)(α0 + S/(p0·B0))``.
reduce_scatter and all_gather: ``(p0−1)(α0 + S/(p0·B0)) + (p1−1)(α1 + S/(p0·p1·B1))``; gather and
scatter: ``(p0−1)α0 + (p−1)/p·S/B0 + (p1−1)(α1 + S/(p0·p1·B1))``, ``p`` the members (a gather's pieces
cross nodes on every NIC of the root's node, then go on to the root inside it, as NCCL's PXN routes them:
the root's own port takes every piece but its own, ``(p−1)/p`` of ``S``, not a reduce_scatter's
``(p0−1)/p0``, half of it at ``p0 = 2``; at one member per node, ``p0 = 1``, the intra-node term is skipped:
each piece reaches the root through the NIC on the root's rail, never through its port inside the node);
other types (broadcast, reduce) use the flat ring over the slowest dimension, and an all_to_all on one
dimension ``direct`` (NCCL's grouped point-to-point messages, as across dimensions: ``flat_algorithm``).
The ``p0`` inter-node rings run at once, and the inter-node phase's ``(p1−1)/(p0·p1)·S/B1`` is, in general,
``(p1−1)α1 + L·S/B1`` with ``L`` what the busiest outer link
carries per byte of ``S`` (``Topology.outer_load``): a node with ``m`` of the ``p`` members imports the
others' ``(p−m)/p`` of ``S`` over its members' links, ``k`` of them on its busiest link,
``L = k·(p−m)/(p·m)`` at the node where that is largest. Nodes that each hold ``p0`` members on links of
their own (a NIC per GPU) give ``L = (p1−1)/(p0·p1)``, the formula above; one link per node ``(p1−1)/p1``
(``B/p0`` a ring); unevenly filled nodes (12 ranks on nodes of 8: 8 + 4) charge the emptiest node, whose
few links carry the most.

A point-to-point message costs ``α + S/B``.

On a ``ring`` dimension (a link to each neighbour, one each way) an all_to_all, and each phase of
``direct``'s reduce_scatter, all_gather and all_reduce, sends every member's part ``S/q`` to every other of
the ``q`` members round the ring over the links between them. By the shortest way the busiest link carries
``q²/8`` parts each way (``(q² − 1)/8`` for odd ``q``: ``ring_exchange_load``), as many as cross a cut of
the ring, which no routing avoids; from ``q = 8`` that is more than a member's port's ``q − 1``, and the
bandwidth term is then ``q²/8 · (S/q)/B`` a phase where the formula's is less
(``skewlens.replay.comm.ModelTiming``, a group on one ring dimension): on the bundled ``ring`` (50 GB/s),
an all_to_all of 64 MiB a rank among 64 ranks takes 10.77 ms, not a switch's 1.35. The cut is a group's
that fills the ring; a group that does not (8 ranks of a ring of 16: a line) has its even parts put on the
links by the shortest way, as an uneven all_to_all's pairs are. An uneven all_to_all
there is charged its busiest ring link's bytes from its pairs, each by the shortest way
(``skewlens.replay.network.topology.ring_arcs``), where that is more than its busiest port's: even parts
give the cut's load.

On a ``fully_connected`` dimension (a link between every pair) ``direct`` sends a member's ``p − 1`` parts (a
root's copies) over ``p − 1`` links at once: its bandwidth term is divided by ``p − 1``
(``skewlens.replay.comm.ModelTiming``), an all_to_all ``α + S/(pB)``, a broadcast ``α + S/B``.
"""

from __future__ import annotations

import math

from skewlens.profiler.vocab import CommType

ALGORITHMS = ("ring", "tree", "halving_doubling", "direct", "hierarchical")

_REDUCE_SCATTERS = frozenset({CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK})

_RS_LIKE = frozenset(
    {
        CommType.REDUCE_SCATTER,
        CommType.REDUCE_SCATTER_BLOCK,
        CommType.ALL_GATHER,
        CommType.GATHER,
        CommType.SCATTER,
    }
)


def even_split_bytes(nbytes: int, p: int) -> int:
    """The bytes an all_to_all member whose splits were even (it recorded none) sends to each member of its
    group of ``p``, and receives from each: equal whole parts of its ``nbytes``, ``nbytes // p`` (what the
    real replay issues, what the network model costs, and ``p − 1`` of them are what its port carries in
    ``skewlens.replay.lower.collective_bytes``)."""
    return nbytes // p


def fold(p: int) -> tuple[int, int]:
    """A halving_doubling group of ``p`` as MPICH folds it: ``q``, the largest power of two at most ``p``,
    who halve (and double), and ``r = p − q``: the first ``2r`` members pair up and one of each pair hands
    the other its whole input first, then waits for its result (``r = 0``: a power of two, no fold)."""
    q = 1 << (p.bit_length() - 1) if p > 0 else 0
    return q, p - q


def log2_ceil(p: int) -> int:
    """``⌈log2 p⌉`` (0 for p <= 1)."""
    return (p - 1).bit_length() if p > 1 else 0


def flat_algorithm(algorithm: str, comm_type: CommType) -> str:
    """The flat algorithm that times a collective of a group on one dimension: ``algorithm``, but for
    ``hierarchical`` the ring, and ``direct`` for its all_to_all (NCCL's grouped point-to-point messages, as
    it is costed across nodes: before, the ring's ``p − 1`` steps inside a node, so that 8 ranks on one
    PCIe switch of ``two_node_ib`` took 14,007 ns for a 192 B all_to_all and split over two nodes 4,015)."""
    if algorithm != "hierarchical":
        return algorithm
    return "direct" if comm_type == CommType.ALL_TO_ALL else "ring"


def flat_time_ns(
    algorithm: str, comm_type: CommType, *, nbytes: float, p: int, alpha: float, bw: float
) -> float:
    """Cost of one collective with a flat algorithm (see the module docstring); ``bw`` in bytes/ns."""
    if p <= 1:
        return 0.0
    s = float(nbytes)
    big_l = log2_ceil(p)
    alg = flat_algorithm(algorithm, comm_type)
    if comm_type == CommType.BARRIER:
        comm_type, s = CommType.ALL_REDUCE, 0.0
    frac = (p - 1) / p * s / bw
    if comm_type == CommType.ALL_REDUCE:
        if alg == "ring":
            return 2 * (p - 1) * (alpha + s / (p * bw))
        if alg == "tree":
            return 2 * big_l * alpha + 2 * s / bw
        if alg == "halving_doubling":
            q, r = fold(p)
            if r:
                # not a power of two: Rabenseifner's way (MPICH): the first 2r of the p = q + r members fold
                # in pairs, one sending the other its whole S, the q left halve and double, and the whole
                # result goes back: 2α + 2S/B more than q's (before, 2(p−1)/p·S/B, the least any all_reduce
                # through one port can take: 3 ranks as cheap as the ring, which no halving-doubling is)
                return (2 * log2_ceil(q) + 2) * alpha + (2 * (q - 1) / q + 2) * s / bw
            return 2 * big_l * alpha + 2 * frac
        return 2 * alpha + 2 * frac
    if comm_type in _RS_LIKE:
        if alg == "ring":
            return (p - 1) * (alpha + s / (p * bw))
        if alg in ("tree", "halving_doubling"):
            q, r = fold(p)
            if r and comm_type in _REDUCE_SCATTERS:
                # MPICH's recursive halving: the fold, the q halving over the p pieces, a folded member's
                # piece back (before, (p−1)/p·S/B, no fold: 3 ranks 2α + 2/3·S/B, its all_reduce 4α + 3S/B)
                pieces = q + sum(min(r, 1 << j) for j in range(log2_ceil(q)))
                return (log2_ceil(q) + 2) * alpha + (1 + pieces / p) * s / bw
            return big_l * alpha + frac
        return alpha + frac
    if comm_type == CommType.ALL_TO_ALL:
        if alg == "ring":
            return (p - 1) * (alpha + s / (p * bw))
        if alg in ("tree", "halving_doubling"):
            return big_l * (alpha + s / (2 * bw))
        return alpha + frac
    # broadcast / reduce
    if alg == "ring":
        return (p - 1) * alpha + s / bw
    if alg in ("tree", "halving_doubling"):
        return big_l * (alpha + s / bw)
    return alpha + (p - 1) * s / bw


def hierarchical_time_ns(
    comm_type: CommType,
    *,
    nbytes: float,
    p0: int,
    p1: int,
    inner: tuple[float, float],
    outer: tuple[float, float],
    outer_load: float | None = None,
    p: int | None = None,
) -> float:
    """Two-level cost (see the module docstring); ``inner``/``outer`` are ``(α, B)``; ``outer_load``: ``L``,
    per byte of ``S`` what the busiest outer link carries in one inter-node phase (None: ``(p1−1)/(p0·p1)``,
    whole nodes on links of their own); ``p``: the group's members (None: ``p0·p1``), whose ``(p−1)/p`` of
    ``S`` a gather's root receives (a scatter's sends) through its own port."""
    a0, b0 = inner
    a1, b1 = outer
    s = float(nbytes)
    if comm_type == CommType.BARRIER:
        comm_type, s = CommType.ALL_REDUCE, 0.0
    intra = (p0 - 1) * (a0 + s / (p0 * b0)) if p0 > 1 else 0.0
    if comm_type in (CommType.GATHER, CommType.SCATTER) and p0 > 1:
        # PXN: the pieces of every other member, on other nodes too, pass the root's own port
        members = p0 * p1 if p is None else p
        intra = (p0 - 1) * a0 + (members - 1) / members * s / b0
    load = (p1 - 1) / (p0 * p1) if outer_load is None else outer_load
    phase = (p1 - 1) * a1 + load * s / b1 if p1 > 1 else 0.0
    if comm_type == CommType.ALL_REDUCE:
        return 2 * intra + 2 * phase
    if comm_type in _RS_LIKE:
        return intra + phase
    return flat_time_ns("ring", comm_type, nbytes=s, p=p0 * p1, alpha=max(a0, a1), bw=min(b0, b1))


def ring_exchange_load(q: int) -> float:
    """Parts the busiest link of a bidirectional ring of ``q`` members carries each way when every member
    sends one part to every other by the shortest way (a pair half way round splits its part between the
    two ways): ``Σ_{d<q/2} d`` plus ``q/4`` for even ``q``, ``q²/8`` (``(q² − 1)/8`` for odd ``q``)."""
    return (q * q - q % 2) / 8


def double_binary_tree_edges(p: int) -> list[tuple[int, int]]:
    """The ``(child, parent)`` edges of NCCL's double binary tree over members ``0 .. p−1`` (its
    ``src/graph/trees.cc``): the first tree rooted at 0, a member's parent found from its lowest set bit
    (``xx01[0]`` and ``xx11[0]`` to ``xx10[0]``, or to ``xx00[0]`` where that is past the last member); the
    second the first mirrored (member ``r`` as ``p − 1 − r``) for even ``p``, shifted by one for odd."""

    def parent(r: int) -> int:
        if r == 0:
            return -1
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        return up if up < p else r ^ bit

    def second(r: int) -> int:
        if p % 2:
            u = parent((r - 1) % p)
            return -1 if u < 0 else (u + 1) % p
        u = parent(p - 1 - r)
        return -1 if u < 0 else p - 1 - u

    return [(r, u) for tree in (parent, second) for r in range(p) if (u := tree(r)) >= 0]


def p2p_time_ns(nbytes: float, alpha: float, bw: float) -> float:
    """One message: ``α + S/B``."""
    return alpha + float(nbytes) / bw if math.isfinite(bw) else alpha
