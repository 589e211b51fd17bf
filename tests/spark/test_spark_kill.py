"""A job named by txnAppId / txnVersion whose driver is SIGKILLed mid-write, re-run after the key
window: it writes exactly the rows the killed run had not (the history checker and a census)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from sparkenv import (
    PACKAGE_PARENT,
    judge_group,
    order_keys,
    orders,
    spark,  # noqa: F401 - the session fixture
)

from woodpecker_idem import connect
from woodpecker_idem.retry import Backoff
from woodpecker_idem.spark import prepare

P = 4
ROWS = 20_000
WINDOW_S = 1.0

SCRIPT = """
import sys, time
from pyspark.sql import SparkSession
from woodpecker_idem.spark import prepare

data_dir, rows = sys.argv[1], int(sys.argv[2])
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "4")
    .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    .config("spark.buffer.size", "4096")
    .getOrCreate()
)

def slowly(batches):  # an upstream slow enough for the driver to die mid-write
    for b in batches:
        time.sleep(0.05)
        yield b

df = spark.range(rows).selectExpr(
    "id as order_id",
    "cast(id % 97 as double) * 1.25 as amount",
    "concat('customer-', cast(id % 13 as string)) as customer",
)
prepared = prepare(df, "order_id", 4)
(
    prepared.mapInArrow(slowly, prepared.schema).write.format("woodpecker")
    .option("log", "orders").option("partitions", 4).option("idempotencyKey", "order_id")
    .option("dataDir", data_dir).option("windowDurationS", 1)
    .option("txnAppId", "nightly").option("txnVersion", 3).mode("append").save()
)
print("FINISHED")
"""


def entries(data_dir: Path) -> int:
    client = connect(data_dir)
    try:
        if client.meta.get_log_group("orders") is None:
            return 0
        return sum(len(list(client.open_log(f"orders-{p}").open_reader())) for p in range(P))
    except Exception:  # noqa: BLE001 - the logs may not exist yet
        return 0
    finally:
        client.close()


def test_a_killed_driver_rerun_after_the_window_writes_exactly_the_missing_rows(spark, tmp_path):  # noqa: F811
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p),
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(ROWS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait = Backoff(0.2, 1.0, budget_s=600)
        while entries(tmp_path) < 2000 and driver.poll() is None and wait.wait():
            pass
        assert driver.poll() is None, "the job ended before it could be killed"
    finally:
        kill_family(driver)
    assert b"FINISHED" not in (driver.stdout.read() if driver.stdout else b"")
    before = entries(tmp_path)
    assert 2000 <= before < ROWS
    time.sleep(WINDOW_S * 2.5)  # the window has forgotten every key written

    prepared = prepare(orders(spark, ROWS), "order_id", P)
    (
        prepared.write.format("woodpecker")
        .option("log", "orders")
        .option("partitions", P)
        .option("idempotencyKey", "order_id")
        .option("dataDir", str(tmp_path))
        .option("windowDurationS", WINDOW_S)
        .option("txnAppId", "nightly")
        .option("txnVersion", 3)
        .option("reportFile", str(tmp_path / "reports.jsonl"))
        .mode("append")
        .save()
    )
    report = json.loads((tmp_path / "reports.jsonl").read_text().splitlines()[-1])
    assert report["written"] == ROWS - before
    assert report["replayed"] == before
    client = connect(tmp_path)
    try:
        judge_group(client, "orders", order_keys(0, ROWS), P)
    finally:
        client.close()


def kill_family(driver: subprocess.Popen) -> None:
    """SIGKILL the driver, its JVM, Spark's Python daemon and workers (by PID), and wait."""
    family = [driver.pid]
    proc = _proc(driver.pid)
    if proc is not None:
        try:
            family += [c.pid for c in proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    procs = [p for p in map(_proc, family) if p is not None]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=60)
    driver.wait(60)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
