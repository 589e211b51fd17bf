"""The idempotent writer's intake: writes are queued, then admitted in batches (by the producer
once a batch's keys are ready, by the flusher after linger_ms, by flush/close), each judged as
of the time it was queued."""

from __future__ import annotations

from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import ManualClock, WriterFencedError, content_key, explicit_key
from woodpecker_idem.history import History

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
SLOW_LINGER = {"append.linger_ms": 1000}  # nothing is admitted by the flusher during a test step


def _client(path: Path, **cfg: object):
    clock = ManualClock()
    client = wp.connect(path, {"quorum.es": 1, **QUIET, **cfg}, clock=clock)
    return client, clock, client.open_log("intake", create=True)


def _entries(log) -> list[wp.LogMessage]:
    log.open_writer().close()  # a plain writer completes every segment
    return list(log.open_reader())


def test_a_queued_write_is_judged_at_its_queueing_time(tmp_path: Path):
    client, clock, log = _client(tmp_path, **SLOW_LINGER)
    w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
    first = w.write_async(b"x", idempotency_id="K")
    w.flush()
    r1 = first.result(5)
    assert r1.duplicate is False
    clock.advance(59_999)  # the retry is queued inside the window ...
    retry = w.write_async(b"x", idempotency_id="K")
    assert w.metrics_snapshot()["pending"] == 1  # queued, not admitted yet
    clock.advance(10)  # ... and admitted after the window has passed: still a duplicate
    w.flush()
    assert retry.result(5) == wp.WriteResult(r1.message_id, True)
    late = w.write_async(b"x", idempotency_id="K")  # queued after the window: a new write
    w.flush()
    r3 = late.result(5)
    assert r3.duplicate is False and r3.message_id != r1.message_id
    w.close()
    assert [m.message_id for m in _entries(log)] == [r1.message_id, r3.message_id]
    client.close()


def test_one_batch_mixes_ids_and_content_keys_with_repeats(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    w = log.open_writer(idempotent=True)
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
    assert len(w._intake) == len(writes)
    w.flush()
    results = [f.result(5) for f in futures]
    assert [r.duplicate for r in results] == [False, False, True, True, False, False, False]
    assert results[2].message_id == results[0].message_id
    assert results[3].message_id == results[1].message_id
    w.close()
    msgs = _entries(log)
    assert [m.payload for m in msgs] == [b"a-payload", b"p", b"q", b"p", b"b"]
    assert [m.idempotency_key for m in msgs] == [
        explicit_key("a"),
        content_key(b"p"),
        content_key(b"q"),
        explicit_key("p-as-id"),
        explicit_key("b"),
    ]
    client.close()


def test_the_producer_admits_full_batches_itself(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER, **{"append.max_batch_entries": 100})
    w = log.open_writer(idempotent=True)
    futures = [w.write_async(b"v%d" % i, idempotency_id=f"id-{i}") for i in range(5000)]
    # the flusher admits nothing for a second (linger): the producer admitted batches itself
    # as soon as their keys were ready (ids are hashed as they are pushed)
    assert len(w._intake) < 4000
    admitted = 5000 - len(w._intake)
    assert w.window.pending_count + w.window.committed_count == admitted
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
    a = log.open_writer(idempotent=True)
    queued = a.write_async(b"q", idempotency_id="Q")
    b = log.open_writer(idempotent=True)  # takes the log over
    assert a._still_owner() is False
    with pytest.raises(WriterFencedError):
        queued.result(5)
    r = b.write_async(b"q", idempotency_id="Q")
    b.flush()
    assert r.result(5).duplicate is False  # A wrote nothing
    b.close()
    history = History()
    history.failed(explicit_key("Q"), b"q", WriterFencedError("fenced"))
    history.ok(explicit_key("Q"), b"q", r.result())
    assert history.check(_entries(log), 600_000, 100_000).ok
    a.close()
    client.close()


def test_close_admits_and_commits_queued_writes(tmp_path: Path):
    client, _, log = _client(tmp_path, **SLOW_LINGER)
    w = log.open_writer(idempotent=True)
    futures = [w.write_async(b"c%d" % i) for i in range(5)]
    w.close()
    assert [f.result(0).message_id.entry_id for f in futures] == [0, 1, 2, 3, 4]
    assert [m.payload for m in _entries(log)] == [b"c%d" % i for i in range(5)]
    client.close()


def test_the_flusher_admits_a_lone_write_after_linger(tmp_path: Path):
    client, _, log = _client(tmp_path, **{"append.linger_ms": 20})
    w = log.open_writer(idempotent=True)
    r = w.write(b"lone", idempotency_id="lone", timeout=5)  # nobody flushes: the flusher admits
    assert r.duplicate is False
    assert w.write(b"lone", idempotency_id="lone", timeout=5) == wp.WriteResult(r.message_id, True)
    w.close()
    client.close()
