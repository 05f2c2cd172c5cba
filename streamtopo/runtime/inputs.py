"""The reading side of an executor's step: which streams feed each hosted unit, and how many entries a step
reads from each.

Every hosted unit's new entries come in one pipelined round trip at the step's start, all of them up to
``max_entries`` per stream unless the topology's queues hold more than a step's budget: then C-MR's policy
chooses (scheduling.py). Just before a unit runs, what other executors appended for it since the step
began is read too (:meth:`Inputs._read_late`). A stream that gives all it was allotted, or none while it
holds records, makes the step behind.

:class:`Inputs` is mixed into :class:`~streamtopo.runtime.dataflow.Dataflow`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from streamtopo.contracts import parse_unit, unit_key
from streamtopo.planner.graph import unit_edges
from streamtopo.runtime.emit import Emit
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.scheduling import DEFAULT_RECORD_BYTES, Backlog, Scheduler, UnitLoad
from streamtopo.runtime.transport import Entry, queued_rows, read_entries


class Inputs(Emit):
    """What a step reads for the hosted units (see the module docstring)."""

    name: str
    client: Any
    scheduler: Scheduler
    waiting: dict[str, float]
    behind: bool
    kept_up: bool
    _producers: dict[str, dict[int, list[str]]]

    def producers(self, op: str, kg: int) -> list[str]:
        """Units whose watermarks bound unit (op, kg)'s: every upstream unit with an edge into it."""
        if op not in self._producers:
            table: dict[int, list[str]] = defaultdict(list)
            for u in self.spec.operator(op).inputs:
                for i, j, _ in unit_edges(self.spec, u, op):
                    table[j].append(unit_key((u, i)))
            self._producers[op] = table
        return self._producers[op][kg]

    def _read_inputs(self) -> tuple[dict[str, list[tuple[str, Entry]]], dict[str, int]]:
        """Every hosted unit's new entries, in one pipelined round trip, and the entries each stream may
        give this step: all (up to ``max_entries``) unless the queues hold more than a step's budget and
        C-MR's policy decides (runtime/scheduling.py)."""
        owners = [(key, stream) for key, unit in self.hosted.items() for stream in self._input_streams(unit)]
        counts = self._allotments(owners)
        requests = [
            (stream, self.hosted[key].rec.offsets.get(stream, "0-0"), counts[stream])
            for key, stream in owners
            if counts[stream] > 0
        ]
        out: dict[str, list[tuple[str, Entry]]] = defaultdict(list)
        kept = [(key, stream) for key, stream in owners if counts[stream] > 0]
        for (key, stream), entries in zip(kept, read_entries(self.client, requests)):
            out[key].extend((stream, e) for e in entries)
            self.behind |= len(entries) >= counts[stream]  # the stream may hold more
        return out, counts

    def _read_late(
        self, units: list[Hosted], inputs: dict[str, list[tuple[str, Entry]]], allotted: dict[str, int]
    ) -> None:
        """Add the entries other executors appended for ``units`` since the step began, just before the
        units run. A record crossing executors waits for the receiver's next step to begin; an operator late
        in a step would otherwise leave what arrived meanwhile for the step after. Only streams some other
        executor feeds, within each stream's allotment; one pipelined round trip."""
        requests, owners = [], []
        for unit in units:
            for stream in self._remote_streams(unit):
                got = [entry for s, entry in inputs.get(unit.key, []) if s == stream]
                room = allotted.get(stream, 0) - len(got)
                if room > 0:
                    requests.append(
                        (stream, got[-1].id if got else unit.rec.offsets.get(stream, "0-0"), room)
                    )
                    owners.append((unit.key, stream))
        for (key, stream), entries, (_, _, room) in zip(
            owners, read_entries(self.client, requests), requests
        ):
            inputs[key].extend((stream, e) for e in entries)
            self.behind |= len(entries) >= room

    def _allotments(self, owners: list[tuple[str, str]]) -> dict[str, int]:
        """Entries to read per stream: all (up to ``max_entries``) unless a policy must choose. A policy
        chooses only for an executor that is behind: after a step that kept up (:attr:`kept_up`), what is
        queued came during the pause (``spec.batching.interval``) and is the pipeline's rate, not a
        backlog; split over two steps it would pay a step's fixed cost twice per interval (a join across
        two executors at 100,000 records/s per source: every other interval). The queues' record
        counters come first (one command); only when they exceed the step's budget are the queues
        probed (first unread entry and length per stream) and the units' loads weighed: an executor
        hosting hundreds of units would otherwise pay a thousand commands every loop, idle or not."""
        internal = [(key, stream) for key, stream in owners if stream.startswith(self.keys.prefix)]
        # While units wait to be acquired, a released unit pauses until this step ends: read little.
        limit = self.config.handover_entries if self.waiting else self.config.max_entries
        counts = {stream: limit for _, stream in owners}
        if self.config.scheduling == "all" or not internal or (self.kept_up and not self.waiting):
            return counts
        queued = [max(0, int(n or 0)) for n in self.client.hmget(self.keys.backlog, [s for _, s in internal])]
        if self.scheduler.fits(sum(queued)):  # rows never exceed records (transport.queued_rows)
            return counts
        pipe = self.client.pipeline(transaction=False)
        for key, stream in internal:
            after = self.hosted[key].rec.offsets.get(stream, "0-0")
            pipe.xrange(stream, min=f"({after}" if after != "0-0" else "-", max="+", count=1)
            pipe.xlen(stream)
        rest = pipe.execute()
        backlogs: dict[str, list[Backlog]] = defaultdict(list)
        for i, (key, stream) in enumerate(internal):
            first, length = rest[2 * i], rest[2 * i + 1]
            front = int(first[0][0].split(b"-")[0]) / 1000 if first else None
            rows = queued_rows(queued[i], first[0][1] if first else None)
            backlogs[key].append(Backlog(stream, rows, int(length), front))
        hosting = {unit.op for unit in self.hosted.values()}
        loads = [self._load_of(self.hosted[key], hosting) for key in backlogs]
        counts.update(self.scheduler.entries(loads, backlogs, limit))
        # A stream the policy gives nothing this step waits with its entries (one it gives some to is
        # behind if it fills its allotment: _read_inputs).
        self.behind |= any(
            counts[b.stream] == 0 and b.records > 0 for queue in backlogs.values() for b in queue
        )
        if self.scheduler.last_policy is not None:
            self.metrics.scheduling.labels(self.keys.topology, self.name, self.scheduler.last_policy).inc()
        return counts

    def _load_of(self, unit: Hosted, hosting: set[str]) -> UnitLoad:
        """``hosting``: the operators this executor hosts a unit of."""
        op = self.spec.operator(unit.op)
        in_bytes = max(
            (self.spec.operator(u).record_bytes or DEFAULT_RECORD_BYTES for u in op.inputs),
            default=DEFAULT_RECORD_BYTES,
        )
        local = sum(1 for v in self.downstream[unit.op] if v in hosting)
        return UnitLoad(
            unit.key,
            unit.op,
            in_bytes,
            (op.record_bytes or DEFAULT_RECORD_BYTES) * local,
            unit.rec.records_in,
            unit.rec.records_out,
            unit.busy,
            len(unit.rec.state),
        )

    def _remote_streams(self, unit: Hosted) -> list[str]:
        """Input streams of ``unit`` that a unit of another executor writes (a source's have none)."""
        op = self.spec.operator(unit.op)
        if op.kind == "source":
            return []
        remote = {parse_unit(p)[0] for p in self.producers(unit.op, unit.kg) if p not in self.hosted}
        return [self.keys.stream(u, unit.op, unit.kg) for u in op.inputs if u in remote]

    def _input_streams(self, unit: Hosted) -> list[str]:
        op = self.spec.operator(unit.op)
        if op.source is not None:
            return [self.keys.sink_stream(op.source.stream)] if op.source.stream is not None else []
        return [self.keys.stream(u, unit.op, unit.kg) for u in op.inputs]
