"""A readStream(group a) -> transform -> writeStream(group b) pipeline whose driver is SIGKILLed
mid micro-batch twice, each restart after the key window: b holds every key of a exactly once
(the history checker and a census)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparkenv import (
    PACKAGE_PARENT,
    judge_group,
    order_keys,
    orders,
    spark,  # noqa: F401 - the session fixture
)
from test_spark_kill import kill_family

from woodpecker_idem import connect
from woodpecker_idem.retry import Backoff
from woodpecker_idem.spark import prepare

P = 2
ROWS = 6000
WINDOW_S = 1.0

SCRIPT = """
import sys, time
from pyspark.sql import SparkSession, functions as F
from woodpecker_idem.spark import prepare

data_dir = sys.argv[1]
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    .config("spark.buffer.size", "4096")
    .getOrCreate()
)

def slowly(batches):  # a transform slow enough for the driver to die mid micro-batch
    for b in batches:
        time.sleep(0.05)
        yield b

src = (
    spark.readStream.format("woodpecker").option("log", "a").option("dataDir", data_dir)
    .option("maxEntriesPerTrigger", 1000).load()
    .select(F.from_json(F.col("payload").cast("string"), "order_id bigint, amount double")
            .alias("o"))
    .select("o.*")
)
out = prepare(src, "order_id", 2)
query = (
    out.mapInArrow(slowly, out.schema).writeStream.format("woodpecker")
    .option("log", "b").option("partitions", 2).option("idempotencyKey", "order_id")
    .option("dataDir", data_dir).option("windowDurationS", 1)
    .option("checkpointLocation", data_dir + "/checkpoint")
    .trigger(availableNow=True).start()
)
query.awaitTermination()
print("FINISHED")
"""


def entries(data_dir: Path, log: str) -> int:
    client = connect(data_dir)
    try:
        if client.meta.get_log_group(log) is None:
            return 0
        return sum(len(list(client.open_log(f"{log}-{p}").open_reader())) for p in range(P))
    finally:
        client.close()


def run_and_kill(data_dir: Path, kill_at: int) -> None:
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p),
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(data_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait = Backoff(0.2, 1.0, budget_s=600)
        while entries(data_dir, "b") < kill_at and driver.poll() is None and wait.wait():
            pass
        assert driver.poll() is None, "the query ended before it could be killed"
    finally:
        kill_family(driver)
    assert b"FINISHED" not in (driver.stdout.read() if driver.stdout else b"")


@pytest.mark.timeout(900)  # three driver JVMs and a streaming job: ~2 min on 2 quiet cores
def test_a_pipeline_killed_twice_and_restarted_after_the_window_is_exactly_once(spark, tmp_path):  # noqa: F811
    prepared = prepare(orders(spark, ROWS), "order_id", P)
    (
        prepared.write.format("woodpecker")
        .option("log", "a")
        .option("partitions", P)
        .option("idempotencyKey", "order_id")
        .option("dataDir", str(tmp_path))
        .mode("append")
        .save()
    )
    for kill_at in (1500, 3500):
        run_and_kill(tmp_path, kill_at)
        killed_at = entries(tmp_path, "b")
        assert kill_at <= killed_at < ROWS
        time.sleep(WINDOW_S * 2.5)  # the window has forgotten every key written
    from pyspark.sql import functions as F

    src = spark.readStream.format("woodpecker").option("log", "a")
    src = src.option("dataDir", str(tmp_path)).option("maxEntriesPerTrigger", 1000).load()
    parsed = src.select(
        F.from_json(F.col("payload").cast("string"), "order_id bigint, amount double").alias("o")
    ).select("o.*")
    query = (
        prepare(parsed, "order_id", P)
        .writeStream.format("woodpecker")
        .option("log", "b")
        .option("partitions", P)
        .option("idempotencyKey", "order_id")
        .option("dataDir", str(tmp_path))
        .option("windowDurationS", WINDOW_S)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None
    client = connect(tmp_path)
    try:
        judge_group(client, "b", order_keys(0, ROWS), P)
    finally:
        client.close()
