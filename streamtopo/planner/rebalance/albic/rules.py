"""PlacementRules on a key-group -> executor assignment: units that must move together and violations.

The MILP encodes these rules as constraints; the heuristic baselines (Flux, PoTC, C-MR) use
:func:`move_allowed` to refuse moves that would add a violation, and every policy reports the
violations of its answer in ``Rebalance.details["violations"]``.
A host-level rule needs the executor's host; an executor without a host counts as its own host
(``executor:<name>``), which is the conservative reading (host co-location then means same executor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState


def host_of(state: AllocationState) -> dict[str, str]:
    """Executor name -> host name (``executor:<name>`` when unknown)."""
    return {e.name: e.host if e.host is not None else f"executor:{e.name}" for e in state.executors}


def colocation_units(state: AllocationState) -> list[list[KeyGroupId]]:
    """Key groups tied by PE co-location (same index of co-located operators), as union-find classes.

    Every key group is in exactly one unit; most units are singletons. Units keep the order of
    ``state.key_groups`` so results are deterministic.
    """
    parent: dict[KeyGroupId, KeyGroupId] = {kg.id: kg.id for kg in state.key_groups}

    def find(x: KeyGroupId) -> KeyGroupId:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in state.rules.pe_colocation:
        for kg in state.key_groups:
            op, j = kg.id
            if op == a and (b, j) in parent:
                parent[find((b, j))] = find(kg.id)
    classes: dict[KeyGroupId, list[KeyGroupId]] = {}
    for kg in state.key_groups:
        classes.setdefault(find(kg.id), []).append(kg.id)
    return list(classes.values())


def rule_operators(state: AllocationState) -> set[str]:
    """Every operator some PlacementRule names."""
    r = state.rules
    ops = {
        o
        for pair in (*r.pe_colocation, *r.pe_exlocation, *r.host_colocation, *r.host_exlocation)
        for o in pair
    }
    ops |= set(r.allowed_hosts)
    ops |= {o for group in r.ha_groups for replica in group for o in replica}
    return ops


def rule_violations(
    state: AllocationState, assignment: Mapping[KeyGroupId, str], operators: Iterable[str] | None = None
) -> set[str]:
    """Every PlacementRules violation of ``assignment`` (restricted to rules naming ``operators``)."""
    r = state.rules
    only = None if operators is None else set(operators)
    hosts = host_of(state)
    by_op: dict[str, dict[int, str]] = {}
    for kg_id, ex in assignment.items():
        by_op.setdefault(kg_id[0], {})[kg_id[1]] = ex

    def wanted(*ops: str) -> bool:
        return only is None or bool(only.intersection(ops))

    out: set[str] = set()
    for kind, pairs, level in (
        ("pe_colocation", r.pe_colocation, None),
        ("host_colocation", r.host_colocation, hosts),
    ):
        for a, b in pairs:
            if not wanted(a, b):
                continue
            for j, ex in by_op.get(a, {}).items():
                other = by_op.get(b, {}).get(j)
                if other is not None and (ex != other if level is None else level[ex] != level[other]):
                    out.add(f"{kind} {a}/{b}: key group {j} apart")
    for kind, pairs, level in (
        ("pe_exlocation", r.pe_exlocation, None),
        ("host_exlocation", r.host_exlocation, hosts),
    ):
        for a, b in pairs:
            if not wanted(a, b):
                continue
            place = (lambda ex: ex) if level is None else level.__getitem__
            shared = {place(e) for e in by_op.get(a, {}).values()} & {
                place(e) for e in by_op.get(b, {}).values()
            }
            for where in sorted(shared):
                out.add(f"{kind} {a}/{b}: both on {where}")
    for op, allowed in r.allowed_hosts.items():
        if wanted(op):
            for j, ex in by_op.get(op, {}).items():
                if hosts[ex] not in allowed:
                    out.add(f"allowed_hosts {op}: key group {j} on host {hosts[ex]}")
    known_host = {e.name for e in state.executors if e.host is not None}
    for g, group in enumerate(r.ha_groups):
        if not wanted(*(o for replica in group for o in replica)):
            continue
        places = [{ex for o in replica for ex in by_op.get(o, {}).values()} for replica in group]
        for x in range(len(places)):
            for y in range(x + 1, len(places)):
                for ex in sorted(places[x] & places[y]):
                    out.add(f"ha_groups[{g}]: replicas {x} and {y} share executor {ex}")
                hx = {hosts[e] for e in places[x] & known_host}
                hy = {hosts[e] for e in places[y] & known_host}
                for h in sorted(hx & hy):
                    out.add(f"ha_groups[{g}]: replicas {x} and {y} share host {h}")
    return out


def move_allowed(
    state: AllocationState, assignment: dict[KeyGroupId, str], unit: list[KeyGroupId], dest: str
) -> bool:
    """True when moving ``unit`` to ``dest`` adds no rule violation (checks only the rules it touches)."""
    ops = {kg[0] for kg in unit}
    if not ops & rule_operators(state):
        return True
    before = rule_violations(state, assignment, ops)
    old = {kg: assignment[kg] for kg in unit}
    assignment.update({kg: dest for kg in unit})
    after = rule_violations(state, assignment, ops)
    assignment.update(old)
    return after <= before
