"""A producer process for tests/e2e/test_idem_sigkill.py: writes k-0..k-{N-1} with explicit ids.

    python tests/support/idemproc.py DATA_DIR N [CHUNK] [ACK_DELAY_MS]

Writes go out with write_async in chunks of CHUNK, so several are in flight whenever the process
is killed. ACK_DELAY_MS (default 0) delays every node call that long (the fault-injecting
transport): a burst then stays in flight for at least that long, so a parent that stops the
process on reading its `S` line finds it in flight even on a busy machine.

Output lines (each written whole and flushed, so a reader sees every line printed before a kill;
only a last line cut by the kill can be partial):

    ready                                             the idempotent writer is open
    B <lo> <hi> <new> <start_ms> <start_ns>           about to send k-lo..k-(hi-1); <new> of them
                                                      are not in the window (new writes)
    S <lo>                                            the burst's bytes were handed to the writer
    A <key> <segment> <entry> <dup> <end_ms> <end_ns> one acknowledged write
    done                                              every write acknowledged, writer closed

Times: `_ms` on the writer's clock (the wall clock), `_ns` on time.monotonic_ns().
"""

from __future__ import annotations

import sys
import time

import woodpecker_idem as wp
from woodpecker_idem.clock import SYSTEM_CLOCK
from woodpecker_idem.testing import FaultInjectingTransport


def main() -> None:
    data_dir, n = sys.argv[1], int(sys.argv[2])
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    ack_delay_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    client = wp.connect(
        data_dir,
        {
            "idempotency.snapshot_interval_s": 0.2,
            "idempotency.snapshot_threshold": 40,
            "segment.max_entries": 150,  # several segments per run
        },
    )
    if ack_delay_ms:
        faults = FaultInjectingTransport(client.transport)
        for node in faults.node_ids:
            faults.delay(node, ack_delay_ms)
        client.transport = faults
    log = client.open_log("sigkill", create=True)
    writer = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=100_000)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        names = [f"k-{i}" for i in range(lo, hi)]
        new = sum(writer.window.get(wp.explicit_key(k)) is None for k in names)
        out.write(f"B {lo} {hi} {new} {SYSTEM_CLOCK.now_ms()} {time.monotonic_ns()}\n")
        out.flush()
        futures = [writer.write_async(f"payload of {k}".encode(), idempotency_id=k) for k in names]
        out.write(f"S {lo}\n")
        out.flush()
        for name, fut in zip(names, futures, strict=True):
            r = fut.result(60)
            out.write(
                f"A {name} {r.message_id.segment_id} {r.message_id.entry_id} "
                f"{int(r.duplicate)} {SYSTEM_CLOCK.now_ms()} {time.monotonic_ns()}\n"
            )
            out.flush()
    writer.close()
    client.close()
    out.write("done\n")
    out.flush()


if __name__ == "__main__":
    main()
