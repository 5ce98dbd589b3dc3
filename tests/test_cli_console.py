"""The commands' report console: wide where it writes to a file or a pipe, unless COLUMNS says otherwise."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from skewlens.console import FILE_WIDTH, _terminal_columns, report_console


def test_a_report_to_a_pipe_is_wide_enough_for_the_cause_column(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # a pipe, also under pytest -s in a terminal
    console = report_console()
    assert not console.is_terminal
    assert console.width == FILE_WIDTH > 80


def test_columns_in_the_environment_still_decide_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "90")
    assert report_console().width == 90
    assert report_console(stderr=True).width == 90


@pytest.mark.parametrize("columns", ["", "abc", "-5", " 60"])
def test_columns_that_is_no_width_leaves_a_report_to_a_pipe_as_wide_as_without_it(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    # rich ignores such a COLUMNS: the report was its 80 columns, not FILE_WIDTH
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert report_console().width == FILE_WIDTH


def test_the_profile_summary_lists_32_ranks_and_one_row_per_reason_a_rank_has_no_trace(
    tmp_path: Path,
) -> None:
    from skewlens.cli.profile import summary_table
    from skewlens.profiler.manifest import read_manifest
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=40)
    for r in range(36):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000)
    run = b.write(tmp_path / "run")
    m = read_manifest(run)
    notes = {**m.notes, "rank 36": "crashed", "rank 37": "crashed", "rank 38": "crashed", "rank 39": "killed"}
    m = dataclasses.replace(m, ranks=tuple(range(36)), missing_ranks=(36, 37, 38, 39), notes=notes)
    buf = io.StringIO()
    Console(file=buf, width=160).print(summary_table(m, run))
    rows = [line for line in buf.getvalue().splitlines() if line.startswith("│")]
    assert len(rows) == 32 + 2
    cells = [c.strip() for c in rows[0].split("│")[1:-1]]
    assert cells[4] == "0"  # the steps recorded, as the import's table lists them (step 0), not a count
    assert [c.strip() for c in rows[-2].split("│")[1:-1]] == ["36-38", "", "", "", "missing", ""]
    assert [c.strip() for c in rows[-1].split("│")[1:-1]] == ["39", "", "", "", "missing", ""]
    assert "36 ranks: the first 32 listed, 4 more in" in buf.getvalue()
    # each reason on a line of its own under the table (it sat in the right-aligned nodes column, where a
    # long one wrapped into a sliver of the table's width); the title is one line
    assert buf.getvalue().splitlines()[-2:] == ["ranks 36-38 missing: crashed", "rank 39 missing: killed"]
    assert buf.getvalue().splitlines()[0].strip().endswith("(level collectives, world size 40)")


def test_the_profile_summary_says_when_the_collectives_level_recorded_no_communication(
    tmp_path: Path,
) -> None:
    # a program without torch.distributed: its trace held the process group's node only, and the
    # analyses then reported its whole step as idle, without a word
    from skewlens.cli.profile import summary_table
    from skewlens.profiler.chakra_io import EtWriter, TraceNode
    from skewlens.profiler.manifest import Manifest, rank_file, write_manifest
    from skewlens.profiler.vocab import NodeType

    run = tmp_path / "run"
    run.mkdir()
    with EtWriter(rank_file(run, 0), {"rank": 0}) as w:
        w.write(
            TraceNode(
                node_id=0, name="## process_group:init ##", node_type=NodeType.METADATA, start_ns=0, dur_ns=0
            )
        )
    m = Manifest(world_size=1, ranks=(0,), level="collectives")
    write_manifest(run, m)
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_table(m, run))
    assert "no communication in the capture window" in buf.getvalue()
    m_ops = dataclasses.replace(m, level="ops")
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_table(m_ops, run))
    assert "no communication" not in buf.getvalue()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["export", "RUN", "--workers", "0", "--out", "OUT"],
            (
                "skewlens export: error: --workers: expected 1..1,048,576 (one process per rank file at "
                "most), got 0"
            ),
        ),
        (  # was an OverflowError traceback from the process pool
            ["export", "RUN", "--workers", "100000000000000000000", "--out", "OUT"],
            (
                "skewlens export: error: --workers: expected 1..1,048,576 (one process per rank file at "
                "most), got 100000000000000000000"
            ),
        ),
        (  # went to torchrun as --nproc-per-node=100000000000000000000
            ["demo", "--nproc", "100000000000000000000", "--out", "OUT"],
            (
                "skewlens demo: error: --nproc: expected 2..64 (gloo ranks on this machine), "
                "got 100000000000000000000"
            ),
        ),
        (  # trained forever
            ["demo", "--steps", "100000000000000000000", "--out", "OUT"],
            (
                "skewlens demo: error: --steps: expected 4..10,000 (the capture window and a step after it), "
                "got 100000000000000000000"
            ),
        ),
        (  # fewer steps than the demo's capture window: no rank saved a trace, the capture failed
            ["demo", "--steps", "2", "--out", "OUT"],
            (
                "skewlens demo: error: --steps: expected 4..10,000 (the capture window and a step after it), "
                "got 2"
            ),
        ),
        (  # the straggler's extra compute never ended
            ["demo", "--straggler-ms", "1e308", "--out", "OUT"],
            (
                "skewlens demo: error: --straggler-ms: expected 0..60,000 (a minute of extra compute), "
                "got 1e+308"
            ),
        ),
        (
            ["export", "--format", "astra-sim", "RUN", "--bandwidth", "nan", "--out", "OUT"],
            "skewlens export: error: --bandwidth: expected GB/s > 0, got nan",
        ),
        (
            ["export", "--format", "astra-sim", "RUN", "--latency", "-1", "--out", "OUT"],
            "skewlens export: error: --latency: expected ns >= 0, got -1.0",
        ),
        (
            ["analyze", "RUN", "--top", "-1", "--out", "OUT"],
            "skewlens analyze: error: --top: expected >= 1, got -1",
        ),
    ],
)
def test_an_option_out_of_its_range_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    from skewlens.cli import main
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).step(0).compute("aten::mm", dur_ns=1_000)
    run = b.write(tmp_path / "run")
    out = tmp_path / "out"
    argv = [str(run) if a == "RUN" else str(out) if a == "OUT" else a for a in args]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [error]
    assert not out.exists()


def test_a_misspelt_command_is_refused_with_the_command_it_resembles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from skewlens.cli import main

    assert main(["analyse", "RUN"]) == 2
    assert main(["frobnicate"]) == 2
    first, second = (e for e in capsys.readouterr().err.splitlines() if e.startswith("skewlens: unknown"))
    assert first == "skewlens: unknown command 'analyse' (did you mean 'analyze'?)"
    assert second == "skewlens: unknown command 'frobnicate'"


def test_no_command_is_an_error_whose_usage_goes_to_stderr_and_help_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `skewlens > out.txt` wrote the usage into out.txt and exited 2
    from skewlens.cli import main

    assert main([]) == 2
    said = capsys.readouterr()
    assert (said.out, said.err.splitlines()[0]) == ("", "usage: skewlens <command> [args...]")
    assert main(["--help"]) == 0
    said = capsys.readouterr()
    assert (said.out.splitlines()[0], said.err) == ("usage: skewlens <command> [args...]", "")


def test_profile_ends_its_summary_with_the_warnings_check_gives_of_a_partial_or_degraded_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `profile --steps 1:1:10 -- ... --steps 4` exited 0 with a summary of steps 2-3 and no remark; only
    # `skewlens check` said the traces were partial
    from skewlens.cli import main as skewlens_main
    from skewlens.profiler.capture import run as capture_run
    from skewlens.profiler.manifest import read_manifest, write_manifest
    from skewlens.profiler.store.validate import validate_run
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    out = tmp_path / "run"

    def finalize(run_dir: Path, **_: object) -> object:
        b = RunBuilder(world_size=2)
        for r in range(2):
            b.rank(r).step(2).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000)
        b.write(run_dir)
        m = read_manifest(run_dir)
        partial = "partial trace: saved 2 of 10 steps at exit"
        notes = {**m.notes, "rank 0": partial, "rank 1": partial, "rank 1 clock": "no clock offset"}
        m = dataclasses.replace(m, notes=notes)
        write_manifest(run_dir, m)
        return m

    monkeypatch.setattr(capture_run, "run_command", lambda command, env, **_kw: 0)
    monkeypatch.setattr(capture_run, "finalize_run", finalize)
    monkeypatch.setattr("skewlens.cli.profile._build_native", lambda: "")
    assert skewlens_main(["profile", "--out", str(out), "--", "true"]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = err[-3:]
    partial = (
        "partial trace: saved 2 of 10 steps at exit (the command ended before the capture window did): the "
        "steps after those are not in its trace"
    )
    assert warnings == [
        "skewlens profile: warning: rank 1: no clock offset",
        f"skewlens profile: warning: rank 0: {partial}",
        f"skewlens profile: warning: rank 1: {partial}",
    ]
    # the same words as skewlens check's
    assert [f"skewlens profile: warning: {i.message}" for i in validate_run(out).warnings] == warnings


def test_the_capture_warnings_after_a_summary_show_a_note_s_control_characters_as_export_s_lines_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # profile's and merge's warnings printed a manifest's notes raw (a merged host's note could set the
    # terminal's title), where export's lines go through printable; both are now the one list of lines
    from skewlens.cli.profile import print_capture_warnings
    from skewlens.profiler.manifest import read_manifest
    from skewlens.profiler.store.render import SHOWN_ISSUES
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=1)
    b.rank(0).step(1).compute("aten::mm", 1_000)
    run = b.write(tmp_path / "run")
    notes = {f"rank {r} clock": f"no clock offset \x1b]0;title{r}\x07" for r in range(SHOWN_ISSUES + 2)}
    print_capture_warnings(dataclasses.replace(read_manifest(run), notes=notes), run, command="merge")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "skewlens merge: warning: rank 0: no clock offset \ufffd]0;title0\ufffd"
    assert err[SHOWN_ISSUES:] == [f"skewlens merge: and 2 more warning(s): skewlens check {run}"]


@pytest.mark.parametrize("command", ["analyze", "export"])
def test_sigterm_stops_analyze_and_export_as_ctrl_c_does_leaving_no_staging_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # SIGTERM killed them where they stood: exit 143, no message, a '.out.*.tmp' staging directory with
    # the finished outputs beside OUT (and export's worker semaphores leaked)
    import os
    import signal

    import skewlens.cli.analyze as analyze_cli
    import skewlens.profiler.store.parquet as parquet
    from skewlens.cli import main
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        rb.compute("aten::mm", dur_ns=1_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 10, dur_ns=500)
    run = b.write(tmp_path / "run")
    out = tmp_path / "out"

    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or what an in-process capture test left

    def terminated(*_args: object) -> None:  # the signal, mid-way through writing the outputs
        if signal.getsignal(signal.SIGTERM) is before:  # it would kill the test process
            raise AssertionError("SIGTERM is not an interrupt here")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    if command == "analyze":  # its tables are written into the staging directory by then
        monkeypatch.setattr(analyze_cli, "breakdown_bars", terminated)
        argv = ["analyze", str(run), "--out", str(out), "--no-blame"]
    else:  # rank 0 exported, rank 1 not
        export_rank = parquet._export_rank
        monkeypatch.setattr(
            parquet,
            "_export_rank",
            lambda f, r, *a, **k: terminated() if r == 1 else export_rank(f, r, *a, **k),
        )
        argv = ["export", str(run), "--out", str(out), "--workers", "1", "--no-progress"]
    assert main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1:] == [f"skewlens {command}: interrupted"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert signal.getsignal(signal.SIGTERM) is before  # put back as it was


def test_a_second_sigterm_a_moment_later_is_the_same_stop_and_one_later_still_ends_the_process(
    tmp_path: Path,
) -> None:
    # taken as Ctrl-C, SIGTERM no longer ended a command stuck where the interrupt cannot reach (a FIFO
    # opened on a worker thread): timeout's SIGTERM left it running for ever
    import os
    import signal
    import subprocess
    import sys
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = (
        "import concurrent.futures, sys\n"
        "from skewlens.cli import sigterm_as_interrupt\n"
        "with sigterm_as_interrupt():\n"
        "    pool = concurrent.futures.ThreadPoolExecutor(1)\n"
        "    stuck = pool.submit(open, sys.argv[1], 'rb')\n"
        "    print('ready', flush=True)\n"
        "    try:\n"
        "        stuck.result()\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', flush=True)\n"
        "        pool.shutdown()\n"
    )
    log = tmp_path / "log"

    def said(text: str) -> bool:
        deadline = time.monotonic() + 10
        while text not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        return text in log.read_text()

    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", script, str(fifo)], stdout=out)
    try:
        assert said("ready")
        proc.send_signal(signal.SIGTERM)
        assert said("interrupted")
        proc.send_signal(signal.SIGTERM)  # coreutils timeout's second, to its process group
        time.sleep(0.5)
        assert proc.poll() is None
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


#: How long the FIFOs' writer waits before it first opens them (the tests' own bound on a hang).
UNBLOCK_S = 10.0


def _unblock_later(fifo: Path) -> None:
    """From :data:`UNBLOCK_S` on, opens ``fifo`` for writing whenever a reader waits, and closes it: a reader
    stuck in its open (the bug) then reads an empty file and fails its test instead of hanging it."""
    import threading
    import time

    def writer() -> None:
        time.sleep(UNBLOCK_S)
        for _ in range(600):
            with contextlib.suppress(OSError):  # ENXIO: no reader now
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.1)

    threading.Thread(target=writer, daemon=True).start()


def _big_run(tmp_path: Path) -> Path:
    from skewlens.profiler.store.fast import MIN_NODES
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r).step(0)
        for _ in range(MIN_NODES):  # enough nodes to be cached
            rb.compute("aten::mm", dur_ns=1_000 * (r + 1))
        rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 10, dur_ns=500)
    return b.write(tmp_path / "run")


def test_a_fifo_in_place_of_a_trace_file_is_one_line_naming_it_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli import main

    run = _big_run(tmp_path)
    trace = run / "rank-1.et"
    trace.unlink()
    os.mkfifo(trace)
    _unblock_later(trace)
    t0 = time.monotonic()
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 2
    assert time.monotonic() - t0 < UNBLOCK_S
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            f"skewlens analyze: error: {run}: not loaded, 1 problem(s): {trace}: a FIFO, not a regular file: "
            f"cannot read trace file -- run `skewlens check {run}` for all; --lenient would leave out the "
            "unreadable rank(s) 1 and use the rest"
        )
    ]


def test_a_fifo_in_place_of_a_column_cache_file_is_no_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli import main
    from skewlens.profiler.store import colcache

    run = _big_run(tmp_path)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    cache = colcache.cache_path(run / "rank-1.et")
    cache.unlink()
    os.mkfifo(cache)
    _unblock_later(cache)
    capsys.readouterr()
    t0 = time.monotonic()
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    assert time.monotonic() - t0 < UNBLOCK_S  # not stuck until the FIFO's writer came
    assert "wrote 8 files" in capsys.readouterr().out
    assert cache.is_file()  # cached anew


def test_a_fifo_or_deep_json_in_place_of_a_runs_run_json_is_no_export_marker_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every load reads RUN/run.json (is it a Parquet export?): a FIFO there hung check until a writer came,
    # and JSON nested 100,000 deep was a RecursionError traceback
    from skewlens.cli import main

    run = _big_run(tmp_path)
    marker = run / "run.json"
    marker.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["check", str(run)]) == 0
    marker.unlink()
    os.mkfifo(marker)
    _unblock_later(marker)
    capsys.readouterr()
    t0 = time.monotonic()
    assert main(["check", str(run)]) == 0
    assert time.monotonic() - t0 < UNBLOCK_S
    assert "OK" in capsys.readouterr().out


def test_a_fifo_in_place_of_a_hosts_part_file_is_named_by_merge_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # another host's directory: merge read its part files with read_text, and a FIFO's open waited
    from test_capture_hosts import host_dir

    from skewlens.cli import main
    from skewlens.profiler.capture.session import part_file

    a = host_dir(tmp_path / "a", (0,), "a")
    b = host_dir(tmp_path / "b", (1,), "b")
    f = part_file(b, 1)
    f.unlink()
    os.mkfifo(f)
    _unblock_later(f)
    t0 = time.monotonic()
    assert main(["merge", "--out", str(tmp_path / "run"), str(a), str(b)]) == 2
    assert time.monotonic() - t0 < UNBLOCK_S
    err = capsys.readouterr().err
    assert (
        f"skewlens: ignoring unreadable part file {f}: a FIFO, not a regular file: cannot read part file"
        in err
    )
    assert f"{b}: ranks [1]: part file unreadable or malformed ({f})" in err
    assert not (tmp_path / "run").exists()


def _named_run(tmp_path: Path, name: str) -> Path:
    """Two ranks of five steps; rank 1's compute, named ``name``, runs six times as long."""
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        for s in range(5):
            rb.step(s)
            rb.compute(name, dur_ns=1_000_000 * (1 + 5 * r))
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000)
    return b.write(tmp_path / "run")


@pytest.mark.parametrize("color", [False, True], ids=["to a file", "to a terminal"])
def test_names_from_a_trace_print_as_plain_text_neither_markup_nor_terminal_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, color: bool
) -> None:
    # a trace is untrusted: an op named "x[/bold]" was a MarkupError traceback, and one named with an ESC
    # sequence set the terminal's title (or colours, or on some terminals the clipboard) when printed
    from skewlens.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # no cell wrapped
    if color:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    for name, shown in (("evil[/bold]", "evil[/bold]"), ("evil\x1b]0;pwned\x07", "evil\ufffd]0;pwned +")):
        run = _named_run(tmp_path / name.encode().hex(), name)
        assert main(["analyze", str(run), "--out", str(run.parent / "out")]) == 0
        out = capsys.readouterr().out
        assert f"compute grew: {shown}" in out
        assert "\x07" not in out and "\x1b]" not in out  # (rich drops the BEL itself)


def test_an_error_line_quoting_a_traces_name_prints_no_terminal_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.cli import main
    from skewlens.profiler.chakra_io import read_et, write_et

    run = _named_run(tmp_path, "aten::mm")
    et = read_et(run / "rank-0.et")
    last = et.nodes[-1]
    last.name = "\x1b[2Jgone"
    last.ctrl_deps.append(last.id)  # a cycle: the error names the node
    write_et(run / "rank-0.et", et.nodes, et.metadata)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "dependency cycle" in err and "\ufffd[2Jgone" in err and "\x1b" not in err


def _reader_gone(monkeypatch: pytest.MonkeyPatch) -> contextlib.AbstractContextManager[object]:
    """``sys.stdout`` a pipe whose reader has already gone (``| head`` after its lines, ``| true``)."""
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stdout", stream)
    return stream


def test_check_of_a_clean_run_whose_reader_went_away_still_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rich ended the command with exit code 1 at its first print: check's code for a run with errors
    from skewlens.cli import main
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000)
    run = b.write(tmp_path / "run")
    with _reader_gone(monkeypatch):
        assert main(["check", str(run)]) == 0


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["check", "--help"], ["replay", "--cfg", "job"], ["replay", "--info"]],
    ids=" ".join,
)
def test_help_into_a_pipe_whose_reader_went_away_ends_quietly_with_141(args: list[str]) -> None:
    # it was a BrokenPipeError traceback (Hydra's --cfg: its traceback and a hint) and exit code 1; Hydra's
    # --info, which prints through logging, a "--- Logging error ---" traceback per line and 141
    import subprocess
    import sys

    from skewlens.cli import BROKEN_PIPE_EXIT

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the flush at exit, too
    p = subprocess.Popen(
        [sys.executable, "-m", "skewlens", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before the command has started printing
    err = p.stderr.read()
    p.stderr.close()
    assert (p.wait(timeout=60), err) == (BROKEN_PIPE_EXIT, b"")


def _printed(monkeypatch: pytest.MonkeyPatch, table: Table, columns: int) -> list[str]:
    """The lines a report console ``columns`` wide prints of ``table``."""
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    report_console().print(table)
    return out.getvalue().splitlines()


def test_a_table_too_wide_for_the_terminal_folds_its_figures_instead_of_cutting_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # at 80 columns a GPU run's step breakdown showed a step of 615.14 ms as `615…`, 1,234.56 as `1,2…`
    t = Table()
    for header in ("alpha", "bravo", "charlie", "delta"):
        t.add_column(header, justify="right")
    t.add_row("615.14", "1,234.56", "3", "44.44")
    lines = _printed(monkeypatch, t, 30)
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert ["".join(column) for column in zip(*cells, strict=True)] == ["615.14", "1,234.56", "3", "44.44"]
    assert lines[1] == "┃ alp… ┃ bra… ┃ char… ┃ del… ┃"  # headers cut on their one line, not folded


def test_a_figure_in_a_column_that_may_not_wrap_is_never_cut_silently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the GPU kernels' and critical path's figures are no_wrap: folding made rich cut them without a mark,
    # 65.9 % as `65.` and 1,234,567.89 ms as `1,234,567.`, a figure that reads as whole. At 26 columns they
    # were cut with an ellipsis (`1,234,567…`, `65…`) and the kernel column was gone: there, rich leaving a
    # column no room, they fold whole
    t = Table()
    t.add_column("kernel", max_width=20)
    for header in ("kind", "ms / step", "%"):
        t.add_column(header, justify="right", no_wrap=True)
    t.add_row("ncclDevKernel_SendRecv", "nccl", "1,234,567.89", "65.9")
    rows = [line.split("│")[1:-1] for line in _printed(monkeypatch, t, 26) if line.startswith("│")]
    assert rows[0][0].strip() == "nc…"
    assert ["".join(c.strip() for c in column) for column in zip(*rows, strict=True)][1:] == [
        "nccl",
        "1,234,567.89",
        "65.9",
    ]


def test_every_c0_and_c1_control_but_tab_and_newline_prints_as_a_replacement_and_rich_controls_pass() -> None:
    from rich.control import Control

    from skewlens.console import printable

    kept = "\t\n -~\xa0é"
    controls = "".join(map(chr, [*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]))
    assert printable(kept + controls) == kept + "\N{REPLACEMENT CHARACTER}" * len(controls)
    # a progress bar's cursor moves are rich's own control segments: they pass as they are
    console = report_console()
    assert "".join(s.text for s in console.render(Control.move_to(1, 1))) == "\x1b[2;2H"


def test_a_report_console_whose_reader_went_away_writes_nothing_more() -> None:
    from skewlens.console import ReportConsole

    class Gone(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            self.writes += 1
            raise BrokenPipeError

    gone = Gone()
    console = ReportConsole(file=gone, markup=False)
    console.print("first")
    console.print("second")
    assert (console.quiet, gone.writes) == (True, 1)


def test_a_narrow_tables_figures_fold_and_its_text_columns_are_still_cut() -> None:
    from rich.console import Group
    from rich.table import Table

    out = io.StringIO()
    console = report_console()
    console.file, console.width = out, 24
    table = Table("kernel", "ms")
    table.columns[1].justify = "right"
    table.add_row("at::native::elementwise_kernel", "1,234,567.89")
    console.print(Group("a report's caption", table))  # as a report prints its tables, in a group
    rows = [ln.split("│")[1:3] for ln in out.getvalue().splitlines() if ln.startswith("│")]
    assert [(name.strip(), ms.strip()) for name, ms in rows] == [("at::nat…", "1,234,567"), ("", ".89")]
    # a figures column that chose its own overflow keeps it
    out.seek(0)
    out.truncate()
    table.columns[1].overflow = "crop"
    console.print(table)
    assert len([ln for ln in out.getvalue().splitlines() if ln.startswith("│")]) == 1


def test_a_later_sigterm_goes_to_the_handler_that_was_there_before_and_a_worker_thread_installs_none(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys
    import threading

    from skewlens.cli import sigterm_as_interrupt

    # the program's own SIGTERM handler gets a SIGTERM past TERM_REPEAT_S (here 0): not the default death
    script = (
        "import os, signal, time\n"
        "import skewlens.cli as cli\n"
        "cli.TERM_REPEAT_S = 0.0\n"
        "seen = []\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))\n"
        "with cli.sigterm_as_interrupt():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.1)\n"
        "print('handled', seen == [signal.SIGTERM])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.split()) == (0, ["interrupted", "handled", "True"])
    # off the main thread, Python allows no signal handler: it is left as it is, without an error
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with sigterm_as_interrupt():
                pass
        except BaseException as e:  # what the thread raised, for the assertion
            errors.append(e)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert errors == []


def test_silencing_a_closed_stream_leaves_it_as_it_is(tmp_path: Path) -> None:
    from skewlens.console import silence

    closed = (tmp_path / "out.txt").open("w")
    closed.close()
    silence(closed)  # its fileno() is a ValueError: nothing to point at the null device
    assert closed.closed


def test_a_quiet_pipe_stops_writing_to_a_stream_whose_reader_went_away_and_still_counts_what_it_took() -> (
    None
):
    from skewlens.console import QuietPipe

    class Gone(io.StringIO):
        calls = 0

        def write(self, text: str) -> int:
            Gone.calls += 1
            raise BrokenPipeError

        def flush(self) -> None:
            Gone.calls += 1
            raise BrokenPipeError

    pipe = QuietPipe(Gone())
    assert (pipe.write("line\n"), pipe.broken) == (5, True)
    assert pipe.write("more\n") == 5
    pipe.flush()
    assert Gone.calls == 1  # neither written nor flushed again once it broke
    fresh = QuietPipe(Gone())
    fresh.flush()
    assert (fresh.broken, fresh.write("x")) == (True, 1)
    assert Gone.calls == 2


def test_help_into_a_stream_that_breaks_returns_141_as_cat_ended_by_sigpipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skewlens.cli import main

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    monkeypatch.setattr("sys.stdout", Gone())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert main(["--help"]) == 141


def test_a_narrow_checks_problem_kind_is_kept_whole_and_its_message_gives_way() -> None:
    from skewlens.profiler.store.issues import Issue, Severity
    from skewlens.profiler.store.render import render_report
    from skewlens.profiler.store.validate import ValidationReport

    said = "rank 0 node 5 depends on node 9, which does not exist (dangling dependency)"
    issue = Issue(severity=Severity.ERROR, kind="dangling-dependency", message=said, rank=0, node=5)
    out = io.StringIO()
    Console(file=out, width=60).print(render_report(ValidationReport(path="RUN", issues=[issue])))
    assert "│ dangling-dependency │" in out.getvalue()


def test_checks_summary_lists_the_groups_in_the_order_torch_made_them_not_as_their_names_sort() -> None:
    # 4 ranks, 18 groups: "'0', '1', '10', '11', '12', '13', '14', '15', ... 10 more", groups 2-9 hidden
    from skewlens.profiler.manifest import ProcessGroupInfo
    from skewlens.profiler.store.render import _groups

    names = [str(i) for i in (0, 12, 1, 10, 2, 9)] + ["3722ef32ad8fe7c3370e39700f5dc805571d7206"]
    groups = {n: ProcessGroupInfo(name=n, ranks=(0, 1), desc={"2": "tp"}.get(n, "undefined")) for n in names}
    assert _groups(groups).replace(" (2 ranks)", "") == (
        "7: '0', '1', '2' (2 ranks, tp), '9', '10', '12', '3722ef32ad8fe7c3370e39700f5dc805571d7206'"
    )


def test_a_warning_with_no_stderr_at_all_is_dropped_not_printed_among_the_results_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # started with stderr closed (2>&-), sys.stderr is None, and print(file=None) writes to stdout
    import sys

    from skewlens.console import print_warning

    monkeypatch.setattr(sys, "stderr", None)
    print_warning("analyze", "rank 3 left out")
    assert capsys.readouterr().out == ""


def test_a_command_started_without_stdout_does_its_work_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # started with stdout closed (>&-), sys.stdout is None: the flush after the command was an
    # AttributeError traceback and exit code 1, after analyze had written its outputs
    import sys

    from skewlens.cli import main

    run = _named_run(tmp_path, "aten::mm")
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    assert sys.stdout is None  # put back as it was
    assert (tmp_path / "out" / "blame.parquet").is_file()


def test_an_error_with_no_stderr_at_all_is_dropped_not_printed_among_the_results_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # started with stderr closed (2>&-): the error line went to stdout, and argparse's usage with it
    import sys

    from skewlens.cli import main

    monkeypatch.setattr(sys, "stderr", None)
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--bogus"])
    assert exit_.value.code == 2
    assert capsys.readouterr().out == ""


def _encoded_stream(
    monkeypatch: pytest.MonkeyPatch, name: str, encoding: str, errors: str = "strict"
) -> tuple[io.BytesIO, io.TextIOWrapper]:
    """``sys.<name>`` a text stream of ``encoding`` and ``errors`` (as Python sets it up from the locale or
    ``PYTHONIOENCODING``) over the bytes returned with it."""
    import sys

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
    monkeypatch.setattr(sys, name, stream)
    return raw, stream


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_report_to_an_output_that_cannot_encode_its_characters_prints_stand_ins_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    # PYTHONIOENCODING=ascii (or a Latin-1 locale): the report's first character outside the encoding was
    # a UnicodeEncodeError traceback and exit code 1, and nothing of the report was printed
    from skewlens.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # no cell wrapped
    name = "kernel\N{RIGHTWARDS ARROW}\N{GREEK SMALL LETTER ALPHA}\N{HORIZONTAL ELLIPSIS}"
    run = _named_run(tmp_path, name)
    raw, out = _encoded_stream(monkeypatch, "stdout", encoding)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    printed = raw.getvalue().decode(encoding)
    assert "compute grew: kernel>a~ +" in printed
    assert printed.startswith("+-") or "\n+-" in printed  # rich's ASCII boxes
    assert out.errors == "strict"  # put back as it was


def test_a_table_on_an_ascii_stderr_keeps_its_columns_in_line_and_other_characters_are_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # stderr's own handler (backslashreplace) printed profile's summary header 'clock offset µs' as
    # 'offset \xb5s', three columns wider than the cell rich measured, and each … as \u2026
    from skewlens.console import encodable_output, print_warning

    raw, err = _encoded_stream(monkeypatch, "stderr", "ascii", "backslashreplace")
    t = Table()
    t.add_column("clock offset \N{MICRO SIGN}s", justify="right")
    t.add_column("real \N{GREEK CAPITAL LETTER DELTA}", justify="right")  # the real replay's
    t.add_column("name", max_width=8, no_wrap=True)
    t.add_row("5.3", "+1.0%", "a_long_name_cut")
    with encodable_output():
        report_console(stderr=True).print(t)
        print_warning("profile", "run dir \N{LATIN SMALL LETTER U WITH DIAERESIS}")
    lines = raw.getvalue().decode("ascii").splitlines()
    assert "clock offset us | real d" in lines[1] and "a_long_~" in lines[3]
    assert len({len(line) for line in lines[:-1]}) == 1  # the table's lines, each as wide as the others
    assert lines[-1] == "skewlens profile: warning: run dir \\xfc"
    assert err.errors == "backslashreplace"  # put back as it was


@pytest.mark.parametrize(
    ("args", "written"),
    [
        (["check", "~/run"], None),
        (["export", "~/run", "--out=~/pq"], "pq/ranks.parquet"),
        (["analyze", "~/run", "--out=~/out"], "out/blame.parquet"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_a_tilde_the_shell_left_in_a_path_argument_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], written: str | None
) -> None:
    # the shell expands neither --out=~/x nor a quoted '~/run': analyze made ./~/out, a directory named ~,
    # and '~/run' was "no such run directory"
    from skewlens.cli import main

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    _named_run(home, "aten::mm")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(args) == 0
    assert list(cwd.iterdir()) == []
    if written is not None:
        assert (home / written).is_file()


def test_the_output_directory_analyze_names_is_one_line_on_a_narrow_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # at 40 columns rich broke the path across lines, a line break in the middle of a directory's name
    from skewlens.cli import main

    monkeypatch.setenv("COLUMNS", "40")
    run = _named_run(tmp_path, "aten::mm")
    out = tmp_path / "a_directory_name_longer_than_the_terminal_is_wide" / "analysis"
    assert main(["analyze", str(run), "--out", str(out)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("wrote ") and last.endswith(f" files to {out}")


def test_a_printed_line_of_paths_is_left_for_the_terminal_to_wrap() -> None:
    from skewlens.console import print_line

    out = io.StringIO()
    print_line(Console(file=out, width=20), "outputs in /tmp/a_long_directory_name/[b]")
    assert out.getvalue() == "outputs in /tmp/a_long_directory_name/[b]\n"


def test_the_run_or_output_path_in_check_s_and_replay_s_titles_is_one_line_where_the_console_is_wide_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # their tables are narrower than a long path: rich wrapped the title to the table's width, with a
    # line break in the middle of the path, in a CI log 160 columns wide (export's and profile's did not)
    from skewlens.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    deep = tmp_path / ("a_directory_name_a_good_deal_longer_than_the_tables_below_" * 2)
    run = _named_run(deep, "aten::mm")
    assert main(["check", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[0].strip() == f"skewlens check {run}"
    assert main(["replay", f"trace={run}", f"out={deep / 'replay'}"]) == 0
    title = f"Simulated replay (as_recorded) -> {deep / 'replay'}"
    assert title in [line.strip() for line in capsys.readouterr().out.splitlines()]


def test_in_the_c_locale_without_utf8_mode_a_report_prints_stand_ins_and_a_file_names_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LC_ALL=C PYTHONUTF8=0: stdout is ASCII with surrogateescape, which took an … for an error as strict
    # does (skewlens analyze: a UnicodeEncodeError traceback, exit code 1)
    from skewlens.console import encodable_output

    raw, out = _encoded_stream(monkeypatch, "stdout", "ascii", "surrogateescape")
    with encodable_output():
        print("name\N{HORIZONTAL ELLIPSIS} in bad\udcff/run \N{MICRO SIGN}s")
    assert raw.getvalue() == b"name~ in bad\xff/run us\n"
    assert out.errors == "surrogateescape"


def test_force_color_on_a_pipe_keeps_the_colours_but_draws_no_progress_bar_and_the_file_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI sets FORCE_COLOR for coloured logs; rich then takes a pipe for a terminal: a bar was redrawn into
    # the log ten times a second (cursor moves and all) and the reports were 80 columns wide
    from skewlens.profiler.store.load import load_run
    from skewlens.rich_progress import RichProgress

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    console = report_console()
    assert console.is_terminal and console.width == FILE_WIDTH
    err = io.StringIO()
    load_run(_named_run(tmp_path, "aten::mm"), progress=RichProgress(Console(file=err, width=100)))
    assert err.getvalue() == ""
    console.print("x", style="red")
    assert "\x1b[31mx" in console.file.getvalue()  # type: ignore[attr-defined]


def test_the_check_command_an_error_gives_for_a_run_named_with_a_leading_dash_runs_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said `skewlens check -r` lists every problem, which argparse took for an option
    import shlex

    from skewlens.cli import main
    from skewlens.profiler.chakra_io import read_et, write_et

    _named_run(tmp_path / "-r", "aten::mm")
    run = tmp_path / "-r" / "run"
    et = read_et(run / "rank-0.et")
    et.nodes[-1].ctrl_deps.append(et.nodes[-1].id)  # a cycle: an error
    write_et(run / "rank-0.et", et.nodes, et.metadata)
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--out", "o", "--", "-r/run"]) == 2
    said = capsys.readouterr().err
    command = shlex.split(said.partition("`skewlens ")[2].partition("`")[0])
    assert command == ["check", "./-r/run"]
    assert main(command) == 1  # the run has errors, and check lists them


@pytest.mark.parametrize(("interactive", "drawn"), [(None, True), ("0", False)])
def test_tty_compatible_asks_for_progress_bars_on_a_pipe_even_with_force_color_unless_not_interactive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interactive: str | None, drawn: bool
) -> None:
    # rich's TTY_COMPATIBLE=1 is a request for a terminal's behaviour on a pipe: the end-to-end benchmark
    # reads each command's stages from the bars it draws there. With TTY_INTERACTIVE=0, which rich's docs
    # pair with it for a CI log in colour, no bar: each task of a load wrote '\x1b[?25l\x1b[?25h' and a
    # newline into the log
    from skewlens.profiler.store.load import load_run
    from skewlens.rich_progress import RichProgress

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    if interactive is not None:
        monkeypatch.setenv("TTY_INTERACTIVE", interactive)
    err = io.StringIO()
    load_run(_named_run(tmp_path, "aten::mm"), progress=RichProgress(Console(file=err, width=100)))
    assert ("loading" in err.getvalue()) == drawn
    assert drawn or err.getvalue() == ""


def test_no_bar_is_made_off_a_terminal_so_a_rich_that_ends_a_disabled_bar_with_an_empty_line_prints_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rich 13.0 to 14.2 (pyproject allows rich>=13.8) end even a disabled bar with an empty line where the
    # console is not interactive: `skewlens analyze RUN 2>err.txt` began err.txt with 4 empty lines, one per
    # task, above its one warning. Rich's stop as those releases have it:
    import rich.progress

    from skewlens.profiler.store.load import load_run
    from skewlens.rich_progress import RichProgress

    def stop_of_rich_13(self: rich.progress.Progress) -> None:
        self.live.stop()
        if not self.console.is_interactive:
            self.console.print()

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(rich.progress.Progress, "stop", stop_of_rich_13)
    err = io.StringIO()
    load_run(_named_run(tmp_path, "aten::mm"), progress=RichProgress(Console(file=err, width=100)))
    assert err.getvalue() == ""


def _ascii_stream(errors: str) -> tuple[io.BytesIO, io.TextIOWrapper]:
    raw = io.BytesIO()
    return raw, io.TextIOWrapper(raw, encoding="ascii", errors=errors, write_through=True)


def test_a_file_names_undecodable_byte_next_to_a_stand_in_prints_as_that_byte_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skewlens.console import STAND_IN_ERRORS, encodable_output

    raw, out = _ascii_stream("strict")
    monkeypatch.setattr("sys.stdout", out)
    with encodable_output():
        # a file name's byte 0xfc (LC_ALL=C) between stand-ins: it was a UnicodeEncodeError ('surrogateescape'
        # given the range of both) where the surrogate came first
        out.write("\N{HORIZONTAL ELLIPSIS}\udcfc\N{MICRO SIGN}s \udcfc\N{HORIZONTAL ELLIPSIS}")
    assert raw.getvalue() == b"~\xfcus \xfc~"
    assert out.errors == "strict"  # put back
    with pytest.raises(UnicodeDecodeError):
        b"\xff".decode("ascii", STAND_IN_ERRORS)


def test_a_stream_told_what_to_do_with_unencodable_characters_is_left_so_and_a_closed_one_is_left_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skewlens.console import encodable_output

    raw, out = _ascii_stream("replace")  # PYTHONIOENCODING=ascii:replace
    _raw2, gone = _ascii_stream("strict")
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", gone)
    with encodable_output():
        out.write("\N{HORIZONTAL ELLIPSIS}")
        gone.close()  # its reader gone: nothing to put back, no ValueError on the way out
    assert raw.getvalue() == b"?"
    assert gone.closed


def test_a_console_forced_to_be_a_terminal_is_one_and_a_closed_stream_under_force_color_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skewlens.console import on_a_terminal

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert on_a_terminal(Console(file=io.StringIO(), force_terminal=True))  # rich's word, no FORCE_COLOR
    monkeypatch.setenv("FORCE_COLOR", "1")
    closed = io.StringIO()
    closed.close()
    console = Console(file=closed)
    assert console.is_terminal and not on_a_terminal(console)


def test_the_null_device_standing_in_for_a_missing_stdout_is_closed_once_the_command_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from skewlens.cli import closed_streams_as_null

    monkeypatch.setattr("sys.stdout", None)
    with closed_streams_as_null():
        null = sys.stdout
        assert null is not None and not null.closed
        print("results", file=null)
    assert sys.stdout is None and null.closed


@pytest.mark.parametrize("columns", ["0", "1", "5"])
def test_a_console_narrower_than_a_tables_borders_draws_the_report_at_the_narrowest_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], columns: str
) -> None:
    from skewlens.cli import main
    from skewlens.console import MIN_WIDTH

    monkeypatch.setenv("COLUMNS", columns)
    run = _named_run(tmp_path, "aten::mm")
    # COLUMNS=0 printed no report at all; 1 and 5, rich's "Sum of ratios must be > 0" traceback
    assert main(["analyze", str(run), "--out", str(tmp_path / "a"), "--no-pictures"]) == 0
    assert main(["replay", f"trace={run}", f"out={tmp_path / 'r'}", "progress=false"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = [line for line in out if line[:1] in "┏┃┡│└"]
    assert len(table) > 20 and {len(line) for line in table} == {MIN_WIDTH}


def test_without_utf8_mode_a_run_and_outputs_in_non_ascii_directories_are_read_and_written(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    run = _named_run(tmp_path, "aten::mm").rename(tmp_path / "rün")
    out = tmp_path / "résumé"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    args = [sys.executable, "-m", "skewlens", "analyze", str(run), "--out", str(out), "--no-pictures"]
    p = subprocess.run(args, check=False, env=env, capture_output=True, timeout=120)
    # was exit 1: pyarrow's "UnicodeEncodeError: 'utf-8' codec can't encode characters ...: surrogates not
    # allowed" traceback, from the Parquet tables of out (and the column cache of a larger run)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-600:]
    assert (out / "blame.parquet").is_file()


def test_a_text_output_naming_a_file_python_could_not_decode_holds_the_names_own_bytes(
    tmp_path: Path,
) -> None:
    from skewlens.profiler.atomic import write_text_atomic

    # /data/rün as Python without UTF-8 mode reads it: calibrate's topology entry was a traceback
    write_text_atomic(tmp_path / "cal.yaml", "# from /data/r\udcc3\udcbcn\n")
    assert (tmp_path / "cal.yaml").read_bytes() == "# from /data/rün\n".encode()


def test_a_name_this_locale_cannot_decode_is_one_line_naming_it_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from skewlens.cli import main

    def export_main(_argv: list[str]) -> int:  # what writing '/data/rün' as a Parquet string did there
        raise UnicodeEncodeError("utf-8", "/data/r\udcc3\udcbcn/rank-0.et", 7, 9, "surrogates not allowed")

    monkeypatch.setattr("skewlens.cli.store.export_main", export_main)
    assert main(["export", "/data/rün"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        (
            "skewlens export: error: '/data/rün/rank-0.et': holds a name this locale cannot decode (file "
            f"names are {sys.getfilesystemencoding()} here, and this one is not), which an output cannot "
            "hold; run with PYTHONUTF8=1 or in a UTF-8 locale"
        )
    ]


def test_without_utf8_mode_a_column_cache_in_a_non_ascii_directory_is_written_and_read_back(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in (0, 1):
        rb = b.rank(r)
        for s in range(30):  # 60 nodes a rank: decoded by the column decoder, whose columns are cached
            rb.step(s)
            rb.compute("aten::mm", dur_ns=1_000_000)
            rb.collective(CommType.ALL_REDUCE, comm_bytes=1 << 20, dur_ns=200_000)
    run = b.write(tmp_path / "run").rename(tmp_path / "rün")
    code = (
        "import sys; from pathlib import Path; from skewlens.profiler.store import colcache, load_run\n"
        "run = Path(sys.argv[1]); load_run(run)\n"
        "traces = sorted(run.glob('rank-*.et'))\n"
        "print([colcache.read(t, colcache.fingerprint(t)) is not None for t in traces])\n"
    )
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.pop("SKEWLENS_COLUMN_CACHE", None)
    p = subprocess.run(
        [sys.executable, "-c", code, str(run)], check=False, env=env, capture_output=True, timeout=120
    )
    # was read under the name's UTF-8 encoding, another name or none there: every load decoded the traces
    assert (p.returncode, p.stdout.strip()) == (0, b"[True, True]"), p.stderr.decode(errors="replace")[-600:]


def test_only_a_name_python_could_not_decode_is_said_to_be_one_and_only_its_surroundings_are_shown() -> None:
    from skewlens.console import undecodable_name

    # an ASCII output given an 'é' is no undecodable name: it stays the error it is
    assert undecodable_name(UnicodeEncodeError("ascii", "é", 0, 1, "ordinal not in range(128)")) is None
    # of a long text, the 60 characters either side of the undecodable byte
    text = "a" * 100 + "\udcfc" + "b" * 100
    e = UnicodeEncodeError("utf-8", text, 100, 101, "surrogates not allowed")
    said = undecodable_name(e)
    assert said is not None and said.startswith(repr("a" * 60 + "\ufffd" + "b" * 60) + ": holds a name")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_dumb_terminal_gets_no_empty_line_per_task_and_the_width_columns_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TERM=dumb (Emacs' shell, Emacspeak's users): rich draws no bar there, and each task's transient bar
    # left an empty line (`skewlens analyze` of the DLRM run: six above the report); rich's 80 columns
    # there overrode COLUMNS=60 and COLUMNS=120
    from skewlens.rich_progress import RichProgress

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "LINES", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "dumb")
    err = _Terminal()
    progress = RichProgress(Console(file=err))
    assert progress.console.is_dumb_terminal
    for task in ("loading ranks", "skew"):
        with progress.task(task, 2) as advance:
            advance()
    assert err.getvalue() == ""
    monkeypatch.setattr("sys.stdout", _Terminal())
    for columns in (60, 120):
        monkeypatch.setenv("COLUMNS", str(columns))
        assert report_console().width == columns
    monkeypatch.setenv("COLUMNS", "5")
    assert report_console().width == 20  # MIN_WIDTH, as on any terminal


class _ReaderGone(io.StringIO):
    """A stderr whose reader went away: every write raises BrokenPipeError."""

    def write(self, s: str) -> int:
        raise BrokenPipeError


def test_an_error_said_to_a_stderr_whose_reader_went_away_still_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `skewlens analyze RUN --out OUT 2>&1 | head -3`: the error line raised again and the exit code was 141
    import sys

    from skewlens.cli import main

    monkeypatch.setattr(sys, "stderr", _ReaderGone())
    assert main(["analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert main(["analyzed"]) == 2  # an unknown command: its line and the usage


def test_profile_s_lost_rank_error_to_a_stderr_whose_reader_went_away_still_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # profile printed its lines with print(file=sys.stderr): the summary went quiet (a report console), and
    # the warnings and error line after it raised BrokenPipeError, exit code 141 in place of 2 (and a note
    # printed before --parquet ended the command before the export)
    import sys

    from skewlens.cli.profile import _report_not_saved
    from skewlens.profiler.manifest import read_manifest
    from skewlens.profiler.synth import RunBuilder

    b = RunBuilder(world_size=2)
    b.rank(0).step(1).compute("aten::mm", 1_000)
    run = b.write(tmp_path / "run")
    manifest = dataclasses.replace(
        read_manifest(run), ranks=(0,), missing_ranks=(1,), notes={"rank 0 clock": "no clock offset"}
    )
    monkeypatch.setattr(sys, "stderr", _ReaderGone())
    assert _report_not_saved(manifest, run, "rank 1: trace not saved: No space left on device") == 2


def test_a_table_whose_unwrapped_names_leave_its_figures_no_room_folds_them_all_and_loses_nothing() -> None:
    # at 40 columns the worst collectives were their names beside six empty columns, and calibrate's fit
    # table its fits' names and no figure: rich gave the columns that may not wrap all the room
    out = io.StringIO()
    console = report_console()
    console.file, console.width = out, 40
    table = Table("step", "collective", "bytes", "skew ms", "late", "blamed")
    table.columns[1].no_wrap = True
    for column in (table.columns[0], *table.columns[2:]):
        column.justify = "right"
    row = ("12", "all_reduce 0#1234", "3.0 MiB", "1,284.323", "3", "2")
    table.add_row(*row)
    console.print(table)
    lines = [ln.split("│")[1:-1] for ln in out.getvalue().splitlines() if ln.startswith("│")]
    assert ["".join("".join(c.split()) for c in column) for column in zip(*lines, strict=True)] == [
        cell.replace(" ", "") for cell in row
    ]
    # where the names leave room, they stay on their one line
    out.seek(0)
    out.truncate()
    console.width = 80
    console.print(table)
    assert "│ all_reduce 0#1234 │" in out.getvalue()


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal of os.openpty")
def test_a_dumb_terminal_without_columns_is_drawn_as_wide_as_the_terminal_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TERM=dumb on a real terminal without COLUMNS was drawn rich's 80 columns whatever its width
    import fcntl
    import struct
    import termios

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "LINES", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "dumb")
    main_fd, tty_fd = os.openpty()
    try:
        with open(tty_fd, "w", encoding="utf-8", closefd=False) as tty:
            monkeypatch.setattr("sys.stdout", tty)
            for columns in (60, 132):
                fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
                assert report_console().width == columns
            monkeypatch.setenv("COLUMNS", "100")  # COLUMNS still decides
            assert report_console().width == 100
            monkeypatch.delenv("COLUMNS")
            fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
            assert report_console().width == 80  # a terminal that tells no size: rich's width, as before
    finally:
        os.close(main_fd)
        os.close(tty_fd)


def test_a_stream_that_tells_no_terminal_size_has_no_columns(tmp_path: Path) -> None:
    # no file descriptor (a writer of its own), a closed file (ValueError), a StringIO (UnsupportedOperation)
    class Writer:
        def write(self, text: str) -> int:
            return len(text)

    with (tmp_path / "f").open("w") as closed:
        pass
    assert [_terminal_columns(s) for s in (Writer(), closed, io.StringIO())] == [0, 0, 0]  # type: ignore[arg-type]
