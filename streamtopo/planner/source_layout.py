"""Which seqs each key group of a generator source generates, and in what order.

A generated record is a pure function of its generator, seed and seq, whichever key group generates it;
a layout only says which key group generates which seqs. Every layout is ``residues + j * period``: the
key group's ``i``-th record is ``seq(i) = (i // m) * period + residues[i % m]`` (``m`` residues, sorted),
so its records come in seq (event-time) order and counting them below a bound is arithmetic.

- Unkeyed (round robin): key group ``kg`` of ``K`` generates ``kg + i * K`` (period ``K``, one residue).
- Keyed (``keyBy: [key]`` on a ``sequence`` source, issue 33 item 4): ``key = seq % keys``, and key
  group ``kg`` generates the seqs whose key hashes to ``kg`` by the hash every keyed edge routes by
  (planner/murmur3.py, runtime/partitioning.py). The keyed edge after the source is then one-to-one in the unit graph
  (planner/graph.py) and its records never cross, as a Kafka topic partitioned by key feeds Flink's
  source splits. Other generators draw their keys from a hash of the seq: a key group's records could
  only be found by generating every record, so the model refuses ``keyBy`` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.murmur3 import key_groups_of_numbers


@dataclass(frozen=True, eq=False)
class Layout:
    """The seqs one key group of a generator source generates (see the module docstring)."""

    period: int
    residues: np.ndarray
    """Sorted int64 seqs in ``[0, period)`` this key group generates of each period."""

    def seq(self, index: int) -> float:
        """The key group's ``index``-th seq (inf when it has none)."""
        m = len(self.residues)
        if not m:
            return math.inf
        whole, rest = divmod(index, m)
        return float(whole * self.period + int(self.residues[rest]))

    def below(self, bound: int) -> int:
        """Records of this key group with seq < ``bound``."""
        if bound <= 0:
            return 0
        whole, rest = divmod(bound, self.period)
        return whole * len(self.residues) + int(np.searchsorted(self.residues, rest))

    def total(self, count: int | None) -> int | None:
        """Records of this key group in a source of ``count`` records (None: endless, unless it has none)."""
        if count is not None:
            return self.below(count)
        return 0 if not len(self.residues) else None

    def runs(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Records ``first .. first + n - 1`` as arithmetic runs of seqs: (first seqs, last seqs, step), one
        run per residue that has any of them (at most ``min(m, n)``), each run ascending by ``period``."""
        m = len(self.residues)
        if not m or n <= 0:
            empty = np.empty(0, np.int64)
            return empty, empty, self.period
        rho = np.arange(m, dtype=np.int64)
        lo_j = -((rho - first) // m)  # the first j with rho + j * m >= first
        hi_j = (first + n - 1 - rho) // m
        keep = lo_j <= hi_j
        base = self.residues[keep]
        return base + lo_j[keep] * self.period, base + hi_j[keep] * self.period, self.period


def round_robin(kg: int, k: int) -> Layout:
    return Layout(k, np.array([kg], np.int64))


@lru_cache(maxsize=8)
def _key_groups_of_keys(keys: int, k: int) -> np.ndarray:
    """The key group of each key ``0 .. keys - 1`` (int64 keys, as the sequence generator makes them)."""
    return key_groups_of_numbers(np.arange(keys, dtype=np.int64), k)


@lru_cache(maxsize=4096)
def by_key(kg: int, k: int, keys: int) -> Layout:
    return Layout(keys, np.flatnonzero(_key_groups_of_keys(keys, k) == kg).astype(np.int64))


def layout(spec: StreamTopologySpec, op: str, kg: int) -> Layout:
    """Key group ``kg``'s layout of generator source ``op``: by key when the source has ``keyBy``."""
    operator = spec.operator(op)
    k = spec.key_groups_of(op)
    if operator.key_by:
        assert operator.source is not None  # keyBy on a source: a sequence generator's key (the model)
        return by_key(kg, k, operator.source.keys or 1)
    return round_robin(kg, k)
