"""The Arrow batch call alone: `IdempotentLogWriter.write_arrow` of 100 B rows, durable (es=1,
fsync before ack), keys from an int64 key column computed in Rust from the Arrow buffers.

    PYTHONPATH=python .venv/bin/python -m pytest benches/bench_arrow.py -p no:cacheprovider -s

Target of issue 14: >= 500,000 new rows/s. Measured ~40-65k rows/s on the shared 2-core machine
(~11 us CPU per row): the call itself is columnar (keys, validation, one window pass, one encoding
call, one completion per batch), but the write path under it still makes, commits and resolves one
Python object per entry; that path is rebuilt in issue 12. Asserted here: >= 30,000 rows/s (a
regression floor, not the target). A second pass writes the same batches again: all duplicates
(answered from the window, nothing written).
"""

from __future__ import annotations

import time

import pyarrow as pa

import woodpecker_idem as wp

ROWS = 1_000_000
BATCH = 65_536
QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def batches() -> list[pa.RecordBatch]:
    out = []
    for start in range(0, ROWS, BATCH):
        n = min(BATCH, ROWS - start)
        ids = pa.array(range(start, start + n), pa.int64())
        body = pa.array([(b"order %012d " % i).ljust(100, b".") for i in range(start, start + n)])
        out.append(pa.record_batch({"order_id": ids, "body": body}))
    return out


def run(writer, data) -> tuple[float, int]:
    started = time.perf_counter()
    dups = 0
    for b in data:
        res = writer.write_arrow(b, key_column="order_id", payload_column="body")
        dups += sum(res.duplicate)
    return time.perf_counter() - started, dups


def test_write_arrow_new_rows_per_second(tmp_path, benchmark):
    data = batches()
    config = {"quorum.es": 1, "storage.fsync": "always", "idempotency.window_max_keys": 2 * ROWS}
    client = wp.connect(tmp_path, {**config, **QUIET})
    writer = client.open_log("bench", create=True).open_writer(idempotent=True)
    seconds, dups = benchmark.pedantic(run, args=(writer, data), rounds=1, iterations=1)
    rate = ROWS / seconds
    again, dups_again = run(writer, data)
    writer.close()
    client.close()
    benchmark.extra_info.update(
        {"new_rows_per_s": rate, "duplicate_rows_per_s": ROWS / again, "row_bytes": 100}
    )
    print(
        f"\nwrite_arrow: {ROWS:,} new rows of 100 B in {seconds:.2f} s = {rate:,.0f} rows/s "
        f"(durable, es=1); the same rows again: {ROWS / again:,.0f} duplicate rows/s"
    )
    assert dups == 0 and dups_again == ROWS
    assert rate >= 30_000, f"{rate:,.0f} new rows/s < 30,000 (target 500,000 after issue 12)"
