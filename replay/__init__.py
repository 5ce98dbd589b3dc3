"""skewlens replay: simulated (and, in ``skewlens.replay.real``, real) replay of captured runs.

Layout (dependencies point downwards; the first group is the pure core: no torch, pyarrow, rich, hydra,
and no trace store):

- ``core``: the discrete-event engine over segments and sync groups (integer ns, SimPy-style queue);
- ``effects``: the ``Effects`` protocol both replayers consult; ``slowdown``: the configurable model;
- ``network.topology`` / ``network.algorithms``: topologies and closed-form collective costs;
- ``comm``: as-recorded and model transfer timing;

- ``lower``: the trace store's ``RunTrace`` -> core graph (host gaps, chains, sync groups);
- ``simulate``: ``simulate(run, ...) -> SimResult``; ``targets``: slowdown items checked against the run;
  ``summary``: per (rank, step) breakdown;
- ``outputs`` / ``render``: Parquet, Perfetto JSON, rich tables; ``driver``: one replay end to end;
- ``config`` / ``sweep``: the Hydra schemas and multirun rows (the app itself is ``skewlens.cli.replay``).

This package imports nothing on import, so ``import skewlens.replay.core`` stays light.
"""
