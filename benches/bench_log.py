"""Log write throughput and latency: es=1 on the local directory and es=3/aq=2 in-process.

Run: `.venv/bin/python -m pytest benches/bench_log.py
--benchmark-json=bench-results/log.json -p no:cacheprovider` (add `-s` to see the figures).

Every entry goes through `LogWriter.write_async`; acks are durable (the local object store fsyncs
every block before the ack). Figures land in `extra_info`:
- `entries_per_s`, `mib_per_s`: N entries written back to back, from the first call to the last ack
  (nothing else on the caller's thread: a timer and a callback per write would cost it ~25%);
- `load_p50_ms`, `load_p99_ms`: per-entry latency under the same load, measured in a run of its own
  (write_async call -> future done, by a done callback);
- `idle_p50_ms`, `idle_p99_ms`: one entry in flight at a time (write_async(...).result()).
Target (asserted): es=1 local >= 100,000 entries/s of 1 KiB (issue 12), judged on the fastest of
the 5 runs (the run least disturbed by other work on a shared machine, as in bench_core.py); the
median is reported next to it. The other cases have no target: they assert only that every write
was acked.
Set WP_BENCH_PROFILE=1 to print a cProfile of one throughput run (top functions by own time).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import pytest

from woodpecker_idem.connect import connect

TARGET_ES1_1K = 100_000  # issue 12 (medians 106-116k on the shared 2-core machine)
N_LOAD = {100: 20_000, 1024: 20_000}
N_IDLE = 300


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def _throughput(writer, payload: bytes, n: int) -> float:
    t0 = time.perf_counter()
    write = writer.write_async
    futures = [write(payload) for _ in range(n)]
    for f in futures:
        f.result(120)
    return time.perf_counter() - t0


def _load_latency(writer, payload: bytes, n: int) -> list[float]:
    lat = [0.0] * n
    futures = []
    for i in range(n):
        start = time.perf_counter()
        f = writer.write_async(payload)

        def cb(_f, i=i, start=start):
            lat[i] = time.perf_counter() - start

        f.add_done_callback(cb)
        futures.append(f)
    for f in futures:
        f.result(120)
    return lat


def _idle(writer, payload: bytes, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        writer.write_async(payload).result(30)
        lat.append(time.perf_counter() - t)
    return lat


CASES = [
    pytest.param(1, 100, id="es1-local-100B"),
    pytest.param(1, 1024, id="es1-local-1KiB"),
    pytest.param(3, 100, id="es3-inproc-100B"),
    pytest.param(3, 1024, id="es3-inproc-1KiB"),
]


@pytest.mark.parametrize(("es", "size"), CASES)
def test_log_write(benchmark, es, size):
    base = Path(os.environ.get("WP_BENCH_DIR", "."))
    with tempfile.TemporaryDirectory(dir=base, prefix=".bench-log-") as d:
        client = connect(
            d, {"quorum.es": es, "append.linger_ms": 2, "segment.max_entries": 10_000_000}
        )
        try:
            handle = client.create_log("bench")
            writer = handle.open_writer()
            payload = os.urandom(size)
            n = N_LOAD[size]
            _throughput(writer, payload, 2000)  # warm-up
            totals: list[float] = []

            def run():
                totals.append(_throughput(writer, payload, n))

            benchmark.pedantic(run, rounds=5, iterations=1)
            lat = _load_latency(writer, payload, n)
            idle = _idle(writer, payload, N_IDLE)
            if os.environ.get("WP_BENCH_PROFILE"):
                prof = cProfile.Profile()
                prof.enable()
                _throughput(writer, payload, n)
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
                print(f"\n--- cProfile es={es} {size} B, {n} entries ---\n{out.getvalue()}")
            writer.close()
        finally:
            client.close()

    best = min(totals)
    med = statistics.median(totals)
    info = {
        "es": es,
        "payload_bytes": size,
        "entries": n,
        "entries_per_s": round(n / med),
        "entries_per_s_best": round(n / best),
        "mib_per_s": round(n * size / med / 2**20, 2),
        "load_p50_ms": round(_pct(lat, 0.50) * 1e3, 3),
        "load_p99_ms": round(_pct(lat, 0.99) * 1e3, 3),
        "idle_p50_ms": round(_pct(idle, 0.50) * 1e3, 3),
        "idle_p99_ms": round(_pct(idle, 0.99) * 1e3, 3),
        "target_entries_per_s": TARGET_ES1_1K if (es, size) == (1, 1024) else None,
    }
    benchmark.extra_info.update(info)
    print(f"\nes={es} {size} B: {info}")
    if info["target_entries_per_s"] is not None:
        assert info["entries_per_s_best"] >= info["target_entries_per_s"], info
