"""The `woodpecker` source's options: unknown names refused with the nearest known one, numbers
parsed from text (the message quotes it), and null keys refused before any task writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from sparkenv import orders, spark  # noqa: F401 - the session fixture

from woodpecker_idem import connect
from woodpecker_idem.errors import ConfigError, InvalidArgumentError
from woodpecker_idem.spark import prepare
from woodpecker_idem.spark.options import (
    READ_OPTIONS,
    SinkOptions,
)


def parse(data_dir: Path, **options: str) -> SinkOptions:
    raw = {"log": "g", "partitions": "2", "dataDir": str(data_dir), **options}
    return SinkOptions.parse(raw, need_partitions=True)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("windowDuration", "windowDurationS"),
        ("windowMaxKey", "windowMaxKeys"),
        ("reportfil", "reportFile"),
        ("checkpointLocaton", "checkpointLocation"),
        ("idempotencyKy", "idempotencyKey"),
        ("txnVerison", "txnVersion"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_name_meant(tmp_path, typo, meant):
    with pytest.raises(
        InvalidArgumentError, match=f'unknown option "{typo}".*did you mean "{meant}"'
    ):
        parse(tmp_path, **{typo: "1"})


def test_option_names_are_case_insensitive_as_in_spark(tmp_path):
    opts = parse(tmp_path, windowdurations="2.5", IDEMPOTENCYKEY="order_id")
    assert opts.window_duration_s == 2.5 and opts.key == "order_id"


def test_a_write_option_is_refused_on_read_and_a_path_is_explained(tmp_path):
    with pytest.raises(InvalidArgumentError, match='option "partitions" does not apply here'):
        SinkOptions.parse({"log": "g", "dataDir": str(tmp_path), "partitions": "2"}, False,
                          READ_OPTIONS)  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="takes no path"):
        parse(tmp_path, path="/tmp/x")


def test_config_keys_as_options_are_checked_as_config_keys(tmp_path):
    with pytest.raises(ConfigError, match="did you mean"):
        parse(tmp_path, **{"meta.typ": "etcd"})


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("partitions", "4x", r'"partitions" must be an int 1\.\.4096, not \'4x\''),
        ("partitions", "0", r'"partitions" must be an int 1\.\.4096, not \'0\''),
        ("windowMaxKeys", "100k", r'"windowMaxKeys" must be an int 1\.\.100000000, not \'100k\''),
        (
            "windowDurationS",
            "10m",
            r'"windowDurationS" must be a number of seconds > 0, not \'10m\'',
        ),
        ("windowDurationS", "nan", r"not 'nan'"),
        ("txnVersion", "-1", r'"txnVersion" must be an int >= 0, not \'-1\''),
    ],
)
def test_numbers_are_parsed_from_text_and_the_text_quoted(tmp_path, name, text, message):
    extra = {"txnAppId": "app"} if name == "txnVersion" else {}
    with pytest.raises(InvalidArgumentError, match=message):
        parse(tmp_path, **{name: text, **extra})


def test_numbers_in_text_are_read(tmp_path):
    opts = parse(tmp_path, windowMaxKeys=" 5000 ", windowDurationS="1e2", partitions="3")
    assert (opts.window_max_keys, opts.window_duration_s, opts.partitions) == (5000, 100.0, 3)


@pytest.mark.parametrize(
    ("given", "batch", "in_flight"),
    [
        ({}, 10_000, 40_000),  # the config's defaults: in bulk, four batches in flight
        ({"append.max_inflight_entries": "5000"}, 5000, 5000),
        ({"append.max_batch_entries": "200"}, 200, 40_000),
        ({"append.max_batch_entries": "20000"}, 20_000, 80_000),
        ({"append.max_batch_entries": "300", "append.max_inflight_entries": "600"}, 300, 600),
    ],
)
def test_the_sink_batches_in_bulk_unless_the_config_sizes_batches(
    tmp_path, given, batch, in_flight
):
    append = parse(tmp_path, **given).settings.append
    assert (append.max_batch_entries, append.max_inflight_entries) == (batch, in_flight)


def test_a_misspelt_option_fails_the_spark_write_before_anything_is_written(spark, tmp_path):  # noqa: F811
    prepared = prepare(orders(spark, 50), "order_id", 2)
    with pytest.raises(Exception, match='did you mean "windowDurationS"'):
        (
            prepared.write.format("woodpecker")
            .option("log", "typo")
            .option("partitions", 2)
            .option("idempotencyKey", "order_id")
            .option("dataDir", str(tmp_path))
            .option("windowDuration", "60")
            .mode("append")
            .save()
        )
    client = connect(tmp_path)
    try:
        assert client.meta.get_log_group("typo") is None
    finally:
        client.close()


@pytest.mark.parametrize("column", ["order_id", "body"])
def test_null_keys_are_refused_before_any_task_writes(spark, tmp_path, column):  # noqa: F811
    # 2,000 rows of which one in the last partition has a null key (and a null body)
    df = orders(spark, 2000).selectExpr(
        "case when order_id = 1999 then null else order_id end as order_id",
        "cast(case when order_id = 1999 then null else concat('o', order_id) end as binary) "
        "as body",
    )
    if column == "order_id":
        prepared, options = prepare(df, "order_id", 2), {"idempotencyKey": "order_id"}
    else:
        prepared = prepare(df, None, 2, payload_column="body")
        options = {"payloadColumn": "body"}
    writer = (
        prepared.write.format("woodpecker")
        .option("log", "nulls")
        .option("partitions", 2)
        .option("dataDir", str(tmp_path))
        .mode("append")
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception, match=f"null .*column '{column}'.*The job wrote nothing"):
        writer.save()
    client = connect(tmp_path)
    try:
        written = sum(len(list(client.open_log(f"nulls-{p}").open_reader())) for p in range(2))
    finally:
        client.close()
    assert written == 0


@pytest.mark.parametrize("key", ["order_id", None], ids=["key-column", "row-json"])
def test_a_sink_partitions_other_than_prepares_fails_at_planning(spark, tmp_path, key):  # noqa: F811
    """prepare(df, key, 4) then a sink with partitions 2: refused when the write is planned,
    before any task writes a row (the rows' routes would not be the sink's)."""
    writer = (
        prepare(orders(spark, 100), key, 4)
        .write.format("woodpecker")
        .option("log", "p")
        .option("partitions", 2)
        .option("dataDir", str(tmp_path))
        .mode("append")
    )
    if key is not None:
        writer = writer.option("idempotencyKey", key)
    with pytest.raises(Exception, match=r"routed among 4 logs .* the sink writes 2"):
        writer.save()
    client = connect(tmp_path)
    try:
        assert client.meta.get_log_group("p") is None  # planning failed: no group, no row
    finally:
        client.close()
