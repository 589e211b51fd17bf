"""`write_partition` for `foreachPartition` / `mapInArrow` code, and the `idempotency_key` UDF."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from .._core import arrow_explicit_keys
from .options import SinkOptions, ensure_log_group
from .sink import WoodpeckerCommitMessage, write_batches


def _as_batches(items: Iterable[Any], chunk_rows: int) -> Iterator[Any]:
    """Arrow batches as they are; Spark Rows (or dicts) gathered into Arrow batches."""
    chunk: list[dict] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
        elif isinstance(item, pa.Table):
            yield from item.to_batches()
        else:
            chunk.append(item.asDict(recursive=True) if hasattr(item, "asDict") else dict(item))
            if len(chunk) >= chunk_rows:
                yield pa.RecordBatch.from_pylist(chunk)
                chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk)


def write_partition(
    rows_or_batches: Iterable[Any],
    *,
    log: str,
    partitions: int,
    key: str | None = None,
    payload_column: str | None = None,
    data_dir: str | None = None,
    config: str | Mapping[str, Any] | None = None,
    window_max_keys: int | None = None,
    window_duration_s: float | None = None,
    chunk_rows: int = 4096,
    txn_app_id: str | None = None,
    txn_version: int | None = None,
) -> WoodpeckerCommitMessage:
    """Write one partition of rows prepared by `prepare(df, key, partitions)` (Spark Rows, dicts
    or Arrow batches) with the sink's guarantees; for `df.foreachPartition(lambda rows:
    write_partition(rows, log=..., ...))`. `config`: a config file, or a mapping of dotted config
    keys (`{"meta.type": "etcd", ...}`). `txn_app_id` / `txn_version`: the batch's identity, as
    the sink's txnAppId / txnVersion options. Returns what it did (rows, written, duplicates)."""
    raw: dict[str, Any] = {
        "log": log,
        "partitions": str(partitions),
        "idempotencyKey": key,
        "payloadColumn": payload_column,
        "dataDir": data_dir,
        "config": None if isinstance(config, Mapping) else config,
        "windowMaxKeys": None if window_max_keys is None else str(window_max_keys),
        "windowDurationS": None if window_duration_s is None else str(window_duration_s),
        "txnAppId": txn_app_id,
        "txnVersion": None if txn_version is None else str(txn_version),
    }
    if isinstance(config, Mapping):
        raw.update(config)
    opts = SinkOptions.parse(raw, need_partitions=True)
    client = opts.connect()
    try:
        ensure_log_group(client, opts.log, opts.partitions or 1)
    finally:
        client.close()
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # plain Python: no task
        ctx = None
    msg = WoodpeckerCommitMessage(
        partition=ctx.partitionId() if ctx else -1, attempt=ctx.attemptNumber() if ctx else 0
    )
    write_batches(opts, _as_batches(rows_or_batches, chunk_rows), msg)
    return msg


def _keys_array(column: pa.Array) -> pa.Array:
    keys = arrow_explicit_keys(column)
    fixed = pa.Array.from_buffers(pa.binary(16), len(keys) // 16, [None, pa.py_buffer(keys)])
    return fixed.cast(pa.binary())


def idempotency_key(col: Any) -> Any:
    """A Spark column: the 16-byte idempotency key of a key column (string, binary or integer),
    computed in Rust on Arrow batches; the same key the sink writes with `idempotencyKey`."""
    from pyspark.sql.functions import arrow_udf
    from pyspark.sql.types import BinaryType

    return arrow_udf(_keys_array, BinaryType())(col)  # type: ignore[call-overload]
