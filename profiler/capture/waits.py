"""Where a host thread blocked on an asynchronous communication result: the hooks and the trace's nodes.

An asynchronous collective is an issue and, later, a wait. Two waits are visible from Python and recorded
at every level:

- ``torch.distributed._functional_collectives.wait_tensor``: what DTensor's ``AsyncCollectiveTensor``
  calls (``trigger_wait``, through the module global at call time) when the result of a functional
  collective is first used, and what the functional collectives' autograd functions call. Its node is
  named ``_c10d_functional::wait_tensor``. ``torch.ops._c10d_functional.wait_tensor`` called directly
  passes no Python function: at the ``ops`` and ``full`` levels Kineto's operator of that name stands for
  it (where no hooked wait covers it); at the ``collectives`` level it is not seen.
- ``Work.wait()`` on a Work that a hooked call with ``async_op=True`` returned (FSDP2's prefetched
  all_gather, a user's ``dist.all_reduce(..., async_op=True).wait()``), and ``Future.wait()`` on a future
  that stands for such a Work: the one its ``get_future()`` returned, one chained from that by ``then``
  (``work.get_future().then(cb)``), and the future of ``torch.futures.collect_all`` of them, which
  ``torch.futures.wait_all`` waits on. Only the first wait on each Work, through any of these, is recorded
  (a later one returns at once, or waits for a callback of the program's). A wait on a ``collect_all``
  future stands for a wait on each Work it holds in list order: the first that was not waited for spans
  the call, the others take no time at its return (the program then waits on each, at once). A wait in a
  callback given to such a future (``then``, ``add_done_callback``) is none: it runs once the Work is
  done, usually on the backend's thread, not where the program waited. Its node is
  named ``c10d::wait``. ``Future.value()`` waits for nothing (on a future not yet done it raises): it is
  not a wait. DDP's reducer waits in C++: not seen. FSDP2's own unshards and reduce_scatters pass
  ``async_op=False``: on gloo each blocks in its call, a blocking collective with no wait node.

Each becomes a COMP node on the waiting thread spanning the call (start to return), with a control
dependency on the COMM node it waited for. The node cuts the ``compute`` gaps (collectives level) and the
``untraced`` time (ops/full) around it, and at ``ops``/``full`` an outermost operator that encloses a wait
is replaced by its children, as one enclosing a blocking collective is: no time is counted twice on a
thread. Every recorded wait is kept, however short (a wait that found its collective done is still the
point where the program consumed it); one whose collective is not in the trace has no dependency.

Which COMM node a wait waited for:

- ``c10d::wait``: the one the hooks recorded for the call that returned the Work (the same thread and
  start), whether the program waited on the Work or on a future standing for it.
- ``_c10d_functional::wait_tensor``: the functional collective is not known by the tensor (the flight
  recorder's entry has no tensor), so it is matched in time, waits in start order, among the asynchronous
  collectives that did not go through the hooks (the flight recorder's), issued from the waiting thread
  (the recorder's thread id, else the same stream) before the wait began and not taken by an earlier wait.
  Of those that completed by the time the wait returned (within :data:`END_SLACK_NS` of clock error), the
  one that completed last, if it completed during the wait (the wait blocked on it: a wait returns as soon
  as its own collective completes, so one that completed after that could not have kept it waiting);
  if every candidate completed before the wait began (it returned at once), the earliest issued one (the
  program waits in issue order, as DTensor does); if none had completed by the time the wait returned
  (their recorded ends cannot be right), the earliest issued one too.
  One that took no Work off torch's registry of functional collectives' Works (the hooks count it before
  and after the call) waited for none: its result had been waited for already. DTensor makes such a
  second wait where two ``AsyncCollectiveTensor`` wrappers share one result (sequence parallelism's
  residual add after ``RowwiseParallel(output_layouts=Shard(1))`` waits on both); taken for the oldest
  unwaited collective, it would give a gloo reduce_scatter (whose end is its wait's return) a 6 µs wait
  on rank 0, the 2.7 ms wait that blocked on it none, and the member an end 2.0 ms before the other rank
  issued it.

Every hook (these and :mod:`skewlens.profiler.capture.hooks`'s) is the original call while
``torch.compiler.is_compiling()``: a compiled graph calls ``funcol.wait_tensor`` and ``dist.all_reduce``
through them (dynamo inlines Python functions), so a hook traced as it runs would make the graph guard on
the window's state and break at the hook's C++ calls. Before, on 2 gloo ranks, a compiled module calling
``funcol.all_reduce`` and ``all_gather_tensor`` recompiled at each phase of the window (3 times) and ran as 3
graphs with its collectives between them: its first recorded step took 8.6 s and the next 18-43 ms,
against 6.1-6.6 ms now. Its waits are then the graph's own (``torch.ops._c10d_functional.wait_tensor``),
seen at the ``ops`` and ``full`` levels. Putting a hook back when the capture ends still changes what the
graph guarded on: one recompile after the window (1.0 s on that run).

A collective completed by the time the wait on it returned: a recorded end after that (a worker event
of a later call taken for its own) is moved to the wait's return, so every end lies within the work that
consumes it.

The same hooks also time ``torch.distributed._functional_collectives.reduce_scatter_single`` (DTensor's
``Partial`` to ``Shard``, sequence parallelism's ``RowwiseParallel(output_layouts=Shard(1))``; the
deprecated ``reduce_scatter_tensor`` calls it through the module global): gloo runs a functional
reduce_scatter as an all_reduce of the whole input, and its recorder entry says ``gloo:all_reduce``, so
only the call's span on its thread tells what the program asked for
(:func:`skewlens.profiler.capture.flight.as_issued`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from skewlens.profiler.capture.patches import Patches
from skewlens.profiler.capture.records import WaitRecord
from skewlens.profiler.chakra_io import AttrValue
from skewlens.profiler.vocab import WAIT_NODE_NAMES, Attr, NodeType, names_compile_work

if TYPE_CHECKING:
    from skewlens.profiler.capture.build import RankCapture, Reach, _Proto, _Streams

#: Node name of a functional collective's wait.
WAIT_TENSOR_NAME = "_c10d_functional::wait_tensor"
#: Node name of ``Work.wait()``.
WORK_WAIT_NAME = "c10d::wait"
assert {WAIT_TENSOR_NAME, WORK_WAIT_NAME} <= WAIT_NODE_NAMES
#: A collective may appear to complete this long after the wait on it returned (clock error between the
#: hooks and the recorders of collective ends).
END_SLACK_NS = 200_000
#: Issued collectives not waited yet that a ``wait_tensor`` may take (the oldest are dropped past this).
MAX_PENDING = 1024
#: Prefix of the hooks' own op names: collectives that went through torch.distributed's Python functions.
HOOKED_PREFIX = "c10d::"

_Raw = tuple[str, int, int, int, int, int, int, int, bool]

#: The functional collectives' reduce_scatter whose calls are timed (see the module docstring).
FUNCTIONAL_REDUCE_SCATTER = "reduce_scatter_single"


class _Issued:
    """A recorded asynchronous call: its start and issuing thread, and whether a wait on it was recorded
    (through its Work or any future standing for it)."""

    __slots__ = ("start_ns", "thread", "waited")

    def __init__(self, start_ns: int, thread: int) -> None:
        self.start_ns, self.thread, self.waited = start_ns, thread, False


class WaitHooks:
    """Wraps ``wait_tensor``, ``Work.wait`` and ``Future.wait``; records each wait made while
    ``recording()`` is true, and the span of each functional reduce_scatter call
    (:data:`FUNCTIONAL_REDUCE_SCATTER`).

    A recorded asynchronous call's Work stands for it, as does each future got from the Work
    (``get_future``), chained from one that does (``then``) or collecting some that do (``collect_all``):
    the wrappers of those three note what the result stands for, so that the first wait on any of them is
    the call's wait."""

    def __init__(self, recording: Callable[[], bool], step_of: Callable[[], int]) -> None:
        self._recording = recording
        self._step_of = step_of
        self._waits: list[_Raw] = []  # list.append: thread-safe
        # id(work or future) -> (a weak reference to it, the recorded calls it stands for, in order): Works
        # of recorded async calls and their futures, until waited on (pybind's Work and Future take no
        # attributes, but weak references); forgotten at each flush
        self._works: dict[int, tuple[weakref.ref[Any], tuple[_Issued, ...]]] = {}
        self._patches = Patches()
        self._scatters: list[tuple[int, int, int]] = []  # (thread ident, start, end) of each call
        # depth: how many callbacks of such futures this thread is running (their waits are none: see
        # _wrap_stands_for)
        self._callbacks = threading.local()
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        import torch
        import torch._C._distributed_c10d as c10d
        import torch.distributed._functional_collectives as funcol
        from torch._C._distributed_c10d import Work
        from torch.compiler import is_compiling

        orig_tensor = funcol.wait_tensor
        # how many Works torch's registry holds (torch 2.13's; without it every wait took its Work)
        pending = getattr(c10d, "_get_work_registry_size", None)
        self._patches.set(
            funcol, "wait_tensor", orig_tensor, self._wrap_tensor(orig_tensor, pending, is_compiling)
        )
        # torch.futures.Future's wait and then call these (super()), as collect_all and wait_all call
        # torch._C._collect_all, each at call time
        future = torch._C.Future
        for owner, name, wrap in (
            (Work, "wait", self._wrap_wait),
            (future, "wait", self._wrap_wait),
            (Work, "get_future", self._wrap_stands_for),
            (future, "then", functools.partial(self._wrap_stands_for, callback=True)),
            (future, "add_done_callback", functools.partial(self._wrap_stands_for, callback=True)),
            (torch._C, "_collect_all", functools.partial(self._wrap_stands_for, of_list=True)),
        ):
            orig = getattr(owner, name, None)
            if orig is not None:
                self._patches.set(owner, name, orig, wrap(orig, is_compiling))
        orig_scatter = getattr(funcol, FUNCTIONAL_REDUCE_SCATTER, None)
        if orig_scatter is not None:  # (torch 2.13's name; an older torch's calls are not timed)
            self._patches.set(
                funcol,
                FUNCTIONAL_REDUCE_SCATTER,
                orig_scatter,
                self._wrap_scatter(orig_scatter, is_compiling),
            )
        self.installed = True

    def uninstall(self) -> None:
        self._patches.put_back()
        self.installed = False

    def issued(self, work: Any, start_ns: int, thread: int) -> None:
        """A recorded asynchronous call that started at ``start_ns`` on ``thread`` returned ``work``."""
        try:
            ref = weakref.ref(work)
        except TypeError:
            return
        self._works[id(work)] = (ref, (_Issued(start_ns, thread),))

    def _wrap_tensor(
        self, orig: Callable[..., Any], pending: Callable[[], int] | None, compiling: Callable[[], bool]
    ) -> Callable[..., Any]:
        """``pending``: how many Works torch's registry holds (the op takes its tensor's off, if any).
        ``compiling``: ``torch.compiler.is_compiling`` (see the module docstring)."""
        recording, step_of, waits = self._recording, self._step_of, self._waits
        clock, native, ident = time.time_ns, threading.get_native_id, threading.get_ident

        def wait_tensor(tensor: Any) -> Any:
            if compiling() or not recording():
                return orig(tensor)
            before = pending() if pending is not None else 1
            start = clock()
            out = orig(tensor)
            end = clock()
            # none taken off: its result was waited for already (another thread's issue meanwhile would
            # hide one taken: rare, as functional collectives are issued by the thread that waits on them)
            took = pending is None or pending() < before
            waits.append((WAIT_TENSOR_NAME, start, end, native(), ident(), step_of(), -1, 0, took))
            return out

        wait_tensor.__doc__ = orig.__doc__
        wait_tensor.__wrapped__ = orig  # type: ignore[attr-defined]
        return wait_tensor

    def _wrap_wait(self, orig: Callable[..., Any], compiling: Callable[[], bool]) -> Callable[..., Any]:
        """``Work.wait`` and ``Future.wait``: on a Work or future that stands for recorded calls none of
        which was waited for, one ``c10d::wait`` for each (the first spans the call, the others, of a
        ``collect_all``, begin at its return)."""
        recording, step_of, waits, works = self._recording, self._step_of, self._waits, self._works
        clock, native, ident = time.time_ns, threading.get_native_id, threading.get_ident
        callbacks = self._callbacks

        def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or getattr(callbacks, "depth", 0) > 0:
                return orig(self, *args, **kwargs)
            entry = works.pop(id(self), None) if works else None
            if entry is None or entry[0]() is not self or not recording():
                return orig(self, *args, **kwargs)
            calls = [c for c in entry[1] if not c.waited]
            if not calls:  # waited for already, through another Work or future
                return orig(self, *args, **kwargs)
            for c in calls:
                c.waited = True
            start = clock()
            out = orig(self, *args, **kwargs)
            end = clock()
            t, i, st = native(), ident(), step_of()
            for c in calls:
                waits.append((WORK_WAIT_NAME, start, end, t, i, st, c.start_ns, c.thread, True))
                start = end
            return out

        wait.__doc__ = orig.__doc__
        wait.__wrapped__ = orig  # type: ignore[attr-defined]
        return wait

    def _wrap_stands_for(
        self,
        orig: Callable[..., Any],
        compiling: Callable[[], bool],
        *,
        of_list: bool = False,
        callback: bool = False,
    ) -> Callable[..., Any]:
        """``Work.get_future`` and ``Future.then``: the future returned stands for what ``self`` does;
        ``of_list``: ``torch._C._collect_all``, for what its futures do, in list order. ``callback``
        (``then``, ``add_done_callback``): the callback given a future that stands for recorded calls
        makes no wait on them: it runs once the future is done (on the thread that completed it, or at
        once in this call), and ``fut.wait()`` in it, as torch's documentation writes callbacks, is not
        where the program waited (taken for the call's wait, it would leave out the wait that blocked)."""
        works, callbacks = self._works, self._callbacks

        def stands_for(first: Any, *args: Any, **kwargs: Any) -> Any:
            if not works or compiling():
                return orig(first, *args, **kwargs)
            calls: list[_Issued] = []
            for f in first if of_list else (first,):
                entry = works.get(id(f))
                if entry is not None and entry[0]() is f:
                    calls += entry[1]
            if calls and callback and args:
                args = (_no_waits(args[0], callbacks), *args[1:])
            out = orig(first, *args, **kwargs)
            if calls and out is not None:
                with contextlib.suppress(TypeError):  # (a future takes weak references)
                    works[id(out)] = (weakref.ref(out), tuple(calls))
            return out

        stands_for.__doc__ = orig.__doc__
        stands_for.__wrapped__ = orig  # type: ignore[attr-defined]
        return stands_for

    def _wrap_scatter(self, orig: Callable[..., Any], compiling: Callable[[], bool]) -> Callable[..., Any]:
        recording, scatters = self._recording, self._scatters
        clock, ident = time.time_ns, threading.get_ident

        def reduce_scatter_single(*args: Any, **kwargs: Any) -> Any:
            if compiling() or not recording():
                return orig(*args, **kwargs)
            start = clock()
            out = orig(*args, **kwargs)
            scatters.append((ident(), start, clock()))
            return out

        reduce_scatter_single.__doc__ = orig.__doc__
        reduce_scatter_single.__wrapped__ = orig  # type: ignore[attr-defined]
        return reduce_scatter_single

    def flush_scatters(self) -> list[tuple[int, int, int]]:
        """The functional reduce_scatter calls timed since the last flush: (thread ident, start, end)."""
        raw = self._scatters[:]
        del self._scatters[: len(raw)]
        return raw

    def flush(self) -> list[WaitRecord]:
        """The waits recorded since the last flush (and forget the Works not waited yet)."""
        raw = self._waits[:]
        del self._waits[: len(raw)]  # the wrappers keep appending to this list object
        self._works.clear()
        return [
            WaitRecord(
                name=n,
                start_ns=s,
                end_ns=e,
                thread=t,
                ident=i,
                step=st,
                issue_start_ns=iss,
                issue_thread=it,
                took_work=took,
            )
            for n, s, e, t, i, st, iss, it, took in raw
        ]


def _no_waits(callback: Callable[[Any], Any], callbacks: threading.local) -> Callable[[Any], Any]:
    """``callback``, with the waits it makes not recorded (:meth:`WaitHooks._wrap_stands_for`)."""

    def run(fut: Any) -> Any:
        callbacks.depth = getattr(callbacks, "depth", 0) + 1
        try:
            return callback(fut)
        finally:
            callbacks.depth -= 1

    return run


# ---- the trace's nodes (pure) ------------------------------------------------------------------------


class _Wait(NamedTuple):
    name: str
    start_ns: int
    end_ns: int
    stream: int
    ident: int  # 0: unknown (a wait Kineto saw)
    step: int
    issue: tuple[int, int] | None  # Work.wait: (issuing stream, start) of the call that returned the Work
    took: bool  # wait_tensor: it took a Work off torch's registry (WaitRecord.took_work)


def wait_protos(
    cap: RankCapture, streams: _Streams, comms: Sequence[_Proto], alias: Mapping[int, int]
) -> tuple[list[_Proto], dict[int, _Proto]]:
    """COMP nodes of the waits inside the recorded steps, and for each (by ``id``) the COMM node it
    waited for (see the module docstring for the rule); ``comms`` are :func:`build._comm_protos`'s,
    ``alias`` :func:`build.kineto_thread_alias`'s (the caller's, of ``cap``).

    At the ops and full levels, a ``_c10d_functional::wait_tensor`` operator that Kineto recorded outside
    every hooked wait (the op called directly, ``torch.ops._c10d_functional.wait_tensor``) is a wait too.
    """
    from skewlens.profiler.capture.build import _Proto

    steps = {s.step for s in cap.steps}
    waits = [_hooked(w, streams) for w in cap.waits if w.step in steps]
    waits += _kineto_waits(cap, streams, waits, alias)
    if not waits:
        return [], {}
    waits.sort(key=lambda w: (w.start_ns, w.end_ns))
    ident_of: dict[tuple[str, int], int] = {(c.op, c.start_ns): c.ident for c in cap.comms}
    by_issue: dict[tuple[int, int], _Proto] = {}  # (issuing stream, start) -> hooked async comm
    funcols: list[tuple[_Proto, int]] = []  # async comms past the hooks (the recorder's) by start, ident
    for p in sorted((p for p in comms if p.issue_stream >= 0), key=lambda p: p.start_ns):
        if p.name.startswith(HOOKED_PREFIX):
            by_issue[(p.issue_stream, p.start_ns)] = p
        else:
            funcols.append((p, ident_of.get((p.name, p.start_ns), 0)))
    out: list[_Proto] = []
    target: dict[int, _Proto] = {}
    pending: list[tuple[_Proto, int]] = []  # issued, not waited yet
    k = 0
    for w in waits:
        attrs: dict[str, AttrValue] = {Attr.IS_CPU_OP: True, Attr.STEP: w.step, Attr.STREAM_KIND: "thread"}
        p = _Proto(
            name=w.name, node_type=NodeType.COMP, start_ns=w.start_ns, end_ns=w.end_ns, stream=w.stream,
            attrs=attrs,
        )  # fmt: skip
        out.append(p)
        if w.issue is not None:
            t = by_issue.get(w.issue)
        elif not w.took:
            t = None  # a second wait on a result already waited for: it waited for no collective
        else:
            while k < len(funcols) and funcols[k][0].start_ns <= w.start_ns:
                pending.append(funcols[k])
                k += 1
            del pending[:-MAX_PENDING]
            mine = [c for c, i in pending if (i == w.ident if i and w.ident else c.issue_stream == w.stream)]
            t = _waited_for(w, mine)
            if t is not None:
                pending = [ci for ci in pending if ci[0] is not t]
        if t is not None:
            target[id(p)] = t
            if t.end_known and t.end_ns > w.end_ns:
                t.end_ns = max(w.end_ns, t.start_ns)  # it completed by the time its wait returned
    return out, target


def _hooked(w: WaitRecord, streams: _Streams) -> _Wait:
    issue = (streams.thread(w.issue_thread), w.issue_start_ns) if w.issue_start_ns >= 0 else None
    return _Wait(w.name, w.start_ns, w.end_ns, streams.thread(w.thread), w.ident, w.step, issue, w.took_work)


def _kineto_waits(
    cap: RankCapture, streams: _Streams, hooked: Sequence[_Wait], alias: Mapping[int, int]
) -> list[_Wait]:
    """Kineto's ``wait_tensor`` operators inside the steps that no hooked wait covers (one that begins at
    most ``END_SLACK_NS`` before a hooked wait and overlaps it is that wait's operator), but those inside
    torch.compile's compile-time work (:func:`_compiling`: dynamo and AOTAutograd trace the graph's
    ``wait_tensor`` on fake tensors, which waits for nothing) and those inside another on their thread (the
    same wait dispatched again through a Python dispatch mode, on the first call of a new graph)."""
    from skewlens.profiler.capture.build import Reach, step_of

    ops = sorted((o for o in cap.ops if o.is_cpu and o.name == WAIT_TENSOR_NAME), key=lambda o: o.start_ns)
    if not ops:
        return []
    covered = Reach((w.start_ns, w.end_ns) for w in hooked)
    compiling = _compiling(cap)
    ordered = sorted(cap.steps, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in ordered]
    taken_end: dict[int, int] = {}  # thread -> end of the last wait taken on it
    out = []
    for o in ops:
        end = o.start_ns + o.dur_ns
        step = step_of(o.start_ns, starts, ordered)
        # inside a hooked wait, up to the clock error between the hooks and Kineto (the operator may seem
        # to begin a little before the Python call around it): that wait, not a second one
        if step < 0 or covered(o.start_ns + END_SLACK_NS) >= o.start_ns:
            continue
        if (reach := compiling.get(o.thread)) is not None and reach(o.start_ns) >= end:
            continue
        if taken_end.get(o.thread, -1) >= end:
            continue
        taken_end[o.thread] = end
        native = alias.get(o.thread)
        stream = streams.thread(native if native is not None else ("kineto", o.thread))
        out.append(_Wait(WAIT_TENSOR_NAME, o.start_ns, end, stream, 0, step, None, True))
    return out


def _compiling(cap: RankCapture) -> dict[int, Reach]:
    """Per Kineto thread, the spans of torch.compile's compile-time work: its frame (``dynamo``) and
    ``dynamo_timed``'s record functions (:data:`~skewlens.profiler.vocab.COMPILE_MARK`). A ``wait_tensor``
    traced in them (on 2 gloo ranks, a recompile mid-window: 14 a rank, 131 ms of tracing on rank 0) was
    a wait for no collective, and its time communication: the step's exposed transfer 74.0 ms against
    17-24 ms in the steps around it."""
    from skewlens.profiler.capture.build import Reach

    spans: dict[int, list[tuple[int, int]]] = {}
    for o in cap.ops:
        if o.is_cpu and names_compile_work(o.name):
            spans.setdefault(o.thread, []).append((o.start_ns, o.start_ns + o.dur_ns))
    return {t: Reach(s) for t, s in spans.items()}


def _waited_for(w: _Wait, candidates: Sequence[_Proto]) -> _Proto | None:
    """Of the unwaited collectives issued before ``w`` began, the one it waited for (module docstring)."""
    done = [c for c in candidates if c.end_ns <= w.end_ns + END_SLACK_NS]
    if not done:
        # none had completed when the wait returned, which cannot be: their recorded ends are wrong (a
        # worker event of a later call); the program waits in issue order, so it was the earliest
        return min(candidates, key=lambda c: (c.start_ns, c.end_ns), default=None)
    last = max(done, key=lambda c: (c.end_ns, c.start_ns))
    if last.end_ns >= w.start_ns:
        return last
    return min(done, key=lambda c: (c.start_ns, c.end_ns))
