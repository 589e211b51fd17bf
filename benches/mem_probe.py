"""Resident memory per committed key of a dedup window, measured in a fresh process.

Run by benches/bench_core.py (one subprocess per measurement, so nothing else is in the heap):

    python benches/mem_probe.py writer 1000000
    python benches/mem_probe.py core 1000000
    python benches/mem_probe.py python 1000000
    python benches/mem_probe.py process 1000000 [nosnapshots]

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

``process``: the whole writing process. A real idempotent writer (``woodpecker_idem.connect`` on
a temporary directory, the embedded default) with a window of N keys bulk-loads N new keys
through ``write_keyed`` in batches of ``PROCESS_BATCH`` rows, while snapshots run (every
``PROCESS_SNAPSHOT_S`` seconds, and by new keys); after the load it waits for a snapshot taken
after the last write. ``rss_delta`` is the peak (VmHWM, reset once the writer is open) minus the
resident size once the writer is open, ``peak_over_window`` that over the window's
``memory_bytes``: what a user's process grows by, snapshots and batch buffers included
(``nosnapshots``: no snapshot runs, the write pipeline's share alone).

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
PROCESS_BATCH = 10_000  # rows per write_keyed call in the ``process`` mode
PROCESS_SNAPSHOT_S = 0.05  # idempotency.snapshot_interval_s in the ``process`` mode
PROCESS_PAYLOAD = 16  # payload bytes per row in the ``process`` mode


def rss_bytes() -> int:
    """Resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:  # pragma: no cover - not Linux
        import psutil

        return int(psutil.Process().memory_info().rss)


def status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)  # pragma: no cover - not Linux


def reset_peak_rss() -> None:
    """Make VmHWM start again from the current RSS (Linux >= 4.0: ``5`` to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_process(n: int, snapshots: bool = True) -> dict[str, Any]:
    """Bulk-load n new keys through a real idempotent writer while snapshots run (with
    `snapshots` False, none runs: the write pipeline's own share of the growth)."""
    import tempfile
    import time

    import woodpecker_idem

    with tempfile.TemporaryDirectory(prefix="wp-memprobe-") as tmp:
        client = woodpecker_idem.connect(
            tmp,
            config={
                "idempotency.snapshot_interval_s": PROCESS_SNAPSHOT_S if snapshots else 86_400,
                "idempotency.snapshot_threshold": max(1, n // 10) if snapshots else 10**8,
            },
        )
        log = client.open_log("bulk", create=True)
        writer = log.open_writer(idempotent=True, window_max_keys=n, window_duration_s=3600)
        snapshotter = writer.snapshotter  # a probe reads the counters
        payloads = [b"p" * PROCESS_PAYLOAD] * PROCESS_BATCH  # one shared object per row slot
        gc.collect()
        reset_peak_rss()
        base_kib = status_kib("VmRSS")
        start = time.monotonic()
        for lo in range(0, n, PROCESS_BATCH):
            count = min(PROCESS_BATCH, n - lo)
            rows = payloads if count == PROCESS_BATCH else payloads[:count]
            result = writer.write_keyed(rows, os.urandom(16 * count))
            assert len(result) == count
        load_s = time.monotonic() - start
        during = snapshotter.writes
        deadline = time.monotonic() + (120 if snapshots else 0)
        while snapshotter.writes == during and time.monotonic() < deadline:
            time.sleep(0.05)  # a snapshot that began after the last write
        while snapshotter.writes < during + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        peak_kib = status_kib("VmHWM")
        end_kib = status_kib("VmRSS")
        window = writer.window
        committed = window.committed_count
        window_bytes = window.memory_bytes()
        out = {
            "impl": "process",
            "n": n,
            "rss_delta": (peak_kib - base_kib) * 1024,
            "rss_per_key": (peak_kib - base_kib) * 1024 / n,
            "rss_end_delta": (end_kib - base_kib) * 1024,
            "memory_bytes": window_bytes,
            "memory_bytes_per_key": window_bytes / n,
            "peak_over_window": (peak_kib - base_kib) * 1024 / window_bytes,
            "snapshots": snapshotter.writes,
            "snapshots_during_load": during,
            "snapshot_bytes": snapshotter.bytes_written,
            "load_s": round(load_s, 2),
        }
        assert committed == n, committed
        writer.close()
        client.close()
    return out


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
    if impl == "process":
        print(json.dumps(run_process(n, snapshots=argv[3:] != ["nosnapshots"])))
        return 0
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
