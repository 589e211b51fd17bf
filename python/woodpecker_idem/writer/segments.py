"""The writer's open segments (Woodpecker's segment handle, writer side): each one's pending
entries, batches in flight, acks and LAC (`OpenSegment`); the current one, where writes go; and
the roll rule: where the next segment comes from (created in the metadata store, or adopted if it
is this writer's own whose create answer was lost) and when the current one is full or old
(segment.max_entries, segment.max_size_bytes, segment.max_interval_s).

Entries are encoded once (`record` bytes), so every resend is byte-identical. A batch commits at
aq acks and every earlier batch has committed, which keeps commits in entry order. The segment
limits are targets, not bounds: if the metadata store cannot create the next segment, writes go
on in the current one and the roll is retried with backoff, so a metadata outage never stops
writes. State changes happen under the writer's lock (every `_locked` method needs it); futures
are resolved after it is released. (A LogStore node's own storage of a segment is
`logstore.storage.SegmentStorage`: another object, on the other side of the transport.)
"""

from __future__ import annotations

import bisect
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from .._core import Payloads, chunk_end, concat
from ..errors import WriterFencedError
from ..logstore.blocks import split_frame
from ..meta.base import SegmentMeta
from ..retry import Backoff
from ..types import LogMessageId, SegmentState, WriteResult
from .results import Outcomes, RunWaiter, Waiter, resolve

if TYPE_CHECKING:
    from ..clock import Clock
    from ..config import Config
    from ..ensemble import Ensemble
    from ..meta import MetadataStore
    from .lifecycle import Maintenance
    from .sender import Dispatch

log = logging.getLogger(__name__)

# Background retries (repair, completing a rolled segment, a roll the metadata store refused)
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 2.0

# Bytes a row counts against the batch and in-flight limits before its record exists
ROW_OVERHEAD = 64


class SegmentStatus(enum.Enum):
    OPEN = "open"  # takes new entries
    ROLLED = "rolled"  # takes no new entries; completes once drained
    FAILED = "failed"  # lost its quorum; being completed by the recovery rule
    DONE = "done"  # completed; nothing pending


class PendingEntry:
    """An entry assigned an id but not yet committed; the unit callers wait on and retries join.

    A run (`count` > 1, made by the batch lane) is `count` consecutive entries with one record
    frame (`record`: their records end to end) and one waiter: nothing per row."""

    __slots__ = (
        "count",
        "seq",
        "segment_id",
        "entry_id",
        "record",
        "future",
        "joiners",
        "deadline",
        "timed_out",
        "queued",
    )

    def __init__(
        self,
        seq: int,
        segment_id: int,
        entry_id: int,
        record: bytes,
        future: Waiter | None,
        deadline: float,
        count: int = 1,
    ):
        self.count = count
        self.seq = seq
        self.segment_id = segment_id
        self.entry_id = entry_id
        self.record = record
        self.future = future
        self.joiners: list[Waiter] | None = None
        self.deadline = deadline
        self.timed_out = False
        self.queued = 0.0  # time.monotonic() when its oldest write was accepted (ack latency)

    @property
    def last_entry_id(self) -> int:
        return self.entry_id + self.count - 1

    def waiters(self) -> list[tuple[Waiter, bool]]:
        """(future, duplicate) for the creator and every call that joined."""
        out = []
        if self.future is not None:
            out.append((self.future, False))
        if self.joiners:
            out.extend((f, True) for f in self.joiners)
        return out


@dataclass(eq=False)
class SentBatch:
    """Entries of a segment cut into one AddEntries call (its frame, encoded once): sent to
    every node of the segment, committed once aq nodes acked it."""

    first_entry_id: int
    entries: list[PendingEntry]
    frame: bytes
    acks: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    retrying: bool = False  # a node failed it once: entries held behind it go after linger_ms

    @property
    def last_entry_id(self) -> int:
        return self.entries[-1].last_entry_id


def span(entries: list[PendingEntry]) -> int:
    """How many entries `entries` (consecutive, in entry order) hold, runs counted in full."""
    return entries[-1].last_entry_id - entries[0].entry_id + 1 if entries else 0


class EntryJoiner:
    """A waiter joining one entry inside a run: the run's result names its first entry, this
    tells the joiner the id of the entry it joined."""

    __slots__ = ("waiter", "entry_id")

    def __init__(self, waiter: Waiter, entry_id: int):
        self.waiter = waiter
        self.entry_id = entry_id

    def set_result(self, result: WriteResult) -> None:
        mid = LogMessageId(result.message_id.segment_id, self.entry_id)
        self.waiter.set_result(WriteResult(mid, result.duplicate))

    def set_exception(self, exception: BaseException | None) -> None:
        self.waiter.set_exception(exception)


class OpenSegment:
    """Writer-side state of one segment; every method is called with the writer's lock held."""

    def __init__(self, meta: SegmentMeta, created_monotonic: float):
        self.meta = meta
        self.segment_id = meta.segment_id
        self.status = SegmentStatus.OPEN
        self.next_entry_id = 0
        self.size_bytes = 0
        self.created = created_monotonic
        self.pending: deque[PendingEntry] = deque()  # uncommitted, in entry order
        self.unsent: list[PendingEntry] = []  # not yet in a batch
        self.unsent_bytes = 0
        self.unsent_entries = 0  # runs counted in full
        self.unsent_since = 0.0  # time.monotonic() when the oldest unsent entry was queued
        self.batches: deque[SentBatch] = deque()  # sent, not committed, in order
        self.failed_nodes: dict[str, str] = {}  # node -> why
        self.lac = -1
        self.lac_sent = -1  # highest LAC piggybacked to the nodes
        self.by_entry: dict[int, PendingEntry] = {}

    @property
    def aq(self) -> int:
        return self.meta.aq

    def quorum_lost(self) -> bool:
        return len(self.failed_nodes) > self.meta.es - self.meta.aq

    def live_nodes(self) -> list[str]:
        return [n for n in self.meta.nodes if n not in self.failed_nodes]

    def take_batch(self, max_entries: int, max_bytes: int) -> SentBatch:
        """Cut the next batch from the unsent entries (at least one entry, even if oversized);
        called only while there are unsent entries."""
        count = 0
        size = 0
        items = 0  # a run is never cut: the batch lane makes runs within both limits
        for entry in self.unsent:
            if count and (
                count + entry.count > max_entries or size + len(entry.record) > max_bytes
            ):
                break
            count += entry.count
            size += len(entry.record)
            items += 1
        entries = self.unsent[:items]
        # a lone entry's frame is sent as it is (the batch lane's runs fill a batch alone)
        frame = entries[0].record if items == 1 else concat([e.record for e in entries])
        batch = SentBatch(entries[0].entry_id, entries, frame)
        # Only now change state, with no Python call between the steps: a KeyboardInterrupt
        # (raised after a call returns) cannot leave entries out of both `unsent` and `batches`,
        # which would never be sent while later batches commit past them.
        del self.unsent[:items]
        self.unsent_bytes -= size
        self.unsent_entries -= count
        self.batches.append(batch)
        return batch

    def ack(self, node: str, batch: SentBatch) -> list[PendingEntry]:
        """Record an ack; returns the entries that became committed, in order."""
        batch.acks.add(node)
        committed: list[PendingEntry] = []
        while self.batches and len(self.batches[0].acks) >= self.aq:
            done = self.batches.popleft()
            for _ in done.entries:
                # entries are committed in order; the deque head is always this entry
                head = self.pending.popleft()
                del self.by_entry[head.entry_id]
                committed.append(head)
            self.lac = done.last_entry_id
        return committed

    def find(self, entry_id: int) -> PendingEntry | None:
        """The pending entry or run holding `entry_id`, if any."""
        entry = self.by_entry.get(entry_id)  # a single entry, or a run's first
        if entry is not None or not self.pending:
            return entry
        i = bisect.bisect_right(self.pending, entry_id, key=_first_id) - 1
        if i >= 0 and self.pending[i].entry_id <= entry_id <= self.pending[i].last_entry_id:
            return self.pending[i]
        return None

    def drained(self) -> bool:
        return not self.pending

    def resolve_completed(
        self, last_entry_id: int
    ) -> tuple[list[PendingEntry], list[PendingEntry]]:
        """The segment completed at `last_entry_id`: (present -> committed, absent -> dropped)."""
        committed = [e for e in self.pending if e.last_entry_id <= last_entry_id]
        dropped = [e for e in self.pending if e.entry_id > last_entry_id]
        for e in self.pending:  # a run the end falls inside: its head is in, its tail is not
            if e.entry_id <= last_entry_id < e.last_entry_id:
                head, tail = _split_run(e, last_entry_id - e.entry_id + 1)
                committed.append(head)
                dropped.insert(0, tail)
        self.pending.clear()
        self.unsent.clear()
        self.unsent_bytes = 0
        self.unsent_entries = 0
        self.unsent_since = 0.0  # time.monotonic() when the oldest unsent entry was queued
        self.batches.clear()
        self.by_entry.clear()
        self.lac = max(self.lac, last_entry_id)
        self.status = SegmentStatus.DONE
        return committed, dropped


def _first_id(entry: PendingEntry) -> int:
    return entry.entry_id


def _split_run(run: PendingEntry, count: int) -> tuple[PendingEntry, PendingEntry]:
    """A run cut after its first `count` entries (the segment was completed between them):
    records, waiter and joiners go with the entries they belong to."""
    records = split_frame(run.record, "pending run")
    waiter = cast("RunWaiter | None", run.future)
    head_waiter, tail_waiter = waiter.split(count) if waiter is not None else (None, None)
    parts = []
    for first, recs, waiter in (
        (run.entry_id, records[:count], head_waiter),
        (run.entry_id + count, records[count:], tail_waiter),
    ):
        part = PendingEntry(run.seq, run.segment_id, first, concat(recs), waiter, run.deadline)
        part.count = len(recs)
        part.timed_out = run.timed_out
        part.queued = run.queued
        parts.append(part)
    for joiner in run.joiners or ():
        at = joiner.entry_id if isinstance(joiner, EntryJoiner) else run.entry_id
        part = parts[0] if at < run.entry_id + count else parts[1]
        if part.joiners is None:
            part.joiners = []
        part.joiners.append(joiner)
    return parts[0], parts[1]


class RollView(Protocol):
    """What `OpenSegments` uses of its writer (`LogWriter` implements it; see there)."""

    log_id: int
    epoch: int
    clock: Clock
    metrics: dict[str, float]
    lock: threading.Lock

    @property
    def stopped(self) -> bool: ...

    def fence(self, exc: WriterFencedError) -> None: ...

    def fence_locked(self, exc: WriterFencedError) -> Outcomes: ...

    def complete_if_drained_locked(self, seg: OpenSegment) -> None: ...


class OpenSegments:
    """One writer's segments not completed yet, oldest first; the current one; the roll rule, and
    its backoff after a refused roll."""

    def __init__(
        self,
        pipeline: RollView,
        cfg: Config,
        *,
        meta: MetadataStore,
        ensemble: Ensemble,
        dispatch: Dispatch,
        maint: Maintenance,
    ):
        self._pipeline = pipeline
        self._meta = meta
        self._ensemble = ensemble
        self._dispatch = dispatch
        self._maint = maint
        self._log_id = pipeline.log_id
        self._es = cfg.quorum.es
        self._max_entries = cfg.segment.max_entries
        self._max_bytes = cfg.segment.max_size_bytes
        self._max_age_s = cfg.segment.max_interval_s
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        self._retry_at = 0.0  # after a failed roll: not retried before this (monotonic)
        # After a failed roll the next segment is made in the background (`_prepare_next`): a
        # metadata store that is down must not hold the writer's lock at every retry (each call
        # waits for its timeout). `_prepared` is the segment made, taken at the next roll.
        self._roll_failed = False
        self._preparing = False
        self._prepared: SegmentMeta | None = None
        self._batch_entries = cfg.append.max_batch_entries
        self._batch_bytes = cfg.append.max_batch_bytes
        self._timeout_s = cfg.append.timeout_ms / 1000  # a waiter's deadline
        self._open: dict[int, OpenSegment] = {}
        self.last_opened = -1  # the newest segment this writer has had a handle for
        self.current: OpenSegment | None = None  # None while a repair replaces it
        # The last entry of the newest segment completed (by this writer, or before it opened):
        # where the log ends once no open segment of this writer holds an entry.
        self.last_completed: LogMessageId | None = None
        self._failed_in_last: set[str] = set()  # nodes that failed in the last segment completed

    # --- where writes go (the write path) ------------------------------------------------------

    def writable_locked(self) -> OpenSegment | None:
        """The current segment, rolled first if it is full or old; None while a repair replaces
        it. A roll refused because another writer took the log over fences the writer (every
        pending write fails with `WriterFencedError`)."""
        seg = self.current
        if seg is None:
            return None
        return self._roll_locked(seg) if self._needs_roll(seg, time.monotonic()) else seg

    def run_end_locked(
        self, seg: OpenSegment, payloads: list[bytes] | Payloads, start: int, n: int
    ) -> int:
        """Where the run of rows from `start` (of `n`) ends: one AddEntries batch
        (append.max_batch_entries / max_batch_bytes, a payload counting ROW_OVERHEAD more) within
        `seg`'s roll limits. A segment past them (it could not be rolled) takes one batch more."""
        room, room_bytes = self._max_entries - seg.next_entry_id, self._max_bytes - seg.size_bytes
        if room <= 0 or room_bytes <= 0:
            room, room_bytes = n, self._batch_bytes
        end = min(n, start + room, start + self._batch_entries)
        return chunk_end(payloads, start, end, min(room_bytes, self._batch_bytes), ROW_OVERHEAD)[1]

    def idle_locked(self) -> bool:
        """Nothing is in flight in the current segment (or there is none: being repaired)."""
        current = self.current
        return current is None or not current.batches

    def join_locked(self, segment_id: int, entry_id: int, future: Waiter) -> None:
        """`future` also ends with pending entry `segment_id:entry_id` (a retry joins it)."""
        seg = self._open.get(segment_id)
        entry = seg.find(entry_id) if seg is not None else None
        if entry is None:  # cannot happen while pending keys and segments move together
            raise RuntimeError(f"pending key without its entry {segment_id}:{entry_id}")
        if entry.joiners is None:
            entry.joiners = []
        entry.joiners.append(future if entry.count == 1 else EntryJoiner(future, entry_id))
        if entry.timed_out:  # a retry after a timeout gets a fresh deadline
            entry.timed_out = False
            entry.deadline = time.monotonic() + self._timeout_s

    # --- what is open --------------------------------------------------------------------------

    def all_locked(self) -> list[OpenSegment]:
        """The segments not completed yet, oldest first."""
        return list(self._open.values())

    def lacs_locked(self) -> dict[int, int]:
        """The LAC of every segment not completed yet (what a snapshot may cover of them)."""
        return {seg.segment_id: seg.lac for seg in self._open.values()}

    def oldest_pending_seq_locked(self) -> int | None:
        """The sequence number of the oldest entry still pending (None: nothing is)."""
        return min((s.pending[0].seq for s in self._open.values() if s.pending), default=None)

    def tail_locked(self, seg: OpenSegment | None) -> tuple[LogMessageId | None, bool]:
        """The log's last entry as a new entry of `seg` would follow it: the last entry given an
        id, acknowledged or pending (None: the log holds none), and whether it is settled for
        that new entry. It is unless it is pending in another segment than `seg`: entries of one
        segment land as a prefix (a completion keeps entries up to its end), so a predecessor
        pending in `seg` is in the log whenever the new entry is; one pending in an older
        segment may be dropped by that segment's completion while `seg` keeps the new entry."""
        tail = self.last_completed
        settled = True
        for s in self._open.values():
            if s.next_entry_id:
                last = LogMessageId(s.segment_id, s.next_entry_id - 1)
                if tail is None or last > tail:
                    tail = last
                    settled = s is seg or not s.pending
        return tail, settled

    def waiters_locked(self) -> Iterator[tuple[Waiter, int, int]]:
        """(waiter, segment id, entry id) of every pending entry (a close or a fence fails them)."""
        for seg in self._open.values():
            for entry in seg.pending:
                for f, _ in entry.waiters():
                    yield f, seg.segment_id, entry.entry_id

    def open_locked(self) -> OpenSegment:
        """Open the next segment of the log and make it the current one (at open, at a roll and
        after a repair). Raises what the metadata store raises."""
        return self._install_locked(
            self._next_segment(self._failed_nodes_locked(), set(self._open))
        )

    def _install_locked(self, meta: SegmentMeta) -> OpenSegment:
        """`meta`, created in the metadata store, becomes the current segment."""
        handle = OpenSegment(meta, time.monotonic())
        self._open[meta.segment_id] = handle
        self.last_opened = max(self.last_opened, meta.segment_id)
        self.current = handle
        return handle

    def _failed_nodes_locked(self) -> set[str]:
        """Nodes that failed in this writer's segments still open (the current one, a rolled
        one draining, one being repaired) or in the last one completed: a new segment avoids
        them while others are live."""
        failed = set(self._failed_in_last)
        for seg in self._open.values():
            failed |= seg.failed_nodes.keys()
        return failed

    def forget_locked(self, seg: OpenSegment, last_entry_id: int) -> None:
        """`seg` is completed at `last_entry_id`: it has nothing pending and is no longer this
        writer's to send."""
        self._open.pop(seg.segment_id, None)
        self._ensemble.tails.completed(self._log_id, seg.segment_id)
        if last_entry_id >= 0:
            end = LogMessageId(seg.segment_id, last_entry_id)
            if self.last_completed is None or end > self.last_completed:
                self.last_completed = end
        self._failed_in_last = set(seg.failed_nodes)  # a repaired segment's successor avoids them

    def drop_current_locked(self, seg: OpenSegment) -> None:
        """`seg` lost its ack quorum: if it is the current segment, writes stop going to it."""
        if self.current is seg:
            self.current = None

    def replace_current_locked(self) -> None:
        """After a repair: open the next segment if there is no current one (and still open)."""
        if self.current is None and not self._pipeline.stopped:
            self.open_locked()

    # --- the roll rule -------------------------------------------------------------------------

    def _failed_roll_locked(self, segment_id: int, now: float, exc: Exception) -> None:
        self._retry_at = now + self._backoff.next_delay()
        self._pipeline.metrics["background_retries"] += 1
        log.warning(
            "log %s: could not roll segment %s (writes go on in it, retried in %.2f s): %s",
            self._log_id,
            segment_id,
            self._retry_at - now,
            exc,
        )

    def _prepare_next(self, segment_id: int) -> None:
        """Maintenance, after a failed roll: make the next segment with the writer's lock
        released (the metadata calls may wait for their timeout); the next roll takes it."""
        pipeline = self._pipeline
        with pipeline.lock:
            if pipeline.stopped:
                return
            exclude, open_ids = self._failed_nodes_locked(), set(self._open)
        try:
            meta = self._next_segment(exclude, open_ids)
        except WriterFencedError as exc:
            pipeline.fence(exc)
            return
        except Exception as exc:  # noqa: BLE001 - retried at a later roll, after the backoff
            with pipeline.lock:
                self._preparing = False
                self._failed_roll_locked(segment_id, time.monotonic(), exc)
            return
        with pipeline.lock:
            self._preparing = False
            self._prepared = meta

    def _needs_roll(self, seg: OpenSegment, now: float) -> bool:
        """`seg` is full or old (`now`: time.monotonic()). On the write path: kept flat."""
        return (
            seg.next_entry_id >= self._max_entries
            or seg.size_bytes >= self._max_bytes
            or now - seg.created >= self._max_age_s
        )

    def _next_segment(self, exclude: set[str], open_ids: set[int]) -> SegmentMeta:
        """The next segment of the log, ACTIVE in the metadata store, placed avoiding `exclude`
        while others are live (`open_ids`: the segments this writer has handles for). Raises
        what the metadata store raises (`WriterFencedError` included). Needs no lock."""
        pipeline = self._pipeline
        existing = self._meta.list_segments(self._log_id)
        last = existing[-1] if existing else None
        segment_id = (last.segment_id + 1) if last else 0
        es = self._es
        if last and last.state is SegmentState.ACTIVE and last.segment_id not in open_ids:
            # An ACTIVE segment this writer has no handle for: its own create whose answer was
            # lost (a metadata timeout). Only the current epoch can create one, so if this writer
            # still holds it, the segment is its own, and empty: adopt it, or readers would wait
            # at it for good. (A WriterFencedError is handled by the caller.)
            self._meta.check_epoch(self._log_id, pipeline.epoch)
            return last
        return self._meta.create_segment(
            pipeline.epoch,
            SegmentMeta(
                log_id=self._log_id,
                segment_id=segment_id,
                state=SegmentState.ACTIVE,
                nodes=self._ensemble.new_ensemble(es, segment_id, exclude),
                es=es,
                wq=es,
                aq=es // 2 + 1,
                created_ms=pipeline.clock.now_ms(),
            ),
        )

    def _roll_locked(self, seg: OpenSegment) -> OpenSegment:
        """`seg`, the current segment, is full or old (`_needs_roll`): the segment writes go to
        now, the next one, or `seg` while the next cannot be opened (retried with backoff); `seg`
        completes once drained. A roll refused because another writer took the log over fences
        this writer (`WriterFencedError` raised)."""
        pipeline = self._pipeline
        now = time.monotonic()
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared.segment_id > self.last_opened:
            new = self._install_locked(prepared)
        elif self._roll_failed:
            # writes go on in `seg` while the next segment is made in the background
            if now >= self._retry_at and not self._preparing:
                self._preparing = True
                self._maint.submit(self._prepare_next, seg.segment_id)
            return seg
        else:
            try:
                new = self.open_locked()
            except WriterFencedError as exc:
                self._maint.submit(resolve, pipeline.fence_locked(exc))  # not under the lock
                raise
            except Exception as exc:
                self._roll_failed = True
                self._failed_roll_locked(seg.segment_id, now, exc)
                return seg
        self._roll_failed = False
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        seg.status = SegmentStatus.ROLLED
        if seg.drained():
            pipeline.complete_if_drained_locked(seg)
        else:
            self._dispatch.send_locked(seg)  # its held entries need not wait for company any more
        pipeline.metrics["segments_rolled"] += 1
        return new
