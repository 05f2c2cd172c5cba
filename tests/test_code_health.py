"""The house rules CI keeps: no unused import or undefined name (ruff's pyflakes rules), and dependencies
pointing inward (import-linter's contracts in pyproject.toml: commands -> controller | runtime -> planner,
controller and runtime independent of each other)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_no_unused_imports_or_undefined_names():
    result = run(str(BIN / "ruff"), "check", "--select", "F", "--output-format", "concise",
                 "streamtopo", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_hold():
    result = run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "1 kept, 0 broken" in result.stdout
