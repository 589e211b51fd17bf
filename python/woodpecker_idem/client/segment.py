"""One open segment on the writer side: pending entries, batches in flight, acks, the LAC.

Entries are encoded once (`record` bytes), so every resend is byte-identical. A batch commits at aq
acks and every earlier batch has committed, which keeps commits in entry order.
State changes happen under the owning writer's lock; futures are resolved after it is released.
"""

from __future__ import annotations

import enum
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .._core import concat
from ..meta.base import SegmentMeta


class SegmentStatus(enum.Enum):
    OPEN = "open"  # takes new entries
    ROLLED = "rolled"  # takes no new entries; completes once drained
    FAILED = "failed"  # lost its quorum; being completed by the recovery rule
    DONE = "done"  # completed; nothing pending


class PendingEntry:
    """An entry assigned an id but not yet committed; the unit callers wait on and retries join."""

    __slots__ = (
        "seq",
        "segment_id",
        "entry_id",
        "record",
        "future",
        "joiners",
        "deadline",
        "timed_out",
    )

    def __init__(
        self,
        seq: int,
        segment_id: int,
        entry_id: int,
        record: bytes,
        future: Future | None,
        deadline: float,
    ):
        self.seq = seq
        self.segment_id = segment_id
        self.entry_id = entry_id
        self.record = record
        self.future = future
        self.joiners: list[Future] | None = None
        self.deadline = deadline
        self.timed_out = False

    def waiters(self) -> list[tuple[Future, bool]]:
        """(future, duplicate) for the creator and every call that joined."""
        out = []
        if self.future is not None:
            out.append((self.future, False))
        if self.joiners:
            out.extend((f, True) for f in self.joiners)
        return out


@dataclass(eq=False)
class Batch:
    first_entry_id: int
    entries: list[PendingEntry]
    frame: bytes
    acks: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    retrying: bool = False  # a node failed it once: entries held behind it go after linger_ms

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + len(self.entries) - 1


class SegmentHandle:
    """Writer-side state of one segment; every method is called with the writer's lock held."""

    def __init__(self, meta: SegmentMeta, created_monotonic: float):
        self.meta = meta
        self.segment_id = meta.segment_id
        self.status = SegmentStatus.OPEN
        self.next_entry_id = 0
        self.size_bytes = 0
        self.created = created_monotonic
        self.pending: deque[PendingEntry] = deque()  # uncommitted, in entry order
        self.unsent: list[PendingEntry] = []  # not yet in a batch
        self.unsent_bytes = 0
        self.unsent_since = 0.0  # time.monotonic() when the oldest unsent entry was queued
        self.batches: deque[Batch] = deque()  # sent, not committed, in order
        self.failed_nodes: dict[str, str] = {}  # node -> why
        self.lac = -1
        self.lac_sent = -1  # highest LAC piggybacked to the nodes
        self.by_entry: dict[int, PendingEntry] = {}

    @property
    def aq(self) -> int:
        return self.meta.aq

    def quorum_lost(self) -> bool:
        return len(self.failed_nodes) > self.meta.es - self.meta.aq

    def live_nodes(self) -> list[str]:
        return [n for n in self.meta.nodes if n not in self.failed_nodes]

    def take_batch(self, max_entries: int, max_bytes: int) -> Batch:
        """Cut the next batch from the unsent entries (at least one entry, even if oversized);
        called only while there are unsent entries."""
        count = 0
        size = 0
        for entry in self.unsent:
            if count and (count >= max_entries or size + len(entry.record) > max_bytes):
                break
            count += 1
            size += len(entry.record)
        entries = self.unsent[:count]
        batch = Batch(entries[0].entry_id, entries, concat([e.record for e in entries]))
        # Only now change state, with no Python call between the steps: a KeyboardInterrupt
        # (raised after a call returns) cannot leave entries out of both `unsent` and `batches`,
        # which would never be sent while later batches commit past them.
        del self.unsent[:count]
        self.unsent_bytes -= size
        self.batches.append(batch)
        return batch

    def ack(self, node: str, batch: Batch) -> list[PendingEntry]:
        """Record an ack; returns the entries that became committed, in order."""
        batch.acks.add(node)
        committed: list[PendingEntry] = []
        while self.batches and len(self.batches[0].acks) >= self.aq:
            done = self.batches.popleft()
            for _ in done.entries:
                # entries are committed in order; the deque head is always this entry
                head = self.pending.popleft()
                del self.by_entry[head.entry_id]
                committed.append(head)
            self.lac = done.last_entry_id
        return committed

    def drained(self) -> bool:
        return not self.pending

    def resolve_completed(
        self, last_entry_id: int
    ) -> tuple[list[PendingEntry], list[PendingEntry]]:
        """The segment completed at `last_entry_id`: (present -> committed, absent -> dropped)."""
        committed = [e for e in self.pending if e.entry_id <= last_entry_id]
        dropped = [e for e in self.pending if e.entry_id > last_entry_id]
        self.pending.clear()
        self.unsent.clear()
        self.unsent_bytes = 0
        self.unsent_since = 0.0  # time.monotonic() when the oldest unsent entry was queued
        self.batches.clear()
        self.by_entry.clear()
        self.lac = max(self.lac, last_entry_id)
        self.status = SegmentStatus.DONE
        return committed, dropped
