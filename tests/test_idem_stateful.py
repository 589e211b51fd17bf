"""Random schedules of writes, retries, faults, crashes and time, judged by the history checker.

A hypothesis RuleBasedStateMachine drives one idempotent writer on an in-process quorum (es=1, and
es=3/aq=2): writes of keys from a small pool (sync and write_async bursts), retries of failed keys,
lost acks, node failures and heals, writer crash + takeover (abandon, open_writer), snapshots and
ManualClock advances (some past the window). Every attempt is recorded in a History; teardown heals
everything, lets a plain writer complete every segment and checks the verdict over the whole log.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import woodpecker_idem as wp
from woodpecker_idem import (
    ManualClock,
    QuorumUnavailableError,
    SegmentClosedError,
    WriterFencedError,
    WriteTimeoutError,
    explicit_key,
)
from woodpecker_idem.errors import NodeUnavailableError
from woodpecker_idem.history import History
from woodpecker_idem.logstore.transport import FaultInjectingTransport

KEYS = [f"key-{i}" for i in range(6)]
WINDOW_MS = 5_000
EXPECTED = (
    WriteTimeoutError,
    SegmentClosedError,
    QuorumUnavailableError,
    TimeoutError,
    concurrent.futures.TimeoutError,
)
WAIT_S = 0.5  # how long one attempt waits for its outcome


class IdempotencyMachine(RuleBasedStateMachine):
    ES = 1
    MAX_KEYS = 4

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="wp-stateful-")
        self.clock = ManualClock()
        self.client = wp.connect(
            self.dir,
            {
                "quorum.es": self.ES,
                "append.timeout_ms": 300,
                "append.max_retries": 2,
                "append.linger_ms": 1,
                "idempotency.snapshot_interval_s": 0.3,
                "idempotency.snapshot_threshold": 8,
            },
            clock=self.clock,
        )
        self.faults = FaultInjectingTransport(self.client.transport)
        self.client.transport = self.faults
        self.nodes = self.faults.node_ids
        self.down: set[str] = set()
        self.log = self.client.open_log("s", create=True)
        self.history = History()
        self.abandoned: list = []
        self.outstanding: list[tuple[bytes, concurrent.futures.Future]] = []
        self.failed_keys: set[str] = set()
        self.writer = self._open()

    # --- helpers -------------------------------------------------------------------------------

    def _open(self):
        for _ in range(20):
            try:
                return self.log.open_writer(
                    idempotent=True,
                    window_duration_s=WINDOW_MS / 1000,
                    window_max_keys=self.MAX_KEYS,
                )
            except (NodeUnavailableError, QuorumUnavailableError):
                time.sleep(0.05)  # a recovery copy's ack was lost: the takeover is retried
        self.faults.heal_all()
        self.down.clear()
        return self.log.open_writer(
            idempotent=True, window_duration_s=WINDOW_MS / 1000, window_max_keys=self.MAX_KEYS
        )

    def _record(self, name: str, fn) -> None:
        key = explicit_key(name)
        try:
            result = fn()
        except EXPECTED as exc:
            self.history.failed(key, exc)
            self.failed_keys.add(name)
            return
        except WriterFencedError as exc:  # only an abandoned writer may be fenced
            raise AssertionError(f"the live writer was fenced: {exc}") from exc
        self.history.ok(key, result)
        self.failed_keys.discard(name)

    # --- rules ---------------------------------------------------------------------------------

    @rule(name=st.sampled_from(KEYS))
    def write(self, name: str) -> None:
        self._record(
            name, lambda: self.writer.write(name.encode(), idempotency_id=name, timeout=WAIT_S)
        )

    @precondition(lambda self: self.failed_keys)
    @rule(data=st.data())
    def retry_failed(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.failed_keys)))
        self.write(name)

    @rule(names=st.lists(st.sampled_from(KEYS), min_size=2, max_size=8))
    def burst(self, names: list[str]) -> None:
        futures = []
        for name in names:
            try:
                futures.append(
                    (name, self.writer.write_async(b"b-" + name.encode(), idempotency_id=name))
                )
            except EXPECTED as exc:
                self.history.failed(explicit_key(name), exc)
        concurrent.futures.wait([f for _, f in futures], timeout=WAIT_S)  # one shared deadline
        for name, fut in futures:
            self._record(name, lambda f=fut: f.result(0))

    @rule(name=st.sampled_from(KEYS))
    def fire_and_forget(self, name: str) -> None:
        """A write_async whose outcome is judged only at teardown."""
        try:
            self.outstanding.append(
                (
                    explicit_key(name),
                    self.writer.write_async(b"f-" + name.encode(), idempotency_id=name),
                )
            )
        except EXPECTED as exc:
            self.history.failed(explicit_key(name), exc)

    @rule(node=st.integers(0, 2), count=st.integers(1, 4))
    def drop_acks(self, node: int, count: int) -> None:
        self.faults.drop_acks(self.nodes[node % len(self.nodes)], count)

    @precondition(lambda self: len(self.down) < len(self.nodes))
    @rule(node=st.integers(0, 2))
    def fail_node(self, node: int) -> None:
        n = self.nodes[node % len(self.nodes)]
        self.faults.fail_node(n)
        self.down.add(n)

    @precondition(lambda self: self.down)
    @rule(data=st.data())
    def heal_node(self, data) -> None:
        n = data.draw(st.sampled_from(sorted(self.down)))
        self.faults.heal_node(n)
        self.down.discard(n)

    @rule(ms=st.sampled_from([1, 50, 700, 2_000, WINDOW_MS - 1, WINDOW_MS + 1]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def snapshot(self) -> None:
        self.clock.advance(1)
        self.writer._snapshotter.write_now()

    @precondition(lambda self: len(self.down) <= self.ES - (self.ES // 2 + 1))  # fence quorum
    @rule()
    def crash_and_reopen(self) -> None:
        self.abandoned.append(self.writer)  # no close: in-flight writes are left as they are
        self.writer = self._open()

    # --- the verdict ---------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.faults.heal_all()
            self.down.clear()
            for w in self.abandoned:
                w._still_owner()  # notices the takeover: fails what it had pending, stops
                w.close(timeout=2)
            t0 = time.monotonic()
            for key, fut in self.outstanding:
                try:
                    self.history.ok(key, fut.result(max(0.1, 5 - (time.monotonic() - t0))))
                except Exception as exc:
                    self.history.failed(key, exc)
            self.writer.close(timeout=10)
            plain = self.log.open_writer()  # completes every segment by the recovery rule
            plain.close()
            msgs = list(self.log.open_reader())
            verdict = self.history.check(msgs, WINDOW_MS, self.MAX_KEYS)
            assert verdict.ok, verdict.summary()
        finally:
            self.client.close()
            shutil.rmtree(self.dir, ignore_errors=True)


SETTINGS = settings(
    max_examples=12, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)


class Es1Machine(IdempotencyMachine):
    ES = 1
    MAX_KEYS = 4  # smaller than the key pool: capacity evictions happen


class Es3Machine(IdempotencyMachine):
    ES = 3
    MAX_KEYS = 100


TestIdempotencyEs1 = Es1Machine.TestCase
TestIdempotencyEs1.settings = SETTINGS
TestIdempotencyEs3 = Es3Machine.TestCase
TestIdempotencyEs3.settings = SETTINGS
