"""Hooks into torch.distributed: every collective and p2p call is timed, sized and numbered.

Python-level wrappers replace the public functions of ``torch.distributed`` (and the same names in
``torch.distributed.distributed_c10d``, which its own helpers call). DDP issues its gradient all_reduce
from C++, out of the wrappers' sight. With ``ddp=True`` (the full level, and any level without the
flight recorder), DDP modules without a user comm hook get PyTorch's own ``allreduce_hook`` (the
documented equivalent of the built-in path: divide by the group size, all_reduce) registered before their
first forward; its all_reduce then goes through the wrappers. That costs a Python call and a pass over
each gradient bucket on the backward's critical path, and a Python callback on the backend's thread: the
collectives and ops levels leave DDP's C++ path alone and take its all_reduce from the flight recorder
(:mod:`skewlens.profiler.capture.flight`).

Where the flight recorder sees every collective with the hooks' sizes (gloo; DDP's all_reduce left to
DDP), the recording window's collectives take a lean path: the wrapper takes two clock readings and
nothing else, and the group, size and dtype are those of the recorder entry the call created
(:func:`skewlens.profiler.capture.flight.resolve`). Reading them from the arguments in Python, in the
middle of the training step, is most of what the full path costs. p2p calls, which gloo's recorder does not
see, and the two collectives whose entries count otherwise (``reduce_scatter`` of a list, ``scatter``)
keep the full path.

Only the outermost wrapped call on a thread is recorded (``all_gather_into_tensor`` calls
``all_gather_single``). Sequence numbers count collectives per process group in issue order from the
moment the hooks are installed, so they are identical on every member that issues the same program; with
the flight recorder on, :func:`skewlens.profiler.capture.flight.merge` replaces them by the recorder's own.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from skewlens.profiler.capture.compat import record_function_switch
from skewlens.profiler.capture.patches import Patches
from skewlens.profiler.capture.records import END_UNKNOWN, FROM_RECORDER, NO_ENTRY_NUMBERS, CommRecord
from skewlens.profiler.capture.waits import WaitHooks
from skewlens.profiler.vocab import CommType, NodeType, uneven_splits

#: Turns record functions off for a quiet call; None where this torch lacks it (calls stay profiled).
_enable_record_function = record_function_switch()


@dataclass(frozen=True, slots=True)
class _Spec:
    op: str
    node_type: NodeType
    comm_type: CommType | None
    inputs: tuple[str, ...]  # parameter names whose tensors (or lists of tensors) this rank contributes
    always_async: bool = False
    # the flight recorder's entry for the call has the hooks' group, size and dtype (one entry, input
    # sizes as :meth:`CommHooks._describe` counts them): measured on gloo for every collective but
    # reduce_scatter of a list (one entry per chunk) and scatter (the source's entry counts every chunk)
    lean: bool = True


#: Rooted collectives: the root's global rank is recorded as the node's ``comm_src`` (it sends) or
#: ``comm_dst`` (it receives).
_ROOT_SENDS = frozenset({CommType.BROADCAST, CommType.SCATTER})
_ROOT_RECEIVES = frozenset({CommType.REDUCE, CommType.GATHER})
#: The lean path's root (the recorder's entry has none): the parameter that names it as a global rank, the
#: one that names it as a rank of the group, and the group's, each with its position (``broadcast(tensor,
#: src, group, async_op, group_src)``, ``reduce(tensor, dst, op, group, async_op, group_dst)``,
#: ``gather(tensor, gather_list, dst, group, async_op, group_dst)``). The object collectives
#: (``broadcast_object_list``, ``gather_object``, ``scatter_object_list``) name their root as ``group_src`` /
#: ``group_dst``.
_LEAN_ROOT = {
    CommType.BROADCAST: (("src", 1), ("group_src", 4), ("group", 2)),
    CommType.REDUCE: (("dst", 1), ("group_dst", 5), ("group", 3)),
    CommType.GATHER: (("dst", 2), ("group_dst", 5), ("group", 3)),
}


#: The ``op`` (ReduceOp) parameter's position in each reducing call (``all_reduce(tensor, op, ...)``,
#: ``reduce(tensor, dst, op, ...)``, ``reduce_scatter(output, input_list, op, ...)``, ...).
_REDUCE_OP_ARG = {
    "c10d::allreduce_": ("op", 1),
    "c10d::allreduce_coalesced_": ("op", 1),
    "c10d::reduce_": ("op", 2),
    "c10d::reduce_scatter_": ("op", 2),
    "c10d::_reduce_scatter_base_": ("op", 2),
}


def reduce_op_name(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The ReduceOp a reducing call was given, by name, lower case (``max``; ``sum`` where the call gave
    none: its default); '' for other calls and for a value this cannot name. Reads only the argument."""
    where = _REDUCE_OP_ARG.get(op)
    if where is None:
        return ""
    value = _arg(args, kwargs, where)
    if value is None:
        return "sum"
    value = getattr(value, "op", value)  # a ReduceOp object (a premul_sum's) holds its RedOpType
    name = getattr(value, "name", None)
    return name.lower() if isinstance(name, str) else ""


#: all_to_all's arguments (name, position): output, input, their split sizes (the single-tensor form), group.
_A2A_ARGS = {
    "c10d::alltoall_base_": (
        ("output", 0), ("input", 1), ("output_split_sizes", 2), ("input_split_sizes", 3), ("group", 4)
    ),
    "c10d::alltoall_": (("output_tensor_list", 0), ("input_tensor_list", 1), None, None, ("group", 2)),
}  # fmt: skip


def _chunk_bytes(side: Any, splits: Any, p: int) -> list[int]:
    """Bytes per member of one side of an all_to_all: a list of tensors, or one tensor cut along its first
    dimension by ``splits`` (None: in ``p`` equal parts)."""
    if isinstance(side, list | tuple):
        return [t.numel() * t.element_size() for t in side]
    if not splits:
        return [side.numel() * side.element_size() // p] * p
    row = side.numel() // side.shape[0] * side.element_size() if side.dim() and side.shape[0] else 0
    return [int(k) * row for k in splits]


#: What :func:`uneven_all_to_all` gives for even splits and other ops.
EVEN_SPLITS: tuple[int, int, tuple[int, ...], tuple[int, ...]] = (-1, -1, (), ())


def uneven_all_to_all(
    op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """An all_to_all call's uneven splits: (bytes it sends to the other members of its group, bytes it
    receives from them, its own chunk left out; bytes it sends to each member, bytes it receives from each,
    in group-rank order, its own chunk included). :data:`EVEN_SPLITS` for even ones (every chunk the same:
    the cost formulas' ``(p - 1) / p`` of ``comm_size`` each way) and for other ops. Reads only the
    arguments' sizes."""
    where = _A2A_ARGS.get(op)
    if where is None:
        return EVEN_SPLITS
    out, inp, out_splits, in_splits, group = (None if w is None else _arg(args, kwargs, w) for w in where)
    if out_splits is None and in_splits is None and not isinstance(inp, list | tuple):
        return EVEN_SPLITS  # all_to_all_single without splits: even
    p = c10d.get_world_size(group)
    sent, got = _chunk_bytes(inp, in_splits, p), _chunk_bytes(out, out_splits, p)
    return uneven_splits(sent, got, c10d.get_rank(group)) or EVEN_SPLITS


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[str, int]) -> Any:
    """The argument named ``where[0]`` or at position ``where[1]``; None where it is not given."""
    name, pos = where
    return kwargs.get(name, args[pos] if len(args) > pos else None)


_C = NodeType.COMM_COLL
SPECS: dict[str, _Spec] = {
    "all_reduce": _Spec("c10d::allreduce_", _C, CommType.ALL_REDUCE, ("tensor",)),
    "all_reduce_coalesced": _Spec("c10d::allreduce_coalesced_", _C, CommType.ALL_REDUCE, ("tensors",)),
    "broadcast": _Spec("c10d::broadcast_", _C, CommType.BROADCAST, ("tensor",)),
    "reduce": _Spec("c10d::reduce_", _C, CommType.REDUCE, ("tensor",)),
    "all_gather": _Spec("c10d::allgather_", _C, CommType.ALL_GATHER, ("tensor",)),
    "all_gather_single": _Spec("c10d::_allgather_base_", _C, CommType.ALL_GATHER, ("input_tensor",)),
    "all_gather_into_tensor": _Spec("c10d::_allgather_base_", _C, CommType.ALL_GATHER, ("input_tensor",)),
    "reduce_scatter": _Spec(
        "c10d::reduce_scatter_", _C, CommType.REDUCE_SCATTER, ("input_list",), lean=False
    ),
    "reduce_scatter_single": _Spec("c10d::_reduce_scatter_base_", _C, CommType.REDUCE_SCATTER, ("input",)),
    "reduce_scatter_tensor": _Spec("c10d::_reduce_scatter_base_", _C, CommType.REDUCE_SCATTER, ("input",)),
    "all_to_all_single": _Spec("c10d::alltoall_base_", _C, CommType.ALL_TO_ALL, ("input",)),
    "all_to_all": _Spec("c10d::alltoall_", _C, CommType.ALL_TO_ALL, ("input_tensor_list",)),
    "gather": _Spec("c10d::gather_", _C, CommType.GATHER, ("tensor",)),
    "scatter": _Spec("c10d::scatter_", _C, CommType.SCATTER, ("tensor",), lean=False),
    "barrier": _Spec("c10d::barrier", _C, CommType.BARRIER, ()),
    # gloo's monitored_barrier: point-to-point messages to and from rank 0 issued in C++, no recorder entry
    # (it takes two numbers without one: ``records.NO_ENTRY_NUMBERS``)
    "monitored_barrier": _Spec("c10d::monitored_barrier", _C, CommType.BARRIER, (), lean=False),
    # gloo's flight recorder has no p2p entries: peers and sizes are the hooks' to read
    "send": _Spec("c10d::send", NodeType.COMM_SEND, None, ("tensor",), lean=False),
    "recv": _Spec("c10d::recv_", NodeType.COMM_RECV, None, ("tensor",), lean=False),
    "isend": _Spec("c10d::send", NodeType.COMM_SEND, None, ("tensor",), always_async=True, lean=False),
    "irecv": _Spec("c10d::recv_", NodeType.COMM_RECV, None, ("tensor",), always_async=True, lean=False),
}


class _Args:
    """Reads call arguments by parameter name (``inspect.Signature.bind`` costs ~100 µs a call)."""

    def __init__(self, sig: inspect.Signature) -> None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = list(sig.parameters.values())
        self.index = {p.name: i for i, p in enumerate(params) if p.kind in kinds}
        self.defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def view(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _BoundView:
        return _BoundView(self, args, kwargs)


class _BoundView:
    __slots__ = ("_args", "_kwargs", "_sig")

    def __init__(self, sig: _Args, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._sig, self._args, self._kwargs = sig, args, kwargs

    def get(self, name: str, default: Any = None) -> Any:
        if name in self._kwargs:
            return self._kwargs[name]
        i = self._sig.index.get(name)
        if i is not None and i < len(self._args):
            return self._args[i]
        return self._sig.defaults.get(name, default)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


#: The complex dtypes torch hands a process group as real (``view_as_real``), by name.
_COMPLEX = {torch.complex64: "complex64", torch.complex128: "complex128"}


def _complex_dtype(args: tuple[Any, ...], kwargs: dict[str, Any], first: tuple[str, int] | None) -> str:
    """The dtype name of a call's first input tensor (of a list: its first) where it is complex, else ''.
    Under a microsecond a call (half of what ``Tensor.is_complex()`` and a union ``isinstance`` took)."""
    if first is None:
        return ""
    t = _arg(args, kwargs, first)
    if isinstance(t, (list, tuple)):  # a tuple, not a union: the union is built on every call
        t = t[0] if t else None
    dtype: Any = getattr(t, "dtype", None)
    return _COMPLEX.get(dtype, "")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


class _Described(NamedTuple):
    """What a recorded call is, read before it was made (its times are added after).

    A named tuple, not a frozen dataclass: it is made on every recorded call, and a frozen dataclass's
    ``__init__`` costs several times as much.
    """

    spec: _Spec
    pg_name: str
    seq: int
    step: int
    numel: int
    size_bytes: int
    dtype: str
    src: int
    dst: int
    tag: int
    thread: int
    ident: int
    src_from_result: bool  # a recv from any source: the call returns the sender
    batch: int = -1  # the batch_isend_irecv call it was issued in (a counter per process), -1 for none
    send_bytes: int = -1  # an all_to_all with uneven splits: bytes to / from the other members
    recv_bytes: int = -1
    send_splits: tuple[int, ...] = ()  # ... and to / from each member, in group-rank order
    recv_splits: tuple[int, ...] = ()
    reduce_op: str = ""  # an all_reduce's, reduce's or reduce_scatter's ReduceOp (reduce_op_name)
    sparse: bool = False  # of a sparse tensor (CommRecord.sparse)


_TASKS = Path("/proc/self/task")


def _thread_ids() -> set[int]:
    """Native ids of this process's threads (Linux)."""
    try:
        return {int(t.name) for t in _TASKS.iterdir() if t.name.isdigit()}
    except OSError:
        return set()


class CommHooks:
    """Installs the wrappers; records each call made while ``recording()`` is true; :meth:`flush` hands
    the records over."""

    def __init__(
        self,
        recording: Callable[[], bool],
        step_of: Callable[[], int],
        *,
        ddp: bool = True,
        quiet: Callable[[], bool] | None = None,
        on_group: Callable[[], None] | None = None,
        on_unhooked: Callable[[], None] | None = None,
        on_destroy: Callable[[], None] | None = None,
    ) -> None:
        """``quiet()`` true: the wrapped call runs with this thread's record functions off (see
        :meth:`_call`). ``on_group()`` is called after each process group is created, ``on_destroy()``
        before each ``destroy_process_group`` call, ``on_unhooked()`` before collectives that go past the
        hooks: as each ``DistributedDataParallel`` is built (before its constructor's collectives), and as
        a call is queued in a ``_coalescing_manager`` context (issued as one collective at its end)."""
        self._ddp = ddp
        self._on_group = on_group
        self._on_destroy = on_destroy
        self._on_unhooked = on_unhooked
        self._quiet = quiet
        self._recording = recording
        self._step_of = step_of
        self._seq: dict[str, int] = defaultdict(int)
        self._local = threading.local()
        self._ids = itertools.count()
        self._calls: list[tuple[int, _Described, int, int, bool, Any, bool]] = []  # list.append: thread-safe
        # per thread (ident), the call that makes no flight-recorder entry it entered and has not returned
        # from, and when it entered: see :meth:`inside`
        self._inside: dict[int, tuple[_Described, int]] = {}
        self._ends: dict[int, int] = {}  # call id -> completion time of an asynchronous call
        self._no_future: set[tuple[str, str]] = set()  # (op, group) whose Works have no future
        self._me = -1  # this process's global rank, once known
        self._patches = Patches()
        self.installed = False
        self.dropped = 0
        """Calls whose record could not be made (they ran normally; the trace lacks them)."""
        self.unread_splits = 0
        """all_to_all calls whose split sizes could not be read (:meth:`_splits`): recorded with even
        splits, on either path."""
        self.running = 0
        """Asynchronous calls still running when :meth:`flush` took them (recorded without an end)."""
        self.lean_left = 0
        """Collectives still to record on the lean path (see :meth:`_lean`); 0: the full path."""
        self.groups_made: list[tuple[str, int]] = []
        """The process groups the program created while recording (``new_group``, ``new_subgroups``, a
        device mesh's): (name, ns the creation took, its wait for the other ranks included)."""
        self.waits = WaitHooks(recording, step_of)
        """Where threads waited for async results (``wait_tensor``, ``Work.wait`` on the Works recorded
        here): :mod:`skewlens.profiler.capture.waits`."""
        self.group_threads: dict[int, str] = {}
        """Native thread id -> name of the process group whose creation started it (gloo's worker
        threads; see :meth:`_install_group_threads`)."""

    # ---- install / uninstall -------------------------------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        for name, spec in SPECS.items():
            found = getattr(c10d, name, None)
            if found is None:
                continue
            orig: Callable[..., Any] = found
            wrapper = self._wrap(name, spec, orig)
            for mod in (c10d, dist):
                if getattr(mod, name, None) is orig:
                    self._patches.set(mod, name, orig, wrapper)
            theirs = getattr(dist, name, None)
            if theirs is not wrapper and callable(theirs):
                # the program's own wrapper of ``torch.distributed.<name>`` (a communication logger
                # installed before a Python API capture), which calls the function it replaced directly:
                # wrapped too, else its calls would pass the hooks by
                self._patches.set(dist, name, theirs, self._wrap(name, spec, orig, call=theirs))
        self._install_batches()
        if self._ddp:
            self._install_ddp()
        self._install_ddp_init()
        self._install_group_threads()
        self._install_group_times()
        self._install_destroy()
        self.waits.install()
        self.installed = True

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced, except where the program has since wrapped it again
        (:func:`skewlens.profiler.capture.patches.Patches.put_back`): its wrapper stays, and the hook it
        calls passes calls through."""
        self._patches.put_back()
        self.waits.uninstall()
        self.installed = False

    def _install_batches(self) -> None:
        """Number each ``batch_isend_irecv`` call: the sends and recvs it issues carry its number (the
        execution model joins them: what waits for one of them waits for the batch)."""
        orig = getattr(c10d, "batch_isend_irecv", None)
        if orig is None:
            return
        local = self._local
        ids = itertools.count()

        def batch_isend_irecv(p2p_op_list: Any) -> Any:
            local.batch = next(ids)
            try:
                return orig(p2p_op_list)
            finally:
                local.batch = -1

        self._replace("batch_isend_irecv", orig, batch_isend_irecv)

    # ---- the wrapper ---------------------------------------------------------------------------------
    def _wrap(
        self, name: str, spec: _Spec, orig: Callable[..., Any], call: Callable[..., Any] | None = None
    ) -> Callable[..., Any]:
        """The hook of torch's ``orig``, which reads the call's arguments by ``orig``'s signature and
        issues it through ``call`` (default ``orig``: a program's wrapper of it, to be kept in the chain)."""
        sig = _Args(inspect.signature(orig))
        orig = orig if call is None else call
        local = self._local
        hooks = self
        patches = self._patches
        lean = spec.lean
        group_at = sig.index.get("group", -1)
        # the lean path's one look at the call's tensors: its first input (name, position; keyword-only: no
        # position), for a complex dtype
        first = (spec.inputs[0], sig.index.get(spec.inputs[0], 1 << 30)) if spec.inputs else None
        non_member = c10d.GroupMember.NON_GROUP_MEMBER
        compiling = torch.compiler.is_compiling
        # the groups inside a ``_coalescing_manager`` context (one dict, emptied and filled, never replaced)
        coalescing = getattr(getattr(c10d, "_world", None), "pg_coalesce_state", None)
        if not isinstance(coalescing, dict) or spec.op not in _QUEUED_WHEN_COALESCING:
            coalescing = {}  # never queued: a torch without it, or a call that runs inside the context too

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if compiling():  # traced by torch.compile: the original call, as without the hooks (waits.py)
                return orig(*args, **kwargs)
            if getattr(local, "depth", 0) or not patches.live:  # inside a hook, or left in a program's chain
                return orig(*args, **kwargs)
            group = args[group_at] if 0 <= group_at < len(args) else kwargs.get("group")
            if group is not None and not isinstance(group, c10d.ProcessGroup):
                # a bare backend (``init_rpc``'s TensorPipe handshake runs ``all_gather_object`` on a
                # ``ProcessGroupGloo`` of its own): no group of the program's, no name to count it under
                return orig(*args, **kwargs)
            if coalescing and _coalescing(group, coalescing):
                # inside ``_coalescing_manager`` the call issues nothing: it is queued, and the context's
                # end issues one coalesced collective from C++ (the flight recorder's, like DDP's)
                if hooks._on_unhooked is not None:
                    with contextlib.suppress(Exception):  # bookkeeping must never break the program
                        hooks._on_unhooked()
                return orig(*args, **kwargs)
            if lean and hooks.lean_left > 0 and group is not non_member:
                hooks.lean_left -= 1
                return hooks._lean(spec, orig, args, kwargs, first)
            local.depth = 1
            try:
                return hooks._call(spec, sig, orig, args, kwargs)
            finally:
                local.depth = 0

        wrapper.__name__ = name
        wrapper.__qualname__ = name
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        return wrapper

    def _call(
        self,
        spec: _Spec,
        sig: _Args,
        orig: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        a = sig.view(args, kwargs)
        group = a.get("group")
        try:
            pg = c10d._group_or_default_group(group) if not isinstance(group, c10d.ProcessGroup) else group
        except (RuntimeError, ValueError):
            return orig(*args, **kwargs)
        if c10d._rank_not_in_group(pg):
            return orig(*args, **kwargs)
        pg_name = pg.group_name
        seq = -1
        if spec.node_type == NodeType.COMM_COLL:
            seq = self._seq[pg_name]
            # as many numbers as the group's flight recorder gives it: the hooks' count of a group's
            # collectives then keeps up with the recorder's (``flight.unhooked_groups``)
            self._seq[pg_name] = seq + NO_ENTRY_NUMBERS.get(spec.op, 1)
        if not self._recording():
            return orig(*args, **kwargs)
        # everything but the times is read before the call: Python work right after a collective returns
        # costs several times its own CPU time (gloo's threads are still winding down on the cores)
        try:
            what = self._describe(spec, a, pg, pg_name, seq, reduce_op=self._reduce_op(spec, args, kwargs))
            if spec.comm_type == CommType.ALL_TO_ALL:
                send, recv, to, frm = self._splits(spec, args, kwargs)
                what = what._replace(send_bytes=send, recv_bytes=recv, send_splits=to, recv_splits=frm)
        except Exception:  # bookkeeping must never break the training program: count and go on
            self.dropped += 1
            return orig(*args, **kwargs)
        is_async = spec.always_async or bool(a.get("async_op", False))
        no_entry = spec.op in NO_ENTRY_NUMBERS
        if no_entry:  # nothing else says the rank is in it, should it never return
            self._inside[what.ident] = (what, time.time_ns())
        result, start, issue_end, quiet = self._timed(orig, args, kwargs)
        if no_entry:
            del self._inside[what.ident]
        call_id = next(self._ids)
        self._calls.append(
            (call_id, what, start, issue_end, is_async, (result, pg) if what.src_from_result else None, quiet)
        )
        if is_async and result is not None:
            self._time_completion(call_id, result, issue_end, (spec.op, pg_name))
            self.waits.issued(result, start, what.thread)
        elif is_async:
            self._ends[call_id] = issue_end  # nothing to wait on: the return is all we know
        return result

    def _timed(
        self, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, int, int, bool]:
        """Issue the call; its result, when it was issued and returned, and whether it was quiet.

        The worker-event recorder, on for the collectives the hooks cannot time, has seen these calls'
        worker threads once ``quiet()``: with record functions off while the call is issued, gloo's work
        item creates no record function (with the Kineto recorder, that profiling was most of its cost).
        """
        switch = _enable_record_function if self._quiet is not None and self._quiet() else None
        if switch is not None:
            switch(False)
        start = time.time_ns()
        try:
            result = orig(*args, **kwargs)
        finally:
            if switch is not None:
                switch(True)
        return result, start, time.time_ns(), switch is not None

    def _splits(
        self, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        """An all_to_all call's splits (:func:`uneven_all_to_all`), the same on the full and the lean path:
        where they cannot be read the call is still recorded, with even splits, and counted in
        :attr:`unread_splits` (the session notes it)."""
        try:
            return uneven_all_to_all(spec.op, args, kwargs)
        except Exception:  # bookkeeping must never break the training program: counted, noted at the end
            self.unread_splits += 1
            return EVEN_SPLITS

    def _reduce_op(self, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """:func:`reduce_op_name` of the call; '' where it cannot be read (the call is still recorded)."""
        try:
            return reduce_op_name(spec.op, args, kwargs)
        except Exception:  # bookkeeping must never break the training program
            return ""

    def _lean(
        self,
        spec: _Spec,
        orig: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        first: tuple[str, int] | None,
    ) -> Any:
        """Record a collective by its times alone: its group, number, size and dtype are the flight
        recorder's entry for it, which its thread created while issuing it (joined at the end of the
        window, :func:`skewlens.profiler.capture.flight.resolve`). The full path (:meth:`_call`) reads
        them from the call's arguments before issuing it, Python work in the middle of the training step
        that costs 3-4% of the example's step time on a 2-core machine (4.3% wall, 3.2% CPU over 10
        interleaved runs of 290 steps each with and without it); this one costs two clock readings and a
        look at the dtype of its first input (``first``: its parameter's name and position): torch passes a
        complex tensor to the process group as real (``view_as_real``), so the entry has ``float32`` where
        the program sent ``complex64`` (:func:`skewlens.profiler.capture.flight.resolve` keeps the latter).
        """
        # an all_to_all's splits: sizes the recorder's entry does not have
        splits = self._splits(spec, args, kwargs) if spec.comm_type == CommType.ALL_TO_ALL else EVEN_SPLITS
        local = self._local
        local.depth = 1
        try:
            result, start, issue_end, quiet = self._timed(orig, args, kwargs)
        finally:
            local.depth = 0
        call_id = next(self._ids)
        # the collectives taking this path return None unless issued with async_op=True (a Work)
        is_async = result is not None
        src = dst = -1
        if (rooted := _LEAN_ROOT.get(spec.comm_type)) is not None:  # type: ignore[arg-type]
            global_root, group_root, group = rooted
            root = _arg(args, kwargs, global_root)
            if root is None and isinstance(in_group := _arg(args, kwargs, group_root), int):
                root = self._peer(_arg(args, kwargs, group) or dist.group.WORLD, None, in_group)
            if isinstance(root, int):
                src, dst = (root, -1) if spec.comm_type in _ROOT_SENDS else (-1, root)
        dtype = _complex_dtype(args, kwargs, first)
        what = _Described(
            spec, FROM_RECORDER, -1, self._step_of(), 0, 0, dtype, src, dst, 0, threading.get_native_id(),
            threading.get_ident(), False, -1, *splits, self._reduce_op(spec, args, kwargs),
        )  # fmt: skip
        self._calls.append((call_id, what, start, issue_end, is_async, None, quiet))
        if is_async:
            self._time_completion(call_id, result, issue_end, (spec.op, ""))
            self.waits.issued(result, start, what.thread)
        return result

    def _describe(
        self, spec: _Spec, a: _BoundView, pg: Any, pg_name: str, seq: int, *, reduce_op: str
    ) -> _Described:
        tensors = [t for p in spec.inputs for t in _tensors(a.get(p))]
        numel = nbytes = 0
        for t in tensors:
            n = t.numel()
            numel += n
            nbytes += n * t.element_size()
        if self._me < 0:
            self._me = dist.get_rank()
        src = dst = -1
        if spec.node_type == NodeType.COMM_SEND:
            src, dst = self._me, self._peer(pg, a.get("dst"), a.get("group_dst"))
        elif spec.node_type == NodeType.COMM_RECV:
            dst = self._me
            src = self._peer(pg, a.get("src"), a.get("group_src"))
        elif spec.comm_type in _ROOT_SENDS:  # the root: src of broadcast / scatter, dst of reduce / gather
            src = self._peer(pg, a.get("src"), a.get("group_src"))
        elif spec.comm_type in _ROOT_RECEIVES:
            dst = self._peer(pg, a.get("dst"), a.get("group_dst"))
        return _Described(
            spec=spec,
            pg_name=pg_name,
            seq=seq,
            step=self._step_of(),
            numel=numel,
            size_bytes=nbytes,
            dtype=dtype_name(tensors[0].dtype) if tensors else "",
            src=src,
            dst=dst,
            tag=int(a.get("tag", 0) or 0),
            thread=threading.get_native_id(),
            ident=threading.get_ident(),
            src_from_result=spec.node_type == NodeType.COMM_RECV and src < 0,
            batch=getattr(self._local, "batch", -1),
            reduce_op=reduce_op,
            sparse=any(t.is_sparse for t in tensors),
        )

    def _time_completion(self, call_id: int, work: Any, issue_end: int, kind: tuple[str, str]) -> None:
        ends = self._ends
        if kind in self._no_future:
            ends[call_id] = END_UNKNOWN
            return
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):
            # the backend has no future for it (gloo's send/recv): the wait on it, if any, tells the end.
            # Asking raises a C++ error (40-110 µs on the issuing thread): asked once per op and group
            self._no_future.add(kind)
            ends[call_id] = END_UNKNOWN
            return

        def done(_f: Any) -> None:
            ends[call_id] = time.time_ns()

        fut.add_done_callback(done)

    def issued(self) -> dict[str, int]:
        """Collectives issued through the wrappers per group since :meth:`install`, recorded or not
        (until the lean path starts: it does not look at the group)."""
        return dict(self._seq)

    def flush(self) -> list[CommRecord]:
        """The calls recorded since the last flush. An asynchronous one still running (the program let it
        run past the end of the window) has the end
        :data:`~skewlens.profiler.capture.records.END_UNKNOWN` and is counted in :attr:`running`: left
        out, its flight-recorder entry would pass for a collective issued past the hooks. Those recorded
        on the lean path have the group :data:`~skewlens.profiler.capture.records.FROM_RECORDER` and no
        size yet."""
        calls, self._calls = self._calls, []
        out = []
        for call_id, w, start, issue_end, is_async, result, quiet in calls:
            end = self._ends.pop(call_id, None) if is_async else issue_end
            if end is None:
                self.running += 1
                end = END_UNKNOWN
            src = _sender(*result) if result is not None else w.src
            out.append(_record(w, src, start, issue_end, end, is_async=is_async, quiet=quiet))
        return out

    def inside(self) -> list[CommRecord]:
        """The calls that make no flight-recorder entry (gloo's ``monitored_barrier``) that a thread entered
        and did not return from: it is blocked in one, or its program raised out of one (a
        ``monitored_barrier`` that timed out waiting for a peer). Neither the trace nor the recorder has
        them; a partial save's stop record says the rank is in them
        (:func:`skewlens.profiler.capture.flight.stop_record`). Returned at their entry, end
        :data:`~skewlens.profiler.capture.records.END_UNKNOWN`, numbered by the hooks."""
        return [
            _record(w, w.src, start, start, END_UNKNOWN, is_async=False, quiet=False)
            for w, start in list(self._inside.values())
        ]

    @staticmethod
    def _peer(pg: Any, global_rank: Any, group_rank: Any) -> int:
        if global_rank is not None:
            return int(global_rank)
        if group_rank is not None:
            return int(dist.get_global_rank(pg, int(group_rank)))
        return -1

    # ---- which threads serve which group -------------------------------------------------------------
    def _install_group_threads(self) -> None:
        """Learn the threads each process group starts while it is created.

        gloo runs a group's collectives on worker threads the group starts in its constructor, one queue
        per group served in order. Every group is created through ``_new_process_group_helper`` (the
        default group, ``new_group``, device meshes): the threads that appear while it runs are the new
        group's. :func:`skewlens.profiler.capture.build.build_nodes` then matches a collective only to
        worker events of its own group's threads. A group created before the hooks were installed (the
        Python API after ``init_process_group``) is not listed; its threads are learnt from its blocking
        collectives where it has any.
        """
        orig = getattr(c10d, "_new_process_group_helper", None)
        if orig is None:
            return
        track = _TASKS.is_dir()
        threads = self.group_threads
        on_group = self._on_group

        def helper(*args: Any, **kwargs: Any) -> Any:
            before = _thread_ids() if track else set()
            result = orig(*args, **kwargs)
            with contextlib.suppress(Exception):  # bookkeeping must never break the program
                pg = result[0] if isinstance(result, tuple) else result
                if track and isinstance(pg, c10d.ProcessGroup):
                    for tid in _thread_ids() - before:
                        threads[tid] = pg.group_name
            if on_group is not None:
                on_group()
            return result

        self._patches.set(c10d, "_new_process_group_helper", orig, helper)

    def _install_group_times(self) -> None:
        """Time each process group the program creates while recording (:attr:`groups_made`).

        ``new_group`` (and so ``new_subgroups`` and a device mesh) makes a group through
        ``_new_group_with_tag``, which on gloo returns once every member has reached it (gloo connects
        them; with ``TORCH_DIST_INIT_BARRIER=1``, after a store barrier too): a wait for a late member that
        no collective records, which the trace keeps as host time between operators."""
        orig = getattr(c10d, "_new_group_with_tag", None)
        if orig is None:
            return
        recording, made = self._recording, self.groups_made

        def new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
            if not recording():
                return orig(*args, **kwargs)
            t0 = time.perf_counter_ns()
            pg = orig(*args, **kwargs)
            dur = time.perf_counter_ns() - t0
            with contextlib.suppress(Exception):  # bookkeeping must never break the program
                # '' for a group this rank is not in (torch hands it no group, nor its name)
                made.append((str(pg.group_name) if isinstance(pg, c10d.ProcessGroup) else "", dur))
            return pg

        self._patches.set(c10d, "_new_group_with_tag", orig, new_group_with_tag)

    def _install_destroy(self) -> None:
        """Call ``on_destroy()`` before the program destroys a process group (or all of them)."""
        orig = getattr(c10d, "destroy_process_group", None)
        on_destroy = self._on_destroy
        if orig is None or on_destroy is None:
            return

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            on_destroy()
            return orig(*args, **kwargs)

        self._replace("destroy_process_group", orig, destroy_process_group)

    def _replace(self, name: str, orig: Callable[..., Any], new: Callable[..., Any]) -> None:
        """Put ``new`` in place of ``orig`` as ``name`` in ``torch.distributed`` and its ``distributed_c10d``
        (where each has it), to be put back by :meth:`uninstall`."""
        new.__wrapped__ = orig  # type: ignore[attr-defined]
        new.__doc__ = orig.__doc__
        for mod in (c10d, dist):
            if getattr(mod, name, None) is orig:
                self._patches.set(mod, name, orig, new)

    # ---- DDP -----------------------------------------------------------------------------------------
    def _install_ddp_init(self) -> None:
        """Call ``on_unhooked()`` as each ``DistributedDataParallel`` is built, before its constructor
        runs."""
        if self._on_unhooked is None:
            return
        from torch.nn.parallel import DistributedDataParallel

        orig_init = DistributedDataParallel.__init__
        on_unhooked = self._on_unhooked

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            with contextlib.suppress(Exception):  # bookkeeping must never break the program
                on_unhooked()
            orig_init(self, *args, **kwargs)

        init.__doc__ = orig_init.__doc__
        init.__wrapped__ = orig_init  # type: ignore[attr-defined]
        self._patches.set(DistributedDataParallel, "__init__", orig_init, init)

    def _install_ddp(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        orig_forward = DistributedDataParallel.forward
        orig_register = DistributedDataParallel.register_comm_hook
        orig_builtin = DistributedDataParallel._register_builtin_comm_hook

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self, "_skl_hooked", False):
                self._skl_hooked = True
                with contextlib.suppress(RuntimeError):
                    # already has a hook (registered before capture started) or already ran backward:
                    # DDP's all_reduce then stays in C++, unseen at this level
                    orig_register(self, self.process_group, allreduce_hook)
            return orig_forward(self, *args, **kwargs)

        def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
            self._skl_hooked = True  # the user's hook issues its collectives through the wrappers
            return orig_register(self, state, hook)

        def register_builtin(self: Any, comm_hook_type: Any) -> Any:
            self._skl_hooked = True  # C++ built-in hooks are not seen at this level
            return orig_builtin(self, comm_hook_type)

        for name, new, old in (
            ("forward", forward, orig_forward),
            ("register_comm_hook", register_comm_hook, orig_register),
            ("_register_builtin_comm_hook", register_builtin, orig_builtin),
        ):
            self._patches.set(DistributedDataParallel, name, old, new)


#: The calls a ``_coalescing_manager`` context queues (``all_reduce``, ``all_gather_single`` /
#: ``all_gather_into_tensor``, ``reduce_scatter_single`` / ``reduce_scatter_tensor``); every other call,
#: ``isend`` / ``irecv`` of NCCL's ``batch_isend_irecv`` among them, is issued inside it as outside.
_QUEUED_WHEN_COALESCING = frozenset(
    {"c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}
)


def _coalescing(group: Any, state: dict[Any, Any]) -> bool:
    """Whether ``group`` (None: the default group) is in ``state``, the groups inside a
    ``_coalescing_manager`` context, which queues their ``all_reduce``, ``all_gather_single`` and
    ``reduce_scatter_single`` calls."""
    try:
        return c10d._group_or_default_group(group) in state
    except (RuntimeError, ValueError):
        return False


def _sender(result: Any, pg: Any) -> int:
    """The sender of a receive from any source, -1 where not known: what a blocking ``recv`` returned (a
    global rank), or, for an ``irecv`` (flushed once it completed), its work's source, a rank in ``pg``."""
    if isinstance(result, int):
        return result
    try:
        r = int(result._source_rank())
        return int(dist.get_global_rank(pg, r)) if r >= 0 else -1
    except Exception:  # bookkeeping must never break the program: the source stays unknown
        return -1


def _record(
    w: _Described, src: int, start: int, issue_end: int, end: int, *, is_async: bool, quiet: bool
) -> CommRecord:
    """The record of the call ``w`` describes, issued from ``start`` to ``issue_end``, ended at ``end``."""
    return CommRecord(
        node_type=w.spec.node_type, op=w.spec.op, comm_type=w.spec.comm_type, pg_name=w.pg_name,
        seq=w.seq, src=src, dst=w.dst, tag=w.tag, numel=w.numel, dtype=w.dtype,
        size_bytes=w.size_bytes, start_ns=start, issue_end_ns=issue_end, end_ns=end,
        is_async=is_async, thread=w.thread, step=w.step, ident=w.ident, batch=w.batch,
        send_bytes=w.send_bytes, recv_bytes=w.recv_bytes, send_splits=w.send_splits,
        recv_splits=w.recv_splits, reduce_op=w.reduce_op, quiet=quiet, sparse=w.sparse,
    )  # fmt: skip
