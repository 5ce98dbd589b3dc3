"""Errors raised by skewlens: one base class, a few specific kinds.

Every message names what is wrong: the file, rank, node id, process group / sequence number or config
key. Callers at the CLI edge print ``str(err)`` as a single line and exit non-zero; nothing below the CLI
logs and then raises.
"""

from __future__ import annotations

import resource


class SkewlensError(Exception):
    """Base class of every error skewlens raises on purpose."""


class TraceFormatError(SkewlensError):
    """A trace file is truncated, corrupt, oversized or of an unknown kind."""


class ManifestError(SkewlensError):
    """A run directory's manifest is missing, unreadable or of an unsupported version."""


class ValidationError(SkewlensError):
    """A multi-rank trace is inconsistent (missing ranks, unmatched collectives, cycles, ...)."""


class CaptureError(SkewlensError):
    """Capturing a training run failed (command failed, output not writable, ...)."""


class TraceImportError(SkewlensError):
    """Importing third-party traces (Kineto JSON, host execution traces) failed."""


def address_space_limit() -> str | None:
    """``the address space is limited to N MiB (ulimit -v)`` where a limit is set (``ulimit -v``,
    ``prlimit --as``), else None: what explains a failure to allocate, or to start torch's processes."""
    limit, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    return f"the address space is limited to {limit >> 20:,} MiB (ulimit -v)"


def out_of_memory(e: MemoryError) -> SkewlensError:
    """A :class:`MemoryError` as a one-line :class:`SkewlensError`: what could not be allocated (numpy's
    message), and the address-space limit where one is set (:func:`address_space_limit`). It was a
    traceback of 20 lines and exit code 1, which ``skewlens check`` documents as "errors in the run"."""
    what = f" ({e})" if str(e) else ""
    cap = address_space_limit()
    return SkewlensError(f"out of memory{what}" + (f": {cap}" if cap else ""))
