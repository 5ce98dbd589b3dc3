"""Architectural rules of the replay package, checked in fresh interpreters and on the sources."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = [
    "skewlens.replay.core",
    "skewlens.replay.effects",
    "skewlens.replay.slowdown",
    "skewlens.replay.comm",
    "skewlens.replay.network.topology",
    "skewlens.replay.network.algorithms",
]
HEAVY = ["torch", "pyarrow", "rich", "hydra", "omegaconf"]


def imported_after(modules: list[str], watched: list[str] = HEAVY) -> list[str]:
    """Which of ``watched`` a fresh interpreter has imported once it imported ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(h for h in {watched!r} if h in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_the_simulator_core_imports_no_torch_pyarrow_rich_or_hydra() -> None:
    assert imported_after(CORE) == []


def test_simulating_a_loaded_run_imports_no_torch_rich_or_hydra() -> None:
    loaded = imported_after(["skewlens.replay.simulate", "skewlens.replay.lower", "skewlens.replay.summary"])
    assert [m for m in loaded if m != "pyarrow"] == []  # pyarrow only through the trace store


def test_the_core_does_not_import_the_trace_store() -> None:
    for mod in CORE:
        path = ROOT / (mod.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        ]
        assert not [n for n in names if n.startswith("skewlens.profiler.store")], mod


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "replay").rglob("*.py") if p.name != "__main__.py")
)
def test_nothing_imports_the_cli(path: Path) -> None:
    if path == ROOT / "replay" / "cli.py":
        return
    tree = ast.parse(path.read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert "skewlens.cli.replay" not in names


def test_the_data_model_imports_neither_the_loader_nor_pyarrow_nor_a_renderer() -> None:
    watched = [*HEAVY, "matplotlib", "chakra", "skewlens.profiler.store.load", "skewlens.profiler.store.fast"]
    assert imported_after(["skewlens.profiler.store.model", "skewlens.profiler.vocab"], watched) == []


def test_importing_the_analyses_imports_no_renderer_torch_or_hydra() -> None:
    watched = ["torch", "rich", "matplotlib", "hydra", "omegaconf"]
    assert imported_after(["skewlens.analysis", "skewlens.analysis.blame"], watched) == []


def test_the_store_package_still_offers_its_names_on_first_use() -> None:
    from skewlens.profiler import store

    assert callable(store.load_run) and store.RunTrace.__name__ == "RunTrace"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = store.nope


def _modules() -> list[str]:
    """Every module of the ``skewlens`` namespace, from the files (the root packages through their links)."""
    pkg = ROOT / "skewlens"
    files = [Path(d, f) for d, _, fs in os.walk(pkg, followlinks=True) for f in fs if f.endswith(".py")]
    names = []
    for path in sorted(files):
        parts = path.relative_to(pkg).with_suffix("").parts
        if parts[0] in ("examples", "conf"):  # training scripts and Hydra groups, not importable modules
            continue
        names.append(".".join(("skewlens", *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:]))))
    return names


def _not_held(contract: str, exempt: tuple[str, ...]) -> list[str]:
    """The modules that neither ``contract``'s sources (a source holds its submodules) nor ``exempt`` (these
    modules alone; ``NAME.*``: NAME and its submodules) cover."""
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (sources,) = [
        c["source_modules"] for c in doc["tool"]["importlinter"]["contracts"] if c["name"] == contract
    ]
    trees = [*sources, *(e.removesuffix(".*") for e in exempt if e.endswith(".*"))]
    return [
        m for m in _modules() if m not in exempt and not any(m == t or m.startswith(t + ".") for t in trees)
    ]


def test_every_module_but_capture_and_its_commands_is_held_to_importing_no_torch() -> None:
    # the contract listed five packages: gpu_deps, synth, manifest, the console, the analysis commands, ...
    # could have imported torch (loading a run must not) and lint-imports said nothing
    exempt = (
        "skewlens",
        "skewlens.__main__",
        "skewlens.profiler",
        "skewlens.profiler.capture.*",
        "skewlens.cli",
    )
    exempt = (*exempt, "skewlens.cli.profile", "skewlens.cli.demo")  # they capture: torch, when they run
    assert _not_held("Only capture and the real-replay workers import torch", exempt) == []


def test_every_module_outside_the_commands_is_held_to_not_importing_them() -> None:
    # skewlens.console and skewlens.pictures were not among the contract's sources
    exempt = ("skewlens", "skewlens.__main__", "skewlens.cli.*")  # the commands may share code
    assert _not_held("The CLIs sit at the edge: nothing imports them", exempt) == []
