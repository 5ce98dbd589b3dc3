"""Receives from any source, captured end to end on 3 gloo ranks: the node names the rank that sent,
for a blocking ``recv`` (which returns it) and for an ``irecv`` (whose work knows it once completed), also
on a group whose ranks are not the global ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_helpers import profile_script

from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.store.validate import validate_run
from skewlens.profiler.vocab import Attr, NodeType

SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
pair = dist.new_group([1, 2])  # group ranks 0, 1 are global ranks 1, 2
w = torch.nn.Parameter(torch.randn(8, 8))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(5):
    (torch.randn(4, 8) @ w).sum().backward()
    if r == 1:
        dist.send(torch.ones(10), dst=0, tag=9)
        dist.send(torch.ones(3), dst=2, tag=4, group=pair)
        dist.send(torch.ones(5), dst=0, tag=6)
    elif r == 0:
        dist.irecv(torch.empty(10), tag=9).wait()  # any source
        dist.recv(torch.empty(5), tag=6)  # any source, blocking
    else:
        dist.irecv(torch.empty(3), tag=4, group=pair).wait()  # any source in the group
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_receive_from_any_source_names_the_rank_that_sent(tmp_path: Path) -> None:
    # an irecv without a source was recorded with comm_src -1: check refused the run (its sends
    # unmatched) and analyze and replay would not load it
    out, res = profile_script(tmp_path, SCRIPT, nproc=3)
    assert res.returncode == 0, res.stderr[-3000:]
    srcs = {}
    for r in (0, 2):
        recvs = [node_attrs(n) for _, n in iter_nodes(out / f"rank-{r}.et") if n.type == NodeType.COMM_RECV]
        assert recvs
        srcs[r] = {(a[Attr.COMM_TAG], a[Attr.COMM_SRC]) for a in recvs}
    assert srcs == {0: {(9, 1), (6, 1)}, 2: {(4, 1)}}
    report = validate_run(out)
    assert report.ok, [str(i) for i in report.errors]
