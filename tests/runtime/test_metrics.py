"""The executor's metrics helpers against prometheus_client's own behaviour."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from streamtopo.runtime.metrics import LATENCY_BUCKETS, observe_all


def _samples(histogram: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_all_counts_what_observe_would_value_by_value():
    """Buckets (a value on a bound counts in it), count and sum equal one ``observe`` per value."""
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.exponential(0.5, 5_000), np.array(LATENCY_BUCKETS), [0.0, 1e6]])
    one, many = (
        Histogram("lag", "lag", buckets=LATENCY_BUCKETS, registry=CollectorRegistry()) for _ in range(2)
    )
    for value in values:
        one.observe(float(value))
    observe_all(many, values[:100])
    observe_all(many, values[100:])
    observe_all(many, values[:0])
    got, want = _samples(many), _samples(one)
    assert got.keys() == want.keys()
    assert all(np.isclose(got[k], want[k]) for k in want)
    assert want[("lag_count", "")] == len(values)
