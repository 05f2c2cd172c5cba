"""Prometheus MetricsSource: PromQL over the runtime's metric names, rate windows equal to the SPL.

Counters are read as raw samples over the window (``name{topology="..."}[<SPL>s]``) and turned into
rates here: per unit (or executor, or kg pair), the summed increase of its series (counter resets
handled as PromQL's ``rate`` does) divided by the time those series cover. Unlike ``rate()``, which
divides by the whole window, this stays right for a series younger than the window: a unit that just
moved (its receiver's series starts, its donor's stops) or an executor that just started. Gauges are
read as their latest value; a generator unit's due-record counter becomes its records-in rate (its
arrivals, :func:`streamtopo.controller.scrape.with_arrivals`). The source refuses to answer
(``MetricsUnavailable``) rather than guess:

- ``PrometheusUnreachable``: the HTTP API fails (down, refused, timeout, error status);
- ``MetricsStale``: the newest busy-time sample is older than ``staleness`` (default: one SPL plus 30 s),
  so the exporters or the scrape stopped;
- ``MetricsIncomplete``: no series for the topology yet (a rate needs two samples inside the window),
  or units missing (checked by the loop against the routing table);
- a ``credentials`` callable (basic auth read from a Secret reference each period) may raise its own
  ``MetricsUnavailable`` (e.g. ``SecretNotFound``) before any query is sent.

The loop then skips the period (no rebalancing, no scaling), reports why in a condition, and tries again
next period: recovery needs no intervention.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from streamtopo.controller.platform import COUNTERS, GAUGES, MetricsUnavailable, RuntimeStats, runtime_stats
from streamtopo.controller.scrape import ARRIVALS, with_arrivals


def _selector(topology: str) -> str:
    escaped = topology.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{topology="{escaped}"}}'


def window(seconds: float) -> str:
    """A PromQL range of whole seconds (at least one)."""
    return f"{max(1, round(seconds))}s"


class PrometheusMetricsSource:
    """:class:`~streamtopo.controller.platform.MetricsSource` backed by a Prometheus HTTP API.

    Basic auth is either fixed (``auth``) or fetched at the start of every ``collect`` (``credentials``,
    e.g. from a Kubernetes Secret), so a rotated password is picked up without a restart.
    """

    def __init__(
        self,
        url: str,
        *,
        auth: tuple[str, str] | None = None,
        credentials: Callable[[], tuple[str, str]] | None = None,
        timeout: float = 5.0,
        staleness: float | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url
        self.staleness = staleness
        self.credentials = credentials
        self.client = PrometheusConnect(
            url=url,
            disable_ssl=not url.startswith("https"),
            auth=auth,
            headers=dict(headers) if headers else None,
            timeout=timeout,
            # one quick retry: a down Prometheus must not stall the loop
            retry=Retry(total=1, backoff_factor=0.1),
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        from prometheus_api_client import PrometheusApiClientException
        from requests import RequestException

        try:
            return self.client.custom_query(promql)
        except (RequestException, PrometheusApiClientException, ValueError) as error:
            raise MetricsUnavailable(
                "PrometheusUnreachable", f"Prometheus at {self.url} did not answer: {type(error).__name__}"
            ) from None

    def collect(self, topology: str, window_seconds: float) -> RuntimeStats:
        if self.credentials is not None:
            self.client.auth = self.credentials()
        match = _selector(topology)
        busy = COUNTERS["busy"]
        age = self.query(f"time() - max(timestamp({busy}{match}))")
        if not age:
            raise MetricsUnavailable("MetricsIncomplete", f"Prometheus has no {busy} series for {topology!r}")
        limit = self.staleness if self.staleness is not None else window_seconds + 30.0
        newest = float(age[0]["value"][1])
        if newest > limit:
            raise MetricsUnavailable(
                "MetricsStale", f"newest sample is {newest:.0f}s old (limit {limit:.0f}s)"
            )
        series: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for key, name in (*COUNTERS.items(), ("records_in", ARRIVALS)):
            series[name] = window_rates(self.query(f"{name}{match}[{window(window_seconds)}]"), ENTITY[key])
        for name in GAUGES.values():
            series[name] = [
                (item["metric"], float(item["value"][1])) for item in self.query(f"{name}{match}")
            ]
        return runtime_stats(topology, window_seconds, with_arrivals(series))


ENTITY = {
    "busy": ("operator", "kg"),
    "records_in": ("operator", "kg"),
    "records_out": ("operator", "kg"),
    "traffic": ("src_operator", "src_kg", "dst_operator", "dst_kg"),
    "executor_cpu": ("executor",),
    "executor_cpu_wait": ("executor",),
}
"""The labels naming what a counter measures; its series (one per exporting executor) share one span."""


def window_rates(
    result: list[dict[str, Any]], entity: tuple[str, ...]
) -> list[tuple[Mapping[str, str], float]]:
    """Per-series rates from a range-vector result, each divided by its entity's covered time.

    The rates of an entity's series add up to its increase over the span its series cover, so a unit
    exported by its donor and then its receiver within one window is counted once, at its real rate.
    A series with a single sample in the window contributes nothing (a rate needs two).
    """
    spans: dict[tuple[str | None, ...], tuple[float, float]] = {}
    increases = []
    for item in result:
        points = [(float(t), float(v)) for t, v in item["values"]]
        if len(points) < 2:
            continue
        increase = sum(b - a if b >= a else b for (_, a), (_, b) in pairwise(points))
        key = tuple(item["metric"].get(label) for label in entity)
        start, end = spans.get(key, (points[0][0], points[-1][0]))
        spans[key] = (min(start, points[0][0]), max(end, points[-1][0]))
        increases.append((key, item["metric"], increase))
    return [(labels, increase / (spans[key][1] - spans[key][0])) for key, labels, increase in increases]
