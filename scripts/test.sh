#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: unit tests, nbval over every notebook, the browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKBENCH_APT_EXTRA="chromium" bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider tests "$@"
