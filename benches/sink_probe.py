"""Probe of one Spark sink task's writer work, without Spark: ROWS rows of 100 B with int64 keys in
Arrow batches of 10,000 (what `bench_spark.py`'s tasks get), written idempotently (`arrow_rows` +
`write_keyed`, 1M-key window, as the sink does), idempotently with snapshots off, and plainly
(`write_many`), interleaved, each run on a fresh log and closed. It splits the idempotent sink's
cost over the plain one into its snapshots and the rest (keys, window, bigger entries).

    .venv/bin/python benches/sink_probe.py 7    # rounds
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa

import woodpecker_idem as wp
from woodpecker_idem._core import arrow_rows

ROWS = 250_000  # one of bench_spark's four tasks
BATCH = 10_000
QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def main(rounds: int) -> None:
    body = os.urandom(100)
    batches = [
        pa.record_batch(
            {
                "order_id": pa.array(range(s, s + BATCH), pa.int64()),
                "body": pa.array([body] * BATCH, pa.binary()),
            }
        )
        for s in range(0, ROWS, BATCH)
    ]
    times: dict[str, list[float]] = {"idempotent": [], "no snapshots": [], "plain": []}
    snapshots: dict[str, tuple[int, int]] = {}  # per run (the same every round): count, bytes
    with tempfile.TemporaryDirectory() as tmp:
        client = wp.connect(tmp, {"quorum.es": 1})
        quiet = wp.connect(os.path.join(tmp, "quiet"), {"quorum.es": 1, **QUIET})
        for r in range(rounds):
            for kind in times:
                log = (quiet if kind == "no snapshots" else client).create_log(f"{r}-{len(kind)}")
                t0 = time.perf_counter()
                if kind == "plain":
                    plain = log.open_writer()
                    for b in batches:
                        plain.write_many(arrow_rows(b, payload="body")[0])
                    plain.close()
                else:
                    w = log.open_writer(idempotent=True, window_max_keys=1_000_000)
                    for b in batches:
                        w.write_keyed(*arrow_rows(b, key="order_id", payload="body"))
                    w.close()
                    m = w.metrics_snapshot()
                    snapshots[kind] = (
                        int(m["snapshot_writes"] or 0),
                        int(m["snapshot_bytes"] or 0),
                    )
                times[kind].append(time.perf_counter() - t0)
        client.close()
        quiet.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{ROWS:,} rows, {rounds} rounds, medians: "
        + ", ".join(f"{k} {v:.3f} s" for k, v in med.items())
        + f"; plain/idempotent {med['plain'] / med['idempotent']:.3f}, "
        f"plain/no snapshots {med['plain'] / med['no snapshots']:.3f}; snapshots per run "
        + ", ".join(f"{k}: {n} of {b / 1e6:.1f} MB" for k, (n, b) in snapshots.items())
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
