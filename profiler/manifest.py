"""The run directory's manifest: ``RUN_DIR/manifest.json`` beside ``rank-<r>.et``.

Versioned: every reader checks ``format`` and ``version`` and says what it found. Written atomically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from skewlens.profiler.atomic import write_text_atomic
from skewlens.profiler.bounded import (
    JSON_GZIP_FLOOR_BYTES,
    JSON_GZIP_RATIO,
    json_error_text,
    read_bytes_bounded,
    too_long,
)
from skewlens.profiler.errors import ManifestError
from skewlens.profiler.vocab import Level

MANIFEST_NAME = "manifest.json"
#: Most ranks a run may declare. A manifest is untrusted input and its world size decides what the loader
#: allocates (a list of every rank); a run of a million ranks fits.
MAX_WORLD_SIZE = 1 << 20
#: Largest manifest read (a million ranks with their steps and notes fit).
MAX_MANIFEST_BYTES = 1 << 30
_INT64 = 1 << 63
#: Range of step times taken, ns (2**62 ns: the year 2116 as a Unix time).
_TIMES = (-(1 << 62), 1 << 62)
MANIFEST_FORMAT = "skewlens-run"
MANIFEST_VERSION = 1
RANK_FILE = "rank-{rank}.et"
#: A run directory's other entries: the ranks' part files of a capture under way (removed once it is
#: combined), the raw per-rank events kept on request, and the Parquet export's default place.
PARTS_DIR = ".parts"
RAW_DIR = "raw"
PARQUET_DIR = "parquet"
#: Manifest sources whose traces give each host thread one stream of its own, the thread that marks steps
#: stream 0 (the capture's session numbers them so, :mod:`skewlens.profiler.capture.build`; a real replay
#: is captured by it). Elsewhere a stream id says less: an imported Kineto profile numbers threads by
#: Kineto's tid, and a synthetic one as its builder chose.
THREAD_STREAM_SOURCES = frozenset({"capture", "replay"})


#: How a capture's manifest note on a rank (key ``rank N``) begins where the command ended before the capture
#: window did, so that the rank saved fewer steps than asked.
PARTIAL_TRACE_NOTE = "partial trace"

#: A capture's manifest note on the traces of ranks beyond the world of a restarted command's last attempt: an
#: earlier attempt's, which ran on more ranks, left out of the run (``skewlens check`` warns of it).
EARLIER_ATTEMPT_NOTE = "earlier attempt"

#: A capture's manifest note where its merge replaced the manifest of another job that a second ``skewlens
#: profile`` captured into the same directory at the same time (``skewlens check`` warns of it).
REPLACED_NOTE = "replaced another job"

#: The note of a manifest the loader inferred for a directory holding a capture's part files (``.parts/``) and
#: no ``manifest.json``: a ``skewlens profile`` still writing the run, or killed before it wrote the manifest.
CAPTURE_PARTS_NOTE = "capture parts"
#: What to do about such a run.
CAPTURE_PARTS_ADVICE = "wait for `skewlens profile` to finish"
#: What a capture says of a rank that ran ``torch.distributed.rpc``: none of its traffic is in the trace.
RPC_NOTE = (
    "torch.distributed.rpc was running: its traffic (rpc_sync, rpc_async, remote, RRefs, distributed "
    "autograd, DistributedOptimizer) is not recorded or modelled, so a rank's wait for an RPC reads as its "
    "own compute (collectives level) or untraced host time or the calling operator's compute (ops, full): "
    "a slow callee, such as a parameter server, is blamed on its callers"
)
#: How a host's manifest begins its note on a rank of a multi-host job that it holds no trace of (another
#: host's, most likely).
OTHER_HOST_NOTE = "no trace here: the job spans hosts"


class RankNote(StrEnum):
    """Kinds of a rank's manifest notes: the key ``rank N KIND`` (:func:`rank_note_key`), which writers and
    readers both spell from here."""

    PROFILER = "profiler"
    OPERATORS = "operators"
    CALLS = "calls"
    RUNNING_CALLS = "running calls"
    LOST_CALLS = "lost calls"
    CLOCK = "clock"
    WORKER_EVENTS = "worker events"
    WORKER_EVENTS_RECORDER = "worker events recorder"
    ALL_TO_ALL_SPLITS = "all_to_all splits"
    COMM_SIZES = "communication sizes"
    COMM_GROUPS = "communication groups"
    GPU_DEPENDENCIES = "GPU dependencies"
    DATA_DEPENDENCIES = "data dependencies"
    FLIGHT_RECORDER = "flight recorder"
    FLIGHT_RECORDER_DUMP = "flight recorder dump"
    FLIGHT_RECORDER_DEVICE_TIMES = "flight recorder device times"
    IMPORT = "import"
    SOURCE = "source"
    RPC = "rpc"
    GROUPS_MADE = "process groups made"


def rank_note_key(rank: int, kind: RankNote | None = None) -> str:
    """The manifest note key of rank ``rank``: ``rank N KIND``, or ``rank N`` (what became of the rank)."""
    return f"rank {rank}" if kind is None else f"rank {rank} {kind.value}"


#: Kinds of a capture's per-rank manifest notes that say some of the rank's data was not recorded
#: (operators or calls, collectives' ends, a clock offset, the flight recorder's entries): ``skewlens
#: check`` warns of each, and the reports of ``analyze`` and ``replay`` repeat them.
DEGRADED_NOTE_KINDS: frozenset[str] = frozenset(
    {
        RankNote.OPERATORS,
        RankNote.CALLS,
        RankNote.LOST_CALLS,
        RankNote.CLOCK,
        RankNote.FLIGHT_RECORDER_DUMP,
        RankNote.WORKER_EVENTS,
        RankNote.ALL_TO_ALL_SPLITS,
        RankNote.COMM_SIZES,
        RankNote.COMM_GROUPS,
        RankNote.RPC,
        RankNote.GROUPS_MADE,
    }
)


def degraded_notes(notes: Mapping[str, str]) -> dict[str, list[int]]:
    """Each distinct note of a :data:`DEGRADED_NOTE_KINDS` kind -> the ranks it was written for."""
    out: dict[str, list[int]] = {}
    for key, note in sorted(notes.items()):
        if (at := _rank_key(key)) is not None and at[1] in DEGRADED_NOTE_KINDS:
            out.setdefault(note, []).append(at[0])
    return {note: sorted(ranks) for note, ranks in out.items()}


def _rank_key(key: str) -> tuple[int, str] | None:
    """``(N, KIND)`` of a per-rank note's key ``rank N KIND`` (``KIND`` '' for ``rank N``), else None."""
    head, _, rest = key.partition(" ")
    num, _, kind = rest.partition(" ")
    return (int(num), kind) if head == "rank" and num.isdigit() else None


#: The manifest note's key that says how steps were marked where several optimizers stepped.
STEP_MARKS_NOTE = "step marks"
#: The manifest note's key that describes an extrapolated run (``skewlens.replay.scale``).
SCALE_NOTE = "scale"
#: The ``otherData`` key of an extrapolated replay's ``timeline.json``: its ranks (``scale.dp`` of them, times
#: the ranks of a replica), which no run holds (so the store's loader says the file cannot be analysed).
TIMELINE_SCALED_RANKS = "extrapolated_ranks"
#: How the Perfetto timelines skewlens writes begin (:func:`skewlens.replay.streaming.trace_json`: a replay's
#: ``timeline.json``, analyze's ``trace_critical_path.json``): Chrome trace JSON, as Kineto's is, so that the
#: store's Kineto sniff took a replay's output directory for Kineto traces and advised importing them.
OWN_TIMELINE = re.compile(rb'\A\{"displayTimeUnit":"[a-z]+","otherData":\{"t0_ns":')


def own_timeline_hint(name: str, head: bytes, *, not_a: str) -> str | None:
    """Where ``head`` (a file's first bytes) begins a Perfetto timeline skewlens wrote (:data:`OWN_TIMELINE`),
    what to say of file ``name``: that it is one (``not_a`` what the command wanted, ``a run``), the run it
    was made from, or, for an extrapolated replay (``scale.dp``), that no run holds its ranks; else None."""
    if not OWN_TIMELINE.match(head):
        return None
    other: dict[str, Any] = {}
    try:
        text = head.decode("utf-8", "replace")
        got, _end = json.JSONDecoder().raw_decode(text, text.index('"otherData":') + len('"otherData":'))
        other = got if isinstance(got, dict) else {}
    except ValueError:  # cut short by the head's end: what it says is all there is
        pass
    run_dir = other.get("run_dir")
    of = f" of run {run_dir}" if isinstance(run_dir, str) else ""
    said = (
        f"{name} is a Perfetto timeline skewlens wrote{of} (a replay's or an analysis' output), not {not_a}"
    )
    scaled = other.get(TIMELINE_SCALED_RANKS)
    if isinstance(scaled, int) and not isinstance(scaled, bool):
        return (
            f"{said}: the replay was extrapolated to {scaled:,} ranks (scale.dp), which no run holds, so "
            "no command reads it as a run; its per-rank results are summary.parquet and timeline.parquet "
            f"beside it{f', and {run_dir} is the captured run' if isinstance(run_dir, str) else ''}"
        )
    return f"{said}: give the run it was made from{f', {run_dir}' if isinstance(run_dir, str) else ''}"


def partial_traces(notes: Mapping[str, str]) -> dict[int, str]:
    """Rank -> its note, for the ranks whose manifest note says their trace is partial."""
    out: dict[int, str] = {}
    for key, note in notes.items():
        if (at := _rank_key(key)) is not None and at[1] == "" and note.startswith(PARTIAL_TRACE_NOTE):
            out[at[0]] = note
    return out


def gpu_model(name: object, sms: object = None, memory_bytes: object = None) -> str:
    """A GPU in words, as the manifest's ``gpus`` say it, ``NVIDIA H100 80GB HBM3 (132 SMs, 79.2 GiB)`` (''
    where it has no name): what tells two ranks' GPUs apart (a model, or one of its SM count and memory).
    From an imported trace's ``deviceProperties`` or the capture's ``torch.cuda.get_device_properties``."""
    if not isinstance(name, str) or not name.strip():
        return ""
    said = [
        *([f"{sms} SMs"] if type(sms) is int and sms > 0 else []),
        *([f"{memory_bytes / 2**30:.1f} GiB"] if type(memory_bytes) is int and memory_bytes > 0 else []),
    ]
    detail = " (" + ", ".join(said) + ")" if said else ""
    return f"{name.strip()[:80]}{detail}"


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Path of one rank's Chakra trace in a run directory."""
    return Path(run_dir) / RANK_FILE.format(rank=rank)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessGroupInfo:
    """One process group as created by the traced program."""

    name: str
    """The group's name as c10d reports it (``"0"`` is the default group)."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    desc: str = ""
    """Description (``default_pg``, ``tp``, ...)."""
    backend: str = ""
    """Backend (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``)."""


#: What parsing a ``## process_group:init ##`` list (its JSON, then :func:`pg_init_group` of each entry)
#: raises where it is malformed (RecursionError: JSON nested too deeply).
PG_INIT_ERRORS = (ValueError, KeyError, TypeError, RecursionError)
#: The most characters of such an error's text a refusal quotes (a ValueError may quote the value whole).
PG_INIT_ERROR_CHARS = 200


def pg_init_problem(e: BaseException) -> str:
    """``ValueError: group 'g' names rank(s) [...]``: what the :data:`PG_INIT_ERRORS` error ``e`` says, its
    text cut to :data:`PG_INIT_ERROR_CHARS` characters."""
    return f"{type(e).__name__}: {str(e)[:PG_INIT_ERROR_CHARS]}"


def pg_init_group(g: Mapping[str, Any]) -> ProcessGroupInfo:
    """One entry of PyTorch's ``## process_group:init ##`` list (``pg_name``, ``ranks``, ``pg_desc``,
    ``backend_config``) as a group; a ``KeyError``, ``TypeError`` or ``ValueError`` where it is malformed,
    a rank outside ``0..MAX_WORLD_SIZE-1`` included (so that a trace naming rank 10**12 is refused on load,
    not first by the real replay)."""
    name = str(g["pg_name"])
    ranks = tuple(int(r) for r in g["ranks"])
    if bad := [r for r in ranks if not 0 <= r < MAX_WORLD_SIZE][:4]:
        raise ValueError(f"group {name!r} names rank(s) {bad} outside 0..{MAX_WORLD_SIZE - 1}")
    return ProcessGroupInfo(
        name=name, ranks=ranks, desc=str(g.get("pg_desc", "")), backend=str(g.get("backend_config", ""))
    )


#: The description torch gives a process group made without one.
NO_DESC = "undefined"


def own_desc(name: str, desc: str) -> str:
    """The description a program gave group ``name`` (``mesh_dp``), '' where ``desc`` says nothing more:
    none, torch's default (:data:`NO_DESC`) or the name again."""
    return desc if desc not in ("", name, NO_DESC) else ""


#: How torch names a group made with ``new_group(..., use_local_synchronization=True)``: the SHA-1 of its
#: ranks (``_hash_ranks_to_str``), 40 hex digits, not a number from its counter.
HASHED_GROUP_NAME = re.compile(r"[0-9a-f]{40}")


def creation_order(name: str) -> tuple[bool, int, str]:
    """Sort key of a group name: torch's numbers in the order it made them ('2' before '10'), then others."""
    return (not name.isdecimal(), int(name) if name.isdecimal() else 0, name)


#: The description torch gives the default (world) group.
DEFAULT_PG_DESC = "default_pg"


def default_group_name(groups: Iterable[ProcessGroupInfo]) -> str:
    """Name of the default group among ``groups``: the first described as :data:`DEFAULT_PG_DESC`, else
    ``"0"`` (torch's name for it)."""
    return next((g.name for g in groups if g.desc == DEFAULT_PG_DESC), "0")


def with_world_ranks(groups: Mapping[str, ProcessGroupInfo], world_size: int) -> dict[str, ProcessGroupInfo]:
    """``groups`` with an empty rank list read as every rank of the world: PyTorch's execution-trace
    observer (``## process_group:init ##``, ``_World.pg_config_info``) lists no ranks for a group that
    spans the whole world."""
    return {name: g if g.ranks else replace(g, ranks=tuple(range(world_size))) for name, g in groups.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSpan:
    """The boundary of one training step on one rank, on the aligned clock."""

    rank: int
    """Global rank."""
    step: int
    """Step index as counted by the profiler (0 = first step of the program)."""
    start_ns: int
    """Step start, aligned ns."""
    end_ns: int
    """Step end, aligned ns."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepWindow:
    """The capture schedule, as torch.profiler's: skip ``wait`` steps, warm up, then record ``active``."""

    wait: int = 1
    """Steps skipped entirely."""
    warmup: int = 1
    """Steps run with capture machinery warming up, not recorded."""
    active: int = 3
    """Steps recorded."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LostCollectives:
    """Collectives of one group that a member's flight recorder lost (its ring buffer wrapped), declared
    for every member of the group alike: the loader leaves them out of matching and marks the steps
    incomplete."""

    pg_name: str
    """The group."""
    first_seq: int
    """First lost sequence number."""
    last_seq: int
    """Last lost sequence number; -1: every number from ``first_seq`` on."""
    steps: tuple[int, ...]
    """Steps that may have lost collectives (incomplete)."""
    ranks: tuple[int, ...]
    """The ranks whose recorder lost them (the others' are left out of matching too)."""

    def covers(self, seq: int) -> bool:
        return seq >= self.first_seq and (self.last_seq < 0 or seq <= self.last_seq)


@dataclass(frozen=True, kw_only=True, slots=True)
class CallAt:
    """A communication call of a rank's unfinished step (:class:`RankStop`)."""

    type: str
    """``all_reduce``, ``broadcast``, ... (a collective's type), ``send`` or ``recv``."""
    pg_name: str
    """The group it was issued on."""
    seq: int
    """Its sequence number in the group (the flight recorder's); -1 for a send/recv."""
    size_bytes: int
    """Bytes of its input tensor(s)."""
    at_ns: int
    """Aligned ns: when it returned (a rank's last call), or when it was issued (a call in flight)."""


RAISED_CHARS = 200
"""The most characters of a rank's exception (:attr:`RankStop.raised`) a stop record keeps."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankStop:
    """Where a rank that saved a partial trace (the command ended inside the capture window) stopped."""

    rank: int
    """Global rank."""
    step: int
    """The step it was in (not in ``steps``: it did not finish)."""
    step_start_ns: int
    """When that step began on the rank (the end of its previous one), aligned ns."""
    saved_ns: int
    """When the rank saved its trace, aligned ns."""
    last: CallAt | None = None
    """Its last communication call that returned in the capture window; None where none did."""
    in_flight: tuple[CallAt, ...] = ()
    """The collectives it issued that did not return (it was blocked in them, or they were asynchronous):
    the flight recorder's entries of the step that no returned call accounts for, oldest first."""
    raised: str = ""
    """The exception its program ended with (``RuntimeError: bad batch``: the first line, at most
    :data:`RAISED_CHARS` characters); '' where it ended without one (stopped by a signal, or a clean exit)."""
    collectives_started: int | None = None
    """How many collectives it issued in the step (those that returned and those in flight), none of which
    is in its trace; None in manifests written before skewlens counted them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunIdentity:
    """Which job a capture belongs to, as its ranks saw it under torchrun: what ``skewlens merge`` compares
    before combining the directories of a job's hosts."""

    run_id: str = ""
    """torchrun's ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``; a fresh uuid under ``--standalone``; ``none``,
    the same for every job, where a multi-host job gave no ``--rdzv-id``); '' outside torchrun."""
    rendezvous: str = ""
    """``MASTER_ADDR:MASTER_PORT`` of the job's ranks ('' where unset)."""
    started_ns: int = 0
    """When the earliest rank's capture began (wall clock ns, on rank 0's clock); 0 where unknown."""

    def key(self) -> str:
        """What must be equal for two hosts' directories to be of one job (the start time is not: each
        host's ranks start at their own instant)."""
        return f"run id {self.run_id or '(none set)'} at {self.rendezvous or '(no rendezvous)'}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """Everything about a run that is not a per-rank node."""

    world_size: int
    """Number of ranks in the traced job."""
    ranks: tuple[int, ...]
    """Ranks whose trace file is present and complete."""
    missing_ranks: tuple[int, ...] = ()
    """Ranks of the job with no complete trace (crashed, not captured), with the reason in ``notes``."""
    process_groups: tuple[ProcessGroupInfo, ...] = ()
    """Process groups of the job (the default group included)."""
    backend: str = ""
    """Default backend (``gloo``, ``nccl``)."""
    level: str = "collectives"
    """Capture level: ``collectives``, ``ops`` or ``full``."""
    source: str = "capture"
    """What wrote the run: ``capture``, ``import``, ``replay``, ``synthetic``."""
    devices: dict[int, str] = field(default_factory=dict)
    """Device of each rank (``cpu``, ``cuda:0``)."""
    gpus: dict[int, str] = field(default_factory=dict)
    """GPU of each rank (:func:`gpu_model`: model, SMs, memory), from an imported Kineto trace's
    ``deviceProperties`` or, in a capture on CUDA, the rank's ``torch.cuda.get_device_properties``; ranks
    none says it for are absent (and written without it, the key)."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Host name of each rank."""
    clock_offsets_ns: dict[int, int] = field(default_factory=dict)
    """Offset added to each rank's local clock to get the aligned clock (rank 0 is the reference)."""
    step_window: StepWindow = field(default_factory=StepWindow)
    """Capture schedule."""
    steps: tuple[StepSpan, ...] = ()
    """Per-rank step boundaries of the recorded steps."""
    torch_version: str = ""
    """torch.__version__ of the traced job."""
    skewlens_version: str = ""
    """Version of skewlens that wrote the run."""
    command: tuple[str, ...] = ()
    """The wrapped command line, where there was one (of a run ``skewlens merge`` combined: the command of
    rank 0's host)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Free-form remarks (e.g. why a rank is missing: ``{"rank 3": "exited with code 1"}``)."""
    lost_collectives: tuple[LostCollectives, ...] = ()
    """Collective ranges a flight recorder lost, one per group (merged over its members)."""
    run_identity: RunIdentity | None = None
    """The job the capture belongs to; None in manifests written before skewlens recorded it (and in runs
    not captured)."""
    merged_from: tuple[str, ...] = ()
    """The hosts' run directories ``skewlens merge`` combined into this run, absolute, in the order given
    (each keeps its host's own manifest and command); () where no merge wrote the run, and in manifests
    written before skewlens recorded it."""

    stopped: tuple[RankStop, ...] = ()
    """Where each rank that saved a partial trace stopped, for ``skewlens check`` to say which rank did not
    arrive at which collective; () where no rank did, and in manifests written before skewlens recorded it."""

    def missing_by_note(self) -> dict[str, list[int]]:
        """The ranks without a trace grouped by their note in ``notes`` ('' where none), in rank order."""
        by_note: dict[str, list[int]] = {}
        for r in self.missing_ranks:
            by_note.setdefault(self.notes.get(f"rank {r}", ""), []).append(r)
        return by_note

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **d}
        for key in ("devices", "gpus", "hosts", "clock_offsets_ns"):
            d[key] = {str(k): v for k, v in d[key].items()}
        if not d["gpus"]:  # written only where a trace said: a manifest without it reads as before
            del d["gpus"]
        for stop in d["stopped"]:  # written only where a rank raised: a manifest without it reads as before
            if not stop["raised"]:
                del stop["raised"]
            if stop["collectives_started"] is None:  # counted since: written where known
                del stop["collectives_started"]
        return d

    @staticmethod
    def from_json(d: dict[str, Any], where: str = "manifest") -> Manifest:
        """The manifest in ``d`` (parsed JSON), every value type- and range-checked: a manifest is as
        untrusted as the traces, and its world size decides what the loader allocates. Errors name the key
        (``manifest.json: ranks[2]: rank 9 is outside world size 4``)."""
        if d.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"{where}: not a skewlens manifest (format={d.get('format')!r})")
        if "version" not in d:
            raise ManifestError(f"{where}: version: missing (this skewlens reads version {MANIFEST_VERSION})")
        if type(d["version"]) is not int or d["version"] != MANIFEST_VERSION:  # JSON's true is Python's 1
            raise ManifestError(
                f"{where}: manifest version {d['version']!r} is not supported (this skewlens reads "
                f"version {MANIFEST_VERSION})"
            )
        j = _Json(where)
        ws = j.integer(j.need(d, "world_size"), "world_size", 1, MAX_WORLD_SIZE)
        ranks = j.ranks(j.need(d, "ranks"), "ranks", ws)
        missing = j.ranks(d.get("missing_ranks", []), "missing_ranks", ws)
        if both := sorted(set(ranks) & set(missing)):
            raise ManifestError(f"{where}: ranks and missing_ranks both list rank {both[0]}")
        groups = []
        names: set[str] = set()
        for key, g in j.objects(d, "process_groups"):
            name = g.get("name")
            if isinstance(name, str):
                if name in names:
                    raise ManifestError(f"{where}: {key}.name: group {name!r} is listed twice")
                names.add(name)
            groups.append(
                ProcessGroupInfo(
                    name=j.text(j.need(g, "name", key), f"{key}.name"),
                    ranks=j.ranks(j.need(g, "ranks", key), f"{key}.ranks", ws),
                    desc=j.text(g.get("desc", ""), f"{key}.desc"),
                    backend=j.text(g.get("backend", ""), f"{key}.backend"),
                )
            )
        window = j.obj(d.get("step_window", {}), "step_window")
        if extra := sorted(set(window) - {"wait", "warmup", "active"}):
            raise ManifestError(f"{where}: step_window: unknown key {extra[0]!r}")
        steps = []
        for key, sp in j.objects(d, "steps"):
            span = StepSpan(
                rank=j.integer(j.need(sp, "rank", key), f"{key}.rank", 0, ws - 1),
                step=j.integer(j.need(sp, "step", key), f"{key}.step", 0),
                # bounded as the traces' times (the store's MAX_START_NS): differences of ±2**63 overflowed
                start_ns=j.integer(j.need(sp, "start_ns", key), f"{key}.start_ns", *_TIMES),
                end_ns=j.integer(j.need(sp, "end_ns", key), f"{key}.end_ns", *_TIMES),
            )
            if span.end_ns < span.start_ns:
                raise ManifestError(
                    f"{where}: {key}: end_ns {span.end_ns} is before start_ns {span.start_ns}"
                )
            steps.append(span)
        lost = []
        for key, x in j.objects(d, "lost_collectives"):
            lost.append(
                LostCollectives(
                    pg_name=j.text(j.need(x, "pg_name", key), f"{key}.pg_name"),
                    first_seq=j.integer(j.need(x, "first_seq", key), f"{key}.first_seq", 0),
                    last_seq=j.integer(j.need(x, "last_seq", key), f"{key}.last_seq", -1),
                    steps=tuple(
                        j.integer(t, f"{key}.steps", 0) for t in j.array(j.need(x, "steps", key), key)
                    ),
                    ranks=j.ranks(x.get("ranks", []), f"{key}.ranks", ws),
                )
            )
        return Manifest(
            world_size=ws,
            ranks=ranks,
            missing_ranks=missing,
            process_groups=tuple(groups),
            backend=j.text(d.get("backend", ""), "backend"),
            level=j.choice(d.get("level", Level.COLLECTIVES.value), "level", [v.value for v in Level]),
            source=j.text(d.get("source", "capture"), "source"),
            devices=j.by_rank(d.get("devices", {}), "devices", ws, j.text),
            gpus=j.by_rank(d.get("gpus", {}), "gpus", ws, j.text),
            hosts=j.by_rank(d.get("hosts", {}), "hosts", ws, j.text),
            clock_offsets_ns=j.by_rank(d.get("clock_offsets_ns", {}), "clock_offsets_ns", ws, j.integer),
            step_window=StepWindow(**{k: j.integer(v, f"step_window.{k}", 0) for k, v in window.items()}),
            steps=tuple(steps),
            torch_version=j.text(d.get("torch_version", ""), "torch_version"),
            skewlens_version=j.text(d.get("skewlens_version", ""), "skewlens_version"),
            command=tuple(j.text(c, "command") for c in j.array(d.get("command", []), "command")),
            notes={
                j.text(k, "notes"): j.text(v, f"notes[{k!r}]")
                for k, v in j.obj(d.get("notes", {}), "notes").items()
            },
            lost_collectives=tuple(lost),
            run_identity=_run_identity(j, d.get("run_identity")),
            merged_from=tuple(
                j.text(p, f"merged_from[{i}]")
                for i, p in enumerate(j.array(d.get("merged_from", []), "merged_from"))
            ),
            stopped=_stops(j, d, ws),
        )


def _stops(j: _Json, d: dict[str, Any], world_size: int) -> tuple[RankStop, ...]:
    """The manifest's ``stopped``: one record per rank (a second was read over the first, unsaid)."""
    out: dict[int, RankStop] = {}
    for key, x in j.objects(d, "stopped"):
        s = rank_stop(x, j.where, key, world_size)
        if s.rank in out:
            raise ManifestError(f"{j.where}: {key}.rank: rank {s.rank} is listed twice")
        out[s.rank] = s
    return tuple(out.values())


#: The keys of a stop record (:func:`rank_stop`).
_STOP_KEYS = frozenset(
    ("rank", "step", "step_start_ns", "saved_ns", "last", "in_flight", "raised", "collectives_started")
)


def rank_stop(v: object, where: str, key: str, world_size: int) -> RankStop:
    """The :class:`RankStop` in ``v`` (a manifest's ``stopped[i]``, or a part file's ``stopped``), every
    value checked; a :class:`ManifestError` naming ``where`` and the key if one is wrong."""
    j = _Json(where)
    d = j.obj(v, key)
    if extra := sorted(set(d) - _STOP_KEYS):
        raise ManifestError(f"{j.where}: {key}: unknown key {extra[0]!r}")
    last = d.get("last")
    started = d.get("collectives_started")
    return RankStop(
        rank=j.rank(j.need(d, "rank", key), f"{key}.rank", world_size),
        step=j.integer(j.need(d, "step", key), f"{key}.step", 0),
        step_start_ns=j.integer(j.need(d, "step_start_ns", key), f"{key}.step_start_ns", *_TIMES),
        saved_ns=j.integer(j.need(d, "saved_ns", key), f"{key}.saved_ns", *_TIMES),
        last=None if last is None else _call_at(j, j.obj(last, f"{key}.last"), f"{key}.last"),
        in_flight=tuple(_call_at(j, c, f"{key}.{k}") for k, c in j.objects(d, "in_flight")),
        raised=j.text(d.get("raised", ""), f"{key}.raised")[:RAISED_CHARS],
        collectives_started=None if started is None else j.integer(started, f"{key}.collectives_started", 0),
    )


def _call_at(j: _Json, d: dict[str, Any], key: str) -> CallAt:
    if extra := sorted(set(d) - {"type", "pg_name", "seq", "size_bytes", "at_ns"}):
        raise ManifestError(f"{j.where}: {key}: unknown key {extra[0]!r}")
    return CallAt(
        type=j.text(j.need(d, "type", key), f"{key}.type"),
        pg_name=j.text(j.need(d, "pg_name", key), f"{key}.pg_name"),
        seq=j.integer(j.need(d, "seq", key), f"{key}.seq", -1),
        size_bytes=j.integer(j.need(d, "size_bytes", key), f"{key}.size_bytes", 0),
        at_ns=j.integer(j.need(d, "at_ns", key), f"{key}.at_ns", *_TIMES),
    )


def _run_identity(j: _Json, v: object) -> RunIdentity | None:
    """The manifest's ``run_identity`` (absent or null in manifests written before it was recorded)."""
    if v is None:
        return None
    d = j.obj(v, "run_identity")
    if extra := sorted(set(d) - {"run_id", "rendezvous", "started_ns"}):
        raise ManifestError(f"{j.where}: run_identity: unknown key {extra[0]!r}")
    return RunIdentity(
        run_id=j.text(d.get("run_id", ""), "run_identity.run_id"),
        rendezvous=j.text(d.get("rendezvous", ""), "run_identity.rendezvous"),
        started_ns=j.integer(d.get("started_ns", 0), "run_identity.started_ns"),
    )


_T = TypeVar("_T")


class _Json:
    """Typed reads of a manifest's parsed JSON; each refusal is a :class:`ManifestError` naming the key."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _refuse(self, key: str, what: str, v: object) -> NoReturn:
        raise ManifestError(f"{self.where}: {key}: expected {what}, got {_short(v)}")

    def need(self, d: dict[str, Any], name: str, within: str = "") -> Any:
        if name not in d:
            raise ManifestError(f"{self.where}: {within + '.' if within else ''}{name}: missing")
        return d[name]

    def integer(self, v: object, key: str, lo: int = -_INT64, hi: int = _INT64 - 1) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            self._refuse(key, "an integer", v)
        if not lo <= v <= hi:
            raise ManifestError(f"{self.where}: {key}: {v} is outside {lo}..{hi}")
        return v

    def text(self, v: object, key: str) -> str:
        return v if isinstance(v, str) else self._refuse(key, "a string", v)

    def choice(self, v: object, key: str, allowed: list[str]) -> str:
        text = self.text(v, key)
        if text not in allowed:
            raise ManifestError(f"{self.where}: {key}: expected one of {', '.join(allowed)}, got {text!r}")
        return text

    def array(self, v: object, key: str) -> list[Any]:
        return v if isinstance(v, list) else self._refuse(key, "a list", v)

    def obj(self, v: object, key: str) -> dict[str, Any]:
        return v if isinstance(v, dict) else self._refuse(key, "an object", v)

    def objects(self, d: dict[str, Any], name: str) -> list[tuple[str, dict[str, Any]]]:
        """``d[name]`` (optional: none where absent), a list of objects: each with its key (``name[i]``)."""
        return [
            (f"{name}[{i}]", self.obj(x, f"{name}[{i}]"))
            for i, x in enumerate(self.array(d.get(name, []), name))
        ]

    def ranks(self, v: object, key: str, world_size: int) -> tuple[int, ...]:
        out = tuple(self.rank(r, f"{key}[{i}]", world_size) for i, r in enumerate(self.array(v, key)))
        if len(set(out)) != len(out):
            twice = next(r for r in out if out.count(r) > 1)
            raise ManifestError(f"{self.where}: {key}: rank {twice} listed twice")
        return out

    def rank(self, v: object, key: str, world_size: int) -> int:
        r = self.integer(v, key)
        if not 0 <= r < world_size:
            raise ManifestError(f"{self.where}: {key}: rank {r} is outside world size {world_size}")
        return r

    def by_rank(
        self, v: object, key: str, world_size: int, value: Callable[[object, str], _T]
    ) -> dict[int, _T]:
        out = {}
        for k, x in self.obj(v, key).items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit()):
                raise ManifestError(f"{self.where}: {key}: key {_short(k)} is not a rank")
            out[self.rank(int(k), f"{key}[{k!r}]", world_size)] = value(x, f"{key}[{k!r}]")
        return out


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def write_manifest(run_dir: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temp file + rename)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(d / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=2) + "\n")


def read_manifest(run_dir: str | Path) -> Manifest:
    """Read and version-check ``RUN_DIR/manifest.json``."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.exists():
        raise ManifestError(f"{path}: no manifest (is {run_dir} a skewlens run directory?)")
    text = read_bytes_bounded(
        path,
        MAX_MANIFEST_BYTES,
        error=ManifestError,
        what="manifest",
        gzip_ratio=JSON_GZIP_RATIO,  # a 1 MB gzip of zeros was 1 GiB of JSON, and 5 GB parsed
        gzip_floor=JSON_GZIP_FLOOR_BYTES,
    )
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; an int of 5,000 digits
        why = (
            json_error_text(e)
            if isinstance(e, json.JSONDecodeError)
            else too_long(e)
            if type(e) is ValueError
            else type(e).__name__
        )
        raise ManifestError(f"{path}: not valid JSON ({why})") from None
    if not isinstance(d, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    return Manifest.from_json(d, str(path))
