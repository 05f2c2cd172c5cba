"""C-MR's latency-model rebalancer (Backman, PhD thesis, Brown 2013, Sec. 4.7.4-4.7.6, Eq. 4.1-4.5).

Hosts here are executors, partitions are key groups, operators are the key groups' operators.
Per operator i, each executor h has a data volume D_{h,i} (records/s of its key groups of i; the load
when no rates are measured), a per-record processing time P_{h,i} and wait times W_{h,i,j}:

    averageLatency(h, i)     = P_{h,i} + sum_j W_{h,i,j} * D_{h,j}                              (4.1)
    expectedLatency(h, i, f) = P_{h,i} + sum_{j != i} W_{h,i,j} * D_{h,j} + W_{h,i,i} * D_{h,i} * f  (4.2)
    f_receiver = (D + d) / D   (4.3)    f_donor = (D - d) / D   (4.4)

A partition of size d moves from donor to receiver only if

    donorL * D_donor + recvrL * D_recvr > donorL' * (D_donor - d) + recvrL' * (D_recvr + d)   (4.5)

with donorL' = expectedLatency(donor, i, (D - d)/D) and recvrL' = expectedLatency(recvr, i, (D + d)/D):
the thesis prints a minus in recvrL' (a slip, see seeds/notes.md); the receiver's load grows, so we use
(4.3). W_{h,i,i} * D * f is evaluated as W_{h,i,i} * (D + d), which also covers an executor with no data
of i yet. Executors are sorted by averageLatency(., i); best pairs with worst, second best with second
worst, and so on; the donor offers its largest partitions first. Operators are balanced one after
another; W stays fixed (linear extrapolation, Sec. 4.7.4) while D follows every transfer.
Executors marked for removal: their partitions are first dealt round-robin to the others (Sec. 4.7.6,
"orphaned workloads"), within the migration bound.

W is measured in C-MR (Sec. 4.7.5). When the caller has no measurement (``CmrConfig.wait`` is None)
we derive it from an M/M/1 queue per executor: utilisation rho_h = sum_j D_{h,j} P_{h,j}, mean queueing
wait Wq_h = rho_h^2 / ((1 - rho_h) * sum_j D_{h,j}), of which op j's records cause the share of work
D_{h,j} P_{h,j} / rho_h, so W_{h,i,j} = rho_h * P_{h,j} / ((1 - rho_h) * sum_j D_{h,j}) for every i.
P_{h,i} = (sum of gLoad/100 of i's key groups / their records per second) / capacity_h.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic.metrics import build_rebalance
from streamtopo.planner.rebalance.albic.moves import MoveBook
from streamtopo.planner.rebalance.albic.state import check_budget, index_state


@dataclass(frozen=True)
class CmrConfig:
    wait: Mapping[tuple[str, str, str], float] | None = None
    """Measured W_{h,i,j}: (executor, operator i, operator j) -> seconds per record of j."""
    max_utilization: float = 0.99
    """rho is clipped here so the derived queue model stays finite on an overloaded executor."""


class _Model:
    """D, P, W of Eq. 4.1-4.2 over executors and operators."""

    def __init__(self, book: MoveBook, config: CmrConfig) -> None:
        ix = book.ix
        self.book = book
        use_rate = bool((ix.rate > 0).all())
        self.size = {kg: float(ix.rate[k] if use_rate else ix.load[k]) for k, kg in enumerate(ix.kg_ids)}
        work: dict[str, float] = defaultdict(float)
        data: dict[str, float] = defaultdict(float)
        for k, kg in enumerate(ix.kg_ids):
            work[kg[0]] += ix.load[k] / 100.0
            data[kg[0]] += self.size[kg]
        self.ops = list(dict.fromkeys(kg[0] for kg in ix.kg_ids))
        self.p_ref = {o: (work[o] / data[o] if data[o] > 0 else 0.0) for o in self.ops}
        self.D: dict[tuple[str, str], float] = defaultdict(float)
        for kg in ix.kg_ids:
            self.D[(book.assignment[kg], kg[0])] += self.size[kg]
        self.W: dict[tuple[str, str, str], float] = {}
        for h in ix.names:
            total = sum(self.D[(h, j)] for j in self.ops)
            rho = min(sum(self.D[(h, j)] * self.P(h, j) for j in self.ops), config.max_utilization)
            for i in self.ops:
                for j in self.ops:
                    measured = None if config.wait is None else config.wait.get((h, i, j))
                    derived = rho * self.P(h, j) / ((1 - rho) * total) if total > 0 else 0.0
                    self.W[(h, i, j)] = measured if measured is not None else derived

    def P(self, h: str, i: str) -> float:
        return self.p_ref[i] / self.book.cap[h]

    def latency(self, h: str, i: str, d_i: float | None = None) -> float:
        """Eq. 4.1, or Eq. 4.2 with W_{h,i,i} * D_{h,i} * f written as W_{h,i,i} * d_i."""
        own = self.D[(h, i)] if d_i is None else d_i
        others = sum(self.W[(h, i, j)] * self.D[(h, j)] for j in self.ops if j != i)
        return self.P(h, i) + others + self.W[(h, i, i)] * own

    def worth_moving(self, donor: str, recvr: str, i: str, d: float) -> bool:
        """Eq. 4.5 (with the receiver's factor (D + d) / D, Eq. 4.3)."""
        dd, dr = self.D[(donor, i)], self.D[(recvr, i)]
        before = self.latency(donor, i) * dd + self.latency(recvr, i) * dr
        after = self.latency(donor, i, dd - d) * (dd - d) + self.latency(recvr, i, dr + d) * (dr + d)
        return before > after + 1e-15


def cmr_rebalance(
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: CmrConfig | None = None,
    seed: int = 0,
) -> Rebalance:
    """One C-MR balancing round over every operator; deterministic, ``seed`` unused."""
    config = config or CmrConfig()
    check_budget(max_migrations, max_migration_cost)
    ix = index_state(state)
    book = MoveBook(state, ix, max_migrations, max_migration_cost)
    model = _Model(book, config)
    active = [n for n in ix.names if n not in book.marked]

    def transfer(kg: KeyGroupId, dest: str) -> bool:
        if not book.can_move([kg], dest):
            return False
        src = book.assignment[kg]
        model.D[(src, kg[0])] -= model.size[kg]
        model.D[(dest, kg[0])] += model.size[kg]
        book.move([kg], dest)
        return True

    orphans = sorted((kg for kg in ix.kg_ids if book.assignment[kg] in book.marked), key=lambda kg: kg)
    for n, kg in enumerate(orphans):
        transfer(kg, active[n % len(active)])
    for i in model.ops:
        ranked = sorted(active, key=lambda h: (model.latency(h, i), h))
        for recvr, donor in zip(ranked, reversed(ranked[len(ranked) // 2 :])):
            if recvr == donor:
                continue
            parts = sorted(
                (kg for kg in ix.kg_ids if kg[0] == i and book.assignment[kg] == donor),
                key=lambda kg: (-model.size[kg], kg),
            )
            for kg in parts:
                if model.worth_moving(donor, recvr, i, model.size[kg]):
                    transfer(kg, recvr)
    return build_rebalance(
        state,
        ix,
        book.assignment,
        details={"orphans": len(orphans)},
        reason=f"cmr: {book.count} migration(s) by the latency model (Eq. 4.1-4.5)",
    )
