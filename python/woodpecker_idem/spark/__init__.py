"""Spark integration (needs the `spark` extra: pyspark >= 4 and pyarrow; docs/spark.md).

from woodpecker_idem.spark import prepare       # format("woodpecker") needs no register:
                                                # Spark finds the pyspark_woodpecker module
(prepare(df, "order_id", 4).write.format("woodpecker").option("log", "orders")
    .option("idempotencyKey", "order_id").option("partitions", 4)
    .option("dataDir", "/shared/woodpecker-data").mode("append").save())
spark.read.format("woodpecker").option("log", "orders").option("dataDir", ...).load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .batches import batch_records, forget_batches
from .routing import ROUTE_COLUMN, prepare


def __getattr__(name: str):  # the sink and UDF import pyspark: only when asked for
    if name in ("write_partition", "idempotency_key"):
        from . import functions

        return getattr(functions, name)
    raise AttributeError(name)


if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the `woodpecker` data source on this session."""
    from .sink import WoodpeckerDataSource

    spark.dataSource.register(WoodpeckerDataSource)


__all__ = [
    "ROUTE_COLUMN",
    "batch_records",
    "forget_batches",
    "idempotency_key",
    "prepare",
    "register",
    "write_partition",
]
