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
    max_keys: int,
    window_ms: int,
    log_id: int,
    meta: MetadataStore,
    objects: ObjectStore,
    transport: LogStoreTransport,
    now_ms: int,
) -> tuple[DedupWindow, RecoveryReport, dict[int, int]]:
    """A window rebuilt from snapshot + gap; also the report and the covered segments' ends.

    A key may occur more than once (rewritten after its window expired): the newest occurrence
    must win, so the gap is read first and deduplicated, and the snapshot's older entry of such
    a key is left out.
    """
    started = time.perf_counter()
    snap, corrupt = load_newest(objects, log_id)
    watermarks: dict[int, int] = dict(snap.watermarks) if snap is not None else {}
    horizon = now_ms - window_ms
    gap = _Gap()
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
            gap.read(transport, seg, start)
            segments += 1
        if seg.completed_ms == 0 or seg.completed_ms > horizon:
            covered[seg.segment_id] = seg.last_entry_id
    keys, segs, ids, stamps = gap.newest()
    window = DedupWindow(max_keys, window_ms)
    loaded = 0
    if snap is not None:
        loaded = snap.load_into(window)
        if keys and _conflicts(window, keys, segs, ids, now_ms):
            window, loaded = _load_without(snap, max_keys, window_ms, set(gap.by_key))
    if keys:
        window.add_committed_many(keys, segs, ids, stamps)
    window.evict(now_ms)
    report = RecoveryReport(
        seconds=time.perf_counter() - started,
        snapshot_key_count=loaded,
        snapshot_age_ms=None if snap is None else now_ms - snap.timestamp_ms,
        corrupt_snapshots=corrupt,
        entries_replayed=gap.entries,
        segments_replayed=segments,
        window_size=len(window),
    )
    return window, report, covered


class _Gap:
    """Keyed entries read after the snapshot, in log order."""

    def __init__(self) -> None:
        self.order: list[tuple[bytes, int, int, int]] = []
        self.by_key: dict[bytes, int] = {}  # key -> index of its newest occurrence
        self.entries = 0

    def read(self, transport: LogStoreTransport, seg: SegmentMeta, start: int) -> None:
        entry = start
        while entry <= seg.last_entry_id:
            want = min(READ_CHUNK, seg.last_entry_id - entry + 1)
            raw = _read_any(transport, seg, entry, want)
            for i, data in enumerate(raw):
                e = decode_entry(data, f"log {seg.log_id} entry {seg.segment_id}:{entry + i}")
                if len(e.idempotency_key) == 16:
                    self.by_key[e.idempotency_key] = len(self.order)
                    self.order.append(
                        (e.idempotency_key, seg.segment_id, entry + i, e.timestamp_ms)
                    )
            entry += len(raw)
            self.entries += len(raw)

    def newest(self) -> tuple[bytes, array, array, array]:
        """Columns of each key's newest occurrence, in log order."""
        keys = bytearray()
        segs, ids, stamps = array("q"), array("q"), array("q")
        for i, (key, seg, entry, ts) in enumerate(self.order):
            if self.by_key[key] == i:
                keys += key
                segs.append(seg)
                ids.append(entry)
                stamps.append(ts)
        return bytes(keys), segs, ids, stamps


def _conflicts(window: DedupWindow, keys: bytes, segs: array, ids: array, now_ms: int) -> bool:
    """True if the window holds a gap key at another position (an older occurrence)."""
    status, seg_col, id_col = window.get_many(keys)
    have_segs, have_ids = array("q"), array("q")
    have_segs.frombytes(seg_col)
    have_ids.frombytes(id_col)
    return any(
        status[i] == 2 and (have_segs[i], have_ids[i]) != (segs[i], ids[i])
        for i in range(len(status))
    )


def _load_without(snap, max_keys: int, window_ms: int, skip: set[bytes]) -> tuple[DedupWindow, int]:
    """The snapshot's entries minus `skip` (keys the gap rewrote), in a fresh window."""
    window = DedupWindow(max_keys, window_ms)
    keys = bytearray()
    segs, ids, stamps = array("q"), array("q"), array("q")
    for key, seg, entry, ts in snap.entries():
        if key not in skip:
            keys += key
            segs.append(seg)
            ids.append(entry)
            stamps.append(ts)
    loaded = window.add_committed_many(bytes(keys), segs, ids, stamps) if keys else 0
    return window, loaded


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
