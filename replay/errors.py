"""Errors of the replay package family (simulated and real replay)."""

from __future__ import annotations

from skewlens.profiler.errors import SkewlensError


class ReplayError(SkewlensError):
    """A replay could not run or did not finish (deadlock, timeout, failed rank)."""


class ConfigError(ReplayError):
    """A replay / topology / slowdown configuration value is invalid; the message names the key."""


class ReplayTimeoutError(ReplayError):
    """A real-replay operation exceeded its timeout; the message names rank, group, sequence number, op."""


class ExtrapolationError(ReplayError):
    """A run cannot be extrapolated to another size (``scale.dp``); the message says what was found."""
