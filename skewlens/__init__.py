"""skewlens: the command-line edge. The library lives in ``profiler``, ``replay`` and ``analysis``."""

__version__ = "0.1.0"
