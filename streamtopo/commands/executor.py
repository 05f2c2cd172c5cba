"""`streamtopo executor`: the data-plane process (one per executor pod / local process)."""

from __future__ import annotations

from pathlib import Path

import typer

from streamtopo.runtime.metrics import ALL_INTERFACES


def executor(
    topology: Path = typer.Option(..., "--topology", help="The StreamTopology as YAML (topology.yaml)."),
    routing: Path = typer.Option(
        ..., "--routing", envvar="STREAMTOPO_ROUTING", help="Routing table JSON (watched for new versions)."
    ),
    name: str = typer.Option(..., "--name", help="This executor's name in the routing table."),
    transport: str = typer.Option(..., "--transport", help="Valkey/Redis URL, e.g. redis://valkey:6379."),
    metrics_port: int = typer.Option(
        0, "--metrics-port", help="Port of /metrics, /healthz, /readyz (0: any)."
    ),
    port_file: Path | None = typer.Option(
        None,
        "--port-file",
        help="File the endpoints' port is written to once they listen (with --metrics-port 0, the one the "
        "system chose): how a local platform finds its executors without handing out ports.",
    ),
    output: Path | None = typer.Option(None, "--output", help="Directory of file sinks."),
    cpu: float = typer.Option(1.0, "--cpu", help="CPU cores this executor may use (exported capacity)."),
    termination_log: Path | None = typer.Option(
        None,
        "--termination-log",
        help="File the reason of a failure is written to (a pod's terminationMessagePath), so the "
        "operator can say it in the topology's conditions and Events.",
    ),
    bind: str = typer.Option(
        ALL_INTERFACES,
        "--bind",
        help="Address of the HTTP endpoints: all interfaces (a pod's probes and "
        "Prometheus reach its IP); 127.0.0.1 keeps them local.",
    ),
) -> None:
    """Run the units the routing table gives this executor (exit 2: bad pipeline, 3: no transport,
    4: a file sink cannot write)."""
    from streamtopo.runtime.executor import run_executor

    raise typer.Exit(
        run_executor(
            topology,
            routing,
            name,
            transport,
            metrics_port=metrics_port,
            port_file=port_file,
            output_dir=output,
            cpu=cpu,
            bind=bind,
            termination_log=termination_log,
        )
    )


def register(app: typer.Typer) -> None:
    app.command("executor")(executor)
