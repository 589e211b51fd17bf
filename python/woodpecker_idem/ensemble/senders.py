"""One sender per LogStore node per client, shared by every writer and reader of the client
(Kafka's `NetworkClient`, Woodpecker's `LogStoreClientPool`): the calls to a node, in lanes.

A *lane* is an ordered stream of calls: a writer's segment is one (its batches reach the node in
entry order), a single call made by a reader or a recovery is a lane of its own. One call of a
lane runs at a time, in submit order; lanes with a call ready take turns on the node's few worker
threads, so a log sending large batches delays another by one call at most (no head-of-line
blocking). A call that fails may ask to be retried after a delay (`Job.done` returns it): its lane
waits on the scheduler's timer, holding back only that lane.

A call that returns moves its lane on at once, before its `Job.done` hears the result: the next
call of the lane (the next batch's write and fdatasync) runs while the writer commits the one
before, so a commit is not on the path from one durable add to the next. A lane's `done`s are
still told one at a time, in call order: a worker that ends a call while an earlier outcome of
its lane is being told leaves its own to that teller (`_Lane.outcomes`) and goes on to other
work, so a slow `done` (waiting for the writer's lock) holds back no other lane's calls.

Every call has a deadline (the sender's `deadline_s`, or the call's own). A call still running
past it is answered with a retriable `NodeUnavailableError` (the caller retries or gives up as for
any unreachable node) and its worker is written off: a fresh worker takes its place, so the
node's other lanes go on. What the stuck call returns later is ignored (a node stores a resent
batch once: it acks identical bytes again). While too many of a node's calls are stuck, calls to
it fail at once, until one returns.

A job that can be started without a thread (`Job.start`: a transport whose calls wait on the
network, `LogStoreTransport.start_add_entries`) is started as soon as its lane's turn comes, on
the thread that made it ready, and answered on the transport's own thread: no worker is woken,
and its deadline is the transport's (the call fails with a retriable `NodeUnavailableError`
when it passes). Its lane still runs one call at a time, in submit order.

`NodeCalls` is the synchronous face of the same senders: a `LogStoreTransport` whose every call runs
on the node's sender with the deadline, for readers, recoveries and the window rebuild.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from ..errors import NodeUnavailableError
from ..logstore.transport import LogStoreTransport
from .scheduler import Scheduler

log = logging.getLogger(__name__)

#: Calls to one node in flight at once (one per lane). Two let a node store one segment's batch
#: while another's fdatasync runs; each is a thread of the client's.
CALLS_PER_NODE = 2
#: Workers of one node written off as stuck before its calls fail at once.
MAX_STUCK_PER_NODE = 8


Answer = Callable[[Any, BaseException | None], None]


class Job:
    """One call of a lane. `call()` runs on a worker; `done(result, error)` then hears how it
    went, after the lane's earlier calls' `done`s. A call that returned is over (the lane's next
    call may already run beside its `done`, whose answer is not asked); after a failure `done`
    says what next: None (the lane moves on) or a delay in seconds after which `call` runs again.
    `deadline_s`: this call's own deadline (None: the sender's). `start(answer)`, if given, is
    tried first: it starts the attempt without blocking and returns True (then `answer(result,
    error)` comes later from another thread, exactly once), or returns False (then `call` runs on
    a worker)."""

    __slots__ = ("call", "done", "deadline_s", "start", "started", "answered")

    def __init__(
        self,
        call: Callable[[], Any],
        done: Callable[[Any, BaseException | None], float | None],
        deadline_s: float | None = None,
        start: Callable[[Answer], bool] | None = None,
    ):
        self.call = call
        self.done = done
        self.deadline_s = deadline_s
        self.start = start
        self.started = 0.0  # monotonic start of the running attempt (0: not running)
        self.answered = False  # the running attempt was answered (by its worker or the deadline)


class _Lane:
    """A lane's calls not over yet (the head one running, or parked for its retry), and the
    outcomes of its calls not told yet, in call order."""

    __slots__ = ("calls", "outcomes", "telling")

    def __init__(self) -> None:
        self.calls: deque[Job] = deque()
        self.outcomes: deque[tuple[Job, Any, BaseException | None]] = deque()
        self.telling = False  # a worker is running this lane's `done`s


class NodeSender:
    """The calls to one node (see the module doc). Thread-safe."""

    def __init__(self, node: str, scheduler: Scheduler, deadline_s: float):
        self.node = node
        self.deadline_s = deadline_s
        self._scheduler = scheduler
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._lanes: dict[Hashable, _Lane] = {}
        self._ready: deque[Hashable] = deque()
        self._running: dict[threading.Thread, tuple[Hashable, Job]] = {}
        self._workers: set[threading.Thread] = set()
        self._stuck: set[threading.Thread] = set()
        self._idle = 0
        self._closed = False
        self._spawned = 0
        self._watchdog = scheduler.timer(self._check_deadlines, f"deadlines-{node}")

    @property
    def threads(self) -> list[threading.Thread]:
        """The node's live workers (stuck ones not counted: they end when their call returns)."""
        with self._lock:
            return list(self._workers - self._stuck)

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, lane: Hashable, job: Job) -> bool:
        """Queue `job` behind the calls of `lane`. False once the sender is closed."""
        with self._lock:
            if self._closed:
                return False
            state = self._lanes.get(lane)
            if state is None:
                state = self._lanes[lane] = _Lane()
            state.calls.append(job)
            if len(state.calls) == 1:
                self._ready_locked(lane)
            return True

    def call(self, fn: Callable[[], Any], deadline_s: float | None = None) -> Any:
        """Run `fn` as a lane of its own and wait for it: its result, or what it raised, or a
        retriable `NodeUnavailableError` once its deadline passes (`deadline_s`, else the
        sender's)."""
        if threading.current_thread() in self._workers:
            return fn()  # on this node's own worker (a callback calling back): no hop, no wait
        done = threading.Event()
        out: list[Any] = [None, None]

        def finish(result: Any, error: BaseException | None) -> None:
            out[0], out[1] = result, error
            done.set()

        if not self.submit(object(), Job(fn, finish, deadline_s)):
            raise NodeUnavailableError(f"LogStore node {self.node}: its client is closed")
        done.wait()
        if out[1] is not None:
            raise out[1]
        return out[0]

    def _ready_locked(self, lane: Hashable) -> None:
        job = self._lanes[lane].calls[0]
        if job.start is not None:
            try:
                if job.start(lambda r, e: self._finish(lane, job, r, e)):
                    return  # started: its answer moves the lane on (`_finish`)
            except Exception:  # a bug in a start must not lose the call: a worker makes it
                log.exception("LogStore node %s: starting a call failed", self.node)
        self._ready.append(lane)
        if self._idle:
            self._work.notify()
        elif len(self._workers) - len(self._stuck) < CALLS_PER_NODE:
            self._spawn_locked()

    def _spawn_locked(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"wp-node-{self.node}-{self._spawned}", daemon=True
        )
        self._spawned += 1
        self._workers.add(thread)
        thread.start()
        self._watchdog.at(time.monotonic() + self.deadline_s)

    def _unpark(self, lane: Hashable) -> float | None:
        """A lane's retry is due (on the timer thread)."""
        with self._lock:
            state = self._lanes.get(lane)
            if not self._closed and state is not None and state.calls:
                self._ready_locked(lane)
        return None

    # --- the workers --------------------------------------------------------------------------

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
                while not self._ready and not self._closed:
                    self._work.wait()
                self._idle -= 1
                if self._closed:
                    self._workers.discard(me)
                    return
                lane = self._ready.popleft()
                job = self._lanes[lane].calls[0]
                job.started = time.monotonic()
                job.answered = False
                self._running[me] = (lane, job)
                own = job.deadline_s
            if own is not None and own < self.deadline_s:  # sooner than the watchdog looks
                self._watchdog.at(job.started + own)
            try:
                result, error = job.call(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the job, which decides
                result, error = None, exc
            with self._lock:
                self._running.pop(me, None)
                late = job.answered  # the deadline answered it: this worker was written off
                job.answered = True
                if late:
                    self._stuck.discard(me)
                    self._workers.discard(me)
                    return
            self._finish(lane, job, result, error)
            del job, result, error  # not kept while this worker waits for the next call

    def _finish(self, lane: Hashable, job: Job, result: Any, error: BaseException | None) -> None:
        """The attempt is over: a call that returned moves its lane on at once (its next call
        may start); then its outcome is told to the job, after the lane's earlier ones (see the
        module doc). A failed call's lane waits for its job's answer: move on, or retry."""
        with self._lock:
            state = self._lanes.get(lane)
            if state is not None:
                if error is None:
                    self._next_locked(lane, state)
                state.outcomes.append((job, result, error))
                if state.telling:
                    return  # the worker telling this lane's earlier outcomes tells this one
                state.telling = True
        if state is None:  # closed: the lanes were dropped
            self._done(job, result, error)
        else:
            self._tell(lane, state)

    def _tell(self, lane: Hashable, state: _Lane) -> None:
        """Tell the lane's outcomes in call order, without the lock (a job may submit more),
        until none is left."""
        while True:
            with self._lock:
                if not state.outcomes:
                    state.telling = False
                    if not state.calls and self._lanes.get(lane) is state:
                        del self._lanes[lane]
                    return
                job, result, error = state.outcomes.popleft()
            delay = self._done(job, result, error)
            if error is None:
                continue  # its lane moved on when the call returned
            if delay is None:
                with self._lock:
                    if self._lanes.get(lane) is state:
                        self._next_locked(lane, state)
                continue
            timer = self._scheduler.timer(lambda: self._unpark(lane), f"retry-{self.node}")
            timer.at(time.monotonic() + delay)

    def _done(self, job: Job, result: Any, error: BaseException | None) -> float | None:
        try:
            return job.done(result, error)
        except Exception:  # a bug in a callback must not stall the lane
            log.exception("LogStore node %s: a call's callback failed", self.node)
            return None

    def _next_locked(self, lane: Hashable, state: _Lane) -> None:
        """The call at the lane's head is over: its next one, if any, is ready to run."""
        state.calls.popleft()
        if state.calls:
            self._ready_locked(lane)

    def _check_deadlines(self) -> float | None:
        """On the timer thread: answer calls past their deadline, and replace their workers."""
        now = time.monotonic()
        overdue: list[tuple[Hashable, Job]] = []
        with self._lock:
            if self._closed:
                return None
            for thread, (lane, job) in list(self._running.items()):
                if now - job.started < (job.deadline_s or self.deadline_s) or job.answered:
                    continue
                job.answered = True
                del self._running[thread]
                self._stuck.add(thread)
                overdue.append((lane, job))
                if len(self._stuck) <= MAX_STUCK_PER_NODE and self._ready:
                    self._spawn_locked()
            if len(self._stuck) > MAX_STUCK_PER_NODE:  # no worker left to try: fail what waits
                while self._ready:
                    lane = self._ready.popleft()
                    overdue.append((lane, self._lanes[lane].calls[0]))
            due = min(
                (
                    job.started + (job.deadline_s or self.deadline_s)
                    for _, job in self._running.values()
                ),
                default=None,
            )
            busy = due is not None or bool(self._stuck)
        for lane, job in overdue:
            error = NodeUnavailableError(
                f"LogStore node {self.node} did not answer within "
                f"{job.deadline_s or self.deadline_s:g} s"
            )
            self._finish(lane, job, None, error)
        if due is not None:  # the next running call's deadline, checked at most every 10 ms
            return max(0.01, min(due - now, self.deadline_s / 4))
        return self.deadline_s / 4 if busy or overdue else self.deadline_s

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float) -> None:
        """Drop the calls not started, end the workers (a running call gets up to `timeout`)."""
        with self._lock:
            self._closed = True
            self._lanes.clear()
            self._ready.clear()
            self._work.notify_all()
            workers = list(self._workers - self._stuck)
        self._watchdog.cancel()
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for thread in workers:
            if thread is not me:
                thread.join(max(0.0, deadline - time.monotonic()))


class NodeCalls(LogStoreTransport):
    """The synchronous face of the senders: each call runs on its node's sender, with the
    deadline `deadline_s`, through `source()`, the transport of the moment (a test may wrap it
    in a fault injector). What readers, recoveries and the window rebuild call nodes through:
    calls that may scan a whole segment (a fence or a read on object storage lists and reads
    its blocks), hence a deadline of their own, longer than a write's add."""

    def __init__(
        self,
        source: Callable[[], LogStoreTransport],
        sender: Callable[[str], NodeSender],
        deadline_s: float,
    ):
        self._source = source
        self._sender = sender
        self._deadline_s = deadline_s

    def _call(self, node_id: str, fn: Callable[[], Any]) -> Any:
        return self._sender(node_id).call(fn, self._deadline_s)

    @property
    def inner(self) -> LogStoreTransport:
        """The transport the calls go through (what a wrapper's `inner` is, for a raw read)."""
        return self._source()

    @property
    def node_ids(self) -> list[str]:
        return self._source().node_ids

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        inner = self._source()
        return self._call(
            node_id,
            lambda: inner.add_entries(
                node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
            ),
        )

    def fence(self, node_id, log_id, segment_id):
        inner = self._source()
        return self._call(node_id, lambda: inner.fence(node_id, log_id, segment_id))

    def complete(self, node_id, log_id, segment_id, last_entry_id):
        inner = self._source()
        self._call(node_id, lambda: inner.complete(node_id, log_id, segment_id, last_entry_id))

    def seal_segment(self, node_id, log_id, segment_id, last_entry_id):
        inner = self._source()
        return self._call(
            node_id, lambda: inner.seal_segment(node_id, log_id, segment_id, last_entry_id)
        )

    def completed_end(self, node_id, log_id, segment_id):
        inner = self._source()
        return self._call(node_id, lambda: inner.completed_end(node_id, log_id, segment_id))

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        inner = self._source()
        return self._call(
            node_id, lambda: inner.read(node_id, log_id, segment_id, from_entry_id, max_entries)
        )

    def last_add_confirmed(self, node_id, log_id, segment_id):
        inner = self._source()
        return self._call(node_id, lambda: inner.last_add_confirmed(node_id, log_id, segment_id))

    def delete_segment(self, node_id, log_id, segment_id):
        inner = self._source()
        self._call(node_id, lambda: inner.delete_segment(node_id, log_id, segment_id))

    def delete_log(self, node_id, log_id):
        inner = self._source()
        self._call(node_id, lambda: inner.delete_log(node_id, log_id))

    def raw_read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        # the history checker's read, not a call of the system it judges: straight through, not
        # queued behind the node's writes on its sender
        return self._source().raw_read(node_id, log_id, segment_id, from_entry_id, max_entries)
