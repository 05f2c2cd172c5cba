"""Sharing on a cluster (kopf against kmock's emulator, a real Valkey): two opted-in topologies found one
managed shared StreamTopology that each deploys as a reader of; it trims its stream past both readers'
offsets; it outlives one consumer and goes with the last, stream included. A cycle creates nothing.

Two whose executors run alike found one managed fused StreamTopology that runs both, the common prefix
once; the members run no executors and show where they run; deleting one takes its operators out of the
fused topology (the other's keep their names, so their state) and the last one takes it with it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml
from controller_testkit import EmulatedKubernetes, wait_for
from test_kopf_kmock import CR_PATH, NS, cluster, condition, operator, pods, status
from test_sharing import topology

from streamtopo.contracts import Keys, UnitRecord, fused_members
from streamtopo.documents import load_topology
from streamtopo.runtime.embedded import EmbeddedValkey

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

ADMIN = "4dmin-Pa55"


def opted_in(name: str, window: str) -> dict[str, Any]:
    doc = topology(name, window=window)
    doc["metadata"] = {"name": name, "namespace": NS}  # the API server sets uid and creation time
    return doc


def shared_parts(kube: EmulatedKubernetes) -> list[dict[str, Any]]:
    return kube.list(CR_PATH, "streamtopo.dev/shared=true")


def deployed(kube: EmulatedKubernetes, name: str) -> Any:
    """The topology the operator deployed for ``name`` (its routing ConfigMap), once there is one."""
    cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-routing")
    return load_topology(yaml.safe_load(cm["data"]["topology.yaml"])) if cm else None


@pytest.fixture
def valkey(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    server = EmbeddedValkey().start()
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", ADMIN)
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_URL", server.url)
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_ADMIN_PASSWORD", ADMIN)
        monkeypatch.setenv("STREAMTOPO_TRIM_SECONDS", "0.5")
        yield redis.Redis.from_url(server.url, password=ADMIN)
    finally:
        server.stop()


def test_two_opted_in_topologies_share_one_part_that_lives_while_a_consumer_does(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, valkey: redis.Redis
):
    cluster(kube)
    with operator(kube, monkeypatch):
        for name, window in (("a", "10s"), ("b", "20s")):
            kube.create(CR_PATH, opted_in(name, window))
        part = wait_for(
            lambda: next(
                (p for p in shared_parts(kube) if len(p["metadata"].get("ownerReferences", [])) == 2), None
            ),
            what="one shared topology owned by both",
        )
        assert len(shared_parts(kube)) == 1
        shared = part["metadata"]["name"]
        assert sorted(r["name"] for r in part["metadata"]["ownerReferences"]) == ["a", "b"]

        # Each consumer runs its own operators and reads the prefix's result; the part runs the prefix.
        consumers = {n: wait_for(lambda n=n: deployed(kube, n), what=f"{n} deployed") for n in ("a", "b")}
        stream = consumers["a"].spec.operator("tag").source.stream
        for name, consumer in consumers.items():
            assert [op.name for op in consumer.spec.operators] == ["tag", f"agg-{name}", "out"]
            assert consumer.spec.operator("tag").source.stream == stream
            assert wait_for(lambda n=name: status(kube, n).get("sharing"), what="status.sharing") == {
                "sharedTopology": shared,
                "reads": [stream],
            }
        prefix = wait_for(lambda: deployed(kube, shared), what="the shared topology deployed")
        assert sorted(op.kind for op in prefix.spec.operators) == ["filter", "map", "sink", "source"]
        assert wait_for(lambda: pods(kube, shared), what="the shared topology's executors")
        assert wait_for(lambda: status(kube, shared).get("sharing"), what="consumers") == {
            "consumers": ["a", "b"]
        }
        # The user's specs are untouched: sharing is what the operator deploys, not what the tenant wrote.
        assert len(kube.get(f"{CR_PATH}/a")["spec"]["operators"]) == 5

        # The stream is trimmed only past what both readers have committed.
        key = Keys(shared, NS).sink_stream(stream)
        ids = [valkey.xadd(key, {"n": i}).decode() for i in range(10)]
        for name, last in (("a", 7), ("b", 4)):
            unit = Keys(name, NS).unit("tag/0")
            valkey.hset(unit, "rec", UnitRecord(offsets={key: ids[last]}).encode())
        wait_for(lambda: valkey.xlen(key) == 6, what="the stream trimmed to b's offset")
        assert valkey.xrange(key)[0][0].decode() == ids[4]

        kube.delete(f"{CR_PATH}/a")
        wait_for(lambda: kube.get(f"{CR_PATH}/a") is None, what="a deleted")
        part = wait_for(
            lambda: next((p for p in shared_parts(kube) if len(p["metadata"]["ownerReferences"]) == 1), None),
            what="the shared topology kept for b",
        )
        assert part["metadata"]["ownerReferences"][0]["name"] == "b"
        wait_for(lambda: status(kube, shared).get("sharing") == {"consumers": ["b"]}, what="consumers: b")
        assert valkey.exists(key)

        kube.delete(f"{CR_PATH}/b")
        wait_for(lambda: not shared_parts(kube), what="the shared topology deleted with its last consumer")
        wait_for(lambda: not valkey.exists(key), what="its stream removed")


def test_a_cycle_between_opted_in_topologies_creates_nothing(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    a, b = opted_in("a", "10s"), opted_in("b", "20s")
    a["spec"]["operators"][0]["source"] = {"stream": "y"}
    a["spec"]["operators"][-1]["sink"] = {"stream": "x"}
    b["spec"]["operators"][0]["source"] = {"stream": "x"}
    b["spec"]["operators"][-1]["sink"] = {"stream": "y"}
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, a)
        kube.create(CR_PATH, b)
        for name in ("a", "b"):
            refused = wait_for(lambda n=name: condition(kube, "Planned", n).get("reason"), what="refused")
            assert refused == "InvalidSpec"
            message = condition(kube, "Planned", name)["message"]
            assert "spec.sharing" in message and "cycle" in message
        assert not shared_parts(kube)
        assert not pods(kube, "a") and not pods(kube, "b")


def member(name: str, window: str) -> dict[str, Any]:
    doc = topology(name, window=window, alike=True)
    doc["metadata"] = {"name": name, "namespace": NS}  # the API server sets uid and creation time
    return doc


def fused_topologies(kube: EmulatedKubernetes) -> list[dict[str, Any]]:
    return kube.list(CR_PATH, "streamtopo.dev/fused=true")


def owner_names(doc: dict[str, Any]) -> list[str]:
    return sorted(r["name"] for r in doc["metadata"].get("ownerReferences", []))


def test_opted_in_topologies_run_fused_and_a_deleted_member_takes_only_its_operators_out(
    kube: EmulatedKubernetes,
    monkeypatch: pytest.MonkeyPatch,
    valkey: redis.Redis,  # dropping a's state needs the platform's transport
):
    cluster(kube)
    with operator(kube, monkeypatch):
        for name, window in (("a", "10s"), ("b", "20s")):
            kube.create(CR_PATH, member(name, window))
        fused = wait_for(
            lambda: next((f for f in fused_topologies(kube) if owner_names(f) == ["a", "b"]), None),
            what="one fused topology owned by both",
        )
        name = fused["metadata"]["name"]
        assert len(fused_topologies(kube)) == 1 and not kube.list(CR_PATH, "streamtopo.dev/shared=true")

        # The fused topology runs every operator, the prefix once; the members run nothing of their own.
        running = wait_for(lambda: deployed(kube, name), what="the fused topology deployed")
        assert [op.name for op in running.spec.operators] == [
            "src", "clean", "tag", "a-agg-a", "a-out", "b-agg-b", "b-out"
        ]  # fmt: skip
        assert wait_for(lambda: pods(kube, name), what="the fused topology's executors")
        for who in ("a", "b"):
            shown = wait_for(lambda w=who: status(kube, w).get("sharing"), what=f"{who}'s status.sharing")
            assert shown == {
                "fusedTopology": name,
                "operators": {"src": "src", "clean": "clean", "tag": "tag", f"agg-{who}": f"{who}-agg-{who}",
                              "out": f"{who}-out"},
            }  # fmt: skip
            assert not pods(kube, who) and deployed(kube, who) is None
            # its executors export the same map (Metric.MEMBER_OPERATOR), read from the routing ConfigMap
            assert fused_members(running.metadata.model_dump())[who] == shown["operators"]
            wait_for(
                lambda w=who: status(kube, w).get("phase") == status(kube, name).get("phase") is not None,
                what=f"{who} showing the fused topology's phase",
            )
        assert wait_for(lambda: status(kube, name).get("sharing"), what="members") == {
            "consumers": ["a", "b"]
        }
        # The tenants' specs are untouched.
        assert len(kube.get(f"{CR_PATH}/a")["spec"]["operators"]) == 5

        # A member's edit the fused state cannot take is refused on the member, naming the field; the
        # fused topology keeps running as it was.
        generation = kube.get(f"{CR_PATH}/{name}")["metadata"]["generation"]
        edited = kube.get(f"{CR_PATH}/a")["spec"]
        edited["operators"][3]["window"] = {"size": "15s"}
        kube.patch(f"{CR_PATH}/a", {"spec": {"operators": edited["operators"]}})
        refused = wait_for(
            lambda: (
                condition(kube, "Planned", "a").get("reason") == "InvalidSpec"
                and condition(kube, "Planned", "a")
            ),
            what="a's edit refused",
        )
        assert f"{name}: spec.operators[3].window" in refused["message"]
        assert kube.get(f"{CR_PATH}/{name}")["metadata"]["generation"] == generation

        kube.delete(f"{CR_PATH}/a")
        wait_for(lambda: kube.get(f"{CR_PATH}/a") is None, what="a deleted")
        left = wait_for(
            lambda: next((f for f in fused_topologies(kube) if owner_names(f) == ["b"]), None),
            what="the fused topology kept for b",
        )
        assert left["metadata"]["name"] == name
        after = wait_for(
            lambda: (d := deployed(kube, name)) is not None and len(d.spec.operators) == 5 and d,
            what="the fused topology re-deployed without a's operators",
        )
        assert [op.name for op in after.spec.operators] == ["src", "clean", "tag", "b-agg-b", "b-out"]
        assert list(fused_members(after.metadata.model_dump())) == ["b"]
        assert status(kube, "b")["sharing"]["fusedTopology"] == name
        # the status is patched after the deployment is applied: wait for it rather than race it
        last = wait_for(
            lambda: status(kube, name).get("lastUpgrade"), what="the fused topology's lastUpgrade"
        )
        assert last["removed"] == ["a-agg-a", "a-out"]

        kube.delete(f"{CR_PATH}/b")
        wait_for(lambda: not fused_topologies(kube), what="the fused topology deleted with its last member")
