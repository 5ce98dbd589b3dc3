"""What-if blame: how much faster the recorded steps would be had rank ``r`` run like the median rank.

Corresponding work across ranks: each rank's nodes are cut into *intervals* at its communication nodes,
per step, and an interval is named by the communication node that ends it: (step, its signature = node
type, collective type and group size, its occurrence among the step's nodes of that signature). So the
work before "the 1st all_gather of a 2-rank group in step 5" corresponds across ranks even when the
groups differ (tensor-parallel pairs), and the work before a send is compared with other senders', not
with receivers'. Nodes after a step's last communication form the step's tail interval. A rank with a
different structure simply has keys the others lack (medians use the ranks that have the key).

For every interval, apart for its host rows and its GPU rows (a slower GPU is not a slower host: one
ratio over both, of a rank whose kernels took 1.6 times its peers', scaled its kernels by less than
1/1.6 and its host operators too, and charged it 81% of the time it cost a synthetic run with 40-80 µs
kernels), the compute total (sum of COMP work, the execution model's: a wait node's blocked
time is not compute) and the host-gap total (the rank's untraced host time, the rows a ``host_idle``
slowdown scales, ``skewlens.replay.execution.host_idle_rows``: the execution model's gap ``start - latest
dependency end`` before each host row after the rows it follows, plus the capture's untraced-time nodes'
work: of one that hid a wait, only its part after the completion, as the simulator times it; not a GPU op's
gap, the GPU's idle time, which its launches set; in the rank's first interval, also how much later than
the run's first start it began) are compared with the lower median
over the ranks that have that interval. The what-if for rank ``r`` scales ``r``'s compute work in each
interval by ``median / own`` where that is below 1 (only where ``r`` is slower than the median: a rank is
not charged for being faster somewhere) and its gaps likewise (the simulator's own gaps,
``skewlens.replay.lower.recorded_gaps``), via ``simulate(dur_override=..., gap_override=...)``.
``straggler_cost = baseline - what-if`` of the simulated step times (see
:func:`skewlens.replay.simulate.step_times_from_spans`: completion of a step minus completion of the
previous one), per step and in total. Ranked.

Ranks whose compute and gaps nowhere exceed the median's are not simulated (their cost is 0 by
construction of "run like the median": they are not slower than it anywhere); ``max_simulations`` bounds
the number of what-ifs simulated (largest excess first) for very large runs. A what-if that shortens
nothing on the baseline's binding paths to the steps' ends changes no step (``Simulator.steps_unchanged``
proves it): its step times are the baseline's, exactly, without simulating it, and it does not count
against ``max_simulations`` (``prove=False`` simulates every one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skewlens.analysis.index import I32, I64, B, RankIndex, RunIndex
from skewlens.analysis.records import BlameRecord, BlameStepRecord, CauseKind, HostBlameRecord
from skewlens.analysis.skew import NO_CAUSE, SHOWN_NS, Cause, SkewResult
from skewlens.profiler.threads import release_free_memory
from skewlens.progress import NO_PROGRESS, Progress, given
from skewlens.replay.execution import execution_model, host_idle_rows, replay_gaps, start_heads

_OCC_MAX = (1 << 12) - 1
#: The bit of an interval key (above the occurrence, below the signature) that marks its GPU rows.
_GPU_BIT = 1 << 12
_SIZE_MAX = (1 << 12) - 1

SimulateFn = Callable[..., Any]


@dataclass(eq=False, kw_only=True, slots=True)
class BlameResult:
    """Blame table (ranked), per-step costs and the simulated step times behind them."""

    records: list[BlameRecord]
    """One per rank, largest straggler cost first; of equal costs, the most wait caused first."""
    step_records: list[BlameStepRecord]
    """One per (simulated rank, step)."""
    baseline_step_ns: dict[int, int]
    """Simulated step time of the recorded run, per step."""
    whatif_step_ns: dict[int, dict[int, int]] = field(default_factory=dict)
    """Rank -> step -> simulated step time had that rank run like the median rank."""
    uncompared_ns: dict[int, int] = field(default_factory=dict)
    """Rank -> its compute and host gaps (whole run) in intervals no other rank has, which the what-if
    keeps as they are: a rank that alone sends (the first stage of a 2-stage pipeline, a slow sender of
    2 ranks) cannot be blamed for that work however slow it is."""
    host_records: list[HostBlameRecord] = field(default_factory=list)
    """One per host of a run whose ranks name two hosts or more, one of them with several ranks (none
    otherwise: a host of one rank costs what the rank does), largest cost first: the
    what-if of all of a host's ranks at once."""

    def top_straggler_by_step(self) -> dict[int, int]:
        """Step -> rank with the largest positive straggler cost in that step."""
        best: dict[int, tuple[int, int]] = {}
        for rec in self.step_records:
            c = rec.straggler_cost_ns
            if c > 0 and (rec.step not in best or c > best[rec.step][0]):
                best[rec.step] = (c, rec.rank)
        return {s: r for s, (_c, r) in sorted(best.items())}


@dataclass(eq=False, kw_only=True, slots=True)
class _Intervals:
    slot: I32  # per row: its interval's index in ``keys``, -1 for rows outside any interval (METADATA)
    keys: I64  # distinct keys, ascending
    comp: I64  # per distinct key: compute total
    gap: I64  # per distinct key: gap total
    late_ns: int  # how much later than the run's first start the rank began (in its first row's key's gap)
    first_row: int  # the rank's first row (-1: none)
    heads: B | None  # of a rank with late_ns: its rows whose replayed gap holds it (execution.start_heads)


def _intervals(
    ri: RankIndex,
    sig_of: dict[int, int],
    size_of_row: I64,
    gaps: I64,
    idle: tuple[B, B],
    *,
    late_ns: int,
    heads: B | None,
) -> _Intervals:
    """Interval of each row, keyed (step, signature of the next communication node, its occurrence, whether
    the row is GPU work: a rank's host and GPU work in an interval are compared apart)."""
    rt = ri.trace
    o = ri.order
    n = len(rt)
    st_sorted = rt.step[o].astype(np.int64)
    comm_pos = np.flatnonzero(ri.is_comm[o])
    comm_rows = o[comm_pos]
    raw = (
        (rt.node_type[comm_rows].astype(np.int64) << 24)
        | ((rt.comm_type[comm_rows].astype(np.int64) + 1) << 12)
        | size_of_row[comm_rows]
    )
    # signatures numbered in order of first appearance (run-wide: ranks in order, rows by start)
    distinct, first = np.unique(raw, return_index=True)
    for v in distinct[np.argsort(first, kind="stable")].tolist():
        sig_of.setdefault(v, len(sig_of) + 1)
    sig = np.array([sig_of[v] for v in distinct.tolist()], dtype=np.int64)[np.searchsorted(distinct, raw)]
    step = st_sorted[comm_pos]
    # occurrence of each communication node among the step's earlier ones of its signature
    group = ((step + 1) << 32) | sig
    by_group = np.argsort(group, kind="stable")
    g_sorted = group[by_group]
    new = np.append(True, g_sorted[1:] != g_sorted[:-1]) if g_sorted.size else np.zeros(0, np.bool_)
    first_of = np.maximum.accumulate(np.where(new, np.arange(g_sorted.size), 0)) if g_sorted.size else new
    occ = np.empty(g_sorted.size, dtype=np.int64)
    occ[by_group] = np.arange(g_sorted.size) - first_of
    comm_key = np.empty(comm_pos.size + 1, dtype=np.int64)
    comm_key[:-1] = ((step + 1) << 32) | (sig << 13) | np.minimum(occ, _OCC_MAX)
    comm_key[-1] = -1
    nxt = np.searchsorted(comm_pos, np.arange(n), side="left")
    k_sorted = comm_key[nxt]
    nxt_step = np.append(step, -2)[nxt]
    tail = nxt_step != st_sorted  # no later communication in this step: the step's tail interval
    k_sorted = np.where(tail, (st_sorted + 1) << 32, k_sorted)
    key = np.empty(n, dtype=np.int64)
    key[o] = k_sorted
    key |= np.where(rt.is_cpu, 0, _GPU_BIT)
    valid = ri.is_comp | ri.is_comm | ri.is_comm_comp | ri.is_untraced | ri.is_wait
    key[~valid] = -1
    keys, inv = np.unique(key[valid], return_inverse=True)
    vrows = np.flatnonzero(valid)
    comp_w = np.where((ri.is_comp | ri.host_work)[vrows], ri.work_ns[vrows], 0).astype(np.float64)
    # host gaps: the rank's untraced host time (execution.host_idle_rows, what a host_idle slowdown scales)
    idle_gap, idle_work = idle
    gap_w = np.where(idle_gap[vrows], gaps[vrows], 0) + np.where(idle_work[vrows], ri.work_ns[vrows], 0)
    gap_w = gap_w.astype(np.float64)
    comp = np.bincount(inv, weights=comp_w, minlength=keys.size).astype(np.int64)
    gap = np.bincount(inv, weights=gap_w, minlength=keys.size).astype(np.int64)
    # a rank that began after the run's first start was idle that long before its first row (the skew's
    # windows say so too): host idle of its first interval, which the what-if can shorten
    first = o[valid[o]]
    first_row = int(first[0]) if first.size else -1
    # each row's interval as its index in keys (what the what-if reads), not its 8-byte key: the candidates'
    # rows are held through the what-ifs, 7.6 MiB less on the 32-rank GPU run
    slot = np.full(n, -1, dtype=np.int32)
    slot[vrows] = inv
    if first_row >= 0 and late_ns > 0:
        gap[slot[first_row]] += late_ns
    return _Intervals(
        slot=slot, keys=keys, comp=comp, gap=gap, late_ns=late_ns, first_row=first_row, heads=heads
    )


def _group_sizes(ix: RunIndex) -> dict[int, I64]:
    """Per rank and row: member count of the row's collective (2 for p2p, 0 otherwise), capped."""
    out = {r: np.zeros(len(ri.trace), dtype=np.int64) for r, ri in ix.ranks.items()}
    for c in ix.run.collectives:
        for r, row in zip(c.ranks, c.rows, strict=True):
            out[r][row] = min(len(c.ranks), _SIZE_MAX)
    for p in ix.run.p2p:
        out[p.src_rank][p.src_row] = 2
        out[p.dst_rank][p.dst_row] = 2
    return out


def _all_intervals(ix: RunIndex) -> dict[int, _Intervals]:
    """:func:`_intervals` of every rank, in rank order (which numbers the signatures)."""
    sizes = _group_sizes(ix)
    sig_of: dict[int, int] = {}
    em = execution_model(ix.run)
    out = {}
    for r, ri in sorted(ix.ranks.items()):
        m = em.ranks[r]
        late = max(m.t0_ns - em.start_ns, 0)
        out[r] = _intervals(
            ri,
            sig_of,
            sizes[r],
            _simulator_gaps(ix, r),
            host_idle_rows(ri.trace, m),
            late_ns=late,
            heads=start_heads(m) if late else None,
        )
    return out


_SLOT_MASK = (1 << 32) - 1
#: Above this many ranks a rank's peers' median is taken over all ranks (the rank itself included).
_EXACT_PEERS = 32


def _typical(keys: I64, *values: I64) -> tuple[I64, list[np.ndarray]]:
    """Per slot (an interval's signature and occurrence within its step, whatever the step): the median
    over the steps of each of ``values``; returns (slots, medians of each). The medians are taken for all
    slots at once: values sorted within their slot, then the middle one (odd count) or the mean of the
    middle two, as ``np.median``."""
    slots = keys & _SLOT_MASK
    uniq, inv = np.unique(slots, return_inverse=True)
    count = np.bincount(inv, minlength=uniq.size)
    first = np.zeros(uniq.size, dtype=np.int64)
    np.cumsum(count[:-1], out=first[1:])
    lo, hi = first + (count - 1) // 2, first + count // 2
    meds = []
    for v in values:
        vals = v.astype(np.float64)[np.lexsort((v, inv))]
        meds.append((vals[lo] + vals[hi]) / 2)
    return uniq, meds


def _peer_medians(
    ivs: dict[int, _Intervals],
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank, per key: its own typical compute and gap in the key's slot (median over steps), and its
    peers' (the lower median over the other ranks that have the slot of their typical values).

    Comparing typical values, not one step's, keeps the what-if from charging a rank for the noise of
    single steps: "run like the median rank" of a rank that is as fast as its peers costs nothing on
    average, instead of the sum of every step's positive differences."""
    ranks = list(ivs)
    typ = {r: (sl, *m) for r, iv in ivs.items() for sl, m in [_typical(iv.keys, iv.comp, iv.gap)]}
    all_slots = np.unique(np.concatenate([t[0] for t in typ.values()])) if typ else np.zeros(0, np.int64)
    comp = np.full((all_slots.size, len(ranks)), np.nan)
    gap = np.full((all_slots.size, len(ranks)), np.nan)
    for j, r in enumerate(ranks):
        sl, c, g = typ[r]
        pos = np.searchsorted(all_slots, sl)
        comp[pos, j] = c
        gap[pos, j] = g
    out = {}
    everyone_c = everyone_g = None
    if len(ranks) > _EXACT_PEERS:
        everyone_c = np.nanquantile(comp, 0.5, axis=1, method="lower")
        everyone_g = np.nanquantile(gap, 0.5, axis=1, method="lower")
    for j, r in enumerate(ranks):
        if everyone_c is not None and everyone_g is not None:
            pc, pg = everyone_c, everyone_g
        else:
            others = [k for k in range(len(ranks)) if k != j]
            if not others:
                pc, pg = comp[:, j], gap[:, j]
            else:
                with np.errstate(all="ignore"):
                    oc, og = comp[:, others], gap[:, others]
                    none = np.isnan(oc).all(axis=1)
                    pc = np.where(
                        none,
                        np.nan,
                        np.nanquantile(np.where(none[:, None], 0, oc), 0.5, axis=1, method="lower"),
                    )
                    pg = np.where(
                        none,
                        np.nan,
                        np.nanquantile(np.where(none[:, None], 0, og), 0.5, axis=1, method="lower"),
                    )
        pos = np.searchsorted(all_slots, ivs[r].keys & _SLOT_MASK)
        out[r] = (comp[pos, j], gap[pos, j], pc[pos], pg[pos])
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _Scaling:
    """Per interval key of one rank: the factors that make it run like its peers' typical (<= 1)."""

    f_comp: np.ndarray
    f_gap: np.ndarray
    excess_ns: int
    """The rank's time over its peers' typical, summed over its intervals."""
    uncompared_ns: int
    """The rank's compute and gaps in intervals no peer has (none to compare them with), summed."""


def _scaling(iv: _Intervals, typical: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> _Scaling:
    """How much of each interval's compute and gaps to keep to run like the peers' typical."""
    own_c, own_g, mc, mg = typical
    alone = np.isnan(mc)
    uncompared = int(iv.comp[alone].sum() + iv.gap[alone].sum())
    # where peers lack the slot there is nothing to compare with: keep the rank's own times
    mc = np.where(np.isnan(mc), own_c, mc)
    mg = np.where(np.isnan(mg), own_g, mg)
    # only where the rank is slower than its peers: a straggler's cost is the time it adds, and slowing
    # a rank down where it happens to be faster would charge it for its peers' slowness
    f_comp = np.where(own_c > 0, np.minimum(mc / np.maximum(own_c, 1), 1.0), 1.0)
    f_gap = np.where(own_g > 0, np.minimum(mg / np.maximum(own_g, 1), 1.0), 1.0)
    excess = float((iv.comp * (1.0 - f_comp)).sum() + (iv.gap * (1.0 - f_gap)).sum())
    return _Scaling(f_comp=f_comp, f_gap=f_gap, excess_ns=int(excess), uncompared_ns=uncompared)


def _overrides(
    ri: RankIndex, iv: _Intervals, sc: _Scaling, *, gaps: I64, idle: tuple[B, B]
) -> tuple[I64, I64]:
    """dur/gap overrides making ``ri`` run like its peers' typical (built only for the ranks simulated:
    two arrays as long as the rank's trace); ``idle``: the rank's untraced host time
    (``execution.host_idle_rows``), the gaps and work the what-if scales as its peers' host gaps."""
    rt = ri.trace
    f_comp, f_gap = sc.f_comp, sc.f_gap
    inside = iv.slot >= 0
    row_k = np.maximum(iv.slot, 0)
    dur = np.full(len(rt), -1, dtype=np.int64)
    gap = np.full(len(rt), -1, dtype=np.int64)
    if iv.keys.size:
        # override only what changes (-1 keeps the simulator's own value)
        c = inside & (ri.is_comp | ri.host_work) & (f_comp[row_k] != 1.0)
        dur[c] = np.rint(ri.work_ns[c] * f_comp[row_k[c]]).astype(np.int64)
        u = inside & idle[1] & (f_gap[row_k] != 1.0)
        dur[u] = np.rint(ri.work_ns[u] * f_gap[row_k[u]]).astype(np.int64)
        g = inside & idle[0] & (f_gap[row_k] != 1.0)
        gap[g] = np.rint(gaps[g] * f_gap[row_k[g]]).astype(np.int64)
        if iv.heads is not None and iv.first_row >= 0 and f_gap[row_k[iv.first_row]] != 1.0:
            # the rank starts earlier: every row without start edges (each counts from the run's start)
            earlier = int(np.rint(iv.late_ns * (1.0 - f_gap[row_k[iv.first_row]])))
            gap[iv.heads] = gaps[iv.heads] - earlier
    return dur, gap


def _host_idle(ix: RunIndex, rank: int) -> tuple[B, B]:
    """``rank``'s untraced host time (``execution.host_idle_rows``: the rows whose gap, and those whose work,
    is such time): the host gaps the blame compares and its what-if scales, as a ``host_idle`` slowdown
    does."""
    return host_idle_rows(ix.ranks[rank].trace, execution_model(ix.run).ranks[rank])


def _simulator_gaps(ix: RunIndex, rank: int) -> I64:
    """The host gaps the simulator replays on ``rank`` (``replay_gaps``: the execution model's, of a row
    without start edges from the run's first start), so that the scaled values passed as ``gap_override``
    mean what the simulator means. Made for one rank when it is used, not held for every rank through the
    what-ifs: a copy of the gaps of each rank that began after the run's start, 15 MiB of the 32-rank GPU
    run's ``skewlens analyze`` at its peak."""
    return replay_gaps(execution_model(ix.run), rank)


def _step_times(sim: Any) -> dict[int, int]:
    """Per-step simulated times; a run without step marks is one step, -1, of the whole makespan."""
    return sim.step_times() or {-1: int(sim.makespan_ns)}


@dataclass(frozen=True, kw_only=True, slots=True)
class _RunTotals:
    """Whole-run per-rank totals and their medians, for :func:`_fallback_cause` (computed once)."""

    comp: dict[int, np.ndarray]  # rank -> compute time per run-wide name id
    gaps: dict[int, int]  # rank -> untraced host time (execution.host_idle_rows)
    med_comp: np.ndarray
    med_gap: int


def _run_totals(ix: RunIndex) -> _RunTotals:
    tot: dict[int, np.ndarray] = {}
    n = len(ix.names)
    gaps: dict[int, int] = {}
    for r, ri in ix.ranks.items():
        c = ri.is_comp | ri.host_work
        tot[r] = np.bincount(ri.gname[c], weights=ri.work_ns[c], minlength=n)
        idle_gap, idle_work = _host_idle(ix, r)
        gaps[r] = int(ri.gap_ns[idle_gap].sum()) + int(ri.work_ns[idle_work].sum())
    return _RunTotals(
        comp=tot,
        gaps=gaps,
        med_comp=np.median(np.stack(list(tot.values())), axis=0),
        med_gap=int(np.median(list(gaps.values()))),
    )


def _fallback_cause(tot: _RunTotals, names: list[str], rank: int, steps: int = 1) -> Cause:
    """Cause from whole-run totals when the skew analysis blamed nothing on ``rank``: its excess over the
    median rank, per step (the mean over ``steps``)."""
    d = (tot.comp[rank] - tot.med_comp) / max(steps, 1)
    gap_d = (tot.gaps[rank] - tot.med_gap) // max(steps, 1)
    # an excess that would read +0.0 ms explains nothing ("Optimizer.step#SGD.step +0.0 ms")
    if d.size and d.max() > max(gap_d, 0) and d.max() >= SHOWN_NS:
        i = int(np.argmax(d))
        return Cause(kind=CauseKind.COMPUTE, delta_ns=int(d[i]), op=names[i], ops=((names[i], int(d[i])),))
    if gap_d >= SHOWN_NS:
        return Cause(kind=CauseKind.HOST_GAP, delta_ns=gap_d)
    return NO_CAUSE


def analyze_blame(
    ix: RunIndex,
    skew: SkewResult,
    *,
    simulate_fn: SimulateFn | None = None,
    ranks: Sequence[int] | None = None,
    max_simulations: int | None = None,
    progress: Progress | None = NO_PROGRESS,
    prove: bool = True,
) -> BlameResult:
    """Straggler cost of each rank from simulated what-ifs (see the module docstring)."""
    progress = given(progress)
    run = ix.run
    unchanged: Callable[..., bool] | None = None
    # the baseline's stages under one bar (on a large run, seconds each: lowering, intervals, simulation)
    with progress.task("blame baseline: lowering", 3) as advance:
        if simulate_fn is None:
            from skewlens.replay.simulate import Simulator

            # lowered once for the baseline and every what-if: each re-times only the rank it changes
            simulator = Simulator(run)
            # the lowering's temporaries are freed by now: their pages are handed back, or the simulations'
            # own state (the core's, the baseline's times, the proof's reversed edges) comes on top of them
            # (the 32-rank GPU run's analyze, in process: 964 MiB at its peak with them kept, 947 without)
            release_free_memory()

            def simulate_fn(_run: object, **overrides: Any) -> Any:
                return simulator.simulate(**overrides)

            if prove:
                unchanged = simulator.steps_unchanged
        advance(description="blame baseline: typical intervals")
        ivs = _all_intervals(ix)
        typical = _peer_medians(ivs)
        scaling = {r: _scaling(ivs[r], typical[r]) for r in ivs}
        wanted = [r for r in (ranks if ranks is not None else sorted(ivs)) if r in ivs]
        cands = sorted((r for r in wanted if scaling[r].excess_ns > 0), key=lambda r: -scaling[r].excess_ns)
        if max_simulations is not None and unchanged is None:
            cands = cands[:max_simulations]  # without proofs every candidate is a simulation
        ivs = {r: ivs[r] for r in cands}  # the others' row keys are not needed any more
        advance(description="blame baseline: simulating")
        base = _step_times(simulate_fn(run))
        advance()
    whatif: dict[int, dict[int, int]] = {}
    simulated = 0

    def what_if(slow: Sequence[int]) -> dict[int, int] | None:
        """Step -> time with the ``slow`` ranks' intervals scaled to their peers' (:func:`_overrides`): the
        baseline's where proven (off every binding path to a step's end), else simulated while
        ``max_simulations`` allows; None past it."""
        nonlocal simulated
        over = {
            r: _overrides(
                ix.ranks[r], ivs[r], scaling[r], gaps=_simulator_gaps(ix, r), idle=_host_idle(ix, r)
            )
            for r in slow
        }
        durs = {r: d for r, (d, _g) in over.items()}
        gaps = {r: g for r, (_d, g) in over.items()}
        if unchanged is not None and unchanged(dur_override=durs, gap_override=gaps):
            return dict(base)
        if max_simulations is not None and simulated >= max_simulations:
            return None
        simulated += 1
        return _step_times(simulate_fn(run, dur_override=durs, gap_override=gaps))

    with progress.task("what-if blame", len(cands)) as advance:
        for r in cands:
            if (times := what_if([r])) is not None:
                whatif[r] = times
            advance()
    hosts = _hosts(ix, wanted)
    host_whatif: dict[str, dict[int, int]] = {}
    if hosts:  # a run on one host has no host what-if (nor a bar for none)
        with progress.task("what-if blame: hosts", len(hosts)) as advance:
            for host, on in hosts.items():
                slow = [r for r in on if r in ivs]
                if len(slow) == 1 and slow[0] in whatif:  # its one slow rank's own what-if
                    host_whatif[host] = whatif[slow[0]]
                elif len(slow) > 1 and (times := what_if(slow)) is not None:
                    host_whatif[host] = times
                advance()
    cands = [r for r in cands if r in whatif]
    steps = sorted(base)
    step_recs = [
        BlameStepRecord(
            rank=r,
            step=s,
            baseline_step_ns=base[s],
            whatif_step_ns=whatif[r].get(s, base[s]),
            straggler_cost_ns=base[s] - whatif[r].get(s, base[s]),
        )
        for r in cands
        for s in steps
    ]
    result = BlameResult(
        records=[],
        step_records=step_recs,
        baseline_step_ns=base,
        whatif_step_ns=whatif,
        uncompared_ns={r: sc.uncompared_ns for r, sc in scaling.items() if sc.uncompared_ns > 0},
    )
    tops = result.top_straggler_by_step()
    base_total = sum(base.values())
    # over the steps the costs are over: a set-up collective before the first step (its waits in no step)
    # read as 50 ms of a 4-step run's caused wait, 12.5 ms a step beside costs of the steps alone, and its
    # cause came first ('setup +50.0 ms')
    caused = skew.caused_wait_in(steps)
    top_cause = skew.top_cause_in(steps)
    recs = []
    totals: _RunTotals | None = None
    for r in wanted:
        w_total = sum(whatif[r].get(s, base[s]) for s in steps) if r in whatif else base_total
        cause = top_cause.get(r)
        if cause is None and base_total - w_total <= 0:
            cause = NO_CAUSE  # nothing blamed on it, by the skew analysis or the what-if: nothing to explain
        elif cause is None:
            if totals is None:
                totals = _run_totals(ix)
            cause = _fallback_cause(totals, ix.names, r, len(steps))
        recs.append(
            BlameRecord(
                rank=r,
                straggler_cost_ns=base_total - w_total,
                baseline_ns=base_total,
                whatif_ns=w_total,
                steps_top=sum(1 for v in tops.values() if v == r),
                caused_wait_ns=caused.get(r, 0),
                cause_kind=str(cause.kind),
                cause_op=cause.op,
                cause=cause.text,
                simulated=r in whatif,
            )
        )
    # equal costs (none simulated: --max-simulations 0; or none costs anything): the rank that made the
    # others wait most first, not the lowest rank, which the report then named the top straggler
    recs.sort(key=lambda x: (-x.straggler_cost_ns, -x.caused_wait_ns, x.rank))
    result.records = recs
    host_recs = []
    for host, on in hosts.items():
        w_total = sum(host_whatif[host].get(s, base[s]) for s in steps) if host in host_whatif else base_total
        host_recs.append(
            HostBlameRecord(
                host=host,
                ranks=on,
                straggler_cost_ns=base_total - w_total,
                baseline_ns=base_total,
                whatif_ns=w_total,
                simulated=host in host_whatif,
            )
        )
    result.host_records = sorted(host_recs, key=lambda x: (-x.straggler_cost_ns, x.host))
    return result


def _hosts(ix: RunIndex, ranks: Sequence[int]) -> dict[str, list[int]]:
    """Host -> its ranks among ``ranks``, where they name two hosts or more, one of them with several ranks
    (the manifest's ``hosts``; empty otherwise: one host, none recorded, as of an imported run, or one rank
    on each host, whose what-ifs are the ranks' own)."""
    named = ix.run.manifest.hosts
    out: dict[str, list[int]] = {}
    for r in ranks:
        if host := named.get(r, ""):
            out.setdefault(host, []).append(r)
    return out if len(out) > 1 and any(len(on) > 1 for on in out.values()) else {}
