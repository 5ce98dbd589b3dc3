"""Run a command under capture and merge the ranks' part files into ``manifest.json``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from skewlens.paths import doc
from skewlens.profiler.bounded import (
    JSON_GZIP_FLOOR_BYTES,
    JSON_GZIP_RATIO,
    parse_json_bounded,
    read_bytes_bounded,
)
from skewlens.profiler.capture.autostart import (
    ENV_CLOCK_TIMEOUT,
    ENV_DIR,
    ENV_HOST_TRACE,
    ENV_KEEP_RAW,
    ENV_LEVEL,
    ENV_PROFILE,
    ENV_STEPS,
)
from skewlens.profiler.capture.flight import FR_BUFFER_DEFAULT, FR_BUFFER_ENV, NCCL_TIMING_ENV
from skewlens.profiler.capture.schedule import MAX_WINDOW_STEPS, format_window
from skewlens.profiler.capture.session import PART_FILE, part_file
from skewlens.profiler.errors import CaptureError, ManifestError
from skewlens.profiler.manifest import (
    EARLIER_ATTEMPT_NOTE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_WORLD_SIZE,
    OTHER_HOST_NOTE,
    PARTIAL_TRACE_NOTE,
    PARTS_DIR,
    REPLACED_NOTE,
    LostCollectives,
    Manifest,
    ProcessGroupInfo,
    RunIdentity,
    StepSpan,
    StepWindow,
    rank_file,
    rank_note_key,
    rank_stop,
    read_manifest,
    write_manifest,
)
from skewlens.profiler.store.issues import counted, ranks_label
from skewlens.profiler.vocab import HostTrace, Level

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
#: The manifest note of a run whose hosts gave ``skewlens profile`` different ``--level`` / ``--steps``.
OPTIONS_NOTE = "skewlens options"
#: The other way a rank leaves nothing in the run directory, said after "crashed or was killed": a save
#: that failed (a full disk, an unwritable directory) where the part file that says why failed too.
SAVE_UNSAID = (
    "or its save failed and so did the part file that says why (its stderr then says 'trace not saved')"
)


#: The prefix of the file :func:`prepare_run_dir` proves a run directory writable with (removed at once).
PROBE_PREFIX = ".probe."


def prepare_run_dir(run_dir: Path) -> bool:
    """Create ``run_dir`` (or accept an empty one), prove it is writable and make its ``.parts/``, the sign
    that a capture is under way there; returns True if created here.

    Another host's probe file and empty ``.parts/`` count as nothing: the hosts of a job start at once into
    one shared directory, and one that listed it while the other's probe was there was refused ("directory
    is not empty"), leaving the other host's ranks waiting for it until the rendezvous timed out. The
    ``.parts/`` made here lets a command that reads the run before any rank saved say that a capture is
    writing it (it said ``no manifest.json and no Chakra traces ... (is this a run directory?)`` for as
    long as the command ran up to its window's end)."""
    created = not run_dir.exists()
    if run_dir.exists() and not run_dir.is_dir():
        raise CaptureError(f"--out {run_dir}: exists and is not a directory")
    if run_dir.is_dir() and not all(map(_nothing_yet, run_dir.iterdir())):
        raise CaptureError(f"--out {run_dir}: directory is not empty (choose a new run directory)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=PROBE_PREFIX):
            pass
        (run_dir / PARTS_DIR).mkdir(exist_ok=True)
    except OSError as e:
        raise CaptureError(f"--out {run_dir}: not writable ({e.strerror or e})") from None
    return created


def _nothing_yet(entry: Path) -> bool:
    """Whether a run directory's ``entry`` is what another host's ``skewlens profile`` starting into it
    leaves before any rank saved: its probe file, or the empty ``.parts/``."""
    if entry.name.startswith(PROBE_PREFIX):
        return True
    try:
        return entry.name == PARTS_DIR and entry.is_dir() and not any(entry.iterdir())
    except OSError:
        return False


def leave_run_dir(run_dir: Path) -> None:
    """Remove the ``.parts/`` of ``run_dir`` if it is empty (a capture that ends leaves no sign of one under
    way; a rank of another host still capturing makes it again when it saves)."""
    with contextlib.suppress(OSError):
        (run_dir / PARTS_DIR).rmdir()


def capture_env(
    run_dir: Path,
    level: Level,
    window: StepWindow,
    *,
    keep_raw: bool,
    clock_timeout_s: float,
    host_trace: HostTrace = HostTrace.PROFILER,
) -> dict[str, str]:
    """The environment that makes every Python process of the command capture into ``run_dir``."""
    env = dict(os.environ)
    # only the bootstrap folder: skewlens itself is imported from the installed package (putting the
    # project root on the path would shadow the user's own ``tests`` / ``examples`` packages)
    path = [str(BOOTSTRAP_DIR)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV_DIR] = str(run_dir.resolve())
    env[ENV_LEVEL] = level.value
    env[ENV_STEPS] = format_window(window)
    env[ENV_KEEP_RAW] = "1" if keep_raw else "0"
    env[ENV_CLOCK_TIMEOUT] = str(clock_timeout_s)
    env[ENV_HOST_TRACE] = host_trace.value
    env[ENV_PROFILE] = uuid.uuid4().hex  # which part files this command's ranks wrote (see _not_one_capture)
    # the flight recorder sees the collectives the Python hooks cannot (functional ones, C++-issued)
    env.setdefault(FR_BUFFER_ENV, str(FR_BUFFER_DEFAULT))
    # ... and on NCCL times each collective on the device (read when a process group is created)
    env.setdefault(NCCL_TIMING_ENV, "1")
    return env


#: How long an interrupted ``skewlens profile`` waits for its command to end (its ranks saving their traces).
INTERRUPT_GRACE_S = 30.0
#: The same when stopped with SIGTERM (``timeout``, ``scancel``, a Kubernetes stop): within the 30 s after
#: which SLURM and Kubernetes send SIGKILL, so that the manifest is still written.
TERM_GRACE_S = 20.0
#: A second SIGTERM within this long of the first is the same stop: coreutils ``timeout`` signals its
#: command, then its own process group, which ``skewlens profile`` is in (two signals, microseconds apart).
TERM_REPEAT_S = 2.0


class _Terminated(Exception):
    """``skewlens profile`` received SIGTERM while its command ran."""


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise _Terminated


#: What :func:`run_command` adds to its ``stops`` when it was interrupted (Ctrl-C) or stopped (SIGTERM).
INTERRUPTED, TERMINATED = "Ctrl-C", "SIGTERM"


def run_command(
    command: Sequence[str],
    env: dict[str, str],
    *,
    stops: list[str] | None = None,
    run_dir: Path | None = None,
) -> int:
    """Run the wrapped command to completion; its exit code (negative: killed by that signal). Interrupted
    (Ctrl-C) or stopped (SIGTERM), it passes the signal on once, lets the command end and returns its code,
    so that the run is finalised with what the ranks saved; a second Ctrl-C, or a command still running
    after the grace period, is killed, and its code returned too. Each such stop is added to ``stops``
    (:data:`INTERRUPTED`, :data:`TERMINATED`), so that the caller can say the run was cut short.

    The command runs in a process group of its own, so that a signal to ours (the terminal's Ctrl-C,
    ``timeout``) reaches it once, from here: torchrun, signalled twice, stops waiting for its workers to
    save their traces and exits, and the run would be finalised without them. On Linux it is told to stop
    (SIGTERM) if this process dies first. ``run_dir``: where the ranks save, read when the command is killed
    to say which of them had saved their traces by then."""
    if not command:
        raise CaptureError("no command given: skewlens profile --out RUN_DIR -- COMMAND ...")
    exe = command[0]
    if os.sep not in exe and shutil.which(exe, path=env.get("PATH")) is None:
        raise CaptureError(f"command not found: {exe!r}")
    try:
        proc = subprocess.Popen(list(command), env=env, process_group=0, preexec_fn=stop_with_parent)  # noqa: PLW1509 (one prctl call)
    except OSError as e:
        raise CaptureError(f"cannot run {exe!r}: {e.strerror or e}") from None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        return _wait(proc, [] if stops is None else stops, run_dir)
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def stop_with_parent() -> None:
    """In a child process, before it starts: SIGTERM when its parent (``skewlens profile``, the demo) dies
    (Linux)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to the command's process group (its own processes but torchrun's workers, which torchrun
    signals itself, as a terminal would)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command and everything under it. A rank whose main thread is blocked in C++ (a hung
    collective) never runs the capture's SIGTERM handler, so the signal that would have ended it is held
    until the call returns (gloo's timeout: 30 min); killed with torchrun alone, it would run on, orphaned."""
    import psutil

    try:  # torchrun's workers run in sessions of their own, out of reach of a signal to its process group
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    _signal(proc, signal.SIGKILL)
    for p in below:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()


def _wait(proc: subprocess.Popen[bytes], stops: list[str], run_dir: Path | None = None) -> int:
    try:
        return proc.wait()
    except _Terminated:
        stops.append(TERMINATED)
        # stopped (timeout, scancel, a Kubernetes stop): the ranks save what they traced on SIGTERM
        # (torchrun passes it on); a command that does not end within TERM_GRACE_S is killed, and the run
        # is finalised with what was saved. A second SIGTERM, later than TERM_REPEAT_S, kills the command
        # and everything under it at once (dying here instead left the ranks running, orphaned).
        first = time.monotonic()

        def again(_signum: int, _frame: object) -> None:
            if time.monotonic() - first >= TERM_REPEAT_S:
                raise _Terminated

        signal.signal(signal.SIGTERM, again)
        _signal(proc, signal.SIGTERM)
        try:
            return proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            _say_killed(TERM_GRACE_S, "SIGTERM", run_dir)
            _kill(proc)
            return proc.wait()
        except _Terminated:
            _kill(proc)
            return proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C: its ranks save what they traced as they exit, and the run is finalised with what they
        # saved. A second Ctrl-C, or a command that does not end within INTERRUPT_GRACE_S, is killed (and
        # the run finalised with what was saved by then).
        stops.append(INTERRUPTED)
        _signal(proc, signal.SIGINT)
        try:
            return proc.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            _say_killed(INTERRUPT_GRACE_S, "Ctrl-C", run_dir)
            _kill(proc)
            return proc.wait()
        except KeyboardInterrupt:
            _kill(proc)
            return proc.wait()


def _say_killed(grace_s: float, signal_name: str, run_dir: Path | None = None) -> None:
    """Say that the command was killed, and why a rank may not end: blocked in a collective, where some
    rank's trace is missing; where every rank had saved its trace, something after its capture (its exit)."""
    saved: list[int] = []
    world = 0
    if run_dir is not None:
        with contextlib.suppress(Exception):  # the message must be printed regardless
            parts = read_parts(run_dir)
            saved = sorted(_saved_parts(run_dir, parts))
            world = max((int(p.get("world_size", 0)) for p in parts.values()), default=0)
    killed = (
        f"skewlens profile: the command did not end within {grace_s:.0f} s of {signal_name}: killed it and "
    )
    if saved and saved == list(range(world)):
        # a program that hangs in its own teardown (a process group's threads at exit) after every rank saved
        why = (
            f"everything under it. Every rank had saved its trace ({ranks_label(saved)}, kept): what did not "
            "end came after its capture (the program's own exit or teardown)"
        )
    else:
        had = f" ({ranks_label(saved)}: saved, kept)" if saved else ""
        why = (
            "everything under it. A rank blocked in a collective (a peer frozen, gone, or waiting in another "
            f"collective) cannot save its trace{had}; init_process_group(timeout=...) bounds that wait "
            f"({doc('docs/capture.md')}, Across hosts)"
        )
    print(killed + why, file=sys.stderr)


#: The manifest's note on a rank whose save failed (a full disk, a quota), before the reason its part
#: file gives (``not_saved``): the training went on without its trace.
NOT_SAVED_NOTE = "trace not saved"


def unsaved_traces(run_dir: Path) -> dict[int, str]:
    """The ranks whose save failed -> why (their part files' ``not_saved``), but for those an earlier attempt
    of the command wrote (:func:`earlier_unsaved`)."""
    found = read_parts(run_dir)
    stale = earlier_unsaved(found, _saved_parts(run_dir, found))
    return {r: str(p["not_saved"]) for r, p in found.items() if "not_saved" in p and r not in stale}


def _saved_parts(run_dir: Path, found: dict[int, dict]) -> dict[int, dict]:
    """The part files of ranks that saved a trace (its file is there, no ``not_saved``)."""
    return {r: p for r, p in found.items() if rank_file(run_dir, r).is_file() and "not_saved" not in p}


def part_gpus(parts: Mapping[int, dict]) -> dict[int, str]:
    """Each rank's GPU as its part file says it (the manifest's ``gpus``); ranks on no GPU, or whose device
    could not say, are absent."""
    return {r: str(p["gpu"]) for r, p in sorted(parts.items()) if p.get("gpu")}


def read_parts(run_dir: Path) -> dict[int, dict]:
    parts: dict[int, dict] = {}
    d = run_dir / PARTS_DIR
    if not d.is_dir():
        return parts
    for p in sorted(d.glob(PART_FILE.format(rank="*"))):
        try:  # bounded, and never a FIFO's open (which waited for a writer: a merge hung)
            text = read_bytes_bounded(
                p,
                MAX_MANIFEST_BYTES,
                error=CaptureError,
                what="part file",
                gzip_ratio=JSON_GZIP_RATIO,  # a 1 MB gzip was 1 GiB of JSON, as a manifest's was
                gzip_floor=JSON_GZIP_FLOOR_BYTES,
            )
            data = parse_json_bounded(
                text, MAX_MANIFEST_BYTES, source=str(p), error=CaptureError, what="part file"
            )
        except CaptureError as e:
            said = str(e).removeprefix(f"{p}: ")
            _ignoring(f"unreadable part file {p}: {said}")
            continue
        if (why := part_problem(data)) is not None:  # one host's files, merged by another: untrusted
            _ignoring(f"malformed part file {p}: {why}")
            continue
        parts[data["rank"]] = data
    return parts


def _ignoring(what: str) -> None:
    """``skewlens: ignoring WHAT`` on stderr, its control characters shown as U+FFFD (a part file's path or
    text is another host's: an ESC in it drove the terminal)."""
    from skewlens.console import printable  # here: a training rank that reads good part files loads no rich

    print(f"skewlens: ignoring {printable(what)}", file=sys.stderr)


def _is_int(v: object, lo: int = -(1 << 62), hi: int = 1 << 62) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def part_problem(data: object) -> str | None:
    """What is wrong with a rank's part file (the fields the merge reads, each of its type and range), or
    None. A value of another type was a traceback in ``skewlens merge``, a world size of 10**12 a loop
    over that many ranks."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if not _is_int(data.get("rank"), 0, MAX_WORLD_SIZE - 1):
        return f"rank: expected 0..{MAX_WORLD_SIZE - 1}"
    for key, lo, hi in (("world_size", 1, MAX_WORLD_SIZE), ("local_world_size", 1, MAX_WORLD_SIZE)):
        if key in data and not _is_int(data[key], lo, hi):
            return f"{key}: expected {lo}..{hi}"
    for key in ("clock_offset_ns", "flight_recorder"):
        if key in data and not _is_int(data[key]):
            return f"{key}: expected an integer"
    for key, kind in (("notes", dict), ("steps", list), ("process_groups", list), ("lost_collectives", list)):
        if key in data and not isinstance(data[key], kind):
            return f"{key}: expected a JSON {'object' if kind is dict else 'list'}"
    for s in data.get("steps", []):
        if (
            not isinstance(s, dict)
            or set(s) != {"step", "start_ns", "end_ns"}
            or not all(map(_is_int, s.values()))
        ):
            return f"steps: expected {{step, start_ns, end_ns}} integers, got {s!r:.80}"
    for g in data.get("process_groups", []):
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if (
            not isinstance(ranks, list)
            or "name" not in g
            or not all(_is_int(x, 0, MAX_WORLD_SIZE - 1) for x in ranks)
        ):
            return f"process_groups: expected {{name, ranks: [0..{MAX_WORLD_SIZE - 1}]}}, got {g!r:.80}"
    for x in data.get("lost_collectives", []):
        ok = (
            isinstance(x, dict)
            and "pg_name" in x
            and all(_is_int(x.get(k)) for k in ("first_seq", "last_seq"))
        )
        if not ok or not isinstance(x.get("steps"), list) or not all(map(_is_int, x["steps"])):
            return f"lost_collectives: expected {{pg_name, first_seq, last_seq, steps}}, got {x!r:.80}"
    window = data.get("window")
    if window is not None and (
        not isinstance(window, dict)
        or not set(window) <= {"wait", "warmup", "active"}
        or not all(_is_int(v, 0, MAX_WINDOW_STEPS) for v in window.values())
    ):
        return f"window: expected {{wait, warmup, active}} integers, got {window!r:.80}"
    if "not_saved" in data and not isinstance(data["not_saved"], str):
        return "not_saved: expected a string"
    if "stopped" in data:
        try:
            rank_stop(data["stopped"], "part file", "stopped", MAX_WORLD_SIZE)
        except ManifestError as e:
            return str(e).removeprefix("part file: ")
    run_id = data.get("run_identity")
    if run_id is not None and (
        not isinstance(run_id, dict)
        or not _is_int(run_id.get("started_ns", 0))
        or not _is_int(run_id.get("restart_count", 0), 0)
    ):
        return "run_identity: expected an object with an integer started_ns and restart_count"
    return None


def _ranks_of_hosts(parts: dict[int, dict], world: int) -> dict[str, int]:
    """Host name -> its ranks (torchrun's local world size), of the hosts whose ranks saved ``parts``. The
    job's hosts may differ in size (1 rank on one, 2 on another): one host's count is not another's."""
    out: dict[str, int] = {}
    for p in parts.values():
        host = str(p.get("host", ""))
        out[host] = max(out.get(host, 0), int(p.get("local_world_size", world)))
    return out


def _partial_note(part: dict, window: StepWindow, *, clean: bool) -> str:
    """The note of a rank that saved a partial trace at exit: how many of the window's steps it saved, then
    (after ``; ``, which the reports put inside their "the command ended before the capture window did")
    how many steps the rank marked and how, beside the window's steps. Before, the line blamed the command's
    end alone, where a GradScaler-like loop whose skipped ``optimizer.step()`` marks no step had marked 6
    steps for a window of 2-6 and ran every iteration it meant to. ``clean``: the command exited 0 (what
    else ended it, a crash, a kill, an exception, is the likelier reason, and no skipped step is said)."""
    w = part.get("window")
    win = StepWindow(**w) if isinstance(w, dict) else window
    head = f"{PARTIAL_TRACE_NOTE}: saved {len(part.get('steps', []))} of {win.active} steps at exit"
    stop = part.get("stopped")
    if not isinstance(stop, dict) or not isinstance(marked := stop.get("step"), int) or marked < 1:
        return head  # a part written before skewlens recorded where it stopped
    first, last = win.wait + win.warmup, win.wait + win.warmup + win.active - 1
    steps = f"{counted(marked, 'step')}, {'0' if marked == 1 else f'0-{marked - 1}'},"
    window_steps = f"steps are {first}-{last}" if last > first else f"step is {first}"
    if part.get("step_marks") == "program":
        return f"{head}; the rank marked {steps} with cap.step(), and the window's {window_steps}"
    said = f"{head}; the rank marked {steps} one at each optimizer.step(), and the window's {window_steps}"
    if not clean or stop.get("raised"):
        return said
    return f"{said}; an iteration whose optimizer.step() did not run, a GradScaler's skip, marks no step"


def _what_ran_here(ran_here: dict[str, int], world: int) -> str:
    """``this directory's host ran 1 rank of its 3``: what the hosts that saved here ran of the job's
    ranks, each host by its own count (hosts may differ in size)."""
    hosts = "host" if len(ran_here) == 1 else f"{len(ran_here):,} hosts"
    return f"this directory's {hosts} ran {counted(sum(ran_here.values()), 'rank')} of its {world:,}"


def finalize_run(
    run_dir: Path,
    *,
    level: Level,
    window: StepWindow,
    command: Sequence[str] = (),
    exit_code: int = 0,
    world_size: int | None = None,
    keep_parts: bool = False,
    profile: str = "",
) -> Manifest | None:
    """Merge the part files into ``manifest.json``; None (and nothing written) when no rank saved a trace,
    or when ``manifest.json`` already holds every rank found (another host of the job merged them).
    ``profile`` is the token of the ``skewlens profile`` merging (its command's ``ENV_PROFILE``), so that
    part files another one's ranks wrote into the same directory are told apart (:func:`_not_one_capture`);
    ``skewlens merge`` gives none (it compares the hosts' run identities itself, and ``--force`` merges
    them anyway).

    Across hosts every host's ``skewlens profile`` merges into the same run directory when its command
    ends. The part files stay until a merge has every rank, so that a host finishing after another (its
    ranks saved later) merges them all; a manifest is never replaced by one with fewer ranks: the hosts
    merge one at a time (:func:`merge_lock`), each reading the parts and the manifest afresh."""
    with merge_lock(run_dir):
        return _merge(
            run_dir,
            level=level,
            window=window,
            command=command,
            exit_code=exit_code,
            world_size=world_size,
            keep_parts=keep_parts,
            profile=profile,
        )


#: The lock file of a run directory's merge (:func:`merge_lock`), and how long a host waits for one that does
#: not change before taking its holder to have died while merging (a merge takes well under a second).
MERGE_LOCK = ".merge.lock"
MERGE_LOCK_STALE_S = 60.0


@contextlib.contextmanager
def merge_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s merge lock: a file created with ``O_CREAT | O_EXCL`` (atomic on local file
    systems and NFSv3+), so that two hosts finishing at once do not both read the manifest and the later
    one replace the other's fuller one. A lock this host has seen unchanged for :data:`MERGE_LOCK_STALE_S`
    on its own monotonic clock is broken: not one whose modification time is that long ago, which compares
    the file server's clock with this host's (a host whose clock was 70 s ahead broke the lock another
    host had just taken, and merged at once beside it; one behind waited its offset besides)."""
    path = run_dir / MERGE_LOCK
    seen: tuple[int, int] | None = None  # the lock found held (inode, mtime), and since when on this host
    since = 0.0
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                if (held := (st.st_ino, st.st_mtime_ns)) != seen:
                    seen, since = held, time.monotonic()
                elif time.monotonic() - since > MERGE_LOCK_STALE_S:
                    path.unlink(missing_ok=True)
                    continue
            time.sleep(0.05)
        except OSError as e:
            raise CaptureError(
                f"{run_dir}: cannot create the merge lock {path.name}: {e.strerror or e}"
            ) from None
    try:
        os.write(fd, f"{os.uname().nodename} {os.getpid()}\n".encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)


def _merge(
    run_dir: Path,
    *,
    level: Level,
    window: StepWindow,
    command: Sequence[str],
    exit_code: int,
    world_size: int | None,
    keep_parts: bool,
    profile: str,
) -> Manifest | None:
    found = read_parts(run_dir)
    parts = _saved_parts(run_dir, found)
    earlier, unsaved_before = earlier_attempt(parts), earlier_unsaved(found, parts)
    parts_before, parts = parts, {r: p for r, p in parts.items() if r not in earlier}
    if not parts:
        return None
    if profile and (why := _one_profile_per_rank(parts, profile)) is not None:
        raise CaptureError(f"{run_dir}: {why}")
    if profile and (why := _not_one_capture(parts, profile)) is not None:
        raise CaptureError(
            f"{run_dir}: {why}: two skewlens profile commands captured into this --out at once, and each "
            "rank's files are those of the last to save; no manifest.json was written. Capture again, each "
            "into a directory of its own"
        )
    existing = existing_manifest(run_dir)
    first = parts[min(parts)]
    world = world_size or int(first.get("world_size", len(parts)))
    notes: dict[str, str] = {}
    missing = tuple(r for r in range(world) if r not in parts)
    why = f"the command exited with code {exit_code}" if exit_code else "the command exited"
    ran_here = _ranks_of_hosts(parts, world)
    for r in missing:
        if r in earlier:  # its trace is an attempt's that torchrun restarted; this attempt's, if any, is lost
            notes[rank_note_key(r)] = (
                "no trace from the command's last attempt: the process crashed or was killed before saving "
                f"({why}), {SAVE_UNSAID}; {rank_file(run_dir, r).name} is an earlier attempt's "
                f"({earlier[r]}) and is left out of the run"
            )
        elif r in unsaved_before:  # an earlier attempt's save failed; this attempt's rank left nothing
            notes[rank_note_key(r)] = (
                "no trace from the command's last attempt: the process crashed or was killed before saving "
                f"({why}), {SAVE_UNSAID}; its part file is an earlier attempt's ({unsaved_before[r]}), "
                f"whose save failed: {found[r]['not_saved']}"
            )
        elif (not_saved := found.get(r, {}).get("not_saved")) is not None:  # its save failed; it said why
            notes[rank_note_key(r)] = f"{NOT_SAVED_NOTE}: {not_saved}"
        elif rank_file(run_dir, r).is_file():  # its save was cut short between the trace and the part file
            notes[rank_note_key(r)] = (
                f"trace incomplete: the process crashed or was killed while saving it ({why}); "
                f"{rank_file(run_dir, r).name} is left out of the run"
            )
        elif sum(ran_here.values()) < world:  # its host may have saved it into a RUN_DIR of its own
            notes[rank_note_key(r)] = (
                f"{OTHER_HOST_NOTE} ({_what_ran_here(ran_here, world)}) and the rank's host saved "
                "none in this directory: RUN_DIR must be on storage every host sees, or the hosts' "
                f"directories combined with skewlens merge ({doc('docs/capture.md')}, Across hosts); else "
                f"the process crashed or was killed before saving ({why})"
            )
        else:
            notes[rank_note_key(r)] = (
                f"no trace: the process crashed or was killed before saving ({why}), {SAVE_UNSAID}"
            )
    if beyond := sorted(r for r in earlier if r >= world):  # the world the restarted command ran in shrank
        files = ", ".join(rank_file(run_dir, r).name for r in beyond[:4]) + ", ..." * (len(beyond) > 4)
        notes[EARLIER_ATTEMPT_NOTE] = (
            f"{ranks_label(beyond)}: left out of the run ({files}): an earlier attempt's, of "
            f"{int(parts_before[beyond[0]].get('world_size', 0))} ranks ({earlier[beyond[0]]}); the last "
            f"attempt ran on {counted(world, 'rank')}"
        )
    steps: list[StepSpan] = []
    for r, p in sorted(parts.items()):
        notes.update({str(k): str(v) for k, v in p.get("notes", {}).items()})
        if p.get("partial"):
            notes[rank_note_key(r)] = _partial_note(p, window, clean=exit_code == 0)
        steps.extend(StepSpan(rank=r, **s) for s in p.get("steps", []))
    from skewlens import __version__

    by_name: dict[str, ProcessGroupInfo] = {}
    for _r, p in sorted(parts.items()):  # a rank knows only the groups it belongs to: take the union
        for g in p.get("process_groups", []):
            by_name.setdefault(
                str(g["name"]),
                ProcessGroupInfo(
                    name=str(g["name"]),
                    ranks=tuple(int(x) for x in g["ranks"]),
                    desc=str(g.get("desc", "")),
                    backend=str(g.get("backend", "")),
                ),
            )
    groups = tuple(by_name.values())
    options: dict[str, list[int]] = {}  # across hosts each host gave its own skewlens profile options
    for r, p in sorted(parts.items()):
        w = p.get("window")
        steps_of = format_window(StepWindow(**w)) if isinstance(w, dict) else format_window(window)
        options.setdefault(f"--level {p.get('level', level.value)} --steps {steps_of}", []).append(r)
    if len(options) > 1:
        notes[OPTIONS_NOTE] = (
            "error: the ranks were captured with different skewlens profile options ("
            + "; ".join(f"{o} on ranks {rs}" for o, rs in options.items())
            + "): their steps and collectives do not line up; run the same skewlens profile command on "
            "every host"
        )
    sizes = {int(p.get("flight_recorder", 0)) for p in parts.values()}
    if len(sizes) > 1:
        notes["flight recorder"] = (
            f"error: the ranks ran with different {FR_BUFFER_ENV} ({', '.join(map(str, sorted(sizes)))}): "
            "collectives of ranks without the recorder are numbered by the hooks and may not match"
        )
    ident = _run_identity(parts)
    if profile and existing is not None and (other := _another_jobs(existing, ident)) is not None:
        notes[REPLACED_NOTE] = (
            f"this manifest replaced that of another job ({other}), captured into this directory at the "
            "same time: its ranks' traces were replaced by this job's, and its capture is lost"
        )
    manifest = Manifest(
        world_size=world,
        ranks=tuple(sorted(parts)),
        missing_ranks=missing,
        process_groups=groups,
        backend=str(first.get("backend", "")),
        level=level.value,
        source="capture",
        devices={r: str(p.get("device", "")) for r, p in parts.items()},
        gpus=part_gpus(parts),
        hosts={r: str(p.get("host", "")) for r, p in parts.items()},
        clock_offsets_ns={r: int(p.get("clock_offset_ns", 0)) for r, p in parts.items()},
        step_window=window,
        steps=tuple(steps),
        torch_version=str(first.get("torch_version", "")),
        skewlens_version=__version__,
        command=tuple(command),
        notes=notes,
        lost_collectives=merge_losses(parts),
        run_identity=ident,
        stopped=tuple(
            rank_stop({**p["stopped"], "rank": r}, str(part_file(run_dir, r)), "stopped", world)
            for r, p in sorted(parts.items())
            if "stopped" in p
        ),
    )
    if (
        existing is not None
        and REPLACED_NOTE not in notes
        and set(manifest.ranks) <= set(existing.ranks)
        and not saved_again(existing, manifest)  # an earlier attempt's: replaced
    ):
        return None
    write_manifest(run_dir, manifest)
    if not keep_parts:
        if missing:  # a host that finishes later merges again: keep the part files, not the raw traces
            for d in (run_dir / PARTS_DIR).glob("raw-*"):
                shutil.rmtree(d, ignore_errors=True)
        else:
            shutil.rmtree(run_dir / PARTS_DIR, ignore_errors=True)
    return manifest


def _not_one_capture(parts: dict[int, dict], profile: str) -> str | None:
    """Why the saved part files of a run directory (``parts``, an earlier attempt's left out) are not one
    capture's, or None: ranks of two torchrun jobs (by run id: the rendezvous, which ``skewlens merge``
    compares too, may move when torchrun restarts the ranks), or ranks of a job on one host that another
    ``skewlens profile`` than ``profile`` started (the other host of a multi-host job is the only other one
    that may save here). Two profiles into one ``--out`` both ran (each saw it empty when it began) and
    merged whatever part files were there: a manifest of one job's command over the other's traces, or of
    rank 0 of one and rank 1 of the other, both exiting 0. Part files of an older skewlens or of a capture
    outside ``skewlens profile`` (without these fields) are not compared."""
    jobs: dict[str, list[int]] = {}  # run id -> its ranks
    said: dict[str, str] = {}  # run id -> run id and rendezvous, as the first of its ranks gave them
    for r, p in sorted(parts.items()):
        if (job := _part_identity(p)) is not None and job.run_id:
            jobs.setdefault(job.run_id, []).append(r)
            said.setdefault(job.run_id, job.key())
    if len(jobs) > 1:
        return "its ranks' traces are of " + "; ".join(
            f"{ranks_label(rs)}: {said[j]}" for j, rs in jobs.items()
        )
    theirs = sorted(
        r
        for r, p in parts.items()
        if p.get("profile") not in (None, "", profile)  # '': a capture outside skewlens profile
        and p.get("local_world_size", 0) == p.get("world_size")
    )
    if not theirs:
        return None
    host = parts[theirs[0]].get("host", "?")
    return (
        f"{ranks_label(theirs)} of a job on one host ({host}) saved by another skewlens profile's command, "
        f"not this one's{''.join(f' ({k})' for k in said.values())}"
    )


def _one_profile_per_rank(parts: dict[int, dict], profile: str) -> str | None:
    """Why ``parts`` are refused where the ranks of one job that torchrun did not start (no run id, one
    rendezvous ``MASTER_ADDR:MASTER_PORT``) were saved by several ``skewlens profile`` commands on one host,
    this one (``profile``) among them: one profile per rank, as ``srun -n N skewlens profile --out RUN --
    python train.py`` starts them. Each merges when its own command ends, and cannot tell the others' ranks
    from another capture's; before, each said so in those words (``two skewlens profile commands captured
    into this --out at once``), naming neither the job nor what to run instead. None otherwise."""
    idents = [_part_identity(p) for p in parts.values()]
    jobs = {(i.run_id, i.rendezvous) for i in idents if i is not None}
    if len(jobs) != 1 or None in idents:
        return None
    ((run_id, rendezvous),) = jobs
    if run_id or not rendezvous:
        return None
    theirs = sorted(r for r, p in parts.items() if p.get("profile") not in (None, "", profile))
    mine = [r for r, p in parts.items() if p.get("profile") == profile]
    hosts = {str(p.get("host", "")) for p in parts.values()}
    if not theirs or not mine or len(hosts) != 1:
        return None
    return (
        f"{ranks_label(theirs)} of this job (rendezvous {rendezvous}, on {hosts.pop()}) saved by other "
        f"skewlens profile commands than this one's ({ranks_label(sorted(mine))}): one skewlens profile per "
        "rank (srun ... skewlens profile) cannot share an --out, and no manifest.json was written. Give each "
        "its own (--out RUN-$SLURM_PROCID) and join them with skewlens merge, or start every rank under one "
        f"(skewlens profile --out RUN -- srun ...): {doc('docs/capture.md')}, Ranks torchrun did not start"
    )


def _another_jobs(existing: Manifest, ident: RunIdentity | None) -> str | None:
    """``run id X at R: COMMAND`` where ``existing`` (the manifest in the run directory) is of another
    torchrun job than the part files' (``ident``), else None: a second ``skewlens profile`` into the same
    ``--out`` merged first, and this job's ranks then replaced its traces. This merge replaced its manifest
    with nothing said, and the other command's capture was lost unnoticed."""
    theirs = existing.run_identity
    if theirs is None or ident is None or theirs.run_id in ("", ident.run_id):  # rendezvous: see above
        return None
    return f"{theirs.key()}: {shlex.join(existing.command)}"


def earlier_attempt(parts: dict[int, dict]) -> dict[int, str]:
    """The ranks whose trace an earlier attempt of the command saved -> what says so: torchrun restarts the
    ranks of a job that failed (``--max-restarts``) or whose hosts came or went (``--nnodes 1:2``), and they
    save into the same run directory, so that a rank whose last attempt saved nothing (killed, or gone
    before its window) left the trace of the attempt before. Such a trace's steps all ended before another
    rank's capture began (the ranks of one attempt were all alive at once), and it was saved under another
    restart count or world size than the rank that began last: clocks alone would take a rank whose offset
    is wrong by more than the run (a clock not aligned) for an earlier attempt's."""
    if (at := _last_attempt(parts)) is None:
        return {}
    began, last = at
    out: dict[int, str] = {}
    for r, p in parts.items():
        ends = [int(s["end_ns"]) for s in p.get("steps", [])]
        if _other_attempt(p, last) and ends and max(ends) < began:
            out[r] = (
                "torchrun restarted the command: its steps ended "
                f"{(began - max(ends)) / 1e9:.1f} s before the last attempt's ranks began"
            )
    return out


def earlier_unsaved(found: dict[int, dict], parts: dict[int, dict]) -> dict[int, str]:
    """The ranks whose ``not_saved`` part file (``found``) an earlier attempt of the command wrote -> what
    says so: its capture began before the last of the ranks that saved a trace (``parts``) under another
    restart count or world size (as :func:`earlier_attempt`). A rank of the last attempt that was killed
    before saving leaves the part file of the attempt before: its reason is not this attempt's."""
    if (at := _last_attempt(parts)) is None:
        return {}
    began, last = at
    return {
        r: f"torchrun restarted the command: its capture began {(began - b) / 1e9:.1f} s before the last "
        "attempt's ranks began"
        for r, p in found.items()
        if "not_saved" in p and (b := _began(p)) is not None and b < began and _other_attempt(p, last)
    }


def _last_attempt(parts: dict[int, dict]) -> tuple[int, dict] | None:
    """When the last of the ranks' captures began (:func:`last_began`) and that rank's part file, or None."""
    began = last_began(parts)
    if began is None:
        return None
    return began, next(p for p in parts.values() if _began(p) == began)


def _other_attempt(part: dict, last: dict) -> bool:
    """Whether a part file was written under another restart count or world size than ``last``'s."""
    return _attempt(part) != _attempt(last) or part.get("world_size") != last.get("world_size")


def _began(part: dict) -> int | None:
    ident = part.get("run_identity")
    return int(ident.get("started_ns", 0)) if isinstance(ident, dict) else None


def _attempt(part: dict) -> object:
    ident = part.get("run_identity")
    return ident.get("restart_count") if isinstance(ident, dict) else None


def last_began(parts: dict[int, dict]) -> int | None:
    """When the last of the ranks' captures began (their part files' ``run_identity``), None where none
    says."""
    return max((b for p in parts.values() if (b := _began(p)) is not None), default=None)


def saved_again(existing: Manifest, manifest: Manifest) -> bool:
    """Whether a rank of ``manifest`` is in ``existing`` (a manifest another host of the job merged) with
    other steps, both recording some: it saved its trace again since, so that ``existing`` is an earlier
    attempt's, merged by a host that left before torchrun restarted the ranks, and is replaced. The steps
    are the part files' own, copied into each manifest as they are: one attempt's are the same in both,
    whatever the clocks and the world's size."""

    def spans(m: Manifest) -> dict[int, list[tuple[int, int, int]]]:
        out: dict[int, list[tuple[int, int, int]]] = {r: [] for r in m.ranks}
        for s in m.steps:
            out.setdefault(s.rank, []).append((s.step, s.start_ns, s.end_ns))
        return {r: sorted(v) for r, v in out.items()}

    old, new = spans(existing), spans(manifest)
    return any(old.get(r) and steps and old[r] != steps for r, steps in new.items())


def _run_identity(parts: dict[int, dict]) -> RunIdentity | None:
    """The job the ranks saved under (their part files' ``run_identity``; None where none recorded one:
    parts of an older skewlens), with the earliest rank's start."""
    ids = [i for _r, p in sorted(parts.items()) if (i := _part_identity(p)) is not None]
    if not ids:
        return None
    return RunIdentity(
        run_id=ids[0].run_id, rendezvous=ids[0].rendezvous, started_ns=min(i.started_ns for i in ids)
    )


def _part_identity(part: dict) -> RunIdentity | None:
    """A part file's ``run_identity`` (None where it records none: a part of an older skewlens)."""
    ident = part.get("run_identity")
    if not isinstance(ident, dict):
        return None
    return RunIdentity(
        run_id=str(ident.get("run_id", "")),
        rendezvous=str(ident.get("rendezvous", "")),
        started_ns=int(ident.get("started_ns", 0)),
    )


def existing_manifest(run_dir: Path) -> Manifest | None:
    """The run's ``manifest.json`` if one is there and readable (written by another host of the job)."""
    if not (run_dir / MANIFEST_NAME).is_file():
        return None
    try:
        return read_manifest(run_dir)
    except (ManifestError, OSError):
        return None


def merge_losses(parts: dict[int, dict]) -> tuple[LostCollectives, ...]:
    """The ranks' lost ranges (``lost_collectives`` of their part files) as one range per group, the
    same for every member: from the lowest first number to the highest last one (open-ended where one
    is), over the union of their steps."""
    by_pg: dict[str, list[tuple[int, dict]]] = {}
    for r, p in sorted(parts.items()):
        for x in p.get("lost_collectives", []):
            by_pg.setdefault(str(x["pg_name"]), []).append((r, x))
    out = []
    for pg, xs in sorted(by_pg.items()):
        lasts = [int(x["last_seq"]) for _, x in xs]
        out.append(
            LostCollectives(
                pg_name=pg,
                first_seq=min(int(x["first_seq"]) for _, x in xs),
                last_seq=-1 if min(lasts) < 0 else max(lasts),
                steps=tuple(sorted({int(t) for _, x in xs for t in x["steps"]})),
                ranks=tuple(sorted({r for r, _ in xs})),
            )
        )
    return tuple(out)


def part_exists(run_dir: Path, rank: int) -> bool:
    return part_file(run_dir, rank).is_file()
