"""Benoit et al.'s model, heuristics and integer program, against hand-computed instances and each other."""

from __future__ import annotations

import pytest

from streamtopo.planner.benoit.heuristics import HEURISTICS, place_heuristic
from streamtopo.planner.benoit.ilp import solve_ilp
from streamtopo.planner.benoit.instances import InstanceParams, random_problem, similar_pair
from streamtopo.planner.benoit.problem import (
    Application,
    BasicObject,
    Node,
    Operator,
    Platform,
    Problem,
    Processor,
    evaluate,
)

MB = 1e6


def _two_apps(shared_rate: float = 2.0) -> Problem:
    """Two applications whose left sub-tree (a <- b, b downloads ob1) is the same; roots differ.

    app1: r1(a(b)), rho 1; app2: r2(a(b)), rho ``shared_rate``. ob1 (10 MB) is held by P1 only;
    ob2 (4 MB) by nobody (external), read by r2.
    """
    ops = {
        "a": Operator("a", work=100.0, output=3.0),
        "b": Operator("b", work=50.0, output=5.0),
        "r1": Operator("r1", work=10.0, output=0.0),
        "r2": Operator("r2", work=20.0, output=0.0),
    }
    objects = {"ob1": BasicObject("ob1", 10 * MB, frozenset({"P1"})), "ob2": BasicObject("ob2", 4 * MB)}
    app1 = Application(
        "app1", (Node("root", "r1", ("x",)), Node("x", "a", ("y",)), Node("y", "b", (), ("ob1",))), rho=1.0
    )
    app2 = Application(
        "app2",
        (Node("root", "r2", ("x",), ("ob2",)), Node("x", "a", ("y",)), Node("y", "b", (), ("ob1",))),
        rho=shared_rate,
    )
    platform = Platform(
        (
            Processor("P1", 1000.0, 100 * MB),
            Processor("P2", 500.0, 100 * MB),
            Processor("P3", 500.0, 100 * MB),
        ),
        link=100 * MB,
        links={frozenset(("P1", "P2")): 8.0},
    )
    return Problem((app1, app2), ops, objects, platform)


def test_shared_operators_are_computed_once_at_the_highest_rate_and_results_cross_once() -> None:
    problem = _two_apps(shared_rate=2.0)
    assert problem.check() == []
    placement = {
        ("app1", "root"): "P2",
        ("app1", "x"): "P1",
        ("app1", "y"): "P1",
        ("app2", "root"): "P2",
        ("app2", "x"): "P1",
        ("app2", "y"): "P1",
    }
    usage = evaluate(problem, placement)
    # (1) P1 computes a and b once, at app2's rate 2: (2 * 100 + 2 * 50) / 1000
    assert usage.cpu["P1"] == pytest.approx(0.3)
    # P2 computes both roots (different operators): (1 * 10 + 2 * 20) / 500
    assert usage.cpu["P2"] == pytest.approx(0.1)
    # a's result crosses P1 -> P2 once, at the highest rate: 2 * 3 bytes/s; ob1 is local to P1 (free);
    # ob2 is external: only P2's card carries it, at rho 2 (its default frequency) x 4 MB
    assert usage.link[frozenset(("P1", "P2"))] == pytest.approx(6.0)
    assert usage.card["P1"] == pytest.approx(6.0)
    assert usage.card["P2"] == pytest.approx(6.0 + 8 * MB)
    assert usage.violations() == []
    assert usage.cost("proc-nb") == 2 and usage.cost("proc-power") == 1500.0
    assert usage.cost("bw-sum") == pytest.approx(6.0)
    assert usage.cost("bw-max") == pytest.approx(6.0 / 8.0)


def test_without_sharing_each_application_computes_its_own_copy() -> None:
    problem = _two_apps(shared_rate=2.0)
    placement = {ref: "P1" for ref in [("app1", "x"), ("app1", "y"), ("app2", "x"), ("app2", "y")]}
    placement |= {("app1", "root"): "P1", ("app2", "root"): "P1"}
    shared, alone = evaluate(problem, placement), evaluate(problem, placement, share=False)
    assert shared.cpu["P1"] == pytest.approx((2 * 100 + 2 * 50 + 10 + 2 * 20) / 1000)
    assert alone.cpu["P1"] == pytest.approx((1 * 150 + 2 * 150 + 10 + 2 * 20) / 1000)


def test_every_broken_constraint_is_named() -> None:
    problem = _two_apps(shared_rate=2.0)
    # a on P2 and b on P1: b's result (2 * 5 bytes/s) crosses the 8 bytes/s link P1-P2; P3 cannot compute a
    over_link = evaluate(
        problem,
        {
            ("app1", "root"): "P2",
            ("app1", "x"): "P2",
            ("app1", "y"): "P1",
            ("app2", "root"): "P2",
            ("app2", "x"): "P2",
            ("app2", "y"): "P1",
        },
    )
    assert over_link.violations() == ["link (4) P1-P2: 10 > bw=8 bytes/s"]
    heavy = _two_apps(shared_rate=10.0)
    on_p3 = evaluate(
        heavy,
        {
            ref: "P3"
            for ref in [
                ("app1", "root"),
                ("app1", "x"),
                ("app1", "y"),
                ("app2", "root"),
                ("app2", "x"),
                ("app2", "y"),
            ]
        },
    )
    problems = on_p3.violations()
    assert any(p.startswith("compute (1) on P3") for p in problems)
    assert any(p.startswith("network card (3) of P3") for p in problems)  # 10 MB x 10/s of ob1 + 40 MB/s ob2


def test_heuristics_place_every_node_once_and_respect_every_constraint() -> None:
    params = InstanceParams(processors=25)
    for seed in range(6):
        problem = random_problem(params, seed)
        assert problem.check() == []
        nodes = {(a.name, n.name) for a, n in problem.nodes()}
        for heuristic in HEURISTICS:
            for strategy in (1, 2, 3, 4):
                result = place_heuristic(problem, heuristic, strategy, seed)
                if result.feasible:
                    assert set(result.usage.placement) == nodes
                    assert (
                        evaluate(
                            problem,
                            result.usage.placement,
                            share=result.usage.share,
                            servers=result.usage.servers,
                        ).violations()
                        == []
                    )
                else:
                    assert result.failure and ":" in result.failure


def test_reuse_serves_a_shared_sub_tree_from_one_instance() -> None:
    problem = _two_apps(shared_rate=2.0)
    result = place_heuristic(problem, "topdown-bfs", 3)
    assert result.feasible
    placement = result.usage.placement
    assert placement[("app1", "x")] == placement[("app2", "x")]
    assert placement[("app1", "y")] == placement[("app2", "y")]


def test_top_down_bfs_succeeds_at_least_as_often_as_random_no_reuse() -> None:
    """Section 6.2.1: without reuse, heuristics need far more processors (here 20 processors, 5 applications)."""
    params = InstanceParams(processors=20)
    wins = {"topdown-bfs": 0, "random-no-reuse": 0}
    for seed in range(30):
        problem = random_problem(params, seed)
        for heuristic in wins:
            wins[heuristic] += place_heuristic(problem, heuristic, 3, seed).feasible
    assert wins["topdown-bfs"] >= wins["random-no-reuse"]
    assert wins["topdown-bfs"] > 0


@pytest.mark.parametrize("objective", ["proc-nb", "bw-max"])
def test_the_ilp_is_never_worse_than_any_heuristic_on_instances_it_solves(objective: str) -> None:
    params = InstanceParams(processors=6, size=6)
    solved = 0
    for seed in range(4):
        problem = similar_pair(params, differ=2, seed=seed)
        results = [
            place_heuristic(problem, h, s, seed)
            for h in HEURISTICS
            if h != "random-no-reuse"
            for s in (1, 2, 3, 4)
        ]
        feasible = [r for r in results if r.feasible]
        best = min(feasible, key=lambda r: r.cost(objective), default=None)  # type: ignore[arg-type]
        ilp = solve_ilp(
            problem,
            objective,
            deterministic_time=10.0,  # type: ignore[arg-type]
            hint=best.usage.placement if best else None,
        )
        if ilp.status != "optimal":
            continue
        solved += 1
        assert ilp.usage is not None and ilp.usage.violations() == []
        for r in feasible:
            assert ilp.cost() <= r.cost(objective) + 1e-9  # type: ignore[arg-type]
    assert solved >= 2


def test_sharing_saves_the_processors_the_hand_computation_says() -> None:
    """Four operators, each 0.6 of a processor, so no two fit on one. app1 = a(b(c)), app2 = d(b(c)):
    shared, b and c are computed once and 4 processors are optimal; without reuse 6 would be needed,
    more than the 5 there are; app1 alone needs 3."""
    ops = {n: Operator(n, work=60.0, output=0.0) for n in ("a", "b", "c", "d")}
    app1 = Application("app1", (Node("a", "a", ("b",)), Node("b", "b", ("c",)), Node("c", "c")))
    app2 = Application("app2", (Node("d", "d", ("b",)), Node("b", "b", ("c",)), Node("c", "c")))
    procs = tuple(Processor(f"P{i}", 100.0, 1e9) for i in range(1, 6))
    problem = Problem((app1, app2), ops, {}, Platform(procs))
    ilp = solve_ilp(problem, "proc-nb", deterministic_time=10.0)
    assert ilp.status == "optimal" and ilp.cost() == 4.0
    assert (
        solve_ilp(Problem((app1,), ops, {}, Platform(procs)), "proc-nb", deterministic_time=10.0).cost()
        == 3.0
    )
    assert place_heuristic(problem, "topdown-bfs", 3).cost("proc-nb") == 4.0
    no_reuse = place_heuristic(problem, "random-no-reuse", 3)
    assert not no_reuse.feasible and "compute (1)" in (no_reuse.failure or "")
    six = Problem((app1, app2), ops, {}, Platform((*procs, Processor("P6", 100.0, 1e9))))
    for heuristic in ("topdown-bfs", "topdown-dfs", "bottomup-bfs", "bottomup-dfs"):
        # Section 6.2's heuristics without reuse: each node computed again, so 5 processors are too few
        assert not place_heuristic(problem, heuristic, 3, reuse=False).feasible, heuristic
        assert place_heuristic(six, heuristic, 3, reuse=False).cost("proc-nb") == 6.0, heuristic
        assert place_heuristic(six, heuristic, 3).cost("proc-nb") == 4.0, heuristic


def test_structural_problems_are_reported() -> None:
    problem = _two_apps()
    broken = Problem(
        (problem.applications[0], Application("app3", (Node("r", "a", ("q",)), Node("q", "r1")))),
        problem.operators,
        problem.objects,
        problem.platform,
    )
    assert broken.check() == [
        "app3/r: operator 'a' appears with different inputs",
        "app3/q: operator 'r1' appears with different inputs",
    ]


def _cheap_shared_prefix(crossing: float) -> Problem:
    """Two applications over one cheap shared operator s (10 operations per record, 1 byte out); their
    roots (60 each) cannot share a processor of speed 100. With ``crossing`` operations per crossing byte,
    s read across processors costs crossing / 2 at each end."""
    ops = {
        "s": Operator("s", work=10.0, output=1.0, crossing=crossing),
        "ra": Operator("ra", work=60.0, output=0.0),
        "rb": Operator("rb", work=60.0, output=0.0),
    }
    apps = tuple(Application(f"app-{r}", (Node("root", r, ("s",)), Node("s", "s"))) for r in ("ra", "rb"))
    return Problem(apps, ops, {}, Platform((Processor("P1", 100.0, 1e9), Processor("P2", 100.0, 1e9))))


def test_a_result_crossing_processors_costs_half_its_crossing_at_each_end() -> None:
    across = {
        ("app-ra", "root"): "P1",
        ("app-ra", "s"): "P1",
        ("app-rb", "root"): "P2",
        ("app-rb", "s"): "P1",
    }
    usage = evaluate(_cheap_shared_prefix(crossing=20.0), across)
    assert usage.cpu["P1"] == pytest.approx((60 + 10 + 20 / 2) / 100)  # ra, s once, sending half
    assert usage.cpu["P2"] == pytest.approx((60 + 20 / 2) / 100)  # rb, receiving half
    assert usage.violations() == []
    dear = evaluate(_cheap_shared_prefix(crossing=70.0), across)
    assert dear.violations() == ["compute (1) on P1: 1.05 x its speed"]


@pytest.mark.parametrize("crossing", [0.0, 5.0, 70.0])
def test_a_shared_operator_is_computed_again_where_crossing_costs_more_than_it(crossing: float) -> None:
    """s costs 10 per record: reused across processors while its crossing costs no more (0, 5), computed on
    both processors once the crossing (70, which also overloads P1) costs more, by the heuristic and the
    integer program alike."""
    problem = _cheap_shared_prefix(crossing)
    heuristic = place_heuristic(problem, "topdown-bfs", 3)
    ilp = solve_ilp(problem, "proc-nb", deterministic_time=10.0)
    assert heuristic.feasible and ilp.status == "optimal" and ilp.usage is not None
    for usage in (heuristic.usage, ilp.usage):
        assert usage.violations() == []
        duplicated = usage.placement[("app-ra", "s")] != usage.placement[("app-rb", "s")]
        assert usage.placement[("app-ra", "root")] != usage.placement[("app-rb", "root")]
        if crossing > 10.0:
            assert duplicated and usage.comm == {}
    reused = heuristic.usage.placement[("app-ra", "s")] == heuristic.usage.placement[("app-rb", "s")]
    assert reused == (crossing <= 10.0)
