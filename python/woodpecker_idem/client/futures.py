"""WriteFuture: a `concurrent.futures.Future` that costs half as much on the write path.

Every write returns a future, so its price is paid per entry. The standard Future builds a
`threading.Condition` up front and takes it on every call; this subclass builds it only when
someone actually blocks on it (`result()` before completion, `wait`, `as_completed`, `cancel`).
Until then completion and callbacks are decided under one module-level lock, which also guards
creating the condition, so the two paths never miss each other:
- set first: the state is FINISHED before any condition exists; later waiters see it at once.
- condition first: completion takes the standard (condition-based) path and wakes them.
It relies on Future's private fields (`_state`, `_result`, `_exception`, `_waiters`,
`_done_callbacks`, `_invoke_callbacks`), unchanged since Python 3.2; tests/test_write_future.py
pins the behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any

_LAZY = threading.Lock()
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class WriteFuture(Future):
    def __init__(self) -> None:  # noqa: D107 - deliberately skips Future.__init__'s Condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self.__dict__.get("_cond")
        if cond is None:
            with _LAZY:
                cond = self.__dict__.get("_cond")
                if cond is None:
                    cond = self.__dict__["_cond"] = threading.Condition()
        return cond

    def _complete(self, result: Any, exception: BaseException | None) -> None:
        with _LAZY:  # nothing in here may touch `_condition` (it takes _LAZY too)
            fast = "_cond" not in self.__dict__
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
        self._complete(None, exception)

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        with _LAZY:
            if "_cond" not in self.__dict__ and self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        Future.add_done_callback(self, fn)

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:  # set before the state, so both are visible now
            if self._exception is not None:
                raise self._exception
            return self._result
        return Future.result(self, timeout)

    def done(self) -> bool:
        return self._state in _DONE
