"""Real captures: the example under ``skewlens profile`` with gloo ranks on CPU, asserted from the traces.

One captured run per level is shared by the tests of that level (module-scoped fixtures).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from capture_helpers import EXAMPLE as TRAIN
from capture_helpers import load_example, profile, profile_script

from skewlens.profiler.capture.build import FINISH_LAG_NS
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import RankNote, read_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.vocab import Attr, CommType, NodeType

pytestmark = pytest.mark.slow


EX = load_example()


def nodes_of(run: Path, rank: int) -> list[tuple[Any, dict[str, Any]]]:
    return [(n, node_attrs(n)) for n in read_et(run / f"rank-{rank}.et").nodes]


def model_numel() -> int:
    return EX.LAYERS * (EX.HIDDEN * EX.HIDDEN + EX.HIDDEN)


# ---- collectives level, 4 ranks, rank 1 straggles 50 ms per step --------------------------------------
WORLD = 4
ACTIVE = 5
STRAGGLE_MS = 50.0


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cap") / "run"
    res = profile(
        out,
        "--steps",
        "8",
        "--straggler-rank",
        "1",
        "--straggler-ms",
        str(STRAGGLE_MS),
        steps=f"1:1:{ACTIVE}",
        nproc=WORLD,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_the_manifest_describes_the_job(straggler_run: Path) -> None:
    m = read_manifest(straggler_run)
    assert (m.world_size, m.ranks, m.missing_ranks, m.level, m.backend) == (
        WORLD,
        (0, 1, 2, 3),
        (),
        "collectives",
        "gloo",
    )
    groups = {tuple(g.ranks) for g in m.process_groups}
    assert {(0, 1, 2, 3), (0, 1), (2, 3)} <= groups
    assert sorted(m.clock_offsets_ns) == [0, 1, 2, 3] and m.clock_offsets_ns[0] == 0
    assert all(abs(v) < 5_000_000 for v in m.clock_offsets_ns.values())  # one host: offsets near zero
    assert Counter(s.rank for s in m.steps) == dict.fromkeys(range(WORLD), ACTIVE)
    assert all(s.end_ns > s.start_ns for s in m.steps)
    assert m.command[-1] == str(STRAGGLE_MS) and m.hosts[0] and m.devices[0] == "cpu"


def test_every_rank_has_the_collectives_the_script_issued_with_their_sizes(straggler_run: Path) -> None:
    m = read_manifest(straggler_run)
    tp_name = {tuple(g.ranks): g.name for g in m.process_groups}
    f32 = 4
    for rank in range(WORLD):
        tp = tp_name[(rank // 2 * 2, rank // 2 * 2 + 1)]
        per_step: dict[int, Counter[tuple[str, int, int]]] = defaultdict(Counter)
        ddp_numel: Counter[int] = Counter()
        for n, a in nodes_of(straggler_run, rank):
            if n.type != NodeType.COMM_COLL:
                continue
            assert a[Attr.COMM_SIZE] == a[Attr.NUMEL] * f32
            if a[Attr.COMM_TYPE] == CommType.ALL_REDUCE:
                ddp_numel[a[Attr.STEP]] += a[Attr.NUMEL]
                per_step[a[Attr.STEP]][(a[Attr.PG_NAME], CommType.ALL_REDUCE, 0)] += 1
            else:
                per_step[a[Attr.STEP]][(a[Attr.PG_NAME], a[Attr.COMM_TYPE], a[Attr.COMM_SIZE])] += 1
        assert sorted(per_step) == list(range(2, 2 + ACTIVE))
        tp_bytes = EX.BATCH * (EX.TP_DIM // 8) * f32
        for step, counts in per_step.items():
            assert counts[("0", CommType.ALL_REDUCE, 0)] >= 1  # DDP buckets
            assert ddp_numel[step] == model_numel()  # the buckets carry every gradient exactly once
            assert counts[(tp, CommType.ALL_GATHER, tp_bytes)] == 1
            assert counts[(tp, CommType.REDUCE_SCATTER, tp_bytes)] == 1
            assert counts[("0", CommType.BROADCAST, EX.BCAST_NUMEL * f32)] == 1
            assert counts[("0", CommType.BARRIER, 0)] == 1
            assert sum(counts.values()) == counts[("0", CommType.ALL_REDUCE, 0)] + 4


def assert_ddp_left_to_ddp_and_timed(run: Path) -> None:
    """Every step's DDP all-reduce came from the flight recorder, ran, and ended before the broadcast.

    Its end is gloo's worker event's, which closes after ``Work::finish`` woke DDP's waiter: on a loaded
    machine the woken main thread can reach the broadcast first, by up to the capture's finish lag.
    """
    m = read_manifest(run)
    for rank in m.ranks:
        nodes = nodes_of(run, rank)
        for step in sorted({s.step for s in m.steps if s.rank == rank}):
            colls = [a for n, a in nodes if n.type == NodeType.COMM_COLL and a[Attr.STEP] == step]
            ddp = [a for a in colls if a[Attr.OP] == "gloo:all_reduce"]  # named by the flight recorder
            assert ddp and all(a[Attr.PG_NAME] == "0" and a[Attr.STREAM] >= 1000 for a in ddp)
            bcast = next(a for a in colls if a[Attr.COMM_TYPE] == CommType.BROADCAST)
            for a in ddp:  # it ran, and DDP waited for it before backward returned (the broadcast is after)
                assert (
                    a[Attr.DUR_NS] > 0
                    and a[Attr.START_NS] + a[Attr.DUR_NS] <= bcast[Attr.START_NS] + FINISH_LAG_NS
                )
        assert "all_reduce on group '0'" in m.notes[f"rank {rank} flight recorder"]


def test_ddps_all_reduce_is_left_to_ddp_and_timed_from_gloos_worker_thread(straggler_run: Path) -> None:
    assert_ddp_left_to_ddp_and_timed(straggler_run)


def test_point_to_point_calls_name_the_right_global_peers(straggler_run: Path) -> None:
    for rank in range(WORLD):
        sends = [a for n, a in nodes_of(straggler_run, rank) if n.type == NodeType.COMM_SEND]
        recvs = [a for n, a in nodes_of(straggler_run, rank) if n.type == NodeType.COMM_RECV]
        assert len(sends) == (ACTIVE if rank < WORLD - 1 else 0)
        assert len(recvs) == (ACTIVE if rank > 0 else 0)
        assert all((a[Attr.COMM_SRC], a[Attr.COMM_DST]) == (rank, rank + 1) for a in sends)
        assert all((a[Attr.COMM_SRC], a[Attr.COMM_DST]) == (rank - 1, rank) for a in recvs)
        assert all(a[Attr.COMM_SIZE] == EX.PIPE_NUMEL * 4 and a[Attr.COMM_TAG] == 0 for a in sends + recvs)


def test_the_sequence_of_collectives_is_the_same_on_every_member_of_a_group(straggler_run: Path) -> None:
    m = read_manifest(straggler_run)
    for g in m.process_groups:
        seqs = {}
        for rank in g.ranks:
            seqs[rank] = [
                (a[Attr.SEQ], a[Attr.COMM_TYPE], a[Attr.COMM_SIZE])
                for n, a in nodes_of(straggler_run, rank)
                if n.type == NodeType.COMM_COLL and a[Attr.PG_NAME] == g.name
            ]
        first = seqs[g.ranks[0]]
        assert first, g
        assert [s for s, _, _ in first] == sorted({s for s, _, _ in first})  # increasing, no repeats
        assert all(v == first for v in seqs.values()), g.name


def test_the_straggler_computes_its_extra_time_before_its_first_collective_and_rank_0_waits_for_it(
    straggler_run: Path,
) -> None:
    # first collective of each step: the tensor-parallel all_gather of group {0, 1}
    gathers: dict[int, dict[int, dict[str, Any]]] = {0: {}, 1: {}}
    for rank in (0, 1):
        for n, a in nodes_of(straggler_run, rank):
            if n.type == NodeType.COMM_COLL and a[Attr.COMM_TYPE] == CommType.ALL_GATHER:
                gathers[rank][a[Attr.STEP]] = a
    m = read_manifest(straggler_run)
    step_start = {(s.rank, s.step): s.start_ns for s in m.steps}
    assert len(gathers[1]) == ACTIVE and sorted(gathers[0]) == sorted(gathers[1])
    for step, late in gathers[1].items():
        # the extra compute runs until its deadline, between the step's start and the all_gather
        assert late[Attr.START_NS] - step_start[(1, step)] >= STRAGGLE_MS * 1e6
        # both ranks read one clock (one host): back on it, rank 0's all_gather ends after rank 1 entered it
        early = gathers[0][step]
        ends_0 = early[Attr.START_NS] + early[Attr.DUR_NS] - m.clock_offsets_ns.get(0, 0)
        assert ends_0 >= late[Attr.START_NS] - m.clock_offsets_ns.get(1, 0)


def test_node_times_and_dependencies_are_consistent(straggler_run: Path) -> None:
    for rank in range(WORLD):
        nodes = nodes_of(straggler_run, rank)
        ids = {n.id for n, _ in nodes}
        assert len(ids) == len(nodes)
        for n, a in nodes[1:]:
            assert (
                n.start_time_micros == a[Attr.START_NS] // 1000
                and n.duration_micros == a[Attr.DUR_NS] // 1000
            )
            assert a[Attr.DUR_NS] >= 0 and all(d in ids and d < n.id for d in n.ctrl_deps)
            assert Attr.STREAM in a and Attr.STEP in a and Attr.IS_CPU_OP in a
        assert nodes[0][0].type == NodeType.METADATA


def test_chakras_own_reader_and_jsonizer_read_a_captured_trace(straggler_run: Path, tmp_path: Path) -> None:
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    path = straggler_run / "rank-1.et"
    fh = openFileRd(str(path))
    gm = GlobalMetadata()
    decodeMessage(fh, gm)
    count, types = 0, Counter()
    node = Node()
    while decodeMessage(fh, node):
        count += 1
        types[node.type] += 1
        node = Node()
    fh.close()
    assert count == len(read_et(path).nodes)
    assert types[NodeType.COMM_COLL] > 0 and types[NodeType.COMM_SEND] == ACTIVE and types[NodeType.COMP] > 0
    out = tmp_path / "rank-1.json"
    bin_dir = Path(sys.executable).parent
    res = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [str(bin_dir / "chakra_jsonizer"), "--input_filename", str(path), "--output_filename", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 0 and "c10d::send" in out.read_text()


def test_the_store_loads_the_capture_and_matches_every_collective(straggler_run: Path) -> None:
    from skewlens.profiler.store.load import load_run, match_collectives, match_p2p

    run = load_run(straggler_run)
    colls = match_collectives(run)
    full = [
        c
        for c in colls
        if len(c.ranks) == len(next(g for g in run.manifest.process_groups if g.name == c.pg_name).ranks)
    ]
    assert len(full) == len(colls)
    assert len(match_p2p(run)) == ACTIVE * (WORLD - 1)


# ---- ops and full levels, 2 ranks ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def ops_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ops") / "run"
    res = profile(
        out,
        "--steps",
        "5",
        "--straggler-rank",
        "0",
        "--straggler-ms",
        "20",
        "--slow-send-rank",
        "0",
        "--slow-send-ms",
        "20",
        level="ops",
        steps="1:1:2",
        nproc=2,
        flags=("--keep-raw",),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_ops_level_records_operators_without_counting_communication_twice(ops_run: Path) -> None:
    assert read_manifest(ops_run).level == "ops"
    assert sorted(p.name for p in (ops_run / "raw").iterdir()) == ["kineto_rank0.json", "kineto_rank1.json"]
    for rank in (0, 1):
        nodes = nodes_of(ops_run, rank)
        comp = [(n, a) for n, a in nodes if n.type == NodeType.COMP]
        names = Counter(n.name for n, _ in comp)
        assert any(k.startswith("aten::") for k in names), names
        # operators of the main thread share stream 0 with the blocking calls that thread made
        assert sum(1 for _n, a in comp if a[Attr.STREAM] == 0) > 10
        assert not any(k.startswith(("c10d::", "gloo:")) for k in names)
        blocking = [
            (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS])
            for n, a in nodes
            if n.type in (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV) and a[Attr.STREAM] == 0
        ]
        for _n, a in comp:
            if a[Attr.STREAM] != 0:
                continue
            s, e = a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS]
            assert not any(s <= bs < e for bs, _be in blocking)  # no operator encloses a blocking call
        assert sum(1 for n, _ in nodes if n.type == NodeType.COMM_SEND) == (2 if rank == 0 else 0)


def test_ops_level_also_leaves_ddps_all_reduce_to_ddp_and_times_it_from_gloos_worker_thread(
    ops_run: Path,
) -> None:
    assert_ddp_left_to_ddp_and_timed(ops_run)


def test_ops_level_shows_the_straggler_compute_as_matmuls_and_the_slow_send_as_idle_time(
    ops_run: Path,
) -> None:
    m = read_manifest(ops_run)
    step_start = {(s.rank, s.step): s.start_ns for s in m.steps}
    matmuls: dict[int, dict[int, int]] = {
        0: {},
        1: {},
    }  # rank -> step -> aten::mm before its first collective
    for rank in (0, 1):
        nodes = nodes_of(ops_run, rank)
        for step in (2, 3):
            in_step = [(n, a) for n, a in nodes if a.get(Attr.STEP) == step]
            first_comm = min(a[Attr.START_NS] for n, a in in_step if n.type == NodeType.COMM_COLL)
            matmuls[rank][step] = sum(
                1 for n, a in in_step if n.name == "aten::mm" and a[Attr.START_NS] < first_comm
            )
            if rank == 0:  # the straggler computes until its 20 ms deadline before the first collective
                assert first_comm - step_start[(0, step)] >= 20e6
    for step in (2, 3):  # its extra compute is matmuls, 4 at a time (rank 1 runs the same step without it)
        extra = matmuls[0][step] - matmuls[1][step]
        assert extra >= 4 and extra % 4 == 0, matmuls
    for step in (2, 3):  # the sleep before rank 0's send: one untraced stretch, no operator inside it
        in_step = [(n, a) for n, a in nodes_of(ops_run, 0) if a.get(Attr.STEP) == step]
        send = next(a for n, a in in_step if n.type == NodeType.COMM_SEND)
        idle = max(
            (a for n, a in in_step if n.name == "untraced" and a[Attr.START_NS] < send[Attr.START_NS]),
            key=lambda a: a[Attr.DUR_NS],
        )
        idle_end = idle[Attr.START_NS] + idle[Attr.DUR_NS]
        assert idle_end <= send[Attr.START_NS] + 1
        assert idle[Attr.DUR_NS] >= 20e6 - 100_000  # the 20 ms sleep (time.sleep never returns early)
        assert not [
            n.name
            for n, a in in_step
            if n.type == NodeType.COMP
            and n.name != "untraced"
            and a[Attr.STREAM] == 0
            and a[Attr.START_NS] < idle_end
            and a[Attr.START_NS] + a[Attr.DUR_NS] > idle[Attr.START_NS]
        ]


def test_ops_level_main_thread_is_covered_except_where_it_waits_for_async_collectives(ops_run: Path) -> None:
    m = read_manifest(ops_run)
    for span in m.steps:
        nodes = nodes_of(ops_run, span.rank)
        main = sorted(
            (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS])
            for _n, a in nodes
            if a.get(Attr.STEP) == span.step and a.get(Attr.STREAM) == 0
        )
        async_ends = [
            a[Attr.START_NS] + a[Attr.DUR_NS]
            for n, a in nodes
            if n.type == NodeType.COMM_COLL and a.get(Attr.STREAM, 0) >= 1000
        ]
        assert span.start_ns <= main[0][0] and max(b for _, b in main) <= span.end_ns  # none spills out
        uncovered = 0
        cursor = main[0][0]
        for a, b in main:
            if a - cursor > 2_000:  # a hole: the thread was blocked in wait() on an async collective,
                # which completed (on gloo's worker thread, one clock) before the thread went on
                assert any(span.start_ns <= e <= a for e in async_ends), (span, cursor, a)
                uncovered += a - cursor
            cursor = max(cursor, b)
        assert uncovered < span.end_ns - span.start_ns


MM_SCHEMA = "aten::mm(Tensor self, Tensor mat2) -> Tensor"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    res = profile(out, "--steps", "4", level="full", steps="1:1:1", nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_full_level_adds_schemas_and_data_dependencies(full_run: Path) -> None:
    assert read_manifest(full_run).level == "full"
    nodes = nodes_of(full_run, 0)
    comp = [(n, a) for n, a in nodes if n.type == NodeType.COMP and n.name != "untraced"]
    # the operators the host trace described (their inputs' types) carry their schema; a schema-less
    # scope's own time around its operators is a node named after the scope, with neither
    ops = [a for n, a in comp if n.inputs.types]
    with_schema = [a for a in ops if a.get(Attr.OP_SCHEMA)]
    assert ops and len(with_schema) >= 0.5 * len(ops), (len(with_schema), len(ops))
    scopes = {n.name for n, a in comp if not n.inputs.types and not a.get(Attr.OP_SCHEMA)}
    assert "DistributedDataParallel.forward" in scopes, scopes
    assert read_et(full_run / "rank-0.et").metadata["host_trace"] == "profiler"
    typed = [json.loads(n.inputs.types) for n, a in comp if a.get(Attr.OP_SCHEMA) == MM_SCHEMA]
    assert typed and all(t == ["Tensor(float)", "Tensor(float)"] for t in typed)
    ids = {n.id: n for n, _ in nodes}
    with_data = [n for n, _ in comp if n.data_deps]
    assert with_data
    assert all(ids[d].start_time_micros <= n.start_time_micros for n in with_data for d in n.data_deps)
    # collectives join the data flow too: the tensor-parallel all_gather reads the local matmul's output
    comm = [(n, a) for n, a in nodes if n.type == NodeType.COMM_COLL]
    assert any(n.data_deps for n, _ in comm)
    comm_ids = {n.id for n, _ in comm}
    assert any(comm_ids & set(n.data_deps) for n, _ in comp)
    assert not (full_run / "raw").exists() and not (full_run / ".parts").exists()
    # one training thread: no data dependency between threads was dropped, and no rank says one was
    assert not [k for k in read_manifest(full_run).notes if k.endswith(RankNote.DATA_DEPENDENCIES.value)]


# ---- failures ----------------------------------------------------------------------------------------
def test_a_crashing_rank_is_listed_missing_and_the_others_traces_are_complete(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = profile(out, "--steps", "6", "--crash-rank", "1", "--crash-step", "3", steps="1:1:3", nproc=2)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "skewlens profile: error: command exited with code" in last and "missing rank 1" in last
    m = read_manifest(out)
    assert (m.ranks, m.missing_ranks) == ((0,), (1,))
    assert "rank 1" in m.notes and "crashed" in m.notes["rank 1"]
    assert {s.step for s in m.steps} == {2}  # the one step completed before the crash
    assert [a[Attr.STEP] for n, a in nodes_of(out, 0)[1:]] and all(
        a[Attr.STEP] == 2 for n, a in nodes_of(out, 0)[1:]
    )
    assert not list(out.glob(".*tmp"))
    # the summary table names the missing rank
    from rich.console import Console

    from skewlens.cli.profile import summary_table

    console = Console(file=io.StringIO(), width=120)
    console.print(summary_table(m, out))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "missing" in text and "crashed" in text


def test_a_failing_command_passes_its_exit_code_through_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = profile(out, command=[sys.executable, "-c", "import sys; sys.exit(7)"])
    assert res.returncode == 7
    assert (
        res.stderr.strip().splitlines()[-1].startswith("skewlens profile: error: command exited with code 7")
    )
    assert not out.exists()


def test_a_run_whose_steps_call_several_optimizers_says_which_one_marks_the_steps(tmp_path: Path) -> None:
    # a GAN steps its discriminator three times per generator step: each of those was a "step", silently
    script = tmp_path / "gan.py"
    script.write_text(
        "import torch\n"
        "d, g = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)\n"
        "od, og = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.Adam(g.parameters())\n"
        "for _ in range(4):\n"
        "    for _ in range(3):\n"
        "        d(torch.ones(8)).sum().backward(); od.step()\n"
        "    g(torch.ones(8)).sum().backward(); og.step()\n"
    )
    out = tmp_path / "run"
    res = profile(out, command=[sys.executable, str(script)])
    assert res.returncode == 0, res.stderr
    note = read_manifest(out).notes["step marks"]
    # the calls until the window's last step (the 5th of SGD's, its 2nd group of three), when it saved
    assert note.startswith(
        "2 optimizers stepped; a step ends at each step() of the first to step "
        "(SGD, 5 calls by the end of the window;"
    )
    assert "others: Adam 1)" in note
    assert f"steps: {note}" in run_notes(load_run(out))  # analyze's and replay's reports say so


def test_single_process_python_run_is_captured_too(tmp_path: Path) -> None:
    out = tmp_path / "run"
    times = tmp_path / "steps-{rank}.json"
    res = profile(
        out,
        command=[sys.executable, str(TRAIN), "--steps", "5", "--step-times-out", str(times)],
        flags=("--parquet",),
    )
    assert res.returncode == 0, res.stderr
    m = read_manifest(out)
    assert (m.world_size, m.ranks) == (1, (0,))
    assert sum(1 for n, _ in nodes_of(out, 0) if n.type == NodeType.COMM_COLL) >= 3 * 4
    assert json.loads((out / "manifest.json").read_text())["command"][0] == sys.executable
    # the example's own per-step wall times (what benchmarks/capture_overhead.py reads)
    data = json.loads((tmp_path / "steps-0.json").read_text())
    assert (data["rank"], data["world_size"], len(data["step_ns"])) == (0, 1, 5)
    assert all(t > 0 for t in data["step_ns"])
    # --parquet exported the run next to it, the execution model's table with it (collective_skew.sql's)
    assert (out / "parquet").is_dir() and list((out / "parquet").glob("*.parquet"))
    assert [p.name for p in (out / "parquet" / "model").iterdir()] == ["rank=0"]


PHASES = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import record_function
dist.init_process_group("gloo")
torch.manual_seed(0)
ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)))
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for _ in range(5):
    with record_function("generate"):
        with torch.no_grad():
            x = torch.randn(16, 64)
            for _ in range(8):
                x = ddp.module(x).tanh()
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, x.shape[0])
    with record_function("train"):
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()
"""


def test_ops_level_phase_scopes_keep_their_own_time_and_ddps_wait_stays_untraced(tmp_path: Path) -> None:
    # an RL loop's phases as record_function scopes; the step is marked inside "train"'s Optimizer.step,
    # which ended after the mark: "train" left no node before (its own time was untraced); DDP's
    # all_reduce, waited for inside it, must not become "train" time (compute of fixed length)
    out = _two_ddp_ranks_at_ops(tmp_path, PHASES)
    for rank in (0, 1):
        nodes = nodes_of(out, rank)
        steps = {a[Attr.STEP] for _n, a in nodes if a.get(Attr.STEP, -1) >= 0}
        train = [
            (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS], a[Attr.STEP])
            for n, a in nodes
            if n.name == "train" and a.get(Attr.STREAM) == 0
        ]
        assert {s for _a, _b, s in train} == steps == {2, 3, 4}, (rank, train)
        ends = [e for _s, e in _async_spans(nodes)]
        assert ends and not [(e, t) for e in ends for t in train if t[0] < e < t[1]], rank


def _two_ddp_ranks_at_ops(tmp_path: Path, text: str) -> Path:
    """The run of the script ``text`` profiled at the ``ops`` level on 2 gloo ranks, window 1:1:3."""
    out, res = profile_script(tmp_path, text, nproc=2, level="ops")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _async_spans(nodes: list[tuple[Any, dict[str, Any]]]) -> list[tuple[int, int]]:
    """(issue, end) of the collectives on a comm stream (DDP's bucket all_reduces)."""
    return [
        (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS])
        for n, a in nodes
        if n.type == NodeType.COMM_COLL and a.get(Attr.STREAM, 0) >= 1000
    ]


CLOSURE = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)))
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
def closure():
    opt.zero_grad()
    loss = ddp(torch.randn(16, 64)).square().mean()
    loss.backward()
    return loss
for _ in range(5):
    opt.step(closure)
dist.destroy_process_group()
"""


def test_ops_level_optimizer_step_whose_closure_runs_backward_leaves_ddps_wait_outside_its_own_time(
    tmp_path: Path,
) -> None:
    # PyTorch Lightning's automatic optimisation, in plain torch: forward and backward run in the closure
    # given to optimizer.step(), so DDP's all_reduce is issued and waited for inside Optimizer.step. That
    # op was one node up to the step mark, the wait inside it compute of fixed length (a slowed peer then
    # blamed the rank that waited for it)
    out = _two_ddp_ranks_at_ops(tmp_path, CLOSURE)
    for rank in (0, 1):
        nodes = nodes_of(out, rank)
        main = [(n.name, a) for n, a in nodes if n.type == NodeType.COMP and a.get(Attr.STREAM) == 0]
        opt = [
            (a[Attr.START_NS], a[Attr.START_NS] + a[Attr.DUR_NS])
            for n, a in main
            if n == "Optimizer.step#SGD.step"
        ]
        assert {a[Attr.STEP] for n, a in main if n == "Optimizer.step#SGD.step"} == {2, 3, 4}, rank
        backward = {a[Attr.STEP] for n, a in main if n.startswith("autograd::engine::evaluate_function")}
        assert backward == {2, 3, 4}, (rank, sorted({n for n, _a in main}))
        # no piece of it holds the wait: from the bucket's issue to its end (gloo's worker may record the
        # end a little after the thread went on, into the piece after the wait)
        spans = _async_spans(nodes)
        assert len(spans) == 3 and not [
            (c, o) for c in spans for o in opt if o[0] <= c[0] and c[1] <= o[1]
        ], rank
