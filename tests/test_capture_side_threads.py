"""Collectives a training program issues from a second Python thread on a group of its own (a metrics
thread's all_reduce of loss counters), captured for real on 2 gloo ranks: whose thread they are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from capture_helpers import profile_script

from skewlens.profiler.store import load_run
from skewlens.profiler.vocab import NodeType

pytestmark = pytest.mark.slow

#: DDP on 2 gloo ranks with a metrics thread that all_reduces each step's loss on a group of its own once
#: the main thread has finished the step. On rank 1 that thread sleeps 400 ms before the all_reduce of step
#: 3, so rank 0's thread is inside it when its window (steps 2-4) closes: the hooks never see that call
#: return, and the flight recorder alone has it. Each rank writes its metrics thread's native id and the
#: group's name to ``$SIDE_FILE.<rank>``.
METRICS_THREAD = """
import json, os, queue, threading, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
side = dist.new_group(backend="gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
todo = queue.Queue()
info = {}

def metrics():
    info["thread"] = threading.get_native_id()
    while (step := todo.get()) is not None:
        if rank == 1 and step == 3:
            time.sleep(0.4)
        dist.all_reduce(torch.tensor([float(step), 1.0]), group=side)

t = threading.Thread(target=metrics, name="metrics")
t.start()
for step in range(6):
    loss = model(torch.randn(8, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    todo.put(step)
todo.put(None)
t.join()
info["group"] = dist.distributed_c10d._get_process_group_name(side)
with open(os.environ["SIDE_FILE"] + f".{rank}", "w") as f:
    json.dump(info, f)
dist.barrier()
dist.destroy_process_group()
"""


def test_a_metrics_threads_collectives_stay_on_its_own_thread_and_the_training_on_the_main_one(
    tmp_path: Path,
) -> None:
    side_file = tmp_path / "side.json"
    run_dir, proc = profile_script(
        tmp_path, METRICS_THREAD, nproc=2, steps="1:1:3", level="ops", env={"SIDE_FILE": str(side_file)}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(Path(f"{side_file}.0").read_text())
    run = load_run(run_dir)
    rt = run.ranks[0]
    names = [rt.names[k] for k in rt.name_idx]
    on_side = np.flatnonzero(
        (rt.node_type == NodeType.COMM_COLL) & (rt.pg == run.pg_names.index(info["group"]))
    )
    *hooked, last = on_side.tolist()
    # the hooked calls of the metrics thread (steps 1 and 2's, issued in steps 2 and 3; on a loaded machine
    # the thread may lag, so one of them may fall outside the window): one stream, with nothing of the main
    # thread's on it (before: DDP's c10d::allreduce_ on the main thread started inside those calls, so
    # Kineto's main thread was taken for the metrics thread, and every training operator went to the
    # metrics thread's stream)
    assert hooked and {names[i] for i in hooked} == {"c10d::allreduce_"}
    assert len(hooked) <= 2
    (side_stream,) = {int(rt.stream[i]) for i in hooked}
    training = [
        i for i, n in enumerate(names) if n.startswith(("DistributedDataParallel.forward", "Optimizer."))
    ]
    assert len(training) >= 6
    (main_stream,) = {int(rt.stream[i]) for i in training}
    assert main_stream != side_stream
    assert set(np.flatnonzero(rt.stream == side_stream).tolist()) == set(hooked)
    # step 3's, which the metrics thread was still in when the window closed: the flight recorder's alone,
    # issued by that thread after its last call (before: by the main thread's last row)
    assert rt.step[last] == 4
    issuers = rt.dep_idx[rt.dep_ptr[last] : rt.dep_ptr[last + 1]].tolist()
    assert issuers == [hooked[-1]]


#: A program that trains on a thread of its own (the main thread starts it and waits): its optimizer.step()
#: marks the steps from that thread, which issues the gradient all_reduce too.
TRAINER_THREAD = """
import threading
import torch, torch.distributed as dist

dist.init_process_group("gloo")

def train():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 64))
    opt = torch.optim.SGD([w], lr=0.01)
    for step in range(6):
        (torch.randn(8, 64) @ w).pow(2).mean().backward()
        dist.all_reduce(w.grad)
        opt.step()
        opt.zero_grad()

t = threading.Thread(target=train, name="trainer")
t.start()
t.join()
dist.barrier()
dist.destroy_process_group()
"""


def test_a_program_training_on_a_thread_of_its_own_keeps_its_operators_beside_its_collectives(
    tmp_path: Path,
) -> None:
    run_dir, proc = profile_script(tmp_path, TRAINER_THREAD, nproc=2, steps="1:1:3", level="ops")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rt = load_run(run_dir).ranks[0]
    names = [rt.names[k] for k in rt.name_idx]
    calls = np.flatnonzero(rt.node_type == NodeType.COMM_COLL).tolist()
    (trainer,) = {int(rt.stream[i]) for i in calls}
    optimizer = [i for i, n in enumerate(names) if n.startswith("Optimizer.")]
    assert len(optimizer) >= 3
    # before: the marks' Kineto thread was paired with the session's main thread, which only waits, so
    # every training operator went to its stream and the trainer's stream held its calls alone
    assert {int(rt.stream[i]) for i in optimizer} == {trainer}
