"""The executor program: one process (one pod) running the units a routing table gives it.

    streamtopo executor --topology topology.yaml --routing routing.json \\
        --name ex-0 --transport redis://127.0.0.1:6379 --metrics-port 9400 [--output DIR]

This module is its lifecycle: connect, warm the JVM, heartbeat, loop, shut down. Each turn of the loop

1. re-reads the routing file when it changed, hands units it no longer gives us to their receivers once
   those are ready, starts waiting for units it now gives us, and acquires those whose donor released
   them or died (handover.py, :class:`~streamtopo.runtime.handover.Handover`);
2. runs one *step*, a micro-batch over every hosted unit committed atomically
   (dataflow.py, :class:`~streamtopo.runtime.dataflow.Dataflow`), then updates the metrics.

Any transport error or refused (fenced) commit discards the step: hosted units are reloaded from their
committed records (units taken away meanwhile are dropped) and the step is redone from there; a failure
inside a lazy chain redoes it eagerly (pandas between operators) so bad records can be isolated. The
exactly-once argument is in docs/exactly-once.md.

The JVM is the one thing a retry cannot bring back: once it has gone (runtime/spark.py's ``jvm_lost``),
the loop stops retrying and the process exits with :data:`EXIT_JVM_LOST`, leaving its units as a crash
would, so the platform (the local runner's restart, a pod's restart policy) starts a new process that
resumes from the committed state.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TypedDict

import networkx as nx
import psutil
import redis

from streamtopo.contracts import (
    TRANSPORT_PASSWORD_ENV,
    TRANSPORT_USERNAME_ENV,
    Keys,
    RoutingTable,
    fused_members,
)
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime import sinks
from streamtopo.runtime.combining import Reduction
from streamtopo.runtime.dataflow import Dataflow
from streamtopo.runtime.handover import Handover
from streamtopo.runtime.hosting import ExecutorConfig, Hosted
from streamtopo.runtime.layouts import layouts
from streamtopo.runtime.metrics import (
    ALL_INTERFACES,
    LOOPBACK,
    ExecutorMetrics,
    Probe,
    serve,
    thread_waits,
)
from streamtopo.runtime.operators import build_operators, sharing_groups
from streamtopo.runtime.operators.base import LazyFailure
from streamtopo.runtime.operators.records import clear_scratch
from streamtopo.runtime.pacing import SourceBudget
from streamtopo.runtime.scheduling import Scheduler
from streamtopo.runtime.spark import JvmLost, check_jvm, jvm_lost, warm_up
from streamtopo.runtime.state_store import Fenced, LayoutChanged, StateStore, TransportFull, mark
from streamtopo.runtime.transport import (
    CONNECTION_ERRORS,
    TransportUnavailable,
    connect,
    wait_for_entries,
)

log = logging.getLogger("streamtopo.executor")


class EndpointUnavailable(RuntimeError):
    """The metrics and probe port cannot be bound (another process holds it, or the address is not ours)."""


EXIT_JVM_LOST = 5
"""The executor's JVM (its py4j gateway) is gone: a restart resumes from the committed state."""


class Executor(Handover, Dataflow):
    """The executor of one topology; :meth:`run` loops until ``stop`` is set.

    ``clock`` (wall seconds) is every time the executor reads: source pacing, watermark punctuation,
    hand-over waits and pauses, busy time, latency; tests and simulations may pass their own.
    """

    def __init__(
        self,
        topology: StreamTopology,
        routing_path: Path,
        name: str,
        transport_url: str,
        *,
        metrics_port: int = 0,
        port_file: Path | None = None,
        output_dir: Path | None = None,
        cpu: float = 1.0,
        config: ExecutorConfig | None = None,
        clock: Callable[[], float] = time.time,
        bind: str = LOOPBACK,
    ):
        self.clock = clock
        self.topology = topology
        self.spec = topology.spec
        self.name = name
        self.routing_path = Path(routing_path)
        self.transport_url = transport_url
        self.output_dir = Path(output_dir) if output_dir else None
        self.config = config or ExecutorConfig()
        self.instance = f"{name}-{os.getpid()}-{secrets.token_hex(3)}"
        # Operators are built before anything starts: a UDF that does not import fails here, clearly.
        self.sharing = sharing_groups(self.spec) if self.config.share_panes else []
        self.operators = build_operators(self.spec, self.sharing)
        self.layouts = layouts(self.spec, self.sharing)
        """Operator -> digest of its state layout, checked against each unit's record on acquisition."""
        dag = nx.DiGraph()
        dag.add_nodes_from(op.name for op in self.spec.operators)
        dag.add_edges_from((u, op.name) for op in self.spec.operators for u in op.inputs)
        self.order = list(nx.lexicographical_topological_sort(dag))
        self.downstream = {n: sorted(dag.successors(n)) for n in self.order}
        self.scheduler = Scheduler(
            self.downstream, self.config.scheduling, self.config.step_records, self.config.memory_limit
        )
        self._dests: dict[str, dict[int, dict[str, list[int]]]] = {}
        self.reductions: defaultdict[tuple[str, str], Reduction] = defaultdict(
            lambda: Reduction(self.config.combine_min_records, self.config.combine_ratio)
        )
        self._producers: dict[str, dict[int, list[str]]] = {}
        self._closes: dict[str, tuple[tuple[float, float], ...]] = {}
        self.keys = Keys.of(topology)
        self.metrics = ExecutorMetrics(topology.metadata.name, name)
        self.metrics.members(fused_members(topology.metadata.model_dump()), self.spec.by_name())
        self.metrics.exec(self.metrics.capacity).set(cpu)
        self.metrics_port = metrics_port
        self.port_file = port_file
        """Where the bound port is written once the endpoints listen (a local platform reads it)."""
        self.bind = bind
        """Address /metrics, /healthz and /readyz listen on (loopback in process; a pod binds all)."""
        self.hosted: dict[str, Hosted] = {}
        self.waiting: dict[str, float] = {}
        self.leaving: dict[str, tuple[str | None, float, int]] = {}
        """Units the routing moved away, still run here until their receiver is ready (receiver, since)."""
        self._warm = False
        self.routing: RoutingTable | None = None
        self._routing_mtime = 0.0
        self._last_punct: dict[tuple[str, str], float] = {}
        self._last_metrics = 0.0
        self._last_loop = self.clock()
        self._connected = False
        self.client = None
        self.t0 = 0.0
        self.spark = None
        self.server: ThreadingHTTPServer | None = None
        self._closed = threading.Event()
        self._whole_stage: bool | None = None
        """Whether Spark generates code for whole stages now (set per step, see Dataflow._plan_for)."""
        self.small_step = False
        """Whether this step has few records (Dataflow._plan_for)."""
        self.eager = False
        """Set after a lazy step failed: the redo materialises every operator's output (see LazyFailure)."""
        self.pacing = SourceBudget(self.config.pacing)
        """How many due records each step's generators take (runtime/pacing.py)."""
        self.behind = False
        self.kept_up = False
        """Whether the last step with work took everything due and queued (Dataflow.step): what the next
        step finds queued then came during the pause, and it reads all of it (Inputs._allotments)."""

    # ---------------------------------------------------------------------------------------- start

    def start(self) -> None:
        """Connect (with retries), start the exporter, the heartbeat and Spark."""
        from streamtopo.runtime.spark import get_spark

        self.client = connect(self.transport_url, log=log.warning, **transport_credentials())
        self.store = StateStore(self.client, self.keys)
        self._connected = True
        try:
            self.server = serve(self.metrics, Probe(self._healthy, self._ready), self.metrics_port, self.bind)
        except OSError as error:  # a port another process holds: a restart may find it free
            raise EndpointUnavailable(
                f"cannot serve metrics and probes on {self.bind}:{self.metrics_port}: {error.strerror or error}"
            ) from error
        if self.port_file is not None:
            written = self.port_file.with_name(self.port_file.name + ".tmp")
            written.write_text(str(self.server.server_port))
            os.replace(written, self.port_file)  # whole or absent: never a half-written port
        self.store.heartbeat(self.instance, self.config.heartbeat_ttl)
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        self.spark = get_spark()
        warm_up(self.spark)
        # The generators' event time starts when the first executor can run a step, not at its connect: a
        # JVM that takes a minute to start would otherwise find a minute of records due at once.
        mark(self.client, self.keys.clock, repr(self.clock()).encode(), once=True)
        self.t0 = float(self.client.get(self.keys.clock))
        self._warm = True

    def _healthy(self) -> bool:
        return self.clock() - self._last_loop < 120.0

    def _ready(self) -> bool:
        return self._connected and self.routing is not None and not self.waiting

    def _heartbeat(self) -> None:
        client = None
        while not self._closed.is_set():
            try:
                client = client or connect(self.transport_url, attempts=1, **transport_credentials())
                ttl = self.config.heartbeat_ttl
                mark(client, self.keys.heartbeat(self.instance), b"1", ttl=ttl)
                if self._warm:
                    mark(client, self.keys.ready(self.name), self.instance.encode(), ttl=ttl)
            except (TransportUnavailable, *CONNECTION_ERRORS):
                client = None
            except redis.exceptions.ResponseError as error:  # e.g. a restarted Valkey without the library:
                log.warning("heartbeat: %s (retrying)", error)  # a dead heartbeat thread gives units away
            self._closed.wait(self.config.heartbeat_ttl / 4)

    # ----------------------------------------------------------------------------------------- loop

    def run(self, stop: threading.Event, release: bool = True) -> None:
        """Step until ``stop`` is set, then :meth:`close`. A failure that ends the loop stops the heartbeat
        first, as the process's exit would: the units expire and another executor takes them."""
        try:
            self._loop(stop)
        except BaseException:
            self._closed.set()
            raise
        clear_scratch()
        self.close(release)

    def _loop(self, stop: threading.Event) -> None:
        delay = 0.25
        while not stop.is_set():
            self._last_loop = self.clock()
            if self._warm:
                check_jvm()  # every failure below is retried; a dead JVM is not, whichever it caused
            try:
                self._apply_routing()
                self._release_leaving()
                self._acquire_waiting()
                began = self.clock()
                outcome = self.step()
                delay = 0.25
                if not outcome.work:
                    self._idle(stop)
                else:
                    self._pause(stop, began)
            except Fenced as error:
                log.warning("%s: commit refused, reloading: %s", self.name, error)
                self._recover()
            except TransportFull as error:
                # Nothing of the step was written: wait for consumers to drain the account, then redo it.
                log.warning(
                    "%s: the transport refused the step (%s); retrying in %.2gs", self.name, error, delay
                )
                self._recover()
                stop.wait(delay)
                delay = min(5.0, delay * 2)
            except LazyFailure as error:
                log.warning(
                    "%s: a lazy step failed (%s); redoing it eagerly to isolate the records", self.name, error
                )
                self._recover()
                self.eager = True
            except CONNECTION_ERRORS as error:
                check_jvm(error)  # py4j's refused connection to a dead JVM is no transport failure
                self._connected = False
                log.warning("%s: transport lost (%s); retrying in %.2gs", self.name, error, delay)
                stop.wait(delay)
                delay = min(5.0, delay * 2)
                try:
                    self.client.ping()
                    self._connected = True
                    self._recover()
                    log.warning("%s: transport back, resumed from the last commit", self.name)
                except CONNECTION_ERRORS:
                    pass
            self._update_metrics()

    def _pause(self, stop: threading.Event, began: float) -> None:
        """After a step with work that kept up, wait before the next (Spark's processing-time trigger):
        stepping again at once, the executor pays a step's fixed cost (planning its jobs) for a sliver of
        records, a whole core at any rate it keeps up with. The next step starts ``spec.batching.interval``
        after this one began, or sooner where steps are quick: at most ``1 / busy_share`` times this
        step's length after it began, so a light pipeline keeps its sub-second latency while the fixed
        cost stays within ``busy_share`` of the executor's time. No pause while the step was
        :attr:`behind`, units move (a hand-over waits for our steps) or the end of a finite input is
        passing through (:attr:`finishing`); a new routing ends it (looked for every ``idle_sleep`` x 5,
        a ``stat``)."""
        if self.behind or self.waiting or self.leaving or self.finishing:
            return
        took = self.clock() - began
        deadline = began + min(self.spec.batching.interval, took / self.config.busy_share)
        while (left := deadline - self.clock()) > 0 and not self._routing_changed():
            if stop.wait(min(left, 5 * self.config.idle_sleep)):
                return

    @property
    def finishing(self) -> bool:
        """Whether a hosted unit has heard end of stream from one producer and still waits for another's.

        Its last records then come in the producers' last steps, and a pause would hold each of them up
        to ``interval`` per executor they pass: a finite run of two executors took 1.6x one's wall time
        (docs/benchmarks.md, "Peers at 1 and 2 executors after the JIT change"). Without the pause the
        next step runs at once or, without work, :meth:`_idle` blocks until the entries arrive. A unit
        that reads one finite and one unbounded input stays finishing, and its executor steps as it did
        before the interval."""
        return any(
            unit.rec.watermark != math.inf
            and any(wm == math.inf for producer, wm in unit.rec.wm_in.items() if producer != "*")
            for unit in self.hosted.values()
        )

    def _idle(self, stop: threading.Event) -> None:
        """Wait after a step without work. Only new entries can bring work once no unit moves and every
        hosted generator has ended: block on the input streams for them (an idle executor polling every
        20 ms took 6-8 % of a core); otherwise (generators come due with time, hand-overs) sleep briefly."""
        moving = self.waiting or self.leaving
        generating = any(self._generates(u.op) and u.rec.watermark != math.inf for u in self.hosted.values())
        if moving or generating:
            stop.wait(self.config.idle_sleep)
            return
        after = {
            stream: unit.rec.offsets.get(stream, "0-0")
            for unit in self.hosted.values()
            for stream in self._input_streams(unit)
        }
        if after:
            wait_for_entries(self.client, after, self.config.idle_block)
        else:
            stop.wait(self.config.idle_block)

    def close(self, release: bool = True) -> None:
        """Stop heartbeating and serving; ``release`` hands every unit over at once (a clean shutdown).

        Without ``release`` the units stay owned until the heartbeat expires, as after a crash.
        """
        if release:
            try:
                for key, unit in list(self.hosted.items()):
                    self.store.release(key, unit.epoch)
                    self.hosted.pop(key)
            except (Fenced, *CONNECTION_ERRORS) as error:
                log.warning("%s: could not release every unit at shutdown: %s", self.name, error)
        self._closed.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # --------------------------------------------------------------------------------------- metrics

    def _update_metrics(self) -> None:
        now = self.clock()
        if now - self._last_metrics < self.config.metrics_interval:
            return
        self._last_metrics = now
        try:
            proc = psutil.Process()
            procs = [proc, *proc.children(recursive=True)]
            self.metrics.add_cpu({p.pid: p.cpu_times().user + p.cpu_times().system for p in procs})
            self.metrics.add_cpu_wait(thread_waits([p.pid for p in procs]))
            self.metrics.exec(self.metrics.memory).set(sum(p.memory_info().rss for p in procs))
        except psutil.Error:
            pass
        if not self._connected or not self.hosted:
            return
        try:
            streams = {
                key: [self.keys.stream(u, unit.op, unit.kg) for u in self.spec.operator(unit.op).inputs]
                for key, unit in self.hosted.items()
            }
            flat = [s for ss in streams.values() for s in ss]
            counts = dict(zip(flat, self.client.hmget(self.keys.backlog, flat))) if flat else {}
        except CONNECTION_ERRORS:
            return
        for key, unit in self.hosted.items():
            if streams[key]:
                backlog = sum(int(counts.get(s) or 0) for s in streams[key])
                self.metrics.unit(self.metrics.backlog, unit.op, unit.kg).set(max(0, backlog))
            self.metrics.unit(self.metrics.state_bytes, unit.op, unit.kg).set(len(unit.rec.state))


class Credentials(TypedDict):
    username: str | None
    password: str | None


def transport_credentials() -> Credentials:
    """The transport's ACL user and password from the environment (secretKeyRefs on Kubernetes).

    Passed to the client, never put into the URL, so no log line or error message can carry them.
    """
    return Credentials(
        username=os.environ.get(TRANSPORT_USERNAME_ENV) or None,
        password=os.environ.get(TRANSPORT_PASSWORD_ENV) or None,
    )


def run_executor(
    topology_path: Path,
    routing_path: Path,
    name: str,
    transport_url: str,
    *,
    metrics_port: int = 0,
    port_file: Path | None = None,
    output_dir: Path | None = None,
    cpu: float = 1.0,
    bind: str = ALL_INTERFACES,
    termination_log: Path | None = None,
) -> int:
    """The ``streamtopo executor`` program; returns the exit code (clear messages, no tracebacks): 2 a bad
    pipeline or a step Spark's ANSI mode fails (an overflowing sum, a join's output over its memory:
    nothing of it is committed, so the records wait for a fixed spec), 3 no transport or a metrics port it
    cannot bind, 4 a file sink that cannot write (retrying cannot fix 2 or 4), 5 (:data:`EXIT_JVM_LOST`)
    the JVM has gone (the OOM killer, a crash: a restart resumes from the last commit). The reason is also
    written to ``termination_log`` (Kubernetes' termination message)."""
    code, reason = _run(
        topology_path, routing_path, name, transport_url, metrics_port, port_file, output_dir, cpu, bind
    )
    if code and termination_log is not None:
        with suppress(OSError):  # no file to say it in: the log line above says it
            termination_log.write_text(reason[:4000])
    return code


def _run(
    topology_path: Path,
    routing_path: Path,
    name: str,
    transport_url: str,
    metrics_port: int,
    port_file: Path | None,
    output_dir: Path | None,
    cpu: float,
    bind: str,
) -> tuple[int, str]:
    """:func:`run_executor`'s work: the exit code and, for a failure, its one-line reason (also logged)."""
    from streamtopo.documents import load_topology
    from streamtopo.planner.model import TopologyError
    from streamtopo.runtime.operators import OperatorError
    from streamtopo.runtime.operators.udf import UDF_PATH_ENV, extend_import_path

    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    extend_import_path(os.environ.get(UDF_PATH_ENV, "").split(os.pathsep))
    try:
        topology = load_topology(topology_path)
        executor = Executor(
            topology,
            routing_path,
            name,
            transport_url,
            metrics_port=metrics_port,
            port_file=port_file,
            output_dir=output_dir,
            cpu=cpu,
            bind=bind,
        )
        if output_dir is not None:
            sinks.check_outputs(topology.spec, output_dir)
    except sinks.SinkWriteError as error:
        return _failed(4, str(error))
    except TopologyError as error:
        return _failed(2, f"invalid topology {topology_path}:\n{error}")
    except OperatorError as error:
        return _failed(2, f"cannot build the pipeline: {error}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        executor.start()
    except (TransportUnavailable, EndpointUnavailable) as error:
        return _failed(3, str(error))
    try:
        executor.run(stop)
    except Exception as error:
        # Whatever the JVM's death looked like from here (a py4j error, a reset connection, an operator
        # whose Spark call failed), it is the JVM's: exit for a restart, not on the failure's own terms.
        lost = error if isinstance(error, JvmLost) else jvm_lost(error)
        if lost is not None:
            executor.close(release=False)  # as a crash: the restart resumes from the last commit
            return _failed(EXIT_JVM_LOST, f"{lost}; exiting, a restart resumes from the last commit")
        if isinstance(error, (OperatorError, LayoutChanged)):  # a missing column, an ANSI failure, a layout
            executor.close()
            return _failed(2, f"cannot run the pipeline: {error}")
        if isinstance(error, sinks.SinkWriteError):  # committed, not written: the next owner writes it
            executor.close()
            return _failed(4, str(error))
        raise
    return 0, ""


def _failed(code: int, reason: str) -> tuple[int, str]:
    log.error("%s", reason)
    return code, reason
