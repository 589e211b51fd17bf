"""The dedup stage: what the write pipeline asks of idempotence, and the no-op stage of a plain
writer.

The pipeline *calls* the stage, as Kafka's accumulator and sender consult `TransactionManager`;
the stage never calls the pipeline and holds no reference to it. A plain writer's stage is
`NoDedup`: no key column is kept, nothing is looked up, nothing is stored, no thread runs, so
non-idempotent writers pay nothing by construction. The idempotent stage (the dedup window, its
snapshots and its rebuild) lives in `woodpecker_idem.idempotency`; the composition root
(`connect.py`) decides which stage a writer gets.

Every `_locked` method is called with the pipeline's lock held, must not block, and never calls
back. Key columns are N*16 bytes (one 16-byte key per row); answers are columns too:
`status` (one byte per row: 0 new, 1 pending in flight, 2 committed) and the ids of the entries
holding the keys (`segs`, `ents`: little-endian int64 per row; the reserved ids for new rows).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Protocol

from ..errors import WriterFencedError

if TYPE_CHECKING:
    from .._core import Payloads

# (status, segment ids, entry ids): see the module doc
Answer = tuple[bytes, bytes, bytes]
# an Answer for a run's rows, then the frame of its new rows and how many records it holds
Run = tuple[bytes, bytes, bytes, bytes, int]


class Dedup(Protocol):
    """The stage a pipeline consults; `NoDedup` is the plain writer's."""

    keyed: bool  # False: the pipeline keeps no key column and never calls the key methods

    def prepare(self) -> None:
        """Opening, before the takeover: start reading what `rebuild` will need (it must not
        depend on the takeover's outcome), so the two wait on the network at once."""

    def rebuild(self, epoch: int) -> None:
        """Opening, after the takeover completed every earlier segment and before a segment is
        opened or any write accepted: load what the log already holds (the window)."""

    def lookup_locked(self, key: bytes, now_ms: int) -> tuple[int, int] | None:
        """(segment id, entry id) of the committed entry holding `key`, else None."""

    def answer_locked(self, keys: bytes, now_ms: int) -> Answer:
        """What the log holds of each key, reserving nothing (new rows answer status 0)."""

    def reserve_locked(
        self,
        keys: bytes,
        start: int,
        end: int,
        stamps: int | array,
        segment_id: int,
        first_entry_id: int,
        payloads: list[bytes] | Payloads,
        properties: list[dict | None] | None,
        codec: int,
    ) -> Run:
        """Judge the run of rows `start..end` (their keys in `keys`, N*16 bytes for all of
        `payloads`; row i as of `stamps[i]` ms, or all as of `stamps`), in order, and encode
        the new ones, in one native call: a new key is reserved at the next id from
        `first_entry_id` of `segment_id` (pending until committed or dropped) and its row goes
        into the frame (compressed per `codec`); a repeat within the run, or a key pending or
        committed already, is answered with the entry that holds it. Keys are reserved only
        together with their frame."""

    def committed_locked(self, segment_id: int, last_entry_id: int) -> None:
        """Every entry of `segment_id` up to `last_entry_id` reached its ack quorum."""

    def dropped_locked(self, segment_id: int) -> None:
        """`segment_id` was completed without its still-pending entries: forget their keys (a
        retry of one is a new write)."""

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        """`segment_id` is completed at `last_entry_id` (by this writer or a takeover)."""

    def fence_seen(self) -> WriterFencedError | None:
        """A takeover the stage noticed on its own (its snapshot's owner check), or None; the
        pipeline asks (each tick, and when asked whether it is fenced) and fences itself."""

    def stopped_locked(self) -> None:
        """The pipeline was fenced or is closing: no background work of the stage may write
        any more (a fenced writer must not touch the log's objects)."""

    def close(self, owner: bool, seconds: float | None) -> None:
        """The pipeline closed (lock not held); `owner`: it was not fenced, so the stage may
        leave its state behind (the window's final snapshot), within `seconds` (None: no bound;
        what does not finish in time is left: the next writer rebuilds from the log)."""

    def metrics(self) -> dict[str, float | int | None]:
        """The stage's figures for `metrics_snapshot()`."""


class NoDedup:
    """A plain writer's stage: no keys, no window, nothing to tell."""

    keyed = False

    def prepare(self) -> None:
        pass

    def rebuild(self, epoch: int) -> None:
        pass

    def lookup_locked(self, key: bytes, now_ms: int) -> tuple[int, int] | None:
        return None

    def answer_locked(self, keys: bytes, now_ms: int) -> Answer:
        raise TypeError("a plain writer keeps no keys")

    def reserve_locked(
        self,
        keys: bytes,
        start: int,
        end: int,
        stamps: int | array,
        segment_id: int,
        first_entry_id: int,
        payloads: list[bytes] | Payloads,
        properties: list[dict | None] | None,
        codec: int,
    ) -> Run:
        raise TypeError("a plain writer keeps no keys")

    def committed_locked(self, segment_id: int, last_entry_id: int) -> None:
        pass

    def dropped_locked(self, segment_id: int) -> None:
        pass

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        pass

    def fence_seen(self) -> WriterFencedError | None:
        return None

    def stopped_locked(self) -> None:
        pass

    def close(self, owner: bool, seconds: float | None) -> None:
        pass

    def metrics(self) -> dict[str, float | int | None]:
        return {}


NO_DEDUP = NoDedup()
