"""Random instances in the spirit of Benoit et al.'s Section 6.1, seeded (pure: no clock, no I/O).

The paper's text lost most numeric ranges and its generator [2] is no longer online, so the values below
are ours where the paper is blank (docs/sharing.md lists which). What the paper fixes is kept: basic
objects of 10 types sized 3-13 MB, heterogeneous processors, cards and links, object types spread over
random processors, and five experiment axes (processors, applications, application size, CCR, similarity).

Sharing comes from how trees are grown: a sub-tree of an earlier application is reused with probability
``reuse`` (the same operators, so the same identities), else a fresh operator is drawn. Experiment 5 builds
a second application from the first by changing ``differ`` operators (each change gives the operator and its
ancestors new identities, since they now compute something else).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from streamtopo.planner.benoit.problem import (
    Application,
    BasicObject,
    Node,
    Operator,
    Platform,
    Problem,
    Processor,
)

MB = 1e6


@dataclass(frozen=True)
class InstanceParams:
    """One point of an experiment. Units: operations, bytes and seconds (MFlop and MB as 1e6)."""

    processors: int = 50
    applications: int = 5
    size: int = 20
    """Operators per application, at most (each tree has between size/2 and size)."""
    object_types: int = 10
    object_size: tuple[float, float] = (3 * MB, 13 * MB)
    work: tuple[float, float] = (200e6, 1500e6)
    output: tuple[float, float] = (1 * MB, 5 * MB)
    rho: tuple[float, float] = (0.5, 1.0)
    frequency: tuple[float, float] = (0.5, 1.0)
    speed: tuple[float, float] = (1000e6, 3000e6)
    card: tuple[float, float] = (50 * MB, 150 * MB)
    link: tuple[float, float] = (20 * MB, 100 * MB)
    holders: tuple[int, int] = (1, 3)
    reuse: float = 0.3
    """Probability that a sub-tree is taken from an earlier application."""

    def with_ccr(self, ccr: float) -> InstanceParams:
        """Output sizes scaled so that mean delta_i (MB) / mean w_i (GFlop) equals ``ccr``."""
        mean_work = sum(self.work) / 2 / 1e9
        mean_out = ccr * mean_work * MB
        return replace(self, output=(mean_out * 0.5, mean_out * 1.5))

    @property
    def ccr(self) -> float:
        return (sum(self.output) / 2 / MB) / (sum(self.work) / 2 / 1e9)


def random_problem(params: InstanceParams, seed: int) -> Problem:
    """A random problem: ``params.applications`` trees over one platform."""
    rng = random.Random(seed)
    platform = _platform(params, rng)
    objects = _objects(params, platform, rng)
    grower = _Grower(params, rng, list(objects))
    apps = tuple(grower.application(f"app{k + 1}") for k in range(params.applications))
    return Problem(apps, grower.operators, objects, platform)


def similar_pair(params: InstanceParams, differ: int, seed: int) -> Problem:
    """Experiment 5: two applications of ``params.size`` operators, the second differing in ``differ``."""
    rng = random.Random(seed)
    platform = _platform(params, rng)
    objects = _objects(params, platform, rng)
    grower = _Grower(replace(params, reuse=0.0), rng, list(objects))
    first = grower.application("app1", exact=True)
    changed = set(rng.sample([n.name for n in first.nodes], min(differ, len(first.nodes))))
    index = {n.name: n for n in first.nodes}
    renamed: dict[str, str] = {}

    def rename(name: str) -> str:  # a node changes if it or a descendant changed
        if name not in renamed:
            node = index[name]
            kids = [rename(c) for c in node.children]
            new = name in changed or any(k != index[c].operator for k, c in zip(kids, node.children))
            renamed[name] = grower.fresh_operator() if new else node.operator
        return renamed[name]

    nodes = tuple(replace(n, operator=rename(n.name)) for n in first.nodes)
    second = Application("app2", nodes, rho=_uniform(rng, params.rho), frequencies=first.frequencies)
    return Problem((first, second), grower.operators, objects, platform)


def _uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(*bounds)


def _platform(params: InstanceParams, rng: random.Random) -> Platform:
    processors = tuple(
        Processor(f"P{u + 1}", _uniform(rng, params.speed), _uniform(rng, params.card))
        for u in range(params.processors)
    )
    links = {
        frozenset((p.name, q.name)): _uniform(rng, params.link)
        for i, p in enumerate(processors)
        for q in processors[i + 1 :]
    }
    return Platform(processors, link=params.link[1], links=links)


def _objects(params: InstanceParams, platform: Platform, rng: random.Random) -> dict[str, BasicObject]:
    names = [p.name for p in platform.processors]
    objects = {}
    for j in range(params.object_types):
        count = min(len(names), rng.randint(*params.holders))
        objects[f"ob{j + 1}"] = BasicObject(
            f"ob{j + 1}", _uniform(rng, params.object_size), frozenset(rng.sample(names, count))
        )
    return objects


_TreeNode = tuple[str, tuple[int, ...], tuple[str, ...]]
"""(operator, indices of its children in the same list, objects it downloads)."""


class _Grower:
    """Grows application trees, reusing whole sub-trees of earlier applications with probability ``reuse``."""

    def __init__(self, params: InstanceParams, rng: random.Random, objects: list[str]) -> None:
        self.params, self.rng, self.objects = params, rng, objects
        self.operators: dict[str, Operator] = {}
        self.subtrees: list[list[_TreeNode]] = []
        """Sub-trees grown so far, each as (operator, child positions, objects) in post-order."""

    def fresh_operator(self) -> str:
        name = f"op{len(self.operators) + 1}"
        self.operators[name] = Operator(
            name, _uniform(self.rng, self.params.work), _uniform(self.rng, self.params.output)
        )
        return name

    def application(self, name: str, *, exact: bool = False) -> Application:
        p = self.params
        size = p.size if exact else self.rng.randint(max(1, p.size // 2), p.size)
        tree = self._tree(size)
        nodes = tuple(
            Node(f"n{i + 1}", op, tuple(f"n{c + 1}" for c in kids), objs)
            for i, (op, kids, objs) in enumerate(tree)
        )
        used = {o for _, _, objs in tree for o in objs}
        frequencies = {o: _uniform(self.rng, p.frequency) for o in sorted(used)}
        return Application(name, nodes, rho=_uniform(self.rng, p.rho), frequencies=frequencies)

    def _tree(self, size: int) -> list[_TreeNode]:
        """A binary tree of ``size`` operators in post-order; leaves download one or two objects."""
        fits = [t for t in self.subtrees if len(t) <= size]
        if fits and self.rng.random() < self.params.reuse:
            tree = list(self.rng.choice(fits))
            if len(tree) == size:
                return tree
            # the reused sub-tree becomes the child of a fresh operator that also reads the rest
            rest = self._tree(size - len(tree) - 1) if size - len(tree) - 1 > 0 else []
            return self._join(tree, rest)
        if size == 1:
            objs = tuple(sorted(self.rng.sample(self.objects, self.rng.randint(1, 2))))
            tree = [(self.fresh_operator(), (), objs)]
            self.subtrees.append(tree)
            return tree
        left = self.rng.randint(1, size - 1)
        right = size - 1 - left
        return self._join(self._tree(left), self._tree(right) if right else [])

    def _join(self, left: list[_TreeNode], right: list[_TreeNode]) -> list[_TreeNode]:
        """A fresh operator over one or two sub-trees (one object download when it has a single child)."""
        shifted = [(op, tuple(c + len(left) for c in kids), objs) for op, kids, objs in right]
        tree = left + shifted
        kids = (len(left) - 1,) + ((len(tree) - 1,) if right else ())
        objs = () if right else (self.rng.choice(self.objects),)
        tree.append((self.fresh_operator(), kids, objs))
        self.subtrees.append(tree)
        return tree
