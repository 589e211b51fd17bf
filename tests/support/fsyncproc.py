"""A writer process for tests/logstore/test_fsync_batch.py: sync write() after write() with
`storage.fsync: batch_ms:N`, printing each acknowledgement as it arrives.

    python tests/support/fsyncproc.py DATA_DIR BATCH_MS          plain writes until killed
    python tests/support/fsyncproc.py DATA_DIR BATCH_MS idem N   k-0..k-{N-1} through an idempotent
                                                         writer, then a dedup snapshot taken
                                                         after the last ack; then it waits

Output lines (each written whole and flushed, so a reader sees every line printed before a kill):

    ready                            the writer is open
    A <i> <segment> <entry> <syncs>  `payload <i>` acknowledged at segment/entry; <syncs>: the
                                     node's fdatasyncs of data files so far (0: none of the
                                     acknowledged bytes was synced yet)
    snapshot <syncs>                 (idem) a snapshot holding every acknowledged key is stored

It runs until it is killed.
"""

from __future__ import annotations

import sys
import time

import woodpecker_idem as wp


def idempotent(client: wp.WoodpeckerClient, storage, n: int) -> None:
    writer = client.open_log("fsync", create=True).open_writer(idempotent=True)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for i in range(n):
        mid = writer.write(f"payload {i}".encode(), idempotency_id=f"k-{i}").message_id
        out.write(f"A {i} {mid.segment_id} {mid.entry_id} {storage.data_syncs}\n")
        out.flush()
    before = writer.metrics_snapshot()["snapshot_writes"]
    while writer.metrics_snapshot()["snapshot_writes"] <= before:  # one taken after the last ack
        time.sleep(0.01)
    out.write(f"snapshot {storage.data_syncs}\n")
    out.flush()
    while True:
        time.sleep(60)


def main() -> None:
    data_dir, batch_ms = sys.argv[1], int(sys.argv[2])
    client = wp.connect(
        data_dir,
        {
            "storage.fsync": f"batch_ms:{batch_ms}",
            "idempotency.snapshot_interval_s": 0.2,
            "idempotency.snapshot_threshold": 1,
        },
    )
    storage = client.transport.engines["node-0"].storage  # type: ignore[attr-defined]
    if sys.argv[3:4] == ["idem"]:
        idempotent(client, storage, int(sys.argv[4]))
        return
    writer = client.open_log("fsync", create=True).open_writer()
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    i = 0
    while True:
        mid = writer.write(f"payload {i}".encode()).message_id
        out.write(f"A {i} {mid.segment_id} {mid.entry_id} {storage.data_syncs}\n")
        out.flush()
        i += 1


if __name__ == "__main__":
    main()
