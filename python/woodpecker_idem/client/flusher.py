"""The writer's flusher thread: the slow, periodic side of writing. Batches are cut on the write
and ack paths (group commit, see `Dispatch.send_locked`); this thread fails waiters past their
deadline (their entries stay pending), keeps readers' LAC fresh, completes drained rolled
segments, renews the lease, and is the safety net that sends or admits anything left waiting.
It works on its writer only through `FlusherCore` (public names)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from ..errors import WriteTimeoutError
from .dispatch import Dispatch
from .hooks import Outcomes
from .segment import PendingEntry, SegmentHandle, SegmentStatus, Waiter
from .workers import Maintenance, resolve

if TYPE_CHECKING:
    from .segments import OpenSegments

LEASE_RENEW_EVERY_S = 10.0
TICK_S = 0.05

log = logging.getLogger(__name__)


class FlusherCore(Protocol):
    """What the flusher uses of its writer (`LogWriter` implements it; see there)."""

    log_id: int
    lock: threading.Lock
    timeout_s: float  # append.timeout_ms in seconds: a waiter's deadline
    segments: OpenSegments

    @property
    def stopped(self) -> bool: ...

    def admit_queued_locked(self) -> tuple[Outcomes, float | None]: ...

    def complete_if_drained_locked(self, seg: SegmentHandle) -> None: ...

    def renew_lease(self) -> None: ...


class Flusher:
    """`dispatch`: the writer's group commit and node senders; `wake`: the condition (on the
    writer's lock) the writer notifies when there is work; `maint`: where the lease renewal runs
    (off this thread)."""

    def __init__(
        self,
        writer: FlusherCore,
        dispatch: Dispatch,
        wake: threading.Condition,
        maint: Maintenance,
    ):
        self.writer = writer
        self.dispatch = dispatch
        self.wake = wake
        self.maint = maint
        self.lease_renewed = time.monotonic()
        self.thread = threading.Thread(
            target=self.run, name=f"wp-flush-{writer.log_id}", daemon=True
        )
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def run(self) -> None:
        w = self.writer
        dispatch = self.dispatch
        while True:
            lac_only: list[SegmentHandle] = []
            expired: list[tuple[Waiter, object]] = []
            admitted: Outcomes = []
            with w.lock:
                if w.stopped:
                    return
                now = time.monotonic()
                wait = TICK_S
                try:
                    admitted, due = w.admit_queued_locked()
                    if due is not None:
                        wait = min(wait, due)
                except Exception:  # a bug must not stop the flusher (and hang every call)
                    log.exception("log %s: admitting queued writes failed", w.log_id)
                for seg in w.segments.all_locked():
                    if seg.status in (SegmentStatus.OPEN, SegmentStatus.ROLLED):
                        dispatch.send_locked(seg)
                        due = dispatch.send_due(seg, now)
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
                    w.complete_if_drained_locked(seg)
                if now - self.lease_renewed > LEASE_RENEW_EVERY_S:
                    self.lease_renewed = now
                    self.maint.submit(w.renew_lease)
                if not lac_only and not expired and not admitted:
                    self.wake.wait(max(wait, 0.0005))
                    continue
                for seg in lac_only:
                    dispatch.send_lac_locked(seg)
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
                    f"by {seg.aq} nodes within {w.timeout_s:g} s; it stays pending and is retried"
                )
                expired.extend((f, exc) for f in _take_waiters(entry))


def _take_waiters(entry: PendingEntry) -> list[Waiter]:
    """The entry's waiting futures, detached (a later commit has nobody left to tell)."""
    futures = [f for f, _ in entry.waiters()]
    entry.future = None
    entry.joiners = None
    return futures
