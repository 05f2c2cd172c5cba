"""`streamtopo crd`: regenerate (or check) the CRD, the chart's CRD and docs/reference.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("crd")
    def crd(
        output_dir: Annotated[
            Path,
            typer.Option("--output-dir", help="Project root holding crds/, charts/streamtopo/ and docs/."),
        ] = Path("."),
        check: Annotated[
            bool,
            typer.Option(
                "--check", help="Write nothing; exit 1 when a generated file is missing or differs."
            ),
        ] = False,
    ) -> None:
        """Generate the StreamTopology CRD and field reference from the pydantic model."""
        from streamtopo.controller.generated import apply_or_check, generated_files

        raise typer.Exit(apply_or_check(output_dir, generated_files(), check=check, fix="streamtopo crd"))
