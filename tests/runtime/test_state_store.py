"""The state store against a real embedded Valkey: atomic commits, fencing of zombies, hand-over."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.contracts import Keys
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.state_store import Commit, Fenced, StateStore, UnitRecord
from streamtopo.runtime.transport import connect, entry_fields, read_entries

pytestmark = pytest.mark.valkey


@pytest.fixture(scope="module")
def client():
    with EmbeddedValkey() as valkey:
        yield connect(valkey.url)


def store(client, name: str) -> StateStore:
    return StateStore(client, Keys(name))


def test_commit_applies_every_effect_together(client):
    s = store(client, "ss-commit")
    epoch, rec = s.acquire("totals/0", "ex-a")
    assert (epoch, rec) == (1, None)
    out = s.keys.stream("totals", "out", 0)
    consumed = s.keys.stream("numbers", "totals", 0)
    first = client.xadd(consumed, {"p": "numbers/0", "s": 1, "w": "0", "n": 0}).decode()
    second = client.xadd(consumed, {"p": "numbers/0", "s": 2, "w": "1", "n": 0}).decode()
    record = UnitRecord(
        offsets={consumed: second},
        seq_in={"numbers/0": 2},
        wm_in={"numbers/0": 1.0},
        watermark=1.0,
        records_in=7,
        state=b"\x00state",
    )
    commit = Commit(
        units=[("totals/0", epoch, record.encode())],
        appends=[(out, entry_fields("totals/0", 1, 1.0, None))],
        trims={consumed: second},
    )
    commit.incr(s.keys.backlog, out, 3)
    s.commit(commit)
    assert s.load("totals/0") == (1, record)
    assert [e.seq for e in read_entries(client, [(out, "0-0", 10)])[0]] == [1]
    assert [i.decode() for i, _ in client.xrange(consumed)] == [second]  # first trimmed, offset kept
    assert first != second
    assert int(client.hget(s.keys.backlog, out)) == 3


def test_fenced_zombie_commit_is_refused_and_changes_nothing(client):
    s = store(client, "ss-zombie")
    old_epoch, _ = s.acquire("totals/1", "donor")
    s.commit(Commit(units=[("totals/1", old_epoch, UnitRecord(records_in=1).encode())]))
    new_epoch, rec = s.acquire("totals/1", "receiver")  # the receiver takes over without a release
    assert new_epoch == old_epoch + 1 and rec.records_in == 1
    out = s.keys.stream("totals", "out", 1)
    zombie = Commit(
        units=[("totals/1", old_epoch, UnitRecord(records_in=99).encode())],
        appends=[(out, entry_fields("totals/1", 1, 5.0, None))],
    )
    zombie.incr(s.keys.backlog, out, 1)
    with pytest.raises(Fenced, match="epoch 1, current epoch 2"):
        s.commit(zombie)
    assert s.load("totals/1") == (new_epoch, UnitRecord(records_in=1))
    assert client.xlen(out) == 0 and client.hget(s.keys.backlog, out) is None
    with pytest.raises(Fenced):
        s.release("totals/1", old_epoch)
    assert s.ownership("totals/1").owner == "receiver"


def test_one_fenced_unit_refuses_the_whole_commit(client):
    s = store(client, "ss-whole")
    a, _ = s.acquire("op/0", "ex")
    b, _ = s.acquire("op/1", "ex")
    s.acquire("op/1", "thief")
    with pytest.raises(Fenced) as caught:
        s.commit(
            Commit(
                units=[
                    ("op/0", a, UnitRecord(emitted=5).encode()),
                    ("op/1", b, UnitRecord(emitted=5).encode()),
                ]
            )
        )
    assert caught.value.unit == "op/1"
    assert s.load("op/0") == (a, None)


def test_release_then_acquire_hands_the_record_over(client):
    s = store(client, "ss-handover")
    epoch, _ = s.acquire("agg/3", "donor")
    s.commit(Commit(units=[("agg/3", epoch, UnitRecord(seq_out={"out/3": 4}, state=b"abc").encode())]))
    s.release("agg/3", epoch)
    ownership = s.ownership("agg/3")
    assert ownership.owner == "" and ownership.released_at is not None and ownership.epoch == epoch
    new_epoch, rec = s.acquire("agg/3", "receiver")
    assert new_epoch == epoch + 1 and rec.seq_out == {"out/3": 4} and rec.state == b"abc"


def test_heartbeats_expire(client):
    s = store(client, "ss-heartbeat")
    s.heartbeat("ex-1", ttl=0.2)
    assert s.alive("ex-1") and not s.alive("ex-2") and not s.alive("")
    import time

    time.sleep(0.35)
    assert not s.alive("ex-1")


floats = st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from([math.inf, -math.inf]))


@settings(max_examples=40, deadline=None)
@given(
    st.builds(
        UnitRecord,
        emitted=st.integers(0, 2**40),
        offsets=st.dictionaries(st.text(min_size=1), st.text(min_size=1), max_size=3),
        seq_in=st.dictionaries(st.text(min_size=1), st.integers(0, 2**40), max_size=3),
        wm_in=st.dictionaries(st.text(min_size=1), floats, max_size=3),
        watermark=floats,
        sink_len=st.integers(0, 2**40),
        pending=st.binary(max_size=64),
        state=st.binary(max_size=256),
    )
)
def test_unit_record_round_trip(record):
    assert UnitRecord.decode(record.encode()) == record


def test_a_unit_is_restored_only_under_the_layout_its_state_was_written_under(client):
    """The last line of defence behind the upgrade check: a unit whose committed state was written under
    one state layout is refused to an executor reading it under another, and nothing changes."""
    from streamtopo.runtime.state_store import LayoutChanged

    s = store(client, "ss-layout")
    epoch, _ = s.acquire("totals/0", "ex-a", "layout-a")
    s.commit(Commit(units=[("totals/0", epoch, UnitRecord(state=b"partials").encode())]))
    with pytest.raises(LayoutChanged) as refused:
        s.acquire("totals/0", "ex-b", "layout-b")
    assert (refused.value.stored, refused.value.expected) == ("layout-a", "layout-b")
    owner = s.ownership("totals/0")
    assert (owner.owner, owner.epoch) == ("ex-a", epoch)  # the refused acquisition changed nothing
    again, rec = s.acquire("totals/0", "ex-c", "layout-a")
    assert again == epoch + 1 and rec.state == b"partials"
    assert s.acquire("totals/0", "ex-d")[0] == epoch + 2  # no layout given: no check (older executors)
    # A unit acquired under one layout that never committed holds no state: another layout may take it.
    s.acquire("join/0", "ex-a", "layout-a")
    assert s.acquire("join/0", "ex-b", "layout-b")[1] is None
    assert client.hget(s.keys.unit("join/0"), "layout") == b"layout-b"


def test_the_executor_checks_the_digest_the_planner_gives_with_the_runtimes_panes(make_spec):
    """runtime/layouts.py: the planner's fingerprint of each operator, with the pane the runtime shares."""
    from streamtopo.planner.upgrade import fingerprint
    from streamtopo.runtime.layouts import STATE_FORMAT, layouts, runtime_facts
    from streamtopo.runtime.operators import sharing_groups

    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 50000}},
        *(
            {
                "name": name,
                "kind": "aggregate",
                "inputs": ["src"],
                "keyBy": ["key"],
                "window": {"size": size, "slide": "1s"},
                "aggregations": ["sum(value) AS total"],
            }
            for name, size in (("short", "5s"), ("long", "10s"))
        ),
    )
    groups = sharing_groups(spec)
    facts = runtime_facts(spec, groups)
    pane = {"format": STATE_FORMAT, "pane": str(groups[0].pane)}
    assert facts == {"src": {"format": STATE_FORMAT}, "short": pane, "long": pane}
    digests = layouts(spec, groups)
    assert digests == {name: fingerprint(spec, name, facts) for name in ("src", "short", "long")}
    assert digests["short"] != layouts(spec, [])["short"]  # alone it keeps its state per its own pane
    older = {name: {**f, "format": "1"} for name, f in facts.items()}  # another runtime's state encoding
    assert all(fingerprint(spec, name, older) != digests[name] for name in facts)
