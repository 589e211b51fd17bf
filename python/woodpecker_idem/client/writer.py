"""LogWriter: the single writer of a log (Woodpecker's LogWriter), and the writer core the
idempotent writer composes.

`write_async` queues the write (queued.py); queued writes become entries in runs, one encoding call,
one pending run and one waiter per AddEntries batch, with ids (segment, entry) assigned then. Group
commit decides when: a write queued while nothing of its segment is in flight is sent at once;
writes queued while a batch is in flight go together as the next batch when its ack arrives or when
they fill a batch (or after `append.linger_ms`). Each batch goes to one worker thread per node,
which retries it up to `append.max_retries` times. A batch commits at aq acks, in entry order. A
node that keeps failing is dropped from the segment; when fewer than aq nodes remain, the segment is
completed by the recovery rule and its pending entries are resolved against it (present ->
committed, absent -> dropped with `SegmentClosedError`), then writing goes on in a new segment.

This module owns the writer's acks and lifecycle (open, flush, close, fence, the lease) and
composes the parts, one job each: `message` (input checks), `queued` (the queued writes and when
they are admitted), `inflight` (entries from enqueue to commit: the one enqueue path, outcomes,
backpressure), `dispatch` + `workers` (group commit, node senders), `segments` (the open segments,
the current one, the roll rule), `completion` (completing segments), `flusher` (timeouts, LAC
updates, lease renewals) and `forks` (a writer used in a forked child).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..args import timeout_arg, wait_for
from ..errors import (
    ClientClosedError,
    InvalidArgumentError,
    WoodpeckerError,
    WriterClosedError,
    WriterFencedError,
    WriteTimeoutError,
)
from ..types import WriteManyResult, WriteMessage, WriteResult
from . import atexit_close
from .completion import SegmentCompletion
from .dispatch import Dispatch
from .flusher import Flusher
from .forks import FORKS, forked_error
from .futures import WriteFuture
from .hooks import NO_HOOKS, Outcomes, WriterHooks
from .inflight import InFlight
from .lease import Lease
from .message import checked_payloads, coerce_message
from .queued import WriteQueue
from .rows import write_rows
from .segment import Batch, SegmentHandle, SegmentStatus
from .segments import OpenSegments
from .workers import Maintenance, resolve

if TYPE_CHECKING:
    from .log import LogHandle

log = logging.getLogger(__name__)

__all__ = ["LogWriter"]


class LogWriter:
    """Appends to one log; thread-safe. Open it with `LogHandle.open_writer()`.

    Also the writer core a layer above composes (the idempotent writer): it passes its
    `WriterHooks` (hooks.py) and calls only the package API below ("layer API"). The writer's
    own parts (flusher, node workers, open segments, segment completion) call the "core
    interface" methods: public names, typed by the protocol each part declares (`FlusherCore`,
    `SenderCore`, `RollCore`, `CompletionCore`, `QueueCore`), so no part touches another's
    private state."""

    def __init__(self, handle: LogHandle, hooks: WriterHooks = NO_HOOKS):
        self._handle = handle
        self._hooks = hooks
        client = handle.client
        self._cfg = client.config
        self.clock = client.clock
        self._meta = client.meta
        self._transport = client.transport
        self.log_id = handle.log_id
        self.generation = FORKS[0]  # see FORKS: its threads and locks exist in this process only
        self._pid = os.getpid()
        ap = self._cfg.append
        self.max_batch_entries = ap.max_batch_entries  # the layer cuts its runs by these
        self.max_batch_bytes = ap.max_batch_bytes
        self.timeout_s = ap.timeout_ms / 1000  # a waiter's deadline (core interface too)
        self.max_retries = ap.max_retries  # core interface: a node's retries of one batch
        self.max_entry_bytes = ap.max_entry_bytes
        self.linger_s = ap.linger_ms / 1000

        self.lock = threading.Lock()  # the layer API's lock: `_locked` methods and hooks need it
        self._wake = threading.Condition(self.lock)  # the flusher
        self._closed = False
        self._stopping = threading.Event()  # set on close: background retries end
        self._fenced: WriterFencedError | None = None
        self._maint = Maintenance(self.log_id, self.fence)
        self._dispatch = Dispatch(
            self,
            self._transport,
            self._stopping,
            max_batch_entries=ap.max_batch_entries,
            max_batch_bytes=ap.max_batch_bytes,
            linger_s=self.linger_s,
        )
        self._send_locked = self._dispatch.send_locked  # group commit (the hot path calls it)
        # layer API: the entries in flight (the one enqueue path, commits, backpressure)
        self.inflight = InFlight(self.lock, ap, self._send_locked, hooks.committed_locked)
        self._space = self.inflight.space  # flush and close wait on it too
        # layer API too: where writes go (the current segment, rolled), joins, what is open
        self.segments = OpenSegments(
            self,
            self._cfg,
            meta=self._meta,
            transport=self._transport,
            dispatch=self._dispatch,
            maint=self._maint,
        )
        self._queue = WriteQueue(self, hooks)  # write_async's writes not given ids yet
        self.metrics: dict[str, float] = {
            "segments_rolled": 0,
            "segments_repaired": 0,
            "background_retries": 0,
            "backpressure_waits": 0,  # calls that waited for room (append.max_inflight_*)
        }

        self._lease = Lease(self._meta, self.log_id, self.clock, self.fence)  # takes the log over
        self.owner = self._lease.owner
        self.epoch = self._lease.epoch
        self._completion = SegmentCompletion(
            self,
            meta=self._meta,
            transport=self._transport,
            hooks=hooks,
            maint=self._maint,
            stopping=self._stopping,
            timeout_s=self.timeout_s,
        )
        self._completion.take_over()  # the previous writers' segments (DESIGN.md 3 and 4)
        self._hooks.taken_over()
        with self.lock:
            self.segments.open_locked()
        self._flusher = Flusher(self, self._dispatch, self._wake, self._maint)
        atexit_close.track(self)  # closed at interpreter exit if still open

    # --- writing -----------------------------------------------------------------------------

    def write(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Append and wait for the quorum ack (`timeout`: None or seconds > 0, checked before the
        write is queued). A wait that ends first raises `WriteTimeoutError`: still pending."""
        wait = timeout_arg(timeout, allow_zero=False)
        future = self.write_async(message, properties=properties, idempotency_id=idempotency_id)
        return wait_for(future, wait, self._still_pending_text)

    def write_many(
        self, payloads: Sequence[bytes], *, timeout: float | None = None
    ) -> WriteManyResult:
        """Append a batch in order, in runs of one AddEntries batch (one frame and one waiter
        each, no future per row); columnar results. Every row and `timeout` are checked before
        any row is queued. A failure raises the lowest failed row's error, carrying the result
        and which rows were acknowledged (`batch_result`, `acknowledged`); a retry on this plain
        writer appends the rows again (the idempotent writer's `write_many` answers them)."""
        self.check_process()
        wait = timeout_arg(timeout, allow_zero=False)
        rows = checked_payloads(payloads, self.max_entry_bytes)
        return write_rows(self, rows, wait, self._still_pending_text)

    def _still_pending_text(self) -> str:
        """What a timed-out wait means for this writer (the idempotent one says a retry joins)."""
        return (
            f"the entry to log {self.log_id} is still pending and the writer keeps sending it; "
            "it may still land, and a retry on this plain writer appends a second copy"
        )

    def write_async(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
    ) -> Future[WriteResult]:
        """Queue an append; the future resolves at the quorum ack (or with the failure outcome)."""
        if FORKS[0] != self.generation:
            self.check_process()
        if idempotency_id is not None:
            raise InvalidArgumentError(
                "idempotency_id given to a non-idempotent writer; open it with "
                "open_writer(idempotent=True)"
            )
        payload, props = coerce_message(message, properties, self.max_entry_bytes)
        future: Future[WriteResult] = WriteFuture()
        with self.lock:
            if self._fenced is not None or self._closed:
                self.check_open_locked()
            failed = self._queue.queue_locked(payload, props, future)
        if failed:
            resolve(failed)
        return future

    # --- layer API: what a layer over this core (hooks.py) may call --------------------------

    def admit_writes_locked(self) -> Outcomes:
        """Give the writes `write_async` queued their ids now (a batch call goes after them);
        returns the outcomes of those that failed, to set after the lock."""
        return self._queue.admit_locked() if self._queue else []

    def wake_locked(self) -> None:
        """Wake the flusher (it asks `WriterHooks.admit_locked` when queued writes are due)."""
        self._wake.notify()

    def still_owner(self) -> bool:
        """Ask the metadata store whether this writer still owns the log; fences it if not."""
        return self._fenced is None and self._lease.held()

    @property
    def repairing(self) -> bool:
        """A segment lost its ack quorum and is being completed: new writes are refused."""
        return self._completion.repairing is not None

    def unavailable_error(self) -> WoodpeckerError:
        """Why a write is refused while a segment is repaired (`segments.writable_locked` None)."""
        return self._completion.unavailable_error()

    def wait_for_room_locked(self, size: int, entries: int = 1) -> None:
        """Backpressure: block until in-flight entries/bytes leave room for `entries` more
        entries of `size` bytes (or nothing is in flight); raises once closed or fenced."""
        self.metrics["backpressure_waits"] += 1
        self.inflight.wait_for_room_locked(size, entries, lambda: self.stopped)
        self.check_open_locked()

    def check_process(self) -> None:
        """Raise `WriterForkedError` in a process forked after this writer was opened."""
        if FORKS[0] != self.generation:
            raise forked_error(f"writer of log {self.log_id}", self._pid)

    def check_open_locked(self) -> None:
        """Raise why no write is accepted any more (fenced, closed, or the client closed)."""
        if self._fenced is not None:
            raise WriterFencedError(str(self._fenced))
        if self._closed:
            if self._handle.client.closed:
                raise ClientClosedError(f"client is closed: writer of log {self.log_id} is closed")
            raise WriterClosedError(f"writer of log {self.log_id} is closed")

    # --- flushing and closing ----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every entry queued before this call is committed or failed."""
        self.check_process()
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if self._closed:
                self.check_open_locked()
            failed = self.admit_writes_locked()
            target = self.inflight.seq
        resolve(failed)
        with self.lock:
            while self._fenced is None:
                oldest = self.segments.oldest_pending_seq_locked()
                if oldest is None or oldest > target:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WriteTimeoutError(f"flush of log {self.log_id} timed out")
                self._space.wait(0.05 if left is None else min(left, 0.05))
            raise WriterFencedError(str(self._fenced))

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then complete the open segment so readers see it sealed. Idempotent.

        Returns within `timeout` seconds (None: no bound on the flush): writes not acknowledged
        by then fail with `WriterClosedError`, and a segment not completed by then is completed by
        the next writer's recovery.
        """
        timeout = timeout_arg(timeout)
        if self._closed:
            return
        self.check_process()  # a forked child must not complete its parent's segments
        self._hooks.closing()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left(default: float) -> float:
            return default if deadline is None else max(0.0, deadline - time.monotonic())

        try:
            if self._fenced is None:
                self.flush(timeout)
        except WoodpeckerError as exc:
            log.warning("log %s: closing with unflushed entries: %s", self.log_id, exc)
        with self.lock:
            self._closed = True
            late = self._queue.drop()  # queued after the flush: nobody will admit them
            self._wake.notify_all()
            self._space.notify_all()
        resolve([(f, WriterClosedError(f"writer of log {self.log_id} closed")) for f in late])
        self._stopping.set()
        atexit_close.untrack(self)
        self._flusher.join(left(5))
        self._dispatch.stop(left)
        self._maint.stop(left(10))
        with self.lock:
            segments = self.segments.all_locked()
            unresolved = [
                (
                    f,
                    WriterClosedError(
                        f"writer of log {self.log_id} closed before entry {segment_id}:{entry_id} "
                        "was acknowledged; the next writer's recovery keeps it if it reached the "
                        "nodes (an idempotent retry then returns its id)"
                    ),
                )
                for f, segment_id, entry_id in self.segments.waiters_locked()
            ]
        resolve(unresolved)
        if self._fenced is None:
            self._completion.finish(segments, self.segments.last_opened, timeout, deadline)
        self._hooks.closed()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fenced(self) -> bool:
        """Another writer took the log over: every call fails with `WriterFencedError`."""
        return self._fenced is not None

    @property
    def stopped(self) -> bool:
        """Closed (or closing) or fenced: the writer's background work ends."""
        return self._closed or self._fenced is not None

    # --- core interface: what the writer's own parts call (flusher, workers, segments, completion)

    def admit_queued_locked(self) -> tuple[Outcomes, float | None]:
        """Turn queued writes (this writer's and the layer's above, `WriterHooks.admit_locked`)
        into entries if nothing is in flight or the oldest has waited linger_ms; returns their
        outcomes and the seconds until the rest are due (None: nothing queued)."""
        return self._queue.admit_due_locked()

    def complete_if_drained_locked(self, seg: SegmentHandle) -> None:
        """A rolled segment with nothing pending any more is completed (in the background)."""
        if seg.status is SegmentStatus.ROLLED and seg.drained():
            seg.status = SegmentStatus.DONE
            self._maint.submit(self._completion.complete_drained, seg)

    # --- acks (node worker threads) ------------------------------------------------------------

    def on_ack(self, node: str, seg: SegmentHandle, batch: Batch) -> None:
        """`node` stored `batch`: commit what reached aq, in order, and send what was held."""
        with self.lock:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE):
                return  # recovery decides (FAILED); nothing is pending any more (DONE)
            committed = seg.ack(node, batch)
            if not committed:
                return
            resolved = self.inflight.commit_locked(seg, committed)
            resolved.extend(self._queue.admit_acked_locked())  # queued while it was in flight
            self._send_locked(seg)  # what was held while this batch was in flight
            if seg.status is SegmentStatus.ROLLED:
                self.complete_if_drained_locked(seg)
        resolve(resolved)

    def on_node_failed(self, node: str, seg: SegmentHandle, batch: Batch, exc: Exception) -> None:
        """`node` gave up on `batch`: segment completion drops it, and repairs `seg` if it lost
        its ack quorum."""
        self._completion.node_failed(node, seg, batch, exc)

    # --- fencing and the lease -----------------------------------------------------------------

    def renew_lease(self) -> None:
        """Renew this writer's lease on the log (the flusher asks every few seconds)."""
        self._lease.renew()

    def fence(self, exc: WriterFencedError) -> None:
        """`fence_locked`, then its outcomes set (call without the lock)."""
        with self.lock:
            resolved = self.fence_locked(exc)
        resolve(resolved)

    def fence_locked(self, exc: WriterFencedError) -> Outcomes:
        """Another writer took over: fail everything pending; every later call fails too."""
        if self._fenced is not None:
            return []
        self._fenced = exc
        self._stopping.set()
        log.warning("log %s: writer fenced: %s", self.log_id, exc)
        resolved: Outcomes = [
            (f, WriterFencedError(str(exc))) for f, _, _ in self.segments.waiters_locked()
        ]
        resolved.extend((f, WriterFencedError(str(exc))) for f in self._queue.drop())
        resolved.extend(self._hooks.fenced_locked(exc))
        self._wake.notify_all()
        self._space.notify_all()
        return resolved
