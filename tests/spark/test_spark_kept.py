"""A streaming query's writers stay open in the Python workers between micro-batches: no new
segment per log per micro-batch while a route's tasks run in the worker holding its writer.

A fresh local Spark with one task slot (so one Python worker, which Spark reuses for every task)
runs 8 micro-batches into 2 logs: each log keeps the one segment its first writer opened. (Where
a route's task moves to another worker, that worker takes the log over: one new segment per
move; docs/spark.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sparkenv import PACKAGE_PARENT, judge_group, order_keys

from woodpecker_idem import connect

BATCHES = 8
ROWS = 200

SCRIPT = """
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from pyspark.sql import SparkSession
from woodpecker_idem.spark import prepare

data_dir, batches, rows = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
source = data_dir / "in"
source.mkdir()
for n in range(batches):
    ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
    pq.write_table(pa.table({"order_id": ids}), source / f"part-{n:02d}.parquet")
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
try:
    stream = spark.readStream.schema("order_id bigint").option("maxFilesPerTrigger", 1)
    query = (
        prepare(stream.parquet(str(source)), "order_id", 2)
        .writeStream.format("woodpecker").option("log", "kept").option("partitions", 2)
        .option("idempotencyKey", "order_id").option("dataDir", str(data_dir))
        .option("reportFile", str(data_dir / "reports.jsonl"))
        .option("checkpointLocation", str(data_dir / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
finally:
    spark.stop()
"""


def test_micro_batches_write_through_the_writers_their_worker_kept(tmp_path: Path):
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(BATCHES), str(ROWS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(x) for x in (tmp_path / "reports.jsonl").read_text().splitlines()]
    assert [r["written"] for r in reports] == [ROWS] * BATCHES
    client = connect(tmp_path)
    try:
        segments = [len(client.open_log(f"kept-{p}").segments()) for p in range(2)]
        assert segments == [1, 1]  # not one per micro-batch
        judge_group(client, "kept", order_keys(0, BATCHES * ROWS), 2)
    finally:
        client.close()
