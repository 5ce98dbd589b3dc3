"""Slowdown models: a composable list of :class:`Slowdown` items, evaluated as one :class:`SlowdownModel`.

Kinds of item (each optionally limited to ranks and to a window of steps ``first_step..last_step``):

- ``compute``: multiply compute durations by ``factor``;

  ``compute``, ``op`` and ``jitter`` items scale the compute ops of ``device``: ``any`` (default), ``host``
  (host operators only: a faster or slower host, the GPU as recorded) or ``gpu`` (GPU ops only: kernels,
  copies and memsets: one slow GPU, whose host runs as recorded);
- ``op``: multiply compute nodes whose name matches ``pattern`` (a glob, or a regex written ``re:...``) by
  ``factor`` (>= 0: 0 takes the op's time away, a data loader's fetch that had not stalled); the rule is the
  same at every factor: the matched rows' own durations (what follows a row on its thread waits for its
  end); rows nested in them and the launches made inside them move with that length (their offsets into
  the row, and a nested row's duration where the item does not match it too, scaled by its factor:
  ``skewlens.replay.execution.nested_times``, ``launch_offsets``);
- ``jitter``: multiply compute by ``max(0.05, 1 + sigma·z)``, ``z`` a standard normal drawn from a
  generator seeded with ``(seed, rank, step)`` (so the same config always gives the same jitter);
- ``stall``: a one-off wait of ``delay_ms`` before the first node of step ``step`` on the ranks, or with
  ``every_step`` before the first node of every step of the item's window (a data loader that takes
  ``delay_ms`` longer each step);
- ``comm_delay``: an extra wait of ``delay_ms`` before every ``before`` node of the ranks (``send``,
  ``collective`` or ``comm`` for both; mirrors the example's ``--slow-send`` knob): the thread waits, so
  an asynchronous op's issuing thread waits with it (``skewlens.replay.lower``);
- ``host_idle``: multiply the rank's untraced host time by ``factor`` (0 removes it, 0.5 halves it, 2
  doubles it): the time a host thread spent between traced rows, in which the trace records nothing (a
  data loader's stall, ``gc.collect()``, a checkpoint write between operators): each host row's recorded
  gap after what it follows, and the capture's ``untraced`` nodes (of one in which the model found a hidden
  wait, its part after the completion): :func:`skewlens.replay.execution.host_idle_rows`;
- ``network``: multiply the bandwidth of communication by ``factor`` and add ``latency_ns`` to it, for
  traffic over the given ``links`` (rank pairs: a group containing both ends), ``nodes`` (a group with a
  member on one of these nodes, per the topology's placement) or ``ranks`` (a group with one of them);
  with none of those, all traffic.

Factors of several items multiply, delays and latencies add. The model is a pure function of its inputs,
as :class:`~skewlens.replay.effects.Effects` requires. The keys above are an item's in the config; times are
integer nanoseconds here, so a :class:`Slowdown` carries ``delay_ms`` as ``delay_ns``, converted once
(``skewlens.replay.config.SlowdownItemConfig.to_slowdown``).
"""

from __future__ import annotations

import fnmatch
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from numbers import Integral, Real

from skewlens.profiler.vocab import NodeType
from skewlens.replay.effects import OnDim
from skewlens.replay.errors import MAX_SIM_NS, SIM_CLOCK, ConfigError, shown

KINDS = ("compute", "op", "jitter", "stall", "comm_delay", "host_idle", "network")
#: The kinds whose ``factor`` may be 0: it takes away what they scale (the untraced host time, the time of
#: the ops a pattern matches); elsewhere it means nothing (no compute at all, a network that never delivers).
ZERO_FACTOR_KINDS = frozenset({"host_idle", "op"})
#: Which compute ops a ``compute``, ``op`` or ``jitter`` item scales (:attr:`Slowdown.device`).
DEVICES = ("any", "host", "gpu")
#: The kinds ``device`` applies to.
DEVICE_KINDS = frozenset({"compute", "op", "jitter"})
#: The fields each kind reads besides ``ranks``, ``first_step``, ``last_step`` and ``device``: another of
#: these set on it is refused, where it was ignored (``step`` on a compute item slowed every step, a
#: ``pattern`` every op).
KIND_FIELDS = {
    "compute": frozenset({"factor"}),
    "op": frozenset({"factor", "pattern"}),
    "jitter": frozenset({"sigma", "seed"}),
    "stall": frozenset({"step", "every_step", "delay_ns"}),
    "comm_delay": frozenset({"delay_ns", "before"}),
    "host_idle": frozenset({"factor"}),
    "network": frozenset({"factor", "latency_ns", "links", "nodes"}),
}
COMM_ON = {
    "send": frozenset({NodeType.COMM_SEND}),
    "collective": frozenset({NodeType.COMM_COLL}),
    "comm": frozenset({NodeType.COMM_SEND, NodeType.COMM_RECV, NodeType.COMM_COLL}),
}


#: The most each number of a slowdown may be, and its unit: a factor or sigma times a 1 ns op, a delay or a
#: latency, must stay on the simulator's clock (a factor of 1e308 wrapped the replayed times around).
#: ``delay_ms`` is the config's (checked before it becomes a :attr:`Slowdown.delay_ns`).
LIMITS = {
    "factor": (MAX_SIM_NS, ""),
    "sigma": (MAX_SIM_NS, ""),
    "delay_ms": (MAX_SIM_NS / 1e6, " ms"),
    "delay_ns": (MAX_SIM_NS, " ns"),
    "latency_ns": (MAX_SIM_NS, " ns"),
}


def number_problem(value: float, *, positive: bool, name: str = "") -> str | None:
    """What is wrong with a slowdown's number ``name`` (a factor: ``positive``; a delay, latency or sigma,
    or a ``host_idle`` factor: >= 0; each at most its :data:`LIMITS`), or None: ``must be a finite number >
    0, got nan`` (of ``'2'``, ``must be a number, got '2'``, not ``math.isfinite``'s bare TypeError)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return f"must be a number, got {value!r}"
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        return f"must be a finite number {'> 0' if positive else '>= 0'}, got {value}"
    most, unit = LIMITS.get(name, (math.inf, ""))
    if value > most:
        return f"must be at most {most:.3g}{unit}, got {value:g}: beyond it, times leave {SIM_CLOCK}"
    return None


def _is_int(value: object) -> bool:
    """An integer (numpy's too), not a bool (``ranks=(True,)`` is no rank)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


class SlowdownFieldError(ConfigError):
    """A slowdown item's number is out of range: ``field`` names it and ``problem`` says what is wrong (the
    config names the key it came from)."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: {field} {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, kw_only=True, slots=True)
class Slowdown:
    """One slowdown item (see the module docstring for the kinds)."""

    kind: str
    """compute | op | jitter | stall | comm_delay | host_idle | network."""
    ranks: tuple[int, ...] = ()
    """Ranks affected (empty: all)."""
    factor: float = 1.0
    """compute: duration factor (> 0); op: duration factor of the matched ops (>= 0: 0 takes their time
    away); network: bandwidth factor (> 0, 0.5 = half bandwidth); host_idle: factor of the untraced host
    time (>= 0: 0 removes it)."""
    pattern: str = ""
    """op: glob on node names, or ``re:<regex>``."""
    sigma: float = 0.0
    """jitter: relative standard deviation of the compute factor."""
    seed: int = 0
    """jitter: random seed."""
    step: int | None = None
    """stall: the step before whose first node the rank stalls (None: the run's first step, which the
    replay fills in once it has loaded the run: ``skewlens.replay.driver.slowdowns_for``)."""
    every_step: bool = False
    """stall: stall before every step of the window ``first_step..last_step`` instead (``step`` unset)."""
    delay_ns: int = 0
    """stall / comm_delay: the extra wait, ns (the config's ``delay_ms``)."""
    before: str = "collective"
    """comm_delay: the delay comes before every ``send`` | ``collective`` | ``comm`` node."""
    latency_ns: int = 0
    """network: extra latency per message, ns."""
    links: tuple[tuple[int, int], ...] = ()
    """network: affected links as rank pairs."""
    nodes: tuple[int, ...] = ()
    """network: affected nodes (outer coordinate of the topology's placement)."""
    first_step: int | None = None
    """First step the item applies to (None: from the start)."""
    last_step: int | None = None
    """Last step the item applies to, inclusive (None: to the end)."""
    device: str = "any"
    """compute / op / jitter: the ops scaled, ``any``, ``host`` (host operators) or ``gpu`` (GPU ops)."""

    def __post_init__(self) -> None:
        where = f"slowdown item (kind={self.kind})"
        if self.kind not in KINDS:
            raise ConfigError(f"slowdown item: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        # a list is taken as the tuple it stands for (the item stays hashable)
        for name in ("ranks", "nodes"):
            value = getattr(self, name)
            if not isinstance(value, tuple | list) or not all(_is_int(v) for v in value):
                raise ConfigError(f"{where}: {name} must be a sequence of {name}, got {value!r}")
            object.__setattr__(self, name, tuple(int(v) for v in value))
        for name, value, positive in (
            ("factor", self.factor, self.kind not in ZERO_FACTOR_KINDS),
            ("sigma", self.sigma, False),
            ("delay_ns", self.delay_ns, False),
            ("latency_ns", self.latency_ns, False),
        ):
            if (problem := number_problem(value, positive=positive, name=name)) is not None:
                raise SlowdownFieldError(where, name, problem)
        if self.before not in COMM_ON:
            raise ConfigError(f"{where}: before must be one of {', '.join(COMM_ON)}, got {self.before!r}")
        if self.kind == "op" and not self.pattern:
            raise ConfigError(f"{where}: pattern is required")
        if self.pattern.startswith("re:"):
            try:
                re.compile(self.pattern[3:])
            except re.error as e:
                raise ConfigError(f"{where}: pattern {self.pattern!r} is not a valid regex: {e}") from None
        if any(len(lk) != 2 for lk in self.links):
            raise ConfigError(f"{where}: links must be pairs of ranks, got {self.links}")
        if self.first_step is not None and self.last_step is not None and self.first_step > self.last_step:
            raise ConfigError(f"{where}: first_step {self.first_step} > last_step {self.last_step}")
        if self.every_step and self.kind != "stall":
            raise ConfigError(
                f"{where}: every_step is a stall's (it stalls every step); a {self.kind} item has none"
            )
        if self.every_step and self.step is not None:
            raise ConfigError(
                f"{where}: step {self.step} and every_step: a stall is at one step or at every step"
            )
        if self.kind == "stall" and self.step is not None and not self.in_window(self.step):
            raise ConfigError(
                f"{where}: step {self.step} is outside first_step..last_step ({self.window()}): the stall "
                "would stall nothing"
            )
        self._check_fields(where)
        if self.device not in DEVICES:
            raise ConfigError(f"{where}: device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.device != "any" and self.kind not in DEVICE_KINDS:
            raise ConfigError(
                f"{where}: device ({self.device}) says which compute ops a {', '.join(sorted(DEVICE_KINDS))} "
                f"item scales; a {self.kind} item scales none"
            )

    def _check_fields(self, where: str) -> None:
        """A field set away from its default that this kind does not read is a :class:`SlowdownFieldError`
        naming it and the kinds that do (``every_step`` and ``device`` have their own messages)."""
        for f in sorted(set().union(*KIND_FIELDS.values()) - KIND_FIELDS[self.kind] - {"every_step"}):
            if getattr(self, f) == _DEFAULTS[f]:
                continue
            takers = [k for k in KINDS if f in KIND_FIELDS[k]]
            owners = " and ".join(filter(None, (", ".join(takers[:-1]), takers[-1])))
            hint = _FIELD_HINTS.get(f, "")
            raise SlowdownFieldError(
                where, f, f"belongs to {owners} items; a {self.kind} item reads none{hint}"
            )

    def scales(self, on_gpu: bool) -> bool:
        """True when this item's ``device`` takes in a compute op on the GPU (``on_gpu``) or on the host."""
        return self.device == "any" or (self.device == "gpu") == on_gpu

    def applies(self, rank: int, step: int) -> bool:
        """True when this item affects ``rank`` at ``step`` (rank filter and step window)."""
        if self.ranks and rank not in self.ranks:
            return False
        if self.first_step is not None and step < self.first_step:
            return False
        return self.last_step is None or step <= self.last_step

    def describe(self) -> str:
        """The item in a few words, as the replay's report states it: ``compute x1.5 on rank 2``."""
        who = f" on {_listed('rank', self.ranks)}" if self.ranks else ""
        if self.kind == "compute":
            what = f"compute x{self.factor:g}"
        elif self.kind == "op":
            what = f"ops {self.pattern!r} x{self.factor:g}"
        elif self.kind == "jitter":
            what = f"compute jitter sigma {self.sigma:g} (seed {self.seed})"
        elif self.kind == "stall":
            at = f"step {self.step}" if self.step is not None else "the first step"
            what = f"a {_ms_exact(self.delay_ns)} ms stall at {'every step' if self.every_step else at}"
        elif self.kind == "comm_delay":
            what = f"+{_ms_exact(self.delay_ns)} ms before every {self.before} op"
        elif self.kind == "host_idle":
            what = f"untraced host time x{self.factor:g}"
        else:
            parts = [f"bandwidth x{self.factor:g}"] if self.factor != 1 else []
            parts += [f"+{self.latency_ns:,} ns latency"] if self.latency_ns else []
            what = ", ".join(parts) or "network unchanged"
            if self.links:
                who = " on links " + ", ".join(f"{a}-{b}" for a, b in self.links)
            elif self.nodes:
                who = f" on {_listed('node', self.nodes)}"
        if self.device != "any":
            what += f" ({'GPU ops' if self.device == 'gpu' else 'host ops'})"
        when = "" if self.first_step is None and self.last_step is None else f" (steps {self.window()})"
        return what + who + when

    def window(self) -> str:
        """The item's steps ``first_step..last_step``, an unset end left blank (``3..``, ``..7``, ``..``)."""
        first, last = self.first_step, self.last_step
        return f"{'' if first is None else first}..{'' if last is None else last}"

    def in_window(self, step: int) -> bool:
        return (self.first_step is None or step >= self.first_step) and (
            self.last_step is None or step <= self.last_step
        )


def _ms_exact(ns: int) -> str:
    """``ns`` in ms as people read it, to the ns: ``50``, ``0.000001``, ``3,600,000`` (not ``:g``'s
    ``3.6e+06``): a slowdown's own setting said back exactly, not a figure rounded by its magnitude as the
    reports print them (``profiler.store.issues.ms_text``)."""
    return f"{ns / 1e6:,.6f}".rstrip("0").rstrip(".")


def _listed(what: str, items: Sequence[int]) -> str:
    """``rank 2``, ``ranks 0, 3``."""
    return f"{what}{'' if len(items) == 1 else 's'} {', '.join(map(str, items))}"


def op_matches(pattern: str, name: str) -> bool:
    """Whether an ``op`` item's ``pattern`` (a glob, or ``re:`` and a regex searched for) matches ``name``."""
    return _matcher(pattern)(name)


@lru_cache(maxsize=256)
def _matcher(pattern: str) -> Callable[[str], bool]:
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:])
        return lambda name: rx.search(name) is not None
    return lambda name: fnmatch.fnmatchcase(name, pattern)


def jitter_factor(seed: int, sigma: float, rank: int, step: int) -> float:
    """The deterministic jitter factor of ``rank`` at ``step``."""
    z = random.Random(f"skewlens-jitter:{seed}:{rank}:{step}").gauss(0.0, 1.0)
    return max(0.05, 1.0 + sigma * z)


class SlowdownModel:
    """The items of a slowdown config as :class:`~skewlens.replay.effects.Effects` (+ ``NetworkEffects``)."""

    __slots__ = ("items", "node_of")

    def __init__(self, items: Sequence[Slowdown], node_of: Callable[[int], int] | None = None) -> None:
        self.items = tuple(items)
        for k, item in enumerate(self.items):  # a dict (as YAML holds one) was an AttributeError at replay
            if not isinstance(item, Slowdown):
                hint = ": pass its .to_slowdown()" if hasattr(item, "to_slowdown") else ""
                raise ConfigError(f"items[{k}]: expected a Slowdown, got {shown(item)}{hint}")
        self.node_of = node_of

    def __repr__(self) -> str:
        return f"SlowdownModel({[s.kind for s in self.items]})"

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        f = 1.0
        for s in self.items:
            if not s.applies(rank, step) or not s.scales(on_gpu):
                continue
            if s.kind == "compute" or (s.kind == "op" and _matcher(s.pattern)(name)):
                f *= s.factor
            elif s.kind == "jitter" and s.sigma > 0:
                f *= jitter_factor(s.seed, s.sigma, rank, step)
        return f

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        del name
        d = 0
        for s in self.items:
            if s.kind == "comm_delay" and node_type in COMM_ON[s.before] and s.applies(rank, step):
                d += s.delay_ns
        return d

    def stall_ns(self, rank: int, step: int) -> int:
        d = 0
        for s in self.items:
            if s.kind == "stall" and (s.every_step or s.step == step) and s.applies(rank, step):
                d += s.delay_ns
        return d

    def host_idle_factor(self, rank: int, step: int) -> float:
        f = 1.0
        for s in self.items:
            if s.kind == "host_idle" and s.applies(rank, step):
                f *= s.factor
        return f

    def comm_adjust(self, ranks: Sequence[int], step: int, on_dim: OnDim | None = None) -> tuple[float, int]:
        factor, extra = 1.0, 0
        members = set(ranks)

        def crosses(a: int, b: int) -> bool:
            return on_dim is None or on_dim[0] in on_dim[1](a, b)

        for s in self.items:
            if s.kind != "network" or not s.in_window(step):
                continue
            hit = not (s.links or s.nodes or s.ranks)
            hit = hit or any(a in members and b in members and crosses(a, b) for a, b in s.links)
            hit = hit or bool(s.ranks and members.intersection(s.ranks))
            if s.nodes and not hit:
                node_of = self.node_of or (lambda r: r)
                hit = any(node_of(r) in s.nodes for r in members)
            if hit:
                factor *= s.factor
                extra += s.latency_ns
        return factor, extra


#: What to give instead of a field that a kind does not read.
_FIELD_HINTS = {
    "pattern": " (kind op scales only the ops it matches)",
    "step": " (first_step / last_step limit any item to some steps)",
}
#: Each field's default, as :meth:`Slowdown._check_fields` compares them.
_DEFAULTS = {f.name: f.default for f in fields(Slowdown)}
