"""The sender: group commit and one sender thread per LogStore node (Kafka's `Sender`).

`Dispatch` decides when a segment's queued entries go to its nodes, and in which batches, and
hands each batch to the `NodeWorker` of every live node of the segment; a worker sends its node's
batches in order, retrying each up to append.max_retries times. Acks and a node's failure go back
to the pipeline (`SenderView.on_ack` / `on_node_failed`), which commits in entry order and calls
`send_locked` again for what was held meanwhile. `Dispatch` runs under the writer's lock; the
workers never take it except through those two calls.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from ..errors import EntryConflictError, SegmentFencedError, WoodpeckerError
from ..retry import Backoff
from .segments import Batch, OpenSegment, SegmentStatus

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport

log = logging.getLogger(__name__)


class SenderView(Protocol):
    """What a `NodeWorker` uses of its writer: its settings, whether it is fenced, and where an
    ack or a node's failure goes (`LogWriter` implements it)."""

    log_id: int
    timeout_s: float  # append.timeout_ms in seconds: the retry backoff's ceiling is a tenth
    max_retries: int  # append.max_retries

    @property
    def fenced(self) -> bool: ...

    def on_ack(self, node: str, seg: OpenSegment, batch: Batch) -> None: ...

    def on_node_failed(self, node: str, seg: OpenSegment, batch: Batch, exc: Exception) -> None:
        """`node` gave up on `batch` (after its retries, or at once for a final error)."""


class NodeWorker:
    """Sends batches to one node in order, retrying each up to append.max_retries times."""

    def __init__(
        self,
        pipeline: SenderView,
        node: str,
        transport: LogStoreTransport,
        stopping: threading.Event,
    ):
        self.pipeline = pipeline
        self.node = node
        self.transport = transport
        self.stopping = stopping  # set when the writer closes or is fenced: retries end
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"wp-node-{node}", daemon=True)
        self.thread.start()

    def submit(self, seg: OpenSegment, batch: Batch | None) -> None:
        self.queue.put((seg, batch))

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end and wait up to `timeout` (a send blocked in a slow node call
        ends on its own later; the writer is closed by then, so its outcome is ignored)."""
        self.queue.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            try:
                self._send(*item)
            except Exception:  # a bug must not silently stop this node's sends
                log.exception("log %s: sender for %s failed", self.pipeline.log_id, self.node)
            # Not kept while waiting for the next one: the batch's frame (and its segment) would
            # outlive the batch by as long as this node stays idle.
            del item

    def _send(self, seg: OpenSegment, batch: Batch | None) -> None:
        """Send one batch until acked, retrying transient failures up to append.max_retries.

        `batch=None` is a LAC-only update (best effort) so readers of an idle segment with aq > 1
        see its last acknowledged entries.
        """
        w = self.pipeline
        transport = self.transport
        if batch is None:
            try:
                transport.add_entries(
                    self.node, w.log_id, seg.segment_id, seg.lac + 1, b"", seg.lac
                )
            except Exception as exc:  # the next batch carries the LAC anyway
                log.debug("log %s: LAC update to %s failed: %s", w.log_id, self.node, exc)
            return
        backoff = Backoff(0.02, max(w.timeout_s / 10, 0.01), stop=self.stopping)
        while not w.fenced and self.node not in seg.failed_nodes:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE):
                return
            try:
                transport.add_entries(
                    self.node, w.log_id, seg.segment_id, batch.first_entry_id, batch.frame, seg.lac
                )
            except (SegmentFencedError, EntryConflictError) as exc:
                w.on_node_failed(self.node, seg, batch, exc)
                return
            except WoodpeckerError as exc:
                if not exc.retriable or backoff.attempts >= w.max_retries:
                    w.on_node_failed(self.node, seg, batch, exc)
                    return
                batch.retrying = True  # later entries stop waiting for its ack (linger_ms)
                if not backoff.wait():
                    return  # the writer is closing: close() fails what is still pending
                continue
            except Exception as exc:  # e.g. OSError from a full disk: this node is out
                log.exception("log %s: add to %s failed", w.log_id, self.node)
                w.on_node_failed(self.node, seg, batch, exc)
                return
            w.on_ack(self.node, seg, batch)
            return


class Dispatch:
    """One writer's node senders and its group-commit rule (append.max_batch_entries,
    append.max_batch_bytes, append.linger_ms)."""

    def __init__(
        self,
        pipeline: SenderView,
        transport: LogStoreTransport,
        stopping: threading.Event,
        *,
        max_batch_entries: int,
        max_batch_bytes: int,
        linger_s: float,
    ):
        self._pipeline = pipeline
        self._transport = transport
        self._stopping = stopping
        self._max_batch_entries = max_batch_entries
        self._max_batch_bytes = max_batch_bytes
        self._linger_s = linger_s
        self._workers: dict[str, NodeWorker] = {}

    def add_nodes(self, nodes: Iterable[str]) -> None:
        """A segment on `nodes` opened: start a sender for each node that has none yet."""
        for node in nodes:
            if node not in self._workers:
                self._workers[node] = NodeWorker(
                    self._pipeline, node, self._transport, self._stopping
                )

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
                    self._workers[node].submit(seg, batch)
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
            self._workers[node].submit(seg, None)

    def stop(self, left: Callable[[float], float]) -> None:
        """Stop every sender, each waited for `left(5)` seconds (the rest of close's budget)."""
        for worker in self._workers.values():
            worker.stop(left(5))
