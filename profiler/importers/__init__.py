"""Importers of third-party traces: Kineto JSON (+ PyTorch host execution traces) -> a run directory.

``import_traces(kineto, host_et, out)`` is the entry point (``skewlens import`` calls it). One module per
concern: ``sources`` (files, directories, archives, bounded JSON), ``kineto`` and ``host_et`` (typed
views of the two formats, with their supported versions), ``pairing`` (host trace <-> rank),
``convert`` (the conversion rules, written down in its docstring), ``encode`` (the nodes' Chakra bytes)
and ``run`` (ranks converted in parallel worker processes within a memory budget, the run directory
assembled atomically).
"""

from skewlens.profiler.importers.run import import_traces

__all__ = ["import_traces"]
