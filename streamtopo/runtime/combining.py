"""Whether an edge into an aggregate combines before the wire: adaptive partial aggregation.

Combining (emit.py, ``Emit._combined``) runs the aggregate's partial aggregation in the producer, so a
crossing record costs a few partial rows per key and bucket instead of itself. It pays where the partials
are fewer than the records. Where nearly every record of a step has a key of its own (a running count over
a million keys, say) the partials are as many as the records: the producer's aggregation is work for
nothing, and the records should travel whole and be folded once, where the aggregate runs.

Trino measures this per plan node and stops partial aggregation once it has seen ``MIN_RECORDS`` input
rows and its output rows exceed ``RATIO`` of them (its ``adaptive-partial-aggregation`` defaults). A
stream's keys change over time, so an edge that stopped combines again after shipping ``RETRIES_AFTER``
times ``MIN_RECORDS`` whole, and measures anew. Both thresholds are executor settings (hosting.py).
Either way the aggregate's result is the same: partials merge as the records fold (aggregations.py), and
the consumer already takes both kinds of entry.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_RECORDS = 100_000
"""Records an edge combines before its ratio is judged (Trino: ``min-rows``)."""
RATIO = 0.8
"""Partial rows per record above which combining stops (Trino: ``unique-rows-ratio-threshold``)."""
RETRIES_AFTER = 10
"""Records shipped whole, in units of the edge's ``min_records``, before it measures again."""


@dataclass
class Reduction:
    """One edge's measured reduction: partial rows against the records they stand for."""

    min_records: int = MIN_RECORDS
    ratio: float = RATIO
    records: int = 0
    rows: int = 0
    shipped: int = 0
    """Records sent whole since combining stopped."""
    stopped: bool = False

    def combines(self) -> bool:
        """Whether this step combines: until the edge is judged not to shrink, and again after a while."""
        if self.stopped and self.shipped >= RETRIES_AFTER * self.min_records:
            self.records = self.rows = self.shipped = 0
            self.stopped = False
        return not self.stopped

    def combined(self, records: int, rows: int) -> None:
        """A step combined ``records`` into ``rows`` partial rows."""
        self.records += records
        self.rows += rows
        self.stopped = self.records >= self.min_records and self.rows > self.ratio * self.records

    def sent(self, records: int) -> None:
        """A step shipped ``records`` whole."""
        self.shipped += records
