"""Staged storage: a read that a node cannot serve (down, or past its deadline) is served from the
segment's sealed copy in object storage when its upload finished, so readers and the window
rebuild read a SEALED segment even with every node of its ensemble down.

The sealed copy counts only once its footer is there (an upload writes it last, at the end the
metadata fixed when the segment became COMPLETED), so the fallback never serves an unfinished
segment: an ACTIVE one, or one whose upload has not finished, fails as the node did. Only `read`
falls back; every other call (fences, adds, completions, recoveries' reads of what each node
holds through its other calls, and the history checker's `raw_read`) goes to the node alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import NodeUnavailableError, WoodpeckerError
from ..logstore.engine import LogStoreEngine
from ..logstore.storage import ObjectSegmentStorage
from ..logstore.transport import LogStoreTransport
from ..objectstore.base import ObjectStore

log = logging.getLogger(__name__)


class SealedFallback(LogStoreTransport):
    """`inner`'s calls; a `read` that raises `NodeUnavailableError` is answered from `sealed`
    (the store's `sealed/` objects) when the segment's footer is there, and `served()` told."""

    def __init__(
        self, inner: LogStoreTransport, sealed: LogStoreEngine, served: Callable[[], None]
    ):
        self.inner = inner
        self._sealed = sealed
        self._served = served

    @staticmethod
    def engine(store: ObjectStore) -> LogStoreEngine:
        """A reader of sealed segments on `store` (no packs: it never writes)."""
        return LogStoreEngine(ObjectSegmentStorage(store, pack_blocks=0), "sealed")

    @property
    def node_ids(self) -> list[str]:
        return self.inner.node_ids

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        try:
            return self.inner.read(node_id, log_id, segment_id, from_entry_id, max_entries)
        except NodeUnavailableError as exc:
            try:
                end = self._sealed.completed_end(log_id, segment_id)
            except WoodpeckerError as store_exc:  # object storage down too: the node's error
                log.debug("segment %s/%s: no sealed copy read: %s", log_id, segment_id, store_exc)
                raise exc from None
            if end is None:
                raise
            got = self._sealed.read(log_id, segment_id, from_entry_id, max_entries)
            self._served()
            return got

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        return self.inner.add_entries(
            node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )

    def fence(self, node_id, log_id, segment_id):
        return self.inner.fence(node_id, log_id, segment_id)

    def complete(self, node_id, log_id, segment_id, last_entry_id):
        self.inner.complete(node_id, log_id, segment_id, last_entry_id)

    def completed_end(self, node_id, log_id, segment_id):
        return self.inner.completed_end(node_id, log_id, segment_id)

    def seal_segment(self, node_id, log_id, segment_id, last_entry_id):
        return self.inner.seal_segment(node_id, log_id, segment_id, last_entry_id)

    def last_add_confirmed(self, node_id, log_id, segment_id):
        return self.inner.last_add_confirmed(node_id, log_id, segment_id)

    def delete_segment(self, node_id, log_id, segment_id):
        self.inner.delete_segment(node_id, log_id, segment_id)

    def delete_log(self, node_id, log_id):
        self.inner.delete_log(node_id, log_id)

    def raw_read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        return self.inner.raw_read(node_id, log_id, segment_id, from_entry_id, max_entries)
