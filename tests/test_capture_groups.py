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
from capture_helpers import ONE_GLOO_RANK

from skewlens.profiler.capture import session
from skewlens.profiler.capture.session import CaptureSession
from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.manifest import ProcessGroupInfo
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
    assert manifest["notes"] == {}
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
