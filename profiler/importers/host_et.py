"""PyTorch host execution traces (``ExecutionTraceObserver`` JSON): the communication ops they record.

From a host trace the importer takes one :class:`HostComm` per backend annotation node (``nccl:*``,
``gloo:*``: the node whose inputs are the communicated tensors), in node-id order (the observer numbers
nodes when they start, so id order is issue order across threads). Where the node's parent is a
``record_param_comms`` node of a layout we know, its c10d sequence number, collective name (e.g.
``all_to_allv``), process-group pointer, peer rank and split sizes are added.

Supported schema versions, HTA style: one row per version saying how its nodes are laid out. An unknown
version is refused with the list of known ones, never guessed.

=====================  =========  ===========  ================================================
schema                 parent     inputs       ``record_param_comms`` inputs
=====================  =========  ===========  ================================================
``1.0.1``              parent     flat lists   ``[tensors, seq, pg_ptr, rank, coll, in_splits,
                                               out_splits]`` (checked on the shared DLRM traces)
``1.0.2-chakra.0.0.4`` ctrl_deps  grouped      not interpreted (sizes come from the annotation)
``1.0.3-chakra.0.0.4`` ctrl_deps  grouped      not interpreted
``1.1.0-chakra.0.0.4`` ctrl_deps  grouped      not interpreted
``1.1.1-chakra.0.0.4`` ctrl_deps  grouped      not interpreted (what torch 2.13 writes)
=====================  =========  ===========  ================================================

"flat": ``inputs``/``input_shapes``/``input_types`` are parallel lists on the node; "grouped":
``inputs`` is ``{"values", "shapes", "types"}`` and ``rf_id``/``tid`` sit in an ``attrs`` list.
A tensor value is ``[tensor_id, storage_id, offset, numel, element_bytes, device]`` in every version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.manifest import MAX_WORLD_SIZE
from skewlens.profiler.vocab import CommType, collective_from_op


@dataclass(frozen=True, kw_only=True, slots=True)
class HostEtLayout:
    """How nodes of one host-trace schema version are laid out."""

    parent_key: str
    """Key of the parent node id (``parent`` or ``ctrl_deps``)."""
    grouped_io: bool
    """True where ``inputs`` is a ``{"values", "shapes", "types"}`` object."""
    rpc_v101: bool
    """True where ``record_param_comms`` inputs follow the 1.0.1 layout (seq, pg pointer, rank, name)."""


#: Supported host-trace schema versions and their layouts.
HOST_ET_SCHEMAS: dict[str, HostEtLayout] = {
    "1.0.1": HostEtLayout(parent_key="parent", grouped_io=False, rpc_v101=True),
    "1.0.2-chakra.0.0.4": HostEtLayout(parent_key="ctrl_deps", grouped_io=True, rpc_v101=False),
    "1.0.3-chakra.0.0.4": HostEtLayout(parent_key="ctrl_deps", grouped_io=True, rpc_v101=False),
    "1.1.0-chakra.0.0.4": HostEtLayout(parent_key="ctrl_deps", grouped_io=True, rpc_v101=False),
    "1.1.1-chakra.0.0.4": HostEtLayout(parent_key="ctrl_deps", grouped_io=True, rpc_v101=False),
}

#: Node-name prefixes of backend annotations that carry the communicated tensors.
COMM_ANNOTATION_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")
#: Node ids past int64 (Chakra's field) are refused.
_MAX_ID = 1 << 63
_P2P = {"send": "send", "recv": "recv", "recv_anysource": "recv"}


@dataclass(frozen=True, kw_only=True, slots=True)
class HostComm:
    """One communication op as the host trace records it."""

    node_id: int
    """Host-trace node id of the backend annotation (issue order)."""
    name: str
    """Annotation name, e.g. ``nccl:all_to_all``."""
    comm_type: CommType | None
    """Collective type; None for point-to-point or unknown ops."""
    p2p: str
    """``send`` / ``recv`` for point-to-point ops, else empty."""
    op: str
    """Most specific op name known (``record_param_comms``'s, e.g. ``all_to_allv``, else ``name``)."""
    numel: int
    """Elements in the input tensors."""
    size_bytes: int
    """Bytes of the input tensors (numel x element size)."""
    dtype: str
    """Element type of the first input tensor, as the trace spells it (``float``, ``long int``)."""
    seq: int | None = None
    """c10d sequence number from ``record_param_comms`` (1.0.1 layout only)."""
    pg_ptr: int | None = None
    """Process-group object address from ``record_param_comms`` (1.0.1; not comparable across ranks)."""
    peer: int | None = None
    """Peer rank of a send/recv (1.0.1 ``record_param_comms`` rank field)."""
    reads: tuple[TensorKey, ...] = ()
    """The communicated input tensors."""
    send_splits: tuple[int, ...] = ()
    """An all_to_all's bytes to each member of its group, in group-rank order (1.0.1 ``record_param_comms``'s
    input split sizes, elements times the input's element size); () where it lists none."""
    recv_splits: tuple[int, ...] = ()
    """... and from each (its output split sizes)."""


TensorKey = tuple[int, int]
"""A tensor as the host trace identifies it: (tensor id, storage id)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostOp:
    """One operator node of a host trace, reduced to what data dependencies need."""

    node_id: int
    """Node id (issue order)."""
    name: str
    """Operator name (``aten::mm``)."""
    tid: int
    """The observer's thread number (1, 2, ...; not the OS thread id)."""
    rf_id: int | None
    """Record-function id (equals Kineto's ``Record function id`` in newer traces)."""
    reads: tuple[TensorKey, ...]
    """Tensors among the inputs."""
    writes: tuple[TensorKey, ...]
    """Tensors among the outputs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostTrace:
    """What the importer uses from one host execution trace."""

    path: Path
    """File it was read from."""
    schema: str
    """Schema version string."""
    pid: int | None
    """Process id recorded by the observer (pairs with the Kineto trace's CPU pid)."""
    comms: tuple[HostComm, ...]
    """Communication ops in issue order."""
    ops: tuple[HostOp, ...]
    """Every operator node (not the thread roots), in id order, with the tensors it reads and writes."""
    pg_init: str
    """Raw value of the ``## process_group:init ##`` node, '' when absent."""


def _tensors(value: Any, type_str: str) -> list[list[Any]]:
    """Tensor tuples inside one input value (a tensor or a list of tensors)."""
    if not type_str.startswith(("Tensor", "GenericList[Tensor")) or not isinstance(value, list):
        return []
    if type_str.startswith("Tensor"):
        return [value] if len(value) >= 5 else []
    return [v for v in value if isinstance(v, list) and len(v) >= 5]


def _io(
    node: dict[str, Any], layout: HostEtLayout, path: Path, side: str = "inputs"
) -> tuple[list[Any], list[str]]:
    """Values and types of a node's ``inputs`` or ``outputs`` (absent: none); present but of another JSON
    type than the schema's is a corrupt trace (read as none, it silently changed what the run holds)."""
    if layout.grouped_io:
        group = node.get(side, {})
        if not isinstance(group, dict):
            raise _malformed(path, node, side, "an object")
        values, types = group.get("values", []), group.get("types", [])
        where = f"{side}.values / {side}.types"
    else:
        values, types = node.get(side, []), node.get(f"{side[:-1]}_types", [])
        where = f"{side} / {side[:-1]}_types"
    if not isinstance(values, list) or not isinstance(types, list):
        raise _malformed(path, node, where, "lists")
    return values, [t if isinstance(t, str) else "" for t in types]


def _malformed(path: Path, node: dict[str, Any], key: str, want: str) -> TraceImportError:
    return TraceImportError(
        f"{path}: node {node.get('id')} ({str(node.get('name'))[:60]}): {key} must be {want}"
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _keys(values: list[Any], types: list[str]) -> tuple[TensorKey, ...]:
    out = []
    for v, ty in zip(values, types, strict=False):
        for t in _tensors(v, ty):
            tid, sid = _int(t[0]), _int(t[1])
            if tid is not None and sid is not None:
                out.append((tid, sid))
    return tuple(out)


def _field(node: dict[str, Any], layout: HostEtLayout, key: str) -> int | None:
    """An integer node field: top-level in flat layouts, in the ``attrs`` list in grouped ones."""
    if not layout.grouped_io:
        return _int(node.get(key))
    attrs = node.get("attrs")
    if not isinstance(attrs, list):
        return None
    return _int(next((a.get("value") for a in attrs if isinstance(a, dict) and a.get("name") == key), None))


def _rpc_fields(values: list[Any]) -> dict[str, Any]:
    """The 1.0.1 ``record_param_comms`` inputs: ``[tensors?, seq, pg_ptr, rank, name, in, out]``, ``in`` and
    ``out`` an all_to_all's split sizes (elements to and from each member; empty lists where even)."""
    s = next((i for i, v in enumerate(values) if isinstance(v, str)), None)
    if s is None or s < 3:
        return {}
    seq, ptr, rank = (_int(v) for v in values[s - 3 : s])
    out = {"op": values[s], "seq": seq, "pg_ptr": ptr, "rank": rank}
    splits = [split_sizes(v) for v in values[s + 1 : s + 3]]
    if len(splits) == 2 and splits[0] and splits[1] and len(splits[0]) == len(splits[1]):
        out["splits"] = (splits[0], splits[1])
    return out


def split_sizes(v: Any) -> tuple[int, ...] | None:
    """An all_to_all's split sizes (elements to or from each group member) as Kineto writes them
    (``"[3, 0, 5]"``; ``"[]"`` for none) or a host execution trace lists them (``[3, 0, 5]``), None where
    absent, empty or not such a list; at most :data:`MAX_WORLD_SIZE` entries, each under 2**62."""
    if isinstance(v, str):
        text = v.strip()
        if not (text.startswith("[") and text.endswith("]")) or text.count(",") >= MAX_WORLD_SIZE:
            return None
        items = [x.strip() for x in text[1:-1].split(",")] if text[1:-1].strip() else []
        if not all(x.isdecimal() and len(x) < 19 for x in items):
            return None
        v = [int(x) for x in items]
    if not isinstance(v, list) or not v or len(v) > MAX_WORLD_SIZE:
        return None
    if not all(type(x) is int and 0 <= x < 1 << 62 for x in v):
        return None
    return tuple(v)


def parse_host_et(doc: Any, path: Path) -> HostTrace:
    """Check the schema version and collect the communication ops of one host execution trace."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise TraceImportError(f"{path}: not a PyTorch host execution trace (no 'nodes' list)")
    schema = doc.get("schema")
    if not isinstance(schema, str) or schema not in HOST_ET_SCHEMAS:
        known = ", ".join(HOST_ET_SCHEMAS)
        raise TraceImportError(
            f"{path}: host execution trace schema {schema!r} is not supported (supported: {known})"
        )
    layout = HOST_ET_SCHEMAS[schema]
    by_id: dict[int, dict[str, Any]] = {}
    for k, node in enumerate(doc["nodes"]):
        nid = _int(node.get("id")) if isinstance(node, dict) else None
        if nid is None or not isinstance(node.get("name"), str):
            raise TraceImportError(f"{path}: node #{k} has no integer 'id' / string 'name'")
        if not 0 <= nid < _MAX_ID:
            raise TraceImportError(f"{path}: node #{k} has id {nid}, outside 0..2**63-1")
        by_id[nid] = node
    comms: list[HostComm] = []
    ops: list[HostOp] = []
    pg_init = ""
    for nid in sorted(by_id):
        node = by_id[nid]
        name: str = node["name"]
        if name == "## process_group:init ##":
            values, _types = _io(node, layout, path)
            pg_init = values[0] if values and isinstance(values[0], str) else ""
            continue
        values, types = _io(node, layout, path)
        reads = _keys(values, types)
        if not name.startswith("[pytorch|profiler|execution_"):
            ops.append(
                HostOp(
                    node_id=nid,
                    name=name,
                    tid=_field(node, layout, "tid") or 0,
                    rf_id=_field(node, layout, "rf_id"),
                    reads=reads,
                    writes=_keys(*_io(node, layout, path, "outputs")),
                )
            )
        if not name.startswith(COMM_ANNOTATION_PREFIXES):
            continue
        tensors = [t for v, ty in zip(values, types, strict=False) for t in _tensors(v, ty)]
        numel = sum(t[3] for t in tensors if _int(t[3]) is not None)
        size = sum(t[3] * t[4] for t in tensors if _int(t[3]) is not None and _int(t[4]) is not None)
        dtype = next((ty[ty.find("(") + 1 : -1] for ty in types if ty.startswith("Tensor(")), "")
        fields: dict[str, Any] = {}
        parent = by_id.get(node.get(layout.parent_key, -1))
        if layout.rpc_v101 and parent is not None and parent.get("name") == "record_param_comms":
            fields = _rpc_fields(_io(parent, layout, path)[0])
        op = str(fields.get("op") or name)
        base = op.rsplit(":", 1)[-1]
        p2p = _P2P.get(base, "")
        # not `or`: CommType.ALL_REDUCE is 0, falsy
        ct = collective_from_op(op)
        width = next((t[4] for t in tensors if _int(t[4]) is not None), 0)
        send, recv = fields.get("splits", ((), ()))
        comms.append(
            HostComm(
                node_id=nid,
                name=name,
                comm_type=None if p2p else ct if ct is not None else collective_from_op(name),
                p2p=p2p,
                op=op,
                numel=numel,
                size_bytes=size,
                dtype=dtype,
                seq=fields.get("seq"),
                pg_ptr=fields.get("pg_ptr"),
                peer=fields.get("rank") if p2p else None,
                reads=reads,
                send_splits=tuple(n * width for n in send) if width else (),
                recv_splits=tuple(n * width for n in recv) if width else (),
            )
        )
    pid = _int(doc.get("pid"))
    return HostTrace(path=path, schema=schema, pid=pid, comms=tuple(comms), ops=tuple(ops), pg_init=pg_init)
