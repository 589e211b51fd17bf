"""One local SparkSession per test session (the JVM takes tens of seconds to start).

`local[2,3]`: 2 threads, a task is tried up to 3 times. Python workers run this interpreter with
the package importable; everything binds to 127.0.0.1; Arrow batches are kept small so a failure
injected mid-partition leaves a written prefix (and small stream buffers, so the rows before the
failure reach the sink before the task fails).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import woodpecker_idem

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
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
