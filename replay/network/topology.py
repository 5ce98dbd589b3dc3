"""Topologies: one or more dimensions, each a switch, ring, fully connected mesh or fat-tree.

A topology is a list of :class:`Dimension`, innermost first: ``[NVSwitch of 8 GPUs, fat-tree of N
nodes]`` is the usual two-level cluster. Dimension ``d`` has ``size`` units; a rank's coordinates
``(c0, c1, ...)`` say which unit it occupies in every dimension (``c1`` is its node, ``c0`` its slot in
the node). Placement maps ranks to coordinates: ``block`` fills a node before the next (ranks 0-7 on
node 0), ``round_robin`` deals ranks to nodes in turn, and ``node_of_rank`` gives each rank's node
explicitly (two-dimensional topologies).

Bandwidths are GB/s per link and direction (1 GB/s = 1 byte/ns), latencies ns per message. A rank has one
link on the innermost dimension (its port); on an outer dimension ``d`` every unit of dimension ``d − 1``
(a node, on the second dimension) has ``links_per_node`` links (NICs), its rank slots spread over them in
order (slot ``s`` of ``U`` on link ``s·links_per_node // U``), and ranks on one link share it. The default,
0, is one link per rank slot: every rank its own link, ``bandwidth_gbps`` per GPU. :meth:`Topology.link`
names a rank's link: the analytic costs divide a link's bandwidth between the members of a group on it
(:meth:`Topology.outer_load`), and the contention model shares it between concurrent groups.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral, Real

from skewlens.replay.errors import ConfigError

KINDS = ("switch", "ring", "fully_connected", "fat_tree")
PLACEMENTS = ("block", "round_robin")


def ring_arcs(a: int, b: int, size: int) -> list[tuple[int, int, float]]:
    """The shortest way round a ring of ``size`` units from unit ``a`` to unit ``b``: ``(step, hops,
    share)``, ``hops`` links one after another in the direction ``step`` (+1 or −1) from ``a``, carrying
    ``share`` of the bytes; a pair exactly half way round splits its bytes between the two ways. The link
    from unit ``c`` to ``c + step`` is ``(d, −1 − i, c, step, *coords[d + 1:])`` on dimension ``d``, ``i``
    the index of :meth:`Topology.link` of the rank slot it leaves from (on an outer ring a unit has
    ``links_per_node`` rings side by side; on the innermost, one: index −1), never a rank's own link."""
    fwd = (b - a) % size
    if fwd == 0:
        return []
    if 2 * fwd < size:
        return [(1, fwd, 1.0)]
    if 2 * fwd > size:
        return [(-1, size - fwd, 1.0)]
    return [(1, fwd, 0.5), (-1, fwd, 0.5)]


class TopologyError(ConfigError, ValueError):
    """A topology is inconsistent (bad size, bandwidth, placement); the message names the field. A
    :class:`ConfigError`, so that a :class:`Topology` built in Python fails as every skewlens error does (it
    was a bare ``ValueError``, which ``except SkewlensError`` let through); still a ``ValueError``."""


def config_message(e: TopologyError) -> str:
    """``e``'s message as the replay's settings name its key: ``topology.node_of_rank: ...`` where it begins
    with a key of the topology (what the user typed: ``topology.node_of_rank=[0,1]``), else ``topology:
    ...``. Before, where the ranks were placed, it said ``topology: node_of_rank: ...`` (and, placed for a
    network slowdown's nodes, ``node_of_rank: ...``), where the settings' other messages name it dotted."""
    msg = str(e)
    return f"topology.{msg}" if _KEYED.match(msg) else f"topology: {msg}"


#: A :class:`TopologyError` message that begins with the key it is about (:func:`config_message`).
_KEYED = re.compile(r"(?:node_of_rank|placement|dims(?:\[\d+\]\.\w+)?): ")


def type_problem(value: object, *, whole: bool) -> str | None:
    """What is wrong with the type of a config number (``whole``: an integer setting's), or None: a string
    (``"8"``, a form's or a JSON document's) or a bool is neither; a fraction is no integer."""
    if isinstance(value, bool) or not isinstance(value, Integral if whole else Real):
        return f"must be {'an integer' if whole else 'a number'}, got {value!r}"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Dimension:
    """One level of a topology."""

    kind: str
    """``switch`` | ``ring`` | ``fully_connected`` | ``fat_tree``."""
    size: int
    """Units in this dimension (GPUs per node, nodes, ...); 0 = as many as the ranks need (outermost only)."""
    bandwidth_gbps: float
    """Bandwidth of one link, one direction, GB/s (bytes per ns)."""
    latency_ns: int
    """Latency of one message over this dimension, ns."""
    oversubscription: float = 1.0
    """``fat_tree`` only: uplink oversubscription ratio (bandwidth per unit is divided by it)."""
    links_per_node: int = 0
    """Links (NICs) each unit of the next inner dimension (a node, on the second dimension) has on this one,
    each of ``bandwidth_gbps``; 0: one per rank slot of the unit (every rank its own link). The innermost
    dimension: 0 or 1 (each rank is its own unit)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TopologyError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        # a string (a form's or a JSON document's "8") was a TypeError from the comparisons below
        for name in ("size", "links_per_node", "bandwidth_gbps", "latency_ns", "oversubscription"):
            if (
                problem := type_problem(getattr(self, name), whole=name in ("size", "links_per_node"))
            ) is not None:
                raise TopologyError(f"{name}: {problem}")
        if self.size < 0:
            raise TopologyError(f"size: must be >= 0, got {self.size}")
        if not self.bandwidth_gbps > 0:
            raise TopologyError(f"bandwidth_gbps: must be > 0, got {self.bandwidth_gbps}")
        if self.latency_ns < 0:
            raise TopologyError(f"latency_ns: must be >= 0, got {self.latency_ns}")
        if not (math.isfinite(self.oversubscription) and self.oversubscription >= 1.0):
            raise TopologyError(
                f"oversubscription: must be a finite number >= 1, got {self.oversubscription}"
            )
        if self.oversubscription != 1.0 and self.kind != "fat_tree":
            # it divided any kind's bandwidth, where the docs say fat_tree only: a switch of 4 read as 1/4
            raise TopologyError(
                f"oversubscription: applies to a fat_tree dimension, and this one is a {self.kind} "
                f"(got {self.oversubscription:g}); give kind fat_tree, or leave oversubscription at 1"
            )
        if self.links_per_node < 0:
            raise TopologyError(f"links_per_node: must be >= 0 (0: one per rank), got {self.links_per_node}")

    @property
    def effective_bandwidth_gbps(self) -> float:
        """Bandwidth one unit gets when every unit talks at once (fat-tree oversubscription applied)."""
        return self.bandwidth_gbps / self.oversubscription


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """Dimensions (innermost first) and how ranks are placed on them."""

    name: str
    """Label used in reports."""
    dims: tuple[Dimension, ...]
    """Dimensions, innermost first."""
    placement: str = "block"
    """``block`` or ``round_robin``."""
    node_of_rank: tuple[int, ...] = ()
    """Explicit node of each rank (two-dimensional topologies only); overrides ``placement``."""
    _coords: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # lists from Python callers become tuples: the topology is frozen, hashed and compared by value
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "node_of_rank", tuple(self.node_of_rank))
        if not self.dims:
            raise TopologyError("dims: a topology needs at least one dimension")
        for k, inner in enumerate(self.dims[:-1]):
            if inner.size == 0:
                raise TopologyError(
                    f"dims[{k}].size: only the outermost dimension may have size 0 (as many as needed)"
                )
        if self.placement not in PLACEMENTS:
            raise TopologyError(f"placement: expected one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.node_of_rank and len(self.dims) != 2:
            raise TopologyError("node_of_rank: explicit placement needs a two-dimensional topology")
        nodes = self.dims[-1].size
        for r, node in enumerate(self.node_of_rank):  # node -1 or 5 of 2 was taken as a node of its own
            if node < 0 or (nodes and node >= nodes):
                have = f"nodes 0-{nodes - 1}" if nodes else "nodes numbered from 0"
                raise TopologyError(
                    f"node_of_rank: rank {r} is placed on node {node}, and the topology has {have}"
                )
        if self.dims[0].links_per_node > 1:
            raise TopologyError(
                f"dims[0].links_per_node: the innermost dimension has one link per rank (0 or 1), "
                f"got {self.dims[0].links_per_node}"
            )
        for d, dim in enumerate(self.dims[1:], 1):
            slots = self._unit_slots(d)
            if dim.links_per_node > slots:
                raise TopologyError(
                    f"dims[{d}].links_per_node: a node (a unit of dimension {d - 1}) has {slots} rank "
                    f"slots, so at most {slots} links (a rank uses one), got {dim.links_per_node}"
                )

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of ``rank`` (innermost first)."""
        c = self._coords.get(rank)
        if c is None:
            c = self._coords[rank] = self._place(rank)
        return c

    def _place(self, rank: int) -> tuple[int, ...]:
        sizes = [d.size for d in self.dims]
        if self.node_of_rank:
            if rank >= len(self.node_of_rank):
                given = len(self.node_of_rank)
                raise TopologyError(
                    f"node_of_rank: no node given for rank {rank}: it lists the nodes of the first {given} "
                    "rank(s), and each rank placed needs one"
                )
            node = self.node_of_rank[rank]
            slot = sum(1 for r in range(rank) if self.node_of_rank[r] == node)
            if slot >= sizes[0]:
                raise TopologyError(f"node_of_rank: node {node} holds more than {sizes[0]} ranks")
            return (slot, node)
        if self.placement == "round_robin" and len(sizes) > 1:
            order = list(range(len(sizes) - 1, -1, -1))  # outermost varies fastest
        else:
            order = list(range(len(sizes)))
        out = [0] * len(sizes)
        rest = rank
        for k, d in enumerate(order):
            size = sizes[d]
            last = k == len(order) - 1
            if size == 0 or (last and self.placement == "block"):
                out[d] = rest
                if size and rest >= size:
                    raise TopologyError(f"{self.name}: rank {rank} does not fit ({self.capacity} slots)")
                rest = 0
                continue
            out[d] = rest % size
            rest //= size
        if rest:
            raise TopologyError(f"{self.name}: rank {rank} does not fit ({self.capacity} slots)")
        return tuple(out)

    def sized(self, ranks: int) -> Topology:
        """This topology for a run of ``ranks`` ranks: an outermost dimension of size 0 (as many as needed)
        given the units they fill, ``⌈ranks / rank slots of one unit⌉`` (at least those ``node_of_rank``
        names); otherwise itself. Placement and hops need that count: ``round_robin`` deals ranks to the
        nodes in turn (with size 0 it put every rank on a node of its own, slot 0: 16 ranks on
        ``dgx_h100_8x`` never met on NVLink, a 64 MiB all_reduce 2666.6 µs instead of 448.6), and a ring
        closes after its last unit (with size 0 every message was one hop, rank 0 to 4 of 8 too). The
        replay sizes its topology for the run it replays."""
        last = self.dims[-1]
        if last.size or ranks <= 0:
            return self
        units = max([-(-ranks // self._unit_slots(len(self.dims) - 1)), *(n + 1 for n in self.node_of_rank)])
        return replace(self, dims=(*self.dims[:-1], replace(last, size=units)))

    @property
    def capacity(self) -> int:
        """Number of rank slots (0 = unbounded)."""
        cap = 1
        for d in self.dims:
            if d.size == 0:
                return 0
            cap *= d.size
        return cap

    def _unit_slots(self, d: int) -> int:
        """Rank slots of one unit of dimension ``d − 1`` (1 for ``d = 0``: a rank)."""
        return math.prod(x.size for x in self.dims[:d])

    def links_per_node(self, d: int) -> int:
        """Links of one unit of dimension ``d − 1`` on dimension ``d`` (``Dimension.links_per_node``, 0
        resolved to one per rank slot)."""
        return self.dims[d].links_per_node or self._unit_slots(d)

    def link(self, rank: int, d: int) -> tuple[int, ...]:
        """The link ``rank`` uses on dimension ``d``: ``(d, link index within its unit, *coords[d:])``."""
        return self.link_at(self.coords(rank), d)

    def link_at(self, c: Sequence[int], d: int) -> tuple[int, ...]:
        """The link the rank slot at coordinates ``c`` uses on dimension ``d`` (:meth:`link`)."""
        slot, stride = 0, 1
        for j in range(d):
            slot += c[j] * stride
            stride *= self.dims[j].size
        return (d, slot * self.links_per_node(d) // stride, *c[d:])

    def outer_load(self, ranks: Sequence[int], d: int) -> float:
        """Per byte of ``S``, what the busiest link of dimension ``d`` carries in one inter-unit phase of a
        hierarchical collective over ``ranks`` (``skewlens.replay.network.algorithms``). A unit (a node, on
        the second dimension) holding ``m`` of the ``p`` members imports the others' ``(p − m)/p`` of ``S``,
        spread over its ``m`` members, ``k`` of whom share its busiest link: ``k·(p − m)/(p·m)``; the largest
        over the units. Every node holding ``p0`` members on links of their own: ``(p1 − 1)/(p0·p1)``."""
        members = sorted(set(ranks))
        p = len(members)
        units: dict[tuple[int, ...], list[int]] = {}
        for r in members:
            units.setdefault(self.coords(r)[d:], []).append(r)
        return max(
            max(Counter(self.link(r, d) for r in rs).values()) * (p - len(rs)) / (p * len(rs))
            for rs in units.values()
        )

    def spanned(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """Dimensions in which the members' coordinates differ (the links the group's traffic crosses)."""
        cs = [self.coords(r) for r in ranks]
        out = [d for d in range(len(self.dims)) if len({c[d] for c in cs}) > 1]
        return tuple(out)

    def group_layout(self, ranks: Sequence[int]) -> tuple[int, int]:
        """``(ranks per node, nodes)`` of a group (for hierarchical algorithms)."""
        cs = [self.coords(r) for r in ranks]
        nodes: dict[tuple[int, ...], int] = {}
        for c in cs:
            nodes[c[1:]] = nodes.get(c[1:], 0) + 1
        return max(nodes.values()), len(nodes)
