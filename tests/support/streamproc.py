"""A streaming query into the woodpecker sink, for tests/spark/test_spark_kept.py and by hand:

    PYTHONPATH=python .venv/bin/python tests/support/streamproc.py DATA_DIR \
        [--master local[2]] [--batches 16] [--rows 200] [--seconds S]

A fresh local Spark (`--master`) writes order ids through `prepare` into the log group "kept" of
2 logs under DATA_DIR (which must not exist yet). By default it reads `--batches` parquet files of
`--rows` order ids each, one file per micro-batch (`Trigger.AvailableNow`, `maxFilesPerTrigger`
1). With `--seconds S` it reads Spark's rate source instead (`--rows` a second, ids counting from
0) at a 1 s trigger, and stops the query after S seconds.

It prints one JSON line: the segments of each log, the micro-batches, the routes whose rows a
task handed to the worker holding their writer (`handed_off`, summed over the commit reports),
and the entries and distinct keys in the group. The commit reports are in
DATA_DIR/reports.jsonl.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import woodpecker_idem
from woodpecker_idem import connect
from woodpecker_idem.spark import prepare

PARTITIONS = 2
LOG = "kept"

log = logging.getLogger("streamproc")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args()
    data_dir = args.data_dir
    # the Python workers import the package from where this process did
    parent = str(Path(woodpecker_idem.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (parent, path) if p)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    data_dir.mkdir(parents=True)
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.seconds is None:
            source = data_dir / "in"
            source.mkdir()
            for n in range(args.batches):
                ids = pa.array(range(n * args.rows, (n + 1) * args.rows), pa.int64())
                pq.write_table(pa.table({"order_id": ids}), source / f"part-{n:04d}.parquet")
            stream = spark.readStream.schema("order_id bigint").option("maxFilesPerTrigger", 1)
            rows = stream.parquet(str(source))
        else:
            rate = spark.readStream.format("rate").option("rowsPerSecond", args.rows).load()
            rows = rate.selectExpr("value as order_id")
        writer = (
            prepare(rows, "order_id", PARTITIONS)
            .writeStream.format("woodpecker")
            .option("log", LOG)
            .option("partitions", PARTITIONS)
            .option("idempotencyKey", "order_id")
            .option("dataDir", str(data_dir))
            .option("reportFile", str(data_dir / "reports.jsonl"))
            .option("checkpointLocation", str(data_dir / "checkpoint"))
        )
        if args.seconds is None:
            query = writer.trigger(availableNow=True).start()
            query.awaitTermination()
        else:
            query = writer.trigger(processingTime="1 second").start()
            query.awaitTermination(args.seconds)
            query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
    finally:
        spark.stop()
    reports = [json.loads(x) for x in (data_dir / "reports.jsonl").read_text().splitlines()]
    client = connect(data_dir)
    try:
        logs = [client.open_log(f"{LOG}-{p}") for p in range(PARTITIONS)]
        segments = [len(handle.segments()) for handle in logs]
        keys = []
        for handle in logs:
            reader = handle.open_reader()
            keys.extend(m.idempotency_key for m in reader)
            reader.close()
    finally:
        client.close()
    out = {
        "master": args.master,
        "micro_batches": len(reports),
        "segments_per_log": segments,
        "handed_off": sum(r.get("handed_off", 0) for r in reports),
        "entries": len(keys),
        "distinct_keys": len(set(keys)),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
