"""Resident memory per committed key of a dedup window, measured in a fresh process.

Run by benches/bench_core.py (one subprocess per measurement, so nothing else is in the heap):

    python benches/mem_probe.py writer 1000000
    python benches/mem_probe.py core 1000000
    python benches/mem_probe.py python 1000000

``writer``: a ``_core.DedupWindow(N, ...)`` filled the way an idempotent writer fills it: keys
arrive in batches of ``WRITER_BATCH`` new keys, each batch is reserved (``reserve_many``: the
intake) and committed (``commit_through``) once ``WRITER_INFLIGHT`` batches are in flight behind it
(the acks of the default ``append.max_inflight_entries``), segments roll every
``WRITER_SEGMENT_ENTRIES`` entries (``segment.max_entries``'s default). Run it without malloc
tuning: this is what a user's process sees. ``core``: loaded in one bulk call
(``add_committed_many``, as a window rebuild does) from N*16 random key bytes and three int64
buffers; ``python``: the naive model (a dict key -> (segment, entry, ts) plus a deque of keys in
commit order), loaded from the same buffers. The input buffers are freed before the final reading.
Prints one JSON object: ``n``, ``impl``, ``rss_delta``, ``rss_per_key`` and, for the core window,
``memory_bytes`` and ``memory_bytes_per_key``.

Start ``core`` and ``python`` with ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment (the bench
does) so glibc keeps serving their large input buffers with mmap and returns them to the OS when
freed (``writer`` has no large input buffer).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from array import array
from collections import deque
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
WRITER_BATCH = 1000  # append.max_batch_entries' default
WRITER_INFLIGHT = 10  # batches in flight: append.max_inflight_entries' default (10,000)
WRITER_SEGMENT_ENTRIES = 1_000_000  # segment.max_entries' default


def rss_bytes() -> int:
    """Resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:  # pragma: no cover - not Linux
        import psutil

        return int(psutil.Process().memory_info().rss)


def make_inputs(n: int) -> tuple[bytes, array, array, array]:
    """Random keys, 3 segments of consecutive entry ids, increasing timestamps."""
    keys = os.urandom(16 * n)
    third = -(-n // 3)
    segments = array("q", (1 + i // third for i in range(n)))
    entries = array("q", (i % third for i in range(n)))
    timestamps = array("q", range(1_700_000_000_000, 1_700_000_000_000 + 6 * n, 6))
    return keys, segments, entries, timestamps


def load_core(n: int, inputs: tuple[bytes, array, array, array]) -> Any:
    from woodpecker_idem import _core

    window = _core.DedupWindow(n, 3_600_000)
    inserted = window.add_committed_many(*inputs)
    assert inserted == n, inserted
    return window


def load_writer(n: int) -> Any:
    """Reserve then commit, batch after batch, with WRITER_INFLIGHT batches awaiting their ack."""
    from woodpecker_idem import _core

    window = _core.DedupWindow(n, 3_600_000)
    in_flight: deque[tuple[int, int]] = deque()  # (segment, last entry id) reserved, not acked
    segment, entry = 1, 0
    ts = 1_700_000_000_000
    for lo in range(0, n, WRITER_BATCH):
        count = min(WRITER_BATCH, n - lo)
        if entry + count > WRITER_SEGMENT_ENTRIES:  # roll: the old segment's acks arrive first
            while in_flight:
                window.commit_through(*in_flight.popleft())
            segment, entry = segment + 1, 0
        status, _, _ = window.reserve_many(
            os.urandom(16 * count), array("q", [ts] * count), segment, entry
        )
        assert status.count(0) == count  # every key new
        entry += count
        ts += 1
        in_flight.append((segment, entry - 1))
        if len(in_flight) > WRITER_INFLIGHT:
            window.commit_through(*in_flight.popleft())
    while in_flight:
        window.commit_through(*in_flight.popleft())
    assert window.pending_count == 0
    return window


def load_python(n: int, inputs: tuple[bytes, array, array, array]) -> Any:
    keys, segments, entries, timestamps = inputs
    index: dict[bytes, tuple[int, int, int]] = {}
    order: deque[bytes] = deque()
    mv = memoryview(keys)
    for i in range(n):
        key = bytes(mv[16 * i : 16 * i + 16])
        index[key] = (segments[i], entries[i], timestamps[i])
        order.append(key)
    mv.release()
    return index, order


def main(argv: list[str]) -> int:
    impl, n = argv[1], int(argv[2])
    if impl in ("core", "writer"):
        from woodpecker_idem import _core  # noqa: F401  (import cost outside the delta)
    gc.collect()
    before = rss_bytes()
    if impl == "writer":
        window = load_writer(n)
    else:
        inputs = make_inputs(n)
        window = load_core(n, inputs) if impl == "core" else load_python(n, inputs)
        del inputs
    gc.collect()
    after = rss_bytes()
    out: dict[str, Any] = {
        "impl": impl,
        "n": n,
        "rss_delta": after - before,
        "rss_per_key": (after - before) / n,
    }
    if impl != "python":
        out["memory_bytes"] = window.memory_bytes()
        out["memory_bytes_per_key"] = window.memory_bytes() / n
        assert len(window) == n
    else:
        assert len(window[0]) == n
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
