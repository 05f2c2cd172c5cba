"""`streamtopo run FILE...`: run StreamTopologies on this machine (embedded Valkey, local executors); several files
run together as one dataflow with their common sub-trees computed once (planner/benoit/fuse.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from streamtopo.local.summary import RunSummary
    from streamtopo.local.testbed import EmulatedHostsSpec
    from streamtopo.planner.benoit.fuse import Fusion
    from streamtopo.planner.model import StreamTopology


def run(
    files: list[Path] = typer.Argument(
        ...,
        help="StreamTopology YAML file; several run together, their "
        "common sub-trees computed once (docs/sharing.md).",
    ),
    duration: float | None = typer.Option(
        None,
        "--duration",
        help="Stop after this many seconds (default: until finite sources end, or Ctrl-C).",
    ),
    executors: int | None = typer.Option(
        None,
        "--executors",
        min=1,
        help="Executors, each of one core (default: COLA's PEs split up to Aeolus' count, within the "
        "hosts' room).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Directory of file sinks "
        "(default: ./streamtopo-output/<topology name>; with several "
        "files, <output>/<topology name>).",
    ),
    no_share: bool = typer.Option(
        False,
        "--no-share",
        help="With several files: run each whole, computing "
        "nothing once (the baseline sharing is measured against).",
    ),
    migrate_every: float | None = typer.Option(
        None, "--migrate-every", min=0.1, help="Drill: move a random key group every S seconds."
    ),
    kill_every: float | None = typer.Option(
        None,
        "--kill-every",
        min=0.5,
        help="Drill: kill -9 a random executor (restarted); the next one S seconds after it runs again.",
    ),
    hosts: int | None = typer.Option(
        None,
        "--hosts",
        min=1,
        help="Hosts of the local cluster [default: this machine, its cores and memory].",
    ),
    host_cpu: float | None = typer.Option(
        None, "--host-cpu", min=0.1, help="CPU cores per host [default: this machine's]."
    ),
    testbed: Path | None = typer.Option(
        None,
        "--testbed",
        help="Run on emulated hosts made from this cluster file (network namespaces, CPU quotas, shaped "
        "links; needs root; docs/testbed.md) instead of this machine's processes.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the drills' random choices and of the planner."),
    autoscale: bool | None = typer.Option(
        None,
        "--autoscale/--no-autoscale",
        show_default=False,
        help="Run the SPL adaptation loop (ALBIC rebalancing + scaling) [default: spec.autoscaling.enabled].",
    ),
    profile_iterations: int | None = typer.Option(
        None,
        "--profile-iterations",
        min=0,
        max=20,
        help="COLA's profiling loop: run NONE first, then re-plan on the measured costs N times, one per "
        "SPL, gamma 0.5 -> 1.0 [default: spec.fusion.profileIterations].",
    ),
    interval: float | None = typer.Option(
        None,
        "--interval",
        min=1.0,
        help="SPL of this run in seconds [default: spec.autoscaling.interval, "
        "capped at duration / 6, at least 5].",
    ),
    rate_scale: float = typer.Option(
        1.0,
        "--rate-scale",
        min=0.0001,
        help="Multiply every source's ratePerSecond (and declared costs) by F.",
    ),
    source_seconds: float | None = typer.Option(
        None,
        "--source-seconds",
        min=0.1,
        help="Generators stop after S seconds of records (count = rate x S): the run drains and ends at end "
        "of stream.",
    ),
    watch: bool = typer.Option(
        False,
        "--watch",
        help="Apply edits of FILE to the running topology as the operator applies a spec change: state is "
        "kept, reset (spec.upgrade.mode: resetState) or the change is refused naming the field (docs/operator.md).",
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Show Spark's own output and WARN logs (the "
        "check's JVM here, the executors' in their logs) instead of ERROR only.",
    ),
) -> None:
    """Plan and run the pipeline locally with live progress; print a summary at the end."""
    from rich.console import Console
    from rich.markup import escape

    from streamtopo.controller.plan_output import EXIT_NO_PLAN, render_run_plan
    from streamtopo.local.loop import local_loop
    from streamtopo.local.runner import RunOptions, run_topologies
    from streamtopo.local.start import NoRoom
    from streamtopo.local.summary import print_summary
    from streamtopo.planner.placement.cola import NoValidPlan
    from streamtopo.runtime import class_archive
    from streamtopo.runtime.operators.udf import extend_import_path

    console = Console()
    if watch and len(files) != 1:
        console.print("[red]error:[/red] --watch applies the changes of one topology's file: run one file")
        raise typer.Exit(2)
    udf_dirs = tuple(dict.fromkeys(f.resolve().parent for f in files))  # UDF modules next to the files
    extend_import_path(udf_dirs)
    if class_archive.missing():
        console.print(
            "writing Spark's class archive for faster executor starts (once, about 15 s)", style="dim"
        )
    try:
        bed = _testbed(testbed, hosts, host_cpu)
        prepared = _prepare(files, output, no_share=no_share, verbose=verbose)
    except _BadInput as error:
        console.print(
            f"[red]error:[/red] {escape(error.where)}:\n{escape(error.message)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    if prepared.note:
        console.print(prepared.note, highlight=False, soft_wrap=True)
    if prepared.fusion is not None:
        console.print(shares(prepared.fusion), highlight=False, soft_wrap=True)
    options = RunOptions(
        duration=duration,
        executors=executors,
        output=output,
        migrate_every=migrate_every,
        kill_every=kill_every,
        hosts=hosts,
        host_cpu=host_cpu,
        testbed=bed,
        seed=seed,
        autoscale=autoscale,
        profile_iterations=profile_iterations,
        interval=interval,
        rate_scale=rate_scale,
        verbose=verbose,
        udf_dirs=udf_dirs,
        source_seconds=source_seconds,
        live=console.is_terminal,
        progress_every=None if console.is_terminal else 5.0,
        show_plan=lambda plan, routing: render_run_plan(plan, routing, console),
        adaptation=local_loop,
        watch=files[0] if watch else None,
    )
    try:
        summaries = run_topologies(prepared.topologies, options, console, prepared.outputs)
    except NoRoom as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except NoValidPlan as error:
        where = (
            str(testbed)
            if testbed
            else "--hosts/--host-cpu"
            if hosts or host_cpu
            else "this machine, one host of its cores"
        )
        console.print(
            f"[red]error:[/red] {escape(str(error))} (the run's hosts: {where}, without labels; "
            "`streamtopo plan FILE --cluster CLUSTER.yaml` plans on labelled hosts)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_NO_PLAN) from None
    for name, summary in summaries.items():
        if len(summaries) > 1:
            console.rule(name)
        elif prepared.fusion is not None:
            console.rule(f"{name}: {', '.join(prepared.fusion.members)}")
        print_summary(summary, console)
    if prepared.fusion is not None:
        summary = summaries[prepared.fusion.topology.metadata.name]
        for line in [*by_member(prepared.fusion, summary), saving(prepared.fusion, summaries)]:
            console.print(line, highlight=False, soft_wrap=True)
    # Ending during warm-up is a failure too: the pipeline did not run, whatever the duration asked for.
    raise typer.Exit(1 if any(s.failed or s.unready for s in summaries.values()) else 0)


def _testbed(path: Path | None, hosts: int | None, host_cpu: float | None) -> EmulatedHostsSpec | None:
    """The ``--testbed`` file, validated, on a machine that can build it: refused before anything starts."""
    from streamtopo.local.testbed import load_hosts, unavailable
    from streamtopo.planner.model import TopologyError

    if path is None:
        return None
    if hosts or host_cpu:
        raise _BadInput("--testbed", "the file gives the hosts: leave out --hosts and --host-cpu")
    try:
        spec = load_hosts(path)
    except TopologyError as error:
        raise _BadInput(str(path), str(error)) from None
    if reason := unavailable():
        raise _BadInput("--testbed", reason)
    return spec


class _BadInput(Exception):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


@dataclass
class _Prepared:
    topologies: list[StreamTopology]
    """What runs: the files' topologies, or their fusion, or a shared part and its consumers."""
    outputs: dict[str, Path | None]
    """Each one's file-sink directory."""
    fusion: Fusion | None = None
    note: str | None = None
    """Why several files that share operators do not run fused."""


def _prepare(files: list[Path], output: Path | None, *, no_share: bool, verbose: bool) -> _Prepared:
    """Load and check the files, each as it would run alone (errors name the file and its own operators).
    With several, their common operators are computed once (unless ``no_share``): in one dataflow of all
    of them (planner/benoit/fuse.py), or, where their union is not a valid topology, in a shared part whose
    named streams the others read (planner/benoit/split.py)."""
    from streamtopo.documents import load_topology
    from streamtopo.local.runner import check_pipeline, output_dir
    from streamtopo.planner.benoit.fuse import fuse_shared
    from streamtopo.planner.benoit.split import split_shared
    from streamtopo.planner.benoit.topologies import stream_cycles
    from streamtopo.planner.model import TopologyError

    loaded = []
    for file in files:
        try:
            topology = load_topology(file)
        except TopologyError as error:
            raise _BadInput(str(file), str(error)) from None
        if topology.spec.suspend:
            raise _BadInput(
                str(file),
                "spec.suspend: the topology is suspended (no executor runs); set it to false to run it",
            )
        loaded.append(topology)
    names = [t.metadata.name for t in loaded]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _BadInput("metadata.name", f"{', '.join(twice)} given twice: each topology runs once")
    cycles = stream_cycles(loaded) if len(loaded) > 1 else []
    if cycles:
        raise _BadInput("streams", f"topologies feed each other in a cycle: {cycles[0]}")
    alone: dict[str, Path | None] = {}
    for topology, file in zip(loaded, files):
        name = topology.metadata.name
        alone[name] = output_dir(topology, output if len(loaded) == 1 or output is None else output / name)
        try:
            check_pipeline(topology, alone[name], verbose=verbose)
        except ValueError as error:
            raise _BadInput(str(file), str(error)) from None
    if len(loaded) == 1 or no_share:
        return _Prepared(loaded, alone)
    try:
        fusion = fuse_shared(loaded)
    except TopologyError as error:
        split = split_shared(loaded)
        parts = ([split.shared] if split.shared else []) + split.consumers
        outputs = {t.metadata.name: alone.get(t.metadata.name) for t in parts}
        note = f"the files do not run as one dataflow ({error}); the shared part runs on its own"
        return _Prepared(parts, outputs, note=note)
    if fusion is None:
        return _Prepared(loaded, alone)
    fused = fusion.topology
    root = output if output is not None else Path("streamtopo-output")
    return _Prepared([fused], {fused.metadata.name: output_dir(fused, root)}, fusion)


def shares(fusion: Fusion) -> str:
    """What a fused run computes once, and for whom."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for op, members in fusion.shared.items():
        groups.setdefault(tuple(members), []).append(op)
    parts = [f"{', '.join(ops)} computed once for {', '.join(members)}" for members, ops in groups.items()]
    return (
        f"sharing: {'; '.join(parts)}; one dataflow, {fusion.topology.metadata.name}, runs every topology's "
        "operators in the same executors (their own named <topology>-<operator>)"
    )


def by_member(fusion: Fusion, summary: RunSummary) -> list[str]:
    """Each fused topology's own outputs: its sinks under their own names, their records, and where its
    file sinks wrote (as running it alone writes them)."""
    lines = []
    for topology in fusion.originals:
        member, renamed = topology.metadata.name, fusion.members[topology.metadata.name]
        sinks = []
        for op in topology.spec.operators:
            if op.kind == "sink":
                counts = summary.sinks.get(renamed[op.name], {"in": 0, "out": 0})
                sinks.append(f"{op.name} {counts['in']:,} in, {counts['out']:,} out")
        files = any(op.sink is not None and op.sink.file is not None for op in topology.spec.operators)
        where = f"; files in {summary.output / member}" if files and summary.output is not None else ""
        lines.append(f"{member}: {'; '.join(sinks) or 'no sinks'}{where}")
    return lines


def saving(fusion: Fusion, summaries: Mapping[str, RunSummary]) -> str:
    """The CPU-seconds the fused run took against what the plan's cost model (Aeolus' CPU demand at the
    declared rates) puts on running the topologies apart: the measured figure scaled by the demands'
    ratio. Each topology run apart would also start its own executors (a JVM and a Spark session each),
    which the model does not count, so the estimate is low."""
    from streamtopo.planner.scaling.aeolus import aeolus_plan

    fused = aeolus_plan(fusion.topology.spec).demand
    apart = sum(aeolus_plan(t.spec).demand for t in fusion.originals)
    cpu = summaries[fusion.topology.metadata.name].cpu_seconds
    if cpu is None or fused <= 0:
        return "sharing: no CPU-seconds measured"
    return (
        f"sharing: {cpu:,.1f} CPU-seconds with the shared operators computed once; apart, the plan's cost "
        f"model puts {apart / fused:.2f}x the work on them, about {cpu * apart / fused:,.1f} CPU-seconds, "
        f"before {len(fusion.members) - 1} more topologies' executor starts"
    )


def register(app: typer.Typer) -> None:
    app.command("run")(run)
