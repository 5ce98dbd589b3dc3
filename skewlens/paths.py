"""Where the package data lies: the Hydra config groups and the bundled examples.

Both are inside the package (``skewlens/conf``, ``skewlens/examples``; in a checkout these are links to the
repository's ``conf/`` and ``examples/``), so a wheel install has them too. This module imports nothing.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
CONF_DIR = PACKAGE_DIR / "conf"
EXAMPLES_DIR = PACKAGE_DIR / "examples"


def conf_entries(group: str) -> set[str]:
    """The entries of a config group that come with skewlens (``conf/<group>/*.yaml``)."""
    return {f.stem for f in (CONF_DIR / group).glob("*.yaml")}
