"""A program that uses ``torch.distributed.rpc`` beside its process groups, captured (one-rank gloo jobs in a
fresh process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from capture_helpers import ONE_GLOO_RANK

from skewlens.profiler.chakra_io import iter_nodes, node_attrs

ROOT = Path(__file__).resolve().parents[1]


def test_init_rpc_under_capture_runs_and_the_programs_collectives_are_still_recorded(tmp_path: Path) -> None:
    # before: init_rpc (TensorPipe) runs all_gather_object on a bare ProcessGroupGloo of its own, and the
    # hook read its ``group_name``, which a backend has not: every rank of a parameter-server job died in
    # init_rpc with AttributeError under `skewlens profile` (4 gloo ranks, torch 2.13)
    run = tmp_path / "run"
    body = """
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
    res = subprocess.run(
        [sys.executable, "-c", ONE_GLOO_RANK + body, str(run)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    colls = [
        (n.name, int(node_attrs(n)["comm_size"]))
        for _o, n in iter_nodes(run / "rank-0.et")
        if node_attrs(n).get("comm_type") is not None
    ]
    # steps 1 and 2: one all_reduce of 8 floats each; init_rpc's own all_gather_object is none of them
    assert colls == [("c10d::allreduce_", 32), ("c10d::allreduce_", 32)]
