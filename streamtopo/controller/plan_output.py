"""`streamtopo plan`: load a topology and a cluster, plan, and render the plan for people or tools.

The table is for people (PEs with their operators, host and size; hosts with load and utilisation;
U and C); ``streamtopo run`` shows the same PE table with each PE's executor (:func:`render_run_plan`).
JSON and YAML are the contract of ``Plan.to_dict()``. Exit codes: 0 feasible plan, 2 invalid input
(every problem as ``field.path: message``), 3 no valid or no feasible plan (saying why).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console, JustifyMethod
from rich.table import Table

from streamtopo.contracts import RoutingTable, parse_unit
from streamtopo.controller import bounded
from streamtopo.documents import load_cluster, load_topology
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import TopologyError
from streamtopo.planner.plan import PE, Plan

DEFAULT_HOSTS = 4
DEFAULT_HOST_CPU = 4.0
"""The cluster planned on when none is given: 4 hosts x 4 cores, a small Kubernetes node pool."""

EXIT_OK, EXIT_INVALID, EXIT_NO_PLAN = 0, 2, 3
FORMATS = ("table", "json", "yaml")


@dataclass(frozen=True)
class PlanRequest:
    """What the command line asked for."""

    topology: Path
    cluster: Path | None = None
    hosts: int | None = None
    host_cpu: float | None = None
    algorithm: str | None = None
    graph: str | None = None
    output_format: str = "table"
    seed: int = 0
    limits: bounded.Limits = bounded.Limits()
    """Time and memory one planning call may take (``--plan-timeout``, ``--plan-memory``)."""


def resolve_cluster(request: PlanRequest) -> Cluster:
    """``--cluster`` file, else ``--hosts``/``--host-cpu`` (each defaulting), else the default cluster."""
    if request.cluster is not None:
        if request.hosts is not None or request.host_cpu is not None:
            raise TopologyError([("--cluster", "give either --cluster or --hosts/--host-cpu, not both")])
        return load_cluster(request.cluster)
    hosts = DEFAULT_HOSTS if request.hosts is None else request.hosts
    cpu = DEFAULT_HOST_CPU if request.host_cpu is None else request.host_cpu
    problems = ([("--hosts", "need at least one host")] if hosts < 1 else []) + (
        [("--host-cpu", f"host CPU must be a positive finite number (got {cpu})")]
        if not cpu > 0 or not math.isfinite(cpu)
        else []
    )
    if problems:
        raise TopologyError(problems)
    return Cluster.uniform(hosts, cpu)


def run_plan(request: PlanRequest, out: Console, err: Console) -> int:
    """Plan and print; returns the exit code. Never raises for bad input."""
    from streamtopo.planner.placement.fusion import FUSION_ALGORITHMS, GRAPH_KINDS, plan_topology

    problems: list[tuple[str, str]] = []
    if request.output_format not in FORMATS:
        problems.append(("--format", f"unknown format {request.output_format!r}: use {', '.join(FORMATS)}"))
    if request.algorithm is not None and request.algorithm not in FUSION_ALGORITHMS:
        choices = ", ".join(sorted(FUSION_ALGORITHMS))
        problems.append(("--algorithm", f"unknown algorithm {request.algorithm!r}: use {choices}"))
    if request.graph is not None and request.graph not in GRAPH_KINDS:
        problems.append(("--graph", f"unknown graph {request.graph!r}: use {', '.join(sorted(GRAPH_KINDS))}"))
    topology = cluster = None
    for loader in (lambda: load_topology(request.topology), lambda: resolve_cluster(request)):
        try:
            result = loader()
        except TopologyError as error:
            problems.extend(error.problems)
            continue
        if isinstance(result, Cluster):
            cluster = result
        else:
            topology = result
    if problems or topology is None or cluster is None:
        for path, message in problems:
            _error(err, f"{path}: {message}")
        return EXIT_INVALID

    try:
        plan = bounded.call(
            plan_topology,
            topology.spec,
            cluster,
            request.algorithm,
            request.graph,
            request.seed,
            limits=request.limits,
        )
    except bounded.OverLimit as error:
        _error(err, f"no plan: {error} (--plan-timeout, --plan-memory)")
        return EXIT_NO_PLAN
    except _no_valid_plan() as error:
        message = str(error)
        _error(err, message if message.startswith("no valid plan") else f"no valid plan: {message}")
        return EXIT_NO_PLAN

    render(plan, request.output_format, out)
    if not plan.valid:
        _error(err, "no valid plan: " + "; ".join(plan.violations))
        return EXIT_NO_PLAN
    if not plan.feasible:
        worst = max(plan.load, key=lambda h: plan.load[h] / plan.capacity[h])
        _error(
            err,
            f"no feasible plan: host {worst} needs {plan.load[worst]:.3f} cores of "
            f"{plan.capacity[worst]:g} (U = {plan.max_utilization:.3f} > 1); add hosts or CPU",
        )
        return EXIT_NO_PLAN
    return EXIT_OK


def _error(err: Console, message: str) -> None:
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def _no_valid_plan() -> tuple[type[Exception], ...]:
    """COLA's "no valid solution" exception, or nothing to catch while COLA is not installed."""
    try:
        from streamtopo.planner.placement.cola import NoValidPlan
    except ImportError:
        return ()
    return (NoValidPlan,)


def render(plan: Plan, output_format: str, out: Console) -> None:
    """Print the plan as a table, JSON or YAML."""
    if output_format == "json":
        out.print(json.dumps(plan.to_dict(), indent=2), markup=False, highlight=False, soft_wrap=True)
    elif output_format == "yaml":
        out.print(
            yaml.safe_dump(plan.to_dict(), sort_keys=False),
            markup=False,
            highlight=False,
            soft_wrap=True,
            end="",
        )
    else:
        pes, hosts = plan_tables(plan)
        out.print(pes)
        out.print(hosts)
        out.print(scores_line(plan), highlight=False)


def render_run_plan(plan: Plan | None, routing: RoutingTable, out: Console) -> None:
    """What ``streamtopo run`` shows before it starts: the PE table of ``streamtopo plan`` with the executor
    that runs each PE, and U and C; for ``--executors N`` (no fusion plan) the executors and their hosts.

    The host table is left out: a local run plans on one or a few hosts, and U already names the worst.
    """
    if plan is None:
        n = len(routing.executors)
        hosts = ", ".join(f"{name} on {e.host or '-'}" for name, e in sorted(routing.executors.items()))
        out.print(
            f"plan: {n} executors (--executors), unit (operator, kg) on executor kg mod {n}: {hosts}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    out.print(plan_tables(plan, routing)[0])
    out.print(scores_line(plan), highlight=False)


def scores_line(plan: Plan) -> str:
    """U and C, the scores COLA trades off, and the plan's verdicts (under the tables of both commands)."""
    return (
        f"U (max host utilisation) = {plan.max_utilization:.3f}   "
        f"C (communication cost) = {plan.communication_cost:.4f} cores   "
        f"feasible = {plan.feasible}   valid = {plan.valid}"
    )


def plan_tables(plan: Plan, routing: RoutingTable | None = None) -> tuple[Table, Table]:
    """The PE table and the host table of a plan; with ``routing`` the PE table names each PE's executor
    (the executors its units are routed to; "-" for an HA replica, which a local run does not start)."""
    pes = Table(title=f"{plan.algorithm} plan on the {plan.graph_kind} graph: {len(plan.pes)} PEs")
    columns: list[tuple[str, JustifyMethod]] = [("PE", "left")]
    if routing is not None:
        columns.append(("executor", "left"))
    columns += [("operators", "left"), ("host", "left"), ("size (cores)", "right")]
    for column, justify in columns:
        pes.add_column(column, justify=justify)
    for pe in sorted(plan.pes, key=lambda p: (str(p.host), p.name)):
        operators = ", ".join(pe.operators)
        if plan.graph_kind == "unit":
            operators += f"  ({len(pe.members)} units)"
        executor = [_executor_of(pe, routing)] if routing is not None else []
        pes.add_row(pe.name, *executor, operators, pe.host or "-", f"{pe.size:.3f}")
    hosts = Table(title="hosts")
    for column in ("host", "capacity", "load", "utilisation"):
        hosts.add_column(column, justify="left" if column == "host" else "right")
    for name, capacity in plan.capacity.items():
        share = plan.load[name] / capacity
        style = "red" if share > 1 + 1e-9 else None
        hosts.add_row(name, f"{capacity:g}", f"{plan.load[name]:.3f}", f"{share:.1%}", style=style)
    return pes, hosts


def _executor_of(pe: PE, routing: RoutingTable) -> str:
    """The executors running ``pe``'s units (several when Aeolus' count split it), "-" for none."""
    members = {(m[0], int(m[1])) if isinstance(m, tuple) else m for m in pe.members}
    names = {
        executor
        for key, executor in routing.units.items()
        if (unit := parse_unit(key)) in members or unit[0] in members
    }
    return ", ".join(sorted(names, key=lambda n: (len(n), n))) or "-"
