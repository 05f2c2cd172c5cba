#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, slow tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers (pytest-xdist): most of the suite's time is executors waiting on event time, cores idle;
# tests sharing a machine-wide resource keep to one worker (pytest.mark.xdist_group). The 25 slowest
# tests are listed at the end, so a CI that grows shows where.
exec .venv/bin/python -m pytest -q -ra --durations=25 -n 2 --dist loadgroup "$@"
