"""LogWriter: the single writer of a log (Woodpecker's LogWriter).

`write_async` assigns (segment, entry), encodes the entry once and queues it. Batches are cut by
group commit: an entry queued while nothing of its segment is in flight is sent at once; entries
queued while a batch is in flight go together as the next batch when its ack arrives or when they
fill a batch (or after `append.linger_ms` if a node failed the batch in flight once and it is
being retried). Each batch goes to one worker thread per node, which retries it up to
`append.max_retries` times. A batch commits at aq acks, in entry order. A node that keeps failing is
dropped from the segment; when fewer than aq nodes remain, the segment is completed by the recovery
rule and its pending entries are resolved against it (present -> committed, absent -> dropped with
`SegmentClosedError`), then writing goes on in a new segment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .._core import encode_entry
from ..args import timeout_arg, wait_for
from ..errors import (
    ClientClosedError,
    EntryConflictError,
    InvalidArgumentError,
    InvalidTypeError,
    NodeUnavailableError,
    PayloadTooLargeError,
    QuorumUnavailableError,
    SegmentClosedError,
    SegmentFencedError,
    WoodpeckerError,
    WriterClosedError,
    WriterFencedError,
    WriteTimeoutError,
)
from ..meta.base import SegmentMeta
from ..retry import Backoff, retry_call
from ..types import LogMessageId, SegmentState, WriteManyResult, WriteMessage, WriteResult
from . import atexit_close
from .flusher import Flusher
from .futures import WriteFuture
from .hooks import NO_HOOKS, WriterHooks
from .recovery import choose_nodes, recover_segment, seal
from .rows import write_rows
from .segment import (
    Batch,
    EntryJoiner,
    PendingEntry,
    RunWaiter,
    SegmentHandle,
    SegmentStatus,
    Waiter,
    span,
)
from .workers import Maintenance, NodeWorker, resolve

if TYPE_CHECKING:
    from .log import LogHandle

log = logging.getLogger(__name__)

LEASE_MS = 30_000
# Background retries (repair, completing a rolled segment, a roll the metadata store refused)
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 2.0


def coerce_message(
    message: WriteMessage | bytes | bytearray | memoryview,
    properties: dict[str, str] | None,
    max_bytes: int,
) -> tuple[bytes, dict | None]:
    """Validate a payload and its properties; bad input fails here, before anything is queued."""
    if type(message) is bytes and properties is None and len(message) <= max_bytes:
        return message, None  # the common case, valid by construction
    payload: bytes | bytearray | memoryview
    if isinstance(message, WriteMessage):
        payload, props = message.payload, message.properties or None
    else:
        payload, props = message, None
    if properties is not None and not isinstance(properties, dict):
        raise InvalidTypeError(
            f"properties must be a dict[str, str], not {type(properties).__name__}"
        )
    if properties:
        if props is not None and not isinstance(props, dict):
            raise InvalidTypeError(
                f"WriteMessage.properties must be a dict[str, str], not {type(props).__name__}"
            )
        props = {**(props or {}), **properties}
    if isinstance(payload, (bytearray, memoryview)):
        payload = bytes(payload)
    elif not isinstance(payload, bytes):
        raise InvalidTypeError(
            f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
            + (" (encode str first)" if isinstance(payload, str) else "")
        )
    if len(payload) > max_bytes:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes; append.max_entry_bytes allows {max_bytes}"
        )
    if props is not None:
        if not isinstance(props, dict):
            raise InvalidTypeError(
                f"properties must be a dict[str, str], not {type(props).__name__}"
            )
        for k, v in props.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidTypeError(f"properties must map str to str; got {k!r}: {v!r}")
    return payload, props


def checked_payloads(payloads: Sequence[bytes], max_bytes: int) -> list[bytes]:
    """A batch's payloads as bytes, every row checked (type, size) before any is queued: a bad
    row refuses the whole batch, naming it."""
    if not (hasattr(payloads, "__len__") and hasattr(payloads, "__getitem__")):
        raise InvalidTypeError(
            f"payloads must be a sequence (a list or tuple), not {type(payloads).__name__}"
        )
    return [  # plain bytes within the limit need nothing more (the common case)
        p if isinstance(p, bytes) and len(p) <= max_bytes else _checked_row(p, i, max_bytes)
        for i, p in enumerate(payloads)
    ]


def _checked_row(row: object, i: int, max_bytes: int) -> bytes:
    try:
        payload, _ = coerce_message(row, None, max_bytes)  # type: ignore[arg-type]
    except WoodpeckerError as exc:
        raise type(exc)(f"payloads[{i}]: {exc}") from None
    return payload


def _transient(exc: BaseException) -> bool:
    """Worth retrying while completing a segment: an unreachable node or store, a lost
    compare-and-swap, or a race with another completion of the same segment (the next attempt
    sees its footer). A takeover (`WriterFencedError`) is final."""
    if isinstance(exc, WriterFencedError):
        return False
    if isinstance(exc, (SegmentFencedError, EntryConflictError, OSError)):
        return True
    return isinstance(exc, WoodpeckerError) and exc.retriable


class LogWriter:
    """Appends to one log; thread-safe. Open it with `LogHandle.open_writer()`.

    Also the writer core a layer above composes (the idempotent writer): it passes its
    `WriterHooks` (hooks.py) and calls only the package API below ("layer API").
    """

    def __init__(self, handle: LogHandle, hooks: WriterHooks = NO_HOOKS):
        self._handle = handle
        self._hooks = hooks
        client = handle.client
        self._cfg = client.config
        self._clock = client.clock
        self.clock = client.clock
        self._meta = client.meta
        self._transport = client.transport
        self.log_id = handle.log_id
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        ap = self._cfg.append
        self._max_batch_entries = ap.max_batch_entries
        self._max_batch_bytes = ap.max_batch_bytes
        self.max_batch_entries = ap.max_batch_entries  # the batch lane cuts its runs by these
        self.max_batch_bytes = ap.max_batch_bytes
        self._linger_s = ap.linger_ms / 1000
        self._timeout_s = ap.timeout_ms / 1000
        self._max_retries = ap.max_retries
        self._max_entry_bytes = ap.max_entry_bytes
        self.max_entry_bytes = ap.max_entry_bytes
        self.linger_s = self._linger_s
        self._max_inflight_entries = ap.max_inflight_entries
        self._max_inflight_bytes = ap.max_inflight_bytes
        sg = self._cfg.segment
        self._roll_entries = sg.max_entries
        self._roll_bytes = sg.max_size_bytes
        self._roll_s = sg.max_interval_s

        self._lock = threading.Lock()
        self.lock = self._lock  # the layer API's lock: `_locked` methods and hooks run under it
        self._space = threading.Condition(self._lock)  # backpressure, flush, drain
        self._wake = threading.Condition(self._lock)  # the flusher
        self._closed = False
        self._stopping = threading.Event()  # set on close: background retries end
        self._fenced: WriterFencedError | None = None
        self._seq = 0
        self._inflight_entries = 0
        self._inflight_bytes = 0
        self._segments: dict[int, SegmentHandle] = {}
        self._last_opened = -1  # the newest segment this writer has had a handle for
        self._current: SegmentHandle | None = None
        self._repairing: SegmentHandle | None = None
        self._workers: dict[str, NodeWorker] = {}
        self._maint = Maintenance(self)
        self._roll_backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        self._roll_retry_at = 0.0  # after a failed roll: not retried before this (monotonic)
        self.metrics: dict[str, float] = {
            "segments_rolled": 0,
            "segments_repaired": 0,
            "background_retries": 0,
        }

        self.epoch = self._meta.take_over(self.log_id, self.owner, self._clock.now_ms(), LEASE_MS)
        self._take_over_segments()
        with self._lock:
            self._open_segment_locked()
        self._flusher = Flusher(self)
        atexit_close.track(self)  # closed at interpreter exit if still open

    # --- opening ---------------------------------------------------------------------------

    def _take_over_segments(self) -> None:
        """Complete every ACTIVE segment a previous writer left (DESIGN.md sections 3 and 4)."""
        for seg in self._meta.list_segments(self.log_id):
            if seg.state in (SegmentState.ACTIVE, SegmentState.COMPLETED):
                done = self._recover_with_retries(seg)
                self._segment_completed(done.segment_id, done.last_entry_id)
        self._hooks.taken_over()

    def _recover_with_retries(self, seg: SegmentMeta) -> SegmentMeta:
        """Recovery meets the same transient faults as writes (nodes, metadata store, a race with
        another completion): retry them for append.timeout_ms."""

        def attempt() -> SegmentMeta:
            current = self._meta.get_segment(self.log_id, seg.segment_id) or seg  # fresh revision
            return recover_segment(
                self._transport, self._meta, self.epoch, current, self._clock.now_ms()
            )

        def on_retry(exc: BaseException, attempt_no: int) -> None:
            log.info(
                "log %s: completing segment %s, retry %d: %s",
                self.log_id,
                seg.segment_id,
                attempt_no,
                exc,
            )

        return retry_call(
            attempt,
            _transient,
            Backoff(RETRY_INITIAL_S, RETRY_MAX_S, budget_s=self._timeout_s),
            on_retry,
        )

    def _open_segment_locked(self) -> SegmentHandle:
        existing = self._meta.list_segments(self.log_id)
        last = existing[-1] if existing else None
        segment_id = (last.segment_id + 1) if last else 0
        es = self._cfg.quorum.es
        aq = es // 2 + 1
        meta = SegmentMeta(
            log_id=self.log_id,
            segment_id=segment_id,
            state=SegmentState.ACTIVE,
            nodes=choose_nodes(self._transport.node_ids, es, segment_id),
            es=es,
            wq=es,
            aq=aq,
            created_ms=self._clock.now_ms(),
        )
        if last and last.state is SegmentState.ACTIVE and last.segment_id not in self._segments:
            # An ACTIVE segment this writer has no handle for: its own create whose answer was
            # lost (a metadata timeout). Only the current epoch can create one, so if this writer
            # still holds it, the segment is its own, and empty: adopt it, or readers would wait
            # at it for good. (A WriterFencedError is handled by the caller.)
            self._meta.check_epoch(self.log_id, self.epoch)
            meta, segment_id = last, last.segment_id
        else:
            meta = self._meta.create_segment(self.epoch, meta)
        handle = SegmentHandle(meta, time.monotonic())
        self._segments[segment_id] = handle
        self._last_opened = max(self._last_opened, segment_id)
        self._current = handle
        for node in meta.nodes:
            if node not in self._workers:
                self._workers[node] = NodeWorker(self, node)
        return handle

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
        wait = timeout_arg(timeout, allow_zero=False)
        rows = checked_payloads(payloads, self._max_entry_bytes)
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
        if idempotency_id is not None:
            raise InvalidArgumentError(
                "idempotency_id given to a non-idempotent writer; open it with "
                "open_writer(idempotent=True)"
            )
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        future: Future[WriteResult] = WriteFuture()
        with self._lock:
            self._append_locked(payload, props, future, self._clock.now_ms())
        return future

    def _append_locked(
        self,
        payload: bytes,
        props: dict | None,
        future: Future | None,
        now_ms: int,
    ) -> None:
        """Assign the next id, encode and queue the entry; on failure sets the future's
        exception."""
        if self._fenced is not None or self._closed:
            self.check_open_locked()
        size = len(payload) + 64
        if self.full_locked(size):
            self.wait_for_room_locked(size)
        now = time.monotonic()
        seg = self._current
        if seg is None or self._needs_roll(seg, now):
            seg = self.writable_segment_locked()
            if seg is None:
                if future is not None:
                    future.set_exception(self.unavailable_error())
                return
        # encode first: a KeyboardInterrupt (Ctrl-C in a write burst) raised here leaves no id
        # taken without its entry queued
        record = encode_entry(seg.segment_id, seg.next_entry_id, now_ms, payload, props)
        self.enqueue_locked(seg, (record,), (future,), now)

    # --- layer API: what a layer over this core (hooks.py) may call --------------------------

    def enqueue_locked(
        self,
        seg: SegmentHandle,
        records: Sequence[bytes],
        futures: Sequence[Future | None],
        since: float,
    ) -> None:
        """The one enqueue path of both writers: `records` (encoded for the ids from
        `seg.next_entry_id` on) become `seg`'s next entries, each with its future, pending until
        the quorum ack; sent per group commit (`_send_locked`). `since`: when the oldest was
        queued (time.monotonic()). Kept flat on purpose: the hot path of every write."""
        segment_id = seg.segment_id
        first = entry_id = seg.next_entry_id
        deadline = time.monotonic() + self._timeout_s
        pending = seg.pending
        unsent = seg.unsent
        by_entry = seg.by_entry
        was_empty = not unsent
        seq = self._seq
        added = 0
        for record, future in zip(records, futures, strict=True):
            seq += 1
            entry = PendingEntry(seq, segment_id, entry_id, record, future, deadline)
            pending.append(entry)
            unsent.append(entry)
            by_entry[entry_id] = entry
            added += len(record)
            entry_id += 1
        self._seq = seq
        seg.next_entry_id = first  # counted up by _queued_locked
        self._queued_locked(seg, entry_id - first, added, was_empty, since)

    def enqueue_run_locked(
        self, seg: SegmentHandle, frame: bytes, count: int, waiter: RunWaiter, since: float
    ) -> None:
        """The batch lane's enqueue: `count` entries from `seg.next_entry_id` on, encoded in one
        `frame`, pending as one run with one `waiter` (told once for all of them). The caller
        keeps `count` and the frame within append.max_batch_entries / max_batch_bytes, so a
        run is never cut into two batches."""
        self._seq += 1
        deadline = time.monotonic() + self._timeout_s
        run = PendingEntry(self._seq, seg.segment_id, seg.next_entry_id, frame, waiter, deadline)
        run.count = count
        was_empty = not seg.unsent
        seg.pending.append(run)
        seg.unsent.append(run)
        seg.by_entry[run.entry_id] = run
        self._queued_locked(seg, count, len(frame), was_empty, since)

    def _queued_locked(
        self, seg: SegmentHandle, entries: int, nbytes: int, was_empty: bool, since: float
    ) -> None:
        """Count `entries` just appended to `seg` (`nbytes` of records) and send per group
        commit."""
        seg.next_entry_id += entries
        seg.unsent_bytes += nbytes
        seg.unsent_entries += entries
        seg.size_bytes += nbytes
        self._inflight_entries += entries
        self._inflight_bytes += nbytes
        unsent = seg.unsent
        if was_empty and unsent:
            seg.unsent_since = since
        if (
            not seg.batches
            or seg.unsent_entries >= self._max_batch_entries
            or seg.unsent_bytes >= self._max_batch_bytes
        ):
            self._send_locked(seg)

    def full_locked(self, size: int, entries: int = 1) -> bool:
        """Backpressure: would `size` more bytes in `entries` more entries pass the in-flight
        limits?"""
        return (
            self._inflight_entries + entries > self._max_inflight_entries
            or self._inflight_bytes + size > self._max_inflight_bytes
        )

    def hold_locked(self, entries: int, nbytes: int) -> None:
        """Count writes the layer queued (no entries yet) against the in-flight limits."""
        self._inflight_entries += entries
        self._inflight_bytes += nbytes

    def release_locked(self, entries: int, nbytes: int) -> None:
        """Stop counting writes held with `hold_locked` (they became entries, or failed)."""
        self._inflight_entries -= entries
        self._inflight_bytes -= nbytes
        self._space.notify_all()

    def idle_locked(self) -> bool:
        """Nothing is in flight in the current segment (or there is none: being repaired)."""
        current = self._current
        return current is None or not current.batches

    def wake_locked(self) -> None:
        """Wake the flusher (it asks `WriterHooks.admit_locked` when queued writes are due)."""
        self._wake.notify()

    def segment_room_locked(self, seg: SegmentHandle) -> tuple[int, int]:
        """(entries, bytes) `seg` takes before its roll limits; <= 0 once past them."""
        return self._roll_entries - seg.next_entry_id, self._roll_bytes - seg.size_bytes

    def join_locked(self, segment_id: int, entry_id: int, future: Waiter) -> None:
        """`future` also ends with pending entry `segment_id:entry_id` (a retry joins it)."""
        seg = self._segments.get(segment_id)
        entry = seg.find(entry_id) if seg is not None else None
        if entry is None:  # cannot happen while pending keys and segments move together
            raise RuntimeError(f"pending key without its entry {segment_id}:{entry_id}")
        if entry.joiners is None:
            entry.joiners = []
        entry.joiners.append(future if entry.count == 1 else EntryJoiner(future, entry_id))
        if entry.timed_out:  # a retry after a timeout gets a fresh deadline
            entry.timed_out = False
            entry.deadline = time.monotonic() + self._timeout_s

    def open_lacs_locked(self) -> dict[int, int]:
        """The LAC of every segment not completed yet (what a snapshot may cover of them)."""
        return {seg.segment_id: seg.lac for seg in self._segments.values()}

    def still_owner(self) -> bool:
        """Ask the metadata store whether this writer still owns the log; fences it if not."""
        if self._fenced is not None:
            return False
        try:
            self._meta.check_epoch(self.log_id, self.epoch)
        except WriterFencedError as exc:
            with self._lock:
                resolved = self._fence_locked(exc)
            resolve(resolved)
            return False
        return True

    @property
    def repairing(self) -> bool:
        """A segment lost its ack quorum and is being completed: new writes are refused."""
        return self._repairing is not None

    def _needs_roll(self, seg: SegmentHandle, now: float) -> bool:
        return (
            seg.next_entry_id >= self._roll_entries
            or seg.size_bytes >= self._roll_bytes
            or now - seg.created >= self._roll_s
        )

    def _send_locked(self, seg: SegmentHandle) -> None:
        """Group commit: cut `seg`'s unsent entries into batches and hand them to the node senders.

        With nothing of the segment in flight they go at once: a lone write waits for no company.
        While a batch is in flight, entries that do not fill a batch wait for its ack (which calls
        this again): they go together as the next batch, so under load batches grow to what
        arrives during one durable put (sending them early would gain nothing: commits go in
        entry order and each node stores batches one at a time). Only a batch some node failed
        once (being retried) holds them at most `append.linger_ms`: then they go too and wait
        at the nodes behind it. Submitting under the lock keeps every node's queue in order.
        """
        if seg.status is not SegmentStatus.OPEN and seg.status is not SegmentStatus.ROLLED:
            return
        max_entries = self._max_batch_entries
        max_bytes = self._max_batch_bytes
        while seg.unsent:
            if (
                seg.batches
                and seg.status is SegmentStatus.OPEN
                and seg.unsent_entries < max_entries
                and seg.unsent_bytes < max_bytes
                and (
                    len(seg.batches) > 1
                    or not seg.batches[0].retrying
                    or time.monotonic() - seg.unsent_since < self._linger_s
                )
            ):
                return  # held for the ack of the batch in flight
            batch = seg.take_batch(max_entries, max_bytes)
            if seg.lac > seg.lac_sent:
                seg.lac_sent = seg.lac  # the batch carries the LAC
            failed = seg.failed_nodes
            for node in seg.meta.nodes:
                if node in failed:
                    batch.failed.add(node)
                else:
                    self._workers[node].submit(seg, batch)
            if seg.unsent:
                seg.unsent_since = time.monotonic()

    def _send_due(self, seg: SegmentHandle, now: float) -> float | None:
        """Seconds until `seg`'s held entries go without an ack (None: they wait for one)."""
        if not seg.unsent or len(seg.batches) != 1 or not seg.batches[0].retrying:
            return None
        return seg.unsent_since + self._linger_s - now

    def wait_for_room_locked(self, size: int, entries: int = 1) -> None:
        """Backpressure: block until in-flight entries/bytes leave room for `entries` more
        entries of `size` bytes (or nothing is in flight)."""
        while (
            self.full_locked(size, entries)
            and self._inflight_entries
            and not self._closed
            and self._fenced is None
        ):
            self._space.wait(0.1)
        self.check_open_locked()

    def writable_segment_locked(self) -> SegmentHandle | None:
        """The current segment, rolled first if it is full or old; None while repairing.

        The segment limits are targets, not bounds: if the metadata store cannot create the next
        segment, writes go on in the current one and the roll is retried with backoff, so a
        metadata outage never stops writes. A roll refused because another writer took the log
        over fences this writer (every pending write fails with `WriterFencedError`).
        """
        seg = self._current
        if seg is None:
            return None
        now = time.monotonic()
        if self._needs_roll(seg, now) and now >= self._roll_retry_at:
            try:
                new = self._open_segment_locked()
            except WriterFencedError as exc:
                self._maint.submit(resolve, self._fence_locked(exc))  # not under the lock
                raise
            except Exception as exc:
                self._roll_retry_at = now + self._roll_backoff.next_delay()
                self.metrics["background_retries"] += 1
                log.warning(
                    "log %s: could not roll segment %s (writes go on in it, retried in %.2f s): %s",
                    self.log_id,
                    seg.segment_id,
                    self._roll_retry_at - now,
                    exc,
                )
                return seg
            self._roll_backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
            seg.status = SegmentStatus.ROLLED
            if seg.drained():
                seg.status = SegmentStatus.DONE
                self._maint.submit(self._complete_drained, seg)
            else:
                self._send_locked(seg)  # its held entries need not wait for company any more
            self.metrics["segments_rolled"] += 1
            seg = new
        return seg

    def unavailable_error(self) -> WoodpeckerError:
        bad = self._repairing
        why = bad.failed_nodes if bad is not None else {}
        return QuorumUnavailableError(
            f"log {self.log_id}: segment {bad.segment_id if bad else '?'} lost its ack quorum "
            f"({why}); writes resume once it is completed and a new segment is open"
        )

    def check_open_locked(self) -> None:
        if self._fenced is not None:
            raise WriterFencedError(str(self._fenced))
        if self._closed:
            if self._handle.client.closed:
                raise ClientClosedError(f"client is closed: writer of log {self.log_id} is closed")
            raise WriterClosedError(f"writer of log {self.log_id} is closed")

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every entry queued before this call is committed or failed."""
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._closed:
                self.check_open_locked()
            target = self._seq
            while self._fenced is None:
                oldest = min(
                    (s.pending[0].seq for s in self._segments.values() if s.pending),
                    default=target + 1,
                )
                if oldest > target:
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
        self._hooks.closing()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left(default: float) -> float:
            return default if deadline is None else max(0.0, deadline - time.monotonic())

        try:
            if self._fenced is None:
                self.flush(timeout)
        except WoodpeckerError as exc:
            log.warning("log %s: closing with unflushed entries: %s", self.log_id, exc)
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            self._space.notify_all()
        self._stopping.set()
        atexit_close.untrack(self)
        self._flusher.join(left(5))
        for worker in self._workers.values():
            worker.stop(left(5))
        self._maint.stop(left(10))
        with self._lock:
            segments = list(self._segments.values())
        unresolved: list[tuple[Waiter, object]] = []
        for seg in segments:
            for entry in seg.pending:
                error = WriterClosedError(
                    f"writer of log {self.log_id} closed before entry {seg.segment_id}:"
                    f"{entry.entry_id} was acknowledged; the next writer's recovery keeps it if "
                    f"it reached the nodes (an idempotent retry then returns its id)"
                )
                unresolved.extend((f, error) for f, _ in entry.waiters())
        resolve(unresolved)
        for seg in segments if self._fenced is None else ():
            # DONE but still listed: its completion was under way (or retrying) in the background
            if seg.status is not SegmentStatus.FAILED and seg.drained():
                try:
                    if deadline is not None and left(0) <= 0:
                        raise WriteTimeoutError(f"close timeout of {timeout:g} s reached")
                    self._complete_drained(seg, Backoff(RETRY_INITIAL_S, 0.5, budget_s=left(5)))
                except Exception as exc:
                    log.warning(
                        "log %s: segment %s left for recovery: %s", self.log_id, seg.segment_id, exc
                    )
        if self._fenced is None and (deadline is None or left(0) > 0):
            self._seal_orphan()
        self._hooks.closed()

    def _seal_orphan(self) -> None:
        """A segment this writer created but never heard back about (a lost create answer, its
        roll retried later or never) is ACTIVE and empty: seal it, or readers would wait there."""
        try:
            segments = self._meta.list_segments(self.log_id)
            last = segments[-1] if segments else None
            if last is None or last.state is not SegmentState.ACTIVE:
                return
            if last.segment_id <= self._last_opened:
                return  # one of its own (a failed completion stays for recovery)
            self._meta.check_epoch(self.log_id, self.epoch)  # only this epoch can have made it
            seal(self._meta, self.epoch, last, -1, self._clock.now_ms())
        except Exception as exc:  # the next writer's takeover completes it
            log.warning("log %s: empty segment left for recovery: %s", self.log_id, exc)

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def _segment_completed(self, segment_id: int, last_entry_id: int) -> None:
        with self._lock:
            self._hooks.segment_completed_locked(segment_id, last_entry_id)

    # --- flusher -----------------------------------------------------------------------------

    def _renew_lease(self) -> None:
        try:
            self._meta.renew_lease(
                self.log_id, self.epoch, self.owner, self._clock.now_ms(), LEASE_MS
            )
        except WriterFencedError as exc:
            with self._lock:
                resolved = self._fence_locked(exc)
            resolve(resolved)

    # --- acks and failures (node worker threads) ------------------------------------------------

    def _on_ack(self, node: str, seg: SegmentHandle, batch: Batch) -> None:
        with self._lock:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE):
                return  # recovery decides (FAILED); nothing is pending any more (DONE)
            committed = seg.ack(node, batch)
            if not committed:
                return
            resolved = self._commit_locked(seg, committed)
            if self._hooks.queued():  # writes queued while this batch was in flight
                admitted, _ = self._hooks.admit_locked(self.idle_locked())
                resolved.extend(admitted)
            self._send_locked(seg)  # what was held while this batch was in flight
            if seg.status is SegmentStatus.ROLLED and seg.drained():
                seg.status = SegmentStatus.DONE
                self._maint.submit(self._complete_drained, seg)
        resolve(resolved)

    def _commit_locked(self, seg: SegmentHandle, committed: list[PendingEntry]):
        self._hooks.committed_locked(seg.segment_id, committed)
        resolved = []
        nbytes = 0
        for entry in committed:
            nbytes += len(entry.record)
            mid = LogMessageId(seg.segment_id, entry.entry_id)
            if entry.future is not None:
                resolved.append((entry.future, WriteResult(mid, False)))
            if entry.joiners:
                resolved.extend((f, WriteResult(mid, True)) for f in entry.joiners)
        self._inflight_entries -= span(committed)
        self._inflight_bytes -= nbytes
        self._space.notify_all()
        return resolved

    def _on_node_failed(self, node: str, seg: SegmentHandle, batch: Batch, exc: Exception) -> None:
        if isinstance(exc, SegmentFencedError):
            try:
                self._meta.check_epoch(self.log_id, self.epoch)
            except WriterFencedError as fenced:
                with self._lock:
                    resolved = self._fence_locked(fenced)
                resolve(resolved)
                return
            except WoodpeckerError as err:  # metadata down: the repair's seal finds out later
                log.warning("log %s: could not check the writer epoch: %s", self.log_id, err)
        with self._lock:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE) and not seg.pending:
                return
            seg.failed_nodes[node] = str(exc)
            batch.failed.add(node)
            log.warning(
                "log %s segment %s: node %s dropped after retries: %s",
                self.log_id,
                seg.segment_id,
                node,
                exc,
            )
            if not seg.quorum_lost() or seg.status is SegmentStatus.FAILED:
                return
            seg.status = SegmentStatus.FAILED
            self._repairing = seg
            if self._current is seg:
                self._current = None
        self._maint.submit(self._repair, seg)

    def _repair(self, seg: SegmentHandle) -> None:
        """Complete a segment that lost its quorum and resolve its pending entries; if it was the
        current segment, open the next. Every failure (nodes, storage, metadata) is retried with
        backoff until it succeeds, the writer is fenced or it is closed (DESIGN.md 1.1)."""
        backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S, stop=self._stopping)
        done: SegmentMeta | None = None
        while True:
            with self._lock:
                if self._closed or self._fenced is not None:
                    return
            try:
                if done is None:
                    done = recover_segment(
                        self._transport, self._meta, self.epoch, seg.meta, self._clock.now_ms()
                    )
                    with self._lock:
                        resolved = self._resolve_segment_locked(seg, done.last_entry_id)
                        self._segments.pop(seg.segment_id, None)
                        self.metrics["segments_repaired"] += 1
                    resolve(resolved)
                    self._segment_completed(done.segment_id, done.last_entry_id)
                with self._lock:
                    if self._current is None and not self._closed and self._fenced is None:
                        self._open_segment_locked()  # only a current segment is replaced
                    if self._repairing is seg:
                        self._repairing = None
                return
            except WriterFencedError as exc:
                with self._lock:
                    resolved = self._fence_locked(exc)
                resolve(resolved)
                return
            except Exception as exc:  # retried: the outage may end any time
                self.metrics["background_retries"] += 1
                log.warning(
                    "log %s: repair of segment %s (%s), retry %d: %s: %s",
                    self.log_id,
                    seg.segment_id,
                    "completing it" if done is None else "opening the next",
                    backoff.attempts + 1,
                    type(exc).__name__,
                    exc,
                )
                if not backoff.wait():
                    return

    def _resolve_segment_locked(self, seg: SegmentHandle, last_entry_id: int):
        committed, dropped = seg.resolve_completed(last_entry_id)
        resolved = self._commit_locked(seg, committed) if committed else []
        if dropped:
            self._hooks.dropped_locked(seg.segment_id, dropped)
            exc = SegmentClosedError(
                f"segment {self.log_id}/{seg.segment_id} was completed at entry {last_entry_id} "
                f"without these entries; a retry writes them anew"
            )
            for entry in dropped:
                resolved.extend((f, exc) for f, _ in entry.waiters())
            self._inflight_entries -= span(dropped)
            self._inflight_bytes -= sum(len(e.record) for e in dropped)
            self._space.notify_all()
        return resolved

    def _complete_drained(self, seg: SegmentHandle, backoff: Backoff | None = None) -> None:
        """A rolled (or closing) segment with nothing pending: complete it at its LAC.

        Readers stop at an ACTIVE segment, so a failure here (metadata store, nodes) is retried
        with backoff until it succeeds or the writer is closed (`backoff`: close's own budget).
        """

        def on_retry(exc: BaseException, attempt: int) -> None:
            self.metrics["background_retries"] += 1
            log.warning(
                "log %s: completing segment %s, retry %d: %s: %s",
                self.log_id,
                seg.segment_id,
                attempt,
                type(exc).__name__,
                exc,
            )

        retry_call(
            lambda: self._seal_drained(seg),
            lambda exc: not isinstance(exc, WriterFencedError),
            backoff or Backoff(RETRY_INITIAL_S, RETRY_MAX_S, stop=self._stopping),
            on_retry,
        )

    def _seal_drained(self, seg: SegmentHandle) -> None:
        last = seg.lac
        for node in seg.live_nodes():
            try:
                self._transport.complete(node, self.log_id, seg.segment_id, last)
            except (NodeUnavailableError, SegmentFencedError, EntryConflictError, OSError) as exc:
                # the metadata seal is what readers go by; a node not completed is left as is
                log.warning(
                    "log %s: complete of segment %s on %s failed: %s",
                    self.log_id,
                    seg.segment_id,
                    node,
                    exc,
                )
        current = self._meta.get_segment(self.log_id, seg.segment_id) or seg.meta
        seal(
            self._meta,
            self.epoch,
            dataclasses.replace(current, size_bytes=seg.size_bytes),
            last,
            self._clock.now_ms(),
        )
        with self._lock:
            seg.status = SegmentStatus.DONE
            self._segments.pop(seg.segment_id, None)
        self._segment_completed(seg.segment_id, last)

    def _fence_locked(self, exc: WriterFencedError):
        """Another writer took over: fail everything pending; every later call fails too."""
        if self._fenced is not None:
            return []
        self._fenced = exc
        self._stopping.set()
        log.warning("log %s: writer fenced: %s", self.log_id, exc)
        resolved: list[tuple[Waiter, object]] = []
        for seg in self._segments.values():
            for entry in seg.pending:
                resolved.extend((f, WriterFencedError(str(exc))) for f, _ in entry.waiters())
        resolved.extend(self._hooks.fenced_locked(exc))
        self._wake.notify_all()
        self._space.notify_all()
        return resolved
