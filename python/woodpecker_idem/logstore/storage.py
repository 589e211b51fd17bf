"""Where a LogStore node keeps its segments: one interface, two layouts.

The engine (`engine.py`) holds the node rules (fencing, LAC, byte comparison of resent entries,
recovery copies, completion) once; a `SegmentStorage` only lays batches out and finds them again:

- `objects` (`ObjectSegmentStorage`, this module): one create-if-absent block object per batch on
  an `ObjectStore` (S3, or any store without local files);
- `files` (`FileSegmentStorage`, `segment_files.py`): on a local directory, a segment is an
  append-only file, one `fdatasync` per add (`storage.fsync: always`) or one per file every N ms
  in the background (`batch_ms:N`).

A batch's location (`loc`) is an int only its storage interprets (a block number, a file offset).
Every `SegmentHandle` method but `read` is called with the engine's per-segment lock held: the
adds of one segment are serial, so a fence in the same process sees every acknowledged batch.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field

from ..errors import CorruptEntryError, SegmentFencedError
from ..objectstore.base import ObjectStore
from .blocks import (
    KIND_DATA,
    KIND_FENCE,
    KIND_RECOVERY,
    block_records,
    decode_block_header,
    decode_footer,
    encode_block,
    encode_footer,
    record_entry,
)

log = logging.getLogger(__name__)


@dataclass
class Scan:
    """What a load found that the engine has not been told yet."""

    batches: list[tuple[int, int, int]] = field(default_factory=list)  # (first, last, loc)
    lac: int = -1
    fenced: bool = False
    completed_last: int | None = None


# (loc, first entry id of the batch, first wanted, last wanted): entries read from one batch
Span = tuple[int, int, int, int]


class SegmentHandle(ABC):
    """One segment's storage, as seen by one node in one process."""

    where: str  # "node:log/segment", for error messages

    @abstractmethod
    def load(self) -> Scan:
        """Batches, LAC, fence and completion that appeared since the last load (any process)."""

    @abstractmethod
    def append(self, first: int, count: int, lac: int, frame: bytes, recovery: bool) -> int:
        """Store one batch (count 0: a LAC-only update) durably; returns its loc. Raises
        `SegmentFencedError` when the segment is fenced (never for recovery copies)."""

    @abstractmethod
    def fence(self) -> Scan:
        """Fence the segment: no data batch appended from now on belongs to it. Returns the scan
        of everything that does (as `load`)."""

    @abstractmethod
    def complete(self, last_entry_id: int, batches: list[tuple[int, int, int]]) -> int | None:
        """Write the footer (create-if-absent); returns None, or the lastEntryId of a footer
        another process wrote first. `batches` are (first, last, loc) up to `last_entry_id`."""

    @abstractmethod
    def read(self, spans: list[Span]) -> list[bytes]:
        """Entry bytes of the spans, in order, each checked against its CRC."""

    @abstractmethod
    def record(self, loc: int, first: int, entry_id: int) -> bytes:
        """The stored record (header and entry bytes) of `entry_id`, for byte comparison."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release open files."""


class SegmentStorage(ABC):
    """Opens segment handles; deletes segments and logs."""

    @abstractmethod
    def open(self, log_id: int, segment_id: int, node_id: str) -> SegmentHandle: ...

    @abstractmethod
    def delete_segment(self, log_id: int, segment_id: int) -> None: ...

    @abstractmethod
    def delete_log(self, log_id: int) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Make every acknowledged add durable now (a deferred sync) and stop background work."""


def segment_prefix(log_id: int, segment_id: int) -> str:
    return f"{log_id}/{segment_id}/"


class ObjectSegmentStorage(SegmentStorage):
    """Blocks on an ObjectStore: `{log}/{segment}/{n}.blk` and `footer`.

    Every block put is create-if-absent, and fencing creates the first free block key as a marker,
    so a writer in another process that still holds the segment collides with the marker on its
    next put and stops (docs/architecture.md). A block that landed before the marker is part of the
    segment; nothing after it is, except recovery copies written while completing the segment.
    """

    def __init__(self, store: ObjectStore, cache_bytes: int = 32 << 20):
        self.store = store
        # block cache: key -> [data, header, records (split on first read)]
        self._cache: OrderedDict[tuple[int, int, int], list] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()

    def open(self, log_id: int, segment_id: int, node_id: str) -> SegmentHandle:
        return _BlockHandle(self, log_id, segment_id, node_id)

    def block(self, log_id: int, segment_id: int, n: int, where: str, records: bool = True):
        """(header, records) of block n, cached; records are split only when asked for."""
        key = (log_id, segment_id, n)
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            data = self.store.get(f"{log_id}/{segment_id}/{n}.blk")
            if data is None:
                raise CorruptEntryError(f"{where}: block listed but missing")
            hit = [data, decode_block_header(data, where), None]
            with self._cache_lock:
                self._cache[key] = hit
                self._cache_bytes += len(data)
                while self._cache_bytes > self._cache_limit and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= len(old[0])
        if records and hit[2] is None:
            hit[2] = block_records(hit[0], hit[1], where)
        return hit[1], hit[2]

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        self.store.delete_prefix(segment_prefix(log_id, segment_id))
        with self._cache_lock:
            for key in [k for k in self._cache if k[:2] == (log_id, segment_id)]:
                self._cache_bytes -= len(self._cache.pop(key)[0])

    def delete_log(self, log_id: int) -> None:
        self.store.delete_prefix(f"{log_id}/")


class _BlockHandle(SegmentHandle):
    def __init__(self, storage: ObjectSegmentStorage, log_id: int, segment_id: int, node: str):
        self._storage = storage
        self._store = storage.store
        self._log_id = log_id
        self._segment_id = segment_id
        self._prefix = segment_prefix(log_id, segment_id)
        self.where = f"{node}:{log_id}/{segment_id}"
        self._scanned = 0  # blocks 0..scanned-1 were reported
        self._next_block = 0
        self._fenced = False
        self._completed = False

    def _where(self, n: int) -> str:
        return f"{self.where}/{n}.blk"

    def load(self) -> Scan:
        """Blocks are immutable and numbered without gaps, so only blocks not seen yet are read."""
        scan = Scan()
        blocks: list[int] = []
        footer = None
        for key in self._store.list(self._prefix):
            name = key[len(self._prefix) :]
            if name == "footer":
                footer = key
            elif name.endswith(".blk") and name[:-4].isdigit():
                n = int(name[:-4])
                if n >= self._scanned:
                    blocks.append(n)
        blocks.sort()
        for n in blocks:
            header, _ = self._storage.block(
                self._log_id, self._segment_id, n, self._where(n), records=False
            )
            if header.kind == KIND_FENCE:
                self._fenced = True
            elif header.kind == KIND_RECOVERY or not self._fenced:
                if header.count:
                    scan.batches.append((header.first_entry_id, header.last_entry_id, n))
                scan.lac = max(scan.lac, header.lac)  # count 0: a LAC-only update
            elif header.count:
                log.warning("%s: ignoring data block %d written after the fence", self.where, n)
            self._scanned = n + 1
        self._next_block = max(self._next_block, self._scanned)
        scan.fenced = self._fenced
        if footer is not None and not self._completed:
            data = self._store.get(footer)
            if data is not None:
                scan.completed_last = decode_footer(data, f"{self.where}/footer").last_entry_id
                self._completed = True
        return scan

    def append(self, first: int, count: int, lac: int, frame: bytes, recovery: bool) -> int:
        kind = KIND_RECOVERY if recovery else KIND_DATA
        data = encode_block(kind, first, count, lac, frame)
        n = self._next_block
        key = f"{self._prefix}{n}.blk"
        if not self._store.put(key, data, if_none_match=True):
            existing = self._store.get(key)
            if existing != data:
                # Someone else took block n: a fence marker or another writer's block.
                raise SegmentFencedError(
                    f"{self.where}: block {n} was taken (fenced); add of {first} refused"
                )
        self._next_block = n + 1
        if self._scanned == n:
            self._scanned = n + 1
        return n

    def fence(self) -> Scan:
        scan = self.load()
        if scan.completed_last is not None or self._completed or self._fenced:
            return scan
        marker = encode_block(KIND_FENCE, 0, 0, -1, b"")
        while not self._store.put(
            f"{self._prefix}{self._next_block}.blk", marker, if_none_match=True
        ):
            more = self.load()  # a block landed just before: keep it
            scan.batches += more.batches
            scan.lac = max(scan.lac, more.lac)
            scan.completed_last = more.completed_last or scan.completed_last
            if self._fenced:
                break
        else:
            self._next_block += 1
        self._fenced = scan.fenced = True
        return scan

    def complete(self, last_entry_id: int, batches: list[tuple[int, int, int]]) -> int | None:
        blocks = sorted((b, f, min(e, last_entry_id)) for f, e, b in batches)
        key = f"{self._prefix}footer"
        if self._store.put(key, encode_footer(last_entry_id, blocks), if_none_match=True):
            self._completed = True
            return None
        data = self._store.get(key)
        if data is None:
            raise CorruptEntryError(f"{self.where}: footer exists but cannot be read")
        self._completed = True
        return decode_footer(data, f"{self.where}/footer").last_entry_id

    def read(self, spans: list[Span]) -> list[bytes]:
        out: list[bytes] = []
        for n, first, lo, hi in spans:
            _, records = self._storage.block(self._log_id, self._segment_id, n, self._where(n))
            for eid in range(lo, hi + 1):
                out.append(record_entry(records[eid - first], f"{self._where(n)} entry {eid}"))
        return out

    def record(self, loc: int, first: int, entry_id: int) -> bytes:
        _, records = self._storage.block(self._log_id, self._segment_id, loc, self._where(loc))
        return bytes(records[entry_id - first])
