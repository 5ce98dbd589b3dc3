"""Ranks that torchrun did not start: ``torch.multiprocessing.spawn`` and ``multiprocessing.Process`` from
one ``python train.py`` (under the spawn or the fork method), each rank naming its own rank and world
size to ``init_process_group`` (no ``RANK`` or ``WORLD_SIZE`` in its environment, as under ``mp.spawn``,
``init_method="tcp://..."`` or a SLURM script's own mapping of ``SLURM_PROCID``).

Each script is a small DDP model on 2 gloo ranks whose rank 1 sleeps a known time at each step's start,
captured by ``skewlens profile -- python train.py``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.capture_helpers import ROOT

#: How long rank 1 sleeps at the start of each step.
SLEEP_MS = 150

LAUNCHED = """
import os, sys, time
import multiprocessing
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

PORT, STEPS, HOW = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def rank_main(rank, world):
    dist.init_process_group("gloo", init_method=INIT, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(SLEEP_MS / 1000)
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()

SLEEP_MS = int(sys.argv[4])
INIT = sys.argv[5] if len(sys.argv) > 5 else f"tcp://127.0.0.1:{PORT}"

if __name__ == "__main__":
    if HOW == "mp.spawn":
        torch.multiprocessing.spawn(rank_main, args=(2,), nprocs=2, join=True)
    else:  # multiprocessing.Process by hand, under that start method
        ctx = multiprocessing.get_context(HOW)
        procs = [ctx.Process(target=rank_main, args=(r, 2)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        sys.exit(max(p.exitcode for p in procs))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _profile(
    tmp_path: Path, how: str, *, steps: int, window: str, init: str = ""
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``skewlens profile --steps WINDOW -- python train.py`` of :data:`LAUNCHED` started ``how``, its
    process group initialised from ``init`` (else ``tcp://`` on a free port)."""
    script = tmp_path / "train.py"
    script.write_text(LAUNCHED)
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--steps", window,
        "--clock-timeout", "5", "--", sys.executable, str(script), str(_free_port()), str(steps), how,
        str(SLEEP_MS), *([init] if init else []),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    return out, proc


@pytest.mark.slow
def test_ranks_of_mp_spawn_that_end_inside_the_window_save_as_their_own_ranks(tmp_path: Path) -> None:
    # the window (steps 2-4) is still open when the ranks destroy their group and exit after 4 steps: each
    # saves at exit, when no process group says its rank, and mp.spawn set no RANK (before: both saved as
    # rank 0 of a world of 1, one over the other, and profile exited 0 with a run of one rank)
    out, proc = _profile(tmp_path, "mp.spawn", steps=4, window="1:1:3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert manifest["missing_ranks"] == []
    assert sorted({s["rank"] for s in manifest["steps"]}) == [0, 1]
    assert sorted(s["step"] for s in manifest["steps"] if s["rank"] == 1) == [2, 3]
    for rank in (0, 1):
        assert manifest["notes"][f"rank {rank}"].startswith("partial trace: saved 2 of 3 steps at exit")


@pytest.mark.slow
def test_ranks_forked_by_multiprocessing_wait_for_the_slow_rank_at_ddps_all_reduce(tmp_path: Path) -> None:
    from skewlens.analysis import analyze_run
    from skewlens.profiler.store import load_run

    # multiprocessing.Process under the fork method (Linux's default before Python 3.14): each rank is a
    # copy of the launcher, whose session began when it imported torch (before: the rank's main thread was
    # taken to be the launcher's, DDP's all_reduce another thread's, and rank 0's wait for rank 1 at the end
    # of backward compute: rank 1 was blamed under 1 ms a step, as a host gap, for its 150 ms sleeps)
    out, proc = _profile(tmp_path, "fork", steps=8, window="1:1:3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = analyze_run(load_run(out))
    waits = [b.exposed_wait_ns for b in result.breakdown if b.rank == 0]
    assert len(waits) == 3
    assert min(waits) > SLEEP_MS * 1_000_000 // 2
    assert result.blame is not None
    assert result.stragglers[0].rank == 1


@pytest.mark.slow
def test_ranks_forked_by_multiprocessing_that_end_inside_the_window_save_partial_traces(
    tmp_path: Path,
) -> None:
    # a forked process ends with os._exit, which runs no atexit hook (before: neither rank saved, and profile
    # exited 2 asking whether the program had run 3+ steps)
    out, proc = _profile(tmp_path, "fork", steps=4, window="1:1:3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["world_size"], manifest["missing_ranks"]) == (2, [])
    for rank in (0, 1):
        assert sorted(s["step"] for s in manifest["steps"] if s["rank"] == rank) == [2, 3]
        assert manifest["notes"][f"rank {rank}"].startswith("partial trace: saved 2 of 3 steps at exit")


@pytest.mark.slow
def test_ranks_of_one_host_joined_through_a_file_store_get_clock_offsets_under_a_millisecond(
    tmp_path: Path,
) -> None:
    from skewlens.analysis import analyze_run
    from skewlens.profiler.store import load_run

    # init_method="file://...": the job's store is a FileStore, whose wait looks for a key every 10 ms; the
    # clock exchange over it took up to half that for an offset between two ranks of one host (before: rank
    # 1 5.0 ms off, every all_reduce's member done before its peer began, and 30 ms sleeps blamed 5 ms)
    out, proc = _profile(tmp_path, "mp.spawn", steps=8, window="1:1:3", init=f"file://{tmp_path / 'store'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["clock_offsets_ns"]["0"] == 0
    assert abs(manifest["clock_offsets_ns"]["1"]) < 1_000_000
    result = analyze_run(load_run(out))
    assert not [n for n in result.notes if "clocks disagree" in n]
    assert result.stragglers[0].rank == 1
    waits = [b.exposed_wait_ns for b in result.breakdown if b.rank == 0]
    assert min(waits) > SLEEP_MS * 1_000_000 // 2
