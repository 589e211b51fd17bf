"""A producer on "host A" for e2e/test_shared_etcd_s3.py: its own data directory, the shared etcd
and S3 given in a JSON config.

    python tests/support/hostproc.py DATA_DIR CONFIG_JSON N

Prints `ready` once its idempotent writer is open, then `key segment entry duplicate` per
acknowledged write (flushed each time). Writes go out with write_async in chunks of 8, so several
are in flight whenever the process is killed.
"""

from __future__ import annotations

import json
import sys

import woodpecker_idem as wp


def main() -> None:
    data_dir, config, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    client = wp.connect(data_dir, config)
    log = client.open_log("shared", create=True)
    writer = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=100_000)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for start in range(0, n, 8):
        names = [f"a-{i}" for i in range(start, min(n, start + 8))]
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
