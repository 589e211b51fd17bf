"""A LogStore node in object mode: per (log, segment) CRC-checked blocks on object storage.

Every block put is create-if-absent, and fencing creates the first free block key as a marker, so a
writer in another process that still holds the segment collides with the marker on its next put and
stops (DESIGN.md section 3). A block that landed before the marker is part of the segment; nothing
after it is, except recovery copies written while completing the segment.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from .._core import concat, count_records
from ..errors import CorruptEntryError, EntryConflictError, SegmentFencedError
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
    split_frame,
)

log = logging.getLogger(__name__)


def segment_prefix(log_id: int, segment_id: int) -> str:
    return f"{log_id}/{segment_id}/"


@dataclass
class _Segment:
    """What a node knows of one segment; rebuilt from the store when another process moved it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False
    scanned: int = 0  # blocks 0..scanned-1 are in the index
    next_block: int = 0
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (first, last, block), sorted
    fenced: bool = False
    completed_last: int | None = None
    lac: int = -1

    contig: int = -1  # the last entry id held with no gap from entry 0

    def contiguous_last(self) -> int:
        return self.contig

    def holds(self, entry_id: int) -> int | None:
        """The block holding `entry_id`, if any (blocks never overlap: only missing runs land)."""
        pos = bisect.bisect_right(self.index, (entry_id, 1 << 62, 0)) - 1
        if pos >= 0:
            first, end, block = self.index[pos]
            if first <= entry_id <= end:
                return block
        return None

    def add_block(self, first: int, last: int, block: int) -> None:
        item = (first, last, block)
        bisect.insort(self.index, item)
        if first <= self.contig + 1:
            pos = bisect.bisect_left(self.index, item)
            while pos < len(self.index) and self.index[pos][0] <= self.contig + 1:
                self.contig = max(self.contig, self.index[pos][1])
                pos += 1


class LogStoreEngine:
    """One node's storage for every segment it is given; thread-safe."""

    def __init__(self, store: ObjectStore, node_id: str = "node-0", cache_bytes: int = 32 << 20):
        self.store = store
        self.node_id = node_id
        self._segments: dict[tuple[int, int], _Segment] = {}
        self._segments_lock = threading.Lock()
        # block cache: key -> [data, header, records (split on first read)]
        self._cache: OrderedDict[tuple[int, int, int], list] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()

    # --- state -----------------------------------------------------------------------------

    def _segment(self, log_id: int, segment_id: int) -> _Segment:
        key = (log_id, segment_id)
        with self._segments_lock:
            seg = self._segments.get(key)
            if seg is None:
                seg = self._segments[key] = _Segment()
            return seg

    def _load(self, log_id: int, segment_id: int, seg: _Segment) -> None:
        """Bring `seg` up to date with the store (caller holds seg.lock).

        Blocks are immutable and numbered without gaps, so only blocks not seen yet are read.
        """
        prefix = segment_prefix(log_id, segment_id)
        blocks: list[int] = []
        footer = None
        for key in self.store.list(prefix):
            name = key[len(prefix) :]
            if name == "footer":
                footer = key
            elif name.endswith(".blk") and name[:-4].isdigit():
                n = int(name[:-4])
                if n >= seg.scanned:
                    blocks.append(n)
        blocks.sort()
        for n in blocks:
            header, _ = self._block(log_id, segment_id, n, records=False)
            if header.kind == KIND_FENCE:
                seg.fenced = True
            elif header.kind == KIND_RECOVERY or not seg.fenced:
                if header.count and seg.holds(header.first_entry_id) is None:
                    seg.add_block(header.first_entry_id, header.last_entry_id, n)
                seg.lac = max(seg.lac, header.lac)  # count 0: a LAC-only update
            elif header.count:
                log.warning("%s: ignoring data block %d written after the fence", prefix, n)
            seg.scanned = n + 1
        seg.next_block = max(seg.next_block, seg.scanned)
        if footer is not None and seg.completed_last is None:
            data = self.store.get(footer)
            if data is not None:
                seg.completed_last = decode_footer(data, f"{self.node_id}:{footer}").last_entry_id
        seg.loaded = True

    def _ensure(self, log_id: int, segment_id: int, seg: _Segment, refresh: bool = False) -> None:
        if refresh or not seg.loaded:
            self._load(log_id, segment_id, seg)

    def _block(self, log_id: int, segment_id: int, n: int, records: bool = True):
        """(header, records) of block n, cached; records are split only when asked for."""
        key = (log_id, segment_id, n)
        where = f"{self.node_id}:{log_id}/{segment_id}/{n}.blk"
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

    def _stored_record(self, log_id: int, segment_id: int, block: int, entry_id: int) -> bytes:
        header, records = self._block(log_id, segment_id, block)
        return bytes(records[entry_id - header.first_entry_id])

    # --- the node API ------------------------------------------------------------------------

    def add_entries(
        self,
        log_id: int,
        segment_id: int,
        first_entry_id: int,
        frame: bytes,
        lac: int = -1,
        recovery: bool = False,
    ) -> int:
        """Store a frame of consecutive entries; returns the last contiguous entry id held.

        An entry already held is acknowledged again if its bytes are identical and refused with
        `EntryConflictError` if they differ; only the missing runs are written.
        """
        where = f"{self.node_id}:{log_id}/{segment_id}"
        count = count_records(frame)
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(log_id, segment_id, seg)
            if seg.completed_last is not None:
                raise SegmentFencedError(f"{where} is completed; add of {first_entry_id} refused")
            if seg.fenced and not recovery:
                raise SegmentFencedError(f"{where} is fenced; add of {first_entry_id} refused")
            records: list[memoryview] = []
            if count == 0:
                runs = [(0, 0)] if lac > seg.lac else []  # a LAC-only update, kept for readers
            elif not seg.index or first_entry_id > seg.index[-1][1]:
                runs = [(0, count)]  # the common case: appending past everything held
            else:
                records = split_frame(frame, where)
                runs = self._missing_runs(log_id, segment_id, seg, first_entry_id, records, where)
            kind = KIND_RECOVERY if recovery else KIND_DATA
            for lo, hi in runs:
                body = frame if (lo, hi) == (0, count) else concat(records[lo:hi])
                self._put_block(
                    log_id, segment_id, seg, kind, first_entry_id + lo, hi - lo, lac, body
                )
            if lac > seg.lac:
                seg.lac = lac
            return seg.contiguous_last()

    def _missing_runs(
        self,
        log_id: int,
        segment_id: int,
        seg: _Segment,
        first_entry_id: int,
        records: list[memoryview],
        where: str,
    ) -> list[tuple[int, int]]:
        """[start, stop) index runs of records not held yet; held ones must match byte for byte."""
        runs: list[tuple[int, int]] = []
        start = None
        for i, record in enumerate(records):
            block = seg.holds(first_entry_id + i)
            if block is None:
                if start is None:
                    start = i
                continue
            if start is not None:
                runs.append((start, i))
                start = None
            stored = self._stored_record(log_id, segment_id, block, first_entry_id + i)
            if stored != record:
                raise EntryConflictError(
                    f"{where}: entry {first_entry_id + i} already stored with other bytes"
                )
        if start is not None:
            runs.append((start, len(records)))
        return runs

    def _put_block(self, log_id, segment_id, seg: _Segment, kind, first, count, lac, body) -> None:
        data = encode_block(kind, first, count, lac, body)
        n = seg.next_block
        key = f"{log_id}/{segment_id}/{n}.blk"
        if not self.store.put(key, data, if_none_match=True):
            existing = self.store.get(key)
            if existing != data:
                # Someone else took block n: a fence marker or another writer's block.
                self._load(log_id, segment_id, seg)
                raise SegmentFencedError(
                    f"{self.node_id}:{log_id}/{segment_id}: block {n} was taken (fenced); "
                    f"add of {first} refused"
                )
        seg.next_block = n + 1
        if seg.scanned == n:
            seg.scanned = n + 1
        if count:
            seg.add_block(first, first + count - 1, n)

    def fence(self, log_id: int, segment_id: int) -> tuple[int, int]:
        """Fence the segment; returns (last contiguous entry id held, highest LAC seen)."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._load(log_id, segment_id, seg)
            if seg.completed_last is None and not seg.fenced:
                marker = encode_block(KIND_FENCE, 0, 0, -1, b"")
                while not self.store.put(
                    f"{log_id}/{segment_id}/{seg.next_block}.blk", marker, if_none_match=True
                ):
                    self._load(log_id, segment_id, seg)  # a block landed just before: keep it
                    if seg.fenced:
                        break
                else:
                    seg.next_block += 1
                seg.fenced = True
            last = seg.contiguous_last()
            if seg.completed_last is not None:
                last = min(last, seg.completed_last)
            return last, seg.lac

    def completed_end(self, log_id: int, segment_id: int) -> int | None:
        """The end this node's footer records (refreshed from the store), or None if it has none.

        A footer is written only once a recovery decided the end, so recovery takes it as
        lastEntryId even when the metadata was not sealed afterwards (DESIGN.md section 4).
        """
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(log_id, segment_id, seg, refresh=seg.completed_last is None)
            return seg.completed_last

    def complete(self, log_id: int, segment_id: int, last_entry_id: int) -> None:
        """Seal the segment at `last_entry_id` with a footer; later adds are refused."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(log_id, segment_id, seg, refresh=True)
            if seg.completed_last is not None:
                if seg.completed_last != last_entry_id:
                    raise EntryConflictError(
                        f"{self.node_id}:{log_id}/{segment_id} already completed at "
                        f"{seg.completed_last}, not {last_entry_id}"
                    )
                return
            blocks = [(b, f, min(e, last_entry_id)) for f, e, b in seg.index if f <= last_entry_id]
            footer = encode_footer(last_entry_id, sorted(blocks))
            key = f"{log_id}/{segment_id}/footer"
            if not self.store.put(key, footer, if_none_match=True):
                self._load(log_id, segment_id, seg)
                if seg.completed_last != last_entry_id:
                    raise EntryConflictError(f"{self.node_id}:{key} exists with another end")
            seg.completed_last = last_entry_id
            seg.fenced = True

    def read(
        self, log_id: int, segment_id: int, from_entry_id: int, max_entries: int
    ) -> list[bytes]:
        """Up to `max_entries` consecutive entries (LogEntry bytes) from `from_entry_id`."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(log_id, segment_id, seg)
            if seg.completed_last is None and seg.holds(from_entry_id) is None:
                self._load(log_id, segment_id, seg)  # another process may have added blocks
            end = seg.completed_last
        out: list[bytes] = []
        entry_id = from_entry_id
        while len(out) < max_entries and (end is None or entry_id <= end):
            with seg.lock:
                block = seg.holds(entry_id)
            if block is None:
                break
            header, records = self._block(log_id, segment_id, block)
            stop = header.last_entry_id if end is None else min(header.last_entry_id, end)
            stop = min(stop, entry_id + max_entries - len(out) - 1)
            for eid in range(entry_id, stop + 1):
                where = f"{self.node_id}:{log_id}/{segment_id}/{block}.blk entry {eid}"
                out.append(record_entry(records[eid - header.first_entry_id], where))
            entry_id = stop + 1
        return out

    def last_add_confirmed(self, log_id: int, segment_id: int) -> tuple[int, int]:
        """(last contiguous entry id held, highest LAC piggybacked), refreshed from the store."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._load(log_id, segment_id, seg)
            last = seg.contiguous_last()
            if seg.completed_last is not None:
                return min(last, seg.completed_last), seg.completed_last
            return last, seg.lac

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self.store.delete_prefix(segment_prefix(log_id, segment_id))
            with self._segments_lock:
                self._segments.pop((log_id, segment_id), None)
        with self._cache_lock:
            for key in [k for k in self._cache if k[:2] == (log_id, segment_id)]:
                self._cache_bytes -= len(self._cache.pop(key)[0])

    def delete_log(self, log_id: int) -> None:
        self.store.delete_prefix(f"{log_id}/")
        with self._segments_lock:
            for key in [k for k in self._segments if k[0] == log_id]:
                del self._segments[key]
