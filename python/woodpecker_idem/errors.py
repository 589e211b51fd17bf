"""One error hierarchy for the whole package.

Every error is a `WoodpeckerError` with a stable `code`, so callers can branch on the code across
versions. Argument errors also subclass `ValueError` or `TypeError`, so generic code that already
catches those keeps working. The Rust core raises these same classes (it imports this module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import WriteManyResult


class WoodpeckerError(Exception):
    """Base class of every error raised by woodpecker_idem."""

    code: str = "WOODPECKER_ERROR"
    retriable: bool = False
    # Set on the error a batch call raises (write_many / write_keyed / write_arrow): the call's
    # columnar result and one byte per row, 1 where the row was acknowledged (its ids in the
    # result are final), 0 where it failed or was still pending.
    batch_result: WriteManyResult | None = None
    acknowledged: bytearray | None = None


# --- bad input -------------------------------------------------------------------------------


class InvalidArgumentError(WoodpeckerError, ValueError):
    """An argument has the right type but a bad value (the message names the argument)."""

    code = "INVALID_ARGUMENT"


class InvalidTypeError(WoodpeckerError, TypeError):
    """An argument has the wrong type (the message names the argument)."""

    code = "INVALID_TYPE"


class PayloadTooLargeError(InvalidArgumentError):
    """A payload is larger than the configured maximum entry size."""

    code = "PAYLOAD_TOO_LARGE"


class ConfigError(WoodpeckerError, ValueError):
    """A configuration value is invalid; the message names the key and the allowed range."""

    code = "INVALID_CONFIG"


class ClientClosedError(WoodpeckerError):
    """The client was closed: no call through it, its logs, readers or writers can succeed.

    Not retriable: open a new client with `connect()`.
    """

    code = "CLIENT_CLOSED"


# --- logs and metadata -----------------------------------------------------------------------


class LogNotFoundError(WoodpeckerError, LookupError):
    """The named log does not exist."""

    code = "LOG_NOT_FOUND"


class LogExistsError(WoodpeckerError):
    """A log with that name already exists."""

    code = "LOG_EXISTS"


class MetadataConflictError(WoodpeckerError):
    """A compare-and-swap on metadata lost: the record changed since it was read."""

    code = "METADATA_CONFLICT"
    retriable = True


# --- writing -----------------------------------------------------------------------------------


class WriterFencedError(WoodpeckerError):
    """A newer writer took over the log; this writer can no longer write (it never re-takes it)."""

    code = "WRITER_FENCED"


class MetadataLostError(WriterFencedError):
    """The metadata store no longer holds what this client wrote to it: its identity is gone (etcd
    restarted with an empty data directory) or a new log's id already has objects (the store was
    restored from an older copy). A writer that finds this is fenced; nothing is created over the
    old objects. Not retriable: restore the metadata store, or start a new deployment (another
    objectstore.root and metadata store)."""

    code = "METADATA_LOST"


class ReaderFencedError(WoodpeckerError):
    """A named reader was taken over (the same name opened again, here or in another process) or
    deleted: it can no longer commit its position. Not retriable: the reader that took over
    goes on from the last committed position; close this one."""

    code = "READER_FENCED"


class WriterClosedError(WoodpeckerError):
    """The writer was closed."""

    code = "WRITER_CLOSED"


class WriteTimeoutError(WoodpeckerError, TimeoutError):
    """The entry did not reach the ack quorum in time; it is still pending and being retried.

    An idempotent retry of the same key joins the pending entry and gets the same id.
    """

    code = "WRITE_TIMEOUT"
    retriable = True


class ConditionFailedError(WoodpeckerError):
    """A conditional append (`expected_last=`) found the log ending elsewhere: nothing of the
    write (or of a batch's rows from the one refused on) was written. `expected_last` is what
    the call expected, `actual_last` the log's last entry when the write's turn came (None:
    the log holds none). Not retriable as it is: read the log from `expected_last` on, then
    decide (KIP-27's conditional publish)."""

    code = "CONDITION_FAILED"

    def __init__(self, message: str = "", expected_last: object = None, actual_last: object = None):
        super().__init__(message)
        self.expected_last = expected_last  # LogMessageId | None (object: types imports errors)
        self.actual_last = actual_last


class RouteNotOwnedError(WoodpeckerError):
    """A group writer was given a key whose route another member of the group owns (or that is
    being handed over). `route` is the key's route, `owner` the route's writer when known.
    Retriable: ownership moves with the group's membership; send the key to the owner, or retry
    once the group has rebalanced."""

    code = "ROUTE_NOT_OWNED"
    retriable = True

    def __init__(self, message: str = "", route: int = -1, owner: str | None = None):
        super().__init__(message)
        self.route = route
        self.owner = owner


class SegmentClosedError(WoodpeckerError):
    """The entry's segment was completed without it: it was not written, a retry writes it anew."""

    code = "SEGMENT_CLOSED"
    retriable = True


class SegmentFencedError(WoodpeckerError):
    """A LogStore refused an add because the segment is fenced or completed."""

    code = "SEGMENT_FENCED"


class SegmentIncompleteError(SegmentFencedError):
    """A LogStore node asked to upload a segment (staged storage) lacks entries up to its end
    (completed while its last batch was on the way): upload it through another node."""

    code = "SEGMENT_INCOMPLETE"


class EntryConflictError(WoodpeckerError):
    """A LogStore holds different bytes at that (segment, entry): never overwritten."""

    code = "ENTRY_CONFLICT"


class NodeUnavailableError(WoodpeckerError):
    """A LogStore node did not answer (down, unreachable, or the reply was lost)."""

    code = "NODE_UNAVAILABLE"
    retriable = True


class QuorumUnavailableError(WoodpeckerError):
    """Too few LogStore nodes answered to reach the quorum the operation needs."""

    code = "QUORUM_UNAVAILABLE"
    retriable = True


# --- storage and reading -----------------------------------------------------------------------


class StorageUnavailableError(WoodpeckerError):
    """Object storage or the metadata store could not be reached after retries with backoff."""

    code = "STORAGE_UNAVAILABLE"
    retriable = True


class StorageAccessError(WoodpeckerError):
    """Object storage answered but refuses us: missing credentials, access denied, no such bucket.

    Not retriable: the message names the bucket and the endpoint and says what to change.
    """

    code = "STORAGE_ACCESS"


class ObjectStoreOwnedError(WoodpeckerError):
    """`objectstore.root` belongs to another metadata store (its owner marker names another id),
    or this metadata store keeps its objects at another bucket and root.

    Two metadata stores on one bucket and root would each number their logs from 1; the owner
    marker refuses the second one, which must use another root or the owning metadata store.
    One metadata store on two roots would complete a log's segments as empty in the root that
    lacks them; the store records its root once, and a client naming another is refused.
    """

    code = "OBJECT_STORE_OWNED"


class StorageReadOnlyError(StorageUnavailableError):
    """The storage is read-only (a read-only data directory): reads work, writes cannot."""

    code = "STORAGE_READ_ONLY"
    retriable = False


class CorruptEntryError(WoodpeckerError):
    """Stored bytes failed their checksum or could not be parsed; the message names the position."""

    code = "CORRUPT_ENTRY"


class SegmentDamagedError(CorruptEntryError):
    """A local segment file is damaged where it cannot be walked past (a bad batch header, or a
    final batch that fails its checksum but is no torn write): entries from that offset on,
    possibly acknowledged, cannot be read. Not retriable: the message names the file and offset
    and how to repair it (restore the file, or truncate it there and accept the loss)."""

    code = "SEGMENT_DAMAGED"


class SnapshotCorruptError(WoodpeckerError):
    """A dedup snapshot could not be decoded (truncated, flipped, unknown version, bad layout)."""

    code = "SNAPSHOT_CORRUPT"


class EntryTruncatedError(WoodpeckerError):
    """The requested position lies before the log's truncation point: retention or a truncate
    dropped it. `first_kept` is the first entry still kept (the truncation point) when known;
    `LogReader.seek_to_earliest()` moves a reader there. Not retriable: the entries are gone."""

    code = "ENTRY_TRUNCATED"

    def __init__(self, message: str = "", first_kept: object = None):
        super().__init__(message)
        self.first_kept = first_kept  # a LogMessageId (object here: types imports errors)


class TruncationPendingError(WoodpeckerError, TimeoutError):
    """`truncate` found a segment before the truncation point still open past
    `append.timeout_ms`: its writer has not completed it yet (a writer completes the segments it
    rolled past in the background), or died (opening a writer on the log recovers them). Nothing
    was truncated; `segments` names them. Retriable: call `truncate` again."""

    code = "TRUNCATION_PENDING"
    retriable = True

    def __init__(self, message: str = "", segments: tuple[int, ...] = ()):
        super().__init__(message)
        self.segments = segments


# --- Spark -------------------------------------------------------------------------------------


class RowsNotPreparedError(WoodpeckerError, ValueError):
    """A Spark partition holds rows routed to another log: call `woodpecker_idem.spark.prepare`."""

    code = "ROWS_NOT_PREPARED"


class LogGroupSizeMismatchError(WoodpeckerError, ValueError):
    """A log group exists with a different partition count than the one requested."""

    code = "LOG_GROUP_SIZE_MISMATCH"


class WriterForkedError(WoodpeckerError, RuntimeError):
    """A writer was used in a child process of the one that opened it: its threads did not survive
    the fork. Open a client and writer in the child (Spark executors do this per task)."""

    code = "WRITER_FORKED"


class EarlyEvictionError(WoodpeckerError):
    """Keys left the window by capacity before `window_duration_s` while a Spark task wrote: a
    retry of them would be a new write. Raise `windowMaxKeys` (window_max_keys) for the data."""

    code = "EARLY_EVICTION"


class EarlyEvictionWarning(UserWarning):
    """An idempotent writer's window evicted keys by capacity (`window_max_keys`) before
    `window_duration_s`: a retry of one of them would be written again. Issued once per writer,
    the first time (Python shows it by default); every early eviction is counted in
    `metrics_snapshot()["early_evictions"]`. Size the window for the key rate:
    window_max_keys >= keys per second x window_duration_s."""


class HandoffError(WoodpeckerError):
    """A streaming task handed its rows to the Python worker on its host that holds the log's
    writer, and that worker went away or stopped answering mid-batch: the task cannot tell which
    of its rows were written, so it fails. Spark's retry of it takes the log over and writes what
    the batch still misses (its batch identity reads the log back)."""

    code = "HANDOFF_FAILED"


def by_code(code: str) -> type[WoodpeckerError]:
    """The error class whose stable `code` is `code` (errors crossing a process boundary keep
    their class); an unknown code (a newer node) is `WoodpeckerError`."""
    pending: list[type[WoodpeckerError]] = [WoodpeckerError]
    while pending:
        cls = pending.pop()
        if cls.__dict__.get("code") == code:
            return cls
        pending.extend(cls.__subclasses__())
    return WoodpeckerError
