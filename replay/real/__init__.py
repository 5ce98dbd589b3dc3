"""Real replay: re-execute a run's traces on real processes through torch.distributed.

The parent side (:mod:`skewlens.replay.real.api`, :mod:`skewlens.replay.real.plan`,
:mod:`skewlens.replay.real.launch`) does not import torch; only the workers
(:mod:`skewlens.replay.real.worker`, :mod:`skewlens.replay.real.ops`, :mod:`skewlens.replay.real.clock`) do.
"""
