"""A writer process for tests/test_fsync_batch.py: sync write() after write() with
`storage.fsync: batch_ms:N`, printing each acknowledgement as it arrives.

    python tests/fsyncproc.py DATA_DIR BATCH_MS

Output lines (each written whole and flushed, so a reader sees every line printed before a kill):

    ready                            the writer is open
    A <i> <segment> <entry> <syncs>  `payload <i>` acknowledged at segment/entry; <syncs>: the
                                     node's fdatasyncs of data files so far (0: none of the
                                     acknowledged bytes was synced yet)

It writes until it is killed.
"""

from __future__ import annotations

import sys

import woodpecker_idem as wp


def main() -> None:
    data_dir, batch_ms = sys.argv[1], int(sys.argv[2])
    client = wp.connect(data_dir, {"storage.fsync": f"batch_ms:{batch_ms}"})
    storage = client.transport.engines["node-0"].storage  # type: ignore[attr-defined]
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
