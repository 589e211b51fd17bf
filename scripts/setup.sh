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
java_major() {  # 17 for "17.0.15", 1 for "1.8.0_392"; 0 when there is no java
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p')
  v=${v%%$'\n'*}  # the first match; no `| head`, whose early exit is a SIGPIPE under pipefail
  echo "${v:-0}"
}
if [ "$(java_major)" -lt 17 ]; then  # Spark 4 (the spark extra) runs on Java 17 or 21
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q >/dev/null
    # Debian 12 / Ubuntu 22.04+ have 17; Debian 13 has 21 only.
    JRE=openjdk-17-jre-headless
    if ! apt-cache show "$JRE" >/dev/null 2>&1; then JRE=openjdk-21-jre-headless; fi
    echo "setup: installing a Java runtime for Spark (apt-get install $JRE)" >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$JRE" >/dev/null
  else
    echo "setup: Spark needs a Java 17 (or 21) runtime; install one (e.g. openjdk-17-jre-headless)" >&2
    exit 1
  fi
fi
rm -rf dist
# The Python dependencies install while the extension builds (pip waits on the network and the
# disk much of the time; the build's fat LTO keeps one core): the project's dependencies and
# those of its extras (WOODPECKER_EXTRAS, comma-separated), read from pyproject.toml.
DEPS_LOG=$(mktemp)
.venv/bin/python - "${WOODPECKER_EXTRAS:-test}" >"$DEPS_LOG.txt" <<'PY'
import re
import sys
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project.get("optional-dependencies", {})
wanted, done, out = list(filter(None, sys.argv[1].split(","))), set(), list(project["dependencies"])
while wanted:
    extra = wanted.pop()
    if extra in done:
        continue
    done.add(extra)
    for req in extras.get(extra, []):  # an unknown extra: pip warns at the install below
        own = re.fullmatch(r"woodpecker-idem\[([\w,-]+)\]", req.strip())
        if own:
            wanted.extend(own.group(1).split(","))
        else:
            out.append(req)
print("\n".join(dict.fromkeys(out)))
PY
.venv/bin/python -m pip install -q -r "$DEPS_LOG.txt" >"$DEPS_LOG" 2>&1 &
DEPS=$!
trap 'kill "$DEPS" 2>/dev/null || true; rm -f "$DEPS_LOG" "$DEPS_LOG.txt"' EXIT
.venv/bin/maturin build --release --out dist -q 2>&1 | grep -v '^📦\|^🍹\|^🔗\|^🐍' || true
if ! wait "$DEPS"; then
  cat "$DEPS_LOG" >&2
  echo "setup: installing the Python dependencies failed" >&2
  exit 1
fi
WHEELS=(dist/woodpecker_idem-*.whl)
WHEEL=${WHEELS[0]}
.venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
.venv/bin/python -m pip install -q "${WHEEL}[${WOODPECKER_EXTRAS:-test}]"
