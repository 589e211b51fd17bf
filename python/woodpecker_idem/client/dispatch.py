"""Group commit: when a segment's queued entries go to its nodes, and in which batches.

`Dispatch` cuts batches and hands each to the `NodeWorker` (workers.py) of every live node of the
segment; the workers' acks come back to the writer (`SenderCore.on_ack`), which calls
`send_locked` again for what was held meanwhile. Every method runs under the writer's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .segment import SegmentHandle, SegmentStatus
from .workers import NodeWorker, SenderCore

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport


class Dispatch:
    """One writer's node senders and its group-commit rule (append.max_batch_entries,
    append.max_batch_bytes, append.linger_ms)."""

    def __init__(
        self,
        core: SenderCore,
        transport: LogStoreTransport,
        stopping: threading.Event,
        *,
        max_batch_entries: int,
        max_batch_bytes: int,
        linger_s: float,
    ):
        self._core = core
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
                self._workers[node] = NodeWorker(self._core, node, self._transport, self._stopping)

    def send_locked(self, seg: SegmentHandle) -> None:
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

    def send_due(self, seg: SegmentHandle, now: float) -> float | None:
        """Seconds until `seg`'s held entries go without an ack (None: they wait for one)."""
        if not seg.unsent or len(seg.batches) != 1 or not seg.batches[0].retrying:
            return None
        return seg.unsent_since + self._linger_s - now

    def send_lac_locked(self, seg: SegmentHandle) -> None:
        """A LAC-only update of `seg` to its live nodes, so tail readers of an idle segment with
        aq > 1 see its last acknowledged entries."""
        for node in seg.live_nodes():
            self._workers[node].submit(seg, None)

    def stop(self, left: Callable[[float], float]) -> None:
        """Stop every sender, each waited for `left(5)` seconds (the rest of close's budget)."""
        for worker in self._workers.values():
            worker.stop(left(5))
