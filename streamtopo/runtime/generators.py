"""Built-in source generators: trades, quotes, words, sequence, as lazy Spark DataFrames.

Replay after a crash must yield identical records, and a key group may resume on another executor from
nothing but its offset. So every field is a pure function of ``(seed, seq)``: a counter-based generator
(Spark's ``xxhash64`` of the record's sequence number and a salt) instead of a stateful RNG. Any slice
of the sequence can be regenerated independently, in any process.

Generation runs in the JVM (a sequence of ids plus SQL expressions, whole-stage code generation) and stays
lazy: building a Spark DataFrame from pandas costs ~100k records per CPU-second, generated ids plus
expressions ~2M. Only IEEE basic arithmetic, ``floor`` and ``xxhash64`` touch the values (no ``sin`` or
``pow`` in the JVM, whose results may differ in the last bit between JVMs), so the same
``(name, seed, keys, seq)`` gives bit-identical records everywhere.

Event time is ``_ts = seq / rate_per_second``: the stream is generated in event time order, and the
source's watermark is simply the event time of the next record it will emit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamtopo.planner.source_layout import Layout, round_robin
from streamtopo.planner.source_layout import by_key as by_key_layout
from streamtopo.runtime.partitioning import route_column

_MASK = (1 << 64) - 1

TICKERS = (
    "AAPL",
    "MSFT",
    "GOOG",
    "AMZN",
    "META",
    "NVDA",
    "TSLA",
    "IBM",
    "ORCL",
    "INTC",
    "AMD",
    "CSCO",
    "ADBE",
    "CRM",
    "NFLX",
    "QCOM",
)
VOCABULARY = (  # noqa: SIM905 - a paragraph reads better than 200 quoted words
    "the of and to a in is it you that he was for on are with as his they be at one have this from or had "
    "by hot word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long make thing "
    "see him two has look more day could go come did number sound no most people my over know water than "
    "call first who may down side been now find any new work part take get place made live where after "
    "back little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need house "
    "picture try us again animal point mother world near build self earth father stream window key group"
).split()
ZIPF_EXPONENT = 1.1
RUN_CHUNK = 1 << 16
"""Records per row of a step's seq runs (runs are exploded as arrays: this bounds an array's memory)."""
SPAN_RATIO = 16
"""A step keyed by key is generated as one span of consecutive seqs filtered by key group when its runs
outnumber the span's seqs / SPAN_RATIO. A run is a row taken from Arrow into the JVM and exploded, ~5 us
per row in every job that reads it; a spanned seq is generated, hashed and compared in generated code,
~0.3 us kept or dropped (docs/benchmarks.md, "Key-partitioned ingest": a step of 500k records of
1,000,003 keys over 32 key groups took 3.1 s from one-record runs, 0.63 s spanned, 0.54 s unkeyed; 250k
records of every other key group, spanned over 500k seqs, 0.55 s, unkeyed 0.38 s)."""


def splitmix64(x: int) -> int:
    """SplitMix64 finaliser (Steele et al. 2014): a bijective, well-mixed hash of a 64-bit integer."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def salt(seed: int, stream: int) -> int:
    """The signed 64-bit salt of one random stream under ``seed`` (streams are independent)."""
    s = splitmix64((seed * 1_000_003 + stream) & _MASK)
    return s - (1 << 64) if s >= 1 << 63 else s


def uniform(column: str, seed: int, stream: int) -> str:
    """SQL for a uniform double in [0, 1) per value of ``column``: the top 53 bits of its salted xxhash64.
    (``shiftrightunsigned`` keeps it non-negative; long * double is a double, so no ANSI overflow.)"""
    return f"(shiftrightunsigned(xxhash64({column}, {salt(seed, stream)}L), 11) * {2.0**-53!r}D)"


NAMED_LITERAL = 10_000
"""Up to this many names, all of them are one split literal; beyond, the pool's names are and the others are
built per record. Building them per record (``concat`` of a cast) was 15 % of a 2,000-key aggregate job in
JFR; a 10k-name literal is ~80 kB, parsed once per query, like the words generator's alias table. A
literal covering only part of a larger key space measured 1.09x in a biased run (bench/generator_names.py):
not used until measured again."""


def _names(pool: tuple[str, ...] | list[str], index: str, count: int, prefix: str) -> str:
    """SQL naming index ``0 <= index < count``: the pool's names first, synthetic ``prefix<i>`` beyond.
    Up to :data:`NAMED_LITERAL` names are one string literal split in the JVM (constant-folded once per
    query): an ``array(...)`` of hundreds of literals costs far more to parse and analyse on every
    micro-batch, and a name looked up in it is not built again for every record."""
    listed = count if count <= NAMED_LITERAL else min(count, len(pool))
    names = [*pool[:listed], *(f"{prefix}{i}" for i in range(len(pool), listed))]
    head = f"element_at(split('{','.join(names)}', ','), CAST({index} + 1 AS INT))"
    if count <= listed:
        return head
    return f"CASE WHEN {index} < {listed} THEN {head} ELSE concat('{prefix}', CAST({index} AS STRING)) END"


def _round4(expr: str) -> str:
    """Round half up to 4 decimals with arithmetic only (Spark's ``round`` goes through BigDecimal)."""
    return f"(floor(({expr}) * 10000.0D + 0.5D) / 10000.0D)"


def _symbol_stage(df: DataFrame, seed: int, keys: int | None) -> tuple[DataFrame, str]:
    """Adds ``_idx`` (uniform symbol index) and returns the SQL of the symbol name."""
    n = keys or len(TICKERS)
    df = df.selectExpr("*", f"least(floor({uniform('seq', seed, 0)} * {n}.0D), {n - 1}L) AS _idx")
    return df, _names(TICKERS, "_idx", n, "SYM")


def _mid(seed: int) -> str:
    """A per-symbol base price (20 .. 500) with a slow deterministic drift, so VWAP windows differ over time,
    times a per-record jitter of +-0.2%. The drift is a triangle wave of period 600 s (a sine in the JVM
    is not guaranteed bit-identical across JVMs), phase-shifted per symbol."""
    base = f"(20.0D + 480.0D * {uniform('_idx', seed, 7)})"
    phase = "(_ts / 600.0D + _idx * 0.6180339887498949D)"
    wave = f"(4.0D * abs({phase} - floor({phase}) - 0.5D) - 1.0D)"
    return f"({base} * (1.0D + 0.05D * {wave}) * (1.0D + 0.004D * ({uniform('seq', seed, 1)} - 0.5D)))"


def trades(df: DataFrame, seed: int, keys: int | None) -> DataFrame:
    """Trades {symbol, price, volume}: the VWAP input of the COLA paper."""
    df, symbol = _symbol_stage(df, seed, keys)
    return df.selectExpr(
        f"{symbol} AS symbol",
        f"{_round4(_mid(seed))} AS price",
        f"1L + floor({uniform('seq', seed, 2)} * 1000.0D) AS volume",
        "_ts",
        "_kg",
    )


def quotes(df: DataFrame, seed: int, keys: int | None) -> DataFrame:
    """Quotes {symbol, bid, ask, volume}: bid half a spread (0.02% .. 0.12% of mid) below the drifting
    level, ask half a spread above; even after rounding to 4 decimals bid < ask (spread >= 0.0038)."""
    df, symbol = _symbol_stage(df, seed, keys)
    df = df.selectExpr(
        f"{symbol} AS symbol",
        f"{_mid(seed)} AS _mid",
        f"0.0002D + 0.001D * {uniform('seq', seed, 3)} AS _spread",
        f"100L * (1L + floor({uniform('seq', seed, 2)} * 50.0D)) AS volume",
        "_ts",
        "_kg",
    )
    return df.selectExpr(
        "symbol",
        f"{_round4('_mid * (1.0D - _spread / 2.0D)')} AS bid",
        f"{_round4('_mid * (1.0D + _spread / 2.0D)')} AS ask",
        "volume",
        "_ts",
        "_kg",
    )


@cache
def zipf_alias_table(n: int, exponent: float = ZIPF_EXPONENT) -> tuple[float, ...]:
    """Walker's alias table (Vose's construction) of Zipf(``exponent``) over ranks 1..n, packed one double
    per column ``j``: ``alias_j + q_j``, where column j keeps rank j+1 with probability ``q_j`` in [0, 1)
    and otherwise yields rank ``alias_j + 1`` (a full column is encoded as its own alias, q = 0).
    Sampling is exact (up to double rounding of the weights and ~39 bits of q for n <= 10k)."""
    weights = [1.0 / (r**exponent) for r in range(1, n + 1)]
    total = sum(weights)
    scaled = [w * n / total for w in weights]
    alias, q = list(range(n)), [0.0] * n
    small = [j for j, s in enumerate(scaled) if s < 1.0]
    large = [j for j, s in enumerate(scaled) if s >= 1.0]
    while small and large:
        j, big = small.pop(), large[-1]
        alias[j], q[j] = big, scaled[j]
        scaled[big] -= 1.0 - scaled[j]
        if scaled[big] < 1.0:
            small.append(large.pop())
    # Leftovers are full columns up to rounding: alias_j = j, q_j = 0 (either branch picks j).
    return tuple(alias[j] + q[j] for j in range(n))


def words(df: DataFrame, seed: int, keys: int | None) -> DataFrame:
    """Words from a vocabulary of ``keys`` words (default 200) with Zipf(1.1) frequencies: a few hot keys,
    a long tail. Exact sampling in O(1) per record with Walker's alias method (Walker 1977; Vose 1991):
    one uniform u gives the column j = floor(u n) and, from the fractional part of u n, the coin that picks
    rank j or its alias. The table is one JSON string literal that the optimiser folds into an array
    constant once per query (a 10k-element ``array(...)`` literal would cost seconds to parse)."""
    n = keys or len(VOCABULARY)
    table = f"from_json('{json.dumps(zipf_alias_table(n))}', 'array<double>')"
    df = df.selectExpr("_ts", "_kg", f"{uniform('seq', seed, 4)} * {n}.0D AS _x")
    df = df.selectExpr("_ts", "_kg", "_x", f"least(floor(_x), {n - 1}L) AS _j")
    df = df.selectExpr("_ts", "_kg", "_x", "_j", f"element_at({table}, CAST(_j + 1 AS INT)) AS _v")
    df = df.selectExpr("_ts", "_kg", "IF(_x - _j < _v - floor(_v), _j, floor(_v)) AS _rank")
    return df.selectExpr(f"{_names(VOCABULARY, '_rank', n, 'word')} AS word", "_ts", "_kg")


def sequence(df: DataFrame, seed: int, keys: int | None) -> DataFrame:
    """{seq, key, value}: key = seq % keys, value = seq; exact sums make loss or duplication visible."""
    return df.selectExpr("seq", f"seq % {keys or 1}L AS key", "seq AS value", "_ts", "_kg")


GENERATORS: dict[str, Callable[[DataFrame, int, int | None], DataFrame]] = {
    "trades": trades,
    "quotes": quotes,
    "words": words,
    "sequence": sequence,
}


def _seq_frame(
    spark: SparkSession,
    parts: list[tuple[int, int, int]],
    layouts: dict[int, Layout],
    route: tuple[int, int] | None = None,
) -> DataFrame:
    """Columns ``seq`` (long) and ``_kg`` (int) of the parts' records, generated from data, not literals.

    Spark writes a ``spark.range``'s bounds into its generated Java as literals, and the optimizer pushes
    the filters after a source down to the range, into its code-generation stage, whatever boundary is put
    between them (a ``coalesce`` was one): every step's bounds made new classes of the source's whole chain,
    which Janino compiled and the JIT compiled anew. VWAP on one executor compiled 24 classes a step. Here
    the bounds are rows of a small relation exploded by ``sequence``: the generated code is the same from
    step to step, so each class is compiled once per process, and the range fuses with the operators
    after it. The rows are the parts' runs (:func:`_runs`, at most :data:`RUN_CHUNK` records a row, each
    with its key group), or, keyed by key (``route``: ``(keys, K)``) where the runs are many, the span
    of seqs that holds them (:func:`_span`).
    """
    # From Arrow: a list of tuples becomes a pickled RDD that the JVM unpickles again in every job that
    # reads it (each of a step's jobs over the source), about 0.15 s of wall time per job on this machine.
    lo, hi, step, kg = _runs(parts, layouts)
    span = None if route is None else _span(parts, layouts, route[1])
    if route and span and len(lo) * SPAN_RATIO > int(span[1][-1] - span[0][0]) + 1:  # the span's seqs
        return _span_frame(spark, *span, *route)
    bounds = spark.createDataFrame(
        pa.table(
            {
                "lo": pa.array(lo, pa.int64()),
                "hi": pa.array(hi, pa.int64()),
                "step": pa.array(step, pa.int64()),
                "kg": pa.array(kg, pa.int32()),
            }
        )
    )
    ids = bounds.select(F.explode(F.sequence("lo", "hi", "step")).alias("id"), "kg")
    return ids.selectExpr("id AS seq", "kg AS _kg")


def _span(
    parts: list[tuple[int, int, int]], layouts: dict[int, Layout], k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The parts as the seqs from the first part's first seq to the last one's last, cut at
    :data:`RUN_CHUNK` (first seqs, last seqs included), with each key group's own first and last seq
    (arrays of ``k``; a key group without a part has the empty window ``[0, -1]``). None when a key group
    has two parts, which one window per key group cannot tell apart."""
    parts = [part for part in parts if part[2] > 0]
    if not parts or len({kg for kg, _, _ in parts}) < len(parts):
        return None
    first = np.zeros(k, np.int64)
    last = np.full(k, -1, np.int64)
    for kg, start, n in parts:
        first[kg], last[kg] = layouts[kg].seq(start), layouts[kg].seq(start + n - 1)
    held = last >= first
    a, b = int(first[held].min()), int(last[held].max())
    lo = np.arange(a, b + 1, RUN_CHUNK, dtype=np.int64)
    return lo, np.minimum(lo + RUN_CHUNK - 1, b), first, last


def _span_frame(
    spark: SparkSession,
    lo: np.ndarray,
    hi: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    keys: int,
    k: int,
) -> DataFrame:
    """The seqs of ``lo .. hi`` (rows) whose key (``seq % keys``) Spark's routing hash sends to a key group
    whose window ``first[kg] .. last[kg]`` holds them: the same records and key groups as the runs, in
    seq order rather than key group by key group (the emitter sorts what crosses). The windows ride on
    each row as two arrays, so the code is the same from step to step and no join is planned."""
    rows = len(lo)
    bounds = spark.createDataFrame(
        pa.table(
            {
                "lo": pa.array(lo, pa.int64()),
                "hi": pa.array(hi, pa.int64()),
                "first": pa.array([first] * rows, pa.list_(pa.int64())),
                "last": pa.array([last] * rows, pa.list_(pa.int64())),
            }
        )
    )
    ids = bounds.select(F.explode(F.sequence("lo", "hi")).alias("seq"), "first", "last")
    keyed = ids.withColumn("key", F.col("seq") % F.lit(keys))
    routed = keyed.withColumn("_kg", route_column(("key",), k, 0))
    window = F.col("_kg") + 1
    inside = F.col("seq").between(F.element_at("first", window), F.element_at("last", window))
    return routed.where(inside).select("seq", "_kg")


def _runs(
    parts: list[tuple[int, int, int]], layouts: dict[int, Layout]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The parts' seqs as arithmetic runs: (first seqs, last seqs included, steps, key groups), at most
    :data:`RUN_CHUNK` records a run. Part ``(kg, first, n)`` is records ``first .. first + n - 1`` of key
    group ``kg``'s layout (planner/source_layout.py): one run of step ``K`` unkeyed, one per key of the
    key group's that has any of them keyed by key.

    Each seq is in exactly one run (no record is generated only to be dropped), and the runs come in key
    group order: a step's output taken to pandas is already grouped as the emitter cuts it into unit
    pairs (emit.py), where records of interleaved key groups (one run of step 1 over all of them) cost a
    sort and a copy of every column.
    """
    pieces: list[tuple[np.ndarray, ...]] = []
    for kg, first, n in sorted(parts):
        first_seqs, last_seqs, period = layouts[kg].runs(first, n)
        count = len(first_seqs)
        pieces.append((first_seqs, last_seqs, np.full(count, period, np.int64), np.full(count, kg, np.int32)))
    if not pieces:
        pieces.append(tuple(np.empty(0, t) for t in (np.int64, np.int64, np.int64, np.int32)))
    lo, hi, step, kg_of = (np.concatenate(column) for column in zip(*pieces))
    chunks = (hi - lo) // (step * RUN_CHUNK) + 1  # a run of more than RUN_CHUNK records is cut up
    if (chunks > 1).any():
        offset = np.arange(int(chunks.sum())) - np.repeat(np.cumsum(chunks) - chunks, chunks)
        lo, hi, step, kg_of = (np.repeat(column, chunks) for column in (lo, hi, step, kg_of))
        lo = lo + offset * RUN_CHUNK * step
        hi = np.minimum(lo + (RUN_CHUNK - 1) * step, hi)
    return lo, hi, step, kg_of


def frame(
    spark: SparkSession,
    name: str,
    parts: list[tuple[int, int, int]],
    k: int,
    rate_per_second: float,
    seed: int = 0,
    keys: int | None = None,
    by_key: bool = False,
) -> DataFrame:
    """Lazy Spark DataFrame of the records of the given parts: part ``(kg, first, n)`` is records ``first
    .. first + n - 1`` of key group ``kg`` of ``k`` (unkeyed ``seq = kg + i * k``; ``by_key``: the seqs
    whose ``key`` hashes to ``kg``, planner/source_layout.py), with the generator's columns, ``_ts``
    (double, ``seq / rate_per_second``) and ``_kg`` (int, = kg). Nothing is computed until an action runs."""
    if name not in GENERATORS:
        raise ValueError(f"source.generator: unknown generator {name!r} (known: {', '.join(GENERATORS)})")
    kgs = {kg for kg, _, _ in parts}
    layouts = {kg: by_key_layout(kg, k, keys or 1) if by_key else round_robin(kg, k) for kg in kgs}
    ts = (F.col("seq") / F.lit(float(rate_per_second))).alias("_ts")
    route = (keys or 1, k) if by_key else None
    df = _seq_frame(spark, parts, layouts, route).select("seq", ts, "_kg")
    return GENERATORS[name](df, seed, keys)
