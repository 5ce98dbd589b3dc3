"""Our default ``.et`` follows Chakra's conventions where that loses nothing: a communication node has
``is_cpu_op`` false (Chakra's converter writes that, ASTRA-sim requires it), and where it ran is kept in
``skl_host_op``; traces written before that load exactly as they did."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as chakra_pb
from chakra.schema.protobuf.et_def_pb2 import Node
from chakra.src.third_party.utils.protolib import encodeMessage
from chakra_reader import read_with_chakra

from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import TraceNode, as_comm_node, node_attrs, read_et, set_attr, write_et
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.manifest import rank_file
from skewlens.profiler.store import load_run
from skewlens.profiler.store.load import load_rank
from skewlens.profiler.store.parquet import export_run
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import Attr, CommType, NodeType
from skewlens.replay.export_astra import export_astra_sim

COMM = (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV)


def _run(tmp_path: Path) -> Path:
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(1)
        rb.compute("aten::mm", 1000 + r)
        rb.collective(CommType.ALL_REDUCE, 4096, 300)
    b.rank(0).send(1, 256, 50)
    b.rank(1).recv(0, 256, 50)
    return b.write(tmp_path / "run")


def _attrs(n: Node) -> dict[str, object]:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr}


def test_comm_nodes_read_by_chakras_reader_are_not_cpu_ops_and_say_they_ran_on_the_host(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    for r in (0, 1):
        _gm, nodes = read_with_chakra(rank_file(run, r))
        comm = [n for n in nodes if n.type in COMM]
        comp = [n for n in nodes if n.type == NodeType.COMP]
        assert len(comm) == 2 and comp
        assert all(_attrs(n)["is_cpu_op"] is False and _attrs(n)[Attr.HOST_OP] is True for n in comm)
        assert all(_attrs(n)["is_cpu_op"] is True and Attr.HOST_OP not in _attrs(n) for n in comp)


def test_as_comm_node_keeps_a_gpu_placement_and_defaults_to_the_host() -> None:
    assert as_comm_node({Attr.IS_CPU_OP: False}) == {Attr.IS_CPU_OP: False, Attr.HOST_OP: False}
    assert as_comm_node({Attr.IS_CPU_OP: True}) == {Attr.IS_CPU_OP: False, Attr.HOST_OP: True}
    assert as_comm_node({}) == {Attr.IS_CPU_OP: False, Attr.HOST_OP: True}
    assert as_comm_node({Attr.HOST_OP: False, Attr.IS_CPU_OP: True})[Attr.HOST_OP] is False


def _as_old_style(path: Path) -> None:
    """Rewrite a trace as written before: comm nodes with is_cpu_op true and no skl_host_op."""
    et = read_et(path)
    for n in et.nodes:
        if n.type in COMM:
            kept = [a for a in n.attr if a.name != Attr.HOST_OP]
            del n.attr[:]
            n.attr.extend(kept)
            next(a for a in n.attr if a.name == Attr.IS_CPU_OP).bool_val = True
    write_et(path, et.nodes, metadata=et.metadata)


def test_a_trace_written_before_the_convention_loads_to_the_same_store(tmp_path: Path) -> None:
    new = load_run(_run(tmp_path / "new"))
    old_dir = _run(tmp_path / "old")
    for r in (0, 1):
        _as_old_style(rank_file(old_dir, r))
        assert all(node_attrs(n).get(Attr.HOST_OP) is None for n in read_et(rank_file(old_dir, r)).nodes)
    old = load_run(old_dir)
    for r in (0, 1):
        a, b = new.ranks[r], old.ranks[r]
        assert a.is_cpu.all() and np.array_equal(a.is_cpu, b.is_cpu)
        assert np.array_equal(a.node_type, b.node_type) and np.array_equal(a.start_ns, b.start_ns)
    assert len(new.collectives) == len(old.collectives) == 1 and len(new.p2p) == len(old.p2p) == 1


def test_a_gpu_comm_node_is_not_a_host_op_for_either_decoder(tmp_path: Path) -> None:
    node = TraceNode(
        node_id=1,
        name="ncclDevKernel_AllReduce",
        node_type=NodeType.COMM_COLL,
        start_ns=10,
        dur_ns=5,
        attrs=as_comm_node(
            {Attr.IS_CPU_OP: False, Attr.COMM_TYPE: int(CommType.ALL_REDUCE), Attr.COMM_SIZE: 8, Attr.SEQ: 0}
        ),
    )
    host = TraceNode(node_id=2, name="aten::mm", node_type=NodeType.COMP, start_ns=0, dur_ns=5)
    path = tmp_path / "rank-0.et"
    write_et(path, [host, node])
    for decoder in ("vectorised", "reference"):
        rt = load_rank(path, 0, [], {}, decoder=decoder)
        assert rt.is_cpu.tolist() == [True, False], decoder


def test_p2p_peers_and_tag_are_int32_values_as_chakras_feeder_reads_them_and_load_the_same(
    tmp_path: Path,
) -> None:
    b = RunBuilder(2)
    b.rank(1).step(1).send(0, 256, 50, tag=9)
    b.rank(0).step(1).recv(1, 256, 50, tag=9)
    run = b.write(tmp_path / "run")
    for r, kind in ((1, NodeType.COMM_SEND), (0, NodeType.COMM_RECV)):
        _gm, nodes = read_with_chakra(rank_file(run, r))
        (p2p,) = [n for n in nodes if n.type == kind]
        # Chakra's et_feeder_node.cpp: comm_src_ = attr.int32_val() (0 for a value written as int64_val)
        peers = {a.name: (a.WhichOneof("value"), a.int32_val) for a in p2p.attr if a.name.startswith("comm_")}
        assert {k: peers[k] for k in ("comm_src", "comm_dst", "comm_tag")} == {
            "comm_src": ("int32_val", 1),
            "comm_dst": ("int32_val", 0),
            "comm_tag": ("int32_val", 9),
        }
        assert peers["comm_size"][0] == "int64_val"  # as Chakra's converter writes it
        for decoder in ("vectorised", "reference"):
            rt = load_rank(rank_file(run, r), r, [], {}, decoder=decoder)
            row = rt.node_type.tolist().index(int(kind))
            assert (rt.src[row], rt.dst[row], rt.tag[row]) == (1, 0, 9), decoder


def _converter_trace(tmp_path: Path, groups: list[dict[str, object]], *, idle_ranks: int = 0) -> Path:
    """Two ranks as Chakra's converter writes a PyTorch host trace: the process-group node, then one
    all_reduce on group "1"; then ``idle_ranks`` more ranks with the process-group node alone."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in range(2 + idle_ranks):
        with (tmp_path / f"trace.{r}.et").open("wb") as fh:
            encodeMessage(fh, chakra_pb.GlobalMetadata())
            meta = chakra_pb.Node(id=2, name="## process_group:init ##", type=chakra_pb.METADATA_NODE)
            # pytorch_converter.py: protobuf_node.inputs.values = str(json_node.inputs["values"])
            meta.inputs.values = str([json.dumps(groups)])
            encodeMessage(fh, meta)
            if r >= 2:
                continue
            coll = chakra_pb.Node(id=3, name="ncclKernel_AllReduce", type=chakra_pb.COMM_COLL_NODE)
            coll.attr.extend(
                [
                    chakra_pb.AttributeProto(name="is_cpu_op", bool_val=False),
                    chakra_pb.AttributeProto(name="comm_type", int64_val=chakra_pb.ALL_REDUCE),
                    chakra_pb.AttributeProto(name="comm_size", int64_val=1024),
                    chakra_pb.AttributeProto(name="pg_name", string_val="1"),
                ]
            )
            encodeMessage(fh, coll)
    return tmp_path


def _pg(name: str, desc: str, ranks: list[int]) -> dict[str, object]:
    return {"pg_name": name, "pg_desc": desc, "backend_config": "cuda:nccl", "ranks": ranks, "group_size": 2}


def test_process_groups_in_the_form_chakras_converter_writes_them_load(tmp_path: Path) -> None:
    run = load_run(
        _converter_trace(tmp_path, [_pg("0", "default_pg", [0, 1]), _pg("1", "undefined", [0, 1])])
    )
    assert {k: (g.ranks, g.desc) for k, g in run.process_groups.items()} == {
        "0": ((0, 1), "default_pg"),
        "1": ((0, 1), "undefined"),
    }
    assert [c.pg_name for c in run.collectives] == ["1"]


def test_process_groups_in_the_converters_form_load_whatever_their_descriptions_hold(tmp_path: Path) -> None:
    # Python prints the JSON string with its quotes and backslashes escaped: read back as written, not by
    # dropping two characters at each end (the apostrophe's escape refused the trace; the non-ASCII
    # character, which JSON writes as a \u escape, read as that escape's 6 characters)
    descs = ["bob's group", "caf\u00e9", 'a "quoted" \\ name']
    groups = [_pg("0", "default_pg", [0, 1]), *(_pg(str(i), d, [0, 1]) for i, d in enumerate(descs, 1))]
    run = load_run(_converter_trace(tmp_path, groups))
    assert [run.process_groups[str(i)].desc for i in range(1, 4)] == descs


def test_a_group_pytorch_lists_with_no_ranks_spans_the_world_in_the_load_and_the_astra_sim_export(
    tmp_path: Path,
) -> None:
    # torch's execution-trace observer (_World.pg_config_info) writes "ranks": [] for a group of every rank
    run_dir = _converter_trace(tmp_path / "run", [_pg("0", "default_pg", []), _pg("1", "undefined", [])])
    run = load_run(run_dir)
    assert {k: g.ranks for k, g in run.process_groups.items()} == {"0": (0, 1), "1": (0, 1)}
    assert [(c.pg_name, c.ranks) for c in run.collectives] == [("1", (0, 1))]
    export_astra_sim(run_dir, tmp_path / "astra")
    assert json.loads((tmp_path / "astra" / "comm_groups.json").read_text()) == {"1": [0, 1]}


def test_a_group_pytorch_lists_with_no_ranks_spans_the_world_in_the_parquet_export_too(
    tmp_path: Path,
) -> None:
    # three ranks, the all_reduce of group "1" (listed with no ranks: the world) on ranks 0 and 1 alone:
    # rank 2 is a member that never issued it, which the loader refuses and the export must refuse alike
    # (read as a group of no members, the export matched the two calls as a whole instance)
    run_dir = _converter_trace(
        tmp_path / "run", [_pg("0", "default_pg", []), _pg("1", "undefined", [])], idle_ranks=1
    )
    missing = "collective mismatch in group '1' seq 0: rank 2 has no such collective"
    assert [i.message.split(" (")[0] for i in validate_run(run_dir).errors] == [missing]
    with pytest.raises(SkewlensError, match=rf"not exported, 1 problem\(s\): {missing}"):
        export_run(run_dir, tmp_path / "pq", workers=1)
    assert not (tmp_path / "pq").exists()


def test_a_tag_past_int32_stays_an_int64_value_and_loads_whole(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).step(1).send(1, 8, 5, tag=1 << 40)
    path = rank_file(b.write(tmp_path / "run"), 0)
    _gm, nodes = read_with_chakra(path)
    (send,) = [n for n in nodes if n.type == NodeType.COMM_SEND]
    kinds = {a.name: a.WhichOneof("value") for a in send.attr}
    assert [kinds[k] for k in ("comm_src", "comm_dst", "comm_tag")] == ["int32_val", "int32_val", "int64_val"]
    for decoder in ("vectorised", "reference"):
        rt = load_rank(path, 0, [], {}, decoder=decoder)
        assert rt.tag[rt.node_type == NodeType.COMM_SEND].tolist() == [1 << 40], decoder


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ((1 << 31) - 1, "int32_val"),
        (-(1 << 31), "int32_val"),
        (1 << 31, "int64_val"),
        (-(1 << 31) - 1, "int64_val"),
    ],
)
def test_a_peer_or_tag_is_an_int32_value_up_to_int32s_bounds_and_an_int64_value_past_them(
    value: int, kind: str
) -> None:
    for name in (Attr.COMM_SRC, Attr.COMM_DST, Attr.COMM_TAG):
        n = pb.Node(id=1)
        set_attr(n, name, value)
        (a,) = n.attr
        assert (a.WhichOneof("value"), getattr(a, kind)) == (kind, value)
        assert node_attrs(n) == {name: value}
