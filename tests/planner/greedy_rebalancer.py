"""A tiny rebalancer with the REBALANCERS signature, for testing the adaptation loop and the simulator
without depending on a particular policy: repeatedly move the lightest-fitting key group from the most
loaded executor (marked executors first) to the least loaded active one, within the migration bound."""

from __future__ import annotations

from streamtopo.planner.allocation import AllocationState, Rebalance


def greedy_rebalance(
    state: AllocationState, *, max_migrations, max_migration_cost, config, seed=0
) -> Rebalance:
    cap = {e.name: e.capacity for e in state.executors}
    marked = [e.name for e in state.executors if e.marked_for_removal]  # in order: a set's is the hash seed's
    active = [n for n in cap if n not in marked]
    load_of = {kg.id: kg.load for kg in state.key_groups}
    assignment = dict(state.assignment)
    loads = dict.fromkeys(cap, 0.0)
    for kg, ex in assignment.items():
        loads[ex] += load_of[kg] / cap[ex]
    moves = []
    budget = max_migrations if max_migrations is not None else len(assignment)
    while len(moves) < budget:
        donors = [n for n in marked if any(e == n for e in assignment.values())]
        donor = donors[0] if donors else max(active, key=lambda n: loads[n])
        receiver = min(active, key=lambda n: loads[n])
        if receiver == donor:
            break
        gap = loads[donor] - loads[receiver]
        candidates = [kg for kg, e in assignment.items() if e == donor and kg not in {m[0] for m in moves}]
        if not donors:
            candidates = [kg for kg in candidates if load_of[kg] / cap[receiver] < gap]
        if not candidates:
            break
        kg = max(candidates, key=lambda k: load_of[k])
        assignment[kg] = receiver
        loads[donor] -= load_of[kg] / cap[donor]
        loads[receiver] += load_of[kg] / cap[receiver]
        moves.append((kg, donor, receiver))
    total = sum(load_of.values()) / sum(cap[n] for n in active)
    distance = max(abs(loads[n] - total) for n in active)
    return Rebalance(
        assignment=assignment,
        migrations=moves,
        load_distance=distance,
        collocation_factor=0.0,
        reason="greedy",
    )
