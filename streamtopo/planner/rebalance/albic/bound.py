"""A lower bound on the MILP's load distance d under the migration budget (constraint (2)).

The MILP is solved by neighbourhood rounds above a few thousand columns (docs/albic.md), and its LP
relaxation bounds d at about 0, so neither proves how far an answer is from the optimum. This bound does,
from the budget: to bring every node within d of the mean, a node above ``mean + d`` must shed that much
load and a node of A below ``mean - d`` must receive that much, and every migration leaves one node and
arrives at one. The least budget a node needs is a fractional knapsack over the units that could move
(the cheapest per point of load first), so

    budget spent >= max(sum over nodes of the least out-cost, sum over nodes of the least in-cost)

for any allocation with load distance d. The smallest d whose least spend fits the budget is a lower
bound on the optimum of the paper's MILP (and of every allocation a rebalancer may reach in one round:
placement rules, pins and set B's one-way moves only shrink the feasible set). It is found by bisection,
since the least spend falls as d grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BISECTIONS = 60
MIN_GAIN = 1e-9
"""Loads (pp) below this count as zero: they cannot help any node reach a need."""


class _LeastSpend:
    """Per node, the least sum of cost over a fractional selection of its candidate units whose load
    reaches a need (inf where they cannot reach it): the cheapest per point of load first. Counts round
    up, since a node sheds or receives whole key groups."""

    def __init__(self, gain: np.ndarray, cost: np.ndarray, integral: bool) -> None:
        useful = gain > MIN_GAIN  # a denormal load would overflow the ratio; it sheds nothing anyway
        ratio = np.where(useful, cost / np.where(useful, gain, 1.0), np.inf)
        order = np.argsort(ratio, axis=1, kind="stable")
        self.gain = np.take_along_axis(np.where(useful, gain, 0.0), order, axis=1)
        self.cost = np.take_along_axis(np.where(useful, cost, 0.0), order, axis=1)
        self.cum_gain, self.cum_cost = np.cumsum(self.gain, axis=1), np.cumsum(self.cost, axis=1)
        self.integral = integral

    def total(self, need: np.ndarray) -> float:
        """The least spend summed over the nodes with a positive need (one within float noise of zero, which
        no unit's load could meet, needs nothing: 0 / 0 would print numpy's RuntimeWarning to the console)."""
        spent = 0.0
        for row in np.flatnonzero(need > MIN_GAIN):
            k = int(np.searchsorted(self.cum_gain[row], need[row] - 1e-12))
            if k >= self.gain.shape[1]:
                return np.inf
            before_gain = self.cum_gain[row, k - 1] if k else 0.0
            before_cost = self.cum_cost[row, k - 1] if k else 0.0
            spend = before_cost + (need[row] - before_gain) * self.cost[row, k] / self.gain[row, k]
            spent += np.ceil(spend - 1e-9) if self.integral else spend
        return spent


def budget_bound(
    loads: np.ndarray,
    place: np.ndarray,
    marked: np.ndarray,
    mean: float,
    budgets: Sequence[tuple[np.ndarray, float, bool]],
) -> float:
    """The least load distance (pp) any allocation within ``budgets`` can have; 0 without a budget.

    ``loads[i, u]`` is unit u's load on node i in percent of node i (nodes differ in capacity), ``place[u]``
    its node now, ``marked`` set B (no lower bound there), ``budgets`` each (cost per unit, bound,
    integral) for a count or a migration-cost limit.
    """
    if not budgets:
        return 0.0
    n_nodes, n_units = loads.shape
    units = np.arange(n_units)
    node_load = np.bincount(place, weights=loads[place, units], minlength=n_nodes)
    here = place[None, :] == np.arange(n_nodes)[:, None]
    shed_gain = np.where(here, loads, 0.0)  # what leaving node i can take off it
    take_gain = np.where(here, 0.0, loads)  # what arriving at node j can add to it
    active = ~marked

    sides = [
        (
            _LeastSpend(shed_gain, np.broadcast_to(cost, loads.shape), integral),
            _LeastSpend(take_gain, np.broadcast_to(cost, loads.shape), integral),
            bound,
        )
        for cost, bound, integral in budgets
    ]

    def fits(d: float) -> bool:
        excess = np.maximum(node_load - mean - d, 0.0)
        deficit = np.where(active, np.maximum(mean - d - node_load, 0.0), 0.0)
        return all(max(out.total(excess), into.total(deficit)) <= bound + 1e-9 for out, into, bound in sides)

    low, high = (
        0.0,
        float(max(np.abs(node_load[active] - mean).max(initial=0.0), (node_load - mean).max(), 0.0)),
    )
    if fits(low):
        return 0.0
    for _ in range(BISECTIONS):  # fits(high) holds: the current allocation spends nothing
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return low
