#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded default: no cluster needed. The adaptation
# loop rebalances and scales the executors live; --rate-scale brings VWAP's cluster rates (40k + 60k rec/s)
# to what a small machine carries (docs/runtime.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/streamtopo run examples/vwap.yaml --duration 120 --rate-scale 0.02
