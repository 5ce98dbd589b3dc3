"""Capture identity and ends, end to end on gloo ranks: one numbering per group on every member (also
when one rank's flight recorder wrapped), and collective ends inside the work that consumed them."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from capture_helpers import profile_script

from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import Attr, NodeType

DDP = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
if os.environ["RANK"] == "1":
    os.environ["TORCH_FR_BUFFER_SIZE"] = os.environ.get("SMALL_FR", os.environ["TORCH_FR_BUFFER_SIZE"])
dist.init_process_group("gloo")
net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
model = DistributedDataParallel(net, bucket_cap_mb=0.3)  # one bucket a layer
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(7):
    model(torch.randn(32, 256)).square().mean().backward()
    dist.broadcast(torch.ones(8), src=0)  # hooked
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""

DDP_MID_RUN = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
model = net
for step in range(6):
    if step == 3:  # inside the window: every collective before it went through the hooks
        model = DistributedDataParallel(net, process_group=dist.new_group([1, 0]), bucket_cap_mb=0.01)
    model(torch.randn(8, 64)).sum().backward()
    if step < 3:
        dist.all_reduce(net[0].weight.grad)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""

MESH = """
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import torch.distributed._functional_collectives as funcol
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
w = torch.nn.Parameter(torch.randn(256, 256) * 0.01)
opt = torch.optim.SGD([w], lr=1e-3)
big = torch.randn(128 * 1024)
for step in range(6):
    with torch.no_grad():
        pending = []
        for i in range(3):
            h = funcol.all_reduce(torch.randn(8, 256), "sum", tp)  # 8 KiB, consumed at once
            pending.append(funcol.all_reduce(big, "sum", dp))  # waited at the end of the step
            (h * 2).sum().item()
        for p in pending:
            p.sum().item()
    (torch.randn(64, 256) @ w).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
os._exit(0)  # torch 2.13 may abort at exit after gloo functional collectives; the trace is saved
"""


def _run(tmp_path: Path, text: str, nproc: int, env: dict[str, str] | None = None) -> Path:
    out, res = profile_script(tmp_path, text, nproc=nproc, steps="1:1:4", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _collectives(out: Path, rank: int) -> list[dict]:
    nodes = read_et(out / f"rank-{rank}.et").nodes
    return sorted(
        (node_attrs(n) for n in nodes if n.type == NodeType.COMM_COLL), key=lambda a: a[Attr.START_NS]
    )


def _ends_inside_steps(out: Path) -> None:
    m = read_manifest(out)
    for r in m.ranks:
        steps = {s.step: s for s in m.steps if s.rank == r}
        for a in _collectives(out, r):
            if a[Attr.OP] == "gloo:all_reduce":
                assert a[Attr.DUR_NS] > 0, (r, a)
                assert a[Attr.START_NS] + a[Attr.DUR_NS] <= steps[a[Attr.STEP]].end_ns, (r, a)


@pytest.mark.slow
def test_ddp_ends_inside_their_step_and_a_wrapped_recorder_is_declared_alike_for_every_member(
    tmp_path: Path,
) -> None:
    out = _run(tmp_path, DDP, 2, env={"SMALL_FR": "12"})  # rank 1 keeps 12 entries: 5 collectives a step
    _ends_inside_steps(out)
    m = read_manifest(out)
    (lost,) = m.lost_collectives  # one range for the group, whichever rank lost it
    assert lost.pg_name == "0" and lost.ranks == (1,) and lost.first_seq == 1 and lost.steps
    report = validate_run(out)
    assert report.ok, [str(i) for i in report.errors]  # no mismatch: the lost range is left out
    assert report.run is not None and report.run.incomplete_steps == lost.steps
    ids = {r: {(a[Attr.PG_NAME], a[Attr.SEQ]) for a in _collectives(out, r)} for r in (0, 1)}
    assert ids[1] <= ids[0]  # what both have carries the same (group, seq) on both
    assert all(not lost.covers(q) for _, q in ids[1])
    assert "wrapped" in m.notes["rank 1 lost calls"] and "rank 0 lost calls" not in m.notes


@pytest.mark.slow
def test_a_ddp_model_built_inside_the_window_has_its_all_reduces_ended(tmp_path: Path) -> None:
    # every collective before the window went through the hooks, so gloo's worker events were not
    # recorded, and the all_reduces of a DDP model built inside the window had no end (duration 0)
    out = _run(tmp_path, DDP_MID_RUN, 2)
    _ends_inside_steps(out)
    for r in (0, 1):
        ddp = [a for a in _collectives(out, r) if a[Attr.OP] == "gloo:all_reduce" and a[Attr.STEP] >= 3]
        assert len(ddp) >= 2, (r, ddp)  # two buckets a step at least
    report = validate_run(out)
    assert report.ok and not [i for i in report.warnings if i.kind == "no-end"], [
        str(i) for i in report.issues
    ]


@pytest.mark.slow
def test_functional_all_reduces_on_a_2x2_mesh_end_before_their_consumer(tmp_path: Path) -> None:
    out = _run(tmp_path, MESH, 4)
    _ends_inside_steps(out)
    assert validate_run(out).ok
    for r in range(4):
        tp = [a for a in _collectives(out, r) if a[Attr.COMM_SIZE] == 8 * 1024]
        assert len(tp) == 3 * 4
        for a, b in itertools.pairwise(tp):  # consumed (.item()) before the next one is issued
            if a[Attr.STEP] == b[Attr.STEP]:
                assert a[Attr.START_NS] + a[Attr.DUR_NS] <= b[Attr.START_NS], (r, a, b)
