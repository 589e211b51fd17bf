"""A processor (woodpecker_idem.Processor) in its own process, for the SIGKILL rounds
(client/test_processor.py).

    python support/processorproc.py DATA_DIR SOURCE TARGET NAME OUT_FILE COMMIT_EVERY
        MAX_IN_FLIGHT [--config JSON] [--window-s SECONDS] [--add-delay-ms MS]

Runs processor NAME from log SOURCE to log TARGET until it has caught up, with `results` below
as its fn, appending `P <segment>:<entry>` to OUT_FILE each time fn is called, then `DONE`
(exit 0). Each line is one `os.write` on an O_APPEND file, so a SIGKILL never leaves half a
line. `--add-delay-ms` delays every add on the nodes (results stay in flight that long, so a
kill often finds results submitted and not acknowledged while commits land).
"""

from __future__ import annotations

import argparse
import json
import os
import signal


def results(payload: bytes) -> list[bytes]:
    """What the processor writes for source entry `payload` (b"m<i>"): none, one or two results
    (every third entry has none, every third two), so the ids with and without an index and
    the positions committed with nothing written are all exercised."""
    i = int(payload[1:])
    return [b"r%d.%d" % (i, k) for k in range(i % 3)]


def main() -> int:
    # a test runner started in the background may ignore SIGINT; this child must not inherit that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("name")
    parser.add_argument("out_file")
    parser.add_argument("commit_every", type=int)
    parser.add_argument("max_in_flight", type=int)
    parser.add_argument("--config", default="{}")
    parser.add_argument("--window-s", type=float, default=None)
    parser.add_argument("--add-delay-ms", type=float, default=0.0)
    args = parser.parse_args()

    from woodpecker_idem import Processor
    from woodpecker_idem.connect import connect
    from woodpecker_idem.testing import FaultInjectingTransport

    fd = os.open(args.out_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    client = connect(args.data_dir, json.loads(args.config))
    if args.add_delay_ms:
        faults = FaultInjectingTransport(client.transport)
        for node in faults.node_ids:
            faults.delay(node, args.add_delay_ms)
        client.transport = faults  # before any writer opens (as tests/support/gate.py)

    def fn(msg):  # type: ignore[no-untyped-def]
        os.write(fd, f"P {msg.message_id}\n".encode())
        return results(msg.payload)

    try:
        source, target = client.open_log(args.source), client.open_log(args.target)
        with Processor(
            source,
            target,
            args.name,
            fn,
            commit_every=args.commit_every,
            max_in_flight=args.max_in_flight,
            window_duration_s=args.window_s,
        ) as processor:
            os.write(fd, f"OPEN {processor.committed}\n".encode())
            processor.run(until_idle=True)
        os.write(fd, b"DONE\n")
    finally:
        client.close()
        os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
