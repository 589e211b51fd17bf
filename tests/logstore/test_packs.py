"""Packs (issue 32 item 2): the node that writes small blocks also puts copies of them as pack
objects off the write path, so a node fencing the segment (a takeover) reads a few packs instead
of one object per block, and finds the end without listing every key. The blocks stay the record:
a damaged block is still seen, and the packs go once the segment is completed.

Each case writes single-entry blocks through one engine (the old writer's node) and fences and
reads them through a fresh engine on a store that counts requests (the taking-over node)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from woodpecker_idem._core import encode_entry
from woodpecker_idem.errors import CorruptEntryError
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.storage import (
    PACK_BLOCKS,
    PACK_DIR,
    PROBE_AFTER_BLOCKS,
    ObjectSegmentStorage,
)
from woodpecker_idem.objectstore.local import LocalObjectStore

LOG = 1


class CountingStore(LocalObjectStore):
    """Counts GETs by kind of object (block, pack, other) and LISTs."""

    def __init__(self, root: Path):
        super().__init__(root, fsync=False)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        kind = "blk" if key.endswith(".blk") else "pack" if key.endswith(".pk") else "other"
        with self._lock:
            self.counts[kind] += 1
        return super().get(key)

    def list(self, prefix: str) -> list[str]:
        with self._lock:
            self.counts["list"] += 1
        return super().list(prefix)


def _record(seg: int, e: int) -> bytes:
    return encode_entry(seg, e, 1_000 + e, b"payload-%d" % e, None, e.to_bytes(16, "big"))


def _single_writes(engine: LogStoreEngine, seg: int, first: int, n: int) -> None:
    """n single writes: one block each, carrying the LAC of the write before it."""
    for e in range(first, first + n):
        engine.add_entries(LOG, seg, e, _record(seg, e), lac=e - 1)


class GatedStore(LocalObjectStore):
    """Pack puts wait for `gate`: the pack thread lags behind the adds (a busy machine)."""

    def __init__(self, root: Path):
        super().__init__(root, fsync=False)
        self.gate = threading.Event()

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> bool:
        if key.endswith(".pk"):
            assert self.gate.wait(60)
        return super().put(key, data, if_none_match=if_none_match)


def _old_writer(
    root: Path, segments: int, n: int, unpacked: int, store: LocalObjectStore | None = None
) -> None:
    """`segments` segments of n single writes each, written on as many threads at once, every
    block in a pack; then `unpacked` more per segment whose packs never got put (a writer killed
    before its next pack was due)."""
    store = store or LocalObjectStore(root, fsync=False)
    storage = ObjectSegmentStorage(store)
    engine = LogStoreEngine(storage)
    threads = [
        threading.Thread(target=_single_writes, args=(engine, seg, 0, n)) for seg in range(segments)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if isinstance(store, GatedStore):
        store.gate.set()
    assert storage.packer.wait_idle(60)
    storage.packer.pack_blocks = 0  # the writer is gone before these are packed
    for seg in range(segments):
        _single_writes(engine, seg, n, unpacked)
    engine.close()


@pytest.mark.parametrize("unpacked", [0, PACK_BLOCKS - 1])
def test_a_takeover_reads_packs_and_few_blocks(tmp_path: Path, unpacked: int) -> None:
    n, segments = 1_100, 3
    _old_writer(tmp_path, segments, n, unpacked)
    store = CountingStore(tmp_path)
    engine = LogStoreEngine(ObjectSegmentStorage(store))
    last = n + unpacked - 1
    for seg in range(segments):
        store.counts.clear()
        assert engine.fence(LOG, seg) == (last, last - 1)
        assert engine.completed_end(LOG, seg) is None
        # the rebuild's reads: every entry, in chunks, from the blocks the fence took from packs
        got = [e for start in range(0, last + 1, 500) for e in engine.read(LOG, seg, start, 500)]
        engine.complete(LOG, seg, last)
        # 1,100 blocks: 4 packs of 256, 4 of 16 and one of the rest, without listing the blocks;
        # the blocks no pack holds, and the numbers past the end probed (up to 16 at once)
        assert store.counts["pack"] <= 10, store.counts
        assert store.counts["blk"] <= unpacked + 20, store.counts
        assert store.counts["list"] <= 4, store.counts
        assert got == [_record(seg, e)[8:] for e in range(last + 1)]
    engine.close()


def test_a_damaged_block_is_still_seen_by_readers(tmp_path: Path) -> None:
    n = 300
    _old_writer(tmp_path, 1, n, 0)
    store = LocalObjectStore(tmp_path, fsync=False)
    key = f"{LOG}/0/100.blk"
    data = bytearray(store.get(key) or b"")
    data[-3] ^= 0xFF  # a flipped payload byte: the record's CRC no longer matches
    store.put(key, bytes(data))
    engine = LogStoreEngine(ObjectSegmentStorage(store))
    assert engine.fence(LOG, 0)[0] == n - 1
    # the takeover's own read gets the pack's copy, once
    assert len(engine.read(LOG, 0, 0, n)) == n
    engine.complete(LOG, 0, n - 1)
    with pytest.raises(CorruptEntryError, match="100.blk entry 100: checksum"):
        engine.read(LOG, 0, 100, 1)  # a later read of the same node gets the block itself
    reader = LogStoreEngine(ObjectSegmentStorage(store))
    with pytest.raises(CorruptEntryError, match="checksum"):
        reader.read(LOG, 0, 0, n)
    engine.close()
    reader.close()


def test_packs_are_deleted_once_the_segment_is_completed(tmp_path: Path) -> None:
    n = 600
    _old_writer(tmp_path, 1, n, 3)
    store = LocalObjectStore(tmp_path, fsync=False)
    packs = f"{LOG}/0/{PACK_DIR}"
    assert store.list(packs), "packs were put"
    storage = ObjectSegmentStorage(store)
    engine = LogStoreEngine(storage)
    engine.fence(LOG, 0)
    engine.complete(LOG, 0, n + 2)
    assert storage.packer.wait_idle(60)
    assert store.list(packs) == []
    assert len(store.list(f"{LOG}/0/")) == n + 3 + 2  # every block, the fence marker, the footer
    engine.close()


@pytest.mark.parametrize("lagging", [False, True])
def test_merged_packs_replace_the_smaller_ones(tmp_path: Path, lagging: bool) -> None:
    """Every PACK_BLOCKS packs of one size become one pack of the next, the smaller deleted: the
    packs a fence reads stay few however long the segment, also when the pack thread ran only
    once every block was added (packs of PACK_BLOCKS still, the rest in a last one)."""
    store = GatedStore(tmp_path) if lagging else None
    _old_writer(tmp_path, 1, 16 * PACK_BLOCKS + 2 * PACK_BLOCKS + 5, 0, store)
    names = [k.rsplit("/", 1)[-1] for k in LocalObjectStore(tmp_path).list(f"{LOG}/0/{PACK_DIR}")]
    assert names == [
        "0000000000-0000000255.pk",
        "0000000256-0000000271.pk",
        "0000000272-0000000287.pk",
        "0000000288-0000000292.pk",
    ]


def test_a_reader_of_a_long_segment_finds_new_blocks_and_the_footer_without_listing(
    tmp_path: Path,
) -> None:
    """Past PROBE_AFTER_BLOCKS blocks a node finds the blocks another process added by reading
    the next numbers (a LIST of 1,000 keys costs ~0.4 s on moto), and the footer too."""
    n = PROBE_AFTER_BLOCKS + 5
    writer = LogStoreEngine(ObjectSegmentStorage(LocalObjectStore(tmp_path, fsync=False)))
    _single_writes(writer, 0, 0, n)
    store = CountingStore(tmp_path)
    reader = LogStoreEngine(ObjectSegmentStorage(store))
    assert len(reader.read(LOG, 0, 0, 2 * n)) == n
    _single_writes(writer, 0, n, 40)  # more than one round of probes
    store.counts.clear()
    assert reader.last_add_confirmed(LOG, 0) == (n + 39, n + 38)
    assert reader.read(LOG, 0, n, 100) == [_record(0, e)[8:] for e in range(n, n + 40)]
    writer.complete(LOG, 0, n + 39)
    assert reader.completed_end(LOG, 0) == n + 39
    assert store.counts["list"] == 0, store.counts
    writer.close()
    reader.close()
