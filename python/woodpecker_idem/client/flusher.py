"""The writer's flusher thread: the slow, periodic side of writing. Batches are cut on the write
and ack paths (group commit, see `LogWriter._send_locked`); this thread fails waiters past their
deadline (their entries stay pending), keeps readers' LAC fresh, completes drained rolled
segments, renews the lease, and is the safety net that sends or admits anything left waiting."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..errors import WriteTimeoutError
from .segment import PendingEntry, SegmentHandle, SegmentStatus, Waiter
from .workers import resolve

if TYPE_CHECKING:
    from .writer import LogWriter

LEASE_RENEW_EVERY_S = 10.0
TICK_S = 0.05

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
            lac_only: list[SegmentHandle] = []
            expired: list[tuple[Waiter, object]] = []
            admitted: list = []
            with w._lock:
                if w._closed or w._fenced is not None:
                    return
                now = time.monotonic()
                wait = TICK_S
                if w._hooks.queued():
                    try:
                        admitted, due = w._hooks.admit_locked(w.idle_locked())
                        if due is not None:
                            wait = min(wait, due)
                    except Exception:  # a bug must not stop the flusher (and hang every call)
                        log.exception("log %s: admitting queued writes failed", w.log_id)
                for seg in list(w._segments.values()):
                    if seg.status in (SegmentStatus.OPEN, SegmentStatus.ROLLED):
                        w._send_locked(seg)
                        due = w._send_due(seg, now)
                        if due is not None:
                            wait = min(wait, due)
                        if (
                            seg.aq > 1
                            and not seg.unsent
                            and not seg.batches
                            and seg.lac > seg.lac_sent
                        ):
                            lac_only.append(seg)  # LAC-only update for tail readers
                            seg.lac_sent = seg.lac
                    self._expire_locked(seg, now, expired)
                    if seg.status is SegmentStatus.ROLLED and seg.drained():
                        seg.status = SegmentStatus.DONE
                        w._maint.submit(w._complete_drained, seg)
                if now - self.lease_renewed > LEASE_RENEW_EVERY_S:
                    self.lease_renewed = now
                    w._maint.submit(w._renew_lease)
                if not lac_only and not expired and not admitted:
                    w._wake.wait(max(wait, 0.0005))
                    continue
                for seg in lac_only:
                    for node in seg.live_nodes():
                        w._workers[node].submit(seg, None)
            resolve(expired)
            resolve(admitted)

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


def _take_waiters(entry: PendingEntry) -> list[Waiter]:
    """The entry's waiting futures, detached (a later commit has nobody left to tell)."""
    futures = [f for f, _ in entry.waiters()]
    entry.future = None
    entry.joiners = None
    return futures
