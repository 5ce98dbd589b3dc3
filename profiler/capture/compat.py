"""torch's private APIs that the capture depends on, each behind a guard that says what is lost without it.

skewlens supports torch 2.11 to 2.13 (``pyproject.toml``; CI runs 2.13.0). Private APIs change between
releases without notice, so each one that could be missing, or could refuse an argument, in a supported
release is reached through this module or a guard next to its use, and its absence costs only what it
gives, said in the rank's manifest notes (never a failed capture):

- ``torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)`` (ops/full on CUDA): Kineto's
  ``cuda_sync`` activities. Without it: no event-wait or host-synchronisation edges (launch edges and
  stream order remain).
- ``_ExperimentalConfig(expose_kineto_event_metadata=True)``: those activities' streams and event records
  (their metadata). Without it: the same.
- ``_ExperimentalConfig(capture_overload_names=True)`` (full level): operator overloads. Without it: the
  schemas are the default overload's.
- ``_KinetoEvent.activity_type()`` (not in torch 2.11 and 2.12): kernels told from synchronisation
  activities and GPU annotations, launch calls from operators. Without it the kinds are read from each
  event's metadata (:func:`skewlens.profiler.capture.kineto.inferred_activity`, said in a note); without
  that too, every device-side event is a GPU node, and no launch or synchronisation edge is drawn.
- ``_KinetoEvent.metadata_json()`` / ``extra_meta()``: the synchronisation activities' fields. Without
  them: no event-wait or host-synchronisation edges.
- ``torch._C._distributed_c10d._dump_nccl_trace_json`` (builds with NCCL) and ``_dump_fr_trace_json``:
  NCCL's and gloo's flight recorders (two recorders). Without them: the collectives issued past the
  hooks are not in the trace, and the hooked ones keep the hooks' numbers.
- ``torch.distributed.rpc._is_current_rpc_agent_set`` (:func:`rpc_running`): whether the rank ran RPC,
  which the capture does not record, to say so. Without it: no such note.
- ``torch._C._autograd._enable_record_function``: hooked calls issued with record functions off
  (collectives level). Without it: their gloo work items stay profiled (a little more overhead).

The first and the last are here (:func:`experimental_config`, :func:`record_function_switch`); the event
accessors are :func:`skewlens.profiler.capture.kineto.activity` and
:func:`~skewlens.profiler.capture.kineto.event_metadata`, the dumps
:func:`skewlens.profiler.capture.flight.dump_entries`. The rest of what the capture touches
(``torch.distributed.distributed_c10d._world``, ``_get_default_store``, ``_new_process_group_helper``,
``_group_or_default_group``, ``_rank_not_in_group``, ``torch._C._get_schema``, the profiler's
``kineto_results``) has been in place since torch 2.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def experimental_config(**wanted: bool) -> tuple[Any, tuple[str, ...]]:
    """``torch._C._profiler._ExperimentalConfig`` with those of the ``wanted`` options this torch knows,
    and the names of those it does not (each tried on its own: pybind refuses an unknown keyword with a
    ``TypeError``). ``(None, every name)`` where the class itself is missing."""
    try:
        from torch._C import _profiler
    except ImportError:
        return None, tuple(wanted)
    make: Any = getattr(_profiler, "_ExperimentalConfig", None)  # its keywords vary by release
    if make is None:
        return None, tuple(wanted)
    known: dict[str, bool] = {}
    missing: list[str] = []
    for name, value in wanted.items():
        try:
            make(**{name: value})
        except TypeError:
            missing.append(name)
        else:
            known[name] = value
    return make(**known), tuple(missing)


def record_function_switch() -> Callable[[bool], None] | None:
    """``torch._C._autograd._enable_record_function`` (turns record functions off and on for the
    calling thread), or None where this torch has no such function."""
    try:
        from torch._C._autograd import _enable_record_function
    except ImportError:
        return None
    return _enable_record_function


def rpc_running() -> bool:
    """Whether this process has a ``torch.distributed.rpc`` agent running (``init_rpc`` done, no
    ``shutdown`` yet); False where this torch has no RPC or no way to tell."""
    try:
        from torch.distributed import rpc

        return bool(rpc.is_available() and rpc._is_current_rpc_agent_set())
    except Exception:  # a private API: its absence costs only the note
        return False
