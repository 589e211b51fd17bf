"""Idempotent writes: the seed design's edge cases 1-8 and the rest of docs/semantics.md.

Every test runs in-process on a fresh data directory. A "crash" is a writer abandoned without
close(): the next open_writer() takes the log over (epoch bump) and fences it. Time is a ManualClock
so window ageing is exact. Each test ends with the history checker over the whole log.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import (
    InvalidArgumentError,
    InvalidTypeError,
    LogMessageId,
    ManualClock,
    PayloadTooLargeError,
    QuorumUnavailableError,
    SegmentClosedError,
    SegmentState,
    SnapshotCorruptError,
    WriterFencedError,
    WriteTimeoutError,
    content_key,
    explicit_key,
)
from woodpecker_idem._core import decode_snapshot
from woodpecker_idem.errors import StorageUnavailableError
from woodpecker_idem.idempotency.snapshot import list_snapshots
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import History, Verdict

QUIET = {  # no snapshot unless a test asks for one
    "idempotency.snapshot_interval_s": 3600,
    "idempotency.snapshot_threshold": 10**8,
}


# --- helpers ---------------------------------------------------------------------------------


class Env:
    """One client on tmp_path with a fault injector and a manual clock."""

    def __init__(self, path: Path, es: int = 1, log_name: str = "edge", **cfg: object):
        self.clock = ManualClock()
        self.client = wp.connect(path, {"quorum.es": es, **QUIET, **cfg}, clock=self.clock)
        self.inner = self.client.transport
        self.faults = FaultInjectingTransport(self.inner)
        self.client.transport = self.faults
        self.log = self.client.open_log(log_name, create=True)
        self.history = History(self.clock)
        self.writers: list = []

    def writer(self, **opts):
        w = self.log.open_writer(idempotent=True, **opts)
        self.writers.append(w)
        return w

    def write(self, w, payload: bytes, key_id: str | bytes | None = None, **kw):
        key = content_key(payload) if key_id is None else explicit_key(key_id)
        return self.history.call(
            key, payload, lambda: w.write(payload, idempotency_id=key_id, **kw)
        )

    def entries(self) -> list[wp.LogMessage]:
        """Every entry of the log, after a plain writer completed every segment (takeover)."""
        plain = self.log.open_writer()
        plain.close()
        return list(self.log.open_reader())

    def check(self, window_ms: int, max_keys: int, entries=None) -> Verdict:
        if entries is None:  # the entries the nodes store, read around the LogReader
            self.log.open_writer().close()  # a plain writer completes every segment
            verdict = self.history.check_log(self.log, window_ms, max_keys)
        else:
            verdict = self.history.check(entries, window_ms, max_keys)
        assert verdict.ok, verdict.summary()
        return verdict

    def close(self) -> None:
        self.faults.heal_all()
        errors: list[str] = []
        for w in self.writers:
            try:
                # an abandoned writer notices the takeover and stops its threads
                w.still_owner()
                w.close(timeout=2)
            except Exception as exc:  # noqa: BLE001 - every writer is closed, then it fails
                errors.append(f"closing {w!r}: {type(exc).__name__}: {exc}")
        try:
            self.client.close()
        except Exception as exc:  # noqa: BLE001 - reported with the writers' errors
            errors.append(f"closing the client: {type(exc).__name__}: {exc}")
        if errors:
            pytest.fail("close() failed at teardown:\n  " + "\n  ".join(errors))


SERVICE = pytest.param("service", marks=pytest.mark.s3)
# Representative cases also run with meta.type etcd (a real etcd server, support/etcdserver.py),
# with local objects and in the shared deployment (etcd and the moto S3 server), and in service
# mode (LogStore node processes with staged storage, support/servicecluster.py).
ALSO_ON_ETCD = pytest.mark.parametrize(
    "meta_config",
    [
        "sqlite",
        "etcd",
        pytest.param("etcd+s3", marks=pytest.mark.s3),
        SERVICE,
    ],
    indirect=True,
)


@pytest.fixture(params=["sqlite", SERVICE])
def meta_config(request: pytest.FixtureRequest, deployment) -> dict[str, object]:
    """Every test of an `Env` runs in process and in service mode (its subject is the
    idempotent writer, wherever its nodes run); ALSO_ON_ETCD's run in every deployment."""
    return deployment(request.param)


@pytest.fixture
def env_factory(tmp_path: Path, meta_config: dict[str, object]):
    made: list[Env] = []

    def make(es: int = 1, sub: str = "d", **cfg: object) -> Env:
        # a log of the test's own: in service mode every test shares the cluster's store
        name = f"edge-{uuid.uuid4().hex[:10]}"
        e = Env(tmp_path / sub, es, name, **meta_config, **cfg)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def held(env: Env, node: str, segment_id: int, entry_id: int) -> bool:
    raw = env.inner.read(node, env.log.log_id, segment_id, entry_id, 1)
    return bool(raw)


WINDOW_S = 60.0
WINDOW_MS = int(WINDOW_S * 1000)
MAX_KEYS = 10_000


# --- seed edge cases -------------------------------------------------------------------------


@ALSO_ON_ETCD
def test_case1_crash_between_write_and_snapshot(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    first = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(50)}
    env.clock.advance(10)
    assert w.snapshotter.write_now()
    snap = decode_snapshot(env.client.objects.get(w.snapshotter.last_key))
    assert len(snap) == 50 and snap.watermarks[0] == 49
    for i in range(50, 70):
        first[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    # crash: no close, no new snapshot
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert w.fenced or w.still_owner() is False
    rep = w2.recovery
    assert rep.snapshot_key_count == 50
    assert rep.entries_replayed == 20
    assert rep.window_size == 70
    calls = env.faults.calls.get("add_entries", 0)
    for k, r in first.items():
        again = env.write(w2, b"retry-" + k.encode(), k)
        assert again.duplicate and again.message_id == r.message_id, k
    assert env.faults.calls.get("add_entries", 0) == calls, "a committed duplicate hit the servers"
    v = env.check(WINDOW_MS, MAX_KEYS)
    assert v.keyed_entries == 70


def _write_until_acked(env: Env, w, payload: bytes, key_id: str) -> wp.WriteResult:
    """`env.write`, retried while it times out: with a 300 ms append.timeout_ms a busy machine
    can let a write's wait end before its ack; an idempotent retry joins the pending entry (the
    history records every attempt)."""
    while True:
        try:
            return env.write(w, payload, key_id)
        except WriteTimeoutError:
            continue


@ALSO_ON_ETCD
def test_case2_fake_failure_ack_lost(env_factory):
    # es=3, aq=2; every node applies the entry but its first ack is lost, and replies are slow, so
    # the caller's write times out while the entry is already on every node.
    env = env_factory(es=3, **{"append.timeout_ms": 300, "append.max_retries": 5})
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    base = _write_until_acked(env, w, b"base", "base")
    for n in ("node-0", "node-1", "node-2"):
        env.faults.drop_acks(n, 1)
        env.faults.delay(n, 200)
    with pytest.raises(WriteTimeoutError):
        env.write(w, b"X-payload", "X")
    assert w.metrics_snapshot()["pending"] == 1
    mid = LogMessageId(0, base.message_id.entry_id + 1)
    wait_for(
        lambda: all(held(env, n, *mid) for n in ("node-0", "node-1", "node-2")),
        what="X applied on every node",
    )
    retry = _write_until_acked(env, w, b"X-payload", "X")  # joins the pending entry, same id
    assert retry.duplicate is True and retry.message_id == mid
    for n in ("node-0", "node-1", "node-2"):
        env.faults.delay(n, 0)
    # the commit is followed by one LAC-only update to the nodes (for tail readers, aq > 1):
    # let it go out, so the count below sees only what the duplicate itself sends (nothing)
    calls = -1
    deadline = time.monotonic() + 10
    while calls != env.faults.calls["add_entries"] and time.monotonic() < deadline:
        calls = env.faults.calls["add_entries"]
        time.sleep(0.3)
    again = env.write(w, b"X-payload", "X")
    assert again == wp.WriteResult(mid, True)
    assert env.faults.calls["add_entries"] == calls
    w.close()
    msgs = env.entries()
    assert [m.message_id for m in msgs if m.idempotency_key == explicit_key("X")] == [mid]
    env.check(WINDOW_MS, MAX_KEYS, msgs)


def _crash_with_x_in_flight(env: Env, nodes_with_x: tuple[str, ...]):
    """Writer A (own fault injector) commits k0..k4, then X reaches only `nodes_with_x` and every
    ack of it is lost; then A loses every node (a crash before it learns anything)."""
    faults_a = FaultInjectingTransport(env.inner)
    env.client.transport = faults_a
    a = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    env.client.transport = env.faults
    acked = {f"k{i}": env.write(a, b"v%d" % i, f"k{i}") for i in range(5)}
    # let the third node's ack of the last base batch land before acks start getting lost
    wait_for(
        lambda: all(held(env, n, 0, 4) for n in ("node-0", "node-1", "node-2")),
        what="base entries on every node",
    )
    time.sleep(0.05)
    for n in ("node-0", "node-1", "node-2"):
        if n in nodes_with_x:
            faults_a.drop_acks(n, 1000)
        else:
            faults_a.fail_node(n)
    x_future = a.write_async(b"X", idempotency_id="X")
    x_id = LogMessageId(0, 5)
    wait_for(lambda: all(held(env, n, *x_id) for n in nodes_with_x), what="X on its nodes")
    for n in ("node-0", "node-1", "node-2"):
        faults_a.fail_node(n)
    assert not x_future.done()
    return a, faults_a, acked, x_id, x_future


@ALSO_ON_ETCD
def test_case3_failover_inflight_committed(env_factory):
    env = env_factory(es=3, **{"append.timeout_ms": 5000})
    a, faults_a, acked, x_id, _ = _crash_with_x_in_flight(env, ("node-0", "node-1", "node-2"))
    env.history.failed(explicit_key("X"), b"X", RuntimeError("writer crashed before the ack"))
    b = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert b.window.get(explicit_key("X")) is not None
    r = env.write(b, b"X", "X")
    assert r.duplicate is True and r.message_id == x_id
    for k, first in acked.items():
        assert env.write(b, b"again", k) == wp.WriteResult(first.message_id, True)
    faults_a.heal_all()  # A comes back: it must find itself fenced and write nothing
    wait_for(lambda: a.fenced, what="old writer fenced")
    with pytest.raises(WriterFencedError):
        a.write(b"late", idempotency_id="late")
    b.close()
    msgs = env.entries()
    assert [m.message_id for m in msgs if m.idempotency_key == explicit_key("X")] == [x_id]
    env.check(WINDOW_MS, MAX_KEYS, msgs)


@ALSO_ON_ETCD
def test_case3_failover_inflight_not_committed(env_factory):
    env = env_factory(es=3, **{"append.timeout_ms": 5000})
    a, faults_a, acked, x_id, _ = _crash_with_x_in_flight(env, ("node-0",))
    env.history.failed(explicit_key("X"), b"X", RuntimeError("writer crashed before the ack"))
    env.faults.fail_node("node-0")  # the only copy of X is unreachable during the takeover
    b = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    seg0 = env.client.meta.get_segment(env.log.log_id, 0)
    assert seg0.last_entry_id == 4, "X did not reach aq, it must not be in the completed segment"
    assert b.window.get(explicit_key("X")) is None
    r = env.write(b, b"X", "X")
    assert r.duplicate is False and r.message_id.segment_id >= 1
    assert env.write(b, b"X", "X") == wp.WriteResult(r.message_id, True)
    for k, first in acked.items():
        assert env.write(b, b"again", k) == wp.WriteResult(first.message_id, True)
    env.faults.heal_node("node-0")  # node-0 still holds the orphan X at 0:5: never read
    faults_a.heal_all()
    b.close()
    msgs = env.entries()
    assert [m.message_id for m in msgs if m.idempotency_key == explicit_key("X")] == [r.message_id]
    env.check(WINDOW_MS, MAX_KEYS, msgs)


def test_case4_segment_completed_since_snapshot(env_factory):
    env = env_factory(**{"segment.max_entries": 40})
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(30)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()  # watermark 0:29, segment 0 still ACTIVE
    for i in range(30, 45):  # 0:30..0:39, then the roll completes segment 0; 1:0..1:4
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    assert acked["k44"].message_id == LogMessageId(1, 4)
    wait_for(
        lambda: (
            env.client.meta.get_segment(env.log.log_id, 0).state
            in (SegmentState.COMPLETED, SegmentState.SEALED)
        ),
        what="segment 0 completed",
    )
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)  # crash + takeover
    assert w2.recovery.snapshot_key_count == 30
    assert w2.recovery.entries_replayed == 15  # 0:30..0:39 after the watermark + all of segment 1
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True), k
    env.check(WINDOW_MS, MAX_KEYS)


@ALSO_ON_ETCD
def test_case5_segment_truncated(env_factory):
    env = env_factory(**{"segment.max_entries": 20})
    w = env.writer(window_duration_s=10, window_max_keys=MAX_KEYS)
    old = {f"old{i}": env.write(w, b"o%d" % i, f"old{i}") for i in range(15)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()  # knows segment 0 up to 0:14
    for i in range(15, 20):
        old[f"old{i}"] = env.write(w, b"o%d" % i, f"old{i}")
    env.clock.advance(20_000)  # everything in segment 0 is now older than the window
    new = {f"new{i}": env.write(w, b"n%d" % i, f"new{i}") for i in range(5)}
    assert {r.message_id.segment_id for r in new.values()} == {1}
    wait_for(
        lambda: env.client.meta.get_segment(env.log.log_id, 0).state is SegmentState.SEALED,
        what="segment 0 sealed",
    )
    env.log.truncate(LogMessageId(1, 0))
    assert env.client.meta.get_segment(env.log.log_id, 0).state is SegmentState.TRUNCATED
    w2 = env.writer(window_duration_s=10, window_max_keys=MAX_KEYS)  # crash + takeover
    assert w2.recovery.window_size == 5  # segment 0 neither read (its data is gone) nor kept
    for k, first in new.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    r = env.write(w2, b"o0", "old0")  # older than the window: a new write (by design)
    assert r.duplicate is False and r.message_id.segment_id >= 2
    # the truncated segment's acknowledged ids are gone by request: judge the rest
    env.history.attempts = [
        a for a in env.history.attempts if not (a.ok and a.message_id.segment_id == 0)
    ]
    env.check(10_000, MAX_KEYS)


@ALSO_ON_ETCD
def test_case6_new_segment_rolled_after_snapshot(env_factory):
    env = env_factory(**{"segment.max_entries": 10})
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(10)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()
    snap = decode_snapshot(env.client.objects.get(w.snapshotter.last_key))
    assert set(snap.watermarks) == {0}
    for i in range(10, 35):  # segments 1, 2 (full) and 3 (5 entries), unknown to the snapshot
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    assert acked["k34"].message_id == LogMessageId(3, 4)
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert w2.recovery.snapshot_key_count == 10
    assert w2.recovery.entries_replayed == 25
    assert w2.recovery.segments_replayed == 3
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True), k
    env.check(WINDOW_MS, MAX_KEYS)


class FlakyStore:
    """Wraps an ObjectStore; puts fail while `broken` is set."""

    def __init__(self, inner):
        self.inner = inner
        self.broken = False
        self.failed_puts = 0

    def put(self, key, data, *, if_none_match=False):
        if self.broken:
            self.failed_puts += 1
            raise StorageUnavailableError(f"object store down (injected) on put {key}")
        return self.inner.put(key, data, if_none_match=if_none_match)

    def put_parts(self, key, parts):
        if self.broken:
            self.failed_puts += 1
            raise StorageUnavailableError(f"object store down (injected) on put {key}")
        return self.inner.put_parts(key, parts)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_case7_snapshot_write_fails(env_factory):
    env = env_factory(
        **{"idempotency.snapshot_interval_s": 0.1, "idempotency.snapshot_threshold": 5}
    )
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    store = FlakyStore(env.client.objects)
    w.snapshotter.store = store
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(10)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()
    good = list_snapshots(env.client.objects, env.log.log_id)
    store.broken = True
    env.clock.advance(5)
    assert w.snapshotter.write_now() is False
    for i in range(10, 20):  # writes go on while snapshots fail
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    wait_for(lambda: store.failed_puts >= 3, what="retried snapshot writes")
    m = w.metrics_snapshot()
    assert m["snapshot_failures"] >= 3
    assert list_snapshots(env.client.objects, env.log.log_id) == good  # nothing lost or deleted
    assert all(env.write(w, b"x", k).duplicate for k in acked)
    store.broken = False  # the next scheduled attempt captures the latest state
    wait_for(
        lambda: list_snapshots(env.client.objects, env.log.log_id) != good,
        what="snapshot after the store healed",
    )
    newest = list_snapshots(env.client.objects, env.log.log_id)[-1]
    assert len(decode_snapshot(env.client.objects.get(newest))) == 20
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert w2.recovery.snapshot_key_count == 20
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    env.check(WINDOW_MS, MAX_KEYS)


def test_case7_failed_snapshots_crash_recovers_from_older_snapshot(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    store = FlakyStore(env.client.objects)
    w.snapshotter.store = store
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(10)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()
    store.broken = True
    for i in range(10, 30):
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    env.clock.advance(5)
    assert not w.snapshotter.write_now()
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)  # crash
    assert w2.recovery.snapshot_key_count == 10 and w2.recovery.entries_replayed == 20
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    env.check(WINDOW_MS, MAX_KEYS)


@pytest.mark.parametrize("meta_config", ["sqlite", "etcd", SERVICE], indirect=True)
def test_case7_metadata_outage_does_not_stop_snapshots(env_factory):
    """The snapshot task asks the metadata store whether it still owns the log; while that store
    is unreachable its attempts fail (logged, counted, retried) and the task keeps running."""
    env = env_factory(
        **{"idempotency.snapshot_interval_s": 0.1, "idempotency.snapshot_threshold": 1}
    )
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    meta = env.client.meta
    real_check = meta.check_epoch
    outage = threading.Event()
    outage.set()

    def check_epoch(*args):
        if outage.is_set():
            raise StorageUnavailableError("metadata store down (injected)")
        return real_check(*args)

    meta.check_epoch = check_epoch
    try:
        acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(5)}
        wait_for(lambda: w.metrics_snapshot()["snapshot_failures"] >= 2, what="failed attempts")
        assert list_snapshots(env.client.objects, env.log.log_id) == []
        assert w.snapshotter.active
        outage.clear()
        wait_for(
            lambda: list_snapshots(env.client.objects, env.log.log_id) != [],
            what="a snapshot once the metadata store is back",
        )
    finally:
        meta.check_epoch = real_check
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)  # crash
    assert w2.recovery.snapshot_key_count == 5
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    env.check(WINDOW_MS, MAX_KEYS)


def test_case8_retry_after_window_expired(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=5, window_max_keys=100)
    first = env.write(w, b"X", "X")
    env.clock.advance(4_999)
    assert env.write(w, b"X", "X") == wp.WriteResult(first.message_id, True)
    env.clock.advance(1)  # exactly window_duration old: out of the window
    second = env.write(w, b"X", "X")
    assert second.duplicate is False and second.message_id != first.message_id
    assert env.write(w, b"X", "X") == wp.WriteResult(second.message_id, True)
    # the same rule after recovery: ages by the stored timestamp
    y = env.write(w, b"Y", "Y")
    env.clock.advance(4_000)
    w2 = env.writer(window_duration_s=5, window_max_keys=100)
    assert env.write(w2, b"Y", "Y") == wp.WriteResult(y.message_id, True)
    env.clock.advance(1_000)
    y2 = env.write(w2, b"Y", "Y")
    assert y2.duplicate is False and y2.message_id != y.message_id
    v = env.check(5_000, 100)
    assert v.rewritten_after_window == 2


def test_case8_capacity_eviction_is_early_and_counted(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=3)
    x = env.write(w, b"X", "X")
    for k in ("a", "b"):
        env.write(w, k.encode(), k)
    assert env.write(w, b"X", "X") == wp.WriteResult(x.message_id, True)  # newest 3 keys
    env.write(w, b"c", "c")  # X is now the 4th newest: evicted early
    assert w.metrics_snapshot()["early_evictions"] == 1
    again = env.write(w, b"X", "X")
    assert again.duplicate is False
    env.check(WINDOW_MS, 3)


# --- failure outcome (b): pending keys of a completed segment ----------------------------------


def test_pending_keys_of_completed_segment(env_factory):
    env = env_factory(
        es=3, **{"append.timeout_ms": 5000, "append.max_retries": 8, "append.linger_ms": 50}
    )
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    base = {f"b{i}": env.write(w, b"b%d" % i, f"b{i}") for i in range(3)}
    # p0..p4 land on node-0 (acked) and node-2 (ack lost); node-1 is down: 1 ack < aq=2.
    env.faults.fail_node("node-1")
    env.faults.drop_acks("node-2", 1000)
    p_futures = {f"p{i}": w.write_async(b"p%d" % i, idempotency_id=f"p{i}") for i in range(5)}
    p_ids = [LogMessageId(0, 3 + i) for i in range(5)]
    # node-0 holding them is enough: recovery copies what any responder holds up to aq copies
    # (waiting for node-2 too races its retries of a second batch against the quorum loss).
    wait_for(lambda: held(env, "node-0", *p_ids[-1]), what="p entries on node-0")
    assert not any(f.done() for f in p_futures.values())
    # then every node goes away; q0..q4 reach no node at all
    env.faults.fail_node("node-0")
    env.faults.fail_node("node-2")
    q_futures = {f"q{i}": w.write_async(b"q%d" % i, idempotency_id=f"q{i}") for i in range(5)}
    wait_for(lambda: w.repairing, what="segment 0 losing its quorum")
    with pytest.raises(QuorumUnavailableError):
        env.write(w, b"during", "during")
    # node-0 (the one holding p0..p4 for sure) first: a repair attempt under way when the others
    # come back would otherwise be able to fence node-1 and node-2 alone, which may lack the p
    # entries (node-2's lane was still retrying p0's lost ack), and seal the segment at 2: legal
    # (they were never acknowledged), but not the case this test is about
    fences = env.faults.calls.get("fence", 0)
    env.faults.heal_node("node-0")
    # an attempt under way fences at most node-1 and node-2 more: the third fence from here on
    # is a new attempt's, of node-0, which answers; every attempt from then on includes it
    wait_for(lambda: env.faults.calls.get("fence", 0) >= fences + 3, what="a repair attempt")
    env.faults.heal_all()
    for i, (k, f) in enumerate(p_futures.items()):
        r = f.result(10)
        env.history.ok(explicit_key(k), b"p%d" % i, r)
        assert r == wp.WriteResult(p_ids[i], False), k  # present -> committed at its id
    for i, (k, f) in enumerate(q_futures.items()):
        with pytest.raises(SegmentClosedError):
            f.result(10)
        env.history.failed(explicit_key(k), b"q%d" % i, SegmentClosedError("absent"))
    assert env.client.meta.get_segment(env.log.log_id, 0).last_entry_id == 7
    for i in range(5):
        r = env.write(w, b"q%d" % i, f"q{i}")  # a fresh write in the next segment
        assert r.duplicate is False and r.message_id.segment_id == 1
        assert env.write(w, b"p%d" % i, f"p{i}") == wp.WriteResult(p_ids[i], True)
    for k, first in base.items():
        assert env.write(w, b"x", k) == wp.WriteResult(first.message_id, True)
    w.close()
    env.check(WINDOW_MS, MAX_KEYS)


# --- concurrency, key domains, snapshots --------------------------------------------------------


@ALSO_ON_ETCD
def test_concurrent_writes_of_one_key(env_factory):
    env = env_factory(**{"append.linger_ms": 5})
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    threads = 16
    for round_ in range(5):
        barrier = threading.Barrier(threads)
        results: list = []

        def go(i: int, rnd: int = round_, b: threading.Barrier = barrier, out: list = results):
            b.wait()
            kid = f"same-{rnd}" if rnd % 2 == 0 else None
            out.append(env.write(w, b"payload-%d" % rnd, kid))  # list.append is atomic

        ts = [threading.Thread(target=go, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert len(results) == threads
        assert sum(not r.duplicate for r in results) == 1, results
        assert len({r.message_id for r in results}) == 1
    v = env.check(WINDOW_MS, MAX_KEYS)
    assert v.keyed_entries == 5


def test_payload_vs_explicit_id_domains(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert content_key(b"abc") != explicit_key("abc")
    assert explicit_key("abc") == explicit_key(b"abc")  # str is its UTF-8 bytes
    assert explicit_key("é") == explicit_key("é".encode())
    assert len(content_key(b"abc")) == len(explicit_key("abc")) == 16
    by_payload = env.write(w, b"abc")
    by_id = env.write(w, b"something else", "abc")
    assert not by_payload.duplicate and not by_id.duplicate
    assert by_payload.message_id != by_id.message_id
    assert env.write(w, b"zzz", b"abc") == wp.WriteResult(by_id.message_id, True)
    assert env.write(w, b"abc") == wp.WriteResult(by_payload.message_id, True)
    # properties are not part of the content key
    assert w.write(b"abc", properties={"p": "1"}) == wp.WriteResult(by_payload.message_id, True)
    msgs = env.entries()
    assert [m.idempotency_key for m in msgs] == [content_key(b"abc"), explicit_key("abc")]
    env.check(WINDOW_MS, MAX_KEYS, msgs)


def _snapshots(env: Env) -> list[str]:
    return list_snapshots(env.client.objects, env.log.log_id)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
@ALSO_ON_ETCD
def test_corrupt_newest_snapshot_falls_back(env_factory, damage):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(10)}
    env.clock.advance(5)
    assert w.snapshotter.write_now()
    for i in range(10, 25):
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    env.clock.advance(5)
    assert w.snapshotter.write_now()
    keys = _snapshots(env)
    assert len(keys) == 2
    data = bytearray(env.client.objects.get(keys[-1]))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 7]
    elif damage == "garbage":
        data = bytearray(b"\x8f" * len(data))
    else:
        data = bytearray()
    with pytest.raises(SnapshotCorruptError):
        decode_snapshot(bytes(data))
    env.client.objects.put(keys[-1], bytes(data))
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)  # crash
    rep = w2.recovery
    assert rep.corrupt_snapshots == 1
    assert rep.snapshot_key_count == 10 and rep.entries_replayed == 15
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    env.check(WINDOW_MS, MAX_KEYS)


def test_both_snapshots_corrupt_derives_from_log(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(12)}
    for _ in range(2):
        env.clock.advance(5)
        assert w.snapshotter.write_now()
    for key in _snapshots(env):
        env.client.objects.put(key, b"WPDS" + b"\x00" * 40)
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert w2.recovery.corrupt_snapshots == 2 and w2.recovery.snapshot_age_ms is None
    assert w2.recovery.window_size == 12
    for k, first in acked.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    env.check(WINDOW_MS, MAX_KEYS)


def test_no_snapshot_derives_window(env_factory):
    env = env_factory(**{"segment.max_entries": 10})
    w = env.writer(window_duration_s=30, window_max_keys=MAX_KEYS)
    ancient = {f"a{i}": env.write(w, b"a%d" % i, f"a{i}") for i in range(10)}
    env.write(w, b"roll", "roll")  # rolls: segment 0 is completed now
    wait_for(
        lambda: env.client.meta.get_segment(env.log.log_id, 0).state is SegmentState.SEALED,
        what="segment 0 sealed",
    )
    env.clock.advance(60_000)  # segment 0 (and 'roll') now older than the window
    recent = {f"r{i}": env.write(w, b"r%d" % i, f"r{i}") for i in range(15)}
    assert not _snapshots(env)
    w2 = env.writer(window_duration_s=30, window_max_keys=MAX_KEYS)  # crash
    rep = w2.recovery
    assert rep.snapshot_age_ms is None and rep.snapshot_key_count == 0
    assert rep.window_size == 15
    assert rep.entries_replayed == 16  # segment 0 skipped whole; 1:0 ('roll') .. 2:5
    for k, first in recent.items():
        assert env.write(w2, b"x", k) == wp.WriteResult(first.message_id, True)
    r = env.write(w2, b"a0", "a0")
    assert r.duplicate is False and r.message_id != ancient["a0"].message_id
    env.check(30_000, MAX_KEYS)


def test_snapshot_retention_keeps_newest_two(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    written = []
    for i in range(5):
        env.write(w, b"p%d" % i, f"k{i}")
        env.clock.advance(3)
        assert w.snapshotter.write_now()
        written.append(w.snapshotter.last_key)
    assert _snapshots(env) == written[-2:]


def test_fenced_writer_snapshot_task_deletes_nothing(env_factory):
    env = env_factory(
        **{"idempotency.snapshot_interval_s": 0.1, "idempotency.snapshot_threshold": 1}
    )
    a = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    for i in range(3):
        env.write(a, b"p%d" % i, f"k{i}")
        env.clock.advance(3)
        assert a.snapshotter.write_now()
    b = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)  # takes over
    b.snapshotter.stop()  # B writes none either: any change below would be A's
    env.clock.advance(3)
    assert a.snapshotter.write_now() is False  # the owner check fails: nothing written
    # A background write of A's that passed its owner check before the takeover may still land
    # (an older epoch, so never newer than B's): wait for it, then nothing may change any more.
    a.snapshotter.stop()
    before_takeover = _snapshots(env)
    assert len(before_takeover) == 2
    writes_a = a.snapshotter.writes
    assert a.snapshotter.write_now() is False
    assert _snapshots(env) == before_takeover
    assert a.snapshotter.writes == writes_a
    assert a.fenced
    with pytest.raises(WriterFencedError):
        a.write(b"late", idempotency_id="late")
    a.close()  # a fenced writer's close writes no snapshot either
    assert _snapshots(env) == before_takeover
    assert b.recovery.snapshot_key_count == 3


def test_same_key_different_payload_returns_original(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    one = env.write(w, b"one", "k")
    two = env.write(w, b"two", "k")
    assert two == wp.WriteResult(one.message_id, True)
    w2 = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    assert env.write(w2, b"three", "k") == wp.WriteResult(one.message_id, True)
    msgs = env.entries()
    assert [m.payload for m in msgs] == [b"one"]
    env.check(WINDOW_MS, MAX_KEYS, msgs)


# in process only: it finds no snapshot in the whole store, which service mode shares
@pytest.mark.parametrize("meta_config", ["sqlite"], indirect=True)
def test_non_idempotent_writer_pays_nothing(env_factory):
    env = env_factory(
        **{"idempotency.snapshot_interval_s": 0.05, "idempotency.snapshot_threshold": 1}
    )
    before = set(threading.enumerate())
    w = env.log.open_writer()
    env.writers.append(w)
    assert not isinstance(w, wp.IdempotentLogWriter)
    assert not hasattr(w, "window") and not hasattr(w, "snapshotter")
    started = [t.name for t in set(threading.enumerate()) - before]
    assert started and not any(n.startswith("wp-snapshot-") for n in started), started
    futures = [w.write_async(b"same") for _ in range(20)]
    ids = [f.result(10).message_id for f in futures]
    assert len(set(ids)) == 20 and all(not f.result().duplicate for f in futures)
    with pytest.raises(InvalidArgumentError):
        w.write(b"x", idempotency_id="x")
    with pytest.raises(InvalidArgumentError, match="window_max_keys"):
        env.log.open_writer(window_max_keys=10)  # type: ignore[call-overload]
    time.sleep(0.2)
    w.close()
    assert env.client.objects.list("dedup_snapshot/") == []
    msgs = list(env.log.open_reader())
    assert len(msgs) == 20 and all(m.idempotency_key is None for m in msgs)


# --- bad input and write_many ---------------------------------------------------------------


BAD_IDS = [
    ("", InvalidArgumentError),
    (b"", InvalidArgumentError),
    (b"x" * 1025, InvalidArgumentError),
    ("é" * 513, InvalidArgumentError),  # 1026 UTF-8 bytes
    (123, InvalidTypeError),
    (1.5, InvalidTypeError),
    (["a"], InvalidTypeError),
    (object(), InvalidTypeError),
]


def test_bad_input(env_factory):
    env = env_factory(**{"append.max_entry_bytes": 1024})
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    for bad, err in BAD_IDS:
        with pytest.raises(err):
            w.write(b"p", idempotency_id=bad)
        with pytest.raises(err):
            w.write_async(b"p", idempotency_id=bad)
        with pytest.raises(err):
            w.write_many([b"p", b"q"], ids=["ok", bad])
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidTypeError, TypeError)
    with pytest.raises(InvalidTypeError):
        w.write("a str payload", idempotency_id="s")
    with pytest.raises(PayloadTooLargeError):
        w.write(b"x" * 1025, idempotency_id="big")
    with pytest.raises(InvalidArgumentError):
        w.write_many([b"a", b"b"], ids=["a"])
    with pytest.raises(InvalidTypeError):
        w.write_many([b"a", "b"])
    # limits that are allowed
    assert not env.write(w, b"p", b"x" * 1024).duplicate
    assert not env.write(w, b"p", "é" * 512).duplicate
    assert not env.write(w, b"", "empty-payload").duplicate
    # nothing from the refused calls was written or left pending
    assert w.metrics_snapshot()["pending"] == 0
    v = env.check(WINDOW_MS, MAX_KEYS)
    assert v.entries == 3


def test_write_many_semantics(env_factory):
    env = env_factory()
    w = env.writer(window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    first = env.write(w, b"pre", "b")
    res = w.write_many([b"A", b"B", b"A2", b"C", b"B2"], ids=["a", "b", "a", "c", "b"])
    assert len(res) == 5
    assert list(res.duplicate) == [0, 1, 1, 0, 1]
    assert res.message_id(1) == first.message_id and res.message_id(4) == first.message_id
    assert res.message_id(0) == res.message_id(2)
    assert len({res.message_id(i) for i in range(5)}) == 3
    names, payloads = ["a", "b", "a", "c", "b"], [b"A", b"B", b"A2", b"C", b"B2"]
    for i, (k, p) in enumerate(zip(names, payloads, strict=True)):
        env.history.ok(explicit_key(k), p, wp.WriteResult(res.message_id(i), res.duplicate[i]))
    # content keys: duplicates inside the batch and against earlier writes
    res2 = w.write_many([b"x", b"y", b"x", b"pre"])
    assert list(res2.duplicate) == [0, 0, 1, 0]  # b"pre" had an explicit id: other domain
    assert res2.message_id(0) == res2.message_id(2)
    for i, p in enumerate([b"x", b"y", b"x", b"pre"]):
        env.history.ok(content_key(p), p, wp.WriteResult(res2.message_id(i), res2.duplicate[i]))
    again = w.write_many([b"y", b"x"])
    assert list(again.duplicate) == [1, 1]
    assert [again.message_id(i) for i in range(2)] == [res2.message_id(1), res2.message_id(0)]
    empty = w.write_many([])
    assert len(empty) == 0
    v = env.check(WINDOW_MS, MAX_KEYS)
    assert v.keyed_entries == 6


@pytest.mark.parametrize("with_snapshot", [False, True])
def test_recovery_keeps_newest_entry_of_rewritten_key(env_factory, with_snapshot):
    # K is written, ages out, is rewritten (a new entry, by design), then the writer crashes: the
    # recovered window must hold K's newest entry, so a retry within its window is a duplicate.
    env = env_factory()
    w = env.writer(window_duration_s=5, window_max_keys=100)
    first = env.write(w, b"K", "K")
    if with_snapshot:
        env.clock.advance(1)
        assert w.snapshotter.write_now()
    env.clock.advance(5_000)
    second = env.write(w, b"K", "K")
    assert second.duplicate is False and second.message_id != first.message_id
    env.clock.advance(1_000)
    w2 = env.writer(window_duration_s=5, window_max_keys=100)  # crash + takeover
    entry = w2.window.get(explicit_key("K"))
    assert entry is not None and (entry.segment_id, entry.entry_id) == tuple(second.message_id)
    assert env.write(w2, b"K", "K") == wp.WriteResult(second.message_id, True)
    env.check(5_000, 100)


def test_early_evictions_are_logged_once_a_minute_and_all_counted(tmp_path, caplog):
    """A window too small for its rate evicts early at every commit: one warning (with the
    count) per minute, not one line per commit; the metric counts every eviction."""
    import logging

    client = wp.connect(tmp_path, {"quorum.es": 1})
    w = client.open_log("e", create=True).open_writer(
        idempotent=True, window_duration_s=3600, window_max_keys=10
    )
    with caplog.at_level(logging.WARNING, logger="woodpecker_idem.idempotency.stage"):
        for i in range(60):  # each write its own commit: 50 of them evict early
            w.write(b"e%d" % i, idempotency_id=f"e{i}")
    warnings = [r for r in caplog.records if "evicted by capacity" in r.getMessage()]
    assert w.metrics_snapshot()["early_evictions"] == 50
    assert len(warnings) == 1 and "1 keys evicted" in warnings[0].getMessage()
    w.close()
    client.close()


def test_early_evictions_are_shown_once_per_writer_without_logging(tmp_path):
    """Without logging configured, a user still learns that the window is too small: one
    `EarlyEvictionWarning` per writer (Python shows warnings by default), naming the cure."""
    import warnings

    client = wp.connect(tmp_path, {"quorum.es": 1})
    log = client.open_log("e", create=True)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for round_ in range(2):  # a second writer warns again, once
            w = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=10)
            for i in range(40):
                w.write(b"e%d" % i, idempotency_id=f"e{round_}-{i}")
            w.close()
    early = [s for s in shown if issubclass(s.category, wp.EarlyEvictionWarning)]
    assert len(early) == 2, [str(s.message) for s in shown]
    assert "window_max_keys=10" in str(early[0].message)
    assert "keys per second x window_duration_s" in str(early[0].message)
    client.close()
