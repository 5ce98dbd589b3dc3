"""Pins each torchrun worker to one core when ``SKEWLENS_BENCH_PIN=1`` (``benchmarks/fidelity.py``).

The fidelity benchmark puts this folder on ``PYTHONPATH``, so every Python process it starts runs this
file at interpreter start, before any thread exists (the threads torch and gloo start later inherit the
mask). A worker (a process with ``LOCAL_RANK``) is pinned to core ``LOCAL_RANK`` modulo the cores it may
use: each of 2 ranks on a core of its own; of 4 ranks on 2 cores, ranks 0 and 2 share core 0, ranks 1
and 3 core 1. Other processes (``skewlens``, torchrun's agent) are left alone. ``skewlens profile``'s
bootstrap ``sitecustomize`` hands over to this one.

Why: unpinned, the kernel's placement of 4 ranks on 2 cores changes from run to run, and with it how
much of one rank's slowdown its peers absorb (see ``docs/benchmarks.md``, the pinning experiment); the
same placement in every capture and replay takes that out of the comparison.
"""

import os

if os.environ.get("SKEWLENS_BENCH_PIN") == "1" and os.environ.get("LOCAL_RANK", "").isdigit():
    _cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cores[int(os.environ["LOCAL_RANK"]) % len(_cores)]})
