"""Per key group state kept outside the executor, committed atomically and fenced by epochs.

Each unit ``(operator, kg)`` has one Valkey hash ``st:{topology}:u:<op>/<kg>``:

    epoch         owner epoch, incremented by every acquisition (the fencing token)
    owner         executor instance holding it ("" once released)
    released_at   wall time of the last clean release (start of a hand-over pause)
    rec           the committed :class:`UnitRecord` (offsets, sequence numbers, watermarks, sink length,
                  the sink redo bytes, operator state)
    layout        digest of the state layout ``rec.state`` was written under (planner/upgrade.py's
                  ``fingerprint``), set by the acquisition: an executor whose spec gives the operator
                  another layout is refused the unit (:class:`LayoutChanged`) instead of misreading it

A commit (:class:`Commit`) is one call of the Valkey function ``streamtopo_commit`` (streamtopo/
valkey_library.py, loaded by the operator; tenants may call it and no script of their own), so Valkey runs
it atomically: it first checks that every unit it writes still carries the epoch the executor acquired it
with, and refuses the whole commit (:class:`Fenced`) otherwise; then, before writing anything, that the
topology's account has room for what the commit adds (:class:`TransportFull` otherwise: the executor
waits and redoes the step, nothing is lost); then it writes the unit records, appends the produced entries
(downstream streams, sink streams, dead letters), trims the consumed input streams and adjusts the backlog
counters. Either all of a micro-batch's effects exist or none do. The protocol is in docs/exactly-once.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from streamtopo import valkey_library
from streamtopo.contracts import Keys, UnitRecord


class Fenced(RuntimeError):
    """A commit or release by an executor that no longer owns the unit (its epoch is stale)."""

    def __init__(self, unit: str, expected: int, actual: int | str):
        self.unit, self.expected, self.actual = unit, expected, actual
        super().__init__(
            f"{unit}: fenced (committing with epoch {expected}, current epoch {actual or 'none'})"
        )


class TransportFull(RuntimeError):
    """The platform's Valkey refused a write: the topology's account would pass its limit, an entry or
    record is larger than allowed, or the server is at ``maxmemory`` (it refuses writes rather than
    evicting). Nothing of the commit was written; the executor waits and tries the step again."""


class TransportUnprepared(RuntimeError):
    """The Valkey has no streamtopo function library and this connection may not load one (a tenant's
    user): the operator loads it (controller/transport_acl.py)."""


class LayoutChanged(RuntimeError):
    """A unit whose committed state was written under another state layout than the acquiring
    executor's spec gives its operator: a spec change the upgrade check did not see (docs/operator.md,
    "Spec changes"). The executor stops rather than read the state wrongly."""

    def __init__(self, unit: str, stored: str, expected: str):
        self.unit, self.stored, self.expected = unit, stored, expected
        super().__init__(
            f"{unit}: its committed state was written under state layout {stored}, but this executor's spec "
            f"gives the operator layout {expected}; restore the spec it ran with, or apply the change with "
            "spec.upgrade.mode: resetState"
        )


@dataclass
class Commit:
    """The effects of one micro-batch, applied all or nothing by :meth:`StateStore.commit`."""

    units: list[tuple[str, int, bytes]] = field(default_factory=list)
    """(unit key, epoch it was acquired with, encoded record)."""
    appends: list[tuple[str, list[bytes]]] = field(default_factory=list)
    """(stream, flat field/value list)."""
    trims: dict[str, str] = field(default_factory=dict)
    """Consumed stream -> id of the last consumed entry (everything older is dropped)."""
    incrs: dict[tuple[str, str], int] = field(default_factory=dict)
    """(hash, field) -> amount (backlog counters)."""

    def incr(self, key: str, hash_field: str, amount: int) -> None:
        self.incrs[(key, hash_field)] = self.incrs.get((key, hash_field), 0) + amount

    def __bool__(self) -> bool:
        return bool(self.units or self.appends or self.trims or self.incrs)


@dataclass(frozen=True)
class Ownership:
    owner: str
    epoch: int
    released_at: float | None


class StateStore:
    """Unit records, ownership and heartbeats of one topology in Valkey, through the function library."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self.client = client
        self.keys = keys
        prepare(client)

    def _call(self, function: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return self.client.fcall(function, len(keys), *keys, *args)
        except redis.exceptions.OutOfMemoryError as error:
            raise TransportFull(f"the transport is at its memory limit: {error}") from None

    # -------------------------------------------------------------------------------------- ownership

    def acquire(self, unit: str, instance: str, layout: str = "") -> tuple[int, UnitRecord | None]:
        """Become the owner with a new epoch (fencing every earlier owner); return the committed record.

        ``layout``: the digest of the state layout this executor reads the unit's state with; a record
        written under another one raises :class:`LayoutChanged` and the unit is not taken."""
        result = self._call(
            "streamtopo_acquire", [self.keys.unit(unit)], [instance, repr(time.time()), layout]
        )
        if int(result[0]) == valkey_library.FULL and len(result) == 4:
            raise TransportFull(_full(result))
        epoch, rec = result
        if int(epoch) == valkey_library.LAYOUT_CHANGED:
            raise LayoutChanged(unit, rec.decode(), layout)
        return int(epoch), UnitRecord.decode(rec) if rec else None

    def release(self, unit: str, epoch: int) -> None:
        """Give the unit up after the last commit; raises :class:`Fenced` if it was taken meanwhile."""
        if not self._call("streamtopo_release", [self.keys.unit(unit)], [str(epoch), repr(time.time())]):
            raise Fenced(unit, epoch, self.ownership(unit).epoch)

    def ownership(self, unit: str) -> Ownership:
        fields = self.client.hmget(self.keys.unit(unit), "owner", "epoch", "released_at")
        owner, epoch, released = cast(list[bytes | None], fields)  # a bytes client (decode_responses off)
        return Ownership((owner or b"").decode(), int(epoch or 0), float(released) if released else None)

    def load(self, unit: str) -> tuple[int, UnitRecord | None]:
        epoch, rec = cast(list[bytes | None], self.client.hmget(self.keys.unit(unit), "epoch", "rec"))
        return int(epoch or 0), UnitRecord.decode(rec) if rec else None

    def heartbeat(self, instance: str, ttl: float) -> None:
        mark(self.client, self.keys.heartbeat(instance), b"1", ttl=ttl)

    def alive(self, instance: str) -> bool:
        return bool(instance) and bool(self.client.exists(self.keys.heartbeat(instance)))

    # ----------------------------------------------------------------------------------------- commit

    def commit(self, commit: Commit) -> None:
        """Apply ``commit`` atomically, or raise :class:`Fenced` or :class:`TransportFull` and change
        nothing."""
        if not commit:
            return
        keys: list[str] = []
        args: list[bytes | str | int] = [
            len(commit.units),
            len(commit.appends),
            len(commit.trims),
            len(commit.incrs),
            repr(time.time()),
        ]
        for unit, epoch, rec in commit.units:
            keys.append(self.keys.unit(unit))
            args += [str(epoch), rec]
        for stream, fields in commit.appends:
            keys.append(stream)
            args += [len(fields), *fields]
        for stream, last in commit.trims.items():
            keys.append(stream)
            args.append(last)
        for (key, hash_field), amount in commit.incrs.items():
            keys.append(key)
            args += [hash_field, amount]
        result = self._call("streamtopo_commit", keys, args)
        code = int(result[0])
        if code == 1:
            return
        if code == 0:
            unit_key = result[1].decode().split(":u:", 1)[-1]
            expected = next(e for u, e, _ in commit.units if u == unit_key)
            raise Fenced(unit_key, expected, result[2].decode())
        if code == valkey_library.TOO_LARGE:
            raise TransportFull(
                f"{result[1].decode()}: {int(result[2])} bytes, more than the platform's "
                f"{int(result[3])} per entry or record (batching.maxBytes, or smaller state per key group)"
            )
        raise TransportFull(_full(result))


def _full(result: list[Any]) -> str:
    account, used, needed = result[1].decode(), int(result[2]), int(result[3])
    return f"{account} holds {used} bytes and this write needs {needed} more than the platform allows"


def prepare(client: redis.Redis) -> None:
    """Make sure the function library is there: loaded by the operator on a platform; on a Valkey of our
    own (``streamtopo run``, tests) loaded here, without limits."""
    try:
        valkey_library.ensure_loaded(client)
    except redis.exceptions.NoPermissionError:
        raise TransportUnprepared(
            "the transport has no streamtopo function library and this user may not load it "
            "(the operator loads it when it manages the topology's Valkey user)"
        ) from None


def mark(
    client: redis.Redis, key: str, value: bytes, *, ttl: float | None = None, once: bool = False
) -> bool:
    """A heartbeat or readiness key that expires after ``ttl`` seconds, or (``once``) a value set only if
    absent and never expiring (the topology's start time): ``streamtopo_mark``."""
    args: list[Any] = [value, str(int(ttl * 1000)) if ttl is not None else "", "nx" if once else ""]
    return bool(client.fcall("streamtopo_mark", 1, key, *args))


def log_record(client: redis.Redis, key: str, record: str | bytes) -> None:
    """Append a hand-over record to the topology's ``pauses`` list (capped at its last 1,000)."""
    client.fcall("streamtopo_log", 1, key, record)
