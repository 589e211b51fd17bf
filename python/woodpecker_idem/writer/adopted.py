"""Before a writer counts entries in a segment it did not complete itself as its own, it compares
their bytes with its pending entries (recovery, before it seals a segment as empty, checks that
the storage holds the log at all: `ensemble.recovery.check_log_present`).

A repair completes the writer's segment by the recovery rule and then resolves the pending entries
by position: those at or below the end found are committed. When the end comes from a footer the
writer did not write (objects left by a log the metadata store has forgotten: its data lost, or
restored from an older copy), those positions hold another log's entries, and resolving by
position would acknowledge a write at another key's entry. So the stored bytes must be the
writer's own; if they are not, the writer is fenced (`MetadataLostError`) instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ensemble.replicas import read_checked
from ..errors import MetadataLostError
from ..logstore.blocks import record_entry, split_frame

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport
    from .segments import OpenSegment


def check_adopted(transport: LogStoreTransport, seg: OpenSegment, last_entry_id: int) -> None:
    """`MetadataLostError` unless every pending entry of `seg` at or below `last_entry_id` is
    stored with the bytes this writer sent."""
    where = f"segment {seg.meta.log_id}/{seg.segment_id}"
    for entry in list(seg.pending):  # a failed segment takes no new entries
        if entry.entry_id > last_entry_id:
            break
        ours = [record_entry(r, where) for r in split_frame(entry.record, where)]
        ours = ours[: last_entry_id - entry.entry_id + 1]
        stored: list[bytes] = []
        while len(stored) < len(ours):
            first = entry.entry_id + len(stored)
            stored += read_checked(transport, seg.meta, first, len(ours) - len(stored))
        for i, (mine, found) in enumerate(zip(ours, stored, strict=True)):
            if mine != found:
                raise MetadataLostError(
                    f"{where} was completed at entry {last_entry_id}, but entry "
                    f"{entry.entry_id + i} holds other bytes than the entry this writer sent "
                    "there: the segment's objects belong to a log the metadata "
                    "store no longer knows (its data lost, or restored from an older copy). "
                    "Nothing pending is acknowledged; restore the metadata store"
                )
