"""Key-group hand-over: when a receiver may take a unit, and how long the unit paused.

The donor side is simple: on a routing version that no longer gives it a unit, the donor keeps running the
unit until the receiver is ready (its ``ready`` key, set once its JVM is warm, and its ``applied`` routing
version at least the one that gave it the unit: it is waiting for the unit, so its steps are short; at most
``release_timeout``), finishes the micro-batch in progress (every step ends in a commit), then releases
the unit (``owner = ""``, ``released_at = now``, only if its epoch is still current). A unit moving to an
executor that is still starting therefore keeps running instead of pausing for the JVM start.
The receiver waits for one of:

- ``released``: the donor released it (a clean hand-over, the normal migration path);
- ``fresh``: nobody ever owned it (first start);
- ``recovered``: the owner's heartbeat expired (it crashed, was killed, or lost its transport);
- ``taken``: the hand-over timeout passed while the owner still looked alive (a stuck donor). The
  acquisition fences it: its next commit is refused, so it cannot write anything any more.

and then acquires with a new epoch and resumes from the committed record. Only that unit waits.
The pause is measured from the donor's release (or, when the donor never released, from the moment the
receiver started waiting) to the receiver holding the loaded state, ready to process. After a crash that
start is late (the receiver begins waiting once its own JVM runs), so each pause also records when it
ended (``Pause.at``): ``streamtopo run`` measures a kill's recovery from the kill to that moment
(local/drills.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from streamtopo.contracts import Keys, RoutingTable, parse_unit, unit_key
from streamtopo.runtime import sinks
from streamtopo.runtime.hosting import ExecutorConfig, Hosted
from streamtopo.runtime.metrics import ExecutorMetrics
from streamtopo.runtime.operators.base import UnitOperator
from streamtopo.runtime.state_store import Fenced, Ownership, StateStore, UnitRecord, log_record


def acquisition_kind(
    ownership: Ownership, instance: str, owner_alive: bool, waited: float, timeout: float
) -> str | None:
    """Why the receiver may acquire now (see the module docstring), or None to keep waiting."""
    if ownership.epoch == 0:
        return "fresh"
    if ownership.owner == "":
        return "released"
    if ownership.owner == instance or not owner_alive:
        return "recovered"
    if waited >= timeout:
        return "taken"
    return None


@dataclass(frozen=True)
class Pause:
    """One hand-over as the receiver saw it (kept in the topology's ``pauses`` list for summaries)."""

    unit: str
    seconds: float
    receiver: str
    kind: str
    state_bytes: int
    at: float
    """Wall time the receiver held the unit (the pause's end): the Pause is made right after acquiring."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Pause:
        return cls(**json.loads(text))


def pause_start(kind: str, ownership: Ownership, waiting_since: float) -> float:
    """A clean hand-over pauses from the donor's release; anything else from when the receiver began waiting."""
    if kind == "released" and ownership.released_at is not None:
        return ownership.released_at
    return waiting_since


class Handover:
    """The executor's side of hand-overs (see the module docstring), mixed into
    :class:`~streamtopo.runtime.executor.Executor`, which owns the state declared here."""

    name: str
    instance: str
    config: ExecutorConfig
    clock: Callable[[], float]
    operators: dict[str, UnitOperator]
    layouts: dict[str, str]
    keys: Keys
    metrics: ExecutorMetrics
    hosted: dict[str, Hosted]
    waiting: dict[str, float]
    leaving: dict[str, tuple[str | None, float, int]]
    """Units the routing moved away: (receiver, leaving since, the routing version that gave it the unit)."""
    routing: RoutingTable | None
    routing_path: Path
    _routing_mtime: float
    _last_punct: dict[tuple[str, str], float]
    client: Any
    store: StateStore

    _sink_path: Callable[[str, int], Path | None]

    def _routing_changed(self) -> bool:
        """Whether the routing file changed since it was last applied (one ``stat``)."""
        try:
            return self.routing_path.stat().st_mtime != self._routing_mtime
        except FileNotFoundError:
            return False

    def _apply_routing(self) -> None:
        try:
            mtime = self.routing_path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._routing_mtime and self.routing is not None:
            return
        table = RoutingTable.from_json(self.routing_path.read_text())
        self._routing_mtime = mtime
        if self.routing is not None and table.version <= self.routing.version:
            return
        self.routing = table
        self.metrics.exec(self.metrics.routing_version).set(table.version)
        self.client.set(self.keys.applied(self.name), table.version)
        mine = {unit_key(u) for u in table.units_of(self.name)}
        now = self.clock()
        for key in sorted(set(self.hosted) - mine):
            receiver, (before, since, given) = table.units.get(key), self.leaving.get(key, (None, now, 0))
            self.leaving[key] = (receiver, since, given if receiver == before else table.version)
        for key in mine & set(self.leaving):
            del self.leaving[key]
        self.waiting = {k: self.waiting.get(k, now) for k in sorted(mine - set(self.hosted))}

    def _release_leaving(self) -> None:
        """Hand over units the routing moved away once their receiver is ready (its JVM warm) and runs the
        routing version that gave it the unit, or a later one (it waits for the unit, so its steps
        are short: the unit's pause is one of them, not the rest of a long one), so a unit moving to
        a starting or busy executor keeps running here meanwhile; the step before has committed."""
        now = self.clock()
        for key, (receiver, since, given) in list(self.leaving.items()):
            ready = receiver is None or (
                bool(self.client.exists(self.keys.ready(receiver)))
                and int(self.client.get(self.keys.applied(receiver)) or -1) >= given
            )
            if not ready and now - since < self.config.release_timeout:
                continue
            del self.leaving[key]
            unit = self.hosted.pop(key, None)
            if unit is None:
                continue
            try:
                self.store.release(key, unit.epoch)
                self.metrics.migrations.labels(self.keys.topology, self.name, "donor").inc()
            except Fenced:
                pass
            self.metrics.forget_unit(unit.op, unit.kg)

    def _acquire_waiting(self) -> None:
        for key, since in list(self.waiting.items()):
            ownership = self.store.ownership(key)
            kind = acquisition_kind(
                ownership,
                self.instance,
                self.store.alive(ownership.owner),
                self.clock() - since,
                self.config.handover_timeout,
            )
            if kind is None:
                continue
            op, kg = parse_unit(key)
            epoch, rec = self.store.acquire(key, self.instance, self.layouts.get(op, ""))
            unit = Hosted(op, kg, epoch, rec or UnitRecord(), None)
            self._load(unit)
            self.hosted[key] = unit
            # Export the unit's busy counter at once (0 while it gets no input): the controller counts a
            # unit as measured when it has a busy series, and an idle unit is a measurement too.
            self.metrics.unit(self.metrics.busy, op, kg)
            del self.waiting[key]
            if kind != "fresh":
                now = self.clock()
                pause = Pause(
                    key,
                    now - pause_start(kind, ownership, since),
                    self.name,
                    kind,
                    len(unit.rec.state),
                    at=now,
                )
                log_record(self.client, self.keys.pauses, pause.to_json())
                self.metrics.exec(self.metrics.pause).observe(pause.seconds)
                self.metrics.migrations.labels(self.keys.topology, self.name, "receiver").inc()

    def _load(self, unit: Hosted) -> None:
        """Live state from the committed record; a file sink's file brought to its committed content."""
        unit.state = self.operators[unit.op].decode_state(unit.rec.state) if unit.rec.state else None
        path = self._sink_path(unit.op, unit.kg)
        if path is not None:
            unit.segment = sinks.resume(path, unit.rec.sink_len, unit.rec.pending)

    def _recover(self) -> None:
        """Back to the last commit: reload every hosted unit; units fenced meanwhile wait to be re-acquired."""
        self._last_punct.clear()
        for key, unit in list(self.hosted.items()):
            epoch, rec = self.store.load(key)
            if epoch != unit.epoch:
                self.hosted.pop(key)
                self.metrics.forget_unit(unit.op, unit.kg)
                if self.routing and key in {unit_key(u) for u in self.routing.units_of(self.name)}:
                    self.waiting.setdefault(key, self.clock())
                continue
            unit.rec = rec or UnitRecord()
            self._load(unit)
