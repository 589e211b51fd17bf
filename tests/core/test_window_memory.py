"""The dedup window's memory when a writer fills it (`_core.DedupWindow`, rust/src/window.rs,
slot_index.rs, pending.rs): keys reserved in batches (`reserve_many`) and committed as their acks
arrive (`commit_through`), with several batches in flight, not one pre-sized bulk load.

`memory_bytes()` is exact (what the window allocated and touches), so these bounds do not depend
on the allocator; the resident size of a whole process is measured in benches/bench_core.py
(`test_memory_per_key`, through benches/mem_probe.py)."""

from __future__ import annotations

import os
from array import array
from collections import deque

from woodpecker_idem import _core

BATCH = 1000
IN_FLIGHT = 10
RING = 32  # bytes of a committed key's record


def fill_like_a_writer(window: _core.DedupWindow, n: int, segment: int = 1) -> None:
    in_flight: deque[int] = deque()
    ts = array("q", [1_700_000_000_000] * BATCH)
    for first in range(0, n, BATCH):
        status, _, _ = window.reserve_many(os.urandom(16 * BATCH), ts, segment, first)
        assert status.count(0) == BATCH
        in_flight.append(first + BATCH - 1)
        if len(in_flight) > IN_FLIGHT:
            window.commit_through(segment, in_flight.popleft())
    while in_flight:
        window.commit_through(segment, in_flight.popleft())


def test_a_full_window_filled_by_a_writer_costs_under_38_bytes_per_key() -> None:
    # the hashbrown index took 2^17 buckets of 5 bytes at 100k keys and its pending table kept
    # the 32,768 buckets its churn had grown to: 49.4 bytes per key
    n = 100_000
    w = _core.DedupWindow(n, 3_600_000)
    fill_like_a_writer(w, n)
    assert w.committed_count == n and w.pending_count == 0
    assert w.memory_bytes() / n <= 38.0


def test_the_pending_table_is_released_once_nothing_is_in_flight() -> None:
    n = 50_000
    w = _core.DedupWindow(n, 3_600_000)
    fill_like_a_writer(w, n)
    drained = w.memory_bytes()
    assert drained <= n * (RING + 6)  # the ring and the index: nothing kept for the peak in flight
    keys = os.urandom(16 * 20_000)
    w.reserve_many(keys, array("q", [1_700_000_000_000] * 20_000), 2, 0)
    in_flight = w.memory_bytes() - drained
    assert in_flight >= 20_000 * RING  # the records in flight are held
    assert w.commit_through(2, 9_999) == 10_000  # half acknowledged: the table stays
    assert w.memory_bytes() - drained >= 10_000 * RING
    assert w.drop_segment(2) == 10_000  # the rest dropped: nothing in flight
    assert w.memory_bytes() <= drained  # the pending table is gone, the committed keys stay
    assert w.get(keys[:16]) is not None and w.get(keys[-16:]) is None


def test_a_window_far_from_full_grows_and_keeps_its_keys() -> None:
    # max_keys far above the keys held: the index grows with them (in place, doubling)
    w = _core.DedupWindow(2_000_000, 3_600_000)
    assert w.memory_bytes() < 2_000_000 * RING + 4096
    fill_like_a_writer(w, 30_000)
    assert w.committed_count == 30_000
    index = w.memory_bytes() - 2_000_000 * RING
    assert 0 < index <= 30_000 * 4 * 8 / 3 + 4096  # at most half full after doubling
    entries = w.committed_entries()
    assert [e[2] for e in entries] == list(range(30_000))
    assert all(w.get(e[0]) is not None for e in entries[::97])
