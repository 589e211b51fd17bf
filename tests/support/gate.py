"""A transport whose adds wait at a gate: a test holds a batch in flight as long as it needs
(group commit then keeps later writes queued behind it), without timing guesses."""

from __future__ import annotations

import threading

from woodpecker_idem.logstore.transport import LogStoreTransport
from woodpecker_idem.testing import FaultInjectingTransport


class GatedTransport(FaultInjectingTransport):
    """`hold()` makes every later add_entries wait until `release()` (at most `max_hold_s`)."""

    def __init__(self, inner: LogStoreTransport, max_hold_s: float = 30.0):
        super().__init__(inner)
        self._open = threading.Event()
        self._open.set()
        self._max_hold_s = max_hold_s
        self.waiting = threading.Semaphore(0)  # released once per add that reached the gate

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        if not self._open.is_set():
            self.waiting.release()
            self._open.wait(self._max_hold_s)
        return super().add_entries(
            node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )


def gate(client: object) -> GatedTransport:
    """Put a gate in front of `client`'s transport (before a writer is opened)."""
    gated = GatedTransport(client.transport)  # type: ignore[attr-defined]
    client.transport = gated  # type: ignore[attr-defined]
    return gated
