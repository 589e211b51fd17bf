"""The keys of a truncated segment, kept while they can still be in a dedup window.

Truncation deletes a segment's entries, but not the promise made about them: a retry of a key still
in the window returns the original (now truncated) id, as Kafka keeps producer state after the log
start offset passes it (docs/semantics.md, "Truncation and the window"). A live writer keeps such
keys in memory; a recovering writer needs them too, so before `LogHandle.truncate` deletes a
segment that may hold keys of a window it stores them here, without payloads: object
`dedup_snapshot/{log_id}/truncated_{segment_id:020}`, a frame of records (blocks.py layout) each
holding a `LogEntry` with its position, timestamp and key. Archives are deleted by later
truncations once their segment is older than the window, and with the log.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core import concat
from .._proto.logstore_pb2 import LogEntry
from ..ensemble.replicas import ReplicaFault, read_entries
from ..logstore.blocks import decode_entry, encode_record, record_entry, split_frame
from ..logstore.transport import LogStoreTransport
from ..meta.base import SegmentMeta
from ..objectstore.base import ObjectStore

READ_CHUNK = 2000


def archive_prefix(log_id: int) -> str:
    return f"dedup_snapshot/{log_id}/truncated_"


def archive_key(log_id: int, segment_id: int) -> str:
    return f"{archive_prefix(log_id)}{segment_id:020d}"


def archive_keys(
    transport: LogStoreTransport,
    objects: ObjectStore,
    seg: SegmentMeta,
    on_corrupt: Callable[[ReplicaFault], None] | None = None,
) -> int:
    """Store the keyed entries of completed `seg` (keys only); returns how many it holds.

    A plain writer's segment stores nothing, and only its first entry is read: a writer keys
    all its entries or none, and each segment has one writer.
    """
    if seg.last_entry_id < 0 or not read_entries(transport, seg, 0, 1)[0].idempotency_key:
        return 0
    records = []
    entry_id = 0
    while entry_id <= seg.last_entry_id:
        want = min(READ_CHUNK, seg.last_entry_id - entry_id + 1)
        for e in read_entries(transport, seg, entry_id, want, on_corrupt):
            if e.idempotency_key:
                kept = LogEntry(
                    segment_id=e.segment_id,
                    entry_id=e.entry_id,
                    timestamp_ms=e.timestamp_ms,
                    idempotency_key=e.idempotency_key,
                )
                records.append(encode_record(kept.SerializeToString()))
            entry_id += 1
    if records:
        objects.put(archive_key(seg.log_id, seg.segment_id), concat(records))
    return len(records)


def load_archive(objects: ObjectStore, seg: SegmentMeta) -> list[LogEntry]:
    """The archived keyed entries of truncated `seg`, in entry order ([] if none were kept).

    Raises `CorruptEntryError` naming the archive when its bytes fail their checksums.
    """
    key = archive_key(seg.log_id, seg.segment_id)
    data = objects.get(key)
    if data is None:
        return []
    return [decode_entry(record_entry(r, key), key) for r in split_frame(data, key)]
