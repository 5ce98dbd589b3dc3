"""A command that torchrun restarts (``--max-restarts``) saves every attempt into one run directory: the run
is the last attempt's ranks, and a trace an earlier attempt left is named and left out, not mixed in."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from capture_helpers import profile
from test_capture_hosts import save_rank as save_host_rank

from skewlens.profiler.capture.run import finalize_run, unsaved_traces
from skewlens.profiler.capture.session import part_file
from skewlens.profiler.manifest import StepWindow, read_manifest
from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import Level

WINDOW = StepWindow(wait=1, warmup=1, active=3)
S = 1_000_000_000


def save_rank(
    run: Path, rank: int, *, world: int, began_s: int, steps: tuple[int, ...] = (2, 3, 4), attempt: int = 0
) -> None:
    """What a rank of torchrun's ``attempt`` that began at ``began_s`` leaves when it saves ``steps``, a
    second each."""
    save_host_rank(run, rank, "a", world=world, per_host=world)
    part = json.loads(part_file(run, rank).read_text())
    part.update(
        steps=[{"step": s, "start_ns": (began_s + s) * S, "end_ns": (began_s + s + 1) * S} for s in steps],
        partial=len(steps) < WINDOW.active,
        run_identity={
            "run_id": "job",
            "rendezvous": "localhost:29500",
            "started_ns": began_s * S + rank,
            "restart_count": attempt,
        },
    )
    part_file(run, rank).write_text(json.dumps(part))


def shrunk(run: Path) -> Path:
    """An elastic job (``--nnodes 1:2``) that ran on 4 ranks from 100 s, lost a host, and ran its last attempt
    on 2 from 130 s: the traces of ranks 2 and 3 are the first attempt's."""
    for r in range(4):
        save_rank(run, r, world=4, began_s=100)
    for r in range(2):
        save_rank(run, r, world=2, began_s=130)
    finalize_run(run, level=Level.COLLECTIVES, window=WINDOW)
    return run


def test_a_rank_whose_last_attempt_saved_nothing_is_missing_not_its_earlier_attempts_trace(
    tmp_path: Path,
) -> None:
    # attempt 0 failed in step 3 (both ranks saved step 2); torchrun restarted them 15 s later, and attempt
    # 1's rank 1 was killed in step 4 (os._exit: no save) while rank 0 saved steps 2-3. The manifest listed
    # both ranks, rank 1's trace attempt 0's, and check's answer read rank 0 of one attempt against rank 1
    # of the other ('step 3 did not finish: rank 1 did not arrive at broadcast 0#10 ... rank 1's last:
    # all_reduce 0#7'), where attempt 1 had stopped in step 4
    save_rank(tmp_path, 0, world=2, began_s=100, steps=(2,))
    save_rank(tmp_path, 1, world=2, began_s=100, steps=(2,))
    save_rank(tmp_path, 0, world=2, began_s=118, steps=(2, 3), attempt=1)
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW, exit_code=1)
    m = read_manifest(tmp_path)
    assert (m.ranks, m.missing_ranks) == ((0,), (1,))
    assert {s.rank for s in m.steps} == {0} and [s.start_ns for s in m.steps] == [120 * S, 121 * S]
    note = m.notes["rank 1"]
    assert "no trace from the command's last attempt" in note
    assert "rank-1.et is an earlier attempt's" in note and "ended 15.0 s before" in note


def test_ranks_of_an_earlier_attempt_beyond_the_last_attempts_world_are_left_out(tmp_path: Path) -> None:
    # the manifest listed ranks 0-3 in a world of 2, and writing it failed: 'manifest.json: ranks[2]: rank 2
    # is outside world size 2' (no manifest, the capture lost)
    m = read_manifest(shrunk(tmp_path))
    assert (m.world_size, m.ranks, m.missing_ranks) == (2, (0, 1), ())
    assert {s.rank for s in m.steps} == {0, 1} and min(s.start_ns for s in m.steps) == 132 * S
    assert "ranks 2-3" in m.notes["earlier attempt"] and "rank-2.et, rank-3.et" in m.notes["earlier attempt"]


def test_the_note_of_four_earlier_attempt_ranks_names_all_four_files_and_no_more(tmp_path: Path) -> None:
    # a job of 8 ranks whose last attempt ran on 4: ranks 4-7's traces are the first attempt's, all named
    for r in range(8):
        save_rank(tmp_path, r, world=8, began_s=100)
    for r in range(4):
        save_rank(tmp_path, r, world=4, began_s=130)
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW)
    note = read_manifest(tmp_path).notes["earlier attempt"]
    assert note.startswith("ranks 4-7: left out of the run (rank-4.et, rank-5.et, rank-6.et, rank-7.et): ")
    assert "of 8 ranks" in note and note.endswith("the last attempt ran on 4 ranks")  # it read 'ran on 4'


def test_a_rank_of_the_same_attempt_and_world_is_kept_however_far_its_clock_is(tmp_path: Path) -> None:
    # one attempt on 2 hosts whose clock offset was unknown (0 assumed), rank 0's host 30 s ahead: rank 1's
    # steps end before rank 0 began on these clocks, and yet it is the same attempt of the same world
    save_rank(tmp_path, 0, world=2, began_s=130)
    save_rank(tmp_path, 1, world=2, began_s=100)
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW)
    m = read_manifest(tmp_path)
    assert (m.ranks, m.missing_ranks) == ((0, 1), ()) and "rank 1" not in m.notes


def test_check_warns_of_the_earlier_attempts_ranks_left_out(tmp_path: Path) -> None:
    said = [i.message for i in validate_run(shrunk(tmp_path)).warnings if i.kind == "capture-note"]
    assert said == [
        (
            "ranks 2-3: left out of the run (rank-2.et, rank-3.et): an earlier attempt's, of 4 ranks "
            "(torchrun restarted the command: its steps ended 25.0 s before the last attempt's ranks began); "
            "the last attempt ran on 2 ranks"
        )
    ]
    assert said[0] in run_notes(load_run(tmp_path))  # analyze's and replay's warnings


#: Two gloo ranks for 8 steps; in attempt 0 rank 1 raises in step 3 (after its all_reduce), in attempt 1 it
#: is killed in step 4 (``os._exit``: nothing saved).
RESTARTED = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    w = torch.ones(64)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for step in range(8):
        dist.all_reduce(w)
        if rank == 1 and (attempt, step) == (0, 3):
            raise RuntimeError("attempt 0 fails")
        if rank == 1 and (attempt, step) == (1, 4):
            os._exit(7)
        dist.broadcast(w, 0)
        opt.step()
    """
)


@pytest.mark.slow
def test_a_restarted_command_whose_rank_died_unsaved_is_reported_from_its_last_attempt_alone(
    tmp_path: Path,
) -> None:
    # the manifest held rank 0 of attempt 1 and rank 1 of attempt 0, and profile said 'step 3 did not
    # finish: rank 1 did not arrive at broadcast 0#10 (...; rank 1's last: all_reduce 0#7 ...)': numbers
    # of two attempts, of a step attempt 1 had finished
    script = tmp_path / "train.py"
    script.write_text(RESTARTED)
    run = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = profile(
        run,
        steps="1:1:5",
        # torchrun looks at its workers every 3 s, not its default 0.1 s. At 0.1 s it sent rank 0, in step
        # 4's broadcast when rank 1 exited, SIGTERM (exit -15), and rank 0 of attempt 1 sometimes saved
        # nothing, leaving attempt 0's traces as the run: 1 of 12 runs at 670366d, 3 of 14 at 32cad57; 0 of
        # 8 with 3 s, which gives rank 0 time to see its broadcast fail and stop on its own
        command=[*torchrun, "--max-restarts=1", "--monitor-interval=3", str(script)],
        # a store of its own per attempt: torch 2.13's gloo, restarted on the agent's store, read attempt 0's
        # addresses in 3 of 4 runs without skewlens (connectFullMesh failed: pytorch#135712)
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    m = read_manifest(run)
    assert (m.ranks, m.missing_ranks) == ((0,), (1,))
    assert sorted(s.step for s in m.steps) == [2, 3]  # attempt 1's rank 0: steps 2-3 saved, stopped in 4
    assert "rank-1.et is an earlier attempt's" in m.notes["rank 1"]
    assert "step 4 did not finish: rank 0 in broadcast 0#" in done.stderr
    assert "rank 1 saved no trace" in done.stderr


def test_the_last_attempts_merge_replaces_a_manifest_another_host_merged_from_an_earlier_attempt(
    tmp_path: Path,
) -> None:
    # an elastic job on 2 hosts x 2 ranks: host B left after attempt 0 and its skewlens profile merged ranks
    # 0-3; host A's ranks ran attempt 1 on 2 ranks, replaced rank-0.et and rank-1.et, and A's merge, finding
    # no rank the manifest lacked, kept it ('already merged by another host'): attempt 0's steps and offsets
    # over attempt 1's traces
    for r in range(4):
        save_rank(tmp_path, r, world=4, began_s=100)
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW)  # host B: every rank, part files removed
    for r in range(2):
        save_rank(tmp_path, r, world=2, began_s=130)
    assert finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW) is not None  # host A
    m = read_manifest(tmp_path)
    assert (m.world_size, m.ranks) == (2, (0, 1)) and min(s.start_ns for s in m.steps) == 132 * S


def test_the_last_attempts_merge_replaces_an_earlier_attempts_manifest_of_the_same_world(
    tmp_path: Path,
) -> None:
    # host B merged attempt 0's 4 ranks and left; attempt 1 ran on 4 ranks again (host A's, counting restart
    # 1, and a fresh host C's, counting 0) and replaced every rank-<r>.et. A's merge kept attempt 0's
    # manifest: the rule asked for a world of another size, so steps from 102 s stood over traces of 132 s
    for r in range(4):
        save_rank(tmp_path, r, world=4, began_s=100)
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW)  # host B
    for r in range(4):
        save_rank(tmp_path, r, world=4, began_s=130, attempt=1 if r < 2 else 0)
    assert finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW) is not None  # host A
    m = read_manifest(tmp_path)
    assert (m.world_size, m.ranks) == (4, (0, 1, 2, 3))
    assert sorted({s.start_ns for s in m.steps}) == [132 * S, 133 * S, 134 * S]


def test_a_host_of_the_same_attempt_keeps_the_manifest_another_host_merged(tmp_path: Path) -> None:
    # host B merged while host A's ranks were still saving (its part files kept); A's ranks then saved
    # nothing new, and A's merge of the same steps says 'already merged' (None), whatever its clock
    for r in range(2):
        save_rank(tmp_path, r, world=4, began_s=100)
    first = finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW)
    assert first is not None and first.ranks == (0, 1)
    assert finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW) is None
    assert read_manifest(tmp_path) == first


def unsaved(run: Path, rank: int, *, world: int, started_ns: int, attempt: int) -> None:
    """What a rank of torchrun's ``attempt`` whose capture began at ``started_ns`` leaves when its save
    fails: a part file saying why (``not_saved``), no trace."""
    save_rank(run, rank, world=world, began_s=0, attempt=attempt)
    (run / f"rank-{rank}.et").unlink()
    part = json.loads(part_file(run, rank).read_text())
    part["run_identity"]["started_ns"] = started_ns
    part_file(run, rank).write_text(json.dumps({**part, "not_saved": "disk full"}))


@pytest.mark.parametrize(
    ("world", "attempt", "began", "stale"),
    [
        (2, 1, 129 * S, False),  # this attempt's rank, begun a second before rank 0: its own failure
        (2, 0, 131 * S, False),  # another count, begun after: not before the last attempt's ranks
        (2, 0, 130 * S, False),  # begun as the last attempt's began: not before it
        (2, 0, 110 * S, True),  # attempt 0's, begun 20 s before
        (4, 1, 110 * S, True),  # the same count on 4 ranks: another world's
    ],
)
def test_a_failed_save_is_an_earlier_attempts_only_of_another_attempt_or_world_begun_before_the_last(
    tmp_path: Path, world: int, attempt: int, began: int, stale: bool
) -> None:
    save_rank(tmp_path, 0, world=2, began_s=130, attempt=1)  # rank 0's capture began at 130 s
    unsaved(tmp_path, 1, world=world, started_ns=began, attempt=attempt)
    assert unsaved_traces(tmp_path) == ({} if stale else {1: "disk full"})
    finalize_run(tmp_path, level=Level.COLLECTIVES, window=WINDOW, exit_code=1)
    note = read_manifest(tmp_path).notes["rank 1"]
    if stale:
        said = (
            "its part file is an earlier attempt's (torchrun restarted the command: its capture began 20.0 s "
        )
        assert said in note, note
        assert note.endswith("whose save failed: disk full"), note
    else:
        assert note == "trace not saved: disk full"


def test_a_failed_save_is_judged_against_the_rank_that_began_last_whatever_its_number(tmp_path: Path) -> None:
    # attempt 0 on 3 ranks from 100 s, rank 2's save failed; attempt 1 from 130 s: rank 1 saved, ranks 0 and 2
    # were killed first (rank 0's trace is attempt 0's). Rank 2's reason is attempt 0's, not rank 0's peer's
    save_rank(tmp_path, 0, world=3, began_s=100)
    unsaved(tmp_path, 2, world=3, started_ns=100 * S, attempt=0)
    save_rank(tmp_path, 1, world=3, began_s=130, attempt=1)
    assert unsaved_traces(tmp_path) == {}
