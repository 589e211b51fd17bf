"""The one backoff helper: budget, stop event, retriable filter."""

from __future__ import annotations

import threading
import time

import pytest

from woodpecker_idem.retry import Backoff, retry_call


def test_delays_grow_and_are_capped() -> None:
    b = Backoff(initial_s=0.1, max_s=0.4)
    delays = [b.next_delay() for _ in range(6)]
    assert 0.05 <= delays[0] <= 0.1
    assert all(0.2 <= d <= 0.4 for d in delays[3:])


def test_budget_ends_the_loop() -> None:
    b = Backoff(initial_s=0.01, max_s=0.02, budget_s=0.1)
    started = time.monotonic()
    while b.wait():
        pass
    assert 0.09 <= time.monotonic() - started < 1.0


def test_stop_event_ends_the_wait_at_once() -> None:
    stop = threading.Event()
    b = Backoff(initial_s=10, max_s=10, stop=stop)
    threading.Timer(0.05, stop.set).start()
    started = time.monotonic()
    assert b.wait() is False
    assert time.monotonic() - started < 2


def test_retry_call_retries_only_what_is_retriable() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "ok"

    seen: list[int] = []
    out = retry_call(
        flaky,
        lambda e: isinstance(e, ConnectionError),
        Backoff(0.001, 0.002),
        lambda e, n: seen.append(n),
    )
    assert out == "ok" and len(calls) == 3 and seen == [1, 2]
    with pytest.raises(KeyError):
        retry_call(lambda: {}["x"], lambda e: isinstance(e, ConnectionError), Backoff(0.001))


def test_retry_call_raises_the_last_error_when_the_budget_is_spent() -> None:
    def down() -> None:
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError, match="still down"):
        retry_call(down, lambda e: True, Backoff(0.01, 0.02, budget_s=0.05))
