"""``skewlens demo --out``: a directory is only ever replaced when an earlier demo created it."""

from __future__ import annotations

from pathlib import Path

import pytest

from skewlens.cli.demo import DEMO_MARKER, prepare_out
from skewlens.profiler.errors import SkewlensError


def test_a_missing_out_directory_is_created_with_the_demo_marker(tmp_path: Path) -> None:
    out = tmp_path / "a" / "demo"
    prepare_out(out)
    assert sorted(p.name for p in out.iterdir()) == [DEMO_MARKER]


def test_a_non_empty_directory_the_demo_did_not_create_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SkewlensError, match="not created by skewlens demo"):
        prepare_out(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_directory_an_earlier_demo_created_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    prepare_out(out)
    (out / "run").mkdir()
    (out / "run" / "old.et").write_bytes(b"x")
    prepare_out(out)
    assert sorted(p.name for p in out.iterdir()) == [DEMO_MARKER]


def test_an_empty_existing_directory_is_taken(tmp_path: Path) -> None:
    prepare_out(tmp_path)
    assert (tmp_path / DEMO_MARKER).is_file()


def test_a_file_named_as_out_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_text("data")
    with pytest.raises(SkewlensError, match="not a directory"):
        prepare_out(f)
    assert f.read_text() == "data"


@pytest.mark.parametrize("steps", [4, 5, 7, 8, 10_000])
def test_the_demos_capture_window_ends_before_its_last_training_step(steps: int) -> None:
    # the window was 1:1:5 whatever --steps said: --steps 4 saved partial traces with a warning per rank,
    # --steps 2 no trace at all (the capture failed)
    from skewlens.cli.demo import capture_window
    from skewlens.profiler.capture.schedule import parse_window

    window = parse_window(capture_window(steps))
    assert (window.wait, window.warmup) == (1, 1)
    assert window.active == min(5, steps - 3)  # the default 8 records 5, as it always did
    assert window.wait + window.warmup + window.active < steps


def test_an_out_with_a_space_a_letter_hydra_quotes_and_a_leading_dash_reaches_profile_and_replay_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the demo passed trace=OUT/run bare to the skewlens replay it runs, and --out OUT/run as two arguments
    # to profile: 'skewlens demo --out "my demo"' captured and analysed, then said "replay failed (exit
    # code 2)" under Hydra's "takes this value only quoted"; --out=-x was refused by profile's argparse
    from skewlens.cli import demo, main
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    def skewlens(*args: str) -> int:  # profile writes a small run where it was told; replay runs
        if args[0] == "profile":
            b = RunBuilder(world_size=2)
            for r in range(2):
                rb = b.rank(r).step(0)
                rb.compute("aten::mm", 1_000_000)
                rb.collective(CommType.ALL_REDUCE, 1 << 20, 1_000)
            b.write(Path(args[2] if args[1] == "--out" else args[1].removeprefix("--out=")))
            assert args[1].startswith("--out=")  # profile's argparse takes --out -my... for an option
            return 0
        return main(list(args))

    monkeypatch.setattr(demo, "_skewlens", skewlens)
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--out=-my demo \N{LATIN SMALL LETTER U WITH DIAERESIS}"]) == 0
    assert (
        tmp_path / "-my demo \N{LATIN SMALL LETTER U WITH DIAERESIS}" / "replay" / "summary.parquet"
    ).is_file()


def test_an_out_that_cannot_be_made_is_one_line_naming_it_and_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `skewlens demo` in a read-only working directory (a locked-down node's): the default demo-out/ was an
    # OSError traceback ending "[Errno 30] Read-only file system: 'demo-out'" and exit code 1. The file
    # system is made read-only by a patched mkdir (root would write through a chmod)
    import errno

    from skewlens.cli import main

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "skewlens demo: error: --out demo-out: cannot be made the demo's directory (Read-only file system); "
        "give --out a directory you can write\n"
    )
    assert not (tmp_path / "demo-out").exists()


def test_an_out_under_a_regular_file_names_that_file(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("mine")  # a file where a directory should be: refused to root too
    with pytest.raises(SkewlensError) as e:
        prepare_out(tmp_path / "notes" / "demo")
    assert str(e.value) == (
        f"--out {tmp_path}/notes/demo: cannot be made the demo's directory ({tmp_path}/notes is not a "
        "directory); give --out a directory you can write"
    )
    assert (tmp_path / "notes").read_text() == "mine"


def test_an_existing_empty_out_the_demo_cannot_write_into_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an empty directory that exists (a read-only mount's, made for the demo) is taken as it is, so the first
    # write is the demo's marker: its OSError is said as a directory that cannot be made is. The file
    # system is made read-only by a patched write_text (root would write through a chmod)
    import errno

    def read_only(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    out = tmp_path / "ro"
    out.mkdir()
    monkeypatch.setattr(Path, "write_text", read_only)
    with pytest.raises(SkewlensError) as e:
        prepare_out(out)
    assert str(e.value) == (
        f"--out {out}: cannot be made the demo's directory (Read-only file system); give --out a directory "
        "you can write"
    )
