"""woodpecker_idem: a Woodpecker-style write-ahead log with idempotent writes.

import woodpecker_idem as wp
client = wp.connect()                       # embedded: ./woodpecker-data, no servers
log = client.open_log("orders", create=True)
writer = log.open_writer(idempotent=True)
writer.write(b"payload", idempotency_id="order-42")   # retries return the original id
"""

from ._core import (
    DedupWindow,
    Snapshot,
    WindowEntry,
    content_key,
    content_keys,
    content_keys_arrow,
    crc32c,
    decode_snapshot,
    encode_snapshot,
    explicit_key,
    explicit_keys,
)
from .client import LogHandle, LogReader, LogWriter, WoodpeckerClient, connect
from .clock import Clock, ManualClock, SystemClock
from .config import Config, load_config
from .errors import (
    ConfigError,
    CorruptEntryError,
    InvalidArgumentError,
    InvalidTypeError,
    LogNotFoundError,
    ObjectStoreOwnedError,
    PayloadTooLargeError,
    QuorumUnavailableError,
    SegmentClosedError,
    SnapshotCorruptError,
    StorageAccessError,
    StorageUnavailableError,
    WoodpeckerError,
    WriterFencedError,
    WriteTimeoutError,
)
from .idempotency import IdempotentLogWriter, WriteManyResult
from .types import LogMessage, LogMessageId, SegmentState, WriteMessage, WriteResult

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "Config",
    "ConfigError",
    "CorruptEntryError",
    "DedupWindow",
    "IdempotentLogWriter",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LogHandle",
    "LogMessage",
    "LogMessageId",
    "LogNotFoundError",
    "LogReader",
    "LogWriter",
    "ManualClock",
    "ObjectStoreOwnedError",
    "PayloadTooLargeError",
    "QuorumUnavailableError",
    "SegmentClosedError",
    "SegmentState",
    "Snapshot",
    "SnapshotCorruptError",
    "StorageAccessError",
    "StorageUnavailableError",
    "SystemClock",
    "WindowEntry",
    "WoodpeckerClient",
    "WoodpeckerError",
    "WriteManyResult",
    "WriteMessage",
    "WriteResult",
    "WriteTimeoutError",
    "WriterFencedError",
    "connect",
    "content_key",
    "content_keys",
    "content_keys_arrow",
    "crc32c",
    "decode_snapshot",
    "encode_snapshot",
    "explicit_key",
    "explicit_keys",
    "load_config",
]
