"""A stream of keyed writes against service-mode nodes under faults, and what the fault tests
judge it with (tests/e2e/test_service_faults.py and tests/e2e/test_staged_service.py): threads
that retry a failed key with the same idempotency id, as an application would, every attempt
recorded in a History; waits with a generous deadline (a guard against a hang, not a timing
claim)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable

from nodeserver import LogStoreNode

import woodpecker_idem as wp
from woodpecker_idem.errors import NodeUnavailableError
from woodpecker_idem.testing import History

WAIT_S = 120
WINDOW_MS, MAX_KEYS = 600_000, 100_000
WRITE_TIMEOUT_S = 5.0  # an outage shows as clear errors, not one write that waits for minutes


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def until_answers(client: wp.WoodpeckerClient, node: str) -> None:
    """The node serves this client again (the checker reads every replica through it)."""

    def answers() -> bool:
        try:
            client.transport.last_add_confirmed(node, 0, 0)
        except NodeUnavailableError:
            return False
        return True

    until(answers, f"node {node} answers")


class Stream:
    """`threads` threads writing keyed entries through one writer, one write at a time each: a
    new key per write, every fifth write again a key acknowledged before (a duplicate). A failed
    write (retriable) is tried again with the same key until acknowledged; every attempt is in
    `history`. A non-retriable error ends the stream and is raised by `stop()`."""

    def __init__(self, writer: object, history: History, threads: int, name: str = "k"):
        self._writer = writer
        self.history = history
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.acked = 0
        self.errors: Counter[str] = Counter()
        self.fatal: list[BaseException] = []
        self.last_start_ns = 0  # when the latest attempt began (time.monotonic_ns)
        self._name = name
        self._threads = [
            threading.Thread(target=self._run, name=f"stream-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _write(self, key: str) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.last_start_ns = time.monotonic_ns()
            try:
                self.history.call(
                    wp.explicit_key(key),
                    key.encode(),
                    lambda: self._writer.write(  # type: ignore[attr-defined]
                        key.encode(), idempotency_id=key, timeout=WRITE_TIMEOUT_S
                    ),
                )
            except wp.WoodpeckerError as exc:
                with self._lock:
                    self.errors[type(exc).__name__] += 1
                if not exc.retriable:
                    raise
                time.sleep(0.05)
                continue
            with self._lock:
                self.acked += 1
            return

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                i = next(self._ids)
                self._write(f"{self._name}{i}")
                if i % 5 == 4:
                    self._write(f"{self._name}{i - 3}")  # acknowledged before: a duplicate
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.fatal.append(exc)

    def acked_now(self) -> int:
        with self._lock:
            return self.acked

    def until_acked(self, n: int, what: str) -> None:
        until(lambda: self.acked_now() >= n or bool(self.fatal), what)
        assert not self.fatal, self.fatal

    def stop(self) -> None:
        """Stop and wait for every thread: each write under way ends (acknowledged or failed)."""
        self._stop.set()
        for t in self._threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in self._threads), "a write never ended"
        assert not self.fatal, self.fatal


def attempts_between(history: History, after_ns: int, before_ns: int) -> list:
    """Attempts that began after `after_ns` and ended before `before_ns`."""
    return [a for a in history.attempts if a.start.ns > after_ns and a.end.ns < before_ns]


def new_acked(attempts: list) -> list:
    """The attempts that stored a new entry (a duplicate is answered from the writer's window,
    without any node: one may be acknowledged in an outage)."""
    return [a for a in attempts if a.ok and not a.duplicate]


def judge(history: History, log: object) -> None:
    verdict = history.check_log(log, WINDOW_MS, MAX_KEYS)
    assert verdict.ok, verdict.summary()


def start_all(nodes: list[LogStoreNode]) -> list[LogStoreNode]:
    started: list[LogStoreNode] = []
    try:
        for node in nodes:
            started.append(node.start())
    except BaseException:
        for node in started:
            node.stop()
        raise
    return nodes
