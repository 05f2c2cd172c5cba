"""C-MR's operator scheduling policies for the backlog inside one executor (Backman, PhD thesis, Brown 2013,
Sec. 3.7, Table 3.4 and Eq. 3.1).

An executor hosts units (operator, key group), each with an input queue. When the queues hold more work than
one step may do, the executor ranks the queues and serves the highest rank first, fully or up to the budget
left, then the next. Table 3.4's ranks (higher is served first):

    ODF  -(event time of the record at the front of the queue)       oldest data first: latency
    YDF  +(event time of the record at the front of the queue)       youngest data first
    CTO  -(ordinal of the operator in a BFS from the sink(s))        closest to the output first
    MEM  (avgInputSize - selectivity * avgOutputSize) / avgProcessingTime
                                                                     bytes freed per second of work

The hybrid (Sec. 3.7.2) keeps ODF's latency while memory is plentiful and turns to MEM as it runs out:
with x = memory in use / memory budget it uses MEM with probability

    F(x) = 0                                          if x < T
           BetaCDF((x - T) / (1 - T), alpha, beta)    otherwise                        (3.1)

and ODF otherwise; the thesis uses T = 0.5, alpha = 2.5, beta = 1. C-MR draws once per computing node's
request for data; an executor draws once per step (``choose_policy``), then ``allot``s with the policy drawn.

Pure: no clock, no I/O; the hybrid's randomness comes from the numpy Generator the caller passes.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
from scipy.special import betainc

POLICIES = ("odf", "ydf", "cto", "mem")
"""Table 3.4's ranking policies; the hybrid picks one of "mem" / "odf" per step (``choose_policy``)."""

BudgetUnit = Literal["records", "seconds"]


@dataclass(frozen=True)
class UnitQueue:
    """One hosted unit's input queue as the scheduler sees it: what is queued and the unit's measured averages."""

    unit: str
    """The unit's key (``operator/kg``)."""
    records: int
    """Records queued."""
    bytes: int
    """Bytes queued (this queue's share of the executor's memory in use)."""
    front_ts: float
    """Event time (s) of the oldest queued record; ODF/YDF rank by it."""
    in_bytes: float
    """Mean bytes of one input record (MEM's avgInputSize)."""
    out_bytes: float
    """Mean bytes one output record adds to this executor's queues: its size times the number of hosted
    consumers it is copied to; 0 when the output leaves the executor (a sink, a unit hosted elsewhere)."""
    selectivity: float
    """Records out / records in."""
    seconds_per_record: float
    """Mean processing seconds per input record (MEM's avgProcessingTime); > 0."""
    bfs_order: int
    """Ordinal of the unit's operator in a breadth-first traversal from the sink(s), 0 = a sink (``cto_order``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "unit" and (not isinstance(value, numbers.Real) or math.isnan(value)):
                raise ValueError(f"UnitQueue {self.unit!r}: {f.name} must be a number, got {value!r}")
        for name in ("records", "bytes", "in_bytes", "out_bytes", "selectivity", "bfs_order"):
            if getattr(self, name) < 0:
                raise ValueError(f"UnitQueue {self.unit!r}: {name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.seconds_per_record < math.inf:
            raise ValueError(
                f"UnitQueue {self.unit!r}: seconds_per_record must be positive and finite, "
                f"got {self.seconds_per_record!r}"
            )


def ranks(queues: Sequence[UnitQueue], policy: str) -> dict[str, float]:
    """Table 3.4's rank of every queue under ``policy`` (higher is served first)."""
    _check_policy(policy)
    _check_units(queues)
    rank: Callable[[UnitQueue], float] = {
        "odf": lambda q: -q.front_ts,
        "ydf": lambda q: q.front_ts,
        "cto": lambda q: -float(q.bfs_order),
        "mem": lambda q: (q.in_bytes - q.selectivity * q.out_bytes) / q.seconds_per_record,
    }[policy]
    return {q.unit: float(rank(q)) for q in queues}


def mem_probability(
    memory_fraction: float, threshold: float = 0.5, alpha: float = 2.5, beta: float = 1.0
) -> float:
    """Eq. 3.1: the probability that the hybrid uses MEM at memory use ``memory_fraction`` of the budget."""
    if not 0 <= memory_fraction < math.inf:
        raise ValueError(f"memory_fraction must be >= 0 and finite, got {memory_fraction!r}")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold!r}")
    if not (0 < alpha < math.inf and 0 < beta < math.inf):
        raise ValueError(f"alpha and beta must be positive and finite, got alpha={alpha!r}, beta={beta!r}")
    if memory_fraction < threshold:
        return 0.0
    # Above the budget the CDF is already 1; clipping keeps betainc in its domain.
    return float(betainc(alpha, beta, min(1.0, (memory_fraction - threshold) / (1.0 - threshold))))


def choose_policy(
    memory_fraction: float,
    rng: np.random.Generator,
    threshold: float = 0.5,
    alpha: float = 2.5,
    beta: float = 1.0,
) -> str:
    """The hybrid's draw (Sec. 3.7.2): "mem" if rand(0, 1) < F(x) (Eq. 3.1), else "odf". One draw per call."""
    p = mem_probability(memory_fraction, threshold, alpha, beta)
    return "mem" if rng.random() < p else "odf"


def memory_fraction(queues: Iterable[UnitQueue], limit_bytes: float, state_bytes: float = 0.0) -> float:
    """x of Eq. 3.1: (queued bytes of the hosted units + their state bytes) / the executor's byte limit."""
    if not 0 < limit_bytes < math.inf:
        raise ValueError(f"limit_bytes must be positive and finite, got {limit_bytes!r}")
    if not 0 <= state_bytes < math.inf:
        raise ValueError(f"state_bytes must be >= 0 and finite, got {state_bytes!r}")
    return (sum(q.bytes for q in queues) + state_bytes) / limit_bytes


def allot(
    queues: Sequence[UnitQueue], budget: float, policy: str, budget_unit: BudgetUnit = "records"
) -> dict[str, int]:
    """Records each unit may take this step: serve queues by descending rank, each fully or up to what is left.

    ``budget`` counts records, or processing seconds (``budget_unit="seconds"``: a unit's take costs
    records * seconds_per_record, the thesis' computing-node time; float round-off may overrun it by a
    relative 1e-9 per queue). Equal ranks go to the older front, then the unit key, so the result is
    deterministic. Every queue is in the result (0 when not served).
    """
    _check_policy(policy)
    if budget_unit not in ("records", "seconds"):
        raise ValueError(f"budget_unit must be 'records' or 'seconds', got {budget_unit!r}")
    if not (isinstance(budget, numbers.Real) and 0 <= budget < math.inf):
        raise ValueError(f"budget must be >= 0 and finite, got {budget!r}")
    rank = ranks(queues, policy)
    out = {q.unit: 0 for q in queues}
    left = float(budget)
    # Float round-off of seconds (0.25 - 0.2 < 0.05) must not cost a record; record counts are exact.
    slack = 1e-9 * left if budget_unit == "seconds" else 0.0
    for q in sorted(queues, key=lambda q: (-rank[q.unit], q.front_ts, q.unit)):
        if q.records == 0:
            continue
        cost = 1.0 if budget_unit == "records" else q.seconds_per_record
        take = min(q.records, math.floor((left + slack) / cost))
        out[q.unit] = take
        left = max(0.0, left - take * cost)
    return out


def cto_order(downstream: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """CTO's ordinals (Sec. 3.7.1): breadth-first from the sinks (operators without downstream) against the
    arcs, 0 for the first sink; ties in visiting order go by name. Operators no sink reaches come last."""
    nodes = sorted(set(downstream) | {v for vs in downstream.values() for v in vs})
    upstream: dict[str, list[str]] = {n: [] for n in nodes}
    for u, vs in downstream.items():
        for v in vs:
            upstream[v].append(u)
    order: dict[str, int] = {}
    frontier = deque(n for n in nodes if not downstream.get(n))
    for n in frontier:
        order[n] = len(order)
    while frontier:
        for u in sorted(upstream[frontier.popleft()]):
            if u not in order:
                order[u] = len(order)
                frontier.append(u)
    for n in nodes:
        order.setdefault(n, len(order))
    return order


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


def _check_units(queues: Sequence[UnitQueue]) -> None:
    units = [q.unit for q in queues]
    if len(set(units)) != len(units):
        raise ValueError(f"queues: duplicate units {sorted({u for u in units if units.count(u) > 1})}")
