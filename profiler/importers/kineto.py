"""Kineto (torch.profiler Chrome-JSON) traces: the typed subset of events the importer uses.

Only complete events (``ph == "X"``) of these categories are kept: ``cpu_op`` (host operators),
``user_annotation`` (``ProfilerStep#N``, ``nccl:*`` ...), ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``
(GPU activities), ``cuda_runtime`` / ``cuda_driver`` (launches, event records and synchronisations, by
their ``correlation``) and ``cuda_sync`` (synchronisation activities, where the profiler recorded them).
Flow events (``ac2g``) carry the same correlation ids as the launch/kernel ``args``; the importer reads
the ids from ``args`` and does not need the flows.

Keys read, HTA style (raw key, where, type, since): an absent optional key gives the default; a present
key of the wrong type makes the file corrupt.

=============================  ============================  ======  ========================================
raw key                        where                         type    since / default
=============================  ============================  ======  ========================================
``traceEvents``                top level                     list    always (required)
``schemaVersion``              top level                     int     always; only 1 exists (others refused)
``distributedInfo.rank``       top level                     int     torch 1.13 (required unless --rank)
``distributedInfo.world_size`` top level                     int     torch 1.13 (default: max rank + 1)
``distributedInfo.backend``    top level                     str     torch 1.13 (default '')
``distributedInfo.pg_config``  top level                     list    torch 2.3 (default: one world group)
``baseTimeNanoseconds``        top level                     int     torch 2.1 (default 0: ts is absolute)
``ts`` / ``dur``               event                         µs      always (float in newer files)
``args.stream``                kernel/memcpy/memset          int     always (default: the event's tid)
``args.device``                kernel/memcpy/memset          int     always (default 0)
``args.correlation``           kernel/runtime/cuda_sync      int     always
``args["Collective name"]``    kernel, record_param_comms    str     torch 2.3 (else from names)
``args["In msg nelems"]``      kernel, record_param_comms    int     torch 2.3
``args["Out msg nelems"]``     kernel, record_param_comms    int     torch 2.3
``args.dtype``                 kernel, record_param_comms    str     torch 2.3 (``Float``, ``BFloat16``...)
``args["Process Group Name"]`` kernel, record_param_comms    str     torch 2.3 (default ``"0"``)
``args["Process Group Ranks"]`` kernel, record_param_comms   str     torch 2.3 (JSON list of global ranks)
``args.Seq`` / ``args.seq``    kernel, record_param_comms    int     newer torch (default: counted)
``args["Record function id"]`` cpu_op                        int     torch 2.1 (joins host-trace rf_id)
``args["Input Dims"]``         ``nccl:*`` annotation         list    torch 1.13 (with record_shapes)
``args["Input type"]``         ``nccl:*`` annotation         list    torch 1.13 (with record_shapes)
=============================  ============================  ======  ========================================

``cuda_sync`` events also carry ``args.stream``, ``args.wait_on_stream`` and
``args.wait_on_cuda_event_record_corr_id`` (the ``cudaEventRecord`` waited for); -1 where not applicable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.manifest import ProcessGroupInfo

SUPPORTED_KINETO_SCHEMAS = frozenset({1})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: CUDA synchronisation activities (``enable_cuda_sync_events``): Stream Wait Event, Stream/Event/Context Sync.
SYNC_CATEGORY = "cuda_sync"
_KEPT = frozenset({"cpu_op", "user_annotation", SYNC_CATEGORY}) | GPU_CATEGORIES | LAUNCH_CATEGORIES
#: Bound on times (ns): keeps every value inside Chakra's int64 fields.
_MAX_NS = 2**62


@dataclass(frozen=True, kw_only=True, slots=True)
class KEvent:
    """One complete Kineto event, times converted to integer ns on the trace's clock."""

    index: int
    """Position in ``traceEvents`` (for error messages and stable ordering)."""
    name: str
    """Event name."""
    cat: str
    """Kineto category."""
    pid: int
    """Process id (CPU events) or device index (GPU events)."""
    tid: int
    """Thread id (CPU events) or stream (GPU events)."""
    start_ns: int
    """Start, ns (``baseTimeNanoseconds`` + ``ts`` x 1000)."""
    dur_ns: int
    """Duration, ns."""
    args: dict[str, Any]
    """The event's ``args`` where the conversion reads them (else empty)."""
    rf_id: int | None = None
    """``args["Record function id"]`` of a ``cpu_op`` (newer Kineto; the host trace's ``rf_id``)."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(frozen=True, kw_only=True, slots=True)
class KinetoTrace:
    """The parts of one rank's Kineto trace the importer converts."""

    path: Path
    """File it was read from."""
    rank: int
    """Global rank."""
    world_size: int | None
    """World size from ``distributedInfo`` (None where absent)."""
    backend: str
    """Default backend (``nccl``), '' where unknown."""
    pg_config: tuple[ProcessGroupInfo, ...]
    """Process groups listed in ``distributedInfo.pg_config`` (empty where absent)."""
    base_ns: int
    """``baseTimeNanoseconds`` (0 where absent)."""
    cpu_ops: list[KEvent] = field(default_factory=list)
    """``cpu_op`` events."""
    annotations: list[KEvent] = field(default_factory=list)
    """``user_annotation`` events (CPU side)."""
    gpu: list[KEvent] = field(default_factory=list)
    """Kernels, memcpys and memsets."""
    launches: dict[int, KEvent] = field(default_factory=dict)
    """Runtime/driver calls (launches, event records, synchronisations) by correlation id."""
    syncs: list[KEvent] = field(default_factory=list)
    """``cuda_sync`` activities (recorded with ``enable_cuda_sync_events``; empty otherwise)."""
    cpu_pids: set[int] = field(default_factory=set)
    """Process ids of the ``cpu_op`` events (pairs the trace with its host trace)."""


def _keeps_args(cat: str, name: str) -> bool:
    """Only events whose args the conversion reads keep them (saves memory on large traces)."""
    return cat not in ("cpu_op", "user_annotation") or name == "record_param_comms" or ":" in name


def _rf_id(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _pg_config(raw: Any, path: Path) -> tuple[ProcessGroupInfo, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TraceImportError(f"{path}: distributedInfo.pg_config is not a list")
    out = []
    for g in raw:
        if not isinstance(g, dict) or "pg_name" not in g or not isinstance(g.get("ranks"), list):
            raise TraceImportError(f"{path}: malformed distributedInfo.pg_config entry {g!r:.200}")
        out.append(
            ProcessGroupInfo(
                name=str(g["pg_name"]),
                ranks=tuple(int(r) for r in g["ranks"]),
                desc=str(g.get("pg_desc", "")),
                backend=str(g.get("backend_config", "")),
            )
        )
    return tuple(out)


def parse_kineto(doc: Any, path: Path, *, rank: int | None = None) -> KinetoTrace:
    """Validate a parsed Kineto document and keep its typed events; ``rank`` overrides distributedInfo."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceImportError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    version = doc.get("schemaVersion", 1)
    if version not in SUPPORTED_KINETO_SCHEMAS:
        raise TraceImportError(f"{path}: Kineto schemaVersion {version!r} is not supported (supported: 1)")
    dist = doc.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    r = dist.get("rank") if rank is None else rank
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise TraceImportError(
            f"{path}: no distributedInfo.rank in the trace (give the rank with --rank for a single file)"
        )
    ws = dist.get("world_size")
    if ws is not None and (not isinstance(ws, int) or ws <= r):
        raise TraceImportError(f"{path}: distributedInfo.world_size {ws!r} does not cover rank {r}")
    base = doc.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool):
        raise TraceImportError(f"{path}: baseTimeNanoseconds is not an integer")
    trace = KinetoTrace(
        path=path,
        rank=r,
        world_size=ws,
        backend=str(dist.get("backend", "")),
        pg_config=_pg_config(dist.get("pg_config"), path),
        base_ns=base,
    )
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in _KEPT:
            continue
        ts, dur, name, pid, tid = ev.get("ts"), ev.get("dur", 0), ev.get("name"), ev.get("pid"), ev.get("tid")
        args = ev.get("args", {})
        if not (_num(ts) and _num(dur) and isinstance(name, str) and isinstance(args, dict)):
            raise TraceImportError(f"{path}: traceEvents[{i}] ({ev.get('cat')}) has a malformed ts/dur/name")
        if (
            not isinstance(pid, int)
            or not isinstance(tid, int)
            or not (abs(pid) < _MAX_NS and abs(tid) < _MAX_NS)
        ):
            raise TraceImportError(
                f"{path}: traceEvents[{i}] ({name[:60]}) has a non-integer or out-of-range pid/tid"
            )
        start_ns = base + round(ts * 1000)
        if not -_MAX_NS < start_ns < _MAX_NS or not dur < _MAX_NS / 1000:
            raise TraceImportError(f"{path}: traceEvents[{i}] ({name[:60]}) has ts/dur out of range")
        e = KEvent(
            index=i,
            name=name,
            cat=ev["cat"],
            pid=pid,
            tid=tid,
            start_ns=start_ns,
            dur_ns=max(round(dur * 1000), 0),
            args=args if _keeps_args(ev["cat"], name) else {},
            rf_id=_rf_id(args.get("Record function id")),
        )
        if e.cat == "cpu_op":
            trace.cpu_ops.append(e)
            trace.cpu_pids.add(pid)
        elif e.cat == "user_annotation":
            trace.annotations.append(e)
        elif e.cat in GPU_CATEGORIES:
            trace.gpu.append(e)
        elif e.cat == SYNC_CATEGORY:
            trace.syncs.append(e)
        else:
            corr = args.get("correlation")
            if isinstance(corr, int):
                trace.launches[corr] = e
    return trace
