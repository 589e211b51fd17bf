"""The writer's flusher thread: cuts batches (size or linger), hands them to the node senders,
fails waiters past their deadline (their entries stay pending), and keeps readers' LAC fresh."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..errors import WriteTimeoutError
from .segment import Batch, PendingEntry, SegmentHandle, SegmentStatus

if TYPE_CHECKING:
    from .writer import LogWriter

LEASE_RENEW_EVERY_S = 10.0

log = logging.getLogger(__name__)


class Flusher:
    def __init__(self, writer: LogWriter):
        self.writer = writer
        self.lease_renewed = time.monotonic()
        self.thread = threading.Thread(
            target=self.run, name=f"wp-flush-{writer.log_id}", daemon=True
        )
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def run(self) -> None:
        w = self.writer
        while True:
            intake_due = None
            if w._intake:
                try:
                    intake_due = w._process_intake()
                except Exception:  # a bug must not stop batching (and hang every writer call)
                    log.exception("log %s: admitting queued writes failed", w.log_id)
            sends: list[tuple[SegmentHandle, Batch | None]] = []
            expired: list[tuple[Future, BaseException]] = []
            with w._lock:
                if w._closed or w._fenced is not None:
                    return
                now = time.monotonic()
                wait = 0.05
                for seg in list(w._segments.values()):
                    if seg.status in (SegmentStatus.OPEN, SegmentStatus.ROLLED):
                        wait = min(wait, self._cut_batches_locked(seg, now, sends))
                        if (
                            seg.aq > 1
                            and not seg.unsent
                            and not seg.batches
                            and seg.lac > seg.lac_sent
                        ):
                            sends.append((seg, None))  # LAC-only update for tail readers
                            seg.lac_sent = seg.lac
                    self._expire_locked(seg, now, expired)
                    if seg.status is SegmentStatus.ROLLED and seg.drained():
                        seg.status = SegmentStatus.DONE
                        w._maint.submit(w._complete_drained, seg)
                if now - self.lease_renewed > LEASE_RENEW_EVERY_S:
                    self.lease_renewed = now
                    w._maint.submit(w._renew_lease)
                if not sends and not expired:
                    w._wake.wait(wait if intake_due is None else min(wait, intake_due))
                    continue
            for seg, batch in sends:
                for node in seg.meta.nodes:
                    if node in seg.failed_nodes:
                        if batch is not None:
                            batch.failed.add(node)
                    else:
                        w._workers[node].submit(seg, batch)
            for future, exc in expired:
                if not future.done():
                    future.set_exception(exc)

    def _cut_batches_locked(self, seg: SegmentHandle, now: float, sends: list) -> float:
        """Move full or lingered entries into batches; returns how long until the next is due.

        A lingered (not full) batch also waits while an earlier batch of the segment is in
        flight: commits go in entry order and each node stores batches one at a time, so sending
        it early gains nothing, while waiting lets it fill (fewer, larger durable puts under load).
        The ack of the batch in flight wakes the flusher.
        """
        w = self.writer
        while seg.unsent:
            full = len(seg.unsent) >= w._max_batch_entries or seg.unsent_bytes >= w._max_batch_bytes
            if not full and seg.status is SegmentStatus.OPEN:
                due = seg.unsent_since + w._linger_s - now
                if due > 0:
                    return due
                if seg.batches:
                    return 0.05  # held until the ack (which notifies)
            sends.append((seg, seg.take_batch(w._max_batch_entries, w._max_batch_bytes)))
            if seg.lac > seg.lac_sent:
                seg.lac_sent = seg.lac
            if seg.unsent:
                seg.unsent_since = now
        return 0.05

    def _expire_locked(self, seg: SegmentHandle, now: float, expired: list) -> None:
        """Fail waiters past their deadline (the entries stay pending), in any segment state."""
        w = self.writer
        for entry in seg.pending:
            if entry.deadline > now:
                break
            if not entry.timed_out:
                entry.timed_out = True
                exc = WriteTimeoutError(
                    f"entry {seg.segment_id}:{entry.entry_id} of log {w.log_id} not acknowledged "
                    f"by {seg.aq} nodes within {w._timeout_s:g} s; it stays pending and is retried"
                )
                expired.extend((f, exc) for f in _take_waiters(entry))


def _take_waiters(entry: PendingEntry) -> list[Future]:
    """The entry's waiting futures, detached (a later commit has nobody left to tell)."""
    futures = [f for f, _ in entry.waiters()]
    entry.future = None
    entry.joiners = None
    return futures
