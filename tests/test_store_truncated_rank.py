"""A rank that stopped inside a step (a crash, a stop) saved only the steps it completed, while its
peers' traces hold that step's communication with it: the loader leaves that communication out of
matching on every rank, says so, and marks the steps incomplete, instead of refusing the run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from capture_helpers import profile_script
from trace_edits import without_dtype

from skewlens.profiler.manifest import PARTIAL_TRACE_NOTE, read_manifest, write_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import Issue, run_notes
from skewlens.profiler.store.parquet import export_run
from skewlens.profiler.store.schema import read_table
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.simulate import simulate

MIB = 1 << 20


def _run(tmp_path: Path, *, rank1_steps: int, partial: bool = True) -> Path:
    """Ranks 0-2 on the world group and a pair group of ranks 0 and 2, three steps each; rank 1 keeps only
    its first ``rank1_steps`` (and, ``partial``, the manifest says its trace is partial, as a capture does
    for a rank that exited inside its window). Each step: an all_reduce on the world, one on the pair, a
    send 0 -> 1 and a send 2 -> 0."""
    b = RunBuilder(world_size=3, groups={"0": (0, 1, 2), "pair": (0, 2)})
    for step in range(3):
        for r in (0, 1, 2):
            if r == 1 and step >= rank1_steps:
                continue
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500)
            if r != 1:
                rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500, pg="pair", dtype="bfloat16")
        b.rank(0).send(dst=1, comm_bytes=64, dur_ns=100, tag=step)
        if step < rank1_steps:
            b.rank(1).recv(src=0, comm_bytes=64, dur_ns=100, tag=step)
        b.rank(2).send(dst=0, comm_bytes=32, dur_ns=100, tag=7)
        b.rank(0).recv(src=2, comm_bytes=32, dur_ns=100, tag=7)
    run = b.write(tmp_path / "run")
    if partial and rank1_steps < 3:
        m = read_manifest(run)
        note = f"{PARTIAL_TRACE_NOTE}: saved {rank1_steps} of 3 steps at exit"
        write_manifest(run, dataclasses.replace(m, notes={**m.notes, "rank 1": note}))
    return run


def _the_warning(run: Path, kind: str) -> Issue:
    """The one warning of ``kind`` that checking ``run`` gives; it gives no error."""
    report = validate_run(run)
    assert report.ok, [str(i) for i in report.errors]
    (warn,) = [i for i in report.warnings if i.kind == kind]
    return warn


def test_communication_with_a_rank_after_its_last_step_is_left_out_and_its_steps_marked_incomplete(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, rank1_steps=2)
    warn = _the_warning(run, "truncated-rank")
    assert warn.rank == 1 and "ends at step 1, the others' at step 2" in warn.message
    # rank 0's step-2 all_reduce on the world and its send to rank 1; rank 2's all_reduce on the world
    assert "(3 node(s) in all)" in warn.message
    rt = load_run(run)
    assert rt.incomplete_steps == (2,)
    by_group: dict[str, int] = {}
    for inst in rt.collectives:
        by_group[inst.pg_name] = by_group.get(inst.pg_name, 0) + 1
    assert by_group == {"0": 2, "pair": 3}  # the pair, which rank 1 is not in, keeps its step 2
    sends = sorted((p.src_rank, p.dst_rank) for p in rt.p2p)
    assert sends == [(0, 1), (0, 1), (2, 0), (2, 0), (2, 0)]
    simulate(rt)  # what is left replays
    # analyze and replay say so among their notes
    # of one step it read 'incomplete step(s) 2: some of their communication ... so those steps' waits'
    (said,) = [n for n in run_notes(rt) if n.startswith("incomplete step")]
    assert said == (
        "incomplete step 2: some of its communication is not in every trace (a flight recorder lost "
        "collectives, a rank stopped inside the step, or a thread issued collectives across the window's "
        "start or end: see skewlens check); it was left out of matching, so that step's waits are partial"
    )


def test_the_note_of_several_incomplete_steps_says_them_in_the_plural(tmp_path: Path) -> None:
    rt = load_run(_run(tmp_path, rank1_steps=1))  # rank 1 stopped inside step 1: steps 1 and 2 incomplete
    assert rt.incomplete_steps == (1, 2)
    (said,) = [n for n in run_notes(rt) if n.startswith("incomplete step")]
    assert said == (
        "incomplete steps 1-2: some of their communication is not in every trace (a flight recorder lost "
        "collectives, a rank stopped inside the step, or a thread issued collectives across the window's "
        "start or end: see skewlens check); it was left out of matching, so those steps' waits are partial"
    )


def test_a_rank_whose_steps_end_early_without_a_partial_trace_note_is_left_to_the_matcher(
    tmp_path: Path,
) -> None:
    # traces that simply did not record the same steps (no crash): their communication must still match
    report = validate_run(_run(tmp_path, rank1_steps=2, partial=False))
    assert not report.ok and not [i for i in report.warnings if i.kind == "truncated-rank"]


def test_a_missing_collective_inside_a_truncated_ranks_last_step_is_still_a_mismatch(tmp_path: Path) -> None:
    b = RunBuilder(world_size=2)
    for step in range(3):
        for r in (0, 1):
            if r == 1 and step == 2:
                continue
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            if not (r == 1 and step == 1):  # rank 1 lacks step 1's all_reduce, which it completed
                rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    note = f"{PARTIAL_TRACE_NOTE}: saved 2 of 3 steps at exit"
    write_manifest(run, dataclasses.replace(m, notes={**m.notes, "rank 1": note}))
    report = validate_run(run)
    assert not report.ok
    assert any("mismatch" in i.kind or "count" in i.message for i in report.errors), [
        str(i) for i in report.errors
    ]


def test_of_two_truncated_ranks_of_a_group_the_earlier_ending_one_sets_where_its_collectives_stop(
    tmp_path: Path,
) -> None:
    # ranks 0-3 on the world group, an all_reduce a step; rank 2 saved 1 of 3 steps, rank 3 2 of 3: the
    # group's collectives after step 0 (rank 2's last) are left out on every rank, step 1's too, which
    # rank 2 never issued
    b = RunBuilder(world_size=4)
    kept = {0: 3, 1: 3, 2: 1, 3: 2}
    for r, n in kept.items():
        for step in range(n):
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    notes = {f"rank {r}": f"{PARTIAL_TRACE_NOTE}: saved {kept[r]} of 3 steps at exit" for r in (2, 3)}
    write_manifest(run, dataclasses.replace(m, notes={**m.notes, **notes}))
    report = validate_run(run)
    assert report.ok, [str(i) for i in report.errors]
    assert sorted(i.rank for i in report.warnings if i.kind == "truncated-rank") == [2, 3]
    rt = load_run(run)
    assert len(rt.collectives) == 1 and rt.incomplete_steps == (1, 2)


def test_a_truncated_ranks_own_sends_and_receives_after_its_last_step_are_left_out(tmp_path: Path) -> None:
    # rank 1 crashed inside step 2 after its step's communication (as the capture above): its trace holds
    # step 2's recv from rank 0, its step marks end at step 1; that recv is left out with rank 0's send
    run = _run(tmp_path, rank1_steps=3)
    m = read_manifest(run)
    steps = tuple(s for s in m.steps if (s.rank, s.step) != (1, 2))
    note = f"{PARTIAL_TRACE_NOTE}: saved 2 of 3 steps at exit"
    write_manifest(run, dataclasses.replace(m, steps=steps, notes={**m.notes, "rank 1": note}))
    report = validate_run(run)
    assert report.ok, [str(i) for i in report.errors]
    sends = sorted((p.src_rank, p.dst_rank) for p in load_run(run).p2p)
    assert sends == [(0, 1), (0, 1), (2, 0), (2, 0), (2, 0)]


def test_ranks_that_end_together_lose_nothing(tmp_path: Path) -> None:
    report = validate_run(_run(tmp_path, rank1_steps=3))
    assert report.ok and not [i for i in report.warnings if i.kind == "truncated-rank"]
    assert load_run(tmp_path / "run").incomplete_steps == ()


CRASH = """
import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(8):
    m(torch.randn(4, 16)).sum().backward()
    for p in m.parameters():
        dist.all_reduce(p.grad)
    if r == 1 and step == 3:
        time.sleep(1)  # rank 0 ends its step 3 and waits in step 4's first all_reduce
        raise RuntimeError("boom")  # after its step's collectives, before the step ends
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_rank_that_crashes_after_its_steps_collectives_leaves_a_run_that_loads(tmp_path: Path) -> None:
    # the commonest crash shape: check called it a count mismatch and analyze refused the run
    out, res = profile_script(tmp_path, CRASH, nproc=2, steps="1:1:4")
    assert res.returncode != 0  # the command failed, and says so
    m = read_manifest(out)
    last = {r: max(s.step for s in m.steps if s.rank == r) for r in m.ranks}
    assert last == {0: 3, 1: 2}, last  # rank 0 ended step 3, rank 1 crashed inside it
    report = validate_run(out)
    assert report.ok, [str(i) for i in report.errors]
    assert [i.rank for i in report.warnings if i.kind == "truncated-rank"] == [1]
    rt = load_run(out)
    assert rt.incomplete_steps == (3,)
    # step 2's two all_reduces (weight, bias) still match, on both ranks
    members = [(r, row) for inst in rt.collectives for r, row in zip(inst.ranks, inst.rows, strict=True)]
    matched = {int(rt.ranks[r].step[row]) for r, row in members}
    assert len(rt.collectives) == 2 and matched == {2}
    simulate(rt)


def _async_tail_run(
    tmp_path: Path,
    *,
    rank1_ckpt_in_last_step: int,
    tail_step: int = 2,
    source: str = "synthetic",
    ckpt_stream: int = 1,
) -> Path:
    """Ranks 0 and 1, three steps of an all_reduce on the world; a background thread (stream
    ``ckpt_stream``) issues a checkpoint's collectives on group 'ckpt': two in step ``tail_step`` on rank 0,
    and ``rank1_ckpt_in_last_step`` on rank 1 (the rest came after its window closed). ``source``: the
    manifest's (``capture``: stream 0 is the thread that marks steps)."""
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "ckpt": (0, 1)})
    for step in range(3):
        for r in (0, 1):
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500)
            if step == tail_step:
                for _ in range(2 if r == 0 else rank1_ckpt_in_last_step):
                    rb.collective(
                        CommType.ALL_GATHER, comm_bytes=8, dur_ns=300, pg="ckpt", stream=ckpt_stream
                    )
    return b.write(tmp_path / "run", source=source)


def test_collectives_a_thread_issued_across_the_windows_end_on_one_rank_only_leave_the_last_step_incomplete(
    tmp_path: Path,
) -> None:
    # an asynchronous checkpoint still saving when the window closed: rank 0's thread had issued the second
    # planning collective by then, rank 1's not yet. Before, the run was refused (collective-count error).
    run = _async_tail_run(tmp_path, rank1_ckpt_in_last_step=1)
    warn = _the_warning(run, "window-tail")
    assert warn.message == (
        "group 'ckpt' seq 1: rank 0 issued it before the recording window closed, rank 1 only after (a "
        "thread that runs on past the window's end, such as an asynchronous checkpoint's save): it is left "
        "out of matching on every rank, leaving step 2 incomplete; to keep it, wait for that work (an "
        "async_save's future) within the window's last step"
    )
    rt = load_run(run)
    assert rt.incomplete_steps == (2,)
    kept = sorted((i.pg_name, i.seq) for i in rt.collectives)
    assert kept == [("0", 0), ("0", 1), ("0", 2), ("ckpt", 0)]
    simulate(rt)


def test_a_thread_whose_every_collective_came_after_one_ranks_window_closed_leaves_them_all_out(
    tmp_path: Path,
) -> None:
    # rank 1's window closed before its checkpoint thread issued any collective on 'ckpt', rank 0's after
    # two: both of rank 0's are the window's tail, seq 0 as well as 1 (rank 1's highest is none, not 0)
    run = _async_tail_run(tmp_path, rank1_ckpt_in_last_step=0)
    warn = _the_warning(run, "window-tail")
    assert warn.message.startswith(
        "group 'ckpt' seq 0..1: rank 0 issued them before the recording window closed, rank 1 only after ("
    )
    assert warn.message.endswith(
        "they are left out of matching on every rank, leaving step 2 incomplete; to keep them, wait for that "
        "work (an async_save's future) within the window's last step"
    )
    rt = load_run(run)
    assert rt.incomplete_steps == (2,)
    assert sorted((i.pg_name, i.seq) for i in rt.collectives) == [("0", 0), ("0", 1), ("0", 2)]


def test_a_manifest_whose_step_marks_are_not_in_order_finds_the_same_window_tail(tmp_path: Path) -> None:
    # each rank's last step is the highest it marked, not the one listed last
    run = _async_tail_run(tmp_path, rank1_ckpt_in_last_step=1)
    m = read_manifest(run)
    write_manifest(run, dataclasses.replace(m, steps=tuple(reversed(m.steps))))
    assert _the_warning(run, "window-tail").message.startswith("group 'ckpt' seq 1: rank 0 issued it before")
    assert load_run(run).incomplete_steps == (2,)


def test_a_side_threads_collective_one_rank_had_not_issued_by_the_windows_end_is_a_tail_in_any_step(
    tmp_path: Path,
) -> None:
    # a checkpoint thread beside the steps (stream 1 of a capture) issued seq 1 in step 1 on rank 0; rank
    # 1's, slower, had not by the end of step 2. Before, only a tail in the last step was one: this run was
    # refused (collective-count error), though every step window agrees and nothing is missing in between
    run = _async_tail_run(tmp_path, rank1_ckpt_in_last_step=1, tail_step=1, source="capture")
    warn = _the_warning(run, "window-tail")
    assert warn.message.startswith("group 'ckpt' seq 1: rank 0 issued it before the recording window closed")
    assert "leaving step 1 incomplete" in warn.message
    rt = load_run(run)
    assert rt.incomplete_steps == (1,)
    assert sorted((i.pg_name, i.seq) for i in rt.collectives) == [("0", 0), ("0", 1), ("0", 2), ("ckpt", 0)]


def test_a_collective_the_step_thread_issued_on_one_rank_only_before_the_last_step_is_still_a_mismatch(
    tmp_path: Path,
) -> None:
    # the thread that marks steps (stream 0 of a capture) issues inside the steps on every rank alike
    run = _async_tail_run(tmp_path, rank1_ckpt_in_last_step=1, tail_step=1, source="capture", ckpt_stream=0)
    report = validate_run(run)
    assert [i.kind for i in report.errors] == ["collective-count"]
    assert not [i for i in report.warnings if i.kind.startswith("window-")]


def _side_thread_run(tmp_path: Path, *, rank1_seqs: tuple[int, ...], rank1_first_step: int = 0) -> Path:
    """Ranks 0 and 1, steps 0-2 of an all_reduce on the world (rank 1 from ``rank1_first_step``); a metrics
    thread beside the steps (stream 1 of a capture) all_reduces on group 'metrics' once a step, seq 0-2 on
    rank 0 and ``rank1_seqs`` on rank 1 (in its last steps, in order)."""
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "metrics": (0, 1)})
    for step in range(3):
        for r in (0, 1):
            if r == 1 and step < rank1_first_step:
                continue
            rb = b.rank(r).step(step)
            rb.compute("fwd", dur_ns=1000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=500, seq=step)
    for r, seqs in ((0, (0, 1, 2)), (1, rank1_seqs)):
        for step, seq in enumerate(seqs, start=3 - len(seqs)):
            rb = b.rank(r).step(step)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=16, dur_ns=300, pg="metrics", stream=1, seq=seq)
    return b.write(tmp_path / "run", source="capture")


def test_a_side_threads_collective_begun_before_the_window_on_one_rank_is_left_out_with_a_warning(
    tmp_path: Path,
) -> None:
    # rank 1's metrics thread was inside its all_reduce seq 0 when the window began, so its trace starts at
    # seq 1; rank 0's began seq 0 inside the window. Before, check refused the run (collective-count error:
    # 'metrics' seq 0 on rank 0 only).
    run = _side_thread_run(tmp_path, rank1_seqs=(1, 2))
    warn = _the_warning(run, "window-head")
    assert warn.message == (
        "group 'metrics' seq 0: rank 0 recorded it, rank 1 issued it before the recording window began (a "
        "thread beside the steps that was inside a collective when the window began): it is left out of "
        "matching on every rank, leaving step 0 incomplete"
    )
    rt = load_run(run)
    assert rt.incomplete_steps == (0,)
    kept = sorted((i.pg_name, i.seq, i.ranks) for i in rt.collectives)
    assert kept == [("0", s, (0, 1)) for s in range(3)] + [("metrics", s, (0, 1)) for s in (1, 2)]


def test_a_collective_missing_on_one_rank_in_the_middle_of_the_window_is_still_a_mismatch(
    tmp_path: Path,
) -> None:
    # rank 1 recorded 'metrics' seq 0 and 2 but not 1: no window's edge explains that
    report = validate_run(_side_thread_run(tmp_path, rank1_seqs=(0, 2)))
    assert [i.kind for i in report.errors] == ["collective-count"]
    assert "'metrics' seq 1" in report.errors[0].message
    assert not [i for i in report.warnings if i.kind.startswith("window-")]


def test_a_missing_first_collective_where_the_ranks_step_windows_differ_is_still_a_mismatch(
    tmp_path: Path,
) -> None:
    # rank 1 recorded no step 0: its windows began a step after rank 0's, not inside a collective
    report = validate_run(_side_thread_run(tmp_path, rank1_seqs=(1, 2), rank1_first_step=1))
    assert "collective-count" in [i.kind for i in report.errors]
    assert not [i for i in report.warnings if i.kind.startswith("window-")]


def test_a_truncated_run_captured_before_skl_dtype_leaves_out_the_same_communication(tmp_path: Path) -> None:
    # a trace that records no dtype keeps none per row (no column of -1s) and its communication rows have
    # no dtypes to subset: leaving rank 1's step-2 communication out works as with them
    run = without_dtype(_run(tmp_path, rank1_steps=2))
    rt = load_run(run)
    assert [t.dtype_idx for t in rt.ranks.values()] == [None, None, None]
    assert rt.incomplete_steps == (2,)
    assert Counter(inst.pg_name for inst in rt.collectives) == {"0": 2, "pair": 3}


def test_the_collectives_kept_beside_a_truncated_ranks_left_out_ones_keep_their_own_dtypes(
    tmp_path: Path,
) -> None:
    # rank 0's step-2 all_reduce on the world (float32) is left out, its pair all_reduce after it (bfloat16)
    # kept: each exported collective names its own dtype, not the one of the row the cut shifted into place
    run = _run(tmp_path, rank1_steps=2)
    export_run(run, tmp_path / "pq", workers=1, model=None)
    coll = read_table(tmp_path / "pq" / "collectives.parquet").to_pylist()
    assert Counter((c["pg_name"], c["rank"], c["dtype"]) for c in coll) == {
        ("0", 0, "float32"): 2, ("0", 1, "float32"): 2, ("0", 2, "float32"): 2,
        ("pair", 0, "bfloat16"): 3, ("pair", 2, "bfloat16"): 3,
    }  # fmt: skip
