"""Conditional append (seed 004, KIP-27): `expected_last=` on both writers' single and batch
calls appends only right after the entry the caller expects (docs/semantics.md), across rolls
and takeovers, with duplicates answered first on an idempotent writer; a predecessor pending in
an older segment holds the append until that segment settles."""

from __future__ import annotations

import threading
import time

import pytest
from gate import gate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from woodpecker_idem import ConditionFailedError, InvalidArgumentError
from woodpecker_idem.errors import SegmentClosedError
from woodpecker_idem.types import LogMessageId, WriteResult

SMALL = {"segment.max_entries": 3, "append.linger_ms": 1}
ES3 = {"quorum.es": 3, "append.timeout_ms": 1000, "append.max_retries": 1, "append.linger_ms": 1}


def payloads(handle) -> list[bytes]:
    return [m.payload for m in handle.open_reader("earliest")]


def ids(handle) -> list[LogMessageId]:
    return [m.message_id for m in handle.open_reader("earliest")]


def wait_until(predicate, what: str, deadline_s: float = 60.0) -> None:
    """Poll `predicate` until true; the deadline only ends a hung test (not a timing claim)."""
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.002)


@pytest.mark.parametrize("idempotent", [False, True])
def test_appends_only_after_the_expected_entry(tmp_path, wp_connect, idempotent):
    handle = wp_connect(tmp_path).create_log("c")
    writer = handle.open_writer(idempotent=idempotent)
    assert writer.last_message_id() is None
    a = writer.write(b"a", expected_last=None).message_id  # the log holds none
    b = writer.write(b"b", expected_last=a).message_id
    assert writer.last_message_id() == b
    for stale in (None, a, LogMessageId(b.segment_id, b.entry_id + 1)):
        with pytest.raises(ConditionFailedError) as err:
            writer.write(b"c", expected_last=stale)
        assert err.value.expected_last == stale and err.value.actual_last == b
        assert str(b) in str(err.value) and not err.value.retriable
    c = writer.write(b"c", expected_last=str(b)).message_id  # its text form too
    assert writer.write_async(b"d", expected_last=c).result(30).message_id > c
    writer.close()
    assert payloads(handle) == [b"a", b"b", b"c", b"d"]


def test_bad_expected_last_is_refused_naming_it(tmp_path, wp_connect):
    writer = wp_connect(tmp_path).create_log("c").open_writer()
    for bad in (5, "5", (1, -1), (True, 0), b"0:0"):
        with pytest.raises(InvalidArgumentError, match="expected_last|message id"):
            writer.write(b"x", expected_last=bad)
    assert writer.last_message_id() is None  # nothing queued, nothing written


def test_a_chain_holds_across_rolls_and_takeovers(tmp_path, wp_connect):
    client = wp_connect(tmp_path, SMALL)
    handle = client.create_log("c")
    last = None
    for round_ in range(3):
        writer = handle.open_writer()  # takes over from the one before (left open)
        assert writer.last_message_id() == last
        for i in range(5):
            last = writer.write(b"%d-%d" % (round_, i), expected_last=last).message_id
        with pytest.raises(ConditionFailedError):
            writer.write(b"stale", expected_last=None)
    writer.close()  # readers see an open segment's entries up to its LAC only
    assert len({m.segment_id for m in ids(handle)}) > 3  # rolled every third entry
    assert payloads(handle) == [b"%d-%d" % (r, i) for r in range(3) for i in range(5)]


def test_idempotent_retry_is_answered_before_the_condition(tmp_path, wp_connect):
    handle = wp_connect(tmp_path).create_log("c")
    writer = handle.open_writer(idempotent=True)
    first = writer.write(b"x", idempotency_id="k1", expected_last=None)
    writer.write(b"y", idempotency_id="k2", expected_last=first.message_id)
    # the retry of a conditional write that landed returns its id, though the log moved on
    again = writer.write(b"x", idempotency_id="k1", expected_last=None)
    assert again.message_id == first.message_id and again.duplicate
    assert writer.write_async(b"x", idempotency_id="k1", expected_last=None).result(30).duplicate
    assert payloads(handle) == [b"x", b"y"]


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_conditional_batch_lands_consecutively_or_not_at_all(tmp_path, wp_connect, idempotent):
    handle = wp_connect(tmp_path, SMALL).create_log("c")
    writer = handle.open_writer(idempotent=idempotent)
    head = writer.write(b"head").message_id
    rows = [b"r%d" % i for i in range(8)]  # more than a segment: rolls inside the call
    result = writer.write_many(rows, expected_last=head)
    got = [LogMessageId(s, e) for s, e in zip(result.segment_ids, result.entry_ids, strict=True)]
    with pytest.raises(ConditionFailedError) as err:
        writer.write_many([b"s0", b"s1"], expected_last=head)
    assert err.value.acknowledged == bytearray(2) and err.value.actual_last == got[-1]
    writer.close()
    assert ids(handle) == [head, *got] and payloads(handle) == [b"head", *rows]


def test_an_idempotent_batch_resumes_after_the_rows_that_landed(tmp_path, wp_connect):
    """A resumable bulk load: the retry of a batch whose first rows landed answers them and
    appends the rest right after the last of them."""
    handle = wp_connect(tmp_path, {"append.linger_ms": 1}).create_log("c")  # one segment
    writer = handle.open_writer(idempotent=True)
    rows = [b"r%d" % i for i in range(7)]
    landed = writer.write_many(rows[:4], expected_last=None)
    result = writer.write_many(rows, expected_last=None)
    assert bytes(result.duplicate) == b"\x01" * 4 + b"\x00" * 3
    assert list(result.entry_ids[:4]) == list(landed.entry_ids)
    # a row the log holds elsewhere breaks the chain: the new row after it is refused
    r5 = LogMessageId(result.segment_ids[5], result.entry_ids[5])
    with pytest.raises(ConditionFailedError) as err:
        writer.write_many([b"r6", b"r0", b"new"], expected_last=r5)
    assert bytes(err.value.acknowledged) == b"\x01\x01\x00"
    writer.close()
    assert payloads(handle) == rows


def test_threads_racing_on_one_tail_each_win_once(tmp_path, wp_connect):
    """Threads each read the writer's tail and append expecting it: every acknowledged entry
    follows exactly the entry its writer expected, and refusals name the entry that won."""
    handle = wp_connect(tmp_path, SMALL).create_log("c")
    writer = handle.open_writer()
    won: dict[LogMessageId, LogMessageId | None] = {}
    lock = threading.Lock()

    def racer(t: int) -> None:
        for i in range(40):
            expected = writer.last_message_id()
            try:
                mid = writer.write(b"%d-%d" % (t, i), expected_last=expected).message_id
            except ConditionFailedError as exc:
                assert exc.actual_last != expected
                continue
            with lock:
                won[mid] = expected

    threads = [threading.Thread(target=racer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    log = ids(handle)
    assert set(log) == set(won)
    for before, mid in zip([None, *log], log, strict=False):
        assert won[mid] == before, f"{mid} expected {won[mid]} but follows {before}"


def test_a_predecessor_pending_in_an_older_segment_holds_the_append(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_entries": 2, "append.linger_ms": 1})
    gated = gate(client)
    handle = client.create_log("c")
    writer = handle.open_writer()
    a = writer.write(b"a").message_id
    gated.hold()
    b = writer.write_async(b"b")  # 0:1, the last of segment 0, in flight at the gate
    assert gated.waiting.acquire(timeout=60)
    c = writer.write_async(b"c", expected_last=LogMessageId(a.segment_id, a.entry_id + 1))
    d = writer.write_async(b"d")  # queued after c: waits with it
    wait_until(lambda: writer._acc.held is not None, "c held at its roll")
    flushed = threading.Event()
    flusher = threading.Thread(target=lambda: (writer.flush(), flushed.set()))
    flusher.start()
    flusher.join(0.5)  # a flush that did not wait for held writes would have returned
    assert writer.queued == 2 and not c.done() and not d.done() and not flushed.is_set()
    gated.release()
    flusher.join(60)  # ends once c and d, accepted before it, are entries and acknowledged
    assert flushed.is_set() and c.done() and d.done()
    assert c.result(0).message_id == LogMessageId(a.segment_id + 1, 0)
    assert b.result(0).message_id.entry_id == 1
    writer.close()
    assert payloads(handle) == [b"a", b"b", b"c", b"d"]


def test_a_held_append_whose_predecessor_is_dropped_is_refused(tmp_path, wp_connect):
    """The older segment loses its quorum and is completed without the entry the append
    expected: the append is refused naming the real end, and nothing of it is written."""
    client = wp_connect(tmp_path, {**ES3, "segment.max_entries": 2})
    gated = faults = gate(client)  # faults checked after the gate opens
    handle = client.create_log("c")
    writer = handle.open_writer()
    a = writer.write(b"a", timeout=30).message_id
    gated.hold()
    b = writer.write_async(b"b")
    assert gated.waiting.acquire(timeout=60)
    expected = LogMessageId(a.segment_id, a.entry_id + 1)
    c = writer.write_async(b"c", expected_last=expected)
    wait_until(lambda: writer._acc.held is not None, "c held at its roll")
    for node in faults.node_ids:
        faults.fail_node(node)  # b reaches no node
    gated.release()
    wait_until(lambda: writer.repairing or b.done(), "segment 0 lost its quorum")
    faults.heal_all()
    with pytest.raises(SegmentClosedError):
        b.result(60)
    with pytest.raises(ConditionFailedError) as err:
        c.result(60)
    assert err.value.actual_last == a and err.value.expected_last == expected
    after = writer.write(b"after", expected_last=a, timeout=30).message_id
    writer.close()
    assert payloads(handle) == [b"a", b"after"] and after.segment_id > a.segment_id


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("right"), st.integers(1, 4)),
        st.tuples(st.just("stale"), st.integers(0, 50)),
        st.tuples(st.just("plain"), st.integers(1, 3)),
        st.tuples(st.just("takeover"), st.just(0)),
        st.tuples(st.just("batch"), st.integers(1, 5)),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS)
def test_conditional_appends_match_a_model(tmp_path_factory, ops):
    """Random writes, right and stale expectations, batches, rolls (two entries a segment) and
    takeovers against a model of the log: a conditional append succeeds exactly when the model
    ends at what it expects, and the log read back is the model."""
    from woodpecker_idem.connect import connect

    client = connect(tmp_path_factory.mktemp("m"), {"segment.max_entries": 2})
    try:
        handle = client.create_log("m")
        writer = handle.open_writer()
        model: list[tuple[LogMessageId, bytes]] = []
        n = 0
        for op, arg in ops:
            last = model[-1][0] if model else None
            if op == "takeover":
                writer = handle.open_writer()
                assert writer.last_message_id() == last
            elif op == "plain":
                for _ in range(arg):
                    n += 1
                    model.append((writer.write(b"%d" % n).message_id, b"%d" % n))
            elif op == "right":
                for _ in range(arg):
                    n += 1
                    mid = writer.write(b"%d" % n, expected_last=last).message_id
                    model.append((mid, b"%d" % n))
                    last = mid
            elif op == "stale":
                wrong = [m for m, _ in model if m != last] + [None, LogMessageId(99, arg)]
                choice = wrong[arg % len(wrong)]
                if choice == last:
                    continue
                with pytest.raises(ConditionFailedError) as err:
                    writer.write(b"never", expected_last=choice)
                assert err.value.actual_last == last
            else:
                rows = [b"%d" % (n + i + 1) for i in range(arg)]
                result = writer.write_many(rows, expected_last=last)
                model += [
                    (LogMessageId(s, e), p)
                    for s, e, p in zip(result.segment_ids, result.entry_ids, rows, strict=True)
                ]
                n += arg
        writer.close()
        assert [(m.message_id, m.payload) for m in handle.open_reader("earliest")] == model
    finally:
        client.close()


def _row(result, i: int) -> WriteResult:
    return WriteResult(result.message_id(i), bool(result.duplicate[i]))


TIGHT = {
    "quorum.es": 3,
    "segment.max_entries": 5,  # rolls all the time
    "append.linger_ms": 1,
    "append.max_batch_entries": 4,
    "append.max_inflight_entries": 6,  # backpressure all the time
    "append.max_inflight_bytes": 1024,
    "append.max_entry_bytes": 256,
}


@pytest.mark.parametrize("seed", range(3))
def test_conditional_appends_under_backpressure_judged_by_the_checker(tmp_path, wp_connect, seed):
    """Threads race conditional single, async and batch calls and plain retries of shared keys on
    one idempotent writer whose in-flight limits are a few entries and whose segments roll every
    five: the history checker finds every acknowledged key exactly once, and every entry a
    conditional call created follows exactly the entry it expected."""
    import random

    from woodpecker_idem import explicit_key
    from woodpecker_idem.testing.history import History

    handle = wp_connect(tmp_path, TIGHT).create_log("c")
    writer = handle.open_writer(idempotent=True, window_duration_s=600, window_max_keys=100_000)
    history = History()
    follows: dict[LogMessageId, LogMessageId | None] = {}  # entry created -> what it expected
    lock = threading.Lock()

    def created(result, expected) -> None:
        if not result.duplicate:
            with lock:
                follows[result.message_id] = expected

    def racer(t: int) -> None:
        rnd = random.Random(seed * 100 + t)
        for i in range(60):
            key = f"k{rnd.randrange(120)}"  # shared by the threads: retries and races on keys
            payload = f"payload of {key}".encode().ljust(rnd.choice([20, 200]), b".")
            expected = writer.last_message_id()
            op = rnd.randrange(4)
            try:
                if op == 0:
                    r = history.call(
                        explicit_key(key),
                        payload,
                        lambda p=payload, k=key, e=expected: writer.write(
                            p, idempotency_id=k, expected_last=e
                        ),
                    )
                    created(r, expected)
                elif op == 1:
                    f = history.call_async(
                        explicit_key(key),
                        payload,
                        lambda p=payload, k=key, e=expected: writer.write_async(
                            p, idempotency_id=k, expected_last=e
                        ),
                    )
                    created(f.result(60), expected)
                elif op == 2:  # an unconditional retry of a key, racing the conditional calls
                    history.call(
                        explicit_key(key),
                        payload,
                        lambda p=payload, k=key: writer.write(p, idempotency_id=k),
                    )
                else:
                    keys = [f"b{t}-{i}-{j}" for j in range(rnd.randrange(2, 7))]
                    rows = [k.encode().ljust(100, b"-") for k in keys]
                    start = history.now()
                    try:
                        res = writer.write_many(rows, keys, expected_last=expected)
                    except ConditionFailedError as exc:
                        for j, (k, row) in enumerate(zip(keys, rows, strict=True)):
                            if exc.acknowledged[j]:
                                history.ok(explicit_key(k), row, _row(exc.batch_result, j), start)
                            else:
                                history.failed(explicit_key(k), row, exc, start)
                        raise
                    prev = expected
                    for j, (k, row) in enumerate(zip(keys, rows, strict=True)):
                        history.ok(explicit_key(k), row, _row(res, j), start)
                        created(_row(res, j), prev)
                        prev = res.message_id(j)
            except ConditionFailedError as exc:
                assert exc.actual_last != expected

    threads = [threading.Thread(target=racer, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    metrics = writer.metrics
    writer.close()
    assert metrics["backpressure_waits"] > 0 and metrics["segments_rolled"] > 5, metrics
    verdict = history.check_log(handle, 600_000, 100_000)
    assert verdict.ok, verdict.summary()
    log = ids(handle)
    assert set(follows) <= set(log)
    before = dict(zip(log, [None, *log], strict=False))
    wrong = {mid: (exp, before[mid]) for mid, exp in follows.items() if before[mid] != exp}
    shown = dict(list(wrong.items())[:5])  # (expected, found before it)
    assert not wrong, f"{len(wrong)} entries not after the entry their call expected: {shown}"
