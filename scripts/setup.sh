#!/usr/bin/env bash
# Set up a fresh machine (Debian/Ubuntu or macOS): system packages, a virtualenv in .venv, the project.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname)" = "Linux" ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  # OpenBLAS (+ libgfortran) puts MLX's CPU matmuls on a fast BLAS; chromium for the browser test
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libopenblas0-pthread libgfortran5 ${WORKBENCH_APT_EXTRA:-} >/dev/null
fi
PY=${PYTHON:-python3}
[ -d .venv ] || $PY -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[${WORKBENCH_EXTRAS:-test,vlm}]"
