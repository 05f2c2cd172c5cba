"""The adaptive combine rule of an edge into an aggregate (runtime/combining.py)."""

from __future__ import annotations

from streamtopo.runtime.combining import MIN_RECORDS, RATIO, RETRIES_AFTER, Reduction

RETRY_RECORDS = RETRIES_AFTER * MIN_RECORDS


def test_an_edge_combines_while_it_shrinks_the_records():
    edge = Reduction()
    for _ in range(20):
        assert edge.combines()
        edge.combined(MIN_RECORDS, int(MIN_RECORDS * RATIO))  # at the ratio: still pays
    assert not edge.stopped


def test_an_edge_whose_partials_are_its_records_stops_once_judged_then_measures_again():
    edge = Reduction()
    edge.combined(MIN_RECORDS - 1, MIN_RECORDS - 1)
    assert edge.combines(), "judged only after MIN_RECORDS records"
    edge.combined(1, 1)
    assert not edge.combines()
    edge.sent(RETRY_RECORDS - 1)
    assert not edge.combines()
    edge.sent(1)
    assert edge.combines() and (edge.records, edge.rows) == (0, 0), "a fresh measurement"
    edge.combined(MIN_RECORDS, MIN_RECORDS // 10)
    assert edge.combines()
