"""Where a job hung or failed inside a step: the ranks' stop records (``manifest.stopped``) read across
ranks as which rank did not arrive at which collective (``skewlens check``, analyze's and replay's notes)."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from skewlens.profiler.capture.flight import FrEntry, stop_record
from skewlens.profiler.capture.records import CommRecord
from skewlens.profiler.errors import ManifestError
from skewlens.profiler.manifest import (
    PARTIAL_TRACE_NOTE,
    CallAt,
    ProcessGroupInfo,
    RankStop,
    read_manifest,
    write_manifest,
)
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import run_notes, stop_answer
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType, NodeType

MS = 1_000_000
T0 = 1_000_000_000_000


Call = tuple[str, int, int] | tuple[str, int, int, str]

#: The bytes of each type's calls (others 1 KiB): 2 KiB broadcasts, 16 KiB all_reduces.
SIZES = {"broadcast": 2048, "all_reduce": 16384}


def _stop(rank: int, last: Call | None, *flying: Call) -> RankStop:
    """Rank ``rank`` stopped in step 3 (begun at T0): its last call ``(type, seq, ms)`` and the ones in
    flight, on group 0 (or the group after them: ``(type, seq, ms, group)``), of :data:`SIZES`."""

    def at(c: Call) -> CallAt:
        return CallAt(
            type=c[0], pg_name=(*c, "0")[3], seq=c[1], size_bytes=SIZES.get(c[0], 1024), at_ns=T0 + c[2] * MS
        )

    return RankStop(
        rank=rank,
        step=3,
        step_start_ns=T0,
        saved_ns=T0 + 10_000 * MS,
        last=at(last) if last else None,
        in_flight=tuple(map(at, flying)),
    )


def _run(tmp_path: Path, *stops: RankStop, missing: tuple[int, ...] = (), world: int = 2) -> Path:
    b = RunBuilder(world)
    for r in range(world):
        b.rank(r).step(2).collective(CommType.ALL_REDUCE, 4096, 100)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    write_manifest(
        run, replace(m, stopped=stops, missing_ranks=missing, ranks=tuple(set(m.ranks) - set(missing)))
    )
    return run


def test_the_rank_that_did_not_arrive_is_named_with_the_collective_its_peer_waits_in(tmp_path: Path) -> None:
    # rank 1 slept after step 3's all_reduce (0#10); rank 0 went on into the broadcast (0#11) and waited
    run = _run(
        tmp_path, _stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), _stop(1, ("all_reduce", 10, 2))
    )
    said = (
        "step 3 did not finish: rank 1 did not arrive at broadcast 0#11 of 2 KiB (rank 0 in it since +3.0 "
        "ms, 10.0 s before it saved; rank 1's last: all_reduce 0#10, returned at +2.0 ms) (times from the "
        "start of the step on each rank)"
    )
    assert stop_answer(read_manifest(run)) == said
    report = validate_run(run)
    (w,) = [i for i in report.warnings if i.kind == "unfinished-step"]
    assert (w.message, report.ok) == (said, True)  # a warning: the completed steps are still good
    assert run_notes(load_run(run)).count(said) == 1  # analyze and replay: one line, not one per rank


def test_a_last_call_that_returned_before_the_step_began_is_said_before_it(tmp_path: Path) -> None:
    # rank 1's last call was step 2's (DDP's bucket all_reduces, which only the recorder sees, came after)
    run = _run(
        tmp_path, _stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), _stop(1, ("all_reduce", 9, -3))
    )
    answer = stop_answer(read_manifest(run))
    assert answer is not None and "rank 1's last: all_reduce 0#9, returned at -3.0 ms)" in answer, answer


def test_a_rank_that_did_not_arrive_because_its_program_raised_is_said_with_the_exception(
    tmp_path: Path,
) -> None:
    # rank 1 raised after step 3's all_reduce; rank 0, waiting in the broadcast, raised gloo's timeout: only
    # the laggard's exception says why. Before: nothing said rank 1 had raised (read back from the JSON)
    raised = "RuntimeError: bad batch on rank 1"
    timeout = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    run = _run(
        tmp_path,
        replace(_stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), raised=timeout),
        replace(_stop(1, ("all_reduce", 10, 2)), raised=raised),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 did not arrive at broadcast 0#11 of 2 KiB (rank 0 in it since +3.0 "
        "ms, 10.0 s before it saved; rank 1's last: all_reduce 0#10, returned at +2.0 ms, then its program "
        "raised RuntimeError: bad batch on rank 1) (times from the start of the step on each rank)"
    )


def test_a_rank_that_saved_no_trace_is_said_beside_the_collective_the_others_wait_in(tmp_path: Path) -> None:
    run = _run(tmp_path, _stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), missing=(1,))
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 0 in broadcast 0#11 of 2 KiB since +3.0 ms; rank 1 saved no trace "
        "(times from the start of the step on each rank)"
    )


def test_ranks_that_issued_different_collectives_under_one_number_are_named(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        _stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)),
        _stop(1, ("all_reduce", 10, 2), ("all_reduce", 11, 3)),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks issued different collectives as 0#11: rank 0 broadcast of 2 KiB, rank "
        "1 all_reduce of 16 KiB"  # no times said: before, it ended '(times from the start of the step ...)'
    )


def _sized_in(stop: RankStop, size_bytes: int) -> RankStop:
    """``stop`` with its calls in flight of ``size_bytes``."""
    return replace(stop, in_flight=tuple(replace(c, size_bytes=size_bytes) for c in stop.in_flight))


def test_a_member_that_issued_another_size_under_one_number_is_named_beside_the_others(
    tmp_path: Path,
) -> None:
    # measured, 4 gloo ranks: rank 2's all_reduce had 16 KiB where the others' had 8 KiB; gloo aborted rank 1
    # (its ring neighbour: "Received data size doesn't match expected size"). Before: 'rank 0 in all_reduce
    # 0#10 of 8 KiB since +0.7 ms; rank 1 saved no trace', two ranks named that did nothing wrong
    stops = [_sized_in(_stop(r, ("broadcast", 9, -1), ("all_reduce", 10, 1)), 8192) for r in (0, 3)]
    stops.append(_sized_in(_stop(2, ("broadcast", 9, -1), ("all_reduce", 10, 1)), 16384))
    run = _run(tmp_path, *stops, missing=(1,), world=4)
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks issued different collectives as 0#10: ranks 0, 3 all_reduce of 8 KiB, "
        "rank 2 all_reduce of 16 KiB; rank 1 saved no trace"
    )


def test_sizes_that_round_alike_are_said_in_bytes(tmp_path: Path) -> None:
    stops = (
        _sized_in(_stop(0, None, ("all_reduce", 10, 1)), 8192),
        _sized_in(_stop(1, None, ("all_reduce", 10, 1)), 8200),
    )
    answer = stop_answer(read_manifest(_run(tmp_path, *stops)))
    said = "as 0#10: rank 0 all_reduce of 8,192 B, rank 1 all_reduce of 8,200 B"
    assert answer is not None and said in answer, answer


def test_members_of_an_all_to_all_with_different_sizes_are_not_said_to_disagree(tmp_path: Path) -> None:
    # uneven splits: an all_to_all's members legitimately send different amounts
    stops = (
        _sized_in(_stop(0, None, ("all_to_all", 10, 1)), 8192),
        _sized_in(_stop(1, None, ("all_to_all", 10, 2)), 4096),
    )
    assert stop_answer(read_manifest(_run(tmp_path, *stops))) == (
        "step 3 did not finish: ranks 0-1 in all_to_all 0#10 of 8 KiB since +1.0 ms to +2.0 ms (times from "
        "the start of the step on each rank)"
    )


def test_every_member_in_the_call_is_named_beside_a_rank_that_saved_no_trace(tmp_path: Path) -> None:
    # measured, 4 gloo ranks, rank 2 killed (SIGKILL) after step 3's first all_reduce; the others waited in
    # the second. Before: 'rank 0 in all_reduce 0#11 ...; rank 2 saved no trace', as if rank 0 alone waited
    stops = [_stop(r, ("all_reduce", 10, 1), ("all_reduce", 11, 3 + r)) for r in (0, 1, 3)]
    run = _run(tmp_path, *stops, missing=(2,), world=4)
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks 0-1, 3 in all_reduce 0#11 of 16 KiB since +3.0 ms to +6.0 ms; rank 2 "
        "saved no trace (times from the start of the step on each rank)"
    )


def test_the_members_waiting_for_a_rank_that_did_not_arrive_are_said_in_one_clause(tmp_path: Path) -> None:
    # measured, 4 gloo ranks, rank 2 in its data loader past a 10 s timeout. Before: one clause a member,
    # 'rank 0 in it since +0.6 ms, 10.0 s before it saved, rank 1 in it since ...' (63 of them at 64 ranks)
    stops = [_stop(r, ("broadcast", 9, -1), ("all_reduce", 10, 1)) for r in (0, 1, 3)]
    run = _run(tmp_path, *stops, _stop(2, ("broadcast", 9, -1)), world=4)
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 2 did not arrive at all_reduce 0#10 of 16 KiB (ranks 0-1, 3 in it since "
        "+1.0 ms, 10.0 s before they saved; rank 2's last: broadcast 0#9, returned at -1.0 ms) (times from "
        "the start of the step on each rank)"
    )


def test_ranks_that_did_not_arrive_after_the_same_last_call_are_said_together(tmp_path: Path) -> None:
    # a host's ranks (2 and 3) stuck reading data; the other host's in step 3's first all_reduce. Before:
    # "rank 2's last: broadcast 0#9, returned at -1.0 ms; rank 3's last: broadcast 0#9, returned at -2.0 ms"
    stops = [_stop(r, ("broadcast", 9, -1), ("all_reduce", 10, 1)) for r in (0, 1)]
    run = _run(tmp_path, *stops, _stop(2, ("broadcast", 9, -1)), _stop(3, ("broadcast", 9, -2)), world=4)
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks 2-3 did not arrive at all_reduce 0#10 of 16 KiB (ranks 0-1 in it since "
        "+1.0 ms, 10.0 s before they saved; last of ranks 2-3: broadcast 0#9, returned at -2.0 ms to -1.0 "
        "ms) (times from the start of the step on each rank)"
    )


def test_members_in_a_call_that_saved_at_different_times_are_said_with_the_span_of_their_waits(
    tmp_path: Path,
) -> None:
    # ranks 0 and 1 in step 3's all_reduce from +1 ms, rank 1 saved 200 ms before rank 0: one clause gives
    # both waits, not the last member's alone
    stops = [_stop(0, ("broadcast", 9, -1), ("all_reduce", 10, 1))]
    stops.append(replace(_stop(1, ("broadcast", 9, -1), ("all_reduce", 10, 1)), saved_ns=T0 + 9_800 * MS))
    run = _run(tmp_path, *stops, _stop(2, ("broadcast", 9, -1)), world=3)
    waited = f"{(9_800 - 1) / 1e3:.1f} to {(10_000 - 1) / 1e3:.1f} s"  # each from +1 ms to its own save
    assert f"(ranks 0-1 in it since +1.0 ms, {waited} before they saved; " in stop_answer(read_manifest(run))


def test_laggards_that_raised_alike_are_said_with_their_programs(tmp_path: Path) -> None:
    raised = "RuntimeError: bad batch"
    stops = [_stop(r, ("broadcast", 9, -1), ("all_reduce", 10, 1)) for r in (0, 1)]
    late = [replace(_stop(r, ("broadcast", 9, -1)), raised=raised) for r in (2, 3)]
    run = _run(tmp_path, *stops, *late, world=4)
    assert (
        f"last of ranks 2-3: broadcast 0#9, returned at -1.0 ms, then their programs raised {raised}) "
        in stop_answer(read_manifest(run))
    )


def test_ranks_that_issued_the_same_collective_under_a_disputed_number_are_said_together(
    tmp_path: Path,
) -> None:
    # measured, 4 gloo ranks, rank 2 skipped step 3's second all_reduce and issued the broadcast after it
    stops = [_stop(r, ("all_reduce", 10, 1), ("all_reduce", 11, 2)) for r in (0, 1, 3)]
    run = _run(tmp_path, *stops, _stop(2, ("all_reduce", 10, 1), ("broadcast", 11, 2)), world=4)
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks issued different collectives as 0#11: ranks 0-1, 3 all_reduce of 16 "
        "KiB, rank 2 broadcast of 2 KiB"
    )


def test_no_answer_where_no_rank_was_in_a_call(tmp_path: Path) -> None:
    run = _run(tmp_path, _stop(0, ("all_reduce", 10, 2)), _stop(1, ("all_reduce", 10, 2)))
    assert stop_answer(read_manifest(run)) is None
    assert not [i for i in validate_run(run).warnings if i.kind == "unfinished-step"]


def test_a_rank_that_ran_out_of_batches_is_not_said_to_be_in_a_call_its_peers_went_on_past(
    tmp_path: Path,
) -> None:
    # DDP under Join: rank 1 ran out of batches, shadowed rank 0's steps (no optimizer step: one unfinished
    # step) and exited after the broadcast that syncs the final model; gloo's recorder marks none completed.
    # Rank 0 saved its whole window. Before: 'step 3 did not finish: rank 1 in broadcast 0#47 since +67.0 ms'
    run = _run(tmp_path, _stop(1, ("all_reduce", 44, 60), ("all_reduce", 45, 61), ("broadcast", 47, 67)))
    assert stop_answer(read_manifest(run)) is None
    assert not [i for i in validate_run(run).warnings if i.kind == "unfinished-step"]
    # where rank 0 saved no trace either, nothing says rank 1 went on: it is said in the call, as before
    alone = _run(tmp_path / "alone", _stop(1, ("all_reduce", 44, 60), ("broadcast", 47, 67)), missing=(0,))
    assert stop_answer(read_manifest(alone)) == (
        "step 3 did not finish: rank 1 in broadcast 0#47 of 2 KiB since +67.0 ms; rank 0 saved no trace "
        "(times from the start of the step on each rank)"
    )


def _mesh(tmp_path: Path, *stops: RankStop) -> Path:
    """4 ranks, tp groups '1' {0,1} and '2' {2,3}, dp groups '3' {0,2} and '4' {1,3} (a 2 x 2 mesh)."""
    b = RunBuilder(4)
    for r in range(4):
        b.rank(r).step(2).collective(CommType.ALL_REDUCE, 4096, 100)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    named = (("0", (0, 1, 2, 3)), ("1", (0, 1)), ("2", (2, 3)), ("3", (0, 2)), ("4", (1, 3)))
    groups = tuple(ProcessGroupInfo(name=n, ranks=rs) for n, rs in named)
    write_manifest(run, replace(m, stopped=stops, process_groups=groups))
    return run


def test_a_rank_blocked_in_another_groups_collective_is_not_named_as_the_one_that_did_not_arrive(
    tmp_path: Path,
) -> None:
    # each step: dp all_reduce, 3 tp all_reduces, dp all_reduce; rank 1 slept before step 3's third tp one
    # (1#12): rank 0 waited in it, rank 3 in dp 4#8 (for rank 1), rank 2 in dp 3#8 (for rank 0, blocked)
    run = _mesh(
        tmp_path,
        _stop(0, ("all_reduce", 11, 2, "1"), ("all_reduce", 12, 3, "1")),
        _stop(1, ("all_reduce", 11, 2, "1")),
        _stop(2, ("all_reduce", 12, 2, "2"), ("all_reduce", 8, 3, "3")),
        _stop(3, ("all_reduce", 12, 2, "2"), ("all_reduce", 8, 3, "4")),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 did not arrive at all_reduce 4#8 of 16 KiB (rank 3 in it since +3.0 "
        "ms, 10.0 s before it saved; rank 1's last: all_reduce 1#11, returned at +2.0 ms) (times from the "
        "start of the step on each rank)"
    )


def test_ranks_each_waiting_for_the_other_in_two_groups_are_said_with_both_calls(tmp_path: Path) -> None:
    # 2 ranks, the world (0) and a second group (1) of both: in step 3 rank 0 called the world's all_reduce
    # first, rank 1 group 1's; each waits for the other: the first by number is said, with where its
    # laggard waits
    run = _run(
        tmp_path,
        _stop(0, ("all_reduce", 3, -1, "1"), ("all_reduce", 4, 1)),
        _stop(1, ("all_reduce", 3, -1, "1"), ("all_reduce", 4, 2, "1")),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 did not arrive at all_reduce 0#4 of 16 KiB (rank 0 in it since +1.0 "
        "ms, 10.0 s before it saved; rank 1's last: all_reduce 1#3, returned at -1.0 ms, waiting in "
        "all_reduce 1#4 since +2.0 ms) (times from the start of the step on each rank)"
    )


def _said(tmp_path: Path, *stops: RankStop) -> str | None:
    return stop_answer(read_manifest(_run(tmp_path, *stops)))


def test_a_rank_whose_last_returned_call_is_past_a_peers_call_in_flight_is_not_said_to_have_missed_it(
    tmp_path: Path,
) -> None:
    # rank 0's asynchronous all_reduce 0#11 was never waited on; both ranks returned from 0#12 after it
    assert _said(
        tmp_path, _stop(0, ("all_reduce", 12, 5), ("all_reduce", 11, 1)), _stop(1, ("all_reduce", 12, 5))
    ) == (
        "step 3 did not finish: rank 0 in all_reduce 0#11 of 16 KiB since +1.0 ms (times from the start of "
        "the step on each rank)"
    )


def test_a_rank_that_returned_from_a_call_a_peer_is_still_in_is_not_said_to_have_missed_it(
    tmp_path: Path,
) -> None:
    # rank 0, the source, returned from broadcast 0#12 with its asynchronous all_reduce 0#11 still in flight;
    # rank 1 is still in 0#12: rank 0 issued it (the highest number it issued, not its last in flight)
    assert _said(
        tmp_path,
        _stop(0, ("broadcast", 12, 5), ("all_reduce", 11, 1)),
        _stop(1, ("all_reduce", 11, 1), ("broadcast", 12, 6)),
    ) == (
        "step 3 did not finish: rank 0 in all_reduce 0#11 of 16 KiB since +1.0 ms (times from the start of "
        "the step on each rank)"
    )


def test_a_rank_blocked_in_a_recv_is_said_in_it_on_its_group(tmp_path: Path) -> None:
    # a send/recv has no number in its group (seq -1): the manifest takes it, and it is named by its group
    assert _said(
        tmp_path, _stop(0, ("all_reduce", 10, 2), ("recv", -1, 4)), _stop(1, ("all_reduce", 10, 2))
    ) == (
        "step 3 did not finish: rank 0 in recv on group 0 of 1 KiB since +4.0 ms (times from the start of "
        "the step on each rank)"
    )


def test_a_collective_numbered_0_is_named_with_its_number(tmp_path: Path) -> None:
    assert _said(tmp_path, _stop(0, None, ("all_reduce", 0, 1)), _stop(1, None)) == (
        "step 3 did not finish: rank 1 did not arrive at all_reduce 0#0 of 16 KiB (rank 0 in it since +1.0 "
        "ms, 10.0 s before it saved; rank 1's last: none in the capture window) (times from the start of the "
        "step on each rank)"
    )


def test_a_laggard_in_two_calls_that_others_did_not_arrive_at_is_said_waiting_in_the_lower_numbered(
    tmp_path: Path,
) -> None:
    # rank 1 issued 1#4 (asynchronous) and then blocked in 2#5; rank 0 waits in 0#4 (groups of both ranks)
    answer = _said(
        tmp_path,
        _stop(0, None, ("all_reduce", 4, 1)),
        _stop(1, None, ("all_reduce", 4, 2, "1"), ("all_reduce", 5, 3, "2")),
    )
    assert (
        answer is not None
        and "rank 1's last: none in the capture window, waiting in all_reduce 1#4 since +2.0 ms)" in answer
    ), answer


def test_a_collective_with_a_laggard_in_no_call_is_said_before_one_whose_laggards_all_wait(
    tmp_path: Path,
) -> None:
    # rank 1 slept after the world's 0#8; rank 2 waits in tp 2#5 for rank 3, which is in the world's 0#9
    # waiting for ranks 1 and 2: 2#5 is numbered first, but rank 1, in no call, is what holds them all
    run = _mesh(
        tmp_path,
        _stop(0, ("all_reduce", 8, 1), ("all_reduce", 9, 2)),
        _stop(1, ("all_reduce", 8, 1)),
        _stop(2, ("all_reduce", 8, 1), ("all_reduce", 5, 2, "2")),
        _stop(3, ("all_reduce", 4, -1, "2"), ("all_reduce", 9, 3)),
    )
    answer = stop_answer(read_manifest(run))
    assert answer is not None and answer.startswith(
        "step 3 did not finish: ranks 1-2 did not arrive at all_reduce 0#9 of 16 KiB ("
    ), answer


def test_a_rank_in_flight_on_a_group_the_manifest_does_not_list_it_in_is_left_out(tmp_path: Path) -> None:
    # rank 2 is not in group 1 {0, 1} (an untrusted manifest): not said in it, and no KeyError
    run = _mesh(
        tmp_path,
        _stop(0, ("all_reduce", 11, 2, "1"), ("all_reduce", 12, 3, "1")),
        _stop(1, ("all_reduce", 11, 2, "1")),
        _stop(2, None, ("all_reduce", 12, 4, "1")),
        _stop(3, None),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 did not arrive at all_reduce 1#12 of 16 KiB (rank 0 in it since +3.0 "
        "ms, 10.0 s before it saved; rank 1's last: all_reduce 1#11, returned at +2.0 ms) (times from the "
        "start of the step on each rank)"
    )


def test_the_members_said_in_a_call_all_are_in_are_its_groups_only(tmp_path: Path) -> None:
    # rank 2 is not in group 1 {0, 1} (an untrusted manifest): not among the members said in 1#12
    run = _mesh(
        tmp_path,
        _stop(0, ("all_reduce", 11, 2, "1"), ("all_reduce", 12, 3, "1")),
        _stop(1, ("all_reduce", 11, 2, "1"), ("all_reduce", 12, 3, "1")),
        _stop(2, None, ("all_reduce", 12, 4, "1")),
        _stop(3, None),
    )
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks 0-1 in all_reduce 1#12 of 16 KiB since +3.0 ms (times from the start "
        "of the step on each rank)"
    )


def test_times_of_a_second_or_more_either_side_of_the_step_start_are_in_seconds(tmp_path: Path) -> None:
    # rank 0 issued the broadcast 2.5 s into the step and waited 7.5 s of the 10 s until it saved
    assert _said(
        tmp_path,
        _stop(0, ("all_reduce", 10, -1500), ("broadcast", 11, 2500)),
        _stop(1, ("all_reduce", 10, -1500)),
    ) == (
        "step 3 did not finish: rank 1 did not arrive at broadcast 0#11 of 2 KiB (rank 0 in it since +2.50 "
        "s, 7.5 s before it saved; rank 1's last: all_reduce 0#10, returned at -1.50 s) (times from the "
        "start of the step on each rank)"
    )


def test_ranks_stopped_in_different_steps_are_said_in_the_earliest(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        replace(_stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), step=4),
        _stop(1, ("all_reduce", 10, 2)),
    )
    answer = stop_answer(read_manifest(run))
    assert answer is not None and answer.startswith("step 3 did not finish: rank 1 did not arrive at"), answer


#: The scripts below time their collectives out after 3 s, set once the ranks have joined: given to
#: init_process_group, the 3 s bounded the join too, which ranks starting up apart on a loaded machine
#: (0.9 s measured beside two CPU hogs) can exceed, and the script then failed in init, not at step 3.
SHORT_TIMEOUT = "dist.distributed_c10d._set_pg_timeout(timedelta(seconds=3))"

FAIL = f"""
import time
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo")
{SHORT_TIMEOUT}
r = dist.get_rank()
w = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(w.parameters(), lr=0.01)
for step in range(6):
    w(torch.ones(2, 8)).sum().backward()
    dist.all_reduce(torch.ones(1024))
    if step == 3 and r == 1:
        time.sleep(10**6)
    dist.broadcast(torch.ones(256), src=0)
    dist.all_reduce(torch.ones(4096))
    opt.step()
"""


RAISES = FAIL.replace("time.sleep(10**6)", 'raise RuntimeError("bad batch on rank 1")').replace(
    SHORT_TIMEOUT, ""
)


CROSSED = f"""
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo")
{SHORT_TIMEOUT}
g = dist.new_group([0, 1])
{SHORT_TIMEOUT.replace("))", "), g)")}
w = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(w.parameters(), lr=0.01)
for step in range(6):
    w(torch.ones(2, 8)).sum().backward()
    calls = [lambda: dist.all_reduce(torch.ones(1024)), lambda: dist.all_reduce(torch.ones(256), group=g)]
    if step == 3 and dist.get_rank() == 1:
        calls.reverse()
    for call in calls:
        call()
    opt.step()
"""


#: Rank 1 skips step 3's first all_reduce (a data-dependent branch) and issues the broadcast after it as
#: that all_reduce's number: gloo matches neither, and both ranks wait until the timeout.
SKIPPED = FAIL.replace(
    """    dist.all_reduce(torch.ones(1024))
    if step == 3 and r == 1:
        time.sleep(10**6)
""",
    """    if not (step == 3 and r == 1):
        dist.all_reduce(torch.ones(1024))
""",
)


#: Rank 1 calls step 3's two all_reduces (one group) in the other order: its 16 KiB one meets the others'
#: 4 KiB one, and gloo aborts a member that receives more than it expects ("Received data size doesn't
#: match expected size").
_SUBGROUP = f"g = dist.new_group([0, 1])\n{SHORT_TIMEOUT.replace('))', '), g)')}\n"
REORDERED = CROSSED.replace(_SUBGROUP, "").replace("torch.ones(256), group=g", "torch.ones(4096)")


def _captured_answer(tmp_path: Path, source: str, start: str, ranks: int = 2) -> str:
    """``stop_answer`` of a capture of ``source`` on ``ranks`` ranks, a script that fails, checked to start
    with ``start``."""
    import subprocess

    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent(source))
    run = tmp_path / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [sys.executable, "-m", "skewlens", "profile", "--out", str(run), "--"]
    cmd += [str(torchrun), "--standalone", f"--nproc-per-node={ranks}", str(script)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stderr[-2000:]
    answer = stop_answer(read_manifest(run))
    assert answer is not None and answer.startswith(start), answer
    return answer


#: :data:`FAIL` with a ``monitored_barrier`` (1 s) in place of the broadcast: it makes no recorder entry
BARRIER_FAIL = FAIL.replace(
    "dist.broadcast(torch.ones(256), src=0)", "dist.monitored_barrier(timeout=timedelta(seconds=1))"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "call", "last"),
    [
        (FAIL, "broadcast 0#11 of 1 KiB", "all_reduce 0#10"),
        (BARRIER_FAIL, "barrier 0#14 of 0 B", "all_reduce 0#13"),
    ],
    ids=["broadcast", "monitored_barrier"],
)
def test_a_capture_whose_rank_sleeps_until_its_peer_times_out_names_it_and_the_call_it_did_not_reach(
    tmp_path: Path, source: str, call: str, last: str
) -> None:
    # step 2 is the first recorded; step 3's all_reduce returned, the call after it did not: rank 0 waited
    # there until the group's timeout (broadcast) or its own (monitored_barrier, 1 s), then raised. Numbered
    # from 1 by gloo's recorder: 3 collectives a step (0#10 and 0#11); a monitored_barrier takes two numbers
    # and makes no entry, 4 a step (0#13 and 0#14). Before, of the barrier: no answer (no rank was in a call
    # the recorder has an entry of; with DDP's all_reduces before it, every rank was said in the last)
    start = f"step 3 did not finish: rank 1 did not arrive at {call} (rank 0 in it since +"
    answer = _captured_answer(tmp_path, source, start)
    assert f"rank 1's last: {last}, returned at +" in answer, answer


@pytest.mark.slow
def test_a_capture_whose_rank_raises_names_it_the_broadcast_and_the_exception(tmp_path: Path) -> None:
    # no process group timeout: rank 1's exit ends rank 0's broadcast (torchrun stops it)
    start = "step 3 did not finish: rank 1 did not arrive at broadcast 0#11 of 1 KiB (rank 0 in it since +"
    answer = _captured_answer(tmp_path, RAISES, start)
    assert ", then its program raised RuntimeError: bad batch on rank 1) (times from" in answer


@pytest.mark.timeout(20)
def test_the_answer_reads_a_manifest_of_many_calls_in_flight_once_not_once_a_call(tmp_path: Path) -> None:
    # a manifest is untrusted: 4,000 calls in flight on each of 2 ranks took 24 s (each call re-read every
    # call of every member), these 20,000 about 10 minutes
    calls = [("all_reduce", s, 0) for s in range(20_000)]
    run = _run(tmp_path, _stop(0, None, *calls), _stop(1, None, *calls))
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: ranks 0-1 in all_reduce 0#19999 of 16 KiB since +0.0 ms (times from the "
        "start of the step on each rank)"
    )


@pytest.mark.slow
def test_a_capture_whose_ranks_call_two_groups_in_different_orders_says_where_each_waits(
    tmp_path: Path,
) -> None:
    # one collective a step on each group, numbered from 1: step 3's are 0#4 and 1#4, step 2's last 1#3
    start = "step 3 did not finish: rank 1 did not arrive at all_reduce 0#4 of 4 KiB (rank 0 in it since +"
    answer = _captured_answer(tmp_path, CROSSED, start)
    assert "rank 1's last: all_reduce 1#3, returned at -" in answer
    assert ", waiting in all_reduce 1#4 since +" in answer


@pytest.mark.slow
def test_a_capture_whose_rank_skips_a_collective_names_what_each_issued_as_its_number(tmp_path: Path) -> None:
    # 3 collectives a step, numbered from 1: step 3's are 0#10-0#12; rank 1's broadcast took 0#10 (said so
    # before too: this checks that gloo leaves both ranks waiting, each with its stop record, 13 s on 2 cores)
    start = "step 3 did not finish: ranks issued different collectives as 0#10: "
    answer = _captured_answer(tmp_path, SKIPPED, start)
    assert answer.startswith(f"{start}rank 0 all_reduce of 4 KiB, rank 1 broadcast of 1 KiB"), answer


@pytest.mark.slow
def test_a_capture_whose_rank_calls_two_collectives_in_the_other_order_names_its_size(tmp_path: Path) -> None:
    # 3 ranks: gloo aborts one of rank 1's peers, the other's stop record still holds the 4 KiB call.
    # Before: 'rank 0 in all_reduce 0#7 of 4 KiB since ...' or 'rank 1 in all_reduce 0#7 of 16 KiB since ...',
    # whichever rank was lowest, beside the aborted rank's 'saved no trace'
    start = "step 3 did not finish: ranks issued different collectives as 0#7: "
    answer = _captured_answer(tmp_path, REORDERED, start, ranks=3)
    assert "rank 1 all_reduce of 16 KiB" in answer and " all_reduce of 4 KiB" in answer, answer
    assert "saved no trace" in answer, answer


def test_only_a_member_of_the_calls_group_that_saved_its_window_says_the_call_completed(
    tmp_path: Path,
) -> None:
    # rank 1 stopped in a broadcast on its own group '1' (of rank 1 alone); rank 0, which saved its whole
    # window, never issues on that group, so it says nothing of the call: rank 1 is said in it
    run = _run(tmp_path, _stop(1, ("all_reduce", 44, 60), ("broadcast", 3, 67, "1")))
    m = read_manifest(run)
    own = ProcessGroupInfo(name="1", ranks=(1,), desc="", backend="gloo")
    write_manifest(run, replace(m, process_groups=(*m.process_groups, own)))
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 in broadcast 1#3 of 2 KiB since +67.0 ms (times from the start of the "
        "step on each rank)"
    )


def test_a_member_with_no_trace_that_is_not_missing_says_nothing_of_the_call(tmp_path: Path) -> None:
    # a capture of rank 1 alone (rank 0 neither captured nor missing): no member saved its whole window
    run = _run(tmp_path, _stop(1, ("all_reduce", 44, 60), ("broadcast", 47, 67)))
    write_manifest(run, replace(read_manifest(run), ranks=(1,)))
    assert stop_answer(read_manifest(run)) == (
        "step 3 did not finish: rank 1 in broadcast 0#47 of 2 KiB since +67.0 ms (times from the start of "
        "the step on each rank)"
    )


def _partial(tmp_path: Path, *stops: RankStop) -> Path:
    """:func:`_run` of ``stops``, each rank's trace noted partial as a capture notes it (2 of 4 steps)."""
    run = _run(tmp_path, *stops)
    m = read_manifest(run)
    partial = {f"rank {s.rank}": f"{PARTIAL_TRACE_NOTE}: saved 2 of 4 steps at exit" for s in stops}
    write_manifest(run, replace(m, notes={**m.notes, **partial}))
    return run


def test_a_partial_trace_names_the_step_it_did_not_finish_and_the_collectives_it_started(
    tmp_path: Path,
) -> None:
    # rank 0 returned from step 3's all_reduce and waits in its broadcast; rank 1 exited after the all_reduce.
    # Before: 'rank 0: partial trace: saved 2 of 4 steps at exit (...): the steps after those are not in its
    # trace', which named no step and left the step's collectives unsaid
    run = _partial(
        tmp_path,
        replace(_stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), collectives_started=3),
        replace(_stop(1, ("all_reduce", 10, 2)), collectives_started=1),
    )
    ended = "rank {}: partial trace: saved 2 of 4 steps at exit (the command ended before the capture window "
    ended += "did)"
    step = "step 3 did not finish ({} started in it {} not in the trace)"
    said = [
        f"{ended.format(0)}: {step.format('3 collectives', 'are')}",
        f"{ended.format(1)}: {step.format('1 collective', 'is')}",
    ]
    warned = [i.message for i in validate_run(run).warnings if i.kind == "partial-trace"]
    assert warned == [f"{line}, and the steps after it are not in its trace" for line in said]
    for lenient in (False, True):  # analyze and replay, and with --lenient
        notes = run_notes(load_run(run, lenient=lenient))
        assert [n for n in notes if n.startswith("rank ")] == said


def test_a_rank_that_started_no_collective_in_its_last_step_is_said_in_it_only_where_its_program_raised(
    tmp_path: Path,
) -> None:
    # rank 0 ended after its last step (a program of fewer steps than the window): its trace lacks nothing.
    # Rank 1 raised in its data loader, before the step's first collective
    run = _partial(
        tmp_path,
        replace(_stop(0, None), collectives_started=0),
        replace(_stop(1, None), collectives_started=0, raised="StopIteration: data"),
    )
    warned = [i.message.split("did): ")[1] for i in validate_run(run).warnings if i.kind == "partial-trace"]
    assert warned == [
        "the steps after those are not in its trace",  # as before
        "step 3 did not finish (it had started no collective), and the steps after it are not in its trace",
    ]


def test_a_stop_record_written_before_collectives_were_counted_names_no_step(tmp_path: Path) -> None:
    run = _partial(tmp_path, _stop(0, ("all_reduce", 10, 2), ("broadcast", 11, 3)), _stop(1, None))
    manifest = (run / "manifest.json").read_text()
    assert "collectives_started" not in manifest  # an old manifest's shape: read as before
    warned = [i.message for i in validate_run(run).warnings if i.kind == "partial-trace"]
    assert [w.split("did): ")[1] for w in warned] == ["the steps after those are not in its trace"] * 2


def test_the_count_of_a_stop_record_is_read_back_and_a_negative_one_is_refused_by_its_key(
    tmp_path: Path,
) -> None:
    run = _partial(tmp_path, replace(_stop(0, None), collectives_started=4))
    assert read_manifest(run).stopped[0].collectives_started == 4
    path = run / "manifest.json"
    path.write_text(path.read_text().replace('"collectives_started": 4', '"collectives_started": -1'))
    with pytest.raises(ManifestError, match=r"stopped\[0\]\.collectives_started: -1 is outside 0\.\."):
        read_manifest(run)


def _returned(seq: int, step: int, at_ns: int) -> CommRecord:
    return CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::allreduce_", comm_type=CommType.ALL_REDUCE, pg_name="0",
        seq=seq, src=-1, dst=-1, tag=0, numel=1, dtype="float32", size_bytes=4, start_ns=at_ns,
        issue_end_ns=at_ns + 10, end_ns=at_ns + 10, is_async=False, thread=1, step=step,
    )  # fmt: skip


def _recorded(seq: int, at_ns: int) -> FrEntry:
    return FrEntry(
        pg_name="0", seq=seq, op="gloo:all_reduce", created_ns=at_ns, numel=1, dtype="float32", size_bytes=4
    )


def test_a_stop_record_counts_the_steps_returned_collectives_and_those_in_flight_once_each() -> None:
    # step 3 began at 1,000: 0#9 is step 2's; 0#10 and 0#11 returned in step 3 (their entries too); 0#12 is
    # in flight (DDP's, or one the rank is blocked in: the recorder's alone)
    returned = [_returned(9, 2, 500), _returned(10, 3, 1_100), _returned(11, 3, 1_200)]
    entries = [_recorded(9, 500), _recorded(10, 1_100), _recorded(11, 1_200), _recorded(12, 1_300)]
    stop = stop_record(returned, entries, step=3, step_start_ns=1_000, saved_ns=2_000, offset_ns=0)
    assert (stop["collectives_started"], len(stop["in_flight"])) == (3, 1)  # type: ignore[arg-type]
    # without the recorder: the returned ones alone
    alone = stop_record(returned, [], step=3, step_start_ns=1_000, saved_ns=2_000, offset_ns=0)
    assert alone["collectives_started"] == 2


def test_a_stop_record_says_a_rank_is_in_the_monitored_barrier_it_entered_numbered_as_gloo_counts() -> None:
    # gloo's monitored_barrier makes no recorder entry and takes two numbers. Step 3 (begun at 1,000): a
    # barrier returned in step 2 (0#8, taking 8 and 9); DDP's two all_reduces of step 3 (0#10, 0#11, the
    # recorder's alone), then the rank entered a barrier and did not return (it timed out waiting for its
    # peer). Before: in flight were the two all_reduces alone, so the answer said every rank was in 0#11
    barrier = replace(_returned(8, 2, 500), op="c10d::monitored_barrier", comm_type=CommType.BARRIER)
    entries = [_recorded(7, 400), _recorded(10, 1_100), _recorded(11, 1_150)]
    inside = [replace(barrier, seq=4, start_ns=1_300, issue_end_ns=1_300, end_ns=-1, step=3)]  # hooks' number
    stop = stop_record(
        [_returned(7, 2, 400), barrier], entries, step=3, step_start_ns=1_000, saved_ns=2_000, offset_ns=0,
        inside=inside,
    )  # fmt: skip
    flying = [(c["type"], c["seq"], c["at_ns"]) for c in stop["in_flight"]]  # type: ignore[attr-defined]
    assert flying == [("all_reduce", 10, 1_100), ("all_reduce", 11, 1_150), ("barrier", 12, 1_300)]
    assert stop["collectives_started"] == 3
    # one entered before the step began is an earlier step's (a program that caught its timeout): not said
    earlier = stop_record(
        [], entries, step=3, step_start_ns=1_000, saved_ns=2_000, offset_ns=0,
        inside=[replace(inside[0], start_ns=900)],
    )  # fmt: skip
    assert [c["type"] for c in earlier["in_flight"]] == ["all_reduce", "all_reduce"]  # type: ignore[attr-defined]


#: Each of step 3's ranks issues k of the step's 3 collectives, then the program ends (``EXIT`` on rank 1;
#: rank 0, blocked in the third, which rank 1 never issues, fails when rank 1 is gone).
EXITS = (
    FAIL.split("for step")[0].replace("import time\n", "import os, signal, sys\n", 1)
    + """for step in range(6):
    w(torch.ones(2, 8)).sum().backward()
    calls = [
        lambda: dist.all_reduce(torch.ones(1024)),
        lambda: dist.broadcast(torch.ones(256), src=0),
        lambda: dist.all_reduce(torch.ones(4096)),
    ]
    for k, call in enumerate(calls):
        if step == 3 and k == (3, 2)[r]:
            EXIT
        call()
    opt.step()
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "exit_by",
    ['raise RuntimeError("bad batch")', "sys.exit(3)", "os.kill(os.getpid(), signal.SIGTERM)"],
    ids=["exception", "sys.exit", "SIGTERM"],
)
def test_a_capture_that_ends_inside_a_step_names_it_and_each_ranks_collectives_started_in_it(
    tmp_path: Path, exit_by: str
) -> None:
    # default window 1:1:3: step 2 saved, step 3 unfinished, with 3 collectives started on rank 0 (the
    # third in flight) and 2 on rank 1. Before: 'rank 1: partial trace: saved 1 of 3 steps at exit (the
    # command ended before the capture window did): the steps after those are not in its trace'
    _captured_answer(tmp_path, EXITS.replace("EXIT", exit_by), "step 3 did not finish: rank 1 did not arrive")
    run = tmp_path / "run"
    assert {s.rank: s.collectives_started for s in read_manifest(run).stopped} == {0: 3, 1: 2}
    # the command failed (exit code, signal): the steps the rank marked, and no skipped optimizer.step() said
    ended = "rank {}: partial trace: saved 1 of 3 steps at exit (the command ended before the capture window "
    ended += "did: the rank marked 3 steps, 0-2, one at each optimizer.step(), and the window's steps are "
    ended += "2-4)"
    said = [
        f"{ended.format(0)}: step 3 did not finish (3 collectives started in it are not in the trace)",
        f"{ended.format(1)}: step 3 did not finish (2 collectives started in it are not in the trace)",
    ]
    warned = [i.message for i in validate_run(run).warnings if i.kind == "partial-trace"]
    assert warned == [f"{line}, and the steps after it are not in its trace" for line in said]
    for lenient in (False, True):
        assert [n for n in run_notes(load_run(run, lenient=lenient)) if n.startswith("rank ")] == said


def _parts_of_a_window_that_never_ended(run: Path, *, marks: str) -> None:
    """Two ranks' part files as a loop that skips every 3rd ``optimizer.step()`` leaves them (8 iterations,
    ``--steps 1:1:5``): 6 steps marked, steps 2-5 saved at exit, in no step when it ended."""
    import json

    from skewlens.profiler.capture.session import part_file
    from skewlens.profiler.chakra_io import EtWriter
    from skewlens.profiler.manifest import rank_file

    for r in (0, 1):
        with EtWriter(rank_file(run, r), {"rank": r, "world_size": 2}):
            pass
        part_file(run, r).parent.mkdir(parents=True, exist_ok=True)
        part = {
            "rank": r,
            "world_size": 2,
            "host": "h",
            "device": "cpu",
            "process_groups": [{"name": "0", "ranks": [0, 1], "desc": "default_pg"}],
            "steps": [
                {"step": s, "start_ns": T0 + s * MS, "end_ns": T0 + (s + 1) * MS} for s in (2, 3, 4, 5)
            ],
            "partial": True,
            "notes": {},
            "level": "collectives",
            "window": {"wait": 1, "warmup": 1, "active": 5},
            "stopped": {
                "rank": r,
                "step": 6,
                "step_start_ns": T0 + 6 * MS,
                "saved_ns": T0 + 7 * MS,
                "collectives_started": 0,
            },
            "step_marks": marks,
        }
        part_file(run, r).write_text(json.dumps(part))


@pytest.mark.parametrize(
    ("marks", "code", "why"),
    [
        (
            "optimizer",
            0,
            (
                "the rank marked 6 steps, 0-5, one at each optimizer.step(), and the window's steps are 2-6; "
                "an iteration whose optimizer.step() did not run, a GradScaler's skip, marks no step"
            ),
        ),
        (
            "optimizer",
            1,
            "the rank marked 6 steps, 0-5, one at each optimizer.step(), and the window's steps are 2-6",
        ),
        ("program", 0, "the rank marked 6 steps, 0-5, with cap.step(), and the window's steps are 2-6"),
    ],
    ids=["skipped-step", "failed-command", "cap.step"],
)
def test_a_partial_trace_says_how_many_steps_the_rank_marked_against_the_window_s(
    tmp_path: Path, marks: str, code: int, why: str
) -> None:
    from skewlens.profiler.capture.run import finalize_run
    from skewlens.profiler.manifest import StepWindow
    from skewlens.profiler.vocab import Level

    # a GradScaler-like loop ran all 8 iterations it meant to, 2 of them without optimizer.step(): it was
    # told only "(the command ended before the capture window did)"
    run = tmp_path / "run"
    _parts_of_a_window_that_never_ended(run, marks=marks)
    window = StepWindow(wait=1, warmup=1, active=5)
    assert finalize_run(run, level=Level.COLLECTIVES, window=window, exit_code=code) is not None
    line = "rank {}: partial trace: saved 4 of 5 steps at exit (the command ended before the capture window "
    line += "did: "
    said = [f"{line.format(r)}{why})" for r in (0, 1)]
    warned = [i.message for i in validate_run(run).warnings if i.kind == "partial-trace"]
    assert warned == [f"{s}: the steps after those are not in its trace" for s in said]
    assert [n for n in run_notes(load_run(run)) if n.startswith("rank ")] == said
