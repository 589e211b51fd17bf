"""The batch lane's completion: one object per call for all of its rows, no future per row.

A batch call (`IdempotentLogWriter.write_keyed` and the calls built on it) hands the writer core
its new rows as runs (`LogWriter.enqueue_run_locked`: up to a batch of consecutive entries, one
frame, one waiter). Each run's waiter is a `RunRows`, a row that joined an entry in flight is a
`RowJoiner`; both report to the call's `BatchCompletion`, which counts the rows still open and
keeps the failures by row, so the call waits once and fails exactly the rows a failure concerns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import InvalidStateError
from typing import Any

Failure = tuple[Sequence[int], BaseException]


class BatchCompletion:
    """How many rows of one call are still open (handed to the core, no outcome yet), and the
    rows that failed. Thread-safe: outcomes arrive from the core's threads."""

    __slots__ = ("_cond", "_open", "_handed", "failures")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open = 0
        self._handed = False  # every row has been handed to the core or answered
        self.failures: list[Failure] = []

    def add(self, rows: int) -> None:
        """`rows` more rows now wait for an outcome."""
        with self._cond:
            self._open += rows

    def end(self, rows: int, failed: Sequence[int] = (), exc: BaseException | None = None) -> None:
        """`rows` rows ended; `failed` of them (row numbers) with `exc`."""
        with self._cond:
            if exc is not None and failed:
                self.failures.append((failed, exc))
            self._open -= rows
            if self._open <= 0 and self._handed:
                self._cond.notify_all()

    def fail(self, failed: Sequence[int], exc: BaseException) -> None:
        """Rows refused before they were handed to the core (they never counted as open)."""
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


def _row(item: tuple[int, BaseException]) -> int:
    return item[0]


class _Once:
    """Told once, like a future (a second outcome raises `InvalidStateError`, which `resolve`
    ignores)."""

    __slots__ = ("_told",)

    def __init__(self) -> None:
        self._told = False

    def _tell(self) -> None:
        if self._told:
            raise InvalidStateError("already told")
        self._told = True


class RunRows(_Once):
    """The waiter of one run: the rows `rows()` of `call` whose entries the run holds, in entry
    order. Rows are `start..start+count` when `status` is None, else the rows of the chunk from
    `start` on whose status byte is 0 (computed only when a failure or a split needs them)."""

    __slots__ = ("_call", "_start", "_status", "_count", "_rows")

    def __init__(
        self,
        call: BatchCompletion,
        start: int,
        count: int,
        status: bytes | None = None,
        rows: Sequence[int] | None = None,
    ):
        super().__init__()
        self._call = call
        self._start = start
        self._count = count
        self._status = status
        self._rows = rows

    def rows(self) -> Sequence[int]:
        if self._rows is None:
            if self._status is None:
                self._rows = range(self._start, self._start + self._count)
            else:
                self._rows = [self._start + i for i, code in enumerate(self._status) if not code]
        return self._rows

    def set_result(self, result: Any) -> None:
        self._tell()
        self._call.end(self._count)

    def set_exception(self, exception: BaseException | None) -> None:
        self._tell()
        if exception is None:
            exception = RuntimeError("a run ended without an outcome")
        self._call.end(self._count, self.rows(), exception)

    def split(self, count: int) -> tuple[RunRows, RunRows]:
        rows = self.rows()
        head = RunRows(self._call, 0, count, rows=rows[:count])
        tail = RunRows(self._call, 0, self._count - count, rows=rows[count:])
        self._told = True  # its parts are told instead
        return head, tail


class RowJoiner(_Once):
    """Row `row` of `call`, joined to an entry in flight (its ids were filled in already)."""

    __slots__ = ("_call", "_row")

    def __init__(self, call: BatchCompletion, row: int):
        super().__init__()
        self._call = call
        self._row = row

    def set_result(self, result: Any) -> None:
        self._tell()
        self._call.end(1)

    def set_exception(self, exception: BaseException | None) -> None:
        self._tell()
        if exception is None:
            exception = RuntimeError("a joined entry ended without an outcome")
        self._call.end(1, (self._row,), exception)
