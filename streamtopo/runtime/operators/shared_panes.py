"""Sub-windows shared across aggregates (C-MR, thesis 004, 3.8.1 and Figure 3.9's optimised MACD workflow).

C-MR's Combine computes tumbling sub-windows (panes) once, and every Reduce window made of them merges
the pane aggregates instead of the records. The thesis shares them not only among one reducer's
overlapping windows (aggregate.py's pane path) but also among reducers "of similar types but differing
window sizes" that "have the same input sources and have a common factor for the slide values": MACD's
5- and 10-minute moving averages, both sliding by a minute, take their 1-minute sub-windows from one
Combine.

Here a group is the windowed aggregates that read the same operator, key its output the same way (same
``keyBy``, same key groups, so a record goes to the same key group index in each), carry the same
``paneGroup`` (planner/graph.py's ``pane_group``) and have a pane ``k``
that divides every one of their sizes and slides (the HCF of all of them). For them the producing
executor runs **one** Spark job per step over the input: partial aggregates per (consuming key group, key,
pane), with the union of the members' partial columns (``avg(price)`` and ``sum(price)`` share the sum),
the producing unit and the records each row stands for. Each member receives its columns as the partials
of its map-side combine (dataflow.py), locally or across executors, and merges panes into its own windows
when they close (aggregate.py). Without sharing every member runs its own job over the same records.

Who joins (C-MR's rule, 3.8.2, with the group's pane): a member whose windows do not gain from panes of
``k``, ``t (w - s) <= w / k``, is left out and ``k`` is recomputed over the rest; fewer than two left,
no group.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

import pandas as pd
from pyspark.sql import DataFrame as SparkFrame

from streamtopo.planner.graph import pane_group
from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.aggregate import bucket_partials, values_per_second
from streamtopo.runtime.operators.aggregations import Aggregation, parse_aggregations, partial_aggregation
from streamtopo.runtime.operators.base import computed, lazily
from streamtopo.runtime.operators.records import BUCKET, COUNT, KG, SRC, to_pandas
from streamtopo.runtime.operators.windows import Windowing, combine_pays, hcf


@dataclass(frozen=True)
class SharedPanes:
    """Aggregates that take their pane partials from one Spark job over their common input."""

    input: str
    members: tuple[str, ...]
    pane: Fraction
    keys: tuple[str, ...]
    partials: tuple[Aggregation, ...]
    """One aggregation per distinct (partial kind, expression) over all members."""
    columns: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """Per member: (its own partial column, the shared column holding it)."""

    @classmethod
    def of(cls, ops: list[Operator], pane: Fraction, keys: tuple[str, ...]) -> SharedPanes:
        """The group of ``ops`` (windowed aggregates of one input, keyed by ``keys``) over panes of ``pane``
        seconds: each distinct partial of theirs once, by its kind and its expression's text."""
        shared: dict[tuple[str, str], Aggregation] = {}
        columns = []
        for op in ops:
            own = []
            for agg in parse_aggregations(op.aggregations or []):
                for column, kind in agg.partial_columns().items():
                    key = (kind, " ".join(agg.arg.split()))
                    if key not in shared:
                        shared[key] = partial_aggregation(kind, agg.arg, len(shared))
                    [name] = shared[key].partial_columns()
                    own.append((column, name))
            columns.append((op.name, tuple(own)))
        return cls(
            ops[0].inputs[0], tuple(op.name for op in ops), pane, keys, tuple(shared.values()), tuple(columns)
        )

    def compute(self, frame: SparkFrame) -> pd.DataFrame:
        """The pane partials of ``frame`` (``__src`` = producing unit, ``_kg`` = consuming unit) for every
        member, in one Spark job: ``__src, _kg, <keys>, __bucket`` (the pane), the shared columns, ``__n``."""
        w = Windowing(float(self.pane), float(self.pane), float(self.pane), 1, 1)
        name = ",".join(self.members)
        lazy = lazily(
            name,
            "aggregations",
            lambda: bucket_partials(frame, list(self.keys), w, True, list(self.partials)),
            frame,
        )
        return computed(lambda: to_pandas(lazy))

    def member_rows(self, rows: pd.DataFrame, member: str) -> pd.DataFrame:
        """``member``'s partials out of the shared rows, under its own column names."""
        own = dict(self.columns)[member]
        index = [c for c in (SRC, KG, *self.keys, BUCKET) if c in rows.columns]
        return pd.DataFrame(
            {
                **{c: rows[c] for c in index},
                **{column: rows[shared] for column, shared in own},
                COUNT: rows[COUNT],
            }
        )


def sharing_groups(spec: StreamTopologySpec) -> list[SharedPanes]:
    """The groups of windowed aggregates that share panes (see the module docstring for the rule)."""
    candidates: dict[tuple[str, tuple[str, ...], int, str | None], list[Operator]] = defaultdict(list)
    for op in spec.operators:
        if op.kind != "aggregate" or op.window is None or len(op.inputs) != 1:
            continue
        try:
            parse_aggregations(op.aggregations or [])
        except ValueError:
            continue  # refused when the operator is built, with its name and field
        candidates[pane_group(spec, op)].append(op)
    groups = []
    for (_, keys, _, _), ops in candidates.items():
        while len(ops) >= 2:
            windows = [op.window for op in ops if op.window is not None]
            pane = hcf(*(d for window in windows for d in (window.size, window.step)))
            paying = [op for op in ops if _pays(op, spec, pane)]
            if len(paying) == len(ops):
                groups.append(SharedPanes.of(ops, pane, keys))
                break
            ops = paying
    return groups


def _pays(op: Operator, spec: StreamTopologySpec, pane: Fraction) -> bool:
    assert op.window is not None  # candidates are windowed
    return combine_pays(op.window.size, op.window.step, values_per_second(op, spec), pane)
