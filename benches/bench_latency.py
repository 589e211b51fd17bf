"""Single-write latency (issue 12, item 2): what one caller waiting on each write sees.

    .venv/bin/python -m pytest benches/bench_latency.py -p no:cacheprovider -s \\
        --benchmark-json=latency.json

Interleaved rounds on the embedded default (local directory, es=1, durable acks), 1 KiB payloads;
each figure is the median over rounds of that round's value, so slow drifts of a shared machine
fall on every measure alike:
- the floor: `os.write` of 1 KiB + `os.fdatasync` on an open file in the same directory;
- a single-thread loop of sync `write()` (plain writer): p50, p99 and writes/s, and its ratio to
  the floor (floor p50 / write p50: 1.0 would be a write as cheap as the bare disk);
- a duplicate through `write()` (idempotent writer, the key committed in the window): p50, for an
  explicit id and for the content key (MD5 of the payload, hashed in the caller's thread).
Asserted: the duplicate p50 <= 5 us with an explicit id (the content key adds an MD5 of 1 KiB,
~1.5 us idle, in the caller's thread: reported), and the loop's ratio to the floor (a durable
add on a local segment file is one write + fdatasync + a fence check; the rest is the client).
Reported: the issue's write targets (p50 <= 0.5 ms, p99 <= 2 ms, >= 2,000 writes/s), which
depend on the disk.

`test_sync_write_p50_always_vs_batch_ms`: the same sync `write()` loop on two clients, one with
`storage.fsync: always` (the ack waits for the batch's fdatasync) and one with `batch_ms:5` (the ack
waits for the write to the file; an fdatasync runs in the background every 5 ms), interleaved
round by round. Asserted: p50 <= 0.1 ms with `batch_ms:5` and <= 0.5 ms with `always`:

    .venv/bin/python -m pytest benches/bench_latency.py -p no:cacheprovider -s \
        -k always_vs_batch_ms
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from pathlib import Path

import woodpecker_idem as wp

ROUNDS = 7
WRITES = 300  # per round, each waited for
DUPLICATES = 3000
PAYLOAD = b"x" * 1024

DUPLICATE_P50_S = 5e-6
# floor p50 / write p50: segment files measured 0.57-0.60 here (machine shared, noisy); the
# block-per-batch store before them 0.19-0.49
MIN_FLOOR_RATIO = 0.3
TARGET_P50_S = 0.5e-3
TARGET_P99_S = 2e-3
TARGET_WRITES_PER_S = 2000
BATCH_MS_P50_S = 0.1e-3  # storage.fsync: batch_ms:5 (NATS acks before its fsync at ~0.22 ms here)
ALWAYS_P50_S = 0.5e-3

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _floor(directory: Path) -> float:
    """p50 of append 1 KiB + fdatasync on an open file: what a durable ack costs at least."""
    fd = os.open(directory / "floor.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lat = []
    try:
        for _ in range(WRITES):
            t0 = time.perf_counter()
            os.write(fd, PAYLOAD)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return _p(lat, 0.5)


def _sync_loop(writer: wp.LogWriter) -> tuple[float, float, float]:
    """(p50, p99, writes/s) of WRITES sync writes, one after the other."""
    lat = []
    clock = time.perf_counter
    start = clock()
    for _ in range(WRITES):
        t0 = clock()
        writer.write(PAYLOAD)
        lat.append(clock() - t0)
    elapsed = clock() - start
    return _p(lat, 0.5), _p(lat, 0.99), WRITES / elapsed


def _duplicates(writer: wp.IdempotentLogWriter, ident: str | None) -> float:
    """p50 of write() of a key committed in the window."""
    first = writer.write(PAYLOAD, idempotency_id=ident)
    lat = []
    clock = time.perf_counter
    write = writer.write
    for _ in range(DUPLICATES):
        t0 = clock()
        r = write(PAYLOAD, idempotency_id=ident)
        lat.append(clock() - t0)
    assert r.duplicate and r.message_id == first.message_id
    return _p(lat, 0.5)


def test_single_write_latency(benchmark, tmp_path: Path):
    client = wp.connect(tmp_path / "data", {"quorum.es": 1, **QUIET})
    plain = client.open_log("plain", create=True).open_writer()
    idem = client.open_log("idem", create=True).open_writer(idempotent=True)
    rows: dict[str, list[float]] = {
        k: []
        for k in ("floor_p50", "p50", "p99", "writes_per_s", "ratio", "dup_id_p50", "dup_md5_p50")
    }
    _sync_loop(plain)  # warm-up: imports, the first batch files
    gc.collect()
    gc.disable()  # a collection inside a 3 us call is the collector's figure, not ours
    try:
        for r in range(ROUNDS):
            floor = _floor(tmp_path)
            p50, p99, rate = _sync_loop(plain)
            rows["floor_p50"].append(floor)
            rows["p50"].append(p50)
            rows["p99"].append(p99)
            rows["writes_per_s"].append(rate)
            rows["ratio"].append(floor / p50)
            rows["dup_id_p50"].append(_duplicates(idem, f"dup-{r}"))
            rows["dup_md5_p50"].append(_duplicates(idem, None))
    finally:
        gc.enable()
    benchmark.pedantic(lambda: plain.write(PAYLOAD), rounds=1, iterations=1)
    plain.close()
    idem.close()
    client.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    info = {
        "rounds": ROUNDS,
        "writes_per_round": WRITES,
        "floor_p50_ms": round(med["floor_p50"] * 1e3, 3),
        "write_p50_ms": round(med["p50"] * 1e3, 3),
        "write_p99_ms": round(med["p99"] * 1e3, 3),
        "sync_loop_writes_per_s": round(med["writes_per_s"]),
        "floor_p50_over_write_p50": round(med["ratio"], 3),
        "duplicate_explicit_p50_us": round(med["dup_id_p50"] * 1e6, 2),
        "duplicate_content_p50_us": round(med["dup_md5_p50"] * 1e6, 2),
        "targets_met": {
            "write_p50<=0.5ms": med["p50"] <= TARGET_P50_S,
            "write_p99<=2ms": med["p99"] <= TARGET_P99_S,
            "sync_loop>=2000/s": med["writes_per_s"] >= TARGET_WRITES_PER_S,
        },
    }
    benchmark.extra_info.update(info)
    print("\nsingle-write latency:", info)  # noqa: T201
    assert med["dup_id_p50"] <= DUPLICATE_P50_S, info
    assert med["ratio"] >= MIN_FLOOR_RATIO, info


def test_sync_write_p50_always_vs_batch_ms(benchmark, tmp_path: Path):
    modes = ("always", "batch_ms:5")
    clients = {
        m: wp.connect(tmp_path / m.replace(":", "-"), {"quorum.es": 1, "storage.fsync": m, **QUIET})
        for m in modes
    }
    writers = {m: c.open_log("plain", create=True).open_writer() for m, c in clients.items()}
    rows: dict[str, list[float]] = {f"{m} {q}": [] for m in modes for q in ("p50", "p99")}
    for w in writers.values():
        _sync_loop(w)  # warm-up
    gc.collect()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            for m, w in writers.items():
                p50, p99, _ = _sync_loop(w)
                rows[f"{m} p50"].append(p50)
                rows[f"{m} p99"].append(p99)
    finally:
        gc.enable()
    benchmark.pedantic(lambda: writers["batch_ms:5"].write(PAYLOAD), rounds=1, iterations=1)
    for w in writers.values():
        w.close()
    for c in clients.values():
        c.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    info = {
        "rounds": ROUNDS,
        "writes_per_round": WRITES,
        **{f"{k.replace(' ', '_')}_ms": round(v * 1e3, 3) for k, v in med.items()},
    }
    benchmark.extra_info.update(info)
    print("\nsync write() p50, always vs batch_ms:5:", info)  # noqa: T201
    assert med["batch_ms:5 p50"] <= BATCH_MS_P50_S, info
    assert med["always p50"] <= ALWAYS_P50_S, info
