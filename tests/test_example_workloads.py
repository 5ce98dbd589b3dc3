"""The example workloads under ``skewlens profile`` (collectives level, gloo ranks, 3 captured steps): each
step holds exactly the communication its program issues, with its groups, sizes and peers.

Sizes come from the scripts' own constants; each test captures one workload (10-40 s on 2 CPU cores).
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from workload_helpers import F32, CommKey, capture_workload, captured_steps, comm_per_step, load_workload

from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.vocab import NodeType

pytestmark = pytest.mark.slow

ACTIVE = 3
STEPS = [2, 3, 4]  # the window 1:1:3 captures steps 2..4 (after one waited and one warm-up step)


def per_step_is(run: RunTrace, expected: dict[int, Counter[CommKey]]) -> None:
    """Every rank recorded the 3 steps, each with exactly ``expected[rank]`` (nothing outside a step)."""
    assert captured_steps(run) == dict.fromkeys(expected, STEPS)
    comm = comm_per_step(run)
    for rank, want in expected.items():
        assert comm[rank] == dict.fromkeys(STEPS, want), f"rank {rank}"


def linear_numel(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def test_fsdp2_all_gathers_each_layer_twice_and_reduce_scatters_its_gradients_once_a_step(
    tmp_path: Path,
) -> None:
    ex = load_workload("fsdp2.py")
    run = capture_workload(tmp_path / "run", "fsdp2.py")
    full = linear_numel(ex.HIDDEN, ex.HIDDEN) * F32
    group = (0, 1)
    # forward un-shards each Linear, backward again (resharded after forward), then reduce-scatters
    want = Counter(
        {
            CommKey("ALL_GATHER", group, full // 2, -1): 2 * ex.LAYERS,  # this rank's shard in
            CommKey("REDUCE_SCATTER", group, full, -1): ex.LAYERS,  # the full gradient in
        }
    )
    per_step_is(run, {0: want, 1: want})
    assert len(run.collectives) == ACTIVE * 3 * ex.LAYERS


def test_fsdp1_gathers_each_flat_parameter_twice_a_step_and_a_full_state_dict_once_more_in_the_next_step(
    tmp_path: Path,
) -> None:
    # FullyShardedDataParallel on the CPU: its all-gathers are dist.all_gather into the flat parameter's
    # chunks (c10d::allgather_), its gradients one reduce_scatter_tensor of the flat gradient; a
    # FULL_STATE_DICT after step 2 un-shards every unit once more, counted in step 3 (no step of its own)
    ex = load_workload("fsdp1.py")
    run = capture_workload(tmp_path / "run", "fsdp1.py", "--state-dict-at", "2", "--use-orig-params")
    flat = linear_numel(ex.HIDDEN, ex.HIDDEN) * F32  # even: no padding at 2 ranks
    group = (0, 1)
    gather, reduce = CommKey("ALL_GATHER", group, flat // 2, -1), CommKey("REDUCE_SCATTER", group, flat, -1)
    want = Counter({gather: 2 * ex.LAYERS, reduce: ex.LAYERS})
    saved = Counter({gather: 3 * ex.LAYERS, reduce: ex.LAYERS})
    assert captured_steps(run) == {0: STEPS, 1: STEPS}
    for rank, per in comm_per_step(run).items():
        assert per == {2: want, 3: saved, 4: want}, f"rank {rank}"
    assert {
        run.ranks[0].names[int(run.ranks[0].name_idx[i])]
        for i in run.ranks[0].rows_of_type(NodeType.COMM_COLL)
    } == {
        "c10d::allgather_",
        "c10d::_reduce_scatter_base_",
    }


def test_tensor_parallel_all_reduces_each_row_parallel_output_and_column_parallel_input_gradient(
    tmp_path: Path,
) -> None:
    ex = load_workload("tp.py")
    run = capture_workload(tmp_path / "run", "tp.py")
    act = ex.BATCH * ex.HIDDEN * F32
    # forward: one per block; backward: one per block but the first (its input needs no gradient)
    want = Counter({CommKey("ALL_REDUCE", (0, 1), act, -1): 2 * ex.BLOCKS - 1})
    per_step_is(run, {0: want, 1: want})


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_sends_every_micro_batch_forward_and_its_gradient_back(
    tmp_path: Path, schedule: str
) -> None:
    ex = load_workload("pipeline.py")
    run = capture_workload(tmp_path / "run", "pipeline.py", "--schedule", schedule)
    act = ex.BATCH // ex.MICROBATCHES * ex.HIDDEN * F32
    assert act == ex.ACT_BYTES
    mb = ex.MICROBATCHES
    per_step_is(
        run,
        {
            0: Counter({CommKey("SEND", (0, 1), act, 1): mb, CommKey("RECV", (0, 1), act, 1): mb}),
            1: Counter({CommKey("RECV", (0, 1), act, 0): mb, CommKey("SEND", (0, 1), act, 0): mb}),
        },
    )
    assert len(run.p2p) == 2 * mb * ACTIVE
    assert {(p.src_rank, p.dst_rank) for p in run.p2p} == {(0, 1), (1, 0)}
    # the schedules differ in order: GPipe sends all activations before the first gradient comes back,
    # 1F1B receives a gradient before its last activation goes out
    rt = run.ranks[0]
    for step in STEPS:
        rows = [i for i in rt.rows_of_type(NodeType.COMM_SEND, NodeType.COMM_RECV) if rt.step[i] == step]
        rows.sort(key=lambda i: int(rt.start_ns[i]))
        order = "".join("S" if rt.node_type[i] == NodeType.COMM_SEND else "R" for i in rows)
        if schedule == "gpipe":
            assert order == "S" * mb + "R" * mb
        else:
            assert order.index("R") < order.rindex("S") and order.endswith("R"), order


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zbv"])
def test_a_pipeline_of_two_stages_a_rank_sends_only_between_stages_on_different_ranks(
    tmp_path: Path, schedule: str
) -> None:
    """Interleaved: stages 0-3 on ranks 0, 1, 0, 1, three boundaries between ranks. ZBV: a V, stages on
    ranks 0, 1, 1, 0; stage 1 -> 2 stays on rank 1 (no p2p), so two boundaries cross."""
    ex = load_workload("pipeline.py")
    run = capture_workload(tmp_path / "run", "pipeline.py", "--schedule", schedule)
    owner = ex.stage_ranks(4, 2, ex.MULTI[schedule][1])
    assert owner == ([0, 1, 0, 1] if schedule == "interleaved-1f1b" else [0, 1, 1, 0])
    crossing = sum(a != b for a, b in pairwise(owner))
    n = crossing * ex.MICROBATCHES  # each crossing boundary: an activation and a gradient per micro-batch
    act = ex.ACT_BYTES
    per_step_is(
        run,
        {
            0: Counter({CommKey("SEND", (0, 1), act, 1): n, CommKey("RECV", (0, 1), act, 1): n}),
            1: Counter({CommKey("RECV", (0, 1), act, 0): n, CommKey("SEND", (0, 1), act, 0): n}),
        },
    )
    assert len(run.p2p) == 2 * n * ACTIVE
    assert {(p.src_rank, p.dst_rank) for p in run.p2p} == {(0, 1), (1, 0)}


@pytest.mark.parametrize(
    ("name", "args"),
    [("accum", ("--accum", "3")), ("compile", ("--compile", "--compile-backend", "aot_eager"))],
)
def test_ddp_all_reduces_every_gradient_once_a_step_not_once_a_micro_batch(
    tmp_path: Path, name: str, args: tuple[str, ...]
) -> None:
    ex = load_workload("ddp_accum.py")
    run = capture_workload(tmp_path / "run", "ddp_accum.py", *args)
    grads = ex.LAYERS * linear_numel(ex.HIDDEN, ex.HIDDEN) * F32
    assert captured_steps(run) == {0: STEPS, 1: STEPS}
    comm = comm_per_step(run)
    for rank in (0, 1):
        assert sorted(comm[rank]) == STEPS
        for step, counts in comm[rank].items():
            assert {(k.kind, k.group) for k in counts} == {("ALL_REDUCE", (0, 1))}, (rank, step)
            # the buckets carry every gradient exactly once (the no_sync micro-batches sent nothing)
            assert sum(k.bytes * n for k, n in counts.items()) == grads, (rank, step)


def test_a_2d_mesh_all_reduces_on_its_tp_groups_and_shards_on_its_dp_groups(tmp_path: Path) -> None:
    ex = load_workload("mesh2d.py")
    run = capture_workload(tmp_path / "run", "mesh2d.py", nproc=4)
    tp = dp = 2
    # a block's parameters on one tp rank: up's rows and bias split, down's columns split, its bias whole
    tp_local = linear_numel(ex.HIDDEN, ex.FFN) // tp + ex.FFN * ex.HIDDEN // tp + ex.HIDDEN
    shard = tp_local // dp * F32
    act = ex.BATCH * ex.HIDDEN * F32
    expected = {}
    for rank in range(4):
        tp_group = (rank // tp * tp, rank // tp * tp + 1)  # {0,1}, {2,3}
        dp_group = (rank % tp, rank % tp + tp)  # {0,2}, {1,3}
        expected[rank] = Counter(
            {
                CommKey("ALL_GATHER", dp_group, shard, -1): 2 * ex.BLOCKS,
                CommKey("REDUCE_SCATTER", dp_group, 2 * shard, -1): ex.BLOCKS,
                CommKey("ALL_REDUCE", tp_group, act, -1): 2 * ex.BLOCKS - 1,
            }
        )
    per_step_is(run, expected)
    members = Counter(c.ranks for c in run.collectives)
    assert set(members) == {(0, 1), (2, 3), (0, 2), (1, 3)}


def test_no_time_inside_a_1f1b_stages_async_send_or_recv_call_is_idle_at_the_ops_level(
    tmp_path: Path,
) -> None:
    """Under the ``ops`` level's profiler, gloo's ``batch_isend_irecv`` calls of a 1F1B stage block for ms (in
    one capture 11 of rank 0's 24, up to 7.6 ms), some past the end of their peer's op. The execution model
    ended each async op with its peer, so the rest of its call was in no row: the breakdown's idle and
    the critical path's host gap. The capture now records each call's return (``skl_return_ns``) and the
    model ends no op before it: every nanosecond inside a call is busy. (Whether a call outlasts its peer
    is timing: in 4 captures of 3 steps 3 to 12 did; the fast test
    ``test_an_async_send_is_not_ended_before_its_blocking_call_returned_so_the_call_is_no_idle_or_host_gap``
    holds the case for certain.)"""
    from skewlens.replay.execution import Coverage, busy_intervals, execution_model, model_ends

    run = capture_workload(tmp_path / "run", "pipeline.py", "--schedule", "1f1b", level="ops", steps="1:1:5")
    em = execution_model(run)
    for r, rt in run.ranks.items():
        assert rt.return_ns is not None, r
        rows = np.flatnonzero(rt.return_ns >= 0)
        assert set(rt.node_type[rows].tolist()) == {int(NodeType.COMM_SEND), int(NodeType.COMM_RECV)}
        returned = np.minimum(rt.return_ns[rows], rt.start_ns[rows] + rt.dur_ns[rows])
        end = model_ends(run, r)
        assert (end[rows] >= returned).all(), r
        busy = Coverage.of(*busy_intervals(rt, em.ranks[r], rt.start_ns, end))
        assert busy.between(rt.start_ns[rows], returned).tolist() == (returned - rt.start_ns[rows]).tolist()


@pytest.mark.parametrize(("tp", "schedule"), [(1, "1f1b"), (2, "gpipe")], ids=["pp-x-fsdp2", "pp-x-tp"])
def test_a_3d_mesh_sends_on_its_pp_groups_shards_on_its_dp_groups_and_all_reduces_on_its_tp_groups(
    tmp_path: Path, tp: int, schedule: str
) -> None:
    """``examples/mesh3d.py`` on 4 ranks, (pp, dp, tp) = (2, 2, 1) or (2, 1, 2): every p2p op on the pp
    group to the other stage's global rank, FSDP2's on the dp group, DTensor's on the tp group; and the
    skew analysis reads it with no cause beyond the capture (the second stage's first communication is a
    recv, whose window opened at the process-group node's 0 ns: 'host idle/gap +1796571738288.4 ms')."""
    from skewlens.analysis.index import build_index
    from skewlens.analysis.skew import analyze_skew

    ex = load_workload("mesh3d.py")
    run = capture_workload(tmp_path / "run", "mesh3d.py", "--tp", str(tp), "--schedule", schedule, nproc=4)
    dp = 4 // (2 * tp)  # two stages
    tp_local = linear_numel(ex.HIDDEN, ex.FFN) // tp + ex.FFN * ex.HIDDEN // tp + ex.HIDDEN
    act = ex.BATCH // ex.MICROBATCHES * ex.HIDDEN * F32
    expected = {}
    for rank in range(4):
        p, d, t = rank // (dp * tp), rank // tp % dp, rank % tp
        peer = (1 - p) * dp * tp + d * tp + t
        pp_group = (min(rank, peer), max(rank, peer))
        want = Counter({CommKey("SEND", pp_group, act, peer): ex.MICROBATCHES})
        want[CommKey("RECV", pp_group, act, peer)] = ex.MICROBATCHES
        if dp > 1:
            dp_group = tuple(p * dp * tp + k * tp + t for k in range(dp))
            gathers = ex.BLOCKS * (ex.MICROBATCHES + 1)
            want[CommKey("ALL_GATHER", dp_group, tp_local // dp * F32, -1)] = gathers
            want[CommKey("REDUCE_SCATTER", dp_group, tp_local * F32, -1)] = ex.BLOCKS
        if tp > 1:
            tp_group = tuple(p * dp * tp + d * tp + k for k in range(tp))
            backward = 2 * ex.BLOCKS - (1 if p == 0 else 0)
            want[CommKey("ALL_REDUCE", tp_group, act, -1)] = ex.MICROBATCHES * backward
        expected[rank] = want
    per_step_is(run, expected)
    descs = {g.desc for g in run.process_groups.values() if len(g.ranks) == 2}
    assert descs == {"mesh_pp", "mesh_dp" if dp > 1 else "mesh_tp"}
    skew = analyze_skew(build_index(run))
    first = min(int(rt.start_ns[rt.node_type != int(NodeType.METADATA)].min()) for rt in run.ranks.values())
    last = max(int((rt.start_ns + rt.dur_ns).max()) for rt in run.ranks.values())
    assert skew.events and max(e.cause.delta_ns for e in skew.events) <= last - first
    assert {e.label.split(":")[0].split()[-1] for e in skew.events if ":" in e.label} == {"pp"} | (
        {"dp"} if dp > 1 else {"tp"}
    )
