"""Running the bundled example under ``skewlens profile`` for real (gloo ranks on the CPU), for the tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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
    tmp_path: Path, text: str, *, nproc: int, steps: str = "1:1:3", env: dict[str, str] | None = None
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Write the training script ``text`` under ``tmp_path`` and profile it on ``nproc`` gloo ranks with
    torchrun (:func:`profile`); the run directory and the finished ``skewlens profile``."""
    script = tmp_path / "train.py"
    script.write_text(text)
    out = tmp_path / "run"
    return out, profile(out, steps=steps, nproc=nproc, env=env, script=script)


def load_example(module_name: str = "skl_example_train") -> ModuleType:
    """The bundled example as a module (its constants and helpers), without running it."""
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
