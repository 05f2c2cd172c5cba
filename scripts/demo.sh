#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded default: no cluster needed. The adaptation
# loop rebalances and scales the executors live where the machine has room for more than one (an executor
# takes ~1.6 cores: a 2-core machine runs one, and the summary says what more the declared rates need); --rate-scale brings VWAP's cluster rates (40k + 60k rec/s)
# to what a small machine carries; --source-seconds ends the sources after 90 s of records, so the run
# drains and ends by itself with nothing waiting (--duration only caps it). Output: ./streamtopo-output/vwap/
# (docs/runtime.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/streamtopo run examples/vwap.yaml --rate-scale 0.02 --source-seconds 90 --duration 600
