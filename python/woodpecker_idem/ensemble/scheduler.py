"""One scheduler per client for the background work of all its writers (BookKeeper's
`OrderedScheduler`): a timer thread and a few workers, so threads do not grow with writers.

- Timers (`Scheduler.timer`): a callback run on the timer thread at a time it asks for, or as soon
  as it is poked. Each writer's tick is one (timeouts, linger, LAC updates), and so is each
  writer's snapshot check. A timer callback must be short and must not block: it runs between
  every other timer of the client. It returns the seconds until its next run, or None to stop.
- Ordered tasks (`Scheduler.submit(key, fn)`): slow work (segment completion and repair, lease
  renewals, snapshot writes) on a small pool of workers; the tasks of one key run one at a time
  in submit order, as one thread per writer ran them before, and keys take turns.

`close()` cancels every timer, drops the tasks not started, and joins the threads: no task of a
closed client runs later against its closed stores. A task already running when its client closes
finishes; one that fails because its stores closed under it ends quietly (`ClientClosedError` is
not logged as a failure).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from ..errors import ClientClosedError

log = logging.getLogger(__name__)

#: Workers for ordered tasks. A task may block for long (a repair retrying until a node is back, a
#: snapshot streamed to a slow S3): that many keys can be busy at once before others queue.
TASK_WORKERS = 3


class Timer:
    """A callback on the scheduler's timer thread (see the module doc); `poke()` runs it soon,
    `cancel()` for good. Thread-safe."""

    __slots__ = ("_scheduler", "fn", "name", "due", "cancelled")

    def __init__(self, scheduler: Scheduler, fn: Callable[[], float | None], name: str):
        self._scheduler = scheduler
        self.fn = fn
        self.name = name
        self.due: float | None = None  # monotonic time of the next run; None: not scheduled
        self.cancelled = False

    def poke(self) -> None:
        """Run the callback as soon as the timer thread is free (coalesced with a pending run)."""
        self._scheduler.arm(self, time.monotonic())

    def at(self, when: float) -> None:
        """Run the callback at monotonic time `when`, unless it is due sooner already."""
        self._scheduler.arm(self, when)

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """See the module doc. `name` names the threads (`wp-timer-{name}`, `wp-task-{name}-{i}`)."""

    def __init__(self, name: str, workers: int = TASK_WORKERS):
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the timer thread sleeps on it
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._closed = False
        # ordered tasks: the queue of each key, the keys with work and no worker, the workers
        self._tasks: dict[Hashable, deque[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}
        self._ready: deque[Hashable] = deque()
        self._running: set[Hashable] = set()
        self._work = threading.Condition(self._lock)  # idle workers sleep on it
        self._max_workers = workers
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._timer_thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def threads(self) -> list[threading.Thread]:
        """The scheduler's threads (started lazily: none until the first timer or task)."""
        with self._lock:
            timer = [self._timer_thread] if self._timer_thread is not None else []
            return timer + list(self._workers)

    # --- timers -------------------------------------------------------------------------------

    def timer(self, fn: Callable[[], float | None], name: str = "") -> Timer:
        """A timer for `fn` (not scheduled until poked or given a time)."""
        return Timer(self, fn, name)

    def arm(self, timer: Timer, when: float) -> None:
        """Run `timer` at `when` (monotonic) unless it is due sooner already (`Timer.at`)."""
        with self._lock:
            if self._closed or timer.cancelled:
                return
            if timer.due is not None and timer.due <= when:
                return  # due sooner already: one run serves both
            timer.due = when
            first = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(
                    target=self._run_timers, name=f"wp-timer-{self.name}", daemon=True
                )
                self._timer_thread.start()
            elif first:
                self._wake.notify()

    def _run_timers(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    # entries of a timer re-armed sooner (or cancelled) are stale: skip them
                    while self._heap and (
                        self._heap[0][2].due != self._heap[0][0] or self._heap[0][2].cancelled
                    ):
                        heapq.heappop(self._heap)
                    if self._heap and self._heap[0][0] <= now:
                        _, _, timer = heapq.heappop(self._heap)
                        timer.due = None
                        break
                    self._wake.wait(self._heap[0][0] - now if self._heap else None)
            try:
                delay = timer.fn()
            except ClientClosedError:
                delay = None  # its stores closed under it: the client is going away
            except Exception:  # a bug in one timer must not stop the others
                log.exception("timer %s failed; it runs again in 1 s", timer.name)
                delay = 1.0
            if delay is not None:
                timer.at(time.monotonic() + max(delay, 0.0))

    # --- ordered tasks ------------------------------------------------------------------------

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> bool:
        """Run `fn(*args)` on a worker after the tasks of `key` submitted before it. False (and
        nothing runs) once the scheduler is closed."""
        with self._lock:
            if self._closed:
                return False
            queue = self._tasks.get(key)
            if queue is None:
                queue = self._tasks[key] = deque()
            queue.append((fn, args))
            if key not in self._running and len(queue) == 1:
                self._ready.append(key)
                self._work.notify()
                if self._idle == 0 and len(self._workers) < self._max_workers:
                    thread = threading.Thread(
                        target=self._run_tasks,
                        name=f"wp-task-{self.name}-{len(self._workers)}",
                        daemon=True,
                    )
                    self._workers.append(thread)
                    thread.start()
            return True

    def drain(self, key: Hashable, timeout: float) -> bool:
        """Wait up to `timeout` s for the tasks of `key` submitted so far to end (False: some
        are still queued or running; with the scheduler closed, the queued ones never will)."""
        done = threading.Event()
        if not self.submit(key, done.set):
            with self._lock:
                return key not in self._running
        return done.wait(timeout)

    def _run_tasks(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
                while not self._ready and not self._closed:
                    self._work.wait()
                self._idle -= 1
                if self._closed:
                    return
                key = self._ready.popleft()
                fn, args = self._tasks[key].popleft()
                self._running.add(key)
            try:
                fn(*args)
            except ClientClosedError:
                pass  # its stores closed under it: the client is going away
            except Exception:  # callers log their own failures; this is the last net
                log.exception("background task %s failed", getattr(fn, "__name__", fn))
            finally:
                del fn, args
                with self._lock:
                    self._running.discard(key)
                    queue = self._tasks.get(key)
                    if queue:
                        self._ready.append(key)  # behind the keys waiting: keys take turns
                        self._work.notify()
                    elif queue is not None:
                        del self._tasks[key]

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Cancel every timer, drop the tasks not started, and join the threads (a running task
        gets up to `timeout` s in all to end). Idempotent."""
        with self._lock:
            self._closed = True
            self._heap.clear()
            self._tasks = {k: q for k, q in self._tasks.items() if k in self._running}
            for queue in self._tasks.values():
                queue.clear()
            self._ready.clear()
            self._wake.notify_all()
            self._work.notify_all()
            threads = [self._timer_thread, *self._workers]
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for thread in threads:
            if thread is not None and thread is not me:
                thread.join(max(0.0, deadline - time.monotonic()))
