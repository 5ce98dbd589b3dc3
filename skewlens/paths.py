"""Where the package data lies: the Hydra config groups, the bundled examples and the user docs.

All are inside the package (``skewlens/conf``, ``skewlens/examples``, ``skewlens/docs``; in a checkout these
are links to the repository's ``conf/``, ``examples/`` and ``docs/``), so a wheel install has them too, and
the help and messages that send a reader to a document name its path there (:func:`doc`). This module
imports nothing.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
CONF_DIR = PACKAGE_DIR / "conf"
EXAMPLES_DIR = PACKAGE_DIR / "examples"
DOCS_DIR = PACKAGE_DIR / "docs"


def conf_entries(group: str) -> set[str]:
    """The entries of a config group that come with skewlens (``conf/<group>/*.yaml``)."""
    return {f.stem for f in (CONF_DIR / group).glob("*.yaml")}


def doc(name: str) -> str:
    """The path of the document ``name`` where skewlens is installed (``docs/capture.md`` is
    ``doc("docs/capture.md")``, ``conf/README.md`` ``doc("conf/README.md")``): a relative ``docs/capture.md``
    in a message named nothing a wheel user has."""
    return str(PACKAGE_DIR / name)
