"""Before a writer counts entries in a segment it did not complete itself as its own, it compares
their bytes with its pending entries; before recovery seals a segment as empty, it checks that
the storage holds the log at all (`check_log_present`).

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
from ..errors import CorruptEntryError, MetadataLostError, NodeUnavailableError
from ..logstore.blocks import record_entry, split_frame
from ..types import SegmentState

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport
    from ..meta.base import MetadataStore, SegmentMeta
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


def check_log_present(transport: LogStoreTransport, meta: MetadataStore, seg: SegmentMeta) -> None:
    """Before `seg` is sealed as empty (recovery found none of its entries): `CorruptEntryError`
    if the nodes do not hold the last entry of the newest earlier segment the metadata says was
    written either. Then these nodes' storage is not where this log was written (another root, a
    wiped bucket or directory), and sealing would lose every entry its writer acknowledged."""
    earlier = [
        s
        for s in meta.list_segments(seg.log_id)
        if s.segment_id < seg.segment_id
        and s.state in (SegmentState.COMPLETED, SegmentState.SEALED)
        and s.last_entry_id >= 0
    ]
    if not earlier:
        return
    prev = earlier[-1]
    down: list[NodeUnavailableError] = []
    for node in prev.nodes:
        try:
            if transport.read(node, prev.log_id, prev.segment_id, prev.last_entry_id, 1):
                return
        except NodeUnavailableError as exc:  # another replica may answer
            down.append(exc)
        except CorruptEntryError:  # held, though damaged: the storage is the log's
            return
    if down:  # a node that is back may hold it: retried
        raise down[0]
    raise CorruptEntryError(
        f"segment {seg.log_id}/{seg.segment_id}: none of its entries can be found, and neither "
        f"can entry {prev.last_entry_id} of segment {prev.segment_id}, which the metadata says "
        f"was written (nodes {', '.join(prev.nodes)}): this storage does not hold the log (another "
        "objectstore.root, or its objects deleted). The segment is not sealed as empty, which "
        "would lose the entries its writer acknowledged; point the client at the log's storage "
        "or restore it"
    )
