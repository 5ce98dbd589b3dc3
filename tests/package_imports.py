"""What the package's own files import, read from their source (nothing is imported)."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def absolute_imports() -> Iterator[tuple[Path, int, str]]:
    """Each absolute import in the package's files as (file, line, module): ``import a.b`` and ``from a.b
    import c`` give ``a.b``. The package's folders are links (skewlens/profiler -> ../profiler, ...), which
    are followed; each file is read once."""
    for folder, _dirs, files in os.walk(ROOT / "skewlens", followlinks=True):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder, name)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    yield path, node.lineno, module
