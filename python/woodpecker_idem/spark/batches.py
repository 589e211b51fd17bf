"""Batch identities: exactly-once for a whole Spark batch, however long after it was cut short.

A write that names itself — a batch job's `txnAppId` / `txnVersion` options (as Delta Lake's), or
a streaming micro-batch (its query id and batch id, which Spark keeps in the checkpoint) — is
recorded per log of the group in the metadata store (`TxnMeta`) before its first row is written
there: the version, and the position in the log where the batch's entries start. The task that
writes a route then:

- finds no record, or an older version: records the new version (and where it starts) and
  writes its rows;
- finds the same version committed (its rows were all written): writes nothing;
- finds the same version not committed (an earlier attempt was cut short: a task failure, a
  killed driver, a crash mid micro-batch): reads the log back from the recorded start and writes
  only the rows whose keys are not there, however much time has passed;
- finds a newer version: writes nothing (an old version re-run, as Delta skips it).

Once Spark counts the task as succeeded, the driver (its commit, or its abort for the tasks that
did finish) marks the record committed. Every change of a record is conditioned on the epoch of
the writer that wrote the batch, so an attempt that another one took the log over from cannot
mark anything. One record per (log, application) is kept: a new version
replaces the previous one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import EntryTruncatedError, InvalidArgumentError
from ..meta.base import TxnMeta
from ..types import LogMessageId

if TYPE_CHECKING:
    from .._core import Payloads
    from ..client.client import WoodpeckerClient
    from ..client.log import LogHandle

log = logging.getLogger(__name__)

# Local properties Spark sets on the jobs of a streaming query (StreamExecution.QUERY_ID_KEY,
# MicroBatchExecution.BATCH_ID_KEY); tasks read them from their TaskContext.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
STREAM_APP_PREFIX = "stream:"
JOB_APP_PREFIX = "job:"  # a batch job's own identity when it names none (for its task retries)


@dataclass(frozen=True)
class BatchId:
    """Who writes (an application or a streaming query) and which of its batches."""

    app_id: str
    version: int

    def __str__(self) -> str:
        return f"{self.app_id} version {self.version}"


def stream_batch_id(query_id: str | None, batch_id: str | None) -> BatchId | None:
    """The micro-batch a streaming task writes, from its local properties (None outside one)."""
    if not query_id or batch_id is None:
        return None
    return BatchId(STREAM_APP_PREFIX + query_id, int(batch_id))


def task_batch_id(configured: BatchId | None) -> BatchId | None:
    """The identity of this task's write: the one the write was given (txnAppId / txnVersion,
    or a batch job's own), else the streaming micro-batch the task belongs to. (A batch write
    inside `foreachBatch` runs with the micro-batch's properties too: it keeps its own.)"""
    if configured is not None:
        return configured
    try:
        from pyspark import TaskContext
    except ImportError:  # plain Python: no Spark task
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    return stream_batch_id(
        ctx.getLocalProperty(QUERY_ID_PROPERTY), ctx.getLocalProperty(BATCH_ID_PROPERTY)
    )


class RouteBatch:
    """One identified batch in one log, as one task attempt writes it."""

    NEW, REPLAY, DONE = "new", "replay", "done"

    def __init__(self, mode: str, txn: TxnMeta | None, written: set[bytes]):
        self.mode = mode
        self.txn = txn  # None when DONE (nothing to mark)
        self.written = written  # REPLAY: keys an earlier attempt of the batch wrote
        self.skipped = 0  # rows not written: the batch is committed (DONE) or newer exists
        self.replayed = 0  # rows not written: an earlier attempt of the batch wrote them

    def filter(self, payloads: Payloads, keys: bytes) -> tuple[Payloads, bytes]:
        """The rows still to write."""
        if self.mode == self.DONE:
            self.skipped += len(payloads)
            return payloads[:0], b""
        if self.mode == self.NEW or not self.written:
            return payloads, keys
        seen = self.written
        keep = [i for i in range(len(payloads)) if keys[16 * i : 16 * i + 16] not in seen]
        if len(keep) == len(payloads):
            return payloads, keys
        self.replayed += len(payloads) - len(keep)
        return payloads.take(keep), b"".join(keys[16 * i : 16 * i + 16] for i in keep)


def begin_done(handle: LogHandle, batch: BatchId, have: TxnMeta, writer: str) -> RouteBatch:
    """`batch` is committed in this log (`have` is its record, or a newer version's)."""
    _check_writer(handle, batch, have, writer)
    if have.version > batch.version:
        log.warning(
            "log %s: %s is older than its recorded version %d: not written again",
            handle.name,
            batch,
            have.version,
        )
    else:
        log.info("log %s: %s was committed already: nothing written", handle.name, batch)
    return RouteBatch(RouteBatch.DONE, None, set())


def begin(
    client: WoodpeckerClient,
    handle: LogHandle,
    epoch: int,
    batch: BatchId,
    writer: str,
    start: LogMessageId,
) -> RouteBatch:
    """Decide what this attempt writes of `batch` in the log of `handle` (see the module doc).
    `start`: the log's end as the attempt's writer (holding `epoch`) found it; `writer` names the
    Spark partition, so a route met in two partitions of one batch is refused, not half-skipped."""
    meta = client.meta
    have = meta.get_txn(handle.log_id, batch.app_id)
    if have is not None and have.version > batch.version:
        return begin_done(handle, batch, have, writer)
    if have is not None and have.version == batch.version:
        if have.committed:
            return begin_done(handle, batch, have, writer)
        _check_writer(handle, batch, have, writer)
        written = _keys_since(handle, have.start)
        log.info(
            "log %s: %s was cut short after %d entries (from %s): writing the rest",
            handle.name,
            batch,
            len(written),
            have.start,
        )
        return RouteBatch(RouteBatch.REPLAY, have, written)
    txn = TxnMeta(
        log_id=handle.log_id,
        app_id=batch.app_id,
        version=batch.version,
        start=start,
        writer=writer,
        updated_ms=client.clock.now_ms(),
        revision=0 if have is None else have.revision,
    )
    return RouteBatch(RouteBatch.NEW, meta.put_txn(epoch, txn), set())


def _check_writer(handle: LogHandle, batch: BatchId, have: TxnMeta, writer: str) -> None:
    if have.version == batch.version and have.writer != writer:
        raise InvalidArgumentError(
            f"log {handle.name}: {batch} is written by {writer} but was begun by {have.writer}: "
            "one route must be written by one Spark partition of a batch; write what "
            "woodpecker_idem.spark.prepare(df, key, partitions) returns"
        )


def _keys_since(handle: LogHandle, start: LogMessageId) -> set[bytes]:
    try:
        reader = handle.open_reader(start)
    except EntryTruncatedError as exc:
        raise EntryTruncatedError(
            f"log {handle.name}: the entries an earlier attempt of this batch wrote from {start} "
            f"on were truncated, so which of its rows are in the log is unknown: {exc}"
        ) from exc
    try:
        return {m.idempotency_key for m in reader if m.idempotency_key is not None}
    finally:
        reader.close()


def batch_records(client: WoodpeckerClient, group: str) -> list[tuple[str, TxnMeta]]:
    """Every batch record kept for the logs of a log group: (log name, record)."""
    meta = client.meta
    found = meta.get_log_group(group)
    if found is None:
        return []
    out: list[tuple[str, TxnMeta]] = []
    for p in range(found.partitions):
        name = f"{group}-{p}"
        out.extend((name, t) for t in meta.list_txns(client.open_log(name).log_id))
    return out


def forget_batches(client: WoodpeckerClient, group: str, app_id: str) -> int:
    """Drop the records of one application (a `txnAppId`, or `stream:<query id>`) from every log
    of a group; returns how many there were. A re-run of one of its versions is then a new write
    (the key window still dedups it within its duration)."""
    records = [(name, t) for name, t in batch_records(client, group) if t.app_id == app_id]
    for _, t in records:
        client.meta.delete_txn(t.log_id, app_id)
    return len(records)
