"""How many records an executor's generator units take in one step: paced by what the pipeline carries.

A generator's records come due with wall time (metrics.SourcePace); what is due but not generated is its
lag, counted where it is cheap to keep (a number, not records in a queue) and seen by the controller as
the source's backlog. Three rules decide how much of it a step takes:

- **slow start.** The first step after a start takes ``first_records``: a JVM warm-up of tens of seconds
  leaves millions of records due, and a step that takes them all emits nothing for minutes. While the
  sources are behind (a step took all its budget), the budget grows after every step that was short
  (under ``step_seconds``) or that carried more records per second than the step before it (a step's
  fixed cost, Spark's planning and code generation, still dominates: on a busy machine it takes seconds),
  up to the executor's caps (``max_source_records``, ``materialized_records``). So steps grow to where
  the fixed cost is paid rarely, whatever it costs on this machine, and no larger. How much it grows
  comes from the last two such steps, read as ``seconds = fixed + per_record x records``: to the size
  whose variable part fills ``step_seconds`` beyond the fixed part (at least the fixed part again),
  between 2x and ``max_growth``x. Doubling alone took 8 steps of about 1.4 s each, nearly all fixed cost,
  from 20,000 to the 2.5M records a 5M-record pipeline had due (2026-12-02, one executor, 2 cores).
- **hand-overs.** While the executor waits to acquire units, a step takes ``handover_seconds`` of the
  measured rate: a unit released to it pauses until that step ends.
- **backpressure through the lag.** When the records queued in the topology's streams (the transport's
  per-stream counters, one command) exceed ``queued_seconds`` of the measured rate, the generators take
  nothing and the budget halves: the executors downstream cannot keep up, and generating more only moves
  the lag from the generator into Valkey, where it costs memory and makes every consumer's step longer.

Pure of I/O except :meth:`SourceBudget.backpressured`, which reads the counters through the client it is
given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pacing:
    """The knobs of :class:`SourceBudget` (part of the executor's config)."""

    first_records: int = 20_000
    """Records the generators take in the first step after a start."""
    step_seconds: float = 2.0
    """A backlogged step shorter than this doubles the budget (longer ones double it while that pays)."""
    growth: float = 1.1
    """... a step at least this much faster per record than the one before it pays."""
    max_growth: float = 8.0
    """The most a budget grows after one step (the fixed-plus-per-record fit of two steps is noisy)."""
    handover_seconds: float = 0.25
    """While the executor waits to acquire units, a step takes this many seconds of the measured rate."""
    min_records: int = 5_000
    """The budget never falls below this."""
    queued_seconds: float = 4.0
    """Backpressure once the topology's queues hold more than this many seconds of the measured rate..."""
    min_queued: int = 200_000
    """... and more than this many records."""
    check_interval: float = 0.25
    """Seconds between two reads of the queue counters."""


class SourceBudget:
    """One executor's pacing of its generator units (module docstring)."""

    def __init__(self, pacing: Pacing | None = None) -> None:
        self.pacing = pacing or Pacing()
        self.budget = self.pacing.first_records
        """Records all generator units of the executor may take in the next step together."""
        self.rate: float | None = None
        """Records per second of the last step that took its whole budget."""
        self._allowed = self.budget
        self._started = 0.0
        self._generated = 0
        self._checked = -math.inf
        self._blocked = False
        self._last: tuple[int, float] | None = None
        """(records, seconds) of the last step that took its whole budget."""

    def begin(self, now: float) -> None:
        """A step starts at ``now``."""
        self._started, self._generated, self._allowed = now, 0, self.budget

    def generated(self, records: int) -> None:
        """The step's generators emitted ``records``."""
        self._generated += records

    def end(self, now: float) -> None:
        """The step ended at ``now``: a step that took its whole budget (the sources are behind) grows
        it while that pays (module docstring)."""
        took = now - self._started
        if took <= 0 or self._generated < 0.9 * self._allowed:
            return  # caught up (or generated nothing): nothing to learn
        rate = self._generated / took
        pays = self.rate is None or rate > self.pacing.growth * self.rate
        if took < self.pacing.step_seconds or pays:
            self.budget = round(self._allowed * self._growth(took))
        self.rate = rate
        self._last = (self._generated, took)

    def _growth(self, took: float) -> float:
        """By how much the budget grows after a backlogged step of ``took`` seconds (module docstring)."""
        low, high = 2.0, self.pacing.max_growth
        if self._last is None or self._generated <= self._last[0]:
            return low
        records, seconds = self._last
        per_record = (took - seconds) / (self._generated - records)
        if per_record <= 0:  # twice the records in no more time: the fixed cost is all there is to see
            return high
        fixed = max(0.0, took - per_record * self._generated)
        wanted = max(self.pacing.step_seconds - fixed, fixed) / per_record
        return min(high, max(low, wanted / self._allowed))

    def records(self, waiting: bool) -> int:
        """Records all generator units of the executor may take this step together."""
        if waiting and self.rate is not None:
            return max(
                self.pacing.min_records, min(self.budget, int(self.rate * self.pacing.handover_seconds))
            )
        return self.budget

    def backpressured(self, client: Any, backlog_key: str, now: float) -> bool:
        """The topology's queues hold more than the pipeline carries in ``queued_seconds`` (read at most
        every ``check_interval``; counters of partials count rows, which never exceed records); the
        budget halves each time they are found so. Without a transport client (an executor not
        started), nothing is queued."""
        if client is None:
            return False
        if now - self._checked < self.pacing.check_interval:
            return self._blocked
        self._checked = now
        queued = sum(max(0, int(v or 0)) for v in client.hvals(backlog_key))
        limit = max(self.pacing.min_queued, (self.rate or 0.0) * self.pacing.queued_seconds)
        self._blocked = queued > limit
        if self._blocked:
            self.budget = max(self.pacing.min_records, self.budget // 2)
        return self._blocked
