"""Communication written by hand (a ring all-reduce of isend/irecv), captured on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from skewlens.profiler.store import load_run
from skewlens.replay.execution import UNBLOCKED_WAIT_NS, execution_model, model_ends

#: Each step: a ring all-reduce of 4 MiB on 2 ranks, one exchange per phase (reduce-scatter, all-gather):
#: isend the chunk to the other rank, irecv the other's, wait for the recv, then for the send. Rank 0 issues
#: 3 ms after rank 1, so its recv's wait begins after both ops of rank 1's send were issued and blocks for
#: the transfer (without it, on a loaded machine, a late return of the other rank's isend call once put every
#: wait before the pair's last issue, and the test checked no pair). This capture checks the rule on a real
#: run; it passes on the code before the rule as well (that code then completed none of these pairs early),
#: and the synthetic exchanges in test_execution_model.py are what fail there.
RING_SCRIPT = r"""
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
w = torch.nn.Parameter(torch.randn(1 << 20))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range(5):
    opt.zero_grad()
    (w * 2).sum().backward()
    chunks = list(w.grad.chunk(world))
    recv = torch.empty_like(chunks[0])
    for phase in range(2):
        if rank == 0:
            time.sleep(0.003)
        si = (rank + 1 - phase) % world
        ri = (si - 1) % world
        s = dist.isend(chunks[si].contiguous(), (rank + 1) % world, tag=phase)
        r = dist.irecv(recv, (rank - 1) % world, tag=phase)
        r.wait()
        s.wait()
        chunks[ri].add_(recv) if phase == 0 else chunks[ri].copy_(recv)
    opt.step()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_ring_exchanges_recv_is_not_done_before_a_wait_that_blocked_on_it_after_both_were_issued(
    tmp_path: Path,
) -> None:
    """Each rank waits for its send without blocking, the transfer having run while it was blocked on its
    recv. A recv's wait that began after both ops were issued and before the send's recorded end, and
    blocked, was waiting for that pair: the model may not complete the pair before the wait began. Before,
    it completed when both were issued, and the wait's blocking became work of its own (half the pairs of a
    2-rank capture of 128 KiB chunks, 41.6 ms over 4 steps)."""
    from capture_helpers import profile_script

    out, res = profile_script(tmp_path, RING_SCRIPT, nproc=2, level="ops")
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_run(out)
    em = execution_model(run)
    ends = {r: model_ends(run, r) for r in run.ranks}
    checked = 0
    for g in em.syncs:
        if not g.is_p2p:
            continue
        assert all(run.ranks[r].comm_bytes[w] == 2 << 20 for r, w in zip(g.ranks, g.rows, strict=True))
        recorded = {
            r: int(run.ranks[r].start_ns[w] + run.ranks[r].dur_ns[w])
            for r, w in zip(g.ranks, g.rows, strict=True)
        }
        both = max(
            max(int(run.ranks[r].start_ns[w]), int(run.ranks[r].return_ns[w]))
            for r, w in zip(g.ranks, g.rows, strict=True)
            if run.ranks[r].return_ns is not None
        )
        for r, w in zip(g.ranks, g.rows, strict=True):
            rt, m = run.ranks[r], em.ranks[r]
            if rt.name(w) != "c10d::recv_":
                continue
            first = min(m.wait_dst[m.wait_src == w], key=lambda k: int(rt.start_ns[k]))
            other = min(e for rr, e in recorded.items() if rr != r)
            if both <= rt.start_ns[first] < other and rt.dur_ns[first] > UNBLOCKED_WAIT_NS:
                checked += 1
                assert ends[r][w] >= rt.start_ns[first], (r, w)
    assert checked >= 1  # 2 exchanges a step, 3 steps: a recv waited for after both ranks had issued
