"""A writer process that exits without closing its writer, for tests/writer/test_log_exit.py.

    python tests/support/exitproc.py DATA_DIR MODE IDEMPOTENT ES [N]

MODE `queued`: queue N writes with write_async and fall off the end of the script (the writer is
never closed, the futures never waited on). MODE `burst`: write_async without end until
interrupted (the test sends SIGINT). Prints `ready` once the writer is open. Entry i carries the
payload `p<i>` (and the idempotency id `k<i>`).

SIGINT gets Python's own handler first thing: a child started by a shell that ignores SIGINT
(`pytest ... &` in a script, nohup, some CI runners) inherits SIG_IGN, and Python keeps an
ignored SIGINT ignored, so the test's Ctrl-C would never arrive.
"""

from __future__ import annotations

import signal
import sys

import woodpecker_idem as wp


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # see the module doc
    data_dir, mode, idempotent, es = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    client = wp.connect(data_dir, {"quorum.es": es, "append.linger_ms": 5})
    log = client.open_log("exit", create=True)
    writer = log.open_writer(idempotent=True) if idempotent else log.open_writer()
    print("ready", flush=True)
    i = 0
    while mode == "burst" or i < n:
        if idempotent:
            writer.write_async(b"p%d" % i, idempotency_id=f"k{i}")
        else:
            writer.write_async(b"p%d" % i)
        i += 1


if __name__ == "__main__":
    main()
