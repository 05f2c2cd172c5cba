"""`streamtopo manifests`: render the Helm chart with default values into manifests/ (or check)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("manifests")
    def manifests(
        output_dir: Annotated[
            Path, typer.Option("--output-dir", help="Project root holding charts/streamtopo/ and manifests/.")
        ] = Path("."),
        check: Annotated[
            bool,
            typer.Option("--check", help="Write nothing; exit 1 when manifests/ differs from the chart."),
        ] = False,
    ) -> None:
        """Render charts/streamtopo into plain YAML for `kubectl apply -f manifests/`."""
        from streamtopo.controller.generated import apply_or_check
        from streamtopo.controller.manifests import manifest_files

        files = manifest_files(output_dir / "charts/streamtopo")
        raise typer.Exit(apply_or_check(output_dir, files, check=check, fix="streamtopo manifests"))
