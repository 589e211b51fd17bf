"""The write pipeline of one log: the one object that owns the writer's lock and composes its
parts, as Woodpecker's segment handle and Kafka's producer do. Plain and idempotent writers are
this same pipeline; they differ only in the dedup stage it consults (`dedup.Dedup`).

  api.py            the writers' calls: arguments checked, then handed here
  accumulator.py    the queue, admission into runs, the batch lane, backpressure (`InFlight`)
  segments.py       the open segments, the current one, the roll
  sender.py         group commit; batches go to the client's node senders, acks come back to
                    `on_ack`
  completion.py     completing segments (takeover, repair, drained, close); the rule is
                    ensemble/recovery.py
  lifecycle.py      the state (open/closed/fenced), lease, the tick and the maintenance tasks
                    (on the client's scheduler), forks, exit, Ctrl-C
  results.py        futures and a batch call's rows

Opening is explicit steps, each on a whole object: `Pipeline(...)` builds the parts and starts
nothing; `take_over()` bumps the epoch and completes what earlier writers left; the stage
rebuilds what it keeps (`Dedup.rebuild`); `open()` opens a segment and starts the tick. Only
then is a write accepted (`open_pipeline` runs the steps).

One lock (`lock`) guards every part's state; a `_locked` method needs it. Outcomes are set after
it is released (`results.resolve`). The lock is released mid-operation in exactly two places,
each documented where it happens: a producer waiting for room (`InFlight.wait_for_room_locked`)
and flush waiting for commits.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from ..args import timeout_arg
from ..errors import WoodpeckerError, WriterClosedError, WriterFencedError, WriteTimeoutError
from .accumulator import Accumulator, InFlight
from .completion import SegmentCompletion
from .dedup import Dedup
from .lifecycle import (
    FORKS,
    Lease,
    Maintenance,
    Ticker,
    WriterState,
    forked_error,
    run_bounded,
    track,
    untrack,
)
from .results import Outcomes, resolve
from .segments import OpenSegment, OpenSegments, SegmentStatus, SentBatch
from .sender import Dispatch

if TYPE_CHECKING:
    from ..ensemble import LogContext

log = logging.getLogger(__name__)


class Pipeline:
    """One log's write pipeline (see the module doc). Its parts reach it through the public
    names below, each part's view typed by a protocol (`SenderView`, `TickerView`, `RollView`,
    `CompletionView`)."""

    def __init__(self, ctx: LogContext, dedup: Dedup):
        cfg = ctx.config
        ap = cfg.append
        ensemble = ctx.ensemble
        self.log_id = ctx.log_id
        self.clock = ctx.clock
        self.dedup = dedup
        self._meta = ctx.meta
        self._scheduler = ensemble.scheduler
        self.generation = FORKS[0]  # see FORKS: its threads and locks exist in this process only
        self._pid = os.getpid()
        self.timeout_s = ap.timeout_ms / 1000  # a waiter's deadline
        self.lease_ms = cfg.writer.lease_ms
        self._linger_s = ap.linger_ms / 1000
        self.max_retries = ap.max_retries  # a node's retries of one batch
        self.max_entry_bytes = ap.max_entry_bytes
        self.lock = threading.Lock()
        self.state = WriterState(self.log_id, ctx.client_closed)
        self._stopping = threading.Event()  # set on close or fence: background retries end
        self.metrics: dict[str, float] = {
            "segments_rolled": 0,
            "segments_repaired": 0,
            "background_retries": 0,
            "backpressure_waits": 0,  # calls that waited for room (append.max_inflight_*)
            "entries_acked": 0,  # entries that reached their ack quorum
            "ack_latency_seconds": 0.0,  # their time from acceptance to ack, summed
        }
        self._maint = Maintenance(self._scheduler, self.log_id, self.fence)
        self._dispatch = Dispatch(
            self,
            ensemble,
            ctx.transport,
            self._stopping,
            max_batch_entries=ap.max_batch_entries,
            max_batch_bytes=ap.max_batch_bytes,
            linger_s=ap.linger_ms / 1000,
        )
        tails = ensemble.tails
        self.inflight = InFlight(
            self.lock,
            ap,
            self._dispatch.send_locked,
            dedup,
            self.metrics,
            lambda segment_id, lac: tails.published(self.log_id, segment_id, lac),
        )
        self.segments = OpenSegments(
            self,
            cfg,
            meta=self._meta,
            ensemble=ensemble,
            dispatch=self._dispatch,
            maint=self._maint,
        )
        self._completion = SegmentCompletion(
            self,
            meta=self._meta,
            transport=ctx.calls,
            uploads=ctx.ensemble.uploads,
            dedup=dedup,
            maint=self._maint,
            stopping=self._stopping,
            timeout_s=self.timeout_s,
            # counting a recovered segment's bytes: a queue of its own, so a long count holds
            # back none of the writer's maintenance (a repair)
            background=lambda fn, *args: self._scheduler.submit(
                ("record-size", self.log_id), fn, *args
            ),
        )
        self.accumulator = Accumulator(
            lock=self.lock,
            clock=self.clock,
            append=ap,
            dedup=dedup,
            inflight=self.inflight,
            segments=self.segments,
            state=self.state,
            metrics=self.metrics,
            wake=self._tick_after_linger,
            unavailable=self._completion.unavailable_error,
        )
        self._lease: Lease | None = None
        self._ticker: Ticker | None = None
        self.epoch = -1
        self.owner = ""

    # --- opening (explicit steps; `open_pipeline` runs them) -------------------------------------

    def take_over(self) -> None:
        """Bump the log's writer epoch (fencing every earlier writer) and complete every segment
        an earlier writer left, so nothing of theirs is pending any more."""
        self._lease = Lease(self._meta, self.log_id, self.clock, self.fence, self.lease_ms)
        self.owner = self._lease.owner
        self.epoch = self._lease.epoch
        self._completion.take_over()

    def open(self) -> None:
        """Open a segment and start the ticker: writes are accepted from here on."""
        with self.lock:
            self.segments.open_locked()
        self._ticker = Ticker(self, self._dispatch, self._scheduler, self._maint)
        self._completion.count_taken_over()
        track(self)  # closed at interpreter exit if still open

    def _poke(self) -> None:
        """Tick now (a fence: the tick sees the writer stopped, and ends)."""
        ticker = self._ticker
        if ticker is not None:
            ticker.poke()

    def _tick_after_linger(self) -> None:
        """A lone write was queued behind a batch in flight: the tick admits it after
        append.linger_ms unless an ack comes first (one timer entry, no thread woken now)."""
        ticker = self._ticker
        if ticker is not None:
            ticker.at(time.monotonic() + self._linger_s)

    def abandon(self) -> None:
        """Opening failed part way: stop the threads started so far (nothing was accepted)."""
        with self.lock:
            self.state.closed = True
        self._stopping.set()
        self._dispatch.stop(lambda default: default)
        self._maint.stop(5)

    # --- what the parts and the writers consult ----------------------------------------------

    @property
    def fenced(self) -> bool:
        """Another writer took the log over: every call fails with `WriterFencedError`."""
        if self.state.fenced is None:
            self.check_stage()
        return self.state.fenced is not None

    def check_stage(self) -> None:
        """Fence this pipeline if its stage saw a takeover on its own (the ticker asks too)."""
        seen = self.dedup.fence_seen()
        if seen is not None and self.state.fenced is None:
            self.fence(seen)

    @property
    def stopped(self) -> bool:
        """Closed (or closing) or fenced: the writer's background work ends."""
        return self.state.stopped

    @property
    def repairing(self) -> bool:
        """A segment lost its ack quorum and is being completed: new writes are refused."""
        return self._completion.repairing is not None

    def check_process(self) -> None:
        """Raise `WriterForkedError` in a process forked after this writer was opened."""
        if FORKS[0] != self.generation:
            raise forked_error(f"writer of log {self.log_id}", self._pid)

    def still_owner(self) -> bool:
        """Ask the metadata store whether this writer still owns the log; fences it if not."""
        return self.state.fenced is None and self._lease is not None and self._lease.held()

    def renew_lease(self) -> None:
        """Renew this writer's lease on the log (the ticker asks every few seconds)."""
        if self._lease is not None:
            self._lease.renew()

    def admit_queued_locked(self) -> tuple[Outcomes, float | None]:
        """The ticker: admit queued writes that are due (see `Accumulator.admit_due_locked`)."""
        return self.accumulator.admit_due_locked(self.segments.idle_locked())

    def complete_if_drained_locked(self, seg: OpenSegment) -> None:
        """A rolled segment with nothing pending any more is completed (in the background)."""
        if seg.status is SegmentStatus.ROLLED and seg.drained():
            seg.status = SegmentStatus.DONE
            self._maint.submit(self._completion.complete_drained, seg)

    # --- acks and node failures (node sender threads) ----------------------------------------

    def on_ack(self, node: str, seg: OpenSegment, batch: SentBatch) -> None:
        """`node` stored `batch`: commit what reached aq, in order, and send what was held."""
        with self.lock:
            if seg.status in (SegmentStatus.FAILED, SegmentStatus.DONE):
                return  # completion decides (FAILED); nothing is pending any more (DONE)
            committed = seg.ack(node, batch)
            if not committed:
                return
            resolved = self.inflight.commit_locked(seg, committed)
            resolved.extend(self.accumulator.admit_all_locked())  # queued while it was in flight
            self._dispatch.send_locked(seg)  # what was held while this batch was in flight
            if seg.status is SegmentStatus.ROLLED:
                self.complete_if_drained_locked(seg)
        resolve(resolved)

    def on_node_failed(self, node: str, seg: OpenSegment, batch: SentBatch, exc: Exception) -> None:
        """`node` gave up on `batch`: segment completion drops it, and repairs `seg` if it lost
        its ack quorum."""
        self._completion.node_failed(node, seg, batch, exc)

    # --- flush, close, fence -----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write accepted before this call is committed or failed."""
        self.check_process()
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if self.state.closed:
                self.state.check_open_locked()
            failed = self.accumulator.admit_all_locked()
            target = self.inflight.seq
        resolve(failed)
        with self.lock:
            # The lock is released while this waits: writes accepted meanwhile have later
            # sequence numbers than `target`, so they neither hold this flush nor are waited for.
            # Writes held at a conditional append (`Accumulator.held`) were accepted before it:
            # once they are entries, the flush waits for every entry made up to then.
            held = False
            while self.state.fenced is None:
                if self.accumulator.held is not None:
                    held = True
                elif held:
                    held = False
                    target = self.inflight.seq
                if not held:
                    oldest = self.segments.oldest_pending_seq_locked()
                    if oldest is None or oldest > target:
                        return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WriteTimeoutError(f"flush of log {self.log_id} timed out")
                self.inflight.space.wait(0.05 if left is None else min(left, 0.05))
            raise WriterFencedError(str(self.state.fenced))

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then complete the open segment so readers see it sealed; then the stage's last
        step (the window's final snapshot). Idempotent.

        Returns within `timeout` seconds (None: no bound on the flush): writes not acknowledged
        by then fail with `WriterClosedError`, and a segment not completed by then is completed by
        the next writer's takeover.
        """
        timeout = timeout_arg(timeout)
        if self.state.closed:
            return
        self.check_process()  # a forked child must not complete its parent's segments
        deadline = None if timeout is None else time.monotonic() + timeout

        def left(default: float) -> float:
            return default if deadline is None else max(0.0, deadline - time.monotonic())

        try:
            if self.state.fenced is None:
                self.flush(timeout)
        except WoodpeckerError as exc:
            log.warning("log %s: closing with unflushed entries: %s", self.log_id, exc)
        with self.lock:
            self.state.closed = True
            late = self.accumulator.drop_locked()  # accepted after the flush: nobody admits them
            self.dedup.stopped_locked()
            self.inflight.space.notify_all()
        closed = WriterClosedError(
            f"writer of log {self.log_id} closed before this write was queued"
        )
        resolve([(f, closed) for f in late])
        self._stopping.set()
        untrack(self)
        if self._ticker is not None:
            self._ticker.stop()
        self._dispatch.stop(left)
        self._maint.stop(left(10))
        with self.lock:
            segments = self.segments.all_locked()
            unresolved = [
                (
                    f,
                    WriterClosedError(
                        f"writer of log {self.log_id} closed before entry {segment_id}:{entry_id} "
                        "was acknowledged; the next writer's takeover keeps it if it reached the "
                        "nodes (an idempotent retry then returns its id)"
                    ),
                )
                for f, segment_id, entry_id in self.segments.waiters_locked()
            ]
        resolve(unresolved)
        if self.state.fenced is None and self._owner_at_close():
            run_bounded(
                lambda: self._completion.finish(
                    segments, self.segments.last_opened, timeout, deadline
                ),
                None if deadline is None else left(0),
                "completing the open segments",
                self.log_id,
            )
        # the stage's last step (a final snapshot) only for an owner, in the time left
        owner = self.state.fenced is None and (deadline is None or left(0) > 0)
        self.dedup.close(owner, None if deadline is None else left(0))
        if self.state.fenced is None and self._lease is not None and owner:
            # after the snapshot, which asks whether the log is still ours
            run_bounded(
                self._lease.release,
                None if deadline is None else left(0),
                "releasing the lease",
                self.log_id,
            )

    def _owner_at_close(self) -> bool:
        """Whether the log is still this writer's (a takeover it has not noticed fences it
        here: it then completes nothing and leaves no snapshot); an unreachable metadata store
        answers yes, and the completion's own epoch-conditioned writes decide."""
        try:
            return self.still_owner()
        except WoodpeckerError as exc:
            log.warning("log %s: ownership not checked at close: %s", self.log_id, exc)
            return True

    def fence(self, exc: WriterFencedError) -> None:
        """`fence_locked`, then its outcomes set (call without the lock)."""
        with self.lock:
            resolved = self.fence_locked(exc)
        resolve(resolved)

    def fence_locked(self, exc: WriterFencedError) -> Outcomes:
        """Another writer took over: fail everything pending and queued; every later call fails
        too, and the stage stops writing."""
        if self.state.fenced is not None:
            return []
        self.state.fenced = exc
        self._stopping.set()
        log.warning("log %s: writer fenced: %s", self.log_id, exc)
        resolved: Outcomes = [
            (f, WriterFencedError(str(exc))) for f, _, _ in self.segments.waiters_locked()
        ]
        resolved.extend((f, WriterFencedError(str(exc))) for f in self.accumulator.drop_locked())
        self.dedup.stopped_locked()
        self._poke()  # the tick sees the writer stopped, and ends
        self.inflight.space.notify_all()
        return resolved


def open_pipeline(ctx: LogContext, dedup: Dedup) -> Pipeline:
    """A pipeline ready for writes: built, the log taken over (earlier writers' segments
    completed), the stage rebuilt, a segment open. Nothing is accepted before the last step; a
    step that fails stops what the earlier ones started."""
    pipeline = Pipeline(ctx, dedup)
    try:
        dedup.prepare()
        pipeline.take_over()
        dedup.rebuild(pipeline.epoch)
        pipeline.open()
    except BaseException:
        pipeline.abandon()
        raise
    return pipeline
