"""Checks of the subcommands' number options, after parsing: an out-of-range value is one line naming the
option (``--workers: expected 1..1,048,576, got 100000000000000000000``), as a :class:`SkewlensError`, before
anything starts (a huge ``--workers`` was an OverflowError traceback in the process pool)."""

from __future__ import annotations

from skewlens.profiler.errors import SkewlensError


def check_range(option: str, value: float | None, lo: float, hi: float, why: str = "") -> None:
    """``value`` (None: not given) is within ``lo..hi`` (NaN is not), else a :class:`SkewlensError` naming
    ``option``; ``why``: what the bound is, in a few words, said after it."""
    if value is not None and not lo <= value <= hi:
        bound = f"{lo:,g}..{hi:,g}" if isinstance(lo, float) or isinstance(hi, float) else f"{lo:,}..{hi:,}"
        raise SkewlensError(f"{option}: expected {bound}{f' ({why})' if why else ''}, got {value}")
