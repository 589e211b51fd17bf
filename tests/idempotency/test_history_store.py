"""The history checker reads the log around the LogReader (testing/history/store.py).

A reader that showed an entry only one node holds, or hid one, would blind a checker reading
through it. These tests hold the checker's own read to the log's rules (quorum for an open
segment, lastEntryId for a completed one, truncation, replicas agreeing) and show that
`History.check_log` reports a LogReader that disagrees with what the nodes store.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import LogMessage, LogMessageId, explicit_key
from woodpecker_idem._core import encode_entry
from woodpecker_idem.client.reader import LogReader
from woodpecker_idem.errors import CorruptEntryError
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.transport import InProcessTransport
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.objectstore.local import LocalObjectStore
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import (
    LOST,
    READER,
    REPLICAS,
    History,
    combine,
    read_stored,
    reader_problems,
)
from woodpecker_idem.types import SegmentState

T0 = 1_700_000_000_000
NODES = ("node-0", "node-1", "node-2")


def record(entry_id: int, payload: bytes | None = None, seg: int = 0) -> bytes:
    return encode_entry(seg, entry_id, T0 + entry_id, payload or b"r%d" % entry_id, None, None)


def stored(entry_id: int, payload: bytes | None = None) -> bytes:
    """A LogEntry as a node returns it: the record without its length and checksum."""
    return record(entry_id, payload)[8:]


def seg_meta(state: SegmentState, last: int = -1, aq: int = 2) -> SegmentMeta:
    return SegmentMeta(1, 0, state, NODES, 3, 3, aq, 0, last_entry_id=last)


# --- the rules, on hand-made replicas ----------------------------------------------------------


def test_an_open_segment_holds_what_a_quorum_of_nodes_holds():
    held = {
        "node-0": [stored(i) for i in range(10)],
        "node-1": [stored(i) for i in range(8)],
        "node-2": [stored(i) for i in range(5)],
    }
    problems: list[str] = []
    assert len(combine(seg_meta(SegmentState.ACTIVE), held, problems)) == 8
    assert len(combine(seg_meta(SegmentState.ACTIVE, aq=1), held, problems)) == 10
    assert len(combine(seg_meta(SegmentState.ACTIVE, aq=3), held, problems)) == 5
    assert problems == []


def test_a_completed_segment_holds_its_last_entry_id_and_each_entry_somewhere():
    held = {"node-0": [stored(i) for i in range(10)], "node-1": [stored(0)], "node-2": []}
    problems: list[str] = []
    assert len(combine(seg_meta(SegmentState.COMPLETED, last=6), held, problems)) == 7
    assert problems == []  # entries past lastEntryId on a node are not in the log
    combine(seg_meta(SegmentState.SEALED, last=11), held, problems)
    assert len(problems) == 1 and problems[0].startswith(REPLICAS), problems
    assert "entry 10 is stored intact on none" in problems[0]


def test_replicas_that_disagree_are_a_problem():
    held = {
        "node-0": [stored(0), stored(1)],
        "node-1": [stored(0), stored(1, b"other")],
        "node-2": [],
    }
    problems: list[str] = []
    combine(seg_meta(SegmentState.COMPLETED, last=1), held, problems)
    assert len(problems) == 1 and "entry 1 is stored with 2 different contents" in problems[0]


def test_reader_problems_names_every_way_a_read_can_differ():
    def m(entry: int, payload: bytes = b"p") -> LogMessage:
        return LogMessage(LogMessageId(0, entry), payload, {}, T0, None)

    log = [m(0), m(1), m(2)]
    assert reader_problems(log, list(log)) == []
    shown = reader_problems(log, [*log, m(3)])
    assert len(shown) == 1 and "returned 0:3, which is not a committed entry" in shown[0]
    assert "skipped 1 committed entries, first 0:1" in reader_problems(log, [m(0), m(2)])[0]
    assert "other contents" in reader_problems(log, [m(0), m(1, b"x"), m(2)])[0]
    assert "out of log order" in reader_problems(log, [m(0), m(2), m(1)])[0]
    assert "more than once" in reader_problems(log, [m(0), m(1), m(1), m(2)])[0]
    assert all(p.startswith(READER) for p in reader_problems(log, [m(2)]))


# --- the raw read: what a node's storage holds --------------------------------------------------


def test_the_raw_read_is_what_the_storage_holds_not_what_the_live_engine_remembers(tmp_path):
    """Another process completed the segment at entry 2 behind the node's live engine, which had
    read it before: the live engine answers from its index, up to entry 4; the raw read (the
    checker's) loads the segment from the storage and stops at the footer, through a fault
    injector too (a failed node still shows the judge what it stores)."""
    store = LocalObjectStore(tmp_path / "objects", fsync=False)
    transport = InProcessTransport({"node-0": LogStoreEngine(store, "node-0")})
    transport.add_entries("node-0", 1, 0, 0, b"".join(record(i) for i in range(5)))
    assert len(transport.read("node-0", 1, 0, 0, 10)) == 5
    LogStoreEngine(store, "node-0").complete(1, 0, 2)  # another process's engine
    assert len(transport.read("node-0", 1, 0, 0, 10)) == 5  # the live engine's memory
    assert transport.raw_read("node-0", 1, 0, 0, 10) == [stored(i) for i in range(3)]
    faults = FaultInjectingTransport(transport)
    faults.fail_node("node-0")
    assert faults.raw_read("node-0", 1, 0, 1, 10) == [stored(1), stored(2)]
    assert "raw_read" not in faults.calls


def test_the_raw_read_of_blocks_is_what_the_store_holds_not_what_a_read_cached(tmp_path):
    """Blocks on an object store are cached by the node's storage once read; a block damaged in
    the store afterwards is still served intact to the node's reads, but the raw read (the
    checker's) reads the store again and finds the damage."""
    store = LocalObjectStore(tmp_path / "objects", fsync=False)
    transport = InProcessTransport({"node-0": LogStoreEngine(store, "node-0")})
    transport.add_entries("node-0", 1, 0, 0, b"".join(record(i) for i in range(3)))
    transport.complete("node-0", 1, 0, 2)
    assert transport.raw_read("node-0", 1, 0, 0, 10) == [stored(i) for i in range(3)]
    assert len(transport.read("node-0", 1, 0, 0, 10)) == 3  # the block is cached now
    (block,) = [k for k in store.list("1/0/") if k.endswith(".blk")]
    data = bytearray(store.get(block))
    data[-3] ^= 0x40  # inside the last record's entry: its CRC no longer matches
    store.delete(block)
    store.put(block, bytes(data))
    assert len(transport.read("node-0", 1, 0, 0, 10)) == 3  # the live engine: its cache
    with pytest.raises(CorruptEntryError, match="checksum"):
        transport.raw_read("node-0", 1, 0, 0, 10)


# --- a real log --------------------------------------------------------------------------------


def _diverged(client: object, name: str) -> object:
    """An open segment 0 (es=3, aq=2) whose nodes hold 0..9, 0..7 and 0..4 with the LAC each
    add carried, as a writer that died mid-write leaves it: entries 8 and 9 lie on one node."""
    handle = client.create_log(name)  # type: ignore[attr-defined]
    epoch = client.meta.take_over(handle.log_id, "old", 0, 30_000)  # type: ignore[attr-defined]
    client.meta.create_segment(  # type: ignore[attr-defined]
        epoch, SegmentMeta(handle.log_id, 0, SegmentState.ACTIVE, NODES, 3, 3, 2, 0)
    )
    records = [
        encode_entry(0, i, T0 + i, b"r%d" % i, None, explicit_key(f"k{i}")) for i in range(10)
    ]
    for node, last in zip(NODES, (9, 7, 4), strict=True):
        client.transport.add_entries(  # type: ignore[attr-defined]
            node, handle.log_id, 0, 0, b"".join(records[: last + 1]), lac=last - 2
        )
    return handle


def _history_of(n: int) -> History:
    """Attempts that account for entries 0..n-1 of `_diverged` (each failed: may have landed)."""
    h = History()
    for i in range(n):
        h.failed(explicit_key(f"k{i}"), b"r%d" % i, "ack lost", None, h.now())
    return h


def test_stored_read_of_an_open_segment_follows_the_quorum_not_the_reader(
    tmp_path: Path, wp_connect, monkeypatch
):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    handle = _diverged(client, "open")
    got = read_stored(client, handle)
    assert [m.payload for m in got.messages] == [b"r%d" % i for i in range(8)]
    assert got.problems == [] and got.corrupt_replicas == []
    verdict = _history_of(10).check_log(handle, 60_000, 1000)
    assert verdict.ok, verdict.summary()

    # a reader that trusts what one node holds (the LAC rule dropped) shows entries 8 and 9:
    # the checker still judges the stored entries, and names the reader
    def visible_last(self, seg, need=None):
        return max(
            self._transport.last_add_confirmed(n, seg.log_id, seg.segment_id)[0] for n in seg.nodes
        )

    monkeypatch.setattr(LogReader, "_visible_last", visible_last)
    assert len(list(handle.open_reader())) == 10
    verdict = _history_of(10).check_log(handle, 60_000, 1000)
    assert not verdict.ok and verdict.kinds == {READER}, verdict.summary()
    assert "returned 0:8, which is not a committed entry" in verdict.summary()
    assert verdict.entries == 8


def test_stored_read_sees_a_lost_entry_the_reader_hides(tmp_path: Path, monkeypatch):
    client = wp.connect(tmp_path, {"quorum.es": 1})
    log = client.create_log("l")
    w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=1000)
    h = History()
    for i in range(5):
        h.call(
            explicit_key(f"k{i}"),
            b"x%d" % i,
            lambda i=i: w.write(b"x%d" % i, idempotency_id=f"k{i}"),
        )
    w.close()
    assert h.check_log(log, 60_000, 1000).ok
    # a reader that stops one entry short hides nothing from the checker
    real = LogReader._visible_last
    monkeypatch.setattr(
        LogReader, "_visible_last", lambda self, seg, need=None: real(self, seg) - 1
    )
    verdict = h.check_log(log, 60_000, 1000)
    assert verdict.kinds == {READER}, verdict.summary()
    assert "skipped 1 committed entries, first 0:4" in verdict.summary()
    # and judged through the reader alone, the same log loses an acknowledged write
    assert "lost" in h.check(list(log.open_reader()), 60_000, 1000).kinds
    client.close()


def test_stored_read_skips_what_the_log_truncated(tmp_path: Path):
    client = wp.connect(tmp_path, {"quorum.es": 1, "segment.max_entries": 4})
    log = client.create_log("t")
    w = log.open_writer()
    ids = [w.write(b"p%d" % i).message_id for i in range(10)]
    w.close()
    log.truncate(ids[6])
    got = read_stored(client, log)
    assert (
        [m.message_id for m in got.messages] == ids[6:] == [m.message_id for m in log.open_reader()]
    )
    assert got.problems == []
    client.close()


def test_every_reader_of_the_log_shows_what_a_quorum_holds(tmp_path: Path, wp_connect):
    """The reader's rule for how far an open segment may be read is one function, used by the
    LogReader, the admin CLI and the Spark source; it stops where a quorum of nodes holds the
    entries (entries 8 and 9 lie on one node here), as the checker's stored read does."""
    from woodpecker_idem.cli import common, logs
    from woodpecker_idem.client import reader
    from woodpecker_idem.spark import source

    client = wp_connect(tmp_path, {"quorum.es": 3})
    handle = _diverged(client, "copies")
    (seg,) = client.meta.list_segments(handle.log_id)
    quorum = len(read_stored(client, handle).messages) - 1
    assert quorum == 7
    assert LogReader(handle)._visible_last(seg) == quorum
    assert reader.visible_last(client.transport, seg) == quorum
    assert common.visible_last is logs.visible_last is source.visible_last is reader.visible_last
    assert source.log_spans(client, "copies")[1][-1].last == quorum


@pytest.mark.s3
def test_the_raw_read_of_a_sealed_segment_the_nodes_dropped_is_its_copy_in_s3(
    tmp_path: Path, deployment, service_cluster
):
    """Service mode with staged storage (support/servicecluster.py): once the nodes dropped
    their local copies of a SEALED segment, the checker's raw read (the RawRead of each node
    process) is the sealed copy in S3. The log is judged whole from there; then a record of
    one sealed block is damaged in S3 (after the nodes read it: a node's block cache must not
    hide it), and the checker finds the segment's entries intact on none of its nodes, which
    share that one copy."""
    config = {**deployment("service"), "quorum.es": 3, "segment.max_entries": 10}
    client = wp.connect(tmp_path, config)
    try:
        log = client.create_log(f"sealed-{uuid.uuid4().hex[:10]}")
        w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=1000)
        h = History()
        for i in range(25):
            h.call(
                explicit_key(f"k{i}"),
                b"s%d" % i,
                lambda i=i: w.write(b"s%d" % i, idempotency_id=f"k{i}"),
            )
        w.close()
        deadline = time.monotonic() + 120
        while not (
            all(s.state is SegmentState.SEALED for s in log.segments())
            and not service_cluster.local_copies(log.log_id)
        ):
            assert time.monotonic() < deadline, "segments not sealed and dropped in 120 s"
            time.sleep(0.05)
        verdict = h.check_log(log, 60_000, 1000)
        assert verdict.ok and verdict.entries == 25, verdict.summary()

        sealed = client.objects.child("sealed")
        (block,) = [k for k in sealed.list(f"{log.log_id}/1/") if k.endswith(".blk")]
        data = bytearray(sealed.get(block))
        data[-3] ^= 0x40  # inside the last record's payload: its CRC no longer matches
        sealed.put(block, bytes(data))
        verdict = h.check_log(log, 60_000, 1000, reader=False)
        assert not verdict.ok and REPLICAS in verdict.kinds, verdict.summary()
        # the damaged block's read fails whole, on every node: none holds the segment
        assert "segment 1 is SEALED at 9, but entry 0 is stored intact on none" in (
            verdict.summary()
        )
        assert verdict.kinds == {REPLICAS, LOST} and verdict.entries == 15, verdict.summary()
    finally:
        client.close()
