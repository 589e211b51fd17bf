"""Readers (issue 29): named, durable positions (commit, resume, fencing, list and delete), the
truth for a reader behind a truncation (`EntryTruncatedError` naming the first entry kept, never
a retriable error for ever), retention held back by named readers, and the ergonomics (text and
time starts, context managers, `last_message_id`). The SIGKILL rounds run a consumer in a child
process (support/consumerproc.py)."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from killable import KillableChild

import woodpecker_idem as wp
from woodpecker_idem.clock import ManualClock
from woodpecker_idem.errors import (
    EntryTruncatedError,
    InvalidArgumentError,
    InvalidTypeError,
    NodeUnavailableError,
    ReaderFencedError,
    TruncationPendingError,
)
from woodpecker_idem.idempotency.snapshot import list_snapshots
from woodpecker_idem.retention import RetentionPolicy, apply
from woodpecker_idem.types import LogMessageId, SegmentState

S = 1000
T0 = 1_700_000_000_000
BOTH = pytest.mark.parametrize("meta_config", ["sqlite", "etcd"], indirect=True)


def fill(handle: wp.LogHandle, n: int, idempotent: bool = False) -> list[LogMessageId]:
    writer = handle.open_writer(idempotent=idempotent)
    if idempotent:
        ids = [writer.write(b"m%d" % i, idempotency_id=f"k{i}").message_id for i in range(n)]
    else:
        ids = [f.result(20).message_id for f in [writer.write_async(b"m%d" % i) for i in range(n)]]
    # no bound: a close that runs out of time leaves its open segment to the next writer, and a
    # reader stops at an open segment's confirmed tail (a consumer child then ends early)
    writer.close(timeout=None)
    assert all(s.state is not SegmentState.ACTIVE for s in handle.segments())
    return ids


def wait_completed(log: wp.LogHandle, n: int) -> None:
    deadline = time.monotonic() + 60
    done = (SegmentState.COMPLETED, SegmentState.SEALED)
    while sum(s.state in done for s in log.segments()) < n:
        assert time.monotonic() < deadline, "segments never completed"
        time.sleep(0.005)


# --- ergonomics ---------------------------------------------------------------------------------


def test_message_id_parse_round_trips_and_refuses_bad_text() -> None:
    for mid in (LogMessageId(0, 0), LogMessageId(3, 120), LogMessageId(2**31, 7)):
        assert LogMessageId.parse(str(mid)) == mid
    assert LogMessageId.parse(" 3:120 ") == LogMessageId(3, 120)
    for bad in ("3", "3:", ":1", "-1:0", "3:-1", "a:b", "3:1:2", "3.0:1", ""):
        with pytest.raises(InvalidArgumentError, match="SEGMENT:ENTRY"):
            LogMessageId.parse(bad)
    with pytest.raises(InvalidTypeError):
        LogMessageId.parse(3)  # type: ignore[arg-type]


def test_text_and_time_starts_context_manager_and_last_id(tmp_path: Path, wp_connect) -> None:
    clock = ManualClock(T0)
    client = wp_connect(tmp_path, {"segment.max_entries": 4}, clock=clock)
    log = client.create_log("r")
    assert log.last_message_id() is None  # empty
    writer = log.open_writer()
    ids, stamps = [], []
    for i in range(10):
        clock.advance(10)
        ids.append(writer.write(b"m%d" % i).message_id)
        stamps.append(clock.now_ms())
    writer.close()
    assert log.last_message_id() == ids[-1]
    with log.open_reader(str(ids[5])) as reader:  # the text str(LogMessageId) prints
        assert [m.message_id for m in reader] == ids[5:]
    assert reader.read_next(0) is None  # closed: nothing buffered is left
    with pytest.raises(InvalidArgumentError, match="'3-1'"):
        log.open_reader("3-1")
    # by time: the first entry at or after it (like Kafka's offsetsForTimes)
    for k in (0, 3, 4, 9):
        assert log.open_reader(start_time_ms=stamps[k]).read_next(0).message_id == ids[k]
        between = log.open_reader(start_time_ms=stamps[k] - 5)
        assert between.read_next(0).message_id == ids[k]
    assert log.open_reader(start_time_ms=0).read_next(0).message_id == ids[0]
    after = log.open_reader(start_time_ms=stamps[-1] + 1)
    assert after.read_next(0) is None and after.position > ids[-1]
    with pytest.raises(InvalidArgumentError, match="not both"):
        log.open_reader("latest", start_time_ms=stamps[0])
    # truncated away: the last id is not one a reader can read
    log.truncate(LogMessageId(ids[-1].segment_id, ids[-1].entry_id + 1))
    assert log.last_message_id() is None


# --- named readers -------------------------------------------------------------------------------


@BOTH
def test_named_reader_resumes_after_its_commit(tmp_path: Path, wp_connect, meta_config) -> None:
    client = wp_connect(tmp_path, {"segment.max_entries": 4, **meta_config})
    log = client.create_log("orders")
    ids = fill(log, 12)
    with log.open_reader("1:0", name="billing") as r:  # a new name: starts at `start`
        got = [r.read_next(0).message_id for _ in range(3)]
        assert got == ids[4:7]
        assert r.commit() == LogMessageId(got[-1].segment_id, got[-1].entry_id + 1)
        r.read_next(0)  # read, not committed: read again after the reopen
    with log.open_reader("earliest", name="billing") as r:  # known: `start` is ignored
        assert r.read_next(0).message_id == ids[ids.index(got[-1]) + 1]
        assert r.commit(ids[1]) == LogMessageId(ids[1].segment_id, ids[1].entry_id + 1)
    with log.open_reader(name="billing") as r:  # commit(id): resume after that entry
        assert [m.message_id for m in r] == ids[2:]
        r.commit()
    info = {i.name: i for i in log.readers()}
    assert info["billing"].lag == 0 and info["billing"].epoch == 3
    with log.open_reader(name="audit"):  # never committed: at its start, the whole log behind
        pass
    lags = {i.name: (i.position, i.lag) for i in log.readers()}
    assert lags == {"audit": (LogMessageId(0, 0), 12), "billing": (lags["billing"][0], 0)}
    # another client of the same store sees the same names and positions
    other = wp_connect(tmp_path, {"segment.max_entries": 4, **meta_config})
    assert [i.name for i in other.open_log("orders").readers()] == ["audit", "billing"]
    with pytest.raises(InvalidArgumentError, match="named reader"):
        log.open_reader().commit()


@BOTH
def test_a_second_reader_of_the_name_fences_the_first(
    tmp_path: Path, wp_connect, meta_config
) -> None:
    config = {"segment.max_entries": 4, **meta_config}
    log = wp_connect(tmp_path, config).create_log("orders")
    ids = fill(log, 8)
    first = log.open_reader(name="billing")
    first.read_next(0)
    first.commit()
    second = wp_connect(tmp_path, config).open_log("orders").open_reader(name="billing")
    assert second.position == ids[1]  # the first one's commit
    first.read_next(0)
    with pytest.raises(ReaderFencedError, match="opened again") as info:
        first.commit()
    assert info.value.code == "READER_FENCED" and not info.value.retriable
    assert isinstance(info.value, wp.WoodpeckerError)
    assert log.readers()[0].position == ids[1]  # the fenced commit changed nothing
    second.read_next(0)
    second.commit()
    assert log.delete_reader("billing") and not log.delete_reader("billing")
    with pytest.raises(ReaderFencedError, match="deleted"):
        second.commit()
    assert log.readers() == []


def test_commit_async_stores_in_order_and_close_waits(tmp_path: Path, wp_connect) -> None:
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("orders")
    ids = fill(log, 12)
    reader = log.open_reader(name="billing")
    futures = []
    for _ in range(10):
        reader.read_next(0)
        futures.append(reader.commit_async())
    done = [f.result(30) for f in futures]
    # each future is its own position (just past the entry read: the last entry of a segment
    # is followed by its segment's next id) or a later one that replaced it while it waited
    after = [LogMessageId(m.segment_id, m.entry_id + 1) for m in ids[:10]]
    assert all(d >= want for d, want in zip(done, after, strict=True)), (done, after)
    assert done[-1] == ids[10] and reader.committed == ids[10]
    reader.read_next(0)
    assert reader.commit() == ids[11]  # a sync commit after them: stored last
    late = reader.commit_async(ids[2])  # explicit, backwards: the newest asked for wins
    reader.close()  # waits for it
    assert late.done() and log.readers()[0].position == ids[3]
    # a fenced reader's background commit fails on its future, not silently
    first = log.open_reader(name="billing")
    log.open_reader(name="billing")
    with pytest.raises(ReaderFencedError):
        first.commit_async().result(30)
    first.close()


# --- behind a truncation -------------------------------------------------------------------------


@BOTH
def test_a_reader_behind_a_truncation_gets_the_truth(
    tmp_path: Path, wp_connect, meta_config
) -> None:
    client = wp_connect(tmp_path, {"segment.max_entries": 4, **meta_config})
    log = client.create_log("t")
    ids = fill(log, 20)  # segments 0..4
    unnamed = log.open_reader()
    named = log.open_reader(name="slow")
    for r in (unnamed, named):
        assert r.read_next(0).message_id == ids[0]  # segment 0 is buffered now
    named.commit()
    log.truncate(LogMessageId(3, 0))
    for r in (unnamed, named):
        assert [r.read_next(0).message_id for _ in range(3)] == ids[1:4]  # what it holds
        for _ in range(3):  # every call, not once: and never the retriable NodeUnavailable
            with pytest.raises(EntryTruncatedError, match="first entry kept is 3:0") as info:
                r.read_next(0)
            assert info.value.first_kept == LogMessageId(3, 0) and not info.value.retriable
        assert r.seek_to_earliest() == LogMessageId(3, 0)
        assert [m.message_id for m in r] == ids[12:]
    named.commit()
    assert log.readers()[0].lag == 0
    # a named reader whose commit was truncated away learns it at its first read after the open
    log.open_reader(name="late").close()  # committed at 3:0 (its start)
    log.truncate(LogMessageId(4, 0))
    again = log.open_reader(name="late")
    with pytest.raises(EntryTruncatedError) as info:
        again.read_next(0)
    assert info.value.first_kept == LogMessageId(4, 0)
    again.seek_to_earliest()
    assert [m.message_id for m in again] == ids[16:]


def test_open_writer_while_a_truncation_runs(tmp_path: Path, wp_connect) -> None:
    """The truncation runs between the recovering writer's look at the segments and its read of
    them (the window rebuild reads every segment still in the window): the segment's entries
    are gone, its keys kept aside; the writer must open, and retries stay duplicates."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("t")
    ids = fill(log, 12, idempotent=True)
    wait_completed(log, 2)
    for key in list_snapshots(client.objects, log.log_id):  # as after a SIGKILLed writer:
        client.objects.delete(key)  # the window is rebuilt from the log itself
    transport = client.transport
    real_read = transport.read
    armed = [True]

    def read(node, log_id, segment_id, first, n):  # type: ignore[no-untyped-def]
        if armed[0] and segment_id == 0:
            armed[0] = False
            log.truncate(LogMessageId(2, 0))  # drops segments 0 and 1 under the rebuild
        return real_read(node, log_id, segment_id, first, n)

    transport.read = read  # type: ignore[method-assign]
    try:
        writer = log.open_writer(idempotent=True)
    finally:
        transport.read = real_read  # type: ignore[method-assign]
    assert not armed[0], "the truncation did not run under the rebuild"
    retry = writer.write(b"m1", idempotency_id="k1")
    assert retry.duplicate and retry.message_id == ids[1]
    writer.close()


def test_truncate_while_a_writer_seals_the_same_segment(tmp_path: Path, wp_connect) -> None:
    """A live writer moves a completed segment on (COMPLETED -> SEALED, a new revision) while
    truncate marks it: truncate marks the record as it is now instead of failing with
    MetadataConflictError (seen from `cat --follow` tests against a live writer)."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("t")
    ids = fill(log, 12)
    meta = client.meta
    real_update = meta.update_segment
    raced = []

    def update(epoch, seg):  # type: ignore[no-untyped-def]
        if seg.state is SegmentState.TRUNCATED and not raced:
            raced.append(seg.segment_id)  # the writer's seal lands first: a new revision
            real_update(None, meta.get_segment(seg.log_id, seg.segment_id))
        return real_update(epoch, seg)

    meta.update_segment = update  # type: ignore[method-assign]
    try:
        log.truncate(LogMessageId(2, 0))
    finally:
        meta.update_segment = real_update  # type: ignore[method-assign]
    assert raced == [0]
    states = [s.state for s in log.segments()]
    assert states[:2] == [SegmentState.TRUNCATED] * 2
    assert [m.message_id for m in log.open_reader()] == ids[8:]


class HeldCompletions:
    """Holds the writer's background completion of segments (its metadata update to
    COMPLETED) until released: the state of a log right after a burst of writes, or of one
    whose writer died after rolling past a segment."""

    def __init__(self, meta: Any) -> None:
        self.meta, self.real = meta, meta.update_segment
        self.gate, self.reached = threading.Event(), threading.Event()
        self.held: set[int] = set()
        meta.update_segment = self.update

    def update(self, epoch: Any, seg: Any) -> Any:
        if seg.state is SegmentState.COMPLETED and not self.gate.is_set():
            self.held.add(seg.segment_id)
            self.reached.set()
            self.gate.wait(60)
        return self.real(epoch, seg)

    def wait_held(self) -> None:
        assert self.reached.wait(60), "no completion was held: the test did not set up its race"

    def release(self) -> None:
        self.gate.set()
        self.meta.update_segment = self.real


def test_truncate_right_after_a_burst_drops_the_segments_the_writer_is_completing(
    tmp_path: Path, wp_connect
) -> None:
    """After a burst, the writer's quorum acknowledged every entry but it completes the segments
    it rolled past in the background: `truncate` waits for them instead of passing over them
    (which left their entries stored and readable past the truncation point for ever, and
    `cat --follow` behind it reading on instead of ending with EntryTruncatedError)."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("t")
    held = HeldCompletions(client.meta)
    writer = log.open_writer()
    try:
        futures = [writer.write_async(b"m%d" % i) for i in range(40)]  # segments 0..9
        ids = [f.result(60).message_id for f in futures]
        held.wait_held()
        listed = threading.Semaphore(0)
        real_list = client.meta.list_segments

        def list_segments(log_id: int) -> Any:
            listed.release()
            return real_list(log_id)

        client.meta.list_segments = list_segments  # type: ignore[method-assign]
        done: list[BaseException | None] = []

        def truncate() -> None:
            try:
                log.truncate(LogMessageId(9, 0))
                done.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                done.append(exc)
            for _ in range(4):  # a truncate that did not wait fails the test at once
                listed.release()

        worker = threading.Thread(target=truncate)
        worker.start()
        for _ in range(4):  # it looked, and looked again: it waits for the held segments
            assert listed.acquire(timeout=60)
        assert not done, f"truncate returned while segments before the point were open: {done}"
        held.release()
        worker.join(60)
        client.meta.list_segments = real_list  # type: ignore[method-assign]
        assert done == [None]
    finally:
        held.release()
        writer.close()
    states = [s.state for s in log.segments()]
    assert states[:9] == [SegmentState.TRUNCATED] * 9, states
    assert [m.message_id for m in log.open_reader()] == ids[36:]


def test_truncate_past_a_segment_a_dead_writer_left_open_changes_nothing(
    tmp_path: Path, wp_connect
) -> None:
    """A segment before the point stays open past `append.timeout_ms` (its writer died before
    completing it): `truncate` raises the retriable TruncationPendingError naming it and changes
    nothing; once a writer completes it, truncate drops it."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("t")
    held = HeldCompletions(client.meta)
    writer = log.open_writer()
    try:
        ids = [f.result(60).message_id for f in [writer.write_async(b"m") for _ in range(12)]]
        held.wait_held()
        # another client of the same store, whose append.timeout_ms is short: its truncate
        # gives up on the open segments at once
        impatient = wp_connect(tmp_path, {"segment.max_entries": 4, "append.timeout_ms": 1})
        other = impatient.open_log("t")
        with pytest.raises(TruncationPendingError, match="still open") as info:
            other.truncate(LogMessageId(2, 0))
        assert info.value.retriable and set(info.value.segments) <= {0, 1}
        assert info.value.segments and client.meta.get_log_by_id(log.log_id).truncated_to is None
        assert all(s.state is not SegmentState.TRUNCATED for s in log.segments())
        held.release()
        log.truncate(LogMessageId(2, 0))  # this client waits for the writer to complete them
    finally:
        held.release()
        writer.close()
    assert [m.message_id for m in log.open_reader()] == ids[8:]


@BOTH
def test_retention_keeps_what_a_slow_named_reader_has_not_committed(
    tmp_path: Path, wp_connect, meta_config
) -> None:
    clock = ManualClock(T0)
    config = {"segment.max_entries": 4, "idempotency.window_duration_s": 1, **meta_config}
    client = wp_connect(tmp_path, config, clock=clock)
    log = client.create_log("r")
    ids = fill(log, 20)  # segments 0..4, sealed by the writer's close
    wait_completed(log, 5)
    slow = log.open_reader(name="slow")
    for _ in range(6):
        slow.read_next(0)
    slow.commit()  # at 1:2: segment 0 done, segment 1 not
    clock.advance(3600 * S)
    result = apply(log, RetentionPolicy(max_age_ms=60 * S))
    assert [s.segment_id for s in result.drop] == [0] and result.kept_for_readers == 4
    assert [m.message_id for m in slow] == ids[6:]  # nothing it has not committed is gone
    # the size bound is the operator's hard limit: it forces past the reader
    slow.seek(LogMessageId(1, 2))
    size = sum(s.size_bytes for s in log.segments() if s.state is not SegmentState.TRUNCATED)
    assert size > 0
    forced = apply(log, RetentionPolicy(max_bytes=1))
    assert [s.segment_id for s in forced.drop] == [1, 2, 3, 4]
    with pytest.raises(EntryTruncatedError) as info:
        slow.read_next(0)
    assert info.value.first_kept == LogMessageId(5, 0)
    assert slow.seek_to_earliest() == LogMessageId(5, 0)
    assert list(slow) == []  # everything was dropped; what is written next is read
    # a reader deleted no longer holds anything back
    log.delete_reader("slow")
    assert apply(log, RetentionPolicy(max_age_ms=60 * S)).kept_for_readers == 0


def test_a_reader_of_a_dropped_segment_never_loops_on_a_retriable_error(
    tmp_path: Path, wp_connect
) -> None:
    """The bug: a reader whose cached segment list predates the drop read the deleted files and
    got NodeUnavailableError (retriable) for ever."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    log = client.create_log("t")
    fill(log, 12)
    reader = log.open_reader()
    reader.read_next(0)
    log.truncate(LogMessageId(2, 0))
    errors = []
    for _ in range(6):
        try:
            reader.read_next(0)
        except (EntryTruncatedError, NodeUnavailableError) as exc:
            errors.append(type(exc))
    assert errors == [EntryTruncatedError] * 3


# --- a consumer SIGKILLed at random points -------------------------------------------------------


def consumer(
    data_dir: Path, out: Path, commit_every: int, config: dict[str, Any], asynchronous: bool
) -> KillableChild:
    """support/consumerproc.py in a child process, stopped by PID on every way out."""
    args = [str(data_dir), "orders", "billing", str(out), str(commit_every)]
    args += ["--config", json.dumps(config), *(["--async-commits"] if asynchronous else [])]
    return KillableChild("consumerproc.py", out, args)


def _ids(lines: list[str], tag: str) -> list[LogMessageId]:
    return [LogMessageId.parse(ln[len(tag) + 1 :]) for ln in lines if ln.startswith(tag + " ")]


def _kill_rounds(
    tmp_path: Path, wp_connect, meta_config: dict[str, Any], rounds: int, seed: int
) -> None:
    config = {"segment.max_entries": 97, **meta_config}
    client = wp_connect(tmp_path, config)
    log = client.create_log("orders")
    all_ids = fill(log, 60 * rounds + 300)
    rng = random.Random(seed)
    consumers: list[KillableChild] = []

    def first_at_or_after(pos: LogMessageId) -> int:
        return next((i for i, mid in enumerate(all_ids) if mid >= pos), len(all_ids))

    try:
        committed = LogMessageId(0, 0)
        done: list[LogMessageId] = []  # what the rounds processed, in order
        for n in range(rounds + 1):
            out = tmp_path / f"round-{n}.txt"
            c = consumer(tmp_path, out, rng.choice([1, 7, 50]), config, rng.random() < 0.3)
            consumers.append(c)
            killed = c.run_until(rng.randrange(0, 120)) if n < rounds else c.run_until(10**9)
            lines = c.lines()
            processed = _ids(lines, "P")
            # it started where the last commit left it: nothing skipped, and nothing before
            # the commit processed again
            start = first_at_or_after(committed)
            assert processed == all_ids[start : start + len(processed)], f"round {n}"
            done += processed
            record = log.readers()[0] if log.readers() else None
            if record is not None:
                commits = _ids(lines, "C")
                # the store holds the last commit the child saw return, or one it made later
                # (killed after the commit, before its line)
                assert not commits or record.position >= commits[-1]
                # and never past what it processed: a commit covers processed entries only
                end = start + len(processed)
                assert start <= first_at_or_after(record.position) <= end, f"round {n}"
                committed = record.position
            if not killed:
                assert n == rounds and lines[-1] == "DONE"
        assert set(done) == set(all_ids)  # every entry processed at least once
        assert log.readers()[0].lag == 0
    finally:
        for c in consumers:
            c.stop()


@BOTH
def test_consumer_sigkilled_at_random_points_resumes_exactly(
    tmp_path: Path, wp_connect, meta_config
) -> None:
    _kill_rounds(tmp_path, wp_connect, meta_config, rounds=10, seed=29)


@pytest.mark.slow
@BOTH
def test_consumer_sigkilled_50_rounds(tmp_path: Path, wp_connect, meta_config) -> None:
    _kill_rounds(tmp_path, wp_connect, meta_config, rounds=50, seed=2929)
