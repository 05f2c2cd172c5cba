"""One Valkey ACL user per topology on the platform's transport, removing a topology's data, and trimming
named streams past what their readers have consumed (shared topologies' streams, controller/sharing.py).

Tenants choose their executors' image and expressions, so an executor must be able to touch nothing but
its own topology's data (design.md section 8, docs/security.md). Each StreamTopology that uses the
platform's Valkey gets its own ACL user:

- keys: its topology's keys (``st:{<namespace>/<name>}:*``, :class:`~streamtopo.contracts.Keys`) and its
  namespace's named streams (``<namespace>/*``: named streams are namespace-local);
- commands: what an executor runs (streams, hashes, strings, lists, Lua scripts, transactions), without
  the keyspace-wide ones that would show or change other tenants' data (SCAN, KEYS, RANDOMKEY, DBSIZE,
  FLUSH*, SCRIPT FLUSH/KILL, FUNCTION, and every @admin or @dangerous command);
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
from typing import Any

from streamtopo.contracts import Keys, UnitRecord
from streamtopo.planner.model import StreamTopology

COMMANDS = (
    "-@all",
    "+@read",
    "+@write",
    "+@stream",
    "+@hash",
    "+@string",
    "+@list",
    "+@keyspace",
    "+@scripting",
    "+@transaction",
    "+@connection",
    "-@admin",
    "-@dangerous",
    "-@pubsub",
    "-scan",
    "-keys",
    "-randomkey",
    "-dbsize",
    "-script|flush",
    "-script|kill",
    "-function",
    "-select",
    "-swapdb",
    "-move",
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


def ensure_user(admin: Any, keys: Keys, secret: str, shared: Iterable[str] = ()) -> None:
    """Create or reset the topology's user (idempotent; the rules are sent, never logged)."""
    admin.execute_command("ACL", "SETUSER", acl_user(keys), *acl_rules(keys, secret, shared))


def shared_reads(topology: StreamTopology) -> list[str]:
    """The other namespaces' streams ``topology``'s sources read (``<namespace>/<name>``)."""
    return sorted(
        {
            op.source.stream
            for op in topology.spec.operators
            if op.source and op.source.stream and "/" in op.source.stream
        }
    )


def remove_topology(admin: Any, keys: Keys, streams: Iterable[str] = ()) -> int:
    """Delete the topology's user, then its keys and the named ``streams``; the number of keys deleted.

    The user goes first: Valkey disconnects its clients, so no executor still running can write a key
    after the sweep.
    """
    admin.execute_command("ACL", "DELUSER", acl_user(keys))
    names = [*admin.scan_iter(match=f"{_glob(keys.prefix)}:*", count=1000), *streams]
    return sum(int(admin.unlink(*names[i : i + 500])) for i in range(0, len(names), 500))


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


def trim(client: Any, stream_key: str, units: Sequence[str]) -> int:
    """Trim ``stream_key`` to what some reader still needs: ``XTRIM MINID`` keeps the last entry each
    reader consumed and everything after it. Returns the entries removed."""
    point = trim_point(client, stream_key, units)
    return int(client.xtrim(stream_key, minid=point, approximate=False)) if point else 0
