"""Running the bundled example under ``skewlens profile`` for real (gloo ranks on the CPU), for the tests."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import psutil

from skewlens.profiler.store.model import RankTrace

if TYPE_CHECKING:
    from skewlens.analysis import AnalysisResult
    from skewlens.analysis.skew import SkewEvent
    from skewlens.profiler.store.model import RunTrace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"

#: The start of a script run in a fresh process: one gloo rank (a job of its own on a free port), with the
#: flight recorder on as ``skewlens profile`` turns it on.
ONE_GLOO_RANK = r"""
import json, os, socket, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "1000"
import torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
"""


def stalled_ddp_script(loop: str) -> str:
    """A 2-rank DDP training script (gloo, a 3-layer MLP, SGD) around ``loop``, the training loop, which on
    rank 1 sets ``side`` to when it stalled (``start_ns``, ``end_ns``); the script writes ``side`` to the file
    ``SIDE_FILE`` names, which the checks compare with."""
    return f"""
import json, os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
side = {{}}
{loop}
if rank == 1:
    with open(os.environ["SIDE_FILE"], "w") as f:
        json.dump(side, f)
dist.destroy_process_group()
"""


def profile_stalled(tmp_path: Path, script: str) -> tuple[Path, dict[str, int]]:
    """Profile a :func:`stalled_ddp_script` at ``ops`` on 2 gloo ranks (steps 2-7 of its 8), which must
    succeed (:func:`profile_stalled_script`): the run directory and when rank 1 stalled (``start_ns``,
    ``end_ns``)."""
    run_dir, (start_ns, end_ns) = profile_stalled_script(tmp_path, script, steps="1:1:6")
    return run_dir, {"start_ns": start_ns, "end_ns": end_ns}


def stalled_event(
    tmp_path: Path, script: str, step: int
) -> tuple[Path, int, RunTrace, AnalysisResult, SkewEvent]:
    """:func:`profile_stalled`, then ``skewlens analyze``'s reading of it: the run directory, how long rank 1
    stalled, the run, the analysis and the one collective of ``step``."""
    from skewlens.analysis import analyze_run
    from skewlens.profiler.store import load_run

    run_dir, side = profile_stalled(tmp_path, script)
    run = load_run(run_dir)
    result = analyze_run(run)
    (at,) = [e for e in result.skew.events if e.kind == "collective" and e.step == step]
    return run_dir, side["end_ns"] - side["start_ns"], run, result, at


def profile(
    out: Path,
    *train_args: str,
    level: str = "collectives",
    steps: str = "1:1:3",
    nproc: int = 2,
    command: list[str] | None = None,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    script: Path = EXAMPLE,
) -> subprocess.CompletedProcess[str]:
    """``skewlens profile --out OUT ... -- torchrun --nproc-per-node N SCRIPT ARGS`` (the bundled example
    unless ``script``)."""
    cmd = [
        sys.executable, "-m", "skewlens", "profile", "--out", str(out), "--level", level, "--steps", steps,
        "--clock-timeout", "5", *flags, "--",
    ]  # fmt: skip
    cmd += command or [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(script), *train_args,
    ]  # fmt: skip
    run_env = {**os.environ, **env} if env else None
    return subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=240, cwd=ROOT, env=run_env
    )


def profile_script(
    tmp_path: Path,
    text: str,
    *,
    nproc: int,
    steps: str = "1:1:3",
    env: dict[str, str] | None = None,
    level: str = "collectives",
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Write the training script ``text`` under ``tmp_path`` and profile it on ``nproc`` gloo ranks with
    torchrun (:func:`profile`); the run directory and the finished ``skewlens profile``."""
    script = tmp_path / "train.py"
    script.write_text(text)
    out = tmp_path / "run"
    return out, profile(out, steps=steps, nproc=nproc, env=env, script=script, level=level)


def profile_stalled_script(
    tmp_path: Path, text: str, *, steps: str, level: str = "ops"
) -> tuple[Path, tuple[int, int]]:
    """Profile the training script ``text`` on 2 gloo ranks (:func:`profile_script`), which writes when it
    stalled, ``{"start_ns": ..., "end_ns": ...}`` (``time.time_ns()``), to the file ``$SIDE_FILE``: the run
    directory and that stall's ``(start_ns, end_ns)``."""
    side_file = tmp_path / "side.json"
    run_dir, proc = profile_script(
        tmp_path, text, nproc=2, steps=steps, level=level, env={"SIDE_FILE": str(side_file)}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    side = json.loads(side_file.read_text())
    return run_dir, (side["start_ns"], side["end_ns"])


def row_holding(rt: RankTrace, window: tuple[int, int]) -> int:
    """The one row of ``rt`` that holds nine tenths or more of ``window`` (a stall's ``(start_ns, end_ns)``,
    :func:`profile_stalled_script`): the node the stall is in (an assertion error where not one row is)."""
    a, b = window
    overlap = np.minimum(rt.start_ns + rt.dur_ns, b) - np.maximum(rt.start_ns, a)
    (row,) = np.flatnonzero(overlap > (b - a) * 9 // 10)
    return int(row)


def load_example(module_name: str = "skl_example_train") -> ModuleType:
    """The bundled example as a module (its constants and helpers), without running it."""
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class HostDone(NamedTuple):
    """One command of :func:`run_together`: its process id, exit status and output (stdout and stderr)."""

    pid: int
    returncode: int
    output: str


def run_together(
    cmds: list[list[str]], out_dir: Path, *, timeout_s: float, env: dict[str, str] | None = None
) -> list[HostDone]:
    """Run ``cmds`` at once (the hosts of one job), each in a session of its own with its stdout and
    stderr in a file under ``out_dir``; return each one's pid, exit status and output. Files, not pipes: a
    host whose pipe filled while the test read another's would stall the job. Past ``timeout_s`` every
    process tree is killed and the test fails naming the hosts still running, with each one's last output."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = [out_dir / f"host-{k}.log" for k in range(len(cmds))]
    procs = []
    for cmd, log in zip(cmds, logs, strict=True):
        with log.open("w") as f:
            procs.append(
                subprocess.Popen(
                    cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        running = [k for k, p in enumerate(procs) if p.poll() is None]
        tails = {k: log.read_text(errors="replace")[-1500:] for k, log in enumerate(logs)}
        raise AssertionError(
            f"hosts {running} still running after {timeout_s} s; their output: {tails}"
        ) from None
    finally:
        # the whole tree of each still running (not reaped: its pid is still its own); torchrun starts its
        # workers in sessions of their own
        for p in (p for p in procs if p.poll() is None):
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
                for q in tree:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        q.kill()
            p.wait()
    return [
        HostDone(p.pid, p.returncode, log.read_text(errors="replace"))
        for p, log in zip(procs, logs, strict=True)
    ]
