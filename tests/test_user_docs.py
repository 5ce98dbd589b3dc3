"""The modules, classes and functions the user docs name (``skewlens.replay.summary.SummaryRecord``, in
prose and code alike) are there: a rename or a move shows here, not in a reader's ImportError. Read from
the source (no import: capture's modules would load torch)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from user_docs import ROOT, USER_DOCS, flags_in_code

PACKAGE = ROOT / "skewlens"
#: Metadata keys of the Parquet files, not Python names.
NOT_PYTHON = {
    "skewlens.schema_version",
    "skewlens.table",
    "skewlens.source",
    "skewlens.run_id",
    "skewlens.started_ns",
}


def documented_names() -> dict[str, str]:
    """Each dotted ``skewlens.`` name in the user docs, and where it is first."""
    names: dict[str, str] = {}
    for doc in USER_DOCS:
        for i, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"(?<![\w/.])skewlens(?:\.\w+)+", line):
                names.setdefault(m.group(0), f"{doc.relative_to(ROOT)}:{i}")
    return {n: where for n, where in names.items() if n not in NOT_PYTHON}


def defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body binds: defs, classes, assignments, imports."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING, optional imports
            names.update(defined([*node.body, *getattr(node, "orelse", [])]))
    return names


def resolves(name: str) -> bool:
    """Whether ``name`` is a module or package of skewlens, or a name its module (then its class) binds."""
    path: Path = PACKAGE
    parts = name.split(".")[1:]
    while parts and ((path / parts[0]).is_dir() or (path / f"{parts[0]}.py").is_file()):
        path = path / parts.pop(0)
    if not parts:
        return True
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    body: list[ast.stmt] = ast.parse(source.read_text(encoding="utf-8")).body
    for attr in parts:
        node = defined(body).get(attr)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def test_every_skewlens_name_the_docs_give_is_a_module_or_one_of_its_attributes() -> None:
    names = documented_names()
    assert len(names) > 60  # the docs name many
    assert [f"{where}: {name}" for name, where in names.items() if not resolves(name)] == []


EXAMPLES = ROOT / "examples"


def example_flags(script: Path) -> set[str]:
    """The ``--flags`` an example script's parser takes: its own ``add_argument`` calls and
    ``_common.py``'s (``train.py``'s knobs), read from the source (no import: the examples load torch)."""
    flags: set[str] = set()
    for source in (script, EXAMPLES / "_common.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                flags.update(a for a in args if isinstance(a, str) and a.startswith("--"))
    return flags


def documented_example_flags() -> list[tuple[str, str, str]]:
    """(where, script, flag) for each ``--flag`` after ``examples/NAME.py`` in the user docs' code."""
    return flags_in_code(r"examples/(\w+\.py)((?:\s+[^\s`]+)*)", r"\s(?:skewlens|torchrun|&&|\|)\s")


def test_every_flag_the_docs_give_an_example_script_is_one_its_parser_takes() -> None:
    found = documented_example_flags()
    # the docs give several: the extraction finds them, the state_dict knob of fsdp1.py among them
    assert ("fsdp1.py", "--state-dict-at") in {(s, f) for _, s, f in found}
    flags = {s: example_flags(EXAMPLES / s) for _, s, _ in found}
    assert [f"{where}: examples/{s} {f}" for where, s, f in found if f not in flags[s]] == []
