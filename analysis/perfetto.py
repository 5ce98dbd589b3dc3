"""Chrome / Perfetto trace JSON of a run with its critical path marked.

One process per rank (``pid`` = rank), one track per stream/thread, plus a ``critical path`` track per
rank holding copies of the path's nodes, and flow arrows (``ph: s/f``) wherever the path jumps from one
rank to another (to a collective's last arriver or a late send). Times are µs floats at this edge,
relative to the run's first node (``otherData.t0_ns`` keeps the origin). Written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from skewlens.analysis.api import AnalysisResult
from skewlens.analysis.critical_path import KIND_NAMES
from skewlens.profiler.atomic import write_json_atomic

PERFETTO_FILE = "trace_critical_path.json"
#: Beyond this many nodes in the run only communication nodes and the critical path are written.
MAX_NODES = 400_000
_CP_TID = 0


def trace_events(result: AnalysisResult, *, max_nodes: int = MAX_NODES) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` + ``otherData``)."""
    ix = result.index
    t0 = min((int(ri.sorted_start[0]) for ri in ix.ranks.values() if ri.sorted_start.size), default=0)
    total = sum(len(ri.trace) for ri in ix.ranks.values())
    comm_only = total > max_nodes
    ev: list[dict[str, Any]] = []
    tids: dict[int, dict[int, int]] = {}
    for r, ri in sorted(ix.ranks.items()):
        rt = ri.trace
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        ev.append(
            {"ph": "M", "name": "thread_name", "pid": r, "tid": _CP_TID, "args": {"name": "critical path"}}
        )
        streams = np.unique(rt.stream).tolist()
        tids[r] = {int(s): i + 1 for i, s in enumerate(streams)}
        for s, tid in tids[r].items():
            label = rt.streams.get(s, f"stream {s}")
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": label}})
        keep = ri.is_comm if comm_only else (ri.is_comp | ri.is_comm | ri.is_untraced | ri.is_wait)
        for i in np.flatnonzero(keep).tolist():
            args: dict[str, Any] = {"node_id": int(rt.node_id[i]), "step": int(rt.step[i])}
            if ri.is_comm[i]:
                args["wait_ms"] = int(ri.wait_ns[i]) / 1e6
                args["bytes"] = int(rt.comm_bytes[i])
            ev.append(
                {
                    "ph": "X",
                    "name": rt.name(i),
                    "cat": KIND_NAMES.get(int(rt.node_type[i]), "other"),
                    "pid": r,
                    "tid": tids[r][int(rt.stream[i])],
                    "ts": (int(rt.start_ns[i]) - t0) / 1e3,
                    "dur": int(rt.dur_ns[i]) / 1e3,
                    "args": args,
                }
            )
    flow = 0
    prev = None
    for rec in result.critical_path:
        ev.append(
            {
                "ph": "X",
                "name": rec.name,
                "cat": "critical_path",
                "pid": rec.rank,
                "tid": _CP_TID,
                "ts": (rec.end_ns - rec.contribution_ns - t0) / 1e3,
                "dur": rec.contribution_ns / 1e3,
                "args": {"step": rec.step, "position": rec.position, "node_id": rec.node_id, "via": rec.via},
            }
        )
        if prev is not None and prev.step == rec.step and prev.rank != rec.rank:
            flow += 1
            common = {"name": "critical path", "cat": "critical_path", "id": flow, "tid": _CP_TID}
            ev.append({**common, "ph": "s", "pid": rec.rank, "ts": (rec.start_ns - t0) / 1e3})
            ev.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": prev.rank,
                    "ts": (prev.end_ns - prev.contribution_ns - t0) / 1e3,
                }
            )
        prev = rec
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {"t0_ns": t0, "run_dir": ix.run.run_dir, "comm_only": comm_only},
    }


def write_perfetto(result: AnalysisResult, path: str | Path, *, max_nodes: int = MAX_NODES) -> Path:
    """Write the trace JSON atomically."""
    p = Path(path)
    data = trace_events(result, max_nodes=max_nodes)
    return write_json_atomic(p, data, separators=(",", ":"))
