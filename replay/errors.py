"""Errors of the replay package family (simulated and real replay)."""

from __future__ import annotations

from skewlens.profiler.errors import SkewlensError

#: The latest time the simulator's int64 nanosecond clock holds with room to spare (2**62 ns, about 146
#: years): a slowdown, a network model or a replayed time beyond it is a :class:`ConfigError`.
MAX_SIM_NS = 2**62
#: How the errors name that bound.
SIM_CLOCK = "the simulator's clock (about 146 years)"


def missing_value(key: str) -> str:
    """What a required setting that was not given says (``out: missing value ...``)."""
    return f"{key}: missing value (give it on the command line, e.g. {key}=...)"


def shown(value: object) -> str:
    """``value``'s type and repr, the repr cut to 60 characters: what was given, in an error saying it is not
    what a setting or argument takes."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:59] + '…'}"


def first_line(e: BaseException) -> str:
    """The first line of what ``e`` says (OmegaConf's and Hydra's errors run to several: the full key, the
    object type), else its type's name where it says nothing: the one line a refusal quotes."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class ReplayError(SkewlensError):
    """A replay could not run or did not finish (deadlock, timeout, failed rank)."""


class ConfigError(ReplayError):
    """A replay / topology / slowdown configuration value is invalid; the message names the key."""


class ReplayTimeoutError(ReplayError):
    """A real-replay operation exceeded its timeout; the message names rank, group, sequence number, op."""


class ExtrapolationError(ReplayError):
    """A run cannot be extrapolated to another size (``scale.dp``); the message says what was found."""
