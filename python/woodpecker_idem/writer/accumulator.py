"""The accumulator (Kafka's `RecordAccumulator`): writes accepted and not yet given ids, made into
entries in runs, and the in-flight limits every entry counts against (backpressure).

One queue of accepted writes, one column per field: payload, properties, future, queueing time,
and a key column (a `KeyPipe`, hashing 64 keys at a time, in Rust) only when the dedup stage keys
writes: a plain writer keeps no key and asks its stage nothing. Queued writes are admitted (given
ids) in runs of one AddEntries batch each, in queueing order: at once when nothing of the current
segment is in flight (a lone write waits for no company), else when the batch in flight is
acknowledged (group commit), when a batch's worth is queued, after `append.linger_ms` (the
ticker), and on flush and close. A batch call (`write_rows`) has its rows made into runs after
the writes queued ahead of it, with one completion per call and no object per row. One run
builder serves both lanes (`_run_locked`; a `Lane` says only how its rows wait and are told): a
run is judged by the dedup stage in one call (`Dedup.reserve_locked`, each row as of its own
queueing time, a batch call's rows as of the run's admission), encoded once (`encode_frame`),
and handed to `InFlight.enqueue_run_locked` with one waiter; duplicates are answered or join the
entry in flight.

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
from typing import TYPE_CHECKING

from .._core import KeyPipe, Payloads, chunk_end, encode_frame
from ..errors import ConditionFailedError, WoodpeckerError, WriteTimeoutError
from ..logstore.blocks import CODECS
from ..types import UNCONDITIONAL, ExpectedLast, LogMessageId, WriteManyResult, WriteResult
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
from .segments import ROW_OVERHEAD, PendingEntry, span

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


class Lane:
    """Where the rows of a run come from, as the one run builder (`Accumulator._run_locked`)
    sees them: how the rows wait for their entries and how they are told. Two lanes: the queue's
    writes (`QueuedLane`, a future each) and a batch call's rows (`CallLane`). Rows are numbered
    in the lane (the queue's taken writes, the call's rows)."""

    __slots__ = ()
    # each row's queueing time (ms), judged and encoded with it; None: the run's admission time
    timestamps: array | None = None
    properties: list[dict | None] | None = None  # each row's properties (None: none)
    raises = False  # an error before a run is enqueued propagates (else it ends the rows)
    answers_committed = True  # rows found committed are told their id (else known already)
    records_ids = False  # the lane keeps every row's ids (`numbered`, `judged`)
    conditional = False  # some rows are conditional appends (`expected`)
    chained = False  # each row expects the one before it (a conditional batch call)

    def expected(self, row: int) -> ExpectedLast:
        """What `row` expects the log's last entry to be when its turn comes."""
        return UNCONDITIONAL

    @property
    def since(self) -> float:
        """time.monotonic() the run's entries count as queued from (their ack latency)."""
        return time.monotonic()

    def waiter(self, start: int, end: int, count: int, status: bytes | None) -> Waiter:
        """The one waiter of the run's `count` new rows: rows `start..end` whose status byte is
        0, or all of them when `status` is None."""
        raise NotImplementedError

    def joiner(self, row: int) -> Waiter:
        """What waits for `row`, whose key is in flight, on the entry it joins."""
        raise NotImplementedError

    def committed(self, row: int, mid: LogMessageId) -> None:
        """`row`'s key is committed at `mid`: a duplicate, answered."""

    def numbered(self, start: int, segment_id: int, first: int, count: int) -> None:
        """Rows `start..start+count` became the entries `segment_id:first..` (no dedup stage)."""

    def judged(self, start: int, end: int, status: bytes, segs: bytes, ents: bytes) -> None:
        """The stage's answer for rows `start..end`: new, pending or committed, with ids."""

    def fail(self, rows: Sequence[int], exc: BaseException) -> None:
        """`rows` end with `exc`: refused or failed before they were enqueued."""
        raise NotImplementedError


class QueuedLane(Lane):
    """Writes taken off the queue to be admitted, oldest first, as the run builder's lane: a
    future each, whose outcomes the admission returns to be set after the lock (`out`)."""

    __slots__ = (
        "payloads",
        "properties",
        "futures",
        "timestamps",
        "keys",
        "since",
        "out",
        "conditions",
        "conditional",
    )

    def __init__(
        self,
        payloads: list[bytes],
        properties: list[dict | None],
        futures: list[Future],
        timestamps: array,  # each write's queueing time (ms), the time it is judged at
        keys: bytes | None,  # N*16 bytes, one key per write; None when the stage keys nothing
        since: float,  # time.monotonic() when the oldest was queued
    ):
        self.payloads = payloads
        self.properties = properties
        self.futures = futures
        self.timestamps = timestamps
        self.keys = keys
        self.since = since  # type: ignore[misc]  # a plain value, not the base class property
        self.out: Outcomes = []
        # row -> what its conditional append expects (rows not in it append unconditionally)
        self.conditions: dict[int, ExpectedLast] = {}
        self.conditional = False  # set with `conditions`

    def expected(self, row: int) -> ExpectedLast:
        return self.conditions.get(row, UNCONDITIONAL)

    def waiter(self, start: int, end: int, count: int, status: bytes | None) -> Waiter:
        futures = self.futures
        run = futures if start == 0 and end == len(futures) else futures[start:end]
        if status is not None:  # some rows were duplicates
            run = [run[i] for i, code in enumerate(status) if not code]
        return run[0] if count == 1 else FutureRun(run)

    def joiner(self, row: int) -> Waiter:
        return self.futures[row]

    def committed(self, row: int, mid: LogMessageId) -> None:
        self.out.append((self.futures[row], WriteResult(mid, True)))

    def fail(self, rows: Sequence[int], exc: BaseException) -> None:
        futures = self.futures
        self.out.extend((futures[i], exc) for i in rows)


class CallLane(Lane):
    """A batch call's rows: no object per row; their ids go to the call's columnar `result`
    as they are given, and the call waits once on `call`."""

    __slots__ = ("call", "result", "expected_last", "conditional", "chained")
    raises = True  # `write_rows` fails the rows it has not handed over
    answers_committed = False  # `judged` filled their ids in
    records_ids = True  # into the call's columnar result

    def __init__(self, call: BatchCompletion, result: WriteManyResult, expected_last: ExpectedLast):
        self.call = call
        self.result = result
        self.expected_last = expected_last
        # a conditional call's rows land one after another after `expected_last`
        self.conditional = self.chained = expected_last is not UNCONDITIONAL

    def expected(self, row: int) -> ExpectedLast:
        if not row:
            return self.expected_last
        result = self.result
        return LogMessageId(result.segment_ids[row - 1], result.entry_ids[row - 1])

    def waiter(self, start: int, end: int, count: int, status: bytes | None) -> Waiter:
        waiter = RunRows(self.call, start, count, status)
        self.call.add(waiter)
        return waiter

    def joiner(self, row: int) -> Waiter:
        joiner = RowJoiner(self.call, row)
        self.call.add(joiner)
        return joiner

    def numbered(self, start: int, segment_id: int, first: int, count: int) -> None:
        end = start + count
        self.result.segment_ids[start:end] = array("q", (segment_id,)) * count
        self.result.entry_ids[start:end] = array("q", range(first, first + count))

    def judged(self, start: int, end: int, status: bytes, segs: bytes, ents: bytes) -> None:
        result = self.result
        result.segment_ids[start:end] = _column(segs)
        result.entry_ids[start:end] = _column(ents)
        result.duplicate[start:end] = status.translate(_DUPLICATE)

    def fail(self, rows: Sequence[int], exc: BaseException) -> None:
        self.call.fail(rows, exc)


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
        # append.compression: each run's frame is compressed in the call that encodes it
        self._codec = CODECS[append.compression]
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
        # conditional appends among the queued writes: row number since the writer opened
        # (`taken` + place in the queue) -> what the write expects the log's last entry to be
        self.conditions: dict[int, ExpectedLast] = {}
        self.taken = 0  # writes taken off the queue so far
        # Writes taken off the queue and held at a conditional append whose predecessor is
        # pending in an older segment (`OpenSegments.tail_locked`): the lane and the row it
        # resumes at. Everything queued after them waits too (admission keeps queueing order);
        # each admission (an ack, the tick, a flush) tries them first.
        self.held: tuple[QueuedLane, int] | None = None

    def __len__(self) -> int:
        held = self.held
        return len(self.futures) + (len(held[0].futures) - held[1] if held is not None else 0)

    # --- one write ---------------------------------------------------------------------------

    def lookup_locked(self, key: bytes) -> WriteResult | None:
        """The original result if `key` is committed and no write is queued ahead of this one
        (an earlier queued write of the same key must be judged first); then the write needs
        neither the queue nor the nodes. Raises if the writer is closed or fenced."""
        self._state.check_open_locked()
        if self.futures or self.held is not None:
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
        out: Outcomes,
        key: bytes | None = None,
        ident: str | bytes | None = None,
        expected: ExpectedLast = UNCONDITIONAL,
    ) -> None:
        """Queue one write; with a keyed stage its key is `key` if given (computed already), else
        that of the explicit id `ident`, else the payload's; `expected`: a conditional append's
        expected last entry of the log, checked when the write's turn comes. Adds to `out` the
        outcomes the
        caller sets after releasing the lock (writes admitted now that failed, or were answered),
        also when this raises: writes admitted before a wait that then failed (closed, fenced,
        Ctrl-C) are accepted writes whose callers wait on them."""
        if not self.futures:  # queued writes were checked: a close or fence empties the queue
            self._state.check_open_locked()
        size = len(payload) + ROW_OVERHEAD
        if self._inflight.full_locked(size + self.nbytes, len(self.futures) + 1):
            if self.futures:  # room comes from commits: queued writes must be entries first
                out += self._admit_locked()
            # The lock is released while this waits; this write holds nothing queued yet, and
            # the queue's lists are read below, after the wait (an admission meanwhile replaced
            # them).
            self._wait_for_room_locked(size, 1)  # raises once closed or fenced
        rows = self._append_locked(payload, props, future, size, key, ident)
        if expected is not UNCONDITIONAL:
            self.conditions[self.taken + rows - 1] = expected
        if rows == 1:
            if self._segments.idle_locked():  # nothing in flight: no company worth waiting for
                out += self._admit_locked()
                return
            self._wake()  # the ticker admits it after linger_ms unless an ack comes first
        elif rows >= self._admit_rows or self.nbytes >= self._batch_bytes:  # a batch's worth
            pipe = self.pipe
            if pipe is None:
                out += self._admit_locked()
                return
            ready = pipe.ready_count()  # keys still being hashed stay queued a little longer
            if ready >= ADMIT_MIN or ready == rows:
                out += self._admit_locked(ready)

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
            return (self._admit_locked(), None) if self.held is not None else ([], None)
        if not idle and self.held is None:
            due = self.since + self._linger_s - time.monotonic()
            if due > 0:
                return [], due
        return self._admit_locked(), None

    def admit_all_locked(self) -> Outcomes:
        """Admit every queued write now (an ack came, a flush, a batch call going after them)."""
        return self._admit_locked() if self.futures or self.held is not None else []

    def drop_locked(self) -> list[Future]:
        """Forget every queued write (the writer closed or was fenced); returns their futures."""
        held, self.held = self.held, None
        futures = held[0].futures[held[1] :] if held is not None else []
        futures += self._take_locked(len(self.futures)).futures
        if self.pipe is not None:
            self.pipe.clear()
        return futures

    def _admit_locked(self, count: int | None = None) -> Outcomes:
        """Give the oldest `count` queued writes (all by default) their ids; returns the outcomes
        to set after the lock."""
        with HOLD_INTERRUPTS:  # taken off the queue and made entries, or neither
            out: Outcomes = []
            held, self.held = self.held, None
            if held is not None:  # held writes go first: they were queued before the rest
                try:
                    self._state.check_open_locked()
                except WoodpeckerError as exc:
                    out = [(f, exc) for f in held[0].futures[held[1] :]]
                else:
                    out = self._runs_locked(*held)
                    if self.held is not None or not self.futures:
                        return out
            batch = self._take_locked(len(self.futures) if count is None else count)
            try:
                self._state.check_open_locked()
            except WoodpeckerError as exc:  # fenced or closed: nobody will send them
                return out + [(f, exc) for f in batch.futures]
            return out + self._runs_locked(batch)

    def _take_locked(self, n: int) -> QueuedLane:
        keys = self.pipe.take(n) if self.pipe is not None else None
        taken = self.taken
        self.taken = taken + n
        if n == len(self.futures):
            batch = QueuedLane(
                self.payloads, self.properties, self.futures, self.timestamps, keys, self.since
            )
            self.payloads, self.properties, self.futures = [], [], []
            self.timestamps = array(TIMESTAMP_TYPECODE)
            self.nbytes = 0
            if self.conditions:
                batch.conditions = {row - taken: e for row, e in self.conditions.items()}
                batch.conditional = True
                self.conditions = {}
            return batch
        batch = QueuedLane(
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
        if self.conditions:
            moved = [row for row in self.conditions if row < taken + n]
            if moved:
                batch.conditions = {row - taken: self.conditions.pop(row) for row in moved}
                batch.conditional = True
        return batch

    def _runs_locked(self, batch: QueuedLane, start: int = 0) -> Outcomes:
        """Queued writes from `start` on into runs (`_run_locked`), oldest first; returns the
        outcomes to set after the lock. A conditional append that cannot be judged yet holds
        the rest (`held`)."""
        payloads, keys = batch.payloads, batch.keys
        n = len(batch.futures)
        out_before = len(batch.out)
        while start < n:
            nxt = self._run_locked(batch, payloads, keys, start, n)
            if nxt == start:
                self.held = (batch, start)
                break
            start = nxt
        out = batch.out[out_before:]  # a held lane is run again: its outcomes are set once
        return out

    def _run_locked(
        self,
        lane: Lane,
        payloads: list[bytes] | Payloads,
        keys: bytes | None,
        start: int,
        limit: int,
    ) -> int:
        """The one run builder of both lanes: rows `start..limit` of `lane`, or the first of
        them (what fits one AddEntries batch within the current segment's roll limits), as one
        run. Judged by the stage in one call (each row as of its queueing time, or the run's
        admission time: `lane.timestamps`), encoded once, enqueued with one waiter for its new
        rows; duplicates answered, and rows whose key is in flight joined to its entry *after*
        the run is enqueued (a row may repeat a key an earlier row of the run is writing).
        Returns where the lane's next run starts. While a segment is repaired (no writable
        segment) rows found in the log are answered or joined and the others refused, up to
        `limit`. An error before the run is enqueued (a roll refused: fenced, metadata
        unreachable) ends the rows `start..limit` with that error, or propagates to the batch
        call (`lane.raises`), which fails what it had not handed over. Runs with interrupts held
        (`HOLD_INTERRUPTS`: ids reserved are enqueued and answered, or the rows end failed): the
        queue's admission holds them across its runs, a batch call around each run."""
        try:
            seg = self._segments.writable_locked()
            if seg is None:  # a repair replaces the segment: new writes are refused
                self._unavailable_locked(lane, keys, start, limit)
                return limit
            end = self._segments.run_end_locked(seg, payloads, start, limit)
            if lane.conditional:
                try:
                    end = self._condition_locked(lane, seg, keys, start, end)
                except ConditionFailedError as exc:
                    if lane.raises:
                        raise
                    lane.fail((start,), exc)
                    return start + 1
                if end == start:
                    return start  # judged once the older segment settles
            segment_id = seg.segment_id
            first = seg.next_entry_id
            rows = end - start
            stamps = lane.timestamps
            # each row's queueing time, or the admission time of a batch call's rows
            times: int | array = self._clock.now_ms() if stamps is None else stamps
            status: bytes | None = None
            segs = ents = b""
            if keys is None:
                frame, count = encode_frame(
                    segment_id,
                    first,
                    times,
                    payloads,
                    start,
                    end,
                    None,
                    None,
                    lane.properties,
                    self._codec,
                )
            else:  # one native call: the run's keys judged (new ones reserved) and its frame
                status, segs, ents, frame, count = self._dedup.reserve_locked(
                    keys,
                    start,
                    end,
                    times,
                    segment_id,
                    first,
                    payloads,
                    lane.properties,
                    self._codec,
                )
        except Exception as exc:  # noqa: BLE001 - the lane's rows end with it
            if lane.raises:
                raise
            lane.fail(range(start, limit), exc)
            return limit
        if status is not None:
            self.duplicates += rows - count
            if lane.records_ids:
                lane.judged(start, end, status, segs, ents)
        elif lane.records_ids:
            lane.numbered(start, segment_id, first, count)
        if count:
            waiter = lane.waiter(start, end, count, status if count != rows else None)
            self._inflight.enqueue_run_locked(seg, frame, count, waiter, lane.since)
        if status is not None and count != rows and (lane.answers_committed or 1 in status):
            # after the run: a row may join an entry made by an earlier row of it
            self._answer_locked(lane, start, status, segs, ents)
        return end

    def _condition_locked(
        self, lane: Lane, seg: OpenSegment, keys: bytes | None, start: int, end: int
    ) -> int:
        """Where a run of a `lane` with conditional appends ends: before its next row to judge
        (a conditional append is always the first new row of its run, so the log's last entry
        is known when its turn comes). Row `start`, if it is one, is judged here: it goes on
        (its predecessor is what it expects), raises `ConditionFailedError` (it is not), or
        returns `start`: its predecessor is pending in an older segment, whose completion may
        still drop it, so it waits until that segment settles (`OpenSegments.tail_locked`).
        Rows the stage finds in the log are answered as duplicates first, unjudged."""
        status = None
        if keys is not None:  # as of the newest queueing time: never a duplicate too many
            stamps = lane.timestamps
            now = max(stamps[start:end]) if stamps is not None else self._clock.now_ms()
            status = self._dedup.answer_locked(keys[16 * start : 16 * end], now)[0]
        nxt = _next_to_judge(lane, status, start, start, end)
        if nxt != start:
            return nxt
        tail, settled = self._segments.tail_locked(seg)
        if not settled:
            return start
        expected = lane.expected(start)
        if tail != expected:
            where = "no entry" if tail is None else f"entry {tail}"
            raise ConditionFailedError(
                f"conditional append to log {seg.meta.log_id}: expected the log's last entry to "
                f"be {'none' if expected is None else expected}, it is {where}; not written",
                expected,
                tail,
            )
        return _next_to_judge(lane, status, start, start + 1, end)

    def _answer_locked(
        self, lane: Lane, start: int, status: bytes, segs: bytes, ents: bytes
    ) -> None:
        """Rows from `start` on that the stage found in the log: ones in flight joined to their
        entry, committed ones answered with the original id (a lane that has their ids already,
        a batch call's result, needs nothing more). Counted by the caller."""
        answers = lane.answers_committed
        for i, code in enumerate(status):
            if code == 1:
                self._segments.join_locked(i64_at(segs, i), i64_at(ents, i), lane.joiner(start + i))
            elif code == 2 and answers:
                lane.committed(start + i, LogMessageId(i64_at(segs, i), i64_at(ents, i)))

    def _unavailable_locked(self, lane: Lane, keys: bytes | None, start: int, end: int) -> None:
        """A segment lost its ack quorum and is being completed: of rows `start..end`, keys found
        in the log are answered or joined, new writes refused (`QuorumUnavailableError`),
        nothing enqueued."""
        exc = self._unavailable()
        if keys is None:
            lane.fail(range(start, end), exc)
            return
        status, segs, ents = self._dedup.answer_locked(
            keys[16 * start : 16 * end], self._clock.now_ms()
        )
        lane.judged(start, end, status, segs, ents)
        refused = [start + i for i, code in enumerate(status) if not code]
        if refused:
            lane.fail(refused, exc)
        self.duplicates += end - start - len(refused)
        self._answer_locked(lane, start, status, segs, ents)

    # --- the batch lane ------------------------------------------------------------------------

    def write_rows(
        self,
        payloads: Payloads,
        keys: bytes | None,
        wait: float | None,
        pending_text: Callable[[], str],
        expected: ExpectedLast = UNCONDITIONAL,
    ) -> WriteManyResult:
        """A batch call (lock NOT held): `payloads` (within append.max_entry_bytes, checked) in
        order, with their N*16-byte `keys` when the stage keys writes; in runs of one
        AddEntries batch, after the writes queued before the call; waits up to `wait` seconds in
        all (room included) for every row. Rows whose keys are committed are answered without
        touching the queue; a repeat within the call joins the first row's entry. A conditional
        call (`expected`) appends each new row only right after the row before it (the first
        after `expected`); the first that is not fails with the rest of the call."""
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
        lane = CallLane(call, result, expected)
        outcomes: Outcomes = []
        start = 0
        try:
            while start < n:
                end = min(n, start + self._batch_entries)
                if (
                    status is not None
                    and status.count(2, start, end) == end - start
                    and not lane.conditional  # its rows' ids are the next rows' conditions
                ):
                    with self._lock:
                        self.duplicates += end - start
                    start = end
                    continue
                nbytes, end = chunk_end(payloads, start, end, self._batch_bytes, ROW_OVERHEAD)
                with self._lock:
                    self._make_room_locked(nbytes, end - start, deadline, outcomes)
                    with HOLD_INTERRUPTS:  # not across the wait for room: Ctrl-C ends that
                        nxt = self._run_locked(lane, payloads, keys, start, end)
                    if nxt == start:  # a conditional row waits for an older segment to settle
                        self._wait_locked(deadline)
                    start = nxt
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
            if self.futures or self.held is not None:
                outcomes += self._admit_locked()
            self._state.check_open_locked()
            if self.held is not None:  # writes queued before the call go first
                self._wait_locked(deadline)
                continue
            if not self._inflight.full_locked(nbytes, rows) or not self._inflight.entries:
                return  # room, or nothing in flight (a chunk larger than the limits goes alone)
            self._wait_for_room_locked(nbytes, rows, deadline)

    def _wait_locked(self, deadline: float | None) -> None:
        """Wait a little (lock released) for an older segment to settle: its acks and its
        completion notify `space`; raises once closed or fenced, or past `deadline`. The caller
        holds nothing half-made across it (rows are judged again after it)."""
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise WriteTimeoutError(
                "a conditional append waited past the call's timeout for the log's last entry "
                "to settle (it was pending in a segment being completed); nothing of the rows "
                "not handed over was written"
            )
        self._inflight.space.wait(0.05 if left is None else min(left, 0.05))
        self._state.check_open_locked()


def _next_to_judge(lane: Lane, status: bytes | None, start: int, row: int, end: int) -> int:
    """The first row from `row` on (of the run from `start`, up to `end`) whose conditional
    append must be judged: a new row (the stage's `status` 0, or no stage) that expects an
    entry of its own, or, in a chained lane, the run's first new row and a new row after one
    the log holds already (a new row after a new row of the run follows it by construction)."""
    chained = lane.chained
    while row < end:
        new = status is None or not status[row - start]
        if new:
            if chained:
                if row == start or (status is not None and status[row - start - 1]):
                    return row
            elif lane.expected(row) is not UNCONDITIONAL:
                return row
        row += 1
    return end


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
        published: Callable[[int, int], None],
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
        self._published = published  # (segment, LAC): readers of the client wake (`Tails`)

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
        last = committed[-1].last_entry_id
        self._dedup.committed_locked(seg.segment_id, last)
        self._published(seg.segment_id, last)
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
