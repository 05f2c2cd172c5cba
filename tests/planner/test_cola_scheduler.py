"""COLA's PE schedulers against brute force: the IP (3)-(8) is exact, LPT within its bound."""

from __future__ import annotations

from cola_reference import min_max_utilization
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.placement.cola.ip_scheduler import ip_schedule
from streamtopo.planner.placement.cola.placement import PlacementProblem
from streamtopo.planner.placement.cola.scheduler import constrained_lpt, schedule
from streamtopo.planner.placement.lpt import lpt_schedule

sizes_st = st.lists(st.floats(0.05, 3.0), min_size=1, max_size=6)


@st.composite
def problems(draw, constrained: bool):
    sizes = draw(sizes_st)
    hosts = draw(st.integers(1, 3))
    capacity = {f"h{i}": draw(st.sampled_from([1.0, 2.0, 3.0])) for i in range(hosts)}
    names = sorted(capacity)
    allowed, colocated, exlocated = [None] * len(sizes), [], []
    if constrained:
        allowed = [
            draw(st.one_of(st.none(), st.frozensets(st.sampled_from(names), min_size=1))) for _ in sizes
        ]
        pes = list(range(len(sizes)))
        if len(sizes) >= 2 and draw(st.booleans()):
            colocated = [sorted(draw(st.sets(st.sampled_from(pes), min_size=2, max_size=3)))]
        for _ in range(draw(st.integers(0, 2))):
            p, q = draw(st.sampled_from(pes)), draw(st.sampled_from(pes))
            if p != q:
                exlocated.append((frozenset({p}), frozenset({q})))
    return PlacementProblem(
        sizes=sizes, capacity=capacity, allowed=allowed, colocated=colocated, exlocated=exlocated
    )


@settings(max_examples=40, deadline=None)
@given(problems(constrained=True))
def test_ip_equals_brute_force_optimum(problem):
    hosts, proven = ip_schedule(problem, time_limit=10.0, gap=0.0)
    best = min_max_utilization(
        problem.sizes,
        dict(problem.capacity),
        problem.allowed,
        problem.colocated,
        [(tuple(a), tuple(b)) for a, b in problem.exlocated],
    )
    if best is None:
        assert hosts is None and proven
        return
    assert hosts is not None and proven
    # The IP scales sizes to integers (1e-6 of a host per PE): equal to the optimum up to that.
    assert abs(problem.utilization(hosts) - best) <= 1e-5 * max(1.0, best)


@settings(max_examples=40, deadline=None)
@given(sizes_st, st.integers(1, 3))
def test_lpt_within_graham_bound_on_identical_hosts(sizes, count):
    capacity = {f"h{i}": 1.0 for i in range(count)}
    hosts = lpt_schedule(sizes, capacity)
    problem = PlacementProblem(sizes=sizes, capacity=capacity, allowed=[None] * len(sizes))
    best = min_max_utilization(sizes, capacity)
    # Graham (1969): LPT <= (4/3 - 1/(3m)) OPT on m identical machines.
    assert problem.utilization(hosts) <= (4 / 3 - 1 / (3 * count)) * best + 1e-9
    assert constrained_lpt(problem) == hosts  # the adapted LPT is LPT when nothing constrains it


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.05, 3.0), min_size=1, max_size=3), st.integers(3, 4))
def test_lpt_optimal_when_every_pe_gets_its_own_host(sizes, count):
    """With no more PEs than identical hosts the optimum is the largest PE alone; LPT finds it."""
    capacity = {f"h{i}": 2.0 for i in range(count)}
    hosts = lpt_schedule(sizes, capacity)
    problem = PlacementProblem(sizes=sizes, capacity=capacity, allowed=[None] * len(sizes))
    assert problem.utilization(hosts) == min_max_utilization(sizes, capacity) == max(sizes) / 2.0


@settings(max_examples=30, deadline=None)
@given(problems(constrained=True))
def test_constrained_lpt_answers_are_valid(problem):
    hosts = constrained_lpt(problem)
    if hosts is None:
        return
    for p, h in enumerate(hosts):
        assert problem.allowed[p] is None or h in problem.allowed[p]
    for cls in problem.colocated:
        assert len({hosts[p] for p in cls}) == 1
    for a, b in problem.exlocated:
        assert not {hosts[p] for p in a} & {hosts[q] for q in b}


@settings(max_examples=25, deadline=None)
@given(problems(constrained=True))
def test_auto_scheduler_finds_a_schedule_whenever_one_exists(problem):
    found = schedule(problem, "auto", ip_max_pes=48, time_limit=10.0)
    best = min_max_utilization(
        problem.sizes,
        dict(problem.capacity),
        problem.allowed,
        problem.colocated,
        [(tuple(a), tuple(b)) for a, b in problem.exlocated],
    )
    assert (found is None) == (best is None)
    if found is not None:
        assert found.utilization >= best - 1e-9
