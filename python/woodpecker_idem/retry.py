"""The one backoff helper: every retry loop in the package (repair, recovery, snapshots, stores)
waits through a `Backoff`, so delays, jitter and give-up rules are the same everywhere.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Exponential backoff with jitter (half fixed, half random), capped at `max_s`.

    `budget_s` bounds the total time (None: no bound, e.g. background repair that retries until
    the writer is closed). `wait()` sleeps the next delay, or returns False when the budget is spent
    or `stop` is set, so a loop written with it always ends on close.
    """

    def __init__(
        self,
        initial_s: float = 0.05,
        max_s: float = 2.0,
        budget_s: float | None = None,
        stop: threading.Event | None = None,
    ):
        self.initial_s = initial_s
        self.max_s = max_s
        self.budget_s = budget_s
        self.stop = stop
        self.attempts = 0
        self.started = time.monotonic()

    def next_delay(self) -> float:
        self.attempts += 1
        cap = min(self.max_s, self.initial_s * (2 ** min(self.attempts - 1, 30)))
        return cap / 2 + random.uniform(0, cap / 2)

    def remaining(self) -> float | None:
        if self.budget_s is None:
            return None
        return self.budget_s - (time.monotonic() - self.started)

    def wait(self) -> bool:
        """Sleep before the next attempt; False means give up (budget spent or stopped)."""
        delay = self.next_delay()
        left = self.remaining()
        if left is not None:
            if left <= 0:
                return False
            delay = min(delay, left)
        if self.stop is not None:
            return not self.stop.wait(delay)
        time.sleep(delay)
        return True


def retry_call(
    fn: Callable[[], T],
    retriable: Callable[[BaseException], bool],
    backoff: Backoff,
    on_retry: Callable[[BaseException, int], None] | None = None,
) -> T:
    """Call `fn` until it returns, retrying exceptions `retriable` accepts while `backoff` lasts;
    the last exception is raised when it gives up."""
    while True:
        try:
            return fn()
        except Exception as exc:
            if not retriable(exc):
                raise
            if on_retry is not None:
                on_retry(exc, backoff.attempts + 1)
            if not backoff.wait():
                raise
