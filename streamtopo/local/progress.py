"""What ``streamtopo run`` shows while it runs: executors' lag and latency, sources' and sinks' rates.

Rates are per operator, not per executor: a source's records generated (or read) per second and a sink's
records written per second, from the executors' ``streamtopo_unit_records_out_total`` counters summed
over the operator's units on every executor. A sum over every operator of a pipeline counts each record
once per operator it passes, so it says nothing a reader can check; the sources' rates against their
target (``ratePerSecond``) and the sinks' rates do. Rates are taken over the last :data:`RATE_WINDOW`
seconds of scrapes: an executor's counters move once per micro-batch, and a step of a large pipeline on
a small machine takes seconds (VWAP's 592 units on 2 cores: 5-10 s), so a rate over a few seconds reads
0 or a multiple of the target in turn.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict, deque
from collections.abc import Set
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

from streamtopo.contracts import Metric, total
from streamtopo.planner.model import StreamTopologySpec

OLDEST_AGE = Metric.UNIT_OLDEST_AGE
RECORDS_OUT = total(Metric.UNIT_RECORDS_OUT)
RATE_WINDOW = 30.0
"""Seconds of scrapes a rate is measured over: several micro-batches even when steps take seconds."""
VIEWED = (
    RECORDS_OUT,
    OLDEST_AGE,
    Metric.UNIT_BACKLOG,
    Metric.ROUTING_VERSION,
    Metric.SINK_LATENCY + "_sum",
    Metric.SINK_LATENCY + "_count",
)
"""The samples the view reads. Only their lines are parsed: an executor exports series per unit and per
unit pair, and parsing all of them (prometheus_client's parser, in Python) twice a second per executor
was 97 % of ``streamtopo run``'s own Python time (py-spy); the process used 0.078 of a core with two
executors of a 16-key-group pipeline at 1M records/s, and 0.020 parsing these (2026-12-08)."""
_VIEWED = re.compile(rf"^(?:{'|'.join(map(re.escape, VIEWED))})[{{ ].*\n?", re.MULTILINE)


@dataclass(frozen=True)
class Scrape:
    """One executor's /metrics, reduced to what the view needs."""

    totals: dict[str, float]
    """Each of the :data:`VIEWED` samples summed over its series; the oldest-record age is the maximum
    instead (how far behind the executor's most lagging unit is)."""
    out_by_operator: dict[str, float]
    """Records out per operator, summed over the operator's units on this executor."""

    @classmethod
    def parse(cls, text: str) -> Scrape:
        totals: dict[str, float] = defaultdict(float)
        out: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families("".join(_VIEWED.findall(text))):
            for sample in family.samples:
                if sample.name == OLDEST_AGE:
                    totals[sample.name] = max(totals[sample.name], sample.value)
                else:
                    totals[sample.name] += sample.value
                if sample.name == RECORDS_OUT:
                    out[sample.labels["operator"]] += sample.value
        return cls(totals, dict(out))


@dataclass(frozen=True)
class Endpoint:
    """A source or sink of the pipeline, as the view lists it."""

    name: str
    role: str
    """``source`` or ``sink``."""
    target: float | None = None
    """A generator's ``ratePerSecond`` (what it should reach), None for stream sources and sinks."""


def endpoints(spec: StreamTopologySpec) -> list[Endpoint]:
    """The pipeline's sources (with their target rate when generated), then its sinks."""
    sources = [
        Endpoint(op.name, "source", op.source.rate_per_second if op.source.generator else None)
        for op in spec.operators
        if op.source is not None
    ]
    return sources + [Endpoint(op.name, "sink") for op in spec.operators if op.kind == "sink"]


class Progress:
    """Per-executor lag from the latest scrape, per-source and per-sink rates over :data:`RATE_WINDOW`."""

    def __init__(self, spec: StreamTopologySpec) -> None:
        self.endpoints = endpoints(spec)
        self.history: dict[str, deque[tuple[float, Scrape]]] = {}
        self.rows: dict[str, dict[str, float]] = {}

    def update(self, scrapes: dict[str, str], now: float | None = None) -> None:
        now = time.time() if now is None else now
        for name, text in scrapes.items():
            scrape = Scrape.parse(text)
            history = self.history.setdefault(name, deque())
            history.append((now, scrape))
            while len(history) > 2 and history[1][0] <= now - RATE_WINDOW:
                history.popleft()  # keep one scrape at or before the window's start as the baseline
            values = scrape.totals
            count = values[Metric.SINK_LATENCY + "_count"]
            self.rows[name] = {
                "latency": values[Metric.SINK_LATENCY + "_sum"] / count if count else math.nan,
                # Records waiting: a generator unit's due but not yet emitted, a stream-fed unit's queued.
                "lag": values[Metric.UNIT_BACKLOG],
                "age": values[OLDEST_AGE],
                "version": values[Metric.ROUTING_VERSION],
            }

    def running(self, name: str) -> bool:
        """The executor's loop runs (it applied a routing table, so its Spark session is up)."""
        return self.rows.get(name, {}).get("version", 0) > 0

    def forget(self, name: str) -> None:
        """A killed executor: its counters restart from 0 with its next process."""
        self.rows.pop(name, None)
        self.history.pop(name, None)

    def rates(self) -> dict[str, float]:
        """Records out per second of every operator, summed over the executors scraped in the window.

        A unit that moved keeps its count on the donor (counters are monotonic per executor) and counts
        anew on the receiver, so each executor's own difference is exact.
        """
        out: dict[str, float] = defaultdict(float)
        for history in self.history.values():
            (t0, first), (t1, last) = history[0], history[-1]
            if t1 <= t0:
                continue
            for op, value in last.out_by_operator.items():
                out[op] += max(0.0, value - first.out_by_operator.get(op, 0.0)) / (t1 - t0)
        return out

    def line(self, title: str) -> str:
        """The progress line printed when stdout is not a terminal."""
        rates = self.rates()
        parts = []
        for role, label in (("source", "sources"), ("sink", "sinks")):
            listed = [
                f"{e.name} {rates.get(e.name, 0.0):,.0f}"
                + (f"/{e.target:,.0f}" if e.target is not None else "")
                for e in self.endpoints
                if e.role == role
            ]
            parts.append(f"{label} rec/s {', '.join(listed)}")
        rows = self.rows.values()
        return (
            f"{title}; {'; '.join(parts)}; lag {sum(r['lag'] for r in rows):,.0f} rec, "
            f"oldest {max((r['age'] for r in rows), default=0.0):,.1f} s"
        )

    def emitted(self) -> float:
        """Records the sources have emitted so far, over every executor's latest scrape."""
        sources = {e.name for e in self.endpoints if e.role == "source"}
        return sum(
            value
            for history in self.history.values()
            for op, value in history[-1][1].out_by_operator.items()
            if op in sources
        )

    def table(self, title: str, running: set[str], pending: Set[str] = frozenset()) -> Group:
        """The live view: one row per executor, then one per source and sink."""
        return Group(self.executor_table(title, running, pending), self.rate_table())

    def executor_table(self, title: str, running: set[str], pending: Set[str] = frozenset()) -> Table:
        """One row per executor: up, down, or pending (no host has room for it yet)."""
        table = Table(title=title)
        for column in ("executor", "state", "lag rec", "lag s", "mean latency s", "routing v"):
            table.add_column(column, justify="right" if column != "executor" else "left")
        for name in sorted(set(self.rows) | running | pending):
            row = self.rows.get(name, {})
            state = "pending (no room)" if name in pending else "up" if name in running else "down"
            table.add_row(
                name,
                state,
                f"{row.get('lag', 0):,.0f}",
                f"{row.get('age', 0):,.1f}",
                f"{row.get('latency', math.nan):.2f}",
                f"{row.get('version', 0):.0f}",
            )
        return table

    def rate_table(self) -> Table:
        rates = self.rates()
        table = Table(
            title=f"records per second (last {RATE_WINDOW:g} s): generated or read by each source, "
            "written by each sink"
        )
        for column in ("operator", "role", "rec/s", "target rec/s"):
            table.add_column(column, justify="left" if column in ("operator", "role") else "right")
        for e in self.endpoints:
            table.add_row(
                e.name,
                e.role,
                f"{rates.get(e.name, 0.0):,.0f}",
                "-" if e.target is None else f"{e.target:,.0f}",
            )
        return table
