"""Retention: which completed segments of a log may go, by age and by size, and truncating them.

A log grows for ever unless something truncates it. `retention.max_age_s` and
`retention.max_bytes` bound it: the oldest segments go first, whole segments only, and only
completed ones (an active segment is still being written). One rule overrides both: a segment
whose newest entry is still inside the idempotency window (completed after `now -
idempotency.window_duration_s`) is kept, whatever its age or the log's size, so retention never
removes an entry a retry could still be deduplicated against. A log whose window is longer than
`max_age_s` therefore keeps a window's worth; a log over `max_bytes` within the window stays over
until its segments leave the window.

Named readers (`open_reader(name=...)`) hold the age rule back too: a segment holding an entry at
or after the lowest committed position of the log's named readers is kept, so a slow consumer
loses nothing it has not committed. `max_bytes` is the operator's hard bound and overrides them
(as an explicit `truncate` does): the reader's next read then raises `EntryTruncatedError`. A
reader that is gone for good holds the log until its name is deleted (`LogHandle.delete_reader`,
`woodpecker-idem readers delete`).

`plan` is the decision (pure: segments and times in, a truncation point out); `apply` makes it
with `LogHandle.truncate`. `RetentionRunner` applies the configured policy (or a log's own,
`WoodpeckerClient.set_retention`) in the background to every log the client writes, with the
longest window over the log (a writer's own may be longer than the config's) as the floor, and
`woodpecker-idem truncate --older-than` applies the age rule once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import WoodpeckerError
from .meta.base import SegmentMeta
from .types import LogMessageId, SegmentState

if TYPE_CHECKING:
    from .client.log import LogHandle
    from .config import Config

log = logging.getLogger(__name__)

_DONE = (SegmentState.COMPLETED, SegmentState.SEALED)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """`max_age_ms` / `max_bytes`: None (or 0 in the config) means no bound of that kind."""

    max_age_ms: int | None = None
    max_bytes: int | None = None

    @classmethod
    def from_config(cls, config: Config) -> RetentionPolicy:
        r = config.retention
        age = int(r.max_age_s * 1000) if r.max_age_s else None
        return cls(age, int(r.max_bytes) or None)

    @property
    def enabled(self) -> bool:
        return self.max_age_ms is not None or self.max_bytes is not None

    def override(self, max_age_s: float | None, max_bytes: int | None) -> RetentionPolicy:
        """This policy with a log's own bounds (None: keep this one's; 0: no bound)."""
        age = self.max_age_ms if max_age_s is None else (int(max_age_s * 1000) or None)
        size = self.max_bytes if max_bytes is None else (max_bytes or None)
        return RetentionPolicy(age, size)


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """The segments to drop (oldest first) and the truncation point that drops them."""

    drop: tuple[SegmentMeta, ...]
    truncate_to: LogMessageId | None  # None: nothing to drop
    kept_for_window: int  # segments a bound would have dropped but the window keeps
    kept_for_readers: int = 0  # segments the age bound would have dropped but a reader needs

    @property
    def bytes_dropped(self) -> int:
        return sum(s.size_bytes for s in self.drop)


def plan(
    segments: Sequence[SegmentMeta],
    now_ms: int,
    window_floor_ms: int,
    policy: RetentionPolicy,
    readers_at: LogMessageId | None = None,
) -> RetentionPlan:
    """What `policy` drops of a log with these segments (ordered by id) at `now_ms`.

    A segment may be dropped only if it and every segment before it are completed and it was
    completed at or before `window_floor_ms` (now minus the idempotency window): its entries are
    all older than the window. Among those, it is dropped if it was completed at or before `now -
    max_age` or if the log's live bytes exceed `max_bytes` before it goes. `readers_at`, the
    lowest committed position of the log's named readers, keeps a segment holding an entry at or
    after it from the age rule (not from `max_bytes`)."""
    live = [s for s in segments if s.state is not SegmentState.TRUNCATED]
    total = sum(s.size_bytes for s in live)
    drop: list[SegmentMeta] = []
    kept_for_window = kept_for_readers = 0
    for seg in live:
        if seg.state not in _DONE:
            break  # the active segment, and everything after it, stays
        too_old = policy.max_age_ms is not None and seg.completed_ms <= now_ms - policy.max_age_ms
        too_big = policy.max_bytes is not None and total > policy.max_bytes
        if not (too_old or too_big):
            break
        if seg.completed_ms > window_floor_ms:
            kept_for_window = _would_drop(live, seg, now_ms, policy, total)
            break
        needed = readers_at is not None and LogMessageId(seg.segment_id, seg.last_entry_id) >= (
            readers_at
        )
        if needed and not too_big:
            kept_for_readers = _would_drop(live, seg, now_ms, policy, total)
            break
        drop.append(seg)
        total -= seg.size_bytes
    if not drop:
        return RetentionPlan((), None, kept_for_window, kept_for_readers)
    after = [s for s in live if s.segment_id > drop[-1].segment_id]
    first_kept = after[0].segment_id if after else drop[-1].segment_id + 1
    return RetentionPlan(
        tuple(drop), LogMessageId(first_kept, 0), kept_for_window, kept_for_readers
    )


def _would_drop(
    live: list[SegmentMeta], first: SegmentMeta, now_ms: int, policy: RetentionPolicy, total: int
) -> int:
    """How many segments from `first` on the bounds alone would drop (for the report)."""
    n = 0
    for seg in live:
        if seg.segment_id < first.segment_id:
            continue
        if seg.state not in _DONE:
            break
        too_old = policy.max_age_ms is not None and seg.completed_ms <= now_ms - policy.max_age_ms
        too_big = policy.max_bytes is not None and total > policy.max_bytes
        if not (too_old or too_big):
            break
        n += 1
        total -= seg.size_bytes
    return n


def window_floor_ms(handle: LogHandle, now_ms: int) -> int:
    """Now minus the configured idempotency window: entries completed after it may be in one."""
    return now_ms - int(handle.client.config.idempotency.window_duration_s * 1000)


def apply(
    handle: LogHandle,
    policy: RetentionPolicy,
    now_ms: int | None = None,
    window_floor: int | None = None,
) -> RetentionPlan:
    """Apply `policy` to one log now: truncate before the first segment it keeps. `now_ms`
    defaults to the client's clock, `window_floor` to now minus `idempotency.window_duration_s`
    (pass a writer's own window floor if it was opened with a longer window)."""
    now = handle.client.clock.now_ms() if now_ms is None else now_ms
    floor = window_floor_ms(handle, now) if window_floor is None else window_floor
    readers = handle.client.meta.list_readers(handle.log_id)
    readers_at = min((r.position for r in readers), default=None)
    result = plan(handle.segments(), now, floor, policy, readers_at)
    if result.truncate_to is not None:
        handle.truncate(result.truncate_to)
        log.info(
            "log %r: retention dropped %d segments (%d bytes), truncated to %s",
            handle.name,
            len(result.drop),
            result.bytes_dropped,
            result.truncate_to,
        )
    if result.kept_for_readers:
        slowest = min(readers, key=lambda r: r.position)
        log.info(
            "log %r: retention keeps %d segments a named reader has not committed past "
            "(%r at %s; delete_reader drops a reader that is gone for good)",
            handle.name,
            result.kept_for_readers,
            slowest.name,
            slowest.position,
        )
    if result.kept_for_window:
        log.debug(
            "log %r: retention keeps %d segments still inside the idempotency window",
            handle.name,
            result.kept_for_window,
        )
    return result


def age_cutoff(segments: Iterable[SegmentMeta], older_than_ms: int, now_ms: int) -> LogMessageId:
    """The truncation point that drops every completed segment (a prefix) completed at or before
    `now_ms - older_than_ms`: the `truncate --older-than` rule, with no window floor (a manual
    truncation keeps the window's keys aside instead, see `LogHandle.truncate`)."""
    policy = RetentionPolicy(max_age_ms=older_than_ms)
    result = plan(list(segments), now_ms, now_ms, policy)
    return result.truncate_to or LogMessageId(0, 0)


class RetentionRunner:
    """Applies a client's retention policy every `interval_s` to each log it has a live writer
    for (only the writer's process truncates, so two clients never race on one log)."""

    def __init__(
        self,
        policy: RetentionPolicy,
        interval_s: float,
        handles: Callable[[], list[LogHandle]],
        policy_of: Callable[[LogHandle], RetentionPolicy] | None = None,
        window_ms_of: Callable[[LogHandle], int] | None = None,
    ):
        self.policy = policy  # the config's; `policy_of` gives a log's own (client.set_retention)
        self.interval_s = interval_s
        self._handles = handles
        self._policy_of = policy_of or (lambda handle: policy)
        # the longest dedup window over the log (a writer may be opened with a longer one than
        # the config's): nothing completed within it is dropped
        self._window_ms_of = window_ms_of
        self.runs = 0
        self.segments_dropped = 0
        self.failures = 0
        # per log name, for the metrics: segments and bytes dropped, failed passes
        self.dropped: dict[str, tuple[int, int]] = {}
        self.failed: dict[str, int] = {}
        self._failing = 0  # failed passes in a row
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wp-retention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # a pass at once: a short-lived writer (a Spark task) may close before the interval ends
        while not self._stop.is_set():
            self.run_once()
            if self._stop.wait(self.interval_s):
                return

    def run_once(self) -> None:
        for handle in self._handles():
            if self._stop.is_set():
                return
            policy = self._policy_of(handle)
            if not policy.enabled:
                continue
            try:
                now = handle.client.clock.now_ms()
                floor = None if self._window_ms_of is None else now - self._window_ms_of(handle)
                result = apply(handle, policy, now, floor)
            except Exception as exc:  # storage down (or a bug): try again next time
                self.failures += 1
                self.failed[handle.name] = self.failed.get(handle.name, 0) + 1
                # once per outage: a warning every interval for its whole length is noise
                report = log.warning if self._failing == 0 else log.debug
                self._failing += 1
                report(
                    "log %r: retention failed (%s: %s); retrying every %g s",
                    handle.name,
                    type(exc).__name__,
                    exc,
                    self.interval_s,
                    exc_info=not isinstance(exc, WoodpeckerError),
                )
                continue
            self._failing = 0
            if result.drop:
                self.segments_dropped += len(result.drop)
                n, nbytes = self.dropped.get(handle.name, (0, 0))
                self.dropped[handle.name] = (n + len(result.drop), nbytes + result.bytes_dropped)
        self.runs += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(30)


__all__ = [
    "RetentionPlan",
    "RetentionPolicy",
    "RetentionRunner",
    "age_cutoff",
    "apply",
    "plan",
    "window_floor_ms",
]
