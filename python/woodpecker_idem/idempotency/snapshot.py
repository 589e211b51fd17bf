"""Dedup snapshots on object storage: naming, writing off the write path, retention, loading.

Key: `dedup_snapshot/{log_id}/snapshot_{epoch:020}_{timestamp_ms:020}`, relative to the client's
object store, which connect() roots at `{objectstore.root}/{store_id}/` (log ids are only unique
within one metadata store). Lexical order is (epoch, time) order: the newest snapshot sorts last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core import Snapshot, SnapshotStream, decode_snapshot
from ..errors import SnapshotCorruptError, WoodpeckerError
from ..objectstore.base import ObjectStore
from ..retry import Backoff

if TYPE_CHECKING:
    from ..ensemble.scheduler import Scheduler, Timer

log = logging.getLogger(__name__)


def snapshot_problem(snap: Snapshot, epoch: int, segments: dict[int, int]) -> str | None:
    """Why `snap` cannot be a snapshot of this log as its metadata describes it, or None.

    `epoch` is the log's writer epoch (the taking-over writer's), `segments` the last entry id of
    each completed segment. A snapshot passing the CRC can still be foreign or crafted: one from
    a future epoch, or with a watermark past its segment's end, would make recovery skip entries
    it must read (a committed key written again); a position in a segment the log does not have,
    or past its end, or one two keys claim, would answer a key never written as a duplicate.
    (A single key put at another key's entry cannot be told without reading the entry.)"""
    if snap.epoch > epoch:
        return f"written at epoch {snap.epoch}, after the log's current epoch {epoch}"
    for what, marks in (("watermark", snap.watermarks), ("entry", snap.segment_ends())):
        for segment_id, last in sorted(marks.items()):
            end = segments.get(segment_id)
            if end is None:
                return f"{what} in segment {segment_id}, which the log has not completed"
            if last > end:
                return f"{what} at entry {last} of segment {segment_id}, which ends at {end}"
    shared = snap.shared_position()
    if shared is not None:
        return f"two keys at one entry, {shared[0]}:{shared[1]}"
    return None


def snapshot_prefix(log_id: int) -> str:
    return f"dedup_snapshot/{log_id}/"


def snapshot_key(log_id: int, epoch: int, timestamp_ms: int) -> str:
    return f"{snapshot_prefix(log_id)}snapshot_{epoch:020d}_{timestamp_ms:020d}"


def list_snapshots(store: ObjectStore, log_id: int) -> list[str]:
    """Snapshot keys, oldest first."""
    prefix = snapshot_prefix(log_id)
    return sorted(k for k in store.list(prefix) if k[len(prefix) :].startswith("snapshot_"))


def read_snapshot(store: ObjectStore, log_id: int, key: str) -> Snapshot | str | None:
    """The snapshot stored at `key` decoded, or why it cannot be one of log `log_id`'s, or None
    if it is gone (deleted since it was listed)."""
    data = store.get(key)
    if data is None:
        return None
    try:
        snap = decode_snapshot(data)
    except SnapshotCorruptError as exc:
        return f"is corrupt: {exc}"
    if snap.log_id != log_id:
        return f"belongs to log {snap.log_id}"
    return snap


class SnapshotPrefetch:
    """The newest snapshot of a log read and decoded on the client's scheduler while the taking-over
    writer fences and completes the segments before it (both wait on the network; a 1M-key snapshot
    takes tens of milliseconds to decode). `take()` gives what was read, or None if the read has not
    started yet: then it never will, and the rebuild reads the snapshot itself.

    The snapshot is judged only at the rebuild, against the metadata as the takeover left it. One
    written by the old writer after this listing is missed; any valid snapshot is a correct start
    (the gap after it is replayed), so the rebuild only replays more."""

    def __init__(self, store: ObjectStore, log_id: int, scheduler: Scheduler):
        self._store = store
        self._log_id = log_id
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" -> "done"; or "queued" -> "taken"
        self._done = threading.Event()
        self._result: tuple[str, Snapshot | str | None] | None = None
        if not scheduler.submit(("snapshot-prefetch", log_id), self._run):
            self._state = "taken"  # the scheduler is closing: nothing will run

    def _run(self) -> None:
        with self._lock:
            if self._state != "queued":
                return
            self._state = "running"
        try:
            keys = list_snapshots(self._store, self._log_id)
            if keys:
                self._result = (keys[-1], read_snapshot(self._store, self._log_id, keys[-1]))
        except Exception:  # the rebuild reads again, and reports what fails then
            log.debug("log %s: snapshot prefetch failed", self._log_id, exc_info=True)
        finally:
            with self._lock:
                self._state = "done"
            self._done.set()

    def take(self) -> tuple[str, Snapshot | str | None] | None:
        """(key, what `read_snapshot` gave) for the newest snapshot, or None (none was read)."""
        with self._lock:
            if self._state == "queued":
                self._state = "taken"
                return None
        # Running or done: the read is under way on a worker and ends by itself (the store's own
        # timeouts bound it), so waiting here costs less than reading again.
        self._done.wait()
        return self._result


def load_newest(
    store: ObjectStore,
    log_id: int,
    problem: Callable[[Snapshot], str | None] | None = None,
    fetched: tuple[str, Snapshot | str | None] | None = None,
) -> tuple[Snapshot | None, int]:
    """The newest snapshot that decodes (and in which `problem` finds nothing wrong), else an
    older one. Returns (snapshot, corrupt count): one `problem` refuses counts as corrupt.
    `fetched`: one snapshot read already (by a `SnapshotPrefetch`), not read again."""
    corrupt = 0
    for key in reversed(list_snapshots(store, log_id)):
        got = fetched[1] if fetched is not None and fetched[0] == key else None
        got = got if got is not None else read_snapshot(store, log_id, key)
        if got is None:
            continue
        if isinstance(got, str):
            corrupt += 1
            log.warning("log %s: snapshot %s %s; ignored, trying an older one", log_id, key, got)
            continue
        why = problem(got) if problem is not None else None
        if why is not None:
            corrupt += 1
            log.warning(
                "log %s: snapshot %s does not match the log's metadata (%s); ignored, trying an "
                "older one",
                log_id,
                key,
                why,
            )
            continue
        return got, corrupt
    return None, corrupt


@dataclass
class SnapshotSource:
    """What the writer hands the snapshotter: the snapshot as a stream of parts, made from the
    live window a chunk at a time as the store writes it (a copy of a large window, or its whole
    encoding, would double the writer's memory), and the new keys it accounts for."""

    stream: SnapshotStream
    new_keys: int


# A snapshot holds the whole window, so writing one every `threshold` new keys costs O(window)
# each time: quadratic in the keys written while a large window fills. The next snapshot waits
# for max(threshold, the last snapshot's keys / SNAPSHOT_GROWTH) new keys instead, which keeps
# the snapshots' total cost linear (about 3x the window) and recovery's replay within a third
# of the window.
SNAPSHOT_GROWTH = 2
# ... and for at least min(SNAPSHOT_GAP_S, snapshot_interval_s) after the last one: a writer
# filling its window fast (a Spark task: 250,000 keys in about a second) wrote 9 snapshots of
# 16 MB in all, each fsynced beside the log's own fdatasyncs, a third of its time. Recovery
# then replays at most a third of the window or one gap's writes, whichever is more: about a
# second of reading at most (the reader does ~500k entries/s; a batch call writes up to ~760k/s).
SNAPSHOT_GAP_S = 1.0


class Snapshotter:
    """Writes snapshots every `interval_s` or after `due_keys` new keys (`threshold`, or half
    the last snapshot's keys if more) but at least min(SNAPSHOT_GAP_S, `interval_s`) apart, off
    the write path: a timer of the client's `scheduler` checks whether one is due (`kick()` asks
    it to look now), and the write runs as a task of the scheduler's workers. Without a
    scheduler nothing runs in the background (`write_now()` only).

    A failed write is logged, counted and retried with backoff; writes go on meanwhile. A fenced
    writer stops and deletes nothing.
    """

    def __init__(
        self,
        *,
        store: ObjectStore,
        log_id: int,
        epoch: int,
        clock_ms: Callable[[], int],
        capture: Callable[[int], SnapshotSource | None],
        new_keys: Callable[[], int],
        still_owner: Callable[[], bool],
        interval_s: float,
        threshold: int,
        kept: int,
        scheduler: Scheduler | None = None,
    ):
        self.store = store
        self.log_id = log_id
        self.epoch = epoch
        self._clock_ms = clock_ms
        self._capture = capture
        self._new_keys = new_keys
        self._still_owner = still_owner
        self.interval_s = interval_s
        self.threshold = threshold
        self.due_keys = threshold  # new keys that make a snapshot due (see SNAPSHOT_GROWTH)
        self._gap_s = min(SNAPSHOT_GAP_S, interval_s)  # the least time between two snapshots
        self.kept = kept
        self.writes = 0
        self.failures = 0
        self._failing = 0  # failures in a row
        self.bytes_written = 0
        self.last_key: str | None = None
        self._stop = threading.Event()
        self._last = time.monotonic()
        self._backoff: Backoff | None = None  # set while snapshots fail
        # A write is queued or running (set and cleared on the timer thread and the task's
        # worker, never both at once: the timer submits a write only while none is, and the
        # write re-arms the timer only after clearing it).
        self._writing = False
        self._idle = threading.Event()  # no write queued or running
        self._idle.set()
        self._scheduler = scheduler
        self._timer: Timer | None = None
        if scheduler is not None:
            self._timer = scheduler.timer(self._check, f"snapshot-{log_id}")
            self._timer.at(time.monotonic() + self._poll_s())

    @property
    def active(self) -> bool:
        """Snapshots are still being scheduled (not stopped, and the client not closed)."""
        return self._timer is not None and not self._stop.is_set() and not self._timer.cancelled

    def kick(self) -> None:
        """Ask for a snapshot soon (threshold reached)."""
        if self._timer is not None:
            self._timer.poke()

    def cancel(self) -> None:
        """Stop soon, without waiting (callable from the task itself, or under a lock)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()

    def stop(self) -> None:
        """Stop, and wait (up to 30 s) for a write under way to end."""
        self.cancel()
        if self._scheduler is not None and not self._scheduler.closed:
            self._idle.wait(30)

    def _poll_s(self) -> float:
        return self._backoff.next_delay() if self._backoff else min(self.interval_s, 1.0)

    def _check(self) -> float | None:
        """On the scheduler's timer thread: submit a write if one is due (by time, by new keys
        but not within the gap, or a retry after a failure); else when to look again."""
        if self._stop.is_set():
            return None
        if self._writing:
            return self._poll_s()
        since = time.monotonic() - self._last
        if since < self.interval_s and self._backoff is None:  # not due by time: by new keys?
            if self._new_keys() < self.due_keys:
                return min(self.interval_s - since, 1.0)
            if since < self._gap_s:
                return self._gap_s - since
        self._writing = True
        self._idle.clear()
        assert self._scheduler is not None  # a timer exists only with a scheduler
        if not self._scheduler.submit(self, self._write_task):
            self._writing = False
            self._idle.set()
        return None  # the write re-arms the timer when it ends

    def _write_task(self) -> None:
        try:
            try:
                ok = self.write_now()
            except Exception:  # a bug, not an outage: keep the log's snapshots coming anyway
                self.failures += 1
                log.exception("log %s: snapshot write failed; retrying", self.log_id)
                ok = False
            self._backoff = None if ok else (self._backoff or Backoff(initial_s=0.5, max_s=10.0))
        finally:
            self._writing = False
            self._idle.set()
        if not self._stop.is_set() and self._timer is not None:
            self._timer.at(time.monotonic() + self._poll_s())

    def write_now(self) -> bool:
        """Capture one snapshot and stream it to the store (encoded a chunk at a time as the
        store writes it), then trim old ones. False if it failed."""
        try:
            if not self._still_owner():
                self._stop.set()
                return False
            now = self._clock_ms()
            source = self._capture(now)
            if source is None:
                return False
            key = snapshot_key(self.log_id, self.epoch, now)
            stream = source.stream
            written = self.store.put_parts(key, stream)
            if not stream.done:  # a store must take every part: a cut snapshot is not one
                raise WoodpeckerError(f"snapshot {key}: the store stopped before its last part")
            self.due_keys = max(self.threshold, stream.count // SNAPSHOT_GROWTH)
        except WoodpeckerError as exc:  # metadata or object store unreachable
            self.failures += 1
            # Once per outage: a retry every few seconds for its whole length is noise.
            report = log.warning if self._failing == 0 else log.debug
            self._failing += 1
            report(
                "log %s: snapshot write failed (%s); retrying, writes continue", self.log_id, exc
            )
            return False
        if self._failing:
            log.info("log %s: snapshot written after %d failures", self.log_id, self._failing)
        self._failing = 0
        self.writes += 1
        self.bytes_written += written
        self.last_key = key
        self._last = time.monotonic()
        self._trim(key)
        return True

    def _trim(self, newest: str) -> None:
        """Keep the newest `kept` snapshots; delete only older ones, and never once fenced."""
        try:
            if not self._still_owner():
                return
            keys = list_snapshots(self.store, self.log_id)
        except WoodpeckerError as exc:  # the next snapshot trims them
            log.warning("log %s: old snapshots not trimmed: %s", self.log_id, exc)
            return
        older = [k for k in keys if k < newest]
        for key in older[: max(0, len(older) - (self.kept - 1))]:
            try:
                self.store.delete(key)
            except WoodpeckerError as exc:
                log.warning("log %s: could not delete old snapshot %s: %s", self.log_id, key, exc)
