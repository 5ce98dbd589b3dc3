"""The example workloads captured with a straggler replay, analyse and re-execute on the one execution model.

Each workload runs under ``skewlens profile`` on gloo with ``--straggler-rank 1 --straggler-ms 40``. What
does not depend on this machine's load is asserted: the recorded order can complete (``check``), the
simulator's unmodified replay reproduces each rank's median step time (step mark to step mark) within 5%,
and rank 1 is the top straggler of the what-if blame. How close the blamed cost comes to the real one, and
the real replay's step times, are timing figures: ``benchmarks/fidelity.py`` reports them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from workload_helpers import capture_workload

from skewlens.analysis.api import analyze_run
from skewlens.profiler.store.model import RunTrace
from skewlens.replay.simulate import find_deadlock, simulate
from skewlens.replay.summary import summarize

pytestmark = pytest.mark.slow

STRAGGLER = ("--straggler-rank", "1", "--straggler-ms", "40")
WORKLOADS = {
    "fsdp2": ("fsdp2.py", (), 2),
    "fsdp1": ("fsdp1.py", ("--forward-prefetch", "--limit-all-gathers", "--use-orig-params"), 2),
    "tp": ("tp.py", (), 2),
    "pipeline-gpipe": ("pipeline.py", ("--schedule", "gpipe"), 2),
    "pipeline-1f1b": ("pipeline.py", ("--schedule", "1f1b"), 2),
    "pipeline-interleaved-1f1b": ("pipeline.py", ("--schedule", "interleaved-1f1b"), 2),
    "pipeline-zbv": ("pipeline.py", ("--schedule", "zbv"), 2),
    "ddp-accum": ("ddp_accum.py", (), 2),
    "mesh2d": ("mesh2d.py", (), 4),
}


def _median_step_errors(run: RunTrace) -> dict[int, float]:
    rows = summarize(run, simulate(run))
    out = {}
    for r in run.ranks:
        mine = [x for x in rows if x.rank == r]
        rec = statistics.median(x.recorded_step_ns for x in mine)
        out[r] = abs(statistics.median(x.step_time_ns for x in mine) - rec) / rec
    return out


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_a_captured_workload_replays_exactly_and_blames_its_straggler(tmp_path: Path, name: str) -> None:
    script, args, nproc = WORKLOADS[name]
    run = capture_workload(tmp_path / "run", script, *args, *STRAGGLER, nproc=nproc, steps="1:1:4")
    assert find_deadlock(run) is None
    errors = _median_step_errors(run)
    assert max(errors.values()) <= 0.05, errors
    res = analyze_run(run, blame=True)
    assert res.stragglers[0].rank == 1, [(b.rank, b.straggler_cost_ns, b.cause) for b in res.stragglers]
    assert res.stragglers[0].straggler_cost_ns > 0


def test_1f1b_re_executes_on_real_processes_without_a_deadlock(tmp_path: Path) -> None:
    from skewlens.replay.config import RealConfig
    from skewlens.replay.effects import NO_EFFECTS
    from skewlens.replay.real.api import real_replay

    script, args, nproc = WORKLOADS["pipeline-1f1b"]
    run = capture_workload(tmp_path / "run", script, *args, nproc=nproc, steps="1:1:3")
    # its steady state sends and receives in one batch_isend_irecv: the capture numbers the batches
    for rt in run.ranks.values():
        assert rt.batch is not None and len(set(rt.batch[rt.batch >= 0].tolist())) >= 3
    res = real_replay(
        run_dir=tmp_path / "run", out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=RealConfig(timeout_s=60.0)
    )
    assert {r.rank for r in res.ranks} == {0, 1}
    assert all(len(r.replay_ns) == 3 and min(r.replay_ns) > 0 for r in res.ranks)
