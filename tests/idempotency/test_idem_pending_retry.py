"""A retry of a key whose entry is still pending joins that entry: it is answered with the entry's
outcome, never at once as a committed duplicate (docs/semantics.md, "the duplicate flag").

The entry is held at a gate while the retry is judged, then the segment is completed without it
(another writer takes the log over before the held add reaches the node): an early answer would
acknowledge an id that is not in the log. Each way a retry is judged has its case: looked up at
once (nothing queued ahead), admitted from the queue (here by a flush), and a batch call's row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gate import gate

import woodpecker_idem as wp
from woodpecker_idem import ManualClock, explicit_key
from woodpecker_idem.errors import WriterFencedError, WriteTimeoutError
from woodpecker_idem.testing.history import History
from woodpecker_idem.types import LogMessageId, WriteResult

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
# a write queued behind the held batch stays queued until the test admits it (flush), unless the
# machine stalls for a second; the cases then still judge a pending key, through another door
SLOW_LINGER = {"append.linger_ms": 1000}
KEY = explicit_key("K")


def _judge_retry(writer, how: str, history: History, start):
    """Retry K through `how`; returns the retry's future, or None for a batch call (its outcome
    is recorded here: the call returns, or raises once its wait ends, with K still pending)."""
    if how == "lookup":  # nothing queued ahead: the retry is looked up under the lock at once
        return writer.write_async(b"K", idempotency_id="K")
    if how == "admitted":  # queued behind the held batch, then admitted (judged) by a flush
        retry = writer.write_async(b"K", idempotency_id="K")
        with pytest.raises(WriteTimeoutError):
            writer.flush(0)  # admits every queued write, then K's entry is still pending
        return retry
    try:  # the batch lane judges its rows when it cuts them, then waits up to `timeout`
        result = writer.write_many([b"K"], ids=["K"], timeout=0.001)
    except WriteTimeoutError as exc:
        assert exc.acknowledged == bytearray(b"\x00"), "the pending row counted as acknowledged"
        history.failed(KEY, b"K", exc, start)
    else:
        mid = LogMessageId(result.segment_ids[0], result.entry_ids[0])
        history.ok(KEY, b"K", WriteResult(mid, bool(result.duplicate[0])), start)
        pytest.fail(f"a batch row of a pending key was answered at once: {mid}")
    return None


@pytest.mark.parametrize("how", ["lookup", "admitted", "batch"])
def test_a_retry_of_a_pending_key_ends_with_its_entry_dropped(tmp_path: Path, how: str) -> None:
    client = wp.connect(tmp_path, {"quorum.es": 1, **QUIET, **SLOW_LINGER}, clock=ManualClock())
    gated = gate(client)
    log = client.open_log("pending", create=True)
    a = log.open_writer(idempotent=True)
    history = History(client.clock)
    start = history.now()
    gated.hold()
    first = a.write_async(b"K", idempotency_id="K")
    assert gated.waiting.acquire(timeout=30)  # K's add is held before the node: K is pending
    retry = _judge_retry(a, how, history, start)
    if retry is not None:
        assert not retry.done(), f"a retry of a pending key was answered: {retry.result(0)}"
    b = log.open_writer(idempotent=True)  # completes A's segment without K, fences A
    gated.release()
    for fut in [first] if retry is None else [first, retry]:
        with pytest.raises(WriterFencedError):
            fut.result(30)
        history.failed(KEY, b"K", fut.exception(), start)
    assert list(log.open_reader()) == []
    start = history.now()
    again = b.write(b"K", idempotency_id="K", timeout=30)  # K is not in the log: a new write
    history.ok(KEY, b"K", again, start)
    assert not again.duplicate
    a.close()
    b.close()
    verdict = history.check_log(log, 600_000, 100_000)
    assert verdict.ok and verdict.entries == 1, verdict.summary()
    client.close()
