"""Hosts the planner places PEs on: CPU capacity and labels (COLA's hosts, design.md's Kubernetes nodes).

Hosts also carry a network card and the cluster its links (Benoit et al.'s B_u and bw_{u,v}), which only
sharing across topologies (``streamtopo share``) plans with; both default to 10 Gbit/s, a common node NIC.

On a cluster the controller builds a :class:`Cluster` from Node objects (allocatable CPU, labels);
``streamtopo plan --cluster hosts.yaml`` reads one from a file, and ``--hosts N --host-cpu C`` makes
a uniform one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import Field, ValidationError, model_validator

from streamtopo.planner.model import Model, TopologyError, parse_document, problems_of

M = TypeVar("M", bound=Model)

DEFAULT_BANDWIDTH = 1.25e9
"""Bytes per second of a host's card and of a link when the cluster file does not say: 10 Gbit/s."""


class Host(Model):
    """A machine that runs executors."""

    name: str = Field(min_length=1)
    cpu: float = Field(gt=0)
    """CPU cores available to executors (the node's allocatable CPU)."""
    memory: float | None = Field(default=None, gt=0)
    """Bytes available to executors, when known."""
    labels: dict[str, str] = Field(default_factory=dict)
    network: float = Field(default=DEFAULT_BANDWIDTH, gt=0, allow_inf_nan=False)
    """Bytes per second through the host's network card (B_u)."""

    def matches(self, selector: Mapping[str, str]) -> bool:
        """Resource matching: every label of the selector is on the host with the same value."""
        return all(self.labels.get(k) == v for k, v in selector.items())


def unique_names(hosts: list[Host]) -> list[str]:
    """The hosts' names; a ValueError naming those given twice (a validator's refusal)."""
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate host names: {', '.join(duplicates)}")
    return names


class Link(Model):
    """The bandwidth between two hosts (bw_{u,v}), shared by both directions."""

    hosts: tuple[str, str]
    bandwidth: float = Field(gt=0, allow_inf_nan=False)
    """Bytes per second."""


class Cluster(Model):
    """The hosts available to one topology."""

    hosts: list[Host] = Field(min_length=1)
    link_bandwidth: float = Field(default=DEFAULT_BANDWIDTH, gt=0, allow_inf_nan=False)
    """Bytes per second between two hosts that ``links`` does not list."""
    links: list[Link] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Cluster:
        names = unique_names(self.hosts)
        unknown = sorted({h for link in self.links for h in link.hosts if h not in names})
        if unknown:
            raise ValueError(f"links name unknown hosts: {', '.join(unknown)}")
        return self

    def bandwidth(self, u: str, v: str) -> float:
        return next((link.bandwidth for link in self.links if set(link.hosts) == {u, v}), self.link_bandwidth)

    @classmethod
    def uniform(cls, count: int, cpu: float, labels: Mapping[str, str] | None = None) -> Cluster:
        """``count`` identical hosts named host-1 .. host-N."""
        if count < 1:
            raise TopologyError([("hosts", "need at least one host")])
        if not cpu > 0 or not math.isfinite(cpu):
            raise TopologyError([("host-cpu", f"host CPU must be a positive finite number (got {cpu})")])
        return cls(
            hosts=[Host(name=f"host-{i + 1}", cpu=cpu, labels=dict(labels or {})) for i in range(count)]
        )

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    @property
    def capacity(self) -> dict[str, float]:
        return {h.name: h.cpu for h in self.hosts}


def parse_cluster(source: str | Mapping[str, Any], origin: str = "(text)") -> Cluster:
    """Validate ``hosts: [{name, cpu, memory, labels, network}]`` (and ``links``, ``linkBandwidth``) from
    YAML text or data (files: ``streamtopo.documents``); errors name the field like topology errors do."""
    return parse_hosts(source, origin, Cluster)


def parse_hosts(source: str | Mapping[str, Any], origin: str, model: type[M]) -> M:
    """A cluster file, or a file that extends it (emulated hosts, local/testbed.py), validated as ``model``;
    a bare list is its ``hosts``."""
    data = parse_document(source, origin)
    if isinstance(data, list):
        data = {"hosts": data}
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise TopologyError(problems_of(error)) from None


MIN_EXECUTOR_CPU = 0.1
"""Cores: the least an executor requests, so a host with less left is full for planning."""


def leave_room(cluster: Cluster, committed: Mapping[str, float]) -> Cluster:
    """``cluster`` with the CPU other topologies' executors request on each host taken off, so topologies
    sharing a cluster (a shared part and its consumers, tenants of one platform) are planned around each
    other instead of each onto the whole of every node. Full hosts are left out; when every host is full,
    the cluster as it is (the plan then reports the overload)."""
    if not any(committed.get(h.name) for h in cluster.hosts):
        return cluster
    hosts = [
        h.model_copy(update={"cpu": h.cpu - committed.get(h.name, 0.0)})
        for h in cluster.hosts
        if h.cpu - committed.get(h.name, 0.0) >= MIN_EXECUTOR_CPU
    ]
    if not hosts:
        return cluster
    names = {h.name for h in hosts}
    links = [link for link in cluster.links if set(link.hosts) <= names]
    return cluster.model_copy(update={"hosts": hosts, "links": links})
