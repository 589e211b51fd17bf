"""Completing a segment: fence it, find its end by BookKeeper's recovery rule, seal it.

Used by a writer taking over (every ACTIVE segment of the log) and by a writer whose own segment
lost its quorum. Nothing past the last entry found is ever read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from .._core import concat
from ..errors import (
    CorruptEntryError,
    EntryConflictError,
    MetadataConflictError,
    NodeUnavailableError,
    QuorumUnavailableError,
    SegmentDamagedError,
    SegmentFencedError,
    WoodpeckerError,
)
from ..logstore.blocks import RECORD_HEADER
from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore, SegmentMeta
from ..types import SegmentState

if TYPE_CHECKING:
    from .uploads import SegmentUploads

log = logging.getLogger(__name__)

READ_CHUNK = 1000


def recover_segment(
    transport: LogStoreTransport,
    meta: MetadataStore,
    epoch: int,
    seg: SegmentMeta,
    now_ms: int,
    count_bytes: bool = True,
    uploads: SegmentUploads | None = None,
) -> SegmentMeta:
    """Fence `seg`, copy every entry some responding node holds up to aq copies, and complete it.

    With `count_bytes`, the size it records is the segment's bytes as a clean close counts them,
    which reads the entries it need not copy once more; without, it records the writer's count
    (0 for a segment its writer left) and the caller counts them later (`record_size`), off the
    wait of a takeover.

    Returns the segment's record, SEALED with its lastEntryId (staged storage, `uploads` given:
    COMPLETED, SEALED once uploaded, see `seal`). Raises `QuorumUnavailableError`
    when fewer than es - aq + 1 nodes answer the fence (try again later), `WriterFencedError` when
    another writer has taken the log over meanwhile.

    A node's footer is written only after a recovery decided the end, so a node already completed
    (an earlier recovery that could not seal the metadata) fixes lastEntryId: the other nodes are
    completed at that end, and entries past it on nodes that earlier recovery did not reach are
    never read (BookKeeper: once any node is completed, that is lastEntryId).
    """
    if seg.state is not SegmentState.ACTIVE:
        # its size was recorded then
        return seal(meta, epoch, seg, seg.last_entry_id, now_ms, uploads=uploads)
    needed = seg.es - seg.aq + 1
    replies: dict[str, int] = {}
    ends: dict[str, int] = {}  # nodes completed already, and where
    errors: dict[str, str] = {}
    damaged: SegmentDamagedError | None = None  # waiting would not mend it: not retriable
    for node in seg.nodes:
        try:
            replies[node] = transport.fence(node, seg.log_id, seg.segment_id)[0]
            end = transport.completed_end(node, seg.log_id, seg.segment_id)
        except (NodeUnavailableError, SegmentFencedError, CorruptEntryError) as exc:
            _skipped(seg, node, exc, errors)
            replies.pop(node, None)
            damaged = exc if isinstance(exc, SegmentDamagedError) else damaged
            continue
        if end is not None:
            ends[node] = end
    if len(replies) < needed:
        raise damaged or QuorumUnavailableError(
            f"segment {seg.log_id}/{seg.segment_id}: {len(replies)} of {seg.es} nodes answered the "
            f"fence, {needed} needed ({errors})"
        )
    if ends:
        # Any completed end is at or past every acknowledged entry (each recovery reached a node
        # of every ack quorum) and had aq copies made up to it; the lowest one is held everywhere.
        last = min(ends.values())
        log.info(
            "segment %s/%s: already completed on %s; completing the rest at %d",
            seg.log_id,
            seg.segment_id,
            ends,
            last,
        )
        nodes = list(ends) + [n for n in replies if n not in ends]
        size = _size_of(transport, seg, nodes, last) if count_bytes else None
    else:
        held = min(replies.values())  # entries up to it are not read forward: counted apart
        holders = sorted(replies, key=replies.__getitem__, reverse=True)
        last, tail = _read_forward(transport, seg, replies, errors, needed)
        if last < 0:
            check_log_present(transport, meta, seg)
        if not count_bytes:
            size = None
        else:
            prefix = _size_of(transport, seg, holders, held) if held >= 0 else 0
            size = None if prefix is None else prefix + tail
    for node in replies:
        if node in ends:
            continue  # a footer is never rewritten; the metadata decides which end readers use
        try:
            transport.complete(node, seg.log_id, seg.segment_id, last)
        except (NodeUnavailableError, EntryConflictError) as exc:
            log.warning(
                "segment %s/%s: complete on %s failed: %s", seg.log_id, seg.segment_id, node, exc
            )
    return seal(meta, epoch, seg, last, now_ms, size, uploads)


def record_size(transport: LogStoreTransport, meta: MetadataStore, seg: SegmentMeta) -> None:
    """Count a completed segment's bytes on one of its nodes and record them (a recovery that
    left it to its caller: `count_bytes=False`). Nothing changes if no node serves them, or the
    segment was dropped meanwhile; a concurrent update of the record is retried."""
    if seg.last_entry_id < 0:
        return
    try:
        size = _size_of(transport, seg, list(seg.nodes), seg.last_entry_id)
        for _ in range(5):
            current = meta.get_segment(seg.log_id, seg.segment_id)
            if size is None or current is None or current.state is SegmentState.TRUNCATED:
                return
            if current.size_bytes == size:
                return
            try:
                meta.update_segment(None, dataclasses.replace(current, size_bytes=size))
                return
            except MetadataConflictError:
                continue  # changed meanwhile (sealed, truncated): look again
    except WoodpeckerError as exc:  # the store is down: the size stays the writer's count
        log.warning("segment %s/%s: size not recorded: %s", seg.log_id, seg.segment_id, exc)


def _size_of(
    transport: LogStoreTransport, seg: SegmentMeta, nodes: list[str], last: int
) -> int | None:
    """The bytes of entries 0..`last` as the writer counts them (each record with its header,
    as a cleanly closed writer records `size_bytes`), read from the first of `nodes` that serves
    them all; None if none does. Retention's `max_bytes` and `logs`/`stat` go by this figure."""
    for node in nodes:
        size = 0
        entry = 0
        try:
            while entry <= last:
                chunk = transport.read(
                    node, seg.log_id, seg.segment_id, entry, min(READ_CHUNK, last - entry + 1)
                )
                if not chunk:
                    break
                size += sum(len(data) for data in chunk) + RECORD_HEADER.size * len(chunk)
                entry += len(chunk)
        except (NodeUnavailableError, CorruptEntryError) as exc:
            log.info(
                "segment %s/%s: could not count its bytes on %s: %s",
                seg.log_id,
                seg.segment_id,
                node,
                exc,
            )
            continue
        if entry > last:
            return size
    log.warning(
        "segment %s/%s: no node served entries 0..%d to count its bytes; its size is recorded "
        "as the writer's count, if any (retention.max_bytes undercounts it)",
        seg.log_id,
        seg.segment_id,
        last,
    )
    return None


def _read_forward(
    transport: LogStoreTransport,
    seg: SegmentMeta,
    replies: dict[str, int],
    errors: dict[str, str],
    needed: int,
) -> tuple[int, int]:
    """BookKeeper's recovery read: from the responders' common prefix, while any responder has
    the next entry, copy it to nodes that lack it until it has aq copies; returns the last one
    and the bytes of the entries read (records with their headers)."""
    entry = min(replies.values()) + 1  # every responder holds everything up to its minimum
    copied = 0
    size = 0
    while True:
        chunks: dict[str, list[bytes]] = {}
        for node in list(replies):
            try:
                chunks[node] = transport.read(node, seg.log_id, seg.segment_id, entry, READ_CHUNK)
            except (NodeUnavailableError, CorruptEntryError) as exc:  # the others may serve it
                _skipped(seg, node, exc, errors)
                del replies[node]
        if len(replies) < needed:
            raise QuorumUnavailableError(
                f"segment {seg.log_id}/{seg.segment_id}: nodes left during recovery ({errors})"
            )
        n = max(len(c) for c in chunks.values())
        if n == 0:
            break
        copies: dict[str, list[tuple[int, bytes]]] = {}
        for i in range(n):
            holders = [node for node, c in chunks.items() if len(c) > i]
            lacking = [node for node, c in chunks.items() if len(c) <= i]
            data = chunks[holders[0]][i]
            size += RECORD_HEADER.size + len(data)
            for node in lacking[: max(0, seg.aq - len(holders))]:
                copies.setdefault(node, []).append((entry + i, data))
        for node, items in copies.items():
            _copy(transport, node, seg, items)
            copied += len(items)
        entry += n
    if copied:
        log.info("segment %s/%s: recovery copied %d entries", seg.log_id, seg.segment_id, copied)
    return entry - 1, size


def _skipped(seg: SegmentMeta, node: str, exc: Exception, errors: dict[str, str]) -> None:
    """A node that cannot take part: down, fenced by someone else, or holding corrupt bytes."""
    errors[node] = str(exc)
    if isinstance(exc, CorruptEntryError):
        log.warning(
            "segment %s/%s: replica on %s is corrupt (%s); completing from the others",
            seg.log_id,
            seg.segment_id,
            node,
            exc,
        )


def _copy(
    transport: LogStoreTransport, node: str, seg: SegmentMeta, items: list[tuple[int, bytes]]
) -> None:
    """Write recovery copies to `node`, one frame per run of consecutive entries."""
    from ..logstore.blocks import encode_record

    run: list[bytes] = []
    first = items[0][0]
    prev = first - 1
    for entry_id, data in items + [(-1, b"")]:
        if entry_id != prev + 1 and run:
            transport.add_entries(
                node, seg.log_id, seg.segment_id, first, concat(run), recovery=True
            )
            run = []
            first = entry_id
        if entry_id >= 0:
            run.append(encode_record(data))
            prev = entry_id


def seal(
    meta: MetadataStore,
    epoch: int | None,
    seg: SegmentMeta,
    last_entry_id: int,
    now_ms: int,
    size_bytes: int | None = None,
    uploads: SegmentUploads | None = None,
) -> SegmentMeta:
    """ACTIVE -> COMPLETED (with lastEntryId) -> SEALED (object mode: footers are written).

    Staged storage (`uploads` given): the segment stays COMPLETED and is handed to `uploads`,
    which records it SEALED once a node of its ensemble has uploaded it to object storage.

    `size_bytes`: the segment's bytes as recovery counted them; otherwise the writer's count
    (`seg.size_bytes`) or what the record holds."""
    current = meta.get_segment(seg.log_id, seg.segment_id) or seg
    if current.state is SegmentState.ACTIVE:
        current = meta.update_segment(
            epoch,
            dataclasses.replace(
                current,
                state=SegmentState.COMPLETED,
                last_entry_id=last_entry_id,
                completed_ms=now_ms,
                size_bytes=(
                    size_bytes
                    if size_bytes is not None
                    else seg.size_bytes or current.size_bytes  # the writer's count, if given
                ),
            ),
        )
    if current.state is SegmentState.COMPLETED and uploads is not None:
        uploads.submit(meta, current, epoch)
    elif current.state is SegmentState.COMPLETED:
        current = meta.update_segment(
            epoch, dataclasses.replace(current, state=SegmentState.SEALED)
        )
    return current


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
