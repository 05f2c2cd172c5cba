"""`streamtopo run FILE`: run a StreamTopology on this machine (embedded Valkey, local executors)."""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    file: Path = typer.Argument(..., help="StreamTopology YAML file."),
    duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds "
                                          "(default: until finite sources end, or Ctrl-C)."),
    executors: int | None = typer.Option(None, "--executors", min=1,
                                         help="Executors (default: one per COLA PE)."),
    output: Path | None = typer.Option(None, "--output", help="Directory of file sinks."),
    migrate_every: float | None = typer.Option(None, "--migrate-every", min=0.1,
                                               help="Drill: move a random key group every S seconds."),
    kill_every: float | None = typer.Option(None, "--kill-every", min=0.5,
                                            help="Drill: kill -9 a random executor every S seconds (restarted)."),
    hosts: int | None = typer.Option(None, "--hosts", min=1, help="Hosts of the planning cluster (default 1)."),
    host_cpu: float = typer.Option(2.0, "--host-cpu", min=0.1, help="CPU cores per planning host."),
    seed: int = typer.Option(0, "--seed", help="Seed of the drills' random choices and of the planner."),
    autoscale: bool | None = typer.Option(None, "--autoscale/--no-autoscale", show_default=False,
                                          help="Run the SPL adaptation loop (ALBIC rebalancing + scaling) "
                                          "[default: spec.autoscaling.enabled]."),
    interval: float | None = typer.Option(None, "--interval", min=1.0,
                                          help="SPL of this run in seconds [default: spec.autoscaling.interval, "
                                          "capped at duration / 6, at least 5]."),
    rate_scale: float = typer.Option(1.0, "--rate-scale", min=0.0001,
                                     help="Multiply every source's ratePerSecond (and declared costs) by F."),
) -> None:
    """Plan and run the pipeline locally with live progress; print a summary at the end."""
    from rich.console import Console

    from streamtopo.planner.model import TopologyError, load_topology
    from streamtopo.runtime.runner import RunOptions, check_pipeline, print_summary, run_topology

    console = Console()
    try:
        topology = load_topology(file)
        check_pipeline(topology)
    except (TopologyError, ValueError) as error:
        console.print(f"[red]error:[/red] {file}:\n{error}", highlight=False)
        raise typer.Exit(2) from None
    options = RunOptions(duration=duration, executors=executors, output=output, migrate_every=migrate_every,
                         kill_every=kill_every, hosts=hosts, host_cpu=host_cpu, seed=seed, autoscale=autoscale,
                         interval=interval, rate_scale=rate_scale,
                         live=console.is_terminal, progress_every=None if console.is_terminal else 5.0)
    summary = run_topology(topology, options, console)
    print_summary(summary, console)
    raise typer.Exit(1 if summary.failed else 0)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
