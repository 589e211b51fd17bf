"""Staged storage, the client's side: a completed segment is COMPLETED until one node of its
ensemble has uploaded it to object storage (`seal_segment`), and only then SEALED.

An upload is a task on the client's scheduler (one queue for every writer of the client, so at
most one upload runs at a time and a slow object store holds one of the scheduler's workers,
never a write, a lease renewal or a repair). The node is the first live one of the segment's
ensemble, then the next one at each failed attempt (a node killed mid-upload, one that lacks
entries); a failed attempt is tried again after a backoff, armed on the scheduler's timer (no
thread waits). Attempts go on until the segment is SEALED (by this client or another: a takeover
uploads what it finds COMPLETED), deleted or truncated, or the client closes; a segment left
COMPLETED by a closed client is uploaded by the next writer's takeover. Uploads are idempotent
(the node writes the same objects, and keeps the blocks it finds holding the same entries), so
two clients uploading one segment do no harm.

One failure is not tried again: a conflict (`EntryConflictError`), where object storage holds
a copy of the segment with other entries, or sealed at another end, than the node's. Another
node of the ensemble is asked (its copy may be the one that matches); once every node of it
found a conflict, or lacks entries of the segment (`SegmentIncompleteError`: it can never
upload it, and once it holds them they are the entries the others compared), the upload stops:
one error logged, naming the objects and what to do, the segment in `conflicts` (counted by
the `woodpecker_segment_upload_conflicts` metric), left COMPLETED with its nodes' copies. A
retry could only fail the same way, with a warning each time, for ever; an operator has to
decide which copy is right. A later `submit` of it by the next writer (its takeover, whose
epoch is newer) tries again; the writer that met the conflict asking again (its completion
retried: it hands the segment over each time it finds it COMPLETED) does not.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import EntryConflictError, MetadataConflictError, SegmentIncompleteError
from ..logstore.transport import LogStoreTransport
from ..meta.base import MetadataStore, SegmentMeta
from ..retry import Backoff
from ..types import SegmentState
from .scheduler import Scheduler

log = logging.getLogger(__name__)

#: The scheduler's queue of every upload of a client (one at a time).
QUEUE = "uploads"
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0


@dataclass
class _Upload:
    meta: MetadataStore
    log_id: int
    segment_id: int
    epoch: int | None  # of the writer that asked for it (None: no writer's)
    backoff: Backoff = field(default_factory=lambda: Backoff(RETRY_INITIAL_S, RETRY_MAX_S))
    turn: int = 0  # failed attempts: the node tried next is the turn-th of the live ones
    errors: dict[str, str] = field(default_factory=dict)
    conflicted: dict[str, str] = field(default_factory=dict)  # node -> the conflict it found
    incomplete: set[str] = field(default_factory=set)  # nodes that lack entries of it


class SegmentUploads:
    """See the module doc. `calls` reaches the nodes (with the ensemble's deadline), `live()`
    lists the live nodes."""

    def __init__(
        self, calls: LogStoreTransport, scheduler: Scheduler, live: Callable[[], list[str]]
    ):
        self._calls = calls
        self._scheduler = scheduler
        self._live = live
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], _Upload] = {}
        self._idle = threading.Condition(self._lock)
        self.uploaded = 0  # segments this client sealed
        self.failed_attempts = 0
        # the attempt under way: ((log, segment), node), for operators and tests
        self.in_flight: tuple[tuple[int, int], str] | None = None
        # the latest failed attempts: ((log, segment), node, error), oldest first
        self.failures: deque[tuple[tuple[int, int], str, str]] = deque(maxlen=1000)
        # the sealed segments and the node each was uploaded through, latest last
        self.sealed_by: deque[tuple[tuple[int, int], str]] = deque(maxlen=1000)
        # uploads stopped at a conflict (the module doc): (log, segment) -> (log name, errors)
        self.conflicts: dict[tuple[int, int], tuple[str, str]] = {}
        self._stopped_for: dict[tuple[int, int], int | None] = {}  # the epoch that asked for it

    def submit(self, meta: MetadataStore, seg: SegmentMeta, epoch: int | None = None) -> None:
        """Upload `seg` (COMPLETED) and record it SEALED, in the background, for the writer of
        `epoch` (the module doc: who may ask again after a conflict)."""
        key = (seg.log_id, seg.segment_id)
        with self._lock:
            if key in self._pending:
                return  # under way already
            if key in self.conflicts and epoch is not None and self._stopped_for[key] == epoch:
                return  # the writer that met the conflict: it would only meet it again
            self.conflicts.pop(key, None)  # a newer writer asks again: tried again
            self._stopped_for.pop(key, None)
            self._pending[key] = _Upload(meta, seg.log_id, seg.segment_id, epoch)
        if not self._scheduler.submit(QUEUE, self._attempt, key):
            self._forget(key)  # the client is closing: the next takeover uploads it

    def conflicts_by_log(self) -> dict[str, int]:
        """Per log name, how many of its segments' uploads stopped at a conflict (the metric);
        none once the client closed (its figures leave with it, as a closed writer's do)."""
        out: dict[str, int] = {}
        if self._scheduler.closed:
            return out
        with self._lock:
            for name, _ in self.conflicts.values():
                out[name] = out.get(name, 0) + 1
        return out

    def pending(self) -> list[tuple[int, int]]:
        """(log, segment) of the uploads not finished yet."""
        with self._lock:
            return sorted(self._pending)

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s until no upload is pending (tests, and close)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _forget(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._forget_locked(key)

    def _forget_locked(self, key: tuple[int, int]) -> None:
        self._pending.pop(key, None)
        if not self._pending:
            self._idle.notify_all()

    def _node(self, up: _Upload, seg: SegmentMeta) -> str:
        """The turn-th node of the segment's ensemble, live ones first (in ensemble order)."""
        try:
            live = set(self._live())
        except Exception:  # noqa: BLE001 - the registry is unreadable: try them in order
            live = set(seg.nodes)
        order = [n for n in seg.nodes if n in live] + [n for n in seg.nodes if n not in live]
        return order[up.turn % len(order)]

    def _attempt(self, key: tuple[int, int]) -> None:
        with self._lock:
            up = self._pending.get(key)
        if up is None:
            return
        node = "?"
        seg: SegmentMeta | None = None
        try:
            seg = up.meta.get_segment(up.log_id, up.segment_id)
            if seg is None or seg.state is not SegmentState.COMPLETED:
                self._forget(key)  # sealed by another client, truncated or deleted
                return
            node = self._node(up, seg)
            self.in_flight = (key, node)
            try:
                sealed = self._calls.seal_segment(
                    node, seg.log_id, seg.segment_id, seg.last_entry_id
                )
            finally:
                self.in_flight = None
            self._record_sealed(up.meta, seg)
        except Exception as exc:  # noqa: BLE001 - every failure is tried again, on another node
            self.failed_attempts += 1
            up.errors[node] = f"{type(exc).__name__}: {exc}"
            self.failures.append((key, node, up.errors[node]))
            up.turn += 1
            if isinstance(exc, SegmentIncompleteError):
                up.incomplete.add(node)
            elif isinstance(exc, EntryConflictError):
                up.conflicted[node] = up.errors[node]
            # a node lacking entries can only ever answer so, or (once it holds them: replicas
            # hold the same entries) find the same conflict; under load one often does
            if (
                seg is not None
                and up.conflicted
                and all(n in up.conflicted or n in up.incomplete for n in seg.nodes)
            ):
                self._stop_at_conflict(key, up)
                return
            delay = up.backoff.next_delay()
            log.warning(
                "segment %s/%s: upload through %s failed (attempt %d; again in %.1f s, through "
                "the next node): %s: %s",
                up.log_id,
                up.segment_id,
                node,
                up.backoff.attempts,
                delay,
                type(exc).__name__,
                exc,
            )
            timer = self._scheduler.timer(lambda: self._again(key), f"upload-{key}")
            timer.at(time.monotonic() + delay)
            return
        self.uploaded += 1
        self.sealed_by.append((key, node))
        log.info(
            "segment %s/%s: uploaded through %s (%d blocks), SEALED",
            up.log_id,
            up.segment_id,
            node,
            len(sealed.block_keys),
        )
        self._forget(key)

    def _stop_at_conflict(self, key: tuple[int, int], up: _Upload) -> None:
        """Every node of the segment's ensemble found a conflicting copy, or lacks entries of it:
        stop (the module doc)."""
        try:
            name = up.meta.get_log_by_id(up.log_id).name
        except Exception:  # noqa: BLE001 - the metric then names the log by its id
            name = str(up.log_id)
        answers = [*up.conflicted, *sorted(up.incomplete)]
        errors = "; ".join(f"{node}: {up.errors[node]}" for node in answers)
        log.error(
            "segment %s/%s of log %r: not uploaded, and not tried again: object storage holds "
            "a copy of it under sealed/%s/%s/ that conflicts with the entries of its ensemble's "
            "nodes (those that hold them all: %s). It stays COMPLETED and its nodes keep their "
            "copies. Find which copy is right, then move those objects aside: the next writer "
            "to open the log uploads it",
            up.log_id,
            up.segment_id,
            name,
            up.log_id,
            up.segment_id,
            errors,
        )
        # logged first, then stopped and no longer pending in one step: whoever sees it in
        # `conflicts` sees it pending no more, and its error already logged
        with self._lock:
            self.conflicts[key] = (name, errors)
            self._stopped_for[key] = up.epoch
            self._forget_locked(key)

    def _again(self, key: tuple[int, int]) -> None:
        """On the timer thread: queue the next attempt (short: the timer must not block)."""
        if not self._scheduler.submit(QUEUE, self._attempt, key):
            self._forget(key)

    @staticmethod
    def _record_sealed(meta: MetadataStore, seg: SegmentMeta) -> None:
        """COMPLETED -> SEALED, whichever writer's epoch is current: the upload holds the end the
        record holds, which no writer changes once COMPLETED."""
        current: SegmentMeta | None = seg
        while current is not None and current.state is SegmentState.COMPLETED:
            try:
                meta.update_segment(None, dataclasses.replace(current, state=SegmentState.SEALED))
                return
            except MetadataConflictError:  # changed meanwhile (its size recorded): look again
                current = meta.get_segment(seg.log_id, seg.segment_id)
