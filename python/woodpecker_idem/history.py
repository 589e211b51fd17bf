"""The history checker: judges a log against every write attempt made on it (DESIGN.md 1 and 1.1).

Record each attempt (key, outcome, returned id), read the whole log back, then `check` asserts:
- no key appears twice while its first entry is still in the window (same rule as the writer:
  committed, `now - timestamp_ms < window_duration`, among the newest `window_max_keys` keys);
- every acknowledged attempt's id holds an entry with that attempt's key (nothing acknowledged lost,
  and every retry got the original id);
- every entry in the log comes from some attempt (nothing invented).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from .types import LogMessage, LogMessageId, WriteResult


@dataclass(frozen=True, slots=True)
class Attempt:
    key: bytes
    ok: bool
    message_id: LogMessageId | None = None
    duplicate: bool | None = None
    error: str | None = None


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
    """Thread-safe record of write attempts."""

    attempts: list[Attempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ok(self, key: bytes, result: WriteResult) -> None:
        with self._lock:
            self.attempts.append(Attempt(key, True, result.message_id, result.duplicate))

    def failed(self, key: bytes, error: BaseException) -> None:
        with self._lock:
            self.attempts.append(Attempt(key, False, error=f"{type(error).__name__}: {error}"))

    def check(
        self, messages: Iterable[LogMessage], window_ms: int, window_max_keys: int
    ) -> Verdict:
        return check_history(self.attempts, messages, window_ms, window_max_keys)


def check_history(
    attempts: list[Attempt], messages: Iterable[LogMessage], window_ms: int, window_max_keys: int
) -> Verdict:
    problems: list[str] = []
    by_id: dict[LogMessageId, LogMessage] = {}
    last_seen: dict[bytes, tuple[int, int, LogMessageId]] = {}  # key -> (commit index, ts, id)
    rewritten = 0
    keyed = 0
    count = 0
    for msg in messages:
        by_id[msg.message_id] = msg
        count += 1
        key = msg.idempotency_key
        if not key:
            continue
        keyed += 1
        prev = last_seen.get(key)
        if prev is not None:
            index, ts, first_id = prev
            in_window = msg.timestamp_ms - ts < window_ms and keyed - 1 - index <= window_max_keys
            if in_window:
                problems.append(
                    f"key {key.hex()} appears at {first_id} and again at "
                    f"{msg.message_id}, {msg.timestamp_ms - ts} ms later (in window)"
                )
            else:
                rewritten += 1
        last_seen[key] = (keyed - 1, msg.timestamp_ms, msg.message_id)

    attempted = {a.key for a in attempts}
    acknowledged = set()
    duplicates = 0
    for a in attempts:
        if not a.ok:
            continue
        acknowledged.add(a.key)
        duplicates += bool(a.duplicate)
        found = by_id.get(a.message_id) if a.message_id is not None else None
        if found is None:
            problems.append(
                f"key {a.key.hex()} was acknowledged at {a.message_id}, "
                f"which is not in the log (lost)"
            )
        elif found.idempotency_key != a.key:
            have = found.idempotency_key.hex() if found.idempotency_key else "no key"
            problems.append(
                f"key {a.key.hex()} was acknowledged at {a.message_id}, which holds {have}"
            )
    for key in last_seen:
        if key not in attempted:
            problems.append(f"key {key.hex()} is in the log but was never written")
    return Verdict(
        ok=not problems,
        problems=problems,
        attempts=len(attempts),
        acknowledged_keys=len(acknowledged),
        entries=count,
        keyed_entries=keyed,
        duplicates_returned=duplicates,
        rewritten_after_window=rewritten,
    )
