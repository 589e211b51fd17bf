"""`prepare(df, key, partitions)`: give every row its route and repartition by it.

The route of a row is `route(key, P)` (`_core.route_keys`: the first 8 key bytes as a big-endian
u64, modulo P) of the row's idempotency key, so a key always meets the same log `{name}-{route}`
of the group, whatever the upstream plan did. With a key column (or a payload column) Spark
computes it natively (`md5` + `conv`), no Python per row; rows keyed by their canonical JSON go
through Arrow batches (`mapInArrow`) and Rust. Never an RDD `partitionBy` (it pickles every row).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._core import arrow_rows, route_keys
from ..errors import InvalidArgumentError, InvalidTypeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

# The domain tag `explicit_key` hashes before an id (rust/src/keys.rs; tests pin the equality).
EXPLICIT_DOMAIN = b"woodpecker-idem/explicit-id/v1\x00"

# The column prepare() adds; the sink reads it, checks it and leaves it out of the payload.
ROUTE_COLUMN = "_woodpecker_route"
# The column's metadata key holding the P prepare() routed the rows among: the sink compares it
# with its own `partitions` when the write is planned, before any task writes a row.
PARTITIONS_METADATA = "woodpecker.partitions"

MAX_PARTITIONS = 4096


def check_partitions(partitions: object) -> int:
    if isinstance(partitions, str) and partitions.strip().isdigit():
        partitions = int(partitions)
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidTypeError(f"partitions must be an int, not {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions must be 1..{MAX_PARTITIONS}, not {partitions}")
    return partitions


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & 0xFFFFFFFF
    k1 = ((k1 << 15) | (k1 >> 17)) & 0xFFFFFFFF
    return (k1 * 0x1B873593) & 0xFFFFFFFF


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column (Murmur3 x86_32, seed 42): what `repartition(n, col)`
    takes modulo n to pick the partition of a row."""
    h1 = seed ^ _mix_k1(value & 0xFFFFFFFF)
    h1 = ((h1 << 13) | (h1 >> 19)) & 0xFFFFFFFF
    h1 = (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_slots(partitions: int) -> list[int]:
    """For each route r, the smallest int v >= 0 that Spark's hash partitioning into
    `partitions` puts in partition r: repartitioning by slot[route] gives route r partition r,
    one route per task (hashing the routes themselves would pile several into one task)."""
    slots: list[int | None] = [None] * partitions
    left = partitions
    v = 0
    while left:
        r = spark_int_hash(v) % partitions  # Python's % is Spark's pmod for a positive divisor
        if slots[r] is None:
            slots[r] = v
            left -= 1
        v += 1
    return [s for s in slots if s is not None]


def _route_of_md5_hex(hex_digest: Column, partitions: int) -> Column:
    from pyspark.sql import functions as F

    head = F.conv(F.substring(hex_digest, 1, 16), 16, 10).cast("decimal(20,0)")
    return (head % F.lit(partitions)).cast("int")


def route_column(df: DataFrame, key: str | None, partitions: int, payload: str | None = None):
    """The route as a Spark column expression (None when it needs Rust: canonical-JSON rows)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if key is not None:
        if key not in df.columns:
            raise InvalidArgumentError(f"no column {key!r} in the DataFrame ({df.columns})")
        dt = df.schema[key].dataType
        if isinstance(dt, T.StringType):
            raw = F.col(key).cast("binary")  # its UTF-8 bytes
        elif isinstance(dt, T.BinaryType):
            raw = F.col(key)
        elif isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            raw = F.col(key).cast("string").cast("binary")  # its decimal text
        else:
            raise InvalidTypeError(
                f"key column {key!r} is {dt.simpleString()}; a key column must be string, "
                "binary or integer"
            )
        digest = F.md5(F.concat(F.lit(bytearray(EXPLICIT_DOMAIN)), raw))
        return _refuse_null(key, "key", _route_of_md5_hex(digest, partitions))
    if payload is not None:
        if payload not in df.columns:
            raise InvalidArgumentError(f"no column {payload!r} in the DataFrame ({df.columns})")
        route = _route_of_md5_hex(F.md5(F.col(payload).cast("binary")), partitions)
        return _refuse_null(payload, "payload", route)
    return None


def _refuse_null(column: str, what: str, route: Column) -> Column:
    """The route, or the job fails on the first null: in prepare()'s stage, which runs before
    the sink's (it feeds a shuffle), so no task has written anything yet."""
    from pyspark.sql import functions as F

    message = (
        f"woodpecker: a row has a null {what} column {column!r}: every row needs one (its "
        "idempotency key); drop or fill those rows before prepare(). The job wrote nothing"
    )
    return F.when(F.col(column).isNull(), F.raise_error(F.lit(message))).otherwise(route)


def _json_routes(partitions: int, exclude: list[str]):
    """mapInArrow function: appends the route of each row's canonical-JSON content key."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            _, keys = arrow_rows(batch, exclude=exclude)
            routes = pa.Array.from_buffers(
                pa.int32(), batch.num_rows, [None, pa.py_buffer(route_keys(keys, partitions))]
            )
            yield batch.append_column(ROUTE_COLUMN, routes)

    return fn


def prepare(
    df: DataFrame, key: str | None, partitions: int, *, payload_column: str | None = None
) -> DataFrame:
    """Add the route column and repartition by it: every row of one route in one Spark partition.

    `key`: the idempotency key column (string, binary or integer), or None to key each row by its
    content: the `payload_column` as is, else the row's canonical JSON. Give the sink the same
    key / payloadColumn and partitions.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    partitions = check_partitions(partitions)
    if ROUTE_COLUMN in df.columns:
        df = df.drop(ROUTE_COLUMN)
    expr = route_column(df, key, partitions, payload_column)
    tagged = {PARTITIONS_METADATA: partitions}
    if expr is not None:
        routed = df.withColumn(ROUTE_COLUMN, expr.alias(ROUTE_COLUMN, metadata=tagged))
    else:
        route_field = T.StructField(ROUTE_COLUMN, T.IntegerType(), metadata=tagged)
        schema = T.StructType([*df.schema.fields, route_field])
        routed = df.mapInArrow(_json_routes(partitions, [ROUTE_COLUMN]), schema)
    slots = F.array(*[F.lit(v) for v in partition_slots(partitions)])
    return routed.repartition(partitions, F.element_at(slots, F.col(ROUTE_COLUMN) + 1))
