"""How many records an executor's generator units take in one step: paced by what the pipeline carries.

A generator's records come due with wall time (metrics.SourcePace); what is due but not generated is its
lag, counted where it is cheap to keep (a number, not records in a queue) and seen by the controller as
the source's backlog. Two rules decide how much of it a step takes:

- **the step's length.** An executor measures the records per second its steps carry (generated records
  over the step's wall time, averaged), and a step takes ``step_seconds`` of that (``handover_seconds``
  while it waits to acquire units: a unit released to it pauses until its next step ends, so those steps
  are short). A step's length bounds how late the first records come after a start with a backlog due
  (a JVM warm-up of tens of seconds leaves millions of records due), and how long a hand-over pauses;
  the measured rate grows the step geometrically while the pipeline keeps up, so a step still spreads
  Spark's fixed cost (planning, code generation) over many records.
- **backpressure through the lag.** When the records queued in the topology's streams (the transport's
  per-stream counters, one command) exceed ``queued_seconds`` of the measured rate, the generators take
  nothing: the downstream executors cannot keep up, and generating more only moves the lag from the
  generator into Valkey, where it costs memory and makes every consumer's step longer.

Pure of I/O except :meth:`SourceBudget.backpressured`, which reads the counters through the client it is
given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

RATE_WEIGHT = 0.5
"""Weight of the newest step in the measured rate (an exponential average)."""


@dataclass(frozen=True)
class Pacing:
    """The knobs of :class:`SourceBudget` (part of the executor's config)."""

    step_seconds: float = 2.0
    """A step takes this many seconds of the measured rate of due records."""
    handover_seconds: float = 0.25
    """... and this many while the executor waits to acquire units (the receiver's pause is its step)."""
    first_records: int = 20_000
    """Records a step takes before any rate is measured (the first step after a start)."""
    min_records: int = 5_000
    """A step's budget never falls below this (a slow step must not starve the sources)."""
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
        self.rate: float | None = None
        """Generated records per second of step, averaged over steps that generated."""
        self._started = 0.0
        self._generated = 0
        self._checked = -math.inf
        self._blocked = False

    def begin(self, now: float) -> None:
        """A step starts at ``now``."""
        self._started, self._generated = now, 0

    def generated(self, records: int) -> None:
        """The step's generators emitted ``records``."""
        self._generated += records

    def end(self, now: float) -> None:
        """The step ended at ``now``: a step that generated updates the measured rate."""
        took = now - self._started
        if self._generated <= 0 or took <= 0:
            return
        rate = self._generated / took
        self.rate = rate if self.rate is None else RATE_WEIGHT * rate + (1 - RATE_WEIGHT) * self.rate

    def records(self, waiting: bool) -> int:
        """Records all generator units of the executor may take this step together."""
        if self.rate is None:
            return self.pacing.first_records
        seconds = self.pacing.handover_seconds if waiting else self.pacing.step_seconds
        return max(self.pacing.min_records, int(self.rate * seconds))

    def backpressured(self, client: Any, backlog_key: str, now: float) -> bool:
        """The topology's queues hold more than the pipeline carries in ``queued_seconds`` (read at most
        every ``check_interval``; counters of partials count rows, which never exceed records). Without a
        transport client (an executor not started), nothing is queued."""
        if client is None:
            return False
        if now - self._checked < self.pacing.check_interval:
            return self._blocked
        self._checked = now
        queued = sum(max(0, int(v or 0)) for v in client.hvals(backlog_key))
        limit = max(self.pacing.min_queued, (self.rate or 0.0) * self.pacing.queued_seconds)
        self._blocked = queued > limit
        return self._blocked
