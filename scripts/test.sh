#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, slow tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers (pytest-xdist): most of the suite's time is executors waiting on event time, cores idle;
# tests sharing a machine-wide resource keep to one worker (pytest.mark.xdist_group).
exec .venv/bin/python -m pytest -q -ra -n 2 --dist loadgroup "$@"
