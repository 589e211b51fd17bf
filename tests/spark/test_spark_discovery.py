"""`format("woodpecker")` without `register(spark)`: Spark 4 finds the source in the top-level
`pyspark_woodpecker` module, in a fresh JVM and session that never registered anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sparkenv import PACKAGE_PARENT

SCRIPT = """
import sys
from pyspark.sql import SparkSession
from woodpecker_idem.spark import prepare

data_dir = sys.argv[1]
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
try:
    df = spark.range(300).selectExpr("id as order_id", "id * 2 as doubled")
    (
        prepare(df, "order_id", 2).write.format("woodpecker").option("log", "found")
        .option("partitions", 2).option("idempotencyKey", "order_id")
        .option("dataDir", data_dir).mode("append").save()
    )
    back = spark.read.format("woodpecker").option("log", "found").option("dataDir", data_dir)
    print("ROWS", back.load().count())
finally:
    spark.stop()
"""


def test_the_module_spark_looks_for_defines_the_source():
    import pyspark_woodpecker

    assert pyspark_woodpecker.DefaultSource.name() == "woodpecker"


def test_format_woodpecker_works_in_a_fresh_session_without_register(tmp_path: Path):
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 300" in done.stdout
