"""The built-in generators as lazy Spark frames: exact sequences for any parts, determinism, shapes, Zipf."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from streamtopo.planner import source_layout
from streamtopo.runtime import generators
from streamtopo.runtime.partitioning import route, route_column

pytestmark = pytest.mark.spark

K = 4
# Part layouts: all key groups at one progress, near it, a subset, every d-th, sparse, a key group twice.
LAYOUTS = {
    "aligned": [(kg, 5, 30) for kg in range(K)],
    "near-aligned": [(0, 6, 29), (1, 5, 30), (2, 5, 29), (3, 5, 30)],
    "subset": [(1, 0, 7), (3, 2, 40)],
    "every other kg": [(1, 4, 25), (3, 4, 25)],
    "every fourth kg": [(2, 7, 11)],
    "sparse": [(2, 100, 3), (0, 0, 2)],
    "same kg twice": [(1, 0, 5), (1, 9, 4), (2, 3, 0)],
    "empty": [(0, 0, 0)],
}


def expected_seq(parts: list[tuple[int, int, int]], k: int) -> list[int]:
    return sorted(kg + (first + i) * k for kg, first, n in parts for i in range(n))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sequence_is_exact_for_any_parts(spark, layout):
    parts = LAYOUTS[layout]
    df = generators.frame(spark, "sequence", parts, K, 50.0, keys=7).toPandas().sort_values("seq")
    assert df.seq.tolist() == expected_seq(parts, K)
    assert list(df.columns) == ["seq", "key", "value", "_ts", "_kg"]
    assert df.dtypes.astype(str).tolist() == ["int64", "int64", "int64", "float64", "int32"]
    assert (df.key == df.seq % 7).all() and (df.value == df.seq).all() and (df._kg == df.seq % K).all()
    np.testing.assert_array_equal(df._ts.to_numpy(), df.seq.to_numpy() / 50.0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_runs_generate_each_record_once_and_nothing_else(layout):
    """The runs a step explodes hold exactly the parts' seqs: none twice, none generated to be dropped."""
    parts = LAYOUTS[layout]
    layouts = {kg: source_layout.round_robin(kg, K) for kg, _, _ in parts}
    lo, hi, step, kg = generators._runs(parts, layouts)
    seqs = [s for a, b, c in zip(lo.tolist(), hi.tolist(), step.tolist()) for s in range(a, b + 1, c)]
    assert sorted(seqs) == expected_seq(parts, K)
    assert (kg == np.mod(lo, K)).all()


@pytest.mark.parametrize("keys", [1, 7, 50, 3_001])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_runs_by_key_hold_each_key_groups_records_and_cut_long_runs(layout, keys, monkeypatch):
    """Keyed by key, part (kg, first, n) is records first .. first + n - 1 of the seqs whose key hashes to
    kg (source_layout's arithmetic, checked against the hash itself); runs longer than RUN_CHUNK are cut."""
    monkeypatch.setattr(generators, "RUN_CHUNK", 3)
    parts = LAYOUTS[layout]
    layouts = {kg: source_layout.by_key(kg, K, keys) for kg, _, _ in parts}
    lo, hi, step, kg = generators._runs(parts, layouts)
    assert ((hi - lo) // step < 3).all()
    got = sorted(
        (int(g), s) for a, b, c, g in zip(lo, hi, step, kg) for s in range(int(a), int(b) + 1, int(c))
    )
    by_kg = {g: owned(g, keys, 4_000) for g in range(K)}
    want = sorted(
        (g, by_kg[g][first + i]) for g, first, n in parts for i in range(n) if first + i < len(by_kg[g])
    )
    assert got == want


def owned(kg: int, keys: int, upto: int) -> list[int]:
    """Seqs below ``upto`` whose key (seq % keys) the routing hash sends to ``kg`` of ``K``."""
    seqs = np.arange(upto, dtype=np.int64)
    groups = route(pd.DataFrame({"key": seqs % keys}), ("key",), K, 0)
    return seqs[groups == kg].tolist()


@pytest.mark.parametrize("keys", [1, 7, 1009])
def test_a_layout_by_key_counts_and_orders_its_key_groups_records(keys):
    """Every seq in exactly one key group, each in seq order, its count below any bound and its i-th
    record as enumerating them gives; a key group without keys has no records and ends at once."""
    count = 5_000
    layouts = [source_layout.by_key(kg, K, keys) for kg in range(K)]
    seqs = [owned(kg, keys, count) for kg in range(K)]
    assert sorted(s for group in seqs for s in group) == list(range(count))
    for layout, mine in zip(layouts, seqs):
        assert [layout.seq(i) for i in range(len(mine))] == mine
        assert layout.total(count) == len(mine)
        for bound in (0, 1, 6, 999, 1009, 2_500, count):
            assert layout.below(bound) == sum(s < bound for s in mine)
        assert layout.total(None) == (None if mine else 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_records_come_out_grouped_by_key_group_in_seq_order(spark, layout):
    """As the step takes them out of the JVM (Arrow), unsorted: key group by key group, each in seq order,
    the order the emitter cuts records into unit pairs in (it sorts only records that are not)."""
    parts = LAYOUTS[layout]
    table = generators.frame(spark, "sequence", parts, K, 50.0, keys=7).toArrow()
    kg, seq = table["_kg"].to_numpy(), table["seq"].to_numpy()
    assert sorted(seq.tolist()) == expected_seq(parts, K)
    assert (np.diff(kg) >= 0).all()
    assert all((np.diff(seq[kg == g]) > 0).all() for g in np.unique(kg))


def _generated_code(df) -> list[str]:
    """The Java of each whole-stage-codegen subtree of ``df``'s plan (headers, which carry expression
    ids, left out)."""
    text = df.sparkSession._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "codegen")
    return [sub.split("Generated code:", 1)[1] for sub in text.split("== Subtree ")[1:]]


# How a step keyed by key is generated: its runs as rows, or one span of seqs filtered by key group.
SPANNING = {"runs": 0, "span": 10**9}


@pytest.mark.parametrize("spanning", [None, *SPANNING])
def test_steps_reuse_the_generated_code_of_the_source_and_what_follows(spark, monkeypatch, spanning):
    """Two steps of the same key groups differ in their bounds only, which must not reach the generated
    Java (Spark writes a range's bounds into it, and pushes the filters after a source down into the
    range's stage): the same code each step, compiled and JIT-compiled once per process, unkeyed and
    keyed by key either way. The second step's runs span several rows."""
    monkeypatch.setattr(generators, "RUN_CHUNK", 256)
    if spanning:
        monkeypatch.setattr(generators, "SPAN_RATIO", SPANNING[spanning])

    def step(first: int, n: int) -> list[str]:
        parts = [(kg, first, n) for kg in range(K)]
        df = generators.frame(spark, "sequence", parts, K, 50.0, keys=7, by_key=bool(spanning))
        df = df.where("value % 10 <> 0")
        return _generated_code(df.groupBy("key").agg(F.sum("value")))

    # Whole-stage code generation as for a large step (executors run in this process switch it per step).
    before = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "true")
    try:
        one, two = step(0, 1_000), step(1_000, 500)
    finally:
        spark.conf.set("spark.sql.codegen.wholeStage", before)
    assert len(one) >= 2 and one == two


@pytest.mark.parametrize("name", ["trades", "quotes", "words", "sequence"])
def test_same_seq_same_record_whatever_the_parts(spark, name):
    """A record depends on its seq only, not on which parts or which range plan produced it."""
    whole = generators.frame(spark, name, LAYOUTS["aligned"], K, 1.0, seed=3, keys=40).toPandas()
    pieces = pd.concat(
        [
            generators.frame(spark, name, parts, K, 1.0, seed=3, keys=40).toPandas()
            for parts in ([(0, 5, 10), (2, 5, 30)], [(0, 15, 20), (1, 5, 30), (3, 5, 30)])
        ]
    )
    by_seq = [f.sort_values("_ts").reset_index(drop=True) for f in (whole, pieces)]  # _ts = seq at rate 1
    pd.testing.assert_frame_equal(*by_seq)
    other = generators.frame(spark, name, LAYOUTS["aligned"], K, 1.0, seed=4, keys=40).toPandas()
    if name != "sequence":
        assert not whole.drop(columns=["_ts", "_kg"]).equals(other.drop(columns=["_ts", "_kg"]))


def test_values_are_identical_in_a_fresh_process_and_jvm(spark):
    """xxhash64 and IEEE arithmetic only: another interpreter with its own JVM regenerates exactly the same
    records (a replay on another executor relies on it)."""
    requests = [
        ("trades", [(0, 0, 40), (2, 7, 40)], 3, 0),
        ("quotes", [(1, 0, 40)], 3, 2),
        ("words", [(0, 0, 60)], 1, 5),
        ("sequence", [(1, 3, 20)], 2, 0),
    ]

    def rows(name, parts, k, seed):
        frame = generators.frame(spark, name, parts, k, 1000.0, seed=seed, keys=50)
        return json.loads(frame.drop("_kg").toPandas().to_json(orient="values", double_precision=15))

    code = (
        "import json, sys\n"
        "from streamtopo.runtime import generators\n"
        "from streamtopo.runtime.spark import get_spark\n"
        "spark = get_spark()\n"
        "out = [json.loads(generators.frame(spark, n, [tuple(p) for p in parts], k, 1000.0, seed=s, keys=50)"
        ".drop('_kg').toPandas().to_json(orient='values', double_precision=15))\n"
        "       for n, parts, k, s in json.loads(sys.stdin.read())]\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(requests), capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [rows(*r) for r in requests]


def test_trades_and_quotes_shapes(spark):
    parts = [(kg, 0, 5000) for kg in range(K)]
    t = generators.frame(spark, "trades", parts, K, 100.0, keys=5).toPandas()
    assert list(t.columns) == ["symbol", "price", "volume", "_ts", "_kg"]
    assert t.dtypes.astype(str).tolist() == ["object", "float64", "int64", "float64", "int32"]
    assert t.symbol.nunique() == 5 and (t.price > 0).all() and t.volume.between(1, 1000).all()
    many = generators.frame(spark, "trades", parts, K, 100.0, keys=40).toPandas()
    assert many.symbol.nunique() == 40 and {"AAPL", "SYM39"} <= set(many.symbol)
    q = generators.frame(spark, "quotes", parts, K, 100.0).toPandas()
    assert list(q.columns) == ["symbol", "bid", "ask", "volume", "_ts", "_kg"]
    assert (q.ask > q.bid).all() and (q.bid > 0).all() and (q.volume % 100 == 0).all()
    assert q.symbol.nunique() == len(generators.TICKERS)


@pytest.mark.parametrize("literal", [3, 59, 60, generators.NAMED_LITERAL])
def test_names_are_the_pool_then_the_prefix_and_index_whether_or_not_the_literal_holds_them(
    spark, monkeypatch, literal
):
    """The split literal and the per-record ``concat`` name every index alike: a key's name does not
    depend on which of them builds it (a pool of 4, 60 keys, a literal limit below and at 60, above)."""
    monkeypatch.setattr(generators, "NAMED_LITERAL", literal)
    pool, count = ("A", "B", "C", "D"), 60
    sql = generators._names(pool, "id", count, "K")
    got = [r[0] for r in spark.range(count).selectExpr(f"{sql} AS name").orderBy("id").collect()]
    assert got == [*pool, *(f"K{i}" for i in range(4, count))]


@pytest.mark.parametrize("keys", [None, 10000])
def test_words_follow_zipf(spark, keys):
    """Shares of the top ranks over 200k draws against the exact Zipf(1.1) pmf (std error < 0.001)."""
    n = keys or len(generators.VOCABULARY)
    df = generators.frame(spark, "words", [(0, 0, 200_000)], 1, 1000.0, seed=1, keys=keys)
    counts = df.groupBy("word").count().toPandas().set_index("word")["count"]
    pmf = 1.0 / np.arange(1, n + 1) ** generators.ZIPF_EXPONENT
    pmf /= pmf.sum()
    names = [*generators.VOCABULARY, *(f"word{i}" for i in range(len(generators.VOCABULARY), n))][:n]
    shares = counts.reindex(names[:20], fill_value=0).to_numpy() / 200_000
    np.testing.assert_allclose(shares, pmf[:20], atol=0.005)
    assert counts.sum() == 200_000 and set(counts.index) <= set(names)


def test_zipf_alias_table_reproduces_the_pmf():
    """The alias table's implied probabilities (column mass + aliased mass) equal the Zipf pmf."""
    n = 500
    table = generators.zipf_alias_table(n)
    implied = np.zeros(n)
    for j, v in enumerate(table):
        alias, q = int(v // 1), v - v // 1
        implied[j] += q / n
        implied[alias] += (1 - q) / n
    pmf = 1.0 / np.arange(1, n + 1) ** generators.ZIPF_EXPONENT
    np.testing.assert_allclose(implied, pmf / pmf.sum(), rtol=1e-9, atol=1e-12)


def test_unknown_generator_is_refused(spark):
    with pytest.raises(ValueError, match="source.generator: unknown generator 'nope'"):
        generators.frame(spark, "nope", [(0, 0, 1)], 1, 1.0)


@pytest.mark.parametrize("spanning", SPANNING)
@pytest.mark.parametrize("layout", ["aligned", "near-aligned", "subset", "sparse", "same kg twice"])
def test_a_sequence_by_key_is_in_the_key_groups_spark_routes_its_keys_to(
    spark, layout, spanning, monkeypatch
):
    """Generated by key, every record of part (kg, ...) is one Spark's own routing hash sends to kg (the
    hash every keyed edge routes by, so the edge after the source keeps each record where it is), and the
    records are those of the layout: the same seqs, values and keys as unkeyed generation gives them,
    from runs or from a span filtered by key group (where a key group lags the others far behind, the
    span holds mostly records of no part: each is dropped, none taken twice)."""
    monkeypatch.setattr(generators, "SPAN_RATIO", SPANNING[spanning])
    monkeypatch.setattr(generators, "RUN_CHUNK", 64)  # spans of several rows
    parts, keys = LAYOUTS[layout], 50
    frame = generators.frame(spark, "sequence", parts, K, 50.0, keys=keys, by_key=True)
    df = frame.withColumn("routed", route_column(("key",), K, F.col("_kg"))).toPandas()
    assert (df.routed == df._kg).all()
    assert (df.key == df.seq % keys).all() and (df.value == df.seq).all()
    by_kg = {g: owned(g, keys, 4_000) for g in range(K)}
    want = sorted((g, by_kg[g][first + i]) for g, first, n in parts for i in range(n))
    assert sorted(zip(df._kg.tolist(), df.seq.tolist())) == want
