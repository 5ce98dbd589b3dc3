"""``skewlens import`` on small hand-built Kineto / host-ET documents: conversion rules and bad input."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from user_docs import ROOT

from skewlens.profiler.atomic import replace_dir
from skewlens.profiler.bounded import JSON_GZIP_FLOOR_BYTES, JSON_GZIP_RATIO
from skewlens.profiler.chakra_io import iter_nodes, node_attrs, read_et
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers import import_traces
from skewlens.profiler.importers.host_et import HostOp, parse_host_et
from skewlens.profiler.importers.join import join_ops
from skewlens.profiler.importers.kineto import KEvent
from skewlens.profiler.importers.sources import read_json
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.vocab import Attr, CommType, NodeType

KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def kineto_doc(
    rank: int | None = 0, world: int = 2, *, pid: int = 100, comms: tuple[str, ...] = ("nccl:all_reduce",)
) -> dict[str, Any]:
    """One step: an op with a nested op, then per comm a record_param_comms + annotation + NCCL kernel."""
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": pid, "tid": pid,
         "ts": 0, "dur": 5000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": 1, "dur": 8},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid, "tid": pid, "ts": 2, "dur": 1},
    ]  # fmt: skip
    for k, name in enumerate(comms):
        t = 10 + 100 * k
        ev += [
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": pid, "ts": t,
             "dur": 50, "args": {}},
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": pid, "ts": t + 5,
             "dur": 30, "args": {"Input Dims": [[256]], "Input type": ["float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
             "ts": t + 10, "dur": 5, "args": {"correlation": 1000 + k}},
            {"ph": "X", "cat": "kernel", "name": KERNEL, "pid": 0, "tid": 7, "ts": t + 20, "dur": 40.5,
             "args": {"stream": 7, "device": 0, "correlation": 1000 + k}},
        ]  # fmt: skip
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": ev}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    return doc


def host_doc(
    names: tuple[str, ...] = ("nccl:all_reduce",), *, pid: int = 100, schema: str = "1.1.1-chakra.0.0.4"
) -> dict[str, Any]:
    nodes = []
    for k, name in enumerate(names):
        tensor = [10 + k, 20 + k, 0, 1000, 2, "cuda:0"]  # 1000 bf16 elements
        if schema == "1.0.1":
            nodes.append({"id": 5 + k, "name": name, "parent": 1, "inputs": [tensor],
                          "input_types": ["Tensor(c10::BFloat16)"]})  # fmt: skip
        else:
            nodes.append({"id": 5 + k, "name": name, "ctrl_deps": 1,
                          "inputs": {"values": [tensor], "shapes": [[1000]],
                                     "types": ["Tensor(c10::BFloat16)"]}})  # fmt: skip
    return {"schema": schema, "pid": pid, "nodes": nodes}


def _write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            json.dump(doc, fh)
    else:
        path.write_text(json.dumps(doc))
    return path


def _two_ranks(tmp_path: Path) -> list[Path]:
    return [_write(tmp_path / "in" / f"rank{r}.json", kineto_doc(r, pid=100 + r)) for r in (0, 1)]


def test_a_small_trace_becomes_matched_collectives_with_sizes_from_the_annotation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _two_ranks(tmp_path)
    m = import_traces([tmp_path / "in"], None, out)  # a directory of traces
    assert (m.world_size, m.ranks, m.level, m.source) == (2, (0, 1), "ops", "import")
    run = load_run(out)
    (inst,) = run.collectives
    assert (inst.comm_type, inst.ranks, inst.comm_bytes, inst.seq) == (
        CommType.ALL_REDUCE, (0, 1), (1024, 1024), 0,
    )  # fmt: skip
    nodes = read_et(out / "rank-0.et").nodes
    names = [n.name for n in nodes]
    assert "aten::empty" not in names  # nested in aten::mm: dropped
    kernel = next(n for n in nodes if n.type == NodeType.COMM_COLL)
    a = node_attrs(kernel)
    assert (a[Attr.START_NS], a[Attr.DUR_NS], a[Attr.STEP]) == (30_000, 40_500, 3)
    (rpc,) = (n for n in nodes if n.name == "record_param_comms")
    assert rpc.id in kernel.ctrl_deps


def test_a_folder_of_links_to_traces_is_read_as_the_traces_and_a_link_to_a_folder_is_not_followed(
    tmp_path: Path,
) -> None:
    # traces kept elsewhere, linked into one folder: import said the folder held no trace files
    linked = tmp_path / "linked"
    for f in _two_ranks(tmp_path):
        link = linked / f.name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(f)
    (linked / "loop").symlink_to(linked, target_is_directory=True)  # not walked: it would loop
    m = import_traces([linked], None, tmp_path / "run")
    assert (m.world_size, m.ranks) == (2, (0, 1))
    assert len(load_run(tmp_path / "run").collectives) == 1


def test_comm_size_comes_from_the_host_trace_when_kineto_has_no_shapes(tmp_path: Path) -> None:
    doc = kineto_doc(0, 1)
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    k = _write(tmp_path / "k" / "worker0.json", doc)
    h = _write(tmp_path / "h" / "et_0.json", host_doc())
    import_traces([k], [h], tmp_path / "run")
    (coll,) = (n for n in read_et(tmp_path / "run" / "rank-0.et").nodes if n.type == NodeType.COMM_COLL)
    assert node_attrs(coll)[Attr.COMM_SIZE] == 1000 * 2


def test_a_file_that_is_not_json_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    bad = tmp_path / "in" / "rank0.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    out = tmp_path / "run"
    with pytest.raises(TraceImportError, match=r"rank0\.json: not JSON"):
        import_traces([bad], None, out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_json_without_trace_events_is_refused(tmp_path: Path) -> None:
    f = _write(tmp_path / "x.json", {"nodes": []})
    with pytest.raises(TraceImportError, match=r"x\.json: not a Kineto trace"):
        import_traces([f], None, tmp_path / "run")


def test_a_trace_without_distributed_info_needs_a_rank(tmp_path: Path) -> None:
    f = _write(tmp_path / "x.json", kineto_doc(None))
    with pytest.raises(TraceImportError, match="--rank"):
        import_traces([f], None, tmp_path / "run")
    m = import_traces([f], None, tmp_path / "run", rank=1, world_size=4)
    assert (m.ranks, m.missing_ranks) == ((1,), (0, 2, 3))


def test_duplicate_ranks_name_both_files(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", kineto_doc(1))
    b = _write(tmp_path / "b.json.gz", kineto_doc(1))
    with pytest.raises(TraceImportError, match=r"duplicate rank 1: .*a\.json and .*b\.json\.gz") as e:
        import_traces([a, b], None, tmp_path / "run")
    # the usual cause: a directory a tensorboard_trace_handler wrote under schedule(..., repeat=2) holds
    # one trace per cycle of each rank (before, the error named the files and no cause)
    assert str(e.value).endswith(
        "(one trace per rank: a torch.profiler schedule with repeat writes one per cycle; import one "
        "cycle's traces)"
    )


def test_an_unknown_host_trace_schema_is_refused_with_the_supported_list(tmp_path: Path) -> None:
    k = _write(tmp_path / "k.json", kineto_doc(0, 1))
    h = _write(tmp_path / "h_0.json", host_doc(schema="9.9"))
    with pytest.raises(TraceImportError, match=r"h_0\.json: .*'9\.9' is not supported.*1\.1\.1-chakra"):
        import_traces([k], [h], tmp_path / "run")


def _rpc_nodes(op: str, annotation: str, peer: int = 1) -> list[dict[str, Any]]:
    """A 1.0.1 ``record_param_comms`` node of collective name ``op`` and its backend annotation."""
    tensor = [10, 20, 0, 256, 4, "cuda:0"]
    return [
        {"id": 4, "name": "record_param_comms", "parent": 1, "input_types": ["Tensor(float)", "Int", "Int",
         "Int", "String", "GenericList[]", "GenericList[]"], "inputs": [tensor, 7, 9999, peer, op, [], []]},
        {"id": 5, "name": annotation, "parent": 4, "inputs": [tensor], "input_types": ["Tensor(float)"]},
    ]  # fmt: skip


def test_a_recv_from_any_source_is_a_recv_from_the_peer_the_host_trace_names() -> None:
    doc = {
        "schema": "1.0.1",
        "pid": 100,
        "nodes": _rpc_nodes("recv_anysource", "nccl:recv_anysource", peer=3),
    }
    (comm,) = parse_host_et(doc, Path("et.json")).comms
    assert (comm.p2p, comm.comm_type, comm.peer) == ("recv", None, 3)


def test_a_collective_the_annotation_does_not_name_takes_its_type_from_record_param_comms() -> None:
    doc = {"schema": "1.0.1", "pid": 100, "nodes": _rpc_nodes("allreduce_coalesced", "nccl:coalesced")}
    (comm,) = parse_host_et(doc, Path("et.json")).comms
    assert (comm.op, comm.comm_type) == ("allreduce_coalesced", CommType.ALL_REDUCE)


def test_an_all_to_allv_takes_its_split_sizes_in_bytes_from_record_param_comms() -> None:
    nodes = _rpc_nodes("all_to_allv", "nccl:all_to_all")
    nodes[0]["inputs"][5:7] = [[16, 240], [16, 16]]  # elements to / from each member of the group
    nodes[0]["input_types"][5:7] = ["GenericList[Int,Int]", "GenericList[Int,Int]"]
    (comm,) = parse_host_et({"schema": "1.0.1", "pid": 100, "nodes": nodes}, Path("et.json")).comms
    assert (comm.send_splits, comm.recv_splits) == ((64, 960), (64, 64))


def test_an_all_to_allv_whose_record_param_comms_lists_a_split_too_large_for_a_count_has_none() -> None:
    # read as the Kineto args' split sizes are: each under 2**62 (10**30 was a traceback writing the trace)
    nodes = _rpc_nodes("all_to_allv", "nccl:all_to_all")
    nodes[0]["inputs"][5:7] = [[10**30, 240], [16, 16]]
    nodes[0]["input_types"][5:7] = ["GenericList[Int,Int]", "GenericList[Int,Int]"]
    (comm,) = parse_host_et({"schema": "1.0.1", "pid": 100, "nodes": nodes}, Path("et.json")).comms
    assert (comm.send_splits, comm.recv_splits) == ((), ())


def test_an_all_to_allv_keeps_a_split_of_0_and_lists_of_unlike_length_or_not_lists_are_no_splits() -> None:
    # a member sent nothing (0 elements) is a split; in / out lists of different lengths, or a string or a
    # number where a list should be, are not an all_to_all's splits and leave it even
    cases = [
        (([0, 256], [16, 0]), ((0, 1024), (64, 0))),
        (([16, 240], [16, 16, 16]), ((), ())),
        (("16,240", [16, 16]), ((), ())),
        ((16, [16, 16]), ((), ())),
        (([True, 240], [16, 16]), ((), ())),  # JSON's true is no count (an int subclass in Python)
    ]
    for (send, recv), want in cases:
        nodes = _rpc_nodes("all_to_allv", "nccl:all_to_all")
        nodes[0]["inputs"][5:7] = [send, recv]
        (comm,) = parse_host_et({"schema": "1.0.1", "pid": 100, "nodes": nodes}, Path("et.json")).comms
        assert (comm.send_splits, comm.recv_splits) == want, (send, recv)


def test_split_sizes_written_with_a_number_of_thousands_of_digits_are_none_not_a_traceback() -> None:
    # Python refuses int() of a string over 4,300 digits (ValueError): the digits are counted first
    from skewlens.profiler.importers.host_et import split_sizes

    assert split_sizes("[" + "9" * 5000 + ", 1]") is None
    assert split_sizes("[16, 240]") == (16, 240)


def test_an_all_to_all_whose_record_param_comms_lists_no_splits_has_none() -> None:
    (comm,) = parse_host_et(
        {"schema": "1.0.1", "pid": 100, "nodes": _rpc_nodes("all_to_all", "nccl:all_to_all")}, Path("et.json")
    ).comms
    assert (comm.send_splits, comm.recv_splits) == ((), ())


def test_a_host_trace_node_whose_id_is_a_boolean_is_refused() -> None:
    doc = host_doc()
    doc["nodes"][0]["id"] = True
    with pytest.raises(TraceImportError, match=r"et\.json: node #0 has no integer 'id' / string 'name'"):
        parse_host_et(doc, Path("et.json"))


def test_a_host_trace_of_another_run_is_refused(tmp_path: Path) -> None:
    k = _write(tmp_path / "k.json", kineto_doc(0, 1))
    h = _write(tmp_path / "h_0.json", host_doc(("nccl:all_reduce", "nccl:broadcast")))
    with pytest.raises(TraceImportError, match=r"does not match Kineto trace .*1 vs 2|2 vs 1"):
        import_traces([k], [h], tmp_path / "run")


def test_pid_and_file_name_disagreeing_is_an_ambiguous_pairing(tmp_path: Path) -> None:
    ks = _two_ranks(tmp_path)  # rank r has pid 100 + r
    h0 = _write(tmp_path / "h" / "et_0.json", host_doc(pid=101))
    h1 = _write(tmp_path / "h" / "et_1.json", host_doc(pid=100))
    with pytest.raises(TraceImportError, match="ambiguous host-trace pairing for rank 0"):
        import_traces(ks, [h0, h1], tmp_path / "run")


def test_host_traces_pair_by_file_name_when_pids_do_not_help(tmp_path: Path) -> None:
    ks = _two_ranks(tmp_path)
    hs = [_write(tmp_path / "h" / f"et_{r}.json", host_doc(pid=7, schema="1.0.1")) for r in (1, 0)]
    m = import_traces(ks, hs, tmp_path / "run")
    assert "paired by file-name number" in m.notes["import"]


def test_host_traces_pair_by_file_name_when_one_pid_is_in_two_ranks_traces(tmp_path: Path) -> None:
    # rank 0 and rank 1 ran on two hosts under the same pid 100 ("may collide across hosts"): the pid
    # pairs both with et_0, not one-to-one, so the file names pair them (et_1 has pid 7)
    ks = [_write(tmp_path / "in" / f"rank{r}.json", kineto_doc(r, pid=100)) for r in (0, 1)]
    hs = [_write(tmp_path / "h" / f"et_{r}.json", host_doc(pid=(100, 7)[r], schema="1.0.1")) for r in (0, 1)]
    m = import_traces(ks, hs, tmp_path / "run")
    assert "paired by file-name number" in m.notes["import"]


def test_host_traces_pair_by_file_name_when_a_ranks_trace_has_the_pids_of_two_host_traces(
    tmp_path: Path,
) -> None:
    # rank 0's trace also has ops of process 101 (rank 1's): two host traces could be its own, so the pid
    # does not pair one-to-one and the file names pair them
    ks = _two_ranks(tmp_path)  # rank r has pid 100 + r
    doc = kineto_doc(0, pid=100)
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 101, "tid": 101,
                               "ts": 3, "dur": 1})  # fmt: skip
    _write(ks[0], doc)
    hs = [_write(tmp_path / "h" / f"et_{r}.json", host_doc(pid=100 + r, schema="1.0.1")) for r in (0, 1)]
    m = import_traces(ks, hs, tmp_path / "run")
    assert "paired by file-name number" in m.notes["import"]


def test_host_traces_whose_file_name_numbers_are_not_the_ranks_pair_by_pid(tmp_path: Path) -> None:
    # et_2024.json / et_2025.json: trailing numbers, but not ranks 0 and 1; the pids pair them
    ks = _two_ranks(tmp_path)  # rank r has pid 100 + r
    hs = [
        _write(tmp_path / "h" / f"et_{2024 + r}.json", host_doc(pid=100 + r, schema="1.0.1")) for r in (0, 1)
    ]
    m = import_traces(ks, hs, tmp_path / "run")
    assert "paired by pid" in m.notes["import"]


def _tar(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_archives_are_read_member_by_member_and_links_are_skipped(tmp_path: Path) -> None:
    docs = [json.dumps(kineto_doc(r)).encode() for r in (0, 1)]
    arc = _tar(
        tmp_path / "t.tar.gz",
        [("d/r0.json", docs[0]), ("d/r1.json", docs[1]), ("d/evil.json", None), ("d/._r0.json", b"junk")],
    )
    m = import_traces([arc], None, tmp_path / "run")
    assert m.ranks == (0, 1)


def test_an_archive_member_climbing_out_is_refused(tmp_path: Path) -> None:
    arc = _tar(tmp_path / "t.tar.gz", [("../../escape.json", b"{}")])
    with pytest.raises(TraceImportError, match="unsafe member path"):
        import_traces([arc], None, tmp_path / "run")
    assert not (tmp_path.parent / "escape.json").exists()


def test_reading_is_bounded_in_size_and_depth(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"traceEvents": [0] * 1000}))
    with pytest.raises(TraceImportError, match="limit"):
        read_json(big, max_bytes=100)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(TraceImportError, match="nested too deeply"):
        read_json(deep)


#: Past the floor that any compressed input may expand to (64 MiB), in a few tens of KB of gzip.
_INFLATED = (JSON_GZIP_FLOOR_BYTES >> 1) + 1


def test_a_gzipped_trace_that_inflates_past_its_ratio_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    # a 1.9 MB gzip of "0,0,0,..." inflated to the 2 GiB trace limit and the JSON parser held 5.8 GB for it
    head = b'{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ['
    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(gzip.compress(head + b"0," * _INFLATED + b"0]}", compresslevel=9))
    size = bomb.stat().st_size
    assert JSON_GZIP_RATIO * size < JSON_GZIP_FLOOR_BYTES  # the floor is what it is held to
    said = (
        f"rank0.json.gz: gzipped trace expands past {JSON_GZIP_FLOOR_BYTES} bytes, over 64 times its {size}"
    )
    with pytest.raises(TraceImportError, match=said) as e:
        import_traces([bomb], None, tmp_path / "run")
    assert str(e.value).endswith(
        "if it is a real one, decompress it first (gunzip, tar -x): a plain file is not held to this ratio"
    )
    with pytest.raises(TraceImportError, match=said):
        read_json(bomb)  # a host execution trace
    assert not (tmp_path / "run").exists()


def _zeros_member(name: str) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = 2 * _INFLATED
    return info, io.BytesIO(bytes(info.size))


def test_an_archive_that_inflates_past_its_ratio_is_refused_even_in_members_it_skips(tmp_path: Path) -> None:
    # tar skips a member by inflating it: 3.9 MB of .tar.gz wrote 3.8 GB of scratch and held 3.9 GB
    arc = tmp_path / "t.tar.gz"
    with tarfile.open(arc, "w:gz", compresslevel=9) as tf:
        tf.addfile(*_zeros_member("d/core.bin"))
        doc = json.dumps(kineto_doc(0, world=1)).encode()
        info = tarfile.TarInfo("d/r0.json")
        info.size = len(doc)
        tf.addfile(info, io.BytesIO(doc))
    with pytest.raises(
        TraceImportError, match=r"t\.tar\.gz: archive expands past \d+ bytes, over 64 times its"
    ):
        import_traces([arc], None, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_long_name_header_claiming_more_than_the_archive_can_hold_is_refused_unread(tmp_path: Path) -> None:
    # tarfile reads a GNU long-name header whole: 1.5 MB of .tar.gz held 1.6 GB, in check's sniffing too
    import tracemalloc

    from skewlens.profiler.store.load import _sniff

    arc = tmp_path / "t.tar.gz"
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, 8 * _INFLATED
    header = info._create_header(info.get_info(), tarfile.GNU_FORMAT, "utf-8", "surrogateescape")  # type: ignore[attr-defined]
    arc.write_bytes(gzip.compress(header + b"a" * info.size + bytes(1024), compresslevel=9))
    tracemalloc.start()
    try:
        with pytest.raises(TraceImportError, match=r"t\.tar\.gz: archive expands past"):
            import_traces([arc], None, tmp_path / "run")
        assert _sniff(arc) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * JSON_GZIP_FLOOR_BYTES  # the floor (and gzip's buffers) at most, not the 4x it claims


def test_a_plain_tar_whose_member_runs_past_its_end_is_unreadable_not_a_decompression_bomb(
    tmp_path: Path,
) -> None:
    # a 1.5 KB uncompressed tar whose skipped member claims 100 MB was "archive expands past 67108864 bytes,
    # over 64 times its 1536 bytes (a decompression bomb?); ... decompress it first": nothing in it inflates
    arc = tmp_path / "t.tar"
    info = tarfile.TarInfo("core.bin")
    info.size = 100 * 1024**2
    arc.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    with pytest.raises(TraceImportError) as e:
        import_traces([arc], None, tmp_path / "run")
    assert str(e.value) == f"{arc}: not a readable tar archive (a member runs past its end)"
    assert not (tmp_path / "run").exists()


def test_checking_an_archive_sniffs_past_no_more_than_its_ratio(tmp_path: Path) -> None:
    from skewlens.profiler.store.load import _sniff

    arc = tmp_path / "t.tar.gz"
    doc = json.dumps(kineto_doc(0, world=1)).encode()
    info = tarfile.TarInfo("r0.json")
    info.size = len(doc)
    with tarfile.open(arc, "w:gz", compresslevel=9) as tf:
        tf.addfile(info, io.BytesIO(doc))
    assert _sniff(arc) == "kineto"
    with tarfile.open(arc, "w:gz", compresslevel=9) as tf:
        tf.addfile(*_zeros_member("core.bin"))
        tf.addfile(info, io.BytesIO(doc))
    assert _sniff(arc) is None  # it inflated 128 MiB to find the trace


def test_a_corrupt_deflate_stream_in_a_gzip_trace_or_archive_is_an_import_error(tmp_path: Path) -> None:
    doc = json.dumps(kineto_doc(0)).encode()
    sources = {
        "rank0.json.gz": gzip.compress(doc, mtime=0),
        "t.tar.gz": _tar(tmp_path / "ok.tar.gz", [("d/r0.json", doc)]).read_bytes(),
    }
    kinds: set[str] = set()
    for name, data in sources.items():
        for at in range(20, len(data) - 8, max(1, (len(data) - 28) // 40)):
            bad = bytearray(data)
            bad[at] ^= 0xFF
            path = tmp_path / f"{name}-{at}" / name
            path.parent.mkdir()
            path.write_bytes(bytes(bad))
            try:
                import_traces([path], None, path.parent / "run", rank=0)
            except TraceImportError as e:
                kinds.add(str(e).split(": ", 1)[1][:30])
    # zlib's own error (a deflate stream that cannot be decoded) was a traceback
    assert any("Error -3" in k for k in kinds), kinds


def test_an_existing_run_is_kept_unless_overwrite_is_asked(tmp_path: Path) -> None:
    ks = _two_ranks(tmp_path)
    out = tmp_path / "run"
    import_traces(ks[:1], None, out)
    with pytest.raises(TraceImportError, match="exists and is not empty"):
        import_traces(ks, None, out)
    assert read_manifest(out).ranks == (0,)
    import_traces(ks, None, out, overwrite=True)
    assert read_manifest(out).ranks == (0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "run"]


def test_rank_and_world_size_are_bounded_and_must_agree_with_the_traces(tmp_path: Path) -> None:
    ks = _two_ranks(tmp_path)
    for kwargs, error in (
        ({"rank": -1}, r"--rank -1: expected a rank in 0\.\.1048575"),
        ({"world_size": 10**7}, r"--world-size 10000000: expected 1\.\.1048576"),
        ({"world_size": 3}, r"--world-size 3 disagrees with the traces' distributedInfo\.world_size 2"),
    ):
        with pytest.raises(TraceImportError, match=error):
            import_traces(ks, None, tmp_path / "run", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_events_with_a_negative_duration_are_read_as_zero_long_and_counted_in_the_manifest(
    tmp_path: Path,
) -> None:
    doc = kineto_doc(0)
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    for e in timed[:2]:
        e["dur"] = -5
    m = import_traces([_write(tmp_path / "in" / "rank0.json", doc)], None, tmp_path / "run")
    assert "2 event(s) with a negative dur, read as 0 long" in m.notes["rank 0 import"]


@pytest.mark.parametrize("schema", ["1.0.1", "1.1.1-chakra.0.0.4"])
def test_a_host_trace_node_with_inputs_of_the_wrong_type_or_an_id_past_int64_is_refused(
    tmp_path: Path, schema: str
) -> None:
    k = _write(tmp_path / "k" / "worker0.json", kineto_doc(0, 1))
    for change, error in (
        ({"inputs": 5}, r"node 5 \(nccl:all_reduce\): inputs"),
        ({"id": 2**64}, r"node #0 has id 18446744073709551616, outside 0\.\.2\*\*63-1"),
    ):
        doc = host_doc(schema=schema)
        doc["nodes"][0].update(change)
        h = _write(tmp_path / f"h{len(change)}{change.popitem()[0]}" / "et_0.json", doc)
        with pytest.raises(TraceImportError, match=error):
            import_traces([k], [h], tmp_path / "run")


def test_force_replaces_only_a_run_directory_and_never_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ks = _two_ranks(tmp_path)
    other = tmp_path / "scratch"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "data.txt").write_text("x")
    with pytest.raises(TraceImportError, match=r"scratch: not a run directory \(no manifest.json\)"):
        import_traces(ks, None, other, overwrite=True)
    assert (other / "sub" / "data.txt").read_text() == "x"
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(TraceImportError, match="the current directory"):
        import_traces(ks, None, Path("."))
    assert not any(here.iterdir())


def test_a_send_recv_kernel_without_a_known_peer_stays_a_gpu_compute_node(tmp_path: Path) -> None:
    doc = kineto_doc(0, 1, comms=())
    doc["traceEvents"].append(
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
         "pid": 0, "tid": 9, "ts": 50, "dur": 5, "args": {"stream": 9, "device": 0, "correlation": 5}}
    )  # fmt: skip
    f = _write(tmp_path / "k.json", doc)
    m = import_traces([f], None, tmp_path / "run")
    (k,) = (n for n in read_et(tmp_path / "run" / "rank-0.et").nodes if "SendRecv" in n.name)
    assert k.type == NodeType.COMP and node_attrs(k)[Attr.IS_CPU_OP] is False
    assert "unknown collective/peer" in m.notes["rank 0 import"]


def test_collectives_without_a_kernel_become_their_cpu_op(tmp_path: Path) -> None:
    docs = []
    for r in (0, 1):
        doc = kineto_doc(r, comms=("gloo:all_reduce", "gloo:broadcast"))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] not in ("kernel", "cuda_runtime")]
        docs.append(_write(tmp_path / f"r{r}.json", doc))
    m = import_traces(docs, None, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert [(c.seq, c.comm_type, c.comm_bytes) for c in run.collectives] == [
        (0, CommType.ALL_REDUCE, (1024, 1024)),
        (1, CommType.BROADCAST, (1024, 1024)),
    ]
    rt = run.ranks[0]
    rows = [int(r) for r in rt.rows_of_type(NodeType.COMM_COLL)]
    assert [rt.name(r) for r in rows] == ["record_param_comms"] * 2
    assert bool(rt.is_cpu[rows].all()) and m.devices == {0: "cpu", 1: "cpu"}


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("dur", '"5"', "dur ('5'; expected a finite number)"), ("name", "7", "name (7; expected a string)")],
)
def test_a_kept_event_with_a_malformed_dur_or_name_is_refused_naming_the_field(
    tmp_path: Path, field: str, value: str, said: str
) -> None:
    f = tmp_path / "k.json"
    doc = kineto_doc(0, 1)
    event = doc["traceEvents"][1]
    f.write_text(
        json.dumps(doc).replace(json.dumps(event), json.dumps(event | {field: "@"}).replace('"@"', value), 1)
    )
    with pytest.raises(TraceImportError) as e:
        import_traces([f], None, tmp_path / "run")
    assert str(e.value).endswith(f"traceEvents[1] ({event['cat']}) has a malformed {said}")


def test_non_finite_times_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "k.json"
    f.write_text(json.dumps(kineto_doc(0, 1)).replace('"ts": 1,', '"ts": 1e400,', 1))
    with pytest.raises(
        TraceImportError,
        match=r"traceEvents\[1\] \(cpu_op\) has a malformed ts \(inf; expected a finite number\)",
    ):
        import_traces([f], None, tmp_path / "run")
    f.write_text(json.dumps(kineto_doc(0, 1)).replace('"ts": 1,', '"ts": "1",', 1))
    with pytest.raises(
        TraceImportError, match=r"traceEvents\[1\] \(cpu_op\) has a malformed ts \('1'; expected a"
    ):
        import_traces([f], None, tmp_path / "run")
    f.write_text(json.dumps(kineto_doc(0, 1)).replace('"ts": 1,', '"ts": NaN,', 1))
    with pytest.raises(TraceImportError, match="not standard JSON"):
        import_traces([f], None, tmp_path / "run")


def test_send_and_recv_take_their_peer_from_the_host_trace(tmp_path: Path) -> None:
    ks, hs = [], []
    for r, (op, peer) in enumerate((("send", 1), ("recv", 0))):
        doc = kineto_doc(r, comms=(f"nccl:{op}",), pid=100 + r)
        for e in doc["traceEvents"]:
            if e["cat"] == "kernel":
                e["name"] = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
        ks.append(_write(tmp_path / "k" / f"w{r}.json", doc))
        tensor = [10, 20, 0, 256, 4, "cuda:0"]
        nodes = [
            {"id": 4, "name": "record_param_comms", "parent": 1, "input_types": ["Tensor(float)", "Int",
             "Int", "Int", "String", "GenericList[]", "GenericList[]"],
             "inputs": [tensor, 7, 9999, peer, op, [], []]},
            {"id": 5, "name": f"nccl:{op}", "parent": 4, "inputs": [tensor],
             "input_types": ["Tensor(float)"]},
        ]  # fmt: skip
        hs.append(
            _write(tmp_path / "h" / f"et_{r}.json", {"schema": "1.0.1", "pid": 100 + r, "nodes": nodes})
        )
    import_traces(ks, hs, tmp_path / "run")
    (pair,) = load_run(tmp_path / "run").p2p
    assert (pair.src_rank, pair.dst_rank, pair.comm_bytes) == (0, 1, 1024)


def test_record_function_ids_join_host_ops_and_give_cross_thread_data_dependencies(tmp_path: Path) -> None:
    doc = kineto_doc(0, 1, comms=())
    doc["traceEvents"] = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": 1, "dur": 8,
         "args": {"Record function id": 11}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 200, "ts": 20, "dur": 8,
         "args": {"Record function id": 12}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 100, "tid": 100, "ts": 30, "dur": 8,
         "args": {"Record function id": 13}},
    ]  # fmt: skip

    def op(nid: int, name: str, rf: int, tid: int, ins: list[int], outs: list[int]) -> dict[str, Any]:
        def group(ts: list[int]) -> dict[str, Any]:
            return {"values": [[t, t, 0, 4, 4, "cuda:0"] for t in ts], "types": ["Tensor(float)"] * len(ts)}

        attrs = [{"name": "rf_id", "value": rf}, {"name": "tid", "value": tid}]
        return {
            "id": nid,
            "name": name,
            "ctrl_deps": 1,
            "attrs": attrs,
            "inputs": group(ins),
            "outputs": group(outs),
        }

    host = {
        "schema": "1.1.1-chakra.0.0.4",
        "pid": 100,
        "nodes": [
            op(2, "aten::mm", 11, 1, [1], [5]),
            op(3, "aten::add", 12, 2, [5], [6]),
            op(4, "aten::relu", 13, 1, [7], [8]),
        ],
    }
    k = _write(tmp_path / "k.json", doc)
    h = _write(tmp_path / "h.json", host)
    import_traces([k], [h], tmp_path / "run")
    nodes = {n.name: n for n in read_et(tmp_path / "run" / "rank-0.et").nodes}
    assert list(nodes["aten::add"].data_deps) == [nodes["aten::mm"].id]
    assert not nodes["aten::relu"].data_deps
    assert node_attrs(nodes["aten::add"])[Attr.RF_ID] == 12


def _host_ops(tid: int, names: str, *, first_id: int = 1) -> list[HostOp]:
    """Host-trace operators of observer thread ``tid``, one per space-separated name, in id order."""
    return [
        HostOp(node_id=first_id + k, name=n, tid=tid, rf_id=None, reads=(), writes=())
        for k, n in enumerate(names.split())
    ]


def _cpu_ops(tid: int, names: str, *, first_index: int = 0, rf_ids: list[int] | None = None) -> list[KEvent]:
    """Kineto ``cpu_op`` events of thread ``tid``, one per space-separated name, 10 us apart."""
    return [
        KEvent(
            index=first_index + k, name=n, cat="cpu_op", pid=100, tid=tid, start_ns=10_000 * k, dur_ns=5_000,
            args={}, rf_id=rf_ids[k] if rf_ids else None,
        )
        for k, n in enumerate(names.split())
    ]  # fmt: skip


def _joined(host: list[HostOp], kineto: list[KEvent]) -> dict[str, str]:
    """``kineto op -> host op`` of :func:`join_ops`, each op named ``name@index`` / ``name#node id``."""
    names = {e.index: e.name for e in kineto}
    return {f"{names[i]}@{i}": f"{h.name}#{h.node_id}" for i, h in sorted(join_ops(host, kineto).items())}


def test_a_record_function_id_joins_only_a_host_op_of_the_same_name() -> None:
    host = [HostOp(node_id=2, name="aten::mm", tid=1, rf_id=11, reads=(), writes=())]
    assert _joined(host, _cpu_ops(100, "aten::add", rf_ids=[11])) == {}
    assert _joined(host, _cpu_ops(100, "aten::mm", rf_ids=[11])) == {"aten::mm@0": "aten::mm#2"}


def test_kineto_ops_with_record_function_ids_join_a_host_trace_without_them_by_order() -> None:
    host = _host_ops(1, "aten::mm aten::add")
    kineto = _cpu_ops(100, "aten::mm aten::add", rf_ids=[11, 12])
    assert _joined(host, kineto) == {"aten::mm@0": "aten::mm#1", "aten::add@1": "aten::add#2"}


def test_the_order_join_resynchronises_by_the_shorter_skip_of_either_side() -> None:
    # at (b, c): the host's next c is 3 ops ahead, the Kineto side's next b 2 ahead: skip Kineto's c, y
    host = _host_ops(1, "a b y w c")
    kineto = _cpu_ops(100, "a c y b")
    assert _joined(host, kineto) == {"a@0": "a#1", "b@3": "b#2"}


def test_the_order_join_skips_host_ops_kineto_lacks_looking_past_the_next_two() -> None:
    # x, y, z are user annotations Kineto files apart: three host ops to skip to reach b (Kineto's y comes
    # after b, so it is not the host's y)
    host = _host_ops(1, "a x y z b")
    kineto = _cpu_ops(100, "a b y")
    assert _joined(host, kineto) == {"a@0": "a#1", "b@1": "b#5"}


def test_at_equal_skips_the_order_join_skips_the_host_op_which_may_be_an_annotation_kineto_lacks() -> None:
    host = _host_ops(1, "a ann b")
    kineto = _cpu_ops(100, "a b ann")
    assert _joined(host, kineto) == {"a@0": "a#1", "b@1": "b#3"}


def test_each_kineto_thread_is_paired_with_one_host_thread_the_one_sharing_most_op_names() -> None:
    host = _host_ops(1, "aten::mm aten::add") + _host_ops(2, "aten::mm", first_id=10)
    kineto = _cpu_ops(100, "aten::mm aten::add")
    assert _joined(host, kineto) == {"aten::mm@0": "aten::mm#1", "aten::add@1": "aten::add#2"}


def test_importing_traces_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, skewlens.profiler.importers, skewlens.cli.import_traces; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("dims", "size"),
    [([2**40, 2**40], str(2**82)), ([2**62], str(2**64)), ([10**4000, 10**4000, 3], r"over 2\*\*128")],
)
def test_sizes_that_do_not_fit_chakras_int64_fields_are_refused(
    tmp_path: Path, dims: list[int], size: str
) -> None:
    # a dim of 2**62 or more was no tensor: a collective of 0 bytes, imported without a word
    doc = kineto_doc(0, 1)
    for e in doc["traceEvents"]:
        if e["name"] == "nccl:all_reduce":
            e["args"]["Input Dims"] = [dims]
    f = _write(tmp_path / "k.json", doc)
    with pytest.raises(TraceImportError, match=rf"k\.json: rank 0: .* has size {size} out of range$"):
        import_traces([f], None, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_errors_in_archive_members_name_the_archive_and_member(tmp_path: Path) -> None:
    arc = _tar(tmp_path / "t.tar.gz", [("d/r0.json", b"[1, 2")])
    with pytest.raises(TraceImportError, match=r"t\.tar\.gz/d/r0\.json: not JSON"):
        import_traces([arc], None, tmp_path / "run")


def test_gloo_work_on_a_worker_thread_becomes_a_node_that_waits_for_its_issuing_op(tmp_path: Path) -> None:
    # the shape torch 2.13 records for gloo: c10d::allreduce_ on the main thread returns at once, the
    # gloo:all_reduce annotation runs later on a gloo worker thread (no kernel, no record_param_comms)
    files = []
    for r in (0, 1):
        ev = [
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 9, "tid": 9, "ts": 10, "dur": 5},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::broadcast_", "pid": 9, "tid": 9, "ts": 20, "dur": 5},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 9, "tid": 77, "ts": 12,
             "dur": 50, "args": {"Input Dims": [[64]], "Input type": ["float"]}},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:broadcast", "pid": 9, "tid": 78, "ts": 23,
             "dur": 9, "args": {"Input Dims": [[8]], "Input type": ["long int"]}},
        ]  # fmt: skip
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2}, "traceEvents": ev}
        files.append(_write(tmp_path / f"k{r}.json", doc))
    import_traces(files, None, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert [(c.comm_type, c.comm_bytes) for c in run.collectives] == [
        (CommType.ALL_REDUCE, (256, 256)),
        (CommType.BROADCAST, (64, 64)),
    ]
    nodes = {n.name: n for n in read_et(tmp_path / "run" / "rank-1.et").nodes}
    assert list(nodes["gloo:all_reduce"].ctrl_deps) == [nodes["c10d::allreduce_"].id]
    assert list(nodes["gloo:broadcast"].ctrl_deps) == [nodes["c10d::broadcast_"].id]
    assert node_attrs(nodes["gloo:all_reduce"])[Attr.STREAM] == 77


def _malformed(doc: dict[str, Any], how: str) -> dict[str, Any]:
    ev = doc["traceEvents"]
    if how == "schema":
        doc["schemaVersion"] = []
    elif how == "ts":
        ev[1]["ts"] = 1e308
    elif how == "rfid":
        ev[1]["args"] = {"Record function id": 2**70}
    elif how == "pg_ranks":
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [{"a": 1}, 1]}]
    elif how == "pg_rank_float":
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1.5]}]
    elif how == "pg_rank_out":
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2]}]  # of world size 2
    return doc


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("schema", r"Kineto schemaVersion \[\] is not supported"),
        ("ts", r"traceEvents\[1\] has ts/dur out of range"),
        ("pg_ranks", r"malformed distributedInfo.pg_config entry"),
        ("pg_rank_float", r"malformed distributedInfo.pg_config entry"),
        ("pg_rank_out", r"distributedInfo.pg_config group '0' lists rank 2, outside world size 2"),
        ("bigint", r"not usable JSON \(an integer of more than 4,300 digits\)"),
    ],
)
def test_malformed_kineto_fields_are_one_error_naming_the_file_not_a_traceback(
    tmp_path: Path, how: str, says: str
) -> None:
    # each was a TypeError, OverflowError or ValueError traceback (an in-process fuzz found 20 in 1,500)
    f = tmp_path / "in" / "rank0.json"
    if how == "bigint":
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(kineto_doc(0)).replace('"ts": 1,', '"ts": ' + "9" * 5000 + ",", 1))
    else:
        _write(f, _malformed(kineto_doc(0), how))
    with pytest.raises(TraceImportError, match=f"rank0.json: {says}"):
        import_traces([f], None, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_record_function_id_past_int64_is_dropped_not_a_traceback_when_the_nodes_are_written(
    tmp_path: Path,
) -> None:
    f = _write(tmp_path / "in" / "rank0.json", _malformed(kineto_doc(0), "rfid"))
    import_traces([f], None, tmp_path / "run")
    nodes = [n for _, n in iter_nodes(tmp_path / "run" / "rank-0.et")]
    (mm,) = [n for n in nodes if n.name == "aten::mm"]
    assert "rf_id" not in {a.name for a in mm.attr}  # dropped, not written past int64


def test_a_data_dependency_already_given_by_program_order_is_not_written_again_as_data(
    tmp_path: Path,
) -> None:
    # convert.py: a node gets a data dependency on the earlier CPU node that wrote a tensor it reads unless
    # that is already a control dependency: aten::add reads tensor 5, written by aten::mm just before it on
    # the same thread (its program-order control dependency) -> no data dependency
    doc = kineto_doc(0, 1, comms=())
    doc["traceEvents"] = [
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": 8,
         "args": {"Record function id": rf}} for name, ts, rf in (("aten::mm", 1, 11), ("aten::add", 20, 12))
    ]  # fmt: skip

    def op(nid: int, name: str, rf: int, ins: list[int], outs: list[int]) -> dict[str, Any]:
        def group(ts: list[int]) -> dict[str, Any]:
            return {"values": [[t, t, 0, 4, 4, "cuda:0"] for t in ts], "types": ["Tensor(float)"] * len(ts)}

        attrs = [{"name": "rf_id", "value": rf}, {"name": "tid", "value": 1}]
        return {"id": nid, "name": name, "ctrl_deps": 1, "attrs": attrs, "inputs": group(ins),
                "outputs": group(outs)}  # fmt: skip

    host = {"schema": "1.1.1-chakra.0.0.4", "pid": 100,
            "nodes": [op(2, "aten::mm", 11, [1], [5]), op(3, "aten::add", 12, [5], [6])]}  # fmt: skip
    import_traces([_write(tmp_path / "k.json", doc)], [_write(tmp_path / "h.json", host)], tmp_path / "run")
    nodes = {n.name: n for n in read_et(tmp_path / "run" / "rank-0.et").nodes}
    assert list(nodes["aten::add"].ctrl_deps) == [nodes["aten::mm"].id]
    assert not nodes["aten::add"].data_deps


_X = {"ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1}


@pytest.mark.parametrize(
    ("events", "says"),
    [
        ([], "its traceEvents list is empty (no operators, GPU kernels or ProfilerStep# marks)"),
        (
            [
                {**_X, "cat": "user_annotation", "name": "ProfilerStep#3"},
                {**_X, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 7}},
                {"ph": "i", "name": "marker", "ts": 3, "pid": 1, "tid": 1},
            ],
            (
                "none of its 3 traceEvents is a host operator (cpu_op) or GPU activity (gpu_memcpy, "
                "gpu_memset, kernel) (it has ProfilerStep# marks, but no work in them)"
            ),
        ),
    ],
)
def test_a_trace_with_no_operator_or_gpu_activity_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], events: list[dict[str, Any]], says: str
) -> None:
    # was imported as a rank with one metadata node: check said OK and analyze printed empty tables
    from skewlens.cli import main

    f = _write(tmp_path / "in" / "e.json", {"traceEvents": events})
    out = tmp_path / "run"
    assert main(["import", "--kineto", str(f), "--rank", "0", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"skewlens import: error: {f}: nothing to import: {says}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_truncated_trace_names_the_line_and_column_where_its_json_ends_without_a_dangling_at(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"name": "aten::m')
    with pytest.raises(TraceImportError) as e:
        import_traces([bad], None, tmp_path / "run")
    # was "(line 1 column 27: Unterminated string starting at)"
    assert str(e.value) == f"{bad}: not JSON (line 1 column 27: Unterminated string)"


def test_process_group_ranks_or_a_host_pg_init_node_nested_too_deeply_are_one_line_not_a_traceback(
    tmp_path: Path,
) -> None:
    # JSON inside JSON strings: "[[[[..." 50,000 deep in either was a RecursionError traceback
    deep = "[" * 50_000 + "]" * 50_000
    doc = kineto_doc(0, world=1)
    for e in doc["traceEvents"]:
        if e["name"] == "record_param_comms":
            e["args"] = {"Process Group Ranks": deep, "Process Group Name": "0"}
    k = _write(tmp_path / "in" / "rank0.json", doc)
    m = import_traces([k], None, tmp_path / "run")  # ranks it cannot read are ranks it was not given
    assert m.process_groups[0].ranks == (0,)
    host = host_doc()
    host["nodes"].append(
        {"id": 99, "name": "## process_group:init ##", "ctrl_deps": 1,
         "inputs": {"values": [deep], "shapes": [[]], "types": ["String"]}}
    )  # fmt: skip
    h = _write(tmp_path / "in" / "host0.json", host)
    with pytest.raises(
        TraceImportError, match=r"host0\.json: malformed process-group init node \(RecursionError: "
    ):
        import_traces(
            [_write(tmp_path / "in2" / "rank0.json", kineto_doc(0, world=1))], [h], tmp_path / "run2"
        )


def test_a_full_disk_while_extracting_an_archive_blames_the_scratch_space_not_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    class FullDisk:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *_exc: object) -> None:
            self.fh.close()

        def close(self) -> None:
            self.fh.close()

        def write(self, _data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = Path.open

    def open_(self: Path, mode: str = "r", *a: Any, **k: Any) -> Any:
        fh = real_open(self, mode, *a, **k)
        return FullDisk(fh) if mode == "wb" else fh

    arc = _tar(tmp_path / "t.tar.gz", [("d/r0.json", json.dumps(kineto_doc(0)).encode())])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(Path, "open", open_)
    # was "t.tar.gz: cannot read archive ([Errno 28] No space left on device)": the input blamed
    with pytest.raises(TraceImportError) as e:
        import_traces([arc], None, tmp_path / "run")
    assert str(e.value) == (
        f"{arc}: cannot extract d/r0.json into {scratch} (No space left on device); TMPDIR names another "
        "place for the import's scratch files"
    )
    assert list(scratch.iterdir()) == [] and not (tmp_path / "run").exists()


def test_a_full_disk_while_converting_names_the_trace_and_the_scratch_space_not_a_removed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    real_write_bytes = Path.write_bytes

    def write_bytes(self: Path, data: Any) -> int:
        if self.suffix == ".nodes":
            raise OSError(errno.EFBIG, "File too large")
        return real_write_bytes(self, data)

    trace = _write(tmp_path / "k" / "r0.json", kineto_doc(0))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    # was "/tmp/skewlens-import-x1/nodes/0.nodes: cannot write scratch data ([Errno 27] File too large)"
    with pytest.raises(TraceImportError) as e:
        import_traces([trace], None, tmp_path / "run", workers=1)
    assert str(e.value) == (
        f"{trace}: cannot write its converted nodes into {scratch} (File too large); TMPDIR names another "
        "place for the import's scratch files"
    )
    assert list(scratch.iterdir()) == [] and not (tmp_path / "run").exists()


def test_a_full_disk_while_writing_the_run_is_one_plain_line_and_leaves_no_staging_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from skewlens.profiler.chakra_io import EtWriter

    def full(_self: EtWriter, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    trace = _write(tmp_path / "k" / "r0.json", kineto_doc(0))
    monkeypatch.setattr(EtWriter, "write_raw", full)
    with pytest.raises(TraceImportError) as e:
        import_traces([trace], None, tmp_path / "run", workers=1)
    # was "...: cannot write the run directory ([Errno 28] No space left on device)"
    assert str(e.value) == f"{tmp_path / 'run'}: cannot write the run directory (No space left on device)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_a_staging_directory_that_cannot_be_made_is_the_imports_own_error_naming_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the staging directory's own error ("cannot write RUN: ...") is a TraceImportError, as every other of
    # the import's is: not the plain SkewlensError staging_dir raises
    import errno
    import tempfile

    made = tempfile.mkdtemp

    def full_there(*args: Any, **kwargs: Any) -> str:
        if str(kwargs.get("prefix", "")).startswith(".run."):  # the run's staging directory, not the scratch
            raise OSError(errno.ENOSPC, "No space left on device")
        return made(*args, **kwargs)

    trace = _write(tmp_path / "k" / "r0.json", kineto_doc(0))
    monkeypatch.setattr(tempfile, "mkdtemp", full_there)
    with pytest.raises(TraceImportError) as e:
        import_traces([trace], None, tmp_path / "run", workers=1)
    assert type(e.value) is TraceImportError
    assert str(e.value).startswith(f"cannot write {tmp_path / 'run'}: ")
    assert "No space left on device" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_an_import_killed_while_it_wrote_leaves_a_staging_directory_that_the_next_import_beside_it_removes(
    tmp_path: Path,
) -> None:
    # SIGKILL (the OOM killer) while an import wrote its run left RUNS/.night1.import-<random>/ with its rank
    # files, which no later command removed (a nightly import into a new RUNS/<date> each night: one more
    # for each killed night); it is a staging directory as every command's is now
    trace = _write(tmp_path / "k" / "r0.json", kineto_doc(0, world=1))
    runs = tmp_path / "runs"
    killed = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from skewlens.profiler.chakra_io import EtWriter\n"
        "from skewlens.profiler.importers import import_traces\n"
        "EtWriter.write_raw = lambda self, data: os.kill(os.getpid(), signal.SIGKILL)\n"
        "import_traces([Path(sys.argv[1])], None, Path(sys.argv[2]), workers=1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", killed, str(trace), str(runs / "night1")]
    assert subprocess.run(argv, env=env, timeout=120, check=False).returncode == -signal.SIGKILL
    (left,) = runs.iterdir()
    (half,) = left.iterdir()  # rank 0's file, being written
    assert left.name.startswith(".night1.") and half.name.startswith(".rank-0.et.")
    import_traces([trace], None, runs / "night2", workers=1)
    assert sorted(p.name for p in runs.iterdir()) == ["night2"]


def test_two_imports_replacing_one_run_at_once_leave_the_last_one_and_no_hidden_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    out = tmp_path / "run"
    first = _write(tmp_path / "k" / "r0.json", kineto_doc(0, world=1))
    doc = kineto_doc(0, world=1)
    doc["traceEvents"][0]["name"] = "ProfilerStep#4"  # to tell the two runs apart
    second = _write(tmp_path / "k2" / "r0.json", doc)
    import_traces([first], None, out, workers=1)
    import_traces([second], None, tmp_path / "other", workers=1)  # the other import's finished run
    real_rename, real_replace = Path.rename, Path.replace
    threads: list[threading.Thread] = []

    def moved(real: Any) -> Any:
        def move(self: Path, target: Any) -> Path:
            done = real(self, target)
            if self == out and not threads:  # the earlier run moved aside: the other import ends now
                threads.append(threading.Thread(target=replace_dir, args=(tmp_path / "other", out)))
                threads[0].start()
                threads[0].join(timeout=0.5)  # or waits for the lock
            return done

        return move

    monkeypatch.setattr(Path, "rename", moved(real_rename))
    monkeypatch.setattr(Path, "replace", moved(real_replace))
    # was "RUN: cannot write the run directory (Directory not empty)", the earlier run left hidden as
    # .run.old-.run.import-XXXX: the other import put its run in place between this one's two renames
    import_traces([first], None, out, workers=1, overwrite=True)
    threads[0].join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k2", "run"]
    assert [s.step for s in read_manifest(out).steps] == [4]


@pytest.mark.parametrize("names", [("a.json", "a.json/b.json"), ("a.json/b.json", "a.json")])
def test_archive_members_that_need_one_path_as_a_file_and_a_folder_blame_the_archive_not_the_scratch_space(
    tmp_path: Path, names: tuple[str, str]
) -> None:
    doc = json.dumps(kineto_doc(0, world=1)).encode()
    arc = _tar(tmp_path / "t.tar.gz", [(n, doc) for n in names])
    # was "cannot extract a.json/b.json into /tmp (File exists); TMPDIR names another place ..."
    with pytest.raises(TraceImportError) as e:
        import_traces([arc], None, tmp_path / "run")
    assert str(e.value) == (
        f"{arc}: member {names[1]} and another member need one path as both a file and a folder"
    )


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
def test_a_sparse_member_inflating_past_a_plain_archives_bound_is_refused_as_it_is_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a sparse member's zeros come from no byte of the stream: only the count of bytes extracted bounds them
    import functools
    import subprocess

    from skewlens.profiler import bounded
    from skewlens.profiler.importers import sources

    (tmp_path / "hole.json").touch()
    os.truncate(tmp_path / "hole.json", 1 << 20)
    subprocess.run(["tar", "--sparse", "-cf", "s.tar", "hole.json"], cwd=tmp_path, check=True)
    monkeypatch.setattr(sources, "open_archive", functools.partial(bounded.open_archive, floor=4096))
    with pytest.raises(
        TraceImportError, match=r"s\.tar: extracted data exceeds the limit at member hole\.json"
    ):
        sources.extract_traces(tmp_path / "s.tar", tmp_path / "out")


def test_an_archive_of_exactly_the_most_members_is_read_and_one_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skewlens.profiler.importers import sources

    monkeypatch.setattr(sources, "MAX_ARCHIVE_MEMBERS", 3)
    for n in (3, 4):
        archive = tmp_path / f"{n}.tar"
        with tarfile.open(archive, "w") as tf:
            for i in range(n):
                info = tarfile.TarInfo(f"w{i}.json")
                info.size = 2
                tf.addfile(info, io.BytesIO(b"{}"))
        if n == 3:
            assert len(sources.extract_traces(archive, tmp_path / "out3")) == 3
        else:
            with pytest.raises(TraceImportError, match=r"4\.tar: more than 3 members"):
                sources.extract_traces(archive, tmp_path / "out4")


def test_a_folder_is_walked_in_name_order_past_links_to_nothing_and_fifos_named_as_traces(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.importers.sources import _walk_dir

    for sub in ("b", "a", "c"):  # made out of order: the walk sorts them
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "t.json").write_text("{}")
    (tmp_path / "a" / "gone.json").symlink_to(tmp_path / "nowhere.json")
    os.mkfifo(tmp_path / "b" / "pipe.json")
    assert _walk_dir(tmp_path) == [tmp_path / s / "t.json" for s in ("a", "b", "c")]


def test_a_corrupt_trace_read_from_an_archive_is_named_by_its_member_not_its_scratch_copy(
    tmp_path: Path,
) -> None:
    f = tmp_path / "scratch" / "w0.json"
    f.parent.mkdir()
    f.write_text('{"traceEvents": [')
    with pytest.raises(TraceImportError) as e:
        read_json(f, label=Path("traces.tar/w0.json"))
    assert str(e.value).startswith("traces.tar/w0.json") and "scratch" not in str(e.value)
