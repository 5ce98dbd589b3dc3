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


def out_of_memory(e: MemoryError) -> SkewlensError:
    """A :class:`MemoryError` as a one-line :class:`SkewlensError`: what could not be allocated (numpy's
    message), and the address-space limit (``ulimit -v``) where one is set. It was a traceback of 20 lines
    and exit code 1, which ``skewlens check`` documents as "errors in the run"."""
    what = f" ({e})" if str(e) else ""
    limit, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return SkewlensError(f"out of memory{what}")
    cap = f"the address space is limited to {limit >> 20:,} MiB (ulimit -v)"
    return SkewlensError(f"out of memory{what}: {cap}")
