"""The sink's `compression` option (issue 32 item 4): every writer a task opens compresses its
batches; a re-run finds every key (the windows rebuilt from compressed segments); a bad value
is refused when the write is planned, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparkenv import (
    judge_group,
    order_keys,
    orders,
    spark,  # noqa: F401 - the session fixture
)

from woodpecker_idem import connect
from woodpecker_idem.logstore.blocks import CODECS
from woodpecker_idem.logstore.segment_files import BATCH

P = 2


def save(df, data_dir: Path, **options: str) -> None:
    w = (
        df.write.format("woodpecker")
        .option("log", "zorders")
        .option("partitions", P)
        .option("idempotencyKey", "order_id")
        .option("dataDir", str(data_dir))
        .option("reportFile", str(data_dir / "reports.jsonl"))
        .mode("append")
    )
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def batch_codecs(data_dir: Path) -> set[int]:
    """The codec byte of the first batch header of every segment file under `data_dir`."""
    return {BATCH.unpack_from(f.read_bytes(), 0)[2] & 0xFF for f in data_dir.rglob("data")}


def test_the_sink_compresses_with_its_option_and_a_rerun_finds_every_key(spark, tmp_path):  # noqa: F811
    from woodpecker_idem.spark import prepare

    df = prepare(orders(spark, 400), "order_id", P)
    save(df, tmp_path, compression="zstd")
    assert batch_codecs(tmp_path) == {CODECS["zstd"]}
    save(df, tmp_path, compression="zstd")  # a re-run: every row a duplicate
    last = json.loads((tmp_path / "reports.jsonl").read_text().splitlines()[-1])
    assert last["duplicates"] == 400
    client = connect(tmp_path)
    try:
        judge_group(client, "zorders", order_keys(0, 400), P)
    finally:
        client.close()


def test_a_bad_compression_value_is_refused_before_anything_is_written(spark, tmp_path):  # noqa: F811
    from woodpecker_idem.spark import prepare

    with pytest.raises(Exception, match=r'option "compression" must be one of none, lz4, zstd'):
        save(prepare(orders(spark, 10), "order_id", P), tmp_path, compression="gzip")
    assert not list(tmp_path.rglob("data"))
