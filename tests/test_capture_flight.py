"""Collectives issued outside torch.distributed's Python API (functional ones) come from the flight recorder.

A small training script issues, each step, a hooked all_reduce and two functional collectives
(``torch.ops._c10d_functional``: an all_reduce on a sub-group and an all_gather_into_tensor on the world
group) that the Python hooks never see; 2 gloo ranks run it under ``skewlens profile`` for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.profiler.capture.flight import (
    FrEntry,
    Loss,
    even_splits_note,
    losses,
    merge,
    parse_dump,
    program_dtype,
    resolve,
    unhooked_groups,
)
from skewlens.profiler.capture.records import FROM_RECORDER, CommRecord, StepRecord
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import Attr, CommType, NodeType

SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
pair = dist.new_group([0, 1])
w = torch.nn.Parameter(torch.randn(256, 256))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(STEPS):
    x = torch.randn(64, 256) @ w
    with torch.no_grad():  # (no backward through collectives: theirs would issue collectives of its own)
        x = x.detach()
        dist.all_reduce(x)
        y = torch.ops._c10d_functional.all_reduce(x, "sum", pair.group_name)
        y = torch.ops._c10d_functional.wait_tensor(y)
        world = dist.group.WORLD.group_name
        g = torch.ops._c10d_functional.all_gather_into_tensor(y[:8].contiguous(), 2, world)
        g = torch.ops._c10d_functional.wait_tensor(g)
    (torch.randn(64, 256) @ w).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
# torch 2.13 aborts at interpreter exit in about 1 run of 10 after gloo functional collectives, with or
# without skewlens ("terminate called without an active exception"); the trace was saved long before
os._exit(0)
"""
STEPS, ACTIVE = 6, 3


@pytest.fixture(scope="module", params=["collectives", "ops"])
def funcol_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    work = tmp_path_factory.mktemp(f"funcol-{request.param}")
    script = work / "train_funcol.py"
    script.write_text(SCRIPT.replace("STEPS", str(STEPS)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    out = work / "run"
    res = profile(out, level=request.param, steps=f"1:1:{ACTIVE}", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    return request.param, out


@pytest.mark.slow
def test_functional_collectives_appear_with_group_size_and_matching_sequence_numbers(
    funcol_run: tuple[str, Path],
) -> None:
    _level, run = funcol_run
    m = read_manifest(run)
    names = {g.name: g.ranks for g in m.process_groups}
    per_rank = {}
    for r in (0, 1):
        colls = [
            (n, a)
            for n in read_et(run / f"rank-{r}.et").nodes
            if (a := node_attrs(n)) and n.type == NodeType.COMM_COLL
        ]
        fr = [(n, a) for n, a in colls if n.name.startswith("gloo:")]  # named by the recorder
        hooked = [(n, a) for n, a in colls if n.name.startswith("c10d::")]
        assert len(fr) + len(hooked) == len(colls)
        # per step: the hooked all_reduce is recorded once, not twice; the two functional ones come from FR
        assert Counter(a[Attr.COMM_TYPE] for _, a in hooked) == {CommType.ALL_REDUCE: ACTIVE}
        kinds = Counter((a[Attr.COMM_TYPE], names[a[Attr.PG_NAME]]) for _, a in fr)
        assert kinds == {(CommType.ALL_REDUCE, (0, 1)): ACTIVE, (CommType.ALL_GATHER, (0, 1)): ACTIVE}
        pair_pg = {a[Attr.PG_NAME] for _, a in fr if a[Attr.COMM_TYPE] == CommType.ALL_REDUCE}
        world_pg = {a[Attr.PG_NAME] for _, a in hooked}
        assert len(pair_pg) == 1 and pair_pg != world_pg  # the sub-group's own name, not the world's
        for _, a in fr:
            want = 64 * 256 * 4 if a[Attr.COMM_TYPE] == CommType.ALL_REDUCE else 8 * 256 * 4
            assert a[Attr.COMM_SIZE] == want and a[Attr.DTYPE] == "float32"
        # one numbering per group for hooked and recorder-only collectives: increasing in issue order
        for pg in names:
            seqs = [
                a[Attr.SEQ]
                for _, a in sorted(colls, key=lambda na: na[1][Attr.START_NS])
                if a[Attr.PG_NAME] == pg
            ]
            assert seqs == sorted(set(seqs)), (pg, seqs)
        per_rank[r] = sorted((a[Attr.PG_NAME], a[Attr.SEQ], a[Attr.COMM_TYPE]) for _, a in colls)
        # gloo's worker event gives the real end, at both levels
        assert all(n.duration_micros > 0 for n, _ in fr)
        note = m.notes[f"rank {r} flight recorder"]
        assert f"{2 * ACTIVE} collective(s)" in note
    assert per_rank[0] == per_rank[1]  # the same instance carries the same number on both ranks
    run_trace = load_validated(run)  # and they match across ranks without a mismatch
    assert len(run_trace.collectives) >= 3 * ACTIVE


def _entry(pg: str, seq: int, t: int) -> dict[str, object]:
    return {
        "process_group": [pg, "x"], "collective_seq_id": seq, "profiling_name": "gloo:all_reduce",
        "time_created_ns": t, "input_sizes": [[4, 8]], "input_dtypes": ["Float"], "is_p2p": False,
    }  # fmt: skip


def test_a_flight_recorder_dump_is_parsed_without_trusting_it() -> None:
    good = _entry("1", 7, 1_000)
    text = json.dumps({"entries": [good, {"process_group": "bad"}, 5, {**good, "is_p2p": True}]})
    assert parse_dump(text) == [
        FrEntry(
            pg_name="1",
            seq=7,
            op="gloo:all_reduce",
            created_ns=1_000,
            numel=32,
            dtype="float32",
            size_bytes=128,
        )
    ]
    assert parse_dump("{}") == []  # a recorder that recorded nothing yet


def test_an_unreadable_or_oversized_dump_is_an_error_naming_the_dump_and_the_limit() -> None:
    for bad in ("{not json", "[1, 2]", '{"entries": 3}'):
        with pytest.raises(CaptureError, match=r"flight recorder dump.*parse limit \d+ bytes"):
            parse_dump(bad)
    big = json.dumps({"entries": [_entry("0", k, 1_000 + k) for k in range(50)]})
    with pytest.raises(CaptureError, match=r"larger than the 1000-byte limit.*TORCH_FR_BUFFER_SIZE"):
        parse_dump(big, max_bytes=1_000)


def _hooked(start: int, issue_end: int, *, seq: int, ident: int) -> CommRecord:
    return CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::allreduce_", comm_type=CommType.ALL_REDUCE, pg_name="0",
        seq=seq, src=-1, dst=-1, tag=0, numel=1, dtype="float32", size_bytes=4, start_ns=start,
        issue_end_ns=issue_end, end_ns=issue_end, is_async=False, thread=1, step=1, ident=ident,
    )  # fmt: skip


def test_hooked_calls_take_the_recorders_numbers_and_only_unaccounted_entries_inside_steps_are_added() -> (
    None
):
    steps = [StepRecord(step=1, start_ns=5_000_000, end_ns=20_000_000)]
    entries = [
        {**_entry("0", 11, 10_500_000), "thread_id": "77"},  # the hooked call's own
        {**_entry("0", 12, 10_600_000), "thread_id": "88"},  # another thread, meanwhile (DDP's reducer)
        {**_entry("0", 13, 15_000_000), "thread_id": "77"},  # issued from C++ on the same thread
        {**_entry("0", 14, 30_000_000), "thread_id": "77"},  # after the window
    ]
    parsed = parse_dump(json.dumps({"entries": entries}))
    assert [e.thread_ident for e in parsed] == [77, 88, 77, 77]
    hooked, extra, left_out = merge(
        parsed, [_hooked(10_000_000, 11_000_000, seq=3, ident=77)], steps, thread=1
    )
    assert [c.seq for c in hooked] == [11] and left_out == 0
    assert [(e.seq, e.start_ns, e.step, e.is_async, e.ident) for e in extra] == [
        (12, 10_600_000, 1, True, 88),
        (13, 15_000_000, 1, True, 77),
    ]
    # without thread ids, a call accounts for what its group recorded around it
    anon = parse_dump(json.dumps({"entries": [_entry("0", 11, 10_500_000), _entry("0", 13, 15_000_000)]}))
    hooked, extra, _ = merge(anon, [_hooked(10_000_000, 11_000_000, seq=3, ident=0)], steps, thread=1)
    assert [c.seq for c in hooked] == [11] and [e.seq for e in extra] == [13]


def test_a_recorder_only_collective_of_a_python_thread_is_issued_by_that_thread() -> None:
    steps = [StepRecord(step=1, start_ns=5_000_000, end_ns=20_000_000)]
    # a metrics thread (ident 99, native 4242) still inside its blocking all_reduce when the window closed:
    # no hooked record, the recorder's entry alone; DDP's (ident 77, the main thread) beside it
    entries = [
        {**_entry("0", 12, 10_600_000), "thread_id": "77"},
        {**_entry("1", 5, 19_000_000), "thread_id": "99"},
    ]
    parsed = parse_dump(json.dumps({"entries": entries}))
    _, extra, _ = merge(parsed, [], steps, thread=1, natives={77: 1, 99: 4242})
    assert [(e.pg_name, e.thread) for e in extra] == [("0", 1), ("1", 4242)]  # before: ("1", 1)
    # a thread Python does not know (a C++ one) stays the main thread's
    _, extra, _ = merge(parsed, [], steps, thread=1, natives={77: 1})
    assert [(e.pg_name, e.thread) for e in extra] == [("0", 1), ("1", 1)]


def test_a_hooked_call_whose_entry_was_lost_is_left_out_never_renumbered() -> None:
    steps = [StepRecord(step=1, start_ns=5_000_000, end_ns=20_000_000)]
    entries = parse_dump(json.dumps({"entries": [{**_entry("0", 13, 15_000_000), "thread_id": "77"}]}))
    call = _hooked(10_000_000, 11_000_000, seq=3, ident=77)
    hooked, extra, left_out = merge(entries, [call], steps, thread=1)
    assert (hooked, left_out) == ([], 1)  # no entry, so no number of the recorder's: left out
    assert [e.seq for e in extra] == [13]  # the recorder's own number, never shifted
    # a group the recorder does not feed (another backend) keeps the hooks' numbers
    hooked, extra, left_out = merge(entries, [call], steps, thread=1, recorded={"1"})
    assert ([c.seq for c in hooked], left_out) == ([3], 0)


def _member(seqs: Sequence[int], first_record: int) -> list[FrEntry]:
    """One member's dump: group "0" collectives ``seqs``, one a millisecond from t=1 ms."""
    return parse_dump(
        json.dumps(
            {
                "entries": [
                    {**_entry("0", q, q * 1_000_000), "thread_id": "77", "record_id": first_record + i}
                    for i, q in enumerate(seqs)
                ]
            }
        )
    )


def test_two_members_agree_on_every_number_when_one_recorder_wrapped() -> None:
    # 3 steps of 4 hooked all_reduces (seq 1..12, issued at q ms); rank 1's ring buffer kept only 9..12
    ms = 1_000_000
    steps = [
        StepRecord(step=s, start_ns=(4 * s - 4) * ms + ms // 2, end_ns=4 * s * ms + ms // 2)
        for s in (1, 2, 3)
    ]
    calls = [_hooked(q * 1_000_000 - 100, q * 1_000_000 + 100, seq=q + 100, ident=77) for q in range(1, 13)]
    full, wrapped = _member(range(1, 13), 0), _member(range(9, 13), 8)
    ids = {}
    for r, entries in ((0, full), (1, wrapped)):
        hooked, extra, left_out = merge(entries, calls, steps, thread=1)
        ids[r] = {c.seq for c in hooked + extra}
        assert left_out == (0 if r == 0 else 8)
    assert ids[1] <= ids[0] and ids[0] == set(range(1, 13))  # the same numbers, the recorder's
    assert losses(full, steps, ["0"]) == []
    # what rank 1 lost, with the steps it covers: steps 1 and 2 began before its oldest kept entry
    assert losses(wrapped, steps, ["0"]) == [Loss(pg_name="0", first_seq=1, last_seq=8, steps=(1, 2, 3))]
    # a hole in the kept numbers is lost too
    holed = [e for e in full if e.seq != 6]
    assert losses(holed, steps, ["0"]) == [Loss(pg_name="0", first_seq=6, last_seq=6, steps=(2,))]


def test_numbers_taken_by_work_that_makes_no_entry_are_not_lost_collectives() -> None:
    # gloo's monitored_barrier takes two of the group's numbers per call (its point-to-point messages)
    # and makes no recorder entry: 5 steps of 2 DDP all_reduces then a monitored_barrier number their
    # all_reduces 1, 2, 5, 6, 9, 10, ... with record ids that run on without a gap
    ms = 1_000_000
    steps = [StepRecord(step=s, start_ns=s * 10 * ms, end_ns=(s + 1) * 10 * ms) for s in range(5)]
    seqs = [4 * s + k for s in range(5) for k in (1, 2)]
    entries = _member(seqs, 0)
    # before: "lost" 3..4, 7..8, 11..12 and 15..16, which the manifest merges into one range (3..16) that
    # the loader leaves out of matching: 6 of the 10 all_reduces
    assert losses(entries, steps, ["0"]) == []
    # an entry the ring buffer did lose between them (a record id missing) still is a loss
    holed = [e for e in entries if e.seq != 5]
    assert [(x.first_seq, x.last_seq) for x in losses(holed, steps, ["0"])] == [(3, 5)]


def test_groups_with_collectives_past_the_hooks_are_those_the_recorder_numbered_further() -> None:
    entries = parse_dump(
        json.dumps({"entries": [_entry("0", 4, 1_000), _entry("0", 5, 2_000), _entry("1", 2, 3_000)]})
    )
    assert unhooked_groups(entries, {"0": 5, "1": 2}) == []  # every collective went through the hooks
    assert unhooked_groups(entries, {"0": 4, "1": 2}) == ["0"]  # one more on "0" (DDP's, C++, ...)
    assert unhooked_groups(entries, {"0": 5}) == ["1"]  # a group the hooks never saw
    assert unhooked_groups([], {"0": 3}) == []


def _lean(start: int, issue_end: int, *, ident: int) -> CommRecord:
    return CommRecord(
        node_type=NodeType.COMM_COLL, op="c10d::broadcast_", comm_type=CommType.BROADCAST,
        pg_name=FROM_RECORDER, seq=-1, src=-1, dst=-1, tag=0, numel=0, dtype="", size_bytes=0,
        start_ns=start, issue_end_ns=issue_end, end_ns=issue_end, is_async=False, thread=1, step=1,
        ident=ident,
    )  # fmt: skip


def test_lean_calls_take_group_and_sizes_from_the_entry_their_thread_made_while_issuing_them() -> None:
    entries = parse_dump(
        json.dumps(
            {
                "entries": [
                    {**_entry("1", 4, 1_500), "thread_id": "88", "input_sizes": [[9]]},  # another thread
                    {**_entry("1", 5, 1_600), "thread_id": "77", "input_sizes": [[10, 3]]},
                    {
                        **_entry("0", 9, 2_500),
                        "thread_id": "77",
                        "input_sizes": [[5]],
                        "input_dtypes": ["Double"],
                    },
                    {**_entry("0", 10, 9_000), "thread_id": "77"},  # nobody's: a C++ collective
                ]
            }
        )
    )
    p2p = replace(_hooked(3_000, 3_100, seq=-1, ident=77), node_type=NodeType.COMM_SEND, pg_name="0")
    calls = [_lean(1_000, 2_000, ident=77), _lean(2_400, 2_600, ident=77), p2p, _lean(4_000, 5_000, ident=77)]
    out, lost = resolve(entries, calls)
    # the third lean call made no entry the recorder still has: it is left out, and counted
    assert lost == 1
    assert [(c.pg_name, c.numel, c.size_bytes, c.dtype) for c in out] == [
        ("1", 30, 120, "float32"),
        ("0", 5, 40, "float64"),
        ("0", 1, 4, "float32"),  # not a lean call: unchanged
    ]
    assert out[2] is p2p
    # two lean calls never share an entry; a call of an unknown thread takes any thread's entry
    twice, lost = resolve(entries[1:2], [_lean(1_000, 2_000, ident=77), _lean(1_000, 2_000, ident=0)])
    assert ([c.pg_name for c in twice], lost) == (["1"], 1)
    anon, lost = resolve(entries[:1], [_lean(1_000, 2_000, ident=0)])
    assert ([c.numel for c in anon], lost) == ([9], 0)
    # nothing to resolve: the records pass as they are, whatever the recorder has
    assert resolve([], [p2p]) == ([p2p], 0)


def test_the_manifest_declares_one_range_per_group_for_every_member_and_the_loader_leaves_it_out() -> None:
    import numpy as np

    from skewlens.profiler.capture.run import merge_losses
    from skewlens.profiler.store.issues import IssueLog
    from skewlens.profiler.store.match import CommRows, match_instances, without_lost

    parts = {
        0: {"lost_collectives": []},
        1: {"lost_collectives": [{"pg_name": "0", "first_seq": 1, "last_seq": 8, "steps": [1, 2]}]},
        2: {"lost_collectives": [{"pg_name": "0", "first_seq": 1, "last_seq": 5, "steps": [1]}]},
    }
    (lost,) = merge_losses(parts)
    assert (lost.pg_name, lost.first_seq, lost.last_seq, lost.steps, lost.ranks) == (
        "0",
        1,
        8,
        (1, 2),
        (1, 2),
    )

    def rows(rank: int, seqs: list[int]) -> CommRows:
        n = len(seqs)
        i64 = np.arange(n, dtype=np.int64)
        return CommRows(
            rank=rank, path=f"rank-{rank}.et", row=i64, node_id=i64 + 1,
            node_type=np.full(n, NodeType.COMM_COLL, np.int8), name=["gloo:all_reduce"] * n,
            pg=np.zeros(n, np.int32), seq=np.asarray(seqs, np.int64),
            comm_type=np.full(n, CommType.ALL_REDUCE, np.int8), comm_bytes=np.full(n, 4, np.int64),
            src=np.full(n, -1, np.int32), dst=np.full(n, -1, np.int32), tag=np.zeros(n, np.int64),
            start_ns=i64, dur_ns=i64, step=np.ones(n, np.int32),
        )  # fmt: skip

    comm = {0: rows(0, list(range(1, 13))), 1: rows(1, list(range(9, 13))), 2: rows(2, list(range(6, 13)))}
    with pytest.raises(Exception, match="collective mismatch"):  # as before: mismatches
        match_instances(comm, ["0"], {}, IssueLog(strict=True))
    sink = IssueLog()
    kept, incomplete = without_lost(comm, (lost,), ["0"], sink)
    assert incomplete == (1, 2)
    assert [i.kind for i in sink.issues] == ["lost-collectives"] and "steps 1-2 incomplete" in str(
        sink.issues[0]
    )
    inst = match_instances(kept, ["0"], {}, IssueLog(strict=True))  # no mismatch left
    assert [i.seq for i in inst] == [9, 10, 11, 12] and all(i.ranks == (0, 1, 2) for i in inst)


def test_a_save_after_the_program_destroyed_its_group_still_numbers_the_hooked_calls_by_the_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a program that ends inside the window destroys its group before the save at exit; the recorder keeps
    # its entries. Its lean calls were left without a number and its full-path ones with the hooks' own
    # (a scatter at 20 among broadcasts numbered 0.. in file order: "issued more than once", not loaded)
    import torch.distributed as dist

    from skewlens.profiler.capture import flight as flight_mod
    from skewlens.profiler.capture.session import CaptureSession
    from skewlens.profiler.manifest import StepWindow

    assert not dist.is_initialized()
    entries = parse_dump(
        json.dumps(
            {
                "entries": [
                    {**_entry("0", 31, 1_500), "thread_id": "77"},
                    {**_entry("0", 32, 2_500), "thread_id": "77"},
                    {**_entry("0", 33, 3_050), "thread_id": "77"},  # a functional collective: recorder only
                ]
            }
        )
    )
    monkeypatch.setattr(flight_mod, "dump_entries", lambda: entries)
    s = CaptureSession(tmp_path / "run", window=StepWindow(wait=0, warmup=0, active=3), auto_step=False)
    s._flight = True
    s.steps = [StepRecord(step=1, start_ns=1_000, end_ns=4_000)]
    full_path = _hooked(2_400, 2_600, seq=20, ident=77)
    out = s._with_flight_recorder(
        [_lean(1_000, 2_000, ident=77), full_path],
        s._groups(),  # what the session finds after the group was destroyed: no backend
        partial=True,
    )
    assert [(c.op, c.seq) for c in out] == [
        ("c10d::broadcast_", 31),
        ("c10d::allreduce_", 32),
        ("gloo:all_reduce", 33),
    ]


DESTROYED_GROUPS_SCRIPT = r"""
import json, os, socket
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
import tempfile
from skewlens.profiler.capture.session import CaptureSession
from skewlens.profiler.manifest import StepWindow
s = CaptureSession(tempfile.mkdtemp(), window=StepWindow(wait=0, warmup=0, active=5), auto_step=False)
dist.new_group([0], group_desc="sub")
s.step()                                              # a recorded step (the window starts at once)
dist.destroy_process_group()
print(json.dumps([(g.name, list(g.ranks), g.desc, g.backend) for g in s._groups()]))
"""


def test_a_save_after_the_program_destroyed_its_groups_names_them_as_they_were_at_a_recorded_step() -> None:
    # before: one made-up group '0' of rank 0 only (a 2-rank run's manifest said so, and its group '1' was
    # unknown: the real replay failed with "KeyError: '1'")
    res = subprocess.run(
        [sys.executable, "-c", DESTROYED_GROUPS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    groups = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(n, r, d) for n, r, d, _b in groups] == [("0", [0], "default_pg"), ("1", [0], "sub")]
    assert all("gloo" in b for *_x, b in groups)


def test_a_monitored_barrier_takes_the_first_of_the_numbers_it_left_out_of_the_recorder() -> None:
    # 2 steps of 2 hooked all_reduces then a monitored_barrier, which makes no entry and takes two numbers:
    # the all_reduces are 1, 2, 5, 6; the barriers take 3 (and 4) and 7 (and 8), on every member
    ms = 1_000_000
    steps = [StepRecord(step=s, start_ns=s * 10 * ms, end_ns=(s + 1) * 10 * ms) for s in range(2)]
    entries = _member([1, 2, 5, 6], 0)
    barrier = replace(
        _hooked(0, 0, seq=99, ident=77),
        op="c10d::monitored_barrier",
        comm_type=CommType.BARRIER,
        size_bytes=0,
    )
    calls = [
        _hooked(1 * ms - 100, 1 * ms + 100, seq=0, ident=77),
        _hooked(2 * ms - 100, 2 * ms + 100, seq=1, ident=77),
        replace(barrier, start_ns=3 * ms, issue_end_ns=4 * ms, end_ns=4 * ms),
        _hooked(5 * ms - 100, 5 * ms + 100, seq=3, ident=77),
        _hooked(6 * ms - 100, 6 * ms + 100, seq=4, ident=77),
        replace(barrier, start_ns=7 * ms, issue_end_ns=8 * ms, end_ns=8 * ms),
        replace(barrier, start_ns=9 * ms, issue_end_ns=9 * ms + 5, end_ns=9 * ms + 5),  # a second in a row
    ]
    hooked, extra, left_out = merge(entries, calls, steps, thread=1)
    assert (left_out, extra) == (0, [])  # before: the barriers were left out as lost (left_out 3)
    assert [(c.op.removeprefix("c10d::"), c.seq) for c in hooked] == [
        ("allreduce_", 1), ("allreduce_", 2), ("monitored_barrier", 3),
        ("allreduce_", 5), ("allreduce_", 6), ("monitored_barrier", 7), ("monitored_barrier", 9),
    ]  # fmt: skip


def test_the_all_to_alls_only_the_recorder_saw_are_counted_as_recorded_with_even_splits() -> None:
    a2a = replace(_hooked(1, 2, seq=3, ident=0), op="gloo:all_to_all", comm_type=CommType.ALL_TO_ALL)
    others = [_hooked(1, 2, seq=1, ident=0)]
    assert even_splits_note(0, others) == ""
    note = even_splits_note(1, [a2a, a2a, *others])
    assert note.startswith("3 all_to_all call(s) recorded with even splits")
    assert "1 whose split sizes could not be read; 2 issued outside torch.distributed's Python API" in note
    # the recorder's alone (no hooked call unread): noted, with no "0 whose split sizes could not be read"
    only = even_splits_note(0, [a2a, *others])
    assert only.startswith("1 all_to_all call(s) recorded with even splits")
    assert only.endswith(
        ": 1 issued outside torch.distributed's Python API (functional collectives, C++) and taken from the "
        "flight recorder, which records no split sizes"
    )


A2A_SCRIPT = """
import os, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
dist.init_process_group("gloo")
r = dist.get_rank()
w = torch.nn.Parameter(torch.randn(8, 8))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(5):
    x = torch.randn(8, 8) @ w
    # an MoE layer's dispatch: 2 rows to rank 0 and 6 to rank 1 from rank 0, the other way round from rank 1
    y = funcol.all_to_all_single_autograd(x, [2, 6] if r == 0 else [6, 2], [2, 6] if r == 0 else [6, 2],
                                          dist.group.WORLD)
    funcol.wait_tensor(y).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)  # (see SCRIPT)
"""


@pytest.mark.slow
def test_a_functional_all_to_all_whose_splits_no_hook_saw_is_noted_as_recorded_even(tmp_path: Path) -> None:
    script = tmp_path / "moe.py"
    script.write_text(A2A_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    res = profile(tmp_path / "run", level="collectives", steps="1:1:2", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_manifest(tmp_path / "run")
    for r in (0, 1):
        # forward and backward (the autograd function's own all_to_all) in each of the 2 recorded steps
        note = m.notes[f"rank {r} all_to_all splits"]
        assert note.startswith("4 all_to_all call(s) recorded with even splits")


def test_a_ring_buffer_that_wrapped_over_hundreds_of_steps_is_said_in_ranges_not_step_by_step() -> None:
    # a 400-step window whose buffer held 300 entries lost steps 2-252: the rank's note, the manifest's
    # note and every command's warning listed the 251 steps one by one, and skewlens check's table too
    from skewlens.profiler.capture.run import merge_losses
    from skewlens.profiler.store.issues import IssueLog
    from skewlens.profiler.store.match import without_lost

    loss = Loss(pg_name="0", first_seq=1, last_seq=509, steps=tuple(range(2, 253)))
    assert loss.describe() == "group '0' seq 1..509 (steps 2-252)"
    assert Loss(pg_name="tp", first_seq=4, last_seq=-1, steps=(3, 4, 7)).describe() == (
        "group 'tp' seq 4..end (steps 3-4, 7)"
    )
    part = {
        "lost_collectives": [{"pg_name": "0", "first_seq": 1, "last_seq": 509, "steps": list(range(2, 253))}]
    }
    (lost,) = merge_losses({0: part, 1: part})
    sink = IssueLog()
    without_lost({}, (lost,), ["0"], sink)
    (issue,) = sink.issues
    assert issue.message == (
        "steps 2-252 incomplete: the flight recorders of ranks 0-1 lost group '0' seq 1..509 (their ring "
        "buffers wrapped; TORCH_FR_BUFFER_SIZE sizes them); those collectives are left out of matching on "
        "every member"
    )


def test_one_rank_whose_ring_buffer_lost_one_steps_collectives_to_the_end_is_said_in_the_singular() -> None:
    # it read 'steps 3 incomplete: the flight recorder of rank(s) 1 lost group 'tp' seq 4..on (its ring
    # buffer wrapped)', where the rank's own note says 'seq 4..end'
    from skewlens.profiler.capture.run import merge_losses
    from skewlens.profiler.store.issues import IssueLog
    from skewlens.profiler.store.match import without_lost

    (lost,) = merge_losses(
        {
            0: {"lost_collectives": []},
            1: {"lost_collectives": [{"pg_name": "tp", "first_seq": 4, "last_seq": -1, "steps": [3]}]},
        }
    )
    sink = IssueLog()
    without_lost({}, (lost,), ["tp"], sink)
    assert [i.message for i in sink.issues] == [
        (
            "step 3 incomplete: the flight recorder of rank 1 lost group 'tp' seq 4..end (its ring buffer "
            "wrapped; TORCH_FR_BUFFER_SIZE sizes it); those collectives are left out of matching on every "
            "member"
        )
    ]


def test_one_rank_that_lost_several_steps_and_a_loss_ending_at_seq_0_are_said_as_they_are() -> None:
    # the step and recorder plurals follow their own counts (one rank over steps 3-4: 'steps', 'recorder'),
    # and a loss that ends at seq 0 ends there, not at the buffer's end
    from skewlens.profiler.capture.run import merge_losses
    from skewlens.profiler.store.issues import IssueLog
    from skewlens.profiler.store.match import without_lost

    lost = merge_losses(
        {
            0: {"lost_collectives": [{"pg_name": "0", "first_seq": 0, "last_seq": 0, "steps": [1]}]},
            1: {"lost_collectives": [{"pg_name": "tp", "first_seq": 4, "last_seq": -1, "steps": [3, 4]}]},
        }
    )
    sink = IssueLog()
    without_lost({}, lost, ["0", "tp"], sink)
    assert sorted(i.message for i in sink.issues) == [
        (
            "step 1 incomplete: the flight recorder of rank 0 lost group '0' seq 0..0 (its ring buffer "
            "wrapped; TORCH_FR_BUFFER_SIZE sizes it); those collectives are left out of matching on every "
            "member"
        ),
        (
            "steps 3-4 incomplete: the flight recorder of rank 1 lost group 'tp' seq 4..end (its ring buffer "
            "wrapped; TORCH_FR_BUFFER_SIZE sizes it); those collectives are left out of matching on every "
            "member"
        ),
    ]


def _real_view(dtype: str, numel: int) -> FrEntry:
    """A recorder entry of ``numel`` elements of the real ``dtype``."""
    size = {"float32": 4, "float64": 8}[dtype]
    return FrEntry(pg_name="0", seq=3, op="gloo:all_reduce", created_ns=1_500, numel=numel, dtype=dtype,
                   size_bytes=numel * size)  # fmt: skip


def test_a_complex_tensor_the_recorder_has_as_its_real_view_keeps_its_dtype_and_complex_element_count() -> (
    None
):
    # torch hands the process group view_as_real: 6 complex64 elements as 12 float32, 6 complex128 as 12
    # float64
    assert program_dtype("complex64", _real_view("float32", 12)) == ("complex64", 6)
    assert program_dtype("complex128", _real_view("float64", 12)) == ("complex128", 6)
    # no complex input seen, or an entry that is not that input's real view: the entry's as it is
    assert program_dtype("", _real_view("float32", 12)) == ("float32", 12)
    assert program_dtype("complex64", _real_view("float64", 12)) == ("float64", 12)
    assert program_dtype("complex128", _real_view("float32", 12)) == ("float32", 12)
    assert program_dtype("complex64", _real_view("float32", 7)) == ("float32", 7)  # no pairs of reals


def test_a_lean_call_of_a_complex_tensor_takes_its_group_and_bytes_from_the_entry_and_keeps_its_dtype() -> (
    None
):
    entries = parse_dump(json.dumps({"entries": [{**_entry("1", 5, 1_600), "thread_id": "77"}]}))
    (real,) = entries  # [4, 8] float32: 32 elements, 128 bytes
    call = replace(_lean(1_000, 2_000, ident=77), dtype="complex64")
    (out,), lost = resolve(entries, [call])
    assert lost == 0
    assert (out.pg_name, out.dtype, out.numel, out.size_bytes) == ("1", "complex64", real.numel // 2, 128)
