"""Event-time windows after C-MR (thesis 004, sections 2.2, 3.2.1 and 3.8).

Windows have a size ``w`` and a slide ``s``; window ``n`` covers ``[n*s, n*s + w)`` (aligned to the epoch,
so every process and key group agrees on them). A record belongs to the ``w/s`` windows covering its
event time.

Panes (C-MR's re-purposed Combine, 3.8): tumbling sub-windows of size ``k = HCF(w, s)``. Pane ``p``
covers ``[p*k, (p+1)*k)``; with ``s = a*k`` and ``w = b*k`` (integers), pane ``p`` is inside window ``n``
iff ``n*a <= p < n*a + b``. All membership is decided on the integer pane index, so the pane path and
the per-window path put every record in exactly the same windows even where floats would round
differently at a boundary.

Completeness (2.2.2): window ``n`` of a key group materialises only once the key group's watermark (the
punctuation every upstream replica has passed) reaches its end ``n*s + w``.

Cost rule (3.8.2): with ``t`` values per unit of time in a window, aggregating each window from scratch
costs ``w*t`` per slide, panes cost ``s*t + w/k`` (fold the new slide once, then merge ``w/k`` pane
partials), so panes pay iff ``t (w - s) > w / HCF(w, s)``. See :func:`combine_pays` for what ``t`` is here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from streamtopo.planner.graph import operator_dag
from streamtopo.planner.model import StreamTopologySpec, WindowSpec

_DENOMINATOR = 1_000_000  # durations are read to the microsecond


def fraction(duration: float) -> Fraction:
    """A duration on the microsecond grid, exactly."""
    return Fraction(duration).limit_denominator(_DENOMINATOR)


def hcf(*durations: float) -> Fraction:
    """Highest common factor of positive durations, as an exact fraction (microsecond grid)."""
    fs = [fraction(v) for v in durations]
    denominator = math.lcm(*(f.denominator for f in fs))
    return Fraction(math.gcd(*(int(f * denominator) for f in fs)), denominator)


@dataclass(frozen=True)
class Windowing:
    size: float
    slide: float
    pane: float
    a: int
    """Panes per slide."""
    b: int
    """Panes per window."""

    @classmethod
    def of(cls, spec: WindowSpec, pane: Fraction | None = None) -> Windowing:
        """Panes of ``pane`` seconds, a common factor of size and slide (default their HCF): aggregates
        with different windows share sub-windows of a factor common to all of them (shared_panes.py)."""
        size, slide = spec.size, spec.step
        k = hcf(size, slide) if pane is None else pane
        per_slide, per_window = (fraction(v) / k for v in (slide, size))
        if per_slide.denominator != 1 or per_window.denominator != 1:
            raise ValueError(
                f"a pane of {float(k)!r} s does not divide window {size!r} s / slide {slide!r} s"
            )
        return cls(size, slide, float(k), int(per_slide), int(per_window))

    # --- Spark SQL: the record-level assignment runs in Spark

    def pane_sql(self, ts: str = "_ts") -> str:
        return f"CAST(FLOOR({ts} / {self.pane!r}) AS BIGINT)"

    def windows_sql(self, pane: str) -> str:
        """Array of the window indices that contain pane ``pane`` (``explode`` it)."""
        return (
            f"sequence(CAST(FLOOR(({pane} - {self.b}) / {self.a}) AS BIGINT) + 1, "
            f"CAST(FLOOR({pane} / {self.a}) AS BIGINT))"
        )

    # --- numpy: the same rules on integer indices, for state (panes, windows) in the driver

    def first_window(self, pane: np.ndarray) -> np.ndarray:
        return np.floor_divide(pane - self.b, self.a) + 1

    def last_window(self, pane: np.ndarray) -> np.ndarray:
        return np.floor_divide(pane, self.a)

    def start(self, n: np.ndarray) -> np.ndarray:
        return np.asarray(n, dtype=np.float64) * self.slide

    def end(self, n: np.ndarray) -> np.ndarray:
        return np.asarray(n, dtype=np.float64) * self.slide + self.size

    def windows_of_panes(self, pane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in ``pane``, window index) for every (pane, window containing it) pair."""
        first, last = self.first_window(pane), self.last_window(pane)
        counts = (last - first + 1).astype(np.int64)
        rows = np.repeat(np.arange(len(pane)), counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, first[rows] + offsets


def combine_pays(size: float, slide: float, t: float, pane: Fraction | None = None) -> bool:
    """C-MR's rule (3.8.2): shared panes pay iff ``t (w - s) > w / HCF(w, s)`` (``w / k`` for a pane ``k``
    common to several aggregates' windows, shared_panes.py).

    ``t`` is the number of values one window instance receives per second. In C-MR a window is the data
    one reducer aggregates; here the aggregation state is kept per key within a key group, and merging
    pane partials costs one merge per pane *per key*, so ``t`` is the expected input rate per key (see
    :func:`values_per_second`). Tumbling windows (w = s) never pay.
    """
    k = float(hcf(size, slide) if pane is None else pane)
    return t * (size - slide) > size / k


def closing_windows(spec: StreamTopologySpec, op: str) -> tuple[Windowing, ...]:
    """The windows at whose ends alone ``op``'s records can change an output: every path downstream of
    ``op`` passes per-record operators (filter, map) into a windowed aggregate or a join, whose results
    need all records up to a window's end. Empty when some path reaches anything else first (a sink, a
    UDF, an aggregate without a window): there every record counts as soon as it is out."""
    dag = operator_dag(spec)
    found: list[Windowing] = []

    def only_windows_after(name: str) -> bool:
        for consumer in map(spec.operator, dag.successors(name)):
            if consumer.kind in ("aggregate", "join") and consumer.window is not None:
                found.append(Windowing.of(consumer.window))
            elif consumer.kind not in ("filter", "map") or not only_windows_after(consumer.name):
                return False
        return True

    return tuple(dict.fromkeys(found)) if only_windows_after(op) else ()
