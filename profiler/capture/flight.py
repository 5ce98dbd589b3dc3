"""Collectives the Python hooks cannot see, from PyTorch's flight recorder (its JSON dump).

The hooks wrap ``torch.distributed``'s Python functions. Collectives issued elsewhere reach the process
group without passing them: functional collectives (``torch.ops._c10d_functional``: DTensor, tensor
parallelism, compiled graphs), collectives issued from C++, and at the collectives and ops levels DDP's
gradient all_reduce (its C++ reducer is left alone there, see :mod:`skewlens.profiler.capture.hooks`).
The flight recorder, which every process group of gloo and NCCL feeds from C++, sees them all:
``skewlens profile`` turns it on (``TORCH_FR_BUFFER_SIZE``, unless the user set it) and each rank reads
its entries back at the end of the window through the JSON dump (never the pickle one: traces and dumps
are untrusted input).

torch keeps two recorders: NCCL's process groups feed one of their own (CUDA events; its dump,
``_dump_nccl_trace_json``, exists only in builds with NCCL), every other backend (gloo) the generic one
(``_dump_fr_trace_json``). :func:`dump_entries` reads both; each entry knows its recorder.

An entry no hooked call accounts for (see :func:`merge`) becomes a collective of its own: group, sequence
number, type, size and dtype from the entry; the arrival is the entry's creation time (the moment the
rank issued it). It is an asynchronous call on the group's comm stream. gloo's recorder gives no end: it
ends when gloo's worker thread finished it (its ``gloo:*`` event: Kineto records it at the ops level,
and at the collectives level a worker-event recorder does, see
:class:`skewlens.profiler.capture.kineto.WorkerEvents`). NCCL's ends on the device: at the ops level at
its NCCL kernel's end; at the collectives level at the end :func:`device_spans` takes from its entry,
where ``TORCH_NCCL_ENABLE_TIMING`` was set for the process (``skewlens profile`` sets it). Otherwise it
ends at its arrival.

One identity source: where the recorder is on (it is for the whole run: ``skewlens profile`` sets
``TORCH_FR_BUFFER_SIZE`` for every rank), every collective of a group the recorder feeds (gloo, NCCL)
carries the recorder's per-group sequence number, hooked or not, on every member. A hooked call whose
entry the ring buffer no longer holds is left out, and what the buffer lost is declared
(:func:`losses`): the manifest lists the lost range for every member of the group alike, and the loader
marks those steps incomplete instead of reporting mismatches.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from skewlens.profiler.bounded import parse_json_bounded
from skewlens.profiler.capture.build import Reach, step_of
from skewlens.profiler.capture.records import (
    DEBUG_ENV,
    END_UNKNOWN,
    FROM_RECORDER,
    NO_ENTRY_NUMBERS,
    CommRecord,
    StepRecord,
)
from skewlens.profiler.errors import CaptureError
from skewlens.profiler.store.issues import format_bytes, rank_ranges
from skewlens.profiler.vocab import (
    SPARSE_ALL_REDUCE_OP,
    TORCH_DTYPE_NAMES,
    CommType,
    NodeType,
    collective_from_op,
    dtype_bytes,
    op_base,
)

#: Environment variable that sizes (and so enables) the flight recorder's ring buffer.
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
#: Its older name, which torch still reads where the new one is not set.
FR_BUFFER_LEGACY_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
#: Environment variable that makes NCCL's process groups time each collective on the device (a start
#: event per collective), read when a group is created: the recorder then has its device duration.
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
#: Entries kept when skewlens turns the recorder on.
FR_BUFFER_DEFAULT = 20_000


def refuse_wrapped_groups(debug_level: str, where: str, *, by_program: bool = False) -> None:
    """Raise :class:`CaptureError` where ``debug_level`` (``TORCH_DISTRIBUTED_DEBUG``'s value, or the
    level torch read from it) is ``DETAIL``; ``where`` says where it was read; ``by_program``: the program
    set the level itself (after skewlens profile found none in its environment), so the remedy is the
    program's, not the environment's.

    At that level every process group is wrapped in one that first checks the call against the other
    members with collectives of a helper group (an all_gather of the call's shapes, 8 B and more). The
    flight recorder files both groups' entries under the same empty name, so a capture numbers the two
    groups' collectives as one group's: on 2 gloo ranks of FSDP2, ``skewlens check`` found 13 collective
    instances issued twice under one number and ``analyze`` refused the run. (With DDP, torch 2.13 itself
    crashes with SIGSEGV at that level on gloo, with or without skewlens.)"""
    if debug_level.strip().upper() != "DETAIL":
        return
    remedy = (
        f"drop the program's own setting of it (torch.distributed's set_debug_level, or {DEBUG_ENV} set in "
        "os.environ before init_process_group) or make it INFO"
        if by_program
        else f"unset {DEBUG_ENV} or set it to INFO"
    )
    raise CaptureError(
        f"{DEBUG_ENV}=DETAIL ({where}): it wraps every process group in one that checks each collective "
        "with collectives of its own on a helper group, and the flight recorder files both under one "
        "empty group name, so the capture cannot tell the program's collectives from the checks' (the "
        f"run would not match across ranks); {remedy} for a capture, DETAIL for a run without skewlens"
    )


#: Largest dump parsed (the ring buffer bounds it; this bounds a corrupt one).
MAX_DUMP_BYTES = 256 * 1024 * 1024
#: What the dump is called in errors.
DUMP_SOURCE = "flight recorder dump (torch._C._distributed_c10d._dump_nccl_trace_json / _dump_fr_trace_json)"
#: The recorders, as ``FrEntry.recorder`` names them, and the function that dumps each as JSON.
DUMPS = (("nccl", "_dump_nccl_trace_json"), ("fr", "_dump_fr_trace_json"))
#: Longest the end of a window waits for NCCL's watchdog to retire the window's collectives (it looks
#: every 100 ms; only a retired entry has its device duration).
SETTLE_S = 0.3
#: Backends whose process groups feed the flight recorder.
RECORDED_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, kw_only=True, slots=True)
class FrEntry:
    """One collective the flight recorder saw on this rank."""

    pg_name: str
    """Name of the process group (the same name the hooks record)."""
    seq: int
    """The recorder's per-group collective sequence number."""
    op: str
    """Its profiling name (``gloo:all_reduce``, ``nccl:_allgather_base``)."""
    created_ns: int
    """When the rank issued it (Unix-epoch ns, the hooks' clock)."""
    numel: int
    """Elements of the input tensors."""
    dtype: str
    """torch dtype name of the first input (``float32``), ``""`` if it had none."""
    size_bytes: int
    """numel x element size of the inputs."""
    thread_ident: int = 0
    """The issuing thread's ``threading.get_ident()`` (the recorder's ``thread_id``), 0 when unknown."""
    record_id: int = -1
    """The recorder's running number of the entry over all groups (0 = its first ever), -1 unknown."""
    recorder: str = "fr"
    """Which recorder held it: ``nccl`` (NCCL's) or ``fr`` (the generic one, gloo's); record ids count
    per recorder."""
    started_ns: int = -1
    """``time_discovered_started_ns``: when a host thread (NCCL's watchdog, or the dump) found the
    collective started on the device: after it started, possibly long after; -1 when not found."""
    completed_ns: int = -1
    """``time_discovered_completed_ns``: likewise for its completion; -1 when not found."""
    duration_ns: int = -1
    """``duration_ms`` in ns: its time on the device between its start and end CUDA events (NCCL with
    ``TORCH_NCCL_ENABLE_TIMING``, once the watchdog retired it); -1 when absent."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Loss:
    """Collectives of one group that this rank's recorder no longer had (its ring buffer wrapped)."""

    pg_name: str
    """The group."""
    first_seq: int
    """First lost sequence number."""
    last_seq: int
    """Last lost sequence number; -1 when the recorder kept none of the group's (every number up to the
    window's end may be lost)."""
    steps: tuple[int, ...]
    """Recorded steps the lost collectives may belong to."""

    def describe(self) -> str:
        """``group '0' seq 1..509 (steps 2-252)``: the steps as ranges (a 400-step window whose ring buffer
        wrapped listed all 251 of them, one by one, in the note, the manifest and every command's warning)."""
        last = self.last_seq if self.last_seq >= 0 else "end"
        return f"group {self.pg_name!r} seq {self.first_seq}..{last} (steps {rank_ranges(self.steps)})"


def enabled() -> bool:
    """Whether this process's flight recorder records (``TORCH_FR_BUFFER_SIZE`` a positive number)."""
    return buffer_size() > 0


def buffer_size() -> int:
    """Entries this process's flight recorder keeps (``TORCH_FR_BUFFER_SIZE``, else its older name, as
    torch reads them; 0 when it is off)."""
    value = os.environ.get(FR_BUFFER_ENV, "").strip() or os.environ.get(FR_BUFFER_LEGACY_ENV, "").strip()
    return int(value) if value.isdigit() and len(value) <= 12 else 0


def nccl_timing() -> bool:
    """Whether NCCL's process groups of this process time their collectives (``TORCH_NCCL_ENABLE_TIMING``
    set true, as torch reads it, when they were created)."""
    return os.environ.get(NCCL_TIMING_ENV, "").strip().lower() in {"1", "true", "yes", "y", "on"}


def _positive(value: object) -> int:
    """An int time of the dump, -1 where it is absent (null in one form of the dump, 0 in the other)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else -1


def _duration_ns(value: object) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12:
        return round(value * 1_000_000)
    return -1


def parse_dump(text: str | bytes, *, max_bytes: int = MAX_DUMP_BYTES, recorder: str = "fr") -> list[FrEntry]:
    """The collective entries of a flight-recorder JSON dump (p2p entries are the hooks' to record);
    ``recorder``: which recorder it is (:data:`DUMPS`).

    Malformed entries are skipped: the dump is the recorder's, but nothing in it is trusted. A dump that
    is not JSON, is larger than ``max_bytes``, or has no entry list raises :class:`CaptureError` naming
    the dump and the limit (the session turns it into a manifest note: the program is not stopped).
    """
    limit = f"{FR_BUFFER_ENV} ring buffer; parse limit {max_bytes} bytes"
    try:
        data = parse_json_bounded(text, max_bytes, source=DUMP_SOURCE, error=CaptureError, what="dump")
    except CaptureError as err:
        raise CaptureError(f"{err} ({limit}): its collectives are not in the trace") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        if isinstance(data, dict) and "entries" not in data:
            return []  # the recorder had recorded nothing yet
        raise CaptureError(
            f"{DUMP_SOURCE}: unreadable (no list of entries; {limit}): its collectives are not in the trace"
        )
    out: list[FrEntry] = []
    for e in entries:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg, seq, name, created = (
            e.get("process_group"),
            e.get("collective_seq_id"),
            e.get("profiling_name"),
            (e.get("time_created_ns")),
        )
        if not (isinstance(pg, list) and pg and isinstance(pg[0], str)):
            continue
        if not (isinstance(seq, int) and isinstance(name, str) and isinstance(created, int) and created > 0):
            continue
        sizes, dtypes = e.get("input_sizes"), e.get("input_dtypes")
        numel, nbytes = 0, 0
        if isinstance(sizes, list) and isinstance(dtypes, list):
            for shape, dt in zip(sizes, dtypes, strict=False):
                if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
                    n = math.prod(shape)
                    numel += n
                    nbytes += n * dtype_bytes(str(dt))
        first = dtypes[0] if isinstance(dtypes, list) and dtypes else ""
        tid = e.get("thread_id")
        ident = int(tid) if isinstance(tid, str) and tid.isdigit() and len(tid) <= 20 else 0
        rid = e.get("record_id")
        out.append(
            FrEntry(
                pg_name=pg[0],
                seq=seq,
                op=name,
                created_ns=created,
                numel=numel,
                dtype=TORCH_DTYPE_NAMES.get(str(first), str(first).lower()),
                size_bytes=nbytes,
                thread_ident=ident,
                record_id=rid if isinstance(rid, int) and rid >= 0 else -1,
                recorder=recorder,
                started_ns=_positive(e.get("time_discovered_started_ns")),
                completed_ns=_positive(e.get("time_discovered_completed_ns")),
                duration_ns=_duration_ns(e.get("duration_ms")),
            )
        )
    return out


def dump_entries() -> list[FrEntry]:
    """This process's entries in both flight recorders (:data:`DUMPS`; empty when they are off or have
    nothing); a dump that cannot be read, or a torch with neither dump while the recorder is on, raises
    :class:`CaptureError` (see :func:`parse_dump`)."""
    import torch

    c10d = getattr(torch._C, "_distributed_c10d", None)
    out: list[FrEntry] = []
    found = False
    for recorder, name in DUMPS:
        dump = getattr(c10d, name, None)
        if dump is None:  # NCCL's only exists in builds with NCCL
            continue
        found = True
        try:
            text = dump(True, False)  # collectives included, finished ones too
        except RuntimeError:  # this recorder unavailable (never started): nothing to read back
            continue
        out += parse_dump(text, recorder=recorder)
    if not found and enabled():
        raise CaptureError(
            f"{DUMP_SOURCE}: this torch ({torch.__version__}) has neither dump: the collectives issued "
            "past the hooks are not in the trace"
        )
    return out


def settle(
    entries: list[FrEntry],
    since_ns: int,
    *,
    dump: Callable[[], list[FrEntry]] = dump_entries,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    timeout_s: float = SETTLE_S,
) -> list[FrEntry]:
    """``entries`` again, dumped anew until NCCL's watchdog has retired (given a device duration) every
    timed NCCL collective created since ``since_ns``, or ``timeout_s`` passed: the last collectives of a
    window are retired up to 100 ms after they ended. Untimed entries (no discovered start either) are
    not waited for."""
    deadline = clock() + timeout_s

    def pending(es: Sequence[FrEntry]) -> bool:
        return any(
            e.recorder == "nccl" and e.created_ns >= since_ns and e.duration_ns < 0 and e.started_ns > 0
            for e in es
        )

    while pending(entries) and clock() < deadline:
        sleep(0.02)
        entries = dump()
    return entries


def losses(entries: Sequence[FrEntry], steps: Sequence[StepRecord], groups: Sequence[str]) -> list[Loss]:
    """What this rank's recorders lost inside the recorded ``steps``, per group of ``groups`` (those they
    feed and this rank belongs to); each recorder (:data:`DUMPS`) numbers its entries of its own.

    The ring buffer keeps the newest entries: where its oldest kept entry is not its first ever
    (``record_id`` above 0), every group's collectives created before that entry are gone, i.e. a
    group's numbers below the first it kept (all of them where it kept none), in the steps that began
    before it. A hole in a group's kept numbers is lost too, in the steps between its neighbours, unless
    the recorder kept every entry it made between them (their record ids run on without a gap): the
    numbers were then taken by work that makes no entry (gloo's ``monitored_barrier`` takes two, for
    its point-to-point messages), and no collective is missing.
    """
    if not entries or not steps:
        return []
    by_recorder: dict[str, list[FrEntry]] = defaultdict(list)
    for e in entries:
        by_recorder[e.recorder].append(e)
    if len(by_recorder) > 1:  # a group's entries are in one recorder; one without any may be any's
        mine = {e.pg_name for e in entries}
        bare = [g for g in groups if g not in mine]
        return [
            x
            for rec, es in sorted(by_recorder.items())
            for x in losses(es, steps, [*bare, *sorted({e.pg_name for e in es})])
        ]
    ordered = sorted(steps, key=lambda s: s.start_ns)
    oldest = min(entries, key=lambda e: (e.record_id, e.created_ns))
    by_pg: dict[str, list[FrEntry]] = defaultdict(list)
    for e in entries:
        by_pg[e.pg_name].append(e)
    out: list[Loss] = []
    ids = {e.record_id for e in entries}
    wrapped = oldest.record_id > 0
    early = tuple(s.step for s in ordered if s.start_ns < oldest.created_ns)
    for pg in sorted(set(groups) | set(by_pg)):
        es = sorted(by_pg.get(pg, []), key=lambda e: e.seq)
        if wrapped and early:
            kept = es[0].seq if es else None
            if kept is None or kept > 1:
                out.append(Loss(pg_name=pg, first_seq=1, last_seq=(kept - 1) if kept else -1, steps=early))
        for a, b in itertools.pairwise(es):
            if 0 <= a.record_id < b.record_id and ids.issuperset(range(a.record_id + 1, b.record_id)):
                continue  # nothing recorded in between was lost
            if b.seq > a.seq + 1:
                inside = tuple(
                    s.step for s in ordered if a.created_ns <= s.end_ns and s.start_ns <= b.created_ns
                )
                if inside:
                    out.append(Loss(pg_name=pg, first_seq=a.seq + 1, last_seq=b.seq - 1, steps=inside))
    return out


def device_spans(entries: Sequence[FrEntry]) -> dict[tuple[str, int], tuple[int, int]]:
    """``(group, seq) -> (start, end)`` on the device of the NCCL collectives timed on it (a device
    duration ``D`` and a discovered completion ``Q``; ``TORCH_NCCL_ENABLE_TIMING``), on the hooks' clock.

    The recorder measures ``D`` exactly (between the collective's two CUDA events) but stamps its
    discovered start ``P`` and completion ``Q`` when a host thread finds them (NCCL's watchdog looks every
    100 ms, and usually finds both at once), so those only bound it: the collective started after it was
    created (``C``) and after the previous collective of its group ended (one stream per group), and no
    later than ``min(P, Q - D)``. It is taken to start as early as that allows, ``max(C, previous end)``,
    the assumption the hooks make for the host (it ran when issued), unless the bounds say later; its
    end is that start plus ``D``. Where the device ran behind the host (queued kernels), the start is
    early by that lag.
    """
    by_pg: dict[str, list[FrEntry]] = defaultdict(list)
    for e in entries:
        if e.recorder == "nccl":
            by_pg[e.pg_name].append(e)
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for pg, es in by_pg.items():
        previous_end = 0
        for e in sorted(es, key=lambda e: (e.seq, e.created_ns)):
            if e.duration_ns < 0 or e.completed_ns <= 0:
                previous_end = max(previous_end, e.created_ns)
                continue
            latest = e.completed_ns - e.duration_ns
            if e.started_ns > 0:
                latest = min(latest, e.started_ns)
            start = max(e.created_ns, min(max(e.created_ns, previous_end), latest))
            out[(pg, e.seq)] = (start, start + e.duration_ns)
            previous_end = start + e.duration_ns
    return out


def device_time_note(
    entries: Sequence[FrEntry], spans: Mapping[tuple[str, int], tuple[int, int]], steps: Sequence[StepRecord]
) -> str:
    """What the manifest says of the NCCL collectives' device times in the window (``""``: none there)."""
    ordered = sorted(steps, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in ordered]
    inside = [e for e in entries if e.recorder == "nccl" and step_of(e.created_ns, starts, ordered) >= 0]
    if not inside:
        return ""
    timed = sum(1 for e in inside if (e.pg_name, e.seq) in spans)
    if timed == len(inside):
        return (
            f"{timed} NCCL collective(s) end on the device: the recorder's device durations, from the "
            "earliest start its times allow (see flight.device_spans)"
        )
    why = (
        "the watchdog had not retired them when the window ended"
        if nccl_timing()
        else f"{NCCL_TIMING_ENV}=1 was not set when the process groups were created"
    )
    return (
        f"{len(inside) - timed} of {len(inside)} NCCL collective(s) without device times ({why}): "
        "their end is where the hooks or the recorder's enqueue time put it"
    )


def recorded_groups(backends: Mapping[str, str]) -> set[str]:
    """The groups (name -> backend config, ``cpu:gloo,cuda:nccl``) whose collectives the recorder sees."""
    return {g for g, b in backends.items() if any(k in b for k in RECORDED_BACKENDS)}


def unhooked_groups(entries: Sequence[FrEntry], hooked: Mapping[str, int]) -> list[str]:
    """Groups on which the recorder numbered more collectives than went through the hooks.

    ``hooked``: collectives issued per group through the hooks since they were installed (recorded or
    not, :meth:`skewlens.profiler.capture.hooks.CommHooks.issued`). The recorder numbers every collective of a
    group from its creation, so a higher number means collectives issued past the hooks there (DDP's
    reducer, functional collectives, C++), or before the hooks were installed, or a Python function that
    issues several (``all_gather_object``): all reasons to expect collectives the hooks cannot time.
    """
    last: dict[str, int] = {}
    for e in entries:
        last[e.pg_name] = max(last.get(e.pg_name, 0), e.seq)
    return sorted(pg for pg, n in last.items() if n > hooked.get(pg, 0))


def _made_by(c: CommRecord, es: Sequence[FrEntry], created: Sequence[int], lo: int, hi: int) -> Iterator[int]:
    """Indices of the entries of ``es`` (in creation order; ``created`` their times) created within
    ``[lo, hi]`` by ``c``'s thread, or by any thread where either side does not know its thread."""
    k = bisect.bisect_left(created, lo)
    while k < len(es) and es[k].created_ns <= hi:
        e = es[k]
        if not c.ident or not e.thread_ident or e.thread_ident == c.ident:
            yield k
        k += 1


def resolve(entries: Sequence[FrEntry], comms: Sequence[CommRecord]) -> tuple[list[CommRecord], int]:
    """The calls the hooks timed on their lean path, with the group, size and dtype of their entry;
    and how many had none (the ring buffer lost it: they are left out).

    A lean call (group :data:`~skewlens.profiler.capture.records.FROM_RECORDER`) has the entry its
    thread created while it was being issued, ``[start, issue end]``: the first such entry no other lean
    call took (an entry that does not know its thread may be any thread's). Other records pass unchanged.
    """
    if not any(c.pg_name == FROM_RECORDER and c.node_type == NodeType.COMM_COLL for c in comms):
        return list(comms), 0
    ordered = sorted(entries, key=lambda e: e.created_ns)
    created = [e.created_ns for e in ordered]
    taken: set[int] = set()
    out: list[CommRecord] = []
    lost = 0
    for c in comms:
        if c.pg_name != FROM_RECORDER or c.node_type != NodeType.COMM_COLL:
            out.append(c)
            continue
        made = (k for k in _made_by(c, ordered, created, c.start_ns, c.issue_end_ns) if k not in taken)
        k = next(made, -1)
        if k < 0:
            lost += 1
            continue
        taken.add(k)
        e = ordered[k]
        dtype, numel = program_dtype(c.dtype, e)
        out.append(replace(c, pg_name=e.pg_name, numel=numel, dtype=dtype, size_bytes=e.size_bytes))
    return out, lost


#: The real dtype torch passes a complex tensor to the process group as (``torch.view_as_real``: twice the
#: elements), by the complex dtype's name.
_AS_REAL = {"complex64": "float32", "complex128": "float64"}


def program_dtype(hooked: str, e: FrEntry) -> tuple[str, int]:
    """The dtype and element count of a lean call whose hook saw a first input of dtype ``hooked`` ('' where
    it did not look) and whose recorder entry is ``e``: the entry's, but where the hook saw a complex tensor
    the entry has as real (``complex64`` as ``float32``, twice the elements: torch's ``view_as_real`` before
    the process group), the program's complex dtype and half the elements (the bytes are the same)."""
    if _AS_REAL.get(hooked) == e.dtype and e.numel % 2 == 0:
        return hooked, e.numel // 2
    return e.dtype, e.numel


def merge(
    entries: Sequence[FrEntry],
    comms: Sequence[CommRecord],
    steps: Sequence[StepRecord],
    *,
    thread: int,
    recorded: set[str] | None = None,
    slack_ns: int = 200_000,
    spans: Mapping[tuple[str, int], tuple[int, int]] | None = None,
    natives: Mapping[int, int] | None = None,
) -> tuple[list[CommRecord], list[CommRecord], int]:
    """The hooked calls numbered as the recorder numbers them, the collectives only the recorder saw, and
    how many hooked calls were left out (their entry was lost).

    A hooked collective accounts for the entries its thread created on its group while it was being
    issued, ``[start, issue end]`` (a call may create several: gloo's ``reduce_scatter`` of a list does);
    where either side does not know the thread, for those created on its group within ``slack_ns`` of the
    call. It takes the recorder's sequence number of its first entry, so that the hooked collectives and
    the recorder's own (entries inside the recorded steps that no call accounts for) share one numbering
    per group, the recorder's, the same on every member. On a group the recorder feeds (``recorded``:
    every group when None), a hooked collective without an entry is left out (the ring buffer lost it,
    see :func:`losses`), but for one that makes none
    (:data:`~skewlens.profiler.capture.records.NO_ENTRY_NUMBERS`), which takes the first of the numbers it
    left out of the recorder's; on another group the hooked calls keep the hooks' numbers.

    ``spans`` (:func:`device_spans`): a recorder-only collective, and an asynchronous hooked one, ends
    where its device span ends (a blocking hooked call keeps its return: on NCCL the call returns at
    enqueue and its thread goes on, which the node on the thread says).

    A recorder-only collective was issued by the thread its entry names where ``natives`` (Python ident to
    native id: the program's Python threads) knows it, else by ``thread``: a blocking call a background
    thread was still in when the window closed has no hooked record, and is that thread's, not the main
    thread's (before, it was issued from the main thread's last row, which a delay before it held).
    """
    spans = spans or {}
    native_of = natives or {}
    ordered = sorted(steps, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in ordered]
    by_pg: dict[str, list[FrEntry]] = defaultdict(list)
    for e in entries:
        by_pg[e.pg_name].append(e)
    for es in by_pg.values():
        es.sort(key=lambda e: e.created_ns)
    created = {pg: [e.created_ns for e in es] for pg, es in by_pg.items()}
    claimed: set[tuple[str, int]] = set()
    hooked: list[CommRecord] = []
    left_out = 0
    taken: dict[str, int] = {}  # per group, the last number taken by a call that makes no entry
    for c in comms:
        if c.node_type != NodeType.COMM_COLL or (recorded is not None and c.pg_name not in recorded):
            hooked.append(c)
            continue
        es = by_pg.get(c.pg_name, [])
        if (numbers := NO_ENTRY_NUMBERS.get(c.op)) is not None:
            # the first of the numbers it took: the next after its group's last entry (or last such call)
            # before it, the same on every member; a ring buffer that lost that entry has declared the
            # steps it covers incomplete (:func:`losses`)
            seq = _no_entry_seq(c, es, created.get(c.pg_name, []), taken.get(c.pg_name, 0))
            taken[c.pg_name] = seq + numbers - 1
            hooked.append(replace(c, seq=seq))
            continue
        lo, hi = (
            (c.start_ns, c.issue_end_ns) if c.ident else (c.start_ns - slack_ns, c.issue_end_ns + slack_ns)
        )
        seq = -1
        for k in _made_by(c, es, created.get(c.pg_name, []), lo, hi):
            if (c.pg_name, k) not in claimed:
                claimed.add((c.pg_name, k))
                seq = es[k].seq if seq < 0 else seq
        if seq < 0:
            left_out += 1
        else:
            span = spans.get((c.pg_name, seq))
            end = max(c.end_ns, span[1]) if span is not None and c.is_async else c.end_ns
            hooked.append(replace(c, seq=seq, end_ns=end))
    extra = []
    for pg, es in by_pg.items():
        for k, e in enumerate(es):
            step = step_of(e.created_ns, starts, ordered)
            if step < 0 or (pg, k) in claimed:
                continue
            extra.append(
                CommRecord(
                    node_type=NodeType.COMM_COLL,
                    op=e.op,
                    comm_type=collective_from_op(e.op),
                    pg_name=e.pg_name,
                    seq=e.seq,
                    src=-1,
                    dst=-1,
                    tag=0,
                    numel=e.numel,
                    dtype=e.dtype,
                    size_bytes=e.size_bytes,
                    start_ns=e.created_ns,
                    issue_end_ns=e.created_ns,
                    # no device span: its end is gloo's worker's where seen (the build looks), else unknown
                    end_ns=max(e.created_ns, spans[(pg, e.seq)][1]) if (pg, e.seq) in spans else END_UNKNOWN,
                    is_async=True,
                    thread=native_of.get(e.thread_ident, thread),
                    step=step,
                    ident=e.thread_ident,
                )
            )
    extra.sort(key=lambda c: c.start_ns)
    return hooked, extra, left_out


#: Name of a functional reduce_scatter that gloo ran as an all_reduce (:func:`as_issued`): the dispatcher op
#: the program called (``reduce_scatter_single`` calls it; Kineto's operator has this name).
FUNCTIONAL_REDUCE_SCATTER_OP = "_c10d_functional::reduce_scatter_tensor"


def as_issued(
    extra: Sequence[CommRecord],
    scatters: Sequence[tuple[int, int, int]],
    thread_of: Callable[[CommRecord], int] = lambda c: c.ident,
) -> list[CommRecord]:
    """The collectives only the recorder saw (:func:`merge`'s ``extra``), each as the program issued it:
    gloo runs a functional reduce_scatter as an all_reduce of the whole input, and records it so
    (``gloo:all_reduce``, the input's bytes); one whose entry its thread created inside a functional
    ``reduce_scatter_single`` call (``scatters``: (thread ident, start, end), the hooks' spans, see
    :mod:`skewlens.profiler.capture.waits`) is a REDUCE_SCATTER of those bytes, as a hooked
    ``reduce_scatter_tensor`` call of the same tensor is, named :data:`FUNCTIONAL_REDUCE_SCATTER_OP`, so
    that the critical path's share by op counts sequence parallelism's reduce_scatters apart from the
    all_reduces; the recorder's name stays in :attr:`CommRecord.ran_as`, which gloo's worker events
    carry. ``thread_of``: what of an entry names the thread of ``scatters`` (default its Python ident, the
    hooks'; :func:`~skewlens.profiler.capture.build.compiled_reduce_scatters` passes Kineto's operators by
    native thread)."""
    by_thread: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for ident, start, end in scatters:
        by_thread[ident].append((start, end))
    if not by_thread:
        return list(extra)
    # an entry lies in one of its thread's spans where the latest end among those begun by it reaches it
    spans = {ident: Reach(s) for ident, s in by_thread.items()}

    def inside(c: CommRecord) -> bool:
        reach = spans.get(thread_of(c))
        return reach is not None and reach(c.start_ns) >= c.start_ns

    return [
        replace(c, op=FUNCTIONAL_REDUCE_SCATTER_OP, comm_type=CommType.REDUCE_SCATTER, ran_as=c.op)
        if c.comm_type == CommType.ALL_REDUCE and c.op.startswith("gloo:") and inside(c)
        else c
        for c in extra
    ]


def even_splits_note(unread: int, records: Sequence[CommRecord]) -> str:
    """The manifest's ``all_to_all splits`` note: ``unread`` hooked all_to_all calls whose split sizes could
    not be read, and the all_to_alls among ``records`` (those only the recorder saw: functional collectives,
    an MoE layer's ``all_to_all_single_autograd``, C++), whose entries hold no split sizes; both recorded
    with even splits. '' where there are none."""
    recorder = sum(1 for c in records if c.comm_type == CommType.ALL_TO_ALL)
    if not unread and not recorder:
        return ""
    parts = [f"{unread} whose split sizes could not be read"] if unread else []
    if recorder:
        parts.append(
            f"{recorder} issued outside torch.distributed's Python API (functional collectives, C++) and "
            "taken from the flight recorder, which records no split sizes"
        )
    return (
        f"{unread + recorder} all_to_all call(s) recorded with even splits (their bytes sent to and received "
        f"from each member unknown; a simulated or real replay moves equal parts): {'; '.join(parts)}"
    )


def sparse_all_reduce_note(records: Sequence[CommRecord]) -> str:
    """The manifest's ``communication sizes`` note for gloo's all_reduces of sparse tensors among ``records``
    (DDP's gradients of ``sparse=True`` embedding tables; hooked ones, :attr:`CommRecord.sparse`, or only
    the recorder's, named ``gloo:sparse_all_reduce``): recorded as all_reduces of the dense tensor's size,
    the size gloo's flight recorder gives, while gloo moves each rank's coalesced indices and values, as
    all_gathers whose sizes vary by rank and step. '' where there are none."""
    sparse = [c for c in records if c.sparse or op_base(c.op) == SPARSE_ALL_REDUCE_OP]
    if not sparse:
        return ""
    sizes = sorted({c.size_bytes for c in sparse})
    dense = format_bytes(sizes[0]) + (f"-{format_bytes(sizes[-1])}" if len(sizes) > 1 else "")
    return (
        f"{len(sparse)} sparse all_reduce(s) (gloo:sparse_all_reduce, a sparse=True embedding's gradient) "
        f"recorded as all_reduces of the dense tensor's size ({dense}): gloo all_gathers each rank's "
        "coalesced indices and values instead, sizes no rank records, so replay (comm_mode=model, mode=real) "
        "moves the dense size"
    )


def summary(records: Sequence[CommRecord]) -> str:
    """``"3 all_gather on group '0', 3 all_reduce on group '1'"`` for a manifest note."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        kind = r.comm_type.name.lower() if r.comm_type is not None else r.op
        counts[(kind, r.pg_name)] += 1
    return ", ".join(f"{n} {k} on group {g!r}" for (k, g), n in sorted(counts.items()))


def call_type(c: CommRecord | FrEntry) -> str:
    """What a stop record calls a call: its collective type (``all_reduce``), ``send`` or ``recv``."""
    if isinstance(c, FrEntry):
        kind = collective_from_op(c.op)
        return kind.name.lower() if kind is not None else c.op.rsplit(":", 1)[-1]
    if c.node_type == NodeType.COMM_SEND:
        return "send"
    if c.node_type == NodeType.COMM_RECV:
        return "recv"
    return c.comm_type.name.lower() if c.comm_type is not None else c.op.rsplit(":", 1)[-1]


def _no_entry_seq(c: CommRecord, es: Sequence[FrEntry], created: Sequence[int], taken: int) -> int:
    """The first of the numbers a call that makes no recorder entry takes (``c``; ``es``: its group's
    entries by creation, ``created`` their times; ``taken``: the last number such a call took before it):
    the next after its group's last entry, or last such call, before it, the same on every member."""
    k = bisect.bisect_left(created, c.start_ns)
    return max(es[k - 1].seq if k else 0, taken) + 1


def _numbered(c: CommRecord, returned: Sequence[CommRecord], entries: Sequence[FrEntry]) -> CommRecord:
    """``c``, a call that makes no recorder entry, numbered as :func:`resolve` numbers one that returned
    (:func:`_no_entry_seq`; with no recorder, the hooks' number it has)."""
    if not entries:
        return c
    es = sorted((e for e in entries if e.pg_name == c.pg_name), key=lambda e: e.created_ns)
    taken = max(
        (
            r.seq + NO_ENTRY_NUMBERS[r.op] - 1
            for r in returned
            if r.op in NO_ENTRY_NUMBERS and r.pg_name == c.pg_name and r.start_ns < c.start_ns
        ),
        default=0,
    )
    return replace(c, seq=_no_entry_seq(c, es, [e.created_ns for e in es], taken))


def stop_record(
    returned: Sequence[CommRecord],
    entries: Sequence[FrEntry],
    *,
    step: int,
    step_start_ns: int,
    saved_ns: int,
    offset_ns: int,
    raised: str = "",
    inside: Sequence[CommRecord] = (),
) -> dict[str, object]:
    """Where this rank stopped, for a partial save's part file (``stopped``, read as a
    :class:`~skewlens.profiler.manifest.RankStop`): its last call that returned (``returned``: the hooked
    calls, numbered by the recorder) and the recorder's entries of the unfinished step that no returned call
    accounts for (gloo's recorder marks no entry completed: a call the rank is blocked in, or an
    asynchronous one it had not waited for), with the calls that make no entry that it entered and did not
    return from (``inside``, :meth:`~skewlens.profiler.capture.hooks.CommHooks.inside`: a
    ``monitored_barrier`` it waits or raised in), and ``raised``, the exception its program ended with (''
    for none). Times on the aligned clock (local + ``offset_ns``). ``collectives_started`` counts the step's
    collectives, none of which is in the trace: the hooked ones issued in it that returned, and those in
    flight (without the recorder, the returned ones alone and those it is inside)."""
    last = max(returned, key=lambda c: c.issue_end_ns, default=None)
    done = {(c.pg_name, c.seq) for c in returned if c.node_type == NodeType.COMM_COLL}
    flying: list[tuple[int, CommRecord | FrEntry]] = [
        (e.created_ns, e) for e in entries if e.created_ns >= step_start_ns and (e.pg_name, e.seq) not in done
    ]
    flying += [(c.start_ns, _numbered(c, returned, entries)) for c in inside if c.start_ns >= step_start_ns]
    flying.sort(key=lambda f: f[0])
    returned_in_step = sum(c.step == step and c.node_type == NodeType.COMM_COLL for c in returned)

    def at(c: CommRecord | FrEntry, ns: int) -> dict[str, object]:
        seq = c.seq if not isinstance(c, CommRecord) or c.node_type == NodeType.COMM_COLL else -1
        return {
            "type": call_type(c),
            "pg_name": c.pg_name,
            "seq": seq,
            "size_bytes": c.size_bytes,
            "at_ns": ns,
        }

    return {
        "step": step,
        "step_start_ns": step_start_ns + offset_ns,
        "saved_ns": saved_ns + offset_ns,
        "last": None if last is None else at(last, last.issue_end_ns + offset_ns),
        "in_flight": [at(c, ns + offset_ns) for ns, c in flying],
        "collectives_started": returned_in_step + len(flying),
        **({"raised": raised} if raised else {}),
    }
