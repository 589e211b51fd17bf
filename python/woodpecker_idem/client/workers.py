"""The writer's background threads: one sender per LogStore node, one for slow maintenance.

They work on their writer only through the narrow interfaces below (`SenderCore`, a fence
callback), which `LogWriter` implements with public names."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError
from typing import TYPE_CHECKING, Protocol

from ..errors import EntryConflictError, SegmentFencedError, WoodpeckerError, WriterFencedError
from ..retry import Backoff
from .segment import Batch, SegmentHandle, SegmentStatus, Waiter

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport

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


class SenderCore(Protocol):
    """What a `NodeWorker` uses of its writer: its settings, whether it is fenced, and where an
    ack or a node's failure goes (`LogWriter` implements it)."""

    log_id: int
    timeout_s: float  # append.timeout_ms in seconds: the retry backoff's ceiling is a tenth
    max_retries: int  # append.max_retries

    @property
    def fenced(self) -> bool: ...

    def on_ack(self, node: str, seg: SegmentHandle, batch: Batch) -> None: ...

    def on_node_failed(self, node: str, seg: SegmentHandle, batch: Batch, exc: Exception) -> None:
        """`node` gave up on `batch` (after its retries, or at once for a final error)."""


class NodeWorker:
    """Sends batches to one node in order, retrying each up to append.max_retries times."""

    def __init__(
        self,
        core: SenderCore,
        node: str,
        transport: LogStoreTransport,
        stopping: threading.Event,
    ):
        self.core = core
        self.node = node
        self.transport = transport
        self.stopping = stopping  # set when the writer closes or is fenced: retries end
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
                log.exception("log %s: sender for %s failed", self.core.log_id, self.node)

    def _send(self, seg: SegmentHandle, batch: Batch | None) -> None:
        """Send one batch until acked, retrying transient failures up to append.max_retries.

        `batch=None` is a LAC-only update (best effort) so readers of an idle segment with aq > 1
        see its last acknowledged entries.
        """
        w = self.core
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


class Maintenance:
    """One background thread for slow metadata/recovery work, off the write path. A task that
    finds the writer taken over (`WriterFencedError`) hands it to `on_fenced`."""

    def __init__(self, log_id: int, on_fenced: Callable[[WriterFencedError], None]):
        self.log_id = log_id
        self.on_fenced = on_fenced
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"wp-maint-{log_id}", daemon=True)
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
                self.on_fenced(exc)
            except Exception:
                log.exception(
                    "log %s: background task %s failed", self.log_id, getattr(fn, "__name__", fn)
                )
