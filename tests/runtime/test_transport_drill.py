"""Tenancy drill against a real Valkey (issue 32): one tenant's ACL user runs every attack it can while
another tenant's pipeline runs on the same server; the victim's output is exact and each attack is
refused or contained.

The server is configured as the chart configures the platform's Valkey (requirepass, maxmemory with
noeviction, a bound on one argument's size, client buffers bounded); the function library carries the
platform's limits; both users are the operator's (controller/transport_acl.py); a sweeper thread does
what the operator does every tick (``ensure_user``, which contains a topology past its limits). The
victim's executor runs in this process with its own tenant's credentials only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from runtime_support import (
    Running,
    assert_exactly_once,
    expected_totals,
    read_lines,
    round_robin,
    sequence_topology,
    wait_finished,
    write_routing,
)

from streamtopo.contracts import Keys
from streamtopo.controller import transport_acl
from streamtopo.local.runner import finalize_sinks
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import Executor
from streamtopo.valkey_library import Limits

pytestmark = [pytest.mark.valkey, pytest.mark.spark, pytest.mark.timeout(600)]

ADMIN = "dr1ll-Adm1n"
LIMITS = Limits(account_bytes=4 * 2**20, entry_bytes=2**20, stream_entries=5000)
COUNT, RATE, KEYS, WINDOW = 1500, 100, 7, 1.0


def refused(attack: Callable[[], Any]) -> str:
    """The error class the server answered ``attack`` with; the test fails if it was accepted."""
    try:
        attack()
    except (redis.exceptions.ResponseError, redis.exceptions.ConnectionError) as error:
        return type(error).__name__
    raise AssertionError("accepted")


def test_one_tenant_cannot_hurt_another_through_valkey(spark, tmp_path, monkeypatch):
    server = EmbeddedValkey().start()
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", ADMIN)
        admin = redis.Redis.from_url(server.url, password=ADMIN)
        admin.config_set("maxmemory", "48mb")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory-clients", "10%")
        admin.config_set("proto-max-bulk-len", "2mb")
        victim = sequence_topology("pipe", count=COUNT, rate=RATE, keys=KEYS, window=WINDOW)
        victim = victim.model_copy(
            update={"metadata": victim.metadata.model_copy(update={"namespace": "team-b"})}
        )
        mine, theirs = Keys("pipe", "team-a"), Keys.of(victim)
        for keys, secret in ((mine, "a-Pa55"), (theirs, "b-Pa55")):
            assert transport_acl.ensure_user(admin, keys, secret, limits=LIMITS) is None

        # The operator's tick: re-assert both users, containing whoever is past the limits.
        stop, suspensions = threading.Event(), {"team-a": 0, "team-b": 0}

        def sweep() -> None:
            while not stop.is_set():
                for keys, secret in ((mine, "a-Pa55"), (theirs, "b-Pa55")):
                    try:
                        if transport_acl.ensure_user(admin, keys, secret, limits=LIMITS):
                            suspensions[keys.namespace or ""] += 1
                    except redis.exceptions.ResponseError:
                        pass  # the server at maxmemory refuses the library's reload: the next tick
                stop.wait(0.2)

        sweeper = threading.Thread(target=sweep, daemon=True)
        sweeper.start()

        routing = tmp_path / "routing.json"
        write_routing(routing, round_robin(victim, ["ex-0"]))
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_USERNAME", transport_acl.acl_user(theirs))
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_PASSWORD", "b-Pa55")
        out = tmp_path / "out"
        running = Running(Executor(victim, routing, "ex-0", server.url, output_dir=out))
        try:
            outcomes = attack(server.url, mine, theirs)
            wait_finished(running.executor.store, victim)
        finally:
            running.stop()
            stop.set()
            sweeper.join(timeout=10)
        finalize_sinks(running.executor.store, victim, out)
    finally:
        server.stop()

    assert_exactly_once(read_lines(out), expected_totals(COUNT, RATE, KEYS, WINDOW))
    assert suspensions["team-b"] == 0
    assert suspensions["team-a"] >= 1, outcomes
    print("\n".join(f"{name}: {outcome}" for name, outcome in outcomes.items()))


def attack(url: str, mine: Keys, theirs: Keys) -> dict[str, str]:
    """Every attack of team-a's user; its outcome (the server's refusal, or how it was contained)."""
    me = redis.Redis.from_url(url, username=transport_acl.acl_user(mine), password="a-Pa55")
    mine_stream, their_unit = mine.stream("x", "y", 0), theirs.unit("totals/0")
    big = b"x" * (3 * 2**20)
    outcomes = {
        "EVAL endless loop": refused(lambda: me.eval("while true do end", 0)),
        "SCRIPT LOAD": refused(lambda: me.script_load("return 1")),
        "FUNCTION LOAD": refused(
            lambda: me.function_load("#!lua name=evil\nredis.register_function('evil', function() end)")
        ),
        "FUNCTION DELETE the library": refused(lambda: me.function_delete("streamtopo")),
        "FUNCTION FLUSH": refused(lambda: me.function_flush()),
        "FUNCTION KILL": refused(lambda: me.execute_command("FUNCTION", "KILL")),
        "CLIENT TRACKING BCAST": refused(lambda: me.execute_command("CLIENT", "TRACKING", "ON", "BCAST")),
        "CLIENT LIST": refused(lambda: me.execute_command("CLIENT", "LIST")),
        "SELECT another DB": refused(lambda: me.execute_command("SELECT", 1)),
        "COPY into another DB": refused(lambda: me.copy(mine.clock, mine.clock, destination_db=1)),
        "MOVE": refused(lambda: me.execute_command("MOVE", mine.clock, 1)),
        "SWAPDB": refused(lambda: me.execute_command("SWAPDB", 0, 1)),
        "SCAN": refused(lambda: me.scan(0)),
        "KEYS": refused(lambda: me.keys("*")),
        "FLUSHALL": refused(lambda: me.flushall()),
        "CONFIG SET maxmemory": refused(lambda: me.config_set("maxmemory", "0")),
        "LCS (CPU)": refused(lambda: me.execute_command("LCS", mine.clock, mine.clock)),
        "SORT_RO (CPU)": refused(lambda: me.execute_command("SORT_RO", mine.pauses)),
        "read the other tenant's unit": refused(lambda: me.hgetall(their_unit)),
        "commit into the other tenant's unit": refused(
            lambda: me.fcall("streamtopo_commit", 1, their_unit, 1, 0, 0, 0, "0", "1", b"rec")
        ),
        "append a 1.5 MiB entry through the library": refused(
            lambda: me.fcall("streamtopo_append", 1, mine_stream, "d", big[: 3 * 2**19])
        ),
        "raw SET of 3 MiB (one argument)": refused(lambda: me.set(mine.clock, big)),
        "a commit naming 70,000 keys": refused(
            lambda: me.fcall(
                "streamtopo_commit", 70000, *[mine.unit(f"u/{i}") for i in range(70000)], 0, 0, 0, 0, "0"
            )
        ),
    }
    floods: list[tuple[str, Callable[[redis.Redis, int], Any]]] = [
        (
            "library appends past the account",
            lambda c, i: c.fcall("streamtopo_append", 1, mine.sink_stream("out"), "d", b"y" * 2**19),
        ),
        ("raw XADD past the account and maxmemory", lambda c, i: c.xadd(mine_stream, {"d": b"z" * 2**20})),
        ("raw SETs of stray keys", lambda c, i: c.set(f"{mine.prefix}:junk:{i}", b"j" * 2**20)),
    ]
    for name, write in floods:
        client = redis.Redis.from_url(url, username=transport_acl.acl_user(mine), password="a-Pa55")
        outcomes[name] = flood(lambda i, c=client, w=write: w(c, i))
        time.sleep(1.0)  # the next ticks contain it and switch the user on again
    return outcomes


def flood(write: Callable[[int], Any], writes: int = 200) -> str:
    """Write until the server or the operator stops it; how it was stopped."""
    for i in range(writes):
        try:
            write(i)
        except redis.exceptions.AuthenticationError:
            return f"contained after {i} writes (user suspended)"
        except redis.exceptions.ConnectionError:
            return f"contained after {i} writes (disconnected)"
        except redis.exceptions.ResponseError as error:
            return f"refused after {i} writes ({str(error).split(':')[0]})"
    raise AssertionError(f"{writes} writes of 0.5-1 MiB accepted")


def test_deleting_a_topology_sweeps_every_database_and_its_named_streams_leave_the_account():
    """The delete sweep covers what a tenant could have written: its keys in any database (a COPY ... DB
    an older version allowed) and its named streams, whose bytes leave the namespace's account."""
    server = EmbeddedValkey().start()
    try:
        admin = redis.Redis.from_url(server.url)
        limits = Limits(account_bytes=2**20)
        gone, kept = Keys("pipe", "team-a"), Keys("other", "team-a")
        for keys in (gone, kept):
            transport_acl.ensure_user(admin, keys, "pw", limits=limits)
        tenant = redis.Redis.from_url(server.url, username=transport_acl.acl_user(gone), password="pw")
        from streamtopo.runtime.transport import append

        append(tenant, gone.sink_stream("out"), [b"d", b"x" * 1000])
        append(tenant, kept.sink_stream("theirs"), [b"d", b"y" * 1000])
        account = "team-a/#quota"
        before = int(admin.hget(account, "used"))
        admin.set(gone.clock, b"1")
        elsewhere = redis.Redis.from_url(server.url, db=3)
        elsewhere.set(f"{gone.prefix}:copied", b"1")
        elsewhere.set(f"{kept.prefix}:copied", b"1")
        deleted = transport_acl.remove_topology(admin, gone, [gone.sink_stream("out")])
        assert deleted == 3
        assert not admin.exists(gone.clock, gone.sink_stream("out"))
        assert not elsewhere.exists(f"{gone.prefix}:copied") and elsewhere.exists(f"{kept.prefix}:copied")
        assert admin.exists(kept.sink_stream("theirs"))
        assert int(admin.hget(account, "used")) == before - (1 + 1000) - 256  # its entry, its stream
    finally:
        server.stop()
