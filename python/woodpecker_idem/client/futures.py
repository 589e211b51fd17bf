"""WriteFuture: a `concurrent.futures.Future` that costs half as much on the write path.

Every write returns a future, so its price is paid per entry. The standard Future builds a
`threading.Condition` up front and takes it on every call; this subclass builds it only when
someone actually blocks on it (`result()` before completion, `wait`, `as_completed`, `cancel`).
Until then completion and callbacks are decided under one module-level lock, which also guards
creating the condition, so the two paths never miss each other:
- set first: the state is FINISHED before any condition exists; later waiters see it at once.
- condition first: completion takes the standard (condition-based) path and wakes them.
The two lists a Future owns (`_waiters`, `_done_callbacks`) are made on first use too, so a
future nobody waits on is one object for the garbage collector, not four.
A queued write cannot be withdrawn (it may be on the nodes already), so `cancel()` returns False,
as Kafka's producer futures do: a True would promise that a write which still lands did not.
It relies on Future's private fields (`_state`, `_result`, `_exception`, `_waiters`,
`_done_callbacks`, `_invoke_callbacks`), unchanged since Python 3.2; tests/test_write_future.py
pins the behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
)
from typing import Any

from .._core import write_results
from ..types import LogMessageId, WriteResult

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
