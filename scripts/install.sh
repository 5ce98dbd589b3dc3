#!/usr/bin/env bash
# Create .venv and install skewlens (editable) with the exact CPU torch build, the dev tools and Chakra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# exactly the CPU build of torch 2.13.0, the +cpu wheel: where pip finds it (this machine: on disk), else from
# PyTorch's CPU index (PyPI's Linux wheel of torch==2.13.0 is the multi-GB CUDA build); macOS's wheels are
# CPU builds without the +cpu tag
pip_torch() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
pip_torch "torch==2.13.0+cpu" 2>/dev/null \
    || pip_torch "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu \
    || { [ "$(uname -s)" = Darwin ] && pip_torch "torch==2.13.0"; }
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
# Chakra's own schema module and protolib reader, which the tests hold our files to. --no-deps: mlc-chakra
# declares HolisticTraceAnalysis's analysis stack (JupyterLab, IPython, plotly, pandas, graphviz, ...), which
# neither module imports; skewlens itself needs only protobuf (skewlens.profiler.chakra_schema).
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "mlc-chakra==1.0.0"
# the native gloo-event recorder of the collectives level (a small C++ library, cached per torch version;
# without a compiler the capture uses torch's profiler instead and says so)
.venv/bin/python -m skewlens.profiler.capture.native || echo "warning: the native gloo-event recorder was not built"
