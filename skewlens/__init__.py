"""skewlens: capture (``skewlens.profiler``), replay (``skewlens.replay``), analysis (``skewlens.analysis``).

The commands live in ``skewlens.cli``.
"""

__version__ = "0.1.0"
