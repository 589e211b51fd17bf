"""The processor (issue 29 item 4): exactly-once read-process-write from one log to another
without transactions. The ids derived from source positions, the commit-after-ack rule (a gated
target: nothing acknowledged, nothing committed), fn's results (none, one, several), restarts
within the target's window and beyond it (the target check), a second processor of the same
name, and a processor SIGKILLed at random points (support/processorproc.py): the target then
holds each source entry's results exactly once, judged on the entries its nodes store."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from gate import gate
from killable import KillableChild
from processorproc import results as child_results
from slowprofile import size

import woodpecker_idem as wp
from woodpecker_idem.clock import ManualClock
from woodpecker_idem.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    ReaderFencedError,
    SegmentClosedError,
    WriterFencedError,
)
from woodpecker_idem.processor import (
    HIGH_PROPERTY,
    SOURCE_PROPERTY,
    InFlight,
    Processor,
    Written,
    parse_source_id,
    source_id,
)
from woodpecker_idem.testing import read_stored
from woodpecker_idem.types import (
    LogMessage,
    LogMessageId,
    SegmentState,
    WriteMessage,
    WriteResult,
)

T0 = 1_700_000_000_000
BOTH = pytest.mark.parametrize("meta_config", ["sqlite", "etcd"], indirect=True)


def fill(handle: wp.LogHandle, n: int, first: int = 0) -> list[LogMessageId]:
    writer = handle.open_writer()
    futures = [writer.write_async(b"m%d" % i) for i in range(first, first + n)]
    ids = [f.result(30).message_id for f in futures]
    # no bound: a close that runs out of time leaves its open segment to the next writer, and a
    # reader stops at an open segment's confirmed tail (a consumer child then ends early)
    writer.close(timeout=None)
    assert all(s.state is not SegmentState.ACTIVE for s in handle.segments())
    return ids


def two(msg: LogMessage) -> list[bytes]:
    """Every entry's two results."""
    return [msg.payload + b".0", msg.payload + b".1"]


def payloads(handle: wp.LogHandle) -> list[bytes]:
    return [m.payload for m in handle.open_reader()]


# --- ids ---------------------------------------------------------------------------------------


def test_source_ids_round_trip_and_tell_processors_sources_and_results_apart() -> None:
    mid = LogMessageId(3, 120)
    assert source_id("billing", 7, mid) == "billing@7:3:120"  # one result: no suffix
    assert source_id("billing", 7, mid, 2) == "billing@7:3:120#2"
    seen = set()
    for name in ("billing", "audit", "a@7:3", "b#1"):
        for log_id in (7, 8, 70):
            for pos in (LogMessageId(0, 0), mid, LogMessageId(31, 20), LogMessageId(2**32 - 1, 1)):
                for index in (0, 1, 12):
                    text = source_id(name, log_id, pos, index)
                    assert parse_source_id(text, name, log_id) == (pos, index)
                    seen.add(text)
    assert len(seen) == 4 * 3 * 4 * 3  # no two (processor, source, position, index) share an id
    # another processor's, another source's, and text that is no id at all
    for text in (
        "audit@7:3:120",
        "billing@70:3:120",
        "billing@7:3:120#0",
        "billing@7:3:120#",
        "billing@7:03:120",
        "billing@7:3:-1",
        "billing@7:3",
        "billing@7:3:120#1#2",
        "billing@7:٣:120",  # a digit, but not ASCII
        "",
    ):
        assert parse_source_id(text, "billing", 7) is None, text
    # a name that is a prefix of another with its log id does not claim the other's ids
    assert parse_source_id(source_id("a@7:3", 1, mid), "a", 7) is None


# --- the commit-after-ack rule -------------------------------------------------------------------


def _written(fut: Future[WriteResult]) -> Written:
    return Written(0, "k", b"", {}, fut)


def test_in_flight_settles_only_an_acknowledged_prefix() -> None:
    queue = InFlight()
    futures = [Future[WriteResult]() for _ in range(4)]
    ids = [LogMessageId(0, i) for i in range(5)]
    queue.add(ids[0], [_written(futures[0])])
    queue.add(ids[1], [_written(futures[1]), _written(futures[2])])  # two results
    queue.add(ids[2], [])  # no result: settles once the entries before it do
    queue.add(ids[3], [_written(futures[3])])
    assert queue.settled() is None  # nothing acknowledged
    futures[3].set_result(WriteResult(LogMessageId(9, 0)))
    futures[1].set_result(WriteResult(LogMessageId(9, 1)))
    assert queue.settled() is None  # acknowledged out of order: the oldest is not
    futures[0].set_result(WriteResult(LogMessageId(9, 2)))
    assert queue.settled() == ids[0]  # entry 1 still has a result in flight
    futures[2].set_exception(WriterFencedError("fenced"))
    failed = queue.failed()
    assert queue.settled() is None and [w.future for w in failed] == [futures[2]]
    assert queue.head_failed()
    failed[0].future = done = Future()  # written again
    assert queue.failed() == [] and not queue.head_failed()
    done.set_result(WriteResult(LogMessageId(9, 3), duplicate=True))
    assert queue.settled() == ids[3] and len(queue) == 0 and queue.results == 0


def test_nothing_is_committed_past_a_result_the_target_has_not_acknowledged(
    tmp_path: Path, wp_connect
) -> None:
    """The target's adds are held, then fail (its node goes down): the processor has read and
    submitted everything, stops, and commits nothing; the next processor writes every result.
    Committing at submission instead loses every held result."""
    client = wp_connect(tmp_path, {"segment.max_entries": 8, "append.timeout_ms": 60_000})
    source, target = client.create_log("orders"), client.create_log("invoices")
    fill(source, 20)
    gated = gate(client)
    called = []
    all_read = threading.Event()

    def fn(msg: LogMessage) -> list[bytes]:
        called.append(msg.message_id)
        if len(called) == 20:
            all_read.set()
        return two(msg)

    processor = Processor(source, target, "billing", fn, commit_every=1)
    gated.hold()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            processor.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert all_read.wait(60), "the processor never read the source"
        assert gated.waiting.acquire(timeout=60), "no add reached the gate"
        processor.stop()
        runner.join(60)
        assert not runner.is_alive() and errors == []
    finally:
        processor.stop()
        gated.fail_node("node-0")  # the held adds never reach the node
        gated.release()
        runner.join(60)
    assert source.readers()[0].position == LogMessageId(0, 0)  # nothing was acknowledged
    processor.close(timeout=1)
    gated.heal_all()
    with Processor(source, target, "billing", two) as again:
        again.run(until_idle=True)
    want = Counter(b"m%d.%d" % (i, k) for i in range(20) for k in range(2))
    assert Counter(payloads(target)) == want
    assert source.readers()[0].lag == 0


# --- what fn returns -------------------------------------------------------------------------


def test_none_one_or_several_results_and_fn_errors(tmp_path: Path, wp_connect) -> None:
    client = wp_connect(tmp_path, {"segment.max_entries": 8})
    source, target = client.create_log("orders"), client.create_log("invoices")
    ids = fill(source, 12)

    def fn(msg: LogMessage) -> Any:
        i = int(msg.payload[1:])
        if i % 4 == 0:
            return None
        if i % 4 == 1:
            return msg.payload  # bytes
        if i % 4 == 2:
            return WriteMessage(msg.payload, {"kind": "two"})
        return iter([b"x%d" % i, bytearray(b"y%d" % i), memoryview(b"z%d" % i)])

    with Processor(source, target, "p", fn, commit_every=5) as p:
        stats = p.run(until_idle=True)
    assert (stats.read, stats.results, stats.written, stats.duplicates) == (12, 15, 15, 0)
    assert p.committed == LogMessageId(ids[-1].segment_id, ids[-1].entry_id + 1)
    got = [(m.payload, m.properties) for m in target.open_reader()]
    want: list[tuple[bytes, dict[str, str]]] = []
    for i, mid in enumerate(ids):
        high = {HIGH_PROPERTY: str(mid)}
        tag = {SOURCE_PROPERTY: source_id("p", source.log_id, mid), **high}
        if i % 4 == 1:
            want.append((b"m%d" % i, tag))
        elif i % 4 == 2:
            want.append((b"m%d" % i, {"kind": "two", **tag}))
        elif i % 4 == 3:
            for k, p_ in enumerate((b"x%d", b"y%d", b"z%d")):
                key = source_id("p", source.log_id, mid, k)
                want.append((p_ % i, {SOURCE_PROPERTY: key, **high}))
    assert got == want
    # the entry after the last one with results is committed too (none: nothing to wait for)
    assert source.readers()[0].lag == 0

    # a bad result stops the run at its entry, after committing what was acknowledged
    more = fill(source, 4, first=12)

    def bad(msg: LogMessage) -> Any:
        return "text" if msg.message_id == more[2] else msg.payload

    message = f"fn returned str for entry {more[2]}"
    with Processor(source, target, "p", bad) as p, pytest.raises(InvalidTypeError, match=message):
        p.run(until_idle=True)
    assert source.readers()[0].position == more[2]
    assert payloads(target)[-2:] == [b"m12", b"m13"]

    def reserved(msg: LogMessage) -> Any:
        return WriteMessage(msg.payload, {SOURCE_PROPERTY: "mine"})

    with (
        Processor(source, target, "p", reserved) as p,
        pytest.raises(InvalidArgumentError, match="'wp.source'"),
    ):
        p.run(until_idle=True)

    def boom(msg: LogMessage) -> Any:
        raise RuntimeError(f"cannot process {msg.message_id}")

    with (
        Processor(source, target, "p", boom) as p,
        pytest.raises(RuntimeError, match=f"cannot process {more[2]}"),
    ):
        p.run(until_idle=True)
    assert source.readers()[0].position == more[2]  # nothing skipped

    for kwargs, match in (
        ({"commit_every": 0}, "commit_every"),
        ({"max_in_flight": True}, "max_in_flight"),
        ({"commit_interval_s": -1}, "commit_interval_s"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            Processor(source, target, "p", two, **kwargs)
    with pytest.raises(InvalidArgumentError, match="same log"):
        Processor(source, source, "p", two)
    with pytest.raises(InvalidArgumentError, match="name"):
        Processor(source, target, "", two)


def test_a_running_processor_follows_the_source_and_commits_when_caught_up(
    tmp_path: Path, wp_connect
) -> None:
    """`run()` without `until_idle` tails the source: entries written while it runs (from a
    producer thread) are processed, and each time it catches up it commits, before any
    `commit_every`; `stop()` ends it."""
    client = wp_connect(tmp_path, {"segment.max_entries": 8})
    source, target = client.create_log("orders"), client.create_log("invoices")
    processor = Processor(source, target, "p", two, commit_every=10**6)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            processor.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        writer = source.open_writer()
        for burst in range(3):
            ids = [writer.write(b"m%d" % (burst * 5 + i)).message_id for i in range(5)]
            after = LogMessageId(ids[-1].segment_id, ids[-1].entry_id + 1)
            deadline = time.monotonic() + 60  # a guard against a hang, not a timing claim
            while source.readers()[0].position < after:  # committed on catching up
                assert time.monotonic() < deadline and not errors, errors
                time.sleep(0.005)
        writer.close()
    finally:
        processor.stop()
        runner.join(60)
    assert not runner.is_alive() and errors == []
    processor.close()
    assert Counter(payloads(target)) == Counter(
        b"m%d.%d" % (i, k) for i in range(15) for k in range(2)
    )


# --- restarts: within the window and beyond it ---------------------------------------------------


def _rewind(source: wp.LogHandle, name: str, to: LogMessageId) -> None:
    """The name's committed position back to `to`: as if the processor had been killed after
    writing the results of the entries from `to` on, before committing them."""
    source.delete_reader(name)
    source.open_reader(to, name=name).close()


@pytest.mark.parametrize("check", [True, False])
def test_a_restart_within_the_window_writes_nothing_twice(
    tmp_path: Path, wp_connect, check: bool
) -> None:
    client = wp_connect(tmp_path, {"segment.max_entries": 8})
    source, target = client.create_log("orders"), client.create_log("invoices")
    ids = fill(source, 30)
    with Processor(source, target, "p", two) as p:
        p.run(until_idle=True)
    _rewind(source, "p", ids[10])
    with Processor(source, target, "p", two, check_target=check) as p:
        stats = p.run(until_idle=True)
    # with the check the results are found in the target; without it the window answers them
    assert (stats.skipped, stats.duplicates) == ((40, 0) if check else (0, 40))
    assert stats.written == 0 and Counter(payloads(target)) == Counter(
        b"m%d.%d" % (i, k) for i in range(30) for k in range(2)
    )


def test_beyond_the_window_the_target_check_keeps_it_exactly_once(
    tmp_path: Path, wp_connect
) -> None:
    """A processor down longer than the target's window: its writer's window no longer holds
    the ids written after the last commit. Without the check they are written again (the
    documented limit); with it, none is."""
    clock = ManualClock(T0)
    client = wp_connect(
        tmp_path,
        {"segment.max_entries": 8, "idempotency.window_duration_s": 60},
        clock=clock,
    )
    source, target = client.create_log("orders"), client.create_log("invoices")
    ids = fill(source, 30)
    with Processor(source, target, "p", two) as p:
        p.run(until_idle=True)
    want = Counter(payloads(target))
    clock.advance(3600_000)  # an hour later: every key has left the window
    _rewind(source, "p", ids[10])
    with Processor(source, target, "p", two) as p:
        stats = p.run(until_idle=True)
    assert (stats.skipped, stats.written, stats.duplicates) == (40, 0, 0)
    assert Counter(payloads(target)) == want  # nothing twice
    # a scan back only to the commit: the last segments, not the whole target
    assert stats.scanned < 60

    clock.advance(3600_000)
    _rewind(source, "p", ids[10])
    with Processor(source, target, "p", two, check_target=False) as p:
        stats = p.run(until_idle=True)
    assert (stats.written, stats.duplicates) == (40, 0)  # beyond the window, unchecked: again
    assert Counter(payloads(target)) - want == Counter(
        b"m%d.%d" % (i, k) for i in range(10, 30) for k in range(2)
    )


def test_the_target_check_finds_holes_and_late_retries(tmp_path: Path, wp_connect) -> None:
    """The target as a killed processor can leave it: results written after the last commit
    with a hole (a write that failed while later ones landed), and retries landed after later
    results (one of them of an entry before the commit). Beyond the window the check writes
    exactly the hole: it reads back past the late retries, by their high marks, to the results
    written before anything after the commit was."""
    clock = ManualClock(T0)
    client = wp_connect(
        tmp_path,
        {"segment.max_entries": 4, "idempotency.window_duration_s": 60},
        clock=clock,
    )
    source, target = client.create_log("orders"), client.create_log("invoices")
    ids = fill(source, 12)
    writer = target.open_writer(idempotent=True)
    high = LogMessageId(0, 0)

    def put(i: int, index: int) -> None:
        nonlocal high
        high = max(high, ids[i])
        key = source_id("p", source.log_id, ids[i], index)
        props = {SOURCE_PROPERTY: key, HIGH_PROPERTY: str(high)}
        writer.write(b"m%d.%d" % (i, index), properties=props, idempotency_id=key)

    writer.write(b"someone else's", idempotency_id="other")  # not the processor's: ignored
    for i in range(5):
        put(i, 0), put(i, 1)
    # committed: 0..5, 5's second result retried and landed after 6's first
    put(5, 0), put(6, 0), put(5, 1)
    # after the commit: 6..9 in flight, 7's second result failed and was never retried,
    # 6's second result was retried and landed after 8's
    put(7, 0), put(8, 0), put(8, 1), put(6, 1), put(9, 0), put(9, 1)
    writer.close()
    before = Counter(payloads(target))
    _rewind(source, "p", ids[6])
    clock.advance(3600_000)
    with Processor(source, target, "p", two) as p:
        stats = p.run(until_idle=True)
    assert stats.skipped == 7 and stats.written == 1 + 2 * 2  # 7's hole, then 10 and 11
    after = Counter(payloads(target))
    assert after - before == Counter([b"m7.1", b"m10.0", b"m10.1", b"m11.0", b"m11.1"])
    assert all(n == 1 for p_, n in after.items() if p_.startswith(b"m"))


def _marks_cover_what_precedes(target: wp.LogHandle, name: str, source_log_id: int) -> list[str]:
    """The target check's invariant: every result's high mark is at or above the source
    position of every result before it in the target (so the check may stop at a mark below
    the commit). The violations, as text."""
    problems: list[str] = []
    highest: LogMessageId | None = None
    for m in target.open_reader():
        parsed = parse_source_id(m.properties.get(SOURCE_PROPERTY, ""), name, source_log_id)
        if parsed is None:
            continue
        mark = LogMessageId.parse(m.properties[HIGH_PROPERTY])
        if highest is not None and mark < highest:
            problems.append(f"{m.message_id}: mark {mark} below {highest} written before it")
        highest = parsed[0] if highest is None else max(highest, parsed[0])
    return problems


def test_results_written_again_after_a_failure_carry_the_current_high_mark(
    tmp_path: Path, wp_connect
) -> None:
    """Writes of entries 50..120 fail once (as a segment completed without them fails them,
    retriable): later results land first, the failed ones are written again after them. Each
    retry must carry the highest position submitted when it is sent, not its first one: a retry
    of entry 60 landing after entry 130's result with a mark of 60 would stop a later check too
    early (and entry 130's result, if after the commit, would be written twice)."""
    client = wp_connect(tmp_path, {"segment.max_entries": 16})
    source, target = client.create_log("orders"), client.create_log("invoices")
    ids = fill(source, 200)
    failing = {source_id("p", source.log_id, ids[i], k) for i in range(50, 121) for k in (0, 1)}
    # the failures come once entry 130's results are submitted: the retries are written after
    # later entries' results whatever the scheduling
    held: list[Future[WriteResult]] = []
    release = {source_id("p", source.log_id, ids[130], k) for k in (0, 1)}
    with Processor(source, target, "p", two) as p:
        real_write = p.writer.write_async

        def write_async(payload, *, properties, idempotency_id):  # type: ignore[no-untyped-def]
            if idempotency_id in failing:
                failing.discard(idempotency_id)
                failed: Future[WriteResult] = Future()
                held.append(failed)
                return failed
            if idempotency_id in release:
                for f in held:
                    f.set_exception(SegmentClosedError("completed without it (injected)"))
                held.clear()
            return real_write(payload, properties=properties, idempotency_id=idempotency_id)

        p.writer.write_async = write_async  # type: ignore[method-assign]
        stats = p.run(until_idle=True)
    assert stats.retries == 2 * 71 and not failing
    assert Counter(payloads(target)) == Counter(
        b"m%d.%d" % (i, k) for i in range(200) for k in range(2)
    )
    order = [m.payload for m in target.open_reader()]
    assert order.index(b"m50.0") > order.index(b"m121.0")  # the retries landed later
    assert _marks_cover_what_precedes(target, "p", source.log_id) == []


# --- two processors of one name ------------------------------------------------------------------


def test_a_second_processor_of_the_name_fences_the_first(tmp_path: Path, wp_connect) -> None:
    """The second one takes the target's writer and the reader name over: the first one's next
    write or commit fails with a fencing error, and what the two wrote is exactly once."""
    config = {"segment.max_entries": 8}
    client = wp_connect(tmp_path, config)
    source, target = client.create_log("orders"), client.create_log("invoices")
    fill(source, 200)
    started = threading.Event()
    hold = threading.Event()

    def slow(msg: LogMessage) -> list[bytes]:
        if msg.message_id.entry_id == 5:
            started.set()
            hold.wait(60)  # the second processor opens meanwhile
        return two(msg)

    first = Processor(source, target, "p", slow, commit_every=3)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            first.run(until_idle=True)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    other = wp_connect(tmp_path, config)
    try:
        assert started.wait(60)
        second = Processor(other.open_log("orders"), other.open_log("invoices"), "p", two)
    finally:
        hold.set()
        runner.join(60)
    assert not runner.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], (WriterFencedError, ReaderFencedError))
    with second:
        second.run(until_idle=True)
    first.close(timeout=1)
    assert Counter(payloads(target)) == Counter(
        b"m%d.%d" % (i, k) for i in range(200) for k in range(2)
    )


# --- a processor SIGKILLed at random points -----------------------------------------------------


def processor_child(
    data_dir: Path,
    out: Path,
    commit_every: int,
    max_in_flight: int,
    config: dict[str, Any],
    window_s: float | None,
    add_delay_ms: int,
) -> KillableChild:
    """support/processorproc.py in a child process, stopped by PID on every way out."""
    args = [str(data_dir), "orders", "invoices", "billing", str(out), str(commit_every)]
    args += [str(max_in_flight), "--config", json.dumps(config)]
    args += ["--window-s", str(window_s)] if window_s is not None else []
    args += ["--add-delay-ms", str(add_delay_ms)] if add_delay_ms else []
    return KillableChild("processorproc.py", out, args)


def _kill_rounds(
    tmp_path: Path,
    wp_connect,
    meta_config: dict[str, Any],
    rounds: int,
    seed: int,
    window_s: float | None,
) -> None:
    config = {"segment.max_entries": 97, **meta_config}
    client = wp_connect(tmp_path, config)
    source, target = client.create_log("orders"), client.create_log("invoices")
    n = 40 * rounds + 200
    ids = fill(source, n)
    rng = random.Random(seed)
    children: list[KillableChild] = []
    try:
        for r in range(rounds + 1):
            child = processor_child(
                tmp_path,
                tmp_path / f"round-{r}.txt",
                rng.choice([1, 7, 50, 1000]),
                rng.choice([1, 16, 10_000]),
                config,
                window_s,
                rng.choice([0, 5, 20, 50]),
            )
            children.append(child)
            killed = child.run_until(rng.randrange(0, 120) if r < rounds else 10**9)
            if not killed:
                assert r == rounds and child.lines()[-1] == "DONE", f"round {r}"
    finally:
        for child in children:
            child.stop()
    want = Counter(p for i in range(n) for p in child_results(b"m%d" % i))
    # the entries the target's nodes store, read around the LogReader (a reader bug cannot hide
    # a copy), and the reader's read of them
    stored = read_stored(client, target)
    assert stored.problems == []
    assert [m.payload for m in stored.messages] == payloads(target)
    got = Counter(m.payload for m in stored.messages)
    assert got == want, f"lost: {sorted(want - got)[:10]}, written twice: {sorted(got - want)[:10]}"
    for m in stored.messages:  # each result carries the id of its source entry and index
        i, k = (int(x) for x in m.payload[1:].split(b"."))
        want_id = source_id("billing", source.log_id, ids[i], k)
        assert m.properties[SOURCE_PROPERTY] == want_id
    assert _marks_cover_what_precedes(target, "billing", source.log_id) == []
    assert source.readers()[0].lag == 0


@BOTH
def test_processor_sigkilled_at_random_points_writes_each_result_once(
    tmp_path: Path, wp_connect, meta_config
) -> None:
    _kill_rounds(tmp_path, wp_connect, meta_config, rounds=10, seed=4, window_s=None)


def test_processor_sigkilled_with_a_window_too_short_to_help(tmp_path: Path, wp_connect) -> None:
    """The window forgets every id at once: only the target check keeps the restarts from
    writing results again."""
    _kill_rounds(tmp_path, wp_connect, {}, rounds=10, seed=44, window_s=0.001)


@pytest.mark.slow
@pytest.mark.parametrize("window_s", [None, 0.001])
def test_processor_sigkilled_many_rounds(
    tmp_path: Path, wp_connect, window_s: float | None
) -> None:
    """50 rounds (20 in CI's slice of the slow profile, twice the default tests' 10)."""
    rounds = size(full=50, ci=20)
    _kill_rounds(tmp_path, wp_connect, {}, rounds=rounds, seed=2929, window_s=window_s)
