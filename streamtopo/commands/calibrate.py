"""`streamtopo calibrate`: measure Aeolus' per-message (n) and per-byte (s) costs through Valkey here."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate(
        transport: str | None = typer.Option(
            None, "--transport", help="Valkey/Redis URL (default: a private embedded Valkey)."
        ),
        output: Path | None = typer.Option(None, "--output", help="Also write the result as JSON here."),
    ) -> None:
        """Print n (CPU s per message) and s (CPU s per byte) of Arrow IPC entries through Valkey."""
        from rich.console import Console
        from rich.table import Table

        from streamtopo.runtime.calibrate import calibrate as measure
        from streamtopo.runtime.transport import TransportUnavailable

        console = Console()
        try:
            result = measure(transport, output)
        except TransportUnavailable as error:
            console.print(f"[red]error:[/red] {error}")
            raise typer.Exit(3) from None
        table = Table(title="transport cost per message (client CPU)")
        for column in ("records", "bytes", "µs per message"):
            table.add_column(column, justify="right")
        for records, nbytes, seconds in result.points:
            table.add_row(f"{records:,}", f"{nbytes:,}", f"{seconds * 1e6:,.1f}")
        console.print(table)
        console.print(
            f"n = {result.per_message:.3g} s per message, s = {result.per_byte:.3g} s per byte "
            f"(CommCostModel(per_record={result.per_message:.3g}, per_byte={result.per_byte:.3g}))"
        )
