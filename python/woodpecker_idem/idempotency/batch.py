"""One completion per batch: the rows of `write_many` / `write_arrow` report into columns.

The write path resolves each row like a future (`set_result`, `set_exception`, `done`); a
`RowSlot` is the smallest object that answers to that, and writes the row's outcome straight into
the batch's columns. The caller waits once, on the batch, not on a future per row.
"""

from __future__ import annotations

import threading
from array import array

from ..errors import WriteTimeoutError
from ..types import WriteResult

_COMMITTED_TO_ONE = bytes(1 if b == 2 else 0 for b in range(256))


class BatchCompletion:
    """Columnar outcomes of a batch of N rows; `wait` returns once every row has one."""

    __slots__ = ("segment_ids", "entry_ids", "duplicate", "_left", "_lock", "_done", "error")

    def __init__(self, n: int) -> None:
        self.segment_ids = array("q", [-1]) * n
        self.entry_ids = array("q", [-1]) * n
        self.duplicate = bytearray(n)
        self.error: tuple[int, BaseException] | None = None  # the first failed row
        self._left = n
        self._lock = threading.Lock()
        self._done = threading.Event()
        if n == 0:
            self._done.set()

    def slots(self, start: int, stop: int) -> list[RowSlot]:
        return [RowSlot(self, i) for i in range(start, stop)]

    def answer_committed(self, start: int, status: bytes, segments: bytes, entries: bytes) -> int:
        """Rows start.. whose keys the window holds committed (status 2, from `get_many`) are
        duplicates at the ids given, set in bulk; returns how many. The other rows' ids are
        overwritten when they settle."""
        stop = start + len(status)
        committed = status.count(2)
        if committed:
            self.segment_ids[start:stop] = array("q", segments)
            self.entry_ids[start:stop] = array("q", entries)
            self.duplicate[start:stop] = status.translate(_COMMITTED_TO_ONE)
            with self._lock:
                self._left -= committed
                if self._left == 0:
                    self._done.set()
        return committed

    def settle(self, slot: RowSlot, result: WriteResult | None, exc: BaseException | None) -> None:
        """A row's outcome (once: later calls for the same row are ignored, like a Future's)."""
        with self._lock:
            if slot.settled:
                return
            slot.settled = True
            row = slot.row
            if exc is None and result is not None:
                mid = result.message_id
                self.segment_ids[row] = mid.segment_id
                self.entry_ids[row] = mid.entry_id
                self.duplicate[row] = result.duplicate
            elif self.error is None or row < self.error[0]:
                self.error = (row, exc or RuntimeError("row resolved without an outcome"))
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def wait(self, timeout: float | None) -> None:
        """Block until every row is resolved; raises the first row's failure, if any."""
        if not self._done.wait(timeout):
            with self._lock:
                left = self._left
            raise WriteTimeoutError(
                f"{left} of {len(self.entry_ids)} rows not acknowledged within {timeout:g} s; "
                "they are still pending and being retried: retry the batch (a retry joins them; "
                "rows already written come back as duplicates)"
            )
        if self.error is not None:
            row, exc = self.error
            exc.add_note(f"(row {row} of the batch; the first that failed)")
            raise exc


class RowSlot:
    """Stands in for a row's future on the write path."""

    __slots__ = ("batch", "row", "settled")

    def __init__(self, batch: BatchCompletion, row: int) -> None:
        self.batch = batch
        self.row = row
        self.settled = False

    def done(self) -> bool:
        return self.settled

    def set_result(self, result: WriteResult) -> None:
        self.batch.settle(self, result, None)

    def set_exception(self, exc: BaseException) -> None:
        self.batch.settle(self, None, exc)
