"""The Python API (context manager + step()) and the CLI's one-line errors for bad input."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from skewlens.cli import main as skewlens_main
from skewlens.profiler.chakra_io import node_attrs, read_et
from skewlens.profiler.manifest import read_manifest
from skewlens.profiler.vocab import Attr, CommType, NodeType

ROOT = Path(__file__).resolve().parents[1]

API_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from skewlens.profiler.capture import capture
    dist.init_process_group("gloo")
    with capture(sys.argv[1], steps="0:1:2") as cap:
        for i in range(4):
            t = torch.ones(1000 * (i + 1))
            dist.all_reduce(t)
            cap.step()
    dist.destroy_process_group()
    """
)


def _api_run(tmp_path: Path, source: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``source`` run on 2 gloo ranks with torchrun (its run directory the first argument): the run
    directory and the finished process."""
    script = tmp_path / "api_train.py"
    script.write_text(source)
    out = tmp_path / "run"
    res = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return out, res


@pytest.mark.slow
def test_the_context_manager_records_the_steps_the_script_marks(tmp_path: Path) -> None:
    out, res = _api_run(tmp_path, API_SCRIPT)
    assert res.returncode == 0, res.stderr[-2000:]
    m = read_manifest(out)
    assert (m.world_size, m.ranks, m.level) == (2, (0, 1), "collectives")
    assert sorted({s.step for s in m.steps}) == [1, 2]
    for rank in (0, 1):
        colls = [
            node_attrs(n) for n in read_et(out / f"rank-{rank}.et").nodes if n.type == NodeType.COMM_COLL
        ]
        # steps 1 and 2 all_reduce 2000 and 3000 floats; sequence numbers count from the first call
        assert [(a[Attr.COMM_TYPE], a[Attr.COMM_SIZE], a[Attr.SEQ], a[Attr.STEP]) for a in colls] == [
            (CommType.ALL_REDUCE, 8000, 1, 1),
            (CommType.ALL_REDUCE, 12000, 2, 2),
        ]


@pytest.mark.slow
@pytest.mark.parametrize("marks", [0, 1])
def test_a_capture_block_that_ends_before_a_step_of_its_window_saves_no_trace_and_says_what_it_marked(
    tmp_path: Path, marks: int
) -> None:
    # a loop that forgot cap.step() (or stopped after its first): the window's steps 1-2 never ended.
    # Before: a trace of no step on each rank and a manifest, whose stop records had every collective the
    # flight recorder saw in flight ('step 0 did not finish: ranks 0-1 in all_reduce 0#4', finished by both)
    source = API_SCRIPT.replace("cap.step()", f"cap.step() if i < {marks} else None")
    source = source.replace(
        "import sys,", "import os; os.environ['TORCH_FR_BUFFER_SIZE'] = '1000'\nimport sys,"
    )
    out, res = _api_run(tmp_path, source)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (out / "manifest.json").exists()
    marked = f"{marks} step(s)" if marks else "no step"
    for rank in (0, 1):
        assert (
            f"skewlens: rank {rank}: trace not saved: no step of the window (steps 1-2) ended: the program "
            f"marked {marked} with cap.step() (capture() without auto_step=True, where only it marks steps)"
        ) in res.stderr, res.stderr[-2000:]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = skewlens_main(["profile", *argv])
    return code, capsys.readouterr().err.strip()


def one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("skewlens profile: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--level", "kernels"], "--level 'kernels'"),
        (["--steps", "1:x:3"], "--steps '1:x:3'"),
        (["--steps", "3"], "WAIT:WARMUP:ACTIVE"),
        (["--host-trace", "et"], "--host-trace 'et'"),
    ],
)
def test_a_bad_flag_is_a_one_line_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    out = tmp_path / "run"
    code, err = run_cli(["--out", str(out), *flags, "--", sys.executable, "-c", "pass"], capsys)
    assert code == 2 and words in one_line_error(err)
    assert not out.exists()


def test_an_unwritable_output_directory_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    marker = tmp_path / "ran"
    code, err = run_cli(
        ["--out", str(blocker / "run"), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], capsys
    )
    assert code == 2 and "not writable" in one_line_error(err) and str(blocker / "run") in err
    assert not marker.exists()


def test_a_non_empty_output_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.et").write_text("x")
    code, err = run_cli(["--out", str(tmp_path), "--", sys.executable, "-c", "pass"], capsys)
    assert code == 2 and "not empty" in one_line_error(err)
    assert [p.name for p in tmp_path.iterdir()] == ["old.et"]


def test_a_missing_or_unknown_command_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(["--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "no command given" in one_line_error(err)
    code, err = run_cli(["--out", str(tmp_path / "b"), "--", "no-such-trainer-xyz"], capsys)
    assert code == 2 and "command not found: 'no-such-trainer-xyz'" in one_line_error(err)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_command_given_without_the_double_dash_is_refused_before_its_options_are_taken_for_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the script's own --out and --steps were read as skewlens's, then argparse failed on the rest
    marker = tmp_path / "ran"
    argv = ["--out", str(tmp_path / "a"), sys.executable, "-c", f"open({str(marker)!r}, 'w')", "--out", "x"]
    code, err = run_cli(argv, capsys)
    assert code == 2 and one_line_error(err).startswith("skewlens profile: error: put the command after '--'")
    assert f"-- {sys.executable} -c" in err
    assert not marker.exists() and not (tmp_path / "a").exists() and not Path("x").exists()


def test_keep_raw_at_the_collectives_level_warns_that_there_is_no_torch_trace_to_keep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--out", str(tmp_path / "run"), "--keep-raw", "--", sys.executable, "-c", "pass"]
    _code, err = run_cli(argv, capsys)
    assert "warning: --keep-raw: the collectives level records no torch trace to keep" in err
    _code, err = run_cli(["--level", "ops", *argv], capsys)
    assert "--keep-raw" not in err


def test_a_command_that_never_steps_is_an_error_not_an_empty_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code, err = run_cli(["--out", str(out), "--", sys.executable, "-c", "print('no torch here')"], capsys)
    assert code == 2 and "no rank saved a trace" in one_line_error(err)
    assert not out.exists()


def test_a_command_that_fails_before_any_rank_saved_a_trace_says_none_was_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a job whose ranks hung in mismatched collectives and were killed (no rank can save from inside a
    # collective) said only "error: command exited with code 3: ...", and RUN did not exist
    out = tmp_path / "run"
    script = "import sys; sys.exit(3)"
    code, err = run_cli(["--out", str(out), "--", sys.executable, "-c", script], capsys)
    cmd = shlex.join([sys.executable, "-c", script])
    assert code == 3
    assert one_line_error(err) == (
        f"skewlens profile: error: command exited with code 3: {cmd} (no rank saved a trace)"
    )
    assert not out.exists()


def _run_signalled(tmp_path: Path, sig: signal.Signals, code: int) -> int:
    """``run_command`` of a script that, on ``sig``, writes ``tmp_path/saved`` and exits with ``code``;
    ``sig`` is sent to this process's main thread once the script is ready (as the terminal or ``timeout``
    sends it to skewlens profile). Returns run_command's result."""
    from skewlens.profiler.capture.run import run_command

    script = textwrap.dedent(
        f"""
        import pathlib, signal, sys, time
        def stop(*_a):
            pathlib.Path({str(tmp_path / "saved")!r}).write_text("saved")
            sys.exit({code})
        signal.signal(signal.{sig.name}, stop)
        pathlib.Path({str(tmp_path / "ready")!r}).touch()
        time.sleep(60)
        """
    )

    def signal_when_ready() -> None:
        for _ in range(600):
            if (tmp_path / "ready").exists():
                break
            threading.Event().wait(0.05)
        signal.pthread_kill(threading.main_thread().ident or 0, sig)

    threading.Thread(target=signal_when_ready, daemon=True).start()
    return run_command([sys.executable, "-c", script], env={"PATH": ""})


def test_a_profile_stopped_with_sigterm_passes_it_on_and_lets_its_command_end(tmp_path: Path) -> None:
    # timeout, scancel or a Kubernetes stop sends SIGTERM: skewlens profile died at once and left the
    # ranks' traces without a manifest; now the command gets SIGTERM, saves what it traced and ends
    before = signal.getsignal(signal.SIGTERM)
    assert _run_signalled(tmp_path, signal.SIGTERM, 9) == 9
    assert (tmp_path / "saved").read_text() == "saved"
    assert signal.getsignal(signal.SIGTERM) == before  # its handler was only there while the command ran


def test_two_sigterms_a_moment_apart_as_timeout_sends_them_are_one_stop(tmp_path: Path) -> None:
    # coreutils timeout signals its command, then its own process group: skewlens profile took the second
    # as "end at once", died without a manifest and left the ranks running (in a process of its own, which
    # the old behaviour killed)
    child = textwrap.dedent(
        f"""
        import pathlib, signal, sys, time
        def stop(*_a):
            time.sleep(0.5)  # saving
            pathlib.Path({str(tmp_path / "saved")!r}).write_text("saved")
            sys.exit(9)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path({str(tmp_path / "ready")!r}).touch()
        time.sleep(60)
        """
    )
    driver = (
        "import os, sys; from skewlens.profiler.capture.run import run_command; "
        f"sys.exit(run_command([sys.executable, '-c', {child!r}], dict(os.environ)))"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "ready").exists():
                break
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        threading.Event().wait(0.1)  # (sent together, the two are one pending signal)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 9, err[-2000:]
    assert (tmp_path / "saved").read_text() == "saved"


def test_a_second_sigterm_later_kills_the_command_and_returns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from skewlens.profiler.capture import run as run_mod

    monkeypatch.setattr(run_mod, "TERM_REPEAT_S", 0.2)
    ready = tmp_path / "ready"

    def stop_twice() -> None:
        # the first SIGTERM once the command ignores it (before, at a fixed 0.3 s: a shell not yet at its
        # trap on a loaded machine died of it), then the second, 0.8 s after it
        for _ in range(600):
            if ready.exists():
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_twice, daemon=True).start()
    t0 = time.monotonic()
    cmd = ["sh", "-c", f"trap '' TERM; : > {shlex.quote(str(ready))}; sleep 30"]
    code = run_mod.run_command(cmd, dict(os.environ))
    assert code == -signal.SIGKILL
    assert time.monotonic() - t0 < run_mod.TERM_GRACE_S  # killed at the second, not after the grace period


def test_an_interrupted_profile_lets_its_command_end_and_returns_its_code(tmp_path: Path) -> None:
    # Ctrl-C used to kill the command and leave its ranks' traces without a manifest; now the command gets
    # the interrupt, saves what it traced and ends, and skewlens profile finalises the run with it
    assert _run_signalled(tmp_path, signal.SIGINT, 7) == 7  # as the terminal's Ctrl-C
    assert (tmp_path / "saved").read_text() == "saved"


def _profile_interrupted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    script: str,
    *,
    interrupts: int = 1,
    steps: str = "1:1:3",
    sig: signal.Signals = signal.SIGINT,
) -> tuple[int, str, str]:
    """``skewlens profile --out tmp_path/run --steps STEPS -- python -c SCRIPT``, Ctrl-C'd (``interrupts``
    times, a moment apart; or sent ``sig``) once the script has touched ``tmp_path/ready``; its code, its
    stderr, and the command as its messages quote it."""

    def interrupt_when_ready() -> None:
        for _ in range(1200):
            if (tmp_path / "ready").exists():
                break
            threading.Event().wait(0.05)
        for _ in range(interrupts):
            signal.pthread_kill(threading.main_thread().ident or 0, sig)
            threading.Event().wait(0.5)

    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    out = str(tmp_path / "run")
    code = skewlens_main(["profile", "--out", out, "--steps", steps, "--", sys.executable, "-c", script])
    return code, capsys.readouterr().err, shlex.join([sys.executable, "-c", script])


@pytest.mark.parametrize(
    ("sig", "code", "says"),
    [
        (
            signal.SIGINT,
            130,
            "interrupted (Ctrl-C): command exited with code 1: {cmd} (no rank saved a trace)",
        ),
        # it said "error: command exited with code 1", as of a training that failed: torchrun, stopped by
        # the SIGTERM of timeout or scancel, exits 1
        # ... and then "stopped (SIGTERM): command exited with code 1: {cmd}", nothing said of the traces,
        # the run directory removed
        (signal.SIGTERM, 1, "stopped (SIGTERM): command exited with code 1: {cmd} (no rank saved a trace)"),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_profile_says_so_and_exits_130_when_no_rank_saved_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sig: signal.Signals, code: int, says: str
) -> None:
    # it said "error: command exited with code 1" and exited 1: nothing told that Ctrl-C had stopped it
    script = textwrap.dedent(
        f"""
        import pathlib, signal, sys, time
        signal.signal(signal.{sig.name}, lambda *_a: sys.exit(1))
        pathlib.Path({str(tmp_path / "ready")!r}).touch()
        time.sleep(60)
        """
    )
    got, err, cmd = _profile_interrupted(tmp_path, capsys, script, sig=sig)
    assert got == code
    assert err.endswith(f"skewlens profile: {says.format(cmd=cmd)}\n")
    assert not (tmp_path / "run").exists()


def test_a_profile_interrupted_twice_kills_its_command_keeps_the_saved_traces_says_so_and_exits_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the second Ctrl-C killed the command and raised out of skewlens profile: the saved trace was left
    # without a manifest, and the line said only "interrupted"
    script = textwrap.dedent(
        f"""
        import pathlib, signal, time, torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):  # the window (0:0:2) ends, and is saved, at the second step()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # deaf to Ctrl-C: only the second one ends it
        pathlib.Path({str(tmp_path / "ready")!r}).touch()
        time.sleep(60)
        """
    )
    code, err, cmd = _profile_interrupted(tmp_path, capsys, script, interrupts=2, steps="0:0:2")
    assert code == 130
    run = tmp_path / "run"
    assert err.endswith(
        f"skewlens profile: interrupted (Ctrl-C): command was killed by SIGKILL: {cmd} (traces of rank 0 "
        f"kept in {run})\n"
    )
    assert read_manifest(run).ranks == (0,)


def test_profile_refuses_torch_distributed_debug_detail_before_running_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # DETAIL wraps every process group in one that checks each call with collectives of a helper group,
    # both filed under one empty name by the flight recorder: on 2 gloo ranks of FSDP2 the capture ran and
    # then failed `skewlens check` (13 collective instances issued twice under one number, 26 errors)
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    code, err = run_cli(["--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass"], capsys)
    line = one_line_error(err)
    assert code == 2
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in line and "unset TORCH_DISTRIBUTED_DEBUG" in line
    assert not (tmp_path / "run").exists()  # nothing ran, nothing was made


def test_the_python_api_refuses_a_process_group_at_debug_level_detail_and_leaves_the_program_as_it_was(
    tmp_path: Path,
) -> None:
    from capture_helpers import ONE_GLOO_RANK

    script = ONE_GLOO_RANK + textwrap.dedent(f"""
        from skewlens.profiler.capture import capture
        from skewlens.profiler.errors import CaptureError
        original = dist.all_reduce
        try:
            with capture({str(tmp_path / "run")!r}):
                print("captured")
        except CaptureError as e:
            print("refused:", e)
        print("hooks left:", dist.all_reduce is not original)
        dist.destroy_process_group()
    """)
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refused: TORCH_DISTRIBUTED_DEBUG=DETAIL" in res.stdout
    assert "hooks left: False" in res.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_profile_saves_no_trace_of_a_program_that_sets_debug_level_detail_itself_and_says_why(
    tmp_path: Path,
) -> None:
    from capture_helpers import profile_script

    # skewlens profile refuses TORCH_DISTRIBUTED_DEBUG=DETAIL in its environment; a program that sets the
    # level itself before init_process_group was captured: profile exited 0 with traces whose checks'
    # collectives share the program's numbers (2 gloo ranks: 9 instances issued twice, analyze refused the
    # run without naming DETAIL)
    script = textwrap.dedent("""
        import torch, torch.distributed as dist
        from torch._C import _distributed_c10d as c10d
        c10d.set_debug_level(c10d.DebugLevel.DETAIL)
        dist.init_process_group("gloo")
        w = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(6):
            (w * 2).sum().backward()
            dist.all_reduce(w.grad)
            opt.step()
            opt.zero_grad()
        print("trained", flush=True)
        dist.destroy_process_group()
    """)
    run, res = profile_script(tmp_path, script, nproc=2)
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stdout.count("trained") == 2  # the program ran as without skewlens
    for r in (0, 1):
        assert (
            f"skewlens: rank {r}: trace not saved: TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the program"
            in res.stderr
        )
    # the remedy is the program's: its own setting, not the environment skewlens profile found clean (before:
    # 'unset TORCH_DISTRIBUTED_DEBUG', which was not set)
    assert "drop the program's own setting of it (torch.distributed's set_debug_level" in res.stderr
    assert "unset TORCH_DISTRIBUTED_DEBUG" not in res.stderr
    assert not list(run.glob("rank-*.et"))


#: A serving loop marking its steps with the API: under ``torch.inference_mode()``, each iteration two
#: all_reduces (4 B, then 8 B) with an ``optimizer.step()`` between them where argv[2] is ``opt`` (a stray
#: optimizer call, as a wrapper's), then ``cap.step()``.
SERVING_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from skewlens.profiler.capture import capture
    dist.init_process_group("gloo")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with torch.inference_mode(), capture(sys.argv[1], steps="0:1:2") as cap:
        for i in range(8):
            dist.all_reduce(torch.ones(1))
            if sys.argv[2] == "opt":
                opt.step()
            dist.all_reduce(torch.ones(2))
            cap.step()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["none", "opt"])
def test_under_skewlens_profile_the_python_api_marks_the_steps_of_profiles_run(
    tmp_path: Path, optimizer: str
) -> None:
    from capture_helpers import profile

    script = tmp_path / "serve.py"
    script.write_text(SERVING_SCRIPT)
    own, out = tmp_path / "own", tmp_path / "run"
    res = profile(out, str(own), optimizer, steps="1:1:3", script=script)
    # before: a second session captured into OWN, profile's own session (whose steps only optimizer.step()
    # marked) saved nothing, and profile exited 2 saying 'A loop without an optimizer marks its steps with
    # the Python API (cap.step(), docs/capture.md)'; with the stray optimizer.step(), profile's steps were
    # cut there, between the two all_reduces of an iteration
    assert res.returncode == 0, res.stderr[-2000:]
    assert not own.exists()
    assert (
        f"skewlens: capture({str(own)!r}) under skewlens profile: the steps the program marks are recorded "
        f"into {str(out)!r}, at profile's --level collectives and --steps 1:1:3" in res.stderr
    )
    m = read_manifest(out)
    assert sorted({s.step for s in m.steps}) == [2, 3, 4]
    for rank in (0, 1):
        colls = [
            node_attrs(n) for n in read_et(out / f"rank-{rank}.et").nodes if n.type == NodeType.COMM_COLL
        ]
        assert [(a[Attr.COMM_SIZE], a[Attr.STEP]) for a in colls] == [
            (size, step) for step in (2, 3, 4) for size in (4, 8)
        ]


@pytest.mark.slow
def test_under_profile_a_program_marking_too_few_steps_is_told_what_it_marked_and_what_the_window_needed(
    tmp_path: Path,
) -> None:
    from capture_helpers import profile

    script = tmp_path / "serve.py"
    script.write_text(SERVING_SCRIPT)  # 8 cap.step() marks a rank
    res = profile(tmp_path / "run", str(tmp_path / "own"), "none", steps="8:1:1", script=script)
    # before: "no rank saved a trace. ... did it import torch, and run 10+ steps, each ended by
    # optimizer.step()? A loop without an optimizer marks its steps with the Python API (cap.step(), ...)",
    # to a program that marks them so, and where optimizer.step() marks none
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "no rank saved a trace: rank 0: trace not saved: no step of the window (step 9) ended: the program "
        "marked 8 step(s) with cap.step() (capture() under skewlens profile, where only it marks steps), and "
        "the window's first recorded step ends at mark 10 (--steps 8:1:1: 8 step(s) of wait, 1 of warm-up); "
        "run more steps or give a smaller --steps; and 1 more"
    )
    assert not (tmp_path / "run").exists()


class _ProfileSession:
    """What capture() reads of the session ``skewlens profile`` started: its rank, run directory, level and
    step window, and :meth:`steps_by_hand`, which it records."""

    def __init__(self, rank: int) -> None:
        from skewlens.profiler.manifest import StepWindow
        from skewlens.profiler.vocab import Level

        self.rank, self.run_dir, self.level = rank, Path("/runs/profile"), Level.OPS
        self.window = StepWindow(wait=1, warmup=1, active=3)
        self.by_hand = 0
        self.marks_by_hand = False

    def steps_by_hand(self, *, by_program: bool = False) -> None:
        self.by_hand += 1
        self.marks_by_hand = self.marks_by_hand or by_program


@pytest.mark.parametrize(("rank", "auto_step"), [(0, False), (1, False), (0, True)])
def test_under_skewlens_profile_capture_gives_profiles_session_and_only_rank_0_says_where_steps_go(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rank: int, auto_step: bool
) -> None:
    from skewlens.profiler.capture import autostart, capture

    session = _ProfileSession(rank)
    monkeypatch.setattr(autostart, "_session", session)
    with capture("/runs/own", level="collectives", auto_step=auto_step) as cap:
        assert cap is session
    assert session.by_hand == (0 if auto_step else 1)  # the program's cap.step() marks profile's steps
    assert session.marks_by_hand is not auto_step  # and a rank that marks too few is told so at exit
    said = (
        "skewlens: capture('/runs/own') under skewlens profile: the steps the program marks are recorded "
        "into '/runs/profile', at profile's --level ops and --steps 1:1:3; capture()'s run directory, level, "
        "steps, keep_raw and host_trace are not used\n"
    )
    assert capsys.readouterr().err == (said if rank == 0 else "")
