"""A LogStore node: per (log, segment) CRC-checked batches, on a `SegmentStorage`.

The node rules live here, once for every storage layout (`storage.py`): a fenced or completed
segment refuses new data, an entry already held is acknowledged again only with identical bytes,
recovery copies are accepted after the fence, the LAC piggybacked on adds is kept for readers, and
a completed segment is read only up to its lastEntryId. How batches are laid out and how fencing
is made to hold across processes is the storage's part (block keys on object storage, a fence
file on a local directory).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from .._core import concat, count_records
from ..errors import (
    EntryConflictError,
    InvalidArgumentError,
    SegmentFencedError,
    SegmentIncompleteError,
)
from ..objectstore.base import ObjectStore
from .blocks import split_frame
from .storage import (
    ObjectSegmentStorage,
    Scan,
    SealedSegment,
    SegmentHandle,
    SegmentStorage,
    Span,
)

log = logging.getLogger(__name__)


@dataclass
class _Segment:
    """What a node knows of one segment; brought up to date from the storage when another
    process may have moved it."""

    handle: SegmentHandle
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (first, last, loc), sorted
    fenced: bool = False
    completed_last: int | None = None
    lac: int = -1
    contig: int = -1  # the last entry id held with no gap from entry 0

    def holds(self, entry_id: int) -> int | None:
        """Index position of the batch holding `entry_id`, if any (batches never overlap)."""
        pos = bisect.bisect_right(self.index, (entry_id, 1 << 62, 0)) - 1
        if pos >= 0 and self.index[pos][0] <= entry_id <= self.index[pos][1]:
            return pos
        return None

    def add_batch(self, first: int, last: int, loc: int) -> None:
        item = (first, last, loc)
        if not self.index or first > self.index[-1][0]:
            self.index.append(item)  # the common case: in order
        else:
            bisect.insort(self.index, item)
        if first <= self.contig + 1:
            pos = bisect.bisect_left(self.index, item)
            while pos < len(self.index) and self.index[pos][0] <= self.contig + 1:
                self.contig = max(self.contig, self.index[pos][1])
                pos += 1

    def apply(self, scan: Scan) -> None:
        for first, last, loc in scan.batches:
            if self.holds(first) is None:
                self.add_batch(first, last, loc)
        self.lac = max(self.lac, scan.lac)
        self.fenced = self.fenced or scan.fenced
        if scan.completed_last is not None and self.completed_last is None:
            self.completed_last = scan.completed_last
        self.loaded = True


class LogStoreEngine:
    """One node's storage for every segment it is given; thread-safe.

    `storage` is a `SegmentStorage`, or an `ObjectStore` (blocks on it, the `objects` layout).
    """

    def __init__(self, storage: SegmentStorage | ObjectStore, node_id: str = "node-0"):
        self.store = storage
        self.storage: SegmentStorage = (
            storage if isinstance(storage, SegmentStorage) else ObjectSegmentStorage(storage)
        )
        self.node_id = node_id
        self._segments: dict[tuple[int, int], _Segment] = {}
        self._segments_lock = threading.Lock()

    # --- state -----------------------------------------------------------------------------

    def _segment(self, log_id: int, segment_id: int) -> _Segment:
        key = (log_id, segment_id)
        with self._segments_lock:
            seg = self._segments.get(key)
            if seg is None:
                handle = self.storage.open(log_id, segment_id, self.node_id)
                seg = self._segments[key] = _Segment(handle)
            return seg

    @staticmethod
    def _ensure(seg: _Segment, refresh: bool = False) -> None:
        if refresh or not seg.loaded:
            seg.apply(seg.handle.load())

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
        count = count_records(frame)
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            where = seg.handle.where
            self._ensure(seg)
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
                runs = self._missing_runs(seg, first_entry_id, records, where)
            try:
                for lo, hi in runs:
                    body = frame if (lo, hi) == (0, count) else concat(records[lo:hi])
                    first = first_entry_id + lo
                    loc = seg.handle.append(first, hi - lo, lac, body, recovery)
                    if hi > lo:
                        seg.add_batch(first, first + hi - lo - 1, loc)
            except SegmentFencedError:
                seg.apply(seg.handle.load())
                raise
            if lac > seg.lac:
                seg.lac = lac
            return seg.contig

    def _missing_runs(
        self, seg: _Segment, first_entry_id: int, records: list[memoryview], where: str
    ) -> list[tuple[int, int]]:
        """[start, stop) index runs of records not held yet; held ones must match byte for byte."""
        runs: list[tuple[int, int]] = []
        start = None
        for i, record in enumerate(records):
            pos = seg.holds(first_entry_id + i)
            if pos is None:
                if start is None:
                    start = i
                continue
            if start is not None:
                runs.append((start, i))
                start = None
            first, _, loc = seg.index[pos]
            if seg.handle.record(loc, first, first_entry_id + i) != record:
                raise EntryConflictError(
                    f"{where}: entry {first_entry_id + i} already stored with other bytes"
                )
        if start is not None:
            runs.append((start, len(records)))
        return runs

    def fence(self, log_id: int, segment_id: int) -> tuple[int, int]:
        """Fence the segment; returns (last contiguous entry id held, highest LAC seen)."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            seg.apply(seg.handle.fence())
            seg.fenced = True
            last = seg.contig
            if seg.completed_last is not None:
                last = min(last, seg.completed_last)
            return last, seg.lac

    def completed_end(self, log_id: int, segment_id: int) -> int | None:
        """The end this node's footer records (refreshed from the store), or None if it has none.

        A footer is written only once a recovery decided the end, so recovery takes it as
        lastEntryId even when the metadata was not sealed afterwards (docs/architecture.md).
        """
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(seg, refresh=seg.completed_last is None)
            return seg.completed_last

    def complete(self, log_id: int, segment_id: int, last_entry_id: int) -> None:
        """Seal the segment at `last_entry_id` with a footer; later adds are refused."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(seg, refresh=True)
            if seg.completed_last is None:
                held = [(f, e, loc) for f, e, loc in seg.index if f <= last_entry_id]
                seg.completed_last = seg.handle.complete(last_entry_id, held)
                if seg.completed_last is None:
                    seg.completed_last = last_entry_id
            seg.fenced = True
            if seg.completed_last != last_entry_id:
                raise EntryConflictError(
                    f"{seg.handle.where} already completed at {seg.completed_last}, "
                    f"not {last_entry_id}"
                )

    def read(
        self, log_id: int, segment_id: int, from_entry_id: int, max_entries: int
    ) -> list[bytes]:
        """Up to `max_entries` consecutive entries (LogEntry bytes) from `from_entry_id`."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(seg)
            if seg.completed_last is None and seg.holds(from_entry_id) is None:
                self._ensure(seg, refresh=True)  # another process may have added batches
            spans = self._spans(seg, from_entry_id, max_entries)
            handle = seg.handle
        return handle.read(spans) if spans else []

    @staticmethod
    def _spans(seg: _Segment, entry_id: int, max_entries: int) -> list[Span]:
        """The batches holding up to `max_entries` consecutive entries from `entry_id`."""
        end = seg.completed_last
        pos = seg.holds(entry_id)
        spans: list[Span] = []
        left = max_entries
        index = seg.index
        while pos is not None and left > 0 and (end is None or entry_id <= end):
            first, last, loc = index[pos]
            stop = last if end is None else min(last, end)
            stop = min(stop, entry_id + left - 1)
            spans.append((loc, first, entry_id, stop))
            left -= stop - entry_id + 1
            entry_id = stop + 1
            pos += 1
            if pos == len(index) or index[pos][0] != entry_id:
                pos = seg.holds(entry_id)
        return spans

    def read_completed(
        self, log_id: int, segment_id: int, chunk: int = 10_000
    ) -> Iterator[list[bytes]]:
        """A completed segment's entries in order, in lists of up to `chunk` (one sequential
        pass: what uploading a local segment to object storage as blocks reads)."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(seg, refresh=seg.completed_last is None)
            if seg.completed_last is None:
                raise SegmentFencedError(f"{seg.handle.where} is not completed")
        entry = 0
        while True:
            got = self.read(log_id, segment_id, entry, chunk)
            if not got:
                return
            yield got
            entry += len(got)

    def seal_segment(self, log_id: int, segment_id: int, last_entry_id: int) -> SealedSegment:
        """Staged storage: complete the segment at `last_entry_id` (as `complete`) and upload it
        to object storage (`StagedSegmentStorage.upload`); returns once the footer is written.
        `SegmentIncompleteError` when this node lacks an entry up to that end (seal it
        through another node), `SegmentFencedError` when the segment is deleted (before or
        during the upload), `EntryConflictError` when it is completed at another end, or
        object storage holds other entries for it."""
        from .staged import StagedSegmentStorage

        storage = self.storage
        if not isinstance(storage, StagedSegmentStorage):
            raise InvalidArgumentError(
                f"node {self.node_id}: SealSegment is for staged storage (storage.type: staged); "
                f"this node stores segments as {type(storage).__name__}"
            )
        # held against a deletion of the segment from here on (truncation, retention): what
        # the upload puts is then deleted after it (StagedSegmentStorage.uploading)
        with storage.uploading(log_id, segment_id):
            seg = self._segment(log_id, segment_id)
            with seg.lock:
                self._ensure(seg, refresh=seg.completed_last is None)
                # a node completed at the end may still lack its last entries (completed while
                # its last batch was on the way): its copy is not the segment's
                if seg.contig < last_entry_id:
                    raise SegmentIncompleteError(
                        f"{seg.handle.where} holds entries up to {seg.contig} only, not up to "
                        f"{last_entry_id}: seal it through another node of its ensemble"
                    )
            self.complete(log_id, segment_id, last_entry_id)
            chunks = self.read_completed(log_id, segment_id) if last_entry_id >= 0 else iter(())
            return storage.upload(log_id, segment_id, self.node_id, chunks, last_entry_id)

    def drop_local(self, log_id: int, segment_id: int) -> None:
        """Staged storage: drop this node's local copy of a sealed segment; it is read from
        object storage from now on (`StagedSegmentStorage.drop_local`)."""
        from .staged import StagedSegmentStorage

        storage = self.storage
        if not isinstance(storage, StagedSegmentStorage):
            raise InvalidArgumentError(f"node {self.node_id}: no local copies to drop")
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            storage.drop_local(log_id, segment_id)
            seg.handle.close()
            with self._segments_lock:
                if self._segments.get((log_id, segment_id)) is seg:
                    del self._segments[(log_id, segment_id)]

    def last_add_confirmed(self, log_id: int, segment_id: int) -> tuple[int, int]:
        """(last contiguous entry id held, highest LAC piggybacked), refreshed from the store."""
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            self._ensure(seg, refresh=True)
            if seg.completed_last is not None:
                return min(seg.contig, seg.completed_last), seg.completed_last
            return seg.contig, seg.lac

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        seg = self._segment(log_id, segment_id)
        with seg.lock:
            seg.handle.close()
            self.storage.delete_segment(log_id, segment_id)
            with self._segments_lock:
                self._segments.pop((log_id, segment_id), None)

    def close(self) -> None:
        """Sync what the storage deferred (`storage.fsync: batch_ms:N`) and stop its thread."""
        self.storage.close()

    def delete_log(self, log_id: int) -> None:
        with self._segments_lock:
            gone = [self._segments.pop(k) for k in list(self._segments) if k[0] == log_id]
        for seg in gone:
            with seg.lock:
                seg.handle.close()
        self.storage.delete_log(log_id)
