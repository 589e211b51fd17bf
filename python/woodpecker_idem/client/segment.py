"""One open segment on the writer side: pending entries, batches in flight, acks, the LAC.

Entries are encoded once (`record` bytes), so every resend is byte-identical. A batch commits at aq
acks and every earlier batch has committed, which keeps commits in entry order.
State changes happen under the owning writer's lock; futures are resolved after it is released.
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from .._core import concat
from ..logstore.blocks import split_frame
from ..meta.base import SegmentMeta
from ..types import LogMessageId, WriteResult


class Waiter(Protocol):
    """What waits on a pending entry: a `Future`, or a batch call's rows (`RunWaiter`)."""

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException | None) -> None: ...


class RunWaiter(Waiter, Protocol):
    """The one waiter of a run (`PendingEntry.count` > 1): told once for all its entries (its
    result carries the first entry's id) and split when a segment ends inside the run."""

    def split(self, count: int) -> tuple[RunWaiter, RunWaiter]:
        """(the waiter of the first `count` entries, that of the rest)."""
        ...


class SegmentStatus(enum.Enum):
    OPEN = "open"  # takes new entries
    ROLLED = "rolled"  # takes no new entries; completes once drained
    FAILED = "failed"  # lost its quorum; being completed by the recovery rule
    DONE = "done"  # completed; nothing pending


class PendingEntry:
    """An entry assigned an id but not yet committed; the unit callers wait on and retries join.

    A run (`count` > 1, made by the batch lane) is `count` consecutive entries with one record
    frame (`record`: their records end to end) and one waiter: nothing per row."""

    __slots__ = (
        "count",
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
        future: Waiter | None,
        deadline: float,
        count: int = 1,
    ):
        self.count = count
        self.seq = seq
        self.segment_id = segment_id
        self.entry_id = entry_id
        self.record = record
        self.future = future
        self.joiners: list[Waiter] | None = None
        self.deadline = deadline
        self.timed_out = False

    @property
    def last_entry_id(self) -> int:
        return self.entry_id + self.count - 1

    def waiters(self) -> list[tuple[Waiter, bool]]:
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
        return self.entries[-1].last_entry_id


def span(entries: list[PendingEntry]) -> int:
    """How many entries `entries` (consecutive, in entry order) hold, runs counted in full."""
    return entries[-1].last_entry_id - entries[0].entry_id + 1 if entries else 0


class EntryJoiner:
    """A waiter joining one entry inside a run: the run's result names its first entry, this
    tells the joiner the id of the entry it joined."""

    __slots__ = ("waiter", "entry_id")

    def __init__(self, waiter: Waiter, entry_id: int):
        self.waiter = waiter
        self.entry_id = entry_id

    def set_result(self, result: WriteResult) -> None:
        mid = LogMessageId(result.message_id.segment_id, self.entry_id)
        self.waiter.set_result(WriteResult(mid, result.duplicate))

    def set_exception(self, exception: BaseException | None) -> None:
        self.waiter.set_exception(exception)


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
        self.unsent_entries = 0  # runs counted in full
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
        items = 0  # a run is never cut: the batch lane makes runs within both limits
        for entry in self.unsent:
            if count and (
                count + entry.count > max_entries or size + len(entry.record) > max_bytes
            ):
                break
            count += entry.count
            size += len(entry.record)
            items += 1
        entries = self.unsent[:items]
        batch = Batch(entries[0].entry_id, entries, concat([e.record for e in entries]))
        # Only now change state, with no Python call between the steps: a KeyboardInterrupt
        # (raised after a call returns) cannot leave entries out of both `unsent` and `batches`,
        # which would never be sent while later batches commit past them.
        del self.unsent[:items]
        self.unsent_bytes -= size
        self.unsent_entries -= count
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

    def find(self, entry_id: int) -> PendingEntry | None:
        """The pending entry or run holding `entry_id`, if any."""
        entry = self.by_entry.get(entry_id)  # a single entry, or a run's first
        if entry is not None or not self.pending:
            return entry
        i = bisect.bisect_right(self.pending, entry_id, key=_first_id) - 1
        if i >= 0 and self.pending[i].entry_id <= entry_id <= self.pending[i].last_entry_id:
            return self.pending[i]
        return None

    def drained(self) -> bool:
        return not self.pending

    def resolve_completed(
        self, last_entry_id: int
    ) -> tuple[list[PendingEntry], list[PendingEntry]]:
        """The segment completed at `last_entry_id`: (present -> committed, absent -> dropped)."""
        committed = [e for e in self.pending if e.last_entry_id <= last_entry_id]
        dropped = [e for e in self.pending if e.entry_id > last_entry_id]
        for e in self.pending:  # a run the end falls inside: its head is in, its tail is not
            if e.entry_id <= last_entry_id < e.last_entry_id:
                head, tail = _split_run(e, last_entry_id - e.entry_id + 1)
                committed.append(head)
                dropped.insert(0, tail)
        self.pending.clear()
        self.unsent.clear()
        self.unsent_bytes = 0
        self.unsent_entries = 0
        self.unsent_since = 0.0  # time.monotonic() when the oldest unsent entry was queued
        self.batches.clear()
        self.by_entry.clear()
        self.lac = max(self.lac, last_entry_id)
        self.status = SegmentStatus.DONE
        return committed, dropped


def _first_id(entry: PendingEntry) -> int:
    return entry.entry_id


def _split_run(run: PendingEntry, count: int) -> tuple[PendingEntry, PendingEntry]:
    """A run cut after its first `count` entries (the segment was completed between them):
    records, waiter and joiners go with the entries they belong to."""
    records = split_frame(run.record, "pending run")
    waiter = cast("RunWaiter | None", run.future)
    head_waiter, tail_waiter = waiter.split(count) if waiter is not None else (None, None)
    parts = []
    for first, recs, waiter in (
        (run.entry_id, records[:count], head_waiter),
        (run.entry_id + count, records[count:], tail_waiter),
    ):
        part = PendingEntry(run.seq, run.segment_id, first, concat(recs), waiter, run.deadline)
        part.count = len(recs)
        part.timed_out = run.timed_out
        parts.append(part)
    for joiner in run.joiners or ():
        at = joiner.entry_id if isinstance(joiner, EntryJoiner) else run.entry_id
        part = parts[0] if at < run.entry_id + count else parts[1]
        if part.joiners is None:
            part.joiners = []
        part.joiners.append(joiner)
    return parts[0], parts[1]
