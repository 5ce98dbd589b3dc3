"""GPU idle time: per rank, step and GPU stream, how long the stream idled and what it was waiting for.

HTA's idle time breakdown tells a stream's idle stretches apart by thresholds on their length. Here each
is read from the execution model instead, which knows what every GPU op waited for (its launch, an event
on another stream, a collective): the rule is :func:`skewlens.replay.execution.gpu_idle`, which the
replay's summary applies to replayed times too. Each stretch before an op is split at the time its latest
dependency was met: before, ``launch wait`` (a host row: the host had not yet asked for the op, so the GPU
starved: Python overhead, data loading, a synchronisation that drained the queue), ``comm wait`` (a
collective, a p2p op, an NCCL kernel) or ``stream wait`` (GPU work on another stream); after it, and where
nothing was met after the stream went idle, and after the stream's last op, ``other``.

So ``launch + comm + stream + other = idle = step - busy`` per stream and step, with ``busy`` the union of
the stream's ops (kernels, copies, memsets, NCCL kernels) in the step. A CPU rank has no GPU streams and
no rows here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skewlens.analysis.index import RunIndex
from skewlens.analysis.records import GpuIdleRecord
from skewlens.replay.execution import GPU_IDLE_PARTS, compute_stream, execution_model, gpu_idle

#: The waits an idle stretch is split into, in :class:`GpuIdleRecord`'s order (the execution model's).
PARTS = GPU_IDLE_PARTS


def analyze_gpu_idle(ix: RunIndex) -> list[GpuIdleRecord]:
    """One record per (rank, step, GPU stream) for every rank with GPU ops and recorded steps, ordered by
    rank, step, stream (the execution model's rule, :func:`~skewlens.replay.execution.gpu_idle`, on the
    recorded times)."""
    em = execution_model(ix.run)
    windows = ix.rank_windows()
    out: list[GpuIdleRecord] = []
    for r, ri in sorted(ix.ranks.items()):
        if r not in windows or ri.trace.is_cpu.all():
            continue
        keys, a, b = windows[r]
        m = em.ranks[r]
        streams = gpu_idle(ri.trace, m, start=ri.end_ns - m.dur_ns, end=ri.end_ns, a=a, b=b)
        for k, s in enumerate(keys):
            for g in streams:
                out.append(
                    GpuIdleRecord(
                        rank=r,
                        step=s,
                        stream=g.stream,
                        step_ns=int(b[k] - a[k]),
                        busy_ns=int(g.busy[k]),
                        compute_ns=int(g.compute[k]),
                        idle_ns=int(b[k] - a[k] - g.busy[k]),
                        ops=int(g.ops[k]),
                        **{f"{p}_ns": int(v[k]) for p, v in zip(PARTS, g.parts, strict=True)},
                        queued_idle_ns=int(g.queued[k]),
                    )
                )
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamMeans:
    """One GPU stream of one rank over its steps: means per step, ns."""

    rank: int
    stream: int
    steps: int
    step_ns: float
    busy_ns: float
    compute_ns: float
    idle_ns: float
    parts_ns: tuple[float, ...]
    """Means of the idle parts, in :data:`PARTS`' order."""
    queued_ns: float = 0.0
    """Mean of ``queued_idle_ns`` (part of ``other``; 0 where a file did not record it)."""


def compute_streams(records: Sequence[GpuIdleRecord]) -> list[StreamMeans]:
    """Per rank, its compute stream (:func:`~skewlens.replay.execution.compute_stream`: the most compute
    kernels' time) over its steps, by rank."""
    acc: dict[tuple[int, int], list[list[int]]] = {}
    for g in records:
        acc.setdefault((g.rank, g.stream), []).append(
            [
                g.step_ns,
                g.busy_ns,
                g.compute_ns,
                g.idle_ns,
                *(getattr(g, f"{p}_ns") for p in PARTS),
                g.queued_idle_ns or 0,
            ]
        )
    by_rank: dict[int, list[StreamMeans]] = {}
    for (rank, stream), rows in sorted(acc.items()):
        m = np.asarray(rows, dtype=np.float64).mean(axis=0).tolist()
        by_rank.setdefault(rank, []).append(
            StreamMeans(
                rank=rank,
                stream=stream,
                steps=len(rows),
                step_ns=m[0],
                busy_ns=m[1],
                compute_ns=m[2],
                idle_ns=m[3],
                parts_ns=tuple(m[4:-1]),
                queued_ns=m[-1],
            )
        )
    out = []
    for _rank, streams in sorted(by_rank.items()):
        pick = compute_stream([(s.stream, s.compute_ns, s.busy_ns) for s in streams])
        out.append(next(s for s in streams if s.stream == pick))
    return out


def most_idle(streams: Sequence[StreamMeans], max_ranks: int) -> list[StreamMeans]:
    """Of more than ``max_ranks`` ranks' compute streams (0: no limit), those that idled the most; by rank."""
    shown = sorted(streams, key=lambda s: -s.idle_ns)
    if len(shown) > max_ranks > 0:
        shown = shown[:max_ranks]
    return sorted(shown, key=lambda s: s.rank)


#: How the report names what the compute streams mostly waited for (the largest part of their idle time).
_VERDICT = {
    "launch_wait": "for their hosts' launches: host-bound (Python overhead, data loading, synchronisations)",
    "comm_wait": "for communication",
    "stream_wait": "for work on other streams",
    "other": "for what the traces do not say",
}


def verdict(streams: Sequence[StreamMeans]) -> str | None:
    """One line on the compute streams of all ranks: how much of their steps they idled, and what they
    mostly waited for; None without streams or idle time."""
    step = sum(s.step_ns for s in streams)
    idle = sum(s.idle_ns for s in streams)
    if not streams or idle <= 0 or step <= 0:
        return None
    parts = [sum(s.parts_ns[k] for s in streams) for k in range(len(PARTS))]
    top = max(range(len(PARTS)), key=lambda k: parts[k])
    shares = ", ".join(
        f"{p.replace('_', ' ')} {100 * v / idle:.0f}%" for p, v in zip(PARTS, parts, strict=True)
    )
    queued = sum(s.queued_ns for s in streams)
    other = parts[PARTS.index("other")]
    unshown = (
        f"; of the other, {100 * queued / other:.0f}% their whole GPU ran nothing with the next op already "
        "launched: a wait the traces do not show"
        if queued > 0 and other > 0
        else ""
    )
    return (
        f"the compute streams idled {100 * idle / step:.0f}% of their steps, mostly waiting "
        f"{_VERDICT[PARTS[top]]}; of that idle time: {shares}{unshown}"
    )
