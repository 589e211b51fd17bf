"""Where a LogStore node keeps its segments: one interface, two layouts.

The engine (`engine.py`) holds the node rules (fencing, LAC, byte comparison of resent entries,
recovery copies, completion) once; a `SegmentStorage` only lays batches out and finds them again:

- `objects` (`ObjectSegmentStorage`, this module): one create-if-absent block object per batch on
  an `ObjectStore` (S3, or any store without local files), and packs: copies of small blocks that
  a takeover reads instead of one object per block (see PACK_BLOCKS);
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
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptEntryError, SegmentFencedError
from ..objectstore.base import ObjectStore
from .blocks import (
    KIND_DATA,
    KIND_FENCE,
    KIND_RECOVERY,
    BlockHeader,
    block_records,
    decode_block_header,
    decode_footer,
    decode_pack,
    encode_block,
    encode_footer,
    encode_pack,
    record_entry,
)

log = logging.getLogger(__name__)

# Block objects read at once by one storage when a handle loads or reads several (fencing or
# completing an open segment, a reader catching up): a GET mostly waits on the store, and an open
# segment of 1,000 single writes is 1,000 block objects, which took 6-12 s to fence one at a time
# on moto (issue 32). Also how far reading runs ahead of the block being used (memory bound).
READ_THREADS = 16

# Packs (issue 32): a takeover of an open segment of 1,000 single writes read 1,000 block objects
# (moto: ~6 ms of server CPU per GET, 6-15 s), and listing 10,000 block keys alone takes ~4 s.
# So the node that writes small blocks also puts copies of them as pack objects, from a thread of
# its own after the blocks were acknowledged (an ack never waits for a pack): one pack per
# PACK_BLOCKS blocks, and every PACK_BLOCKS packs of one size merged into one pack (16, 256,
# 4,096 blocks), the smaller ones deleted, so a segment of N small blocks is covered by about
# N/4,096 + 30 packs. A node fencing the segment reads the packs and only the blocks no pack
# holds, and finds the end by probing block numbers past them instead of listing every key. The
# blocks stay the record: nothing but a fence reads a pack, a block taken from a pack is served
# once (to the takeover's own reads, then dropped), and the packs are deleted once the segment is
# completed, so a damaged block is still seen by every reader and by `verify`.
PACK_BLOCKS = 16  # blocks per first-level pack, and packs merged into one of the next level
PACK_LEVELS = 3  # packs of 16, 256 and 4,096 blocks
PACK_BLOCK_MAX = 64 << 10  # larger blocks are few and cheap to read one by one: not packed
PACK_BYTES = 1 << 20  # a first-level pack is put once it holds this much, however few blocks
PACK_MERGE_BYTES = 16 << 20  # packs larger together than this are not merged
PACK_DIR = "p/"  # packs live under `{log}/{segment}/p/`, deleted with the segment
# A handle that has seen this many blocks finds new ones by reading the next block numbers (GETs
# until one is missing: numbers have no gaps) instead of listing every key of the segment again.
PROBE_AFTER_BLOCKS = 1000


@dataclass
class Scan:
    """What a load found that the engine has not been told yet."""

    batches: list[tuple[int, int, int]] = field(default_factory=list)  # (first, last, loc)
    lac: int = -1
    fenced: bool = False
    completed_last: int | None = None


# (loc, first entry id of the batch, first wanted, last wanted): entries read from one batch
Span = tuple[int, int, int, int]


@dataclass(frozen=True)
class SealedSegment:
    """A segment uploaded to object storage (staged storage's `SealSegment`): its block keys in
    entry order, its footer's key (written last: the commit point), its end, and the footer's
    index, (block number, first entry id, last entry id) per block."""

    block_keys: tuple[str, ...]
    footer_key: str
    last_entry_id: int
    blocks: tuple[tuple[int, int, int], ...] = ()


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

    def uncached(self) -> SegmentStorage:
        """A view of the same stored bytes that keeps nothing from one read to the next, for the
        history checker's raw read (what the storage holds now, not what a read cached). Local
        segment files keep nothing already: a handle reads the files."""
        return self

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
        self,
        store: ObjectStore,
        cache_bytes: int = 32 << 20,
        read_threads: int = READ_THREADS,
        pack_blocks: int = PACK_BLOCKS,
    ):
        self.store = store
        # blocks taken from packs by a fence: key -> data, each served once (see PACK_BLOCKS)
        self._packed: OrderedDict[tuple[int, int, int], bytes] = OrderedDict()
        self._packed_bytes = 0
        self.packer = Packer(store, pack_blocks)
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

    def uncached(self) -> ObjectSegmentStorage:
        """The blocks read from the store at each read (no block cache, no pack served, no
        thread: nothing to close)."""
        return ObjectSegmentStorage(self.store, cache_bytes=0, read_threads=1, pack_blocks=0)

    def block(
        self,
        log_id: int,
        segment_id: int,
        n: int,
        where: str,
        records: bool = True,
        missing_ok: bool = False,
    ):
        """(header, records) of block n, cached; records are split only when asked for. A block
        absent from the store raises `CorruptEntryError`, or gives None with `missing_ok`."""
        key = (log_id, segment_id, n)
        packed = None
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            else:
                packed = self._packed.pop(key, None)
                if packed is not None:
                    self._packed_bytes -= len(packed)
        if hit is None and packed is not None:
            # served once and not cached: a later read gets the block object itself
            header = decode_block_header(packed, where)
            return header, block_records(packed, header, where) if records else None
        if hit is None:
            data = self.store.get(f"{log_id}/{segment_id}/{n}.blk")
            if data is None:
                if missing_ok:
                    return None
                raise CorruptEntryError(f"{where}: block listed but missing")
            # [block bytes, header, records, bytes counted against cache_limit]
            hit = [data, decode_block_header(data, where), None, len(data)]
            with self._cache_lock:
                self._cache[key] = hit
                self._cache_bytes += len(data)
                self._evict_locked()
        if records and hit[2] is None:
            split = block_records(hit[0], hit[1], where)
            hit[2] = split
            if hit[1].codec:  # the records view a decompressed copy: it counts as well
                extra = sum(len(r) for r in split)
                with self._cache_lock:
                    if self._cache.get(key) is hit:
                        hit[3] += extra
                        self._cache_bytes += extra
                        self._evict_locked()
        return hit[1], hit[2]

    def _evict_locked(self) -> None:
        while self._cache_bytes > self.cache_limit and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old[3]

    def blocks(
        self,
        log_id: int,
        segment_id: int,
        ns: list[int] | range,
        where: Callable[[int], str],
        records: bool = True,
        missing_ok: bool = False,
    ) -> Generator[Any, None, None]:
        """`block` of each of `ns`, in that order. The ones not cached are read up to
        `read_threads` at a time, ahead of the one yielded; an error reading block n is raised
        when block n's turn comes, after the blocks before it were yielded, exactly as reading
        them one by one would (the reads started past it are dropped)."""
        pool = self.executor() if len(ns) > 1 else None
        if pool is None:
            for n in ns:
                yield self.block(log_id, segment_id, n, where(n), records, missing_ok)
            return

        def read(n: int) -> Any:
            return self.block(log_id, segment_id, n, where(n), records, missing_ok)

        ahead: deque[Future | int] = deque()  # a read under way, or a cached block's number
        todo = iter(ns)
        try:
            while True:
                while len(ahead) < self.read_threads:
                    m = next(todo, None)
                    if m is None:
                        break
                    with self._cache_lock:
                        key = (log_id, segment_id, m)
                        cached = key in self._cache or key in self._packed
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

    def keep_packed(self, log_id: int, segment_id: int, blocks: dict[int, bytes]) -> None:
        """Hold blocks a fence took from packs until read once (oldest dropped past the cache's
        size: such a block is then read from its own object)."""
        with self._cache_lock:
            for n, data in blocks.items():
                key = (log_id, segment_id, n)
                old = self._packed.pop(key, None)
                self._packed_bytes += len(data) - (len(old) if old is not None else 0)
                self._packed[key] = data
            while self._packed_bytes > self.cache_limit and self._packed:
                _, old = self._packed.popitem(last=False)
                self._packed_bytes -= len(old)

    def close(self) -> None:
        """Stop the block readers (a later read of several blocks reads them one by one) and the
        pack thread (packs not put yet are dropped: they are copies)."""
        self.packer.close()
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        self.packer.drop(segment_prefix(log_id, segment_id))
        self.store.delete_prefix(segment_prefix(log_id, segment_id))
        with self._cache_lock:
            for key in [k for k in self._cache if k[:2] == (log_id, segment_id)]:
                self._cache_bytes -= self._cache.pop(key)[3]
            for key in [k for k in self._packed if k[:2] == (log_id, segment_id)]:
                self._packed_bytes -= len(self._packed.pop(key))

    def delete_log(self, log_id: int) -> None:
        self.packer.drop(f"{log_id}/")
        self.store.delete_prefix(f"{log_id}/")


class Packer:
    """Puts packs of the small blocks a node wrote (see PACK_BLOCKS) from a thread of its own.

    `add` is called by an add with the segment's lock held and only appends to a list; the
    thread puts a segment's pending blocks as one pack once there are `pack_blocks` of them (or
    PACK_BYTES), merges packs, and deletes a completed segment's packs. A pack that fails to be
    put is dropped with a warning: the blocks are the record."""

    def __init__(self, store: ObjectStore, pack_blocks: int):
        self.store = store
        self.pack_blocks = pack_blocks  # 0: no packs
        self._lock = threading.Condition()
        self._pending: dict[str, tuple[bool, list[tuple[int, bytes]], int]] = {}
        self._deletes: list[str] = []
        # the thread's own: per segment, the packs not merged to the last level yet
        self._stacks: dict[str, list[tuple[int, list[tuple[int, bytes]], str]]] = {}
        self._busy = 0  # packs being put or deleted now
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, prefix: str, n: int, data: bytes) -> None:
        if self.pack_blocks <= 0 or len(data) > PACK_BLOCK_MAX:
            return
        with self._lock:
            if self._closed:
                return
            forced, blocks, size = self._pending.get(prefix, (False, [], 0))
            blocks.append((n, data))
            self._pending[prefix] = (forced, blocks, size + len(data))
            if len(blocks) >= self.pack_blocks or size + len(data) >= PACK_BYTES:
                self._start_locked()

    def _start_locked(self) -> None:
        self._lock.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="wp-packs", daemon=True)
            self._thread.start()

    def drop(self, prefix: str) -> None:
        """Forget the pending blocks of the segments under `prefix` (deleted)."""
        with self._lock:
            for key in [k for k in self._pending if k.startswith(prefix)]:
                del self._pending[key]

    def completed(self, prefix: str) -> None:
        """The segment is completed: its packs are no longer wanted; delete them (a node that
        never wrote packs deletes those of the writer it took the segment from)."""
        with self._lock:
            self._pending.pop(prefix, None)
            if self._closed:
                return
            self._deletes.append(prefix)
            self._start_locked()

    def wait_idle(self, timeout: float) -> bool:
        """Put every pending block in a pack now and finish the deletes asked for (tests and
        benches: a writer that goes quiet leaves fewer than `pack_blocks` blocks unpacked)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            for prefix, (_, blocks, size) in list(self._pending.items()):
                self._pending[prefix] = (True, blocks, size)
            self._start_locked()
            while self._pending or self._deletes or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Drop the packs not put yet (copies) but finish the deletes asked for, then stop."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _due(self) -> tuple[list[tuple[str, list[tuple[int, bytes]]]], list[str]]:
        puts: list[tuple[str, list[tuple[int, bytes]]]] = []
        fan = max(1, self.pack_blocks)
        for prefix, (forced, blocks, size) in list(self._pending.items()):
            # whole packs of `pack_blocks` (more may have come since the add that was due), so
            # merges line up; the rest too when forced, or when it is large already
            whole = len(blocks) - len(blocks) % fan
            take = len(blocks) if forced or (not whole and size >= PACK_BYTES) else whole
            if not take:
                continue
            puts.extend((prefix, blocks[i : i + fan]) for i in range(0, take, fan))
            rest = blocks[take:]
            if rest:
                self._pending[prefix] = (False, rest, sum(len(d) for _, d in rest))
            else:
                del self._pending[prefix]
        deletes, self._deletes = self._deletes, []
        return puts, deletes

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    puts, deletes = self._due()
                    if puts or deletes:
                        self._busy += 1
                        break
                    if self._closed:
                        return
                    self._lock.wait()
            try:
                for prefix, blocks in puts:
                    self._pack(prefix, blocks)
                for prefix in deletes:
                    self._stacks.pop(prefix, None)
                    self._delete_all(prefix)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._lock.notify_all()

    def _pack(self, prefix: str, blocks: list[tuple[int, bytes]]) -> None:
        """Put a first-level pack, then merge the last `pack_blocks` packs of one level into one
        of the next while there are (the memory of a last-level pack is let go)."""
        stack = self._stacks.setdefault(prefix, [])
        key = self._put(prefix, blocks)
        if key is None:
            stack.clear()  # not merged across a missing pack
            return
        stack.append((0, blocks, key))
        fan = max(2, self.pack_blocks)
        while len(stack) >= fan and len({level for level, _, _ in stack[-fan:]}) == 1:
            level = stack[-1][0]
            merged = [b for _, bs, _ in stack[-fan:] for b in bs]
            if sum(len(d) for _, d in merged) > PACK_MERGE_BYTES:
                del stack[-fan:]  # kept as they are
                break
            key = self._put(prefix, merged)
            if key is None:
                break
            for _, _, old in stack[-fan:]:
                self._delete(old)
            stack[-fan:] = [(level + 1, merged, key)]
            if level + 1 >= PACK_LEVELS - 1:
                stack.pop()  # not merged further
                break
        # the blocks held for merges stay within PACK_MERGE_BYTES: the oldest packs are let go
        # (kept as they are) when larger blocks would hold more
        held = sum(len(d) for _, bs, _ in stack for _, d in bs)
        while stack and held > PACK_MERGE_BYTES:
            held -= sum(len(d) for _, d in stack.pop(0)[1])

    def _put(self, prefix: str, blocks: list[tuple[int, bytes]]) -> str | None:
        key = f"{prefix}{PACK_DIR}{blocks[0][0]:010d}-{blocks[-1][0]:010d}.pk"
        try:
            self.store.put(key, encode_pack(blocks))
        except Exception as exc:  # noqa: BLE001 - a copy: the blocks are the record
            log.warning("%s: pack not written (a takeover reads the blocks instead): %s", key, exc)
            return None
        return key

    def _delete(self, key: str) -> None:
        try:
            self.store.delete(key)
        except Exception as exc:  # noqa: BLE001 - a fence reads the larger pack that holds it
            log.warning("%s: merged pack not deleted: %s", key, exc)

    def _delete_all(self, prefix: str) -> None:
        try:
            self.store.delete_prefix(f"{prefix}{PACK_DIR}")
        except Exception as exc:  # noqa: BLE001 - left for the segment's deletion
            log.warning("%s: packs of the completed segment not deleted: %s", prefix, exc)


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
        self._probing = False  # new blocks are found by reading the next numbers, not by a LIST

    def _where(self, n: int) -> str:
        return f"{self.where}/{n}.blk"

    def load(self) -> Scan:
        """Blocks are immutable and numbered without gaps, so only blocks not seen yet are read."""
        if self._probing:
            return self._probe(Scan())
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
            self._take(scan, n, header)
        self._next_block = max(self._next_block, self._scanned)
        self._probing = self._scanned >= PROBE_AFTER_BLOCKS
        if footer is not None:
            self._read_footer(scan)
        scan.fenced = self._fenced
        return scan

    def _take(self, scan: Scan, n: int, header: BlockHeader) -> None:
        """Block n, the next one in number order, into `scan`."""
        if header.kind == KIND_FENCE:
            self._fenced = True
        elif header.kind == KIND_RECOVERY or not self._fenced:
            if header.count:
                scan.batches.append((header.first_entry_id, header.last_entry_id, n))
            scan.lac = max(scan.lac, header.lac)  # count 0: a LAC-only update
        elif header.count:
            log.warning("%s: ignoring data block %d written after the fence", self.where, n)
        self._scanned = n + 1

    def _read_footer(self, scan: Scan) -> None:
        if self._completed:
            return
        data = self._store.get(f"{self._prefix}footer")
        if data is not None:
            scan.completed_last = decode_footer(data, f"{self.where}/footer").last_entry_id
            self._completed = True

    def _probe(self, scan: Scan) -> Scan:
        """Blocks from `_scanned` on, read until a number is missing (numbers have no gaps): one
        GET at first, then up to `read_threads` at once while blocks keep coming; then the
        footer, unless it was read."""
        width = 1
        while True:
            start = self._scanned
            ns = range(start, start + width)
            got = self._storage.blocks(
                self._log_id, self._segment_id, ns, self._where, records=False, missing_ok=True
            )
            ended = False
            try:
                for n, hit in zip(ns, got, strict=False):
                    if hit is None:
                        ended = True
                        break
                    self._take(scan, n, hit[0])
            finally:
                got.close()  # the reads started past a missing block are dropped
            if ended:
                break
            width = min(2 * width, max(1, self._storage.read_threads))
        self._next_block = max(self._next_block, self._scanned)
        self._read_footer(scan)
        scan.fenced = self._fenced
        return scan

    def _load_packed(self) -> Scan:
        """The first load of a fence: blocks from the segment's packs where a pack holds them,
        the others read, the end found by probing. Without packs, `load`."""
        keys = _cover(self._store.list(f"{self._prefix}{PACK_DIR}"))
        if not keys:
            return self.load()
        packed: dict[int, bytes] = {}
        headers: dict[int, BlockHeader] = {}
        pool = self._storage.executor()
        datas = pool.map(self._store.get, keys) if pool is not None else map(self._store.get, keys)
        for key, data in zip(keys, datas, strict=True):
            try:
                if data is None:
                    continue  # deleted since the LIST: the segment was completed meanwhile
                blocks = decode_pack(data, key)
                got = {n: decode_block_header(b, f"{key} block {n}") for n, b in blocks}
            except CorruptEntryError as exc:
                log.warning("%s: %s; reading its blocks instead", self.where, exc)
                continue
            headers.update(got)
            packed.update(blocks)
        if not packed:
            return self.load()
        top = max(packed) + 1
        self._storage.keep_packed(self._log_id, self._segment_id, packed)
        others = [n for n in range(top) if n not in packed]
        read = self._storage.blocks(
            self._log_id, self._segment_id, others, self._where, records=False
        )
        scan = Scan()
        for n in range(top):
            self._take(scan, n, headers[n] if n in packed else next(read)[0])
        log.info(
            "%s: fenced from %d packs holding %d of %d blocks",
            self.where,
            len(keys),
            len(packed),
            top,
        )
        self._probing = True
        return self._probe(scan)

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
        if not recovery:
            self._storage.packer.add(self._prefix, n, data)
        return n

    def fence(self) -> Scan:
        first = self._scanned == 0 and not self._completed
        scan = self._load_packed() if first else self.load()
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
            self._storage.packer.completed(self._prefix)
            return None
        data = self._store.get(key)
        if data is None:
            raise CorruptEntryError(f"{self.where}: footer exists but cannot be read")
        self._completed = True
        self._storage.packer.completed(self._prefix)
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


def _cover(keys: list[str]) -> list[str]:
    """Of the pack keys (`.../{first:010d}-{last:010d}.pk`), the fewest that hold every block any
    of them holds: a smaller pack left behind by a merge (its delete failed, or the writer died
    between) is not read when a larger one holds its blocks."""
    ranges = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        first, _, last = name.removesuffix(".pk").partition("-")
        if name.endswith(".pk") and first.isdigit() and last.isdigit():
            ranges.append((int(first), -int(last), key))
    chosen = []
    end = -1
    for _first, neg_last, key in sorted(ranges):
        if -neg_last > end:
            chosen.append(key)
            end = -neg_last
    return chosen
