"""The ensemble layer of one client: its nodes found (`NodeDirectory`), chosen (`new_ensemble`),
reached (one `NodeSender` per node, shared by every writer and reader of the client, a deadline on
every call) and the background work of its writers (`Scheduler`), all in one place."""

from __future__ import annotations

import threading
from collections.abc import Collection

from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore
from .members import NodeDirectory
from .placement import new_ensemble
from .scheduler import Scheduler
from .senders import NodeCalls, NodeSender


class Ensemble:
    """See the module doc. `transport` reaches the nodes; `registry`, when given, is the metadata
    store whose node registry the directory reads (else the transport's nodes are the directory);
    `deadline_s` bounds every node call."""

    def __init__(
        self,
        transport: LogStoreTransport,
        *,
        deadline_s: float,
        registry: MetadataStore | None = None,
        name: str = "client",
    ):
        self.transport = transport  # the nodes without deadlines: only the senders call it
        self.deadline_s = deadline_s
        self.scheduler = Scheduler(name)
        self.directory = NodeDirectory(transport, registry)
        self._lock = threading.Lock()
        self._senders: dict[str, NodeSender] = {}
        self._closed = False
        # every synchronous node call (readers, recoveries, the rebuild) goes through the senders
        self.calls: LogStoreTransport = NodeCalls(lambda: self.transport, self.sender)

    def calls_through(self, transport: LogStoreTransport) -> LogStoreTransport:
        """`transport`'s calls made on the senders, with the deadline (as `calls` makes the
        ensemble's transport of the moment)."""
        return NodeCalls(lambda: transport, self.sender)

    def sender(self, node: str) -> NodeSender:
        """The node's sender (made on first use)."""
        sender = self._senders.get(node)
        if sender is None:
            with self._lock:
                sender = self._senders.get(node)
                if sender is None:
                    sender = NodeSender(node, self.scheduler, self.deadline_s)
                    if self._closed:
                        sender.close(0)
                    self._senders[node] = sender
        return sender

    def new_ensemble(
        self, es: int, segment_id: int, exclude: Collection[str] = ()
    ) -> tuple[str, ...]:
        """The nodes of a new segment: `es` live nodes, avoiding `exclude` while others are live."""
        return new_ensemble(self.directory.live(), es, segment_id, exclude)

    def delete_log(self, log_id: int) -> None:
        """Remove everything of the log from every node of the directory."""
        for node in self.directory.live():
            self.calls.delete_log(node, log_id)

    def threads(self) -> list[threading.Thread]:
        """The threads of the layer: the scheduler's and the senders' live workers."""
        with self._lock:
            senders = list(self._senders.values())
        return self.scheduler.threads + [t for s in senders for t in s.threads]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the background work and the senders (what is not started is dropped), then
        release the transport. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            senders = list(self._senders.values())
        self.scheduler.close(timeout)
        for sender in senders:
            sender.close(timeout)
        self.transport.close()
