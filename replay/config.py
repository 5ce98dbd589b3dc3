"""Typed configuration of ``skewlens replay`` (Hydra schemas; ``skewlens.cli.replay`` registers them).

The YAML groups in ``conf/`` (``topology/*.yaml``, ``slowdown/*.yaml``) fill these dataclasses; ``main()``
calls ``OmegaConf.to_object`` once, which runs every ``__post_init__`` below, so a bad value fails before
anything runs with a :class:`~skewlens.replay.errors.ConfigError` naming the key. Below ``main()`` only
these typed objects (and the pure ``Topology`` / ``Slowdown`` they convert to) travel.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from numbers import Real

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from skewlens.profiler.store.issues import counted
from skewlens.replay.errors import ConfigError, first_line, shown
from skewlens.replay.network.algorithms import ALGORITHMS
from skewlens.replay.network.topology import Dimension, Topology, TopologyError, type_problem
from skewlens.replay.simulate import COMM_MODES
from skewlens.replay.slowdown import ZERO_FACTOR_KINDS, Slowdown, SlowdownFieldError, number_problem

MODES = ("sim", "real")


def check_given(key: str, value: object) -> None:
    """A :class:`ConfigError` where a required setting (``MISSING`` in its schema) was left unset: Hydra
    refuses one before building the config, and built in Python it was an ``AttributeError`` (``'str'
    object has no attribute 'contention'``) or ``ValueError`` (``could not convert string to float:
    '???'``), or a topology named ``???``."""
    if isinstance(value, str) and value == MISSING:
        raise ConfigError(f"{key}: missing value (a required setting)")


def check_built(key: str, value: object, schema: type) -> None:
    """A :class:`ConfigError` where a setting built in Python is not the config class its schema names: a
    dict (as its YAML holds it) was an ``AttributeError`` (``'dict' object has no attribute
    'contention'``) on first use. Hydra builds every one (``OmegaConf.to_object``)."""
    if not isinstance(value, schema):
        raise ConfigError(f"{key}: expected a {schema.__name__}, got {shown(value)}")


def holds_no(schema: typing.Any, group: str) -> str:
    """What a YAML file of config group ``group`` that is not a mapping of ``schema``'s settings (a list, an
    empty file) is said to hold, naming the first settings."""
    names = ", ".join(f.name for f in dataclasses.fields(schema)[:3])
    return f"holds no {group} (a YAML mapping of its settings: {names}, ...)"


def file_key_problem(doc: object, schema: typing.Any, key: str) -> str | None:
    """The first key of ``doc`` (a YAML file's settings, read as plain data) that ``schema`` does not have,
    as ``topology.dims[0]: unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)``, or whose value is
    not of its type, as ``topology.dims[0].bandwidth_gbps: Value '400Gbps' of type 'str' could not be
    converted to Float`` (OmegaConf's merge named ``bandwidth_gbps`` alone); None where all are its own and
    of their types. Descends into typed sub-configs and lists of them; ``key`` is the prefix ('' at the
    root: ``comm_mod: unknown key``)."""
    if dataclasses.is_dataclass(schema) and isinstance(doc, dict):
        hints = typing.get_type_hints(schema)
        for name, value in doc.items():
            path = f"{key}.{name}" if key else str(name)
            if name not in hints:
                close = difflib.get_close_matches(str(name), list(hints), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"it has {', '.join(hints)}"
                return f"{key + ': ' if key else ''}unknown key {name!r} ({hint})"
            if (found := file_key_problem(value, hints[name], path)) is not None:
                return found
    elif typing.get_origin(schema) is list and isinstance(doc, list):
        item = typing.get_args(schema)[0]
        for i, value in enumerate(doc):
            if (found := file_key_problem(value, item, f"{key}[{i}]")) is not None:
                return found
    elif not dataclasses.is_dataclass(schema) and key:
        return _value_problem(schema, key, doc)
    return None


def _value_problem(setting: typing.Any, key: str, value: object) -> str | None:
    """OmegaConf's first line where ``value`` is not of the type ``setting`` (an interpolation is taken as
    it is, resolved later), as ``key: ...``; else None."""
    name = key.rpartition(".")[2].partition("[")[0] or "value"
    name = name if name.isidentifier() else "value"
    holder = OmegaConf.structured(
        dataclasses.make_dataclass("Setting", [(name, setting, field(default=MISSING))])
    )
    try:
        OmegaConf.merge(holder, {name: value})
    except OmegaConfBaseException as e:
        first = first_line(e)
        return f"{key}: {first}"
    return None


def _as(kind: type[float] | type[int], value: typing.Any) -> typing.Any:
    """``value`` as ``kind`` (``float``, ``int``) where it is a number, else as it is, for the check of the
    class it is given to to name: ``float("fast")`` and ``int("5us")`` of a config built in Python were
    ValueErrors (``could not convert string to float: 'fast'``), and ``float("25")`` took a string."""
    return (
        kind(typing.cast(float, value)) if isinstance(value, Real) and not isinstance(value, bool) else value
    )


def _whole(key: str, value: object) -> int:
    """``value``, an integer setting's, else a :class:`ConfigError` naming ``key``: a string (``nproc="4"``)
    was a TypeError from the range check after it."""
    if (problem := type_problem(value, whole=True)) is not None:
        raise ConfigError(f"{key}: {problem}")
    return int(typing.cast(int, value))


@dataclass(kw_only=True)
class DimensionConfig:
    """One dimension of a topology (innermost first)."""

    kind: str = "switch"
    """switch | ring | fully_connected | fat_tree."""
    size: int = 0
    """Units in this dimension; 0 = as many as the ranks need (outermost dimension only)."""
    bandwidth_gbps: float = MISSING
    """Bandwidth per link and direction, GB/s."""
    latency_ns: int = MISSING
    """Latency per message, ns."""
    oversubscription: float = 1.0
    """fat_tree: uplink oversubscription ratio."""
    links_per_node: int = 0
    """Links (NICs) of a node (a unit of the next inner dimension) on this dimension, shared by its ranks;
    0: one per rank (bandwidth_gbps per GPU). Innermost dimension: 0 or 1."""


@dataclass(kw_only=True)
class TopologyConfig:
    """A topology and the collective algorithm used on it."""

    name: str = MISSING
    """Label used in reports."""
    dims: list[DimensionConfig] = field(default_factory=list)
    """Dimensions, innermost first."""
    placement: str = "block"
    """block | round_robin."""
    node_of_rank: list[int] = field(default_factory=list)
    """Explicit node of each rank (two-dimensional topologies), overrides placement."""
    algorithm: str = "ring"
    """Collective algorithm: ring | tree | halving_doubling | direct | hierarchical."""
    contention: bool = False
    """Share link bandwidth between concurrent transfers (comm_mode=model)."""
    calibrated_ranks: int = 0
    """``skewlens calibrate`` wrote it: the most ranks any fitted transfer spanned (0: not calibrated)."""
    calibrated_r2: float = 1.0
    """``skewlens calibrate`` wrote it: the lowest R² of its link fits."""

    def __post_init__(self) -> None:
        check_given("topology.name", self.name)
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"topology.algorithm: expected one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if not self.dims:
            raise ConfigError("topology.dims: a topology needs at least one dimension")
        self.to_topology()

    def to_topology(self) -> Topology:
        """The pure :class:`Topology` of this config."""
        dims = []
        for i, d in enumerate(self.dims):
            check_built(f"topology.dims[{i}]", d, DimensionConfig)
            check_given(f"topology.dims[{i}].bandwidth_gbps", d.bandwidth_gbps)
            check_given(f"topology.dims[{i}].latency_ns", d.latency_ns)
            try:
                dims.append(
                    Dimension(
                        kind=d.kind,
                        size=d.size,
                        bandwidth_gbps=_as(float, d.bandwidth_gbps),
                        latency_ns=_as(int, d.latency_ns),
                        oversubscription=_as(float, d.oversubscription),
                        links_per_node=_as(int, d.links_per_node),
                    )
                )
            except TopologyError as e:
                raise ConfigError(f"topology.dims[{i}].{e}") from None
        try:
            return Topology(
                name=self.name,
                dims=tuple(dims),
                placement=self.placement,
                node_of_rank=tuple(self.node_of_rank),
            )
        except TopologyError as e:
            raise ConfigError(f"topology.{e}") from None


@dataclass(kw_only=True)
class SlowdownItemConfig:
    """One slowdown item (see ``skewlens.replay.slowdown`` for the kinds and fields)."""

    kind: str = MISSING
    """compute | op | jitter | stall | comm_delay | host_idle | network."""
    ranks: list[int] = field(default_factory=list)
    """Ranks affected (empty: all)."""
    factor: float = 1.0
    """compute / op: duration factor (op: 0 takes the matched ops' time away); network: bandwidth factor;
    host_idle: untraced host time factor (0: none)."""
    pattern: str = ""
    """op: glob on node names, or re:<regex>."""
    sigma: float = 0.0
    """jitter: relative standard deviation."""
    seed: int = 0
    """jitter: random seed."""
    step: int | None = None
    """stall: step at whose start the rank stalls (None: the run's first step)."""
    every_step: bool = False
    """stall: stall at the start of every step of the window first_step..last_step instead."""
    delay_ms: float = 0.0
    """stall / comm_delay: extra wait, ms."""
    before: str = "collective"
    """comm_delay: the delay comes before every send | collective | comm node."""
    latency_ns: int = 0
    """network: extra latency, ns."""
    links: list[list[int]] = field(default_factory=list)
    """network: rank pairs."""
    nodes: list[int] = field(default_factory=list)
    """network: nodes of the topology."""
    first_step: int | None = None
    """First step of the window (None: from the start)."""
    last_step: int | None = None
    """Last step of the window, inclusive (None: to the end)."""
    device: str = "any"
    """compute / op / jitter: the ops scaled, any | host (host operators) | gpu (GPU ops)."""

    def to_slowdown(self) -> Slowdown:
        """The pure :class:`Slowdown` of this item (validates it): ``delay_ms`` becomes its ``delay_ns``,
        checked first (a NaN, inf or 1e308 is refused as ``delay_ms``, not converted)."""
        delay_ms = _as(float, self.delay_ms)
        if (problem := number_problem(delay_ms, positive=False, name="delay_ms")) is not None:
            raise SlowdownFieldError(f"slowdown item (kind={self.kind})", "delay_ms", problem)
        return Slowdown(
            kind=self.kind,
            ranks=tuple(self.ranks),
            factor=_as(float, self.factor),
            pattern=self.pattern,
            sigma=_as(float, self.sigma),
            seed=self.seed,
            step=self.step,
            every_step=bool(self.every_step),
            delay_ns=round(delay_ms * 1e6),
            before=self.before,
            latency_ns=self.latency_ns,
            links=tuple((int(a[0]), int(a[1])) if len(a) == 2 else tuple(a) for a in self.links),  # type: ignore[misc]
            nodes=tuple(self.nodes),
            first_step=self.first_step,
            last_step=self.last_step,
            device=self.device,
        )


@dataclass(kw_only=True)
class SlowdownConfig:
    """A named, composable list of slowdown items, plus knobs the items may interpolate (``${..factor}``)."""

    name: str = "none"
    """Label used in reports."""
    factor: float = 1.0
    """Knob: a factor items refer to (sweep it with ``slowdown.factor=1.0,1.5``)."""
    rank: int = 0
    """Knob: a rank items refer to."""
    delay_ms: float = 0.0
    """Knob: a delay items refer to."""
    step: int | None = None
    """Knob: a step items refer to (None: the run's first step)."""
    entries: list[SlowdownItemConfig] = field(default_factory=list)
    """The slowdowns, applied together."""

    def __post_init__(self) -> None:
        # a host_idle or op item's factor may be 0 (no untraced host time, no time in the ops it matches);
        # another kind refuses it, naming its item
        zero = any(isinstance(e, SlowdownItemConfig) and e.kind in ZERO_FACTOR_KINDS for e in self.entries)
        for name, value, positive in (("factor", self.factor, not zero), ("delay_ms", self.delay_ms, False)):
            if (problem := number_problem(value, positive=positive, name=name)) is not None:
                raise ConfigError(f"slowdown.{name}: {problem}")
        self.to_items()

    def to_items(self) -> list[Slowdown]:
        """The pure :class:`Slowdown` of each entry (validates them: an error names the entry's key)."""
        items = []
        for i, entry in enumerate(self.entries):
            check_built(f"slowdown.entries[{i}]", entry, SlowdownItemConfig)
            try:
                items.append(entry.to_slowdown())
            except SlowdownFieldError as e:
                key = "delay_ms" if e.field == "delay_ns" else e.field  # the item's delay_ms, in ns
                raise ConfigError(f"slowdown.entries[{i}].{key}: {e.problem} (kind={entry.kind})") from None
            except ConfigError as e:
                raise ConfigError(f"slowdown.entries[{i}]: {str(e).partition(': ')[2] or e}") from None
        return items


@dataclass(kw_only=True)
class RealConfig:
    """Real replay (``mode=real``; run by ``skewlens.replay.real``)."""

    timeout_s: float = 60.0
    """Per-operation timeout, s."""
    backend: str = "auto"
    """auto | gloo | nccl."""
    nproc: int | None = None
    """Processes to start (None: one per traced rank)."""
    compute: str = "auto"
    """How compute is replayed: auto | spin (busy loop) | sleep | share (spins the rank's share of a core)."""
    launcher_args: list[str] = field(default_factory=list)
    """Extra arguments for torch's launcher (e.g. ``--nnodes``, ``--rdzv-endpoint``)."""
    capture: str = "profiler"
    """How the replay is recorded: profiler (skewlens capture of the workers) | self (own timings)."""

    def __post_init__(self) -> None:
        if self.capture not in ("profiler", "self"):
            raise ConfigError(f"real.capture: expected profiler or self, got {self.capture!r}")
        if (problem := number_problem(self.timeout_s, positive=True)) is not None:
            # inf passed "> 0", started every process, and each worker then refused its plan (JSON has no
            # Infinity): "the launcher exited with code 1"
            raise ConfigError(f"real.timeout_s: {problem} (seconds an op may stay in flight)")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"real.backend: expected auto, gloo or nccl, got {self.backend!r}")
        if self.nproc is not None and _whole("real.nproc", self.nproc) < 1:
            raise ConfigError(f"real.nproc: must be >= 1, got {self.nproc}")
        if self.compute not in ("auto", "spin", "sleep", "share"):
            raise ConfigError(f"real.compute: expected auto, spin, sleep or share, got {self.compute!r}")


@dataclass(kw_only=True)
class ScaleConfig:
    """Replay the run as if it had ``dp`` data-parallel ranks (``skewlens.replay.scale``; group ``scale``)."""

    dp: int = 0
    """Data-parallel ranks (replicas of a 2-D mesh) to replay the run as; 0: as captured (off)."""
    source: str = "all"
    """all: new replica i copies captured replica i mod k (or a seeded draw, ``seed``) | a rank: every new
    replica copies that rank's (its replica's, in a 2-D mesh)."""
    seed: int | None = None
    """With source=all: each new replica copies a captured one drawn uniformly with this seed (None: i mod
    k)."""

    def __post_init__(self) -> None:
        if _whole("scale.dp", self.dp) < 0:
            raise ConfigError(f"scale.dp: must be >= 0 (0: off), got {self.dp}")
        if self.source != "all" and not self.source.isdigit():
            raise ConfigError(f"scale.source: expected all or a rank, got {self.source!r}")
        if self.seed is not None and self.source != "all":
            raise ConfigError(f"scale.seed: draws sources with scale.source=all; scale.source={self.source}")

    @property
    def source_rank(self) -> int | None:
        """The rank every replica copies, None for all."""
        return None if self.source == "all" else int(self.source)


@dataclass(kw_only=True)
class ReplayConfig:
    """Root config of ``skewlens replay``."""

    trace: str = MISSING
    """Run directory to replay."""
    out: str = MISSING
    """Output directory (timeline/summary Parquet, Perfetto JSON, config.yaml)."""
    mode: str = "sim"
    """sim (simulated replay) | real (re-execute on real processes)."""
    comm_mode: str = "as_recorded"
    """as_recorded (transfers from the trace) | model (from the topology)."""
    topology: TopologyConfig = MISSING
    """Network topology (config group ``topology``)."""
    slowdown: SlowdownConfig = field(default_factory=SlowdownConfig)
    """Slowdowns (config group ``slowdown``)."""
    real: RealConfig = field(default_factory=RealConfig)
    """Real-replay settings."""
    perfetto: bool = True
    """Also write timeline.json (Chrome/Perfetto trace)."""
    perfetto_max_events: int = 1_000_000
    """At most this many nodes in timeline.json (0: all): beyond it the first whole steps on all ranks that
    fit, and a note of what was left out (about 130 bytes a node, up to 450 with long CUDA kernel names and
    the GPU idle slices; browsers fail on files over ~1 GB). It is
    ``streaming.DEFAULT_MAX_EVENTS`` (``skewlens analyze``'s), which importing here would load pyarrow, and
    ``conf/replay.yaml`` restates it: tests/test_replay_cli.py holds the three equal."""
    progress: bool = True
    """Show progress bars."""
    lenient: bool = False
    """Replay a run whose communication does not match across ranks (order, size, count): what disagrees is
    skipped, its nodes keep their recorded durations and synchronise with no other rank (mode=sim only)."""
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """Extrapolation to another data-parallel size (config group ``scale``)."""

    def __post_init__(self) -> None:
        for key in ("trace", "out", "topology"):
            check_given(key, getattr(self, key))
        for key, schema in (
            ("topology", TopologyConfig),
            ("slowdown", SlowdownConfig),
            ("real", RealConfig),
            ("scale", ScaleConfig),
        ):
            check_built(key, getattr(self, key), schema)
        if self.lenient and self.mode == "real":
            raise ConfigError(
                "lenient: real replay re-issues every collective on real processes, where one whose members "
                "disagree would hang; lenient=true works with mode=sim"
            )
        if _whole("perfetto_max_events", self.perfetto_max_events) < 0:
            raise ConfigError(f"perfetto_max_events: must be >= 0 (0: all), got {self.perfetto_max_events}")
        if self.mode not in MODES:
            raise ConfigError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.comm_mode not in COMM_MODES:
            raise ConfigError(f"comm_mode: expected one of {', '.join(COMM_MODES)}, got {self.comm_mode!r}")
        if self.topology.contention and self.comm_mode != "model":
            raise ConfigError("topology.contention: link sharing needs comm_mode=model")
        if self.scale.dp and self.comm_mode != "model":
            raise ConfigError(
                f"scale.dp={self.scale.dp}: the recorded transfers are those of the captured size, not of "
                f"{counted(self.scale.dp, 'rank')}; extrapolate with comm_mode=model (and a topology)"
            )
        if self.scale.dp and self.mode == "real":
            raise ConfigError("scale.dp: real replay re-executes the captured ranks; extrapolate in mode=sim")
        if self.mode == "real" and self.comm_mode == "model":
            raise ConfigError(
                f"comm_mode=model: a real replay's transfers run on this host's own network as they run, not "
                f"on topology {self.topology.name}'s model, and its table would set them beside a simulation "
                "of that other network; replay it with comm_mode=as_recorded (the default), or model the "
                "topology in mode=sim"
            )
        if self.mode == "real":
            for i, entry in enumerate(self.slowdown.entries):
                if entry.kind == "network":
                    raise ConfigError(
                        f"slowdown.entries[{i}]: kind=network changes transfer times, which a real replay "
                        "does not: its transfers run on this host's own network as they run; replay it in "
                        "mode=sim"
                    )
