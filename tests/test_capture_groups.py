"""Process groups a program makes and unmakes while it is captured: what the trace and the manifest say
of them (one-rank gloo jobs in a fresh process, with the flight recorder on as ``skewlens profile`` turns
it on)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from capture_helpers import ONE_GLOO_RANK, profile_script

from skewlens.profiler.capture import session
from skewlens.profiler.capture.session import CaptureSession, groups_made_note
from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.manifest import ProcessGroupInfo, RankNote, rank_note_key
from skewlens.profiler.vocab import Attr

ROOT = Path(__file__).resolve().parents[1]

ONE_RANK = ONE_GLOO_RANK + "from skewlens.profiler.capture import capture\n"


def _capture(tmp_path: Path, body: str) -> Path:
    """Run ``ONE_RANK`` + ``body`` (which captures into ``sys.argv[1]``); the run directory."""
    run = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-c", ONE_RANK + body, str(run)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def _collectives(run: Path) -> list[tuple[str, str, int, int]]:
    """Rank 0's collectives: (name, group, sequence number, bytes), in file order."""
    out = []
    for _o, n in iter_nodes(run / "rank-0.et"):
        a = node_attrs(n)
        if a.get("comm_type") is not None:
            out.append((n.name, str(a.get("pg_name")), int(a.get(Attr.SEQ, -1)), int(a.get("comm_size", -1))))
    return out


def test_a_group_destroyed_inside_the_window_keeps_its_members_and_its_collectives_their_numbers(
    tmp_path: Path,
) -> None:
    # before: the manifest listed only the groups alive at a step's end or the save, so a group made and
    # destroyed within a step was unknown; the flight recorder's entries were then not matched to the
    # hooked calls, and each all_reduce on it was in the trace twice: the hooked call with sequence
    # number -1, and the recorder's entry as a collective issued outside the Python API (and noted so)
    run = _capture(
        tmp_path,
        """
with capture(sys.argv[1], steps="0:1:2") as cap:
    for i in range(4):
        tmp = dist.new_group([0])
        dist.all_reduce(torch.ones(5 + i), group=tmp)
        dist.destroy_process_group(tmp)
        dist.all_reduce(torch.ones(2))
        cap.step()
dist.destroy_process_group()
""",
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert [(g["name"], g["ranks"]) for g in manifest["process_groups"]] == [
        ("0", [0]), ("1", [0]), ("2", [0]), ("3", [0]),
    ]  # fmt: skip
    # the two groups made in the recorded steps, noted (their creation's time is host time)
    assert list(manifest["notes"]) == ["rank 0 process groups made"]
    assert manifest["notes"]["rank 0 process groups made"].startswith(
        "2 process group(s) created inside the window ('2', '3'), "
    )
    # steps 1 and 2 are recorded: groups '2' and '3', each with its one all_reduce (the recorder's first)
    assert _collectives(run) == [
        ("c10d::allreduce_", "2", 1, 24),
        ("c10d::allreduce_", "0", 2, 8),
        ("c10d::allreduce_", "3", 1, 28),
        ("c10d::allreduce_", "0", 3, 8),
    ]


def test_a_step_mark_reads_the_process_groups_only_when_they_have_changed(tmp_path: Path) -> None:
    # before: every recorded step's end read each live group's members and backend again (5-14 µs of CPU a
    # step on 2 gloo ranks, a third of a cap.step() after a decode step's collectives), though a group's
    # members never change and every destroy is hooked; the groups made later must still be listed
    run = _capture(
        tmp_path,
        """
from skewlens.profiler.capture import session
reads = []
read = session._group_info
session._group_info = lambda pg: (reads.append(str(pg.group_name)), read(pg))[1]
with capture(sys.argv[1], steps="0:1:60") as cap:
    for i in range(30):
        dist.all_reduce(torch.ones(2))
        cap.step()
    tmp = dist.new_group([0])
    for i in range(20):
        dist.all_reduce(torch.ones(3), group=tmp)
        cap.step()
    dist.destroy_process_group(tmp)
    tmp = dist.new_group([0])
    for i in range(5):
        dist.all_reduce(torch.ones(4), group=tmp)
        cap.step()
json.dump(reads, open(sys.argv[1] + ".reads", "w"))
dist.destroy_process_group()
""",
    )
    reads = json.loads(Path(f"{run}.reads").read_text())
    # read at the first recorded step and after each change (a new group; a destroy), not at each of the
    # 55 recorded steps' ends: ['0', '0', '1', '0', '2']
    assert (reads.count("0"), reads.count("1"), reads.count("2")) == (3, 1, 1), reads
    manifest = json.loads((run / "manifest.json").read_text())
    groups = [(g["name"], g["ranks"]) for g in manifest["process_groups"]]
    assert groups == [("0", [0]), ("1", [0]), ("2", [0])]
    assert {c[1] for c in _collectives(run)} == {"0", "1", "2"}


class _Group:
    """A stand-in process group: its name, or what reading it raises (one being created or destroyed)."""

    def __init__(self, name: str) -> None:
        self.name, self.fails = name, False


def _groups_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, live: list[_Group]) -> CaptureSession:
    """A session whose process groups are ``live`` (as torch lists them) and read by name."""
    import torch.distributed as dist

    def info(pg: _Group) -> ProcessGroupInfo:
        if pg.fails:
            raise KeyError(pg.name)
        return ProcessGroupInfo(name=pg.name, ranks=(0,), desc="", backend="gloo")

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.distributed_c10d, "_world", SimpleNamespace(pg_names=live))
    monkeypatch.setattr(session, "_group_info", info)
    return CaptureSession(tmp_path / "run")


def test_a_group_that_could_not_be_read_is_read_again_at_the_next_step_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    live = [_Group("0"), _Group("1")]
    cap = _groups_session(monkeypatch, tmp_path, live)
    live[1].fails = True  # being created at this step's end
    assert [g.name for g in cap._groups()] == ["0"]
    live[1].fails = False
    assert [g.name for g in cap._groups()] == ["0", "1"]  # the same groups, but one was not read


def test_after_a_destroy_the_groups_are_read_again_though_a_new_one_took_the_gone_ones_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    live = [_Group("0"), _Group("1")]
    cap = _groups_session(monkeypatch, tmp_path, live)
    assert [g.name for g in cap._groups()] == ["0", "1"]
    cap._group_destroyed()
    live[1].name = "2"  # group 1 destroyed, group 2 made at its address (the same id())
    assert [g.name for g in cap._groups()] == ["0", "1", "2"]


def test_the_groups_a_rank_made_inside_the_window_are_noted_with_the_time_their_creation_took(
    tmp_path: Path,
) -> None:
    # before: a group made inside the window left no trace of its creation, whose barrier is a wait for
    # the late ranks that no collective records; the manifest said nothing of the time it took
    run = _capture(
        tmp_path,
        """
with capture(sys.argv[1], steps="1:0:3") as cap:
    for i in range(4):
        tmp = dist.new_group([0])
        sub, _ = dist.new_subgroups(group_size=1)
        dist.all_reduce(torch.ones(2), group=tmp)
        dist.destroy_process_group(tmp)
        cap.step()
dist.destroy_process_group()
""",
    )
    notes = json.loads((run / "manifest.json").read_text())["notes"]
    note = notes[rank_note_key(0, RankNote.GROUPS_MADE)]
    # step 0 waits (groups '1', '2' not counted); steps 1 to 3 made '3' to '8' (new_group's, new_subgroups')
    assert note.startswith("6 process group(s) created inside the window ('3', '4', '5', ... 3 more), "), note


def test_the_note_of_the_groups_made_names_a_group_of_other_ranks_as_such_and_sums_their_times() -> None:
    # new_group hands a rank that is not a member no group: its name is not known there
    note = groups_made_note([("3", 1_000_000), ("", 2_500_000)])
    made = "2 process group(s) created inside the window ('3', one of other ranks), 3.5 ms in their creation"
    assert note.startswith(made), note


SLEEP_BEFORE_NEW_GROUP = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    model(torch.ones(2, 4)).sum().backward()
    if rank == 1:
        time.sleep(0.05)
    g = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(3), group=g)
    dist.destroy_process_group(g)
    opt.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_ranks_wait_in_new_group_for_a_late_peer_is_in_its_note_of_the_groups_it_made(
    tmp_path: Path,
) -> None:
    # 2 gloo ranks, rank 1 sleeping 50 ms before each step's new_group: rank 0 waits there for it, a wait
    # no collective records (before: nothing said so; the analyses blamed rank 1 for none of it)
    run, proc = profile_script(tmp_path, SLEEP_BEFORE_NEW_GROUP, nproc=2, steps="1:1:3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = json.loads((run / "manifest.json").read_text())["notes"]
    for rank in (0, 1):
        note = notes[rank_note_key(rank, RankNote.GROUPS_MADE)]
        assert note.startswith("3 process group(s) created inside the window ('"), note
    waited = notes[rank_note_key(0, RankNote.GROUPS_MADE)].split("), ")[1].split(" ms")[0]
    assert float(waited) >= 3 * 50, notes  # each of the 3 recorded steps' creations waited out the sleep
