"""A writer's hold on its log: opening takes the log over in the metadata store (a new epoch,
DESIGN.md section 3) under a lease the writer renews every few seconds. An answer that another
writer holds the log fences this one (`fence`): every pending and later write fails with
`WriterFencedError`.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import WriterFencedError

if TYPE_CHECKING:
    from ..clock import Clock
    from ..meta import MetadataStore

LEASE_MS = 30_000


class Lease:
    """The epoch and lease of one writer (`owner` names it in the metadata store)."""

    def __init__(
        self,
        meta: MetadataStore,
        log_id: int,
        clock: Clock,
        fence: Callable[[WriterFencedError], None],
    ):
        self._meta = meta
        self._log_id = log_id
        self._clock = clock
        self._fence = fence
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch = meta.take_over(log_id, self.owner, clock.now_ms(), LEASE_MS)

    def renew(self) -> None:
        """Renew the lease; fences the writer if another writer took the log over."""
        try:
            self._meta.renew_lease(
                self._log_id, self.epoch, self.owner, self._clock.now_ms(), LEASE_MS
            )
        except WriterFencedError as exc:
            self._fence(exc)

    def held(self) -> bool:
        """Ask the metadata store whether the log is still this writer's; fences it if not."""
        try:
            self._meta.check_epoch(self._log_id, self.epoch)
        except WriterFencedError as exc:
            self._fence(exc)
            return False
        return True
