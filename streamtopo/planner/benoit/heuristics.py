"""The six heuristics and four processor-selection strategies of Benoit et al. (RR-6864, Section 5).

Every heuristic visits the nodes of all applications in its own order and, for each node not yet served,
tries (in the paper's order) to reuse an instance of the same operator, to join a relative's processor,
or to open a processor chosen by the strategy; if that fails too, the heuristic fails (the paper does not
backtrack). Reuse (Fig. 2) means the node is served by the existing instance: the node goes where the
operator already runs, and its whole sub-tree is served by the instances of the same operators, which now
run at the highest rate any of their consumers needs. Nodes of a reused sub-tree whose operator has no
instance yet *follow* it: they are placed with the first node of their operator that gets placed.

Reading of the paper where the text is short (recorded in docs/sharing.md):
- H1 RandomNoReuse computes nothing once for two applications (operators are keyed by application in
  :class:`~.problem.Usage`), so it is the "no reuse" the experiments compare against; Section 6.2's
  "heuristics without reuse of common subtrees" (Figures 3(b), 5(b)) are H3-H6 run the same way
  (``reuse=False``): their order and relatives, no reuse step, nothing shared;
- H5/H6 visit the reversed BFS order and the DFS post-order of the forest under an artificial root; H6's
  "go up to the last node that is mapped elsewhere" falls out of reusing at every level of a common
  sub-tree, since a node can reuse only when its placed descendants are those of the instance;
- a blocking strategy opens only processors no operator uses yet (relatives and reuse may still join a
  used one); a non-blocking one may pick any processor;
- reuse across processors pays the crossing (:mod:`.problem`, ``crossing``) at both ends: a node reuses
  an instance placed away from its placed consumers only when the crossing costs no more operations than
  computing its sub-tree again, else it is placed as a node without an instance (zero crossing, the
  paper's instances, always reuses);
- the strategy ranks the processors it may open and the node goes to the first that can take it; the
  heuristic fails only when none can. (Taking only the top-ranked one fails strategy 4 on every instance:
  its processors with the most card left are those whose operators talk only to each other, which fill
  up on compute while their card stays free.)
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from streamtopo.planner.benoit.problem import NodeRef, Objective, Problem, Usage

Heuristic = Literal["random-no-reuse", "random", "topdown-bfs", "topdown-dfs", "bottomup-bfs", "bottomup-dfs"]
HEURISTICS: dict[Heuristic, str] = {
    "random-no-reuse": "H1 RandomNoReuse",
    "random": "H2 Random",
    "topdown-bfs": "H3 TopDownBFS",
    "topdown-dfs": "H4 TopDownDFS",
    "bottomup-bfs": "H5 BottomUpBFS",
    "bottomup-dfs": "H6 BottomUpDFS",
}
STRATEGIES = {
    1: "fastest processor (blocking)",
    2: "biggest network card (blocking)",
    3: "fastest remaining processor",
    4: "biggest remaining network card",
}
DEFAULT_HEURISTIC: Heuristic = "topdown-bfs"
DEFAULT_STRATEGY = 3
"""Section 6.2.6: TopDownBFS with strategy 3 'proves to be a solid combination'."""


@dataclass(frozen=True)
class HeuristicResult:
    heuristic: Heuristic
    strategy: int
    usage: Usage
    failure: str | None
    """None when every node is placed; else which node could not be and the constraint that stopped it."""

    @property
    def feasible(self) -> bool:
        return self.failure is None

    def cost(self, objective: Objective = "proc-power") -> float:
        return self.usage.cost(objective) if self.feasible else float("inf")


def place_heuristic(
    problem: Problem,
    heuristic: Heuristic = DEFAULT_HEURISTIC,
    strategy: int = DEFAULT_STRATEGY,
    seed: int = 0,
    reuse: bool = True,
) -> HeuristicResult:
    """Run one heuristic with one strategy; ``seed`` drives H1 and H2's random order only. ``reuse=False``
    is the heuristic without reuse of common sub-trees (H1 never reuses)."""
    if heuristic not in HEURISTICS:
        raise ValueError(f"unknown heuristic {heuristic!r}; use one of {', '.join(HEURISTICS)}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use 1, 2, 3 or 4")
    mapper = _Mapper(problem, heuristic, strategy, reuse and heuristic != "random-no-reuse")
    failure = mapper.run(seed)
    return HeuristicResult(heuristic, strategy, mapper.usage, failure)


class _Mapper:
    def __init__(self, problem: Problem, heuristic: Heuristic, strategy: int, reuse: bool) -> None:
        self.problem, self.heuristic, self.strategy, self.reuse = problem, heuristic, strategy, reuse
        self.usage = Usage(problem, share=self.reuse)
        self.apps = {a.name: a for a in problem.applications}
        self.parents = {a.name: a.parents() for a in problem.applications}
        self.instance: dict[str, str] = {}
        """Operator -> the processor of its first instance (the one reuse links to)."""
        self.followers: dict[str, list[NodeRef]] = {}
        """Operator -> nodes of reused sub-trees waiting for the operator's first instance."""
        self.served: set[NodeRef] = set()

    # -- orders (Section 5: random, or BFS / DFS of the forest under an artificial root) --------------------

    def order(self, seed: int) -> list[NodeRef]:
        if self.heuristic in ("random-no-reuse", "random"):
            refs = [(a.name, n.name) for a, n in self.problem.nodes()]
            random.Random(seed).shuffle(refs)
            return refs
        if self.heuristic.endswith("bfs"):
            refs = list(self._bfs())
        else:
            refs = list(self._dfs(post=self.heuristic.startswith("bottomup")))
        return refs[::-1] if self.heuristic == "bottomup-bfs" else refs

    def _bfs(self) -> Iterator[NodeRef]:
        queue = deque((a.name, r) for a in self.problem.applications for r in a.roots())
        seen = set(queue)
        while queue:
            ref = queue.popleft()
            yield ref
            for child in self.apps[ref[0]].node(ref[1]).children:
                if (ref[0], child) not in seen:
                    seen.add((ref[0], child))
                    queue.append((ref[0], child))

    def _dfs(self, *, post: bool) -> Iterator[NodeRef]:
        seen: set[NodeRef] = set()

        def visit(ref: NodeRef) -> Iterator[NodeRef]:
            seen.add(ref)
            if not post:
                yield ref
            for child in self.apps[ref[0]].node(ref[1]).children:
                if (ref[0], child) not in seen:
                    yield from visit((ref[0], child))
            if post:
                yield ref

        for app in self.problem.applications:
            for root in app.roots():
                yield from visit((app.name, root))

    # -- the per-node rules ---------------------------------------------------------------------------------

    def run(self, seed: int) -> str | None:
        for ref in self.order(seed):
            if ref in self.served:
                continue
            if not self.map_node(ref):
                return f"{ref[0]}/{ref[1]}: {self.usage.refusal or 'no processor left to open'}"
        for ref in [r for r in self.served if r not in self.usage.placement]:
            # followers whose operator never got its own instance (a cycle of reuses): place them now
            if not self.open(ref):
                return f"{ref[0]}/{ref[1]}: {self.usage.refusal or 'no processor left to open'}"
        return None

    def map_node(self, ref: NodeRef) -> bool:
        operator = self.apps[ref[0]].node(ref[1]).operator
        if self.reuse and operator in self.instance and self.crossing_pays(ref) and self.link(ref):
            return True
        relatives = self.relatives(ref)
        return any(self.put(ref, u) for u in relatives) or self.open(ref)

    def crossing_pays(self, ref: NodeRef) -> bool:
        """Whether serving ``ref`` from its operator's instance costs no more operations per second than
        computing its sub-tree again: the result crosses to each processor of ``ref``'s placed consumers
        that is not the instance's, against the work of every operator of the sub-tree at ``ref``'s rates."""
        app, problem = self.apps[ref[0]], self.problem
        node = app.node(ref[1])
        target = self.instance[node.operator]
        consumers = {self.usage.placement.get((ref[0], p)) for p in self.parents[ref[0]][ref[1]]}
        away = len(consumers - {None, target})
        if not away:
            return True
        operator = problem.operators[node.operator]
        crossing = away * app.rate(node) * operator.output * operator.crossing
        work, stack, seen = 0.0, [node.name], set()
        while stack:
            name = stack.pop()
            current = app.node(name)
            if current.operator not in seen:
                seen.add(current.operator)
                work += app.rate(current) * problem.operators[current.operator].work
                stack.extend(current.children)
        return crossing <= work

    def relatives(self, ref: NodeRef) -> list[str]:
        """Processors to try before a new one: the father's (top-down, random), the children's
        (bottom-up, random), in the order the nodes are listed."""
        app = self.apps[ref[0]]
        parents = [self.usage.placement.get((ref[0], p)) for p in self.parents[ref[0]][ref[1]]]
        children = [self.usage.placement.get((ref[0], c)) for c in app.node(ref[1]).children]
        if self.heuristic.startswith("topdown"):
            candidates = parents
        elif self.heuristic.startswith("bottomup"):
            candidates = children
        else:
            candidates = parents + children
        return list(dict.fromkeys(u for u in candidates if u is not None))

    def open(self, ref: NodeRef) -> bool:
        return any(self.put(ref, u) for u in self.ranked())

    def ranked(self) -> list[str]:
        """Processors the strategy may open, best first (Section 5, 'Processor Allocation Strategies')."""
        processors = self.problem.platform.processors
        if self.strategy in (1, 2):  # blocking: only processors no operator has been given yet
            free = [p for p in processors if p.name not in self.usage.used]
            return [p.name for p in sorted(free, key=lambda p: -(p.speed if self.strategy == 1 else p.card))]
        score = self.usage.remaining_speed if self.strategy == 3 else self.usage.remaining_card
        return sorted((p.name for p in processors), key=lambda u: -score(u))

    def put(self, ref: NodeRef, u: str) -> bool:
        """Place a node on u with the reused nodes that wait for its operator."""
        operator = self.apps[ref[0]].node(ref[1]).operator
        waiting = self.followers.get(operator, []) if operator not in self.instance else []
        if not self.usage.place({ref: u, **{f: u for f in waiting}}):
            return False
        self.served.add(ref)
        if operator not in self.instance and self.reuse:
            self.instance[operator] = u
            self.followers.pop(operator, None)
        return True

    def link(self, ref: NodeRef) -> bool:
        """Reuse (Fig. 2): serve ``ref`` and its sub-tree from the instances of the same operators."""
        app = self.apps[ref[0]]
        assignments: dict[NodeRef, str] = {}
        waiting: list[tuple[str, NodeRef]] = []
        stack = [ref]
        while stack:
            node_ref = stack.pop()
            if node_ref in assignments or any(node_ref == w for _, w in waiting):
                continue
            operator = app.node(node_ref[1]).operator
            placed = self.usage.placement.get(node_ref)
            target = self.instance.get(operator)
            if placed is not None:
                if placed != target:
                    return False  # placed on its own already: this sub-tree is not the instance's
                continue
            if node_ref in self.served:
                continue  # already following an instance
            if target is None:
                waiting.append((operator, node_ref))
            else:
                assignments[node_ref] = target
            stack.extend((ref[0], c) for c in app.node(node_ref[1]).children)
        if not self.usage.place(assignments):
            return False
        self.served.update(assignments)
        for operator, node_ref in waiting:
            self.followers.setdefault(operator, []).append(node_ref)
            self.served.add(node_ref)
        return True
