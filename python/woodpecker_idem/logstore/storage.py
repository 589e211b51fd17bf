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
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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

# Block objects read at once by one storage when a handle loads or reads several (fencing or
# completing an open segment, a reader catching up): a GET mostly waits on the store, and an open
# segment of 1,000 single writes is 1,000 block objects, which took 6-12 s to fence one at a time
# on moto (issue 32). Also how far reading runs ahead of the block being used (memory bound).
READ_THREADS = 16


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

    def __init__(
        self, store: ObjectStore, cache_bytes: int = 32 << 20, read_threads: int = READ_THREADS
    ):
        self.store = store
        # block cache: key -> [data, header, records (split on first read)]
        self._cache: OrderedDict[tuple[int, int, int], list] = OrderedDict()
        self._cache_bytes = 0
        self.cache_limit = cache_bytes
        self._cache_lock = threading.Lock()
        self.read_threads = read_threads  # 1: every block read on the caller's thread, in order
        self._pool: ThreadPoolExecutor | None = None  # made on the first read of several blocks
        self._pool_lock = threading.Lock()
        self._closed = False

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
                while self._cache_bytes > self.cache_limit and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= len(old[0])
        if records and hit[2] is None:
            hit[2] = block_records(hit[0], hit[1], where)
        return hit[1], hit[2]

    def blocks(
        self,
        log_id: int,
        segment_id: int,
        ns: list[int],
        where: Callable[[int], str],
        records: bool = True,
    ) -> Iterator[tuple[Any, list | None]]:
        """`block` of each of `ns`, in that order. The ones not cached are read up to
        `read_threads` at a time, ahead of the one yielded; an error reading block n is raised
        when block n's turn comes, after the blocks before it were yielded, exactly as reading
        them one by one would (the reads started past it are dropped)."""
        pool = self.executor() if len(ns) > 1 else None
        if pool is None:
            for n in ns:
                yield self.block(log_id, segment_id, n, where(n), records)
            return

        def read(n: int) -> tuple[Any, list | None]:
            return self.block(log_id, segment_id, n, where(n), records)

        ahead: deque[Future | int] = deque()  # a read under way, or a cached block's number
        todo = iter(ns)
        try:
            while True:
                while len(ahead) < self.read_threads:
                    m = next(todo, None)
                    if m is None:
                        break
                    with self._cache_lock:
                        cached = (log_id, segment_id, m) in self._cache
                    # a cached block costs no request: taken in turn, on this thread
                    ahead.append(m if cached else pool.submit(read, m))
                if not ahead:
                    return
                got = ahead.popleft()
                yield got.result() if isinstance(got, Future) else read(got)
        finally:
            for f in ahead:
                if isinstance(f, Future):
                    f.cancel()

    def executor(self) -> ThreadPoolExecutor | None:
        """The pool reading blocks at once; None when reads go one by one (1 thread, closed)."""
        if self.read_threads <= 1:
            return None
        with self._pool_lock:
            if self._closed:
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="wp-blocks")
            return self._pool

    def close(self) -> None:
        """Stop the block readers (a later read of several blocks reads them one by one)."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

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
        headers = self._storage.blocks(
            self._log_id, self._segment_id, blocks, self._where, records=False
        )
        for n, (header, _) in zip(blocks, headers, strict=True):
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
        blocks = self._storage.blocks(
            self._log_id, self._segment_id, [n for n, _, _, _ in spans], self._where
        )
        for (n, first, lo, hi), (_, records) in zip(spans, blocks, strict=True):
            assert records is not None  # asked for
            for eid in range(lo, hi + 1):
                out.append(record_entry(records[eid - first], f"{self._where(n)} entry {eid}"))
        return out

    def record(self, loc: int, first: int, entry_id: int) -> bytes:
        _, records = self._storage.block(self._log_id, self._segment_id, loc, self._where(loc))
        return bytes(records[entry_id - first])
