"""A consumer with a named reader in its own process, for the SIGKILL rounds
(client/test_named_readers.py).

    python support/consumerproc.py DATA_DIR LOG_NAME READER_NAME OUT_FILE COMMIT_EVERY
        [--config JSON]

Opens reader READER_NAME of the log (resuming at its committed position), and for every entry
appends `P <segment>:<entry>` to OUT_FILE (the entry is processed), committing after every
COMMIT_EVERY entries and appending `C <position>` once the commit returned (`--async-commits`:
`commit_async` between, no line). At the end of the log
it commits, appends `DONE` and exits 0. Each line is one `os.write` on an O_APPEND file, so a
SIGKILL never leaves half a line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal


def main() -> int:
    # a test runner started in the background may ignore SIGINT; this child must not inherit that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("log_name")
    parser.add_argument("reader_name")
    parser.add_argument("out_file")
    parser.add_argument("commit_every", type=int)
    parser.add_argument("--config", default="{}")
    parser.add_argument("--async-commits", action="store_true", help="commit_async between")
    args = parser.parse_args()

    from woodpecker_idem.connect import connect

    fd = os.open(args.out_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    client = connect(args.data_dir, json.loads(args.config))
    try:
        handle = client.open_log(args.log_name)
        with handle.open_reader(name=args.reader_name) as reader:
            os.write(fd, f"OPEN {reader.position}\n".encode())
            n = 0
            while (msg := reader.read_next(0)) is not None:
                os.write(fd, f"P {msg.message_id}\n".encode())
                n += 1
                if n % args.commit_every == 0 and args.async_commits:
                    reader.commit_async()  # lands some time later (or never, if killed first)
                elif n % args.commit_every == 0:
                    os.write(fd, f"C {reader.commit()}\n".encode())
            os.write(fd, f"C {reader.commit()}\n".encode())
        os.write(fd, b"DONE\n")
    finally:
        client.close()
        os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
