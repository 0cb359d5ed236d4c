#!/usr/bin/env bash
# Sets up tflfuse on a fresh machine and runs the demo or the tests:
#   ./bootstrap.sh demo     installs everything, then runs `tflfuse demo`
#   ./bootstrap.sh test     installs everything, then runs the test suite (pytest)
# It installs the Mesa Vulkan driver (Debian package mesa-vulkan-drivers: the software WebGPU adapter
# for machines without a GPU) and, for the tests, chromium-headless-shell (the browser tests/test_web.py
# drives; nodejs and npm where npm is missing) when run as root, and prints the command to run otherwise;
# then makes a Python virtual environment in .venv with the project and its dependencies and, for the tests,
# installs LiteRT.js (@litertjs/core, npm) into .web/, which the browser tests compare tflfuse.js with.
set -euo pipefail
cd "$(dirname "$0")"
what=${1:-}
case "$what" in demo|test) ;; *) echo "usage: ./bootstrap.sh demo|test" >&2; exit 2;; esac

# The tests also drive a browser: chromium-headless-shell (WebGPU through SwiftShader, tests/test_web.py).
# They compare it with LiteRT.js (@litertjs/core from npm): nodejs and npm where npm is missing.
packages="mesa-vulkan-drivers"
if [ "$what" = test ]; then
  packages="$packages chromium-headless-shell"
  command -v npm >/dev/null 2>&1 || packages="$packages nodejs npm"
fi
missing=""
if command -v dpkg >/dev/null 2>&1; then
  for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "Missing Debian packages:$missing. Run:  sudo apt-get install -y$missing" >&2
    exit 1
  fi
fi

py=""   # TensorFlow 2.21's wheels exist for CPython 3.11, 3.12 and 3.13
for c in python3 python3.11 python3.12 python3.13 python; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
    py=$c; break
  fi
done
if [ -z "$py" ]; then echo "tflfuse needs Python 3.11, 3.12 or 3.13 (TensorFlow 2.21's wheels)." >&2; exit 1; fi
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
echo "== installing tflfuse and its dependencies into .venv"
.venv/bin/python -m pip install -q --upgrade pip
# PYTHONWARNINGS: setuptools warns about editable installs in general, which says nothing about this one.
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e ".[test]"

# LiteRT.js for the browser tests, into .web/ (git-ignored): the tests serve its dist/ and wasm/ folders from there.
litertjs=2.5.3
if [ "$what" = test ] && ! grep -qs "\"version\": \"$litertjs\"" .web/node_modules/@litertjs/core/package.json; then
  echo "== installing @litertjs/core $litertjs into .web/"
  npm install --prefix .web --no-save --no-audit --no-fund --loglevel=error "@litertjs/core@$litertjs" >/dev/null
fi

if [[ -z "${XDG_RUNTIME_DIR:-}" ]]; then   # only a folder of our own is created (and made private)
  export XDG_RUNTIME_DIR=/tmp/xdg-runtime-$(id -u)
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
if [ "$what" = demo ]; then
  exec .venv/bin/tflfuse demo
else
  # Two pytest-xdist workers, each test file in one of them (its module fixtures built once): one process
  # leaves a core idle while TensorFlow converts or a shader compiles (when this was chosen, on a 2-core
  # machine: 10 minutes this way against 16 in one process; README.md has the current time).
  exec .venv/bin/python -m pytest -q -n 2 --dist loadfile tests
fi
