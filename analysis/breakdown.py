"""Step breakdown: where each rank's time went in each step.

Per rank, the compute intervals of all streams/threads are merged into one union ``C`` (so nested host
ops and concurrent GPU streams are not double counted); likewise communication ``M`` and its
wait-for-peers part ``W`` (``[arrival, last arrival)`` of each communication node: the skew table's
per-member wait, ``W ⊆ M``). A wait node (``wait_tensor``, ``Work.wait``) is communication (in ``M``)
while blocked: waiting for peers where that lies in the awaited member's ``[arrival, last arrival)``
(already in ``W``), transfer after the last member arrived; its own overhead after the completion is
transfer-like too (a ``host_work`` node's work after it, compute). A host op blocked on the GPU (a
synchronise, a blocking copy: see ``skewlens.replay.execution``) is in neither union by itself: that time
is the GPU's, communication where an NCCL kernel runs, compute where kernels do, idle where the GPU idles
too. An NCCL kernel the importer kept as COMP (no collective to match it to) is in ``M``, not ``C``.
Within a step ``[a, b)``::

    compute             = |C|
    overlapped comm     = |M ∩ C|       = |M| + |C| - |M ∪ C|
    exposed comm        = |M \\ C|       = |M ∪ C| - |C|
      of which waiting  = |W \\ C|       = |W ∪ C| - |C|
      of which transfer = exposed comm - waiting
    idle                = (b - a) - |M ∪ C|

so ``compute + exposed wait + exposed transfer + idle = step length``. Every measure is a difference
of "covered time up to t" of a merged union (:class:`~skewlens.analysis.index.Coverage`), vectorised over
steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from skewlens.analysis.index import RunIndex
from skewlens.analysis.records import StepBreakdownRecord
from skewlens.profiler.store.issues import ms_text
from skewlens.profiler.vocab import names_compile_work
from skewlens.replay.execution import Coverage, exposed_parts

#: The columns of :attr:`RankMeans.mean_ns`, each a mean per step.
MEAN_PARTS = (
    "step",
    "compute",
    "exposed wait",
    "exposed transfer",
    "overlapped",
    "idle",
    "gpu compute",
    "gpu comm",
    "gpu comm overlap",
    "gpu busy",
)
_WAIT = MEAN_PARTS.index("exposed wait")


def analyze_breakdown(ix: RunIndex) -> list[StepBreakdownRecord]:
    """One record per (rank, step) with a recorded step span, ordered by rank then step."""
    out: list[StepBreakdownRecord] = []
    windows = ix.rank_windows()
    # complete: recorded by every rank of the world (a rank with no trace, a crashed one the manifest lists
    # among missing_ranks, recorded none) and with its communication matched
    recorded = [set(windows[r][0]) if r in windows else set() for r in range(ix.run.world_size)]
    whole = set.intersection(*recorded) - set(ix.run.incomplete_steps) if recorded else set()
    for r, ri in sorted(ix.ranks.items()):
        if r not in windows:
            continue
        keys, a, b = windows[r]
        # C, M and M ∪ C are the index's cov_comp, cov_comm and cov_all; W ∪ C is its cov_wait_comp; the
        # parts are the execution model's rule (the replay's summary takes its own from it)
        comp, union_mc, wait, transfer = exposed_parts(ri.cov_comp, ri.cov_all, ri.cov_wait_comp, a, b)
        overlapped = ri.cov_comm.between(a, b) + comp - union_mc
        idle = (b - a) - union_mc
        gpu_comp = ri.cov_gpu_comp.between(a, b)
        # communication on the GPU, and the part of it under compute kernels (HTA's overlap)
        rt = ri.trace
        gc = np.flatnonzero(~rt.is_cpu & (ri.is_comm | ri.is_comm_comp))
        cov_gc = Coverage.of(rt.start_ns[gc].astype(np.int64), ri.end_ns[gc])
        gpu_comm = cov_gc.between(a, b)
        both = Coverage.of(
            np.concatenate([cov_gc.starts, ri.cov_gpu_comp.starts]),
            np.concatenate([cov_gc.ends, ri.cov_gpu_comp.ends]),
        ).between(a, b)
        gpu_overlap = gpu_comm + gpu_comp - both
        gpu_busy = ri.cov_gpu_busy.between(a, b)  # any op of any stream: the GPU is idle the rest
        for k, s in enumerate(keys):
            out.append(
                StepBreakdownRecord(
                    rank=r,
                    step=s,
                    start_ns=int(a[k]),
                    end_ns=int(b[k]),
                    step_ns=int(b[k] - a[k]),
                    compute_ns=int(comp[k]),
                    exposed_wait_ns=int(wait[k]),
                    exposed_transfer_ns=int(transfer[k]),
                    overlapped_comm_ns=int(overlapped[k]),
                    gpu_compute_ns=int(gpu_comp[k]),
                    idle_ns=int(idle[k]),
                    gpu_comm_ns=int(gpu_comm[k]),
                    gpu_comm_overlap_ns=int(gpu_overlap[k]),
                    gpu_busy_ns=int(gpu_busy[k]),
                    complete=s in whole,
                )
            )
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RankMeans:
    """Each rank's mean step breakdown, one row per rank in rank order."""

    ranks: list[int]
    """Global ranks, ascending."""
    steps: list[int]
    """Recorded steps of each rank."""
    mean_ns: np.ndarray
    """Shape ``(len(ranks), len(MEAN_PARTS))``: mean ns per step of each part."""

    def least_waiting(self, max_ranks: int) -> tuple[RankMeans, RankMeans]:
        """``(shown, rest)``: of more than ``max_ranks`` ranks (0: no limit), the ``max_ranks`` that waited
        least for their peers (mean exposed wait per step: the late arrivals, where stragglers are), in
        rank order, and the others; otherwise every rank and an empty rest."""
        n = len(self.ranks)
        if not 0 < max_ranks < n:
            return self, self._take(np.zeros(0, dtype=np.int64))
        by_wait = np.lexsort((np.asarray(self.ranks), self.mean_ns[:, _WAIT]))
        shown = np.sort(by_wait[:max_ranks])
        return self._take(shown), self._take(np.sort(by_wait[max_ranks:]))

    def _take(self, rows: np.ndarray) -> RankMeans:
        return RankMeans(
            ranks=[self.ranks[i] for i in rows.tolist()],
            steps=[self.steps[i] for i in rows.tolist()],
            mean_ns=self.mean_ns[rows].reshape(rows.size, len(MEAN_PARTS)),
        )


#: A step longer than this many times its rank's median step is named beside the means (warm-up, a hiccup).
OUTLIER_FACTOR = 1.5

#: The first profiled steps (by step number) where warm-up shows: allocator, autotuning, communicator set-up.
WARM_UP_STEPS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class OutlierStep:
    """A step far longer than the median step on the ranks that recorded it (see :func:`outlier_steps`)."""

    step: int
    ranks: int
    """On how many ranks it is an outlier."""
    worst_rank: int
    worst_step_ns: int
    """The step's length on the rank where it is longest against that rank's median."""
    median_step_ns: int
    """That rank's median step."""
    step_calls: int = 0
    """The communication calls (collectives, p2p) that rank made in the step (0 where not known)."""
    median_step_calls: int = 0
    """The median of that rank's steps' calls (0 where not known)."""
    step_bytes: int = 0
    """The bytes those calls moved."""
    median_step_bytes: int = 0
    """The median of that rank's steps' bytes."""
    waited_ns: int = 0
    """That rank's exposed wait for its peers in the step."""
    compiled: bool = False
    """torch.compile compiled in the step on that rank (it holds a node of compile-time work:
    :func:`~skewlens.profiler.vocab.names_compile_work`)."""

    def _more(self) -> list[str]:
        parts = []
        if self.median_step_calls > 0 and self.step_calls > OUTLIER_FACTOR * self.median_step_calls:
            parts.append(f"{self.step_calls / self.median_step_calls:.1f}x the collectives")
        if self.median_step_bytes > 0 and self.step_bytes > OUTLIER_FACTOR * self.median_step_bytes:
            parts.append(f"{self.step_bytes / self.median_step_bytes:.1f}x the bytes")
        return parts

    @property
    def waited(self) -> bool:
        """Half or more of its excess over the median step was that rank's exposed wait for its peers: a
        step held up by a late rank, such as Local SGD's model average after K local steps, not more work."""
        return self.waited_ns > 0 and 2 * self.waited_ns >= self.worst_step_ns - self.median_step_ns

    @property
    def more_work(self) -> bool:
        """It made over :data:`OUTLIER_FACTOR` times its rank's median step's communication calls or moved
        over that times its bytes: a step of other work (a prefill among decode steps, a longer request), not
        a slow one; nor one that was mostly a wait for its peers (:attr:`waited`): before, 2 gloo ranks of
        Local SGD, whose average every 4th step (2x the median step's calls and bytes) waited 127.6 ms of
        140.2 for the slow rank, read 'more work, such as an evaluation pass'."""
        return bool(self._more()) and not self.waited

    def describe(self) -> str:
        ratio = self.worst_step_ns / self.median_step_ns
        where = (
            f"on {self.ranks:,} ranks, e.g. rank {self.worst_rank}"
            if self.ranks > 1
            else f"rank {self.worst_rank}"
        )
        more = self._more()
        work = f"; {' and '.join(more)} of the median step" if more else ""
        if self.waited:
            work += f"; {ms_text(self.waited_ns)} ms of it waiting for its peers"
        compiled = "; torch.compile compiled in it" if self.compiled else ""
        return (
            f"step {self.step} took {ratio:.1f}x the median step ({where}: {ms_text(self.worst_step_ns)} "
            f"against {ms_text(self.median_step_ns)} ms{work}{compiled})"
        )


def step_comm(ix: RunIndex) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, step) -> the rank's communication nodes (collectives, p2p) in that step and their bytes."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for r, ri in ix.ranks.items():
        rt = ri.trace
        rows = np.flatnonzero(ri.is_comm & (rt.step >= 0))
        steps, inv, calls = np.unique(rt.step[rows], return_inverse=True, return_counts=True)
        sums = np.zeros(steps.size, dtype=np.int64)
        np.add.at(sums, inv, rt.comm_bytes[rows])
        out.update(
            ((r, s), (c, b)) for s, c, b in zip(steps.tolist(), calls.tolist(), sums.tolist(), strict=True)
        )
    return out


def steps_compiled(ix: RunIndex) -> set[tuple[int, int]]:
    """The (rank, step) pairs in which torch.compile compiled: the rank has a node of the step that is
    compile-time work (:func:`~skewlens.profiler.vocab.names_compile_work`: a first compile, a recompile)."""
    out: set[tuple[int, int]] = set()
    for r, ri in ix.ranks.items():
        rt = ri.trace
        marked = np.fromiter(
            (names_compile_work(n) for n in rt.names),
            dtype=bool,
            count=len(rt.names),
        )
        if marked.any():
            steps = np.unique(rt.step[marked[rt.name_idx] & (rt.step >= 0)])
            out.update((r, int(s)) for s in steps.tolist())
    return out


def _rank_medians(values: np.ndarray, inv: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each row's rank's median of ``values`` (integer; ``inv`` the rows' rank positions, ``counts`` the rows
    per rank)."""
    order = np.lexsort((values, inv))  # by rank, then value: each rank's median from its sorted run
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ordered = values[order]
    median = (ordered[first + (counts - 1) // 2] + ordered[first + counts // 2]) // 2
    return np.asarray(median[inv])


def outlier_steps(
    records: Sequence[StepBreakdownRecord],
    *,
    factor: float = OUTLIER_FACTOR,
    step_work: Mapping[tuple[int, int], tuple[int, int]] | None = None,
    compiled: Set[tuple[int, int]] = frozenset(),
) -> list[OutlierStep]:
    """Steps longer than ``factor`` times their rank's median step, on ranks of at least 3 steps, one per step
    (in step order), with the rank where it is the longest against its median. The first profiled step often
    is one (warm-up: allocator, autotuning, communicator set-up): the per-rank means include it, so the
    report names it rather than leave a mean that no step is near unexplained. With ``step_work``
    (:func:`step_comm`) each also has its communication calls and bytes and its rank's median step's, which
    tell a step of more work (a prefill among decode steps, a longer request) from a slow one; with
    ``compiled`` (:func:`steps_compiled`), those in which its worst rank compiled say so."""
    if not records:
        return []
    rank = np.fromiter((b.rank for b in records), dtype=np.int64, count=len(records))
    step = np.fromiter((b.step for b in records), dtype=np.int64, count=len(records))
    length = np.fromiter((b.step_ns for b in records), dtype=np.int64, count=len(records))
    waited = np.fromiter((b.exposed_wait_ns for b in records), dtype=np.int64, count=len(records))
    known = step_work or {}
    work = np.array([known.get((b.rank, b.step), (0, 0)) for b in records], dtype=np.int64).reshape(-1, 2)
    calls, moved = work[:, 0], work[:, 1]
    _ranks, inv, counts = np.unique(rank, return_inverse=True, return_counts=True)
    med = _rank_medians(length, inv, counts)
    med_calls = _rank_medians(calls, inv, counts)
    med_moved = _rank_medians(moved, inv, counts)
    out_rows = np.flatnonzero((counts[inv] >= 3) & (med > 0) & (length > factor * med))
    found: list[OutlierStep] = []
    for s in np.unique(step[out_rows]).tolist():
        rows = out_rows[step[out_rows] == s]
        worst = int(rows[np.argmax(length[rows] / med[rows])])
        found.append(
            OutlierStep(
                step=s,
                ranks=int(np.unique(rank[rows]).size),
                worst_rank=int(rank[worst]),
                worst_step_ns=int(length[worst]),
                median_step_ns=int(med[worst]),
                step_calls=int(calls[worst]),
                median_step_calls=int(med_calls[worst]),
                step_bytes=int(moved[worst]),
                median_step_bytes=int(med_moved[worst]),
                waited_ns=int(waited[worst]),
                compiled=(int(rank[worst]), s) in compiled,
            )
        )
    return found


def rank_means(records: Sequence[StepBreakdownRecord]) -> RankMeans:
    """Each rank's mean of its steps' breakdown (sums in integer ns, then one division per rank)."""
    vals = np.array(
        [
            (
                b.rank,
                b.step_ns,
                b.compute_ns,
                b.exposed_wait_ns,
                b.exposed_transfer_ns,
                b.overlapped_comm_ns,
                b.idle_ns,
                b.gpu_compute_ns,
                b.gpu_comm_ns,
                b.gpu_comm_overlap_ns,
                b.gpu_busy_ns,
            )
            for b in records
        ],
        dtype=np.int64,
    ).reshape(len(records), 1 + len(MEAN_PARTS))
    ranks, inv, counts = np.unique(vals[:, 0], return_inverse=True, return_counts=True)
    sums = np.zeros((ranks.size, len(MEAN_PARTS)), dtype=np.int64)
    np.add.at(sums, inv, vals[:, 1:])
    return RankMeans(ranks=ranks.tolist(), steps=counts.tolist(), mean_ns=sums / counts[:, None])
