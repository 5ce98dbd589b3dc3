"""The ASTRA-sim export: what it writes, read back with Chakra's own reader (the format authority)."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chakra.schema.protobuf.et_def_pb2 import Node
from chakra_reader import read_with_chakra
from rich.console import Console

from skewlens.cli import main as cli_main
from skewlens.cli.store import export_main
from skewlens.profiler import chakra_schema as pb
from skewlens.profiler.chakra_io import EtWriter, TraceNode, node_attrs, pg_init_node, read_et, write_et
from skewlens.profiler.errors import SkewlensError, TraceFormatError, ValidationError
from skewlens.profiler.manifest import Manifest, ProcessGroupInfo, StepSpan, rank_file, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.synth import RankBuilder, RunBuilder
from skewlens.profiler.vocab import COMM_NODE_TYPES, Attr, CommType, NodeType
from skewlens.replay import export_astra
from skewlens.replay.execution import execution_model, gpu_busy, recorded_wait_work_ns
from skewlens.replay.export_astra import (
    ASTRA_SUPPORTED,
    BARRIER_BYTES,
    HOST_OP,
    MIN_COMM_BYTES,
    SRC_COMM_TYPE,
    SRC_PG_NAME,
    export_astra_sim,
)
from skewlens.replay.lower import collective_bytes

WORLD = 4
GROUPS = {"0": (0, 1, 2, 3), "1": (0, 1), "2": (2, 3)}


def _run(tmp_path: Path, groups: dict[str, tuple[int, ...]] | None = None) -> Path:
    """Two steps on 4 ranks: all-reduce, all-gather, a sub-group all-reduce, send/recv, a barrier."""
    groups = groups or GROUPS
    sub = [g for g in groups if len(groups[g]) < WORLD]
    b = RunBuilder(world_size=WORLD, groups=groups)
    for step in range(2):
        for r in range(WORLD):
            rb = b.rank(r).step(step)
            rb.compute("aten::mm", dur_ns=1_000_000 + 250_400 * r, deps=(0,) if step == 0 else ())
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=300_000)
            rb.compute("aten::add", dur_ns=200_600)
            rb.collective(CommType.ALL_GATHER, comm_bytes=1 << 18, dur_ns=150_000)
            mine = next(g for g in sub if r in groups[g])
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 16, dur_ns=80_000, pg=mine)
            if r % 2 == 0:
                rb.send(r + 1, 4096 + step, dur_ns=20_000, tag=7 + r)
            else:
                rb.recv(r - 1, 4096 + step, dur_ns=20_000, tag=7 + r - 1)
            rb.collective(CommType.BARRIER, comm_bytes=0, dur_ns=30_000, name="c10d::barrier")
    return b.write(tmp_path / "run")


def _attrs(node: Node) -> dict[str, Any]:
    out = {}
    for a in node.attr:
        kind = a.WhichOneof("value")
        out[a.name] = getattr(a, kind) if kind else None
    return out


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, export_astra.AstraExport]:
    run = _run(tmp_path)
    return run, export_astra_sim(run, tmp_path / "astra")


def test_every_rank_gets_the_file_astra_sims_feeder_opens_for_the_workload_prefix(exported) -> None:
    _run_dir, res = exported
    assert sorted(p.name for p in res.out_dir.glob("*.et")) == [f"workload.{r}.et" for r in range(WORLD)]
    for r in range(WORLD):
        assert res.traces[r] == Path(f"{res.prefix}.{r}.et")  # what ASTRA-sim opens: <prefix>.<npu>.et
        gm, nodes = read_with_chakra(res.traces[r])
        assert len(nodes) == res.nodes[r] > 0
        assert {a.name for a in gm.attr} >= {"schema", "rank", "world_size"}


def test_no_node_type_astra_sim_rejects_is_written_and_the_metadata_node_is_gone(exported) -> None:
    _run_dir, res = exported
    for path in res.traces.values():
        _gm, nodes = read_with_chakra(path)
        types = {n.type for n in nodes}
        assert types <= {NodeType.COMP, NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV}
        assert "## process_group:init ##" not in {n.name for n in nodes}
    assert res.changes["METADATA nodes dropped"] == WORLD


def test_every_comm_node_is_off_the_cpu_with_a_collective_type_astra_sim_issues(exported) -> None:
    _run_dir, res = exported
    supported = {int(t) for t in ASTRA_SUPPORTED}
    for path in res.traces.values():
        _gm, nodes = read_with_chakra(path)
        for n in nodes:
            a = _attrs(n)
            assert a[Attr.IS_CPU_OP] is False, n.name  # compute too: ASTRA-sim's NPU compute
            assert a[HOST_OP] is True  # the source's fact, kept in our own attribute
            if n.type == NodeType.COMM_COLL:
                assert a[Attr.COMM_TYPE] in supported
                assert a[Attr.COMM_TYPE] != CommType.BARRIER


def test_a_barrier_becomes_a_four_byte_all_reduce_over_its_group(exported) -> None:
    _run_dir, res = exported
    _gm, nodes = read_with_chakra(res.traces[2])
    barriers = [n for n in nodes if n.name == "c10d::barrier"]
    assert len(barriers) == 2
    for n in barriers:
        a = _attrs(n)
        assert a[Attr.COMM_TYPE] == CommType.ALL_REDUCE
        assert a[Attr.COMM_SIZE] == BARRIER_BYTES
        assert a[SRC_COMM_TYPE] == CommType.BARRIER
        assert a[Attr.PG_NAME] == "0"
    assert res.changes["BARRIER -> ALL_REDUCE"] == 2 * WORLD


def test_a_barrier_recorded_with_more_than_four_bytes_keeps_its_size(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.BARRIER, comm_bytes=64, dur_ns=30_000, name="c10d::barrier")
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    _gm, nodes = read_with_chakra(res.traces[0])
    (barrier,) = [n for n in nodes if n.name == "c10d::barrier"]
    assert _attrs(barrier)[Attr.COMM_SIZE] == 64


def test_every_dependency_names_a_node_of_the_same_file_and_ids_are_unique(exported) -> None:
    _run_dir, res = exported
    for path in res.traces.values():
        _gm, nodes = read_with_chakra(path)
        ids = [n.id for n in nodes]
        assert len(ids) == len(set(ids))
        for n in nodes:
            assert set(n.ctrl_deps) | set(n.data_deps) <= set(ids), n.name
            assert n.id not in n.ctrl_deps


def test_sizes_peers_tags_groups_and_durations_are_those_of_the_source(exported) -> None:
    run, res = exported
    for r in range(WORLD):
        src = {n.id: n for n in read_et(rank_file(run, r)).nodes if n.type != NodeType.METADATA}
        _gm, nodes = read_with_chakra(res.traces[r])
        assert {n.id for n in nodes} == set(src)
        for n in nodes:
            s, a, sa = src[n.id], _attrs(n), node_attrs(src[n.id])
            assert (n.name, n.type, n.start_time_micros) == (s.name, s.type, s.start_time_micros)
            assert n.duration_micros == (sa[Attr.DUR_NS] + 500) // 1000  # nearest microsecond
            assert a[Attr.DUR_NS] == sa[Attr.DUR_NS]
            if n.type in COMM_NODE_TYPES and s.name != "c10d::barrier":
                assert a[Attr.COMM_SIZE] == sa[Attr.COMM_SIZE]
                assert a[Attr.PG_NAME] == sa[Attr.PG_NAME]
            if n.type in (NodeType.COMM_SEND, NodeType.COMM_RECV):
                for k in (Attr.COMM_SRC, Attr.COMM_DST, Attr.COMM_TAG):
                    assert a[k] == sa[k]
        # the first compute node depended on the metadata node (id 0), which had no dependency itself
        first = next(n for n in nodes if n.name == "aten::mm")
        assert 0 in src[first.id].ctrl_deps and list(first.ctrl_deps) == list(first.data_deps) == []


def test_every_dependency_is_a_data_dependency_as_chakras_own_feeder_follows_only_those(exported) -> None:
    run, res = exported
    for r in range(WORLD):
        src = {n.id: n for n in read_et(rank_file(run, r)).nodes}
        _gm, nodes = read_with_chakra(res.traces[r])
        assert sum(len(n.data_deps) for n in nodes) > len(nodes) // 2
        for n in nodes:
            assert list(n.ctrl_deps) == []
            assert set(n.data_deps) == {*src[n.id].ctrl_deps, *src[n.id].data_deps} - {0}  # 0: metadata


def test_a_dependency_listed_as_data_and_as_ctrl_is_exported_once_after_the_data_ones(tmp_path: Path) -> None:
    # a converter trace may name a node in both lists; the export keeps each dependency once, in data_deps
    b = RunBuilder(world_size=2)
    for rb in (b.rank(r).step(0) for r in range(2)):
        a = rb.compute("aten::mm", MS, start_ns=0)
        c = rb.compute("aten::add", MS, start_ns=0, stream=3)
        rb.compute("aten::cat", MS, start_ns=MS)
        rb.nodes[-1] = dataclasses.replace(rb.nodes[-1], ctrl_deps=(a, c), data_deps=(c,))
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    for r in range(2):
        _gm, nodes = read_with_chakra(res.traces[r])
        assert [(list(n.data_deps), list(n.ctrl_deps)) for n in nodes if n.name == "aten::cat"] == [
            ([c, a], [])
        ]


def test_the_comm_group_file_lists_exactly_each_sub_groups_members(exported) -> None:
    _run_dir, res = exported
    data = json.loads(res.comm_groups.read_text())
    assert data == {"1": [0, 1], "2": [2, 3]}  # "0", every NPU, is ASTRA-sim's default and not listed
    assert f"--comm-group-configuration={res.comm_groups}" in res.command


def test_groups_without_a_positive_integer_name_get_the_next_free_id(tmp_path: Path) -> None:
    run = _run(tmp_path, groups={"0": (0, 1, 2, 3), "tp_a": (0, 1), "5": (2, 3)})
    res = export_astra_sim(run, tmp_path / "astra")
    assert json.loads(res.comm_groups.read_text()) == {"5": [2, 3], "6": [0, 1]}
    _gm, nodes = read_with_chakra(res.traces[0])
    sub = [_attrs(n) for n in nodes if _attrs(n).get(SRC_PG_NAME) == "tp_a"]
    assert len(sub) == 2 and {a[Attr.PG_NAME] for a in sub} == {"6"}
    assert {(g.source_name, g.astra_id) for g in res.groups} == {("0", "0"), ("tp_a", "6"), ("5", "5")}


def test_a_group_named_0_that_is_not_every_rank_is_a_sub_group_with_an_id_of_its_own() -> None:
    # "0" is ASTRA-sim's group of all NPUs: a group of that name and fewer members takes the next free id
    groups = [ProcessGroupInfo(name="0", ranks=(0, 1)), ProcessGroupInfo(name="1", ranks=(2, 3))]
    got = export_astra.astra_groups(groups, 4)
    assert {n: g.astra_id for n, g in got.items()} == {"0": "2", "1": "1"}
    assert export_astra.comm_group_json(got.values()) == {"1": [2, 3], "2": [0, 1]}
    world = export_astra.astra_groups([ProcessGroupInfo(name="0", ranks=(1, 0, 2, 3))], 4)
    assert export_astra.comm_group_json(world.values()) == {} and world["0"].astra_id == "0"


def test_a_collective_of_a_one_member_group_is_replayed_as_a_broadcast(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "1": (0,), "2": (1,)})
    for r in range(2):
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1 << 16, dur_ns=10_000, pg=str(r + 1))
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1 << 16, dur_ns=10_000)
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    _gm, nodes = read_with_chakra(res.traces[1])
    types = [(_attrs(n)[Attr.PG_NAME], _attrs(n)[Attr.COMM_TYPE]) for n in nodes]
    assert types == [("2", CommType.BROADCAST), ("0", CommType.ALL_REDUCE)]
    assert _attrs(nodes[0])[SRC_COMM_TYPE] == CommType.ALL_REDUCE
    assert json.loads(res.comm_groups.read_text()) == {"1": [0], "2": [1]}


def test_a_group_no_one_lists_is_refused_naming_the_file_and_the_group(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=64, dur_ns=1000, pg="9")
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match=rf"{rank_file(run, 0)}: node 1 .* process group '9'"):
        export_astra_sim(run, tmp_path / "astra", strict=False)
    assert not (tmp_path / "astra").exists()


def test_without_strict_a_dangling_dependency_is_dropped_and_counted(tmp_path: Path) -> None:
    b = RunBuilder(world_size=1)
    b.rank(0).compute("aten::mm", dur_ns=1000)
    b.rank(0).compute("aten::add", dur_ns=1000, deps=(77,))
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match="not exported"):
        export_astra_sim(run, tmp_path / "astra")
    res = export_astra_sim(run, tmp_path / "astra", strict=False)
    _gm, nodes = read_with_chakra(res.traces[0])
    assert [(list(n.ctrl_deps), list(n.data_deps)) for n in nodes] == [([], []), ([], [1])]
    assert res.changes["dangling dependencies dropped"] == 1


def test_the_command_line_names_the_prefix_and_the_example_configs_written_beside_it(exported) -> None:
    _run_dir, res = exported
    cmd = res.command
    assert cmd[0] == "AstraSim_Analytical_Congestion_Unaware"
    assert f"--workload-configuration={res.prefix}" in cmd
    for flag, path in (
        ("--system-configuration", res.system_config),
        ("--network-configuration", res.network_config),
        ("--remote-memory-configuration", res.memory_config),
    ):
        assert path is not None and path.is_file() and f"{flag}={path}" in cmd
    assert res.network_config is not None
    assert f"npus_count: [ {WORLD} ]" in res.network_config.read_text()  # ASTRA-sim: one NPU per rank
    assert json.loads((res.out_dir / "export.json").read_text())["command"] == list(cmd)
    assert res.command_line.startswith("AstraSim_Analytical_Congestion_Unaware --workload-configuration=")


def test_without_configs_the_command_names_placeholders_for_the_user_to_supply(tmp_path: Path) -> None:
    res = export_astra_sim(_run(tmp_path), tmp_path / "astra", configs=False)
    assert res.system_config is None and not (res.out_dir / "system.json").exists()
    assert "--system-configuration=<SYSTEM.json>" in res.command
    assert "--network-configuration=<NETWORK.yml>" in res.command


def test_the_export_loads_back_in_skewlens_own_store_as_a_chakra_prefix(exported) -> None:
    _run_dir, res = exported
    report = validate_run(res.prefix)
    assert report.ok, [i.message for i in report.errors]
    assert report.run is not None and len(report.run.collectives) == 10


def test_a_corrupt_trace_gives_an_error_naming_the_file_and_writes_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path)
    bad = rank_file(run, 2)
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) - 7])
    for strict in (True, False):
        with pytest.raises((TraceFormatError, ValidationError), match=str(bad)):
            export_astra_sim(run, tmp_path / "astra", strict=strict)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failure_midway_leaves_the_previous_export_whole_and_no_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)
    out = tmp_path / "astra"
    export_astra_sim(run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = export_astra._rewrite_rank

    def fail_on_rank_2(ctx: Any) -> list[Node]:
        if ctx.rank == 2:
            raise OSError("disk full")
        return real(ctx)

    monkeypatch.setattr(export_astra, "_rewrite_rank", fail_on_rank_2)
    with pytest.raises(SkewlensError, match=f"^cannot write {out}: disk full$"):  # was the OSError itself
        export_astra_sim(run, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["astra", "run"]


def test_a_non_empty_directory_that_is_no_export_is_not_replaced(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SkewlensError, match="not an earlier ASTRA-sim export"):
        export_astra_sim(run, out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_missing_rank_is_refused_because_astra_sim_needs_a_trace_per_npu(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    b.rank(0).compute("aten::mm", dur_ns=1000)
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match=r"rank\(s\) 1 of 2 have no trace"):
        export_astra_sim(run, tmp_path / "astra")


def test_communication_that_matches_no_other_rank_is_refused_as_a_stall_to_astra_sim(tmp_path: Path) -> None:
    # DDP under Join, rank 1 out of batches after step 0: its (partial) trace ends there, and rank 0's step-1
    # all_reduce is left out of matching (step 1 incomplete: a warning, no error). Before, it was exported on
    # rank 0 alone, where ASTRA-sim waits for rank 1 forever; the real replay refuses such a run
    from skewlens.profiler.manifest import PARTIAL_TRACE_NOTE, read_manifest

    b = RunBuilder(2)
    for step in (0, 1):
        for r in (0, 1) if step == 0 else (0,):
            rb = b.rank(r).step(step)
            rb.compute("fwd", 1000)
            rb.collective(CommType.ALL_REDUCE, 1024, 1000)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    write_manifest(run, dataclasses.replace(m, notes={**m.notes, "rank 1": f"{PARTIAL_TRACE_NOTE}: 1 of 2"}))
    assert validate_run(run).ok
    with pytest.raises(ValidationError) as e:
        export_astra_sim(run, tmp_path / "astra", allow_option="--allow-errors")
    assert str(e.value) == (
        f"{run}: not exported: 1 communication node(s) match no other rank (incomplete steps 1), first rank "
        "0's c10d::all_reduce_ (node 4, group '0' seq 1, step 1): ASTRA-sim would stall on each, waiting for "
        "peers that never issue it (skewlens check says why they were left out of matching; --allow-errors "
        "exports them all the same)"
    )
    assert not (tmp_path / "astra").exists()
    got = export_astra_sim(run, tmp_path / "astra", strict=False)  # as asked
    assert got.nodes == {0: 4, 1: 2}


def test_many_missing_ranks_are_named_as_ranges(tmp_path: Path) -> None:
    b = RunBuilder(world_size=128)
    for r in (0, 1, 5):
        b.rank(r).compute("aten::mm", dur_ns=1000)
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match=r"rank\(s\) 2-4, 6-127 of 128 have no trace; ASTRA-sim") as e:
        export_astra_sim(run, tmp_path / "astra")
    assert len(str(e.value)) < 200


def _gpu_rank(path: Path) -> None:
    """A rank with host ops launching GPU kernels: host 1 -> kernel 2, host 3 -> kernel 4 (data dep)."""
    world = ProcessGroupInfo(name="0", ranks=(0,))
    nodes = [
        pg_init_node([world]),
        TraceNode(node_id=1, name="aten::mm", node_type=NodeType.COMP, start_ns=0, dur_ns=5000,
                  ctrl_deps=(0,), attrs={Attr.IS_CPU_OP: True}),
        TraceNode(node_id=2, name="sm90_gemm", node_type=NodeType.COMP, start_ns=4000, dur_ns=90_000,
                  ctrl_deps=(1,), attrs={Attr.IS_CPU_OP: False}),
        TraceNode(node_id=3, name="aten::add", node_type=NodeType.COMP, start_ns=6000, dur_ns=3000,
                  ctrl_deps=(1,), attrs={Attr.IS_CPU_OP: True}),
        TraceNode(node_id=4, name="add_kernel", node_type=NodeType.COMP, start_ns=94_000, dur_ns=2000,
                  ctrl_deps=(2,), data_deps=(3,), attrs={Attr.IS_CPU_OP: False}),
    ]  # fmt: skip
    write_et(path, nodes)


def test_on_a_rank_with_gpu_kernels_host_compute_is_dropped_and_its_order_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _gpu_rank(rank_file(run, 0))
    write_manifest(
        run, Manifest(world_size=1, ranks=(0,), process_groups=(ProcessGroupInfo(name="0", ranks=(0,)),))
    )
    res = export_astra_sim(run, tmp_path / "astra")
    _gm, nodes = read_with_chakra(res.traces[0])
    by_id = {n.id: n for n in nodes}
    assert sorted(by_id) == [2, 4]
    # kernel 4's ctrl dep 2 is kept, as a data dep; its data dep, host 3, depended only on host 1, which
    # depended on the metadata node: all three dropped
    assert list(by_id[2].data_deps) == [] and list(by_id[4].data_deps) == [2]
    assert list(by_id[4].ctrl_deps) == []
    assert all(_attrs(n)[Attr.IS_CPU_OP] is False and HOST_OP not in _attrs(n) for n in nodes)
    npu = export_astra_sim(run, tmp_path / "astra-npu", host_compute="npu")
    _gm, nodes = read_with_chakra(npu.traces[0])
    assert sorted(n.id for n in nodes) == [1, 2, 3, 4]
    assert {n.id for n in nodes if _attrs(n).get(HOST_OP)} == {1, 3}


def test_a_kernel_keeps_its_order_through_a_chain_of_dropped_host_nodes_one_without_is_cpu_op(
    tmp_path: Path,
) -> None:
    # docs/store.md: a node without is_cpu_op ran on the host; host compute is dropped on a rank with GPU
    # kernels and a node depending on a dropped node depends on that node's own dependencies instead
    run = tmp_path / "run"
    host, gpu = {Attr.IS_CPU_OP: True}, {Attr.IS_CPU_OP: False}
    nodes = [
        pg_init_node([ProcessGroupInfo(name="0", ranks=(0,))]),
        TraceNode(node_id=1, name="gemm", node_type=NodeType.COMP, start_ns=0, dur_ns=9000, attrs=gpu),
        TraceNode(node_id=2, name="aten::mm", node_type=NodeType.COMP, start_ns=100, dur_ns=900,
                  ctrl_deps=(1,), attrs=host),
        TraceNode(node_id=3, name="aten::add", node_type=NodeType.COMP, start_ns=1000, dur_ns=900,
                  ctrl_deps=(2,)),  # no is_cpu_op: a host node
        TraceNode(node_id=4, name="add_kernel", node_type=NodeType.COMP, start_ns=9000, dur_ns=2000,
                  ctrl_deps=(3,), attrs=gpu),
    ]  # fmt: skip
    write_et(rank_file(run, 0), nodes)
    write_manifest(
        run, Manifest(world_size=1, ranks=(0,), process_groups=(ProcessGroupInfo(name="0", ranks=(0,)),))
    )
    res = export_astra_sim(run, tmp_path / "astra")
    _gm, out = read_with_chakra(res.traces[0])
    assert [(n.id, list(n.data_deps)) for n in out] == [(1, []), (4, [1])]


def test_memory_loads_and_stores_are_compute_of_their_recorded_duration(tmp_path: Path) -> None:
    b = RunBuilder(world_size=1)
    b.rank(0).compute("load", dur_ns=2_500)
    b.rank(0).compute("store", dur_ns=1_400)
    rb = b.rank(0)
    for k, t in ((0, NodeType.MEM_LOAD), (1, NodeType.MEM_STORE)):
        rb.nodes[k] = dataclasses.replace(rb.nodes[k], node_type=t)
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    _gm, out = read_with_chakra(res.traces[0])
    assert [(n.name, n.type, n.duration_micros) for n in out] == [
        ("load", NodeType.COMP, 3),
        ("store", NodeType.COMP, 1),
    ]
    assert res.changes["MEM_LOAD -> COMP"] == res.changes["MEM_STORE -> COMP"] == 1


def test_a_foreign_runs_peers_sizes_and_world_group_are_filled_in_as_chakra_means_them(
    tmp_path: Path,
) -> None:
    # a send names only its receiver, a recv only its sender, sizes are Chakra's tensor_size, the world
    # group is "0" with no process-group node: ASTRA-sim needs both ranks and a comm_size on each
    d = tmp_path / "chakra"
    for r in range(2):
        coll = pb.Node(id=1, name="allreduce", type=int(NodeType.COMM_COLL), duration_micros=5)
        coll.attr.add(name="comm_type", int64_val=int(CommType.ALL_REDUCE))
        coll.attr.add(name="tensor_size", uint64_val=512)
        coll.attr.add(name="pg_name", string_val="0")
        p2p = pb.Node(id=2, name="p2p", type=int(NodeType.COMM_SEND if r == 0 else NodeType.COMM_RECV),
                      duration_micros=5, ctrl_deps=[1])  # fmt: skip
        p2p.attr.add(name="comm_dst" if r == 0 else "comm_src", int64_val=1 - r)
        p2p.attr.add(name="tensor_size", uint64_val=256)
        with EtWriter(d / f"job.{r}.et") as w:
            w.write_all([coll, p2p])
    res = export_astra_sim(d, tmp_path / "astra")
    assert json.loads(res.comm_groups.read_text()) == {}
    for r in range(2):
        _gm, (c, p) = read_with_chakra(res.traces[r])
        assert (_attrs(c)[Attr.COMM_SIZE], _attrs(c)[Attr.PG_NAME]) == (512, "0")
        a = _attrs(p)
        assert (a[Attr.COMM_SRC], a[Attr.COMM_DST], a[Attr.COMM_SIZE]) == (0, 1, 256)


MS = 1_000_000


def _host_bound_gpu_run(run: Path) -> None:
    """Two GPU ranks whose hosts are busy 10 of their 20 ms of steps, their GPUs 2 ms: rank 0 (step 1-11 ms):
    host ops 1-5 and 6-9 ms, kernels 4.5-5 and 9-9.5 ms; rank 1 (step 0-10 ms): host ops 0-2 ms, 1-1.5 ms
    (another thread, inside the first) and 9-12 ms (1 ms of it in the step), a kernel 2-3 ms."""
    world = ProcessGroupInfo(name="0", ranks=(0, 1))
    ops = {
        0: [(1, "aten::mm", True, 1 * MS, 4 * MS), (2, "gemm", False, 4 * MS + MS // 2, MS // 2),
            (3, "aten::add", True, 6 * MS, 3 * MS), (4, "add_kernel", False, 9 * MS, MS // 2)],
        1: [(1, "aten::mm", True, 0, 2 * MS), (2, "aten::view", True, MS, MS // 2),
            (3, "gemm", False, 2 * MS, MS), (4, "aten::item", True, 9 * MS, 3 * MS)],
    }  # fmt: skip
    for r, rank_ops in ops.items():
        nodes = [pg_init_node([world])] + [
            TraceNode(node_id=i, name=name, node_type=NodeType.COMP, start_ns=start, dur_ns=dur,
                      ctrl_deps=(0,), attrs={Attr.IS_CPU_OP: cpu})
            for i, name, cpu, start, dur in rank_ops
        ]  # fmt: skip
        write_et(rank_file(run, r), nodes)
    steps = (
        StepSpan(rank=0, step=0, start_ns=MS, end_ns=11 * MS),
        StepSpan(rank=1, step=0, start_ns=0, end_ns=10 * MS),
    )
    write_manifest(run, Manifest(world_size=2, ranks=(0, 1), process_groups=(world,), steps=steps))


def test_dropping_a_host_bound_gpu_runs_host_compute_says_in_one_line_how_much_of_the_steps_it_was(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    _host_bound_gpu_run(run)
    res = export_astra_sim(run, tmp_path / "astra")
    assert res.notes == (
        (
            "host compute dropped on 2 rank(s) (--host-compute auto): the hosts were busy in it 10.000 ms "
            "(50%) of the ranks' 20.000 ms of recorded steps; ASTRA-sim replays only the GPUs' compute "
            "kernels, 2.000 ms (10%); --host-compute npu keeps the host compute, as NPU compute run in "
            "series with the kernels"
        ),
    )
    assert json.loads((tmp_path / "astra" / "export.json").read_text())["notes"] == list(res.notes)
    assert export_astra_sim(run, tmp_path / "astra-npu", host_compute="npu").notes == ()
    buf = io.StringIO()
    argv = ["--format", "astra-sim", str(run), "--out", str(tmp_path / "cli"), "--no-progress"]
    assert export_main(argv, console=Console(file=buf, width=400)) == 0
    assert [ln for ln in buf.getvalue().splitlines() if "host compute dropped" in ln] == [
        f"note: {res.notes[0]}"
    ]


def test_without_recorded_steps_the_dropped_host_compute_is_measured_against_the_traced_span(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    _gpu_rank(rank_file(run, 0))  # host 0-5 and 6-9 µs, kernels 4-94 and 94-96 µs: 96 µs traced
    write_manifest(
        run, Manifest(world_size=1, ranks=(0,), process_groups=(ProcessGroupInfo(name="0", ranks=(0,)),))
    )
    (note,) = export_astra_sim(run, tmp_path / "astra").notes
    assert note.startswith(
        "host compute dropped on 1 rank(s) (--host-compute auto): the hosts were busy in it 0.008 ms (8%) of "
        "the ranks' 0.096 ms of traced time (steps where recorded); ASTRA-sim replays only the GPUs' compute "
        "kernels, 0.092 ms (96%);"
    )


def test_the_cli_exports_for_astra_sim_and_prints_the_command_line(exported, tmp_path: Path) -> None:
    run, _res = exported
    buf = io.StringIO()
    out = tmp_path / "cli-astra"
    code = export_main(
        ["--format", "astra-sim", str(run), "--out", str(out), "--no-progress"],
        console=Console(file=buf, width=100),
    )
    assert code == 0
    text = buf.getvalue()
    lines = [ln for ln in text.splitlines() if ln.startswith("AstraSim_Analytical_Congestion_Unaware")]
    assert len(lines) == 1 and f"--workload-configuration={out.resolve()}/workload " in lines[0]
    assert "communicator groups: 1 = ranks [0, 1]; 2 = ranks [2, 3]" in text
    assert sorted(p.name for p in out.glob("*.et")) == [f"workload.{r}.et" for r in range(WORLD)]


def test_the_astra_sim_export_title_keeps_a_long_output_path_on_one_line(exported, tmp_path: Path) -> None:
    run, _res = exported
    out = tmp_path / ("long-output-directory-" * 3) / "astra"
    buf = io.StringIO()
    argv = ["--format", "astra-sim", str(run), "--out", str(out), "--no-progress"]
    assert export_main(argv, console=Console(file=buf, width=len(str(out)) + 40)) == 0
    assert buf.getvalue().splitlines()[0].strip() == f"ASTRA-sim workload in {out}"


def test_the_cli_default_format_is_still_parquet(exported, tmp_path: Path) -> None:
    run, _res = exported
    code = export_main(
        [str(run), "--out", str(tmp_path / "pq"), "--no-progress"], console=Console(file=io.StringIO())
    )
    assert code == 0
    assert (tmp_path / "pq" / "collectives.parquet").is_file() and not list((tmp_path / "pq").glob("*.et"))


def test_the_cli_reports_a_missing_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["export", "--format", "astra-sim", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("skewlens export: error: ") and str(tmp_path / "nope") in err


def test_the_export_module_imports_no_torch_rich_or_hydra() -> None:
    code = (
        "import json, sys, skewlens.replay.export_astra\n"
        "print(json.dumps(sorted(m for m in ('torch', 'rich', 'hydra', 'omegaconf') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _collective_sizes(res: export_astra.AstraExport) -> dict[int, list[tuple[int, int, int]]]:
    """Per rank, each exported collective's (source type, written type, comm_size), in file order."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for r, path in res.traces.items():
        rows = []
        for n in read_with_chakra(path)[1]:
            a = _attrs(n)
            if n.type == NodeType.COMM_COLL:
                rows.append((a.get(SRC_COMM_TYPE, a[Attr.COMM_TYPE]), a[Attr.COMM_TYPE], a[Attr.COMM_SIZE]))
        out[r] = rows
    return out


def test_each_collectives_comm_size_is_the_per_rank_input_astra_sim_divides_as_the_collective_did(
    tmp_path: Path,
) -> None:
    # sizes as the capture records them, the calls' input tensors on 4 ranks: all_gather_into_tensor's
    # piece (1 KiB: ASTRA-sim's ring all-gather sends comm_size per step and ends with 4 of them),
    # reduce_scatter_tensor's whole input (4 KiB: it sends comm_size / 4 per step, ends with a quarter),
    # all_to_all's input (4 KiB: comm_size / 4 to each member), gather's piece, reduce's tensor;
    # scatter(tensor, ...) records its 1 KiB output piece, and its root sends one to each member: written as
    # an all_to_all of 4 pieces, which sends each member one piece
    b = RunBuilder(world_size=4)
    for r in range(4):
        rb = b.rank(r).step(0)
        rb.collective(CommType.ALL_GATHER, comm_bytes=1024, dur_ns=10_000)
        rb.collective(CommType.REDUCE_SCATTER, comm_bytes=4096, dur_ns=10_000)
        rb.collective(CommType.ALL_TO_ALL, comm_bytes=4096, dur_ns=10_000)
        rb.collective(CommType.GATHER, comm_bytes=1024, dur_ns=10_000, root=0)
        rb.collective(CommType.REDUCE, comm_bytes=4096, dur_ns=10_000, root=0)
        rb.collective(CommType.SCATTER, comm_bytes=1024, dur_ns=10_000, root=0)
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    ag, rs, a2a, ar = CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.ALL_TO_ALL, CommType.ALL_REDUCE
    want = [(ag, ag, 1024), (rs, rs, 4096), (a2a, a2a, 4096), (CommType.GATHER, ag, 1024),
            (CommType.REDUCE, ar, 4096), (CommType.SCATTER, a2a, 4 * 1024)]  # fmt: skip
    assert _collective_sizes(res) == dict.fromkeys(range(4), want)


def test_an_uneven_all_to_all_is_written_with_one_size_on_every_member_the_one_the_replay_costs(
    tmp_path: Path,
) -> None:
    # rank 0 sends 900 bytes to each other member, the others 100 to everyone: members' inputs differ
    # (2,800 and 400 bytes), and ASTRA-sim, which matches a message to its receive by size, would never
    # complete them; every member gets S = ceil(D * 4 / 3) with D = 2,700, the busiest port's bytes
    sends = [[100, 900, 900, 900], [100] * 4, [100] * 4, [100] * 4]
    b = RunBuilder(world_size=4)
    for r in range(4):
        got = [sends[s][r] for s in range(4)]
        sent_others, got_others = sum(sends[r]) - sends[r][r], sum(got) - got[r]
        b.rank(r).step(0).collective(
            CommType.ALL_TO_ALL, comm_bytes=sum(sends[r]), dur_ns=10_000,
            peer_bytes=(sent_others, got_others), peer_splits=(sends[r], got),
        )  # fmt: skip
    run = b.write(tmp_path / "run")
    res = export_astra_sim(run, tmp_path / "astra")
    a2a = CommType.ALL_TO_ALL
    assert _collective_sizes(res) == {r: [(a2a, a2a, 3600)] for r in range(4)}
    trace = load_run(run)
    (inst,) = trace.collectives
    assert collective_bytes(trace, inst) == 3600


def test_an_imported_scatter_whose_root_recorded_its_whole_buffer_is_that_size_on_every_member(
    tmp_path: Path,
) -> None:
    # Chakra's input convention: the root records the 4 KiB it scatters, the others their 1 KiB piece
    b = RunBuilder(world_size=4)
    for r in range(4):
        b.rank(r).step(0).collective(
            CommType.SCATTER, comm_bytes=4096 if r == 0 else 1024, dur_ns=10_000, root=0
        )
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra", strict=False)
    want = [(CommType.SCATTER, CommType.ALL_TO_ALL, 4096)]
    assert _collective_sizes(res) == dict.fromkeys(range(4), want)
    assert res.changes["SCATTER comm_size -> the collective's message size, the same on every member"] == 3


def test_a_wait_node_runs_only_for_its_time_after_the_collective_it_waited_for(tmp_path: Path) -> None:
    # an async all_reduce on gloo's thread runs [1, 6) ms (rank 1 arrives late); the main thread's wait for
    # it runs [1.1, 6.3) ms: ASTRA-sim starts the wait once the all_reduce completes (its dependency), so
    # only the 0.3 ms after that completion is the wait's own; its whole 5.2 ms would count the waiting twice
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        first = rb.compute("aten::mm", dur_ns=MS, start_ns=0)
        coll = rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=MS, stream=1000, deps=(first,))
        rb.compute("c10d::wait", dur_ns=5_200_000, start_ns=1_100_000, deps=(first, coll))
        rb.compute("aten::add", dur_ns=MS)
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    for r in range(2):
        _gm, nodes = read_with_chakra(res.traces[r])
        assert [(n.name, n.duration_micros) for n in nodes if n.type == NodeType.COMP] == [
            ("aten::mm", 1000),
            ("c10d::wait", 300),
            ("aten::add", 1000),
        ]
    assert res.changes["wait nodes: only their time after the communication or GPU work they waited for"] == 2


def test_a_wait_on_two_collectives_runs_only_after_the_later_whatever_order_its_trace_names_them(
    tmp_path: Path,
) -> None:
    # c10d::wait [1.1, 6.3) ms names the all_reduce ending at 6 ms before the one ending at 2 ms: its own
    # time starts at the later completion (0.3 ms), not at the last one named (4.3 ms)
    b = RunBuilder(world_size=2)
    for rb in (b.rank(r).step(0) for r in range(2)):
        h = rb.compute("aten::mm", MS, start_ns=0)
        late = rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=MS, stream=1000, deps=(h,))
        early = rb.collective(
            CommType.ALL_REDUCE, 1 << 10, 800_000, start_ns=1_200_000, stream=1001, deps=(h,)
        )
        rb.compute("c10d::wait", 5_200_000, start_ns=1_100_000, deps=(h, late, early))
    run = load_run(b.write(tmp_path / "run"))
    for r, rt in run.ranks.items():
        m = execution_model(run).ranks[r]
        (wait,) = [i for i in range(len(rt)) if rt.name(i) == "c10d::wait"]
        assert (int(recorded_wait_work_ns(rt, m)[wait]), int(m.work_ns[wait])) == (300_000, 300_000)


def test_each_wait_node_runs_for_the_models_work_after_the_communication_or_gpu_work_its_trace_names(
    tmp_path: Path,
) -> None:
    # one rank with GPU kernels, all three kinds of wait the execution model knows, host compute kept:
    # - c10d::wait [1.1, 6.3) ms on the all_reduce [1, 6) its trace names: 0.3 ms after its completion;
    # - aten::item [6.3, 8.3) ms, synchronised on add_kernel [2.6, 7.8) ms: its 0.5 ms after the kernel;
    # - c10d::wait [T+0.02, T+5.02) ms on a batch's send [T, T+0.03) ms: the model joins the batch, so it
    #   waits for the batch's recv, which ends at T+5.01 ms (10 us of work); ASTRA-sim's graph holds only
    #   the send, so only the time after the send is cut (4.99 ms): cut to 10 us it would start early
    t = 8_300_000
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        h = rb.compute("aten::mm", MS, start_ns=0)
        rb.compute("gemm", 2 * MS, start_ns=600_000, stream=7, deps=(h,), launch_ns=500_000)
        k = rb.compute("add_kernel", 5_200_000, start_ns=2_600_000, stream=7, deps=(h,), launch_ns=900_000)
        coll = rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=MS, stream=1000, deps=(h,))
        w = rb.compute("c10d::wait", 5_200_000, start_ns=1_100_000, deps=(h, coll))
        item = rb.compute("aten::item", 2 * MS, start_ns=6_300_000, deps=(w, k))
        if r == 0:
            s = rb.send(1, 4096, 30_000, start_ns=t, stream=2000, deps=(item,), batch=0)
            rb.recv(1, 4096, 5 * MS, start_ns=t + 10_000, stream=2000, deps=(item,), batch=0)
            rb.compute("c10d::wait", 5 * MS, start_ns=t + 20_000, deps=(item, s))
        else:
            g = rb.compute("fwd_bwd", 6 * MS, start_ns=t - 1_000_000, deps=(item,))
            rb.recv(0, 4096, 20_000, start_ns=t + 5 * MS, stream=2000, deps=(g,), batch=0)
            rb.send(0, 4096, 20_000, start_ns=t + 5 * MS + 5_000, stream=2000, deps=(g,), batch=0)
    run_dir = b.write(tmp_path / "run")
    res = export_astra_sim(run_dir, tmp_path / "astra", host_compute="npu")
    run = load_run(run_dir)
    em = execution_model(run)
    for r in range(2):
        rt, m = run.ranks[r], em.ranks[r]
        work = recorded_wait_work_ns(rt, m)
        _gm, nodes = read_with_chakra(res.traces[r])
        written = {n.id: n.duration_micros for n in nodes}
        row = {int(nid): i for i, nid in enumerate(rt.node_id.tolist())}
        waits = np.flatnonzero(m.is_wait).tolist()
        assert {rt.name(i) for i in waits} == {"c10d::wait", "aten::item"}
        assert all(written[int(rt.node_id[i])] == (int(work[i]) + 500) // 1000 for i in waits)
        others = set(written) - {int(rt.node_id[i]) for i in waits}
        assert all(written[n] == (int(rt.dur_ns[row[n]]) + 500) // 1000 for n in others)
        by_name = [(rt.name(i), written[int(rt.node_id[i])], int(m.work_ns[i])) for i in waits]
        assert by_name[:2] == [("c10d::wait", 300, 300_000), ("aten::item", 500, 500_000)]
        assert by_name[2:] == ([("c10d::wait", 4990, 10_000)] if r == 0 else [])
    assert res.changes["wait nodes: only their time after the communication or GPU work they waited for"] == 5


def _waits_on_an_all_reduce(tmp_path: Path, *, nested: bool = False, nccl: bool = False) -> dict[str, int]:
    """Rank 0's compute nodes and their exported durations (µs): an all_reduce [1, 6) ms, and [1.1, 6.3) ms
    blocked on it by a ``c10d::wait`` (inside a 6 ms ``aten::add`` where ``nested``) or, where ``nccl``
    (the all_reduce an NCCL kernel), by a ``cudaStreamSynchronize``; host compute kept."""
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        h = rb.compute("aten::mm", MS, start_ns=0)
        coll = rb.collective(CommType.ALL_REDUCE, 1 << 20, 5 * MS, start_ns=MS, stream=9, deps=(h,))
        if nccl:
            rb.nodes[-1] = dataclasses.replace(rb.nodes[-1], attrs={**rb.nodes[-1].attrs, HOST_OP: False})
            rb.compute("gemm", MS, start_ns=200_000, stream=7, deps=(h,), launch_ns=100_000)
        before = rb.compute("aten::add", 6 * MS, start_ns=1_050_000, deps=(h,)) if nested else h
        name = "cudaStreamSynchronize" if nccl else "c10d::wait"
        rb.compute(name, 5_200_000, start_ns=1_100_000, deps=(before, coll))
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra", host_compute="npu")
    _gm, nodes = read_with_chakra(res.traces[0])
    return {n.name: n.duration_micros for n in nodes if n.type == NodeType.COMP}


def test_a_wait_nested_in_an_op_still_runs_only_after_the_collective_its_trace_names(tmp_path: Path) -> None:
    # the execution model lets a nested node follow its enclosing one (no wait edges of its own); ASTRA-sim
    # runs it on its own, after the all_reduce it depends on: its 4.9 ms before that were the all_reduce's
    assert _waits_on_an_all_reduce(tmp_path, nested=True) == {
        "aten::mm": 1000,
        "aten::add": 6000,
        "c10d::wait": 300,
    }


def _syncs_on_a_kernel(tmp_path: Path, *, nested: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """Rank 0's compute nodes: their exported durations (µs) and the execution model's ``work_ns``: a
    kernel [2.6, 7.8) ms launched by ``aten::mm``, then ``aten::item`` [6.3, 8.3) ms synchronising on it
    (where ``nested``, through a ``cudaStreamSynchronize`` [6.4, 8.2) ms inside it); host compute kept."""
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r).step(0)
        h = rb.compute("aten::mm", MS, start_ns=0)
        k = rb.compute("add_kernel", 5_200_000, start_ns=2_600_000, stream=7, deps=(h,), launch_ns=900_000)
        coll = rb.collective(CommType.ALL_REDUCE, 1 << 20, MS, start_ns=MS, stream=9, deps=(h,))
        item = rb.compute("aten::item", 2 * MS, start_ns=6_300_000, deps=(h,) if nested else (h, k))
        if nested:
            rb.compute("cudaStreamSynchronize", 1_800_000, start_ns=6_400_000, deps=(item, k))
        rb.compute("aten::add", MS, start_ns=8_400_000, deps=(item, coll))
    run_dir = b.write(tmp_path / "run")
    res = export_astra_sim(run_dir, tmp_path / "astra", host_compute="npu")
    _gm, nodes = read_with_chakra(res.traces[0])
    run = load_run(run_dir)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    work = {rt.name(i): int(m.work_ns[i]) for i in range(len(rt)) if rt.node_type[i] == NodeType.COMP}
    return {n.name: n.duration_micros for n in nodes if n.type == NodeType.COMP}, work


def _after_a_kernel(
    tmp_path: Path, add: Callable[[RankBuilder, int, int], object]
) -> tuple[RunTrace, dict[str, int], dict[str, int]]:
    """Two ranks of ``aten::mm`` [0, 1) ms launching ``gemm`` [1, 3) ms on stream 7, then what ``add`` adds
    (given the builder and both ids), exported with host compute kept: the run, rank 0's exported durations
    (µs) and the export's changes."""
    b = RunBuilder(world_size=2)
    for rb in (b.rank(r).step(0) for r in range(2)):
        h = rb.compute("aten::mm", MS, start_ns=0)
        add(rb, h, rb.compute("gemm", 2 * MS, start_ns=MS, stream=7, deps=(h,), launch_ns=500_000))
    run_dir = b.write(tmp_path / "run")
    res = export_astra_sim(run_dir, tmp_path / "astra", host_compute="npu")
    _gm, nodes = read_with_chakra(res.traces[0])
    return load_run(run_dir), {n.name: n.duration_micros for n in nodes}, dict(res.changes)


def test_a_kernel_that_depends_on_a_kernel_of_another_stream_it_overlapped_is_written_whole(
    tmp_path: Path,
) -> None:
    # only a host row's dependency on the GPU is a synchronisation: add_kernel on stream 8 [2, 4) ms, whose
    # trace names gemm on stream 7 [1, 3) ms, is no wait node and runs its whole 2 ms (cut to its 1 ms after
    # gemm's end, the time the two streams overlapped would be lost)
    run, written, changes = _after_a_kernel(
        tmp_path,
        lambda rb, h, k: rb.compute(
            "add_kernel", 2 * MS, start_ns=2 * MS, stream=8, deps=(h, k), launch_ns=600_000
        ),
    )
    assert written == {"aten::mm": 1000, "gemm": 2000, "add_kernel": 2000}
    rt = run.ranks[0]
    assert recorded_wait_work_ns(rt, execution_model(run).ranks[0]).tolist() == rt.dur_ns.tolist()
    assert not any(k.startswith("wait nodes") for k in changes)


def _metadata_then_item(rb: RankBuilder, h: int, _k: int) -> None:
    """A METADATA node marked off the host [2, 5) ms, and ``aten::item`` [3, 5) ms naming it."""
    meta = {Attr.IS_CPU_OP: False, Attr.STREAM: 7, Attr.STEP: 0}
    rb.nodes.append(
        TraceNode(
            node_id=50, name="meta", node_type=NodeType.METADATA, start_ns=2 * MS, dur_ns=3 * MS, attrs=meta
        )
    )
    rb.compute("aten::item", 2 * MS, start_ns=3 * MS, deps=(h, 50))


def test_a_metadata_node_marked_off_the_host_is_neither_gpu_work_nor_a_synchronisation(
    tmp_path: Path,
) -> None:
    # a METADATA node is no op, whatever its attributes say: one marked off the host is not GPU busy time
    # (gemm's 2 ms alone), and aten::item, which names it, is no wait: written whole, 2 ms
    run, written, _changes = _after_a_kernel(tmp_path, _metadata_then_item)
    rt, m = run.ranks[0], execution_model(run).ranks[0]
    assert gpu_busy(rt, m, rt.start_ns, rt.end_ns).between(0, 10 * MS) == 2 * MS
    assert recorded_wait_work_ns(rt, m).tolist() == rt.dur_ns.tolist()
    assert written == {"aten::mm": 1000, "gemm": 2000, "aten::item": 2000}


def test_a_host_row_synchronising_on_a_gpu_kernel_runs_for_the_execution_models_work_after_it(
    tmp_path: Path,
) -> None:
    # aten::item depends on the kernel (a synchronisation): ASTRA-sim starts it once the kernel completes,
    # so its 1.5 ms before the kernel's end were the kernel's; written whole (2 ms, before), counted twice
    written, work = _syncs_on_a_kernel(tmp_path)
    assert written == {"aten::mm": 1000, "add_kernel": 5200, "aten::item": 500, "aten::add": 1000}
    assert written["aten::item"] * 1000 == work["aten::item"] == 500_000


def test_a_synchronisation_nested_in_an_op_runs_only_after_the_kernel_and_its_op_is_written_whole(
    tmp_path: Path,
) -> None:
    # the model moves a nested synchronisation's wait to its outermost enclosing row (aten::item: 0.5 ms of
    # work after the kernel); ASTRA-sim runs every node on its own, and only the nested row depends on the
    # kernel: it starts once the kernel completes (0.4 ms after), its parent, with no such dependency, whole
    written, work = _syncs_on_a_kernel(tmp_path, nested=True)
    assert written == {
        "aten::mm": 1000,
        "add_kernel": 5200,
        "aten::item": 2000,
        "cudaStreamSynchronize": 400,
        "aten::add": 1000,
    }
    assert (work["aten::item"], work["cudaStreamSynchronize"]) == (500_000, 1_800_000)


def test_a_host_row_synchronising_on_an_nccl_kernel_runs_only_after_the_collective_completed(
    tmp_path: Path,
) -> None:
    # a host row's dependency on a GPU node is a synchronisation: the execution model makes it a wait node,
    # and ASTRA-sim starts it once the all_reduce it depends on completes; written whole (5.2 ms, before),
    # its 4.9 ms of waiting counted twice
    assert _waits_on_an_all_reduce(tmp_path, nccl=True) == {
        "aten::mm": 1000,
        "gemm": 1000,
        "cudaStreamSynchronize": 300,
    }


def test_an_empty_collective_and_an_empty_send_are_written_as_one_byte_which_astra_sim_completes(
    tmp_path: Path,
) -> None:
    # ASTRA-sim aborts on a 0-byte send (ChunkIdGenerator: assertion chunk_size > 0) and never completes a
    # 0-byte all-gather (every rank exits 0 without "finished")
    b = RunBuilder(world_size=2)
    sender, receiver = (b.rank(r).step(0) for r in range(2))
    for rb in (sender, receiver):
        rb.collective(CommType.ALL_GATHER, comm_bytes=0, dur_ns=10_000)
    sender.send(1, 0, dur_ns=10_000)
    receiver.recv(0, 0, dur_ns=10_000)
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra")
    for r in range(2):
        _gm, nodes = read_with_chakra(res.traces[r])
        assert [(n.type, _attrs(n)[Attr.COMM_SIZE]) for n in nodes] == [
            (NodeType.COMM_COLL, MIN_COMM_BYTES),
            (NodeType.COMM_SEND if r == 0 else NodeType.COMM_RECV, MIN_COMM_BYTES),
        ]
    assert MIN_COMM_BYTES == 1
    assert res.changes["empty messages written as 1 byte"] == 4


# first_id 1000: ids that are not row numbers, as a converter's; kernel: the gap also synchronised on a kernel
# that ended 0.5 ms into it, a wait its trace names, which ends long before the hidden one
@pytest.mark.parametrize(("first_id", "kernel"), [(1, False), (1000, False), (1, True)])
def test_a_host_time_node_that_hid_ddps_wait_runs_only_its_work_after_the_all_reduce_it_now_depends_on(
    tmp_path: Path, first_id: int, kernel: bool
) -> None:
    # DDP at the collectives level: backward issues its bucket's all_reduce, then the reducer waits for it
    # inside the compute gap that follows (no wait node: out of the profiler's sight), then the optimizer's
    # 5 ms. Rank 1 arrives 30 ms late, so rank 0's gap recorded 36 ms, 31 of them waiting. ASTRA-sim models
    # that wait (the all_reduce completes when rank 1 joins): the whole 36 ms, with no dependency on the
    # all_reduce, kept the recorded wait in place of the modelled one (a DDP capture ran 5% long)
    b = RunBuilder(world_size=2, first_node_id=first_id)
    fwd = {0: 10 * MS, 1: 40 * MS}
    coll: dict[int, int] = {}
    for r in range(2):
        rb = b.rank(r).step(0)
        f = rb.compute("compute", fwd[r], start_ns=0)
        coll[r] = rb.collective(
            CommType.ALL_REDUCE, 1 << 20, 41 * MS - fwd[r], start_ns=fwd[r], stream=1000, deps=(f,)
        )
        if kernel:
            f = rb.compute("gemm", MS, start_ns=fwd[r] - MS // 2, stream=7, deps=(f,), launch_ns=fwd[r] - MS)
        rb.compute("compute", 46 * MS - fwd[r], start_ns=fwd[r], deps=(f,))
    res = export_astra_sim(b.write(tmp_path / "run"), tmp_path / "astra", host_compute="npu")
    for r in range(2):
        _gm, nodes = read_with_chakra(res.traces[r])
        tail = [n for n in nodes if n.type == NodeType.COMP][-1]
        assert tail.duration_micros == 5000  # the replay's work after the wait (RankModel.work_ns)
        assert coll[r] in tail.data_deps  # ASTRA-sim starts it once the all_reduce completes
    assert (
        res.changes["host-time nodes that hid a wait: only their time after the communication it waited for"]
        == 2
    )


def test_exported_p2p_peers_and_tags_are_the_int32_values_astra_sims_feeder_reads(exported) -> None:
    run, res = exported
    for r in range(WORLD):
        src = {n.id: node_attrs(n) for n in read_et(rank_file(run, r)).nodes}
        _gm, nodes = read_with_chakra(res.traces[r])
        p2p = [n for n in nodes if n.type in (NodeType.COMM_SEND, NodeType.COMM_RECV)]
        assert len(p2p) == 2
        for n in p2p:
            got = {a.name: (a.WhichOneof("value"), a.int32_val) for a in n.attr}
            for k in (Attr.COMM_SRC, Attr.COMM_DST, Attr.COMM_TAG):
                assert got[k] == ("int32_val", src[n.id][k])


def test_a_run_exported_by_a_relative_path_names_its_source_trace_by_the_absolute_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same run exported from another directory gives the same bytes
    _run(tmp_path)
    monkeypatch.chdir(tmp_path)
    export_astra_sim(Path("run"), tmp_path / "astra")
    source = read_et(tmp_path / "astra" / "workload.0.et").metadata["source"]
    assert source == str((tmp_path / "run" / "rank-0.et").resolve())
