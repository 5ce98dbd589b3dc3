"""Chakra's execution-trace schema (``et_def.proto``, package ``ChakraProtoMsg``) as protobuf message classes.

skewlens writes and reads Chakra ``.et`` files, which only needs Chakra's message definitions, not the
``mlc-chakra`` distribution: that package's declared dependencies (HolisticTraceAnalysis and its Jupyter,
plotting and pandas stack) would add over a gigabyte to every training environment that installs
skewlens. This module therefore describes the schema itself, as a ``FileDescriptorProto`` built with
``google.protobuf.descriptor_pb2``, and makes the message classes from it at import time, so the runtime
needs only ``protobuf``.

The description is Chakra's, element for element: the same proto package, message and enum names, field
names, numbers, types, labels and oneofs, for every message and enum of ``et_def.proto`` (the attribute
lists, ``AttributeProto`` with its ``value`` oneof, ``GlobalMetadata``, ``Node``, ``IOInfo``, ``Tensor``,
``NodeType``, ``CollectiveCommType``). Bytes made with these classes are therefore Chakra's bytes, and
Chakra's own reader decodes them. ``tests/test_chakra_schema.py`` holds this module to that: it compares
the descriptor field by field with Chakra's generated ``et_def_pb2``, reads files that skewlens wrote
with Chakra's ``protolib`` reader, and decodes bytes made with Chakra's classes with these.

The classes live in a private descriptor pool, so importing Chakra's generated module in the same process
(as the tests do) never clashes with them. Names mirror the generated module: ``Node``, ``GlobalMetadata``,
``AttributeProto``, ..., the enum wrappers ``NodeType`` and ``CollectiveCommType`` (their values are
:mod:`skewlens.profiler.vocab`'s ``NodeType`` and ``CommType``) and those values as module constants
(``COMP_NODE``, ``ALL_REDUCE``, ...), and ``DESCRIPTOR`` for the file.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

from skewlens.profiler.vocab import CommType
from skewlens.profiler.vocab import NodeType as VocabNodeType

#: Chakra's proto package; messages are ``ChakraProtoMsg.Node`` etc., as in Chakra's own files.
PACKAGE = "ChakraProtoMsg"
#: Name of the file in the private pool (distinct from Chakra's ``et_def.proto``; only the pool sees it).
FILE_NAME = "skewlens/chakra_et_def.proto"

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL = _F.LABEL_OPTIONAL
_REPEATED = _F.LABEL_REPEATED

#: The kinds of ``AttributeProto.value``, in field-number order: kind ``k`` is ``<stem>_val`` = 3 + 2k
#: and ``<stem>_list`` = 4 + 2k, the list message being ``<Stem>List { repeated <type> values = 1; }``.
ATTRIBUTE_KINDS: tuple[tuple[str, int], ...] = (
    ("double", _F.TYPE_DOUBLE),
    ("float", _F.TYPE_FLOAT),
    ("int32", _F.TYPE_INT32),
    ("int64", _F.TYPE_INT64),
    ("uint32", _F.TYPE_UINT32),
    ("uint64", _F.TYPE_UINT64),
    ("sint32", _F.TYPE_SINT32),
    ("sint64", _F.TYPE_SINT64),
    ("fixed32", _F.TYPE_FIXED32),
    ("fixed64", _F.TYPE_FIXED64),
    ("sfixed32", _F.TYPE_SFIXED32),
    ("sfixed64", _F.TYPE_SFIXED64),
    ("bool", _F.TYPE_BOOL),
    ("string", _F.TYPE_STRING),
    ("bytes", _F.TYPE_BYTES),
)

#: ``enum NodeType`` and ``enum CollectiveCommType``: (name, [(value name, number), ...]), from the
#: vocabulary's enums (Chakra names a node type ``<TYPE>_NODE``).
ENUMS: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = (
    ("NodeType", tuple((f"{t.name}_NODE", int(t)) for t in VocabNodeType)),
    ("CollectiveCommType", tuple((t.name, int(t)) for t in CommType)),
)


def _list_message(stem: str) -> str:
    return f"{stem.capitalize()}List"


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    *,
    label: int = _OPTIONAL,
    type_name: str | None = None,
    oneof_index: int | None = None,
) -> None:
    f = msg.field.add(name=name, number=number, label=label, type=ftype)
    if type_name is not None:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof_index is not None:
        f.oneof_index = oneof_index


def _message(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> descriptor_pb2.DescriptorProto:
    return fdp.message_type.add(name=name)


def file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The schema as a ``FileDescriptorProto`` (proto3, package ``ChakraProtoMsg``), in Chakra's order."""
    fdp = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")

    # message AttributeProto { string name = 1; string doc_string = 2; oneof value { ... } }
    attr = _message(fdp, "AttributeProto")
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for k, (stem, scalar) in enumerate(ATTRIBUTE_KINDS):
        _field(attr, f"{stem}_val", 3 + 2 * k, scalar, oneof_index=0)
        _field(attr, f"{stem}_list", 4 + 2 * k, _F.TYPE_MESSAGE, type_name=_list_message(stem), oneof_index=0)

    # message <Stem>List { repeated <type> values = 1; }
    for stem, scalar in ATTRIBUTE_KINDS:
        _field(_message(fdp, _list_message(stem)), "values", 1, scalar, label=_REPEATED)

    # message GlobalMetadata { string version = 1; repeated AttributeProto attr = 2; }
    gm = _message(fdp, "GlobalMetadata")
    _field(gm, "version", 1, _F.TYPE_STRING)
    _field(gm, "attr", 2, _F.TYPE_MESSAGE, label=_REPEATED, type_name="AttributeProto")

    for enum_name, values in ENUMS:
        enum = fdp.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)

    # message Node: identity, dependencies, timing (micros), inputs/outputs, attributes
    node = _message(fdp, "Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, label=_REPEATED)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, label=_REPEATED)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, label=_REPEATED, type_name="AttributeProto")

    # message IOInfo { string values = 1; string shapes = 2; string types = 3; }
    io = _message(fdp, "IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, _F.TYPE_STRING)

    # message Tensor: ids, offset, element count and size, device
    tensor = _message(fdp, "Tensor")
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), start=1):
        _field(tensor, name, number, _F.TYPE_UINT64)
    _field(tensor, "device", 6, _F.TYPE_STRING)
    return fdp


_POOL = descriptor_pool.DescriptorPool()
#: The schema's ``FileDescriptor`` (in a private pool; compare with ``et_def_pb2.DESCRIPTOR``).
DESCRIPTOR = _POOL.Add(file_descriptor_proto())


def _message_class(name: str) -> Any:
    return message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name[name])


AttributeProto: Any = _message_class("AttributeProto")
DoubleList: Any = _message_class("DoubleList")
FloatList: Any = _message_class("FloatList")
Int32List: Any = _message_class("Int32List")
Int64List: Any = _message_class("Int64List")
Uint32List: Any = _message_class("Uint32List")
Uint64List: Any = _message_class("Uint64List")
Sint32List: Any = _message_class("Sint32List")
Sint64List: Any = _message_class("Sint64List")
Fixed32List: Any = _message_class("Fixed32List")
Fixed64List: Any = _message_class("Fixed64List")
Sfixed32List: Any = _message_class("Sfixed32List")
Sfixed64List: Any = _message_class("Sfixed64List")
BoolList: Any = _message_class("BoolList")
StringList: Any = _message_class("StringList")
BytesList: Any = _message_class("BytesList")
GlobalMetadata: Any = _message_class("GlobalMetadata")
Node: Any = _message_class("Node")
IOInfo: Any = _message_class("IOInfo")
Tensor: Any = _message_class("Tensor")

NodeType = enum_type_wrapper.EnumTypeWrapper(DESCRIPTOR.enum_types_by_name["NodeType"])
CollectiveCommType = enum_type_wrapper.EnumTypeWrapper(DESCRIPTOR.enum_types_by_name["CollectiveCommType"])
# the enum values as module constants (``COMP_NODE``, ``ALL_REDUCE``, ...), as the generated module has them
globals().update(NodeType.items())
globals().update(CollectiveCommType.items())
