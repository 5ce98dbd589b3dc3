"""The run directory's manifest: ``RUN_DIR/manifest.json`` beside ``rank-<r>.et``.

Versioned: every reader checks ``format`` and ``version`` and says what it found. Written atomically.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skewlens.profiler.atomic import write_text_atomic
from skewlens.profiler.errors import ManifestError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "skewlens-run"
MANIFEST_VERSION = 1
RANK_FILE = "rank-{rank}.et"


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
    """The wrapped command line, where there was one."""
    notes: dict[str, str] = field(default_factory=dict)
    """Free-form remarks (e.g. why a rank is missing: ``{"rank 3": "exited with code 1"}``)."""
    lost_collectives: tuple[LostCollectives, ...] = ()
    """Collective ranges a flight recorder lost, one per group (merged over its members)."""

    def missing_by_note(self) -> dict[str, list[int]]:
        """The ranks without a trace grouped by their note in ``notes`` ('' where none), in rank order."""
        by_note: dict[str, list[int]] = {}
        for r in self.missing_ranks:
            by_note.setdefault(self.notes.get(f"rank {r}", ""), []).append(r)
        return by_note

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **d}
        for key in ("devices", "hosts", "clock_offsets_ns"):
            d[key] = {str(k): v for k, v in d[key].items()}
        return d

    @staticmethod
    def from_json(d: dict[str, Any], where: str = "manifest") -> Manifest:
        if d.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"{where}: not a skewlens manifest (format={d.get('format')!r})")
        if d.get("version") != MANIFEST_VERSION:
            raise ManifestError(
                f"{where}: manifest version {d.get('version')!r} is not supported (this skewlens reads "
                f"version {MANIFEST_VERSION})"
            )
        try:
            return Manifest(
                world_size=int(d["world_size"]),
                ranks=tuple(int(r) for r in d["ranks"]),
                missing_ranks=tuple(int(r) for r in d.get("missing_ranks", ())),
                process_groups=tuple(
                    ProcessGroupInfo(
                        name=str(g["name"]),
                        ranks=tuple(int(r) for r in g["ranks"]),
                        desc=str(g.get("desc", "")),
                        backend=str(g.get("backend", "")),
                    )
                    for g in d.get("process_groups", ())
                ),
                backend=str(d.get("backend", "")),
                level=str(d.get("level", "collectives")),
                source=str(d.get("source", "capture")),
                devices={int(k): str(v) for k, v in d.get("devices", {}).items()},
                hosts={int(k): str(v) for k, v in d.get("hosts", {}).items()},
                clock_offsets_ns={int(k): int(v) for k, v in d.get("clock_offsets_ns", {}).items()},
                step_window=StepWindow(**d.get("step_window", {})),
                steps=tuple(StepSpan(**s) for s in d.get("steps", ())),
                torch_version=str(d.get("torch_version", "")),
                skewlens_version=str(d.get("skewlens_version", "")),
                command=tuple(str(c) for c in d.get("command", ())),
                notes={str(k): str(v) for k, v in d.get("notes", {}).items()},
                lost_collectives=tuple(
                    LostCollectives(
                        pg_name=str(x["pg_name"]),
                        first_seq=int(x["first_seq"]),
                        last_seq=int(x["last_seq"]),
                        steps=tuple(int(t) for t in x["steps"]),
                        ranks=tuple(int(r) for r in x.get("ranks", ())),
                    )
                    for x in d.get("lost_collectives", ())
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None


def write_manifest(run_dir: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temp file + rename)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(d / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=2) + "\n")


def read_manifest(run_dir: str | Path) -> Manifest:
    """Read and version-check ``RUN_DIR/manifest.json``."""
    path = Path(run_dir) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (is {run_dir} a skewlens run directory?)") from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(d, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    return Manifest.from_json(d, str(path))
