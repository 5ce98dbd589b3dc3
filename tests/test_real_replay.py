"""Real replay: traces re-executed on real gloo processes through torchrun (and the pure parts around it)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from capture_helpers import EXAMPLE, profile, profile_script, run_together
from replay_workloads import MS, STEPS, RankFactor, four_rank_run, worker_times
from rich.console import Console

from skewlens.profiler.errors import TraceFormatError, ValidationError
from skewlens.profiler.store import RunTrace, load_run
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import WAIT_NODE_NAMES, CommType, NodeType
from skewlens.replay.config import DimensionConfig, RealConfig, ReplayConfig, SlowdownConfig, TopologyConfig
from skewlens.replay.driver import replay_run
from skewlens.replay.effects import NO_EFFECTS, NoEffects
from skewlens.replay.errors import ConfigError, ReplayError, ReplayTimeoutError
from skewlens.replay.lower import collective_bytes, collective_pairs
from skewlens.replay.real.api import real_replay, serial_deadlock, worker_env
from skewlens.replay.real.launch import TORCHRUN_LOGS, launcher_command, run_workers, waiting_for
from skewlens.replay.real.plan import (
    KIND_COLL,
    KIND_COMPUTE,
    KIND_NESTED,
    KIND_RECV,
    KIND_SEND,
    SUPERVISOR_ENV,
    ReplayOp,
    all_to_all_splits,
    group_specs,
    hashed_group_name,
    rank_plan,
    read_rank_plan,
    warmup_ops,
)
from skewlens.replay.real.render import outputs_line, render_comparison
from skewlens.replay.real.result import RankStepTimes, RealReplayResult, rank_step_times, step_spans
from skewlens.replay.simulate import simulate
from skewlens.replay.slowdown import Slowdown, SlowdownModel

CFG = RealConfig(timeout_s=20.0)  # per-operation timeout of the replays below


def _sleeper(tmp_path: Path) -> str:
    """A grandchild that outlives its parent unless killed; its argv names the test's directory, so that
    ``_no_replay_processes_left`` finds it even once it has left the process tree (re-parented)."""
    return f"[sys.executable, '-c', 'import time; time.sleep(60)', {str(tmp_path)!r}]"


def _median_step(spans: dict[tuple[int, int], tuple[int, int]], rank: int) -> float:
    vals = [e - s for (r, _st), (s, e) in spans.items() if r == rank]
    assert len(vals) == STEPS, (rank, sorted(spans))
    return statistics.median(vals)


def assert_the_workers_kept_their_plans(out_dir: Path, ranks: list[int]) -> None:
    """On each worker's own clock: no op began before its dependencies (their end, or their issue for an
    issue dependency) plus its recorded gap and added delay, and no compute ran for less than planned.

    The workers wait and compute until deadlines, so these hold however loaded the machine is; how close
    the replay comes to the recorded times is measured by ``benchmarks/real_replay_fidelity.py``."""
    replayed = load_run(out_dir / "real" / "replayed", match=False)
    for r in ranks:
        _warmup, ops = read_rank_plan(out_dir / "real" / "plan", r)
        start, end = replayed.ranks[r].start_ns.tolist(), replayed.ranks[r].end_ns.tolist()
        assert ops
        for op in ops:
            if op.kind == KIND_NESTED:
                continue
            if op.deps:
                ready = max(end[d] for d in op.deps)
                assert start[op.row] >= ready + op.gap_ns + op.delay_ns, (r, op)
            if op.kind == KIND_COMPUTE:
                assert end[op.row] - start[op.row] >= op.dur_ns, (r, op)


_CHILDREN_BEFORE_TEST: set[int] = set()
#: This pytest session's base temporary directory: every replay and sleeper of these tests names a path
#: under it in its argv, and processes of other sessions on the machine (their own pytest runs) do not.
_BASETEMP: list[str] = []


@pytest.fixture(autouse=True)
def _note_preexisting_children(tmp_path_factory: pytest.TempPathFactory) -> None:
    _BASETEMP[:] = [str(tmp_path_factory.getbasetemp())]
    _CHILDREN_BEFORE_TEST.clear()
    _CHILDREN_BEFORE_TEST.update(p.pid for p in psutil.Process().children(recursive=True))


def _no_replay_processes_left() -> list[str]:
    # Children the pytest process already had before the test (multiprocessing's resource tracker and
    # forkserver, started by other tests' process pools and kept for the session) are not the replay's.
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.pid not in _CHILDREN_BEFORE_TEST
    ]
    # Re-parented processes (a worker or sleeper whose parent was killed) are no longer children: look for
    # this session's anywhere on the machine, by the base temporary directory their argv names.
    workers = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.pid != os.getpid() and _BASETEMP[0] in cmd and p.pid not in _CHILDREN_BEFORE_TEST:
            workers.append(cmd)
    return [f"child {p.pid}: {' '.join(p.cmdline())}" for p in left] + workers


@dataclass(frozen=True, slots=True)
class _Sleepers:
    """Two grandchildren (``launcher`` starts them in sessions of their own), found anywhere on the machine
    by a marker in their argv that is unique to this test run: one made of tmp_path's name (the test's, the
    same in another pytest session running this test) counted that session's sleepers too (4 or 6 where 2
    were started, with two sessions running the SIGTERM test at once: 6 of 6 runs failed after the first)."""

    marker: str

    @property
    def launcher(self) -> str:
        return (
            "import subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            f"{self.marker!r}], start_new_session=True) for _ in range(2)]\n"
            "time.sleep(60)\n"
        )

    def alive(self) -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if self.marker in (p.info["cmdline"] or [])]

    def wait_for_both(self, timeout_s: float) -> int:
        """How many are running once both are, or ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        while len(self.alive()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(self.alive())


@pytest.fixture
def sleepers() -> Iterator[_Sleepers]:
    s = _Sleepers(f"skl-sleeper-{uuid.uuid4().hex}")
    yield s
    # a failed test's processes (the parent and launcher name the marker inside their scripts) are not left
    # running for a minute, to be counted by the next run
    for p in psutil.process_iter(["cmdline"]):
        if any(s.marker in arg for arg in p.info["cmdline"] or []) and p.pid != os.getpid():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return four_rank_run(tmp_path_factory.mktemp("real") / "orig")


@pytest.fixture(scope="module")
def baseline(synthetic: Path) -> RealReplayResult:
    return real_replay(run_dir=synthetic, out_dir=synthetic.parent / "base", effects=NO_EFFECTS, cfg=CFG)


# ---- pure parts: the plan ------------------------------------------------------------------------------


def test_plan_keeps_host_gaps_and_scales_compute_by_the_effects(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("aten::mm", 4 * MS, start_ns=100 * MS)
        rb.collective(CommType.ALL_REDUCE, 1024, MS, start_ns=100 * MS + 4 * MS + 700_000, deps=(a,))
        rb.compute("aten::add", 2 * MS, start_ns=100 * MS + 6 * MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[1], run, RankFactor(1, 1.5))
    mm, ar, add = ops
    assert (mm.kind, mm.dur_ns, mm.deps, mm.gap_ns) == (KIND_COMPUTE, 6 * MS, (), 0)
    assert (ar.gap_ns, ar.deps, ar.seq, ar.pg_name) == (700_000, (mm.row,), 0, "0")
    assert add.gap_ns == 6 * MS - (4 * MS + 700_000 + MS)
    assert add.deps == (ar.row,)
    assert ar.blocking  # the next op waited for it: re-issued as a blocking call, as recorded


def test_the_plan_scales_what_the_simulator_scales_and_not_untraced_host_time(tmp_path: Path) -> None:
    # the simulator stopped slowing untraced time (idle in every table); the real plan still did
    from skewlens.profiler.vocab import UNTRACED_NODE_NAME

    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", 4 * MS)
        rb.compute(UNTRACED_NODE_NAME, 30 * MS)
        rb.collective(CommType.ALL_REDUCE, 1024, MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = [o for o in rank_plan(run.ranks[1], run, RankFactor(1, 2.0)) if o.kind == KIND_COMPUTE]
    assert [(o.name, o.dur_ns) for o in ops] == [("aten::mm", 8 * MS), (UNTRACED_NODE_NAME, 30 * MS)]


def test_an_op_issued_while_async_communication_is_in_flight_does_not_wait_for_it(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        ar = rb.collective(CommType.ALL_REDUCE, 1024, 10 * MS, start_ns=0, stream=1000)
        rb.compute("aten::mm", 3 * MS, start_ns=2 * MS, deps=(ar,))
    run = load_run(b.write(tmp_path / "run"))
    _ar, mm = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert mm.deps == () and mm.gap_ns == 2 * MS  # 2 ms after the rank's first start, as recorded
    assert not _ar.blocking  # compute overlapped it: re-issued asynchronously


def test_nested_compute_is_not_replayed_twice(tmp_path: Path) -> None:
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    outer = rb.compute("aten::linear", 10 * MS, start_ns=0)
    rb.compute("aten::addmm", 6 * MS, start_ns=2 * MS, deps=(outer,))
    run = load_run(b.write(tmp_path / "run"))
    o, inner = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert (o.kind, inner.kind, inner.parent, inner.offset_ns) == (KIND_COMPUTE, KIND_NESTED, o.row, 2 * MS)


def _issued_inside_run(run_dir: Path, steps: int) -> Path:
    """``unshard(async_op=True)`` under FSDP2, as captured at ``ops``: an all_gather issued 4 ms into a
    20 ms ``FSDP::all_gather`` op (its start edge from the op before), waited for by ``c10d::wait``."""
    b = RunBuilder(2)
    for r in (0, 1):
        for st in range(steps):
            t0 = st * 50 * MS
            rb = b.rank(r).step(st)
            a = rb.compute("aten::randn", MS, start_ns=t0)
            op = rb.compute("FSDP::all_gather (0)", 20 * MS, start_ns=t0 + MS, deps=(a,))
            ag = rb.collective(
                CommType.ALL_GATHER, 4096, 10 * MS, start_ns=t0 + 5 * MS, stream=1000, deps=(a,)
            )
            rb.compute("c10d::wait", MS, start_ns=t0 + 21 * MS, deps=(op, ag))
    return b.write(run_dir)


def test_communication_issued_inside_a_host_op_is_planned_to_be_issued_during_it(tmp_path: Path) -> None:
    # FSDP2's unshard(async_op=True): before, the worker ran the whole 20 ms op and issued the all_gather
    # after it (16 ms late); the simulator issues it 4 ms into the op, as recorded
    run = load_run(_issued_inside_run(tmp_path / "run", 1))
    a, op, ag, wait = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert (op.name, op.issues_inside) == ("FSDP::all_gather (0)", (ag.row,))
    # timed from the op's start (the model's issue edge), 4 ms in, not 4 ms after `a`
    assert (ag.deps, ag.gap_ns, ag.issued_in, ag.issue_off_ns, ag.blocking) == (
        (a.row,),
        0,
        op.row,
        4 * MS,
        False,
    )
    assert wait.issues_inside == () and a.issues_inside == ()


@pytest.mark.parametrize(("delay_ms", "factor"), [(3, 1.5), (3, 1.0), (0, 1.5), (18, 1.0)])
def test_a_delay_before_communication_issued_inside_a_host_op_holds_the_threads_next_op_as_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int, factor: float
) -> None:
    # the all_gather issued 4 ms into the 20 ms FSDP::all_gather, `delay_ms` late, the op `factor` times as
    # long: the thread sleeps before the issue, so c10d::wait, its next op, starts `delay_ms` after the op's
    # scaled end (the simulator's issuer_heads). The worker slept inside the op, which ran to its deadline:
    # with 3 ms and 1.5, c10d::wait started at 31 ms, 3 ms before the simulator's 34 ms; with 18 ms, past
    # the op's end, the all_gather was left to its own turn and c10d::wait started at its issue, 23 ms, not 39
    run = load_run(_issued_inside_run(tmp_path / "run", 1))
    slow = SlowdownModel(
        [
            Slowdown(kind="comm_delay", before="collective", ranks=(0,), delay_ns=delay_ms * MS),
            Slowdown(kind="op", pattern="FSDP::*", ranks=(0,), factor=factor),
        ]
    )
    ops = rank_plan(run.ranks[0], run, slow)
    sim = simulate(run, effects=slow)
    start, end = worker_times(ops, tmp_path, monkeypatch)
    assert ops[1].issues_inside == (ops[2].row,)
    assert {o.name: start[o.row] for o in ops} == {o.name: int(sim.start_ns[0][o.row]) for o in ops}
    assert end[ops[1].row] == int(sim.end_ns[0][ops[1].row]) == MS + round(20 * MS * factor)
    assert start[ops[-1].row] == MS + round(20 * MS * factor) + delay_ms * MS


def test_comparison_table_shows_each_rank_with_all_three_step_times(tmp_path: Path) -> None:
    result = RealReplayResult(
        run_dir=tmp_path / "run",
        out_dir=tmp_path,
        backend="gloo",
        ranks=(
            RankStepTimes(rank=0, steps=(0, 1), original_ns=(10 * MS, 12 * MS), replay_ns=(11 * MS, 11 * MS)),
            RankStepTimes(rank=1, steps=(0, 1), original_ns=(20 * MS, 20 * MS), replay_ns=(22 * MS, 22 * MS)),
        ),
    )
    console = Console(file=io.StringIO(), width=150)
    console.print(render_comparison(result, {0: 10_500_000, 1: 21 * MS}))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    row1 = next(line for line in text.splitlines() if line.strip().startswith("│ 1") or "  1 " in line[:8])
    assert "20.00" in row1 and "22.00" in row1 and "21.00" in row1 and "+10.0%" in row1
    assert "11.00" in text and "10.50" in text


def _gloo_result(out: Path, *ranks: RankStepTimes) -> RealReplayResult:
    """A gloo real replay's result into ``out`` with these ranks' step times."""
    return RealReplayResult(run_dir=out / "run", out_dir=out, backend="gloo", ranks=ranks)


def test_both_deviations_in_the_table_are_against_the_recorded_step_and_a_rank_without_steps_has_none(
    tmp_path: Path,
) -> None:
    result = _gloo_result(
        tmp_path,
        RankStepTimes(rank=0, steps=(0,), original_ns=(20 * MS,), replay_ns=(22 * MS,)),
        RankStepTimes(rank=1, steps=(), original_ns=(), replay_ns=()),
    )
    console = Console(file=io.StringIO(), width=150)
    console.print(render_comparison(result, {0: 21 * MS, 1: 21 * MS}))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.count("│") == 8]
    got = [(c[0], c[4], c[6]) for c in cells if c[0].isdecimal()]
    assert got == [("0", "+10.0%", "+5.0%"), ("1", "-", "-")]  # real 22 ms, simulated 21, recorded 20


def test_the_real_replays_table_says_recorded_as_the_simulated_ones_and_which_outputs_are_whose(
    tmp_path: Path,
) -> None:
    result = _gloo_result(
        tmp_path, RankStepTimes(rank=0, steps=(0,), original_ns=(10 * MS,), replay_ns=(11 * MS,))
    )
    table = render_comparison(result, {0: 10 * MS})
    assert table.title == "Step time per rank: recorded vs real replay (gloo) vs simulated"
    assert [c.header for c in table.columns][2] == "recorded ms"
    assert table.caption == "Δ: against the recorded step time; real replay captured in run/ (below)"
    assert outputs_line(result, ["timeline.parquet", "summary.parquet"]) == (
        f"outputs in {tmp_path}: timeline.parquet, summary.parquet: the simulated replay; run/: the real "
        f"replay, captured as a run (skewlens analyze {tmp_path / 'run'}); real/: its plan, logs and each "
        "replayed node's own times"
    )


# ---- the supervisor (no torch): timeouts and clean-up -----------------------------------------------------


def test_supervisor_stops_the_whole_process_tree_when_the_replay_overruns(tmp_path: Path) -> None:
    spawn = (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen({_sleeper(tmp_path)}, start_new_session=True) for _ in range(2)]\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    with pytest.raises(ReplayTimeoutError, match="did not finish within"):
        run_workers([sys.executable, "-c", spawn], work_dir=tmp_path / "work", deadline_s=1.5)
    assert time.monotonic() - t0 < 15
    assert _no_replay_processes_left() == []


def test_the_launcher_is_started_naming_its_parent_as_the_process_its_workers_watch(tmp_path: Path) -> None:
    # killed with SIGKILL, the supervising process stops nothing: the workers (the launcher's children)
    # exit once the launcher's parent is no longer the process the environment names, this one
    seen = tmp_path / "seen"
    script = (
        "import os, pathlib\n"
        f"named = os.environ.get({SUPERVISOR_ENV!r})\n"
        f"pathlib.Path({str(seen)!r}).write_text(f'{{named}} {{os.getppid()}}')\n"
    )
    for env in (None, {**os.environ, SUPERVISOR_ENV: "1"}):
        run_workers([sys.executable, "-c", script], work_dir=tmp_path / "work", deadline_s=30, env=env)
        assert seen.read_text() == f"{os.getpid()} {os.getpid()}"


def test_a_workers_watchdog_is_orphaned_once_its_launchers_parent_is_not_the_supervisor_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # here the worker is this process and its launcher this process's parent, whose parent is the
    # supervisor to name; none named (a worker started by hand) watches its launcher alone
    from skewlens.replay.real.worker import Watchdog

    launchers_parent = psutil.Process(os.getppid()).ppid()
    got = {}
    for named in (str(launchers_parent), str(os.getpid()), ""):
        monkeypatch.setenv(SUPERVISOR_ENV, named)
        got[named] = Watchdog(0, tmp_path, 10.0)._orphaned(time.perf_counter_ns())
    assert got == {str(launchers_parent): False, str(os.getpid()): True, "": False}


def test_supervisor_raises_the_first_rank_error_and_stops_the_others(tmp_path: Path) -> None:
    work = tmp_path / "work"
    script = (
        "import json, pathlib, subprocess, sys, time\n"
        f"kid = subprocess.Popen({_sleeper(tmp_path)}, start_new_session=True)\n"
        "time.sleep(0.3)\n"
        f"pathlib.Path({str(work)!r}, 'rank-1.error.json').write_text(json.dumps({{'rank': 1, "
        "'kind': 'timeout', 'message': \"rank 1: all_reduce on group 'tp0' seq 7 (node 9 x) did not "
        "complete\", 'at_ns': 5}))\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(ReplayTimeoutError, match=r"rank 1: all_reduce on group 'tp0' seq 7"):
        run_workers([sys.executable, "-c", script], work_dir=work, deadline_s=30)
    assert _no_replay_processes_left() == []


def test_a_timeout_is_the_error_raised_though_another_rank_failed_first_and_the_failure_is_also_said(
    tmp_path: Path,
) -> None:
    import json

    work = tmp_path / "work"
    errors = {
        "rank-0.error.json": {
            "rank": 0,
            "kind": "timeout",
            "message": "rank 0: all_reduce stuck",
            "at_ns": 5,
        },
        "rank-1.error.json": {"rank": 1, "kind": "error", "message": "rank 1: connection reset", "at_ns": 3},
    }
    script = (
        "import json, pathlib\n"
        f"for name, doc in json.loads({json.dumps(errors)!r}).items():\n"
        f"    pathlib.Path({str(work)!r}, name).write_text(json.dumps(doc))\n"
        "raise SystemExit(1)\n"
    )
    with pytest.raises(ReplayTimeoutError) as e:
        run_workers([sys.executable, "-c", script], work_dir=work, deadline_s=30)
    assert str(e.value) == (
        "real replay: rank 0: all_reduce stuck; every rank was stopped (also: rank 1: connection reset)"
    )


#: The end of torchrun's log in a network namespace whose loopback is down (``unshare -n``), after 2.5
#: minutes of retries: lines of torch's own, shortened (a frame's path, the C++ frames left out).
NO_LOOPBACK_LOG = """\
[W1207 01:32:35.067332004 socket.cpp:764] [c10d] The client socket has failed to connect to [::1]:44468 \
(errno: 101 - Network is unreachable).
[E1207 01:32:35.067366976 socket.cpp:818] [c10d] The client socket has failed to connect to any network \
address of (localhost, 45705).
Exception raised from run at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/socket.cpp:820 (most recent \
call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 254, in create_backend
    store = _create_tcp_store(params)
            ^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 180, in _create_tcp_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has \
failed. See inner exception for details.
"""


@pytest.mark.parametrize("standalone", [True, False])
def test_a_launcher_that_ended_in_a_traceback_is_said_by_its_exception_and_the_sockets_reason(
    tmp_path: Path, standalone: bool
) -> None:
    # the error quoted the log's last 5 lines, the traceback's frames: "log .../launcher.log: store =
    # _create_tcp_store(params) | ^^^^^^^^^^^^^^^^^^^^^^^^^ | File \".../c10d_rendezvous_backend.py\", line
    # 180, ..." named neither the error nor that the loopback interface was down
    script = f"import sys; sys.stdout.write({NO_LOOPBACK_LOG!r}); raise SystemExit(1)"
    args = ["--standalone"] if standalone else ["--rdzv-endpoint=head:29500"]
    with pytest.raises(ReplayError) as e:
        run_workers([sys.executable, "-c", script, *args], work_dir=tmp_path / "work", deadline_s=30)
    said = (
        f"real replay: the launcher exited with code 1; log {tmp_path / 'work' / 'launcher.log'}: "
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
        "store has failed. See inner exception for details. (the connection's error: Network is unreachable)"
    )
    hint = (
        "; torchrun --standalone serves its rendezvous on this host, over the loopback interface: bring it "
        "up (ip link set lo up), or allow local connections"
    )
    assert str(e.value) == said + (hint if standalone else "")


def test_a_launcher_log_without_a_traceback_is_said_by_its_last_lines(tmp_path: Path) -> None:
    script = (
        "print('usage: torchrun [-h]'); print('torchrun: error: unrecognized arguments: --bogus'); exit(2)"
    )
    with pytest.raises(ReplayError) as e:
        run_workers([sys.executable, "-c", script], work_dir=tmp_path / "work", deadline_s=30)
    assert str(e.value).endswith(
        "launcher.log: usage: torchrun [-h] | torchrun: error: unrecognized arguments: --bogus"
    )


#: The end of torchrun's log where a worker was killed (the OOM killer's SIGKILL: it wrote no error of its
#: own): torch's ChildFailedError says what failed on the lines after its name, a line that ends in ':'.
#: The socket warning before it is torch's, printed by runs that succeed too (localhost tried as ::1 first).
CHILD_KILLED_LOG = """\
[W1207 02:11:30.000000000 socket.cpp:697] [c10d] The client socket has failed to connect to \
[localhost]:29500 (errno: 99 - Cannot assign requested address).
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
=====================================================
/venv/skewlens/replay/real/worker.py FAILED
-----------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_02:11:34
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 4242)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
=====================================================
"""


def test_a_launcher_whose_worker_was_killed_is_said_by_the_failure_torchrun_printed_after_its_exception(
    tmp_path: Path,
) -> None:
    # ChildFailedError's message starts on the next line: the error was its name alone, "...ChildFailedError:
    # (the connection's error: Cannot assign requested address)", without the signal, and with the reason of
    # a connection that had failed harmlessly before the run
    script = f"import sys; sys.stdout.write({CHILD_KILLED_LOG!r}); raise SystemExit(1)"
    with pytest.raises(ReplayError) as e:
        run_workers([sys.executable, "-c", script, "--standalone"], work_dir=tmp_path / "work", deadline_s=30)
    assert str(e.value) == (
        f"real replay: the launcher exited with code 1; log {tmp_path / 'work' / 'launcher.log'}: "
        "rank      : 0 (local_rank: 0) | exitcode  : -9 (pid: 4242)  (SIGKILL) | error_file: <N/A> | "
        "traceback : Signal 9 (SIGKILL) received by PID 4242 | " + "=" * 53
    )


def _launcher_said(tmp_path: Path, log: str, *launcher_args: str) -> str:
    """What the error of a launcher that wrote ``log`` and exited with code 1 says after the log's path."""
    script = f"import sys; sys.stdout.write({log!r}); raise SystemExit(1)"
    with pytest.raises(ReplayError) as e:
        run_workers([sys.executable, "-c", script, *launcher_args], work_dir=tmp_path / "work", deadline_s=30)
    head = f"real replay: the launcher exited with code 1; log {tmp_path / 'work' / 'launcher.log'}: "
    assert str(e.value).startswith(head), str(e.value)
    return str(e.value).removeprefix(head)


@pytest.mark.parametrize("standalone", [False, True])
def test_a_launcher_that_failed_otherwise_is_not_given_the_reason_of_a_harmless_connection_warning(
    tmp_path: Path, standalone: bool
) -> None:
    # the socket's reason was added to whatever exception ended the log: torch's warning of a failed try at
    # localhost (printed by runs that succeed too) made a worker's own error read as a network failure; and
    # under --standalone, a worker's own error is no reason to bring the loopback interface up
    warning = CHILD_KILLED_LOG.splitlines()[0]
    log = (
        f'{warning}\nTraceback (most recent call last):\n  File "x.py", line 1\nValueError: bad bucket size\n'
    )
    args = ["--standalone"] if standalone else []
    assert _launcher_said(tmp_path, log, *args) == "ValueError: bad bucket size"


def test_a_failed_connection_is_given_the_reason_of_the_last_failed_try_not_of_the_harmless_first_one(
    tmp_path: Path,
) -> None:
    # torch warns of its try at localhost as ::1 ("Cannot assign requested address") in runs that succeed
    # too; the connection that failed the run is the last one logged
    log = CHILD_KILLED_LOG.splitlines()[0] + "\n" + NO_LOOPBACK_LOG
    assert _launcher_said(tmp_path, log, "--rdzv-endpoint=head:29500") == (
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
        "store has failed. See inner exception for details. (the connection's error: Network is unreachable)"
    )


@pytest.mark.parametrize(
    "exception",
    [
        "torch.distributed.DistStoreError: Timed out after 301 seconds waiting for clients. 1/2 clients",
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
    ],
    ids=["store", "network", "connection"],
)
def test_a_store_network_or_socket_error_is_given_the_sockets_reason_as_a_failed_connection_is(
    tmp_path: Path, exception: str
) -> None:
    log = (
        "[W1207 02:11:30.000000000 socket.cpp:764] [c10d] The client socket has failed to connect to "
        "[head]:29500 (errno: 111 - Connection refused).\n"
        f'Traceback (most recent call last):\n  File "x.py", line 1\n{exception}\n'
    )
    said = _launcher_said(tmp_path, log, "--rdzv-endpoint=head:29500")
    assert said == f"{exception} (the connection's error: Connection refused)"


def test_a_last_traceback_without_an_exception_line_is_said_by_its_last_lines_not_an_earlier_tracebacks(
    tmp_path: Path,
) -> None:
    # a traceback torch logged of a retry, then the one that ended the launcher, whose exception's name
    # says none of Error/Exception/Exit/Interrupt: the retry's exception was not what failed the run
    log = (
        "Traceback (most recent call last):\n"
        '  File "/venv/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 1, in _keep_alive\n'
        "torch.distributed.DistNetworkError: Connection reset by peer\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/bin/torchrun", line 8, in <module>\n'
        "    sys.exit(main())\n"
        '  File "/venv/subprocess.py", line 1209, in wait\n'
        "    return self._wait(timeout=timeout)\n"
        "subprocess.TimeoutExpired: Command 'nvidia-smi' timed out after 5 seconds\n"
    )
    assert _launcher_said(tmp_path, log) == (
        'File "/venv/bin/torchrun", line 8, in <module> | sys.exit(main()) | File "/venv/subprocess.py", '
        "line 1209, in wait | return self._wait(timeout=timeout) | subprocess.TimeoutExpired: Command "
        "'nvidia-smi' timed out after 5 seconds"
    )


def test_ctrl_c_during_a_replay_stops_every_process_it_started(tmp_path: Path, sleepers: _Sleepers) -> None:
    # an interactive terminal's Ctrl-C: Python's default handler, even where this test runs as a
    # background job of a non-interactive shell (which starts its children with SIGINT ignored)
    parent = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys\nfrom pathlib import Path\nfrom skewlens.replay.real.launch import run_workers\n"
        f"run_workers([sys.executable, '-c', {sleepers.launcher!r}], work_dir=Path({str(tmp_path)!r}), "
        "deadline_s=60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stderr=subprocess.PIPE)
    assert sleepers.wait_for_both(timeout_s=30) == 2
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert sleepers.alive() == []


# ---- real processes (gloo, torchrun) ------------------------------------------------------------------


def test_mismatched_collective_types_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    b = RunBuilder(2)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 1024, MS)
    b.rank(1).step(0).collective(CommType.BROADCAST, 1024, MS)
    run = b.write(tmp_path / "run")
    with pytest.raises(ValidationError, match=r"seq 0"):
        real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    assert not (tmp_path / "out" / "real" / "work").exists()


def _two_threads_run(tmp_path: Path, *, crossed: bool = True) -> Path:
    """DDP's all_reduce (on gloo's worker, stream 1000) that the main thread (stream 0) waits for, beside a
    checkpoint thread's all_gather (stream 7, its own group, then the thread's next op). ``crossed``: in
    opposite orders on the two ranks, as recorded on rank 0 the main thread waits for the all_reduce
    (1.5 ms) before its checkpoint thread issues the all_gather (2 ms), and on rank 1 the checkpoint
    thread waits in the all_gather (1 ms) before its main thread issues the all_reduce (3.5 ms):
    concurrent threads complete both, one thread in start order deadlocks. Else rank 1 as rank 0."""
    b = RunBuilder(2, {"0": (0, 1), "ckpt": (0, 1)})
    for r in (0, 1):
        rb = b.rank(r).step(0)
        late = r == 1 and crossed
        mm = rb.compute("aten::mm", int(3.5 * MS) if late else MS, start_ns=0)
        at = int(3.5 * MS) if late else MS
        ar = rb.collective(
            CommType.ALL_REDUCE,
            1024,
            MS // 2 if late else 3 * MS,
            pg="0",
            start_ns=at,
            stream=1000,
            deps=(mm,),
        )
        rb.compute(
            sorted(WAIT_NODE_NAMES)[0],
            MS // 2 if late else int(2.5 * MS),
            start_ns=at + MS // 10 if late else int(1.5 * MS),
            deps=(ar,),
        )
        ag_at, ag_dur = (MS, 2 * MS) if late else (2 * MS, MS)
        rb.collective(CommType.ALL_GATHER, 4096, ag_dur, pg="ckpt", start_ns=ag_at, stream=7)
        rb.compute("ckpt_write", MS // 2, stream=7)
    return b.write(tmp_path / "run")


def test_threads_whose_collectives_would_deadlock_on_one_thread_are_refused_before_any_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the real replay ran both threads on one: rank 0 blocked in its wait for the all_reduce, rank 1 in
    # the all_gather, until real.timeout_s, then blamed a rank that was not slow
    run = _two_threads_run(tmp_path)

    def started(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr("skewlens.replay.real.api.run_workers", started)
    want = (
        r"cannot replay on real processes: re-issued in recorded start order on one thread per rank \(a "
        r"rank's threads run on one\), its communication would deadlock: rank 0 would wait for all_reduce "
        r"group '0' seq 0 \(node 2\) of stream 1000, which rank\(s\) 1 would not have issued; rank 1 would "
        r"wait at ckpt_write \(node 5, stream 7\) for all_gather group 'ckpt' seq 0 \(node 4\) of stream 7, "
        r"which rank\(s\) 0 would not have issued; replay by simulation \(mode=sim\) instead$"
    )
    with pytest.raises(ConfigError, match=want):
        real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    topo = TopologyConfig(name="sw", dims=[DimensionConfig(bandwidth_gbps=10.0, latency_ns=5_000)])
    cfg = ReplayConfig(trace=str(run), out=str(tmp_path / "out2"), topology=topo, perfetto=False, mode="real")
    with pytest.raises(ConfigError, match=want):
        replay_run(cfg)
    assert not (tmp_path / "out" / "real").exists() and not (tmp_path / "out2").exists()


def test_threads_in_the_same_order_on_every_rank_are_replayed_on_one_thread_without_a_deadlock(
    tmp_path: Path,
) -> None:
    # the same two threads, but each rank waits for the all_reduce before its checkpoint thread's all_gather
    run = load_run(_two_threads_run(tmp_path, crossed=False))
    plans = {r: rank_plan(rt, run, NO_EFFECTS) for r, rt in run.ranks.items()}
    assert serial_deadlock(run, plans) is None
    crossed = load_run(_two_threads_run(tmp_path / "x"))
    plans = {r: rank_plan(rt, crossed, NO_EFFECTS) for r, rt in crossed.ranks.items()}
    assert serial_deadlock(crossed, plans) is not None
    # one thread whose recorded calls cross (a then b on rank 0, b then a on rank 1): the check sees it too
    b = RunBuilder(2, groups={"0": (0, 1), "a": (0, 1), "b": (0, 1)})
    for r, order in ((0, ("a", "b")), (1, ("b", "a"))):
        for g in order:
            b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1024, MS, pg=g)
    one = load_run(b.write(tmp_path / "one"))
    stuck = serial_deadlock(one, {r: rank_plan(rt, one, NO_EFFECTS) for r, rt in one.ranks.items()})
    assert stuck == (
        "rank 0 would wait for all_reduce group 'a' seq 0 (node 1) of stream 0, which rank(s) 1 would not "
        "have issued; rank 1 would wait for all_reduce group 'b' seq 0 (node 1) of stream 0, which rank(s) 0 "
        "would not have issued"
    )


def _stuck(b: RunBuilder, path: Path) -> str | None:
    run = load_run(b.write(path))
    return serial_deadlock(run, {r: rank_plan(rt, run, NO_EFFECTS) for r, rt in run.ranks.items()})


def test_a_later_wait_for_an_asynchronous_collective_crossed_with_a_peers_blocking_one_is_found(
    tmp_path: Path,
) -> None:
    # rank 0's main thread issues group '0''s all_reduce asynchronously (gloo's stream 1000), computes, then
    # waits for it (a wait edge: the wait's start follows the compute) while its checkpoint thread (stream
    # 7) all-gathers later; rank 1's checkpoint thread all-gathers first, and its main thread all-reduces
    # after: in start order on one thread, rank 0 waits for the all_reduce, rank 1 (at its checkpoint
    # write) for the all_gather. Found only where a wait's wait edges are read, not only its start edges
    b = RunBuilder(2, {"0": (0, 1), "ckpt": (0, 1)})
    wait = sorted(WAIT_NODE_NAMES)[0]
    r0 = b.rank(0).step(0)
    ar = r0.collective(CommType.ALL_REDUCE, 1024, int(3.2 * MS), pg="0", start_ns=0, stream=1000)
    r0.compute("aten::mm", MS // 2, start_ns=MS // 10)
    r0.compute(wait, int(2.3 * MS), start_ns=MS, deps=(ar,))
    ag = r0.collective(CommType.ALL_GATHER, 4096, MS // 5, pg="ckpt", start_ns=2 * MS, stream=7)
    r0.compute("ckpt_write", MS // 2, stream=7, deps=(ag,))
    r1 = b.rank(1).step(0)
    ag = r1.collective(CommType.ALL_GATHER, 4096, int(2.2 * MS), pg="ckpt", start_ns=0, stream=7)
    r1.compute("ckpt_write", MS // 2, stream=7, deps=(ag,))
    mm = r1.compute("aten::mm", 3 * MS, start_ns=MS // 10)
    ar = r1.collective(
        CommType.ALL_REDUCE, 1024, MS // 5, pg="0", start_ns=int(3.1 * MS), stream=1000, deps=(mm,)
    )
    r1.compute(wait, MS // 10, start_ns=int(3.2 * MS), deps=(ar,))
    assert _stuck(b, tmp_path / "run") == (
        f"rank 0 would wait at {wait} (node 3, stream 0) for all_reduce group '0' seq 0 (node 1) of stream "
        "1000, which rank(s) 1 would not have issued; rank 1 would wait at ckpt_write (node 2, stream 7) for "
        "all_gather group 'ckpt' seq 0 (node 1) of stream 7, which rank(s) 0 would not have issued"
    )


def test_a_broadcasts_receiver_waits_for_its_root_alone_so_a_later_member_holds_no_one(
    tmp_path: Path,
) -> None:
    # rank 1 receives rank 0's broadcast, then all-reduces with rank 2, which broadcasts only after that:
    # a receiver waits for the root's arrival, not rank 2's, and the root for no one, so every rank gets
    # through on one thread (waiting for every member's arrival, ranks 1 and 2 would wait for each other)
    b = RunBuilder(3, groups={"0": (0, 1, 2), "bc": (0, 1, 2), "p": (1, 2)})
    b.rank(0).step(0).collective(CommType.BROADCAST, 1024, MS, pg="bc", root=0, start_ns=0)
    r1 = b.rank(1).step(0)
    bc = r1.collective(CommType.BROADCAST, 1024, MS, pg="bc", root=0, start_ns=0)
    r1.compute("aten::add", MS // 10, deps=(bc,))
    ar = r1.collective(CommType.ALL_REDUCE, 1024, MS, pg="p")
    r1.compute("aten::add", MS // 10, deps=(ar,))
    r2 = b.rank(2).step(0)
    ar = r2.collective(CommType.ALL_REDUCE, 1024, 2 * MS, pg="p", start_ns=0)
    r2.compute("aten::add", MS // 10, deps=(ar,))
    bc = r2.collective(CommType.BROADCAST, 1024, MS, pg="bc", root=0)
    r2.compute("aten::add", MS // 10, deps=(bc,))
    assert _stuck(b, tmp_path / "run") is None


def test_an_eager_send_completes_without_its_receiver_so_a_collective_after_it_is_no_deadlock(
    tmp_path: Path,
) -> None:
    # rank 0's send ended before rank 1 posted the recv (eager: it waits for no one), and rank 0's next op
    # waits for it; rank 1 all-reduces with rank 0 before its recv: on one thread per rank both get through
    # (were the send to wait for the recv, rank 0 would never reach the all_reduce that rank 1 waits in)
    b = RunBuilder(2)
    r0 = b.rank(0).step(0)
    send = r0.send(1, 1024, MS // 10, start_ns=0)
    r0.compute("aten::add", MS // 2, deps=(send,))
    r0.collective(CommType.ALL_REDUCE, 1024, MS, start_ns=MS)
    r1 = b.rank(1).step(0)
    ar = r1.collective(CommType.ALL_REDUCE, 1024, 2 * MS, start_ns=0)
    r1.compute("aten::add", MS // 10, deps=(ar,))
    r1.recv(0, 1024, MS // 10, start_ns=3 * MS)
    assert _stuck(b, tmp_path / "run") is None


def test_a_gathers_root_arriving_last_in_a_pass_lets_a_member_waiting_for_it_go_on(tmp_path: Path) -> None:
    # rank 0 waits in a gather for its root, rank 1, which issues it only once its asynchronous all_reduce
    # with rank 2 is done, then waits there for rank 2; rank 2 all-reduces with rank 0 before it gathers.
    # The root's arrival alone lets rank 0 go on (to rank 2's all_reduce, and rank 2 to the gather): every
    # rank gets through, though in the play-out the root's issue is the only thing that moves at that turn
    b = RunBuilder(3, groups={"0": (0, 1, 2), "g": (0, 1, 2), "q": (0, 2), "r": (1, 2)})
    r0 = b.rank(0).step(0)
    ga = r0.collective(CommType.GATHER, 1024, 3 * MS, pg="g", root=1, start_ns=0)
    r0.compute("aten::add", MS // 10, deps=(ga,))
    q = r0.collective(CommType.ALL_REDUCE, 1024, MS // 10, pg="q", start_ns=4 * MS)
    r0.compute("aten::add", MS // 10, deps=(q,))
    r1 = b.rank(1).step(0)
    r = r1.collective(CommType.ALL_REDUCE, 1024, 2 * MS, pg="r", start_ns=0, stream=1000)
    r1.compute("aten::mm", MS, start_ns=MS // 10)
    ga = r1.collective(CommType.GATHER, 1024, 3 * MS, pg="g", root=1, start_ns=int(2.5 * MS), deps=(r,))
    r1.compute("aten::add", MS // 10, deps=(ga,))
    r2 = b.rank(2).step(0)
    r2.collective(CommType.ALL_REDUCE, 1024, MS // 10, pg="r", start_ns=2 * MS, stream=1000)
    q = r2.collective(CommType.ALL_REDUCE, 1024, 2 * MS, pg="q", start_ns=int(2.2 * MS))
    r2.compute("aten::add", MS // 10, deps=(q,))
    ga = r2.collective(CommType.GATHER, 1024, MS // 10, pg="g", root=1, start_ns=int(4.5 * MS))
    r2.compute("aten::add", MS // 10, deps=(ga,))
    assert _stuck(b, tmp_path / "run") is None


@pytest.mark.parametrize(
    ("stuck", "root", "kind"),
    [(0, 2, CommType.BROADCAST), (2, 0, CommType.BROADCAST), (2, 0, CommType.GATHER)],
    ids=["broadcast", "root-first", "gather"],
)
def test_a_deadlocked_broadcast_receiver_is_said_to_wait_for_its_root_not_for_every_member(
    tmp_path: Path, stuck: int, root: int, kind: CommType
) -> None:
    # rank 0 receives rank 2's broadcast (its thread waits in it), then all-reduces with rank 1 (group s)
    # and rank 2 (group q); ranks 1 and 2 all-reduce with it first (gloo's stream, their main threads wait)
    # and broadcast on another thread (stream 7) meanwhile. On one thread per rank rank 0 waits for the root,
    # rank 2, alone: rank 1's arrival would not let it go on, and the refusal names rank 2 only. Then ranks
    # 0 and 2 swapped: the root is the group's first member (waits_for 0, not every member), and rank 2,
    # member 1 of s and of q, is named by its rank, not its place in them. A gather's member waits for its
    # root alone too (the root, for every member: its own rule, not its member's)
    b = RunBuilder(3, groups={"0": (0, 1, 2), "bc": (0, 1, 2), "q": (0, 2), "s": tuple(sorted((stuck, 1)))})
    wait = sorted(WAIT_NODE_NAMES)[0]
    rs = b.rank(stuck).step(0)
    bc = rs.collective(kind, 1024, int(3.1 * MS), pg="bc", root=root, start_ns=0)
    rs.compute("aten::add", MS // 10, deps=(bc,))
    for g, at in (("s", 4 * MS), ("q", int(4.2 * MS))):
        c = rs.collective(CommType.ALL_REDUCE, 1024, MS // 10, pg=g, start_ns=at)
        rs.compute("aten::add", MS // 10, deps=(c,))
    for r, g, at in ((1, "s", MS // 5), (root, "q", MS // 2)):
        rb = b.rank(r).step(0)
        ar = rb.collective(CommType.ALL_REDUCE, 1024, int(4.3 * MS) - at, pg=g, start_ns=at, stream=1000)
        rb.compute(wait, int(4.3 * MS) - at, start_ns=at + MS // 10, deps=(ar,))
        bc_at = 2 * MS if r == 1 else 3 * MS
        rb.collective(kind, 1024, int(3.1 * MS) - bc_at, pg="bc", root=root, start_ns=bc_at, stream=7)
    said = {
        stuck: f"{kind.name.lower()} group 'bc' seq 0 (node 1) of stream 0, which rank(s) {root}",
        1: f"all_reduce group 's' seq 0 (node 1) of stream 1000, which rank(s) {stuck}",
        root: f"all_reduce group 'q' seq 0 (node 1) of stream 1000, which rank(s) {stuck}",
    }
    assert _stuck(b, tmp_path / "run") == "; ".join(
        f"rank {r} would wait for {said[r]} would not have issued" for r in sorted(said)
    )


def test_a_deadlock_of_four_ranks_names_each_and_no_more(tmp_path: Path) -> None:
    # ranks 0 and 1 cross groups a and b on one thread, ranks 2 and 3 groups c and d: four stuck ranks, each
    # named, and no "more" (that is for a fifth on)
    groups = {"0": (0, 1, 2, 3), "a": (0, 1), "b": (0, 1), "c": (2, 3), "d": (2, 3)}
    b = RunBuilder(4, groups=groups)
    for r, order in ((0, "ab"), (1, "ba"), (2, "cd"), (3, "dc")):
        for g in order:
            b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1024, MS, pg=g)
    stuck = _stuck(b, tmp_path / "run")
    assert stuck is not None
    assert [part.split(" would wait for all_reduce group ")[0] for part in stuck.split("; ")] == [
        "rank 0",
        "rank 1",
        "rank 2",
        "rank 3",
    ]


METRICS_THREAD_SCRIPT = """
import queue, threading, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
metrics_pg = dist.new_group(backend="gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mq, done = queue.Queue(), queue.Queue()

def metrics():  # a metrics thread: all-reduces each step's loss on a group of its own
    while (item := mq.get()) is not None:
        if rank == 1:
            time.sleep(0.02)  # rank 0's all_reduce waits 20 ms, while its main thread trains
        dist.all_reduce(torch.tensor([item, 1.0]), group=metrics_pg)
        done.put(1)

t = threading.Thread(target=metrics)
t.start()
for step in range(8):
    x = torch.randn(64, 256)
    for _ in range(3):
        y = model(x)
    loss = y.pow(2).mean()
    mq.put(float(loss.detach()))
    loss.backward()
    done.get()  # before the step's end (opt.step) on every rank: the capture's step window cuts none
    opt.step()
    opt.zero_grad()
mq.put(None)
t.join()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_captured_ddp_job_with_a_metrics_thread_in_the_same_order_on_every_rank_is_replayed(
    tmp_path: Path,
) -> None:
    # DDP's main thread waits for its gradient all_reduces and a metrics thread all-reduces on a group of
    # its own: two threads that wait for collectives, which one worker thread replays without a deadlock
    # where their order agrees across ranks (refusing every run with two such threads refused this one)
    run, proc = profile_script(tmp_path, METRICS_THREAD_SCRIPT, nproc=2, steps="1:1:6")
    assert proc.returncode == 0, proc.stderr[-2000:]
    captured = load_run(run)
    plans = {r: rank_plan(rt, captured, NO_EFFECTS) for r, rt in captured.ranks.items()}
    assert serial_deadlock(captured, plans) is None
    result = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    assert [(r.rank, len(r.replay_ns)) for r in result.ranks] == [(0, 6), (1, 6)]
    replayed = load_run(result.run_dir)
    assert sorted(replayed.process_groups[c.pg_name].ranks for c in replayed.collectives) == sorted(
        captured.process_groups[c.pg_name].ranks for c in captured.collectives
    )


@pytest.mark.slow
def test_replay_is_captured_by_the_profiler_with_the_same_communication(
    synthetic: Path, baseline: RealReplayResult
) -> None:
    orig, rep = load_run(synthetic), load_run(baseline.run_dir)
    assert rep.manifest.source == "replay" and rep.manifest.backend == "gloo"
    assert rep.manifest.notes["replay_of"] == str(synthetic.resolve())

    def shape(run: RunTrace) -> list[tuple[tuple[int, ...], CommType, tuple[int, ...]]]:
        # groups by members: c10d names the re-created groups itself ("1", "2"), in the recorded order
        return sorted(
            ((run.process_groups[c.pg_name].ranks, c.comm_type, c.comm_bytes) for c in run.collectives),
            key=lambda t: t[0],
        )

    assert shape(rep) == shape(orig)  # same groups, types, sizes, in the same per-group order
    assert len(rep.p2p) == len(orig.p2p) == 2 * STEPS
    assert sorted({(p.src_rank, p.dst_rank, p.comm_bytes) for p in rep.p2p}) == sorted(
        {(p.src_rank, p.dst_rank, p.comm_bytes) for p in orig.p2p}
    )
    off = rep.manifest.clock_offsets_ns  # back on the one clock the ranks share on this host:
    for c in rep.collectives:  # nobody finishes a collective before its last member arrived
        members = list(zip(c.ranks, c.rows, strict=True))
        arrivals = [int(rep.ranks[r].start_ns[row]) - off.get(r, 0) for r, row in members]
        ends = [int(rep.ranks[r].end_ns[row]) - off.get(r, 0) for r, row in members]
        assert min(ends) >= max(arrivals), (c.pg_name, c.seq)


@pytest.mark.slow
def test_torchrun_keeps_its_log_directory_in_the_replays_work_directory_not_the_systems_temporary_one(
    baseline: RealReplayResult,
) -> None:
    (launch,) = (baseline.out_dir / "real" / "work" / TORCHRUN_LOGS).iterdir()  # torchrun's run-id dir
    assert (launch / "attempt_0").is_dir()


def test_a_log_directory_the_caller_gives_torchrun_is_kept_and_not_given_twice(tmp_path: Path) -> None:
    mine = ["--nnodes", "2", "--log_dir=/shared/logs"]
    cmd = launcher_command(tmp_path, 4, mine, log_dir=tmp_path / "ours")
    assert [a for a in cmd if a.startswith("--log")] == ["--log_dir=/shared/logs"]
    cmd = launcher_command(tmp_path, 4, None, log_dir=tmp_path / "ours")
    assert cmd[cmd.index("--log-dir") + 1] == str(tmp_path / "ours")


@pytest.mark.slow
def test_workers_also_record_every_original_node_with_its_replayed_times(
    synthetic: Path, baseline: RealReplayResult
) -> None:
    orig = load_run(synthetic)
    aligned = load_run(baseline.out_dir / "real" / "replayed")
    assert aligned.manifest.source == "replay"
    for r, rt in orig.ranks.items():
        assert aligned.ranks[r].node_id.tolist() == rt.node_id.tolist()  # same nodes, in the same rows
    assert_the_workers_kept_their_plans(baseline.out_dir, sorted(orig.ranks))


@pytest.mark.slow
def test_communication_issued_inside_a_host_op_is_issued_during_it_by_the_workers(tmp_path: Path) -> None:
    # before, every all_gather was issued at its op's end (20 ms after the op began, 16 ms after its
    # recorded issue); the workers now issue it at its own ready time, 4 ms into the 20 ms op
    run_dir = _issued_inside_run(tmp_path / "run", 3)
    res = real_replay(run_dir=run_dir, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    replayed = load_run(res.out_dir / "real" / "replayed", match=False)
    for r in (0, 1):
        rt = replayed.ranks[r]
        start, end = rt.start_ns.tolist(), rt.end_ns.tolist()
        ops = [i for i in range(len(rt)) if rt.name(i) == "FSDP::all_gather (0)"]
        ags = [i for i in range(len(rt)) if rt.node_type[i] == NodeType.COMM_COLL]
        assert len(ops) == len(ags) == 3
        assert all(start[op] < start[ag] < end[op] for op, ag in zip(ops, ags, strict=True)), (r, start, end)
    assert_the_workers_kept_their_plans(res.out_dir, [0, 1])


@pytest.mark.slow
def test_a_delay_before_an_all_gather_issued_inside_a_host_op_holds_the_workers_next_op(
    tmp_path: Path,
) -> None:
    # 3 ms before each all_gather, FSDP::all_gather 1.5 times as long, on rank 0: on its own clock, each
    # c10d::wait starts at least 3 ms after its FSDP::all_gather ended (before, as soon as it ended), the
    # all_gather still issued inside the op
    slow = SlowdownModel(
        [
            Slowdown(kind="comm_delay", before="collective", ranks=(0,), delay_ns=3 * MS),
            Slowdown(kind="op", pattern="FSDP::*", ranks=(0,), factor=1.5),
        ]
    )
    run_dir = _issued_inside_run(tmp_path / "run", 3)
    res = real_replay(run_dir=run_dir, out_dir=tmp_path / "out", effects=slow, cfg=CFG)
    rt = load_run(res.out_dir / "real" / "replayed", match=False).ranks[0]
    start, end = rt.start_ns.tolist(), rt.end_ns.tolist()
    names = [rt.name(i) for i in range(len(rt))]
    ops = [i for i, n in enumerate(names) if n == "FSDP::all_gather (0)"]
    waits = [i for i, n in enumerate(names) if n == "c10d::wait"]
    ags = [i for i in range(len(rt)) if rt.node_type[i] == NodeType.COMM_COLL]
    assert len(ops) == len(waits) == len(ags) == 3
    assert all(start[op] < start[ag] < end[op] for op, ag in zip(ops, ags, strict=True)), (start, end)
    assert all(start[w] - end[op] >= 3 * MS for op, w in zip(ops, waits, strict=True)), (start, end)
    assert_the_workers_kept_their_plans(res.out_dir, [0, 1])


@pytest.mark.slow
def test_a_compute_slowdown_on_rank_2_is_replayed_as_the_longer_compute_the_simulator_replays(
    synthetic: Path,
) -> None:
    slow = RankFactor(2, 1.5)
    orig = load_run(synthetic)
    # simulated: rank 2's ~300 ms of compute a step runs 150 ms longer, less the 0.2 ms it started after
    # rank 0 (its recorded skew absorbs that much), and every rank waits for it at the all_reduce
    sim_base, sim_slow = simulate(orig).step_spans(), simulate(orig, effects=slow).step_spans()
    sim_delta = {r: _median_step(sim_slow, r) - _median_step(sim_base, r) for r in range(4)}
    assert sim_delta == dict.fromkeys(range(4), 149_800_000)
    # real: the workers are told to run rank 2's compute 1.5 times as long, and did
    slowed = real_replay(run_dir=synthetic, out_dir=synthetic.parent / "slow", effects=slow, cfg=CFG)
    assert all(len(r.replay_ns) == STEPS for r in slowed.ranks)
    for r, rt in orig.ranks.items():
        _warmup, ops = read_rank_plan(slowed.out_dir / "real" / "plan", r)
        computed = [(op.dur_ns, int(rt.dur_ns[op.row])) for op in ops if op.kind == KIND_COMPUTE]
        assert len(computed) == 2 * STEPS
        assert all(planned == round(recorded * (1.5 if r == 2 else 1.0)) for planned, recorded in computed)
    assert_the_workers_kept_their_plans(slowed.out_dir, sorted(orig.ranks))


def test_an_uneven_all_to_all_is_planned_with_every_members_bytes(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r, nbytes in ((0, 1200), (1, 2400)):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_TO_ALL, nbytes, MS)
    run = load_run(b.write(tmp_path / "run"))
    for r in (0, 1):
        ops = rank_plan(run.ranks[r], run, NO_EFFECTS)
        (op,) = [o for o in ops if o.comm_type == CommType.ALL_TO_ALL]
        assert op.member_bytes == (1200, 2400)


#: rows (8 B each) rank i sends to rank j of 3: rank 0 sends 280,000 B to the others and receives 1,608 B
A2A_ROWS = ((10, 30000, 5000), (200, 5, 7000), (1, 2, 3))


def _uneven_run(tmp_path: Path, rows: tuple[tuple[int, ...], ...], *, recorded: tuple[int, ...]) -> RunTrace:
    """An all_to_all of ``rows`` among len(rows) ranks; ``recorded``: the ranks that record their splits
    (the others sent and received equal parts, as the capture leaves them)."""
    p = len(rows)
    b = RunBuilder(p)
    for r in range(p):
        send = [k * 8 for k in rows[r]]
        recv = [rows[j][r] * 8 for j in range(p)]
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        if r in recorded:
            totals = (sum(send) - send[r], sum(recv) - recv[r])
            rb.collective(CommType.ALL_TO_ALL, sum(send), MS, peer_bytes=totals, peer_splits=(send, recv))
        else:
            rb.collective(CommType.ALL_TO_ALL, sum(send), MS)
    return load_run(b.write(tmp_path / "run"))


def _a2a_op(plans: dict[int, list[ReplayOp]], r: int) -> ReplayOp:
    (op,) = [o for o in plans[r] if o.comm_type == CommType.ALL_TO_ALL]
    return op


def test_an_uneven_all_to_all_is_planned_with_the_bytes_each_member_sends_to_each_other(
    tmp_path: Path,
) -> None:
    # before: each member sent equal parts of its bytes (rank 0 sent 186,720 B of its 280,000 B to the
    # others, rank 1 received 93,376 B of 240,016 B)
    run = _uneven_run(tmp_path, A2A_ROWS, recorded=(0, 1, 2))
    plans = all_to_all_splits(run, {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(3)})
    for r in range(3):
        op = _a2a_op(plans, r)
        assert op.send_splits == tuple(k * 8 for k in A2A_ROWS[r])
        assert op.recv_splits == tuple(A2A_ROWS[j][r] * 8 for j in range(3))
        assert op.dtype == "float32"
    assert sum(_a2a_op(plans, 0).send_splits[1:]) == 280_000
    assert sum(_a2a_op(plans, 1).recv_splits) - 40 == 240_016


def test_an_all_to_all_on_a_group_of_unsorted_ranks_reads_its_splits_in_that_groups_order(
    tmp_path: Path,
) -> None:
    # new_group([1, 0], sort_ranks=False): group rank 0 is global rank 1, and the capture records the split
    # lists in that order. Before, the store took a group's members sorted: a strict load (skewlens check,
    # analyze, replay) refused the run ("rank 0: node 2 ... has corrupt all_to_all splits: 40 B to the
    # others and 40 B from them at its place 0 in the group"), and a lenient one dropped the splits
    order = (1, 0)
    rows = {1: (10, 300), 0: (200, 5)}  # rows (8 B) each rank sends to group ranks 0 and 1
    b = RunBuilder(2, groups={"0": (0, 1), "rev": order})
    for r in order:
        g = order.index(r)
        send, recv = [k * 8 for k in rows[r]], [rows[q][g] * 8 for q in order]
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        totals = (sum(send) - send[g], sum(recv) - recv[g])
        rb.collective(
            CommType.ALL_TO_ALL, sum(send), MS, pg="rev", peer_bytes=totals, peer_splits=(send, recv)
        )
    run = load_run(b.write(tmp_path / "run"))
    (inst,) = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL]
    assert collective_pairs(run, inst) == ((0, 1, 1600), (1, 0, 2400))  # (sender, receiver, bytes)
    plans = all_to_all_splits(run, {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(2)})
    assert (_a2a_op(plans, 1).send_splits, _a2a_op(plans, 1).recv_splits) == ((80, 2400), (80, 1600))
    assert (_a2a_op(plans, 0).send_splits, _a2a_op(plans, 0).recv_splits) == ((1600, 40), (2400, 40))


def test_a_member_that_recorded_even_splits_is_given_equal_parts_beside_uneven_ones(tmp_path: Path) -> None:
    # rank 2 sends and receives 4 rows to and from everyone: the capture records no splits for it
    rows = ((1, 9, 4), (9, 1, 4), (4, 4, 4))
    run = _uneven_run(tmp_path, rows, recorded=(0, 1))
    plans = all_to_all_splits(run, {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(3)})
    assert _a2a_op(plans, 2).send_splits == _a2a_op(plans, 2).recv_splits == (32, 32, 32)
    assert _a2a_op(plans, 0).recv_splits == (8, 72, 32)


def test_a_member_with_even_splits_is_costed_by_the_parts_the_real_replay_issues(tmp_path: Path) -> None:
    # before: rank 2's 10 B in a group of 3 was issued as 3 B to each member (6 B through its port) but
    # costed as ⌈10 · 2/3⌉ = 7 B, so the simulated all_to_all was 11 B where the real one was 9 B
    b = RunBuilder(3)
    for r in range(3):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        if r == 2:
            rb.collective(CommType.ALL_TO_ALL, 10, MS)
        else:
            rb.collective(CommType.ALL_TO_ALL, 5, MS, peer_bytes=(4, 4), peer_splits=([1, 1, 3], [1, 1, 3]))
    run = load_run(b.write(tmp_path / "run"))
    plans = all_to_all_splits(run, {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(3)})
    assert _a2a_op(plans, 2).send_splits == _a2a_op(plans, 2).recv_splits == (3, 3, 3)
    port = max(
        max(sum(o.send_splits) - o.send_splits[r], sum(o.recv_splits) - o.recv_splits[r])
        for r, o in ((r, _a2a_op(plans, r)) for r in range(3))
    )
    (inst,) = [c for c in run.collectives if c.comm_type == CommType.ALL_TO_ALL]
    assert port == 6
    assert collective_bytes(run, inst) == -(-port * 3 // 2) == 9


def test_splits_that_are_not_whole_elements_move_as_bytes_on_every_member(tmp_path: Path) -> None:
    # 6 B is not a whole number of float32s: both members issue uint8, so the bytes stay as recorded
    b = RunBuilder(2)
    for r, (send, recv) in enumerate((([2, 6], [2, 10]), ([10, 2], [6, 2]))):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        totals = (sum(send) - send[r], sum(recv) - recv[r])
        rb.collective(CommType.ALL_TO_ALL, sum(send), MS, peer_bytes=totals, peer_splits=(send, recv))
    run = load_run(b.write(tmp_path / "run"))
    plans = all_to_all_splits(run, {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(2)})
    assert [(_a2a_op(plans, r).dtype, _a2a_op(plans, r).send_splits) for r in range(2)] == [
        ("uint8", (2, 6)),
        ("uint8", (10, 2)),
    ]


def test_splits_that_do_not_fit_the_group_or_each_other_are_refused_naming_the_node(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        # a group of 2, one size each
        rb.collective(CommType.ALL_TO_ALL, 24, MS, peer_bytes=(0, 0), peer_splits=([8], [8]))
    # lists that fit their totals (its own chunk only) but not the group: the store refuses them once the
    # collective is matched, before any plan
    with pytest.raises(TraceFormatError, match=r"rank-0\.et: rank 0: node \d+ .*1 entries for a group of 2"):
        load_run(b.write(tmp_path / "short"))
    b = RunBuilder(2)
    for r in range(2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        # an untrusted list is not kept beyond the job's size
        rb.collective(CommType.ALL_TO_ALL, 24, MS, peer_bytes=(16, 16), peer_splits=([8] * 10**6, [8, 8]))
    with pytest.raises(TraceFormatError, match=r"rank-0\.et: rank 0: node \d+ .* corrupt all_to_all splits"):
        load_run(b.write(tmp_path / "long"))  # the store refuses it
    rows = ((1, 9), (9, 1))
    run = _uneven_run(tmp_path / "mismatch", rows, recorded=(0, 1))
    plans = {r: rank_plan(run.ranks[r], run, NO_EFFECTS) for r in range(2)}
    k = plans[1].index(_a2a_op(plans, 1))
    plans[1][k] = replace(plans[1][k], recv_splits=(64, 8))  # rank 1 expects 64 B from rank 0
    with pytest.raises(ValidationError, match="rank 0 sends 72 B to rank 1, which receives 64 B from it"):
        all_to_all_splits(run, plans)


def test_rooted_collectives_are_planned_with_the_root_the_trace_names(tmp_path: Path) -> None:
    # every broadcast, reduce, gather and scatter was re-executed from the group's first rank
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        for ct in (CommType.BROADCAST, CommType.REDUCE, CommType.GATHER, CommType.SCATTER):
            rb.collective(ct, 4096, MS, root=1)
        rb.collective(CommType.BROADCAST, 4096, MS)  # a trace without roots
    run = load_run(b.write(tmp_path / "run"))
    ops = [o for o in rank_plan(run.ranks[0], run, NO_EFFECTS) if o.kind == "coll"]
    assert [o.root for o in ops] == [1, 1, 1, 1, -1]


class _StallEachStep(NoEffects):
    """A 5 ms stall before each step."""

    def stall_ns(self, rank: int, step: int) -> int:
        return 5 * MS


def test_a_steps_stall_delays_only_its_first_op(tmp_path: Path) -> None:
    # module docstring: ``stall_ns`` before the first node of a step (step 0 included), once per step
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    rb.compute("aten::mm", MS, start_ns=0)
    rb.compute("aten::add", MS)
    rb.step(1).compute("aten::mm", MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[0], run, _StallEachStep())
    assert [(o.name, o.step, o.delay_ns) for o in ops] == [
        ("aten::mm", 0, 5 * MS),
        ("aten::add", 0, 0),
        ("aten::mm", 1, 5 * MS),
    ]


def test_an_effects_that_subclasses_no_effects_is_simulated_with_the_waits_the_plan_replays(
    tmp_path: Path,
) -> None:
    # the simulator skipped the effects of any NoEffects (isinstance): _StallEachStep's 5 ms stalls were
    # replayed by the plan and simulated as no wait at all
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    rb.compute("aten::mm", MS, start_ns=0)
    rb.step(1).compute("aten::mm", MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[0], run, _StallEachStep())
    base, slow = simulate(run), simulate(run, effects=_StallEachStep())
    shift = (slow.start_ns[0] - base.start_ns[0]).tolist()
    assert [o.delay_ns for o in ops] == [5 * MS, 5 * MS]
    assert [shift[o.row] for o in ops] == [5 * MS, 10 * MS]  # each step's stall, after the one before


@dataclass(frozen=True)
class _Waits:
    """``stall`` ns before each step from step 1 on, ``delay`` ns before every ``aten::add`` (an ``Effects``
    of its own, not a ``NoEffects``: the simulator applies it)."""

    stall: int = 0
    delay: int = 0

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return 1.0

    def delay_before_ns(self, rank: int, step: int, node_type: NodeType, name: str) -> int:
        return self.delay if name == "aten::add" else 0

    def stall_ns(self, rank: int, step: int) -> int:
        return self.stall if step >= 1 else 0


def _kernel_of_the_next_step_run(path: Path) -> RunTrace:
    """Step 0's host op launches a kernel the GPU runs after step 1's first host op began (a capture tags
    a kernel with the step its GPU start falls in: step 1): launched before step 1, started after it."""
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    mm = rb.compute("aten::mm", 100_000, start_ns=1_000_000)
    rb.step(1)
    rb.compute("gemm_kernel", 100_000, start_ns=1_200_000, stream=7, deps=(mm,), launch_ns=1_050_000)
    rb.compute("aten::add", 10_000, start_ns=1_120_000)
    return load_run(b.write(path / "run"))


def test_a_steps_stall_is_planned_on_the_op_the_simulator_delays_not_on_a_kernel_launched_before_the_step(
    tmp_path: Path,
) -> None:
    # the plan put the stall on the step's first op in its order of issue, the kernel (ordered by its launch
    # call, in step 0), and held the host thread after the launch as long again: kernel and aten::add each
    # waited 5 ms, where the simulator delays aten::add alone (the step's earliest recorded start)
    run = _kernel_of_the_next_step_run(tmp_path)
    effects = _Waits(stall=5 * MS)
    ops = rank_plan(run.ranks[0], run, effects)
    base, slow = simulate(run), simulate(run, effects=effects)
    shift = (slow.start_ns[0] - base.start_ns[0]).tolist()
    assert [(o.name, o.delay_ns) for o in ops] == [("aten::mm", 0), ("gemm_kernel", 0), ("aten::add", 5 * MS)]
    assert [(o.name, shift[o.row]) for o in ops] == [(o.name, o.delay_ns) for o in ops]


@pytest.mark.parametrize(
    ("effects", "message"), [(_Waits(delay=-2 * MS), "delay"), (_Waits(stall=-MS), "stall")]
)
def test_a_negative_delay_or_stall_is_the_same_config_error_from_the_plan_as_from_the_simulator(
    tmp_path: Path, effects: _Waits, message: str
) -> None:
    # the plan waited 0 where a delay was negative (max(0, delay)) and the simulator refused it
    run = _kernel_of_the_next_step_run(tmp_path)
    with pytest.raises(ConfigError, match=message) as simulated:
        simulate(run, effects=effects)
    with pytest.raises(ConfigError) as planned:
        rank_plan(run.ranks[0], run, effects)
    assert str(planned.value) == str(simulated.value)
    assert "rank 0" in str(planned.value)


@dataclass(frozen=True)
class _Factor(_Waits):
    """Every compute op ``factor`` times as long."""

    factor: float = 1.0

    def compute_factor(self, rank: int, step: int, name: str, *, on_gpu: bool = False) -> float:
        return self.factor


@pytest.mark.parametrize("factor", [-1.0, float("inf"), float("nan")])
def test_a_compute_factor_that_is_negative_or_not_finite_is_the_same_config_error_from_the_plan_as_simulated(
    tmp_path: Path, factor: float
) -> None:
    # the plan raised its own ReplayError for 0 and nan, and an OverflowError traceback for inf (0 is an op
    # item's now: its ops' time taken away)
    run = _kernel_of_the_next_step_run(tmp_path)
    with pytest.raises(ConfigError, match="compute factor") as simulated:
        simulate(run, effects=_Factor(factor=factor))
    with pytest.raises(ConfigError) as planned:
        rank_plan(run.ranks[0], run, _Factor(factor=factor))
    assert str(planned.value) == str(simulated.value)


@pytest.mark.parametrize("factor", [2.5, 0.0])
def test_a_compute_factor_scales_the_planned_work_as_the_simulator_scales_it(
    tmp_path: Path, factor: float
) -> None:
    run = _kernel_of_the_next_step_run(tmp_path)
    ops = rank_plan(run.ranks[0], run, _Factor(factor=factor))
    res = simulate(run, effects=_Factor(factor=factor))
    assert [o.dur_ns for o in ops] == [round(d * factor) for d in (100_000, 100_000, 10_000)]
    assert [o.dur_ns for o in ops] == [int(res.end_ns[0][o.row] - res.start_ns[0][o.row]) for o in ops]


def test_communication_a_wait_node_waits_for_next_is_re_issued_as_a_blocking_call(tmp_path: Path) -> None:
    # the wait node does not start after the collective (no start edge): it blocks on it (wait_deps), so
    # the collective's completion is what the very next op waits for: a blocking call
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        ar = rb.collective(CommType.ALL_REDUCE, 1024, 10 * MS, start_ns=0, stream=1000)
        rb.compute(sorted(WAIT_NODE_NAMES)[0], 10 * MS, start_ns=MS, deps=(ar,))
    run = load_run(b.write(tmp_path / "run"))
    coll, wait = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert (wait.deps, wait.wait_deps) == ((), (coll.row,))
    assert coll.blocking


def test_a_kernel_is_planned_at_its_launch_call_after_host_ops_that_started_before_it(tmp_path: Path) -> None:
    # aten::mm starts at 10 ms and launches the kernel at 15 ms (5 ms into it); aten::add starts at 13 ms on
    # another thread: ordered by launch call, the kernel (15 ms) comes after aten::add (13 ms)
    b = RunBuilder(1)
    rb = b.rank(0).step(0)
    mm = rb.compute("aten::mm", 10 * MS, start_ns=10 * MS)
    rb.compute("aten::add", MS, start_ns=13 * MS, stream=1)
    rb.compute("gemm_kernel", 2 * MS, start_ns=20 * MS, stream=7, deps=(mm,), launch_ns=15 * MS)
    run = load_run(b.write(tmp_path / "run"))
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    assert [(o.name, o.gpu) for o in ops] == [
        ("aten::mm", False),
        ("aten::add", False),
        ("gemm_kernel", True),
    ]


def test_a_send_and_a_recv_are_planned_with_the_other_side_as_their_peer(tmp_path: Path) -> None:
    # ReplayOp.peer: the global rank of the other side (rank 0 sends 4 KiB to rank 2, which receives it)
    b = RunBuilder(3)
    b.rank(0).step(0).send(2, 4096, MS, tag=3)
    b.rank(1).step(0).compute("aten::mm", MS)
    b.rank(2).step(0).recv(0, 4096, MS, tag=3)
    run = load_run(b.write(tmp_path / "run"))
    (send,) = rank_plan(run.ranks[0], run, NO_EFFECTS)
    (recv,) = rank_plan(run.ranks[2], run, NO_EFFECTS)
    assert (send.kind, send.peer, send.tag) == ("send", 2, 3)
    assert (recv.kind, recv.peer, recv.tag) == ("recv", 0, 3)


def test_step_spans_run_from_a_steps_first_start_to_its_last_end_and_a_trace_without_marks_is_one_step(
    tmp_path: Path,
) -> None:
    b = RunBuilder(1)
    rb = b.rank(0)
    rb.compute("setup", MS, start_ns=0)  # no step: not a step beside steps 0 and 1
    rb.step(0).compute("aten::mm", 10 * MS, start_ns=2 * MS)
    rb.compute("aten::add", MS, start_ns=4 * MS, stream=1)  # ends at 5 ms, before aten::mm (12 ms)
    rb.step(1).compute("aten::mm", 3 * MS, start_ns=20 * MS)
    marked = load_run(b.write(tmp_path / "marked"), match=False).ranks[0]
    assert step_spans(marked) == {0: (2 * MS, 12 * MS), 1: (20 * MS, 23 * MS)}
    b = RunBuilder(1)
    b.rank(0).compute("aten::mm", 4 * MS, start_ns=MS)
    plain = load_run(b.write(tmp_path / "plain"), match=False).ranks[0]
    assert step_spans(plain) == {-1: (MS, 5 * MS)}  # RankStepTimes.steps: -1, the whole trace one step


def test_step_times_pair_steps_in_order_and_average_over_every_step() -> None:
    # the replay's capture counts from 0, the original from 5; the replayed dict is not in step order
    t = rank_step_times(0, {5: (0, 10), 6: (10, 30)}, {1: (100, 160), 0: (0, 30)})
    assert (t.steps, t.original_ns, t.replay_ns) == ((5, 6), (10, 20), (30, 60))
    assert (t.original_mean_ns, t.replay_mean_ns) == (15, 45)  # (10 + 20) / 2, (30 + 60) / 2


def test_a_mean_step_time_is_rounded_to_the_nearest_ns_not_down() -> None:
    t = RankStepTimes(rank=0, steps=(0, 1, 2), original_ns=(1, 2, 2), replay_ns=(10, 10, 11))
    assert (t.original_mean_ns, t.replay_mean_ns) == (2, 10)  # 1.67 and 10.33 ns


def test_the_warm_up_runs_one_op_per_group_type_and_size_and_each_ranks_own_side_of_a_send(
    tmp_path: Path,
) -> None:
    # warmup_ops: one op per distinct communication shape (group, type, bytes; for p2p the pair and tag):
    # two all_reduces of 1 KiB and one of 2 KiB warm up twice; rank 0's send and rank 1's recv each warm
    # up their own op (rank 0 has a compute before its send: its rows are not rank 1's)
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        if r == 0:
            rb.compute("aten::mm", MS)
        for nbytes in (1024, 1024, 2048):
            rb.collective(CommType.ALL_REDUCE, nbytes, MS)
    b.rank(0).send(1, 512, MS)
    b.rank(1).recv(0, 512, MS)
    run = load_run(b.write(tmp_path / "run"))
    for r, p2p in ((0, "send"), (1, "recv")):
        ops = rank_plan(run.ranks[r], run, NO_EFFECTS)
        warm = warmup_ops(run, r, ops)
        assert [(o.kind, o.comm_bytes) for o in warm] == [("coll", 1024), ("coll", 2048), (p2p, 512)]


@pytest.mark.slow
def test_a_broadcast_and_a_gather_rooted_at_rank_1_are_re_executed_from_rank_1(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in (0, 1):
        for s in range(2):
            rb = b.rank(r).step(s)
            rb.compute("aten::mm", MS)
            rb.collective(CommType.BROADCAST, 1 << 16, MS, root=1)
            rb.collective(CommType.GATHER, 1 << 16, MS, root=1)
    run = b.write(tmp_path / "run")
    res = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    assert all(len(r.replay_ns) == 2 for r in res.ranks)
    for r in (0, 1):
        _warmup, ops = read_rank_plan(res.out_dir / "real" / "plan", r)
        assert {o.root for o in ops if o.kind == "coll"} == {1}


@pytest.mark.slow
def test_an_all_to_all_whose_members_send_unequal_amounts_is_re_executed(tmp_path: Path) -> None:
    # all_to_all_single with uneven splits: rank 0 sent 1200 B, rank 1 2400 B; each rank split its own
    # bytes equally and expected as much from the other, and gloo reset the connection
    b = RunBuilder(2)
    for r, nbytes in ((0, 1200), (1, 2400)):
        for s in range(2):
            rb = b.rank(r).step(s)
            rb.compute("aten::mm", MS)
            rb.collective(CommType.ALL_TO_ALL, nbytes, MS)
    run = b.write(tmp_path / "run")
    res = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    assert all(len(r.replay_ns) == 2 for r in res.ranks)
    assert _no_replay_processes_left() == []


@pytest.mark.slow
def test_a_replay_started_with_torch_distributed_debug_at_detail_runs_its_ranks_at_info_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # an engineer who keeps TORCH_DISTRIBUTED_DEBUG=DETAIL on. Before: 'real replay failed: rank 0: profiler
    # start-up: CaptureError: TORCH_DISTRIBUTED_DEBUG=DETAIL (this process's torch.distributed debug level):
    # ...; unset TORCH_DISTRIBUTED_DEBUG or set it to INFO for a capture', after the workers had started
    b = RunBuilder(2)
    for r in range(2):
        for s in range(2):
            rb = b.rank(r).step(s)
            rb.compute("aten::mm", MS)
            rb.collective(CommType.ALL_REDUCE, 4096, MS)
    run = b.write(tmp_path / "run")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    res = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    assert [len(r.replay_ns) for r in res.ranks] == [2, 2]
    said = capsys.readouterr().err
    assert "skewlens replay: warning: TORCH_DISTRIBUTED_DEBUG=DETAIL: the replay's ranks run at INFO" in said


def test_the_replays_workers_run_a_debug_level_of_detail_at_info_and_any_other_as_it_is() -> None:
    env, said = worker_env({"TORCH_DISTRIBUTED_DEBUG": " detail", "OMP_NUM_THREADS": "4"})
    assert (env["TORCH_DISTRIBUTED_DEBUG"], env["OMP_NUM_THREADS"]) == ("INFO", "4")
    assert said.startswith("TORCH_DISTRIBUTED_DEBUG= detail: the replay's ranks run at INFO")
    for level in ("INFO", "OFF"):
        assert worker_env({"TORCH_DISTRIBUTED_DEBUG": level}) == (
            {"TORCH_DISTRIBUTED_DEBUG": level, "OMP_NUM_THREADS": "1"},
            "",
        )


@pytest.mark.slow
def test_deadlocked_collectives_abort_every_rank_within_the_timeout_with_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ranks are in groups "a" and "b"; rank 0 calls a then b, rank 1 b then a. Every (group, seq)
    # matches, so the store's checks pass, but the real collectives wait for each other for ever. The
    # plan's deadlock check refuses this run up front; here it is left out, so that the watchdog is tested
    # on a deadlock it would not foresee
    monkeypatch.setattr("skewlens.replay.real.api.serial_deadlock", lambda *_a: None)
    b = RunBuilder(2, groups={"0": (0, 1), "a": (0, 1), "b": (0, 1)})
    for r, order in ((0, ("a", "b")), (1, ("b", "a"))):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        for g in order:
            rb.collective(CommType.ALL_REDUCE, 1024, MS, pg=g)
    run = b.write(tmp_path / "run")
    t0 = time.monotonic()
    with pytest.raises(ReplayTimeoutError) as err:
        real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=RealConfig(timeout_s=3.0))
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert "\n" not in msg
    assert any(f"rank {r}: all_reduce on group '{g}' seq 0" in msg for r, g in ((0, "a"), (1, "b"))), msg
    assert "did not complete within 3 s" in msg
    assert elapsed < 3.0 + 45  # start-up of two torch processes on a loaded machine + the timeout
    assert _no_replay_processes_left() == []


def test_the_parent_side_of_real_replay_does_not_import_torch() -> None:
    code = (
        "import sys; import skewlens.replay.real.api, skewlens.replay.real.render; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_a_captured_four_rank_run_of_the_example_replays_every_rank_and_step_as_planned(
    tmp_path: Path,
) -> None:
    if not EXAMPLE.is_file() or importlib.util.find_spec("skewlens.cli.profile") is None:
        pytest.skip("capture (profiler/cli_profile.py, examples/train.py) is not available")
    run = tmp_path / "captured"
    res = profile(run, "--steps", "10", steps="1:1:8", nproc=4)
    assert res.returncode == 0, res.stderr[-2000:]
    result = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    captured = load_run(run)
    assert [r.rank for r in result.ranks] == [0, 1, 2, 3]
    for r in result.ranks:  # the original step times are the capture's, step for step
        spans = step_spans(captured.ranks[r.rank])
        assert len(r.steps) == len(r.replay_ns) == 8
        assert r.original_ns == tuple(spans[s][1] - spans[s][0] for s in sorted(spans))
    assert_the_workers_kept_their_plans(result.out_dir, [0, 1, 2, 3])
    assert _no_replay_processes_left() == []


def test_a_group_the_nodes_name_but_no_record_describes_is_re_created_with_its_members(
    tmp_path: Path,
) -> None:
    # a capture saved after its program destroyed its groups listed only group '0': the workers were
    # given no group '1' and failed with "KeyError: '1'"
    b = RunBuilder(3, {"0": (0, 1, 2), "1": (1, 2)})
    for r in (0, 1, 2):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        if r > 0:
            rb.collective(CommType.ALL_REDUCE, 4096, MS, pg="1")
        rb.collective(CommType.ALL_REDUCE, 4096, MS)
    b.groups = {"0": (0, 1, 2)}  # written without group '1'
    run = load_run(b.write(tmp_path / "run"))
    assert "1" not in run.process_groups
    default, groups = group_specs(run)
    assert default == "0"
    assert [(g.name, g.ranks) for g in groups] == [("1", (1, 2))]


def _one_all_reduce(run: Path, world: int = 2) -> Path:
    """A run where every rank all-reduces 1 KiB once, written to ``run``."""
    b = RunBuilder(world)
    for r in range(world):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1024, MS)
    return b.write(run)


def _real_cfg(mode: str, run: Path, out: Path) -> ReplayConfig:
    """The replay config of ``skewlens replay mode=<mode> trace=<run> out=<out> progress=false``."""
    from test_scale import compose_replay

    cfg = compose_replay(f"mode={mode}")
    cfg.trace, cfg.out, cfg.progress = str(run), str(out), False
    return cfg


@pytest.mark.parametrize("lost", ["file gone", "never saved", "a gap without a manifest"])
def test_a_rank_without_a_trace_is_refused_before_loading_naming_the_simulated_replay_that_replays_the_rest(
    tmp_path: Path, lost: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the manifest lists rank 1 but its file is gone: the refusal was the loader's seven problems ending in
    # "lenient=true would ... leave out the unreadable rank(s) 1", which mode=real then refused too (a real
    # replay cannot go on without a rank); then only "rank 1 of 3 has no trace", naming no way to an answer
    from skewlens.cli import main as skewlens_main

    b = RunBuilder(3)
    for r in (0, 2) if lost == "never saved" else range(3):  # a rank that saved none: the manifest says so
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1024, MS)
    run = b.write(tmp_path / "run")
    if lost != "never saved":
        (run / "rank-1.et").unlink()
    if lost == "a gap without a manifest":
        (run / "manifest.json").unlink()
    way = {"file gone": ["mode=sim", "lenient=true"], "never saved": ["mode=sim"]}.get(lost, [])
    argv = ["replay", f"trace={run}", f"out={tmp_path / 'out'}", "progress=false"]
    assert skewlens_main([*argv, "mode=real"]) == 2
    rest = f"; the simulated replay ({' '.join(way)}) replays the traced ranks" if way else ""
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"skewlens replay: error: {run}: cannot replay on real processes: rank 1 of 3 has no trace{rest}"
    )
    # what it names replays ranks 0 and 2; a gap without a manifest, for which it names none, no replay loads
    assert skewlens_main([*argv, *(way or ["mode=sim", "lenient=true"])]) == (0 if way else 2)


def test_a_run_whose_communication_matches_no_other_rank_is_refused_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # DDP under Join, rank 1 out of batches after step 0: its (partial) trace ends there, and rank 0's step-1
    # all_reduce is left out of matching (step 1 incomplete). Before, the real replay issued it on rank 0 and
    # waited for rank 1 until real.timeout_s (60 s on a 2-rank Join capture), then failed naming rank 1's exit
    import dataclasses

    from skewlens.cli import main as skewlens_main
    from skewlens.profiler.manifest import PARTIAL_TRACE_NOTE, read_manifest, write_manifest

    b = RunBuilder(2)
    for step in (0, 1):
        for r in (0, 1) if step == 0 else (0,):
            rb = b.rank(r).step(step)
            rb.compute("fwd", MS)
            rb.collective(CommType.ALL_REDUCE, 1024, MS)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    write_manifest(run, dataclasses.replace(m, notes={**m.notes, "rank 1": f"{PARTIAL_TRACE_NOTE}: 1 of 2"}))
    assert load_run(run).incomplete_steps == (1,)
    out = tmp_path / "out"
    assert skewlens_main(["replay", "mode=real", f"trace={run}", f"out={out}", "progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"skewlens replay: error: {run}: cannot replay on real processes: 1 communication node(s) match no "
        "other rank (incomplete steps 1), first rank 0's c10d::all_reduce_ (node 4, group '0' seq 1, step "
        "1): re-issued, each would wait for peers that never issue it; the simulated replay (mode=sim) "
        "replays them like compute (skewlens check says why they were left out of matching)"
    )
    assert not out.exists() and _no_replay_processes_left() == []
    assert (
        skewlens_main(["replay", f"trace={run}", f"out={out}", "progress=false"]) == 0
    )  # mode=sim replays it


def test_the_refusal_counts_each_ranks_unmatched_communication_and_names_the_lowest_ranks_first_node(
    tmp_path: Path,
) -> None:
    # a lenient load of partial traces that disagree past step 0: rank 0's two all_reduces of step 1 and rank
    # 1's of step 2 match nothing (3); step 0's send and recv matched each other, so neither end is counted
    import dataclasses

    from skewlens.profiler.manifest import PARTIAL_TRACE_NOTE, read_manifest, write_manifest
    from skewlens.replay.driver import check_real_matched
    from skewlens.replay.errors import ConfigError

    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("fwd", MS)
        _ = rb.send(1, 4096, MS) if r == 0 else rb.recv(0, 4096, MS)
        rb.collective(CommType.ALL_REDUCE, 1024, MS)
    assert check_real_matched(load_run(b.write(tmp_path / "matched"))) is None
    r0, r1 = b.rank(0).step(1), b.rank(1).step(2)
    r0.compute("fwd", MS)
    r0.collective(CommType.ALL_REDUCE, 1024, MS)
    r0.collective(CommType.ALL_REDUCE, 2048, MS)
    r1.compute("fwd", MS)
    r1.collective(CommType.ALL_REDUCE, 1024, MS)
    path = b.write(tmp_path / "run")
    m = read_manifest(path)
    partial = {f"rank {r}": f"{PARTIAL_TRACE_NOTE}: 1 of 2" for r in (0, 1)}
    write_manifest(path, dataclasses.replace(m, notes={**m.notes, **partial}))
    run = load_run(path, lenient=True)
    assert run.incomplete_steps == (2,)
    with pytest.raises(ConfigError) as e:
        check_real_matched(run)
    assert str(e.value).startswith(
        f"{run.run_dir}: cannot replay on real processes: 3 communication node(s) match no other rank "
        "(incomplete steps 2), first rank 0's c10d::all_reduce_ (node 5, group '0' seq 1, step 1): "
    )


def test_a_timeout_shorter_than_the_longest_collective_is_refused_naming_the_key_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 1 arrives 1.2 s late at the all_reduce: rank 0's call is in flight 1.2 s + 1 ms. With
    # real.timeout_s=0.5 the workers' watchdog stopped the replay at that op, after starting every process.
    from skewlens.cli import main as skewlens_main
    from skewlens.replay.driver import replay_run
    from skewlens.replay.errors import ConfigError

    b = RunBuilder(2)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 1024, 1_200 * MS + MS, start_ns=0)
    b.rank(1).step(0).compute("aten::mm", 1_200 * MS, start_ns=0)
    b.rank(1).collective(CommType.ALL_REDUCE, 1024, MS, start_ns=1_200 * MS)
    run = b.write(tmp_path / "run")
    out = tmp_path / "out"
    cfg = _real_cfg("real", run, out)
    cfg.real.timeout_s = 0.5
    with pytest.raises(ConfigError) as e:
        replay_run(cfg, out)
    assert str(e.value).startswith(
        "real.timeout_s=0.5: rank 0's c10d::all_reduce_ (node 1, group '0' seq 0) is in flight 1.2 s as "
        "recorded, the run's longest communication op"
    )
    assert str(e.value).endswith("give real.timeout_s=2.5 or more")
    # a stall that makes rank 0 wait longer than the timeout, on a run that fits it, is named as simulated
    cfg.real.timeout_s = 1.5
    cfg.slowdown = compose_replay_slowdown("slowdown=stall", "slowdown.rank=1", "slowdown.delay_ms=900")
    with pytest.raises(
        ConfigError, match=r"in flight 2\.1 s in the simulated replay of these slowdowns \(1\.2 s as"
    ):
        replay_run(cfg, out)
    args = ["replay", "mode=real", f"trace={run}", f"out={out}", "real.timeout_s=0.5", "progress=false"]
    assert skewlens_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "real.timeout_s=0.5: rank 0's c10d::all_reduce_" in err[0]
    assert not out.exists() and _no_replay_processes_left() == []
    # a modelled network times transfers the real replay does not make: the recorded in-flight time counts
    from skewlens.replay.driver import check_real_timeout
    from skewlens.replay.network.topology import Dimension, Topology

    loaded = load_run(run)
    slow = Topology(name="slow", dims=(Dimension(kind="switch", size=0, bandwidth_gbps=1e-6, latency_ns=0),))
    modelled = simulate(loaded, comm_mode="model", topology=slow)
    assert int(modelled.coll_end_ns[0] - modelled.coll_arrival_ns[0]) > 1_000_000_000  # 1 KiB at 1 kB/s
    check_real_timeout(loaded, None, 1.5)
    with pytest.raises(ConfigError, match=r"real\.timeout_s=1\.1: .* in flight 1\.2 s as recorded"):
        check_real_timeout(loaded, None, 1.1)


def compose_replay_slowdown(*overrides: str) -> SlowdownConfig:
    from test_scale import compose_replay

    return compose_replay(*overrides).slowdown


def test_communication_that_disagrees_is_refused_in_mode_real_without_suggesting_lenient(
    tmp_path: Path,
) -> None:
    from skewlens.replay.driver import replay_run

    b = RunBuilder(2)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 1024, MS)
    b.rank(1).step(0).collective(CommType.BROADCAST, 1024, MS)
    run = b.write(tmp_path / "run")
    for mode, suggested in (("sim", True), ("real", False)):
        with pytest.raises(ValidationError) as e:
            replay_run(_real_cfg(mode, run, tmp_path / "out"), tmp_path / "out")
        assert ("lenient=true" in str(e.value)) is suggested


def test_sigterm_during_a_real_replay_stops_its_processes_and_leaves_no_half_written_outputs(
    tmp_path: Path, sleepers: _Sleepers
) -> None:
    # SIGTERM (timeout, kill) killed the parent where it stood: a '.out.*.tmp' staging directory beside OUT
    # and the new replay's half-written run/ and real/ stayed; an earlier replay's real/ was kept even after
    # a Ctrl-C, as its own entries (plan, replayed, work) had not changed while the new plan replaced theirs
    run = _one_all_reduce(tmp_path / "run")
    out = tmp_path / "out"
    for d in ("real/plan", "real/work", "real/replayed", "run"):
        (out / d).mkdir(parents=True)
    (out / "real" / "plan" / "meta.json").write_text("{}")  # an earlier real replay's
    (out / "config.yaml").write_text("earlier: true\n")
    parent = (
        "import sys\nimport skewlens.replay.real.api as api\nfrom skewlens.cli import main\n"
        "real = api.run_workers\n"
        f"api.run_workers = lambda cmd, **kw: real([sys.executable, '-c', {sleepers.launcher!r}], **kw)\n"
        f"sys.exit(main(['replay', 'mode=real', 'trace={run}', 'out={out}', 'progress=false']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stderr=subprocess.PIPE)
    assert sleepers.wait_for_both(timeout_s=60) == 2
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode().strip().splitlines()[-1]) == (130, "skewlens replay: interrupted")
    assert sleepers.alive() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no staging directory
    # the new replay was staged in a directory of its own: the earlier one's run/ and real/ are as they were
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "real", "run"]
    assert (out / "real" / "plan" / "meta.json").read_text() == "{}"
    assert (out / "config.yaml").read_text() == "earlier: true\n"


@pytest.mark.slow
def test_sigkill_of_a_real_replay_stops_its_workers_within_seconds(tmp_path: Path) -> None:
    # SIGKILL reached the `skewlens replay` process alone: torchrun, in a session of its own, and its
    # workers ran the whole replay on (the demo's 2-rank run with a 30 s stall: 2 workers and torchrun for
    # 30 s more); each worker now exits once the process supervising its launcher is gone
    run, out = _one_all_reduce(tmp_path / "run"), tmp_path / "out"
    cmd = [
        sys.executable, "-m", "skewlens", "replay", "mode=real", f"trace={run}", f"out={out}",
        "progress=false", "slowdown=stall", "slowdown.delay_ms=60000", "real.timeout_s=180",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_end = time.monotonic() + 120
    replaying: list[str] = []
    while len(replaying) < 2 and time.monotonic() < t_end and proc.poll() is None:
        time.sleep(0.2)
        replaying = [
            f.name
            for f in out.glob(".out.*.tmp/real/work/rank-*.progress.json")
            if '"phase": "replay"' in f.read_text()
        ]
    assert len(replaying) == 2, f"the workers did not reach their replay (exit {proc.poll()})"
    proc.kill()
    proc.wait(timeout=30)
    t_end = time.monotonic() + 20  # the stall has a minute to go
    while (left := _no_replay_processes_left()) and time.monotonic() < t_end:
        time.sleep(0.2)
    assert left == []


def test_a_real_replay_from_python_interrupted_while_its_ranks_run_leaves_out_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # replay_run wrote into OUT in place: Ctrl-C while the ranks ran left OUT/real/plan and OUT/real/work,
    # and the new simulated files beside an earlier replay's run/ (the CLI stages them; Python did not)
    from skewlens.replay.driver import replay_run
    from skewlens.replay.real import api

    def interrupted(cmd: list[str], **kw: Any) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the launcher runs

    monkeypatch.setattr(api, "run_workers", interrupted)
    run, out = _one_all_reduce(tmp_path / "run"), tmp_path / "out"
    (out / "run").mkdir(parents=True)
    (out / "run" / "manifest.json").write_text("{}")  # an earlier real replay's
    (out / "summary.parquet").write_text("earlier")
    with pytest.raises(KeyboardInterrupt):
        replay_run(_real_cfg("real", run, out), out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "run",
        "run/manifest.json",
        "summary.parquet",
    ]
    assert (out / "summary.parquet").read_text() == "earlier"
    with pytest.raises(KeyboardInterrupt):  # into an OUT that is not there: none is left made
        replay_run(_real_cfg("real", run, tmp_path / "new" / "out"), tmp_path / "new" / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


@pytest.mark.parametrize("earlier", [(), ("run", "real/plan", "real/work")])
def test_a_failed_real_replay_across_hosts_from_python_removes_the_run_and_real_it_began_in_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, earlier: tuple[str, ...]
) -> None:
    # across hosts every host writes OUT/run and OUT/real in place: skewlens replay removed what a failed
    # one began, replay_run from Python left OUT/real/plan (the new plan, for 2 ranks) beside the earlier
    # replay's files. Into an earlier replay's run/ and real/ it writes its plan inside them, leaving
    # real/'s own entries (so its time) as they were: its new plan tells it began, and neither is left
    # holding half of each
    from skewlens.replay.driver import replay_run
    from skewlens.replay.real import api

    def failed(cmd: list[str], **kw: Any) -> None:
        raise ReplayError("real replay: the launcher exited with code 1")  # a worker that exited 1

    monkeypatch.setattr(api, "run_workers", failed)
    run, out = _one_all_reduce(tmp_path / "run"), tmp_path / "out"
    out.mkdir()
    for d in earlier:
        (out / d).mkdir(parents=True)
        (out / d / "meta.json").write_text("{}")
    (out / "summary.parquet").write_text("earlier")
    cfg = _real_cfg("real", run, out)
    across = ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29500"]
    cfg = replace(cfg, real=replace(cfg.real, nproc=1, launcher_args=across))
    with pytest.raises(ReplayError, match="exited with code 1"):
        replay_run(cfg, out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["summary.parquet"]
    assert (out / "summary.parquet").read_text() == "earlier"


def test_a_failed_simulated_replay_leaves_an_earlier_real_replays_run_and_real_in_out_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no real replay began (no new plan): the earlier one's run/ and real/ are not this replay's to remove
    import skewlens.replay.driver as driver

    def interrupted(*_a: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "_replay_into", interrupted)
    run, out = _one_all_reduce(tmp_path / "run"), tmp_path / "out"
    for d in ("run", "real/plan", "real/work"):
        (out / d).mkdir(parents=True)
    (out / "real" / "plan" / "meta.json").write_text("{}")
    (out / "run" / "manifest.json").write_text("{}")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(KeyboardInterrupt):
        driver.replay_run(_real_cfg("sim", run, out), out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert (out / "real" / "plan" / "meta.json").read_text() == "{}"


def test_a_simulated_replay_from_python_removes_an_earlier_real_replays_run_and_real_from_out(
    tmp_path: Path,
) -> None:
    # as skewlens replay does: the real replay's run/ and real/ beside the new simulated files would be
    # taken for this replay's
    from skewlens.replay.driver import replay_run

    run, out = _one_all_reduce(tmp_path / "run"), tmp_path / "out"
    for earlier in ("run", "real", "real-failed"):
        (out / earlier).mkdir(parents=True)
        (out / earlier / "meta.json").write_text("{}")
    replay_run(_real_cfg("sim", run, out), out)
    assert sorted(p.name for p in out.iterdir()) == ["summary.parquet", "timeline.json", "timeline.parquet"]


@pytest.mark.slow
def test_a_failed_real_replay_leaves_the_earlier_one_in_out_as_it_was_and_keeps_the_log_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the failed replay wrote into OUT/run and OUT/real and then removed them: the earlier real replay's
    # were gone while its timeline.parquet, summary.parquet and config.yaml stayed, and the error named a
    # launcher log under OUT/real/work that no longer existed
    from skewlens.cli import main as skewlens_main

    run = _one_all_reduce(tmp_path / "run")
    out = tmp_path / "out"
    args = ["replay", "mode=real", f"trace={run}", f"out={out}", "progress=false", "real.timeout_s=20"]
    assert skewlens_main(args) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert skewlens_main([*args, "real.launcher_args=[--bogus]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("skewlens replay: error: real replay: the launcher exited with code 2; log ")
    log = Path(err.split("; log ", 1)[1].split(": ", 1)[0])
    assert log.parent == out / "real-failed"
    assert "unrecognized arguments: --bogus" in log.read_text()
    assert {
        p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.parent != log.parent
    } == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no staging directory
    assert skewlens_main(args) == 0  # a replay that succeeds removes the earlier failure's logs
    assert not (out / "real-failed").exists()


def test_an_infinite_timeout_is_refused_naming_the_key_before_any_process_starts() -> None:
    # inf passed "> 0": every worker started, then refused its plan (JSON has no Infinity), and the user read
    # "the launcher exited with code 1"; the config refuses it when it is made (the api checks it no more)
    from skewlens.replay.errors import ConfigError

    with pytest.raises(ConfigError, match=r"real\.timeout_s: must be a finite number > 0, got inf"):
        RealConfig(timeout_s=float("inf"))


def test_more_ranks_than_the_hosts_memory_holds_are_refused_before_any_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 64-rank trace started 64 torch processes (236 MiB each measured: 15 GiB) whatever the host had
    import skewlens.replay.real.api as api
    from skewlens.replay.errors import ReplayError

    run = _one_all_reduce(tmp_path / "run", 64)
    monkeypatch.setattr(api, "_available_memory", lambda: 8 * 2**30)
    with pytest.raises(
        ReplayError, match=r"64 ranks on this host need about 15\.0 GiB .* 8\.0 GiB is available"
    ):
        api.preflight(run, CFG)
    monkeypatch.setattr(api, "_available_memory", lambda: 16 * 2**30)
    assert api.preflight(run, CFG) == "gloo"


def _without_manifest(run: Path, to: Path) -> Path:
    """``run``'s traces as another tool names them (``trace.<r>.et``), without a manifest."""
    to.mkdir()
    for f in run.glob("rank-*.et"):
        (to / f"trace.{f.stem.removeprefix('rank-')}.et").write_bytes(f.read_bytes())
    return to


def test_a_directory_of_traces_without_a_manifest_passes_the_real_replays_preflight_as_the_simulators(
    tmp_path: Path,
) -> None:
    # the simulator replays it; mode=real said "no manifest (is ... a skewlens run directory?)"
    bare = _without_manifest(_one_all_reduce(tmp_path / "run"), tmp_path / "bare")
    from skewlens.replay.real.api import preflight

    assert preflight(bare, CFG) == "gloo"


def test_the_plan_names_each_ranks_trace_file_for_the_workers(tmp_path: Path) -> None:
    # workers opened rank-<r>.et in the source run, which a run of trace.<r>.et files does not have
    from skewlens.replay.real.plan import PlanMeta, read_meta, write_plan

    meta = PlanMeta(
        world_size=2, backend="gloo", timeout_s=1.0, compute="auto", default_pg="0", groups=(),
        origin_ns={0: 0, 1: 5}, first_start_ns=0, source_run="/r", out_run="/o", work_dir="/w",
        source_files={0: "/r/trace.0.et", 1: "/r/trace.1.et"},
    )  # fmt: skip
    write_plan(tmp_path, meta, {}, {})
    assert read_meta(tmp_path).source_files == {0: "/r/trace.0.et", 1: "/r/trace.1.et"}


def test_the_plan_tells_the_workers_which_groups_the_program_made_with_local_synchronization(
    tmp_path: Path,
) -> None:
    # read back without it, the workers would make the locally made group on every rank, as an ordinary
    # group that takes a number: every later group's name moves by one
    from skewlens.replay.real.plan import GroupSpec, PlanMeta, read_meta, write_plan

    local = hashed_group_name((0, 1), 1)
    groups = (
        GroupSpec(name=local, ranks=(0, 1), desc=local, local=True),
        GroupSpec(name="1", ranks=(1, 0), desc="g"),
    )
    meta = PlanMeta(
        world_size=2, backend="gloo", timeout_s=1.0, compute="auto", default_pg="0", groups=groups,
        origin_ns={0: 0, 1: 5}, first_start_ns=0, source_run="/r", out_run="/o", work_dir="/w",
        source_files={},
    )  # fmt: skip
    write_plan(tmp_path, meta, {}, {})
    assert read_meta(tmp_path).groups == groups


@pytest.mark.slow
def test_a_run_without_a_manifest_is_replayed_on_real_processes_node_for_node(tmp_path: Path) -> None:
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS, start_ns=0)
        rb.collective(CommType.ALL_REDUCE, 1024, MS)
    bare = _without_manifest(b.write(tmp_path / "run"), tmp_path / "bare")
    result = real_replay(run_dir=bare, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    replayed = load_run(tmp_path / "out" / "real" / "replayed", match=False)
    original = load_run(bare)
    for r in (0, 1):
        names = [original.ranks[r].name(i) for i in range(len(original.ranks[r]))]
        assert [replayed.ranks[r].name(i) for i in range(len(replayed.ranks[r]))] == names
    assert [t.rank for t in result.ranks] == [0, 1]


SLOW_PROFILER_START = """
import os, time
if os.environ.get("RANK") == "1":
    from skewlens.profiler.capture import session as _s
    _start = _s.CaptureSession._start_record
    def _slow_start(self):
        time.sleep(1.5)
        return _start(self)
    _s.CaptureSession._start_record = _slow_start
"""


@pytest.mark.slow
def test_a_profiler_that_starts_slowly_on_one_rank_does_not_lengthen_the_first_replayed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the common start was set before the profiler started, 300 ms ahead: rank 1's profiler taking 1 s
    # more (a loaded or remote host) made both ranks begin late, and the first replayed step took the
    # delay (229 -> 1,057 ms on the example, no warning); the profiler now starts before the common start
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r)
        for s in range(2):
            rb.step(s).compute("aten::mm", 5 * MS)
            rb.collective(CommType.ALL_REDUCE, 1 << 16, MS)
    run = b.write(tmp_path / "orig")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_PROFILER_START)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    res = real_replay(run_dir=run, out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG)
    first = {r.rank: r.replay_ns[0] for r in res.ranks}
    assert sorted(first) == [0, 1]
    assert all(v < 500 * MS for v in first.values()), first  # ~6 ms recorded; 1.2 s late before


def test_a_replay_across_hosts_without_the_ranks_per_host_is_refused_before_any_process_starts(
    tmp_path: Path,
) -> None:
    # two hosts each started every rank of a 2-rank run (real.nproc defaults to the run's ranks): 4
    # workers, and after 9 s "the launcher started 4 processes, the trace has 2 ranks"
    from skewlens.replay.errors import ConfigError
    from skewlens.replay.real.api import preflight

    run = _one_all_reduce(tmp_path / "run", 2)
    two_hosts = ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "host0:29500"]
    with pytest.raises(
        ConfigError, match=r"start 2 hosts of real\.nproc=2 ranks each .* 4 in all, .* 2 ranks"
    ):
        preflight(run, RealConfig(launcher_args=two_hosts))
    assert preflight(run, RealConfig(nproc=1, launcher_args=two_hosts)) == "gloo"
    assert preflight(run, RealConfig(nproc=1, launcher_args=["--nnodes=2"])) == "gloo"
    assert (
        preflight(run, RealConfig(nproc=1, launcher_args=["--nnodes", "1:2"])) == "gloo"
    )  # elastic: unchecked


def test_each_host_of_a_replay_across_hosts_keeps_its_own_launcher_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every host's launcher wrote OUT/real/work/launcher.log, opened for writing: one host's output
    # overwrote the other's mid-line (736 bytes of two interleaved logs, where one host alone wrote 986),
    # and a failed launcher's error quoted that mix
    import socket

    from skewlens.replay.real.launch import launcher_log

    work = tmp_path / "work"
    assert launcher_log(work, None) == work / "launcher.log"  # one host, as before
    across = ["--nnodes", "2", "--node-rank", "0"]
    logs = {}
    for host in ("node-a", "node-b"):
        monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
        logs[host] = launcher_log(work, across)
        run_workers(
            [sys.executable, "-c", f"print('from {host}')"], work_dir=work, deadline_s=30, log=logs[host]
        )
    assert logs["node-a"] != logs["node-b"]
    assert [logs[h].read_text().strip() for h in ("node-a", "node-b")] == ["from node-a", "from node-b"]


def _real_ms(printed: str) -> dict[int, str]:
    """The ``real ms`` column, by rank, of the printed table "Step time per rank: recorded vs real replay"."""
    table = printed[printed.index("Step time per rank") :]
    rows = [line.split("│")[1:-1] for line in table.splitlines() if line.startswith("│")]
    return {int(cells[0]): cells[3].strip() for cells in rows}


@pytest.mark.slow
def test_two_hosts_replaying_one_run_into_one_out_both_print_the_same_table_and_finish_out_run_once(
    tmp_path: Path,
) -> None:
    # docs/replay.md's "Across hosts": the same command on each host K, one rank each, RUN and OUT shared;
    # two `skewlens replay` processes on this machine, joined by torchrun's rendezvous on a local port
    import socket

    b = RunBuilder(2)
    for r in (0, 1):
        for st in range(3):  # rank 1 computes 1 ms longer; rank 0 waits for it in the all-reduce
            rb = b.rank(r).step(st)
            rb.compute("aten::mm", (2 + r) * MS, start_ns=6 * st * MS)
            rb.collective(CommType.ALL_REDUCE, 1024, (3 - r) * MS, start_ns=(6 * st + 2 + r) * MS)
    run, out = b.write(tmp_path / "run"), tmp_path / "out"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def host(k: int) -> list[str]:
        rdzv = f"[--nnodes,2,--node-rank,{k},--rdzv-endpoint,127.0.0.1:{port}]"
        return [
            sys.executable, "-m", "skewlens", "replay", "mode=real", f"trace={run}", f"out={out}",
            "real.nproc=1", "progress=false", f"real.launcher_args={rdzv}",
        ]  # fmt: skip

    env = {**os.environ, "COLUMNS": "200"}  # the tables unwrapped
    hosts = run_together([host(k) for k in (0, 1)], tmp_path / "hosts", timeout_s=120, env=env)
    printed = [h.output for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], [p[-3000:] for p in printed]
    assert all("waiting for the other nodes (2 in all)" in p for p in printed)
    real = [_real_ms(p) for p in printed]
    assert sorted(real[0]) == [0, 1] and real[0] == real[1], real  # the same figures on both hosts
    assert all(float(ms) > 0 for ms in real[0].values()), real
    replayed = load_run(out / "run", match=False)
    m = replayed.manifest
    assert (m.world_size, m.ranks, m.source) == (2, (0, 1), "replay")
    # the pre-roll step dropped once (a second host finishing it again would drop the first replayed step
    # too), the replayed steps numbered as the run's 0-2 (before, the profiler's 2-4)
    assert {r: sorted(s.step for s in m.steps if s.rank == r) for r in (0, 1)} == {0: [0, 1, 2], 1: [0, 1, 2]}
    logs = sorted(f.name for f in (out / "real" / "work").glob("launcher*.log"))
    assert logs == sorted(f"launcher.{socket.gethostname()}.{h.pid}.log" for h in hosts)
    assert not (out / "real-failed").exists()
    assert _no_replay_processes_left() == []


def _hang(tmp_path: Path, error: dict[str, object], progress: dict[int, dict[str, object]]) -> str:
    """The error of a replay whose launcher writes the ranks' ``progress``, then ``error`` (rank 0's)."""
    import json

    work = tmp_path / "work"
    files = {f"rank-{r}.progress.json": {"rank": r, **d} for r, d in progress.items()}
    files["rank-0.error.json"] = error
    script = (
        "import json, pathlib, time\n"
        f"for name, doc in json.loads({json.dumps(files)!r}).items():\n"
        f"    pathlib.Path({str(work)!r}, name).write_text(json.dumps(doc))\n"
        "time.sleep(60)\n"
    )
    groups = {"": range(4), "0": range(4), "tp0": (0, 1)}
    with pytest.raises(ReplayTimeoutError) as e:
        run_workers([sys.executable, "-c", script], work_dir=work, deadline_s=30, groups=groups)
    return str(e.value)


def test_a_start_up_timeout_names_the_ranks_that_never_reported_or_reported_an_earlier_phase(
    tmp_path: Path,
) -> None:
    # with rank 1 stopped at start-up the error was "rank 0: start-up did not finish in time": rank 0 waited
    error = {
        "rank": 0,
        "kind": "timeout",
        "message": "rank 0: start-up did not finish in time",
        "at_ns": 5,
        "waited": {"phase": "start-up"},
    }
    progress = {
        0: {"phase": "init_process_group"},
        2: {"phase": "start-up"},
        3: {"phase": "init_process_group"},
        9: {"rank": "nine", "phase": "start-up"},  # a progress file without a rank's number: not read
    }
    assert _hang(tmp_path, error, progress) == (
        "real replay: rank 0: start-up did not finish in time; waiting for rank 1, which never reported its "
        "start-up; rank 2, which last reported start-up (as they last reported); every rank was stopped"
    )


def test_a_shutdown_timeout_names_the_ranks_still_before_the_shutdown_barrier() -> None:
    # the phases after the replay were typed in the worker only: a rank timing out in the shutdown barrier
    # ranked as start-up, so the rank still writing its trace was not named (waiting for '')
    error = {"rank": 0, "waited": {"phase": "shutdown"}}
    progress = {
        0: {"phase": "shutdown"},
        1: {"phase": "writing the replayed trace"},
        2: {"phase": "shutdown"},
        3: {"phase": "replay"},
    }
    assert waiting_for(error, progress, {"": range(4)}) == (
        "; waiting for rank 1, which last reported writing the replayed trace; rank 3, which last reported "
        "replay (as they last reported)"
    )


def test_a_profiler_save_timeout_names_the_ranks_still_replaying_and_not_those_past_the_save() -> None:
    error = {"rank": 0, "waited": {"phase": "profiler save"}}
    progress = {
        0: {"phase": "profiler save"},
        1: {"phase": "replay"},
        2: {"phase": "writing the replayed trace"},
        3: {"phase": "the common start"},
    }
    assert waiting_for(error, progress, {"": range(4)}) == (
        "; waiting for rank 1, which last reported replay; rank 3, which last reported the common start "
        "(as they last reported)"
    )


def test_a_previous_replays_error_result_and_progress_files_are_gone_before_the_workers_start(
    tmp_path: Path,
) -> None:
    # read after the workers run, a file left by an earlier replay would pass for one of this replay
    work = tmp_path / "work"
    work.mkdir()
    stale = ["rank-0.result.json", "rank-1.progress.json", "rank-1.result.json"]
    for name in stale:
        (work / name).write_text("{}")
    (work / "rank-0.json").write_text("{}")  # a plan: not the launcher's to remove
    run_workers([sys.executable, "-c", "pass"], work_dir=work, deadline_s=30)
    assert sorted(p.name for p in work.iterdir()) == ["launcher.log", "rank-0.json"]


def test_a_start_up_timeout_names_neither_its_own_rank_nor_one_in_a_phase_this_version_does_not_know() -> (
    None
):
    # rank 0 timed out before its own first report: rank 3 never reported, rank 0 is not waiting for itself
    error = {"rank": 0, "waited": {"phase": "start-up"}}
    progress: dict[int, dict[str, object]] = {1: {"phase": "start-up"}, 2: {"phase": "start-up"}}
    assert waiting_for(error, progress, {"": range(4)}) == (
        "; waiting for rank 3, which never reported its start-up (as they last reported)"
    )
    # rank 0's own phase is another version's: no one is taken to be behind it
    assert waiting_for(error, {0: {"phase": "rendezvous"}, 1: {"phase": "start-up"}}, {"": range(2)}) == ""
    # rank 0 at init_process_group: rank 1 is behind it; rank 3's phase is another version's, not behind
    progress = {0: {"phase": "init_process_group"}, 1: {"phase": "start-up"}, 2: {"phase": "replay"}}
    progress[3] = {"phase": "rendezvous"}
    assert waiting_for(error, progress, {"": range(4)}) == (
        "; waiting for rank 1, which last reported start-up (as they last reported)"
    )


def test_a_stuck_op_names_at_most_four_late_members_and_counts_the_rest() -> None:
    # seq 0 of the world group and a recv from rank 0 are stuck ops like any other
    progress = {r: {"phase": "replay", "issued": {"": -1}} for r in range(1, 7)}
    error = {"rank": 0, "waited": {"group": "", "seq": 0, "peer": -1}}
    none = "which had issued no op"
    named = [f"rank {r}, {none}" for r in range(1, 5)]
    assert waiting_for(error, progress, {"": range(7)}) == (
        f"; waiting for {'; '.join(named)}; 2 more ranks (as they last reported)"
    )
    assert (
        waiting_for(error, progress, {"": range(5)})
        == f"; waiting for {'; '.join(named)} (as they last reported)"
    )
    recv = {"rank": 1, "waited": {"group": "", "seq": -1, "peer": 0}}
    assert waiting_for(recv, {}, {"": range(2)}) == (
        "; waiting for rank 0, which never reported its start-up (as they last reported)"
    )
    progress[0] = {"phase": "replay", "last": "rank 0: send to rank 1 (node 4 x)"}
    assert waiting_for(recv, progress, {"": range(2)}) == (
        "; waiting for rank 0, whose last op issued was send to rank 1 (node 4 x) (as they last reported)"
    )


def test_a_stuck_broadcast_of_a_group_that_does_not_hold_the_stuck_rank_names_its_late_members() -> None:
    # a file of another version, or a plan's bug: not a crash of the launcher
    error = {
        "rank": 5,
        "waited": {"group": "tp0", "seq": 3, "peer": -1, "comm_type": int(CommType.BROADCAST)},
    }
    progress = {r: {"phase": "replay", "issued": {"tp0": 2}} for r in (0, 1)}
    assert waiting_for(error, progress, {"": range(6), "tp0": (0, 1)}) == (
        "; waiting for rank 0, which had issued no op; rank 1, which had issued no op (as they last reported)"
    )


def test_a_stuck_collective_names_the_members_that_had_not_issued_it_and_their_last_op(
    tmp_path: Path,
) -> None:
    # with rank 1 stopped mid-replay the error named rank 0's all_reduce only: rank 0 waited, rank 1 was stuck
    error = {
        "rank": 0,
        "kind": "timeout",
        "message": "rank 0: all_reduce on group 'tp0' seq 22 (node 9 x) did not complete within 5 s",
        "at_ns": 5,
        "waited": {"group": "tp0", "seq": 22, "peer": -1},
    }
    last = "rank 1: all_reduce on group 'tp0' seq 21 (node 8 x)"
    progress = {
        0: {"phase": "replay", "issued": {"tp0": 22}},
        1: {"phase": "replay", "issued": {"tp0": 21}, "last": last},
        2: {"phase": "replay", "issued": {"0": 3}},  # not a member of tp0
    }
    assert _hang(tmp_path, error, progress) == (
        "real replay: rank 0: all_reduce on group 'tp0' seq 22 (node 9 x) did not complete within 5 s; "
        "waiting for rank 1, whose last op issued was all_reduce on group 'tp0' seq 21 (node 8 x) (as they "
        "last reported); every rank was stopped"
    )
    progress[1]["issued"] = {"tp0": 22}  # it had issued it too, and reported no error (stopped, or hung)
    assert _hang(tmp_path / "b", error, progress).endswith(
        "within 5 s; waiting for rank 1, which had issued it too and reported no error (as they last "
        "reported); every rank was stopped"
    )


def test_a_stuck_broadcast_names_its_late_root_alone_as_the_execution_model_waits_for_it() -> None:
    # a member of a broadcast waits for the root alone (execution.waits_for), but the message named every
    # member that had not issued it: here rank 1 too, which rank 0's broadcast never waited for
    from skewlens.replay.real.launch import waiting_for

    groups = {"": range(4)}
    progress = {r: {"phase": "replay", "issued": {"": seq}} for r, seq in ((0, 7), (1, 6), (2, 6), (3, 7))}

    def waited(kind: CommType, root: int, me: int = 0) -> str:
        error = {
            "rank": me,
            "waited": {"group": "", "seq": 7, "peer": -1, "comm_type": int(kind), "root": root},
        }
        return waiting_for(error, progress, groups)

    assert (
        waited(CommType.BROADCAST, 2)
        == "; waiting for rank 2, which had issued no op (as they last reported)"
    )
    assert waited(CommType.SCATTER, 2).startswith("; waiting for rank 2, which")
    assert waited(CommType.GATHER, 2).startswith("; waiting for rank 2, which")
    # the root of a gather waits for every member, a reduce's members for the last arrival: both late ones
    both = (
        "; waiting for rank 1, which had issued no op; rank 2, which had issued no op (as they last reported)"
    )
    assert waited(CommType.GATHER, 3, me=3) == both
    assert waited(CommType.REDUCE, 2) == both
    assert waited(CommType.ALL_REDUCE, -1) == both
    # a broadcast whose root had issued it: the late members are named, as before
    progress[2]["issued"] = {"": 7}
    assert (
        waited(CommType.BROADCAST, 2)
        == "; waiting for rank 1, which had issued no op (as they last reported)"
    )
    # a root the trace names none of: the group's first rank, as the plan takes it
    progress[0]["issued"] = {"": 6}
    assert waited(CommType.BROADCAST, -1, me=3) == (
        "; waiting for rank 0, which had issued no op (as they last reported)"
    )


def test_a_rendezvous_timeout_is_one_line_naming_the_cause_and_torchruns_join_timeout(tmp_path: Path) -> None:
    # a host whose peers never started waited torchrun's 600 s, then ended with traceback fragments
    script = (
        "print('Traceback (most recent call last):')\n"
        "print('torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError')\n"
        "print('  File \"x.py\", line 1')\n"
        "raise SystemExit(1)\n"
    )
    log = tmp_path / "work" / "launcher.log"
    with pytest.raises(ReplayError) as e:
        run_workers([sys.executable, "-c", script], work_dir=tmp_path / "work", deadline_s=30)
    assert str(e.value) == (
        "real replay: the rendezvous timed out waiting for the other nodes to join (torchrun's --rdzv-conf "
        f"join_timeout bounds it, 600 s unless real.launcher_args give one); log {log}"
    )
    # where the logs are kept past the replay's working files, the error names the kept log
    kept = tmp_path / "kept" / "launcher.log"
    with pytest.raises(ReplayError) as e:
        run_workers(
            [sys.executable, "-c", script],
            work_dir=tmp_path / "work",
            deadline_s=30,
            keep_logs=lambda _log: kept,
        )
    assert str(e.value).endswith(f"; log {kept}")


def test_a_stuck_broadcast_whose_recorded_root_is_no_member_names_the_first_member_it_is_issued_from() -> (
    None
):
    # the worker issues a broadcast whose recorded root is none of its group's ranks from the group's first
    # rank (ops.issue), but the message took such a root for unknown and named every late member
    from skewlens.replay.real.launch import waiting_for

    progress = {r: {"phase": "replay", "issued": {"": seq}} for r, seq in ((0, 6), (1, 6), (2, 7), (3, 7))}
    error = {
        "rank": 3,
        "waited": {"group": "", "seq": 7, "peer": -1, "comm_type": int(CommType.BROADCAST), "root": 9},
    }
    assert waiting_for(error, progress, {"": range(4)}) == (
        "; waiting for rank 0, which had issued no op (as they last reported)"
    )


def test_a_worker_stuck_in_a_broadcast_reports_its_root_so_the_error_names_that_rank_alone() -> None:
    # what the worker's watchdog reports of a stuck op is what waiting_for reads: the group, the seq, the
    # peer, and a rooted collective's type and root (without them every late member was named)
    from skewlens.replay.real.worker import _waited

    op = ReplayOp(
        row=0, node_id=1, name="c10d::broadcast_", kind="coll", step=0, dur_ns=1, deps=(), gap_ns=0,
        delay_ns=0, comm_type=int(CommType.BROADCAST), pg_name="", seq=3, root=2,
    )  # fmt: skip
    assert _waited(op) == {"group": "", "seq": 3, "peer": -1, "comm_type": int(CommType.BROADCAST), "root": 2}
    assert _waited(None) == {}
    assert _waited(replace(op, kind="send", comm_type=-1, peer=5))["peer"] == 5
    progress = {r: {"phase": "replay", "issued": {"": 2}} for r in (1, 2, 3)}
    assert waiting_for({"rank": 0, "waited": _waited(op)}, progress, {"": range(4)}) == (
        "; waiting for rank 2, which had issued no op (as they last reported)"
    )


def test_a_failed_replays_kept_logs_are_its_log_and_the_workers_error_and_progress_files(
    tmp_path: Path,
) -> None:
    from skewlens.replay.real.api import keep_failure_logs

    work, kept = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    kept.mkdir()
    (kept / "rank-3.error.json").write_text("an earlier failure's")  # one host: only this failure's logs
    for name in (
        "launcher.log",
        "rank-0.error.json",
        "rank-1.progress.json",
        "rank-0.result.json",
        "rank-0.json",
    ):
        (work / name).write_text(name)
    (work / TORCHRUN_LOGS).mkdir()
    (work / TORCHRUN_LOGS / "attempt_0").mkdir()
    assert keep_failure_logs(work, work / "launcher.log", kept, alone=True) == kept / "launcher.log"
    names = ["launcher.log", "rank-0.error.json", "rank-1.progress.json", TORCHRUN_LOGS]
    assert sorted(p.name for p in kept.iterdir()) == sorted(names)
    assert (kept / "rank-1.progress.json").read_text() == "rank-1.progress.json"
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["rank-0.result.json", "rank-0.json", TORCHRUN_LOGS]
    )
    assert [p.name for p in (kept / TORCHRUN_LOGS).iterdir()] == ["attempt_0"]
    (work / "rank-2.error.json").write_text("another host's")
    keep_failure_logs(work, work / "launcher.log", kept, alone=False)  # across hosts: each adds its own
    assert (kept / "rank-2.error.json").is_file() and (kept / "rank-0.error.json").is_file()


def test_a_replay_into_an_earlier_ones_out_clears_only_its_manifest_rank_traces_and_part_files(
    tmp_path: Path,
) -> None:
    from skewlens.replay.real.api import _clear_previous

    d = tmp_path / "run"
    (d / ".parts").mkdir(parents=True)
    for name in ("manifest.json", "rank-0.et", "rank-12.et", "notes.txt", "rank-0.et.bak"):
        (d / name).write_text("x")
    _clear_previous(d, tmp_path / "absent")
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt", "rank-0.et.bak"]


def _groups_run(tmp_path: Path, groups: dict[str, tuple[int, ...]], pg0: str, pg1: str) -> RunTrace:
    """Two ranks with the manifest's ``groups``; rank 0 runs an all_reduce on ``pg0``, rank 1 on ``pg1``."""
    b = RunBuilder(2, groups)
    b.rank(0).step(0).collective(CommType.ALL_REDUCE, 4096, MS, pg=pg0)
    b.rank(1).step(0).collective(CommType.ALL_REDUCE, 4096, MS, pg=pg1)
    return load_run(b.write(tmp_path / "run"))


def test_groups_are_recreated_in_the_order_of_their_numbers_not_the_manifests_rank_by_rank_union(
    tmp_path: Path,
) -> None:
    # the manifest lists the union of each rank's own groups, rank by rank: group '2' (rank 0's) before
    # '1' (rank 1's, made first); re-created in that order, the replay's groups took each other's names
    run = _groups_run(tmp_path, {"0": (0, 1), "2": (0,), "1": (1,)}, "2", "1")
    assert [g.name for g in run.manifest.process_groups] == ["0", "2", "1"]
    default, groups = group_specs(run)
    assert default == "0"
    assert [(g.name, g.ranks) for g in groups] == [("1", (1,)), ("2", (0,))]


def test_groups_numbered_past_nine_are_recreated_in_numeric_order_not_as_their_names_sort(
    tmp_path: Path,
) -> None:
    # '10' sorts before '2' as text; torch made group 2 first
    run = _groups_run(tmp_path, {"0": (0, 1), "10": (0,), "2": (1,)}, "10", "2")
    assert [g.name for g in run.manifest.process_groups] == ["0", "10", "2"]
    assert [(g.name, g.ranks) for g in group_specs(run)[1]] == [("2", (1,)), ("10", (0,))]


def test_groups_with_a_name_given_by_the_program_keep_the_manifests_order(tmp_path: Path) -> None:
    # only torch's own counter tells the creation order; a group named by the program ('tp') has no number
    run = _groups_run(tmp_path, {"0": (0, 1), "tp": (0, 1), "2": (0,), "1": (1,)}, "2", "1")
    assert [g.name for g in run.manifest.process_groups] == ["0", "tp", "2", "1"]
    assert [g.name for g in group_specs(run)[1]] == ["tp", "2", "1"]


def test_a_group_made_with_local_synchronization_takes_no_number_and_is_made_by_its_members_alone(
    tmp_path: Path,
) -> None:
    # new_group(use_local_synchronization=True) names a group by hashing its ranks and takes no number from
    # torch's counter: its name turned the numeric order off, and the replay made it an ordinary group that
    # took number 2, so recorded group '2' came back as '3' (and every later one shifted by one)
    local = hashed_group_name((0, 1), 1)
    run = _groups_run(tmp_path, {"0": (0, 1), local: (0, 1), "2": (0,), "1": (1,)}, "2", "1")
    assert [g.name for g in run.manifest.process_groups] == ["0", local, "2", "1"]
    assert [(g.name, g.local) for g in group_specs(run)[1]] == [(local, True), ("1", False), ("2", False)]


def test_a_locally_made_group_keeps_its_place_after_the_numbered_group_made_before_it(tmp_path: Path) -> None:
    # the local group was made after group '1' and before '2': re-made first of all, its members would
    # count one group fewer than the program's members did when torch hashed its name
    local = hashed_group_name((0, 1), 2)
    run = _groups_run(tmp_path, {"0": (0, 1), "1": (0, 1), local: (0, 1), "3": (0,), "2": (1,)}, "3", "2")
    assert [g.name for g in group_specs(run)[1]] == ["1", local, "2", "3"]


def test_a_hashed_group_name_is_the_one_torch_gives_a_locally_made_group() -> None:
    # torch's _hash_ranks_to_str([0, 1]) in a process that has made no group yet (torch 2.x): the SHA-1 of
    # '0_1_0'; a name computed another way would never match a recorded one
    assert hashed_group_name((0, 1), 0) == "9f43504d231e8b0a7a2c648b1a1bea4922eb18f1"


def test_a_program_named_group_of_forty_hex_digits_is_not_taken_for_a_hashed_one(tmp_path: Path) -> None:
    named = "ab" * 20  # no hash of its ranks: a name the program gave, so the manifest's order stays
    run = _groups_run(tmp_path, {"0": (0, 1), named: (0, 1), "2": (0,), "1": (1,)}, "2", "1")
    assert [(g.name, g.local) for g in group_specs(run)[1]] == [(named, False), ("2", False), ("1", False)]


@pytest.mark.slow
def test_the_real_replay_gives_its_groups_the_recorded_names_around_a_locally_made_one(
    tmp_path: Path,
) -> None:
    # the replay made the local group an ordinary one, numbered 2: its capture named groups '2' (0, 1) and
    # '3' (2, 1) where the run had '2' (2, 1) and '3' (0, 1, 2); 12 of 18 groups of a 4-rank capture moved
    local = hashed_group_name((0, 1), 2)
    groups = {"0": (0, 1, 2), "1": (0, 1), local: (0, 1), "2": (2, 1), "3": (0, 1, 2)}
    b = RunBuilder(3, groups)
    for r in range(3):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", MS)
        for pg in ("1", local, "2", "3"):
            if r in groups[pg]:
                rb.collective(CommType.ALL_REDUCE, 4096, MS, pg=pg)
    res = real_replay(
        run_dir=b.write(tmp_path / "run"), out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG
    )
    replayed = load_run(res.out_dir / "run")
    assert {g.name: g.ranks for g in replayed.manifest.process_groups} == groups
    assert sorted({(i.pg_name, i.ranks) for i in replayed.collectives}) == sorted(
        (pg, tuple(sorted(groups[pg]))) for pg in ("1", local, "2", "3")
    )


def test_a_worker_gives_its_groups_the_recorded_numbers_where_the_program_made_groups_the_run_does_not_list(
    tmp_path: Path,
) -> None:
    # groups '3' and '7' of a program that had made (and destroyed before the window) groups 1, 2 and 4-6:
    # re-created one after the other, torch numbered them '1' and '2' (one gloo rank in a fresh process)
    script = r"""
import os, socket, sys
from types import SimpleNamespace
import torch.distributed as dist
from skewlens.replay.real.plan import GroupSpec
from skewlens.replay.real.worker import _create_groups
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
specs = (GroupSpec(name="3", ranks=(0,), desc="a"), GroupSpec(name="7", ranks=(0,), desc="b"))
groups = _create_groups(SimpleNamespace(groups=specs), 0)
print(sorted((name, pg.group_name) for name, (pg, _ranks) in groups.items()))
dist.destroy_process_group()
"""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[('3', '3'), ('7', '7')]"


@pytest.mark.slow
def test_the_real_replay_gives_its_groups_the_recorded_names_where_numbers_are_missing_from_the_run(
    tmp_path: Path,
) -> None:
    # a run whose program made groups it destroyed before the window (a group made and dropped every step):
    # its capture listed '0', '3' and '5'; the replay's capture named them '0', '1', '2'
    groups = {"0": (0, 1), "3": (0, 1), "5": (1, 0)}
    b = RunBuilder(2, groups)
    for r in range(2):
        rb = b.rank(r).step(0)
        for pg in ("3", "5", "0"):
            rb.collective(CommType.ALL_REDUCE, 4096, MS, pg=pg)
    res = real_replay(
        run_dir=b.write(tmp_path / "run"), out_dir=tmp_path / "out", effects=NO_EFFECTS, cfg=CFG
    )
    replayed = load_run(res.out_dir / "run")
    assert {g.name: g.ranks for g in replayed.manifest.process_groups} == groups
    assert sorted({i.pg_name for i in replayed.collectives}) == ["0", "3", "5"]


def test_the_directory_torchrun_makes_private_in_its_log_dir_is_left_as_mkdir_would_make_it(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.atomic import DIR_MODE

    work = tmp_path / "work"
    logs = work / TORCHRUN_LOGS
    script = f"import os, tempfile; os.makedirs({str(logs)!r}); tempfile.mkdtemp(dir={str(logs)!r})"
    run_workers([sys.executable, "-c", script], work_dir=work, deadline_s=30)
    # was 0o700 (torchrun's mkdtemp): in a team's 2775 directory the second member's real replay into the
    # first's OUT could not remove it, and left it in a hidden .real.34viensz.tmp in OUT
    assert [p.stat().st_mode & 0o777 for p in logs.iterdir()] == [DIR_MODE]


def _one_inside(
    run_dir: Path,
    ag_at: int,
    *,
    nested: bool = False,
    on_op: bool = False,
    step: int = 0,
    first: tuple[int, bool] | None = None,
    kernel: bool = False,
    p2p: bool = False,
    after_coll: bool = False,
    on_nested: bool = False,
) -> Path:
    """:func:`_issued_inside_run`'s one step with the all_gather issued at ``ag_at`` (the op runs 1-21 ms);
    ``nested``: the op runs a nested op from 2 to 3 ms first; ``on_op``: the all_gather's start edges are
    from the op before and from the op itself; ``step``: the all_gather's step; ``first``: an all_reduce
    issued on its stream before it (at, whether with a start edge from the op); ``kernel``: the op launches
    a 10 ms kernel at 2 ms; ``p2p``: rank 0 isends and rank 1 irecvs instead of the all_gather;
    ``after_coll``: the all_gather also follows an all_reduce on another stream (0.2-0.8 ms, before the op);
    ``on_nested``: it follows a nested op of the op before (0.2-0.8 ms) instead of that op."""
    b = RunBuilder(2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        a = rb.compute("aten::randn", MS, start_ns=0)
        inner = rb.compute("aten::normal_", 600_000, start_ns=200_000, deps=(a,)) if on_nested else a
        before = (
            (rb.collective(CommType.ALL_REDUCE, 64, 600_000, start_ns=200_000, stream=1001, deps=(a,)),)
            if after_coll
            else ()
        )
        op = rb.compute("FSDP::all_gather (0)", 20 * MS, start_ns=MS, deps=(a,))
        if nested:
            rb.compute("aten::empty", MS, start_ns=2 * MS, deps=(op,))
        if kernel:
            rb.compute("gemm", 10 * MS, start_ns=2 * MS, stream=7, deps=(op,), launch_ns=2 * MS)
        if first is not None:
            rb.collective(CommType.ALL_REDUCE, 64, MS, start_ns=first[0], stream=1000,
                          deps=(a, op) if first[1] else (a,))  # fmt: skip
        rb.step(step)
        deps = ((a, op) if on_op else (inner,)) + before
        if p2p:
            side = rb.send if r == 0 else rb.recv
            ag = side(1 - r, 4096, 10 * MS, start_ns=ag_at, stream=1000, deps=deps, return_ns=ag_at + 50_000)
        else:
            ag = rb.collective(CommType.ALL_GATHER, 4096, 10 * MS, start_ns=ag_at, stream=1000, deps=deps)
        rb.compute("c10d::wait", MS, start_ns=21 * MS, deps=(op, ag))
    return b.write(run_dir)


#: (the all_gather's recorded issue, more of :func:`_one_inside`; which collectives (their order) the op
#: issues inside)
_INSIDE: dict[str, tuple[int, dict[str, Any], tuple[int, ...]]] = {
    "issued-4-ms-in-after-a-nested-op": (5 * MS, {"nested": True}, (0,)),
    "issued-as-the-op-began": (MS, {}, ()),
    "issued-as-the-op-ended": (21 * MS, {}, ()),
    "issued-after-the-op-began-it": (5 * MS, {"on_op": True}, ()),
    "of-the-next-step": (5 * MS, {"step": 1}, ()),
    # after a collective the op issued (its start edge from the op): in its own turn after the op, as that one
    "after-one-issued-from-the-op": (5 * MS, {"first": (3 * MS, True)}, ()),
    # two issued inside, one after the other (gloo: no queue edge between them)
    "after-one-issued-inside": (5 * MS, {"first": (3 * MS, False)}, (0, 1)),
    # following the op itself, recorded to start within the clocks' error (20 µs) before its end: after it
    "issued-10-us-before-the-op-ended-after-it": (21 * MS - 10_000, {"on_op": True}, ()),
    # following a collective (its end not known when the op begins): in its own turn after the op
    "after-a-collective-before-the-op": (5 * MS, {"after_coll": True}, ()),
    # following host work nested in the op before: done when the op begins
    "after-a-nested-op-before-the-op": (5 * MS, {"on_nested": True}, (0,)),
}


@pytest.mark.parametrize(("ag_at", "more", "inside"), _INSIDE.values(), ids=_INSIDE.keys())
def test_communication_is_issued_inside_a_host_op_only_where_it_began_within_it_on_host_work_before_it(
    tmp_path: Path, ag_at: int, more: dict[str, Any], inside: tuple[int, ...]
) -> None:
    run = load_run(_one_inside(tmp_path / "run", ag_at, **more))
    ops = rank_plan(run.ranks[0], run, NO_EFFECTS)
    op = next(o for o in ops if o.name == "FSDP::all_gather (0)")
    colls = [o.row for o in ops if o.kind == KIND_COLL]
    assert op.issues_inside == tuple(colls[i] for i in inside)


def test_a_kernel_running_when_communication_was_issued_is_not_given_it_to_issue(tmp_path: Path) -> None:
    # a kernel the op launched runs from 2 to 12 ms on the device; the all_gather's host issue at 5 ms is
    # inside its span, but a kernel issues nothing: its enqueue does not wait, the host does the issuing
    run = load_run(_one_inside(tmp_path / "run", 5 * MS, kernel=True))
    (kernel,) = [o for o in rank_plan(run.ranks[0], run, NO_EFFECTS) if o.gpu]
    assert (kernel.name, kernel.issues_inside) == ("gemm", ())


def test_a_send_and_a_recv_issued_inside_a_host_op_are_issued_during_it(tmp_path: Path) -> None:
    # a pipeline stage's isend (rank 0) and irecv (rank 1) issued 4 ms into a 20 ms host op, as an
    # all_gather is: each rank's op issues its side of the pair
    run = load_run(_one_inside(tmp_path / "run", 5 * MS, p2p=True))
    for r, kind in ((0, KIND_SEND), (1, KIND_RECV)):
        ops = rank_plan(run.ranks[r], run, NO_EFFECTS)
        op = next(o for o in ops if o.name == "FSDP::all_gather (0)")
        (pair,) = [o.row for o in ops if o.kind == kind]
        assert op.issues_inside == (pair,), r


def test_the_real_replays_table_breaks_no_long_path_over_two_lines_in_a_wide_log(tmp_path: Path) -> None:
    # its caption named OUT/run, wrapped to the table's 60 columns: in a CI log 160 wide a long path was
    # broken in the middle ("/tmp/.../a_long_directory_na" / "me/run"), which a copy then held
    out = tmp_path / ("a_long_directory_name_of_the_replays_outputs_" * 2)
    result = RealReplayResult(
        run_dir=out / "run",
        out_dir=out,
        backend="gloo",
        ranks=(RankStepTimes(rank=0, steps=(0,), original_ns=(10 * MS,), replay_ns=(11 * MS,)),),
    )
    console = Console(file=io.StringIO(), width=160)
    console.print(render_comparison(result, {0: 10 * MS}))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "a_long_directory" not in text
    assert "real replay captured in run/ (below)" in " ".join(text.split())
