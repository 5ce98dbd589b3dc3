#!/usr/bin/env bash
# From a fresh clone to the end-to-end demo in one command: install (.venv, exactly the CPU torch build),
# then `skewlens demo` (4 gloo ranks on the CPU; extra arguments go to it, e.g. --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/skewlens demo "$@"
