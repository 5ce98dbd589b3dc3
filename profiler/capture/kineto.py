"""Operator-level capture through torch.profiler (Kineto), and conversion of its events to :class:`OpRecord`.

:func:`op_records` is pure: it takes event-like objects (``name()``, ``start_ns()``, ``duration_ns()``,
``device_type()``, ``start_thread_id()``, ``device_resource_id()``, ``device_index()``,
``correlation_id()``), so the CUDA/NCCL path is tested on synthetic events without a GPU. Kineto's
timestamps are on the Unix-epoch clock, the same as ``time.time_ns()`` used by the communication hooks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from profiler.bounded import read_json_bounded
from profiler.capture.records import OpRecord
from profiler.errors import CaptureError

#: Largest Kineto JSON we parse to find record-function ids (full level).
MAX_KINETO_JSON_BYTES = 2 * 1024 * 1024 * 1024


def is_host_event(ev: Any) -> bool:
    """A host (CPU) operator, not a device kernel."""
    return str(ev.device_type()).rsplit(".", 1)[-1].upper() == "CPU"


def op_records(events: Iterable[Any], rf_ids: Mapping[int, int] | None = None) -> list[OpRecord]:
    """OpRecords from Kineto events: host ops keep their thread, device kernels their stream."""
    out = []
    for ev in events:
        dur = int(ev.duration_ns())
        if dur < 0:
            continue
        if is_host_event(ev):
            corr = int(ev.correlation_id())
            out.append(
                OpRecord(
                    name=ev.name(),
                    start_ns=int(ev.start_ns()),
                    dur_ns=dur,
                    thread=int(ev.start_thread_id()),
                    is_cpu=True,
                    rf_id=rf_ids.get(corr, -1) if rf_ids else -1,
                    corr=corr,
                )
            )
        else:
            out.append(
                OpRecord(
                    name=ev.name(),
                    start_ns=int(ev.start_ns()),
                    dur_ns=dur,
                    thread=int(ev.device_resource_id()),
                    is_cpu=False,
                    device=f"cuda:{int(ev.device_index())}",
                )
            )
    return out


def rf_ids_from_chrome_trace(path: Path) -> dict[int, int]:
    """``External id -> Record function id`` of CPU ops in an exported Kineto JSON (full level join key)."""
    data = read_json_bounded(path, MAX_KINETO_JSON_BYTES, error=CaptureError, what="Kineto trace")
    out: dict[int, int] = {}
    for ev in data.get("traceEvents", []) if isinstance(data, dict) else []:
        args = ev.get("args") if isinstance(ev, dict) else None
        if isinstance(args, dict) and "Record function id" in args and "External id" in args:
            try:
                out[int(args["External id"])] = int(args["Record function id"])
            except (TypeError, ValueError):
                continue
    return out


class KinetoCapture:
    """Starts torch.profiler at warm-up and hands back its events at the end of the window."""

    def __init__(self, *, cuda: bool, host_facts: bool = False) -> None:
        """``host_facts``: also record operator inputs (shapes, tensor identities), allocations and
        overload names, from which :func:`profiler.capture.hostfacts.host_facts` derives schemas and
        data dependencies (the full level's default source)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        if host_facts:
            from torch._C._profiler import _ExperimentalConfig

            self._prof = profile(
                activities=activities,
                record_shapes=True,
                profile_memory=True,
                experimental_config=_ExperimentalConfig(capture_overload_names=True),
            )
        else:
            self._prof = profile(activities=activities)
        self._running = False

    def start(self) -> None:
        self._prof.start()
        self._running = True

    def stop(self) -> list[Any]:
        """Stop and return the raw Kineto events (empty if never started)."""
        if not self._running:
            return []
        self._running = False
        self._prof.stop()
        results = self._prof.profiler.kineto_results if self._prof.profiler else None
        return list(results.events()) if results is not None else []

    def event_tree(self) -> list[Any]:
        """The profiler's operator tree (after :meth:`stop`): ops with their inputs, allocations inside."""
        results = self._prof.profiler.kineto_results if self._prof.profiler else None
        return list(results.experimental_event_tree()) if results is not None else []

    def export(self, path: Path) -> None:
        """Write the Kineto trace as Chrome JSON (after :meth:`stop`)."""
        self._prof.export_chrome_trace(str(path))
