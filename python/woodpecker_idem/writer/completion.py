"""Completing the writer's segments: the ones a previous writer left (takeover), one that lost its
ack quorum (repair: its pending entries are resolved against the recovered end), a rolled or closing
one that drained (sealed at its LAC), and an empty one whose create answer was lost (orphan).

Every step meets the faults writes meet (nodes, the metadata store, a race with another
completion) and is retried with backoff (`retry.Backoff`) until it succeeds, the writer is fenced
or it is closed: readers stop at an ACTIVE segment, so giving up would stall
them (docs/semantics.md).
`SegmentCompletion` works on its pipeline only through `CompletionView` (public names) and
tells the dedup stage which segments completed and which entries they dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..ensemble.recovery import record_size, recover_segment, seal
from ..errors import (
    EntryConflictError,
    LogNotFoundError,
    NodeUnavailableError,
    QuorumUnavailableError,
    SegmentClosedError,
    SegmentFencedError,
    WoodpeckerError,
    WriterFencedError,
    WriteTimeoutError,
)
from ..meta.base import SegmentMeta
from ..retry import Backoff, retry_call
from ..types import LogMessageId, SegmentState
from .adopted import check_adopted
from .dedup import Dedup
from .lifecycle import Maintenance, deleted
from .results import Outcomes, resolve
from .segments import RETRY_INITIAL_S, RETRY_MAX_S, OpenSegment, SegmentStatus, SentBatch, span

if TYPE_CHECKING:
    from ..clock import Clock
    from ..ensemble.uploads import SegmentUploads
    from ..logstore.transport import LogStoreTransport
    from ..meta import MetadataStore
    from .accumulator import InFlight
    from .segments import OpenSegments

log = logging.getLogger(__name__)


class CompletionView(Protocol):
    """What `SegmentCompletion` uses of its pipeline (`Pipeline` implements it)."""

    log_id: int
    epoch: int
    clock: Clock
    lock: threading.Lock
    metrics: dict[str, float]
    inflight: InFlight
    segments: OpenSegments

    @property
    def stopped(self) -> bool: ...

    @property
    def fenced(self) -> bool: ...

    def fence(self, exc: WriterFencedError) -> None: ...


def log_end(segments: list[SegmentMeta]) -> LogMessageId | None:
    """The last entry of completed `segments` (oldest first); None if they hold none, or only
    truncated ones (a reader of the log sees none either)."""
    for seg in reversed(segments):
        if seg.state is SegmentState.TRUNCATED:
            return None
        if seg.last_entry_id >= 0:
            return LogMessageId(seg.segment_id, seg.last_entry_id)
    return None


def _transient(exc: BaseException) -> bool:
    """Worth retrying while completing a segment: an unreachable node or store, a lost
    compare-and-swap, or a race with another completion of the same segment (the next attempt
    sees its footer). A takeover (`WriterFencedError`) is final."""
    if isinstance(exc, WriterFencedError):
        return False
    if isinstance(exc, (SegmentFencedError, EntryConflictError, OSError)):
        return True
    return isinstance(exc, WoodpeckerError) and exc.retriable


class SegmentCompletion:
    """Completes one writer's segments; its slow steps run on the writer's maintenance thread."""

    def __init__(
        self,
        pipeline: CompletionView,
        *,
        meta: MetadataStore,
        transport: LogStoreTransport,
        dedup: Dedup,
        maint: Maintenance,
        stopping: threading.Event,
        timeout_s: float,
        background: Callable[..., object],
        uploads: SegmentUploads | None = None,
    ):
        self._pipeline = pipeline
        self._background = background
        self._uploads = uploads  # staged storage: a segment is SEALED once uploaded
        self._uncounted: list[SegmentMeta] = []  # completed by the takeover, bytes not counted
        self._meta = meta
        self._transport = transport
        self._dedup = dedup
        self._maint = maint
        self._stopping = stopping  # set on close or fence: background retries end
        self._timeout_s = timeout_s
        self._log_id = pipeline.log_id
        # the segment that lost its ack quorum, until it is completed (new writes are refused)
        self.repairing: OpenSegment | None = None

    # --- opening: the previous writers' segments -------------------------------------------------

    def take_over(self) -> None:
        """Complete every ACTIVE segment a previous writer left (docs/architecture.md)."""
        segments = self._meta.list_segments(self._log_id)
        for i, seg in enumerate(segments):
            if seg.state in (SegmentState.ACTIVE, SegmentState.COMPLETED):
                segments[i] = done = self._recover_with_retries(seg)
                self._completed(done.segment_id, done.last_entry_id)
                self._uncounted.append(done)  # counted once the writer is open
        with self._pipeline.lock:
            self._pipeline.segments.last_completed = log_end(segments)

    def _recover_with_retries(self, seg: SegmentMeta) -> SegmentMeta:
        """Recovery meets the same transient faults as writes (nodes, metadata store, a race with
        another completion): retry them for append.timeout_ms."""
        pipeline = self._pipeline

        def attempt() -> SegmentMeta:
            current = self._meta.get_segment(self._log_id, seg.segment_id) or seg  # fresh revision
            return recover_segment(
                self._transport,
                self._meta,
                pipeline.epoch,
                current,
                pipeline.clock.now_ms(),
                count_bytes=False,  # counted in the background: the takeover waits for none of it
                uploads=self._uploads,
            )

        def on_retry(exc: BaseException, attempt_no: int) -> None:
            log.info(
                "log %s: completing segment %s, retry %d: %s",
                self._log_id,
                seg.segment_id,
                attempt_no,
                exc,
            )

        return retry_call(
            attempt,
            _transient,
            Backoff(RETRY_INITIAL_S, RETRY_MAX_S, budget_s=self._timeout_s),
            on_retry,
        )

    def count_taken_over(self) -> None:
        """The writer is open: count the bytes of the segments its takeover completed (in the
        background, not competing with the takeover's own reads)."""
        uncounted, self._uncounted = self._uncounted, []
        for done in uncounted:
            self._count_later(done)

    def _count_later(self, done: SegmentMeta) -> None:
        """A segment recovery completed records 0 bytes (its writer left it): count them on a
        node in the background and record them (retention.max_bytes and `logs` go by them)."""
        if done.last_entry_id >= 0 and not done.size_bytes:
            self._background(record_size, self._transport, self._meta, done)

    def _completed(self, segment_id: int, last_entry_id: int) -> None:
        with self._pipeline.lock:
            self._dedup.segment_completed_locked(segment_id, last_entry_id)

    # --- a segment that lost its ack quorum ------------------------------------------------------

    def node_failed(self, node: str, seg: OpenSegment, batch: SentBatch, exc: Exception) -> None:
        """`node` gave up on `batch` of `seg` (after its retries): drop the node from the segment;
        if fewer than aq nodes remain, the segment is repaired in the background."""
        pipeline = self._pipeline
        if isinstance(exc, SegmentFencedError):
            try:
                self._meta.check_epoch(self._log_id, pipeline.epoch)
            except WriterFencedError as fenced:
                pipeline.fence(fenced)
                return
            except LogNotFoundError as gone:  # deleted (which fences the segment first)
                pipeline.fence(deleted(self._log_id, gone))
                return
            except WoodpeckerError as err:  # metadata down: the repair's seal finds out later
                log.warning("log %s: could not check the writer epoch: %s", self._log_id, err)
        with pipeline.lock:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE) and not seg.pending:
                return
            seg.failed_nodes[node] = str(exc)
            batch.failed.add(node)
            log.warning(
                "log %s segment %s: node %s dropped after retries: %s",
                self._log_id,
                seg.segment_id,
                node,
                exc,
            )
            if not seg.quorum_lost() or seg.status is SegmentStatus.FAILED:
                return
            seg.status = SegmentStatus.FAILED
            self.repairing = seg
            pipeline.segments.drop_current_locked(seg)
        self._maint.submit(self.repair, seg)

    def repair(self, seg: OpenSegment) -> None:
        """Complete a segment that lost its quorum and resolve its pending entries; if it was the
        current segment, open the next. Every failure (nodes, storage, metadata) is retried with
        backoff until it succeeds, the writer is fenced or it is closed (docs/semantics.md)."""
        pipeline = self._pipeline
        backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S, stop=self._stopping)
        done: SegmentMeta | None = None
        # The outcomes of the segment's pending entries are set once the next segment is open
        # (or the repair ends otherwise): a caller who learns its write's outcome and writes
        # again is not refused for a repair still under way.
        resolved: Outcomes = []
        try:
            while True:
                with pipeline.lock:
                    if pipeline.stopped:
                        return
                try:
                    if done is None:
                        end = recover_segment(
                            self._transport,
                            self._meta,
                            pipeline.epoch,
                            seg.meta,
                            pipeline.clock.now_ms(),
                            count_bytes=False,
                            uploads=self._uploads,
                        )
                        check_adopted(self._transport, seg, end.last_entry_id)
                        done = end
                        with pipeline.lock:
                            resolved = self._resolve_segment_locked(seg, done.last_entry_id)
                            pipeline.segments.forget_locked(seg, done.last_entry_id)
                            pipeline.metrics["segments_repaired"] += 1
                        self._completed(done.segment_id, done.last_entry_id)
                        self._count_later(done)
                    with pipeline.lock:
                        pipeline.segments.replace_current_locked()  # a current one only
                        if self.repairing is seg:
                            self.repairing = None
                    return
                except WriterFencedError as exc:
                    pipeline.fence(exc)
                    return
                except LogNotFoundError as exc:  # deleted under the writer: nothing to repair
                    pipeline.fence(deleted(self._log_id, exc))
                    return
                except Exception as exc:  # retried: the outage may end any time
                    pipeline.metrics["background_retries"] += 1
                    log.warning(
                        "log %s: repair of segment %s (%s), retry %d: %s: %s",
                        self._log_id,
                        seg.segment_id,
                        "completing it" if done is None else "opening the next",
                        backoff.attempts + 1,
                        type(exc).__name__,
                        exc,
                    )
                    if not backoff.wait():
                        return
        finally:
            resolve(resolved)

    def _resolve_segment_locked(self, seg: OpenSegment, last_entry_id: int) -> Outcomes:
        pipeline = self._pipeline
        committed, dropped = seg.resolve_completed(last_entry_id)
        resolved = pipeline.inflight.commit_locked(seg, committed) if committed else []
        if dropped:
            self._dedup.dropped_locked(seg.segment_id)
            exc = SegmentClosedError(
                f"segment {self._log_id}/{seg.segment_id} was completed at entry {last_entry_id} "
                f"without these entries; a retry writes them anew"
            )
            for entry in dropped:
                resolved.extend((f, exc) for f, _ in entry.waiters())
            pipeline.inflight.release_locked(span(dropped), sum(len(e.record) for e in dropped))
        return resolved

    def unavailable_error(self) -> WoodpeckerError:
        """Why a write is refused while a segment is repaired."""
        bad = self.repairing
        why = bad.failed_nodes if bad is not None else {}
        return QuorumUnavailableError(
            f"log {self._log_id}: segment {bad.segment_id if bad else '?'} lost its ack quorum "
            f"({why}); writes resume once it is completed and a new segment is open"
        )

    # --- a rolled or closing segment that drained ------------------------------------------------

    def complete_drained(self, seg: OpenSegment, backoff: Backoff | None = None) -> None:
        """A rolled (or closing) segment with nothing pending: complete it at its LAC.

        Readers stop at an ACTIVE segment, so a failure here (metadata store, nodes) is retried
        with backoff until it succeeds or the writer is closed (`backoff`: close's own budget).
        """

        def on_retry(exc: BaseException, attempt: int) -> None:
            self._pipeline.metrics["background_retries"] += 1
            log.warning(
                "log %s: completing segment %s, retry %d: %s: %s",
                self._log_id,
                seg.segment_id,
                attempt,
                type(exc).__name__,
                exc,
            )

        retry_call(
            lambda: self._seal_drained(seg),
            lambda exc: not isinstance(exc, WriterFencedError),
            backoff or Backoff(RETRY_INITIAL_S, RETRY_MAX_S, stop=self._stopping),
            on_retry,
        )

    def _seal_drained(self, seg: OpenSegment) -> None:
        pipeline = self._pipeline
        last = seg.lac
        for node in seg.live_nodes():
            try:
                self._transport.complete(node, self._log_id, seg.segment_id, last)
            except (NodeUnavailableError, SegmentFencedError, EntryConflictError, OSError) as exc:
                # the metadata seal is what readers go by; a node not completed is left as is
                log.warning(
                    "log %s: complete of segment %s on %s failed: %s",
                    self._log_id,
                    seg.segment_id,
                    node,
                    exc,
                )
        current = self._meta.get_segment(self._log_id, seg.segment_id) or seg.meta
        seal(
            self._meta,
            pipeline.epoch,
            dataclasses.replace(current, size_bytes=seg.size_bytes),
            last,
            pipeline.clock.now_ms(),
            uploads=self._uploads,
        )
        with pipeline.lock:
            seg.status = SegmentStatus.DONE
            pipeline.segments.forget_locked(seg, last)
        self._completed(seg.segment_id, last)

    # --- closing ---------------------------------------------------------------------------------

    def finish(
        self,
        segments: list[OpenSegment],
        last_opened: int,
        timeout: float | None,
        deadline: float | None,
    ) -> None:
        """`close()`, not fenced, threads stopped: complete the drained `segments` whose completion
        was under way (or retrying) in the background, then an orphan segment, within `deadline`
        (time.monotonic(); None: no bound). What is not completed is left for recovery."""

        def left(default: float) -> float:
            return default if deadline is None else max(0.0, deadline - time.monotonic())

        for seg in segments:
            # DONE but still listed: its completion was under way (or retrying) in the background
            if seg.status is not SegmentStatus.FAILED and seg.drained():
                try:
                    if deadline is not None and left(0) <= 0:
                        raise WriteTimeoutError(f"close timeout of {timeout:g} s reached")
                    self.complete_drained(seg, Backoff(RETRY_INITIAL_S, 0.5, budget_s=left(5)))
                except WriterFencedError as exc:  # taken over meanwhile: the new writer completes
                    self._pipeline.fence(exc)
                    return
                except Exception as exc:
                    log.warning(
                        "log %s: segment %s left for recovery: %s",
                        self._log_id,
                        seg.segment_id,
                        exc,
                    )
        if not self._pipeline.fenced and (deadline is None or left(0) > 0):
            self._seal_orphan(last_opened)

    def _seal_orphan(self, last_opened: int) -> None:
        """A segment this writer created but never heard back about (a lost create answer, its
        roll retried later or never) is ACTIVE and empty: seal it, or readers would wait there."""
        try:
            segments = self._meta.list_segments(self._log_id)
            last = segments[-1] if segments else None
            if last is None or last.state is not SegmentState.ACTIVE:
                return
            if last.segment_id <= last_opened:
                return  # one of its own (a failed completion stays for recovery)
            self._meta.check_epoch(self._log_id, self._pipeline.epoch)  # only this epoch made it
            seal(
                self._meta,
                self._pipeline.epoch,
                last,
                -1,
                self._pipeline.clock.now_ms(),
                uploads=self._uploads,
            )
        except Exception as exc:  # the next writer's takeover completes it
            log.warning("log %s: empty segment left for recovery: %s", self._log_id, exc)
