"""The batch lane: many rows per call, one completion per call, no future per row.

A batch call (`LogWriter.write_many`, and `IdempotentLogWriter.write_keyed` with the calls built
on it) hands the writer core its new rows as runs (`InFlight.enqueue_run_locked`: up to a batch
of consecutive entries, one frame, one waiter), in chunks of one AddEntries batch. Each run's
waiter is a `RunRows`, a row that joined an entry in flight a `RowJoiner`; both report to the
call's `BatchCompletion`, which counts the rows still open and keeps the failures by row, so the
call waits once and fails exactly the rows a failure concerns. `write_rows` is the plain
writer's lane; the idempotent one (idempotency/batch.py) adds the window.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError
from typing import TYPE_CHECKING, Any

from .._core import encode_frame
from ..errors import WoodpeckerError, WriteTimeoutError
from ..types import WriteManyResult
from .workers import resolve

if TYPE_CHECKING:
    from .writer import LogWriter

# Bytes a row counts against the batch and in-flight limits before its record exists
ROW_OVERHEAD = 64

Failure = tuple[Sequence[int], BaseException]


class BatchCompletion:
    """The rows of one call handed to the core and not ended yet (by waiter), and the rows that
    failed. Thread-safe: outcomes arrive from the core's threads."""

    __slots__ = ("_cond", "_open", "_waiting", "_handed", "failures")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._open = 0
        self._waiting: set[_Rows] = set()
        self._handed = False  # every row has been handed to the core or answered
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
    """Rows of a call waiting on the core; told once, like a future (a second outcome raises
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


def chunk_end(payloads: list[bytes], start: int, end: int, limit: int) -> tuple[int, int]:
    """(bytes, end) of the rows from `start` (before `end`) whose payloads fit `limit` bytes
    with their overhead (at least one row)."""
    nbytes = sum(map(len, payloads[start:end])) + ROW_OVERHEAD * (end - start)
    if nbytes <= limit:
        return nbytes, end
    nbytes = 0
    for i in range(start, end):
        size = len(payloads[i]) + ROW_OVERHEAD
        if i > start and nbytes + size > limit:
            return nbytes, i
        nbytes += size
    return nbytes, end


def finish(
    call: BatchCompletion,
    result: WriteManyResult,
    wait: float | None,
    pending_text: Callable[[], str],
) -> WriteManyResult:
    """Wait up to `wait` seconds for every row of the call; then the result, or the error of its
    lowest failed row (else a `WriteTimeoutError`) carrying the result and which rows were
    acknowledged (`WoodpeckerError.batch_result`, `.acknowledged`)."""
    n = len(result)
    still_open = call.wait(wait)
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


def write_rows(
    core: LogWriter, payloads: list[bytes], wait: float | None, pending_text: Callable[[], str]
) -> WriteManyResult:
    """The plain writer's batch lane: `payloads` (bytes within append.max_entry_bytes) appended
    in order, in runs of one AddEntries batch each; waits up to `wait` seconds."""
    n = len(payloads)
    result = WriteManyResult(array("q", bytes(8 * n)), array("q", bytes(8 * n)), bytearray(n))
    call = BatchCompletion()
    start = 0
    outcomes: list = []
    try:
        while start < n:
            nbytes, end = chunk_end(
                payloads, start, min(n, start + core.max_batch_entries), core.max_batch_bytes
            )
            with core.lock:
                outcomes += core.admit_writes_locked()  # write_async's queued writes go first
                core.check_open_locked()
                if core.inflight.full_locked(nbytes, end - start):
                    core.wait_for_room_locked(nbytes, end - start)
                seg = core.segments.writable_locked()
                if seg is None:  # repairing: refused, nothing queued
                    call.fail(range(start, end), core.unavailable_error())
                    start = end
                    continue
                end = core.segments.run_end_locked(seg, payloads, start, end)  # within the segment
                first = seg.next_entry_id
                frame, count = encode_frame(
                    seg.segment_id, first, core.clock.now_ms(), payloads, start, end
                )
                result.segment_ids[start:end] = array("q", (seg.segment_id,)) * count
                result.entry_ids[start:end] = array("q", range(first, first + count))
                waiter = RunRows(call, start, count)
                call.add(waiter)
                core.inflight.enqueue_run_locked(seg, frame, count, waiter, time.monotonic())
            start = end
    except WoodpeckerError as refused:  # fenced or closed: the rest is refused, nothing queued
        call.fail(range(start, n), refused)
    finally:
        call.handed()
        if outcomes:
            resolve(outcomes)
    return finish(call, result, wait, pending_text)
