"""What a communication op is: merged from Kineto args, the host trace, annotations and kernel names.

Each ``_info_from_*`` reads one source into a partial dict; :func:`merge` takes, field by field, the
first source that has it (the order is the caller's: most specific first). Sizes are the bytes of this
rank's input buffer (element count x element size), Chakra's ``comm_size`` convention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from skewlens.profiler.importers.host_et import HostComm
from skewlens.profiler.importers.kineto import KEvent
from skewlens.profiler.vocab import CommType, collective_from_op, dtype_bytes

DEFAULT_PG = "0"
#: Largest magnitude accepted for an integer read from a trace (keeps Chakra's int64 fields valid).
MAX_INT = 2**62


_KERNEL_COLL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")
_KERNEL_TYPES: dict[str, CommType] = {
    "AllReduce": CommType.ALL_REDUCE,
    "AllGather": CommType.ALL_GATHER,
    "ReduceScatter": CommType.REDUCE_SCATTER,
    "Broadcast": CommType.BROADCAST,
    "Reduce": CommType.REDUCE,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class CommInfo:
    """What a communication op is, merged from whichever sources had it."""

    comm_type: CommType | None
    """Collective type (None for point-to-point / unknown)."""
    p2p: str
    """``send`` / ``recv`` for point-to-point ops, else ''."""
    op: str
    """Framework op name (``allreduce``, ``all_to_allv``, ``nccl:all_reduce``)."""
    numel: int
    """Elements of this rank's input."""
    size_bytes: int
    """Bytes of this rank's input (0 when unknown)."""
    dtype: str
    """Element type as the trace spells it."""
    pg_name: str
    """Process group name."""
    seq: int | None
    """Sequence number given by the trace, if any."""
    peer: int | None
    """Peer rank of a send/recv, if known."""


def as_int(v: Any) -> int | None:
    """``v`` if it is an integer of bounded magnitude, else None (bools are not integers here)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_INT < v < MAX_INT else None


def info_from_args(args: dict[str, Any]) -> dict[str, Any]:
    """Fields a newer Kineto writes on NCCL kernels and ``record_param_comms`` (empty when absent)."""
    name = args.get("Collective name")
    if not isinstance(name, str):
        return {}
    out: dict[str, Any] = {"op": name}
    nelems, dtype = as_int(args.get("In msg nelems")), args.get("dtype")
    if nelems is not None:
        out["numel"] = nelems
        if isinstance(dtype, str):
            out["dtype"] = dtype
            out["size_bytes"] = nelems * dtype_bytes(dtype)
    pg = args.get("Process Group Name")
    if isinstance(pg, str) and pg:
        out["pg_name"] = pg
    seq = as_int(args.get("Seq", args.get("seq")))
    if seq is not None:
        out["seq"] = seq
    return out


def info_from_annotation(ann: KEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"op": ann.name}
    dims, types = ann.args.get("Input Dims"), ann.args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list):
        numel = size = 0
        for d, t in zip(dims, types, strict=False):
            if isinstance(d, list) and all(isinstance(x, int) for x in d) and isinstance(t, str):
                n = 1
                for x in d:
                    n *= x
                numel += n
                size += n * dtype_bytes(t)
        out.update(numel=numel, size_bytes=size, dtype=str(types[0]) if types else "")
    return out


def info_from_host(h: HostComm) -> dict[str, Any]:
    out: dict[str, Any] = {"op": h.op, "numel": h.numel, "size_bytes": h.size_bytes, "dtype": h.dtype}
    if h.seq is not None:
        out["seq"] = h.seq
    if h.peer is not None:
        out["peer"] = h.peer
    return out


def info_from_kernel_name(name: str) -> dict[str, Any]:
    m = _KERNEL_COLL.match(name)
    if m is None:
        return {"op": name}
    kind = m.group(1)
    if kind in ("Send", "Recv"):
        return {"op": kind.lower()}
    return {"op": kind, "comm_type": _KERNEL_TYPES.get(kind)}


def merge(*sources: dict[str, Any]) -> CommInfo:
    merged: dict[str, Any] = {}
    for s in sources:  # first source that has a field wins
        for k, v in s.items():
            merged.setdefault(k, v)
    ops = [str(s["op"]) for s in sources if "op" in s]
    comm_type: CommType | None = merged.get("comm_type")
    p2p = ""
    for op in ops:
        base = op.rsplit(":", 1)[-1].lower()
        if base in ("send", "recv", "recv_anysource"):
            p2p = "recv" if base.startswith("recv") else "send"
            comm_type = None
            break
        ct = collective_from_op(op)
        if ct is not None:
            comm_type = ct
            break
    return CommInfo(
        comm_type=comm_type,
        p2p=p2p,
        op=ops[0] if ops else "",
        numel=int(merged.get("numel", 0)),
        size_bytes=int(merged.get("size_bytes", 0)),
        dtype=str(merged.get("dtype", "")),
        pg_name=str(merged.get("pg_name", DEFAULT_PG)),
        seq=merged.get("seq"),
        peer=merged.get("peer"),
    )
