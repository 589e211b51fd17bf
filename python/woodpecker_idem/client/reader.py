"""LogReader: reads committed entries in order, from completed segments and the open one's tail.

A reader opened with a name (`LogHandle.open_reader(name=...)`) is durable: its position is
committed to the metadata store (`commit`), and the next open of the name resumes there. Each open
bumps the name's epoch in one metadata transaction, so only the newest holder of a name can commit
(`ReaderFencedError` for the others), as a writer's take-over fences the earlier writer.

A reader behind the log's truncation point (retention or `truncate` dropped what it was about to
read) raises `EntryTruncatedError` naming the first entry kept, on every read until it is moved
on (`seek_to_earliest`, `seek`): never a retriable error, which a consumer would retry for ever.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING

from .._core import decode_messages
from ..args import message_id_arg, timeout_arg
from ..ensemble.replicas import ReplicaFault, read_checked
from ..errors import (
    CorruptEntryError,
    EntryTruncatedError,
    InvalidArgumentError,
    InvalidTypeError,
    NodeUnavailableError,
)
from ..meta.base import ReaderMeta, SegmentMeta
from ..types import LogMessage, LogMessageId, SegmentState

if TYPE_CHECKING:
    from ..logstore.transport import LogStoreTransport
    from .log import LogHandle

READ_BATCH = 500
# Entries read are checked at once but become LogMessages this many at a time: a whole read's
# worth would outlive several passes of the cycle collector and reach its oldest generation,
# whose full passes then cost a read-back up to a fifth of its time.
DECODE_BATCH = 64
POLL_MIN_S = 0.005
POLL_MAX_S = 0.2
# Background commits (`commit_async`) this far apart at least: each is an fsync'd metadata
# transaction (3-6 ms and ~0.2 ms of CPU here); one per 1,000 entries read cost a fast reader
# about a fifth of its CPU, one per 20 ms a few percent. A kill loses at most this much more
# progress (read again, never skipped).
COMMIT_LINGER_S = 0.02


def visible_last(transport: LogStoreTransport, seg: SegmentMeta) -> int:
    """The last entry of `seg` a reader may see (-1: none): lastEntryId once completed, else the
    tail the replicas confirm. The one rule for every reader of the log (LogReader, the admin
    CLI, the Spark source)."""
    if seg.state in (SegmentState.COMPLETED, SegmentState.SEALED):
        return seg.last_entry_id
    if seg.state is SegmentState.TRUNCATED:
        return -1
    best = -1
    for node in seg.nodes:
        try:
            held, lac = transport.last_add_confirmed(node, seg.log_id, seg.segment_id)
        except (NodeUnavailableError, CorruptEntryError):  # another replica may answer
            continue
        # With aq == 1 every stored entry is committed; otherwise trust the piggybacked LAC.
        best = max(best, held if seg.aq == 1 else lac)
    return best


def entries_from(
    transport: LogStoreTransport, segments: list[SegmentMeta], pos: LogMessageId
) -> int:
    """How many entries the log holds from `pos` on (a reader's lag): dropped segments count
    nothing, the open one counts what its replicas confirm."""
    n = 0
    for seg in segments:
        if seg.segment_id < pos.segment_id or seg.state is SegmentState.TRUNCATED:
            continue
        first = pos.entry_id if seg.segment_id == pos.segment_id else 0
        n += max(0, visible_last(transport, seg) - first + 1)
    return n


def last_entry(transport: LogStoreTransport, segments: list[SegmentMeta]) -> LogMessageId | None:
    """The id of the log's last entry a reader may see (None: the log holds none)."""
    for seg in reversed(segments):
        if seg.state is SegmentState.TRUNCATED:
            return None  # everything before it was truncated too
        last = visible_last(transport, seg)
        if last >= 0:
            return LogMessageId(seg.segment_id, last)
    return None


class _Committer:
    """The background commits of one named reader (`LogReader.commit_async`): one metadata
    transaction at a time, in order; the newest position asked for while one is being stored
    waits, replacing (and completing with) any older one still waiting. Background commits are
    `COMMIT_LINGER_S` apart at least, so a consumer committing every few entries makes a
    transaction every few milliseconds, not one per call (a synchronous `commit` does not wait)."""

    def __init__(self, store: Callable[[LogMessageId], None], thread_name: str):
        self._store = store
        self._cond = threading.Condition()
        self._waiting: tuple[LogMessageId, list[Future[LogMessageId]]] | None = None
        self._urgent = False
        self._closed = False
        self._last = 0.0  # monotonic time the last store ended
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def submit(self, at: LogMessageId, urgent: bool = False) -> Future[LogMessageId]:
        fut: Future[LogMessageId] = Future()
        with self._cond:
            if self._closed:
                raise InvalidArgumentError("the reader is closed: it commits nothing more")
            futures = [] if self._waiting is None else self._waiting[1]
            self._waiting = (at, [*futures, fut])
            self._urgent = self._urgent or urgent
            self._cond.notify_all()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._waiting is None:
                        if self._closed:
                            return  # closed, nothing left to store
                        self._cond.wait()
                        continue
                    left = self._last + COMMIT_LINGER_S - time.monotonic()
                    if self._urgent or self._closed or left <= 0:
                        break
                    self._cond.wait(left)  # newer positions replace this one meanwhile
                at, futures = self._waiting
                self._waiting = None
                self._urgent = False
            try:
                self._store(at)
            except BaseException as exc:  # the futures carry it (a fence, a closed client)
                for fut in futures:
                    fut.set_exception(exc)
            else:
                for fut in futures:
                    fut.set_result(at)
            self._last = time.monotonic()

    def close(self, timeout: float = 30.0) -> None:
        """Store what was asked for (at once), then end the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


def reader_owner() -> str:
    """Who holds a named reader, as the metadata store records it: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LogReader:
    """Iterate a log from a position; `read_next(timeout)` blocks for new entries (tail mode).

    A replica that is down, lagging or corrupt is skipped for another one; corrupt ones are
    counted in `corrupt_replica_reads` (the latest in `last_replica_fault`) and logged.

    `start` is 'earliest', 'latest', a `LogMessageId` or its text ("3:120"); `start_time_ms`
    instead starts at the first entry whose timestamp is at or after it. With `name` the reader
    is durable (see the module docstring): a name seen before resumes at its committed position
    and `start` is ignored. A reader is a context manager (closing does not commit).
    """

    def __init__(
        self,
        handle: LogHandle,
        start: str | LogMessageId = "earliest",
        *,
        name: str | None = None,
        start_time_ms: int | None = None,
    ):
        self._handle = handle
        self._meta = handle.client.meta
        client = handle.client
        self._transport = client.ensemble.calls_through(client.transport)  # as it is now
        self._tails = client.ensemble.tails  # a writer of this client wakes this reader
        self.log_id = handle.log_id
        self._buffer: deque[LogMessage] = deque()
        self._raw: list[bytes] = []  # read and checked, not yet decoded: entries _raw_at, ...
        self._raw_at = LogMessageId(0, 0)
        self._segments: list[SegmentMeta] = []
        self.corrupt_replica_reads = 0
        self.last_replica_fault: ReplicaFault | None = None
        self.name = name
        self._committer: _Committer | None = None  # started by the first commit_async
        self._epoch = 0
        self._committed: LogMessageId | None = None
        if start_time_ms is not None:
            if isinstance(start_time_ms, bool) or not isinstance(start_time_ms, int):
                raise InvalidTypeError(
                    f"start_time_ms must be an int (milliseconds since the epoch), not "
                    f"{type(start_time_ms).__name__} {start_time_ms!r}"
                )
            if start != "earliest":
                raise InvalidArgumentError(
                    f"give start ({start!r}) or start_time_ms ({start_time_ms}), not both"
                )
        if name is None:
            self._pos = self._initial(start, start_time_ms)
            return
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"reader name must be a non-empty str, not {name!r}")
        known = self._meta.get_reader(self.log_id, name)
        # a new name starts at `start`; a known one resumes (take_reader keeps its position)
        first = known.position if known is not None else self._initial(start, start_time_ms)
        now = handle.client.clock.now_ms()
        rec: ReaderMeta = self._meta.take_reader(self.log_id, name, reader_owner(), first, now)
        self._epoch = rec.epoch
        self._committed = rec.position
        self._pos = rec.position

    def _initial(self, start: str | LogMessageId, start_time_ms: int | None) -> LogMessageId:
        if start_time_ms is not None:
            return self._time_position(start_time_ms)
        return self._start_position(start)

    def _start_position(self, start: str | LogMessageId) -> LogMessageId:
        if isinstance(start, str):
            if start not in ("earliest", "latest"):
                if ":" in start:
                    start = LogMessageId.parse(start)
                    return self._start_position(start)
                raise InvalidArgumentError(
                    f"start must be 'earliest', 'latest', a LogMessageId or its text "
                    f"('3:120'), not {start!r}"
                )
        elif isinstance(start, tuple):
            start = message_id_arg(start, "start")
        else:
            raise InvalidTypeError(
                f"start must be 'earliest', 'latest' or a LogMessageId, not "
                f"{type(start).__name__} {start!r}"
            )
        log_meta = self._meta.get_log_by_id(self.log_id)
        floor = log_meta.truncated_to or LogMessageId(0, 0)
        if start == "earliest":
            return floor
        if start == "latest":
            segments = self._meta.list_segments(self.log_id)
            if not segments:
                return floor
            last = segments[-1]
            return LogMessageId(last.segment_id, self._visible_last(last) + 1)
        assert isinstance(start, LogMessageId)  # a named start returned above
        if start < floor:
            raise EntryTruncatedError(
                f"log {self.log_id} is truncated to {floor}; position {start} is gone",
                first_kept=floor,
            )
        return start

    def _time_position(self, t: int) -> LogMessageId:
        """The first entry whose timestamp is >= `t` (the end of the log if none is yet), like
        Kafka's offsetsForTimes. A completed segment completed before `t` holds only older
        entries (its writer stamped its entries before completing it) and is skipped unread;
        the rest are scanned in log order."""
        floor = self._meta.get_log_by_id(self.log_id).truncated_to or LogMessageId(0, 0)
        for seg in self._meta.list_segments(self.log_id):
            if seg.state is SegmentState.TRUNCATED or seg.segment_id < floor.segment_id:
                continue
            done = seg.state in (SegmentState.COMPLETED, SegmentState.SEALED)
            if done and 0 < seg.completed_ms < t:
                continue
            scan = LogReader(self._handle, max(floor, LogMessageId(seg.segment_id, 0)))
            for msg in scan:
                if msg.timestamp_ms >= t:
                    return msg.message_id
            return scan.position  # nothing that new yet: start at the end
        return self._start_position("latest")

    @property
    def position(self) -> LogMessageId:
        """The id of the next entry this reader returns."""
        if self._buffer:
            return self._buffer[0].message_id
        return self._raw_at if self._raw else self._pos

    @property
    def committed(self) -> LogMessageId | None:
        """A named reader's committed position (where its name resumes); None when unnamed."""
        return self._committed

    def commit(self, message_id: LogMessageId | str | None = None) -> LogMessageId:
        """Commit a named reader's position: the next open of its name resumes after the last
        entry this reader returned (or, given `message_id`, after that entry: it is done).
        Returns the position committed, once the metadata store holds it (after any
        `commit_async` still on its way). `ReaderFencedError` (not retriable) if the name was
        opened again since this reader opened it, or deleted; an unnamed reader has nothing to
        commit (`InvalidArgumentError`)."""
        at = self._commit_position(message_id)
        if self._committer is not None:  # in order behind the background commits
            return self._committer.submit(at, urgent=True).result()
        self._store_commit(at)
        return at

    def commit_async(self, message_id: LogMessageId | str | None = None) -> Future[LogMessageId]:
        """`commit` in the background (like Kafka's commitAsync): returns at once a future of the
        position committed. One commit is stored at a time, in order; while one is being stored
        the newest position asked for waits, and replaces any older one still waiting (whose
        futures complete with it: a later position covers an earlier one); background commits
        are `COMMIT_LINGER_S` (20 ms) apart at least. The future fails
        with `ReaderFencedError` as `commit` would. A consumer that commits every N entries this
        way reads at nearly the speed of an unnamed reader (a commit is a metadata transaction,
        fsync'd). The first call starts the reader's commit thread; `close()` (or leaving its
        `with` block) stores the commits asked for and ends the thread."""
        at = self._commit_position(message_id)
        if self._committer is None:
            self._committer = _Committer(self._store_commit, f"wp-reader-{self.name}")
        return self._committer.submit(at)

    def _commit_position(self, message_id: LogMessageId | str | None) -> LogMessageId:
        if self.name is None:
            raise InvalidArgumentError(
                "commit needs a named reader: open_reader(name=...) keeps its position in the "
                "metadata store; an unnamed reader's position is `reader.position`"
            )
        self._handle.client.check_open()
        if message_id is None:
            return self.position
        if isinstance(message_id, str):
            message_id = LogMessageId.parse(message_id)
        done = message_id_arg(message_id, "message_id")
        return LogMessageId(done.segment_id, done.entry_id + 1)

    def _store_commit(self, at: LogMessageId) -> None:
        assert self.name is not None  # _commit_position checked it
        now = self._handle.client.clock.now_ms()
        self._meta.commit_reader(self.log_id, self.name, self._epoch, at, now)
        self._committed = at

    def seek(self, message_id: LogMessageId | str) -> None:
        """Move the reader: the next entry it returns is `message_id` (`EntryTruncatedError` if
        that is before the truncation point). Nothing is committed."""
        pos = self._start_position(message_id)
        self._reset(pos)

    def seek_to_earliest(self) -> LogMessageId:
        """Move the reader to the first entry still kept (after an `EntryTruncatedError`, to go
        on past what was dropped); returns that position. Nothing is committed."""
        pos = self._start_position("earliest")
        self._reset(pos)
        return pos

    def _reset(self, pos: LogMessageId) -> None:
        self._buffer.clear()
        self._raw.clear()
        self._segments = []
        self._pos = pos

    def _check_truncated(self) -> None:
        """`EntryTruncatedError` if the position is before the log's truncation point: what
        this reader was to read next has been dropped (retention, `truncate`)."""
        floor = self._meta.get_log_by_id(self.log_id).truncated_to
        if floor is not None and self._pos < floor:
            who = f"reader {self.name!r}" if self.name is not None else "reader"
            raise EntryTruncatedError(
                f"log {self._handle.name!r} (id {self.log_id}): {who} is at {self._pos}, but the "
                f"log is truncated to {floor}: the entries from {self._pos} to {floor} are gone. "
                f"The first entry kept is {floor}; reader.seek_to_earliest() goes on from there",
                first_kept=floor,
            )

    def read_next(self, timeout: float | None = 0.0) -> LogMessage | None:
        """The next entry; waits up to `timeout` seconds (None: forever) for one to be written."""
        timeout = timeout_arg(timeout)
        self._handle.client.check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = POLL_MIN_S
        tails, logs = self._tails, (self.log_id,)
        while not self._buffer:
            seen = tails.version(logs)  # before looking: a commit after it ends the wait
            if self._decode() or self._fill():
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._handle.client.check_open()  # closed while we waited
            if tails.wait(logs, seen, delay if left is None else min(delay, left)):
                delay = POLL_MIN_S  # a writer of this client moved the log: look at once
            else:  # nothing from this client's writers: poll the nodes, backing off
                delay = min(delay * 2, POLL_MAX_S)
        return self._buffer.popleft()

    def __iter__(self) -> Iterator[LogMessage]:
        """Every entry currently in the log from the position on (does not wait for more)."""
        buffer = self._buffer
        while True:
            while buffer:
                yield buffer.popleft()
            if self._decode():
                continue
            self._handle.client.check_open()
            if not self._fill():
                return

    def close(self) -> None:
        """Drop what is buffered. A named reader's position is not committed by closing; the
        commits already asked for (`commit_async`) are stored first."""
        self._buffer.clear()
        self._raw.clear()
        if self._committer is not None:
            self._committer.close()
            self._committer = None

    def __enter__(self) -> LogReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _segment(self, segment_id: int, refresh: bool) -> SegmentMeta | None:
        """The first segment with id >= segment_id."""
        if refresh or not self._segments or self._segments[-1].segment_id < segment_id:
            self._segments = self._meta.list_segments(self.log_id)
        for seg in self._segments:
            if seg.segment_id >= segment_id:
                return seg
        return None

    def _visible_last(self, seg: SegmentMeta, need: int | None = None) -> int:
        """`visible_last`, or further: up to the LAC a writer of this client published for an
        open segment (committed: on an ack quorum, readable from a replica). With `need` (the
        entry the reader wants next), a published LAC at or past it spares asking the nodes."""
        if seg.state is not SegmentState.ACTIVE:
            return visible_last(self._transport, seg)
        published = self._tails.lac(self.log_id, seg.segment_id)
        if need is not None and published >= need:
            return published
        return max(published, visible_last(self._transport, seg))

    def _fill(self) -> bool:
        """Buffer the next entries; False when nothing new is readable now."""
        for refresh in (False, True):
            seg = self._segment(self._pos.segment_id, refresh)
            if seg is None:
                continue
            if seg.segment_id != self._pos.segment_id:
                # the position's segment is not in the metadata: dropped by a truncation?
                self._check_truncated()
                self._pos = LogMessageId(seg.segment_id, 0)
            if seg.state is SegmentState.TRUNCATED:
                self._check_truncated()
                self._pos = LogMessageId(seg.segment_id + 1, 0)
                return True
            last = self._visible_last(seg, self._pos.entry_id)
            if self._pos.entry_id <= last:
                try:
                    self._read(seg, last)
                except NodeUnavailableError:
                    # no replica holds it: dropped by a truncation since the segment list
                    # was read? Then that is the truth, not a retriable outage.
                    self._check_truncated()
                    raise
                return True
            if seg.state is not SegmentState.ACTIVE:
                self._pos = LogMessageId(seg.segment_id + 1, 0)
                return True
        return False

    def _read(self, seg: SegmentMeta, last: int) -> None:
        want = min(READ_BATCH, last - self._pos.entry_id + 1)
        first = self._pos.entry_id
        self._raw = read_checked(self._transport, seg, first, want, self._on_corrupt)
        self._raw_at = self._pos
        self._pos = LogMessageId(seg.segment_id, first + len(self._raw))
        self._decode()

    def _decode(self) -> bool:
        """Move the next few checked entries into the buffer as LogMessages; False if none."""
        raw = self._raw
        if not raw:
            return False
        at = self._raw_at
        n = min(len(raw), DECODE_BATCH)
        self._buffer.extend(
            decode_messages(raw[:n], at.segment_id, at.entry_id, LogMessage, LogMessageId)
        )
        del raw[:n]
        self._raw_at = LogMessageId(at.segment_id, at.entry_id + n)
        return True

    def _on_corrupt(self, fault: ReplicaFault) -> None:
        self.corrupt_replica_reads += 1
        self.last_replica_fault = fault
