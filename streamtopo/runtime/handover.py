"""Key-group hand-over: when a receiver may take a unit, and how long the unit paused.

The donor side is simple: on a routing version that no longer gives it a unit, the donor keeps running the
unit until the receiver is ready (its ``ready`` key, set once its JVM is warm; at most
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
receiver started waiting) to the receiver holding the loaded state, ready to process.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from streamtopo.runtime.state_store import Ownership


def acquisition_kind(ownership: Ownership, instance: str, owner_alive: bool, waited: float,
                     timeout: float) -> str | None:
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
