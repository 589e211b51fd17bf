#!/usr/bin/env bash
# Installs everything the project needs into ./.venv: Python deps and the Rust extension, built as
# an abi3 wheel (dist/) and installed from that wheel. Sourced by scripts/demo and scripts/test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "maturin>=1.7,<2"
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo (Rust) is required; install it with rustup" >&2
  exit 1
fi
rm -rf dist
.venv/bin/maturin build --release --out dist -q 2>&1 | grep -v '^📦\|^🍹\|^🔗\|^🐍' || true
WHEEL=$(ls dist/woodpecker_idem-*.whl | head -n 1)
.venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
.venv/bin/python -m pip install -q "${WHEEL}[${WOODPECKER_EXTRAS:-test}]"
