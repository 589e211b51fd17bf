"""The idempotent writer's intake: a write is admitted at once when nothing is in flight; writes
queued while a batch is in flight are admitted in batches (by the ack of that batch, by the
producer once a batch's keys are ready, by flush/close), each judged as of the time it was
queued. A key committed in the window is answered at once unless a write is queued ahead."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gate import GatedTransport, gate

import woodpecker_idem as wp
from woodpecker_idem import ManualClock, WriterFencedError, content_key, explicit_key
from woodpecker_idem.testing.history import History

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
SLOW_LINGER = {"append.linger_ms": 1000}  # nothing is admitted by the flusher during a test step


def _client(path: Path, **cfg: object):
    clock = ManualClock()
    client = wp.connect(path, {"quorum.es": 1, **QUIET, **cfg}, clock=clock)
    return client, clock, client.open_log("intake", create=True)


def _in_flight(w, gated: GatedTransport, payload: bytes = b"blocker"):
    """Hold a batch in flight: writes after this one queue in the intake behind it."""
    gated.hold()
    blocker = w.write_async(payload, idempotency_id=payload.decode())
    assert gated.waiting.acquire(timeout=5)  # its add reached the gate
    return blocker


def _entries(log) -> list[wp.LogMessage]:
    log.open_writer().close()  # a plain writer completes every segment
    return list(log.open_reader())


def test_a_queued_write_is_judged_at_its_queueing_time(tmp_path: Path):
    client, clock, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
    first = w.write_async(b"x", idempotency_id="K")
    w.flush()
    r1 = first.result(5)
    assert r1.duplicate is False
    clock.advance(59_999)  # the retry is queued inside the window ...
    blocker = _in_flight(w, gated)
    ahead = w.write_async(b"a", idempotency_id="A")  # queued: a batch is in flight
    retry = w.write_async(b"x", idempotency_id="K")  # queued behind it, not answered early
    assert w.metrics_snapshot()["pending"] == 3  # the blocker's entry and two queued writes
    assert not retry.done()
    clock.advance(10)  # ... and admitted after the window has passed: still a duplicate
    gated.release()
    w.flush()
    assert retry.result(5) == wp.WriteResult(r1.message_id, True)
    late = w.write_async(b"x", idempotency_id="K")  # queued after the window: a new write
    w.flush()
    r3 = late.result(5)
    assert r3.duplicate is False and r3.message_id != r1.message_id
    w.close()
    expected = [r1, blocker.result(5), ahead.result(5), r3]
    assert [m.message_id for m in _entries(log)] == [r.message_id for r in expected]
    client.close()


def test_one_batch_mixes_ids_and_content_keys_with_repeats(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    _in_flight(w, gated)
    writes = [
        (b"a-payload", "a"),
        (b"p", None),
        (b"a-again", "a"),  # joins the first row, queued in the same batch
        (b"p", None),  # same content key as row 1
        (b"q", None),
        (b"p", "p-as-id"),  # an id never equals a content key
        (b"b", "b"),
    ]
    futures = [w.write_async(p, idempotency_id=i) for p, i in writes]
    assert w.queued == len(writes)
    gated.release()
    w.flush()
    results = [f.result(5) for f in futures]
    assert [r.duplicate for r in results] == [False, False, True, True, False, False, False]
    assert results[2].message_id == results[0].message_id
    assert results[3].message_id == results[1].message_id
    w.close()
    msgs = _entries(log)
    assert [m.payload for m in msgs] == [b"blocker", b"a-payload", b"p", b"q", b"p", b"b"]
    assert [m.idempotency_key for m in msgs] == [
        explicit_key("blocker"),
        explicit_key("a"),
        content_key(b"p"),
        content_key(b"q"),
        explicit_key("p-as-id"),
        explicit_key("b"),
    ]
    client.close()


def test_a_repeat_inside_one_run_joins_its_entry_and_waits_for_its_commit(tmp_path: Path):
    """Two writes of one key admitted in the same run: the first makes the entry, the second
    joins it (one entry in the log) and is answered only when that entry commits, with its id.
    Guards the run builder's order: a row whose key an earlier row of its run is writing is
    joined after the run is enqueued, not answered from the pending id before the commit."""
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    blocker = _in_flight(w, gated)
    first = w.write_async(b"a", idempotency_id="A")  # both queued behind the held batch
    again = w.write_async(b"a-again", idempotency_id="A")
    with ThreadPoolExecutor(1) as pool:
        flushing = pool.submit(w.flush)  # admits both in one run, then waits for the gate
        deadline = time.monotonic() + 30
        while w.queued and time.monotonic() < deadline:
            time.sleep(0.005)
        assert w.queued == 0
        assert w.window.pending_count == 2  # the blocker's entry and A's: the repeat made none
        assert not again.done(), "a repeat was answered before the entry it joined committed"
        gated.release()
        flushing.result(30)
    r = first.result(5)
    assert not r.duplicate and again.result(5) == wp.WriteResult(r.message_id, True)
    assert not blocker.result(5).duplicate
    w.close()
    assert [m.payload for m in _entries(log)] == [b"blocker", b"a"]
    client.close()


def test_the_producer_admits_full_batches_itself(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER, **{"append.max_batch_entries": 100})
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    _in_flight(w, gated)
    futures = [w.write_async(b"v%d" % i, idempotency_id=f"id-{i}") for i in range(5000)]
    # no ack comes while the gate holds the first batch: the producer admitted batches itself
    # as soon as their keys were ready (ids are hashed as they are pushed)
    assert w.queued < 4000
    admitted = 5000 - w.queued
    assert w.window.pending_count + w.window.committed_count == admitted + 1  # + the blocker
    gated.release()
    w.flush()
    ids = [f.result(5).message_id for f in futures]
    assert len(set(ids)) == 5000 and ids == sorted(ids)
    w.close()
    client.close()


@pytest.mark.parametrize("limit", [{"segment.max_entries": 7}, {"segment.max_size_bytes": 1024}])
def test_an_admitted_batch_rolls_segments_at_their_limits(tmp_path: Path, limit):
    client, _, log = _client(tmp_path, **limit)
    w = log.open_writer(idempotent=True)
    payloads = [b"%04d" % i * 75 for i in range(100)]  # 300 B each
    res = w.write_many(payloads, [f"id-{i}" for i in range(100)])
    assert not any(res.duplicate)
    again = w.write_many(payloads, [f"id-{i}" for i in range(100)])
    assert all(again.duplicate) and list(again.entry_ids) == list(res.entry_ids)
    w.close()
    msgs = _entries(log)
    assert [m.payload for m in msgs] == payloads
    per_segment: dict[int, int] = {}
    for m in msgs:
        per_segment[m.message_id.segment_id] = per_segment.get(m.message_id.segment_id, 0) + 1
    assert len(per_segment) > 10 and max(per_segment.values()) <= 7
    client.close()


def test_a_fenced_writer_fails_its_queued_writes(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    a = log.open_writer(idempotent=True)
    blocker = _in_flight(a, gated)
    queued = a.write_async(b"q", idempotency_id="Q")
    assert a.queued == 1
    b = log.open_writer(idempotent=True)  # takes the log over (recovery adds nothing)
    assert a.still_owner() is False
    with pytest.raises(WriterFencedError):
        queued.result(5)
    with pytest.raises(WriterFencedError):
        blocker.result(5)
    # The fence emptied the intake, so the next write is checked (a write queued behind others
    # is checked once per intake) and refused at once, not queued where nobody admits it.
    assert a.queued == 0
    with pytest.raises(WriterFencedError):
        a.write_async(b"late", idempotency_id="late")
    gated.release()  # A's held add reaches a fenced segment: refused
    r = b.write_async(b"q", idempotency_id="Q")
    b.flush()
    assert r.result(5).duplicate is False  # A wrote nothing
    b.close()
    history = History()
    history.failed(explicit_key("Q"), b"q", WriterFencedError("fenced"))
    history.failed(explicit_key("blocker"), b"blocker", WriterFencedError("fenced"))
    history.ok(explicit_key("Q"), b"q", r.result())
    assert history.check(_entries(log), 600_000, 100_000).ok
    a.close()
    client.close()


def test_close_admits_and_commits_queued_writes(tmp_path: Path):
    client, _, log = _client(tmp_path)
    w = log.open_writer(idempotent=True)
    futures = [w.write_async(b"c%d" % i) for i in range(5)]
    w.close()
    assert [f.result(0).message_id.entry_id for f in futures] == [0, 1, 2, 3, 4]
    assert w.queued == 0  # so a later write is checked, and refused at once
    with pytest.raises(wp.WriterClosedError):
        w.write_async(b"late")
    assert [m.payload for m in _entries(log)] == [b"c%d" % i for i in range(5)]
    client.close()


def test_a_lone_write_is_admitted_and_sent_at_once(tmp_path: Path):
    """Nothing in flight: a write waits for no company (append.linger_ms is not a delay)."""
    # the longest linger: five writes that each waited for it take 5 s, five sent at once take
    # milliseconds (half of that 5 s leaves a loaded machine room)
    client, _, log = _client(tmp_path, **{"append.linger_ms": 1000})
    w = log.open_writer(idempotent=True)
    t0 = time.monotonic()
    for i in range(5):
        r = w.write(b"lone-%d" % i, idempotency_id=f"lone-{i}", timeout=30)
        assert r.duplicate is False
    assert time.monotonic() - t0 < 2.5, "lone writes waited for a linger"
    w.close()
    client.close()


@pytest.mark.parametrize("ident", ["K", None])
def test_a_committed_duplicate_is_answered_without_the_intake(tmp_path: Path, ident):
    """No write queued ahead: a key committed in the window returns at once, while the batch in
    flight is stalled (no ack, no admission), for explicit ids and content keys alike."""
    client, _, log = _client(tmp_path, **{"append.linger_ms": 500})
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    r1 = w.write(b"payload", idempotency_id=ident, timeout=5)
    blocker = _in_flight(w, gated)
    assert w.write(b"payload", idempotency_id=ident, timeout=30) == wp.WriteResult(
        r1.message_id, True
    )
    again = w.write_async(b"payload", idempotency_id=ident)
    # answered while the batch ahead never acks: no wait could have ended it
    assert again.done() and again.result(0) == wp.WriteResult(r1.message_id, True)
    assert w.metrics_snapshot()["duplicates_suppressed"] == 2
    gated.release()
    assert blocker.result(5).duplicate is False
    w.close()
    assert [m.message_id for m in _entries(log)] == [r1.message_id, blocker.result().message_id]
    client.close()


def test_a_duplicate_queued_behind_a_write_is_judged_after_it(tmp_path: Path):
    """Ordering (docs/semantics.md): with a write queued ahead, a committed key is not answered
    early but judged in queueing order; a repeat of a queued key joins the queued write."""
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    r1 = w.write(b"x", idempotency_id="K", timeout=5)
    _in_flight(w, gated)
    first_n = w.write_async(b"n1", idempotency_id="N")  # queued behind the batch in flight
    second_n = w.write_async(b"n2", idempotency_id="N")  # same key, queued after it
    with ThreadPoolExecutor(1) as pool:
        # committed, but writes are queued ahead: write() queues it too (it hashes the key in
        # the caller's thread, write_async leaves that to the intake while writes are queued)
        k = pool.submit(w.write, b"x", idempotency_id="K", timeout=10)
        deadline = time.monotonic() + 5
        while w.queued < 3 and not k.done():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        k_async = w.write_async(b"x", idempotency_id="K")
        assert not any(f.done() for f in (first_n, second_n, k, k_async))
        assert w.queued == 4
        gated.release()
        w.flush()
        n = first_n.result(5)
        assert n.duplicate is False
        assert second_n.result(5) == wp.WriteResult(n.message_id, True)
        assert k.result(5) == k_async.result(5) == wp.WriteResult(r1.message_id, True)
    w.close()
    assert [m.payload for m in _entries(log)] == [b"x", b"blocker", b"n1"]
    client.close()


class _Interrupted:
    """Makes one intake column's next append land and then raise KeyboardInterrupt, as Ctrl-C
    does when it arrives right after a call returns."""

    def __init__(self, intake: object, column: str) -> None:
        self.intake, self.column = intake, column
        self.original = getattr(intake, column)
        base = type(self.original)

        class Column(base):  # type: ignore[valid-type, misc]
            def append(self, item: object) -> None:
                super().append(item)
                raise KeyboardInterrupt

        if base is list:
            cut = Column(self.original)
        else:  # array.array
            cut = Column(self.original.typecode)
            cut.extend(self.original)
        setattr(intake, column, cut)

    def restore(self) -> None:
        """Put a plain column with the same contents back."""
        cut = getattr(self.intake, self.column)
        plain = type(self.original)(self.original.typecode) if hasattr(cut, "typecode") else []
        plain.extend(cut)
        setattr(self.intake, self.column, plain)


@pytest.mark.parametrize("column", ["timestamps", "payloads", "properties", "futures"])
def test_ctrl_c_between_two_columns_leaves_the_intake_whole(tmp_path: Path, column: str):
    """A write cut short between the intake's columns is not queued (the call raised, nobody
    holds its future) and the writes around it go on: before this, the columns differed in
    length and the next admission failed, close() included, so the process aborted at exit."""
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
    blocker = _in_flight(w, gated)  # later writes queue in the intake
    queued = [w.write_async(b"before", idempotency_id="before")]
    cut = _Interrupted(w._acc, column)  # fault injection: a column of the queue itself
    with pytest.raises(KeyboardInterrupt):
        w.write_async(b"cut", idempotency_id="cut")
    cut.restore()
    queued.append(w.write_async(b"after", idempotency_id="after"))
    gated.release()
    w.flush()
    results = [f.result(10) for f in [blocker, *queued]]
    w.close()
    assert [r.duplicate for r in results] == [False, False, False]
    assert [m.payload for m in _entries(log)] == [b"blocker", b"before", b"after"]
    client.close()


def test_a_bad_id_after_an_early_admission_still_answers_the_admitted_writes(tmp_path: Path):
    """A write that finds the in-flight limit reached admits the queued writes first; when it
    then fails itself (a bad id here; closed or fenced while waiting for room likewise), the
    outcomes that admission decided (a committed key answered at once) still reach their
    callers, set by the failing call itself once it released the lock (not by a thread started
    per error). Before, they were dropped with the exception and those futures never ended."""
    limits = {"append.max_inflight_entries": 3, "append.max_batch_entries": 3}
    client, _, log = _client(tmp_path, **SLOW_LINGER, **limits)
    gated = gate(client)
    w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
    first = w.write(b"k", idempotency_id="K")
    blocker = _in_flight(w, gated)
    ahead = w.write_async(b"a", idempotency_id="A")  # queued behind the batch in flight
    retry = w.write_async(b"k", idempotency_id="K")  # queued behind A: judged at admission
    with pytest.raises(wp.InvalidArgumentError):
        w.write_async(b"bad", idempotency_id="")  # the limit is reached: A and K admitted first
    # set by the failing call itself once its lock was released, before it raised (no thread)
    assert retry.done()
    assert retry.result(5) == wp.WriteResult(first.message_id, True)
    gated.release()
    assert not ahead.result(5).duplicate and not blocker.result(5).duplicate
    w.close()
    client.close()


def test_writes_queued_during_a_close_end_with_writer_closed(tmp_path: Path):
    """A write queued behind another is not checked again (once per intake); a close must still
    end it: the writes queued while the close waits for its flush fail with WriterClosedError,
    and a write after the close is refused at once."""
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    gated = gate(client)
    w = log.open_writer(idempotent=True)
    blocker = _in_flight(w, gated)
    with ThreadPoolExecutor(1) as pool:
        closing = pool.submit(w.close, 1.0)  # its flush waits for the held batch, then gives up
        time.sleep(0.2)  # the close is in its flush (1 s) now
        late = [w.write_async(b"late-%d" % i, idempotency_id=f"late-{i}") for i in range(3)]
        assert w.queued == 3  # the second and third were queued without a check
        closing.result(10)
    for f in [blocker, *late]:
        with pytest.raises(wp.WriterClosedError):
            f.result(0)
    with pytest.raises(wp.WriterClosedError):
        w.write_async(b"after")
    gated.release()
    client.close()
