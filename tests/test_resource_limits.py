"""Commands under tight resources: a memory limit (``ulimit -v``), a file-size limit (``ulimit -f``).

What a user sees is one line naming what ran short, exit code 2, and nothing half-written (the column
cache on a full disk: tests/test_store_colcache.py).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import skewlens.cli.replay as cli_replay
from skewlens.cli import main
from skewlens.profiler.atomic import atomic_file
from skewlens.profiler.errors import SkewlensError, out_of_memory
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType
from skewlens.replay.sweep import JOBS_DIR

#: Address space a command gets in the subprocess tests: ample for Python, numpy and pyarrow (800 MiB
#: sufficed), far below the 1 TiB the loader is made to ask for.
LIMIT_BYTES = 8 << 30


#: Steps of the run: enough for each output, an ASTRA-sim trace too, to pass the 2 KiB of ``ulimit -f 2``.
STEPS = 30


def _run(tmp_path: Path) -> Path:
    b = RunBuilder(world_size=2)
    for r in range(2):
        rb = b.rank(r)
        for s in range(STEPS):
            rb.step(s)
            rb.compute("aten::mm", dur_ns=1_000_000 + 200_000 * r, start_ns=s * 2_000_000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=300_000 - 200_000 * r)
    return b.write(tmp_path / "run")


def _limit() -> int:
    """:data:`LIMIT_BYTES`, or the hard limit where that is lower."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(LIMIT_BYTES, hard)


def _args(command: str, run: Path, out: Path) -> list[str]:
    """``command``'s arguments to read ``run`` and write ``out``."""
    if command == "replay":
        return [command, f"trace={run}", f"out={out}"]
    if command == "astra-sim":
        return ["export", "--format", command, str(run), "--out", str(out)]
    return [command, str(run)] if command == "check" else [command, str(run), "--out", str(out)]


def _skewlens_after(setup: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``skewlens ARGS`` in a child process, after the Python lines ``setup`` (``resource`` is imported)."""
    main = f"from skewlens.cli import main\nsys.exit(main({args!r}))"
    script = f"import resource, sys\n{textwrap.dedent(setup)}\n{main}"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120, cwd=cwd
    )


def _under_memory_limit(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``skewlens ARGS`` in a process whose address space is limited to :func:`_limit`, where decoding a
    rank asks numpy for 1 TiB (a run too large for the limit, without writing one)."""
    setup = f"""
        import numpy as np
        import skewlens.profiler.store.load as load

        def hungry(*_a, **_k):
            return np.zeros(1 << 40, dtype=np.int8)

        load._interpret = hungry
        resource.setrlimit(resource.RLIMIT_AS, ({_limit()}, resource.getrlimit(resource.RLIMIT_AS)[1]))
        """
    return _skewlens_after(setup, args, cwd)


@pytest.mark.parametrize("command", ["check", "analyze", "export"])
def test_a_run_too_large_for_the_memory_limit_is_one_line_naming_the_limit_with_exit_2_and_no_output(
    tmp_path: Path, command: str
) -> None:
    res = _under_memory_limit(_args(command, _run(tmp_path), tmp_path / "out"), tmp_path)
    # it was a traceback of 20 lines, and exit code 1, which check documents as errors in the run
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith(f"skewlens {command}: error: out of memory (Unable to allocate 1.00 TiB")
    assert line.endswith(f"): the address space is limited to {_limit() >> 20:,} MiB (ulimit -v)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no output, no staging directory


def test_a_sweep_point_that_runs_out_of_memory_is_named_and_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    out = tmp_path / "sweep"
    calls: list[object] = []
    replay_run = cli_replay.replay_run
    short = MemoryError("Unable to allocate 1.00 TiB for an array with shape (1099511627776,)")

    def first_runs_out(conf: object, *a: object, **k: object) -> object:
        calls.append(conf)
        if len(calls) == 1:
            raise short  # what numpy raises where the memory (or ulimit -v) runs out
        return replay_run(conf, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(cli_replay, "replay_run", first_runs_out)
    args = ["-m", f"trace={run}", f"out={out}", "slowdown=straggler", "slowdown.rank=1", "progress=false"]
    rc = main(["replay", *args, "slowdown.factor=1.0,2.0", "perfetto=false"])
    err = capsys.readouterr().err
    assert rc == 2
    # the whole sweep ended in a Hydra traceback: no point named, job 1 never ran
    assert [line for line in err.splitlines() if ": warning: " not in line] == [
        f"skewlens replay: error: sweep job 0 (slowdown.factor=1.0): {out_of_memory(short)}",
        f"skewlens replay: 1 of 2 sweep jobs failed; the others' outputs are in {out}",
    ]
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["job"] for r in rows] == [1]
    assert sorted(p.name for p in (out / JOBS_DIR).iterdir()) == ["0.error", "1.parquet"]
    assert not (out / "0").exists()


@pytest.mark.parametrize(
    ("command", "suffix"),
    [("analyze", "parquet"), ("export", "parquet"), ("replay", "parquet"), ("astra-sim", "et")],
)
def test_an_output_larger_than_ulimit_f_allows_is_one_line_naming_the_file_and_the_limit_and_leaves_nothing(
    tmp_path: Path, command: str, suffix: str
) -> None:
    out = tmp_path / "out"
    limit = 2048  # bytes: smaller than any of their Parquet and .et files
    setup = f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))"
    res = _skewlens_after(setup, _args(command, _run(tmp_path), out), tmp_path)
    assert res.returncode == 2
    # pyarrow's words were "Error writing bytes to file. Detail: [errno 27] File too large"; an ASTRA-sim
    # trace's named only the directory ("cannot write OUT: File too large")
    [line] = [s for s in res.stderr.splitlines() if ": warning: " not in s]
    name = "export" if command == "astra-sim" else command
    assert re.fullmatch(
        rf"skewlens {name}: error: cannot write {re.escape(str(out))}/\S+\.{suffix}: File too large "
        rf"\(a file may have at most {limit >> 10} KiB: ulimit -f\)",
        line,
    ), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no output, no staging directory


def test_an_output_refused_for_the_open_files_limit_says_the_limit(tmp_path: Path) -> None:
    # export of 128 ranks under ulimit -n 16: "cannot write pg128: Too many open files" (its worker's pipe)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no limit on open files here")
    out = tmp_path / "x.parquet"
    with pytest.raises(SkewlensError) as e, atomic_file(out):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))  # what open() raises at the limit
    assert (
        str(e.value)
        == f"cannot write {out}: Too many open files (a process may have {soft:,} files open: ulimit -n)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # starts torch's launcher
def test_a_real_replay_whose_launcher_failed_under_an_address_space_limit_says_the_limit(
    tmp_path: Path,
) -> None:
    # under ulimit -v 600000 torch's rendezvous store did not start: after 2.5 minutes the error quoted
    # only "RendezvousConnectionError: The connection to the C10d store has failed"
    out = tmp_path / "out"
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = 64 << 30 if hard == resource.RLIM_INFINITY else hard  # ample: the launcher fails on its arguments
    setup = f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {hard}))"
    args = [
        *_args("replay", _run(tmp_path), out),
        "mode=real",
        "real.launcher_args=[--bogus]",
        "progress=false",
    ]
    res = _skewlens_after(setup, args, tmp_path)
    assert res.returncode == 2
    [line] = [s for s in res.stderr.splitlines() if ": warning: " not in s]
    assert line.startswith("skewlens replay: error: real replay: the launcher exited with code 2; log ")
    assert line.endswith(
        f"; the address space is limited to {limit >> 20:,} MiB (ulimit -v), which torch's processes "
        "may need more of"
    )
