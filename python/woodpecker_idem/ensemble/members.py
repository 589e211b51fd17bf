"""The node directory: which LogStore nodes a client can place segments on.

In-process nodes are the engines the client built (the transport knows them). Registered nodes
are the metadata store's registry (`MetadataStore.list_nodes`), read again at most every
`refresh_s`; node processes (an address that is not `inproc://`) are handed to `on_change`
(service mode: the gRPC transport learns where they are), and of the registered nodes only
those the transport can reach count (a registry shared with clients of another shape may list
nodes this one has no route to).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore

#: How long a read of the registry is trusted before the next placement reads it again.
REFRESH_S = 2.0


class NodeDirectory:
    """The live nodes, sorted by id (`live()`); thread-safe."""

    def __init__(
        self,
        transport: LogStoreTransport,
        meta: MetadataStore | None = None,
        refresh_s: float = REFRESH_S,
        on_change: Callable[[Mapping[str, str]], None] | None = None,
    ):
        self._transport = transport
        self._meta = meta  # None: the transport's nodes are the directory (in-process)
        self._refresh_s = refresh_s
        self._on_change = on_change
        self._processes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._cached: list[str] = []
        self._read_at = float("-inf")

    def live(self) -> list[str]:
        if self._meta is None:
            return sorted(self._transport.node_ids)
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= self._refresh_s:
                nodes = self._meta.list_nodes()
                self._cached = [n.node_id for n in nodes]
                self._read_at = now
                processes = {
                    n.node_id: n.address for n in nodes if not n.address.startswith("inproc://")
                }
                if self._on_change is not None and processes != self._processes:
                    self._on_change(processes)
                self._processes = processes
            registered = set(self._cached)
        return [n for n in sorted(self._transport.node_ids) if n in registered]
