"""One local SparkSession per test session (the JVM takes tens of seconds to start).

`local[2,3]`: 2 threads, a task is tried up to 3 times. Python workers run this interpreter with
the package importable; everything binds to 127.0.0.1; Arrow batches are kept small so a failure
injected mid-partition leaves a written prefix (and small stream buffers, so the rows before the
failure reach the sink before the task fails). Also the order rows, failure injection and the
read-back judge the Spark tests share.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem
from woodpecker_idem import explicit_key
from woodpecker_idem._core import route_keys
from woodpecker_idem.testing.history import History

# Workers import the package from where this process did (source tree or installed wheel).
PACKAGE_PARENT = str(Path(woodpecker_idem.__file__).resolve().parent.parent)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    path = os.environ.get("PYTHONPATH", "")
    if PACKAGE_PARENT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, path) if p)
    from pyspark.sql import SparkSession

    from woodpecker_idem.spark import register

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("woodpecker-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .config("spark.buffer.size", "4096")  # rows reach Python workers without waiting
        .config("spark.python.worker.reuse", "true")
        # how long the JVM waits for a Python worker it started to connect back (15 s by
        # default): stream readers' workers did not make it at load 10-17
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def orders(spark: Any, n: int = 2000, start: int = 0) -> Any:
    """Order rows `start .. start + n` (order_id bigint, amount, customer)."""
    return spark.range(start, start + n).selectExpr(
        "id as order_id",
        "cast(id % 97 as double) * 1.25 as amount",
        "concat('customer-', cast(id % 13 as string)) as customer",
    )


def order_keys(start: int, n: int) -> set[bytes]:
    return {explicit_key(str(i)) for i in range(start, start + n)}


def judge_group(client: Any, log: str, expected_keys: set[bytes], partitions: int) -> None:
    """Read the group back: the history checker finds no key twice in the window and nothing
    invented; the census finds every expected key (nothing lost)."""
    messages = []
    for p in range(partitions):
        reader = client.open_log(f"{log}-{p}").open_reader()
        part = list(reader)
        reader.close()
        keys = b"".join(m.idempotency_key for m in part)
        routes = memoryview(route_keys(keys, partitions)).cast("i")
        assert set(routes) <= {p}, f"log {log}-{p} holds keys of other routes"
        messages.extend(part)
    # The tasks' writes, outcome unknown to the test (each may have landed); payloads as
    # stored: these tests judge keys (duplicates, inventions, the census below).
    stored = {m.idempotency_key: m.payload for m in messages}
    history = History()
    for k in expected_keys:
        history.failed(k, stored.get(k, b""), "written by Spark")
    verdict = history.check(messages, 600_000, 100_000)
    assert verdict.ok, verdict.summary()
    assert len(messages) == len(expected_keys)
    assert {m.idempotency_key for m in messages} == expected_keys


def run_attempt(opts: Any, batches: Iterator[Any], msg: Any, results: Any) -> None:
    """Write `batches` as one task attempt (`write_batches`) and put its outcome on `results`:
    ("ok", rows, written, duplicates), ("fenced", rows, written, why) or ("error", type, why, 0)."""
    from woodpecker_idem.errors import WriterFencedError
    from woodpecker_idem.spark.sink import write_batches

    try:
        write_batches(opts, batches, msg)
        results.put(("ok", msg.rows, msg.written, msg.duplicates))
    except WriterFencedError as exc:
        results.put(("fenced", msg.rows, msg.written, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(("error", type(exc).__name__, str(exc), 0))
