"""The native gloo-event recorder: built once, it keeps gloo's worker events and nothing else, bounded.

The library is compiled with the machine's C++ compiler against the installed torch
(:mod:`skewlens.profiler.capture.native`); where that fails the capture goes on with torch's profiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skewlens.cli import main as skewlens_main
from skewlens.profiler.capture import native
from skewlens.profiler.capture.kineto import WorkerEvents
from skewlens.profiler.errors import CaptureError


@pytest.fixture
def gloo_world_of_one(tmp_path: Path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_the_recorder_keeps_gloos_worker_events_on_time_ns_clock_up_to_its_capacity(
    gloo_world_of_one,
) -> None:
    import torch

    dist = gloo_world_of_one
    lib = native.load()
    t0 = time.time_ns()
    assert lib.start(2) is True
    assert lib.start(2) is False  # one recording at a time
    works = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    dist.broadcast(torch.ones(10), src=0)
    torch.ones(3).add_(1)  # an operator (FUNCTION scope): never seen
    events = lib.stop()
    t1 = time.time_ns()
    # 4 collectives ran on gloo's worker threads; the buffer keeps 2 and counts the rest
    assert len(events) == 2 and lib.dropped == 2
    assert all(e.name in {"gloo:all_reduce", "gloo:broadcast"} for e in events)
    main = threading.get_native_id()
    for e in events:
        assert t0 <= e.start_ns <= e.end_ns <= t1  # time.time_ns()'s clock
        assert e.thread != main and e.thread > 0  # gloo's worker, by its native id

    # a new window starts empty; nothing is recorded once stopped
    assert lib.start(10) is True
    dist.all_reduce(torch.ones(8))
    second = lib.stop()
    dist.broadcast(torch.ones(8), src=0)
    assert [e.name for e in second] == ["gloo:all_reduce"] and lib.dropped == 0
    assert lib.stop() == []


def _open_event(seconds: float) -> tuple[threading.Thread, threading.Event]:
    """A thread inside a ``gloo:all_reduce`` record function for ``seconds`` (as gloo's worker is while
    it finishes a work whose waiter already woke); the event is set once it has entered."""
    import torch

    entered = threading.Event()

    def work() -> None:
        with torch.autograd.profiler.record_function("gloo:all_reduce"):
            entered.set()
            time.sleep(seconds)

    t = threading.Thread(target=work)
    t.start()
    assert entered.wait(10)
    return t, entered


def test_a_stop_waits_for_a_gloo_event_still_open_and_keeps_its_end() -> None:
    lib = native.load()
    assert lib.start(10) is True
    t, _ = _open_event(0.03)
    assert lib.open_events() == 1
    events = lib.stop()
    t.join()
    assert [e.name for e in events] == ["gloo:all_reduce"] and lib.open_events() == 0
    assert events[0].end_ns - events[0].start_ns >= 30_000_000


def test_a_stop_waits_for_open_events_at_most_its_bound_and_counts_them_no_longer() -> None:
    lib = native.load()
    assert lib.start(10) is True
    t, _ = _open_event(1.0)
    t0 = time.monotonic()
    events = lib.stop(settle_s=0.05)
    waited = time.monotonic() - t0
    t.join()
    assert events == [] and 0.05 <= waited < 0.9  # gave up at its bound, long before the event ended
    assert lib.open_events() == 0  # the late end was paired with its start all the same
    assert lib.start(10) is True and lib.stop(settle_s=0.0) == []


def test_a_failed_build_names_the_compiler_and_the_error_and_leaves_no_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKEWLENS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "skewlens-no-such-compiler")
    with pytest.raises(native.NativeBuildError, match="no C\\+\\+ compiler 'skewlens-no-such-compiler'"):
        native.build()
    broken = tmp_path / "cxx.sh"
    broken.write_text("#!/bin/sh\necho 'gloo_events.cpp:1: error: boom' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(native.NativeBuildError) as err:
        native.build()
    assert "failed (1) on gloo_events.cpp" in str(err.value) and "error: boom" in str(err.value)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".build.lock"]  # nothing half-written


def test_a_cache_that_cannot_be_written_says_which_variables_move_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with no home directory the cache is /nonexistent/.cache/skewlens: the warning named it, not the fix
    (blocked := tmp_path / "file").write_text("")
    monkeypatch.setenv("SKEWLENS_CACHE_DIR", str(blocked / "cache"))  # under a file: never writable
    with pytest.raises(native.NativeBuildError) as err:
        native.build()
    assert f"cache {blocked / 'cache'} not writable (" in str(err.value)
    assert "set SKEWLENS_CACHE_DIR or XDG_CACHE_HOME to a writable directory)" in str(err.value)


def test_the_library_is_cached_per_torch_and_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKEWLENS_CACHE_DIR", str(tmp_path))
    first = native.library_path()
    assert first.parent == tmp_path and "torch2.13" in first.name
    changed = tmp_path / "gloo_events.cpp"
    changed.write_text(native.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(native, "SOURCE", changed)
    assert native.library_path() != first


def test_an_unknown_recorder_choice_is_a_one_line_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SKEWLENS_GLOO_EVENTS", "perfetto")
    with pytest.raises(CaptureError, match="SKEWLENS_GLOO_EVENTS='perfetto'"):
        native.wanted()
    code = skewlens_main(["profile", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", ""])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and "SKEWLENS_GLOO_EVENTS='perfetto'" in err
    assert not (tmp_path / "run").exists()


def test_a_recorder_that_cannot_start_gives_way_to_the_kineto_session_with_a_note() -> None:
    class Broken:
        def start(self, capacity: int) -> bool:
            raise RuntimeError("no callbacks today")

    w = WorkerEvents(Broken())
    assert w.recorder == "native"
    assert w.start() is True and w.recorder == "kineto"
    assert "native recorder could not start" in w.note and "no callbacks today" in w.note
    w.stop()


@pytest.mark.slow
def test_ranks_building_at_once_compile_one_library_and_leave_nothing_else(tmp_path: Path) -> None:
    code = "from skewlens.profiler.capture import native; print(native.build())"
    env = {**os.environ, "SKEWLENS_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and Path(outs[0]).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".build.lock", Path(outs[0]).name])


def test_a_compiler_given_with_arguments_is_run_with_them_as_make_and_a_shell_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CXX="ccache g++" or CXX="g++ -m64", which make and a shell take, was "no C++ compiler 'ccache g++'"
    # and the capture fell back to the Kineto session
    seen = tmp_path / "argv"
    fake = tmp_path / "fake compiler"  # a space in its path too: quoted in CXX, as a shell reads it
    fake.write_text(
        '#!/bin/sh\nprintf \'%s\\n\' "$@" > "$SKL_SEEN"\n'
        'while [ $# -gt 1 ]; do [ "$1" = -o ] && : > "$2"; shift; done\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("SKL_SEEN", str(seen))
    monkeypatch.setenv("SKEWLENS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", f"'{fake}' -m64 --wrapped")
    path = native.build()
    assert path.is_file() and path.parent == tmp_path / "cache"
    assert seen.read_text().splitlines()[:4] == ["-m64", "--wrapped", "-O2", "-std=c++20"]
    monkeypatch.setenv("CXX", "g++ 'unclosed")
    path.unlink()
    with pytest.raises(native.NativeBuildError) as err:
        native.build()
    assert str(err.value) == 'native gloo-event recorder: CXX="g++ \'unclosed": No closing quotation'
