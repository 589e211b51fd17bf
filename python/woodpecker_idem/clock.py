"""One injectable clock, in milliseconds, that never goes backwards.

Entry timestamps and window ageing both read it, so tests can advance time without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall clock clamped to be non-decreasing (NTP steps back are absorbed, not replayed)."""

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        # Lock-free on purpose (it is on every write): a thread may store a slightly older
        # reading over a newer one, but it only ever returns its own reading or a larger one,
        # and each writer calls this under its own lock, so its timestamps never go back.
        now = time.time_ns() // 1_000_000
        last = self._last
        if now > last:
            self._last = now
            return now
        return last


class ManualClock:
    """A clock tests move by hand; refuses to go backwards like the real one."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise TypeError(f"advance takes whole milliseconds (an int), not {ms!r}")
        if ms < 0:
            raise ValueError(f"clock cannot go backwards (advance by {ms} ms)")
        with self._lock:
            self._now += ms
            return self._now


SYSTEM_CLOCK = SystemClock()
