"""examples/vwap.yaml in Flink SQL, reading the same trades and quotes, for bench/vwap.py's PyFlink rows.

Same records: a bounded ``datagen`` sequence per source feeds ``bench/flink/Generators.java``, table
functions that compute every field of streamtopo/runtime/generators.py with the same IEEE operations in
the same order, on Spark's ``xxhash64`` draws, with the salts and ticker pool computed here by
generators.py itself: prices and volumes are bit-identical. (The same fields as Flink SQL expressions
cost Flink several times their work: its planner inlines a view's expressions into every place that
reads them.) ``pmod(hash(symbol), 4)``, Spark's Murmur3, which Flink lacks, is a ``CASE`` over the
sixteen tickers, computed here with the runtime's own Spark hash.

Same operators, in Flink's terms:

- The filters and maps are the example's own expressions.
- Each group's sliding VWAP is Flink's ``HOP`` window aggregate (60 s sliding by 10 s), by window and symbol.
- streamtopo's join pairs a quote of event time ``t`` with the VWAP row whose ``_ts = window_end = E``
  falls in the same 10 s tumbling window: ``floor(t / 10) = E / 10``, so ``t`` in ``[E, E + 10 s)``. A
  Flink window aggregate's row carries ``window_time = E - 1 ms``, and a window join does not accept a
  window TVF over a window aggregate's time (the planner makes it a regular join, state kept forever), so
  this is Flink's interval join on ``rt BETWEEN vt + 1 ms AND vt + 10 s``, exact on whole-millisecond
  rowtimes: each quote meets exactly the rows streamtopo's join gives it.
- The bargains' 60 s ranking window is that of the pair's join window end (``E + 10``). A window TVF
  cannot follow the interval join either (its output has no time attribute), so the ranking is a group
  aggregate by symbol and window end (an update stream, mini-batched); its final row per group is the
  window's.

Outputs go to ``print`` tables (``vwap`` and ``bargains``) that bench/peers_worker.py reads back; the
harness compares them with streamtopo's sink rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from streamtopo.runtime.generators import TICKERS, salt
from streamtopo.runtime.partitioning import key_hash

EVENT_RATE = {"trades": 40_000, "quotes": 60_000}
"""Records per event-time second of each source (examples/vwap.yaml's ratePerSecond)."""
GROUPS = "abcd"
EPOCH = "TIMESTAMP '1970-01-01 00:00:00'"
SEED = 0
"""examples/vwap.yaml's sources declare no seed."""
UDF = Path(__file__).parent / "flink" / "Generators.java"
UDF_CLASS = "streamtopo.bench.Generators"


def group_of_symbol() -> str:
    """``pmod(hash(symbol), 4)`` as a CASE over the tickers (Spark's Murmur3 hash, seed 42)."""
    hashes = key_hash(pd.DataFrame({"symbol": list(TICKERS)}), ("symbol",))
    cases = " ".join(f"WHEN '{t}' THEN {int(h) % 4}" for t, h in zip(TICKERS, hashes))
    return f"CASE symbol {cases} END"


def statements(run: int, trades: int, quotes: int) -> tuple[list[str], list[str]]:
    """(DDL and views, the two INSERTs) of one run over ``trades`` trades and ``quotes`` quotes, every
    name suffixed with ``run`` (the worker keeps one table environment)."""
    ddl = [
        f"CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS {name} AS '{UDF_CLASS}${name}' LANGUAGE JAVA"
        for name in ("Trades", "Quotes")
    ]
    pool = ",".join(TICKERS)
    salts = ",".join(str(salt(SEED, stream)) for stream in range(8))
    for source, count in (("trades", trades), ("quotes", quotes)):
        rate = EVENT_RATE[source]
        fields = "symbol, price, volume" if source == "trades" else "symbol, bid, ask, volume"
        # The watermark trails by 1 ms: records share a millisecond (40 or 60 of them).
        ddl += [
            f"CREATE TEMPORARY TABLE {source}_seq{run} (seq BIGINT, rt AS TO_TIMESTAMP_LTZ(seq /"
            f" {rate // 1000}, 3), WATERMARK FOR rt AS rt - INTERVAL '0.001' SECOND) WITH ('connector' ="
            " 'datagen', 'fields.seq.kind' = 'sequence', 'fields.seq.start' = '0',"
            f" 'fields.seq.end' = '{count - 1}', 'rows-per-second' = '1000000000000')",
            f"CREATE TEMPORARY VIEW {source}{run} AS SELECT {fields}, rt FROM {source}_seq{run},"
            f" LATERAL TABLE({source.title()}(seq, CAST({float(rate)!r} AS DOUBLE), '{pool}', '{salts}'))",
        ]
    ddl += [
        # trades-valid, trades-notional; quotes-valid, quotes-spread
        f"CREATE TEMPORARY VIEW trades_notional{run} AS SELECT symbol, price, volume, price * volume AS pv,"
        f" {group_of_symbol()} AS grp, rt FROM trades{run}"
        " WHERE price > 0 AND volume > 0 AND symbol IS NOT NULL",
        f"CREATE TEMPORARY VIEW quotes_spread{run} AS SELECT symbol, bid, ask, volume, ask - bid AS spread,"
        f" {group_of_symbol()} AS grp, rt FROM quotes{run} WHERE bid > 0 AND ask >= bid AND volume > 0",
    ]
    for g, group in enumerate(GROUPS):
        ddl += [
            # trades-g -> vwap-g -> vwap-price-g
            f"CREATE TEMPORARY VIEW trades_{group}{run} AS SELECT * FROM trades_notional{run} WHERE grp = {g}",
            f"CREATE TEMPORARY VIEW vwap_{group}{run} AS SELECT symbol, window_end AS vwap_end, pv / v AS vwap,"
            " trades, window_time AS vt FROM (SELECT window_start, window_end, window_time, symbol, SUM(pv) AS pv,"
            f" SUM(volume) AS v, COUNT(*) AS trades FROM TABLE(HOP(TABLE trades_{group}{run}, DESCRIPTOR(rt),"
            " INTERVAL '10' SECOND, INTERVAL '60' SECOND)) GROUP BY window_start, window_end, window_time,"
            " symbol)",
            # quotes-g, match-g, bargains-g, bargain-index-g
            f"CREATE TEMPORARY VIEW quotes_{group}{run} AS SELECT * FROM quotes_spread{run}"
            f" WHERE grp = {g} AND spread < 0.05 * ask",
            # match-g: streamtopo pairs a quote at t with the VWAP row ending at E when floor(t / 10) = E / 10,
            # t in [E, E + 10 s); the row's window_time is E - 1 ms, and rowtimes are whole milliseconds.
            f"CREATE TEMPORARY VIEW bargains_{group}{run} AS SELECT L.symbol, L.ask, R.vwap,"
            " (R.vwap - L.ask) * L.volume AS bargain_index, R.vwap_end FROM quotes_"
            f"{group}{run} L JOIN vwap_{group}{run} R ON L.symbol = R.symbol AND L.rt BETWEEN"
            " R.vt + INTERVAL '0.001' SECOND AND R.vt + INTERVAL '10' SECOND WHERE L.ask < R.vwap",
        ]
    union = " UNION ALL ".join(f"SELECT * FROM bargains_{group}{run}" for group in GROUPS)
    vwaps = " UNION ALL ".join(
        f"SELECT symbol, TIMESTAMPDIFF(SECOND, {EPOCH}, vwap_end), vwap, trades FROM vwap_{group}{run}"
        for group in GROUPS
    )
    ddl.append(f"CREATE TEMPORARY VIEW bargains{run} AS {union}")
    ddl += [
        f"CREATE TEMPORARY TABLE vwap_out{run} (symbol STRING, window_end BIGINT, vwap DOUBLE,"
        " trades BIGINT) WITH ('connector' = 'print', 'print-identifier' = 'vwap')",
        f"CREATE TEMPORARY TABLE bargains_out{run} (symbol STRING, window_end BIGINT,"
        " best_index DOUBLE, best_ask DOUBLE, bargains BIGINT) WITH ('connector' = 'print',"
        " 'print-identifier' = 'bargains')",
    ]
    inserts = [
        f"INSERT INTO vwap_out{run} {vwaps}",
        # top-bargains: a pair's ranking window is that of its join window's end, E + 10 s
        f"INSERT INTO bargains_out{run} SELECT symbol, rank_end, MAX(bargain_index), MIN(ask), COUNT(*) FROM"
        f" (SELECT *, (FLOOR((TIMESTAMPDIFF(SECOND, {EPOCH}, vwap_end) + 10) / 60) + 1) * 60"
        f" AS rank_end FROM bargains{run}) GROUP BY symbol, rank_end",
    ]
    return ddl, inserts
