"""Simulated replay of a real captured run: the example on 4 gloo ranks, replayed as recorded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.profiler.vocab import NodeType
from skewlens.replay.driver import load_trace
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not EXAMPLE.is_file() or importlib.util.find_spec("skewlens.profiler.capture") is None:
        pytest.skip("capture (profiler/capture, examples/train.py) is not available")
    run = tmp_path_factory.mktemp("captured") / "run"
    res = profile(run, "--steps", "6", steps="1:1:3", nproc=4)
    if res.returncode != 0:
        pytest.fail(f"capture failed ({res.returncode}): {res.stderr[-2000:]}")
    return run


@pytest.mark.slow
def test_replaying_the_unmodified_capture_never_runs_a_node_ahead_of_the_recording(captured: Path) -> None:
    # The replay keeps the recorded durations and host gaps and can only defer a node (a dependency or
    # peer later than recorded: clock-alignment error between ranks, measurement overlap on gloo's
    # worker threads); on a consistent synthetic run it is exact (test_sim_core). How close it comes to a
    # real capture's step times is measured by benchmarks/real_replay_fidelity.py.
    run = load_trace(captured)
    res = simulate(run)
    assert sorted((s.rank, s.step) for s in run.manifest.steps) == sorted(res.step_spans())
    # (the ends as the model takes them: a hidden wait's completion recorded after the wait ended, gloo's
    # worker lag, is that wait's end)
    from skewlens.replay.execution import model_ends

    for r, rt in run.ranks.items():
        timed = rt.node_type != int(NodeType.METADATA)
        assert (res.start_ns[r][timed] >= rt.start_ns[timed]).all(), r
        assert (res.end_ns[r][timed] >= model_ends(run, r)[timed]).all(), r


@pytest.mark.slow
def test_slowing_one_rank_of_the_capture_never_makes_anything_finish_earlier(captured: Path) -> None:
    # A delay can only defer what waits on it, so every node and every step ends no earlier. One step's
    # span (its last end minus its first start) may shrink: the slow rank's lateness in step k also
    # pushes back the first start of step k + 1. The other ranks need not end later at all: on 4 ranks
    # sharing 2 cores a descheduled peer can leave rank 2 enough slack to absorb all of its slowdown
    # (CI saw it once), so what must end later is the slowed rank's own last step, whose last op (the
    # optimizer's compute after the last all_reduce) is stretched by the factor.
    run = load_trace(captured)
    base = simulate(run)
    slow = simulate(run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(2,), factor=1.5)]))
    for r in run.ranks:
        assert (slow.end_ns[r] >= base.end_ns[r]).all(), r
    base_spans, slow_spans = base.step_spans(), slow.step_spans()
    for key, (_start, end) in base_spans.items():
        assert slow_spans[key][1] >= end, key
    last = max(base.steps())
    assert slow_spans[(2, last)][1] > base_spans[(2, last)][1]


def test_replaying_imported_gpu_traces_reproduces_each_ranks_span(dlrm_imported: Path) -> None:
    run = load_trace(dlrm_imported)
    res = simulate(run)
    assert len(run.ranks) == 8 and len(run.collectives) > 0
    for r, rt in run.ranks.items():
        timed = rt.node_type != 1
        recorded = int(rt.end_ns[timed].max() - rt.start_ns[timed].min())
        replayed = int(res.end_ns[r][timed].max() - res.start_ns[r][timed].min())
        assert abs(replayed - recorded) <= 0.01 * recorded, (r, replayed, recorded)


def test_a_collective_on_a_slowed_gpu_waits_for_the_kernels_launched_before_its_call(
    dlrm_imported: Path,
) -> None:
    """c10d makes NCCL's stream wait for the stream current at the call, so a collective's NCCL kernel
    cannot start before the work launched on that stream before it ends. DLRM's kernels feeding its
    collectives had ended before each call: no edge was read from timing, and with rank 0's GPU ten times
    slower its all_reduces started up to 1.5 ms before the kernels that computed their input ended, while
    the other ranks' steps did not change."""
    run = load_trace(dlrm_imported)
    rt = run.ranks[0]
    assert rt.launch_ns is not None
    base = simulate(run)
    slow = simulate(
        run, effects=SlowdownModel([Slowdown(kind="compute", ranks=(0,), factor=10.0, device="gpu")])
    )
    gpu = ~rt.is_cpu & (rt.launch_ns >= 0)
    comm = gpu & (rt.node_type == NodeType.COMM_COLL)
    compute = gpu & (rt.node_type == NodeType.COMP)
    assert comm.sum() == 8
    for i in comm.nonzero()[0]:
        same_stream_before = compute & (rt.launch_ns < rt.launch_ns[i]) & (rt.stream == 7)
        assert same_stream_before.any()
        assert slow.end_ns[0][same_stream_before].max() <= slow.start_ns[0][i], rt.name(int(i))
    # ... so the peers wait for rank 0's delayed collectives: no rank's step shrinks, most grow (ranks 4
    # and 5 end their step with work of their own after the last collective)
    base_spans, slow_spans = base.step_spans(), slow.step_spans()
    grew = 0
    for r in run.ranks:
        (b0, b1), (s0, s1) = base_spans[(r, 10)], slow_spans[(r, 10)]
        assert s1 - s0 >= b1 - b0, r
        grew += s1 - s0 > b1 - b0
    assert grew >= 6
