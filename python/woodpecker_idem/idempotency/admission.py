"""Admission: how the idempotent writer turns queued writes into entries.

A write is judged against the dedup window as of the time it was queued, in queueing order:
a key committed in the window is answered at once when no write is queued ahead of it;
otherwise the write waits in the intake (intake.py) and is admitted with the writes queued with
it, in one window pass (`reserve_many`) and one encoding call, then handed to the writer core's
one enqueue path. Every method runs with the core's lock held.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from .._core import DedupWindow, encode_frame
from ..client.futures import FutureRun
from ..client.hooks import Outcomes
from ..client.interrupts import HOLD_INTERRUPTS
from ..client.segment import SegmentHandle
from ..client.workers import resolve
from ..client.writer import LogWriter
from ..clock import Clock
from ..errors import WoodpeckerError
from ..types import LogMessageId, WriteResult
from .intake import ADMIT_AT, ADMIT_MIN, OVERHEAD, Intake, IntakeBatch

_new = tuple.__new__


def i64_at(column: bytes, i: int) -> int:
    """Value `i` of a little-endian int64 column (as `DedupWindow.reserve_many` returns)."""
    return int.from_bytes(column[8 * i : 8 * i + 8], "little", signed=True)


class Admission:
    """The intake of queued writes and their admission into the core, judged by the window."""

    def __init__(self, core: LogWriter, window: DedupWindow, clock: Clock, intake: Intake):
        self._core = core
        self._window = window
        self._clock = clock
        self.intake = intake
        self.duplicates = 0  # writes answered with an existing entry (committed or joined)
        self._next_evict_ms = 0
        self._evict_every_ms = max(1, min(1000, window.window_ms // 100))

    def committed_locked(self, key: bytes) -> WriteResult | None:
        """The original result if `key` is committed in the window and no write is queued ahead
        of this one (an earlier queued write of the same key must be judged first, DESIGN.md
        1.1); then the write needs neither the intake nor the nodes."""
        self._core.check_open_locked()
        if self.intake.futures:
            return None
        hit = self._window.get(key, self._clock.now_ms())
        if hit is None or not hit.committed:
            return None
        self.duplicates += 1
        # tuple.__new__: a NamedTuple's own __new__ costs a microsecond on this 5 us path
        return _new(WriteResult, (_new(LogMessageId, (hit.segment_id, hit.entry_id)), True))

    def queue_locked(
        self,
        payload: bytes,
        props: dict | None,
        ident: str | bytes | None,
        future: Future,
        key: bytes | None = None,
    ) -> list | None:
        """Queue one write; its key is `key` if given (computed already), else that of `ident`
        (an explicit id), else the payload's. Returns the outcomes to set after the lock."""
        core = self._core
        intake = self.intake
        futures = intake.futures
        if not futures:  # queued writes were checked: a close or fence empties the intake
            core.check_open_locked()
        size = len(payload) + OVERHEAD
        early = None
        rows, held = len(futures), False
        try:  # the queued writes count against the in-flight limits with this one
            if core.inflight.full_locked(size + intake.nbytes, rows + 1):
                if futures:  # room comes from commits: queued writes must be entries first
                    early = self._admit_locked()
                core.wait_for_room_locked(size)  # raises once closed or fenced
                # The wait released the lock: other producers queued writes and admitted them
                # (an admission replaces the intake's columns). Read the intake anew, or this
                # write's future goes into a list that already left as a batch.
                futures = intake.futures
                rows = len(futures)
            if not futures:
                intake.since = time.monotonic()
            intake.timestamps.append(self._clock.now_ms())
            intake.payloads.append(payload)
            intake.properties.append(props)
            futures.append(future)
            intake.nbytes += size
            held = True
            # Last: a row is queued once its key is in the pipe.
            pipe = intake.pipe
            if key is not None:
                pipe.push_key(key)
            elif ident is None:
                pipe.push(payload)
            else:
                pipe.push_id(ident)  # a bad id raises here
        except BaseException:  # closed or fenced, a bad id, or Ctrl-C between two steps
            if len(intake.pipe) == rows:  # the key never went in: nothing of it stays queued
                intake.trim()
                if held:
                    intake.nbytes -= size
            if early:  # the caller gets the exception, not these outcomes: set them once its
                # lock is released (their writes were accepted; their callers wait on them)
                threading.Thread(target=resolve, args=(early,), daemon=True).start()
            raise
        n = len(futures)
        if n == 1:  # (more queued: the first one's call judged whether anything was in flight)
            if core.segments.idle_locked():  # nothing in flight: no company to wait for
                resolved = self._admit_locked()
                return early + resolved if early else resolved
            core.wake_locked()  # the flusher admits it after linger_ms unless an ack comes first
        elif n >= ADMIT_AT and not n & 15:
            ready = intake.pipe.ready_count()
            if ready >= ADMIT_MIN:
                resolved = self._admit_locked(ready)
                return early + resolved if early else resolved
        return early

    def admit_all_locked(self) -> Outcomes:
        """Admit every queued write now (flush, close)."""
        return self._admit_locked() if self.intake.futures else []

    def admit_locked(self, idle: bool) -> tuple[Outcomes, float | None]:
        """Admit every queued write if nothing is in flight in the current segment (`idle`: an
        ack just came) or the oldest has waited linger_ms; returns the outcomes to set after the
        lock and the seconds until the queued writes are due (None: nothing queued)."""
        if not self.intake.futures:
            return [], None
        if not idle:
            due = self.intake.since + self._core.linger_s - time.monotonic()
            if due > 0:
                return [], due
        return self._admit_locked(), None

    def _admit_locked(self, count: int | None = None) -> list:
        """Give the oldest `count` queued writes (all by default) their ids; returns the outcomes
        to set after the lock."""
        resolved: list = []
        core = self._core
        with HOLD_INTERRUPTS:  # taken off the intake and made entries, or neither
            batch = self.intake.take(count)
            try:
                core.check_open_locked()
            except WoodpeckerError as exc:  # fenced or closed: nobody will send them
                return [(f, exc) for f in batch.futures]
            self._assign_locked(batch, resolved)
        return resolved

    def _assign_locked(self, batch: IntakeBatch, resolved: list) -> None:
        stamps, keys = batch.timestamps, batch.keys
        window = self._window
        self.evict_due_locked(stamps[0])
        n = len(stamps)
        start = 0
        core = self._core
        while start < n:
            try:
                seg = core.segments.writable_locked()
            except WoodpeckerError as exc:  # a roll failed (fenced, metadata unreachable): these
                resolved.extend((f, exc) for f in batch.futures[start:])  # writes end with it
                return
            if seg is None:  # repairing: duplicates are still answered, new writes fail fast
                for i in range(start, n):
                    key = keys[16 * i : 16 * i + 16]
                    self._admit_one_unavailable_locked(batch.futures[i], key, stamps[i], resolved)
                return
            end = core.segments.run_end_locked(seg, batch.payloads, start, n)  # a batch, in seg
            status, seg_col, ent_col = window.reserve_many(
                keys[16 * start : 16 * end], stamps[start:end], seg.segment_id, seg.next_entry_id
            )
            self._enqueue_locked(seg, batch, start, end, status, seg_col, ent_col, resolved)
            start = end

    def _enqueue_locked(
        self,
        seg: SegmentHandle,
        batch: IntakeBatch,
        start: int,
        end: int,
        status: bytes,
        seg_col: bytes,
        ent_col: bytes,
        resolved: list,
    ) -> None:
        """Rows start..end of an admitted batch (one AddEntries batch at most), judged by the
        window: new ones become one run (one encoding call, the core's one enqueue path),
        duplicates are answered or joined."""
        futures = (
            batch.futures if start == 0 and end == len(batch.futures) else batch.futures[start:end]
        )
        frame, count = encode_frame(
            seg.segment_id,
            seg.next_entry_id,
            batch.timestamps,
            batch.payloads,
            start,
            end,
            batch.keys,
            status,
            batch.properties,
        )
        duplicates = count != len(futures)
        if duplicates:
            new_futures = [futures[i] for i, code in enumerate(status) if not code]
        else:  # the common case
            new_futures = futures
        if count:
            waiter = new_futures[0] if count == 1 else FutureRun(new_futures)
            self._core.inflight.enqueue_run_locked(seg, frame, count, waiter, batch.since)
        if duplicates:  # after the new entries: a row may join one made by an earlier row
            for i, code in enumerate(status):
                if code == 1:
                    self._join_locked(i64_at(seg_col, i), i64_at(ent_col, i), futures[i])
                elif code == 2:
                    self.duplicates += 1
                    mid = LogMessageId(i64_at(seg_col, i), i64_at(ent_col, i))
                    resolved.append((futures[i], WriteResult(mid, True)))

    def evict_due_locked(self, now_ms: int) -> None:
        """Evict expired keys every so often (lookups ignore expired keys in between)."""
        if now_ms >= self._next_evict_ms:
            self._window.evict(now_ms)
            self._next_evict_ms = now_ms + self._evict_every_ms

    def _admit_one_unavailable_locked(self, future, key: bytes, ts: int, resolved) -> None:
        hit = self._window.get(key, ts)
        if hit is None:
            resolved.append((future, self._core.unavailable_error()))
        elif hit.committed:
            self.duplicates += 1
            mid = LogMessageId(hit.segment_id, hit.entry_id)
            resolved.append((future, WriteResult(mid, True)))
        else:
            self._join_locked(hit.segment_id, hit.entry_id, future)

    def _join_locked(self, segment_id: int, entry_id: int, future: Future) -> None:
        self._core.segments.join_locked(segment_id, entry_id, future)
        self.duplicates += 1
