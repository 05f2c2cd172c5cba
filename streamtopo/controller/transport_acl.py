"""One Valkey ACL user per topology on the platform's transport, removing a topology's data, and trimming
named streams past what their readers have consumed (shared topologies' streams, controller/sharing.py).

Tenants choose their executors' image and expressions, so an executor must be able to touch nothing but
its own topology's data (design.md section 8, docs/security.md). Each StreamTopology that uses the
platform's Valkey gets its own ACL user:

- keys: its topology's keys (``st:{<namespace>/<name>}:*``, :class:`~streamtopo.contracts.Keys`) and its
  namespace's named streams (``<namespace>/*``: named streams are namespace-local);
- commands: reads of its own keys, and writes through the function library the operator loads (``FCALL``:
  streamtopo/valkey_library.py, which keeps each tenant's bytes within the platform's limits and makes
  its executors wait rather than exceed them). A Valkey function runs with its caller's permissions, so
  the few write commands the functions call are granted on the user's keys as well; what a tenant
  writes past the limits with them directly is contained by :func:`enforce_quota` (the operator's sweep
  every tick). Nothing else: no EVAL, SCRIPT or FUNCTION (one endless script blocks every tenant with
  BUSY), no keyspace-wide command (SCAN, KEYS, RANDOMKEY, DBSIZE), no database switch or copy (SELECT,
  COPY, MOVE, SWAPDB), no CLIENT TRACKING (broadcast mode shows other tenants' key names), no
  unbounded write (APPEND, SETRANGE, SADD ...), no slow read over whole values (LCS, SORT_RO);
- read only (``%R~``): the other namespaces' streams its sources read, which the platform shares
  (the chart's ``transport.sharedStreams``; the validator refuses any other);
- no pub/sub channel.

The admin credential stays with the operator. The user's password is an HMAC of the topology's
namespace, name and uid keyed by the admin password: the operator can re-assert the user every period
(Valkey keeps ACL users set at run time only until it restarts) without reading a Secret back, a topology
deleted and created again gets a new password, and rotating the admin password rotates every topology's.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamtopo import valkey_library
from streamtopo.contracts import Keys, UnitRecord
from streamtopo.planner.model import StreamTopology
from streamtopo.valkey_library import Limits

COMMANDS = (
    "-@all",
    # reads of the topology's own keys (the key patterns confine them)
    "+get",
    "+mget",
    "+exists",
    "+ttl",
    "+pttl",
    "+type",
    "+hget",
    "+hmget",
    "+hgetall",
    "+hvals",
    "+hkeys",
    "+hlen",
    "+hexists",
    "+hstrlen",
    "+xrange",
    "+xrevrange",
    "+xread",
    "+xlen",
    "+lrange",
    "+llen",
    # writes: the operator's functions, within the account limits. A function runs with its caller's
    # permissions, so the commands it calls are granted too; raw use of them past the limits is what
    # the operator's sweep (enforce_quota) contains.
    "+fcall",
    "+fcall_ro",
    "+time",
    "+xadd",
    "+xtrim",
    "+hset",
    "+hincrby",
    "+set",
    "+incr",
    "+pexpire",
    "+rpush",
    "+ltrim",
    # the connection itself
    "+ping",
    "+echo",
    "+hello",
    "+auth",
    "+quit",
    "+reset",
    "+client|setname",
    "+client|getname",
    "+client|id",
    "+client|info",
    "+client|setinfo",
)
"""The user's command rules, applied in order (Valkey ACL syntax)."""


def acl_user(keys: Keys) -> str:
    """``streamtopo:<namespace>/<name>``: one user per topology (``/`` is in no namespace or name)."""
    if not keys.namespace:
        raise ValueError(f"topology {keys.topology!r} has no namespace: ACL users are per namespace")
    return f"streamtopo:{keys.namespace}/{keys.topology}"


def _glob(text: str) -> str:
    """``text`` matched literally in a Valkey glob pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def key_patterns(keys: Keys) -> list[str]:
    """The key globs the user may access: its topology's keys and its namespace's named streams."""
    acl_user(keys)  # namespace required
    return [f"{_glob(keys.prefix)}:*", f"{_glob(keys.sink_stream(''))}*"]


def password(admin_password: str, keys: Keys, uid: str) -> str:
    """The topology's password, derived from the admin password (see the module docstring)."""
    message = f"{keys.namespace}/{keys.topology}/{uid}".encode()
    return hmac.new(admin_password.encode(), message, hashlib.sha256).hexdigest()


def acl_rules(keys: Keys, secret: str, shared: Iterable[str] = ()) -> list[str]:
    """ACL SETUSER rules: reset, enabled, exactly one password, the key patterns, read-only access to the
    ``shared`` streams of other namespaces, no channels, commands."""
    return [
        "reset",
        "on",
        f">{secret}",
        *(f"~{p}" for p in key_patterns(keys)),
        *(f"%R~{_glob(stream)}" for stream in sorted(shared)),
        "resetchannels",
        *COMMANDS,
    ]


def ensure_user(
    admin: Any, keys: Keys, secret: str, shared: Iterable[str] = (), limits: Limits | None = None
) -> str | None:
    """Load the function library with the platform's ``limits`` (when another is loaded) and create or
    reset the topology's user (idempotent; the rules are sent, never logged). A topology over its limits
    is contained instead (:func:`enforce_quota`) and the reason returned."""
    limits = limits or Limits()
    valkey_library.ensure(admin, limits)
    if problem := enforce_quota(admin, keys, limits):
        return problem
    admin.execute_command("ACL", "SETUSER", acl_user(keys), *acl_rules(keys, secret, shared))
    return None


RUNTIME_KEYS = re.compile(r":(u|s|hb|ready):|:(t0|backlog|pauses|dead-letter|quota|marks)$")
"""The keys the runtime and the function library write under a topology's prefix (contracts.Keys)."""
MEMORY_SLACK = 2.0
"""Valkey's own bytes per entry and key beyond what the library counts: a topology is over its limit
when its keys take more than this many times the limit (plus a MiB) in memory."""


@dataclass(frozen=True)
class Usage:
    """What a key pattern holds in Valkey (MEMORY USAGE, sampled as Valkey samples it)."""

    keys: int
    bytes: int
    longest: tuple[str, int] | None
    """The stream with the most entries, and how many."""
    strays: list[str]
    """Keys of no shape the runtime writes (:data:`RUNTIME_KEYS`)."""
    largest: list[tuple[str, int]]
    """Every key scanned with its bytes, largest first."""


def usage(admin: Any, pattern: str, stop_after: int, runtime: re.Pattern[str] | None = None) -> Usage:
    """Keys, bytes and the longest stream matching ``pattern``; the scan stops after ``stop_after`` keys
    (a tenant with more is over its limit whatever they hold)."""
    names: list[bytes] = []
    for name in admin.scan_iter(match=pattern, count=1000):
        names.append(name)
        if len(names) > stop_after:
            break
    total, longest, strays, sizes = 0, None, [], []
    for i in range(0, len(names), 500):
        batch = names[i : i + 500]
        pipe = admin.pipeline(transaction=False)
        for name in batch:
            pipe.memory_usage(name)
            pipe.type(name)
        replies = pipe.execute()
        streams = [n for n, t in zip(batch, replies[1::2]) if t in (b"stream", "stream")]
        pipe = admin.pipeline(transaction=False)
        for name in streams:
            pipe.xlen(name)
        for name, length in zip(streams, pipe.execute()):
            if longest is None or length > longest[1]:
                longest = (name.decode(), int(length))
        sizes += [(n.decode(), int(b or 0)) for n, b in zip(batch, replies[0::2])]
        if runtime is not None:
            strays += [n.decode() for n in batch if not runtime.search(n.decode())]
    total = sum(b for _, b in sizes)
    return Usage(len(names), total, longest, strays, sorted(sizes, key=lambda s: -s[1]))


def enforce_quota(admin: Any, keys: Keys, limits: Limits) -> str | None:
    """Contain a topology whose keys, or whose namespace's named streams, exceed the platform's limits
    (written past the function library with raw commands): switch its user off and disconnect its
    clients, delete its keys of no runtime shape, trim its streams to ``limits.stream_entries``, and
    delete its largest keys until it holds no more than its limit (what was written past the limit is
    the offender's own data); return why. The next sweep within the limits switches the user on again.
    None: within limits."""
    if not limits.account_bytes:
        return None
    budget = limits.account_bytes * MEMORY_SLACK + 2**20
    mine = usage(admin, f"{_glob(keys.prefix)}:*", limits.account_keys, RUNTIME_KEYS)
    named = usage(admin, f"{_glob(keys.sink_stream(''))}*", limits.account_keys)
    problems = []
    for what, used in (("the topology's keys", mine), ("the namespace's named streams", named)):
        if used.keys > limits.account_keys:
            problems.append(f"{what}: more than {limits.account_keys} keys")
        if used.bytes > budget:
            problems.append(f"{what}: {used.bytes} bytes in memory, the limit is {limits.account_bytes}")
        if limits.stream_entries and used.longest and used.longest[1] > limits.stream_entries:
            problems.append(
                f"{used.longest[0]}: {used.longest[1]} entries, the limit is {limits.stream_entries}"
            )
    if not problems:
        return None
    user = acl_user(keys)
    admin.execute_command("ACL", "SETUSER", user, "off")
    admin.execute_command("CLIENT", "KILL", "USER", user)
    if mine.strays:
        admin.unlink(*mine.strays[:10000])
    strays = set(mine.strays)
    for used in (mine, named):
        if limits.stream_entries and used.longest and used.longest[1] > limits.stream_entries:
            admin.xtrim(used.longest[0], maxlen=limits.stream_entries, approximate=False)
        held = used.bytes - sum(b for n, b in used.largest if n in strays)
        for name, size in used.largest:
            if held <= budget:
                break
            if name not in strays:
                admin.unlink(name)
                held -= size
    return (
        f"Valkey user {user} suspended: {'; '.join(problems)} (written past the function library); "
        f"{len(mine.strays)} stray key(s) deleted"
    )


def shared_reads(topology: StreamTopology) -> list[str]:
    """The other namespaces' streams ``topology``'s sources read (``<namespace>/<name>``)."""
    return sorted(
        {
            op.source.stream
            for op in topology.spec.operators
            if op.source and op.source.stream and "/" in op.source.stream
        }
    )


def remove_topology(admin: Any, keys: Keys, streams: Iterable[str] = (), limits: Limits | None = None) -> int:
    """Delete the topology's user, then its keys in every database and the named ``streams``; the number
    of keys deleted.

    The user goes first: Valkey disconnects its clients, so no executor still running can write a key
    after the sweep. Tenants' users can neither select another database nor copy into one, but a key an
    older version let them put there is swept too. Named streams go through ``streamtopo_drop``, so their
    namespace's account no longer counts their bytes; a Valkey that lost the library (a restart without
    persistence) gets it back with ``limits``.
    """
    admin.execute_command("ACL", "DELUSER", acl_user(keys))
    valkey_library.ensure_loaded(admin, limits)
    named = list(streams)
    deleted = int(admin.fcall("streamtopo_drop", len(named), *named)) if named else 0
    databases = int(admin.config_get("databases").get("databases", 1))
    pattern = f"{_glob(keys.prefix)}:*"
    for db in range(databases):
        client = admin if db == _database(admin) else _on_database(admin, db)
        names = list(client.scan_iter(match=pattern, count=1000))
        deleted += sum(int(client.unlink(*names[i : i + 500])) for i in range(0, len(names), 500))
    return deleted


def _database(client: Any) -> int:
    return int(client.connection_pool.connection_kwargs.get("db", 0))


def _on_database(admin: Any, db: int) -> Any:
    """A client of the admin's server and credentials on database ``db``."""
    return type(admin)(
        connection_pool=type(admin.connection_pool)(**{**admin.connection_pool.connection_kwargs, "db": db})
    )


def trim_point(client: Any, stream_key: str, units: Sequence[str]) -> str | None:
    """The id before which every reader unit has consumed ``stream_key``: the minimum over the units'
    committed offsets, or None while a reader has committed nothing (it reads from the start)."""
    if not units:
        return None
    pipe = client.pipeline(transaction=False)
    for unit in units:
        pipe.hget(unit, "rec")
    offsets = []
    for raw in pipe.execute():
        offset = UnitRecord.decode(raw).offsets.get(stream_key) if raw else None
        if offset is None:
            return None
        offsets.append(offset)
    return min(offsets, key=lambda i: tuple(int(p) for p in i.split("-")))


def trim(client: Any, stream_key: str, units: Sequence[str], limits: Limits | None = None) -> int:
    """Trim ``stream_key`` to what some reader still needs: ``XTRIM MINID`` keeps the last entry each
    reader consumed and everything after it (through ``streamtopo_trim``, loaded with ``limits`` when
    the Valkey has no library). Returns the entries removed."""
    point = trim_point(client, stream_key, units)
    if point is None:
        return 0
    valkey_library.ensure_loaded(client, limits)
    return int(client.fcall("streamtopo_trim", 1, stream_key, point))  # the account follows the trim
