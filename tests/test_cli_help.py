"""The commands' --help and the options that apply only with others: said, not silently ignored."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

import pytest
from user_docs import flags_in_code

from skewlens import paths as skewlens_paths
from skewlens.cli import SUBCOMMANDS
from skewlens.cli import main as skewlens_main


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit):
        skewlens_main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # as wrapped to the terminal


def test_profiles_help_shows_the_command_after_two_dashes_and_lists_the_levels_and_host_traces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    said = _help(capsys, "profile")
    assert said.startswith(
        "usage: skewlens profile [-h] --out RUN_DIR [--level LEVEL] [--steps WAIT:WARMUP:ACTIVE] "
        "[--host-trace SOURCE] [--keep-raw] [--parquet] -- COMMAND ..."
    )
    assert "one of collectives, ops, full (default collectives)" in said
    assert "one of profiler, observer (default profiler)" in said


def test_analyzes_top_and_the_demos_straggler_options_say_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--top N rows in the straggler table (default 5;" in _help(capsys, "analyze")
    demo = _help(capsys, "demo")
    assert (
        "--straggler-ms STRAGGLER_MS extra compute the straggler does at the start of each step, ms " in demo
    )
    assert "with fewer ranks than that, the last one: rank 1 with --nproc 2" in demo


def test_an_astra_sim_option_given_to_a_parquet_export_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    b = RunBuilder(world_size=2)
    for r in range(2):
        b.rank(r).step(0).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000)
    run = b.write(tmp_path / "run")
    assert skewlens_main(["export", str(run), "--out", str(tmp_path / "x"), "--prefix", "foo"]) == 2
    assert capsys.readouterr().err.strip() == (
        "skewlens export: error: --prefix: an option of --format astra-sim, which this export (--format "
        "parquet) does not use; add --format astra-sim, or leave it out"
    )
    assert not (tmp_path / "x").exists()


def test_an_observer_host_trace_below_the_full_level_is_warned_of_as_keep_raw_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from skewlens.profiler.capture import run as capture_run
    from skewlens.profiler.manifest import read_manifest
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    def finalize(run_dir: Path, **_: object) -> object:
        b = RunBuilder(world_size=1)
        b.rank(0).step(2).collective(CommType.ALL_REDUCE, 1 << 20, dur_ns=1_000)
        b.write(run_dir)
        return dataclasses.replace(read_manifest(run_dir))

    monkeypatch.setattr(capture_run, "run_command", lambda command, env, **_kw: 0)
    monkeypatch.setattr(capture_run, "finalize_run", finalize)
    monkeypatch.setattr("skewlens.cli.profile._build_native", lambda: "")
    args = ["profile", "--out", str(tmp_path / "run"), "--host-trace", "observer", "--", "true"]
    assert skewlens_main(args) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        "skewlens profile: warning: --host-trace observer: only the full level takes operator schemas and "
        "tensor ids from a host trace; at --level collectives it changes nothing"
    )


def test_replays_help_says_how_to_call_it_and_its_examples_run_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Hydra's own header said only "replay is powered by Hydra.": no usage, no example, no exit status
    from skewlens.profiler.synth import RunBuilder
    from skewlens.profiler.vocab import CommType

    assert skewlens_main(["replay", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("skewlens replay: replay a run in the simulator")
    assert "usage: skewlens replay trace=RUN out=OUT [key=value ...] [-m] [--cfg job] [--help]" in lines
    examples = [line.split("#")[0].split() for line in lines if line.startswith("  skewlens replay ")]
    assert len(examples) == 4
    b = RunBuilder(world_size=2)
    for step in range(2):
        for r in range(2):
            rank = b.rank(r).step(step)
            rank.compute("fwd", dur_ns=1_000_000)
            rank.collective(CommType.ALL_REDUCE, (1 + step) << 20, dur_ns=100_000)
    run = b.write(tmp_path / "run")
    for k, example in enumerate(examples):
        out = tmp_path / f"o{k}"
        argv = [
            a.replace("=RUN", f"={run}").replace("=OUT", f"={out}").replace("=SWEEP", f"={out}")
            for a in example
        ]
        assert skewlens_main(argv[1:]) == 0, argv
    capsys.readouterr()


@pytest.mark.parametrize("command", ["profile", "merge", "demo"])
def test_a_commands_help_shows_no_rst_markup(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the descriptions taken from docstrings read ``skewlens profile``: ...
    assert "``" not in _help(capsys, command)


def test_checks_help_gives_its_exit_status_for_scripts_and_ci(capsys: pytest.CaptureFixture[str]) -> None:
    said = _help(capsys, "check")
    assert "exit status: 0 when the run has no errors (warnings allowed), 1 when it has errors" in said
    assert "2 when it cannot be read as a run" in said


#: The commands with an argparse parser (replay is Hydra's: tests/test_replay_cli.py holds the docs' keys).
PARSED = [name for name in SUBCOMMANDS if name != "replay"]


def documented_flags() -> list[tuple[str, str, str]]:
    """(where, command, flag) for every flag after ``skewlens COMMAND`` in the user docs' code, up to the
    next command on its line, a ``--`` (the wrapped training command) or the span's end."""
    return flags_in_code(rf"skewlens ({'|'.join(PARSED)})\b(.*?)(?=skewlens \w|$)", r"\s--\s")


def test_every_flag_the_docs_give_a_command_is_one_its_help_lists(capsys: pytest.CaptureFixture[str]) -> None:
    found = documented_flags()
    assert len({(c, f) for _, c, f in found}) > 25  # the docs name many: the extraction finds them
    flags = {c: set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _help(capsys, c))) for c in PARSED}
    assert [f"{where}: skewlens {c} {f}" for where, c, f in found if f not in flags[c]] == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["profile", "--steps", "-1:1:3", "--out", "{tmp}/run", "--", "true"],
            "skewlens profile: error: --steps '-1:1:3': WAIT and WARMUP must be >= 0 and ACTIVE >= 1",
        ),
        (
            ["demo", "--straggler-ms", "-1e3", "--out", "{tmp}/demo"],
            (
                "skewlens demo: error: --straggler-ms: expected 0..60,000 (a minute of extra compute), got "
                "-1000.0"
            ),
        ),
        (  # an abbreviation argparse takes for the option (it was still 'expected one argument')
            ["demo", "--straggler-m", "-1e3", "--out", "{tmp}/demo"],
            (
                "skewlens demo: error: --straggler-ms: expected 0..60,000 (a minute of extra compute), got "
                "-1000.0"
            ),
        ),
    ],
)
def test_an_option_value_that_begins_as_a_negative_number_reaches_the_options_own_check(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse took '-1:1:3' (and '-1e3') for an option: 'argument --steps: expected one argument'
    assert skewlens_main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert capsys.readouterr().err.splitlines() == [said]
    assert list(tmp_path.iterdir()) == []


def test_a_value_that_begins_with_a_dash_otherwise_is_refused_with_the_form_that_takes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        skewlens_main(["analyze", str(tmp_path), "--out", "-x"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "skewlens analyze: error: argument --out: expected one argument (a value that begins with '-' is "
        "written --out=VALUE)"
    )


def test_the_version_is_written_once_and_skewlens_version_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    # pyproject.toml said version = "0.1.0", and skewlens/__init__.py and skewlens/profiler/__init__.py said
    # it again: a release that bumped one left the wheel's metadata and `skewlens --version` disagreeing
    import tomllib

    import skewlens
    import skewlens.profiler

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "skewlens.__version__"}
    spelled = [
        p.relative_to(root).as_posix()
        for d in ("skewlens", "profiler", "replay", "analysis")
        for p in (root / d).rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert spelled == ["skewlens/__init__.py"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", skewlens.__version__)
    assert skewlens.profiler.__version__ == skewlens.__version__
    assert skewlens_main(["--version"]) == 0
    assert capsys.readouterr().out == f"skewlens {skewlens.__version__}\n"


#: A path in help text: a document, or a folder of the checkout's (conf/topology/, docs/replay.md).
_NAMED_PATH = re.compile(r"[\w./~-]*\.md\b|\b(?:conf|docs|examples|scripts|benchmarks)/[\w./-]*")


def _all_help(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    said = {}
    for command in ["", *SUBCOMMANDS]:
        argv = [command, "--help"] if command else ["--help"]
        with contextlib.suppress(SystemExit):
            skewlens_main(argv)
        said[command or "skewlens"] = capsys.readouterr().out
    return said


def test_every_path_the_commands_help_names_is_there_wherever_the_command_is_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # replay's help ended "The groups and settings: conf/README.md; more in docs/replay.md.", and calibrate's
    # --topology "an entry of conf/topology/": paths of the checkout, which a wheel user does not have
    monkeypatch.chdir(tmp_path)
    named = {
        (command, m.group(0).rstrip(".")) for command, text in _all_help(capsys).items()
        for m in _NAMED_PATH.finditer(text)
    }  # fmt: skip
    missing = [(c, p) for c, p in sorted(named) if not (Path(p).is_absolute() and Path(p).exists())]
    assert missing == []
    assert {p for _c, p in named} >= {
        str(skewlens_paths.PACKAGE_DIR / "conf" / "README.md"),
        str(skewlens_paths.PACKAGE_DIR / "docs" / "replay.md"),
    }


def test_no_message_names_a_document_by_a_path_only_a_checkout_has() -> None:
    # "(docs/capture.md, Across hosts)", "(cap.step(), docs/capture.md)", "(docs/parquet.md)": relative paths
    # that named nothing for a wheel user; skewlens.paths.doc names the installed copy
    import ast

    root = Path(__file__).resolve().parents[1]
    found = []
    for d in ("skewlens", "profiler", "replay", "analysis"):
        for path in sorted((root / d).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and n.body
                and isinstance(n.body[0], ast.Expr)
            }
            doc_args = {
                id(a)
                for n in ast.walk(tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "doc"
                for a in n.args
            }
            found += [
                f"{path.relative_to(root)}:{n.lineno}: {n.value}"
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and id(n) not in docstrings | doc_args
                and re.search(r"\b(docs|conf)/[\w./-]*\.md\b", n.value)
            ]
    assert found == []
    assert skewlens_paths.doc("docs/capture.md") == str(skewlens_paths.DOCS_DIR / "capture.md")
    for name in ("docs/capture.md", "docs/parquet.md", "docs/replay.md", "conf/README.md"):
        assert Path(skewlens_paths.doc(name)).is_file(), name


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_skewlens_help_command_is_the_commands_own_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `skewlens help replay` printed the list of commands and exit 0, replay's help nowhere
    with contextlib.suppress(SystemExit):
        skewlens_main([command, "--help"])
    own = capsys.readouterr().out
    with contextlib.suppress(SystemExit):
        skewlens_main(["help", command])
    assert capsys.readouterr().out == own
    assert own and "commands:" not in own


def test_skewlens_help_of_no_such_command_says_so_and_the_list_says_how_to_get_a_commands_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert skewlens_main(["help", "replya"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[0]
        == "skewlens: unknown command 'replya' (did you mean 'replay'?)"
    )
    assert skewlens_main(["--help"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert (
        said[-1] == "skewlens <command> --help (or skewlens help <command>): its options; skewlens --version"
    )


@pytest.mark.parametrize("first", ["help", "--help", "-h"])
def test_help_of_two_commands_is_refused_naming_them_not_answered_with_the_list_of_commands(
    first: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `skewlens help analyze replay` printed the list of commands and exit 0, both words ignored
    assert skewlens_main([first, "analyze", "replay"]) == 2
    said = capsys.readouterr()
    assert (said.out, said.err) == ("", f"skewlens {first}: one command at a time, got 2: analyze replay\n")
    with contextlib.suppress(SystemExit):
        skewlens_main(["analyze", "--help"])
    own = capsys.readouterr().out
    with contextlib.suppress(SystemExit):
        skewlens_main([first, "analyze"])  # one word after any of them: that command's help
    assert capsys.readouterr().out == own
