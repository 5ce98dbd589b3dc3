"""Tidying the profiler's capture of a real replay (``skewlens.replay.real.capture``), on synthetic runs."""

from __future__ import annotations

from pathlib import Path

from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import Attr, CommType
from skewlens.replay.real.capture import finish_capture


def captured_replay(run: Path) -> Path:
    """What the workers' profiler leaves: a pre-roll step 1, then the replayed steps 2-4."""
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        for s in (1, 2, 3, 4):
            rb.step(s).compute("compute", dur_ns=1_000_000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000)
    return b.write(run)


def steps_in_trace(run: Path, rank: int) -> set[int]:
    return {int(node_attrs(n)[Attr.STEP]) for n in read_et(run / f"rank-{rank}.et").nodes[1:]}


def test_finishing_a_captured_replay_twice_drops_only_the_pre_roll_step(tmp_path: Path) -> None:
    # across hosts each host's parent finished OUT/run: the second dropped step 2, the first replayed
    # step, as if it were the pre-roll (a two-host replay of 3 steps kept steps [3, 4])
    run = captured_replay(tmp_path / "run")
    for _host in range(2):
        finish_capture(run, source_run=tmp_path / "orig", node_aligned=tmp_path / "aligned")
    m = read_manifest(run)
    assert sorted({s.step for s in m.steps}) == [2, 3, 4]
    assert steps_in_trace(run, 0) == steps_in_trace(run, 1) == {2, 3, 4}
    assert m.source == "replay" and m.notes["pre_roll_step"].startswith("step 1 ")


def test_a_captured_replay_numbers_its_steps_as_the_replayed_run_did(tmp_path: Path) -> None:
    # a run recorded from step 5 (window 4:1:3, say): before, its replay read steps 2-4 whatever the run's
    orig = RunBuilder(world_size=2)
    for r in (0, 1):
        for s in (5, 6, 7):
            orig.rank(r).step(s).compute("compute", dur_ns=1_000_000)
    orig.write(tmp_path / "orig")
    run = captured_replay(tmp_path / "run")
    finish_capture(run, source_run=tmp_path / "orig", node_aligned=tmp_path / "aligned")
    assert sorted({s.step for s in read_manifest(run).steps}) == [5, 6, 7]
    assert steps_in_trace(run, 0) == steps_in_trace(run, 1) == {5, 6, 7}
