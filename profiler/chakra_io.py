"""Reading and writing Chakra execution traces (``.et``: varint-length-delimited protobuf messages).

The file layout is Chakra's: one ``GlobalMetadata`` message, then one ``Node`` message per node, each
prefixed by its length as a varint (what ``chakra.src.third_party.utils.protolib.encodeMessage`` writes
and ``decodeMessage`` reads). Files may be gzip-compressed, as Chakra's reader allows. The message classes
(``pb``) are :mod:`skewlens.profiler.chakra_schema`, Chakra's schema described without the ``mlc-chakra``
package; messages built with Chakra's own ``et_def_pb2`` classes are accepted too (same wire format).

Writing is atomic: nodes go to a temporary file beside the target, renamed into place only when the
writer closes without error. Reading treats the file as untrusted: every message length is checked
against a bound and against the bytes left, and a bad file raises :class:`TraceFormatError` naming the
file and the byte offset.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from google.protobuf.message import DecodeError

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.atomic import FILE_MODE, temp_prefix, why_not_created
from skewlens.profiler.bounded import read_bytes_bounded
from skewlens.profiler.errors import TraceFormatError
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.vocab import CHAKRA_INT32_ATTRS, ET_SCHEMA, PG_INIT_NODE_NAME, Attr, NodeType

#: Largest single message we accept (a node with huge shape strings is still far below this).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Largest (decompressed) trace file we accept.
MAX_TRACE_BYTES = 8 * 1024 * 1024 * 1024
#: A gzipped trace may expand to at most this many times its size (or :data:`MIN_GZIP_LIMIT_BYTES`): ours
#: and PyTorch's compress about 9x; a file of one repeated tiny node compresses a thousandfold, and each
#: node costs the loader about 150 bytes.
MAX_GZIP_RATIO = 32
MIN_GZIP_LIMIT_BYTES = 16 * 1024 * 1024
#: What a zero-length message after the GlobalMetadata is called: a Node with no field set (no id, no type)
#: is no node any tool writes, and a file of zero bytes would be a billion of them.
EMPTY_NODE = "empty node message (zero bytes: no id, no type)"
#: Chakra schema version string written into GlobalMetadata.
CHAKRA_VERSION = "0.0.4"

AttrValue = bool | int | float | str | Sequence[int] | Sequence[str]
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceNode:
    """One node to write into a Chakra trace (producers build these; :class:`EtWriter` encodes them)."""

    node_id: int
    """Unique id of the node within its rank's file."""
    name: str
    """Operator / kernel / collective name, e.g. ``aten::mm`` or ``c10d::allreduce_``."""
    node_type: NodeType
    """Chakra node type."""
    start_ns: int
    """Start time on the run's aligned clock, integer nanoseconds."""
    dur_ns: int
    """Duration, integer nanoseconds."""
    ctrl_deps: tuple[int, ...] = ()
    """Ids of nodes that must finish first (program order on the same thread/stream)."""
    data_deps: tuple[int, ...] = ()
    """Ids of nodes whose output tensors this node reads."""
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    """Further attributes (``comm_type``, ``comm_size``, ``pg_name``, ``skl_seq``, ...)."""
    inputs_values: str = ""
    """Chakra IOInfo ``inputs.values`` (free-form string)."""
    inputs_shapes: str = ""
    """Chakra IOInfo ``inputs.shapes``."""
    inputs_types: str = ""
    """Chakra IOInfo ``inputs.types``."""


def as_comm_node(attrs: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """``attrs`` of a communication node in Chakra's convention: ``is_cpu_op`` false (what Chakra's
    converter writes and ASTRA-sim requires), where it ran kept in ``skl_host_op`` (default: the host)."""
    host = attrs.get(Attr.HOST_OP, attrs.get(Attr.IS_CPU_OP, True))
    attrs[Attr.HOST_OP] = bool(host)
    attrs[Attr.IS_CPU_OP] = False
    return attrs


def pg_init_node(groups: Sequence[ProcessGroupInfo]) -> TraceNode:
    """The ``## process_group:init ##`` METADATA node (id 0) listing the process groups, in PyTorch's form."""
    values = json.dumps(
        [
            {
                "pg_name": g.name,
                "pg_desc": g.desc,
                "backend_config": g.backend,
                "ranks": list(g.ranks),
                "group_size": len(g.ranks),
            }
            for g in groups
        ]
    )
    return TraceNode(
        node_id=0,
        name=PG_INIT_NODE_NAME,
        node_type=NodeType.METADATA,
        start_ns=0,
        dur_ns=0,
        inputs_values=values,
    )


def _attr(name: str, value: AttrValue) -> pb.AttributeProto:
    a = pb.AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, int) and name in CHAKRA_INT32_ATTRS and _INT32_MIN <= value <= _INT32_MAX:
        a.int32_val = value  # as Chakra's feeder reads them (a value past int32 stays an int64: no rank or
        # tag torch issues is one; the loader refuses such a comm_src / comm_dst as a bad attribute)
    elif isinstance(value, int):
        a.int64_val = value
    elif isinstance(value, float):
        a.double_val = value
    elif isinstance(value, str):
        a.string_val = value
    elif all(isinstance(v, int) for v in value):
        a.int64_list.values.extend(int(v) for v in value)
    else:
        a.string_list.values.extend(str(v) for v in value)
    return a


def set_attr(node: pb.Node, name: str, value: AttrValue) -> None:
    """Set attribute ``name`` of ``node`` to ``value``, replacing any attribute of that name."""
    keep = [a for a in node.attr if a.name != name]
    del node.attr[:]
    node.attr.extend(keep)
    node.attr.append(_attr(name, value))


def node_template(
    name: str, node_type: NodeType, attrs: Sequence[tuple[str, AttrValue]] = (), *, ctrl_dep: int | None = 0
) -> pb.Node:
    """A protobuf node to fill in and re-encode in a loop (fast synthetic traces).

    Its first two attributes are ``skl_start_ns`` and ``skl_dur_ns`` (set ``attr[0]`` / ``attr[1]``),
    then ``attrs`` in order; one ctrl dependency slot when ``ctrl_dep`` is given.
    """
    node = pb.Node(name=name, type=int(node_type))
    if ctrl_dep is not None:
        node.ctrl_deps.append(ctrl_dep)
    node.attr.extend(_attr(k, v) for k, v in [(Attr.START_NS, 0), (Attr.DUR_NS, 0), *attrs])
    return node


def attr_value(a: pb.AttributeProto) -> Any:
    """Python value of a Chakra ``AttributeProto`` (lists come back as lists)."""
    kind = a.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(a, kind)
    if kind.endswith("_list"):
        return list(v.values)
    return v


def to_proto(node: TraceNode) -> pb.Node:
    """Encode a :class:`TraceNode` as a Chakra ``Node`` (micros at the edge, exact ns in ``skl_*``)."""
    msg = pb.Node(
        id=node.node_id,
        name=node.name,
        type=int(node.node_type),
        start_time_micros=max(node.start_ns, 0) // 1000,
        duration_micros=max(node.dur_ns, 0) // 1000,
    )
    msg.ctrl_deps.extend(node.ctrl_deps)
    msg.data_deps.extend(node.data_deps)
    if node.inputs_values or node.inputs_shapes or node.inputs_types:
        msg.inputs.values = node.inputs_values
        msg.inputs.shapes = node.inputs_shapes
        msg.inputs.types = node.inputs_types
    msg.attr.append(_attr(Attr.START_NS, int(node.start_ns)))
    msg.attr.append(_attr(Attr.DUR_NS, int(node.dur_ns)))
    msg.attr.extend(_attr(k, v) for k, v in node.attrs.items())
    return msg


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    bits = value & 0x7F
    value >>= 7
    while value:
        out.append(0x80 | bits)
        bits = value & 0x7F
        value >>= 7
    out.append(bits)
    return bytes(out)


def encode_message(msg: pb.Node | pb.GlobalMetadata) -> bytes:
    """A message with its varint length prefix, byte-identical to protolib.encodeMessage's output."""
    body = msg.SerializeToString()
    return _encode_varint(len(body)) + body


class EtWriter:
    """Atomic writer of one rank's Chakra trace: ``with EtWriter(path, metadata) as w: w.write(node)``."""

    def __init__(self, path: str | Path, metadata: Mapping[str, AttrValue] | None = None) -> None:
        self.path = Path(path)
        self._meta = {"schema": ET_SCHEMA, **(metadata or {})}
        self._fh: IO[bytes] | None = None
        self._tmp: str | None = None
        self.count = 0

    def __enter__(self) -> EtWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(
                prefix=temp_prefix(self.path.name), suffix=".tmp", dir=self.path.parent
            )
        except OSError as e:
            raise TraceFormatError(f"cannot write {self.path}: {why_not_created(self.path, e)}") from None
        self._fh = os.fdopen(fd, "wb", buffering=1 << 20)
        gm = pb.GlobalMetadata(version=CHAKRA_VERSION)
        gm.attr.extend(_attr(k, v) for k, v in self._meta.items())
        self._fh.write(encode_message(gm))
        return self

    def write(self, node: TraceNode | pb.Node) -> None:
        """Append one node: a :class:`TraceNode`, or an already built protobuf ``Node`` (``pb.Node`` or
        Chakra's ``et_def_pb2.Node``: the same message, so the same bytes)."""
        assert self._fh is not None, "EtWriter used outside its with-block"
        msg = to_proto(node) if isinstance(node, TraceNode) else node
        self._fh.write(encode_message(msg))
        self.count += 1

    def write_raw(self, encoded: bytes) -> None:
        """Append bytes already produced by :func:`encode_message` (fast path for generators)."""
        assert self._fh is not None, "EtWriter used outside its with-block"
        self._fh.write(encoded)

    def write_all(self, nodes: Iterable[TraceNode | pb.Node]) -> None:
        for n in nodes:
            self.write(n)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._fh is not None and self._tmp is not None
        try:
            self._fh.close()
            if exc_type is None:
                Path(self._tmp).chmod(FILE_MODE)
                Path(self._tmp).replace(self.path)
        finally:
            if exc_type is not None or not self.path.exists():
                Path(self._tmp).unlink(missing_ok=True)


def write_et(
    path: str | Path, nodes: Iterable[TraceNode | pb.Node], metadata: Mapping[str, AttrValue] | None = None
) -> int:
    """Write a whole trace atomically; returns the number of nodes written."""
    with EtWriter(path, metadata) as w:
        w.write_all(nodes)
        return w.count


def read_trace_bytes(path: Path) -> bytes:
    """A trace file's bytes (gunzipped), bounded; errors name the file."""
    return read_bytes_bounded(
        path,
        MAX_TRACE_BYTES,
        error=TraceFormatError,
        what="trace file",
        gzip_ratio=MAX_GZIP_RATIO,
        gzip_floor=MIN_GZIP_LIMIT_BYTES,
    )


def iter_messages(
    path: str | Path, data: bytes | memoryview | None = None
) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(byte_offset, message_bytes)`` for each length-delimited message, bounds-checked (``data``:
    the file's bytes where the caller has read them already; ``path`` then only names it in errors)."""
    p = Path(path)
    if data is None:
        data = read_trace_bytes(p)
    view = memoryview(data)
    n = len(data)
    pos = 0
    while pos < n:
        start = pos
        size = 0
        shift = 0
        while True:
            if pos >= n:
                raise TraceFormatError(f"{p}: truncated length prefix at byte offset {start}")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise TraceFormatError(f"{p}: corrupt length prefix at byte offset {start}")
        if size > MAX_MESSAGE_BYTES:
            raise TraceFormatError(
                f"{p}: message at byte offset {start} claims {size} bytes (limit {MAX_MESSAGE_BYTES})"
            )
        if pos + size > n:
            raise TraceFormatError(
                f"{p}: truncated message at byte offset {start}: needs {size} bytes, {n - pos} left"
            )
        if size == 0 and start > 0:
            raise TraceFormatError(f"{p}: {EMPTY_NODE} at byte offset {start}")
        yield start, view[pos : pos + size]
        pos += size


@dataclass(frozen=True, slots=True)
class EtFile:
    """A decoded trace: its global metadata attributes and its nodes, in file order."""

    path: Path
    metadata: dict[str, Any]
    nodes: list[pb.Node]


def read_metadata(msg_bytes: memoryview | bytes, path: Path, offset: int = 0) -> dict[str, Any]:
    gm = pb.GlobalMetadata()
    try:
        gm.ParseFromString(bytes(msg_bytes))
    except DecodeError:
        hint = _first_node_hint(msg_bytes)
        what = "corrupt GlobalMetadata" if hint is None else "no GlobalMetadata"
        raise TraceFormatError(f"{path}: {what} at byte offset {offset}{hint or ''}") from None
    meta: dict[str, Any] = {a.name: attr_value(a) for a in gm.attr}
    meta["version"] = gm.version
    return meta


def _first_node_hint(msg_bytes: memoryview | bytes) -> str | None:
    """Where a first message that is no GlobalMetadata reads as a node with a name and a known type, what
    to do: Chakra before its schema 0.0.4 wrote no GlobalMetadata, the nodes from the first byte on
    (ASTRA-sim's 2023 examples); else None (the message is corrupt)."""
    node = pb.Node()
    try:
        node.ParseFromString(bytes(msg_bytes))
    except DecodeError:
        return None
    if not node.name or node.type not in NodeType._value2member_map_:
        return None
    return (
        f": the first message is a node ({node.name!r}), as Chakra wrote traces before its schema 0.0.4; "
        "write a GlobalMetadata message before the nodes (Chakra's encodeMessage(f, "
        "GlobalMetadata(version='0.0.4'))) to load it"
    )


def _metadata_and_messages(
    p: Path, data: bytes | memoryview | None = None
) -> tuple[dict[str, Any], Iterator[tuple[int, memoryview]]]:
    """A trace's GlobalMetadata (:func:`read_metadata`) and an iterator over the node messages after it."""
    it = iter_messages(p, data)
    first = next(it, None)
    if first is None:
        raise TraceFormatError(f"{p}: empty file, expected a Chakra GlobalMetadata message")
    return read_metadata(first[1], p, first[0]), it


def _node(p: Path, offset: int, raw: memoryview) -> pb.Node:
    """The node message ``raw`` at byte ``offset`` of ``p``, else a :class:`TraceFormatError` naming both."""
    node = pb.Node()
    try:
        node.ParseFromString(bytes(raw))
    except DecodeError:
        raise TraceFormatError(f"{p}: corrupt node message at byte offset {offset}") from None
    return node


def iter_nodes(path: str | Path, data: bytes | memoryview | None = None) -> Iterator[tuple[int, pb.Node]]:
    """Yield ``(byte_offset, node)`` after the GlobalMetadata message; errors name file and offset
    (``data``: as for :func:`iter_messages`)."""
    p = Path(path)
    _meta, it = _metadata_and_messages(p, data)
    for offset, raw in it:
        yield offset, _node(p, offset, raw)


def read_et(path: str | Path) -> EtFile:
    """Read a whole trace (metadata + nodes); for large runs prefer the store's columnar loader."""
    p = Path(path)
    meta, it = _metadata_and_messages(p)
    return EtFile(path=p, metadata=meta, nodes=[_node(p, offset, raw) for offset, raw in it])


def node_attrs(node: pb.Node) -> dict[str, Any]:
    """All attributes of a node as a ``name -> value`` dict."""
    return {a.name: attr_value(a) for a in node.attr}
