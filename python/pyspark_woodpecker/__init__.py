"""`format("woodpecker")` with no registration call: Spark 4 registers the `DefaultSource` of
every top-level `pyspark_*` module it finds on the Python path (on the driver, and the executors
import the same class), so installing woodpecker_idem (with its `spark` extra) is enough.
`woodpecker_idem.spark.register(spark)` does the same for one session explicitly.
"""

from woodpecker_idem.spark.sink import WoodpeckerDataSource as DefaultSource

__all__ = ["DefaultSource"]
