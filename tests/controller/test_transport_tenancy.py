"""Tenants on one Valkey: the operator (kopf, against kmock's emulator) gives every topology its own ACL
user on a real Valkey, executors get only that user's Secret, and deleting a topology leaves nothing.

Two namespaces run a topology of the same name whose sinks write a stream of the same name: each user
reaches its own keys and is refused on the other's (a real Valkey with requirepass decides).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from controller_testkit import EmulatedKubernetes, wait_for
from test_kopf_kmock import cluster, operator, topology

from streamtopo.contracts import Keys
from streamtopo.controller.transport_acl import COMMANDS
from streamtopo.runtime.embedded import EmbeddedValkey

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

ADMIN = "4dmin-Pa55"
TENANTS = ("team-a", "team-b")


def cr_path(namespace: str) -> str:
    return f"/apis/streamtopo.dev/v1alpha1/namespaces/{namespace}/streamtopologies"


def shared_names(namespace: str) -> dict[str, Any]:
    """The kmock tests' topology ``pipe`` in ``namespace``, its sink writing the named stream ``out``."""
    doc = topology()
    doc["metadata"]["namespace"] = namespace
    for op in doc["spec"]["operators"]:
        if op["kind"] == "sink":
            op["sink"] = {"stream": "out"}
    return doc


@pytest.fixture
def valkey() -> Iterator[EmbeddedValkey]:
    server = EmbeddedValkey().start()
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", ADMIN)
        yield server
    finally:
        server.stop()


def secret(kube: EmulatedKubernetes, namespace: str) -> dict[str, str] | None:
    found = kube.get(f"/api/v1/namespaces/{namespace}/secrets/pipe-transport")
    if found is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


def test_two_tenants_with_the_same_names_cannot_reach_each_other_and_deletion_leaves_nothing(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, valkey: EmbeddedValkey
):
    cluster(kube)
    monkeypatch.setenv("STREAMTOPO_TRANSPORT_URL", valkey.url)
    monkeypatch.setenv("STREAMTOPO_TRANSPORT_ADMIN_PASSWORD", ADMIN)
    admin = redis.Redis.from_url(valkey.url, password=ADMIN)
    with operator(kube, monkeypatch, namespaces=()):
        for ns in TENANTS:
            kube.create(cr_path(ns), shared_names(ns))
        creds = {
            ns: wait_for(lambda ns=ns: secret(kube, ns), what=f"{ns}'s transport Secret") for ns in TENANTS
        }
        pods = {
            ns: wait_for(lambda ns=ns: kube.list(f"/api/v1/namespaces/{ns}/pods"), what=f"{ns}'s pods")
            for ns in TENANTS
        }

        # Executors get their topology's Secret and nothing else; the admin password appears nowhere.
        for ns in TENANTS:
            for pod in pods[ns]:
                env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
                for var, key in (
                    ("STREAMTOPO_TRANSPORT_USERNAME", "username"),
                    ("STREAMTOPO_TRANSPORT_PASSWORD", "password"),
                ):
                    assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "pipe-transport", "key": key}
                assert ADMIN not in str(pod)
        assert creds["team-a"]["username"] != creds["team-b"]["username"]
        assert creds["team-a"]["password"] != creds["team-b"]["password"]

        # Each user works on its own keys and named streams, and is refused on the other tenant's.
        clients = {
            ns: redis.Redis.from_url(
                valkey.url, username=creds[ns]["username"], password=creds[ns]["password"]
            )
            for ns in TENANTS
        }
        keys = {ns: Keys("pipe", ns) for ns in TENANTS}
        for ns, other in (TENANTS, TENANTS[::-1]):
            me = clients[ns]
            me.set(keys[ns].clock, "1")
            me.xadd(keys[ns].stream("src", "agg", 0), {"b": b"x"})
            me.xadd(keys[ns].sink_stream("out"), {"b": b"x"})
            assert me.xlen(keys[ns].sink_stream("out")) == 1
            theirs = keys[other]
            for command, *args in (
                (me.get, theirs.clock),
                (me.set, theirs.clock, "0"),
                (me.xrange, theirs.sink_stream("out")),
                (me.xadd, theirs.stream("src", "agg", 0), {"b": b"y"}),
                (me.eval, "return redis.call('GET', KEYS[1])", 1, theirs.clock),
                (me.scan, 0),  # keyspace-wide commands would show other tenants' key names
                (me.keys, "*"),
                (me.flushall,),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    command(*args)
        assert admin.get(keys["team-b"].clock) == b"1"  # team-a's refused SET changed nothing

        # Valkey forgets run-time ACL users when it restarts: the operator re-creates them by itself.
        admin.execute_command("ACL", "DELUSER", creds["team-b"]["username"])
        wait_for(
            lambda: admin.execute_command("ACL", "GETUSER", creds["team-b"]["username"]),
            timeout=20,
            what="team-b's user re-created",
        )
        assert clients["team-b"].get(keys["team-b"].clock) == b"1"

        # Deleting team-a's topology removes its user, keys and output stream; team-b keeps everything.
        kube.delete(f"{cr_path('team-a')}/pipe")
        wait_for(lambda: kube.get(f"{cr_path('team-a')}/pipe") is None, what="team-a's topology gone")
        assert admin.execute_command("ACL", "GETUSER", creds["team-a"]["username"]) is None
        left = [k.decode() for k in admin.scan_iter()]
        assert not [k for k in left if "team-a" in k], left
        assert {keys["team-b"].clock, keys["team-b"].sink_stream("out")} <= set(left)
        rules = admin.execute_command("ACL", "GETUSER", creds["team-b"]["username"])
        assert rules is not None and rules[b"commands"].decode().split() == list(COMMANDS)
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(
                valkey.url, username=creds["team-a"]["username"], password=creds["team-a"]["password"]
            ).ping()


def test_a_shared_stream_is_readable_across_namespaces_and_nothing_else(valkey: EmbeddedValkey):
    """The platform shares team-a's stream ``trades`` (transport.sharedStreams): a team-b topology whose
    source names ``team-a/trades`` is admitted and its user may read that stream, not write it, and not
    read team-a's other streams; an unshared qualified name is refused naming the field."""
    from streamtopo.controller import transport_acl
    from streamtopo.documents import load_topology
    from streamtopo.planner.model import TopologyError
    from streamtopo.planner.policy import PlatformPolicy

    policy = PlatformPolicy(shared_streams=("team-a/trades",))
    reader = shared_names("team-b")
    source = next(op for op in reader["spec"]["operators"] if op["kind"] == "source")
    source["source"] = {"stream": "team-a/trades"}
    topology = load_topology(reader, policy=policy)
    assert transport_acl.shared_reads(topology) == ["team-a/trades"]
    source["source"] = {"stream": "team-a/orders"}
    with pytest.raises(TopologyError) as error:
        load_topology(reader, policy=policy)
    assert [path for path, _ in error.value.problems] == ["spec.operators[0].source.stream"]
    load_topology(reader)  # locally (no platform) any stream may be read

    admin = redis.Redis.from_url(valkey.url, password=ADMIN)
    writer, mine = Keys("pipe", "team-a"), Keys("pipe", "team-b")
    assert mine.sink_stream("team-a/trades") == "team-a/trades" and mine.sink_stream("out") == "team-b/out"
    admin.xadd(writer.sink_stream("trades"), {"b": b"x"})
    admin.xadd(writer.sink_stream("orders"), {"b": b"x"})
    transport_acl.ensure_user(admin, mine, "r3ader-Pa55", transport_acl.shared_reads(topology))
    me = redis.Redis.from_url(valkey.url, username=transport_acl.acl_user(mine), password="r3ader-Pa55")
    assert len(me.xrange("team-a/trades")) == 1
    for command, *args in (
        (me.xadd, "team-a/trades", {"b": b"y"}),
        (me.delete, "team-a/trades"),
        (me.xrange, "team-a/orders"),
        (me.get, writer.clock),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            command(*args)
    me.xadd(mine.sink_stream("out"), {"b": b"z"})  # its own namespace's streams stay writable
