"""The idempotent writer's batch lane: `write_keyed` (and `write_many` / `write_arrow` over it).

No Python object per row where it can be helped. A call's rows are judged against the window in
one pass (`get_many`): committed keys are answered at once. The rest go in chunks of up to one
AddEntries batch (append.max_batch_entries / max_batch_bytes, within the segment's roll limits),
each under the core's lock: one `reserve_many` (every row judged as of the chunk's time: new,
joining an entry in flight, or committed meanwhile), one `encode_frame` of the new rows, and one
run handed to the core (`InFlight.enqueue_run_locked`) with one waiter; only a row joining an
entry in flight gets an object (`RowJoiner`). The results are filled in columns from the window's
answers, and the call waits once, on its `BatchCompletion`.

Semantics are those of single writes (DESIGN.md 1.1): a key is admitted once per window, a
repeat inside the batch joins the first row's entry, a key queued or in flight from another call
joins that write. Writes queued on the intake before a chunk are admitted before it. A failure
fails the rows it concerns; the call then raises the error of the lowest failed row, once every
row has ended (or the timeout passed): rows that did land are in the log and in the window, so
retrying the call answers them as duplicates and writes only the rest.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable

from .._core import DedupWindow, encode_frame
from ..client.rows import BatchCompletion, RowJoiner, RunRows, chunk_end, finish
from ..client.segment import SegmentHandle
from ..client.workers import resolve
from ..client.writer import LogWriter
from ..clock import Clock
from ..errors import (
    InvalidArgumentError,
    InvalidTypeError,
    PayloadTooLargeError,
    WoodpeckerError,
)
from ..types import WriteManyResult
from .admission import Admission, i64_at

# status byte (0 new, 1 pending, 2 committed) -> duplicate flag
_DUPLICATE = bytes.maketrans(b"\x00\x01\x02", b"\x00\x01\x01")


def keyed_rows(payloads: list[bytes], keys: bytes, max_bytes: int) -> list[bytes]:
    """`write_keyed`'s rows, checked whole before any is queued (N*16 key bytes, bytes payloads
    within append.max_entry_bytes): a bad row refuses the batch, naming it. No Python work per
    row when every row is fine (the Spark sink's path)."""
    n = len(payloads)
    if len(keys) != 16 * n:
        raise InvalidArgumentError(f"keys has {len(keys)} bytes; {n} payloads need {16 * n}")
    if payloads and set(map(type, payloads)) != {bytes}:
        row = next(i for i, p in enumerate(payloads) if type(p) is not bytes)
        raise InvalidTypeError(
            f"payloads[{row}] must be bytes, not {type(payloads[row]).__name__}; nothing of "
            "the batch was written"
        )
    if payloads and max(map(len, payloads)) > max_bytes:
        row = next(i for i, p in enumerate(payloads) if len(p) > max_bytes)
        raise PayloadTooLargeError(
            f"row {row}: payload is {len(payloads[row])} bytes; append.max_entry_bytes "
            f"allows {max_bytes}; nothing of the batch was written"
        )
    return payloads if type(payloads) is list else list(payloads)


def _column(raw: bytes) -> array:
    col = array("q")
    col.frombytes(raw)
    return col


class BatchLane:
    """Writes checked rows with known keys through the core in runs (see the module doc)."""

    def __init__(self, core: LogWriter, window: DedupWindow, clock: Clock, admission: Admission):
        self._core = core
        self._window = window
        self._clock = clock
        self._admission = admission

    def write(
        self,
        payloads: list[bytes],
        keys: bytes,
        wait: float | None,
        pending_text: Callable[[], str],
    ) -> WriteManyResult:
        """`payloads`: bytes within append.max_entry_bytes; `keys`: their N*16-byte keys; waits
        up to `wait` seconds for every row (`pending_text`: what a timeout means)."""
        n = len(payloads)
        core = self._core
        status, segs, ents = self._lookup(keys, n, core.max_batch_entries)
        result = WriteManyResult(
            _column(segs), _column(ents), bytearray(status.translate(_DUPLICATE))
        )
        if status.count(2) == n:  # every key committed: answered from the window alone
            with core.lock:
                self._admission.duplicates += n
            return result
        call = BatchCompletion()
        step = core.max_batch_entries
        start = 0
        try:
            while start < n:
                end = min(n, start + step)
                if status.count(2, start, end) == end - start:
                    with core.lock:
                        self._admission.duplicates += end - start
                    start = end
                    continue
                start = self._chunk(call, payloads, keys, start, end, result)
        except WoodpeckerError as refused:  # fenced or closed: the rest is refused, nothing queued
            rest = [i for i in range(start, n) if status[i] != 2]
            call.fail(rest, refused)
        finally:
            call.handed()
        return finish(call, result, wait, pending_text)

    def _lookup(self, keys: bytes, n: int, head: int) -> tuple[bytes, bytes, bytes]:
        """The window's answer for the rows whose keys are committed (status 2, with ids): a
        batch sent again is answered without touching the core. Looked up for the first `head`
        rows, and for the rest only if all of those were committed: in a batch of new rows the
        chunks' `reserve_many` judges every row anyway (unknown rows count as status 0)."""
        core = self._core
        with core.lock:
            core.check_open_locked()
            now = self._clock.now_ms()
            status, segs, ents = self._window.get_many(keys[: 16 * head], now)
        if n <= head:
            return status, segs, ents
        if status.count(2) != head:
            rest = n - head
            return status + bytes(rest), segs + bytes(8 * rest), ents + bytes(8 * rest)
        with core.lock:
            more = self._window.get_many(keys[16 * head :], now)
        return status + more[0], segs + more[1], ents + more[2]

    def _chunk(
        self,
        call: BatchCompletion,
        payloads: list[bytes],
        keys: bytes,
        start: int,
        end: int,
        result: WriteManyResult,
    ) -> int:
        """Rows `start..end` (or fewer: a segment's room) into the core; returns where the
        next chunk starts."""
        core = self._core
        nbytes, end = chunk_end(payloads, start, end, core.max_batch_bytes)
        outcomes: list = []
        try:
            with core.lock:
                outcomes = self._admission.admit_all_locked()  # writes queued ahead go first
                core.check_open_locked()
                if core.inflight.full_locked(nbytes, end - start):
                    core.wait_for_room_locked(nbytes, end - start)
                seg = core.segments.writable_locked()
                if seg is None:  # repairing: duplicates are answered, new rows refused
                    self._unavailable_locked(call, keys, start, end, result)
                else:
                    end = core.segments.run_end_locked(seg, payloads, start, end)  # within seg
                    self._admit_locked(call, seg, payloads, keys, start, end, result)
        finally:
            if outcomes:
                resolve(outcomes)
        return end

    def _admit_locked(
        self,
        call: BatchCompletion,
        seg: SegmentHandle,
        payloads: list[bytes],
        keys: bytes,
        start: int,
        end: int,
        result: WriteManyResult,
    ) -> None:
        """Rows `start..end` judged by the window; the new ones become one run of `seg`."""
        now = self._clock.now_ms()
        self._admission.evict_due_locked(now)
        rows = end - start
        first = seg.next_entry_id
        stamps = array("q", (now,)) * rows
        status, segs, ents = self._window.reserve_many(
            keys[16 * start : 16 * end], stamps, seg.segment_id, first
        )
        new = status.count(0)
        mixed = new != rows
        frame, count = encode_frame(
            seg.segment_id, first, now, payloads, start, end, keys, status if mixed else None
        )
        result.segment_ids[start:end] = _column(segs)
        result.entry_ids[start:end] = _column(ents)
        result.duplicate[start:end] = status.translate(_DUPLICATE)
        self._admission.duplicates += rows - new
        if count:
            waiter = RunRows(call, start, count, status if mixed else None)
            call.add(waiter)
            self._core.inflight.enqueue_run_locked(seg, frame, count, waiter, time.monotonic())
        if rows - new - status.count(2):  # after the run: a row may join an entry of it
            self._join_locked(call, start, status, segs, ents)

    def _join_locked(
        self, call: BatchCompletion, start: int, status: bytes, segs: bytes, ents: bytes
    ) -> None:
        """Rows whose key is in flight (status 1) join its entry."""
        for i, code in enumerate(status):
            if code == 1:
                joiner = RowJoiner(call, start + i)
                call.add(joiner)
                self._core.segments.join_locked(i64_at(segs, i), i64_at(ents, i), joiner)

    def _unavailable_locked(
        self, call: BatchCompletion, keys: bytes, start: int, end: int, result: WriteManyResult
    ) -> None:
        """A segment lost its quorum and is being completed: committed keys are answered,
        keys in flight joined, new rows refused (`QuorumUnavailableError`), nothing queued."""
        status, segs, ents = self._window.get_many(
            keys[16 * start : 16 * end], self._clock.now_ms()
        )
        result.segment_ids[start:end] = _column(segs)
        result.entry_ids[start:end] = _column(ents)
        result.duplicate[start:end] = status.translate(_DUPLICATE)
        refused = [start + i for i, code in enumerate(status) if code == 0]
        if refused:
            call.fail(refused, self._core.unavailable_error())
        self._admission.duplicates += end - start - len(refused)
        self._join_locked(call, start, status, segs, ents)
