"""The batch lane of the idempotent writer (`write_many`, `write_keyed`, `write_arrow`): rows go
to the writer core as runs (one frame and one waiter per AddEntries batch), judged by the window
in one pass per chunk. Its edge cases, each judged by the history checker over the whole log:
repeats inside a batch (across chunk boundaries), keys in flight from a concurrent
`write_async`, a node failing, a takeover and a close in the middle of a batch, a timeout, and a
segment completed inside a run.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import woodpecker_idem as wp
from woodpecker_idem import (
    LogMessageId,
    ManualClock,
    SegmentClosedError,
    WoodpeckerError,
    WriteResult,
    explicit_key,
)
from woodpecker_idem._core import decode_snapshot, encode_frame
from woodpecker_idem.idempotency import snapshot as snapshot_module
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import History
from woodpecker_idem.types import SegmentState
from woodpecker_idem.writer.results import BatchCompletion, RowJoiner, RunRows
from woodpecker_idem.writer.segments import EntryJoiner, OpenSegment, PendingEntry

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
WINDOW_S = 60.0
MAX_KEYS = 10_000


class Env:
    """One client with a fault injector and a manual clock; `history` records every row."""

    def __init__(self, path: Path, **cfg: object):
        self.clock = ManualClock()
        self.client = wp.connect(path, {"quorum.es": 1, **QUIET, **cfg}, clock=self.clock)
        self.faults = FaultInjectingTransport(self.client.transport)
        self.client.transport = self.faults
        self.log = self.client.open_log("batch", create=True)
        self.history = History(self.clock)
        self.writers: list = []

    def writer(self):
        w = self.log.open_writer(
            idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS
        )
        self.writers.append(w)
        return w

    def write_many(self, w, payloads: list[bytes], ids: list[str], **kw):
        """One batch call, every row recorded: acknowledged rows with their ids, the others as
        failed (they may or may not have landed). Returns the result or the error."""
        start = self.history.now()
        try:
            res = w.write_many(payloads, ids, **kw)
        except WoodpeckerError as exc:
            assert exc.batch_result is not None and exc.acknowledged is not None
            for i, (p, k) in enumerate(zip(payloads, ids, strict=True)):
                if exc.acknowledged[i]:
                    mid = exc.batch_result.message_id(i)
                    dup = bool(exc.batch_result.duplicate[i])
                    self.history.ok(explicit_key(k), p, WriteResult(mid, dup), start)
                else:
                    self.history.failed(explicit_key(k), p, exc, start)
            return exc
        for i, (p, k) in enumerate(zip(payloads, ids, strict=True)):
            self.history.ok(
                explicit_key(k), p, WriteResult(res.message_id(i), res.duplicate[i]), start
            )
        return res

    def check(self):
        plain = self.log.open_writer()  # completes every segment (takeover)
        plain.close()
        # the entries the nodes store, read around the LogReader (a reader bug cannot hide one)
        verdict = self.history.check_log(self.log, int(WINDOW_S * 1000), MAX_KEYS)
        assert verdict.ok, verdict.summary()
        return verdict

    def after_adds(self, count: int, action) -> None:
        """Run `action()` once, in the node sender, before the `count`-th add_entries."""
        inner = self.faults.add_entries
        seen = [0]

        def add_entries(*args, **kwargs):
            seen[0] += 1
            if seen[0] == count:
                action()
            return inner(*args, **kwargs)

        self.faults.add_entries = add_entries  # type: ignore[method-assign]

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


@pytest.fixture
def env_factory(tmp_path: Path):
    made: list[Env] = []

    def make(**cfg: object) -> Env:
        e = Env(tmp_path / f"d{len(made)}", **cfg)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def rows(n: int, prefix: str = "k") -> tuple[list[bytes], list[str]]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(n)], [f"{prefix}{i}" for i in range(n)]


def in_thread(fn, timeout: float = 30.0):
    """`fn()` in a thread; its result (or error), asserting that it ends within `timeout`."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"the batch call did not end within {timeout} s"
    return out[0]


def test_repeats_across_chunks_get_the_first_rows_position(env_factory):
    env = env_factory(**{"append.max_batch_entries": 16})
    w = env.writer()
    ids = [f"k{i % 70}" for i in range(200)]
    payloads = [b"p%d" % i for i in range(200)]
    res = env.write_many(w, payloads, ids)
    assert list(res.duplicate) == [0] * 70 + [1] * 130
    for i in range(70, 200):
        assert res.message_id(i) == res.message_id(i % 70)
    assert len({res.message_id(i) for i in range(200)}) == 70
    again = env.write_many(w, payloads, ids)
    assert all(again.duplicate)
    assert [again.message_id(i) for i in range(200)] == [res.message_id(i) for i in range(200)]
    assert w.metrics_snapshot()["duplicates_suppressed"] == 130 + 200
    assert env.check().keyed_entries == 70


def test_keys_in_flight_from_a_concurrent_write_are_joined(env_factory):
    env = env_factory()
    w = env.writer()
    env.faults.delay("node-0", 300)
    start = env.history.now()
    in_flight = w.write_async(b"first-5", idempotency_id="k5")  # sent at once, held 300 ms
    queued = w.write_async(b"first-7", idempotency_id="k7")  # waits for that ack (intake)
    payloads, ids = rows(10)
    res = in_thread(lambda: env.write_many(w, payloads, ids))
    a, b = in_flight.result(10), queued.result(10)
    env.history.ok(explicit_key("k5"), b"first-5", a, start)
    env.history.ok(explicit_key("k7"), b"first-7", b, start)
    assert not a.duplicate and not b.duplicate
    assert [i for i, d in enumerate(res.duplicate) if d] == [5, 7]
    assert res.message_id(5) == a.message_id and res.message_id(7) == b.message_id
    env.faults.heal_all()
    assert env.check().keyed_entries == 10


def test_a_node_failing_mid_batch_fails_only_its_rows(env_factory):
    env = env_factory(
        **{"append.max_batch_entries": 20, "append.max_retries": 0, "append.timeout_ms": 20_000}
    )
    w = env.writer()
    healer = threading.Timer(0.3, lambda: env.faults.heal_node("node-0"))
    env.after_adds(4, lambda: (env.faults.fail_node("node-0"), healer.start()))
    payloads, ids = rows(400)
    err = in_thread(lambda: env.write_many(w, payloads, ids))
    assert isinstance(err, (SegmentClosedError, wp.QuorumUnavailableError)), err
    assert "rows failed" in str(err)
    acked = sum(err.acknowledged)
    assert 60 <= acked < 400  # the three batches before the failure landed
    healer.join()
    retry = in_thread(lambda: env.write_many(w, payloads, ids))
    assert isinstance(retry, wp.WriteManyResult), retry
    assert [i for i, d in enumerate(retry.duplicate) if d] == [
        i for i, a in enumerate(err.acknowledged) if a
    ]
    assert env.check().keyed_entries == 400


def test_a_takeover_mid_batch_fences_the_rest(env_factory):
    env = env_factory(**{"append.max_batch_entries": 20})
    a = env.writer()
    taken: list = []
    env.after_adds(4, lambda: taken.append(env.writer()))
    payloads, ids = rows(300)
    err = in_thread(lambda: env.write_many(a, payloads, ids))
    assert isinstance(err, wp.WriterFencedError), err
    assert 60 <= sum(err.acknowledged) < 300
    with pytest.raises(wp.WriterFencedError):
        a.write_many(payloads[:1], ids[:1])
    b = taken[0]
    res = in_thread(lambda: env.write_many(b, payloads, ids))
    assert isinstance(res, wp.WriteManyResult), res
    assert sum(res.duplicate) >= sum(err.acknowledged)  # what landed before the fence is kept
    assert env.check().keyed_entries == 300


def test_a_close_mid_batch_ends_the_call(env_factory):
    # the call waits for room (backpressure) when the close comes: it ends with the close
    env = env_factory(**{"append.max_batch_entries": 20, "append.max_inflight_entries": 40})
    a = env.writer()
    closer = threading.Thread(target=lambda: a.close(timeout=5))
    env.faults.delay("node-0", 20)
    env.after_adds(3, closer.start)
    payloads, ids = rows(600)
    err = in_thread(lambda: env.write_many(a, payloads, ids))
    closer.join(10)
    assert not closer.is_alive()
    assert isinstance(err, wp.WriterClosedError), err
    assert 40 <= sum(err.acknowledged) < 600
    env.faults.heal_all()
    b = env.writer()
    res = in_thread(lambda: env.write_many(b, payloads, ids))
    assert isinstance(res, wp.WriteManyResult)
    assert env.check().keyed_entries == 600


def test_a_timeout_leaves_rows_pending_and_a_retry_joins_them(env_factory):
    env = env_factory(**{"append.max_batch_entries": 10})
    w = env.writer()
    env.faults.delay("node-0", 200)
    payloads, ids = rows(50)
    err = env.write_many(w, payloads, ids, timeout=0.05)
    assert isinstance(err, wp.WriteTimeoutError) and "still pending" in str(err)
    assert sum(err.acknowledged) < 50
    env.faults.heal_all()
    res = env.write_many(w, payloads, ids, timeout=30)
    assert isinstance(res, wp.WriteManyResult)
    assert env.check().keyed_entries == 50


def test_a_segment_completed_inside_a_run_splits_it():
    """Recovery may end a segment inside a run (a node holding part of it): the entries up to the
    end are committed, the rest dropped, each with exactly its rows and joiners."""
    meta = SegmentMeta(1, 0, SegmentState.ACTIVE, ("node-0",), 1, 1, 1, 0)
    seg = OpenSegment(meta, time.monotonic())
    call = BatchCompletion()
    payloads = [b"a", b"b", b"c", b"d", b"e"]
    frame, count = encode_frame(0, 0, 1, payloads, 0, 5)
    waiter = RunRows(call, 10, count)  # rows 10..14
    call.add(waiter)
    run = PendingEntry(1, 0, 0, frame, waiter, 1e18, count)
    seg.pending.append(run)
    seg.by_entry[0] = run
    joiners = [RowJoiner(call, 20), RowJoiner(call, 21)]
    for j in joiners:
        call.add(j)
    run.joiners = [EntryJoiner(joiners[0], 1), EntryJoiner(joiners[1], 3)]
    assert seg.find(3) is run and seg.find(5) is None
    committed, dropped = seg.resolve_completed(1)
    assert [(e.entry_id, e.count) for e in committed] == [(0, 2)]
    assert [(e.entry_id, e.count) for e in dropped] == [(2, 3)]
    assert committed[0].record + dropped[0].record == frame
    assert committed[0].record == encode_frame(0, 0, 1, payloads, 0, 2)[0]
    mid = WriteResult(LogMessageId(0, 0), False)
    for f, _ in committed[0].waiters():
        f.set_result(mid)
    exc = SegmentClosedError("completed at 1")
    for f, _ in dropped[0].waiters():
        f.set_exception(exc)
    call.handed()
    assert call.wait(0) == 0
    row, failed, error = call.first_failure()
    assert (row, failed, error) == (12, 4, exc)  # rows 12..14 and joiner 21
    mask = call.acknowledged(22)
    assert [i for i in range(10, 22) if mask[i]] == [10, 11, 15, 16, 17, 18, 19, 20]


def test_a_batch_across_segment_rolls(env_factory):
    env = env_factory(**{"segment.max_entries": 64, "append.max_batch_entries": 50})
    w = env.writer()
    payloads, ids = rows(500)
    res = env.write_many(w, payloads, ids[:250] + ids[:250])
    assert sum(res.duplicate) == 250
    assert len(set(res.segment_ids)) >= 4
    assert all(
        n <= 64 for n in (list(res.segment_ids[:250]).count(s) for s in set(res.segment_ids))
    )
    assert env.check().keyed_entries == 250


# --- the plain writer's batch lane ---------------------------------------------------------------


def test_plain_write_many_appends_in_order_across_rolls(env_factory):
    env = env_factory(
        **{
            "segment.max_entries": 64,
            "append.max_batch_entries": 50,
            "append.max_inflight_entries": 100,
        }
    )
    w = env.log.open_writer()
    payloads = [b"row %d" % i for i in range(1000)]
    res = w.write_many(payloads)
    assert not any(res.duplicate) and len(res) == 1000
    ids = [res.message_id(i) for i in range(1000)]
    assert ids == sorted(ids) and len(set(ids)) == 1000
    again = w.write_many(payloads[:10])  # a plain writer appends again
    assert again.message_id(0) > ids[-1]
    w.close()
    msgs = list(env.log.open_reader())
    assert [m.payload for m in msgs] == payloads + payloads[:10]
    assert [m.message_id for m in msgs[:1000]] == ids


def test_plain_write_many_refuses_a_bad_row_and_writes_nothing(env_factory):
    env = env_factory(**{"append.max_entry_bytes": 1024})
    w = env.log.open_writer()
    with pytest.raises(wp.PayloadTooLargeError, match=r"payloads\[2\]"):
        w.write_many([b"a", b"b", b"x" * 2000])
    with pytest.raises(wp.InvalidTypeError, match=r"payloads\[1\]"):
        w.write_many([b"a", "b"])  # type: ignore[list-item]
    w.close()
    assert list(env.log.open_reader()) == []


def test_plain_write_many_node_failing_mid_batch(env_factory):
    env = env_factory(
        **{"append.max_batch_entries": 20, "append.max_retries": 0, "append.timeout_ms": 20_000}
    )
    w = env.log.open_writer()
    healer = threading.Timer(0.3, lambda: env.faults.heal_node("node-0"))
    env.after_adds(4, lambda: (env.faults.fail_node("node-0"), healer.start()))
    payloads = [b"row %d" % i for i in range(400)]
    start = env.history.now()
    err = in_thread(lambda: _raised(lambda: w.write_many(payloads)))
    assert isinstance(err, (SegmentClosedError, wp.QuorumUnavailableError)), err
    for i, p in enumerate(payloads):
        if err.acknowledged[i]:
            mid = err.batch_result.message_id(i)
            env.history.ok(None, p, WriteResult(mid, False), start)
        else:
            env.history.failed(None, p, err, start)
    assert 60 <= sum(err.acknowledged) < 400
    healer.join()
    w.close()
    env.check()


def _raised(fn):
    try:
        return fn()
    except WoodpeckerError as exc:
        return exc


def test_write_keyed_refuses_a_row_that_is_not_bytes(env_factory):
    """A str row used to reach the encoder after its chunk's keys were reserved: the call failed
    but left those keys pending in the window with no entry behind them."""
    env = env_factory()
    w = env.writer()
    payloads, ids = rows(5)
    keys = b"".join(explicit_key(i) for i in ids)
    with pytest.raises(wp.InvalidTypeError, match=r"payloads\[3\]"):
        w.write_keyed([*payloads[:3], "x", payloads[4]], keys)  # type: ignore[list-item]
    assert w.window.pending_count == 0 and len(w.window) == 0
    res = w.write_keyed(payloads, keys)
    assert not any(res.duplicate)


def test_write_keyed_refuses_a_row_over_the_entry_limit_naming_it(env_factory):
    env = env_factory(**{"append.max_entry_bytes": 1024})
    w = env.writer()
    payloads, ids = rows(4)
    keys = b"".join(explicit_key(i) for i in ids)
    big = [payloads[0], b"x" * 1025, payloads[2], b"y" * 2000]
    with pytest.raises(wp.PayloadTooLargeError, match=r"row 1: payload is 1025 bytes"):
        w.write_keyed(big, keys)
    assert len(w.window) == 0  # nothing of the batch was written
    assert not any(w.write_keyed(payloads, keys).duplicate)


def test_payloads_over_the_entry_limit_are_refused_naming_the_row(env_factory):
    """A `Payloads` is checked from its longest row: a row over append.max_entry_bytes refuses
    the batch, naming the row, whichever call and however the batch was made."""
    env = env_factory(**{"append.max_entry_bytes": 1024})
    w = env.writer()
    payloads, ids = rows(4)
    keys = b"".join(explicit_key(i) for i in ids)
    big = [payloads[0], payloads[1], b"y" * 1025, b"z" * 5000]
    for batch in (wp.Payloads(big), wp.Payloads.from_arrow(pa.array(big, pa.binary()))):
        with pytest.raises(wp.PayloadTooLargeError, match=r"row 2: payload is 1025 bytes"):
            w.write_keyed(batch, keys)
        with pytest.raises(wp.PayloadTooLargeError, match=r"payloads\[2\]: payload is 1025"):
            w.write_many(batch, ids)
    assert len(w.window) == 0 and w.window.pending_count == 0  # nothing of either was written
    res = w.write_keyed(wp.Payloads(payloads), keys)
    assert not any(res.duplicate)
    again = w.write_many(wp.Payloads.from_arrow(pa.array(payloads)), ids)  # answered
    assert all(again.duplicate) and list(again.entry_ids) == list(res.entry_ids)
    w.close()
    assert [m.payload for m in env.log.open_reader()] == payloads


def test_a_plain_writer_takes_payloads_and_names_a_row_over_the_limit(tmp_path):
    client = wp.connect(tmp_path, {"append.max_entry_bytes": 1024, **QUIET})
    log = client.open_log("plain", create=True)
    with log.open_writer() as w:
        with pytest.raises(wp.PayloadTooLargeError, match=r"payloads\[1\]: payload is 2000"):
            w.write_many(wp.Payloads([b"a", b"x" * 2000]))
        res = w.write_many(wp.Payloads.from_arrow(pa.array(["é", "b"], pa.large_string())))
        assert list(res.entry_ids) == [0, 1]
    assert [m.payload for m in log.open_reader()] == ["é".encode(), b"b"]
    client.close()


def _snapshots_by_keys(tmp_path):
    """A client whose snapshots come by new keys (every 100), not by time."""
    return wp.connect(
        tmp_path,
        {
            "quorum.es": 1,
            "idempotency.snapshot_interval_s": 3600,
            "idempotency.snapshot_threshold": 100,
        },
    )


def test_snapshots_of_a_filling_window_cost_linear_not_quadratic(tmp_path, monkeypatch):
    """A snapshot holds the whole window: one after every `snapshot_threshold` new keys while
    batches fill a large window would encode O(keys^2 / threshold) keys. The next snapshot waits
    for half the last one's keys (if more than the threshold): about 3x the keys in all."""
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_GAP_S", 0.0)  # the key rule alone
    rows, call = 40_000, 500
    client = _snapshots_by_keys(tmp_path)
    try:
        w = client.open_log("snap", create=True).open_writer(
            idempotent=True, window_duration_s=3600, window_max_keys=2 * rows
        )
        for start in range(0, rows, call):
            ids = [f"k{i}" for i in range(start, start + call)]
            w.write_many([b"x" * 100] * call, ids)
        time.sleep(0.2)  # a snapshot kicked by the last commits
        writes = w.metrics_snapshot()["snapshot_writes"]
        written = w.metrics_snapshot()["snapshot_bytes"]
        w.close()
        final = client.objects.get(w.snapshotter.last_key)  # the close's snapshot: every key
        assert len(decode_snapshot(final)) == rows
        assert written <= 4 * len(final), (writes, written, len(final))
    finally:
        client.close()


def test_snapshots_due_by_new_keys_are_a_second_apart(tmp_path):
    """A window filling fast (a Spark task) would write a snapshot, fsynced, every few
    thousand keys; a snapshot due by new keys waits until a second after the last one (or the
    writer's start), then comes by itself."""
    client = _snapshots_by_keys(tmp_path)
    try:
        w = client.open_log("gap", create=True).open_writer(idempotent=True)
        opened = time.monotonic()
        at: list[float] = []
        for batch in range(2):
            w.write_many([b"x"] * 500, [f"{batch}-{i}" for i in range(500)])  # due by keys
            deadline = time.monotonic() + 10
            while w.metrics_snapshot()["snapshot_writes"] == batch:
                assert time.monotonic() < deadline, "a snapshot due by new keys never came"
                time.sleep(0.01)
            at.append(time.monotonic())
        assert at[0] - opened >= 0.8, at[0] - opened  # the gap after the writer's start
        assert at[1] - at[0] >= 0.8, at[1] - at[0]
        w.close()
    finally:
        client.close()
