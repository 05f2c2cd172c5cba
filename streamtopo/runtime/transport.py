"""The transport between executors: Valkey/Redis Streams of Arrow IPC record batches.

One stream per (edge, destination key group): ``st:{topology}:s:<from>-><to>:<kg>``. Its only reader is the
unit ``(to, kg)``, so the stream doubles as that unit's durable input queue: the unit commits the id of
the last entry it consumed and trims what lies before it. An entry carries

    p   producer unit ``operator/kg``            s   the producer's sequence number towards this unit
    w   the producer's watermark (punctuation)   n   number of records
    d   the records, an Arrow IPC stream (absent for a pure punctuation)
    c   present when ``d`` holds partial aggregates rather than records: the producer combined its
        records for an aggregate before the wire. Its value is the number of rows (what merging them
        costs the consumer), while ``n`` still counts the records they stand for

``(p, s)`` lets the consumer drop an entry it already applied (docs/exactly-once.md); ``w`` is the C-MR
punctuation that tells the consumer no later record of ``p`` is older than ``w``.

A user-named stream (``sink: {stream: NAME}``, ``source: {stream: NAME}``) is the key ``NAME`` itself, so
other topologies and programs can read or write it. Sink units add ``k``, how many units write it (the
sink's key groups), ``key``, the columns their records are partitioned by when they are (a JSON list:
unit ``i`` holds the records whose key hashes to ``i`` of ``k``, so a source reading by the same key
and key groups takes unit ``i``'s entries in its key group ``i``), and a last punctuation ``w = inf``
when their input ends. Readers never trim it.

Every key of a topology shares the hash tag ``{topology}``, so the commit script (state_store.py) that
touches unit records and streams together is legal on a Valkey cluster too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from streamtopo.contracts import redis_url
from streamtopo.planner.expressions import output_name_problem
from streamtopo.runtime.operators.records import TS, from_arrow
from streamtopo.runtime.operators.state import frame_to_ipc, ipc_to_frame, ipc_to_table
from streamtopo.runtime.state_store import prepare

CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)
"""What a lost or unreachable Valkey raises; the executor retries these with backoff."""


class TransportUnavailable(RuntimeError):
    """Valkey could not be reached within the retry budget."""


def connect(
    url: str,
    *,
    attempts: int = 8,
    first_delay: float = 0.25,
    max_delay: float = 4.0,
    log: Callable[[str], None] | None = None,
    username: str | None = None,
    password: str | None = None,
) -> redis.Redis:
    """A client for ``url`` after a successful PING, retried with redis-py's exponential backoff
    (``first_delay``, doubling up to ``max_delay``).

    Raises :class:`TransportUnavailable` naming the URL and the last error once ``attempts`` fail.
    ``valkey://`` URLs are accepted as aliases of ``redis://``. ``username`` and ``password`` (from a
    Secret, never in the URL) authenticate as that ACL user without appearing in any message. Only the
    first PING is retried here: the executor's loop handles a transport lost later (it must reload from
    its last commit, not replay a call).
    """
    url = redis_url(url)
    extra = {"password": password, "username": username} if password else {}
    client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=30.0, **extra)
    backoff = ExponentialBackoff(cap=max_delay, base=first_delay / 2)  # attempt n waits base * 2**n

    def failed(error: Exception, failures: int) -> None:
        if log:
            wait = f"retrying in {backoff.compute(failures):.2g}s" if failures < attempts else "giving up"
            log(f"transport {url} unreachable (attempt {failures}/{attempts}): {error}; {wait}")

    try:
        Retry(backoff, attempts - 1, supported_errors=CONNECTION_ERRORS).call_with_retry(
            client.ping, failed, with_failure_count=True
        )
    except CONNECTION_ERRORS as error:
        raise TransportUnavailable(
            f"cannot reach the transport at {url} after {attempts} attempts: {error}"
        ) from None
    return client


# ---------------------------------------------------------------------------------------------- entries


def encode_watermark(wm: float) -> bytes:
    return b"inf" if wm == math.inf else b"-inf" if wm == -math.inf else repr(float(wm)).encode()


def decode_watermark(raw: bytes) -> float:
    return float(raw)


def entry_fields(
    producer: str,
    seq: int,
    watermark: float,
    records: pd.DataFrame | pa.Table | None,
    producers: int | None = None,
    combined: int | None = None,
    partition: tuple[str, ...] | None = None,
) -> list[bytes]:
    """Field/value pairs of one entry, flat, in the order XADD takes them.

    ``producers`` (a sink stream's entries) is how many units write the stream, so a reader knows
    whose watermarks it must wait for before its own can advance; ``partition`` the key the producing
    units' records are partitioned by (over ``producers`` key groups). ``combined`` marks ``records`` as
    partial aggregates standing for that many records (the ``n`` that backlogs and metrics count)."""
    n = combined if combined is not None else 0 if records is None else len(records)
    fields = [
        b"p",
        producer.encode(),
        b"s",
        str(seq).encode(),
        b"w",
        encode_watermark(watermark),
        b"n",
        str(n).encode(),
    ]
    if producers is not None:
        fields += [b"k", str(producers).encode()]
    if partition is not None:
        fields += [b"key", json.dumps(list(partition)).encode()]
    if combined is not None:
        fields += [b"c", str(0 if records is None else len(records)).encode()]
    if records is not None and len(records):
        fields += [b"d", frame_to_ipc(records)]
    return fields


@dataclass
class Entry:
    """One decoded stream entry.

    Entries written by streamtopo carry producer, sequence number, watermark and Arrow IPC records.
    A user-named stream may also hold entries other programs wrote (``XADD NAME * json '{...}'``): no
    producer (``""``), sequence 0, no watermark, and a ``json`` field with one object or a list of them.
    """

    id: str
    producer: str
    seq: int
    watermark: float
    count: int
    data: bytes | None
    json: bytes | None = None
    producers: int | None = None
    partition: tuple[str, ...] | None = None
    """The columns the producing units' records are partitioned by, over ``producers`` key groups."""
    combined: bool = False
    """``data`` holds partial aggregates (see the module docstring, field ``c``)."""

    @property
    def millis(self) -> int:
        """Append time from the entry id (Valkey's clock, milliseconds)."""
        return int(self.id.split("-")[0])

    def records(self) -> pd.DataFrame | None:
        if self.json is not None:
            return json_records(self.json, self.millis / 1000)
        return ipc_to_frame(self.data) if self.data else None

    def table(self) -> pa.Table:
        """The records as an Arrow table (entries of one stream are concatenated before pandas)."""
        assert self.data is not None  # callers ask entries that carry records (``n`` > 0)
        return ipc_to_table(self.data)

    @classmethod
    def parse(cls, entry_id: bytes, fields: dict[bytes, bytes]) -> Entry:
        if b"p" not in fields:
            return cls(
                id=entry_id.decode(),
                producer="",
                seq=0,
                watermark=-math.inf,
                count=1,
                data=None,
                json=fields.get(b"json", b"null"),
            )
        return cls(
            id=entry_id.decode(),
            producer=fields[b"p"].decode(),
            seq=int(fields[b"s"]),
            watermark=decode_watermark(fields[b"w"]),
            count=int(fields.get(b"n", b"0")),
            data=fields.get(b"d"),
            producers=int(fields[b"k"]) if b"k" in fields else None,
            partition=_partition(fields.get(b"key")),
            combined=b"c" in fields,
        )


def _partition(raw: bytes | None) -> tuple[str, ...] | None:
    """A ``key`` field: a JSON list of column names (anything else, as another program may write, is no
    partitioning the reader can rely on)."""
    try:
        columns = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if isinstance(columns, list) and columns and all(isinstance(c, str) for c in columns):
        return tuple(columns)
    return None


class MalformedEntry(ValueError):
    """An entry of a user-named stream that is not a JSON object or a list of objects."""


def json_records(raw: bytes, arrival: float) -> pd.DataFrame:
    """Records of an external ``json`` entry; event time ``_ts`` is the record's numeric ``_ts`` field (the
    name file sinks write it under), else the entry's arrival time (its id's milliseconds). Each field's
    type is Arrow's inference over the entry (ints with a float among them are doubles); a field with a
    name of the executor's own (``_kg``, ``__src`` ...) makes the entry malformed."""
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise MalformedEntry(f"field json is not JSON: {error}") from None
    rows = value if isinstance(value, list) else [value]
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise MalformedEntry("field json must hold an object or a list of objects")
    reserved = sorted({k for r in rows for k in r if output_name_problem(k, event_time=True)})
    if reserved:
        raise MalformedEntry(f"field json: {', '.join(reserved)} is a name of the executor's own")
    times = [r.get(TS) for r in rows]
    try:
        table = pa.Table.from_pylist([{k: v for k, v in r.items() if k != TS} for r in rows])
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise MalformedEntry(f"field json: {error}") from None
    frame = from_arrow(table) if table.num_columns else pd.DataFrame(index=pd.RangeIndex(len(rows)))
    frame[TS] = np.array(
        [float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else arrival for t in times]
    )
    return frame


def queued_rows(records: int, front: dict[bytes, bytes] | None) -> int:
    """Rows a stream's ``records`` waiting cost its consumer to apply: the records themselves, but for
    partial aggregates (``c``) the rows that stand for them, at the first unread entry's rows per record.
    A step's budget counts work: counted by the records behind them, a few partial rows per key and
    window would be read a few entries per step, each step merging the whole window state again."""
    if front is None or b"c" not in front or int(front.get(b"n", b"0")) <= 0:
        return records
    return math.ceil(records * int(front[b"c"]) / int(front[b"n"]))


def read_entries(client: redis.Redis, requests: Iterable[tuple[str, str, int]]) -> list[list[Entry]]:
    """For each ``(stream, after_id, count)``: up to ``count`` entries after ``after_id``, in one round trip:
    one XREAD over every stream when they share the count (an executor polls hundreds of streams each
    loop, mostly with nothing new: one command instead of one per stream), else pipelined XRANGEs."""
    requests = list(requests)
    if not requests:
        return []
    counts = {count for _, _, count in requests}
    if len(counts) == 1 and len({stream for stream, _, _ in requests}) == len(requests):
        reply = client.xread(streams={stream: after for stream, after, _ in requests}, count=counts.pop())
        found = {name: rows for name, rows in (reply.items() if isinstance(reply, dict) else reply or [])}
        rows_of = {
            name: rows[0] if rows and isinstance(rows[0], list) else rows  # RESP3 nests each stream's list
            for name, rows in found.items()
        }
        return [
            [Entry.parse(i, f) for i, f in rows_of.get(stream.encode(), [])]  # type: ignore[arg-type]
            for stream, _, _ in requests
        ]
    pipe = client.pipeline(transaction=False)
    for stream, after, count in requests:
        pipe.xrange(stream, min=f"({after}" if after != "0-0" else "-", max="+", count=count)
    return [[Entry.parse(i, f) for i, f in rows] for rows in pipe.execute()]


def wait_for_entries(client: redis.Redis, after: dict[str, str], seconds: float) -> None:
    """Block until one of the streams has an entry after its id, or ``seconds`` pass: an idle executor
    sleeps in Valkey (XREAD BLOCK) and wakes for the first record, instead of polling every stream."""
    if after:
        streams: dict[Any, Any] = dict(after)
        client.xread(streams=streams, count=1, block=max(1, int(seconds * 1000)))


def append(client: redis.Redis, stream: str, fields: list[bytes]) -> str:
    """Append one entry outside a commit (tests, calibration, external producers) through the function
    library (``streamtopo_append``, within the stream's account limits): tenants have no raw XADD."""
    try:
        entry_id = client.fcall("streamtopo_append", 1, stream, *fields)
    except redis.exceptions.ResponseError as error:
        if "function not found" not in str(error).lower():
            raise
        prepare(client)  # a Valkey of our own that no executor has used yet
        entry_id = client.fcall("streamtopo_append", 1, stream, *fields)
    return cast(bytes, entry_id).decode()
