"""The local platform's hosts have room: executors start only where a host has a core for them, the rest
stay pending until one frees, and topologies run together see each other's executors (real executor
processes on an embedded Valkey; the JVMs need not finish starting)."""

from __future__ import annotations

from runtime_support import round_robin, sequence_topology

from streamtopo.contracts import ExecutorEntry, RoutingTable
from streamtopo.controller.platform import DesiredState
from streamtopo.local.platform import LocalPlatform, Machine, machine_cluster, machine_cores
from streamtopo.local.start import NoRoom, initial_routing
from streamtopo.planner.cluster import Cluster
from streamtopo.runtime.embedded import EmbeddedValkey


def on(routing: RoutingTable, host: str) -> RoutingTable:
    return routing.model_copy(
        update={"executors": {n: ExecutorEntry(host=host, cpu=1.0) for n in routing.executors}}
    )


def test_executors_start_where_there_is_room_and_the_rest_wait(tmp_path):
    topology = sequence_topology("room", count=10, rate=1, keys=3, window=1.0)
    routing = on(round_robin(topology, ["room-e0", "room-e1", "room-e2"]), "host-1")
    machine = Machine()
    with (
        EmbeddedValkey() as valkey,
        LocalPlatform(tmp_path / "a", valkey.url, Cluster.uniform(1, 2.0), machine=machine) as platform,
        LocalPlatform(tmp_path / "b", valkey.url, Cluster.uniform(1, 2.0), machine=machine) as other,
    ):
        platform.apply(DesiredState(topology, routing))
        assert sorted(platform.processes) == ["room-e0", "room-e1"] and list(platform.pending) == ["room-e2"]
        assert platform.running_executors()["room-e2"] is None  # pending: no host yet
        assert other.committed() == {"host-1": 2.0} and other.room() == {"host-1": 0.0}
        platform.stop("room-e0")  # a core frees: the pending executor takes it
        assert platform.schedule() == ["room-e2"] and not platform.pending
        assert sorted(platform.processes) == ["room-e1", "room-e2"]


def test_executors_beyond_the_room_are_refused_naming_the_option():
    topology = sequence_topology("pinned", count=10, rate=1, keys=3, window=1.0)
    cluster = Cluster.uniform(1, 2.0)
    assert len(initial_routing(topology, cluster, 2).routing.executors) == 2
    try:
        initial_routing(topology, cluster, 3)
    except NoRoom as error:
        assert "--executors 3" in str(error) and "room for 2 executor(s)" in str(error)
    else:
        raise AssertionError("three one-core executors on two cores were planned")
    # a second topology of the same run is planned into what the first left
    left = initial_routing(topology, cluster, None, room={"host-1": 1.0})
    assert len(left.routing.executors) == 1


def test_this_machine_is_the_default_host():
    machine = machine_cluster()
    assert len(machine.hosts) == 1 and machine.hosts[0].cpu == machine_cores() > 0
    assert machine.hosts[0].memory is not None and machine.hosts[0].memory > 0
