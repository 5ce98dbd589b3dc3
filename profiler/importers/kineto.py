"""Kineto (torch.profiler Chrome-JSON) traces: the typed subset of events the importer uses.

Only complete events (``ph == "X"``) of these categories are kept: ``cpu_op`` (host operators),
``user_annotation`` (``ProfilerStep#N``, ``nccl:*`` ...), ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``
(GPU activities), ``cuda_runtime`` / ``cuda_driver`` (launches, event records and synchronisations, by
their ``correlation``) and ``cuda_sync`` (synchronisation activities, where the profiler recorded them).
Flow events (``ac2g``) carry the same correlation ids as the launch/kernel ``args``; the importer reads
the ids from ``args`` and does not need the flows.

Keys read, HTA style (raw key, where, type, since): an absent optional key gives the default; a present
key of the wrong type makes the file corrupt.

=============================  ============================  ======  ========================================
raw key                        where                         type    since / default
=============================  ============================  ======  ========================================
``traceEvents``                top level                     list    always (required)
``schemaVersion``              top level                     int     always; only 1 exists (others refused)
``distributedInfo.rank``       top level                     int     torch 1.13 (required unless --rank)
``distributedInfo.world_size`` top level                     int     torch 1.13 (default: max rank + 1)
``distributedInfo.backend``    top level                     str     torch 1.13 (default '')
``distributedInfo.pg_config``  top level                     list    torch 2.3 (default: one world group);
                                                                     ``ranks`` a list (torch) or its text
                                                                     (Kineto's on-demand one, Kineto#956)
``baseTimeNanoseconds``        top level                     int     Kineto#928, May 2024 (default 0: ts is
                                                                     absolute)
``deviceProperties``           top level                     list    torch 1.10 (default: none); each GPU's
                                                                     ``id``, ``name``, ``numSms``,
                                                                     ``totalGlobalMem``: the rank's GPU, said
                                                                     by import and analyze (an entry of
                                                                     another shape is passed over)
``ts`` / ``dur``               event                         µs      always (float in newer files; ``ns``
                                                                     ``displayTimeUnit``, Kineto#1074, is
                                                                     the viewer's unit only)
``args.stream``                kernel/memcpy/memset          int     always (default: the event's tid)
``args.device``                kernel/memcpy/memset          int     always (default 0)
``args.correlation``           kernel/runtime/cuda_sync      int     always (``cuda_driver`` launches:
                                                                     Kineto#752, Apr 2023)
``args["Collective name"]``    record_param_comms (kernel)   str     by Oct 2023 (kernel: Kineto#906, Apr
                                                                     2024)
``args["In msg nelems"]``      record_param_comms, kernel    int     Dec 2023 (before: ``In msg size``,
                                                                     also elements: pytorch#114735,
                                                                     Kineto#849)
``args.dtype``                 kernel, record_param_comms    str     by Oct 2023, Kineto#821 (``Float``...)
``args["Group size"]``         kernel, record_param_comms    int     by Oct 2023, Kineto#821 (a collective of
                                                                     an unnamed group smaller than the world
                                                                     is kept as compute, noted)
``args["Process Group Name"]`` kernel, record_param_comms    str     Kineto#906, Apr 2024 (default ``"0"``)
``args["Process Group Ranks"]`` kernel, record_param_comms   str     Kineto#880, Mar 2024 (JSON list of
                                                                     global ranks; at most 30 listed, then
                                                                     ``...``)
``args["Global rank start"]``  record_param_comms            int     with ``... stride``: a cut group's ranks
``args["Dst Rank"]`` / ``Src`` kernel, record_param_comms    int     Kineto#963, Jul 2024 (p2p peer, global)
``args.Seq`` / ``args.seq``    kernel, record_param_comms    int     newer torch (default: counted)
``args["Record function id"]`` cpu_op                        int     torch 2.1 (joins host-trace rf_id)
``args["Input Dims"]``         ``nccl:*`` annotation         list    torch 1.13 (with record_shapes)
``args["Input type"]``         ``nccl:*`` annotation         list    torch 1.13 (with record_shapes)
=============================  ============================  ======  ========================================

``cuda_sync`` events also carry ``args.stream``, ``args.wait_on_stream`` and
``args.wait_on_cuda_event_record_corr_id`` (the ``cudaEventRecord`` waited for); -1 where not applicable.

Reading (:func:`load_kineto`): the file's bytes are decoded by msgspec straight into typed records, one
per event with only the keys above (``args`` left as raw JSON and decoded only for kept events), so no
object tree of the whole document is ever built; each kept event is then reduced to a :class:`KEvent`
(its ``args`` dict only where the conversion reads more than the correlation, stream, device and record
function id: communication ops and annotations, NCCL kernels, ``cuda_sync`` events). Whatever that fast
path does not accept (malformed or non-standard JSON, a value of an unexpected JSON type) is parsed again
by the standard library and checked by :func:`parse_kineto`, so every error reads as it always did.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import msgspec

from skewlens.profiler.bounded import parse_json_bounded
from skewlens.profiler.errors import TraceImportError
from skewlens.profiler.importers.host_et import COMM_ANNOTATION_PREFIXES
from skewlens.profiler.manifest import MAX_WORLD_SIZE, ProcessGroupInfo, gpu_model, own_timeline_hint
from skewlens.profiler.vocab import names_nccl_kernel

SUPPORTED_KINETO_SCHEMAS = frozenset({1})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: CUDA synchronisation activities (``enable_cuda_sync_events``): Stream Wait Event, Stream/Event/Context
#: Sync.
SYNC_CATEGORY = "cuda_sync"
_KEPT = frozenset({"cpu_op", "user_annotation", SYNC_CATEGORY}) | GPU_CATEGORIES | LAUNCH_CATEGORIES
#: Bound on times (ns): keeps every value inside Chakra's int64 fields.
_MAX_NS = 2**62
_TS_LIMIT = _MAX_NS / 1000  # µs
#: Largest magnitude accepted for an integer read from a trace (keeps Chakra's int64 fields valid).
MAX_INT = 2**62
#: Namespaces of the dispatcher ops that issue communication.
COMM_OP_PREFIXES = ("c10d::", "_c10d_functional::")
#: Names of the CPU events whose ``args`` the conversion reads (besides ``record_param_comms``).
_ARGS_KEPT_PREFIXES = COMM_OP_PREFIXES + COMM_ANNOTATION_PREFIXES
_NO_ARGS: dict[str, Any] = {}
_ANY = msgspec.json.Decoder()


def as_int(v: Any) -> int | None:
    """``v`` if it is an integer of bounded magnitude, else None (bools are not integers here)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_INT < v < MAX_INT else None


class KEvent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One complete Kineto event, times converted to integer ns on the trace's clock.

    A frozen msgspec Struct: a slotted record like a frozen dataclass, made in C (14x faster to build than
    the frozen dataclass it was; one per kept event), and outside the cycle collector (it holds no cycle).
    """

    index: int
    """Position in ``traceEvents`` (for error messages and stable ordering)."""
    name: str
    """Event name."""
    cat: str
    """Kineto category."""
    pid: int
    """Process id (CPU events) or device index (GPU events)."""
    tid: int
    """Thread id (CPU events) or stream (GPU events)."""
    start_ns: int
    """Start, ns (``baseTimeNanoseconds`` + ``ts`` x 1000)."""
    dur_ns: int
    """Duration, ns."""
    args: dict[str, Any]
    """The :data:`ARGS_READ` keys of the event's ``args``, where the conversion reads more of them than the
    fields below (else empty)."""
    rf_id: int | None = None
    """``args["Record function id"]`` of a ``cpu_op`` (newer Kineto; the host trace's ``rf_id``)."""
    corr: int | None = None
    """``args.correlation`` (launch calls, GPU activities, ``cuda_sync`` events), where an integer."""
    stream: int | None = None
    """``args.stream`` (GPU activities), where an integer."""
    device: int | None = None
    """``args.device`` (GPU activities), where an integer."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(frozen=True, kw_only=True, slots=True)
class KinetoTrace:
    """The parts of one rank's Kineto trace the importer converts."""

    path: Path
    """File it was read from."""
    rank: int
    """Global rank."""
    world_size: int | None
    """World size from ``distributedInfo`` (None where absent)."""
    backend: str
    """Default backend (``nccl``), '' where unknown."""
    pg_config: tuple[ProcessGroupInfo, ...]
    """Process groups listed in ``distributedInfo.pg_config`` (empty where absent)."""
    base_ns: int
    """``baseTimeNanoseconds`` (0 where absent)."""
    gpu_models: dict[int, str] = field(default_factory=dict)
    """Device id -> its ``deviceProperties`` in words (:func:`_gpu_models`); empty where the file has none."""
    cpu_ops: list[KEvent] = field(default_factory=list)
    """``cpu_op`` events."""
    annotations: list[KEvent] = field(default_factory=list)
    """``user_annotation`` events (CPU side)."""
    gpu: list[KEvent] = field(default_factory=list)
    """Kernels, memcpys and memsets."""
    launches: dict[int, KEvent] = field(default_factory=dict)
    """Runtime/driver calls (launches, event records, synchronisations) by correlation id."""
    syncs: list[KEvent] = field(default_factory=list)
    """``cuda_sync`` activities (recorded with ``enable_cuda_sync_events``; empty otherwise)."""
    cpu_pids: set[int] = field(default_factory=set)
    """Process ids of the ``cpu_op`` events (pairs the trace with its host trace)."""
    negative_durations: int = 0
    """Kept events whose ``dur`` was negative, read as 0 long (the conversion notes how many)."""
    events: int = 0
    """Entries of ``traceEvents``, kept or not."""

    def add(self, e: KEvent) -> None:
        """File a kept event under its category."""
        cat = e.cat
        if cat == "cpu_op":
            self.cpu_ops.append(e)
            self.cpu_pids.add(e.pid)
        elif cat == "user_annotation":
            self.annotations.append(e)
        elif cat in GPU_CATEGORIES:
            self.gpu.append(e)
        elif cat == SYNC_CATEGORY:
            self.syncs.append(e)
        elif e.corr is not None:
            self.launches[e.corr] = e


def _keeps_args(cat: str, name: str) -> bool:
    """Whether the conversion reads more of an event's args than correlation, stream, device, rf id."""
    if cat in ("cpu_op", "user_annotation"):
        return name == "record_param_comms" or name.startswith(_ARGS_KEPT_PREFIXES)
    if cat == "kernel":
        return names_nccl_kernel(name)  # the communication kernels: Collective name, Process Group ...
    return cat == SYNC_CATEGORY


def _rf_id(v: Any) -> int | None:
    return as_int(v)


def _num(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


#: Longest ``Process Group Ranks`` / pg_config ``ranks`` text read.
_MAX_RANKS_TEXT = 1 << 20
#: How torch writes a list it cut short (``format_list`` in torch/csrc/profiler/util.cpp, for lists of
#: more than 30): ``[r0, ..., r29, ...]``, newer ``[r0, ..., r28, ..., r_last]``; ``...`` is a token.
_CUT = "..."


def ranks_text(text: Any) -> tuple[int, ...] | None:
    """The ranks of a JSON list of integers given as text (``"[0, 1]"``), None where it is not one."""
    if not isinstance(text, str) or len(text) > _MAX_RANKS_TEXT:
        return None
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested 50,000 deep was a traceback
        return None
    return _rank_list(v)


def _rank_list(v: Any) -> tuple[int, ...] | None:
    """``v`` as ranks where it is a list of global ranks (integers from 0 below MAX_WORLD_SIZE), else None."""
    if isinstance(v, list) and all(as_int(r) is not None and 0 <= r < MAX_WORLD_SIZE for r in v):
        return tuple(v)
    return None


def cut_ranks_text(text: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(the ranks before the ``...``, those after) of a rank list torch cut short, None for any other text."""
    if not isinstance(text, str) or len(text) > _MAX_RANKS_TEXT or _CUT not in text:
        return None
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    parts = [t.strip() for t in body[1:-1].split(",")]
    if parts.count(_CUT) != 1 or not all(t.isdecimal() and len(t) < 10 for t in parts if t != _CUT):
        return None
    cut = parts.index(_CUT)
    return tuple(int(t) for t in parts[:cut]), tuple(int(t) for t in parts[cut + 1 :])


def _pg_config(raw: Any, path: Path) -> tuple[ProcessGroupInfo, ...]:
    """The groups of ``distributedInfo.pg_config``. torch writes each group's ``ranks`` as a list; Kineto's
    own distributedInfo (on-demand traces, Kineto#956) as the text of one, cut short past 30 ranks: such an
    entry is left out, its group's ranks then come from the events (or the import says they are unknown)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TraceImportError(f"{path}: distributedInfo.pg_config is not a list")
    out = []
    for g in raw:
        given = g.get("ranks") if isinstance(g, dict) else None
        if isinstance(given, str) and cut_ranks_text(given) is not None:
            continue
        ranks = ranks_text(given) if isinstance(given, str) else _rank_list(given)
        if not isinstance(g, dict) or "pg_name" not in g or ranks is None:
            raise TraceImportError(f"{path}: malformed distributedInfo.pg_config entry {g!r:.200}")
        out.append(
            ProcessGroupInfo(
                name=str(g["pg_name"]),
                ranks=ranks,
                desc=str(g.get("pg_desc", "")),
                backend=str(g.get("backend_config", "")),
            )
        )
    return tuple(out)


def _gpu_models(raw: Any) -> dict[int, str]:
    """Device id -> each ``deviceProperties`` entry in words (:func:`skewlens.profiler.manifest.gpu_model` of
    its ``name``, ``numSms`` and ``totalGlobalMem``; informational: an entry without an integer ``id`` or a
    name is passed over, not a corrupt file)."""
    out: dict[int, str] = {}
    for props in raw if isinstance(raw, list) else ():
        if not isinstance(props, dict) or type(i := props.get("id")) is not int:
            continue
        if model := gpu_model(props.get("name"), props.get("numSms"), props.get("totalGlobalMem")):
            out.setdefault(i, model)
    return out


def _new_trace(
    path: Path, rank: int | None, *, version: Any, dist: Any, base: Any, devices: Any = None
) -> KinetoTrace:
    """The trace's header checked (schema, rank, world size, base time), with no events yet."""
    if not isinstance(version, int | str) or version not in SUPPORTED_KINETO_SCHEMAS:  # a list: unhashable
        raise TraceImportError(f"{path}: Kineto schemaVersion {version!r} is not supported (supported: 1)")
    dist = dist if isinstance(dist, dict) else {}
    r = dist.get("rank") if rank is None else rank
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise TraceImportError(
            f"{path}: no distributedInfo.rank in the trace (give the rank with --rank for a single file)"
        )
    ws = dist.get("world_size")
    if ws is not None and (not isinstance(ws, int) or ws <= r):
        raise TraceImportError(f"{path}: distributedInfo.world_size {ws!r} does not cover rank {r}")
    if not isinstance(base, int) or isinstance(base, bool):
        raise TraceImportError(f"{path}: baseTimeNanoseconds is not an integer")
    groups = _pg_config(dist.get("pg_config"), path)
    for g in groups:
        if ws is not None and g.ranks and max(g.ranks) >= ws:
            raise TraceImportError(
                f"{path}: distributedInfo.pg_config group {g.name!r} lists rank {max(g.ranks)}, outside "
                f"world size {ws}"
            )
    return KinetoTrace(
        path=path,
        rank=r,
        world_size=ws,
        backend=str(dist.get("backend", "")),
        pg_config=groups,
        base_ns=base,
        gpu_models=_gpu_models(devices),
    )


def _times(
    path: Path, i: int, *, cat: Any, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, base: int
) -> tuple[int, int]:
    """(start_ns, dur_ns) of kept event ``i``, its fields checked."""
    if not (_num(ts) and _num(dur) and isinstance(name, str)):  # which one, only once one is wrong
        for key, value, ok in (
            ("ts", ts, _num(ts)),
            ("dur", dur, _num(dur)),
            ("name", name, isinstance(name, str)),
        ):
            if not ok:  # was 'a malformed ts/dur/name': which one, and what it held, unsaid
                raise TraceImportError(
                    f"{path}: traceEvents[{i}] ({cat}) has a malformed {key} ({repr(value)[:40]}; expected "
                    f"{'a string' if key == 'name' else 'a finite number'})"
                )
    if (
        not isinstance(pid, int)
        or not isinstance(tid, int)
        or not (abs(pid) < _MAX_NS and abs(tid) < _MAX_NS)
    ):
        raise TraceImportError(
            f"{path}: traceEvents[{i}] ({name[:60]}) has a non-integer or out-of-range pid/tid"
        )
    if not abs(ts) < _TS_LIMIT:  # round() of an infinite product is an OverflowError
        raise TraceImportError(f"{path}: traceEvents[{i}] ({name[:60]}) has ts/dur out of range")
    start_ns = base + round(ts * 1000)
    if not -_MAX_NS < start_ns < _MAX_NS or not dur < _MAX_NS / 1000:
        raise TraceImportError(f"{path}: traceEvents[{i}] ({name[:60]}) has ts/dur out of range")
    return start_ns, max(round(dur * 1000), 0)


def parse_kineto(doc: Any, path: Path, *, rank: int | None = None) -> KinetoTrace:
    """Validate a parsed Kineto document and keep its typed events; ``rank`` overrides distributedInfo."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceImportError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    trace = _new_trace(
        path,
        rank,
        version=doc.get("schemaVersion", 1),
        dist=doc.get("distributedInfo"),
        base=doc.get("baseTimeNanoseconds", 0),
        devices=doc.get("deviceProperties"),
    )
    negative = 0
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X" or not isinstance(ev.get("cat"), str):
            continue
        if ev["cat"] not in _KEPT:
            continue
        cat, args = ev["cat"], ev.get("args", {})
        name: Any = ev.get("name")
        if not isinstance(args, dict):
            raise TraceImportError(f"{path}: traceEvents[{i}] ({cat}) has args that are not an object")
        start_ns, dur_ns = _times(
            path,
            i,
            cat=cat,
            name=name,
            pid=ev.get("pid"),
            tid=ev.get("tid"),
            ts=ev.get("ts"),
            dur=ev.get("dur", 0),
            base=trace.base_ns,
        )
        negative += ev.get("dur", 0) < 0  # a number: _times checked it
        trace.add(
            KEvent(
                index=i,
                name=name,
                cat=cat,
                pid=ev["pid"],
                tid=ev["tid"],
                start_ns=start_ns,
                dur_ns=dur_ns,
                args={k: args[k] for k in ARGS_READ if k in args} if _keeps_args(cat, name) else _NO_ARGS,
                rf_id=_rf_id(args.get("Record function id")),
                corr=as_int(args.get("correlation")),
                stream=as_int(args.get("stream")),
                device=as_int(args.get("device")),
            )
        )
    return dataclasses.replace(trace, negative_durations=negative, events=len(doc["traceEvents"]))


#: Default of the nested ``args`` fields left raw: absent (compared by identity).
_ABSENT = msgspec.Raw(b"null")
_UNSET: Any = msgspec.UNSET


class _Args(
    msgspec.Struct,
    frozen=True,
    gc=False,
    rename={
        "rf_id": "Record function id",
        "coll": "Collective name",
        "nelems": "In msg nelems",
        "nelems_old": "In msg size",
        "src_rank": "Src Rank",
        "dst_rank": "Dst Rank",
        "rank_start": "Global rank start",
        "rank_stride": "Global rank stride",
        "group_size": "Group size",
        "pg": "Process Group Name",
        "pg_ranks": "Process Group Ranks",
        "pg_desc": "Process Group Description",
        "seq_": "Seq",
        "dims": "Input Dims",
        "types": "Input type",
        "concrete": "Concrete Inputs",
        "in_split": "In split size",
        "out_split": "Out split size",
    },
):
    """An event's ``args`` as decoded: the :data:`ARGS_READ` keys (absent: ``UNSET``), any JSON type; the
    nested ones (tensor shapes and types, concrete inputs of every op) left raw, decoded only where kept."""

    correlation: Any = _UNSET
    stream: Any = _UNSET
    device: Any = _UNSET
    rf_id: Any = _UNSET
    coll: Any = _UNSET
    nelems: Any = _UNSET
    nelems_old: Any = _UNSET
    src_rank: Any = _UNSET
    dst_rank: Any = _UNSET
    rank_start: Any = _UNSET
    rank_stride: Any = _UNSET
    group_size: Any = _UNSET
    dtype: Any = _UNSET
    pg: Any = _UNSET
    pg_ranks: Any = _UNSET
    pg_desc: Any = _UNSET
    seq_: Any = _UNSET
    seq: Any = _UNSET
    wait_on_stream: Any = _UNSET
    wait_on_cuda_event_record_corr_id: Any = _UNSET
    in_split: Any = _UNSET
    out_split: Any = _UNSET
    dims: msgspec.Raw = _ABSENT
    types: msgspec.Raw = _ABSENT
    concrete: msgspec.Raw = _ABSENT


#: Every ``args`` key the conversion reads (:mod:`~skewlens.profiler.importers.comm`, ``convert``);
#: a kept event's ``args`` dict holds only these (a test checks the list against the code).
ARGS_READ: tuple[str, ...] = _Args.__struct_encode_fields__
#: ``args`` key of each :class:`_Args` field.
_ARG_KEY = dict(zip(_Args.__struct_fields__, ARGS_READ, strict=True))
#: ``args`` keys of the fields left raw.
_RAW_KEYS = tuple(_ARG_KEY[f] for f in ("dims", "types", "concrete"))
_NO_ARGS_DECODED = _Args()


def _args_dict(a: _Args) -> dict[str, Any]:
    """The keys ``a`` has, as a dict (the raw ones decoded). Zipped with :data:`ARGS_READ` from the
    struct's tuple: ``asdict`` and a name lookup per field cost 30% more a kept event (1.6 µs of a kernel's
    args), which the 25 fields' decode of older torch's keys had added to every rank's load."""
    values = msgspec.structs.astuple(a)
    out = {k: v for k, v in zip(ARGS_READ, values, strict=True) if v is not _UNSET and v is not _ABSENT}
    for k in _RAW_KEYS:
        if k in out:
            out[k] = _ANY.decode(out[k])
    return out


class _Event(msgspec.Struct, gc=False):
    """One entry of ``traceEvents`` as decoded: the keys read, of any JSON type."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = 0
    args: _Args = _NO_ARGS_DECODED


class _Doc(msgspec.Struct):
    """A Kineto document as decoded: the top-level keys read."""

    traceEvents: list[_Event]  # noqa: N815 (the JSON key)
    schemaVersion: Any = 1  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = 0  # noqa: N815
    deviceProperties: Any = None  # noqa: N815


_DOC = msgspec.json.Decoder(_Doc)
_FAST_PATH_ERRORS = (msgspec.DecodeError, RecursionError)


class _NotFast(Exception):
    """The fast path met something it leaves to :func:`parse_kineto` (which then says what is wrong)."""


#: How much of a file :func:`load_kineto` reads to tell one of skewlens' own timelines (its ``otherData``).
_OWN_HEAD_BYTES = 1 << 16


def load_kineto(data: bytes, path: Path, *, rank: int | None = None, max_bytes: int) -> KinetoTrace:
    """A Kineto trace from the JSON text ``data`` of ``path`` (at most ``max_bytes``; module docstring).

    The fast path decodes the events into typed records and keeps what :func:`parse_kineto` keeps;
    anything it does not take is parsed by the standard library and checked by :func:`parse_kineto`.
    """
    # skewlens' own timelines are Chrome trace JSON too: 'no distributedInfo.rank' said nothing of what it is
    if (
        own := own_timeline_hint(path.name, bytes(data[:_OWN_HEAD_BYTES]), not_a="a Kineto trace")
    ) is not None:
        raise TraceImportError(f"{path}: {own}")
    try:
        return _load_fast(data, path, rank)
    except (_NotFast, *_FAST_PATH_ERRORS):
        pass
    doc = parse_json_bounded(data, max_bytes, source=str(path), error=TraceImportError, what="trace")
    return parse_kineto(doc, path, rank=rank)


def _load_fast(data: bytes, path: Path, rank: int | None) -> KinetoTrace:
    try:
        doc = _DOC.decode(data)
    except msgspec.ValidationError:
        raise _NotFast from None  # e.g. args that are no object: parse_kineto says so
    trace = _new_trace(
        path,
        rank,
        version=doc.schemaVersion,
        dist=doc.distributedInfo,
        base=doc.baseTimeNanoseconds,
        devices=doc.deviceProperties,
    )
    base = trace.base_ns
    # one object per distinct name, category, pid and tid (the decoder makes one per event)
    names: dict[str, str] = {}
    intern = names.setdefault
    ids: dict[int, int] = {}
    same_id = ids.setdefault
    # per kept category: its name, where its events go (as KinetoTrace.add files them), whether an event
    # of that name keeps its args
    runtime: list[KEvent] = []
    lists = {"cpu_op": trace.cpu_ops, "user_annotation": trace.annotations, SYNC_CATEGORY: trace.syncs}
    lists |= dict.fromkeys(GPU_CATEGORIES, trace.gpu) | dict.fromkeys(LAUNCH_CATEGORIES, runtime)
    kept: dict[str, tuple[str, Callable[[KEvent], None], dict[str, bool]]]
    kept = {c: (c, lists[c].append, {}) for c in _KEPT}
    events = doc.traceEvents
    negative = 0
    i = -1
    try:  # free of cost in the loop (zero-cost exceptions), where a bound check per event is not
        for i, ev in enumerate(events):
            events[i] = None  # type: ignore[call-overload]  # freed as read: the events shrink as KEvents grow
            if ev.ph != "X" or type(ev.cat) is not str or (to := kept.get(ev.cat)) is None:
                continue
            cat, add, keeps_of = to
            name, pid, tid, ts, dur = ev.name, ev.pid, ev.tid, ev.ts, ev.dur
            tts, tdur = type(ts), type(dur)
            # decoded JSON numbers are finite and never bools: type checks suffice on the common path
            if (
                (tts is float or tts is int)
                and (tdur is float or tdur is int)
                and type(name) is str
                and type(pid) is int
                and type(tid) is int
                and -_MAX_NS < pid < _MAX_NS
                and -_MAX_NS < tid < _MAX_NS
            ):
                start_ns = base + round(ts * 1000)
                if not (-_MAX_NS < start_ns < _MAX_NS and dur < _MAX_NS / 1000):
                    raise TraceImportError(f"{path}: traceEvents[{i}] ({name[:60]}) has ts/dur out of range")
                if dur > 0:
                    dur_ns = round(dur * 1000)
                else:
                    dur_ns = 0
                    negative += dur < 0
            else:
                start_ns, dur_ns = _times(
                    path, i, cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, base=base
                )
                negative += dur < 0  # a number: _times checked it
            name = intern(name, name)
            keeps = keeps_of.get(name)
            if keeps is None:
                keeps = keeps_of[name] = _keeps_args(cat, name)
            a = ev.args
            rf, c, st, dv = a.rf_id, a.correlation, a.stream, a.device  # UNSET where absent: no int
            add(
                KEvent(
                    index=i,
                    name=name,
                    cat=cat,
                    pid=same_id(pid, pid),
                    tid=same_id(tid, tid),
                    start_ns=start_ns,
                    dur_ns=dur_ns,
                    args=_args_dict(a) if keeps else _NO_ARGS,
                    rf_id=rf if type(rf) is int and -MAX_INT < rf < MAX_INT else None,  # as _rf_id, inline
                    corr=c if type(c) is int and -MAX_INT < c < MAX_INT else None,
                    stream=st if type(st) is int and -MAX_INT < st < MAX_INT else None,
                    device=dv if type(dv) is int and -MAX_INT < dv < MAX_INT else None,
                )
            )
    except OverflowError:  # round() of a ts so large that ts * 1000 is infinite
        raise TraceImportError(f"{path}: traceEvents[{i}] has ts/dur out of range") from None
    trace.cpu_pids.update({e.pid for e in trace.cpu_ops})
    launches = trace.launches
    for e in runtime:
        if e.corr is not None:
            launches[e.corr] = e
    return dataclasses.replace(trace, negative_durations=negative, events=len(events))


def require_work(kt: KinetoTrace) -> None:
    """``kt`` holds a host operator or GPU activity, the events a rank's nodes are made of, else a
    :class:`TraceImportError` naming the file and what it lacks: such a trace (an empty ``traceEvents``, only
    annotations or runtime calls) would import as a rank with no nodes, which every command then took for a
    run that did nothing."""
    if kt.cpu_ops or kt.gpu:
        return
    if not kt.events:
        raise TraceImportError(
            f"{kt.path}: nothing to import: its traceEvents list is empty (no operators, GPU kernels or "
            "ProfilerStep# marks)"
        )
    steps = any(a.name.startswith("ProfilerStep#") for a in kt.annotations)
    but = " (it has ProfilerStep# marks, but no work in them)" if steps else ""
    raise TraceImportError(
        f"{kt.path}: nothing to import: none of its {kt.events:,} traceEvents is a host operator (cpu_op) or "
        f"GPU activity ({', '.join(sorted(GPU_CATEGORIES))}){but}"
    )
