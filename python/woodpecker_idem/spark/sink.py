"""The `woodpecker` Python Data Source: exactly-once batch writes and reads of a log group.

    prepare(df, "order_id", 4).write.format("woodpecker").option("log", "orders")
        .option("idempotencyKey", "order_id").option("partitions", 4).option("dataDir", path)
        .mode("append").save()

The driver creates the log group `{log}` of P logs `{log}-{p}` (P stored in metadata; another P is
refused). Each task attempt opens, after the fork, the idempotent writer of every route it meets
(taking the log over: an earlier attempt of the task is fenced), recovers its window and writes
its rows; rows an earlier attempt or job committed come back as duplicates. Rows without a route
or with a wrong one are refused before anything of their batch is written.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)

from .._core import arrow_first_misrouted, arrow_rows, route_keys
from ..errors import (
    EarlyEvictionError,
    InvalidArgumentError,
    LogNotFoundError,
    RowsNotPreparedError,
)
from .options import SinkOptions, ensure_log_group, log_name
from .routing import ROUTE_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from ..writer.api import IdempotentLogWriter, LogWriter

log = logging.getLogger(__name__)

READ_SCHEMA = "payload binary, key binary, segment bigint, entry bigint, timestamp timestamp"
READ_BATCH_ROWS = 8192


@dataclass
class WoodpeckerCommitMessage(WriterCommitMessage):
    """What one task attempt did (sent to the driver's commit)."""

    partition: int
    attempt: int
    rows: int = 0
    written: int = 0
    duplicates: int = 0
    routes: list[int] = field(default_factory=list)


class TaskWriters:
    """The writers of one task attempt, one per route it meets, opened after the fork."""

    def __init__(self, opts: SinkOptions):
        self._opts = opts
        self._client = opts.connect()
        self._writers: dict[int, IdempotentLogWriter] = {}
        self._plain: dict[int, LogWriter] = {}
        self._evictions: dict[int, int] = {}

    def writer(self, route: int) -> IdempotentLogWriter:
        w = self._writers.get(route)
        if w is None:
            handle = self._client.open_log(log_name(self._opts.log, route))
            w = handle.open_writer(idempotent=True, **self._opts.writer_options())
            self._writers[route] = w
            self._evictions[route] = w.window.early_evictions
        return w

    def write(self, route: int, payloads: list[bytes], keys: bytes) -> int:
        """Write one route's rows; returns the duplicates suppressed."""
        if self._opts.idempotent:
            res = self.writer(route).write_keyed(payloads, keys)
            self.check_evictions(route)
            return res.duplicate.count(1)
        w = self._plain.get(route)
        if w is None:
            w = self._plain[route] = self._client.open_log(
                log_name(self._opts.log, route)
            ).open_writer()
        w.write_many(payloads)  # the same batch lane as write_keyed, without the window
        return 0

    def check_evictions(self, route: int) -> None:
        w = self._writers[route]
        early = w.window.early_evictions - self._evictions[route]
        if early:
            raise EarlyEvictionError(
                f"{early} keys of log {log_name(self._opts.log, route)} left the window by "
                f"capacity (window_max_keys={w.window.max_keys}) before its duration while this "
                "task wrote: retries of them would be new writes. Raise the windowMaxKeys option "
                "above the rows one route receives within windowDurationS"
            )

    @property
    def routes(self) -> list[int]:
        return sorted({*self._writers, *self._plain})

    def close(self) -> None:
        try:
            for w in self._writers.values():
                w.close()
            for plain in self._plain.values():
                plain.close()
        finally:
            self._client.close()


def _split_by_route(
    payloads: list[bytes], keys: bytes, routes: memoryview
) -> dict[int, tuple[list[bytes], bytes]]:
    n = len(payloads)
    first = routes[0]
    if routes.tobytes() == first.to_bytes(4, "little", signed=True) * n:
        return {first: (payloads, keys)}  # the usual batch after prepare(): one route
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(routes):
        groups.setdefault(r, []).append(i)
    return {
        r: ([payloads[i] for i in rows], b"".join(keys[16 * i : 16 * i + 16] for i in rows))
        for r, rows in groups.items()
    }


class _WriteThread:
    """One task's writes on a thread of their own: while a batch waits for its acks (an fsync
    away), Spark hands the next one over and it is keyed and checked. Batches are written in
    the order given; the first failure is raised in the task's thread (by `put` or `close`) as
    it is, and the batches after it are dropped, not written."""

    DEPTH = 2  # batches handed over and not yet written: enough to cover one batch's acks

    def __init__(self, task: TaskWriters, msg: WoodpeckerCommitMessage):
        self._task = task
        self._msg = msg
        self._queue: queue.Queue[tuple[int, list[bytes], bytes, int] | None] = queue.Queue(
            self.DEPTH
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wp-sink-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue  # failed: drop the rest (the task fails with the error)
            route, payloads, keys, batch_rows = item
            try:
                dups = self._task.write(route, payloads, keys)
            except BaseException as exc:  # raised in the task's thread
                self._error = exc
                continue
            self._msg.duplicates += dups
            self._msg.written += len(payloads) - dups
            self._msg.rows += batch_rows  # a batch's rows count once all its routes are written

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, route: int, payloads: list[bytes], keys: bytes, batch_rows: int = 0) -> None:
        """Queue one route's rows of a batch (`batch_rows`: the batch's rows, on its last part)."""
        self._raise()
        self._queue.put((route, payloads, keys, batch_rows))

    def close(self) -> None:
        """Wait until every batch handed over is written (or dropped after a failure)."""
        self._queue.put(None)
        self._thread.join()
        self._raise()


def write_batches(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], msg: WoodpeckerCommitMessage
) -> None:
    """Write prepared Arrow batches through the writers of their routes, counting into `msg`."""
    partitions = opts.partitions or 1
    task = TaskWriters(opts)
    handed = 0  # rows handed to the write thread (msg.rows counts those written)
    try:
        writes = _WriteThread(task, msg)
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if ROUTE_COLUMN not in batch.schema.names:
                    raise RowsNotPreparedError(
                        f"rows have no {ROUTE_COLUMN} column: call woodpecker_idem.spark.prepare("
                        f"df, key, {partitions}) before writing, with the same key and partitions "
                        "as the sink"
                    )
                payloads, keys = arrow_rows(
                    batch, key=opts.key, payload=opts.payload, exclude=[ROUTE_COLUMN]
                )
                bad = arrow_first_misrouted(keys, partitions, batch.column(ROUTE_COLUMN))
                if bad is not None:
                    row, found, want = bad
                    raise RowsNotPreparedError(
                        f"row {handed + row} of this task has route {found}, but its key routes "
                        f"to {want} of {partitions}: call woodpecker_idem.spark.prepare(df, key, "
                        f"{partitions}) with the same key (and payloadColumn) as the sink"
                    )
                routes = memoryview(route_keys(keys, partitions)).cast("i")
                parts = list(_split_by_route(payloads, keys, routes).items())
                for i, (route, (part, part_keys)) in enumerate(parts, 1):
                    writes.put(route, part, part_keys, batch.num_rows if i == len(parts) else 0)
                handed += batch.num_rows
        finally:
            writes.close()  # what was handed over is written before the task ends or fails
        msg.routes = task.routes
    finally:
        task.close()


class WoodpeckerArrowWriter(DataSourceArrowWriter):
    """Batch writer: one task attempt per Spark partition, Arrow batches in."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WoodpeckerCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        msg = WoodpeckerCommitMessage(
            partition=ctx.partitionId() if ctx else -1, attempt=ctx.attemptNumber() if ctx else 0
        )
        write_batches(self.opts, iterator, msg)
        return msg

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        report_commit(self.opts, messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, WoodpeckerCommitMessage)]
        log.warning(
            "woodpecker write to %s aborted: %d tasks had finished (%d rows written); what was "
            "acknowledged stays, and re-running the job completes the log without duplicates",
            self.opts.log,
            len(done),
            sum(m.written for m in done),
        )


def report_commit(
    opts: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int | None
) -> dict[str, Any]:
    """Sum the tasks' messages: rows in, written, duplicates suppressed, attempts seen."""
    done = [m for m in messages if isinstance(m, WoodpeckerCommitMessage)]
    report: dict[str, Any] = {
        "log": opts.log,
        "time_ms": int(time.time() * 1000),
        "tasks": len(done),
        "rows": sum(m.rows for m in done),
        "written": sum(m.written for m in done),
        "duplicates": sum(m.duplicates for m in done),
        "attempts": sum(m.attempt + 1 for m in done),
        "retried_tasks": sum(1 for m in done if m.attempt > 0),
        "tasks_detail": [asdict(m) for m in done],
    }
    if batch_id is not None:
        report["batch_id"] = batch_id
    log.info(
        "woodpecker commit %s: %d rows, %d written, %d duplicates suppressed, %d attempts of %d "
        "tasks",
        opts.log,
        report["rows"],
        report["written"],
        report["duplicates"],
        report["attempts"],
        report["tasks"],
    )
    if opts.report_file:
        with open(opts.report_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(report, sort_keys=True) + "\n")
    return report


class WoodpeckerStreamWriter(DataSourceStreamArrowWriter):
    """Structured Streaming sink. A micro-batch replayed after a stop or crash (from the query's
    checkpoint) is written again by fresh task attempts: the rows it had committed come back as
    duplicates, so the log keeps every key once."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WoodpeckerCommitMessage:
        return WoodpeckerArrowWriter(self.opts).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        report_commit(self.opts, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning(
            "woodpecker micro-batch %d to %s aborted; restarting the query replays it and the "
            "log keeps every key once",
            batchId,
            self.opts.log,
        )


class WoodpeckerReader(DataSourceReader):
    """One Spark partition per log of the group: payload, key, segment, entry, timestamp."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        client = self.opts.connect()
        try:
            group = client.meta.get_log_group(self.opts.log)
        finally:
            client.close()
        if group is None:
            raise LogNotFoundError(f"no log group {self.opts.log!r}: nothing was written to it")
        return [InputPartition(p) for p in range(group.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        schema = pa.schema(
            [
                ("payload", pa.binary()),
                ("key", pa.binary()),
                ("segment", pa.int64()),
                ("entry", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
            ]
        )
        client = self.opts.connect()
        try:
            reader = client.open_log(log_name(self.opts.log, partition.value)).open_reader()
            try:
                cols: list[list] = [[], [], [], [], []]
                for m in reader:
                    cols[0].append(m.payload)
                    cols[1].append(m.idempotency_key)
                    cols[2].append(m.message_id.segment_id)
                    cols[3].append(m.message_id.entry_id)
                    cols[4].append(m.timestamp_ms * 1000)
                    if len(cols[0]) >= READ_BATCH_ROWS:
                        yield pa.RecordBatch.from_arrays(cols, schema=schema)
                        cols = [[], [], [], [], []]
                if cols[0]:
                    yield pa.RecordBatch.from_arrays(cols, schema=schema)
            finally:
                reader.close()
        finally:
            client.close()


class WoodpeckerDataSource(DataSource):
    """`format("woodpecker")`: see the module docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "woodpecker"

    def schema(self) -> str:
        return READ_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> WoodpeckerArrowWriter:
        if overwrite:
            raise InvalidArgumentError(
                'mode("overwrite") is not supported: a log is append-only; use mode("append")'
            )
        opts = SinkOptions.parse(self.options, need_partitions=True)
        for col in (opts.key, opts.payload):
            if col is not None and col not in schema.names:
                raise InvalidArgumentError(f"no column {col!r} in the DataFrame ({schema.names})")
        if ROUTE_COLUMN not in schema.names:
            raise RowsNotPreparedError(
                f"the DataFrame has no {ROUTE_COLUMN} column: call woodpecker_idem.spark.prepare("
                f"df, key, {opts.partitions}) before writing"
            )
        client = opts.connect()
        try:
            ensure_log_group(client, opts.log, opts.partitions or 1)
        finally:
            client.close()
        return WoodpeckerArrowWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> WoodpeckerStreamWriter:  # noqa: N802
        return WoodpeckerStreamWriter(self.writer(schema, overwrite).opts)

    def reader(self, schema: StructType) -> WoodpeckerReader:
        return WoodpeckerReader(SinkOptions.parse(self.options, need_partitions=False))
