"""Opening and rolling the writer's segments: where the next segment comes from (created in the
metadata store, or adopted if it is this writer's own whose create answer was lost) and when the
current one is full or old (segment.max_entries, segment.max_size_bytes, segment.max_interval_s).

The segment limits are targets, not bounds: if the metadata store cannot create the next segment,
writes go on in the current one and the roll is retried with backoff, so a metadata outage never
stops writes. `SegmentRoller` works on its writer only through `RollCore` (public names).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from typing import TYPE_CHECKING, Protocol

from ..errors import WriterFencedError
from ..meta.base import SegmentMeta
from ..retry import Backoff
from ..types import SegmentState
from .completion import RETRY_INITIAL_S, RETRY_MAX_S
from .hooks import Outcomes
from .recovery import choose_nodes
from .segment import SegmentHandle, SegmentStatus
from .workers import Maintenance, resolve

if TYPE_CHECKING:
    from ..clock import Clock
    from ..config import Config
    from ..logstore.transport import LogStoreTransport
    from ..meta import MetadataStore
    from .dispatch import Dispatch

log = logging.getLogger(__name__)


class RollCore(Protocol):
    """What `SegmentRoller` uses of its writer (`LogWriter` implements it; see there)."""

    log_id: int
    epoch: int
    clock: Clock
    metrics: dict[str, float]

    def open_segment_locked(self) -> SegmentHandle: ...

    def fence_locked(self, exc: WriterFencedError) -> Outcomes: ...

    def complete_if_drained_locked(self, seg: SegmentHandle) -> None: ...


class SegmentRoller:
    """The roll rule of one writer, and its backoff after a refused roll."""

    def __init__(
        self,
        core: RollCore,
        cfg: Config,
        *,
        meta: MetadataStore,
        transport: LogStoreTransport,
        dispatch: Dispatch,
        maint: Maintenance,
    ):
        self._core = core
        self._meta = meta
        self._transport = transport
        self._dispatch = dispatch
        self._maint = maint
        self._log_id = core.log_id
        self._es = cfg.quorum.es
        self._max_entries = cfg.segment.max_entries
        self._max_bytes = cfg.segment.max_size_bytes
        self._max_age_s = cfg.segment.max_interval_s
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        self._retry_at = 0.0  # after a failed roll: not retried before this (monotonic)

    def needs_roll(self, seg: SegmentHandle, now: float) -> bool:
        """`seg` is full or old (`now`: time.monotonic()). On the write path: kept flat."""
        return (
            seg.next_entry_id >= self._max_entries
            or seg.size_bytes >= self._max_bytes
            or now - seg.created >= self._max_age_s
        )

    def room(self, seg: SegmentHandle) -> tuple[int, int]:
        """(entries, bytes) `seg` takes before its roll limits; <= 0 once past them."""
        return self._max_entries - seg.next_entry_id, self._max_bytes - seg.size_bytes

    def next_segment_locked(self, known: Container[int]) -> SegmentMeta:
        """The next segment of the log, ACTIVE in the metadata store (`known`: the ids this writer
        has handles for). Raises what the metadata store raises (`WriterFencedError` included)."""
        core = self._core
        existing = self._meta.list_segments(self._log_id)
        last = existing[-1] if existing else None
        segment_id = (last.segment_id + 1) if last else 0
        es = self._es
        if last and last.state is SegmentState.ACTIVE and last.segment_id not in known:
            # An ACTIVE segment this writer has no handle for: its own create whose answer was
            # lost (a metadata timeout). Only the current epoch can create one, so if this writer
            # still holds it, the segment is its own, and empty: adopt it, or readers would wait
            # at it for good. (A WriterFencedError is handled by the caller.)
            self._meta.check_epoch(self._log_id, core.epoch)
            return last
        return self._meta.create_segment(
            core.epoch,
            SegmentMeta(
                log_id=self._log_id,
                segment_id=segment_id,
                state=SegmentState.ACTIVE,
                nodes=choose_nodes(self._transport.node_ids, es, segment_id),
                es=es,
                wq=es,
                aq=es // 2 + 1,
                created_ms=core.clock.now_ms(),
            ),
        )

    def roll_locked(self, seg: SegmentHandle) -> SegmentHandle:
        """`seg`, the current segment, is full or old (`needs_roll`): the segment writes go to
        now, the next one, or `seg` while the next cannot be opened (retried with backoff); `seg`
        completes once drained. A roll refused because another writer took the log over fences
        this writer (`WriterFencedError` raised)."""
        core = self._core
        now = time.monotonic()
        if now < self._retry_at:
            return seg
        try:
            new = core.open_segment_locked()
        except WriterFencedError as exc:
            self._maint.submit(resolve, core.fence_locked(exc))  # not under the lock
            raise
        except Exception as exc:
            self._retry_at = now + self._backoff.next_delay()
            core.metrics["background_retries"] += 1
            log.warning(
                "log %s: could not roll segment %s (writes go on in it, retried in %.2f s): %s",
                self._log_id,
                seg.segment_id,
                self._retry_at - now,
                exc,
            )
            return seg
        self._backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        seg.status = SegmentStatus.ROLLED
        if seg.drained():
            core.complete_if_drained_locked(seg)
        else:
            self._dispatch.send_locked(seg)  # its held entries need not wait for company any more
        core.metrics["segments_rolled"] += 1
        return new
