"""The same input gives the same files whatever the environment (docs/design.md, "Reproducibility")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType

#: Two environments that must not matter: hash seed, time zone (one a half hour off), locale, and (below)
#: the working directory with the paths given relative to it, through '..'.
ENVS = (
    {"PYTHONHASHSEED": "0", "TZ": "UTC", "LC_ALL": "C.UTF-8"},
    {"PYTHONHASHSEED": "1", "TZ": "America/St_Johns", "LC_ALL": "C"},
)


def tied_run(path: Path) -> Path:
    """4 ranks, 3 steps; on rank 2 two ops grow by the same 1 ms (a tie that names them in its cause)."""
    b = RunBuilder(world_size=4)
    for r in range(4):
        rb = b.rank(r)
        t, extra = 0, 1_000_000 if r == 2 else 0
        for s in range(3):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=1_000_000 + extra, start_ns=t)
            rb.compute("aten::bmm", dur_ns=1_000_000 + extra, start_ns=t + 1_000_000 + extra)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=2_200_000 - 2 * extra)
            t += 5_000_000
    return b.write(path)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_analyze_and_a_jittered_replay_write_the_same_bytes_under_other_hash_seeds_zones_locales_and_paths(
    tmp_path: Path,
) -> None:
    # a replay given trace=../../run from a subdirectory wrote config.yaml's trace as '<cwd>/../../run'
    run = tied_run(tmp_path / "run")
    (sub := tmp_path / "a" / "b").mkdir(parents=True)
    printed: list[str] = []
    for k, (cwd, given, out) in enumerate([(tmp_path, str(run), str(tmp_path)), (sub, "../../run", "../..")]):
        env = {**os.environ, **ENVS[k]}
        for args in (
            ["analyze", given, "--out", f"{out}/analysis{k}"],
            ["replay", f"trace={given}", f"out={out}/replay{k}", "slowdown=jitter", "comm_mode=model"],
        ):
            command = [sys.executable, "-m", "skewlens", *args]
            done = subprocess.run(
                command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
            )
            assert done.returncode == 0, done.stderr
            shown = done.stdout
            for name in (f"analysis{k}", f"replay{k}"):
                shown = shown.replace(str(tmp_path / name), "OUT").replace(f"{out}/{name}", "OUT")
            printed.append(re.sub(r"[\s━─]+", "", shown))  # a table titled with its path is as wide as it
    analyses = [files(tmp_path / f"analysis{k}") for k in (0, 1)]
    assert len(analyses[0]) >= 5 and analyses[0] == analyses[1]
    replays = [files(tmp_path / f"replay{k}") for k in (0, 1)]
    config = [replays[k].pop("config.yaml").decode().replace(f"replay{k}", "OUT") for k in (0, 1)]
    assert f"trace: {run}\n" in config[0] and config[0] == config[1]
    assert len(replays[0]) == 3 and replays[0] == replays[1]
    assert "computegrew:aten::mm+1.0ms,aten::bmm+1.0ms" in printed[0]  # the tie, in the report
    assert printed[:2] == printed[2:]
