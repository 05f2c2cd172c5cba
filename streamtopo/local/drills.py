"""The resilience drills of ``streamtopo run``: when they happen, what they do, what they cost.

``--migrate-every S`` moves a random unit to another executor (the normal hand-over); ``--kill-every S``
``kill -9``s a random executor and restarts it. Both are timed from the run's start, so a drill asked for
every S seconds happens S seconds into the run, not S seconds after the warm-up (which left a 30 s run
with ``--kill-every 20`` without a kill). Both wait, though, until every executor's loop has run once
(its JVM is up), so they exercise hand-overs and recovery rather than JVM starts. The next kill comes
``--kill-every`` seconds after the last victim runs again, not after the kill: a restart slower than the
interval neither livelocks the run nor leaves it without a moment in which every executor runs, which is
when migrations are clean hand-overs (CI, on a loaded machine, once saw a run whose every migration met a
restarting receiver).

A kill's recovery pause is what the killed executor's units pay: from the ``kill -9`` to the moment each of
them is held again, with its committed state loaded, by a live executor (the heartbeat expiry, the
restart, the new JVM's start and warm-up, the acquisition). The receiver's own measure (a ``recovered``
:class:`~streamtopo.runtime.handover.Pause`) starts when the restarted executor begins waiting for the
unit, after its JVM started, so it leaves out most of the pause.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from streamtopo.contracts import RoutingTable
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.state_store import StateStore


class Schedule:
    """Due every ``every`` seconds from ``start`` (never when ``every`` is None); an occurrence held back
    (executors still starting) happens as soon as it may, and the next one comes ``every`` seconds after."""

    def __init__(self, start: float, every: float | None):
        self.every = every
        self.next = self._after(start)
        self.held = False

    def due(self, now: float, ready: bool) -> bool:
        """Whether to drill now; ``ready``: the executors the drill needs run."""
        return not self.held and now >= self.next and ready

    def hold(self) -> None:
        """Nothing is due until :meth:`done` starts the next interval (a kill's runs from the victim's return)."""
        self.held = True

    def done(self, now: float) -> None:
        self.held = False
        self.next = self._after(now)

    def _after(self, moment: float) -> float:
        return math.inf if self.every is None else moment + self.every


@dataclass(frozen=True)
class Kill:
    """One ``kill -9`` of the drill: the executor, when, and the units it held at that moment."""

    executor: str
    at: float
    units: tuple[str, ...]


def held_by(store: StateStore, routing: RoutingTable, executor: str) -> tuple[str, ...]:
    """The units whose owner is an instance of ``executor`` (``<name>-<pid>-<token>``, executor.py).

    Ownership, not the routing table: a unit on its way to ``executor`` is still run by its donor, and a
    unit leaving it is not yet released, so the table says neither who stops nor who keeps running.
    """
    keys = sorted(routing.units)
    pipe = store.client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(store.keys.unit(key), "owner")
    owners = pipe.execute()
    return tuple(
        key for key, owner in zip(keys, owners) if owner and owner.decode().rsplit("-", 2)[0] == executor
    )


def recovery_pauses(kills: list[Kill], pauses: list[Pause]) -> tuple[list[float], int]:
    """Per unit of every kill: seconds from the kill to its next acquisition (any kind: the restarted
    executor, or another one the loop moved it to); and how many had not been acquired when the run ended."""
    recovered: list[float] = []
    pending = 0
    for kill in kills:
        for unit in kill.units:
            after = [p.at for p in pauses if p.unit == unit and p.at >= kill.at]
            if after:
                recovered.append(min(after) - kill.at)
            else:
                pending += 1
    return recovered, pending


def migrate(routing: RoutingTable, rng: random.Random) -> RoutingTable:
    """Move one random unit to another executor (the normal hand-over, a new routing version); executors
    the loop is draining receive nothing."""
    assignment = routing.assignment()
    executors = sorted(n for n, entry in routing.executors.items() if not entry.draining)
    if len(executors) < 2:
        return routing
    unit = rng.choice(sorted(assignment))
    assignment[unit] = rng.choice([e for e in executors if e != assignment[unit]])
    return routing.moved(assignment)
