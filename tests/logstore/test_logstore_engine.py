"""LogStoreEngine unit tests: blocks, idempotent re-adds, conflicts, fence, complete, corrupt
blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from woodpecker_idem._core import encode_entry
from woodpecker_idem.errors import CorruptEntryError, EntryConflictError, SegmentFencedError
from woodpecker_idem.logstore.blocks import (
    BLOCK_HEADER_SIZE,
    KIND_DATA,
    KIND_FENCE,
    RECORD_HEADER,
    decode_block_header,
    decode_entry,
    encode_block,
    encode_record,
)
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.objectstore.local import LocalObjectStore

LOG, SEG = 7, 3


def rec(entry_id: int, payload: bytes | None = None, seg: int = SEG) -> bytes:
    return encode_entry(
        seg,
        entry_id,
        1_700_000_000_000 + entry_id,
        payload if payload is not None else b"payload-%d" % entry_id,
        None,
        None,
    )


def frame(first: int, last: int, **kw) -> bytes:
    return b"".join(rec(i, **kw) for i in range(first, last + 1))


def payloads(raw: list[bytes]) -> list[bytes]:
    return [decode_entry(r, "t").payload for r in raw]


def blk_names(root, seg=SEG):
    d = root / str(LOG) / str(seg)
    return sorted(p.name for p in d.glob("*.blk")) if d.exists() else []


@pytest.fixture
def store(tmp_path):
    return LocalObjectStore(tmp_path / "objects", fsync=False)


@pytest.fixture
def engine(store):
    return LogStoreEngine(store, "node-0")


def test_add_read_roundtrip_and_blocks(engine, tmp_path):
    assert engine.add_entries(LOG, SEG, 0, frame(0, 4), lac=-1) == 4
    assert engine.add_entries(LOG, SEG, 5, frame(5, 9), lac=4) == 9
    assert blk_names(tmp_path / "objects") == ["0.blk", "1.blk"]
    assert payloads(engine.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(10)]
    assert payloads(engine.read(LOG, SEG, 3, 4)) == [b"payload-%d" % i for i in range(3, 7)]
    assert engine.read(LOG, SEG, 10, 5) == []
    assert engine.last_add_confirmed(LOG, SEG) == (9, 4)
    # a fresh engine over the same directory rebuilds the same state
    other = LogStoreEngine(engine.store, "node-0")
    assert other.last_add_confirmed(LOG, SEG) == (9, 4)
    assert payloads(other.read(LOG, SEG, 8, 10)) == [b"payload-8", b"payload-9"]


def test_identical_readd_acks_without_new_block_and_conflict_refused(engine, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 4))
    assert engine.add_entries(LOG, SEG, 0, frame(0, 4)) == 4  # a resend: acked again
    assert blk_names(tmp_path / "objects") == ["0.blk"]
    # overlapping resend with new entries: only the missing run is written
    assert engine.add_entries(LOG, SEG, 3, frame(3, 7)) == 7
    assert blk_names(tmp_path / "objects") == ["0.blk", "1.blk"]
    h = decode_block_header((tmp_path / "objects" / str(LOG) / str(SEG) / "1.blk").read_bytes(), "")
    assert (h.first_entry_id, h.count) == (5, 3)
    with pytest.raises(EntryConflictError):
        engine.add_entries(LOG, SEG, 2, frame(2, 2, payload=b"different"))
    with pytest.raises(EntryConflictError):  # conflict in the middle of a frame: nothing written
        engine.add_entries(LOG, SEG, 6, rec(6) + rec(7, b"other") + rec(8))
    assert engine.last_add_confirmed(LOG, SEG)[0] == 7
    assert payloads(engine.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(8)]


def test_gap_is_not_contiguous(engine):
    engine.add_entries(LOG, SEG, 0, frame(0, 2))
    engine.add_entries(LOG, SEG, 5, frame(5, 6))
    assert engine.last_add_confirmed(LOG, SEG)[0] == 2
    assert payloads(engine.read(LOG, SEG, 0, 10)) == [b"payload-0", b"payload-1", b"payload-2"]
    engine.add_entries(LOG, SEG, 3, frame(3, 4))
    assert engine.last_add_confirmed(LOG, SEG)[0] == 6
    assert len(engine.read(LOG, SEG, 0, 10)) == 7


def test_fence_refuses_adds_but_allows_recovery_copies(engine, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 4), lac=3)
    assert engine.fence(LOG, SEG) == (4, 3)
    names = blk_names(tmp_path / "objects")
    assert names == ["0.blk", "1.blk"]
    marker = decode_block_header(
        (tmp_path / "objects" / str(LOG) / str(SEG) / "1.blk").read_bytes(), ""
    )
    assert marker.kind == KIND_FENCE
    with pytest.raises(SegmentFencedError):
        engine.add_entries(LOG, SEG, 5, frame(5, 5))
    assert engine.fence(LOG, SEG) == (4, 3)  # fencing twice is harmless: no second marker
    assert blk_names(tmp_path / "objects") == names
    assert engine.add_entries(LOG, SEG, 5, frame(5, 6), recovery=True) == 6
    # a fresh engine keeps the recovery block (after the marker) and the data block (before it)
    fresh = LogStoreEngine(engine.store, "node-0")
    assert fresh.last_add_confirmed(LOG, SEG)[0] == 6
    with pytest.raises(SegmentFencedError):
        fresh.add_entries(LOG, SEG, 7, frame(7, 7))


def test_data_block_after_fence_marker_is_ignored(engine, store, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 1))
    engine.fence(LOG, SEG)
    # a data block that somehow sits after the marker (never written by the protocol) is not data
    store.put(
        f"{LOG}/{SEG}/2.blk", encode_block(KIND_DATA, 2, 2, 1, frame(2, 3)), if_none_match=True
    )
    fresh = LogStoreEngine(store, "node-0")
    assert fresh.last_add_confirmed(LOG, SEG)[0] == 1
    assert len(fresh.read(LOG, SEG, 0, 10)) == 2


def test_complete_bounds_reads_and_refuses_adds(engine, store):
    engine.add_entries(LOG, SEG, 0, frame(0, 9))
    engine.complete(LOG, SEG, 6)
    assert len(engine.read(LOG, SEG, 0, 100)) == 7  # nothing past lastEntryId is read
    assert engine.read(LOG, SEG, 7, 5) == []
    assert engine.last_add_confirmed(LOG, SEG) == (6, 6)
    with pytest.raises(SegmentFencedError):
        engine.add_entries(LOG, SEG, 10, frame(10, 10))
    with pytest.raises(SegmentFencedError):
        engine.add_entries(LOG, SEG, 10, frame(10, 10), recovery=True)
    engine.complete(LOG, SEG, 6)  # same end again: fine
    with pytest.raises(EntryConflictError):
        engine.complete(LOG, SEG, 8)
    fresh = LogStoreEngine(store, "node-0")
    assert len(fresh.read(LOG, SEG, 0, 100)) == 7
    assert fresh.fence(LOG, SEG)[0] == 6
    with pytest.raises(EntryConflictError):
        fresh.complete(LOG, SEG, 9)


def test_segments_and_logs_are_independent_and_deletable(engine, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 2))
    engine.add_entries(LOG, SEG + 1, 0, frame(0, 1, seg=SEG + 1))
    engine.add_entries(LOG + 1, 0, 0, frame(0, 0, seg=0))
    engine.fence(LOG, SEG)
    assert engine.last_add_confirmed(LOG, SEG + 1)[0] == 1
    engine.add_entries(LOG, SEG + 1, 2, frame(2, 2, seg=SEG + 1))  # not fenced
    engine.delete_segment(LOG, SEG)
    assert blk_names(tmp_path / "objects") == []
    assert engine.read(LOG, SEG, 0, 10) == []
    assert engine.last_add_confirmed(LOG, SEG) == (-1, -1)
    assert len(engine.read(LOG, SEG + 1, 0, 10)) == 3
    engine.delete_log(LOG)
    assert engine.read(LOG, SEG + 1, 0, 10) == []
    assert len(engine.read(LOG + 1, 0, 0, 10)) == 1


def test_other_engine_sees_new_blocks(store):
    """Two engines on one directory (two processes): a reader-side engine picks up new blocks."""
    a = LogStoreEngine(store, "node-0")
    b = LogStoreEngine(store, "node-0")
    a.add_entries(LOG, SEG, 0, frame(0, 2))
    assert len(b.read(LOG, SEG, 0, 10)) == 3
    a.add_entries(LOG, SEG, 3, frame(3, 5))
    assert len(b.read(LOG, SEG, 3, 10)) == 3
    assert b.last_add_confirmed(LOG, SEG)[0] == 5


def test_existing_entries_with_other_bytes_are_never_taken_as_ours(store):
    """A stale engine (another process, loaded before) whose block key or entries are already
    taken by other bytes is refused, data or recovery copy alike; the stored bytes stay."""
    a = LogStoreEngine(store, "node-0")
    stale = LogStoreEngine(store, "node-0")
    assert stale.last_add_confirmed(LOG, SEG)[0] == -1  # loaded: the segment is empty
    a.add_entries(LOG, SEG, 0, frame(0, 2))
    stored = store.get(f"{LOG}/{SEG}/0.blk")
    for recovery in (False, True):
        with pytest.raises((SegmentFencedError, EntryConflictError)):
            stale.add_entries(LOG, SEG, 0, frame(0, 2, payload=b"other"), recovery=recovery)
    # now that it has seen block 0, the entries are compared one by one
    with pytest.raises(EntryConflictError):
        stale.add_entries(LOG, SEG, 0, frame(0, 2, payload=b"other"), recovery=True)
    assert store.get(f"{LOG}/{SEG}/0.blk") == stored
    assert payloads(LogStoreEngine(store, "node-0").read(LOG, SEG, 0, 10)) == [
        b"payload-0",
        b"payload-1",
        b"payload-2",
    ]
    # the same bytes are the same entries: acknowledged without a new block
    assert stale.add_entries(LOG, SEG, 0, frame(0, 2), recovery=True) == 2
    assert blk_names(Path(store.root)) == ["0.blk"]


# --- corrupt blocks -------------------------------------------------------------------------------


def _record_offset(data: bytes, index: int) -> int:
    pos = BLOCK_HEADER_SIZE
    for _ in range(index):
        length, _ = RECORD_HEADER.unpack_from(data, pos)
        pos += RECORD_HEADER.size + length
    return pos


def test_flipped_payload_byte_names_block_and_entry(engine, store, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 4))
    engine.add_entries(LOG, SEG, 5, frame(5, 9))
    path = tmp_path / "objects" / str(LOG) / str(SEG) / "1.blk"
    data = bytearray(path.read_bytes())
    off = _record_offset(bytes(data), 2)  # entry 7
    data[off + RECORD_HEADER.size + 5] ^= 0x01
    path.write_bytes(bytes(data))
    fresh = LogStoreEngine(store, "node-0")
    with pytest.raises(CorruptEntryError) as exc:
        fresh.read(LOG, SEG, 0, 100)
    msg = str(exc.value)
    assert f"{LOG}/{SEG}/1.blk" in msg and "entry 7" in msg, msg
    assert len(fresh.read(LOG, SEG, 0, 7)) == 7  # before the bad entry: fine
    assert len(fresh.read(LOG, SEG, 8, 2)) == 2  # after it: fine


def test_corrupt_block_header_and_truncated_block(engine, store, tmp_path):
    engine.add_entries(LOG, SEG, 0, frame(0, 4))
    path = tmp_path / "objects" / str(LOG) / str(SEG) / "0.blk"
    good = path.read_bytes()
    bad = bytearray(good)
    bad[9] ^= 0xFF  # inside the header: first_entry_id
    path.write_bytes(bytes(bad))
    with pytest.raises(CorruptEntryError, match=rf"{LOG}/{SEG}/0\.blk"):
        LogStoreEngine(store, "node-0").read(LOG, SEG, 0, 10)
    path.write_bytes(good[:-3])  # torn block: a record runs past the end
    with pytest.raises(CorruptEntryError, match=rf"{LOG}/{SEG}/0\.blk"):
        LogStoreEngine(store, "node-0").read(LOG, SEG, 0, 10)
    path.write_bytes(b"")
    with pytest.raises(CorruptEntryError, match="shorter than its header"):
        LogStoreEngine(store, "node-0").read(LOG, SEG, 0, 10)


def test_record_checksum_covers_entry_bytes():
    r = encode_record(b"hello world")
    assert len(r) == RECORD_HEADER.size + 11
    length, crc = RECORD_HEADER.unpack_from(r, 0)
    assert length == 11 and crc != 0
