"""The model of Benoit et al. (RR-6864, Section 2) and the evaluator of its constraints.

Symbols (the paper's, restored in shared/seeds/notes.md): operators op_i with work w_i and output size
delta_i; basic objects ob_j of size delta_j, held by some processors and downloaded by application k at
frequency f_j^(k); processors P_u with speed s_u and network card B_u; links bw_{u,v} (a clique, shared
by both directions). Application k needs every node of its tree at rate rho^(k).

Two generalisations, both reducing to the paper when unused: an application is a DAG (a topology may fan
out; the paper's binary trees are the special case) and every node carries its own rate (an operator after
a filter runs slower than the source; the paper's rho^(k) is the case where all nodes of k share one).
Objects no processor holds are *external* (a Valkey stream, a generated feed): downloading one uses the
downloader's card only.

One extension, zero in the paper's instances: a byte that crosses processors costs CPU, ``crossing``
operations per byte of an operator's result or an object, half at each end (the named-stream hop: encode
and XADD at the sender, read and decode at the receiver; Aeolus' n and s, ``CommCostModel``). The paper
charges communication to cards and links only; on streamtopo's hosts a crossing record costs about as much
CPU as a cheap operator, so a shared sub-tree read across processors may cost more than computing it again
next to its consumer. :class:`Usage` adds it to constraint (1), the integer program too, and the
heuristics reuse an instance on another processor only where the crossing costs less than the sub-tree.

Operator identity is sharing: two nodes with the same ``operator`` compute the same thing, so they must
have identical sub-trees (the structural hash of :mod:`.topologies` and the generator of :mod:`.instances`
guarantee it). Several nodes of one operator on one processor are computed once at the maximum rate, and
an operator result or an object crossing a pair of processors crosses it once at the maximum rate
(Section 2.3); :class:`Usage` implements exactly that accounting, so heuristics and checks agree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

Objective = Literal["proc-nb", "proc-power", "bw-sum", "bw-max"]
OBJECTIVES: tuple[Objective, ...] = ("proc-nb", "proc-power", "bw-sum", "bw-max")
EPSILON = 1e-9
"""Relative slack on capacities, so that a load summed in another order does not fail by rounding."""

NodeRef = tuple[str, str]
"""(application, node): one node of one application tree."""
ComputeKey = str | tuple[str, str]
"""What is computed once: an operator (sharing) or an (application, operator) pair (no reuse)."""
_K = TypeVar("_K")


@dataclass(frozen=True)
class Operator:
    """op_i: ``work`` w_i operations per evaluation, ``output`` delta_i bytes per evaluation."""

    name: str
    work: float
    output: float
    crossing: float = 0.0
    """Operations per byte of its result that crosses processors, both ends together (half each)."""


@dataclass(frozen=True)
class BasicObject:
    """ob_j: ``size`` delta_j bytes per download; ``holders`` are the processors that hold a copy."""

    name: str
    size: float
    holders: frozenset[str] = frozenset()
    crossing: float = 0.0
    """Operations per byte downloaded from another processor or from outside, both ends together."""


@dataclass(frozen=True)
class Node:
    """A node of an application: its operator, the nodes it reads (Child) and the objects it downloads (Leaf)."""

    name: str
    operator: str
    children: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    rate: float | None = None
    """Evaluations per second this node needs; None means the application's rho^(k)."""


@dataclass(frozen=True)
class Application:
    """One application: its nodes (any order), its throughput rho^(k) and object frequencies f_j^(k)."""

    name: str
    nodes: tuple[Node, ...]
    rho: float = 1.0
    frequencies: Mapping[str, float] = field(default_factory=dict)
    """f_j^(k) per object; objects not listed are downloaded at rho^(k) (one fresh copy per result)."""

    def node(self, name: str) -> Node:
        return self._index()[name]

    def _index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def parents(self) -> dict[str, list[str]]:
        """Node -> the nodes that read it (its father in the paper's trees)."""
        up: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for c in n.children:
                up[c].append(n.name)
        return up

    def roots(self) -> list[str]:
        return [name for name, ups in self.parents().items() if not ups]

    def rate(self, node: Node) -> float:
        return self.rho if node.rate is None else node.rate

    def frequency(self, obj: str) -> float:
        return self.frequencies.get(obj, self.rho)


@dataclass(frozen=True)
class Processor:
    """P_u: ``speed`` s_u operations per second, ``card`` B_u bytes per second."""

    name: str
    speed: float
    card: float


@dataclass(frozen=True)
class Platform:
    """Processors on a clique; ``links`` maps a pair (either order) to bw_{u,v}, else ``link``."""

    processors: tuple[Processor, ...]
    link: float = float("inf")
    links: Mapping[frozenset[str], float] = field(default_factory=dict)

    def processor(self, name: str) -> Processor:
        return next(p for p in self.processors if p.name == name)

    def bandwidth(self, u: str, v: str) -> float:
        return self.links.get(frozenset((u, v)), self.link)


@dataclass(frozen=True)
class Problem:
    """Applications, the operators and objects they use, and the platform."""

    applications: tuple[Application, ...]
    operators: Mapping[str, Operator]
    objects: Mapping[str, BasicObject]
    platform: Platform

    def nodes(self) -> Iterator[tuple[Application, Node]]:
        for app in self.applications:
            for node in app.nodes:
                yield app, node

    def check(self) -> list[str]:
        """Structural problems: unknown operators or objects, dangling children, cycles, shared operators
        whose sub-trees differ (identity would then not mean the same result)."""
        problems: list[str] = []
        names = [a.name for a in self.applications]
        problems += [f"duplicate application {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
        shape: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for app in self.applications:
            index = app._index()
            for node in app.nodes:
                where = f"{app.name}/{node.name}"
                if node.operator not in self.operators:
                    problems.append(f"{where}: unknown operator {node.operator!r}")
                problems += [f"{where}: unknown object {o!r}" for o in node.objects if o not in self.objects]
                problems += [f"{where}: unknown child {c!r}" for c in node.children if c not in index]
                if any(c not in index for c in node.children):
                    continue
                signature = (
                    tuple(sorted(index[c].operator for c in node.children)),
                    tuple(sorted(node.objects)),
                )
                if shape.setdefault(node.operator, signature) != signature:
                    problems.append(f"{where}: operator {node.operator!r} appears with different inputs")
            if not problems and _has_cycle(app):
                problems.append(f"{app.name}: the application graph has a cycle")
        return problems


def _has_cycle(app: Application) -> bool:
    index, state = app._index(), dict.fromkeys(app._index(), 0)

    def visit(name: str) -> bool:
        state[name] = 1
        for c in index[name].children:
            if state[c] == 1 or (state[c] == 0 and visit(c)):
                return True
        state[name] = 2
        return False

    return any(state[n] == 0 and visit(n) for n in index)


class Usage:
    """Loads of a (partial) mapping under the model's sharing rules, built incrementally.

    ``share`` False keys operators by application too, so nothing is computed once for two applications:
    the no-reuse baseline (H1, ``--no-share``). Objects are still downloaded once per processor, since that
    is the platform's behaviour, not a reuse of results.
    """

    def __init__(self, problem: Problem, *, share: bool = True) -> None:
        self.problem = problem
        self.share = share
        self.placement: dict[NodeRef, str] = {}
        self.servers: dict[tuple[str, str], str | None] = {}
        self._apps = {a.name: a for a in problem.applications}
        self._nodes = {(a.name, n.name): n for a, n in problem.nodes()}
        self._parents = {a.name: a.parents() for a in problem.applications}
        self.compute: dict[tuple[ComputeKey, str], float] = {}
        """(operator key, processor) -> evaluations per second (the max over nodes placed there)."""
        self.comm: dict[tuple[ComputeKey, str, str], float] = {}
        """(operator key, sender, receiver) -> bytes per second."""
        self.downloads: dict[tuple[str, str], float] = {}
        """(object, processor) -> bytes per second."""
        self.cpu: dict[str, float] = defaultdict(float)
        """Fraction of s_u in use (constraint (1)), crossings included."""
        self.card: dict[str, float] = defaultdict(float)
        """Bytes per second through B_u (constraint (3))."""
        self.link: dict[frozenset[str], float] = defaultdict(float)
        """Bytes per second on bw_{u,v} (constraint (4))."""
        self.refusal = ""
        """Why the last refused :meth:`place` was refused (the first constraint it would break)."""

    # -- building -----------------------------------------------------------------------------------------

    def key(self, ref: NodeRef) -> ComputeKey:
        operator = self._nodes[ref].operator
        return operator if self.share else (ref[0], operator)

    def place(self, assignments: Mapping[NodeRef, str]) -> bool:
        """Place these nodes together if every constraint still holds; else change nothing and say so."""
        trial = _Trial(self)
        for ref, u in assignments.items():
            trial.add(ref, u)
        problems = trial.problems()
        if problems:
            self.refusal = problems[0]
            return False
        trial.commit()
        return True

    def remaining_speed(self, u: str) -> float:
        return self.problem.platform.processor(u).speed * (1.0 - self.cpu[u])

    def remaining_card(self, u: str) -> float:
        return self.problem.platform.processor(u).card - self.card[u]

    @property
    def used(self) -> set[str]:
        return set(self.placement.values())

    # -- reading ------------------------------------------------------------------------------------------

    def violations(self) -> list[str]:
        """Constraints (1), (3), (4) that do not hold, in words (empty when the mapping is valid)."""
        out = []
        platform = self.problem.platform
        for p in platform.processors:
            if self.cpu[p.name] > 1 + EPSILON:
                out.append(f"compute (1) on {p.name}: {self.cpu[p.name]:.3g} x its speed")
            if self.card[p.name] > p.card * (1 + EPSILON):
                out.append(f"network card (3) of {p.name}: {self.card[p.name]:.4g} > B={p.card:.4g} bytes/s")
        for pair, used in self.link.items():
            u, v = sorted(pair)
            if used > platform.bandwidth(u, v) * (1 + EPSILON):
                out.append(f"link (4) {u}-{v}: {used:.4g} > bw={platform.bandwidth(u, v):.4g} bytes/s")
        return out

    def cost(self, objective: Objective) -> float:
        """Proc-Nb: processors used; Proc-Power: their summed speed (Section 5 counts compute capacity only);
        BW-Sum: bytes per second on all links; BW-Max: the highest link use as a fraction of bw (Eq. 7-9)."""
        platform = self.problem.platform
        if objective == "proc-nb":
            return float(len(self.used))
        if objective == "proc-power":
            return sum(platform.processor(u).speed for u in self.used)
        if objective == "bw-sum":
            return sum(self.link.values())
        if objective == "bw-max":
            return max(
                (used / platform.bandwidth(*sorted(pair)) for pair, used in self.link.items()), default=0.0
            )
        raise ValueError(f"unknown objective {objective!r}")


class _Trial:
    """Changes to a :class:`Usage` computed aside, checked, then committed (or dropped)."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self.placement: dict[NodeRef, str] = {}
        self.compute: dict[tuple[ComputeKey, str], float] = {}
        self.comm: dict[tuple[ComputeKey, str, str], float] = {}
        self.downloads: dict[tuple[str, str], float] = {}
        self.servers: dict[tuple[str, str], str | None] = {}

    def where(self, ref: NodeRef) -> str | None:
        return self.placement.get(ref) or self.usage.placement.get(ref)

    def add(self, ref: NodeRef, u: str) -> None:
        usage = self.usage
        app, node = usage._apps[ref[0]], usage._nodes[ref]
        self.placement[ref] = u
        rate = app.rate(node)
        key = usage.key(ref)
        self._raise(self.compute, usage.compute, (key, u), rate)
        out = usage.problem.operators[node.operator].output
        for child in node.children:
            v = self.where((ref[0], child))
            if v is not None and v != u:
                child_node = usage._nodes[(ref[0], child)]
                child_out = usage.problem.operators[child_node.operator].output
                self._raise(
                    self.comm,
                    usage.comm,
                    (usage.key((ref[0], child)), v, u),
                    app.rate(child_node) * child_out,
                )
        for parent in usage._parents[ref[0]][node.name]:
            v = self.where((ref[0], parent))
            if v is not None and v != u:
                self._raise(self.comm, usage.comm, (key, u, v), rate * out)
        for obj in node.objects:
            size = usage.problem.objects[obj].size
            self._raise(self.downloads, usage.downloads, (obj, u), size * app.frequency(obj))
            if (obj, u) not in usage.servers and (obj, u) not in self.servers:
                self.servers[(obj, u)] = self._server(obj, u)

    def _server(self, obj: str, u: str) -> str | None:
        """Local copy if u holds the object, else the holder with the most room on its card and link."""
        holders = self.usage.problem.objects[obj].holders
        if u in holders:
            return u
        platform, usage = self.usage.problem.platform, self.usage
        return max(
            sorted(holders),
            default=None,
            key=lambda v: min(
                usage.remaining_card(v), platform.bandwidth(u, v) - usage.link[frozenset((u, v))]
            ),
        )

    @staticmethod
    def _raise(mine: dict[_K, float], theirs: dict[_K, float], key: _K, value: float) -> None:
        current = max(mine.get(key, 0.0), theirs.get(key, 0.0))
        if value > current:
            mine[key] = value

    def deltas(self) -> tuple[dict[str, float], dict[str, float], dict[frozenset[str], float]]:
        usage, platform = self.usage, self.usage.problem.platform
        cpu: dict[str, float] = defaultdict(float)
        card: dict[str, float] = defaultdict(float)
        link: dict[frozenset[str], float] = defaultdict(float)
        for (key, u), rate in self.compute.items():
            operator = key if isinstance(key, str) else key[1]
            work = usage.problem.operators[operator].work
            cpu[u] += (rate - usage.compute.get((key, u), 0.0)) * work / platform.processor(u).speed
        for (key, u, v), rate in self.comm.items():
            extra = rate - usage.comm.get((key, u, v), 0.0)
            crossing = usage.problem.operators[key if isinstance(key, str) else key[1]].crossing
            for end in (u, v):
                card[end] += extra
                cpu[end] += extra * crossing / 2 / platform.processor(end).speed
            link[frozenset((u, v))] += extra
        for (obj, u), rate in self.downloads.items():
            extra = rate - usage.downloads.get((obj, u), 0.0)
            server = self.servers.get((obj, u), usage.servers.get((obj, u)))
            if server == u:
                continue
            crossing = usage.problem.objects[obj].crossing
            for end in (u,) if server is None else (u, server):
                card[end] += extra
                cpu[end] += extra * crossing / 2 / platform.processor(end).speed
            if server is not None:
                link[frozenset((u, server))] += extra
        return cpu, card, link

    def problems(self) -> list[str]:
        """The constraints these changes would break, in words."""
        usage, platform = self.usage, self.usage.problem.platform
        cpu, card, link = self.deltas()
        out = [f"compute (1) on {u}" for u, d in cpu.items() if d > 0 and usage.cpu[u] + d > 1 + EPSILON]
        out += [
            f"network card (3) of {u}"
            for u, d in card.items()
            if d > 0 and usage.card[u] + d > platform.processor(u).card * (1 + EPSILON)
        ]
        out += [
            "link (4) {}-{}".format(*sorted(p))
            for p, d in link.items()
            if d > 0 and usage.link[p] + d > platform.bandwidth(*sorted(p)) * (1 + EPSILON)
        ]
        return out

    def commit(self) -> None:
        usage = self.usage
        cpu, card, link = self.deltas()
        for u, d in cpu.items():
            usage.cpu[u] += d
        for u, d in card.items():
            usage.card[u] += d
        for p, d in link.items():
            usage.link[p] += d
        usage.placement.update(self.placement)
        usage.compute.update(self.compute)
        usage.comm.update(self.comm)
        usage.downloads.update(self.downloads)
        usage.servers.update(self.servers)


def evaluate(
    problem: Problem,
    placement: Mapping[NodeRef, str],
    *,
    share: bool = True,
    servers: Mapping[tuple[str, str], str | None] | None = None,
) -> Usage:
    """The loads of a complete mapping, without refusing anything (read ``violations()`` afterwards)."""
    usage = Usage(problem, share=share)
    trial = _Trial(usage)
    if servers:
        trial.servers.update(servers)
    for ref, u in placement.items():
        trial.add(ref, u)
    trial.commit()
    return usage
