"""The history checker: judges a log against every write attempt made on it (docs/semantics.md).

Record every attempt while a drill runs (its key, payload, start and end time, and its outcome),
read the whole log back, then `History.check` lists every violation it can prove:

    history = History(clock)                  # the clock the writer uses (default: the wall clock)
    start = history.now()
    try:
        result = writer.write(payload, idempotency_id="order-7")
    except WoodpeckerError as exc:
        history.failed(explicit_key("order-7"), payload, exc, start)
    else:
        history.ok(explicit_key("order-7"), payload, result, start)
    verdict = history.check_log(log, window_ms, window_max_keys)
    assert verdict.ok, verdict.summary()

(`history.call(key, payload, fn)` does the same in one line.) `check_log` judges the entries the
log's nodes store, read around the LogReader (`store.py`), so a reader bug cannot hide a
violation; it also holds a LogReader's read of the log to those entries. `check(messages, ...)`
judges any list of messages. A plain write is recorded with key
None. The attempts' own times decide what happened before what; the timestamps the log stores are
themselves checked against them, never trusted. The rules are in `rules.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...clock import SYSTEM_CLOCK, Clock
from ...types import LogMessage, LogMessageId, WriteResult

if TYPE_CHECKING:
    from .store import RawSource

NEVER = 2**62  # a time later than any real one
UNKNOWN = -NEVER  # an unknown start: the attempt may have begun at any time before its end


@dataclass(frozen=True, slots=True)
class Stamp:
    """One moment, read twice: `ms` on the writer's clock (window ages, entry timestamps) and
    `ns` on `time.monotonic_ns()` (what happened before what, across threads and processes of one
    machine; a ManualClock that stands still cannot tell)."""

    ms: int
    ns: int


UNKNOWN_START = Stamp(UNKNOWN, UNKNOWN)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One write call. `message_id` is set iff it was acknowledged. `timed_out`: it failed by
    waiting too long, so its entry, if any, was still pending when it ended (docs/semantics.md)."""

    key: bytes | None  # None: a plain write (no idempotency key)
    payload: bytes
    start: Stamp
    end: Stamp
    message_id: LogMessageId | None = None
    duplicate: bool | None = None
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.message_id is not None


# the kinds of problem; every problem text starts with one of them
LOST = "lost"
WRONG_ID = "wrong id"
WRONG_PAYLOAD = "wrong payload"
CREATED_TWICE = "created twice"
STALE_ID = "stale id"
DUPLICATE = "duplicate in window"
UNKEYED_COPY = "unkeyed copy"
INVENTED = "invented entry"
TIMESTAMP = "timestamp"
REPLICAS = "replicas"  # the nodes' copies break the log's rules (store.py)
READER = "reader"  # a LogReader's read differs from the stored entries
KINDS = (
    LOST,
    WRONG_ID,
    WRONG_PAYLOAD,
    CREATED_TWICE,
    STALE_ID,
    DUPLICATE,
    UNKEYED_COPY,
    INVENTED,
    TIMESTAMP,
    REPLICAS,
    READER,
)


@dataclass
class Verdict:
    ok: bool
    problems: list[str]
    attempts: int
    acknowledged_keys: int
    entries: int
    keyed_entries: int
    duplicates_returned: int
    rewritten_after_window: int

    @property
    def kinds(self) -> set[str]:
        """The kinds of problem found (see KINDS)."""
        return {p.split(":", 1)[0] for p in self.problems}

    def summary(self) -> str:
        head = "PASS" if self.ok else f"FAIL ({len(self.problems)} problems)"
        text = (
            f"{head}: {self.attempts} attempts, {self.acknowledged_keys} keys acknowledged, "
            f"{self.entries} entries in the log, {self.duplicates_returned} duplicates "
            f"suppressed, {self.rewritten_after_window} keys rewritten after their window"
        )
        if self.problems:
            text += "\n  " + "\n  ".join(self.problems[:20])
        return text


@dataclass
class History:
    """Thread-safe record of write attempts; those recorded without an explicit `end` are in the
    order they ended. `clock` must be the clock the writer uses."""

    clock: Clock = SYSTEM_CLOCK
    attempts: list[Attempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> Stamp:
        return Stamp(self.clock.now_ms(), time.monotonic_ns())

    def ok(
        self,
        key: bytes | None,
        payload: bytes,
        result: WriteResult,
        start: Stamp | None = None,
        end: Stamp | None = None,
    ) -> None:
        """An acknowledged attempt. Without `start`, it may have begun at any time (weaker);
        without `end`, it ends now (see `_record`)."""
        self._record(
            lambda stamp: Attempt(
                key,
                bytes(payload),
                start or UNKNOWN_START,
                end or stamp,
                result.message_id,
                bool(result.duplicate),
            )
        )

    def failed(
        self,
        key: bytes | None,
        payload: bytes,
        error: BaseException | str,
        start: Stamp | None = None,
        end: Stamp | None = None,
        timed_out: bool | None = None,
    ) -> None:
        """A failed attempt: it may or may not have landed. A TimeoutError counts as timed out."""
        if timed_out is None:
            timed_out = isinstance(error, TimeoutError)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        done = bool(timed_out)
        self._record(
            lambda stamp: Attempt(
                key,
                bytes(payload),
                start or UNKNOWN_START,
                end or stamp,
                error=text,
                timed_out=done,
            )
        )

    def _record(self, make: Callable[[Stamp], Attempt]) -> None:
        """Stamp the end and append in one step under the lock: attempts recorded without an
        explicit `end` are then in the order they ended (by `Stamp.ns`), and a judgement (`check`
        copies the record under the lock) holds every attempt stamped before it began. Stamped
        outside the lock, an attempt ended before a judgement could still be missing from it,
        and its entry would be judged as written by nobody."""
        with self._lock:
            self.attempts.append(make(self.now()))

    def call(self, key: bytes | None, payload: bytes, fn: Callable[[], WriteResult]) -> WriteResult:
        """Run one write `fn()` and record it (exceptions are recorded and re-raised)."""
        start = self.now()
        try:
            result = fn()
        except Exception as exc:
            self.failed(key, payload, exc, start)
            raise
        self.ok(key, payload, result, start)
        return result

    def call_async(
        self, key: bytes | None, payload: bytes, fn: Callable[[], Future[WriteResult]]
    ) -> Future[WriteResult]:
        """Start one async write `fn()` (a `write_async`) and record it when its future ends,
        stamped with that moment: the checker trusts an attempt's end (an entry whose write
        timed out was still pending then), and an async write can end long before anybody
        reads its outcome. A call that raises before it returns a future is recorded and
        re-raised."""
        start = self.now()
        try:
            future = fn()
        except Exception as exc:
            self.failed(key, payload, exc, start)
            raise

        def ended(f: Future[WriteResult]) -> None:  # stamped now, when recorded (no `end`)
            if f.cancelled():
                self.failed(key, payload, "cancelled", start)
                return
            exc = f.exception()
            if exc is None:
                self.ok(key, payload, f.result(), start)
            else:
                self.failed(key, payload, exc, start)

        future.add_done_callback(ended)
        return future

    def check(
        self, messages: Iterable[LogMessage], window_ms: int, window_max_keys: int
    ) -> Verdict:
        with self._lock:
            attempts = list(self.attempts)
        return check_history(attempts, messages, window_ms, window_max_keys)

    def check_log(
        self,
        log: object,
        window_ms: int,
        window_max_keys: int,
        *,
        reader: bool = True,
        source: RawSource | None = None,
    ) -> Verdict:
        """Judge the entries `log` (a LogHandle) has on its nodes, read without a LogReader
        (`store.read_stored`) from `source` (default: its client's transport, whose `raw_read`
        reaches the nodes wherever they run). With `reader`, a LogReader's read of the whole log
        must return exactly those entries (call it once every writer is closed: a reader stops
        at the confirmed tail of an open segment)."""
        from .store import read_stored

        stored = read_stored(log.client, log, source)  # type: ignore[attr-defined]
        verdict = self.check(stored.messages, window_ms, window_max_keys)
        extra = list(stored.problems)
        if reader:
            read = list(log.open_reader())  # type: ignore[attr-defined]
            extra += reader_problems(stored.messages, read)
        if extra:
            verdict.problems[:0] = extra
            verdict.ok = False
        return verdict


def reader_problems(stored: list[LogMessage], read: list[LogMessage]) -> list[str]:
    """How a reader's read of a whole log differs from the entries its nodes store."""
    problems: list[str] = []
    by_id = {m.message_id: m for m in stored}
    shown = {m.message_id for m in read}
    for m in read:
        if m.message_id not in by_id:
            problems.append(
                f"{READER}: the LogReader returned {m.message_id}, which is not a committed "
                f"entry of the log"
            )
        elif m != by_id[m.message_id]:
            problems.append(
                f"{READER}: the LogReader returned {m.message_id} with other contents than "
                f"the nodes store"
            )
    missed = [m.message_id for m in stored if m.message_id not in shown]
    if missed:
        problems.append(
            f"{READER}: the LogReader skipped {len(missed)} committed entries, first {missed[0]}"
        )
    if len(shown) < len(read):
        problems.append(
            f"{READER}: the LogReader returned {len(read) - len(shown)} entries more than once"
        )
    elif not problems and [m.message_id for m in read] != [m.message_id for m in stored]:
        problems.append(f"{READER}: the LogReader returned the entries out of log order")
    return problems


def check_history(
    attempts: list[Attempt], messages: Iterable[LogMessage], window_ms: int, window_max_keys: int
) -> Verdict:
    """Judge `messages` (the whole log, in log order) against `attempts`."""
    from .rules import Judge

    return Judge(attempts, list(messages), window_ms, window_max_keys).verdict()
