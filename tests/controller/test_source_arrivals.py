"""Generator sources as the controller sees them: their lag is read when scraped, their arrivals are the
records that came due (the scaling rule's input rate), through the real exporter and the direct scrape."""

from __future__ import annotations

import time
import urllib.request

import pytest
from controller_testkit import wait_for
from prometheus_client.parser import text_string_to_metric_families

from streamtopo.contracts import ExecutorEntry, RoutingTable
from streamtopo.controller.adaptation_loop import allocation_state
from streamtopo.controller.platform import MetricsUnavailable
from streamtopo.controller.prometheus import PrometheusMetricsSource
from streamtopo.controller.scrape import ScrapeMetricsSource
from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.scaling.policy import observe
from streamtopo.planner.source_layout import round_robin
from streamtopo.runtime.metrics import ExecutorMetrics, Probe, SourcePace, serve

RATE = 1000.0


def topology():
    return load_topology(
        {
            "metadata": {"name": "gen"},
            "spec": {
                "keyGroups": 2,
                "operators": [
                    {
                        "name": "src",
                        "kind": "source",
                        "source": {"generator": "sequence", "ratePerSecond": RATE},
                    },
                    {"name": "out", "kind": "sink", "inputs": ["src"], "sink": {"console": {}}},
                ],
            },
        }
    )


@pytest.fixture
def exporter():
    """An executor's real exporter hosting src/0, src/1 (a generator 100 s behind) and out/0, out/1."""
    metrics = ExecutorMetrics("gen", "ex-0")
    server = serve(metrics, Probe(lambda: True, lambda: True), 0)
    try:
        yield metrics, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def gauges(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, s.labels.get("kg", "")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("operator") == "src"
    }


def test_a_generator_units_lag_is_what_is_due_when_scraped(exporter):
    """Emitted 500 of the ~1000 records due 2 s after start: the rest wait, the first of them ~1 s old,
    however long ago the executor last stepped (a gauge set at generation time read 0)."""
    metrics, url = exporter
    pace = SourcePace(t0=time.time() - 2.0, rate=RATE, layout=round_robin(0, 1))
    metrics.source_progress("src", 0, pace, emitted=500)
    first = gauges(url)
    assert first[("streamtopo_unit_backlog_records", "0")] >= 1000 * 2.0 + 1 - 500
    assert first[("streamtopo_unit_oldest_record_age_seconds", "0")] >= 2.0 - 0.5
    time.sleep(0.3)  # no step in between: the lag still grows with the clock
    assert (
        gauges(url)[("streamtopo_unit_backlog_records", "0")]
        > first[("streamtopo_unit_backlog_records", "0")]
    )
    metrics.source_progress("src", 0, pace, emitted=pace.due(time.time() + 60))  # caught up (and ahead)
    caught_up = gauges(url)
    assert caught_up[("streamtopo_unit_backlog_records", "0")] == 0
    assert caught_up[("streamtopo_unit_oldest_record_age_seconds", "0")] == 0


def test_records_held_for_a_window_end_are_not_lag(exporter):
    """A unit releasing its records at 1 s window ends has emitted what was due at the last end: the
    records due since wait on purpose, so neither backlog nor oldest age counts them."""
    metrics, url = exporter
    start = time.time() - 2.5
    pace = SourcePace(t0=start, rate=RATE, layout=round_robin(0, 1), closes=((1.0, 1.0),), hold=100_000)
    last_end = start + int(time.time() - start)
    metrics.source_progress("src", 0, pace, emitted=pace.due(last_end))
    held = gauges(url)
    assert held[("streamtopo_unit_backlog_records", "0")] == 0
    assert held[("streamtopo_unit_oldest_record_age_seconds", "0")] == 0
    metrics.source_progress("src", 0, pace, emitted=pace.due(last_end - 1.0))  # a window end missed
    assert gauges(url)[("streamtopo_unit_backlog_records", "0")] >= RATE - 1


def test_a_finite_generator_has_no_lag_once_its_count_is_emitted(exporter):
    metrics, url = exporter
    pace = SourcePace(t0=time.time() - 100.0, rate=RATE, layout=round_robin(1, 2), count=11)
    assert pace.due(time.time()) == 5  # seqs 1, 3, 5, 7, 9 of 0..10
    metrics.source_progress("src", 1, pace, emitted=5)
    assert gauges(url)[("streamtopo_unit_backlog_records", "1")] == 0


def test_the_scaling_input_rate_of_generator_sources_is_their_due_rate(exporter):
    """Two generator units at 500 rec/s each, the executor keeping up with neither (nothing emitted):
    the direct scrape reports their arrivals, so the scaling rule's input is the sources' 1000 rec/s."""
    metrics, url = exporter
    now = time.time()
    for kg in (0, 1):
        metrics.source_progress(
            "src", kg, SourcePace(t0=now - 100.0, rate=RATE, layout=round_robin(kg, 2)), emitted=0
        )
    for unit in (("src", 0), ("src", 1), ("out", 0), ("out", 1)):
        metrics.unit(metrics.busy, *unit).inc(0.5)
    source = ScrapeMetricsSource({"ex-0": url})
    with pytest.raises(MetricsUnavailable, match="first sample"):
        source.collect("gen", 1.0)
    time.sleep(1.0)
    for unit in (("src", 0), ("src", 1), ("out", 0), ("out", 1)):
        metrics.unit(metrics.busy, *unit).inc(0.5)
    stats = source.collect("gen", 1.0)
    assert stats.units[("src", 0)].records_in == pytest.approx(RATE / 2, rel=0.2)
    assert stats.units[("src", 0)].backlog >= RATE * 100 / 2
    units = {f"{op}/{kg}": "ex-0" for op in ("src", "out") for kg in (0, 1)}
    routing = RoutingTable(topology="gen", version=1, units=units, executors={"ex-0": ExecutorEntry(cpu=1.0)})
    state = allocation_state(stats, routing, topology().spec, Cluster(hosts=[Host(name="h", cpu=2.0)]))
    observation = observe(state, None, time=1.0, window=1.0)
    assert observation.input_rate == pytest.approx(RATE, rel=0.2)
    assert observation.backlog >= RATE * 100


@pytest.mark.prometheus
@pytest.mark.timeout(120)
def test_prometheus_reports_a_generators_due_rate_as_its_records_in(exporter, prometheus_factory):
    """The same through a real Prometheus scraping the exporter every second."""
    metrics, url = exporter
    metrics.source_progress(
        "src", 0, SourcePace(t0=time.time() - 10.0, rate=RATE, layout=round_robin(0, 1)), emitted=0
    )
    metrics.unit(metrics.busy, "src", 0).inc(0.1)
    prometheus = prometheus_factory([url.removeprefix("http://").removesuffix("/metrics")])
    source = PrometheusMetricsSource(prometheus.url, timeout=2.0)

    def rate() -> float:
        try:
            return source.collect("gen", 10.0).units[("src", 0)].records_in
        except (MetricsUnavailable, KeyError):
            return 0.0

    wait_for(lambda: rate() > 0, timeout=60, what="two samples of src/0's due counter in Prometheus")
    assert rate() == pytest.approx(RATE, rel=0.2)
