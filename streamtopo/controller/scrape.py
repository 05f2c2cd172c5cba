"""Direct-scrape MetricsSource: reads each executor's ``/metrics`` text, no Prometheus needed.

``streamtopo run`` uses it (executors are local processes), and the operator falls back to it when no
Prometheus is configured. Counters become rates between two consecutive collections (the loop collects
once per SPL, so the rate window is the SPL); the first collection only records a baseline and reports
``WarmingUp``. A counter that went down (its executor restarted) restarts from zero, as PromQL's rate does.

A generator source unit consumes nothing: its arrivals are the records that came due
(``streamtopo_unit_records_due_total``), which :func:`with_arrivals` makes its records-in rate, so the
scaling rule's input rate is the sources' target rate, not 0 (both metric sources do this).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from streamtopo.contracts import Metric, total
from streamtopo.controller.platform import COUNTERS, GAUGES, MetricsUnavailable, RuntimeStats, runtime_stats

Endpoints = Mapping[str, str] | Callable[[], Mapping[str, str]]
"""Executor -> metrics URL, or a callable returning that map (re-read at every collection)."""
SampleKey = tuple[str, tuple[tuple[str, str], ...]]

ARRIVALS = total(Metric.UNIT_RECORDS_DUE)
"""Counter of a generator unit's due records: its arrival rate (a stream-fed unit's is its records in)."""
RATES = set(COUNTERS.values()) | {ARRIVALS}
WANTED = RATES | set(GAUGES.values())


def with_arrivals(series: dict[str, list]) -> dict[str, list]:
    """``series`` with generator units' due-record rates as their records-in rates (DS2's arrival rate).

    The executor never counts records in for a generator unit, so its records-in series is absent and
    adding the arrivals' samples sets it. Returns the same dict, without the arrivals' own entry.
    """
    due = series.pop(ARRIVALS, [])
    series.setdefault(COUNTERS["records_in"], []).extend(due)
    return series


MAX_SCRAPE_BYTES = 8 * 2**20
"""Largest /metrics body read from an executor. Executors run the tenant's image and code, so the
operator reads a bounded amount (an executor with a few thousand units exports well under 1 MiB)."""


def parse_metrics(text: str, topology: str) -> dict[SampleKey, float]:
    """Samples of the runtime's metric names for ``topology``, keyed by (name, sorted labels)."""
    out: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WANTED and sample.labels.get("topology") == topology:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


class ScrapeMetricsSource:
    """:class:`~streamtopo.controller.platform.MetricsSource` over executor ``/metrics`` URLs.

    ``endpoints`` maps executor names to URLs (or is a callable returning that map, re-read at every
    collection so added and removed executors are followed).
    """

    def __init__(
        self, endpoints: Endpoints, *, timeout: float = 2.0, clock: Callable[[], float] = time.monotonic
    ):
        self.endpoints = endpoints
        self.timeout = timeout
        self.clock = clock
        self._previous: dict[str, tuple[float, dict[SampleKey, float]]] = {}

    def scrape(self, topology: str) -> dict[str, dict[SampleKey, float]]:
        endpoints = self.endpoints() if callable(self.endpoints) else self.endpoints
        if not endpoints:
            raise MetricsUnavailable("MetricsIncomplete", "no executor metrics endpoint is known yet")
        out = {}
        for executor, url in sorted(endpoints.items()):
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as response:
                    body = response.read(MAX_SCRAPE_BYTES + 1)
            except (urllib.error.URLError, OSError, ValueError) as error:
                raise MetricsUnavailable(
                    "ScrapeFailed",
                    f"cannot scrape executor {executor} at {url}: {getattr(error, 'reason', error)}",
                ) from None
            if len(body) > MAX_SCRAPE_BYTES:
                raise MetricsUnavailable(
                    "ScrapeTooLarge",
                    f"executor {executor} at {url} serves more than {MAX_SCRAPE_BYTES // 2**20} MiB of metrics",
                )
            try:
                out[executor] = parse_metrics(body.decode(), topology)
            except ValueError as error:  # not UTF-8, or not the exposition format
                raise MetricsUnavailable(
                    "ScrapeInvalid", f"executor {executor} at {url} serves no valid metrics: {error}"
                ) from None
        return out

    def collect(self, topology: str, window_seconds: float) -> RuntimeStats:
        now = self.clock()
        current = self.scrape(topology)
        previous = self._previous
        self._previous = {executor: (now, samples) for executor, samples in current.items()}
        fresh = [e for e in current if e not in previous]
        if fresh:
            raise MetricsUnavailable(
                "WarmingUp",
                f"first sample of {', '.join(fresh)}: rates need a second one, {window_seconds:g}s from now",
            )
        counters = RATES
        series: dict[str, list] = {}
        for executor, samples in current.items():
            then, before = previous[executor]
            elapsed = now - then
            if elapsed <= 0:
                raise MetricsUnavailable("WarmingUp", "two collections at the same instant")
            for (name, labels), value in samples.items():
                if name in counters:
                    old = before.get((name, labels), 0.0)
                    value = (value - old if value >= old else value) / elapsed
                series.setdefault(name, []).append((dict(labels), value))
        return runtime_stats(topology, window_seconds, with_arrivals(series))
