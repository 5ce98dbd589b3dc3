"""Collectives whose members move different amounts, captured end to end on 2-3 gloo ranks: an
``all_to_all_single`` with uneven splits records what each rank sends to and receives from the others
(``skl_send_bytes`` / ``skl_recv_bytes``, and per member ``skl_send_splits`` / ``skl_recv_splits``), on the
lean path (collectives level) and the full one (full level), and a real replay re-issues those splits;
gloo's ``monitored_barrier`` is a barrier."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from capture_helpers import profile

from skewlens.profiler.chakra_io import iter_nodes, node_attrs
from skewlens.profiler.store.validate import load_validated
from skewlens.profiler.vocab import Attr, CommType, NodeType
from skewlens.replay.config import RealConfig
from skewlens.replay.effects import NO_EFFECTS
from skewlens.replay.lower import collective_bytes
from skewlens.replay.real.api import real_replay


def _a2a_script(
    splits: list[list[int]], *, steps: int, even: int, barrier: bool, ranks: list[int] | None = None
) -> str:
    """A training loop whose every step runs an uneven all_to_all_single (``splits[i][j]``: rows rank i
    sends to rank j, a row 2 float32, 8 bytes), an even one of ``even`` floats, and (``barrier``) a
    monitored_barrier; on a group of ``ranks`` in that order (``sort_ranks=False``; i, j its group ranks)
    where given, else the default group."""
    return f"""
import torch, torch.distributed as dist
dist.init_process_group("gloo")
g = dist.new_group({ranks!r}, sort_ranks=False) if {ranks!r} else None
r = dist.get_rank(g)
splits = {splits!r}
w = torch.nn.Parameter(torch.randn(8, 8))
opt = torch.optim.SGD([w], lr=1e-3)
for step in range({steps}):
    (torch.randn(4, 8) @ w).sum().backward()
    opt.step()
    opt.zero_grad()
    out = torch.empty(sum(s[r] for s in splits), 2)
    dist.all_to_all_single(out, torch.ones(sum(splits[r]), 2), [s[r] for s in splits], splits[r], group=g)
    dist.all_to_all_single(torch.empty({even}), torch.ones({even}), group=g)  # even
    {"dist.monitored_barrier()" if barrier else "pass"}
dist.destroy_process_group()
"""


SCRIPT = _a2a_script([[10, 300], [200, 5]], steps=6, even=8, barrier=True)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["collectives", "full"])
def test_uneven_splits_and_monitored_barriers_are_captured_as_they_ran(tmp_path: Path, level: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    res = profile(tmp_path / "run", level=level, steps="1:1:3", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    run = load_validated(tmp_path / "run")
    # rank 0 sends 300 rows (2,400 B) to rank 1 and gets 200 (1,600 B); its 10 rows to itself stay
    want = {0: (2400, 1600), 1: (1600, 2400)}
    uneven = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL and c.comm_bytes != (32, 32)]
    even = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL and c.comm_bytes == (32, 32)]
    assert len(uneven) == len(even) == 3
    for c in uneven:
        assert c.comm_bytes == (310 * 8, 205 * 8)
        for r, row in zip(c.ranks, c.rows, strict=True):
            rt = run.ranks[r]
            assert rt.send_bytes is not None and rt.recv_bytes is not None
            assert (int(rt.send_bytes[row]), int(rt.recv_bytes[row])) == want[r]
        # the busiest port carries 2,400 B: S = 2,400 * p / (p - 1) for the cost formulas (before: 2,480)
        assert collective_bytes(run, c) == 4800
    for c in even:
        sent = [run.ranks[r].send_bytes for r in c.ranks]
        assert [int(s[w]) for s, w in zip(sent, c.rows, strict=True) if s is not None] == [-1, -1]
        assert collective_bytes(run, c) == 32
    # and per member, in group-rank order, its own chunk included
    lists = {
        r: {str(m[3:]) for m in moved if m[1] is not None} for r, moved in _moved(tmp_path / "run", 2).items()
    }
    assert lists == {0: {"([80, 2400], [80, 1600])"}, 1: {"([1600, 40], [2400, 40])"}}
    barriers = [c for c in run.collectives if c.comm_type == CommType.BARRIER]
    assert len(barriers) == 3
    for c in barriers:
        names = {run.ranks[r].name(w) for r, w in zip(c.ranks, c.rows, strict=True)}
        assert names == {"c10d::monitored_barrier"}
        assert all(
            run.ranks[r].node_type[w] == NodeType.COMM_COLL for r, w in zip(c.ranks, c.rows, strict=True)
        )


REPLAYED = _a2a_script([[10, 30000, 5000], [200, 5, 7000], [1, 2, 3]], steps=5, even=12, barrier=False)


def _moved(run_dir: Path, ranks: int = 3) -> dict[int, list[tuple[object, ...]]]:
    """Per rank, each all_to_all's (comm_size, skl_send_bytes, skl_recv_bytes, skl_send_splits,
    skl_recv_splits) in file order."""
    out: dict[int, list[tuple[object, ...]]] = {}
    for r in range(ranks):
        nodes = [node_attrs(n) for _o, n in iter_nodes(run_dir / f"rank-{r}.et")]
        out[r] = [
            tuple(
                a.get(k)
                for k in ("comm_size", Attr.SEND_BYTES, Attr.RECV_BYTES, Attr.SEND_SPLITS, Attr.RECV_SPLITS)
            )
            for a in nodes
            if a.get("comm_type") == CommType.ALL_TO_ALL
        ]
    return out


@pytest.mark.slow
def test_a_real_replay_moves_exactly_the_bytes_each_rank_sent_to_each_other(tmp_path: Path) -> None:
    # before: every rank sent equal parts of its bytes; re-captured, rank 0 sent 186,720 B to the others
    # instead of 280,000 B and rank 1 received 93,376 B instead of 240,016 B
    script = tmp_path / "train.py"
    script.write_text(REPLAYED)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3", str(script)]
    res = profile(tmp_path / "run", steps="1:1:3", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    before = _moved(tmp_path / "run")
    assert before[0][0] == (280_080, 280_000, 1_608, [80, 240_000, 40_000], [80, 1_600, 8])
    assert before[1][0][1:3] == (57_600, 240_016)
    real_replay(
        run_dir=tmp_path / "run", out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=RealConfig(timeout_s=20)
    )
    assert _moved(tmp_path / "out" / "run") == before


@pytest.mark.slow
def test_a_real_replay_keeps_the_group_rank_order_of_a_group_made_with_unsorted_ranks(tmp_path: Path) -> None:
    # new_group([1, 0], sort_ranks=False): group rank 0 is global rank 1. Before, skewlens check refused
    # the capture (corrupt all_to_all splits: the store took the members sorted), and a real replay that
    # got past it re-created the group sorted, so each rank's split list went to the other peer
    script = tmp_path / "train.py"
    script.write_text(_a2a_script([[10, 300], [200, 5]], steps=5, even=8, barrier=False, ranks=[1, 0]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    res = profile(tmp_path / "run", steps="1:1:3", command=cmd)
    assert res.returncode == 0, res.stderr[-3000:]
    load_validated(tmp_path / "run")  # strict: the splits are consistent with the group's order
    before = _moved(tmp_path / "run", 2)
    # global rank 1 (group rank 0) keeps 80 B and sends 2,400 B to global rank 0 (group rank 1)
    assert before[1][0] == (2480, 2400, 1600, [80, 2400], [80, 1600])
    assert before[0][0] == (1640, 1600, 2400, [1600, 40], [2400, 40])
    real_replay(
        run_dir=tmp_path / "run", out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=RealConfig(timeout_s=20)
    )
    assert _moved(tmp_path / "out" / "run", 2) == before
