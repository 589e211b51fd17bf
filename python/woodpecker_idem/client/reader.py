"""LogReader: reads committed entries in order, from completed segments and the open one's tail."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
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
from ..meta.base import SegmentMeta
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


class LogReader:
    """Iterate a log from a position; `read_next(timeout)` blocks for new entries (tail mode).

    A replica that is down, lagging or corrupt is skipped for another one; corrupt ones are
    counted in `corrupt_replica_reads` (the latest in `last_replica_fault`) and logged.
    """

    def __init__(self, handle: LogHandle, start: str | LogMessageId = "earliest"):
        self._handle = handle
        self._meta = handle.client.meta
        client = handle.client
        self._transport = client.ensemble.calls_through(client.transport)  # as it is now
        self.log_id = handle.log_id
        self._buffer: deque[LogMessage] = deque()
        self._raw: list[bytes] = []  # read and checked, not yet decoded: entries _raw_at, ...
        self._raw_at = LogMessageId(0, 0)
        self._segments: list[SegmentMeta] = []
        self.corrupt_replica_reads = 0
        self.last_replica_fault: ReplicaFault | None = None
        self._pos = self._start_position(start)

    def _start_position(self, start: str | LogMessageId) -> LogMessageId:
        if isinstance(start, str):
            if start not in ("earliest", "latest"):
                raise InvalidArgumentError(
                    f"start must be 'earliest', 'latest' or a LogMessageId, not {start!r}"
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
                f"log {self.log_id} is truncated to {floor}; position {start} is gone"
            )
        return start

    @property
    def position(self) -> LogMessageId:
        """The id of the next entry this reader returns."""
        if self._buffer:
            return self._buffer[0].message_id
        return self._raw_at if self._raw else self._pos

    def read_next(self, timeout: float | None = 0.0) -> LogMessage | None:
        """The next entry; waits up to `timeout` seconds (None: forever) for one to be written."""
        timeout = timeout_arg(timeout)
        self._handle.client.check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = POLL_MIN_S
        while not self._buffer:
            if self._decode() or self._fill():
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._handle.client.check_open()  # closed while we waited
            time.sleep(delay if left is None else min(delay, left))
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
        self._buffer.clear()
        self._raw.clear()

    # --- internals --------------------------------------------------------------------------

    def _segment(self, segment_id: int, refresh: bool) -> SegmentMeta | None:
        """The first segment with id >= segment_id."""
        if refresh or not self._segments or self._segments[-1].segment_id < segment_id:
            self._segments = self._meta.list_segments(self.log_id)
        for seg in self._segments:
            if seg.segment_id >= segment_id:
                return seg
        return None

    def _visible_last(self, seg: SegmentMeta) -> int:
        return visible_last(self._transport, seg)

    def _fill(self) -> bool:
        """Buffer the next entries; False when nothing new is readable now."""
        for refresh in (False, True):
            seg = self._segment(self._pos.segment_id, refresh)
            if seg is None:
                continue
            if seg.segment_id != self._pos.segment_id:
                self._pos = LogMessageId(seg.segment_id, 0)
            if seg.state is SegmentState.TRUNCATED:
                self._pos = LogMessageId(seg.segment_id + 1, 0)
                return True
            last = self._visible_last(seg)
            if self._pos.entry_id <= last:
                self._read(seg, last)
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
