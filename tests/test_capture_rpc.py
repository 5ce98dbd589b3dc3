"""A program that uses ``torch.distributed.rpc`` beside its process groups, captured (one-rank gloo jobs in a
fresh process, TensorPipe started for real: slow tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from capture_helpers import ONE_GLOO_RANK

from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.manifest import RPC_NOTE, RankNote, rank_note_key, read_manifest
from skewlens.profiler.store import load_run
from skewlens.profiler.store.issues import run_notes
from skewlens.profiler.store.validate import validate_run

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

#: One rank that starts RPC inside the capture (hooked, as under `skewlens profile`), and in each of 4 steps
#: calls itself and runs one all_reduce of 8 floats.
_RPC_LOOP = """
import torch.distributed.rpc as rpc
from skewlens.profiler.capture import capture
with capture(sys.argv[1], steps="0:1:2") as cap:
    rpc.init_rpc("w0", rank=0, world_size=1)  # hooked, as under `skewlens profile`
    for i in range(4):
        rpc.rpc_sync("w0", torch.add, args=(torch.ones(2), 1))
        dist.all_reduce(torch.ones(8))
        cap.step()
rpc.shutdown()
dist.destroy_process_group()
"""


def _capture(run: Path, body: str) -> None:
    """Run ``ONE_GLOO_RANK`` + ``body``, which captures into ``run``; it must succeed."""
    res = subprocess.run(
        [sys.executable, "-c", ONE_GLOO_RANK + body, str(run)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]


def test_init_rpc_under_capture_runs_and_the_programs_collectives_are_still_recorded(tmp_path: Path) -> None:
    # before: init_rpc (TensorPipe) runs all_gather_object on a bare ProcessGroupGloo of its own, and the
    # hook read its ``group_name``, which a backend has not: every rank of a parameter-server job died in
    # init_rpc with AttributeError under `skewlens profile` (4 gloo ranks, torch 2.13)
    run = tmp_path / "run"
    _capture(run, _RPC_LOOP)
    colls = [
        (n.name, int(node_attrs(n)["comm_size"]))
        for _o, n in iter_nodes(run / "rank-0.et")
        if node_attrs(n).get("comm_type") is not None
    ]
    # steps 1 and 2: one all_reduce of 8 floats each; init_rpc's own all_gather_object is none of them
    assert colls == [("c10d::allreduce_", 32), ("c10d::allreduce_", 32)]


def test_a_rank_that_ran_rpc_is_noted_as_such_and_check_and_analyze_say_so_once(tmp_path: Path) -> None:
    # before: nothing said RPC was not recorded. On 4 gloo ranks whose parameter server slept 15 ms in
    # each RPC handler, analyze blamed trainer 2 for `compute grew: compute +44.7 ms` (collectives
    # level): its waits for the server's replies, read as its own compute, with no word of RPC
    run = tmp_path / "run"
    _capture(run, _RPC_LOOP)
    assert read_manifest(run).notes[rank_note_key(0, RankNote.RPC)] == RPC_NOTE
    assert [(i.kind, i.message) for i in validate_run(run).warnings] == [
        ("capture-note", f"rank 0: {RPC_NOTE}")
    ]
    said = run_notes(load_run(run))
    assert [n for n in said if "torch.distributed.rpc" in n] == [f"rank 0: {RPC_NOTE}"]


def test_a_rank_that_never_ran_rpc_has_no_rpc_note(tmp_path: Path) -> None:
    run = tmp_path / "run"
    body = _RPC_LOOP.replace('    rpc.init_rpc("w0", rank=0, world_size=1)', "").replace("rpc.shutdown()", "")
    body = body.replace('        rpc.rpc_sync("w0", torch.add, args=(torch.ones(2), 1))\n', "")
    _capture(run, body)
    assert rank_note_key(0, RankNote.RPC) not in read_manifest(run).notes
