"""Every benchmark script starts: ``python bench/X.py --help`` imports all it uses and parses its options.
Benchmarks run by hand, rarely, and nothing else imports them, so a moved helper broke
bench/autoscaling.py unseen for days; this catches that before a benchmark run does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if "__main__" in p.read_text() and p.name != "peers_worker.py")
"""Scripts with a command line (peers_worker.py is PyFlink's worker, run in its own virtualenv)."""


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_a_benchmark_script_starts(script):
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=BENCH.parent
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
