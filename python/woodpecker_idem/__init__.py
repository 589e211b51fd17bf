"""woodpecker_idem: a Woodpecker-style write-ahead log with idempotent writes.

The package's namespace is the client API. The Rust primitives (the dedup window, the snapshot
codec, frames, CRC32C) are importable from `woodpecker_idem._core`, where they live; the history
checker and the fault-injecting transport from `woodpecker_idem.testing`.

import woodpecker_idem as wp
client = wp.connect()                       # embedded: ./woodpecker-data, no servers
log = client.open_log("orders", create=True)
writer = log.open_writer(idempotent=True)
writer.write(b"payload", idempotency_id="order-42")   # retries return the original id
"""

import logging as _logging

from ._core import Payloads, content_key, content_keys, explicit_key, explicit_keys
from ._core import __version__ as __version__  # Cargo.toml's version: written in one place
from .client import LogHandle, LogReader, WoodpeckerClient
from .clock import Clock, ManualClock, SystemClock
from .config import Config, load_config
from .connect import connect  # the composition root (module of the same name)
from .errors import (
    ClientClosedError,
    ConditionFailedError,
    ConfigError,
    CorruptEntryError,
    EarlyEvictionError,
    EarlyEvictionWarning,
    EntryConflictError,
    EntryTruncatedError,
    HandoffError,
    InvalidArgumentError,
    InvalidTypeError,
    LogExistsError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    MetadataConflictError,
    MetadataLostError,
    NodeUnavailableError,
    ObjectStoreOwnedError,
    PayloadTooLargeError,
    QuorumUnavailableError,
    ReaderFencedError,
    RouteNotOwnedError,
    RowsNotPreparedError,
    SegmentClosedError,
    SegmentDamagedError,
    SegmentFencedError,
    SegmentIncompleteError,
    SnapshotCorruptError,
    StorageAccessError,
    StorageReadOnlyError,
    StorageUnavailableError,
    TruncationPendingError,
    WoodpeckerError,
    WriterClosedError,
    WriterFencedError,
    WriterForkedError,
    WriteTimeoutError,
)
from .processor import Processor, ProcessorStats
from .types import (
    LogMessage,
    LogMessageId,
    ReaderInfo,
    SegmentState,
    WriteManyResult,
    WriteMessage,
    WriteResult,
)
from .writer import IdempotentLogWriter, LogWriter

# A library adds no handler of its own: without one, Python's last-resort handler would print
# every warning (a fenced writer, a snapshot retry) on the stderr of an application that set up
# no logging. Applications that configure logging see every record as before.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "ClientClosedError",
    "Clock",
    "Config",
    "ConfigError",
    "CorruptEntryError",
    "EarlyEvictionError",
    "EntryConflictError",
    "ConditionFailedError",
    "EntryTruncatedError",
    "TruncationPendingError",
    "EarlyEvictionWarning",
    "HandoffError",
    "IdempotentLogWriter",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LogExistsError",
    "LogGroupSizeMismatchError",
    "LogHandle",
    "LogMessage",
    "LogMessageId",
    "LogNotFoundError",
    "LogReader",
    "LogWriter",
    "ManualClock",
    "MetadataConflictError",
    "MetadataLostError",
    "NodeUnavailableError",
    "Payloads",
    "ObjectStoreOwnedError",
    "PayloadTooLargeError",
    "Processor",
    "ProcessorStats",
    "QuorumUnavailableError",
    "ReaderInfo",
    "ReaderFencedError",
    "RouteNotOwnedError",
    "RowsNotPreparedError",
    "SegmentClosedError",
    "SegmentDamagedError",
    "SegmentFencedError",
    "SegmentIncompleteError",
    "SegmentState",
    "SnapshotCorruptError",
    "StorageAccessError",
    "StorageReadOnlyError",
    "StorageUnavailableError",
    "SystemClock",
    "WoodpeckerClient",
    "WoodpeckerError",
    "WriteManyResult",
    "WriteMessage",
    "WriteResult",
    "WriteTimeoutError",
    "WriterClosedError",
    "WriterFencedError",
    "WriterForkedError",
    "connect",
    "content_key",
    "content_keys",
    "explicit_key",
    "explicit_keys",
    "load_config",
]
