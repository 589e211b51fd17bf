"""Tests of the history checker itself (woodpecker_idem.history): it must catch what it is for.

Logs here are hand-made lists of LogMessage, so each violation is exact; one test runs it over a
real log as well.
"""

from __future__ import annotations

from pathlib import Path

import woodpecker_idem as wp
from woodpecker_idem import LogMessage, LogMessageId, ManualClock, WriteResult, explicit_key
from woodpecker_idem.history import History

T0 = 1_700_000_000_000
WINDOW_MS = 10_000


def K(name: str) -> bytes:
    return explicit_key(name)


def msg(seg: int, entry: int, key: bytes | None, ts: int = T0) -> LogMessage:
    return LogMessage(LogMessageId(seg, entry), b"p", {}, ts, key)


def ok(h: History, key: bytes, seg: int, entry: int, dup: bool = False) -> None:
    h.ok(key, WriteResult(LogMessageId(seg, entry), dup))


def test_clean_history_passes():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    ok(h, K("a"), 0, 0, dup=True)
    h.failed(K("c"), TimeoutError("t"))  # a failed attempt may or may not have landed
    log = [msg(0, 0, K("a")), msg(0, 1, K("b")), msg(0, 2, K("c")), msg(0, 3, None)]
    v = h.check(log, WINDOW_MS, 100)
    assert v.ok, v.summary()
    assert v.acknowledged_keys == 2 and v.duplicates_returned == 1
    assert v.entries == 4 and v.keyed_entries == 3
    assert "PASS" in v.summary()


def test_flags_duplicate_within_window():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 5)
    log = [msg(0, 0, K("a"), T0), msg(0, 5, K("a"), T0 + WINDOW_MS - 1)]
    v = h.check(log, WINDOW_MS, 100)
    assert not v.ok
    assert any("appears at" in p and "in window" in p for p in v.problems), v.problems
    assert "FAIL" in v.summary()


def test_flags_duplicate_across_segments_even_if_unacknowledged():
    h = History()
    ok(h, K("a"), 0, 0)
    h.failed(K("a"), RuntimeError("x"))
    log = [msg(0, 0, K("a")), msg(1, 0, K("a"), T0 + 5)]
    v = h.check(log, WINDOW_MS, 100)
    assert not v.ok and len(v.problems) == 1


def test_accepts_rewrite_after_window():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 1)
    log = [msg(0, 0, K("a"), T0), msg(0, 1, K("a"), T0 + WINDOW_MS)]  # exactly window old
    v = h.check(log, WINDOW_MS, 100)
    assert v.ok, v.summary()
    assert v.rewritten_after_window == 1


def test_accepts_rewrite_after_capacity_eviction():
    # K is followed by max_keys other keys: it left the newest max_keys, a rewrite is allowed
    max_keys = 3
    h = History()
    log = [msg(0, 0, K("a"))]
    ok(h, K("a"), 0, 0)
    for i, name in enumerate(["b", "c", "d"], start=1):
        log.append(msg(0, i, K(name)))
        ok(h, K(name), 0, i)
    log.append(msg(0, 4, K("a")))
    ok(h, K("a"), 0, 4)
    v = h.check(log, WINDOW_MS, max_keys)
    assert v.ok, v.summary()
    assert v.rewritten_after_window == 1


def test_flags_duplicate_while_among_newest_max_keys():
    # DESIGN.md 1.1: K is in the window iff it is among the newest window_max_keys committed keys.
    # With max_keys=3 and K followed by 2 others, the committed keys are [a, b, c]: a is among the
    # newest 3, so writing a again must not create an entry (the writer's DedupWindow agrees).
    max_keys = 3
    window = wp.DedupWindow(max_keys, WINDOW_MS)
    for i, name in enumerate(["a", "b", "c"]):
        window.add_committed(K(name), 0, i, T0)
    assert window.get(K("a"), T0) is not None, "the writer still deduplicates a"
    h = History()
    log = []
    for i, name in enumerate(["a", "b", "c", "a"]):
        log.append(msg(0, i, K(name)))
        ok(h, K(name), 0, i)
    v = h.check(log, WINDOW_MS, max_keys)
    assert not v.ok, "a duplicate among the newest window_max_keys keys was not flagged"


def test_flags_lost_acknowledged_write():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    v = h.check([msg(0, 0, K("a"))], WINDOW_MS, 100)
    assert not v.ok
    assert len(v.problems) == 1 and "lost" in v.problems[0]


def test_flags_wrong_id():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    ok(h, K("b"), 0, 0, dup=True)  # a retry of b answered with a's id
    v = h.check([msg(0, 0, K("a")), msg(0, 1, K("b"))], WINDOW_MS, 100)
    assert not v.ok
    assert len(v.problems) == 1 and "holds" in v.problems[0]


def test_flags_acknowledged_id_holding_unkeyed_entry():
    h = History()
    ok(h, K("a"), 0, 0)
    v = h.check([msg(0, 0, None)], WINDOW_MS, 100)
    assert not v.ok and "no key" in v.problems[0]


def test_flags_invented_entry():
    h = History()
    ok(h, K("a"), 0, 0)
    v = h.check([msg(0, 0, K("a")), msg(0, 1, K("ghost"))], WINDOW_MS, 100)
    assert not v.ok
    assert len(v.problems) == 1 and "never written" in v.problems[0]


def test_history_is_thread_safe():
    import threading

    h = History()

    def go(n: int) -> None:
        for i in range(500):
            ok(h, K(f"{n}-{i}"), n, i)

    ts = [threading.Thread(target=go, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(h.attempts) == 2000


def test_real_log_passes_and_tampering_fails(tmp_path: Path):
    clock = ManualClock()
    client = wp.connect(tmp_path, {"idempotency.snapshot_interval_s": 3600}, clock=clock)
    log = client.open_log("h", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=10, window_max_keys=100)
    h = History()
    for i in range(20):
        h.ok(K(f"k{i % 7}"), w.write(b"x", idempotency_id=f"k{i % 7}"))
    clock.advance(10_000)
    h.ok(K("k0"), w.write(b"x", idempotency_id="k0"))  # after the window: a new entry
    w.close()
    msgs = list(log.open_reader())
    v = h.check(msgs, 10_000, 100)
    assert v.ok, v.summary()
    assert v.keyed_entries == 8 and v.rewritten_after_window == 1
    # the same log judged with a longer window: the rewrite is now a duplicate
    assert not h.check(msgs, 10_001, 100).ok
    # drop one entry: an acknowledged write is lost
    assert not h.check(msgs[1:], 10_000, 100).ok
    client.close()
