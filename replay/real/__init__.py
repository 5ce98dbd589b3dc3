"""Real replay: re-execute a run's traces on real processes through torch.distributed.

The parent side (:mod:`replay.real.api`, :mod:`replay.real.plan`, :mod:`replay.real.launch`) does not import
torch; only the workers (:mod:`replay.real.worker`, :mod:`replay.real.ops`, :mod:`replay.real.clock`) do.
"""
