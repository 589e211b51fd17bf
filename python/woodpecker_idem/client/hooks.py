"""The writer core's hook protocol: how a layer above a `LogWriter` (the idempotent writer) learns
what happens to entries and segments, and feeds its queued writes in, without touching the core's
private state (as Woodpecker's idempotentWriterImpl wraps a LogWriter).

The core calls every hook; the layer calls back only the core's package API (`LogWriter.lock`,
`check_open_locked`, `inflight.enqueue_run_locked`, ... documented there). `_locked` hooks run
with the core's lock held and must not block or call out; outcomes they return are set by the
core after it releases the lock.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import WriterFencedError
from .segment import PendingEntry, Waiter

# (future, WriteResult or exception): set after the lock is released (`workers.resolve`)
Outcomes = list[tuple[Waiter, object]]


class WriterHooks(Protocol):
    """What a layer over the writer core implements; `NoHooks` is the plain writer's."""

    def taken_over(self) -> None:
        """Opening: the previous writers' segments are completed, no segment is open yet and no
        write is accepted (the idempotent writer rebuilds its window here). No lock held."""

    def queued(self) -> int:
        """How many accepted writes the layer holds that have no entry yet (lock held)."""

    def admit_locked(self, idle: bool) -> tuple[Outcomes, float | None]:
        """Turn queued writes into entries (via `InFlight.enqueue_run_locked`) if the current
        segment is `idle` (nothing in flight) or they are due; returns the outcomes and the
        seconds until the rest are due (None: nothing queued)."""

    def committed_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        """`entries` of `segment_id` reached aq, in entry order."""

    def dropped_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        """`entries` are not in `segment_id`, which was completed without them."""

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        """`segment_id` of this log is completed at `last_entry_id`."""

    def fenced_locked(self, exc: WriterFencedError) -> Outcomes:
        """Another writer took the log over: fail what the layer holds (its queued writes)."""

    def closing(self) -> None:
        """`close()` began (lock not held): queue nothing more, admit what is queued."""

    def closed(self) -> None:
        """`close()` ended (fenced or not; lock not held): fail what is left, stop threads."""


class NoHooks:
    """The plain writer: no queued writes, nothing to tell."""

    def taken_over(self) -> None:
        pass

    def queued(self) -> int:
        return 0

    def admit_locked(self, idle: bool) -> tuple[Outcomes, float | None]:
        return [], None

    def committed_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        pass

    def dropped_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        pass

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        pass

    def fenced_locked(self, exc: WriterFencedError) -> Outcomes:
        return []

    def closing(self) -> None:
        pass

    def closed(self) -> None:
        pass


NO_HOOKS = NoHooks()
