"""IdempotentLogWriter: every retry of one logical write lands at most once within the window.

It wraps the writer core (a `LogWriter`, as Woodpecker's idempotentWriterImpl wraps its
LogWriter): the core assigns ids, sends, commits and completes segments and tells this layer
through the `WriterHooks` this class implements; this layer owns the dedup window, the intake
of queued writes and the snapshots, and calls only the core's layer API.

write(msg, idempotency_id) -> key -> window lookup:
  committed -> the original id, duplicate=True, no server round trip;
  pending   -> join the in-flight entry (same future outcome, duplicate=True);
  absent    -> a new entry (encoded once, key persisted in it), pending until the quorum ack.
The window is rebuilt (snapshot + gap) before the writer accepts anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .._core import (
    DedupWindow,
    arrow_rows,
    content_key,
    content_keys,
    explicit_key,
    explicit_keys,
)
from ..args import timeout_arg, wait_for
from ..client.forks import FORKS
from ..client.futures import WriteFuture
from ..client.hooks import Outcomes
from ..client.message import checked_payloads, coerce_message
from ..client.segment import PendingEntry
from ..client.workers import resolve
from ..client.writer import LogWriter
from ..errors import InvalidArgumentError, InvalidTypeError, WriterClosedError, WriterFencedError
from ..types import WriteManyResult, WriteMessage, WriteResult
from .admission import Admission
from .batch import BatchLane, keyed_rows
from .intake import Intake
from .recovery import RecoveryReport, open_window, rebuild_window
from .snapshot import SnapshotSource, Snapshotter

if TYPE_CHECKING:
    from ..client.log import LogHandle

log = logging.getLogger(__name__)

EARLY_WARNING_EVERY_S = 60.0  # early evictions are logged at most this often (all are counted)


class IdempotentLogWriter:
    """A dedup window, snapshots and window recovery over a writer core (`core`)."""

    def __init__(
        self,
        handle: LogHandle,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
    ):
        cfg = handle.client.config.idempotency
        self._window = open_window(cfg, window_duration_s, window_max_keys)
        self._watermarks: dict[int, int] = {}
        self._intake = Intake()  # before the core: its threads ask `queued()` from the start
        self._new_keys = 0
        self._early_unreported = 0  # early evictions not logged yet (see _warn_early)
        self._early_warned_at = -EARLY_WARNING_EVERY_S
        self._handle = handle
        self.log_id = handle.log_id
        self._clock = handle.client.clock
        self._generation = FORKS[0]  # its threads and locks exist in this process only
        self.recovery: RecoveryReport | None = None
        self._snapshotter: Snapshotter | None = None
        # takes over, completes segments, calls taken_over (window rebuilt), opens one
        self._core = core = LogWriter(handle, hooks=self)
        self._lock = core.lock  # the core's lock: the layer API and these hooks run under it
        self._admission = Admission(core, self._window, self._clock, self._intake)
        self._lane = BatchLane(core, self._window, self._clock, self._admission)
        self._max_entry_bytes = core.max_entry_bytes
        self.epoch = core.epoch
        self.owner = core.owner
        self._snapshotter = Snapshotter(
            handle.client.objects,
            self.log_id,
            self.epoch,
            self._clock.now_ms,
            self._capture,
            lambda: self._new_keys,
            self._still_owner,
            cfg.snapshot_interval_s,
            cfg.snapshot_threshold,
            cfg.snapshots_kept,
        )

    @property
    def core(self) -> LogWriter:
        """The writer core this layer wraps (ids, sends, commits, segments)."""
        return self._core

    @property
    def metrics(self) -> dict[str, float]:
        """The core's counters (segments rolled and repaired, background retries)."""
        return self._core.metrics

    @property
    def fenced(self) -> bool:
        return self._core.fenced

    def __enter__(self) -> IdempotentLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- recovery (runs inside LogWriter.__init__, before any write is accepted) ---------------

    def taken_over(self) -> None:
        """Hook: rebuild the window (snapshot + gap) before the core accepts any write."""
        client = self._handle.client
        report, covered = rebuild_window(
            self._window,
            self.log_id,
            client.meta,
            client.objects,
            client.transport,
            self._clock.now_ms(),
        )
        self._watermarks.update(covered)
        self.recovery = report

    # --- writing -----------------------------------------------------------------------------
    #
    # A write is queued on the intake (see intake.py) under the lock and nothing more; batches of
    # queued writes are admitted in queueing order: each judged as of its own queueing time in
    # one window pass (`reserve_many`), duplicates answered or joined, the rest new entries.

    def write(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Append and wait for the quorum ack; a key committed in the window returns its original
        id at once (duplicate=True) unless an earlier write is still queued (it is judged first).
        `timeout`: None or seconds > 0; a wait that ends first raises `WriteTimeoutError`."""
        wait = None if timeout is None else timeout_arg(timeout, allow_zero=False)
        if FORKS[0] != self._generation:
            self._check_process()
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        key = content_key(payload) if idempotency_id is None else explicit_key(idempotency_id)
        with self._lock:
            hit = self._admission.committed_locked(key)
            if hit is not None:
                return hit
            future: Future[WriteResult] = WriteFuture()
            resolved = self._admission.queue_locked(payload, props, None, future, key)
        if resolved:
            resolve(resolved)
        return wait_for(future, wait, self._still_pending_text)

    def write_async(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
    ) -> Future[WriteResult]:
        """Queue a write; the future resolves at the quorum ack (or with the failure outcome), at
        once for a key committed in the window when no earlier write is queued."""
        if FORKS[0] != self._generation:
            self._check_process()
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        future: Future[WriteResult] = WriteFuture()
        admission = self._admission
        if self._intake.futures:  # writes queued ahead: judged after them, in the intake
            with self._lock:
                resolved = admission.queue_locked(payload, props, idempotency_id, future)
        else:  # a hint, re-checked under the lock (committed_locked)
            key = content_key(payload) if idempotency_id is None else explicit_key(idempotency_id)
            with self._lock:
                hit = admission.committed_locked(key)
                if hit is None:
                    resolved = admission.queue_locked(payload, props, idempotency_id, future, key)
                else:
                    resolved = [(future, hit)]
        if resolved:
            resolve(resolved)
        return future

    def _still_pending_text(self) -> str:
        return (
            f"the entry to log {self.log_id} is still pending and the writer keeps sending it; "
            "a retry with the same key joins it and returns its id"
        )

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write queued before this call is committed or failed."""
        self._check_process()
        with self._lock:
            resolved = self._admission.admit_all_locked()
        if resolved:
            resolve(resolved)
        self._core.flush(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Admit what is queued, then close the core (`LogWriter.close`); writes queued during
        the close fail with `WriterClosedError`; a clean close leaves a fresh snapshot."""
        self._check_process()
        self._core.close(timeout)

    def write_many(
        self,
        payloads: Sequence[bytes],
        ids: Sequence[str | bytes] | None = None,
        timeout: float | None = None,
    ) -> WriteManyResult:
        """Write a batch; one window pass, columnar results. Raises the first failure.

        Every row (payload type and size, id) and `timeout` are checked before any row is
        queued: a bad row refuses the whole batch and nothing is written."""
        wait = timeout_arg(timeout, allow_zero=False)
        for name, rows in (("payloads", payloads), ("ids", ids)):
            if rows is not None and not (hasattr(rows, "__len__") and hasattr(rows, "__getitem__")):
                raise InvalidTypeError(
                    f"{name} must be a sequence (a list or tuple), not {type(rows).__name__}"
                )
        keys = content_keys(payloads) if ids is None else explicit_keys(ids)  # checks types
        if ids is not None and len(ids) != len(payloads):
            raise InvalidArgumentError(f"ids has {len(ids)} items but payloads has {len(payloads)}")
        checked = checked_payloads(payloads, self._max_entry_bytes)
        self._check_process()
        return self._lane.write(checked, keys, wait, self._still_pending_text)

    def write_arrow(
        self,
        data: object,
        *,
        key_column: str | object | None = None,
        payload_column: str | None = None,
        exclude_columns: Sequence[str] = (),
        timeout: float | None = None,
    ) -> WriteManyResult:
        """Write every row of Arrow data (a pyarrow/polars RecordBatch or Table, or a binary
        column of payloads): keys are computed in Rust from the Arrow buffers, the whole batch is
        validated before anything is queued, and the call completes once, with columnar results.

        Payload: the `payload_column` (binary or string) as is, else the canonical JSON of the row
        (without `exclude_columns`). Key: the explicit id in `key_column` (a column name, or an
        Arrow column beside a payload column: string, binary or integer), else the payload's
        content key.
        """
        wait = timeout_arg(timeout, allow_zero=False)
        payloads, keys = arrow_rows(
            data, key=key_column, payload=payload_column, exclude=list(exclude_columns)
        )
        return self.write_keyed(payloads, keys, wait)

    def write_keyed(
        self, payloads: list[bytes], keys: bytes, timeout: float | None = None
    ) -> WriteManyResult:
        """Write payloads whose 16-byte keys were computed already (N*16 bytes, by the `_core`
        key functions, e.g. `arrow_rows`); checked whole before anything is queued."""
        wait = timeout_arg(timeout, allow_zero=False)
        self._check_process()
        rows = keyed_rows(payloads, keys, self._max_entry_bytes)
        return self._lane.write(rows, keys, wait, self._still_pending_text)

    def _check_process(self) -> None:
        self._core.check_process()

    # --- hooks (the core calls the `_locked` ones with its lock held) ---------------------------

    def queued(self) -> int:
        return len(self._intake.futures)

    def admit_locked(self, idle: bool) -> tuple[Outcomes, float | None]:
        return self._admission.admit_locked(idle)

    def committed_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        window = self._window
        before = window.early_evictions
        last = entries[-1].last_entry_id  # a run holds several
        self._new_keys += window.commit_through(segment_id, last)  # a prefix of the segment
        self._watermarks[segment_id] = last
        early = window.early_evictions - before
        if early:
            self._warn_early(early)
        if self._snapshotter is not None and self._new_keys >= self._snapshotter.due_keys:
            self._snapshotter.kick()

    def _warn_early(self, early: int) -> None:
        """Log early evictions at most once per EARLY_WARNING_EVERY_S: a window too small for
        its rate evicts early at every commit, and one line per commit would flood the log."""
        self._early_unreported += early
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
            self._window.max_keys,
        )
        self._early_warned_at = now
        self._early_unreported = 0

    def dropped_locked(self, segment_id: int, entries: list[PendingEntry]) -> None:
        self._window.drop_segment(segment_id)  # completed without them: all that is left

    def segment_completed_locked(self, segment_id: int, last_entry_id: int) -> None:
        self._watermarks[segment_id] = last_entry_id

    def fenced_locked(self, exc: WriterFencedError) -> Outcomes:
        if self._snapshotter is not None:
            self._snapshotter.cancel()
        return [(f, WriterFencedError(str(exc))) for f in self._intake.drop()]

    def closing(self) -> None:
        with self._lock:
            resolved = self._admission.admit_all_locked()
        if resolved:
            resolve(resolved)

    def closed(self) -> None:
        with self._lock:  # writes queued during the close: nobody will admit them
            futures = self._intake.drop()
        exc = WriterClosedError(f"writer of log {self.log_id} closed before this write was queued")
        resolve([(f, exc) for f in futures])
        if self._snapshotter is not None:
            self._snapshotter.stop()
            self._snapshotter.write_now()  # a clean close leaves a fresh snapshot (if still owner)

    # --- snapshots -------------------------------------------------------------------------------

    def _capture(self) -> SnapshotSource | None:
        """A committed-only copy of the window and watermarks, under one lock (DESIGN.md 7)."""
        with self._lock:
            if self._core.fenced:
                return None
            marks = dict(self._watermarks)
            marks.update(self._core.segments.lacs_locked())
            source = SnapshotSource(self._window.clone_committed(), marks, self._new_keys)
            self._new_keys = 0
        return source

    def _still_owner(self) -> bool:
        return self._core.still_owner()

    # --- metrics -------------------------------------------------------------------------------

    def metrics_snapshot(self) -> dict[str, float | int | None]:
        """Duplicates suppressed, window size/memory, evictions, snapshots, last recovery."""
        w = self._window
        s = self._snapshotter
        r = self.recovery
        with self._lock:
            pending = w.pending_count + len(self._intake)
        return {
            "duplicates_suppressed": self._admission.duplicates,
            "pending": pending,
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

    @property
    def window(self) -> DedupWindow:
        return self._window


__all__ = ["IdempotentLogWriter", "WriteManyResult"]
