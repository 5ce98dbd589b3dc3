"""skewlens capture bootstrap: put this folder first on PYTHONPATH and set SKEWLENS_CAPTURE_DIR.

Every Python process of the wrapped command (torchrun's workers inherit the environment) then installs
the capture hooks as soon as it imports torch. Without SKEWLENS_CAPTURE_DIR this file does nothing but
hand over to any other ``sitecustomize`` further down the path.
"""

import importlib.util
import os
import sys
from pathlib import Path


def _chain_next_sitecustomize() -> None:
    here = Path(__file__).resolve().parent
    for entry in sys.path:
        if not entry or Path(entry).resolve() == here:
            continue
        candidate = Path(entry) / "sitecustomize.py"
        if candidate.is_file():
            spec = importlib.util.spec_from_file_location("_skewlens_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("SKEWLENS_CAPTURE_DIR"):
    try:
        from skewlens.profiler.capture.autostart import watch_for_torch

        watch_for_torch()
    except Exception as _e:  # never break the user's program at interpreter start
        print(f"skewlens: capture bootstrap failed: {type(_e).__name__}: {_e}", file=sys.stderr)
_chain_next_sitecustomize()
