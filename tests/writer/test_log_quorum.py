"""es=3 / aq=2 in-process: node failures, lost acks, slow nodes, and the recovery LAC rule
(docs/semantics.md, docs/architecture.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gate import GatedTransport

from woodpecker_idem._core import encode_entry
from woodpecker_idem.ensemble.recovery import recover_segment
from woodpecker_idem.errors import (
    QuorumUnavailableError,
    SegmentClosedError,
    WoodpeckerError,
    WriteTimeoutError,
)
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.types import LogMessageId, SegmentState

ES3 = {"quorum.es": 3, "append.timeout_ms": 1000, "append.max_retries": 1, "append.linger_ms": 1}


def faulty(client) -> FaultInjectingTransport:
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    return faults


def read_all(handle, start="earliest"):
    return list(handle.open_reader(start))


def assert_exactly_once(msgs, acked: dict[bytes, LogMessageId]):
    seen: dict[bytes, LogMessageId] = {}
    for m in msgs:
        assert m.payload not in seen, f"{m.payload!r} twice: {seen[m.payload]} and {m.message_id}"
        seen[m.payload] = m.message_id
    for p, mid in acked.items():
        assert seen.get(p) == mid, f"acknowledged {p!r} at {mid} is {seen.get(p)} in the log"
    ids = [m.message_id for m in msgs]
    assert ids == sorted(ids)


def test_one_node_down_writes_succeed_and_survive_reopen(tmp_path, wp_connect):
    client = wp_connect(tmp_path, ES3)
    faults = faulty(client)
    faults.fail_node("node-2")
    handle = client.create_log("q1")
    writer = handle.open_writer()
    futures = {b"e%d" % i: writer.write_async(b"e%d" % i) for i in range(60)}
    acked = {p: f.result(30).message_id for p, f in futures.items()}
    acked[b"sync"] = writer.write(b"sync", timeout=30).message_id
    assert all(mid.segment_id == 0 for mid in acked.values())  # the segment kept its quorum
    writer.close()
    seg = handle.segments()[0]
    assert seg.state is SegmentState.SEALED and seg.last_entry_id == 60
    # node-2 holds nothing, so each entry has exactly aq = 2 copies
    nodes = Path(client.objects.root) / "nodes"
    assert (nodes / "node-0" / str(handle.log_id) / "0" / "data").stat().st_size > 0
    assert [p for p in (nodes / "node-2").rglob("*") if p.is_file()] == []
    client.close()

    # reopen with the node still down: reads and a takeover work with 2 of 3
    c2 = wp_connect(tmp_path, ES3)
    f2 = faulty(c2)
    f2.fail_node("node-2")
    h2 = c2.open_log("q1")
    assert_exactly_once(read_all(h2), acked)
    w2 = h2.open_writer()
    acked[b"after"] = w2.write(b"after", timeout=5).message_id
    w2.close()
    c2.close()
    # and with every node back
    c3 = wp_connect(tmp_path, ES3)
    assert_exactly_once(read_all(c3.open_log("q1")), acked)


def test_two_nodes_down_write_fails_within_bounded_time(tmp_path, wp_connect):
    """append.timeout_ms = 1000: a write whose segment cannot reach aq fails clearly, soon."""
    client = wp_connect(tmp_path, ES3)
    faults = faulty(client)
    handle = client.create_log("q2")
    writer = handle.open_writer()
    writer.write(b"a0", timeout=5)
    faults.fail_node("node-1")
    faults.fail_node("node-2")
    fut = writer.write_async(b"stuck")
    try:
        with pytest.raises((WriteTimeoutError, QuorumUnavailableError)):
            fut.result(30)  # the nodes never come back: only the writer's deadline ends it
    finally:
        faults.heal_all()
        writer.close()


def test_two_nodes_down_then_heal_nothing_acknowledged_lost(tmp_path, wp_connect):
    client = wp_connect(tmp_path, ES3)
    faults = faulty(client)
    handle = client.create_log("q2b")
    writer = handle.open_writer()
    acked = {b"a%d" % i: writer.write(b"a%d" % i, timeout=5).message_id for i in range(20)}

    faults.fail_node("node-1")
    faults.fail_node("node-2")
    pending = {b"p%d" % i: writer.write_async(b"p%d" % i) for i in range(5)}
    # once the quorum is known lost (after the retries), new writes fail fast with a clear error
    deadline = time.monotonic() + 60
    while not writer.repairing:
        assert time.monotonic() < deadline, "the quorum loss was never seen"
        time.sleep(0.01)
    refused = []
    for k in range(3):
        f = writer.write_async(b"refused-%d" % k)
        # refused, not timed out: it never waited for the nodes (a WriteTimeoutError would say so)
        with pytest.raises(QuorumUnavailableError, match="(?i)quorum"):
            f.result(30)
        refused.append(b"refused-%d" % k)

    faults.heal_all()
    # Each pending write is acknowledged, or ends not written (docs/semantics.md, "Queued when a
    # segment loses its quorum"): an entry the completed segment does not hold ends with
    # SegmentClosedError, a write still queued (not yet an entry) when the loss was seen with
    # QuorumUnavailableError. Which of the two depends on how far the writer got before the
    # loss: on a loaded machine a write_async may still be queued. (WriteTimeoutError: the
    # entry's own append.timeout_ms passed while the nodes were down; its outcome is open.)
    not_written = []
    for p, f in pending.items():  # resolved once the segment is completed
        try:
            acked[p] = f.result(10).message_id
        except (SegmentClosedError, QuorumUnavailableError):
            not_written.append(p)
        except WriteTimeoutError:
            pass
    deadline = time.monotonic() + 60
    while True:
        try:
            acked[b"b0"] = writer.write(b"b0", timeout=3).message_id
            break
        except (QuorumUnavailableError, WriteTimeoutError, SegmentClosedError):
            assert time.monotonic() < deadline, "writes did not resume after healing"
            time.sleep(0.1)
    for i in range(1, 20):
        acked[b"b%d" % i] = writer.write(b"b%d" % i, timeout=5).message_id
    assert acked[b"b0"].segment_id > acked[b"a19"].segment_id
    writer.close()
    segs = handle.segments()
    assert segs[0].state is SegmentState.SEALED and segs[0].last_entry_id >= 19
    client.close()

    c2 = wp_connect(tmp_path, ES3)
    msgs = read_all(c2.open_log("q2b"))
    assert_exactly_once(msgs, acked)
    assert not (set(refused) | set(not_written)) & {m.payload for m in msgs}


def test_a_write_still_queued_at_a_quorum_loss_ends_with_quorum_unavailable(tmp_path, wp_connect):
    """docs/semantics.md, "Queued when a segment loses its quorum": a write queued behind a batch
    in flight (not yet an entry) when the segment loses its quorum ends with
    QuorumUnavailableError, nothing of it written (the batch in flight is acknowledged or ends
    with SegmentClosedError, as the completion finds it); a retry of the queued write once healed
    is written once. (The queued
    write is admitted by the linger timer within 1 s: an attempt where the loss was seen only
    after that is run again.)"""
    client = wp_connect(tmp_path, {**ES3, "append.linger_ms": 1000, "append.timeout_ms": 30_000})
    faults = faulty(client)
    gated = GatedTransport(client.transport)
    client.transport = gated
    seen_queued = False
    for attempt in range(3):
        handle = client.create_log(f"queued-{attempt}")
        writer = handle.open_writer()
        gated.hold()
        held = writer.write_async(b"held")  # admitted at once (nothing in flight), held
        assert gated.waiting.acquire(timeout=30)
        queued = writer.write_async(b"queued")  # behind it: queued until linger or an ack
        faults.fail_node("node-1")
        faults.fail_node("node-2")
        gated.release()  # the held batch meets two nodes down: the quorum is lost
        deadline = time.monotonic() + 30
        while not writer.repairing and not queued.done():
            assert time.monotonic() < deadline, "the quorum loss was never seen"
            time.sleep(0.01)
        was_queued = len(writer._acc) == 1  # noqa: SLF001 - still queued when the loss was seen
        with pytest.raises(WriteTimeoutError):
            writer.flush(0)  # admits it now, if the linger has not
        if was_queued:
            with pytest.raises(QuorumUnavailableError, match="(?i)quorum"):
                queued.result(10)
        faults.heal_all()
        expected = []
        try:
            expected.append((b"held", held.result(30).message_id))
        except SegmentClosedError:
            pass
        if was_queued:
            # the held write's outcome comes before the repair opens the next segment: new
            # writes are refused (retriable) until then
            deadline = time.monotonic() + 30
            while writer.repairing:
                assert time.monotonic() < deadline, "the repair never ended"
                time.sleep(0.01)
            expected.append((b"queued", writer.write(b"queued", timeout=30).message_id))
            writer.close()
            assert [(m.payload, m.message_id) for m in read_all(handle)] == expected
            seen_queued = True
            break
        queued.exception(30)
        held.exception(30)
        writer.close()
    assert seen_queued, "the queued write was admitted before the loss was seen in every attempt"
    client.close()


def test_dropped_acks_no_duplicates_contiguous_ids(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {**ES3, "append.max_retries": 10, "append.max_batch_entries": 16})
    faults = faulty(client)
    handle = client.create_log("q3")
    writer = handle.open_writer()
    for node in ("node-0", "node-1", "node-2"):
        faults.drop_acks(node, 6)
    futures = [(b"d%d" % i, writer.write_async(b"d%d" % i)) for i in range(300)]
    acked = {p: f.result(15).message_id for p, f in futures}
    writer.close()
    assert faults.calls["add_entries"] > 3 * 1  # resends happened
    ids = sorted(acked.values())
    assert ids == [LogMessageId(0, i) for i in range(300)]  # contiguous, one segment, no holes
    msgs = read_all(handle)
    assert len(msgs) == 300
    assert_exactly_once(msgs, acked)
    # no node stores an entry twice: every node holds exactly 300 entries in segment 0
    for engine in faults.inner.engines.values():
        assert len(engine.read(handle.log_id, 0, 0, 1000)) == 300


def test_lost_ack_on_single_node_resolved_by_recovery_once(tmp_path, wp_connect):
    """es=1, no retries: a lost ack fails the node; recovery finds the entry, so it is committed at
    its id (not dropped, not written twice)."""
    client = wp_connect(tmp_path, {"append.max_retries": 0, "append.timeout_ms": 3000})
    faults = faulty(client)
    handle = client.create_log("q4")
    writer = handle.open_writer()
    first = writer.write(b"x0", timeout=5).message_id
    faults.drop_acks("node-0", 1)
    res = writer.write(b"x1", timeout=5).message_id
    assert res == LogMessageId(0, 1)
    nxt = writer.write(b"x2", timeout=5).message_id
    assert nxt.segment_id == 1
    writer.close()
    assert_exactly_once(read_all(handle), {b"x0": first, b"x1": res, b"x2": nxt})


def test_slow_node_times_out_then_commits(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"append.timeout_ms": 300, "append.max_retries": 3})
    gated = GatedTransport(client.transport, max_hold_s=120)
    client.transport = gated
    handle = client.create_log("q5")
    writer = handle.open_writer()
    gated.hold()  # the node answers only when the test says so: no race with the deadline
    fut = writer.write_async(b"slow")
    with pytest.raises(WriteTimeoutError):
        fut.result(60)  # while the node has not answered
    gated.release()
    writer.flush(timeout=30)  # the held call was still in flight; the entry commits once it returns
    assert fut.done()
    after = writer.write(b"after", timeout=5).message_id
    writer.close()
    msgs = read_all(handle)
    assert [m.payload for m in msgs] == [b"slow", b"after"]  # still pending, retried, committed
    assert msgs[1].message_id == after


def test_close_with_quorum_lost_resolves_every_future(tmp_path, wp_connect):
    """A write has exactly two failure outcomes; none may hang forever once the writer closed."""
    client = wp_connect(tmp_path, ES3)
    faults = faulty(client)
    handle = client.create_log("q6")
    writer = handle.open_writer()
    writer.write(b"ok", timeout=5)
    faults.fail_node("node-0")
    faults.fail_node("node-1")
    futures = [writer.write_async(b"p%d" % i) for i in range(5)]
    writer.close(timeout=0.5)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.05)
    hanging = [i for i, f in enumerate(futures) if not f.done()]
    assert not hanging, f"futures {hanging} never resolved after close()"
    for f in futures:
        assert isinstance(f.exception(), WoodpeckerError)


def test_es3_tail_reader_sees_last_acknowledged_entry(tmp_path, wp_connect):
    """A reader of the open segment sees every acknowledged entry, also while the writer is idle."""
    client = wp_connect(tmp_path, ES3)
    handle = client.create_log("q7")
    writer = handle.open_writer()
    ids = [writer.write(b"t%d" % i, timeout=5).message_id for i in range(5)]
    reader = handle.open_reader()
    got = []
    deadline = time.monotonic() + 3
    while len(got) < 5 and time.monotonic() < deadline:
        m = reader.read_next(0.5)
        if m is not None:
            got.append(m.message_id)
    writer.close()
    assert got == ids, f"reader saw {got} of acknowledged {ids} while the writer was idle"


# --- the LAC rule -----------------------------------------------------------


def _diverged_segment(client, name, tails=None):
    """Segment 0 on node-0..2 with different tails: node-0 0..9, node-1 0..7, node-2 0..4."""
    tails = tails or {"node-0": 9, "node-1": 7, "node-2": 4}
    handle = client.create_log(name)
    epoch = client.meta.take_over(handle.log_id, "old", 0, 30_000)
    seg = client.meta.create_segment(
        epoch,
        SegmentMeta(
            log_id=handle.log_id,
            segment_id=0,
            state=SegmentState.ACTIVE,
            nodes=("node-0", "node-1", "node-2"),
            es=3,
            wq=3,
            aq=2,
            created_ms=0,
        ),
    )
    records = _records()
    for node, last in tails.items():
        client.transport.add_entries(
            node, handle.log_id, 0, 0, b"".join(records[: last + 1]), lac=last - 2
        )
    return handle, seg


def _records() -> list[bytes]:
    """The ten records of `_diverged_segment`, each with its header, payloads of growing size."""
    return [
        encode_entry(0, i, 1_700_000_000_000 + i, b"r%d" % i * (i + 1), {"i": str(i)}, None)
        for i in range(10)
    ]


def _copies(engines, log_id, last):
    return {
        e: sum(1 for eng in engines.values() if eng.read(log_id, 0, e, 1)) for e in range(last + 1)
    }


def test_lac_rule_recover_segment(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    engines = client.transport.engines
    handle, seg = _diverged_segment(client, "lac")
    epoch = client.meta.take_over(handle.log_id, "new", 0, 30_000)
    done = recover_segment(client.transport, client.meta, epoch, seg, 1)
    assert done.state is SegmentState.SEALED and done.last_entry_id == 9
    copies = _copies(engines, handle.log_id, 9)
    assert all(n >= 2 for n in copies.values()), copies  # 8..9 copied up to aq
    assert copies[9] == 2 and copies[8] == 2  # ... and not beyond
    msgs = read_all(handle)
    assert [m.payload for m in msgs] == [b"r%d" % i * (i + 1) for i in range(10)]
    assert msgs[9].properties == {"i": "9"}
    # the recorded size is what the writer would have counted: the common prefix 0..4 read
    # apart, 5..9 as they were read forward (issue 29: recovery recorded 0)
    assert done.size_bytes == sum(len(r) for r in _records())
    assert handle.segments()[0].size_bytes == done.size_bytes
    # nothing past lastEntryId is ever read, on any node
    for eng in engines.values():
        assert not eng.read(handle.log_id, 0, 10, 5)


def test_recovery_at_an_end_a_node_recorded_counts_the_bytes_up_to_it(tmp_path, wp_connect):
    """An earlier recovery completed node-0 at 7 but did not seal the metadata: the end is 7 and
    the size recorded is that of entries 0..7, read from the completed node."""
    client = wp_connect(tmp_path, {"quorum.es": 3})
    handle, seg = _diverged_segment(client, "ended")
    epoch = client.meta.take_over(handle.log_id, "new", 0, 30_000)
    client.transport.complete("node-0", handle.log_id, 0, 7)
    done = recover_segment(client.transport, client.meta, epoch, seg, 1)
    assert done.last_entry_id == 7
    assert done.size_bytes == sum(len(r) for r in _records()[:8])


def test_lac_rule_through_a_new_writer(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    handle, _ = _diverged_segment(client, "lacw")
    writer = handle.open_writer()
    seg0 = handle.segments()[0]
    assert seg0.state is SegmentState.SEALED and seg0.last_entry_id == 9
    new = writer.write(b"next", timeout=5).message_id
    assert new == LogMessageId(1, 0)
    writer.close()
    assert [m.payload for m in read_all(handle)] == [b"r%d" % i * (i + 1) for i in range(10)] + [
        b"next"
    ]
    deadline = time.monotonic() + 60  # the takeover counts the bytes in the background
    while handle.segments()[0].size_bytes != sum(len(r) for r in _records()):
        assert time.monotonic() < deadline, handle.segments()[0]
        time.sleep(0.01)
    assert all(n >= 2 for n in _copies(client.transport.engines, handle.log_id, 9).values())


@pytest.mark.parametrize(("down", "expect_last"), [("node-1", 9), ("node-2", 9), ("node-0", 7)])
def test_lac_rule_with_one_node_unreachable(tmp_path, wp_connect, down, expect_last):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    engines = client.transport.engines
    handle, seg = _diverged_segment(client, "lac1")
    faults = faulty(client)
    faults.fail_node(down)
    epoch = client.meta.take_over(handle.log_id, "new", 0, 30_000)
    done = recover_segment(faults, client.meta, epoch, seg, 1)
    assert done.last_entry_id == expect_last
    up = {n: e for n, e in engines.items() if n != down}
    copies = _copies(up, handle.log_id, expect_last)
    assert all(n >= 2 for n in copies.values()), copies  # aq copies among the nodes that answered
    assert [m.payload for m in read_all(handle)] == [
        b"r%d" % i * (i + 1) for i in range(expect_last + 1)
    ]
    assert done.size_bytes == sum(len(r) for r in _records()[: expect_last + 1])


def test_lac_rule_two_nodes_unreachable_is_quorum_unavailable(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    handle, seg = _diverged_segment(client, "lac2")
    faults = faulty(client)
    faults.fail_node("node-0")
    faults.fail_node("node-2")
    epoch = client.meta.take_over(handle.log_id, "new", 0, 30_000)
    with pytest.raises(QuorumUnavailableError):
        recover_segment(faults, client.meta, epoch, seg, 1)
    assert handle.segments()[0].state is SegmentState.ACTIVE  # nothing decided
    with pytest.raises(QuorumUnavailableError):
        handle.open_writer()
    faults.heal_all()
    writer = handle.open_writer()
    assert handle.segments()[0].last_entry_id == 9
    writer.close()


class HealsAfterOneRefusal(FaultInjectingTransport):
    """A node that comes back after refusing one call: the caller met the outage and retried,
    whatever the machine's load (a timer racing the caller's retry budget is not)."""

    heal_after_refusal: str | None = None

    def _before(self, node_id: str, op: str) -> None:
        try:
            super()._before(node_id, op)
        except WoodpeckerError:
            if node_id == self.heal_after_refusal:
                self.heal_after_refusal = None
                self.heal_node(node_id)
            raise


def test_takeover_retries_transient_node_failures_until_timeout(tmp_path, wp_connect):
    """open_writer completes the previous writer's segment through node outages: it retries for
    append.timeout_ms, succeeds once enough nodes answer, and fails clearly if none come back."""
    # a budget a loaded machine's writes stay inside (the test waits it out once)
    client = wp_connect(tmp_path, {**ES3, "append.timeout_ms": 2000})
    faults = HealsAfterOneRefusal(client.transport)
    client.transport = faults
    handle = client.create_log("takeover-retry")
    first = handle.open_writer()
    acked = {b"a%d" % i: first.write(b"a%d" % i, timeout=30).message_id for i in range(5)}
    # the first writer crashes (abandoned); two of three nodes are down while the second opens
    faults.fail_node("node-0")
    faults.fail_node("node-1")
    t0 = time.monotonic()
    with pytest.raises(QuorumUnavailableError):
        handle.open_writer()
    # it retried for append.timeout_ms before giving up (a floor: no load makes it shorter)
    assert time.monotonic() - t0 >= 1.9
    faults.heal_after_refusal = "node-1"
    second = handle.open_writer()  # fence needs es - aq + 1 = 2 answers: node-1 and node-2
    assert faults.heal_after_refusal is None, "node-1 never refused the takeover: nothing retried"
    assert handle.segments()[0].state is SegmentState.SEALED
    acked[b"b"] = second.write(b"b", timeout=30).message_id
    second.close()
    faults.heal_all()
    assert_exactly_once(read_all(handle), acked)
