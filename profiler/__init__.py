"""skewlens capture and trace format: Chakra I/O, run manifest, the multi-rank trace store.

Importing this package (or loading a run directory) must not import torch; only
``skewlens.profiler.capture`` does.
"""

__version__ = "0.1.0"
