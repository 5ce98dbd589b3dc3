"""Training loops whose steps differ in shape: an evaluation pass every K steps (its metrics all_reduce,
no gradients), a varying number of micro-batches per step. Communication matches by (group, sequence
number) whatever the steps hold; where the ranks mark steps differently (an evaluation pass that only
some ranks mark as a step), a step number names different work on different ranks, and the loader says
so instead of letting the per-step tables compare them silently."""

from __future__ import annotations

from pathlib import Path

from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.store.validate import load_validated, validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

MS = 1_000_000
MIB = 1 << 20


def _train_eval_run(tmp_path: Path, *, eval_marked_on: tuple[int, ...]) -> Path:
    """Two ranks: a training step (forward, gradient all_reduce), an evaluation pass (forward, metrics
    all_reduce of 8 bytes), two training steps. A rank in ``eval_marked_on`` ends a step after the
    evaluation pass (as ``session.step()`` after it would); the others count it in the next training
    step (as ``skewlens profile``'s optimizer.step() marks do)."""
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        step = 0
        rb.step(step).compute("fwd", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS // 5)
        step += 1
        rb.step(step).compute("eval_fwd", dur_ns=2 * MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=8, dur_ns=MS // 10)
        if r in eval_marked_on:
            step += 1
        for _ in range(2):
            rb.step(step).compute("fwd", dur_ns=MS)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS // 5)
            step += 1
    return b.write(tmp_path / "run")


def test_collectives_in_different_steps_on_their_members_are_reported_as_steps_marked_differently(
    tmp_path: Path,
) -> None:
    run_dir = _train_eval_run(tmp_path, eval_marked_on=(0,))
    report = validate_run(run_dir)
    assert report.ok, [str(i) for i in report.errors]
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    # it ended '... and the replayed step times compare them': what to do was left to the reader
    assert warn.message == (
        "ranks mark steps differently: 2 collective instances were issued in different steps on different "
        "members (the first: group '0' seq 2, in steps 2 (rank 0), 1 (rank 1)): a step mark "
        "(optimizer.step() under skewlens profile, session.step() of the Python API) that some ranks made "
        "and others did not, such as one after an evaluation pass that only some ranks mark; a step number "
        "then names different work on different ranks, and the step breakdown, the blame and the replayed "
        "step times compare unlike work; mark the same steps on every rank"
    )
    run = load_validated(run_dir)  # still matched, and what analyze and replay print says it
    assert [(c.seq, c.ranks) for c in run.collectives] == [(s, (0, 1)) for s in range(4)]
    assert warn.message in run_notes(run)


def test_an_evaluation_pass_every_rank_marks_or_none_does_is_no_step_mismatch(tmp_path: Path) -> None:
    for marked in ((0, 1), ()):
        run_dir = _train_eval_run(tmp_path / f"m{len(marked)}", eval_marked_on=marked)
        report = validate_run(run_dir)
        assert report.ok and not [i for i in report.warnings if i.kind == "step-mismatch"], marked
        assert load_validated(run_dir).steps_differ == "", marked


def _shifted_run(tmp_path: Path, *, setup: bool) -> Path:
    """Two ranks, three steps of a gradient all_reduce; rank 0 marks an extra step first (compute only), so
    that every all_reduce is one step later on rank 0 than on rank 1, the first in steps 1 and 0. With
    ``setup``, both ranks first broadcast the parameters before any step mark (no step on either)."""
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        if setup:
            rb.collective(CommType.BROADCAST, comm_bytes=MIB, dur_ns=MS // 5, root=0)
        shift = 1 if r == 0 else 0
        if r == 0:
            rb.step(0).compute("warmup", dur_ns=MS)
        for s in range(3):
            rb.step(s + shift).compute("fwd", dur_ns=MS)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS // 5)
        if r == 1:
            rb.step(3).compute("eval_fwd", dur_ns=MS)
    return b.write(tmp_path / "run")


def test_a_collective_in_step_0_on_one_member_and_step_1_on_another_is_a_step_mismatch(
    tmp_path: Path,
) -> None:
    report = validate_run(_shifted_run(tmp_path, setup=False))
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "3 collective instances were issued in different steps" in warn.message
    assert "group '0' seq 0, in steps 1 (rank 0), 0 (rank 1)" in warn.message


def test_a_set_up_collective_before_every_ranks_first_step_is_no_step_mismatch(tmp_path: Path) -> None:
    # the broadcast is in no step on either member: only the three all_reduces were issued in different steps
    report = validate_run(_shifted_run(tmp_path, setup=True))
    assert report.ok, [str(i) for i in report.errors]
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "3 collective instances were issued in different steps" in warn.message
    assert "group '0' seq 1, in steps 1 (rank 0), 0 (rank 1)" in warn.message


def test_a_collective_whose_members_disagree_is_an_error_not_one_issued_in_different_steps(
    tmp_path: Path,
) -> None:
    # rank 0 marks an evaluation pass as a step, rank 1 does not; of the three all_reduces the second is an
    # all_gather on rank 1: its error names it, and the step mismatch counts only the third
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        rb.step(0).compute("fwd", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS)
        if r == 0:
            rb.step(1).compute("eval_fwd", dur_ns=MS)
        rb.step(2 if r == 0 else 1).compute("fwd", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE if r == 0 else CommType.ALL_GATHER, comm_bytes=MIB, dur_ns=MS)
        rb.step(3 if r == 0 else 2).compute("fwd", dur_ns=MS)
        rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS)
        if r == 1:
            rb.step(3).compute("eval_fwd", dur_ns=MS)
    report = validate_run(b.write(tmp_path / "run"))
    assert [(i.kind, "group '0' seq 1" in i.message) for i in report.errors] == [("collective-type", True)]
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "1 collective instance was issued in different steps" in warn.message
    assert "group '0' seq 2, in steps 3 (rank 0), 2 (rank 1)" in warn.message


def test_a_collective_in_no_step_on_one_member_and_in_step_0_on_another_is_a_step_mismatch(
    tmp_path: Path,
) -> None:
    # rank 1 marks a step before the parameters' broadcast, rank 0 after it: the broadcast is in step 0 on
    # rank 1 and in no step on rank 0, so rank 1's step 0 holds it (and its wait) and rank 0's does not;
    # only a step number on both members counted, and it went unsaid
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        if r == 1:
            rb.step(0).compute("warmup", dur_ns=MS)
        rb.collective(CommType.BROADCAST, comm_bytes=MIB, dur_ns=MS // 5, root=0)
        for s in range(2):
            rb.step(s).compute("fwd", dur_ns=MS)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS // 5)
    run_dir = b.write(tmp_path / "run")
    report = validate_run(run_dir)
    assert report.ok, [str(i) for i in report.errors]
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "1 collective instance was issued in different steps" in warn.message
    assert "(the first: group '0' seq 0, in no step (rank 0), step 0 (rank 1))" in warn.message
    assert load_validated(run_dir).steps_differ == warn.message


def _side_thread_run(tmp_path: Path, *, source: str, main_shift: bool = False) -> Path:
    """Two ranks, three steps on the main thread (stream 0): compute, the gradient all_reduce on group '0'
    (DDP's, on a communication stream the main thread issues it to), then each rank's checkpoint thread
    (stream 1, group '1', no dependency on the main thread) gathers what step 1 saved: on rank 0 it
    starts late in step 1, on rank 1 a little later, after rank 1 marked step 2. As ``bgtrain.py`` left
    it: the checkpoint thread's all_gather in step 5 on rank 0, step 4 on rank 1. ``main_shift``: rank 0
    also marks an evaluation pass of its own as a step, so that its last all_reduce is one step later."""
    b = RunBuilder(world_size=2, groups={"0": (0, 1), "1": (0, 1)})
    for r in (0, 1):
        rb = b.rank(r)
        t = 0
        for s in range(3):
            if main_shift and r == 0 and s == 2:
                rb.step(2).compute("eval_fwd", dur_ns=MS, start_ns=t)
                t += MS
            step = s + 1 if main_shift and r == 0 and s == 2 else s
            fwd = rb.step(step).compute("fwd", dur_ns=8 * MS, start_ns=t)
            rb.collective(
                CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS, start_ns=t + 6 * MS, stream=1000, deps=(fwd,)
            )
            rb.compute("opt", dur_ns=MS, start_ns=t + 8 * MS)
            t += 10 * MS
        # the checkpoint thread: at 19.5 ms (step 1) on rank 0, 20.5 ms (step 2) on rank 1
        rb.step(1 if r == 0 else 2).collective(
            CommType.ALL_GATHER,
            comm_bytes=MIB,
            dur_ns=MS,
            pg="1",
            start_ns=19 * MS + (r * 2 + 1) * MS // 2,
            stream=1,
        )
    return b.write(tmp_path / "run", source=source)


def test_a_side_threads_collective_on_either_side_of_a_step_boundary_is_an_info_not_steps_marked_differently(
    tmp_path: Path,
) -> None:
    # it was "ranks mark steps differently: 1 collective instance ... (the first: group '1' seq 0, in steps
    # 1 (rank 0), 2 (rank 1)) ...; mark the same steps on every rank", of step marks that were right
    run_dir = _side_thread_run(tmp_path, source="capture")
    report = validate_run(run_dir)
    assert report.ok, [str(i) for i in report.errors]
    assert [i.kind for i in report.warnings] == []
    (info,) = [i for i in report.issues if i.kind == "side-thread-steps"]
    assert info.message == (
        "1 collective instance that threads beside the steps issued (a thread with no control dependency on "
        "the one that marks steps, such as a metrics or checkpoint thread) was issued in different steps on "
        "different members (the first: group '1' seq 0, in steps 1 (rank 0), 2 (rank 1)): such a thread's "
        "call lands on either side of the main thread's step boundary, earlier on one rank than on another; "
        "the step marks are not at fault, and each rank's step holds the call where it made it"
    )
    assert load_validated(run_dir).steps_differ == ""


def test_where_the_thread_that_marks_steps_is_not_known_a_side_threads_collective_still_counts(
    tmp_path: Path,
) -> None:
    # an imported profile numbers threads as Kineto did: stream 0 is no thread in particular
    report = validate_run(_side_thread_run(tmp_path, source="import"))
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "1 collective instance was issued in different steps" in warn.message
    assert "(the first: group '1' seq 0, in steps 1 (rank 0), 2 (rank 1))" in warn.message
    assert not [i for i in report.issues if i.kind == "side-thread-steps"]


def test_the_main_threads_own_collectives_in_different_steps_are_still_steps_marked_differently(
    tmp_path: Path,
) -> None:
    # the all_reduce DDP issues from the main thread to a communication stream counts as the main thread's
    report = validate_run(_side_thread_run(tmp_path, source="capture", main_shift=True))
    (warn,) = [i for i in report.warnings if i.kind == "step-mismatch"]
    assert "1 collective instance was issued in different steps" in warn.message
    assert "(the first: group '0' seq 2, in steps 3 (rank 0), 2 (rank 1))" in warn.message
    assert len([i for i in report.issues if i.kind == "side-thread-steps"]) == 1


def _tied_side_run(
    tmp_path: Path, *, side_on: tuple[int, int] = (1, 1), tie: str = "", agreed: bool = False
) -> Path:
    """:func:`_side_thread_run` (a capture's), its checkpoint all_gather on each rank r on stream
    ``side_on[r]`` (0: the main thread itself issued it); ``tie``: ``data``, the all_gather reads what the
    main thread's last forward wrote (a data dependency), ``waited``, the main thread's last optimizer
    step waits for it (a control dependency from its stream to the main thread's); ``agreed``: each
    checkpoint thread first gathers once more in step 0 on both ranks."""
    from dataclasses import replace

    b = RunBuilder(world_size=2, groups={"0": (0, 1), "1": (0, 1)})
    for r in (0, 1):
        rb = b.rank(r)
        if agreed:
            rb.step(0).collective(
                CommType.ALL_GATHER, comm_bytes=MIB, dur_ns=MS // 2, pg="1", start_ns=MS, stream=side_on[r]
            )
        t = 0
        fwd = opt = -1
        for s in range(3):
            fwd = rb.step(s).compute("fwd", dur_ns=8 * MS, start_ns=t)
            rb.collective(
                CommType.ALL_REDUCE, comm_bytes=MIB, dur_ns=MS, start_ns=t + 6 * MS, stream=1000, deps=(fwd,)
            )
            opt = rb.compute("opt", dur_ns=MS, start_ns=t + 8 * MS)
            t += 10 * MS
        gather = rb.step(1 if r == 0 else 2).collective(
            CommType.ALL_GATHER,
            comm_bytes=MIB,
            dur_ns=MS,
            pg="1",
            start_ns=29 * MS + r * MS // 2 if side_on[r] == 0 else 19 * MS + (r * 2 + 1) * MS // 2,
            stream=side_on[r],
        )
        at = {n.node_id: k for k, n in enumerate(rb.nodes)}
        if tie == "data":
            rb.nodes[at[gather]] = replace(rb.nodes[at[gather]], data_deps=(fwd,))
        elif tie == "waited":
            last = rb.nodes[at[opt]]
            rb.nodes[at[opt]] = replace(last, ctrl_deps=(*last.ctrl_deps, gather))
    return b.write(tmp_path / "run", source="capture")


def _side_kinds(run: Path) -> tuple[list[str], list[str]]:
    report = validate_run(run)
    assert report.ok, [str(i) for i in report.errors]
    return [i.kind for i in report.warnings], [i.kind for i in report.issues if i.kind == "side-thread-steps"]


def test_a_real_replays_trace_tells_a_side_threads_collective_from_step_marks_as_a_capture_does(
    tmp_path: Path,
) -> None:
    # the replay is captured by the same session: its thread that marks steps is stream 0 too
    assert _side_kinds(_side_thread_run(tmp_path, source="replay")) == ([], ["side-thread-steps"])


def test_a_side_thread_that_reads_what_the_main_thread_wrote_still_runs_beside_the_steps(
    tmp_path: Path,
) -> None:
    # a data dependency orders a tensor, not the thread: only control dependencies tie a thread to the steps
    assert _side_kinds(_tied_side_run(tmp_path, tie="data")) == ([], ["side-thread-steps"])


def test_a_thread_the_main_thread_waits_for_is_tied_to_the_steps_and_its_collectives_count(
    tmp_path: Path,
) -> None:
    # the dependency runs from its stream to the main thread's: tied all the same, so steps marked differently
    assert _side_kinds(_tied_side_run(tmp_path, tie="waited")) == (["step-mismatch"], [])


def test_a_collective_one_member_issued_from_its_main_thread_counts_as_steps_marked_differently(
    tmp_path: Path,
) -> None:
    # rank 0's checkpoint thread issued it in step 1, rank 1's main thread in step 2: not beside the steps on
    # every member, so it says something of the step marks
    assert _side_kinds(_tied_side_run(tmp_path, side_on=(1, 0))) == (["step-mismatch"], [])


def test_the_side_thread_info_counts_only_the_collectives_issued_in_different_steps(tmp_path: Path) -> None:
    # the checkpoint threads gathered once in step 0 on both ranks too: that instance agrees, uncounted
    run = _tied_side_run(tmp_path, agreed=True)
    report = validate_run(run)
    (info,) = [i for i in report.issues if i.kind == "side-thread-steps"]
    assert info.message.startswith("1 collective instance that threads beside the steps issued")
    assert "(the first: group '1' seq 1, in steps 1 (rank 0), 2 (rank 1))" in info.message


def test_a_side_threads_collective_is_still_told_apart_when_the_manifest_leaves_lost_collectives_out(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from skewlens.profiler.manifest import LostCollectives, read_manifest, write_manifest

    run = _side_thread_run(tmp_path, source="capture")
    lost = LostCollectives(pg_name="0", first_seq=0, last_seq=0, steps=(0,), ranks=(1,))
    write_manifest(run, replace(read_manifest(run), lost_collectives=(lost,)))
    assert _side_kinds(run) == ([], ["side-thread-steps"])


def test_export_tells_a_side_threads_collective_from_step_marks_as_check_does(tmp_path: Path) -> None:
    from skewlens.profiler.store.parquet import export_run

    summary = export_run(_side_thread_run(tmp_path, source="capture"), tmp_path / "pq", workers=1)
    kinds = [i.kind for i in summary.issues]
    assert "side-thread-steps" in kinds and "step-mismatch" not in kinds
