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

import dataclasses
import gc
import json
import logging
import os
import queue
import sys
import threading
import time
import uuid
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

from .._core import Payloads, arrow_first_misrouted, arrow_rows, route_keys
from ..errors import (
    InvalidArgumentError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    MetadataConflictError,
    RowsNotPreparedError,
    WoodpeckerError,
    WriterFencedError,
)
from ..meta.base import TxnMeta
from . import holder
from . import kept as kept_writers
from .batches import (
    JOB_APP_PREFIX,
    STREAM_APP_PREFIX,
    BatchId,
    begin_done,
    task_batch_id,
)
from .options import (
    ALL_OPTIONS,
    BATCH_READ_OPTIONS,
    STREAM_READ_OPTIONS,
    SinkOptions,
    check_names,
    ensure_log_group,
    int_option,
    log_name,
)
from .remote import RemoteRoute
from .route_write import RouteWrite
from .routing import PARTITIONS_METADATA, ROUTE_COLUMN
from .source import (
    failing_stream_reader,
    group_size,
    parse_positions,
    plan_ranges,
    read_range,
    resolve,
    stream_reader_class,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from ..client.log import LogHandle
    from ..writer.api import LogWriter

log = logging.getLogger(__name__)

READ_SCHEMA = (
    "payload binary, key binary, segment bigint, entry bigint, timestamp timestamp, log int"
)


@dataclass
class WoodpeckerCommitMessage(WriterCommitMessage):
    """What one task attempt did (sent to the driver's commit). `duplicates` counts every row not
    written because the log has it: found in the key window, or of an identified batch that was
    committed already (`skipped`) or that an earlier attempt had written (`replayed`)."""

    partition: int
    attempt: int
    rows: int = 0
    written: int = 0
    duplicates: int = 0
    routes: list[int] = field(default_factory=list)
    skipped: int = 0
    replayed: int = 0
    early_evictions: int = 0  # keys the window let go by capacity before its duration
    # (writer epoch, record) of each identified batch this attempt wrote in full in a log: the
    # driver marks them committed once Spark counts the task as succeeded (a task's input can
    # end early when the task fails upstream of the sink, so the task cannot tell by itself)
    txns: list[tuple[int, TxnMeta]] = field(default_factory=list)
    # routes whose rows this task handed to the Python worker of its host keeping their writer
    handed_off: list[int] = field(default_factory=list)


class TaskWriters:
    """The writers of one task attempt, one per route it meets, opened after the fork."""

    def __init__(self, opts: SinkOptions, partition: int = -1, batch: BatchId | None = None):
        self._opts = opts
        self._client = opts.connect()
        self._routes: dict[int, RouteWrite | RemoteRoute] = {}
        self._plain: dict[int, LogWriter] = {}
        self._writer_name = f"Spark partition {partition}"
        self._batch = batch if opts.idempotent else None
        # a streaming query's writers stay open between its micro-batches
        self._keep = batch is not None and batch.app_id.startswith(STREAM_APP_PREFIX)

    def _route(self, route: int) -> RouteWrite | RemoteRoute:
        r = self._routes.get(route)
        if r is not None:
            return r
        name = log_name(self._opts.log, route)
        handle = self._client.open_log(name)
        if self._batch is not None:
            have = self._client.meta.get_txn(handle.log_id, self._batch.app_id)
            if have is not None and have.committed and have.version >= self._batch.version:
                # finished before: no take-over, no segment (begin() re-checks after one)
                done = begin_done(handle, self._batch, have, self._writer_name)
                r = self._routes[route] = RouteWrite(name, batch=done)
                return r
        r = self._routes[route] = self._open(route, handle)
        if self._batch is not None and isinstance(r, RouteWrite):
            r.begin(self._client, handle, self._batch, self._writer_name)
        return r

    def _open(self, route: int, handle: LogHandle) -> RouteWrite | RemoteRoute:
        """The route's writer: the one this worker kept from the query's previous micro-batch,
        else the one another worker of this host keeps (which writes the rows, and has begun
        the batch), else a new one here (a take-over)."""
        if not self._keep:
            return RouteWrite(
                handle.name, handle.open_writer(idempotent=True, **self._opts.writer_options())
            )
        assert self._batch is not None
        key = kept_writers.kept_key(self._opts, route)
        kept = kept_writers.take(key)
        if kept is not None:  # no take-over, no new segment
            return RouteWrite(handle.name, kept.writer, kept.client, kept.tail)
        remote = RemoteRoute.open(
            self._opts,
            self._client.store_id(),
            handle,
            key,
            self._batch,
            self._writer_name,
        )
        if remote is not None:
            return remote
        client = self._opts.connect()  # a client of its own, kept open with the writer
        try:
            own = client.open_log(handle.name)
            writer = own.open_writer(idempotent=True, **self._opts.writer_options())
        except BaseException:
            client.close()
            raise
        return RouteWrite(handle.name, writer, client)

    def write(self, route: int, payloads: Payloads, keys: bytes) -> int:
        """Write one route's rows; returns the rows not written because the log has them."""
        if not self._opts.idempotent:
            plain = self._plain.get(route)
            if plain is None:
                plain = self._plain[route] = self._client.open_log(
                    log_name(self._opts.log, route)
                ).open_writer()
            plain.write_many(payloads)  # the same batch lane as write_keyed, without the window
            return 0
        return self._route(route).write(payloads, keys)

    def finish(self, msg: WoodpeckerCommitMessage) -> None:
        """Every row handed over was written: tell the driver which batch records to mark."""
        for r in self._routes.values():
            report = r.report()
            msg.early_evictions += report.early_evictions
            if report.txn is not None:
                msg.txns.append(report.txn)
            msg.skipped += report.skipped
            msg.replayed += report.replayed
        msg.handed_off = sorted(k for k, r in self._routes.items() if isinstance(r, RemoteRoute))

    @property
    def routes(self) -> list[int]:
        return sorted({*self._routes, *self._plain})

    def close(self, ok: bool = False) -> None:
        """Close the writers; `ok` (the task wrote all it was given): a streaming task keeps
        them open in this worker, or in the worker that wrote them, for the query's next
        micro-batch (see kept.py)."""
        try:
            for route, r in self._routes.items():
                if isinstance(r, RemoteRoute):
                    r.close(keep=ok)
                    continue
                if r.writer is None:
                    continue
                if ok and self._keep and r.client is not None:
                    kept = kept_writers.Kept(r.client, r.writer, r.tail, os.getpid())
                    holder.keep(kept_writers.kept_key(self._opts, route), kept)
                    continue
                try:
                    r.writer.close()
                finally:
                    if r.client is not None:
                        r.client.close()
            for plain in self._plain.values():
                plain.close()
        finally:
            self._client.close()


def _split_by_route(
    payloads: Payloads, keys: bytes, routes: memoryview
) -> dict[int, tuple[Payloads, bytes]]:
    n = len(payloads)
    first = routes[0]
    if routes.tobytes() == first.to_bytes(4, "little", signed=True) * n:
        return {first: (payloads, keys)}  # the usual batch after prepare(): one route
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(routes):
        groups.setdefault(r, []).append(i)
    return {
        r: (payloads.take(rows), b"".join(keys[16 * i : 16 * i + 16] for i in rows))
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
        self._queue: queue.Queue[tuple[int, Payloads, bytes, int] | None] = queue.Queue(self.DEPTH)
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

    def put(self, route: int, payloads: Payloads, keys: bytes, batch_rows: int = 0) -> None:
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
    task = TaskWriters(opts, msg.partition, task_batch_id(opts.batch_id))
    ok = False
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
        task.finish(msg)
        msg.routes = task.routes
        ok = True
    finally:
        task.close(ok)


# Spark's Python worker collects its garbage after every task it runs (pyspark's worker daemon calls
# gc.collect()): a full collection, over every object the worker holds. Its imports (pyspark,
# pyarrow, pandas, this package: ~80,000 objects in a task's worker, ~50,000 in the one that
# plans a write) made that 40-240 ms of CPU per task on the development machine, where a task's
# own garbage costs 1-3 ms. The first time this package runs in such a worker, before it makes
# anything of its own, it moves what the worker holds into the collector's permanent generation
# (`gc.freeze`, as pre-fork servers do): later collections walk only what came after. No writer or
# client exists yet then, so nothing a task leaves in a reference cycle is kept.
_FROZEN_IN = 0  # the process that froze its objects (each forked worker freezes its own)


def freeze_worker_heap() -> None:
    """Once per Spark Python worker process (not in a driver or any other process): see above."""
    global _FROZEN_IN
    if os.getpid() == _FROZEN_IN:
        return
    _FROZEN_IN = os.getpid()
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is None or not main.name.startswith("pyspark."):  # python -m pyspark.daemon, ...
        return
    import pyarrow

    # the import pyspark's worker makes for every task's commit message (`pa.array` imports
    # pandas, if installed), made now so that it is frozen too
    pyarrow.array([b""])
    gc.collect()
    gc.freeze()


class WoodpeckerArrowWriter(DataSourceArrowWriter):
    """Batch writer: one task attempt per Spark partition, Arrow batches in."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WoodpeckerCommitMessage:
        from pyspark import TaskContext

        freeze_worker_heap()
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
        if self.opts.job_scoped:
            forget_job(self.opts)  # the job is over: no attempt of it comes again
        else:
            mark_committed(self.opts, done)  # the tasks that succeeded wrote their routes
        log.warning(
            "woodpecker write to %s aborted: %d tasks had finished (%d rows written); what was "
            "acknowledged stays, and re-running the job completes the log without duplicates",
            self.opts.log,
            len(done),
            sum(m.written for m in done),
        )


def forget_job(opts: SinkOptions) -> None:
    """Drop the records of a job's own identity (see `SinkOptions.job_scoped`) from every log of
    the group: they served its task retries, and the job is over."""
    assert opts.batch_id is not None
    client = opts.connect()
    try:
        for p in range(opts.partitions or 1):
            try:
                log_id = client.meta.get_log(log_name(opts.log, p)).log_id
            except LogNotFoundError:
                continue
            client.meta.delete_txn(log_id, opts.batch_id.app_id)
    finally:
        client.close()


def mark_committed(opts: SinkOptions, done: list[WoodpeckerCommitMessage]) -> int:
    """Mark the identified batches the succeeded tasks wrote as committed, each in its log, as
    the epoch of the writer that wrote it: a record another attempt has taken over since is
    left as it is (a replay then reads the log back, which is as exact, only slower)."""
    txns = [t for m in done for t in m.txns]
    if not txns:
        return 0
    client = opts.connect()
    marked = 0
    try:
        for epoch, txn in txns:
            try:
                client.meta.put_txn(
                    epoch,
                    dataclasses.replace(txn, committed=True, updated_ms=client.clock.now_ms()),
                )
                marked += 1
            except (WriterFencedError, MetadataConflictError) as exc:
                log.info("batch record %s of log id %d left open: %s", txn.app_id, txn.log_id, exc)
    finally:
        client.close()
    return marked


def report_commit(
    opts: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int | None
) -> dict[str, Any]:
    """Mark identified batches committed and sum the tasks' messages: rows in, written,
    duplicates suppressed, attempts seen."""
    done = [m for m in messages if isinstance(m, WoodpeckerCommitMessage)]
    committed_logs = 0
    if opts.job_scoped:
        forget_job(opts)
    else:
        committed_logs = mark_committed(opts, done)
    report: dict[str, Any] = {
        "log": opts.log,
        "time_ms": int(time.time() * 1000),
        "tasks": len(done),
        "rows": sum(m.rows for m in done),
        "written": sum(m.written for m in done),
        "duplicates": sum(m.duplicates for m in done),
        "attempts": sum(m.attempt + 1 for m in done),
        "retried_tasks": sum(1 for m in done if m.attempt > 0),
        "handed_off": sum(len(m.handed_off) for m in done),
        "skipped": sum(m.skipped for m in done),
        "replayed": sum(m.replayed for m in done),
        "early_evictions": sum(m.early_evictions for m in done),
        "tasks_detail": [{k: v for k, v in asdict(m).items() if k != "txns"} for m in done],
    }
    if batch_id is not None:
        report["batch_id"] = batch_id
    elif opts.batch_id is not None and not opts.job_scoped:
        report["txn_app_id"] = opts.batch_id.app_id
        report["txn_version"] = opts.batch_id.version
    if committed_logs:
        report["committed_logs"] = committed_logs
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
    if report["early_evictions"]:
        log.warning(
            "woodpecker commit %s: %d keys left their log's window by capacity (windowMaxKeys) "
            "before its duration: this job wrote each once, but another batch delivering one of "
            "them within windowDurationS will write it again; raise windowMaxKeys above the rows "
            "one log receives within windowDurationS",
            opts.log,
            report["early_evictions"],
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
        mark_committed(self.opts, [m for m in messages if isinstance(m, WoodpeckerCommitMessage)])
        log.warning(
            "woodpecker micro-batch %d to %s aborted; restarting the query replays it and the "
            "log keeps every key once",
            batchId,
            self.opts.log,
        )


class WoodpeckerReader(DataSourceReader):
    """One Spark partition per log of the group with entries between `startingOffsets`
    (default earliest) and `endingOffsets` (default latest, as the log is when the read is
    planned): payload, key, segment, entry, timestamp, log."""

    def __init__(self, opts: SinkOptions, options: Any):
        self.opts = opts
        self._starting = _option(options, "startingOffsets")
        self._ending = _option(options, "endingOffsets")

    def partitions(self) -> list[InputPartition]:
        client = self.opts.connect()
        try:
            n = group_size(client, self.opts.log)
            both = ("earliest", "latest")
            start = parse_positions("startingOffsets", self._starting, "earliest", n, both)
            end = parse_positions("endingOffsets", self._ending, "latest", n, ("latest",))
            ranges = plan_ranges(
                client,
                self.opts.log,
                resolve(client, self.opts.log, n, start),
                resolve(client, self.opts.log, n, end),
            )
        finally:
            client.close()
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition.value)


def _option(options: Any, name: str) -> str | None:
    by_lower = {str(k).lower(): v for k, v in options.items()}
    value = by_lower.get(name.lower())
    return None if value is None or value == "" else str(value)


def check_read_schema(schema: StructType) -> None:
    """The source's columns are fixed: a user schema that differs is refused when the read is
    planned (the payload is canonical JSON or bytes: parse it with from_json)."""
    want = [(f.name, f.dataType.simpleString()) for f in read_struct().fields]
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if got != want:
        raise InvalidArgumentError(
            f'format("woodpecker") reads the columns {READ_SCHEMA}, not '
            f"{', '.join(f'{n} {t}' for n, t in got)}: leave .schema() out and parse the payload "
            '(canonical JSON) with from_json(col("payload").cast("string"), your_schema)'
        )


def read_struct() -> StructType:
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("payload", BinaryType()),
            StructField("key", BinaryType()),
            StructField("segment", LongType()),
            StructField("entry", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("log", IntegerType()),
        ]
    )


class WoodpeckerDataSource(DataSource):
    """`format("woodpecker")`: see the module docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "woodpecker"

    def schema(self) -> str:
        # Spark asks for it when `load()` builds the DataFrame: the one point where a bad read
        # option fails with our message before a query starts (a stream reader's own error
        # reaches the user wrapped, when the query plans it). Which read it is, batch or
        # stream, is not known yet: names any read takes, values that are wrong for every read.
        if any(str(k).lower() == "provider" for k in self.options):
            # a catalog table's definition (CREATE TABLE t USING woodpecker OPTIONS (...)):
            # Spark 4 gives a Python data source's reader and writer none of a table's options,
            # so the table could never be read or written
            raise InvalidArgumentError(
                "CREATE TABLE ... USING woodpecker is not supported: Spark gives a Python data "
                "source's reader and writer none of a table's options, so the table could not be "
                'read or written. Read with spark.read.format("woodpecker").option("log", '
                '...) (a temporary view of it: .load().createOrReplaceTempView("t") serves '
                'SELECT), write with df.write.format("woodpecker")'
            )
        check_names(self.options, ALL_OPTIONS)
        int_option("maxEntriesPerTrigger", _option(self.options, "maxEntriesPerTrigger"), 1)
        return READ_SCHEMA

    def _write_options(self, schema: StructType, overwrite: bool) -> SinkOptions:
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
        routed_among = (schema[ROUTE_COLUMN].metadata or {}).get(PARTITIONS_METADATA)
        if routed_among is not None and routed_among != opts.partitions:
            raise LogGroupSizeMismatchError(
                f"the rows were routed among {routed_among} logs (prepare(df, key, "
                f'{routed_among})) but the sink writes {opts.partitions} (option "partitions", '
                f"{opts.partitions}): give both the same P. Nothing was written"
            )
        client = opts.connect()
        try:
            ensure_log_group(client, opts.log, opts.partitions or 1)
        finally:
            client.close()
        return opts

    def writer(self, schema: StructType, overwrite: bool) -> WoodpeckerArrowWriter:
        freeze_worker_heap()  # the Python worker planning the write
        opts = self._write_options(schema, overwrite)
        if opts.batch_id is None and opts.idempotent:
            # A job that names no batch still has one for its own task retries: they read the
            # log back from where the failed attempt began, whatever the window kept.
            job = BatchId(f"{JOB_APP_PREFIX}{uuid.uuid4().hex}", 0)
            opts = dataclasses.replace(opts, batch_id=job, job_scoped=True)
        return WoodpeckerArrowWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> WoodpeckerStreamWriter:  # noqa: N802
        freeze_worker_heap()
        opts = self._write_options(schema, overwrite)
        if opts.batch_id is not None:
            raise InvalidArgumentError(
                'options "txnAppId" and "txnVersion" are for batch writes: a streaming query\'s '
                "micro-batches are identified by the query's id and the batch id (kept in its "
                "checkpoint)"
            )
        return WoodpeckerStreamWriter(opts)

    def reader(self, schema: StructType) -> WoodpeckerReader:
        check_read_schema(schema)
        opts = SinkOptions.parse(self.options, False, BATCH_READ_OPTIONS)
        return WoodpeckerReader(opts, self.options)

    def streamReader(self, schema: StructType) -> Any:  # noqa: N802
        check_read_schema(schema)
        try:
            opts = SinkOptions.parse(self.options, False, STREAM_READ_OPTIONS)
            max_entries = int_option(
                "maxEntriesPerTrigger", _option(self.options, "maxEntriesPerTrigger"), 1
            )
            starting = _option(self.options, "startingOffsets")
            return stream_reader_class()(opts, starting, max_entries)
        except WoodpeckerError as exc:  # see failing_stream_reader
            return failing_stream_reader(exc)
