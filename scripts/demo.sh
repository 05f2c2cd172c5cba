#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded default: no cluster needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/streamtopo plan examples/vwap.yaml
