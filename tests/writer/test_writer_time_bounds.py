"""Time bounds of calls that wait on storage: a batch call's `timeout` covers its wait for room,
and `close(timeout)` returns within its bound while S3 hangs (what could not be done is left to
the next writer, and nothing acknowledged is lost). The bounds are asserted with a generous
margin against a much longer hang, so a busy machine cannot fail them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from gate import gate

import woodpecker_idem as wp
from woodpecker_idem import WriteTimeoutError, explicit_key
from woodpecker_idem.testing.history import History

HOLD_S = 60.0  # how long the storage hangs
TIMEOUT_S = 2.0  # the call's own bound
MARGIN_S = 20.0  # asserted: returns well before the hang ends


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_a_batch_call_waiting_for_room_ends_at_its_timeout(tmp_path: Path, idempotent: bool):
    client = wp.connect(
        tmp_path,
        {"append.max_inflight_entries": 50, "append.max_batch_entries": 10, "quorum.es": 1},
    )
    gated = gate(client)
    gated._max_hold_s = HOLD_S  # noqa: SLF001 - the hang outlasts the call's timeout
    log = client.create_log("room")
    w = log.open_writer(idempotent=True) if idempotent else log.open_writer()
    gated.hold()
    blocked = [w.write_async(b"first-%d" % i) for i in range(50)]  # fills the room, held
    assert gated.waiting.acquire(timeout=30)  # a batch reached the gate: nothing commits
    rows = [b"row-%d" % i for i in range(1000)]
    started = time.monotonic()
    with pytest.raises(WriteTimeoutError) as caught:
        if idempotent:
            w.write_many(rows, [f"id-{i}" for i in range(1000)], timeout=TIMEOUT_S)
        else:
            w.write_many(rows, timeout=TIMEOUT_S)
    took = time.monotonic() - started
    assert took < MARGIN_S, f"write_many(timeout={TIMEOUT_S}) took {took:.1f} s"
    assert caught.value.acknowledged is not None and not any(caught.value.acknowledged)
    gated.release()
    for f in blocked:
        f.result(30)
    w.close()
    entries = list(log.open_reader())
    written = {m.payload for m in entries}
    assert written >= {b"first-%d" % i for i in range(50)}
    # rows refused for want of room were never handed to the writer: none of them landed
    assert not written & set(rows[100:]), "rows refused before they were queued were written"
    client.close()


@pytest.mark.s3
def test_close_returns_within_its_timeout_while_s3_hangs(tmp_path: Path, monkeypatch):
    """Entries and snapshots on S3 (moto), frozen with SIGSTOP after the writes were
    acknowledged: `close(timeout)` cannot complete the segment or write the final snapshot,
    and returns within its bound anyway; after the thaw the next writer completes the segment
    and every acknowledged write is there (judged by the history checker)."""
    from s3server import MotoS3Server

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    history = History()
    with MotoS3Server() as server:
        cfg = {
            "objectstore.type": "s3",
            "objectstore.endpoint_url": server.endpoint_url,
            "objectstore.bucket": f"wp-close-{uuid.uuid4().hex[:12]}",
            "objectstore.create_bucket": True,
            "objectstore.retry_budget_s": HOLD_S,  # each S3 call would retry past the bound
        }
        client = wp.connect(tmp_path, cfg)
        log = client.create_log("hang")
        w = log.open_writer(idempotent=True)
        for i in range(20):
            key = f"k{i}"
            history.call(
                explicit_key(key), key.encode(), lambda k=key: w.write(k.encode(), idempotency_id=k)
            )
        server.freeze()
        try:
            started = time.monotonic()
            w.close(timeout=TIMEOUT_S)
            took = time.monotonic() - started
            started = time.monotonic()
            client.close(timeout=TIMEOUT_S)
            took_client = time.monotonic() - started
        finally:
            server.thaw()
        assert took < MARGIN_S, f"close(timeout={TIMEOUT_S}) took {took:.1f} s while S3 hung"
        assert took_client < MARGIN_S, f"client.close took {took_client:.1f} s"
        c2 = wp.connect(tmp_path, cfg)
        log2 = c2.open_log("hang")
        w2 = log2.open_writer(idempotent=True)  # completes what the close left
        again = w2.write(b"k3", idempotency_id="k3")
        assert again.duplicate
        w2.close()
        verdict = history.check(list(log2.open_reader()), 600_000, 100_000)
        assert verdict.ok, verdict.summary()
        assert verdict.entries == 20
        c2.close()
