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
if ! command -v java >/dev/null 2>&1; then  # Spark (the spark extra, in the test extras)
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing a Java 17 runtime for Spark (apt-get install openjdk-17-jre-headless)" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q >/dev/null
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless >/dev/null
  else
    echo "setup: Spark needs a Java 17 runtime; install one (e.g. openjdk-17-jre-headless)" >&2
    exit 1
  fi
fi
rm -rf dist
.venv/bin/maturin build --release --out dist -q 2>&1 | grep -v '^📦\|^🍹\|^🔗\|^🐍' || true
WHEEL=$(ls dist/woodpecker_idem-*.whl | head -n 1)
.venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
.venv/bin/python -m pip install -q "${WHEEL}[${WOODPECKER_EXTRAS:-test}]"
