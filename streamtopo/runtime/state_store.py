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

A commit (:class:`Commit`) is one Lua script, so Valkey runs it atomically: it first checks that every
unit it writes still carries the epoch the executor acquired it with, and refuses the whole commit
(:class:`Fenced`) otherwise; then it writes the unit records, appends the produced entries (downstream
streams, sink streams, dead letters), trims the consumed input streams and adjusts the backlog counters.
Either all of a micro-batch's effects exist or none do. The protocol is in docs/exactly-once.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

import redis

from streamtopo.contracts import Keys, UnitRecord

_COMMIT = """
local nu, na, nt, ni = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = ARGV[5]
local a = 6
for i = 1, nu do
  local epoch = redis.call('HGET', KEYS[i], 'epoch')
  if epoch ~= ARGV[a] then return {0, KEYS[i], epoch or ''} end
  a = a + 2
end
local k = 1
a = 6
for i = 1, nu do
  redis.call('HSET', KEYS[k], 'rec', ARGV[a + 1], 'committed_at', now)
  k = k + 1; a = a + 2
end
for i = 1, na do
  local nf = tonumber(ARGV[a])
  local args = {}
  for f = 1, nf do args[f] = ARGV[a + f] end
  redis.call('XADD', KEYS[k], '*', unpack(args))
  k = k + 1; a = a + 1 + nf
end
for i = 1, nt do
  redis.call('XTRIM', KEYS[k], 'MINID', ARGV[a])
  k = k + 1; a = a + 1
end
for i = 1, ni do
  redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
  k = k + 1; a = a + 2
end
return {1}
"""

_ACQUIRE = """
local layout = redis.call('HGET', KEYS[1], 'layout')
if ARGV[3] ~= '' and layout and layout ~= ARGV[3] and redis.call('HEXISTS', KEYS[1], 'rec') == 1 then
  return {-1, layout}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'acquired_at', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'layout', ARGV[3]) end
return {epoch, redis.call('HGET', KEYS[1], 'rec') or false}
"""

_RELEASE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'released_at', ARGV[2])
return 1
"""


class Fenced(RuntimeError):
    """A commit or release by an executor that no longer owns the unit (its epoch is stale)."""

    def __init__(self, unit: str, expected: int, actual: int | str):
        self.unit, self.expected, self.actual = unit, expected, actual
        super().__init__(
            f"{unit}: fenced (committing with epoch {expected}, current epoch {actual or 'none'})"
        )


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
    """Unit records, ownership and heartbeats of one topology in Valkey."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self.client = client
        self.keys = keys
        self._commit = client.register_script(_COMMIT)
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    # -------------------------------------------------------------------------------------- ownership

    def acquire(self, unit: str, instance: str, layout: str = "") -> tuple[int, UnitRecord | None]:
        """Become the owner with a new epoch (fencing every earlier owner); return the committed record.

        ``layout``: the digest of the state layout this executor reads the unit's state with; a record
        written under another one raises :class:`LayoutChanged` and the unit is not taken."""
        epoch, rec = self._acquire(keys=[self.keys.unit(unit)], args=[instance, repr(time.time()), layout])
        if int(epoch) == -1:
            raise LayoutChanged(unit, rec.decode(), layout)
        return int(epoch), UnitRecord.decode(rec) if rec else None

    def release(self, unit: str, epoch: int) -> None:
        """Give the unit up after the last commit; raises :class:`Fenced` if it was taken meanwhile."""
        if not self._release(keys=[self.keys.unit(unit)], args=[str(epoch), repr(time.time())]):
            raise Fenced(unit, epoch, self.ownership(unit).epoch)

    def ownership(self, unit: str) -> Ownership:
        fields = self.client.hmget(self.keys.unit(unit), "owner", "epoch", "released_at")
        owner, epoch, released = cast(list[bytes | None], fields)  # a bytes client (decode_responses off)
        return Ownership((owner or b"").decode(), int(epoch or 0), float(released) if released else None)

    def load(self, unit: str) -> tuple[int, UnitRecord | None]:
        epoch, rec = cast(list[bytes | None], self.client.hmget(self.keys.unit(unit), "epoch", "rec"))
        return int(epoch or 0), UnitRecord.decode(rec) if rec else None

    def heartbeat(self, instance: str, ttl: float) -> None:
        self.client.set(self.keys.heartbeat(instance), b"1", px=int(ttl * 1000))

    def alive(self, instance: str) -> bool:
        return bool(instance) and bool(self.client.exists(self.keys.heartbeat(instance)))

    # ----------------------------------------------------------------------------------------- commit

    def commit(self, commit: Commit) -> None:
        """Apply ``commit`` atomically, or raise :class:`Fenced` and change nothing."""
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
        result = self._commit(keys=keys, args=args)
        if int(result[0]) != 1:
            unit_key = result[1].decode().split(":u:", 1)[-1]
            expected = next(e for u, e, _ in commit.units if u == unit_key)
            raise Fenced(unit_key, expected, result[2].decode())
