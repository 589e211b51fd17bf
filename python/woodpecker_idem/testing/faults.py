"""A transport that breaks on request, between a writer and its LogStore nodes (drills, tests).

`FaultInjectingTransport(inner)` wraps any transport: a failed node answers nothing, a dropped ack
is applied on the node but reported as lost, a delayed node answers late. The checker's raw read
(`raw_read`) passes through untouched: it is the judge's read, not a call of the system under
test.
"""

from __future__ import annotations

import threading
import time

from ..errors import NodeUnavailableError
from ..logstore.transport import LogStoreTransport


class FaultInjectingTransport(LogStoreTransport):
    """Wraps a transport and breaks it on request: a failed node answers nothing, a dropped ack is
    applied on the node but reported as lost, a delayed node answers late."""

    def __init__(self, inner: LogStoreTransport):
        self.inner = inner
        self._lock = threading.Lock()
        self._failed: set[str] = set()
        self._drop_acks: dict[str, int] = {}
        self._delay_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @property
    def node_ids(self) -> list[str]:
        return self.inner.node_ids

    # --- controls ---
    def fail_node(self, node_id: str) -> None:
        with self._lock:
            self._failed.add(node_id)

    def heal_node(self, node_id: str) -> None:
        with self._lock:
            self._failed.discard(node_id)

    def drop_acks(self, node_id: str, count: int = 1) -> None:
        """The next `count` adds on `node_id` are applied, then reported as lost."""
        with self._lock:
            self._drop_acks[node_id] = self._drop_acks.get(node_id, 0) + count

    def delay(self, node_id: str, ms: float) -> None:
        with self._lock:
            self._delay_s[node_id] = ms / 1000

    def heal_all(self) -> None:
        with self._lock:
            self._failed.clear()
            self._drop_acks.clear()
            self._delay_s.clear()

    # --- calls ---
    def _before(self, node_id: str, op: str) -> None:
        with self._lock:
            self.calls[op] = self.calls.get(op, 0) + 1
            failed = node_id in self._failed
            delay = self._delay_s.get(node_id, 0.0)
        if delay:
            time.sleep(delay)
        if failed:
            raise NodeUnavailableError(f"node {node_id} is down (injected) during {op}")

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        self._before(node_id, "add_entries")
        result = self.inner.add_entries(
            node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )
        with self._lock:
            drop = self._drop_acks.get(node_id, 0)
            if drop:
                self._drop_acks[node_id] = drop - 1
        if drop:
            raise NodeUnavailableError(f"ack from {node_id} lost (injected) after applying")
        return result

    def fence(self, node_id, log_id, segment_id):
        self._before(node_id, "fence")
        return self.inner.fence(node_id, log_id, segment_id)

    def complete(self, node_id, log_id, segment_id, last_entry_id):
        self._before(node_id, "complete")
        self.inner.complete(node_id, log_id, segment_id, last_entry_id)

    def seal_segment(self, node_id, log_id, segment_id, last_entry_id):
        self._before(node_id, "seal_segment")
        return self.inner.seal_segment(node_id, log_id, segment_id, last_entry_id)

    def completed_end(self, node_id, log_id, segment_id):
        self._before(node_id, "completed_end")
        return self.inner.completed_end(node_id, log_id, segment_id)

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        self._before(node_id, "read")
        return self.inner.read(node_id, log_id, segment_id, from_entry_id, max_entries)

    def last_add_confirmed(self, node_id, log_id, segment_id):
        self._before(node_id, "last_add_confirmed")
        return self.inner.last_add_confirmed(node_id, log_id, segment_id)

    def delete_segment(self, node_id, log_id, segment_id):
        self._before(node_id, "delete_segment")
        self.inner.delete_segment(node_id, log_id, segment_id)

    def delete_log(self, node_id, log_id):
        self._before(node_id, "delete_log")
        self.inner.delete_log(node_id, log_id)

    def raw_read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        # not counted nor failed: the checker reads through here what the nodes really store
        return self.inner.raw_read(node_id, log_id, segment_id, from_entry_id, max_entries)

    def close(self) -> None:
        self.inner.close()
