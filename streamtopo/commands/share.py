"""`streamtopo share A.yaml B.yaml ...`: place several topologies together, computing shared sub-trees once.

Benoit et al.'s heuristics (default TopDownBFS with strategy 3) or their integer program decide which
processor runs each operator instance; the table or JSON lists every instance with the topology operators
it serves. Exit codes: 0 placed, 2 bad input (the message names the file and field or the option), 3 no
placement (with the constraint that stopped it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.markup import escape

from streamtopo.planner.benoit.heuristics import DEFAULT_HEURISTIC, DEFAULT_STRATEGY, HEURISTICS, Heuristic
from streamtopo.planner.benoit.problem import OBJECTIVES, Objective

if TYPE_CHECKING:
    from rich.console import Console

    from streamtopo.planner.benoit.problem import Usage
    from streamtopo.planner.benoit.topologies import SharedProblem

EXIT_OK, EXIT_INVALID, EXIT_NONE = 0, 2, 3
FORMATS = ("table", "json")
METHODS = ("heuristic", "ilp")


def register(app: typer.Typer) -> None:
    @app.command("share")
    def share(
        files: Annotated[list[Path], typer.Argument(help="StreamTopology YAML files placed together.")],
        cluster: Annotated[
            Path | None,
            typer.Option(
                help="Hosts YAML: hosts: [{name, cpu, network}], links: [{hosts: [a, b], bandwidth}]."
            ),
        ] = None,
        hosts: Annotated[int | None, typer.Option(help="Uniform cluster of N hosts (default 4).")] = None,
        host_cpu: Annotated[float | None, typer.Option(help="CPU cores per host (default 4).")] = None,
        heuristic: Annotated[str, typer.Option(help=" | ".join(HEURISTICS) + ".")] = DEFAULT_HEURISTIC,
        strategy: Annotated[
            int,
            typer.Option(
                help="Processor selection: 1 fastest, 2 biggest card (blocking), 3 fastest remaining, "
                "4 biggest remaining card."
            ),
        ] = DEFAULT_STRATEGY,
        method: Annotated[
            str, typer.Option(help="heuristic | ilp (Section 4, started from the heuristic).")
        ] = "heuristic",
        objective: Annotated[str, typer.Option(help=" | ".join(OBJECTIVES) + ".")] = "proc-nb",
        no_share: Annotated[
            bool, typer.Option("--no-share", help="Compute nothing once for two topologies (the baseline).")
        ] = False,
        across_namespaces: Annotated[
            bool,
            typer.Option(
                "--across-namespaces", help="Share sub-trees of topologies in different namespaces."
            ),
        ] = False,
        deterministic_time: Annotated[
            float,
            typer.Option(
                min=0.01, help="ilp: CP-SAT deterministic-time limit (machine-independent work, not seconds)."
            ),
        ] = 60.0,
        seed: Annotated[int, typer.Option(help="Seed of the random heuristics and the solver.")] = 0,
        output_format: Annotated[str, typer.Option("--format", "-o", help="table | json.")] = "table",
    ) -> None:
        """Place topologies together, computing common sub-trees once (Benoit et al.)."""
        from rich.console import Console

        raise typer.Exit(
            run_share(
                files,
                cluster=cluster,
                hosts=hosts,
                host_cpu=host_cpu,
                heuristic=heuristic,
                strategy=strategy,
                method=method,
                objective=objective,
                no_share=no_share,
                across_namespaces=across_namespaces,
                deterministic_time=deterministic_time,
                seed=seed,
                output_format=output_format,
                out=Console(),
                err=Console(stderr=True),
            )
        )


def run_share(
    files: list[Path],
    *,
    cluster: Path | None,
    hosts: int | None,
    host_cpu: float | None,
    heuristic: str,
    strategy: int,
    method: str,
    objective: str,
    no_share: bool,
    across_namespaces: bool,
    deterministic_time: float,
    seed: int,
    output_format: str,
    out: Console,
    err: Console,
) -> int:
    """The command's logic; returns the exit code and never raises for bad input."""
    from streamtopo.controller.plan_output import PlanRequest, resolve_cluster
    from streamtopo.documents import load_topology
    from streamtopo.planner.benoit.heuristics import place_heuristic
    from streamtopo.planner.benoit.ilp import solve_ilp
    from streamtopo.planner.benoit.topologies import sharing_problem
    from streamtopo.planner.model import TopologyError

    problems: list[tuple[str, str]] = []
    for option, value, choices in (
        ("--heuristic", heuristic, tuple(HEURISTICS)),
        ("--method", method, METHODS),
        ("--objective", objective, OBJECTIVES),
        ("--format", output_format, FORMATS),
    ):
        if value not in choices:
            problems.append((option, f"unknown value {value!r}: use {', '.join(choices)}"))
    if strategy not in (1, 2, 3, 4):
        problems.append(("--strategy", f"unknown strategy {strategy}: use 1, 2, 3 or 4"))
    if not files:
        problems.append(("FILES", "give at least one topology"))
    if no_share and method == "ilp":
        problems.append(("--no-share", "the integer program always shares; use --method heuristic"))
    topologies = []
    for path in files:
        try:
            topologies.append(load_topology(path))
        except TopologyError as error:
            problems.extend((f"{path}: {field}", message) for field, message in error.problems)
    try:
        hosts_ = resolve_cluster(PlanRequest(files[0] if files else Path("."), cluster, hosts, host_cpu))
    except TopologyError as error:
        problems.extend(error.problems)
    if not problems:
        try:
            shared = sharing_problem(topologies, hosts_, across_namespaces=across_namespaces)
        except TopologyError as error:
            problems.extend(error.problems)
    if problems:
        for field, message in problems:
            err.print(f"[red]error[/red] {escape(field)}: {escape(message)}", highlight=False, soft_wrap=True)
        return EXIT_INVALID

    # Checked against HEURISTICS and OBJECTIVES above.
    chosen = cast(Heuristic, "random-no-reuse" if no_share else heuristic)
    goal = cast(Objective, objective)
    result = place_heuristic(shared.problem, chosen, strategy, seed)
    usage: Usage | None = result.usage
    failure, status = result.failure, "heuristic"
    if method == "ilp":
        ilp = solve_ilp(
            shared.problem,
            goal,
            deterministic_time=deterministic_time,
            seed=seed,
            hint=usage.placement if usage is not None and result.feasible else None,
        )
        usage, status = ilp.usage, ilp.status
        failure = (
            None
            if ilp.feasible
            else (
                "no placement satisfies compute (1), card (3) and link (4) constraints"
                if ilp.status == "infeasible"
                else f"the solver found no placement within its limit (heuristic: {failure or 'placed'})"
            )
        )
    report = _report(
        shared,
        usage if failure is None else None,
        failure,
        method=method,
        heuristic=chosen,
        strategy=strategy,
        objective=goal,
        status=status,
    )
    if output_format == "json":
        out.print_json(json.dumps(report))
    else:
        _table(report, out, err)
    return EXIT_OK if failure is None else EXIT_NONE


def _report(
    shared: SharedProblem,
    usage: Usage | None,
    failure: str | None,
    *,
    method: str,
    heuristic: str,
    strategy: int,
    objective: Objective,
    status: str,
) -> dict:
    """The JSON contract: every operator of every topology appears in exactly one instance's ``serves``."""
    report: dict = {
        "feasible": usage is not None,
        "method": method,
        "heuristic": heuristic,
        "strategy": strategy,
        "objective": objective,
        "status": status,
    }
    if usage is None:
        return report | {
            "reason": failure,
            "cost": None,
            "processors": [],
            "load": {},
            "instances": [],
            "downloads": [],
        }
    problem = shared.problem
    instances: dict[tuple[object, str], dict] = {}
    for (app_name, node_name), host in sorted(usage.placement.items()):
        app = next(a for a in problem.applications if a.name == app_name)
        node = app.node(node_name)
        key = usage.key((app_name, node_name))
        entry = instances.setdefault(
            (key, host),
            {
                "name": f"{shared.labels[node.operator]}-{node.operator[:8]}",
                "host": host,
                "rate": 0.0,
                "serves": [],
            },
        )
        entry["rate"] = max(entry["rate"], app.rate(node))
        entry["serves"].append(f"{app_name}/{node_name}")
    downloads = [
        {"object": obj, "host": u, "from": usage.servers.get((obj, u)) or "external", "bytesPerSecond": rate}
        for (obj, u), rate in sorted(usage.downloads.items())
        if rate > 0
    ]
    return report | {
        "cost": usage.cost(objective),
        "processors": sorted(usage.used),
        "load": {
            host: {"cpu": usage.cpu[host], "cardBytesPerSecond": usage.card[host]}
            for host in sorted(usage.used)
        },
        "instances": sorted(instances.values(), key=lambda e: (e["host"], e["name"])),
        "downloads": downloads,
    }


def _table(report: dict, out: Console, err: Console) -> None:
    from rich.table import Table

    if not report["feasible"]:
        err.print(f"[red]no placement[/red]: {escape(report['reason'])}", highlight=False, soft_wrap=True)
        return
    table = Table(
        title=f"{len(report['instances'])} instances on {len(report['processors'])} hosts "
        f"({report['method']}: {HEURISTICS.get(report['heuristic'], report['heuristic'])}, "
        f"strategy {report['strategy']}; {report['objective']} = {report['cost']:.4g})"
    )
    for column in ("instance", "host", "rate (rec/s)", "serves"):
        table.add_column(column)
    for entry in report["instances"]:
        table.add_row(entry["name"], entry["host"], f"{entry['rate']:.6g}", ", ".join(entry["serves"]))
    table.caption = "CPU in use (operators and the named-stream hops they send or receive): " + ", ".join(
        f"{host} {load['cpu']:.0%}" for host, load in report["load"].items()
    )
    out.print(table)
