"""The generating side of an executor's step: which records of its generator sources are due, and how many
a step takes.

A generator unit's records come due as wall time passes (event time = seq / rate after the topology's
start, metrics.SourcePace); a step takes what is due up to a cap that follows the backlog while the
records stay in the JVM, and up to what the pacing allows (pacing.py: a few seconds of what the executor
carries, nothing while the topology's queues are full). A unit that leaves records due makes the step
:attr:`~Generation.behind`, so the executor steps again at once instead of pausing.

:class:`Generation` is mixed into :class:`~streamtopo.runtime.dataflow.Dataflow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from streamtopo.contracts import unit_key
from streamtopo.planner.source_layout import layout
from streamtopo.runtime.emit import Emit
from streamtopo.runtime.flows import Produced
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.metrics import SourcePace
from streamtopo.runtime.operators.base import materialize
from streamtopo.runtime.operators.source import SourceOperator
from streamtopo.runtime.operators.windows import closing_windows
from streamtopo.runtime.pacing import SourceBudget


class Generation(Emit):
    """Records of the hosted generator units that a step takes (see the module docstring)."""

    clock: Callable[[], float]
    client: Any
    t0: float
    waiting: dict[str, float]
    pacing: SourceBudget
    _closes: dict[str, tuple[tuple[float, float], ...]]
    behind: bool
    """The last step left input for the next: a generator unit records due beyond what it took, a stream
    entries beyond what it read (the executor steps again at once, not after ``spec.batching.interval``)."""

    def _generates(self, op: str) -> bool:
        operator = self.spec.operator(op)
        return operator.source is not None and operator.source.generator is not None

    def _paces(self, units: list[Hosted]) -> dict[int, SourcePace]:
        """Each generator unit's pacing: its records come due as wall time passes, and are released at
        the ends of the windows that alone see them while few (SourcePace.released)."""
        op = units[0].op
        source = self.spec.operator(op).source
        assert source is not None  # only generator units are paced
        if op not in self._closes:
            self._closes[op] = tuple((w.slide, w.size) for w in closing_windows(self.spec, op))
        return {
            u.kg: SourcePace(
                self.t0,
                source.rate_per_second,
                layout(self.spec, op, u.kg),
                source.count,
                self._closes[op],
                self.config.held_records,
            )
            for u in units
        }

    def _requests(
        self, units: list[Hosted], paces: dict[int, SourcePace], now: float
    ) -> tuple[list[tuple[int, Any, int]], bool]:
        """(kg, state, records) each unfinished generator unit takes this step: what is due, up to the cap;
        and whether a unit leaves records due (the step is then :attr:`behind`)."""
        cap = min(self._source_cap(units[0].op, len(units)), self._paced(units[0].op, len(units)))
        due = {
            u.kg: max(0, paces[u.kg].releasable(now, u.rec.emitted) - u.rec.emitted)
            for u in units
            if u.rec.watermark != math.inf
        }
        taken = [(u.kg, u.state, min(due[u.kg], cap)) for u in units if u.kg in due]
        return taken, any(n > cap for n in due.values())

    def _due(self, units: list[Hosted], now: float) -> int:
        return sum(n for _, _, n in self._requests(units, self._paces(units), now)[0])

    def _generate(self, units: list[Hosted], now: float) -> Produced:
        """Records whose event time has come: seq/rate <= now - t0 (sources are paced by wall time).

        One lazy Spark frame for all the units; it stays in the JVM unless a consumer needs pandas."""
        operator = self.operators[units[0].op]
        assert isinstance(operator, SourceOperator)  # only source units generate
        paces = self._paces(units)
        requests, left = self._requests(units, paces, now)
        self.behind |= left
        frame, emitted = operator.generate(self.spark, requests) if requests else (None, {})
        if frame is not None and self.eager:
            frame = materialize(frame)
        out: dict[str, tuple[int | None, float]] = {}
        counts: dict[str, int] = {}
        for unit in units:
            if unit.kg not in emitted:
                continue
            n, state, wm = emitted[unit.kg]
            if n == 0 and wm == unit.rec.watermark:
                continue
            unit.state = state
            unit.rec.emitted += n
            unit.rec.records_out += n
            unit.rec.watermark = wm
            self.metrics.unit(self.metrics.records_out, unit.op, unit.kg).inc(n)
            out[unit.key], counts[unit.key] = (n, wm), n
        for unit in units:  # backlog, oldest age and arrivals are read at scrape time (metrics.SourcePace)
            self.metrics.source_progress(unit.op, unit.kg, paces[unit.kg], unit.rec.emitted)
        self.pacing.generated(sum(counts.values()))
        return Produced(frame, out, counts)

    def _source_cap(self, op: str, units: int) -> int:
        """Records one unit of source ``op`` may generate this step at most: everything due up to a cap, so
        the step follows the backlog. The cap is short while units wait to be acquired (a released unit
        pauses until our next step ends); else a share of ``max_source_records`` while the records stay
        in the JVM (the step's one job bounds its length), of ``materialized_records`` when they must come
        out (the heap bounds it). The pacing (:meth:`_paced`) may allow less."""
        if self.waiting:
            return self.config.handover_source_records
        if not self.eager and self._stays_in_jvm(op):
            return max(1, self.config.max_source_records // units)
        return max(1, self.config.materialized_records // units)

    def _paced(self, op: str, units: int) -> int:
        """Records one unit of source ``op`` may take by the pacing (pacing.py): a few seconds of what the
        executor carries (a quarter second while it waits to acquire units), split over its generators
        by rate; nothing while the topology's queues are full (backpressure through the lag)."""
        if self.pacing.backpressured(self.client, self.keys.backlog, self.clock()):
            return 0
        hosted = {u.op for u in self.hosted.values() if self._generates(u.op)}
        rates = {o: self.spec.operator(o).source for o in hosted}
        total = sum(source.rate_per_second for source in rates.values() if source is not None)
        own = self.spec.operator(op).source
        share = own.rate_per_second / total if own is not None and total > 0 else 1.0
        return max(1, int(self.pacing.records(bool(self.waiting)) * share) // units)

    def _stays_in_jvm(self, op: str) -> bool:
        """Whether ``op``'s output never reaches Python this step: each consumer folds it into partials in
        this JVM (an aggregate, wherever it runs), or takes it lazily here and passes it on likewise."""
        return all(self._kept_in_jvm_by(op, v) for v in self.downstream[op])

    def _kept_in_jvm_by(self, op: str, v: str) -> bool:
        """Whether reader ``v`` keeps ``op``'s output in the JVM: it folds it into partials there, or takes
        it lazily on this executor and its own output stays in the JVM likewise."""
        if self.operators[v].combines:
            return True
        mine = [unit.kg for unit in self.hosted.values() if unit.op == op]
        fed = {unit_key((v, j)) for kg in mine for j in self.dests(op, kg).get(v, [])}
        return self.operators[v].lazy_input and fed <= set(self.hosted) and self._stays_in_jvm(v)
