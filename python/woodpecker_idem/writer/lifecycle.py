"""The writer's life around its writes: the lease, background threads, fencing, forks, exit and
Ctrl-C.

- `Lease`: opening takes the log over in the metadata store (a new epoch) under a lease renewed
  every few seconds; an answer that another writer holds the log fences this writer.
- `Ticker` (a timer of the client's scheduler): the slow, periodic side of writing. Batches are
  cut on the write and ack paths (group commit, `sender.Dispatch`); the tick fails waiters past
  their deadline (their entries stay pending), keeps readers' LAC fresh, completes drained rolled
  segments, renews the lease, and is the safety net that sends or admits anything left waiting.
- `Maintenance` (ordered tasks on the client's scheduler): slow metadata and completion work,
  off the write path.
- Forks: `FORKS` is bumped in every forked child, so a writer made before the fork sees it changed
  with one list read per call (cheaper than `os.getpid()`); a write there raises
  `WriterForkedError` instead of waiting forever for threads that do not exist.
- Exit: writers still open at interpreter exit are closed by an atexit hook, like a Kafka
  producer: queued writes are flushed and every thread joined before the interpreter finalizes (a
  daemon thread waking inside a native call during finalization aborts the process).
- Ctrl-C: `HOLD_INTERRUPTS`. Python raises KeyboardInterrupt in the main thread between any two
  bytecodes. Some of the
  writer's state changes must happen together: a run's ids taken and its entry put in every list
  that sends and resolves it, queued writes taken off the queue and turned into entries. They run
  in the caller's thread (with the writer's lock held) when it writes; an interrupt between two of
  their steps would leave an entry that is never sent, or a write nobody resolves, and every later
  write of the log would wait behind it. `HOLD_INTERRUPTS` holds SIGINT for the duration and
  delivers it right after: the caller still gets its KeyboardInterrupt, with the writer whole.
  Only the main thread needs it (Python runs signal handlers nowhere else); other threads pass
  through at the cost of one check. A hold swaps the handler twice through `_signal`, the C
  functions under `signal` (whose wrappers convert to enums, ~8 us a call): ~2 us in all.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half: its wrappers cost ~8 us a call
import atexit
import logging
import os
import signal
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import (
    ClientClosedError,
    LogNotFoundError,
    WoodpeckerError,
    WriterClosedError,
    WriterFencedError,
    WriterForkedError,
    WriteTimeoutError,
)
from .results import Outcomes, Waiter, resolve
from .segments import SegmentStatus

if TYPE_CHECKING:
    from ..clock import Clock
    from ..ensemble.scheduler import Scheduler
    from ..meta import MetadataStore
    from .pipeline import Pipeline
    from .segments import OpenSegment, OpenSegments, PendingEntry
    from .sender import Dispatch

log = logging.getLogger(__name__)

# --- open, closed or fenced ---------------------------------------------------------------------


class WriterState:
    """Whether the writer accepts writes: every part consults this one object (under the
    writer's lock) for why a write is refused."""

    __slots__ = ("log_id", "closed", "fenced", "_client_closed")

    def __init__(self, log_id: int, client_closed: Callable[[], bool]):
        self.log_id = log_id
        self.closed = False  # set at the start of close(): nothing more is accepted
        self.fenced: WriterFencedError | None = None  # another writer took the log over
        self._client_closed = client_closed

    @property
    def stopped(self) -> bool:
        """Closed (or closing) or fenced: the writer's background work ends."""
        return self.closed or self.fenced is not None

    def check_open_locked(self) -> None:
        """Raise why no write is accepted any more (fenced, closed, or the client closed)."""
        if self.fenced is not None:
            raise WriterFencedError(str(self.fenced))
        if self.closed:
            if self._client_closed():
                raise ClientClosedError(f"client is closed: writer of log {self.log_id} is closed")
            raise WriterClosedError(f"writer of log {self.log_id} is closed")


# --- the lease -----------------------------------------------------------------------------------


class Lease:
    """The epoch and lease of one writer (`owner` names it in the metadata store)."""

    def __init__(
        self,
        meta: MetadataStore,
        log_id: int,
        clock: Clock,
        fence: Callable[[WriterFencedError], None],
        lease_ms: int,
    ):
        self._meta = meta
        self._log_id = log_id
        self._clock = clock
        self._fence = fence
        self.lease_ms = lease_ms  # writer.lease_ms
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch = meta.take_over(log_id, self.owner, clock.now_ms(), lease_ms)

    def renew(self) -> None:
        """Renew the lease; fences the writer if another writer took the log over."""
        try:
            self._meta.renew_lease(
                self._log_id, self.epoch, self.owner, self._clock.now_ms(), self.lease_ms
            )
        except WriterFencedError as exc:
            self._fence(exc)

    def release(self) -> None:
        """The writer closed cleanly: its lease ends now (a fenced writer's is not its own)."""
        try:
            self._meta.release_lease(self._log_id, self.epoch, self.owner, self._clock.now_ms())
        except WriterFencedError:
            pass  # taken over meanwhile: the lease is the new writer's
        except WoodpeckerError as exc:  # the metadata store is down: it expires by itself
            log.warning("log %s: lease not released at close: %s", self._log_id, exc)

    def held(self) -> bool:
        """Ask the metadata store whether the log is still this writer's; fences it if not."""
        try:
            self._meta.check_epoch(self._log_id, self.epoch)
        except WriterFencedError as exc:
            self._fence(exc)
            return False
        except LogNotFoundError as exc:
            self._fence(deleted(self._log_id, exc))
            return False
        return True


def deleted(log_id: int, exc: LogNotFoundError) -> WriterFencedError:
    """The error a writer is fenced with when its log was deleted under it."""
    return WriterFencedError(f"log id {log_id} was deleted while this writer held it ({exc})")


# --- background threads ------------------------------------------------------------------


class Maintenance:
    """One writer's slow metadata and recovery work, off the write path: ordered tasks on the
    client's scheduler (one at a time, in submit order, as on a thread of the writer's own). A
    task that finds the writer taken over (`WriterFencedError`) hands it to `on_fenced`."""

    def __init__(
        self,
        scheduler: Scheduler,
        log_id: int,
        on_fenced: Callable[[WriterFencedError], None],
    ):
        self.log_id = log_id
        self.on_fenced = on_fenced
        self._scheduler = scheduler
        self._stopped = False

    def submit(self, fn, *args) -> None:
        """Run `fn(*args)` after the tasks submitted before (nothing once stopped)."""
        if not self._stopped:
            self._scheduler.submit(self, self._run, fn, args)

    def stop(self, timeout: float = 10.0) -> None:
        """Take no more tasks; wait up to `timeout` for the queued ones to end (retrying tasks
        end once the writer's stop event is set)."""
        self._stopped = True
        self._scheduler.drain(self, timeout)

    def _run(self, fn, args) -> None:
        try:
            fn(*args)
        except WriterFencedError as exc:
            self.on_fenced(exc)
        except LogNotFoundError as exc:  # deleted under the writer (a lease renewal, a roll)
            self.on_fenced(deleted(self.log_id, exc))
        except ClientClosedError:
            pass  # the client closed under it: nothing left to complete for this writer
        except Exception:
            log.exception(
                "log %s: background task %s failed", self.log_id, getattr(fn, "__name__", fn)
            )


TICK_S = 0.05
LOCK_BUSY_S = 0.001  # a tick that found the writer's lock held comes back this much later

log = logging.getLogger(__name__)


class TickerView(Protocol):
    """What the ticker uses of its writer (`Pipeline` implements it)."""

    log_id: int
    lock: threading.Lock
    timeout_s: float  # append.timeout_ms in seconds: a waiter's deadline
    lease_ms: int  # writer.lease_ms: the lease is renewed every third of it
    segments: OpenSegments

    @property
    def stopped(self) -> bool: ...

    def admit_queued_locked(self) -> tuple[Outcomes, float | None]: ...

    def complete_if_drained_locked(self, seg: OpenSegment) -> None: ...

    def renew_lease(self) -> None: ...

    def check_stage(self) -> None: ...


class Ticker:
    """The writer's tick, a timer of the client's scheduler (`poke()` runs it soon). `dispatch`:
    the writer's group commit and sends; `maint`: where the lease renewal runs (off the timer
    thread, which every writer of the client shares: a tick never waits for the writer's lock)."""

    def __init__(
        self,
        writer: TickerView,
        dispatch: Dispatch,
        scheduler: Scheduler,
        maint: Maintenance,
    ):
        self.writer = writer
        self.dispatch = dispatch
        self.maint = maint
        self.lease_renewed = time.monotonic()
        self._timer = scheduler.timer(self.tick, f"tick-{writer.log_id}")
        self._timer.poke()

    def poke(self) -> None:
        """Tick soon (there is work: a fence, a close)."""
        self._timer.poke()

    def at(self, when: float) -> None:
        """Tick at monotonic time `when` at the latest (a queued write due then)."""
        self._timer.at(when)

    def stop(self) -> None:
        self._timer.cancel()

    def tick(self) -> float | None:
        """One round (on the timer thread); returns the seconds until the next, None to stop."""
        w = self.writer
        dispatch = self.dispatch
        w.check_stage()  # a takeover the dedup stage noticed fences the writer
        lac_only: list[OpenSegment] = []
        expired: list[tuple[Waiter, object]] = []
        admitted: Outcomes = []
        # Not blocking: the timer thread serves every writer of the client, and a writer's lock
        # can be held across a metadata call (a roll); this tick comes back for it shortly.
        if not w.lock.acquire(blocking=False):
            return LOCK_BUSY_S
        try:
            if w.stopped:
                return None
            now = time.monotonic()
            wait = TICK_S
            try:
                admitted, due = w.admit_queued_locked()
                if due is not None:
                    wait = min(wait, due)
            except Exception:  # a bug must not stop the flusher (and hang every call)
                log.exception("log %s: admitting queued writes failed", w.log_id)
            for seg in w.segments.all_locked():
                if seg.status in (SegmentStatus.OPEN, SegmentStatus.ROLLED):
                    dispatch.send_locked(seg)
                    due = dispatch.send_due(seg, now)
                    if due is not None:
                        wait = min(wait, due)
                    if seg.aq > 1 and not seg.unsent and not seg.batches and seg.lac > seg.lac_sent:
                        lac_only.append(seg)  # LAC-only update for tail readers
                        seg.lac_sent = seg.lac
                self._expire_locked(seg, now, expired)
                w.complete_if_drained_locked(seg)
            if now - self.lease_renewed > w.lease_ms / 3000:  # a third of writer.lease_ms
                self.lease_renewed = now
                self.maint.submit(w.renew_lease)
            for seg in lac_only:
                dispatch.send_lac_locked(seg)
        finally:
            w.lock.release()
        resolve(expired)
        resolve(admitted)
        if lac_only or expired or admitted:
            return 0.0  # something happened: look again at once, as a loop would
        return max(wait, 0.0005)

    def _expire_locked(self, seg: OpenSegment, now: float, expired: list) -> None:
        """Fail waiters past their deadline (the entries stay pending), in any segment state."""
        w = self.writer
        for entry in seg.pending:
            if entry.deadline > now:
                break
            if not entry.timed_out:
                entry.timed_out = True
                exc = WriteTimeoutError(
                    f"entry {seg.segment_id}:{entry.entry_id} of log {w.log_id} not acknowledged "
                    f"by {seg.aq} nodes within {w.timeout_s:g} s; it stays pending and is retried"
                )
                expired.extend((f, exc) for f in _take_waiters(entry))


def _take_waiters(entry: PendingEntry) -> list[Waiter]:
    """The entry's waiting futures, detached (a later commit has nobody left to tell)."""
    futures = [f for f, _ in entry.waiters()]
    entry.future = None
    entry.joiners = None
    return futures


def run_bounded(fn: Callable[[], object], seconds: float | None, what: str, log_id: int) -> bool:
    """Run `fn` for at most `seconds` (None: to its end): on a thread of its own, so a store
    that hangs (S3 frozen, each call retrying for its budget) cannot hold a close past its
    bound. Returns whether it finished; if not, it is logged and left running (as a daemon):
    what it could not do is the next writer's (its takeover completes the segments)."""
    if seconds is None:
        fn()
        return True
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception:
            log.exception("log %s: %s failed", log_id, what)
        finally:
            done.set()

    threading.Thread(target=run, name=f"wp-close-{log_id}", daemon=True).start()
    if done.wait(max(0.0, seconds)):
        return True
    log.warning(
        "log %s: %s did not finish within the close timeout; left to the next writer",
        log_id,
        what,
    )
    return False


# --- forks and exit -----------------------------------------------------------------------

FORKS = [0]


def _after_fork_in_child() -> None:
    FORKS[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_error(what: str, pid: int) -> WriterForkedError:
    """The error for `what`, opened in process `pid`, used in a process forked since (callers
    compare `FORKS[0]` with the generation they saw at open, which is cheaper than a call)."""
    return WriterForkedError(
        f"{what} was opened in process {pid} and used in process {os.getpid()} (a fork): its "
        "threads do not exist here; open a client and writer in this process"
    )


#: Every writer still open at exit is closed within this many seconds in all
EXIT_CLOSE_TIMEOUT_S = 30.0

_open: weakref.WeakSet[Pipeline] = weakref.WeakSet()
# A forked child's writers are its parent's: the child neither flushes nor completes them at exit.
os.register_at_fork(after_in_child=_open.clear)


def track(writer: Pipeline) -> None:
    """`writer` is open: close it at exit unless it is closed before."""
    _open.add(writer)


def untrack(writer: Pipeline) -> None:
    _open.discard(writer)


def close_open_writers(timeout: float = EXIT_CLOSE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for writer in list(_open):
        try:
            writer.close(max(0.0, deadline - time.monotonic()))
        except Exception:
            log.exception("log %s: closing the writer at exit failed", writer.log_id)


atexit.register(close_open_writers)


# --- Ctrl-C ------------------------------------------------------------------------------

_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)


class _HoldInterrupts:
    """Re-entrant: nested holds deliver once, when the outermost ends."""

    __slots__ = ("_depth", "_previous", "_held")

    def __init__(self) -> None:
        self._depth = 0
        self._previous: Any = None
        self._held: list[FrameType | None] = []

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        if self._depth == 0:
            previous = _signal.getsignal(_SIGINT)
            if previous is None:  # installed outside Python: cannot be put back, leave it
                self._previous = _UNTOUCHED
            else:
                _signal.signal(_SIGINT, self._hold)
                self._previous = previous
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not _MAIN:
            return
        self._depth -= 1
        if self._depth:
            return
        previous = self._previous
        self._previous = None
        if previous is _UNTOUCHED:
            return
        _signal.signal(_SIGINT, previous)
        if not self._held:
            return
        frame = self._held[0]
        self._held.clear()
        if callable(previous):  # Python's default handler raises KeyboardInterrupt here
            previous(_SIGINT, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(_SIGINT)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._held.append(frame)


_UNTOUCHED = object()

HOLD_INTERRUPTS = _HoldInterrupts()
