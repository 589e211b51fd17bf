"""Build the dedup window (`open_window`: open_writer's window options, checked like their config
keys) and rebuild it before an idempotent writer accepts writes (docs/architecture.md).

Newest valid snapshot (older one if corrupt, or if it does not match the log's metadata: see
`snapshot.snapshot_problem`), then the gap: entries after each watermark and whole
segments the snapshot does not know, then time eviction. Entries carry their key, so nothing is
re-hashed. The window is the writer's own (8.5): a snapshot taken under a smaller duration or
capacity lacks keys the writer's window holds, so those are read back from the log first. Entries
go in in log order (back-fill, snapshot, gap), so the same log gives the same window with or
without a snapshot. Reads skip a down, lagging or corrupt replica for another one (8.6).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._core import DedupWindow, Snapshot
from .._proto.logstore_pb2 import LogEntry
from ..client.keyarchive import load_archive
from ..config import KEYS, Section, check_value
from ..ensemble.replicas import ReplicaFault, read_entry_keys
from ..errors import ConfigError, InvalidArgumentError, InvalidTypeError, NodeUnavailableError
from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore, SegmentMeta
from ..objectstore.base import ObjectStore
from ..types import LogMessageId, SegmentState
from .snapshot import load_newest, snapshot_problem

log = logging.getLogger(__name__)

# Entries asked of a node per read of the gap: each read is handed to the node's sender thread
# and back, and on a busy machine each hand-off waits for its turn on a core (a 1M-entry gap took
# 500 of them at 2,000); 10,000 entries of 1 KiB are ~10 MB in flight.
READ_CHUNK = 10_000
# A taking-over writer whose clock is this far behind the log's newest timestamp is warned about:
# the window is measured on writers' clocks, so skew shortens it (docs/semantics.md).
CLOCK_SKEW_WARN_MS = 1000

Span = tuple[SegmentMeta, int, int]  # a segment and the entry ids to read, first..last


@dataclass(frozen=True)
class RecoveryReport:
    seconds: float
    snapshot_key_count: int  # keys loaded from the snapshot
    snapshot_age_ms: int | None  # None: no snapshot
    corrupt_snapshots: int
    entries_replayed: int  # entries read from the log (back-fill and gap)
    segments_replayed: int
    window_size: int
    entries_backfilled: int = 0  # read before the snapshot's coverage: its window was smaller
    corrupt_replicas: tuple[ReplicaFault, ...] = ()  # skipped for another replica
    # how far this writer's clock was behind the newest time the log holds (0: not behind)
    clock_behind_ms: int = 0
    # of `seconds`: finding, reading and decoding the snapshot and loading its keys; reading the
    # log's entries (back-fill and gap) and adding theirs
    snapshot_seconds: float = 0.0
    replay_seconds: float = 0.0


def open_window(
    cfg: Section, window_duration_s: float | None, window_max_keys: int | None
) -> DedupWindow:
    """An empty window of `open_writer`'s options, `cfg` (`idempotency.*`) where they are None.
    Each is checked like its config key (type and range: NaN, infinity, bool, a float for an
    int, or a value out of range is refused here, naming the option), before any takeover."""
    duration = _window_option("window_duration_s", window_duration_s, cfg.window_duration_s)
    max_keys = int(_window_option("window_max_keys", window_max_keys, cfg.window_max_keys))
    return DedupWindow(max_keys, max(1, int(duration * 1000)))


def _window_option(name: str, value: object, default: object) -> int | float:
    if value is None:
        value = default
    key = next(k for k in KEYS if k.name == f"idempotency.{name}")
    number = (int, float) if key.kind == "number" else int
    if isinstance(value, bool) or not isinstance(value, number):
        raise InvalidTypeError(
            f"{name} must be {key.allowed()}, not {type(value).__name__} {value!r}"
        )
    try:
        return check_value(key.name, value)
    except ConfigError:
        raise InvalidArgumentError(f"{name} must be {key.allowed()}, not {value!r}") from None


def rebuild_window(
    window: DedupWindow,
    log_id: int,
    meta: MetadataStore,
    objects: ObjectStore,
    transport: LogStoreTransport,
    now_ms: int,
    fetched: tuple[str, Snapshot | str | None] | None = None,
) -> tuple[RecoveryReport, dict[int, int]]:
    """Fill `window`; returns the report and the watermarks of the segments now covered.
    `fetched`: the newest snapshot, read already (see `load_newest`).

    A key may occur more than once (rewritten after its window expired): `add_committed` keeps
    the occurrence at the later log position, so loading in log order leaves the newest.
    """
    started = time.perf_counter()
    epoch = meta.get_log_by_id(log_id).writer_epoch
    # the keys of a TRUNCATED segment come from what truncation kept (docs/semantics.md)
    segments = [s for s in meta.list_segments(log_id) if s.state is not SegmentState.ACTIVE]
    ends = {s.segment_id: s.last_entry_id for s in segments}
    snap, corrupt = load_newest(
        objects, log_id, lambda s: snapshot_problem(s, epoch, ends), fetched
    )
    snapshot_s = time.perf_counter() - started
    horizon = now_ms - window.window_ms
    # a segment completed at or before the horizon holds only entries older than the window
    young = {s.segment_id for s in segments if not 0 < s.completed_ms <= horizon}
    if snap is None:
        before: list[Span] = []
        after = [(s, 0, s.last_entry_id) for s in segments if s.segment_id in young]
    else:
        before, after = _plan(snap, segments, young, window)
    faults: dict[tuple[str, int, str], ReplicaFault] = {}

    def on_corrupt(fault: ReplicaFault) -> None:
        faults.setdefault((fault.node, fault.segment_id, fault.error), fault)

    # the newest time a writer's clock put in the log: entries read, the snapshot, completions
    newest = [max([s.completed_ms for s in segments], default=0)]
    if snap is not None:
        newest[0] = max(newest[0], snap.timestamp_ms)
    # Size the index once for everything about to go in (an upper bound: unkeyed entries count
    # too), instead of growing it while the snapshot and then the gap, a read at a time, go in.
    window.reserve_committed(
        sum(last - first + 1 for _, first, last in before + after)
        + (0 if snap is None else len(snap))
    )
    t0 = time.perf_counter()
    backfilled = sum(
        _replay(window, transport, objects, meta, span, on_corrupt, newest) for span in before
    )
    t1 = time.perf_counter()
    loaded = _load_snapshot(window, snap, segments) if snap is not None else 0
    t2 = time.perf_counter()
    replayed = backfilled + sum(
        _replay(window, transport, objects, meta, span, on_corrupt, newest) for span in after
    )
    replay_s = (t1 - t0) + (time.perf_counter() - t2)
    snapshot_s += t2 - t1
    behind = max(0, newest[0] - now_ms)
    if behind > CLOCK_SKEW_WARN_MS:
        log.warning(
            "log %s: this writer's clock is %.3f s behind the newest timestamp in the log: the "
            "writers' clocks are skewed. The dedup window is measured on them, so keys written "
            "by the other host up to that long ago may be out of this writer's window sooner "
            "(a retry would write them again); keep the writer hosts' clocks synchronized (NTP), "
            "with skew far below idempotency.window_duration_s",
            log_id,
            behind / 1000,
        )
    window.evict(now_ms)
    report = RecoveryReport(
        seconds=time.perf_counter() - started,
        snapshot_key_count=loaded,
        snapshot_age_ms=None if snap is None else now_ms - snap.timestamp_ms,
        corrupt_snapshots=corrupt,
        entries_replayed=replayed,
        segments_replayed=len({span[0].segment_id for span in before + after}),
        window_size=len(window),
        entries_backfilled=backfilled,
        corrupt_replicas=tuple(faults.values()),
        clock_behind_ms=behind,
        snapshot_seconds=snapshot_s,
        replay_seconds=replay_s,
    )
    covered = {s.segment_id: s.last_entry_id for s in segments if s.segment_id in young}
    log.info(
        "log %s: window rebuilt in %.3f s: %d keys from snapshot (age %s ms), %d entries "
        "replayed from %d segments (%d read back for a window larger than the snapshot's), "
        "%d corrupt snapshots, %d corrupt replicas skipped",
        log_id,
        report.seconds,
        report.snapshot_key_count,
        report.snapshot_age_ms,
        report.entries_replayed,
        report.segments_replayed,
        report.entries_backfilled,
        report.corrupt_snapshots,
        len(report.corrupt_replicas),
    )
    return report, covered


def _load_snapshot(window: DedupWindow, snap: Snapshot, segments: list[SegmentMeta]) -> int:
    """Load the snapshot, leaving out entries past the end their segment was completed at.

    Such entries were acknowledged, then lost before they reached the disk (a power loss under
    `storage.fsync: batch_ms:N`, which acknowledges before the fdatasync) while the snapshot,
    synced on its own, outlived them. Their keys must not stay: a retry would be answered with
    the id of an entry that is not in the log, instead of writing it again."""
    ends = {s.segment_id: s.last_entry_id for s in segments}
    lost = {
        seg: ends[seg] for seg, mark in snap.watermarks.items() if seg in ends and mark > ends[seg]
    }
    if not lost:  # the snapshot is not used again: its entries become the window's
        return snap.take_into(window)
    kept = [e for e in snap.entries() if e[1] not in lost or e[2] <= lost[e[1]]]
    log.warning(
        "log %s: the snapshot names %d entries past the end of their segments (%s: segment -> "
        "last entry); they were acknowledged but did not survive on the LogStore nodes, so "
        "their keys are left out of the window and a retry writes them again",
        snap.log_id,
        len(snap) - len(kept),
        lost,
    )
    return window.add_committed_many(
        b"".join(e[0] for e in kept),
        array("q", [e[1] for e in kept]),
        array("q", [e[2] for e in kept]),
        array("q", [e[3] for e in kept]),
    )


def _plan(
    snap: Snapshot, segments: list[SegmentMeta], young: set[int], window: DedupWindow
) -> tuple[list[Span], list[Span]]:
    """What to read before loading the snapshot (back-fill) and after it (the gap).

    The gap: entries after each watermark, and whole segments newer than every segment the
    snapshot knows (seed cases 1, 4, 6). A segment older than that which the snapshot does not
    know was out of the window of the writer that took it.

    The back-fill, only when the snapshot's window is smaller than the writer's: the entries
    the snapshot covers (up to its watermarks) that precede its oldest entry, where the keys it
    evicted under its own bounds lie.
    """
    marks = snap.watermarks
    newest = max(marks, default=-1)
    after: list[Span] = []
    for s in segments:
        if s.segment_id in marks:
            start = marks[s.segment_id] + 1
        elif s.segment_id > newest and s.segment_id in young:
            start = 0
        else:
            continue
        if start <= s.last_entry_id:
            after.append((s, start, s.last_entry_id))
    before: list[Span] = []
    if snap.window_ms >= window.window_ms and snap.window_max_keys >= window.max_keys:
        return before, after
    oldest = min((LogMessageId(seg, entry) for _, seg, entry, _ in snap.entries()), default=None)
    for s in segments:
        if s.segment_id > newest or s.segment_id not in young:
            continue
        if oldest is not None and s.segment_id > oldest.segment_id:
            break
        end = min(marks.get(s.segment_id, s.last_entry_id), s.last_entry_id)
        if oldest is not None and s.segment_id == oldest.segment_id:
            end = min(end, oldest.entry_id - 1)
        if end >= 0:
            before.append((s, 0, end))
    if before:
        log.info(
            "log %s: the snapshot's window (%d ms, %d keys) is smaller than the writer's "
            "(%d ms, %d keys); reading %d segments back to fill it",
            snap.log_id,
            snap.window_ms,
            snap.window_max_keys,
            window.window_ms,
            window.max_keys,
            len(before),
        )
    return before, after


def _replay(
    window: DedupWindow,
    transport: LogStoreTransport,
    objects: ObjectStore,
    meta: MetadataStore,
    span: Span,
    on_corrupt: Callable[[ReplicaFault], None],
    newest: list[int],
) -> int:
    """Add the keyed entries of a span as committed, in log order; returns entries read.
    `newest[0]` is raised to the newest timestamp read."""
    seg, entry, last = span
    if seg.state is SegmentState.TRUNCATED:  # its entries are gone: only keys were kept
        return _replay_archive(window, objects, seg, entry, last, newest)
    while entry <= last:
        try:
            keys = read_entry_keys(
                transport, seg, entry, min(READ_CHUNK, last - entry + 1), on_corrupt
            )
        except NodeUnavailableError:
            # a truncation running now may have dropped it since the segments were listed:
            # it keeps a window's keys aside before it deletes (keyarchive.py), so read those
            now = meta.get_segment(seg.log_id, seg.segment_id)
            if now is not None and now.state is not SegmentState.TRUNCATED:
                raise  # still there: a real outage, retried by the caller
            log.info(
                "log %s: segment %s was truncated during the window rebuild; reading its kept "
                "keys instead",
                seg.log_id,
                seg.segment_id,
            )
            return entry - span[1] + _replay_archive(window, objects, seg, entry, last, newest)
        window.add_committed_keys(keys)
        if keys.last_timestamp_ms is not None:  # log order: the newest unless a clock went back
            newest[0] = max(newest[0], keys.last_timestamp_ms)
        entry += len(keys)
    return last - span[1] + 1


def _replay_archive(
    window: DedupWindow,
    objects: ObjectStore,
    seg: SegmentMeta,
    entry: int,
    last: int,
    newest: list[int],
) -> int:
    """The kept keys of truncated `seg` in entries entry..last (see `_replay`)."""
    kept = [e for e in load_archive(objects, seg) if entry <= e.entry_id <= last]
    _add(window, kept, newest)
    return len(kept)


def _add(window: DedupWindow, entries: Sequence[LogEntry], newest: list[int]) -> None:
    if entries:  # log order: the last entry is the newest unless a clock went backwards
        newest[0] = max(newest[0], entries[-1].timestamp_ms)
    keys = bytearray()
    segs, ids, stamps = array("q"), array("q"), array("q")
    for e in entries:
        if len(e.idempotency_key) == 16:
            keys += e.idempotency_key
            segs.append(e.segment_id)
            ids.append(e.entry_id)
            stamps.append(e.timestamp_ms)
    if keys:
        window.add_committed_many(bytes(keys), segs, ids, stamps)
