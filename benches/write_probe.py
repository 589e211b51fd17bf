"""Instruction-count probe of the write path: N write_async calls of 1 KiB on a fresh log, then
close. Run it under callgrind with N and with 0, and divide the difference by N: instructions per
write, the same on a busy or an idle machine (callgrind counts, it does not time).

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python benches/write_probe.py explicit 10000    # plain | explicit | content
"""

from __future__ import annotations

import sys
import tempfile

import woodpecker_idem as wp

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def main(kind: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        client = wp.connect(tmp, {"quorum.es": 1, "storage.fsync": "never", **QUIET})
        log = client.open_log("probe", create=True)
        writer = log.open_writer(idempotent=kind != "plain")
        payloads = [(b"%s-%08d-" % (kind.encode(), i)).ljust(1024, b"x") for i in range(20_000)]
        ids = [f"{kind}-order-{i}" for i in range(20_000)]
        write = writer.write_async
        if kind == "explicit":
            futures = [write(p, idempotency_id=i) for p, i in zip(payloads[:n], ids, strict=False)]
        else:
            futures = [write(p) for p in payloads[:n]]
        for f in futures:
            f.result()
        writer.close()
        client.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
