"""How long a py4j reply of each size takes, with py4j's socket as it comes and with Nagle's algorithm off.

    .venv/bin/python bench/py4j_replies.py [--calls 15] [--no-write]

Every Spark call from an executor is a py4j command answered on a socket. py4j's JVM end writes a reply
through an 8 KB buffer, so a longer one leaves in two writes, and with Nagle's algorithm the second waits
for the acknowledgement of the first, which Linux delays by up to 40 ms. runtime/spark.py's
``without_reply_delay`` turns the algorithm off on the JVM's end of each thread's connection. This
measures both ways in one JVM, each on a thread of its own (a connection of its own): replies of several
sizes (a string built in the JVM), and the file sink's JSON lines of 1,000 doubles
(runtime/operators/json_writer.py's ``json_lines``: Java's notation of the numbers is a 19 kB reply).

Writes the section "Replies from the JVM (issue 33)" of docs/benchmarks.md and docs/img/py4j_replies.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from rich.console import Console

from bench.report import header, image_dir, markdown, publish, save_figure
from streamtopo.runtime.operators.json_writer import json_lines
from streamtopo.runtime.spark import get_spark, without_reply_delay

SECTION = "Replies from the JVM (issue 33)"
SIZES = (1_000, 8_180, 8_200, 20_000, 50_000, 200_000)
"""Reply sizes in characters: either side of the 8 KB buffer, then what a step's larger replies carry."""
MODES = ("as py4j leaves it", "Nagle off (without_reply_delay)")
console = Console()


def timed(calls: int, fixed: bool, work: Callable[[], object]) -> float:
    """The median milliseconds of ``calls`` runs of ``work`` on a new thread (a new py4j connection)."""
    times: list[float] = []

    def run() -> None:
        if fixed:
            without_reply_delay(get_spark())
        work()  # the connection's first command
        for _ in range(calls):
            began = time.perf_counter()
            work()
            times.append((time.perf_counter() - began) * 1000)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return statistics.median(times)


def measure(calls: int) -> list[tuple[str, float, float]]:
    """(what, median ms as py4j leaves it, median ms with Nagle off) per reply."""
    spark = get_spark()
    strings = spark._jvm.org.apache.commons.lang3.StringUtils  # noqa: SLF001 - PySpark's JVM handle
    doubles = pd.DataFrame({"price": np.random.default_rng(0).random(1_000) * 1e6})
    cases: list[tuple[str, Callable[[], object]]] = [
        (f"{size:,} characters", lambda size=size: strings.repeat("x", size)) for size in SIZES
    ]
    cases.append(("the file sink's lines of 1,000 doubles", lambda: json_lines(spark, doubles, ["price"])))
    rows = []
    for what, work in cases:
        rows.append((what, timed(calls, False, work), timed(calls, True, work)))
        console.print(f"  {what}: {rows[-1][1]:.1f} ms, {rows[-1][2]:.1f} ms")
    return rows


def plot(rows: list[tuple[str, float, float]], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(9, 3.6))
    y = np.arange(len(rows))
    for offset, index, label in ((-0.2, 1, MODES[0]), (0.2, 2, MODES[1])):
        ax.barh(y + offset, [row[index] for row in rows], 0.4, label=label)
    ax.set_yticks(y, [row[0] for row in rows])
    ax.invert_yaxis()
    ax.set_xlabel("median ms per call")
    ax.set_title("A py4j reply's time by its size")
    ax.legend(loc="lower right")
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=15, help="calls per reply and mode (median reported)")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/ alone")
    args = parser.parse_args()
    rows = measure(args.calls)
    image = image_dir(args.no_write) / "py4j_replies.png"
    plot(rows, image)
    slow = [what for what, before, after in rows if before > 10 * after]
    table = markdown(
        ["reply", *[f"{mode}, median ms" for mode in MODES], "ratio"],
        [(what, f"{before:.1f}", f"{after:.1f}", f"{before / after:.0f}x") for what, before, after in rows],
    )
    lines = [
        *header(
            f"python bench/py4j_replies.py --calls {args.calls}", "one JVM, each mode on threads of its own"
        ),
        "",
        *table,
        "",
        "![py4j replies](img/py4j_replies.png)",
        "",
        f"Replies more than 10x slower as py4j leaves the socket: {', '.join(slow) or 'none'}. runtime/spark.py's "
        "`without_reply_delay` runs at the start of every step (runtime/dataflow.py), once per connection.",
    ]
    publish(SECTION, lines, image, args.no_write, console)


if __name__ == "__main__":
    main()
