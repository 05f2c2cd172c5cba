"""A local run's first deployment: the plan on this run's hosts as routing version 1.

COLA's PEs split up to Aeolus' count within the hosts' room, as the operator deploys
(planner/deployment.py), or ``--executors N`` round-robin; local executors count against the room with
their measured footprint (:data:`~streamtopo.local.platform.EXECUTOR_FOOTPRINT`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from streamtopo.contracts import ExecutorEntry, RoutingTable, executor_name, unit_key
from streamtopo.controller.reconcile import adaptation_config
from streamtopo.local.platform import EXECUTOR_FOOTPRINT
from streamtopo.planner.capacity import Shortfall, free_cores, place, placeable
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.deployment import deployment
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.placement.fusion import plan_topology
from streamtopo.planner.plan import Plan
from streamtopo.planner.scaling.aeolus import entry_batch_sizes


class Start(NamedTuple):
    """A local run's first deployment: routing v1, the plan it came from (None for ``--executors N``)
    and the declared rates against the machine's room (None for ``--executors N``)."""

    routing: RoutingTable
    plan: Plan | None
    capacity: Shortfall | None


class NoRoom(ValueError):
    """``--executors N`` asks for more executors than the hosts have room for."""


LOCAL_EXECUTOR_CPU = 1.0
"""Cores a local executor requests: it runs Spark with one core (STREAMTOPO_SPARK_CORES=1)."""


def initial_routing(
    topology: StreamTopology,
    cluster: Cluster,
    executors: int | None,
    seed: int = 0,
    room: Mapping[str, float] | None = None,
) -> Start:
    """Version 1 of the routing table: COLA's PEs as executors, split up to Aeolus' count as the operator
    does (``planner.deployment``), or units round-robin over ``executors``; with the plan it came from
    (None for round-robin), which the run shows before it starts.

    Every local executor requests one core (:data:`LOCAL_EXECUTOR_CPU`) and is counted against the hosts'
    ``room`` (default: all of ``cluster``) with its measured footprint (:data:`EXECUTOR_FOOTPRINT`),
    which caps how many the plan starts, as the operator's plan is capped by its nodes';
    ``--executors N`` beyond the room raises :class:`NoRoom` naming the option.
    Round-robin puts unit (op, kg) on executor ``kg mod N``: units with the same key group index share an
    executor, so one-to-one edges stay in memory. HA replicas r >= 1 are not run by the local runtime (the
    primary is).
    """
    spec, name = topology.spec, topology.metadata.name
    room = dict(room) if room is not None else free_cores(cluster)
    plan = capacity = None
    if executors is None:
        plan = plan_topology(spec, cluster, seed=seed)
        scaling = adaptation_config(topology).scaling_config
        planned = deployment(
            plan,
            spec,
            name,
            scaling,
            replicas=False,
            cpu=LOCAL_EXECUTOR_CPU,
            room=room,
            footprint=EXECUTOR_FOOTPRINT,
        )
        assignment, entries, capacity = planned.units, planned.executors, planned.capacity
    else:
        names = [executor_name(name, i) for i in range(executors)]
        hosts, _ = place([LOCAL_EXECUTOR_CPU] * executors, room)
        if None in hosts:
            fit = placeable(LOCAL_EXECUTOR_CPU, room)
            raise NoRoom(
                f"--executors {executors}: the hosts have room for {fit} executor(s) of "
                f"{LOCAL_EXECUTOR_CPU:g} core ({_room_text(cluster, room)}); give fewer executors, or model "
                "a larger cluster with --hosts/--host-cpu"
            )
        entries = {n: ExecutorEntry(host=h, cpu=LOCAL_EXECUTOR_CPU) for n, h in zip(names, hosts)}
        assignment = {
            (op.name, kg): names[kg % executors]
            for op in spec.operators
            for kg in range(spec.key_groups_of(op.name))
        }
    used = set(assignment.values())
    routing = RoutingTable(
        topology=name,
        version=1,
        executors={n: e for n, e in entries.items() if n in used},
        units={unit_key(u): e for u, e in sorted(assignment.items())},
        batch_sizes=entry_batch_sizes(topology.spec),
    )
    return Start(routing, plan, capacity)


def _room_text(cluster: Cluster, room: Mapping[str, float]) -> str:
    return ", ".join(f"{h.name}: {room.get(h.name, 0.0):g} of {h.cpu:g} cores free" for h in cluster.hosts)
