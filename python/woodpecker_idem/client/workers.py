"""The writer's background threads: one sender per LogStore node, one for slow maintenance."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import InvalidStateError
from typing import TYPE_CHECKING

from ..errors import EntryConflictError, SegmentFencedError, WoodpeckerError, WriterFencedError
from ..retry import Backoff
from .segment import Batch, SegmentHandle, SegmentStatus, Waiter

if TYPE_CHECKING:
    from .writer import LogWriter

log = logging.getLogger(__name__)


def resolve(items: Sequence[tuple[Waiter, object]]) -> None:
    """Set results/exceptions outside the writer's lock (callbacks may call back into it)."""
    for future, outcome in items:
        try:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        except InvalidStateError:  # already resolved (e.g. timed out, or cancelled by the caller)
            pass


class NodeWorker:
    """Sends batches to one node in order, retrying each up to append.max_retries times."""

    def __init__(self, writer: LogWriter, node: str):
        self.writer = writer
        self.node = node
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"wp-node-{node}", daemon=True)
        self.thread.start()

    def submit(self, seg: SegmentHandle, batch: Batch | None) -> None:
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
                log.exception("log %s: sender for %s failed", self.writer.log_id, self.node)

    def _send(self, seg: SegmentHandle, batch: Batch | None) -> None:
        """Send one batch until acked, retrying transient failures up to append.max_retries.

        `batch=None` is a LAC-only update (best effort) so readers of an idle segment with aq > 1
        see its last acknowledged entries.
        """
        w = self.writer
        if batch is None:
            try:
                w._transport.add_entries(
                    self.node, w.log_id, seg.segment_id, seg.lac + 1, b"", seg.lac
                )
            except Exception as exc:  # the next batch carries the LAC anyway
                log.debug("log %s: LAC update to %s failed: %s", w.log_id, self.node, exc)
            return
        backoff = Backoff(0.02, max(w._timeout_s / 10, 0.01), stop=w._stopping)
        while w._fenced is None and self.node not in seg.failed_nodes:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE):
                return
            try:
                w._transport.add_entries(
                    self.node, w.log_id, seg.segment_id, batch.first_entry_id, batch.frame, seg.lac
                )
            except (SegmentFencedError, EntryConflictError) as exc:
                w._on_node_failed(self.node, seg, batch, exc)
                return
            except WoodpeckerError as exc:
                if not exc.retriable or backoff.attempts >= w._max_retries:
                    w._on_node_failed(self.node, seg, batch, exc)
                    return
                batch.retrying = True  # later entries stop waiting for its ack (linger_ms)
                if not backoff.wait():
                    return  # the writer is closing: close() fails what is still pending
                continue
            except Exception as exc:  # e.g. OSError from a full disk: this node is out
                log.exception("log %s: add to %s failed", w.log_id, self.node)
                w._on_node_failed(self.node, seg, batch, exc)
                return
            w._on_ack(self.node, seg, batch)
            return


class Maintenance:
    """One background thread for slow metadata/recovery work, off the write path."""

    def __init__(self, writer: LogWriter):
        self.writer = writer
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._run, name=f"wp-maint-{writer.log_id}", daemon=True
        )
        self.thread.start()

    def submit(self, fn, *args) -> None:
        self.queue.put((fn, args))

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to end after the queued tasks; wait up to `timeout` (retrying tasks end
        once the writer's stop event is set)."""
        self.queue.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except WriterFencedError as exc:
                with self.writer._lock:
                    resolved = self.writer._fence_locked(exc)
                resolve(resolved)
            except Exception:
                log.exception(
                    "log %s: background task %s failed",
                    self.writer.log_id,
                    getattr(fn, "__name__", fn),
                )
