"""Where the logs this client writes end, for the readers of the same client (Kafka's consumer
fetching from the leader's high watermark, in one process).

A writer publishes each commit (its segment's new LAC: the entries up to it are on an ack quorum
of nodes) and each segment it completes; a reader of the same client waits here for a change of
its log instead of sleeping between polls, so an acknowledged entry reaches it in a thread
wakeup, and it may read up to a published LAC at once (the nodes learn the LAC only with the next
add or the writer's LAC update). A reader of a log written by another client or process still
polls the nodes, with a bounded backoff.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable


class Tails:
    """See the module doc. One per client (its `Ensemble`); every method is thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lacs: dict[tuple[int, int], int] = {}  # (log, segment) -> LAC published
        self._versions: dict[int, int] = {}  # log -> changes published so far
        self._waiting = 0  # readers waiting: a commit with none notifies nobody

    def published(self, log_id: int, segment_id: int, lac: int) -> None:
        """Entries up to `lac` of the segment are committed (reached their ack quorum)."""
        with self._cond:
            key = (log_id, segment_id)
            if lac > self._lacs.get(key, -1):
                self._lacs[key] = lac
            self._changed_locked(log_id)

    def completed(self, log_id: int, segment_id: int) -> None:
        """The segment is completed in the metadata store (readers go by its last entry now)."""
        with self._cond:
            self._lacs.pop((log_id, segment_id), None)
            self._changed_locked(log_id)

    def _changed_locked(self, log_id: int) -> None:
        self._versions[log_id] = self._versions.get(log_id, 0) + 1
        if self._waiting:
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Readers waiting for a change now."""
        return self._waiting

    def lac(self, log_id: int, segment_id: int) -> int:
        """The LAC a writer of this client published for the segment (-1: none)."""
        return self._lacs.get((log_id, segment_id), -1)

    def version(self, log_ids: Iterable[int]) -> int:
        """A number that changes whenever one of `log_ids` changes (read it before looking at the
        logs, then `wait` with it: a change in between is not missed)."""
        versions = self._versions
        return sum(versions.get(log_id, 0) for log_id in log_ids)

    def wait(self, log_ids: Iterable[int], seen: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a change of `log_ids` since `version` gave `seen`;
        True if one came."""
        ids = tuple(log_ids)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            try:
                while self.version(ids) == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._waiting -= 1
