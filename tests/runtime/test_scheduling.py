"""runtime/scheduling.py: entries per stream from C-MR's allotment of records per unit."""

from __future__ import annotations

from streamtopo.runtime.scheduling import Backlog, Scheduler, UnitLoad


def load(unit: str) -> UnitLoad:
    return UnitLoad(unit, unit.split("/")[0], 64.0, 64.0, 0, 0, 0.0, 0)


def test_a_unit_allotted_its_whole_queue_reads_all_of_it_and_one_allotted_part_reads_its_share():
    """ODF serves the older queue first. ``a/0`` is allotted all its 100 records: its streams read up to
    ``max_entries``, so a read that fills the allotment means more came since the probe (the step is behind
    only then), where an allotment of exactly the entries found would read as behind every time. ``b/0``
    gets the 150 records left of 300, in entries of its average size (30 records: 10 entries + the last
    one read)."""
    scheduler = Scheduler({"a": [], "b": []}, "odf", budget=250, memory_limit=1e9)
    backlogs = {
        "a/0": [Backlog("s-a1", 60, 4, front=1.0), Backlog("s-a2", 40, 3, front=1.5)],
        "b/0": [Backlog("s-b", 300, 11, front=2.0)],
    }
    counts = scheduler.entries([load("a/0"), load("b/0")], backlogs, max_entries=256)
    assert scheduler.last_policy == "odf"
    assert counts == {"s-a1": 256, "s-a2": 256, "s-b": 5}
