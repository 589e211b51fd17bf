"""The plain writer's queued writes: accepted, not given ids yet.

`LogWriter.write_async` queues a write here (payload, properties, future, queueing time) and does
nothing more; `WriteQueue` turns queued writes into entries in runs, one encoding call, one
pending run and one waiter (`FutureRun`) per AddEntries batch: at once when nothing of the current
segment is in flight (a lone write is sent at once), else when the batch in flight is acknowledged
(group commit), when a full batch is queued, or after `append.linger_ms` (the flusher), and on
flush. That leaves four list appends per write on the caller's thread, and no object per entry.
The layer above queues writes of its own; the queue asks it to admit them at the same moments
(`WriterHooks.admit_locked`). Every method is called with the writer's lock held.
"""

from __future__ import annotations

import time
from array import array
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from .._core import encode_frame
from ..errors import WoodpeckerError
from .futures import FutureRun
from .interrupts import HOLD_INTERRUPTS
from .rows import ROW_OVERHEAD

if TYPE_CHECKING:
    from ..clock import Clock
    from .hooks import Outcomes, WriterHooks
    from .inflight import InFlight
    from .segment import Waiter
    from .segments import OpenSegments

# Queueing times: C long where it is 64-bit (appending an int to it is cheaper than to 'q')
TIMESTAMP_TYPECODE = "l" if array("l").itemsize == 8 else "q"


class QueueCore(Protocol):
    """What the queue uses of its writer (`LogWriter`'s layer API)."""

    clock: Clock
    max_batch_entries: int
    max_batch_bytes: int
    linger_s: float
    inflight: InFlight
    segments: OpenSegments

    def check_open_locked(self) -> None: ...
    def wait_for_room_locked(self, size: int, entries: int = 1) -> None: ...
    def wake_locked(self) -> None: ...
    def unavailable_error(self) -> WoodpeckerError: ...


class WriteQueue:
    """A FIFO of queued writes, one column per field, and their admission."""

    __slots__ = (
        "_core",
        "_hooks",
        "_payloads",
        "_properties",
        "_futures",
        "_timestamps",
        "nbytes",
        "since",
    )

    def __init__(self, core: QueueCore, hooks: WriterHooks) -> None:
        self._core = core
        self._hooks = hooks  # the layer above queues writes of its own (`WriterHooks.queued`)
        self._payloads: list[bytes] = []
        self._properties: list[dict | None] = []
        self._futures: list[Future] = []
        self._timestamps = array(TIMESTAMP_TYPECODE)
        self.nbytes = 0  # what the queued writes count against append.max_inflight_bytes
        self.since = 0.0  # time.monotonic() when the oldest was queued

    def __len__(self) -> int:
        return len(self._futures)

    def queue_locked(self, payload: bytes, props: dict | None, future: Future) -> Outcomes:
        """Queue a write; it becomes an entry at once if nothing is in flight, or with the writes
        queued behind it once a batch of them is full or the batch in flight is acknowledged.
        Returns the outcomes to set after the lock (of writes that failed)."""
        core = self._core
        size = len(payload) + ROW_OVERHEAD
        failed: Outcomes = []
        # the queued writes count against the in-flight limits with this one
        if core.inflight.full_locked(size + self.nbytes, len(self._futures) + 1):
            if self._futures:  # room comes from commits: queued writes must be entries first
                failed = self.admit_locked()
            core.wait_for_room_locked(size)  # raises once closed or fenced
        futures = self._futures
        if not futures:
            self.since = time.monotonic()
        self._timestamps.append(core.clock.now_ms())
        self._payloads.append(payload)
        self._properties.append(props)
        self.nbytes += size
        futures.append(future)  # last: a write cut short before this is not queued (`_take`)
        n = len(futures)
        if n >= core.max_batch_entries or self.nbytes >= core.max_batch_bytes:
            return failed + self.admit_locked()
        if n == 1:
            if core.segments.idle_locked():  # nothing in flight: no company worth waiting for
                return failed + self.admit_locked()
            core.wake_locked()  # the flusher admits it after linger_ms unless an ack comes first
        return failed

    def due_locked(self, now: float) -> float | None:
        """Seconds until the queued writes are due (<= 0: now), None if nothing is queued."""
        return self.since + self._core.linger_s - now if self._futures else None

    def admit_due_locked(self) -> tuple[Outcomes, float | None]:
        """Turn queued writes (these and the layer's above, `WriterHooks.admit_locked`) into
        entries if nothing is in flight or the oldest has waited linger_ms; returns their
        outcomes and the seconds until the rest are due (None: nothing queued)."""
        failed: Outcomes = []
        due = self.due_locked(time.monotonic())
        if due is not None and (due <= 0 or self._core.segments.idle_locked()):
            failed, due = self.admit_locked(), None
        if not self._hooks.queued():
            return failed, due
        admitted, layer_due = self._hooks.admit_locked(self._core.segments.idle_locked())
        if layer_due is not None:
            due = layer_due if due is None else min(due, layer_due)
        return failed + admitted, due

    def admit_acked_locked(self) -> Outcomes:
        """A batch was acknowledged: the writes queued while it was in flight (these and the
        layer's) become entries now (group commit); returns the outcomes of those that failed."""
        failed = self.admit_locked() if self._futures else []
        if self._hooks.queued():
            failed.extend(self._hooks.admit_locked(self._core.segments.idle_locked())[0])
        return failed

    def admit_locked(self) -> Outcomes:
        """Turn every queued write into entries, in runs of one AddEntries batch each (one
        encoding call and one waiter per run); returns the outcomes of writes that failed."""
        core = self._core
        with HOLD_INTERRUPTS:  # taken off the queue and made entries, or neither
            payloads, properties, futures, timestamps = self._take()
            try:
                core.check_open_locked()
            except WoodpeckerError as exc:  # fenced or closed: nobody will send them
                return [(f, exc) for f in futures]
            n = len(futures)
            start = 0
            while start < n:
                try:  # a roll that failed (fenced, metadata unreachable) or any error before
                    # the run is queued ends the writes not queued yet, with that error
                    seg = core.segments.writable_locked()
                    if seg is None:  # a repair replaces the segment: new writes fail fast
                        raise core.unavailable_error()
                    end = core.segments.run_end_locked(seg, payloads, start, n)
                    frame, count = encode_frame(
                        seg.segment_id,
                        seg.next_entry_id,
                        timestamps,
                        payloads,
                        start,
                        end,
                        properties=properties,
                    )
                except Exception as exc:  # noqa: BLE001 - set on their futures
                    return [(f, exc) for f in futures[start:]]
                waiter: Waiter = futures[start] if count == 1 else FutureRun(futures[start:end])
                core.inflight.enqueue_run_locked(seg, frame, count, waiter, self.since)
                start = end
            return []

    def drop(self) -> list[Future]:
        """Forget every queued write (the writer failed or closed); returns their futures."""
        return self._take()[2]

    def _take(self) -> tuple[list[bytes], list[dict | None], list[Future], array]:
        futures = self._futures
        n = len(futures)
        taken = (
            self._payloads[:n] if len(self._payloads) > n else self._payloads,
            self._properties[:n] if len(self._properties) > n else self._properties,
            futures,
            self._timestamps[:n] if len(self._timestamps) > n else self._timestamps,
        )
        self._payloads, self._properties, self._futures = [], [], []
        self._timestamps = array(TIMESTAMP_TYPECODE)
        self.nbytes = 0
        return taken
