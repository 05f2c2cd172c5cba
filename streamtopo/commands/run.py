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
    output: Path | None = typer.Option(None, "--output", help="Directory of file sinks "
                                       "(default: ./streamtopo-output/<topology name>)."),
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
    source_seconds: float | None = typer.Option(
        None, "--source-seconds", min=0.1,
        help="Generators stop after S seconds of records (count = rate x S): the run drains and ends at end "
        "of stream."),
    verbose: bool = typer.Option(False, "--verbose", help="Show Spark's own output and WARN logs (the "
                                 "check's JVM here, the executors' in their logs) instead of ERROR only."),
) -> None:
    """Plan and run the pipeline locally with live progress; print a summary at the end."""
    from rich.console import Console
    from rich.markup import escape

    from streamtopo.controller.local_loop import local_loop
    from streamtopo.controller.plan_output import render_run_plan
    from streamtopo.planner.model import TopologyError, load_topology
    from streamtopo.runtime.operators.udf import extend_import_path
    from streamtopo.runtime.runner import RunOptions, check_pipeline, output_dir, print_summary, run_topology

    console = Console()
    udf_dirs = (file.resolve().parent,)  # UDF modules next to the file import without PYTHONPATH
    extend_import_path(udf_dirs)
    try:
        topology = load_topology(file)
        if topology.spec.suspend:
            raise ValueError("spec.suspend: the topology is suspended (no executor runs); "
                             "set it to false to run it")
        output = output_dir(topology, output)
        check_pipeline(topology, output, verbose=verbose)
    except (TopologyError, ValueError) as error:
        console.print(f"[red]error:[/red] {escape(str(file))}:\n{escape(str(error))}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(2) from None
    options = RunOptions(duration=duration, executors=executors, output=output, migrate_every=migrate_every,
                         kill_every=kill_every, hosts=hosts, host_cpu=host_cpu, seed=seed, autoscale=autoscale,
                         interval=interval, rate_scale=rate_scale, verbose=verbose, udf_dirs=udf_dirs,
                         source_seconds=source_seconds, live=console.is_terminal,
                         progress_every=None if console.is_terminal else 5.0,
                         show_plan=lambda plan, routing: render_run_plan(plan, routing, console),
                         adaptation=local_loop)
    summary = run_topology(topology, options, console)
    print_summary(summary, console)
    # Ending during warm-up is a failure too: the pipeline did not run, whatever the duration asked for.
    raise typer.Exit(1 if summary.failed or summary.unready else 0)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
