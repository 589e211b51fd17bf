"""Entries in flight: given ids and pending, not yet committed.

Every entry a writer makes comes in through `InFlight.enqueue_run_locked` (a run of entries with one
frame and one waiter, sent per group commit) and leaves through `commit_locked` (its outcomes) or
`release_locked` (dropped with its segment). In between it counts against
`append.max_inflight_entries` / `max_inflight_bytes`: `full_locked` and `wait_for_room_locked` are
the writer's backpressure, and `space` is the condition that waits for room, flush and close sleep
on. Every method runs with the writer's lock held (`space` is a condition on it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..types import LogMessageId, WriteResult
from .interrupts import HOLD_INTERRUPTS
from .segment import PendingEntry, span

if TYPE_CHECKING:
    from ..config import Section
    from .hooks import Outcomes
    from .segment import SegmentHandle, Waiter


class InFlight:
    """The writer's entries from enqueue to commit, and what they count against its limits."""

    def __init__(
        self,
        lock: threading.Lock,
        append: Section,
        send_locked: Callable[[SegmentHandle], None],
        committed_locked: Callable[[int, list[PendingEntry]], None],
    ):
        self.space = threading.Condition(lock)
        self.seq = 0  # the newest run's sequence number: flush waits for the runs up to it
        self.entries = 0
        self.nbytes = 0
        self._max_entries = append.max_inflight_entries
        self._max_bytes = append.max_inflight_bytes
        self._batch_entries = append.max_batch_entries
        self._batch_bytes = append.max_batch_bytes
        self._timeout_s = append.timeout_ms / 1000
        self._send_locked = send_locked  # group commit (`Dispatch.send_locked`)
        self._committed_locked = committed_locked  # `WriterHooks.committed_locked`

    def enqueue_run_locked(
        self, seg: SegmentHandle, frame: bytes, count: int, waiter: Waiter, since: float
    ) -> None:
        """The one enqueue path of every write: `count` entries from `seg.next_entry_id` on,
        encoded in one `frame`, pending as one run with one `waiter` (told once for all of them,
        with the first entry's id; a `RunWaiter` when `count` > 1), sent per group commit. The
        caller keeps the run within `OpenSegments.run_end_locked`, so a run is never cut into two
        batches. `since`: when the oldest was queued (time.monotonic())."""
        with HOLD_INTERRUPTS:  # in every list, or in none
            self.seq += 1
            deadline = time.monotonic() + self._timeout_s
            run = PendingEntry(self.seq, seg.segment_id, seg.next_entry_id, frame, waiter, deadline)
            run.count = count
            was_empty = not seg.unsent
            seg.pending.append(run)
            seg.unsent.append(run)
            seg.by_entry[run.entry_id] = run
            nbytes = len(frame)
            seg.next_entry_id += count
            seg.unsent_bytes += nbytes
            seg.unsent_entries += count
            seg.size_bytes += nbytes
            self.entries += count
            self.nbytes += nbytes
            if was_empty:
                seg.unsent_since = since
            if (
                not seg.batches
                or seg.unsent_entries >= self._batch_entries
                or seg.unsent_bytes >= self._batch_bytes
            ):
                self._send_locked(seg)

    def full_locked(self, size: int, entries: int = 1) -> bool:
        """Would `size` more bytes in `entries` more entries pass the in-flight limits?"""
        return self.entries + entries > self._max_entries or self.nbytes + size > self._max_bytes

    def wait_for_room_locked(self, size: int, entries: int, stopped: Callable[[], bool]) -> None:
        """Block until there is room for `entries` more entries of `size` bytes, nothing is in
        flight (a write larger than the limits still goes, alone), or `stopped()`."""
        while self.full_locked(size, entries) and self.entries and not stopped():
            self.space.wait(0.1)

    def release_locked(self, entries: int, nbytes: int) -> None:
        """Stop counting entries that left without a commit (dropped with their segment)."""
        self.entries -= entries
        self.nbytes -= nbytes
        self.space.notify_all()

    def commit_locked(self, seg: SegmentHandle, committed: list[PendingEntry]) -> Outcomes:
        """`committed` (in entry order) reached aq: tell the hooks, free their room; returns
        their outcomes (set after the lock is released)."""
        self._committed_locked(seg.segment_id, committed)
        resolved: Outcomes = []
        nbytes = 0
        for entry in committed:
            nbytes += len(entry.record)
            mid = LogMessageId(seg.segment_id, entry.entry_id)
            if entry.future is not None:
                resolved.append((entry.future, WriteResult(mid, False)))
            if entry.joiners:
                resolved.extend((f, WriteResult(mid, True)) for f in entry.joiners)
        self.release_locked(span(committed), nbytes)
        return resolved
