"""The idempotent writer's dedup stage: the window of one log, its snapshots and its rebuild,
behind the `Dedup` protocol the write pipeline calls (as Kafka's broker keeps producer state in
`ProducerStateManager` and Woodpecker keeps it in `log/idempotent/`). Dedup state only: it holds
no reference to the pipeline and never calls it; the pipeline tells it what was reserved,
committed, dropped and completed, and asks it to judge keys.

A key's life in the window: reserved pending when its run is admitted (`reserve_locked`), then
committed when the run reaches its ack quorum (`committed_locked`: a prefix of the segment), or
forgotten when its segment is completed without it (`dropped_locked`). Committed keys are evicted
by age (`window_duration_s`) and capacity (`window_max_keys`); a capacity eviction of a key
younger than the duration is an early eviction: counted, and warned about at most once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from array import array
from typing import TYPE_CHECKING

from .._core import Payloads, SnapshotStream
from ..errors import EarlyEvictionWarning, WriterFencedError
from ..writer.dedup import Answer, Run
from .rebuild import RecoveryReport, open_window, rebuild_window
from .snapshot import SnapshotPrefetch, SnapshotSource, Snapshotter

if TYPE_CHECKING:
    from ..ensemble import LogContext

log = logging.getLogger(__name__)

EARLY_WARNING_EVERY_S = 60.0  # early evictions are logged at most this often (all are counted)


class WindowStage:
    """The dedup window of one log as the pipeline's stage (see the module doc)."""

    keyed = True

    def __init__(
        self,
        ctx: LogContext,
        *,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
    ):
        cfg = ctx.config.idempotency
        self.window = open_window(cfg, window_duration_s, window_max_keys)  # checks the options
        self.log_id = ctx.log_id
        self._cfg = cfg
        self._clock = ctx.clock
        self._meta = ctx.meta
        self._objects = ctx.objects
        self._transport = ctx.calls  # node reads with the ensemble's deadline
        self._scheduler = ctx.ensemble.scheduler  # where its snapshots are written
        self._watermarks: dict[int, int] = {}  # segment -> last entry whose key is committed
        self._new_keys = 0  # keys committed since the last snapshot
        self._early_unreported = 0  # early evictions not logged yet (see _warn_early)
        self._early_warned_at = -EARLY_WARNING_EVERY_S
        self._early_shown = False  # the EarlyEvictionWarning was issued
        self._next_evict_ms = 0
        self._evict_every_ms = max(1, min(1000, self.window.window_ms // 100))
        self._stopped = False  # fenced or closing: no background snapshot any more
        self._final = False  # closing as the owner: the final snapshot may be written
        self._fence_seen: WriterFencedError | None = None  # a takeover the owner check saw
        self._epoch = -1
        self.report: RecoveryReport | None = None
        self.snapshotter: Snapshotter | None = None
        self._prefetch: SnapshotPrefetch | None = None

    # --- opening ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self._prefetch = SnapshotPrefetch(self._objects, self.log_id, self._scheduler)

    def rebuild(self, epoch: int) -> None:
        """Fill the window from the newest valid snapshot and the log after it, then start the
        snapshot thread (its snapshots carry `epoch`)."""
        self._epoch = epoch
        prefetch, self._prefetch = self._prefetch, None
        report, covered = rebuild_window(
            self.window,
            self.log_id,
            self._meta,
            self._objects,
            self._transport,
            self._clock.now_ms(),
            fetched=None if prefetch is None else prefetch.take(),
        )
        self._watermarks.update(covered)
        self.report = report
        cfg = self._cfg
        self.snapshotter = Snapshotter(
            store=self._objects,
            log_id=self.log_id,
            epoch=epoch,
            clock_ms=self._clock.now_ms,
            capture=self._capture,
            new_keys=self._pending_new_keys,
            still_owner=self._still_owner,
            interval_s=cfg.snapshot_interval_s,
            threshold=cfg.snapshot_threshold,
            kept=cfg.snapshots_kept,
            scheduler=self._scheduler,
        )

    # --- judging keys (the pipeline's lock is held) -----------------------------------------------

    def lookup_locked(self, key: bytes, now_ms: int) -> tuple[int, int] | None:
        hit = self.window.get(key, now_ms)
        if hit is None or not hit.committed:
            return None
        return hit.segment_id, hit.entry_id

    def answer_locked(self, keys: bytes, now_ms: int) -> Answer:
        return self.window.get_many(keys, now_ms)

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
        oldest = stamps if isinstance(stamps, int) else stamps[start]
        if oldest >= self._next_evict_ms:  # lookups ignore expired keys in between
            self.window.evict(oldest)
            self._next_evict_ms = oldest + self._evict_every_ms
        return self.window.reserve_frame(
            keys, start, end, stamps, segment_id, first_entry_id, payloads, properties, codec
        )

    # --- what happened to entries (the pipeline's lock is held) ---------------------------------

    def committed_locked(self, segment_id: int, last_entry_id: int) -> None:
        window = self.window
        before = window.early_evictions
        self._new_keys += window.commit_through(segment_id, last_entry_id)
        # after the keys: a snapshot copies the watermarks first, then fixes the end of the
        # window it streams (_capture)
        self._watermarks[segment_id] = last_entry_id
        early = window.early_evictions - before
        if early:
            self._warn_early(early)
        snapshotter = self.snapshotter
        if snapshotter is not None and self._new_keys >= snapshotter.due_keys:
            snapshotter.kick()

    def dropped_locked(self, segment_id: int) -> None:
        self.window.drop_segment(segment_id)  # completed without them: all that is left

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        self._watermarks[segment_id] = last_entry_id

    def stopped_locked(self) -> None:
        self._stopped = True
        if self.snapshotter is not None:
            self.snapshotter.cancel()

    def close(self, owner: bool, seconds: float | None) -> None:
        """Stop the snapshot thread; a clean close leaves a fresh snapshot within `seconds` (an
        object store that hangs must not hold the close: the next writer rebuilds the window
        from the log instead)."""
        snapshotter = self.snapshotter
        if snapshotter is None:
            return
        snapshotter.stop()
        if not owner:
            return
        self._final = True  # the pipeline is closed, and was not fenced: capture may run
        final = threading.Thread(
            target=snapshotter.write_now, name=f"wp-final-snapshot-{self.log_id}", daemon=True
        )
        final.start()
        final.join(seconds)
        if final.is_alive():
            log.warning(
                "log %s: the final snapshot did not finish within the close timeout; the next "
                "writer rebuilds the window from the log",
                self.log_id,
            )

    # --- snapshots (the snapshot thread) ---------------------------------------------------

    def _capture(self, now_ms: int) -> SnapshotSource | None:
        """The window's committed keys as a snapshot stream, and the watermarks. The watermarks
        are copied first, then the stream fixes the end of the commit order: every key at or
        below them was committed before, so it lies before that end and the stream reads it,
        unless it is evicted (or, its window past, written again) before its chunk is read,
        which leaves the snapshot as if that happened before it was taken. A key committed in
        between lies before the end too, above its watermark: the rebuild reads it again,
        harmlessly; one committed after the end is above the watermarks and not in the stream."""
        if self._stopped and not self._final:
            return None
        marks = dict(self._watermarks)
        stream = SnapshotStream(self.window, self.log_id, self._epoch, now_ms, marks)
        source = SnapshotSource(stream, self._new_keys)
        self._new_keys = 0
        return source

    def _pending_new_keys(self) -> int:
        return self._new_keys

    def _still_owner(self) -> bool:
        """Whether the log is still this writer's epoch (a fenced writer must not touch the
        log's snapshots); asked of the metadata store, not of the pipeline."""
        if self._stopped and not self._final:
            return False
        try:  # an unreachable store raises: the snapshotter counts a failure and retries
            self._meta.check_epoch(self.log_id, self._epoch)
        except WriterFencedError as exc:
            self._fence_seen = exc  # the pipeline asks (`fence_seen`) and fences itself
            return False
        return True

    def fence_seen(self) -> WriterFencedError | None:
        return self._fence_seen

    def _warn_early(self, early: int) -> None:
        """Log early evictions at most once per EARLY_WARNING_EVERY_S: a window too small for
        its rate evicts early at every commit, and one line per commit would flood the log."""
        self._early_unreported += early
        if not self._early_shown:  # once per writer, where a user sees it without logging set up
            self._early_shown = True
            warnings.warn(
                f"log {self.log_id}: keys were evicted from the idempotency window by capacity "
                f"before window_duration_s (window_max_keys={self.window.max_keys} is too small "
                "for this rate: size it at least keys per second x window_duration_s); a retry "
                "of such a key is written again. Counted in "
                "metrics_snapshot()['early_evictions']",
                EarlyEvictionWarning,
                stacklevel=2,
            )
        now = time.monotonic()
        if now - self._early_warned_at < EARLY_WARNING_EVERY_S:
            return
        log.warning(
            "log %s: %d keys evicted by capacity before window_duration_s since the last warning "
            "(window_max_keys=%d is too small for this rate); retries of them would be new "
            "writes. Counted in metrics_snapshot()['early_evictions']; warned at most once a "
            "minute",
            self.log_id,
            self._early_unreported,
            self.window.max_keys,
        )
        self._early_warned_at = now
        self._early_unreported = 0

    # --- figures ------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float | int | None]:
        w = self.window
        s = self.snapshotter
        r = self.report
        return {
            "pending": w.pending_count,
            "window_keys": w.committed_count,
            "window_memory_bytes": w.memory_bytes(),
            "evictions": w.evictions,
            "early_evictions": w.early_evictions,
            "snapshot_writes": s.writes if s else 0,
            "snapshot_failures": s.failures if s else 0,
            "snapshot_bytes": s.bytes_written if s else 0,
            "recovery_seconds": r.seconds if r else None,
            "recovery_snapshot_age_ms": r.snapshot_age_ms if r else None,
            "recovery_entries_replayed": r.entries_replayed if r else 0,
            "recovery_corrupt_replicas": len(r.corrupt_replicas) if r else 0,
        }


__all__ = ["WindowStage"]
