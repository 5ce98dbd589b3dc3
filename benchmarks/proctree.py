"""Sampling a benchmarked command's whole process tree (its workers are children or grandchildren).

The benchmarks that run commands as a user does (``e2e.py``, ``import_throughput.py``,
``store_throughput.py``) read the peak of the tree's summed RSS and its CPU time from here.
"""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass, field

import psutil

#: Seconds between samples.
SAMPLE_S = 0.02


@dataclass(slots=True)
class TreeSamples:
    """What sampling a process tree saw: the peak of its summed RSS, each process's last CPU time."""

    peak_rss_bytes: int = 0
    cpu_s: dict[int, float] = field(default_factory=dict)

    @property
    def cpu_total_s(self) -> float:
        """CPU time of every process seen, each at its last sample."""
        return sum(self.cpu_s.values())

    def sample(self, root: psutil.Process) -> None:
        """Read ``root`` and all its descendants now (shared pages count once per process)."""
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        rss = 0
        for p in procs:
            with contextlib.suppress(psutil.Error), p.oneshot():  # it may exit between listing and reading
                rss += p.memory_info().rss
                t = p.cpu_times()
                self.cpu_s[p.pid] = t.user + t.system
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)


def watch(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> TreeSamples:
    """Sample ``proc``'s tree every :data:`SAMPLE_S` until it exits (it is waited for)."""
    seen = TreeSamples()
    try:
        root: psutil.Process | None = psutil.Process(proc.pid)
    except psutil.Error:
        root = None
    while True:
        if root is not None:
            seen.sample(root)
        try:
            proc.wait(SAMPLE_S)
            return seen
        except subprocess.TimeoutExpired:
            continue
