"""leave_room: a plan sees what other topologies' executors leave of each host."""

from __future__ import annotations

from streamtopo.planner.cluster import Cluster, leave_room


def three_hosts() -> Cluster:
    return Cluster.model_validate(
        {
            "hosts": [{"name": n, "cpu": 4} for n in ("a", "b", "c")],
            "links": [{"hosts": ["a", "b"], "bandwidth": 1e6}, {"hosts": ["b", "c"], "bandwidth": 2e6}],
        }
    )


def test_committed_cpu_is_taken_off_and_full_hosts_with_their_links_left_out():
    room = leave_room(three_hosts(), {"a": 1.5, "b": 3.95, "elsewhere": 9.0})
    assert {h.name: h.cpu for h in room.hosts} == {"a": 2.5, "c": 4.0}
    assert room.links == []  # both links touched b, which is full


def test_nothing_committed_or_everything_full_plans_on_the_cluster_as_it_is():
    cluster = three_hosts()
    assert leave_room(cluster, {}) is cluster
    assert leave_room(cluster, {"a": 4, "b": 4, "c": 4}) is cluster
