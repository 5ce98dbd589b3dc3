"""What a communication op is: merged from Kineto args, the host trace, annotations, ops and kernel names.

Each ``info_from_*`` reads one source into a partial dict; :func:`merge` takes, field by field, the
first source that has it, and the op's kind (collective type, or send/recv) from the first source that
says it (the order is the caller's: most specific first). Sizes are the bytes of this rank's input
buffer (element count x element size), Chakra's ``comm_size`` convention. Peers are ranks **within the
op's process group**, as every trace form records them; the converter maps them to global ranks.

The forms a trace uses, each read here:

- NCCL kernels ``ncclKernel_<Kind>_...`` (NCCL <= 2.18) and ``ncclDevKernel_<Kind>...`` (newer), with,
  in newer Kineto, ``Collective name`` / ``In msg nelems`` / ``dtype`` / ``Process Group Name`` args;
- ``record_param_comms`` ops with the same args;
- backend annotations ``nccl:<op>`` with ``Input Dims`` / ``Input type`` (the input tensors), and
  ``nccl:send <rank>-><peer>`` / ``nccl:recv <rank><-<peer>`` for point-to-point ops;
- ``c10d::<op>`` / ``_c10d_functional::<op>`` dispatcher ops (``Input Dims`` of all arguments, and the
  peer of ``c10d::send`` / ``c10d::recv_`` in ``Concrete Inputs``);
- the host execution trace's comm nodes.

A kernel's name says the collective only for the specialised kernels (``AllReduce``, ``AllGather``,
``ReduceScatter``, ``Broadcast``, ``Reduce``, ``AllToAll``) and point-to-point for ``Send`` / ``Recv``.
``SendRecv`` kernels run all-to-all(v) and batched send/recv, and in NCCL builds that specialise few
kernels any collective (every all-reduce, reduce-scatter and all-gather of the shared 16- and 128-GPU
traces runs as ``ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t``); ``Generic`` kernels run whatever was
queued. Those names say nothing, and the op's CPU side decides.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from skewlens.profiler.importers.host_et import HostComm, split_sizes
from skewlens.profiler.importers.kineto import KEvent, as_int
from skewlens.profiler.vocab import CommType, collective_from_op, dtype_bytes

DEFAULT_PG = "0"

_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")
#: Kernel kinds that say the collective (the specialised kernels; RCCL's all-to-all ones too).
_KERNEL_COLLECTIVES: dict[str, CommType] = {
    "AllReduce": CommType.ALL_REDUCE,
    "AllGather": CommType.ALL_GATHER,
    "ReduceScatter": CommType.REDUCE_SCATTER,
    "Broadcast": CommType.BROADCAST,
    "Reduce": CommType.REDUCE,
    "AllToAll": CommType.ALL_TO_ALL,
    "AlltoAll": CommType.ALL_TO_ALL,
    "AllToAllPivot": CommType.ALL_TO_ALL,
}
_KERNEL_P2P = {"Send": "send", "Recv": "recv"}

#: ``send``, ``recv_``, ``isend``, ``recv_any_source_``, ``recvAnysource``, and ProcessGroupNCCL's
#: annotation titles ``send 0->1`` / ``recv 1<-0`` (this rank, then the peer, both group ranks).
_P2P_OP = re.compile(r"^(i?send|i?recv|recv_?any_?source)_*(?:\s+\d+\s*(?:->|<-)\s*(\d+))?$")
#: ``c10d::`` ops whose first tensor argument is the output: the input is argument 1 (schemas in
#: torch/csrc/distributed/c10d/Ops.cpp); every other comm op's input is argument 0.
_C10D_INPUT_ARG = {
    "allgather": 1,
    "_allgather_base": 1,
    "allgather_coalesced": 1,
    "allgather_into_tensor_coalesced": 1,
    "reduce_scatter": 1,
    "_reduce_scatter_base": 1,
    "reduce_scatter_tensor_coalesced": 1,
    "alltoall": 1,
    "alltoall_base": 1,
    "gather": 1,
    "scatter": 1,
}
#: Position of the peer among a ``c10d::send`` / ``c10d::recv_`` op's arguments (tensors, group, peer, tag).
_C10D_PEER_ARG = 2


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
    """Peer of a send/recv as its rank within the process group, if known."""
    send_splits: tuple[int, ...] = ()
    """An all_to_all's bytes to each member of its group, in group-rank order (``In split size``); ()
    where the trace gives none."""
    recv_splits: tuple[int, ...] = ()
    """... and from each (``Out split size``)."""
    peer_global: int | None = None
    """Peer of a send/recv as a global rank (``Dst Rank`` / ``Src Rank``, Kineto#963), where given."""
    group_size: int | None = None
    """Members of the op's group (``Group size``, torch 2.1+), None where the trace does not say."""
    sized: bool = True
    """Whether a source gave the size (else ``size_bytes`` is 0 for want of one)."""
    pg_named: bool = True
    """Whether a source named the group (else ``pg_name`` is the default, the world group)."""


def p2p_from_op(op_name: str) -> tuple[str, int | None] | None:
    """(``send``/``recv``, group-rank peer or None) for a point-to-point op name, else None.

    Reads ``c10d::send``, ``c10d::recv_``, ``nccl:send``, ``nccl:recv 1<-0`` (the peer is the last number),
    ``send`` / ``recv`` (``Collective name``), ``recvAnysource``.
    """
    m = _P2P_OP.match(op_name.rsplit(":", 1)[-1].strip().lower())
    if m is None:
        return None
    return ("recv" if "recv" in m.group(1) else "send"), (int(m.group(2)) if m.group(2) else None)


@functools.lru_cache(maxsize=4096)  # once per op name, not per comm op (the result is shared: not mutated)
def _kind_of_op(op: str) -> dict[str, Any]:
    pp = p2p_from_op(op)
    if pp is not None:
        return {"p2p": pp[0]} | ({"peer": pp[1]} if pp[1] is not None else {})
    ct = collective_from_op(op)
    return {"comm_type": ct} if ct is not None else {}


#: A tensor size past any real one: :func:`_tensor_size` stops multiplying there.
OVER = 2**128


def _tensor_size(dims: Any, dtype: Any) -> tuple[int, int] | None:
    """(numel, bytes) of one tensor argument as Kineto records it, None where it is not a tensor."""
    if not isinstance(dims, list) or not isinstance(dtype, str) or dtype_bytes(dtype) == 0:
        return None  # a scalar, a tensor list ("TensorList", no dims), or an unknown element type
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in dims):
        return None
    if 0 in dims:
        return 0, 0
    # out-of-range sizes are refused where the node is made: a dim of 2**62 (past as_int's bound) was no
    # tensor, and its collective one of 0 bytes. The product stops past 2**128 (dims of thousands of
    # digits would multiply into millions), a size over 2**128 then
    n = 1
    for x in dims:
        n *= x
        if n >= OVER:
            break
    return n, n * dtype_bytes(dtype)


def info_from_args(args: dict[str, Any]) -> dict[str, Any]:
    """Fields a newer Kineto writes on NCCL kernels and ``record_param_comms`` (empty when absent)."""
    name = args.get("Collective name")
    if not isinstance(name, str):
        return {}
    out: dict[str, Any] = {"op": name} | _kind_of_op(name)
    # torch 2.1 wrote the element count as "In msg size" (renamed by pytorch#114735, Kineto#849, Dec 2023)
    nelems, dtype = as_int(args.get("In msg nelems", args.get("In msg size"))), args.get("dtype")
    if nelems is not None:
        out["numel"] = nelems
        if isinstance(dtype, str):
            out["dtype"] = dtype
            out["size_bytes"] = nelems * dtype_bytes(dtype)
    pg = args.get("Process Group Name")
    if isinstance(pg, str) and pg:
        out["pg_name"] = pg
    if (size := as_int(args.get("Group size"))) is not None:
        out["group_size"] = size
    # a send's receiver, a recv's sender, as global ranks (Kineto#963; torch maps the group rank it records)
    peer = as_int(args.get("Dst Rank") if out.get("p2p") == "send" else args.get("Src Rank"))
    if out.get("p2p") and peer is not None and peer >= 0:
        out["peer_global"] = peer
    seq = as_int(args.get("Seq", args.get("seq")))
    if seq is not None:
        out["seq"] = seq
    width = dtype_bytes(dtype) if isinstance(dtype, str) else 0
    send, recv = split_sizes(args.get("In split size")), split_sizes(args.get("Out split size"))
    if width and send is not None and recv is not None and len(send) == len(recv):
        out["send_splits"] = tuple(n * width for n in send)
        out["recv_splits"] = tuple(n * width for n in recv)
    return out


def info_from_annotation(ann: KEvent) -> dict[str, Any]:
    """A backend annotation (``nccl:all_reduce``, ``nccl:send 0->1``): its kind and input tensors."""
    out: dict[str, Any] = {"op": ann.name} | _kind_of_op(ann.name)
    dims, types = ann.args.get("Input Dims"), ann.args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list):
        numel = size = 0
        for d, t in zip(dims, types, strict=False):
            if (nb := _tensor_size(d, t)) is not None:
                numel += nb[0]
                size += nb[1]
        out.update(numel=numel, size_bytes=size, dtype=str(types[0]) if types else "")
    return out


def info_from_op(op: KEvent) -> dict[str, Any]:
    """A ``c10d::`` / ``_c10d_functional::`` op: its kind, its input tensor and (send/recv) its peer.

    ``Input Dims`` lists every argument, so the input is picked by position: argument 1 for the
    output-first ``c10d::`` ops (``_allgather_base_(output, input, ...)``), else argument 0. Functional
    collectives take the input first. Tensor-list arguments carry no dims in Kineto: no size then.
    """
    out: dict[str, Any] = {"op": op.name} | _kind_of_op(op.name)
    ns, _, base = op.name.partition("::")
    k = _C10D_INPUT_ARG.get(base.rstrip("_"), 0) if ns == "c10d" else 0
    dims, types = op.args.get("Input Dims"), op.args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list) and k < min(len(dims), len(types)):
        nb = _tensor_size(dims[k], types[k])
        if nb is not None:
            out.update(numel=nb[0], size_bytes=nb[1], dtype=types[k])
    concrete = op.args.get("Concrete Inputs")
    if out.get("p2p") and ns == "c10d" and isinstance(concrete, list) and len(concrete) > _C10D_PEER_ARG:
        peer = concrete[_C10D_PEER_ARG]
        if isinstance(peer, str) and peer.isdecimal() and len(peer) < 10:
            out["peer"] = int(peer)
    return out


def info_from_host(h: HostComm) -> dict[str, Any]:
    out: dict[str, Any] = {"op": h.op, "numel": h.numel, "size_bytes": h.size_bytes, "dtype": h.dtype}
    if h.p2p:
        out["p2p"] = h.p2p
    elif h.comm_type is not None:
        out["comm_type"] = h.comm_type
    if h.seq is not None:
        out["seq"] = h.seq
    if h.peer is not None:
        out["peer"] = h.peer
    if h.send_splits:
        out["send_splits"], out["recv_splits"] = h.send_splits, h.recv_splits
    return out


def kernel_kind(name: str) -> str:
    """The kind an NCCL kernel's name gives (``AllReduce``, ``SendRecv``, ``Generic``), '' if none."""
    m = _KERNEL.match(name)
    return m.group(1) if m else ""


def info_from_kernel_name(name: str) -> dict[str, Any]:
    """What the kernel name says: a collective or send/recv for specialised kernels, else only a name."""
    kind = kernel_kind(name)
    if not kind:
        return {"op": name}
    if kind in _KERNEL_P2P:
        return {"op": kind.lower(), "p2p": _KERNEL_P2P[kind]}
    ct = _KERNEL_COLLECTIVES.get(kind)
    return {"op": kind} | ({"comm_type": ct} if ct is not None else {})


def merge(*sources: dict[str, Any]) -> CommInfo:
    merged: dict[str, Any] = {}
    for s in sources:  # first source that has a field wins
        for k, v in s.items():
            merged.setdefault(k, v)
    # the first source that says what the op is decides (a later one may still give the peer or size)
    kind = next((s for s in sources if s.get("p2p") or s.get("comm_type") is not None), {})
    ops = [str(s["op"]) for s in sources if "op" in s]
    p2p = str(kind.get("p2p") or "")
    return CommInfo(
        comm_type=None if p2p else kind.get("comm_type"),
        p2p=p2p,
        op=ops[0] if ops else "",
        numel=int(merged.get("numel", 0)),
        size_bytes=int(merged.get("size_bytes", 0)),
        dtype=str(merged.get("dtype", "")),
        pg_name=str(merged.get("pg_name", DEFAULT_PG)),
        sized="size_bytes" in merged,
        pg_named="pg_name" in merged,
        group_size=merged.get("group_size"),
        seq=merged.get("seq"),
        peer=merged.get("peer") if p2p else None,
        peer_global=merged.get("peer_global") if p2p else None,
        send_splits=merged.get("send_splits", ()),
        recv_splits=merged.get("recv_splits", ()),
    )
