"""LogHandle: one log's name, id and the doors to its writer, readers and truncation."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Literal, Protocol, cast, overload

from .. import registry
from ..args import bool_arg, message_id_arg
from ..errors import (
    InvalidArgumentError,
    MetadataConflictError,
    NodeUnavailableError,
    TruncationPendingError,
)
from ..meta.base import SegmentMeta
from ..retry import Backoff
from ..types import LogMessageId, ReaderInfo, SegmentState
from .keyarchive import archive_keys, archive_prefix
from .reader import LogReader, entries_from, last_entry, visible_last

if TYPE_CHECKING:
    from ..writer.api import IdempotentLogWriter, LogWriter
    from .client import WoodpeckerClient

log = logging.getLogger(__name__)


class ClosableWriter(Protocol):
    """What the client closes when it closes (every writer it opened)."""

    def close(self, timeout: float | None = 30.0) -> None: ...


class WriterFactory(Protocol):
    """Builds a log's writer (the composition root, `connect.open_writer`, passes it): the
    client does not import the writer pipeline, which sits above it."""

    def __call__(
        self,
        handle: LogHandle,
        idempotent: bool,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
        compression: str | None = None,
    ) -> LogWriter | IdempotentLogWriter: ...


class AcknowledgedEnds(Protocol):
    """What truncation asks a live writer of this process: for each segment it has not completed
    yet, the last entry its quorum acknowledged (-1: none)."""

    def acknowledged_ends(self) -> dict[int, int]: ...


class LogHandle:
    def __init__(self, client: WoodpeckerClient, log_id: int, name: str):
        self.client = client
        self.log_id = log_id
        self.name = name

    def __repr__(self) -> str:
        return f"LogHandle(name={self.name!r}, log_id={self.log_id})"

    @overload
    def open_writer(
        self, idempotent: Literal[False] = False, *, compression: str | None = None
    ) -> LogWriter: ...
    @overload
    def open_writer(
        self,
        idempotent: Literal[True],
        *,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
        compression: str | None = None,
    ) -> IdempotentLogWriter: ...
    @overload
    def open_writer(
        self,
        idempotent: bool,
        *,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
        compression: str | None = None,
    ) -> LogWriter | IdempotentLogWriter: ...
    def open_writer(
        self,
        idempotent: bool = False,
        *,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
        compression: str | None = None,
    ) -> LogWriter | IdempotentLogWriter:
        """Take the log over (epoch bump), complete what earlier writers left, open a segment.

        With `idempotent=True` the writer also rebuilds its dedup window before it accepts writes;
        `window_duration_s` and `window_max_keys` size that window (None: from the config). They
        are named parameters so a misspelt option is a `TypeError` at the call; given to a plain
        writer they raise `InvalidArgumentError` naming them (a plain writer has no window).
        `compression` (`none`, `lz4`, `zstd`; None: the config's `append.compression`) is this
        writer's batch compression: what it writes is read back the same whatever it was.
        """
        self.client.check_open()
        bool_arg(idempotent, "idempotent")
        if not idempotent:
            given = [
                name
                for name, value in (
                    ("window_duration_s", window_duration_s),
                    ("window_max_keys", window_max_keys),
                )
                if value is not None
            ]
            if given:
                raise InvalidArgumentError(
                    f"{', '.join(given)}: window options apply to idempotent writers only "
                    "(open_writer(idempotent=True, ...)); a plain writer has no dedup window"
                )
        writer = self.client.writers(
            self,
            idempotent,
            window_duration_s=window_duration_s,
            window_max_keys=window_max_keys,
            compression=compression,
        )
        return self.client.track(writer, self)

    def open_reader(
        self,
        start: str | LogMessageId = "earliest",
        *,
        name: str | None = None,
        start_time_ms: int | None = None,
    ) -> LogReader:
        """A reader from `start`: 'earliest' (the first entry kept), 'latest' (what is written
        from now on), a `LogMessageId` or its text ("3:120"); or, with `start_time_ms`, the first
        entry whose timestamp is at or after it (milliseconds since the epoch).

        With `name` the reader is durable: `reader.commit()` records its position in the
        metadata store and the next `open_reader(name=...)` of that name, in any process, resumes
        there (`start` applies only to a new name). Opening a name takes it over: the reader
        that held it before gets `ReaderFencedError` at its next commit. See docs/semantics.md.
        """
        self.client.check_open()
        reader = LogReader(self, start, name=name, start_time_ms=start_time_ms)
        registry.add_reader(reader, self)  # its corrupt-replica count reaches the metrics
        return reader

    def last_message_id(self) -> LogMessageId | None:
        """The id of the log's last entry a reader can read now (None: the log is empty)."""
        self.client.check_open()
        last = last_entry(self.client.ensemble.calls, self.client.meta.list_segments(self.log_id))
        floor = self.client.meta.get_log_by_id(self.log_id).truncated_to
        if last is None or (floor is not None and last < floor):
            return None
        return last

    def readers(self) -> list[ReaderInfo]:
        """The log's named readers, by name: each one's committed position and lag (entries
        from it to the end of the log)."""
        self.client.check_open()
        meta = self.client.meta
        segments = meta.list_segments(self.log_id)
        return [
            ReaderInfo(
                r.name,
                r.position,
                entries_from(self.client.ensemble.calls, segments, r.position),
                r.epoch,
                r.owner,
                r.updated_ms,
            )
            for r in meta.list_readers(self.log_id)
        ]

    def delete_reader(self, name: str) -> bool:
        """Forget the named reader `name` (its position; a live holder's next commit is refused
        with `ReaderFencedError`, and it no longer holds retention back). False if there was
        no such reader."""
        self.client.check_open()
        return self.client.meta.delete_reader(self.log_id, name) is not None

    def segments(self):
        self.client.check_open()
        return self.client.meta.list_segments(self.log_id)

    def truncate(self, message_id: LogMessageId) -> None:
        """Drop every entry before `message_id`; whole segments before it are deleted.

        Keys of deleted entries that may still be in a dedup window (completed less than
        `idempotency.window_duration_s` ago) are kept (keyarchive.py), so a retry of one returns
        its original id from a recovered writer as from the live one (docs/semantics.md).

        Raises `InvalidArgumentError` naming the log's end if `message_id` is past it (see
        `end()`): a truncation point beyond the end would hide every entry acknowledged up to
        it, before and after the call.
        """
        self.client.check_open()
        message_id = message_id_arg(message_id, "message_id")
        end, why = self._end()
        if message_id > end and message_id != self._next_segment(end):
            raise InvalidArgumentError(
                f"message_id {message_id} is past the end of log {self.name!r}: the next id is "
                f"{end} ({why}); truncation drops entries before an id the log has reached"
            )
        client = self.client
        meta = client.meta
        self._await_completed_before(message_id)
        now = client.clock.now_ms()
        horizon = now - int(client.config.idempotency.window_duration_s * 1000)
        meta.set_truncation(self.log_id, message_id)
        for seg in meta.list_segments(self.log_id):
            if seg.segment_id >= message_id[0]:
                break
            if seg.state not in (SegmentState.COMPLETED, SegmentState.SEALED):
                continue
            if seg.completed_ms > horizon:  # before the entries go: a failure leaves them
                archive_keys(client.ensemble.calls, client.objects, seg)
            if not self._mark_truncated(seg):
                continue
            for node in seg.nodes:
                try:
                    client.ensemble.calls.delete_segment(node, self.log_id, seg.segment_id)
                except NodeUnavailableError as exc:
                    log.warning(
                        "truncate: could not delete %s/%s on %s: %s",
                        self.log_id,
                        seg.segment_id,
                        node,
                        exc,
                    )
        self._drop_old_archives(horizon)

    def _await_completed_before(self, message_id: LogMessageId) -> None:
        """Wait until every segment before `message_id`'s is completed (or gone). A writer
        completes the segments it rolled past in the background, after it acknowledged their
        entries: right after a burst of writes most of them are still open, and a truncation
        that passed over them would leave their entries stored and readable for ever after.
        `TruncationPendingError` (nothing changed) if one is still open after
        `append.timeout_ms`: its writer died (a new writer recovers it) or is stuck."""
        backoff = Backoff(0.002, 0.1, self.client.config.append.timeout_ms / 1000)
        while True:
            open_ = tuple(
                s.segment_id
                for s in self.segments()
                if s.segment_id < message_id.segment_id and s.state is SegmentState.ACTIVE
            )
            if not open_:
                return
            if not backoff.wait():
                raise TruncationPendingError(
                    f"log {self.name!r}: segments {', '.join(map(str, open_))} before "
                    f"{message_id} are still open after append.timeout_ms: their writer has not "
                    "completed them (it does so in the background after a roll), or died (opening "
                    "a writer on the log recovers them). Nothing was truncated; call truncate "
                    "again",
                    segments=open_,
                )

    def _mark_truncated(self, seg: SegmentMeta) -> bool:
        """Mark `seg` TRUNCATED; False if it is gone meanwhile. A live writer may move a
        completed segment on (COMPLETED -> SEALED) while we truncate: that changes its revision,
        not its entries, so the mark is made again on the record as it is now."""
        meta = self.client.meta
        current: SegmentMeta | None = seg
        for _ in range(10):
            if current is None or current.state is SegmentState.TRUNCATED:
                return False
            try:
                meta.update_segment(
                    None, dataclasses.replace(current, state=SegmentState.TRUNCATED)
                )
                return True
            except MetadataConflictError:
                current = meta.get_segment(self.log_id, seg.segment_id)
        raise MetadataConflictError(
            f"truncate: segment {self.log_id}/{seg.segment_id} kept changing under it; "
            "call truncate again"
        )

    def end(self) -> LogMessageId:
        """The id after the log's last acknowledged entry: the furthest point `truncate` takes.

        While a writer of this client has the log open, its segment's end is the last entry its
        quorum acknowledged; otherwise a segment's end is what a reader sees (its last entry once
        completed, else the tail its replicas confirm, which is where recovery ends it). When
        that segment is completed, the next segment's first id is the same point and `truncate`
        takes it too.
        """
        self.client.check_open()
        return self._end()[0]

    def _next_segment(self, end: LogMessageId) -> LogMessageId | None:
        """The next segment's first id when the segment `end` is in is completed: the same point
        as `end` (no entry lies between), as retention and `--older-than` name it."""
        for seg in reversed(self.segments()):
            if seg.segment_id == end.segment_id:
                if seg.state in (SegmentState.COMPLETED, SegmentState.SEALED):
                    return LogMessageId(end.segment_id + 1, 0)
                break
        return None

    def _end(self) -> tuple[LogMessageId, str]:
        """`end()` and the words saying where it comes from (for an error message)."""
        live = [s for s in self.segments() if s.state is not SegmentState.TRUNCATED]
        if not live:
            return LogMessageId(0, 0), "the log holds no segment"
        last = live[-1]
        for writer, handle in registry.writers():
            if handle.client is not self.client or handle.log_id != self.log_id:
                continue
            if not registry.is_live(writer) or not hasattr(writer, "acknowledged_ends"):
                continue
            acked = cast(AcknowledgedEnds, writer).acknowledged_ends().get(last.segment_id)
            if acked is not None:
                end = LogMessageId(last.segment_id, acked + 1)
                if acked < 0:
                    return end, "the open writer has no acknowledged entry in it yet"
                return end, f"the open writer's last acknowledged entry is {end.segment_id}:{acked}"
        seen = visible_last(self.client.ensemble.calls, last)
        return LogMessageId(last.segment_id, seen + 1), (
            f"the last entry of segment {last.segment_id} readers see is {seen}"
            if seen >= 0
            else f"segment {last.segment_id} holds no entry readers see"
        )

    def _drop_old_archives(self, horizon: int) -> None:
        """Delete kept keys of truncated segments now older than the window."""
        objects = self.client.objects
        prefix = archive_prefix(self.log_id)
        completed = {s.segment_id: s.completed_ms for s in self.segments()}
        for key in objects.list(prefix):
            name = key[len(prefix) :]
            if name.isdigit() and completed.get(int(name), 0) <= horizon:
                objects.delete(key)
