"""The contracts between the planner, the data plane and the controller: what each names and writes so
the others can find and read it. One definition each:

- units and key groups: :data:`KeyGroupId`, :func:`unit_key` (``operator/kg``);
- executor naming: :func:`executor_name` (``<topology>-e<i>``, in the plan, logs, live view and pods);
- Valkey keys and stream names: :class:`Keys` (namespace-scoped), and the environment variables that
  carry an executor's transport credentials (:data:`TRANSPORT_USERNAME_ENV`, :data:`TRANSPORT_PASSWORD_ENV`);
- metric names: :class:`Metric` (the executors export them; controller, live view, dashboards read them);
- a unit's committed record: :class:`UnitRecord` (the executors write it; the operator reads the
  offsets of named-stream readers to trim shared streams);
- the routing table: :class:`RoutingTable` (below).

The routing table says which executor runs each unit, versioned. The controller writes it (a ConfigMap
on Kubernetes, a file in ``streamtopo run``); every executor watches it. A key group moves when a new
version assigns its unit elsewhere: the donor sees that it no longer owns the unit, finishes its batch,
commits and releases; the receiver sees that it now owns it and resumes from the commit. ``version`` only
grows, so an executor never acts on an older table.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

KeyGroupId = tuple[str, int]
"""A unit: (operator, key group)."""


def unit_key(unit: KeyGroupId) -> str:
    """``operator/kg``: a unit as a JSON object key and a label value."""
    return f"{unit[0]}/{unit[1]}"


def parse_unit(key: str) -> KeyGroupId:
    operator, _, kg = key.rpartition("/")
    return operator, int(kg)


def executor_prefix(topology: str) -> str:
    """What every executor name of ``topology`` starts with: ``<topology>-e``, then the index.

    The one naming scheme of the plan, the logs, the live view and Kubernetes (pod names): the local run
    and the operator name executors alike, and a restarted operator finds its own pods by name.
    """
    return f"{topology}-e"


def executor_name(topology: str, index: int) -> str:
    """Executor ``index`` of ``topology`` (:func:`executor_prefix`)."""
    return f"{executor_prefix(topology)}{index}"


def executor_index(topology: str, name: str) -> int | None:
    """The index of an executor of ``topology``, None for a name outside the scheme."""
    tail = name.removeprefix(executor_prefix(topology))
    return int(tail) if tail != name and tail.isdigit() else None


class ExecutorEntry(BaseModel):
    """One executor of the table: where it runs and how big it is."""

    model_config = ConfigDict(frozen=True)
    host: str | None = None
    cpu: float = 1.0
    draining: bool = False
    """Marked for removal (ALBIC's B): owns units until they have moved away, then it is terminated."""


class RoutingTable(BaseModel):
    """unit -> executor, the executors, and the batch size of every stream, at one version."""

    model_config = ConfigDict(frozen=True)
    topology: str
    version: int = Field(ge=0)
    executors: dict[str, ExecutorEntry]
    units: dict[str, str]
    """``operator/kg`` -> executor name."""
    batch_sizes: dict[str, int] = Field(default_factory=dict)
    """``from->to`` -> records per transport entry (Aeolus)."""

    def owner(self, unit: KeyGroupId) -> str:
        return self.units[unit_key(unit)]

    def units_of(self, executor: str) -> list[KeyGroupId]:
        return sorted(parse_unit(k) for k, e in self.units.items() if e == executor)

    def assignment(self) -> dict[KeyGroupId, str]:
        return {parse_unit(k): e for k, e in self.units.items()}

    def moved(
        self,
        assignment: Mapping[KeyGroupId, str],
        executors: Mapping[str, ExecutorEntry] | None = None,
        batch_sizes: Mapping[str, int] | None = None,
    ) -> RoutingTable:
        """The next version with a new assignment (and executor set / batch sizes when given)."""
        return RoutingTable(
            topology=self.topology,
            version=self.version + 1,
            executors=dict(executors if executors is not None else self.executors),
            units={unit_key(u): e for u, e in sorted(assignment.items())},
            batch_sizes=dict(batch_sizes if batch_sizes is not None else self.batch_sizes),
        )

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> RoutingTable:
        return cls.model_validate_json(text)


class _Metadata(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str | None: ...


class _Named(Protocol):
    """A StreamTopology as far as its key names go."""

    @property
    def metadata(self) -> _Metadata: ...


class Keys:
    """Names of every Valkey key of one topology.

    Keys are scoped by namespace when the topology has one (on Kubernetes it always does): two namespaces
    may run topologies of the same name, and streams of the same name, on one Valkey without sharing a key.
    """

    def __init__(self, topology: str, namespace: str | None = None):
        self.topology = topology
        self.namespace = namespace
        self.prefix = f"st:{{{namespace}/{topology}}}" if namespace else f"st:{{{topology}}}"

    @classmethod
    def of(cls, topology: _Named) -> Keys:
        return cls(topology.metadata.name, topology.metadata.namespace)

    def stream(self, producer: str, consumer: str, kg: int) -> str:
        return f"{self.prefix}:s:{producer}->{consumer}:{kg}"

    def unit(self, unit_key: str) -> str:
        return f"{self.prefix}:u:{unit_key}"

    def heartbeat(self, instance: str) -> str:
        return f"{self.prefix}:hb:{instance}"

    def ready(self, executor: str) -> str:
        """Present (with a TTL) while executor ``executor`` is warm and stepping: donors hand units to it
        only then, so a unit keeps running on its donor while a new executor's JVM starts."""
        return f"{self.prefix}:ready:{executor}"

    def applied(self, executor: str) -> str:
        """The routing version executor ``executor`` last applied: a donor releases a unit only once the
        receiver runs a table that gives it the unit, so the receiver already takes the short steps of
        an executor waiting to acquire, and the unit's pause is one of those."""
        return f"{self.prefix}:applied:{executor}"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}:dead-letter"

    @property
    def backlog(self) -> str:
        """Hash stream key -> records appended and not yet consumed (kept exact by the commit script)."""
        return f"{self.prefix}:backlog"

    @property
    def pauses(self) -> str:
        """List of JSON hand-over records (unit, pause seconds, donor, receiver, kind, state bytes)."""
        return f"{self.prefix}:pauses"

    @property
    def upgrade(self) -> str:
        """The last upgrade whose state reset was carried out (controller/upgrade.py): a retried upgrade
        finds it and does not reset twice."""
        return f"{self.prefix}:upgrade"

    @property
    def clock(self) -> str:
        """Wall-clock start of the topology: sources emit records whose event time has come."""
        return f"{self.prefix}:t0"

    def sink_stream(self, name: str) -> str:
        """A user-named stream (``sink: {stream: NAME}``, ``source: {stream: NAME}``): the name itself, for
        other programs, prefixed ``<namespace>/`` when the topology has a namespace (namespace-local). A
        source's ``<namespace>/<name>`` (another namespace's stream, shared by the platform) is already
        the key."""
        if "/" in name or not self.namespace:
            return name
        return f"{self.namespace}/{name}"


def redis_url(url: str) -> str:
    """A transport URL as redis-py reads it: ``valkey://`` and ``valkeys://`` are aliases of ``redis://``
    and ``rediss://``."""
    return url.replace("valkeys://", "rediss://", 1).replace("valkey://", "redis://", 1)


TRANSPORT_USERNAME_ENV = "STREAMTOPO_TRANSPORT_USERNAME"
"""The Valkey ACL user an executor authenticates as (on Kubernetes its topology's own user, from the
topology's transport Secret); unset means Valkey's default user."""
TRANSPORT_PASSWORD_ENV = "STREAMTOPO_TRANSPORT_PASSWORD"
"""That user's password (a secretKeyRef on Kubernetes): passed to the client, never put in a URL."""


class Metric:
    """The series an executor exports on /metrics (prometheus_client names; a counter's samples add
    ``_total``, see :func:`total`). Labels: ``operator``, ``kg`` (unit series), ``from``/``to`` (traffic),
    ``executor``; the controller sums them per unit and executor (docs/operator.md)."""

    UNIT_BUSY = "streamtopo_unit_busy_seconds"
    UNIT_RECORDS_IN = "streamtopo_unit_records_in"
    UNIT_RECORDS_OUT = "streamtopo_unit_records_out"
    UNIT_RECORDS_DUE = "streamtopo_unit_records_due"
    """A generator unit's arrivals: records whose event time has come (its demand, met or not)."""
    KG_RECORDS = "streamtopo_kg_records"
    UNIT_STATE_BYTES = "streamtopo_unit_state_bytes"
    UNIT_BACKLOG = "streamtopo_unit_backlog_records"
    UNIT_OLDEST_AGE = "streamtopo_unit_oldest_record_age_seconds"
    EXECUTOR_CPU = "streamtopo_executor_cpu_seconds"
    EXECUTOR_CPU_WAIT = "streamtopo_executor_cpu_wait_seconds"
    """Seconds the executor's threads (JVM included) were runnable but waited for a CPU: a run queue
    longer than the host's cores, or CPU throttling (the controller's saturation evidence)."""
    EXECUTOR_MEMORY = "streamtopo_executor_memory_bytes"
    EXECUTOR_CAPACITY = "streamtopo_executor_cpu_capacity_cores"
    ROUTING_VERSION = "streamtopo_routing_version"
    MIGRATIONS = "streamtopo_migrations"
    MIGRATION_PAUSE = "streamtopo_migration_pause_seconds"
    DEAD_LETTERS = "streamtopo_dead_letters"
    SCHEDULING_STEPS = "streamtopo_scheduling_steps"
    SINK_LATENCY = "streamtopo_sink_latency_seconds"
    """Histogram: event time to sink write."""
    MEMBER_OPERATOR = "streamtopo_member_operator_info"
    """1 per (operator of a fused topology, member it serves, the member's name for it): joined on
    ``topology`` and ``operator``, any unit series reads per member (docs/sharing.md, "Fused")."""


MEMBERS_ANNOTATION = "streamtopo.dev/members"
"""On a fused topology (planner/benoit/fuse.py): JSON of member topology -> its operator -> the fused
operator. Its executors export it as :attr:`Metric.MEMBER_OPERATOR`; the operator reads membership from it."""


def fused_members(metadata: Mapping[str, object] | None) -> dict[str, dict[str, str]]:
    """A topology's :data:`MEMBERS_ANNOTATION`: empty unless it is a fused topology's, and when it is not
    a map of member -> operator -> operator (a tenant may write any annotation on its own topology)."""
    annotations = (metadata or {}).get("annotations") or {}
    text = annotations.get(MEMBERS_ANNOTATION) if isinstance(annotations, Mapping) else None
    try:
        members = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    valid = isinstance(members, dict) and all(
        isinstance(renamed, dict) and all(isinstance(v, str) for v in (member, *renamed, *renamed.values()))
        for member, renamed in members.items()
    )
    return members if valid else {}


def total(counter: str) -> str:
    """The sample name of counter ``counter`` in the exposition format."""
    return f"{counter}_total"


UNIT_RECORD_MAGIC = b"STU1"


@dataclass
class UnitRecord:
    """Everything a unit needs to resume elsewhere: the executor's bookkeeping plus operator state."""

    emitted: int = 0
    """Sources: records generated so far (the replay offset)."""
    offsets: dict[str, str] = field(default_factory=dict)
    """Input stream -> id of the last entry consumed."""
    seq_in: dict[str, int] = field(default_factory=dict)
    """Producer unit -> last sequence number applied (dedup of re-sent entries)."""
    wm_in: dict[str, float] = field(default_factory=dict)
    """Producer unit -> its last watermark (punctuation)."""
    seq_out: dict[str, int] = field(default_factory=dict)
    """Destination unit -> last sequence number sent."""
    wm_out: dict[str, float] = field(default_factory=dict)
    """Destination unit -> last watermark sent."""
    watermark: float = -math.inf
    """The unit's own watermark: min over its producers (a source: its generator's)."""
    records_in: int = 0
    records_out: int = 0
    sink_len: int = 0
    """File sinks: committed length of the key group's file, pending bytes included."""
    pending: bytes = b""
    """File sinks: the bytes of the last commit, (re)written at ``sink_len - len(pending)`` after it."""
    state: bytes = b""
    """Operator state (``UnitOperator.encode_state``)."""

    def encode(self) -> bytes:
        header = {k: v for k, v in asdict(self).items() if k not in ("pending", "state")}
        blob = json.dumps(header, separators=(",", ":")).encode()
        return b"".join(
            [
                UNIT_RECORD_MAGIC,
                struct.pack("<II", len(blob), len(self.pending)),
                blob,
                self.pending,
                self.state,
            ]
        )

    @classmethod
    def decode(cls, data: bytes) -> UnitRecord:
        if not data.startswith(UNIT_RECORD_MAGIC):
            raise ValueError("not a streamtopo unit record (bad magic)")
        n_header, n_pending = struct.unpack_from("<II", data, len(UNIT_RECORD_MAGIC))
        at = len(UNIT_RECORD_MAGIC) + 8
        header = json.loads(data[at : at + n_header])
        at += n_header
        return cls(**header, pending=data[at : at + n_pending], state=data[at + n_pending :])
