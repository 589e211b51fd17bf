"""LogWriter: order, durability across reopen, futures, flush, close, rolling, truncation,
bad input.

docs/semantics.md and docs/architecture.md. Every test runs embedded (es=1, local directory, SQLite)
under tmp_path unless it says otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from woodpecker_idem.errors import (
    ConfigError,
    EntryTruncatedError,
    InvalidArgumentError,
    InvalidTypeError,
    LogNotFoundError,
    PayloadTooLargeError,
    WoodpeckerError,
    WriterClosedError,
)
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.types import LogMessageId, SegmentState, WriteMessage, WriteResult


def read_all(handle, start="earliest"):
    return list(handle.open_reader(start))


def ids_contiguous(ids: list[LogMessageId]) -> bool:
    """Entry ids 0..n-1 within each segment, segments in increasing order."""
    prev = None
    for mid in ids:
        if prev is None:
            if mid.entry_id != 0:
                return False
        elif mid.segment_id == prev.segment_id:
            if mid.entry_id != prev.entry_id + 1:
                return False
        elif mid.segment_id < prev.segment_id or mid.entry_id != 0:
            return False
        prev = mid
    return True


# --- order, reopen, futures, flush, close --------------------------------------------------------


def test_acknowledged_entries_readable_after_reopen(tmp_path, wp_connect):
    """Exactly the acknowledged entries come back in order: payloads, properties, timestamps."""
    client = wp_connect(tmp_path)
    handle = client.create_log("orders")
    writer = handle.open_writer()
    acked: list[tuple[WriteResult, bytes, dict, int, int]] = []
    for i in range(120):
        payload = os.urandom(i % 37) + b"#%d" % i
        props = {"i": str(i), "kind": "even" if i % 2 == 0 else "odd"} if i % 3 else {}
        before = int(time.time() * 1000)
        if i % 2:
            res = writer.write(WriteMessage(payload, props))
        else:
            res = writer.write(payload, properties=props or None, timeout=10)
        after = int(time.time() * 1000)
        assert isinstance(res, WriteResult) and res.duplicate is False
        acked.append((res, payload, props, before, after))
    writer.close()
    client.close()

    client2 = wp_connect(tmp_path)
    handle2 = client2.open_log("orders")
    assert handle2.log_id == handle.log_id
    msgs = read_all(handle2)
    assert [m.message_id for m in msgs] == [a[0].message_id for a in acked]
    assert ids_contiguous([m.message_id for m in msgs])
    stamps = []
    for m, (_res, payload, props, before, after) in zip(msgs, acked, strict=True):
        assert m.payload == payload
        assert m.properties == props
        assert before - 5 <= m.timestamp_ms <= after + 5  # stamped once, at encode time
        assert (
            m.idempotency_key is None
        )  # plain writers store no key (docs/semantics.md: plain writers pay nothing)
        stamps.append(m.timestamp_ms)
    assert stamps == sorted(stamps)


def test_write_async_futures_resolve_in_order(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"append.linger_ms": 5, "append.max_batch_entries": 7})
    writer = client.create_log("a").open_writer()
    futures = [writer.write_async(b"p%d" % i, properties={"n": str(i)}) for i in range(500)]
    assert all(isinstance(f, Future) for f in futures)
    results = [f.result(timeout=20) for f in futures]
    ids = [r.message_id for r in results]
    assert ids == sorted(ids)
    assert len(set(ids)) == 500
    assert ids_contiguous(ids)
    assert not any(r.duplicate for r in results)
    writer.close()
    msgs = read_all(client.open_log("a"))
    assert [m.payload for m in msgs] == [b"p%d" % i for i in range(500)]
    assert [m.message_id for m in msgs] == ids


def test_ctrl_c_while_a_batch_is_cut_loses_no_entry(tmp_path, wp_connect, monkeypatch):
    """A KeyboardInterrupt raised in the caller's thread while it cuts a batch (here: as the
    batch is made, after its frame) leaves every queued entry to be sent: the writer flushes,
    closes and the log has no gap. Before, the entries were out of both the unsent list and the
    batches: never sent, while later batches committed past them."""
    from woodpecker_idem.writer import segments as segment

    client = wp_connect(tmp_path, {"append.max_batch_entries": 5})
    writer = client.create_log("a").open_writer()
    real, calls = segment.SentBatch, [0]

    def sent_batch(*args):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(segment, "SentBatch", sent_batch)
    futures, interrupted = {}, 0
    for i in range(200):
        try:
            futures[b"p%d" % i] = writer.write_async(b"p%d" % i)
        except KeyboardInterrupt:  # that write's outcome is unknown: it may be in the log
            interrupted += 1
    assert interrupted == 1 and calls[0] > 3  # the fault landed, and batches went on
    writer.flush(timeout=10)
    acked = {p: f.result(timeout=10).message_id for p, f in futures.items()}
    writer.close()
    msgs = read_all(client.open_log("a"))
    assert ids_contiguous([m.message_id for m in msgs])
    landed = {m.payload: m.message_id for m in msgs}
    assert {p: landed.get(p) for p in acked} == acked


class _FramesSent(FaultInjectingTransport):
    """Keeps every frame handed to a node's add."""

    def __init__(self, inner):
        super().__init__(inner)
        self.frames: list[bytes] = []

    def add_entries(self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, **kw):
        self.frames.append(frame)
        return super().add_entries(node_id, log_id, segment_id, first_entry_id, frame, lac, **kw)


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_a_run_alone_in_its_batch_is_sent_as_encoded_not_copied(
    tmp_path, wp_connect, monkeypatch, idempotent
):
    """A batch call's runs fill a batch each: the node is handed the very `bytes` the encoder
    made (a copy would be a second pass over every byte of the batch, and twice its memory)."""
    from woodpecker_idem.idempotency.stage import WindowStage
    from woodpecker_idem.writer import accumulator

    client = wp_connect(tmp_path, {"append.max_batch_entries": 100, "storage.fsync": "never"})
    sent = _FramesSent(client.transport)
    client.transport = sent
    log = client.create_log("lone")
    writer = log.open_writer(idempotent=idempotent)
    encoded: list[bytes] = []
    module, name = (WindowStage, "reserve_locked") if idempotent else (accumulator, "encode_frame")
    real = getattr(module, name)

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        encoded.append(out[-2])  # (frame, count) or (status, segs, ents, frame, count)
        return out

    monkeypatch.setattr(module, name, recorded)
    rows = [b"row %d" % i for i in range(450)]
    if idempotent:
        writer.write_many(rows, [str(i) for i in range(450)])
    else:
        writer.write_many(rows)
    writer.close()
    batches = [f for f in sent.frames if f]  # LAC-only updates carry no frame
    assert len(batches) == len(encoded) == 5  # runs of 100, 100, 100, 100, 50
    assert all(any(f is e for e in encoded) for f in batches)
    assert [m.payload for m in read_all(client.open_log("lone"))] == rows


def test_flush_commits_and_resolves_everything_queued(tmp_path, wp_connect):
    """flush() returns only when every entry queued before it is committed: the futures are done."""
    # The longest linger: without flush the entries would sit in the batcher for a second, and
    # five rounds that each waited for it take 5 s (half of that leaves a loaded machine room).
    client = wp_connect(tmp_path, {"append.linger_ms": 1000, "append.max_batch_entries": 10_000})
    writer = client.create_log("f").open_writer()
    flushing = 0.0
    for round_ in range(5):
        futures = [writer.write_async(b"r%d-%d" % (round_, i)) for i in range(50)]
        t0 = time.monotonic()
        writer.flush(timeout=30)
        flushing += time.monotonic() - t0
        not_done = [i for i, f in enumerate(futures) if not f.done()]
        assert not not_done, f"round {round_}: futures {not_done[:5]}... not done after flush()"
        assert all(f.exception() is None for f in futures)
    assert flushing < 2.5, "flush waited for the linger instead of sending now"
    writer.close()
    assert len(read_all(client.open_log("f"))) == 250


def test_a_lone_write_is_sent_at_once(tmp_path, wp_connect):
    """Group commit: with nothing in flight a write waits for no company, whatever
    append.linger_ms says (it no longer delays anything)."""
    # the longest linger: five writes that each waited for it take 5 s
    client = wp_connect(tmp_path, {"append.linger_ms": 1000})
    writer = client.create_log("lone").open_writer()
    t0 = time.monotonic()
    for i in range(5):
        assert writer.write(b"w%d" % i, timeout=30).message_id == LogMessageId(0, i)
    assert time.monotonic() - t0 < 2.5, "lone writes waited for a linger"
    writer.close()


def test_lingered_batch_waits_for_the_batch_in_flight(tmp_path, wp_connect):
    """Under load a batch fills while the previous one is in flight: one durable put for all of
    it, not one per linger (each would only queue behind the first). Order and acks unchanged."""
    client = wp_connect(tmp_path, {"append.linger_ms": 1})
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    handle = client.create_log("hold")
    writer = handle.open_writer()
    # the first batch stays in flight until every later write is queued (a fixed delay let it
    # land first on a busy machine, and the rest went out in many batches)
    in_flight, held = threading.Event(), threading.Event()
    inner_add = faults.add_entries

    def add_entries(*args, **kwargs):
        if not in_flight.is_set():
            in_flight.set()
            assert held.wait(60)
        return inner_add(*args, **kwargs)

    faults.add_entries = add_entries  # type: ignore[method-assign]
    first = writer.write_async(b"first")
    assert in_flight.wait(60)
    rest = []
    for i in range(20):  # spread over ~100 ms: many lingers of 1 ms
        rest.append(writer.write_async(b"r%d" % i))
        time.sleep(0.005)
    held.set()
    results = [f.result(60) for f in [first, *rest]]
    assert faults.calls["add_entries"] == 2, faults.calls
    assert [r.message_id for r in results] == [LogMessageId(0, i) for i in range(21)]
    writer.close()
    assert [m.payload for m in read_all(handle)] == [b"first"] + [b"r%d" % i for i in range(20)]


def test_write_many_after_queued_write_async_keeps_call_order(tmp_path, wp_connect):
    """A write queued by write_async (a batch is in flight) is given its id before the rows of a
    later write_many call of the same thread: the log keeps call order."""
    client = wp_connect(tmp_path, {"append.linger_ms": 1000})
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    handle = client.create_log("order")
    writer = handle.open_writer()
    faults.delay("node-0", 200)
    first = writer.write_async(b"first")
    deadline = time.monotonic() + 5
    while faults.calls.get("add_entries", 0) < 1:  # its batch is in flight
        assert time.monotonic() < deadline
        time.sleep(0.001)
    queued = writer.write_async(b"queued")  # waits behind the batch in flight
    faults.delay("node-0", 0)
    many = writer.write_many([b"m0", b"m1"], timeout=10)
    assert [f.result(5).message_id for f in (first, queued)] == [
        LogMessageId(0, 0),
        LogMessageId(0, 1),
    ]
    assert list(many.entry_ids) == [2, 3]
    writer.close()
    assert [m.payload for m in read_all(handle)] == [b"first", b"queued", b"m0", b"m1"]


def test_close_seals_then_reopen_continues(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("c")
    w1 = handle.open_writer()
    first = [w1.write(b"a%d" % i).message_id for i in range(10)]
    w1.close()
    w1.close()  # idempotent
    with pytest.raises(WriterClosedError):
        w1.write(b"after close")
    with pytest.raises(WriterClosedError):
        w1.write_async(b"after close")
    segs = handle.segments()
    assert [(s.segment_id, s.state, s.last_entry_id) for s in segs] == [(0, SegmentState.SEALED, 9)]

    w2 = client.open_log("c").open_writer()
    assert w2.epoch > w1.epoch
    second = [w2.write(b"b%d" % i).message_id for i in range(5)]
    assert all(mid.segment_id > first[-1].segment_id for mid in second)
    w2.close()
    msgs = read_all(handle)
    assert [m.payload for m in msgs] == [b"a%d" % i for i in range(10)] + [
        b"b%d" % i for i in range(5)
    ]
    assert [m.message_id for m in msgs] == first + second


def test_writer_context_manager_closes(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("cm")
    with handle.open_writer() as w:
        w.write_async(b"x")
        w.write_async(b"y")
    # close flushed both and sealed the segment
    assert [m.payload for m in read_all(handle)] == [b"x", b"y"]
    assert handle.segments()[-1].state is SegmentState.SEALED


def test_concurrent_writers_threads_no_loss_no_dup(tmp_path, wp_connect):
    """One writer shared by 4 threads: every acknowledged id is distinct and holds its payload."""
    client = wp_connect(tmp_path, {"segment.max_entries": 150})
    handle = client.create_log("mt")
    writer = handle.open_writer()
    results: dict[bytes, LogMessageId] = {}
    lock = threading.Lock()

    def run(t):
        for i in range(100):
            p = b"t%d-%d" % (t, i)
            mid = writer.write(p, timeout=20).message_id
            with lock:
                results[p] = mid

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    writer.close()
    assert len(results) == 400
    assert len(set(results.values())) == 400
    got = {m.payload: m.message_id for m in read_all(handle)}
    assert got == results


# --- rolling -------------------------------------------------------------------------------------


def test_roll_by_entries_seals_segments_with_last_entry_ids(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_entries": 100})
    handle = client.create_log("roll")
    writer = handle.open_writer()
    futures = [writer.write_async(b"e%d" % i) for i in range(250)]
    ids = [f.result(20).message_id for f in futures]
    assert ids[99] == LogMessageId(0, 99) and ids[100] == LogMessageId(1, 0)
    assert ids[-1] == LogMessageId(2, 49)
    writer.close()
    segs = handle.segments()
    assert [(s.segment_id, s.state, s.last_entry_id) for s in segs] == [
        (0, SegmentState.SEALED, 99),
        (1, SegmentState.SEALED, 99),
        (2, SegmentState.SEALED, 49),
    ]
    msgs = read_all(handle)
    assert [m.payload for m in msgs] == [b"e%d" % i for i in range(250)]
    assert [m.message_id for m in msgs] == ids


def test_roll_by_size(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_size_bytes": 4096})
    handle = client.create_log("size")
    writer = handle.open_writer()
    ids = [writer.write(b"z" * 1000).message_id for _ in range(12)]
    writer.close()
    segs = handle.segments()
    assert len(segs) >= 3
    for s in segs:
        assert s.state is SegmentState.SEALED
        n = s.last_entry_id + 1
        # a segment rolls once it reached max_size_bytes: at most one entry beyond 4096 B
        assert 1 <= n <= 5, (s.segment_id, n)
        assert [m for m in ids if m.segment_id == s.segment_id] == [
            LogMessageId(s.segment_id, e) for e in range(n)
        ]
    assert sum(s.last_entry_id + 1 for s in segs) == 12
    assert [m.message_id for m in read_all(handle)] == ids


def test_roll_by_time(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_interval_s": 0.3})
    handle = client.create_log("time")
    writer = handle.open_writer()
    a = writer.write(b"a").message_id
    b = writer.write(b"b").message_id
    time.sleep(0.45)
    c = writer.write(b"c").message_id
    assert a.segment_id == b.segment_id
    assert c.segment_id > b.segment_id and c.entry_id == 0
    # the rolled segment is completed in the background once drained
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        first = handle.segments()[0]
        if first.state is SegmentState.SEALED:
            break
        time.sleep(0.02)
    assert first.state is SegmentState.SEALED and first.last_entry_id == 1
    writer.close()
    assert [m.payload for m in read_all(handle)] == [b"a", b"b", b"c"]


# --- truncation and deletion ---------------------------------------------------------------------


def test_truncate_marks_segments_and_deletes_blocks(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_entries": 10})
    handle = client.create_log("trunc")
    writer = handle.open_writer()
    ids = [f.result(10).message_id for f in [writer.write_async(b"%d" % i) for i in range(35)]]
    writer.close()
    objects = Path(client.objects.root) / str(handle.log_id)  # {root}/{store_id}/{log_id}
    assert sorted(p.name for p in objects.iterdir()) == ["0", "1", "2", "3"]

    point = LogMessageId(2, 3)
    handle.truncate(point)
    segs = {s.segment_id: s for s in handle.segments()}
    assert segs[0].state is SegmentState.TRUNCATED
    assert segs[1].state is SegmentState.TRUNCATED
    assert segs[2].state is SegmentState.SEALED and segs[3].state is SegmentState.SEALED
    for sid in (0, 1):
        d = objects / str(sid)
        assert not d.exists() or not any(d.iterdir()), f"files of segment {sid} not deleted"
    assert (objects / "2" / "data").stat().st_size > 0

    msgs = read_all(handle)
    assert msgs[0].message_id == point
    assert [m.message_id for m in msgs] == [m for m in ids if m >= point]
    assert msgs[0].payload == b"23"
    with pytest.raises(EntryTruncatedError):
        handle.open_reader(LogMessageId(1, 5))
    with pytest.raises(EntryTruncatedError):
        handle.open_reader(LogMessageId(2, 2))
    # explicit start at or after the point is fine
    assert handle.open_reader(LogMessageId(2, 5)).read_next(0).payload == b"25"

    # a new client (fresh engine state) agrees, and the log goes on
    client2 = wp_connect(tmp_path)
    h2 = client2.open_log("trunc")
    w2 = h2.open_writer()
    new = w2.write(b"after").message_id
    w2.close()
    msgs2 = read_all(h2)
    assert msgs2[0].message_id == point and msgs2[-1].message_id == new


def test_truncate_past_the_writers_last_acknowledged_id_is_refused(tmp_path, wp_connect):
    """While a writer is open the log ends after its last acknowledged entry: a truncation
    point past it is refused, naming that end, and hides nothing; one at the end is taken, and
    what the writer acknowledges afterwards is read."""
    client = wp_connect(tmp_path)
    handle = client.create_log("trunc-open")
    writer = handle.open_writer()
    for i in range(5):
        writer.write(b"a%d" % i)  # 0:0..0:4
    assert handle.end() == LogMessageId(0, 5)
    for past in (LogMessageId(0, 6), LogMessageId(1, 0)):
        with pytest.raises(InvalidArgumentError, match=r"past the end of log 'trunc-open'.*0:5"):
            handle.truncate(past)
    assert handle.segments()[0].state is SegmentState.ACTIVE
    assert [m.payload for m in read_all(handle)] == [b"a%d" % i for i in range(5)]
    handle.truncate(LogMessageId(0, 5))  # the end: every entry so far goes
    after = [writer.write(b"b%d" % i).message_id for i in range(3)]
    assert after == [LogMessageId(0, 5 + i) for i in range(3)]
    assert [m.payload for m in read_all(handle)] == [b"b0", b"b1", b"b2"]
    writer.close()


def test_truncate_past_the_end_after_the_writer_closed_is_refused(tmp_path, wp_connect):
    """Without a writer the end is what readers see (the completed segment's last entry), here
    from another client as after a restart; the error names it and the log is left whole."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    handle = client.create_log("trunc-closed")
    writer = handle.open_writer()
    ids = [writer.write(b"a%d" % i).message_id for i in range(6)]  # 0:0..0:3, 1:0..1:1
    writer.close()
    client.close()
    other = wp_connect(tmp_path)
    h2 = other.open_log("trunc-closed")
    assert h2.end() == LogMessageId(1, 2)
    for past in (LogMessageId(1, 3), LogMessageId(2, 1), LogMessageId(3, 0)):
        with pytest.raises(InvalidArgumentError, match=r"past the end.*the next id is 1:2"):
            h2.truncate(past)
    assert [m.message_id for m in read_all(h2)] == ids
    h2.truncate(LogMessageId(1, 0))
    assert [m.message_id for m in read_all(h2)] == ids[4:]
    h2.truncate(LogMessageId(2, 0))  # segment 1 is completed: 2:0 is the same point as 1:2
    assert read_all(h2) == []
    w2 = h2.open_writer()
    assert w2.write(b"next").message_id == LogMessageId(2, 0)
    w2.close()
    assert [m.payload for m in read_all(h2)] == [b"next"]


def test_delete_log(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("gone")
    keep = client.create_log("kept")
    with handle.open_writer() as w:
        for i in range(5):
            w.write(b"%d" % i)
    with keep.open_writer() as w:
        w.write(b"k")
    assert sorted(client.list_logs()) == ["gone", "kept"]
    client.delete_log("gone")
    assert client.list_logs() == ["kept"]
    with pytest.raises(LogNotFoundError):
        client.open_log("gone")
    log_dir = Path(client.objects.root) / str(handle.log_id)
    assert Path(client.objects.root).is_dir()
    files = list(log_dir.rglob("*")) if log_dir.exists() else []
    assert files == []
    with pytest.raises(LogNotFoundError):
        client.delete_log("gone")
    # recreating the name gives an empty log; the other log is untouched
    again = client.open_log("gone", create=True)
    assert read_all(again) == []
    assert [m.payload for m in read_all(keep)] == [b"k"]


# --- bad input -----------------------------------------------------------------------------------


def test_bad_input_errors_and_writer_keeps_working(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"append.max_entry_bytes": 1024})
    handle = client.create_log("bad")
    writer = handle.open_writer()
    good = [writer.write(b"ok-0").message_id]

    with pytest.raises(PayloadTooLargeError) as exc:
        writer.write(b"x" * 1025)
    assert exc.value.code == "PAYLOAD_TOO_LARGE" and isinstance(exc.value, ValueError)
    assert "1025" in str(exc.value) and "max_entry_bytes" in str(exc.value)
    with pytest.raises(PayloadTooLargeError):
        writer.write_async(WriteMessage(b"y" * 2000))
    good.append(writer.write(b"x" * 1024).message_id)  # the limit itself is fine

    for bad in ("a str", 123, None, ["b"]):
        with pytest.raises(InvalidTypeError) as exc:
            writer.write(bad)
        assert isinstance(exc.value, TypeError)
    with pytest.raises(TypeError, match="encode"):
        writer.write("text")
    for props in ({"k": 1}, {1: "v"}, {"k": b"v"}, {"k": None}):
        with pytest.raises(InvalidTypeError):
            writer.write(b"p", properties=props)
    with pytest.raises(InvalidTypeError):
        writer.write(WriteMessage(b"p", {"k": 2}))
    with pytest.raises(InvalidArgumentError, match="idempotent"):
        writer.write(b"p", idempotency_id="key-1")
    with pytest.raises(InvalidArgumentError):
        writer.write_async(b"p", idempotency_id=b"key-1")

    good.append(writer.write(b"ok-1", properties={"a": "b"}).message_id)
    good.append(writer.write(bytearray(b"ok-2")).message_id)
    good.append(writer.write(memoryview(b"ok-3")).message_id)
    writer.close()
    msgs = read_all(handle)
    assert [m.message_id for m in msgs] == good
    assert ids_contiguous(good)  # no id was taken by a refused write
    assert [m.payload for m in msgs] == [b"ok-0", b"x" * 1024, b"ok-1", b"ok-2", b"ok-3"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("quorum.es", 2),
        ("append.timeout_ms", 0),
        ("append.linger_ms", -1),
        ("segment.max_entries", 0),
        ("append.max_entry_bytes", "lots"),
        ("objectstore.type", "ftp"),
    ],
)
def test_invalid_config_names_the_key(tmp_path, wp_connect, key, value):
    with pytest.raises(ConfigError) as exc:
        wp_connect(tmp_path, {key: value})
    assert key in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_unknown_config_key_and_unknown_log(tmp_path, wp_connect):
    with pytest.raises(ConfigError, match="append.lingerr_ms"):
        wp_connect(tmp_path, {"append.lingerr_ms": 1})
    client = wp_connect(tmp_path)
    with pytest.raises(LogNotFoundError) as exc:
        client.open_log("nope")
    assert isinstance(exc.value, WoodpeckerError) and exc.value.code == "LOG_NOT_FOUND"
    assert client.list_logs() == []
    with pytest.raises(LogNotFoundError):
        client.delete_log("nope")
    with pytest.raises(InvalidTypeError):
        client.open_log(42)
    with pytest.raises(InvalidArgumentError):
        client.create_log("a/b")
    with pytest.raises(InvalidArgumentError, match="window_duration_s"):
        client.create_log("x").open_writer(window_duration_s=5)  # type: ignore[call-overload]
