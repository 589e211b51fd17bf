"""Retention (issue 22 item 3): `retention.max_age_s` and `retention.max_bytes` drop whole completed
segments, oldest first, and never one whose entries may still be in the idempotency window; the
client applies them in the background to the logs it writes. Time is a ManualClock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem.clock import ManualClock
from woodpecker_idem.errors import ConfigError
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.retention import RetentionPolicy, apply, plan
from woodpecker_idem.types import LogMessageId, SegmentState

S = 1000  # ms
T0 = 1_700_000_000_000


def seg(i: int, completed_s: float | None, size: int = 100) -> SegmentMeta:
    """Segment i completed `completed_s` after T0 (None: still active)."""
    state = SegmentState.ACTIVE if completed_s is None else SegmentState.SEALED
    return SegmentMeta(
        1,
        i,
        state,
        ("node-0",),
        1,
        1,
        1,
        T0,
        last_entry_id=9,
        completed_ms=0 if completed_s is None else T0 + int(completed_s * S),
        size_bytes=size,
    )


def test_age_drops_old_completed_segments_up_to_the_window() -> None:
    segments = [seg(0, 0), seg(1, 10), seg(2, 20), seg(3, None)]
    policy = RetentionPolicy(max_age_ms=15 * S)
    now = T0 + 100 * S
    # window floor after every completion: all three old enough and out of the window
    p = plan(segments, now, now - 60 * S, policy)
    assert [s.segment_id for s in p.drop] == [0, 1, 2] and p.truncate_to == LogMessageId(3, 0)
    # a floor between segment 0 and 1: segment 1 may still hold keys of a window
    p = plan(segments, now, T0 + 5 * S, policy)
    assert [s.segment_id for s in p.drop] == [0] and p.truncate_to == LogMessageId(1, 0)
    assert p.kept_for_window == 2
    # only old enough by age counts: at T0 + 20 s, segment 1 (completed at 10 s) is 10 s old
    p = plan(segments, T0 + 20 * S, T0 + 20 * S, policy)
    assert [s.segment_id for s in p.drop] == [0]


def test_bytes_drop_the_oldest_until_the_log_fits() -> None:
    segments = [seg(0, 0, 300), seg(1, 1, 300), seg(2, 2, 300), seg(3, None, 0)]
    far = T0 + 3600 * S
    p = plan(segments, far, far, RetentionPolicy(max_bytes=350))
    assert [s.segment_id for s in p.drop] == [0, 1] and p.bytes_dropped == 600
    p = plan(segments, far, far, RetentionPolicy(max_bytes=900))
    assert p.drop == () and p.truncate_to is None
    # inside the window nothing goes, however large the log
    p = plan(segments, far, T0 - 1, RetentionPolicy(max_bytes=1))
    assert p.drop == () and p.kept_for_window == 3


def test_the_active_segment_and_everything_after_it_stay() -> None:
    segments = [seg(0, None), seg(1, 0)]  # an active segment before a completed one
    far = T0 + 3600 * S
    assert plan(segments, far, far, RetentionPolicy(max_age_ms=1)).drop == ()
    truncated = SegmentMeta(1, 0, SegmentState.TRUNCATED, ("node-0",), 1, 1, 1, T0)
    p = plan([truncated, seg(1, 0), seg(2, None)], far, far, RetentionPolicy(max_age_ms=1))
    assert [s.segment_id for s in p.drop] == [1] and p.truncate_to == LogMessageId(2, 0)


def test_no_bound_drops_nothing() -> None:
    far = T0 + 10**9
    assert plan([seg(0, 0), seg(1, 1)], far, far, RetentionPolicy()).drop == ()


def wait_completed(log: wp.LogHandle, n: int) -> None:
    """Until the log's first n segments are completed: a rolled segment completes in the
    background, and its completion time (the manual clock's) must be taken before it moves."""
    deadline = time.monotonic() + 60
    done = (SegmentState.COMPLETED, SegmentState.SEALED)
    while sum(s.state in done for s in log.segments()) < n:
        assert time.monotonic() < deadline, "segments never completed"
        time.sleep(0.005)


def _write(writer: object, keys: range) -> list[LogMessageId]:
    return [
        writer.write(f"v{i}".encode(), idempotency_id=f"k{i}").message_id  # type: ignore[attr-defined]
        for i in keys
    ]


def test_apply_on_a_store_keeps_the_window_and_retries_stay_duplicates(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = {"segment.max_entries": 10, "idempotency.window_duration_s": 60}
    with wp.connect(tmp_path, config, clock=clock) as client:
        log = client.open_log("orders", create=True)
        writer = log.open_writer(idempotent=True)
        ids = _write(writer, range(35))  # segments 0..2 completed at T0, 3 active
        wait_completed(log, 3)
        policy = RetentionPolicy(max_age_ms=30 * S)
        assert apply(log, policy).drop == ()  # 0 s old
        clock.advance(45 * S)  # old enough, but still inside the 60 s window
        result = apply(log, policy)
        assert result.drop == () and result.kept_for_window == 3
        again = writer.write(b"retry", idempotency_id="k3")
        assert again.duplicate and again.message_id == ids[3]
        assert len(list(log.open_reader())) == 35
        clock.advance(16 * S)  # 61 s: out of the window
        result = apply(log, policy)
        assert [s.segment_id for s in result.drop] == [0, 1, 2]
        assert result.truncate_to == LogMessageId(3, 0)
        assert [m.message_id for m in log.open_reader()] == ids[30:]
        states = [s.state for s in log.segments()]
        assert states[:3] == [SegmentState.TRUNCATED] * 3 and states[3] is SegmentState.ACTIVE
        writer.close()


def test_apply_by_bytes_on_a_store(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = {"segment.max_entries": 10, "idempotency.window_duration_s": 1}
    with wp.connect(tmp_path, config, clock=clock) as client:
        log = client.open_log("orders", create=True)
        writer = log.open_writer()
        for i in range(40):
            writer.write(b"x" * 100)
            if i % 10 == 9:
                clock.advance(1)
        writer.close()  # four completed segments of about 1 KiB each
        sizes = [s.size_bytes for s in log.segments()]
        assert len(sizes) == 4 and all(size >= 1000 for size in sizes)
        clock.advance(2 * S)  # out of the window
        result = apply(log, RetentionPolicy(max_bytes=sizes[2] + sizes[3]))
        assert [s.segment_id for s in result.drop] == [0, 1]
        assert next(iter(log.open_reader())).message_id == LogMessageId(2, 0)


def test_a_segment_completed_by_a_takeover_records_its_bytes(tmp_path: Path) -> None:
    """Issue 29: a segment its writer left ACTIVE (abandoned, as a killed writer or a streaming
    query's task leaves it) and a takeover completed recorded 0 bytes, so `max_bytes` never
    counted it. It records what a cleanly closed writer records for the same entries."""
    clock = ManualClock(T0)
    config = {"idempotency.window_duration_s": 1}
    payloads = [b"p%d" % i * (i % 7 + 1) for i in range(30)]
    with wp.connect(tmp_path, config, clock=clock) as client:
        clean = client.open_log("clean", create=True)
        writer = clean.open_writer()
        for p in payloads:
            writer.write(p)
        writer.close()
        crashed = client.open_log("crashed", create=True)
        abandoned = crashed.open_writer()
        for p in payloads:
            abandoned.write(p)
        successor = crashed.open_writer()  # takes the log over, completing segment 0
        abandoned.close()  # fenced: it leaves the log as it is
        (expected,) = clean.segments()
        # counted after the takeover, in the background: the takeover waits for none of it
        deadline = time.monotonic() + 60
        while crashed.segments()[0].size_bytes != expected.size_bytes:
            assert time.monotonic() < deadline, crashed.segments()[0]
            time.sleep(0.01)
        recorded = crashed.segments()[0]
        assert recorded.state is SegmentState.SEALED and recorded.last_entry_id == 29
        assert expected.size_bytes > sum(map(len, payloads))
        assert recorded.size_bytes == expected.size_bytes
        successor.write(b"after")
        successor.close()
        clock.advance(2 * S)  # out of the window
        newest = crashed.segments()[1].size_bytes
        result = apply(crashed, RetentionPolicy(max_bytes=newest))
        assert [s.segment_id for s in result.drop] == [0]
        assert result.bytes_dropped == expected.size_bytes
        assert [m.payload for m in crashed.open_reader()] == [b"after"]


def test_the_client_applies_retention_in_the_background(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = {
        "segment.max_entries": 10,
        "idempotency.window_duration_s": 5,
        "retention.max_age_s": 10,
        "retention.check_interval_s": 0.02,
    }
    with wp.connect(tmp_path, config, clock=clock) as client:
        log = client.open_log("orders", create=True)
        writer = log.open_writer(idempotent=True)
        _write(writer, range(25))
        wait_completed(log, 2)
        runner = client.retention
        assert runner is not None and runner.policy.max_age_ms == 10 * S
        runs = runner.runs
        deadline = time.monotonic() + 60
        while runner.runs < runs + 3:  # several passes at 0 s: nothing may go
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert runner.segments_dropped == 0
        clock.advance(11 * S)
        while runner.segments_dropped < 2:
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.01)
        assert next(iter(log.open_reader())).message_id == LogMessageId(2, 0)
        writer.close()
    assert client.retention is None  # stopped with the client


def test_without_bounds_no_runner_starts(tmp_path: Path) -> None:
    with wp.connect(tmp_path) as client:
        client.open_log("a", create=True).open_writer().close()
        assert client.retention is None


def test_retention_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match="retention.max_age_s"):
        wp.load_config(overrides={"retention.max_age_s": -1})
    with pytest.raises(ConfigError, match="retention.max_bytes"):
        wp.load_config(overrides={"retention.max_bytes": "lots"})
    cfg = wp.load_config(overrides={"retention": {"max_bytes": "10 GiB", "max_age_s": 86400}})
    assert RetentionPolicy.from_config(cfg) == RetentionPolicy(86_400_000, 10 * 1024**3)


def test_per_log_bounds_over_the_config(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    config = {
        "segment.max_entries": 10,
        "idempotency.window_duration_s": 5,
        "retention.max_age_s": 10,
        "retention.check_interval_s": 0.02,
    }
    with wp.connect(tmp_path, config, clock=clock) as client:
        with pytest.raises(ConfigError, match="retention.max_age_s"):
            client.set_retention("kept", max_age_s=-1)
        kept = client.set_retention("kept", max_age_s=0)  # no age bound for this one
        assert kept == RetentionPolicy(None, None)
        assert client.set_retention("big", max_bytes="1 KiB") == RetentionPolicy(10 * S, 1024)
        logs = {name: client.open_log(name, create=True) for name in ("kept", "plain")}
        writers = {name: log.open_writer(idempotent=True) for name, log in logs.items()}
        for writer in writers.values():
            _write(writer, range(25))
        for log in logs.values():
            wait_completed(log, 2)
        clock.advance(11 * S)
        runner = client.retention
        assert runner is not None
        deadline = time.monotonic() + 60
        while runner.segments_dropped < 2:
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.01)
        runs = runner.runs
        while runner.runs < runs + 2:  # two more passes: "kept" is left alone
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert runner.dropped == {"plain": (2, runner.dropped["plain"][1])}
        assert next(iter(logs["kept"].open_reader())).message_id == LogMessageId(0, 0)
        for writer in writers.values():
            writer.close()


def test_a_per_log_bound_alone_starts_the_runner(tmp_path: Path) -> None:
    with wp.connect(tmp_path, {"retention.check_interval_s": 0.02}) as client:
        client.set_retention("only", max_bytes=1)
        assert client.retention is None  # no writer yet
        writer = client.open_log("only", create=True).open_writer()
        assert client.retention is not None
        writer.close()


def test_a_writer_s_longer_window_is_kept_too(tmp_path: Path) -> None:
    """A writer opened with a longer window than the config's: its window is the floor."""
    clock = ManualClock(T0)
    config = {
        "segment.max_entries": 10,
        "idempotency.window_duration_s": 5,
        "retention.max_age_s": 10,
        "retention.check_interval_s": 0.02,
    }
    with wp.connect(tmp_path, config, clock=clock) as client:
        log = client.open_log("long", create=True)
        writer = log.open_writer(idempotent=True, window_duration_s=60)
        ids = _write(writer, range(25))
        wait_completed(log, 2)
        clock.advance(30 * S)  # past the config's window and max_age, inside the writer's
        runner = client.retention
        assert runner is not None
        runs = runner.runs
        deadline = time.monotonic() + 60
        while runner.runs < runs + 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert runner.segments_dropped == 0
        again = writer.write(b"retry", idempotency_id="k3")
        assert again.duplicate and again.message_id == ids[3]
        clock.advance(31 * S)  # 61 s: out of the writer's window too
        while runner.segments_dropped < 2:
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.01)
        writer.close()
