#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for streamtopo: system packages (a JRE for PySpark, Prometheus
# for the metrics tests), a virtualenv in .venv with the package and its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need=()
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "setup: done ($(.venv/bin/python --version), java: $(java -version 2>&1 | head -1))"
