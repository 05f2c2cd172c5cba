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


def test_cpu_and_cpu_wait_count_each_process_and_thread_once():
    """The counters advance per process (CPU) and per thread (run-queue wait): one missing from a reading
    and listed again, or one that ended, is not counted twice or taken back."""
    import os
    import threading
    import time

    from streamtopo.contracts import Metric, total
    from streamtopo.runtime.metrics import ExecutorMetrics, thread_waits

    metrics = ExecutorMetrics("t", "e0")

    def value(name: str) -> float:
        return metrics.registry.get_sample_value(total(name), {"topology": "t", "executor": "e0"}) or 0.0

    metrics.add_cpu({10: 5.0, 11: 20.0})
    metrics.add_cpu({10: 6.0})  # the JVM (11) was not listed this time
    metrics.add_cpu({10: 6.5, 11: 21.0})  # listed again: only its second counts
    assert value(Metric.EXECUTOR_CPU) == 5.0 + 20.0 + 1.0 + 0.5 + 1.0
    metrics.add_cpu_wait({(10, 10): 0.2, (10, 12): 0.1})
    metrics.add_cpu_wait({(10, 10): 0.5})
    metrics.add_cpu_wait({(10, 10): 0.5, (10, 12): 0.1, (10, 13): 0.05})
    assert value(Metric.EXECUTOR_CPU_WAIT) == 0.2 + 0.1 + 0.3 + 0.05

    # this process's threads, from the kernel's schedstat: every thread listed, waits never negative
    busy = threading.Thread(target=lambda: time.sleep(0.2))
    busy.start()
    waits = thread_waits([os.getpid()])
    busy.join()
    assert (os.getpid(), threading.get_native_id()) in waits and all(w >= 0 for w in waits.values())
    assert thread_waits([2**22 + 7]) == {}  # no such process: nothing, no error
