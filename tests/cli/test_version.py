"""One version: the package metadata's, printed by ``streamtopo --version`` and carried by the chart and
the default executor image."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import yaml
from typer.testing import CliRunner

from streamtopo.cli import app
from streamtopo.planner.model import StreamTopologySpec

ROOT = Path(__file__).resolve().parents[2]


def test_version_comes_from_the_package_metadata_everywhere():
    installed = version("streamtopo")
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"streamtopo {installed}"
    chart = yaml.safe_load((ROOT / "charts/streamtopo/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == installed
    image = StreamTopologySpec.model_fields["image"].default
    assert image.rpartition(":")[2] == installed


def test_dash_o_selects_the_output_format_like_kubectl(tmp_path):
    example = ROOT / "examples" / "wordcount.yaml"
    short = CliRunner().invoke(app, ["plan", str(example), "--hosts", "3", "--host-cpu", "2", "-o", "json"])
    long = CliRunner().invoke(
        app, ["plan", str(example), "--hosts", "3", "--host-cpu", "2", "--format", "json"]
    )
    assert short.exit_code == 0 and short.output == long.output and short.output.lstrip().startswith("{")


def test_shell_completion_is_offered(monkeypatch):
    # With shell detection on, typer ignores the "bash" and asks shellingham for the parent shell, which a
    # run under no shell (an orphaned `nohup`, a CI runner) does not have: exit 1, "Shell  not supported".
    # Off, --show-completion takes the shell it is given, as a user's `--show-completion bash` means.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0 and "_STREAMTOPO_COMPLETE" in result.output
