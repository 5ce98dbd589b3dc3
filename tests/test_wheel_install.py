"""skewlens as a user installs it: a wheel in a fresh venv outside the checkout, used from a training repo
that has its own ``profiler.py``, ``analysis/`` and ``replay/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU wheel (an unpinned torch would pull a CUDA build)

# The user's own modules, named like ours: the run must import these, never skewlens' folders.
USER_PROFILER = "def hello():\n    return 'the training repo profiler'\n"
USER_PACKAGE = "WHO = 'the training repo {name}'\n"
USER_TRAIN = """\
import json, os, runpy, sys
import profiler, analysis, replay

assert profiler.hello() == "the training repo profiler", profiler.__file__
assert analysis.WHO == "the training repo analysis", analysis.__file__
assert replay.WHO == "the training repo replay", replay.__file__
if os.environ.get("LOCAL_RANK", "0") == "0":
    with open("imports.json", "w") as f:
        json.dump({m: sys.modules[m].__file__ for m in ("profiler", "analysis", "replay")}, f)
sys.argv = [EXAMPLE, *sys.argv[1:]]
runpy.run_path(EXAMPLE, run_name="__main__")
"""


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    res = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], dist)
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = dist.glob("skewlens-*.whl")
    return whl


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist as a build frontend makes it: the backend from pyproject's build requirements, isolated."""
    base = tmp_path_factory.mktemp("sdist")
    backend = base / "backend"
    req = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    res = _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(backend), *req], base)
    assert res.returncode == 0, res.stderr[-3000:]
    code = f"from setuptools import build_meta as b; print(b.build_sdist({str(base)!r}))"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(backend)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return base / res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    assert _run([sys.executable, "-m", "venv", str(home / "v")], home).returncode == 0
    py = home / "v" / "bin" / "python"
    res = _run([str(py), "-m", "pip", "install", "-q", TORCH, str(wheel)], home, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return home / "v"


@pytest.fixture(scope="module")
def training_repo(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("trainrepo")
    (repo / "profiler.py").write_text(USER_PROFILER)
    for name in ("analysis", "replay"):
        (repo / name).mkdir()
        (repo / name / "__init__.py").write_text(USER_PACKAGE.format(name=name))
    example = _run(
        [str(venv / "bin" / "python"), "-c", "from skewlens.paths import EXAMPLES_DIR; print(EXAMPLES_DIR)"],
        repo,
    )
    assert example.returncode == 0, example.stderr
    example_py = Path(example.stdout.strip()) / "train.py"
    (repo / "train.py").write_text(f"EXAMPLE = {str(example_py)!r}\n" + USER_TRAIN)
    return repo


def test_the_wheel_installs_one_top_level_package_with_its_configs_and_example(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"skewlens", wheel.name.split("-py3")[0] + ".dist-info"}
    for needed in (
        "skewlens/conf/replay.yaml",
        "skewlens/conf/topology/switch.yaml",
        "skewlens/conf/slowdown/straggler.yaml",
        "skewlens/conf/README.md",
        "skewlens/docs/replay.md",  # the help and messages name these (skewlens.paths.doc)
        "skewlens/docs/capture.md",
        "skewlens/docs/parquet.md",
        "skewlens/examples/train.py",
        "skewlens/profiler/capture/bootstrap/sitecustomize.py",
        "skewlens/profiler/capture/gloo_events.cpp",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "skewlens/tests/"))]


def test_the_wheel_declares_its_version_and_an_spdx_licence_and_ships_every_config_sql_and_type_marker(
    wheel: Path,
) -> None:
    """``license = { text = ... }`` built with a SetuptoolsDeprecationWarning on every build (no builds after
    2027-02-18) and wrote the free-text ``License:`` field; an SPDX expression is ``License-Expression:``."""
    import skewlens

    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = dict(
        line.split(": ", 1)
        for line in z.read(meta_name).decode().split("\n\n", 1)[0].splitlines()
        if ": " in line
    )
    assert meta.get("License-Expression") == "Apache-2.0", meta.get("License")
    assert "License" not in meta
    assert meta["Version"] == skewlens.__version__
    assert meta["Description-Content-Type"] == "text/markdown"
    shipped = [
        p.relative_to(ROOT).as_posix()
        for d in ("conf", "analysis/sql")
        for p in (ROOT / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert len(shipped) > 15
    missing = [f for f in shipped if f"skewlens/{f}" not in names]
    typed = [n for n in names if n.endswith("/py.typed")]
    assert (missing, sorted(typed)) == (
        [],
        [
            "skewlens/analysis/py.typed",
            "skewlens/profiler/py.typed",
            "skewlens/py.typed",
            "skewlens/replay/py.typed",
        ],
    )


def test_the_sdist_holds_what_the_wheel_is_built_from_and_no_tests_that_need_the_checkout(
    sdist: Path, wheel: Path
) -> None:
    """setuptools put tests/test*.py (111 files, 2.2 MB of the sdist's 4.3) in it without tests/conftest.py,
    slow_guard.py or the docs/, benchmarks/ and scripts/ they read: tests that cannot run from it."""
    with tarfile.open(sdist) as tar:
        members = [m.split("/", 1)[1] for m in tar.getnames() if "/" in m]
    assert not [m for m in members if m.startswith(("tests/", "benchmarks/", "docs/"))]
    in_wheel = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("skewlens/")]
    assert [n for n in in_wheel if n not in members] == []
    assert {"pyproject.toml", "README.md"} <= set(members)


def test_the_installed_venv_has_no_jupyter_stack_and_skewlens_outside_the_checkout(venv: Path) -> None:
    py = str(venv / "bin" / "python")
    code = (
        "import importlib.util as u, json, skewlens\n"
        "print(json.dumps({'file': skewlens.__file__, "
        "'absent': [m for m in ('jupyterlab', 'IPython', 'hta', 'plotly', 'pandas', 'profiler', 'replay', "
        "'analysis') if u.find_spec(m) is None]}))"
    )
    res = _run([py, "-c", code], venv)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert Path(out["file"]).resolve().is_relative_to(venv.resolve()), out["file"]
    assert sorted(out["absent"]) == sorted(
        ["jupyterlab", "IPython", "hta", "plotly", "pandas", "profiler", "replay", "analysis"]
    )


def test_every_path_the_installed_commands_help_names_is_in_the_venv(venv: Path, tmp_path: Path) -> None:
    # replay's help sent a wheel user to conf/README.md and docs/replay.md, calibrate's to conf/topology/:
    # paths of the checkout, which the venv does not have
    import re

    sk = str(venv / "bin" / "skewlens")
    version = _run([sk, "--version"], tmp_path)
    assert (version.returncode, version.stdout) == (0, f"skewlens {skewlens_version()}\n")
    named = set()
    commands = ("profile", "merge", "import", "check", "export", "replay", "calibrate", "analyze", "demo")
    for command in commands:
        res = _run([sk, command, "--help"], tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        named |= {
            m.group(0).rstrip(".")
            for m in re.finditer(r"[\w./~-]*\.md\b|\b(?:conf|docs|examples)/[\w./-]*", res.stdout)
        }
    assert named, "no document named"
    missing = [p for p in sorted(named) if not Path(p).is_absolute() or not Path(p).is_file()]
    assert missing == []
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in named), named


def skewlens_version() -> str:
    import skewlens

    return skewlens.__version__


def test_a_training_repo_with_its_own_profiler_analysis_and_replay_runs_unchanged_and_the_loop_works(
    venv: Path, training_repo: Path
) -> None:
    sk = str(venv / "bin" / "skewlens")
    py = str(venv / "bin" / "python")
    run, repo = training_repo / "run", training_repo
    prof = _run(
        [sk, "profile", "--out", str(run), "--level", "collectives", "--steps", "1:1:3", "--",
         py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py", "--steps", "6",
         "--straggler-rank", "1", "--straggler-ms", "20"],
        repo,
    )  # fmt: skip
    assert prof.returncode == 0, prof.stderr[-3000:]
    imported = json.loads((repo / "imports.json").read_text())
    assert {m: Path(f).resolve().parent for m, f in imported.items()} == {
        "profiler": repo.resolve(),
        "analysis": (repo / "analysis").resolve(),
        "replay": (repo / "replay").resolve(),
    }
    assert sorted(p.name for p in run.glob("rank-*.et")) == ["rank-0.et", "rank-1.et"]

    check = _run([sk, "check", str(run), "--no-progress"], repo)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]

    analyze = _run([sk, "analyze", str(run), "--out", str(repo / "analysis-out")], repo)
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    assert (repo / "analysis-out" / "blame.parquet").is_file()

    replay = _run([sk, "replay", f"trace={run}", f"out={repo / 'replay-out'}", "topology=switch"], repo)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert (repo / "replay-out" / "summary.parquet").is_file()
    assert (repo / "replay-out" / "config.yaml").is_file()


def test_the_demo_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    sk = str(venv / "bin" / "skewlens")
    demo = _run([sk, "demo", "--out", str(tmp_path / "demo"), "--nproc", "2", "--steps", "6",
                 "--straggler-rank", "1"], tmp_path)  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "Rank 1 is the top straggler" in demo.stdout
    assert (tmp_path / "demo" / "analysis" / "blame.parquet").is_file()


def test_every_relative_link_in_the_installed_docs_resolves_where_pip_installs_the_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    # the docs ship in the package (skewlens/docs, skewlens/conf/README.md) for the help's and messages'
    # paths: a link among them to a file the wheel does not ship (the checkout's ../README.md, benchmarks/)
    # is a dead link for a wheel user. pip lays the wheel's files out as it would in a venv (without torch)
    import re

    site = tmp_path / "site"
    res = _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    package = site / "skewlens"
    docs = sorted([*(package / "docs").glob("*.md"), *(package / "conf").glob("*.md")])
    assert len(docs) >= 9, docs
    links = [
        (doc.relative_to(package).as_posix(), target)
        for doc in docs
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8"))
        if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)  # a URL or an anchor of the same page
    ]
    assert len(links) > 40, links
    dead = [(doc, t) for doc, t in links if not (package / doc).parent.joinpath(t.split("#")[0]).exists()]
    assert dead == []
