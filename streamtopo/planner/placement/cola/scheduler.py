"""COLA's PE scheduler: which host runs each PE.

Basic COLA uses LPT (streamtopo.planner.placement.lpt.lpt_schedule, Section 2.2). Advanced COLA uses the integer
program (3)-(8) (ip_scheduler.py). LPT "can certainly be adapted easily to handle resource matching,
host collocation and host exlocation" (Section 3.3): :func:`constrained_lpt` is that adaptation, used
by the ``auto`` scheduler on large PE counts and as the IP's warm start.
"""

from __future__ import annotations

from streamtopo.planner.placement.cola.ip_scheduler import ip_schedule
from streamtopo.planner.placement.cola.placement import PlacementProblem, Schedule
from streamtopo.planner.placement.lpt import lpt_schedule


def constrained_lpt(problem: PlacementProblem) -> list[str] | None:
    """LPT over host-colocation blocks: biggest block first, onto the allowed, non-conflicting host of
    least resulting utilisation. None when the greedy gets stuck (a valid schedule may still exist)."""
    if not problem.colocated and not problem.exlocated:
        return lpt_schedule(problem.sizes, problem.capacity, problem.allowed)
    in_block = {p for cls in problem.colocated for p in cls}
    blocks = [list(cls) for cls in problem.colocated] + [
        [p] for p in range(problem.count) if p not in in_block
    ]
    conflicts = problem.conflicts()
    load = dict.fromkeys(problem.capacity, 0.0)
    host_of: dict[int, str] = {}
    on_host: dict[str, set[int]] = {h: set() for h in problem.capacity}
    for block in sorted(blocks, key=lambda b: (-sum(problem.sizes[p] for p in b), b[0])):
        size = sum(problem.sizes[p] for p in block)
        enemies = set().union(*(conflicts.get(p, set()) for p in block))
        if enemies & set(block):
            return None
        candidates = [
            h
            for h in problem.capacity
            if all(_may_host(problem.allowed[p], h) for p in block) and not (on_host[h] & enemies)
        ]
        if not candidates:
            return None
        best = min(candidates, key=lambda h: ((load[h] + size) / problem.capacity[h], h))
        load[best] += size
        on_host[best].update(block)
        for p in block:
            host_of[p] = best
    return [host_of[p] for p in range(problem.count)]


def schedule(
    problem: PlacementProblem,
    mode: str,
    ip_max_pes: int,
    time_limit: float,
    seed: int = 0,
    gap: float = 0.0,
    polish: bool = False,
) -> Schedule | None:
    """A valid schedule minimising (IP) or greedily lowering (LPT) the max utilisation, or None.

    ``mode``: "lpt", "ip", or "auto": the IP (warm-started from LPT) when host-level constraints or
    resource matching make the greedy fragile, or when ``polish`` asks for the best placement of a
    final partition; LPT otherwise, and beyond ``ip_max_pes`` PEs unless LPT finds no valid schedule.
    The IP's answer is kept only if it beats LPT's (a time-limited solve can stop above it).
    """
    greedy = constrained_lpt(problem)
    if mode == "ip":
        use_ip = True
    elif mode == "auto":
        use_ip = greedy is None or (problem.count <= ip_max_pes and (polish or problem.constrained))
    else:
        use_ip = False
    if use_ip and greedy is not None and problem.utilization(greedy) <= problem.lower_bound() * (1 + gap):
        use_ip = False  # LPT already meets a lower bound on the optimum: nothing to gain
    if use_ip:
        hosts, _ = ip_schedule(problem, time_limit, seed, hint=greedy, gap=gap)
        if hosts is not None and (greedy is None or problem.utilization(hosts) < problem.utilization(greedy)):
            return Schedule(hosts, problem.utilization(hosts), "ip")
    if greedy is None:
        return None
    return Schedule(greedy, problem.utilization(greedy), "lpt")


def _may_host(allowed: frozenset[str] | None, host: str) -> bool:
    """Resource matching: ``allowed`` None means any host."""
    return allowed is None or host in allowed
