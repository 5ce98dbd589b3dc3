"""skewlens capture and trace format: Chakra I/O, run manifest, the multi-rank trace store.

Importing this package (or loading a run directory) must not import torch; only
``skewlens.profiler.capture`` does.
"""

from skewlens import __version__ as __version__  # written once, there
