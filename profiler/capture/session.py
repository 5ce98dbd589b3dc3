"""One rank's capture session: hooks in, step window, and the rank's files out.

Each rank writes ``RUN_DIR/rank-<r>.et`` (atomically, through :class:`EtWriter`) and a small part file
``RUN_DIR/.parts/rank-<r>.json`` with what the manifest needs from it;
:mod:`skewlens.profiler.capture.run` merges the parts into ``manifest.json``. The window is saved when it
ends; if the program exits (or crashes) inside it (or is stopped with SIGTERM, as torchrun stops the
surviving workers when one fails), the steps completed so far are saved from an ``atexit`` / SIGTERM handler
and the part says so.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from skewlens.paths import doc
from skewlens.profiler.atomic import write_json_atomic
from skewlens.profiler.capture import flight
from skewlens.profiler.capture.autostart import ENV_PROFILE
from skewlens.profiler.capture.build import RankCapture, build_nodes
from skewlens.profiler.capture.compat import rpc_running
from skewlens.profiler.capture.records import CommRecord, CudaSyncRecord, OpRecord, StepRecord, WaitRecord
from skewlens.profiler.capture.schedule import Action, Phase, action_for, parse_choice, phases_between
from skewlens.profiler.chakra_io import EtWriter
from skewlens.profiler.errors import CaptureError, SkewlensError
from skewlens.profiler.manifest import (
    PARTS_DIR,
    RAISED_CHARS,
    RAW_DIR,
    RPC_NOTE,
    STEP_MARKS_NOTE,
    ProcessGroupInfo,
    RankNote,
    StepWindow,
    gpu_model,
    rank_file,
    rank_note_key,
)
from skewlens.profiler.vocab import HostTrace, Level

#: How long a captured process waits at exit, the GIL released, before the interpreter finalizes.
EXIT_GRACE_S = 0.05
PART_FILE = "rank-{rank}.json"
#: How many frames above an optimizer's step pre hook are searched for a wrapper's ``step()`` running it.
_OUTER_FRAMES = 8
#: The attribute that marks a wrapper's ``step()`` the capture put its step hooks around.
_STEP_HOOKS_ATTR = "skewlens_step_hooks"
#: Why an ``ops`` / ``full`` rank's trace has no operators: the program profiled itself (Kineto is one
#: session per process, and a second one would leave the program's profiler with no events).
OWN_PROFILER_NOTE = (
    "the program runs its own torch profiler (torch.profiler or torch.autograd.profiler), which keeps "
    "Kineto to itself: operators not recorded "
    "(the trace has the collectives level's content)"
)


def _weak(optimizer: Any) -> Callable[[], Any] | None:
    """A weak reference to ``optimizer``; None for an object that takes none (its liveness is then not known,
    and it keeps marking the steps as before)."""
    try:
        return weakref.ref(optimizer)
    except TypeError:
        return None


def _parameter_elements(optimizer: Any) -> int:
    """How many parameter elements ``optimizer`` updates (its ``param_groups``'; 0 where it has none, or
    they are not tensors)."""
    try:
        return sum(int(p.numel()) for g in optimizer.param_groups for p in g["params"])
    except (AttributeError, KeyError, TypeError):
        return 0


def _unhooked_outer(optimizer: Any) -> Any:
    """Another optimizer whose ``step()`` is running *optimizer*'s and that torch's optimizer step hooks do
    not see (it never ran ``Optimizer.__init__``, which hooks its class's ``step``), or None."""
    from torch.optim import Optimizer

    frame: FrameType | None = sys._getframe(2)  # above this function and the pre hook
    for _ in range(_OUTER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "step" else None
        if isinstance(owner, Optimizer) and owner is not optimizer:
            hooked = getattr(type(owner).step, "hooked", False)
            return None if hooked or getattr(type(owner).step, _STEP_HOOKS_ATTR, False) else owner
        frame = frame.f_back
    return None


def part_file(run_dir: Path, rank: int) -> Path:
    """Path of one rank's part file."""
    return run_dir / PARTS_DIR / PART_FILE.format(rank=rank)


def _write_json_atomic(path: Path, data: Any) -> None:
    write_json_atomic(path, data)


def grace_at_exit() -> None:
    """Release the GIL for :data:`EXIT_GRACE_S` before the interpreter finalizes.

    torch 2.13's gloo worker threads drop their last reference to a finished collective a moment after
    the caller returned from it; when that reference is the last one to a tensor Python owns, the thread
    takes the GIL to free it. If the interpreter is finalizing by then, CPython ends the thread inside a
    C++ destructor and the process aborts ("terminate called without an active exception"; measured in
    about 1 run of 5 of a small DDP script that exits right after its last collective, with or without
    skewlens; pytorch/pytorch#190489 has the same stack). A program that skewlens captures must not fail
    for it, so the capture waits this long at exit, which lets the threads finish.
    """
    time.sleep(EXIT_GRACE_S)


def _joined() -> bool:
    """Whether this process is in a job (its default process group exists)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def groups_made_note(made: list[tuple[str, int]]) -> str:
    """The manifest note of the process groups a rank created inside the window: ((name, ns), ...) in
    creation order (:attr:`~skewlens.profiler.capture.hooks.CommHooks.groups_made`; name '': a group of
    other ranks, which the rank makes too)."""
    names = [f"'{name}'" if name else "one of other ranks" for name, _ns in made]
    shown = ", ".join(names) if len(names) <= 4 else ", ".join(names[:3]) + f", ... {len(names) - 3} more"
    ms = sum(ns for _name, ns in made) / 1e6
    return (
        f"{len(made)} process group(s) created inside the window ({shown}), {ms:.1f} ms in their creation, "
        "where a group's members wait for each other (gloo connects them): no collective records that wait, "
        "which the trace keeps as host time, so a rank late to a group's creation is blamed for none of it "
        f"({doc('docs/capture.md')}, Process groups made inside the window)"
    )


def _group_info(pg: Any) -> ProcessGroupInfo:
    """A process group this rank is a member of: its name, members, description and backend."""
    import torch.distributed as dist

    return ProcessGroupInfo(
        name=str(pg.group_name),
        ranks=tuple(dist.get_process_group_ranks(pg)),
        desc=str(pg.group_desc),
        backend=dist.get_backend_config(pg),
    )


class CaptureSession:
    """Captures this process's recorded steps at ``level`` into ``run_dir``."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        level: Level | str = Level.COLLECTIVES,
        window: StepWindow | None = None,
        keep_raw: bool = False,
        auto_step: bool = True,
        clock_timeout_s: float = 10.0,
        host_trace: HostTrace | str = HostTrace.PROFILER,
    ) -> None:
        self.level = parse_choice(Level, level, "--level")
        self.host_trace = parse_choice(HostTrace, host_trace, "--host-trace")
        self.run_dir = Path(run_dir)
        self.window = window or StepWindow()
        self.keep_raw = keep_raw
        self.auto_step = auto_step
        self.clock_timeout_s = clock_timeout_s
        self.step_index = 0
        self.action = action_for(0, self.window)
        self.steps: list[StepRecord] = []
        self._known_groups: dict[str, ProcessGroupInfo] = {}
        """The process groups seen, by name: those alive at each recorded step's end, before each
        ``destroy_process_group`` inside the window and at the save (one the program destroyed since keeps
        its members: its collectives are in the trace)."""
        self._live_groups: tuple[int, ...] | None = None
        """The identities of the groups alive at the last read of them, whose infos ``_known_groups`` holds:
        a step end that finds the same reads nothing more (None: read them again; each destroy sets it)."""
        self.offset_ns: int | None = 0
        self.notes: dict[str, str] = {}
        self.lost: list[flight.Loss] = []
        """What the flight recorder's ring buffer lost inside the window (see :func:`flight.losses`)."""
        self.saved = False
        self._saving = False  # a save under way (the SIGTERM handler lets it finish)
        self._trace_written = False  # this rank's trace file is in place (its part file next)
        self._step_start = time.time_ns()
        self._started_ns = self._step_start
        """When this rank's capture began (its local clock): the job's start in its run identity."""
        self._main_thread = threading.get_native_id()
        self._pid = os.getpid()
        """The rank's process: a process forked from it (a fork ``Pool``'s worker, which multiprocessing stops
        with SIGTERM) holds a copy of this session, whose steps are the rank's as they were at the fork, and
        saves nothing."""
        self._hooks: Any = None
        self._opt_handles: list[Any] = []
        self._on_term: Callable[[int, Any], None] | None = None  # the SIGTERM handler installed, if any
        self._opt_open: list[int] = []  # the optimizers whose step() is running, outermost first
        # (inner id, wrapper id, wrapper's class name): the wrapper's step() hooked, from its next call
        self._hand_over: tuple[int, int, str] = (0, 0, "")
        self._wrapped_steps: list[tuple[type, Any]] = []  # (class, own step()) of unhooked wrappers
        self._first_optimizer: int | None = None
        # the optimizer whose step() marks the steps, where it can be referred to weakly: once the program
        # lets go of it (a new optimizer after freezing or growing the model), the next to step marks them
        self._first_ref: Callable[[], Any] | None = None
        # id -> (class name, step() calls, parameter elements it updates, read at its first step())
        self._optimizer_steps: dict[int, tuple[str, int, int]] = {}
        self._kineto: Any = None
        self._program_profiler: Any = None  # kineto.ProgramProfiler, from install()
        self._workers: Any = None  # collectives level: gloo's worker events (kineto.WorkerEvents)
        self._workers_skipped = False  # ... not recorded: every collective went through the hooks
        self._workers_from_ns = 0  # when the worker events began
        self._window_waits = False  # for this process to join a job (see install)
        self._job_world = 0  # the world of the job this process joined (0: none)
        self._last_identity: tuple[int, int] | None = None  # (rank, world) last read in a process group
        self.marks_by_hand = False  # steps_by_hand(by_program=True): the program's cap.step() marks steps
        self._until_joined: list[Any] = []
        """What the window's start could not do yet (the process had no process group: a window with no
        wait starts when torch is imported), done at the first step's end after it joined its job."""
        self._et: Any = None
        self._flight = flight.enabled()  # read once: the recorder was sized when the process started
        self._recorder_only: list[CommRecord] = []  # the collectives only the recorder saw (last save)
        self._entries: list[flight.FrEntry] = []  # the recorder's entries (last save)
        # DDP's C++ all_reduce is left alone when the flight recorder sees it, except at the full level
        # (its hook's c10d operator joins the host facts: tensor ids, data dependencies); the recorder
        # then sees every collective, and the hooks can take its sizes (their lean path)
        self._recorder_sees_all = self._flight and self.level != Level.FULL

    # ---- lifecycle -----------------------------------------------------------------------------------
    def install(self) -> CaptureSession:
        """Install the communication hooks and (with ``auto_step``) the optimizer step hook."""
        from skewlens.profiler.capture.hooks import CommHooks

        self._hooks = CommHooks(
            self._recording,
            lambda: self.step_index,
            ddp=not self._recorder_sees_all,
            quiet=self._quiet_calls,
            on_group=self._on_group,
            on_destroy=self._group_destroyed,
            on_unhooked=self._unhooked_ahead,
        )
        self._hooks.install()
        from skewlens.profiler.capture.kineto import ProgramProfiler

        self._program_profiler = ProgramProfiler()
        with contextlib.suppress(Exception):  # a torch without these names: a running profiler is still seen
            self._program_profiler.install()
        if self.auto_step:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._opt_handles = [
                register_optimizer_step_pre_hook(self._on_optimizer_pre),
                register_optimizer_step_post_hook(self._on_optimizer_step),
            ]
        atexit.unregister(grace_at_exit)  # once per process
        atexit.register(grace_at_exit)  # registered first, so it runs after the atexit save
        atexit.register(self._at_exit)
        self._install_sigterm()
        self._step_start = time.time_ns()
        # a process that multiprocessing started and that is in no job yet may be a helper of a rank (a
        # DataLoader worker under the spawn or forkserver method imports torch again): its window begins
        # when it joins a job (creates a process group) or steps; a helper does neither, and runs nothing
        import multiprocessing
        import multiprocessing.util

        multiprocessing.util.register_after_fork(self, CaptureSession._forked)
        child = multiprocessing.current_process().name != "MainProcess"  # set before a spawned one unpickles
        self._window_waits = (child or multiprocessing.parent_process() is not None) and not _joined()
        if not self._window_waits:
            self._run_phases(phases_between(Action.NONE, self.action))
        return self

    def _forked(self) -> None:
        """In a process that multiprocessing forked from this session's (``mp.Process`` or
        ``mp.start_processes(..., start_method="fork")``, a fork ``Pool``'s or DataLoader's worker): its one
        thread is the one that forked. Forked from a process that was in no job and had marked no step (the
        launcher of ranks started by hand, ``python train.py`` whose main starts them), it is a process of
        its own, a rank once it joins a job: it saves as itself, and at its exit, which multiprocessing
        ends with ``os._exit`` (no ``atexit``), through multiprocessing's own exit hooks. Forked from a rank,
        it holds a stale copy of the rank's session and saves nothing. Forked from a launcher that had begun
        its window (``--steps 0:W:A``), it holds a copy of what that started, and is left as it was: it
        saves at the window's end, not at its exit. Before, a forked rank's main thread
        was the launcher's: DDP's all_reduce was taken for another thread's, the rank's wait at the end of
        backward for compute (on 2 gloo ranks whose rank 1 slept 200 ms a step, it was blamed 0.5 ms, a
        host gap), and a forked rank that exited inside the window saved nothing."""
        self._main_thread = threading.get_native_id()
        if _joined() or self.step_index or self.action != Action.NONE:
            return
        import multiprocessing.util

        self._pid = os.getpid()
        self._started_ns = self._step_start = time.time_ns()
        multiprocessing.util.Finalize(self, self._at_exit, exitpriority=0)

    def _on_group(self) -> None:
        """A process group was created: this process is a rank of a job of ``world_size`` ranks."""
        with contextlib.suppress(Exception):  # bookkeeping must never break the program
            self._job_world = self.world_size
        self._begin_window()

    def _begin_window(self) -> None:
        """Run the window's first phases in a process whose window waited for it to join a job."""
        if not self._window_waits:
            return
        self._window_waits = False
        try:
            self._run_phases(phases_between(Action.NONE, self.action))
        except Exception as e:  # inside the program's init_process_group / new_group
            print(f"skewlens: rank {self.rank}: capture window not started: {e}", file=sys.stderr)

    def _group_destroyed(self) -> None:
        """The program is about to destroy a process group (or all): inside the window, keep the members
        of the groups alive now, since the recorded collectives of a destroyed group are in the trace
        (:meth:`_groups`)."""
        with contextlib.suppress(Exception):  # bookkeeping must never break the program
            self._rank_and_world()  # kept for a save after the default group is gone
        if self.action != Action.NONE:
            with contextlib.suppress(Exception):  # bookkeeping must never break the program
                self._groups()
        self._live_groups = None  # a group made after this one is gone may take its identity

    def uninstall(self) -> None:
        if self._hooks is not None:
            self._hooks.uninstall()
        if self._program_profiler is not None:
            self._program_profiler.uninstall()
        self.steps_by_hand()
        atexit.unregister(self._at_exit)
        on_term, self._on_term = self._on_term, None
        main = threading.current_thread() is threading.main_thread()
        if on_term is not None and main and signal.getsignal(signal.SIGTERM) is on_term:  # still ours
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as _install_sigterm found it

    def steps_by_hand(self, *, by_program: bool = False) -> None:
        """Leave the step marks to :meth:`step`: the optimizer step hooks removed, the wrappers' own
        ``step()`` put back. ``by_program``: the program's ``cap.step()`` marks them (it took this session
        with capture() under skewlens profile), so a rank that marks too few is told so at exit."""
        self.marks_by_hand = self.marks_by_hand or by_program
        for handle in self._opt_handles:
            handle.remove()
        self._opt_handles = []
        for cls, own_step in reversed(self._wrapped_steps):
            cls.step = own_step
        self._wrapped_steps = []

    def _recording(self) -> bool:
        return self.action == Action.RECORD

    def _quiet_calls(self) -> bool:
        return self._workers is not None and self._workers.quiet()

    def _on_optimizer_pre(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if id(optimizer) in self._opt_open:  # its last step() raised (no post hook): long over
            del self._opt_open[self._opt_open.index(id(optimizer)) :]
        self._opt_open.append(id(optimizer))
        outer = _unhooked_outer(optimizer)
        if outer is not None:
            self._hook_step_of(type(outer))
            self._hand_over = (id(optimizer), id(outer), type(outer).__name__)

    def _hook_step_of(self, cls: type) -> None:
        """Run the step hooks around ``cls.step`` from its next call on: an optimizer wrapper that never ran
        ``Optimizer.__init__`` (``PostLocalSGDOptimizer``, whose ``step()`` steps its local optimizer, then
        averages the model) has a ``step()`` torch's hooks do not see, and the step would end inside it, at
        its inner optimizer's end, the work after that (the model average) falling into the next step. The
        call that found it ends at its inner optimizer's, as before (its step() is running)."""
        import functools

        cls = next(c for c in cls.__mro__ if "step" in c.__dict__)  # the class defining it
        own_step = cls.__dict__["step"]
        on_pre, on_post = self._on_optimizer_pre, self._on_optimizer_step

        @functools.wraps(own_step)
        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            on_pre(optimizer, args, kwargs)
            out = own_step(optimizer, *args, **kwargs)
            on_post(optimizer, args, kwargs)
            return out

        setattr(step, _STEP_HOOKS_ATTR, True)
        cls.step = step  # type: ignore[attr-defined]
        self._wrapped_steps.append((cls, own_step))

    def _on_optimizer_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if id(optimizer) in self._opt_open:
            del self._opt_open[self._opt_open.index(id(optimizer)) :]
        if self._opt_open:  # stepped inside another optimizer's step() (ZeroRedundancyOptimizer's local
            return  # optimizer, a wrapper's inner one): part of that step
        if self._first_ref is not None and self._first_ref() is None:  # freed: its id may be the new one's
            self._optimizer_steps.pop(self._first_optimizer or 0, None)
            self._first_optimizer = self._first_ref = None
        if self._first_optimizer is None:
            self._first_optimizer = id(optimizer)
            self._first_ref = _weak(optimizer)
        name, calls, size = self._optimizer_steps.get(id(optimizer)) or (
            type(optimizer).__name__,
            0,
            _parameter_elements(optimizer),
        )
        self._optimizer_steps[id(optimizer)] = (name, calls + 1, size)
        if id(optimizer) == self._first_optimizer:
            self.step()
        inner, outer, outer_name = self._hand_over
        if id(optimizer) == inner:  # it ran in a wrapper's step(), whose steps are its from now on: the
            self._hand_over = (0, 0, "")  # wrapper's, as are this one and the training's if it was the first
            _inner_name, inner_calls, inner_size = self._optimizer_steps.pop(inner)
            self._optimizer_steps[outer] = (outer_name, inner_calls, inner_size)
            if self._first_optimizer == inner:  # (_first_ref stays the inner one's, which the wrapper holds)
                self._first_optimizer = outer

    def _optimizer_labels(self) -> dict[int, str]:
        """Each optimizer that stepped (id ->) as the step-marks notes name it: its class, and where another
        of that class that updates another number of parameter elements stepped too, its number (``Adam
        over 66,049 parameters``: a PPO loop's critic and actor, both Adam, were ``Adam, 8 calls ...; others:
        Adam 7``, which did not say which of the two marked the steps)."""
        sizes: dict[str, set[int]] = defaultdict(set)
        for n, _c, size in self._optimizer_steps.values():
            sizes[n].add(size)
        return {
            k: f"{n} over {size:,} parameters" if len(sizes[n]) > 1 else n
            for k, (n, _c, size) in self._optimizer_steps.items()
        }

    def step(self) -> None:
        """Mark the end of the current training step."""
        self._begin_window()
        if self._workers is not None:
            self._workers.mark()
        elif self._kineto is not None:
            self._kineto.mark()
        now = time.time_ns()
        if self.action == Action.RECORD:
            self.steps.append(StepRecord(step=self.step_index, start_ns=self._step_start, end_ns=now))
            self._groups()  # known for a save after the program destroyed them (it ends inside the window)
        self.step_index += 1
        self._step_start = now
        previous, self.action = self.action, action_for(self.step_index, self.window)
        self._run_phases(phases_between(previous, self.action))
        if self._until_joined and self.action != Action.NONE and _joined():
            pending, self._until_joined = self._until_joined, []
            for start in pending:
                start()
            self._step_start = time.time_ns()  # the clock exchange is not the next step's time

    def _run_phases(self, phases: tuple[Phase, ...]) -> None:
        for phase in phases:
            if phase == Phase.START_WARMUP:
                self._start_warmup()
            elif phase == Phase.START_RECORD:
                self._start_record()
            elif phase == Phase.SAVE:
                self.save()

    def _start_warmup(self) -> None:
        if self.level == Level.COLLECTIVES:
            self._start_worker_events()
            return
        import torch

        from skewlens.profiler.capture.kineto import KinetoCapture

        # the full level's host facts come from the profiler's own input/allocation records unless
        # PyTorch's ExecutionTraceObserver was asked for
        facts = self.level == Level.FULL and self.host_trace == HostTrace.PROFILER
        self._kineto = KinetoCapture(
            cuda=torch.cuda.is_available(),
            host_facts=facts,
            on_taken_over=self._operators_taken_over,
            program=self._program_profiler,
        )
        if self._kineto.notes:
            self.notes[rank_note_key(self.rank, RankNote.PROFILER)] = "; ".join(self._kineto.notes)
        if not self._kineto.start():  # the program profiles itself: the collectives level's content
            self._kineto = None
            self.notes[rank_note_key(self.rank, RankNote.OPERATORS)] = OWN_PROFILER_NOTE
            self._start_worker_events()  # the native recorder runs beside the program's profiler

    def _operators_taken_over(self) -> None:
        """The program started its own profiler inside the window, which took Kineto over (this
        session's operators are dropped): record gloo's worker events from now with the native recorder,
        which runs beside the program's profiler, so that the collectives the hooks cannot time (DDP's
        all_reduce) still end, as at the collectives level. Not with the Kineto fallback, which would take
        Kineto back from the program."""
        from skewlens.profiler.capture import native

        if self._workers is not None or self.saved or not native.wanted():
            return
        try:
            recorder = native.load()
        except Exception:  # inside the program's profiler's start: those ends stay unknown, as noted
            return
        self._start_worker_events(native_recorder=recorder)

    def _unhooked_ahead(self) -> None:
        """Collectives that go past the hooks are ahead: a ``DistributedDataParallel`` is being built (its
        constructor's collectives and its gradient all_reduces), or a call was queued in a
        ``_coalescing_manager`` context (issued as one collective at its end). Where the window skipped
        gloo's worker events (every collective had gone through the hooks), they are recorded from now on,
        so that those collectives have ends."""
        if self._workers_skipped and not self.saved:
            self._workers_skipped = False
            self._start_worker_events(past_hooks=True)

    def _start_worker_events(self, *, past_hooks: bool = False, native_recorder: Any = None) -> None:
        """Record gloo's worker events, unless every collective so far went through the hooks (and
        ``past_hooks`` does not say that some will not); with ``native_recorder`` (loaded), with that."""
        from skewlens.profiler.capture.kineto import WorkerEvents

        if not self._flight:
            return
        if not _joined():
            self._until_joined.append(
                lambda: self._start_worker_events(past_hooks=past_hooks, native_recorder=native_recorder)
            )
            return
        # the recorder costs step time (the native one little, the Kineto fallback ~3%); it is there
        # for the collectives the hooks cannot time: none so far (after a step at least), none expected
        hooks = self._hooks
        if not past_hooks and self.step_index > 0 and hooks is not None and hooks.installed:
            try:
                entries = flight.dump_entries()
            except CaptureError:  # unreadable now: record the worker events anyway (save() says why)
                entries = [
                    flight.FrEntry(
                        pg_name="?", seq=1 << 62, op="", created_ns=1, numel=0, dtype="", size_bytes=0
                    )
                ]
            if not flight.unhooked_groups(entries, hooks.issued()):
                self._workers_skipped = True
                return
        self._workers = WorkerEvents(native_recorder or self._native_recorder(), self._program_profiler)
        self._workers_from_ns = time.time_ns()
        if not self._workers.start():
            self.notes[rank_note_key(self.rank, RankNote.WORKER_EVENTS)] = self._workers.note
            self._workers = None

    def _native_recorder(self) -> Any:
        """The native gloo-event recorder (built here when ``skewlens profile`` did not build it), or
        None (and a note) where it cannot be had or ``SKEWLENS_GLOO_EVENTS=kineto`` asks for Kineto."""
        from skewlens.profiler.capture import native

        try:
            if not native.wanted():
                self.notes[rank_note_key(self.rank, RankNote.WORKER_EVENTS_RECORDER)] = (
                    f"{native.ENV_MODE}=kineto: torch's profiler recorded gloo's worker events "
                    "(it costs more than the native recorder)"
                )
                return None
            return native.load()
        except Exception as e:  # inside the program's optimizer.step(): the capture goes on with Kineto
            why = (
                str(e)
                if isinstance(e, CaptureError)
                else f"native gloo-event recorder: {type(e).__name__}: {e}"
            )
            self.notes[rank_note_key(self.rank, RankNote.WORKER_EVENTS_RECORDER)] = (
                f"{why}; torch's profiler recorded gloo's worker events instead (it costs more)"
            )
            return None

    def _start_record(self) -> None:
        if _joined():
            self._start_record_in_job()
        else:
            self._until_joined.append(self._start_record_in_job)
        if self.level == Level.FULL and self.host_trace == HostTrace.OBSERVER:
            from torch.profiler import ExecutionTraceObserver

            raw = self._raw_dir()
            self._et = ExecutionTraceObserver().register_callback(str(raw / f"host_et_rank{self.rank}.json"))
            self._et.start()
        self._step_start = time.time_ns()

    def _start_record_in_job(self) -> None:
        self.offset_ns = self._clock_offset()
        self._start_lean()

    def _start_lean(self) -> None:
        """Record collectives on the hooks' lean path (times only; the rest from the flight recorder)
        where the recorder sees them all with the hooks' sizes: gloo, and DDP's all_reduce left to DDP
        (not the full level, whose hook needs the arguments). A quarter of the recorder's ring buffer at
        most, so that their entries are still there at the end of the window (the other three quarters
        are for the collectives the hooks do not see); past that, the full path reads the arguments."""
        import torch.distributed as dist

        hooks = self._hooks
        if hooks is None or not hooks.installed or not self._recorder_sees_all:
            return
        if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "gloo":
            return
        hooks.lean_left = flight.buffer_size() // 4

    # ---- identity ------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank_and_world()[0]

    @property
    def world_size(self) -> int:
        return self._rank_and_world()[1]

    def _rank_and_world(self) -> tuple[int, int]:
        """(rank, world size): the default process group's while it exists, else the last it had (the
        program destroyed it before its rank saved at exit), else torchrun's ``RANK`` and ``WORLD_SIZE``.
        Ranks started otherwise (``mp.spawn``, ``init_process_group(init_method=..., rank=...)``, a SLURM
        script's own mapping) have no ``RANK``: before, each such rank that saved after destroying its
        group saved as rank 0 of 1, over the others' (2 ranks of an ``mp.spawn`` job gave a run of world
        size 1, exit 0)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self._last_identity = (dist.get_rank(), dist.get_world_size())
            return self._last_identity
        if self._last_identity is not None:
            return self._last_identity
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    def _raw_dir(self) -> Path:
        d = self.run_dir / RAW_DIR if self.keep_raw else self.run_dir / PARTS_DIR / f"raw-{self.rank}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _clock_offset(self) -> int | None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return 0
        from skewlens.profiler.capture.clock import estimate_offset

        store = dist.distributed_c10d._get_default_store()
        off = estimate_offset(store, dist.get_rank(), dist.get_world_size(), timeout_s=self.clock_timeout_s)
        if off is None:
            self.notes[rank_note_key(self.rank, RankNote.CLOCK)] = (
                "clock offset unknown (rank 0 did not answer); 0 assumed"
            )
        return off

    # ---- saving --------------------------------------------------------------------------------------
    def _groups(self) -> list[ProcessGroupInfo]:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            if self._known_groups:  # destroyed since a recorded step: as they were then
                return list(self._known_groups.values())
            return [ProcessGroupInfo(name="0", ranks=(0,), desc="default_pg", backend="")]
        pgs = list(dist.distributed_c10d._world.pg_names)
        # the same groups as at the last read: nothing to read (each recorded step's end asks; reading a
        # group's members and backend cost 5-14 µs of CPU a step, a third of a step mark in a decode loop)
        ids = tuple(map(id, pgs))
        if ids == self._live_groups:
            return list(self._known_groups.values())
        live: dict[str, ProcessGroupInfo] = {}
        complete = True
        for pg in pgs:
            try:
                info = _group_info(pg)
            except (RuntimeError, ValueError, KeyError):  # KeyError: one being created or destroyed
                complete = False
                continue
            live[info.name] = info
        # those the program destroyed inside the window kept, in the order first seen; the live as now
        self._known_groups = {**self._known_groups, **live}
        self._live_groups = ids if complete else None
        return list(self._known_groups.values())

    def _ops(self) -> tuple[list[OpRecord], dict[int, Any], list[CudaSyncRecord]]:
        if self._et is not None:
            self._et.stop()
            self._et.unregister_callback()
        events = self._kineto.stop() if self._kineto is not None else []
        if self._kineto is not None and self._kineto.notes:  # stop() may add one (inferred kinds)
            self.notes[rank_note_key(self.rank, RankNote.PROFILER)] = "; ".join(self._kineto.notes)
        if self._kineto is not None and self._kineto.note:  # taken over by the program's own profiler
            ends = (  # the native recorder took gloo's worker events over from then (_operators_taken_over)
                "those the flight recorder alone saw (DDP's all_reduce) end from gloo's worker events "
                "recorded from when it started"
                if self._workers is not None
                else "the collectives only the flight recorder saw (DDP's all_reduce) no end"
            )
            self.notes[rank_note_key(self.rank, RankNote.OPERATORS)] = (
                f"{self._kineto.note} (its profiler keeps Kineto to itself): the trace has the collectives "
                f"level's content, and {ends}"
            )
        if not events:
            return [], {}, []
        from skewlens.profiler.capture.kineto import (
            activities,
            is_host_event,
            op_records,
            rf_ids_from_chrome_trace,
            sync_records,
        )

        host_ops: dict[int, Any] = {}
        rf_ids: dict[int, int] = {}
        if self.level == Level.FULL and self._et is not None:
            from skewlens.profiler.capture.hostet import parse_host_et

            raw = self._raw_dir()
            kineto_json = raw / f"kineto_rank{self.rank}.json"
            self._kineto.export(kineto_json)
            rf_ids = rf_ids_from_chrome_trace(kineto_json)
            by_rf = parse_host_et(raw / f"host_et_rank{self.rank}.json")
            host_ops = {corr: by_rf[rf] for corr, rf in rf_ids.items() if rf in by_rf}
        else:
            if self.level == Level.FULL:
                from skewlens.profiler.capture.hostfacts import host_facts

                types = {int(e.correlation_id()): e.dtypes() for e in events if is_host_event(e)}
                host_ops = host_facts(self._kineto.event_tree(), types)
            if self.keep_raw:
                self._kineto.export(self._raw_dir() / f"kineto_rank{self.rank}.json")
        kinds = activities(events)  # once: inferred from each event's metadata on torch 2.11 and 2.12
        return op_records(events, rf_ids, kinds), host_ops, sync_records(events, kinds)

    def save(self, *, partial: bool = False) -> Path | None:
        """Write this rank's trace and part file (once); the trace path, or None when already saved or
        when it could not be saved.

        A save runs inside the program (its optimizer.step(), its exit): one that fails (a full disk, a
        quota, an unwritable run directory) must not end the training. It leaves no trace behind (a trace
        without its part file is no part of the run), says why on stderr and, where it can, in a part file
        of its own (``not_saved``), which the manifest's note on the missing rank repeats."""
        if self.saved:
            return None
        self.saved = self._saving = True
        try:
            return self._save(partial=partial)
        except (OSError, SkewlensError) as e:
            self._not_saved(e)
            return None
        finally:
            self._saving = False

    def _part_header(self) -> dict[str, Any]:
        """What every part file of this rank says first: who wrote it, where, and how it captured."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            # torchrun's ranks per host: fewer than the world, the job spans hosts
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)),
            "host": socket.gethostname(),
            "level": self.level.value,
            "window": asdict(self.window),
            # which skewlens profile started the command ('' outside one): see run._not_one_capture
            "profile": os.environ.get(ENV_PROFILE, ""),
        }

    def _not_saved(self, e: OSError | SkewlensError) -> None:
        """Record a failed save: no trace left, the reason in a part file (if that can be written)."""
        rank, trace = self.rank, rank_file(self.run_dir, self.rank)
        why = f"{_named(e, trace)}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
        if self._trace_written:  # the part file failed after it: the trace alone is left out of the run
            trace.unlink(missing_ok=True)
        print(f"skewlens: rank {rank}: trace not saved: {why}", file=sys.stderr)
        # which attempt failed: a restarted command's rank killed before its save leaves this file behind
        ident = run_identity(self._started_ns + (self.offset_ns or 0))
        part = {**self._part_header(), "not_saved": why, "run_identity": ident}
        try:
            _write_json_atomic(part_file(self.run_dir, rank), part)
        except (OSError, SkewlensError) as err:
            print(  # the manifest will say the rank has no trace, and can only guess why
                f"skewlens: rank {rank}: its save failed (above), and so did the part file that tells the "
                f"run why: {err}",
                file=sys.stderr,
            )

    def _save(self, *, partial: bool) -> Path:
        rank, world = self.rank, self.world_size
        comms: list[CommRecord] = []
        waits: list[WaitRecord] = []
        scatters: list[tuple[int, int, int]] = []
        running = 0  # asynchronous calls recorded without an end (the note below)
        if self._hooks is not None:
            self._hooks.lean_left = 0
            self._hooks.uninstall()
            comms = self._hooks.flush()
            waits = self._hooks.waits.flush()
            scatters = self._hooks.waits.flush_scatters()
            if self._hooks.dropped:
                self.notes[rank_note_key(rank, RankNote.CALLS)] = (
                    f"{self._hooks.dropped} communication call(s) not recorded"
                )
            running = self._hooks.running
            if made := self._hooks.groups_made:
                self.notes[rank_note_key(rank, RankNote.GROUPS_MADE)] = groups_made_note(made)
        if rpc_running():
            self.notes[rank_note_key(rank, RankNote.RPC)] = RPC_NOTE
        if len(self._optimizer_steps) > 1 and self._first_optimizer is not None:
            label = self._optimizer_labels()
            first = self._optimizer_steps[self._first_optimizer]
            others = ", ".join(
                f"{label[k]} {c}"
                for k, (_n, c, _size) in self._optimizer_steps.items()
                if k != self._first_optimizer
            )
            self.notes[STEP_MARKS_NOTE] = (
                f"{len(self._optimizer_steps)} optimizers stepped; a step ends at each step() of the first "
                f"to step ({label[self._first_optimizer]}, {first[1]} calls by the end of the window; "
                f"others: {others}): where a training step calls "
                f"several, mark steps with the Python API ({doc('docs/capture.md')})"
            )
        ops, host_ops, syncs = self._ops()
        if self._program_profiler is not None:  # no profiler of the capture's own is started after this
            self._program_profiler.uninstall()
        workers: list[OpRecord] = []
        if self._workers is not None:
            workers = self._workers.stop()
            if self._workers.note:
                self.notes[rank_note_key(rank, RankNote.WORKER_EVENTS)] = self._workers.note
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # skewlens profile refuses it in its environment
            flight.refuse_wrapped_groups(
                dist.get_debug_level().name, "set by the program itself", by_program=True
            )
        device, gpu = "cpu", ""
        import torch

        if torch.cuda.is_available():
            index = torch.cuda.current_device()
            device, gpu = f"cuda:{index}", cuda_gpu(torch, index)
        groups = self._groups()
        comms = self._with_flight_recorder(comms, groups, scatters, partial=partial)
        stopped = None
        if partial:  # where it stopped: the unfinished step is in no trace (only completed steps are)
            extra = set(map(id, self._recorder_only))
            stopped = flight.stop_record(
                [c for c in comms if id(c) not in extra],
                self._entries,
                step=self.step_index,
                step_start_ns=self._step_start,
                saved_ns=time.time_ns(),
                offset_ns=self.offset_ns or 0,
                raised=_raised(),
                inside=self._hooks.inside() if self._hooks is not None else (),
            )
        unread = self._hooks.unread_splits if self._hooks is not None else 0
        if note := flight.even_splits_note(unread, self._recorder_only):
            self.notes[rank_note_key(rank, RankNote.ALL_TO_ALL_SPLITS)] = note
        if note := flight.sparse_all_reduce_note(comms):
            self.notes[rank_note_key(rank, RankNote.COMM_SIZES)] = note
        native_workers = self._workers is not None and self._workers.recorder == "native"
        cap = RankCapture(
            rank=rank,
            comms=comms,
            steps=self.steps,
            groups=groups,
            main_thread=self._main_thread,
            offset_ns=self.offset_ns or 0,
            ops=ops,
            worker_events=workers,
            worker_events_from_ns=self._workers_from_ns if workers else 0,
            mark_times_ns=self._kineto.mark_times_ns if self._kineto is not None else (),
            mark_thread=self._kineto.mark_thread if self._kineto is not None else 0,
            host_ops=host_ops,
            device=device,
            waits=waits,
            syncs=syncs,
            # native thread ids: they name the native recorder's events (Kineto numbers threads its own way)
            group_threads=dict(self._hooks.group_threads)
            if native_workers and self._hooks is not None
            else {},
        )
        gpu_notes: list[str] = []
        data_notes: list[str] = []
        unended: list[int] = []
        nodes = build_nodes(cap, notes=gpu_notes, data_notes=data_notes, unended=unended)
        if running := running + sum(unended):
            self.notes[rank_note_key(rank, RankNote.RUNNING_CALLS)] = (
                f"{running} asynchronous call(s) still running when the window ended "
                "(the program waited for them later, or never): recorded without an end"
            )
        if gpu_notes:
            self.notes[rank_note_key(rank, RankNote.GPU_DEPENDENCIES)] = "; ".join(gpu_notes)
        if data_notes:
            self.notes[rank_note_key(rank, RankNote.DATA_DEPENDENCIES)] = "; ".join(data_notes)
        path = rank_file(self.run_dir, rank)
        meta = {"rank": rank, "world_size": world, "level": self.level.value}
        if self.level == Level.FULL:
            meta["host_trace"] = self.host_trace.value
        with EtWriter(path, meta) as w:
            w.write_all(nodes)
        self._trace_written = True
        off = self.offset_ns or 0
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else ""
        part = {
            **self._part_header(),
            "device": device,
            **({"gpu": gpu} if gpu else {}),
            "backend": str(backend),
            "clock_offset_ns": off,
            "process_groups": [asdict(g) for g in groups],
            "steps": [
                {"step": s.step, "start_ns": s.start_ns + off, "end_ns": s.end_ns + off} for s in self.steps
            ],
            "partial": partial,
            "flight_recorder": flight.buffer_size() if self._flight else 0,
            "lost_collectives": [asdict(x) for x in self.lost],
            "notes": self.notes,
            "torch_version": torch.__version__,
            "run_identity": run_identity(self._started_ns + off),
        }
        if stopped is not None:
            part["stopped"] = {"rank": rank, **stopped}
            # what marked its steps, which the note of its partial trace names (run._partial_note)
            part["step_marks"] = "optimizer" if self._opt_handles and not self.marks_by_hand else "program"
        _write_json_atomic(part_file(self.run_dir, rank), part)
        return path

    def _with_flight_recorder(
        self,
        comms: list[CommRecord],
        groups: list[ProcessGroupInfo],
        scatters: Sequence[tuple[int, int, int]] = (),
        *,
        partial: bool = False,
    ) -> list[CommRecord]:
        """The hooked calls numbered by the flight recorder, plus the collectives only it saw (NCCL's
        ending on the device where the recorder timed them; gloo's all_reduce of a functional
        reduce_scatter, one of ``scatters``' calls, a reduce_scatter: :func:`flight.as_issued`); what its
        ring buffer lost goes to
        :attr:`lost` (and from the part file into the manifest). A complete window waits a moment for
        NCCL's watchdog to time its last collectives (:func:`flight.settle`); a partial save (at exit,
        on SIGTERM) does not."""
        import torch.distributed as dist

        self._recorder_only = []
        self._entries = []
        if not self._flight:
            return comms
        rank = self.rank
        try:
            entries = flight.dump_entries()
            if not partial and self.steps and flight.nccl_timing():
                entries = flight.settle(entries, min(s.start_ns for s in self.steps))
        except CaptureError as e:
            self.notes[rank_note_key(rank, RankNote.FLIGHT_RECORDER_DUMP)] = f"error: {e}"
            entries = []
        self._entries = entries
        spans = flight.device_spans(entries)
        if note := flight.device_time_note(entries, spans, self.steps):
            self.notes[rank_note_key(rank, RankNote.FLIGHT_RECORDER_DEVICE_TIMES)] = note
        comms, lost = flight.resolve(entries, comms)
        # the recorder keeps its entries after the program destroyed its process group (it ended inside
        # the window): they still number the hooked calls, as on every other save (the lean ones have no
        # number of their own, and the store's file-order numbering collided with the full path's)
        if not entries and not (dist.is_available() and dist.is_initialized()):
            self.notes[rank_note_key(rank, RankNote.FLIGHT_RECORDER)] = (
                "not read: the program had destroyed its process group before this rank saved its trace "
                "(it ended inside the capture window), so the collectives only the recorder sees (issued "
                "outside torch.distributed's Python API: DDP's all_reduces, DTensor's functional "
                "collectives) are not in the trace; capture a window that ends before the program does"
            )
            return comms
        recorded = flight.recorded_groups({g.name: g.backend for g in groups})
        if not (dist.is_available() and dist.is_initialized()):
            recorded = {e.pg_name for e in entries}  # the groups are gone; those it has entries of it fed
        mine = [g.name for g in groups if g.name in recorded and rank in g.ranks]
        self.lost = flight.losses(entries, self.steps, mine)
        # the program's own threads (not a C++ thread Python only saw call back: autograd's device thread)
        natives = {
            t.ident: t.native_id
            for t in threading.enumerate()
            if t.ident and t.native_id and not isinstance(t, threading._DummyThread)
        }
        hooked, extra, left_out = flight.merge(
            entries,
            comms,
            self.steps,
            thread=self._main_thread,
            recorded=recorded,
            spans=spans,
            natives=natives,
        )
        extra = flight.as_issued(extra, scatters)
        self._recorder_only = extra
        lost += left_out
        if lost or self.lost:
            ranges = "; ".join(x.describe() for x in self.lost)
            self.notes[rank_note_key(rank, RankNote.LOST_CALLS)] = (
                f"the flight recorder's ring buffer ({flight.FR_BUFFER_ENV}={flight.buffer_size()} entries) "
                f"wrapped: {lost} hooked collective call(s) left out (no entry, so no sequence number)"
                + (f"; lost: {ranges} (declared in the manifest for every member)" if ranges else "")
                + f"; set {flight.FR_BUFFER_ENV} higher"
            )
        if extra:
            if all(c.op.startswith("nccl:") for c in extra):
                ends = "end on the device where the recorder timed it (see the device times note)"
            elif self._workers_skipped:
                ends = (
                    "no end: they began after the steps before the window had issued every collective "
                    "through the hooks, so gloo's worker events were not recorded"
                )
            else:
                ends = "end from gloo's worker thread where it was seen"
            self.notes[rank_note_key(rank, RankNote.FLIGHT_RECORDER)] = (
                f"{len(extra)} collective(s) issued outside torch.distributed's Python API taken from the "
                f"flight recorder ({flight.summary(extra)}): arrival from the recorder, {ends}"
            )
        return hooked + extra

    def _stop_unsaved(self) -> None:
        """Stop what the window started in a process that recorded no step and saves nothing (the
        launcher of ``mp.spawn``, a helper process): a profiler session still running when the
        interpreter finalizes crashes it (SIGSEGV)."""
        import contextlib

        for recorder in (self._kineto, self._workers):
            if recorder is not None:
                with contextlib.suppress(Exception):
                    recorder.stop()
        if self._et is not None:
            with contextlib.suppress(Exception):
                self._et.stop()
                self._et.unregister_callback()
        self._kineto = self._workers = self._et = None

    def _why_no_step(self) -> str | None:
        """Why this rank recorded no step: where ``cap.step()`` marks them, too few marks
        (:meth:`_why_few_marks`); where its optimizers do, it stepped none (a rank that
        only scores for another's training, which skewlens profile called crashed or killed before saving), or
        the first optimizer to step, which alone marks steps, stepped fewer times than another (a reward model
        trained first, then the policy: profile asked whether the program ran enough steps "each ended by
        optimizer.step()", which it had). None otherwise, in a program that raised, and in a process of no
        job of several ranks (a helper process; a script of one process keeps profile's own question)."""
        if _raised():
            return None  # it failed first
        if self.marks_by_hand:
            return self._why_few_marks()
        if not self._opt_handles:
            return None  # the program marks its steps (uninstalled)
        if not self._optimizer_steps:
            if self._job_world < 2:
                return None
            return (
                "this rank marked no step: it stepped no optimizer, and only optimizer.step() marks steps; a "
                "rank that trains nothing of its own (a reward model's or a teacher's inference for the "
                "others), or one that updates its parameters without an optimizer, marks its steps with the "
                "Python API: `with capture(RUN_DIR) as cap:` around its loop, cap.step() at the end of each "
                f"step ({doc('docs/capture.md')})"
            )
        if self._first_optimizer not in self._optimizer_steps:
            return None
        calls = self._optimizer_steps[self._first_optimizer][1]
        others = {k: v for k, v in self._optimizer_steps.items() if k != self._first_optimizer}
        if not any(c > calls for _n, c, _size in others.values()):
            return None
        w = self.window
        label = self._optimizer_labels()
        listed = ", ".join(f"{label[k]} {c}" for k, (_n, c, _size) in others.items())
        return (
            f"no step of the window (steps {w.wait + w.warmup}-{w.wait + w.warmup + w.active - 1}) ended: "
            f"a step ends at each step() of the first optimizer to step ({label[self._first_optimizer]}, "
            f"{calls} calls; others: "
            f"{listed}), and only it marks steps; where the training's steps are another optimizer's, mark "
            f"them with the Python API (cap.step(), {doc('docs/capture.md')})"
        )

    def _why_few_marks(self, *, under_profile: bool = True) -> str | None:
        """Why a program that marks its steps with ``cap.step()`` (capture() under profile, or its own
        when not ``under_profile``) recorded none: it marked fewer than the window waits and warms up for
        (profile asked whether it had run enough steps "each ended by optimizer.step()", which marks none
        there). None in a process that marked none and joined no job (a helper process: profile keeps its
        own question; a capture() block of its own is a job's, begun after init_process_group)."""
        if self.step_index == 0 and self._job_world == 0 and under_profile:
            return None
        w = self.window
        first, last = w.wait + w.warmup, w.wait + w.warmup + w.active - 1
        steps = f"steps {first}-{last}" if last > first else f"step {first}"
        marked = f"{self.step_index} step(s)" if self.step_index else "no step"
        spec = f"{w.wait}:{w.warmup}:{w.active}"
        how, option, tail = (
            "capture() under skewlens profile, where only it marks steps",
            f"--steps {spec}",
            "run more steps or give a smaller --steps",
        )
        if not under_profile:
            how, option = "capture() without auto_step=True, where only it marks steps", f'steps="{spec}"'
            tail = (
                "call cap.step() at the end of each step, and run more steps or give capture() smaller steps"
            )
        return (
            f"no step of the window ({steps}) ended: the program marked {marked} with cap.step() ({how}), "
            f"and the window's first recorded step ends at mark {first + 1} ({option}: {w.wait} step(s) of "
            f"wait, {w.warmup} of warm-up); {tail}"
        )

    def close(self) -> None:
        """The end of a ``capture()`` block that raised nothing: the trace saved (partial where the window
        was not done), unless the block recorded no step, which saves none and says why on stderr (what it
        marked: :meth:`_why_few_marks`), as a rank under skewlens profile does. Before, it saved a trace
        of no step whose stop record had every collective the flight recorder saw since the block began in
        flight, none of them recorded (a loop without ``cap.step()`` on 2 gloo ranks: check's `step 0 did
        not finish: ranks 0-1 in scatter 0#105`, a collective both had finished, and analyze exited 0)."""
        if self.steps:
            self.save(partial=self.action != Action.DONE)
            return
        self._stop_unsaved()
        why = self._why_no_step() if self._opt_handles else self._why_few_marks(under_profile=False)
        self.saved = True
        w = self.window
        self._not_saved(CaptureError(why or f"no step of the window ended (steps {w.wait + w.warmup} on)"))

    def _install_sigterm(self) -> None:
        """Save the completed steps when killed with SIGTERM (torchrun stops the other workers so)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the program handles SIGTERM itself; atexit still saves if it exits normally
        import contextlib

        # A save may already be under way when the signal comes: the window's end, or the atexit save of
        # a rank whose collective failed because a peer died (torchrun's SIGTERM follows that peer's exit
        # within its 0.1 s monitor interval). Dying then would leave the trace without its part file, and
        # the run without a manifest: the handler lets that save finish and terminates right after.
        grace_s = 10.0  # bounded (torchrun sends SIGKILL 30 s after SIGTERM)
        deferred: list[int] = []  # the signal already put off once: the next delivery terminates

        def busy(part: Path) -> bool:
            # saving (interrupted right here, or on another thread); a failed save is over
            return self._saving and not part.is_file()

        def terminate_when_done(signum: int, part: Path) -> None:
            deadline = time.monotonic() + grace_s
            while busy(part) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signum)  # again: on_term runs on the main thread and terminates

        def on_term(signum: int, _frame: Any) -> None:
            part = part_file(self.run_dir, self.rank)
            if not deferred and os.getpid() == self._pid and busy(part):
                deferred.append(signum)
                watcher = threading.Thread(
                    target=terminate_when_done, args=(signum, part), name="skewlens-sigterm", daemon=True
                )
                # no new threads at interpreter shutdown (Python 3.12+): that is the atexit save, and the
                # process exits right after it anyway
                with contextlib.suppress(RuntimeError):
                    watcher.start()
                return
            self._at_exit()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, on_term)
        self._on_term = on_term

    def _at_exit(self) -> None:
        if os.getpid() != self._pid:  # a forked helper, terminated: its steps are a stale copy of the rank's
            return
        if not self.saved and not self.steps:
            self._stop_unsaved()
            if (why := self._why_no_step()) is not None:
                self.saved = True
                self._not_saved(CaptureError(why))
        if self.saved or not self.steps:
            return
        try:
            self.save(partial=True)
        except Exception as e:
            print(f"skewlens: rank {self.rank}: could not save the partial trace: {e}", file=sys.stderr)


def _named(e: OSError, trace: Path) -> str | Path:
    """The file an OSError of a save is about: the trace where it names none, or the trace's temporary
    file (its rename into place: ``filename2`` is the trace)."""
    name = e.filename2 or e.filename
    if name is None or Path(name).name.startswith(f".{trace.name}."):
        return trace
    return name


def run_identity(started_ns: int) -> dict[str, Any]:
    """The job this rank belongs to, from torchrun's environment (a part file's ``run_identity``, the
    manifest's :class:`~skewlens.profiler.manifest.RunIdentity`)."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return {
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID", ""),
        "rendezvous": f"{addr}:{port}" if addr and port else "",
        "started_ns": started_ns,
        # the attempt, as this rank's torchrun agent counts its restarts (agents of a job may count apart)
        "restart_count": int(restarts) if restarts.isascii() and restarts.isdigit() else 0,
    }


def cuda_gpu(torch: Any, index: int) -> str:
    """CUDA device ``index`` in words, as the manifest's ``gpus`` say it (:func:`gpu_model`: name, SMs,
    memory, from ``torch.cuda.get_device_properties``); '' where the device cannot say (a CUDA error: the
    save goes on without it, as a trace without ``deviceProperties`` is imported)."""
    try:
        props = torch.cuda.get_device_properties(index)
        return gpu_model(
            getattr(props, "name", None),
            getattr(props, "multi_processor_count", None),
            getattr(props, "total_memory", None),
        )
    except RuntimeError:
        return ""


def _raised() -> str:
    """The exception the program ended with, where it ended so (``RuntimeError: bad batch``, its first line):
    the interpreter keeps an unhandled one in ``sys.last_value`` once it has printed it, before the
    ``atexit`` save; '' otherwise (a save at the window's end, or on SIGTERM)."""
    exc = getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException):
        return ""
    text = f"{type(exc).__name__}: {str(exc).strip()}".removesuffix(": ")
    return text.splitlines()[0][:RAISED_CHARS]
