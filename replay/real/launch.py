"""Starting the replay workers through torchrun and supervising them (parent side, no torch import).

The launcher (``python -m torch.distributed.run ... -m skewlens.replay.real.worker``) runs in its own session.
torchrun starts each worker in a session of its own too, so the supervisor tracks the whole process tree
(with psutil) while it runs and, on any error, timeout or Ctrl-C, terminates every process it has seen,
then kills what is left after a bounded wait; killed with SIGKILL, it stops nothing, and each worker's
watchdog exits once it is gone (``SUPERVISOR_ENV``). Workers report errors through ``rank-<r>.error.json``
files; the first one to appear is the error raised here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from skewlens.profiler.atomic import chmod_as_made
from skewlens.profiler.errors import address_space_limit
from skewlens.profiler.store.issues import ranks_label
from skewlens.profiler.vocab import CommType
from skewlens.replay.errors import ReplayError, ReplayTimeoutError
from skewlens.replay.execution import waits_for
from skewlens.replay.real.plan import (
    ERROR_FILE,
    PROGRESS_FILE,
    RESULT_FILE,
    SUPERVISOR_ENV,
    WorkerPhase,
    issued_root,
)

WORKER_MODULE = "skewlens.replay.real.worker"
LAUNCHER_LOG = "launcher.log"
#: torchrun's ``--log-dir`` under the work directory (its per-worker error files land there).
TORCHRUN_LOGS = "torchrun"
#: How long processes get to exit after SIGTERM before SIGKILL, and to vanish after SIGKILL.
TERM_GRACE_S = 3.0
#: How long to keep collecting error files after the first one appeared (peers report their view).
ERROR_SETTLE_S = 0.5
POLL_S = 0.05


def launcher_command(
    plan_dir: Path, nproc: int, launcher_args: Sequence[str] | None, *, log_dir: Path | None = None
) -> list[str]:
    """torchrun command line: one host by default (``--standalone``), or the caller's rendezvous args.

    ``log_dir``: torchrun's ``--log-dir`` unless the caller's args give one; without it torchrun makes a
    ``torchelastic_*`` directory in the system's temporary directory at each launch and never removes it.
    """
    where = list(launcher_args) if launcher_args else ["--standalone", "--nnodes", "1"]
    if log_dir is not None and not any(a.split("=")[0] in ("--log-dir", "--log_dir") for a in where):
        where += ["--log-dir", str(log_dir)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "-m",
        WORKER_MODULE,
        "--plan",
        str(plan_dir),
    ]


def _read_errors(work_dir: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted(work_dir.glob(ERROR_FILE.format(rank="*"))):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


class ProcessTree:
    """Every process seen below the launcher, so that none is missed once the launcher itself is gone."""

    def __init__(self, root: subprocess.Popen[bytes]) -> None:
        self.root = root
        self.seen: dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        try:
            top = psutil.Process(self.root.pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            self.seen.setdefault(p.pid, p)

    def kill_all(self) -> None:
        """SIGTERM to the launcher's session and every process seen, SIGKILL after a bounded wait."""
        self.refresh()
        procs = [p for p in self.seen.values() if p.is_running()]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.root.pid, signal.SIGTERM)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _gone, alive = psutil.wait_procs(procs, timeout=TERM_GRACE_S)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=TERM_GRACE_S)
        try:
            self.root.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            self.root.kill()
            self.root.wait(timeout=TERM_GRACE_S)


def _read_progress(work_dir: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for f in work_dir.glob(PROGRESS_FILE.format(rank="*")):
        with contextlib.suppress(OSError, ValueError):
            d = json.loads(f.read_text())
            if isinstance(d, dict) and isinstance(d.get("rank"), int):
                out[d["rank"]] = d
    return out


def _op_of(last: object) -> str:
    """A progress file's last op without its ``rank N: `` prefix."""
    return str(last).split(": ", 1)[-1]


def waiting_for(
    error: dict[str, Any],
    progress: dict[int, dict[str, Any]],
    groups: Mapping[str, Sequence[int]],
    reported: Collection[int] = (),
) -> str:
    """Which ranks the rank of ``error`` (a timeout) was waiting for, as far as the workers' progress files
    (``progress``: rank -> its last report) tell: ``waiting for rank 1, ...``; '' where they tell nothing.

    A phase (the error's ``phase``: start-up, the profiler's save, the shutdown barrier): the ranks that never
    reported, or last reported an earlier :class:`~skewlens.replay.real.plan.WorkerPhase` than it.
    A collective (``group``, ``seq``): the group's members (``groups``) that had not issued that seq when
    they last reported, or where all had, those not among the ranks that ``reported`` an error. A send or
    recv (``peer``): its peer, and the last op it had issued."""
    waited = error.get("waited") or {}
    me = int(error.get("rank", -1))
    mine = progress.get(me, {})
    everyone = groups.get("", ())
    parts: list[str] = []
    if "phase" in waited:
        order: dict[str, int] = {p: i for i, p in enumerate(WorkerPhase)}
        at = order.get(str(mine.get("phase", WorkerPhase.START_UP)), 0)
        silent = [r for r in everyone if r != me and r not in progress]
        if silent:
            parts.append(f"{ranks_label(silent)}, which never reported its start-up")
        behind: dict[str, list[int]] = {}
        for r, d in sorted(progress.items()):
            if r != me and order.get(str(d.get("phase")), len(order)) < at:
                behind.setdefault(str(d.get("phase")), []).append(r)
        parts += [f"{ranks_label(rs)}, which last reported {phase}" for phase, rs in behind.items()]
    elif int(waited.get("seq", -1)) >= 0:
        group, seq = str(waited.get("group", "")), int(waited["seq"])
        members = [r for r in groups.get(group, everyone) if r != me]
        late = [r for r in members if int(progress.get(r, {}).get("issued", {}).get(group, -1)) < seq]
        if (root := _awaited_member(waited, groups.get(group, everyone), me)) in late:
            late = [root]  # a broadcast's, scatter's or gather's member waits for its root alone
        if not late:  # all had issued it: the members that did not time out on it too (stopped, or hung)
            quiet = [r for r in members if r not in reported]
            if quiet:
                parts.append(f"{ranks_label(quiet)}, which had issued it too and reported no error")
        for r in late[:SHOWN_WAITED]:
            rp = progress.get(r)
            if rp is None:
                parts.append(f"rank {r}, which never reported its start-up")
                continue
            if rp.get("phase") != WorkerPhase.REPLAY:
                parts.append(f"rank {r}, which last reported {rp.get('phase')}")
            elif rp.get("last"):
                parts.append(f"rank {r}, whose last op issued was {_op_of(rp['last'])}")
            else:
                parts.append(f"rank {r}, which had issued no op")
        if len(late) > SHOWN_WAITED:
            parts.append(f"{len(late) - SHOWN_WAITED} more ranks")
    elif int(waited.get("peer", -1)) >= 0:
        peer = int(waited["peer"])
        seen = progress.get(peer)
        if seen is None:
            parts.append(f"rank {peer}, which never reported its start-up")
        elif seen.get("last"):
            parts.append(f"rank {peer}, whose last op issued was {_op_of(seen['last'])}")
    if not parts:
        return ""
    return f"; waiting for {'; '.join(parts)} (as they last reported)"


def _awaited_member(waited: Mapping[str, Any], members: Sequence[int], me: int) -> int:
    """The member whose arrival rank ``me`` of a stuck collective (``waited``'s ``comm_type`` and ``root``)
    waits for by the execution model's rule (:func:`skewlens.replay.execution.waits_for`): a non-root
    member of a broadcast, scatter or gather waits for the root; -1 for every other case (the last
    arrival, or no one)."""
    try:
        kind, root = CommType(int(waited.get("comm_type", -1))), int(waited.get("root", -1))
    except ValueError:  # not a collective's type (-1), or a file from another version
        return -1
    if me not in members:
        return -1
    root = issued_root(root, members)  # as the worker issues it
    k = waits_for(kind, list(members).index(root), len(members))[list(members).index(me)]
    return members[k] if k >= 0 and members[k] != me else -1


#: Ranks a stuck collective's message names one by one.
SHOWN_WAITED = 4


def _rendezvous_timed_out(log: Path) -> bool:
    """Whether torchrun's output in ``log`` ends with its rendezvous timing out (its last 64 KiB)."""
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 65536))
            return b"RendezvousTimeoutError" in fh.read()
    except OSError:
        return False


#: The line that ends a Python traceback: the exception's (dotted) name and its message, not indented.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*")
#: The reason torch's c10d gives for a failed connection: ``(errno: 101 - Network is unreachable)``.
_SOCKET_REASON = re.compile(r"\(errno: \d+ - ([^)]+)\)")
#: An exception that is a failed connection, whose cause the socket's reason is (the reason is also in logs
#: of runs that fail otherwise: torch warns of a harmless failed try at ``localhost`` as ::1).
_CONNECTION_EXCEPTION = re.compile(r"[\w.]*(?:Connection|Network|Socket|Store)\w*(?:Error|Exception)\b.*")
#: What to do when torchrun --standalone cannot reach the rendezvous store it serves on this host.
_LOOPBACK_HINT = (
    "torchrun --standalone serves its rendezvous on this host, over the loopback interface: bring it up "
    "(ip link set lo up), or allow local connections"
)


def _log_tail(log: Path, standalone: bool = False, lines: int = 5) -> str:
    """What ``log`` says failed, on one line: the exception that ended its last Python traceback (with the
    reason the last failed socket connection gave, where torch's c10d logged one and the exception is a
    failed connection), else its last ``lines``
    lines. The last lines of a traceback were its frames ('store = _create_tcp_store(params) | ^^^^ |
    File ".../c10d_rendezvous_backend.py", ...' in a network namespace with no loopback, 2.5 minutes of
    retries later) and named neither the error nor its cause. An exception whose line ends in ``:`` says
    it on the lines after (torchrun's ``ChildFailedError``: a killed worker's signal), and is said by the
    last lines. ``standalone``: the launcher served its own rendezvous, and a failed connection to it says
    what to do."""
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    starts = [k for k, line in enumerate(text) if line.startswith("Traceback (most recent call last)")]
    ends = [line.strip() for line in text[starts[-1] :] if _EXCEPTION_LINE.fullmatch(line)] if starts else []
    if not ends or ends[-1].endswith(":"):
        return " | ".join(line.strip() for line in text[-lines:])
    reasons = _SOCKET_REASON.findall("\n".join(text)) if _CONNECTION_EXCEPTION.fullmatch(ends[-1]) else []
    said = f"{ends[-1]} (the connection's error: {reasons[-1]})" if reasons else ends[-1]
    return f"{said}; {_LOOPBACK_HINT}" if standalone and "RendezvousConnectionError" in said else said


def launcher_log(work_dir: Path, launcher_args: Sequence[str] | None) -> Path:
    """Where the launcher's output goes: ``launcher.log``, or across hosts (the caller's rendezvous) one
    file per host and process, as every host's launcher writes into the same shared ``work_dir``."""
    if not launcher_args:
        return work_dir / LAUNCHER_LOG
    return work_dir / f"launcher.{socket.gethostname()}.{os.getpid()}.log"


def _share_torchrun_logs(logs: Path) -> None:
    """Give the directory torchrun makes in its ``--log-dir`` (``mkdtemp``'s, 0700) what ``mkdir`` would
    have: in a team's shared directory a second member's replay into the first's OUT could not remove it,
    and left it in a hidden ``.OUT.k3j2x7ab.tmp`` there."""
    with contextlib.suppress(OSError):
        for made in logs.iterdir() if logs.is_dir() and not logs.is_symlink() else ():
            if made.is_dir() and not made.is_symlink():
                chmod_as_made(made)


def run_workers(
    cmd: list[str],
    *,
    work_dir: Path,
    deadline_s: float,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    keep_logs: Callable[[Path], Path] | None = None,
    groups: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Run the launcher until it exits; raise on a worker error, a timeout or a non-zero exit.

    ``deadline_s`` bounds the whole replay (the per-op timeouts are the workers' own); whatever happens,
    no process of the job is left running when this returns or raises. ``keep_logs``: called with the
    launcher's log once every process has stopped after a failure, to put the logs where they outlive the
    replay's working files; the error names the log where it returns it. ``groups``: each process group's
    members ('' all ranks), for a timeout's error to name the ranks it waited for (:func:`waiting_for`).
    This process cannot stop anything once killed with SIGKILL: the workers watch it (``SUPERVISOR_ENV``,
    in their environment) and exit when it is gone.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in (
        f for name in (ERROR_FILE, RESULT_FILE, PROGRESS_FILE) for f in work_dir.glob(name.format(rank="*"))
    ):
        stale.unlink()
    log = log or work_dir / LAUNCHER_LOG
    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            cmd,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**(os.environ if env is None else env), SUPERVISOR_ENV: str(os.getpid())},
        )
    tree = ProcessTree(proc)
    t_end = time.monotonic() + deadline_s
    errors: list[dict[str, object]] = []
    timed_out = False
    try:
        while proc.poll() is None:
            tree.refresh()
            errors = _read_errors(work_dir)
            if errors:
                time.sleep(ERROR_SETTLE_S)
                errors = _read_errors(work_dir)
                break
            if time.monotonic() > t_end:
                timed_out = True
                break
            time.sleep(POLL_S)
        if not errors and not timed_out:
            errors = _read_errors(work_dir)
    finally:
        tree.kill_all()
        _share_torchrun_logs(work_dir / TORCHRUN_LOGS)
    if not (timed_out or errors or proc.returncode != 0):
        return
    tail = _log_tail(log, standalone="--standalone" in cmd)  # before the log moves
    rendezvous = _rendezvous_timed_out(log)
    progress = _read_progress(work_dir)
    shown = keep_logs(log) if keep_logs is not None else log
    if timed_out:
        raise ReplayTimeoutError(
            f"real replay did not finish within {deadline_s:.0f} s (no rank reported a stuck op); "
            f"every process was stopped; launcher log: {shown}"
        )
    if errors:
        first = min(errors, key=lambda d: (d.get("kind") != "timeout", int(str(d.get("at_ns", 0)))))
        reported = {int(str(d.get("rank", -1))) for d in errors}
        others = [str(d.get("message")) for d in errors if d is not first]
        more = f" (also: {'; '.join(others)})" if others else ""
        if first.get("kind") == "timeout":
            waits = waiting_for(first, progress, groups, reported) if groups is not None else ""
            msg = f"{first.get('message')}{waits}"
            raise ReplayTimeoutError(f"real replay: {msg}; every rank was stopped{more}")
        raise ReplayError(f"real replay failed: {first.get('message')}; every rank was stopped{more}")
    if rendezvous:
        raise ReplayError(
            "real replay: the rendezvous timed out waiting for the other nodes to join (torchrun's "
            f"--rdzv-conf join_timeout bounds it, 600 s unless real.launcher_args give one); log {shown}"
        )
    # under ulimit -v 600000, torch's rendezvous store failed to start, and the log said only that the
    # connection to it timed out (twice 60 s) and "loop cleanup didn't work"
    cap = address_space_limit()
    limited = f"; {cap}, which torch's processes may need more of" if cap else ""
    raise ReplayError(
        f"real replay: the launcher exited with code {proc.returncode}; log {shown}: {tail}{limited}"
    )
