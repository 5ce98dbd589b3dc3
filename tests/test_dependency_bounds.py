"""pyproject's dependency bounds against what the code takes from each dependency: where the code relies on
something a dependency first had in release X, the bound must refuse the release before X. The bounds are
read from pyproject.toml; nothing is installed or fetched (the lowest releases themselves were tried by
hand in a fresh venv: see the comments beside the bounds)."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import packages_distributions

from package_imports import ROOT, absolute_imports
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _declared() -> dict[str, Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = [Requirement(r) for r in doc["project"]["dependencies"]]
    return {canonicalize_name(r.name): r for r in requirements}


def _imported_modules() -> dict[str, str]:
    """The top-level modules outside the standard library that the package's files import, each with one
    file that imports it; a module beside the importing file (examples/_common.py) is the package's own."""
    found: dict[str, str] = {}
    for path, _line, module in absolute_imports():
        top = module.partition(".")[0]
        if top in sys.stdlib_module_names or top == "skewlens" or (path.parent / f"{top}.py").exists():
            continue
        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_distribution_the_package_imports_is_declared_not_left_to_another_ones_requirements() -> None:
    # omegaconf (replay's and calibrate's configs) and yaml (replay's config files) came only through
    # hydra-core's and omegaconf's requirements: hydra-core 1.3.0 let omegaconf 2.4 in
    declared = set(_declared())
    distributions = packages_distributions()
    undeclared = {
        module: (where, distributions.get(module))
        for module, where in _imported_modules().items()
        if not any(canonicalize_name(d) in declared for d in distributions.get(module, []))
    }
    assert undeclared == {}


def test_rich_before_13_8_is_refused_since_the_report_console_overrides_its_on_broken_pipe() -> None:
    # rich 13.8 added Console.on_broken_pipe; on 13.7.1 ReportConsole's override was never called and
    # `skewlens calibrate RUN --out cal.yaml` into a pipe whose reader had gone returned 141, not 0
    from rich.console import Console

    from skewlens.console import ReportConsole

    assert "on_broken_pipe" in ReportConsole.__dict__
    assert callable(getattr(Console, "on_broken_pipe", None))  # the override overrides rich's hook
    spec = _declared()["rich"].specifier
    assert (spec.contains("13.7.1"), spec.contains("13.8.0")) == (False, True)


def test_omegaconf_which_the_code_imports_is_declared_and_kept_below_2_4_as_hydra_1_3_1_keeps_it() -> None:
    # hydra-core 1.3.0 (which hydra-core>=1.3 allows) asks for omegaconf~=2.2 and so took omegaconf 2.4:
    # Hydra's deprecation warnings began every replay's stderr and 6 tests' one-line errors changed
    import skewlens.cli.replay as replay_cli

    assert replay_cli.OmegaConf.__module__.partition(".")[0] == "omegaconf"
    spec = _declared()["omegaconf"].specifier
    assert [spec.contains(v) for v in ("2.2.1", "2.3.1", "2.4.0")] == [True, True, False]
