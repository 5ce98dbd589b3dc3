"""skewlens's own description of Chakra's ET schema against Chakra's: descriptors, files and bytes.

The runtime describes the schema itself (``skewlens.profiler.chakra_schema``) so that installing skewlens
does not pull in ``mlc-chakra``'s dependencies; Chakra's generated ``et_def_pb2`` and its ``protolib``
reader stay the authority on the format, and these tests hold the two together.
"""

from __future__ import annotations

import gzip
import io
import math
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet

try:
    from chakra.schema.protobuf import et_def_pb2 as chakra_pb
    from chakra.src.third_party.utils.protolib import encodeMessage
except ImportError as e:  # the authority is missing: say how to get it rather than skip
    raise ImportError(
        "tests/test_chakra_schema.py compares skewlens's Chakra schema with Chakra's own module, which is "
        "not installed; install it with `.venv/bin/pip install --no-deps mlc-chakra==1.0.0` "
        "(scripts/install.sh does this)"
    ) from e

from chakra_reader import read_with_chakra

from skewlens.profiler import chakra_schema as ours
from skewlens.profiler.chakra_io import TraceNode, encode_message, pg_init_node, read_et, write_et
from skewlens.profiler.manifest import ProcessGroupInfo
from skewlens.profiler.vocab import CommType, NodeType

#: Messages of Chakra's ``et_def.proto`` that skewlens does not describe: none, the schema is whole.
LEFT_OUT: frozenset[str] = frozenset()


def _chakra_messages() -> dict[str, Descriptor]:
    return {name: d for name, d in chakra_pb.DESCRIPTOR.message_types_by_name.items() if name not in LEFT_OUT}


def _file_proto(fd: Any) -> descriptor_pb2.FileDescriptorProto:
    p = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(p)
    return p


def _field_facts(f: FieldDescriptor) -> tuple[Any, ...]:
    return (
        f.full_name,
        f.number,
        f.type,
        f.is_repeated,
        f.is_required,
        f.has_presence,
        f.is_packed,
        f.containing_oneof.full_name if f.containing_oneof else None,
        f.message_type.full_name if f.message_type else None,
        f.enum_type.full_name if f.enum_type else None,
    )


def test_every_chakra_message_and_enum_is_described_under_the_same_full_name() -> None:
    assert ours.DESCRIPTOR.package == chakra_pb.DESCRIPTOR.package == "ChakraProtoMsg"
    assert set(ours.DESCRIPTOR.message_types_by_name) == set(_chakra_messages())
    assert set(ours.DESCRIPTOR.enum_types_by_name) == set(chakra_pb.DESCRIPTOR.enum_types_by_name)
    for name, theirs in _chakra_messages().items():
        assert ours.DESCRIPTOR.message_types_by_name[name].full_name == theirs.full_name
        assert getattr(ours, name).DESCRIPTOR.full_name == theirs.full_name


def test_every_field_has_chakras_number_type_label_oneof_and_referenced_type() -> None:
    for name, theirs in _chakra_messages().items():
        mine = ours.DESCRIPTOR.message_types_by_name[name]
        assert set(mine.fields_by_name) == set(theirs.fields_by_name), name
        for field_name, f in theirs.fields_by_name.items():
            assert _field_facts(mine.fields_by_name[field_name]) == _field_facts(f)
        assert {o.name: [f.name for f in o.fields] for o in mine.oneofs} == {
            o.name: [f.name for f in o.fields] for o in theirs.oneofs
        }, name


def test_the_attribute_oneof_holds_every_scalar_and_list_kind_of_chakra() -> None:
    oneof = ours.AttributeProto.DESCRIPTOR.oneofs_by_name["value"]
    theirs = chakra_pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"]
    assert [(f.name, f.number) for f in oneof.fields] == [(f.name, f.number) for f in theirs.fields]
    assert len(oneof.fields) == 2 * len(ours.ATTRIBUTE_KINDS) == 30


def test_every_enum_has_chakras_value_names_and_numbers() -> None:
    for name, theirs in chakra_pb.DESCRIPTOR.enum_types_by_name.items():
        mine = ours.DESCRIPTOR.enum_types_by_name[name]
        assert mine.full_name == theirs.full_name
        assert [(v.name, v.number) for v in mine.values] == [(v.name, v.number) for v in theirs.values]
        for v in theirs.values:  # module constants, as the generated module has them
            assert getattr(ours, v.name) == getattr(chakra_pb, v.name) == v.number
            assert getattr(ours, name).Value(v.name) == v.number


def test_the_vocabulary_enums_carry_chakras_numbers() -> None:
    assert {t.name + "_NODE": int(t) for t in NodeType} == dict(chakra_pb.NodeType.items())
    assert {t.name: int(t) for t in CommType} == dict(chakra_pb.CollectiveCommType.items())


def test_the_file_descriptor_equals_chakras_but_for_the_file_name() -> None:
    mine, theirs = _file_proto(ours.DESCRIPTOR), _file_proto(chakra_pb.DESCRIPTOR)
    assert mine.name == ours.FILE_NAME != theirs.name
    mine.name = theirs.name
    assert mine == theirs


def test_our_classes_live_apart_from_chakras_generated_module() -> None:
    assert ours.DESCRIPTOR.pool is not chakra_pb.DESCRIPTOR.pool
    assert ours.Node is not chakra_pb.Node


def _assert_same_values(mine: Any, theirs: Any, where: str = "") -> None:
    """Every field of Chakra's descriptor has the same value in both messages; nothing is left unknown."""
    d = theirs.DESCRIPTOR
    where = where or d.name
    assert mine.DESCRIPTOR.full_name == d.full_name, where
    assert len(UnknownFieldSet(mine)) == 0, f"{where}: fields our schema does not know"
    assert len(UnknownFieldSet(theirs)) == 0, f"{where}: fields Chakra's schema does not know"
    for o in d.oneofs:
        assert mine.WhichOneof(o.name) == theirs.WhichOneof(o.name), f"{where}.{o.name}"
    for f in d.fields:
        a, b = getattr(mine, f.name), getattr(theirs, f.name)
        at = f"{where}.{f.name}"
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.is_repeated:
            assert len(a) == len(b), at
            for k, (x, y) in enumerate(zip(a, b, strict=True)):
                _assert_same_values(x, y, f"{at}[{k}]")
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            assert mine.HasField(f.name) == theirs.HasField(f.name), at
            if theirs.HasField(f.name):
                _assert_same_values(a, b, at)
        elif f.is_repeated:
            assert list(a) == list(b), at
        else:
            assert a == b, at


def _trace_nodes() -> list[TraceNode]:
    groups = [ProcessGroupInfo(name="0", desc="default_pg", backend="gloo", ranks=(0, 1))]
    return [
        pg_init_node(groups),
        TraceNode(
            node_id=1,
            name="aten::mm",
            node_type=NodeType.COMP,
            start_ns=1_234_567,
            dur_ns=89_001,
            ctrl_deps=(0,),
            inputs_values="[[2, 3]]",
            inputs_shapes="[[64, 64]]",
            inputs_types="['Tensor(float)']",
            attrs={"flag": True, "neg": -(1 << 40), "ratio": 0.25, "note": "é", "ints": [1, -2, 3]},
        ),
        TraceNode(
            node_id=(1 << 64) - 1,
            name="c10d::allreduce_",
            node_type=NodeType.COMM_COLL,
            start_ns=(1 << 62) + 7,
            dur_ns=999,
            ctrl_deps=(1,),
            data_deps=(0, 1),
            attrs={"comm_type": int(CommType.ALL_REDUCE), "comm_size": 1 << 20, "tags": ["a", "b"]},
        ),
    ]


def test_chakras_reader_reads_our_file_with_identical_field_values(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.et"
    meta = {"rank": 0, "world_size": 2, "run": "r1"}
    assert write_et(path, _trace_nodes(), meta) == 3
    gm, theirs = read_with_chakra(path)

    mine = read_et(path)
    assert [n.name for n in theirs] == ["## process_group:init ##", "aten::mm", "c10d::allreduce_"]
    for m, t in zip(mine.nodes, theirs, strict=True):
        _assert_same_values(m, t)
    assert {a.name: getattr(a, a.WhichOneof("value")) for a in gm.attr} == {
        "schema": "skewlens-chakra-1",
        **meta,
    }
    assert gm.version == mine.metadata["version"]

    mm, ar = theirs[1], theirs[2]
    assert (mm.id, mm.type, list(mm.ctrl_deps)) == (1, chakra_pb.COMP_NODE, [0])
    assert (mm.start_time_micros, mm.duration_micros) == (1234, 89)
    assert (mm.inputs.values, mm.inputs.shapes, mm.inputs.types) == (
        "[[2, 3]]",
        "[[64, 64]]",
        "['Tensor(float)']",
    )
    attrs = {a.name: a for a in mm.attr}
    assert attrs["skl_start_ns"].int64_val == 1_234_567 and attrs["skl_dur_ns"].int64_val == 89_001
    assert attrs["flag"].WhichOneof("value") == "bool_val" and attrs["flag"].bool_val is True
    assert attrs["neg"].int64_val == -(1 << 40)
    assert attrs["ratio"].double_val == 0.25
    assert attrs["note"].string_val == "é"
    assert list(attrs["ints"].int64_list.values) == [1, -2, 3]
    assert (ar.id, ar.type, list(ar.data_deps)) == ((1 << 64) - 1, chakra_pb.COMM_COLL_NODE, [0, 1])
    assert list({a.name: a for a in ar.attr}["tags"].string_list.values) == ["a", "b"]


def _every_attribute_kind() -> list[Any]:
    """One Chakra ``AttributeProto`` per value kind of the oneof, scalar and list."""
    samples: dict[str, tuple[Any, Any]] = {
        "double": (-2.5, [0.5, math.inf]),
        "float": (0.75, [1.5, -3.0]),
        "int32": (-(1 << 31), [-1, (1 << 31) - 1]),
        "int64": (-(1 << 63), [(1 << 63) - 1, -5]),
        "uint32": ((1 << 32) - 1, [0, 7]),
        "uint64": ((1 << 64) - 1, [1, 1 << 40]),
        "sint32": (-7, [-(1 << 31), 9]),
        "sint64": (-(1 << 50), [3, -3]),
        "fixed32": ((1 << 32) - 2, [5, 6]),
        "fixed64": ((1 << 64) - 2, [8, 9]),
        "sfixed32": (-11, [12, -13]),
        "sfixed64": (-(1 << 60), [14, -15]),
        "bool": (True, [True, False, True]),
        "string": ("ünïcode", ["x", ""]),
        "bytes": (b"\x00\xff", [b"a", b""]),
    }
    assert set(samples) == {stem for stem, _ in ours.ATTRIBUTE_KINDS}
    out = []
    for stem, (scalar, values) in samples.items():
        a = chakra_pb.AttributeProto(name=f"{stem}_val", doc_string=f"a {stem}")
        setattr(a, f"{stem}_val", scalar)
        out.append(a)
        b = chakra_pb.AttributeProto(name=f"{stem}_list")
        getattr(b, f"{stem}_list").values.extend(values)
        out.append(b)
    return out


def _chakra_made_node() -> Any:
    node = chakra_pb.Node(
        id=(1 << 64) - 1,
        name="chakra-made",
        type=chakra_pb.COMM_RECV_NODE,
        ctrl_deps=[1, 2, 1 << 40],
        data_deps=[3],
        start_time_micros=123,
        duration_micros=(1 << 64) - 1,
    )
    node.inputs.values, node.inputs.shapes, node.inputs.types = "[1]", "[[2]]", "['int']"
    node.outputs.values, node.outputs.shapes, node.outputs.types = "[4]", "[[5]]", "['float']"
    node.attr.extend(_every_attribute_kind())
    return node


def test_bytes_made_with_chakras_classes_decode_with_ours_field_for_field() -> None:
    theirs = _chakra_made_node()
    raw = theirs.SerializeToString()
    mine = ours.Node()
    mine.ParseFromString(raw)
    _assert_same_values(mine, theirs)
    assert mine.SerializeToString() == raw

    gm = chakra_pb.GlobalMetadata(version="0.0.4", attr=_every_attribute_kind())
    mine_gm = ours.GlobalMetadata.FromString(gm.SerializeToString())
    _assert_same_values(mine_gm, gm)

    tensor = chakra_pb.Tensor(tensor_id=1, storage_id=2, offset=3, num_elem=4, elem_bytes=2, device="cuda:0")
    _assert_same_values(ours.Tensor.FromString(tensor.SerializeToString()), tensor)


def test_bytes_made_with_our_classes_decode_with_chakras_field_for_field() -> None:
    mine = ours.Node.FromString(_chakra_made_node().SerializeToString())
    mine.attr.add(name="late").string_list.values.extend(["p", "q"])
    theirs = chakra_pb.Node.FromString(mine.SerializeToString())
    _assert_same_values(mine, theirs)


def test_a_gzipped_file_written_by_chakras_encoder_reads_with_ours(tmp_path: Path) -> None:
    nodes = [_chakra_made_node(), chakra_pb.Node(id=2, name="mm", type=chakra_pb.COMP_NODE, ctrl_deps=[1])]
    buf = io.BytesIO()
    encodeMessage(buf, chakra_pb.GlobalMetadata(version="0.0.4", attr=_every_attribute_kind()[:4]))
    for n in nodes:
        encodeMessage(buf, n)
        assert encode_message(ours.Node.FromString(n.SerializeToString())) == encode_message(n)
    path = tmp_path / "chakra.et"
    path.write_bytes(gzip.compress(buf.getvalue()))

    et = read_et(path)
    assert et.metadata["version"] == "0.0.4"
    assert et.metadata["double_val"] == -2.5 and et.metadata["float_list"] == [1.5, -3.0]
    for m, t in zip(et.nodes, nodes, strict=True):
        _assert_same_values(m, t)


def test_our_writer_takes_chakras_own_node_messages(tmp_path: Path) -> None:
    path = tmp_path / "mixed.et"
    theirs = _chakra_made_node()
    write_et(path, [theirs, _trace_nodes()[1]])
    _gm, back = read_with_chakra(path)
    _assert_same_values(back[0], theirs)
    assert back[1].name == "aten::mm"


def test_no_runtime_module_imports_chakra() -> None:
    from package_imports import ROOT, absolute_imports

    imports = list(absolute_imports())
    assert len({path for path, _line, _module in imports}) > 50
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path, line, module in imports
        if module.split(".")[0] == "chakra"
    ]
    assert offenders == [], "runtime code must use skewlens.profiler.chakra_schema, not mlc-chakra"
