"""An output whose place is under a regular file is refused in words that say so, before any work."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from user_docs import ROOT

from skewlens.cli import main as skewlens_main
from skewlens.profiler.atomic import (
    DIR_MODE,
    atomic_file,
    check_writable,
    move_into,
    replace_dir,
    staging_dir,
)
from skewlens.profiler.chakra_io import EtWriter
from skewlens.profiler.errors import SkewlensError
from skewlens.profiler.synth import RunBuilder
from skewlens.profiler.vocab import CommType


def fds_under(path: Path) -> list[str]:
    """What this process's open descriptors under ``path`` point to (not every descriptor: another test's
    file closed by the garbage collector meanwhile is none of this one's)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                out.append(target)
    return sorted(out)


def small_run(path: Path) -> Path:
    b = RunBuilder(world_size=2)
    for r in (0, 1):
        b.rank(r).compute("aten::mm", dur_ns=1_000, start_ns=0)
        b.rank(r).collective(CommType.ALL_REDUCE, comm_bytes=1024, dur_ns=1_000)
    return b.write(path)


@pytest.mark.parametrize("command", ["analyze", "export", "replay", "import"])
def test_an_out_under_a_regular_file_says_that_file_is_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    run = small_run(tmp_path / "run")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    kineto = tmp_path / "k.json"
    kineto.write_text('{"traceEvents": []}')
    for out in (blocker / "sub", blocker / "sub" / "deeper"):
        args, says = (
            [command, str(run), "--out", str(out)],
            f"cannot write {out}: {blocker} is not a directory",
        )
        if command == "replay":  # was "(Not a directory)"
            args = [command, f"trace={run}", f"out={out}"]
            says = f"out={out}: cannot be made a directory ({blocker} is not a directory)"
        if command == "import":  # was "FILE: cannot create ([Errno 17] File exists: 'FILE')"
            args = [command, "--kineto", str(kineto), "--out", str(out)]
            says = f"{out.parent}: cannot create ({blocker} is not a directory)"
        assert skewlens_main(args) == 2
        # was "cannot write .../file/sub: File exists" (and "Not a directory" one level down)
        assert capsys.readouterr().err.splitlines()[-1] == f"skewlens {command}: error: {says}"
    assert blocker.read_text() == "x"


def test_every_writer_names_the_regular_file_in_the_way(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "sub" / "out.json"
    says = f"^cannot write {out}: {blocker} is not a directory$"
    with pytest.raises(SkewlensError, match=says), atomic_file(out):
        pass
    with pytest.raises(SkewlensError, match=says), staging_dir(out):
        pass
    with pytest.raises(SkewlensError, match=says), EtWriter(out):
        pass
    with pytest.raises(SkewlensError, match=says):
        check_writable(out)
    check_writable(tmp_path / "new" / "dirs" / "out.yaml")  # a place that can be made is taken
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # and nothing is made to check it


def test_a_place_on_a_read_only_file_system_is_said_to_be_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `skewlens calibrate RUN --out cal.yaml` in a read-only working directory (a locked-down node's) said
    # "cannot write cal.yaml: .: Permission denied", of a directory the user owns. The mount is simulated
    # (access(2) says no to root on a read-only one, and os.statvfs flags it)
    import os

    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, path: object) -> None:
            self.f_flag = real_statvfs(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", ReadOnly)
    with pytest.raises(
        SkewlensError, match=f"^cannot write {tmp_path / 'cal.yaml'}: {tmp_path}: Read-only file system$"
    ):
        check_writable(tmp_path / "cal.yaml")
    monkeypatch.setattr(os, "statvfs", real_statvfs)
    with pytest.raises(
        SkewlensError, match=f"^cannot write {tmp_path / 'cal.yaml'}: {tmp_path}: Permission denied$"
    ):
        check_writable(tmp_path / "cal.yaml")
    # a mount whose flags cannot be read is said to refuse, not a traceback of statvfs's OSError

    def unreadable(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "statvfs", unreadable)
    with pytest.raises(
        SkewlensError, match=f"^cannot write {tmp_path / 'cal.yaml'}: {tmp_path}: Permission denied$"
    ):
        check_writable(tmp_path / "cal.yaml")


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_a_directory_at_one_output_name_refuses_the_move_and_leaves_the_earlier_output_whole(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, run = tmp_path / "out", small_run(tmp_path / "run")
    args = [command, str(run), "--out", str(out), "--no-blame"]
    if command == "replay":
        args = [command, f"trace={run}", f"out={out}", "progress=false"]
    assert skewlens_main(args) == 0
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    blocked = "timeline.json" if command == "replay" else "trace_critical_path.json"
    (out / blocked).unlink()
    (out / blocked / "x").mkdir(parents=True)
    del earlier[blocked]
    capsys.readouterr()
    other = ["slowdown=straggler", "slowdown.rank=1"] if command == "replay" else ["--no-pictures"]
    assert skewlens_main([*args, *other]) == 2
    # the moves stopped at the directory: out held this run's first files beside the earlier run's others
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"skewlens {command}: error: cannot write {out / blocked}: a directory is in the way; "
        f"{out} was left as it was"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no staging directory left


@pytest.mark.parametrize("command", ["analyze", "export", "replay"])
def test_a_full_disk_names_the_output_file_not_its_staging_copy_and_leaves_nothing_behind(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import pyarrow.parquet as pq

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    out, run = tmp_path / "out", small_run(tmp_path / "run")
    monkeypatch.setattr(pq, "write_table", full)
    args = [command, str(run), "--out", str(out)]
    if command == "replay":
        args = [command, f"trace={run}", f"out={out}", "progress=false"]
    assert skewlens_main(args) == 2
    # was "cannot write .../.out.k3j2x7.tmp/collective_skew.parquet: ...": a path gone once it is read
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"skewlens {command}: error: cannot write {out}/"), line
    assert line.endswith(".parquet: No space left on device") and ".tmp" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _between_first_renames(
    parent: Path, monkeypatch: pytest.MonkeyPatch, other: Callable[[], object]
) -> list[threading.Thread]:
    """Run ``other`` in a thread right after the first rename of an entry of ``parent``, and wait for it
    there at most half a second (where it waits for a lock); the caller joins the thread after."""
    real_replace = Path.replace
    threads: list[threading.Thread] = []

    def replace(self: Path, target: str | Path) -> Path:
        done = real_replace(self, target)
        if self.parent == parent and not threads:
            threads.append(threading.Thread(target=other))
            threads[0].start()
            threads[0].join(timeout=0.5)
        return done

    monkeypatch.setattr(Path, "replace", replace)
    return threads


def _staged(d: Path, text: str, *names: str) -> Path:
    d.mkdir()
    for name in names:
        (d / name).write_text(text)
    return d


def test_two_outputs_moved_into_one_directory_at_once_leave_the_last_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("summary.parquet", "timeline.parquet", "config.yaml")
    out = tmp_path / "out"
    first, second = _staged(tmp_path / "a", "a", *names), _staged(tmp_path / "b", "b", *names)
    threads = _between_first_renames(first, monkeypatch, lambda: move_into(second, out, names))
    move_into(first, out, names)
    threads[0].join()
    # the second's moves ran between the first's: out held one replay's summary beside the other's timeline
    assert [(out / n).read_text() for n in names] == ["b", "b", "b"]


def test_two_exports_replacing_one_directory_at_once_leave_the_last_one_and_no_hidden_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _staged(tmp_path / "pq", "earlier", "ranks.parquet")
    first, second = (
        _staged(tmp_path / "a", "a", "ranks.parquet"),
        _staged(tmp_path / "b", "b", "ranks.parquet"),
    )
    threads = _between_first_renames(tmp_path, monkeypatch, lambda: replace_dir(second, out))
    # the first had moved pq aside when the second put its own there: the first's rename then failed
    # (Directory not empty), and the earlier export stayed hidden as .pq.old-PID
    replace_dir(first, out)
    threads[0].join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pq"]
    assert (out / "ranks.parquet").read_text() == "b"


@pytest.mark.parametrize("under", [False, True], ids=["out", "a parent"])
@pytest.mark.parametrize("command", ["analyze", "export", "replay", "import"])
def test_an_out_that_is_a_dangling_link_is_named_as_one_and_left_alone(
    command: str, under: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, run = tmp_path / "out", small_run(tmp_path / "run")
    out.symlink_to(tmp_path / "gone")
    link = f"a symbolic link to {tmp_path / 'gone'}, which does not exist"
    if under:  # OUT/sub: was 'File exists' (import: '[Errno 17] File exists: OUT'), naming no link
        link, out = f"{out} is {link}", out / "sub"
    args, says = [command, str(run), "--out", str(out)], f"cannot write {out}: {link}"
    if command == "replay":
        args, says = (
            [command, f"trace={run}", f"out={out}"],
            f"out={out}: cannot be made a directory ({link})",
        )
    if command == "import":
        kineto = tmp_path / "k.json"
        kineto.write_text('{"traceEvents": []}')
        args, says = (
            [command, "--kineto", str(kineto), "--out", str(out)],
            f"{out}: {link}; give --out another",
        )
    assert skewlens_main(args) == 2
    # was "File exists (out)" / "Not a directory" (import: after the whole import, naming its staging path)
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"skewlens {command}: error: {says}")
    assert (tmp_path / "out").is_symlink() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_an_output_directory_that_cannot_be_opened_to_lock_is_still_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    real_open = os.open

    def no_read(path: str | Path, flags: int, *a: int, **k: Any) -> int:
        if flags == os.O_RDONLY | os.O_DIRECTORY and not k:  # the lock's: a directory of mode 0333
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *a, **k)

    out = _staged(tmp_path / "pq", "earlier", "ranks.parquet")
    monkeypatch.setattr(os, "open", no_read)
    replace_dir(_staged(tmp_path / "a", "a", "ranks.parquet"), out)
    move_into(_staged(tmp_path / "b", "b", "summary.parquet"), out, ("summary.parquet",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "pq"]
    assert sorted(p.name for p in out.iterdir()) == ["ranks.parquet", "summary.parquet"]


@pytest.mark.parametrize("stop", ["error", "interrupt before", "interrupt after"])
def test_a_directory_swap_that_fails_halfway_puts_the_earlier_directory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    # an interrupt (Ctrl-C, SIGTERM) after the earlier export was moved aside and before the new one took
    # its place left no OUT at all, the earlier export hidden beside it as .OUT.<random>.tmp.old for good
    import errno

    out, new = (
        _staged(tmp_path / "pq", "earlier", "ranks.parquet"),
        _staged(tmp_path / "a", "a", "ranks.parquet"),
    )
    real_replace = Path.replace

    def replace(self: Path, target: str | Path) -> Path:
        if self != new:
            return real_replace(self, target)
        if stop == "error":  # another program's directory appeared at pq after it was moved aside
            raise OSError(errno.ENOTEMPTY, "Directory not empty")
        if stop == "interrupt after":  # the signal's handler runs just after this rename
            real_replace(self, target)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", replace)
    with pytest.raises(OSError if stop == "error" else KeyboardInterrupt):
        replace_dir(new, out)
    # the earlier export is where it was, not hidden beside it; or the new one, done before the interrupt
    done = stop == "interrupt after"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["pq"] if done else ["a", "pq"])
    assert (out / "ranks.parquet").read_text() == ("a" if done else "earlier")


def test_a_trace_file_that_cannot_be_made_in_the_staging_directory_is_named_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    real_mkstemp = tempfile.mkstemp

    def no_inodes(*a: Any, **k: Any) -> Any:
        if str(k.get("prefix", "")).endswith(".et."):  # the disk's inodes used up
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkstemp(*a, **k)

    out, run = tmp_path / "out", small_run(tmp_path / "run")
    monkeypatch.setattr(tempfile, "mkstemp", no_inodes)
    assert skewlens_main(["export", str(run), "--format", "astra-sim", "--out", str(out)]) == 2
    # was "cannot write OUT/.out.k3j2x7.tmp/workload.0.et: ...": the writer's own error kept the staged path
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"skewlens export: error: cannot write {out}/"), line
    assert line.endswith(".0.et: No space left on device") and ".tmp" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_full_disk_while_an_astra_sim_export_writes_its_configs_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    out, run = tmp_path / "out", small_run(tmp_path / "run")
    write_text = Path.write_text

    def full(self: Path, *a: Any, **k: Any) -> int:
        if self.parent.name.startswith(f".{out.name}."):  # a file in the export's staging directory
            raise OSError(errno.EFBIG, "File too large")
        return write_text(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    assert skewlens_main(["export", "--format", "astra-sim", str(run), "--out", str(out)]) == 2
    # was "cannot write OUT: File too large": which of its files, not said
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == f"skewlens export: error: cannot write {out}/comm_groups.json: File too large"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _outputs_of(command: str, run: Path, out: Path) -> tuple[list[str], list[str]]:
    """The arguments of one ``command`` of ``run`` into ``out``, and the files it writes there."""
    if command == "replay":
        args = [command, f"trace={run}", f"out={out}", "progress=false"]
        return args, ["config.yaml", "summary.parquet", "timeline.json", "timeline.parquet"]
    args = [command, str(run), "--out", str(out), "--no-pictures"]
    return args, ["blame.parquet", "blame_steps.parquet", "collective_skew.parquet", "critical_path.parquet",
                  "step_breakdown.parquet"]  # fmt: skip


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_an_out_that_is_a_mount_point_gets_its_files_moved_in_on_its_own_file_system(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    run, out = small_run(tmp_path / "run"), tmp_path / "volume"
    out.mkdir()  # a container's output volume: no rename crosses into it or out of it
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path, **kwargs: Any) -> None:
        if Path(src).absolute().is_relative_to(out) != Path(dst).absolute().is_relative_to(out):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    args, files = _outputs_of(command, run, out)
    # was exit 2: "cannot write .../volume: Invalid cross-device link (.../volume/collective_skew.parquet)"
    assert skewlens_main(args) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "volume"]


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_an_out_in_a_directory_the_user_cannot_write_is_written_when_out_itself_can_be(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    run, out = small_run(tmp_path / "run"), tmp_path / "artifacts" / "out"
    out.mkdir(parents=True)  # a CI job's own directory, in one it cannot write (the tests run as root)
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a: Any, **k: Any) -> str:
        if (place := k.get("dir", a[2] if len(a) > 2 else None)) is not None and Path(place) == out.parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(place))
        return real_mkdtemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    args, files = _outputs_of(command, run, out)
    # was exit 2: "cannot write .../artifacts/out: Permission denied"
    assert skewlens_main(args) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == files


def test_an_output_that_replaces_a_whole_directory_says_it_cannot_replace_a_mount_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    out, new = tmp_path / "volume", _staged(tmp_path / "a", "a", "ranks.parquet")
    out.mkdir()
    real_replace = Path.replace

    def replace(self: Path, target: str | Path) -> Path:
        if self == out:  # the kernel's answer to a rename of a mount point
            raise OSError(errno.EBUSY, "Device or resource busy", str(out))
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    # was "cannot write .../volume: Device or resource busy (.../volume)" (export, import, merge)
    with pytest.raises(SkewlensError) as e:
        replace_dir(new, out)
    assert str(e.value) == (
        f"cannot write {out}: it is a mount point, and this output replaces its whole directory (by renames "
        f"beside it); give a directory inside it, such as {out / 'out'}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "volume"]


def test_an_export_into_a_directory_in_one_the_user_cannot_write_says_where_it_could_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import tempfile

    run, out = small_run(tmp_path / "run"), tmp_path / "artifacts" / "pq"
    out.mkdir(parents=True)  # writable itself; the export replaces it whole, from beside it
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a: Any, **k: Any) -> str:
        if Path(k["dir"]) == out.parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(out.parent))
        return real_mkdtemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    assert skewlens_main(["export", str(run), "--out", str(out)]) == 2
    # was "cannot write .../artifacts/pq: Permission denied", of a directory the user can write
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"skewlens export: error: cannot write {out}: Permission denied in {out.parent}, where it is made "
        "anew beside pq to replace it whole"
    )
    # a new out: nothing is replaced, and that directory is where it is made, which the line says alone
    out.rmdir()
    assert skewlens_main(["export", str(run), "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"skewlens export: error: cannot write {out}: Permission denied"
    )


@pytest.mark.parametrize("command", ["analyze", "export", "replay"])
def test_an_output_named_by_the_longest_name_the_file_system_takes_is_written(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = small_run(tmp_path / "run")
    out = tmp_path / ("o" * 250)  # a name Linux takes (255 bytes at most)
    args = [command, str(run), "--out", str(out)]
    if command == "replay":
        args = [command, f"trace={run}", f"out={out}", "progress=false"]
    # was "skewlens analyze: error: cannot write .../ooo...o: File name too long": its staging directory's
    # name, ".ooo...o.k3j2x7ab.tmp", was 264 bytes
    assert skewlens_main(args) == 0, capsys.readouterr().err
    assert sorted(len(p.name) for p in tmp_path.iterdir()) == [3, 250]


def test_a_file_named_by_the_longest_name_and_its_temporary_copy_fit_the_file_system(tmp_path: Path) -> None:
    name = "é" * 127  # 254 bytes in UTF-8: the temporary name is cut at bytes, not characters
    with atomic_file(tmp_path / name) as tmp:
        assert len(os.fsencode(tmp.name)) <= 255
        tmp.write_text("x")
    with EtWriter(tmp_path / (name[:-2] + ".et")) as w:
        w.write_raw(b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name[:-2] + ".et", name]


def test_an_export_in_a_shared_set_group_id_directory_keeps_its_group_bit_as_mkdir_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = small_run(tmp_path / "run")
    shared = tmp_path / "team"
    shared.mkdir()
    shared.chmod(0o2775)  # a team's directory: what is made in it belongs to the team's group
    out = shared / "out"
    assert skewlens_main(["export", str(run), "--out", str(out)]) == 0, capsys.readouterr().err
    dirs = [out, *(p for p in out.rglob("*") if p.is_dir())]
    # was 0o755 without the bit (mkdtemp's directory chmod-ed): the files in it took the writer's own
    # group, and a second member of the team could not replace or remove them (2 users, a real replay's
    # OUT: 'skewlens replay: error: cannot write team/real: Permission denied (team/real/run)')
    assert {p.relative_to(shared).as_posix(): bool(p.stat().st_mode & stat.S_ISGID) for p in dirs} == {
        p.relative_to(shared).as_posix(): True for p in dirs
    }
    with staging_dir(shared / "real", inside=True) as stage:  # a real replay's OUT: its run/ and real/
        assert stage.stat().st_mode & 0o7777 == DIR_MODE | stat.S_ISGID


def test_an_interrupt_while_a_staging_directory_is_made_closes_its_lock_and_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while a killed command's staging directory was being removed (a whole output: seconds) left the
    # new staging directory and its lock's descriptor open: in a notebook, a directory locked for the
    # kernel's life, which no later command removes, and one descriptor more each time
    import skewlens.profiler.atomic as atomic

    out = tmp_path / "o"
    out.mkdir()
    abandoned = out / ".o.k3j2x7ab.tmp"
    abandoned.mkdir()

    rmtree = atomic.shutil.rmtree

    def interrupted(path: Any, **kwargs: Any) -> None:
        if Path(path) == abandoned:
            raise KeyboardInterrupt
        rmtree(path, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt), staging_dir(out, inside=True):
        pass
    monkeypatch.undo()
    assert fds_under(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == [".o.k3j2x7ab.tmp"]


def test_a_staging_directorys_lock_is_closed_when_its_block_ends_however_it_ends(tmp_path: Path) -> None:
    # the lock a command holds on its staging directory is a descriptor: left open at the block's end, a
    # notebook's exports and analyses would each keep one more until 'Too many open files', and each lock
    # for the kernel's life
    with staging_dir(tmp_path / "o") as stage:
        (stage / "x").write_text("x")
        assert fds_under(tmp_path) != []  # the lock is held while the block writes
    with pytest.raises(ValueError, match=r"^mid-write$"), staging_dir(tmp_path / "o", inside=True):
        raise ValueError("mid-write")
    assert fds_under(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_an_interrupt_between_two_moves_into_out_says_out_may_mix_two_outputs(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGTERM between the renames that move a command's outputs into OUT left the first of them new and
    # the rest the earlier command's, and the command said "interrupted" alone
    out, run = tmp_path / "out", small_run(tmp_path / "run")
    args = [command, str(run), "--out", str(out), "--no-blame", "--no-pictures"]
    if command == "replay":
        args = [command, f"trace={run}", f"out={out}", "progress=false"]
    assert skewlens_main(args) == 0
    earlier = {p.name: p.stat().st_ino for p in out.iterdir() if p.is_file()}  # each move is a new file
    replace = Path.replace
    moved: list[str] = []

    def interrupted(self: Path, target: Any) -> Path:
        if Path(target).parent == out and self.parent != out:  # a move from the staging directory
            if moved:
                raise KeyboardInterrupt  # as sigterm_as_interrupt raises it, between two renames
            moved.append(Path(target).name)
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", interrupted)
    capsys.readouterr()
    other = ["comm_mode=model"] if command == "replay" else ["--top", "1"]
    assert skewlens_main([*args, *other]) == 130
    now = {p.name: p.stat().st_ino for p in out.iterdir() if p.is_file()}
    new = sorted(name for name, ino in now.items() if earlier.get(name) != ino)
    assert (new, len(now)) == (moved, len(earlier))  # a mix: the first output new, the others as they were
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"skewlens {command}: interrupted while its outputs were moved into {out}, which may now hold some "
        "of them beside an earlier output's; run the command again"
    )


def test_an_interrupt_after_a_replays_files_moved_in_and_before_an_earlier_real_replays_went_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the simulated replay's files were in OUT, the earlier real replay's run/ still beside them (a replay
    # of other settings), and the command said "interrupted" alone
    import skewlens.cli.replay as cli_replay

    out, run = tmp_path / "out", small_run(tmp_path / "run")
    (out / "run").mkdir(parents=True)  # an earlier real replay's
    rmtree = cli_replay.shutil.rmtree

    def interrupted(path: Any, **kwargs: Any) -> None:
        if Path(path) == out / "run":
            raise KeyboardInterrupt
        rmtree(path, **kwargs)

    monkeypatch.setattr(cli_replay.shutil, "rmtree", interrupted)
    assert skewlens_main(["replay", f"trace={run}", f"out={out}", "progress=false"]) == 130
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "run", "summary.parquet", "timeline.json", "timeline.parquet",
    ]  # fmt: skip
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"skewlens replay: interrupted while its outputs were moved into {out}, which may now hold some "
        "of them beside an earlier output's; run the command again"
    )


def _killed_by_sigkill(script: str, *args: Path) -> Path:
    """The path that the Python ``script`` (run with ``args``) printed before it killed itself with SIGKILL
    (the OOM killer)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return Path(proc.stdout.strip())


def _killed_while_staging(out: Path) -> Path:
    """The staging directory a command writing ``out`` left when SIGKILL (the OOM killer) stopped it."""
    killed = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from skewlens.profiler.atomic import staging_dir\n"
        "with staging_dir(Path(sys.argv[1])) as stage:\n"
        "    (stage / 'collectives.parquet').write_text('half')\n"
        "    print(stage, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    left = _killed_by_sigkill(killed, out)
    assert (left / "collectives.parquet").read_text() == "half"
    return left


def _export_or_analyze(command: str, run: Path, out: Path) -> int:
    """The exit code of ``skewlens export RUN --out OUT`` or ``analyze RUN --out OUT --no-pictures``."""
    args = [command, str(run), "--out", str(out)]
    return skewlens_main([*args, "--no-pictures"] if command == "analyze" else args)


@pytest.mark.parametrize("command", ["export", "analyze"])
def test_a_killed_commands_staging_directory_of_another_output_is_removed_by_the_next_one_beside_it(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a nightly job writes a new FLEET/run=<date> (AN/run=<date>) each night: a night killed while it wrote
    # left FLEET/.run=<date>.<random>.tmp/, a whole export's files, which only that night's export again
    # would have removed, so they piled up (and a glob of FLEET/*/ read them as runs)
    run, fleet = small_run(tmp_path / "run"), tmp_path / "FLEET"
    killed = _killed_while_staging(fleet / "run=n1")
    mine = {  # the user's own: not named as skewlens names a staging directory, whatever the output's name
        name: fleet / name
        for name in (
            ".foo.tmp",
            ".run=n2.tmp",
            ".run=n1.k3j2x7a.tmp",
            ".run=n1.k3j2x7ab.keep",
            ".run=n1.k3j2x7ab.tmp.bak",  # begins as a staging name: fullmatch, not match
        )
    }
    for p in mine.values():
        p.mkdir()
    (fleet / ".run=n1.k3j2x7ab.tmp").write_text("a file of the user's")
    with staging_dir(fleet / "run=n3") as running:  # another command's, still writing: left alone
        assert _export_or_analyze(command, run, fleet / "run=n2") == 0
        assert running.is_dir()
    assert not killed.exists()
    assert sorted(p.name for p in fleet.iterdir()) == sorted([".run=n1.k3j2x7ab.tmp", "run=n2", *mine])
    capsys.readouterr()


def _killed_while_removing_the_earlier(run: Path, out: Path) -> Path:
    """The earlier export of ``out`` that an export of ``run`` into it, killed (SIGKILL) while it removed
    that earlier one after its renames, left moved aside beside ``out`` (``.OUT.<random>.tmp.old``)."""
    killed = (
        "import os, shutil, signal, sys\n"
        "from skewlens.cli import main\n"
        "real = shutil.rmtree\n"
        "def rmtree(path, *a, **k):\n"
        "    if str(path).endswith('.tmp.old'):\n"
        "        print(path, flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(path, *a, **k)\n"
        "shutil.rmtree = rmtree\n"
        "main(['export', sys.argv[1], '--out', sys.argv[2]])\n"
    )
    left = _killed_by_sigkill(killed, run, out)
    assert left.parent == out.parent and (left / "run.json").is_file()
    return left


@pytest.mark.parametrize("command", ["export", "analyze"])
def test_an_earlier_output_a_killed_command_left_moved_aside_is_removed_by_the_next_one_beside_it(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an export that replaced FLEET/run=n1 moved the earlier one aside as FLEET/.run=n1.<random>.tmp.old and
    # removed it after its renames (seconds, for a big output): killed then, it left a whole export there for
    # good, which nothing removed (and a glob of FLEET/*/ read it as a run)
    fleet = tmp_path / "FLEET"
    run = small_run(tmp_path / "run")
    assert _export_or_analyze("export", run, fleet / "run=n1") == 0
    left = _killed_while_removing_the_earlier(run, fleet / "run=n1")
    mine = (".foo.tmp.old", ".run=n1.tmp.old", ".run=n1.k3j2x7a.tmp.old", ".run=n1.k3j2x7ab.old")
    for name in mine:  # the user's own: not named as skewlens names an output it moved aside
        (fleet / name).mkdir()
    (fleet / ".run=n2.k3j2x7ab.tmp.old").write_text("a file of the user's")
    assert _export_or_analyze(command, run, fleet / "run=n2") == 0
    assert not left.exists()
    assert sorted(p.name for p in fleet.iterdir()) == sorted(
        [*mine, ".run=n2.k3j2x7ab.tmp.old", "run=n1", "run=n2"]
    )
    capsys.readouterr()


def test_an_earlier_output_moved_aside_by_a_running_replace_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a command staging beside it while another's replace was between its renames (the earlier output
    # moved aside, the new one's rename about to fail) would have removed the earlier output, which the
    # failed replace then could not put back: the replace's renames and the removal take the same lock
    import errno

    def other() -> None:
        with staging_dir(tmp_path / "other"):
            pass

    out = _staged(tmp_path / "pq", "earlier", "ranks.parquet")
    with staging_dir(out) as new:
        (new / "ranks.parquet").write_text("new")
        threads = _between_first_renames(tmp_path, monkeypatch, other)
        real_replace = Path.replace

        def replace(self: Path, target: str | Path) -> Path:
            if self == new:  # another program's directory appeared at pq after it was moved aside
                raise OSError(errno.ENOTEMPTY, "Directory not empty")
            return real_replace(self, target)

        monkeypatch.setattr(Path, "replace", replace)
        with pytest.raises(OSError):
            replace_dir(new, out)
        threads[0].join()
    assert (out / "ranks.parquet").read_text() == "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pq"]


def test_an_earlier_output_moved_aside_is_kept_where_the_file_system_cannot_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # unlocked, a command staging there cannot tell one a running replace may still put back
    import errno
    import fcntl

    def no_locks(_fd: int, _op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    aside = _staged(tmp_path / ".pq.k3j2x7ab.tmp.old", "earlier", "ranks.parquet")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with staging_dir(tmp_path / "other") as stage:
        assert stage.is_dir()
    assert (aside / "ranks.parquet").read_text() == "earlier"
