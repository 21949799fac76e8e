#!/usr/bin/env bash
# Set up (if needed) and open JupyterLab on the curated notebooks, on the embedded demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKBENCH_EXTRAS=test,vlm bash scripts/setup.sh
. .venv/bin/activate
exec workbench lab "$@"
