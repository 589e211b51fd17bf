"""Tests of the history checker itself (woodpecker_idem.testing.history): it must catch its kinds.

Logs here are hand-made lists of LogMessage and attempts carry hand-made times, so each violation
is exact. Each kind of violation has a history that must FAIL naming that kind, next to the
corrected history that must PASS. One test runs the checker over a real log as well.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import woodpecker_idem as wp
from woodpecker_idem import (
    LogMessage,
    LogMessageId,
    ManualClock,
    WriteResult,
    WriteTimeoutError,
    explicit_key,
)
from woodpecker_idem._core import DedupWindow, encode_entry
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.testing.history import (
    CREATED_TWICE,
    DUPLICATE,
    INVENTED,
    KINDS,
    LOST,
    READER,
    REPLICAS,
    STALE_ID,
    TIMESTAMP,
    UNKEYED_COPY,
    WRONG_ID,
    WRONG_PAYLOAD,
    History,
    Stamp,
    Verdict,
    read_stored,
)
from woodpecker_idem.types import SegmentState

T0 = 1_700_000_000_000
WINDOW_MS = 10_000


def K(name: str) -> bytes:
    return explicit_key(name)


def at(ms: int) -> Stamp:
    """A moment `ms` after T0 on both clocks (hand-made histories have one timeline)."""
    return Stamp(T0 + ms, ms * 1_000_000)


def msg(seg: int, entry: int, key: bytes | None, ts: int = 0, payload: bytes = b"p") -> LogMessage:
    return LogMessage(LogMessageId(seg, entry), payload, {}, T0 + ts, key)


def ok(
    h: History,
    key: bytes | None,
    seg: int,
    entry: int,
    dup: bool = False,
    t: tuple[int, int] = (0, 1),
    payload: bytes = b"p",
) -> None:
    h.ok(key, payload, WriteResult(LogMessageId(seg, entry), dup), at(t[0]), at(t[1]))


def failed(
    h: History,
    key: bytes | None,
    t: tuple[int, int],
    payload: bytes = b"p",
    error: BaseException | None = None,
) -> None:
    h.failed(key, payload, error or RuntimeError("x"), at(t[0]), at(t[1]))


def judge(h: History, log: list[LogMessage], max_keys: int = 100):
    return h.check(log, WINDOW_MS, max_keys)


def fails_with(h: History, log: list[LogMessage], kind: str, max_keys: int = 100) -> None:
    v = judge(h, log, max_keys)
    assert not v.ok, f"{kind} passed: {v.summary()}"
    assert kind in v.kinds, v.problems
    assert "FAIL" in v.summary()


def passes(h: History, log: list[LogMessage], max_keys: int = 100):
    v = judge(h, log, max_keys)
    assert v.ok, v.summary()
    return v


def test_clean_history_passes():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1, t=(2, 3))
    ok(h, K("a"), 0, 0, dup=True, t=(4, 5))
    failed(h, K("c"), (6, 7))  # a failed attempt may or may not have landed
    ok(h, None, 0, 3, t=(8, 9), payload=b"plain")  # a plain write (no key)
    log = [
        msg(0, 0, K("a")),
        msg(0, 1, K("b"), 2),
        msg(0, 2, K("c"), 6),
        msg(0, 3, None, 8, b"plain"),
    ]
    v = passes(h, log)
    assert v.acknowledged_keys == 3 and v.duplicates_returned == 1
    assert v.entries == 4 and v.keyed_entries == 3
    assert "PASS" in v.summary()


def test_flags_duplicate_within_window():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 5, t=(WINDOW_MS - 2, WINDOW_MS - 1))
    fails_with(h, [msg(0, 0, K("a")), msg(0, 5, K("a"), WINDOW_MS - 2)], DUPLICATE)


def test_flags_duplicate_across_segments_even_if_the_second_was_not_acknowledged():
    h = History()
    ok(h, K("a"), 0, 0)
    failed(h, K("a"), (5, 6))
    fails_with(h, [msg(0, 0, K("a")), msg(1, 0, K("a"), 5)], DUPLICATE)


def test_accepts_rewrite_after_window():
    h = History()
    ok(h, K("a"), 0, 0, t=(0, 0))
    ok(h, K("a"), 0, 1, t=(WINDOW_MS, WINDOW_MS))  # exactly window old
    v = passes(h, [msg(0, 0, K("a")), msg(0, 1, K("a"), WINDOW_MS)])
    assert v.rewritten_after_window == 1


def test_accepts_rewrite_after_capacity_eviction():
    # K is followed by max_keys other committed keys: it left the newest max_keys, a rewrite is
    # allowed
    h = History()
    log = [msg(0, 0, K("a"))]
    ok(h, K("a"), 0, 0)
    for i, name in enumerate(["b", "c", "d"], start=1):
        log.append(msg(0, i, K(name), 2 * i))
        ok(h, K(name), 0, i, t=(2 * i, 2 * i + 1))
    log.append(msg(0, 4, K("a"), 10))
    ok(h, K("a"), 0, 4, t=(10, 11))
    v = passes(h, log, max_keys=3)
    assert v.rewritten_after_window == 1


def test_flags_duplicate_while_among_newest_max_keys():
    # docs/semantics.md: K is in the window iff it is among the newest window_max_keys committed
    # keys.
    # With max_keys=3 and K followed by 2 others, the committed keys are [a, b, c]: a is among the
    # newest 3, so writing a again must not create an entry (the writer's DedupWindow agrees).
    window = DedupWindow(3, WINDOW_MS)
    for i, name in enumerate(["a", "b", "c"]):
        window.add_committed(K(name), 0, i, T0)
    assert window.get(K("a"), T0) is not None, "the writer still deduplicates a"
    h = History()
    log = []
    for i, name in enumerate(["a", "b", "c", "a"]):
        log.append(msg(0, i, K(name), 2 * i))
        ok(h, K(name), 0, i, t=(2 * i, 2 * i + 1))
    fails_with(h, log, DUPLICATE, max_keys=3)


def test_flags_lost_acknowledged_write():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    fails_with(h, [msg(0, 0, K("a"))], LOST)


def test_flags_wrong_id():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    ok(h, K("b"), 0, 0, dup=True, t=(2, 3))  # a retry of b answered with a's id
    fails_with(h, [msg(0, 0, K("a")), msg(0, 1, K("b"))], WRONG_ID)


def test_flags_acknowledged_id_holding_unkeyed_entry():
    h = History()
    ok(h, K("a"), 0, 0)
    fails_with(h, [msg(0, 0, None)], WRONG_ID)


def test_flags_invented_keyed_entry():
    h = History()
    ok(h, K("a"), 0, 0)
    fails_with(h, [msg(0, 0, K("a")), msg(0, 1, K("ghost"))], INVENTED)


def test_flags_two_entries_from_one_attempt():
    # one failed attempt can have created one entry, not two (even a window apart)
    h = History()
    failed(h, K("a"), (0, 3 * WINDOW_MS))
    fails_with(h, [msg(0, 0, K("a")), msg(0, 1, K("a"), 2 * WINDOW_MS)], INVENTED)


# --- the seven kinds the checker used to pass (issue 11 item 13) -------------------------------


def test_kind_a_capacity_counts_committed_keys_only():
    # max_keys=2. K is committed; b and c are written and stay pending (their calls time out at
    # 40 ms, still pending); K is written again at 20 ms. Only committed keys count: K was still
    # among the newest 2, so the second entry is a duplicate in the window.
    def history(b_and_c_acked: bool) -> History:
        h = History()
        ok(h, K("K"), 0, 0)
        for i, name in ((1, "b"), (2, "c")):
            if b_and_c_acked:
                ok(h, K(name), 0, i, t=(10, 15))
            else:
                failed(h, K(name), (10, 40), error=WriteTimeoutError("pending"))
        failed(h, K("K"), (20, 25), error=WriteTimeoutError("pending"))
        return h

    log = [msg(0, 0, K("K")), msg(0, 1, K("b"), 10), msg(0, 2, K("c"), 10), msg(0, 3, K("K"), 20)]
    fails_with(history(False), log, DUPLICATE, max_keys=2)
    # corrected: b and c were acknowledged (committed) before K's second call: K was evicted
    v = passes(history(True), log, max_keys=2)
    assert v.rewritten_after_window == 1


def test_kind_b_unkeyed_copy_of_a_duplicate():
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 0, dup=True, t=(2, 3))
    log = [msg(0, 0, K("a")), msg(0, 1, None, 2)]  # the retry was appended without its key
    fails_with(h, log, UNKEYED_COPY)
    # corrected: a plain writer wrote that payload too
    failed(h, None, (2, 3))
    passes(h, log)


def test_kind_c_stale_id_after_a_rewrite():
    def history(answer: int) -> History:
        h = History()
        ok(h, K("a"), 0, 0)
        ok(h, K("a"), 0, 1, t=(WINDOW_MS + 5, WINDOW_MS + 6))  # rewritten after its window
        ok(h, K("a"), 0, answer, dup=True, t=(WINDOW_MS + 10, WINDOW_MS + 11))
        return h

    log = [msg(0, 0, K("a")), msg(0, 1, K("a"), WINDOW_MS + 5)]
    fails_with(history(0), log, STALE_ID)
    passes(history(1), log)  # corrected: the duplicate returns the new id


def test_kind_d_two_attempts_claim_one_entry():
    def history(second_dup: bool) -> History:
        h = History()
        ok(h, K("a"), 0, 0)
        ok(h, K("a"), 0, 0, dup=second_dup, t=(2, 3))
        return h

    fails_with(history(False), [msg(0, 0, K("a"))], CREATED_TWICE)
    passes(history(True), [msg(0, 0, K("a"))])


def test_kind_e_timestamps_come_from_the_attempts():
    # the two calls were 100 ms apart; the log claims the second entry is a window later
    h = History()
    ok(h, K("a"), 0, 0, t=(0, 1))
    ok(h, K("a"), 0, 1, t=(100, 101))
    forged = [msg(0, 0, K("a"), 0), msg(0, 1, K("a"), WINDOW_MS + 100)]
    v = judge(h, forged)
    assert not v.ok and {DUPLICATE, TIMESTAMP} <= v.kinds, v.problems
    # the forged timestamp alone is found too (even when the window is not at stake)
    h2 = History()
    ok(h2, K("a"), 0, 0, t=(0, 1))
    fails_with(h2, [msg(0, 0, K("a"), 5_000)], TIMESTAMP)
    # corrected: the second call really came a window later
    h3 = History()
    ok(h3, K("a"), 0, 0, t=(0, 1))
    ok(h3, K("a"), 0, 1, t=(WINDOW_MS + 100, WINDOW_MS + 101))
    passes(h3, forged)


def test_kind_f_wrong_payload_at_an_acknowledged_id():
    h = History()
    ok(h, K("a"), 0, 0, payload=b"mine")
    fails_with(h, [msg(0, 0, K("a"), payload=b"other")], WRONG_PAYLOAD)
    # corrected: the entry holds the creator's payload; a duplicate with another payload is
    # answered with the original (docs/semantics.md: the payload of a duplicate is not compared)
    ok(h, K("a"), 0, 0, dup=True, t=(2, 3), payload=b"changed")
    passes(h, [msg(0, 0, K("a"), payload=b"mine")])


def test_kind_f_payload_nobody_wrote_at_a_duplicate_id():
    h = History()
    failed(h, K("a"), (0, 1), payload=b"mine")
    ok(h, K("a"), 0, 0, dup=True, t=(2, 3), payload=b"mine")
    fails_with(h, [msg(0, 0, K("a"), payload=b"other")], WRONG_PAYLOAD)
    passes(h, [msg(0, 0, K("a"), payload=b"mine")])


def test_kind_g_invented_unkeyed_entry():
    h = History()
    ok(h, K("a"), 0, 0)
    log = [msg(0, 0, K("a")), msg(0, 1, None, 2, b"nobody")]
    fails_with(h, log, INVENTED)
    h.failed(None, b"nobody", RuntimeError("lost ack"), at(1), at(3))  # corrected: a plain write
    passes(h, log)
    # and one plain attempt accounts for one entry only
    fails_with(h, [*log, msg(0, 2, None, 2, b"nobody")], INVENTED)


def test_unknown_start_is_weaker_not_wrong():
    # attempts recorded without a start may have begun at any time: nothing is flagged that
    # could have been legal, but lost writes still are
    h = History()
    h.ok(K("a"), b"p", WriteResult(LogMessageId(0, 0)), end=at(1))
    h.ok(K("a"), b"p", WriteResult(LogMessageId(0, 1)), end=at(3))
    passes(h, [msg(0, 0, K("a")), msg(0, 1, K("a"), 2)])
    h.ok(K("b"), b"p", WriteResult(LogMessageId(0, 2)), end=at(4))
    fails_with(h, [msg(0, 0, K("a")), msg(0, 1, K("a"), 2)], LOST)


def test_history_is_thread_safe():
    """Threads record at once: each attempt is recorded once, and the record is in the order the
    attempts ended (`History._record` stamps the end and appends in one step under the lock).
    The interpreter switches threads every microsecond here, so with that lock gone a thread
    stamped, then preempted before its append, puts the record out of end order (an attempt
    that ended before a judgement began could then be missing from it). The old form of this
    test, counting attempts only, could not fail: one list.append is atomic under the GIL."""
    h = History()
    threads, per_thread = 8, 1500
    start = threading.Barrier(threads)

    def record(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            h.call(K(f"{n}-{i}"), b"p", lambda n=n, i=i: WriteResult(LogMessageId(n, i)))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    ids = sorted(a.message_id for a in h.attempts)
    assert ids == sorted(LogMessageId(n, i) for n in range(threads) for i in range(per_thread))
    ends = [a.end.ns for a in h.attempts]
    late = [k for k in range(1, len(ends)) if ends[k] < ends[k - 1]]
    assert late == [], f"{len(late)} attempts recorded after one that ended later"
    for n in range(threads):  # and each thread's attempts in the order it made them
        mine = [a.message_id.entry_id for a in h.attempts if a.message_id.segment_id == n]
        assert mine == list(range(per_thread))


def test_a_judgement_sees_the_record_as_it_was_when_it_began():
    """Attempts recorded while a judgement runs (by another thread, here by the log being read)
    are not judged by it: it works on a snapshot, or it would judge a record changing under it."""
    h = History()
    ok(h, K("a"), 0, 0)

    def log_read_while_recording():
        yield msg(0, 0, K("a"))
        ok(h, K("b"), 0, 1, t=(2, 3))  # recorded mid-judgement: b's entry is not in this log
        ok(h, K("c"), 0, 2, t=(2, 3))

    v = h.check(log_read_while_recording(), WINDOW_MS, 100)
    assert v.ok and v.attempts == 1, v.summary()
    assert LOST in judge(h, [msg(0, 0, K("a"))]).kinds  # the next judgement sees b and c


def test_call_records_failures_and_reraises():
    h = History()

    def boom() -> WriteResult:
        raise WriteTimeoutError("slow")

    with pytest.raises(WriteTimeoutError):
        h.call(K("a"), b"p", boom)
    (a,) = h.attempts
    assert not a.ok and a.timed_out and a.payload == b"p" and a.start.ns <= a.end.ns


def test_real_log_passes_and_tampering_fails(tmp_path: Path):
    clock = ManualClock()
    client = wp.connect(tmp_path, {"idempotency.snapshot_interval_s": 3600}, clock=clock)
    log = client.open_log("h", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=10, window_max_keys=100)
    h = History(clock)

    def write(name: str) -> None:
        h.call(K(name), b"x", lambda: w.write(b"x", idempotency_id=name))

    for i in range(20):
        write(f"k{i % 7}")
    clock.advance(10_000)
    write("k0")  # after the window: a new entry
    write("k0")
    w.close()
    msgs = list(log.open_reader())
    v = h.check(msgs, 10_000, 100)
    assert v.ok, v.summary()
    assert v.keyed_entries == 8 and v.rewritten_after_window == 1
    # the same log judged with a longer window: the rewrite is now a duplicate
    assert DUPLICATE in h.check(msgs, 10_001, 100).kinds
    # drop one entry: an acknowledged write is lost
    assert LOST in h.check(msgs[1:], 10_000, 100).kinds
    client.close()


def test_flags_entry_whose_only_attempts_were_answered_as_duplicates():
    # the call that created it was not recorded: every recorded one joined it
    h = History()
    ok(h, K("a"), 0, 0, dup=True)
    fails_with(h, [msg(0, 0, K("a"))], INVENTED)
    failed(h, K("a"), (0, 1))  # corrected: the creating call is recorded (its ack was lost)
    passes(h, [msg(0, 0, K("a"))])


def test_call_async_records_an_attempt_when_its_future_ends():
    """An async write is recorded with the moment its future ended, not when its outcome is
    read: the checker trusts an attempt's end (a timed-out entry was pending until then)."""
    from concurrent.futures import Future

    h = History()
    key = explicit_key("k")
    done: Future = Future()
    assert h.call_async(key, b"p", lambda: done) is done
    assert h.attempts == []  # nothing until it ends
    before = h.now()
    done.set_result(WriteResult(LogMessageId(0, 3), False))
    after = h.now()
    (a,) = h.attempts
    assert a.message_id == LogMessageId(0, 3) and before.ns <= a.end.ns <= after.ns

    timed_out: Future = Future()
    h.call_async(key, b"q", lambda: timed_out)
    before = h.now()
    timed_out.set_exception(WriteTimeoutError("still pending"))
    after = h.now()
    later = h.attempts[-1]
    assert later.timed_out and not later.ok and before.ns <= later.end.ns <= after.ns

    def refused() -> Future:
        raise wp.InvalidArgumentError("bad id")

    with pytest.raises(wp.InvalidArgumentError):
        h.call_async(key, b"r", refused)
    assert h.attempts[-1].error == "InvalidArgumentError: bad id"


# --- one counterexample per kind of verdict (issue 30) ----------------------------------------
# Each history below breaks exactly one rule, and the checker must name exactly that kind: a
# judge that reported the wrong kind, or more kinds than it can prove, would mislead every fault
# test it judges. `replicas` and `reader` come from `check_log`'s own read of the nodes, fed here
# by a hand-made `RawSource` (no engine, no node process) and hand-made segment metadata.

NODES3 = ("node-0", "node-1", "node-2")


class HandSource:
    """A `RawSource` over hand-made node contents: {node: {segment_id: [LogEntry bytes]}}."""

    def __init__(self, held: dict[str, dict[int, list[bytes]]]) -> None:
        self.held = held

    @property
    def node_ids(self) -> list[str]:
        return sorted(self.held)

    def raw_read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        entries = self.held[node_id].get(segment_id, [])
        return entries[from_entry_id : from_entry_id + max_entries]


class HandLog:
    """What `check_log` needs of a log: its id, its client's metadata, a reader."""

    def __init__(self, segments: list[SegmentMeta], read: list[LogMessage] | None = None):
        meta = SimpleNamespace(
            get_log_by_id=lambda log_id: SimpleNamespace(truncated_to=None),
            list_segments=lambda log_id: segments,
        )
        self.log_id = 1
        self.client = SimpleNamespace(meta=meta)
        self.read = read

    def open_reader(self):
        return iter(self.read or [])


def stored_entry(entry: int, key: bytes) -> bytes:
    """A LogEntry as a node stores it: the record without its length and checksum."""
    return encode_entry(0, entry, T0 + entry, b"p", None, key)[8:]


def completed(last: int) -> SegmentMeta:
    return SegmentMeta(1, 0, SegmentState.COMPLETED, NODES3, 3, 3, 2, 0, last_entry_id=last)


def _lost() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 1)
    return judge(h, [msg(0, 0, K("a"))])


def _wrong_id() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("b"), 0, 0, dup=True, t=(2, 3))  # b answered with a's entry
    return judge(h, [msg(0, 0, K("a"))])


def _wrong_payload() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0, payload=b"mine")
    return judge(h, [msg(0, 0, K("a"), payload=b"other")])


def _created_twice() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 0, t=(2, 3))  # a retry that should have said duplicate=True
    return judge(h, [msg(0, 0, K("a"))])


def _stale_id() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 1, t=(WINDOW_MS + 5, WINDOW_MS + 6))  # rewritten after its window
    ok(h, K("a"), 0, 0, dup=True, t=(WINDOW_MS + 10, WINDOW_MS + 11))  # answered the old id
    return judge(h, [msg(0, 0, K("a")), msg(0, 1, K("a"), WINDOW_MS + 5)])


def _duplicate() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 5, t=(WINDOW_MS - 2, WINDOW_MS - 1))
    return judge(h, [msg(0, 0, K("a")), msg(0, 5, K("a"), WINDOW_MS - 2)])


def _unkeyed_copy() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    ok(h, K("a"), 0, 0, dup=True, t=(2, 3))
    return judge(h, [msg(0, 0, K("a")), msg(0, 1, None, 2)])  # a retry appended without key


def _invented() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0)
    return judge(h, [msg(0, 0, K("a")), msg(0, 1, K("ghost"))])


def _timestamp() -> Verdict:
    h = History()
    ok(h, K("a"), 0, 0, t=(0, 1))
    return judge(h, [msg(0, 0, K("a"), 5_000)])


def _replicas() -> Verdict:
    # completed at entry 1, but entry 1 is stored on none of its nodes
    source = HandSource({"node-0": {0: [stored_entry(0, K("a"))]}, "node-1": {}, "node-2": {0: []}})
    h = History()
    h.ok(K("a"), b"p", WriteResult(LogMessageId(0, 0)), at(0), at(1))
    log = HandLog([completed(1)])
    log.read = read_stored(log.client, log, source).messages
    return h.check_log(log, WINDOW_MS, 100, source=source)


def _reader() -> Verdict:
    # both entries on a quorum of nodes, but the LogReader skips the second
    entries = [stored_entry(0, K("a")), stored_entry(1, K("b"))]
    source = HandSource({node: {0: list(entries)} for node in NODES3})
    h = History()
    h.ok(K("a"), b"p", WriteResult(LogMessageId(0, 0)), at(0), at(1))
    h.ok(K("b"), b"p", WriteResult(LogMessageId(0, 1)), at(1), at(2))
    log = HandLog([completed(1)])
    log.read = read_stored(log.client, log, source).messages[:1]
    return h.check_log(log, WINDOW_MS, 100, source=source)


# kind -> (the history breaking that rule, what its one problem says)
COUNTEREXAMPLES = {
    LOST: (_lost, "was acknowledged at 0:1, which is not in the log"),
    WRONG_ID: (_wrong_id, "was acknowledged at 0:0, which holds"),
    WRONG_PAYLOAD: (_wrong_payload, "was acknowledged as created at 0:0, which holds another"),
    CREATED_TWICE: (_created_twice, "2 attempts of key"),
    STALE_ID: (_stale_id, "was answered with 0:0, but it had been rewritten at 0:1"),
    DUPLICATE: (_duplicate, "is at 0:0 and again at 0:5"),
    UNKEYED_COPY: (_unkeyed_copy, "0:1 has no key but copies the payload"),
    INVENTED: (_invented, "at 0:1 was never written"),
    TIMESTAMP: (_timestamp, f"has timestamp {T0 + 5_000}, outside every call"),
    REPLICAS: (_replicas, "entry 1 is stored intact on none of node-0, node-1, node-2"),
    READER: (_reader, "the LogReader skipped 1 committed entries, first 0:1"),
}


def test_every_kind_of_verdict_has_a_counterexample():
    assert sorted(COUNTEREXAMPLES) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_counterexample_gets_exactly_its_verdict(kind: str):
    """One problem, of that kind, naming what broke."""
    history, says = COUNTEREXAMPLES[kind]
    v = history()
    assert not v.ok, v.summary()
    assert v.kinds == {kind}, v.problems
    (problem,) = v.problems
    assert problem.startswith(f"{kind}: ") and says in problem, problem


def test_the_hand_made_logs_pass_when_nothing_is_broken():
    """The two stored-log counterexamples fail for the one broken thing only."""
    entries = [stored_entry(0, K("a")), stored_entry(1, K("b"))]
    source = HandSource({node: {0: list(entries)} for node in NODES3})
    h = History()
    h.ok(K("a"), b"p", WriteResult(LogMessageId(0, 0)), at(0), at(1))
    h.ok(K("b"), b"p", WriteResult(LogMessageId(0, 1)), at(1), at(2))
    log = HandLog([completed(1)])
    log.read = read_stored(log.client, log, source).messages
    assert [m.message_id for m in log.read] == [LogMessageId(0, 0), LogMessageId(0, 1)]
    v = h.check_log(log, WINDOW_MS, 100, source=source)
    assert v.ok, v.summary()
