"""The example workloads (``examples/*.py`` beside ``train.py``) captured for the tests, and what they sent.

:func:`capture_workload` runs one under ``skewlens profile`` with torchrun; :func:`comm_per_step` reads the
loaded run back as, per rank and step, a count of (kind, group's ranks, bytes, peer) for every collective
and p2p node; :func:`load_workload` gives a script's constants (its sizes) without running it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from capture_helpers import ROOT, profile

from skewlens.profiler.store.load import load_run
from skewlens.profiler.store.model import RunTrace
from skewlens.profiler.vocab import CommType, NodeType

EXAMPLES = ROOT / "examples"
COMM_NODES = (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV)
F32 = 4


class CommKey(NamedTuple):
    """One communication node, as the tests compare them."""

    kind: str
    """``ALL_GATHER``, ``REDUCE_SCATTER``, ``ALL_REDUCE``, ... for collectives; ``SEND`` / ``RECV``."""
    group: tuple[int, ...]
    """Global ranks of its process group."""
    bytes: int
    """``comm_bytes`` of the node."""
    peer: int
    """The other rank of a send or recv; -1 for collectives."""


def load_workload(script: str) -> ModuleType:
    """``examples/SCRIPT`` as a module (constants and helpers), without running it."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the examples import their shared _common
    spec = importlib.util.spec_from_file_location(f"skl_workload_{Path(script).stem}", EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def capture_workload(
    out: Path, script: str, *args: str, nproc: int = 2, steps: str = "1:1:3", level: str = "collectives"
) -> RunTrace:
    """``skewlens profile --level LEVEL`` of ``torchrun examples/SCRIPT ARGS``; the loaded run.

    The script runs two steps past the capture window (WAIT + WARMUP + ACTIVE + 2).
    """
    total = sum(int(n) for n in steps.split(":")) + 2
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(EXAMPLES / script), "--steps", str(total), *args,
    ]  # fmt: skip
    res = profile(out, level=level, steps=steps, command=command)
    assert res.returncode == 0, res.stderr[-3000:]
    return load_run(out)


def comm_per_step(run: RunTrace) -> dict[int, dict[int, Counter[CommKey]]]:
    """Per rank, per captured step: how many communication nodes of each :class:`CommKey`."""
    groups = {name: tuple(info.ranks) for name, info in run.process_groups.items()}
    out: dict[int, dict[int, Counter[CommKey]]] = {}
    for rank, rt in run.ranks.items():
        per: dict[int, Counter[CommKey]] = {}
        for i in rt.rows_of_type(*COMM_NODES):
            t = NodeType(int(rt.node_type[i]))
            if t == NodeType.COMM_COLL:
                kind, peer = CommType(int(rt.comm_type[i])).name, -1
            else:
                kind = "SEND" if t == NodeType.COMM_SEND else "RECV"
                peer = int(rt.dst[i]) if t == NodeType.COMM_SEND else int(rt.src[i])
            group = groups[run.pg_names[int(rt.pg[i])]] if rt.pg[i] >= 0 else ()
            key = CommKey(kind, group, int(rt.comm_bytes[i]), peer)
            per.setdefault(int(rt.step[i]), Counter())[key] += 1
        out[rank] = per
    return out


def captured_steps(run: RunTrace) -> dict[int, list[int]]:
    """The steps the manifest records for each rank."""
    steps: dict[int, list[int]] = {}
    for s in run.manifest.steps:
        steps.setdefault(s.rank, []).append(s.step)
    return {r: sorted(v) for r, v in steps.items()}
