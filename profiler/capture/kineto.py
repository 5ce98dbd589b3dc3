"""Operator-level capture through torch.profiler (Kineto), and conversion of its events to :class:`OpRecord`.

:func:`op_records` and :func:`sync_records` are pure: they take event-like objects (``name()``,
``start_ns()``, ``duration_ns()``, ``device_type()``, ``start_thread_id()``, ``device_resource_id()``,
``device_index()``, ``correlation_id()``, and where torch has them ``activity_type()`` and
``metadata_json()`` / ``extra_meta()``), so the CUDA/NCCL path is tested on synthetic events without a
GPU. Kineto's timestamps are on the Unix-epoch clock, the same as ``time.time_ns()`` used by the
communication hooks.

On CUDA, torch's events hold more than operators and kernels (``activity_type()``, as Kineto's JSON
names its categories): the CUDA runtime and driver calls (``cuda_runtime``, ``cuda_driver``: launches,
event records, synchronisations; host events, on the thread of the operator that made them), and, with
``enable_cuda_sync_events``, the synchronisation activities (``cuda_sync``: device-side events of their
own, whose streams and event records are only in their metadata, hence
``expose_kineto_event_metadata``). A launch call and what it launched share a correlation id (CUPTI's);
so does a synchronisation activity and the call that made it. GPU annotations (``gpu_user_annotation``)
and other device-side ranges are not GPU work and are left out.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from skewlens.profiler.bounded import read_json_bounded
from skewlens.profiler.capture.build import STEP_MARK_NAME, marker_clock_offset
from skewlens.profiler.capture.compat import experimental_config
from skewlens.profiler.capture.records import CALL_KINDS, GPU_KINDS, CudaSyncRecord, OpRecord
from skewlens.profiler.errors import CaptureError

#: Largest Kineto JSON we parse to find record-function ids (full level).
MAX_KINETO_JSON_BYTES = 2 * 1024 * 1024 * 1024


def is_host_event(ev: Any) -> bool:
    """A host (CPU) operator, not a device kernel."""
    return str(ev.device_type()).rsplit(".", 1)[-1].upper() == "CPU"


#: ``activity()`` of Kineto's synchronisation activities.
SYNC_KIND = "cuda_sync"
#: ``activity()`` of Kineto's instant events: ``[memory]`` allocation records (the full level asks for
#: them, ``profile_memory``), points in time, not operators.
INSTANT_KIND = "cpu_instant_event"
#: Name of those allocation records.
MEMORY_EVENT_NAME = "[memory]"
#: ``activity()`` of Kineto's own overhead ranges (``Activity Buffer Request``, ``Lazy Function Loading``,
#: ``Runtime Triggered Module Loading``, ...): no operator, on no thread of the program (resource 0).
OVERHEAD_KIND = "overhead"


def activity(ev: Any) -> str:
    """Kineto's activity type of an event (``kernel``, ``cuda_runtime``, ``cuda_sync``, ``cpu_op``, ...):
    ``activity_type()`` where this torch's events have it (2.13), else :func:`inferred_activity`."""
    get = getattr(ev, "activity_type", None)
    return str(get()) if get is not None else inferred_activity(ev)


def inferred_activity(ev: Any) -> str:
    """The activity type of an event of a torch whose events do not say it (2.11 and 2.12 have no
    ``activity_type()``), from what each kind carries in its metadata, as seen on torch 2.11+cu130 on an
    H200 (``scripts/cuda_check.sh`` prints it): a CUDA runtime or driver call has CUPTI's callback id
    (``cbid``; on ROCm a HIP call HIP's API id, ``cid``), an operator torch's event index (``Ev Idx``),
    Kineto's overhead ranges nothing and no thread; on the device a synchronisation activity has
    ``cuda_sync_kind``, a ``record_function``'s range ``is_user_annotation()`` (often no metadata at all: on
    an H200, FSDP's and gloo's ranges had become GPU work), a kernel its launch (``grid``, ``queued``; on
    ROCm its dispatch, ``kind``, and a grid only where Kineto kept its launch's), copies and memsets their
    names; allocation records
    (the full level's ``[memory]``, on the allocation's device) their name. ``""`` where the metadata says
    nothing (no ``expose_kineto_event_metadata``): the event is taken as before, an operator on the host and
    GPU work on the device."""
    get = getattr(ev, "metadata_json", None)
    text = str(get()).strip() if get is not None else ""
    # the keys, found in the JSON text without parsing it (twice per event of a capture otherwise)
    keys: Iterable[str] = [k for k in _INFERRED_FROM if f'"{k}"' in text] if text else event_metadata(ev)
    found = set(keys)
    name = str(ev.name())
    if name == MEMORY_EVENT_NAME:  # on the device of the allocation, with no metadata on torch 2.11
        return INSTANT_KIND
    if is_host_event(ev):
        if "cbid" in found or "cid" in found:
            return "cuda_driver" if name.startswith("cu") and not name.startswith("cuda") else "cuda_runtime"
        if "Ev Idx" in found:
            return "cpu_op"
        return OVERHEAD_KIND if not text and not found and _int(ev.device_resource_id()) == 0 else ""
    if "cuda_sync_kind" in found:
        return SYNC_KIND
    if _user_annotation(ev):  # a record_function's range on the device: no work, and often no metadata
        return "gpu_user_annotation"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    if "grid" in found or "queued" in found or "kind" in found:
        return "kernel"
    return "gpu_user_annotation" if text or found else ""


#: The metadata keys :func:`inferred_activity` tells kinds apart by: CUDA's (Kineto's CUPTI logger) and
#: ROCm's (its roctracer and rocprofiler-sdk loggers: ``cid``, ``kind``).
_INFERRED_FROM = ("cbid", "cid", "Ev Idx", "cuda_sync_kind", "grid", "queued", "kind")


def _user_annotation(ev: Any) -> bool:
    """``is_user_annotation()`` where the event has it (torch 2.11 does): true for a ``record_function``'s
    range, on the host or on the device (where torch leaves it out of device time too)."""
    get = getattr(ev, "is_user_annotation", None)
    return bool(get()) if get is not None else False


#: Manifest note of a capture whose torch's events have no ``activity_type()``.
INFERRED_KINDS_NOTE = (
    "this torch's profiler events have no activity_type(): operators, CUDA calls, kernels and "
    "synchronisation activities told apart by their metadata (skewlens.profiler.capture.kineto."
    "inferred_activity)"
)


def event_metadata(ev: Any) -> dict[str, Any]:
    """The metadata Kineto attached to an event (its JSON ``args`` less what torch adds), as torch gives it
    with ``expose_kineto_event_metadata``: ``metadata_json()`` is a JSON object body (``"stream": 7,
    "correlation": 12``), ``extra_meta()`` (newer torch) a mapping; empty where neither has anything."""
    get = getattr(ev, "metadata_json", None)
    text = str(get()).strip().rstrip(",") if get is not None else ""
    if text:
        try:
            data = json.loads("{" + text + "}")
        except ValueError:
            data = None
        if isinstance(data, dict):
            return data
    extra = getattr(ev, "extra_meta", None)
    meta = extra() if extra is not None else None
    return dict(meta) if isinstance(meta, Mapping) else {}


def activities(events: Sequence[Any]) -> list[str]:
    """:func:`activity` of each event, for :func:`op_records` and :func:`sync_records` to share: on a torch
    without ``activity_type()`` each is inferred from the event's metadata text."""
    return [activity(ev) for ev in events]


def op_records(
    events: Sequence[Any], rf_ids: Mapping[int, int] | None = None, kinds: Sequence[str] | None = None
) -> list[OpRecord]:
    """OpRecords from Kineto events: host ops (and CUDA runtime/driver calls) keep their thread, GPU
    activities their stream; synchronisation activities (:func:`sync_records`), instant events
    (:data:`INSTANT_KIND`), Kineto's overhead ranges (:data:`OVERHEAD_KIND`) and GPU annotations are left
    out. ``kinds``: the events' :func:`activities` where the caller has them."""
    out = []
    for ev, kind in zip(events, activities(events) if kinds is None else kinds, strict=True):
        dur = int(ev.duration_ns())
        if dur < 0:
            continue
        if kind in (INSTANT_KIND, OVERHEAD_KIND):
            continue
        if is_host_event(ev):
            corr = int(ev.correlation_id())
            call = kind in CALL_KINDS
            out.append(
                OpRecord(
                    name=ev.name(),
                    start_ns=int(ev.start_ns()),
                    dur_ns=dur,
                    thread=int(ev.start_thread_id()),
                    is_cpu=True,
                    rf_id=rf_ids.get(corr, -1) if rf_ids and not call else -1,
                    corr=corr,
                    kind=kind if call else "",
                )
            )
        elif not kind or kind in GPU_KINDS:
            out.append(
                OpRecord(
                    name=ev.name(),
                    start_ns=int(ev.start_ns()),
                    dur_ns=dur,
                    thread=int(ev.device_resource_id()),
                    is_cpu=False,
                    device=f"cuda:{int(ev.device_index())}",
                    corr=int(ev.correlation_id()),
                    kind=kind,
                )
            )
    return out


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def sync_records(events: Sequence[Any], kinds: Sequence[str] | None = None) -> list[CudaSyncRecord]:
    """The synchronisation activities among Kineto events (``cuda_sync``), with the streams and event
    records of their metadata (-1 where it says nothing: no ``expose_kineto_event_metadata``). ``kinds``:
    the events' :func:`activities` where the caller has them."""
    out = []
    for ev, kind in zip(events, activities(events) if kinds is None else kinds, strict=True):
        if kind != SYNC_KIND:
            continue
        meta = event_metadata(ev)
        out.append(
            CudaSyncRecord(
                kind=str(meta.get("cuda_sync_kind") or ev.name()),
                corr=int(ev.correlation_id()),
                device=_int(meta.get("device"), int(ev.device_index())),
                stream=_int(meta.get("stream"), int(ev.device_resource_id())),
                wait_on_stream=_int(meta.get("wait_on_stream")),
                record_corr=_int(meta.get("wait_on_cuda_event_record_corr_id")),
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


#: Most gloo worker events the native recorder keeps per window (about 100 bytes each).
MAX_WORKER_EVENTS = 200_000

#: Steps that leave a ``skewlens::step`` record function
# (:data:`~skewlens.profiler.capture.build.STEP_MARK_NAME`):
#: the two clocks keep their offset, a few markers pin it.
MARKS = 8


def leave_mark(times_ns: list[int]) -> None:
    """Record a ``skewlens::step`` function around a ``time.time_ns()`` reading appended to ``times_ns``
    (while fewer than :data:`MARKS` were left)."""
    if len(times_ns) < MARKS:
        from torch.autograd.profiler import record_function

        with record_function(STEP_MARK_NAME):
            times_ns.append(time.time_ns())


#: What the trace loses without each ``_ExperimentalConfig`` option the capture asks for.
MISSING_OPTION = {
    "enable_cuda_sync_events": "no CUDA synchronisation events: no event-wait or host-synchronisation edges",
    "expose_kineto_event_metadata": (
        "no metadata on the profiler's events: no event-wait or host-synchronisation edges"
    ),
    "capture_overload_names": "no operator overload names: schemas are the default overload's",
}


class ProgramProfiler:
    """Whether the program's own torch profiler holds Kineto: running, or prepared and not yet stopped.

    ``torch.profiler.profile(schedule=...)`` prepares Kineto when its warm-up begins and enables it only
    when recording begins, a ``prof.step()`` later. Kineto is one session per process: a session started
    in between (``_profiler_enabled()`` is still false) made the program's enable raise ``RuntimeError:
    Profiler is already enabled on this thread`` in its ``prof.step()``, ending the training (2 DDP ranks
    at the ops level, the program's ``schedule(wait=0, warmup=1, active=1)``). This watches
    ``torch.autograd.profiler``'s module-level ``_prepare_profiler`` and ``_disable_profiler``, through
    which torch's profilers prepare and stop, from :meth:`install` (the capture session's start, as torch
    is imported under ``skewlens profile``) on; the capture's own sessions run under :meth:`own`.
    """

    def __init__(self) -> None:
        from skewlens.profiler.capture.patches import Patches

        self.prepared = False
        self._own = False
        self._patches = Patches()

    def install(self) -> None:
        import torch.autograd.profiler as autograd_profiler

        prepare, disable = autograd_profiler._prepare_profiler, autograd_profiler._disable_profiler

        def prepare_profiler(*args: Any, **kwargs: Any) -> Any:
            if not self._own:
                self.prepared = True
            return prepare(*args, **kwargs)

        def disable_profiler(*args: Any, **kwargs: Any) -> Any:
            if not self._own:
                self.prepared = False
            return disable(*args, **kwargs)

        self._patches.set(autograd_profiler, "_prepare_profiler", prepare, prepare_profiler)
        self._patches.set(autograd_profiler, "_disable_profiler", disable, disable_profiler)

    def uninstall(self) -> None:
        self._patches.put_back()

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        """The capture's own profiler starts or stops inside: not the program's."""
        self._own = True
        try:
            yield
        finally:
            self._own = False


class KinetoCapture:
    """Starts torch.profiler at warm-up and hands back its events at the end of the window."""

    def __init__(
        self,
        *,
        cuda: bool,
        host_facts: bool = False,
        on_taken_over: Callable[[], None] | None = None,
        program: ProgramProfiler | None = None,
    ) -> None:
        """``host_facts``: also record operator inputs (shapes, tensor identities), allocations and
        overload names, from which :func:`skewlens.profiler.capture.hostfacts.host_facts` derives schemas and
        data dependencies (the full level's default source). ``cuda``: also GPU activities, the CUDA
        runtime calls, and the synchronisation activities with their metadata (:attr:`notes` says what
        this torch could not record). ``on_taken_over()`` is called once the program's own profiler has
        taken Kineto over (this session stopped, inside the program's profiler's start). ``program``: what
        tells a program's profiler that is prepared and not yet running (else only a running one is seen)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        wanted: dict[str, bool] = {}
        if cuda:
            activities.append(ProfilerActivity.CUDA)
            wanted.update(enable_cuda_sync_events=True, expose_kineto_event_metadata=True)
        if host_facts:
            wanted["capture_overload_names"] = True
        self.notes: list[str] = []
        """What this torch's profiler could not be asked for, and what that costs the trace."""
        options: dict[str, Any] = {"record_shapes": True, "profile_memory": True} if host_facts else {}
        if wanted:
            config, missing = experimental_config(**wanted)
            self.notes += [f"{MISSING_OPTION[m]} (this torch's profiler has no {m})" for m in missing]
            if config is not None:
                options["experimental_config"] = config
        self._prof = profile(activities=activities, **options)
        self._running = False
        self._restore: Any = None
        self._on_taken_over = on_taken_over
        self._program = program if program is not None else ProgramProfiler()  # not installed: sees nothing
        self.note = ""
        """Why no operators were recorded (the program's own profiler), or empty."""
        self.mark_times_ns: list[int] = []
        """The ``time.time_ns()`` inside each step marker left so far (see ``RankCapture.mark_times_ns``)."""
        self.mark_thread = 0
        """Native id of the thread that left the last step marker (0: none left)."""

    def start(self) -> bool:
        """Start recording; False (and :attr:`note`) when the program already profiles itself.

        Kineto is one session per process: a profiler started over another takes its session, and the
        first then stops with no events. So a profiler the program runs is left alone, and one the program
        starts while this one records gets Kineto to itself (this session stops first, its events
        dropped): the program's profiler records as it would without skewlens."""
        import torch.autograd.profiler as autograd_profiler
        from torch._C._autograd import _profiler_enabled

        if _profiler_enabled() or self._program.prepared:
            self.note = "the program runs its own profiler: operators not recorded"
            return False
        with self._program.own():
            self._prof.start()
        self._running = True
        # torch.autograd.profiler (behind torch.profiler too) prepares every profiler it starts through
        # this module-level name
        original = autograd_profiler._prepare_profiler

        def prepare(*args: Any, **kwargs: Any) -> Any:
            if self._running:
                self._running = False
                with self._program.own():
                    self._prof.stop()
                self.note = "the program started its own profiler: operators not recorded"
                if self._on_taken_over is not None:
                    with contextlib.suppress(Exception):  # the program's profiler must start regardless
                        self._on_taken_over()
            return original(*args, **kwargs)

        autograd_profiler._prepare_profiler = prepare
        self._restore = lambda: setattr(autograd_profiler, "_prepare_profiler", original)
        return True

    def mark(self) -> None:
        """Leave a step marker (a no-op unless recording, and after the first :data:`MARKS` steps)."""
        if self._running:
            leave_mark(self.mark_times_ns)
            self.mark_thread = threading.get_native_id()

    def stop(self) -> list[Any]:
        """Stop and return the raw Kineto events (empty if never started, or the program's profiler took
        Kineto over)."""
        if self._restore is not None:
            self._restore()
            self._restore = None
        if not self._running:
            return []
        self._running = False
        with self._program.own():
            self._prof.stop()
        results = self._prof.profiler.kineto_results if self._prof.profiler else None
        events = list(results.events()) if results is not None else []
        if events and not hasattr(events[0], "activity_type"):
            self.notes.append(INFERRED_KINDS_NOTE)
        return events

    def event_tree(self) -> list[Any]:
        """The profiler's operator tree (after :meth:`stop`): ops with their inputs, allocations inside."""
        results = self._prof.profiler.kineto_results if self._prof.profiler else None
        return list(results.experimental_event_tree()) if results is not None else []

    def export(self, path: Path) -> None:
        """Write the Kineto trace as Chrome JSON (after :meth:`stop`)."""
        self._prof.export_chrome_trace(str(path))


class WorkerEvents:
    """Collectives level: gloo's worker-thread events (``gloo:*``) and nothing else.

    gloo runs each collective on a worker thread of its process group and wraps it in a ``USER_SCOPE``
    record function. The events give the end of the collectives the hooks do not time (DDP's all_reduce,
    see :mod:`skewlens.profiler.capture.flight`). Two recorders give them:

    - the native one (:mod:`skewlens.profiler.capture.native`, the default when given): a
      RecordFunction callback for that scope that keeps the ``gloo:*`` events, on ``time.time_ns()``'s
      clock and with native thread ids. It runs beside a profiler the program starts (Kineto is not
      involved).
    - otherwise a Kineto session restricted to that scope. It records those events, the program's own
      ``record_function`` scopes and torch's (``Optimizer.step#...``), a few per step, and no operator:
      operators are ``FUNCTION`` scope and their record functions do not even run. The first steps leave
      a ``skewlens::step`` event around a ``time.time_ns()`` reading, which puts the events on the hooks'
      clock. It costs more: 40 interleaved triples of whole runs of the example (2 ranks,
      ``benchmarks/capture_overhead.py --recorders``) gave 1.026 with it and 1.006 with the native
      recorder (docs/benchmarks.md).

    Either way the hooked calls are kept out of it after the first :data:`MARKS` steps (:meth:`quiet`),
    and the capture starts it only when collectives past the hooks were seen before the window
    (:func:`skewlens.profiler.capture.flight.unhooked_groups`), or when a ``DistributedDataParallel`` is
    built inside it.

    Kineto is one per process. With the Kineto recorder, a profiler the program already runs is left
    alone (nothing is recorded here); one it starts later takes Kineto over, which :meth:`start` notices
    through ``torch.autograd.profiler``: the events are then lost (:attr:`note` says so), the program's
    profiler works as without skewlens.
    """

    def __init__(self, native: Any = None, program: ProgramProfiler | None = None) -> None:
        """``native``: the loaded native recorder (:class:`skewlens.profiler.capture.native.GlooEvents`),
        or None for the Kineto session; ``program``: what tells a program's profiler that is prepared and
        not yet running (the Kineto session then does not start)."""
        self._native = native
        self._program = program if program is not None else ProgramProfiler()  # not installed: sees nothing
        self._on = False
        self._taken_over = False
        self._times: list[int] = []
        self._restore: Any = None
        self._profiling: Any = None
        self.note = ""
        """Why no events came back, or why some did not ("" when all did)."""

    @property
    def recorder(self) -> str:
        """``native`` or ``kineto``."""
        return "native" if self._native is not None else "kineto"

    def start(self) -> bool:
        """Start recording; False (and :attr:`note`) when the process already profiles."""
        import torch.autograd.profiler as autograd_profiler
        from torch._C._autograd import _enable_profiler, _prepare_profiler, _profiler_enabled
        from torch._C._profiler import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            RecordScope,
            _ExperimentalConfig,
        )

        if self._on:
            return True
        if self._native is not None:
            try:  # this runs inside the program's optimizer.step(): it must never raise into it
                started = self._native.start(MAX_WORKER_EVENTS)
            except Exception as e:
                started = False
                self.note = f"the native recorder could not start ({type(e).__name__}: {e}); Kineto records"
            if started:
                self._on = True
                self._profiling = _profiler_enabled
                return True
            self.note = self.note or "the native recorder was already recording; Kineto records"
            self._native = None  # the Kineto session instead
        if _profiler_enabled() or self._program.prepared:
            self.note = "the program runs its own profiler: no gloo worker events, ends unknown"
            return False
        # KINETO state; no shapes, memory, stacks, flops or modules
        flags = (False,) * 5
        activities = {ProfilerActivity.CPU}
        try:  # this runs inside the program's optimizer.step(): it must never raise into it
            config = ProfilerConfig(ProfilerState.KINETO, *flags, _ExperimentalConfig())  # private: may vary
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities, {RecordScope.USER_SCOPE})  # type: ignore[call-arg]  # stub lacks it
        except Exception as e:
            self.note = f"the profiler could not start ({type(e).__name__}: {e}): ends unknown"
            return False
        self._on = True
        # torch.autograd.profiler (behind torch.profiler too) prepares every profiler it starts through
        # this module-level name: a program's profiler starting now takes Kineto over
        original = autograd_profiler._prepare_profiler

        def prepare(*args: Any, **kwargs: Any) -> Any:
            if self._on and not self._taken_over:
                self._taken_over = True
                self._hand_over()
            return original(*args, **kwargs)

        autograd_profiler._prepare_profiler = prepare
        self._restore = lambda: setattr(autograd_profiler, "_prepare_profiler", original)
        return True

    def _hand_over(self) -> None:
        """Stop this session (its events are dropped) before the program's own profiler starts: Kineto
        is one per process, and the program's profiler then starts and stops on a Kineto that nothing
        else runs on, as without skewlens (otherwise it would start over this session, and this one
        would never be stopped)."""
        from torch._C._autograd import _disable_profiler

        try:
            _disable_profiler()
        except Exception as e:  # the program's profiler must start regardless
            self.note = f"the profiler could not be handed over ({type(e).__name__}: {e}): ends unknown"

    def quiet(self) -> bool:
        """Whether calls the hooks time should now be issued with record functions off.

        True once recording past the first :data:`MARKS` steps: their blocking hooked calls' worker
        events have shown which gloo thread serves which group (``build._worker_groups``), and the
        hooked calls need nothing else from this profiler, while profiling each of their gloo work
        items is most of what it costs.
        """
        if self._native is not None:  # a profiler of the program's own sees its calls as without skewlens
            return self._on and len(self._times) >= MARKS and not self._profiling()
        return self._on and not self._taken_over and len(self._times) >= MARKS

    def mark(self) -> None:
        """Count a step; with Kineto leave a step marker (a no-op unless recording, and after the first
        :data:`MARKS` steps: the two clocks keep their offset, a few markers pin it)."""
        if not self._on or self._taken_over:
            return
        if self._native is None:
            leave_mark(self._times)
        elif len(self._times) < MARKS:
            self._times.append(time.time_ns())

    def stop(self) -> list[OpRecord]:
        """Stop; the ``gloo:*`` events on ``time.time_ns()``'s clock (empty when none came back)."""
        if not self._on:
            return []
        self._on = False
        if self._native is not None:
            return self._stop_native()
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self._taken_over:
            self.note = "the program started its own profiler: gloo worker events lost, ends unknown"
            return []
        from torch._C._autograd import _disable_profiler

        try:
            events = list(_disable_profiler().events())
        except Exception as e:  # the trace must still be written: the ends are what is lost
            self.note = f"the profiler could not be stopped ({e}): collective ends unknown"
            return []
        marks = sorted(
            (int(e.start_ns()), int(e.start_ns() + e.duration_ns()))
            for e in events
            if e.name() == STEP_MARK_NAME
        )
        if len(marks) != len(self._times):
            self.note = "the profiler lost its step markers: gloo worker events not used, ends unknown"
            return []
        off = marker_clock_offset(self._times, marks)
        return [
            OpRecord(
                name=e.name(),
                start_ns=int(e.start_ns()) + off,
                dur_ns=int(e.duration_ns()),
                thread=int(e.start_thread_id()),
                is_cpu=True,
            )
            for e in events
            if e.name().startswith("gloo:") and e.duration_ns() >= 0
        ]

    def _stop_native(self) -> list[OpRecord]:
        try:
            events = self._native.stop()
        except Exception as e:  # the trace must still be written: the ends are what is lost
            self.note = f"the native recorder could not be stopped ({type(e).__name__}: {e}): ends unknown"
            return []
        if self._native.dropped:
            self.note = (
                f"{self._native.dropped} gloo worker event(s) not kept (the recorder keeps "
                f"{MAX_WORKER_EVENTS}): their collectives' ends unknown"
            )
        return [
            OpRecord(
                name=e.name, start_ns=e.start_ns, dur_ns=e.end_ns - e.start_ns, thread=e.thread, is_cpu=True
            )
            for e in events  # the library keeps ``gloo:*`` events only
            if e.end_ns >= e.start_ns  # the wall clock may step back (NTP)
        ]
