"""The writer's open segments: the ones not completed yet, the current one (where writes go), and
the roll rule: where the next segment comes from (created in the metadata store, or adopted if it is
this writer's own whose create answer was lost) and when the current one is full or old
(segment.max_entries, segment.max_size_bytes, segment.max_interval_s).

The segment limits are targets, not bounds: if the metadata store cannot create the next segment,
writes go on in the current one and the roll is retried with backoff, so a metadata outage never
stops writes. `OpenSegments` works on its writer only through `RollCore` (public names); the
writer's parts and the layer above reach it as `LogWriter.segments`. Every `_locked` method needs
the writer's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ..errors import WriterFencedError
from ..meta.base import SegmentMeta
from ..retry import Backoff
from ..types import SegmentState
from .completion import RETRY_INITIAL_S, RETRY_MAX_S
from .hooks import Outcomes
from .recovery import choose_nodes
from .rows import chunk_end
from .segment import EntryJoiner, SegmentHandle, SegmentStatus, Waiter
from .workers import Maintenance, resolve

if TYPE_CHECKING:
    from ..clock import Clock
    from ..config import Config
    from ..logstore.transport import LogStoreTransport
    from ..meta import MetadataStore
    from .dispatch import Dispatch

log = logging.getLogger(__name__)


class RollCore(Protocol):
    """What `OpenSegments` uses of its writer (`LogWriter` implements it; see there)."""

    log_id: int
    epoch: int
    clock: Clock
    metrics: dict[str, float]

    @property
    def stopped(self) -> bool: ...

    def fence_locked(self, exc: WriterFencedError) -> Outcomes: ...

    def complete_if_drained_locked(self, seg: SegmentHandle) -> None: ...


class OpenSegments:
    """One writer's segments not completed yet, oldest first; the current one; the roll rule, and
    its backoff after a refused roll."""

    def __init__(
        self,
        core: RollCore,
        cfg: Config,
        *,
        meta: MetadataStore,
        transport: LogStoreTransport,
        dispatch: Dispatch,
        maint: Maintenance,
    ):
        self._core = core
        self._meta = meta
        self._transport = transport
        self._dispatch = dispatch
        self._maint = maint
        self._log_id = core.log_id
        self._es = cfg.quorum.es
        self._max_entries = cfg.segment.max_entries
        self._max_bytes = cfg.segment.max_size_bytes
        self._max_age_s = cfg.segment.max_interval_s
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        self._retry_at = 0.0  # after a failed roll: not retried before this (monotonic)
        self._batch_entries = cfg.append.max_batch_entries
        self._batch_bytes = cfg.append.max_batch_bytes
        self._timeout_s = cfg.append.timeout_ms / 1000  # a waiter's deadline
        self._open: dict[int, SegmentHandle] = {}
        self.last_opened = -1  # the newest segment this writer has had a handle for
        self.current: SegmentHandle | None = None  # None while a repair replaces it

    # --- where writes go (the write path) ------------------------------------------------------

    def writable_locked(self) -> SegmentHandle | None:
        """The current segment, rolled first if it is full or old; None while a repair replaces
        it. A roll refused because another writer took the log over fences the writer (every
        pending write fails with `WriterFencedError`)."""
        seg = self.current
        if seg is None:
            return None
        return self._roll_locked(seg) if self._needs_roll(seg, time.monotonic()) else seg

    def run_end_locked(self, seg: SegmentHandle, payloads: list[bytes], start: int, n: int) -> int:
        """Where the run of rows from `start` (of `n`) ends: one AddEntries batch
        (append.max_batch_entries / max_batch_bytes, a payload counting ROW_OVERHEAD more) within
        `seg`'s roll limits. A segment past them (it could not be rolled) takes one batch more."""
        room, room_bytes = self._max_entries - seg.next_entry_id, self._max_bytes - seg.size_bytes
        if room <= 0 or room_bytes <= 0:
            room, room_bytes = n, self._batch_bytes
        end = min(n, start + room, start + self._batch_entries)
        return chunk_end(payloads, start, end, min(room_bytes, self._batch_bytes))[1]

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

    def all_locked(self) -> list[SegmentHandle]:
        """The segments not completed yet, oldest first."""
        return list(self._open.values())

    def lacs_locked(self) -> dict[int, int]:
        """The LAC of every segment not completed yet (what a snapshot may cover of them)."""
        return {seg.segment_id: seg.lac for seg in self._open.values()}

    def oldest_pending_seq_locked(self) -> int | None:
        """The sequence number of the oldest entry still pending (None: nothing is)."""
        return min((s.pending[0].seq for s in self._open.values() if s.pending), default=None)

    def waiters_locked(self) -> Iterator[tuple[Waiter, int, int]]:
        """(waiter, segment id, entry id) of every pending entry (a close or a fence fails them)."""
        for seg in self._open.values():
            for entry in seg.pending:
                for f, _ in entry.waiters():
                    yield f, seg.segment_id, entry.entry_id

    def open_locked(self) -> SegmentHandle:
        """Open the next segment of the log and make it the current one (at open, at a roll and
        after a repair). Raises what the metadata store raises."""
        meta = self._next_segment_locked()
        handle = SegmentHandle(meta, time.monotonic())
        self._open[meta.segment_id] = handle
        self.last_opened = max(self.last_opened, meta.segment_id)
        self.current = handle
        self._dispatch.add_nodes(meta.nodes)
        return handle

    def forget_locked(self, seg: SegmentHandle) -> None:
        """`seg` is completed: it has nothing pending and is no longer this writer's to send."""
        self._open.pop(seg.segment_id, None)

    def drop_current_locked(self, seg: SegmentHandle) -> None:
        """`seg` lost its ack quorum: if it is the current segment, writes stop going to it."""
        if self.current is seg:
            self.current = None

    def replace_current_locked(self) -> None:
        """After a repair: open the next segment if there is no current one (and still open)."""
        if self.current is None and not self._core.stopped:
            self.open_locked()

    # --- the roll rule -------------------------------------------------------------------------

    def _needs_roll(self, seg: SegmentHandle, now: float) -> bool:
        """`seg` is full or old (`now`: time.monotonic()). On the write path: kept flat."""
        return (
            seg.next_entry_id >= self._max_entries
            or seg.size_bytes >= self._max_bytes
            or now - seg.created >= self._max_age_s
        )

    def _next_segment_locked(self) -> SegmentMeta:
        """The next segment of the log, ACTIVE in the metadata store. Raises what the metadata
        store raises (`WriterFencedError` included)."""
        core = self._core
        existing = self._meta.list_segments(self._log_id)
        last = existing[-1] if existing else None
        segment_id = (last.segment_id + 1) if last else 0
        es = self._es
        if last and last.state is SegmentState.ACTIVE and last.segment_id not in self._open:
            # An ACTIVE segment this writer has no handle for: its own create whose answer was
            # lost (a metadata timeout). Only the current epoch can create one, so if this writer
            # still holds it, the segment is its own, and empty: adopt it, or readers would wait
            # at it for good. (A WriterFencedError is handled by the caller.)
            self._meta.check_epoch(self._log_id, core.epoch)
            return last
        return self._meta.create_segment(
            core.epoch,
            SegmentMeta(
                log_id=self._log_id,
                segment_id=segment_id,
                state=SegmentState.ACTIVE,
                nodes=choose_nodes(self._transport.node_ids, es, segment_id),
                es=es,
                wq=es,
                aq=es // 2 + 1,
                created_ms=core.clock.now_ms(),
            ),
        )

    def _roll_locked(self, seg: SegmentHandle) -> SegmentHandle:
        """`seg`, the current segment, is full or old (`_needs_roll`): the segment writes go to
        now, the next one, or `seg` while the next cannot be opened (retried with backoff); `seg`
        completes once drained. A roll refused because another writer took the log over fences
        this writer (`WriterFencedError` raised)."""
        core = self._core
        now = time.monotonic()
        if now < self._retry_at:
            return seg
        try:
            new = self.open_locked()
        except WriterFencedError as exc:
            self._maint.submit(resolve, core.fence_locked(exc))  # not under the lock
            raise
        except Exception as exc:
            self._retry_at = now + self._backoff.next_delay()
            core.metrics["background_retries"] += 1
            log.warning(
                "log %s: could not roll segment %s (writes go on in it, retried in %.2f s): %s",
                self._log_id,
                seg.segment_id,
                self._retry_at - now,
                exc,
            )
            return seg
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        seg.status = SegmentStatus.ROLLED
        if seg.drained():
            core.complete_if_drained_locked(seg)
        else:
            self._dispatch.send_locked(seg)  # its held entries need not wait for company any more
        core.metrics["segments_rolled"] += 1
        return new
