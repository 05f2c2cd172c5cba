"""The executor's Prometheus exporter: the metric names of notes/controller_api.md, plus health probes.

One registry per executor (no process-global default registry, so tests can run several). Served by a
small threaded HTTP server:

    /metrics   Prometheus text format (the contract's names, plus streamtopo_sink_latency_seconds: event
               time to sink commit, the end-to-end latency `streamtopo run` and bench/runtime.py report)
               and streamtopo_unit_records_due: a generator unit's arrivals (records whose event time came)
    /healthz   200 while the micro-batch loop is alive (it iterated recently), 503 otherwise
    /readyz    200 once the executor is connected, has applied a routing table and owns every unit the
               table gives it (no acquisition pending), 503 otherwise
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from streamtopo.contracts import Metric
from streamtopo.planner.source_layout import Layout

UNIT = ("topology", "executor", "operator", "kg")
EXECUTOR = ("topology", "executor")
LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
PAUSE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class SourcePace:
    """When a generator unit's records come due: its i-th record (global seq ``layout.seq(i)``: ``i *
    key_groups + kg`` unkeyed, planner/source_layout.py) has event time ``seq / rate`` seconds after the
    topology's start ``t0``, and is due once wall time passes it.

    A generator has no input stream, so what waits for it is not queued anywhere: it is the records due by
    now and not yet emitted, a function of the clock that must be evaluated when it is read (a gauge set
    once per step reads 0 right after the step emitted everything, however long the next step takes).
    """

    t0: float
    rate: float
    layout: Layout
    count: int | None = None
    """Records of the whole source (all key groups), None for an endless one."""
    closes: tuple[tuple[float, float], ...] = ()
    """(slide, size) of the windows through which alone the unit's records reach any output
    (:func:`~streamtopo.runtime.operators.windows.closing_windows`); empty when some path has no window."""
    hold: int = 0
    """Records the unit holds back at most until the next of those windows ends (:meth:`released`)."""

    @property
    def total(self) -> int | None:
        """Records of this unit in all: its share of ``count`` (None for an endless source)."""
        return self.layout.total(self.count)

    def due(self, now: float) -> int:
        """Records of this unit whose event time is <= ``now`` (capped by the unit's share of ``count``)."""
        due = self.layout.below(math.floor((now - self.t0) * self.rate) + 1)
        total = self.total
        return due if total is None else min(due, total)

    def released(self, now: float, emitted: int) -> float:
        """The time up to which the unit emits what is due, having emitted ``emitted`` records by ``now``.

        ``now``, unless all its records are seen only through windows (``closes``): then the last window
        end by ``now``, as long as fewer than ``hold`` records are due and the source is not about to end.
        A window's result needs every record up to its end and nothing after, so emitting at window ends
        gives the same results with one step (one Spark job) per window end instead of one per loop turn,
        and the step that closes a window starts when the window ends rather than up to a step later.
        Beyond ``hold`` records, incremental steps keep the work at a window's end small.
        """
        due = self.due(now)
        total = self.total
        if not self.closes or due - emitted >= self.hold or (total is not None and due >= total):
            return now
        since = now - self.t0
        return self.t0 + max(math.floor((since - size) / slide) * slide + size for slide, size in self.closes)

    def releasable(self, now: float, emitted: int) -> int:
        """Records the unit emits by ``now`` in all: what is due up to :meth:`released`."""
        return self.due(self.released(now, emitted))

    def event_time(self, index: int) -> float:
        """Seconds after ``t0`` of the unit's ``index``-th record."""
        return self.layout.seq(index) / self.rate


def observe_all(histogram: Histogram, values: np.ndarray) -> None:
    """``histogram.observe(v)`` for every value, in one pass. A sink step may commit hundreds of thousands
    of records, and ``observe`` takes a lock and searches the buckets per call: a few microseconds each,
    a third of a step's Python time on bench/runtime.py's pipelines. It updates the buckets and the sum
    that ``observe`` does (prometheus_client's ``_upper_bounds``, ``_buckets``, ``_sum``)."""
    if not len(values):
        return
    histogram._raise_if_not_observable()
    bounds = histogram._upper_bounds
    counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds))
    histogram._sum.inc(float(values.sum()))
    for bucket, n in zip(histogram._buckets, counts.tolist()):
        if n:
            bucket.inc(n)


class ExecutorMetrics:
    """Every metric an executor exports; labels follow the controller's contract exactly."""

    def __init__(self, topology: str, executor: str):
        self.topology, self.executor = topology, executor
        r = self.registry = CollectorRegistry()
        self.busy = Counter(Metric.UNIT_BUSY, "CPU-busy seconds of a unit", UNIT, registry=r)
        self.records_in = Counter(Metric.UNIT_RECORDS_IN, "Records a unit consumed", UNIT, registry=r)
        self.records_out = Counter(Metric.UNIT_RECORDS_OUT, "Records a unit produced", UNIT, registry=r)
        self.kg_records = Counter(
            Metric.KG_RECORDS,
            "Records from one unit to another",
            ("topology", "src_operator", "src_kg", "dst_operator", "dst_kg"),
            registry=r,
        )
        self.state_bytes = Gauge(Metric.UNIT_STATE_BYTES, "Encoded state of a unit", UNIT, registry=r)
        self.backlog = Gauge(Metric.UNIT_BACKLOG, "Records waiting for a unit", UNIT, registry=r)
        self.oldest_age = Gauge(
            Metric.UNIT_OLDEST_AGE, "Age of the oldest record waiting for a unit", UNIT, registry=r
        )
        self.records_due = Counter(
            Metric.UNIT_RECORDS_DUE,
            "Records that came due at a generator source unit (its arrivals)",
            UNIT,
            registry=r,
        )
        self.cpu = Counter(
            Metric.EXECUTOR_CPU, "CPU seconds of the executor (JVM included)", EXECUTOR, registry=r
        )
        self.cpu_wait = Counter(
            Metric.EXECUTOR_CPU_WAIT,
            "Seconds the executor's threads (JVM included) waited for a CPU while runnable",
            EXECUTOR,
            registry=r,
        )
        self.memory = Gauge(Metric.EXECUTOR_MEMORY, "Resident memory (JVM included)", EXECUTOR, registry=r)
        self.capacity = Gauge(
            Metric.EXECUTOR_CAPACITY, "CPU cores the executor may use", EXECUTOR, registry=r
        )
        self.routing_version = Gauge(
            Metric.ROUTING_VERSION, "Routing table version applied", EXECUTOR, registry=r
        )
        self.migrations = Counter(
            Metric.MIGRATIONS, "Key-group hand-overs", ("topology", "executor", "role"), registry=r
        )
        self.pause = Histogram(
            Metric.MIGRATION_PAUSE, "Pause of a moving key group", EXECUTOR, buckets=PAUSE_BUCKETS, registry=r
        )
        self.dead_letters = Counter(
            Metric.DEAD_LETTERS,
            "Records sent to the dead-letter stream",
            ("topology", "executor", "operator"),
            registry=r,
        )
        self.scheduling = Counter(
            Metric.SCHEDULING_STEPS,
            "Steps whose input queues exceeded the budget, by the C-MR policy that chose",
            ("topology", "executor", "policy"),
            registry=r,
        )
        self.sink_latency = Histogram(
            Metric.SINK_LATENCY,
            "Wall time from a record's event time to its sink commit",
            ("topology", "executor", "operator"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.member_operator = Gauge(
            Metric.MEMBER_OPERATOR,
            "A fused topology's operator serving a member topology, by the member's name for it",
            ("topology", "operator", "member", "member_operator"),
            registry=r,
        )
        self._cpu_seen: dict[int, float] = {}
        """pid -> CPU seconds already counted."""
        self._wait_seen: dict[tuple[int, int], float] = {}
        """(pid, thread id) -> run-queue wait already counted, seconds (threads come and go)."""
        self._sources: dict[tuple[str, int], tuple[SourcePace, int, int]] = {}
        """Generator unit -> (pace, records emitted, records due already counted)."""
        self._lock = threading.Lock()

    def members(self, members: Mapping[str, Mapping[str, str]], operators: Collection[str]) -> None:
        """A fused topology's members (``contracts.fused_members``): one series per member operator that
        names one of ``operators`` (the annotation is on the resource; the series stay as many as those)."""
        for member, renamed in members.items():
            for name, fused in renamed.items():
                if fused in operators:
                    self.member_operator.labels(self.topology, fused, member, name).set(1)

    def unit(self, metric, op: str, kg: int):
        return metric.labels(self.topology, self.executor, op, str(kg))

    def exec(self, metric):
        return metric.labels(self.topology, self.executor)

    def kg_edge(self, src: str, src_kg: int, dst: str, dst_kg: int):
        return self.kg_records.labels(self.topology, src, str(src_kg), dst, str(dst_kg))

    def source_progress(self, op: str, kg: int, pace: SourcePace, emitted: int) -> None:
        """Record that generator unit (op, kg) has emitted ``emitted`` records in all (its committed count).

        The first call starts the unit's arrivals counter at the records due now (like every counter, it
        counts from when this executor took the unit); :meth:`refresh` does the rest when metrics are read.
        """
        with self._lock:
            if (op, kg) not in self._sources:
                self.unit(self.records_due, op, kg)  # exported from now on, at 0
            _, _, counted = self._sources.get((op, kg), (pace, 0, pace.due(time.time())))
            self._sources[(op, kg)] = (pace, emitted, counted)

    def refresh(self, now: float | None = None) -> None:
        """Bring the generator units' backlog, oldest-record age and arrivals counter to ``now``.

        Called before every exposition: backlog = records due but not emitted (and not held for a window
        end), oldest age = how long ago the first of them came due. Stream-fed units' gauges are the
        executor's (their queue is in Valkey).
        """
        now = time.time() if now is None else now
        with self._lock:
            for (op, kg), (pace, emitted, counted) in self._sources.items():
                due = pace.due(now)
                if due > counted:
                    self.unit(self.records_due, op, kg).inc(due - counted)
                    self._sources[(op, kg)] = (pace, emitted, due)
                # Records held for a window end (SourcePace.released) are on time, not behind.
                backlog = max(0, pace.releasable(now, emitted) - emitted)
                self.unit(self.backlog, op, kg).set(backlog)
                self.unit(self.oldest_age, op, kg).set(
                    max(0.0, now - pace.t0 - pace.event_time(emitted)) if backlog else 0.0
                )

    def forget_unit(self, op: str, kg: int) -> None:
        """Drop a unit's gauges when it moves away (its counters stay: they are monotonic per executor)."""
        with self._lock:
            self._sources.pop((op, kg), None)
        for gauge in (self.state_bytes, self.backlog, self.oldest_age):
            try:
                gauge.remove(self.topology, self.executor, op, str(kg))
            except KeyError:
                pass

    def add_cpu(self, per_process: dict[int, float]) -> None:
        """Advance the CPU counter by what each process of the tree (pid -> its CPU seconds) used since the
        last reading. Per process, so one missing from a reading (it ended, or was not listed) and seen
        again is not counted twice, as a drop and rise of the tree's sum would be."""
        added = sum(max(0.0, used - self._cpu_seen.get(pid, 0.0)) for pid, used in per_process.items())
        self._cpu_seen.update(per_process)
        if added > 0:
            self.exec(self.cpu).inc(added)

    def add_cpu_wait(self, per_thread: dict[tuple[int, int], float]) -> None:
        """Advance the wait counter by what each thread (pid, tid) waited since the last reading; a thread
        seen for the first time counts its whole wait, one missing from a reading is not counted twice."""
        added = sum(max(0.0, w - self._wait_seen.get(t, 0.0)) for t, w in per_thread.items())
        self._wait_seen.update(per_thread)
        if added > 0:
            self.exec(self.cpu_wait).inc(added)


def thread_waits(pids: list[int]) -> dict[tuple[int, int], float]:
    """(pid, thread id) -> seconds the thread was runnable but waited for a CPU, from the kernel's
    ``/proc/<pid>/task/<tid>/schedstat`` (its second field, run-queue delay in nanoseconds). A CPU-throttled
    cgroup's threads stay queued, so throttling shows here too. Empty where the file is missing."""
    out: dict[tuple[int, int], float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                    out[(pid, int(tid))] = int(stat.read().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
    return out


class Probe:
    """What /healthz and /readyz answer: callables evaluated per request."""

    def __init__(self, healthy: Callable[[], bool], ready: Callable[[], bool]):
        self.healthy, self.ready = healthy, ready


LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"
"""Where `streamtopo executor` serves by default: kubelet's probes and Prometheus reach a pod on its IP."""


def serve(metrics: ExecutorMetrics, probe: Probe, port: int, host: str = LOOPBACK) -> ThreadingHTTPServer:
    """Start the exporter in a daemon thread; ``port`` 0 picks a free one (``server.server_port``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                metrics.refresh()
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok = probe.healthy() if path == "/healthz" else probe.ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
