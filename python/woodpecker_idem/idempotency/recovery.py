"""Rebuild the dedup window before an idempotent writer accepts writes (DESIGN.md section 8).

Newest valid snapshot (older one if corrupt), then the gap: entries after each watermark and whole
segments the snapshot does not know, then time eviction. Entries carry their key, so nothing is
re-hashed.
"""

from __future__ import annotations

import logging
import time
from array import array
from dataclasses import dataclass

from .._core import DedupWindow
from ..errors import NodeUnavailableError
from ..logstore.blocks import decode_entry
from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore, SegmentMeta
from ..objectstore.base import ObjectStore
from ..types import SegmentState
from .snapshot import load_newest

log = logging.getLogger(__name__)

READ_CHUNK = 2000


@dataclass(frozen=True)
class RecoveryReport:
    seconds: float
    snapshot_key_count: int  # keys loaded from the snapshot
    snapshot_age_ms: int | None  # None: no snapshot
    corrupt_snapshots: int
    entries_replayed: int
    segments_replayed: int
    window_size: int


def rebuild_window(
    window: DedupWindow,
    log_id: int,
    meta: MetadataStore,
    objects: ObjectStore,
    transport: LogStoreTransport,
    now_ms: int,
) -> tuple[RecoveryReport, dict[int, int]]:
    """Fill `window`; returns the report and the watermarks of the segments now covered.

    A key may occur more than once (rewritten after its window expired): `add_committed` keeps
    the occurrence at the later log position, so loading in log order leaves the newest.
    """
    started = time.perf_counter()
    snap, corrupt = load_newest(objects, log_id)
    loaded = 0
    watermarks: dict[int, int] = {}
    if snap is not None:
        loaded = snap.load_into(window)
        watermarks = dict(snap.watermarks)
    horizon = now_ms - window.window_ms
    replayed = 0
    segments = 0
    covered: dict[int, int] = {}
    for seg in meta.list_segments(log_id):
        if seg.state not in (SegmentState.COMPLETED, SegmentState.SEALED):
            continue  # TRUNCATED segments are older than any window (seed case 5)
        if seg.segment_id in watermarks:
            start = watermarks[seg.segment_id] + 1
        elif 0 < seg.completed_ms <= horizon:
            continue  # every entry is older than the window (seed case 4)
        else:
            start = 0  # a segment the snapshot does not know (seed case 6)
        if start <= seg.last_entry_id:
            replayed += _replay(window, transport, seg, start)
            segments += 1
        if seg.completed_ms == 0 or seg.completed_ms > horizon:
            covered[seg.segment_id] = seg.last_entry_id
    window.evict(now_ms)
    report = RecoveryReport(
        seconds=time.perf_counter() - started,
        snapshot_key_count=loaded,
        snapshot_age_ms=None if snap is None else now_ms - snap.timestamp_ms,
        corrupt_snapshots=corrupt,
        entries_replayed=replayed,
        segments_replayed=segments,
        window_size=len(window),
    )
    return report, covered


def _replay(window: DedupWindow, transport: LogStoreTransport, seg: SegmentMeta, start: int) -> int:
    """Add the keyed entries of `seg` from `start` to its end as committed; returns entries read."""
    entry = start
    count = 0
    while entry <= seg.last_entry_id:
        want = min(READ_CHUNK, seg.last_entry_id - entry + 1)
        raw = _read_any(transport, seg, entry, want)
        keys = bytearray()
        segs, ids, stamps = array("q"), array("q"), array("q")
        for i, data in enumerate(raw):
            e = decode_entry(data, f"log {seg.log_id} entry {seg.segment_id}:{entry + i}")
            if len(e.idempotency_key) == 16:
                keys += e.idempotency_key
                segs.append(seg.segment_id)
                ids.append(entry + i)
                stamps.append(e.timestamp_ms)
        if keys:
            window.add_committed_many(bytes(keys), segs, ids, stamps)
        entry += len(raw)
        count += len(raw)
    return count


def _read_any(transport: LogStoreTransport, seg: SegmentMeta, entry: int, want: int) -> list[bytes]:
    errors = []
    for node in seg.nodes:
        try:
            raw = transport.read(node, seg.log_id, seg.segment_id, entry, want)
        except NodeUnavailableError as exc:
            errors.append(str(exc))
            continue
        if raw:
            return raw
    raise NodeUnavailableError(
        f"log {seg.log_id}: no node could serve {seg.segment_id}:{entry} during window recovery "
        f"({errors or 'entries missing'})"
    )
