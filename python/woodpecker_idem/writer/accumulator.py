"""The accumulator (Kafka's `RecordAccumulator`): writes accepted and not yet given ids, made into
entries in runs, and the in-flight limits every entry counts against (backpressure).

One queue of accepted writes, one column per field: payload, properties, future, queueing time,
and a key column (a `KeyPipe`, hashing 64 keys at a time, in Rust) only when the dedup stage keys
writes: a plain writer keeps no key and asks its stage nothing. Queued writes are admitted (given
ids) in runs of one AddEntries batch each, in queueing order: at once when nothing of the current
segment is in flight (a lone write waits for no company), else when the batch in flight is
acknowledged (group commit), when a batch's worth is queued, after `append.linger_ms` (the
ticker), and on flush and close. A run is judged by the dedup stage in one call
(`Dedup.reserve_locked`, each row as of its own queueing time), encoded once (`encode_frame`),
and handed to `InFlight.enqueue_run_locked` with one waiter; duplicates are answered or join the
entry in flight. A batch call (`write_rows`) goes the same way, its rows straight into runs after
the writes queued ahead of it, with one completion per call and no object per row.

Every entry counts against `append.max_inflight_entries` / `max_inflight_bytes` from its
enqueue to its commit (`InFlight`), and queued writes count with it. A producer that finds no
room waits (`InFlight.wait_for_room_locked`) with the lock *released*; other producers queue and
admit meanwhile. The rule that keeps that safe: a producer holds nothing half-queued across the
wait. A write's columns are appended after its wait, in one step under the lock, from the
queue's lists as they are then (an admission replaces them); a batch call's chunk is cut and
judged after its wait. Every method runs with the writer's lock held unless it says otherwise.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .._core import KeyPipe, encode_frame
from ..errors import WoodpeckerError, WriteTimeoutError
from ..types import LogMessageId, WriteManyResult, WriteResult
from .dedup import Dedup
from .lifecycle import HOLD_INTERRUPTS, WriterState
from .results import (
    BatchCompletion,
    FutureRun,
    Outcomes,
    RowJoiner,
    RunRows,
    Waiter,
    finish,
    resolve,
)
from .segments import ROW_OVERHEAD, PendingEntry, chunk_end, span

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ..clock import Clock
    from ..config import Section
    from .segments import OpenSegment, OpenSegments

# Queueing times: C long where it is 64-bit (appending an int to it is cheaper than to 'q')
TIMESTAMP_TYPECODE = "l" if array("l").itemsize == 8 else "q"
# A keyed queue is admitted by its producer once this many writes wait ...
ADMIT_AT = 128
# ... and at least this many of the oldest have their keys hashed already (the rest wait)
ADMIT_MIN = 64
# Upper bounds (seconds) of the ack latency histogram's buckets; +Inf is the last, implied.
# Embedded acks take a fraction of a millisecond, acks through S3 or remote nodes tens of ms.
ACK_LATENCY_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip
# A batch call looks this many of its first rows up before queueing any (see `_lookup`)
LOOKAHEAD_ROWS = 64
# status byte (0 new, 1 pending, 2 committed) -> duplicate flag
_DUPLICATE = bytes.maketrans(b"\x00\x01\x02", b"\x00\x01\x01")
_new = tuple.__new__  # a NamedTuple's own __new__ costs a microsecond on the duplicate path


def i64_at(column: bytes, i: int) -> int:
    """Value `i` of a little-endian int64 column (as the dedup stage answers)."""
    return int.from_bytes(column[8 * i : 8 * i + 8], "little", signed=True)


def _column(raw: bytes) -> array:
    col = array("q")
    col.frombytes(raw)
    return col


class Queued(NamedTuple):
    """Writes taken off the queue to be admitted, oldest first."""

    payloads: list[bytes]
    properties: list[dict | None]
    futures: list[Future]
    timestamps: array  # each write's queueing time (ms), the time it is judged at
    keys: bytes | None  # N*16 bytes, one key per write; None when the stage keys nothing
    since: float  # time.monotonic() when the oldest was queued


class Accumulator:
    """The queue of accepted writes, their admission into entries, and the batch lane."""

    def __init__(
        self,
        *,
        lock: threading.Lock,
        clock: Clock,
        append: Section,
        dedup: Dedup,
        inflight: InFlight,
        segments: OpenSegments,
        state: WriterState,
        metrics: dict[str, float],
        wake: Callable[[], None],
        unavailable: Callable[[], WoodpeckerError],
    ):
        self._lock = lock
        self._clock = clock
        self._dedup = dedup
        self._inflight = inflight
        self._segments = segments
        self._state = state
        self._metrics = metrics
        self._wake = wake  # the ticker admits a lone queued write after linger_ms
        self._unavailable = unavailable  # why new writes are refused while a segment is repaired
        self._batch_entries = append.max_batch_entries
        self._batch_bytes = append.max_batch_bytes
        self._linger_s = append.linger_ms / 1000
        self._admit_rows = (
            min(ADMIT_AT, self._batch_entries) if dedup.keyed else self._batch_entries
        )
        self.duplicates = 0  # writes answered with an existing entry (committed or joined)
        # the queue: one column per field, equally long at every release of the lock
        self.payloads: list[bytes] = []
        self.properties: list[dict | None] = []
        self.futures: list[Future] = []
        self.timestamps = array(TIMESTAMP_TYPECODE)
        self.pipe = KeyPipe() if dedup.keyed else None  # the key column
        self.nbytes = 0  # what the queued writes count against append.max_inflight_bytes
        self.since = 0.0  # time.monotonic() when the oldest was queued

    def __len__(self) -> int:
        return len(self.futures)

    # --- one write ---------------------------------------------------------------------------

    def lookup_locked(self, key: bytes) -> WriteResult | None:
        """The original result if `key` is committed and no write is queued ahead of this one
        (an earlier queued write of the same key must be judged first); then the write needs
        neither the queue nor the nodes. Raises if the writer is closed or fenced."""
        self._state.check_open_locked()
        if self.futures:
            return None
        hit = self._dedup.lookup_locked(key, self._clock.now_ms())
        if hit is None:
            return None
        self.duplicates += 1
        return _new(WriteResult, (_new(LogMessageId, hit), True))

    def queue_locked(
        self,
        payload: bytes,
        props: dict | None,
        future: Future,
        key: bytes | None = None,
        ident: str | bytes | None = None,
    ) -> Outcomes:
        """Queue one write; with a keyed stage its key is `key` if given (computed already), else
        that of the explicit id `ident`, else the payload's. Returns the outcomes to set after
        the lock (writes admitted now that failed, or were answered)."""
        if not self.futures:  # queued writes were checked: a close or fence empties the queue
            self._state.check_open_locked()
        size = len(payload) + ROW_OVERHEAD
        early: Outcomes = []
        try:
            if self._inflight.full_locked(size + self.nbytes, len(self.futures) + 1):
                if self.futures:  # room comes from commits: queued writes must be entries first
                    early = self._admit_locked()
                # The lock is released while this waits; this write holds nothing queued yet,
                # and the queue's lists are read below, after the wait (an admission meanwhile
                # replaced them).
                self._wait_for_room_locked(size, 1)  # raises once closed or fenced
            rows = self._append_locked(payload, props, future, size, key, ident)
        except BaseException:  # closed or fenced, a bad id, or Ctrl-C
            if early:  # accepted writes: their callers wait on them; set once the lock is free
                threading.Thread(target=resolve, args=(early,), daemon=True).start()
            raise
        if rows == 1:
            if self._segments.idle_locked():  # nothing in flight: no company worth waiting for
                return early + self._admit_locked()
            self._wake()  # the ticker admits it after linger_ms unless an ack comes first
        elif rows >= self._admit_rows or self.nbytes >= self._batch_bytes:  # a batch's worth
            pipe = self.pipe
            if pipe is None:
                return early + self._admit_locked()
            ready = pipe.ready_count()  # keys still being hashed stay queued a little longer
            if ready >= ADMIT_MIN or ready == rows:
                return early + self._admit_locked(ready)
        return early

    def _append_locked(
        self,
        payload: bytes,
        props: dict | None,
        future: Future,
        size: int,
        key: bytes | None,
        ident: str | bytes | None,
    ) -> int:
        """Append one write to every column in one step, or to none (a bad id raises from the
        key column, appended last; so can Ctrl-C between two appends): a write is queued once
        its last column has it. Returns how many writes are queued."""
        futures = self.futures
        rows = len(futures)
        pipe = self.pipe
        counted = False
        try:
            if not rows:
                self.since = time.monotonic()
            self.timestamps.append(self._clock.now_ms())
            self.payloads.append(payload)
            self.properties.append(props)
            futures.append(future)
            self.nbytes += size
            counted = True
            if pipe is not None:
                if key is not None:
                    pipe.push_key(key)
                elif ident is None:
                    pipe.push(payload)
                else:
                    pipe.push_id(ident)  # a bad id raises here
        except BaseException:
            if len(pipe if pipe is not None else futures) == rows:  # not queued: undo
                del self.timestamps[rows:], self.payloads[rows:], self.properties[rows:]
                del futures[rows:]
                if counted:
                    self.nbytes -= size
            raise
        return rows + 1

    def _wait_for_room_locked(self, size: int, entries: int, deadline: float | None = None) -> None:
        """Backpressure: block (lock released) until in-flight entries and bytes leave room for
        `entries` more of `size` bytes, or nothing is in flight; raises once closed or fenced,
        or `WriteTimeoutError` past `deadline`."""
        self._metrics["backpressure_waits"] += 1
        self._inflight.wait_for_room_locked(size, entries, self._state, deadline)
        self._state.check_open_locked()

    # --- admission ---------------------------------------------------------------------------

    def admit_due_locked(self, idle: bool) -> tuple[Outcomes, float | None]:
        """Admit every queued write if the current segment is `idle` (nothing in flight) or the
        oldest has waited linger_ms; returns the outcomes to set after the lock and the seconds
        until the queued writes are due (None: nothing queued)."""
        if not self.futures:
            return [], None
        if not idle:
            due = self.since + self._linger_s - time.monotonic()
            if due > 0:
                return [], due
        return self._admit_locked(), None

    def admit_all_locked(self) -> Outcomes:
        """Admit every queued write now (an ack came, a flush, a batch call going after them)."""
        return self._admit_locked() if self.futures else []

    def drop_locked(self) -> list[Future]:
        """Forget every queued write (the writer closed or was fenced); returns their futures."""
        futures = self._take_locked(len(self.futures)).futures
        if self.pipe is not None:
            self.pipe.clear()
        return futures

    def _admit_locked(self, count: int | None = None) -> Outcomes:
        """Give the oldest `count` queued writes (all by default) their ids; returns the outcomes
        to set after the lock."""
        with HOLD_INTERRUPTS:  # taken off the queue and made entries, or neither
            batch = self._take_locked(len(self.futures) if count is None else count)
            try:
                self._state.check_open_locked()
            except WoodpeckerError as exc:  # fenced or closed: nobody will send them
                return [(f, exc) for f in batch.futures]
            return self._runs_locked(batch)

    def _take_locked(self, n: int) -> Queued:
        keys = self.pipe.take(n) if self.pipe is not None else None
        if n == len(self.futures):
            batch = Queued(
                self.payloads, self.properties, self.futures, self.timestamps, keys, self.since
            )
            self.payloads, self.properties, self.futures = [], [], []
            self.timestamps = array(TIMESTAMP_TYPECODE)
            self.nbytes = 0
            return batch
        batch = Queued(
            self.payloads[:n],
            self.properties[:n],
            self.futures[:n],
            self.timestamps[:n],
            keys,
            self.since,
        )
        del self.payloads[:n], self.properties[:n], self.futures[:n], self.timestamps[:n]
        self.nbytes -= sum([len(p) for p in batch.payloads]) + ROW_OVERHEAD * n
        self.since = time.monotonic()
        return batch

    def _runs_locked(self, batch: Queued) -> Outcomes:
        """Queued writes into runs of one AddEntries batch each, within the current segment's
        roll limits: each run judged by the stage in one call, encoded once, enqueued with one
        waiter; duplicates answered or joined. An error before a run is enqueued (a roll refused:
        fenced, metadata unreachable) ends the writes not enqueued yet, with that error."""
        resolved: Outcomes = []
        payloads, stamps, keys, futures = (
            batch.payloads,
            batch.timestamps,
            batch.keys,
            batch.futures,
        )
        n = len(futures)
        start = 0
        while start < n:
            try:
                seg = self._segments.writable_locked()
                if seg is None:  # a repair replaces the segment: new writes are refused
                    self._unavailable_locked(futures[start:], keys, start, resolved)
                    return resolved
                end = self._segments.run_end_locked(seg, payloads, start, n)
                first = seg.next_entry_id
                status = segs = ents = None
                if keys is not None:  # reserves the new keys' ids: the run must be enqueued
                    status, segs, ents = self._dedup.reserve_locked(
                        keys[16 * start : 16 * end], stamps[start:end], seg.segment_id, first
                    )
                frame, count = encode_frame(
                    seg.segment_id,
                    first,
                    stamps,
                    payloads,
                    start,
                    end,
                    keys,
                    status,
                    batch.properties,
                )
            except Exception as exc:  # noqa: BLE001 - set on their futures
                resolved.extend((f, exc) for f in futures[start:])
                return resolved
            run = futures if start == 0 and end == n else futures[start:end]
            if count == end - start:
                new = run
            else:  # some rows were duplicates (status is set)
                new = [run[i] for i, code in enumerate(status or b"") if not code]
            if count:
                waiter: Waiter = new[0] if count == 1 else FutureRun(new)
                self._inflight.enqueue_run_locked(seg, frame, count, waiter, batch.since)
            if count != end - start and status is not None and segs is not None:
                # after the run: a row may join an entry made by an earlier row of it
                self._answer_locked(run, status, segs, ents or b"", resolved)
            start = end
        return resolved

    def _answer_locked(
        self, waiters: Sequence[Waiter], status: bytes, segs: bytes, ents: bytes, out: Outcomes
    ) -> None:
        """Rows the stage found in the log: committed ones answered with the original id, ones
        in flight joined to their entry."""
        for i, code in enumerate(status):
            if code == 1:
                self._segments.join_locked(i64_at(segs, i), i64_at(ents, i), waiters[i])
                self.duplicates += 1
            elif code == 2:
                self.duplicates += 1
                mid = LogMessageId(i64_at(segs, i), i64_at(ents, i))
                out.append((waiters[i], WriteResult(mid, True)))

    def _unavailable_locked(
        self, waiters: Sequence[Waiter], keys: bytes | None, start: int, out: Outcomes
    ) -> None:
        """A segment lost its ack quorum and is being completed: keys found in the log are
        answered or joined, new writes refused (`QuorumUnavailableError`), nothing enqueued."""
        exc = self._unavailable()
        if keys is None:
            out.extend((w, exc) for w in waiters)
            return
        status, segs, ents = self._dedup.answer_locked(keys[16 * start :], self._clock.now_ms())
        out.extend((waiters[i], exc) for i, code in enumerate(status) if not code)
        self._answer_locked(waiters, status, segs, ents, out)

    # --- the batch lane ------------------------------------------------------------------------

    def write_rows(
        self,
        payloads: list[bytes],
        keys: bytes | None,
        wait: float | None,
        pending_text: Callable[[], str],
    ) -> WriteManyResult:
        """A batch call (lock NOT held): `payloads` (bytes within append.max_entry_bytes, checked)
        in order, with their N*16-byte `keys` when the stage keys writes; in runs of one
        AddEntries batch, after the writes queued before the call; waits up to `wait` seconds in
        all (room included) for every row. Rows whose keys are committed are answered without
        touching the queue; a repeat within the call joins the first row's entry."""
        n = len(payloads)
        deadline = None if wait is None else time.monotonic() + wait
        status: bytes | None = None
        if keys is None:
            zeros = bytes(8 * n)
            result = WriteManyResult(array("q", zeros), array("q", zeros), bytearray(n))
        else:
            status, segs, ents = self._lookup(keys, n)
            result = WriteManyResult(
                _column(segs), _column(ents), bytearray(status.translate(_DUPLICATE))
            )
            if status.count(2) == n:  # every key committed: answered from the stage alone
                with self._lock:
                    self.duplicates += n
                return result
        call = BatchCompletion()
        outcomes: Outcomes = []
        start = 0
        try:
            while start < n:
                end = min(n, start + self._batch_entries)
                if status is not None and status.count(2, start, end) == end - start:
                    with self._lock:
                        self.duplicates += end - start
                    start = end
                    continue
                nbytes, end = chunk_end(payloads, start, end, self._batch_bytes)
                with self._lock:
                    self._make_room_locked(nbytes, end - start, deadline, outcomes)
                    start = self._chunk_locked(call, payloads, keys, start, end, result)
        except WoodpeckerError as refused:  # fenced, closed, or no room in time: nothing queued
            rest = (
                range(start, n)
                if status is None
                else [i for i in range(start, n) if status[i] != 2]
            )
            call.fail(rest, refused)
        finally:
            call.handed()
            if outcomes:
                resolve(outcomes)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return finish(call, result, wait, pending_text, left)

    def _lookup(self, keys: bytes, n: int) -> tuple[bytes, bytes, bytes]:
        """The stage's answer for the rows whose keys are committed (status 2, with ids): a
        batch sent again is answered without touching the queue. Asked for the first
        LOOKAHEAD_ROWS rows, and for the rest only if all of those were committed: in a batch
        of new rows each run's `reserve_locked` judges every row anyway (unknown rows count as
        status 0), so looking further ahead would only look every key up twice."""
        head = LOOKAHEAD_ROWS
        with self._lock:
            self._state.check_open_locked()
            now = self._clock.now_ms()
            status, segs, ents = self._dedup.answer_locked(keys[: 16 * head], now)
        if n <= head:
            return status, segs, ents
        if status.count(2) != head:
            rest = n - head
            return status + bytes(rest), segs + bytes(8 * rest), ents + bytes(8 * rest)
        with self._lock:
            more = self._dedup.answer_locked(keys[16 * head :], now)
        return status + more[0], segs + more[1], ents + more[2]

    def _make_room_locked(
        self, nbytes: int, rows: int, deadline: float | None, outcomes: Outcomes
    ) -> None:
        """Before a chunk of a batch call: the writes queued ahead of it become entries, then
        wait for room for the chunk. The lock is released during each wait; the chunk is not cut
        or judged before it returns, and writes queued meanwhile go first (the loop admits them
        again). Raises once closed or fenced, or past `deadline`."""
        while True:
            if self.futures:
                outcomes += self._admit_locked()
            self._state.check_open_locked()
            if not self._inflight.full_locked(nbytes, rows) or not self._inflight.entries:
                return  # room, or nothing in flight (a chunk larger than the limits goes alone)
            self._wait_for_room_locked(nbytes, rows, deadline)

    def _chunk_locked(
        self,
        call: BatchCompletion,
        payloads: list[bytes],
        keys: bytes | None,
        start: int,
        end: int,
        result: WriteManyResult,
    ) -> int:
        """Rows `start..end` (or fewer: the segment's room) as one run of the current segment;
        returns where the next chunk starts."""
        seg = self._segments.writable_locked()
        if seg is None:  # repairing: rows found in the log are answered, new ones refused
            self._rows_unavailable_locked(call, keys, start, end, result)
            return end
        end = self._segments.run_end_locked(seg, payloads, start, end)
        first = seg.next_entry_id
        now = self._clock.now_ms()
        rows = end - start
        status: bytes | None = None
        if keys is None:
            frame, count = encode_frame(seg.segment_id, first, now, payloads, start, end)
            result.segment_ids[start:end] = array("q", (seg.segment_id,)) * count
            result.entry_ids[start:end] = array("q", range(first, first + count))
        else:
            status, segs, ents = self._dedup.reserve_locked(
                keys[16 * start : 16 * end], array("q", (now,)) * rows, seg.segment_id, first
            )
            count = status.count(0)
            mixed = status if count != rows else None
            frame, count = encode_frame(
                seg.segment_id, first, now, payloads, start, end, keys, mixed
            )
            result.segment_ids[start:end] = _column(segs)
            result.entry_ids[start:end] = _column(ents)
            result.duplicate[start:end] = status.translate(_DUPLICATE)
            self.duplicates += rows - count
        if count:
            waiter = RunRows(call, start, count, status if count != rows else None)
            call.add(waiter)
            self._inflight.enqueue_run_locked(seg, frame, count, waiter, time.monotonic())
        if status is not None and rows - count - status.count(2):  # after the run: joins
            self._join_rows_locked(call, start, status, segs, ents)
        return end

    def _join_rows_locked(
        self, call: BatchCompletion, start: int, status: bytes, segs: bytes, ents: bytes
    ) -> None:
        """Rows whose key is in flight (status 1) join its entry."""
        for i, code in enumerate(status):
            if code == 1:
                joiner = RowJoiner(call, start + i)
                call.add(joiner)
                self._segments.join_locked(i64_at(segs, i), i64_at(ents, i), joiner)

    def _rows_unavailable_locked(
        self,
        call: BatchCompletion,
        keys: bytes | None,
        start: int,
        end: int,
        result: WriteManyResult,
    ) -> None:
        exc = self._unavailable()
        if keys is None:
            call.fail(range(start, end), exc)
            return
        status, segs, ents = self._dedup.answer_locked(
            keys[16 * start : 16 * end], self._clock.now_ms()
        )
        result.segment_ids[start:end] = _column(segs)
        result.entry_ids[start:end] = _column(ents)
        result.duplicate[start:end] = status.translate(_DUPLICATE)
        refused = [start + i for i, code in enumerate(status) if code == 0]
        if refused:
            call.fail(refused, exc)
        self.duplicates += end - start - len(refused)
        self._join_rows_locked(call, start, status, segs, ents)


# --- entries in flight ---------------------------------------------------------------------------


class InFlight:
    """The writer's entries from enqueue to commit, and what they count against its limits."""

    def __init__(
        self,
        lock: threading.Lock,
        append: Section,
        send_locked: Callable[[OpenSegment], None],
        dedup: Dedup,
        metrics: dict[str, float],
    ):
        self.space = threading.Condition(lock)
        self._metrics = metrics  # entries_acked, ack_latency_seconds (the sum over entries)
        # entries acked per ACK_LATENCY_BOUNDS bucket (not cumulative; the last is +Inf)
        self.latency_buckets = [0] * (len(ACK_LATENCY_BOUNDS) + 1)
        self.seq = 0  # the newest run's sequence number: flush waits for the runs up to it
        self.entries = 0
        self.nbytes = 0
        self._max_entries = append.max_inflight_entries
        self._max_bytes = append.max_inflight_bytes
        self._batch_entries = append.max_batch_entries
        self._batch_bytes = append.max_batch_bytes
        self._timeout_s = append.timeout_ms / 1000
        self._send_locked = send_locked  # group commit (`Dispatch.send_locked`)
        self._dedup = dedup

    def enqueue_run_locked(
        self, seg: OpenSegment, frame: bytes, count: int, waiter: Waiter, since: float
    ) -> None:
        """The one enqueue path of every write: `count` entries from `seg.next_entry_id` on,
        encoded in one `frame`, pending as one run with one `waiter` (told once for all of them,
        with the first entry's id; a `RunWaiter` when `count` > 1), sent per group commit. The
        caller keeps the run within `OpenSegments.run_end_locked`, so a run is never cut into two
        batches. `since`: when the oldest was queued (time.monotonic())."""
        with HOLD_INTERRUPTS:  # in every list, or in none
            self.seq += 1
            deadline = time.monotonic() + self._timeout_s
            run = PendingEntry(self.seq, seg.segment_id, seg.next_entry_id, frame, waiter, deadline)
            run.count = count
            run.queued = since
            was_empty = not seg.unsent
            seg.pending.append(run)
            seg.unsent.append(run)
            seg.by_entry[run.entry_id] = run
            nbytes = len(frame)
            seg.next_entry_id += count
            seg.unsent_bytes += nbytes
            seg.unsent_entries += count
            seg.size_bytes += nbytes
            self.entries += count
            self.nbytes += nbytes
            if was_empty:
                seg.unsent_since = since
            if (
                not seg.batches
                or seg.unsent_entries >= self._batch_entries
                or seg.unsent_bytes >= self._batch_bytes
            ):
                self._send_locked(seg)

    def full_locked(self, size: int, entries: int = 1) -> bool:
        """Would `size` more bytes in `entries` more entries pass the in-flight limits?"""
        return self.entries + entries > self._max_entries or self.nbytes + size > self._max_bytes

    def wait_for_room_locked(
        self, size: int, entries: int, state: WriterState, deadline: float | None = None
    ) -> None:
        """Block until there is room for `entries` more entries of `size` bytes, nothing is in
        flight (a write larger than the limits still goes, alone), or the writer stopped; raises
        `WriteTimeoutError` once `deadline` (time.monotonic()) passes first. The lock is
        released while it waits: the caller must hold nothing half-made across it."""
        while self.full_locked(size, entries) and self.entries and not state.stopped:
            if deadline is None:
                self.space.wait(0.1)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise WriteTimeoutError(
                    f"no room within the call's timeout: {self.entries} entries and "
                    f"{self.nbytes} bytes in flight (append.max_inflight_entries "
                    f"{self._max_entries}, append.max_inflight_bytes {self._max_bytes}); "
                    "nothing of the rows not handed over was written"
                )
            self.space.wait(min(0.1, left))

    def release_locked(self, entries: int, nbytes: int) -> None:
        """Stop counting entries that left without a commit (dropped with their segment)."""
        self.entries -= entries
        self.nbytes -= nbytes
        self.space.notify_all()

    def commit_locked(self, seg: OpenSegment, committed: list[PendingEntry]) -> Outcomes:
        """`committed` (in entry order) reached aq: tell the dedup stage, free their room;
        returns their outcomes (set after the lock is released)."""
        self._dedup.committed_locked(seg.segment_id, committed[-1].last_entry_id)
        resolved: Outcomes = []
        nbytes = 0
        now = time.monotonic()
        waited = 0.0
        buckets = self.latency_buckets
        for entry in committed:
            nbytes += len(entry.record)
            latency = now - entry.queued
            waited += latency * entry.count
            buckets[bisect_left(ACK_LATENCY_BOUNDS, latency)] += entry.count
            mid = LogMessageId(seg.segment_id, entry.entry_id)
            if entry.future is not None:
                resolved.append((entry.future, WriteResult(mid, False)))
            if entry.joiners:
                resolved.extend((f, WriteResult(mid, True)) for f in entry.joiners)
        acked = span(committed)
        self._metrics["entries_acked"] += acked
        self._metrics["ack_latency_seconds"] += waited
        self.release_locked(acked, nbytes)
        return resolved
