"""What a slowdown does to a replay, as seen by the replayers: the :class:`Effects` protocol.

Both replayers ask the same three questions of an ``Effects`` object, per node:

- ``compute_factor(rank, step, name, on_gpu=...)``: multiply the node's recorded compute duration by this
  (``on_gpu``: the node is a GPU op, not a host operator);
- ``delay_before_ns(rank, step, node_type, name)``: extra wait before the node starts (a slow send, a
  per-rank delay before collectives), added to the node's host gap;
- ``stall_ns(rank, step)``: a wait before the *first* node of ``step`` on ``rank`` (its earliest recorded
  start: ``skewlens.replay.execution.effect_delays`` says where each wait lands, for both replayers).

An effects object may answer a fourth, :class:`HostIdleEffects`' ``host_idle_factor(rank, step)``: multiply
the rank's untraced host time at ``step`` (the gaps between its host rows and the capture's ``untraced``
nodes: ``skewlens.replay.execution.host_idle_rows``) by this (>= 0); one without it leaves that time as
recorded.

Effects must be pure, deterministic functions of their arguments (seeded jitter hashes its seed with the
arguments): the simulator evaluates them once per distinct argument tuple, not once per node.
Network slowdowns (link bandwidth, extra latency) act on the topology instead; see
``skewlens.replay.slowdown``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from skewlens.profiler.vocab import NodeType


@runtime_checkable
class Effects(Protocol):
    """Slowdowns applied per node by simulated and real replay."""

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        """Factor (>= 0: 0 takes its work away) multiplying the recorded duration of compute node ``name`` of
        ``rank`` at ``step`` (``on_gpu``: a GPU op, else a host operator)."""
        ...

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        """Extra wait (ns, >= 0) before a node starts: stall, slow send, per-rank delay before comm."""
        ...

    def stall_ns(self, rank: int, step: int) -> int:
        """Wait (ns, >= 0) before the first node of ``step`` on ``rank``."""
        ...


class NoEffects:
    """The identity: recorded durations, no extra delays."""

    __slots__ = ()

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return 1.0

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        return 0

    def stall_ns(self, rank: int, step: int) -> int:
        return 0

    def __repr__(self) -> str:
        return "NO_EFFECTS"


#: The identity effects (replay the trace as recorded).
NO_EFFECTS: Effects = NoEffects()


#: A dimension of a topology, and the dimensions the traffic between two ranks crosses
#: (``Topology.spanned``): what a network slowdown is asked about on one dimension of a group's links.
OnDim = tuple[int, Callable[[int, int], Sequence[int]]]


@runtime_checkable
class NetworkEffects(Protocol):
    """Optional extra protocol of a slowdown model: what it does to the network (simulated replay)."""

    def comm_adjust(self, ranks: Sequence[int], step: int, on_dim: OnDim | None = None) -> tuple[float, int]:
        """``(bandwidth factor, extra latency ns)`` for communication among ``ranks`` at ``step``; with
        ``on_dim``, on that dimension's links only: a slowed link between two ranks slows the dimensions
        their traffic crosses."""
        ...


@runtime_checkable
class HostIdleEffects(Protocol):
    """Optional extra protocol of a slowdown model: what it does to untraced host time (both replayers,
    through ``skewlens.replay.execution.host_idle_scaled``)."""

    def host_idle_factor(self, rank: int, step: int) -> float:
        """Factor (>= 0) multiplying the untraced host time of ``rank`` at ``step`` (0: none of it)."""
        ...
