"""The StreamTopology resource: the user contract, as pydantic models.

One source of truth: these models validate user files, generate the CRD schema (``streamtopo crd``),
the chart's CRD and the docs' field table. Attributes are snake_case; the wire format is the camelCase
of Kubernetes resources (``keyGroups``, ``ratePerSecond``), so every model accepts both.

Validation happens in two layers, both reporting the offending field by its path in the document:
the pydantic layer (types, ranges, required fields, one-of choices) and :func:`check_topology`, the
cross-field layer (names, inputs, cycles, constraints) that a single field cannot see.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cached_property
from types import UnionType
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import networkx as nx
import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from streamtopo.planner.expressions import Role, expression_problem
from streamtopo.planner.policy import (
    POLICY,
    PlatformPolicy,
    env_problem,
    image_problem,
    mount_problem,
    node_key_problem,
    shared_stream_problem,
    udf_problem,
    url_problem,
)
from streamtopo.planner.quantity import Quantity, executor_memory_problem

API_VERSION: Final = "streamtopo.dev/v1alpha1"
API_GROUP = API_VERSION.partition("/")[0]
KIND: Final = "StreamTopology"

OperatorKind = Literal["source", "map", "filter", "aggregate", "join", "udf", "sink"]
GeneratorName = Literal["trades", "quotes", "words", "sequence"]
FusionAlgorithm = Literal["cola", "none", "single", "fint", "metis"]
RebalancePolicy = Literal["albic", "milp", "flux", "potc", "cola", "cmr"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_PATTERN = r"^(\d+(\.\d+)?|(\d+(\.\d+)?(ms|s|m|h|d))+)$"
"""Seconds, or Go's duration grammar without signs and sub-millisecond units: ``90s``, ``1m30s``, ``1h``."""
_DURATION = re.compile(DURATION_PATTERN)


def parse_duration(value: Any) -> float:
    """Seconds from ``"90s"``, ``"5m"``, ``"250ms"``, ``"1h"``, ``"1m30s"`` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '60s', '5m', '250ms'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.match(value.strip()):
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in parts) if parts else float(text)
    else:
        raise ValueError(f"{value!r} is not a duration: use seconds or a string like '60s', '5m', '250ms'")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of a duration, so a round trip through YAML keeps it readable."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    parts, rest = [], seconds
    for unit in ("d", "h", "m", "s"):
        if (count := int(rest // _UNIT_SECONDS[unit])) > 0:
            parts.append(f"{count}{unit}")
            rest -= count * _UNIT_SECONDS[unit]
    milliseconds = round(rest * 1000, 3)
    if milliseconds or not parts:
        parts.append(f"{milliseconds:f}".rstrip("0").rstrip(".") + "ms")
    return "".join(parts)


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "a duration: seconds, or a number with unit ms, s, m, h or d (e.g. 60s, 5m)",
        }
    ),
]
"""Seconds as a float in Python; ``"60s"`` style strings in YAML and in the CRD."""

NonNegative = Annotated[float, Field(ge=0)]
DEFAULT_STEP_INTERVAL = 4.0
"""``spec.batching.interval``'s default (docs/benchmarks.md, "The step interval (issue 33)": per-executor
cost of a paced pipeline against the interval)."""
Name = Annotated[str, Field(pattern=_NAME.pattern, min_length=1, max_length=52)]
"""A Kubernetes object name (DNS-1123 label): topology and Secret names."""
OpName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$", min_length=1, max_length=63)]
"""An operator name: a letter, then letters, digits, '_' or '-'."""
MAX_EXPRESSION = 4096
MAX_EXPRESSION_TEXT = 128 * 1024
"""Characters of all a topology's expressions together: reading them is linear, and this keeps one
document's validation within about a second (docs/security.md)."""
MAX_OPERATORS = 512
MAX_EXECUTORS = 1024
MAX_RECORD_BYTES = 64 * 2**20
MAX_RATE_PER_SECOND = 1e8
MIN_INTERVAL = 1.0
MAX_STEP_INTERVAL = 60.0
"""Bounds on what one tenant's topology may ask for (docs/security.md): counts a planner and a cluster can
serve, so a huge value is refused at the door instead of hanging a worker."""


_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LabelKey = Annotated[str, Field(pattern=_LABEL_KEY.pattern, max_length=317)]
LabelValue = Annotated[str, Field(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]


StreamName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_{][A-Za-z0-9._:{}-]*$", min_length=1, max_length=200)]
SourceStreamName = Annotated[
    str,
    Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[A-Za-z0-9_{][A-Za-z0-9._:{}-]*$",
        min_length=1,
        max_length=264,
    ),
]
"""A stream a source reads: a name of the topology's namespace, or ``<namespace>/<name>`` of another
namespace, which a platform must share (:func:`shared_stream_problem`)."""
"""A named Valkey stream: letters, digits and ``._:-``, ``{}`` for a cluster hash tag."""
Expression = Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION)]
"""A Spark SQL expression, read by grammar and checked against the allow-list of planner/expressions.py."""


class Model(BaseModel):
    """Base of every spec model: camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """``keyGroups: true`` is a mistake, not 1: pydantic's lax mode would take a boolean for a number."""
        if isinstance(data, Mapping):
            for name, info in cls.model_fields.items():
                key = info.alias if info.alias in data else name
                if isinstance(data.get(key), bool) and _is_number(info.annotation):
                    raise field_error(info.alias or name, f"{key} is a number, not {str(data[key]).lower()}")
        return data


def _is_number(annotation: Any) -> bool:
    """int or float, possibly optional (bool is an int subclass but never a number here)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return any((get_args(a)[0] if get_origin(a) is Annotated else a) in (int, float) for a in args)


def field_error(field: str, message: str) -> PydanticCustomError:
    """A model-level validation error that still names its field: :func:`problems_of` appends
    ``field`` (camelCase) to the error's location, so users see ``spec.operators[0].source``."""
    return PydanticCustomError("field_error", message, {"field": field})


def _exactly_one(model: BaseModel, names: Iterable[str], what: str) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) != 1:
        spelled = ", ".join(to_camel(n) for n in names)
        raise ValueError(f"{what} needs exactly one of {spelled} (got {len(given)})")


class SecretKeyRef(Model):
    """A key of a Kubernetes Secret: credentials never appear in the spec in clear."""

    name: Name
    key: str = Field(min_length=1)


def cel(*rules: tuple[str, str, str]) -> ConfigDict:
    """A model's rules in CEL, for the CRD (``x-kubernetes-validations``: the API server checks them even
    where no admission webhook runs). Each is (rule, message, field path) and restates, for what CEL can
    say, a check of the model's own validators: tests/controller/test_cel.py shows that no rule refuses a
    document the validator accepts, and that each refuses the documents it is written for."""
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": rule, "message": message, **({"fieldPath": path} if path else {})}
                for rule, message, path in rules
            ]
        }
    )


class SourceSpec(Model):
    """Where a source's records come from: a built-in generator or a transport stream."""

    model_config = cel(
        ("has(self.generator) != has(self.stream)", "source needs exactly one of generator, stream", "")
    )

    generator: GeneratorName | None = None
    """Built-in generator: trades, quotes (VWAP), words, or sequence ({seq, key, value})."""
    stream: SourceStreamName | None = None
    """Read an existing Valkey/Redis stream of Arrow record batches instead of generating: a stream of
    the topology's namespace, or ``<namespace>/<name>`` that the platform shares across namespaces."""
    rate_per_second: float = Field(default=1000.0, gt=0, le=MAX_RATE_PER_SECOND)
    """Generated records per second over all key groups (also the planner's expected rate)."""
    count: int | None = Field(default=None, ge=0, le=10**12)
    """Stop after this many records (a finite run); unbounded when absent."""
    keys: int | None = Field(default=None, ge=1, le=10**8)
    """Distinct keys the generator draws (sequence: key = seq % keys)."""
    seed: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    """Seed of the generator, so a replay yields identical records."""

    @model_validator(mode="after")
    def _one_origin(self, info: ValidationInfo) -> SourceSpec:
        _exactly_one(self, ("generator", "stream"), "source")
        if self.stream is not None and (
            problem := shared_stream_problem(self.stream, (info.context or {}).get(POLICY))
        ):
            raise field_error("stream", problem)
        return self


class FileSinkSpec(Model):
    """JSON lines, one file per key group, under the run's output directory."""

    path: str | None = Field(default=None, min_length=1, max_length=1024)
    """File or directory name under the output directory (default: the operator's name)."""

    @model_validator(mode="after")
    def _inside_output(self) -> FileSinkSpec:
        """A tenant's sink writes under the run's output directory and nowhere else."""
        if self.path is not None:
            parts = self.path.replace("\\", "/").split("/")
            if self.path.startswith(("/", "\\", "~")) or ":" in parts[0]:
                raise field_error("path", f"{self.path!r}: a sink path is relative to the output directory")
            if ".." in parts or "\x00" in self.path:
                raise field_error("path", f"{self.path!r}: a sink path may not leave the output directory")
        return self


class ConsoleSinkSpec(Model):
    """Print records on the executor's standard output."""


class SinkSpec(Model):
    """Where a sink writes: a transport stream, files, or the console."""

    model_config = cel(
        (
            "(has(self.stream) ? 1 : 0) + (has(self.file) ? 1 : 0) + (has(self.console) ? 1 : 0) == 1",
            "sink needs exactly one of stream, file, console",
            "",
        )
    )

    stream: StreamName | None = None
    file: FileSinkSpec | None = None
    console: ConsoleSinkSpec | None = None

    @model_validator(mode="after")
    def _one_target(self) -> SinkSpec:
        _exactly_one(self, ("stream", "file", "console"), "sink")
        return self


class WindowSpec(Model):
    """An event-time window: tumbling when ``slide`` is absent or equals ``size``, sliding otherwise."""

    size: Duration
    slide: Duration | None = None

    @model_validator(mode="after")
    def _slide_fits(self) -> WindowSpec:
        if self.size <= 0:
            raise field_error("size", "window size must be positive")
        if self.slide is not None and not 0 < self.slide <= self.size:
            raise field_error("slide", "window slide must be positive and at most the size")
        return self

    @property
    def step(self) -> float:
        """Slide in seconds (the size for a tumbling window)."""
        return self.slide if self.slide is not None else self.size


class CostSpec(Model):
    """Profiled cost at the declared input rate; the planner estimates it when absent."""

    cpu: NonNegative | None = Field(default=None, le=1e4)
    """CPU cores the operator uses at its declared input rate (COLA's w_v)."""
    memory: NonNegative | None = Field(default=None, le=1e15)
    """State bytes the operator holds (drives migration cost)."""


class RequiresSpec(Model):
    """Resource matching: hosts whose labels match may run the operator (COLA's R_v)."""

    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _allowed_keys(self, info: ValidationInfo) -> RequiresSpec:
        policy = (info.context or {}).get(POLICY)
        for key in self.node_selector:
            if problem := node_key_problem(key, policy):
                raise field_error("nodeSelector", problem)
        return self


MAX_KEYED_SOURCE_KEYS = 4_000_000
"""Keys of a sequence source partitioned by key: each process hashes every key once to find its key
groups' seqs (planner/source_layout.py), about 32 bytes and 50 ns a key."""


def _keyed_source_problem(op: Operator) -> tuple[str, str] | None:
    """Why a source's ``keyBy`` cannot be honoured: its key groups must take exactly the records whose
    key hashes to them. A stream source can (runtime/dataflow.py: a sink's unit i partitioned by the same
    key over as many key groups is its key group i's alone, any other entry is split by key); a generator
    must generate them apart (planner/source_layout.py), which only the sequence generator's key allows."""
    assert op.source is not None
    read_by = "put keyBy on the operator that reads it"
    if op.source.generator is None:
        return None
    if op.source.generator != "sequence":
        return "keyBy", (
            f"a {op.source.generator} source draws each record's key from a hash of its seq, so a key group's"
            f" records cannot be generated apart: only the sequence generator (key = seq % keys) is"
            f" partitioned by key; {read_by}"
        )
    if op.key_by != ["key"]:
        return (
            "keyBy",
            f"a sequence source is partitioned by its key column only (keyBy: [key]), not {op.key_by}",
        )
    if op.source.keys is not None and op.source.keys > MAX_KEYED_SOURCE_KEYS:
        return "source.keys", f"a sequence source partitioned by key has at most {MAX_KEYED_SOURCE_KEYS} keys"
    return None


class Operator(Model):
    """A node of the user's graph."""

    model_config = cel(
        (
            "(self.kind == 'source') == has(self.source)",
            "a source operator has a source, no other has",
            ".source",
        ),
        ("(self.kind == 'sink') == has(self.sink)", "a sink operator has a sink, no other has", ".sink"),
        ("self.kind != 'filter' || has(self.expr)", "a filter operator needs expr", ".expr"),
        ("self.kind != 'map' || has(self.select)", "a map operator needs select", ".select"),
        (
            "self.kind != 'aggregate' || has(self.aggregations)",
            "an aggregate operator needs aggregations",
            ".aggregations",
        ),
        ("self.kind != 'udf' || has(self.function)", "a udf operator needs function", ".function"),
        (
            "self.kind != 'join' || (has(self.keyBy) && has(self.window))",
            "a join operator needs keyBy, window",
            ".keyBy",
        ),
        (
            "self.kind != 'source' || !has(self.keyBy) || (has(self.source) && (!has(self.source.generator)"
            " || (self.source.generator == 'sequence' && self.keyBy == ['key']"
            f" && (!has(self.source.keys) || self.source.keys <= {MAX_KEYED_SOURCE_KEYS}))))",
            "a source is partitioned by key (keyBy) only as a stream, or as a sequence generator by its key"
            f" column, of at most {MAX_KEYED_SOURCE_KEYS} keys",
            ".keyBy",
        ),
    )

    name: OpName
    kind: OperatorKind
    inputs: list[OpName] = Field(default_factory=list)
    """Upstream operators (none for a source, exactly two for a join)."""
    key_by: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=16
    )
    """Partition key columns; key groups are hash(key) mod keyGroups. On a source, each key group takes
    the records whose key hashes to it: a sequence generator (``[key]``) generates them there, a stream
    source takes a sink's unit i whole where the sink is partitioned alike, else splits entries by key.
    An operator keyed alike after it takes its records where they are, none cross."""
    key_groups: int | None = Field(default=None, ge=1, le=4096)
    """Key groups of this operator (defaults to spec.keyGroups, or to Aeolus' sizing when that is unset)."""
    expr: str | None = Field(default=None, min_length=1, max_length=MAX_EXPRESSION)
    """Filter predicate, a Spark SQL expression."""
    select: list[Expression] | None = Field(default=None, min_length=1, max_length=256)
    """Map projections, Spark SQL select expressions."""
    window: WindowSpec | None = None
    aggregations: list[Expression] | None = Field(default=None, min_length=1, max_length=64)
    """Aggregate expressions such as ``sum(price * volume) AS pv``."""
    pane_group: str | None = Field(default=None, min_length=1, max_length=63)
    """Windowed aggregates of one input, key and key-group count share sub-windows (C-MR's panes, one
    state per pane of their windows' common factor) only within one pane group. Unset is one group. The
    operator sets each member's name on a fused topology's aggregates (docs/sharing.md), so a member
    joining or leaving does not change another's panes, and so its state."""
    function: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """UDF as ``module:function``, a pandas DataFrame -> DataFrame function."""
    source: SourceSpec | None = None
    sink: SinkSpec | None = None
    cost: CostSpec | None = None
    requires: RequiresSpec | None = None
    selectivity: float | None = Field(default=None, ge=0, le=1e6)
    """Output records per input record (estimated per kind when absent)."""
    record_bytes: int | None = Field(default=None, ge=1, le=MAX_RECORD_BYTES)
    """Bytes per output record (default 64)."""

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Operator:
        needed = {
            "source": ["source"],
            "sink": ["sink"],
            "filter": ["expr"],
            "map": ["select"],
            "aggregate": ["aggregations"],
            "udf": ["function"],
            "join": ["key_by", "window"],
        }[self.kind]
        missing = [to_camel(n) for n in needed if getattr(self, n) is None]
        if missing:
            raise field_error(missing[0], f"a {self.kind} operator needs {', '.join(missing)}")
        if self.kind != "source" and self.source is not None:
            raise field_error("source", "only a source operator has a source")
        if self.kind == "source" and self.key_by is not None and (problem := _keyed_source_problem(self)):
            raise field_error(*problem)
        if self.kind != "sink" and self.sink is not None:
            raise field_error("sink", "only a sink operator has a sink")
        return self

    @model_validator(mode="after")
    def _allowed_udf(self, info: ValidationInfo) -> Operator:
        if self.function is not None:
            policy = (info.context or {}).get(POLICY)
            problem = udf_problem(self.function, policy.udf_modules if policy else None)
            if problem:
                raise field_error("function", problem)
        return self

    @model_validator(mode="after")
    def _allowed_expressions(self) -> Operator:
        """Tenant expressions read by grammar (planner/expressions.py): one expression each, of allowed
        node types and functions, no subquery, relation or reflective call; the columns they define
        never shadow the runtime's own (``_kg``, ``_input``, ``__*``; a map may set ``_ts``)."""
        texts: list[tuple[str, str, Role]] = [("expr", self.expr, "expr")] if self.expr is not None else []
        texts += [(f"select[{i}]", t, "select") for i, t in enumerate(self.select or [])]
        texts += [(f"aggregations[{i}]", t, "aggregation") for i, t in enumerate(self.aggregations or [])]
        for where, text, role in texts:
            if problem := expression_problem(text, role):
                raise field_error(where, f"{text!r} {problem}")
        return self


class StreamSpec(Model):
    """Override of a derived edge's expected rate and record size."""

    from_: OpName = Field(alias="from", validation_alias=AliasChoices("from", "from_"))
    to: OpName
    rate: NonNegative | None = Field(default=None, le=1e9)
    """Records per second on this edge."""
    record_bytes: int | None = Field(default=None, ge=1, le=MAX_RECORD_BYTES)


class HighAvailabilitySpec(Model):
    """Run ``replicas`` copies of a sub-graph on disjoint hosts (COLA's HA constraint)."""

    operators: list[OpName] = Field(min_length=1)
    replicas: int = Field(default=2, ge=2, le=16)
    isomorphic: bool = True
    """Replicas get identical PE structures (only the hosts differ)."""


Pair = Annotated[list[OpName], Field(min_length=2)]


class ConstraintsSpec(Model):
    """The placement constraints of COLA's Advanced mode; each list holds groups of operator names."""

    pe_colocation: list[Pair] = Field(default_factory=list)
    """Operators that must share a PE."""
    host_colocation: list[Pair] = Field(default_factory=list)
    """Operators that must share a host."""
    pe_exlocation: list[Pair] = Field(default_factory=list)
    """Operators that must be in different PEs."""
    host_exlocation: list[Pair] = Field(default_factory=list)
    """Operators that must be on different hosts."""
    high_availability: list[HighAvailabilitySpec] = Field(default_factory=list)
    pe_dedication: list[OpName] = Field(default_factory=list)
    """Operators that get a PE of their own."""
    host_dedication: list[OpName] = Field(default_factory=list)
    """Operators whose PE gets a host of its own."""


class FusionWeights(Model):
    """Weights of COLA's objective f(U, C) = utilization * U + communication * C."""

    utilization: NonNegative = 1.0
    communication: NonNegative = 1.0


class FusionSpec(Model):
    """How operators are fused into PEs and placed."""

    algorithm: FusionAlgorithm = "cola"
    weights: FusionWeights = Field(default_factory=FusionWeights)
    threshold: NonNegative = 0.5
    """COLA's T: phase 4 keeps splitting while C <= (1 + T) * c."""
    graph: Literal["auto", "logical", "unit"] = "auto"
    """Partition the logical graph, the unit graph, or choose by size (auto)."""
    profile_iterations: int = Field(default=0, ge=0, le=20)
    """COLA's profiling loop (Section 4): deploy NONE (every operator its own PE) first, then re-plan with
    ``algorithm`` on the costs measured over each statistics period (COLA with gamma rising 0.5 -> 1.0
    by 0.1), this many times, migrating to each plan; autoscaling takes over after the last. 0: plan
    once, on the declared costs."""


class SharingSpec(Model):
    """Benoit et al.'s reuse of common sub-trees, on a platform: the operators this topology computes
    identically with other opted-in topologies of its namespace run once, in a shared StreamTopology the
    operator manages, and this topology reads their results from its streams (docs/sharing.md)."""

    model_config = cel(
        (
            "self.scope == 'Namespace'",
            "sharing across namespaces is not allowed: streams and their access rights are per namespace",
            ".scope",
        )
    )

    enabled: bool = False
    scope: Literal["Namespace", "Cluster"] = "Namespace"
    """Only ``Namespace``: a tenant's records stay in its namespace. To give other namespaces a stream,
    the platform lists it in ``transport.sharedStreams`` (docs/security.md)."""
    gather_seconds: float = Field(default=10.0, ge=0, le=300)
    """A new topology with no partner yet waits this long for topologies applied with it (``kubectl apply
    -f dir/``) before it starts whole; a running topology is never re-wired onto a shared part."""

    @model_validator(mode="after")
    def _namespace_scope(self) -> SharingSpec:
        if self.scope != "Namespace":
            raise field_error(
                "scope",
                "sharing across namespaces is not allowed: streams and their access rights are per "
                "namespace (a platform shares a stream with every namespace through transport.sharedStreams)",
            )
        return self


UpgradeMode = Literal["keepState", "resetState"]


class UpgradeSpec(Model):
    """What a spec change on a running topology may do to its state (the Flink Kubernetes Operator's
    upgrade modes; planner/upgrade.py decides per operator, docs/operator.md has the table)."""

    mode: UpgradeMode = "keepState"
    """``keepState``: every operator keeps its state and offsets; a change the running state cannot be
    read by (a stateful operator's key, key groups, aggregations, window, join inputs, a source's stream,
    a file sink's path, a stateful operator removed or renamed) is refused with a condition naming the
    field, and the last good deployment keeps running. ``resetState``: the operators such a change
    touches start from empty state at their recorded offsets; the others keep theirs."""
    allow_non_restored_state: bool = False
    """Flink's ``allowNonRestoredState``: under ``keepState``, a removed stateful operator's state is
    dropped instead of the change being refused. The operator sets it on the fused topologies it manages
    (docs/sharing.md), whose operators go when the topology they belong to is deleted."""


class AlbicSpec(Model):
    """ALBIC's collocation heuristic (Algorithm 2) parameters."""

    max_load_distance: NonNegative = 10.0
    """maxLD, percentage points."""
    max_partition_load: NonNegative = 25.0
    """maxPL, initial, percentage points."""
    step_partition_load: NonNegative = 5.0
    """stepPL, the back-off step."""
    score_factor: float = Field(default=1.5, gt=0)
    """sF: a pair is a collocation candidate when out > avg * sF."""
    new_collocations: int = Field(default=1, ge=1, le=1000)
    """New collocation constraints per round (Step 3 repeated on disjoint pairs within the migration
    budget). 1 is the paper's; more collocates sooner (docs/albic.md, "New collocations per round")."""


class ScalingRuleSpec(Model):
    """The horizontal scaling rule and its bounds: the one definition that ``spec.autoscaling``, the
    simulator's scenario files and the rules themselves (planner/scaling, ``ScalingConfig``) share.
    Defaults follow the Flink Kubernetes Operator's autoscaler (docs/scaling.md)."""

    model_config = cel(
        (
            "self.minExecutors <= self.maxExecutors",
            "minExecutors is larger than maxExecutors",
            ".minExecutors",
        ),
        (
            "self.utilizationBand < self.targetUtilization",
            "utilizationBand must be below targetUtilization",
            ".utilizationBand",
        ),
        (
            "self.dstreamsDownRatio < self.dstreamsUpRatio",
            "dstreamsDownRatio must be below dstreamsUpRatio",
            ".dstreamsDownRatio",
        ),
    )

    rule: Literal["target", "dstreams", "off"] = "target"
    """``target``: executors for the target utilisation (and the backlog); ``dstreams``: Spark's
    processing-time ratio rule; ``off``: only min/max are enforced."""
    min_executors: int = Field(default=1, ge=1, le=MAX_EXECUTORS)
    max_executors: int = Field(default=32, ge=1, le=MAX_EXECUTORS)
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    utilization_band: float = Field(default=0.1, ge=0, lt=1)
    """Act only when utilisation leaves [target - band, target + band]."""
    stabilization: Duration = 300.0
    """No scaling decision for this long after a change."""
    metric_window: Duration = 300.0
    """Rates are averaged over this window (at least one statistics period)."""
    scale_down_delay: Duration = 1800.0
    """A scale-down must be wanted this long before it happens."""
    scale_up_grace: Duration = 3600.0
    """No scale-down this long after a scale-up (Flink: job.autoscaler.scale-up.grace-period)."""
    max_scale_down_fraction: float = Field(default=0.5, gt=0, le=1)
    """Share of the executors one scale-down may remove (0.5: at most halve)."""
    catch_up: Duration = 300.0
    """Seconds in which a backlog should be processed (Flink's catch-up duration)."""
    backlog_seconds: Duration = 30.0
    """Backlog mode when the lag exceeds this many seconds of input."""
    dstreams_up_ratio: float = Field(default=0.9, gt=0)
    """``dstreams``: scale out when processing time / batch interval >= this."""
    dstreams_down_ratio: float = Field(default=0.3, ge=0)
    """``dstreams``: scale in when processing time / batch interval <= this."""
    saturation_threshold: float = Field(default=0.25, gt=0, lt=1)
    """A period in which executors' threads waited for a CPU more than this share of their runnable time
    (a run queue longer than the host's cores, or CPU throttling) measured a saturated host: its rates
    are not capacity evidence, and an over-provisioned saturated host is scaled down."""
    scaling_effectiveness_threshold: float = Field(default=0.1, ge=0, le=1)
    """A scale-up that raised the measured true capacity by less than this share of what it expected is
    ineffective: no further scale-up until the count changes otherwise (Flink:
    job.autoscaler.scaling.effectiveness.threshold)."""

    @model_validator(mode="after")
    def _rule_bounds(self) -> ScalingRuleSpec:
        if self.min_executors > self.max_executors:
            raise field_error("minExecutors", "minExecutors is larger than maxExecutors")
        if self.utilization_band >= self.target_utilization:
            raise field_error("utilizationBand", "utilizationBand must be below targetUtilization")
        if self.catch_up <= 0:
            raise field_error("catchUp", "catchUp must be positive")
        if self.dstreams_down_ratio >= self.dstreams_up_ratio:
            raise field_error("dstreamsDownRatio", "dstreamsDownRatio must be below dstreamsUpRatio")
        return self


class AutoscalingSpec(ScalingRuleSpec):
    """The statistics-period loop: ALBIC rebalancing plus horizontal scaling of executors (the scaling
    rule's fields are the ones ``streamtopo simulate`` scenarios use)."""

    enabled: bool = True
    """``false`` is the same as ``mode: Off``."""
    mode: Literal["Auto", "Recommend", "Off"] = "Auto"
    """Auto: apply every period's decision. Recommend: compute and publish each decision
    (status.recommendation, a Recommendation Event) and apply one only when the topology is annotated
    ``streamtopo.dev/approve: <its id>``. Off: no decisions."""
    interval: Duration = 60.0
    """SPL, the statistics period."""
    policy: RebalancePolicy = "albic"
    max_migrations_per_round: int | None = Field(default=10, ge=0, le=100_000)
    max_migration_cost: NonNegative | None = None
    """Bound on the summed migration cost (state bytes) per round instead of a count."""
    failure_grace: Duration = 300.0
    """An executor that has not run for this long (its pod crash-looping, unable to pull its image,
    evicted) is marked for removal at the next period: ALBIC moves its key groups to the others."""
    albic: AlbicSpec = Field(default_factory=AlbicSpec)

    @property
    def acting(self) -> Literal["Auto", "Recommend", "Off"]:
        """The mode in force (``enabled: false`` turns any mode off)."""
        return self.mode if self.enabled else "Off"

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.interval < MIN_INTERVAL:
            raise field_error(
                "interval", f"the SPL interval must be at least {MIN_INTERVAL:g}s (got {self.interval:g}s)"
            )
        return self


class PrometheusSpec(Model):
    url: str = Field(pattern=r"^https?://[^\s/?#]+[^\s]*$", max_length=2048)
    """http or https only (no file:// or other schemes reach the operator's HTTP client), no userinfo; on
    a platform only one of its URLs by scheme, host and port (the operator queries the URL from inside the
    cluster)."""
    basic_auth_secret: SecretKeyRef | None = None
    """Secret holding ``user:password`` for basic auth."""

    @model_validator(mode="after")
    def _allowed_url(self, info: ValidationInfo) -> PrometheusSpec:
        policy = (info.context or {}).get(POLICY)
        if problem := url_problem(self.url, policy.prometheus_urls if policy else None):
            raise field_error("url", problem)
        return self


class MetricsSpec(Model):
    """Where the controller reads runtime metrics; direct scrape of executors when absent."""

    prometheus: PrometheusSpec | None = None


class TransportSpec(Model):
    """The Valkey/Redis server of the streams between executors."""

    url: str = Field(
        default="redis://valkey:6379", pattern=r"^(redis|rediss|valkey|valkeys)://", max_length=2048
    )
    """No userinfo: the password comes from ``passwordSecret``, never from the spec in clear."""
    password_secret: SecretKeyRef | None = None

    @model_validator(mode="after")
    def _no_credentials(self) -> TransportSpec:
        if "@" in self.url.split("://", 1)[1].split("/", 1)[0]:
            raise field_error("url", "a transport URL with userinfo is not allowed; use passwordSecret")
        return self


class BatchingSpec(Model):
    """How records are batched: per edge (Aeolus: batch size from its cost model, capped at ``maxBytes``)
    and in time (``interval``: how often an executor that keeps up runs a step)."""

    max_bytes: int = Field(default=65536, ge=64, le=64 * 2**20)
    """B_max (the Aeolus paper uses 64 KB)."""
    size: int | None = Field(default=None, ge=1, le=10**7)
    """Fixed records per batch, overriding Aeolus."""
    interval: Duration = DEFAULT_STEP_INTERVAL
    """Seconds between the starts of two steps of an executor that keeps up with its input, as Spark
    Structured Streaming's processing-time trigger (sooner where steps are quick: at most 4x a step's
    length): a step's fixed cost (planning its Spark jobs, the JIT, the Python around them: about 0.5
    CPU-s on a 2-core machine) is paid once per interval instead of back to back, at the price of up to
    this much latency per executor a record passes. A step that is behind (records due or entries queued
    beyond what it took) is followed at once. ``0s``: step again at once (an executor then uses a whole
    core whenever records keep coming)."""

    @model_validator(mode="after")
    def _interval_bounds(self) -> BatchingSpec:
        if not 0 <= self.interval <= MAX_STEP_INTERVAL:
            raise field_error(
                "interval", f"interval must be between 0s and {MAX_STEP_INTERVAL:g}s (got {self.interval:g}s)"
            )
        return self


# --------------------------------------------------------------------------------- executor pods

RESERVED_LABEL_PREFIXES = (
    "streamtopo.dev/",
    "app.kubernetes.io/",
    "op.streamtopo.dev/",
    "ha.streamtopo.dev/",
)
"""Label prefixes the operator sets on executor pods (selection, exlocation): a template cannot set them."""
EXECUTOR_CONFIG_DIR = "/etc/streamtopo"
"""Where executor pods mount their routing ConfigMap (topology.yaml, routing.json)."""


class ExecutorResources(Model):
    """What every executor pod requests."""

    cpu: float | None = Field(default=None, gt=0, le=1024)
    """Cores per executor. Unset: each executor requests its PE's size (COLA), and executors the
    autoscaler adds one core. Set: every executor requests this much and the planner's executor capacity
    (ALBIC's, the scaling rule's) is this many cores."""
    memory: Quantity | None = None
    """Memory request and limit per executor (the JVM's heap, a quarter of it and at least 512Mi, lives in
    it). At least 1Gi. Unset: the platform default (the chart's ``executor.memory``)."""

    @model_validator(mode="after")
    def _memory_runs_an_executor(self) -> ExecutorResources:
        if self.memory is not None and (problem := executor_memory_problem(self.memory)):
            raise field_error("memory", problem)
        return self


class LocalObjectReference(Model):
    name: Name


class KeyRef(Model):
    name: Name
    key: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class EnvVarSource(Model):
    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None


class EnvVar(Model):
    """An environment variable of the executor container: a value, or a key of a Secret or ConfigMap of
    the topology's namespace."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=253)
    value: str | None = Field(default=None, max_length=32768)
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if problem := env_problem(self.name):
            raise field_error("name", problem)
        if self.value is not None and self.value_from is not None:
            raise field_error("valueFrom", "set value or valueFrom, not both")
        return self


class VolumeMount(Model):
    name: Name
    mount_path: str = Field(pattern=r"^/", max_length=4096)
    read_only: bool = False
    sub_path: str | None = Field(default=None, pattern=r"^[^/]", max_length=4096)

    @model_validator(mode="after")
    def _not_the_executors(self) -> VolumeMount:
        """A tenant volume never shadows the runtime's code, configuration or scratch space."""
        if problem := mount_problem(self.mount_path):
            raise field_error("mountPath", problem)
        if self.sub_path and ".." in self.sub_path.split("/"):
            raise field_error("subPath", "no '..' in sub paths")
        return self


class ConfigMapVolume(Model):
    name: Name
    optional: bool | None = None


class SecretVolume(Model):
    secret_name: Name
    optional: bool | None = None


class EmptyDirVolume(Model):
    medium: Literal["", "Memory"] | None = None
    size_limit: Quantity | None = None


class ClaimVolume(Model):
    claim_name: Name
    read_only: bool | None = None


class Volume(Model):
    """A volume of the executor pod: ConfigMap, Secret, emptyDir or PersistentVolumeClaim of the topology's
    namespace (no hostPath or other node-level sources: tenants do not reach the nodes)."""

    name: Name
    config_map: ConfigMapVolume | None = None
    secret: SecretVolume | None = None
    empty_dir: EmptyDirVolume | None = None
    persistent_volume_claim: ClaimVolume | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = [self.config_map, self.secret, self.empty_dir, self.persistent_volume_claim]
        if sum(s is not None for s in sources) != 1:
            raise field_error(
                "name",
                f"volume {self.name}: exactly one of configMap, secret, emptyDir, persistentVolumeClaim",
            )
        if self.name in ("config", "tmp"):
            raise field_error("name", f"volume {self.name} is the executor's own")
        return self


class Toleration(Model):
    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, le=10**9)

    @model_validator(mode="after")
    def _allowed_key(self, info: ValidationInfo) -> Toleration:
        if problem := node_key_problem(self.key, (info.context or {}).get(POLICY)):
            raise field_error("key", problem)
        return self


class NodeSelectorRequirement(Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[LabelValue] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _allowed_key(self, info: ValidationInfo) -> NodeSelectorRequirement:
        if problem := node_key_problem(self.key, (info.context or {}).get(POLICY)):
            raise field_error("key", problem)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """As the scheduler reads it (Gt/Lt compare integers)."""
        value = labels.get(self.key)
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if self.operator == "In":
            return value in self.values
        if self.operator == "NotIn":
            return value not in self.values
        try:
            number, bound = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if self.operator == "Gt" else number < bound


class NodeSelectorTerm(Model):
    match_expressions: list[NodeSelectorRequirement] = Field(min_length=1, max_length=32)


class NodeSelector(Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=16)


class NodeAffinity(Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(Model):
    node_affinity: NodeAffinity | None = None


class TemplateMetadata(Model):
    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=64)
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64
    )

    @model_validator(mode="after")
    def _not_ours(self) -> TemplateMetadata:
        for kind, keys in (("labels", self.labels), ("annotations", self.annotations)):
            bad = sorted(k for k in keys if len(k) > 317 or not _LABEL_KEY.match(k))
            if bad:
                raise field_error(kind, f"{', '.join(map(repr, bad))}: not a valid key (prefix/name)")
            taken = sorted(k for k in keys if k.startswith(RESERVED_LABEL_PREFIXES))
            if taken:
                raise field_error(
                    kind,
                    f"{', '.join(taken)}: the prefixes {', '.join(RESERVED_LABEL_PREFIXES)} "
                    "are the operator's",
                )
        return self


class PodSpecTemplate(Model):
    """The pod-level fields a template may set."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    affinity: Affinity | None = None
    """Node affinity terms the planner also honours: executors are placed only on matching nodes (each
    term ANDed with the planned node)."""
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, max_length=16)
    service_account_name: Name | None = None
    priority_class_name: Name | None = None
    volumes: list[Volume] = Field(default_factory=list, max_length=32)


class PodTemplate(Model):
    """A PodTemplateSpec subset merged into every executor pod (Flink's podTemplate, spark-operator's
    executor section). Security contexts, probes, the image and the command stay the operator's."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: PodSpecTemplate = Field(default_factory=PodSpecTemplate)

    def node_terms(self) -> list[NodeSelectorTerm]:
        affinity = self.spec.affinity
        required = (
            affinity.node_affinity.required_during_scheduling_ignored_during_execution
            if affinity and affinity.node_affinity
            else None
        )
        return list(required.node_selector_terms) if required else []

    def allows(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with ``labels`` satisfies the template's node affinity (any term, all of its
        expressions)."""
        terms = self.node_terms()
        return not terms or any(all(e.matches(labels) for e in t.match_expressions) for t in terms)


class ExecutorSpec(Model):
    """How executor pods are shaped (resources, environment, mounts, a pod template)."""

    resources: ExecutorResources = Field(default_factory=ExecutorResources)
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=32)
    pod_template: PodTemplate = Field(default_factory=PodTemplate)

    @model_validator(mode="after")
    def _mounts_have_volumes(self) -> ExecutorSpec:
        volumes = {v.name for v in self.pod_template.spec.volumes}
        missing = sorted({m.name for m in self.volume_mounts} - volumes)
        if missing:
            raise field_error(
                "volumeMounts", f"no volume named {', '.join(missing)} in podTemplate.spec.volumes"
            )
        return self


class StreamTopologySpec(Model):
    """What the user declares."""

    model_config = cel(
        (
            "self.operators.all(o, self.operators.exists_one(p, p.name == o.name))",
            "operator names must be unique",
            ".operators",
        )
    )

    image: str = Field(default="streamtopo/runtime:0.1.0", max_length=512)
    """The executors' image. On a platform, anything but its runtime image must start with one of the
    prefixes the platform allows (the chart's executor.allowedImages)."""
    suspend: bool = False
    """Stop every executor and keep the routing table, offsets and state; ``false`` again starts the same
    executors, which resume exactly where they stopped (as Flink's ``job.state: suspended``)."""
    replicas: int | None = Field(default=None, ge=1, le=MAX_EXECUTORS)
    """Executors pinned (``kubectl scale stopo NAME --replicas N``, or an HPA through the scale
    subresource): the SPL loop keeps exactly this many and ALBIC balances within them. Unset: the
    autoscaler chooses between minExecutors and maxExecutors."""
    key_groups: int = Field(default=32, ge=1, le=4096)
    """Key groups of every operator that sets none. Left out, an operator whose declared rate and cost
    need more than 16 parallel tasks (Aeolus' Eq. 2) gets twice its tasks, as a power of two."""
    operators: list[Operator] = Field(min_length=1, max_length=MAX_OPERATORS)
    streams: list[StreamSpec] = Field(default_factory=list, max_length=4096)
    constraints: ConstraintsSpec = Field(default_factory=ConstraintsSpec)
    fusion: FusionSpec = Field(default_factory=FusionSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    transport: TransportSpec = Field(default_factory=TransportSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    sharing: SharingSpec = Field(default_factory=SharingSpec)
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec)

    @model_validator(mode="after")
    def _allowed_image(self, info: ValidationInfo) -> StreamTopologySpec:
        policy = (info.context or {}).get(POLICY)
        default = type(self).model_fields["image"].default
        problem = image_problem(self.image, default, policy.images if policy else None)
        if problem:
            raise field_error("image", problem)
        return self

    @model_validator(mode="before")
    @classmethod
    def _expression_text(cls, data: Any) -> Any:
        """All the expressions together stay within :data:`MAX_EXPRESSION_TEXT`, checked before any is
        read (each is at most MAX_EXPRESSION long, but 512 operators could hold 1 MiB of them)."""
        operators = data.get("operators") if isinstance(data, Mapping) else None
        if not isinstance(operators, list):
            return data
        total = 0
        for op in operators:
            if isinstance(op, Mapping):
                texts = [op.get("expr"), *(op.get("select") or []), *(op.get("aggregations") or [])]
                total += sum(len(t) for t in texts if isinstance(t, str))
        if total > MAX_EXPRESSION_TEXT:
            raise field_error(
                "operators",
                f"{total} characters of expressions (expr, select, aggregations), more than the "
                f"{MAX_EXPRESSION_TEXT} one topology may have",
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _platform_defaults(cls, data: Any, info: ValidationInfo) -> Any:
        """Under a platform's limits, the defaults a topology leaves out shrink to fit them (32 key groups
        and 32 executors would otherwise refuse every topology that does not set them)."""
        policy = (info.context or {}).get(POLICY)
        if policy is None or not isinstance(data, dict):
            return data
        data = dict(data)
        default_groups = cls.model_fields["key_groups"].default
        if (
            policy.max_key_groups is not None
            and policy.max_key_groups < default_groups
            and "keyGroups" not in data
            and "key_groups" not in data
        ):
            data["keyGroups"] = policy.max_key_groups
        scaling = data.get("autoscaling", {})
        if policy.max_executors is not None and isinstance(scaling, dict):
            if "maxExecutors" not in scaling and "max_executors" not in scaling:
                default = ScalingRuleSpec.model_fields["max_executors"].default
                data["autoscaling"] = {**scaling, "maxExecutors": min(default, policy.max_executors)}
        return data

    @model_validator(mode="after")
    def _within_platform_limits(self, info: ValidationInfo) -> StreamTopologySpec:
        """The platform's per-topology limits (the chart's ``limits``), so one tenant's topology cannot
        take the cluster or the planner; tighter than the model's own bounds."""
        policy = (info.context or {}).get(POLICY)
        if policy is None:
            return self
        checks = [
            ("operators", len(self.operators), policy.max_operators, "operators"),
            ("keyGroups", self.key_groups, policy.max_key_groups, "key groups"),
            ("autoscaling.maxExecutors", self.autoscaling.max_executors, policy.max_executors, "executors"),
            ("autoscaling.minExecutors", self.autoscaling.min_executors, policy.max_executors, "executors"),
            ("replicas", self.replicas or 0, policy.max_executors, "executors"),
        ]
        checks += [
            (f"operators[{i}].keyGroups", op.key_groups or 0, policy.max_key_groups, "key groups")
            for i, op in enumerate(self.operators)
        ]
        for field, value, limit, what in checks:
            if limit is not None and value > limit:
                raise field_error(field, f"{value} {what}: the platform allows at most {limit} per topology")
        return self

    def operator(self, name: str) -> Operator:
        return self.by_name()[name]

    def by_name(self) -> dict[str, Operator]:
        """Operators by name, indexed once: an executor looks them up per unit and step."""
        operators, index = self._index
        if operators is not self.operators:  # a model_copy with other operators keeps the old index
            del self.__dict__["_index"]
            operators, index = self._index
        return index

    @cached_property
    def _index(self) -> tuple[list[Operator], dict[str, Operator]]:
        return self.operators, {op.name: op for op in self.operators}

    def key_groups_of(self, name: str) -> int:
        return self.operator(name).key_groups or self.key_groups


class Metadata(Model):
    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)
    name: Name
    namespace: str | None = None


class StreamTopology(Model):
    """The whole resource as ``kubectl apply`` sends it."""

    api_version: Literal["streamtopo.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["StreamTopology"] = KIND
    metadata: Metadata
    spec: StreamTopologySpec


# ---------------------------------------------------------------------------------------------- status


# ------------------------------------------------------------------------------------ cross-field check


class TopologyError(ValueError):
    """A StreamTopology that cannot be planned; ``problems`` lists (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{path}: {message}" for path, message in problems))


def check_topology(spec: StreamTopologySpec, prefix: str = "spec") -> list[tuple[str, str]]:
    """Problems a single field cannot see: names, inputs, cycles, joins and constraints."""
    problems: list[tuple[str, str]] = []
    index: dict[str, int] = {}
    for i, op in enumerate(spec.operators):
        if op.name in index:
            problems.append(
                (
                    f"{prefix}.operators[{i}].name",
                    f"duplicate operator name {op.name!r} (also operators[{index[op.name]}])",
                )
            )
        else:
            index[op.name] = i

    graph = nx.DiGraph()
    graph.add_nodes_from(index)
    for i, op in enumerate(spec.operators):
        where = f"{prefix}.operators[{i}]"
        if op.kind == "source" and op.inputs:
            problems.append((f"{where}.inputs", f"source {op.name!r} cannot have inputs"))
        if op.kind != "source" and not op.inputs:
            problems.append((f"{where}.inputs", f"{op.kind} {op.name!r} needs at least one input"))
        if op.kind == "join" and len(op.inputs) != 2:
            problems.append(
                (f"{where}.inputs", f"join {op.name!r} needs exactly two inputs, got {len(op.inputs)}")
            )
        for j, upstream in enumerate(op.inputs):
            if upstream not in index:
                problems.append((f"{where}.inputs[{j}]", f"unknown operator {upstream!r}"))
            elif upstream == op.name:
                problems.append((f"{where}.inputs[{j}]", f"operator {op.name!r} reads from itself"))
            elif spec.operators[index[upstream]].kind == "sink":
                problems.append((f"{where}.inputs[{j}]", f"{upstream!r} is a sink and has no output"))
            else:
                graph.add_edge(upstream, op.name)
        if len(set(op.inputs)) != len(op.inputs):
            problems.append((f"{where}.inputs", f"operator {op.name!r} lists an input twice"))
        if op.key_by is not None and not op.key_by:
            problems.append((f"{where}.keyBy", "keyBy needs at least one column"))
    for cycle in _cycles(graph):
        first = cycle[0]
        problems.append(
            (f"{prefix}.operators[{index[first]}].inputs", "cycle: " + " -> ".join([*cycle, first]))
        )

    for i, stream in enumerate(spec.streams):
        where = f"{prefix}.streams[{i}]"
        for field, name in (("from", stream.from_), ("to", stream.to)):
            if name not in index:
                problems.append((f"{where}.{field}", f"unknown operator {name!r}"))
        if stream.from_ in index and stream.to in index and not graph.has_edge(stream.from_, stream.to):
            problems.append((where, f"there is no stream from {stream.from_!r} to {stream.to!r}"))

    problems.extend(_check_constraints(spec.constraints, index, f"{prefix}.constraints"))
    return problems


def _cycles(graph: nx.DiGraph) -> list[list[str]]:
    """One cycle per non-trivial strongly connected component, so each loop is reported once."""
    return [
        [u for u, _ in nx.find_cycle(graph.subgraph(component))]
        for component in nx.strongly_connected_components(graph)
        if len(component) > 1
    ]


def _check_constraints(c: ConstraintsSpec, index: Mapping[str, int], prefix: str) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    groups = {
        "peColocation": c.pe_colocation,
        "hostColocation": c.host_colocation,
        "peExlocation": c.pe_exlocation,
        "hostExlocation": c.host_exlocation,
    }
    for field, lists in groups.items():
        for i, names in enumerate(lists):
            for j, name in enumerate(names):
                if name not in index:
                    problems.append((f"{prefix}.{field}[{i}][{j}]", f"unknown operator {name!r}"))
            if len(set(names)) != len(names):
                problems.append((f"{prefix}.{field}[{i}]", "an operator is listed twice"))
    for field, names in (("peDedication", c.pe_dedication), ("hostDedication", c.host_dedication)):
        for j, name in enumerate(names):
            if name not in index:
                problems.append((f"{prefix}.{field}[{j}]", f"unknown operator {name!r}"))
    for i, ha in enumerate(c.high_availability):
        for j, name in enumerate(ha.operators):
            if name not in index:
                problems.append(
                    (f"{prefix}.highAvailability[{i}].operators[{j}]", f"unknown operator {name!r}")
                )
    seen_ha: dict[str, int] = {}
    for i, ha in enumerate(c.high_availability):
        for name in ha.operators:
            if name in seen_ha and seen_ha[name] != i:
                problems.append(
                    (
                        f"{prefix}.highAvailability[{i}].operators",
                        f"operator {name!r} is already replicated by highAvailability[{seen_ha[name]}]",
                    )
                )
            seen_ha.setdefault(name, i)

    replicated = {name: ha.replicas for ha in c.high_availability for name in ha.operators}
    for field in ("peColocation", "hostColocation"):
        for i, names in enumerate(groups[field]):
            if len({replicated.get(n, 1) for n in names if n in index}) > 1:
                problems.append(
                    (
                        f"{prefix}.{field}[{i}]",
                        "co-located operators must have the same number of highAvailability replicas",
                    )
                )

    # Contradictions: a pair forced together and apart at the same level (or PE-together, host-apart).
    together_pe = _components(c.pe_colocation)
    together_host = _components([*c.host_colocation, *c.pe_colocation])
    for field, lists, together, level in (
        ("peExlocation", c.pe_exlocation, together_pe, "PE"),
        ("hostExlocation", c.host_exlocation, together_host, "host"),
    ):
        for i, names in enumerate(lists):
            for a_pos, a in enumerate(names):
                for b in names[a_pos + 1 :]:
                    if a in together and together.get(a) == together.get(b):
                        problems.append(
                            (
                                f"{prefix}.{field}[{i}]",
                                f"{a!r} and {b!r} must be in different {level}s but a colocation "
                                f"constraint puts them in the same {level}",
                            )
                        )
    for j, name in enumerate(c.pe_dedication):
        if name in together_pe and sum(1 for v in together_pe.values() if v == together_pe[name]) > 1:
            problems.append(
                (
                    f"{prefix}.peDedication[{j}]",
                    f"{name!r} must have a PE of its own but peColocation fuses it with another operator",
                )
            )
    for j, name in enumerate(c.host_dedication):
        if name in together_host and sum(1 for v in together_host.values() if v == together_host[name]) > 1:
            problems.append(
                (
                    f"{prefix}.hostDedication[{j}]",
                    f"{name!r} must have a host of its own but a "
                    "colocation constraint places another operator with it",
                )
            )
    return problems


def _components(groups: list[list[str]]) -> dict[str, int]:
    """Operator -> id of its colocation class (transitive closure of the groups)."""
    graph = nx.Graph()
    for names in groups:
        graph.add_nodes_from(names)
        graph.add_edges_from(zip(names, names[1:]))
    return {name: i for i, comp in enumerate(nx.connected_components(graph)) for name in comp}


# --------------------------------------------------------------------------------------------- loading


def _path(loc: tuple[Any, ...]) -> str:
    """pydantic's loc tuple as a document path: ``spec.operators[2].source.ratePerSecond``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


_PATTERN_MEANING = {
    _NAME.pattern: "must be a lowercase DNS label: letters, digits and '-', starting and ending alphanumeric",
    r"^[A-Za-z][A-Za-z0-9_-]*$": "must start with a letter, then letters, digits, '_' or '-'",
    r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$": "must be module:function, e.g. mypkg.enrich:apply",
    DURATION_PATTERN: "must be a duration such as 60s, 5m, 1m30s or 250ms",
    r"^(redis|rediss|valkey|valkeys)://": "must be a redis://, rediss://, valkey:// or valkeys:// URL",
    _LABEL_KEY.pattern: "is not a Kubernetes label key ([prefix/]name: alphanumerics, '-', '_', '.')",
}


def problems_of(error: ValidationError) -> list[tuple[str, str]]:
    """pydantic errors as (field path, message), in words a user of the YAML understands."""
    problems = []
    for err in error.errors(include_url=False):
        loc, message = err["loc"], err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["type"] == "field_error":
            loc = (*loc, err["ctx"]["field"])
        elif err["type"] == "string_pattern_mismatch":
            pattern = err["ctx"]["pattern"]
            message = f"{err['input']!r} {_PATTERN_MEANING.get(pattern, f'must match {pattern}')}"
        problems.append((_path(loc), message))
    return problems


def parse_topology(
    source: str | Mapping[str, Any], *, origin: str = "(text)", policy: PlatformPolicy | None = None
) -> StreamTopology:
    """Validate a StreamTopology from YAML text or a parsed document (files: ``streamtopo.documents``).

    A bare spec (a mapping with ``operators`` at the top) is accepted too, so that users can keep
    short files for ``streamtopo plan``. Raises :class:`TopologyError` naming every offending field.
    ``policy``: what the platform lets tenants choose (UDF modules, images); None on a local run, where
    the user runs their own code (UDFs still never come from the standard library).
    """
    data = parse_document(source, origin)
    if isinstance(data, Mapping) and "operators" in data and "spec" not in data:
        data = {"metadata": {"name": "topology"}, "spec": data}
    if not isinstance(data, Mapping):
        raise TopologyError([("(document)", "expected a StreamTopology mapping")])
    try:
        topology = StreamTopology.model_validate(data, context={POLICY: policy})
    except ValidationError as error:
        raise TopologyError(problems_of(error)) from None
    problems = check_topology(topology.spec)
    if problems:
        raise TopologyError(problems)
    return topology


def parse_document(source: str | Mapping[str, Any], origin: str = "(text)") -> Any:
    """YAML text as data; a mapping passes through. Errors name ``origin`` (the file) and the line.

    Tenant input is refused here when it is not UTF-8, larger than MAX_DOCUMENT_BYTES, nested deeper than
    MAX_DEPTH or has a key twice in one mapping (YAML would silently keep the last): never a traceback.
    """
    if isinstance(source, Mapping):
        _check_depth(source, "(document)")
        return source
    text = source
    if "\n" not in text and text.endswith((".yaml", ".yml", ".json")):
        raise TopologyError([(text, "no such file")])  # a path nobody could read, not YAML
    if len(text) > MAX_DOCUMENT_BYTES:
        raise TopologyError([(origin, f"larger than {MAX_DOCUMENT_BYTES // 2**20} MiB")])
    try:
        document = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark else origin
        raise TopologyError([(where, f"not valid YAML: {getattr(error, 'problem', error)}")]) from None
    except RecursionError:
        raise TopologyError([(origin, f"nested deeper than {MAX_DEPTH} levels")]) from None
    _check_depth(document, origin)
    return document


MAX_DOCUMENT_BYTES = 2**20
MAX_DEPTH = 32


def _check_depth(document: Any, origin: str) -> None:
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TopologyError([(origin, f"nested deeper than {MAX_DEPTH} levels")])
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a scalar", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
