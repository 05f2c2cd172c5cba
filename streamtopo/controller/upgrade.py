"""Carrying out a spec change on a running topology, as planner/upgrade.py decided it.

An upgrade that reaches the data plane is Flink's suspend + restore, on both platforms (reconcile.py for
Kubernetes, ``streamtopo run --watch`` locally): every executor stops at a batch boundary and commits
(:func:`stop_for_upgrade`: the recorded deployment, suspended), then, while none runs, the committed
records of the operators the decision resets are rewritten (:func:`reset_state`), then the new spec's
executors start from the commits. Old and new executors never run at once, so no record is routed or
combined by one spec and read by the other.

What a reset does, per kind of state (docs/operator.md, "Spec changes"); "the upgrade point" is the
moment the last executor of the old spec committed:

- aggregate, join: the state is emptied; the unit reads on from its own committed input offsets, so every
  record that reaches it after the upgrade point counts in the new state once and those before only in
  the discarded one. Where the decision says its in-flight entries were prepared for the old layout
  (routed by its old key or key groups, or combined into its old partials), the entries its producers had
  committed and it had not consumed are dropped and counted instead, and it starts at its producers'
  committed output: their sequence numbers and watermarks become its own, so nothing they send later is
  taken for a duplicate or a gap.
- generator source (its key groups or its partitioning by key changed): key group ``kg``'s records are
  the seqs of its layout in order (``seq = kg + i * K``, or those whose key hashes to ``kg``:
  planner/source_layout.py), so the old key groups' offsets are a ragged front in seq; every new key
  group starts at its first seq at or after the first seq no old one had reached (``S``), nothing is
  generated twice, and the seqs below ``S`` a lagging key group had not generated are skipped and
  counted.
- stream source: a new stream (or a new origin) is read from its first stored entry; new key groups all
  start at the furthest offset any old one committed (each reads the whole stream and takes its share),
  and the entries between a lagging key group's offset and that one are counted as skipped (at most:
  some of them were other key groups' and had been taken). Which writers' watermarks a key group waits
  for is learned again from the entries that follow.
- file sink (its path changed): the new files start at position 0; records in flight are written there.
- an operator removed, and key groups beyond a new count: their units and input streams are deleted,
  the records in those streams counted as dropped.

Operators kept (everything else) are not touched: their offsets, sequence numbers, watermarks and state
carry over, so nothing is lost or duplicated for them. The whole rewrite is one Valkey transaction,
marked with the upgrade it carries out (``Keys.upgrade``), so a retried upgrade never resets twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from streamtopo import valkey_library
from streamtopo.contracts import Keys, UnitRecord, unit_key
from streamtopo.controller.platform import DesiredState, Platform
from streamtopo.planner.graph import unit_edges
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.source_layout import layout
from streamtopo.planner.upgrade import Upgrade, data_plane


@dataclass(frozen=True)
class ResetReport:
    """What :func:`reset_state` rewrote; the counts go to the Upgraded Event and the run's output."""

    units_reset: int = 0
    units_removed: int = 0
    dropped_records: int = 0
    """Records in flight to a reset or removed unit that were prepared for its old layout, not applied."""
    skipped_records: int = 0
    """Generator records below the new start seq that a lagging key group had not generated."""
    skipped_entries: int = 0
    """Stream entries between a lagging key group's offset and the furthest one (at most)."""
    repeated: bool = False
    """The upgrade's reset was already carried out (a retry): nothing was written this time."""
    points: tuple[tuple[str, int, int], ...] = ()
    """The upgrade point of every generator source: (source, lowest, highest) of its key groups' fronts,
    the first seq each had not generated. Records below ``lowest`` were generated under the old spec,
    those from ``highest`` on under the new one (event time = seq / ratePerSecond)."""

    def message(self) -> str:
        if self.repeated:
            return "state was already reset for this upgrade"
        parts = [f"{self.units_reset} units reset"] if self.units_reset else []
        parts += [f"{self.units_removed} units removed"] if self.units_removed else []
        parts += [f"upgrade point: {name} at seq {low}-{high}" for name, low, high in self.points]
        for count, what in (
            (self.dropped_records, "records in flight to an old layout dropped"),
            (self.skipped_records, "generator records skipped"),
            (self.skipped_entries, "stream entries skipped at most"),
        ):
            if count:
                parts.append(f"{count} {what}")
        return ", ".join(parts)


def suspended(desired: DesiredState) -> DesiredState:
    """The same deployment with no executor running (``spec.suspend``): the routing, offsets and state stay."""
    spec = desired.topology.spec.model_copy(update={"suspend": True})
    topology = desired.topology.model_copy(update={"spec": spec})
    return DesiredState(topology, desired.routing, desired.memory)


def stop_for_upgrade(platform: Platform, previous: DesiredState) -> int:
    """Stop every executor of the recorded deployment; returns how many still run (pods terminating)."""
    if platform.running_executors():
        platform.apply(suspended(previous))
    return len(platform.running_executors())


def upgrade_marker(old: StreamTopologySpec, new: StreamTopologySpec) -> str:
    """Names the upgrade from ``old`` to ``new`` (their data planes), so a retry recognises it."""
    text = json.dumps([data_plane(old), data_plane(new)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def reset_state(
    client: Any, keys: Keys, old: StreamTopologySpec, new: StreamTopologySpec, upgrade: Upgrade
) -> ResetReport:
    """Rewrite the committed records as ``upgrade`` says (module docstring), in one transaction.

    Call it only while no executor of the topology runs: it reads and writes unit records directly.
    ``client``: a Valkey client with rights over ``keys`` (decode_responses off).
    """
    marker = upgrade_marker(old, new)
    if client.get(keys.upgrade) == marker.encode():
        return ResetReport(repeated=True)
    return _Reset(client, keys, old, new, upgrade).run(marker)


class _Reset:
    """One reset: reads the records it needs once, collects the writes, applies them in one MULTI."""

    def __init__(
        self, client: Any, keys: Keys, old: StreamTopologySpec, new: StreamTopologySpec, upgrade: Upgrade
    ):
        self.client, self.keys, self.old, self.new, self.upgrade = client, keys, old, new, upgrade
        self.records: dict[str, UnitRecord | None] = {}
        self.writes: dict[str, UnitRecord] = {}
        self.deleted_units: set[str] = set()
        self.deleted_streams: set[str] = set()
        self.backlog = {k.decode(): int(v) for k, v in client.hgetall(keys.backlog).items()}
        self.counts = {"dropped": 0, "skipped": 0, "entries": 0}

    def run(self, marker: str) -> ResetReport:
        points = tuple(
            (op.name, min(fronts.values()), max(fronts.values()))
            for op in self.old.operators
            if op.source is not None and op.source.generator is not None and (fronts := self._fronts(op.name))
        )
        self._drop_streams()
        for decision in self.upgrade.reset:
            op = self.new.operator(decision.name)
            if op.source is not None and op.source.generator is not None:
                self._rebase_generator(decision.name)
            elif op.source is not None:
                self._restart_stream_source(decision.name)
            else:
                self._empty(decision.name, decision.drop_in_flight)
        for name in {o.name for o in self.old.operators}:
            k_old = self.old.key_groups_of(name)
            k_new = self.new.key_groups_of(name) if name in self.new.by_name() else 0
            self.deleted_units |= {unit_key((name, kg)) for kg in range(k_new, k_old)}
        valkey_library.ensure_loaded(self.client)
        with self.client.pipeline(transaction=True) as pipe:
            for key, rec in self.writes.items():
                pipe.hset(self.keys.unit(key), "rec", rec.encode())
                pipe.hdel(self.keys.unit(key), "layout")
            gone = [self.keys.unit(key) for key in sorted(self.deleted_units)] + sorted(self.deleted_streams)
            for i in range(0, len(gone), 1000):  # through the library, so the topology's account follows
                pipe.fcall("streamtopo_drop", len(gone[i : i + 1000]), *gone[i : i + 1000])
            if self.deleted_streams:
                pipe.hdel(self.keys.backlog, *self.deleted_streams)
            pipe.set(self.keys.upgrade, marker)
            pipe.execute()
        return ResetReport(
            units_reset=len(self.writes),
            units_removed=len(self.deleted_units),
            dropped_records=self.counts["dropped"],
            skipped_records=self.counts["skipped"],
            skipped_entries=self.counts["entries"],
            points=points,
        )

    # ---------------------------------------------------------------------------------------- reading

    def rec(self, op: str, kg: int) -> UnitRecord | None:
        key = unit_key((op, kg))
        if key not in self.records:
            raw = self.client.hget(self.keys.unit(key), "rec")
            self.records[key] = UnitRecord.decode(raw) if raw else None
        return self.records[key]

    def _fronts(self, op: str) -> dict[int, int]:
        """A generator's key groups' fronts under the old spec: the first seq each had not generated (of
        those with any records: a key group no key hashes to has none to wait for)."""
        fronts = {}
        for kg in range(self.old.key_groups_of(op)):
            front = layout(self.old, op, kg).seq(r.emitted if (r := self.rec(op, kg)) is not None else 0)
            if front != math.inf:
                fronts[kg] = int(front)
        return fronts

    def old_records(self, op: str) -> dict[int, UnitRecord]:
        found = {kg: self.rec(op, kg) for kg in range(self.old.key_groups_of(op))}
        return {kg: r for kg, r in found.items() if r is not None}

    # ---------------------------------------------------------------------------------------- streams

    def _drop_streams(self) -> None:
        """Delete the input streams nobody will read the same way again: of removed operators and edges,
        of key groups beyond a new count, and of reset operators whose in-flight entries were prepared
        for their old layout; count their records (the backlog counters count records)."""
        new_ops = self.new.by_name()
        for v in self.old.operators:
            decision = self.upgrade.of(v.name)
            successor = new_ops.get(v.name)
            whole = decision.change == "removed" or (decision.action == "reset" and decision.drop_in_flight)
            k_new = self.new.key_groups_of(v.name) if successor is not None else 0
            for u in v.inputs:
                gone = whole or successor is None or u not in successor.inputs
                for kg in range(self.old.key_groups_of(v.name)):
                    if gone or kg >= k_new:
                        self._drop(self.keys.stream(u, v.name, kg))

    def _drop(self, stream: str) -> None:
        if stream not in self.deleted_streams:
            self.deleted_streams.add(stream)
            self.counts["dropped"] += max(0, self.backlog.get(stream, 0))

    # ------------------------------------------------------------------------------------- operators

    def _empty(self, name: str, from_producers: bool) -> None:
        """An aggregate, join or file sink: state emptied (a new file path also starts at position 0);
        ``from_producers``: its dropped streams' offsets go, and its producers' committed output (sequence
        numbers, watermarks) becomes where it starts."""
        new_path = _file_path(self.new, name) != _file_path(self.old, name)
        for kg in range(self.new.key_groups_of(name)):
            committed = self.rec(name, kg) if kg < self.old.key_groups_of(name) else None
            if committed is None and not from_producers:
                continue
            rec = committed or UnitRecord()
            rec.state = b""
            if new_path:
                rec.sink_len, rec.pending = 0, b""
            if from_producers:
                rec.offsets = {s: i for s, i in rec.offsets.items() if s not in self.deleted_streams}
                rec.seq_in, rec.wm_in = {}, {}
                for producer, kg_p in self._producers(name, kg):
                    sent = self.rec(producer, kg_p) if kg_p < self.old.key_groups_of(producer) else None
                    dest = unit_key((name, kg))
                    if sent is not None and dest in sent.seq_out:
                        rec.seq_in[unit_key((producer, kg_p))] = sent.seq_out[dest]
                    if sent is not None and dest in sent.wm_out:
                        rec.wm_in[unit_key((producer, kg_p))] = sent.wm_out[dest]
                if committed is None and rec == UnitRecord():
                    continue  # never ran and nothing was ever sent to it: it starts fresh anyway
            self.writes[unit_key((name, kg))] = rec

    def _producers(self, name: str, kg: int) -> Iterable[tuple[str, int]]:
        """The units of the new spec with an edge into (name, kg) that existed under the old spec."""
        old_ops = self.old.by_name()
        for u in self.new.operator(name).inputs:
            if u in old_ops:
                yield from ((u, i) for i, j, _ in unit_edges(self.new, u, name) if j == kg)

    def _rebase_generator(self, name: str) -> None:
        """New key groups start at the first seq no old one reached (module docstring)."""
        source = self.new.operator(name).source
        assert source is not None and source.rate_per_second > 0
        k_old, k_new = self.old.key_groups_of(name), self.new.key_groups_of(name)
        old_origin = self.old.operator(name).source
        fronts = self._fronts(name) if old_origin is not None and old_origin.generator is not None else {}
        start = max(fronts.values(), default=0)
        limit = start if source.count is None else min(start, source.count)
        for kg in fronts:  # an old key group's seqs in [its front, limit): never generated
            emitted = r.emitted if (r := self.rec(name, kg)) is not None else 0
            self.counts["skipped"] += max(0, layout(self.old, name, kg).below(limit) - emitted)
        for kg in range(k_new):
            new_layout = layout(self.new, name, kg)
            first = new_layout.below(start)
            rec = (self.rec(name, kg) if kg < k_old else None) or UnitRecord()
            rec.offsets, rec.seq_in, rec.wm_in = {}, {}, {}
            rec.emitted = first
            rec.state = struct.pack("<q", first)  # SourceOperator.encode_state: the records generated so far
            total = new_layout.total(source.count)
            rec.watermark = (
                math.inf
                if total is not None and first >= total
                else new_layout.seq(first) / source.rate_per_second
            )
            self.writes[unit_key((name, kg))] = rec

    def _restart_stream_source(self, name: str) -> None:
        """A new stream from its first entry; new key groups at the furthest committed offset."""
        source, before = self.new.operator(name).source, self.old.operator(name).source
        assert source is not None and source.stream is not None and before is not None
        stream = self.keys.sink_stream(source.stream)
        k_new = self.new.key_groups_of(name)
        old = self.old_records(name)
        same = before.stream == source.stream
        offsets = (
            sorted((r.offsets[stream] for r in old.values() if stream in r.offsets), key=_entry_id)
            if same
            else []
        )
        if offsets and offsets[0] != offsets[-1]:
            self.counts["entries"] += len(self.client.xrange(stream, min=f"({offsets[0]}", max=offsets[-1]))
        seq_in: dict[str, int] = {}
        for r in old.values() if same else ():
            for p, s in r.seq_in.items():
                seq_in[p] = max(seq_in.get(p, 0), s)
        for kg in range(k_new):
            rec = (old.get(kg) if kg < self.old.key_groups_of(name) else None) or UnitRecord()
            rec.offsets = {stream: offsets[-1]} if offsets else {}
            rec.seq_in, rec.wm_in = dict(seq_in), {}  # which writers it waits for is learned anew
            rec.watermark, rec.state, rec.emitted = -math.inf, b"", 0
            self.writes[unit_key((name, kg))] = rec


def _file_path(spec: StreamTopologySpec, name: str) -> str | None:
    op = spec.by_name().get(name)
    if op is None or op.sink is None or op.sink.file is None:
        return None
    return op.sink.file.path or op.name


def _entry_id(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)
