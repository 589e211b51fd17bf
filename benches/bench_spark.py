"""Spark: the `woodpecker` sink's rows/s, idempotent vs plain (`idempotent=false`) vs Spark's own
parquet writer vs a no-op Python Data Source (`nullsink`: its tasks only read the Arrow batches,
the ceiling of any Python sink) on the same prepared DataFrame, and Arrow key hashing
(`idempotency_key`, Rust) vs Spark's built-in `md5` column function.

    .venv/bin/python -m pytest benches/bench_spark.py -p no:cacheprovider -s \
        --benchmark-json=bench-results/spark.json

Rows of ~100 B (`order_id` bigint key, a 100 B binary `body` written as is with `payloadColumn`),
P = 4, local Spark (`local[2]`), embedded default (es=1, fsync before ack). Every write goes to a
fresh log group (or parquet directory), so every row is new. The sides run interleaved (idem,
plain, parquet, null; idem, plain, parquet, null; ...) and are compared on the median of
per-round ratios.
`WOODPECKER_BENCH_SPARK_ROWS` (default 1,000,000, issue 14's size) and
`WOODPECKER_BENCH_SPARK_ROUNDS` (default 3, after one untimed warm-up round) size it; a round is
three writes of the whole DataFrame. `extra_info` of `--benchmark-json` holds the rows/s of each
side (medians) and the ratios (medians of the per-round ratios): `idempotent_vs_plain`,
`idempotent_vs_parquet`, `plain_vs_parquet`, `idempotent_vs_null`. Asserted: issue 14's target,
idempotent >= 0.9x plain, and issue 32's: idempotent >= 0.9x parquet on 100 B rows (>= 0.8x on
the realistic rows), or, where a Python Data Source cannot get there, within 5% of the no-op
Python sink on the same DataFrame (idempotent >= 0.95x null). One slow round moves a 3-round
median a lot on the shared machine: raise the rounds to judge (`benches/README.md` quotes 5).
Reported: key hashing vs md5.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import pytest
from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

ROWS = int(os.environ.get("WOODPECKER_BENCH_SPARK_ROWS", "1000000"))
ROUNDS = int(os.environ.get("WOODPECKER_BENCH_SPARK_ROUNDS", "3"))
P = 4
# issue 32: idempotent / parquet on 100 B rows and on the realistic rows, or idempotent / the
# no-op Python sink where a Python Data Source cannot reach parquet
VS_PARQUET, VS_PARQUET_REALISTIC, VS_NULL = 0.9, 0.8, 0.95


class NullWriter(DataSourceArrowWriter):
    """A task that only reads the Arrow batches Spark sends its Python worker."""

    def write(self, iterator):  # type: ignore[no-untyped-def]
        for _batch in iterator:
            pass
        return WriterCommitMessage()


class NullSink(DataSource):
    """`format("nullsink")`: what any Python Data Source costs before it does anything."""

    @classmethod
    def name(cls) -> str:
        return "nullsink"

    def writer(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return NullWriter()


# The Python workers cannot import this file: its classes go to them by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    from woodpecker_idem.spark.orders_job import local_spark

    # Spark's default stream buffer (the pipeline shrinks it so injected failures leave prefixes)
    session = local_spark(2, 10_000, {"spark.buffer.size": "65536"})
    session.dataSource.register(NullSink)
    yield session
    session.stop()


def source(spark):
    return spark.range(ROWS).selectExpr(
        "id as order_id",
        "cast(rpad(concat('order ', cast(id as string)), 100, '.') as binary) as body",
    )


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


@pytest.mark.timeout(3600)  # 1,000,000 rows x 3 sides x (rounds + warm-up): minutes, not 300 s
def test_sink_rows_per_second_idempotent_plain_parquet(spark, tmp_path, benchmark):
    from woodpecker_idem.spark import prepare

    prepared = prepare(source(spark), "order_id", P)

    def sink(name: str, idempotent: bool):
        return (
            prepared.write.format("woodpecker")
            .option("log", name)
            .option("partitions", P)
            .option("idempotencyKey", "order_id")
            .option("payloadColumn", "body")
            .option("dataDir", str(tmp_path / "wp"))
            .option("windowMaxKeys", max(100_000, ROWS))
            .option("idempotent", str(idempotent).lower())
            .mode("append")
            .save
        )

    times: dict[str, list[float]] = {"idempotent": [], "plain": [], "parquet": [], "null": []}

    def parquet_round(r: int) -> float:
        return timed(lambda: prepared.write.mode("overwrite").parquet(str(tmp_path / f"pq-{r}")))

    def null_round() -> float:
        return timed(lambda: prepared.write.format("nullsink").mode("append").save())

    sink("warm-up-idem", True)()  # Python workers, JIT, first-use costs: not timed
    sink("warm-up-plain", False)()
    parquet_round(-1)
    null_round()

    def all_rounds() -> None:
        for r in range(ROUNDS):
            times["idempotent"].append(timed(sink(f"idem-{r}", True)))
            times["plain"].append(timed(sink(f"plain-{r}", False)))
            times["parquet"].append(parquet_round(r))
            times["null"].append(null_round())
            took = ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items())
            print(f"round {r + 1}/{ROUNDS}: {took}", flush=True)

    benchmark.pedantic(all_rounds, rounds=1, iterations=1)
    vs_plain = statistics.median(
        p / i for i, p in zip(times["idempotent"], times["plain"], strict=True)
    )
    vs_parquet = statistics.median(
        q / i for i, q in zip(times["idempotent"], times["parquet"], strict=True)
    )
    plain_vs_parquet = statistics.median(
        q / p for p, q in zip(times["plain"], times["parquet"], strict=True)
    )
    vs_null = statistics.median(
        n / i for i, n in zip(times["idempotent"], times["null"], strict=True)
    )
    rates = {k: ROWS / statistics.median(v) for k, v in times.items()}
    benchmark.extra_info.update(
        {
            "rows": ROWS,
            "rounds": ROUNDS,
            "rows_per_s": rates,
            "idempotent_vs_plain": vs_plain,
            "idempotent_vs_parquet": vs_parquet,
            "plain_vs_parquet": plain_vs_parquet,
            "idempotent_vs_null": vs_null,
            "row_bytes": 100,
            "partitions": P,
            "seconds": times,
        }
    )
    print(
        f"\nspark sink, {ROWS:,} rows of 100 B, P={P}, {ROUNDS} interleaved rounds (medians): "
        f"idempotent {rates['idempotent']:,.0f} rows/s, plain {rates['plain']:,.0f} rows/s, "
        f"parquet {rates['parquet']:,.0f} rows/s, no-op Python sink {rates['null']:,.0f} "
        f"rows/s; idempotent/plain {vs_plain:.2f}x (target >= 0.9x), idempotent/parquet "
        f"{vs_parquet:.2f}x (target >= {VS_PARQUET}x, or idempotent/null >= {VS_NULL}x), "
        f"idempotent/null {vs_null:.2f}x, plain/parquet {plain_vs_parquet:.2f}x"
    )
    assert vs_plain >= 0.9, f"idempotent/plain {vs_plain:.2f}x: {times}"
    assert vs_parquet >= VS_PARQUET or vs_null >= VS_NULL, (
        f"idempotent/parquet {vs_parquet:.2f}x, idempotent/null {vs_null:.2f}x: {times}"
    )


def realistic(spark):
    """Ten columns as an order table has them: ids, a decimal amount, a timestamp, nulls, a
    struct, an array; keyed by `order_id`, written as each row's canonical JSON (~280 B)."""
    return spark.range(ROWS).selectExpr(
        "id as order_id",
        "concat('customer-', cast(id % 9973 as string)) as customer",
        "cast(id % 100000 as decimal(12, 2)) / 7 as amount",
        "timestamp_seconds(1700000000 + id) as placed_at",
        "case when id % 5 = 0 then null else concat('promo-', cast(id % 17 as string)) end "
        "as promo",
        "named_struct('street', concat(cast(id % 999 as string), ' Main Street'), "
        "'city', concat('city-', cast(id % 101 as string)), 'zip', lpad(cast(id % 99999 as "
        "string), 5, '0')) as address",
        "array(concat('sku-', cast(id % 31 as string)), concat('sku-', cast(id % 37 as string)))"
        " as items",
        "cast(id % 4 as int) as channel",
        "id % 3 = 0 as gift",
        "case when id % 7 = 0 then null else 'standard' end as shipping",
    )


@pytest.mark.timeout(3600)
def test_sink_realistic_rows_vs_parquet(spark, tmp_path, benchmark):
    """The sink (idempotent, defaults: canonical JSON payloads) against Spark's parquet writer and
    the no-op Python sink on the same prepared DataFrame of realistic rows, interleaved.
    Asserted: >= 0.7x parquet (issue 21), and >= 0.8x parquet or >= 0.95x null (issue 32)."""
    from woodpecker_idem.spark import prepare

    prepared = prepare(realistic(spark), "order_id", P).cache()
    prepared.count()  # both sides write the same rows from memory

    def sink(name: str):
        return (
            prepared.write.format("woodpecker")
            .option("log", name)
            .option("partitions", P)
            .option("idempotencyKey", "order_id")
            .option("dataDir", str(tmp_path / "wp"))
            .mode("append")
            .save
        )

    def parquet(r: int) -> float:
        return timed(lambda: prepared.write.mode("overwrite").parquet(str(tmp_path / f"pq-{r}")))

    def null() -> float:
        return timed(lambda: prepared.write.format("nullsink").mode("append").save())

    sink("warm-up")()
    parquet(-1)
    null()
    times: dict[str, list[float]] = {"idempotent": [], "parquet": [], "null": []}

    def all_rounds() -> None:
        for r in range(ROUNDS):
            times["idempotent"].append(timed(sink(f"idem-{r}")))
            times["parquet"].append(parquet(r))
            times["null"].append(null())
            took = ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items())
            print(f"round {r + 1}/{ROUNDS}: {took}", flush=True)

    benchmark.pedantic(all_rounds, rounds=1, iterations=1)
    ratio = statistics.median(
        q / i for i, q in zip(times["idempotent"], times["parquet"], strict=True)
    )
    vs_null = statistics.median(
        n / i for i, n in zip(times["idempotent"], times["null"], strict=True)
    )
    rates = {k: ROWS / statistics.median(v) for k, v in times.items()}
    benchmark.extra_info.update(
        {
            "rows": ROWS,
            "rounds": ROUNDS,
            "rows_per_s": rates,
            "idempotent_vs_parquet": ratio,
            "idempotent_vs_null": vs_null,
            "seconds": times,
        }
    )
    print(
        f"\nspark sink, {ROWS:,} realistic rows (10 columns, canonical JSON), P={P}, {ROUNDS} "
        f"interleaved rounds (medians): idempotent {rates['idempotent']:,.0f} rows/s, parquet "
        f"{rates['parquet']:,.0f} rows/s, no-op Python sink {rates['null']:,.0f} rows/s; "
        f"idempotent/parquet {ratio:.2f}x (target >= {VS_PARQUET_REALISTIC}x, or idempotent/null "
        f">= {VS_NULL}x), idempotent/null {vs_null:.2f}x"
    )
    prepared.unpersist()
    assert ratio >= 0.7, f"idempotent/parquet {ratio:.2f}x on realistic rows: {times}"
    assert ratio >= VS_PARQUET_REALISTIC or vs_null >= VS_NULL, (
        f"idempotent/parquet {ratio:.2f}x, idempotent/null {vs_null:.2f}x, realistic rows: {times}"
    )


@pytest.mark.timeout(1800)
def test_key_hashing_udf_vs_spark_md5(spark, benchmark):
    from pyspark.sql import functions as F

    from woodpecker_idem.spark import idempotency_key

    df = source(spark)

    def run(column) -> float:
        return timed(
            lambda: df.select(column.alias("k")).write.format("noop").mode("overwrite").save()
        )

    udf_s: list[float] = []
    md5_s: list[float] = []

    run(idempotency_key("order_id"))  # warm-up, not counted
    run(F.md5(F.col("order_id").cast("string")))

    def rounds() -> None:
        for _ in range(ROUNDS):
            udf_s.append(run(idempotency_key("order_id")))
            md5_s.append(run(F.md5(F.col("order_id").cast("string"))))

    benchmark.pedantic(rounds, rounds=1, iterations=1)
    ratio = statistics.median(m / u for u, m in zip(udf_s, md5_s, strict=True))
    benchmark.extra_info.update(
        {"rows": ROWS, "udf_seconds": udf_s, "md5_seconds": md5_s, "udf_vs_md5": ratio}
    )
    print(
        f"\nkey hashing, {ROWS:,} int64 keys, {ROUNDS} interleaved rounds: idempotency_key "
        f"(Arrow UDF, Rust) {ROWS / statistics.median(udf_s):,.0f} keys/s, Spark md5 "
        f"{ROWS / statistics.median(md5_s):,.0f} keys/s; UDF/md5 speed {ratio:.2f}x (reported)"
    )
