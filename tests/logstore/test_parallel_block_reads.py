"""Blocks of an open segment on object storage read in parallel (`ObjectSegmentStorage.blocks`,
issue 32) give a node exactly what reading them one by one gives: the same fence answer (last
contiguous entry, LAC), the same entries, the same errors at the same block, whatever order the
reads finish in. Each case runs on two copies of one store, one engine reading with 16 threads
and one with 1, through a store whose GETs take random short times (so parallel reads finish out
of order)."""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from woodpecker_idem._core import concat, encode_entry
from woodpecker_idem.errors import WoodpeckerError
from woodpecker_idem.logstore.blocks import KIND_DATA, KIND_FENCE, KIND_RECOVERY, encode_block
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.storage import ObjectSegmentStorage
from woodpecker_idem.objectstore.local import LocalObjectStore

LOG, SEG = 1, 0
PREFIX = f"{LOG}/{SEG}/"


class JitteryStore(LocalObjectStore):
    """GETs of block objects take 0-3 ms and are counted, so reads overlap and finish out of order;
    `missing` blocks are listed but gone when read (deleted between the LIST and the GET)."""

    def __init__(self, root: Path, seed: int):
        super().__init__(root, fsync=False)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.missing: set[str] = set()
        self.gets = 0
        self.peak = 0
        self._in_flight = 0

    lists = 0

    def list(self, prefix: str) -> list[str]:
        self.lists += 1
        return super().list(prefix)

    def get(self, key: str) -> bytes | None:
        if not key.endswith(".blk"):
            return super().get(key)
        with self._lock:
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            pause = self._rng.random() * 0.003
        try:
            time.sleep(pause)
            data = None if key in self.missing else super().get(key)
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            self.gets += data is not None  # blocks read (a look for the next block is not)
        return data


def _frame(first: int, count: int) -> bytes:
    return concat(
        [
            encode_entry(SEG, e, 1_000 + e, b"payload-%d" % e, None, e.to_bytes(16, "big"))
            for e in range(first, first + count)
        ]
    )


def _write_segment(root: Path, batches: int = 60, bundle_blocks: int = 0) -> int:
    """Batches of 1-3 entries, each one block, with a LAC-only block now and then; returns the
    entries written."""
    rng = random.Random(7)
    engine = LogStoreEngine(
        ObjectSegmentStorage(LocalObjectStore(root, fsync=False), bundle_blocks=bundle_blocks)
    )
    entry = 0
    for b in range(batches):
        count = rng.randint(1, 3)
        engine.add_entries(LOG, SEG, entry, _frame(entry, count), lac=entry - 1)
        entry += count
        if b % 10 == 9:
            engine.add_entries(LOG, SEG, entry, b"", lac=entry - 1)  # a LAC-only block
    return entry


def _block_key(n: int) -> str:
    return f"{PREFIX}{n}.blk"


def _outcome(store: JitteryStore, threads: int) -> list[Any]:
    """What a fresh node reports of the segment: the fence answer, the footer's end, every entry
    from 0 (2,000 at a time, as recovery reads) and, after completing it at the fenced end, the
    entries again; an error is recorded (type and message) where it was raised."""
    engine = LogStoreEngine(ObjectSegmentStorage(store, read_threads=threads))
    got: list[Any] = []

    def step(fn: Any) -> Any:
        try:
            value = fn()
        except WoodpeckerError as exc:
            got.append((type(exc).__name__, str(exc)))
            return None
        got.append(value)
        return value

    fenced = step(lambda: engine.fence(LOG, SEG))
    step(lambda: engine.completed_end(LOG, SEG))
    step(lambda: engine.read(LOG, SEG, 0, 2_000))
    step(lambda: engine.read(LOG, SEG, 17, 5))
    if fenced is not None:
        step(lambda: engine.complete(LOG, SEG, fenced[0]))
        step(lambda: engine.read(LOG, SEG, 0, 2_000))
    engine.close()
    return got


def _both(root: Path, tmp_path: Path) -> tuple[list[Any], list[Any], JitteryStore]:
    """The outcome read with 16 threads and with 1, each on its own copy of `root`."""
    outcomes = []
    stores = []
    for threads in (16, 1):
        copy = tmp_path / f"copy-{threads}"
        shutil.copytree(root, copy)
        store = JitteryStore(copy, seed=threads)
        store.missing = {_block_key(n) for n in MISSING.get(root.name, ())}
        stores.append(store)
        outcomes.append(_outcome(store, threads))
    return outcomes[0], outcomes[1], stores[0]


MISSING: dict[str, tuple[int, ...]] = {"listed-but-gone": (23,)}


def _put_block(root: Path, n: int, data: bytes) -> None:
    LocalObjectStore(root, fsync=False).put(_block_key(n), data)


def _blocks(root: Path) -> int:
    return len(LocalObjectStore(root, fsync=False).list(PREFIX))


@pytest.mark.parametrize(
    "case",
    [
        "intact",
        "block-deleted",
        "listed-but-gone",
        "bad-header",
        "bad-record",
        "fenced-with-later-blocks",
    ],
)
def test_parallel_block_reads_equal_sequential_ones(case: str, tmp_path: Path) -> None:
    root = tmp_path / case
    entries = _write_segment(root)
    n = _blocks(root)
    if case == "block-deleted":  # a gap in the numbering: the contiguous prefix ends before it
        LocalObjectStore(root, fsync=False).delete(_block_key(30))
    elif case == "bad-header":
        _put_block(root, 40, b"WPBK" + b"\x00" * 60)
    elif case == "bad-record":  # header intact, one entry's bytes flipped: fences, reads fail
        data = bytearray(LocalObjectStore(root, fsync=False).get(_block_key(35)) or b"")
        data[-3] ^= 0xFF
        _put_block(root, 35, bytes(data))
    elif case == "fenced-with-later-blocks":
        # a fence marker, then a late data block (ignored) and a recovery copy (kept)
        _put_block(root, n, encode_block(KIND_FENCE, 0, 0, -1, b""))
        _put_block(root, n + 1, encode_block(KIND_DATA, entries, 1, entries, _frame(entries, 1)))
        _put_block(
            root, n + 2, encode_block(KIND_RECOVERY, entries, 2, entries - 1, _frame(entries, 2))
        )
    parallel, sequential, store = _both(root, tmp_path)
    assert parallel == sequential
    assert store.peak > 1, "the parallel reads overlapped"
    fence = parallel[0]
    if case == "intact":
        assert fence[0] == entries - 1 and len(parallel[2]) == entries
    elif case == "block-deleted":
        assert isinstance(fence, tuple) and 0 < fence[0] < entries - 1
    elif case in ("listed-but-gone", "bad-header"):
        assert fence[0] == "CorruptEntryError", fence
        assert ("listed but missing" if case == "listed-but-gone" else "bad block header") in fence[
            1
        ]
    elif case == "bad-record":
        assert fence[0] == entries - 1
        assert parallel[2][0] == "CorruptEntryError" and "checksum" in parallel[2][1]
    else:
        assert fence[0] == entries + 1  # the recovery copy's two entries count, the late block not
        assert [e[-20:] for e in parallel[-1]][-2:] == [e[-20:] for e in parallel[2]][-2:]


def test_a_read_of_many_blocks_runs_them_at_once_and_a_cached_block_costs_no_get(
    tmp_path: Path,
) -> None:
    root = tmp_path / "seg"
    entries = _write_segment(root)
    store = JitteryStore(root, seed=3)
    storage = ObjectSegmentStorage(store, read_threads=8)
    engine = LogStoreEngine(storage)
    assert engine.fence(LOG, SEG)[0] == entries - 1
    first_pass = store.gets
    assert first_pass == _blocks(root) - 1  # every block once (the fence marker is written)
    assert 1 < store.peak <= 8
    assert len(engine.read(LOG, SEG, 0, 2_000)) == entries
    assert store.gets == first_pass  # the fence's reads filled the cache
    storage.close()  # its reader threads stopped; it still reads, one block at a time
    assert engine.read(LOG, SEG, 0, 3) == engine.read(LOG, SEG, 0, 2_000)[:3]


def _copies(root: Path, tmp_path: Path, change: Any) -> tuple[JitteryStore, JitteryStore]:
    """Two copies of `root`, `change(copy)` applied to each; bundles removed from the second."""
    stores = []
    for name in ("bundled", "blocks-only"):
        copy = tmp_path / name
        shutil.copytree(root, copy)
        change(copy)
        store = JitteryStore(copy, seed=5)
        if name == "blocks-only":
            for key in store.list(PREFIX):
                if "bundle-" in key:
                    store.delete(key)
        stores.append(store)
    return stores[0], stores[1]


@pytest.mark.parametrize("case", ["intact", "bad-bundle", "block-deleted"])
def test_bundles_save_the_gets_and_give_what_the_blocks_give(case: str, tmp_path: Path) -> None:
    # 66 blocks written with bundles of 16: blocks 0-63 in four bundles, 64 and 65 alone
    root = tmp_path / "seg"
    entries = _write_segment(root, bundle_blocks=16)
    keys = LocalObjectStore(root, fsync=False).list(PREFIX)
    assert sorted(k for k in keys if "bundle-" in k) == [
        f"{PREFIX}bundle-{a}-{a + 15}" for a in (0, 16, 32, 48)
    ]

    def change(copy: Path) -> None:
        store = LocalObjectStore(copy, fsync=False)
        if case == "bad-bundle":  # checksum fails: skipped, its blocks read one by one
            data = bytearray(store.get(f"{PREFIX}bundle-16-31") or b"")
            data[-10] ^= 0xFF  # inside the last block's record
            store.put(f"{PREFIX}bundle-16-31", bytes(data))
        elif case == "block-deleted":  # a block of bundle 32-47 is not listed: not used
            store.delete(_block_key(40))

    bundled, blocks_only = _copies(root, tmp_path, change)
    assert _outcome(bundled, 16) == _outcome(blocks_only, 16)
    # every block once (a block deleted: 65)
    assert blocks_only.gets == (65 if case == "block-deleted" else 66)
    skipped = {"intact": 0, "bad-bundle": 16, "block-deleted": 15}[case]
    assert bundled.gets == 2 + skipped, "a GET per bundle instead of 16"
    if case == "intact":
        assert _outcome(blocks_only, 1)[0] == (entries - 1, entries - 1)


def test_a_damaged_block_in_an_intact_bundle_is_read_from_the_bundle(tmp_path: Path) -> None:
    # The bundle is a checked copy of the same bytes: a node that reads it does not need the
    # block object, so damage to that object alone goes unseen there (read one by one, the
    # block is refused, as in test_parallel_block_reads_equal_sequential_ones[bad-header]).
    root = tmp_path / "seg"
    entries = _write_segment(root, bundle_blocks=16)
    LocalObjectStore(root, fsync=False).put(_block_key(40), b"WPBK" + b"\x00" * 60)
    got = _outcome(JitteryStore(root, seed=1), 16)
    assert got[0] == (entries - 1, entries - 1) and len(got[2]) == entries


def test_a_refresh_with_nothing_new_lists_nothing_and_one_with_news_sees_them(
    tmp_path: Path,
) -> None:
    # A takeover loads the segment four times (fence, its footer, the read past its end,
    # completion); each LIST named every key of the segment. Now a load after the first looks
    # for the next block (and the footer) and lists only when there is one.
    root = tmp_path / "seg"
    entries = _write_segment(root)
    store = JitteryStore(root, seed=2)
    node = LogStoreEngine(ObjectSegmentStorage(store))
    assert node.fence(LOG, SEG)[0] == entries - 1
    assert store.lists == 1
    assert node.completed_end(LOG, SEG) is None
    assert node.read(LOG, SEG, entries, 10) == []  # past the end: a refresh
    assert node.last_add_confirmed(LOG, SEG) == (entries - 1, entries - 1)
    assert store.lists == 1, "nothing new: no LIST"
    # another process adds a recovery copy past the fence marker: the next refresh lists, sees it
    other = LogStoreEngine(ObjectSegmentStorage(LocalObjectStore(root, fsync=False)))
    other.add_entries(LOG, SEG, entries, _frame(entries, 2), lac=entries - 1, recovery=True)
    assert node.last_add_confirmed(LOG, SEG)[0] == entries + 1
    assert store.lists == 2
    # and completes it: its footer is seen without a LIST
    other.complete(LOG, SEG, entries + 1)
    assert node.completed_end(LOG, SEG) == entries + 1
    assert store.lists == 2
    assert len(node.read(LOG, SEG, 0, 2_000)) == entries + 2
