"""A producer process for tests/test_idem_sigkill.py: writes k-0..k-{N-1} with explicit ids.

    python tests/idemproc.py DATA_DIR N [CHUNK]

Prints `ready` once its idempotent writer is open, then one line `key segment entry duplicate` per
acknowledged write (flushing stdout each time), then `done`. Writes go out with write_async in
chunks of CHUNK, so several are in flight whenever the process is killed.
"""

from __future__ import annotations

import sys

import woodpecker_idem as wp


def main() -> None:
    data_dir, n = sys.argv[1], int(sys.argv[2])
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    client = wp.connect(
        data_dir,
        {
            "idempotency.snapshot_interval_s": 0.2,
            "idempotency.snapshot_threshold": 40,
            "segment.max_entries": 150,  # several segments per run
        },
    )
    log = client.open_log("sigkill", create=True)
    writer = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=100_000)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for start in range(0, n, chunk):
        names = [f"k-{i}" for i in range(start, min(n, start + chunk))]
        futures = [writer.write_async(f"payload of {k}".encode(), idempotency_id=k) for k in names]
        for name, fut in zip(names, futures, strict=True):
            r = fut.result(60)
            out.write(
                f"{name} {r.message_id.segment_id} {r.message_id.entry_id} {int(r.duplicate)}\n"
            )
            out.flush()
    writer.close()
    client.close()
    out.write("done\n")
    out.flush()


if __name__ == "__main__":
    main()
