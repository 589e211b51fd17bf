"""The sender: group commit, and each batch handed to the client's node senders (Kafka's `Sender`
over its `NetworkClient`).

`Dispatch` decides when a segment's queued entries go to its nodes, and in which batches, and
hands each batch to the sender of every live node of the segment (`ensemble.senders`, one per
node per client, shared by every writer): a segment is one lane there, so its batches reach a node
in entry order, while other segments' lanes go on beside it. A `BatchSend` is one batch to one
node: retried up to append.max_retries times, each retry waiting on the client's timer (holding
back only its own segment's lane). Acks and a node's failure go back to the pipeline
(`SenderView.on_ack` / `on_node_failed`), which commits in entry order and calls `send_locked`
again for what was held meanwhile. `Dispatch` runs under the writer's lock; the node senders
never take it except through those two calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..ensemble.senders import Job
from ..errors import EntryConflictError, SegmentFencedError, WoodpeckerError
from ..retry import Backoff
from .segments import OpenSegment, SegmentStatus, SentBatch

if TYPE_CHECKING:
    from ..ensemble import Ensemble
    from ..logstore.transport import LogStoreTransport

log = logging.getLogger(__name__)

_SKIPPED = object()  # a send not made: the segment or the node is out, or the writer fenced


class SenderView(Protocol):
    """What a `BatchSend` uses of its writer: its settings, whether it is fenced, and where an
    ack or a node's failure goes (`Pipeline` implements it)."""

    log_id: int
    timeout_s: float  # append.timeout_ms in seconds: the retry backoff's ceiling is a tenth
    max_retries: int  # append.max_retries

    @property
    def fenced(self) -> bool: ...

    @property
    def stopped(self) -> bool:
        """Closed (or closing) or fenced, as last recorded (asks nothing, takes no lock)."""

    def on_ack(self, node: str, seg: OpenSegment, batch: SentBatch) -> None: ...

    def on_node_failed(self, node: str, seg: OpenSegment, batch: SentBatch, exc: Exception) -> None:
        """`node` gave up on `batch` (after its retries, or at once for a final error)."""


class BatchSend:
    """One batch to one node, until acked or given up (its `job` runs on the node's sender).
    `batch=None` is a LAC-only update (best effort) so readers of an idle segment with aq > 1
    see its last acknowledged entries."""

    __slots__ = ("_dispatch", "node", "seg", "batch", "_backoff")

    def __init__(self, dispatch: Dispatch, node: str, seg: OpenSegment, batch: SentBatch | None):
        self._dispatch = dispatch
        self.node = node
        self.seg = seg
        self.batch = batch
        self._backoff: Backoff | None = None

    def call(self) -> Any:
        """One attempt (on the node's sender)."""
        d = self._dispatch
        w = d.pipeline
        seg = self.seg
        batch = self.batch
        if batch is None:
            return d.transport.add_entries(
                self.node, w.log_id, seg.segment_id, seg.lac + 1, b"", seg.lac
            )
        if w.fenced or self.node in seg.failed_nodes:
            return _SKIPPED
        if seg.status is SegmentStatus.FAILED or seg.status is SegmentStatus.DONE:
            return _SKIPPED
        # on the node's sender, which sets the deadline
        return d.transport.add_entries(
            self.node, w.log_id, seg.segment_id, batch.first_entry_id, batch.frame, seg.lac
        )

    def start(self, answer: Callable[[Any, BaseException | None], None]) -> bool:
        """Start one attempt without waiting, if the transport can (see `Job.start`): a batch
        still to send, as `call` would send it. False: `call` runs on the node's worker, and
        decides as ever. Called where its lane's turn comes, maybe under the writer's lock, so
        it asks `stopped` (a flag), never `fenced` (which may fence, taking the lock)."""
        d = self._dispatch
        w = d.pipeline
        seg = self.seg
        batch = self.batch
        if w.stopped or self.node in seg.failed_nodes:
            return False  # a skip, or a writer closing: `call` answers it
        if batch is None:
            return d.transport.start_add_entries(
                self.node, w.log_id, seg.segment_id, seg.lac + 1, b"", seg.lac, answer
            )
        if seg.status is SegmentStatus.FAILED or seg.status is SegmentStatus.DONE:
            return False
        return d.transport.start_add_entries(
            self.node, w.log_id, seg.segment_id, batch.first_entry_id, batch.frame, seg.lac, answer
        )

    def done(self, result: Any, exc: BaseException | None) -> float | None:
        """The attempt's outcome: None (this send is over) or the delay before the next."""
        d = self._dispatch
        w = d.pipeline
        batch = self.batch
        if batch is None:
            if exc is not None:  # the next batch carries the LAC anyway
                log.debug("log %s: LAC update to %s failed: %s", w.log_id, self.node, exc)
            d.ended()
            return None
        if exc is None:
            if result is not _SKIPPED:
                w.on_ack(self.node, self.seg, batch)
            d.ended()
            return None
        if isinstance(exc, (SegmentFencedError, EntryConflictError)):
            w.on_node_failed(self.node, self.seg, batch, exc)
            d.ended()
            return None
        if isinstance(exc, WoodpeckerError):
            if self._backoff is None:
                self._backoff = Backoff(0.02, max(w.timeout_s / 10, 0.01))
            if not exc.retriable or self._backoff.attempts >= w.max_retries:
                w.on_node_failed(self.node, self.seg, batch, exc)
                d.ended()
                return None
            if d.stopping.is_set():
                d.ended()  # the writer is closing: close() fails what is still pending
                return None
            batch.retrying = True  # later entries stop waiting for its ack (linger_ms)
            return self._backoff.next_delay()
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt and the like are not a node's failure
        # e.g. OSError from a full disk: this node is out
        log.error("log %s: add to %s failed", w.log_id, self.node, exc_info=exc)
        w.on_node_failed(self.node, self.seg, batch, exc)
        d.ended()
        return None


class Dispatch:
    """One writer's group-commit rule (append.max_batch_entries, append.max_batch_bytes,
    append.linger_ms) and its sends in flight on the client's node senders."""

    def __init__(
        self,
        pipeline: SenderView,
        ensemble: Ensemble,
        transport: LogStoreTransport,
        stopping: threading.Event,
        *,
        max_batch_entries: int,
        max_batch_bytes: int,
        linger_s: float,
    ):
        self.pipeline = pipeline
        self.stopping = stopping  # set when the writer closes or is fenced: retries end
        self.ensemble = ensemble
        self.transport = transport  # called on the node senders, which set the deadlines
        self._max_batch_entries = max_batch_entries
        self._max_batch_bytes = max_batch_bytes
        self._linger_s = linger_s
        self._sends = 0  # BatchSends submitted and not over
        self._quiet = threading.Condition(threading.Lock())  # notified when _sends reaches 0

    def _submit(self, node: str, seg: OpenSegment, batch: SentBatch | None) -> None:
        """Hand a send to the node's sender, in `seg`'s lane (its batches in entry order)."""
        send = BatchSend(self, node, seg, batch)
        with self._quiet:
            self._sends += 1
        if not self.ensemble.sender(node).submit(seg, Job(send.call, send.done, start=send.start)):
            self.ended()  # the client is closing: nothing is sent any more

    def ended(self) -> None:
        """A send is over (acked, given up, skipped or dropped)."""
        with self._quiet:
            self._sends -= 1
            if self._sends == 0:
                self._quiet.notify_all()

    def send_locked(self, seg: OpenSegment) -> None:
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
                    self._submit(node, seg, batch)
            if seg.unsent:
                seg.unsent_since = time.monotonic()

    def send_due(self, seg: OpenSegment, now: float) -> float | None:
        """Seconds until `seg`'s held entries go without an ack (None: they wait for one)."""
        if not seg.unsent or len(seg.batches) != 1 or not seg.batches[0].retrying:
            return None
        return seg.unsent_since + self._linger_s - now

    def send_lac_locked(self, seg: OpenSegment) -> None:
        """A LAC-only update of `seg` to its live nodes, so tail readers of an idle segment with
        aq > 1 see its last acknowledged entries."""
        for node in seg.live_nodes():
            self._submit(node, seg, None)

    def stop(self, left: Callable[[float], float]) -> None:
        """Wait up to `left(5)` seconds (the rest of close's budget) for this writer's sends in
        flight to end (`stopping` is set: none is retried any more). A send blocked in a slow
        node call is answered at its deadline; the writer is closed by then, so it is ignored."""
        deadline = time.monotonic() + left(5)
        with self._quiet:
            while self._sends > 0:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return
                self._quiet.wait(wait)
