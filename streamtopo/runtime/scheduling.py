"""Which backlogged input queues an executor serves in a step: C-MR's scheduling (planner/cmr_scheduling.py).

A step reads at most ``budget`` records from its hosted units' input streams. While everything queued fits,
or the executor's last step kept up (what is queued came during its pause: runtime/inputs.py), every unit
takes everything (nothing to choose). Past that, the executor ranks its units' queues with a C-MR
policy and serves them in rank order up to the budget: ODF (the queue whose first unread entry arrived
earliest), YDF, CTO (operators closest to a sink first), MEM (most queued bytes freed per second of work), or
the thesis' hybrid, which uses MEM with probability F(x) (Eq. 3.1) where x is the memory the backlog takes
over ``memory_limit`` and ODF otherwise: latency first while memory is plentiful, memory first when it runs out.

"Memory" here is what the backlog costs: the queued records (in Valkey, which holds an executor's input
queues) plus the hosted units' state. ODF and YDF rank by arrival time (the entry id), the one clock every
queue shares. A unit's averages come from its committed counters (records in and out) and the busy time
this executor measured for it; a unit not yet measured gets ``DEFAULT_SECONDS_PER_RECORD``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamtopo.planner import cmr_scheduling as cmr

DEFAULT_SECONDS_PER_RECORD = 1e-5
DEFAULT_RECORD_BYTES = 64

POLICIES = ("all", "hybrid", *cmr.POLICIES)


@dataclass(frozen=True)
class Backlog:
    """One input stream of a unit as the probe saw it."""

    stream: str
    records: int
    """Records appended and not yet consumed (the topology's backlog counters); partial aggregates count
    as the rows that stand for them (transport.queued_rows), since the budget bounds a step's work."""
    entries: int
    """Entries still in the stream (unread ones, plus the last one read until the next trim)."""
    front: float | None
    """Arrival time (s, from the entry id) of the first unread entry; None when nothing is unread."""


@dataclass(frozen=True)
class UnitLoad:
    """What the scheduler needs to know about a hosted unit besides its queue."""

    unit: str
    operator: str
    in_bytes: float
    out_bytes: float
    records_in: int
    records_out: int
    busy_seconds: float
    state_bytes: int


class Scheduler:
    """Decides, each step, how many entries of each input stream the executor reads."""

    def __init__(
        self, downstream: dict[str, list[str]], policy: str, budget: int, memory_limit: float, seed: int = 0
    ):
        if policy not in POLICIES:
            raise ValueError(f"scheduling policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if budget < 1:
            raise ValueError(f"scheduling budget must be at least 1 record, got {budget}")
        self.policy = policy
        self.budget = budget
        self.memory_limit = memory_limit
        self.bfs = cmr.cto_order(downstream)
        self.rng = np.random.default_rng(seed)
        self.last_policy: str | None = None
        """The policy the last backlogged step used (None: everything fitted), for metrics and logs."""

    def fits(self, queued: int) -> bool:
        """Whether a step may read everything ``queued`` (no policy needs to choose)."""
        if self.policy == "all" or queued <= self.budget:
            self.last_policy = None
            return True
        return False

    def entries(
        self, units: list[UnitLoad], backlogs: dict[str, list[Backlog]], max_entries: int
    ) -> dict[str, int]:
        """Entries to read per stream this step (streams of units left out of the step get 0)."""
        if self.fits(sum(b.records for bs in backlogs.values() for b in bs)):
            return {b.stream: max_entries for bs in backlogs.values() for b in bs}
        queues = [
            self._queue(u, backlogs.get(u.unit, []))
            for u in units
            if any(b.records > 0 for b in backlogs.get(u.unit, []))
        ]
        policy = self.policy
        if policy == "hybrid":
            state = sum(u.state_bytes for u in units)
            policy = cmr.choose_policy(cmr.memory_fraction(queues, self.memory_limit, state), self.rng)
        self.last_policy = policy
        allotted = cmr.allot(queues, self.budget, policy)
        out: dict[str, int] = {}
        for unit, streams in backlogs.items():
            share = allotted.get(unit, 0)
            waiting = sum(b.records for b in streams)
            for b in streams:
                if share <= 0 or b.records <= 0:
                    out[b.stream] = 0
                    continue
                if share >= waiting:  # the unit's whole queue: all of it, so a full read means more came
                    out[b.stream] = max_entries
                    continue
                # This stream's part of the unit's allotment, in entries of its average size.
                per_entry = max(1.0, b.records / max(1, b.entries - 1))
                records = share * b.records / max(1, waiting)
                out[b.stream] = min(max_entries, max(1, math.ceil(records / per_entry)))
        return out

    def _queue(self, unit: UnitLoad, streams: list[Backlog]) -> cmr.UnitQueue:
        records = sum(b.records for b in streams)
        fronts = [b.front for b in streams if b.front is not None]
        return cmr.UnitQueue(
            unit=unit.unit,
            records=records,
            bytes=int(records * unit.in_bytes),
            front_ts=min(fronts) if fronts else 0.0,
            in_bytes=unit.in_bytes,
            out_bytes=unit.out_bytes,
            selectivity=unit.records_out / unit.records_in if unit.records_in else 1.0,
            seconds_per_record=(
                unit.busy_seconds / unit.records_in
                if unit.records_in and unit.busy_seconds > 0
                else DEFAULT_SECONDS_PER_RECORD
            ),
            bfs_order=self.bfs.get(unit.operator, 0),
        )
