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

    def get(self, key: str) -> bytes | None:
        if not key.endswith(".blk"):
            return super().get(key)
        with self._lock:
            self.gets += 1
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            pause = self._rng.random() * 0.003
        try:
            time.sleep(pause)
            return None if key in self.missing else super().get(key)
        finally:
            with self._lock:
                self._in_flight -= 1


def _frame(first: int, count: int) -> bytes:
    return concat(
        [
            encode_entry(SEG, e, 1_000 + e, b"payload-%d" % e, None, e.to_bytes(16, "big"))
            for e in range(first, first + count)
        ]
    )


def _write_segment(root: Path, batches: int = 60) -> int:
    """Batches of 1-3 entries, each one block, with a LAC-only block now and then; returns the
    entries written. No packs: the fences here read the blocks (packs: test_packs.py)."""
    rng = random.Random(7)
    storage = ObjectSegmentStorage(LocalObjectStore(root, fsync=False), pack_blocks=0)
    engine = LogStoreEngine(storage)
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
