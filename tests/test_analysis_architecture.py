"""Architectural rules of the analysis package."""

from __future__ import annotations

import subprocess
import sys


def test_analyses_import_neither_torch_nor_the_picture_layer() -> None:
    code = (
        "import sys\n"
        "import skewlens.analysis, skewlens.analysis.skew, skewlens.analysis.breakdown\n"
        "import skewlens.analysis.critical_path, skewlens.analysis.blame\n"
        "bad = [m for m in ('torch', 'matplotlib', 'hydra') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
