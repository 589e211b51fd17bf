"""LogHandle: one log's name, id and the doors to its writer, readers and truncation."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..errors import NodeUnavailableError
from ..types import LogMessageId, SegmentState
from .keyarchive import archive_keys, archive_prefix
from .reader import LogReader
from .writer import LogWriter

if TYPE_CHECKING:
    from .client import WoodpeckerClient

log = logging.getLogger(__name__)


class LogHandle:
    def __init__(self, client: WoodpeckerClient, log_id: int, name: str):
        self.client = client
        self.log_id = log_id
        self.name = name

    def __repr__(self) -> str:
        return f"LogHandle(name={self.name!r}, log_id={self.log_id})"

    def open_writer(self, idempotent: bool = False, **options: Any) -> LogWriter:
        """Take the log over (epoch bump), complete what earlier writers left, open a segment.

        With `idempotent=True` the writer also rebuilds its dedup window before it accepts writes;
        options: `window_duration_s`, `window_max_keys` (defaults from config).
        """
        if idempotent:
            from ..idempotency.writer import IdempotentLogWriter

            return self.client._track(IdempotentLogWriter(self, **options))
        if options:
            raise TypeError(f"unexpected options for a plain writer: {sorted(options)}")
        return self.client._track(LogWriter(self))

    def open_reader(self, start: str | LogMessageId = "earliest") -> LogReader:
        return LogReader(self, start)

    def segments(self):
        return self.client.meta.list_segments(self.log_id)

    def truncate(self, message_id: LogMessageId) -> None:
        """Drop every entry before `message_id`; whole segments before it are deleted.

        Keys of deleted entries that may still be in a dedup window (completed less than
        `idempotency.window_duration_s` ago) are kept (keyarchive.py), so a retry of one returns
        its original id from a recovered writer as from the live one (docs/semantics.md).
        """
        client = self.client
        meta = client.meta
        now = client.clock.now_ms()
        horizon = now - int(client.config.idempotency.window_duration_s * 1000)
        meta.set_truncation(self.log_id, LogMessageId(*message_id))
        for seg in meta.list_segments(self.log_id):
            if seg.segment_id >= message_id[0]:
                break
            if seg.state not in (SegmentState.COMPLETED, SegmentState.SEALED):
                continue
            if seg.completed_ms > horizon:  # before the entries go: a failure leaves them
                archive_keys(client.transport, client.objects, seg)
            meta.update_segment(None, dataclasses.replace(seg, state=SegmentState.TRUNCATED))
            for node in seg.nodes:
                try:
                    client.transport.delete_segment(node, self.log_id, seg.segment_id)
                except NodeUnavailableError as exc:
                    log.warning(
                        "truncate: could not delete %s/%s on %s: %s",
                        self.log_id,
                        seg.segment_id,
                        node,
                        exc,
                    )
        self._drop_old_archives(horizon)

    def _drop_old_archives(self, horizon: int) -> None:
        """Delete kept keys of truncated segments now older than the window."""
        objects = self.client.objects
        prefix = archive_prefix(self.log_id)
        completed = {s.segment_id: s.completed_ms for s in self.segments()}
        for key in objects.list(prefix):
            name = key[len(prefix) :]
            if name.isdigit() and completed.get(int(name), 0) <= horizon:
                objects.delete(key)
