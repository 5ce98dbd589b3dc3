"""Calibrate the network model from a recorded run: fit latency α and bandwidth B of the α-β model.

**What is fitted.** Every matched collective instance and send/recv pair of the run is one *transfer*: the
time from the last member's arrival to the instance's completion, with the wait for late peers removed. It
is taken from the execution model through the replay's own lowering (:func:`skewlens.replay.lower.lower`
with :class:`~skewlens.replay.comm.AsRecorded` timing), so it is exactly the part of a recorded collective
that ``comm_mode=model`` replaces: arrival as the execution model defines it (a member's start, or the end
of the collective it was queued behind on its stream), detached members (an eager send, a member recorded
done before the last arrival) left out. An instance's transfer is its last attached member's completion
minus the last arrival (the latest of the members' transfers): the model ends every member together, and an
instance is done when its last member is. (The median member would make modelled instances end early: on a
2-rank gloo capture, replaying every instance at its own median member transfer gave step times 6% short,
at its latest 2% long.)

**The model.** For a topology and an algorithm, every formula of :mod:`skewlens.replay.network.algorithms`
is linear in the latency ``α`` and the inverse bandwidth ``1/B`` of the dimensions a group spans:
``T = a·α + b·(1/B)``, with ``a`` (messages on the critical path) and ``b`` (bytes on it) set by the
collective type, the message size ``S``, the group size ``p`` and the algorithm. The coefficients are read
off :class:`~skewlens.replay.comm.ModelTiming` itself (probe topologies with one latency or bandwidth set,
the others free), so the fit is of the very model the replay runs, ring hops and hierarchical two-level
costs included, and needs no formula of its own.

**Link classes.** A topology's dimensions are its link classes (innermost first; the default base topology
is one non-blocking switch, so every group shares one class). A group's traffic is charged to the outermost
dimension it spans (flat algorithms use the slowest link, taken to be the outermost); a hierarchical
collective that spans the innermost dimension and an outer one is charged to both. All transfers are
fitted together, two unknowns per dimension seen; dimensions no transfer crosses keep the base values. The
base's ``links_per_node`` (links of a node on an outer dimension) is kept and written out resolved: the
fitted ``B`` is one link's, shared as the replay shares it (the inter-node rings of a hierarchical
collective on one link divide it).

**The fit** is Huber-weighted least squares on relative residuals ``(T_recorded − T_model) / T_model``, by
iteratively reweighted least squares: weights ``h_i / T_model,i²`` (``h`` Huber's weight, ``k = 1.345``,
scale ``1.4826·MAD`` of the relative residuals), the first pass relative to the recorded times. Relative,
because transfers span orders of magnitude (a barrier's 50 µs and a 100 MB all_reduce's 100 ms): in absolute
terms the largest messages alone would decide the fit and the latency would be noise. Relative to the
model's time rather than the recorded one (a constant coefficient of variation, as a Gamma GLM), because
that fit is unbiased for the mean transfer at each size, which is what a replay's step time adds up;
weights ``1/T_recorded²`` favour the short transfers of a noisy size and under-predict (on a loaded 2-rank
gloo capture the replay came out 16% short with them, 0.3% with these). Huber, because a few recorded
transfers are inflated by what the model does not know (a descheduled thread, a busy progress thread):
they are down-weighted, not dropped. A latency that comes out negative is pinned to 0, and a bandwidth that
does not come out finite and positive (transfers that do not grow with size) is pinned at
:data:`MAX_BANDWIDTH_GBPS`, the rest refitted; the report notes both.

**Identifiability.** Latency and bandwidth can only be told apart from at least two distinct message sizes
(one of them > 0) in a link class; fewer is a :class:`CalibrationError` naming the groups. The per
(group, type) rows of the report are fitted on their own; one with a single size gets its latency only,
its bandwidth held at its link class's (a note says so).

Pure: run in, :class:`Calibration` out; :func:`topology_yaml` renders the ``conf/topology/`` entry and
:func:`write_topology` writes it atomically. Rendering of the fit table is the CLI's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from skewlens.profiler.atomic import write_text_atomic
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.vocab import EMPTY_WAITS_FOR_NONE, CommType
from skewlens.replay.comm import AsRecorded, ModelTiming
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.errors import ConfigError, ReplayError
from skewlens.replay.lower import collective_bytes, group_members, lower
from skewlens.replay.network.algorithms import ALGORITHMS
from skewlens.replay.network.topology import Dimension, Topology, TopologyError, config_message

F64 = npt.NDArray[np.float64]

#: Huber's tuning constant (95% efficiency under normal errors).
HUBER_K = 1.345
#: Distinct message sizes a link class needs for latency and bandwidth to be told apart.
MIN_SIZES = 2
#: The base topology when none is given: every rank on one non-blocking switch (one link class).
DEFAULT_BASE = Topology(
    name="calibrated",
    dims=(Dimension(kind="switch", size=0, bandwidth_gbps=1.0, latency_ns=0),),
)
#: Name of point-to-point transfers in the report (collectives go by their type, ``all_reduce``).
P2P_TYPE = "send_recv"

_PROBE_LATENCY_NS = 1_000_000_000  # a latency probe: T / probe = messages on the critical path
_PROBE_BW = 1e-6  # bytes/ns, a bandwidth probe: T * probe = bytes on the critical path
_FREE_BW = 1e15  # bytes/ns of the dimensions a probe leaves out (their bytes cost nothing)
_MAX_ITER = 100
#: The bandwidth written where the transfers do not grow with message size (none can be fitted), GB/s.
MAX_BANDWIDTH_GBPS = 10_000.0
#: Below this R², a link class's fit explains little of the transfers it was fitted to (:func:`poor_fits`).
POOR_FIT_R2 = 0.5
#: Above this median ``|recorded − model| / recorded``, a link class's fit misses a typical transfer by more
#: than half its time (:func:`poor_fits`).
POOR_FIT_MEDIAN_RESIDUAL = 0.5


class CalibrationError(ReplayError):
    """A run cannot be calibrated (no communication, too few message sizes, no size dependence)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Transfer:
    """One recorded transfer: a collective instance or send/recv pair, the wait for late peers removed."""

    pg_name: str
    """Process group."""
    comm_type: CommType | None
    """Collective type; None for a send/recv pair."""
    seq: int
    """Collective: per-group sequence number; send/recv pair: index into ``run.p2p``."""
    ranks: tuple[int, ...]
    """Members' global ranks (send/recv: sender, receiver)."""
    nbytes: int
    """Message size (a collective: the largest member's ``comm_size``, or for an all_to_all with uneven
    splits what :func:`~skewlens.replay.comm.collective_bytes` makes of them), bytes."""
    transfer_ns: int
    """Latest attached member's completion − last arrival, ns (the wait for late peers removed)."""

    @property
    def type_name(self) -> str:
        """``all_reduce``, ``broadcast``, ..., or ``send_recv``."""
        return P2P_TYPE if self.comm_type is None else self.comm_type.name.lower()


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """One fitted α-β pair and how well it explains its transfers."""

    label: str
    """``dim 0 (switch)`` for a link class; ``'<group>' <type>`` for a group row."""
    groups: tuple[str, ...]
    """Process groups of the transfers fitted."""
    comm_types: tuple[str, ...]
    """Types of the transfers fitted."""
    n: int
    """Transfers fitted."""
    sizes: int
    """Distinct message sizes among them."""
    latency_ns: float
    """Fitted α, ns per message."""
    bandwidth_gbps: float
    """Fitted B, GB/s (bytes/ns); nan for a latency-only row (its bytes cost what its link class's do)."""
    r2: float
    """Coefficient of determination of the fitted transfers (1 − SS_res/SS_tot, ns); nan for n < 2."""
    median_residual: float
    """Median of ``|T_recorded − T_model| / T_recorded``."""
    p90_residual: float
    """90th percentile of the same."""
    latency_only: bool = False
    """Only α was fitted (one message size); B is the link class's."""
    note: str = ""
    """What the reader should know about this row (latency pinned to 0, latency only, ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """A calibrated topology, the fits behind it and the transfers they came from."""

    run_dir: str
    """The run calibrated from."""
    topology: Topology
    """The calibrated topology (the base's shape, fitted latency and bandwidth per dimension seen)."""
    algorithm: str
    """The collective algorithm the fit assumed (and the topology entry names)."""
    links: tuple[Fit, ...]
    """One fit per dimension seen (what the topology holds), innermost first."""
    groups: tuple[Fit, ...]
    """One fit per (process group, type), on its transfers alone."""
    transfers: tuple[Transfer, ...]
    """The transfers fitted."""
    kept: tuple[int, ...] = ()
    """Dimensions no transfer crosses: kept from the base topology."""
    skipped: int = 0
    """Transfers left out: recorded as 0 ns (every member detached), an empty all_reduce, all_gather,
    reduce_scatter or reduce (which moves nothing: ``vocab.EMPTY_WAITS_FOR_NONE``), or between ranks of one
    unit of the base topology (crossing none of its links, so no dimension's latency or bandwidth is in
    them)."""


def model_time_ns(timing: ModelTiming, t: Transfer) -> float:
    """The transfer time ``timing`` gives ``t`` (the model's, every member ending together), ns."""
    if t.comm_type is None:
        return float(timing.p2p_time_ns(t.ranks[0], t.ranks[1], t.nbytes))
    return float(timing.collective_time_ns(t.comm_type, t.nbytes, t.ranks))


def recorded_transfers(run: RunTrace) -> tuple[list[Transfer], int]:
    """Each matched collective instance and send/recv pair of ``run`` as a :class:`Transfer` (see the
    module docstring), and how many were left out (no attached member, recorded as 0 ns, or empty: see
    :attr:`Calibration.skipped`). Collectives
    of groups with members that have no trace are left out too (:func:`untraced_members`)."""
    low = lower(run, effects=NO_EFFECTS, timing=AsRecorded())
    out: list[Transfer] = []
    skipped = 0
    partial = set(untraced_members(run))
    for gi, info in enumerate(low.syncs):
        if not info.is_p2p and run.collectives[info.index].pg_name in partial:
            continue
        member = [t for t, det in zip(low.graph.transfer[gi], info.detached, strict=True) if not det]
        ns = max(member, default=0)
        if ns <= 0:
            skipped += 1
            continue
        if info.is_p2p:
            p = run.p2p[info.index]
            t = Transfer(
                pg_name=p.pg_name,
                comm_type=None,
                seq=info.index,
                ranks=(p.src_rank, p.dst_rank),
                nbytes=p.comm_bytes,
                transfer_ns=ns,
            )
        else:
            c = run.collectives[info.index]
            nbytes = collective_bytes(run, c)
            if nbytes == 0 and c.comm_type in EMPTY_WAITS_FOR_NONE:  # no transfer: the model costs it 0
                skipped += 1
                continue
            t = Transfer(
                pg_name=c.pg_name,
                comm_type=c.comm_type,
                seq=c.seq,
                ranks=c.ranks,
                nbytes=nbytes,
                transfer_ns=ns,
            )
        out.append(t)
    return out, skipped


def untraced_members(run: RunTrace) -> dict[str, tuple[int, int]]:
    """Process group -> (members traced, members) for the groups whose collectives some member without a
    trace took part in: their transfers cannot be told from waiting for those members."""
    out: dict[str, tuple[int, int]] = {}
    for c in run.collectives:
        full = group_members(run, c)
        if len(full) > len(c.ranks):
            out[c.pg_name] = (len(c.ranks), len(full))
    return out


# --- the design: coefficients of (α_d, 1/B_d) read off the replay's model ---------------------------------


def _probe_topology(base: Topology, set_dims: dict[int, tuple[int, float]]) -> Topology:
    """``base`` with dimension ``d`` at ``set_dims[d] = (latency_ns, bandwidth)`` and the others free."""
    dims = tuple(
        Dimension(
            kind=d.kind,
            size=d.size,
            latency_ns=set_dims.get(k, (0, _FREE_BW))[0],
            bandwidth_gbps=set_dims.get(k, (0, _FREE_BW))[1],
            links_per_node=d.links_per_node,
        )
        for k, d in enumerate(base.dims)
    )
    return replace(base, dims=dims)


class _Design:
    """Coefficients of each transfer on the unknowns ``(α_d, 1/B_d)``, from probes of ModelTiming."""

    def __init__(self, base: Topology, algorithm: str) -> None:
        self.base = base
        self.algorithm = algorithm
        self._timings: dict[tuple[tuple[int, tuple[int, float]], ...], ModelTiming] = {}

    def _time(self, t: Transfer, set_dims: dict[int, tuple[int, float]]) -> float:
        key = tuple(sorted(set_dims.items()))
        mt = self._timings.get(key)
        if mt is None:
            mt = self._timings[key] = ModelTiming(
                _probe_topology(self.base, set_dims), algorithm=self.algorithm
            )
        return model_time_ns(mt, t)

    def _coef(self, t: Transfer, dims: Sequence[int]) -> tuple[float, float]:
        """``(a, b)`` of ``T = a·α + b/B`` with the same α and B on every dimension in ``dims``."""
        a = self._time(t, dict.fromkeys(dims, (_PROBE_LATENCY_NS, _FREE_BW))) / _PROBE_LATENCY_NS
        b = self._time(t, dict.fromkeys(dims, (0, _PROBE_BW))) * _PROBE_BW
        return a, b

    def spanned(self, t: Transfer) -> tuple[int, ...]:
        try:
            return self.base.spanned(t.ranks)
        except TopologyError as e:
            raise ConfigError(config_message(e)) from None
        except ValueError as e:
            raise ConfigError(f"topology: {e}") from None

    def per_dim(self, t: Transfer) -> dict[int, tuple[float, float]]:
        """Coefficients per link class: the outermost spanned dimension, plus the innermost where the
        model charges both (a hierarchical collective: its cost is additive over the two)."""
        dims = self.spanned(t)
        if not dims:
            return {}
        outer = dims[-1]
        if dims[0] == outer:
            return {outer: self._coef(t, (outer,))}
        inner = dims[0]
        ci, co, both = self._coef(t, (inner,)), self._coef(t, (outer,)), self._coef(t, (inner, outer))
        additive = all(
            math.isclose(x + y, z, rel_tol=1e-6, abs_tol=1e-9) for x, y, z in zip(ci, co, both, strict=True)
        )
        return {inner: ci, outer: co} if additive else {outer: co}

    def effective(self, t: Transfer) -> tuple[float, float]:
        """Coefficients with one α and B on every dimension (a group's effective α-β)."""
        return self._coef(t, self.spanned(t))


# --- robust least squares ---------------------------------------------------------------------------------


def _huber_fit(x: F64, y: F64, fixed: F64 | None = None, *, k: float | None = None) -> F64:
    """Robust fit of ``y ≈ x·θ + fixed`` (see the module docstring): IRLS with weights ``h_i / μ_i²``,
    ``μ`` the current model time and ``h`` Huber's weight of the relative residual ``(y − μ) / μ``."""
    huber_k = HUBER_K if k is None else k
    off = fixed if fixed is not None else np.zeros(y.size)
    rest = y - off
    floor = 1e-3 * float(np.median(y))
    norm = np.linalg.norm(x / y[:, None], axis=0)
    norm[norm == 0] = 1.0
    xs = x / norm
    mu = y.copy()  # first pass: relative to the recorded times
    h = np.ones(y.size)
    theta = np.zeros(x.shape[1])
    for _ in range(_MAX_ITER):
        sw = np.sqrt(h) / mu
        new, *_ = np.linalg.lstsq(xs * sw[:, None], rest * sw, rcond=None)
        mu = np.maximum(xs @ new + off, floor)
        r = (y - mu) / mu
        scale = 1.4826 * float(np.median(np.abs(r)))
        h = (
            np.minimum(1.0, huber_k * scale / np.maximum(np.abs(r), 1e-300))
            if scale > 1e-12
            else np.ones(y.size)
        )
        done = np.allclose(new, theta, rtol=1e-9, atol=1e-12)
        theta = new
        if done:
            break
    return np.asarray(theta / norm, dtype=np.float64)


def _bounded_fit(x: F64, y: F64) -> tuple[F64, npt.NDArray[np.bool_]]:
    """:func:`_huber_fit` of columns ``(α, 1/B)`` pairs with ``α >= 0`` and ``B <= MAX_BANDWIDTH_GBPS``: a
    coefficient fitted past its bound is pinned there and the others refitted. Returns θ and the pinned."""
    lower = np.tile([0.0, 1.0 / MAX_BANDWIDTH_GBPS], x.shape[1] // 2)
    pinned = np.zeros(x.shape[1], dtype=np.bool_)
    while True:
        theta = lower.copy()
        if not pinned.all():
            fixed = x[:, pinned] @ lower[pinned]
            theta[~pinned] = _huber_fit(x[:, ~pinned], y, fixed)
        low = ~pinned & (theta < lower)
        if not low.any():
            return theta, pinned
        pinned |= low


def _pin_note(latency: bool, bandwidth: bool) -> str:
    parts = []
    if latency:
        parts.append("latency fitted < 0, pinned to 0")
    if bandwidth:
        parts.append(
            f"transfers do not grow with size: bandwidth unresolved, set to {MAX_BANDWIDTH_GBPS:g} GB/s"
        )
    return "; ".join(parts)


def _stats(y: F64, pred: F64) -> tuple[float, float, float]:
    """R² (nan for fewer than 2 transfers or no spread), median and p90 of |relative residual|."""
    rel = np.abs(y - pred) / y
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if y.size >= 2 and ss_tot > 0 else math.nan
    return r2, float(np.median(rel)), float(np.percentile(rel, 90))


def _groups_text(ts: Sequence[Transfer]) -> str:
    by: dict[str, set[str]] = {}
    for t in ts:
        by.setdefault(t.pg_name, set()).add(t.type_name)
    return ", ".join(f"group {g!r} ({', '.join(sorted(ty))})" for g, ty in sorted(by.items()))


def _sizes_text(ts: Sequence[Transfer]) -> str:
    sizes = sorted({t.nbytes for t in ts})
    return ", ".join(f"{s} B" for s in sizes[:4]) + (", ..." if len(sizes) > 4 else "")


def _dim_label(topo: Topology, d: int) -> str:
    return f"dim {d} ({topo.dims[d].kind})"


def _fit_links(
    transfers: Sequence[Transfer], design: _Design
) -> tuple[dict[int, tuple[float, float]], dict[int, str]]:
    """Joint fit of ``(α_d, 1/B_d)`` over every dimension seen; returns them and notes per dimension."""
    rows = [design.per_dim(t) for t in transfers]
    dims = sorted({d for r in rows for d in r})
    col = {d: k for k, d in enumerate(dims)}
    x = np.zeros((len(transfers), 2 * len(dims)))
    for i, r in enumerate(rows):
        for d, (a, b) in r.items():
            x[i, 2 * col[d]] = a
            x[i, 2 * col[d] + 1] = b
    topo = design.base
    for d in dims:
        mine = [t for t, r in zip(transfers, rows, strict=True) if d in r]
        sizes = {t.nbytes for t in mine}
        if len(sizes) < MIN_SIZES or not (x[:, 2 * col[d] + 1] > 0).any():
            raise CalibrationError(
                f"{_dim_label(topo, d)}: {_groups_text(mine)}: every transfer has "
                f"{'the same size' if len(sizes) < MIN_SIZES else 'no bytes'} ({_sizes_text(mine)}), so "
                f"latency and bandwidth cannot be told apart; calibrate from a run with at least "
                f"{MIN_SIZES} message sizes (one > 0) on these links"
            )
    if (
        np.linalg.matrix_rank(x / np.maximum(np.linalg.norm(x, axis=0), 1e-300)) < x.shape[1]
        and len(dims) == 1
    ):
        raise CalibrationError(
            f"{_dim_label(topo, dims[0])}: {_groups_text(transfers)}: every transfer's modelled cost has its "
            f"latency and bandwidth terms in the same proportion ({_sizes_text(transfers)}: one message "
            "size per link once the algorithm's steps are counted), so they cannot be told apart; calibrate "
            f"from a run with at least {MIN_SIZES} message sizes on these links"
        )
    if np.linalg.matrix_rank(x / np.maximum(np.linalg.norm(x, axis=0), 1e-300)) < x.shape[1]:
        raise CalibrationError(
            f"{', '.join(_dim_label(topo, d) for d in dims)}: the transfers cross these links only "
            f"together, in the same proportions ({_groups_text(transfers)}), so their latencies and "
            f"bandwidths cannot be told apart; calibrate with a base topology of fewer dimensions"
        )
    y = np.array([t.transfer_ns for t in transfers], dtype=np.float64)
    theta, pinned = _bounded_fit(x, y)
    out: dict[int, tuple[float, float]] = {}
    notes: dict[int, str] = {}
    for d in dims:
        k = 2 * col[d]
        notes[d] = _pin_note(bool(pinned[k]), bool(pinned[k + 1]))
        out[d] = (float(theta[k]), 1.0 / float(theta[k + 1]))
    return out, notes


def _group_fit(ts: Sequence[Transfer], design: _Design, no_latency: ModelTiming) -> Fit:
    """Effective α-β of one (group, type) on its transfers alone; with one size its latency only, its bytes
    costing what they do in ``no_latency`` (the calibrated topology without latencies)."""
    coef = np.array([design.effective(t) for t in ts], dtype=np.float64)
    y = np.array([t.transfer_ns for t in ts], dtype=np.float64)
    sizes = {t.nbytes for t in ts}
    label = f"{ts[0].pg_name!r} {ts[0].type_name}"
    common = {
        "label": label,
        "groups": (ts[0].pg_name,),
        "comm_types": (ts[0].type_name,),
        "n": len(ts),
        "sizes": len(sizes),
    }
    if len(sizes) >= MIN_SIZES and (coef[:, 1] > 0).any():
        theta, pinned = _bounded_fit(coef, y)
        r2, med, p90 = _stats(y, coef @ theta)
        return Fit(
            **common,  # type: ignore[arg-type]
            latency_ns=float(theta[0]),
            bandwidth_gbps=1.0 / float(theta[1]),
            r2=r2,
            median_residual=med,
            p90_residual=p90,
            note=_pin_note(bool(pinned[0]), bool(pinned[1])),
        )
    why = f"one size ({_sizes_text(ts)}): latency only, bandwidth the link's"
    bw_part = np.array([model_time_ns(no_latency, t) for t in ts], dtype=np.float64)
    alpha = float(_huber_fit(coef[:, :1], y, fixed=bw_part)[0]) if (coef[:, 0] > 0).any() else 0.0
    alpha = max(alpha, 0.0)
    pred = coef[:, 0] * alpha + bw_part
    r2, med, p90 = _stats(y, pred)
    return Fit(
        **common,  # type: ignore[arg-type]
        latency_ns=alpha,
        bandwidth_gbps=math.nan,
        r2=r2,
        median_residual=med,
        p90_residual=p90,
        latency_only=True,
        note=why,
    )


def calibrate(run: RunTrace, *, base: Topology | None = None, algorithm: str | None = None) -> Calibration:
    """Fit the network ``run`` saw (see the module docstring).

    ``base`` gives the shape (dimensions, placement) and the values of dimensions no transfer crosses
    (default :data:`DEFAULT_BASE`: one non-blocking switch); ``algorithm`` the collective algorithm the
    formulas assume (default ``ring``).
    """
    topo = base if base is not None else replace(DEFAULT_BASE, name=f"{Path(run.run_dir).name}_calibrated")
    alg = algorithm or "ring"
    if alg not in ALGORITHMS:
        raise ConfigError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {alg!r}")
    transfers, skipped = recorded_transfers(run)
    if not transfers and (partial := untraced_members(run)):
        which = ", ".join(f"'{g}': {k} of {n} ranks traced" for g, (k, n) in sorted(partial.items()))
        raise CalibrationError(
            f"{run.run_dir}: every collective has members without a trace ({which}): a transfer cannot be "
            "told from the wait for a member whose arrival is not known; calibrate from a run with every "
            "member's trace"
        )
    if not transfers:
        what = (
            "no matched collectives or send/recv pairs" if skipped == 0 else f"{skipped} transfers, all 0 ns"
        )
        hint = (
            f"level {run.manifest.level!r}; capture at 'collectives' or above, with communication between "
            "ranks"
            if run.manifest.source != "foreign"
            else "Chakra traces from another tool, such as its generator's or text2chakra's, may time no "
            "communication; calibrate from a capture or a skewlens import of the run"
        )
        raise CalibrationError(f"{run.run_dir}: {what} to calibrate from ({hint})")
    design = _Design(topo.sized(run.world_size), alg)  # placed as the replay places the run
    seen = [t for t in transfers if design.spanned(t)]
    if not seen:
        raise CalibrationError(
            f"{run.run_dir}: every transfer stays inside one unit of topology {topo.name!r} "
            f"({_groups_text(transfers)}), so no link is crossed; give a base topology whose "
            f"innermost dimension separates the ranks"
        )
    fitted, notes = _fit_links(seen, design)
    dims = list(topo.dims)
    for d, (alpha, bw) in fitted.items():
        dims[d] = Dimension(
            kind=dims[d].kind,
            size=dims[d].size,
            bandwidth_gbps=bw,
            latency_ns=round(alpha),
            links_per_node=dims[d].links_per_node,
        )
    calibrated = replace(topo, dims=tuple(dims))
    placed = calibrated.sized(run.world_size)
    timing = ModelTiming(placed, algorithm=alg)
    no_latency = ModelTiming(
        replace(placed, dims=tuple(replace(d, latency_ns=0) for d in placed.dims)), algorithm=alg
    )

    links: list[Fit] = []
    for d in sorted(fitted):
        mine = [t for t in seen if d in design.per_dim(t)]
        y = np.array([t.transfer_ns for t in mine], dtype=np.float64)
        r2, med, p90 = _stats(y, np.array([model_time_ns(timing, t) for t in mine]))
        links.append(
            Fit(
                label=_dim_label(topo, d),
                groups=tuple(sorted({t.pg_name for t in mine})),
                comm_types=tuple(sorted({t.type_name for t in mine})),
                n=len(mine),
                sizes=len({t.nbytes for t in mine}),
                latency_ns=float(calibrated.dims[d].latency_ns),
                bandwidth_gbps=calibrated.dims[d].bandwidth_gbps,
                r2=r2,
                median_residual=med,
                p90_residual=p90,
                note=notes.get(d, ""),
            )
        )
    by_group: dict[tuple[str, str], list[Transfer]] = {}
    for t in seen:
        by_group.setdefault((t.pg_name, t.type_name), []).append(t)
    groups = tuple(_group_fit(ts, design, no_latency) for _k, ts in sorted(by_group.items()))
    return Calibration(
        run_dir=run.run_dir,
        topology=calibrated,
        algorithm=alg,
        links=tuple(links),
        groups=groups,
        transfers=tuple(seen),
        kept=tuple(d for d in range(len(dims)) if d not in fitted),
        skipped=skipped + len(transfers) - len(seen),
    )


# --- the topology entry -----------------------------------------------------------------------------------


def _yaml_str(s: str) -> str:
    """A YAML scalar for ``s`` (quoted where plain would be read as something else)."""
    plain = (
        s
        and all(c.isalnum() or c in "_-." for c in s)
        and not s[0].isdigit()
        and s not in ("true", "false", "null")
    )
    return s if plain else '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def topology_yaml(cal: Calibration, *, name: str | None = None) -> str:
    """The ``conf/topology/`` entry of ``cal`` (the format :class:`~skewlens.replay.config.TopologyConfig`
    reads), with the fit summarised in comments at the top."""
    topo = cal.topology
    lines = [
        (
            # the run absolute: one run calibrated from two directories writes one file
            f"# Calibrated by `skewlens calibrate` from {Path(cal.run_dir).resolve()}: "
            f"{len(cal.transfers)} transfers "
            f"(waits for late peers removed), algorithm {cal.algorithm}."
        ),
        "# Huber-weighted least squares on relative residuals; per link class (dimension):",
    ]
    for f in cal.links:
        lines.append(
            f"#   {f.label}: n={f.n}, {f.sizes} sizes, latency {f.latency_ns / 1e3:.3f} us, "
            f"bandwidth {f.bandwidth_gbps:.6g} GB/s, R2 {f.r2:.3f}, median |residual| "
            f"{f.median_residual:.1%}, p90 {f.p90_residual:.1%}{'; ' + f.note if f.note else ''}"
        )
    for d in cal.kept:
        lines.append(f"#   dim {d} ({topo.dims[d].kind}): not crossed by any transfer, kept from the base")
    lines += [
        f"name: {_yaml_str(name or topo.name)}",
        f"algorithm: {cal.algorithm}",
        f"placement: {topo.placement}",
        f"calibrated_ranks: {max((len(t.ranks) for t in cal.transfers), default=0)}",
    ]
    r2s = [f.r2 for f in cal.links if math.isfinite(f.r2)]
    if r2s:
        lines.append(f"calibrated_r2: {min(r2s)!r}")
    if topo.node_of_rank:
        lines.append(f"node_of_rank: [{', '.join(str(n) for n in topo.node_of_rank)}]")
    lines.append("dims:")
    for d, dim in enumerate(topo.dims):
        lines += [
            f"  - kind: {dim.kind}",
            f"    size: {dim.size}",
            f"    bandwidth_gbps: {dim.bandwidth_gbps!r}",
            f"    latency_ns: {dim.latency_ns}",
            f"    oversubscription: {dim.oversubscription!r}",
        ]
        if d:  # resolved: a file's meaning does not hang on the default
            lines.append(f"    links_per_node: {topo.links_per_node(d)}")
    return "\n".join(lines) + "\n"


def poor_fits(cal: Calibration) -> list[str]:
    """A warning per link class (what the topology holds) whose fit explains little of its transfers: R²
    under :data:`POOR_FIT_R2`, or a median relative residual over :data:`POOR_FIT_MEDIAN_RESIDUAL`."""
    out = []
    for f in cal.links:
        why = []
        if math.isfinite(f.r2) and f.r2 < POOR_FIT_R2:
            why.append(f"R² {f.r2:.2f} < {POOR_FIT_R2:g}")
        if f.median_residual > POOR_FIT_MEDIAN_RESIDUAL:
            why.append(f"median residual {f.median_residual:.0%} > {POOR_FIT_MEDIAN_RESIDUAL:.0%}")
        if why:
            out.append(
                f"{f.label}: the fit explains little of its {f.n} transfers ({', '.join(why)}), so replays "
                "with this topology (comm_mode=model) will time transfers off by about that much; few "
                "transfers or message sizes, and noisy timing (a short capture, gloo on shared CPU cores), "
                "cause it: calibrate from a longer capture with more message sizes, on the network to model"
            )
    return out


def write_topology(cal: Calibration, path: str | Path, *, name: str | None = None) -> Path:
    """Write :func:`topology_yaml` to ``path`` atomically (a temporary file, then a rename)."""
    return write_text_atomic(path, topology_yaml(cal, name=name))
