"""One route's write in one task: the batch identity's decision, the rows it lets through, the
writer's call, and what the task reports of it.

The same code runs where the route's writer is: in the task's own Python worker, or in a sibling
worker on the same host that holds the log's writer and serves the task's rows (holder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import EarlyEvictionError
from ..meta.base import TxnMeta
from ..types import LogMessageId
from .batches import BatchId, RouteBatch, begin

if TYPE_CHECKING:
    from .._core import Payloads
    from ..client.client import WoodpeckerClient
    from ..client.log import LogHandle
    from ..writer.api import IdempotentLogWriter


@dataclass
class RouteReport:
    """What a route's write adds to its task's commit message."""

    early_evictions: int = 0  # keys the window let go by capacity while the task wrote
    txn: tuple[int, TxnMeta] | None = None  # (writer epoch, record) for the driver to mark
    skipped: int = 0
    replayed: int = 0


class RouteWrite:
    """A route's writer (None when its batch was committed before: nothing to write) and the
    identified batch it writes. `client`: the writer's own client when the writer may be kept
    open after the task; `tail`: where the writer's next entry goes, once known."""

    def __init__(
        self,
        name: str,
        writer: IdempotentLogWriter | None = None,
        client: WoodpeckerClient | None = None,
        tail: LogMessageId | None = None,
        batch: RouteBatch | None = None,
    ):
        self.name = name
        self.writer = writer
        self.client = client
        self.tail = tail
        self.batch = batch
        self.evictions = writer.window.early_evictions if writer is not None else 0

    def begin(
        self, client: WoodpeckerClient, handle: LogHandle, batch: BatchId, writer_name: str
    ) -> None:
        """Decide what this attempt writes of `batch` (see batches.begin); the batch starts where
        the writer's next entry goes."""
        w = self.writer
        assert w is not None
        start = self.tail if self.tail is not None else _log_end(handle)
        self.batch = begin(client, handle, w.epoch, batch, writer_name, start)

    def write(self, payloads: Payloads, keys: bytes) -> int:
        """Write the rows the batch still needs; returns the rows not written because the log
        has them."""
        n = len(payloads)
        if self.batch is not None:
            payloads, keys = self.batch.filter(payloads, keys)
            if not payloads:
                return n
        assert self.writer is not None  # a batch that is not DONE has its writer
        res = self.writer.write_keyed(payloads, keys)
        last_new = res.duplicate.rfind(0)  # entries are given ids in row order
        if last_new >= 0:
            self.tail = LogMessageId(res.segment_ids[last_new], res.entry_ids[last_new] + 1)
        self.check_evictions()
        return n - len(payloads) + res.duplicate.count(1)

    def check_evictions(self) -> None:
        """Without a batch identity, a key the window let go early is one a retry of this task
        would write again: fail now. With one, a retry reads the log back instead: the keys are
        only counted (and reported), as keys other batches will not be deduped against."""
        w = self.writer
        assert w is not None
        early = w.window.early_evictions - self.evictions
        if early and self.batch is None:
            raise EarlyEvictionError(
                f"{early} keys of log {self.name} left the window by capacity "
                f"(window_max_keys={w.window.max_keys}) before its duration while this task "
                "wrote: retries of them would be new writes. Raise the windowMaxKeys option "
                "above the rows one route receives within windowDurationS"
            )

    def report(self) -> RouteReport:
        """Every row handed over was written: what the driver needs of this route."""
        out = RouteReport()
        if self.writer is not None:
            out.early_evictions = self.writer.window.early_evictions - self.evictions
        if self.batch is not None:
            if self.writer is not None and self.batch.txn is not None:
                out.txn = (self.writer.epoch, self.batch.txn)
            out.skipped = self.batch.skipped
            out.replayed = self.batch.replayed
        return out


def _log_end(handle: LogHandle) -> LogMessageId:
    """Where the next entry of the log goes, as its writer (just opened) finds it."""
    reader = handle.open_reader("latest")
    try:
        return reader.position
    finally:
        reader.close()
