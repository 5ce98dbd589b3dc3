"""Per-rank arrays every analysis needs, computed once per run with numpy (no per-node Python objects).

:class:`RunIndex` holds, for each rank, row-aligned columns derived from the store's
:class:`~skewlens.profiler.store.model.RankTrace`:

- ``wait_ns``: at a communication node, the time this rank waited for its peers. Timing contract of
  COMM nodes: start = this rank's arrival, end = completion on this rank. For a collective member
  ``m``: ``wait_m = awaited_m - arrival_m``, ``awaited_m`` the arrival the execution model says it waits
  for (``max(arrivals)``; a rooted collective's root, or its own: ``replay.execution.waits_for``); for one
  side of a send/recv pair:
  ``max(0, peer arrival - my arrival)``. Clamped to the node's duration; 0 for a send the model detaches
  from its pair (eager: it completed before its receiver arrived), which waits for no one.
- ``gap_ns``: host gap before each node, the execution model's (``skewlens.replay.execution``: ``start -
  max(end of its start edges)`` clamped at 0), 0 for a node without start edges.
- ``work_ns``: each node's own work, the execution model's: its duration, less the time a wait node
  (``wait_tensor``, ``Work.wait``) spent blocked on communication. Wait nodes count as communication,
  none of it as compute (but a host row blocked on the GPU is no communication by itself: the GPU's rows
  say what that time was): their blocked time is waiting for peers only where it lies in the awaited
  member's ``[arrival, last arrival)`` (that member's ``wait_ns``), the rest of it transfer, and their own
  overhead transfer-like; except a host-time node that hid a wait (``host_work``: the ``collectives``
  level's ``compute`` node after DDP's last bucket), whose work after the completion is the program's
  compute.
- ``coll`` / ``p2p``: the collective instance (index into ``run.collectives``) or send/recv pair (index
  into ``run.p2p``) of a communication row, -1 elsewhere.
- ``gname``: node name as an index into the run-wide ``RunIndex.names`` (rank dictionaries differ).

It also provides :class:`Coverage`, the union of a set of intervals with an O(log n) "covered time up
to t" function, which the breakdown uses for interval union and intersection across streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from skewlens.analysis.errors import AnalysisError
from skewlens.profiler.store.model import RankTrace, RunTrace, seal_arrays, type_mask
from skewlens.profiler.vocab import COMM_NODE_TYPES, NodeType
from skewlens.replay.execution import (
    Coverage,
    RankModel,
    awaited_arrivals,
    busy_intervals,
    comm_intervals,
    comp_kinds,
    compute_intervals,
    eager_send_rows,
    execution_model,
    gpu_busy,
    gpu_compute_rows,
    latest_deps,
    model_ends,
)

I64 = npt.NDArray[np.int64]
#: Row numbers and small ids (a rank has fewer than 2**31 rows): half the memory of int64 at 10 M nodes.
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]


@dataclass(eq=False, kw_only=True, slots=True)
class RankIndex:
    """Derived per-rank columns (row-aligned with the rank's RankTrace unless named ``sorted_*``)."""

    rank: int
    """Global rank."""
    trace: RankTrace
    """The rank's trace."""
    end_ns: I64
    """``start_ns + dur_ns``."""
    gname: I32
    """Run-wide name id of each row."""
    is_comp: B
    """COMP rows that are real work (not the capture's untraced host time, not wait nodes, not NCCL kernels
    kept as COMP: ``is_comm_comp``)."""
    is_comm_comp: B
    """NCCL kernels the importer kept as COMP (``skewlens.replay.execution.nccl_kernel_rows``: its launch
    was outside the trace, and the name does not say the collective): communication that matches no peer,
    never compute (not in the skew's or the blame's compute, not scaled by a what-if)."""
    is_wait: B
    """Wait nodes (``wait_tensor``, ``Work.wait``): blocked on communication, then the wait's own overhead;
    counted as communication, never as compute (but see ``host_work``); waiting for peers only inside the
    awaited member's own wait (``cov_wait_comp``)."""
    host_work: B
    """Wait nodes that are host-time nodes which hid a wait (the execution model's ``host_work``): their
    work after the completion (``work_ns``, the end of the node) is the program's, counted as compute."""
    host_work_rows: I64
    """The ``host_work`` rows, in the order their work begins (``host_work_at_ns``)."""
    host_work_at_ns: I64
    """When each of ``host_work_rows``' work begins (its end less its work), ascending."""
    is_untraced: B
    """COMP rows standing for untraced host time (``skewlens.replay.execution.UNTRACED_NAMES``): idle, not
    compute."""
    is_comm: B
    """COMM_COLL / COMM_SEND / COMM_RECV rows."""
    is_send: B
    """COMM_SEND rows."""
    wait_ns: I64
    """Wait for peers at communication rows (0 elsewhere)."""
    gap_ns: I64
    """Host gap before the row (the execution model's; >= 0; 0 without start edges)."""
    has_deps: B
    """Rows with at least one start edge in the execution model."""
    work_ns: I64
    """Own work of each row (the execution model's): its duration, less a wait node's blocked time."""
    coll: I32
    """Index into ``run.collectives`` for collective rows, else -1."""
    p2p: I32
    """Index into ``run.p2p`` for send/recv rows, else -1."""
    order: I32
    """Rows sorted by start (stable)."""
    sorted_start: I64
    """``start_ns[order]``."""
    comm_sorted_end: I64
    """Ends of the communication rows, ascending."""
    comm_end_rows: I32
    """The communication rows in that order."""
    cov_all: Coverage
    """Union of all compute and communication intervals of the rank (any stream; untraced time excluded)."""
    cov_comp: Coverage
    """Union of the compute intervals of the rank (any stream): ``[end - work, end)`` of COMP rows."""
    cov_gpu_comp: Coverage
    """Union of the GPU's compute kernels (``skewlens.replay.execution.gpu_compute_rows``: not NCCL
    kernels, copies or memsets), empty on a CPU rank: HTA's compute time."""
    cov_gpu_busy: Coverage
    """Union of every GPU op on every stream (``skewlens.replay.execution.gpu_busy``: kernels, NCCL kernels,
    copies, memsets), empty on a CPU rank: the GPU's busy time, the complement of HTA's temporal idle."""
    cov_comm: Coverage
    """Union of the communication intervals: comm rows and wait nodes."""
    cov_wait_comp: Coverage
    """Union of compute intervals and the wait-for-peers part ``[start, start + wait)`` of comm rows (the
    skew table's per-member wait: ``[arrival, last arrival)``). A wait node adds nothing of its own: its
    blocked time waits for peers only inside the awaited member's wait, already here; after the last
    arrival it waits for the transfer."""
    latest_dep: I32
    """Per row: of what it waits for in the execution model, the row met latest; -1 for none."""
    latest_met_ns: I64
    """Per row: when ``latest_dep`` was met (its end, or for a launch the launch call's start)."""
    arrival_dep: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Of the host rows that launched GPU work before they waited (``RankModel.launch_at_arrival``:
    ``.item()`` launches the copy it then waits for), each one's ``latest_dep`` and ``latest_met_ns`` of its
    arrival (wait edges left out): what held it up to those launches."""
    part_waits: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Of those, the rows that launched between two of their waits (``RankModel.part_wait_src``:
    ``aten::index`` waits for one copy, launches the next, waits for it): the waits the model meets such a
    launch after, as ``(row, end_ns)`` by end. What held a launch after such a wait ended is that wait."""


@dataclass(eq=False, kw_only=True, slots=True)
class RunIndex:
    """The run plus its per-rank derived arrays and run-wide name dictionary."""

    run: RunTrace
    """The run."""
    ranks: dict[int, RankIndex]
    """Per-rank index."""
    names: list[str]
    """Run-wide name dictionary (``RankIndex.gname`` indexes it)."""
    gpu_names: B
    """Per name of :attr:`names`: whether a row of it ran on a GPU stream on some rank (``RankTrace.is_cpu``
    false: a kernel, a copy, a memset), GPU work whatever it is called (``sm90_xmma_gemm_...``,
    ``cutlass::...``, ``void at::native::...``): a kernel's names differ from one GPU model to the next."""
    step_spans: dict[tuple[int, int], tuple[int, int]]
    """(rank, step) -> (start_ns, end_ns) of each recorded step (step -1: a rank without step marks)."""

    @property
    def steps(self) -> list[int]:
        return sorted({s for _r, s in self.step_spans})

    def rank_windows(self) -> dict[int, tuple[list[int], I64, I64]]:
        """Per rank with recorded steps: its steps in order, and their spans' starts and ends (the windows
        the per-step analyses measure in); one pass over :attr:`step_spans`, not one per rank."""
        steps_of: dict[int, list[int]] = {}
        for r, s in self.step_spans:
            steps_of.setdefault(r, []).append(s)
        out = {}
        for r, steps in steps_of.items():
            keys = sorted(steps)
            a = np.array([self.step_spans[(r, s)][0] for s in keys], dtype=np.int64)
            b = np.array([self.step_spans[(r, s)][1] for s in keys], dtype=np.int64)
            out[r] = (keys, a, b)
        return out


def _gap_ns(m: RankModel) -> tuple[I64, B]:
    """Host gap before each row and whether it has start edges, from the execution model: the model's own
    column where it is 0 on every row without start edges already (it is on the runs the importers write),
    not a copy of it: 8 bytes a row of the run, 15 MiB of the 32-rank GPU run's ``skewlens analyze``."""
    has = m.has_start_deps & m.valid
    if not m.gap_ns[~has].any():
        return m.gap_ns, has
    return np.where(has, m.gap_ns, 0).astype(np.int64), has


def _step_spans(run: RunTrace) -> dict[tuple[int, int], tuple[int, int]]:
    spans: dict[tuple[int, int], tuple[int, int]] = {}
    for s in run.manifest.steps:
        if s.rank in run.ranks and s.end_ns > s.start_ns:
            spans[(s.rank, s.step)] = (s.start_ns, s.end_ns)
    have = {r for r, _s in spans}
    for r, rt in run.ranks.items():
        if r in have:
            continue
        busy = rt.node_type != int(NodeType.METADATA)
        keep = (rt.step >= 0) & busy
        if not keep.any():
            if busy.any():  # no step marks at all: the whole trace is one step, numbered -1
                spans[(r, -1)] = (int(rt.start_ns[busy].min()), int(rt.end_ns[busy].max()))
            continue
        st = rt.step[keep].astype(np.int64)
        uniq, inv = np.unique(st, return_inverse=True)
        lo = np.full(uniq.size, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(uniq.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(lo, inv, rt.start_ns[keep])
        np.maximum.at(hi, inv, rt.end_ns[keep])
        for k, s in enumerate(uniq.tolist()):
            spans[(r, int(s))] = (int(lo[k]), int(hi[k]))
    return spans


def build_index(run: RunTrace) -> RunIndex:
    """Derive every per-rank array the analyses share. Raises AnalysisError on an empty run."""
    if not run.ranks:
        raise AnalysisError(f"{run.run_dir}: the run has no rank traces")
    names: list[str] = []
    name_id: dict[str, int] = {}
    idx: dict[int, RankIndex] = {}
    em = execution_model(run)
    for r, rt in sorted(run.ranks.items()):
        lut = np.empty(len(rt.names), dtype=np.int32)
        for k, nm in enumerate(rt.names):
            g = name_id.get(nm)
            if g is None:
                g = name_id[nm] = len(names)
                names.append(nm)
            lut[k] = g
        m = em.ranks[r]
        end = model_ends(run, r)  # recorded, but a hidden wait's lagged completion at the wait's end
        gap, has = _gap_ns(m)
        # the model's own work where its invalid rows keep their durations (they do unless a wait ends
        # in one), not a copy of it: 8 bytes a row of the run
        bad = ~m.valid
        same = np.array_equal(m.work_ns[bad], rt.dur_ns[bad])
        work = m.work_ns if same else np.where(m.valid, m.work_ns, rt.dur_ns).astype(np.int64)
        order = np.argsort(rt.start_ns, kind="stable").astype(np.int32)  # rows of a rank: < 2**31
        # rows already in start order (the importers write them so): their starts are the sorted ones, not
        # a copy of them (8 bytes a row; 15 MiB of the 32-rank GPU run's analyze)
        in_order = bool((rt.start_ns[1:] >= rt.start_ns[:-1]).all())
        is_comm = type_mask(rt.node_type, COMM_NODE_TYPES)
        comm_rows = np.flatnonzero(is_comm).astype(np.int32)
        comm_end_rows = comm_rows[np.argsort(end[comm_rows], kind="stable")]
        kinds = comp_kinds(rt, m)
        # a host-time node's own work after the wait it hid is compute (host_work)
        hw = np.flatnonzero(m.host_work)
        hw_at = end[hw] - work[hw]
        by_at = np.argsort(hw_at, kind="stable")
        latest, latest_met = latest_deps(m, end - m.dur_ns, end)
        arrival_dep: dict[int, tuple[int, int]] = {}
        own = np.unique(m.launch_src[m.launch_at_arrival])
        if own.size:
            a_dep, a_met = latest_deps(m, end - m.dur_ns, end, waits=False)
            held = zip(own.tolist(), a_dep[own].tolist(), a_met[own].tolist(), strict=True)
            arrival_dep = {w: (d, t) for w, d, t in held}
        part_waits: dict[int, tuple[tuple[int, int], ...]] = {}
        if m.part_wait_src.size:
            host, src = m.launch_src[m.part_wait_edge], m.part_wait_src
            pairs = sorted({(h, int(end[s]), s) for h, s in zip(host.tolist(), src.tolist(), strict=True)})
            for h, t, s in pairs:
                part_waits[h] = (*part_waits.get(h, ()), (s, t))
        gpu_comp = gpu_compute_rows(rt, m)
        idx[r] = RankIndex(
            rank=r,
            trace=rt,
            end_ns=end,
            gname=lut[rt.name_idx] if len(rt) else np.zeros(0, dtype=np.int32),
            is_comp=kinds.work,
            is_comm_comp=kinds.comm,
            is_wait=kinds.wait,
            host_work=m.host_work,
            host_work_rows=hw[by_at],
            host_work_at_ns=hw_at[by_at],
            is_untraced=kinds.untraced,
            is_comm=is_comm,
            is_send=rt.node_type == int(NodeType.COMM_SEND),
            wait_ns=np.zeros(len(rt), dtype=np.int64),
            gap_ns=gap,
            has_deps=has,
            work_ns=work,
            coll=np.full(len(rt), -1, dtype=np.int32),
            p2p=np.full(len(rt), -1, dtype=np.int32),
            order=order,
            sorted_start=rt.start_ns if in_order else rt.start_ns[order],
            comm_sorted_end=end[comm_end_rows],
            comm_end_rows=comm_end_rows,
            # M ∪ C, C and M: the execution model's rules (the replay's summary measures with the same)
            cov_all=Coverage.of(*busy_intervals(rt, m, rt.start_ns, end)),
            cov_comp=Coverage.of(*compute_intervals(rt, m, rt.start_ns, end)),
            cov_gpu_comp=Coverage.of(rt.start_ns[gpu_comp], end[gpu_comp]),
            cov_gpu_busy=gpu_busy(rt, m, rt.start_ns, end),
            cov_comm=Coverage.of(*comm_intervals(rt, m, rt.start_ns, end)),
            latest_dep=latest,
            latest_met_ns=latest_met,
            arrival_dep=arrival_dep,
            part_waits=part_waits,
            cov_wait_comp=Coverage.EMPTY,  # needs every rank's arrivals: set once the waits are known
        )
    for k, c in enumerate(run.collectives):
        arr = [int(run.ranks[r].start_ns[row]) for r, row in zip(c.ranks, c.rows, strict=True)]
        # the arrival each member waits for: the last, or a rooted collective's root (the model's rule)
        awaited = awaited_arrivals(em.rule(k, len(c.ranks)), arr)
        for r, row, a, t in zip(c.ranks, c.rows, arr, awaited, strict=True):
            ri = idx[r]
            ri.coll[row] = k
            ri.wait_ns[row] = min(t - a, int(ri.trace.dur_ns[row]))
    for k, p in enumerate(run.p2p):
        s_start = int(run.ranks[p.src_rank].start_ns[p.src_row])
        d_start = int(run.ranks[p.dst_rank].start_ns[p.dst_row])
        si, di = idx[p.src_rank], idx[p.dst_rank]
        si.p2p[p.src_row] = k
        di.p2p[p.dst_row] = k
        si.wait_ns[p.src_row] = min(max(d_start - s_start, 0), int(si.trace.dur_ns[p.src_row]))
        di.wait_ns[p.dst_row] = min(max(s_start - d_start, 0), int(di.trace.dur_ns[p.dst_row]))
    for r, eager in eager_send_rows(run).items():  # an eager send waited for no one (the model's rule)
        idx[r].wait_ns[eager] = 0
    for ri in idx.values():
        st, comm = ri.trace.start_ns, ri.is_comm
        # W ∪ C: the compute (cov_comp's intervals) and each member's wait for peers [arrival, last
        # arrival). A wait node blocked on a communication waits for peers only inside the awaited member's
        # [arrival, last arrival), which that member's row already puts in W; the rest of its blocked time
        # (after the last arrival: the transfer) is in M only, so it counts as transfer.
        c_start, c_end = ri.cov_comp.starts, ri.cov_comp.ends
        ri.cov_wait_comp = Coverage.of(
            np.concatenate([c_start, st[comm]]),
            np.concatenate([c_end, st[comm] + ri.wait_ns[comm]]),
        )
        _seal(ri)
    gpu_names = np.zeros(len(names), dtype=bool)
    for ri in idx.values():
        gpu_names[ri.gname[~ri.trace.is_cpu]] = True
    seal_arrays([gpu_names])
    return RunIndex(run=run, ranks=idx, names=names, gpu_names=gpu_names, step_spans=_step_spans(run))


def _seal(ri: RankIndex) -> None:
    """Make the index's arrays read-only once built, as the execution model's and the run's are: every
    analysis of the run reads the same index, so a write into one would change the others' answers."""
    seal_arrays(getattr(ri, name) for name in ri.__slots__)


def rows_starting_in(ri: RankIndex, a: int, b: int) -> I32:
    """Rows whose start lies in ``[a, b)``, in start order."""
    lo, hi = np.searchsorted(ri.sorted_start, [a, b], side="left")
    return ri.order[lo:hi]


def last_comm_end_before(ri: RankIndex, t: int) -> tuple[int, int] | None:
    """End and row of the latest communication row that completed at or before ``t`` on this rank."""
    i = int(np.searchsorted(ri.comm_sorted_end, t, side="right")) - 1
    return (int(ri.comm_sorted_end[i]), int(ri.comm_end_rows[i])) if i >= 0 else None
