"""GPU kernels by time: per rank, each GPU op name's count and summed duration (HTA's kernel breakdown).

Each GPU op of a rank (``RankTrace.is_cpu`` false, the execution model's valid rows) is one of three kinds:
``communication`` (a collective or p2p op on the device, an NCCL kernel:
:func:`~skewlens.replay.execution.comm_rows`), ``memory`` (a copy or memset:
:func:`~skewlens.profiler.vocab.names_gpu_memory_op`) or ``compute`` (the rest). Durations are summed, not
united: two kernels running at once on two streams count twice, as HTA counts them (the union is the
breakdown's ``gpu_compute_ns`` and the GPU idle table's ``busy_ns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skewlens.analysis.index import RunIndex
from skewlens.analysis.records import GpuKernelRecord
from skewlens.profiler.vocab import names_gpu_memory_op
from skewlens.replay.execution import comm_rows, execution_model

#: The kinds of GPU op, in the order the report lists them.
KINDS = ("compute", "communication", "memory")


def analyze_gpu_kernels(ix: RunIndex) -> list[GpuKernelRecord]:
    """One record per (rank, GPU op name) over the rank's recorded steps, by rank then the most time
    first."""
    em = execution_model(ix.run)
    windows = ix.rank_windows()
    out: list[GpuKernelRecord] = []
    for r, ri in sorted(ix.ranks.items()):
        rt = ri.trace
        steps = windows[r][0] if r in windows else []
        # the ops of the rank's recorded steps (all of a run without step marks: step -1)
        gpu = ~rt.is_cpu & em.ranks[r].valid & np.isin(rt.step, steps)
        if not gpu.any():
            continue
        comm = comm_rows(rt)
        memory = np.array([names_gpu_memory_op(n) for n in rt.names], dtype=np.bool_)[rt.name_idx]
        kind = np.where(comm, 1, np.where(memory, 2, 0))
        rows = np.flatnonzero(gpu)
        n_names = max(len(rt.names), 1)
        key = kind[rows].astype(np.int64) * n_names + rt.name_idx[rows]
        uniq, inv, count = np.unique(key, return_inverse=True, return_counts=True)
        total = np.bincount(inv, weights=rt.dur_ns[rows].astype(np.float64), minlength=uniq.size)
        for k in np.argsort(-total, kind="stable").tolist():
            out.append(
                GpuKernelRecord(
                    rank=r,
                    name=rt.names[int(uniq[k] % n_names)],
                    kind=KINDS[int(uniq[k] // n_names)],
                    kernels=int(count[k]),
                    total_ns=int(total[k]),
                    steps=len(steps),
                )
            )
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelTotals:
    """One GPU op name over the ranks that ran it (the report's row)."""

    name: str
    kind: str
    ranks: int
    """Ranks that ran it."""
    per_step_ns: float
    """Its time a step on such a rank (mean over them)."""
    kernels_per_step: float
    """How many of it a step on such a rank."""
    share: float
    """Its part of all GPU ops' summed time, over every rank."""


def top_kernels(records: Sequence[GpuKernelRecord], top: int) -> list[KernelTotals]:
    """The ``top`` GPU op names by summed time over all ranks."""
    acc: dict[tuple[str, str], list[float]] = {}
    for g in records:
        per_step = max(g.steps, 1)
        a = acc.setdefault((g.name, g.kind), [0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += g.total_ns / per_step
        a[2] += g.kernels / per_step
        a[3] += g.total_ns
    everything = sum(a[3] for a in acc.values()) or 1.0
    ranked = sorted(acc.items(), key=lambda kv: (-kv[1][3], kv[0]))[:top]
    return [
        KernelTotals(name=n, kind=k, ranks=int(a[0]), per_step_ns=a[1] / a[0], kernels_per_step=a[2] / a[0],
                     share=a[3] / everything)
        for (n, k), a in ranked
    ]  # fmt: skip
