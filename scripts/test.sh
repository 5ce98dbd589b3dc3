#!/usr/bin/env bash
# Install, lint, type-check, check the layers and run the test suite (what CI runs): the fast tier (pytest -m "not slow":
# in-process, synthetic traces), then the slow tier (pytest -m slow: real gloo ranks through torchrun),
# each its own pytest run; both must pass. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contracts in pyproject.toml

# tier NAME MARK-EXPRESSION [PYTEST-ARGS...]: one pytest run; a run that collects nothing (exit 5) fails
tier() {
    local name=$1 expr=$2 rc=0
    shift 2
    echo "== scripts/test.sh: $name tier (pytest -m \"$expr\")"
    .venv/bin/python -m pytest -q -m "$expr" "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "scripts/test.sh: error: the $name tier collected no tests (pytest exit 5)" >&2
    fi
    return "$rc"
}

tier fast "not slow" "$@"
tier slow "slow" "$@"
