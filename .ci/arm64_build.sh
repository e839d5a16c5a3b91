#!/usr/bin/env bash
# The standard Python cross build of the engine for aarch64 (what Buildroot and crossenv do): the host's Python 3.11
# with the arm64 Python's sysconfig data (.ci/arm64_env.sh sets it up), so that setuptools compiles with
# aarch64-linux-gnu-gcc and names the extensions *.cpython-311-aarch64-linux-gnu.so, built in place beside the host's.
# Usage: .ci/arm64_build.sh [PYTHON]  (PYTHON: the host's Python 3.11 with setuptools, Cython and numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
ARM64_CACHE="${ARM64_CACHE:-/var/cache/bitnet-arm64}"
PY="${1:-$(command -v python || command -v python3)}"
ROOT="$ARM64_CACHE/root"
# setup.py's own needs (pyproject.toml's build-system: pip's isolated build env had them for the host's install, this
# direct call needs them in PY's environment)
"$PY" -c "import Cython, setuptools, numpy" 2>/dev/null || "$PY" -m pip install -q "setuptools>=68" "cython>=3.0" "numpy>=2.0"
_PYTHON_HOST_PLATFORM=linux-aarch64 \
_PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
PYTHONPATH="$ARM64_CACHE/sysconfig${PYTHONPATH:+:$PYTHONPATH}" \
CFLAGS="-I$ROOT/usr/include/aarch64-linux-gnu/python3.11 -I$ROOT/usr/include/python3.11 -I$ROOT/usr/include" \
    "$PY" setup.py build_ext --inplace
ls bitnet_app/_engine*.cpython-311-aarch64-linux-gnu.so
