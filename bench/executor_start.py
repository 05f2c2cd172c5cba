"""What an executor costs before and between its work (issue 33, item 5): start and idle.

One executor (a real process, as ``streamtopo run`` and a pod start it) hosts every unit of a small
generated pipeline (tests/runtime/runtime_support.sequence_topology: 100 records); the bench measures

- ready: seconds from its process start until it reports ready (JVM started and warmed, routing read),
  and the CPU-seconds its process tree used until then;
- first step: seconds from its process start until its first commit (the source unit's first records);
- idle: the share of a core its process tree uses once its input has ended and it waits, after a settling
  period (the JIT compiler finishes the run's code first).

Each with Spark's class archive (runtime/class_archive.py: written once, before the trials) and without
it (``STREAMTOPO_CLASS_ARCHIVE=off``), ``--trials`` times each, interleaved; medians are reported with
min and max. ``--baseline DIR`` adds the executor of another checkout (``git worktree add DIR <commit>``)
measured in the same run: its executors import streamtopo from there.

    python bench/executor_start.py               # 3 trials each, 30 s idle windows
    python bench/executor_start.py --baseline /tmp/before   # and a checkout of an earlier commit

Writes the "Executor start and idle" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from runtime_support import round_robin, sequence_topology  # noqa: E402

from bench.report import header, markdown, write_section  # noqa: E402
from bench.runtime import cpu_seconds  # noqa: E402
from streamtopo.contracts import Keys, unit_key  # noqa: E402
from streamtopo.local.platform import LocalPlatform  # noqa: E402
from streamtopo.local.runner import finished  # noqa: E402
from streamtopo.planner.cluster import Cluster  # noqa: E402
from streamtopo.runtime.class_archive import ARCHIVE_ENV  # noqa: E402
from streamtopo.runtime.embedded import EmbeddedValkey  # noqa: E402
from streamtopo.runtime.state_store import StateStore  # noqa: E402
from streamtopo.runtime.transport import connect  # noqa: E402

SETTLE = 15.0
"""Seconds between the end of the input and the idle window."""


def trial(archive: str, idle_seconds: float, work: Path, code: Path | None = None) -> dict[str, float]:
    """One executor's start, first step and idle share, with ``archive`` as STREAMTOPO_CLASS_ARCHIVE and
    the executor's streamtopo imported from ``code`` (a checkout) when given."""
    topology = sequence_topology("start", count=100, rate=100, keys=4, window=1.0)
    source = next(op.name for op in topology.spec.operators if op.kind == "source")
    os.environ[ARCHIVE_ENV] = archive
    os.chdir(code or ROOT)  # ``python -m streamtopo`` imports from its working directory first
    with (
        EmbeddedValkey() as valkey,
        LocalPlatform(
            work / "work",
            valkey.url,
            Cluster.uniform(1, 2),
            output_dir=work / "out",
            env={"PYTHONPATH": str(code)} if code else None,
        ) as platform,
    ):
        store = StateStore(connect(valkey.url), Keys(topology.metadata.name))
        platform.write_topology(topology)
        platform.write_routing(round_robin(topology, ["ex-0"]))
        started = time.monotonic()
        process = psutil.Process(platform.start("ex-0").popen.pid)
        ready = first = None
        cpu_ready = 0.0
        deadline = started + 300
        while first is None or ready is None:
            assert time.monotonic() < deadline, platform.log_tail("ex-0")
            if ready is None and platform.ready("ex-0"):
                ready, cpu_ready = time.monotonic() - started, cpu_seconds([process])
            _, record = store.load(unit_key((source, 0)))
            if first is None and record is not None and record.emitted > 0:
                first = time.monotonic() - started
            time.sleep(0.05)
        while not finished(store, topology):
            assert time.monotonic() < deadline, platform.log_tail("ex-0")
            time.sleep(0.2)
        time.sleep(SETTLE)
        cpu0, wall0 = cpu_seconds([process]), time.monotonic()
        time.sleep(idle_seconds)
        idle = (cpu_seconds([process]) - cpu0) / (time.monotonic() - wall0)
    return {"ready": ready, "cpu_ready": cpu_ready, "first": first, "idle": 100 * idle}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each idle window")
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier commit, measured alike")
    args = parser.parse_args()
    configs: dict[str, tuple[str | None, Path | None]] = {"without": ("off", None), "with": (None, None)}
    labels = {"without": "without class archive", "with": "with class archive"}
    if args.baseline:
        commit = subprocess.run(
            ["git", "-C", str(args.baseline), "log", "-1", "--format=%h %s"], capture_output=True, text=True
        ).stdout.strip()
        configs["baseline"] = ("off", args.baseline.resolve())
        labels["baseline"] = f"baseline `{commit[:60]}`, without archive"
    with tempfile.TemporaryDirectory(prefix="executor-start-") as tmp:
        archive = Path(tmp) / "spark.jsa"
        built = time.monotonic()
        env = {**os.environ, ARCHIVE_ENV: str(archive)}
        subprocess.run(
            [sys.executable, "-m", "streamtopo.runtime.spark"], env=env, check=True, capture_output=True
        )
        build_seconds = time.monotonic() - built
        results: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
        for index in range(args.trials):
            for name, (setting, code) in configs.items():
                work = Path(tmp) / f"{name}-{index}"
                results[name].append(trial(setting or str(archive), args.idle, work, code))
                r = results[name][-1]
                print(
                    f"{labels[name]}, trial {index + 1}: ready {r['ready']:.1f} s ({r['cpu_ready']:.1f} CPU-s), "
                    f"first step {r['first']:.1f} s, idle {r['idle']:.2f} % of a core",
                    flush=True,
                )

    def spread(name: str, field: str) -> str:
        values = [r[field] for r in results[name]]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    rows = [
        [
            labels[name],
            spread(name, "ready"),
            spread(name, "cpu_ready"),
            spread(name, "first"),
            spread(name, "idle"),
        ]
        for name in configs
    ]
    ratio = statistics.median(r["ready"] for r in results["with"]) / statistics.median(
        r["ready"] for r in results["without"]
    )
    lines = [
        *header(
            f"python bench/executor_start.py --trials {args.trials} --idle {args.idle:g}"
            + (" --baseline DIR" if args.baseline else "")
        ),
        "",
        "One executor process hosting a 100-record pipeline; medians (min-max) of "
        f"{args.trials} interleaved trials. Idle: after {SETTLE:g} s of settling, over {args.idle:g} s.",
        "",
        *markdown(
            ["", "ready (s)", "CPU-s to ready", "first step (s)", "idle (% of a core)"], rows, digits=2
        ),
        "",
        f"With the archive an executor is ready in {ratio:.2f}x the time. Writing the archive took "
        f"{build_seconds:.1f} s (once per machine and Spark version, or in the image's build).",
    ]
    write_section("Executor start and idle", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
