"""LogReader: start positions, iteration, tail mode, crossing segments, corrupt blocks."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from segfile_util import flip_entry_byte

from woodpecker_idem._core import decode_messages, encode_entry
from woodpecker_idem.ensemble.replicas import ReplicaFault, read_checked
from woodpecker_idem.errors import CorruptEntryError
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.types import LogMessage, LogMessageId, SegmentState


def fill(handle, n, prefix=b"m", **writer_kw):
    writer = handle.open_writer()
    futures = [writer.write_async(prefix + b"%d" % i) for i in range(n)]
    ids = [f.result(20).message_id for f in futures]
    return writer, ids


def test_start_earliest_latest_explicit(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"segment.max_entries": 8})
    handle = client.create_log("r")
    writer, ids = fill(handle, 20)
    writer.close()

    earliest = handle.open_reader("earliest")
    assert earliest.position == LogMessageId(0, 0)
    assert [m.message_id for m in earliest] == ids
    assert earliest.read_next(0) is None  # the end: nothing more without waiting

    latest = handle.open_reader("latest")
    assert list(latest) == []
    assert latest.read_next(0.05) is None

    for k in (0, 5, 7, 8, 13, 19):
        r = handle.open_reader(ids[k])
        assert r.position == ids[k]
        got = list(r)
        assert [m.message_id for m in got] == ids[k:]
        assert got[0].payload == b"m%d" % k
    # a plain tuple works as a position too
    assert handle.open_reader((1, 0)).read_next(0).message_id == LogMessageId(1, 0)
    # past the end: empty, and picks up what is written later
    beyond = handle.open_reader(LogMessageId(2, 4))
    assert list(beyond) == []
    with pytest.raises(ValueError):
        handle.open_reader("middle")


def test_latest_sees_only_new_entries_of_a_live_writer(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("live")
    writer, ids = fill(handle, 10)
    latest = handle.open_reader("latest")
    assert latest.position == LogMessageId(0, 10)
    assert list(latest) == []
    new = writer.write(b"new").message_id
    msg = latest.read_next(2)
    assert msg is not None and msg.message_id == new and msg.payload == b"new"
    writer.close()


def test_iteration_stops_at_end_and_resumes(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("it")
    writer, ids = fill(handle, 5)
    reader = handle.open_reader()
    t0 = time.monotonic()
    assert [m.message_id for m in reader] == ids
    assert time.monotonic() - t0 < 1.0  # iteration does not wait for more
    assert reader.position == LogMessageId(0, 5)
    more = [writer.write(b"x%d" % i).message_id for i in range(3)]
    assert [m.message_id for m in reader] == more  # a new iteration picks up from the position
    writer.close()
    assert list(reader) == []


def test_tail_read_next_returns_entry_written_while_waiting(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("tail")
    writer, _ = fill(handle, 3)
    reader = handle.open_reader("latest")

    t0 = time.monotonic()
    assert reader.read_next(0.3) is None
    waited = time.monotonic() - t0
    assert 0.25 <= waited < 1.5

    written: list[LogMessageId] = []

    def later():
        time.sleep(0.3)
        written.append(writer.write(b"late", properties={"who": "thread"}).message_id)

    t = threading.Thread(target=later)
    t.start()
    t0 = time.monotonic()
    msg = reader.read_next(timeout=10)
    elapsed = time.monotonic() - t0
    t.join(10)
    assert msg is not None, "read_next returned nothing although an entry was written"
    assert msg.payload == b"late" and msg.properties == {"who": "thread"}
    assert msg.message_id == written[0]
    assert elapsed < 5
    writer.close()


def test_tail_reader_crosses_segment_roll(tmp_path, wp_connect):
    """A tailing reader follows the writer into the next segment."""
    client = wp_connect(tmp_path, {"segment.max_entries": 4})
    handle = client.create_log("tail-roll")
    writer = handle.open_writer()
    reader = handle.open_reader("earliest")
    got = []
    done = threading.Event()

    def consume():
        while len(got) < 10:
            m = reader.read_next(10)
            if m is None:
                break
            got.append(m)
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    ids = []
    for i in range(10):
        ids.append(writer.write(b"%d" % i).message_id)
        time.sleep(0.01)
    assert done.wait(20)
    t.join(5)
    writer.close()
    assert [m.message_id for m in got] == ids
    assert ids[-1].segment_id == 2


def test_reader_in_another_client_sees_active_segment(tmp_path, wp_connect):
    """Another client (its own engine state) reads what a live writer acknowledged."""
    client = wp_connect(tmp_path)
    handle = client.create_log("other")
    writer, ids = fill(handle, 7)
    other = wp_connect(tmp_path).open_log("other")
    assert [m.message_id for m in other.open_reader()] == ids
    more = writer.write(b"more").message_id
    r = other.open_reader(more)
    m = r.read_next(2)
    assert m is not None and m.payload == b"more"
    writer.close()


# --- corrupt blocks -------------------------------------------------------------------------------


def test_corrupt_block_raises_corrupt_entry_naming_position(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"append.linger_ms": 50})
    handle = client.create_log("corrupt")
    writer, ids = fill(handle, 30, prefix=b"payload-")
    writer.close()
    target = 17
    seg_dir = Path(client.objects.root) / str(handle.log_id) / "0"
    _, batch_offset = flip_entry_byte(seg_dir, target)

    fresh = wp_connect(tmp_path).open_log("corrupt")  # no cached blocks
    reader = fresh.open_reader()
    with pytest.raises(CorruptEntryError) as exc:
        for _ in reader:
            pass
    msg = str(exc.value)
    assert exc.value.code == "CORRUPT_ENTRY"
    # names log / segment / file and offset of the batch / entry
    assert re.search(rf"\b{handle.log_id}/0/data@{batch_offset}\b", msg), msg
    assert re.search(rf"\bentry {target}\b", msg), msg

    # entries after the corrupt one are still readable from an explicit position
    after = list(fresh.open_reader(LogMessageId(0, target + 1)))
    assert [m.message_id for m in after] == ids[target + 1 :]
    assert after[0].payload == b"payload-%d" % (target + 1)


class _Replicas:
    """A transport whose nodes answer fixed LogEntry bytes (what a remote store could send:
    CRC-checked there, yet not a valid entry for this position)."""

    def __init__(self, answers: dict[str, list[bytes]]):
        self.answers = answers

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        return self.answers[node_id][from_entry_id : from_entry_id + max_entries]


def test_read_checked_skips_a_replica_whose_entry_does_not_parse():
    seg = SegmentMeta(9, 1, SegmentState.COMPLETED, ("node-a", "node-b"), 2, 2, 2, 0, 3)
    good = [encode_entry(1, i, 100 + i, b"p%d" % i, {"k": "v"}, b"K" * 16)[8:] for i in range(4)]
    broken = good[:3] + [b"\x22\x09abc"]  # entry 3's payload is cut short
    faults: list[ReplicaFault] = []
    transport = _Replicas({"node-a": broken, "node-b": good})
    got = read_checked(transport, seg, 0, 4, faults.append)  # type: ignore[arg-type]
    assert got == good
    assert decode_messages(got, 1, 0, LogMessage, LogMessageId) == [
        LogMessage(LogMessageId(1, i), b"p%d" % i, {"k": "v"}, 100 + i, b"K" * 16) for i in range(4)
    ]
    (fault,) = faults
    assert (fault.node, fault.log_id, fault.segment_id) == ("node-a", 9, 1)
    assert fault.error.startswith("node-a: log 9 entry 1:3: unparseable entry ("), fault.error
    # an entry stored at the wrong position is corrupt too
    transport.answers["node-a"] = [good[0], good[2]]
    assert read_checked(transport, seg, 0, 2, faults.append) == good[:2]  # type: ignore[arg-type]
    assert faults[-1].error == "node-a: log 9 entry 1:1: stored entry says 1:2", faults[-1]
    # no intact replica: the error names the position and each node's problem
    transport.answers = {"node-a": broken, "node-b": broken}
    with pytest.raises(CorruptEntryError) as exc:
        read_checked(transport, seg, 3, 1)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert msg.startswith("log 9 entry 1:3: no replica holds it intact"), msg
    assert "node-a: corrupt: node-a: log 9 entry 1:3" in msg and "node-b: corrupt" in msg, msg


def test_position_and_read_next_between_decoded_batches(tmp_path, wp_connect):
    """A read is decoded a few entries at a time: stopping anywhere in it, `position`,
    `read_next` and a new iteration go on from the next entry, none lost or repeated."""
    client = wp_connect(tmp_path)
    handle = client.create_log("chunks")
    writer, ids = fill(handle, 700)  # more than one read (500), many decoded batches
    writer.close()
    reader = handle.open_reader()
    got = []
    for stop in (1, 63, 65, 128, 498, 500, 502):  # each stop is past the read_next before it
        for m in reader:
            got.append(m.message_id)
            if len(got) == stop:
                break
        assert reader.position == ids[stop], stop
        m = reader.read_next(0)
        assert m is not None and m.message_id == ids[stop] and m.payload == b"m%d" % stop
        got.append(m.message_id)
    got += [m.message_id for m in reader]
    assert got == ids
    assert reader.read_next(0) is None and reader.position > ids[-1]
