"""Communication found however a Kineto trace says it (issue 16).

Small documents built here, with the key shapes of the real files (``nccl_2gpu``'s kernel and
``record_param_comms`` args, ``nccl_16gpu``'s annotations and ``c10d::`` ops, old ``ncclKernel_`` and new
``ncclDevKernel_`` names), one per form; then the real traces in ../shared/traces, whose NCCL kernels
are counted here straight from the JSON.
"""

from __future__ import annotations

import gzip
import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest

from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers import import_traces
from skewlens.profiler.importers.comm import p2p_from_op
from skewlens.profiler.importers.convert import _cut_shown, _strided_ranks
from skewlens.profiler.importers.kineto import cut_ranks_text, ranks_text
from skewlens.profiler.manifest import MAX_WORLD_SIZE, read_manifest
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import COMM_NODE_TYPES, Attr, CommType, NodeType, collective_from_op

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
PID = 4515
#: How the manifest notes begin for an NCCL kernel left as compute (the reason follows).
KEPT = "NCCL kernel(s) of unknown collective/peer kept as GPU COMP: "
OLD_ARGS = "(ncclDevComm*, unsigned long, ncclWork*)"
NEW_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
OLD_SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" + OLD_ARGS
NEW_SENDRECV = "ncclDevKernel_SendRecv" + NEW_ARGS
CORR = 869830


def _doc(
    kernel: str,
    *,
    kernel_args: dict[str, Any] | None = None,
    rpc: dict[str, Any] | None = None,
    annotation: tuple[str, dict[str, Any]] | None = None,
    op: tuple[str, dict[str, Any]] | None = None,
    launch: bool = True,
    rank: int = 0,
    world: int = 2,
) -> dict[str, Any]:
    """One communication op, nested as the profiler records it: ``c10d::`` op > ``record_param_comms`` >
    ``nccl:*`` annotation > ``cudaLaunchKernel``, then its kernel on stream 7 (each part optional)."""
    cpu = {"ph": "X", "pid": PID, "tid": PID}
    ev: list[dict[str, Any]] = [
        {**cpu, "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 0, "dur": 1000, "args": {}}
    ]
    if op is not None:
        ev.append({**cpu, "cat": "cpu_op", "name": op[0], "ts": 10, "dur": 100, "args": op[1]})
    if rpc is not None:
        ev.append({**cpu, "cat": "cpu_op", "name": "record_param_comms", "ts": 12, "dur": 96, "args": rpc})
    if annotation is not None:
        ev.append({**cpu, "cat": "user_annotation", "name": annotation[0], "ts": 15, "dur": 80,
                   "args": annotation[1]})  # fmt: skip
    if launch:
        ev.append({**cpu, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 5,
                   "args": {"External id": CORR, "correlation": CORR}})  # fmt: skip
    args = {"External id": CORR, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": CORR,
            "grid": [24, 1, 1], "block": [544, 1, 1]} | (kernel_args or {})  # fmt: skip
    ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 30, "dur": 40.5,
               "args": args})  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}  # fmt: skip


def _import(tmp_path: Path, doc: dict[str, Any]) -> tuple[list[Any], dict[str, str]]:
    f = tmp_path / "trace.json"
    f.write_text(json.dumps(doc))
    m = import_traces([f], None, tmp_path / "run")
    rank = doc["distributedInfo"]["rank"]
    return read_et(tmp_path / "run" / f"rank-{rank}.et").nodes, m.notes


def _the_kernel(nodes: list[Any]) -> tuple[Any, dict[str, Any]]:
    (k,) = (n for n in nodes if n.name.startswith("nccl") and node_attrs(n)[Attr.STREAM_KIND] == "cuda")
    return k, node_attrs(k)


def _rpc_args(name: str, nelems_in: int, nelems_out: int, dtype: str, pg: str, ranks: str) -> dict[str, Any]:
    """``record_param_comms`` args as a newer Kineto writes them (the 2-GPU trace's key set)."""
    n = len(json.loads(ranks))
    return {"External id": 2099, "Record function id": 1959, "Process Group Name": pg,
            "Global rank stride": 1, "Out msg nelems": nelems_out, "Process Group Ranks": ranks,
            "Group size": n, "Global rank start": 0, "Ev Idx": 50, "In msg nelems": nelems_in,
            "In split size": "[]", "Out split size": "[]", "dtype": dtype,
            "Process Group Description": "undefined", "Collective name": name}  # fmt: skip


def _dims(*shapes: list[int], dtype: str = "float") -> dict[str, Any]:
    return {
        "External id": 240,
        "Ev Idx": 239,
        "Input Dims": list(shapes),
        "Input type": [dtype] * len(shapes),
    }


# --- the vocabulary ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ct"),
    [
        ("c10d::_allgather_base_", CommType.ALL_GATHER),
        ("nccl:_all_gather_base", CommType.ALL_GATHER),
        ("c10d::allgather_into_tensor_coalesced_", CommType.ALL_GATHER),
        ("nccl:all_gather_into_tensor_coalesced", CommType.ALL_GATHER),
        ("_c10d_functional::all_gather_into_tensor", CommType.ALL_GATHER),
        ("c10d::_reduce_scatter_base_", CommType.REDUCE_SCATTER),
        ("nccl:_reduce_scatter_base", CommType.REDUCE_SCATTER),
        ("c10d::reduce_scatter_tensor_coalesced_", CommType.REDUCE_SCATTER),
        ("c10d::alltoall_base_", CommType.ALL_TO_ALL),
        ("c10d::alltoall_", CommType.ALL_TO_ALL),
        ("all_to_all", CommType.ALL_TO_ALL),
        ("all_to_allv", CommType.ALL_TO_ALL),
        ("_c10d_functional::all_to_all_single", CommType.ALL_TO_ALL),
        ("nccl:all_reduce_coalesced", CommType.ALL_REDUCE),
        ("nccl:_broadcast_oop", CommType.BROADCAST),
        ("nccl:_reduce_oop", CommType.REDUCE),
    ],
)
def test_every_spelling_of_a_collective_names_its_type(name: str, ct: CommType) -> None:
    assert collective_from_op(name) == ct


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("c10d::send", ("send", None)),
        ("c10d::recv_", ("recv", None)),
        ("c10d::recv_any_source_", ("recv", None)),
        ("recvAnysource", ("recv", None)),
        ("nccl:send", ("send", None)),
        ("nccl:send 0->3", ("send", 3)),
        ("nccl:recv 3<-0", ("recv", 0)),
        ("nccl:all_to_all", None),
        ("c10d::_allgather_base_", None),
    ],
)
def test_point_to_point_ops_are_told_by_name_with_the_peer_where_the_name_has_it(
    name: str, kind: tuple[str, int | None] | None
) -> None:
    assert p2p_from_op(name) == kind
    assert collective_from_op(name) is None or kind is None


# --- one form each ------------------------------------------------------------------------------------


def test_a_kernel_with_collective_name_args_is_that_collective_with_its_size_and_group(
    tmp_path: Path,
) -> None:
    kargs = _rpc_args("allreduce", 6637568, 6637568, "BFloat16", "3", "[0, 1]")
    nodes, _ = _import(tmp_path, _doc("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",
                                      kernel_args=kargs))  # fmt: skip
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMM_COLL
    assert (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (CommType.ALL_REDUCE, 6637568 * 2, "3")


def test_record_param_comms_args_give_type_input_size_and_group_to_a_sendrecv_kernel(tmp_path: Path) -> None:
    rpc = _rpc_args("reduce_scatter_tensor_coalesced", 1048576, 524288, "Float", "5", "[0, 1]")
    doc = _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:reduce_scatter_tensor_coalesced", {"Ev Idx": 51}))
    nodes, _ = _import(tmp_path, doc)
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMM_COLL
    # the input buffer (In msg nelems), not the output shard
    assert (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (
        CommType.REDUCE_SCATTER,
        1048576 * 4,
        "5",
    )


def test_an_nccl_annotation_with_input_dims_gives_type_and_the_sum_of_its_input_tensors(
    tmp_path: Path,
) -> None:
    ann = ("nccl:all_gather_into_tensor_coalesced", _dims([1024, 8], [512], dtype="c10::BFloat16"))
    nodes, _ = _import(tmp_path, _doc(NEW_SENDRECV, annotation=ann))
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMM_COLL
    assert (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (
        CommType.ALL_GATHER,
        (8192 + 512) * 2,
        "0",
    )


@pytest.mark.parametrize("with_annotation", [True, False])
def test_an_allgather_base_op_without_record_param_comms_is_an_all_gather_of_its_input_shard(
    tmp_path: Path, with_annotation: bool
) -> None:
    # as in nccl_16gpu / a2a_128gpu: c10d::_allgather_base_(output, input, ...), no record_param_comms args
    op = ("c10d::_allgather_base_", {"External id": 3017, "Ev Idx": 13550,
          "Input Dims": [[65536, 64], [8192, 64], []], "Input type": ["float", "float", ""]})  # fmt: skip
    ann = ("nccl:_all_gather_base", _dims([8192, 64])) if with_annotation else None
    nodes, notes = _import(tmp_path, _doc(OLD_SENDRECV, op=op, annotation=ann))
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMM_COLL
    assert (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (
        CommType.ALL_GATHER,
        8192 * 64 * 4,
        "0",
    )
    assert "unknown collective" not in " ".join(notes.values())


@pytest.mark.parametrize("kernel", [OLD_SENDRECV, NEW_SENDRECV])
@pytest.mark.parametrize("said_by", ["kernel args", "record_param_comms", "annotation", "c10d op"])
def test_a_sendrecv_kernel_that_is_an_all_to_all_is_an_all_to_all_collective(
    tmp_path: Path, kernel: str, said_by: str
) -> None:
    n = 384
    parts: dict[str, Any] = {
        "kernel args": {"kernel_args": _rpc_args("all_to_allv", n, 2 * n, "Long", "0", "[0, 1]")},
        "record_param_comms": {"rpc": _rpc_args("all_to_all", n, n, "Long", "0", "[0, 1]")},
        "annotation": {"annotation": ("nccl:all_to_all", _dims([n], dtype="long"))},
        "c10d op": {"op": ("c10d::alltoall_base_", {"Input Dims": [[2 * n], [n], [], [], [], []],
                    "Input type": ["long", "long", "", "", "", "Scalar"]})},
    }  # fmt: skip
    nodes, _ = _import(tmp_path, _doc(kernel, **parts[said_by]))
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMM_COLL
    assert (a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (CommType.ALL_TO_ALL, n * 8, "0")


@pytest.mark.parametrize(
    ("kernel", "ct"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float" + OLD_ARGS, CommType.ALL_REDUCE),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL" + NEW_ARGS, CommType.ALL_REDUCE),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t" + OLD_ARGS, CommType.ALL_GATHER),
        ("ncclDevKernel_AllGather_RING_LL" + NEW_ARGS, CommType.ALL_GATHER),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_float" + OLD_ARGS, CommType.REDUCE_SCATTER),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL" + NEW_ARGS, CommType.REDUCE_SCATTER),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t" + OLD_ARGS, CommType.BROADCAST),
        ("ncclDevKernel_Broadcast_RING_LL" + NEW_ARGS, CommType.BROADCAST),
        ("ncclKernel_Reduce_RING_LL_Sum_float" + OLD_ARGS, CommType.REDUCE),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL" + NEW_ARGS, CommType.REDUCE),
        ("ncclKernel_AllToAllPivot_RING_SIMPLE_Sum_int8_t" + OLD_ARGS, CommType.ALL_TO_ALL),
    ],
)
def test_old_and_new_kernel_names_alone_say_the_collective(tmp_path: Path, kernel: str, ct: CommType) -> None:
    nodes, _ = _import(tmp_path, _doc(kernel, launch=False))
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) == (NodeType.COMM_COLL, ct, 0)


@pytest.mark.parametrize("kernel", [OLD_SENDRECV, NEW_SENDRECV, "ncclDevKernel_Generic_1" + NEW_ARGS])
def test_a_kernel_whose_name_does_not_say_the_op_and_whose_launch_is_missing_stays_compute_with_the_reason(
    tmp_path: Path, kernel: str
) -> None:
    nodes, notes = _import(tmp_path, _doc(kernel, launch=False))
    k, _ = _the_kernel(nodes)
    assert k.type == NodeType.COMP
    kind = kernel.split("_")[1].split("(")[0]
    assert f"1 {KEPT}{kind} kernel(s) whose launch call is not in the trace" in notes["rank 0 import"]


# --- point-to-point -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "ann", "node_type", "src_dst"),
    [(0, "nccl:send 0->1", NodeType.COMM_SEND, (0, 1)), (1, "nccl:recv 1<-0", NodeType.COMM_RECV, (0, 1))],
)
def test_a_p2p_annotation_that_names_the_peer_makes_a_send_or_recv_node(
    tmp_path: Path, rank: int, ann: str, node_type: NodeType, src_dst: tuple[int, int]
) -> None:
    nodes, _ = _import(tmp_path, _doc(NEW_SENDRECV, annotation=(ann, _dims([256])), rank=rank))
    k, a = _the_kernel(nodes)
    assert (k.type, (a[Attr.COMM_SRC], a[Attr.COMM_DST]), a[Attr.COMM_SIZE]) == (node_type, src_dst, 1024)


def test_an_imported_sends_peers_and_tag_are_int32_values_as_chakras_feeder_reads_them(
    tmp_path: Path,
) -> None:
    # the importer's own encoder wrote them as int64_val, which Chakra's feeder (attr.int32_val()) reads as 0
    nodes, _ = _import(tmp_path, _doc(NEW_SENDRECV, annotation=("nccl:send 0->1", _dims([256]))))
    k, _a = _the_kernel(nodes)
    kinds = {a.name: (a.WhichOneof("value"), a.int32_val) for a in k.attr}
    assert [kinds[n] for n in (Attr.COMM_SRC, Attr.COMM_DST, Attr.COMM_TAG)] == [
        ("int32_val", 0),
        ("int32_val", 1),
        ("int32_val", 0),
    ]


def test_the_peer_of_a_c10d_recv_comes_from_its_concrete_inputs(tmp_path: Path) -> None:
    types = ["TensorList", "", "Scalar", "Scalar"]
    op = ("c10d::recv_", {"Input Dims": [[]] * 4, "Input type": types, "Concrete Inputs": ["", "", "1", "0"]})
    nodes, _ = _import(tmp_path, _doc(OLD_SENDRECV, op=op, annotation=("nccl:recv", _dims([256]))))
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.COMM_SRC], a[Attr.COMM_DST], a[Attr.COMM_SIZE]) == (NodeType.COMM_RECV, 1, 0, 1024)


def test_a_peer_given_as_a_group_rank_is_mapped_to_the_global_rank_through_the_group(tmp_path: Path) -> None:
    rpc = _rpc_args("send", 256, 256, "Float", "2", "[4, 6]")
    doc = _doc(NEW_SENDRECV, rpc=rpc, annotation=("nccl:send 0->1", _dims([256])), rank=4, world=8)
    nodes, _ = _import(tmp_path, doc)
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.COMM_SRC], a[Attr.COMM_DST], a[Attr.PG_NAME]) == (NodeType.COMM_SEND, 4, 6, "2")


@pytest.mark.parametrize(
    ("rank", "kind", "arg", "node_type", "src_dst"),
    [
        (4, "send", "Dst Rank", NodeType.COMM_SEND, (4, 6)),
        (6, "recv", "Src Rank", NodeType.COMM_RECV, (4, 6)),
    ],
)
def test_the_global_rank_of_a_p2ps_peer_in_its_dst_or_src_rank_arg_makes_a_send_or_recv_node(
    tmp_path: Path, rank: int, kind: str, arg: str, node_type: NodeType, src_dst: tuple[int, int]
) -> None:
    # newer torch (Kineto#963) writes the peer's global rank; with no peer in the annotation it was COMP
    rpc = _rpc_args(kind, 256, 256, "Float", "2", "[4, 6]") | {arg: 10 - rank}
    doc = _doc(NEW_SENDRECV, rpc=rpc, annotation=(f"nccl:{kind}", _dims([256])), rank=rank, world=8)
    nodes, _ = _import(tmp_path, doc)
    k, a = _the_kernel(nodes)
    assert (k.type, (a[Attr.COMM_SRC], a[Attr.COMM_DST]), a[Attr.PG_NAME]) == (node_type, src_dst, "2")


def test_a_p2p_whose_peer_the_trace_does_not_give_stays_compute_and_the_note_names_the_op(
    tmp_path: Path,
) -> None:
    nodes, notes = _import(tmp_path, _doc(OLD_SENDRECV, annotation=("nccl:send", _dims([256]))))
    k, a = _the_kernel(nodes)
    assert k.type == NodeType.COMP and a[Attr.IS_CPU_OP] is False
    assert f"1 {KEPT}nccl:send (send) without its peer rank" in notes["rank 0 import"]


# --- args as other torch versions write them -----------------------------------------------------------


def test_a_torch_2_1_record_param_comms_gives_its_size_as_in_msg_size_elements(tmp_path: Path) -> None:
    # torch 2.1 wrote the element count as "In msg size" (pytorch#114735 renamed it "In msg nelems"), with
    # no process group name; every collective of such a trace imported as 0 bytes
    rpc = {"Collective name": "allreduce", "dtype": "BFloat16", "In msg size": 6637568,
           "Out msg size": 6637568, "In split size": "[]", "Out split size": "[]", "Global rank start": 0,
           "Global rank stride": 1, "Group size": 2}  # fmt: skip
    nodes, _ = _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {})))
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.NUMEL], a[Attr.PG_NAME]) == (
        NodeType.COMM_COLL,
        CommType.ALL_REDUCE,
        6637568 * 2,
        6637568,
        "0",
    )


def test_a_collective_on_a_smaller_group_the_trace_does_not_name_is_kept_as_compute_with_a_note(
    tmp_path: Path,
) -> None:
    # torch 2.1's args give the group's size but not its name: the all_reduce of a 2-rank group in a 4-rank
    # world was put on the world group "0", to be matched with ranks that never ran it; it is kept as
    # compute, as other communication whose group or peer is unknown, and the manifest says why
    rpc = {"Collective name": "allreduce", "dtype": "Float", "In msg size": 256, "Out msg size": 256,
           "Global rank start": 2, "Global rank stride": 1, "Group size": 2}  # fmt: skip
    doc = _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), rank=2, world=4)
    nodes, notes = _import(tmp_path, doc)
    assert not [n for n in nodes if n.type in COMM_NODE_TYPES]
    assert (
        "allreduce on a group of 2 ranks (Group size) that the trace does not name" in notes["rank 2 import"]
    )
    # and check says so (the import note alone was in the manifest, where no one looks)
    assert notes["rank 2 communication groups"].startswith("collective(s) on a group smaller than the world")
    warned = [i.message for i in validate_run(tmp_path / "run").warnings if i.kind == "capture-note"]
    assert [m for m in warned if "does not name" in m]
    rpc["Group size"] = 4  # the world's size: the world group
    tmp_path = tmp_path / "world"
    tmp_path.mkdir()
    nodes, _ = _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=4))
    assert _the_kernel(nodes)[1][Attr.PG_NAME] == "0"


def test_a_rank_whose_trace_gives_no_size_for_a_collective_is_noted_as_check_warns_of(tmp_path: Path) -> None:
    # older torch without record_shapes: the kernel name alone says all_reduce; it imported as 0 bytes and
    # nothing said that the size was unknown rather than 0
    _nodes, notes = _import(tmp_path, _doc("ncclKernel_AllReduce_RING_LL_Sum_float" + OLD_ARGS))
    assert notes["rank 0 communication sizes"].startswith(
        "communication op(s) whose size the trace does not give"
    )
    warned = [
        i.kind for i in validate_run(tmp_path / "run").warnings if "size the trace does not" in i.message
    ]
    assert warned == ["capture-note"]
    (sized := tmp_path / "sized").mkdir()
    _nodes, notes = _import(sized, _doc(OLD_SENDRECV, annotation=("nccl:all_reduce", _dims([256]))))
    assert "rank 0 communication sizes" not in notes


EVEN_32 = tuple(range(0, 64, 2))  # a 32-rank group of a 64-rank world: more ranks than torch lists


@pytest.mark.parametrize(
    "cut",
    [
        "[" + ", ".join(map(str, EVEN_32[:30])) + ", ...]",  # torch's format_list: the first 30, then ...
        "[" + ", ".join(map(str, EVEN_32[:29])) + ", ..., 62]",  # newer: the first 29, ..., the last
    ],
)
def test_a_group_whose_ranks_torch_cut_short_takes_them_from_the_global_rank_start_and_stride(
    tmp_path: Path, cut: str
) -> None:
    # no pg_config (torch < 2.3, or an on-demand trace): the cut list was no group at all, and the import
    # stopped with "communication on process group(s) ['1'] that neither pg_config nor the events describe"
    rpc = _rpc_args("allreduce", 256, 256, "Float", "1", "[0, 2]") | {
        "Process Group Ranks": cut, "Group size": 32, "Global rank start": 0, "Global rank stride": 2
    }  # fmt: skip
    _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=64))
    groups = read_manifest(tmp_path / "run").process_groups
    assert {g.name: g.ranks for g in groups} == {"1": EVEN_32}


def _cut_group_rpc() -> dict[str, Any]:
    """An all_reduce on group '1', the 32 even ranks of 64, whose list torch cut at 30, without Global rank
    start / stride (torch writes none for unevenly spaced ranks)."""
    rpc = _rpc_args("allreduce", 256, 256, "Float", "1", "[0, 2]") | {
        "Process Group Ranks": "[" + ", ".join(map(str, EVEN_32[:30])) + ", ...]", "Group size": 32
    }  # fmt: skip
    del rpc["Global rank start"], rpc["Global rank stride"]
    return rpc


def test_a_group_whose_ranks_torch_cut_short_and_no_stride_gives_is_refused_naming_the_group(
    tmp_path: Path,
) -> None:
    rpc = _cut_group_rpc()
    with pytest.raises(TraceImportError) as e:
        _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=64))
    # it quoted the list's first 80 characters, cut mid-list: "(Process Group Ranks '[0, 2, ..., 38, 40, ':"
    assert str(e.value).endswith(
        "trace.json: rank 0: process group '1' lists only 30 of its 32 ranks (Process Group Ranks: 0 to 58, "
        "then '...'; torch writes at most 30), and neither distributedInfo.pg_config (torch >= 2.3 writes "
        "it) nor Global rank start / stride / Group size give the rest"
    )
    assert _cut_shown(EVEN_32[:29], (62,)) == "0 to 56, then '...', then 62"  # newer torch's form


def test_a_pg_config_whose_ranks_are_text_as_kinetos_own_distributed_info_writes_them_is_read(
    tmp_path: Path,
) -> None:
    # Kineto's on-demand distributedInfo (Kineto#956) writes "ranks": "[0, 1]"; it was 'malformed'
    doc = _doc("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    doc["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": "[0, 1]"},
        {"pg_name": "7", "pg_desc": "undefined", "backend_config": "cuda:nccl", "ranks": "[1]"},
    ]
    _import(tmp_path, doc)
    groups = read_manifest(tmp_path / "run").process_groups
    assert {g.name: g.ranks for g in groups} == {"0": (0, 1), "7": (1,)}


@pytest.mark.parametrize(
    ("dst_rank", "annotation"),
    [(0, "nccl:send"), (-1, "nccl:send 1->0")],  # -1: torch's 'no peer'; the annotation's group rank then
)
def test_a_dst_rank_of_0_is_rank_0_and_one_of_minus_1_leaves_the_peer_to_the_other_sources(
    tmp_path: Path, dst_rank: int, annotation: str
) -> None:
    rpc = _rpc_args("send", 256, 256, "Float", "2", "[0, 4]") | {"Dst Rank": dst_rank}
    doc = _doc(NEW_SENDRECV, rpc=rpc, annotation=(annotation, _dims([256])), rank=4, world=8)
    k, a = _the_kernel(_import(tmp_path, doc)[0])
    assert (k.type, a[Attr.COMM_SRC], a[Attr.COMM_DST]) == (NodeType.COMM_SEND, 4, 0)


def test_a_collective_on_a_named_group_smaller_than_the_world_is_that_groups_collective(
    tmp_path: Path,
) -> None:
    rpc = _rpc_args("allreduce", 256, 256, "Float", "5", "[0, 2]")  # Group size 2 of a 4-rank world
    nodes, notes = _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=4))
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.PG_NAME], a[Attr.COMM_SIZE]) == (NodeType.COMM_COLL, "5", 1024)
    assert "rank 0 communication groups" not in notes


def test_a_trace_without_a_world_size_keeps_an_unnamed_groups_collective_on_the_world_group(
    tmp_path: Path,
) -> None:
    # with no world size to compare Group size with, the import cannot tell a smaller group
    rpc = {"Collective name": "allreduce", "dtype": "Float", "In msg size": 256, "Group size": 2}
    doc = _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}))
    del doc["distributedInfo"]["world_size"]
    nodes, notes = _import(tmp_path, doc)
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.PG_NAME]) == (NodeType.COMM_COLL, "0")
    assert "rank 0 communication groups" not in notes


def test_a_send_whose_peer_is_known_and_size_is_not_is_noted_as_unsized(tmp_path: Path) -> None:
    _nodes, notes = _import(tmp_path, _doc(NEW_SENDRECV, annotation=("nccl:send 0->1", {})))
    assert notes["rank 0 communication sizes"].startswith("communication op(s) whose size the trace does not")


def test_a_group_whose_ranks_torch_cut_short_takes_them_from_pg_config_where_it_lists_them(
    tmp_path: Path,
) -> None:
    rpc = _cut_group_rpc()
    doc = _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=64)
    doc["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(64))},
        {"pg_name": "1", "pg_desc": "even", "ranks": list(EVEN_32)},
    ]
    _import(tmp_path, doc)
    assert {g.name: g.ranks for g in read_manifest(tmp_path / "run").process_groups}["1"] == EVEN_32


def test_a_cut_group_of_torchs_newer_form_without_a_group_size_is_refused_counting_what_it_lists(
    tmp_path: Path,
) -> None:
    rpc = _rpc_args("allreduce", 256, 256, "Float", "1", "[0, 2]") | {
        "Process Group Ranks": "[" + ", ".join(map(str, EVEN_32[:29])) + ", ..., 62]"
    }  # fmt: skip
    del rpc["Global rank start"], rpc["Global rank stride"], rpc["Group size"]
    with pytest.raises(TraceImportError) as e:
        _import(tmp_path, _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=64))
    assert (
        "process group '1' lists only 30 of its more ranks (Process Group Ranks: 0 to 56, then '...', then "
        "62; torch writes" in str(e.value)
    )


def test_a_cut_rank_list_of_one_rank_or_none_before_the_cut_is_shown_as_such() -> None:
    assert (_cut_shown((5,), ()), _cut_shown((), (62,))) == ("5, then '...'", "'...', then 62")


def test_a_cut_groups_ranks_come_from_start_and_stride_only_where_those_agree_with_every_rank_listed() -> (
    None
):
    def strided(start: int, stride: int, size: int, head: tuple[int, ...], tail: tuple[int, ...] = ()):
        args = {"Global rank start": start, "Global rank stride": stride, "Group size": size}
        return _strided_ranks(args, head, tail)

    assert strided(32, 1, 32, tuple(range(32, 62))) == tuple(range(32, 64))  # stride 1: the second half
    assert strided(0, 0, 32, (0,) * 30) is None  # stride 0 (was a range() ValueError)
    top = MAX_WORLD_SIZE - 31  # the last rank would be MAX_WORLD_SIZE, out of range
    assert strided(top, 1, 32, tuple(range(top, top + 30))) is None
    assert strided(0, 2, 32, tuple(range(30))) is None  # the listed ranks are not every second rank
    assert strided(0, 2, 32, EVEN_32[:29], (63,)) is None  # the last listed rank disagrees
    assert strided(0, 2, 30, tuple(range(0, 60, 2)), (58,)) is None  # more ranks listed than the group has


def test_rank_lists_are_read_only_as_torch_writes_them() -> None:
    assert ranks_text("[-1, 0]") is None and ranks_text(f"[0, {MAX_WORLD_SIZE}]") is None
    assert cut_ranks_text("[0, 2, ..., 62]") == ((0, 2), (62,))
    assert cut_ranks_text("(0, 2, ..., 62)") is None  # not a list
    assert cut_ranks_text("[0, ..., 4, ...]") is None  # two cuts (was a ValueError on int('...'))
    assert cut_ranks_text("[" + "9" * 5000 + ", ...]") is None  # was a ValueError past int's 4,300 digits


def test_a_pg_config_entry_whose_ranks_text_torch_cut_short_leaves_the_group_to_the_events(
    tmp_path: Path,
) -> None:
    # Kineto's on-demand distributedInfo cuts a long list as torch does: the entry says too little, the
    # event's Global rank start / stride / Group size give the ranks
    rpc = _rpc_args("allreduce", 256, 256, "Float", "1", "[0, 2]") | {
        "Process Group Ranks": "[" + ", ".join(map(str, EVEN_32[:30])) + ", ...]", "Group size": 32,
        "Global rank start": 0, "Global rank stride": 2,
    }  # fmt: skip
    doc = _doc(OLD_SENDRECV, rpc=rpc, annotation=("nccl:all_reduce", {}), world=64)
    cut = "[" + ", ".join(map(str, EVEN_32[:30])) + ", ...]"
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "1", "pg_desc": "even", "ranks": cut}]
    _import(tmp_path, doc)
    assert {g.name: g.ranks for g in read_manifest(tmp_path / "run").process_groups}["1"] == EVEN_32


# --- the real traces ----------------------------------------------------------------------------------

REAL = [
    pytest.param("dlrm_8gpu_kineto.tar.gz", marks=pytest.mark.slow),  # ~3.5 s to read and import
    pytest.param("nccl_2gpu_rank0_kineto.json.gz", marks=pytest.mark.slow),  # ~3.5 s
    pytest.param("nccl_16gpu_rank0_kineto.json.gz", marks=pytest.mark.slow),  # ~9 s
    "a2a_128gpu_sampled_rank0_kineto.json.gz",
    "a2a_128gpu_sampled_rank1_kineto.json.gz",
    "cuda_event_sync_kineto.json.gz",
    "cuda_event_sync_multistream_kineto.json.gz",
]


def _raw_docs(path: Path) -> list[dict[str, Any]]:
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tf:
            return [json.load(tf.extractfile(m)) for m in tf.getmembers() if m.name.endswith(".json")]  # type: ignore[arg-type]
    with gzip.open(path) as fh:
        return [json.load(fh)]


def _counted_from_the_file(doc: dict[str, Any]) -> tuple[int, int, int]:
    """(NCCL kernels, of them with their launch call in the file, ``nccl:*`` annotations that launch no
    NCCL kernel), read from the raw events."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    nccl = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    launched = [calls[k["args"]["correlation"]] for k in nccl if k["args"]["correlation"] in calls]
    anns = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    idle = [
        a for a in anns
        if not any(c["tid"] == a["tid"] and a["ts"] <= c["ts"] <= a["ts"] + a["dur"] for c in launched)
    ]  # fmt: skip
    return len(nccl), len(launched), len(idle)


@pytest.mark.parametrize("name", REAL)
def test_every_nccl_kernel_of_a_real_trace_whose_op_the_trace_shows_is_a_communication_node(
    tmp_path: Path, name: str
) -> None:
    if not SHARED.is_dir():
        pytest.skip(f"real GPU traces not found at {SHARED} (see shared/traces/README.md)")
    docs = _raw_docs(SHARED / name)
    single = "distributedInfo" not in docs[0]
    m = import_traces([SHARED / name], None, tmp_path / "run", rank=0 if single else None)
    for doc in docs:
        rank = 0 if single else doc["distributedInfo"]["rank"]
        nodes = read_et(tmp_path / "run" / f"rank-{rank}.et").nodes
        comm = [node_attrs(n) for n in nodes if n.type in COMM_NODE_TYPES]
        on_gpu = sum(a[Attr.STREAM_KIND] == "cuda" for a in comm)
        nccl_comp = sum(
            n.type == NodeType.COMP and n.name.startswith("nccl") and not node_attrs(n)[Attr.IS_CPU_OP]
            for n in nodes
        )
        kernels, launched, idle = _counted_from_the_file(doc)
        # every NCCL kernel launched in the window is a comm node; one whose launch is not in the file
        # (and whose name does not say the op) stays compute; an annotation that launched no kernel (a
        # zero-byte all-to-all) is a host comm node, so every rank counts the same collectives
        assert (on_gpu, nccl_comp, len(comm) - on_gpu) == (launched, kernels - launched, idle)
        if launched == kernels and idle == 0:
            assert len(comm) == kernels
    if name == "nccl_16gpu_rank0_kineto.json.gz":  # checked by hand against the file
        assert (kernels, launched, idle) == (80, 75, 10)
        assert f"5 {KEPT}SendRecv kernel(s) whose launch call is not in the trace" in m.notes["rank 0 import"]
    if name.startswith("a2a"):
        assert (kernels, launched, idle) == (10, 10, 0)


@pytest.mark.parametrize(
    "name", ["a2a_128gpu_sampled_rank0_kineto.json.gz", "a2a_128gpu_sampled_rank1_kineto.json.gz"]
)
def test_real_all_gather_base_ops_are_all_gathers_of_their_annotated_input(tmp_path: Path, name: str) -> None:
    if not SHARED.is_dir():
        pytest.skip(f"real GPU traces not found at {SHARED} (see shared/traces/README.md)")
    (doc,) = _raw_docs(SHARED / name)
    anns = sorted(
        (e for e in doc["traceEvents"] if e.get("name") == "nccl:_all_gather_base"), key=lambda e: e["ts"]
    )
    elem = {"signed char": 1, "float": 4}
    want = [elem[a["args"]["Input type"][0]] * math.prod(a["args"]["Input Dims"][0]) for a in anns]
    import_traces([SHARED / name], None, tmp_path / "run")
    rank = doc["distributedInfo"]["rank"]
    colls = [
        node_attrs(n)
        for n in read_et(tmp_path / "run" / f"rank-{rank}.et").nodes
        if n.type == NodeType.COMM_COLL
    ]
    got = sorted(
        (a[Attr.START_NS], a[Attr.COMM_SIZE]) for a in colls if a[Attr.COMM_TYPE] == CommType.ALL_GATHER
    )
    assert [s for _, s in got] == want and len(want) == 2
    assert "unknown collective" not in read_manifest(tmp_path / "run").notes.get(f"rank {rank} import", "")


@pytest.mark.parametrize(
    ("send", "recv", "want"),
    [
        # rank 1 of 3 sends 10, 300, 5 floats to ranks 0, 1, 2 and receives 7, 2, 9: its own chunk left out
        ("[10, 300, 5]", "[7, 2, 9]", (60, 64, [40, 1200, 20], [28, 8, 36])),
        ("[5, 5, 5]", "[5, 5, 5]", None),  # even: recorded as the capture records even splits, not at all
        ("[10, x, 5]", "[7, 2, 9]", None),  # not a list of counts
        ("[10, 300]", "[7, 2]", None),  # not one entry per member of the group
        ("[10, 300, 5]", "[7, 2]", None),  # ... on one side
    ],
)
def test_an_all_to_all_with_uneven_split_sizes_records_each_members_bytes_as_the_capture_does(
    tmp_path: Path, send: str, recv: str, want: tuple[int, int, list[int], list[int]] | None
) -> None:
    rpc = _rpc_args("all_to_allv", 315, 18, "Float", "0", "[0, 1, 2]") | {
        "In split size": send,
        "Out split size": recv,
    }
    nodes, _ = _import(tmp_path, _doc(NEW_SENDRECV, rpc=rpc, rank=1, world=3))
    k, a = _the_kernel(nodes)
    assert (k.type, a[Attr.COMM_TYPE]) == (NodeType.COMM_COLL, CommType.ALL_TO_ALL)
    keys = (Attr.SEND_BYTES, Attr.RECV_BYTES, Attr.SEND_SPLITS, Attr.RECV_SPLITS)
    got = tuple(list(a[x]) if isinstance(a.get(x), list | tuple) else a.get(x) for x in keys)
    assert got == (want or (None, None, None, None))


def test_an_all_to_all_kernel_whose_own_args_give_empty_split_sizes_takes_those_of_its_record_param_comms(
    tmp_path: Path,
) -> None:
    # the kernel's args say "[]" (no split sizes: as absent), its record_param_comms the uneven ones of the
    # case above: rank 1 of 3 sends 10, 300, 5 floats and receives 7, 2, 9
    kargs = _rpc_args("all_to_allv", 315, 18, "Float", "0", "[0, 1, 2]")
    rpc = kargs | {"In split size": "[10, 300, 5]", "Out split size": "[7, 2, 9]"}
    nodes, _ = _import(tmp_path, _doc(NEW_SENDRECV, kernel_args=kargs, rpc=rpc, rank=1, world=3))
    _, a = _the_kernel(nodes)
    assert (a[Attr.SEND_BYTES], a[Attr.RECV_BYTES]) == (60, 64)
    assert (list(a[Attr.SEND_SPLITS]), list(a[Attr.RECV_SPLITS])) == ([40, 1200, 20], [28, 8, 36])


def test_an_all_to_all_whose_split_sizes_come_to_more_bytes_than_a_trace_holds_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    # 10**18 - 1 doubles to each of ranks 0 and 2 are 16e18 bytes sent, past int64: written to the trace, a
    # traceback ('Value out of range')
    big = 10**18 - 1
    rpc = _rpc_args("all_to_allv", 315, 18, "Double", "0", "[0, 1, 2]") | {
        "In split size": f"[{big}, 300, {big}]",
        "Out split size": "[7, 2, 9]",
    }
    with pytest.raises(TraceImportError, match=rf"rank 1: .*has all_to_all bytes sent {16 * big + 2400} out"):
        _import(tmp_path, _doc(NEW_SENDRECV, rpc=rpc, rank=1, world=3))


# --- streams and the order of collectives -----------------------------------------------------------


ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float" + OLD_ARGS


def test_a_kernel_is_on_the_stream_its_args_name_not_on_its_tid(tmp_path: Path) -> None:
    # module docstring: GPU node ``stream`` = ``args.stream`` (tid only where the arg is absent)
    nodes, _ = _import(tmp_path, _doc(ALL_REDUCE, kernel_args={"stream": 13}))
    _, a = _the_kernel(nodes)
    assert (a[Attr.STREAM], a[Attr.STREAM_KIND]) == (13, "cuda")


def _two_all_reduces(threads: list[tuple[int, int, int, int]], seq: int | None = None) -> dict[str, Any]:
    """Two all-reduce kernels (with newer Kineto's args and ``Seq`` = ``seq`` where given), one per (tid,
    annotation start (-1: none), launch, kernel start) in µs; kernel k (correlation k + 1) runs on stream
    7 + k for 5 µs."""
    ev: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": PID,
                                 "tid": PID, "ts": 0, "dur": 1000, "args": {}}]  # fmt: skip
    for k, (tid, ann, launch, start) in enumerate(threads):
        cpu = {"ph": "X", "pid": PID, "tid": tid}
        if ann >= 0:
            ev.append({**cpu, "cat": "user_annotation", "name": "nccl:all_reduce", "ts": ann,
                       "dur": launch + 10 - ann, "args": {}})  # fmt: skip
        ev.append({**cpu, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 2,
                   "args": {"correlation": k + 1}})  # fmt: skip
        ev.append({"ph": "X", "cat": "kernel", "name": ALL_REDUCE, "pid": 0, "tid": 7 + k, "ts": start,
                   "dur": 5, "args": {"device": 0, "stream": 7 + k, "correlation": k + 1}
                   | ({} if seq is None else {**_rpc_args("allreduce", 256, 256, "Float", "0", "[0, 1]"),
                                                  "Seq": seq})})  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "traceEvents": ev}  # fmt: skip


def _seq_by_stream(nodes: list[Any]) -> dict[int, int]:
    return {
        a[Attr.STREAM]: a[Attr.SEQ]
        for n in nodes
        if n.type == NodeType.COMM_COLL and (a := node_attrs(n))[Attr.STREAM_KIND] == "cuda"
    }


def test_collectives_without_a_trace_seq_are_numbered_in_launch_order_not_in_kernel_start_order(
    tmp_path: Path,
) -> None:
    # docstring: without Seq the n-th collective a rank issues on a group, in CPU launch order, gets seq n.
    # No annotation: the launch calls (20 µs, then 25 µs) say the order, although the second kernel
    # (stream 8) starts first (30 µs < 60 µs): stream 7 -> seq 0, stream 8 -> seq 1
    nodes, _ = _import(tmp_path, _two_all_reduces([(PID, -1, 20, 60), (PID, -1, 25, 30)]))
    assert _seq_by_stream(nodes) == {7: 0, 8: 1}


def test_collectives_without_a_trace_seq_are_numbered_in_the_order_their_ops_begin(tmp_path: Path) -> None:
    # two threads: the op (its nccl:* annotation) on thread 1 begins at 10 µs and launches at 90 µs; the
    # one on thread 2 begins at 20 µs and launches at 30 µs. The collective issued first is the op that
    # begins first: stream 7 (thread 1) -> seq 0, stream 8 -> seq 1
    nodes, _ = _import(tmp_path, _two_all_reduces([(1, 10, 90, 120), (2, 20, 30, 40)]))
    assert _seq_by_stream(nodes) == {7: 0, 8: 1}


def _gloo_doc(threads: list[tuple[int, int, int]], *, issuer_ts: int = -1) -> dict[str, Any]:
    """Kernel-less all-reduces (``gloo:all_reduce``, no launch): one per (tid, top-level op start, annotation
    start) in µs, the annotation inside a ``aten::foo`` op of its thread (top-level op start -1: on a thread
    of its own); ``issuer_ts`` >= 0 adds a ``c10d::allreduce_`` op there on thread ``PID``."""
    ev: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": PID,
                                 "tid": PID, "ts": 0, "dur": 1000, "args": {}}]  # fmt: skip
    if issuer_ts >= 0:
        ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": PID, "tid": PID,
                   "ts": issuer_ts, "dur": 20, "args": {}})  # fmt: skip
    for tid, top, ann in threads:
        cpu = {"ph": "X", "pid": PID, "tid": tid}
        if top >= 0:
            ev.append({**cpu, "cat": "cpu_op", "name": "aten::foo", "ts": top, "dur": 200, "args": {}})
        ev.append({**cpu, "cat": "user_annotation", "name": "gloo:all_reduce", "ts": ann, "dur": 20,
                   "args": {}})  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
            "traceEvents": ev}  # fmt: skip


def test_kernel_less_collectives_are_numbered_in_the_order_their_annotations_begin_not_their_ops(
    tmp_path: Path,
) -> None:
    # the op around each annotation becomes the collective; the order is the annotations' (the collective's
    # issue): thread 1's op begins first (10 µs) but its annotation at 100 µs, after thread 2's (60 µs):
    # thread 2 -> seq 0, thread 1 -> seq 1
    nodes, _ = _import(tmp_path, _gloo_doc([(1, 10, 100), (2, 50, 60)]))
    seq = {(a := node_attrs(n))[Attr.STREAM]: a[Attr.SEQ] for n in nodes if n.type == NodeType.COMM_COLL}
    assert seq == {1: 1, 2: 0}


def _steps_and_kernel(ops: list[tuple[str, int]], launch: int, kernel: int) -> dict[str, Any]:
    """ProfilerStep#2 over 0-100 µs and #3 over 100-200 µs on thread ``PID``, with the top-level ``cpu_op``s
    ``ops`` (name, start; 5 µs long), a ``cudaLaunchKernel`` at ``launch`` (inside no op) and its kernel
    ``k`` at ``kernel`` (10 µs, stream 7)."""
    cpu = {"ph": "X", "pid": PID, "tid": PID}
    ev: list[dict[str, Any]] = [
        {**cpu, "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": 100 * (s - 2), "dur": 100,
         "args": {}} for s in (2, 3)
    ]  # fmt: skip
    ev += [{**cpu, "cat": "cpu_op", "name": name, "ts": ts, "dur": 5, "args": {}} for name, ts in ops]
    ev.append({**cpu, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 2,
               "args": {"correlation": 1}})  # fmt: skip
    ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": kernel, "dur": 10,
               "args": {"device": 0, "stream": 7, "correlation": 1}})  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "traceEvents": ev}  # fmt: skip


def test_gpu_work_launched_outside_any_op_is_in_the_step_its_launch_call_lies_in_not_where_it_runs(
    tmp_path: Path,
) -> None:
    # docstring: where no top-level CPU op encloses the launch, skl_step is that of the step annotation the
    # launch call lies inside: launched at 50 µs (step 2), run at 150 µs (inside step 3's annotation) -> 2
    nodes, _ = _import(tmp_path, _steps_and_kernel([], launch=50, kernel=150))
    (k,) = (n for n in nodes if n.name == "k")
    assert node_attrs(k)[Attr.STEP] == 2


def test_a_cpu_op_and_a_kernel_that_start_at_the_same_instant_are_numbered_cpu_op_first(
    tmp_path: Path,
) -> None:
    # nodes are numbered in start order, CPU nodes first at equal starts: aten::mm and kernel k both start
    # at 30 µs -> aten::mm gets the smaller id
    nodes, _ = _import(tmp_path, _steps_and_kernel([("aten::mm", 30)], launch=20, kernel=30))
    ids = {n.name: n.id for n in nodes}
    assert ids["aten::mm"] < ids["k"]


def test_a_trace_seq_given_twice_on_one_group_is_not_used_and_the_collectives_are_counted_instead(
    tmp_path: Path,
) -> None:
    # docstring: the trace's seq is used where every collective has one; two all-reduces on group "0" both
    # given Seq 5 do not say which came first, so they are counted in launch order (20 µs, then 25 µs)
    nodes, _ = _import(tmp_path, _two_all_reduces([(PID, -1, 20, 60), (PID, -1, 25, 30)], seq=5))
    assert _seq_by_stream(nodes) == {7: 0, 8: 1}


def test_gpu_work_is_in_the_step_of_the_op_that_launched_it_even_where_the_launch_falls_in_the_next(
    tmp_path: Path,
) -> None:
    # docstring: a step sets skl_step on the CPU nodes that start inside it and on the GPU nodes those
    # launch: aten::mm starts at 98 µs (step 2) and launches k at 101 µs, inside step 3's annotation -> 2
    nodes, _ = _import(tmp_path, _steps_and_kernel([("aten::mm", 98)], launch=101, kernel=110))
    (k,) = (n for n in nodes if n.name == "k")
    assert node_attrs(k)[Attr.STEP] == 2


def test_a_step_begins_where_the_previous_step_ended_on_the_device_not_at_its_annotation(
    tmp_path: Path,
) -> None:
    # docstring: a step's span ends at the later of its annotation's end and its last node's, and the next
    # begins there. aten::mm (50 µs, step 2) launches k, which runs 140-150 µs: step 2 is 0-150 µs, step 3
    # (annotation 100-200 µs, no node past it) 150-200 µs
    f = tmp_path / "trace.json"
    f.write_text(json.dumps(_steps_and_kernel([("aten::mm", 50)], launch=52, kernel=140)))
    m = import_traces([f], None, tmp_path / "run")
    assert [(s.step, s.start_ns, s.end_ns) for s in m.steps] == [(2, 0, 150_000), (3, 150_000, 200_000)]


def test_a_node_issued_as_a_step_annotation_ends_is_in_that_step_where_the_next_begins_later(
    tmp_path: Path,
) -> None:
    # convert: an annotation holds its end instant. ProfilerStep#2 over 0-100 µs, #3 moved to 150-250 µs;
    # aten::add starts at 100 µs, as #2 ends and before #3 begins: in step 2
    doc = _steps_and_kernel([("aten::add", 100)], launch=20, kernel=30)
    (ann3,) = (e for e in doc["traceEvents"] if e["name"] == "ProfilerStep#3")
    ann3["ts"] = 150
    nodes, _ = _import(tmp_path, doc)
    (add,) = (n for n in nodes if n.name == "aten::add")
    assert node_attrs(add)[Attr.STEP] == 2


@pytest.mark.parametrize("kernel_us", [190, 195])
def test_a_step_whose_work_all_ended_by_the_time_the_previous_step_ended_on_the_device_has_no_span(
    tmp_path: Path, kernel_us: int
) -> None:
    # convert: step 2's kernel (launched by aten::mm at 50 µs) runs 10 µs from 190 or 195 µs, so step 2
    # ends at 200 or 205 µs; step 3's annotation ends at 200 µs and nothing of it runs later: no time of its
    # own (none at all, or less than none), no span
    f = tmp_path / "trace.json"
    f.write_text(json.dumps(_steps_and_kernel([("aten::mm", 50)], launch=52, kernel=kernel_us)))
    m = import_traces([f], None, tmp_path / "run")
    assert [(s.step, s.start_ns, s.end_ns) for s in m.steps] == [(2, 0, (kernel_us + 10) * 1000)]


def test_a_kernel_whose_name_begins_nccl_in_capitals_is_read_as_nccl_args_and_all(tmp_path: Path) -> None:
    # vocab.names_nccl_kernel: a kernel name starting with "nccl" in any case is NCCL's; its Collective
    # name args then say the op (a Generic kernel's name says nothing)
    kargs = _rpc_args("allreduce", 256, 256, "Float", "0", "[0, 1]")
    nodes, _ = _import(tmp_path, _doc("NCCLDevKernel_Generic_4" + NEW_ARGS, kernel_args=kargs))
    (k,) = (n for n in nodes if n.name.startswith("NCCL"))
    a = node_attrs(k)
    assert (k.type, a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]) == (NodeType.COMM_COLL, CommType.ALL_REDUCE, 1024)


@pytest.mark.parametrize(
    "kernel",
    [
        # RCCL's kernels as ROCm's Kineto names them: its MSCCL algorithms' (on by default on MI300X), its
        # debug build's Generic kernel, and the Generic one of every build
        "mscclKernel_Sum_float_LL_false(ncclDevComm*, mscclAlgo*, mscclWork*)",
        "ncclDevKernelDebug_Generic(ncclDevComm*, channelMasks, ncclWork*)",
        "ncclDevKernel_Generic_1" + NEW_ARGS,
    ],
)
def test_an_rccl_kernel_on_a_rocm_trace_is_the_collective_its_args_name_as_on_cuda(
    tmp_path: Path, kernel: str
) -> None:
    # ROCm: hipLaunchKernel (cuda_runtime, as ROCm's Kineto files HIP calls), the kernel's Collective name
    # args (Kineto puts record_param_comms' on any kernel it launched). An mscclKernel_ was GPU compute
    kargs = _rpc_args("allreduce", 256, 256, "Float", "0", "[0, 1]")
    doc = _doc(kernel, kernel_args=kargs)
    for e in doc["traceEvents"]:
        e["name"] = "hipLaunchKernel" if e["name"] == "cudaLaunchKernel" else e["name"]
    nodes, _ = _import(tmp_path, doc)
    (k,) = (n for n in nodes if n.name == kernel)
    a = node_attrs(k)
    assert (k.type, a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.PG_NAME]) == (
        NodeType.COMM_COLL,
        CommType.ALL_REDUCE,
        1024,
        "0",
    )


def test_a_kernel_less_collective_on_a_thread_of_its_own_depends_on_an_issuer_that_began_at_the_same_instant(
    tmp_path: Path,
) -> None:
    # docstring: an annotation on a thread of its own is itself the node, depending on the op that issued
    # it; c10d::allreduce_ (thread PID) and gloo:all_reduce (thread 2) both begin at 10 µs: the issuer
    # has begun by then, so the two pair
    nodes, _ = _import(tmp_path, _gloo_doc([(2, -1, 10)], issuer_ts=10))
    ids = {n.name: n for n in nodes}
    assert list(ids["gloo:all_reduce"].ctrl_deps) == [ids["c10d::allreduce_"].id]


def test_a_group_pg_config_lists_with_no_ranks_is_every_rank_in_the_imported_manifest(tmp_path: Path) -> None:
    # torch writes "ranks": [] for a group spanning the world; the manifest lists its members
    doc = _doc("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    doc["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": []},
        {"pg_name": "1", "pg_desc": "undefined", "backend_config": "cuda:nccl", "ranks": [1]},
    ]
    _import(tmp_path, doc)
    groups = read_manifest(tmp_path / "run").process_groups
    assert {g.name: g.ranks for g in groups} == {"0": (0, 1), "1": (1,)}


def test_the_same_traces_given_in_another_order_import_to_the_same_bytes(tmp_path: Path) -> None:
    # a shell's glob order follows its locale: rank 10 may come before or after rank 2
    files = []
    for rank in (0, 1):
        doc = _doc("ncclDevKernel_AllReduce_Sum_f32_RING_LL", rank=rank)
        doc["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": []},
            {"pg_name": f"{rank + 1}", "backend_config": "cuda:nccl", "ranks": [rank]},
        ]
        files.append(tmp_path / f"trace{rank}.json")
        files[-1].write_text(json.dumps(doc))
    import_traces(files, None, tmp_path / "forward")
    import_traces(files[::-1], None, tmp_path / "reversed")
    for name in ("manifest.json", "rank-0.et", "rank-1.et"):
        assert (tmp_path / "forward" / name).read_bytes() == (tmp_path / "reversed" / name).read_bytes(), name
