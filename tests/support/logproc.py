"""A writer in its own process, for the other-process and SIGKILL tests
(writer/test_log_fencing.py).

    python support/logproc.py DATA_DIR LOG_NAME COUNT [--config JSON] [--inflight K] [--tag TAG]

Opens the log's writer (taking it over) and writes COUNT records `TAG-<i>` (i = 0, 1, ...), keeping
up to K writes in flight. For every acknowledged record it prints `ACK <i> <segment> <entry>` and
flushes stdout, in acknowledgement order (which is entry order). Output lines:

    READY <epoch>                 the writer is open
    ACK <i> <segment> <entry>     record i is acknowledged at that id
    FENCED <i> <message>          a write failed with WriterFencedError; exit code 3
    ERR <i> <ErrorClass> <msg>    another write failure (the process goes on)
    DONE                          every record was written; exit code 0
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("log_name")
    parser.add_argument("count", type=int)
    parser.add_argument("--config", default="{}")
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--tag", default="child")
    args = parser.parse_args()

    from woodpecker_idem.connect import connect
    from woodpecker_idem.errors import WoodpeckerError, WriterFencedError

    out = sys.stdout
    client = connect(args.data_dir, json.loads(args.config))
    writer = client.open_log(args.log_name, create=True).open_writer()
    out.write(f"READY {writer.epoch}\n")
    out.flush()
    window: deque = deque()

    def settle(i: int, fut) -> int:
        try:
            mid = fut.result(timeout=60).message_id
        except WriterFencedError as exc:
            out.write(f"FENCED {i} {exc}\n")
            out.flush()
            return 3
        except WoodpeckerError as exc:
            out.write(f"ERR {i} {type(exc).__name__} {exc}\n")
            out.flush()
            return 0
        out.write(f"ACK {i} {mid.segment_id} {mid.entry_id}\n")
        out.flush()
        return 0

    for i in range(args.count):
        try:
            fut = writer.write_async(f"{args.tag}-{i}".encode())
        except WriterFencedError as exc:
            while window:
                settle(*window.popleft())
            out.write(f"FENCED {i} {exc}\n")
            out.flush()
            return 3
        window.append((i, fut))
        while len(window) >= args.inflight:
            if settle(*window.popleft()) == 3:
                while window:  # report what was in flight, then stop
                    settle(*window.popleft())
                return 3
    while window:
        if settle(*window.popleft()) == 3:
            while window:
                settle(*window.popleft())
            return 3
    writer.close()
    client.close()
    out.write("DONE\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
