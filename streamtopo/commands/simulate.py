"""`streamtopo simulate SCENARIO.yaml`: run a rebalancing policy and a scaling rule over a scenario.

The simulation itself is pure (streamtopo.planner.simulation.simulator); this module reads the file, shows
progress, prints the table or JSON and draws the plot. Exit codes: 0 done, 2 bad input (the message
names the field or option).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.markup import escape

from streamtopo.planner.model import AlbicSpec, RebalancePolicy

if TYPE_CHECKING:
    from rich.console import Console

    from streamtopo.planner.simulation.simulator import SimulationResult

POLICIES: tuple[str, ...] = get_args(RebalancePolicy)
FORMATS = ("table", "json")
SERIES = (
    ("load_distance", "load distance (pp)"),
    ("load_index", "load index"),
    ("collocation_factor", "collocation factor"),
    ("migrations", "migrations"),
    ("executors", "executors"),
    ("backlog", "backlog (records)"),
)


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        scenario: Annotated[
            Path, typer.Argument(help="Scenario YAML (see examples/scenarios/, docs/simulate.md).")
        ],
        policy: Annotated[
            str | None,
            typer.Option(
                "--policy", help="Rebalancing policy: " + " | ".join(POLICIES) + " (default: the scenario's)."
            ),
        ] = None,
        scaling: Annotated[
            str | None,
            typer.Option(
                "--scaling", help="Scaling rule: target | dstreams | off (default: the scenario's)."
            ),
        ] = None,
        periods: Annotated[
            int | None, typer.Option("--periods", min=1, help="Periods to run (default: the scenario's).")
        ] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="Seed (default: the scenario's).")] = None,
        plot: Annotated[
            Path | None, typer.Option("--plot", help="Draw the per-period series into this PNG.")
        ] = None,
        output_format: Annotated[str, typer.Option("--format", "-o", help="table | json.")] = "table",
        deterministic_time: Annotated[
            float | None,
            typer.Option(
                "--deterministic-time",
                min=0.001,
                help="albic/milp: CP-SAT deterministic-time limit per MILP solve, a machine-independent work "
                "unit, not seconds (default: the policy's).",
            ),
        ] = None,
    ) -> None:
        """Simulate rebalancing and scaling over a scenario; print per-period figures and a summary."""
        from rich.console import Console

        raise typer.Exit(
            run_simulate(
                scenario,
                policy=policy,
                scaling=scaling,
                periods=periods,
                seed=seed,
                plot=plot,
                output_format=output_format,
                deterministic_time=deterministic_time,
                out=Console(),
                err=Console(stderr=True),
            )
        )


def run_simulate(
    path: Path,
    *,
    policy: str | None,
    scaling: str | None,
    periods: int | None,
    seed: int | None,
    plot: Path | None,
    output_format: str,
    out: Console,
    err: Console,
    deterministic_time: float | None = None,
) -> int:
    """The command's logic; returns the exit code."""
    import yaml

    from streamtopo.planner.scaling.rules import SCALING_RULES
    from streamtopo.planner.simulation.scenario import ScenarioError, load_scenario
    from streamtopo.planner.simulation.simulator import simulate

    problems = []
    if policy is not None and policy not in POLICIES:
        problems.append(f"--policy: unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    if scaling is not None and scaling not in SCALING_RULES:
        problems.append(f"--scaling: unknown rule {scaling!r}; use one of {', '.join(SCALING_RULES)}")
    if output_format not in FORMATS:
        problems.append(f"--format: unknown format {output_format!r}; use one of {', '.join(FORMATS)}")
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        problems.append(f"{path}: cannot read file: {error.strerror}")
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problems.append(f"{where}: not valid YAML: {getattr(error, 'problem', error)}")
    if problems:
        return _fail(err, problems)
    try:
        scenario = load_scenario(data)
    except ScenarioError as error:
        return _fail(err, [f"{path}: {field}: {message}" for field, message in error.problems])

    total = periods or scenario.periods
    run = partial(
        simulate,
        scenario,
        policy=policy,
        scaling=scaling,
        periods=periods,
        seed=seed,
        policy_config=solver_config(policy or scenario.policy, scenario.albic, deterministic_time),
    )
    if output_format == "table":
        from rich.progress import Progress

        with Progress(console=err, transient=True) as bar:
            task = bar.add_task(f"simulating {scenario.name}", total=total)
            result = run(progress=lambda done, _: bar.update(task, completed=done))
        _print_table(result, out)
    else:
        result = run()
        out.print_json(json.dumps(result.to_dict()))
    if plot is not None:
        plot_simulation([result], plot)
        err.print(f"plot written to {plot}")
    return 0


def solver_config(policy: str, albic: AlbicSpec, deterministic_time: float | None) -> object | None:
    """The MILP-based policies' config for ``--deterministic-time`` (None: the scenario's, as
    :func:`~streamtopo.planner.simulation.simulator.simulate` builds it)."""
    if deterministic_time is None or policy not in ("albic", "milp"):
        return None
    from streamtopo.planner.rebalance.albic import AlbicConfig, MilpConfig

    milp = MilpConfig(deterministic_time=deterministic_time)
    return milp if policy == "milp" else AlbicConfig.from_spec(albic).model_copy(update={"milp": milp})


def _fail(err: Console, problems: list[str]) -> int:
    for problem in problems:
        err.print(f"[red]error[/red] {escape(problem)}", highlight=False, soft_wrap=True)
    return 2


def _print_table(result: SimulationResult, out: Console) -> None:
    from rich.table import Table

    table = Table(title=f"{result.scenario}: policy {result.policy}, scaling {result.scaling}")
    for name in (
        "period",
        "input rec/s",
        "active/all executors",
        "util",
        "load dist",
        "load index",
        "colloc",
        "migr",
        "backlog",
        "scaling",
    ):
        table.add_column(name, justify="right")
    for p in result.periods:
        scaling = p.scaling if p.scaling == "none" else f"{p.scaling} -> {p.executors_next}"
        table.add_row(
            str(p.period),
            f"{p.input_rate:,.0f}",
            f"{p.active_executors}/{p.executors}",
            f"{p.utilization:.2f}",
            f"{p.load_distance:.1f}",
            f"{p.load_index:.3f}",
            f"{p.collocation_factor:.2f}",
            str(p.migrations),
            f"{p.backlog:,.0f}",
            "safe" if p.safe else scaling,
        )
    out.print(table)
    summary = Table(title="summary", show_header=False)
    for key, value in result.summary.items():
        summary.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    out.print(summary)
    for p in result.periods:
        if p.scaling != "none" or p.safe:
            out.print(f"period {p.period}: {p.reason}", highlight=False)


def plot_simulation(results: list[SimulationResult], path: Path) -> None:
    """One panel per reported series, one line per result (policy / scaling rule)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7), sharex=True)
    for ax, (key, label) in zip(axes.flat, SERIES):
        for result in results:
            ax.plot(
                [p.period for p in result.periods],
                [getattr(p, key) for p in result.periods],
                label=f"{result.policy}/{result.scaling}",
                drawstyle="steps-post" if key == "executors" else "default",
            )
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("period")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(results[0].scenario)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
