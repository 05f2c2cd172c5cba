"""`streamtopo plan FILE`: fuse and place a StreamTopology, print the plan (logic in controller/plan_output)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        file: Annotated[Path, typer.Argument(help="StreamTopology YAML (a full resource or a bare spec).")],
        cluster: Annotated[
            Path | None, typer.Option(help="Hosts YAML: hosts: [{name, cpu, labels}].")
        ] = None,
        hosts: Annotated[int | None, typer.Option(help="Uniform cluster of N hosts (default 4).")] = None,
        host_cpu: Annotated[float | None, typer.Option(help="CPU cores per host (default 4).")] = None,
        algorithm: Annotated[
            str | None,
            typer.Option(help="cola | none | single | fint | metis (default: spec.fusion.algorithm)."),
        ] = None,
        graph: Annotated[
            str | None, typer.Option(help="auto | logical | unit (default: spec.fusion.graph).")
        ] = None,
        output_format: Annotated[str, typer.Option("--format", "-o", help="table | json | yaml.")] = "table",
        seed: Annotated[int, typer.Option(help="Seed of the randomised planners.")] = 0,
        plan_timeout: Annotated[
            float, typer.Option(help="Seconds planning may run (in a process of its own); 0: no limit.")
        ] = 120.0,
        plan_memory: Annotated[
            str, typer.Option(help="Address space planning may use (4GiB, 512Mi, bytes); 0: no limit.")
        ] = "4GiB",
    ) -> None:
        """Fuse operators into PEs and place them on hosts; exit 0 feasible, 2 bad input, 3 no plan."""
        from rich.console import Console

        from streamtopo.controller.bounded import Limits, parse_bytes
        from streamtopo.controller.plan_output import PlanRequest, run_plan

        try:
            memory = parse_bytes(plan_memory)
        except ValueError as error:
            Console(stderr=True).print(f"--plan-memory: {error}", markup=False, highlight=False)
            raise typer.Exit(2) from None
        limits = Limits(seconds=plan_timeout or None, memory=memory or None)
        request = PlanRequest(file, cluster, hosts, host_cpu, algorithm, graph, output_format, seed, limits)
        raise typer.Exit(run_plan(request, Console(), Console(stderr=True)))
