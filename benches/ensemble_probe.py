"""One process, one figure: what the ensemble layer changed on the paths users wait on, printed as
JSON so two checkouts can be compared run for run (interleaved by the caller; see
benches/README.md, "The ensemble layer").

    python benches/ensemble_probe.py async-idem | async-plain | sync-p50 | dup | keyed | many

- async-idem / async-plain: write_async of 10,000 distinct 1 KiB payloads (es=1), entries/s;
- sync-p50: 2,000 sync write() calls of 100 B (idempotent), the median latency in microseconds;
- dup: 20,000 duplicates answered by write(), microseconds each;
- keyed: write_keyed of 200,000 new 100 B rows in 10,000-row calls, rows/s;
- many: 64 idempotent writers on one client writing round-robin (write_async, 100 B, 200 each),
  aggregate entries/s and the process's thread count at the end.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time

import woodpecker_idem as wp

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def async_writes(idempotent: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, wp.connect(d, QUIET) as client:
        w = client.open_log("a", create=True).open_writer(idempotent=idempotent)
        payloads = [(b"%08d-" % i).ljust(1024, b"x") for i in range(10_000)]
        t0 = time.perf_counter()
        futures = [w.write_async(p) for p in payloads]
        for f in futures:
            f.result(60)
        elapsed = time.perf_counter() - t0
        w.close()
    return {"entries_per_s": round(10_000 / elapsed)}


def sync_p50() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, wp.connect(d, QUIET) as client:
        w = client.open_log("s", create=True).open_writer(idempotent=True)
        lat = []
        for i in range(2_000):
            t0 = time.perf_counter()
            w.write(b"%096d" % i, idempotency_id=f"k{i}")
            lat.append(time.perf_counter() - t0)
        w.close()
    lat.sort()
    return {"p50_us": round(lat[len(lat) // 2] * 1e6, 1)}


def duplicates() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, wp.connect(d, QUIET) as client:
        w = client.open_log("d", create=True).open_writer(idempotent=True)
        w.write(b"x", idempotency_id="same")
        t0 = time.perf_counter()
        for _ in range(20_000):
            w.write(b"x", idempotency_id="same")
        elapsed = time.perf_counter() - t0
        w.close()
    return {"dup_us": round(elapsed / 20_000 * 1e6, 2)}


def keyed() -> dict[str, float]:
    rows = 200_000
    payloads = [b"%0100d" % i for i in range(rows)]
    keys = b"".join(wp.explicit_key(f"r{i}") for i in range(rows))
    with tempfile.TemporaryDirectory() as d, wp.connect(d, QUIET) as client:
        w = client.open_log("k", create=True).open_writer(idempotent=True)
        t0 = time.perf_counter()
        for start in range(0, rows, 10_000):
            end = start + 10_000
            w.write_keyed(payloads[start:end], keys[start * 16 : end * 16])
        elapsed = time.perf_counter() - t0
        w.close()
    return {"rows_per_s": round(rows / elapsed)}


def many_writers() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, wp.connect(d, QUIET) as client:
        writers = [
            client.open_log(f"m{i}", create=True).open_writer(idempotent=True) for i in range(64)
        ]
        t0 = time.perf_counter()
        futures = []
        for r in range(200):
            for i, w in enumerate(writers):
                futures.append(w.write_async(b"%0100d" % (r * 64 + i), idempotency_id=f"{r}-{i}"))
        for f in futures:
            f.result(120)
        elapsed = time.perf_counter() - t0
        threads = threading.active_count()
        for w in writers:
            w.close()
    return {"entries_per_s": round(len(futures) / elapsed), "threads": threads}


PROBES = {
    "async-idem": lambda: async_writes(True),
    "async-plain": lambda: async_writes(False),
    "sync-p50": sync_p50,
    "dup": duplicates,
    "keyed": keyed,
    "many": many_writers,
}

if __name__ == "__main__":
    print(json.dumps(PROBES[sys.argv[1]]()))
