"""The ensemble layer of one client: its nodes found (`NodeDirectory`), chosen (`new_ensemble`),
reached (one `NodeSender` per node, shared by every writer and reader of the client, a deadline on
every call) and the background work of its writers (`Scheduler`), all in one place."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping

from ..errors import NodeUnavailableError, WoodpeckerError
from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore, SegmentMeta
from ..objectstore.base import ObjectStore
from ..types import SegmentState
from .members import REFRESH_S, NodeDirectory
from .placement import new_ensemble
from .scheduler import Scheduler
from .sealed import SealedFallback
from .senders import NodeCalls, NodeSender
from .tails import Tails
from .uploads import SegmentUploads

log = logging.getLogger(__name__)

#: The synchronous calls (fences, reads, completions, deletes) may scan a whole segment: on object
#: storage a fence lists and reads every block (a takeover of a segment of 10,000 single writes
#: on moto: ~100 s). They get this many times the deadline of a write's add, so the deadline
#: catches a node that hangs without failing a takeover that is merely slow.
SCAN_DEADLINE_FACTOR = 10
#: How long a closing client waits for its pending uploads (staged storage) before it drops them.
UPLOAD_DRAIN_S = 5.0


class Ensemble:
    """See the module doc. `transport` reaches the nodes; `registry`, when given, is the metadata
    store whose node registry the directory reads (else the transport's nodes are the directory),
    and `on_nodes` learns the registered node processes' addresses; `deadline_s` bounds every node
    call. `staged`: the nodes keep segments as staged storage, and completed segments are
    uploaded (`uploads`) before they are SEALED; `sealed_store` (staged: the store's `sealed/`
    objects) serves the reads of uploaded segments that no node can serve (`SealedFallback`)."""

    def __init__(
        self,
        transport: LogStoreTransport,
        *,
        deadline_s: float,
        registry: MetadataStore | None = None,
        on_nodes: Callable[[Mapping[str, str]], None] | None = None,
        name: str = "client",
        staged: bool = False,
        sealed_store: ObjectStore | None = None,
    ):
        self.transport = transport  # the nodes without deadlines: only the senders call it
        self.deadline_s = deadline_s
        self.scheduler = Scheduler(name)
        self.directory = NodeDirectory(transport, registry, on_change=on_nodes)
        self.tails = Tails()  # where this client's writers' logs end, for its readers
        self._lock = threading.Lock()
        self._senders: dict[str, NodeSender] = {}
        self._closed = False
        if registry is not None:  # the registry is watched: nodes joining, leaving, moving
            self.scheduler.timer(self._watch, "nodes").poke()
        # every synchronous node call (readers, recoveries, the rebuild) goes through the senders
        # staged storage: reads a node cannot serve come from the sealed copy, once uploaded
        self._sealed = SealedFallback.engine(sealed_store) if sealed_store is not None else None
        self.sealed_reads = 0  # reads no node served, served from object storage
        self.calls: LogStoreTransport = self._fallback(
            NodeCalls(lambda: self.transport, self.sender, deadline_s * SCAN_DEADLINE_FACTOR)
        )
        # staged storage (`storage.type: staged`): completed segments are SEALED once uploaded
        self.uploads: SegmentUploads | None = (
            SegmentUploads(self.calls, self.scheduler, self.directory.live) if staged else None
        )

    def calls_through(self, transport: LogStoreTransport) -> LogStoreTransport:
        """`transport`'s calls made on the senders, with the deadline (as `calls` makes the
        ensemble's transport of the moment)."""
        return self._fallback(
            NodeCalls(lambda: transport, self.sender, self.deadline_s * SCAN_DEADLINE_FACTOR)
        )

    def _fallback(self, calls: LogStoreTransport) -> LogStoreTransport:
        if self._sealed is None:
            return calls
        return SealedFallback(calls, self._sealed, self._served_sealed)

    def _served_sealed(self) -> None:
        with self._lock:
            self.sealed_reads += 1

    def _watch(self) -> float:
        """On the timer thread: read the registry again, off it (a metadata call may block)."""
        self.scheduler.submit("nodes", self._read_registry)
        return REFRESH_S

    def _read_registry(self) -> None:
        try:
            self.directory.live()
        except WoodpeckerError as exc:  # the metadata store is down: the last read stands
            log.debug("node registry not read: %s", exc)

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

    def fence_segments(self, segments: Iterable[SegmentMeta]) -> None:
        """Fence every unfinished (ACTIVE) segment of `segments` on each of its nodes: a writer
        still adding to one is refused from now on. A node that does not answer is skipped
        (logged): it may still take adds until its writer's next metadata write fails."""
        for seg in segments:
            if seg.state is not SegmentState.ACTIVE:
                continue
            for node in seg.nodes:
                try:
                    self.calls.fence(node, seg.log_id, seg.segment_id)
                except NodeUnavailableError as exc:
                    log.warning(
                        "segment %s/%s not fenced on %s: %s", seg.log_id, seg.segment_id, node, exc
                    )

    def delete_log(self, log_id: int, segments: Collection[SegmentMeta]) -> None:
        """Remove the log from the nodes: every node of the directory drops the whole log, unless
        one of `segments` (the log's, from its metadata) is still ACTIVE. Such a segment, fenced
        by `fence_segments` first, is left in place with its fence: a writer elsewhere that has
        not noticed the delete meets that fence on its next add (a fence deleted with its
        segment would let that add land, and be acknowledged, in a deleted log)."""
        if not any(seg.state is SegmentState.ACTIVE for seg in segments):
            for node in self.directory.live():
                self.calls.delete_log(node, log_id)
            return
        for seg in segments:
            if seg.state is SegmentState.ACTIVE:
                log.info("log %s: segment %s left fenced on %s", log_id, seg.segment_id, seg.nodes)
                continue
            for node in seg.nodes:
                self.calls.delete_segment(node, log_id, seg.segment_id)

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
        if self.uploads is not None:  # a segment left COMPLETED waits for the next takeover
            self.uploads.wait_idle(min(timeout, UPLOAD_DRAIN_S))
        self.scheduler.close(timeout)
        for sender in senders:
            sender.close(timeout)
        if self._sealed is not None:
            self._sealed.close()
        self.transport.close()
