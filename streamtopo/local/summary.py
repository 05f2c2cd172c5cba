"""What ``streamtopo run`` reports when it ends: the run's figures (:class:`RunSummary`) and how they are
printed (sinks' totals, pauses, recoveries, capacity, the loop's decisions, each file sink's latest records)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streamtopo.local.upgrade import Edit
from streamtopo.planner.capacity import Shortfall
from streamtopo.runtime.handover import Pause


@dataclass(frozen=True)
class SinkSample:
    """A file sink's latest records, and the directory of its key groups' files."""

    directory: Path
    records: list[dict[str, Any]]


@dataclass
class RunSummary:
    finished: bool
    seconds: float
    sinks: dict[str, dict[str, int]]
    """Sink operator -> {"in": records received, "out": records written}."""
    migrations: int = 0
    kills: int = 0
    crashes: list[str] = field(default_factory=list)
    """Executors restarted after their JVM was lost or they were SIGKILLed, and how each ended."""
    pauses: list[Pause] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)
    """Per unit of a killed executor: seconds from the kill to a live executor holding it again."""
    unrecovered: int = 0
    """Units of killed executors that no executor held again before the run ended."""
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
    profiles: list[str] = field(default_factory=list)
    """The loop's ProfileIteration messages (COLA on measured costs: PEs, executors, U, C, moves)."""
    periods: int = 0
    """SPL periods the loop ran (skipped ones included)."""
    output: Path | None = None
    """Directory file sinks wrote to."""
    unready: list[str] = field(default_factory=list)
    """Executors not yet running (JVM started and warm) when the run ended: it ended during warm-up."""
    records: dict[str, SinkSample] = field(default_factory=dict)
    """File sink -> its latest records (``RunOptions.sample_records``), for the summary to show."""
    upgrades: list[Edit] = field(default_factory=list)
    """What each change of the watched file did (applied, with what was kept and reset, or refused)."""
    hosts: str = ""
    """The hosts the run had, as the summary names them (``vm: 2 cores``)."""
    declared: Shortfall | None = None
    """The declared rates against the hosts' room (the plan's capacity figures)."""
    measured: Shortfall | None = None
    """The adaptation loop's last capacity figures from measured rates."""
    most_executors: int = 0
    """The most executors that ran at once."""
    first_records: float | None = None
    """Seconds from the start until the sources had emitted their first records."""
    cpu_seconds: float | None = None
    """CPU-seconds of every process the run started and waited for (executors, their JVMs, the embedded
    Valkey), the topologies of one run together."""
    interrupted: bool = False
    """Stopped by Ctrl-C or SIGTERM: the run caught the signal to tear down and print this summary, so a
    program calling it (a benchmark) learns here that it was asked to stop, too."""

    def pause_stats(self, kind: str | None = None) -> tuple[float, float, float] | None:
        """(p50, p99, max) seconds of the pauses of ``kind`` (all kinds if None); p99 interpolated
        between the two nearest pauses, so with fewer than 100 it lies just under the largest."""
        values = [p.seconds for p in self.pauses if kind is None or p.kind == kind]
        if not values:
            return None
        p99 = statistics.quantiles(values, n=100, method="inclusive")[-1] if len(values) > 1 else values[0]
        return statistics.median(values), p99, max(values)


def print_summary(summary: RunSummary, console: Console) -> None:
    """Sinks' totals, how the run ended, pauses, the loop's decisions, each file sink's latest records."""
    table = Table(title="streamtopo run: summary")
    table.add_column("sink")
    table.add_column("records in", justify="right")
    table.add_column("records out", justify="right")
    for name, counts in summary.sinks.items():
        table.add_row(name, f"{counts['in']:,}", f"{counts['out']:,}")
    console.print(table)
    status = (
        "finished (end of stream)"
        if summary.finished
        else "interrupted (Ctrl-C or SIGTERM)"
        if summary.interrupted
        else "stopped"
    )
    console.print(
        f"{status} after {summary.seconds:.1f}s; routing version {summary.routing_version}; "
        f"drill migrations {summary.migrations}; kills {summary.kills}; backlog {summary.backlog:,} records "
        f"({summary.source_backlog:,} due at generators, not yet generated)"
    )
    for crash in summary.crashes:
        console.print(f"restarted after a crash: {crash}")
    stats = summary.pause_stats("released")
    if stats:
        console.print(
            f"hand-over pauses: p50 {stats[0]:.3f}s, p99 {stats[1]:.3f}s, max {stats[2]:.3f}s "
            f"({sum(p.kind == 'released' for p in summary.pauses)})"
        )
    if summary.kills:
        console.print(recovery_line(summary), highlight=False, soft_wrap=True)
    for line in capacity_lines(summary):
        console.print(line, highlight=False, soft_wrap=True)
    if summary.periods:
        console.print(
            f"adaptation loop: {summary.periods} periods, {len(summary.profiles)} profiling iterations, "
            f"{len(summary.rebalances)} rebalances, {len(summary.scalings)} scaling decisions",
            soft_wrap=True,
        )
        for label, messages in (
            ("profiling", summary.profiles),
            ("rebalance", summary.rebalances),
            ("scaling", summary.scalings),
        ):
            for i, message in enumerate(messages, 1):
                console.print(f"  {label} {i}: {message}", highlight=False, soft_wrap=True)
    if summary.output is not None:
        console.print(
            f"file sinks: {summary.output}/<sink>/kg-NNNN.jsonl (JSON lines)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for name, sample in summary.records.items():
        total = summary.sinks.get(name, {}).get("out", 0)
        console.print(
            f"{name}: latest {len(sample.records)} of {total:,} records, by event time "
            f"(all in {sample.directory}/)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if sample.records:
            console.print(records_table(sample.records))
    for i, edit in enumerate(summary.upgrades, 1):
        console.print(f"spec change {i}: {escape(edit.message)}", highlight=False, soft_wrap=True)
    if summary.unready and not summary.failed:
        console.print(
            f"[red]the run ended during warm-up: executor(s) {', '.join(summary.unready)} were "
            f"not running yet after {summary.seconds:.1f}s (each starts and warms up a JVM first, "
            "tens of seconds on a busy machine), so the pipeline did not fully run; give a longer "
            "--duration[/red]",
            highlight=False,
            soft_wrap=True,
        )
    if summary.failed:
        console.print(f"[red]{escape(summary.failed)}[/red]", highlight=False, soft_wrap=True)


def capacity_lines(summary: RunSummary) -> list[str]:
    """What the machine gave the run and what the declared (and measured) rates would need."""
    lines = []
    if summary.hosts:
        first = "" if summary.first_records is None else f"; first records after {summary.first_records:.0f}s"
        lines.append(f"hosts: {summary.hosts}; at most {summary.most_executors} executors ran at once{first}")
    if summary.cpu_seconds is not None:
        lines.append(
            f"CPU: {summary.cpu_seconds:,.1f} CPU-seconds in the run's processes (executors, Valkey)"
        )
    for figures in (summary.declared, summary.measured):
        if figures is not None and figures.exhausted:
            lines.append(f"capacity exhausted: {figures.message()}")
        elif figures is not None and not figures.measured:
            lines.append(
                f"capacity: the declared rates need {figures.demand:.2f} cores of work, "
                f"{figures.executors_wanted} executors; the hosts have room for them"
            )
    return lines


def recovery_line(summary: RunSummary) -> str:
    """Recovery after kills, measured from the kill -9 to the killed units held again (local/drills.py)."""
    line = "recovery pauses (kill -9 -> the killed executor's units held again, state loaded): "
    if summary.recoveries:
        line += (
            f"p50 {statistics.median(summary.recoveries):.1f}s, max {max(summary.recoveries):.1f}s "
            f"({len(summary.recoveries)} units)"
        )
    else:
        line += "none completed"
    if summary.unrecovered:
        line += f"; {summary.unrecovered} units not yet held again when the run ended"
    return line


def records_table(records: list[dict[str, Any]]) -> Table:
    """Records as a table, one column per field (floats to 6 significant digits)."""
    table = Table()
    columns = list(dict.fromkeys(k for r in records for k in r))
    for column in columns:
        table.add_column(column, justify="left" if isinstance(records[0].get(column), str) else "right")
    for record in records:
        table.add_row(*(_cell(record.get(c)) for c in columns))
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else escape(str(value))
