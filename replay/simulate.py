"""Simulated replay of a whole run: :func:`simulate` and its :class:`SimResult`.

``simulate`` lowers the store's :class:`RunTrace` to the pure core (``skewlens.replay.lower`` ->
``skewlens.replay.core``), runs it, and maps segment times back to trace rows. See ``skewlens.replay.lower``
for the host-gap rule and ``skewlens.replay.comm`` for the two ways of timing communication (``as_recorded``
and ``model``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from skewlens.profiler.store.issues import Issue, Severity
from skewlens.profiler.store.load import Decoder
from skewlens.profiler.store.model import RunTrace, not_a_run, seal_arrays
from skewlens.profiler.store.validate import ValidationReport, validate_run
from skewlens.progress import NO_PROGRESS, Progress
from skewlens.replay.comm import AsRecorded, ModelTiming
from skewlens.replay.core import DeadlockError, Graph, Outcome, Preds, binding_segments, run
from skewlens.replay.effects import NO_EFFECTS, Effects, NetworkEffects
from skewlens.replay.errors import MAX_SIM_NS, SIM_CLOCK, ConfigError, ReplayError, shown
from skewlens.replay.execution import ExecutionModel, awaited_arrivals, clock_note, execution_model
from skewlens.replay.lower import KIND_FIXED, KIND_SYNC, CommTiming, Lowered, lower, prepare, rank_index
from skewlens.replay.network.topology import Topology
from skewlens.replay.slowdown import Slowdown, SlowdownModel
from skewlens.replay.targets import check_slowdown_targets, run_steps

I64 = npt.NDArray[np.int64]
_A = TypeVar("_A", bound=np.ndarray)

COMM_MODES = ("as_recorded", "model")


def step_times_from_spans(
    spans: Mapping[tuple[int, int], tuple[int, int]], start_ns: int | None = None
) -> dict[int, int]:
    """Per step: completion of the step minus completion of the previous step (for the first step: minus
    where it began, the earlier of ``start_ns``, where it began as recorded, and its earliest start in
    ``spans``: a stall cannot shorten it by starting it later, and work before the window that a what-if
    shortens, which starts it earlier, does not shorten it either; blame leaves that work out). A step
    completes at the latest end over ranks, and not before the step before it completed (the first step:
    not before ``start_ns``): where a rank lacks a step, the ranks that have it can end it before another
    rank ends the previous one, and that step then takes 0. Ranks that run ahead into the next step (a rank
    that no longer straggles starts its next step early and then waits) do not lengthen a step this way;
    no step is negative, and the steps add up to the span of the recorded steps. Steps below 0 (a rank
    without step marks) are left out."""
    ends: dict[int, int] = {}
    starts: dict[int, int] = {}
    for (_r, s), (a, b) in spans.items():
        if s < 0:
            continue
        ends[s] = max(ends.get(s, b), b)
        starts[s] = min(starts.get(s, a), a)
    out: dict[int, int] = {}
    if not ends:
        return out
    first = starts[min(starts)]
    prev = first if start_ns is None else min(start_ns, first)
    for s in sorted(ends):
        done = max(prev, ends[s])
        out[s] = done - prev
        prev = done
    return out


@dataclass(eq=False, kw_only=True, slots=True)
class SimResult:
    """Replayed times of every node, row-aligned with the run's RankTraces."""

    start_ns: dict[int, I64]
    """Replayed start of each row, per rank."""
    end_ns: dict[int, I64]
    """Replayed end of each row, per rank."""
    step: dict[int, npt.NDArray[np.int32]]
    """Step of each row (as recorded, -1 unknown), per rank."""
    timed: dict[int, npt.NDArray[np.bool_]]
    """Rows that take part in the replay (all but METADATA / INVALID nodes), per rank."""
    coll_arrival_ns: I64
    """Per ``run.collectives`` instance: the replayed latest arrival of its members."""
    coll_end_ns: I64
    """Per ``run.collectives`` instance: the replayed latest completion of its members."""
    p2p_arrival_ns: I64
    """Per ``run.p2p`` pair: the later of the replayed send and recv starts."""
    p2p_end_ns: I64
    """Per ``run.p2p`` pair: the later of the replayed send and recv ends."""
    comm_mode: str
    """``as_recorded`` or ``model``."""
    origin_ns: int | None = None
    """Where the replay starts: the run's first recorded start, from which each rank's nodes without start
    edges are replayed (None: the earliest replayed start)."""
    steps_start_ns: int | None = None
    """The recorded start of the first step's earliest node (None without step marks); :meth:`step_times`
    counts the first step from it or from the step's earliest replayed start, whichever is earlier."""
    _spans: dict[tuple[int, int], tuple[int, int]] | None = field(default=None, repr=False)

    @property
    def makespan_ns(self) -> int:
        """Latest replayed end minus the replay's start (:attr:`origin_ns`; the earliest replayed start over
        all ranks, METADATA nodes aside, where that is earlier). A stall or delay before the first node of
        the rank that began first is time of the replay: measured from that node's replayed start, a 1 to 6
        ms stall of rank 1 of the 8-GPU DLRM trace, which began 0.7 ms before rank 3, shortened the makespan
        from 20.81 to 20.10 ms."""
        starts = [int(a[self.timed[r]].min()) for r, a in self.start_ns.items() if self.timed[r].any()]
        ends = [int(a[self.timed[r]].max()) for r, a in self.end_ns.items() if self.timed[r].any()]
        if not starts:
            return 0
        first = min(starts) if self.origin_ns is None else min(*starts, self.origin_ns)
        return max(ends) - first

    def __getstate__(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}

    def __setstate__(self, state: dict[str, object]) -> None:
        """Unpickled (joblib, multiprocessing) or deep-copied: read-only, as :func:`simulate` returns it
        (numpy unpickles every array writable, and an edit of the copy left its cached step spans stale)."""
        for f, value in state.items():
            object.__setattr__(self, f, value)
            seal_arrays(value.values() if isinstance(value, dict) else [value])

    def step_spans(self) -> dict[tuple[int, int], tuple[int, int]]:
        """``(rank, step) -> (start_ns, end_ns)`` of each rank's nodes of each step (replayed).

        A rank without any step marks is one step, ``-1``, spanning all its nodes. The dict is the caller's
        own, a copy of the result's cache: editing it changes nothing :meth:`step_times` says.
        """
        return dict(self._cached_spans())

    def _cached_spans(self) -> dict[tuple[int, int], tuple[int, int]]:
        if self._spans is None:
            spans: dict[tuple[int, int], tuple[int, int]] = {}
            for r, st in self.step.items():
                m = (st >= 0) & self.timed[r]
                if not m.any():
                    m = self.timed[r]
                    st = np.full(st.shape, -1, dtype=st.dtype)
                if not m.any():
                    continue
                steps, starts, ends = st[m], self.start_ns[r][m], self.end_ns[r][m]
                if not (steps[1:] >= steps[:-1]).all():  # usually in step order already
                    order = np.argsort(steps, kind="stable")
                    steps, starts, ends = steps[order], starts[order], ends[order]
                first = np.flatnonzero(np.concatenate(([True], steps[1:] != steps[:-1])))
                uniq = steps[first]
                lo = np.minimum.reduceat(starts, first)
                hi = np.maximum.reduceat(ends, first)
                for k, a, b in zip(uniq.tolist(), lo.tolist(), hi.tolist(), strict=True):
                    spans[(r, k)] = (a, b)
            self._spans = spans
        return self._spans

    def rooted_awaited_ns(self, run: RunTrace) -> dict[int, list[int]]:
        """Of each rooted collective with a known root (by index in ``run.collectives``), the replayed
        arrival each member waited for (the execution model's ``waits_for``: its root's, its own, or the
        last), aligned with its ``ranks``; every other sync member waited for its group's latest arrival
        (``coll_arrival_ns``, ``p2p_arrival_ns``). ``self`` must replay ``run`` (:func:`check_replays`)."""
        check_replays(run, self, caller="SimResult.rooted_awaited_ns")
        return rooted_awaited(run, self)

    def steps(self) -> list[int]:
        """Steps seen on any rank, sorted."""
        return sorted({k for _r, k in self._cached_spans()})

    def step_times(self) -> dict[int, int]:
        """Per step: its completion (the latest replayed end over ranks) minus the previous step's, the
        first step's minus the earlier of where it began as recorded (:attr:`steps_start_ns`) and as
        replayed (:func:`step_times_from_spans`), as the analyses time steps, so that a stall of the rank
        that began the first step cannot shorten it; empty for a run without step marks."""
        return step_times_from_spans(self._cached_spans(), self.steps_start_ns)

    def step_time_ns(self, step: int) -> int:
        """The step's time as :meth:`step_times` gives it; of a rank without step marks (step -1), the span
        of its nodes; a :class:`ReplayError` naming the steps it has for a step it has not."""
        times = self.step_times()
        if step in times:
            return times[step]
        spans = [v for (_r, k), v in self._cached_spans().items() if k == step]
        if not spans:
            have = self.steps()
            shown = ", ".join(map(str, have[:8])) + (f" and {len(have) - 8} more" if len(have) > 8 else "")
            raise ReplayError(f"step {step} has no nodes in this replay (its steps: {shown or 'none'})")
        return max(b for _a, b in spans) - min(a for a, _b in spans)


def check_replays(run: RunTrace, res: SimResult, ranks: Sequence[int] | None = None, *, caller: str) -> None:
    """``res`` is a replay of ``run``: the same ranks, each with as many rows, as many collectives and
    send/recv pairs (of ``ranks`` given, only their rows); else a :class:`ReplayError` saying which differs,
    where a result of another run would fail deep in :func:`~skewlens.replay.summary.summarize`
    (``IndexError``) or the timeline (``ArrowInvalid``). Two runs of one shape pass. Each message begins
    with ``caller``, the function the user called (``summarize: ...``), as :func:`simulate`'s do."""
    if (problem := not_a_run(run)) is not None:
        raise ReplayError(f"{caller}: {problem}")
    if not isinstance(res, SimResult):
        raise ReplayError(f"{caller}: expected a SimResult (from simulate(run)), got {type(res).__name__}")
    of = f"{caller}: {run.run_dir}: the SimResult given is not a replay of this run"
    if set(res.start_ns) != set(run.ranks):
        raise ReplayError(f"{of} (its ranks {sorted(res.start_ns)}, the run's {sorted(run.ranks)})")
    for r in sorted(run.ranks) if ranks is None else ranks:
        rt = run.ranks[r]
        if len(res.start_ns[r]) != len(rt):
            raise ReplayError(
                f"{of} (rank {r}: {len(res.start_ns[r]):,} rows replayed, {len(rt):,} in the run)"
            )
    for what, got, want in (
        ("collectives", len(res.coll_end_ns), len(run.collectives)),
        ("send/recv pairs", len(res.p2p_end_ns), len(run.p2p)),
    ):
        if got != want:
            raise ReplayError(f"{of} ({got:,} {what} replayed, {want:,} in the run)")


def rooted_awaited(run: RunTrace, res: SimResult) -> dict[int, list[int]]:
    """:meth:`SimResult.rooted_awaited_ns` of a ``res`` already checked to replay ``run``
    (:func:`check_replays`), for a caller that checked it once for all it reads."""
    out: dict[int, list[int]] = {}
    for ci, rule in execution_model(run).rooted.items():
        c = run.collectives[ci]
        arr = [int(res.start_ns[r][w]) for r, w in zip(c.ranks, c.rows, strict=True)]
        out[ci] = awaited_arrivals(rule, arr)
    return out


def make_timing(
    comm_mode: str,
    *,
    topology: Topology | None,
    algorithm: str = "ring",
    contention: bool = False,
    effects: Effects = NO_EFFECTS,
) -> CommTiming:
    """The :class:`CommTiming` for ``comm_mode`` (network slowdowns taken from ``effects`` if it has them)."""
    net = effects if isinstance(effects, NetworkEffects) else None
    if comm_mode == "as_recorded":
        if contention:
            raise ConfigError("contention: link sharing needs comm_mode=model")
        return AsRecorded(network_effects=net)
    if comm_mode == "model":
        if topology is None:
            raise ConfigError("comm_mode=model needs a topology")
        return ModelTiming(topology, algorithm=algorithm, contention=contention, network_effects=net)
    raise ConfigError(f"comm_mode: expected one of {', '.join(COMM_MODES)}, got {comm_mode!r}")


def _sized(topology: Topology | None, run_trace: RunTrace) -> Topology | None:
    """``topology`` for ``run_trace``'s ranks (:meth:`Topology.sized`: a size-0 outermost dimension given
    the nodes they fill, which placement and ring hops count)."""
    return topology.sized(run_trace.world_size) if topology is not None else None


def check_effects(run: RunTrace, effects: Effects) -> None:
    """Where ``effects`` is a :class:`SlowdownModel`, every rank, op, step, link and node its items name is in
    ``run`` (:func:`check_slowdown_targets`), else a :class:`ConfigError` naming ``effects.items[k]``: built
    in Python, a slowdown of rank 5 on 2 ranks, or of an op no rank runs, replayed as if not given."""
    if isinstance(effects, SlowdownModel):
        node_of = effects.node_of or (lambda r: r)  # as SlowdownModel.comm_adjust places ranks
        steps = run_steps(run) if any(i.kind in ("stall", "host_idle") for i in effects.items) else []
        check_slowdown_targets(effects.items, run, node_of, steps, where="effects.items")


def check_kinds(topology: object, effects: object) -> None:
    """A :class:`ConfigError` naming ``topology`` or ``effects`` where one built in Python is not what a
    replay takes (a :class:`Topology` or None; a :class:`SlowdownModel` or other :class:`Effects`), with what
    to pass instead: a list of :class:`Slowdown` items, the README's ``SlowdownModel([...])`` without its
    wrapper, was ``AttributeError: 'list' object has no attribute 'compute_factor'`` from inside the
    lowering, as were a ``TopologyConfig``, a ``SlowdownConfig`` or a preset's name."""
    if topology is not None and not isinstance(topology, Topology):
        hint = (
            ": pass its .to_topology()"
            if hasattr(topology, "to_topology")
            else ": build one, Topology(name=..., dims=(Dimension(...),))"
        )
        raise ConfigError(f"topology: expected a Topology, got {shown(topology)}{hint}")
    if not isinstance(effects, Effects):
        if hasattr(effects, "to_items"):
            hint = ": pass SlowdownModel(its .to_items())"
        elif isinstance(effects, Slowdown) or (
            isinstance(effects, list | tuple) and all(isinstance(i, Slowdown) for i in effects)
        ):
            hint = ": wrap the items, SlowdownModel([Slowdown(...), ...])"
        else:
            hint = " (none: leave effects out)" if effects is None else ""
        raise ConfigError(f"effects: expected a SlowdownModel, got {shown(effects)}{hint}")


def _checked_timing(
    caller: str,
    run_trace: RunTrace,
    *,
    topology: Topology | None,
    effects: Effects,
    comm_mode: str,
    algorithm: str,
    contention: bool,
) -> CommTiming:
    """The transfer timing of a replay of ``run_trace`` (:func:`simulate`'s, a :class:`Simulator`'s), once
    ``run_trace`` is a loaded run (else a :class:`ReplayError` naming ``caller``) and ``effects`` are checked
    against it (:func:`check_effects`)."""
    if (problem := not_a_run(run_trace)) is not None:
        raise ReplayError(f"{caller}: {problem}")
    check_kinds(topology, effects)
    check_effects(run_trace, effects)
    return make_timing(
        comm_mode,
        topology=_sized(topology, run_trace),
        algorithm=algorithm,
        contention=contention,
        effects=effects,
    )


def simulate(
    run_trace: RunTrace,
    *,
    topology: Topology | None = None,
    effects: Effects = NO_EFFECTS,
    comm_mode: str = "as_recorded",
    dur_override: Mapping[int, I64] | None = None,
    gap_override: Mapping[int, I64] | None = None,
    algorithm: str = "ring",
    contention: bool = False,
    model: ExecutionModel | None = None,
) -> SimResult:
    """Replay ``run_trace`` in simulation; see the module docstrings of ``skewlens.replay.execution``
    (what waits on what), ``skewlens.replay.lower`` and ``skewlens.replay.comm``. A :class:`SlowdownModel`
    given as ``effects`` is checked against the run first (:func:`check_slowdown_targets`: a rank, op, step
    or link it names that the run lacks is a :class:`ConfigError` naming ``effects.items[k]``:
    :func:`check_effects`)."""
    timing = _checked_timing(
        "simulate",
        run_trace,
        topology=topology,
        effects=effects,
        comm_mode=comm_mode,
        algorithm=algorithm,
        contention=contention,
    )
    low = lower(
        run_trace,
        effects=effects,
        timing=timing,
        dur_override=dur_override,
        gap_override=gap_override,
        model=model,
    )
    return _replay(run_trace, low, comm_mode)


class Simulator:
    """:func:`simulate` of one run for many what-ifs that each change only some ranks' ``dur_override`` /
    ``gap_override``: the run is lowered once, and each :meth:`simulate` re-times only the ranks it
    overrides (:meth:`skewlens.replay.lower.Lowering.retimed`), with the same rules and results as
    ``simulate(run_trace, ..., dur_override=..., gap_override=...)``. Holds the lowering while it lives.

    The replay without overrides also keeps which segments lie on a binding path to each step's end
    (:func:`skewlens.replay.core.binding_segments`), so that :meth:`steps_unchanged` can tell, without
    simulating, a what-if that provably leaves every step's time as it is. It keeps its segment times and
    finds those paths at the first :meth:`steps_unchanged` after it: not while its result is held too
    (the walk's reversed edges were the peak of memory of ``skewlens analyze`` on a 32-rank GPU run)."""

    __slots__ = ("_comm_mode", "_lowering", "_marks", "_run", "_walk")

    def __init__(
        self,
        run_trace: RunTrace,
        *,
        topology: Topology | None = None,
        effects: Effects = NO_EFFECTS,
        comm_mode: str = "as_recorded",
        algorithm: str = "ring",
        contention: bool = False,
        model: ExecutionModel | None = None,
    ) -> None:
        timing = _checked_timing(
            "Simulator",
            run_trace,
            topology=topology,
            effects=effects,
            comm_mode=comm_mode,
            algorithm=algorithm,
            contention=contention,
        )
        self._run = run_trace
        self._comm_mode = comm_mode
        self._lowering = prepare(run_trace, effects=effects, timing=timing, model=model)
        self._marks: bytearray | None = None
        self._walk: tuple[Outcome, list[int]] | None = None  # the baseline's times and the walk's targets

    def simulate(
        self,
        *,
        dur_override: Mapping[int, I64] | None = None,
        gap_override: Mapping[int, I64] | None = None,
    ) -> SimResult:
        """The replay with these overrides (see :func:`simulate`)."""
        if dur_override or gap_override:
            with self._lowering.retimed(dur_override=dur_override, gap_override=gap_override) as low:
                return _replay(self._run, low, self._comm_mode)
        low = self._lowering.lowered
        out = _run_core(self._run, low)
        res = _lift_outcome(self._run, low, out, self._comm_mode)
        targets = _step_targets(low, res)
        self._marks = None
        self._walk = (out, targets) if targets is not None else None
        return res

    def _binding_marks(self) -> bytearray | None:
        """:func:`binding_segments` of the last replay without overrides, walked the first time asked."""
        if self._walk is not None:
            out, targets = self._walk
            self._walk = None
            g = self._lowering.lowered.graph
            self._marks = binding_segments(g, out, targets, _preds(g))
        return self._marks

    def steps_unchanged(
        self,
        *,
        dur_override: Mapping[int, I64] | None = None,
        gap_override: Mapping[int, I64] | None = None,
    ) -> bool:
        """True if :meth:`simulate` with these overrides provably gives every step (as
        ``SimResult.step_spans`` reads them: each step's latest end, the first step's earliest start)
        the time the replay without overrides gave it; False if that is not proven (simulate it then).

        Proven when the overrides only shorten (durations, gaps, hence offsets inside segments and launch
        offsets) and shorten nothing on a binding path of the replay without overrides to a step's end
        (the core's rules are maxima of sums: times can only get earlier, and each path bounds its end
        from below), and when the first step begins at the earliest a rank can begin. Needs
        :meth:`simulate` without overrides to have run first; False before that, and without contention
        only."""
        marks = self._binding_marks()
        if marks is None:
            return False
        lowering = self._lowering
        base = lowering.lowered
        g0 = base.graph
        named = set(dur_override or {}) | set(gap_override or {})
        for i, r in enumerate(base.ranks):
            if r not in named:
                continue
            new = lowering.rank_retimed(i, dur_override=dur_override, gap_override=gap_override)
            if new is None:
                continue
            lo, hi = int(base.row_offset[i]), int(base.row_offset[i + 1])
            s_lo, s_hi = new.seg_lo, new.seg_lo + new.gap.size
            d0, o0 = base.dur[lo:hi], base.off_start[lo:hi]
            gp0, ln0 = np.asarray(g0.gap[s_lo:s_hi]), np.asarray(g0.length[s_lo:s_hi])
            d1, o1, gp1, ln1 = new.dur, new.off_start, new.gap, new.length
            if (d1 > d0).any() or (o1 > o0).any() or (gp1 > gp0).any() or (ln1 > ln0).any():
                return False  # something got longer: times may get later
            if (gp1 < 0).any() or (o1 < 0).any():
                return False
            rows = np.flatnonzero((d1 != d0) | (o1 != o0)) + lo
            retimed_segs = np.flatnonzero((gp1 != gp0) | (ln1 != ln0)) + s_lo
            segs = np.concatenate([base.anchor_segments(rows), retimed_segs])
            if new.launch_off is not None and g0.lsucc_ptr is not None and g0.lsucc_off is not None:
                a, b = new.launch_lo, new.launch_lo + new.launch_off.size
                lf0, lf1 = np.asarray(g0.lsucc_off[a:b]), new.launch_off
                if (lf1 > lf0).any():
                    return False
                edge_src = np.repeat(
                    np.arange(s_lo, s_hi), np.diff(np.asarray(g0.lsucc_ptr[s_lo : s_hi + 1]))
                )
                segs = np.concatenate([segs, edge_src[lf1 != lf0]])
            if any(marks[int(x)] for x in np.unique(segs)):
                return False
        return True


def _preds(g: Graph) -> Preds:
    """The graph's edges by destination (:func:`skewlens.replay.lower.csr` of the reversed edges), each kind
    apart; numpy arrays, since the walk reads only the few segments on its paths."""
    n = len(g.length)
    empty = np.zeros(0, dtype=np.int64)

    def rev(
        ptr: Sequence[int] | None, idx: Sequence[int] | None
    ) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.integer], npt.NDArray[np.intp] | None]:
        """(offsets, sources, the edges' order by destination); no order where there are no edges."""
        if ptr is None or idx is None or not len(idx):  # no edges of this kind: offsets all 0, not stored
            return np.broadcast_to(np.zeros(1, dtype=np.int32), (n + 1,)), empty, None
        # in the lowering's own integer widths (4 bytes where the run fits, see lower._indices), offsets
        # too: the four kinds' offsets are held together, 8 MiB each instead of 16 on 2 M segments
        dst = np.asarray(idx)
        fwd = np.asarray(ptr)
        order = np.argsort(dst, kind="stable")  # the edges by destination, each's in edge order (lower.csr)
        rptr = np.zeros(n + 1, dtype=fwd.dtype)
        np.cumsum(np.bincount(dst, minlength=n), out=rptr[1:])
        src = np.repeat(np.arange(n, dtype=dst.dtype), np.diff(fwd))[order]
        return rptr, src, order

    ptr, idx, _ = rev(g.succ_ptr, g.succ_idx)
    wptr, widx, _ = rev(g.wsucc_ptr, g.wsucc_idx)
    xptr, xidx, _ = rev(g.xsucc_ptr, g.xsucc_idx)
    lptr, lidx, lorder = rev(g.lsucc_ptr, g.lsucc_idx)
    has_off = lorder is not None and g.lsucc_off is not None
    loff = np.asarray(g.lsucc_off, dtype=np.int64)[lorder] if has_off else empty
    # a flag a launch edge, in a byte (as the graph holds them), not 8: 7 MiB less at the what-ifs' peak
    # on 1 M launch edges (the 32-rank GPU run's)
    if g.lsucc_at_arrival is not None and lorder is not None:
        lat_arrival = np.frombuffer(bytes(g.lsucc_at_arrival), dtype=np.uint8)[lorder]
    else:
        lat_arrival = np.zeros(len(loff), dtype=np.uint8)
    return Preds(
        ptr=ptr,
        idx=idx,
        wptr=wptr,
        widx=widx,
        xptr=xptr,
        xidx=xidx,
        lptr=lptr,
        lidx=lidx,
        loff=loff,
        lat_arrival=lat_arrival,
    )


def _step_targets(low: Lowered, res: SimResult) -> list[int] | None:
    """The segments :func:`binding_segments` walks back from: each step's latest-ending row's, the steps as
    ``step_times_from_spans`` reads :meth:`SimResult.step_spans` (without step marks: the latest row of
    the run); None where the first step's (or the run's) earliest start could move earlier under a
    what-if that shortens: when it is later than the earliest ``ready0`` of any segment, or some gap or
    offset is negative."""
    g = low.graph
    spans = res._cached_spans()  # read only: no copy per what-if
    stepped = {k: v for k, v in spans.items() if k[1] >= 0}
    used = stepped or spans  # without step marks, every rank is one span, step -1: the makespan
    if not used:
        return None
    last: dict[int, tuple[int, int]] = {}  # step -> (latest end, its rank)
    for (r, s), (_a, b) in used.items():
        if s not in last or b > last[s][0]:
            last[s] = (b, r)
    first = min(s for _r, s in used)
    first_start = min(a for (_r, s), (a, _b) in used.items() if s == first)
    timed_all = low.kind != KIND_FIXED
    if (
        min(g.gap, default=0) < 0
        or int(low.off_start[timed_all].min(initial=0)) < 0
        or int(low.nested_off_ns.min(initial=0)) < 0
    ):
        return None
    timed_seg = np.zeros(len(g.length), dtype=np.bool_)  # segments with a timed row
    for i in range(len(low.ranks)):  # rank by rank: no whole-run column of segment ids
        lo, hi = int(low.row_offset[i]), int(low.row_offset[i + 1])
        timed_seg[low.seg_of_row[lo:hi][timed_all[lo:hi]]] = True
    earliest = min(itertools.compress(g.ready0, timed_seg.tobytes()), default=None)
    if earliest is not None and first_start > earliest:
        return None
    rows = []
    for s, (b, r) in last.items():
        i = low.ranks.index(r)
        in_step = res.timed[r] & (res.step[r] == s) if stepped else res.timed[r]
        rows.append(int(low.row_offset[i]) + int(np.flatnonzero(in_step & (res.end_ns[r] == b))[0]))
    return low.anchor_segments(np.asarray(rows, dtype=np.int64)).tolist()


def _replay(run_trace: RunTrace, low: Lowered, comm_mode: str) -> SimResult:
    """Run the core on ``low`` and map its segment times back to trace rows."""
    return _lift_outcome(run_trace, low, _run_core(run_trace, low), comm_mode)


def _run_core(run_trace: RunTrace, low: Lowered) -> Outcome:
    """The core's times of ``low``: a deadlock, or a time beyond the simulator's clock (the core's int64
    arrays overflow past 2**63 ns, and the outputs' sums past :data:`MAX_SIM_NS`), is a one-line error."""
    try:
        out = run(low.graph)
    except DeadlockError as e:
        raise ReplayError(_deadlock_message(run_trace, low, e)) from None
    except OverflowError:
        out = None
    if out is None or (len(out.seg_end) and int(np.max(out.seg_end)) > MAX_SIM_NS):
        raise ConfigError(
            f"slowdown: the replayed times run beyond {SIM_CLOCK}: the slowdown's factors / delays "
            "(slowdown.*) are out of any real range"
        )
    return out


def _lift_outcome(run_trace: RunTrace, low: Lowered, out: Outcome, comm_mode: str) -> SimResult:
    return _lift(
        run_trace,
        low=low,
        seg_start=out.seg_start,
        seg_end=out.seg_end,
        waited=out.waited,
        garr=out.group_arrival,
        gend=out.group_end,
        comm_mode=comm_mode,
    )


def _lift(
    rt: RunTrace,
    *,
    low: Lowered,
    seg_start: Sequence[int],
    seg_end: Sequence[int],
    waited: Mapping[int, int],
    garr: list[int],
    gend: list[int],
    comm_mode: str,
) -> SimResult:
    ss = np.asarray(seg_start, dtype=np.int64)
    se = np.asarray(seg_end, dtype=np.int64)
    start = ss[low.seg_of_row]
    start += low.off_start  # in place: a whole run's rows, 8 bytes each
    end = start + low.dur
    sync = low.kind == KIND_SYNC
    end[sync] = se[low.seg_of_row[sync]]
    if low.waits.any():  # a wait node starts when it arrived and ends after its work
        w = np.flatnonzero(low.waits)
        segs = low.seg_of_row[w]
        start[w] = [waited.get(sg, a) for sg, a in zip(segs.tolist(), ss[segs].tolist(), strict=True)]
    nested = low.nested
    if nested.size:  # nested nodes start their offset into their enclosing node (scaled with its work)
        start[nested] = start[low.nested_parent] + low.nested_off_ns
        end[nested] = start[nested] + low.dur[nested]
    # A result's arrays are read-only, as its cached step spans and the run assume: its steps are the run's
    # own (a view, not a copy), and `res.step[0][:] = 5` changed the loaded run and every other result of it
    starts: dict[int, I64] = {}
    ends: dict[int, I64] = {}
    steps: dict[int, npt.NDArray[np.int32]] = {}
    timed: dict[int, npt.NDArray[np.bool_]] = {}
    for i, r in enumerate(low.ranks):
        lo, hi = int(low.row_offset[i]), int(low.row_offset[i + 1])
        starts[r] = _read_only(start[lo:hi])
        ends[r] = _read_only(end[lo:hi])
        steps[r] = _read_only(rt.ranks[r].step.view())
        timed[r] = _read_only(low.kind[lo:hi] != KIND_FIXED)
    ca = np.zeros(len(rt.collectives), dtype=np.int64)
    ce = np.zeros(len(rt.collectives), dtype=np.int64)
    pa = np.zeros(len(rt.p2p), dtype=np.int64)
    pe = np.zeros(len(rt.p2p), dtype=np.int64)
    for gi, info in enumerate(low.syncs):
        if info.is_p2p:
            pa[info.index], pe[info.index] = garr[gi], gend[gi]
        else:
            ca[info.index], ce[info.index] = garr[gi], gend[gi]
    return SimResult(
        start_ns=starts,
        end_ns=ends,
        step=steps,
        timed=timed,
        coll_arrival_ns=_read_only(ca),
        coll_end_ns=_read_only(ce),
        p2p_arrival_ns=_read_only(pa),
        p2p_end_ns=_read_only(pe),
        comm_mode=comm_mode,
        origin_ns=low.start_ns,
        steps_start_ns=low.steps_start_ns,
    )


def _read_only(a: _A) -> _A:
    """``a``, no longer writable (the flag is the view's own: its base stays as it was)."""
    a.flags.writeable = False
    return a


def _where(rt: RunTrace, low: Lowered, row: int) -> str:
    i = int(rank_index(low.row_offset, np.asarray([row]))[0])
    r = low.ranks[i]
    local = row - int(low.row_offset[i])
    t = rt.ranks[r]
    return f"rank {r} node {int(t.node_id[local])} ({t.name(local)})"


def _member(rt: RunTrace, low: Lowered, gi: int, j: int) -> str:
    """``rank 0 node 3 (c10d::recv_: from rank 1, group '0', tag 0)`` for member ``j`` of group ``gi``."""
    info = low.syncs[gi]
    row = low.sync_rows[gi][j]
    where = _where(rt, low, row)
    if info.is_p2p:
        p = rt.p2p[info.index]
        side = f"to rank {p.dst_rank}" if j == 0 else f"from rank {p.src_rank}"
        kind = "send" if j == 0 else "recv"
        return f"{where}: {kind} {side}, group {p.pg_name!r}, tag {p.tag}"
    c = rt.collectives[info.index]
    return f"{where}: {c.comm_type.name.lower()}, group {c.pg_name!r} seq {c.seq}"


def _deadlock_message(rt: RunTrace, low: Lowered, e: DeadlockError) -> str:
    """What blocks what: each blocked sync group's arrived member and the member it waits for."""
    if e.waiting:
        stuck = set(e.stuck)
        parts = []
        for gi in e.waiting[:4]:
            segs = low.graph.groups[gi]
            here = [j for j, sg in enumerate(segs) if sg not in stuck]
            away = [j for j, sg in enumerate(segs) if sg in stuck]
            if not here or not away:
                continue
            parts.append(f"{_member(rt, low, gi, here[0])} waits for {_member(rt, low, gi, away[0])}")
        if parts:
            return f"{rt.run_dir}: the recorded order deadlocks (each waits for the other): " + "; ".join(
                parts
            )
        info = low.syncs[e.waiting[0]]
        if info.is_p2p:
            p = rt.p2p[info.index]
            what = f"send/recv rank {p.src_rank} -> rank {p.dst_rank} (tag {p.tag})"
        else:
            c = rt.collectives[info.index]
            what = f"collective group {c.pg_name!r} seq {c.seq} ({c.comm_type.name})"
        return f"{rt.run_dir}: simulated replay deadlocked: {what} never saw all its members arrive"
    heads = np.flatnonzero(np.isin(low.seg_of_row, e.stuck[:1]))
    where = _where(rt, low, int(heads[0])) if heads.size else "unknown node"
    return f"{rt.run_dir}: simulated replay cannot finish: dependency cycle through {where}"


def find_deadlock(run_trace: RunTrace) -> str | None:
    """Why the recorded order of ``run_trace`` cannot complete (ranks, groups, tags, node ids), or None.

    Replays the execution model as recorded: a run that really completed replays (its eager sends did not
    wait for their receivers); one where, say, two ranks each block in a recv before the send the other
    waits for does not.
    """
    low = lower(run_trace, effects=NO_EFFECTS, timing=AsRecorded())
    try:
        run(low.graph)
    except DeadlockError as e:
        return _deadlock_message(run_trace, low, e)
    return None


def validate_replayable(
    path: str | Path, *, progress: Progress | None = NO_PROGRESS, decoder: Decoder = "auto"
) -> ValidationReport:
    """``validate_run`` plus what only the execution model can tell: whether the recorded order can
    complete at all (:func:`find_deadlock`; an error of kind ``deadlock``). What ``skewlens check`` runs,
    decoding every file (``decoder="vectorised"``: not the column cache, which only knows the bytes it was
    written from by the file's size, time and ends)."""
    report = validate_run(path, progress=progress, decoder=decoder)
    if report.ok and report.run is not None:
        why = find_deadlock(report.run)
        if why is not None:
            report.issues.append(Issue(severity=Severity.ERROR, kind="deadlock", message=why))
        clocks = clock_note(report.run)
        if clocks is not None:
            report.issues.append(Issue(severity=Severity.WARNING, kind="clocks", message=f"{path}: {clocks}"))
    return report
