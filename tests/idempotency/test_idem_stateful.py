"""Random schedules of writes, retries, faults, crashes and time, judged by the history checker.

A hypothesis RuleBasedStateMachine drives one idempotent writer on an in-process quorum (es=1, and
es=3/aq=2): writes of keys from a small pool (sync and write_async bursts), retries of failed keys,
lost acks, node failures and heals, writer crash + takeover (abandon, open_writer), snapshots and
ManualClock advances (some past the window). Every attempt is recorded in a History; teardown heals
everything, lets a plain writer complete every segment and checks the verdict over the whole log.

Between steps, invariants hold the live writer to a model of what it acknowledged: a key the model
knows is certainly in the window maps to the id it was acknowledged at, and no entry is
acknowledged as created twice. `hypothesis.event` counts outcomes and faults (`--hypothesis-show-
statistics`). The default profile runs 12 examples of 25 steps; the `slow` tests 100 of 50.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from slowprofile import size

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
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import History

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
        self.history = History(self.clock)
        # the model: key -> (id, timestamp) of its newest entry acknowledged as created, and the
        # order in which keys were attempted since (for the capacity bound)
        self.created: dict[str, tuple[wp.LogMessageId, int, int]] = {}
        self.created_ids: set[wp.LogMessageId] = set()
        self.attempted: list[str] = []
        self.violations: list[str] = []
        self.abandoned: list = []
        self.outstanding: list[concurrent.futures.Future] = []  # fire-and-forget writes
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

    def _certain(self, name: str) -> tuple[wp.LogMessageId, int] | None:
        """The id of `name` if it is certainly in the window now: acknowledged as created,
        younger than the duration, and fewer than MAX_KEYS other keys attempted since."""
        known = self.created.get(name)
        if known is None or self.clock.now_ms() - known[1] >= WINDOW_MS:
            return None
        since = self.attempted[known[2] :]
        if len(set(since) - {name}) >= self.MAX_KEYS:
            return None
        return known[:2]

    def _begin(self, name: str) -> tuple:
        """Before an attempt: its start, what the model expects, and its place in the order."""
        start, expect = self.history.now(), self._certain(name)
        self.attempted.append(name)
        return start, expect, len(self.attempted) - 1

    def _stamped(self, fut: concurrent.futures.Future) -> list:
        """A cell that gets the stamp of the moment `fut` ends. An async write can end long
        before its outcome is read (a write that timed out in the writer, read at teardown); the
        checker trusts an attempt's end (a timed-out entry was pending until then), so the end
        must be when it ended, not when the test looked."""
        cell: list = []
        fut.add_done_callback(lambda _f: cell.append(self.history.now()))
        return cell

    def _record(
        self, name: str, payload: bytes, fn, begun: tuple | None = None, ended: list | None = None
    ) -> None:
        key = explicit_key(name)
        begun = begun or self._begin(name)
        start = begun[0]
        try:
            result = fn()
        except EXPECTED as exc:
            self.history.failed(key, payload, exc, start, ended[0] if ended else None)
            self.failed_keys.add(name)
            event(f"write failed: {type(exc).__name__}")
            return
        except WriterFencedError as exc:  # only an abandoned writer may be fenced
            raise AssertionError(f"the live writer was fenced: {exc}") from exc
        self.history.ok(key, payload, result, start, ended[0] if ended else None)
        self._acknowledged(name, result, begun)

    def _acknowledged(self, name: str, result, begun: tuple) -> None:
        start, expect, pos = begun
        self.failed_keys.discard(name)
        if expect is not None and (result.message_id, result.duplicate) != (expect[0], True):
            self.violations.append(f"{name} was in the window at {expect[0]}, got {result}")
        if result.duplicate:
            event("write answered as a duplicate")
            return
        if result.message_id in self.created_ids:
            self.violations.append(f"{result.message_id} acknowledged as created twice")
        event(
            "write created a new entry"
            if name not in self.created
            else "key rewritten after leaving the window"
        )
        self.created_ids.add(result.message_id)
        self.created[name] = (result.message_id, start.ms, pos)

    # --- rules ---------------------------------------------------------------------------------

    @rule(name=st.sampled_from(KEYS))
    def write(self, name: str) -> None:
        self._record(
            name,
            name.encode(),
            lambda: self.writer.write(name.encode(), idempotency_id=name, timeout=WAIT_S),
        )

    @rule(pick=st.integers(0, len(KEYS) - 1))
    def retry_failed(self, pick: int) -> None:
        """Retry a key whose last attempt failed. Which keys failed depends on timing, so neither
        a precondition nor a strategy may depend on it (hypothesis replays choices)."""
        failed = sorted(self.failed_keys)
        if failed:
            self.write(failed[pick % len(failed)])

    @rule(names=st.lists(st.sampled_from(KEYS), min_size=2, max_size=8))
    def burst(self, names: list[str]) -> None:
        futures = []
        for name in names:
            payload = b"b-" + name.encode()
            begun = self._begin(name)
            try:
                fut = self.writer.write_async(payload, idempotency_id=name)
            except EXPECTED as exc:
                self.history.failed(explicit_key(name), payload, exc, begun[0])
                continue
            futures.append((name, payload, fut, begun, self._stamped(fut)))
        concurrent.futures.wait([f[2] for f in futures], timeout=WAIT_S)  # one deadline
        for name, payload, fut, begun, ended in futures:
            self._record(name, payload, lambda f=fut: f.result(0), begun, ended)

    @rule(name=st.sampled_from(KEYS))
    def fire_and_forget(self, name: str) -> None:
        """A write_async nobody waits for: the history records it when its future ends."""
        payload = b"f-" + name.encode()
        self._begin(name)
        try:
            fut = self.history.call_async(
                explicit_key(name),
                payload,
                lambda: self.writer.write_async(payload, idempotency_id=name),
            )
        except EXPECTED:
            return  # recorded by call_async
        self.outstanding.append(fut)

    @rule(node=st.integers(0, 2), count=st.integers(1, 4))
    def drop_acks(self, node: int, count: int) -> None:
        event("fault: acks dropped")
        self.faults.drop_acks(self.nodes[node % len(self.nodes)], count)

    @precondition(lambda self: len(self.down) < len(self.nodes))
    @rule(node=st.integers(0, 2))
    def fail_node(self, node: int) -> None:
        n = self.nodes[node % len(self.nodes)]
        event("fault: node failed")
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
        if ms >= WINDOW_MS:
            event("clock moved past the window")
        self.clock.advance(ms)

    @rule()
    def snapshot(self) -> None:
        self.clock.advance(1)
        event("snapshot written" if self.writer.snapshotter.write_now() else "snapshot failed")

    @precondition(lambda self: len(self.down) <= self.ES - (self.ES // 2 + 1))  # fence quorum
    @rule()
    def crash_and_reopen(self) -> None:
        self.abandoned.append(self.writer)  # no close: in-flight writes are left as they are
        event("writer crashed and taken over")
        self.writer = self._open()

    # --- invariants (between steps) -----------------------------------------------------------

    @invariant()
    def window_agrees_with_the_model(self) -> None:
        for name in KEYS:
            known = self._certain(name)
            if known is None:
                continue
            got = self.writer.window.get(explicit_key(name), self.clock.now_ms())
            assert got is not None and (got.segment_id, got.entry_id) == tuple(known[0]), (
                f"{name} acknowledged at {known[0]} and certainly in the window, window has {got}"
            )

    @invariant()
    def no_key_acknowledged_twice(self) -> None:
        assert not self.violations, self.violations

    # --- the verdict ---------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.faults.heal_all()
            self.down.clear()
            for w in self.abandoned:
                w.still_owner()  # notices the takeover: fails what it had pending, stops
                w.close(timeout=2)
            self.writer.close(timeout=10)
            # every accepted write has ended once its writer is closed (and recorded itself)
            pending = [f for f in self.outstanding if not f.done()]
            assert not pending, f"{len(pending)} writes still pending after close()"
            plain = self.log.open_writer()  # completes every segment by the recovery rule
            plain.close()
            # the entries the nodes store, read around the LogReader
            verdict = self.history.check_log(self.log, WINDOW_MS, self.MAX_KEYS)
            assert verdict.ok, verdict.summary()
        finally:
            self.client.close()
            shutil.rmtree(self.dir, ignore_errors=True)


SETTINGS = settings(
    max_examples=12, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
# the CI slice (tests/support/slowprofile.py) runs fewer examples of the same length
SLOW = settings(SETTINGS, max_examples=size(100, 12), stateful_step_count=50)


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


@pytest.mark.slow
@pytest.mark.timeout(3600)
class TestIdempotencyEs1Slow(Es1Machine.TestCase):
    settings = SLOW


@pytest.mark.slow
@pytest.mark.timeout(3600)
class TestIdempotencyEs3Slow(Es3Machine.TestCase):
    settings = SLOW
