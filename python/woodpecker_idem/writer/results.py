"""What a write waits on, and how it is told: futures, runs of futures, a batch call's rows.

- `WriteFuture`: a `concurrent.futures.Future` that costs half as much on the write path. Every
  write returns a future, so its price is paid per entry. The standard Future builds a
  `threading.Condition` up front and takes it on every call; this subclass builds it only when
  someone actually blocks on it (`result()` before completion, `wait`, `as_completed`, `cancel`).
  Until then completion and callbacks are decided under one module-level lock, which also guards
  creating the condition, so the two paths never miss each other (set first: the state is FINISHED
  before any condition exists; condition first: completion takes the standard path and wakes
  them). The two lists a Future owns (`_waiters`, `_done_callbacks`) are made on first use too, so
  a future nobody waits on is one object for the garbage collector, not four. A queued write
  cannot be withdrawn (it may be on the nodes already), so `cancel()` returns False, as Kafka's
  producer futures do. It relies on Future's private fields, unchanged since Python 3.2;
  tests/writer/test_write_future.py pins the behaviour.
- `FutureRun`: the one waiter of a run of entries made from queued writes.
- `BatchCompletion`, `RunRows`, `RowJoiner`: a batch call's rows, no future per row; the call
  waits once and fails exactly the rows a failure concerns (`finish`).
- `resolve`: outcomes are set after the writer's lock is released (callbacks may call back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
)
from typing import Any, Protocol

from .._core import write_results
from ..errors import WoodpeckerError, WriteTimeoutError
from ..types import LogMessageId, WriteManyResult, WriteResult


class Waiter(Protocol):
    """What waits on a pending entry: a `Future`, or a batch call's rows (`RunWaiter`)."""

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException | None) -> None: ...


class RunWaiter(Waiter, Protocol):
    """The one waiter of a run (`PendingEntry.count` > 1): told once for all its entries (its
    result carries the first entry's id) and split when a segment ends inside the run."""

    def split(self, count: int) -> tuple[RunWaiter, RunWaiter]:
        """(the waiter of the first `count` entries, that of the rest)."""
        ...


# (waiter, WriteResult or exception): set after the lock is released (`resolve`)
Outcomes = list[tuple[Waiter, object]]


def resolve(items: Sequence[tuple[Waiter, object]]) -> None:
    """Set results/exceptions outside the writer's lock (callbacks may call back into it)."""
    for future, outcome in items:
        try:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        except InvalidStateError:  # already resolved (e.g. timed out, or cancelled by the caller)
            pass


_LAZY = threading.Lock()
# what `settle_locked` leaves to do
_DONE_NOW, _CALLBACKS, _FULL = object(), object(), object()
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class WriteFuture(Future):
    """A Future whose condition and lists exist only once somebody needs them.

    One is kept per write in flight, so each object it owns is one more for the garbage
    collector to walk: a plain Future owns a condition, two lists and (once its attributes are
    looked up by name) a dict. This one owns nothing until a caller blocks, waits or adds a
    callback; `__dict__` is never touched, so Python keeps the attributes inline.
    """

    def __init__(self) -> None:  # noqa: D107 - deliberately skips Future.__init__
        self._state = PENDING
        self._result = None
        self._exception = None
        self._cond: threading.Condition | None = None
        self._callbacks: list | None = None
        self._waiter_list: list | None = None

    def _made(self, attr: str, make: Callable[[], Any]) -> Any:
        """The attribute, made on first use (under _LAZY, so racing callers share one)."""
        value = getattr(self, attr)
        if value is None:
            with _LAZY:
                value = getattr(self, attr)
                if value is None:
                    value = make()
                    setattr(self, attr, value)
        return value

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._made("_cond", threading.Condition)

    @property
    def _waiters(self) -> list:  # type: ignore[override]
        """For `concurrent.futures.wait` / `as_completed` (they append under `_condition`)."""
        return self._made("_waiter_list", list)

    @property
    def _done_callbacks(self) -> list:
        return self._made("_callbacks", list)

    def _invoke_callbacks(self) -> None:
        if self._callbacks:
            super()._invoke_callbacks()  # type: ignore[misc]  # private, not in typeshed

    def _complete(self, result: Any, exception: BaseException | None) -> None:
        with _LAZY:  # nothing in here may touch `_condition` (it takes _LAZY too)
            fast = self._cond is None
            already = fast and self._state in _DONE
            if fast and not already:
                self._result = result
                self._exception = exception
                self._state = FINISHED
        if already:
            raise InvalidStateError(f"{self._state}: {self!r}")
        if fast:
            self._invoke_callbacks()
        elif exception is None:
            Future.set_result(self, result)
        else:
            Future.set_exception(self, exception)

    def set_result(self, result: Any) -> None:
        self._complete(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        """As `set_result`: a failed write (a fence fails every queued one) builds no condition
        or list either."""
        self._complete(None, exception)

    @staticmethod
    def settle_all(futures: Sequence[Any], results: Sequence[Any]) -> None:
        """Set each future's result (one ack settles a run of writes) under one `_LAZY` hold.
        A future settled already (a timeout got there first) is left alone; other waiters than
        WriteFutures, and futures somebody blocks on, get the full `set_result`."""
        slow = []
        called = []
        with _LAZY:
            for future, result in zip(futures, results, strict=True):
                how = future.settle_locked(result) if type(future) is WriteFuture else _FULL
                if how is _CALLBACKS:
                    called.append(future)
                elif how is _FULL:
                    slow.append((future, result))
        for future in called:
            future.run_callbacks()
        for future, result in slow:
            try:
                future.set_result(result)
            except InvalidStateError:  # settled already
                pass

    def settle_locked(self, result: Any) -> object:
        """`settle_all`'s step, with `_LAZY` held: settles at once unless a condition exists.
        Returns _DONE_NOW, _CALLBACKS (callbacks to run after the lock) or _FULL."""
        if self._cond is not None:
            return _FULL
        if self._state is PENDING:
            self._result = result
            self._state = FINISHED
            if self._callbacks:
                return _CALLBACKS
        return _DONE_NOW

    def run_callbacks(self) -> None:
        """The callbacks of a future `settle_locked` settled (outside `_LAZY`)."""
        self._invoke_callbacks()

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        with _LAZY:
            if self._cond is not None:
                done = None  # the standard path
            elif self._state in _DONE:
                done = True
            else:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = [fn]
                else:
                    callbacks.append(fn)
                return
        if done is None:
            Future.add_done_callback(self, fn)
            return
        try:  # already settled: called at once, as Future does
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        """Always False: a queued write cannot be withdrawn."""
        return False

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:  # set before the state, so both are visible now
            if self._exception is not None:
                raise self._exception
            return self._result
        return Future.result(self, timeout)

    def done(self) -> bool:
        return self._state in _DONE


class FutureRun:
    """The one waiter of a run of entries made from queued writes, one future each: told once
    with the run's first id, it settles every future with its own (`settle_all`, one call)."""

    __slots__ = ("futures",)

    def __init__(self, futures: list[Any]):
        self.futures = futures

    def set_result(self, result: Any) -> None:
        segment_id, first = result.message_id
        futures = self.futures
        results = write_results(
            segment_id, first, len(futures), result.duplicate, WriteResult, LogMessageId
        )
        WriteFuture.settle_all(futures, results)

    def set_exception(self, exception: BaseException | None) -> None:
        for future in self.futures:
            try:
                future.set_exception(exception)
            except InvalidStateError:  # settled already (a timeout got there first)
                pass

    def split(self, count: int) -> tuple[FutureRun, FutureRun]:
        return FutureRun(self.futures[:count]), FutureRun(self.futures[count:])


Failure = tuple[Sequence[int], BaseException]


class BatchCompletion:
    """The rows of one call handed to the pipeline and not ended yet (by waiter), and the rows that
    failed. Thread-safe: outcomes arrive from the pipeline.s threads."""

    __slots__ = ("_cond", "_open", "_waiting", "_handed", "failures")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open = 0
        self._waiting: set[_Rows] = set()
        self._handed = False  # every row has been handed to the pipeline or answered
        self.failures: list[Failure] = []

    def add(self, waiter: _Rows) -> None:
        """`waiter`'s rows now wait for an outcome."""
        with self._cond:
            self._waiting.add(waiter)
            self._open += waiter.count

    def end(self, waiter: _Rows, exc: BaseException | None = None) -> None:
        """`waiter`'s rows ended (failed with `exc` if given)."""
        with self._cond:
            self._waiting.discard(waiter)
            if exc is not None:
                self.failures.append((waiter.rows(), exc))
            self._open -= waiter.count
            if self._open <= 0 and self._handed:
                self._cond.notify_all()

    def replace(self, waiter: _Rows, parts: tuple[_Rows, ...]) -> None:
        """`waiter` was split into `parts` (same rows)."""
        with self._cond:
            self._waiting.discard(waiter)
            self._waiting.update(parts)

    def fail(self, failed: Sequence[int], exc: BaseException) -> None:
        """Rows refused before they were handed to the pipeline (they never counted as open)."""
        with self._cond:
            self.failures.append((failed, exc))

    def handed(self) -> None:
        """No more rows will be added: the wait can end once the open ones have."""
        with self._cond:
            self._handed = True
            if self._open <= 0:
                self._cond.notify_all()

    def wait(self, timeout: float | None) -> int:
        """Wait until every row ended or `timeout` seconds passed; returns the rows still open."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._open > 0 or not self._handed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._open

    def first_failure(self) -> tuple[int, int, BaseException] | None:
        """(lowest failed row, how many rows failed, its error), or None."""
        with self._cond:
            if not self.failures:
                return None
            count = sum(len(rows) for rows, _ in self.failures)
            row, exc = min(((min(rows), exc) for rows, exc in self.failures), key=_row)
        return row, count, exc

    def acknowledged(self, n: int) -> bytearray:
        """One byte per row of the call: 1 where it was acknowledged (or answered), 0 where it
        failed or is still open."""
        mask = bytearray(b"\x01") * n
        with self._cond:
            groups = [rows for rows, _ in self.failures]
            groups += [w.rows() for w in self._waiting]
        for rows in groups:
            for row in rows:
                mask[row] = 0
        return mask


def _row(item: tuple[int, BaseException]) -> int:
    return item[0]


class _Rows:
    """Rows of a call waiting on the pipeline; told once, like a future (a second outcome raises
    `InvalidStateError`, which `resolve` ignores)."""

    __slots__ = ("_told", "_call", "count")

    def __init__(self, call: BatchCompletion, count: int) -> None:
        self._told = False
        self._call = call
        self.count = count

    def rows(self) -> Sequence[int]:
        raise NotImplementedError

    def _tell(self) -> None:
        if self._told:
            raise InvalidStateError("already told")
        self._told = True

    def set_result(self, result: Any) -> None:
        self._tell()
        self._call.end(self)

    def set_exception(self, exception: BaseException | None) -> None:
        self._tell()
        self._call.end(self, exception or RuntimeError("ended without an outcome"))


class RunRows(_Rows):
    """The waiter of one run: the rows `rows()` of `call` whose entries the run holds, in entry
    order. Rows are `start..start+count` when `status` is None, else the rows of the chunk from
    `start` on whose status byte is 0 (computed only when a failure or a split needs them)."""

    __slots__ = ("_start", "_status", "_rows")

    def __init__(
        self,
        call: BatchCompletion,
        start: int,
        count: int,
        status: bytes | None = None,
        rows: Sequence[int] | None = None,
    ):
        super().__init__(call, count)
        self._start = start
        self._status = status
        self._rows = rows

    def rows(self) -> Sequence[int]:
        if self._rows is None:
            if self._status is None:
                self._rows = range(self._start, self._start + self.count)
            else:
                self._rows = [self._start + i for i, code in enumerate(self._status) if not code]
        return self._rows

    def split(self, count: int) -> tuple[RunRows, RunRows]:
        rows = self.rows()
        head = RunRows(self._call, 0, count, rows=rows[:count])
        tail = RunRows(self._call, 0, self.count - count, rows=rows[count:])
        self._told = True  # its parts are told instead
        self._call.replace(self, (head, tail))
        return head, tail


class RowJoiner(_Rows):
    """Row `row` of `call`, joined to an entry in flight (its ids were filled in already)."""

    __slots__ = ("_row",)

    def __init__(self, call: BatchCompletion, row: int):
        super().__init__(call, 1)
        self._row = row

    def rows(self) -> Sequence[int]:
        return (self._row,)


def finish(
    call: BatchCompletion,
    result: WriteManyResult,
    wait: float | None,
    pending_text: Callable[[], str],
    left: float | None = None,
) -> WriteManyResult:
    """Wait up to `left` seconds (the rest of the call's timeout `wait`) for every row of the
    call; then the result, or the error of its lowest failed row (else a `WriteTimeoutError`)
    carrying the result and which rows were acknowledged (`WoodpeckerError.batch_result`,
    `.acknowledged`)."""
    n = len(result)
    still_open = call.wait(left)
    failed = call.first_failure()
    error: WoodpeckerError
    if failed is not None:
        row, count, exc = failed
        text = (
            f"row {row}: {exc} ({count} of {n} rows failed; rows that landed are "
            "duplicates when the call is retried on an idempotent writer)"
        )
        try:
            made = type(exc)(text)
        except Exception:  # an error class with another signature
            made = WoodpeckerError(text)
        error = made if isinstance(made, WoodpeckerError) else WoodpeckerError(text)
        if type(error) is type(exc):
            error.__dict__.update(exc.__dict__)  # what it carries (e.g. a condition's ids)
        error.__cause__ = exc
    elif still_open:
        error = WriteTimeoutError(
            f"{still_open} of {n} rows not acknowledged within timeout={wait:g} s: {pending_text()}"
        )
    else:
        return result
    error.batch_result = result
    error.acknowledged = call.acknowledged(n)
    raise error
