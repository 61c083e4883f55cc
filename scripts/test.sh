#!/usr/bin/env bash
# Install specctl with its test tools into .venv and run lint, type checks and the test suite.
# Idempotent and safe on a fresh clone; re-runs reuse the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e '.[dev]'

echo "== ruff"
"$VENV/bin/ruff" check .
echo "== mypy"
"$VENV/bin/mypy"
echo "== pytest"
"$VENV/bin/python" -m pytest "$@"
